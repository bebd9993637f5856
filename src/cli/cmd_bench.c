/*
 * `kvpred bench`: prefill and decode speed, and the memory-bandwidth floor they are compared to.
 *
 * Prefill: P tokens (default 512, at most CTX) from an empty cache, best of R runs. Decode: the
 * cache is filled with CTX tokens first (timed, "fill"), one token is decoded untimed (the
 * warm-up, as llama-bench's: the first step after a fill touches memory the fill did not, such as
 * a policy's metadata tile for the new block, 8-40 ms of page faults at 131072 tokens, which
 * would be spread over the timed tokens; its time is reported as warmup_ms), then N tokens are
 * decoded one at a time; this repeats R times from the same filled cache (the cache is truncated
 * back to CTX), and the mean and best rates are reported. Token ids are deterministic
 * pseudo-random ids.
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
 * a truncation, and the hot tier does not hold every block), take no warm-up token for the same
 * reason (their first timed token pays what it pays), and report the store's counters
 * per decoded token; --timeline OUT.png draws tokens 8..11 of the first repetition.
 *
 * Long contexts: --fill tile prefills only the first --fill-source tokens for real (the ids of
 * --fill-text when given, as for a plain prefill), grows the cache to CTX - FILL_TAIL by tiling
 * them with the keys turned to their new positions (kvp_ctx_fill_tile), and evaluates the last
 * FILL_TAIL tokens for real, so the cache ends as a prompt does: the policy sees real attention
 * rows and a real last query. A plain prefill ends with those tokens as a piece of its own too.
 * A 128K-token cache of SmolLM2-135M's shape fills in under a minute instead of hours.
 *
 * Several policies from one fill: each --policy starts an entry, and the policy flags after it
 * are its own. The cache is filled once without a policy up to its last FILL_TAIL tokens; each
 * entry then truncates back to there, attaches its policy to the kept cache
 * (kvp_ctx_set_policy_keep), evaluates the last FILL_TAIL tokens (so it sees the prompt's last
 * queries and attention rows as with its policy set from the start) and decodes; one result per
 * entry. A real prefill of 131072 tokens takes minutes, the tail and each decode seconds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "cli/prefill_opts.h"
#include "cli/tier_opts.h"
#include "core/fnv.h"
#include "core/platform.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kernels/prefill_gemm.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "kvpred_lab.h"
#include "policy/policy.h"

static const char *const fill_names[] = {"prefill", "tile", NULL};

/* The last tokens of a fill, evaluated for real as a prompt piece of their own: after a tiled
 * part the policies' observation window (32 by default) sees real queries, and with several
 * policies each one evaluates them again on the shared rest of the fill (the head), so that it
 * sees the prompt's last queries as it would with one policy set from the start. */
#define FILL_TAIL 32

/* How the cache is filled to depth before decode: a prefill of toks[0..depth - FILL_TAIL), or
 * (tile) a prefill of toks[0..src) tiled to depth - FILL_TAIL; then a prefill of the rest. */
struct fill_plan {
    int mode; /* 0 prefill, 1 tile */
    long src;
};

/* The leading tokens a fill evaluates for real: all of the depth, or tile's source. */
static long fill_real_tokens(const struct fill_plan *f, long depth)
{
    return f->mode ? f->src : depth;
}

/* Tokens the head of a fill leaves in the cache (the tail evaluates the rest). */
static long fill_head_tokens(long depth)
{
    return depth > FILL_TAIL ? depth - FILL_TAIL : 0;
}

static int fill_head(kvp_ctx *c, const int32_t *toks, long depth, const struct fill_plan *f,
                     struct kvp_err *err)
{
    const long head = fill_head_tokens(depth);
    if (!f->mode || depth <= f->src + FILL_TAIL)
        return head > 0 ? kvp_eval(c, toks, (int)head, NULL, false, err) : 0;
    int rc = kvp_eval(c, toks, (int)f->src, NULL, false, err);
    return rc < 0 ? rc : kvp_ctx_fill_tile(c, (int)head, err);
}

static int fill_tail(kvp_ctx *c, const int32_t *toks, long depth, float *logits,
                     struct kvp_err *err)
{
    const long head = fill_head_tokens(depth);
    return kvp_eval(c, toks + head, (int)(depth - head), logits, false, err);
}

static int fill_cache(kvp_ctx *c, const int32_t *toks, long depth, const struct fill_plan *f,
                      float *logits, struct kvp_err *err)
{
    int rc = fill_head(c, toks, depth, f, err);
    return rc < 0 ? rc : fill_tail(c, toks, depth, logits, err);
}

/* Most --policy entries in one run. */
#define MAX_POLICIES 16

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
           "  -n N                 decode tokens per run (default 128), timed after one\n"
           "                       untimed warm-up token (untiered runs; warmup_ms)\n"
           "  --prefill N          prefill tokens timed from an empty cache (default 512)\n"
           "  -r, --reps N         repetitions (default 3)\n"
           "  --bandwidth GBPS     memory bandwidth for the floor (default: measured)\n"
           "  --policy NAME        KV selection policy (default: none, dense attention); its\n"
           "                       select/on_step hooks are timed (policy_ms_per_token,\n"
           "                       policy_share)\n"
           "  --budget B           policy budget: tokens per (layer, KV head), or a fraction of\n"
           "                       the context (0.0625 or 1/16)\n"
           "  several --policy     decode each from one fill (--policy none: dense attention):\n"
           "                       the policy flags after a --policy (--budget, --dense-layers,\n"
           "                       --policy-opts, --aux, ...) are its own, those before the\n"
           "                       first are every entry's; the cache is filled once up to its\n"
           "                       last %d tokens, then each entry goes back there, attaches its\n"
           "                       policy, evaluates those tokens and decodes: one result (JSON\n"
           "                       line) each, as a run of that policy alone would give (not\n"
           "                       evicting policies, tiers, --paired, sliding-window models)\n"
           "%s"
           "                       (JSON: store.sq_poll and store.disk_io say which path ran)\n"
           "  --link-gbps X        RAM tier: model a link of X GB/s\n"
           "  --link-latency-us Y  RAM tier: and Y microseconds of latency per transfer\n"
           "  --timeline OUT.png   draw a timeline of four decode steps (tiered runs)\n"
           "  --paired             tiered runs: also fill an untiered cache with the same policy\n"
           "                       and decode the two in alternating chunks of %d tokens, so\n"
           "                       both see the same host (JSON: paired)\n"
           "  --fill F             prefill (default) or tile: prefill --fill-source tokens for\n"
           "                       real, tile their KV to CTX - %d with the keys re-rotated to\n"
           "                       their new positions, then prefill the last %d (long contexts\n"
           "                       in seconds; JSON fill, fill_seconds); a prefill also takes\n"
           "                       those last tokens as a piece of their own\n"
           "  --fill-source N      --fill tile: tokens prefilled for real (default 4096)\n"
           "  --fill-text FILE     take the tokens prefilled for real from this text (--fill\n"
           "                       prefill: the whole depth; tile: the --fill-source tokens),\n"
           "                       pseudo-random ids past its end (default: all pseudo-random)\n"
           "  --json               print one JSON object\n"
           "  --prefill-only       time the --prefill repetitions alone: no fill to -c, no\n"
           "                       decode (long prompts; JSON: the prefill's fields)\n"
           "%s%s\n%s",
           FILL_TAIL, cli_tier_flags_help, PAIR_CHUNK, FILL_TAIL, FILL_TAIL, cli_prefill_flags_help,
           cli_policy_flags_help(),
           cli_model_flags_help_sans_ctx);
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

