/*
 * `kvpred bench`: prefill and decode speed, and the memory-bandwidth floor they are compared to.
 *
 * Prefill: P tokens (default 512, at most CTX) from an empty cache, best of R runs. Decode: the
 * cache is filled with CTX tokens first (timed, "fill"), then N tokens are decoded one at a time;
 * this repeats R times from the same filled cache (the cache is truncated back to CTX), and the
 * mean and best rates are reported. Token ids are deterministic pseudo-random ids.
 *
 * The floor: a decode step must read every weight byte and the whole KV cache once, so
 * floor tokens/s = bandwidth / (weight bytes + KV bytes at CTX), with the bandwidth measured here
 * by streaming a 256 MiB buffer with the same number of threads (or given with --bandwidth).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "core/platform.h"
#include "core/threadpool.h"
#include "kernels/simd.h"

static void help(void)
{
    printf("usage: kvpred bench [-m MODEL] -c CTX -n N [-t T] [--json]\n\n"
           "  -c, --ctx N          tokens already in the cache when decode is timed\n"
           "  -n N                 decode tokens per run (default 128)\n"
           "  --prefill N          prefill tokens timed from an empty cache (default 512)\n"
           "  -r, --reps N         repetitions (default 3)\n"
           "  --bandwidth GBPS     memory bandwidth for the floor (default: measured)\n"
           "  --json               print one JSON object\n\n%s",
           cli_model_flags_help);
}

struct bw_job {
    const double *buf;
    size_t n;
    double sums[256];
};

static void bw_worker(void *arg, int ith, int nth)
{
    struct bw_job *j = arg;
    long b, e;
    kvp_split_range((long)j->n, ith, nth, &b, &e);
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long i = b; i + 3 < e; i += 4) {
        s0 += j->buf[i];
        s1 += j->buf[i + 1];
        s2 += j->buf[i + 2];
        s3 += j->buf[i + 3];
    }
    j->sums[ith] = s0 + s1 + s2 + s3;
}

/* Read bandwidth in GB/s with n_threads threads over a 256 MiB buffer (best of 3). */
static double measure_bandwidth(int n_threads)
{
    size_t bytes = (size_t)256 << 20;
    double *buf = kvp_alloc_aligned(bytes);
    struct kvp_pool *pool = NULL;
    if (!buf || kvp_pool_init(n_threads, &pool, NULL) < 0) {
        kvp_free_aligned(buf);
        return 0;
    }
    struct bw_job job = {.buf = buf, .n = bytes / sizeof(double)};
    for (size_t i = 0; i < job.n; i++)
        buf[i] = (double)(i & 7);
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = kvp_time_now();
        kvp_pool_run(pool, bw_worker, &job);
        double dt = kvp_time_now() - t0;
        if (r > 0 && bytes / dt / 1e9 > best) /* first run warms up */
            best = bytes / dt / 1e9;
    }
    kvp_pool_free(pool);
    kvp_free_aligned(buf);
    return best;
}

