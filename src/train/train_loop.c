/*
 * The training driver: vocabulary, corpus, model and optimiser set-up (or a checkpoint resume),
 * then the step loop with its curriculum, gradient accumulation, clipping, AdamW, periodic
 * checkpoints and retrieval evaluation, and the GGUF export at the end.
 *
 * One optimiser step sees tokens_per_step tokens: tokens_per_step / T sequences of the current
 * curriculum phase's context T, processed in micro-batches of micro_tokens / T sequences whose
 * gradients accumulate. The loss of a step is the token-weighted mean over the whole step
 * (answer tokens weigh answer_weight), so the accumulated gradient equals the full-batch one.
 *
 * Reproducibility: sample i of the run has seed kvp_task_seed(run seed, i) (the seed contract:
 * train.h); the data cursor (samples consumed) is the only data state, and it is saved with the
 * weights, the Adam moments and the step, so a resumed run repeats the uninterrupted one bit for
 * bit on the same thread count. Evaluation uses evaluation seeds and held-out sentences only.
 *
 * The library never prints: progress goes to a callback.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "train/train.h"

#define HOLDOUT 0.05
#define TEMPLATE_INSTANCES 40 /* per task, for vocabulary learning */

void kvp_train_opts_default(struct kvp_train_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->model = (struct kvp_train_config){.n_vocab = 1024, .n_embd = 256, .n_layer = 6,
                                         .n_head = 8, .n_head_kv = 4, .n_ff = 704,
                                         .n_ctx = 2048, .rope_base = 10000.0f,
                                         .norm_eps = 1e-5f, .tied = 1};
    struct kvp_train_hparams *hp = &o->hp;
    hp->seed = 1;
    hp->steps = 1000;
    hp->tokens_per_step = 16384;
    hp->micro_tokens = 4096;
    hp->lr = 2e-3f;
    hp->lr_min = 2e-4f;
    hp->warmup_frac = 0.03f;
    hp->weight_decay = 0.1f;
    hp->beta1 = 0.9f;
    hp->beta2 = 0.95f;
    hp->adam_eps = 1e-8f;
    hp->clip = 1.0f;
    hp->answer_weight = 4.0f;
    hp->n_phases = 3;
    hp->phase_ctx[0] = 512;
    hp->phase_frac[0] = 0.3f;
    hp->phase_ctx[1] = 1024;
    hp->phase_frac[1] = 0.3f;
    hp->phase_ctx[2] = 2048;
    hp->phase_frac[2] = 0.4f;
    kvp_task_mix_default(&hp->mix);
    o->eval_samples = 8;
    o->n_threads = 2;
    o->precision = KVP_PREC_BF16;
}

int kvp_train_phase_at(const struct kvp_train_hparams *hp, long step)
{
    double tot = 0.0;
    for (int i = 0; i < hp->n_phases; i++)
        tot += hp->phase_frac[i];
    double acc = 0.0, span = (double)(hp->steps - hp->stage_step);
    for (int i = 0; i < hp->n_phases; i++) {
        acc += hp->phase_frac[i] / (tot > 0 ? tot : 1.0);
        if ((double)(step - hp->stage_step) < acc * span)
            return i;
    }
    return hp->n_phases - 1;
}

/* ==================================== evaluation ============================================== */

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

