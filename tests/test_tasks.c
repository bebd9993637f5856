/*
 * Tests of the evaluation tasks (`kvpred eval --task`): the generator is a pure function of its
 * seed, the answer needle sits at the requested depth, prompts fill the target length up to one
 * haystack unit, string_match_all on hand-made predictions, and the CLI end to end on
 * stories260K (which scores about 0: the test checks the machinery, not the accuracy), the
 * --heatmap figures included.
 *
 * The generator tests run on a self-made corpus with a whitespace word counter as the
 * "tokenizer", so they need nothing from ../shared.
 */
#include "testutil.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <png.h>

#include "eval/ruler.h"
#include "eval/task_eval.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"

/* ---- fixtures ------------------------------------------------------------------------------ */

/* Words separated by whitespace, plus one for BOS. */
static int count_words(void *ud, const char *text, size_t len, size_t *n_tok)
{
    (void)ud;
    size_t n = 1;
    bool in = false;
    for (size_t i = 0; i < len; i++) {
        bool sp = isspace((unsigned char)text[i]) != 0;
        n += !sp && !in;
        in = !sp;
    }
    *n_tok = n;
    return 0;
}

/* 600 sentences of 6 to 17 words drawn from a fixed list with a small LCG. */
static struct kvp_corpus *make_corpus(void)
{
    static const char *const words[] = {
        "river", "stone", "garden", "window", "silver", "market", "winter", "lantern",
        "forest", "harbor", "pencil", "candle", "meadow", "thunder", "violet", "copper",
        "bridge", "orchard", "valley", "feather", "marble", "planet", "shadow", "basket"};
    size_t cap = 1 << 17, k = 0;
    char *raw = malloc(cap);
    assert_non_null(raw);
    uint32_t x = 12345;
    for (int s = 0; s < 600; s++) {
        x = x * 1103515245u + 12345u;
        int n = 6 + (int)((x >> 16) % 12);
        for (int w = 0; w < n; w++) {
            x = x * 1103515245u + 12345u;
            const char *word = words[(x >> 16) % 24];
            k += (size_t)snprintf(raw + k, cap - k, "%s%c%s", w ? " " : "",
                                  w ? word[0] : (char)toupper((unsigned char)word[0]), word + 1);
        }
        k += (size_t)snprintf(raw + k, cap - k, ". ");
    }
    struct kvp_corpus *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_corpus_init(&c, raw, k, NULL, 0.0, &err), 0);
    free(raw);
    return c;
}

