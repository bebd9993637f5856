/*
 * The tiered KV store: resident-set bookkeeping (hits, misses, LRU eviction, overflow into the
 * staging area), O_DIRECT alignment of every disk request, on-demand fetch of mispredicted
 * blocks, logits of tiered runs equal to the untiered run (RAM and disk, every prefetch mode,
 * with prefill in several micro-batches, truncation and a chunk after decoding), the link
 * model's delay, the timeline PNG, and the faults: an unwritable directory, a full disk
 * (RLIMIT_FSIZE in a child), injected failed and short requests (issued again; given up on), no
 * file left behind.
 *
 * The sparse policy here is a test double installed behind the `full` policy's back: it reads
 * block 0, the newest block and a pseudo-random quarter of the rest, different for every step,
 * layer and KV head; its predict_next is exact, or deliberately wrong. Quest's own predict_next
 * (the last query, a prefetch margin) is tested for the same equality of logits in every tier and
 * mode, and for predicting a superset of its selection with the same query.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "forward/context.h"
#include "kv/kvcache.h"
#include "kvpred.h"
#include "kvpred_lab.h"
#include "store/store.h"
#include "testutil.h"

/* the disk tier's reads submitted by syscall: no polling kernel thread competing for the
 * test's cores */
static const struct kvp_disk_ring_params by_syscall = {.syscall_submit = true};

#define VOCAB 80

/* ==================================== test policy ========================================= */

static int predict_salt; /* 0: predict_next is exact; otherwise it predicts other blocks */
static int null_reads;   /* blocks select found without storage (read like a calibration) */

static bool picked(int layer, int kvh, int n_tokens, int b, int salt)
{
    uint64_t x = (uint64_t)(layer * 131 + kvh * 17 + salt) * 0x9e3779b97f4a7c15ULL ^
                 (uint64_t)n_tokens * 0xbf58476d1ce4e5b9ULL ^ (uint64_t)b * 0x94d049bb133111ebULL;
    x ^= x >> 31;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 29;
    return x % 4 == 0;
}

static void fill_sel(int layer, int kvh, int n_tokens, int bs, int salt, struct kvp_sel *sel)
{
    int nb = (n_tokens + bs - 1) / bs;
    sel->n = 0;
    for (int b = 0; b < nb; b++)
        if (b == 0 || b == nb - 1 || picked(layer, kvh, n_tokens, b, salt)) {
            sel->blocks[sel->n] = b;
            sel->mask[sel->n++] = ~0ULL;
        }
}

static void test_select(struct kvp_policy *p, int layer, int kvh, const float *q, int n_tokens,
                        struct kvp_sel *sel)
{
    (void)q;
    /* like a predictor calibration step: read every key of the layer in select */
    for (int b = 0; b * p->env.block_size < n_tokens; b++)
        if (!kvp_kvcache_kblock(p->env.kv, layer, kvh, b))
            __atomic_add_fetch(&null_reads, 1, __ATOMIC_RELAXED);
    fill_sel(layer, kvh, n_tokens, p->env.block_size, 0, sel);
}

static void test_predict(struct kvp_policy *p, int layer, int kvh, int n_tokens_next,
                         struct kvp_sel *sel)
{
    fill_sel(layer, kvh, n_tokens_next, p->env.block_size, predict_salt, sel);
}

static const struct kvp_policy_ops test_ops = {
    .name = "test-sparse",
    .select = test_select,
    .predict_next = test_predict,
};

/* ====================================== fixtures ========================================== */

static char *model_path;
static kvp_model *model;

static int setup(void **state)
{
    (void)state;
    struct kvp_test_model_spec sp = KVP_TEST_FIXTURE_SPEC(VOCAB, 23);
    model = kvp_test_model(&sp, &model_path);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvp_test_model_free(model, model_path);
    return 0;
}

static int dir_entries(const char *path)
{
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return n;
}

struct run_cfg {
    int tier, prefetch, hot_budget;
    bool sparse;
    const char *quest_opts; /* run quest with these options instead of the test double */
    const char *dir;
    double link_gbps, link_us;
    bool syscall_submit;
    int sq_bypass; /* enum kvp_sq_bypass */
};

#define N_ROWS 71 /* logits rows of run_sequence */

static int seq_type;              /* KV type of run_sequence's contexts (0: the default, f16) */
static int bare_type = KVP_KV_F32; /* KV type of the bare stores */

/* Prefill 100 tokens in micro-batches of 64, decode 40, truncate to 110, decode 20, evaluate a
 * 5-token chunk, decode 10. Returns the logits rows; stats of the whole run when asked. */
static float *run_sequence(const struct run_cfg *rc, struct kvp_store_stats *stats)
{
    struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 2, .n_batch = 64,
                                .kv_tier = rc->tier, .kv_dir = rc->dir,
                                .hot_budget = rc->hot_budget, .prefetch = rc->prefetch,
                                .link_gbps = rc->link_gbps, .link_latency_us = rc->link_us,
                                .kv_ring = rc->syscall_submit ? &by_syscall : NULL,
                                .type_k = seq_type, .type_v = seq_type};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    int rc0 = kvp_ctx_init(model, &cp, &c, &err);
    if (rc0 < 0)
        print_message("ctx: %s\n", err.msg);
    assert_int_equal(rc0, 0);
    if (rc->sq_bypass)
        kvp_store_force_sq_bypass(kvp_ctx_store(c), rc->sq_bypass);
    if (rc->quest_opts) {
        struct kvp_policy_params pp = {.name = "quest", .budget = 64, .dense_layers = 1,
                                       .opts = rc->quest_opts};
        assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), 0);
    } else if (rc->sparse) {
        struct kvp_policy_params pp = {.name = "full", .budget = 64, .dense_layers = 1};
        assert_int_equal(kvp_ctx_set_policy_ops(c, &test_ops, &pp, &err), 0);
    }
    int32_t ids[256];
    for (int i = 0; i < 256; i++)
        ids[i] = (i * 7 + 3) % VOCAB;
    float *lg = calloc((size_t)N_ROWS * VOCAB, sizeof(float));
    int row = 0;
    assert_int_equal(kvp_eval(c, ids, 100, NULL, false, &err), 0);
    for (int i = 0; i < 40; i++)
        assert_int_equal(kvp_eval(c, ids + 100 + i, 1, lg + (size_t)row++ * VOCAB, false, &err), 0);
    kvp_ctx_truncate(c, 110);
    for (int i = 0; i < 20; i++)
        assert_int_equal(kvp_eval(c, ids + 150 + i, 1, lg + (size_t)row++ * VOCAB, false, &err), 0);
    assert_int_equal(kvp_eval(c, ids + 200, 5, lg + (size_t)row++ * VOCAB, false, &err), 0);
    for (int i = 0; i < 10; i++) {
        int r = kvp_eval(c, ids + 210 + i, 1, lg + (size_t)row++ * VOCAB, false, &err);
        if (r < 0)
            print_message("eval: %s\n", err.msg);
        assert_int_equal(r, 0);
    }
    assert_int_equal(row, N_ROWS);
    if (stats)
        assert_int_equal(kvp_ctx_store_stats(c, stats), 0);
    kvp_ctx_free(c);
    return lg;
}

/* ================================ bookkeeping (store alone) ================================ */