int kvp_train_evaluate(struct kvp_train_model *m, const struct kvp_corpus *c,
                       const struct kvp_tvocab *v, int T, int n, uint64_t seed, double *acc,
                       double *val_loss, struct kvp_err *err)
{
    int per = (int)(m->cap_tokens / T);
    if (per < 1 || T > m->cfg.n_ctx)
        return kvp_err_set(err, KVP_EINVAL, "evaluation context %d does not fit", T);
    if (per > n)
        per = n;
    struct kvp_sample *s = calloc((size_t)per, sizeof(*s));
    int32_t *tok = malloc((size_t)per * T * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)per * T * sizeof(int32_t));
    int rc = 0;
    if (!s || !tok || !tgt) {
        rc = kvp_err_set(err, KVP_ENOMEM, "evaluation buffers");
        goto out;
    }
    for (int i = 0; i < per && rc == 0; i++)
        rc = kvp_sample_alloc(&s[i], T, err);
    struct kvp_task_mix none = {.edge_frac = KVP_EDGE_FRAC_DEFAULT,
                                .fill_min = KVP_FILL_MIN_DEFAULT};
    struct kvp_task_tok enc = kvp_tvocab_task_tok(v);
    for (int task = 0; task < KVP_TASK_COUNT && rc == 0; task++) {
        int good = 0, total = 0;
        double nll = 0.0;
        long ntok = 0;
        for (int i0 = 0; i0 < n && rc == 0; i0 += per) {
            int k = n - i0 < per ? n - i0 : per;
            for (int j = 0; j < k && rc == 0; j++) {
                uint64_t sd = kvp_rng_mix(seed, (uint64_t)task * 1000003u + (uint64_t)(i0 + j));
                rc = kvp_sample_make(&s[j], c, &enc, &none, task, kvp_task_eval_seed(sd), true,
                                     1.0f, err);
                memcpy(tok + (size_t)j * T, s[j].tok, (size_t)T * sizeof(int32_t));
                memcpy(tgt + (size_t)j * T, s[j].tok + 1, (size_t)T * sizeof(int32_t));
            }
            if (rc < 0 || (rc = kvp_train_model_forward(m, tok, k, T, err)) < 0)
                break;
            if (task == KVP_TASK_LM) {
                nll += kvp_train_model_loss(m, tgt, NULL, 1.0, NULL);
                ntok += (long)k * T;
                continue;
            }
            for (int j = 0; j < k; j++) {
                if (s[j].task != task || s[j].ans_end <= s[j].ans_begin)
                    continue; /* did not fit at this context */
                bool ok = true;
                for (int p = s[j].ans_begin; p < s[j].ans_end && ok; p++)
                    ok = argmax(m->logits + ((size_t)j * T + p) * m->cfg.n_vocab,
                                m->cfg.n_vocab) == s[j].tok[p + 1];
                good += ok;
                total++;
            }
        }
        if (task == KVP_TASK_LM)
            *val_loss = ntok ? nll / (double)ntok : NAN;
        else
            acc[task] = total ? (double)good / total : NAN;
    }
    acc[KVP_TASK_LM] = NAN;
out:
    if (s)
        for (int i = 0; i < per; i++)
            kvp_sample_free(&s[i]);
    free(s);
    free(tok);
    free(tgt);
    return rc;
}

/* ====================================== driver ================================================ */

struct run {
    const struct kvp_train_opts *o;
    kvp_train_progress_fn cb;
    void *user;
    struct kvp_train_model *m;
    struct kvp_adamw opt;
    struct kvp_tvocab *v;
    struct kvp_corpus *c;
    struct kvp_train_hparams hp;
    struct kvp_train_state st;
    struct kvp_sample *samples; /* [n_samples] for the current context */
    int n_samples, sample_T;
    int32_t *tok, *tgt;         /* [micro_tokens] */
    float *w, *nll;
};

static void emit(struct run *r, struct kvp_train_progress *p)
{
    if (r->cb)
        r->cb(r->user, p);
}

static void info(struct run *r, const char *msg)
{
    struct kvp_train_progress p = {.event = KVP_TRAIN_EV_INFO, .step = r->st.step,
                                   .steps = r->hp.steps, .msg = msg};
    emit(r, &p);
}

/* A fresh run from a GGUF the trainer exported: its weights and vocabulary, fresh optimiser
 * state and schedule (the shipped model's checkpoint is gone; its GGUF is what exists). */
static int setup_from_gguf(struct run *r, struct kvp_err *err)
{
    const struct kvp_train_opts *o = r->o;
    int rc = kvp_train_import_gguf(o->init_gguf, o->model.n_ctx, o->model.rope_base,
                                   o->hp.micro_tokens, o->n_threads, &r->m, &r->v, err);
    if (rc < 0)
        return rc;
    r->hp = o->hp;
    memset(&r->st, 0, sizeof(r->st));
    kvp_rng_seed(&r->st.rng, r->hp.seed ^ 0x5DEECE66DULL);
    return kvp_adamw_init(&r->opt, r->m->n_params, r->hp.beta1, r->hp.beta2, r->hp.adam_eps,
                          r->hp.weight_decay, err);
}

