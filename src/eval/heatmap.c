/*
 * Accuracy heatmaps (see heatmap.h). The figure is laid out once from the text sizes of its
 * labels (every panel has the same size), then drawn panel by panel; all text is at scale 2 of
 * the draw.h font, so digits are 14 pixels tall.
 */
#include "eval/heatmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/draw.h"
#include "image/png.h"

#define S          2                     /* text scale */
#define CAP        (KVP_FONT_ASCENT * S) /* height of digits and capitals */
#define LINE       (KVP_FONT_H * S)      /* height of a line with descenders */
#define PAD        20                    /* figure margin */
#define GAP        2                     /* white line between cells */
#define CELL_H     34                    /* cell pitch, at least */
#define CELL_W     52                    /* cell pitch, at least: room for "100" */
#define PANEL_GAP  36                    /* between panels, both ways */
#define LEGEND_GAP 32                    /* between the panels and the legend */
#define BAR_W      18                    /* legend colour bar */
#define BAR_H      120                   /* legend colour bar, at least */
#define MAX_SIDE   16384                 /* largest figure side in pixels */
#define MAX_PIXELS (1L << 26)            /* and area: 192 MiB of RGB */

static const char depth_caption[] = "depth (%)", length_caption[] = "length (tokens)",
                  legend_caption[] = "accuracy";

static const uint8_t ink[3] = {25, 25, 25}, grey[3] = {105, 105, 105}, white[3] = {255, 255, 255},
                     frame[3] = {190, 190, 190};

/* ColorBrewer RdYlGn: red for a miss, green for a hit, distinguishable in print. */
static const uint8_t ramp_stops[5][3] = {
    {215, 25, 28}, {253, 174, 97}, {255, 255, 191}, {166, 217, 106}, {26, 150, 65}};

/* Where everything goes; positions inside a panel are relative to its top-left corner. */
struct layout {
    int cell_w, cell_h; /* cell pitch */
    int grid_x, grid_y; /* top-left of the first cell */
    int grid_w, grid_h;
    int panel_w, panel_h;
    int header_h;   /* figure title and subtitle, with the space under them */
    int cols, rows; /* panel columns and rows */
    int legend_x, legend_w, bar_h;
    int w, h; /* the figure */
};

/* Width of s at scale S; long so that layout sums cannot overflow before the size check. */
static long text_w(const char *s)
{
    int w, h;
    kvp_text_size(s, S, &w, &h);
    return w;
}

/* The same once the layout has checked that the figure, hence every text in it, fits. */
static int fit_w(const char *s)
{
    return (int)text_w(s);
}

static long lmax(long a, long b)
{
    return a > b ? a : b;
}

/* Accuracy in whole percent as printed in a cell: 100 only when every sample was right and 0
 * only when every one was wrong, so the two ends are never a rounding of something else. */
static int cell_percent(double a)
{
    if (!(a > 0))
        return 0;
    if (a >= 1)
        return 100;
    int p = (int)(100 * a + 0.5);
    return p < 1 ? 1 : p > 99 ? 99 : p;
}

/* The panel header is its title (ink) then its mean accuracy (grey) two spaces after it. */
static void mean_text(const struct kvp_heatmap *hm, const struct kvp_heatmap_panel *p, char *buf,
                      size_t cap)
{
    int n = hm->n_len * hm->n_depth;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += p->acc[i];
    snprintf(buf, cap, "%s%.1f%%", p->title ? "mean " : "mean accuracy ", 100 * sum / n);
}

static long mean_x(const struct kvp_heatmap_panel *p)
{
    return p->title ? text_w(p->title) + S + 2 * KVP_FONT_ADVANCE * S : 0;
}

