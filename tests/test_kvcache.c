/*
 * KV cache compaction on hand-made data: which tokens move where, that each moved slot holds
 * exactly the original token's key and value, masks, counters and released blocks, the move
 * callback, the newest block, what a measurement run accounts against what a releasing run
 * really holds, truncation after compaction, and external caches left alone. Everything runs
 * for every KV cache type: a moved token must hold the very bytes its token was stored as
 * (q8_0: its codes and its scales).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "testutil.h"

enum { HD = 5, BS = 8, CTX = 64 };

static int cur_type; /* the KV type of every cache of a run of the group (main) */

/* The key and value of the token at position pos of KV head h: every element tells which. */
static float key_of(int h, int pos, int d)
{
    return (float)(h * 10000 + pos * 10 + d);
}

static float val_of(int h, int pos, int d)
{
    return -(float)(h * 10000 + pos * 10 + d) - 0.5f;
}

/* One layer, two KV heads, positions [from, to) stored. */
static void store_range(struct kvp_kvcache *c, int from, int to)
{
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_reserve(c, to, &err), 0);
    for (int h = 0; h < 2; h++)
        for (int p = from; p < to; p++) {
            float k[HD], v[HD];
            for (int d = 0; d < HD; d++) {
                k[d] = key_of(h, p, d);
                v[d] = val_of(h, p, d);
            }
            kvp_kvcache_store(c, 0, h, p, k, v);
        }
}

static bool evicted(const struct kvp_kvcache *c, int h, int s)
{
    return (kvp_kvcache_evicted(c, 0, h, s / BS) >> (s % BS)) & 1;
}

/* Every live slot of head h below n holds the key and value of the position the cache says. */
static void check_data(const struct kvp_kvcache *c, int h, int n)
{
    for (int s = 0; s < n; s++) {
        if (evicted(c, h, s))
            continue;
        int p = kvp_kvcache_pos(c, 0, h, s);
        const uint8_t *kb = kvp_kvcache_kblock(c, 0, h, s / BS);
        const uint8_t *vb = kvp_kvcache_vblock(c, 0, h, s / BS);
        assert_non_null(kb);
        assert_non_null(vb);
        /* the token as the type stores it, alone in a block of its own */
        uint8_t kref[512] = {0}, vref[512] = {0};
        float k[HD], v[HD];
        for (int d = 0; d < HD; d++) {
            k[d] = key_of(h, p, d);
            v[d] = val_of(h, p, d);
        }
        c->kk->put_k(k, kref, HD, BS, 0);
        c->vk->put_v(v, vref, HD, BS, 0);
        for (int d = 0; d < HD; d++) {
            assert_true(kvp_kv_key_at(c->type_k, kb, HD, BS, d, s % BS) ==
                        kvp_kv_key_at(c->type_k, kref, HD, BS, d, 0));
            assert_true(kvp_kv_value_at(c->type_v, vb, HD, BS, s % BS, d) ==
                        kvp_kv_value_at(c->type_v, vref, HD, BS, 0, d));
        }
    }
}

/* The set of live positions of head h below n, as flags. */
static void live_positions(const struct kvp_kvcache *c, int h, int n, bool *live)
{
    memset(live, 0, CTX * sizeof(bool));
    for (int s = 0; s < n; s++)
        if (!evicted(c, h, s)) {
            int p = kvp_kvcache_pos(c, 0, h, s);
            assert_false(live[p]); /* no token twice */
            live[p] = true;
        }
}

/* What a policy keeps per slot, moved by the callback: here the token's position. */
struct mover {
    int state[CTX];
    int moves;
};

static void on_move(void *user, int from, int to)
{
    struct mover *m = user;
    assert_true(to < from);
    m->state[to] = m->state[from];
    m->state[from] = -1;
    m->moves++;
}

static size_t block_bytes(void)
{
    return kvp_kv_block_bytes(cur_type, HD, BS) * 2; /* K and V, the same type */
}

