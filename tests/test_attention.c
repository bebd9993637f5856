/*
 * Sparse decode attention on hand-made data, for every KV cache type: the output and
 * probabilities against a float64 evaluation of the stored (dequantized) keys and values
 * (masks, evicted tokens, a partial last block, an empty selection), and that reducing some
 * blocks early (what the tiered store does with the blocks that are hot while its misses are
 * read) gives the same bits as reducing them all in order, for any set of early blocks and any
 * room for them. Then each type against f32 on the same data (dense and sparse, within the
 * bounds stated at test_types_vs_f32), the AVX-512 kernels of each type against the scalar
 * ones, and the group kernels (g query heads per pass) against the per-head ones, alone and
 * inside attention. And a sliding-window layer's attention over its ring (the window's keys
 * only, the ring wrapping) against float64 for every type.
 */
#include <math.h>
#include <stdbool.h>
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

/* Room for g query heads and cap early blocks. */
static void blocks_init_g(struct blocks_buf *b, int cap, int g)
{
    const int mb = CTX / BS;
    b->f = calloc((size_t)g * mb + g * HD + g + (size_t)g * cap * HD + (size_t)cap * g + 1,
                  sizeof(float));
    b->idx = calloc((size_t)cap + 1, sizeof(int32_t));
    assert_non_null(b->f);
    assert_non_null(b->idx);
    b->ab = (struct kvp_attn_blocks){.bmax = b->f, .bmax_stride = mb, .cap = cap, .idx = b->idx};
    b->ab.tmp = b->f + (size_t)g * mb;
    b->ab.tmp_l = b->ab.tmp + g * HD;
    b->ab.o = b->ab.tmp_l + g;
    b->ab.lsum = b->ab.o + (size_t)g * cap * HD;
}

