/*
 * Rectangles, colour ramps and the bitmap font of kvpred's figures (see draw.h).
 *
 * The font was drawn for kvpred on a 5 × 9 grid: capitals and digits 7 rows tall, lower case
 * 5 rows tall (x-height) with ascenders reaching the capitals and 2 descender rows below the
 * baseline. It is kept as a picture, eight glyphs to a band of 9 strings, so a glyph can be read
 * and edited in place; drawing looks the pixels up directly.
 */
#include "image/draw.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define PER_BAND 8

/* Characters 32..126; '#' is a lit pixel, glyphs are separated by one space. */
static const char sheet[12 * KVP_FONT_H][PER_BAND * (KVP_FONT_W + 1)] = {
    /* space !     "     #     $     %     &     '     */
    "..... ..#.. .#.#. .#.#. ..#.. ##... .##.. ..#..",
    "..... ..#.. .#.#. .#.#. .#### ##..# #..#. ..#..",
    "..... ..#.. .#.#. ##### #.#.. ...#. #.#.. .#...",
    "..... ..#.. ..... .#.#. .###. ..#.. .#... .....",
    "..... ..#.. ..... ##### ..#.# .#... #.#.# .....",
    "..... ..... ..... .#.#. ####. #..## #..#. .....",
    "..... ..#.. ..... .#.#. ..#.. ...## .##.# .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    /* (     )     *     +     ,     -     .     /     */
    "...#. .#... ..... ..... ..... ..... ..... ....#",
    "..#.. ..#.. ..#.. ..#.. ..... ..... ..... ....#",
    ".#... ...#. #.#.# ..#.. ..... ..... ..... ...#.",
    ".#... ...#. .###. ##### ..... .###. ..... ..#..",
    ".#... ...#. #.#.# ..#.. ..... ..... ..... .#...",
    "..#.. ..#.. ..#.. ..#.. .##.. ..... .##.. #....",
    "...#. .#... ..... ..... .##.. ..... .##.. #....",
    "..... ..... ..... ..... ..#.. ..... ..... .....",
    "..... ..... ..... ..... .#... ..... ..... .....",
    /* 0     1     2     3     4     5     6     7     */
    ".###. ..#.. .###. .###. ...#. ##### ..##. #####",
    "#...# .##.. #...# #...# ..##. #.... .#... ....#",
    "#...# ..#.. ....# ....# .#.#. ####. #.... ...#.",
    "#.#.# ..#.. ...#. ..##. #..#. ....# ####. ..#..",
    "#...# ..#.. ..#.. ....# ##### ....# #...# .#...",
    "#...# ..#.. .#... #...# ...#. #...# #...# .#...",
    ".###. .###. ##### .###. ...#. .###. .###. .#...",
    "..... ..... ..... ..... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    /* 8     9     :     ;     <     =     >     ?     */
    ".###. .###. ..... ..... ...#. ..... .#... .###.",
    "#...# #...# .##.. .##.. ..#.. ..... ..#.. #...#",
    "#...# #...# .##.. .##.. .#... ##### ...#. ....#",
    ".###. .#### ..... ..... #.... ..... ....# ...#.",
    "#...# ....# .##.. .##.. .#... ##### ...#. ..#..",
    "#...# ...#. .##.. .##.. ..#.. ..... ..#.. .....",
    ".###. .##.. ..... ..#.. ...#. ..... .#... ..#..",
    "..... ..... ..... .#... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    /* @     A     B     C     D     E     F     G     */
    ".###. .###. ####. .###. ###.. ##### ##### .###.",
    "#...# #...# #...# #...# #..#. #.... #.... #...#",
    "#.### #...# #...# #.... #...# #.... #.... #....",
    "#.#.# ##### ####. #.... #...# ####. ####. #.###",
    "#.### #...# #...# #.... #...# #.... #.... #...#",
    "#.... #...# #...# #...# #..#. #.... #.... #...#",
    ".###. #...# ####. .###. ###.. ##### #.... .####",
    "..... ..... ..... ..... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    /* H     I     J     K     L     M     N     O     */
    "#...# .###. ..### #...# #.... #...# #...# .###.",
    "#...# ..#.. ...#. #..#. #.... ##.## #...# #...#",
    "#...# ..#.. ...#. #.#.. #.... #.#.# ##..# #...#",
    "##### ..#.. ...#. ##... #.... #.#.# #.#.# #...#",
    "#...# ..#.. ...#. #.#.. #.... #...# #..## #...#",
    "#...# ..#.. #..#. #..#. #.... #...# #...# #...#",
    "#...# .###. .##.. #...# ##### #...# #...# .###.",
    "..... ..... ..... ..... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    /* P     Q     R     S     T     U     V     W     */
    "####. .###. ####. .#### ##### #...# #...# #...#",
    "#...# #...# #...# #.... ..#.. #...# #...# #...#",
    "#...# #...# #...# #.... ..#.. #...# #...# #...#",
    "####. #...# ####. .###. ..#.. #...# #...# #.#.#",
    "#.... #.#.# #.#.. ....# ..#.. #...# #...# #.#.#",
    "#.... #..#. #..#. ....# ..#.. #...# .#.#. #.#.#",
    "#.... .##.# #...# ####. ..#.. .###. ..#.. .#.#.",
    "..... ..... ..... ..... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    /* X     Y     Z     [     \\    ]     ^     _     */
    "#...# #...# ##### .###. #.... .###. ..#.. .....",
    "#...# #...# ....# .#... #.... ...#. .#.#. .....",
    ".#.#. .#.#. ...#. .#... .#... ...#. #...# .....",
    "..#.. ..#.. ..#.. .#... ..#.. ...#. ..... .....",
    ".#.#. ..#.. .#... .#... ...#. ...#. ..... .....",
    "#...# ..#.. #.... .#... ....# ...#. ..... .....",
    "#...# ..#.. ##### .###. ....# .###. ..... .....",
    "..... ..... ..... ..... ..... ..... ..... .....",
    "..... ..... ..... ..... ..... ..... ..... #####",
    /* `     a     b     c     d     e     f     g     */
    ".#... ..... #.... ..... ....# ..... ..##. .....",
    "..#.. ..... #.... ..... ....# ..... .#..# .....",
    "...#. .###. ####. .###. .#### .###. .#... .####",
    "..... ....# #...# #.... #...# #...# ####. #...#",
    "..... .#### #...# #.... #...# ##### .#... #...#",
    "..... #...# #...# #...# #...# #.... .#... #...#",
    "..... .#### ####. .###. .#### .###. .#... .####",
    "..... ..... ..... ..... ..... ..... ..... ....#",
    "..... ..... ..... ..... ..... ..... ..... .###.",
    /* h     i     j     k     l     m     n     o     */
    "#.... ..#.. ...#. #.... .##.. ..... ..... .....",
    "#.... ..... ..... #.... ..#.. ..... ..... .....",
    "#.##. .##.. ..##. #..#. ..#.. ##.#. #.##. .###.",
    "##..# ..#.. ...#. #.#.. ..#.. #.#.# ##..# #...#",
    "#...# ..#.. ...#. ##... ..#.. #.#.# #...# #...#",
    "#...# ..#.. ...#. #.#.. ..#.. #.#.# #...# #...#",
    "#...# .###. ...#. #..#. .###. #.#.# #...# .###.",
    "..... ..... #..#. ..... ..... ..... ..... .....",
    "..... ..... .##.. ..... ..... ..... ..... .....",
    /* p     q     r     s     t     u     v     w     */
    "..... ..... ..... ..... .#... ..... ..... .....",
    "..... ..... ..... ..... .#... ..... ..... .....",
    "####. .#### #.##. .#### ####. #...# #...# #...#",
    "#...# #...# ##..# #.... .#... #...# #...# #...#",
    "#...# #...# #.... .###. .#... #...# #...# #.#.#",
    "#...# #...# #.... ....# .#..# #..## .#.#. #.#.#",
    "####. .#### #.... ####. ..##. .##.# ..#.. .#.#.",
    "#.... ....# ..... ..... ..... ..... ..... .....",
    "#.... ....# ..... ..... ..... ..... ..... .....",
    /* x     y     z     {     |     }     ~     */
    "..... ..... ..... ...## ..#.. ##... .....",
    "..... ..... ..... ..#.. ..#.. ..#.. .....",
    "#...# #...# ##### ..#.. ..#.. ..#.. .#...",
    ".#.#. #...# ...#. .#... ..#.. ...#. #.#.#",
    "..#.. #...# ..#.. ..#.. ..#.. ..#.. ...#.",
    ".#.#. #...# .#... ..#.. ..#.. ..#.. .....",
    "#...# .#### ##### ...## ..#.. ##... .....",
    "..... ....# ..... ..... ..#.. ..... .....",
    "..... .###. ..... ..... ..#.. ..... .....",
};

