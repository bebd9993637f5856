/*
 * End-to-end tests of the kvpred command: the measuring subcommands against the reference
 * engine's numbers, and every kind of bad input ending in one error line and exit status 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kernels/matvec.h"
#include "kernels/types.h"
#include "testutil.h"

/* The project's default model (models/ under $KVP_SOURCE_DIR, else the current folder). */
static void default_model(char *path, size_t cap)
{
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(path, cap, "%s/models/kvpred-default.gguf", src ? src : ".");
}

/* Run a command that must succeed and print one JSON object (the first, if several lines). */
static cJSON *run_json(const char *cmd)
{
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    cJSON *j = cJSON_Parse(out);
    if (!j)
        print_message("%s printed:\n%s\n", cmd, out);
    assert_non_null(j);
    free(out);
    return j;
}

static void test_perplexity(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(m, "models/stories260K.gguf");
    KVP_REQUIRE_SHARED(txt, "data/tinystories/tinystories_val.txt");
    char cmd[10000];
    snprintf(cmd, sizeof(cmd), "%s perplexity -m %s -f %s --bytes 60000 -c 256 -t 2 --json", cli, m,
             txt);
    cJSON *j = run_json(cmd);
    double ppl = cJSON_GetObjectItem(j, "ppl")->valuedouble;
    int chunks = cJSON_GetObjectItem(j, "chunks")->valueint;
    print_message("perplexity %.5f over %d chunks (reference 3.9152, 112 chunks)\n", ppl, chunks);
    assert_int_equal(chunks, 112);
    assert_true(fabs(ppl - 3.915) <= 0.002);
    cJSON_Delete(j);
}

static void test_cli_logits(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(m, "models/stories260K.gguf");
    KVP_REQUIRE_SHARED(in, "reference/stories260K_logits.input.txt");
    KVP_REQUIRE_SHARED(ref_s, "reference/stories260K_logits.json");
    char *refj = kvp_test_read_file(ref_s, NULL);
    cJSON *ref = cJSON_Parse(refj);
    assert_non_null(ref);
    char cmd[10000];
    snprintf(cmd, sizeof(cmd), "%s logits -m %s -f %s -n 256 -ctk f32 --cache-type-v f32 --json",
             cli, m, in);
    cJSON *got = run_json(cmd);
    cJSON *gt = cJSON_GetObjectItem(got, "tokens"), *rt = cJSON_GetObjectItem(ref, "tokens");
    cJSON *gl = cJSON_GetObjectItem(got, "logits"), *rl = cJSON_GetObjectItem(ref, "logits");
    assert_int_equal(cJSON_GetArraySize(gt), 256);
    assert_int_equal(cJSON_GetArraySize(gl), 256);
    double worst = 0;
    int argmax_ok = 0;
    for (int i = 0; i < 256; i++) {
        assert_int_equal(cJSON_GetArrayItem(gt, i)->valueint, cJSON_GetArrayItem(rt, i)->valueint);
        cJSON *a = cJSON_GetArrayItem(gl, i)->child, *b = cJSON_GetArrayItem(rl, i)->child;
        int j = 0, am_a = 0, am_b = 0;
        double ba = -1e30, bb = -1e30;
        for (; a && b; a = a->next, b = b->next, j++) {
            worst = fmax(worst, fabs(a->valuedouble - b->valuedouble));
            if (a->valuedouble > ba) {
                ba = a->valuedouble;
                am_a = j;
            }
            if (b->valuedouble > bb) {
                bb = b->valuedouble;
                am_b = j;
            }
        }
        assert_int_equal(j, 512);
        assert_null(a);
        assert_null(b);
        argmax_ok += am_a == am_b;
    }
    print_message("kvpred logits: max |diff| %.3g, argmax agrees at %d/256\n", worst, argmax_ok);
    assert_int_equal(argmax_ok, 256);
    /* with an f32 cache: the reference keeps an f16 KV cache and sits up to 0.0372 from the
     * exact logits (see test_forward's float64 oracle); kvpred's JSON must agree with it to
     * that distance */
    assert_true(worst < 0.0373);
    cJSON_Delete(got);
    cJSON_Delete(ref);
    free(refj);
}

