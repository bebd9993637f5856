/*
 * `kvpred batched-bench`: many sequences at once, in llama-batched-bench's terms.
 *
 * For every combination of -npp (prompt tokens per sequence), -ntg (tokens generated per
 * sequence) and -npl (sequences), one engine (kvp_engine) runs npl sequences: the prompts are
 * prefilled (several sequences' prompts per step, up to -b tokens a step), then ntg decode steps
 * each give every sequence one token. As llama-batched-bench: S_PP = npl·npp / T_PP and
 * S_TG = npl·ntg / T_TG are aggregate tokens per second; a sequence waits one step per token, so
 * the per-sequence latency is the mean step time. Unlike llama.cpp's unified cache, each
 * sequence has its own cache, so its attention spans its own tokens only, with the policy,
 * budget, KV types and tier given (--policy, --budget, -ctk/-ctv, --kv-tier).
 *
 * --fill copy prefills one sequence and copies its KV into the others (kvp_seq_copy; the
 * sequences then decode different tokens): the way to fill many long contexts quickly. --serial
 * then also decodes the sequences one after another, ntg tokens each, with the same tier: the
 * aggregate a machine gets without batching. --fill tile is copy with the one prompt grown as
 * `bench --fill tile` grows it: TILE_SOURCE tokens prefilled for real, the cache tiled to
 * npp - TILE_TAIL (kvp_ctx_fill_tile), the last TILE_TAIL evaluated for real; a 32K-token
 * prompt then fills in seconds instead of the many minutes its quadratic prefill takes on two
 * cores. --stop-before-decode stops the process (SIGSTOP) after each row's fill, so that a
 * script can take a timing lock and raise the priority for the timed part only, then SIGCONT.
 *
 * Token ids are deterministic pseudo-random ids, different per sequence.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/prefill_opts.h"
#include "cli/tier_opts.h"
#include "core/platform.h"
#include "core/rng.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "kvpred_lab.h"

#define MAX_LIST 32

static const char *const fill_names[] = {"prefill", "copy", "tile", NULL};
enum { FILL_PREFILL, FILL_COPY, FILL_TILE };

/* --fill tile: tokens prefilled for real, and evaluated for real after the tiled part (the
 * policies' observation window, 32 by default, sees real queries); as in `bench --fill tile` */
#define TILE_SOURCE 4096
#define TILE_TAIL 32

static void help(void)
{
    printf("usage: kvpred batched-bench [-m MODEL] -npp LIST -ntg LIST -npl LIST [-t T] [--json]\n\n"
           "  -npp LIST            prompt tokens per sequence, comma-separated (default 128)\n"
           "  -ntg LIST            tokens generated per sequence (default 128)\n"
           "  -npl LIST            numbers of sequences decoding together (default 1,2,4,8)\n"
           "  -b N                 most tokens of all sequences in one step (default 512)\n"
           "  --policy NAME        KV selection policy of every sequence (default: dense)\n"
           "  --budget B           its budget: tokens per (layer, KV head) or a fraction (1/16)\n"
           "%s"
           "                       (each sequence's cache is tiered on its own)\n"
           "  --fill F             prefill (default) or copy: prefill one sequence and copy its\n"
           "                       KV into the others; or tile: copy, with the one prompt\n"
           "                       grown as bench --fill tile grows it (%d tokens prefilled,\n"
           "                       tiled to npp - %d, the last %d evaluated)\n"
           "  --serial             also decode the sequences one after another (ntg each)\n"
           "  --stop-before-decode stop (SIGSTOP) after each row's fill until SIGCONT, so a\n"
           "                       script can time the decode alone under a lock\n"
           "  --json               one JSON object per row instead of the table\n%s"
           "                       (every sequence's prompt; JSON: the first sequence's)\n"
           "Each sequence's context is npp + 2*ntg tokens, so there is no -c; -b is the\n"
           "step's most tokens of all sequences.\n%s",
           cli_tier_flags_help, TILE_SOURCE, TILE_TAIL, TILE_TAIL, cli_prefill_flags_help,
           cli_model_flags_help_sans_ctx);
}