static void render(const struct kvp_corpus *c, int task, uint64_t seed, int len, float depth,
                   struct kvp_task_text *t)
{
    struct kvp_task_req req = {.task = task, .seed = seed | KVP_EVAL_SEED_BIT,
                               .target_tokens = len, .depth = depth, .count = count_words};
    struct kvp_err err = {0};
    int rc = kvp_task_render_eval(c, &req, t, &err);
    if (rc)
        print_message("render: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

/* ---- generator ----------------------------------------------------------------------------- */

/* With prose set the pass key hides in the corpus's sentences (the needle still on a line of its
 * own, at the depth asked); without it, in the noise line whatever the corpus. */
static void test_passkey_prose(void **state)
{
    (void)state;
    struct kvp_corpus *c = make_corpus();
    struct kvp_err err = {0};
    for (int prose = 0; prose < 2; prose++) {
        struct kvp_task_req req = {.task = KVP_TASK_PASSKEY, .seed = 9 | KVP_EVAL_SEED_BIT,
                                   .target_tokens = 1200, .depth = 0.5f, .prose = prose,
                                   .count = count_words};
        struct kvp_task_text t;
        assert_int_equal(kvp_task_render_eval(c, &req, &t, &err), 0);
        size_t n;
        count_words(NULL, t.prompt, strlen(t.prompt), &n);
        assert_true(n <= 1200 && n > 1100);
        char needle[128];
        char key[32];
        snprintf(key, sizeof(key), "%.*s", (int)strcspn(t.refs, "\n"), t.refs);
        snprintf(needle, sizeof(needle), "\nThe pass key is %s. Remember it. %s is the pass key.\n",
                 key, key);
        char *at = strstr(t.prompt, needle);
        assert_non_null(at);
        double where = (double)(at - t.prompt) / (double)strlen(t.prompt);
        assert_true(where > 0.4 && where < 0.6);
        assert_true((strstr(t.prompt, "The grass is green.") != NULL) == !prose);
        assert_true((strstr(t.prompt, "river") || strstr(t.prompt, "River")) == prose);
        kvp_task_text_free(&t);
    }
    kvp_corpus_free(c);
}

static void test_deterministic(void **state)
{
    (void)state;
    struct kvp_corpus *c = make_corpus();
    static const int tasks[] = {KVP_TASK_PASSKEY, KVP_TASK_NIAH_SINGLE_2,
                                KVP_TASK_NIAH_MULTIKEY_1, KVP_TASK_NIAH_MULTIVALUE,
                                KVP_TASK_NIAH_MULTIQUERY, KVP_TASK_VT};
    for (size_t i = 0; i < sizeof(tasks) / sizeof(tasks[0]); i++) {
        struct kvp_task_text a, b, d;
        render(c, tasks[i], 7, 1500, 0.5f, &a);
        render(c, tasks[i], 7, 1500, 0.5f, &b);
        render(c, tasks[i], 8, 1500, 0.5f, &d);
        assert_string_equal(a.prompt, b.prompt);
        assert_string_equal(a.refs, b.refs);
        assert_string_not_equal(a.refs, d.refs);
        /* every reference occurs in the prompt */
        char *r = a.refs;
        for (int k = 0; k < a.n_refs; k++) {
            char *nl = strchr(r, '\n');
            *nl = 0;
            assert_non_null(strstr(a.prompt, r));
            r = nl + 1;
        }
        kvp_task_text_free(&a);
        kvp_task_text_free(&b);
        kvp_task_text_free(&d);
    }
    kvp_corpus_free(c);
}

static void test_depth(void **state)
{
    (void)state;
    struct kvp_corpus *c = make_corpus();
    static const float depths[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f};
    for (int i = 0; i < 5; i++) {
        struct kvp_task_text t;
        render(c, KVP_TASK_NIAH_SINGLE_2, 3, 2000, depths[i], &t);
        const char *b = strstr(t.prompt, "afterwards.\n") + strlen("afterwards.\n");
        const char *e = strstr(t.prompt, "\nWhat is");
        const char *n = strstr(t.prompt, "One of the special magic numbers for");
        assert_non_null(n);
        const char *ne = strchr(n, ':');
        ne = strchr(ne, '.') + 1;
        double frac = (double)(n - b) / (double)((e - b) - (ne - n));
        print_message("depth %.2f: needle at %.3f of the context\n", depths[i], frac);
        assert_true(frac >= depths[i] - 0.05 && frac <= depths[i] + 0.05);
        kvp_task_text_free(&t);
    }
    kvp_corpus_free(c);
}

static void test_length(void **state)
{
    (void)state;
    struct kvp_corpus *c = make_corpus();
    static const int lens[] = {256, 512, 1024, 2048};
    static const int tasks[] = {KVP_TASK_NIAH_SINGLE_2, KVP_TASK_PASSKEY, KVP_TASK_VT};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++) {
            struct kvp_task_text t;
            render(c, tasks[k], (uint64_t)i, lens[i], 0.5f, &t);
            size_t n;
            count_words(NULL, t.prompt, strlen(t.prompt), &n);
            /* the largest prompt that fits: within one haystack unit (a sentence of at most 17
               words, a noise line of 19) below the target */
            assert_true((int)n <= lens[i]);
            assert_true((int)n > lens[i] - 20);
            kvp_task_text_free(&t);
        }
    kvp_corpus_free(c);
}

/* ---- scorer -------------------------------------------------------------------------------- */

static void test_score(void **state)
{
    (void)state;
    char buf[64];
    kvp_ruler_postprocess("\t  x\x01y\r\nz  \n", buf, sizeof(buf));
    assert_string_equal(buf, "x\ny\n\nz");
    assert_true(kvp_ruler_match_all(" 1234567.", "1234567\n", 1) == 1.0);
    assert_true(kvp_ruler_match_all(" 1234568.", "1234567\n", 1) == 0.0);
    assert_true(kvp_ruler_match_all("", "1234567\n", 1) == 0.0);
    assert_true(kvp_ruler_match_all(" 11, 33.", "11\n22\n33\n44\n", 4) == 0.5);
    assert_true(kvp_ruler_match_all("QWERT ASDFG zxcvb", "qwert\nasdfg\nZXCVB\n", 3) == 1.0);
    assert_true(kvp_ruler_match_all("anything", "", 0) == 0.0);
}

/* ---- CLI ----------------------------------------------------------------------------------- */

static void test_cli(void **state)
{
    (void)state;
    KVP_REQUIRE_SHARED(model_tmp, "models/stories260K.gguf");
    char model[1024];
    snprintf(model, sizeof(model), "%s", model_tmp);
    KVP_REQUIRE_SHARED(filler, "data/pg_essays");
    const char *cli = kvp_test_cli();
    assert_non_null(cli);
    char *dir = kvp_test_tmpfile("");
    remove(dir);
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "%s eval -m %s --task niah_single --lengths 256,384 --depths 0,50,100 --samples 1 "
             "--seed 5 --policy full,streaming --budget 64,1/4 --filler %s --json --heatmap %s "
             "2>/dev/null",
             cli, model, filler, dir);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    int rows = 0;
    double full_kv[2][3] = {{0}}, stream_kv[2][3] = {{0}}; /* [length][depth]: 64-token budget */
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), rows++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItem(j, "task")->valuestring, "niah_single");
        double acc = cJSON_GetObjectItem(j, "accuracy")->valuedouble;
        assert_true(acc >= 0.0 && acc <= 1.0);
        int len = cJSON_GetObjectItem(j, "length")->valueint;
        double pt = cJSON_GetObjectItem(j, "prompt_tokens")->valuedouble;
        assert_true(pt <= len && pt > len / 2);
        assert_non_null(cJSON_GetObjectItem(j, "depth"));
        /* one sample per cell: the budget is the library's rule at that prompt's length (1/4
         * rounded down, 64 as given, 0 for full) */
        const char *bud = cJSON_GetObjectItem(j, "budget")->valuestring;
        double bt = cJSON_GetObjectItem(j, "budget_tokens")->valuedouble;
        double want = !strcmp(bud, "all") ? 0.0 : !strcmp(bud, "64") ? 64.0 : floor(pt / 4.0);
        assert_true(fabs(bt - want) < 1e-9);
        double kv = cJSON_GetObjectItem(j, "kv_resident_bytes")->valuedouble;
        assert_true(kv > 0 && cJSON_GetObjectItem(j, "kv_kept_bytes")->valuedouble <= kv);
        int li = len == 256 ? 0 : 1, di = cJSON_GetObjectItem(j, "depth")->valueint / 50;
        const char *pol = cJSON_GetObjectItem(j, "policy")->valuestring;
        if (!strcmp(pol, "full"))
            full_kv[li][di] = kv;
        else if (!strcmp(cJSON_GetObjectItem(j, "budget")->valuestring, "64"))
            stream_kv[li][di] = kv;
        cJSON_Delete(j);
    }
    assert_int_equal(rows, 3 * 2 * 3); /* (full + 2 budgets) x 2 lengths x 3 depths */
    /* streaming evicts: it holds less than the full cache, and its 64-token window does not grow
     * with the prompt (the dense layers do, which the full cache shows) */
    for (int li = 0; li < 2; li++)
        for (int di = 0; di < 3; di++)
            assert_true(stream_kv[li][di] > 0 && stream_kv[li][di] < full_kv[li][di]);
    assert_true(full_kv[1][1] > full_kv[0][1]);
    free(out);
    static const char *const pngs[] = {"niah_single_full_all.png", "niah_single_streaming_64.png",
                                       "niah_single_streaming_1_4.png", "niah_single_all.png"};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof(cmd), "%s/%s", dir, pngs[i]);
        size_t n = 0;
        char *png = kvp_test_read_file(cmd, &n);
        assert_non_null(png);
        assert_true(n > 8 && !memcmp(png, "\x89PNG", 4));
        free(png);
        remove(cmd);
    }
    rmdir(dir);
    free(dir);
}

