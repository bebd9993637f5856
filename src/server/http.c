/* The HTTP endpoints of `kvpred serve` on libmicrohttpd (see server.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/platform.h"
#include "model/model.h"
#include "server/conns.h"
#include "server/engine.h"
#include "server/page.h"
#include "server/request.h"
#include "server/server.h"
#include "server/waiter.h"
#include "tokenizer/chat.h"

/* connections beyond --max-connections kept to answer /health and /metrics */
#define MONITOR_RESERVE 16

/* Where a client was when it left before its answer ended (kvpred_http_clients_gone_total). */
enum { GONE_QUEUED, GONE_PREFILL, GONE_GENERATING, N_GONE };
static const char *const gone_stage[N_GONE] = {"queued", "prefill", "generating"};

/* HTTP statuses counted for /metrics */
static const int counted_status[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_COUNTED (sizeof(counted_status) / sizeof(counted_status[0]))

struct srv_server {
    struct srv_config cfg;
    const kvp_model *model;
    struct srv_engine *eng;
    struct MHD_Daemon *d;
    int port;
    char model_id[128];
    int chat_fmt;
    int n_ctx;
    atomic_ullong status_count[N_COUNTED + 1];
    atomic_ullong id_seq;
    struct srv_limits lim;
    struct srv_defaults def;
    double keepalive_s;    /* a stream silent this long sends an SSE comment (a third of the
                            * shorter timeout) */
    struct srv_conns *conns;
    struct srv_waiter *waiter;
    atomic_int answering;  /* requests with a job, from submit until their answer is sent */
    atomic_ullong gone[N_GONE];
};

/* One request in progress (MHD's per-request pointer). */
struct conn {
    char *body;
    size_t len, cap;
    bool too_large;
    bool answering;        /* counted in srv_server.answering */
    /* a non-streamed answer waiting for its job (the connection parked meanwhile) */
    struct srv_job *job;
    int kind;
    char id[48];
    long long created;
    struct srv_wait wait;
};

/* A streamed answer: the response callback's state. */
struct stream {
    struct srv_server *s;
    struct srv_job *job;
    struct MHD_Connection *conn;
    int kind;
    bool include_usage;
    char id[48];
    long long created;
    int phase;           /* 0 role (chat), 1 text, 2 finish, 3 usage, 4 [DONE], 5 end */
    size_t sent;         /* bytes of job->text sent */
    char *out;           /* formatted event not yet handed to MHD */
    size_t out_len, out_off;
    double t_out;        /* when the last event was formatted (kvp_time_now) */
    struct srv_wait wait;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static void count_status(struct srv_server *s, int status)
{
    size_t i = 0;
    while (i < N_COUNTED && counted_status[i] != status)
        i++;
    atomic_fetch_add(&s->status_count[i], 1);
}

static enum MHD_Result send_text(struct srv_server *s, struct MHD_Connection *c, int status,
                                 const char *type, const char *body, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (srv_conns_over_limit(c)) /* a monitoring place: free it for the next check */
        MHD_add_response_header(r, "Connection", "close");
    if (status == 429 || status == 503)
        MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(s, status);
    return rc;
}

static enum MHD_Result send_json(struct srv_server *s, struct MHD_Connection *c, int status,
                                 cJSON *j)
{
    char *txt = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!txt)
        return send_text(s, c, 500, "application/json",
                         "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}",
                         64);
    enum MHD_Result rc = send_text(s, c, status, "application/json", txt, strlen(txt));
    free(txt);
    return rc;
}

/* {"error": {"message", "type", "param", "code"}}, OpenAI's shape. */
static cJSON *error_json(const struct srv_error *e)
{
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->msg);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return root;
}

static enum MHD_Result send_error(struct srv_server *s, struct MHD_Connection *c,
                                  const struct srv_error *e)
{
    return send_json(s, c, e->status, error_json(e));
}

static enum MHD_Result fail(struct srv_server *s, struct MHD_Connection *c, int status,
                            const char *type, const char *code, const char *msg)
{
    struct srv_error e;
    srv_error_set(&e, status, type, NULL, "%s", msg);
    e.code = code;
    return send_error(s, c, &e);
}

/* The Bearer token, compared in time that depends only on the key's length. */
static bool authorized(const struct srv_server *s, struct MHD_Connection *c)
{
    const char *key = s->cfg.api_key;
    if (!key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return false;
    const char *given = h + 7;
    size_t kl = strlen(key), gl = strlen(given);
    unsigned diff = (unsigned)(kl ^ gl);
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < gl ? given[i] : 0);
    return diff == 0;
}

/* s[0..n) as valid UTF-8 for JSON (malloc'd, NUL-terminated): each maximal ill-formed
 * subsequence becomes U+FFFD, the Unicode-recommended practice (and what Python's and browsers'
 * decoders do), so a model that emits stray bytes or stops inside a character still gives
 * clients valid text. NULL when out of memory. */