static void test_generation(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(m_s, "models/stories260K.gguf");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p 'Once upon a time' -n 32", cli, m_s);
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_memory_equal(out, "Once upon a time", 16);
    assert_true(strlen(out) > 40);
    free(out);
    /* --chat wraps the prompt in a template (plain for this model, ChatML when forced) */
    snprintf(cmd, sizeof(cmd), "%s run -m %s --chat --system 'Be brief.' -p 'Hi' -n 4", cli, m_s);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_non_null(strstr(out, "Hi"));
    assert_non_null(strstr(out, "Be brief."));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s run -m %s --chat --chat-format chatml -p 'Hi' -n 4", cli, m_s);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_non_null(strstr(out, "<|im_start|>user"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s run -m %s --chat --chat-format klingon -p 'Hi' -n 4", cli, m_s);
    kvp_test_expect_error(cmd, "unknown chat format");
    /* sampling with a seed is reproducible; different seeds differ */
    char *a = NULL, *b = NULL, *c = NULL;
    snprintf(cmd, sizeof(cmd), "%s run -m %s -n 48 --temp 1.0 --top-k 40 --top-p 0.9 --seed 7",
             cli, m_s);
    assert_int_equal(kvp_test_run(cmd, &a, 0), 0);
    assert_int_equal(kvp_test_run(cmd, &b, 0), 0);
    snprintf(cmd, sizeof(cmd), "%s run -m %s -n 48 --temp 1.0 --top-k 40 --top-p 0.9 --seed 8",
             cli, m_s);
    assert_int_equal(kvp_test_run(cmd, &c, 0), 0);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
}