/* A store over a bare external cache: 2 layers, 2 KV heads, head_dim hd, bs 16, 256 tokens. */
struct bare {
    struct kvp_kvcache kv;
    struct kvp_store *s;
};

/* The store's counters now (a copy). */
static struct kvp_store_stats stats_of(const struct kvp_store *s)
{
    struct kvp_store_stats st;
    kvp_store_get_stats(s, &st);
    return st;
}

static void bare_init(struct bare *b, int tier, const char *dir, int hd, int hot_blocks)
{
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init_external(&b->kv, 2, 2, hd, 16, 256, bare_type, bare_type,
                                               &err),
                     0);
    struct kvp_ctx_params p = {.kv_tier = tier, .kv_dir = dir, .prefetch = KVP_PREFETCH_NONE};
    int rc = kvp_store_init(&p, &b->kv, 2, 2, hd, 16, b->kv.max_blocks, &b->s, &err);
    if (rc < 0)
        print_message("store: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(kvp_store_configure(b->s, 0, hot_blocks, &err), 0);
}

static void bare_free(struct bare *b)
{
    kvp_store_free(b->s);
    kvp_kvcache_free(&b->kv);
}

static float val(int layer, int h, int pos, int d, int kind)
{
    return (float)(layer * 1000 + h * 100 + kind * 50) + (float)pos * 0.25f + (float)d * 0.001f;
}

/* Prefill n tokens of known values through the staging protocol. */
static void bare_prefill(struct bare *b, int n)
{
    int hd = b->kv.head_dim;
    float k[64], v[64];
    for (int l = 0; l < 2; l++) {
        kvp_store_prefill_begin(b->s, l, 0, n);
        for (int pos = 0; pos < n; pos++)
            for (int h = 0; h < 2; h++) {
                for (int d = 0; d < hd; d++) {
                    k[d] = val(l, h, pos, d, 0);
                    v[d] = val(l, h, pos, d, 1);
                }
                kvp_kvcache_store(&b->kv, l, h, pos, k, v);
            }
        kvp_store_prefill_end(b->s, l, 0, n, NULL, 0);
    }
}

/* True when block blk of (layer, every head) is readable and holds the known values (as the
 * cache's types store them: each token put alone into a block of its own and read back). */
static bool block_ok(struct bare *b, int layer, int blk, int n_tokens)
{
    const struct kvp_kvcache *kv = &b->kv;
    int hd = kv->head_dim, bs = 16;
    for (int h = 0; h < 2; h++) {
        const uint8_t *kt = kvp_kvcache_kblock(kv, layer, h, blk);
        const uint8_t *vb = kvp_kvcache_vblock(kv, layer, h, blk);
        if (!kt || !vb)
            return false;
        for (int t = 0; t < bs && blk * bs + t < n_tokens; t++) {
            uint8_t kref[4096] = {0}, vref[4096] = {0};
            float k[64], v[64];
            for (int d = 0; d < hd; d++) {
                k[d] = val(layer, h, blk * bs + t, d, 0);
                v[d] = val(layer, h, blk * bs + t, d, 1);
            }
            kv->kk->put_k(k, kref, hd, bs, 0);
            kv->vk->put_v(v, vref, hd, bs, 0);
            for (int d = 0; d < hd; d++)
                if (kvp_kv_key_at(kv->type_k, kt, hd, bs, d, t) !=
                        kvp_kv_key_at(kv->type_k, kref, hd, bs, d, 0) ||
                    kvp_kv_value_at(kv->type_v, vb, hd, bs, t, d) !=
                        kvp_kv_value_at(kv->type_v, vref, hd, bs, 0, d))
                    return false;
        }
    }
    return true;
}

/* sels for both heads: head 0 reads a[0..na), head 1 reads c[0..nc). */
struct two_sels {
    int32_t blocks[2][16];
    uint64_t mask[2][16];
    struct kvp_sel sel[2];
};

static struct kvp_sel *sels_of(struct two_sels *t, const int *a, int na, const int *c, int nc)
{
    for (int h = 0; h < 2; h++) {
        t->sel[h].blocks = t->blocks[h];
        t->sel[h].mask = t->mask[h];
        t->sel[h].n = h == 0 ? na : nc;
        for (int i = 0; i < t->sel[h].n; i++) {
            t->blocks[h][i] = h == 0 ? a[i] : c[i];
            t->mask[h][i] = ~0ULL;
        }
    }
    return t->sel;
}

static void check_bookkeeping(int tier, const char *dir)
{
    struct bare b;
    bare_init(&b, tier, dir, 16, 4); /* 4 slots per layer, unit = 2 heads x 2 KiB */
    struct kvp_store_layout lay;
    kvp_store_get_layout(b.s, &lay);
    assert_int_equal(lay.unit_bytes, 4096);
    assert_int_equal(lay.ppu, 2);
    bare_prefill(&b, 100); /* blocks 0..6, block 6 partial */
    kvp_store_reset_stats(b.s);
    /* after prefill only the newest block is hot */
    assert_non_null(kvp_kvcache_kblock(&b.kv, 0, 0, 6));
    assert_null(kvp_kvcache_kblock(&b.kv, 0, 0, 0));

    kvp_store_step_begin(b.s, 100);
    struct two_sels t;
    int a[] = {0, 1}, c[] = {1, 2};
    kvp_store_acquire(b.s, 0, sels_of(&t, a, 2, c, 2), 101);
    assert_int_equal(stats_of(b.s).misses, 3); /* 0, 1, 2; the newest 6 is a hit */
    assert_int_equal(stats_of(b.s).hits, 1);
    for (int blk = 0; blk < 3; blk++)
        assert_true(block_ok(&b, 0, blk, 100));
    kvp_store_acquire(b.s, 0, sels_of(&t, a, 2, c, 2), 101);
    assert_int_equal(stats_of(b.s).misses, 3);
    assert_int_equal(stats_of(b.s).hits, 5);
    /* touch 0 and 2 so that 1 is the least recently used, then need 3: 1 goes */
    int a2[] = {0}, c2[] = {2};
    kvp_store_acquire(b.s, 0, sels_of(&t, a2, 1, c2, 1), 101);
    int a3[] = {3};
    kvp_store_acquire(b.s, 0, sels_of(&t, a3, 1, a3, 1), 101);
    assert_int_equal(stats_of(b.s).misses, 4);
    assert_null(kvp_kvcache_kblock(&b.kv, 0, 1, 1));
    assert_true(block_ok(&b, 0, 0, 100) && block_ok(&b, 0, 2, 100) && block_ok(&b, 0, 3, 100));
    assert_true(block_ok(&b, 0, 6, 100));
    /* the other layer is untouched */
    assert_null(kvp_kvcache_kblock(&b.kv, 1, 0, 0));

    /* prefetch, then the acquire of the same blocks hits */
    int p[] = {4, 5};
    kvp_store_prefetch(b.s, 1, sels_of(&t, p, 2, p, 2), 101);
    assert_int_equal(stats_of(b.s).prefetched, 2);
    uint64_t miss0 = stats_of(b.s).misses, hit0 = stats_of(b.s).hits;
    kvp_store_acquire(b.s, 1, sels_of(&t, p, 2, p, 2), 101);
    assert_int_equal(stats_of(b.s).misses, miss0);
    assert_int_equal(stats_of(b.s).hits, hit0 + 3); /* 4, 5 and the newest */
    assert_true(block_ok(&b, 1, 4, 100) && block_ok(&b, 1, 5, 100));

    /* more than the hot tier holds: the excess goes through the staging area, still correct */
    int big[] = {0, 1, 2, 3, 4, 5};
    kvp_store_acquire(b.s, 0, sels_of(&t, big, 6, big, 6), 101);
    assert_true(stats_of(b.s).overflow > 0);
    for (int blk = 0; blk < 7; blk++)
        assert_true(block_ok(&b, 0, blk, 100));
    kvp_store_step_end(b.s);
    assert_int_equal(stats_of(b.s).steps, 1);
    assert_int_equal(stats_of(b.s).writes, 0); /* the newest block is not full: nothing written */
    if (tier == KVP_TIER_DISK) {
        assert_int_equal(stats_of(b.s).misaligned, 0);
        assert_true(stats_of(b.s).reads > 0);
    }
    assert_int_equal(kvp_store_take_error(b.s, NULL), 0);
    bare_free(&b);
}