static char *utf8_clean(const char *s, size_t n)
{
    char *out = malloc(n * 3 + 1), *o = out;
    if (!out)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                                     : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        size_t k = 1;
        if (need > 1) {
            /* the second byte's range depends on the lead (no overlongs, surrogates, > U+10FFFF) */
            unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            while (k < need && i + k < n && u[i + k] >= (k == 1 ? lo : 0x80) &&
                   u[i + k] <= (k == 1 ? hi : 0xBF))
                k++;
        }
        if (need != 0 && k == need) {
            memcpy(o, s + i, k);
            o += k;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += k;
    }
    *o = 0;
    return out;
}

static const char *finish_name(int f)
{
    return f == SRV_FINISH_STOP ? "stop" : f == SRV_FINISH_LENGTH ? "length" : "cancelled";
}

/* The KV panel of a job (called with job->mu held). */
static void add_kv(cJSON *o, const struct srv_job *j)
{
    cJSON *k = cJSON_AddObjectToObject(o, "kvpred");
    cJSON_AddNumberToObject(k, "n_cached", j->kv.n_cached);
    cJSON_AddNumberToObject(k, "prefix_reused", j->kv.prefix_reused);
    cJSON_AddNumberToObject(k, "kv_bytes_hot", (double)j->kv.bytes_hot);
    cJSON_AddNumberToObject(k, "kv_bytes_cold", (double)j->kv.bytes_cold);
    cJSON_AddNumberToObject(k, "read_share", j->kv.read_share);
    if (j->t_first > 0)
        cJSON_AddNumberToObject(k, "ttft_ms", (j->t_first - j->t_submit) * 1e3);
    /* from the first generated token to the last, once finished (llama-server's
     * timings.predicted_ms): a client can tell prefill and queueing from decode with it */
    if (j->t_first > 0 && j->t_done > j->t_first)
        cJSON_AddNumberToObject(k, "decode_ms", (j->t_done - j->t_first) * 1e3);
}

static void add_usage(cJSON *o, const struct srv_job *j)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->kv.prefix_reused);
}

static cJSON *envelope(const struct srv_server *s, const char *id, long long created,
                       const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", s->model_id);
    return o;
}

/* ---- streaming -------------------------------------------------------------------------- */

/* A stream waiting for its first token gets a comment this often (seconds): the prefill's
 * progress, or a keep-alive while it waits for a slot. */
#define PROGRESS_S 1.0

/* What next_event made. */
enum { EV_END, EV_DATA, EV_WAIT };

/* Format the next SSE event into st->out: EV_DATA; EV_WAIT when the job has nothing new yet;
 * EV_END at the end of the stream (or out of memory). */
