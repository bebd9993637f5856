/*
 * Perplexity of a text in llama.cpp's convention (shared/reference/stories260K_ppl.json): the
 * tokens (BOS first) are split into consecutive n_ctx-token chunks, each chunk is evaluated alone
 * with BOS as its first token, and the negative log-likelihood is averaged over the second half
 * of every chunk (positions n_ctx/2 .. n_ctx-2 predicting the next token). The standard error is
 * llama.cpp's: sqrt(var(nll) / (N-1)) · ppl. `kvpred perplexity` prints what this computes.
 */
#ifndef KVP_EVAL_PERPLEXITY_H
#define KVP_EVAL_PERPLEXITY_H

#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"

struct kvp_ppl_result {
    long chunks;       /* chunks scored */
    long scored;       /* tokens scored */
    double nll;        /* mean negative log-likelihood (nats) */
    double ppl;        /* exp(nll) */
    double ppl_stderr; /* llama.cpp's standard error of ppl */
};

/* Called after each chunk with the chunks done, the chunks in all and the perplexity so far. */
typedef void (*kvp_ppl_progress_fn)(void *ud, long done, long total, double ppl);

/* Chunks of n_ctx tokens that n tokens give, at most max_chunks when max_chunks > 0. */
long kvp_perplexity_chunks(size_t n, long n_ctx, long max_chunks);

/* Score ids[0..n) on ctx (of model m, with room for n_ctx tokens; reset before each chunk).
 * Returns 0 and *out, KVP_EINVAL when n_ctx < 4 or the text is shorter than one chunk, KVP_ENOMEM,
 * or kvp_eval's error. progress may be NULL. */
int kvp_perplexity(kvp_ctx *ctx, const kvp_model *m, const int32_t *ids, size_t n, long n_ctx,
                   long max_chunks, kvp_ppl_progress_fn progress, void *ud,
                   struct kvp_ppl_result *out, struct kvp_err *err);

#endif
