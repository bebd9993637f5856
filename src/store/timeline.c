/*
 * Timeline of the tiered store as a PNG: what worker 0 and the transfers did during a few
 * decode steps, so the overlap (or its absence) can be seen at a glance.
 *
 * Lanes, top to bottom: COMPUTE (one bar per layer, colour by layer), PREDICT (next-step
 * prediction), STALL (waiting for transfers), READS (cold-tier reads from submit to completion,
 * stacked into sub-lanes where they overlap, colour by layer), WRITES (write-through). A black
 * vertical line marks the start of every token; the axis is in milliseconds from the first one.
 * Labels use the figure font of image/draw.h and image/png.h writes the file, so the picture needs
 * nothing but libpng.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/draw.h"
#include "image/png.h"
#include "store/store_internal.h"

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
    kvp_draw_rect(c->px, c->w, c->h, x0, y0, x1 - x0, y1 - y0, rgb);
}

/* Labels at scale 2 with their top-left corner at x, y. */
static void text(struct canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    kvp_draw_text(c->px, c->w, c->h, x, y, s, rgb, 2);
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
    char tier[16];
    size_t nc = 0;
    for (; s->io->name[nc] && nc + 1 < sizeof(tier); nc++) /* the figure font is upper case */
        tier[nc] = (char)toupper((unsigned char)s->io->name[nc]);
    tier[nc] = 0;
    char title[128];
    snprintf(title, sizeof(title), "TIER %s  PREFETCH %s  %d TOKENS  %.2f MS",
             tier,
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
    int rc = kvp_png_write_rgb(path, c.px, c.w, c.h, err);
    free(c.px);
    return rc;
}