static int layout(const struct kvp_heatmap *hm, struct layout *L, struct kvp_err *err)
{
    char buf[64];
    long lab_w = 0, len_w = 0, head_w = 0;
    for (int i = 0; i < hm->n_depth; i++) {
        snprintf(buf, sizeof(buf), "%ld", hm->depths[i]);
        lab_w = lmax(lab_w, text_w(buf));
    }
    for (int i = 0; i < hm->n_len; i++) {
        snprintf(buf, sizeof(buf), "%ld", hm->lengths[i]);
        len_w = lmax(len_w, text_w(buf));
    }
    for (int i = 0; i < hm->n_panels; i++) {
        const struct kvp_heatmap_panel *p = &hm->panels[i];
        if (!p->acc)
            continue;
        mean_text(hm, p, buf, sizeof(buf));
        head_w = lmax(head_w, mean_x(p) + text_w(buf));
    }
    /* labels are at most 20 digits: these fit an int */
    L->cell_w = (int)lmax(CELL_W, len_w + 14);
    /* tall enough that the turned depth caption does not run past the grid */
    L->cell_h = (int)lmax(CELL_H, (text_w(depth_caption) + hm->n_depth - 1) / hm->n_depth + GAP);
    L->grid_x = (int)(LINE + 10 + lab_w + 10);
    L->grid_y = LINE + 10;
    L->header_h = LINE + (hm->subtitle ? 8 + LINE : 0) + 20;
    L->cols = hm->cols < hm->n_panels ? hm->cols : hm->n_panels;
    L->rows = (hm->n_panels + L->cols - 1) / L->cols;
    L->legend_w = (int)lmax(text_w(legend_caption), BAR_W + 10 + text_w("100%"));
    long gw = (long)hm->n_len * L->cell_w - GAP, gh = (long)hm->n_depth * L->cell_h - GAP;
    long pw = lmax(L->grid_x + gw, lmax(head_w, L->grid_x + text_w(length_caption)));
    long ph = L->grid_y + gh + 8 + CAP + 12 + LINE;
    long bar_h = lmax(gh, BAR_H);
    long lx = PAD + L->cols * (pw + PANEL_GAP) - PANEL_GAP + LEGEND_GAP;
    long w = lmax(lx + L->legend_w, PAD + lmax(text_w(hm->title), text_w(hm->subtitle))) + PAD;
    long h = PAD + L->header_h +
             lmax(L->rows * (ph + PANEL_GAP) - PANEL_GAP, L->grid_y + bar_h + CAP) + PAD;
    if (w > MAX_SIDE || h > MAX_SIDE || w * h > MAX_PIXELS)
        return kvp_err_set(err, KVP_EINVAL, "heatmap: a %ld x %ld pixel figure is too large", w, h);
    L->grid_w = (int)gw;
    L->grid_h = (int)gh;
    L->panel_w = (int)pw;
    L->panel_h = (int)ph;
    L->legend_x = (int)lx;
    L->bar_h = (int)bar_h;
    L->w = (int)w;
    L->h = (int)h;
    return 0;
}

/* Titles: the text twice a pixel apart, a bold face for free. */
static void draw_bold(uint8_t *rgb, int w, int h, int x, int y, const char *text)
{
    kvp_draw_text(rgb, w, h, x, y, text, ink, S);
    kvp_draw_text(rgb, w, h, x + 1, y, text, ink, S);
}

/* A panel with its top-left corner at (x0, y0). */
static void draw_panel(uint8_t *rgb, const struct layout *L, const struct kvp_heatmap *hm,
                       const struct kvp_heatmap_panel *p, int x0, int y0)
{
    const int w = L->w, h = L->h, gx = x0 + L->grid_x, gy = y0 + L->grid_y;
    char buf[64];
    draw_bold(rgb, w, h, x0, y0, p->title);
    mean_text(hm, p, buf, sizeof(buf));
    kvp_draw_text(rgb, w, h, x0 + (int)mean_x(p), y0, buf, grey, S);
    for (int di = 0; di < hm->n_depth; di++) {
        int y = gy + di * L->cell_h, ty = y + (L->cell_h - GAP - CAP) / 2;
        snprintf(buf, sizeof(buf), "%ld", hm->depths[di]);
        kvp_draw_text(rgb, w, h, gx - 10 - fit_w(buf), ty, buf, ink, S);
        for (int li = 0; li < hm->n_len; li++) {
            int x1 = gx + li * L->cell_w;
            double a = p->acc[li * hm->n_depth + di];
            uint8_t bg[3];
            kvp_draw_ramp(ramp_stops, 5, a, bg);
            kvp_draw_rect(rgb, w, h, x1, y, L->cell_w - GAP, L->cell_h - GAP, bg);
            /* white on the dark ends of the ramp, black on the light middle */
            const uint8_t *fg = 299 * bg[0] + 587 * bg[1] + 114 * bg[2] < 150000 ? white : ink;
            snprintf(buf, sizeof(buf), "%d", cell_percent(a));
            kvp_draw_text(rgb, w, h, x1 + (L->cell_w - GAP - fit_w(buf)) / 2, ty, buf, fg, S);
        }
    }
    for (int li = 0; li < hm->n_len; li++) {
        snprintf(buf, sizeof(buf), "%ld", hm->lengths[li]);
        kvp_draw_text(rgb, w, h, gx + li * L->cell_w + (L->cell_w - GAP - fit_w(buf)) / 2,
                      gy + L->grid_h + 8, buf, ink, S);
    }
    int cw = fit_w(length_caption);
    kvp_draw_text(rgb, w, h, gx + (cw < L->grid_w ? (L->grid_w - cw) / 2 : 0),
                  gy + L->grid_h + 8 + CAP + 12, length_caption, grey, S);
    kvp_draw_text_up(rgb, w, h, x0, gy + (L->grid_h - fit_w(depth_caption)) / 2, depth_caption,
                     grey, S);
}