static int setup_fresh(struct run *r, const char *text, size_t len, struct kvp_err *err)
{
    const struct kvp_train_opts *o = r->o;
    /* the vocabulary learns from the text plus the task templates, which make up a few percent
     * of the training tokens (one template per sample) and so deserve their own merges */
    struct kvp_corpus *c0;
    char *tmpl, *all;
    size_t tlen;
    int rc = kvp_corpus_init(&c0, text, len, NULL, HOLDOUT, err);
    if (rc < 0)
        return rc;
    rc = kvp_task_template_text(c0, TEMPLATE_INSTANCES, o->hp.seed, &tmpl, &tlen, err);
    kvp_corpus_free(c0);
    if (rc < 0)
        return rc;
    all = malloc(len + tlen + 1);
    if (!all) {
        free(tmpl);
        return kvp_err_set(err, KVP_ENOMEM, "vocabulary text");
    }
    memcpy(all, text, len);
    memcpy(all + len, tmpl, tlen);
    free(tmpl);
    rc = kvp_tvocab_learn(all, len + tlen, o->model.n_vocab, &r->v, err);
    free(all);
    if (rc < 0)
        return rc;
    struct kvp_train_config cfg = o->model;
    cfg.n_vocab = r->v->n;
    r->hp = o->hp;
    memset(&r->st, 0, sizeof(r->st));
    kvp_rng_seed(&r->st.rng, r->hp.seed ^ 0x5DEECE66DULL);
    rc = kvp_train_model_init(&r->m, &cfg, r->hp.micro_tokens, o->n_threads,
                              kvp_rng_mix(r->hp.seed, 0xC0FFEE), err);
    if (rc < 0)
        return rc;
    return kvp_adamw_init(&r->opt, r->m->n_params, r->hp.beta1, r->hp.beta2, r->hp.adam_eps,
                          r->hp.weight_decay, err);
}

static int check_hparams(const struct kvp_train_hparams *hp, int n_ctx, struct kvp_err *err)
{
    if (hp->steps < 1 || hp->tokens_per_step < 2 || hp->micro_tokens < 2)
        return kvp_err_set(err, KVP_EINVAL, "steps, batch and micro-batch must be positive");
    if (hp->n_phases < 1 || hp->n_phases > KVP_TRAIN_MAX_PHASES)
        return kvp_err_set(err, KVP_EINVAL, "%d curriculum phases (1..%d)", hp->n_phases,
                           KVP_TRAIN_MAX_PHASES);
    for (int i = 0; i < hp->n_phases; i++) {
        int T = hp->phase_ctx[i];
        if (T < 16 || T > n_ctx)
            return kvp_err_set(err, KVP_EINVAL, "curriculum context %d: must be 16..%d", T, n_ctx);
        if (hp->micro_tokens < T)
            return kvp_err_set(err, KVP_EINVAL, "micro-batch of %ld tokens < context %d",
                               hp->micro_tokens, T);
        if (!(hp->phase_frac[i] >= 0.0f))
            return kvp_err_set(err, KVP_EINVAL, "curriculum fraction must be >= 0");
    }
    if (!(hp->lr > 0.0f) || hp->lr_min < 0.0f || !(hp->answer_weight >= 0.0f))
        return kvp_err_set(err, KVP_EINVAL, "learning rate and answer weight must be positive");
    return 0;
}

static int ensure_samples(struct run *r, int n, int T, struct kvp_err *err)
{
    if (r->samples && r->n_samples >= n && r->sample_T == T)
        return 0;
    for (int i = 0; r->samples && i < r->n_samples; i++)
        kvp_sample_free(&r->samples[i]);
    free(r->samples);
    r->samples = calloc((size_t)n, sizeof(*r->samples));
    r->n_samples = 0;
    if (!r->samples)
        return kvp_err_set(err, KVP_ENOMEM, "samples");
    for (int i = 0; i < n; i++) {
        int rc = kvp_sample_alloc(&r->samples[i], T, err);
        if (rc < 0)
            return rc;
        r->n_samples = i + 1;
    }
    r->sample_T = T;
    return 0;
}

