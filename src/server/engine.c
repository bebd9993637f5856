/* Slots and the scheduler thread of `kvpred serve` (see engine.h). */
#include "server/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/platform.h"
#include "forward/context.h"
#include "policy/host.h"
#include "kvpred_lab.h"

struct slot {
    kvp_ctx *ctx;
    kvp_sampler *smp;
    float *logits;
    int32_t *toks;      /* the prompt tokens the cache holds, in order */
    int n_toks;
    char pol_key[512];  /* the policy the context runs ("" before the first job) */
    char pf_key[128];   /* and its prefill attention (prefill_key) */
    struct srv_job *job;
    int pos;            /* prompt tokens in the cache */
    int prev;           /* last token (for the piece of the next one) */
    int32_t *gen;       /* [n_ctx] the job's generated tokens, in order */
    int n_gen;
    int replay;         /* generated tokens evaluated again after a loss (< n_gen: replaying) */
    int recoveries;     /* losses of the tiered cache this job recovered from */
    double last_used;
    double pol_s0;      /* policy seconds at the job's start */
    double t_lookup, t_load, t_copy; /* trace: seconds of the job's prefix lookup, load, copy */
    int how;            /* trace: 0 slot, 1 prefix cache, 2 another slot */
    /* the prefill running now, under the engine's mu (read by /metrics and by a stream waiting
     * for its first token): the job (NULL: none), the prompt tokens in the cache when it began,
     * the prompt's tokens, when it began */
    const struct srv_job *pf_job;
    int pf_from, pf_total;
    double pf_t0;
};

struct srv_stats {
    uint64_t jobs, jobs_cancelled, jobs_failed;
    uint64_t prompt_tokens, prefill_tokens, generated_tokens;
    uint64_t prefix_hits, prefix_tokens_saved;
    uint64_t kv_lost, kv_recomputed; /* tiered cache losses recovered from; tokens recomputed */
    double prefill_s, decode_s, policy_s;
    uint64_t kv_hot, kv_cold; /* over all slots, refreshed after each step */
    int busy;
};

struct srv_engine {
    struct srv_engine_config cfg;
    struct kvp_model_info info;
    struct slot *slots;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu; /* queue, stopping, stats */
    pthread_cond_t cv;
    struct srv_job **queue; /* ring of max_queue */
    int q_head, q_len;
    bool stopping;     /* no new jobs */
    bool quit;         /* scheduler exits once the slots are idle */
    struct srv_stats st;
    double t_start;
    struct srv_prefix *prefix; /* owned; NULL without a prefix cache */
    struct srv_pstore *pstore; /* owned; NULL without --prefix-store */
    struct step_item *items;   /* [n_slots] the round's work (scheduler thread only) */
    int *item_rc;
    int *item_n0;              /* [n_slots] each item's sequence length before the step */
    struct kvp_err *item_err;
    kvp_engine *kv_engine;     /* owned: the slots are its sequences, stepped together */
    struct kvp_batch_item *batch; /* [n_slots] */
    int n_batch;               /* tokens a step takes */
    bool trace;                /* $KVP_SERVE_TRACE: one line per prompt with its phases */
    struct kvp_prefill_params pf_default; /* the server's prefill attention (cfg.cp.prefill) */
    char pf_default_key[128];
};

/* ---- jobs ------------------------------------------------------------------------------- */

void srv_job_set_prefill(struct srv_job *j, const struct srv_request *r)
{
    j->prefill_policy = r->prefill_policy;
    j->prefill_budget = r->has_prefill_budget ? r->prefill_budget : 0;
    j->prefill_budget_ratio = r->has_prefill_budget ? r->prefill_budget_ratio : 0;
}

struct srv_job *srv_job_new(const int32_t *ids, int n)
{
    struct srv_job *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    j->cap = 256;
    j->text = malloc(j->cap);
    if (!j->ids || !j->text) {
        free(j->ids);
        free(j->text);
        free(j);
        return NULL;
    }
    memcpy(j->ids, ids, (size_t)n * sizeof(int32_t));
    j->n_prompt = n;
    j->prefill_policy = -1;
    atomic_init(&j->refs, 1);
    atomic_init(&j->cancel, false);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->t_submit = kvp_time_now();
    return j;
}

void srv_job_unref(struct srv_job *j)
{
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->pol_name);
    free(j->ids);
    free(j->text);
    free(j);
}

void srv_job_cancel(struct srv_job *j)
{
    atomic_store(&j->cancel, true);
}

/* Wake whoever waits on the job's output (j->mu held). */
static void job_changed(struct srv_job *j)
{
    pthread_cond_broadcast(&j->cv);
    if (j->on_change)
        j->on_change(j->on_change_arg);
}

static void job_finish(struct srv_job *j, int finish, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (j->finish == SRV_RUNNING) {
        j->finish = finish;
        /* on a stop string, visible already ends before it; otherwise the held-back tail goes */
        if (!j->stop_hit)
            j->visible = j->len;
        if (msg)
            snprintf(j->err, sizeof(j->err), "%s", msg);
        j->t_done = kvp_time_now();
    }
    job_changed(j);
    pthread_mutex_unlock(&j->mu);
}

/* Bytes of s[0..n) that end on a whole UTF-8 character (an incomplete trailing sequence is held
 * back until its next token arrives). */
static size_t utf8_whole(const char *s, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0)
        return n;
    unsigned char c = (unsigned char)s[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back + 1 ? i - 1 : n;
}

/* Append a piece; returns true when a stop string now appears (visible then ends before it). */
static bool job_append(struct srv_job *j, const char *piece, size_t n)
{
    pthread_mutex_lock(&j->mu);
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap;
        while (j->len + n + 1 > cap)
            cap *= 2;
        char *t = realloc(j->text, cap);
        if (!t) {
            pthread_mutex_unlock(&j->mu);
            return true; /* out of memory ends the answer where it is */
        }
        j->text = t;
        j->cap = cap;
    }
    memcpy(j->text + j->len, piece, n);
    j->len += n;
    j->text[j->len] = 0;
    if (j->n_gen == 0)
        j->t_first = kvp_time_now();
    j->n_gen++;
    bool stopped = false;
    size_t hold = 0;
    for (int s = 0; s < j->n_stop; s++) {
        size_t sl = strlen(j->stop[s]);
        /* search only where the new piece could complete a match */
        size_t from = j->visible > sl ? j->visible - sl : 0;
        const char *hit = strstr(j->text + from, j->stop[s]);
        if (hit) {
            size_t at = (size_t)(hit - j->text);
            if (!stopped || at < j->visible)
                j->visible = at;
            stopped = true;
            continue;
        }
        /* hold back a tail that could still become this stop string */
        for (size_t k = sl - 1; k > 0; k--)
            if (k <= j->len && !memcmp(j->text + j->len - k, j->stop[s], k)) {
                hold = k > hold ? k : hold;
                break;
            }
    }
    j->stop_hit = stopped;
    if (!stopped) {
        size_t v = utf8_whole(j->text, j->len - hold);
        j->visible = v > j->visible ? v : j->visible;
    }
    job_changed(j);
    pthread_mutex_unlock(&j->mu);
    return stopped;
}

