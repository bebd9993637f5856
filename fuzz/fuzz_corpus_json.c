/*
 * libFuzzer target for the text of .json and .jsonl corpus files (kvp_corpus_json_append,
 * src/tasks/corpus.c), which `kvpred train-lm --data/--hay` and the task haystacks
 * (`--filler`) read through cJSON, and for the corpus preparation behind it (kvp_corpus_init:
 * whitespace, sentence splitting, the word list), which every text file reaches.
 *
 * The input is a file's bytes, on an exactly sized copy. Accepted: the count of "text" members
 * is plausible (each takes at least 9 input bytes), the text holds no NUL, is at most the input
 * plus a blank line per member (unescaping never grows a string) and ends with that blank line.
 * cJSON is a system library without ASan instrumentation, so a read past the input's end would
 * go unseen: the same bytes are parsed again followed by a tail of JSON that would change the
 * result if read, and both results must be equal. Then the text (or, when refused, the input
 * itself, as a plain .txt file is read) is prepared as a corpus; an accepted corpus has
 * increasing sentence offsets inside the text, at least 4 sentences and 16 distinct words, each
 * of 3 to 10 lowercase letters.
 */
#include <ctype.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tasks/sbuf.h"
#include "tasks/corpus.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_corpus(const char *text, size_t len)
{
    struct kvp_corpus *c;
    struct kvp_err err = {0};
    int rc = kvp_corpus_init(&c, text, len, NULL, 0.1, &err);
    if (rc < 0) {
        if (!err.msg[0])
            abort();
        return;
    }
    if (c->n_sent < 4 || c->n_train < 2 || c->n_train > c->n_sent || c->n_words < 16 ||
        c->len > len)
        abort();
    for (long s = 0; s < c->n_sent; s++)
        if (c->sent_off[s] >= c->sent_off[s + 1] || c->sent_off[s] >= c->len || !c->sent_tok[s])
            abort();
    if (c->sent_off[c->n_sent] != c->len + 1)
        abort();
    for (int w = 0; w < c->n_words; w++) {
        size_t n = strlen(c->words[w]);
        if (n < 3 || n > 10)
            abort();
        for (size_t i = 0; i < n; i++)
            if (!islower((unsigned char)c->words[w][i]))
                abort();
    }
    kvp_corpus_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* what a read past the end would see: the end of an open string and a member after it */
    static const char tail[] = "\"}\n{\"text\": \"tail.\"}\n";
    char *buf = malloc(size + sizeof(tail));
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    char *exact = malloc(size ? size : 1);
    if (!exact) {
        free(buf);
        return 0;
    }
    memcpy(exact, data, size);

    struct sbuf b = {0}, b2 = {0};
    struct kvp_err err = {0};
    int found = kvp_corpus_json_append("fuzz.json", exact, size, &b, &err);
    if (found < 0 && (found != KVP_EFORMAT || !err.msg[0] || b.n))
        abort(); /* refused: no text (4 KiB inputs never run out of memory) */
    const size_t nf = found > 0 ? (size_t)found : 0;
    if (found >= 0 && (nf < 1 || nf * 9 > size || b.oom || b.n > size + 2 * nf || b.n < 2 * nf ||
                       memchr(b.p, 0, b.n) || memcmp(b.p + b.n - 2, "\n\n", 2)))
        abort();

    memcpy(buf + size, tail, sizeof(tail));
    int found2 = kvp_corpus_json_append("fuzz.json", buf, size, &b2, &err);
    if (found2 != found || b2.n != b.n || (b.n && memcmp(b.p, b2.p, b.n)))
        abort(); /* a byte past the end was read */

    if (found > 0)
        check_corpus(b.p, b.n);
    else
        check_corpus(exact, size);
    free(b.p);
    free(b2.p);
    free(exact);
    free(buf);
    return 0;
}
