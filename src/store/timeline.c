/*
 * Timeline of the tiered store as a PNG: what worker 0 and the transfers did during a few
 * decode steps, so the overlap (or its absence) can be seen at a glance.
 *
 * Lanes, top to bottom: COMPUTE (one bar per layer, colour by layer), PREDICT (next-step
 * prediction), STALL (waiting for transfers), READS (cold-tier reads from submit to completion,
 * stacked into sub-lanes where they overlap, colour by layer), WRITES (write-through). A black
 * vertical line marks the start of every token; the axis is in milliseconds from the first one.
 * Labels use a built-in 5x7 pixel font so the picture needs nothing but libpng. kvp_store_png is
 * the minimal writer (RGB, 8 bits); src/eval/png.c on the eval branch may replace it once merged.
 */
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"

#define W 1600
#define LANE_H 36
#define LEFT 110
#define TOP 40
#define READ_SUBLANES 6

struct canvas {
    int w, h;
    uint8_t *px; /* [h][w][3] */
};

static const uint8_t layer_rgb[8][3] = {
    {31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {148, 103, 189},
    {140, 86, 75},  {227, 119, 194}, {188, 189, 34}, {23, 190, 207},
};

static void fill(struct canvas *c, int x0, int y0, int x1, int y1, const uint8_t rgb[3])
{
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > c->w ? c->w : x1;
    y1 = y1 > c->h ? c->h : y1;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++)
            memcpy(c->px + ((size_t)y * c->w + x) * 3, rgb, 3);
}

/* ---- a 5x7 font for the few characters the labels use ---- */

struct glyph {
    char ch;
    uint8_t rows[7]; /* 5 bits per row, bit 4 = leftmost column */
};

static const struct glyph font[] = {
    {'A', {14, 17, 17, 31, 17, 17, 17}}, {'B', {30, 17, 17, 30, 17, 17, 30}},
    {'C', {14, 17, 16, 16, 16, 17, 14}}, {'D', {30, 17, 17, 17, 17, 17, 30}},
    {'E', {31, 16, 16, 30, 16, 16, 31}}, {'F', {31, 16, 16, 30, 16, 16, 16}},
    {'G', {14, 17, 16, 23, 17, 17, 15}}, {'H', {17, 17, 17, 31, 17, 17, 17}},
    {'I', {14, 4, 4, 4, 4, 4, 14}},      {'K', {17, 18, 20, 24, 20, 18, 17}},
    {'L', {16, 16, 16, 16, 16, 16, 31}}, {'M', {17, 27, 21, 21, 17, 17, 17}},
    {'N', {17, 25, 21, 19, 17, 17, 17}}, {'O', {14, 17, 17, 17, 17, 17, 14}},
    {'P', {30, 17, 17, 30, 16, 16, 16}}, {'R', {30, 17, 17, 30, 20, 18, 17}},
    {'S', {15, 16, 16, 14, 1, 1, 30}},   {'T', {31, 4, 4, 4, 4, 4, 4}},
    {'U', {17, 17, 17, 17, 17, 17, 14}}, {'V', {17, 17, 17, 17, 17, 10, 4}},
    {'W', {17, 17, 17, 21, 21, 21, 10}}, {'Y', {17, 17, 10, 4, 4, 4, 4}},
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},
    {'2', {14, 17, 1, 2, 4, 8, 31}},     {'3', {31, 2, 4, 2, 1, 17, 14}},
    {'4', {2, 6, 10, 18, 31, 2, 2}},     {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},
    {'8', {14, 17, 17, 14, 17, 17, 14}}, {'9', {14, 17, 17, 15, 1, 2, 12}},
    {'.', {0, 0, 0, 0, 0, 12, 12}},      {'-', {0, 0, 0, 31, 0, 0, 0}},
    {':', {0, 12, 12, 0, 12, 12, 0}},    {'/', {1, 1, 2, 4, 8, 16, 16}},
};

/* Draw text (upper case; unknown characters are blank) at scale 2 with its top-left at x, y. */
static void text(struct canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    for (; *s; s++, x += 12) {
        const struct glyph *g = NULL;
        for (size_t i = 0; i < sizeof(font) / sizeof(font[0]); i++)
            if (font[i].ch == *s)
                g = &font[i];
        if (!g)
            continue;
        for (int r = 0; r < 7; r++)
            for (int col = 0; col < 5; col++)
                if ((g->rows[r] >> (4 - col)) & 1)
                    fill(c, x + 2 * col, y + 2 * r, x + 2 * col + 2, y + 2 * r + 2, rgb);
    }
}

/* ---- PNG ---- */

static int write_png(const struct canvas *c, const char *path, struct kvp_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: cannot create the timeline PNG", path);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        return kvp_err_set(err, KVP_EIO, "%s: cannot write the timeline PNG", path);
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++)
        png_write_row(png, c->px + (size_t)y * c->w * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    if (fclose(f) != 0)
        return kvp_err_set(err, KVP_EIO, "%s: cannot write the timeline PNG", path);
    return 0;
}

/* ---- the drawing ---- */

enum { LANE_COMPUTE, LANE_PREDICT, LANE_STALL, LANE_READ, LANE_WRITE = LANE_READ + READ_SUBLANES,
       N_LANES };

