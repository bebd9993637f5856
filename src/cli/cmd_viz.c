/*
 * `kvpred viz`: one head's attention over a teacher-forced decode as a PNG.
 *
 * The run is the measurement of `kvpred eval` (src/eval/measure.h) for one policy and budget.
 * Rows are decode steps (first step at the top), columns are key blocks of the KV cache. The left
 * panel is the dense truth: the attention of query head H summed over each block, on a log
 * colour scale from 1e-4 (dark) to 1 (bright yellow). The right panel is what the policy's step
 * read, in the same colours: a block the step read is drawn in the truth's colour (brightened so
 * that low-mass selections stay visible, and faded by the fraction of its tokens that were read),
 * a present block it did not read is dark grey, a block whose tokens were all evicted is dark
 * red, and blocks not yet generated are black. A thin grey column separates the panels.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "eval/measure.h"
#include "image/draw.h"
#include "image/png.h"
#include "policy/catekv_profile.h"
#include "kvpred_lab.h"

#define LOG_FLOOR (-4.0) /* log10 of the smallest block mass with a colour */
#define SEP_W     3      /* separator width in pixels */

static void help(void)
{
    printf("usage: kvpred viz [-m MODEL] (-f TEXT | --tokens-from-seed S) --layer L --head H\n"
           "                  --policy P [--budget B] [--prefill N] [--decode N] -o OUT.png\n\n"
           "Draw query head H of layer L over the decode steps (rows) and key blocks (columns):\n"
           "dense attention per block on a log scale (left) beside the blocks the policy read\n"
           "(right; grey: not read, dark red: evicted, black: not generated yet).\n\n%s"
           "  -f, --file PATH      text to read the tokens from\n"
           "  --offset BYTES       start tokenizing at this byte of the text (default 0)\n"
           "  --tokens-from-seed S random token ids from seed S (models without a tokenizer)\n"
           "  --layer L            layer to draw (a compressed one: >= --dense-layers)\n"
           "  --head H             query head to draw\n"
           "  --policy P           policy (default streaming); known: %s\n"
           "  --budget B           tokens per layer and KV head, or a ratio such as 1/16\n"
           "                       (default 64)\n"
           "  --prefill N          prompt tokens, BOS included (default 256)\n"
           "  --decode N           teacher-forced decode steps (default 256)\n"
           "  -o, --output PATH    the PNG to write\n"
           "  --seed S             seed of random policies (default 0)\n%s",
           cli_model_flags_help, cli_policy_names(), cli_policy_flags_help());
}

struct viz_opts {
    struct cli_model_opts mo;
    struct cli_token_source src;
    struct kvp_policy_params pp;
    long layer, head, n_prefill, n_decode;
    const char *out;
    const char *budget; /* as given */
};

/* What the step callback collects: [n_decode][nb] cells. */
struct viz_grid {
    int layer, head, kvh, nb, bs, n_prefill, n_steps;
    float *mass;    /* owned: dense attention summed over the block */
    float *read;    /* owned: fraction of the block's present tokens the step read */
    uint8_t *state; /* owned: CELL_* */
    bool missing;   /* the layer had no dense row (a dense layer) */
};

enum { CELL_FUTURE = 0, CELL_PRESENT = 1, CELL_EVICTED = 2 };

static void collect_step(void *ud, const struct kvp_measure *ms, int step)
{
    struct viz_grid *g = ud;
    int n_keys = 0;
    const float *a = kvp_ctx_dense_probs(kvp_measure_ctx(ms), g->layer, g->head, &n_keys);
    const uint64_t *rd = kvp_measure_read_mask(ms, g->layer, g->kvh);
    const uint64_t *ev = kvp_measure_evicted_mask(ms, g->layer, g->kvh);
    if (!a || !rd || !ev) {
        g->missing = true;
        return;
    }
    const int bs = g->bs;
    for (int b = 0; b < g->nb; b++) {
        size_t cell = (size_t)step * g->nb + b;
        int t0 = b * bs, t1 = (b + 1) * bs < n_keys ? (b + 1) * bs : n_keys;
        if (t0 >= n_keys) {
            g->state[cell] = CELL_FUTURE;
            continue;
        }
        double m = 0.0;
        int n_read = 0, n_ev = 0;
        for (int t = t0; t < t1; t++) {
            m += a[t];
            n_read += (int)((rd[b] >> (t - t0)) & 1);
            n_ev += (int)((ev[b] >> (t - t0)) & 1);
        }
        g->mass[cell] = (float)m;
        g->read[cell] = (float)n_read / (float)(t1 - t0);
        g->state[cell] = n_ev == t1 - t0 ? CELL_EVICTED : CELL_PRESENT;
    }
}