/* ---- slots ------------------------------------------------------------------------------ */

static void policy_key(const struct kvp_policy_params *p, char *key, size_t cap)
{
    if (!p || !p->name) {
        snprintf(key, cap, "full");
        return;
    }
    snprintf(key, cap, "%s|%d|%.9g|%d|%d|%s|%s|%s", p->name, p->budget, p->budget_ratio, p->sink,
             p->local, p->aux_path ? p->aux_path : "", p->head_profile ? p->head_profile : "",
             p->opts ? p->opts : "");
}

static double read_share(const struct kvp_policy_params *p, int n)
{
    if (!p || !p->name || !strcmp(p->name, "full") || n <= 0)
        return 1.0;
    if (p->budget > 0)
        return p->budget >= n ? 1.0 : (double)p->budget / n;
    if (p->budget_ratio > 0 && p->budget_ratio <= 1)
        return p->budget_ratio;
    return 1.0;
}

static const struct kvp_policy_params *job_policy(const struct srv_engine *e,
                                                  const struct srv_job *j)
{
    return j->has_policy ? &j->pol : e->cfg.pol;
}

static void refresh_kv(struct srv_engine *e, struct slot *s)
{
    struct srv_job *j = s->job;
    size_t resident = 0;
    kvp_ctx_kv_bytes(s->ctx, &resident, NULL);
    struct srv_kv_view v = {.n_cached = kvp_ctx_n_tokens(s->ctx), .bytes_hot = resident};
    struct kvp_store_stats ss;
    if (kvp_ctx_store_stats(s->ctx, &ss) == 0) {
        v.bytes_hot = ss.hot_bytes;
        v.bytes_cold = ss.cold_bytes;
    }
    v.read_share = read_share(job_policy(e, j), v.n_cached);
    pthread_mutex_lock(&j->mu);
    v.prefix_reused = j->kv.prefix_reused;
    j->kv = v;
    pthread_mutex_unlock(&j->mu);
}

/* ---- prefill progress ------------------------------------------------------------------- */

/* The slot's prefill starts (again, after a loss) from what its cache holds now. */
static void progress_begin(struct srv_engine *e, struct slot *s)
{
    pthread_mutex_lock(&e->mu);
    s->pf_job = s->job;
    s->pf_from = s->pos;
    s->pf_total = s->job->n_prompt;
    s->pf_t0 = kvp_time_now();
    pthread_mutex_unlock(&e->mu);
}

static void progress_end(struct srv_engine *e, struct slot *s)
{
    pthread_mutex_lock(&e->mu);
    s->pf_job = NULL;
    pthread_mutex_unlock(&e->mu);
}

/* The slot's prefill progress (e->mu held): false when it runs none. The tokens done come from
 * the library's counter, which moves layer by layer inside a piece: a piece of a long prompt
 * takes seconds, and the report should move more often than that. */
static bool slot_progress(const struct slot *s, struct srv_prefill_progress *p)
{
    *p = (struct srv_prefill_progress){.seconds_left = -1};
    if (!s->pf_job)
        return false;
    double done = kvp_ctx_progress_tokens(s->ctx);
    done = done < s->pf_from ? s->pf_from : done > s->pf_total ? s->pf_total : done;
    double dt = kvp_time_now() - s->pf_t0;
    p->done = (int)done;
    p->total = s->pf_total;
    p->reused = s->pf_from;
    p->tokens_per_s = dt > 0 ? (done - s->pf_from) / dt : 0;
    if (p->tokens_per_s > 0)
        p->seconds_left = (s->pf_total - done) / p->tokens_per_s;
    return true;
}

bool srv_engine_job_progress(struct srv_engine *e, const struct srv_job *j,
                             struct srv_prefill_progress *p)
{
    bool found = false;
    *p = (struct srv_prefill_progress){.seconds_left = -1};
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->cfg.n_slots && !found; i++)
        if (e->slots[i].pf_job == j)
            found = slot_progress(&e->slots[i], p);
    pthread_mutex_unlock(&e->mu);
    return found;
}

/* The job's prefill attention: the server's, with the request's policy and budget over it. */
static struct kvp_prefill_params job_prefill(const struct srv_engine *e, const struct srv_job *j)
{
    struct kvp_prefill_params p = e->pf_default;
    if (j->prefill_policy >= 0 && j->prefill_policy != p.policy) {
        /* another policy: none of the server's tuning carries over */
        p = (struct kvp_prefill_params){.policy = j->prefill_policy,
                                        .gate = e->pf_default.gate}; /* learned's, if loaded */
    }
    if (j->prefill_budget > 0 || j->prefill_budget_ratio > 0) {
        p.budget = j->prefill_budget;
        p.budget_ratio = j->prefill_budget_ratio;
    }
    if (p.policy == KVP_PREFILL_DENSE) /* a budget means nothing to dense attention */
        p = (struct kvp_prefill_params){0};
    return p;
}

static void prefill_key(const struct kvp_prefill_params *p, char *key, size_t cap)
{
    snprintf(key, cap, "%d|%d|%.9g|%.9g|%d|%d|%d|%d|%d", p->policy, p->budget, p->budget_ratio,
             p->threshold, p->block, p->sink, p->window, p->dense_tail, p->min_keys);
}

/* Whether the slot's policy gives the same cache and answer when a prompt is prefilled in
 * pieces (a cached prefix, then chunks) as in one call: not when it evicts, or when it reads the
 * prompt's attention rows or column sums at prefill time (those cover only the piece). quest
 * rebuilds its block metadata from the whole cache after every piece, so it qualifies. */
static bool piecewise_ok(const kvp_ctx *ctx)
{
    const struct kvp_policy *p = kvp_ctx_policy_host_const(ctx)->p;
    return !p || (!p->ops->evicting && !p->ops->wants_obs && !p->ops->wants_colsum);
}