/* Width and height of a PNG file, read back with libpng; false if it does not decode. */
static bool png_size(const char *path, int *w, int *h)
{
    png_image img;
    memset(&img, 0, sizeof(img));
    img.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&img, path))
        return false;
    *w = (int)img.width;
    *h = (int)img.height;
    png_image_free(&img);
    return true;
}

/* --heatmap on a tiny passkey grid: a labelled figure per policy x budget (file names as before)
 * and the overview TASK_all.png with every panel, larger than any one of them. */
static void test_cli_heatmap(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    KVP_REQUIRE_SHARED(model_tmp, "models/stories260K.gguf");
    char model[1024];
    snprintf(model, sizeof(model), "%s", model_tmp);
    KVP_REQUIRE_SHARED(filler, "data/pg_essays");
    char *dir = kvp_test_tmpfile("");
    remove(dir);
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "%s eval -m %s --task passkey --lengths 256,320 --depths 0,100 --samples 1 "
             "--policy full,streaming --budget 32,1/4 --filler %s --heatmap %s 2>&1",
             cli, model, filler, dir);
    int st = kvp_test_run(cmd, &out, 1);
    if (st != 0)
        print_message("%s\n", out ? out : "");
    assert_int_equal(st, 0);
    free(out);
    static const char *const pngs[] = {"passkey_full_all.png", "passkey_streaming_32.png",
                                       "passkey_streaming_1_4.png", "passkey_all.png"};
    int w[4], h[4];
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof(cmd), "%s/%s", dir, pngs[i]);
        if (!png_size(cmd, &w[i], &h[i]))
            fail_msg("%s is missing or not a PNG", cmd);
        /* room for the title, the labels and the legend around a 2 x 2 grid */
        assert_true(w[i] >= 300 && h[i] >= 200);
        remove(cmd);
    }
    /* the overview: full alone in the first row, streaming's two budgets in the second */
    assert_true(w[3] > w[1] + 200 && h[3] > h[1] + 100);
    assert_int_equal(rmdir(dir), 0); /* nothing else was written */
    free(dir);
}