static void blocks_init(struct blocks_buf *b, int cap)
{
    blocks_init_g(b, cap, G);
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

/* ---- error bounds (docs/testing.md) ----
 * An attention output computed in f32 by either road (dense, or block by block) from the stored
 * keys and values, against the exact result on the same values, to first order:
 *  - a score s_t = scale·Σ_d q_d·k_td is within es_t = gamma(HD + 1)·scale·Σ_d |q_d·k_td|, and
 *    the exponent s_t - max within E = 2·max_t es_t + u·max_t |s_t - max| (one more rounding);
 *  - p_t = exp(s_t - max) / Σ: exponents off by at most E move every p_t by a factor within
 *    exp(±2E); each exp is within 8u (test_kernels' TOL_EXP), used twice on the block road (the
 *    token's and its block's factor), and the sum, reciprocal and product add gamma(n + 2):
 *    eps_p = expm1(2E) + 16u + gamma(n + 2) relative, n the tokens read;
 *  - out_d = Σ_t p_t·v_td is within (eps_p + gamma(n + 1))·Σ_t p_t·|v_td|.
 * With `other` (the same tokens stored in another type), what that type's rounding moved is
 * added: scale·Σ_d |q_d|·|k_td - k'_td| to es_t, and Σ_t p_t·|v_td - v'_td| to out_d. */
#define U32 0x1p-24
struct attn_bound {
    double eps_p;   /* relative, per probability */
    double out[HD]; /* absolute, per output */
};

static void attn_bound(const struct kvp_kvcache *c, const struct kvp_kvcache *other, int h,
                       const float *q, const struct kvp_sel *sel, struct attn_bound *b)
{
    const double cap = c->score_cap;
    const double scale = 1 / sqrt((double)HD);
    static double s[CTX], es[CTX], dv[CTX][HD], v[CTX][HD];
    int n = 0, pos[CTX];
    for (int i = 0; i < (sel ? sel->n : (NKEYS + BS - 1) / BS); i++)
        for (int t = 0; t < BS; t++) {
            int p = (sel ? sel->blocks[i] : i) * BS + t;
            if (sel ? !reads(c, h, sel, i, t) : p >= NKEYS)
                continue;
            double dot = 0, a = 0, dk = 0;
            const uint8_t *vb = kvp_kvcache_vblock(c, 0, h, p / BS);
            for (int d = 0; d < HD; d++) {
                double k = kvp_kvcache_key_at(c, 0, h, p, d);
                dot += q[d] * k, a += fabs(q[d] * k);
                v[n][d] = kvp_kv_value_at(c->type_v, vb, HD, BS, p % BS, d);
                dv[n][d] = 0;
                if (other) {
                    dk += fabs(q[d]) * fabs(k - kvp_kvcache_key_at(other, 0, h, p, d));
                    dv[n][d] = fabs(v[n][d] - kvp_kv_value_at(other->type_v,
                                                               kvp_kvcache_vblock(other, 0, h,
                                                                                  p / BS),
                                                               HD, BS, p % BS, d));
                }
            }
            s[n] = dot * scale;
            es[n] = kvp_test_gamma(HD + 1) * scale * a + scale * dk;
            if (cap > 0) {
                /* soft-capped: tanh's slope is at most 1, so the score's error passes through;
                 * s / cap rounds (u·|s|), tanhf is within 2 ulp of a value below 1, and the
                 * product with cap rounds once more (3u·cap) */
                es[n] += U32 * fabs(s[n]) + 3 * U32 * cap;
                s[n] = cap * tanh(s[n] / cap);
            }
            pos[n++] = p;
        }
    double mx = -INFINITY, emax = 0, dmax = 0, sum = 0;
    for (int t = 0; t < n; t++)
        mx = fmax(mx, s[t]), emax = fmax(emax, es[t]);
    for (int t = 0; t < n; t++)
        dmax = fmax(dmax, mx - s[t]), sum += exp(s[t] - mx);
    double E = 2 * emax + U32 * dmax;
    b->eps_p = expm1(2 * E) + 16 * U32 + kvp_test_gamma(n + 2);
    for (int d = 0; d < HD; d++) {
        double pv = 0, pdv = 0;
        for (int t = 0; t < n; t++) {
            double pt = exp(s[t] - mx) / sum;
            pv += pt * fabs(v[t][d]), pdv += pt * dv[t][d];
        }
        b->out[d] = (b->eps_p + kvp_test_gamma(n + 1)) * pv + (1 + b->eps_p) * pdv;
    }
    (void)pos;
}

/* Both roads against float64 within attn_bound; with cap > 0 the scores are soft-capped
 * (kvcache.h, score_cap) and the reference caps them too. Returns the largest difference of a
 * probability between the capped and the uncapped float64 softmax over its bound (how far a
 * kernel that forgot the cap would be outside it). */
static double matches_float64_cap(double cap)
{
    struct fixture f;
    fixture_init(&f);
    struct kvp_kvcache *c = &f.c;
    c->score_cap = (float)cap;
    double missed = 0;
    struct kvp_sel sel = f.sel;
    struct blocks_buf b;
    blocks_init(&b, 0);
    float q[G * HD], out[G * HD], probs[G * CTX], scratch[G * CTX];
    for (int h = 0; h < NKV; h++) {
        for (int i = 0; i < G * HD; i++)
            q[i] = urand();
        kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, &sel, probs, CTX, &b.ab, out);
        for (int j = 0; j < G; j++) {
            double s[5 * BS], mx = -INFINITY, sum = 0, o[HD] = {0};
            struct attn_bound bd;
            attn_bound(c, NULL, h, q + j * HD, &sel, &bd);
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
                    if (cap > 0 && dot != -INFINITY)
                        dot = cap * tanh(dot / cap);
                    s[i * BS + t] = dot;
                    mx = dot > mx ? dot : mx;
                }
            for (int i = 0; i < sel.n * BS; i++)
                sum += s[i] == -INFINITY ? 0 : exp(s[i] - mx);
            for (int i = 0; i < sel.n; i++)
                for (int t = 0; t < BS; t++) {
                    double p = s[i * BS + t] == -INFINITY ? 0 : exp(s[i * BS + t] - mx) / sum;
                    assert_true(fabs(p - probs[j * CTX + i * BS + t]) <= bd.eps_p * p);
                    const uint8_t *vb = kvp_kvcache_vblock(c, 0, h, sel.blocks[i]);
                    for (int d = 0; d < HD && p > 0; d++)
                        o[d] += p * kvp_kv_value_at(c->type_v, vb, HD, BS, t, d);
                }
            for (int d = 0; d < HD; d++)
                assert_true(fabs(o[d] - out[j * HD + d]) <= bd.out[d]);
        }
    }
    /* the dense road on head 0 (which lost no token): every token up to NKEYS */
    kvp_attn_dense_group(c, 0, 0, q, G, NKEYS, probs, CTX, NULL);
    kvp_attn_dense_group(c, 0, 0, q, G, NKEYS, scratch, CTX, out);
    for (int j = 0; j < G; j++) {
        struct attn_bound bd;
        attn_bound(c, NULL, 0, q + j * HD, NULL, &bd);
        double s[NKEYS], raw[NKEYS], mx = -INFINITY, sum = 0, o[HD] = {0};
        double rmx = -INFINITY, rsum = 0;
        for (int t = 0; t < NKEYS; t++) {
            s[t] = 0;
            for (int d = 0; d < HD; d++)
                s[t] += (double)q[j * HD + d] * kvp_kvcache_key_at(c, 0, 0, t, d);
            s[t] /= sqrt((double)HD);
            raw[t] = s[t];
            if (cap > 0)
                s[t] = cap * tanh(s[t] / cap);
            mx = fmax(mx, s[t]);
            rmx = fmax(rmx, raw[t]);
        }
        for (int t = 0; t < NKEYS; t++)
            sum += exp(s[t] - mx), rsum += exp(raw[t] - rmx);
        for (int t = 0; t < NKEYS; t++) {
            double p = exp(s[t] - mx) / sum;
            assert_true(fabs(p - probs[j * CTX + t]) <= bd.eps_p * p);
            missed = fmax(missed, fabs(exp(raw[t] - rmx) / rsum - p) / (bd.eps_p * p));
            for (int d = 0; d < HD; d++)
                o[d] += p * kvp_kv_value_at(c->type_v, kvp_kvcache_vblock(c, 0, 0, t / BS), HD,
                                            BS, t % BS, d);
        }
        for (int d = 0; d < HD; d++)
            assert_true(fabs(o[d] - out[j * HD + d]) <= bd.out[d]);
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
    return missed;
}

static void test_matches_float64(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        matches_float64_cap(0);
    }
}

/* Gemma 2's soft-capped scores (score_cap 1, below the fixture's largest scores so that it
 * binds): both roads, block by block and dense, cap before the softmax, within the bound; the
 * uncapped softmax is far outside that bound, so a road that forgot the cap fails. */
