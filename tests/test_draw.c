/*
 * Tests of the figure drawing (image/draw.h) and the accuracy heatmaps (eval/heatmap.h): every
 * printable character has ink and keeps it inside its cell, glyphs are distinct, text sizes,
 * the turned text is the upright text turned, clipping at the borders never writes outside the
 * image (guard bytes here, ASan in the sanitizer build), the colour ramp, and heatmap figures.
 */
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

#include "image/draw.h"
#include "eval/heatmap.h"

static const uint8_t black[3] = {0, 0, 0};

/* A white w × h image; *base is the allocation, with GUARD bytes of 0xa5 on both sides. */
#define GUARD 4096
static uint8_t *canvas(int w, int h, uint8_t **base)
{
    size_t n = (size_t)w * (size_t)h * 3;
    *base = malloc(n + 2 * GUARD);
    assert_non_null(*base);
    memset(*base, 0xa5, n + 2 * GUARD);
    memset(*base + GUARD, 255, n);
    return *base + GUARD;
}

static void check_guards(const uint8_t *base, int w, int h)
{
    size_t n = (size_t)w * (size_t)h * 3;
    for (size_t i = 0; i < GUARD; i++) {
        assert_int_equal(base[i], 0xa5);
        assert_int_equal(base[GUARD + n + i], 0xa5);
    }
}

static bool inked(const uint8_t *rgb, int w, int x, int y)
{
    return rgb[((size_t)y * (size_t)w + (size_t)x) * 3] != 255;
}

/* ---- font ---------------------------------------------------------------------------------- */

/* Each character drawn alone at scales 1 and 3 in the middle of a 3 × 3 cell canvas: some ink
 * (none for the space), all of it inside the glyph's cell. */
static void test_glyph_cells(void **state)
{
    (void)state;
    for (int scale = 1; scale <= 3; scale += 2) {
        const int cw = KVP_FONT_ADVANCE * scale, ch = KVP_FONT_LINE * scale;
        const int w = 3 * cw, h = 3 * ch;
        for (int c = 32; c <= 126; c++) {
            uint8_t *base, *rgb = canvas(w, h, &base);
            char s[2] = {(char)c, 0};
            kvp_draw_text(rgb, w, h, cw, ch, s, black, scale);
            int n = 0;
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++)
                    if (inked(rgb, w, x, y)) {
                        n++;
                        if (x < cw || x >= cw + KVP_FONT_W * scale || y < ch ||
                            y >= ch + KVP_FONT_H * scale)
                            fail_msg("'%c' at scale %d has ink at (%d, %d), outside its cell", c,
                                     scale, x - cw, y - ch);
                    }
            if (c == ' ')
                assert_int_equal(n, 0);
            else if (n == 0)
                fail_msg("'%c' draws nothing", c);
            free(base);
        }
    }
}

/* The pixels of one glyph at scale 1 as a bit mask. */
static uint64_t glyph_bits(int c)
{
    const int w = KVP_FONT_W, h = KVP_FONT_H;
    uint8_t *base, *rgb = canvas(w, h, &base);
    char s[2] = {(char)c, 0};
    kvp_draw_text(rgb, w, h, 0, 0, s, black, 1);
    uint64_t bits = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            bits |= (uint64_t)inked(rgb, w, x, y) << (y * w + x);
    free(base);
    return bits;
}

/* No two characters look the same (O and 0, l and 1 and I included), and anything outside
 * printable ASCII is the hollow box, once per UTF-8 character. */