/* Put job j into slot s: set its policy (clearing the cache) or reuse the cached prefix. */
static int slot_begin(struct srv_engine *e, struct slot *s, struct srv_job *j)
{
    struct kvp_err err = {0};
    const struct kvp_policy_params *pp = job_policy(e, j);
    char key[sizeof(s->pol_key)], pf_key[sizeof(s->pf_key)];
    policy_key(pp, key, sizeof(key));
    const struct kvp_prefill_params pf = job_prefill(e, j);
    prefill_key(&pf, pf_key, sizeof(pf_key));
    /* a prompt prefilled with other prefill attention left other keys and values: start over */
    if (strcmp(pf_key, s->pf_key) != 0) {
        s->pol_key[0] = 0;
        if (kvp_ctx_set_prefill(s->ctx, &pf, &err) < 0) {
            job_finish(j, SRV_FINISH_ERROR, err.msg);
            return -1;
        }
        snprintf(s->pf_key, sizeof(s->pf_key), "%s", pf_key);
    }
    int reuse = 0;
    if (strcmp(key, s->pol_key) != 0) {
        s->pol_key[0] = 0;
        s->n_toks = 0;
        if (kvp_ctx_set_policy(s->ctx, pp && pp->name ? pp : NULL, &err) < 0) {
            job_finish(j, SRV_FINISH_ERROR, err.msg);
            return -1;
        }
        snprintf(s->pol_key, sizeof(s->pol_key), "%s", key);
    } else if (piecewise_ok(s->ctx)) {
        /* at least two prompt tokens stay to prefill: one token alone would be a decode step,
         * which reads only the policy's selection instead of the whole prompt */
        int lim = s->n_toks < j->n_prompt - 2 ? s->n_toks : j->n_prompt - 2;
        while (reuse < lim && s->toks[reuse] == j->ids[reuse])
            reuse++;
    }
    /* a longer prefix in the prefix cache is copied in instead */
    struct srv_prefix *pc = e->prefix;
    int from_cache = 0;
    double t0 = kvp_time_now();
    s->t_lookup = s->t_load = s->t_copy = 0;
    s->how = 0;
    /* the prefix cache and the shared store hold prompts prefilled with the server's prefill
     * attention only */
    if ((pc || e->pstore) && srv_prefix_ctx_ok(s->ctx) && !strcmp(pf_key, e->pf_default_key)) {
        int m = srv_prefix_match(pc, j->ids, j->n_prompt, j->n_prompt - 2, reuse);
        double t1 = kvp_time_now();
        s->t_lookup = t1 - t0;
        /* the store shared with other servers, when it holds more (read since the request came) */
        int ms = srv_pstore_load(e->pstore, s->ctx, j->ids, j->n_prompt, m > reuse ? m : reuse);
        int lrc = m > 0 && ms == 0 ? srv_prefix_load(pc, s->ctx, j->ids, m) : -1;
        if (ms != 0) {
            m = ms > 0 ? ms : 1; /* -1: the context was emptied, as by a refused load */
            lrc = ms > 0 ? 0 : -1;
        }
        s->t_load = kvp_time_now() - t1;
        s->how = m > 0 && lrc == 0 ? 1 : 0;
        if (m > 0 && lrc == 0) {
            reuse = from_cache = m;
            memcpy(s->toks, j->ids, (size_t)m * sizeof(int32_t));
        } else if (m > 0) {
            reuse = 0; /* refused: the context was emptied, prefill from nothing */
        }
    } else {
        srv_pstore_forget(e->pstore, j->ids, j->n_prompt); /* read for nothing */
    }
    /* no prefix cache for this context (a tiered one: its blocks live in the store, which only
     * a sequence copy reads and writes) or nothing longer in it: another slot holding a longer
     * prefix of the prompt, idle or busy, lends its KV (kvp_seq_copy, through the stores of both:
     * the prompt tokens a slot holds are never rewritten while it runs) */
    if (!from_cache && piecewise_ok(s->ctx)) {
        struct slot *src = NULL;
        int best = reuse;
        for (int i = 0; i < e->cfg.n_slots; i++) {
            struct slot *o = &e->slots[i];
            if (o == s || !o->pol_key[0] || !piecewise_ok(o->ctx) || strcmp(o->pf_key, pf_key))
                continue;
            int lim = o->n_toks < j->n_prompt - 2 ? o->n_toks : j->n_prompt - 2, n = 0;
            while (n < lim && o->toks[n] == j->ids[n])
                n++;
            if (n > best) {
                best = n;
                src = o;
            }
        }
        /* a copy moves whole blocks through both stores: worth it from one block on */
        if (src && best - reuse >= 16) {
            struct kvp_err cerr = {0};
            double t1 = kvp_time_now();
            int crc = kvp_seq_copy(s->ctx, src->ctx, best, &cerr);
            s->t_copy = kvp_time_now() - t1;
            s->how = 2;
            if (crc == 0) {
                reuse = from_cache = best;
                memcpy(s->toks, j->ids, (size_t)best * sizeof(int32_t));
            } else {
                reuse = 0; /* the copy reset this context: prefill from nothing */
            }
        }
    }
    if (!from_cache) {
        kvp_ctx_truncate(s->ctx, reuse);
        if (kvp_ctx_n_tokens(s->ctx) < reuse)
            reuse = 0; /* a sliding-window model's rings no longer held the cut: start over */
        if (reuse == 0)
            kvp_ctx_reset(s->ctx);
    }
    s->n_toks = reuse;
    s->pos = reuse;
    s->n_gen = s->replay = s->recoveries = 0;
    kvp_sampler_free(s->smp);
    s->smp = NULL;
    if (kvp_sampler_init(&j->sp, e->info.n_vocab, &s->smp, &err) < 0) {
        job_finish(j, SRV_FINISH_ERROR, err.msg);
        return -1;
    }
    for (int i = 0; i < j->n_prompt; i++)
        kvp_sampler_accept(s->smp, j->ids[i]);
    s->prev = j->ids[j->n_prompt - 1];
    s->pol_s0 = kvp_ctx_policy_seconds(s->ctx);
    pthread_mutex_lock(&j->mu);
    j->kv.prefix_reused = reuse;
    j->t_start = kvp_time_now();
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&e->mu);
    e->st.prompt_tokens += (uint64_t)j->n_prompt;
    if (reuse > 0) {
        e->st.prefix_hits++;
        e->st.prefix_tokens_saved += (uint64_t)reuse;
    }
    pthread_mutex_unlock(&e->mu);
    progress_begin(e, s);
    return 0;
}