/* One optimiser step. Fills p with the step's statistics. */
static int train_step(struct run *r, struct kvp_train_progress *p, struct kvp_err *err)
{
    const struct kvp_train_hparams *hp = &r->hp;
    int T = hp->phase_ctx[kvp_train_phase_at(hp, r->st.step)];
    int n_seq = (int)(hp->tokens_per_step / T);
    if (n_seq < 1)
        n_seq = 1;
    int per = (int)(hp->micro_tokens / T);
    int rc = ensure_samples(r, n_seq, T, err);
    if (rc < 0)
        return rc;
    double wsum = 0.0;
    struct kvp_task_tok enc = kvp_tvocab_task_tok(r->v);
    for (int i = 0; i < n_seq; i++) {
        uint64_t sd = kvp_task_seed(hp->seed, r->st.data_cursor + (uint64_t)i);
        rc = kvp_sample_make(&r->samples[i], r->c, &enc, &hp->mix, -1, sd, false,
                             hp->answer_weight, err);
        if (rc < 0)
            return rc;
        for (int t = 0; t < T; t++)
            wsum += r->samples[i].weight[t];
    }
    if (wsum <= 0.0)
        wsum = 1.0;
    kvp_train_model_zero_grad(r->m);
    double loss = 0.0, ans_nll = 0.0;
    long ans_n = 0;
    for (int i0 = 0; i0 < n_seq; i0 += per) {
        int k = n_seq - i0 < per ? n_seq - i0 : per;
        for (int j = 0; j < k; j++) {
            const struct kvp_sample *s = &r->samples[i0 + j];
            memcpy(r->tok + (size_t)j * T, s->tok, (size_t)T * sizeof(int32_t));
            memcpy(r->tgt + (size_t)j * T, s->tok + 1, (size_t)T * sizeof(int32_t));
            memcpy(r->w + (size_t)j * T, s->weight, (size_t)T * sizeof(float));
        }
        if ((rc = kvp_train_model_forward(r->m, r->tok, k, T, err)) < 0)
            return rc;
        loss += kvp_train_model_loss(r->m, r->tgt, r->w, wsum, r->nll);
        kvp_train_model_backward(r->m);
        for (int j = 0; j < k; j++) {
            const struct kvp_sample *s = &r->samples[i0 + j];
            if (s->task == KVP_TASK_COPY)
                continue; /* the answer statistic is about needle answers */
            for (int t = s->ans_begin; t < s->ans_end; t++) {
                ans_nll += r->nll[(size_t)j * T + t];
                ans_n++;
            }
        }
    }
    double gnorm = kvp_clip_grad(r->m->grads, r->m->n_params, hp->clip);
    long span = hp->steps - hp->stage_step; /* the schedule restarts with each stage */
    long warm = (long)(hp->warmup_frac * (float)span);
    float lr = kvp_lr_schedule(r->st.step - hp->stage_step, warm, span, hp->lr, hp->lr_min);
    kvp_adamw_step(&r->opt, r->m, lr);
    r->st.step++;
    r->st.data_cursor += (uint64_t)n_seq;
    r->st.tokens_seen += (double)n_seq * T;
    p->loss = loss / wsum;
    p->answer_loss = ans_n ? ans_nll / (double)ans_n : NAN;
    p->grad_norm = gnorm;
    p->lr = lr;
    p->ctx = T;
    if (!isfinite(p->loss))
        return kvp_err_set(err, KVP_ERANGE, "step %ld: loss is not finite", r->st.step);
    return 0;
}

static int do_eval(struct run *r, int T, struct kvp_err *err)
{
    struct kvp_train_progress p = {.event = KVP_TRAIN_EV_EVAL, .step = r->st.step,
                                   .steps = r->hp.steps, .eval_ctx = T,
                                   .tokens_seen = r->st.tokens_seen};
    int rc = kvp_train_evaluate(r->m, r->c, r->v, T, r->o->eval_samples, r->hp.seed, p.acc,
                                &p.val_loss, err);
    if (rc < 0)
        return rc;
    emit(r, &p);
    return 0;
}

static int do_ckpt(struct run *r, struct kvp_err *err)
{
    if (!r->o->ckpt_path)
        return 0;
    int rc = kvp_ckpt_save(r->o->ckpt_path, r->m, &r->opt, r->v, &r->hp, &r->st, err);
    if (rc < 0)
        return rc;
    struct kvp_train_progress p = {.event = KVP_TRAIN_EV_CKPT, .step = r->st.step,
                                   .steps = r->hp.steps, .msg = r->o->ckpt_path};
    emit(r, &p);
    return 0;
}