static void test_glyphs_distinct(void **state)
{
    (void)state;
    uint64_t bits[127];
    for (int c = 33; c <= 126; c++) {
        bits[c] = glyph_bits(c);
        for (int d = 33; d < c; d++)
            if (bits[c] == bits[d])
                fail_msg("'%c' and '%c' have the same glyph", c, d);
    }
    uint64_t box = glyph_bits(0x7f);
    for (int c = 33; c <= 126; c++)
        assert_true(bits[c] != box);
    int w, h;
    kvp_text_size("caf\xc3\xa9!", 1, &w, &h);
    assert_int_equal(w, 5 * KVP_FONT_ADVANCE - (KVP_FONT_ADVANCE - KVP_FONT_W));
    uint8_t *base, *rgb = canvas(KVP_FONT_W, KVP_FONT_H, &base);
    kvp_draw_text(rgb, KVP_FONT_W, KVP_FONT_H, 0, 0, "\xe2\x82\xac", black, 1); /* the euro sign */
    uint64_t euro = 0;
    for (int y = 0; y < KVP_FONT_H; y++)
        for (int x = 0; x < KVP_FONT_W; x++)
            euro |= (uint64_t)inked(rgb, KVP_FONT_W, x, y) << (y * KVP_FONT_W + x);
    assert_true(euro == box);
    free(base);
}

static void test_text_size(void **state)
{
    (void)state;
    int w, h;
    kvp_text_size("", 2, &w, &h);
    assert_int_equal(w, 0);
    assert_int_equal(h, 0);
    kvp_text_size(NULL, 2, &w, &h);
    assert_int_equal(w, 0);
    kvp_text_size("100", 2, &w, &h);
    assert_int_equal(w, 2 * (3 * KVP_FONT_ADVANCE - 1));
    assert_int_equal(h, 2 * KVP_FONT_H);
    kvp_text_size("ab\ncdef\n", 1, &w, &h);
    assert_int_equal(w, 4 * KVP_FONT_ADVANCE - 1);
    assert_int_equal(h, 2 * KVP_FONT_LINE + KVP_FONT_H);
    kvp_text_size("x", 0, &w, &h); /* scale < 1 counts as 1 */
    assert_int_equal(w, KVP_FONT_W);
}

/* The ink of text drawn is exactly its size, for a text that reaches every edge of its box. */
static void test_text_box(void **state)
{
    (void)state;
    const char *text = "jQ|\n}gy_";
    int tw, th;
    kvp_text_size(text, 2, &tw, &th);
    const int w = tw + 20, h = th + 20;
    uint8_t *base, *rgb = canvas(w, h, &base);
    kvp_draw_text(rgb, w, h, 10, 10, text, black, 2);
    int x0 = w, y0 = h, x1 = -1, y1 = -1;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            if (inked(rgb, w, x, y)) {
                x0 = x < x0 ? x : x0;
                y0 = y < y0 ? y : y0;
                x1 = x > x1 ? x : x1;
                y1 = y > y1 ? y : y1;
            }
    assert_int_equal(x0, 10);
    assert_int_equal(y0, 10);
    assert_int_equal(x1 - x0 + 1, tw);
    assert_int_equal(y1 - y0 + 1, th);
    free(base);
}

/* Turned text is the upright text turned counter-clockwise: upright (x, y) lands on
 * (y, tw - 1 - x) of the turned box. */
static void test_text_up(void **state)
{
    (void)state;
    const char *text = "depth (%)\nlq";
    int tw, th;
    kvp_text_size(text, 2, &tw, &th);
    uint8_t *ub, *up = canvas(tw, th, &ub), *tb, *turned = canvas(th, tw, &tb);
    kvp_draw_text(up, tw, th, 0, 0, text, black, 2);
    kvp_draw_text_up(turned, th, tw, 0, 0, text, black, 2);
    for (int y = 0; y < th; y++)
        for (int x = 0; x < tw; x++)
            assert_int_equal(inked(up, tw, x, y), inked(turned, th, y, tw - 1 - x));
    check_guards(ub, tw, th);
    check_guards(tb, th, tw);
    free(ub);
    free(tb);
}

/* Text and rectangles at and far beyond every border, at scales up to huge, on small images:
 * nothing outside the image changes, and what overlaps the image is still drawn. */