static void slot_end(struct srv_engine *e, struct slot *s, int finish, const char *msg)
{
    struct srv_job *j = s->job;
    double pol = kvp_ctx_policy_seconds(s->ctx) - s->pol_s0;
    /* counted before the client is told: one that has its answer sees the slot free in
     * /metrics (an event-driven server answers it before this thread would get here) */
    pthread_mutex_lock(&e->mu);
    s->pf_job = NULL;
    e->st.jobs++;
    e->st.jobs_cancelled += finish == SRV_FINISH_CANCELLED;
    e->st.jobs_failed += finish == SRV_FINISH_ERROR;
    e->st.policy_s += pol > 0 ? pol : 0;
    e->st.busy--;
    pthread_mutex_unlock(&e->mu);
    job_finish(j, finish, msg);
    srv_job_unref(j);
    s->job = NULL;
    s->last_used = kvp_time_now();
    if (finish == SRV_FINISH_ERROR) {
        /* the cache may be anything after a refusal: start the next job from nothing */
        s->pol_key[0] = 0;
        s->n_toks = 0;
    }
}

/* What one busy slot runs in a round: a piece of its prompt, or the token it just sampled. */
struct step_item {
    struct slot *s;
    const int32_t *tokens;
    int n;
    bool prefill;
    bool last;        /* the prompt's last piece */
    int32_t tok;      /* decode: the sampled token */
    bool replayed;    /* decode of a token generated before a loss (recover) */
    float *logits;    /* NULL: not needed (a prompt piece before the last) */
};

/* Plan a busy slot's part of the round, a prompt piece of at most `room` tokens: false when it
 * has none (it ended: cancelled, finished, refused; or no room). A decode step samples here, in `kvpred run`'s order: sample, stop on
 * end-of-generation, emit, accept; the token is then evaluated with the other slots' items. */
static bool slot_plan(struct srv_engine *e, struct slot *s, int room, struct step_item *it)
{
    struct srv_job *j = s->job;
    if (atomic_load(&j->cancel)) {
        slot_end(e, s, SRV_FINISH_CANCELLED, "cancelled");
        return false;
    }
    *it = (struct step_item){.s = s};
    if (s->pos < j->n_prompt) {
        /* a piece of the prompt within what the step has room for; never a last piece of one
         * token alone after others (it would run as a decode step, reading only the policy's
         * selection where prefill reads the whole prompt) */
        int n = j->n_prompt - s->pos;
        if (n > room)
            n = n - room >= 2 ? room : room - 1;
        if (n < 1 || (n == 1 && s->pos + 1 < j->n_prompt))
            return false; /* no room this round: it waits for the next */
        it->prefill = true;
        it->tokens = j->ids + s->pos;
        it->n = n;
        it->last = s->pos + n == j->n_prompt;
        it->logits = it->last ? s->logits : NULL;
        return true;
    }
    if (s->replay < s->n_gen) {
        /* after a loss: the tokens already generated (and sent) are evaluated again, each as
         * the decode step it was, so the cache and the logits are those of a run without the
         * loss; nothing is sampled or sent until the last is back */
        it->tok = s->gen[s->replay];
        it->tokens = &it->tok;
        it->n = 1;
        it->logits = s->logits;
        it->replayed = true;
        return true;
    }
    int tok = kvp_sampler_sample(s->smp, s->logits);
    if (kvp_token_is_eog(e->cfg.model, tok)) {
        slot_end(e, s, SRV_FINISH_STOP, NULL);
        return false;
    }
    char piece[256];
    size_t pn = kvp_token_to_piece(e->cfg.model, s->prev, tok, piece, sizeof(piece));
    bool stopped = job_append(j, piece, pn);
    kvp_sampler_accept(s->smp, tok);
    s->prev = tok;
    pthread_mutex_lock(&e->mu);
    e->st.generated_tokens++;
    pthread_mutex_unlock(&e->mu);
    if (stopped) {
        slot_end(e, s, SRV_FINISH_STOP, NULL);
        return false;
    }
    if (j->n_gen >= j->max_tokens || kvp_ctx_n_tokens(s->ctx) + 1 > kvp_ctx_n_ctx(s->ctx)) {
        slot_end(e, s, SRV_FINISH_LENGTH, NULL);
        return false;
    }
    s->gen[s->n_gen++] = tok;
    s->replay = s->n_gen;
    it->tok = tok;
    it->tokens = &it->tok;
    it->n = 1;
    it->logits = s->logits;
    return true;
}

/* Evaluate the round's items in one batched step of the engine (kvp_batch_eval: every weight
 * matrix read once for all slots; exact, so each slot's logits are bit for bit those of a step
 * of its own). If the step is refused (nothing ran), each item runs alone so only the item at
 * fault fails. rc[i] and errs[i] receive each item's outcome; the step's time is shared
 * between the prefill and decode counters by tokens. */
static void run_items(struct srv_engine *e, struct step_item *items, int n, int *rc,
                      struct kvp_err *errs)
{
    if (n == 0)
        return;
    int n_prefill = 0, n_decode = 0;
    for (int i = 0; i < n; i++) {
        const struct step_item *it = &items[i];
        const struct srv_job *j = it->s->job;
        e->batch[i] = (struct kvp_batch_item){
            .seq = it->s->ctx, .tokens = it->tokens, .n = it->n, .logits = it->logits,
            .prompt_rest = it->prefill ? j->n_prompt - it->s->pos - it->n : 0};
        if (it->prefill)
            n_prefill += it->n;
        else
            n_decode++;
        rc[i] = 0;
        errs[i].msg[0] = 0;
    }
    double t0 = kvp_time_now();
    struct kvp_err err = {0};
    for (int i = 0; i < n; i++)
        e->item_n0[i] = kvp_ctx_n_tokens(e->batch[i].seq);
    int brc = kvp_batch_eval(e->kv_engine, e->batch, n, &err);
    bool ran = brc < 0 && kvp_ctx_n_tokens(e->batch[0].seq) == e->item_n0[0] + e->batch[0].n;
    if (brc < 0 && ran && err.code == KVP_EKVLOST) {
        /* the step ran (every sequence moved on); the tiered ones that lost KV no longer trust
         * all of it, the others are done and must not run again */
        for (int i = 0; i < n; i++) {
            kvp_seq *q = e->batch[i].seq;
            rc[i] = kvp_ctx_trusted_tokens(q) < kvp_ctx_n_tokens(q) ? KVP_EKVLOST : 0;
            errs[i] = err;
        }
    } else if (brc < 0) {
        /* refused before anything ran: each item alone, so only the one at fault fails */
        for (int i = 0; i < n; i++)
            rc[i] = kvp_batch_eval(e->kv_engine, &e->batch[i], 1, &errs[i]);
    }
    double dt = kvp_time_now() - t0;
    double share = n_prefill + n_decode > 0 ? (double)n_prefill / (n_prefill + n_decode) : 0;
    pthread_mutex_lock(&e->mu);
    e->st.prefill_tokens += (uint64_t)n_prefill;
    e->st.prefill_s += dt * share;
    e->st.decode_s += dt * (1 - share);
    pthread_mutex_unlock(&e->mu);
}