static int next_event(struct stream *st)
{
    struct srv_job *j = st->job;
    bool chat = st->kind == SRV_CHAT;
    cJSON *o = NULL;
    char *txt = NULL;
    free(st->out);
    st->out = NULL;
    st->out_len = st->out_off = 0;
    if (st->wait.due && st->phase == 1) {
        /* Nothing for a while (a long prompt, or a wait for a slot): an SSE comment, which
         * clients skip, shows the client and any proxy between that the answer is alive, and
         * restarts libmicrohttpd's timeout, which runs again from the resume on. While the
         * prompt is prefilled the comment says how far it has come. */
        st->wait.due = false;
        char line[160];
        struct srv_prefill_progress p;
        if (srv_engine_job_progress(st->s->eng, j, &p) && p.seconds_left >= 0)
            snprintf(line, sizeof(line),
                     ": prefill %d/%d tokens (%d reused), %.1f tokens/s, %.0f s left\n\n",
                     p.done, p.total, p.reused, p.tokens_per_s, p.seconds_left);
        else if (p.total > 0)
            snprintf(line, sizeof(line), ": prefill %d/%d tokens (%d reused)\n\n", p.done,
                     p.total, p.reused);
        else
            snprintf(line, sizeof(line), ": keep-alive\n\n");
        if (!(st->out = strdup(line)))
            return EV_END;
        st->out_len = strlen(line);
        st->t_out = kvp_time_now();
        return EV_DATA;
    }
    pthread_mutex_lock(&j->mu);
    if (st->phase == 1 && j->visible <= st->sent && j->finish == SRV_RUNNING) {
        pthread_mutex_unlock(&j->mu);
        return EV_WAIT;
    }
    const char *object = chat ? "chat.completion.chunk" : "text_completion";
    switch (st->phase) {
    case 0: /* chat: the assistant role first, as OpenAI sends it */
        o = envelope(st->s, st->id, st->created, object);
        {
            cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c0 = cJSON_CreateObject();
            cJSON_AddItemToArray(ch, c0);
            cJSON_AddNumberToObject(c0, "index", 0);
            cJSON *d = cJSON_AddObjectToObject(c0, "delta");
            cJSON_AddStringToObject(d, "role", "assistant");
            cJSON_AddStringToObject(d, "content", "");
            cJSON_AddNullToObject(c0, "finish_reason");
        }
        st->phase = 1;
        break;
    case 1:
        if (j->visible > st->sent) {
            char *piece = utf8_clean(j->text + st->sent, j->visible - st->sent);
            st->sent = j->visible;
            o = envelope(st->s, st->id, st->created, object);
            cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c0 = cJSON_CreateObject();
            cJSON_AddItemToArray(ch, c0);
            cJSON_AddNumberToObject(c0, "index", 0);
            if (chat)
                cJSON_AddStringToObject(cJSON_AddObjectToObject(c0, "delta"), "content",
                                        piece ? piece : "");
            else
                cJSON_AddStringToObject(c0, "text", piece ? piece : "");
            if (!chat)
                cJSON_AddNullToObject(c0, "logprobs");
            cJSON_AddNullToObject(c0, "finish_reason");
            add_kv(o, j);
            free(piece);
            break;
        }
        st->phase = 2;
        /* finished */
        __attribute__((fallthrough));
    case 2:
        if (j->finish == SRV_FINISH_ERROR || j->finish == SRV_FINISH_CANCELLED) {
            struct srv_error e;
            srv_error_set(&e, 500, "server_error", NULL, "%s",
                          j->err[0] ? j->err : "generation failed");
            o = error_json(&e);
            st->phase = 4;
            break;
        }
        o = envelope(st->s, st->id, st->created, object);
        {
            cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c0 = cJSON_CreateObject();
            cJSON_AddItemToArray(ch, c0);
            cJSON_AddNumberToObject(c0, "index", 0);
            if (chat)
                cJSON_AddObjectToObject(c0, "delta");
            else
                cJSON_AddStringToObject(c0, "text", "");
            cJSON_AddStringToObject(c0, "finish_reason", finish_name(j->finish));
            add_kv(o, j);
        }
        st->phase = st->include_usage ? 3 : 4;
        break;
    case 3:
        o = envelope(st->s, st->id, st->created, object);
        cJSON_AddArrayToObject(o, "choices");
        add_usage(o, j);
        st->phase = 4;
        break;
    case 4:
        st->phase = 5;
        pthread_mutex_unlock(&j->mu);
        st->out = strdup("data: [DONE]\n\n");
        st->out_len = st->out ? strlen(st->out) : 0;
        return st->out ? EV_DATA : EV_END;
    default:
        pthread_mutex_unlock(&j->mu);
        return EV_END;
    }
    pthread_mutex_unlock(&j->mu);
    txt = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!txt)
        return EV_END;
    size_t tl = strlen(txt);
    st->out = malloc(tl + 9);
    if (st->out) {
        memcpy(st->out, "data: ", 6);
        memcpy(st->out + 6, txt, tl);
        memcpy(st->out + 6 + tl, "\n\n", 3);
        st->out_len = tl + 8;
    }
    free(txt);
    st->t_out = kvp_time_now();
    return st->out ? EV_DATA : EV_END;
}

/* libmicrohttpd asks for more of the stream when the socket can take it: the next event, or
 * nothing for now (the connection then parks until the job has more, a keep-alive is due or the
 * client has gone). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;
    (void)pos;
    if (st->wait.gone)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    if (st->out_off == st->out_len) {
        int ev = next_event(st);
        if (ev == EV_WAIT) {
            /* before the first token, a comment every PROGRESS_S at least: the prefill's
             * progress (a long prompt takes minutes) */
            double every = st->s->keepalive_s;
            if (st->sent == 0 && every > PROGRESS_S)
                every = PROGRESS_S;
            st->wait = (struct srv_wait){.conn = st->conn, .job = st->job, .after = st->sent,
                                         .keepalive_at = st->t_out + every};
            if (!srv_waiter_park(st->s->waiter, &st->wait))
                return MHD_CONTENT_READER_END_WITH_ERROR; /* stopping */
            return 0;
        }
        if (ev == EV_END)
            return st->phase == 5 ? MHD_CONTENT_READER_END_OF_STREAM
                                  : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out_len - st->out_off < max ? st->out_len - st->out_off : max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

/* Where a job stands, for kvpred_http_clients_gone_total (job->mu held). */
static int job_stage(const struct srv_job *j)
{
    return j->n_gen > 0 ? GONE_GENERATING : j->t_start > 0 ? GONE_PREFILL : GONE_QUEUED;
}

/* The waiter found a parked client gone (its lock held; it cancelled the job). */
static void on_gone(void *cls, struct srv_job *j)
{
    struct srv_server *s = cls;
    pthread_mutex_lock(&j->mu);
    int stage = job_stage(j);
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_add(&s->gone[stage], 1);
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    if (!st->wait.gone) {
        /* a stream that ends before its job: libmicrohttpd lost the client while sending */
        pthread_mutex_lock(&st->job->mu);
        int stage = st->job->finish == SRV_RUNNING ? job_stage(st->job) : -1;
        pthread_mutex_unlock(&st->job->mu);
        if (stage >= 0)
            atomic_fetch_add(&st->s->gone[stage], 1);
    }
    srv_job_cancel(st->job); /* a no-op once it finished; frees the slot if the client left */
    srv_job_unref(st->job);
    free(st->out);
    free(st);
}

