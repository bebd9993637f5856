/*
 * Sparse decode attention on hand-made data, for every KV cache type: the output and
 * probabilities against a float64 evaluation of the stored (dequantized) keys and values
 * (masks, evicted tokens, a partial last block, an empty selection), and that reducing some
 * blocks early (what the tiered store does with the blocks that are hot while its misses are
 * read) gives the same bits as reducing them all in order, for any set of early blocks and any
 * room for them. Then each type against f32 on the same data (dense and sparse, within the
 * bounds stated at test_types_vs_f32), and the AVX-512 kernels of each type against the scalar
 * ones.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/attention.h"
#include "kv/kvcache.h"
#include "testutil.h"

enum { HD = 12, BS = 16, CTX = 256, NKV = 2, G = 3, NKEYS = 200 };

static uint32_t rng = 12345;
static int cur_type = KVP_KV_F32; /* the type make_cache stores */
static const int all_types[] = {KVP_KV_F32, KVP_KV_F16, KVP_KV_BF16, KVP_KV_Q8_0};
#define N_TYPES 4

static float urand(void) /* in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}

/* One layer, NKV heads, NKEYS random tokens; head 1 loses a few tokens to eviction. */
static void make_cache(struct kvp_kvcache *c)
{
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init(c, 1, NKV, HD, BS, CTX, cur_type, cur_type, &err), 0);
    assert_int_equal(kvp_kvcache_reserve(c, NKEYS, &err), 0);
    for (int h = 0; h < NKV; h++)
        for (int p = 0; p < NKEYS; p++) {
            float k[HD], v[HD];
            for (int d = 0; d < HD; d++) {
                k[d] = 3.0f * urand();
                v[d] = urand();
            }
            kvp_kvcache_store(c, 0, h, p, k, v);
        }
    const int gone[] = {33, 34, 50, 51, 52, 198};
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        kvp_kvcache_evict(c, 0, 1, gone[i], NKEYS);
}

/* The cache of make_cache and a selection of blocks 0, 2, 3, 7 and 12 (12 is the partial last
 * block), some tokens masked. */
struct fixture {
    struct kvp_kvcache c;
    int32_t blocks[8];
    uint64_t mask[8];
    struct kvp_sel sel;
};

static void fixture_init(struct fixture *f)
{
    const int32_t b[] = {0, 2, 3, 7, 12};
    const uint64_t m[] = {0xFFFF, 0x0FF0, 0xFFFF, 0x8001, 0xFFFF};
    make_cache(&f->c);
    memcpy(f->blocks, b, sizeof(b));
    memcpy(f->mask, m, sizeof(m));
    f->sel = (struct kvp_sel){.n = 5, .blocks = f->blocks, .mask = f->mask};
}

struct blocks_buf {
    struct kvp_attn_blocks ab;
    float *f;
    int32_t *idx;
};

static void blocks_init(struct blocks_buf *b, int cap)
{
    const int mb = CTX / BS;
    b->f = calloc((size_t)G * mb + G * HD + G + (size_t)G * cap * HD + (size_t)cap * G + 1,
                  sizeof(float));
    b->idx = calloc((size_t)cap + 1, sizeof(int32_t));
    assert_non_null(b->f);
    assert_non_null(b->idx);
    b->ab = (struct kvp_attn_blocks){.bmax = b->f, .bmax_stride = mb, .cap = cap, .idx = b->idx};
    b->ab.tmp = b->f + (size_t)G * mb;
    b->ab.tmp_l = b->ab.tmp + G * HD;
    b->ab.o = b->ab.tmp_l + G;
    b->ab.lsum = b->ab.o + (size_t)G * cap * HD;
}

static void blocks_free(struct blocks_buf *b)
{
    free(b->f);
    free(b->idx);
}

/* Whether token t of selected block i is read by KV head h. */
static bool reads(const struct kvp_kvcache *c, int h, const struct kvp_sel *sel, int i, int t)
{
    int pos = sel->blocks[i] * BS + t;
    return pos < NKEYS && ((sel->mask[i] >> t) & 1) &&
           !((kvp_kvcache_evicted(c, 0, h, sel->blocks[i]) >> t) & 1);
}

