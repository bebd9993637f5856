/*
 * Seed corpus generator for the fuzz targets (scripts/fuzz.sh runs it; nothing is checked in).
 *
 * `fuzz_seedgen DIR` writes one folder per target:
 *   gguf/         a small model-like GGUF with F32, F16 and Q8_0 tensors, a vocab-only GGUF with no
 *                 tensors, and one with a custom alignment and arrays of every element type;
 *   llama2c/      a tiny legacy llama2.c checkpoint and a tiny tokenizer.bin, each prefixed by the
 *                 2-byte n_vocab that fuzz_llama2c reads first;
 *   predictor/    a tiny predictor file (.kvpp) with recovery metadata;
 *   trace/        a two-sequence attention trace (KVPTRC01);
 *   head_profile/ a written profile and a hand-written one with comments and every optional key;
 *   spm/, bpe/    texts (flag byte first): ASCII, spaces at the edges, accented/CJK/emoji UTF-8,
 *                 invalid UTF-8, a literal U+2581, special-token spellings;
 *   chat/         conversations (format byte, flag byte, NUL-separated role/content pairs);
 *   policy_opts/  option strings for each policy (policy byte, budget byte, options);
 *   corpus_json/  .json and .jsonl texts: a RULER-style object, JSON Lines with nested and
 *                 missing "text" members, escapes (\n, \", \u00e9, a surrogate pair, \u0000),
 *                 a bad line among good ones, and plain prose (not JSON);
 *   server_request/ request bodies of `kvpred serve` (endpoint byte, then the JSON): completions
 *                 and chat, streamed, with stop strings, text parts, the kvpred extension,
 *                 and some wrong types.
 *   server_http/  raw HTTP for the server at the socket (a behaviour byte, then the bytes):
 *                 each endpoint, a chunked body, pipelined requests, a huge Content-Length,
 *                 a client that vanishes.
 *   prefill_gate/ a tiny learned prefill gate (.kvpg) with a distance prior.
 * All values are fixed, so the corpus is the same on every run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fixtures.h"
#include "fuzz_common.h"
#include "kernels/types.h"
#include "gguf/gguf.h"
#include "policy/catekv_profile.h"
#include "predictor/prefill_gate.h"

static int save(struct kvp_gguf_writer *w, const char *dir, const char *name)
{
    uint8_t *buf;
    size_t n;
    struct kvp_err err;
    int rc = kvp_gguf_writer_to_memory(w, &buf, &n, &err);
    kvp_gguf_writer_free(w);
    if (rc < 0) {
        fprintf(stderr, "seedgen: %s: %s\n", name, err.msg);
        return rc;
    }
    rc = fz_write_file(dir, name, buf, n);
    free(buf);
    return rc;
}

static int gguf_seeds(const char *dir)
{
    static float f32[64 * 2];
    static uint16_t f16[16];
    static uint8_t q8[2 * 34];
    for (int i = 0; i < 64 * 2; i++)
        f32[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 16; i++)
        f16[i] = kvp_f32_to_f16((float)i);
    kvp_quantize_row_q8_0_ref(f32, q8, 64);
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81\x61", "b"};
    float scores[] = {0, 0, 0, -1, -2};
    int32_t types[] = {2, 3, 3, 1, 1};
    struct kvp_gguf_writer *w;
    struct kvp_err err;

    if (kvp_gguf_writer_init(&w, &err) < 0)
        return -1;
    kvp_gguf_writer_set_str(w, "general.architecture", "llama");
    kvp_gguf_writer_set_u32(w, "llama.block_count", 1);
    kvp_gguf_writer_set_u32(w, "llama.embedding_length", 64);
    kvp_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 5);
    kvp_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, 5);
    int64_t ne_e[] = {64, 2}, ne_h[] = {16}, ne_q[] = {64};
    kvp_gguf_writer_add_tensor(w, "token_embd.weight", KVP_TYPE_F32, 2, ne_e, f32);
    kvp_gguf_writer_add_tensor(w, "output_norm.weight", KVP_TYPE_F16, 1, ne_h, f16);
    kvp_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", KVP_TYPE_Q8_0, 1, ne_q, q8);
    if (save(w, dir, "model.gguf") < 0)
        return -1;

    if (kvp_gguf_writer_init(&w, &err) < 0)
        return -1;
    kvp_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    kvp_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 5);
    kvp_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 5);
    kvp_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kvp_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (save(w, dir, "vocab.gguf") < 0)
        return -1;

    if (kvp_gguf_writer_init(&w, &err) < 0)
        return -1;
    kvp_gguf_writer_set_alignment(w, 64);
    uint8_t u8[] = {1, 2};
    int16_t i16[] = {-1, 1};
    uint64_t u64[] = {1, 2};
    double f64[] = {0.5, -0.5};
    bool bl[] = {true, false};
    kvp_gguf_writer_set_arr(w, "a.u8", KVP_GGUF_UINT8, u8, 2);
    kvp_gguf_writer_set_arr(w, "a.i16", KVP_GGUF_INT16, i16, 2);
    kvp_gguf_writer_set_arr(w, "a.u64", KVP_GGUF_UINT64, u64, 2);
    kvp_gguf_writer_set_arr(w, "a.f64", KVP_GGUF_FLOAT64, f64, 2);
    kvp_gguf_writer_set_arr(w, "a.bool", KVP_GGUF_BOOL, bl, 2);
    kvp_gguf_writer_set_scalar(w, "s.f64", KVP_GGUF_FLOAT64, &f64[0]);
    kvp_gguf_writer_set_scalar(w, "s.u16", KVP_GGUF_UINT16, &i16[1]);
    int64_t ne4[] = {2, 2, 2, 2};
    kvp_gguf_writer_add_tensor(w, "t4", KVP_TYPE_F32, 4, ne4, f32);
    kvp_gguf_writer_add_tensor(w, "t1", KVP_TYPE_F16, 1, ne_h, f16);
    return save(w, dir, "misc.gguf");
}

/* A legacy (headerless) llama2.c checkpoint: 7 int32 then the f32 arrays of run.c, shared
 * classifier. dim 8, hidden 16, 1 layer, 2 heads, vocab 4, seq_len 4. */