/* The command line. */
struct bench_opts {
    struct cli_model_opts mo;
    struct kvp_policy_params pp;
    const char *budget_arg; /* --budget as given (the JSON repeats it) */
    /* every --policy entry, its own flags applied (pol[0] is pp and budget_arg); index: the
     * entry this copy of the options decodes */
    struct kvp_policy_params pol[MAX_POLICIES];
    const char *pol_budget[MAX_POLICIES];
    int n_pol, index;
    long n_decode, n_prefill, reps;
    long depth;       /* tokens in the cache when decode is timed (-c; default 512) */
    double bandwidth; /* GB/s for the floor (0: measure it) */
    struct cli_tier_opts to;
    struct cli_prefill_opts pf;
    double link_gbps, link_us; /* RAM tier: the modelled link (0: off) */
    const char *timeline;      /* --timeline OUT.png */
    bool paired, json;
    bool prefill_only;         /* --prefill-only: the prefill repetitions, no fill nor decode */
    int fill_mode;             /* --fill: 0 prefill, 1 tile */
    long fill_src;             /* --fill-source */
    const char *fill_text;     /* --fill-text */
    struct fill_plan fill;     /* what fills the cache, from the three above */
};

/* What a run measured, and what the printers derive it from. */
struct bench_result {
    struct kvp_model_info in;
    double pp_best, fill_s;    /* prefill tokens/s (best run); seconds to fill to depth */
    struct cli_prefill_report pf; /* what the best prefill run's attention did */
    struct cli_prefill_report fill_pf; /* what the fill's attention did */
    uint64_t logits_fnv;       /* FNV-1a of the last decoded token's logits */
    bool fill_tiered;          /* fill_transfer_s is the tier's */
    double fill_transfer_s;    /* of the fill, the time with cold-tier transfers in flight */
    double tg_mean, tg_best;   /* decode tokens/s, mean and best of the repetitions */
    double cpu_ms;             /* process CPU time per decoded token */
    double pol_ms, pol_cpu_ms; /* time and CPU time in the policy's hooks per token */
    size_t packed_bytes;       /* the weights packed for decode (kvp_ctx_pack_weights) */
    double warmup_ms;          /* the untimed warm-up token (-1: none, tiered) */
    size_t kv_resident;        /* untiered: KV bytes in the blocks held after the last step */
    size_t kv_windowed;        /* of those, the sliding-window layers' (their rings) */
    double attn_w_ms, attn_g_ms; /* attention phase per token: sliding-window, other layers */
    bool tiered;               /* the store's counters in ss */
    struct kvp_store_stats ss;
    bool paired; /* --paired: the untiered twin's figures below */
    double pair_rate, pair_ratio, pair_median;
    double tcpu_ms, ram_cpu_ms, ram_tcpu_ms, cpu_ratio; /* per token (see print_json) */
    int type_k, type_v;
    double bandwidth, kv_per_token, kv_bytes, floor_tps; /* the floor and what it counts */
    double kv_read, meta_flat, read_floor; /* bytes a step reads (print_json) and their floor */
};

/* Take the policy flags out of argv into o's entries (each --policy starts one, copying the
 * flags given before the first) and the rest into rest[0..*n_rest). 0, or 1 after printing the
 * error. */
static int split_policy_flags(struct bench_opts *o, int argc, char **argv, char **rest,
                              int *n_rest)
{
    struct kvp_policy_params shared = {0};
    const char *shared_budget = NULL;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const bool pol = !strcmp(argv[i], "--policy"), bud = !strcmp(argv[i], "--budget");
        if ((pol || bud) && i + 1 >= argc)
            return cli_fail("%s needs a value", argv[i]);
        if (pol && o->n_pol == MAX_POLICIES)
            return cli_fail("--policy: at most %d in one run", MAX_POLICIES);
        if (pol) {
            const char *name = strcmp(argv[++i], "none") ? argv[i] : NULL;
            o->pol[o->n_pol] = shared;
            o->pol[o->n_pol].name = name;
            o->pol_budget[o->n_pol++] = name ? shared_budget : NULL; /* none: dense */
            continue;
        }
        if (bud) {
            *(o->n_pol ? &o->pol_budget[o->n_pol - 1] : &shared_budget) = argv[++i];
            continue;
        }
        int r = i == 0 ? 0
                       : cli_policy_flag(o->n_pol ? &o->pol[o->n_pol - 1] : &shared, false,
                                         argc, argv, &i);
        if (r < 0)
            return 1;
        if (r == 0)
            rest[n++] = argv[i];
    }
    *n_rest = n;
    if (!o->n_pol) { /* no --policy: dense, and the flags stand alone as before */
        o->pol[0] = shared;
        o->pol_budget[0] = shared_budget;
    }
    for (int k = 0; k < (o->n_pol ? o->n_pol : 1); k++) {
        struct kvp_policy_params *pp = &o->pol[k];
        if (o->pol_budget[k] && !pp->name)
            return cli_fail("--budget needs --policy");
        if (pp->name && !cli_policy_known(pp->name))
            return cli_fail("--policy: unknown policy '%s' (known: %s)", pp->name,
                            cli_policy_names());
        if (o->pol_budget[k] && !cli_parse_budget(o->pol_budget[k], &pp->budget,
                                                  &pp->budget_ratio))
            return cli_fail("--budget: '%s' is not a token count or a ratio in (0, 1]",
                            o->pol_budget[k]);
    }
    o->pp = o->pol[0];
    o->budget_arg = o->pol_budget[0];
    if (o->n_pol < 2)
        return 0;
    for (int k = 0; k < o->n_pol; k++)
        for (int j = 0; o->pol[k].name && kvp_policy_registry[j]; j++)
            if (kvp_policy_registry[j]->evicting &&
                !strcmp(kvp_policy_registry[j]->name, o->pol[k].name))
                return cli_fail("--policy %s evicts tokens the next entry would need: run it "
                                "alone", o->pol[k].name);
    return 0;
}

