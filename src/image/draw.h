/*
 * Drawing into the RGB buffers kvpred's figures are made of ([h][w][3] bytes, row 0 at the top,
 * written with png.h): filled rectangles, colour ramps and text in a built-in bitmap font, so a
 * figure can carry its own title, axis labels and legend with nothing but libpng.
 *
 * The font is monospaced and covers printable ASCII (32..126). A glyph is KVP_FONT_W ×
 * KVP_FONT_H pixels at scale 1: KVP_FONT_ASCENT rows down to the baseline (capitals and digits
 * fill them), then the descender rows (g, j, p, q, y, the comma tails). Any other byte is drawn
 * as a hollow box, once per UTF-8 character. '\n' starts a new line.
 *
 * Every call clips to the image: any position or size is allowed, nothing outside the w × h
 * buffer is ever written.
 */
#ifndef KVP_IMAGE_DRAW_H
#define KVP_IMAGE_DRAW_H

#include <stdint.h>

#define KVP_FONT_W       5  /* glyph width */
#define KVP_FONT_H       9  /* glyph height, descenders included */
#define KVP_FONT_ASCENT  7  /* rows above the baseline */
#define KVP_FONT_ADVANCE 6  /* pen step from one character to the next */
#define KVP_FONT_LINE    11 /* pen step from one line to the next */

/* Fill the rectangle of rw × rh pixels with its top-left corner at (x, y). */
void kvp_draw_rect(uint8_t *rgb, int w, int h, int x, int y, int rw, int rh,
                   const uint8_t color[3]);

/* Draw text with the top-left corner of its first glyph cell at (x, y), every font pixel a
 * scale × scale square (scale is clamped to 1..4096). */
void kvp_draw_text(uint8_t *rgb, int w, int h, int x, int y, const char *text,
                   const uint8_t color[3], int scale);

/* The same text turned 90° counter-clockwise (read bottom to top, as a y-axis caption): (x, y)
 * is the top-left corner of the turned text's bounding box, whose size is kvp_text_size's
 * with width and height swapped. */
void kvp_draw_text_up(uint8_t *rgb, int w, int h, int x, int y, const char *text,
                      const uint8_t color[3], int scale);

/* Size in pixels of the ink box of text drawn at scale: the widest line from the left edge of
 * its first glyph to the right edge of its last, and from the top of the first line to the
 * bottom of the last line's descenders. 0 × 0 for "". */
void kvp_text_size(const char *text, int scale, int *width, int *height);

/* Colour at v in [0, 1] (clamped) on the piecewise-linear ramp through n >= 2 evenly spaced
 * stops. */
void kvp_draw_ramp(const uint8_t (*stops)[3], int n, double v, uint8_t out[3]);

#endif
