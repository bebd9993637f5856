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
 *
 * Sparse and tiered runs: --policy/--budget attach a selection policy; --kv-tier ram|disk|redis
 * puts the whole cache in a cold tier with a small hot tier in front (src/store/store.h), filled by
 * --prefetch dense|none|layer|token; --link-gbps/--link-latency-us make a RAM cold tier behave
 * like a link of that bandwidth and latency. Tiered runs re-fill the cache before every
 * repetition instead of truncating it (a policy may rebuild its metadata from every block after
 * a truncation, and the hot tier does not hold every block), and report the store's counters
 * per decoded token; --timeline OUT.png draws tokens 8..11 of the first repetition.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "core/platform.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "forward/context.h"
#include "kernels/prefill_gemm.h"
#include "kernels/simd.h"
#include "kernels/types.h"

static const char *const tier_names[] = {"none", "ram", "disk", "redis", NULL};
static const char *const prefetch_names[] = {"default", "none", "dense", "layer", "token", NULL};
static const char *const disk_io_names[] = {"auto", "io_uring", "pread", NULL};

/* --paired: decode tokens per turn of each context. Short enough that both see the same moments
 * of a shared host, long enough that switching caches costs little. */
#define PAIR_CHUNK 16

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void help(void)
{
    printf("usage: kvpred bench [-m MODEL] -c CTX -n N [-t T] [--json]\n\n"
           "  -c, --ctx N          tokens already in the cache when decode is timed\n"
           "  -n N                 decode tokens per run (default 128)\n"
           "  --prefill N          prefill tokens timed from an empty cache (default 512)\n"
           "  -r, --reps N         repetitions (default 3)\n"
           "  --bandwidth GBPS     memory bandwidth for the floor (default: measured)\n"
           "  --policy NAME        KV selection policy (default: none, dense attention); its\n"
           "                       select/on_step hooks are timed (policy_ms_per_token,\n"
           "                       policy_share)\n"
           "  --budget B           policy budget: tokens per (layer, KV head), or a fraction of\n"
           "                       the context (0.0625 or 1/16)\n"
           "  --kv-tier T          ram, disk or redis: tiered KV store (default: untiered)\n"
           "  --kv-dir DIR         directory of the disk tier's scratch file (default $TMPDIR,\n"
           "                       /tmp); the file has no name and vanishes with the process\n"
           "  --kv-url URL         redis tier: redis://HOST:PORT[,HOST:PORT...] (one server or\n"
           "                       the seed nodes of a cluster)[?OPTION=N&...], options\n"
           "                       timeout_ms, ttl_ms, failover_ms, pipeline, wait_replicas\n"
           "                       (docs/store.md)\n"
           "  --hot-budget N       hot-tier tokens per layer (default: from the budget)\n"
           "  --prefetch M         dense, none, layer or token (default token)\n"
           "  --link-gbps X        RAM tier: model a link of X GB/s\n"
           "  --link-latency-us Y  RAM tier: and Y microseconds of latency per transfer\n"
           "  --timeline OUT.png   draw a timeline of four decode steps (tiered runs)\n"
           "  --kv-syscall-submit  disk tier: submit reads by syscall instead of through a\n"
           "                       kernel thread polling the ring (store.sq_poll says which ran)\n"
           "  --kv-sq-cpu N        disk tier: run that polling thread on CPU N (for example\n"
           "                       with the decode thread kept elsewhere by taskset)\n"
           "  --kv-disk-io P       disk tier: auto, io_uring or pread (default auto: io_uring,\n"
           "                       pread threads where it is refused; store.disk_io says which\n"
           "                       ran; KVPRED_DISK_IO=io_uring|pread sets auto's choice)\n"
           "  --paired             tiered runs: also fill an untiered cache with the same policy\n"
           "                       and decode the two in alternating chunks of %d tokens, so\n"
           "                       both see the same host (JSON: paired)\n"
           "  --json               print one JSON object\n%s\n%s",
           PAIR_CHUNK, cli_policy_flags_help(), cli_model_flags_help);
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

/* The context for the run, with the tiered-store fields of cp. Prints the error, returns NULL. */
static kvp_ctx *open_ctx(const kvp_model *m, const struct cli_model_opts *o, long n_ctx,
                         struct kvp_ctx_params cp)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    struct kvp_ctx_params shared = cli_ctx_params(o, n_ctx);
    cp.n_ctx = shared.n_ctx;
    cp.n_threads = shared.n_threads;
    cp.block_size = shared.block_size;
    cp.n_batch = shared.n_batch;
    cp.type_k = shared.type_k;
    cp.type_v = shared.type_v;
    if (cp.n_ctx > info.n_ctx_train)
        cli_warn("context %d is longer than the model's training context %d: quality beyond it "
                 "is not meaningful",
                 cp.n_ctx, info.n_ctx_train);
    struct kvp_err err = {0};
    kvp_ctx *c = NULL;
    if (kvp_ctx_init(m, &cp, &c, &err) < 0) {
        cli_fail_err(&err);
        return NULL;
    }
    return c;
}