static int llama2c_seeds(const char *dir)
{
    const int32_t cfg[7] = {8, 16, 1, 2, 2, 4, 4};
    const size_t n_floats = 4 * 8 + 8 + 4 * 64 + 8 + 3 * 128 + 8 + 2 * 4 * 2;
    size_t n = 2 + sizeof(cfg) + n_floats * 4;
    uint8_t *buf = calloc(1, n);
    if (!buf)
        return -1;
    buf[0] = 4; /* n_vocab prefix for fuzz_llama2c */
    memcpy(buf + 2, cfg, sizeof(cfg));
    for (size_t i = 0; i < n_floats; i++) {
        float x = (float)(i % 5) * 0.25f;
        memcpy(buf + 2 + sizeof(cfg) + 4 * i, &x, 4);
    }
    int rc = fz_write_file(dir, "legacy.bin", buf, n);
    free(buf);
    if (rc < 0)
        return rc;

    /* tokenizer.bin: max_token_length, then per token score, length, bytes */
    const char *toks[] = {"<unk>", "\n<s>\n", "\n</s>\n", " a"};
    uint8_t tb[256] = {4, 0};
    size_t pos = 2;
    int32_t maxlen = 6;
    memcpy(tb + pos, &maxlen, 4);
    pos += 4;
    for (int i = 0; i < 4; i++) {
        float score = -(float)i;
        int32_t len = (int32_t)strlen(toks[i]);
        memcpy(tb + pos, &score, 4);
        memcpy(tb + pos + 4, &len, 4);
        memcpy(tb + pos + 8, toks[i], (size_t)len);
        pos += 8 + (size_t)len;
    }
    return fz_write_file(dir, "tokenizer.bin", tb, pos);
}

static int predictor_seeds(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/tiny.kvpp", dir);
    if (fz_write_predictor(path, 16) < 0)
        return -1;
    snprintf(path, sizeof(path), "%s/tiny_query.kvpp", dir); /* version 2: two channels */
    return fz_write_predictor_ch(path, 2, 16);
}