static void test_bad_input(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char cmd[8192];
    static const char *const bad[][2] = {
        {"frobnicate", "unknown command"},
        {"run -m /nonexistent/model.gguf", "cannot open"},
        {"run --bogus", "unknown flag"},
        {"run -n", "needs a value"},
        {"run -t zero", "-t"},
        {"run --temp -1", "--temp"},
        /* trace --tasks: generator names only (not lm or copy, which have no prompt), and room */
        {"trace -f x -o y --tasks passkey,nope", "--tasks: 'passkey,nope' is not a list"},
        {"trace -f x -o y --tasks copy", "--tasks: 'copy' is not a list"},
        {"trace -f x -o y --tasks passkey --seq-len 100", "at least 256"},
        /* convert, quantize, synth and info read their flags with the others' table: one line,
         * the usage only with --help */
        {"convert a.bin b.bin", "convert: one argument only ('a.bin' and 'b.bin')"},
        {"convert a.bin -o", "-o needs a value"},
        {"convert a.bin -o x.gguf", "--tokenizer is required"},
        {"quantize a b c --type Q8_0", "two arguments only ('a', 'b' and 'c')"},
        {"quantize a b --type Q8_0 -t 0", "-t: '0' is not a thread count 1..256"},
        {"quantize a --type Q8_0", "an output file is required"},
        {"synth --shape SmolLM2-135M --layers 0 -o x", "--layers: '0' is not a layer count"},
        {"info --bogus", "info: unknown flag '--bogus'"},
        /* batched-bench sizes its contexts from -npp and -ntg: a -c would be silently ignored */
        {"batched-bench -c 100 -npp 8", "-c: batched-bench sizes each sequence's context"},
        /* every comma-separated integer list is read by one parser: an empty item is refused */
        {"train-predictor d -o p --channels 4,,8", "--channels: '4,,8' is not C1,C2"},
        {"train-predictor d -o p --budgets 16,64,", "--budgets: '16,64,' is not a list"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        snprintf(cmd, sizeof(cmd), "%s %s", cli, bad[k][0]);
        kvp_test_expect_error(cmd, bad[k][1]);
    }

    /* a garbage file, a truncated model, a non-llama architecture, an unknown tensor type */
    char *junk = kvp_test_tmpfile(".bin");
    assert_int_equal(kvp_test_write_file(junk, "this is not a model", 19), 0);
    snprintf(cmd, sizeof(cmd), "%s info -m %s", cli, junk);
    kvp_test_expect_error(cmd, junk);

    struct kvp_test_model_spec sp = {.n_vocab = 64, .n_embd = 32, .n_layer = 1, .n_head = 2,
                                     .n_head_kv = 1, .n_ff = 32, .n_ctx = 16, .type = 0,
                                     .embd_type = 0, .tied = 1, .seed = 5};
    char *good = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, good, NULL), 0);
    size_t size;
    char *bytes = kvp_test_read_file(good, &size);
    assert_non_null(bytes);
    char *trunc = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_file(trunc, bytes, size - 100), 0);
    snprintf(cmd, sizeof(cmd), "%s info -m %s", cli, trunc);
    kvp_test_expect_error(cmd, "beyond");

    sp.arch = "gemma";
    char *gemma = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, gemma, NULL), 0);
    snprintf(cmd, sizeof(cmd), "%s info -m %s", cli, gemma);
    kvp_test_expect_error(cmd, "architecture 'gemma' is not supported");

    /* a valid GGUF type kvpred has no kernels for (IQ2_XXS, id 16) */
    sp.arch = NULL;
    char *iq = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, iq, NULL), 0);
    size_t iq_size;
    char *iq_bytes = kvp_test_read_file(iq, &iq_size);
    assert_non_null(iq_bytes);
    /* the first matrix after token_embd is blk.0.attn_q.weight: patch its type field by name */
    char *name = memmem(iq_bytes, iq_size, "blk.0.attn_q.weight", 19);
    assert_non_null(name);
    uint32_t ndims;
    memcpy(&ndims, name + 19, 4);
    uint32_t bad_type = 16;
    memcpy(name + 19 + 4 + 8 * ndims, &bad_type, 4);
    assert_int_equal(kvp_test_write_file(iq, iq_bytes, iq_size), 0);
    snprintf(cmd, sizeof(cmd), "%s info -m %s", cli, iq);
    kvp_test_expect_error(cmd, "IQ2_XXS");
    free(iq_bytes);

    /* a prompt longer than the context */
    snprintf(cmd, sizeof(cmd), "%s run -m %s -c 4 --no-bos -p 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'",
             cli, good);
    kvp_test_expect_error(cmd, "tokenizer"); /* the fixture has no tokenizer: a clear refusal */

    remove(junk);
    remove(good);
    remove(trunc);
    remove(gemma);
    remove(iq);
    free(junk);
    free(good);
    free(trunc);
    free(gemma);
    free(iq);
    free(bytes);
}

static void test_prompt_too_long(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(m_s, "models/stories260K.gguf");
    char cmd[8192];
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -c 8 -p 'Once upon a time there was a girl who liked to play'", cli,
             m_s);
    kvp_test_expect_error(cmd, "longer than the context");
}

/* `kvpred prompt` prints the evaluation's prompt at the length asked (in the model's tokens),
 * with the answer that --answer prints inside it; the passkey needs no ../shared. */
