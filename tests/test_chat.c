/*
 * Chat template tests (docs/formats.md §5.6). Expected prompts are written by hand from
 * the formats in §5.6 and the published prompt formats of each model family (Meta's Llama 2 / Llama
 * 3 model cards, Mistral's [INST] format, ChatML, Zephyr, Phi-3, Gemma); template texts are short
 * hand-written excerpts containing the markers a real template has.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "gguf/gguf.h"
#include "tokenizer/chat.h"
#include "tokenizer/vocab.h"

static const struct kvp_chat_msg conv[] = {
    {"system", "Be brief."},
    {"user", "Hi there"},
    {"assistant", "Hello!"},
    {"user", " What is 2+2? \n"},
};
#define N_CONV (sizeof(conv) / sizeof(conv[0]))

static void expect_chat(int fmt, const struct kvp_chat_msg *m, size_t n, bool prompt,
                        const char *want)
{
    char *out = NULL;
    size_t len = 0;
    struct kvp_err err = {0};
    if (kvp_chat_apply(fmt, m, n, prompt, &out, &len, &err))
        fail_msg("%s: %s", kvp_chat_format_name(fmt), err.msg);
    if (len != strlen(want) || strcmp(out, want) != 0)
        fail_msg("%s:\n got  [%s]\n want [%s]", kvp_chat_format_name(fmt), out, want);
    free(out);
}

static void test_chatml(void **state)
{
    (void)state;
    expect_chat(KVP_CHAT_CHATML, conv, N_CONV, true,
                "<|im_start|>system\nBe brief.<|im_end|>\n"
                "<|im_start|>user\nHi there<|im_end|>\n"
                "<|im_start|>assistant\nHello!<|im_end|>\n"
                "<|im_start|>user\n What is 2+2? \n<|im_end|>\n"
                "<|im_start|>assistant\n");
    expect_chat(KVP_CHAT_CHATML, conv + 1, 1, false, "<|im_start|>user\nHi there<|im_end|>\n");
}

static void test_llama3(void **state)
{
    (void)state;
    expect_chat(KVP_CHAT_LLAMA3, conv, N_CONV, true,
                "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_llama2(void **state)
{
    (void)state;
    expect_chat(KVP_CHAT_LLAMA2, conv, N_CONV, true,
                "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi there [/INST] Hello! </s>"
                "<s>[INST] What is 2+2? [/INST]");
    expect_chat(KVP_CHAT_LLAMA2, conv + 1, 1, true, "[INST] Hi there [/INST]");
}

static void test_mistral(void **state)
{
    (void)state;
    expect_chat(KVP_CHAT_MISTRAL, conv, N_CONV, true,
                "[INST] Be brief.\n\nHi there [/INST]Hello!</s>[INST] What is 2+2? [/INST]");
}

static void test_zephyr_phi3(void **state)
{
    (void)state;
    expect_chat(KVP_CHAT_ZEPHYR, conv, 3, true,
                "<|system|>\nBe brief.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello!</s>\n"
                "<|assistant|>\n");
    expect_chat(KVP_CHAT_PHI3, conv + 1, 1, true, "<|user|>\nHi there<|end|>\n<|assistant|>\n");
}

static void test_gemma_plain(void **state)
{
    (void)state;
    expect_chat(KVP_CHAT_GEMMA, conv, N_CONV, true,
                "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
                "<start_of_turn>model\nHello!<end_of_turn>\n"
                "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
                "<start_of_turn>model\n");
    expect_chat(KVP_CHAT_PLAIN, conv, 3, true,
                "Be brief.\n\nUser: Hi there\nAssistant: Hello!\nAssistant:");
    expect_chat(KVP_CHAT_PLAIN, NULL, 0, false, "");
}

static void test_detect(void **state)
{
    (void)state;
    const struct {
        const char *tmpl;
        int want;
    } cases[] = {
        {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
         KVP_CHAT_CHATML},
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
         "message['content'] | trim + '<|eot_id|>' }}",
         KVP_CHAT_LLAMA3},
        {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' }}",
         KVP_CHAT_LLAMA2},
        {"{{ '[INST] ' + message['content'] + ' [/INST]' }}", KVP_CHAT_MISTRAL},
        {"{{ '<|user|>\\n' + message['content'] + eos_token }}", KVP_CHAT_ZEPHYR},
        {"{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n'}}", KVP_CHAT_PHI3},
        {"{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
         KVP_CHAT_GEMMA},
        {"{{ message['content'] }}", KVP_CHAT_PLAIN},
        {"", KVP_CHAT_PLAIN},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(kvp_chat_detect(cases[i].tmpl, strlen(cases[i].tmpl)), cases[i].want);
    assert_int_equal(kvp_chat_detect(NULL, 0), KVP_CHAT_PLAIN);

    for (int f = KVP_CHAT_PLAIN; f <= KVP_CHAT_GEMMA; f++)
        assert_int_equal(kvp_chat_format_from_name(kvp_chat_format_name(f)), f);
    assert_int_equal(kvp_chat_format_from_name("jinja"), -1);
    assert_int_equal(kvp_chat_format_from_name(NULL), -1);
    assert_string_equal(kvp_chat_format_name(99), "unknown");
}

static void test_errors(void **state)
{
    (void)state;
    char *out = (char *)"untouched";
    size_t len = 0;
    struct kvp_err err = {0};
    const struct kvp_chat_msg bad[] = {{"user", NULL}};
    assert_int_equal(kvp_chat_apply(KVP_CHAT_CHATML, bad, 1, true, &out, &len, &err), KVP_EINVAL);
    assert_int_equal(kvp_chat_apply(42, conv, 1, true, &out, &len, &err), KVP_EINVAL);
    assert_int_equal(kvp_chat_apply(-1, conv, 1, true, &out, &len, &err), KVP_EINVAL);
    assert_int_equal(kvp_chat_apply(KVP_CHAT_CHATML, NULL, 1, true, &out, &len, &err), KVP_EINVAL);
    assert_string_equal(out, "untouched");
    /* a long conversation grows the buffer */
    static char big[10000];
    memset(big, 'x', sizeof(big) - 1);
    const struct kvp_chat_msg m[] = {{"user", big}, {"assistant", big}};
    assert_int_equal(kvp_chat_apply(KVP_CHAT_LLAMA3, m, 2, true, &out, &len, &err), 0);
    assert_true(len > 2 * (sizeof(big) - 1));
    assert_int_equal(strlen(out), len);
    free(out);
}