/* Decode one token at pos with known values, selecting sel (NULL: the newest block only). */
static void bare_decode(struct bare *b, int pos, const int *sel, int n_sel)
{
    int hd = b->kv.head_dim;
    float k[64], v[64];
    struct two_sels t;
    int newest[] = {pos / 16};
    kvp_store_step_begin(b->s, pos);
    for (int l = 0; l < 2; l++) {
        for (int h = 0; h < 2; h++) {
            for (int d = 0; d < hd; d++) {
                k[d] = val(l, h, pos, d, 0);
                v[d] = val(l, h, pos, d, 1);
            }
            kvp_kvcache_store(&b->kv, l, h, pos, k, v);
        }
        struct kvp_sel *sels = sel ? sels_of(&t, sel, n_sel, sel, n_sel)
                                   : sels_of(&t, newest, 1, newest, 1);
        kvp_store_acquire(b->s, l, sels, pos + 1);
    }
    kvp_store_step_end(b->s);
}

/* Write-through happens once per block, at the step that fills it, and the cold copy it leaves
 * is what a later miss reads back: decode block 6 full (tokens 100..111), then make it the
 * least recently used block of a 4-slot layer, evict it and read it again. */
static void check_write_on_full(int tier, const char *dir)
{
    struct bare b;
    bare_init(&b, tier, dir, 16, 4);
    bare_prefill(&b, 100);
    kvp_store_reset_stats(b.s);
    for (int pos = 100; pos < 111; pos++)
        bare_decode(&b, pos, NULL, 0);
    assert_int_equal(stats_of(b.s).writes, 0);
    bare_decode(&b, 111, NULL, 0); /* fills block 6 */
    assert_int_equal(stats_of(b.s).writes, 2);  /* one unit per layer */
    int evict[] = {0, 1, 2, 7};
    bare_decode(&b, 112, evict, 4);
    assert_null(kvp_kvcache_kblock(&b.kv, 0, 0, 6));
    uint64_t miss0 = stats_of(b.s).misses;
    int again[] = {6, 7};
    bare_decode(&b, 113, again, 2);
    /* block 6 of both layers, from the cold tier */
    assert_int_equal(stats_of(b.s).misses, miss0 + 2);
    for (int l = 0; l < 2; l++)
        assert_true(block_ok(&b, l, 6, 112));
    assert_int_equal(stats_of(b.s).writes, 2);
    assert_int_equal(kvp_store_take_error(b.s, NULL), 0);
    bare_free(&b);
}

