/*
 * PNG writer (see png.h). libpng reports errors by longjmp-ing out of the failing call; the
 * handlers below record libpng's message into the caller's kvp_err first, and the single
 * setjmp in kvp_png_write_rgb turns the jump into a KVP_EIO return. Everything the jump can skip
 * is declared volatile or released by png_destroy_write_struct.
 */
#include "image/png.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <png.h>

static void on_png_error(png_structp png, png_const_charp msg)
{
    struct kvp_err *err = png_get_error_ptr(png);
    kvp_err_set(err, KVP_EIO, "png: %s", msg);
    png_longjmp(png, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg; /* warnings are not errors; the library does not print */
}

int kvp_png_write_rgb(const char *path, const uint8_t *rgb, int w, int h, struct kvp_err *err)
{
    if (!path || !rgb || w <= 0 || h <= 0 || w > (1 << 20) || h > (1 << 20))
        return kvp_err_set(err, KVP_EINVAL, "png: bad image size %d x %d", w, h);
    FILE *volatile f = fopen(path, "wb");
    if (!f)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, err, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, NULL);
        fclose(f);
        return kvp_err_set(err, KVP_ENOMEM, "png: out of memory");
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        remove(path);
        return KVP_EIO;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++)
        png_write_row(png, (png_const_bytep)(rgb + (size_t)y * w * 3));
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    if (fclose(f) != 0)
        return kvp_err_set(err, KVP_EIO, "%s: %s", path, strerror(errno));
    return 0;
}