static void run_free(struct run *r)
{
    for (int i = 0; r->samples && i < r->n_samples; i++)
        kvp_sample_free(&r->samples[i]);
    free(r->samples);
    free(r->tok);
    free(r->tgt);
    free(r->w);
    free(r->nll);
    kvp_corpus_free(r->c);
    kvp_adamw_free(&r->opt);
    kvp_train_model_free(r->m);
    kvp_tvocab_free(r->v);
}

static int train_loop(struct run *r, struct kvp_err *err)
{
    const struct kvp_train_opts *o = r->o;
    double t0 = kvp_time_now(), tok0 = r->st.tokens_seen;
    long step0 = r->st.step;
    int rc = 0;
    while (r->st.step < r->hp.steps) {
        if (o->stop_after != 0 && r->st.step - step0 >= (o->stop_after < 0 ? 0 : o->stop_after))
            break;
        struct kvp_train_progress p = {.event = KVP_TRAIN_EV_STEP, .steps = r->hp.steps};
        if ((rc = train_step(r, &p, err)) < 0)
            return rc;
        double el = kvp_time_now() - t0;
        p.step = r->st.step;
        p.elapsed_s = el;
        p.tokens_seen = r->st.tokens_seen;
        p.tokens_per_s = el > 0 ? (r->st.tokens_seen - tok0) / el : 0.0;
        double left = (double)(r->hp.steps - r->st.step) * (double)r->hp.tokens_per_step;
        p.eta_s = p.tokens_per_s > 0 ? left / p.tokens_per_s : 0.0;
        emit(r, &p);
        if (o->ckpt_every > 0 && r->st.step % o->ckpt_every == 0 && (rc = do_ckpt(r, err)) < 0)
            return rc;
        if (o->eval_every > 0 && r->st.step % o->eval_every == 0 && r->st.step < r->hp.steps &&
            (rc = do_eval(r, p.ctx, err)) < 0)
            return rc;
    }
    return 0;
}

/* A resumed run keeps the checkpoint's hyperparameters except those given again (fine-tuning). */
static void apply_overrides(struct kvp_train_hparams *hp, const struct kvp_train_hparams *given,
                            unsigned which)
{
    if (which & KVP_TRAIN_OVERRIDE_LR) {
        hp->lr = given->lr;
        hp->lr_min = given->lr_min;
    }
    if (which & KVP_TRAIN_OVERRIDE_ANSWER_WEIGHT)
        hp->answer_weight = given->answer_weight;
    if (which & KVP_TRAIN_OVERRIDE_MIX)
        memcpy(hp->mix.w, given->mix.w, sizeof(hp->mix.w));
    if (which & KVP_TRAIN_OVERRIDE_EDGE_FRAC)
        hp->mix.edge_frac = given->mix.edge_frac;
    if (which & KVP_TRAIN_OVERRIDE_FILL_MIN)
        hp->mix.fill_min = given->mix.fill_min;
    if (which & KVP_TRAIN_OVERRIDE_HAY_FRAC)
        hp->mix.hay_frac = given->mix.hay_frac;
    if (which & KVP_TRAIN_OVERRIDE_CURRICULUM) {
        hp->n_phases = given->n_phases;
        memcpy(hp->phase_ctx, given->phase_ctx, sizeof(hp->phase_ctx));
        memcpy(hp->phase_frac, given->phase_frac, sizeof(hp->phase_frac));
    }
    if (which & KVP_TRAIN_OVERRIDE_BATCH) {
        hp->tokens_per_step = given->tokens_per_step;
        hp->micro_tokens = given->micro_tokens;
    }
}

/* Does the resume change the context, the RoPE base, the curriculum or the batch? Settings
 * given again with the checkpoint's own values change nothing, so the command that started a
 * stage also continues it. */