/* ---- generation ------------------------------------------------------------------------- */

static bool model_matches(const struct srv_server *s, const char *name)
{
    if (!name || !strcmp(name, s->model_id) || !strcmp(name, s->cfg.model_path))
        return true;
    const char *base = strrchr(s->cfg.model_path, '/');
    base = base ? base + 1 : s->cfg.model_path;
    return !strcmp(name, base);
}

/* Prompt tokens of a request: the text as `kvpred run -p` tokenizes it, or the conversation in
 * the model's chat template as `kvpred run --chat` does. */
static int32_t *request_tokens(struct srv_server *s, const struct srv_request *r, size_t *n,
                               struct srv_error *e)
{
    char *text = NULL;
    size_t len;
    bool special = r->kind == SRV_CHAT;
    struct kvp_err err = {0};
    if (special) {
        struct kvp_chat_msg *m = calloc((size_t)r->n_msgs, sizeof(*m));
        if (!m) {
            srv_error_set(e, 500, "server_error", NULL, "out of memory");
            return NULL;
        }
        for (int i = 0; i < r->n_msgs; i++)
            m[i] = (struct kvp_chat_msg){.role = r->msgs[i].role, .content = r->msgs[i].content};
        int rc = kvp_chat_apply(s->chat_fmt, m, (size_t)r->n_msgs, true, &text, &len, &err);
        free(m);
        if (rc < 0) {
            srv_error_set(e, 400, "invalid_request_error", "messages", "%s", err.msg);
            return NULL;
        }
    } else {
        len = strlen(r->prompt);
    }
    const char *t = special ? text : r->prompt;
    /* a token is at least one byte (plus BOS): len + 8 is always room enough */
    size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids || kvp_tokenize_special(s->model, t, len, true, special, ids, cap, n, &err) < 0) {
        srv_error_set(e, ids ? 400 : 500, ids ? "invalid_request_error" : "server_error",
                      special ? "messages" : "prompt", "%s", ids ? err.msg : "out of memory");
        free(ids);
        ids = NULL;
    }
    free(text);
    return ids;
}

static struct srv_job *make_job(struct srv_server *s, const struct srv_request *r,
                                struct srv_error *e)
{
    size_t n = 0;
    int32_t *ids = request_tokens(s, r, &n, e);
    if (!ids)
        return NULL;
    if (n == 0 || n >= (size_t)s->n_ctx) {
        free(ids);
        srv_error_set(e, 400, "invalid_request_error", r->kind == SRV_CHAT ? "messages" : "prompt",
                      "the prompt has %zu tokens; this server takes 1..%d (its context per slot "
                      "is %d)", n, s->n_ctx - 1, s->n_ctx);
        e->code = "context_length_exceeded";
        return NULL;
    }
    struct srv_job *j = srv_job_new(ids, (int)n);
    free(ids);
    if (!j) {
        srv_error_set(e, 500, "server_error", NULL, "out of memory");
        return NULL;
    }
    j->max_tokens = r->max_tokens >= 0 ? r->max_tokens : s->cfg.default_max_tokens;
    j->sp = (struct kvp_sampler_params){.temperature = (float)r->temperature,
                                        .top_k = r->top_k, .top_p = (float)r->top_p,
                                        .repeat_penalty = 1.0f, .repeat_last_n = 64,
                                        .seed = r->seed};
    for (int i = 0; i < r->n_stop; i++) {
        j->stop[i] = strdup(r->stop[i]);
        if (!j->stop[i])
            break;
        j->n_stop = i + 1;
    }
    if (r->policy || r->has_budget) {
        j->has_policy = true;
        j->pol = s->cfg.pol ? *s->cfg.pol : (struct kvp_policy_params){0};
        if (r->policy) {
            j->pol_name = strdup(r->policy);
            j->pol.name = j->pol_name;
            if (!s->cfg.pol || !s->cfg.pol->name || strcmp(s->cfg.pol->name, r->policy)) {
                /* another policy than the server's: none of its file options carry over */
                j->pol.aux_path = NULL;
                j->pol.head_profile = NULL;
                j->pol.opts = NULL;
            }
        }
        if (r->has_budget) {
            j->pol.budget = r->budget;
            j->pol.budget_ratio = r->budget_ratio;
        }
        char aux[4096];
        srv_policy_default_file(s->cfg.model_path, &j->pol, aux, sizeof(aux));
        if (j->pol.aux_path == aux || j->pol.head_profile == aux) {
            /* keep the name and the path with the job, in one allocation */
            size_t nl = j->pol.name ? strlen(j->pol.name) + 1 : 0;
            char *both = malloc(nl + strlen(aux) + 1);
            if (!both) {
                srv_job_unref(j);
                srv_error_set(e, 500, "server_error", NULL, "out of memory");
                return NULL;
            }
            memcpy(both, j->pol.name, nl);
            strcpy(both + nl, aux);
            if (j->pol.aux_path == aux)
                j->pol.aux_path = both + nl;
            else
                j->pol.head_profile = both + nl;
            j->pol.name = both;
            free(j->pol_name);
            j->pol_name = both;
        }
    }
    srv_job_set_prefill(j, r); /* the request's prefill attention, if it names one */
    return j;
}

