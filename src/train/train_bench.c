/*
 * Trainer throughput measurement (`kvpred train-lm --bench`): whole optimiser steps — forward,
 * loss, backward over the micro-batches, clipping and AdamW — on random tokens, so the figure is
 * the trainer's arithmetic alone (the data generator is not timed: it costs the same in every
 * precision and overlaps nothing). One step runs untimed first to touch every buffer.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/platform.h"
#include "train/train.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int kvp_train_bench(const struct kvp_train_bench_req *req, struct kvp_train_bench_result *res,
                    struct kvp_err *err)
{
    int T = req->T;
    long micro = req->micro_tokens < T ? T : req->micro_tokens;
    int per = (int)(micro / T), n_seq = (int)(req->tokens_per_step / T);
    if (n_seq < 1)
        n_seq = 1;
    if (per > n_seq)
        per = n_seq;
    struct kvp_train_config cfg = req->cfg;
    if (cfg.n_ctx < T)
        cfg.n_ctx = T;
    struct kvp_train_model *m = NULL;
    struct kvp_adamw opt;
    memset(&opt, 0, sizeof(opt));
    int rc = kvp_train_model_init(&m, &cfg, (long)per * T, req->n_threads, req->seed, err);
    if (rc < 0)
        return rc;
    size_t nt = (size_t)n_seq * T;
    int32_t *tok = malloc(sizeof(int32_t) * (nt + 1));
    if (!tok) {
        rc = kvp_err_set(err, KVP_ENOMEM, "bench tokens");
        goto out;
    }
    struct kvp_rng rng;
    kvp_rng_seed(&rng, req->seed);
    for (size_t i = 0; i <= nt; i++)
        tok[i] = (int32_t)kvp_rng_below(&rng, (uint64_t)cfg.n_vocab);
    if ((rc = kvp_train_model_set_precision(m, req->precision, err)) < 0 ||
        (rc = kvp_adamw_init(&opt, m->n_params, 0.9f, 0.95f, 1e-8f, 0.1f, err)) < 0)
        goto out;
    double t0 = 0, c0 = 0, loss = 0;
    for (int s = 0; s <= req->steps; s++) {
        if (s == 1) {
            t0 = kvp_time_now();
            c0 = cpu_now();
        }
        kvp_train_model_zero_grad(m);
        loss = 0;
        for (int i0 = 0; i0 < n_seq; i0 += per) {
            int k = n_seq - i0 < per ? n_seq - i0 : per;
            const int32_t *x = tok + (size_t)i0 * T;
            if ((rc = kvp_train_model_forward(m, x, k, T, err)) < 0)
                goto out;
            loss += kvp_train_model_loss(m, x + 1, NULL, (double)nt, NULL);
            kvp_train_model_backward(m);
        }
        kvp_clip_grad(m->grads, m->n_params, 1.0);
        kvp_adamw_step(&opt, m, 1e-3f);
    }
    double wall = kvp_time_now() - t0, cpu = cpu_now() - c0;
    double tokens = (double)nt * req->steps;
    res->tokens_per_s = wall > 0 ? tokens / wall : 0;
    res->cpu_s_per_mtok = tokens > 0 ? cpu / tokens * 1e6 : 0;
    res->loss = loss / (double)nt;
    res->kernels = req->precision == KVP_PREC_BF16 ? m->tk->name : "openblas";
out:
    free(tok);
    kvp_adamw_free(&opt);
    kvp_train_model_free(m);
    return rc;
}
