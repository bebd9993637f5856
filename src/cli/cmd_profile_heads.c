/*
 * `kvpred profile-heads`: CateKV static head identification (docs/methods.md §2.4). Cuts
 * reference texts into samples of --prefill tokens, classifies every sample dynamically with the
 * catekv policy (its CVs over layers × KV heads), votes for the fraction r of adaptive heads and
 * writes a head profile (format: src/policy/catekv_profile.h) for `--head-profile` /
 * params.head_profile.
 *
 * `kvpred viz-heads`: draws a head profile as a PNG grid (kvp_head_profile_draw_file, which
 * `kvpred viz` also calls for its --head-profile mode).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "forward/catekv_ctx.h"
#include "policy/catekv_profile.h"

#define MAX_REFS 64

static const char *profile_usage =
    "usage: kvpred profile-heads -m MODEL -f REFERENCE [-f REFERENCE ...] -r R -o PROFILE "
    "[options]\n\n"
    "Classify KV heads as CateKV adaptive (1) or consistent (0) by voting over reference\n"
    "samples (CateKV's static identification) and write a head profile.\n\n"
    "  -f, --file PATH      reference text (repeatable; keep it disjoint from evaluation text)\n"
    "  -r, --ratio R        fraction of adaptive heads, 0..1\n"
    "  -o, --output PATH    profile file to write\n"
    "  --prefill N          tokens per sample, BOS included (default 256)\n"
    "  --samples N          at most N samples over all files (default 32)\n"
    "  --skip-frac F        skip the first fraction F of every file's bytes (default 0)\n"
    "  --chunk N            chunk size c (default 8)\n"
    "  --tail N             unchunked prompt tail (default 32)\n"
    "  --sink N             sink tokens S (default 16)\n"
    "  --recent N           recent window R (default 16)\n"
    "  --window N           observation window w (default 32)\n"
    "  --percentile K       binarization quantile k (default 0.995)\n"
    "  --alpha A            binarization interpolation (default 1.0)\n";

static void profile_help(void)
{
    fputs(profile_usage, stdout);
    fputs(cli_model_flags_help, stdout);
}

struct profile_opts {
    struct cli_model_opts mo;
    const char *refs[MAX_REFS];
    int n_refs;
    double ratio;
    const char *out;
    long prefill, samples;
    double skip_frac;
    long chunk, tail, sink, recent, window;
    double percentile, alpha;
};

/* Returns 0, 1 after --help, or -1 after printing an error. */
static int parse_profile_args(int argc, char **argv, struct profile_opts *o)
{
    const struct cli_flag flags[] = {
        CLI_LIST("-f|--file", o->refs, &o->n_refs, MAX_REFS),
        CLI_FLOAT("-r|--ratio", 0, 1, &o->ratio, NULL),
        CLI_STR("-o|--output", &o->out),
        CLI_INT("--prefill", 0, 1 << 24, &o->prefill, NULL),
        CLI_INT("--samples", 0, 1 << 24, &o->samples, NULL),
        CLI_FLOAT("--skip-frac", 0, 0.999, &o->skip_frac, NULL),
        CLI_INT("--chunk", 0, 1 << 24, &o->chunk, NULL),
        CLI_INT("--tail", 0, 1 << 24, &o->tail, NULL),
        CLI_INT("--sink", 0, 1 << 24, &o->sink, NULL),
        CLI_INT("--recent", 0, 1 << 24, &o->recent, NULL),
        CLI_INT("--window", 0, 1 << 24, &o->window, NULL),
        CLI_FLOAT("--percentile", 0, 1, &o->percentile, NULL),
        CLI_FLOAT("--alpha", 0, 1, &o->alpha, NULL),
        {0},
    };
    o->ratio = -1;
    const struct cli_command cmd = {
        .name = "profile-heads", .mo = &o->mo, .flags = flags, .help = profile_help};
    int rc = cli_parse_command(&cmd, argc, argv);
    if (rc)
        return rc == 2 ? 1 : -1;
    if (!o->n_refs || o->ratio < 0 || !o->out)
        return cli_fail("profile-heads needs -f REFERENCE, -r R and -o PROFILE (see --help)"), -1;
    if (o->prefill == 0)
        o->prefill = 256;
    if (o->samples == 0)
        o->samples = 32;
    if (o->prefill < 2)
        return cli_fail("--prefill must be at least 2"), -1;
    return 0;
}

/* Tokenize the part of one reference file after skip_frac and append its samples. */
static int add_samples(const kvp_model *m, const struct profile_opts *o, const char *path,
                       int32_t *samples, long *n_samples)
{
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text)
        return -1;
    size_t skip = (size_t)(o->skip_frac * (double)len);
    while (skip < len && (text[skip] & 0xc0) == 0x80)
        skip++; /* do not start inside a UTF-8 sequence */
    size_t n;
    int32_t *ids = cli_tokenize(m, text + skip, len - skip, false, &n);
    free(text);
    if (!ids)
        return -1;
    long per = o->prefill - 1;
    for (size_t at = 0; at + (size_t)per <= n && *n_samples < o->samples; at += (size_t)per) {
        int32_t *s = samples + (size_t)*n_samples * o->prefill;
        s[0] = kvp_token_bos(m);
        memcpy(s + 1, ids + at, (size_t)per * sizeof(int32_t));
        ++*n_samples;
    }
    free(ids);
    return 0;
}

