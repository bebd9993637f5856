/*
 * libFuzzer target for the GGUF reader: open the input as a GGUF file and, when it opens, touch
 * every key through every getter, every array element (first 256 and the last), and the first
 * and last byte of every tensor's data. The reader promises that everything it accepted is safe
 * to read this way; ASan and UBSan check the promise.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Read array element i through every element getter. */
static void touch_element(const struct kvp_gguf_kv *kv, uint64_t i, volatile uint64_t *sink)
{
    const char *s;
    size_t len;
    int64_t iv;
    double fv;
    if (kvp_gguf_arr_str(kv, i, &s, &len) == 0 && len)
        *sink += (uint8_t)s[0] + (uint8_t)s[len - 1];
    if (kvp_gguf_arr_int(kv, i, &iv) == 0)
        *sink += (uint64_t)iv;
    if (kvp_gguf_arr_float(kv, i, &fv) == 0)
        *sink += fv > 0.0;
}

static void touch_kv(const struct kvp_gguf *g, const struct kvp_gguf_kv *kv,
                     volatile uint64_t *sink)
{
    struct kvp_err err;
    int64_t iv;
    double fv;
    bool bv;
    const char *s;
    size_t len;
    uint32_t et;
    uint64_t n;
    if (kvp_gguf_find_key(g, kv->key) < 0)
        abort(); /* every key read must be found again */
    if (kvp_gguf_get_int(g, kv->key, &iv, &err) == 0)
        *sink += (uint64_t)iv;
    if (kvp_gguf_get_float(g, kv->key, &fv, &err) == 0)
        *sink += fv > 0.0;
    if (kvp_gguf_get_bool(g, kv->key, &bv, &err) == 0)
        *sink += bv;
    if (kvp_gguf_get_str(g, kv->key, &s, &len, &err) == 0 && len)
        *sink += (uint8_t)s[0] + (uint8_t)s[len - 1];
    if (kvp_gguf_get_arr(g, kv->key, &et, &n, &err) != 0)
        return;
    for (uint64_t i = 0; i < n && i < 256; i++)
        touch_element(kv, i, sink);
    if (n)
        touch_element(kv, n - 1, sink);
    touch_element(kv, n, sink); /* out of range: must be refused */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvp_gguf *g = NULL;
    struct kvp_err err;
    if (kvp_gguf_open_memory(data, size, &g, &err) < 0)
        return 0;
    volatile uint64_t sink = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        touch_kv(g, &g->kv[i], &sink);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct kvp_gguf_tensor *t = &g->tensors[i];
        if (kvp_gguf_find_tensor(g, t->name) != t)
            abort();
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink += p[0] + p[t->nbytes - 1];
        }
    }
    kvp_gguf_close(g);
    return 0;
}