/* Parse argv into o. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct bench_opts *o, int argc, char **argv)
{
    const struct cli_flag flags[] = {
        CLI_INT("-n", 1, 1 << 20, &o->n_decode, "a positive token count"),
        CLI_INT("--prefill", 1, 1 << 24, &o->n_prefill, "a positive token count"),
        CLI_INT("-r|--reps", 1, 1000, &o->reps, NULL),
        CLI_FLOAT("--bandwidth", 0.001, 1e6, &o->bandwidth, "a positive GB/s value"),
        CLI_STR("--policy", &o->pp.name),
        CLI_STR("--budget", &o->budget_arg),
        CLI_TIER_FLAGS(&o->to),
        CLI_PREFILL_FLAGS(&o->pf),
        CLI_FLOAT("--link-gbps", 0.001, 1e6, &o->link_gbps, "a positive GB/s value"),
        CLI_FLOAT("--link-latency-us", 0, 1e7, &o->link_us, "a latency in microseconds"),
        CLI_STR("--timeline", &o->timeline),
        CLI_BOOL("--paired", &o->paired),
        CLI_CHOICE("--fill", fill_names, 0, &o->fill_mode, "prefill or tile"),
        CLI_INT("--fill-source", 32, 1 << 24, &o->fill_src, "a token count of at least 32"),
        CLI_STR("--fill-text", &o->fill_text),
        CLI_BOOL("--json", &o->json),
        CLI_BOOL("--prefill-only", &o->prefill_only),
        {0},
    };
    char **rest = malloc((size_t)(argc + 1) * sizeof(char *));
    int n_rest = 0;
    if (!rest)
        return cli_fail("out of memory");
    int rc = split_policy_flags(o, argc, argv, rest, &n_rest);
    if (!rc) {
        struct kvp_policy_params none = {0};
        const char *no_budget = NULL;
        rc = cli_parse_policy_command("bench", &o->mo, &none, &no_budget, flags, help, n_rest,
                                      rest);
    }
    free(rest);
    if (rc)
        return rc;
    if (o->mo.n_threads <= 0)
        o->mo.n_threads = 1;
    o->depth = o->mo.n_ctx > 0 ? o->mo.n_ctx : 512;
    if (o->n_prefill > o->depth)
        o->n_prefill = o->depth;
    if (o->n_pol > 1 && (o->to.tier != KVP_TIER_NONE || o->paired || o->prefill_only))
        return cli_fail("several --policy: an untiered cache, without --paired or "
                        "--prefill-only");
    o->fill = (struct fill_plan){.mode = o->fill_mode,
                                 .src = o->fill_src < o->depth ? o->fill_src : o->depth};
    if (o->to.tier == KVP_TIER_NONE && (o->link_gbps || o->link_us || o->timeline || o->paired))
        return cli_fail("--link-gbps, --link-latency-us, --timeline and --paired need --kv-tier");
    if (cli_prefill_check(&o->pf))
        return 1;
    return cli_tier_check(&o->to, o->pp.name != NULL);
}

/* A context of cap tokens with o's policy, tiered as o says or untiered. NULL after printing
 * the error. */
static kvp_ctx *bench_ctx(const kvp_model *m, const struct bench_opts *o, long cap, bool tiered)
{
    struct kvp_ctx_params cp = cli_ctx_params(&o->mo, cap);
    if (tiered) {
        cli_tier_apply(&o->to, &cp);
        cp.link_gbps = o->link_gbps;
        cp.link_latency_us = o->link_us;
    }
    kvp_ctx *c = cli_open_ctx_params(m, &cp);
    struct kvp_err err = {0};
    /* (several policies: each is attached to the filled cache in turn, run_entries) */
    if (c && o->pp.name && o->n_pol < 2 && kvp_ctx_set_policy(c, &o->pp, &err) < 0) {
        cli_fail_err(&err);
        kvp_ctx_free(c);
        return NULL;
    }
    if (c && cli_prefill_apply(&o->pf, c)) {
        kvp_ctx_free(c);
        return NULL;
    }
    return c;
}

/* Prefill from an empty cache (best of the repetitions), then the timed fill to depth. */
static int time_prefill(const struct bench_opts *o, kvp_ctx *ctx, const int32_t *toks,
                        float *logits, struct bench_result *r, struct kvp_err *err)
{
    for (long k = 0; k < o->reps; k++) {
        kvp_ctx_reset(ctx);
        kvp_ctx_prefill_reset_stats(ctx);
        double t0 = kvp_time_now();
        if (kvp_eval(ctx, toks, (int)o->n_prefill, logits, false, err) < 0)
            return -1;
        double rate = o->n_prefill / (kvp_time_now() - t0);
        if (rate > r->pp_best)
            cli_prefill_take(ctx, r->in.n_layer, &r->pf);
        r->pp_best = rate > r->pp_best ? rate : r->pp_best;
    }
    if (o->prefill_only || o->n_pol > 1) /* several policies fill in run_entries */
        return 0;
    kvp_ctx_reset(ctx);
    kvp_ctx_store_reset_stats(ctx);
    kvp_ctx_prefill_reset_stats(ctx);
    double t0 = kvp_time_now();
    if (fill_cache(ctx, toks, o->depth, &o->fill, logits, err) < 0)
        return -1;
    r->fill_s = kvp_time_now() - t0;
    cli_prefill_take(ctx, r->in.n_layer, &r->fill_pf);
    /* of the fill, the time with cold-tier transfers in flight: the prefill waits for each
     * layer's writes and reads, so this is what the tier adds to the forward pass */
    struct kvp_store_stats fill_st = {0};
    r->fill_tiered = kvp_ctx_store_stats(ctx, &fill_st) == 0;
    r->fill_transfer_s = fill_st.transfer_s;
    return 0;
}

/* The decode repetitions from the filled cache; with --paired, the untiered twin ram (filled
 * too) decodes the same tokens in alternating chunks. chunk_ratio: room for one ratio a chunk. */