/* The colour bar, 100 % at the top, level with the first row of grids. */
static void draw_legend(uint8_t *rgb, const struct layout *L, int y0)
{
    const int w = L->w, h = L->h, x = L->legend_x, y = y0 + L->grid_y;
    kvp_draw_text(rgb, w, h, x, y0, legend_caption, grey, S);
    kvp_draw_rect(rgb, w, h, x - 1, y - 1, BAR_W + 2, L->bar_h + 2, frame);
    for (int i = 0; i < L->bar_h; i++) {
        uint8_t c[3];
        kvp_draw_ramp(ramp_stops, 5, 1.0 - (double)i / (L->bar_h - 1), c);
        kvp_draw_rect(rgb, w, h, x, y + i, BAR_W, 1, c);
    }
    for (int t = 0; t <= 4; t++) {
        char buf[8];
        int ty = y + (L->bar_h - 1) * t / 4;
        snprintf(buf, sizeof(buf), "%d%%", 100 - 25 * t);
        kvp_draw_rect(rgb, w, h, x + BAR_W, ty, 4, 1, ink);
        kvp_draw_text(rgb, w, h, x + BAR_W + 10, ty - CAP / 2, buf, ink, S);
    }
}

int kvp_heatmap_render(const struct kvp_heatmap *hm, uint8_t **rgb, int *w, int *h,
                       struct kvp_err *err)
{
    *rgb = NULL;
    if (!hm || !hm->title || !hm->lengths || !hm->depths || !hm->panels || hm->n_len < 1 ||
        hm->n_depth < 1 || hm->n_panels < 1 || hm->cols < 1 || hm->n_len > MAX_SIDE ||
        hm->n_depth > MAX_SIDE || hm->n_panels > MAX_SIDE)
        return kvp_err_set(err, KVP_EINVAL, "heatmap: bad figure description");
    struct layout L = {0};
    if (layout(hm, &L, err) < 0)
        return KVP_EINVAL;
    uint8_t *px = malloc((size_t)L.w * (size_t)L.h * 3);
    if (!px)
        return kvp_err_set(err, KVP_ENOMEM, "heatmap: out of memory");
    memset(px, 255, (size_t)L.w * (size_t)L.h * 3);
    draw_bold(px, L.w, L.h, PAD, PAD, hm->title);
    if (hm->subtitle)
        kvp_draw_text(px, L.w, L.h, PAD, PAD + LINE + 8, hm->subtitle, grey, S);
    int top = PAD + L.header_h;
    for (int i = 0; i < hm->n_panels; i++)
        if (hm->panels[i].acc)
            draw_panel(px, &L, hm, &hm->panels[i], PAD + i % L.cols * (L.panel_w + PANEL_GAP),
                       top + i / L.cols * (L.panel_h + PANEL_GAP));
    draw_legend(px, &L, top);
    *rgb = px;
    *w = L.w;
    *h = L.h;
    return 0;
}

int kvp_heatmap_write_png(const struct kvp_heatmap *hm, const char *path, struct kvp_err *err)
{
    uint8_t *rgb;
    int w, h, rc = kvp_heatmap_render(hm, &rgb, &w, &h, err);
    if (rc == 0)
        rc = kvp_png_write_rgb(path, rgb, w, h, err);
    free(rgb);
    return rc;
}