static void new_id(struct srv_server *s, const char *prefix, char *id, size_t cap)
{
    unsigned long long n = atomic_fetch_add(&s->id_seq, 1);
    snprintf(id, cap, "%s-%llx%06llx", prefix, (unsigned long long)time(NULL), n & 0xffffff);
}

/* The non-streamed answer of a finished job (cs->job; the connection was resumed). */
static enum MHD_Result answer(struct srv_server *s, struct MHD_Connection *c, struct conn *cs)
{
    struct srv_job *j = cs->job;
    if (cs->wait.gone)
        return MHD_NO; /* the client left: close */
    pthread_mutex_lock(&j->mu);
    if (j->finish == SRV_RUNNING) {
        /* resumed before the end: the waiter is stopping, and the engine has stopped too */
        pthread_mutex_unlock(&j->mu);
        return fail(s, c, 503, "server_error", "server_stopping",
                    "the server is stopping and takes no new requests");
    }
    if (j->finish == SRV_FINISH_ERROR || j->finish == SRV_FINISH_CANCELLED) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", j->err[0] ? j->err : "generation failed");
        int finish = j->finish;
        pthread_mutex_unlock(&j->mu);
        if (finish == SRV_FINISH_CANCELLED) /* by the server: it is stopping */
            return fail(s, c, 503, "server_error", "server_stopping", msg);
        return fail(s, c, 500, "server_error", NULL, msg);
    }
    int kind = cs->kind;
    cJSON *o = envelope(s, cs->id, cs->created,
                        kind == SRV_CHAT ? "chat.completion" : "text_completion");
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c0 = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c0);
    cJSON_AddNumberToObject(c0, "index", 0);
    char *text = utf8_clean(j->text, j->visible);
    if (kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c0, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text ? text : "");
    } else {
        cJSON_AddStringToObject(c0, "text", text ? text : "");
        cJSON_AddNullToObject(c0, "logprobs");
    }
    free(text);
    cJSON_AddStringToObject(c0, "finish_reason", finish_name(j->finish));
    add_usage(o, j);
    add_kv(o, j);
    pthread_mutex_unlock(&j->mu);
    return send_json(s, c, 200, o);
}

static enum MHD_Result complete(struct srv_server *s, struct MHD_Connection *c, int kind,
                                struct conn *cs)
{
    struct srv_request r;
    struct srv_error e;
    if (srv_request_parse(cs->body ? cs->body : "", cs->len, kind, &s->lim, &s->def, &r, &e) < 0) {
        srv_request_free(&r);
        return send_error(s, c, &e);
    }
    if (!model_matches(s, r.model)) {
        srv_error_set(&e, 404, "invalid_request_error", "model",
                      "the model '%.60s' does not exist; this server has '%s'", r.model,
                      s->model_id);
        e.code = "model_not_found";
        srv_request_free(&r);
        return send_error(s, c, &e);
    }
    struct srv_job *j = make_job(s, &r, &e);
    bool stream = r.stream, usage = r.include_usage;
    srv_request_free(&r);
    if (!j)
        return send_error(s, c, &e);
    j->on_change = srv_waiter_wake;
    j->on_change_arg = s->waiter;
    int sub = srv_engine_submit(s->eng, j);
    if (sub < 0) {
        srv_job_unref(j);
        /* a full queue passes (429, as OpenAI answers a rate limit: the client should retry
         * after Retry-After); a stopping server does not come back on this process (503) */
        if (sub == SRV_SUBMIT_FULL)
            return fail(s, c, 429, "requests", "rate_limit_exceeded",
                        "every slot is taken and the queue is full; retry after the "
                        "Retry-After header's seconds");
        return fail(s, c, 503, "server_error", "server_stopping",
                    "the server is stopping and takes no new requests");
    }
    cs->answering = true;
    atomic_fetch_add(&s->answering, 1);
    /* from here the connection waits parked (no timeout runs) or sends its answer, which a
     * client may take more slowly than it sent its request */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                              (unsigned)s->cfg.send_timeout_s);
    new_id(s, kind == SRV_CHAT ? "chatcmpl" : "cmpl", cs->id, sizeof(cs->id));
    cs->created = (long long)time(NULL);
    cs->kind = kind;
    if (stream) {
        struct stream *st = calloc(1, sizeof(*st));
        if (!st) {
            srv_job_cancel(j);
            srv_job_unref(j);
            return fail(s, c, 500, "server_error", NULL, "out of memory");
        }
        *st = (struct stream){.s = s, .job = j, .conn = c, .kind = kind,
                              .include_usage = usage, .created = cs->created,
                              .phase = kind == SRV_CHAT ? 0 : 1, .t_out = kvp_time_now()};
        snprintf(st->id, sizeof(st->id), "%s", cs->id);
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!resp) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count_status(s, 200);
        return rc;
    }
    /* not streamed: park the connection until the whole answer is there (answer()) */
    cs->job = j;
    cs->wait = (struct srv_wait){.conn = c, .job = j, .after = SIZE_MAX};
    if (!srv_waiter_park(s->waiter, &cs->wait)) {
        srv_job_cancel(j);
        return fail(s, c, 503, "server_error", "server_stopping",
                    "the server is stopping and takes no new requests");
    }
    return MHD_YES;
}