static int time_decode(const struct bench_opts *o, kvp_ctx *ctx, kvp_ctx *ram,
                       const int32_t *toks, float *logits, double *chunk_ratio,
                       struct bench_result *r, struct kvp_err *err)
{
    const long depth = o->depth, n_decode = o->n_decode, reps = o->reps;
    double tg_sum = 0, decode_s = 0, decode_cpu = 0, ram_s = 0;
    double decode_tcpu = 0, ram_cpu = 0, ram_tcpu = 0; /* --paired: CPU of each side */
    long n_ratio = 0;
    long tl0 = n_decode >= 12 ? 8 : 0, tl1 = tl0 + 4 < n_decode ? tl0 + 4 : n_decode;
    /* the weights are packed for decode before the clock runs, not by the first timed token */
    r->packed_bytes = kvp_ctx_pack_weights(ctx);
    if (ram)
        kvp_ctx_pack_weights(ram);
    /* one untimed token (see the top of the file); the first repetition truncates it away */
    r->warmup_ms = -1;
    if (o->to.tier == KVP_TIER_NONE && n_decode > 0) {
        const double tw = kvp_time_now();
        if (kvp_eval(ctx, toks + depth, 1, logits, false, err) < 0)
            return -1;
        r->warmup_ms = (kvp_time_now() - tw) * 1e3;
    }
    kvp_ctx_store_reset_stats(ctx);
    kvp_ctx_policy_reset_seconds(ctx);
    kvp_ctx_reset_attention_seconds(ctx);
    for (long k = 0; k < reps; k++) {
        /* a tiered run refills: a policy may rebuild its metadata from every block after a
         * truncation, and the hot tier does not hold every block */
        if (o->to.tier != KVP_TIER_NONE && k > 0) {
            kvp_ctx_reset(ctx);
            if (fill_cache(ctx, toks, depth, &o->fill, logits, err) < 0)
                return -1;
        } else if (kvp_ctx_truncate_keeps(ctx, (int)depth)) {
            kvp_ctx_truncate(ctx, (int)depth);
        } else if (k > 0) { /* sliding-window rings cannot go back: fill again */
            kvp_ctx_reset(ctx);
            if (fill_cache(ctx, toks, depth, &o->fill, logits, err) < 0)
                return -1;
        } /* (the first repetition then keeps the warm-up token: one position later) */
        if (ram)
            kvp_ctx_truncate(ram, (int)depth);
        double dt = 0;
        for (long i0 = 0; i0 < n_decode; i0 += PAIR_CHUNK) {
            long i1 = i0 + PAIR_CHUNK < n_decode ? i0 + PAIR_CHUNK : n_decode;
            double t0 = kvp_time_now();
            double c0 = kvp_cpu_time(), tc0 = kvp_thread_cpu_time();
            for (long i = i0; i < i1; i++) {
                if (o->timeline && k == 0 && i == tl0)
                    kvp_ctx_store_timeline(ctx, true);
                if (kvp_eval(ctx, toks + depth + i, 1, logits, false, err) < 0)
                    return -1;
                if (o->timeline && k == 0 && i + 1 == tl1)
                    kvp_ctx_store_timeline(ctx, false);
            }
            double t1 = kvp_time_now(), c1 = kvp_cpu_time(), tc1 = kvp_thread_cpu_time();
            dt += t1 - t0;
            decode_cpu += c1 - c0;
            decode_tcpu += tc1 - tc0;
            if (!ram)
                continue;
            for (long i = i0; i < i1; i++)
                if (kvp_eval(ram, toks + depth + i, 1, logits, false, err) < 0)
                    return -1;
            double t2 = kvp_time_now();
            ram_cpu += kvp_cpu_time() - c1;
            ram_tcpu += kvp_thread_cpu_time() - tc1;
            ram_s += t2 - t1;
            chunk_ratio[n_ratio++] = (t1 - t0) / (t2 - t1);
        }
        double rate = n_decode / dt;
        decode_s += dt;
        tg_sum += rate;
        r->tg_best = rate > r->tg_best ? rate : r->tg_best;
    }
    /* the KV memory really held after the last step: the physical blocks with live tokens */
    kvp_ctx_kv_bytes(ctx, &r->kv_resident, NULL);
    kvp_ctx_kv_bytes_by_kind(ctx, &r->kv_windowed, NULL);
    const double per_tok = 1e3 / ((double)reps * n_decode);
    double attn_w = 0, attn_g = 0;
    kvp_ctx_attention_seconds(ctx, &attn_w, &attn_g);
    r->attn_w_ms = attn_w * per_tok;
    r->attn_g_ms = attn_g * per_tok;
    r->tg_mean = tg_sum / reps;
    r->pol_ms = o->pp.name ? kvp_ctx_policy_seconds(ctx) * per_tok : 0;
    r->pol_cpu_ms = o->pp.name ? kvp_ctx_policy_cpu_seconds(ctx) * per_tok : 0;
    r->cpu_ms = decode_cpu * per_tok;
    r->tiered = kvp_ctx_store_stats(ctx, &r->ss) == 0;
    /* --paired: the twin's rate, the time ratio over every chunk, and its median chunk */
    if (ram) {
        qsort(chunk_ratio, (size_t)n_ratio, sizeof(double), cmp_double);
        r->paired = true;
        r->pair_rate = (double)(reps * n_decode) / ram_s;
        r->pair_ratio = ram_s > 0 ? decode_s / ram_s : 0;
        r->pair_median = chunk_ratio[n_ratio / 2];
        r->tcpu_ms = decode_tcpu * per_tok;
        r->ram_cpu_ms = ram_cpu * per_tok;
        r->ram_tcpu_ms = ram_tcpu * per_tok;
        r->cpu_ratio = ram_cpu > 0 ? decode_cpu / ram_cpu : 0;
    }
    if (o->timeline && kvp_ctx_store_timeline_png(ctx, o->timeline, err) < 0)
        return -1;
    return 0;
}

/* One run's report on stdout: JSON or text (below). */
static void print_result(const struct bench_opts *o, const struct bench_result *r);