static void test_prompt_command(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char model[4096], cmd[10000], *out = NULL, *key = NULL, *ntok = NULL;
    default_model(model, sizeof(model));
    const char *args = "--task passkey --length 400 --depth 0 --seed 5";
    snprintf(cmd, sizeof(cmd), "KVP_SHARED_DIR=/nonexistent %s prompt -m %s %s --answer", cli,
             model, args);
    assert_int_equal(kvp_test_run(cmd, &key, 0), 0);
    key[strcspn(key, "\n")] = 0;
    assert_true(strlen(key) >= 4 && strspn(key, "0123456789") == strlen(key));
    snprintf(cmd, sizeof(cmd), "KVP_SHARED_DIR=/nonexistent %s prompt -m %s %s", cli, model, args);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    char needle[96];
    snprintf(needle, sizeof(needle), "The pass key is %s. Remember it.", key);
    char *at = strstr(out, needle);
    assert_non_null(at);
    assert_true(at - out < 200); /* depth 0: right after the instruction */
    assert_non_null(strstr(out, "What is the pass key? The pass key is"));
    snprintf(cmd, sizeof(cmd), "%s prompt -m %s %s | %s tokenize -m %s -f /dev/stdin", cli, model,
             args, cli, model);
    assert_int_equal(kvp_test_run(cmd, &ntok, 0), 0);
    long n = 0;
    for (char *p = ntok; *p; p++)
        n += (p == ntok || p[-1] == ' ' || p[-1] == '\n') && *p >= '0' && *p <= '9';
    print_message("passkey prompt of %ld tokens (asked 400), key %s\n", n, key);
    assert_true(n <= 400 && n >= 360);
    assert_non_null(strstr(out, "The grass is green.")); /* no --filler: the noise line */
    free(out);
    free(ntok);
    /* --filler: the pass key hides in that text instead (same key, same layout), in prompt
     * and in eval alike */
    static const char prose[] = "The lighthouse keeper counted the waves every night. Ships "
                                "passed far out beyond the rocks. Gulls slept on the rail "
                                "while a cold wind carried salt over his small garden. ";
    char *filler = kvp_test_tmpfile(".txt");
    assert_non_null(filler);
    FILE *ff = fopen(filler, "w");
    assert_non_null(ff);
    for (int i = 0; i < 40; i++)
        fputs(prose, ff);
    fclose(ff);
    snprintf(cmd, sizeof(cmd), "%s prompt -m %s %s --filler %s", cli, model, args, filler);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_non_null(strstr(out, needle));
    assert_non_null(strstr(out, "lighthouse keeper"));
    assert_null(strstr(out, "The grass is green."));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s eval -m %s --task passkey --filler %s --lengths 300 "
             "--depths 50 --samples 1 --json 2>/dev/null", cli, model, filler);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    char want[4200];
    snprintf(want, sizeof(want), "\"filler\":\"%s\"", filler);
    assert_non_null(strstr(out, want));
    free(out);
    remove(filler);
    free(filler);
    free(key);
    snprintf(cmd, sizeof(cmd), "%s prompt -m %s --task nope", cli, model);
    kvp_test_expect_error(cmd, "--task 'nope'");
    snprintf(cmd, sizeof(cmd), "%s prompt -m %s --task passkey --length 20", cli, model);
    kvp_test_expect_error(cmd, "does not fit");
}

/* `bench --paired` decodes an untiered twin in alternating chunks and reports both rates; the
 * ratio is the tiered time over the untiered one. */
static void test_bench_paired(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char model[4096], cmd[10000];
    default_model(model, sizeof(model));
    snprintf(cmd, sizeof(cmd), "%s bench -m %s -c 256 -n 8 --paired", cli, model);
    kvp_test_expect_error(cmd, "need --kv-tier");
    snprintf(cmd, sizeof(cmd), "%s bench -m %s -c 256 -n 8 --kv-tier ram --kv-sq-cpu 0", cli,
             model);
    kvp_test_expect_error(cmd, "--kv-sq-cpu needs --kv-tier disk");
    snprintf(cmd, sizeof(cmd),
             "%s bench -m %s -c 512 -n 40 -r 1 --prefill 16 --policy quest --budget 1/8 "
             "--kv-tier disk --hot-budget 96 --prefetch token --paired --json",
             cli, model);
    cJSON *j = run_json(cmd);
    cJSON *pj = cJSON_GetObjectItem(j, "paired");
    assert_true(cJSON_IsObject(pj));
    double ram = cJSON_GetObjectItem(pj, "ram_tokens_per_s")->valuedouble;
    double ratio = cJSON_GetObjectItem(pj, "ratio")->valuedouble;
    double med = cJSON_GetObjectItem(pj, "ratio_median")->valuedouble;
    double tiered = cJSON_GetObjectItem(j, "decode_tokens_per_s")->valuedouble;
    print_message("paired: tiered %.0f tokens/s, untiered %.0f, ratio %.3f (median %.3f)\n",
                  tiered, ram, ratio, med);
    /* with one repetition the three numbers come from the same two sums of seconds, whatever
     * the timing: ratio = tiered seconds / untiered seconds = untiered rate / tiered rate */
    assert_true(ram > 0 && ratio > 0 && med > 0);
    assert_true(fabs(ratio - ram / tiered) < 1e-9 * ratio);
    assert_true(cJSON_GetObjectItem(j, "store")->child != NULL);
    cJSON_Delete(j);
}