/* Losses of the tiered cache one job may recover from before it fails (each recomputes what
 * follows the loss; a device that keeps failing should not keep a slot busy forever). */
#define SRV_MAX_RECOVERIES 8

/* The tiered cache lost KV (a cold unit failed its checksum, a read or write failed for good):
 * the context is cut back to what it still trusts, and what followed is computed again, the
 * rest of the prompt as prefill and then the generated tokens as decode steps, so the answer
 * goes on as if nothing was lost (never from wrong KV, and without failing the request). */
static void recover(struct srv_engine *e, struct slot *s)
{
    struct srv_job *j = s->job;
    int n = kvp_ctx_n_tokens(s->ctx), t = kvp_ctx_trusted_tokens(s->ctx);
    s->recoveries++;
    if (t < j->n_prompt) {
        /* at least two prompt tokens to prefill again, as slot_begin keeps */
        int keep = t < j->n_prompt - 2 ? t : j->n_prompt - 2;
        keep = keep > 0 ? keep : 0;
        if (keep == 0)
            kvp_ctx_reset(s->ctx);
        else
            kvp_ctx_truncate(s->ctx, keep);
        s->pos = s->n_toks = keep; /* never above pos: a loss is untrusted from its call on */
        s->replay = 0;
        t = keep;
        progress_begin(e, s); /* the rest of the prompt is a prefill again */
    } else {
        /* the prompt is whole: the generated tokens from the loss on are evaluated again (the
         * token of the failed step included: its evaluation did not count) */
        kvp_ctx_truncate(s->ctx, t);
        s->replay = t - j->n_prompt;
    }
    fprintf(stderr, "kvpred serve: the KV cache lost data at token %d of %d; recomputing from "
            "there\n", t, n);
    pthread_mutex_lock(&e->mu);
    e->st.kv_lost++;
    e->st.kv_recomputed += (uint64_t)(n > t ? n - t : 0);
    pthread_mutex_unlock(&e->mu);
}

/* After the round: move each slot past what ran, or end it on an error. */
static void slot_after(struct srv_engine *e, const struct step_item *it, int rc,
                       const struct kvp_err *err)
{
    struct slot *s = it->s;
    struct srv_job *j = s->job;
    if (rc < 0 && err->code == KVP_EKVLOST && s->recoveries < SRV_MAX_RECOVERIES) {
        recover(e, s);
        return;
    }
    if (rc < 0) {
        slot_end(e, s, SRV_FINISH_ERROR, err->msg);
        return;
    }
    if (it->replayed) {
        s->replay++; /* a generated token evaluated again: on to the next, or to sampling */
        refresh_kv(e, s);
        return;
    }
    if (it->prefill) {
        memcpy(s->toks + s->pos, it->tokens, (size_t)it->n * sizeof(int32_t));
        s->pos += it->n;
        s->n_toks = s->pos;
        if (it->last)
            progress_end(e, s);
        if (it->last && e->prefix && !strcmp(s->pf_key, e->pf_default_key))
            srv_prefix_put(e->prefix, s->ctx, j->ids, j->n_prompt);
        if (it->last && !strcmp(s->pf_key, e->pf_default_key))
            srv_pstore_put(e->pstore, s->ctx, j->ids, j->n_prompt);
        if (it->last && e->trace)
            fprintf(stderr,
                    "kvpred serve: trace: prompt %d reused %d (%s) queue %.3f lookup %.3f "
                    "load %.3f copy %.3f prefill %.3f s\n",
                    j->n_prompt, j->kv.prefix_reused,
                    s->how == 1 ? "prefix cache" : s->how == 2 ? "other slot" : "slot",
                    j->t_start - j->t_submit - s->t_lookup - s->t_load - s->t_copy, s->t_lookup, s->t_load, s->t_copy,
                    kvp_time_now() - j->t_start);
    }
    refresh_kv(e, s);
    if (it->prefill && it->last && j->max_tokens == 0)
        slot_end(e, s, SRV_FINISH_LENGTH, NULL);
}

/* The free slot for job j. A slot whose prompt the job reuses at least half of (a follow-up
 * to the document it holds, or an empty slot) is the best place, the longest reuse first; a
 * slot whose document the job would mostly overwrite for a short shared start (documents that
 * begin alike) is not, or a follow-up to that document would find it gone: failing a slot of
 * the first kind, the least recently used one. Ties: the least recently used. */
static struct slot *pick_slot(struct srv_engine *e, const struct srv_job *j)
{
    struct slot *best = NULL, *lru = NULL;
    int best_n = -1;
    for (int i = 0; i < e->cfg.n_slots; i++) {
        struct slot *s = &e->slots[i];
        if (s->job)
            continue;
        if (!lru || s->last_used < lru->last_used)
            lru = s;
        int n = 0;
        while (n < s->n_toks && n < j->n_prompt && s->toks[n] == j->ids[n])
            n++;
        if (2 * n < s->n_toks)
            continue;
        if (n > best_n || (n == best_n && s->last_used < best->last_used)) {
            best = s;
            best_n = n;
        }
    }
    return best ? best : lru;
}

/* Whether job j's read from the shared store is still running: the job waits in the queue,
 * since starting it would leave the scheduler, and so every slot, waiting for the store. */
static bool store_pending(struct srv_engine *e, const struct srv_job *j)
{
    return e->pstore && srv_pstore_pending(e->pstore, j->ids, j->n_prompt);
}

/* A queued job that can start now (e->mu held). */
static bool startable(struct srv_engine *e)
{
    for (int k = 0; k < e->q_len; k++)
        if (!store_pending(e, e->queue[(e->q_head + k) % e->cfg.max_queue]))
            return true;
    return false;
}