/* Inferno-like colour ramp, v in [0, 1]. */
static void ramp(double v, uint8_t *rgb)
{
    static const uint8_t stops[5][3] = {
        {0, 0, 4}, {87, 16, 110}, {188, 55, 84}, {249, 142, 9}, {252, 255, 164}};
    kvp_draw_ramp(stops, 5, v, rgb);
}

/* Position of a block mass on the log colour scale, in [0, 1]. */
static double log_level(float mass)
{
    double v = (log10(mass > 1e-12f ? (double)mass : 1e-12) - LOG_FLOOR) / -LOG_FLOOR;
    return v < 0 ? 0 : v > 1 ? 1 : v;
}

/* Colour of one cell of the left (truth) or right (selection) panel. */
static void cell_colour(const struct viz_grid *g, size_t cell, bool right, uint8_t *rgb)
{
    if (g->state[cell] == CELL_FUTURE) {
        rgb[0] = rgb[1] = rgb[2] = 0;
        return;
    }
    double v = log_level(g->mass[cell]);
    if (!right) {
        ramp(v, rgb);
        return;
    }
    if (g->state[cell] == CELL_EVICTED) {
        rgb[0] = (uint8_t)(70 + 40 * v);
        rgb[1] = rgb[2] = 0;
        return;
    }
    uint8_t hi[3];
    ramp(0.35 + 0.65 * v, hi);
    double f = g->read[cell];
    double grey = 28 + 30 * v;
    for (int c = 0; c < 3; c++)
        rgb[c] = (uint8_t)lround(grey + f * (hi[c] - grey));
}

/* Render the grid as two panels and write the PNG. Returns 0 or 1 after printing the error. */
static int draw(const struct viz_grid *g, const char *path)
{
    int cw = 512 / g->nb, ch = 512 / g->n_steps;
    cw = cw < 2 ? 2 : cw > 16 ? 16 : cw;
    ch = ch < 1 ? 1 : ch > 8 ? 8 : ch;
    const int pw = g->nb * cw, w = 2 * pw + SEP_W, h = g->n_steps * ch;
    uint8_t *img = malloc((size_t)w * h * 3);
    if (!img)
        return cli_fail("out of memory");
    for (int y = 0; y < h; y++) {
        uint8_t *row = img + (size_t)y * w * 3;
        for (int x = 0; x < w; x++) {
            uint8_t *px = row + (size_t)x * 3;
            if (x >= pw && x < pw + SEP_W) {
                px[0] = px[1] = px[2] = 160;
                continue;
            }
            bool right = x >= pw + SEP_W;
            int b = (right ? x - pw - SEP_W : x) / cw;
            cell_colour(g, (size_t)(y / ch) * g->nb + b, right, px);
        }
    }
    struct kvp_err err = {0};
    int rc = kvp_png_write_rgb(path, img, w, h, &err);
    free(img);
    return rc < 0 ? cli_fail_err(&err) : 0;
}

/* Parse argv into o. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct viz_opts *o, int argc, char **argv)
{
    const struct cli_flag flags[] = {
        CLI_TOKEN_SOURCE_FLAGS(&o->src),
        CLI_INT("--layer", 0, 1 << 20, &o->layer, "a layer index"),
        CLI_INT("--head", 0, 1 << 20, &o->head, "a head index"),
        CLI_STR("--policy", &o->pp.name),
        CLI_STR("--budget", &o->budget),
        CLI_INT("--prefill", 1, 1 << 24, &o->n_prefill, "a positive token count"),
        CLI_INT("--decode", 1, 1 << 24, &o->n_decode, "a positive token count"),
        CLI_STR("-o|--output", &o->out),
        {0},
    };
    int rc = cli_parse_measure_command("viz", &o->mo, &o->pp, &o->src, flags, help, argc, argv);
    if (rc)
        return rc;
    if (!o->out)
        return cli_fail("viz: give the output file with -o OUT.png");
    if (o->layer < 0 || o->head < 0)
        return cli_fail("viz: give the layer and head to draw with --layer L --head H");
    if (!cli_policy_known(o->pp.name))
        return cli_fail("--policy: unknown policy '%s' (known: %s)", o->pp.name,
                        cli_policy_names());
    if (!cli_parse_budget(o->budget, &o->pp.budget, &o->pp.budget_ratio))
        return cli_fail("--budget: '%s' is not a token count or a ratio in (0, 1] such as 1/16",
                        o->budget);
    return 0;
}

/* Check the layer and head against the model and the policy's dense layers (resolved as
 * kvp_ctx_set_policy does). Returns 0 or 1 after printing the error. */