static void test_write_on_full(void **state)
{
    (void)state;
    check_write_on_full(KVP_TIER_RAM, NULL);
    char *d = kvp_test_tmpdir();
    check_write_on_full(KVP_TIER_DISK, d);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

static void test_bookkeeping_ram(void **state)
{
    (void)state;
    check_bookkeeping(KVP_TIER_RAM, NULL);
}

static void test_bookkeeping_disk(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    check_bookkeeping(KVP_TIER_DISK, d);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* A KV head's misses read early (acquire_head, disk tier) are misses once, invisible to the
 * cache until acquire_begin, and then hold the right data; on the RAM tier it does nothing. */
static void check_acquire_head(int tier, const char *dir)
{
    struct bare b;
    bare_init(&b, tier, dir, 16, 4);
    bare_prefill(&b, 100);
    kvp_store_reset_stats(b.s);
    kvp_store_step_begin(b.s, 100);
    struct two_sels t;
    int a[] = {0, 1}, c[] = {1, 2};
    struct kvp_sel *sels = sels_of(&t, a, 2, c, 2);
    kvp_store_acquire_head(b.s, 0, &sels[0], 101);
    assert_int_equal(stats_of(b.s).misses, tier == KVP_TIER_DISK ? 2 : 0);
    assert_null(kvp_kvcache_kblock(&b.kv, 0, 0, 0)); /* hidden until acquire_begin */
    assert_null(kvp_kvcache_kblock(&b.kv, 0, 0, 1));
    kvp_store_acquire(b.s, 0, sels, 101);
    assert_int_equal(stats_of(b.s).misses, 3); /* 0, 1, 2, each once */
    assert_int_equal(stats_of(b.s).hits, 1);   /* the newest block */
    assert_int_equal(stats_of(b.s).late, 0);
    for (int blk = 0; blk < 3; blk++)
        assert_true(block_ok(&b, 0, blk, 100));
    for (int blk = 0; blk < b.kv.max_blocks; blk++)
        assert_int_equal(kvp_store_pending(b.s)[blk], 0);
    kvp_store_step_end(b.s);
    bare_free(&b);
}

static void test_acquire_head(void **state)
{
    (void)state;
    check_acquire_head(KVP_TIER_RAM, NULL);
    char *d = kvp_test_tmpdir();
    check_acquire_head(KVP_TIER_DISK, d);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* The AttentionPredictor reads every key on its calibration steps (a dense history row): on the
 * disk tier the store reads the layer's cold blocks in first, so the logits equal the untiered
 * run's (before, the row saw only the hot blocks: logits up to 7.8 apart). Shipped model and
 * predictor, 600 prompt tokens, 60 decode steps (12 calibration steps per layer). */
static void test_predictor_calibration_on_disk(void **state)
{
    (void)state;
    const char *src = getenv("KVP_SOURCE_DIR");
    char path[4096], aux[4096];
    snprintf(path, sizeof(path), "%s/models/kvpred-default.gguf", src ? src : ".");
    snprintf(aux, sizeof(aux), "%s/models/kvpred-default.kvpp", src ? src : ".");
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_model_open(path, NULL, &m, &err), 0);
    char *d = kvp_test_tmpdir();
    enum { NP = 600, ND = 60, NV = 1024 };
    float *lg[2];
    for (int t = 0; t < 2; t++) {
        struct kvp_ctx_params cp = {.n_ctx = 1024, .n_threads = 1,
                                    .kv_tier = t ? KVP_TIER_DISK : KVP_TIER_NONE,
                                    .kv_dir = d, .prefetch = KVP_PREFETCH_TOKEN};
        kvp_ctx *c = NULL;
        assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
        struct kvp_policy_params pp = {.name = "predictor", .budget_ratio = 0.125,
                                       .aux_path = aux};
        assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), 0);
        int32_t ids[NP + ND];
        for (int i = 0; i < NP + ND; i++)
            ids[i] = (i * 37 + 11) % 1000 + 3;
        lg[t] = calloc((size_t)ND * NV, sizeof(float));
        assert_int_equal(kvp_eval(c, ids, NP, NULL, false, &err), 0);
        for (int i = 0; i < ND; i++)
            assert_int_equal(kvp_eval(c, ids + NP + i, 1, lg[t] + (size_t)i * NV, false, &err),
                             0);
        if (t) {
            struct kvp_store_stats st;
            assert_int_equal(kvp_ctx_store_stats(c, &st), 0);
            assert_true(st.bytes_read > 0 && st.hits > 0);
        }
        kvp_ctx_free(c);
    }
    double diff = kvp_test_max_diff(lg[0], lg[1], (size_t)ND * NV);
    if (diff != 0.0)
        print_message("predictor, disk tier against untiered: logits %g apart\n", diff);
    assert_true(diff == 0.0);
    free(lg[0]);
    free(lg[1]);
    kvp_model_close(m);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* sq_pin: the polling thread on a CPU the kernel refuses is one clear error, nothing left
 * behind; on CPU 0 it runs (where this kernel gives polling threads at all). */
static void test_sq_cpu(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    struct kvp_kvcache kv;
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init_external(&kv, 2, 2, 16, 16, 256, bare_type, bare_type,
                                               &err),
                     0);
    struct kvp_store *s = NULL;
    struct kvp_disk_ring_params ring = {.sq_pin = true, .sq_cpu = 4095};
    struct kvp_ctx_params p = {.kv_tier = KVP_TIER_DISK, .kv_dir = d, .kv_ring = &ring};
    assert_int_equal(kvp_store_init(&p, &kv, 2, 2, 16, 16, kv.max_blocks, &s, &err),
                     KVP_EINVAL);
    assert_null(s);
    assert_non_null(strstr(err.msg, "CPU 4095"));
    assert_int_equal(dir_entries(d), 0);
    ring.sq_pin = false;
    assert_int_equal(kvp_store_init(&p, &kv, 2, 2, 16, 16, kv.max_blocks, &s, &err), 0);
    bool polls = stats_of(s).sq_poll;
    kvp_store_free(s);
    s = NULL;
    if (polls) {
        ring.sq_pin = true;
        ring.sq_cpu = 0;
        assert_int_equal(kvp_store_init(&p, &kv, 2, 2, 16, 16, kv.max_blocks, &s, &err), 0);
        assert_true(stats_of(s).sq_poll);
        kvp_store_free(s);
    } else {
        print_message("no polling threads on this kernel: CPU 0 not tried\n");
    }
    kvp_kvcache_free(&kv);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* Units are padded to 4 KiB: head_dim 8 in f32 gives 1 KiB per head, 2 heads and 2 KiB of
 * padding; in q8_0 a head is 2 x 192 bytes (160 padded to 64), 768 bytes and the rest padding.
 * Reads stay O_DIRECT-aligned either way. */
static void padding_and_alignment(int type)
{
    char *d = kvp_test_tmpdir();
    struct bare b;
    bare_type = type;
    bare_init(&b, KVP_TIER_DISK, d, 8, 3);
    bare_type = KVP_KV_F32;
    struct kvp_store_layout lay;
    kvp_store_get_layout(b.s, &lay);
    assert_int_equal(lay.ppu, 2);
    assert_int_equal(lay.unit_bytes, 4096);
    assert_int_equal(b.kv.k_bytes, type == KVP_KV_F32 ? 512 : 192);
    assert_int_equal((uintptr_t)lay.hot % 4096, 0);
    /* file holding no name */
    assert_int_equal(dir_entries(d), 0);
    bare_prefill(&b, 70);
    kvp_store_step_begin(b.s, 70);
    struct two_sels t;
    int a[] = {0, 2}, c[] = {1};
    kvp_store_acquire(b.s, 0, sels_of(&t, a, 2, c, 1), 71);
    assert_true(block_ok(&b, 0, 0, 70) && block_ok(&b, 0, 1, 70) && block_ok(&b, 0, 2, 70));
    kvp_store_step_end(b.s);
    assert_int_equal(stats_of(b.s).misaligned, 0);
    assert_true(stats_of(b.s).reads > 0);
    bare_free(&b);
    rmdir(d);
    free(d);
}

static void test_padding_and_alignment(void **state)
{
    (void)state;
    padding_and_alignment(KVP_KV_F32);
    padding_and_alignment(KVP_KV_Q8_0);
}

/* A layer that is never transferred keeps the untiered layout: each head's keys, and its
 * values, are contiguous along the context (dense attention streams them), while a tiered layer
 * keeps K and V of every head of a block in one unit. */
static void dense_layer_layout(int type)
{
    struct kvp_err err = {0};
    struct bare b;
    bare_type = type;
    bare_init(&b, KVP_TIER_RAM, NULL, 16, 4);
    bare_type = KVP_KV_F32;
    assert_int_equal(kvp_store_configure(b.s, 1, 4, &err), 0); /* layer 0 dense, 1 tiered */
    bare_prefill(&b, 100);
    const size_t kb = b.kv.k_bytes, vb = b.kv.v_bytes;
    for (int h = 0; h < 2; h++)
        for (int blk = 0; blk + 1 < 7; blk++) {
            assert_ptr_equal(kvp_kvcache_kblock(&b.kv, 0, h, blk + 1),
                             kvp_kvcache_kblock(&b.kv, 0, h, blk) + kb);
            assert_ptr_equal(kvp_kvcache_vblock(&b.kv, 0, h, blk + 1),
                             kvp_kvcache_vblock(&b.kv, 0, h, blk) + vb);
        }
    const uint8_t *k1 = kvp_kvcache_kblock(&b.kv, 1, 0, 6); /* the newest block is hot */
    assert_ptr_equal(kvp_kvcache_vblock(&b.kv, 1, 0, 6), k1 + kb);
    assert_ptr_equal(kvp_kvcache_kblock(&b.kv, 1, 1, 6), k1 + kb + vb);
    for (int blk = 0; blk < 7; blk++)
        assert_true(block_ok(&b, 0, blk, 100));
    assert_true(block_ok(&b, 1, 6, 100));
    bare_free(&b);
}

/* Every KV type (q8_0: blocks of other sizes for K and V, and a 64-byte padding) */
static void test_dense_layer_layout(void **state)
{
    (void)state;
    for (int type = KVP_KV_F32; type < KVP_KV_COUNT; type++)
        dense_layer_layout(type);
}

/* A RAM tier behind a 1 GB/s, 300 µs link: an on-demand read takes at least the latency. */
static void test_link_model(void **state)
{
    (void)state;
    struct kvp_err err = {0};
    struct bare b;
    assert_int_equal(kvp_kvcache_init_external(&b.kv, 2, 2, 16, 16, 256, bare_type, bare_type,
                                               &err),
                     0);
    struct kvp_ctx_params p = {.kv_tier = KVP_TIER_RAM, .prefetch = KVP_PREFETCH_NONE,
                               .link_gbps = 1.0, .link_latency_us = 300};
    assert_int_equal(kvp_store_init(&p, &b.kv, 2, 2, 16, 16, b.kv.max_blocks, &b.s, &err), 0);
    assert_int_equal(kvp_store_configure(b.s, 0, 8, &err), 0);
    bare_prefill(&b, 100);
    kvp_store_step_begin(b.s, 100);
    struct two_sels t;
    int a[] = {0, 1, 2};
    double t0 = kvp_time_now();
    kvp_store_acquire(b.s, 0, sels_of(&t, a, 3, a, 3), 101);
    double dt = kvp_time_now() - t0;
    print_message("3 units over the modelled link: %.0f us\n", dt * 1e6);
    assert_true(dt >= 300e-6 + 3 * 4096 / 1e9);
    assert_true(block_ok(&b, 0, 1, 100));
    kvp_store_step_end(b.s);
    bare_free(&b);
    /* the link model is for the RAM tier only */
    p.kv_tier = KVP_TIER_DISK;
    assert_int_equal(kvp_kvcache_init_external(&b.kv, 2, 2, 16, 16, 256, bare_type, bare_type,
                                               &err),
                     0);
    assert_int_equal(kvp_store_init(&p, &b.kv, 2, 2, 16, 16, b.kv.max_blocks, &b.s, &err),
                     KVP_EINVAL);
    kvp_kvcache_free(&b.kv);
}

/* ================================= logits: tiered == untiered ============================== */

/* all_modes: both tiers x every prefetch mode; else the disk tier in token mode only */
static void logits_equal(bool all_modes)
{
    char *d = kvp_test_tmpdir();
    predict_salt = 0;
    struct run_cfg base = {.sparse = true};
    float *ref = run_sequence(&base, NULL);
    static const int modes[] = {KVP_PREFETCH_NONE, KVP_PREFETCH_DENSE, KVP_PREFETCH_LAYER,
                                KVP_PREFETCH_TOKEN};
    static const char *const names[] = {"none", "dense", "layer", "token"};
    for (int tier = all_modes ? KVP_TIER_RAM : KVP_TIER_DISK; tier <= KVP_TIER_DISK; tier++)
        for (int m = all_modes ? 0 : 3; m < 4; m++) {
            /* 6 slots per layer: forces eviction and, for some steps, overflow */
            struct run_cfg rc = {.tier = tier, .prefetch = modes[m], .hot_budget = 96,
                                 .sparse = true, .dir = d};
            struct kvp_store_stats st;
            null_reads = 0;
            float *lg = run_sequence(&rc, &st);
            /* the RAM tier shows select the cold copies; the disk tier only the hot blocks */
            if (tier == KVP_TIER_RAM)
                assert_int_equal(null_reads, 0);
            double diff = kvp_test_max_diff(ref, lg, (size_t)N_ROWS * VOCAB);
            print_message("%s %-5s: diff %g, hits %llu (late %llu), misses %llu, prefetched %llu,"
                          " overflow %llu, read %llu B\n",
                          tier == KVP_TIER_RAM ? "ram " : "disk", names[m], diff,
                          (unsigned long long)st.hits, (unsigned long long)st.late,
                          (unsigned long long)st.misses, (unsigned long long)st.prefetched,
                          (unsigned long long)st.overflow, (unsigned long long)st.bytes_read);
            assert_true(diff == 0.0);
            assert_int_equal(st.misaligned, 0);
            assert_true(st.bytes_read > 0);
            if (modes[m] == KVP_PREFETCH_TOKEN || modes[m] == KVP_PREFETCH_LAYER)
                assert_true(st.prefetched > 0);
            if (modes[m] == KVP_PREFETCH_NONE)
                assert_true(st.misses > 0 && st.prefetched == 0);
            free(lg);
        }
    /* a roomy hot tier and the whole model dense: still equal; and with syscall submissions,
     * which the stats then report */
    struct run_cfg roomy = {.tier = KVP_TIER_DISK, .prefetch = KVP_PREFETCH_TOKEN,
                            .sparse = true, .dir = d};
    float *lg = run_sequence(&roomy, NULL);
    assert_true(kvp_test_max_diff(ref, lg, (size_t)N_ROWS * VOCAB) == 0.0);
    free(lg);
    roomy.syscall_submit = true;
    struct kvp_store_stats st;
    lg = run_sequence(&roomy, &st);
    assert_true(kvp_test_max_diff(ref, lg, (size_t)N_ROWS * VOCAB) == 0.0);
    assert_false(st.sq_poll);
    free(lg);
    struct run_cfg dense0 = {0}, dense1 = {.tier = KVP_TIER_DISK, .prefetch = KVP_PREFETCH_DENSE,
                                          .dir = d};
    float *a = run_sequence(&dense0, NULL), *b = run_sequence(&dense1, NULL);
    assert_true(kvp_test_max_diff(a, b, (size_t)N_ROWS * VOCAB) == 0.0);
    free(a);
    free(b);
    free(ref);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* Tiered logits equal the untiered ones bit for bit for every KV type: every tier and mode for
 * f16 (the default) and q8_0 (blocks of other sizes, padded), the disk tier in token mode for
 * f32 and bf16 (f16's layout) to keep the test short. */
static void test_logits_equal(void **state)
{
    (void)state;
    for (seq_type = KVP_KV_F32; seq_type < KVP_KV_COUNT; seq_type++) {
        print_message("KV type %s\n", kvp_kv_type_name(seq_type));
        logits_equal(seq_type == KVP_KV_F16 || seq_type == KVP_KV_Q8_0);
    }
    seq_type = 0;
}

/* A busy host: the disk tier's requests bypass the polling thread (the decode thread submits
 * and completes them itself), always or every other request, so both rings have requests in
 * flight at once; the logits stay the untiered ones bit for bit. Where the kernel refuses a
 * polling thread there is nothing to bypass and every request is a plain one. */
static void test_sq_bypass(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    struct run_cfg base = {.sparse = true};
    float *ref = run_sequence(&base, NULL);
    static const int forced[] = {KVP_SQ_BYPASS_ALWAYS, KVP_SQ_BYPASS_ALTERNATE,
                                 KVP_SQ_BYPASS_NEVER};
    for (int i = 0; i < 3; i++)
        for (int m = KVP_PREFETCH_NONE; m <= KVP_PREFETCH_TOKEN; m++) {
            struct run_cfg rc = {.tier = KVP_TIER_DISK, .prefetch = m, .hot_budget = 96,
                                 .sparse = true, .dir = d, .sq_bypass = forced[i]};
            struct kvp_store_stats st;
            float *lg = run_sequence(&rc, &st);
            print_message("bypass %d, prefetch %d: sq_poll %d, %llu of %llu requests direct, "
                          "in %llu submissions\n",
                          forced[i], m, st.sq_poll, (unsigned long long)st.direct_requests,
                          (unsigned long long)(st.reads + st.writes),
                          (unsigned long long)st.direct_submits);
            assert_true(kvp_test_max_diff(ref, lg, (size_t)N_ROWS * VOCAB) == 0.0);
            /* a submission carries one request or more (a layer's, held together) */
            assert_true(st.direct_submits <= st.direct_requests);
            assert_true((st.direct_submits > 0) == (st.direct_requests > 0));
            if (!st.sq_poll || forced[i] == KVP_SQ_BYPASS_NEVER)
                assert_int_equal(st.direct_requests, 0);
            else if (forced[i] == KVP_SQ_BYPASS_ALWAYS)
                assert_int_equal(st.direct_requests, st.reads + st.writes);
            else
                assert_true(st.direct_requests > 0 && st.direct_requests < st.reads + st.writes);
            free(lg);
        }
    free(ref);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* The bypass's mode switch: a starved decode thread turns to the direct ring at once; the
 * bypass ends only once it has lasted its minimum (expired) and the machine had a core to spare
 * meanwhile, or where that is unknown (-1, as before /proc/stat was read); a thread that is not
 * starved never leaves the polling ring. */
static void test_sq_route(void **state)
{
    (void)state;
    const int P = KVP_SQ_ROUTE_POLLED, D = KVP_SQ_ROUTE_DIRECT;
    assert_int_equal(kvp_sq_route(P, 0.0, false, -1), P);
    assert_int_equal(kvp_sq_route(P, 0.10, true, 0.0), P);
    assert_int_equal(kvp_sq_route(P, 0.40, false, -1), D);
    assert_int_equal(kvp_sq_route(D, 0.40, true, 2.0), D);  /* still starved */
    assert_int_equal(kvp_sq_route(D, 0.0, false, 2.0), D);  /* not lasted long enough */
    assert_int_equal(kvp_sq_route(D, 0.0, true, 0.05), D);  /* a competitor holds the core */
    assert_int_equal(kvp_sq_route(D, 0.0, true, 0.9), P);   /* a core went idle */
    assert_int_equal(kvp_sq_route(D, 0.0, true, -1), P);    /* unknown: try the polling ring */
}

/* predict_next is wrong every time: every selected block that is not hot already is fetched on
 * demand and counted as a miss, and the result does not change. */
static void test_mispredicted_on_demand(void **state)
{
    (void)state;
    struct run_cfg base = {.sparse = true};
    predict_salt = 0;
    float *ref = run_sequence(&base, NULL);
    struct run_cfg good = {.tier = KVP_TIER_RAM, .prefetch = KVP_PREFETCH_TOKEN,
                           .hot_budget = 96, .sparse = true};
    struct kvp_store_stats sg, sb;
    float *lg = run_sequence(&good, &sg);
    predict_salt = 77;
    float *lb = run_sequence(&good, &sb);
    predict_salt = 0;
    print_message("exact prediction: %llu misses of %llu; wrong prediction: %llu misses of %llu\n",
                  (unsigned long long)sg.misses, (unsigned long long)(sg.misses + sg.hits),
                  (unsigned long long)sb.misses, (unsigned long long)(sb.misses + sb.hits));
    assert_true(kvp_test_max_diff(ref, lg, (size_t)N_ROWS * VOCAB) == 0.0);
    assert_true(kvp_test_max_diff(ref, lb, (size_t)N_ROWS * VOCAB) == 0.0);
    assert_true(sb.misses > 2 * sg.misses);
    assert_true(sb.prefetched > 0);
    free(ref);
    free(lg);
    free(lb);
}

/* The prompt's end copies the first decode step's predicted blocks into the hot tier from the
 * staging area: with an exact prediction that step misses nothing, where prefetch none (no
 * prediction) fetches every selected block on demand. The logits stay those of the RAM run. */
static void test_first_step_warm(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    int32_t ids[120];
    for (int i = 0; i < 120; i++)
        ids[i] = (i * 13 + 7) % VOCAB;
    float lg[2][VOCAB];
    struct kvp_store_stats st[2];
    static const int modes[] = {KVP_PREFETCH_TOKEN, KVP_PREFETCH_NONE};
    predict_salt = 0;
    for (int m = 0; m < 2; m++) {
        /* 10 hot slots of the 16 blocks: the layer stays tiered (a hot tier as large as the
         * cache would hold it whole and never miss) */
        struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 2, .kv_tier = KVP_TIER_DISK,
                                    .kv_dir = d, .prefetch = modes[m], .hot_budget = 160};
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), 0);
        struct kvp_policy_params pp = {.name = "full", .budget = 64, .dense_layers = 1};
        assert_int_equal(kvp_ctx_set_policy_ops(c, &test_ops, &pp, &err), 0);
        assert_int_equal(kvp_eval(c, ids, 100, NULL, false, &err), 0);
        kvp_ctx_store_reset_stats(c);
        assert_int_equal(kvp_eval(c, ids + 100, 1, lg[m], false, &err), 0);
        assert_int_equal(kvp_ctx_store_stats(c, &st[m]), 0);
        kvp_ctx_free(c);
    }
    print_message("first step: token %llu misses of %llu, none %llu of %llu\n",
                  (unsigned long long)st[0].misses,
                  (unsigned long long)(st[0].misses + st[0].hits),
                  (unsigned long long)st[1].misses,
                  (unsigned long long)(st[1].misses + st[1].hits));
    assert_int_equal(st[0].misses, 0);
    assert_true(st[1].misses > 3);
    assert_true(kvp_test_max_diff(lg[0], lg[1], VOCAB) == 0.0);
    rmdir(d);
    free(d);
}

/* ================================= quest's predict_next =================================== */

/* Quest predicts with the last query: tiered runs in every mode, with a tight hot tier (6 slots)
 * and a sized one, with margins 0, 2 and the default, give the untiered logits (predict_next
 * changes nothing select returns), and in token mode with the tight tier the margin
 * prefetches. */
static void test_quest_prefetch(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    struct run_cfg base = {.quest_opts = ""};
    float *ref = run_sequence(&base, NULL);
    static const int modes[] = {KVP_PREFETCH_NONE, KVP_PREFETCH_LAYER, KVP_PREFETCH_TOKEN};
    static const char *const opts[] = {"margin=0", "margin=2", ""};
    for (int tier = KVP_TIER_RAM; tier <= KVP_TIER_DISK; tier++)
        for (int m = 0; m < 3; m++)
            for (int o = 0; o < 3; o++)
                for (int hot = 0; hot <= 96; hot += 96) {
                    struct run_cfg rc = {.tier = tier, .prefetch = modes[m], .hot_budget = hot,
                                         .quest_opts = opts[o], .dir = d};
                    struct kvp_store_stats st;
                    float *lg = run_sequence(&rc, &st);
                    double diff = kvp_test_max_diff(ref, lg, (size_t)N_ROWS * VOCAB);
                    if (diff != 0.0)
                        print_message("tier %d mode %d opts '%s' hot %d: diff %g\n", tier,
                                      modes[m], opts[o], hot, diff);
                    assert_true(diff == 0.0);
                    assert_int_equal(st.misaligned, 0);
                    if (modes[m] == KVP_PREFETCH_TOKEN && tier == KVP_TIER_DISK && hot == 96)
                        print_message("quest disk token %-8s: hits %llu, misses %llu, "
                                      "prefetched %llu\n",
                                      o == 2 ? "default" : opts[o], (unsigned long long)st.hits,
                                      (unsigned long long)st.misses,
                                      (unsigned long long)st.prefetched);
                    /* the sized hot tier holds this short context whole */
                    if (modes[m] == KVP_PREFETCH_TOKEN && o > 0 && hot == 96)
                        assert_true(st.prefetched > 0);
                    free(lg);
                }
    free(ref);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* With the query select just used, predict_next for the same context is select's set plus up to
 * margin more candidates: a superset, margin blocks larger unless the candidates run out. */
static void test_quest_predict_superset(void **state)
{
    (void)state;
    struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 1};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), 0);
    struct kvp_policy_params bad = {.name = "quest", .budget = 64, .opts = "margin=x"};
    assert_int_equal(kvp_ctx_set_policy(c, &bad, &err), KVP_EINVAL);
    bad.opts = "depth=3";
    assert_int_equal(kvp_ctx_set_policy(c, &bad, &err), KVP_EINVAL);
    struct kvp_policy_params pp = {.name = "quest", .budget = 64, .dense_layers = 1,
                                   .opts = "margin=3"};
    assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), 0);
    assert_int_equal(kvp_ctx_policy_host(c)->p->prefetch_margin, 3);
    int mb = kvp_ctx_kvcache(c)->max_blocks, n_kv = kvp_ctx_hparams(c)->n_head_kv;
    int32_t *blocks = calloc((size_t)mb, sizeof(int32_t));
    uint64_t *mask = calloc((size_t)mb, sizeof(uint64_t));
    struct kvp_sel pred = {.blocks = blocks, .mask = mask};
    int32_t ids[200];
    for (int i = 0; i < 200; i++)
        ids[i] = (i * 11 + 5) % VOCAB;
    assert_int_equal(kvp_eval(c, ids, 120, NULL, false, &err), 0);
    int grew = 0;
    for (int i = 120; i < 200; i++) {
        assert_int_equal(kvp_eval(c, ids + i, 1, NULL, false, &err), 0);
        int n = kvp_ctx_n_tokens(c);
        const struct kvp_policy_host *pol = kvp_ctx_policy_host(c);
        for (int l = 1; l < kvp_ctx_hparams(c)->n_layer; l++)
            for (int h = 0; h < n_kv; h++) {
                const struct kvp_sel *sel = &pol->sel[(size_t)l * n_kv + h];
                pol->p->ops->predict_next(pol->p, l, h, n, &pred);
                int j = 0;
                for (int k = 0; k < sel->n; k++) {
                    while (j < pred.n && pred.blocks[j] < sel->blocks[k])
                        j++;
                    assert_true(j < pred.n && pred.blocks[j] == sel->blocks[k]);
                }
                assert_true(pred.n <= sel->n + 3);
                grew += pred.n > sel->n;
            }
    }
    assert_true(grew > 0);
    free(blocks);
    free(mask);
    kvp_ctx_free(c);
}