/* Whether pixel (col, row) of character c is lit; c < 0 is the hollow box of unknown
 * characters. */
static bool lit(int c, int col, int row)
{
    if (c < 32 || c > 126)
        return row < KVP_FONT_ASCENT &&
               (row == 0 || row == KVP_FONT_ASCENT - 1 || col == 0 || col == KVP_FONT_W - 1);
    int g = c - 32;
    return sheet[g / PER_BAND * KVP_FONT_H + row][g % PER_BAND * (KVP_FONT_W + 1) + col] == '#';
}

/* The next character of *s, advancing past it: printable ASCII and '\n' as themselves, -1 for
 * anything else, a whole UTF-8 sequence counting as one character. */
static int next_char(const char **s)
{
    unsigned char c = (unsigned char)*(*s)++;
    if (c < 0x80)
        return (c >= 32 && c <= 126) || c == '\n' ? c : -1;
    if (c >= 0xc0)
        while (((unsigned char)**s & 0xc0) == 0x80)
            (*s)++;
    return -1;
}

/* Fill [x0, x1) × [y0, y1) clipped to the image; long so that no sum of int positions and sizes
 * can overflow before the clipping. */
static void fill(uint8_t *rgb, int w, int h, long x0, long y0, long x1, long y1,
                 const uint8_t color[3])
{
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > w ? w : x1;
    y1 = y1 > h ? h : y1;
    for (long y = y0; y < y1; y++)
        for (long x = x0; x < x1; x++)
            memcpy(rgb + ((size_t)y * (size_t)w + (size_t)x) * 3, color, 3);
}