int cmd_bench(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    long n_decode = 128, n_prefill = 512, reps = 3;
    double bandwidth = 0;
    bool json = false;
    static const char *const value_flags[] = {"-n", "--prefill", "-r", "--reps", "--bandwidth", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_model_flag(&mo, argc, argv, &i);
        if (r < 0)
            return 1;
        if (r > 0)
            continue;
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help();
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!cli_flag_in(a, value_flags)) {
            return cli_fail("bench: unknown flag '%s' (see kvpred bench --help)", a);
        } else if (!(v = cli_flag_value(argc, argv, &i))) {
            return 1;
        } else if (!strcmp(a, "-n")) {
            if (!cli_parse_int(v, 1, 1 << 20, &n_decode))
                return cli_fail("-n: '%s' is not a positive token count", v);
        } else if (!strcmp(a, "--prefill")) {
            if (!cli_parse_int(v, 1, 1 << 24, &n_prefill))
                return cli_fail("--prefill: '%s' is not a positive token count", v);
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps")) {
            if (!cli_parse_int(v, 1, 1000, &reps))
                return cli_fail("--reps: '%s' is not in 1..1000", v);
        } else if (!strcmp(a, "--bandwidth")) {
            if (!cli_parse_float(v, 0.001, 1e6, &bandwidth))
                return cli_fail("--bandwidth: '%s' is not a positive GB/s value", v);
        } else {
            return cli_fail("bench: unknown flag '%s' (see kvpred bench --help)", a);
        }
    }
    if (mo.n_threads <= 0)
        mo.n_threads = 1;
    int status = 1;
    int32_t *toks = NULL;
    float *logits = NULL;
    kvp_ctx *ctx = NULL;
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    long depth = mo.n_ctx > 0 ? mo.n_ctx : 512;
    if (n_prefill > depth)
        n_prefill = depth;
    long cap = depth + n_decode;
    if (!(ctx = cli_open_ctx(m, &mo, cap)))
        goto out;
    toks = malloc((size_t)cap * sizeof(int32_t));
    logits = malloc((size_t)in.n_vocab * sizeof(float));
    if (!toks || !logits) {
        cli_fail("out of memory");
        goto out;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* fixed pseudo-random token ids */
    for (long i = 0; i < cap; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)in.n_vocab);
    }
    toks[0] = kvp_token_bos(m);
    struct kvp_err err = {0};

    /* prefill */
    double pp_best = 0;
    for (long r = 0; r < reps; r++) {
        kvp_ctx_reset(ctx);
        double t0 = kvp_time_now();
        if (kvp_eval(ctx, toks, (int)n_prefill, logits, false, &err) < 0)
            goto fail_err;
        double rate = n_prefill / (kvp_time_now() - t0);
        pp_best = rate > pp_best ? rate : pp_best;
    }
    /* fill to depth, then decode */
    kvp_ctx_reset(ctx);
    double t0 = kvp_time_now();
    if (kvp_eval(ctx, toks, (int)depth, logits, false, &err) < 0)
        goto fail_err;
    double fill_s = kvp_time_now() - t0;
    double tg_sum = 0, tg_best = 0;
    for (long r = 0; r < reps; r++) {
        kvp_ctx_truncate(ctx, (int)depth);
        t0 = kvp_time_now();
        for (long i = 0; i < n_decode; i++)
            if (kvp_eval(ctx, toks + depth + i, 1, logits, false, &err) < 0)
                goto fail_err;
        double rate = n_decode / (kvp_time_now() - t0);
        tg_sum += rate;
        tg_best = rate > tg_best ? rate : tg_best;
    }
    double tg_mean = tg_sum / reps;
    if (bandwidth <= 0)
        bandwidth = measure_bandwidth((int)mo.n_threads);
    double kv_bytes = 2.0 * in.n_layer * in.n_head_kv * in.head_dim * sizeof(float) *
                      (double)(depth + n_decode / 2);
    double step_bytes = (double)in.weight_bytes + kv_bytes;
    double floor_tps = bandwidth > 0 ? bandwidth * 1e9 / step_bytes : 0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", in.name);
        cJSON_AddStringToObject(o, "simd", kvp_simd()->name);
        cJSON_AddNumberToObject(o, "threads", (double)mo.n_threads);
        cJSON_AddNumberToObject(o, "ctx", (double)depth);
        cJSON_AddNumberToObject(o, "n_decode", (double)n_decode);
        cJSON_AddNumberToObject(o, "reps", (double)reps);
        cJSON_AddNumberToObject(o, "prefill_tokens", (double)n_prefill);
        cJSON_AddNumberToObject(o, "prefill_tokens_per_s", pp_best);
        cJSON_AddNumberToObject(o, "fill_seconds", fill_s);
        cJSON_AddNumberToObject(o, "decode_tokens_per_s", tg_mean);
        cJSON_AddNumberToObject(o, "decode_tokens_per_s_best", tg_best);
        cJSON_AddNumberToObject(o, "decode_ms_per_token", 1e3 / tg_mean);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)in.weight_bytes);
        cJSON_AddNumberToObject(o, "kv_bytes_per_step", kv_bytes);
        cJSON_AddNumberToObject(o, "bandwidth_gbps", bandwidth);
        cJSON_AddNumberToObject(o, "floor_decode_tokens_per_s", floor_tps);
        cJSON_AddNumberToObject(o, "fraction_of_floor", floor_tps > 0 ? tg_mean / floor_tps : 0);
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
    } else {
        printf("model %s, %ld thread(s), SIMD %s\n", in.name, mo.n_threads, kvp_simd()->name);
        printf("prefill  %6ld tokens: %10.1f tokens/s (best of %ld)\n", n_prefill, pp_best, reps);
        printf("fill     %6ld tokens: %10.3f s\n", depth, fill_s);
        printf("decode at %ld: %10.1f tokens/s mean, %.1f best (%.3f ms/token)\n", depth, tg_mean,
               tg_best, 1e3 / tg_mean);
        printf("floor    %.1f tokens/s = %.1f GB/s / (%.2f MB weights + %.2f MB KV)\n", floor_tps,
               bandwidth, in.weight_bytes / 1e6, kv_bytes / 1e6);
    }
    status = 0;
    goto out;
fail_err:
    cli_fail_err(&err);
out:
    free(logits);
    free(toks);
    kvp_ctx_free(ctx);
    kvp_model_close(m);
    return status;
}