/* The store's counters per decoded token, as one JSON object (fields documented inline). */
static cJSON *store_json(const struct kvp_store_stats *s)
{
    double n = s->steps ? (double)s->steps : 1;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tokens", (double)s->steps);            /* decode steps counted */
    cJSON_AddNumberToObject(o, "hot_bytes", (double)s->hot_bytes);     /* hot tier + staging */
    cJSON_AddNumberToObject(o, "cold_bytes", (double)s->cold_bytes);   /* the whole cache */
    cJSON_AddNumberToObject(o, "unit_bytes", (double)s->unit_bytes);   /* one (layer, block) */
    cJSON_AddBoolToObject(o, "sq_poll", s->sq_poll); /* disk reads go through a polling thread */
    if (s->disk_io) /* disk tier: "io_uring" or "pread" (io_uring refused, or asked for) */
        cJSON_AddStringToObject(o, "disk_io", disk_io_names[s->disk_io]);
    cJSON_AddNumberToObject(o, "step_ms", s->step_s / n * 1e3);        /* mean wall per token */
    cJSON_AddNumberToObject(o, "compute_ms", s->compute_s / n * 1e3);  /* step - predict - wait */
    cJSON_AddNumberToObject(o, "predict_ms", s->predict_s / n * 1e3);  /* next-step prediction */
    cJSON_AddNumberToObject(o, "transfer_ms", s->transfer_s / n * 1e3);/* any I/O in flight */
    cJSON_AddNumberToObject(o, "wait_ms", s->wait_s / n * 1e3);        /* stalled on transfers */
    cJSON_AddNumberToObject(o, "hits", (double)s->hits / n);           /* needed units hot */
    cJSON_AddNumberToObject(o, "late", (double)s->late / n);           /* hits still in flight */
    cJSON_AddNumberToObject(o, "misses", (double)s->misses / n);       /* fetched on demand */
    cJSON_AddNumberToObject(o, "hit_rate", s->hits + s->misses
                                               ? (double)s->hits / (double)(s->hits + s->misses)
                                               : 1.0);
    cJSON_AddNumberToObject(o, "prefetched", (double)s->prefetched / n); /* units read ahead */
    cJSON_AddNumberToObject(o, "overflow", (double)s->overflow / n);   /* past a full hot tier */
    cJSON_AddNumberToObject(o, "bytes_read", (double)s->bytes_read / n);
    cJSON_AddNumberToObject(o, "bytes_written", (double)s->bytes_written / n);
    cJSON_AddNumberToObject(o, "reads", (double)s->reads / n);         /* I/O requests */
    cJSON_AddNumberToObject(o, "misaligned", (double)s->misaligned);   /* total; must be 0 */
    /* a busy host (disk tier): where the time went and who moved the requests */
    cJSON_AddNumberToObject(o, "runq_ms", s->runq_s / n * 1e3);       /* decode thread runnable */
    cJSON_AddNumberToObject(o, "sq_runq_ms", s->sq_runq_s / n * 1e3); /* polling thread runnable */
    cJSON_AddNumberToObject(o, "sq_cpu_ms", s->sq_cpu_s / n * 1e3);   /* polling thread on a CPU */
    cJSON_AddNumberToObject(o, "wait_sleep_ms", s->wait_sleep_s / n * 1e3); /* of wait: asleep */
    cJSON_AddNumberToObject(o, "wait_sleeps", (double)s->wait_sleeps / n);
    cJSON_AddNumberToObject(o, "sq_unpicked", (double)s->sq_unpicked / n);
    cJSON_AddNumberToObject(o, "direct_requests", (double)s->direct_requests / n);
    cJSON_AddNumberToObject(o, "bypasses", (double)s->bypasses);       /* total */
    cJSON_AddNumberToObject(o, "direct_submits", (double)s->direct_submits / n);
    /* faults and integrity (docs/store.md): totals, and the checksums' time per token */
    cJSON_AddNumberToObject(o, "retries", (double)s->retries);
    cJSON_AddNumberToObject(o, "bad_checksums", (double)s->bad_checksums);
    cJSON_AddNumberToObject(o, "lost_units", (double)s->lost_units);
    cJSON_AddNumberToObject(o, "checksum_ms", s->checksum_s / n * 1e3);
    return o;
}