static void expect_error(const char *args, const char *needle)
{
    char cmd[4096];
    const char *model = kvp_test_shared("models/stories260K.gguf");
    snprintf(cmd, sizeof(cmd), "%s eval -m %s %s", kvp_test_cli(), model ? model : "x.gguf",
             args);
    kvp_test_expect_error(cmd, needle);
}

static void test_bad_flags(void **state)
{
    (void)state;
    assert_non_null(kvp_test_cli());
    expect_error("--task bogus", "--task 'bogus'");
    expect_error("--task passkey --depths 0,150", "--depths");
    expect_error("--task passkey --lengths 1k", "--lengths");
    expect_error("--task passkey --lengths 512,", "--lengths");
    expect_error("--task passkey --samples 0", "--samples");
    expect_error("--task passkey --budget 2/1", "--budget");
    expect_error("--task passkey --policy nope", "unknown policy 'nope'");
    expect_error("--task passkey --frobnicate", "unknown flag '--frobnicate'");
    expect_error("--task passkey --filler /nonexistent/dir", "filler");
}

/* The protocol through the library (kvp_task_eval_run_grid) on the shipped model: full attention
 * finds every pass key; a 64-token streaming window finds it only when the needle sits at the end
 * of the prompt (depth 100 %), inside the window, and never at depth 0; both runs see the same
 * prompts, and a streaming cache holds less KV. */