static bool stage_changes(const struct run *r)
{
    const struct kvp_train_opts *o = r->o;
    const struct kvp_train_hparams *hp = &r->hp, *g = &o->hp;
    unsigned w = o->resume_override;
    bool phases = g->n_phases != hp->n_phases;
    for (int i = 0; i < g->n_phases && !phases; i++)
        phases = g->phase_ctx[i] != hp->phase_ctx[i] || g->phase_frac[i] != hp->phase_frac[i];
    return ((w & KVP_TRAIN_OVERRIDE_CTX) && o->model.n_ctx != r->m->cfg.n_ctx) ||
           ((w & KVP_TRAIN_OVERRIDE_ROPE) && o->model.rope_base != r->m->cfg.rope_base) ||
           ((w & KVP_TRAIN_OVERRIDE_CURRICULUM) && phases) ||
           ((w & KVP_TRAIN_OVERRIDE_BATCH) && (g->tokens_per_step != hp->tokens_per_step ||
                                               g->micro_tokens != hp->micro_tokens));
}

/* A resume that changes the context, the RoPE base, the curriculum or the batch starts a new
 * stage at the checkpoint's step: its own warm-up, cosine and curriculum up to --steps, and the
 * model rebuilt for the new context (the weights do not depend on it; RoPE tables and run state
 * do), keeping the weights and the Adam moments. */
static int start_stage(struct run *r, struct kvp_err *err)
{
    const struct kvp_train_opts *o = r->o;
    unsigned w = o->resume_override;
    if (o->hp.steps <= r->st.step)
        return kvp_err_set(err, KVP_EINVAL,
                           "a new stage (--ctx, --rope-base, --curriculum, --batch or --micro) "
                           "needs --steps beyond the checkpoint's step %ld", r->st.step);
    r->hp.steps = o->hp.steps;
    r->hp.stage_step = r->st.step;
    struct kvp_train_config cfg = r->m->cfg;
    if (w & KVP_TRAIN_OVERRIDE_CTX)
        cfg.n_ctx = o->model.n_ctx;
    if (w & KVP_TRAIN_OVERRIDE_ROPE)
        cfg.rope_base = o->model.rope_base;
    struct kvp_train_model *m;
    int rc = kvp_train_config_check(&cfg, err);
    if (rc == 0)
        rc = kvp_train_model_init(&m, &cfg, r->hp.micro_tokens, o->n_threads, 0, err);
    if (rc < 0)
        return rc;
    memcpy(m->params, r->m->params, m->n_params * sizeof(float));
    kvp_train_model_free(r->m);
    r->m = m;
    return 0;
}