static void matches_float64(void)
{
    struct fixture f;
    fixture_init(&f);
    struct kvp_kvcache *c = &f.c;
    struct kvp_sel sel = f.sel;
    struct blocks_buf b;
    blocks_init(&b, 0);
    float q[G * HD], out[G * HD], probs[G * CTX];
    for (int h = 0; h < NKV; h++) {
        for (int i = 0; i < G * HD; i++)
            q[i] = urand();
        kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, &sel, probs, CTX, &b.ab, out);
        for (int j = 0; j < G; j++) {
            double s[5 * BS], mx = -INFINITY, sum = 0, o[HD] = {0};
            for (int i = 0; i < sel.n; i++)
                for (int t = 0; t < BS; t++) {
                    double dot = -INFINITY;
                    if (reads(c, h, &sel, i, t)) {
                        dot = 0;
                        for (int d = 0; d < HD; d++)
                            dot += (double)q[j * HD + d] *
                                   kvp_kvcache_key_at(c, 0, h, sel.blocks[i] * BS + t, d);
                        dot /= sqrt((double)HD);
                    }
                    s[i * BS + t] = dot;
                    mx = dot > mx ? dot : mx;
                }
            for (int i = 0; i < sel.n * BS; i++)
                sum += s[i] == -INFINITY ? 0 : exp(s[i] - mx);
            for (int i = 0; i < sel.n; i++)
                for (int t = 0; t < BS; t++) {
                    double p = s[i * BS + t] == -INFINITY ? 0 : exp(s[i * BS + t] - mx) / sum;
                    assert_true(fabs(p - probs[j * CTX + i * BS + t]) < 1e-6);
                    const uint8_t *vb = kvp_kvcache_vblock(c, 0, h, sel.blocks[i]);
                    for (int d = 0; d < HD && p > 0; d++)
                        o[d] += p * kvp_kv_value_at(c->type_v, vb, HD, BS, t, d);
                }
            for (int d = 0; d < HD; d++)
                assert_true(fabs(o[d] - out[j * HD + d]) < 1e-5);
        }
    }
    /* nothing readable: output and probabilities 0 */
    sel.mask[0] = sel.mask[1] = sel.mask[2] = sel.mask[3] = sel.mask[4] = 0;
    kvp_attn_sparse_group(c, 0, 0, q, G, NKEYS, &sel, probs, CTX, &b.ab, out);
    for (int i = 0; i < G * HD; i++)
        assert_true(out[i] == 0.0f);
    for (int j = 0; j < G; j++)
        for (int i = 0; i < sel.n * BS; i++)
            assert_true(probs[j * CTX + i] == 0.0f);
    blocks_free(&b);
    kvp_kvcache_free(c);
}

static void test_matches_float64(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        matches_float64();
    }
}

static void early_blocks_same_bits(void)
{
    struct fixture f;
    fixture_init(&f);
    struct kvp_kvcache *c = &f.c;
    const struct kvp_sel sel = f.sel;
    struct blocks_buf plain, early;
    blocks_init(&plain, 0);
    float q[G * HD], out0[G * HD], out1[G * HD], p0[G * CTX], p1[G * CTX];
    for (int i = 0; i < G * HD; i++)
        q[i] = 2.0f * urand();
    int tried = 0;
    for (int cap = 1; cap <= 5; cap += 2) {
        blocks_init(&early, cap);
        for (int h = 0; h < NKV; h++) {
            kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, &sel, p0, CTX, &plain.ab, out0);
            /* every subset of the five blocks still in flight */
            for (int set = 0; set < 32; set++) {
                uint8_t pending[CTX / BS] = {0};
                for (int i = 0; i < sel.n; i++)
                    pending[sel.blocks[i]] = (uint8_t)((set >> i) & 1);
                memset(p1, 0xff, sizeof(p1)); /* NaN: every probability must be written */
                kvp_attn_sparse_early(c, 0, h, q, G, NKEYS, &sel, pending, p1, CTX, &early.ab);
                int ready = sel.n - __builtin_popcount((unsigned)set);
                assert_int_equal(early.ab.n, ready < cap ? ready : cap);
                kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, &sel, p1, CTX, &early.ab, out1);
                assert_int_equal(early.ab.n, 0);
                assert_memory_equal(out0, out1, sizeof(out0));
                for (int j = 0; j < G; j++)
                    assert_memory_equal(p0 + j * CTX, p1 + j * CTX, sel.n * BS * sizeof(float));
                tried++;
            }
        }
        blocks_free(&early);
    }
    assert_int_equal(tried, 3 * NKV * 32);
    blocks_free(&plain);
    kvp_kvcache_free(c);
}

static void test_early_blocks_same_bits(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        early_blocks_same_bits();
    }
}

/* Each type against f32 on the same keys (|k| < 3), values (|v| < 1) and queries (|q| < 1),
 * head_dim 12: the largest difference of a dense or sparse attention output, and of the
 * probabilities. The bounds follow the types' precision (f16: 11 bits, bf16: 8 bits, q8_0:
 * max|x|/254 per element) with about 3x headroom over what the kernels give. */