/* "1,2,4" into list; false on a bad or empty list. */
struct row {
    long npp, ntg, npl;
    double t_pp, t_tg, t_serial, t_fill_copy;
    size_t kv_resident, kv_cold;
    uint64_t bytes_read, hits, misses, serial_bytes_read;
    uint64_t reads, serial_reads; /* cold-tier read requests (a request may span units) */
    long rss_kib;
    struct cli_prefill_report pf; /* the first sequence's prompt attention */
};

/* Resident set of this process in KiB (VmRSS), or -1. */
static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmRSS:", 6))
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

struct bench {
    kvp_model *m;
    kvp_engine *e;
    struct kvp_ctx_params cp;
    struct kvp_policy_params *pp;
    const struct cli_prefill_opts *pf;
    int n_batch, fill;
    bool serial, stop;
    int n_vocab, n_layer;
    double t_warmup;             /* the warm-up row, seconds */
    size_t warmup_packed_bytes;  /* weights packed by the end of it */
};

static int32_t token_at(long seq, long i, int n_vocab)
{
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(seq * 1000003 + i);
    return (int32_t)(kvp_splitmix64(&x) % (uint64_t)n_vocab);
}

/* A row's sequences and the buffers its steps share. */
struct row_work {
    kvp_seq **seq;                /* npl sequences */
    struct kvp_batch_item *items; /* one step's items */
    int32_t *toks;                /* per sequence: prompt, batched decode, serial decode */
    float *logits;                /* per sequence: the last step's */
    long per;                     /* tokens per sequence in toks */
};

/* The row's sequences, each with the policy and the prefill policy. Returns 0, or -1 after
 * printing the error. */
static int open_sequences(struct bench *b, const struct row *r, struct row_work *w)
{
    struct kvp_err err = {0};
    for (long s = 0; s < r->npl; s++) {
        struct kvp_ctx_params cp = b->cp;
        cp.n_ctx = (int)w->per;
        if (kvp_seq_init(b->e, &cp, &w->seq[s], &err) < 0 ||
            (b->pp->name && kvp_ctx_set_policy(w->seq[s], b->pp, &err) < 0)) {
            cli_fail_err(&err);
            return -1;
        }
        if (cli_prefill_apply(b->pf, w->seq[s]))
            return -1;
    }
    return 0;
}

/* Prefill (the first sequence alone with --fill): whole prompts packed into steps of at most
 * n_batch tokens, a prompt longer than that in pieces; --fill tile tiles the first one instead.
 * Sets r->t_pp. Returns 0, or -1 after printing the error. */
static int prefill_prompts(struct bench *b, struct row *r, struct row_work *w)
{
    struct kvp_err err = {0};
    double t0 = kvp_time_now();
    long n_prefill = b->fill ? 1 : r->npl;
    long s = 0, fed = 0;
    if (b->fill == FILL_TILE && r->npp > TILE_SOURCE + TILE_TAIL) {
        if (kvp_eval(w->seq[0], w->toks, TILE_SOURCE, NULL, false, &err) < 0 ||
            kvp_ctx_fill_tile(w->seq[0], (int)(r->npp - TILE_TAIL), &err) < 0 ||
            kvp_eval(w->seq[0], w->toks + r->npp - TILE_TAIL, TILE_TAIL, NULL, false, &err) < 0) {
            cli_fail_err(&err);
            return -1;
        }
        s = n_prefill;
    }
    while (s < n_prefill) {
        int n = 0, rows = 0;
        while (s < n_prefill && rows < b->n_batch) {
            int take = (int)(r->npp - fed < b->n_batch - rows ? r->npp - fed : b->n_batch - rows);
            w->items[n++] = (struct kvp_batch_item){.seq = w->seq[s],
                                                    .tokens = w->toks + s * w->per + fed,
                                                    .n = take,
                                                    .prompt_rest = (int)(r->npp - fed - take)};
            rows += take;
            fed += take;
            if (fed == r->npp) {
                s++;
                fed = 0;
            }
        }
        if (kvp_batch_eval(b->e, w->items, n, &err) < 0) {
            cli_fail_err(&err);
            return -1;
        }
    }
    r->t_pp = kvp_time_now() - t0;
    return 0;
}