int kvp_store_timeline_png(const struct kvp_store *s, const char *path, struct kvp_err *err)
{
    double t_min = 0, t_max = 0;
    int n_tok = 0;
    for (int i = 0; i < s->n_ev; i++)
        if (s->ev[i].kind == KVP_EV_TOKEN) {
            t_min = n_tok == 0 || s->ev[i].t0 < t_min ? s->ev[i].t0 : t_min;
            t_max = s->ev[i].t1 > t_max ? s->ev[i].t1 : t_max;
            n_tok++;
        }
    if (n_tok == 0 || t_max <= t_min)
        return kvp_err_set(err, KVP_EINVAL, "no decode step was recorded for the timeline");
    struct canvas c = {.w = W, .h = TOP + N_LANES * LANE_H + 40};
    c.px = malloc((size_t)c.w * c.h * 3);
    if (!c.px)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory for the timeline");
    memset(c.px, 255, (size_t)c.w * c.h * 3);
    static const uint8_t black[3] = {0, 0, 0}, grey[3] = {225, 225, 225}, red[3] = {214, 39, 40},
                         purple[3] = {120, 60, 160}, dark[3] = {90, 90, 90};
    const double span = t_max - t_min, px_per_s = (W - LEFT - 20) / span;
#define X(t) (LEFT + (int)(((t) - t_min) * px_per_s))
    static const char *const names[] = {"COMPUTE", "PREDICT", "STALL", "READS"};
    for (int l = 0; l < N_LANES; l++) {
        int y = TOP + l * LANE_H;
        if (l == LANE_COMPUTE || l == LANE_PREDICT || l == LANE_STALL || l == LANE_READ ||
            l == LANE_WRITE)
            fill(&c, LEFT, y, W - 20, y + 1, grey);
        const char *name = l < LANE_READ + 1 ? names[l] : l == LANE_WRITE ? "WRITES" : NULL;
        if (name)
            text(&c, 6, y + 10, name, black);
    }
    char title[128];
    snprintf(title, sizeof(title), "TIER %s  PREFETCH %s  %d TOKENS  %.2f MS",
             s->tier == KVP_TIER_DISK ? "DISK" : "RAM",
             s->mode == KVP_PREFETCH_DENSE   ? "DENSE"
             : s->mode == KVP_PREFETCH_NONE  ? "NONE"
             : s->mode == KVP_PREFETCH_LAYER ? "LAYER"
                                             : "TOKEN",
             n_tok, span * 1e3);
    text(&c, LEFT, 10, title, black);
    /* reads overlap: greedy sub-lanes by end time */
    double lane_end[READ_SUBLANES] = {0};
    for (int i = 0; i < s->n_ev; i++) {
        const struct kvp_store_event *e = &s->ev[i];
        if (e->t1 < t_min || e->t0 > t_max)
            continue;
        int x0 = X(e->t0 > t_min ? e->t0 : t_min), x1 = X(e->t1 < t_max ? e->t1 : t_max);
        if (x1 <= x0)
            x1 = x0 + 1;
        const uint8_t *col = layer_rgb[(e->layer < 0 ? 0 : e->layer) % 8];
        int lane = -1;
        switch (e->kind) {
        case KVP_EV_LAYER: lane = LANE_COMPUTE; break;
        case KVP_EV_PREDICT: lane = LANE_PREDICT; col = purple; break;
        case KVP_EV_WAIT: lane = LANE_STALL; col = red; break;
        case KVP_EV_WRITE: lane = LANE_WRITE; col = dark; break;
        case KVP_EV_READ:
            lane = LANE_READ;
            for (int k = 0; k < READ_SUBLANES; k++)
                if (lane_end[k] <= e->t0 || k == READ_SUBLANES - 1) {
                    lane = LANE_READ + k;
                    lane_end[k] = e->t1;
                    break;
                }
            break;
        default: break;
        }
        if (lane < 0)
            continue;
        int y = TOP + lane * LANE_H;
        fill(&c, x0, y + 6, x1, y + LANE_H - 6, col);
    }
    /* token boundaries and the axis */
    int y_axis = TOP + N_LANES * LANE_H;
    for (int i = 0; i < s->n_ev; i++)
        if (s->ev[i].kind == KVP_EV_TOKEN) {
            int x = X(s->ev[i].t0);
            fill(&c, x, TOP - 4, x + 2, y_axis, black);
        }
    fill(&c, X(t_max) - 2, TOP - 4, X(t_max), y_axis, black);
    fill(&c, LEFT, y_axis, W - 20, y_axis + 1, black);
    double step = 1e-3; /* a tick every 0.1, 0.2, 0.5, 1, 2, 5, ... ms, about 8 of them */
    static const double nice[] = {1, 2, 5};
    for (double dec = 1e-7; dec < 100; dec *= 10) {
        bool found = false;
        for (int k = 0; k < 3 && !found; k++)
            if (span / (dec * nice[k]) <= 8) {
                step = dec * nice[k];
                found = true;
            }
        if (found)
            break;
    }
    for (double t = 0; t <= span; t += step) {
        int x = X(t_min + t);
        fill(&c, x, y_axis, x + 1, y_axis + 6, black);
        char lab[32];
        snprintf(lab, sizeof(lab), step < 1e-3 ? "%.2f" : "%.1f", t * 1e3);
        text(&c, x - 6, y_axis + 10, lab, black);
    }
    text(&c, W - 60, y_axis + 10, "MS", black);
#undef X
    int rc = write_png(&c, path, err);
    free(c.px);
    return rc;
}