void kvp_draw_rect(uint8_t *rgb, int w, int h, int x, int y, int rw, int rh, const uint8_t color[3])
{
    if (rgb && color && w > 0 && h > 0)
        fill(rgb, w, h, x, y, (long)x + rw, (long)y + rh, color);
}

/* Scale as drawn: from 1 to MAX_SCALE, so positions computed in long cannot overflow. */
#define MAX_SCALE 4096
static int clamp_scale(int scale)
{
    return scale < 1 ? 1 : scale > MAX_SCALE ? MAX_SCALE : scale;
}

/* kvp_text_size without the clamping to int. */
static void extent(const char *text, int scale, long *width, long *height)
{
    long cols = 0, max_cols = 0, lines = 1;
    for (const char *s = text; *s;) {
        if (next_char(&s) == '\n') {
            lines++;
            cols = 0;
        } else if (++cols > max_cols) {
            max_cols = cols;
        }
    }
    *width = max_cols ? (max_cols * KVP_FONT_ADVANCE - (KVP_FONT_ADVANCE - KVP_FONT_W)) * scale : 0;
    *height = *text ? ((lines - 1) * KVP_FONT_LINE + KVP_FONT_H) * scale : 0;
}

void kvp_text_size(const char *text, int scale, int *width, int *height)
{
    long tw, th;
    extent(text ? text : "", clamp_scale(scale), &tw, &th);
    *width = tw > INT_MAX ? INT_MAX : (int)tw;
    *height = th > INT_MAX ? INT_MAX : (int)th;
}

/* Draw text upright, or turned counter-clockwise when up. Pixels are placed in the upright
 * layout (tx, ty) first, then mapped: turning sends (tx, ty) to (ty, width - tx). */
static void draw_text(uint8_t *rgb, int w, int h, int x, int y, const char *text,
                      const uint8_t color[3], int scale, bool up)
{
    if (!rgb || !text || !color || w <= 0 || h <= 0)
        return;
    scale = clamp_scale(scale);
    long tw = 0, th = 0;
    if (up)
        extent(text, scale, &tw, &th);
    long pen = 0, line = 0;
    for (const char *s = text; *s;) {
        int c = next_char(&s);
        if (c == '\n') {
            pen = 0;
            line += KVP_FONT_LINE;
            continue;
        }
        for (int row = 0; row < KVP_FONT_H; row++)
            for (int col = 0; col < KVP_FONT_W; col++) {
                if (!lit(c, col, row))
                    continue;
                long tx = (pen + col) * scale, ty = (line + row) * scale;
                long px = up ? x + ty : x + tx, py = up ? y + tw - tx - scale : y + ty;
                fill(rgb, w, h, px, py, px + scale, py + scale, color);
            }
        pen += KVP_FONT_ADVANCE;
    }
}

void kvp_draw_text(uint8_t *rgb, int w, int h, int x, int y, const char *text,
                   const uint8_t color[3], int scale)
{
    draw_text(rgb, w, h, x, y, text, color, scale, false);
}

void kvp_draw_text_up(uint8_t *rgb, int w, int h, int x, int y, const char *text,
                      const uint8_t color[3], int scale)
{
    draw_text(rgb, w, h, x, y, text, color, scale, true);
}

void kvp_draw_ramp(const uint8_t (*stops)[3], int n, double v, uint8_t out[3])
{
    if (n < 2) {
        memcpy(out, stops[0], 3);
        return;
    }
    v = v > 0 ? (v < 1 ? v : 1) : 0; /* NaN lands on the first stop */
    double p = v * (n - 1);
    int i = p >= n - 1 ? n - 2 : (int)p;
    double f = p - i;
    for (int c = 0; c < 3; c++)
        out[c] = (uint8_t)lround(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]));
}