/* --fill: the first sequence's KV copied into the others (r->t_fill_copy), which then decode
 * tokens of their own. Returns 0, or -1 after printing the error. */
static int copy_fill(struct bench *b, struct row *r, struct row_work *w)
{
    struct kvp_err err = {0};
    double t0 = kvp_time_now();
    for (long k = 1; k < r->npl; k++)
        if (kvp_seq_copy(w->seq[k], w->seq[0], (int)r->npp, &err) < 0) {
            cli_fail_err(&err);
            return -1;
        }
    r->t_fill_copy = kvp_time_now() - t0;
    for (long k = 0; k < r->npl; k++)
        for (long i = r->npp; i < w->per; i++)
            w->toks[k * w->per + i] = token_at(k + 1, i, b->n_vocab);
    return 0;
}

/* The timed decode: every sequence one token per step (r->t_tg). Returns 0, or -1 after
 * printing the error. */
static int decode_batched(struct bench *b, struct row *r, struct row_work *w)
{
    struct kvp_err err = {0};
    double t0 = kvp_time_now();
    for (long i = 0; i < r->ntg; i++) {
        for (long k = 0; k < r->npl; k++)
            w->items[k] = (struct kvp_batch_item){.seq = w->seq[k],
                                                  .tokens = w->toks + k * w->per + r->npp + i,
                                                  .n = 1,
                                                  .logits = w->logits + (size_t)k * b->n_vocab};
        if (kvp_batch_eval(b->e, w->items, (int)r->npl, &err) < 0) {
            cli_fail_err(&err);
            return -1;
        }
    }
    r->t_tg = kvp_time_now() - t0;
    return 0;
}

/* What the batched decode left: the process's RSS, the KV held and the store's traffic. */
static void take_decode_stats(struct row *r, struct row_work *w)
{
    r->rss_kib = rss_kib();
    r->kv_resident = r->kv_cold = 0;
    r->bytes_read = r->hits = r->misses = r->serial_bytes_read = 0;
    r->reads = r->serial_reads = 0;
    for (long k = 0; k < r->npl; k++) {
        size_t res, cold;
        kvp_seq_kv_bytes(w->seq[k], &res, &cold);
        r->kv_resident += res;
        r->kv_cold += cold;
        struct kvp_store_stats st;
        if (kvp_ctx_store_stats(w->seq[k], &st) == 0) {
            r->bytes_read += st.bytes_read;
            r->reads += st.reads;
            r->hits += st.hits;
            r->misses += st.misses;
        }
        kvp_ctx_store_reset_stats(w->seq[k]);
    }
}

/* --serial: the same sequences decode ntg more tokens one after another (r->t_serial, and the
 * store's traffic). Returns 0, or -1 after printing the error. */
static int decode_serial(struct bench *b, struct row *r, struct row_work *w)
{
    struct kvp_err err = {0};
    double t0 = kvp_time_now();
    for (long k = 0; k < r->npl; k++)
        for (long i = 0; i < r->ntg; i++) {
            w->items[0] =
                (struct kvp_batch_item){.seq = w->seq[k],
                                        .tokens = w->toks + k * w->per + r->npp + r->ntg + i,
                                        .n = 1,
                                        .logits = w->logits};
            if (kvp_batch_eval(b->e, w->items, 1, &err) < 0) {
                cli_fail_err(&err);
                return -1;
            }
        }
    r->t_serial = kvp_time_now() - t0;
    for (long k = 0; k < r->npl; k++) {
        struct kvp_store_stats st;
        if (kvp_ctx_store_stats(w->seq[k], &st) == 0) {
            r->serial_bytes_read += st.bytes_read;
            r->serial_reads += st.reads;
        }
    }
    return 0;
}