static void test_softcap(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        double missed = matches_float64_cap(1.0);
        print_message("%s: the uncapped softmax is %.3g of the bound away\n",
                      kvp_kv_type_name(cur_type), missed);
        assert_true(missed > 100);
    }
    cur_type = KVP_KV_F32;
}

/* A sliding-window layer's attention (kvp_attn_window_group) over its ring: one layer with a
 * window of WIN positions (not a multiple of the block size, so the window mostly starts inside
 * a block), filled one token at a time as decode does, the ring wrapping every few blocks; after
 * every token, each KV head's query group against the keys [pos - WIN + 1, pos] only, within
 * attn_bound of a float64 evaluation of exactly those keys (a selection of the window's blocks
 * masked to the window), soft-capped and not. A window one key too wide or too narrow, or the
 * first block's keys below the window weighed in, is far outside the bound. */
static void window_ring_matches(double cap)
{
    enum { WIN = 37 };
    const int window[1] = {WIN};
    struct kvp_kvcache c;
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init_windowed(&c, 1, NKV, HD, BS, CTX, cur_type, cur_type,
                                               window, 1, false, &err),
                     0);
    c.score_cap = (float)cap;
    const int R = kvp_kvcache_ring_blocks(WIN, 1, BS, c.max_blocks);
    assert_true(R < NKEYS / BS / 2); /* the ring wraps at least twice */
    float q[G * HD], out[G * HD], probs[G * CTX];
    int32_t blocks[WIN / BS + 2];
    uint64_t mask[WIN / BS + 2];
    for (int pos = 0; pos < NKEYS; pos++) {
        assert_int_equal(kvp_kvcache_ring_advance(&c, pos + 1, &err), 0);
        for (int h = 0; h < NKV; h++) {
            float k[HD], v[HD];
            for (int d = 0; d < HD; d++) {
                k[d] = 3.0f * urand();
                v[d] = urand();
            }
            kvp_kvcache_store(&c, 0, h, pos, k, v);
        }
        const int k0 = pos - WIN + 1 > 0 ? pos - WIN + 1 : 0, k1 = pos + 1;
        /* the window as a selection: its blocks, masked to [k0, k1) */
        struct kvp_sel sel = {.blocks = blocks, .mask = mask};
        for (int b = k0 / BS; b * BS < k1; b++) {
            uint64_t m = 0;
            for (int t = 0; t < BS; t++)
                m |= (uint64_t)(b * BS + t >= k0 && b * BS + t < k1) << t;
            blocks[sel.n] = b;
            mask[sel.n++] = m;
        }
        const int stride = kvp_attn_window_stride(k0, k1, BS);
        assert_true(stride <= CTX);
        for (int h = 0; h < NKV; h++) {
            for (int i = 0; i < G * HD; i++)
                q[i] = urand();
            kvp_attn_window_group(&c, 0, h, q, G, k0, k1, 1.0f / sqrtf((float)HD), probs, stride,
                                  out);
            for (int j = 0; j < G; j++) {
                struct attn_bound bd;
                attn_bound(&c, NULL, h, q + j * HD, &sel, &bd);
                double sc[WIN], mx = -INFINITY, sum = 0, o[HD] = {0};
                for (int t = k0; t < k1; t++) {
                    double dot = 0;
                    for (int d = 0; d < HD; d++)
                        dot += (double)q[j * HD + d] * kvp_kvcache_key_at(&c, 0, h, t, d);
                    dot /= sqrt((double)HD);
                    if (cap > 0)
                        dot = cap * tanh(dot / cap);
                    sc[t - k0] = dot;
                    mx = fmax(mx, dot);
                }
                for (int t = k0; t < k1; t++)
                    sum += exp(sc[t - k0] - mx);
                for (int t = k0; t < k1; t++) {
                    const double pt = exp(sc[t - k0] - mx) / sum;
                    const uint8_t *vb = kvp_kvcache_vblock(&c, 0, h, t / BS);
                    for (int d = 0; d < HD; d++)
                        o[d] += pt * kvp_kv_value_at(c.type_v, vb, HD, BS, t % BS, d);
                }
                for (int d = 0; d < HD; d++)
                    assert_true(fabs(o[d] - out[j * HD + d]) <= bd.out[d]);
            }
        }
    }
    /* the ring held no more than its blocks: the first ones were released long ago */
    assert_null(kvp_kvcache_kblock(&c, 0, 0, 0));
    kvp_kvcache_free(&c);
}

static void test_window_ring(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        window_ring_matches(0);
        window_ring_matches(1.0);
    }
    cur_type = KVP_KV_F32;
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

/* The parts pass (blocks reduced in ranges, as threads of a pool do, then folded) gives the
 * single call's bits: every cut of the selection into two ranges, the later range reduced
 * first, alone and after an early pass over a subset of the blocks; a selection longer than
 * the room for it is refused. */
