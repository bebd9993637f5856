/*
 * Drawing a CateKV head profile as a PNG (kvp_head_profile_draw, catekv_profile.h).
 *
 * The picture is a grid with one square per (layer, KV head): rows are layers (layer 0 on top),
 * columns KV heads. Consistent heads are blue, adaptive heads orange, both darker for a higher CV
 * (scaled to the profile's largest CV), and adaptive cells carry a small black-and-white square
 * so the classes can be told apart without colour. Row and column numbers are written with a
 * 3×5 pixel digit font; under the grid two legend bars show both ramps from the smallest CV
 * (left) to the largest (right), with both values written next to the bars. Pixels are composed in
 * an RGB buffer and written with libpng in one call; nothing here depends on the eval module's PNG
 * writer.
 */
#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/catekv_profile.h"

#define CELL   28 /* cell side in pixels */
#define GAP    2  /* space between cells */
#define FONT   2  /* digit font scale: glyphs are 6 × 10 pixels */
#define MARGIN 8

struct canvas {
    int w, h;
    uint8_t *px; /* owned [h][w][3] RGB */
};

static void fill(struct canvas *c, int x0, int y0, int w, int h, const uint8_t rgb[3])
{
    for (int y = y0 < 0 ? 0 : y0; y < y0 + h && y < c->h; y++)
        for (int x = x0 < 0 ? 0 : x0; x < x0 + w && x < c->w; x++)
            memcpy(c->px + ((size_t)y * c->w + x) * 3, rgb, 3);
}

/* 3×5 glyphs, one row per byte (bit 2 = left column): 0-9 then '.' */
static const uint8_t glyphs[11][5] = {
    {7, 5, 5, 5, 7}, {2, 6, 2, 2, 7}, {7, 1, 7, 4, 7}, {7, 1, 7, 1, 7},
    {5, 5, 7, 1, 1}, {7, 4, 7, 1, 7}, {7, 4, 7, 5, 7}, {7, 1, 1, 1, 1},
    {7, 5, 7, 5, 7}, {7, 5, 7, 1, 7}, {0, 0, 0, 0, 2},
};

/* Write a string of digits and dots at (x, y); returns the x after it. */
static int text(struct canvas *c, int x, int y, const char *s)
{
    static const uint8_t ink[3] = {40, 40, 40};
    for (; *s; s++) {
        int g = *s == '.' ? 10 : (*s >= '0' && *s <= '9') ? *s - '0' : -1;
        if (g < 0) {
            x += 4 * FONT;
            continue;
        }
        for (int r = 0; r < 5; r++)
            for (int b = 0; b < 3; b++)
                if ((glyphs[g][r] >> (2 - b)) & 1)
                    fill(c, x + b * FONT, y + r * FONT, FONT, FONT, ink);
        x += 4 * FONT;
    }
    return x;
}

/* Colour for CV fraction t in [0, 1]: light to dark blue (consistent) or orange (adaptive). */
static void ramp(double t, int adaptive, uint8_t out[3])
{
    static const uint8_t lo[2][3] = {{222, 235, 247}, {254, 230, 206}};
    static const uint8_t hi[2][3] = {{8, 48, 107}, {166, 54, 3}};
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    for (int i = 0; i < 3; i++)
        out[i] = (uint8_t)lrint(lo[adaptive][i] + (hi[adaptive][i] - lo[adaptive][i]) * t);
}

static int write_png(const struct canvas *c, const char *path, struct kvp_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: cannot open for writing: %s", path, strerror(errno));
    png_image img;
    memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)c->w;
    img.height = (png_uint_32)c->h;
    img.format = PNG_FORMAT_RGB;
    int ok = png_image_write_to_stdio(&img, f, 0, c->px, c->w * 3, NULL);
    int closed = fclose(f);
    if (!ok || closed != 0)
        return kvp_err_set(err, KVP_EIO, "%s: PNG write failed%s%s", path,
                           img.message[0] ? ": " : "", img.message);
    return 0;
}

int kvp_head_profile_draw(const struct kvp_head_profile *hp, const char *png_path,
                          struct kvp_err *err)
{
    static const uint8_t white[3] = {255, 255, 255}, black[3] = {0, 0, 0};
    const int L = hp->n_layer, H = hp->n_head_kv;
    const int label_w = 6 * 4 * FONT + 4, label_h = 5 * FONT + 6;
    const int grid_w = H * (CELL + GAP), grid_h = L * (CELL + GAP);
    const int bar_w = grid_w > 160 ? grid_w : 160, bar_h = 12;
    struct canvas c = {.w = MARGIN + label_w + bar_w + 12 * 4 * FONT + MARGIN,
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
        text(&c, MARGIN, y + (CELL - 5 * FONT) / 2, buf);
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
    text(&c, gx + bar_w + 6, ly + (2 * bar_h + 4 - 5 * FONT) / 2, buf);
    snprintf(buf, sizeof(buf), "%.3f", min_cv);
    text(&c, gx - 4 * FONT * (int)strlen(buf) - 4, ly + (2 * bar_h + 4 - 5 * FONT) / 2, buf);

    int rc = write_png(&c, png_path, err);
    free(c.px);
    return rc;
}