/* One row: npl sequences, prompts of npp, ntg steps. Prints the error and returns -1. */
static int run_row(struct bench *b, struct row *r)
{
    int rc = -1;
    struct row_work w = {.per = r->npp + 2 * r->ntg};
    w.seq = calloc((size_t)r->npl, sizeof(*w.seq));
    w.items = calloc((size_t)r->npl, sizeof(*w.items));
    w.toks = malloc((size_t)r->npl * (size_t)w.per * sizeof(int32_t));
    w.logits = malloc((size_t)r->npl * b->n_vocab * sizeof(float));
    if (!w.seq || !w.items || !w.toks || !w.logits) {
        cli_fail("out of memory");
        goto out;
    }
    for (long s = 0; s < r->npl; s++)
        for (long i = 0; i < w.per; i++)
            w.toks[s * w.per + i] = token_at(b->fill ? 0 : s, i, b->n_vocab);
    if (open_sequences(b, r, &w) || prefill_prompts(b, r, &w) || (b->fill && copy_fill(b, r, &w)))
        goto out;
    for (long k = 0; k < r->npl; k++)
        kvp_ctx_store_reset_stats(w.seq[k]);
    if (b->stop)
        raise(SIGSTOP);
    if (decode_batched(b, r, &w))
        goto out;
    take_decode_stats(r, &w);
    if (b->serial && decode_serial(b, r, &w))
        goto out;
    cli_prefill_take(w.seq[0], b->n_layer, &r->pf);
    rc = 0;
out:
    for (long k = 0; w.seq && k < r->npl; k++)
        kvp_ctx_free(w.seq[k]);
    free(w.seq);
    free(w.items);
    free(w.toks);
    free(w.logits);
    return rc;
}

static void print_json(const struct bench *b, const struct row *r, const char *budget,
                       int threads, const char *tier)
{
    struct kvp_model_info in;
    kvp_model_get_info(b->m, &in);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", in.name);
    cJSON_AddStringToObject(o, "weight_type", kvp_type_name(in.weight_type));
    cJSON_AddStringToObject(o, "simd", kvp_simd()->name);
    cJSON_AddNumberToObject(o, "threads", threads);
    cJSON_AddNumberToObject(o, "npp", (double)r->npp);
    cJSON_AddNumberToObject(o, "ntg", (double)r->ntg);
    cJSON_AddNumberToObject(o, "npl", (double)r->npl);
    cJSON_AddStringToObject(o, "policy", b->pp->name ? b->pp->name : "dense");
    cJSON_AddStringToObject(o, "budget", budget ? budget : "all");
    cJSON_AddStringToObject(o, "kv_tier", tier);
    cJSON_AddStringToObject(o, "kv_type_k", kvp_kv_type_name(b->cp.type_k));
    cJSON_AddStringToObject(o, "kv_type_v", kvp_kv_type_name(b->cp.type_v));
    cJSON_AddStringToObject(o, "fill", fill_names[b->fill]);
    cli_prefill_json(o, b->pf, &r->pf);
    /* the warm-up row before every row (its sequences as many as the largest row's): what a
     * batched engine makes once, such as the packed weights, is made there, outside the rows */
    cJSON_AddNumberToObject(o, "t_warmup_s", b->t_warmup);
    cJSON_AddNumberToObject(o, "warmup_packed_bytes", (double)b->warmup_packed_bytes);
    double n_pp = (double)(b->fill ? 1 : r->npl) * r->npp, n_tg = (double)r->npl * r->ntg;
    /* prefill: aggregate tokens/s over the prompts prefilled (one with --fill copy) */
    cJSON_AddNumberToObject(o, "t_pp_s", r->t_pp);
    cJSON_AddNumberToObject(o, "pp_tokens_per_s", n_pp / r->t_pp);
    cJSON_AddNumberToObject(o, "t_fill_copy_s", r->t_fill_copy);
    /* decode: aggregate tokens/s of all sequences; per-sequence latency = one step */
    cJSON_AddNumberToObject(o, "t_tg_s", r->t_tg);
    cJSON_AddNumberToObject(o, "tg_tokens_per_s", n_tg / r->t_tg);
    cJSON_AddNumberToObject(o, "tg_ms_per_token_per_seq", 1e3 * r->t_tg / r->ntg);
    if (b->serial) {
        cJSON_AddNumberToObject(o, "tg_serial_tokens_per_s", n_tg / r->t_serial);
        cJSON_AddNumberToObject(o, "serial_cold_bytes_read_per_token",
                                (double)r->serial_bytes_read / n_tg);
        cJSON_AddNumberToObject(o, "serial_cold_reads_per_token", (double)r->serial_reads / n_tg);
    }
    /* KV after the decode, summed over sequences: in RAM (resident) and in the cold tier */
    cJSON_AddNumberToObject(o, "kv_resident_bytes", (double)r->kv_resident);
    cJSON_AddNumberToObject(o, "kv_cold_bytes", (double)r->kv_cold);
    cJSON_AddNumberToObject(o, "cold_bytes_read_per_token", (double)r->bytes_read / n_tg);
    /* read requests: with the rate, the device's requests per second (its random-read limit) */
    cJSON_AddNumberToObject(o, "cold_reads_per_token", (double)r->reads / n_tg);
    /* selected (layer, block) units found hot or in flight, against fetched on demand */
    cJSON_AddNumberToObject(o, "cold_hits", (double)r->hits);
    cJSON_AddNumberToObject(o, "cold_misses", (double)r->misses);
    cJSON_AddNumberToObject(o, "rss_bytes", (double)r->rss_kib * 1024.0);
    char *s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(o);
    fflush(stdout);
}