static void test_types_vs_f32(void **state)
{
    (void)state;
    const double bound[] = {[KVP_KV_F16] = 3e-4, [KVP_KV_BF16] = 3e-3, [KVP_KV_Q8_0] = 4e-3};
    struct fixture ref, f;
    struct blocks_buf b;
    blocks_init(&b, 0);
    float q[G * HD], o_ref[G * HD], o[G * HD], p_ref[G * CTX], p[G * CTX];
    for (int i = 0; i < G * HD; i++)
        q[i] = urand();
    for (int i = 1; i < N_TYPES; i++) {
        uint32_t seed = rng;
        cur_type = KVP_KV_F32;
        fixture_init(&ref);
        rng = seed;
        cur_type = all_types[i];
        fixture_init(&f);
        double worst = 0;
        for (int h = 0; h < NKV; h++)
            for (int dense = 0; dense < 2; dense++) {
                if (dense) { /* head 1 lost tokens: dense reads every token, so only head 0 */
                    if (h)
                        continue;
                    kvp_attn_dense_group(&ref.c, 0, h, q, G, NKEYS, p_ref, CTX, o_ref);
                    kvp_attn_dense_group(&f.c, 0, h, q, G, NKEYS, p, CTX, o);
                } else {
                    kvp_attn_sparse_group(&ref.c, 0, h, q, G, NKEYS, &ref.sel, p_ref, CTX, &b.ab,
                                          o_ref);
                    kvp_attn_sparse_group(&f.c, 0, h, q, G, NKEYS, &f.sel, p, CTX, &b.ab, o);
                }
                for (int k = 0; k < G * HD; k++)
                    worst = fmax(worst, fabs(o[k] - o_ref[k]));
            }
        printf("# KV type %s vs f32: largest attention output difference %.2e (bound %.1e)\n",
               kvp_kv_type_name(cur_type), worst, bound[cur_type]);
        assert_true(worst > 0); /* the type really stores something else */
        assert_true(worst < bound[cur_type]);
        kvp_kvcache_free(&ref.c);
        kvp_kvcache_free(&f.c);
    }
    blocks_free(&b);
}

/* The AVX-512 kernels of each type against the scalar ones on one block (bs 16 and a partial
 * 13, head_dim 12 and 72 for partial q8_0 groups and SIMD tails): the stores give the same
 * bytes; scores, value sums and conversions agree to float rounding. */
static void test_simd_vs_scalar(void **state)
{
    (void)state;
    if (!kvp_kv_kernels_avx512(KVP_KV_F16)) {
        printf("# no AVX-512: only the scalar KV kernels run here\n");
        return;
    }
    enum { MAXHD = 72, MAXBS = 16 };
    const int hds[] = {12, 72}, bss[] = {16, 13};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int hi = 0; hi < 2; hi++)
            for (int bi = 0; bi < 2; bi++) {
                int type = all_types[ti], hd = hds[hi], bs = bss[bi];
                const struct kvp_kv_kernels *s = kvp_kv_kernels_scalar(type);
                const struct kvp_kv_kernels *v = kvp_kv_kernels_avx512(type);
                size_t kb = kvp_kv_block_bytes(type, hd, bs), vb = kb;
                uint8_t ks[8192], kv_[8192], vs[8192], vv[8192];
                assert_true(kb <= sizeof(ks));
                memset(ks, 0, kb), memset(kv_, 0, kb), memset(vs, 0, vb), memset(vv, 0, vb);
                float x[MAXHD], q[MAXHD], pr[MAXBS];
                for (int t = 0; t < bs; t++) {
                    for (int d = 0; d < hd; d++)
                        x[d] = 2.0f * urand();
                    s->put_k(x, ks, hd, bs, t);
                    v->put_k(x, kv_, hd, bs, t);
                    s->put_v(x, vs, hd, bs, t);
                    v->put_v(x, vv, hd, bs, t);
                    pr[t] = 0.5f * (urand() + 1.0f);
                }
                assert_memory_equal(ks, kv_, kb);
                assert_memory_equal(vs, vv, vb);
                for (int d = 0; d < hd; d++)
                    q[d] = urand();
                float a[MAXBS], c[MAXBS], oa[MAXHD] = {0}, oc[MAXHD] = {0};
                float ra[MAXHD * MAXBS], rc[MAXHD * MAXBS];
                s->scores(q, ks, hd, bs, 0.3f, a);
                v->scores(q, ks, hd, bs, 0.3f, c);
                for (int t = 0; t < bs; t++)
                    assert_true(fabsf(a[t] - c[t]) <= 1e-5f * (1.0f + fabsf(a[t])));
                s->accum(pr, vs, hd, bs, bs - 1, oa);
                v->accum(pr, vs, hd, bs, bs - 1, oc);
                for (int d = 0; d < hd; d++)
                    assert_true(fabsf(oa[d] - oc[d]) <= 1e-5f * (1.0f + fabsf(oa[d])));
                s->k_rows(ks, hd, bs, bs - 2, ra, MAXBS);
                v->k_rows(ks, hd, bs, bs - 2, rc, MAXBS);
                for (int d = 0; d < hd; d++)
                    assert_memory_equal(ra + d * MAXBS, rc + d * MAXBS,
                                        (bs - 2) * sizeof(float));
                s->v_rows(vs, hd, bs, bs - 3, ra);
                v->v_rows(vs, hd, bs, bs - 3, rc);
                assert_memory_equal(ra, rc, (size_t)(bs - 3) * hd * sizeof(float));
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_float64),
        cmocka_unit_test(test_early_blocks_same_bits),
        cmocka_unit_test(test_types_vs_f32),
        cmocka_unit_test(test_simd_vs_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