/* select keeps its wider ranking for predict_next (share=1, the default): the predictions are
 * the ones share=0 computes from all candidates, at every step, whether predict_next follows
 * the step's select (token mode) or comes before the next one (layer mode). */
static void test_quest_shared_ranking(void **state)
{
    (void)state;
    struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 1};
    kvp_ctx *c[2] = {NULL, NULL};
    struct kvp_err err = {0};
    const char *opts[2] = {"margin=3,share=0", "margin=3"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvp_ctx_init(model, &cp, &c[i], &err), 0);
        struct kvp_policy_params pp = {.name = "quest", .budget_ratio = 0.25,
                                       .dense_layers = 1, .opts = opts[i]};
        assert_int_equal(kvp_ctx_set_policy(c[i], &pp, &err), 0);
    }
    struct kvp_policy_params bad = {.name = "quest", .budget = 64, .opts = "share=2"};
    assert_int_equal(kvp_ctx_set_policy(c[0], &bad, &err), KVP_EINVAL);
    struct kvp_policy_params pp0 = {.name = "quest", .budget_ratio = 0.25, .dense_layers = 1,
                                    .opts = opts[0]};
    assert_int_equal(kvp_ctx_set_policy(c[0], &pp0, &err), 0);
    int mb = kvp_ctx_kvcache(c[0])->max_blocks, n_kv = kvp_ctx_hparams(c[0])->n_head_kv;
    int32_t *blocks = calloc((size_t)4 * mb, sizeof(int32_t));
    uint64_t *mask = calloc((size_t)4 * mb, sizeof(uint64_t));
    struct kvp_sel pred[2][2];
    for (int i = 0; i < 2; i++)
        for (int w = 0; w < 2; w++)
            pred[i][w] = (struct kvp_sel){.blocks = blocks + (size_t)(2 * i + w) * mb,
                                          .mask = mask + (size_t)(2 * i + w) * mb};
    int32_t ids[250];
    for (int i = 0; i < 250; i++)
        ids[i] = (i * 13 + 7) % VOCAB;
    for (int i = 0; i < 2; i++)
        assert_int_equal(kvp_eval(c[i], ids, 64, NULL, false, &err), 0);
    int compared = 0;
    for (int t = 64; t < 250; t++) {
        for (int i = 0; i < 2; i++)
            assert_int_equal(kvp_eval(c[i], ids + t, 1, NULL, false, &err), 0);
        int n = kvp_ctx_n_tokens(c[0]);
        for (int l = 1; l < kvp_ctx_hparams(c[0])->n_layer; l++)
            for (int h = 0; h < n_kv; h++) {
                /* token mode: the next step; layer mode: the step after it (no select between) */
                for (int w = 0; w < 2; w++)
                    for (int i = 0; i < 2; i++) {
                        struct kvp_policy *p = kvp_ctx_policy_host(c[i])->p;
                        p->ops->predict_next(p, l, h, n + 1 + w, &pred[i][w]);
                    }
                for (int w = 0; w < 2; w++) {
                    assert_int_equal(pred[0][w].n, pred[1][w].n);
                    assert_memory_equal(pred[0][w].blocks, pred[1][w].blocks,
                                        (size_t)pred[0][w].n * sizeof(int32_t));
                    assert_memory_equal(pred[0][w].mask, pred[1][w].mask,
                                        (size_t)pred[0][w].n * sizeof(uint64_t));
                    compared++;
                }
            }
    }
    assert_int_equal(compared, (250 - 64) * (kvp_ctx_hparams(c[0])->n_layer - 1) * n_kv * 2);
    free(blocks);
    free(mask);
    for (int i = 0; i < 2; i++)
        kvp_ctx_free(c[i]);
}