/* ---- the other endpoints ---------------------------------------------------------------- */

static enum MHD_Result models(struct srv_server *s, struct MHD_Connection *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kvpred");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_ctx_per_slot", s->n_ctx);
    cJSON_AddNumberToObject(meta, "n_slots", s->cfg.n_slots);
    cJSON_AddStringToObject(meta, "policy",
                            s->cfg.pol && s->cfg.pol->name ? s->cfg.pol->name : "full");
    cJSON *pols = cJSON_AddArrayToObject(meta, "policies");
    for (int i = 0; kvp_policy_name(i); i++)
        cJSON_AddItemToArray(pols, cJSON_CreateString(kvp_policy_name(i)));
    return send_json(s, c, 200, o);
}

static enum MHD_Result metrics(struct srv_server *s, struct MHD_Connection *c)
{
    size_t cap = 32768;
    char *buf = malloc(cap);
    if (!buf)
        return fail(s, c, 500, "server_error", NULL, "out of memory");
    /* each part writes snprintf-style; a part that did not fit is cut where the buffer ends */
    size_t n = srv_engine_metrics(s->eng, buf, cap);
    if (n + 16384 > cap) { /* many slots: room for all of them and the parts below */
        char *big = realloc(buf, n + 16384);
        if (big) {
            buf = big;
            cap = n + 16384;
            n = srv_engine_metrics(s->eng, buf, cap);
        }
    }
#define ROOM (n < cap ? cap - n : 0)
#define AT (n < cap ? buf + n : NULL)
    n += srv_conns_metrics(s->conns, AT, ROOM);
    n += (size_t)snprintf(AT, ROOM,
                          "# HELP kvpred_http_requests_total HTTP answers by status.\n"
                          "# TYPE kvpred_http_requests_total counter\n");
    for (size_t i = 0; i <= N_COUNTED; i++) {
        char code[16];
        if (i < N_COUNTED)
            snprintf(code, sizeof(code), "%d", counted_status[i]);
        else
            snprintf(code, sizeof(code), "other");
        n += (size_t)snprintf(AT, ROOM, "kvpred_http_requests_total{code=\"%s\"} %llu\n",
                              code, (unsigned long long)atomic_load(&s->status_count[i]));
    }
    n += (size_t)snprintf(AT, ROOM,
                          "# HELP kvpred_http_parked Connections waiting, without a thread, "
                          "for a slot, a prefill or their next token.\n"
                          "# TYPE kvpred_http_parked gauge\n"
                          "kvpred_http_parked %zu\n"
                          "# HELP kvpred_http_clients_gone_total Clients that left before their "
                          "answer ended, by where their request was.\n"
                          "# TYPE kvpred_http_clients_gone_total counter\n",
                          srv_waiter_parked(s->waiter));
    for (int i = 0; i < N_GONE; i++)
        n += (size_t)snprintf(AT, ROOM, "kvpred_http_clients_gone_total{stage=\"%s\"} %llu\n",
                              gone_stage[i], (unsigned long long)atomic_load(&s->gone[i]));
#undef ROOM
#undef AT
    if (n >= cap)
        n = cap - 1;
    enum MHD_Result rc = send_text(s, c, 200, "text/plain; version=0.0.4", buf, n);
    free(buf);
    return rc;
}

/* The one place the body limit is checked: the Content-Length announced, and the bytes as they
 * come (a chunked body has no length up front). */
static bool body_fits(const struct srv_server *s, unsigned long long n)
{
    return n <= s->lim.max_body;
}

static enum MHD_Result too_large(struct srv_server *s, struct MHD_Connection *c)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "the request body is larger than the limit of %zu bytes",
             s->lim.max_body);
    return fail(s, c, 413, "invalid_request_error", "request_too_large", msg);
}