static int check_layer_head(const struct viz_opts *o, const struct kvp_model_info *info)
{
    int dense = o->pp.dense_layers == 0 ? 2 : o->pp.dense_layers < 0 ? 0 : o->pp.dense_layers;
    if (dense > info->n_layer)
        dense = info->n_layer;
    if (o->layer >= info->n_layer)
        return cli_fail("--layer %ld: the model has %d layers (0..%d)", o->layer, info->n_layer,
                        info->n_layer - 1);
    if (o->head >= info->n_head)
        return cli_fail("--head %ld: the model has %d query heads (0..%d)", o->head, info->n_head,
                        info->n_head - 1);
    if (o->layer < dense)
        return cli_fail("--layer %ld runs dense attention (layers 0..%d are dense): pick a "
                        "layer in %d..%d or lower --dense-layers",
                        o->layer, dense - 1, dense, info->n_layer - 1);
    return 0;
}

int cmd_viz(int argc, char **argv)
{
    /* `kvpred viz --head-profile PROFILE -o OUT.png` draws a CateKV head classification */
    const char *profile = NULL, *png = NULL;
    for (int k = 1; k + 1 < argc; k++) {
        if (!strcmp(argv[k], "--head-profile"))
            profile = argv[k + 1];
        else if (!strcmp(argv[k], "-o"))
            png = argv[k + 1];
    }
    if (profile && png) {
        bool has_layer = false;
        for (int k = 1; k < argc; k++)
            has_layer |= !strcmp(argv[k], "--layer");
        if (!has_layer) {
            struct kvp_err err = {0};
            return kvp_head_profile_draw_file(profile, png, &err) < 0 ? cli_fail_err(&err) : 0;
        }
    }

    struct viz_opts o = {.src = {.seed = -1},
                         .pp = {.name = "streaming", .gqa_agg = KVP_AGG_MEAN},
                         .layer = -1,
                         .head = -1,
                         .n_prefill = 256,
                         .n_decode = 256,
                         .budget = "64"};
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    int status = 1;
    int32_t *tokens = NULL;
    struct kvp_measure *ms = NULL;
    struct viz_grid g = {0};
    kvp_model *model = cli_open_model(&o.mo);
    if (!model)
        return 1;
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    if (check_layer_head(&o, &info))
        goto out;
    long need = o.n_prefill + o.n_decode;
    if (o.mo.n_ctx > 0 && o.mo.n_ctx < need) {
        cli_fail("viz: prefill + decode (%ld) exceed the context -c %ld", need, o.mo.n_ctx);
        goto out;
    }
    tokens = cli_measure_tokens(model, &o.src, (int)need + 1);
    if (!tokens)
        goto out;
    struct kvp_ctx_params cp = cli_ctx_params(&o.mo, 0);
    struct kvp_measure_params mp = {.n_prefill = (int)o.n_prefill, .n_decode = (int)o.n_decode};
    struct kvp_err err = {0};
    if (kvp_measure_init(model, tokens, &cp, &mp, &ms, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    kvp_measure_shape(ms, NULL, NULL, NULL, NULL, &g.bs);
    g.layer = (int)o.layer;
    g.head = (int)o.head;
    g.kvh = (int)o.head / (info.n_head / info.n_head_kv);
    g.n_steps = (int)o.n_decode;
    g.nb = (int)((need + g.bs - 1) / g.bs);
    size_t cells = (size_t)g.n_steps * g.nb;
    g.mass = calloc(cells, sizeof(float));
    g.read = calloc(cells, sizeof(float));
    g.state = calloc(cells, 1);
    if (!g.mass || !g.read || !g.state) {
        cli_fail("out of memory");
        goto out;
    }
    struct kvp_measure_result r;
    if (kvp_measure_run(ms, &o.pp, collect_step, &g, &r, &err) < 0) {
        cli_fail_err(&err);
        goto out;
    }
    fprintf(stderr, "kvpred: %s @ %s: recovery %.4f (layer %d: %.4f), oracle-relative %.4f\n",
            r.p.name, o.budget, r.recovery, g.layer, r.layer_recovery[g.layer],
            r.recovery / r.oracle_block);
    kvp_measure_result_free(&r);
    if (g.missing) {
        cli_fail("viz: layer %d has no measured attention (it runs dense)", g.layer);
        goto out;
    }
    status = draw(&g, o.out);
out:
    free(g.mass);
    free(g.read);
    free(g.state);
    kvp_measure_free(ms);
    free(tokens);
    kvp_model_close(model);
    return status;
}