/* Token mode up to the context's last position, where no next step exists to predict (its
 * plan would need one block more than the buffers hold): same logits as untiered. */
static void test_decode_to_the_end(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    int32_t ids[256];
    for (int i = 0; i < 256; i++)
        ids[i] = (i * 17 + 1) % VOCAB;
    float lg[2][VOCAB];
    for (int tier = 0; tier < 2; tier++) {
        struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 1,
                                    .kv_tier = tier ? KVP_TIER_DISK : KVP_TIER_NONE,
                                    .kv_dir = tier ? d : NULL,
                                    .prefetch = tier ? KVP_PREFETCH_TOKEN : 0};
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), 0);
        struct kvp_policy_params pp = {.name = "quest", .budget = 64, .dense_layers = 1};
        assert_int_equal(kvp_ctx_set_policy(c, &pp, &err), 0);
        assert_int_equal(kvp_eval(c, ids, 230, NULL, false, &err), 0);
        for (int i = 230; i < 256; i++)
            assert_int_equal(kvp_eval(c, ids + i, 1, lg[tier], false, &err), 0);
        kvp_ctx_free(c);
    }
    assert_true(kvp_test_max_diff(lg[0], lg[1], VOCAB) == 0.0);
    rmdir(d);
    free(d);
}

/* ========================================== faults ========================================= */