int cmd_profile_heads(int argc, char **argv)
{
    struct profile_opts o = {0};
    int parsed = parse_profile_args(argc, argv, &o);
    if (parsed != 0)
        return parsed < 0 ? 1 : 0; /* error, or --help printed */
    int status = 1;
    kvp_model *m = cli_open_model(&o.mo);
    if (!m)
        return 1;
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    int n_heads = info.n_layer * info.n_head_kv;
    int32_t *samples = malloc((size_t)o.samples * o.prefill * sizeof(int32_t));
    double *cvs = malloc((size_t)o.samples * n_heads * sizeof(double));
    kvp_ctx *c = NULL;
    struct kvp_head_profile *hp = NULL;
    struct kvp_err err = {0};
    long n_samples = 0;
    if (!samples || !cvs) {
        cli_fail("out of memory");
        goto out;
    }
    for (int i = 0; i < o.n_refs && n_samples < o.samples; i++)
        if (add_samples(m, &o, o.refs[i], samples, &n_samples) < 0)
            goto out;
    if (n_samples == 0) {
        cli_fail("the reference text holds no sample of %ld tokens", o.prefill);
        goto out;
    }
    c = cli_open_ctx(m, &o.mo, o.prefill);
    if (!c)
        goto out;
    struct kvp_policy_params pp = {
        .name = "catekv",
        .chunk = (int)o.chunk,
        .tail_tokens = o.tail ? (int)o.tail : 0,
        .sink = (int)o.sink,
        .local = (int)o.recent,
        .window = (int)o.window,
        .percentile = (float)o.percentile,
        .alpha = (float)o.alpha,
    };
    /* defaults as the policy resolves them, so the budget below is sink + recent */
    int chunk = pp.chunk ? pp.chunk : 8, sink = pp.sink ? pp.sink : 16;
    int recent = pp.local ? pp.local : 16;
    pp.budget = sink + recent; /* CVs do not depend on B; it only has to be below n */
    if (kvp_ctx_set_policy(c, &pp, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    for (long s = 0; s < n_samples; s++)
        if (kvp_catekv_sample_cv(c, samples + (size_t)s * o.prefill, (int)o.prefill,
                                 cvs + (size_t)s * n_heads, &err) < 0) {
            cli_fail_err(&err);
            goto out;
        }
    if (kvp_head_profile_vote(cvs, (int)n_samples, info.n_layer, info.n_head_kv, o.ratio, &hp,
                              &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    snprintf(hp->model, sizeof(hp->model), "%s", info.name ? info.name : "");
    for (char *p = hp->model; *p; p++)
        *p = (*p == '\n' || *p == '\r') ? ' ' : *p;
    hp->n_prompt = (int)o.prefill;
    hp->chunk = chunk;
    hp->tail_tokens = pp.tail_tokens ? pp.tail_tokens : 32;
    hp->sink = sink;
    hp->recent = recent;
    hp->window = pp.window ? pp.window : 32;
    hp->percentile = pp.percentile ? pp.percentile : 0.995;
    hp->alpha = pp.alpha ? pp.alpha : 1.0;
    if (kvp_head_profile_write(hp, o.out, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    printf("%s: %ld samples of %ld tokens, r = %g: %d of %d KV heads adaptive\n", o.out, n_samples,
           o.prefill, o.ratio, kvp_head_profile_n_adaptive(hp), n_heads);
    for (int l = 0; l < info.n_layer; l++) {
        printf("  layer %2d:", l);
        for (int h = 0; h < info.n_head_kv; h++)
            printf(" %c%.3f", hp->adaptive[l * info.n_head_kv + h] ? '*' : ' ',
                   hp->cv[l * info.n_head_kv + h]);
        printf("\n");
    }
    status = 0;
out:
    kvp_head_profile_free(hp);
    kvp_ctx_free(c);
    free(samples);
    free(cvs);
    kvp_model_close(m);
    return status;
}

int cmd_viz_heads(int argc, char **argv)
{
    const char *profile = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts("usage: kvpred viz-heads --head-profile PROFILE -o OUT.png\n\n"
                 "Draw a CateKV head profile: rows = layers, columns = KV heads; blue =\n"
                 "consistent, orange with a square mark = adaptive, darker = higher CV.");
            return 0;
        }
        const char **dst = !strcmp(a, "--head-profile")                   ? &profile
                           : (!strcmp(a, "-o") || !strcmp(a, "--output")) ? &out
                                                                          : NULL;
        if (!dst)
            return cli_fail("viz-heads: unknown flag %s", a);
        if (!(*dst = cli_flag_value(argc, argv, &i)))
            return 1;
    }
    if (!profile || !out)
        return cli_fail("viz-heads needs --head-profile PROFILE and -o OUT.png");
    struct kvp_err err = {0};
    return kvp_head_profile_draw_file(profile, out, &err) < 0 ? cli_fail_err(&err) : 0;
}