static void test_protocol_library(void **state)
{
    (void)state;
    const char *root = getenv("KVP_SOURCE_DIR");
    if (!root) {
        kvp_test_skip_missing("KVP_SOURCE_DIR not set");
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/models/kvpred-default.gguf", root);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(path, NULL, &m, &err), 0);
    int ti = kvp_task_eval_index("passkey");
    assert_true(ti >= 0 && kvp_task_eval_kind(ti)->task == KVP_TASK_PASSKEY);
    assert_int_equal(kvp_task_eval_index("nope"), -1);
    struct kvp_corpus *c = NULL;
    assert_int_equal(kvp_task_eval_filler(NULL, kvp_task_eval_index("vt"), &c, &err), KVP_EINVAL);
    assert_int_equal(kvp_task_eval_filler(NULL, ti, &c, &err), 0);
    static const long lengths[] = {256}, depths[] = {0, 100};
    const struct kvp_task_eval_grid g = {.ti = ti, .lengths = lengths, .depths = depths,
                                         .n_len = 1, .n_depth = 2, .samples = 2, .seed = 42};
    struct kvp_task_eval_cell cells[2][2];
    memset(cells, 0, sizeof(cells));
    struct kvp_task_eval_run runs[2] = {
        {.pp = {.name = "full", .gqa_agg = KVP_AGG_MEAN}, .label = "all", .cells = cells[0]},
        {.pp = {.name = "streaming", .budget = 64, .gqa_agg = KVP_AGG_MEAN}, .label = "64",
         .cells = cells[1]},
    };
    kvp_ctx *ctx = NULL;
    struct kvp_ctx_params cp = {.n_ctx = (int)kvp_task_eval_ctx_tokens(&g), .n_threads = 2};
    assert_int_equal(kvp_ctx_init(m, &cp, &ctx, &err), 0);
    assert_int_equal(kvp_task_eval_run_grid(ctx, m, c, &g, runs, 2, NULL, NULL, &err), 0);
    for (int d = 0; d < 2; d++) {
        print_message("depth %ld: full %.2f, streaming 64 %.2f (prompt %.0f tokens)\n", depths[d],
                      cells[0][d].accuracy, cells[1][d].accuracy, cells[0][d].prompt_tokens);
        assert_true(cells[0][d].accuracy == 1.0 && cells[0][d].exact == 1.0);
        assert_true(cells[0][d].prompt_tokens <= 256 && cells[0][d].prompt_tokens > 128);
        assert_true(cells[1][d].prompt_tokens == cells[0][d].prompt_tokens);
        assert_true(cells[1][d].kv_resident_bytes < cells[0][d].kv_resident_bytes);
        assert_true(cells[0][d].kv_kept_bytes <= cells[0][d].kv_resident_bytes);
    }
    assert_true(cells[1][0].accuracy == 0.0 && cells[1][1].accuracy == 1.0);
    /* the prompt of a sample is the one the grid decoded, and the same at every call */
    struct kvp_task_text a, b;
    assert_int_equal(kvp_task_eval_prompt(c, m, ti, 42, 1, 256, 50, &a, &err), 0);
    assert_int_equal(kvp_task_eval_prompt(c, m, ti, 42, 1, 256, 50, &b, &err), 0);
    assert_string_equal(a.prompt, b.prompt);
    kvp_task_text_free(&a);
    kvp_task_text_free(&b);
    kvp_ctx_free(ctx);
    kvp_corpus_free(c);
    kvp_model_close(m);
}

/* One fill for many runs (task_eval.h): in a grid of full, quest, qpredictor and snapkv, every
 * cell answers bit for bit as the run of its policy alone and as the grid with every run's own
 * whole prefill (--no-shared-fill): answer_fnv hashes each sample's answer and its last logits,
 * and the figures that follow from the cache match exactly too; yet the three non-evicting runs
 * decode from one prefill of each prompt, the later ones after truncating back to it; snapkv,
 * which evicts, prefills on its own. Prompts of 512 and 1024 tokens in passes of 128 (-b): shared
 * heads of 384 and 896 tokens. Two samples per cell, so the second prompt's fill replaces the
 * first's. With a dense prefill and with a sparse one (which applies to the shared fill as to a
 * run's own prefill). */
static void shared_fill_grid(const char *root, const char *cli, const char *prefill)
{
    static char base[8192], cmd[9000];
    snprintf(base, sizeof(base),
             "%s eval -m %s/models/kvpred-default.gguf --task passkey --lengths 512,1024 "
             "--depths 50 --samples 2 --seed 3 --budget 1/8 -t 2 -b 128 "
             "--aux %s/models/kvpred-default.qkvpp --json %s",
             cli, root, root, prefill);
    static const char *const pols[] = {"full", "quest", "qpredictor", "snapkv"};
    enum { N_POL = 4, N_LEN = 2 };
    cJSON *list[N_POL * N_LEN + 1] = {0}, *own[N_POL * N_LEN + 1] = {0};
    snprintf(cmd, sizeof(cmd), "%s --policy full,quest,qpredictor,snapkv 2>/dev/null", base);
    assert_int_equal(kvp_test_run_json_lines(cmd, list, N_POL * N_LEN + 1), N_POL * N_LEN);
    snprintf(cmd, sizeof(cmd), "%s --policy full,quest,qpredictor,snapkv --no-shared-fill "
             "2>/dev/null", base);
    assert_int_equal(kvp_test_run_json_lines(cmd, own, N_POL * N_LEN + 1), N_POL * N_LEN);
    static const char *const same[] = {"accuracy",      "exact",          "prompt_tokens",
                                       "budget_tokens", "read_tokens",    "kv_resident_bytes",
                                       "kv_kept_bytes"};
    for (int p = 0; p < N_POL; p++) {
        cJSON *alone[N_LEN + 1] = {0};
        snprintf(cmd, sizeof(cmd), "%s --policy %s 2>/dev/null", base, pols[p]);
        assert_int_equal(kvp_test_run_json_lines(cmd, alone, N_LEN + 1), N_LEN);
        for (int li = 0; li < N_LEN; li++) {
            cJSON *a = alone[li], *b = list[p * N_LEN + li], *o = own[p * N_LEN + li];
            assert_string_equal(cJSON_GetObjectItem(b, "policy")->valuestring, pols[p]);
            assert_int_equal(cJSON_GetObjectItem(a, "length")->valueint,
                             cJSON_GetObjectItem(b, "length")->valueint);
            const char *fa = cJSON_GetObjectItem(a, "answer_fnv")->valuestring;
            const char *fb = cJSON_GetObjectItem(b, "answer_fnv")->valuestring;
            const char *fo = cJSON_GetObjectItem(o, "answer_fnv")->valuestring;
            print_message("%s at %d%s: alone %s, in the grid %s, own prefill %s (accuracy "
                          "%.2f)\n",
                          pols[p], cJSON_GetObjectItem(a, "length")->valueint,
                          *prefill ? ", sparse" : "", fa, fb, fo,
                          cJSON_GetObjectItem(b, "accuracy")->valuedouble);
            assert_string_equal(fa, fb);
            assert_string_equal(fo, fb);
            for (size_t f = 0; f < sizeof(same) / sizeof(same[0]); f++) {
                const double vb = cJSON_GetObjectItem(b, same[f])->valuedouble;
                assert_true(cJSON_GetObjectItem(a, same[f])->valuedouble == vb);
                assert_true(cJSON_GetObjectItem(o, same[f])->valuedouble == vb);
            }
            assert_false(cJSON_IsTrue(cJSON_GetObjectItem(o, "shared_fill")));
            assert_true(cJSON_GetObjectItem(o, "fill_seconds")->valuedouble == 0);
            /* the three non-evicting runs share the fill (alone too: the same path), and its
             * time is theirs apart; snapkv prefills its prompts itself */
            bool shares = p < 3;
            assert_true(cJSON_IsTrue(cJSON_GetObjectItem(b, "shared_fill")) == shares);
            assert_true(cJSON_IsTrue(cJSON_GetObjectItem(a, "shared_fill")) == shares);
            double fs = cJSON_GetObjectItem(b, "fill_seconds")->valuedouble;
            assert_true(shares ? fs > 0 : fs == 0);
            cJSON_Delete(a);
            cJSON_Delete(b);
            cJSON_Delete(o);
        }
    }
}

static void test_shared_fill(void **state)
{
    (void)state;
    const char *root = getenv("KVP_SOURCE_DIR"), *cli = kvp_test_cli();
    if (!root || !cli) {
        kvp_test_skip_missing("KVP_SOURCE_DIR or the CLI not set");
    }
    shared_fill_grid(root, cli, "");
    shared_fill_grid(root, cli,
                     "--prefill-policy sparse --prefill-budget 1/4 --prefill-min-keys 1 "
                     "--prefill-window 64 --prefill-tail 64");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_passkey_prose), cmocka_unit_test(test_depth),
        cmocka_unit_test(test_length),        cmocka_unit_test(test_score),
        cmocka_unit_test(test_cli),           cmocka_unit_test(test_cli_heatmap),
        cmocka_unit_test(test_bad_flags), cmocka_unit_test(test_protocol_library),
        cmocka_unit_test(test_shared_fill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