/* From the decode just timed on ctx and r->bandwidth: the floor, and what a step read. */
static void derive(const struct bench_opts *o, const kvp_model *m, kvp_ctx *ctx,
                   struct bench_result *r)
{
    /* the floor: every weight byte and the KV at the run's mean depth, at the bandwidth */
    r->type_k = kvp_ctx_kv_type_k(ctx);
    r->type_v = kvp_ctx_kv_type_v(ctx);
    r->kv_per_token =
        (double)kvp_kv_bytes_per_token(m, r->type_k, r->type_v, (int)o->mo.block_size);
    r->kv_bytes = r->kv_per_token * (double)(o->depth + o->n_decode / 2);
    const double step_bytes = (double)r->in.weight_bytes + r->kv_bytes;
    r->floor_tps = r->bandwidth > 0 ? r->bandwidth * 1e9 / step_bytes : 0;
    /* what a step reads: the keys and values the selections let attention read (every key of
     * a (layer, KV head) that made no selection), and the block metadata a flat bound pass
     * reads (2 x head_dim elements per block and selecting (layer, KV head), f16 for an f16
     * key cache, else f32: quest_meta.h); a coarse-to-fine pass reads less of it */
    const double steps = (double)o->reps * o->n_decode;
    double sel_tokens = 0, selects = 0;
    kvp_ctx_policy_reads(ctx, &sel_tokens, &selects);
    const double pairs = (double)r->in.n_layer * r->in.n_head_kv;
    const double mean_keys = (double)o->depth + o->n_decode / 2.0;
    const double sel_pairs = selects / steps; /* selecting (layer, KV head) pairs per step */
    const int bs = o->mo.block_size > 0 ? (int)o->mo.block_size : 16; /* kvp_ctx_params */
    r->kv_read = (sel_tokens / steps + (pairs - sel_pairs) * mean_keys) * r->kv_per_token / pairs;
    r->meta_flat = sel_pairs * ceil(mean_keys / bs) * 2.0 * r->in.head_dim *
                   (r->type_k == KVP_KV_F16 ? 2.0 : 4.0);
    const double read_bytes = (double)r->in.weight_bytes + r->kv_read + r->meta_flat;
    r->read_floor = r->bandwidth > 0 ? r->bandwidth * 1e9 / read_bytes : 0;
}

/* Several --policy entries from one fill (see the top of the file), a result printed for each.
 * base: the prefill's figures and the bandwidth. */
static int run_entries(const struct bench_opts *o, const kvp_model *m, kvp_ctx *ctx,
                       const int32_t *toks, float *logits, double *chunk_ratio,
                       const struct bench_result *base, struct kvp_err *err)
{
    const long head = fill_head_tokens(o->depth);
    double head_s = 0;
    struct cli_prefill_report fill_pf = {0};
    for (int k = 0; k < o->n_pol; k++) {
        struct bench_opts oe = *o;
        oe.pp = o->pol[k];
        oe.budget_arg = o->pol_budget[k];
        oe.index = k;
        struct bench_result r = *base;
        if (k == 0) { /* the shared fill, without a policy */
            kvp_ctx_reset(ctx);
            kvp_ctx_prefill_reset_stats(ctx);
            const double t0 = kvp_time_now();
            if (fill_head(ctx, toks, o->depth, &o->fill, err) < 0)
                return -1;
            head_s = kvp_time_now() - t0;
        } else if (kvp_ctx_truncate_keeps(ctx, (int)head)) {
            kvp_ctx_truncate(ctx, (int)head); /* back to the shared fill */
        } else { /* (kvp_ctx_set_policy_keep refuses such a cache before this) */
            err->code = KVP_EUNSUPPORTED;
            snprintf(err->msg, sizeof(err->msg), "the cache cannot go back to its fill");
            return -1;
        }
        if (kvp_ctx_set_policy_keep(ctx, oe.pp.name ? &oe.pp : NULL, err) < 0)
            return -1;
        const double t1 = kvp_time_now();
        if (fill_tail(ctx, toks, o->depth, logits, err) < 0)
            return -1;
        r.fill_s = head_s + (kvp_time_now() - t1); /* the shared head and this entry's tail */
        if (k == 0)
            cli_prefill_take(ctx, r.in.n_layer, &fill_pf);
        r.fill_pf = fill_pf;
        if (time_decode(&oe, ctx, NULL, toks, logits, chunk_ratio, &r, err) < 0)
            return -1;
        derive(&oe, m, ctx, &r);
        r.logits_fnv = kvp_fnv64(KVP_FNV64_INIT, logits, (size_t)r.in.n_vocab * sizeof(float));
        print_result(&oe, &r);
    }
    return 0;
}

/* The whole measurement into r: contexts and token ids, the timed runs, then the floor. 0, or 1
 * after printing the error. */