static void test_unwritable_dir(void **state)
{
    (void)state;
    struct kvp_ctx_params cp = {.n_ctx = 256, .kv_tier = KVP_TIER_DISK,
                                .kv_dir = "/nonexistent/kvpred"};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), KVP_EIO);
    assert_null(c);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "/nonexistent/kvpred"));
    /* a regular file is not a directory */
    char *f = kvp_test_tmpfile(".txt");
    cp.kv_dir = f;
    assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), KVP_EIO);
    remove(f);
    free(f);
    if (geteuid() != 0) { /* root writes anywhere */
        char *d = kvp_test_tmpdir();
        chmod(d, 0500);
        cp.kv_dir = d;
        assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), KVP_EIO);
        rmdir(d);
        free(d);
    }
}

/* A file size limit of 64 KiB (the cold tier needs 512 KiB): one clear error, in a child so the
 * limit does not outlive the test. */
static void test_disk_full(void **state)
{
    (void)state;
    char *d = kvp_test_tmpdir();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = 64 << 10, .rlim_max = 64 << 10};
        setrlimit(RLIMIT_FSIZE, &rl);
        struct kvp_ctx_params cp = {.n_ctx = 512, .kv_tier = KVP_TIER_DISK, .kv_dir = d};
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        int rc = kvp_ctx_init(model, &cp, &c, &err);
        fprintf(stderr, "disk full: %s\n", err.msg);
        _exit(rc == KVP_EIO && !c && strstr(err.msg, "reserve") ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(dir_entries(d), 0);
    rmdir(d);
    free(d);
}