static bool is_monitoring(const char *url)
{
    return !strcmp(url, "/health") || !strcmp(url, "/metrics");
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    struct srv_server *s = cls;
    struct conn *cs = *con_cls;
    (void)version;
    if (!cs) {
        /* first call: headers only */
        cs = calloc(1, sizeof(*cs));
        if (!cs)
            return MHD_NO;
        *con_cls = cs;
        srv_conns_request_begin(c);
        if (srv_conns_over_limit(c) && !is_monitoring(url))
            return fail(s, c, 503, "server_error", "too_many_connections",
                        "the server has as many connections open as it takes; retry after the "
                        "Retry-After header's seconds");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || *end || !body_fits(s, v)) {
                cs->too_large = true;
                return too_large(s, c);
            }
        }
        return MHD_YES;
    }
    if (cs->job) /* resumed: the answer is ready, or the client left */
        return answer(s, c, cs);
    if (*upload_size > 0) {
        if (!cs->too_large) {
            if (!body_fits(s, (unsigned long long)cs->len + *upload_size)) {
                cs->too_large = true;
            } else {
                if (cs->len + *upload_size + 1 > cs->cap) {
                    size_t cap = cs->cap ? cs->cap : 4096;
                    while (cap < cs->len + *upload_size + 1)
                        cap *= 2;
                    char *b = realloc(cs->body, cap);
                    if (!b)
                        return MHD_NO;
                    cs->body = b;
                    cs->cap = cap;
                }
                memcpy(cs->body + cs->len, upload, *upload_size);
                cs->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->too_large)
        return too_large(s, c);
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get)
            return fail(s, c, 405, "invalid_request_error", NULL, "use GET /health");
        static const char ok[] = "{\"status\":\"ok\"}";
        return send_text(s, c, 200, "application/json", ok, sizeof(ok) - 1);
    }
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
        /* the page itself holds no data; the calls it makes carry the key */
        if (!get)
            return fail(s, c, 405, "invalid_request_error", NULL, "use GET /");
        return send_text(s, c, 200, "text/html; charset=utf-8", srv_page_html,
                         srv_page_html_len);
    }
    if (!authorized(s, c))
        return fail(s, c, 401, "invalid_request_error", "invalid_api_key",
                    "a valid API key is required: send 'Authorization: Bearer KEY'");
    int kind = -1;
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/completions"))
        kind = SRV_COMPLETION;
    else if (!strcmp(url, "/v1/chat/completions") || !strcmp(url, "/chat/completions"))
        kind = SRV_CHAT;
    if (kind >= 0) {
        if (!post)
            return fail(s, c, 405, "invalid_request_error", NULL, "use POST");
        return complete(s, c, kind, cs);
    }
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/models")) {
        if (!get)
            return fail(s, c, 405, "invalid_request_error", NULL, "use GET");
        return models(s, c);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get)
            return fail(s, c, 405, "invalid_request_error", NULL, "use GET");
        return metrics(s, c);
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "no endpoint %.100s", url);
    return fail(s, c, 404, "invalid_request_error", "not_found", msg);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    struct srv_server *s = cls;
    struct conn *cs = *con_cls;
    int stage = -1;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED) {
        /* with a response queued, the client stopped taking it; else its request never came */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
        stage = ci || (cs && cs->answering) ? SRV_TIMEOUT_SEND : SRV_TIMEOUT_RECEIVE;
    }
    srv_conns_request_end(s->conns, c, stage);
    if (cs) {
        if (cs->answering) {
            /* the next request on this connection arrives under the receive timeout again */
            MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                                      (unsigned)s->cfg.timeout_s);
            atomic_fetch_sub(&s->answering, 1);
        }
        if (cs->job) {
            srv_job_cancel(cs->job); /* a no-op once it finished */
            srv_job_unref(cs->job);
        }
        free(cs->body);
        free(cs);
        *con_cls = NULL;
    }
}

/* ---- start and stop --------------------------------------------------------------------- */

bool srv_policy_default_file(const char *model_path, struct kvp_policy_params *p, char *buf,
                             size_t cap)
{
    if (!p->name || !model_path)
        return false;
    const char *ext = NULL;
    const char **field = NULL;
    if (!strcmp(p->name, "predictor") && !p->aux_path) {
        ext = ".kvpp";
        field = &p->aux_path;
    } else if (!strcmp(p->name, "qpredictor") && !p->aux_path) {
        ext = ".qkvpp";
        field = &p->aux_path;
    } else if (!strcmp(p->name, "catekv") && !p->head_profile) {
        ext = ".catekv-r0.2.profile";
        field = &p->head_profile;
    }
    if (!ext)
        return false;
    size_t n = strlen(model_path);
    if (n >= 5 && !strcmp(model_path + n - 5, ".gguf"))
        n -= 5;
    if (n + strlen(ext) + 1 > cap)
        return false;
    memcpy(buf, model_path, n);
    strcpy(buf + n, ext);
    struct stat st;
    if (stat(buf, &st) != 0)
        return false;
    *field = buf;
    return true;
}

/* Raise the open-files limit to what the connections need beside the model, stores and
 * prefix files (a soft limit of 1024 is common); false if the hard limit is lower. */
static bool room_for_files(rlim_t need, rlim_t *have)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return true; /* cannot tell: let accept() report it */
    *have = rl.rlim_max;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
            return false;
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            return false;
    }
    return true;
}

static void server_free(struct srv_server *s)
{
    srv_waiter_free(s->waiter);
    srv_engine_free(s->eng);
    srv_conns_free(s->conns);
    free(s);
}

