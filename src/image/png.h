/*
 * A minimal PNG writer for the figures kvpred draws (viz, eval heatmaps, store timelines, head
 * profiles): 8-bit RGB, no interlace, through libpng. The library never prints; libpng's own
 * messages are captured into kvp_err.
 */
#ifndef KVP_IMAGE_PNG_H
#define KVP_IMAGE_PNG_H

#include <stdint.h>

#include "core/err.h"

/* Write a w × h RGB image (rgb: [h][w][3] bytes, row 0 at the top) to path. Returns 0, or
 * KVP_EINVAL for a bad size, KVP_EIO when the file cannot be written, with err filled. */
int kvp_png_write_rgb(const char *path, const uint8_t *rgb, int w, int h, struct kvp_err *err);

#endif