static uint64_t fnv_text(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* The extra haystack corpora, each path its own kind (never the essays: kvp_corpus_read refuses
 * them), and their fingerprint. */
static int load_hay(struct run *r, uint64_t *hash, struct kvp_err *err)
{
    const struct kvp_train_opts *o = r->o;
    uint64_t h = o->n_hay_paths ? 1469598103934665603ULL : 0;
    for (int i = 0; i < o->n_hay_paths; i++) {
        char *text, msg[512];
        size_t len;
        struct kvp_corpus *c;
        int rc = kvp_corpus_read(&o->hay_paths[i], 1, &text, &len, err);
        if (rc < 0)
            return rc;
        h = fnv_text(h, text, len);
        const struct kvp_task_tok tok = kvp_tvocab_task_tok(r->v);
        rc = kvp_corpus_init(&c, text, len, &tok, HOLDOUT, err);
        free(text);
        if (rc < 0 || (rc = kvp_corpus_add_hay(r->c, c, err)) < 0)
            return err ? kvp_err_prefix(err, "--hay %s", o->hay_paths[i]) : rc;
        snprintf(msg, sizeof(msg), "haystack %s: %ld sentences (%ld for training)",
                 o->hay_paths[i], c->n_sent, c->n_train);
        info(r, msg);
    }
    *hash = h;
    return 0;
}

int kvp_train_run(const struct kvp_train_opts *o, kvp_train_progress_fn cb, void *user,
                  struct kvp_err *err)
{
    struct run r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    r.cb = cb;
    r.user = user;
    char *text = NULL;
    size_t len = 0;
    char msg[256];
    int rc;
    if (o->n_threads > 0)
        openblas_set_num_threads(o->n_threads);
    bool new_stage = false;
    if (o->resume_path) {
        rc = kvp_ckpt_load(o->resume_path, 0, o->n_threads, &r.m, &r.opt, &r.v, &r.hp, &r.st, err);
        if (rc < 0)
            return rc;
        if (o->hp.steps > r.hp.steps)
            r.hp.steps = o->hp.steps; /* allow extending a finished run (the schedule changes) */
        new_stage = stage_changes(&r);
        apply_overrides(&r.hp, &o->hp, o->resume_override);
        if (new_stage && (rc = start_stage(&r, err)) < 0)
            goto out;
        snprintf(msg, sizeof(msg), "resumed %s at step %ld of %ld%s (ctx %d, rope base %g)",
                 o->resume_path, r.st.step, r.hp.steps,
                 new_stage ? ", a new stage" : "",
                 r.m->cfg.n_ctx, (double)r.m->cfg.rope_base);
        info(&r, msg);
    }
    if ((rc = kvp_corpus_read(o->data_paths, o->n_data_paths, &text, &len, err)) < 0)
        goto out;
    if (!o->resume_path) {
        if ((rc = check_hparams(&o->hp, o->init_gguf ? 65536 : o->model.n_ctx, err)) < 0 ||
            (rc = o->init_gguf ? setup_from_gguf(&r, err) : setup_fresh(&r, text, len, err)) < 0)
            goto out;
        snprintf(msg, sizeof(msg), "vocabulary: %d tokens; model: %zu parameters%s%s", r.v->n,
                 r.m->n_params, o->init_gguf ? ", from " : "", o->init_gguf ? o->init_gguf : "");
        info(&r, msg);
    }
    if ((rc = check_hparams(&r.hp, r.m->cfg.n_ctx, err)) < 0)
        goto out;
    const struct kvp_task_tok tok = kvp_tvocab_task_tok(r.v);
    if ((rc = kvp_corpus_init(&r.c, text, len, &tok, HOLDOUT, err)) < 0)
        goto out;
    free(text);
    text = NULL;
    snprintf(msg, sizeof(msg), "corpus: %ld sentences (%ld for training), %d key words",
             r.c->n_sent, r.c->n_train, r.c->n_words);
    info(&r, msg);
    uint64_t hay_hash = 0;
    if ((rc = load_hay(&r, &hay_hash, err)) < 0)
        goto out;
    if (o->resume_path && hay_hash != r.st.hay_hash && !new_stage) {
        rc = kvp_err_set(err, KVP_EINVAL, "--hay: not the haystack texts of the checkpoint (give "
                         "the same --hay paths, or start a new stage)");
        goto out;
    }
    r.st.hay_hash = hay_hash;
    if ((rc = kvp_train_model_set_precision(r.m, o->precision, err)) < 0)
        goto out;
    snprintf(msg, sizeof(msg), "precision %s (%s)", kvp_train_precision_name(o->precision),
             o->precision == KVP_PREC_BF16 ? r.m->tk->name : "openblas");
    info(&r, msg);
    size_t mt = (size_t)r.hp.micro_tokens;
    r.tok = malloc(mt * sizeof(int32_t));
    r.tgt = malloc(mt * sizeof(int32_t));
    r.w = malloc(mt * sizeof(float));
    r.nll = malloc(mt * sizeof(float));
    if (!r.tok || !r.tgt || !r.w || !r.nll) {
        rc = kvp_err_set(err, KVP_ENOMEM, "batch buffers");
        goto out;
    }
    if ((rc = train_loop(&r, err)) < 0)
        goto out;
    if ((rc = do_ckpt(&r, err)) < 0)
        goto out;
    if (r.st.step >= r.hp.steps) {
        int T = r.m->cfg.n_ctx;
        if ((long)T > r.m->cap_tokens)
            T = (int)r.m->cap_tokens;
        if (o->eval_samples > 0 && (rc = do_eval(&r, T, err)) < 0)
            goto out;
    }
    if (o->out_gguf && (rc = kvp_train_export_gguf(o->out_gguf, r.m, r.v, NULL, err)) < 0)
        goto out;
    if (o->out_gguf) {
        snprintf(msg, sizeof(msg), "wrote %s", o->out_gguf);
        info(&r, msg);
    }
out:
    free(text);
    run_free(&r);
    return rc;
}