/* `bench --fill-text` gives a plain prefill its tokens too (the whole depth, random ids past the
 * text's end, said on stderr) and gives --fill tile its --fill-source tokens. */
static void test_bench_fill_text(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char model[4096], cmd[10000];
    default_model(model, sizeof(model));
    char *txt = kvp_test_tmpfile(".txt");
    assert_non_null(txt);
    const char *words = "Once upon a time there was a small cat.";
    assert_int_equal(kvp_test_write_file(txt, words, strlen(words)), 0);
    const char *fills[] = {"", "--fill prefill", "--fill tile --fill-source 48"};
    const char *want[] = {"the rest of the 96 prefilled are random ids",
                          "the rest of the 96 prefilled are random ids",
                          "the rest of the 48 prefilled are random ids"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "%s bench -m %s -c 96 -n 2 -r 1 --prefill 8 %s --fill-text %s",
                 cli, model, fills[i], txt);
        char *out = NULL;
        assert_int_equal(kvp_test_run(cmd, &out, 1), 0);
        if (!strstr(out, want[i]))
            print_message("%s printed:\n%s\n", cmd, out);
        assert_non_null(strstr(out, want[i]));
        free(out);
    }
    remove(txt);
    free(txt);
}

/* `bench` with several --policy entries decodes each from one fill (each attaches its policy to
 * the shared cache and evaluates the fill's last 32 tokens): each entry's last decoded logits are
 * bit for bit those of a run of that policy alone with the same fill (a sparse prefill, a tiled
 * fill), with two repetitions each (each truncates back to the fill); few enough decode tokens
 * that qpredictor's history still holds the prompt's attention rows, so an entry that missed
 * them (its policy attached after the last 32 tokens) differs. Evicting policies and tiers are
 * refused in a list. */