static void test_clipping(void **state)
{
    (void)state;
    static const int sizes[][2] = {{1, 1}, {7, 5}, {40, 13}};
    static const int pos[] = {INT_MIN, -100000, -31, -7, -3,   -1,          0,      1,
                              3,       6,       12,  39, 1000, INT_MAX - 3, INT_MAX};
    static const int scales[] = {1, 2, 5, 1000, INT_MAX};
    const int np = (int)(sizeof(pos) / sizeof(pos[0]));
    const char *text = "Wg|@#\n\xc3\xa9M_";
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        const int w = sizes[s][0], h = sizes[s][1];
        uint8_t *base, *rgb = canvas(w, h, &base);
        for (int i = 0; i < np; i++)
            for (int j = 0; j < np; j++)
                for (size_t k = 0; k < sizeof(scales) / sizeof(scales[0]); k++) {
                    kvp_draw_text(rgb, w, h, pos[i], pos[j], text, black, scales[k]);
                    kvp_draw_text_up(rgb, w, h, pos[i], pos[j], text, black, scales[k]);
                    kvp_draw_rect(rgb, w, h, pos[i], pos[j], pos[np - 1 - k], pos[k], black);
                    kvp_draw_rect(rgb, w, h, pos[i], pos[j], INT_MAX, INT_MAX, black);
                }
        check_guards(base, w, h);
        free(base);
    }
    /* partly visible text: the glyph of 'H' drawn 3 columns left of the image still shows its
     * right stem in column 1 */
    uint8_t *base, *rgb = canvas(4, 9, &base);
    kvp_draw_text(rgb, 4, 9, -3, 0, "H", black, 1);
    assert_true(inked(rgb, 4, 1, 0) && inked(rgb, 4, 1, 6) && !inked(rgb, 4, 0, 0));
    check_guards(base, 4, 9);
    free(base);
    /* NULL image, text or colour: nothing happens */
    kvp_draw_text(NULL, 4, 4, 0, 0, "x", black, 1);
    kvp_draw_rect(NULL, 4, 4, 0, 0, 2, 2, black);
}

static void test_ramp(void **state)
{
    (void)state;
    static const uint8_t stops[3][3] = {{0, 0, 0}, {100, 200, 50}, {200, 0, 250}};
    uint8_t c[3];
    kvp_draw_ramp(stops, 3, 0.0, c);
    assert_memory_equal(c, stops[0], 3);
    kvp_draw_ramp(stops, 3, 0.5, c);
    assert_memory_equal(c, stops[1], 3);
    kvp_draw_ramp(stops, 3, 1.0, c);
    assert_memory_equal(c, stops[2], 3);
    kvp_draw_ramp(stops, 3, 0.25, c);
    assert_int_equal(c[0], 50);
    assert_int_equal(c[1], 100);
    assert_int_equal(c[2], 25);
    kvp_draw_ramp(stops, 3, 7.0, c);
    assert_memory_equal(c, stops[2], 3);
    kvp_draw_ramp(stops, 3, -1.0, c);
    assert_memory_equal(c, stops[0], 3);
    kvp_draw_ramp(stops, 3, NAN, c);
    assert_memory_equal(c, stops[0], 3);
}

/* ---- heatmaps ------------------------------------------------------------------------------ */

static int count_colour(const uint8_t *rgb, int w, int h, const uint8_t c[3])
{
    int n = 0;
    for (size_t i = 0; i < (size_t)w * (size_t)h; i++)
        n += !memcmp(rgb + 3 * i, c, 3);
    return n;
}