int cmd_batched_bench(int argc, char **argv)
{
    struct cli_model_opts mo = {0};
    const char *npp_s = "128", *ntg_s = "128", *npl_s = "1,2,4,8", *budget_arg = NULL;
    struct cli_tier_opts to = CLI_TIER_OPTS_INIT;
    struct cli_prefill_opts pf = CLI_PREFILL_OPTS_INIT;
    int fill = 0;
    bool json = false, serial = false, stop = false;
    struct kvp_policy_params pp = {0};
    const struct cli_flag flags[] = {
        CLI_STR("-npp", &npp_s),
        CLI_STR("-ntg", &ntg_s),
        CLI_STR("-npl", &npl_s),
        CLI_STR("--policy", &pp.name),
        CLI_STR("--budget", &budget_arg),
        CLI_TIER_FLAGS(&to),
        CLI_PREFILL_FLAGS(&pf),
        CLI_CHOICE("--fill", fill_names, 0, &fill, "prefill, copy or tile"),
        CLI_BOOL("--serial", &serial),
        CLI_BOOL("--stop-before-decode", &stop),
        CLI_BOOL("--json", &json),
        {0},
    };
    int rc =
        cli_parse_policy_command("batched-bench", &mo, &pp, &budget_arg, flags, help, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    long npp[MAX_LIST], ntg[MAX_LIST], npl[MAX_LIST];
    int n_npp, n_ntg, n_npl;
    if ((n_npp = cli_parse_int_list(npp_s, 1, 1 << 24, npp, MAX_LIST)) < 0)
        return cli_fail("-npp: '%s' is not a list of positive token counts", npp_s);
    if ((n_ntg = cli_parse_int_list(ntg_s, 1, 1 << 24, ntg, MAX_LIST)) < 0)
        return cli_fail("-ntg: '%s' is not a list of positive token counts", ntg_s);
    if ((n_npl = cli_parse_int_list(npl_s, 1, 4096, npl, MAX_LIST)) < 0)
        return cli_fail("-npl: '%s' is not a list of sequence counts (1..4096)", npl_s);
    if (budget_arg && !pp.name)
        return cli_fail("--budget needs --policy");
    if (mo.n_ctx > 0)
        return cli_fail("-c: batched-bench sizes each sequence's context itself (npp + 2*ntg)");
    if (cli_tier_check(&to, pp.name != NULL) || cli_prefill_check(&pf))
        return 1;
    if (mo.n_threads <= 0)
        mo.n_threads = 1;
    long max_ctx = 0;
    for (int i = 0; i < n_npp; i++)
        for (int j = 0; j < n_ntg; j++)
            if (npp[i] + 2 * ntg[j] > max_ctx)
                max_ctx = npp[i] + 2 * ntg[j];
    if (max_ctx > (1 << 24))
        return cli_fail("-npp plus twice -ntg is too long a context");
    kvp_model *m = cli_open_model(&mo);
    if (!m)
        return 1;
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_ctx_params shared = cli_ctx_params(&mo, max_ctx);
    struct bench b = {.m = m, .pp = &pp, .pf = &pf, .fill = fill, .serial = serial, .n_vocab = in.n_vocab,
                      .n_layer = in.n_layer,
                      .n_batch = mo.n_batch > 0 ? (int)mo.n_batch : 512};
    b.cp = (struct kvp_ctx_params){.block_size = shared.block_size, .type_k = shared.type_k,
                                   .type_v = shared.type_v};
    cli_tier_apply(&to, &b.cp);
    b.cp.type_k = b.cp.type_k ? b.cp.type_k : KVP_KV_F16;
    b.cp.type_v = b.cp.type_v ? b.cp.type_v : KVP_KV_F16;
    struct kvp_err err = {0};
    struct kvp_engine_params ep = {.n_threads = (int)mo.n_threads, .n_batch = b.n_batch,
                                   .n_ctx = (int)max_ctx, .no_pack = mo.no_pack};
    if (kvp_engine_init(m, &ep, &b.e, &err) < 0) {
        kvp_model_close(m);
        return cli_fail_err(&err);
    }
    if (!json)
        printf("|    PP |     TG |    B |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | "
               "ms/tok/seq | KV RAM MiB | KV cold MiB |\n"
               "|-------|--------|------|----------|----------|----------|----------|"
               "------------|------------|-------------|\n");
    int status = 0;
    /* a short warm-up row, as llama-batched-bench's: page in the weights, start the threads and,
     * with as many sequences as the largest row, let the engine make what a batched step makes
     * once (the weights packed in lanes, tens of ms for a small model), so that no row's decode
     * time counts it; its time is in the JSON as t_warmup_s */
    long warm_npl = 1;
    for (int k = 0; k < n_npl; k++)
        warm_npl = npl[k] > warm_npl ? npl[k] : warm_npl;
    struct row warm = {.npp = 8, .ntg = 2, .npl = warm_npl};
    double t_warm = kvp_time_now();
    if (run_row(&b, &warm) < 0)
        status = 1;
    b.t_warmup = kvp_time_now() - t_warm;
    b.warmup_packed_bytes = kvp_engine_packed_bytes(b.e);
    b.stop = stop; /* not before the warm-up row */
    for (int i = 0; i < n_npp && !status; i++)
        for (int j = 0; j < n_ntg && !status; j++)
            for (int k = 0; k < n_npl && !status; k++) {
                struct row r = {.npp = npp[i], .ntg = ntg[j], .npl = npl[k]};
                if (run_row(&b, &r) < 0) {
                    status = 1;
                    break;
                }
                if (json) {
                    print_json(&b, &r, budget_arg, (int)mo.n_threads, cli_tier_names[to.tier]);
                    continue;
                }
                double n_pp = (double)(fill ? 1 : r.npl) * r.npp;
                printf("| %5ld | %6ld | %4ld | %8.3f | %8.2f | %8.3f | %8.2f | %10.2f | %10.1f | "
                       "%11.1f |\n",
                       r.npp, r.ntg, r.npl, r.t_pp, n_pp / r.t_pp, r.t_tg,
                       (double)r.npl * r.ntg / r.t_tg, 1e3 * r.t_tg / r.ntg,
                       r.kv_resident / 1048576.0, r.kv_cold / 1048576.0);
                fflush(stdout);
            }
    kvp_engine_free(b.e);
    kvp_model_close(m);
    return status;
}
