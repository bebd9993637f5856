/*
 * libFuzzer target for the llama2.c readers: the checkpoint reader and the tokenizer.bin reader.
 *
 * Input layout: bytes 0-1 (LE u16, modulo 1025) give n_vocab for the tokenizer, which
 * tokenizer.bin does not store; the rest is handed to both readers. The checkpoint reader wants a
 * 4-byte aligned buffer (its arrays are floats pointing into it), so the bytes are copied into a
 * fresh heap block of exactly their size, which also lets ASan see any overread.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/llama2c.h"
#include "tokenizer/vocab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int n_vocab = (int)((data[0] | (unsigned)data[1] << 8) % 1025);
    size_t n = size - 2;
    uint8_t *buf = malloc(n ? n : 1); /* malloc alignment is at least 16 */
    if (!buf)
        return 0;
    memcpy(buf, data + 2, n);

    struct kvp_err err;
    struct kvp_llama2c *m = NULL;
    if (kvp_llama2c_open_memory(buf, n, &m, &err) == 0) {
        if (m->dim > 0 && m->vocab_size > 0) {
            volatile float sink = m->tok_embd[0] + m->rms_final[m->dim - 1] + m->wcls[0];
            (void)sink;
        }
        kvp_llama2c_close(m);
    }

    struct kvp_vocab *v = NULL;
    if (kvp_vocab_load_llama2c_memory(buf, n, n_vocab, &v, &err) == 0) {
        volatile size_t sink = 0;
        int nt = kvp_vocab_n_tokens(v);
        for (int i = 0; i < nt; i++) {
            size_t len = 0;
            const char *s = kvp_vocab_text(v, i, &len);
            if (s && len)
                sink += (uint8_t)s[0] + (uint8_t)s[len - 1];
        }
        (void)sink;
        kvp_vocab_free(v);
    }
    free(buf);
    return 0;
}