int cmd_bench(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    long n_decode = 128, n_prefill = 512, reps = 3, hot_budget = 0, sq_cpu = -1;
    double bandwidth = 0, link_gbps = 0, link_us = 0;
    bool json = false, paired = false, syscall_submit = false;
    struct kvp_policy_params pp = {0};
    const char *budget_arg = NULL, *timeline = NULL;
    int tier = KVP_TIER_NONE, prefetch = KVP_PREFETCH_DEFAULT, disk_io = KVP_DISK_IO_AUTO;
    const char *kv_dir = NULL, *kv_url = NULL;
    const struct cli_flag flags[] = {
        CLI_INT("-n", 1, 1 << 20, &n_decode, "a positive token count"),
        CLI_INT("--prefill", 1, 1 << 24, &n_prefill, "a positive token count"),
        CLI_INT("-r|--reps", 1, 1000, &reps, NULL),
        CLI_FLOAT("--bandwidth", 0.001, 1e6, &bandwidth, "a positive GB/s value"),
        CLI_STR("--policy", &pp.name),
        CLI_STR("--budget", &budget_arg),
        CLI_CHOICE("--kv-tier", tier_names, KVP_TIER_RAM, &tier, "ram, disk or redis"),
        CLI_STR("--kv-dir", &kv_dir),
        CLI_STR("--kv-url", &kv_url),
        CLI_INT("--hot-budget", 1, 1 << 24, &hot_budget, "a positive token count"),
        CLI_CHOICE("--prefetch", prefetch_names, KVP_PREFETCH_NONE, &prefetch,
                   "dense, none, layer or token"),
        CLI_FLOAT("--link-gbps", 0.001, 1e6, &link_gbps, "a positive GB/s value"),
        CLI_FLOAT("--link-latency-us", 0, 1e7, &link_us, "a latency in microseconds"),
        CLI_STR("--timeline", &timeline),
        CLI_BOOL("--paired", &paired),
        CLI_BOOL("--kv-syscall-submit", &syscall_submit),
        CLI_INT("--kv-sq-cpu", 0, 4095, &sq_cpu, "a CPU number"),
        CLI_CHOICE("--kv-disk-io", disk_io_names, KVP_DISK_IO_AUTO, &disk_io,
                   "auto, io_uring or pread"),
        CLI_BOOL("--json", &json),
        {0},
    };
    const struct cli_command cmd = {
        .name = "bench",
        .mo = &mo,
        .pp = &pp,
        .flags = flags,
        .help = help,
        .budget = &budget_arg,
    };
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    if (mo.n_threads <= 0)
        mo.n_threads = 1;
    if (budget_arg && !pp.name)
        return cli_fail("--budget needs --policy");
    if (tier == KVP_TIER_NONE && (kv_dir || hot_budget || prefetch || link_gbps || link_us ||
                                  timeline || paired || syscall_submit || sq_cpu >= 0))
        return cli_fail("--kv-dir, --hot-budget, --prefetch, --link-*, --timeline, --paired, "
                        "--kv-syscall-submit and --kv-sq-cpu need --kv-tier");
    if ((tier == KVP_TIER_REDIS) != (kv_url != NULL))
        return cli_fail("--kv-tier redis and --kv-url go together");
    if (sq_cpu >= 0 && (tier != KVP_TIER_DISK || syscall_submit))
        return cli_fail("--kv-sq-cpu needs --kv-tier disk without --kv-syscall-submit");
    if (disk_io && tier != KVP_TIER_DISK)
        return cli_fail("--kv-disk-io needs --kv-tier disk");
    if (!pp.name && tier != KVP_TIER_NONE && prefetch != KVP_PREFETCH_DENSE)
        cli_warn("without --policy every layer is dense and stays hot: nothing is tiered "
                 "unless --prefetch dense");
    struct kvp_ctx_params cp = {.kv_tier = tier, .kv_dir = kv_dir, .kv_url = kv_url,
                                .hot_budget = (int)hot_budget,
                                .prefetch = prefetch, .link_gbps = link_gbps,
                                .link_latency_us = link_us,
                                .kv_syscall_submit = syscall_submit,
                                .kv_sq_pin = sq_cpu >= 0, .kv_sq_cpu = (int)sq_cpu,
                                .kv_disk_io = disk_io};
    int status = 1;
    int32_t *toks = NULL;
    float *logits = NULL;
    double *chunk_ratio = NULL;
    kvp_ctx *ctx = NULL, *ram = NULL; /* ram: the untiered twin of --paired */
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    long depth = mo.n_ctx > 0 ? mo.n_ctx : 512;
    if (n_prefill > depth)
        n_prefill = depth;
    long cap = depth + n_decode;
    if (!(ctx = open_ctx(m, &mo, cap, cp)))
        goto out;
    struct kvp_err err = {0};
    if (pp.name && kvp_ctx_set_policy(ctx, &pp, &err) < 0)
        goto fail_err;
    if (paired) {
        struct kvp_ctx_params untiered = {0};
        if (!(ram = open_ctx(m, &mo, cap, untiered)))
            goto out;
        if (pp.name && kvp_ctx_set_policy(ram, &pp, &err) < 0)
            goto fail_err;
    }
    long n_chunks = (n_decode + PAIR_CHUNK - 1) / PAIR_CHUNK;
    chunk_ratio = malloc((size_t)(reps * n_chunks) * sizeof(double));
    toks = malloc((size_t)cap * sizeof(int32_t));
    logits = malloc((size_t)in.n_vocab * sizeof(float));
    if (!toks || !logits || !chunk_ratio) {
        cli_fail("out of memory");
        goto out;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* fixed pseudo-random token ids */
    for (long i = 0; i < cap; i++)
        toks[i] = (int32_t)(kvp_xorshift64(&x) % (uint64_t)in.n_vocab);
    toks[0] = kvp_token_bos(m);

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
    kvp_ctx_store_reset_stats(ctx);
    double t0 = kvp_time_now();
    if (kvp_eval(ctx, toks, (int)depth, logits, false, &err) < 0)
        goto fail_err;
    double fill_s = kvp_time_now() - t0;
    /* of the fill, the time with cold-tier transfers in flight: the prefill waits for each
     * layer's writes and reads, so this is what the tier adds to the forward pass */
    struct kvp_store_stats fill_st = {0};
    bool fill_tiered = kvp_ctx_store_stats(ctx, &fill_st) == 0;
    if (ram && kvp_eval(ram, toks, (int)depth, logits, false, &err) < 0)
        goto fail_err;
    double tg_sum = 0, tg_best = 0, decode_s = 0, decode_cpu = 0, ram_s = 0;
    double decode_tcpu = 0, ram_cpu = 0, ram_tcpu = 0; /* --paired: CPU of each side */
    long n_ratio = 0;
    long tl0 = n_decode >= 12 ? 8 : 0, tl1 = tl0 + 4 < n_decode ? tl0 + 4 : n_decode;
    kvp_ctx_store_reset_stats(ctx);
    kvp_ctx_policy_reset_seconds(ctx);
    for (long r = 0; r < reps; r++) {
        if (tier != KVP_TIER_NONE && r > 0) {
            kvp_ctx_reset(ctx);
            if (kvp_eval(ctx, toks, (int)depth, logits, false, &err) < 0)
                goto fail_err;
        } else {
            kvp_ctx_truncate(ctx, (int)depth);
        }
        if (ram)
            kvp_ctx_truncate(ram, (int)depth);
        double dt = 0;
        for (long i0 = 0; i0 < n_decode; i0 += PAIR_CHUNK) {
            long i1 = i0 + PAIR_CHUNK < n_decode ? i0 + PAIR_CHUNK : n_decode;
            t0 = kvp_time_now();
            double c0 = kvp_cpu_time(), tc0 = kvp_thread_cpu_time();
            for (long i = i0; i < i1; i++) {
                if (timeline && r == 0 && i == tl0)
                    kvp_ctx_store_timeline(ctx, true);
                if (kvp_eval(ctx, toks + depth + i, 1, logits, false, &err) < 0)
                    goto fail_err;
                if (timeline && r == 0 && i + 1 == tl1)
                    kvp_ctx_store_timeline(ctx, false);
            }
            double t1 = kvp_time_now(), c1 = kvp_cpu_time(), tc1 = kvp_thread_cpu_time();
            dt += t1 - t0;
            decode_cpu += c1 - c0;
            decode_tcpu += tc1 - tc0;
            if (!ram)
                continue;
            for (long i = i0; i < i1; i++)
                if (kvp_eval(ram, toks + depth + i, 1, logits, false, &err) < 0)
                    goto fail_err;
            double t2 = kvp_time_now();
            ram_cpu += kvp_cpu_time() - c1;
            ram_tcpu += kvp_thread_cpu_time() - tc1;
            ram_s += t2 - t1;
            chunk_ratio[n_ratio++] = (t1 - t0) / (t2 - t1);
        }
        double rate = n_decode / dt;
        decode_s += dt;
        tg_sum += rate;
        tg_best = rate > tg_best ? rate : tg_best;
    }
    /* the KV memory really held after the last step: physical blocks taken from the pool */
    size_t kv_pool = kvp_kvcache_pool_bytes(&ctx->kv);
    double tg_mean = tg_sum / reps;
    double pol_ms = pp.name ? 1e3 * kvp_ctx_policy_seconds(ctx) / ((double)reps * n_decode) : 0;
    double pol_cpu_ms =
        pp.name ? 1e3 * kvp_ctx_policy_cpu_seconds(ctx) / ((double)reps * n_decode) : 0;
    double cpu_ms = 1e3 * decode_cpu / ((double)reps * n_decode);
    struct kvp_store_stats ss = {0};
    bool tiered = kvp_ctx_store_stats(ctx, &ss) == 0;
    /* --paired: the twin's rate, the time ratio over every chunk, and its median chunk */
    double pair_rate = 0, pair_ratio = 0, pair_median = 0;
    if (ram) {
        qsort(chunk_ratio, (size_t)n_ratio, sizeof(double), cmp_double);
        pair_rate = (double)(reps * n_decode) / ram_s;
        pair_ratio = ram_s > 0 ? decode_s / ram_s : 0;
        pair_median = chunk_ratio[n_ratio / 2];
    }
    double per_tok = 1e3 / ((double)reps * n_decode);
    if (timeline && kvp_ctx_store_timeline_png(ctx, timeline, &err) < 0)
        goto fail_err;
    if (bandwidth <= 0)
        bandwidth = measure_bandwidth((int)mo.n_threads);
    int type_k = kvp_ctx_kv_type_k(ctx), type_v = kvp_ctx_kv_type_v(ctx);
    double kv_per_token = (double)kvp_kv_bytes_per_token(m, type_k, type_v, (int)mo.block_size);
    double kv_bytes = kv_per_token * (double)(depth + n_decode / 2);
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
        cJSON_AddStringToObject(o, "prefill_gemm",
                                kvp_gemm_wants(KVP_TYPE_Q8_0, 2) ? "int8" : "sgemm");
        cJSON_AddNumberToObject(o, "fill_seconds", fill_s);
        if (fill_tiered)
            cJSON_AddNumberToObject(o, "fill_transfer_seconds", fill_st.transfer_s);
        cJSON_AddNumberToObject(o, "decode_tokens_per_s", tg_mean);
        cJSON_AddNumberToObject(o, "decode_tokens_per_s_best", tg_best);
        cJSON_AddNumberToObject(o, "decode_ms_per_token", 1e3 / tg_mean);
        /* process CPU time (every thread) per decoded token: steadier than wall time on a
         * shared host, and it counts the cost of transfer threads and I/O submission */
        cJSON_AddNumberToObject(o, "decode_cpu_ms_per_token", cpu_ms);
        cJSON_AddNumberToObject(o, "weight_bytes", (double)in.weight_bytes);
        cJSON_AddStringToObject(o, "weight_type", kvp_type_name(in.weight_type));
        /* kv_type_k, kv_type_v: the KV cache's element types (f32, f16, bf16, q8_0);
         * kv_bytes_per_token: K and V of one token, all layers and KV heads (block padding
         * included); kv_bytes_at_ctx: that times the context the run fills (ctx + n_decode);
         * kv_bytes_per_step: the KV a dense step reads, at the run's mean depth */
        cJSON_AddStringToObject(o, "kv_type_k", kvp_kv_type_name(type_k));
        cJSON_AddStringToObject(o, "kv_type_v", kvp_kv_type_name(type_v));
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", kv_per_token);
        cJSON_AddNumberToObject(o, "kv_bytes_at_ctx", kv_per_token * (double)cap);
        cJSON_AddNumberToObject(o, "kv_bytes_per_step", kv_bytes);
        cJSON_AddNumberToObject(o, "bandwidth_gbps", bandwidth);
        cJSON_AddNumberToObject(o, "floor_decode_tokens_per_s", floor_tps);
        cJSON_AddNumberToObject(o, "fraction_of_floor", floor_tps > 0 ? tg_mean / floor_tps : 0);
        /* policy: the selection policy or "none" (dense attention); budget: as given (tokens,
         * or a fraction of the context), null without a policy */
        cJSON_AddStringToObject(o, "policy", pp.name ? pp.name : "none");
        if (budget_arg)
            cJSON_AddStringToObject(o, "budget", budget_arg);
        else
            cJSON_AddNullToObject(o, "budget");
        /* kv_tier: none, ram, disk or redis; prefetch: dense/none/layer/token (null when
         * untiered); hot_budget: --hot-budget tokens per layer (0: sized from the budget);
         * link_gbps, link_latency_us: the modelled link (0: off) */
        /* policy_ms_per_token: time inside the policy's select/on_step hooks per token (thread
         * time summed over KV heads); policy_share: its fraction of the decode time */
        if (pp.name) {
            cJSON_AddNumberToObject(o, "policy_ms_per_token", pol_ms);
            cJSON_AddNumberToObject(o, "policy_share", pol_ms * tg_mean / 1e3);
            /* the same in CPU time of the threads that ran the hooks, against
             * decode_cpu_ms_per_token (steadier on a shared host) */
            cJSON_AddNumberToObject(o, "policy_cpu_ms_per_token", pol_cpu_ms);
            cJSON_AddNumberToObject(o, "policy_cpu_share", cpu_ms > 0 ? pol_cpu_ms / cpu_ms : 0);
        }
        /* kv_resident_bytes: KV bytes (K and V, all layers) in the physical blocks the cache
         * holds after the last decode step, taken from its block pool; null when tiered (the
         * store's hot_bytes and cold_bytes say what it holds) */
        if (tiered)
            cJSON_AddNullToObject(o, "kv_resident_bytes");
        else
            cJSON_AddNumberToObject(o, "kv_resident_bytes", (double)kv_pool);
        cJSON_AddStringToObject(o, "kv_tier", tier_names[tier]);
        if (tiered)
            cJSON_AddStringToObject(o, "prefetch", prefetch_names[prefetch ? prefetch : 4]);
        else
            cJSON_AddNullToObject(o, "prefetch");
        cJSON_AddNumberToObject(o, "hot_budget", (double)hot_budget);
        cJSON_AddNumberToObject(o, "link_gbps", link_gbps);
        cJSON_AddNumberToObject(o, "link_latency_us", link_us);
        /* store (tiered runs only, else null): means per decoded token over every repetition:
         *   tokens          decode steps counted
         *   hot_bytes       hot tier including the one-layer prefill staging area
         *   cold_bytes      cold tier (the whole cache); unit_bytes: one (layer, block) unit
         *   step_ms         wall time of a step = compute_ms + predict_ms + wait_ms
         *   compute_ms      the forward pass itself
         *   predict_ms      next-step prediction on the critical path (layer, token modes)
         *   transfer_ms     time with at least one cold-tier read or write in flight
         *   wait_ms         stalls waiting for prefetches and on-demand fetches
         *   hits, late      selected units already hot (late: prefetch still in flight)
         *   misses          selected units fetched on demand; hit_rate = hits/(hits+misses)
         *   prefetched      units read ahead of need
         *   overflow        units read past a full hot tier (raise --hot-budget if not 0)
         *   bytes_read, bytes_written, reads   cold-tier traffic and I/O requests
         *   misaligned      disk requests not 4 KiB aligned (total; always 0)
         *   sq_poll         disk tier: a kernel thread polls the ring for reads (false: the
         *                   kernel refused it, or --kv-syscall-submit)
         *   runq_ms         the decode thread runnable but not running (schedstat), per token
         *   sq_runq_ms, sq_cpu_ms   the polling thread waiting for a CPU and on one, per token
         *   wait_sleep_ms   of wait_ms, asleep in the kernel for a completion; wait_sleeps: such
         *                   waits per token
         *   sq_unpicked     waits per token that found requests the polling thread had not
         *                   taken yet
         *   direct_requests requests per token the decode thread submitted itself, bypassing
         *                   the polling thread (busy host); bypasses: switches to that (total);
         *                   direct_submits: the system calls per token that submitted them
         *   disk_io         disk tier only: "io_uring", or "pread" (io_uring refused by the
         *                   kernel or a seccomp profile, or --kv-disk-io pread)
         *   retries, bad_checksums, lost_units   faults met (totals; docs/store.md)
         *   checksum_ms     computing and checking unit checksums, per token */
        if (tiered)
            cJSON_AddItemToObject(o, "store", store_json(&ss));
        else
            cJSON_AddNullToObject(o, "store");
        /* paired (--paired, else null): the same decode on an untiered cache, alternating:
         *   ram_tokens_per_s   untiered decode tokens/s over the same tokens
         *   ratio              tiered time / untiered time (1.2 = tiered 1.2x slower)
         *   ratio_median       median of that ratio over the chunks of PAIR_CHUNK tokens
         *   thread_cpu_ms_per_token      CPU time of the decode thread alone in the tiered
         *                                chunks (decode_cpu_ms_per_token: every thread)
         *   ram_cpu_ms_per_token, ram_thread_cpu_ms_per_token   the same two in the untiered
         *                                chunks (every thread; the decode thread)
         *   cpu_ratio          decode_cpu_ms_per_token / ram_cpu_ms_per_token: what the tier
         *                      costs in CPU, which a busy host does not change much */
        if (ram) {
            cJSON *pj = cJSON_AddObjectToObject(o, "paired");
            cJSON_AddNumberToObject(pj, "ram_tokens_per_s", pair_rate);
            cJSON_AddNumberToObject(pj, "ratio", pair_ratio);
            cJSON_AddNumberToObject(pj, "ratio_median", pair_median);
            cJSON_AddNumberToObject(pj, "thread_cpu_ms_per_token", decode_tcpu * per_tok);
            cJSON_AddNumberToObject(pj, "ram_cpu_ms_per_token", ram_cpu * per_tok);
            cJSON_AddNumberToObject(pj, "ram_thread_cpu_ms_per_token", ram_tcpu * per_tok);
            cJSON_AddNumberToObject(pj, "cpu_ratio", ram_cpu > 0 ? decode_cpu / ram_cpu : 0);
        } else {
            cJSON_AddNullToObject(o, "paired");
        }
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
    } else {
        printf("model %s, %ld thread(s), SIMD %s, KV %s/%s (%.0f bytes/token)\n", in.name,
               mo.n_threads, kvp_simd()->name, kvp_kv_type_name(type_k),
               kvp_kv_type_name(type_v), kv_per_token);
        printf("prefill  %6ld tokens: %10.1f tokens/s (best of %ld)\n", n_prefill, pp_best, reps);
        printf("fill     %6ld tokens: %10.3f s", depth, fill_s);
        if (fill_tiered)
            printf(" (%.3f s with cold-tier transfers in flight)", fill_st.transfer_s);
        printf("\n");
        printf("decode at %ld: %10.1f tokens/s mean, %.1f best (%.3f ms/token, %.3f ms CPU)\n",
               depth, tg_mean, tg_best, 1e3 / tg_mean, cpu_ms);
        printf("floor    %.1f tokens/s = %.1f GB/s / (%.2f MB weights + %.2f MB KV)\n", floor_tps,
               bandwidth, in.weight_bytes / 1e6, kv_bytes / 1e6);
        if (pp.name)
            printf("policy   %s, budget %s: %.3f ms/token in select/on_step, %.1f%% of decode\n",
                   pp.name, budget_arg ? budget_arg : "all", pol_ms, 100 * pol_ms * tg_mean / 1e3);
        if (!tiered)
            printf("KV       %zu bytes resident after the last step\n", kv_pool);
        if (tiered) {
            double n = ss.steps ? (double)ss.steps : 1;
            printf("store    %s tier, prefetch %s: per token %.3f ms compute, %.3f predict, "
                   "%.3f wait, %.3f transfer; %.1f hits, %.1f misses, %.0f KB read\n",
                   tier_names[tier], prefetch_names[prefetch ? prefetch : 4],
                   ss.compute_s / n * 1e3, ss.predict_s / n * 1e3, ss.wait_s / n * 1e3,
                   ss.transfer_s / n * 1e3, ss.hits / n, ss.misses / n, ss.bytes_read / n / 1e3);
        }
        if (ram)
            printf("paired   untiered %.1f tokens/s in alternating chunks of %d: tiered/untiered "
                   "time %.3f (median chunk %.3f)\n",
                   pair_rate, PAIR_CHUNK, pair_ratio, pair_median);
    }
    status = 0;
    goto out;
fail_err:
    cli_fail_err(&err);
out:
    free(chunk_ratio);
    kvp_ctx_free(ram);
    free(logits);
    free(toks);
    kvp_ctx_free(ctx);
    kvp_model_close(m);
    return status;
}