static void parts_same_bits(void)
{
    struct fixture f;
    fixture_init(&f);
    struct kvp_kvcache *c = &f.c;
    const struct kvp_sel sel = f.sel;
    struct blocks_buf plain, parts;
    blocks_init(&plain, 0);
    blocks_init(&parts, sel.n);
    float *pf = calloc((size_t)sel.n * G * (HD + 1), sizeof(float));
    assert_non_null(pf);
    parts.ab.po = pf;
    parts.ab.pl = pf + (size_t)sel.n * G * HD;
    parts.ab.pcap = sel.n;
    float q[G * HD], out0[G * HD], out1[G * HD], p0[G * CTX], p1[G * CTX];
    for (int i = 0; i < G * HD; i++)
        q[i] = 2.0f * urand();
    int tried = 0;
    for (int h = 0; h < NKV; h++) {
        kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, &sel, p0, CTX, &plain.ab, out0);
        for (int set = 0; set < 4; set++) /* no early pass, then blocks {0}, {1, 3}, {4} hot */
            for (int cut = 0; cut <= sel.n; cut++) {
                static const unsigned hot[4] = {0, 1, 0xA, 0x10};
                uint8_t pending[CTX / BS];
                memset(pending, 1, sizeof(pending));
                for (int i = 0; i < sel.n; i++)
                    pending[sel.blocks[i]] = !((hot[set] >> i) & 1);
                memset(p1, 0xff, sizeof(p1)); /* NaN: every probability must be written */
                assert_true(kvp_attn_sparse_parts_fit(c, 0, h, NKEYS, &sel, &parts.ab));
                if (set)
                    kvp_attn_sparse_early(c, 0, h, q, G, NKEYS, &sel, pending, p1, CTX, &parts.ab);
                kvp_attn_sparse_part(c, 0, h, q, G, NKEYS, &sel, cut, sel.n, p1, CTX, &parts.ab);
                kvp_attn_sparse_part(c, 0, h, q, G, NKEYS, &sel, 0, cut, p1, CTX, &parts.ab);
                parts.ab.parts = true;
                kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, &sel, p1, CTX, &parts.ab, out1);
                assert_false(parts.ab.parts);
                assert_int_equal(parts.ab.n, 0);
                assert_memory_equal(out0, out1, sizeof(out0));
                for (int j = 0; j < G; j++)
                    assert_memory_equal(p0 + j * CTX, p1 + j * CTX, sel.n * BS * sizeof(float));
                tried++;
            }
    }
    assert_int_equal(tried, NKV * 4 * (sel.n + 1));
    parts.ab.pcap = sel.n - 1;
    assert_false(kvp_attn_sparse_parts_fit(c, 0, 0, NKEYS, &sel, &parts.ab));
    free(pf);
    blocks_free(&parts);
    blocks_free(&plain);
    kvp_kvcache_free(c);
}

/* The blocks' largest probabilities the fold leaves with block_max: to the bit the largest of
 * the normalised probabilities of each selected block (0 where nothing was read: the fixture's
 * evicted and masked tokens, and an all-masked block), whether the token probabilities are
 * normalised beside them or skipped, with the output unchanged; and on the dense road (a
 * selection of everything) the same from its probabilities. */
static void block_max_is_probs_max(void)
{
    struct fixture f;
    fixture_init(&f);
    struct kvp_kvcache *c = &f.c;
    struct kvp_sel sel = f.sel;
    sel.mask[1] = 0; /* nothing of block 2 read */
    const int nb = (NKEYS + BS - 1) / BS;
    int32_t every[CTX / BS];
    uint64_t whole[CTX / BS];
    for (int i = 0; i < nb; i++)
        every[i] = i, whole[i] = ~0ULL;
    const struct kvp_sel all = {.n = nb, .blocks = every, .mask = whole};
    struct blocks_buf plain, bm;
    blocks_init(&plain, 0);
    blocks_init(&bm, 0);
    static float q[G * HD], out0[G * HD], out1[G * HD], p0[G * CTX], p1[G * CTX];
    for (int i = 0; i < G * HD; i++)
        q[i] = 2.0f * urand();
    for (int h = 0; h < NKV; h++)
        for (int road = 0; road < 2; road++) {
            const struct kvp_sel *sl = road ? &all : &sel;
            kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, sl, p0, CTX, &plain.ab, out0);
            for (int skip = 0; skip < 2; skip++) {
                bm.ab.block_max = true;
                bm.ab.skip_probs = skip;
                memset(bm.f, 0xff, (size_t)G * bm.ab.bmax_stride * sizeof(float));
                kvp_attn_sparse_group(c, 0, h, q, G, NKEYS, sl, p1, CTX, &bm.ab, out1);
                assert_memory_equal(out0, out1, sizeof(out0));
                for (int j = 0; j < G; j++)
                    for (int i = 0; i < sl->n; i++) {
                        float m = 0.0f;
                        for (int t = 0; t < BS; t++)
                            m = p0[j * CTX + i * BS + t] > m ? p0[j * CTX + i * BS + t] : m;
                        const float got = bm.f[(size_t)j * bm.ab.bmax_stride + i];
                        if (memcmp(&m, &got, sizeof(m)) != 0)
                            print_message("head %d road %d skip %d block %d: %a, probs %a\n", j,
                                          road, skip, i, got, m);
                        assert_memory_equal(&m, &got, sizeof(m));
                        if (!road && i == 1)
                            assert_true(got == 0.0f);
                        if (!road && i != 1 && h == 0)
                            assert_true(got > 0.0f);
                    }
            }
        }
    blocks_free(&bm);
    blocks_free(&plain);
    kvp_kvcache_free(c);
}

static void test_block_max(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        block_max_is_probs_max();
    }
}

