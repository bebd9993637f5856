/*
 * Chat templates (see chat.h and docs/formats.md §5.6).
 *
 * Each format is a few literal strings around each message; the only state is in the [INST]
 * family (when to open a new "[INST] " and where a system message goes) and in Gemma and
 * Mistral, which have no system role and put the system text at the top of the first user turn,
 * as their Jinja templates do. Llama 2, Llama 3 and Gemma templates trim each message
 * (`| trim`); we trim ASCII white space, which is what chat input contains in practice.
 *
 * Detection is by substring, most specific first: a template that mentions <|im_start|> is
 * ChatML even if it also mentions other markers in comments. The output is built in one
 * growable buffer; a conversation is small, so doubling is plenty.
 */
#include "tokenizer/chat.h"

#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

/* ============================== Detection ===================================================== */

static bool has(const char *t, size_t n, const char *needle)
{
    return memmem(t, n, needle, strlen(needle)) != NULL;
}

int kvp_chat_detect(const char *tmpl, size_t len)
{
    if (!tmpl || len == 0)
        return KVP_CHAT_PLAIN;
    if (has(tmpl, len, "<|im_start|>"))
        return KVP_CHAT_CHATML;
    if (has(tmpl, len, "<|start_header_id|>") && has(tmpl, len, "<|end_header_id|>"))
        return KVP_CHAT_LLAMA3;
    if (has(tmpl, len, "[INST]"))
        return has(tmpl, len, "<<SYS>>") ? KVP_CHAT_LLAMA2 : KVP_CHAT_MISTRAL;
    if (has(tmpl, len, "<|user|>"))
        return has(tmpl, len, "<|end|>") ? KVP_CHAT_PHI3 : KVP_CHAT_ZEPHYR;
    if (has(tmpl, len, "<start_of_turn>"))
        return KVP_CHAT_GEMMA;
    return KVP_CHAT_PLAIN;
}

int kvp_chat_detect_gguf(const struct kvp_gguf *g)
{
    const char *t;
    size_t len;
    if (!g || kvp_gguf_get_str(g, "tokenizer.chat_template", &t, &len, NULL) < 0)
        return KVP_CHAT_PLAIN;
    return kvp_chat_detect(t, len);
}

static const char *const format_names[] = {
    [KVP_CHAT_PLAIN] = "plain",   [KVP_CHAT_CHATML] = "chatml",   [KVP_CHAT_LLAMA3] = "llama3",
    [KVP_CHAT_LLAMA2] = "llama2", [KVP_CHAT_MISTRAL] = "mistral", [KVP_CHAT_ZEPHYR] = "zephyr",
    [KVP_CHAT_PHI3] = "phi3",     [KVP_CHAT_GEMMA] = "gemma",
};
#define N_FORMATS ((int)(sizeof(format_names) / sizeof(format_names[0])))

int kvp_chat_format_from_name(const char *name)
{
    for (int i = 0; name && i < N_FORMATS; i++)
        if (strcmp(name, format_names[i]) == 0)
            return i;
    return -1;
}

const char *kvp_chat_format_name(int fmt)
{
    return fmt >= 0 && fmt < N_FORMATS ? format_names[fmt] : "unknown";
}

/* ============================== Output buffer ================================================= */

struct sbuf {
    char *p; /* owned [cap], NUL-terminated */
    size_t n, cap;
    bool oom;
};

