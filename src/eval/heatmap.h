/*
 * Needle-in-a-haystack accuracy heatmaps (`kvpred eval --task T --heatmap DIR`) drawn the way
 * papers draw them: a figure title, then one or more panels, each a grid of depth rows (the
 * first depth at the top) × length columns coloured red (0 %) through yellow to green (100 %),
 * with the accuracy printed in every cell, the depths beside the rows, the lengths under the
 * columns and the panel's mean accuracy above it; one colour legend on the right serves every
 * panel. Panels share the lengths and depths, so several of them side by side (one per policy ×
 * budget) compare at a glance.
 */
#ifndef KVP_EVAL_HEATMAP_H
#define KVP_EVAL_HEATMAP_H

#include <stdint.h>

#include "core/err.h"

struct kvp_heatmap_panel {
    const char *title; /* above the grid, before the mean; NULL for none */
    const double *acc; /* [n_len][n_depth] accuracies in [0, 1]; NULL leaves the slot empty */
};

struct kvp_heatmap {
    const char *title;    /* first header line (required) */
    const char *subtitle; /* second header line, or NULL */
    const long *lengths;  /* column values, in tokens */
    const long *depths;   /* row values, in percent */
    int n_len, n_depth;
    const struct kvp_heatmap_panel *panels; /* row-major, cols panels to a row */
    int n_panels, cols;
};

/* Draw the figure into a new RGB buffer (*rgb, [*h][*w][3], the caller frees it). Returns 0, or
 * KVP_EINVAL for a malformed description or a figure too large to draw, KVP_ENOMEM. */
int kvp_heatmap_render(const struct kvp_heatmap *hm, uint8_t **rgb, int *w, int *h,
                       struct kvp_err *err);

/* kvp_heatmap_render, then write the figure to path as a PNG (png.h). */
int kvp_heatmap_write_png(const struct kvp_heatmap *hm, const char *path, struct kvp_err *err);

#endif