/* An injected failed or short request is issued again and the decode goes on; one that keeps
 * failing is one KVP_EKVLOST naming it, and every later call refuses until the context is
 * truncated to the trusted tokens (tests/test_store_faults.c checks the logits around it). */
static void check_fault(int kind, const char *word)
{
    struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 2, .kv_tier = KVP_TIER_DISK,
                                .hot_budget = 64, .prefetch = KVP_PREFETCH_NONE};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), 0);
    struct kvp_policy_params pp = {.name = "full", .budget = 64, .dense_layers = 1};
    assert_int_equal(kvp_ctx_set_policy_ops(c, &test_ops, &pp, &err), 0);
    int32_t ids[200];
    for (int i = 0; i < 200; i++)
        ids[i] = (i * 5 + 1) % VOCAB;
    float lg[VOCAB];
    assert_int_equal(kvp_eval(c, ids, 150, NULL, false, &err), 0);
    kvp_store_inject_fault(kvp_ctx_store(c), kind, 1);
    for (int i = 0; i < 10; i++)
        assert_int_equal(kvp_eval(c, ids + 150 + i, 1, lg, false, &err), 0);
    struct kvp_store_stats st;
    kvp_ctx_store_stats(c, &st);
    assert_int_equal(st.retries, 1);
    kvp_store_inject_faults(kvp_ctx_store(c), kind, 1, -1);
    int rc = 0;
    for (int i = 0; i < 10 && rc == 0; i++)
        rc = kvp_eval(c, ids + 160 + i, 1, lg, false, &err);
    print_message("%s\n", err.msg);
    assert_int_equal(rc, KVP_EKVLOST);
    assert_non_null(strstr(err.msg, word));
    assert_int_equal(kvp_eval(c, ids + 170, 1, lg, false, &err), KVP_EKVLOST);
    kvp_store_inject_faults(kvp_ctx_store(c), KVP_FAULT_NONE, 0, 0);
    int t = kvp_ctx_trusted_tokens(c);
    assert_true(t < kvp_ctx_n_tokens(c));
    kvp_ctx_truncate(c, t);
    assert_int_equal(kvp_eval(c, ids + t, 150 - t > 1 ? 150 - t : 1, lg, false, &err), 0);
    kvp_ctx_free(c);
}

static void test_injected_faults(void **state)
{
    (void)state;
    check_fault(KVP_FAULT_SHORT, "short");
    check_fault(KVP_FAULT_EIO, "Input/output error");
}

static void test_refusals_and_timeline(void **state)
{
    (void)state;
    struct kvp_ctx_params cp = {.n_ctx = 256, .kv_tier = KVP_TIER_RAM};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), 0);
    struct kvp_policy_params st = {.name = "streaming", .budget = 64};
    assert_int_equal(kvp_ctx_set_policy(c, &st, &err), KVP_EUNSUPPORTED);
    struct kvp_policy_params pp = {.name = "full", .budget = 64, .dense_layers = 1};
    assert_int_equal(kvp_ctx_set_policy_ops(c, &test_ops, &pp, &err), 0);
    int32_t ids[160];
    for (int i = 0; i < 160; i++)
        ids[i] = (i * 3 + 2) % VOCAB;
    assert_int_equal(kvp_eval(c, ids, 120, NULL, false, &err), 0);
    assert_int_equal(kvp_ctx_store_timeline_png(c, "/nonexistent.png", &err), KVP_EINVAL);
    kvp_ctx_store_timeline(c, true);
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvp_eval(c, ids + 120 + i, 1, NULL, false, &err), 0);
    kvp_ctx_store_timeline(c, false);
    char *png = kvp_test_tmpfile(".png");
    assert_int_equal(kvp_ctx_store_timeline_png(c, png, &err), 0);
    size_t n = 0;
    char *bytes = kvp_test_read_file(png, &n);
    assert_true(n > 100 && !memcmp(bytes, "\x89PNG", 4));
    free(bytes);
    remove(png);
    free(png);
    struct kvp_store_stats s;
    assert_int_equal(kvp_ctx_store_stats(c, &s), 0);
    assert_int_equal(s.steps, 4);
    assert_true(s.step_s > 0 && s.compute_s > 0 && s.compute_s <= s.step_s);
    kvp_ctx_free(c);
    /* untiered contexts have no store */
    struct kvp_ctx_params plain = {.n_ctx = 64};
    assert_int_equal(kvp_ctx_init(model, &plain, &c, &err), 0);
    assert_int_equal(kvp_ctx_store_stats(c, &s), KVP_EINVAL);
    kvp_ctx_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bookkeeping_ram),
        cmocka_unit_test(test_bookkeeping_disk),
        cmocka_unit_test(test_acquire_head),
        cmocka_unit_test(test_sq_cpu),
        cmocka_unit_test(test_predictor_calibration_on_disk),
        cmocka_unit_test(test_write_on_full),
        cmocka_unit_test(test_padding_and_alignment),
        cmocka_unit_test(test_dense_layer_layout),
        cmocka_unit_test(test_link_model),
        cmocka_unit_test(test_logits_equal),
        cmocka_unit_test(test_sq_bypass),
        cmocka_unit_test(test_sq_route),
        cmocka_unit_test(test_mispredicted_on_demand),
        cmocka_unit_test(test_first_step_warm),
        cmocka_unit_test(test_quest_prefetch),
        cmocka_unit_test(test_quest_predict_superset),
        cmocka_unit_test(test_quest_shared_ranking),
        cmocka_unit_test(test_decode_to_the_end),
        cmocka_unit_test(test_unwritable_dir),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_injected_faults),
        cmocka_unit_test(test_refusals_and_timeline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
