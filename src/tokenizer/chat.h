/*
 * Chat templates (docs/formats.md §5.6): turn a conversation into the prompt text a chat
 * model was trained on.
 *
 * tokenizer.chat_template is a Jinja program; kvpred does not interpret it. The common formats
 * are recognised by substring and written out by hand; anything else gets a plain "User: ..." /
 * "Assistant:" fallback. The formatted text contains the special-token spellings (<|im_start|>,
 * <|eot_id|>, [INST], </s>, ...), so it must be tokenized with parse_special = true; BOS is not
 * part of the text: encode with add_special = true and the vocabulary adds it when it should.
 * Generation then stops on kvp_vocab_is_eog, which covers eos, eot, eom and the end-of-turn
 * spellings <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>.
 *
 * Typical use (CLI `run --chat`):
 *
 *     int fmt = kvp_chat_detect_gguf(gguf);      // or kvp_chat_format_from_name("chatml")
 *     struct kvp_chat_msg msgs[] = {{"system", sys}, {"user", prompt}};
 *     char *text; size_t len;
 *     if (kvp_chat_apply(fmt, msgs, 2, true, &text, &len, &err) < 0) ...
 *     kvp_vocab_encode(vocab, text, len, true, true, ids, cap, &n, &err);
 *     free(text);
 */
#ifndef KVP_TOKENIZER_CHAT_H
#define KVP_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"

struct kvp_gguf;

enum kvp_chat_format {
    KVP_CHAT_PLAIN = 0,   /* fallback: "User: {content}\n", prompt "Assistant:" */
    KVP_CHAT_CHATML = 1,  /* <|im_start|>{role}\n{content}<|im_end|>\n (Qwen2, SmolLM) */
    KVP_CHAT_LLAMA3 = 2,  /* <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> */
    KVP_CHAT_LLAMA2 = 3,  /* [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s> */
    KVP_CHAT_MISTRAL = 4, /* [INST] {user} [/INST]{answer}</s>; system text starts turn 1 */
    KVP_CHAT_ZEPHYR = 5,  /* <|user|>\n{content}</s>\n (TinyLlama-Chat) */
    KVP_CHAT_PHI3 = 6,    /* <|user|>\n{content}<|end|>\n */
    KVP_CHAT_GEMMA = 7,   /* <start_of_turn>user\n{content}<end_of_turn>\n; "model" answers */
};

/* One message; both strings borrowed and NUL-terminated. role is "system", "user" or
 * "assistant" (ChatML, Llama 3, Zephyr and Phi-3 write other roles verbatim; the [INST] and
 * Gemma formats treat any role but system and user as the assistant). */
struct kvp_chat_msg {
    const char *role;
    const char *content;
};

/* Format recognised in template text tmpl[0..len) (NULL or empty: KVP_CHAT_PLAIN). */
int kvp_chat_detect(const char *tmpl, size_t len);

/* Format of a model file, from tokenizer.chat_template; KVP_CHAT_PLAIN when absent or not a
 * string, or when g is NULL. */
int kvp_chat_detect_gguf(const struct kvp_gguf *g);

/* Format by name ("plain", "chatml", "llama3", "llama2", "mistral", "zephyr", "phi3", "gemma"),
 * for a command-line override; -1 for an unknown name. */
int kvp_chat_format_from_name(const char *name);

/* Name of a format (as accepted above), or "unknown". */
const char *kvp_chat_format_name(int fmt);

/* Write the conversation msgs[0..n) in format fmt, followed by the assistant prompt when
 * add_assistant, into a new NUL-terminated heap string *out (caller frees) of *out_len bytes.
 * Returns 0, KVP_EINVAL (bad format, NULL role or content) or KVP_ENOMEM; on failure *out is
 * untouched. */
int kvp_chat_apply(int fmt, const struct kvp_chat_msg *msgs, size_t n, bool add_assistant,
                   char **out, size_t *out_len, struct kvp_err *err);

#endif