/* KVPGATE1: a gate of 2 layers, 1 KV head, head_dim 4, blocks of 64. */
static int prefill_gate_seeds(const char *dir)
{
    struct kvp_pgate g;
    struct kvp_err err;
    if (kvp_pgate_init(&g, 2, 1, 4, 64, &err) < 0)
        return -1;
    kvp_pgate_w(&g, 1, 0)[3 * 4] = -0.5f; /* a distance prior */
    char path[4096];
    snprintf(path, sizeof(path), "%s/tiny.kvpg", dir);
    int rc = kvp_pgate_save(&g, path, &err);
    kvp_pgate_free(&g);
    return rc;
}

/* KVPTRC01: block 2, layers 1..1 of a model, 2 heads, 2 sequences of 3 and 5 tokens; version 1
 * (max and sum rows) and version 2 (one KV head, and a bound row). */
static int trace_seed(const char *dir, const char *name, uint32_t version)
{
    static uint8_t buf[4096];
    size_t n = 0;
    const uint32_t hdr[7] = {version, 2, 1, 1, 2, 2, 1};
    const uint32_t n_arr = version == 2 ? 3 : 2;
    memcpy(buf, "KVPTRC01", 8);
    n = 8;
    memcpy(buf + n, hdr, version == 2 ? 28 : 24);
    n += version == 2 ? 28 : 24;
    memset(buf + n, 0, 64);
    memcpy(buf + n, "seed model", 10);
    n += 64;
    const uint32_t T[2] = {3, 5};
    for (int s = 0; s < 2; s++) {
        memcpy(buf + n, &T[s], 4);
        n += 4;
        for (uint32_t t = 0; t < T[s]; t++) {
            uint32_t nb = (t + 2) / 2;
            for (int h = 0; h < 2; h++)
                for (uint32_t i = 0; i < n_arr * nb; i++) {
                    float x = 1.0f / (float)(nb + i + (uint32_t)h);
                    memcpy(buf + n, &x, 4);
                    n += 4;
                }
        }
    }
    fz_fix_checksum(buf, n + 8);
    return fz_write_file(dir, name, buf, n + 8);
}

static int trace_seeds(const char *dir)
{
    return trace_seed(dir, "two_seqs.trace", 1) < 0 ? -1
                                                     : trace_seed(dir, "two_seqs_v2.trace", 2);
}

static int head_profile_seeds(const char *dir)
{
    struct kvp_head_profile *hp;
    struct kvp_err err;
    if (kvp_head_profile_alloc(3, 2, &hp, &err) < 0)
        return -1;
    hp->ratio = 0.5;
    snprintf(hp->model, sizeof(hp->model), "seed model");
    for (int i = 0; i < 6; i++) {
        hp->adaptive[i] = (uint8_t)(i % 2);
        hp->cv[i] = 0.25 * i;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/written.profile", dir);
    int rc = kvp_head_profile_write(hp, path, &err);
    kvp_head_profile_free(hp);
    if (rc < 0)
        return rc;
    static const char hand[] = "kvpred-head-profile 1\n# comment\nmodel a b c\nn_layer 2\n"
                               "n_head_kv 3\nratio 0.34\nn_samples 4\nn_prompt 128\nchunk 8\n"
                               "tail_tokens 32\nsink 4\nrecent 8\nwindow 16\npercentile 0.995\n"
                               "alpha 1\nn_adaptive 2\nadaptive\n1 0 0\r\n0 0 1\ncv\n"
                               "1.5 0.25 1e-3\n0 2 3.25\nend\n# trailing comment\n\n";
    return fz_write_file(dir, "hand.profile", hand, sizeof(hand) - 1);
}

/* Texts for the tokenizer targets, each behind its flag byte. */
static int text_seeds(const char *dir, const uint8_t *flags, int n_flags)
{
    static const char *const texts[] = {
        "the quiet river runs past the old mill",
        " leading and trailing spaces  ",
        ("caf\xc3\xa9 na\xc3\xafve \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
         "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82\n12345 don't"),
        "bad \xff\xfe utf-8 \xc3 \xe2\x82 \xf0\x9f\x99 \x80\x80 end",
        "\xe2\x96\x81 literal space mark\xe2\x96\x81x",
        "<s>hello</s> <unk> <|endoftext|> <|tool|>call(x)<|tool|>",
        "line one\n\n\tline two\r\n   indented 3.14159 x+y=z",
    };
    for (int f = 0; f < n_flags; f++)
        for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
            char buf[512], name[32];
            size_t n = strlen(texts[i]);
            buf[0] = (char)flags[f];
            memcpy(buf + 1, texts[i], n);
            snprintf(name, sizeof(name), "text%zu_%u", i, flags[f]);
            if (fz_write_file(dir, name, buf, n + 1) < 0)
                return -1;
        }
    return 0;
}

