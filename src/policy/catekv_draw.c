/*
 * Drawing a CateKV head profile as a PNG (kvp_head_profile_draw, catekv_profile.h).
 *
 * The picture is a grid with one square per (layer, KV head): rows are layers (layer 0 on top),
 * columns KV heads. Consistent heads are blue, adaptive heads orange, both darker for a higher CV
 * (scaled to the profile's largest CV), and adaptive cells carry a small black-and-white square
 * so the classes can be told apart without colour. Row and column numbers are written with the
 * figure font of image/draw.h; under the grid two legend bars show both ramps from the smallest CV
 * (left) to the largest (right), with both values written next to the bars. Pixels are composed
 * in an RGB buffer and written by image/png.h in one call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/draw.h"
#include "image/png.h"
#include "policy/catekv_profile.h"

#define CELL   28 /* cell side in pixels */
#define GAP    2  /* space between cells */
#define FONT   2  /* text scale: digits are 10 × 14 pixels */
#define CHAR_W (KVP_FONT_ADVANCE * FONT)
#define CHAR_H (KVP_FONT_ASCENT * FONT)
#define MARGIN 8

struct canvas {
    int w, h;
    uint8_t *px; /* owned [h][w][3] RGB */
};

static void fill(struct canvas *c, int x0, int y0, int w, int h, const uint8_t rgb[3])
{
    kvp_draw_rect(c->px, c->w, c->h, x0, y0, w, h, rgb);
}

/* Write a number with its top-left corner at (x, y). */
static void text(struct canvas *c, int x, int y, const char *s)
{
    static const uint8_t ink[3] = {40, 40, 40};
    kvp_draw_text(c->px, c->w, c->h, x, y, s, ink, FONT);
}

/* Colour for CV fraction t in [0, 1]: light to dark blue (consistent) or orange (adaptive). */
static void ramp(double t, int adaptive, uint8_t out[3])
{
    static const uint8_t stops[2][2][3] = {{{222, 235, 247}, {8, 48, 107}},
                                           {{254, 230, 206}, {166, 54, 3}}};
    kvp_draw_ramp(stops[adaptive], 2, t, out);
}

int kvp_head_profile_draw(const struct kvp_head_profile *hp, const char *png_path,
                          struct kvp_err *err)
{
    static const uint8_t white[3] = {255, 255, 255}, black[3] = {0, 0, 0};
    const int L = hp->n_layer, H = hp->n_head_kv;
    const int label_w = 6 * CHAR_W + 4, label_h = CHAR_H + 6;
    const int grid_w = H * (CELL + GAP), grid_h = L * (CELL + GAP);
    const int bar_w = grid_w > 160 ? grid_w : 160, bar_h = 12;
    struct canvas c = {.w = MARGIN + label_w + bar_w + 12 * CHAR_W + MARGIN,
                       .h = MARGIN + label_h + grid_h + 8 + 2 * (bar_h + 4) + MARGIN};
    c.px = malloc((size_t)c.w * c.h * 3);
    if (!c.px)
        return kvp_err_set(err, KVP_ENOMEM, "head profile drawing: out of memory");
    memset(c.px, 255, (size_t)c.w * c.h * 3);

    double min_cv = hp->cv[0], max_cv = hp->cv[0];
    for (int i = 0; i < L * H; i++) {
        min_cv = hp->cv[i] < min_cv ? hp->cv[i] : min_cv;
        max_cv = hp->cv[i] > max_cv ? hp->cv[i] : max_cv;
    }
    double span = max_cv - min_cv;
    const int gx = MARGIN + label_w, gy = MARGIN + label_h;
    char buf[32];
    for (int h = 0; h < H; h++) {
        snprintf(buf, sizeof(buf), "%d", h);
        text(&c, gx + h * (CELL + GAP) + 2, MARGIN, buf);
    }
    for (int l = 0; l < L; l++) {
        int y = gy + l * (CELL + GAP);
        snprintf(buf, sizeof(buf), "%d", l);
        text(&c, MARGIN, y + (CELL - CHAR_H) / 2, buf);
        for (int h = 0; h < H; h++) {
            int x = gx + h * (CELL + GAP), a = hp->adaptive[l * H + h] != 0;
            uint8_t rgb[3];
            ramp(span > 0 ? (hp->cv[l * H + h] - min_cv) / span : 0, a, rgb);
            fill(&c, x, y, CELL, CELL, rgb);
            if (a) { /* class mark: black square with a white centre */
                fill(&c, x + CELL / 2 - 5, y + CELL / 2 - 5, 10, 10, black);
                fill(&c, x + CELL / 2 - 3, y + CELL / 2 - 3, 6, 6, white);
            }
        }
    }
    /* legend: consistent ramp, then adaptive ramp, smallest .. largest CV */
    int ly = gy + grid_h + 8;
    for (int k = 0; k < 2; k++)
        for (int x = 0; x < bar_w; x++) {
            uint8_t rgb[3];
            ramp((double)x / (bar_w - 1), k, rgb);
            fill(&c, gx + x, ly + k * (bar_h + 4), 1, bar_h, rgb);
        }
    snprintf(buf, sizeof(buf), "%.3f", max_cv);
    text(&c, gx + bar_w + 6, ly + (2 * bar_h + 4 - CHAR_H) / 2, buf);
    snprintf(buf, sizeof(buf), "%.3f", min_cv);
    text(&c, gx - CHAR_W * (int)strlen(buf) - 4, ly + (2 * bar_h + 4 - CHAR_H) / 2, buf);

    int rc = kvp_png_write_rgb(png_path, c.px, c.w, c.h, err);
    free(c.px);
    return rc;
}

int kvp_head_profile_draw_file(const char *profile_path, const char *png_path,
                               struct kvp_err *err)
{
    struct kvp_head_profile *hp = NULL;
    int rc = kvp_head_profile_read(profile_path, &hp, err);
    if (rc == 0)
        rc = kvp_head_profile_draw(hp, png_path, err);
    kvp_head_profile_free(hp);
    return rc;
}