static int run(const struct bench_opts *o, kvp_model *m, struct bench_result *r)
{
    int status = 1;
    int32_t *toks = NULL;
    float *logits = NULL;
    double *chunk_ratio = NULL;
    kvp_ctx *ctx = NULL, *ram = NULL; /* ram: the untiered twin of --paired */
    /* (+1: a model whose rings cannot cut the warm-up token away keeps it: see decode) */
    const long cap = o->depth + o->n_decode + 1;
    kvp_model_get_info(m, &r->in);
    if (!(ctx = bench_ctx(m, o, cap, true)) ||
        (o->paired && !(ram = bench_ctx(m, o, cap, false))))
        goto out;
    long n_chunks = (o->n_decode + PAIR_CHUNK - 1) / PAIR_CHUNK;
    chunk_ratio = malloc((size_t)(o->reps * n_chunks) * sizeof(double));
    toks = malloc((size_t)cap * sizeof(int32_t));
    logits = malloc((size_t)r->in.n_vocab * sizeof(float));
    if (!toks || !logits || !chunk_ratio) {
        cli_fail("out of memory");
        goto out;
    }
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* fixed pseudo-random token ids */
    for (long i = 0; i < cap; i++)
        toks[i] = (int32_t)(kvp_xorshift64(&x) % (uint64_t)r->in.n_vocab);
    toks[0] = kvp_token_bos(m);
    if (o->fill_text) { /* the text's ids replace the first ones, as far as they go */
        size_t len = 0, n_text = 0;
        char *text = cli_read_file(o->fill_text, &len);
        int32_t *ids = text ? cli_tokenize(m, text, len, true, &n_text) : NULL;
        free(text);
        if (!ids)
            goto out;
        size_t src = (size_t)fill_real_tokens(&o->fill, o->depth);
        memcpy(toks, ids, (n_text < src ? n_text : src) * sizeof(int32_t));
        free(ids);
        if (n_text < src)
            cli_warn("--fill-text has %zu tokens; the rest of the %zu prefilled are random ids",
                     n_text, src);
    }
    struct kvp_err err = {0};
    if (o->prefill_only) {
        r->type_k = kvp_ctx_kv_type_k(ctx);
        r->type_v = kvp_ctx_kv_type_v(ctx);
        r->kv_per_token =
            (double)kvp_kv_bytes_per_token(m, r->type_k, r->type_v, (int)o->mo.block_size);
        if (time_prefill(o, ctx, toks, logits, r, &err) < 0)
            cli_fail_err(&err);
        else
            status = 0;
        goto out;
    }
    if (o->n_pol > 1) { /* several policies from one fill; each entry prints its result */
        r->bandwidth = o->bandwidth > 0 ? o->bandwidth : measure_bandwidth((int)o->mo.n_threads);
        if (time_prefill(o, ctx, toks, logits, r, &err) < 0 ||
            run_entries(o, m, ctx, toks, logits, chunk_ratio, r, &err) < 0)
            cli_fail_err(&err);
        else
            status = 0;
        goto out;
    }
    if (time_prefill(o, ctx, toks, logits, r, &err) < 0 ||
        (ram && fill_cache(ram, toks, o->depth, &o->fill, logits, &err) < 0) ||
        time_decode(o, ctx, ram, toks, logits, chunk_ratio, r, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    r->logits_fnv = kvp_fnv64(KVP_FNV64_INIT, logits, (size_t)r->in.n_vocab * sizeof(float));
    r->bandwidth = o->bandwidth > 0 ? o->bandwidth : measure_bandwidth((int)o->mo.n_threads);
    derive(o, m, ctx, r);
    status = 0;
out:
    free(chunk_ratio);
    kvp_ctx_free(ram);
    free(logits);
    free(toks);
    kvp_ctx_free(ctx);
    return status;
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
    cJSON_AddNumberToObject(o, "stored_layers", s->stored_layers);     /* layers in the tiers */
    cJSON_AddNumberToObject(o, "windowed_layers", s->windowed_layers); /* rings kept in RAM */
    cJSON_AddBoolToObject(o, "sq_poll", s->sq_poll); /* disk reads go through a polling thread */
    if (s->disk_io) /* disk tier: "io_uring" or "pread" (io_uring refused, or asked for) */
        cJSON_AddStringToObject(o, "disk_io", cli_disk_io_names[s->disk_io]);
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

/* The prefetch mode that ran (the default is token). */
static const char *prefetch_name(const struct bench_opts *o)
{
    return cli_prefetch_names[o->to.prefetch ? o->to.prefetch : KVP_PREFETCH_TOKEN];
}

/* Print j on one line on stdout and free it. */
static void print_and_free(cJSON *j)
{
    char *s = cJSON_PrintUnformatted(j);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

/* --prefill-only: what was timed, the prefill. */
static void add_prefill_only_json(cJSON *j, const struct bench_opts *o,
                                  const struct bench_result *r)
{
    cJSON_AddNumberToObject(j, "threads", (double)o->mo.n_threads);
    cJSON_AddNumberToObject(j, "reps", (double)o->reps);
    cJSON_AddBoolToObject(j, "prefill_only", true);
    cJSON_AddNumberToObject(j, "prefill_tokens", (double)o->n_prefill);
    cJSON_AddNumberToObject(j, "prefill_tokens_per_s", r->pp_best);
    cli_prefill_json(j, &o->pf, &r->pf);
}

/* The run's shape, the prefill, the fill and the decode rates, the weights and the KV cache,
 * and the floor of the decode rate. */
static void add_speed_json(cJSON *j, const struct bench_opts *o, const struct bench_result *r)
{
    cJSON_AddNumberToObject(j, "packed_bytes", (double)r->packed_bytes);
    /* the untimed decode token before the timed ones (null: none, a tiered run) */
    if (r->warmup_ms >= 0)
        cJSON_AddNumberToObject(j, "warmup_ms", r->warmup_ms);
    else
        cJSON_AddNullToObject(j, "warmup_ms");
    cJSON_AddNumberToObject(j, "threads", (double)o->mo.n_threads);
    cJSON_AddNumberToObject(j, "ctx", (double)o->depth);
    cJSON_AddNumberToObject(j, "n_decode", (double)o->n_decode);
    cJSON_AddNumberToObject(j, "reps", (double)o->reps);
    cJSON_AddNumberToObject(j, "prefill_tokens", (double)o->n_prefill);
    cJSON_AddNumberToObject(j, "prefill_tokens_per_s", r->pp_best);
    /* of that prefill: policy, density, estimate and attention thread-seconds */
    cli_prefill_json(j, &o->pf, &r->pf);
    cJSON_AddStringToObject(j, "prefill_gemm",
                            kvp_gemm_wants(KVP_TYPE_Q8_0, 2) ? "int8" : "sgemm");
    /* fill: prefill, or tile (fill_source_tokens prefilled for real, the cache tiled from
     * them to ctx - 32, the last 32 prefilled); fill_seconds: the whole fill */
    cJSON_AddStringToObject(j, "fill", fill_names[o->fill.mode]);
    cJSON_AddNumberToObject(j, "fill_source_tokens", (double)fill_real_tokens(&o->fill, o->depth));
    cJSON_AddNumberToObject(j, "fill_seconds", r->fill_s);
    /* fill_density: keys read / keys seen by the fill's prefill attention (1: dense; null:
     * nothing prefilled), fill_estimate_s and fill_attention_s its thread-seconds (the prefill_*
     * fields above are the timed --prefill's) */
    if (r->fill_pf.st.keys_seen > 0)
        cJSON_AddNumberToObject(j, "fill_density",
                                r->fill_pf.st.keys_read / r->fill_pf.st.keys_seen);
    else
        cJSON_AddNullToObject(j, "fill_density");
    cJSON_AddNumberToObject(j, "fill_estimate_s", r->fill_pf.st.estimate_s);
    cJSON_AddNumberToObject(j, "fill_attention_s", r->fill_pf.st.attention_s);
    if (r->fill_tiered)
        cJSON_AddNumberToObject(j, "fill_transfer_seconds", r->fill_transfer_s);
    cJSON_AddNumberToObject(j, "decode_tokens_per_s", r->tg_mean);
    cJSON_AddNumberToObject(j, "decode_tokens_per_s_best", r->tg_best);
    cJSON_AddNumberToObject(j, "decode_ms_per_token", 1e3 / r->tg_mean);
    /* process CPU time (every thread) per decoded token: steadier than wall time on a
     * shared host, and it counts the cost of transfer threads and I/O submission */
    cJSON_AddNumberToObject(j, "decode_cpu_ms_per_token", r->cpu_ms);
    cJSON_AddNumberToObject(j, "weight_bytes", (double)r->in.weight_bytes);
    cJSON_AddStringToObject(j, "weight_type", kvp_type_name(r->in.weight_type));
    /* kv_type_k, kv_type_v: the KV cache's element types (f32, f16, bf16, q8_0);
     * kv_bytes_per_token: K and V of one token, all layers and KV heads (block padding
     * included); kv_bytes_at_ctx: that times the context the run fills (ctx + n_decode);
     * kv_bytes_per_step: the KV a dense step reads, at the run's mean depth */
    cJSON_AddStringToObject(j, "kv_type_k", kvp_kv_type_name(r->type_k));
    cJSON_AddStringToObject(j, "kv_type_v", kvp_kv_type_name(r->type_v));
    cJSON_AddNumberToObject(j, "kv_bytes_per_token", r->kv_per_token);
    cJSON_AddNumberToObject(j, "kv_bytes_at_ctx",
                            r->kv_per_token * (double)(o->depth + o->n_decode));
    cJSON_AddNumberToObject(j, "kv_bytes_per_step", r->kv_bytes);
    cJSON_AddNumberToObject(j, "bandwidth_gbps", r->bandwidth);
    cJSON_AddNumberToObject(j, "floor_decode_tokens_per_s", r->floor_tps);
    cJSON_AddNumberToObject(j, "fraction_of_floor",
                            r->floor_tps > 0 ? r->tg_mean / r->floor_tps : 0);
}

/* What the selection policy let a step read, and its time. */
static void add_selection_json(cJSON *j, const struct bench_opts *o, const struct bench_result *r)
{
    /* kv_read_bytes_per_token: K and V bytes the selections let attention read per step
     * (measured from the selections; dense layers and dense runs read every key);
     * meta_flat_bytes_per_token: the block metadata a flat bound pass over every block
     * reads per step (quest, qpredictor; a coarse-to-fine pass reads less); read_floor:
     * bandwidth / (weights + those two), the decode rate if a step only streamed them */
    cJSON_AddNumberToObject(j, "kv_read_bytes_per_token", r->kv_read);
    cJSON_AddNumberToObject(j, "meta_flat_bytes_per_token", r->meta_flat);
    cJSON_AddNumberToObject(j, "read_floor_tokens_per_s", r->read_floor);
    /* policy: the selection policy or "none" (dense attention); budget: as given (tokens,
     * or a fraction of the context), null without a policy */
    cJSON_AddStringToObject(j, "policy", o->pp.name ? o->pp.name : "none");
    if (o->budget_arg)
        cJSON_AddStringToObject(j, "budget", o->budget_arg);
    else
        cJSON_AddNullToObject(j, "budget");
    /* policy_opts, dense_layers: as given (null: the policy's defaults); policy_index and
     * policies: this entry of the --policy list and the list's length (one fill for all) */
    if (o->pp.opts)
        cJSON_AddStringToObject(j, "policy_opts", o->pp.opts);
    else
        cJSON_AddNullToObject(j, "policy_opts");
    if (o->pp.dense_layers)
        cJSON_AddNumberToObject(j, "dense_layers", o->pp.dense_layers < 0 ? 0 : o->pp.dense_layers);
    else
        cJSON_AddNullToObject(j, "dense_layers");
    cJSON_AddNumberToObject(j, "policy_index", o->index);
    cJSON_AddNumberToObject(j, "policies", o->n_pol > 1 ? o->n_pol : 1);
    /* decode_logits_fnv: FNV-1a 64 of the last decoded token's logits (hex): the same in a
     * run of one policy and in that policy's entry of a list, which a test checks */
    char fnv[17];
    snprintf(fnv, sizeof(fnv), "%016llx", (unsigned long long)r->logits_fnv);
    cJSON_AddStringToObject(j, "decode_logits_fnv", fnv);
    /* policy_ms_per_token: time inside the policy's select/on_step hooks per token (thread
     * time summed over KV heads); policy_share: its fraction of the decode time */
    if (o->pp.name) {
        cJSON_AddNumberToObject(j, "policy_ms_per_token", r->pol_ms);
        cJSON_AddNumberToObject(j, "policy_share", r->pol_ms * r->tg_mean / 1e3);
        /* the same in CPU time of the threads that ran the hooks, against
         * decode_cpu_ms_per_token (steadier on a shared host) */
        cJSON_AddNumberToObject(j, "policy_cpu_ms_per_token", r->pol_cpu_ms);
        cJSON_AddNumberToObject(j, "policy_cpu_share",
                                r->cpu_ms > 0 ? r->pol_cpu_ms / r->cpu_ms : 0);
    }
}

/* Where the KV cache lived: resident bytes, the tier and its store's counters. */
static void add_tier_json(cJSON *j, const struct bench_opts *o, const struct bench_result *r)
{
    /* kv_resident_bytes: KV bytes (K and V, all layers) in the physical blocks the cache
     * holds after the last decode step, taken from its block pool; null when tiered (the
     * store's hot_bytes and cold_bytes say what it holds) */
    if (r->tiered)
        cJSON_AddNullToObject(j, "kv_resident_bytes");
    else
        cJSON_AddNumberToObject(j, "kv_resident_bytes", (double)r->kv_resident);
    /* windowed_*: models with sliding-window layers (Gemma 2 and 3; 0 elsewhere): the KV bytes
     * those layers' rings hold (tiered too: the rings stay in RAM, outside the store, whose
     * counters leave them out) and their share of kv_resident_bytes (null when tiered), and
     * the attention phase per decoded token (K and V written, the policy's selection and
     * hooks, attention) of those layers and of the others, with their shares of the decode
     * time */
    cJSON_AddNumberToObject(j, "windowed_kv_bytes", (double)r->kv_windowed);
    if (!r->tiered)
        cJSON_AddNumberToObject(j, "windowed_kv_share",
                                r->kv_resident ? (double)r->kv_windowed / r->kv_resident : 0);
    else
        cJSON_AddNullToObject(j, "windowed_kv_share");
    cJSON_AddNumberToObject(j, "windowed_attention_ms_per_token", r->attn_w_ms);
    cJSON_AddNumberToObject(j, "windowed_attention_share", r->attn_w_ms * r->tg_mean / 1e3);
    cJSON_AddNumberToObject(j, "global_attention_ms_per_token", r->attn_g_ms);
    cJSON_AddNumberToObject(j, "global_attention_share", r->attn_g_ms * r->tg_mean / 1e3);
    /* kv_tier: none, ram, disk or redis; prefetch: dense/none/layer/token (null when
     * untiered); hot_budget: --hot-budget tokens per layer (0: sized from the budget);
     * link_gbps, link_latency_us: the modelled link (0: off) */
    cJSON_AddStringToObject(j, "kv_tier", cli_tier_names[o->to.tier]);
    if (r->tiered)
        cJSON_AddStringToObject(j, "prefetch", prefetch_name(o));
    else
        cJSON_AddNullToObject(j, "prefetch");
    cJSON_AddNumberToObject(j, "hot_budget", (double)o->to.hot_budget);
    cJSON_AddNumberToObject(j, "link_gbps", o->link_gbps);
    cJSON_AddNumberToObject(j, "link_latency_us", o->link_us);
    /* store (tiered runs only, else null): means per decoded token over every repetition:
     *   tokens          decode steps counted
     *   hot_bytes       hot tier including the one-layer prefill staging area
     *   cold_bytes      cold tier (the whole cache); unit_bytes: one (layer, block) unit
     *   stored_layers   layers the store holds: all but the sliding-window ones, whose rings
     *                   stay in RAM (windowed_layers; windowed_kv_bytes above) and are never
     *                   tiered nor counted here
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
    if (r->tiered)
        cJSON_AddItemToObject(j, "store", store_json(&r->ss));
    else
        cJSON_AddNullToObject(j, "store");
}

/* --paired: the tiered decode against its untiered twin. */
static void add_paired_json(cJSON *j, const struct bench_result *r)
{
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
    if (r->paired) {
        cJSON *pj = cJSON_AddObjectToObject(j, "paired");
        cJSON_AddNumberToObject(pj, "ram_tokens_per_s", r->pair_rate);
        cJSON_AddNumberToObject(pj, "ratio", r->pair_ratio);
        cJSON_AddNumberToObject(pj, "ratio_median", r->pair_median);
        cJSON_AddNumberToObject(pj, "thread_cpu_ms_per_token", r->tcpu_ms);
        cJSON_AddNumberToObject(pj, "ram_cpu_ms_per_token", r->ram_cpu_ms);
        cJSON_AddNumberToObject(pj, "ram_thread_cpu_ms_per_token", r->ram_tcpu_ms);
        cJSON_AddNumberToObject(pj, "cpu_ratio", r->cpu_ratio);
    } else {
        cJSON_AddNullToObject(j, "paired");
    }
}

/* One JSON object on stdout; the fields are documented inline. */
static void print_json(const struct bench_opts *o, const struct bench_result *r)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", r->in.name);
    cJSON_AddStringToObject(j, "simd", kvp_simd()->name);
    if (o->prefill_only) {
        add_prefill_only_json(j, o, r);
    } else {
        add_speed_json(j, o, r);
        add_selection_json(j, o, r);
        add_tier_json(j, o, r);
        add_paired_json(j, r);
    }
    print_and_free(j);
}

/* The human-readable report. */
static void print_text(const struct bench_opts *o, const struct bench_result *r)
{
    printf("model %s, %ld thread(s), SIMD %s, KV %s/%s (%.0f bytes/token)\n", r->in.name,
           o->mo.n_threads, kvp_simd()->name, kvp_kv_type_name(r->type_k),
           kvp_kv_type_name(r->type_v), r->kv_per_token);
    printf("prefill  %6ld tokens: %10.1f tokens/s (best of %ld)\n", o->n_prefill, r->pp_best,
           o->reps);
    if (r->pf.st.keys_seen > 0)
        printf("         %s attention, density %.3f: %.3f thread-s attention, %.3f estimate\n",
               kvp_prefill_policy_name(o->pf.p.policy), r->pf.st.keys_read / r->pf.st.keys_seen,
               r->pf.st.attention_s, r->pf.st.estimate_s);
    if (o->prefill_only)
        return;
    printf("fill     %6ld tokens: %10.3f s", o->depth, r->fill_s);
    if (r->fill_tiered)
        printf(" (%.3f s with cold-tier transfers in flight)", r->fill_transfer_s);
    printf("\n");
    printf("decode at %ld: %10.1f tokens/s mean, %.1f best (%.3f ms/token, %.3f ms CPU)\n",
           o->depth, r->tg_mean, r->tg_best, 1e3 / r->tg_mean, r->cpu_ms);
    printf("floor    %.1f tokens/s = %.1f GB/s / (%.2f MB weights + %.2f MB KV)\n", r->floor_tps,
           r->bandwidth, r->in.weight_bytes / 1e6, r->kv_bytes / 1e6);
    if (o->pp.name)
        printf("policy   %s, budget %s: %.3f ms/token in select/on_step, %.1f%% of decode\n",
               o->pp.name, o->budget_arg ? o->budget_arg : "all", r->pol_ms,
               100 * r->pol_ms * r->tg_mean / 1e3);
    if (!r->tiered)
        printf("KV       %zu bytes resident after the last step\n", r->kv_resident);
    if (r->tiered) {
        double n = r->ss.steps ? (double)r->ss.steps : 1;
        printf("store    %s tier, prefetch %s: per token %.3f ms compute, %.3f predict, "
               "%.3f wait, %.3f transfer; %.1f hits, %.1f misses, %.0f KB read\n",
               cli_tier_names[o->to.tier], prefetch_name(o),
               r->ss.compute_s / n * 1e3, r->ss.predict_s / n * 1e3, r->ss.wait_s / n * 1e3,
               r->ss.transfer_s / n * 1e3, r->ss.hits / n, r->ss.misses / n,
               r->ss.bytes_read / n / 1e3);
    }
    if (r->paired)
        printf("paired   untiered %.1f tokens/s in alternating chunks of %d: tiered/untiered "
               "time %.3f (median chunk %.3f)\n",
               r->pair_rate, PAIR_CHUNK, r->pair_ratio, r->pair_median);
}

static void print_result(const struct bench_opts *o, const struct bench_result *r)
{
    if (o->json)
        print_json(o, r);
    else
        print_text(o, r);
    fflush(stdout);
}

int cmd_bench(int argc, char **argv)
{
    struct bench_opts o = {.n_decode = 128, .n_prefill = 512, .reps = 3, .fill_src = 4096,
                           .to = CLI_TIER_OPTS_INIT, .pf = CLI_PREFILL_OPTS_INIT};
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    kvp_model *m = cli_open_model(&o.mo);
    if (!m)
        return 1;
    struct bench_result r = {0};
    int status = run(&o, m, &r);
    if (status == 0 && o.n_pol < 2)
        print_result(&o, &r);
    kvp_model_close(m);
    return status;
}
