/*
 * kvp_ctx_fill_tile (src/forward/tile.c): a cache grown by tiling a real prompt holds, at every
 * new position p, the source key turned by RoPE from its position s to p and the source value,
 * on every KV type and both RoPE styles; the policy's block metadata covers the tiled tokens
 * (decode after tiling equals decode after a copy whose policy rebuilt everything); tiered
 * caches tile the same way; bad calls are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "forward/context.h"
#include "kv/kvcache.h"
#include "kvpred.h"
#include "kvpred_lab.h"
#include "testutil.h"

/* the disk tier's reads submitted by syscall: no polling kernel thread competing for the
 * test's cores */
static const struct kvp_disk_ring_params by_syscall = {.syscall_submit = true};

enum { BS = 16, M = 100, N = 400, CTX = 512, ND = 4 };

static kvp_model *open_fixture(const char *arch, int rope_freqs, char **path)
{
    /* head_dim 64 as real models; two KV heads of four query heads (GQA) */
    struct kvp_test_model_spec sp = {.n_vocab = 96, .n_embd = 256, .n_layer = 3, .n_head = 4,
                                     .n_head_kv = 2, .n_ff = 256, .n_ctx = CTX,
                                     .type = KVP_TYPE_F32, .embd_type = KVP_TYPE_F32,
                                     .tied = 1, .seed = 7, .arch = arch,
                                     .rope_freqs = rope_freqs, .rope_base = 10000.0f};
    *path = kvp_test_tmpfile(".gguf");
    assert_int_equal(kvp_test_write_model(&sp, *path, NULL), 0);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(*path, NULL, &m, &err), 0);
    return m;
}

static void close_fixture(kvp_model *m, char *path)
{
    kvp_model_close(m);
    remove(path);
    free(path);
}

static void prompt(int32_t *ids, int n, int n_vocab)
{
    uint32_t x = 12345;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % (uint32_t)n_vocab);
    }
}

/* The cache type's error bound for storing e (dimension d of the head vector e[hd]) once:
 * rounding to nearest of f32 (2^-24), f16 (2^-11, plus 2^-25 absolute below f16's normal range)
 * and bf16 (2^-8) relative; q8_0 quantizes each group of 32 dimensions with d = max|e|/127 held
 * as f16: error <= d(1 + 2^-11)/2 from rounding to the step, plus up to 127 d 2^-11 where the
 * rounded scale is short and q clamps at 127. The rotation itself runs in double and is cast to
 * f32 before storing: 2^-24 |e_d| more. */
static double store_bound(int type, const double *e, int hd, int d)
{
    double a = fabs(e[d]), cast = ldexp(a, -24);
    switch (type) {
    case KVP_KV_F32:
        return 2 * cast;
    case KVP_KV_F16:
        return ldexp(a, -11) + ldexp(1, -25) + cast;
    case KVP_KV_BF16:
        return ldexp(a, -8) + cast;
    default: {
        int g0 = d / 32 * 32, g1 = g0 + 32 < hd ? g0 + 32 : hd;
        double amax = 0;
        for (int i = g0; i < g1; i++)
            amax = fabs(e[i]) > amax ? fabs(e[i]) : amax;
        double step = amax / 127 * (1 + ldexp(1, -20));
        return step * (0.5 + ldexp(0.5, -11) + 127 * ldexp(1, -11)) + cast;
    }
    }
}

/* Every tiled key against RoPE(p - s) of the stored source key, computed here in double from
 * the model's own RoPE parameters (not the engine's table); every tiled value bit for bit. */
