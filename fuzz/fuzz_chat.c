/*
 * libFuzzer target for the chat template renderer (src/tokenizer/chat.c).
 *
 * Input: byte 0 the format (as a signed byte, so unknown numbers are tried too), byte 1 bit 0
 * add_assistant, then NUL-separated strings taken in pairs as (role, content) messages. The
 * whole input is also given to kvp_chat_detect as template text and, NUL-terminated, to
 * kvp_chat_format_from_name.
 *
 * Checks: a known format renders (0), an unknown one is KVP_EINVAL; the output is
 * NUL-terminated at exactly the length returned and holds every message's content (without its
 * leading and trailing ASCII white space, which several formats trim); a detected format and a
 * format found by name are known formats whose name maps back to them.
 *
 * One exception, by design: Mistral and Gemma have no system turn and fold the system text into
 * the next user turn, so only the last system message before a user message is written (one
 * with no user message after it is dropped).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_MSGS = 16 };

static bool known(int fmt)
{
    return fmt >= KVP_CHAT_PLAIN && fmt <= KVP_CHAT_GEMMA;
}

/* out holds s without its leading and trailing ASCII white space. */
static bool has_trimmed(const char *out, const char *s)
{
    static const char space[] = " \t\n\r\v\f";
    s += strspn(s, space);
    size_t n = strlen(s);
    while (n > 0 && strchr(space, s[n - 1]))
        n--;
    return n == 0 || memmem(out, strlen(out), s, n) != NULL;
}

/* Message i is a system message that Mistral or Gemma does not write: another system message or
 * the end comes before the next user message. */
static bool folded_away(int fmt, const struct kvp_chat_msg *m, size_t n, size_t i)
{
    if ((fmt != KVP_CHAT_MISTRAL && fmt != KVP_CHAT_GEMMA) || strcmp(m[i].role, "system") != 0)
        return false;
    for (size_t j = i + 1; j < n; j++) {
        if (!strcmp(m[j].role, "user"))
            return false;
        if (!strcmp(m[j].role, "system"))
            return true;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int fmt = (int8_t)data[0];
    bool add_assistant = data[1] & 1;
    size_t len = size - 2;
    char *s = malloc(len + 1);
    if (!s)
        return 0;
    memcpy(s, data + 2, len);
    s[len] = 0;

    int det = kvp_chat_detect(s, len);
    if (!known(det))
        abort();
    int by_name = kvp_chat_format_from_name(s);
    if (by_name != -1 && (!known(by_name) ||
                          kvp_chat_format_from_name(kvp_chat_format_name(by_name)) != by_name))
        abort();

    struct kvp_chat_msg msgs[MAX_MSGS];
    size_t n = 0;
    const char *p = s, *end = s + len;
    while (n < MAX_MSGS && p < end) {
        const char *role = p;
        p += strlen(p) + 1;
        if (p > end)
            break;
        msgs[n].role = role;
        msgs[n].content = p;
        p += strlen(p) + 1;
        n++;
    }

    char *out = NULL;
    size_t out_len = 0;
    struct kvp_err err;
    int rc = kvp_chat_apply(fmt, msgs, n, add_assistant, &out, &out_len, &err);
    if (known(fmt) != (rc == 0) || (rc < 0 && rc != KVP_EINVAL))
        abort();
    if (rc == 0) {
        if (out[out_len] != 0 || strlen(out) != out_len)
            abort();
        for (size_t i = 0; i < n; i++)
            if (!folded_away(fmt, msgs, n, i) && !has_trimmed(out, msgs[i].content))
                abort();
        free(out);
    }
    free(s);
    return 0;
}