static void test_parts_same_bits(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        parts_same_bits();
    }
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
 * head_dim 12: every dense or sparse attention output within the f32 bound of each (attn_bound)
 * plus what the type's rounding of the stored keys and values moves it (attn_bound with the f32
 * cache as `other`: the rounding itself is the quantizers', tested in test_kernels/test_quant). */
static void test_types_vs_f32(void **state)
{
    (void)state;
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
        double worst = 0, ratio = 0;
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
                for (int j = 0; j < G; j++) {
                    struct attn_bound bt, bf;
                    const struct kvp_sel *sl = dense ? NULL : &f.sel;
                    attn_bound(&f.c, &ref.c, h, q + j * HD, sl, &bt);
                    attn_bound(&ref.c, NULL, h, q + j * HD, sl, &bf);
                    for (int d = 0; d < HD; d++) {
                        double e = fabs(o[j * HD + d] - o_ref[j * HD + d]);
                        worst = fmax(worst, e);
                        ratio = fmax(ratio, e / (bt.out[d] + bf.out[d]));
                        assert_true(e <= bt.out[d] + bf.out[d]);
                    }
                }
            }
        printf("# KV type %s vs f32: largest attention output difference %.2e, %.2f of its "
               "bound\n", kvp_kv_type_name(cur_type), worst, ratio);
        assert_true(worst > 0); /* the type really stores something else */
        kvp_kvcache_free(&ref.c);
        kvp_kvcache_free(&f.c);
    }
    blocks_free(&b);
}

/* The SIMD kernels of each type (tab: kvp_kv_kernels_avx512, _avx2 or _neon) against the scalar
 * ones on one block (bs 16 and a partial 13, head_dim 12 and 72 for partial q8_0 groups and SIMD
 * tails): the stores give the same bytes; scores and value sums agree to float rounding (two f32
 * sums: 2·gamma(terms + 1)·Σ|terms|), or to the bit where the table promises it (exact: NEON
 * keeps the scalar order, see kv_types_neon.c); conversions exactly. Returns 0 when this CPU
 * lacks the instruction set. */
static int simd_vs_scalar(const struct kvp_kv_kernels *(*tab)(int), bool exact)
{
    if (!tab(KVP_KV_F16))
        return 0;
    enum { MAXHD = 72, MAXBS = 16 };
    const int hds[] = {12, 72}, bss[] = {16, 13};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int hi = 0; hi < 2; hi++)
            for (int bi = 0; bi < 2; bi++) {
                int type = all_types[ti], hd = hds[hi], bs = bss[bi];
                const struct kvp_kv_kernels *s = kvp_kv_kernels_scalar(type);
                const struct kvp_kv_kernels *v = tab(type);
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
                /* two f32 evaluations of the same sums: 2·gamma(terms + 1)·Σ|terms| */
                s->scores(q, ks, hd, bs, 0.3f, a);
                v->scores(q, ks, hd, bs, 0.3f, c);
                for (int t = 0; t < bs; t++) {
                    double sa = 0;
                    for (int d = 0; d < hd; d++)
                        sa += 0.3 * fabs(q[d] * kvp_kv_key_at(type, ks, hd, bs, d, t));
                    assert_true(exact ? a[t] == c[t]
                                      : fabsf(a[t] - c[t]) <= 2 * kvp_test_gamma(hd + 1) * sa);
                }
                s->accum(pr, vs, hd, bs, bs - 1, oa);
                v->accum(pr, vs, hd, bs, bs - 1, oc);
                for (int d = 0; d < hd; d++) {
                    double sa = 0;
                    for (int t = 0; t < bs - 1; t++)
                        sa += fabs(pr[t] * kvp_kv_value_at(type, vs, hd, bs, t, d));
                    assert_true(exact ? oa[d] == oc[d]
                                      : fabsf(oa[d] - oc[d]) <= 2 * kvp_test_gamma(bs) * sa);
                }
                s->k_rows(ks, hd, bs, bs - 2, ra, MAXBS);
                v->k_rows(ks, hd, bs, bs - 2, rc, MAXBS);
                for (int d = 0; d < hd; d++)
                    assert_memory_equal(ra + d * MAXBS, rc + d * MAXBS, (bs - 2) * sizeof(float));
                s->v_rows(vs, hd, bs, bs - 3, ra);
                v->v_rows(vs, hd, bs, bs - 3, rc);
                assert_memory_equal(ra, rc, (size_t)(bs - 3) * hd * sizeof(float));
            }
    return 1;
}

static void test_simd_vs_scalar(void **state)
{
    (void)state;
    int avx512 = simd_vs_scalar(kvp_kv_kernels_avx512, false),
        avx2 = simd_vs_scalar(kvp_kv_kernels_avx2, false),
        neon = simd_vs_scalar(kvp_kv_kernels_neon, true);
    printf("# SIMD KV kernels against the scalar ones:%s%s%s\n", avx512 ? " avx512" : "",
           avx2 ? " avx2" : "",
           neon             ? " neon (to the bit)"
           : avx512 || avx2 ? ""
                            : " none here");
}

/* The group kernels (scores_g, accum_g) of the scalar, AVX-512 and AVX2 tables (those this CPU
 * runs) against the scalar per-head kernels, g = 1..8 heads, head_dim 12, 33 (odd: a partial q8_0
 * group and SIMD tails) and 72, bs 16 and 13 (a partial token chunk), 12 of 13 tokens summed: the
 * scalar group kernels give the same bits, the AVX-512 and AVX2 ones agree within two f32 sums'
 * error, 2·gamma(terms + 1)·Σ|terms| (the outputs' old values are one more term); the strided
 * outputs leave their padding alone and the value sums add to what out held.
 */