int srv_server_start(const struct srv_config *cfg, const kvp_model *model,
                     struct srv_server **out, struct kvp_err *err)
{
    *out = NULL;
    int timeout = cfg->timeout_s > 0 ? cfg->timeout_s : 5;
    int send_timeout = cfg->send_timeout_s > 0 ? cfg->send_timeout_s : 60;
    unsigned max_conn = cfg->max_conn > 0 ? (unsigned)cfg->max_conn : 1024;
    unsigned threads = cfg->http_threads > 0 ? (unsigned)cfg->http_threads : 4;
    /* the connections, libmicrohttpd's own descriptors, and room for the model, the stores,
     * the prefix folder and the log */
    rlim_t need = (rlim_t)max_conn + MONITOR_RESERVE + 4 * threads + 256, have = 0;
    if (!room_for_files(need, &have))
        return kvp_err_set(err, KVP_EINVAL, "serve: --max-connections %u needs %llu open files; "
                           "the limit is %llu (ulimit -n)", max_conn, (unsigned long long)need,
                           (unsigned long long)have);
    struct srv_server *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    s->cfg = *cfg;
    s->cfg.timeout_s = timeout;
    s->cfg.send_timeout_s = send_timeout;
    /* a stream with nothing to send for a third of the shorter timeout sends a comment */
    s->keepalive_s = (timeout < send_timeout ? timeout : send_timeout) / 3.0;
    s->model = model;
    s->chat_fmt = kvp_model_chat_format(model); /* what `kvpred run --chat` uses */
    const char *base = strrchr(cfg->model_path, '/');
    base = base ? base + 1 : cfg->model_path;
    snprintf(s->model_id, sizeof(s->model_id), "%s", base);
    size_t ml = strlen(s->model_id);
    if (ml > 5 && !strcmp(s->model_id + ml - 5, ".gguf"))
        s->model_id[ml - 5] = 0;
    s->lim = (struct srv_limits){.max_body = cfg->max_body, .max_tokens = cfg->max_tokens,
                                 .max_messages = 256};
    s->def = (struct srv_defaults){.temperature = cfg->temperature, .top_p = cfg->top_p,
                                   .top_k = cfg->top_k, .seed = cfg->seed};
    struct srv_conn_limits cl = {.max_conn = max_conn, .reserve = MONITOR_RESERVE,
                                 .per_client = cfg->max_client_conn > 0
                                                   ? (unsigned)cfg->max_client_conn : 0,
                                 .recv_timeout_s = timeout};
    s->conns = srv_conns_new(&cl);
    if (!s->conns || srv_waiter_start(on_gone, s, &s->waiter) < 0) {
        server_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "serve: cannot start the connection waiter");
    }
    struct srv_engine_config ec = {.model = model, .n_slots = cfg->n_slots, .cp = cfg->cp,
                                   .pol = cfg->pol, .max_queue = cfg->max_queue,
                                   .cache_ram = cfg->cache_ram, .cache_dir = cfg->cache_dir,
                                   .model_path = cfg->model_path};
    ec.prefix_store = cfg->prefix_store;
    int rc = srv_engine_start(&ec, &s->eng, err);
    if (rc < 0) {
        server_free(s);
        return rc;
    }
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    s->n_ctx = cfg->cp.n_ctx > 0 ? cfg->cp.n_ctx : info.n_ctx_train;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", cfg->port);
    int g = getaddrinfo(cfg->host, port, &hints, &ai);
    if (g != 0 || !ai) {
        server_free(s);
        return kvp_err_set(err, KVP_EINVAL, "serve: cannot resolve host '%s': %s", cfg->host,
                           gai_strerror(g));
    }
    /* Event-driven: a few threads poll every connection with epoll, so an open connection costs
     * a socket and a little memory, not a thread; a request never blocks one (it parks). */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* conns.c enforces the limits (and counts what it refuses); libmicrohttpd's own limit is
     * per thread, so each thread may hold them all */
    unsigned mhd_limit = (max_conn + MONITOR_RESERVE) * threads;
    s->d = MHD_start_daemon(flags, 0, srv_conns_accept, s->conns, handler, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, threads,
                            MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout,
                            MHD_OPTION_NOTIFY_CONNECTION, srv_conns_notify, s->conns,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        server_free(s);
        return kvp_err_set(err, KVP_EIO, "serve: cannot listen on %s:%d (in use, or no such "
                           "address)", cfg->host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return 0;
}

int srv_server_port(const struct srv_server *s)
{
    return s->port;
}

void srv_server_stop(struct srv_server *s, double grace_s)
{
    if (!s)
        return;
    int lfd = MHD_quiesce_daemon(s->d); /* no new connections; the socket is ours to close */
    if (lfd >= 0)
        close(lfd);
    /* the waiter keeps resuming connections while the engine finishes what it has */
    srv_engine_stop(s->eng, grace_s);
    /* every job has ended: let their answers reach the clients (a client that takes nothing is
     * cut when this bound passes) */
    double until = kvp_time_now() + 5;
    while (atomic_load(&s->answering) > 0 && kvp_time_now() < until)
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    srv_waiter_stop(s->waiter); /* nothing may stay suspended when libmicrohttpd stops */
    MHD_stop_daemon(s->d);
    server_free(s);
}