static int chat_seeds(const char *dir)
{
    static const char conv[] = "system\0Be brief.\0user\0Hello <|im_end|> there\0assistant\0Hi!"
                               "\0user\0And [INST] now?";
    for (int fmt = 0; fmt < 8; fmt++) {
        char buf[sizeof(conv) + 2], name[32];
        buf[0] = (char)fmt;
        buf[1] = (char)(fmt % 2);
        memcpy(buf + 2, conv, sizeof(conv) - 1);
        snprintf(name, sizeof(name), "conv%d", fmt);
        if (fz_write_file(dir, name, buf, sizeof(conv) + 1) < 0)
            return -1;
    }
    static const char tmpl[] = "\x01\x00{% for m in messages %}<|im_start|>{{ m.role }}";
    return fz_write_file(dir, "template", tmpl, sizeof(tmpl) - 1);
}

static int policy_opts_seeds(const char *dir)
{
    static const struct {
        uint8_t policy, budget;
        const char *opts;
    } seeds[] = {
        {0, 16, ""}, {0, 16, "margin=4,share=0"}, {0, 0, "margin=0"},
        {1, 16, "every=2,calib=1,gqa=union,hist=kv,inc=1,refresh=3"},
        {1, 32, "gqa=pooled,hist=head,inc=0"}, {2, 16, "every=1,calib=0"},
        {3, 16, ""}, {1, 8, "refresh=0,calib=1000000"},
        {2, 16, "adaptive=fraction,eta=0.5,chunk=4,tail=8"},
        {2, 8, "adaptive-ratio=0.5,percentile=0.9,alpha=0.5,every=2"},
        {3, 16, "head-profile=good.profile"}, {3, 4, "adaptive=full,chunk=1,tail=0"},
    };
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        char buf[128], name[32];
        size_t n = strlen(seeds[i].opts);
        buf[0] = (char)seeds[i].policy;
        buf[1] = (char)seeds[i].budget;
        memcpy(buf + 2, seeds[i].opts, n);
        snprintf(name, sizeof(name), "opts%zu", i);
        if (fz_write_file(dir, name, buf, n + 2) < 0)
            return -1;
    }
    return 0;
}

/* Corpus files: enough sentences and words to make a corpus, in several JSON layouts. */
static int corpus_json_seeds(const char *dir)
{
#define PROSE                                                                                      \
    "The quiet river runs past the old mill. Mr. Brown walks his small dog there! Does the "       \
    "baker open early? \\\"Always,\\\" said the tall woman. Green fields turn golden in summer."
    static const char *const seeds[] = {
        "{\"text\": \"" PROSE "\"}",
        ("[{\"title\": \"a\", \"text\": \"" PROSE "\"}, {\"text\": \"More words here.\"}]"),
        ("{\"id\": 1, \"text\": \"" PROSE "\"}\n{\"meta\": {\"text\": \"Nested line.\"}}\n"
         "{\"title\": \"no text\"}\n"),
        ("{\"text\": \"Line one.\\nLine two\\t\\u00e9\\ud83d\\ude42 caf\\u00e9.\\u0000 cut\"}\r\n"
         "{\"text\": \"" PROSE "\"}"),
        ("{\"text\": \"" PROSE "\"}\n{\"text\": \"unterminated\n"
         "{\"text\": 5}\n[1, 2, {\"text\": \"\"}]"),
        ("The plain text file. It has no JSON at all! Words like apple, banana and cherry fill it. "
         "Every sentence ends well. The last one too."),
    };
#undef PROSE
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "text%zu.json", i);
        if (fz_write_file(dir, name, seeds[i], strlen(seeds[i])) < 0)
            return -1;
    }
    return 0;
}