static void put_n(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (n >= b->cap - b->n) {
        size_t cap = b->cap;
        while (n >= cap - b->n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void put(struct sbuf *b, const char *s)
{
    put_n(b, s, strlen(s));
}

static bool is_ascii_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Append s without leading and trailing ASCII white space (Jinja's `| trim`). */
static void put_trimmed(struct sbuf *b, const char *s)
{
    size_t n = strlen(s);
    while (n > 0 && is_ascii_space(*s)) {
        s++;
        n--;
    }
    while (n > 0 && is_ascii_space(s[n - 1]))
        n--;
    put_n(b, s, n);
}

/* ============================== Formats ======================================================= */

static bool role_is(const struct kvp_chat_msg *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

static void fmt_chatml(struct sbuf *b, const struct kvp_chat_msg *m, size_t n, bool prompt)
{
    for (size_t i = 0; i < n; i++) {
        put(b, "<|im_start|>");
        put(b, m[i].role);
        put(b, "\n");
        put(b, m[i].content);
        put(b, "<|im_end|>\n");
    }
    if (prompt)
        put(b, "<|im_start|>assistant\n");
}

static void fmt_llama3(struct sbuf *b, const struct kvp_chat_msg *m, size_t n, bool prompt)
{
    for (size_t i = 0; i < n; i++) {
        put(b, "<|start_header_id|>");
        put(b, m[i].role);
        put(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        put(b, "<|eot_id|>");
    }
    if (prompt)
        put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama 2 (sys_block: "<<SYS>>" system block, " {answer} </s>", later turns open with "<s>")
 * and Mistral (system text opens the first user turn, "{answer}</s>"). The assistant prompt
 * is the "[/INST]" that closes the last user turn, so prompt adds nothing. */
static void fmt_inst(struct sbuf *b, const struct kvp_chat_msg *m, size_t n, bool sys_block)
{
    bool need_inst = true, first_turn = true;
    const char *pending_sys = NULL;
    for (size_t i = 0; i < n; i++) {
        bool sys = role_is(&m[i], "system"), user = role_is(&m[i], "user");
        if (sys && !sys_block) {
            pending_sys = m[i].content;
            continue;
        }
        if (sys || user) {
            if (need_inst) {
                put(b, sys_block && !first_turn ? "<s>[INST] " : "[INST] ");
                need_inst = false;
            }
            if (sys) {
                put(b, "<<SYS>>\n");
                put_trimmed(b, m[i].content);
                put(b, "\n<</SYS>>\n\n");
                continue;
            }
            if (pending_sys) {
                put_trimmed(b, pending_sys);
                put(b, "\n\n");
                pending_sys = NULL;
            }
            put_trimmed(b, m[i].content);
            put(b, " [/INST]");
            need_inst = true;
            continue;
        }
        put(b, sys_block ? " " : "");
        put_trimmed(b, m[i].content);
        put(b, sys_block ? " </s>" : "</s>");
        need_inst = true;
        first_turn = false;
    }
}

/* Zephyr (end = "</s>") and Phi-3 (end = "<|end|>"). */
static void fmt_tagged(struct sbuf *b, const struct kvp_chat_msg *m, size_t n, bool prompt,
                       const char *end)
{
    for (size_t i = 0; i < n; i++) {
        put(b, "<|");
        put(b, m[i].role);
        put(b, "|>\n");
        put(b, m[i].content);
        put(b, end);
        put(b, "\n");
    }
    if (prompt)
        put(b, "<|assistant|>\n");
}

static void fmt_gemma(struct sbuf *b, const struct kvp_chat_msg *m, size_t n, bool prompt)
{
    const char *pending_sys = NULL;
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system")) {
            pending_sys = m[i].content;
            continue;
        }
        bool user = role_is(&m[i], "user");
        put(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (user && pending_sys) {
            put_trimmed(b, pending_sys);
            put(b, "\n\n");
            pending_sys = NULL;
        }
        put_trimmed(b, m[i].content);
        put(b, "<end_of_turn>\n");
    }
    if (prompt)
        put(b, "<start_of_turn>model\n");
}

static void fmt_plain(struct sbuf *b, const struct kvp_chat_msg *m, size_t n, bool prompt)
{
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system")) {
            put(b, m[i].content);
            put(b, "\n\n");
            continue;
        }
        put(b, role_is(&m[i], "user") ? "User: " : "Assistant: ");
        put(b, m[i].content);
        put(b, "\n");
    }
    if (prompt)
        put(b, "Assistant:");
}

/* See chat.h. */
int kvp_chat_apply(int fmt, const struct kvp_chat_msg *msgs, size_t n, bool add_assistant,
                   char **out, size_t *out_len, struct kvp_err *err)
{
    if (!out || !out_len || (!msgs && n))
        return kvp_err_set(err, KVP_EINVAL, "kvp_chat_apply: NULL argument");
    if (fmt < 0 || fmt >= N_FORMATS)
        return kvp_err_set(err, KVP_EINVAL, "chat: unknown format %d", fmt);
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return kvp_err_set(err, KVP_EINVAL, "chat: message %zu has no role or content", i);
    struct sbuf b = {malloc(256), 0, 256, false};
    if (!b.p)
        return kvp_err_set(err, KVP_ENOMEM, "chat: out of memory");
    b.p[0] = 0;
    switch (fmt) {
    case KVP_CHAT_CHATML:
        fmt_chatml(&b, msgs, n, add_assistant);
        break;
    case KVP_CHAT_LLAMA3:
        fmt_llama3(&b, msgs, n, add_assistant);
        break;
    case KVP_CHAT_LLAMA2:
    case KVP_CHAT_MISTRAL:
        fmt_inst(&b, msgs, n, fmt == KVP_CHAT_LLAMA2);
        break;
    case KVP_CHAT_ZEPHYR:
        fmt_tagged(&b, msgs, n, add_assistant, "</s>");
        break;
    case KVP_CHAT_PHI3:
        fmt_tagged(&b, msgs, n, add_assistant, "<|end|>");
        break;
    case KVP_CHAT_GEMMA:
        fmt_gemma(&b, msgs, n, add_assistant);
        break;
    default:
        fmt_plain(&b, msgs, n, add_assistant);
        break;
    }
    if (b.oom) {
        free(b.p);
        return kvp_err_set(err, KVP_ENOMEM, "chat: out of memory");
    }
    *out = b.p;
    *out_len = b.n;
    return 0;
}