static void test_heatmap(void **state)
{
    (void)state;
    static const long lengths[] = {512, 1024, 131072}, depths[] = {0, 50, 100};
    static const uint8_t red[3] = {215, 25, 28}, green[3] = {26, 150, 65};
    double good[9], bad[9];
    for (int i = 0; i < 9; i++) {
        good[i] = 1.0;
        bad[i] = 0.0;
    }
    struct kvp_heatmap_panel one = {NULL, good};
    struct kvp_heatmap hm = {.title = "passkey: full, all tokens",
                             .subtitle = "model m",
                             .lengths = lengths,
                             .depths = depths,
                             .n_len = 3,
                             .n_depth = 3,
                             .panels = &one,
                             .n_panels = 1,
                             .cols = 1};
    uint8_t *rgb;
    int w, h, w2, h2;
    struct kvp_err err = {0};
    assert_int_equal(kvp_heatmap_render(&hm, &rgb, &w, &h, &err), 0);
    int greens = count_colour(rgb, w, h, green), reds = count_colour(rgb, w, h, red);
    assert_true(greens > 9 * 40 * 20); /* nine cells of green, at least 40 × 20 each */
    assert_true(reds < greens / 9);    /* red only in the legend */
    free(rgb);

    /* two panels side by side, an empty slot, then one more row: wider and taller */
    struct kvp_heatmap_panel grid[4] = {
        {"a", good}, {"b, budget 1/8", bad}, {"c", bad}, {NULL, NULL}};
    hm.panels = grid;
    hm.n_panels = 4;
    hm.cols = 2;
    assert_int_equal(kvp_heatmap_render(&hm, &rgb, &w2, &h2, &err), 0);
    assert_true(w2 > 2 * (w - 100) && h2 > 2 * (h - 100));
    assert_true(count_colour(rgb, w2, h2, red) > 2 * 9 * 40 * 20);
    assert_true(count_colour(rgb, w2, h2, green) > 9 * 40 * 20);
    free(rgb);

    /* malformed or oversized figures are refused with a message */
    hm.cols = 0;
    assert_int_equal(kvp_heatmap_render(&hm, &rgb, &w, &h, &err), KVP_EINVAL);
    assert_null(rgb);
    hm.cols = 2;
    hm.n_len = 0;
    assert_int_equal(kvp_heatmap_render(&hm, &rgb, &w, &h, &err), KVP_EINVAL);
    hm.n_len = 3;
    hm.title = NULL;
    assert_int_equal(kvp_heatmap_render(&hm, &rgb, &w, &h, &err), KVP_EINVAL);
    hm.title = "t";
    static double many[4096];
    static long lens[4096];
    for (int i = 0; i < 4096; i++)
        lens[i] = 1000000 + i;
    struct kvp_heatmap_panel wide = {NULL, many};
    struct kvp_heatmap big = {.title = "t",
                              .lengths = lens,
                              .depths = depths,
                              .n_len = 4096,
                              .n_depth = 1,
                              .panels = &wide,
                              .n_panels = 1,
                              .cols = 1};
    assert_int_equal(kvp_heatmap_render(&big, &rgb, &w, &h, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "too large"));
    assert_int_equal(kvp_heatmap_write_png(&hm, "/nonexistent/dir/x.png", &err), KVP_EIO);
}

/* A figure written to disk decodes to the image rendered. */
static void test_heatmap_png(void **state)
{
    (void)state;
    static const long lengths[] = {256, 320}, depths[] = {0, 100};
    static const double acc[4] = {1.0, 0.25, 0.5, 0.0};
    struct kvp_heatmap_panel p = {"streaming, budget 32", acc};
    struct kvp_heatmap hm = {.title = "passkey",
                             .lengths = lengths,
                             .depths = depths,
                             .n_len = 2,
                             .n_depth = 2,
                             .panels = &p,
                             .n_panels = 1,
                             .cols = 1};
    char *path = kvp_test_tmpfile(".png");
    struct kvp_err err = {0};
    assert_int_equal(kvp_heatmap_write_png(&hm, path, &err), 0);
    uint8_t *rgb;
    int w, h;
    assert_int_equal(kvp_heatmap_render(&hm, &rgb, &w, &h, &err), 0);
    png_image img;
    memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    assert_true(png_image_begin_read_from_file(&img, path));
    img.format = PNG_FORMAT_RGB;
    assert_int_equal(img.width, w);
    assert_int_equal(img.height, h);
    uint8_t *back = malloc(PNG_IMAGE_SIZE(img));
    assert_non_null(back);
    assert_true(png_image_finish_read(&img, NULL, back, 0, NULL));
    assert_memory_equal(back, rgb, (size_t)w * (size_t)h * 3);
    free(back);
    free(rgb);
    remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glyph_cells), cmocka_unit_test(test_glyphs_distinct),
        cmocka_unit_test(test_text_size),   cmocka_unit_test(test_text_box),
        cmocka_unit_test(test_text_up),     cmocka_unit_test(test_clipping),
        cmocka_unit_test(test_ramp),        cmocka_unit_test(test_heatmap),
        cmocka_unit_test(test_heatmap_png),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