static void test_group_kernels(void **state)
{
    (void)state;
    enum { MAXHD = 72, MAXBS = 16, MAXG = KVP_KV_GROUP_MAX, SS = MAXBS + 3, OS = MAXHD + 2 };
    const int hds[] = {12, 33, 72}, bss[] = {16, 13};
    int checked = 0;
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int hi = 0; hi < 3; hi++)
            for (int bi = 0; bi < 2; bi++) {
                int type = all_types[ti], hd = hds[hi], bs = bss[bi], n = bs - 1;
                const struct kvp_kv_kernels *ref = kvp_kv_kernels_scalar(type);
                /* the NEON kernels keep the scalar order: exact, like the scalar group kernels */
                const struct kvp_kv_kernels *tabs[4] = {ref, kvp_kv_kernels_avx512(type),
                                                        kvp_kv_kernels_avx2(type),
                                                        kvp_kv_kernels_neon(type)};
                uint8_t kt[8192], vb[8192];
                assert_true(kvp_kv_block_bytes(type, hd, bs) <= sizeof(kt));
                memset(kt, 0, sizeof(kt)), memset(vb, 0, sizeof(vb));
                float x[MAXHD], q[MAXG * MAXHD], p[MAXG * SS], o0[MAXG * OS];
                for (int t = 0; t < bs; t++) {
                    for (int d = 0; d < hd; d++)
                        x[d] = 2.0f * urand();
                    ref->put_k(x, kt, hd, bs, t);
                    ref->put_v(x, vb, hd, bs, t);
                }
                for (int i = 0; i < MAXG * MAXHD; i++)
                    q[i] = urand();
                for (int i = 0; i < MAXG * SS; i++)
                    p[i] = 0.5f * (urand() + 1.0f);
                for (int i = 0; i < MAXG * OS; i++)
                    o0[i] = urand();
                for (int g = 1; g <= MAXG; g++) {
                    /* the per-head scalar results, and the sums of |terms| for the bounds */
                    float rs[MAXG * MAXBS], ro[MAXG * OS];
                    double bs_abs[MAXG * MAXBS], bo_abs[MAXG * MAXHD];
                    memcpy(ro, o0, sizeof(ro));
                    for (int j = 0; j < g; j++) {
                        ref->scores(q + j * hd, kt, hd, bs, 0.3f, rs + j * MAXBS);
                        ref->accum(p + j * SS, vb, hd, bs, n, ro + j * OS);
                        for (int t = 0; t < bs; t++) {
                            bs_abs[j * MAXBS + t] = 0;
                            for (int d = 0; d < hd; d++)
                                bs_abs[j * MAXBS + t] +=
                                    0.3 *
                                    fabs(q[j * hd + d] * kvp_kv_key_at(type, kt, hd, bs, d, t));
                        }
                        for (int d = 0; d < hd; d++) {
                            bo_abs[j * MAXHD + d] = fabs(o0[j * OS + d]);
                            for (int t = 0; t < n; t++)
                                bo_abs[j * MAXHD + d] +=
                                    fabs(p[j * SS + t] * kvp_kv_value_at(type, vb, hd, bs, t, d));
                        }
                    }
                    for (int k = 0; k < 4; k++) {
                        if (!tabs[k])
                            continue;
                        const bool inexact = k == 1 || k == 2;
                        float s[MAXG * SS], o[MAXG * OS];
                        memset(s, 0xff, sizeof(s)); /* NaN where nothing may be written */
                        memcpy(o, o0, sizeof(o));
                        tabs[k]->scores_g(q, g, kt, hd, bs, 0.3f, s, SS);
                        tabs[k]->accum_g(p, SS, g, vb, hd, bs, n, o, OS);
                        for (int j = 0; j < MAXG; j++) {
                            for (int t = 0; t < SS; t++) {
                                float v = s[j * SS + t];
                                if (j >= g || t >= bs) {
                                    assert_true(isnan(v));
                                    continue;
                                }
                                float r = rs[j * MAXBS + t];
                                assert_true(inexact ? fabs(v - r) <= 2 * kvp_test_gamma(hd + 1) *
                                                                         bs_abs[j * MAXBS + t]
                                                    : v == r);
                            }
                            for (int d = 0; d < OS; d++) {
                                float v = o[j * OS + d];
                                if (j >= g || d >= hd) {
                                    assert_true(v == o0[j * OS + d]);
                                    continue;
                                }
                                float r = ro[j * OS + d];
                                assert_true(inexact ? fabs(v - r) <= 2 * kvp_test_gamma(n + 1) *
                                                                         bo_abs[j * MAXHD + d]
                                                    : v == r);
                            }
                        }
                        checked++;
                    }
                }
            }
    printf("# group kernels: %d (table, type, head_dim, bs, g) cases checked (scalar%s%s%s)\n",
           checked, kvp_kv_kernels_avx512(KVP_KV_F16) ? ", avx512" : "",
           kvp_kv_kernels_avx2(KVP_KV_F16) ? ", avx2" : "",
           kvp_kv_kernels_neon(KVP_KV_F16) ? ", neon" : "");
    assert_true(checked >= N_TYPES * 3 * 2 * KVP_KV_GROUP_MAX);
}

