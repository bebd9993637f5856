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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/platform.h"
#include "model/model.h"
#include "server/engine.h"
#include "server/page.h"
#include "server/request.h"
#include "server/server.h"
#include "tokenizer/chat.h"

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
                            * connection timeout) */
};

/* One request in progress (MHD's per-connection pointer). */
struct conn {
    char *body;
    size_t len, cap;
    bool too_large;
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

/* True when the client has closed its side (EOF or reset on the socket). */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return true;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Wait (job->mu held) until the job has text past `sent` or has finished, checking every
 * 100 ms whether the client left; WAIT_GONE when it did (the job is then cancelled). With
 * `idle_s` > 0, WAIT_IDLE after that many seconds without either. */
enum { WAIT_READY, WAIT_GONE, WAIT_IDLE };
static int wait_job(struct srv_job *j, size_t sent, struct MHD_Connection *c, double idle_s)
{
    double until = idle_s > 0 ? kvp_time_now() + idle_s : 0;
    while (j->visible <= sent && j->finish == SRV_RUNNING) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) {
            if (client_gone(c)) {
                srv_job_cancel(j);
                return WAIT_GONE;
            }
            if (until > 0 && kvp_time_now() >= until)
                return WAIT_IDLE;
        }
    }
    return WAIT_READY;
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

/* Format the next SSE event into st->out; false at the end of the stream. */
static bool next_event(struct stream *st)
{
    struct srv_job *j = st->job;
    bool chat = st->kind == SRV_CHAT;
    cJSON *o = NULL;
    char *txt = NULL;
    free(st->out);
    st->out = NULL;
    st->out_len = st->out_off = 0;
    pthread_mutex_lock(&j->mu);
    if (st->phase == 1) {
        /* A stream waits inside this callback, where libmicrohttpd sees no traffic: once its
         * --timeout passes without a byte sent, it closes the connection as idle as soon as the
         * callback returns, cutting a stream whose first token came late (a long prompt, or a
         * wait for a slot) in the middle of its chunked body. An SSE comment well within the
         * timeout keeps it alive; clients skip comments. A client that stops reading is still
         * closed by the timeout, since nothing can be sent to it. */
        int w = wait_job(j, st->sent, st->conn, st->s->keepalive_s);
        if (w == WAIT_GONE) {
            pthread_mutex_unlock(&j->mu);
            return false;
        }
        if (w == WAIT_IDLE) {
            pthread_mutex_unlock(&j->mu);
            static const char ka[] = ": keep-alive\n\n";
            if (!(st->out = malloc(sizeof(ka))))
                return false;
            memcpy(st->out, ka, sizeof(ka));
            st->out_len = sizeof(ka) - 1;
            return true;
        }
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
        return st->out != NULL;
    default:
        pthread_mutex_unlock(&j->mu);
        return false;
    }
    pthread_mutex_unlock(&j->mu);
    txt = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!txt)
        return false;
    size_t tl = strlen(txt);
    st->out = malloc(tl + 9);
    if (st->out) {
        memcpy(st->out, "data: ", 6);
        memcpy(st->out + 6, txt, tl);
        memcpy(st->out + 6 + tl, "\n\n", 3);
        st->out_len = tl + 8;
    }
    free(txt);
    return st->out != NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;
    if (st->out_off == st->out_len && !next_event(st))
        return st->phase == 5 ? MHD_CONTENT_READER_END_OF_STREAM
                              : MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = st->out_len - st->out_off < max ? st->out_len - st->out_off : max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
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
    return j;
}

static void new_id(struct srv_server *s, const char *prefix, char *id, size_t cap)
{
    unsigned long long n = atomic_fetch_add(&s->id_seq, 1);
    snprintf(id, cap, "%s-%llx%06llx", prefix, (unsigned long long)time(NULL), n & 0xffffff);
}