/* Head 0 keeps a scattered set; block 3 is wholly evicted (released by evict itself). */
static const int KEEP[] = {0, 1, 2, 5, 11, 17, 18, 33, 39};
#define N_KEEP 9

static bool in_keep(int p)
{
    for (int i = 0; i < N_KEEP; i++)
        if (KEEP[i] == p)
            return true;
    return false;
}

/* A releasing (or measuring) cache of 45 tokens, head 0 evicted down to KEEP below 40. */
static void scattered_cache(struct kvp_kvcache *c, bool release)
{
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init(c, 1, 2, HD, BS, CTX, cur_type, cur_type, &err), 0);
    c->release = release;
    store_range(c, 0, 45);
    for (int p = 0; p < 40; p++)
        if (!in_keep(p))
            kvp_kvcache_evict(c, 0, 0, p, 45);
}

static void test_compact_moves_and_frees(void **state)
{
    (void)state;
    struct kvp_kvcache c;
    scattered_cache(&c, true);
    assert_int_equal(c.released[0], 1);
    assert_int_equal(c.n_pool - c.n_free, 5 + 6); /* blocks 0-2, 4, 5; head 1: 0-5 */

    struct mover m = {.moves = 0};
    for (int s = 0; s < CTX; s++)
        m.state[s] = s;
    /* limit 64 is capped at 40, the start of the newest token's block */
    assert_int_equal(kvp_kvcache_compact(&c, 0, 0, 64, 45, on_move, &m), 2);
    assert_int_equal(c.compact_limit[0], 40);
    /* 9 live tokens of [0, 40) now fill slots 0..8 of blocks 0 and 1; blocks 2-4 are gone */
    for (int s = 0; s < 40; s++)
        assert_true(evicted(&c, 0, s) == (s >= N_KEEP));
    assert_non_null(kvp_kvcache_kblock(&c, 0, 0, 0));
    assert_non_null(kvp_kvcache_kblock(&c, 0, 0, 1));
    for (int b = 2; b < 5; b++)
        assert_null(kvp_kvcache_kblock(&c, 0, 0, b));
    assert_int_equal(c.released[0], 3);
    assert_int_equal(c.n_pool - c.n_free, 3 + 6);
    assert_int_equal(kvp_kvcache_kept(&c, 0, 0, 45), N_KEEP + 5);
    bool live[CTX];
    live_positions(&c, 0, 45, live);
    for (int p = 0; p < 45; p++)
        assert_true(live[p] == (p >= 40 || in_keep(p)));
    for (int s = 40; s < 45; s++)
        assert_int_equal(kvp_kvcache_pos(&c, 0, 0, s), s); /* the newest block never moves */
    check_data(&c, 0, 45);
    /* the callback saw every move: the policy's state followed each token */
    int moved = 0;
    for (int s = 0; s < 45; s++)
        if (!evicted(&c, 0, s)) {
            assert_int_equal(m.state[s], kvp_kvcache_pos(&c, 0, 0, s));
            moved += kvp_kvcache_pos(&c, 0, 0, s) != s;
        }
    assert_int_equal(m.moves, moved);
    assert_true(moved > 0);
    /* head 1 is untouched */
    for (int s = 0; s < 45; s++) {
        assert_false(evicted(&c, 1, s));
        assert_int_equal(kvp_kvcache_pos(&c, 0, 1, s), s);
    }
    check_data(&c, 1, 45);
    assert_int_equal(kvp_kvcache_resident_bytes(&c, 45), kvp_kvcache_pool_bytes(&c));

    /* again: nothing to do */
    m.moves = 0;
    assert_int_equal(kvp_kvcache_compact(&c, 0, 0, 40, 45, on_move, &m), 0);
    assert_int_equal(m.moves, 0);

    /* the cache grows, more evictions, a larger region: block 5 packs into block 1's holes */
    store_range(&c, 45, 50);
    kvp_kvcache_evict(&c, 0, 0, 41, 50);
    kvp_kvcache_evict(&c, 0, 0, 42, 50);
    assert_int_equal(kvp_kvcache_compact(&c, 0, 0, 48, 50, on_move, &m), 1);
    assert_null(kvp_kvcache_kblock(&c, 0, 0, 5));
    for (int s = 0; s < 48; s++)
        assert_true(evicted(&c, 0, s) == (s >= N_KEEP + 6));
    for (int s = 0; s < 50; s++)
        if (!evicted(&c, 0, s))
            assert_int_equal(m.state[s], kvp_kvcache_pos(&c, 0, 0, s));
    check_data(&c, 0, 50);
    assert_int_equal(kvp_kvcache_resident_bytes(&c, 50), kvp_kvcache_pool_bytes(&c));
    assert_int_equal(kvp_kvcache_pool_bytes(&c), (2 + 1 + 7) * block_bytes());

    /* turned off, compaction does nothing */
    kvp_kvcache_evict(&c, 0, 0, 3, 50);
    c.compact = false;
    assert_int_equal(kvp_kvcache_compact(&c, 0, 0, 48, 50, on_move, &m), 0);
    assert_true(evicted(&c, 0, 3));
    kvp_kvcache_free(&c);
}