static void test_bench_policy_list(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    static char model[4096], aux[4096], cmd[32768], base[8192], one[32768];
    default_model(model, sizeof(model));
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(aux, sizeof(aux), "%s/models/kvpred-default.qkvpp", src ? src : ".");
    const char *fills[] = {"--fill prefill --prefill-policy sparse --prefill-budget 1/4 "
                           "--prefill-min-keys 1 --prefill-window 64 --prefill-tail 64",
                           "--fill tile --fill-source 256"};
    enum { N_ENTRIES = 4 };
    static char entries[N_ENTRIES][4200];
    snprintf(entries[0], sizeof(entries[0]), "--policy none");
    snprintf(entries[1], sizeof(entries[1]), "--policy quest");
    snprintf(entries[2], sizeof(entries[2]),
             "--policy quest --dense-layers 0 --policy-opts groups=4,coarse=approx,visit=4,q8=1 "
             "--budget 1/4");
    snprintf(entries[3], sizeof(entries[3]), "--policy qpredictor --aux %s", aux);
    for (int f = 0; f < 2; f++) {
        snprintf(base, sizeof(base),
                 "%s bench -m %s -c 700 -n 8 -r 2 --prefill 16 -t 2 --bandwidth 1 --json %s "
                 "--budget 1/8",
                 cli, model, fills[f]);
        snprintf(cmd, sizeof(cmd), "%s %s %s %s %s 2>/dev/null", base, entries[0], entries[1],
                 entries[2], entries[3]);
        cJSON *list[N_ENTRIES + 1] = {0};
        assert_int_equal(kvp_test_run_json_lines(cmd, list, N_ENTRIES + 1), N_ENTRIES);
        for (int k = 0; k < N_ENTRIES; k++) {
            snprintf(one, sizeof(one), "%s %s 2>/dev/null", base, entries[k]);
            cJSON *alone = run_json(one);
            const char *a = cJSON_GetObjectItem(alone, "decode_logits_fnv")->valuestring;
            const char *b = cJSON_GetObjectItem(list[k], "decode_logits_fnv")->valuestring;
            const char *pol = cJSON_GetObjectItem(list[k], "policy")->valuestring;
            print_message("fill %d, entry %d (%s): alone %s, in the list %s\n", f, k, pol, a, b);
            assert_string_equal(a, b);
            assert_int_equal(cJSON_GetObjectItem(list[k], "policy_index")->valueint, k);
            assert_int_equal(cJSON_GetObjectItem(list[k], "policies")->valueint, N_ENTRIES);
            /* the flags before the first --policy are every entry's, those after one its own */
            cJSON *bj = cJSON_GetObjectItem(list[k], "budget");
            if (k == 0)
                assert_true(cJSON_IsNull(bj));
            else
                assert_string_equal(bj->valuestring, k == 2 ? "1/4" : "1/8");
            /* the fill's density: the sparse prefill read part of the keys, the tiled fill
             * (a dense prefill) all of them */
            double d = cJSON_GetObjectItem(list[k], "fill_density")->valuedouble;
            assert_true(f == 0 ? d > 0 && d < 1 : d == 1);
            cJSON_Delete(alone);
            cJSON_Delete(list[k]);
        }
    }
    snprintf(cmd, sizeof(cmd), "%s --policy quest --policy snapkv", base);
    kvp_test_expect_error(cmd, "evicts tokens");
    snprintf(cmd, sizeof(cmd), "%s --policy quest --policy none --kv-tier ram", base);
    kvp_test_expect_error(cmd, "an untiered cache");
    snprintf(cmd, sizeof(cmd), "%s --policy none --budget 8 --policy quest", base);
    kvp_test_expect_error(cmd, "--budget needs --policy");
}

/* `run` takes the tier flags: the text generated with the KV cache in the RAM or disk tier (both
 * disk IO paths, a hot tier smaller than the selection's reach) is the untiered text; a bad IO
 * path and a missing directory are refused; `bench --json` names the disk tier's IO path. */
static void test_run_tiers(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char model[4096], cmd[10000], *ref = NULL, *out = NULL;
    default_model(model, sizeof(model));
    const char *base = "run -p 'Once upon a time' -n 24 -c 256 --policy quest --budget 32";
    snprintf(cmd, sizeof(cmd), "%s %s -m %s 2>/dev/null", cli, base, model);
    assert_int_equal(kvp_test_run(cmd, &ref, 0), 0);
    assert_true(strlen(ref) > strlen("Once upon a time") + 8);
    static const char *const tiers[] = {
        "--kv-tier ram", "--kv-tier disk", "--kv-tier disk --kv-disk-io pread",
        "--kv-tier disk --prefetch none --hot-budget 32", "--kv-tier ram --prefetch dense"};
    for (size_t t = 0; t < sizeof(tiers) / sizeof(tiers[0]); t++) {
        snprintf(cmd, sizeof(cmd), "%s %s -m %s %s 2>/dev/null", cli, base, model, tiers[t]);
        assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
        if (strcmp(out, ref) != 0)
            print_message("%s:\n%s\nuntiered:\n%s\n", tiers[t], out, ref);
        assert_string_equal(out, ref);
        free(out);
    }
    free(ref);
    /* the combinations every tier command refuses: test_tier_flags_shared */
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p x -n 2 --kv-tier disk --kv-disk-io nope", cli,
             model);
    kvp_test_expect_error(cmd, "auto, io_uring or pread");
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p x -n 2 --kv-tier disk --kv-dir /nonexistent/kv "
             "--policy quest --budget 32", cli, model);
    kvp_test_expect_error(cmd, "/nonexistent/kv");
    snprintf(cmd, sizeof(cmd),
             "%s bench -m %s -c 256 -n 8 -r 1 --prefill 64 --policy quest --budget 1/8 "
             "--kv-tier disk --kv-disk-io pread --json 2>/dev/null",
             cli, model);
    cJSON *j = run_json(cmd);
    cJSON *io = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "store"), "disk_io");
    assert_true(cJSON_IsString(io) && !strcmp(io->valuestring, "pread"));
    cJSON_Delete(j);
}

