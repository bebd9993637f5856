/*
 * `kvpred synth`: every named shape, written with a few layers, loads back with that shape, its
 * tokenizer round-trips text, and a forward pass gives finite logits; the file does not depend
 * on the thread count; bad arguments fail with one error line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kernels/types.h"
#include "kvpred.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "testutil.h"

/* Write shape s with 1 layer in type, load it, check the shape and run a short prompt. */
static void check_shape(const struct kvp_synth_shape *s, int type)
{
    char *path = kvp_test_tmpfile(".gguf");
    struct kvp_synth_params p = {.type = type, .n_layer = 1, .n_vocab = 400, .seed = 7,
                                 .n_threads = 2};
    struct kvp_err err = {0};
    assert_int_equal(kvp_synth_write(s, &p, path, NULL, &err), 0);
    kvp_model *m = NULL;
    assert_int_equal(kvp_model_open(path, NULL, &m, &err), 0);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    assert_string_equal(in.arch, s->arch);
    assert_int_equal(in.n_layer, 1);
    assert_int_equal(in.n_embd, s->n_embd);
    assert_int_equal(in.n_head, s->n_head);
    assert_int_equal(in.n_head_kv, s->n_head_kv);
    assert_int_equal(in.head_dim, s->head_dim);
    assert_int_equal(in.n_ff, s->n_ff);
    assert_int_equal(in.n_vocab, 400);
    assert_true(in.tied_output == s->tied);
    assert_true(fabsf(in.rope_base - s->rope_base) <= 1e-3f * s->rope_base);
    /* rows of n_embd that the type's blocks do not divide take its fallback (Qwen2.5's 896) */
    assert_int_equal(in.weight_type, kvp_quantize_pick_type(type, s->n_embd));

    const char *text = "Hello, synth world! 42";
    int32_t ids[64];
    size_t nt = 0;
    assert_int_equal(kvp_tokenize(m, text, strlen(text), true, ids, 64, &nt, &err), 0);
    int n = (int)nt;
    assert_true(n > 1);
    char back[128] = {0};
    size_t o = 0;
    for (int i = 1; i < n; i++)
        o += kvp_token_to_piece(m, ids[i - 1], ids[i], back + o, sizeof(back) - 1 - o);
    assert_string_equal(back, text);

    kvp_ctx *c = NULL;
    struct kvp_ctx_params cp = {.n_ctx = 64, .n_threads = 2};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    float *logits = malloc(sizeof(float) * 400);
    assert_int_equal(kvp_eval(c, ids, n, logits, false, &err), 0);
    for (int step = 0; step < 4; step++) {
        int best = 0;
        for (int v = 0; v < 400; v++) {
            assert_true(isfinite(logits[v]));
            if (logits[v] > logits[best])
                best = v;
        }
        int32_t t = best;
        assert_int_equal(kvp_eval(c, &t, 1, logits, false, &err), 0);
    }
    free(logits);
    kvp_ctx_free(c);
    kvp_model_close(m);
    remove(path);
    free(path);
}

static void test_shapes(void **state)
{
    (void)state;
    /* the K-quants' reference quantizer is slow: they get the small shapes */
    static const int types[] = {KVP_TYPE_Q4_K, KVP_TYPE_Q6_K, KVP_TYPE_Q8_0, KVP_TYPE_Q4_0};
    for (int i = 0; kvp_synth_shape_at(i); i++) {
        const struct kvp_synth_shape *s = kvp_synth_shape_at(i);
        print_message("%s %s\n", s->name, kvp_type_name(types[i % 4]));
        check_shape(s, types[i % 4]);
    }
    assert_non_null(kvp_synth_find_shape("smollm2-135m"));
    assert_null(kvp_synth_find_shape("GPT-5"));
}

/* The same seed gives the same bytes with 1 and 3 threads; another seed differs. */
static void test_deterministic(void **state)
{
    (void)state;
    const struct kvp_synth_shape *s = kvp_synth_find_shape("SmolLM2-135M");
    char *a = kvp_test_tmpfile(".gguf"), *b = kvp_test_tmpfile(".gguf"), *c = kvp_test_tmpfile(".gguf");
    struct kvp_synth_params p = {.type = KVP_TYPE_Q4_0, .n_layer = 1, .n_vocab = 320, .seed = 3,
                                 .n_threads = 1};
    struct kvp_err err = {0};
    assert_int_equal(kvp_synth_write(s, &p, a, NULL, &err), 0);
    p.n_threads = 3;
    assert_int_equal(kvp_synth_write(s, &p, b, NULL, &err), 0);
    p.seed = 4;
    assert_int_equal(kvp_synth_write(s, &p, c, NULL, &err), 0);
    size_t na, nb, nc;
    char *da = kvp_test_read_file(a, &na), *db = kvp_test_read_file(b, &nb),
         *dc = kvp_test_read_file(c, &nc);
    assert_true(na == nb && na == nc);
    assert_memory_equal(da, db, na);
    assert_true(memcmp(da, dc, na) != 0);
    free(da);
    free(db);
    free(dc);
    remove(a);
    remove(b);
    remove(c);
    free(a);
    free(b);
    free(c);
}

static void test_cli(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char *path = kvp_test_tmpfile(".gguf");
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s synth --shape Qwen2.5-0.5B --type Q6_K --layers 1 -o %s", cli,
             path);
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 1), 0);
    assert_non_null(strstr(out, "Qwen2.5-0.5B"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s info -m %s --json", cli, path);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "arch")->valuestring, "qwen2");
    /* the layers asked for, the shape's own sizes, the default small vocabulary */
    assert_int_equal(cJSON_GetObjectItem(j, "n_layer")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(j, "n_embd")->valueint, 896);
    assert_int_equal(cJSON_GetObjectItem(j, "n_head")->valueint, 14);
    assert_int_equal(cJSON_GetObjectItem(j, "n_head_kv")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(j, "n_ff")->valueint, 4864);
    assert_int_equal(cJSON_GetObjectItem(j, "n_vocab")->valueint, 512);
    /* the type asked for, where a row allows it: Q6_K needs rows that are a multiple of 256, so
     * of the 8 matrices (the tied embedding, q, k, v, o, gate, up of 896 columns, down of 4864)
     * only down takes it and the rest fall back to Q8_0, as kvpred quantize does */
    const cJSON *types = cJSON_GetObjectItem(j, "matrix_types");
    assert_non_null(types);
    assert_int_equal(cJSON_GetArraySize(types), 2);
    assert_int_equal(cJSON_GetObjectItem(types, "Q6_K")->valueint, 1);
    assert_int_equal(cJSON_GetObjectItem(types, "Q8_0")->valueint, 7);
    cJSON_Delete(j);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s synth --shape GPT-5 -o %s", cli, path);
    kvp_test_expect_error(cmd, "unknown shape");
    snprintf(cmd, sizeof(cmd), "%s synth --shape SmolLM2-135M --type Q9 -o %s", cli, path);
    kvp_test_expect_error(cmd, "unknown type");
    snprintf(cmd, sizeof(cmd), "%s synth --shape SmolLM2-135M --vocab 10 -o %s", cli, path);
    kvp_test_expect_error(cmd, "--vocab");
    snprintf(cmd, sizeof(cmd), "%s synth --shape SmolLM2-135M", cli);
    kvp_test_expect_error(cmd, "-o is required");
    remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