/* An H2O-like run: the cache grows a token per step, a pseudo-random older token is evicted and
 * the region compacted every step. After each step the live tokens of the region sit packed at
 * in its lowest held blocks (no hole below a live token), no token is lost or doubled, every
 * moved slot holds its token's data, and only the blocks the live tokens need stay held. */
static void test_compact_every_step(void **state)
{
    (void)state;
    struct kvp_kvcache c;
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init(&c, 1, 2, HD, BS, CTX, cur_type, cur_type, &err), 0);
    c.release = true;
    bool gone[CTX] = {false};
    uint32_t x = 12345;
    store_range(&c, 0, 2 * BS);
    for (int n = 2 * BS + 1; n <= CTX; n++) {
        store_range(&c, n - 1, n);
        int limit = (n - 1) / BS * BS;
        for (int k = 0; k < 2; k++) { /* two evictions of positions below the newest block */
            x = x * 1103515245u + 12345u;
            int p = (int)((x >> 8) % (uint32_t)limit);
            if (gone[p])
                continue;
            /* the slot now holding position p */
            for (int sl = 0; sl < n; sl++)
                if (!evicted(&c, 0, sl) && kvp_kvcache_pos(&c, 0, 0, sl) == p) {
                    kvp_kvcache_evict(&c, 0, 0, sl, n);
                    gone[p] = true;
                    break;
                }
            assert_true(gone[p]);
        }
        kvp_kvcache_compact(&c, 0, 0, limit, n, NULL, NULL);
        bool live[CTX];
        live_positions(&c, 0, n, live);
        int n_live = 0;
        for (int p = 0; p < n; p++) {
            assert_true(live[p] == !gone[p]);
            n_live += p < limit && live[p];
        }
        /* over the held blocks of the region (a block released whole stays released), the
         * live tokens come first, then the holes; one partly used block at most */
        bool hole_seen = false;
        int held = 0;
        for (int sl = 0; sl < limit; sl++) {
            if (!kvp_kvcache_kblock(&c, 0, 0, sl / BS))
                continue;
            held += sl % BS == 0;
            if (evicted(&c, 0, sl))
                hole_seen = true;
            else
                assert_false(hole_seen);
        }
        assert_int_equal(held, (n_live + BS - 1) / BS);
        check_data(&c, 0, n);
        assert_int_equal(kvp_kvcache_resident_bytes(&c, n), kvp_kvcache_pool_bytes(&c));
    }
    kvp_kvcache_free(&c);
}

/* A measurement run (release off) keeps every token in place and accounts exactly what the
 * releasing run holds. */