/* The tier flags are one set (src/cli/tier_opts.c): every command with --kv-tier takes all of
 * them, refuses the same combinations and lists them in its help; batched-bench runs its
 * sequences on the disk tier's pread path, asked for by a flag it did not take before. The
 * commands' integer lists are read by one parser: an empty item is refused everywhere. */
static void test_tier_flags_shared(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char model[4096], cmd[10000], *out = NULL;
    default_model(model, sizeof(model));
    static const char *const cmds[] = {
        "run -p x -n 2", "bench -c 64 -n 2", "batched-bench -npp 8 -ntg 2 -npl 1",
        "eval --tokens-from-seed 1 --prefill 8 --decode 2 --policy quest --budget 4",
        "serve --port 0"};
    static const char *const flags[] = {"--kv-tier", "--kv-dir",   "--kv-url",
                                        "--hot-budget", "--prefetch", "--kv-syscall-submit",
                                        "--kv-sq-cpu",  "--kv-disk-io"};
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        snprintf(cmd, sizeof(cmd), "%s %s -m %s --kv-dir /tmp", cli, cmds[c], model);
        kvp_test_expect_error(cmd, "need --kv-tier");
        snprintf(cmd, sizeof(cmd), "%s %s -m %s --kv-tier redis", cli, cmds[c], model);
        kvp_test_expect_error(cmd, "--kv-url go together");
        snprintf(cmd, sizeof(cmd), "%s %s -m %s --kv-tier ram --kv-disk-io pread", cli, cmds[c],
                 model);
        kvp_test_expect_error(cmd, "need --kv-tier disk");
        snprintf(cmd, sizeof(cmd), "%s %s --help", cli, cmds[c]);
        assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
        for (size_t f = 0; f < sizeof(flags) / sizeof(flags[0]); f++) {
            if (!strstr(out, flags[f]))
                print_message("%s --help lacks %s\n", cmds[c], flags[f]);
            assert_non_null(strstr(out, flags[f]));
        }
        /* one meaning of -c per command: bench's own (the decode depth) replaces the shared
         * one, batched-bench has none */
        const char *ctx = strstr(out, "-c, --ctx");
        assert_true(c == 2 ? ctx == NULL : ctx != NULL);
        if (ctx)
            assert_null(strstr(ctx + 1, "-c, --ctx"));
        free(out);
    }
    snprintf(cmd, sizeof(cmd),
             "%s batched-bench -m %s -npp 16 -ntg 2 -npl 2 --policy quest --budget 8 "
             "--kv-tier disk --kv-disk-io pread --prefetch layer --json 2>/dev/null",
             cli, model);
    /* the warm-up row is not printed: one row, on the disk tier, with the cache in it */
    cJSON *j = run_json(cmd);
    assert_string_equal(cJSON_GetObjectItem(j, "kv_tier")->valuestring, "disk");
    assert_int_equal(cJSON_GetObjectItem(j, "npl")->valueint, 2);
    assert_true(cJSON_GetObjectItem(j, "kv_cold_bytes")->valuedouble > 0);
    cJSON_Delete(j);
    static const char *const bad_lists[][2] = {
        {"batched-bench -npp 8,,16", "-npp: '8,,16' is not a list"},
        {"batched-bench -npl 1,5000", "-npl: '1,5000' is not a list"},
        {"eval --task passkey --lengths 300,", "--lengths: '300,' is not a list"},
        {"train-lm --bench --bench-ctx 64,,128", "--bench-ctx: '64,,128' is not a list"},
    };
    for (size_t k = 0; k < sizeof(bad_lists) / sizeof(bad_lists[0]); k++) {
        snprintf(cmd, sizeof(cmd), "%s %s", cli, bad_lists[k][0]); /* refused before -m */
        kvp_test_expect_error(cmd, bad_lists[k][1]);
    }
}