/* Request bodies: byte 0 even = /v1/completions, odd = /v1/chat/completions. */
static int server_request_seeds(const char *dir)
{
    static const char *const seeds[] = {
        "\x00{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 0}",
        ("\x00{\"model\": \"m\", \"prompt\": [\"a\"], \"stream\": true, \"stop\": [\"\\n\", \"end\"], "
         "\"seed\": 7, \"top_k\": 5, \"top_p\": 0.9, \"kvpred\": {\"policy\": \"quest\", "
         "\"budget\": \"1/16\"}}"),
        ("\x01{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
         "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}]}], \"stream\": true, "
         "\"stream_options\": {\"include_usage\": true}, \"max_completion_tokens\": 8}"),
        ("\x01{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"kvpred\": {\"budget\": "
         "256}, \"n\": 1, \"stop\": \"Q:\"}"),
        "\x00{\"prompt\": 5, \"max_tokens\": \"many\"}",
        "\x01{\"messages\": {}, \"temperature\": -1}",
        "\x00[1, 2, 3]",
    };
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "body%zu", i);
        if (fz_write_file(dir, name, seeds[i], 1 + strlen(seeds[i] + 1)) < 0)
            return -1;
    }
    return 0;
}

/* Raw HTTP for fuzz_server_http: byte 0 the client's behaviour (fuzz_server_http.c), then the
 * bytes on the wire. */
static int server_http_seeds(const char *dir)
{
    static const char *const seeds[] = {
        "\x00GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "\x00GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
        ("\x00POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Content-Length: 47\r\n\r\n{\"prompt\": \"Once upon a time\", \"max_tokens\": 3}"),
        ("\x01POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
         "41\r\n{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}\r\n"
         "0\r\n\r\n"),
        ("\x03POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 54\r\n\r\n"
         "{\"prompt\": \"Once upon a time\", \"stream\": true, \"n\": 1}"),
        "\x02POST /completions HTTP/1.0\r\nContent-Length: 99999999999\r\n\r\n{",
        "\x04GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nExpect: 100-continue\r\n\r\n",
        "\x00" "DELETE /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "http%zu", i);
        if (fz_write_file(dir, name, seeds[i], 1 + strlen(seeds[i] + 1)) < 0)
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    static const uint8_t spm_flags[] = {0, 1, 2, 3}, bpe_flags[] = {0, 1, 6, 7, 10, 15};
    const char *names[] = {"gguf", "llama2c", "predictor", "trace", "head_profile",
                           "spm", "bpe", "chat", "policy_opts", "corpus_json", "server_request",
                           "server_http", "prefill_gate"};
    mkdir(argv[1], 0755);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char sub[4096];
        snprintf(sub, sizeof(sub), "%s/%s", argv[1], names[i]);
        mkdir(sub, 0755);
        int rc = i == 0   ? gguf_seeds(sub)
                 : i == 1 ? llama2c_seeds(sub)
                 : i == 2 ? predictor_seeds(sub)
                 : i == 3 ? trace_seeds(sub)
                 : i == 4 ? head_profile_seeds(sub)
                 : i == 5 ? text_seeds(sub, spm_flags, 4)
                 : i == 6 ? text_seeds(sub, bpe_flags, 6)
                 : i == 7 ? chat_seeds(sub)
                 : i == 8 ? policy_opts_seeds(sub)
                 : i == 9 ? corpus_json_seeds(sub)
                 : i == 10 ? server_request_seeds(sub)
                 : i == 11 ? server_http_seeds(sub)
                           : prefill_gate_seeds(sub);
        if (rc < 0) {
            fprintf(stderr, "seedgen: cannot write the %s seeds to %s\n", names[i], sub);
            return 1;
        }
    }
    return 0;
}