static void test_measure_accounting_matches(void **state)
{
    (void)state;
    struct kvp_kvcache rel, mes;
    scattered_cache(&rel, true);
    scattered_cache(&mes, false);
    struct kvp_kvcache *both[2] = {&rel, &mes};
    for (int i = 0; i < 2; i++)
        for (int p = 3; p < 32; p += 4) /* head 1 too, two tokens a block */
            kvp_kvcache_evict(both[i], 0, 1, p, 45);
    assert_true(kvp_kvcache_resident_bytes(&mes, 45) == kvp_kvcache_resident_bytes(&rel, 45));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvp_kvcache_compact(both[i], 0, 0, 40, 45, NULL, NULL), i ? 0 : 2);
        kvp_kvcache_compact(both[i], 0, 1, 32, 45, NULL, NULL);
    }
    /* head 1: 24 live of [0, 32) fill 3 of its 4 blocks there */
    assert_int_equal(rel.released[1], 1);
    assert_int_equal(kvp_kvcache_resident_bytes(&mes, 45), kvp_kvcache_pool_bytes(&rel));
    assert_int_equal(kvp_kvcache_resident_bytes(&rel, 45), kvp_kvcache_pool_bytes(&rel));
    /* measuring moved nothing and freed nothing */
    assert_int_equal(mes.n_pool - mes.n_free, 2 * 6);
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 45; s++)
            assert_int_equal(kvp_kvcache_pos(&mes, 0, h, s), s);
    check_data(&mes, 0, 45);
    assert_true(kvp_kvcache_kept_bytes(&mes, 45) == kvp_kvcache_kept_bytes(&rel, 45));
    kvp_kvcache_free(&rel);
    kvp_kvcache_free(&mes);
}

/* Truncating below compacted tokens drops those whose positions are cut, wherever they sit. */
static void test_truncate_after_compaction(void **state)
{
    (void)state;
    struct kvp_kvcache c;
    scattered_cache(&c, true);
    kvp_kvcache_compact(&c, 0, 0, 40, 45, NULL, NULL);
    kvp_kvcache_truncate(&c, 34); /* position 39 (moved to a low slot) goes, 33 stays */
    bool live[CTX];
    live_positions(&c, 0, 34, live);
    for (int p = 0; p < 34; p++)
        assert_true(live[p] == in_keep(p));
    assert_int_equal(kvp_kvcache_kept(&c, 0, 0, 34), N_KEEP - 1);
    /* new tokens land at their own positions again */
    store_range(&c, 34, 40);
    for (int s = 34; s < 40; s++)
        assert_int_equal(kvp_kvcache_pos(&c, 0, 0, s), s);
    check_data(&c, 0, 40);
    check_data(&c, 1, 40);
    assert_int_equal(kvp_kvcache_resident_bytes(&c, 40), kvp_kvcache_pool_bytes(&c));
    kvp_kvcache_clear(&c);
    assert_int_equal(c.compact_limit[0], 0);
    assert_int_equal(kvp_kvcache_pool_bytes(&c), 0);
    kvp_kvcache_free(&c);
}

/* A tiered store's cache (external) never compacts. */
static void test_external_never_compacts(void **state)
{
    (void)state;
    struct kvp_kvcache c;
    struct kvp_err err = {0};
    assert_int_equal(kvp_kvcache_init_external(&c, 1, 2, HD, BS, CTX, cur_type, cur_type, &err), 0);
    for (int p = 1; p < 40; p += 2)
        kvp_kvcache_evict(&c, 0, 0, p, 45);
    assert_int_equal(kvp_kvcache_compact(&c, 0, 0, 40, 45, NULL, NULL), 0);
    assert_int_equal(c.compact_limit[0], 0);
    assert_int_equal(kvp_kvcache_pos(&c, 0, 0, 2), 2);
    kvp_kvcache_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact_moves_and_frees),
        cmocka_unit_test(test_compact_every_step),
        cmocka_unit_test(test_measure_accounting_matches),
        cmocka_unit_test(test_truncate_after_compaction),
        cmocka_unit_test(test_external_never_compacts),
    };
    int failed = 0;
    for (cur_type = KVP_KV_F32; cur_type < KVP_KV_COUNT; cur_type++) {
        printf("# KV type %s\n", kvp_kv_type_name(cur_type));
        failed += cmocka_run_group_tests(tests, NULL, NULL);
    }
    return failed;
}