static void check_keys(const kvp_model *model, kvp_ctx *c, const char *what)
{
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(c);
    const struct kvp_hparams *hp = kvp_ctx_hparams(c);
    const int hd = kv->head_dim, L = M - BS;
    const int stride = hp->rope_style == KVP_ROPE_NEOX ? 1 : 2;
    const int other = hp->rope_style == KVP_ROPE_NEOX ? hd / 2 : 1;
    double inv[64], src[64], want[64];
    assert_true(hd <= 64);
    for (int i = 0; i < hd / 2; i++) {
        inv[i] = pow((double)hp->rope_base, -2.0 * i / hd) * hp->rope_freq_scale;
        if (model->rope_freqs)
            inv[i] /= model->rope_freqs[i];
    }
    double worst = 0; /* largest error as a fraction of its bound */
    for (int l = 0; l < kv->n_layer; l++)
        for (int h = 0; h < kv->n_head_kv; h++)
            for (int p = M; p < N; p++) {
                int s = BS + (p - M) % L;
                for (int d = 0; d < hd; d++)
                    src[d] = kvp_kvcache_key_at(kv, l, h, s, d);
                for (int i = 0; i < hd / 2; i++) {
                    int a = i * stride, b = a + other;
                    double th = (double)(p - s) * inv[i];
                    want[a] = src[a] * cos(th) - src[b] * sin(th);
                    want[b] = src[a] * sin(th) + src[b] * cos(th);
                }
                for (int d = 0; d < hd; d++) {
                    double got = kvp_kvcache_key_at(kv, l, h, p, d);
                    double r = fabs(got - want[d]) / store_bound(kv->type_k, want, hd, d);
                    worst = r > worst ? r : worst;
                    if (r > 1)
                        fail_msg("%s: layer %d head %d pos %d (from %d) dim %d: %.9g, RoPE gives "
                                 "%.9g",
                                 what, l, h, p, s, d, got, want[d]);
                    float vg = kvp_kv_value_at(kv->type_v, kvp_kvcache_vblock(kv, l, h, p / BS),
                                               hd, BS, p % BS, d);
                    float vs = kvp_kv_value_at(kv->type_v, kvp_kvcache_vblock(kv, l, h, s / BS),
                                               hd, BS, s % BS, d);
                    if (memcmp(&vg, &vs, sizeof(vg)) != 0)
                        fail_msg("%s: value at %d is not the value at %d", what, p, s);
                }
            }
    print_message("%s: worst key error %.3f of its bound\n", what, worst);
}

static void test_keys_rerotated(void **state)
{
    (void)state;
    const char *arches[] = {"llama", "qwen2"}; /* NORM and NEOX pairs */
    const int types[] = {KVP_KV_F16, KVP_KV_F32, KVP_KV_BF16, KVP_KV_Q8_0};
    int32_t ids[M];
    for (int a = 0; a < 2; a++) {
        char *path;
        kvp_model *m = open_fixture(arches[a], a == 0, &path);
        struct kvp_model_info in;
        kvp_model_get_info(m, &in);
        prompt(ids, M, in.n_vocab);
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
            struct kvp_ctx_params cp = {.n_ctx = CTX, .type_k = types[t], .type_v = types[t]};
            kvp_ctx *c = NULL;
            struct kvp_err err = {0};
            assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
            assert_int_equal(kvp_eval(c, ids, M, NULL, false, &err), 0);
            if (kvp_ctx_fill_tile(c, N, &err) < 0)
                fail_msg("tile: %s", err.msg);
            assert_int_equal(kvp_ctx_n_tokens(c), N);
            char what[64];
            snprintf(what, sizeof(what), "%s, KV type %d", arches[a], types[t]);
            check_keys(m, c, what);
            kvp_ctx_free(c);
        }
        close_fixture(m, path);
    }
}

/* Decode ND tokens on a and b, logits into la and lb. */
static void decode_both(kvp_ctx *a, kvp_ctx *b, const int32_t *ids, float *la, float *lb,
                        size_t nv)
{
    struct kvp_err err = {0};
    for (int i = 0; i < ND; i++) {
        if (kvp_eval(a, ids + i, 1, la + i * nv, false, &err) < 0 ||
            kvp_eval(b, ids + i, 1, lb + i * nv, false, &err) < 0)
            fail_msg("decode: %s", err.msg);
    }
}

/* The policy's metadata covers the tiled tokens: decoding after kvp_ctx_fill_tile gives the
 * logits of a context that received the same cache by kvp_seq_copy, whose policy rebuilt its
 * metadata over every token. At budget 48 of 400 a bound built only over the prompt would
 * choose other blocks. Tiered caches (RAM and disk, hot tier of two blocks) tile through the
 * store: their decode equals a tiered copy of the untiered tiled cache. */