static enum MHD_Result complete(struct srv_server *s, struct MHD_Connection *c, int kind,
                                const struct conn *cs)
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
    char id[48];
    new_id(s, kind == SRV_CHAT ? "chatcmpl" : "cmpl", id, sizeof(id));
    long long created = (long long)time(NULL);
    if (stream) {
        struct stream *st = calloc(1, sizeof(*st));
        if (!st) {
            srv_job_cancel(j);
            srv_job_unref(j);
            return fail(s, c, 500, "server_error", NULL, "out of memory");
        }
        *st = (struct stream){.s = s, .job = j, .conn = c, .kind = kind,
                              .include_usage = usage, .created = created,
                              .phase = kind == SRV_CHAT ? 0 : 1};
        snprintf(st->id, sizeof(st->id), "%s", id);
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
    /* not streamed: wait here (this connection's own thread) for the whole answer */
    pthread_mutex_lock(&j->mu);
    bool here = true;
    while (here && j->finish == SRV_RUNNING)
        here = wait_job(j, j->len + 1, c, 0) == WAIT_READY;
    if (!here || j->finish == SRV_FINISH_ERROR || j->finish == SRV_FINISH_CANCELLED) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", j->err[0] ? j->err : "generation failed");
        int finish = j->finish;
        pthread_mutex_unlock(&j->mu);
        srv_job_unref(j);
        if (!here)
            return MHD_NO; /* the client left: close */
        if (finish == SRV_FINISH_CANCELLED) /* by the server: it is stopping */
            return fail(s, c, 503, "server_error", "server_stopping", msg);
        return fail(s, c, 500, "server_error", NULL, msg);
    }
    cJSON *o = envelope(s, id, created, kind == SRV_CHAT ? "chat.completion" : "text_completion");
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
    srv_job_unref(j);
    return send_json(s, c, 200, o);
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
    size_t cap = 16384;
    char *buf = malloc(cap);
    if (!buf)
        return fail(s, c, 500, "server_error", NULL, "out of memory");
    size_t n = srv_engine_metrics(s->eng, buf, cap);
    if (n >= cap)
        n = cap - 1;
    n += (size_t)snprintf(buf + n, cap - n,
                          "# HELP kvpred_http_requests_total HTTP answers by status.\n"
                          "# TYPE kvpred_http_requests_total counter\n");
    for (size_t i = 0; i <= N_COUNTED && n < cap; i++) {
        char code[16];
        if (i < N_COUNTED)
            snprintf(code, sizeof(code), "%d", counted_status[i]);
        else
            snprintf(code, sizeof(code), "other");
        n += (size_t)snprintf(buf + n, cap - n, "kvpred_http_requests_total{code=\"%s\"} %llu\n",
                              code, (unsigned long long)atomic_load(&s->status_count[i]));
    }
    if (n >= cap)
        n = cap - 1;
    enum MHD_Result rc = send_text(s, c, 200, "text/plain; version=0.0.4", buf, n);
    free(buf);
    return rc;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    struct srv_server *s = cls;
    struct conn *cs = *con_cls;
    if (!cs) {
        /* first call: headers only */
        cs = calloc(1, sizeof(*cs));
        if (!cs)
            return MHD_NO;
        *con_cls = cs;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || *end || v > s->lim.max_body) {
                cs->too_large = true;
                char msg[160];
                snprintf(msg, sizeof(msg), "the request body is larger than the limit of %zu "
                         "bytes", s->lim.max_body);
                return fail(s, c, 413, "invalid_request_error", "request_too_large", msg);
            }
        }
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!cs->too_large) {
            if (cs->len + *upload_size > s->lim.max_body) {
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
    if (cs->too_large) {
        char msg[160];
        snprintf(msg, sizeof(msg), "the request body is larger than the limit of %zu bytes",
                 s->lim.max_body);
        return fail(s, c, 413, "invalid_request_error", "request_too_large", msg);
    }
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
    struct conn *cs = *con_cls;
    if (cs) {
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

int srv_server_start(const struct srv_config *cfg, const kvp_model *model,
                     struct srv_server **out, struct kvp_err *err)
{
    *out = NULL;
    struct srv_server *s = calloc(1, sizeof(*s));
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    s->cfg = *cfg;
    s->keepalive_s = (cfg->timeout_s > 0 ? cfg->timeout_s : 30) / 3.0;
    s->model = model;
    s->chat_fmt = model->gguf ? kvp_chat_detect_gguf(model->gguf) : KVP_CHAT_PLAIN;
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
    struct srv_engine_config ec = {.model = model, .n_slots = cfg->n_slots, .cp = cfg->cp,
                                   .pol = cfg->pol, .max_queue = cfg->max_queue,
                                   .cache_ram = cfg->cache_ram, .cache_dir = cfg->cache_dir,
                                   .model_path = cfg->model_path};
    ec.prefix_store = cfg->prefix_store;
    int rc = srv_engine_start(&ec, &s->eng, err);
    if (rc < 0) {
        free(s);
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
        srv_engine_free(s->eng);
        free(s);
        return kvp_err_set(err, KVP_EINVAL, "serve: cannot resolve host '%s': %s", cfg->host,
                           gai_strerror(g));
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* connections: the slots, the queue and a few for health checks and metrics */
    unsigned limit = (unsigned)(cfg->n_slots + cfg->max_queue + 16);
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)(cfg->timeout_s > 0 ? cfg->timeout_s : 30),
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        srv_engine_free(s->eng);
        free(s);
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
    srv_engine_stop(s->eng, grace_s);
    MHD_stop_daemon(s->d); /* answers in flight are complete or cancelled by now */
    srv_engine_free(s->eng);
    free(s);
}