/* Attention of a group of 11 query heads (the group kernels in chunks of 8 and 3) against the
 * same heads one at a time (the per-head kernels), dense and sparse (head 1 lost tokens), every
 * type: probabilities and outputs agree within twice the f32 bound of attn_bound (the two are
 * f32 evaluations of the same values). */
static void test_group_vs_single_heads(void **state)
{
    (void)state;
    enum { GQ = 11 };
    struct blocks_buf b;
    blocks_init_g(&b, 0, GQ);
    static float q[GQ * HD], o[GQ * HD], o1[HD], p[GQ * CTX], p1[CTX];
    for (int i = 0; i < GQ * HD; i++)
        q[i] = urand();
    for (int ti = 0; ti < N_TYPES; ti++) {
        cur_type = all_types[ti];
        struct fixture f;
        fixture_init(&f);
        for (int sparse = 0; sparse < 2; sparse++) {
            int h = sparse, n_p = sparse ? f.sel.n * BS : NKEYS;
            if (sparse)
                kvp_attn_sparse_group(&f.c, 0, h, q, GQ, NKEYS, &f.sel, p, CTX, &b.ab, o);
            else
                kvp_attn_dense_group(&f.c, 0, h, q, GQ, NKEYS, p, CTX, o);
            for (int j = 0; j < GQ; j++) {
                if (sparse)
                    kvp_attn_sparse_group(&f.c, 0, h, q + j * HD, 1, NKEYS, &f.sel, p1, CTX, &b.ab,
                                          o1);
                else
                    kvp_attn_dense_group(&f.c, 0, h, q + j * HD, 1, NKEYS, p1, CTX, o1);
                struct attn_bound bd;
                attn_bound(&f.c, NULL, h, q + j * HD, sparse ? &f.sel : NULL, &bd);
                for (int d = 0; d < HD; d++)
                    assert_true(fabsf(o[j * HD + d] - o1[d]) <= 2 * bd.out[d]);
                for (int t = 0; t < n_p; t++)
                    assert_true(fabsf(p[j * CTX + t] - p1[t]) <= 2 * bd.eps_p * fabsf(p1[t]));
            }
        }
        kvp_kvcache_free(&f.c);
    }
    blocks_free(&b);
}

/* A selection of every token (head 0 lost none) is dense attention on the dense road: the same
 * output and normalised probabilities, bit for bit, with or without an early pass, every type;
 * one token masked out, or evicted (head 1), and it is the block road again. */
static void test_everything_is_dense(void **state)
{
    (void)state;
    const int nb = (NKEYS + BS - 1) / BS;
    struct blocks_buf b, early;
    blocks_init(&b, 0);
    blocks_init(&early, 4);
    static float q[G * HD], od[G * HD], os[G * HD], pd[G * CTX], ps[G * CTX], scratch[G * CTX];
    int32_t blocks[CTX / BS];
    uint64_t mask[CTX / BS];
    for (int i = 0; i < nb; i++)
        blocks[i] = i, mask[i] = ~0ULL;
    struct kvp_sel all = {.n = nb, .blocks = blocks, .mask = mask};
    for (int i = 0; i < G * HD; i++)
        q[i] = urand();
    for (int ti = 0; ti < N_TYPES; ti++) {
        cur_type = all_types[ti];
        struct fixture f;
        fixture_init(&f);
        kvp_attn_dense_group(&f.c, 0, 0, q, G, NKEYS, scratch, CTX, od);
        kvp_attn_dense_group(&f.c, 0, 0, q, G, NKEYS, pd, CTX, NULL);
        uint8_t pending[CTX / BS] = {0};
        for (int pass = 0; pass < 2; pass++) {
            memset(ps, 0xff, sizeof(ps));
            if (pass)
                kvp_attn_sparse_early(&f.c, 0, 0, q, G, NKEYS, &all, pending, ps, CTX, &early.ab);
            kvp_attn_sparse_group(&f.c, 0, 0, q, G, NKEYS, &all, ps, CTX,
                                  pass ? &early.ab : &b.ab, os);
            assert_memory_equal(od, os, sizeof(od));
            for (int j = 0; j < G; j++) {
                assert_memory_equal(pd + j * CTX, ps + j * CTX, NKEYS * sizeof(float));
                for (int t = NKEYS; t < nb * BS; t++)
                    assert_true(ps[j * CTX + t] == 0.0f);
            }
        }
        /* not everything: a masked token, or head 1's evicted ones, take the block road */
        mask[3] = ~0ULL << 1;
        kvp_attn_sparse_group(&f.c, 0, 0, q, G, NKEYS, &all, ps, CTX, &b.ab, os);
        assert_true(memcmp(od, os, sizeof(od)) != 0);
        mask[3] = ~0ULL;
        kvp_attn_dense_group(&f.c, 0, 1, q, G, NKEYS, scratch, CTX, od);
        kvp_attn_sparse_group(&f.c, 0, 1, q, G, NKEYS, &all, ps, CTX, &b.ab, os);
        assert_true(memcmp(od, os, sizeof(od)) != 0);
        kvp_kvcache_free(&f.c);
    }
    blocks_free(&b);
    blocks_free(&early);
}