/* batched-bench --fill tile grows one prompt past the 4096 tokens it prefills (so its copies
 * hold npp tokens each, in the disk tier here), and --serial reports its own rate and reads. */
static void test_batched_fill_tile(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(m, "models/stories260K.gguf");
    char cmd[10000];
    snprintf(cmd, sizeof(cmd),
             "%s batched-bench -m %s -npp 4200 -ntg 2 -npl 2 --fill tile --serial --policy quest "
             "--budget 1/16 --kv-tier disk --kv-dir /tmp --json 2>/dev/null",
             cli, m);
    cJSON *j = run_json(cmd);
    assert_string_equal(cJSON_GetObjectItem(j, "fill")->valuestring, "tile");
    assert_int_equal(cJSON_GetObjectItem(j, "npp")->valueint, 4200);
    /* both sequences' caches, 4200 prompt tokens and the decoded ones, are in the cold tier */
    assert_true(cJSON_GetObjectItem(j, "kv_cold_bytes")->valuedouble > 0);
    assert_true(cJSON_GetObjectItem(j, "tg_serial_tokens_per_s")->valuedouble > 0);
    assert_non_null(cJSON_GetObjectItem(j, "serial_cold_bytes_read_per_token"));
    assert_non_null(cJSON_GetObjectItem(j, "cold_misses"));
    cJSON_Delete(j);
    snprintf(cmd, sizeof(cmd), "%s batched-bench -m %s --fill grow", cli, m);
    kvp_test_expect_error(cmd, "--fill");
}

/* batched-bench's warm-up row decodes, so that the weights a step packs once (from its first
 * decode token, context_internal.h's KVP_SINGLES_LANES) are packed there and no row's decode
 * time counts it; with --no-pack nothing is packed (the memory stays unspent). The model: one
 * SmolLM2 layer in Q8_0, a type with a lanes kernel where the CPU has one. */
static void test_batched_warmup_packs(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char *path = kvp_test_tmpfile(".gguf"), cmd[10000];
    snprintf(cmd, sizeof(cmd),
             "%s synth --shape SmolLM2-135M --layers 1 --type Q8_0 -o %s >/dev/null 2>&1", cli,
             path);
    assert_int_equal(system(cmd), 0);
    const bool lanes = kvp_lanes_has(KVP_TYPE_Q8_0);
    const int npls[] = {1, 2, 8};
    for (int no_pack = 0; no_pack < 2; no_pack++)
        for (size_t i = 0; i < sizeof(npls) / sizeof(npls[0]); i++) {
            const int npl = npls[i];
            snprintf(cmd, sizeof(cmd),
                     "%s batched-bench -m %s -npp 8 -ntg 2 -npl %d -t 2 --json%s 2>/dev/null", cli,
                     path, npl, no_pack ? " --no-pack" : "");
            cJSON *j = run_json(cmd);
            double packed = cJSON_GetObjectItem(j, "warmup_packed_bytes")->valuedouble;
            print_message("npl %d%s: %.0f bytes packed in the warm-up (%s)\n", npl,
                          no_pack ? ", --no-pack" : "", packed,
                          cJSON_GetObjectItem(j, "simd")->valuestring);
            assert_true(cJSON_GetObjectItem(j, "t_warmup_s")->valuedouble > 0);
            if (lanes && !no_pack)
                assert_true(packed > 0);
            else
                assert_true(packed == 0);
            cJSON_Delete(j);
        }
    unlink(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_perplexity),     cmocka_unit_test(test_cli_logits),
        cmocka_unit_test(test_generation),     cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_prompt_too_long),  cmocka_unit_test(test_prompt_command),
        cmocka_unit_test(test_bench_paired),
        cmocka_unit_test(test_bench_fill_text),
        cmocka_unit_test(test_bench_policy_list),
        cmocka_unit_test(test_run_tiers),
        cmocka_unit_test(test_tier_flags_shared),
        cmocka_unit_test(test_batched_fill_tile),
        cmocka_unit_test(test_batched_warmup_packs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
