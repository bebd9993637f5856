/* Chunked perplexity in llama.cpp's convention: see perplexity.h. */
#include "eval/perplexity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/metrics.h"

long kvp_perplexity_chunks(size_t n, long n_ctx, long max_chunks)
{
    long n_chunks = n_ctx > 0 ? (long)(n / (size_t)n_ctx) : 0;
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    return n_chunks;
}

int kvp_perplexity(kvp_ctx *ctx, const kvp_model *m, const int32_t *ids, size_t n, long n_ctx,
                   long max_chunks, kvp_ppl_progress_fn progress, void *ud,
                   struct kvp_ppl_result *out, struct kvp_err *err)
{
    memset(out, 0, sizeof(*out));
    if (n_ctx < 4)
        return kvp_err_set(err, KVP_EINVAL, "context %ld is too short (need at least 4)", n_ctx);
    long n_chunks = kvp_perplexity_chunks(n, n_ctx, max_chunks);
    if (n_chunks < 1)
        return kvp_err_set(err, KVP_EINVAL,
                           "the text has %zu tokens, fewer than one context of %ld", n, n_ctx);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    float *logits = malloc((size_t)n_ctx * in.n_vocab * sizeof(float));
    int32_t *chunk = malloc((size_t)n_ctx * sizeof(int32_t));
    int rc = 0;
    if (!logits || !chunk) {
        rc = kvp_err_set(err, KVP_ENOMEM, "perplexity: out of memory");
        goto out;
    }
    double nll = 0.0, nll2 = 0.0;
    long count = 0;
    int first = (int)(n_ctx / 2);
    for (long c = 0; c < n_chunks; c++) {
        size_t start = (size_t)c * n_ctx;
        memcpy(chunk, ids + start, (size_t)n_ctx * sizeof(int32_t));
        chunk[0] = kvp_token_bos(m);
        kvp_ctx_reset(ctx);
        if ((rc = kvp_eval(ctx, chunk, (int)n_ctx, logits, true, err)) < 0)
            goto out;
        for (int j = first; j < n_ctx - 1; j++) {
            double v = kvp_metric_nll(logits + (size_t)j * in.n_vocab, in.n_vocab,
                                      ids[start + j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        if (progress)
            progress(ud, c + 1, n_chunks, exp(nll / count));
    }
    double mean = nll / count, ppl = exp(mean);
    double var = nll2 / count - mean * mean;
    *out = (struct kvp_ppl_result){
        .chunks = n_chunks,
        .scored = count,
        .nll = mean,
        .ppl = ppl,
        .ppl_stderr = (var > 0 && count > 1) ? sqrt(var / (count - 1)) * ppl : 0.0,
    };
out:
    free(chunk);
    free(logits);
    return rc;
}