static void test_policy_and_tiers(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = open_fixture("llama", 0, &path);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    const size_t nv = (size_t)in.n_vocab;
    int32_t ids[M + ND];
    prompt(ids, M + ND, in.n_vocab);
    float *la = malloc(ND * nv * sizeof(float)), *lb = malloc(ND * nv * sizeof(float));
    char *dir = kvp_test_tmpdir();
    const char *pols[] = {"quest", "full"};
    const int tiers[] = {KVP_TIER_NONE, KVP_TIER_RAM, KVP_TIER_DISK};
    for (size_t pi = 0; pi < 2; pi++)
        for (int t = 0; t < 3; t++) {
            struct kvp_policy_params pp = {.name = pols[pi], .budget = 48, .sink = 4,
                                           .local = 8, .dense_layers = 1};
            struct kvp_ctx_params cp = {.n_ctx = CTX, .kv_tier = tiers[t], .kv_dir = dir,
                                        .kv_ring = &by_syscall,
                                        .hot_budget = tiers[t] ? 32 : 0};
            struct kvp_ctx_params plain = {.n_ctx = CTX};
            kvp_ctx *src = NULL, *a = NULL, *b = NULL;
            struct kvp_err err = {0};
            assert_int_equal(kvp_ctx_init(m, &plain, &src, &err), 0);
            assert_int_equal(kvp_ctx_init(m, &cp, &a, &err), 0);
            assert_int_equal(kvp_ctx_init(m, &cp, &b, &err), 0);
            assert_int_equal(kvp_ctx_set_policy(src, &pp, &err), 0);
            assert_int_equal(kvp_ctx_set_policy(a, &pp, &err), 0);
            assert_int_equal(kvp_ctx_set_policy(b, &pp, &err), 0);
            assert_int_equal(kvp_eval(src, ids, M, NULL, false, &err), 0);
            assert_int_equal(kvp_ctx_fill_tile(src, N, &err), 0);
            assert_int_equal(kvp_eval(a, ids, M, NULL, false, &err), 0);
            if (kvp_ctx_fill_tile(a, N, &err) < 0)
                fail_msg("tile, %s, tier %d: %s", pols[pi], tiers[t], err.msg);
            assert_int_equal(kvp_seq_copy(b, src, N, &err), 0);
            decode_both(a, b, ids + M, la, lb, nv);
            if (memcmp(la, lb, ND * nv * sizeof(float)) != 0)
                fail_msg("%s, tier %d: decode after tiling differs from after a copy", pols[pi],
                         tiers[t]);
            kvp_ctx_free(src);
            kvp_ctx_free(a);
            kvp_ctx_free(b);
        }
    rmdir(dir);
    free(dir);
    free(la), free(lb);
    close_fixture(m, path);
}

static void test_refusals(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = open_fixture("llama", 0, &path);
    int32_t ids[M];
    prompt(ids, M, 96);
    struct kvp_ctx_params cp = {.n_ctx = CTX};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_fill_tile(NULL, N, &err), KVP_EINVAL);
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    assert_int_equal(kvp_eval(c, ids, 2 * BS - 1, NULL, false, &err), 0);
    assert_int_equal(kvp_ctx_fill_tile(c, N, &err), KVP_EINVAL); /* under two blocks */
    assert_int_equal(kvp_eval(c, ids + 2 * BS - 1, 1, NULL, false, &err), 0);
    assert_int_equal(kvp_ctx_fill_tile(c, CTX + 1, &err), KVP_ERANGE);
    assert_int_equal(kvp_ctx_fill_tile(c, 2 * BS - 1, &err), KVP_ERANGE); /* shrinking */
    assert_int_equal(kvp_ctx_fill_tile(c, 2 * BS, &err), 0);              /* nothing to do */
    struct kvp_policy_params pp = {.name = "snapkv", .budget = 48};
    assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), 0);
    assert_int_equal(kvp_eval(c, ids, M, NULL, false, &err), 0);
    assert_int_equal(kvp_ctx_fill_tile(c, N, &err), KVP_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "snapkv"));
    kvp_ctx_free(c);
    close_fixture(m, path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_rerotated),
        cmocka_unit_test(test_policy_and_tiers),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