/* Dense attention past one chunk (kv/attention.h): the chunks computed apart, in any order, and
 * folded by kvp_attn_dense_merge give kvp_attn_dense_group's bits (what lets a decode step spread
 * them over threads); a selection of everything gives them too, with its probabilities
 * normalised; and the output is within the block road's bound (attn_bound above: a chunk is a
 * run of blocks folded once, so the road folds fewer times) of a float64 evaluation. Three
 * chunks, the last one short and ending in a partial block. */
enum { LONG_KEYS = 2 * KVP_ATTN_CHUNK_BLOCKS * BS + 1000, LONG_CTX = LONG_KEYS + BS };

static void dense_chunks_one_type(void)
{
    struct kvp_kvcache c;
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init(&c, 1, 1, HD, BS, LONG_CTX, cur_type, cur_type, &err), 0);
    assert_int_equal(kvp_kvcache_reserve(&c, LONG_KEYS, &err), 0);
    for (int p = 0; p < LONG_KEYS; p++) {
        float k[HD], v[HD];
        for (int d = 0; d < HD; d++) {
            k[d] = 3.0f * urand();
            v[d] = urand();
        }
        kvp_kvcache_store(&c, 0, 0, p, k, v);
    }
    const int nc = kvp_attn_dense_chunks(LONG_KEYS, BS), nb = (LONG_KEYS + BS - 1) / BS;
    assert_int_equal(nc, 3);
    static float q[G * HD], out[G * HD], out2[G * HD], probs[G * LONG_CTX], ps[G * LONG_CTX];
    static float st[3 * G * (HD + 2)], bmax[G * LONG_CTX / BS];
    for (int i = 0; i < G * HD; i++)
        q[i] = urand();
    kvp_attn_dense_group(&c, 0, 0, q, G, LONG_KEYS, probs, LONG_CTX, out);
    const size_t sf = kvp_attn_state_floats(G, HD);
    for (int i = nc - 1; i >= 0; i--)
        kvp_attn_dense_chunk(&c, 0, 0, q, G, LONG_KEYS, i, probs, LONG_CTX, st + i * sf);
    kvp_attn_dense_merge(st, nc, G, HD, out2);
    assert_memory_equal(out, out2, sizeof(out));
    /* everything selected: the same output, and normalised probabilities */
    static int32_t blocks[LONG_CTX / BS];
    static uint64_t mask[LONG_CTX / BS];
    for (int i = 0; i < nb; i++)
        blocks[i] = i, mask[i] = ~0ULL;
    struct kvp_sel all = {.n = nb, .blocks = blocks, .mask = mask};
    struct kvp_attn_blocks ab = {.bmax = bmax, .bmax_stride = LONG_CTX / BS};
    kvp_attn_sparse_group(&c, 0, 0, q, G, LONG_KEYS, &all, ps, LONG_CTX, &ab, out2);
    assert_memory_equal(out, out2, sizeof(out));
    for (int j = 0; j < G; j++) {
        /* float64: scores, their bound (attn_bound's terms), probabilities, output */
        static double s[LONG_KEYS];
        double mx = -INFINITY, emax = 0, dmax = 0, sum = 0, o[HD] = {0}, pv[HD] = {0};
        const double scale = 1 / sqrt((double)HD);
        for (int t = 0; t < LONG_KEYS; t++) {
            double dot = 0, a = 0;
            for (int d = 0; d < HD; d++) {
                double k = kvp_kvcache_key_at(&c, 0, 0, t, d);
                dot += q[j * HD + d] * k, a += fabs(q[j * HD + d] * k);
            }
            s[t] = dot * scale;
            emax = fmax(emax, kvp_test_gamma(HD + 1) * scale * a);
            mx = fmax(mx, s[t]);
        }
        for (int t = 0; t < LONG_KEYS; t++)
            dmax = fmax(dmax, mx - s[t]), sum += exp(s[t] - mx);
        const double eps_p = expm1(2 * (2 * emax + U32 * dmax)) + 16 * U32 +
                             kvp_test_gamma(LONG_KEYS + 2);
        for (int t = 0; t < LONG_KEYS; t++) {
            double p = exp(s[t] - mx) / sum;
            assert_true(fabs(p - ps[j * LONG_CTX + t]) <= eps_p * p);
            const uint8_t *vb = kvp_kvcache_vblock(&c, 0, 0, t / BS);
            for (int d = 0; d < HD; d++) {
                double v = kvp_kv_value_at(c.type_v, vb, HD, BS, t % BS, d);
                o[d] += p * v, pv[d] += p * fabs(v);
            }
        }
        for (int d = 0; d < HD; d++)
            assert_true(fabs(o[d] - out[j * HD + d]) <= (eps_p + kvp_test_gamma(LONG_KEYS + 1)) * pv[d]);
    }
    kvp_kvcache_free(&c);
}

static void test_dense_chunks(void **state)
{
    (void)state;
    for (int i = 0; i < N_TYPES; i++) {
        cur_type = all_types[i];
        dense_chunks_one_type();
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_float64), cmocka_unit_test(test_early_blocks_same_bits),
        cmocka_unit_test(test_parts_same_bits), cmocka_unit_test(test_block_max),
        cmocka_unit_test(test_types_vs_f32),    cmocka_unit_test(test_simd_vs_scalar),
        cmocka_unit_test(test_group_kernels),   cmocka_unit_test(test_group_vs_single_heads),
        cmocka_unit_test(test_everything_is_dense),
        cmocka_unit_test(test_dense_chunks),    cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_window_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