/* GGUF: the template key picks the format; a ChatML prompt tokenizes into control tokens with
 * parse_special, and <|im_end|> ends generation although eos is another token. */
static void test_gguf_chatml(void **state)
{
    (void)state;
    /* byte-mapped single letters and LF, the ChatML markers and <|endoftext|> as control
     * tokens, and "user" reached by three merges */
    const char *toks2[] = {"a",          "b",
                           "s",          "e",
                           "r",          "u",
                           "\xc4\x8a",   "<|im_start|>",
                           "<|im_end|>", "<|endoftext|>",
                           "us",         "use",
                           "user"};
    const int32_t types2[] = {1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 1, 1, 1};
    const char *merges2[] = {"u s", "us e", "use r"};
    struct kvp_gguf_writer *w = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_gguf_writer_init(&w, &err), 0);
    kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    kvp_gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks2, NULL, 13);
    kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types2, 13);
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges2, NULL, 3);
    kvp_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 9);
    kvp_gguf_writer_set_str(w, "tokenizer.chat_template",
                            "{{'<|im_start|>' + message['role'] + '\\n'}}");
    uint8_t *buf = NULL;
    size_t size = 0;
    assert_int_equal(kvp_gguf_writer_to_memory(w, &buf, &size, &err), 0);
    kvp_gguf_writer_free(w);
    struct kvp_gguf *g = NULL;
    assert_int_equal(kvp_gguf_open_memory(buf, size, &g, &err), 0);
    assert_int_equal(kvp_chat_detect_gguf(g), KVP_CHAT_CHATML);
    assert_int_equal(kvp_chat_detect_gguf(NULL), KVP_CHAT_PLAIN);
    struct kvp_vocab *v = NULL;
    if (kvp_vocab_load_gguf(g, &v, &err))
        fail_msg("%s", err.msg);

    const struct kvp_chat_msg m[] = {{"user", "ab"}};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kvp_chat_apply(kvp_chat_detect_gguf(g), m, 1, false, &text, &len, &err), 0);
    int32_t ids[32];
    size_t n = 0;
    assert_int_equal(kvp_vocab_encode(v, text, len, true, true, ids, 32, &n, &err), 0);
    /* <|im_start|> user \n a b <|im_end|> \n; qwen2: no BOS */
    const int32_t want[] = {7, 12, 6, 0, 1, 8, 6};
    assert_int_equal(n, sizeof(want) / sizeof(want[0]));
    assert_memory_equal(ids, want, sizeof(want));
    free(text);
    assert_true(kvp_vocab_is_eog(v, 9));  /* eos */
    assert_true(kvp_vocab_is_eog(v, 8));  /* <|im_end|> by text */
    assert_false(kvp_vocab_is_eog(v, 7)); /* <|im_start|> */
    kvp_vocab_free(v);
    kvp_gguf_close(g);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml),      cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_llama2),      cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_zephyr_phi3), cmocka_unit_test(test_gemma_plain),
        cmocka_unit_test(test_detect),      cmocka_unit_test(test_errors),
        cmocka_unit_test(test_gguf_chatml),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