/* The shared store finished a read: a job held back for it may start. */
static void store_ready(void *arg)
{
    struct srv_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void *scheduler(void *arg)
{
    struct srv_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int busy = 0;
        for (int i = 0; i < e->cfg.n_slots; i++)
            busy += e->slots[i].job != NULL;
        /* idle until a job can start: one whose read from the shared store runs waits in the
         * queue (store_ready wakes this thread when it is done) */
        while (busy == 0 && !e->quit && !startable(e))
            pthread_cond_wait(&e->cv, &e->mu);
        if (busy == 0 && e->q_len == 0 && e->quit) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        /* hand queued jobs to free slots, first come first served among those that can start;
         * the others keep their order in the queue */
        struct srv_job *start[64];
        struct slot *where[64];
        int n_start = 0, kept = 0, n_queued = e->q_len;
        for (int k = 0; k < n_queued; k++) {
            struct srv_job *j = e->queue[(e->q_head + k) % e->cfg.max_queue];
            if (busy < e->cfg.n_slots && n_start < 64 && !store_pending(e, j)) {
                struct slot *s = pick_slot(e, j);
                s->job = j;
                start[n_start] = j;
                where[n_start++] = s;
                busy++;
                e->st.busy++;
            } else {
                e->queue[(e->q_head + kept++) % e->cfg.max_queue] = j;
            }
        }
        e->q_len = kept;
        if (busy == 0 && n_start == 0) {
            /* every queued job waits for the store (or the engine quits with nothing left) */
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        for (int k = 0; k < n_start; k++)
            if (slot_begin(e, where[k], start[k]) < 0)
                slot_end(e, where[k], SRV_FINISH_ERROR, NULL);
        /* one round: every decoding slot's token, then prompt pieces in the room the step has
         * left (n_batch tokens in all), evaluated together */
        int n_items = 0, room = e->n_batch;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < e->cfg.n_slots; i++) {
                struct slot *sl = &e->slots[i];
                bool prefilling = sl->job && sl->pos < sl->job->n_prompt;
                if (!sl->job || prefilling != (pass == 1))
                    continue;
                if (slot_plan(e, sl, room, &e->items[n_items]))
                    room -= e->items[n_items++].n;
            }
        run_items(e, e->items, n_items, e->item_rc, e->item_err);
        for (int k = 0; k < n_items; k++)
            slot_after(e, &e->items[k], e->item_rc[k], &e->item_err[k]);
        /* KV bytes over every slot, busy or keeping a prefix */
        uint64_t hot = 0, cold = 0;
        for (int i = 0; i < e->cfg.n_slots; i++) {
            size_t resident = 0;
            struct kvp_store_stats ss;
            if (kvp_ctx_store_stats(e->slots[i].ctx, &ss) == 0) {
                hot += ss.hot_bytes;
                cold += ss.cold_bytes;
            } else {
                kvp_ctx_kv_bytes(e->slots[i].ctx, &resident, NULL);
                hot += resident;
            }
        }
        pthread_mutex_lock(&e->mu);
        e->st.kv_hot = hot;
        e->st.kv_cold = cold;
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* ---- the engine ------------------------------------------------------------------------- */

int srv_engine_start(const struct srv_engine_config *cfg, struct srv_engine **out,
                     struct kvp_err *err)
{
    *out = NULL;
    if (cfg->n_slots < 1 || cfg->n_slots > 256 || cfg->max_queue < 1)
        return kvp_err_set(err, KVP_EINVAL, "serve: 1..256 slots and a queue of at least 1");
    struct srv_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    e->cfg = *cfg;
    if (cfg->cp.prefill)
        e->pf_default = *cfg->cp.prefill;
    e->cfg.cp.prefill = &e->pf_default;
    prefill_key(&e->pf_default, e->pf_default_key, sizeof(e->pf_default_key));
    kvp_model_get_info(cfg->model, &e->info);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->t_start = kvp_time_now();
    const char *tr = getenv("KVP_SERVE_TRACE");
    e->trace = tr && *tr && strcmp(tr, "0") != 0;
    e->slots = calloc((size_t)cfg->n_slots, sizeof(*e->slots));
    e->queue = calloc((size_t)cfg->max_queue, sizeof(*e->queue));
    e->items = calloc((size_t)cfg->n_slots, sizeof(*e->items));
    e->item_rc = calloc((size_t)cfg->n_slots, sizeof(*e->item_rc));
    e->item_err = calloc((size_t)cfg->n_slots, sizeof(*e->item_err));
    e->item_n0 = calloc((size_t)cfg->n_slots, sizeof(*e->item_n0));
    if (!e->slots || !e->queue || !e->items || !e->item_rc || !e->item_err || !e->item_n0) {
        srv_engine_free(e);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    e->batch = calloc((size_t)cfg->n_slots, sizeof(*e->batch));
    struct kvp_engine_params ep = {.n_threads = cfg->cp.n_threads, .n_batch = cfg->cp.n_batch,
                                   .n_ctx = cfg->cp.n_ctx, .exact = true,
                                   .no_pack = cfg->cp.no_pack};
    int erc = e->batch ? kvp_engine_init(cfg->model, &ep, &e->kv_engine, err)
                       : kvp_err_set(err, KVP_ENOMEM, "out of memory");
    if (erc < 0) {
        srv_engine_free(e);
        return erc;
    }
    /* the weights packed for decode now, so that no request's first token waits for it */
    kvp_engine_pack_weights(e->kv_engine);
    e->n_batch = cfg->cp.n_batch > 0 ? cfg->cp.n_batch : 512;
    for (int i = 0; i < cfg->n_slots; i++) {
        struct slot *s = &e->slots[i];
        int rc = kvp_seq_init(e->kv_engine, &cfg->cp, &s->ctx, err);
        if (rc < 0) {
            srv_engine_free(e);
            return rc;
        }
        int n_ctx = kvp_ctx_n_ctx(s->ctx);
        s->logits = malloc((size_t)e->info.n_vocab * sizeof(float));
        s->toks = malloc((size_t)n_ctx * sizeof(int32_t));
        s->gen = malloc((size_t)n_ctx * sizeof(int32_t));
        if (!s->logits || !s->toks || !s->gen) {
            srv_engine_free(e);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        }
        /* the server's policy is set once here so a refused one fails at start */
        if (cfg->pol && cfg->pol->name) {
            if ((rc = kvp_ctx_set_policy(s->ctx, cfg->pol, err)) < 0) {
                srv_engine_free(e);
                return rc;
            }
        }
        policy_key(cfg->pol, s->pol_key, sizeof(s->pol_key));
        prefill_key(&e->pf_default, s->pf_key, sizeof(s->pf_key));
    }
    /* a cache filled by a sparse prefill is not a dense one's: other files and store keys */
    const char *pf_variant = e->pf_default.policy == KVP_PREFILL_DENSE ? NULL : e->pf_default_key;
    if (cfg->cache_ram > 0) {
        struct srv_prefix_config pc = {.model_path = cfg->model_path, .model = cfg->model,
                                       .like = e->slots[0].ctx, .ram_bytes = cfg->cache_ram,
                                       .dir = cfg->cache_dir, .min_tokens = 32,
                                       .variant = pf_variant};
        int rc = srv_prefix_open(&pc, &e->prefix, err);
        if (rc < 0) {
            srv_engine_free(e);
            return rc;
        }
    }
    if (cfg->prefix_store) {
        struct srv_pstore_config sc = {
            .url = cfg->prefix_store, .like = e->slots[0].ctx, .min_tokens = 32,
            .fingerprint = srv_prefix_fingerprint(cfg->model_path, cfg->model, pf_variant),
            .on_ready = store_ready, .on_ready_arg = e};
        int rc = srv_pstore_open(&sc, &e->pstore, err);
        if (rc < 0) {
            srv_engine_free(e);
            return rc;
        }
    }
    if (pthread_create(&e->thread, NULL, scheduler, e) != 0) {
        srv_engine_free(e);
        return kvp_err_set(err, KVP_ENOMEM, "serve: cannot start the scheduler thread");
    }
    e->started = true;
    *out = e;
    return 0;
}

int srv_engine_submit(struct srv_engine *e, struct srv_job *j)
{
    /* The shared store's read starts before the job is queued, so the scheduler sees it running
     * (srv_pstore_pending) and never starts the job while the store still answers; only jobs
     * prefilled with the server's own prefill attention can use what it reads. */
    struct kvp_prefill_params pf = job_prefill(e, j);
    char pf_key[sizeof(e->pf_default_key)];
    prefill_key(&pf, pf_key, sizeof(pf_key));
    bool from_store = e->pstore && !strcmp(pf_key, e->pf_default_key);
    if (from_store) /* for more than this server holds */
        srv_pstore_prefetch(e->pstore, j->ids, j->n_prompt,
                            srv_prefix_match(e->prefix, j->ids, j->n_prompt, j->n_prompt - 2, 0));
    pthread_mutex_lock(&e->mu);
    if (e->stopping || e->q_len == e->cfg.max_queue) {
        int rc = e->stopping ? SRV_SUBMIT_STOPPING : SRV_SUBMIT_FULL;
        pthread_mutex_unlock(&e->mu);
        if (from_store)
            srv_pstore_forget(e->pstore, j->ids, j->n_prompt);
        return rc;
    }
    atomic_fetch_add(&j->refs, 1);
    e->queue[(e->q_head + e->q_len) % e->cfg.max_queue] = j;
    e->q_len++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    /* a document kept only in the folder (after a restart) is read back while the request
     * waits for its slot, not by the scheduler when it starts */
    srv_prefix_prefetch(e->prefix, j->ids, j->n_prompt);
    return 0;
}

void srv_engine_stop(struct srv_engine *e, double grace_s)
{
    if (!e || !e->started)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    /* queued jobs never started: cancel them now */
    while (e->q_len > 0) {
        struct srv_job *j = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->cfg.max_queue;
        e->q_len--;
        job_finish(j, SRV_FINISH_CANCELLED, "the server is stopping");
        srv_job_unref(j);
    }
    e->quit = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    double t_end = kvp_time_now() + grace_s;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        int busy = e->st.busy;
        pthread_mutex_unlock(&e->mu);
        if (busy == 0)
            break;
        if (kvp_time_now() > t_end) {
            for (int i = 0; i < e->cfg.n_slots; i++) {
                struct srv_job *j = e->slots[i].job; /* read racily; cancel is atomic */
                if (j)
                    srv_job_cancel(j);
            }
        }
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    pthread_join(e->thread, NULL);
    e->started = false;
}

void srv_engine_free(struct srv_engine *e)
{
    if (!e)
        return;
    srv_engine_stop(e, 0);
    for (int i = 0; e->slots && i < e->cfg.n_slots; i++) {
        kvp_sampler_free(e->slots[i].smp);
        kvp_ctx_free(e->slots[i].ctx);
        free(e->slots[i].logits);
        free(e->slots[i].toks);
        free(e->slots[i].gen);
    }
    srv_prefix_close(e->prefix); /* writes out what is queued for the folder */
    srv_pstore_close(e->pstore);  /* and for the shared store */
    free(e->slots);
    free(e->queue);
    free(e->items);
    free(e->item_rc);
    free(e->item_err);
    free(e->item_n0);
    free(e->batch);
    kvp_engine_free(e->kv_engine); /* after its sequences */
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

int srv_engine_n_slots(const struct srv_engine *e)
{
    return e->cfg.n_slots;
}

/* Each slot's prefill as it runs: one family per gauge, a line per slot, zeros when the slot
 * prefills nothing (so every series is always there). snprintf-style. */
static size_t slot_metrics(struct srv_engine *e, char *buf, size_t cap)
{
    static const struct {
        const char *name, *help;
    } fam[] = {
        {"prefilling", "Whether the slot is prefilling a prompt now."},
        {"prefill_tokens_done", "Prompt tokens of the slot's prefill in its cache (reused ones "
                                "included; a piece in flight counted by the layers it has done)."},
        {"prefill_tokens_total", "Tokens of the prompt the slot is prefilling."},
        {"prefill_tokens_per_second", "Tokens prefilled per second since the prefill began."},
        {"prefill_seconds_left", "The prefill's time left at that rate (-1: not known yet)."},
    };
    struct srv_prefill_progress p[256]; /* srv_engine_start allows 256 slots */
    bool on[256];
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->cfg.n_slots; i++)
        on[i] = slot_progress(&e->slots[i], &p[i]);
    pthread_mutex_unlock(&e->mu);
    size_t n = 0;
#define ROOM n < cap ? buf + n : NULL, n < cap ? cap - n : 0
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        n += (size_t)snprintf(ROOM, "# HELP kvpred_slot_%s %s\n# TYPE kvpred_slot_%s gauge\n",
                              fam[f].name, fam[f].help, fam[f].name);
        for (int i = 0; i < e->cfg.n_slots; i++) {
            double v = f == 0 ? on[i] : f == 1 ? p[i].done : f == 2 ? p[i].total
                     : f == 3 ? p[i].tokens_per_s : on[i] ? p[i].seconds_left : 0;
            n += (size_t)snprintf(ROOM, "kvpred_slot_%s{slot=\"%d\"} %.*f\n", fam[f].name, i,
                                  f >= 3 ? 3 : 0, v);
        }
    }
#undef ROOM
    return n;
}

size_t srv_engine_metrics(struct srv_engine *e, char *buf, size_t cap)
{
    pthread_mutex_lock(&e->mu);
    struct srv_stats s = e->st;
    int queued = e->q_len;
    pthread_mutex_unlock(&e->mu);
    struct srv_prefix_stats ps;
    srv_prefix_stats(e->prefix, &ps);
    const char *tier = e->cfg.cp.kv_tier == KVP_TIER_RAM    ? "ram"
                       : e->cfg.cp.kv_tier == KVP_TIER_DISK  ? "disk"
                       : e->cfg.cp.kv_tier == KVP_TIER_REDIS ? "redis"
                                                             : "none";
    int n = snprintf(
        buf, cap,
        "# HELP kvpred_requests_finished_total Generation requests finished (any outcome).\n"
        "# TYPE kvpred_requests_finished_total counter\n"
        "kvpred_requests_finished_total %llu\n"
        "kvpred_requests_cancelled_total %llu\n"
        "kvpred_requests_failed_total %llu\n"
        "# HELP kvpred_prompt_tokens_total Prompt tokens of started requests.\n"
        "# TYPE kvpred_prompt_tokens_total counter\n"
        "kvpred_prompt_tokens_total %llu\n"
        "# HELP kvpred_prefill_tokens_total Prompt tokens actually run through the model.\n"
        "# TYPE kvpred_prefill_tokens_total counter\n"
        "kvpred_prefill_tokens_total %llu\n"
        "# TYPE kvpred_generated_tokens_total counter\n"
        "kvpred_generated_tokens_total %llu\n"
        "# TYPE kvpred_prefill_seconds_total counter\n"
        "kvpred_prefill_seconds_total %.6f\n"
        "# TYPE kvpred_decode_seconds_total counter\n"
        "kvpred_decode_seconds_total %.6f\n"
        "# HELP kvpred_decode_tokens_per_second Generated tokens per second of decode time.\n"
        "# TYPE kvpred_decode_tokens_per_second gauge\n"
        "kvpred_decode_tokens_per_second %.3f\n"
        "# HELP kvpred_prefill_tokens_per_second Prefilled tokens per second of prefill time.\n"
        "# TYPE kvpred_prefill_tokens_per_second gauge\n"
        "kvpred_prefill_tokens_per_second %.3f\n"
        "# TYPE kvpred_queue_depth gauge\n"
        "kvpred_queue_depth %d\n"
        "# TYPE kvpred_slots_busy gauge\n"
        "kvpred_slots_busy %d\n"
        "# TYPE kvpred_slots_total gauge\n"
        "kvpred_slots_total %d\n"
        "# HELP kvpred_kv_bytes KV cache bytes of every slot, by tier and temperature.\n"
        "# TYPE kvpred_kv_bytes gauge\n"
        "kvpred_kv_bytes{tier=\"%s\",state=\"hot\"} %llu\n"
        "kvpred_kv_bytes{tier=\"%s\",state=\"cold\"} %llu\n"
        "# HELP kvpred_prefix_cache_hits_total Requests that reused a cached prompt prefix.\n"
        "# TYPE kvpred_prefix_cache_hits_total counter\n"
        "kvpred_prefix_cache_hits_total %llu\n"
        "# TYPE kvpred_prefix_cache_tokens_saved_total counter\n"
        "kvpred_prefix_cache_tokens_saved_total %llu\n"
        "# HELP kvpred_policy_seconds_total Time in the selection policy's per-step hooks.\n"
        "# TYPE kvpred_policy_seconds_total counter\n"
        "kvpred_policy_seconds_total %.6f\n"
        "# TYPE kvpred_uptime_seconds gauge\n"
        "kvpred_uptime_seconds %.3f\n"
        "# HELP kvpred_prefix_cache_entries Cached prompt prefixes, in RAM and in the folder.\n"
        "# TYPE kvpred_prefix_cache_entries gauge\n"
        "kvpred_prefix_cache_entries{where=\"ram\"} %llu\n"
        "kvpred_prefix_cache_entries{where=\"disk\"} %llu\n"
        "# TYPE kvpred_prefix_cache_bytes gauge\n"
        "kvpred_prefix_cache_bytes{where=\"ram\"} %llu\n"
        "kvpred_prefix_cache_bytes{where=\"disk\"} %llu\n"
        "# HELP kvpred_prefix_cache_loads_total Prefixes copied in from the prefix cache.\n"
        "# TYPE kvpred_prefix_cache_loads_total counter\n"
        "kvpred_prefix_cache_loads_total %llu\n"
        "kvpred_prefix_cache_tokens_loaded_total %llu\n"
        "# HELP kvpred_prefix_cache_refused_total Stored prefixes refused (corrupt, foreign).\n"
        "# TYPE kvpred_prefix_cache_refused_total counter\n"
        "kvpred_prefix_cache_refused_total %llu\n"
        "kvpred_prefix_cache_written_total %llu\n"
        "kvpred_prefix_cache_persistent %d\n"
        "# HELP kvpred_kv_lost_total Losses of a tiered KV cache recovered from by recomputing.\n"
        "# TYPE kvpred_kv_lost_total counter\n"
        "kvpred_kv_lost_total %llu\n"
        "kvpred_kv_recomputed_tokens_total %llu\n",
        (unsigned long long)s.jobs, (unsigned long long)s.jobs_cancelled,
        (unsigned long long)s.jobs_failed, (unsigned long long)s.prompt_tokens,
        (unsigned long long)s.prefill_tokens, (unsigned long long)s.generated_tokens,
        s.prefill_s, s.decode_s, s.decode_s > 0 ? s.generated_tokens / s.decode_s : 0.0,
        s.prefill_s > 0 ? s.prefill_tokens / s.prefill_s : 0.0, queued, s.busy, e->cfg.n_slots,
        tier, (unsigned long long)s.kv_hot, tier, (unsigned long long)s.kv_cold,
        (unsigned long long)s.prefix_hits, (unsigned long long)s.prefix_tokens_saved, s.policy_s,
        kvp_time_now() - e->t_start, (unsigned long long)ps.entries,
        (unsigned long long)ps.disk_entries, (unsigned long long)ps.ram_bytes,
        (unsigned long long)ps.disk_bytes, (unsigned long long)ps.hits,
        (unsigned long long)ps.tokens_loaded, (unsigned long long)ps.refused,
        (unsigned long long)ps.written, ps.persistent ? 1 : 0, (unsigned long long)s.kv_lost,
        (unsigned long long)s.kv_recomputed);
    if (n < 0)
        return 0;
    size_t at = (size_t)n;
    at += srv_pstore_metrics(e->pstore, at < cap ? buf + at : NULL, at < cap ? cap - at : 0);
    return at + slot_metrics(e, at < cap ? buf + at : NULL, at < cap ? cap - at : 0);
}
