/*
 * Block-sparse prefill attention (src/forward/sparse_prefill.c, docs/prefill.md):
 *   - at a budget that covers every key, each estimate's path gives the dense prefill's logits bit
 *     for bit, on every KV type, with one and two threads, with a policy that wants the column
 *     sums and observation rows, over several prompt pieces;
 *   - every choice holds the sink, the local window (the block's own keys included) and at most
 *     the budget, and the prompt's tail and the blocks below min_keys read every key;
 *   - on the shipped model, each estimate's picks hold more of the dense attention than a random
 *     pick of as many blocks would in expectation (a wrong sign or a broken bound does not);
 *   - a prompt's head evaluated as a piece of the whole prompt, then its tail, gives the whole
 *     prompt's logits;
 *   - the shipped model still finds its passkeys after a prefill with the default sparse
 *     settings;
 *   - the learned gate (predictor/prefill_gate.h): its file loader refuses every malformed file
 *     with one error, a gate at pooled's weights makes pooled's choices, a gate that is a pure
 *     distance prior picks the nearest blocks, and the shipped gate's recovery is measured
 *     beside the heuristics'.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward/context.h"
#include "forward/sparse_prefill.h"
#include "kvpred_lab.h"
#include "predictor/prefill_gate.h"
#include "tasks/corpus.h"
#include "tasks/tasks.h"
#include "testutil.h"

enum { N_PROMPT = 1500, CTX = 1600, BATCH = 256 };

/* FNV-1a 64 (the gate file's checksum, and a fingerprint of a choice) */
static uint64_t kvp_fnv64_test(const void *p, size_t n)
{
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= ((const uint8_t *)p)[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static kvp_model *fixture(char **path)
{
    /* head_dim 32, 2 KV heads of 4 query heads (GQA) */
    struct kvp_test_model_spec sp = {.n_vocab = 96, .n_embd = 128, .n_layer = 2, .n_head = 4,
                                     .n_head_kv = 2, .n_ff = 128, .n_ctx = CTX,
                                     .type = KVP_TYPE_F32, .embd_type = KVP_TYPE_F32,
                                     .tied = 1, .seed = 11, .rope_base = 10000.0f};
    return kvp_test_model(&sp, path);
}

/* A gate for the fixture (2 layers, 2 KV heads, head_dim 32, blocks of 32): pooled's weights
 * with some of the bound's and a distance prior, so its path is not pooled's. */
static const struct kvp_prefill_gate *fixture_gate(void)
{
    static struct kvp_prefill_gate *g;
    if (!g) {
        struct kvp_pgate pg;
        struct kvp_err err = {0};
        assert_int_equal(kvp_pgate_init(&pg, 2, 2, 32, 32, &err), 0);
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                float *w = kvp_pgate_w(&pg, l, h);
                for (int d = 0; d < 32; d++)
                    w[32 + d] = w[64 + d] = 0.05f * (float)(1 + (d + l + h) % 3);
                w[96] = -0.5f;
                w[97] = 0.25f;
            }
        assert_int_equal(kvp_spf_gate_from(&pg, &g, &err), 0);
        kvp_pgate_free(&pg);
    }
    return g;
}

static void prompt_ids(int32_t *ids, int n, int vocab)
{
    for (int i = 0; i < n; i++)
        ids[i] = (i * 37 + 5 + i / 11) % vocab;
}

struct observed {
    int calls;
    int bad;
    const struct kvp_prefill_params *p; /* resolved as the library does */
    int job_end;
};

/* Every choice: ascending disjoint runs on key blocks, ending at n_keys, holding the sink and
 * the window, within the budget (or only the forced blocks when they exceed it); never in the
 * dense tail or below min_keys. */
static void check_choice(void *user, int l, int kvh, int p0, int nq, int n_keys,
                         const struct kvp_key_run *runs, int n_runs)
{
    (void)l, (void)kvh;
    struct observed *o = user;
    const struct kvp_prefill_params *p = o->p;
    const int B = p->block;
    o->calls++;
    int cols = 0, prev_end = -1;
    bool bad = n_runs < 1 || runs[n_runs - 1].start + runs[n_runs - 1].n != n_keys;
    for (int r = 0; r < n_runs && !bad; r++) {
        bad |= runs[r].start % B != 0 || runs[r].n <= 0 || runs[r].start <= prev_end;
        prev_end = runs[r].start + runs[r].n;
        cols += runs[r].n;
    }
    /* covered(a, b): keys [a, b) lie in the runs */
    for (int k = 0; k < n_keys && !bad; k++) {
        const bool must = k < p->sink || k >= p0 - p->window;
        if (!must)
            continue;
        bool in = false;
        for (int r = 0; r < n_runs; r++)
            in |= k >= runs[r].start && k < runs[r].start + runs[r].n;
        bad |= !in;
    }
    const int want = p->budget > 0 ? p->budget : (int)(p->budget_ratio * n_keys + 0.999999);
    const int forced_u = (p->sink + B - 1) / B + (n_keys + B - 1) / B -
                         (p0 - p->window > 0 ? p0 - p->window : 0) / B;
    const int max_u = (want + B - 1) / B > forced_u ? (want + B - 1) / B : forced_u;
    bad |= cols > max_u * B;
    bad |= p0 + nq - 1 >= o->job_end - p->dense_tail || n_keys < p->min_keys;
    if (bad && !o->bad)
        print_message("bad choice: layer %d head %d p0 %d n_keys %d, %d runs, %d keys\n", l, kvh,
                      p0, n_keys, n_runs, cols);
    o->bad += bad;
}

static float *prefill_logits(kvp_model *m, const int32_t *ids, int type, int threads,
                             const char *policy, const struct kvp_prefill_params *pp,
                             struct observed *obs)
{
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    struct kvp_ctx_params cp = {.n_ctx = CTX, .n_threads = threads, .n_batch = BATCH,
                                .type_k = type, .type_v = type};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    if (policy) {
        struct kvp_policy_params pol = {.name = policy, .budget = 256};
        assert_int_equal(kvp_ctx_set_policy(c, &pol, &err), 0);
    }
    if (pp) {
        assert_int_equal(kvp_ctx_set_prefill(c, pp, &err), 0);
        if (obs)
            kvp_spf_set_observer(kvp_ctx_spf(c), check_choice, obs);
    }
    float *lg = malloc((size_t)N_PROMPT * info.n_vocab * sizeof(float));
    assert_non_null(lg);
    assert_int_equal(kvp_eval(c, ids, N_PROMPT, lg, true, &err), 0);
    if (pp) {
        struct kvp_prefill_stats st;
        kvp_ctx_prefill_stats(c, &st);
        assert_true(st.tokens == N_PROMPT);
        assert_true(st.keys_read > 0 && st.keys_read <= st.keys_seen);
    }
    kvp_ctx_free(c);
    return lg;
}

/* ---- density 1: the dense bits ---- */

static void test_density_one_is_dense(void **state)
{
    (void)state;
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, info.n_vocab);
    const size_t bytes = (size_t)N_PROMPT * info.n_vocab * sizeof(float);
    const int types[] = {KVP_KV_F32, KVP_KV_F16, KVP_KV_BF16, KVP_KV_Q8_0};
    /* h2o wants column sums of every row (whole-head work items), snapkv observation rows */
    const char *policies[] = {NULL, "h2o", "snapkv"};
    for (int ti = 0; ti < 4; ti++)
        for (int pi = 0; pi < 3; pi++)
            for (int threads = 1; threads <= 2; threads++) {
                if ((ti > 0 || threads > 1) && pi > 0)
                    continue; /* the policies' buffers once, on f32 with one thread */
                float *dense = prefill_logits(m, ids, types[ti], threads, policies[pi], NULL,
                                              NULL);
                for (int est = KVP_PREFILL_POOLED; est < KVP_PREFILL_COUNT; est++) {
                    /* every block within the budget; sparse from the first block on, no tail */
                    struct kvp_prefill_params pp = {.policy = est, .budget_ratio = 1,
                                                    .min_keys = -1, .dense_tail = -1,
                                                    .window = -1, .sink = -1, .block = 32};
                    if (est == KVP_PREFILL_LEARNED)
                        pp.gate = fixture_gate();
                    struct kvp_prefill_params res = pp;
                    res.sink = res.window = res.dense_tail = res.min_keys = 0;
                    res.budget_ratio = 1;
                    res.block = 32;
                    struct observed obs = {.p = &res, .job_end = N_PROMPT};
                    float *sp = prefill_logits(m, ids, types[ti], threads, policies[pi], &pp,
                                               &obs);
                    print_message("kv %s, %d thread(s), policy %s, estimate %s: %d choices\n",
                                  kvp_kv_type_name(types[ti]), threads,
                                  policies[pi] ? policies[pi] : "none",
                                  kvp_prefill_policy_name(est), obs.calls);
                    assert_true(obs.calls > 0); /* the sparse path ran */
                    assert_int_equal(obs.bad, 0);
                    assert_memory_equal(dense, sp, bytes);
                    free(sp);
                }
                free(dense);
            }
    kvp_test_model_free(m, path);
}

/* ---- the mask ---- */

static void test_choice_holds_sink_window_budget(void **state)
{
    (void)state;
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, info.n_vocab);
    for (int est = KVP_PREFILL_POOLED; est < KVP_PREFILL_COUNT; est++)
        for (int thr = 0; thr < 2; thr++) {
            struct kvp_prefill_params pp = {.policy = est, .budget_ratio = 0.25,
                                            .threshold = thr ? 0.9 : 0, .block = 32,
                                            .sink = 40, .window = 100, .dense_tail = 200,
                                            .min_keys = 300};
            if (est == KVP_PREFILL_LEARNED)
                pp.gate = fixture_gate();
            struct observed obs = {.p = &pp, .job_end = N_PROMPT};
            free(prefill_logits(m, ids, KVP_KV_F16, 1, NULL, &pp, &obs));
            print_message("estimate %s, threshold %g: %d sparse choices\n",
                          kvp_prefill_policy_name(est), pp.threshold, obs.calls);
            assert_true(obs.calls > 0);
            assert_int_equal(obs.bad, 0);
        }
    kvp_test_model_free(m, path);
}

/* ---- bad settings ---- */

static void test_refusals(void **state)
{
    (void)state;
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_ctx_params cp = {.n_ctx = 512, .block_size = 48};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    const struct kvp_prefill_params bad[] = {
        {.policy = KVP_PREFILL_COUNT},
        {.policy = -1},
        {.policy = KVP_PREFILL_POOLED, .budget = -1},
        {.policy = KVP_PREFILL_POOLED, .budget_ratio = 1.5},
        {.policy = KVP_PREFILL_POOLED, .threshold = -0.1},
        {.policy = KVP_PREFILL_POOLED, .block = 64}, /* not a multiple of 48 */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err = (struct kvp_err){0};
        assert_int_equal(kvp_ctx_set_prefill(c, &bad[i], &err), KVP_EINVAL);
        assert_true(err.msg[0] != 0);
    }
    /* the default key block is the first multiple of 48 from 64 on */
    const struct kvp_prefill_params ok = {.policy = KVP_PREFILL_POOLED};
    assert_int_equal(kvp_ctx_set_prefill(c, &ok, &err), 0);
    assert_int_equal(kvp_ctx_set_prefill(c, NULL, &err), 0); /* back to dense */
    assert_int_equal(kvp_prefill_policy_parse("sparse"), KVP_PREFILL_SPARSE);
    assert_int_equal(kvp_prefill_policy_parse("Pooled"), -1);
    assert_null(kvp_prefill_policy_name(KVP_PREFILL_COUNT));
    kvp_ctx_free(c);
    kvp_test_model_free(m, path);
}

/* ---- the learned gate ---- */

/* Parse a copy of buf with bytes [at, at + n) replaced by v (n 0: unchanged), the checksum fixed
 * when fix: the error code, and the message must say which check refused it. */
static int parse_mutated(const uint8_t *buf, size_t size, size_t at, const void *v, size_t n,
                         bool fix, const char *want)
{
    uint8_t *b = malloc(size);
    assert_non_null(b);
    memcpy(b, buf, size);
    if (n) /* n 0: v may be NULL, which memcpy may not be given */
        memcpy(b + at, v, n);
    if (fix) {
        const uint64_t h = kvp_fnv64_test(b, size - 8);
        memcpy(b + size - 8, &h, 8);
    }
    struct kvp_pgate g;
    struct kvp_err err = {0};
    int rc = kvp_pgate_parse(b, size, &g, &err);
    if (rc == 0)
        kvp_pgate_free(&g);
    else if (want && !strstr(err.msg, want))
        fail_msg("expected '%s', got '%s'", want, err.msg);
    free(b);
    return rc;
}

static void test_gate_file_refusals(void **state)
{
    (void)state;
    struct kvp_pgate g;
    struct kvp_err err = {0};
    assert_int_equal(kvp_pgate_init(&g, 2, 2, 32, 32, &err), 0);
    kvp_pgate_w(&g, 1, 1)[96] = -0.75f;
    char path[] = "/tmp/kvp_gate_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kvp_pgate_save(&g, path, &err), 0);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t buf[16384];
    const size_t size = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    /* as written: read back the same weights */
    struct kvp_pgate back;
    assert_int_equal(kvp_pgate_load(path, &back, &err), 0);
    assert_memory_equal(back.w, g.w, (size_t)2 * 2 * g.nw * sizeof(float));
    assert_true(kvp_pgate_w(&back, 1, 1)[96] == -0.75f);
    kvp_pgate_free(&back);
    /* every truncation: one error, never a crash (ASan sees overreads: the copies are exact) */
    for (size_t n = 0; n < size; n++) {
        uint8_t *b = malloc(n ? n : 1);
        memcpy(b, buf, n);
        err = (struct kvp_err){0};
        assert_int_equal(kvp_pgate_parse(b, n, &back, &err), KVP_EFORMAT);
        assert_true(err.msg[0] != 0 && strchr(err.msg, '\n') == NULL);
        free(b);
    }
    const uint32_t v2 = 2, big = 1u << 20, npos3 = 3;
    const float nan = NAN;
    const size_t w0 = 8 + 4 * 6 + 24 + 64 + 4 + 2 * 8 + 4; /* the first weight */
    assert_int_equal(parse_mutated(buf, size, 0, "KVPGATE2", 8, true, "bad magic"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, 8, &v2, 4, true, "version"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, 12, &big, 4, true, "implausible"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, 28, &npos3, 4, true, "implausible"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, w0 - 4, &big, 4, true, "weights"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, w0, &nan, 4, true, "not finite"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, w0, &nan, 4, false, "checksum"), KVP_EFORMAT);
    assert_int_equal(parse_mutated(buf, size, 0, NULL, 0, false, NULL), 0);
    /* one byte too many */
    static uint8_t longer[16384 + 1];
    memcpy(longer, buf, size);
    assert_int_equal(kvp_pgate_parse(longer, size + 1, &back, &err), KVP_EFORMAT);
    /* the public loader: a missing file, and a gate the model cannot use */
    struct kvp_prefill_gate *pg = NULL;
    assert_true(kvp_prefill_gate_load("/nonexistent/x.kvpg", &pg, &err) < 0);
    assert_null(pg);
    assert_int_equal(kvp_prefill_gate_load(path, &pg, &err), 0);
    char *mpath = NULL;
    kvp_model *m = fixture(&mpath);
    struct kvp_ctx_params cp = {.n_ctx = 512};
    kvp_ctx *c = NULL;
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    const struct kvp_prefill_params none = {.policy = KVP_PREFILL_LEARNED};
    assert_int_equal(kvp_ctx_set_prefill(c, &none, &err), KVP_EINVAL); /* no gate */
    const struct kvp_prefill_params other = {.policy = KVP_PREFILL_LEARNED, .block = 64,
                                             .gate = pg}; /* the gate's blocks are 32 */
    assert_int_equal(kvp_ctx_set_prefill(c, &other, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "prefill gate is for"));
    const struct kvp_prefill_params ok = {.policy = KVP_PREFILL_LEARNED, .gate = pg};
    assert_int_equal(kvp_ctx_set_prefill(c, &ok, &err), 0);
    kvp_prefill_gate_free(pg); /* the context holds a copy */
    kvp_ctx_free(c);
    kvp_test_model_free(m, mpath);
    kvp_pgate_free(&g);
    remove(path);
}

/* Every choice's runs, in the order a one-thread prefill makes them. */
struct choices {
    int n;
    uint64_t h[8192];
};

static void record_choice(void *user, int l, int kvh, int p0, int nq, int n_keys,
                          const struct kvp_key_run *runs, int n_runs)
{
    struct choices *ch = user;
    int key[5] = {l, kvh, p0, nq, n_keys};
    uint64_t h = kvp_fnv64_test(key, sizeof(key));
    h ^= kvp_fnv64_test(runs, (size_t)n_runs * sizeof(*runs)) * 31;
    if (ch->n < 8192)
        ch->h[ch->n++] = h;
}

static void run_choices(kvp_model *m, const int32_t *ids, const struct kvp_prefill_params *pp,
                        kvp_spf_observer fn, void *user)
{
    struct kvp_ctx_params cp = {.n_ctx = CTX, .n_threads = 1, .n_batch = BATCH};
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    assert_int_equal(kvp_ctx_set_prefill(c, pp, &err), 0);
    kvp_spf_set_observer(kvp_ctx_spf(c), fn, user);
    assert_int_equal(kvp_eval(c, ids, N_PROMPT, NULL, false, &err), 0);
    kvp_ctx_free(c);
}

/* A gate at pooled's weights makes pooled's choices, every one of them. */
static void test_gate_at_pooled_weights_is_pooled(void **state)
{
    (void)state;
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, info.n_vocab);
    struct kvp_pgate g;
    struct kvp_prefill_gate *pg = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_pgate_init(&g, 2, 2, 32, 32, &err), 0);
    assert_int_equal(kvp_spf_gate_from(&g, &pg, &err), 0);
    struct kvp_prefill_params pp = {.policy = KVP_PREFILL_POOLED, .budget_ratio = 0.25,
                                    .block = 32, .window = 64, .min_keys = 256};
    static struct choices pooled, learned;
    run_choices(m, ids, &pp, record_choice, &pooled);
    pp.policy = KVP_PREFILL_LEARNED;
    pp.gate = pg;
    run_choices(m, ids, &pp, record_choice, &learned);
    print_message("%d choices each\n", pooled.n);
    assert_true(pooled.n > 0);
    assert_int_equal(pooled.n, learned.n);
    assert_memory_equal(pooled.h, learned.h, (size_t)pooled.n * sizeof(uint64_t));
    kvp_prefill_gate_free(pg);
    kvp_pgate_free(&g);
    kvp_test_model_free(m, path);
}

/* A gate that is only a distance prior (-ln(1 + d)) ranks the nearest blocks first: each choice
 * is the forced blocks plus the budget's worth of candidates just before the window. */
struct nearest {
    int calls, bad, B, sink, window;
    double ratio;
};

static void check_nearest(void *user, int l, int kvh, int p0, int nq, int n_keys,
                          const struct kvp_key_run *runs, int n_runs)
{
    (void)l, (void)kvh, (void)nq;
    struct nearest *o = user;
    const int B = o->B, U = (n_keys + B - 1) / B;
    const int sink_u = (o->sink + B - 1) / B, win_u = (p0 - o->window > 0 ? p0 - o->window : 0) / B;
    const int bu = (int)((ceil(o->ratio * n_keys) + B - 1) / B);
    uint8_t pick[256] = {0};
    for (int r = 0; r < n_runs; r++)
        for (int k = runs[r].start; k < runs[r].start + runs[r].n; k += B)
            pick[k / B] = 1;
    const int forced = sink_u + (U - win_u);
    int want = bu - forced < win_u - sink_u ? bu - forced : win_u - sink_u;
    want = want < 0 ? 0 : want;
    int bad = 0;
    for (int u = sink_u; u < win_u; u++)
        bad += pick[u] != (u >= win_u - want);
    if (bad && !o->bad) {
        print_message("first bad choice: p0 %d, n_keys %d, want %d of blocks %d..%d:", p0,
                      n_keys, want, sink_u, win_u - 1);
        for (int u = 0; u < U; u++)
            print_message("%d", pick[u]);
        print_message("\n");
    }
    o->bad += bad;
    o->calls++;
}

static void test_gate_distance_prior_ranks_nearest(void **state)
{
    (void)state;
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, info.n_vocab);
    struct kvp_pgate g;
    struct kvp_prefill_gate *pg = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_pgate_init(&g, 2, 2, 32, 32, &err), 0);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            float *w = kvp_pgate_w(&g, l, h);
            memset(w, 0, (size_t)g.nw * sizeof(float));
            w[96] = -1.0f;
        }
    assert_int_equal(kvp_spf_gate_from(&g, &pg, &err), 0);
    const struct kvp_prefill_params pp = {.policy = KVP_PREFILL_LEARNED, .budget_ratio = 0.25,
                                          .block = 32, .sink = 32, .window = 64,
                                          .min_keys = 256, .gate = pg};
    struct nearest o = {.B = 32, .sink = 32, .window = 64, .ratio = 0.25};
    run_choices(m, ids, &pp, check_nearest, &o);
    print_message("%d choices, %d blocks off the nearest\n", o.calls, o.bad);
    assert_true(o.calls > 0);
    assert_int_equal(o.bad, 0);
    kvp_prefill_gate_free(pg);
    kvp_pgate_free(&g);
    kvp_test_model_free(m, path);
}

/* ---- inside the batched step ---- */

/* Two sequences of an engine prefill their prompts in pieces of 128 tokens side by side in steps
 * of 256, each with its own sparse settings: each gets the logits a lone context with the same
 * settings and pieces gets, bit for bit. The engine need not be exact (every piece is many
 * tokens, so none is merged with another's): an exact one runs its weight products in fixed
 * windows of 64 positions, which a lone context does not (docs/testing.md, "Prefill in two
 * pieces"), so under an OpenBLAS kernel whose sums depend on the call's shape the two would part
 * by float rounding. */
static void test_batched_step(void **state)
{
    (void)state;
    enum { PIECE = 128 };
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[2][N_PROMPT];
    prompt_ids(ids[0], N_PROMPT, info.n_vocab);
    for (int i = 0; i < N_PROMPT; i++)
        ids[1][i] = (ids[0][i] * 7 + 3) % info.n_vocab;
    const struct kvp_prefill_params pp[2] = {
        {.policy = KVP_PREFILL_POOLED, .budget_ratio = 0.25, .block = 32, .min_keys = 300},
        {.policy = KVP_PREFILL_BOUND, .budget = 256, .threshold = 0.8, .min_keys = 200,
         .dense_tail = -1},
    };
    struct kvp_err err = {0};
    float *alone[2], *batched[2];
    for (int s = 0; s < 2; s++) {
        struct kvp_ctx_params cp = {.n_ctx = CTX, .n_threads = 2, .n_batch = PIECE,
                                    .prefill = &pp[s]};
        kvp_ctx *c = NULL;
        assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
        alone[s] = malloc((size_t)info.n_vocab * sizeof(float));
        batched[s] = malloc((size_t)info.n_vocab * sizeof(float));
        assert_int_equal(kvp_eval(c, ids[s], N_PROMPT, alone[s], false, &err), 0);
        struct kvp_prefill_stats st;
        kvp_ctx_prefill_stats(c, &st);
        assert_true(st.keys_read < st.keys_seen);
        kvp_ctx_free(c);
    }
    struct kvp_engine_params ep = {.n_threads = 2, .n_batch = 2 * PIECE, .n_ctx = CTX};
    kvp_engine *e = NULL;
    assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
    kvp_seq *seq[2];
    for (int s = 0; s < 2; s++) {
        struct kvp_ctx_params cp = {.n_ctx = CTX, .prefill = &pp[s]};
        assert_int_equal(kvp_seq_init(e, &cp, &seq[s], &err), 0);
    }
    for (int done = 0; done < N_PROMPT; done += PIECE) {
        const int n = N_PROMPT - done < PIECE ? N_PROMPT - done : PIECE;
        struct kvp_batch_item it[2];
        for (int s = 0; s < 2; s++)
            it[s] = (struct kvp_batch_item){.seq = seq[s], .tokens = ids[s] + done, .n = n,
                                            .prompt_rest = N_PROMPT - done - n,
                                            .logits = batched[s]};
        assert_int_equal(kvp_batch_eval(e, it, 2, &err), 0);
    }
    for (int s = 0; s < 2; s++) {
        assert_memory_equal(alone[s], batched[s], (size_t)info.n_vocab * sizeof(float));
        kvp_ctx_free(seq[s]);
        free(alone[s]);
        free(batched[s]);
    }
    kvp_engine_free(e);
    kvp_test_model_free(m, path);
}

/* A prompt's head evaluated as a piece of the whole prompt (kvp_eval_prompt_head: what `eval
 * --task` shares between its runs) and then its last tokens: the whole prompt's logits bit for
 * bit, the dense tail being the whole prompt's last tokens. The head ends on a pass boundary, so
 * that both ways run the same passes (a pass's rows go through the projections together, and
 * other passes round otherwise). Evaluated as a prompt of its own instead, the head's last query
 * chunks would take the dense tail, and the logits differ (the check that the comparison can
 * fail). */
static void test_prompt_head_piece(void **state)
{
    (void)state;
    enum { HEAD = 5 * BATCH, TAIL = N_PROMPT - HEAD };
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, info.n_vocab);
    const struct kvp_prefill_params pp = {.policy = KVP_PREFILL_POOLED, .budget_ratio = 0.25,
                                          .block = 32, .min_keys = 300, .dense_tail = 64};
    const struct kvp_ctx_params cp = {.n_ctx = CTX, .n_threads = 2, .n_batch = BATCH,
                                      .prefill = &pp};
    const size_t bytes = (size_t)info.n_vocab * sizeof(float);
    float *lg[3];
    struct kvp_err err = {0};
    for (int way = 0; way < 3; way++) { /* whole, head as a piece, head as a prompt */
        kvp_ctx *c = NULL;
        assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
        lg[way] = malloc(bytes);
        assert_non_null(lg[way]);
        const int head = way == 0 ? 0 : HEAD;
        if (way == 1)
            assert_int_equal(kvp_eval_prompt_head(c, ids, head, N_PROMPT - head, &err), 0);
        else if (way == 2)
            assert_int_equal(kvp_eval(c, ids, head, NULL, false, &err), 0);
        assert_int_equal(kvp_eval(c, ids + head, N_PROMPT - head, lg[way], false, &err), 0);
        kvp_ctx_free(c);
    }
    assert_memory_equal(lg[0], lg[1], bytes);
    assert_true(memcmp(lg[0], lg[2], bytes) != 0);
    /* a policy's prompt hooks would miss the head: refused with one */
    kvp_ctx *c = NULL;
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    struct kvp_policy_params pol = {.name = "quest", .budget = 64};
    assert_int_equal(kvp_ctx_set_policy(c, &pol, &err), 0);
    assert_int_equal(kvp_eval_prompt_head(c, ids, 64, TAIL, &err), KVP_EINVAL);
    kvp_ctx_free(c);
    for (int way = 0; way < 3; way++)
        free(lg[way]);
    kvp_test_model_free(m, path);
}

/* ---- a tiered store ---- */

/* With a RAM cold tier every prompt piece stages the layer's blocks for prefill attention; a
 * sparse prefill stages only the blocks its query blocks chose (and those its fold and writes
 * touch). The logits are the untiered sparse prefill's, bit for bit, and the cold tier is read
 * less than by a dense prefill. */
static void test_tiered_reads_chosen_blocks(void **state)
{
    (void)state;
    char *path = NULL;
    kvp_model *m = fixture(&path);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    static int32_t ids[N_PROMPT];
    prompt_ids(ids, N_PROMPT, info.n_vocab);
    const size_t bytes = (size_t)N_PROMPT * info.n_vocab * sizeof(float);
    const struct kvp_prefill_params sparse = {.policy = KVP_PREFILL_POOLED, .budget_ratio = 0.25,
                                              .block = 32, .min_keys = 300, .window = 64};
    /* quest on every layer, so that every layer is tiered */
    const struct kvp_policy_params quest = {.name = "quest", .budget = 128, .dense_layers = -1};
    float *lg[3];
    uint64_t read[3] = {0};
    for (int k = 0; k < 3; k++) { /* untiered sparse, tiered sparse, tiered dense */
        struct kvp_ctx_params cp = {.n_ctx = CTX, .n_threads = 2, .n_batch = BATCH,
                                    .kv_tier = k ? KVP_TIER_RAM : KVP_TIER_NONE,
                                    .hot_budget = 256, /* a small hot tier: tiered layers */
                                    .prefill = k < 2 ? &sparse : NULL};
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
        assert_int_equal(kvp_ctx_set_policy(c, &quest, &err), 0);
        kvp_ctx_store_reset_stats(c);
        lg[k] = malloc(bytes);
        assert_non_null(lg[k]);
        assert_int_equal(kvp_eval(c, ids, N_PROMPT, lg[k], true, &err), 0);
        struct kvp_store_stats st;
        if (k)
            assert_int_equal(kvp_ctx_store_stats(c, &st), 0);
        read[k] = k ? st.bytes_read : 0;
        kvp_ctx_free(c);
    }
    print_message("cold-tier bytes read in the prefill: sparse %llu, dense %llu\n",
                  (unsigned long long)read[1], (unsigned long long)read[2]);
    assert_memory_equal(lg[0], lg[1], bytes);
    assert_true(read[1] < read[2]);
    for (int k = 0; k < 3; k++)
        free(lg[k]);
    kvp_test_model_free(m, path);
}

/* ---- the shipped model ---- */

static kvp_model *shipped(void)
{
    static char path[4096];
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/models/kvpred-default.gguf", src ? src : ".");
    kvp_model *model = NULL;
    struct kvp_err err = {0};
    /* the model is part of the repository: missing or unreadable is a failure */
    if (kvp_model_open(path, NULL, &model, &err) < 0)
        fail_msg("%s: %s", path, err.msg);
    return model;
}

static int count_tokens(void *ud, const char *text, size_t len, size_t *n_tok)
{
    int rc = kvp_tokenize(ud, text, len, true, NULL, 0, n_tok, NULL);
    return rc == KVP_ERANGE ? 0 : rc;
}

/* A retrieval prompt of about n tokens (the evaluation's passkey task), tokenized. */
static int32_t *task_prompt(const kvp_model *m, int n, float depth, uint64_t seed, size_t *n_ids,
                            char *want, size_t want_cap)
{
    struct kvp_corpus *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_corpus_passkey_only(&c, &err), 0);
    struct kvp_task_req req = {.task = KVP_TASK_PASSKEY, .seed = KVP_EVAL_SEED_BIT | seed,
                               .target_tokens = n, .depth = depth, .count = count_tokens,
                               .ud = (void *)m};
    struct kvp_task_text tt;
    assert_int_equal(kvp_task_render_eval(c, &req, &tt, &err), 0);
    int32_t *ids = malloc((size_t)(n + 64) * sizeof(int32_t));
    assert_non_null(ids);
    assert_int_equal(kvp_tokenize(m, tt.prompt, strlen(tt.prompt), true, ids, (size_t)n + 64,
                                  n_ids, &err),
                     0);
    if (want)
        snprintf(want, want_cap, "%.*s", (int)strcspn(tt.refs, "\n"), tt.refs);
    kvp_task_text_free(&tt);
    kvp_corpus_free(c);
    return ids;
}

/* The estimate's picks against the dense attention, every layer of the shipped model at 1/8:
 * more than a random pick of as many blocks holds in expectation, layer by layer. */
static struct kvp_prefill_gate *shipped_gate(void)
{
    static char path[4096];
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/models/kvpred-default.kvpg", src ? src : ".");
    struct kvp_prefill_gate *g = NULL;
    struct kvp_err err = {0};
    /* the gate is part of the repository: missing or unreadable is a failure */
    if (kvp_prefill_gate_load(path, &g, &err) < 0)
        fail_msg("%s: %s", path, err.msg);
    return g;
}

static void test_estimates_beat_random(void **state)
{
    (void)state;
    kvp_model *m = shipped();
    struct kvp_prefill_gate *gate = shipped_gate();
    size_t n = 0;
    int32_t *ids = task_prompt(m, 3000, 0.5f, 4242, &n, NULL, 0);
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    for (int est = KVP_PREFILL_POOLED; est < KVP_PREFILL_COUNT; est++) {
        struct kvp_ctx_params cp = {.n_ctx = 4096, .n_threads = 2};
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
        /* a small window, so that most of the budget is the estimate's */
        struct kvp_prefill_params pp = {.policy = est, .budget_ratio = 0.125, .min_keys = 1024,
                                        .window = 64, .dense_tail = -1,
                                        .gate = est == KVP_PREFILL_LEARNED ? gate : NULL};
        assert_int_equal(kvp_ctx_set_prefill(c, &pp, &err), 0);
        kvp_spf_measure(kvp_ctx_spf(c), true);
        assert_int_equal(kvp_eval(c, ids, (int)n, NULL, false, &err), 0);
        for (int l = 0; l < info.n_layer; l++) {
            double rec = 0, rnd = 0;
            assert_int_equal(kvp_spf_recovery(kvp_ctx_spf(c), l, &rec, &rnd), 0);
            print_message("estimate %s, layer %d: density %.3f, recovery %.3f, random %.3f\n",
                          kvp_prefill_policy_name(est), l, kvp_ctx_prefill_density(c, l), rec,
                          rnd);
            assert_true(rec > rnd);
        }
        kvp_ctx_free(c);
    }
    kvp_prefill_gate_free(gate);
    free(ids);
    kvp_model_close(m);
}

/* Passkeys at 8192 tokens (depths 10, 50 and 90 %) after a prefill with the default sparse
 * settings, answered greedily from the full cache. */
static void test_passkey_after_sparse_prefill(void **state)
{
    (void)state;
    kvp_model *m = shipped();
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    const float depths[] = {0.1f, 0.5f, 0.9f};
    for (int i = 0; i < 3; i++) {
        char want[48];
        size_t n = 0;
        int32_t *ids = task_prompt(m, 8192 - 16, depths[i], 3000 + (uint64_t)i, &n, want,
                                   sizeof(want));
        struct kvp_ctx_params cp = {.n_ctx = 8192, .n_threads = 2};
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
        struct kvp_prefill_params pp = {.policy = KVP_PREFILL_SPARSE};
        assert_int_equal(kvp_ctx_set_prefill(c, &pp, &err), 0);
        float *logits = malloc((size_t)info.n_vocab * sizeof(float));
        assert_non_null(logits);
        assert_int_equal(kvp_eval(c, ids, (int)n, logits, false, &err), 0);
        struct kvp_prefill_stats st;
        kvp_ctx_prefill_stats(c, &st);
        char out[64] = "";
        size_t len = 0;
        int prev = ids[n - 1];
        for (int step = 0; step < 8; step++) {
            int best = 0;
            for (int v = 1; v < info.n_vocab; v++)
                best = logits[v] > logits[best] ? v : best;
            char piece[32];
            size_t k = kvp_token_to_piece(m, prev, best, piece, sizeof(piece));
            if (kvp_token_is_eog(m, best) || memchr(piece, '\n', k))
                break;
            if (len + k < sizeof(out)) {
                memcpy(out + len, piece, k);
                out[len += k] = 0;
            }
            int32_t tok = best;
            assert_int_equal(kvp_eval(c, &tok, 1, logits, false, &err), 0);
            prev = best;
        }
        print_message("%zu tokens, depth %.0f%%, density %.3f, key %s: '%s'\n", n,
                      100 * depths[i], st.keys_read / st.keys_seen, want, out);
        assert_true(st.keys_read < st.keys_seen); /* it was sparse */
        assert_non_null(strstr(out, want));
        free(logits);
        free(ids);
        kvp_ctx_free(c);
    }
    kvp_model_close(m);
}

/* ---- the switch on the command line ---- */

static void test_cli_switch(void **state)
{
    (void)state;
    KVP_REQUIRE_CLI(cli);
    char cmd[4096], *out = NULL;
    /* bench --help names every policy and the recommended one */
    snprintf(cmd, sizeof(cmd), "%s bench --help", cli);
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_non_null(strstr(out, "--prefill-policy"));
    assert_non_null(strstr(out, "--prefill-budget"));
    assert_non_null(strstr(out, "--prefill-predictor"));
    assert_non_null(strstr(out, "sparse\n                       (recommended: pooled)"));
    for (int i = 0; i < KVP_PREFILL_COUNT; i++)
        assert_non_null(strstr(out, kvp_prefill_policy_name(i)));
    free(out);
    const char *cmds[] = {"run", "bench", "eval --tokens-from-seed 1", "eval --task passkey",
                          "batched-bench", "serve"};
    for (int i = 0; i < 6; i++) {
        snprintf(cmd, sizeof(cmd), "%s %s --prefill-budget 1/8 2>&1", cli, cmds[i]);
        kvp_test_expect_error(cmd, "need a sparse --prefill-policy");
        snprintf(cmd, sizeof(cmd), "%s %s --prefill-policy sparsest 2>&1", cli, cmds[i]);
        kvp_test_expect_error(cmd, "--prefill-policy");
        /* the learned estimate and its gate go together, and a bad gate is refused */
        snprintf(cmd, sizeof(cmd), "%s %s --prefill-policy learned 2>&1", cli, cmds[i]);
        kvp_test_expect_error(cmd, "needs --prefill-predictor");
        snprintf(cmd, sizeof(cmd), "%s %s --prefill-predictor g.kvpg 2>&1", cli, cmds[i]);
        kvp_test_expect_error(cmd, "needs --prefill-policy learned");
        snprintf(cmd, sizeof(cmd),
                 "%s %s --prefill-policy learned --prefill-predictor /nonexistent.kvpg 2>&1", cli,
                 cmds[i]);
        kvp_test_expect_error(cmd, "prefill gate file");
    }
    /* the JSON says what the prefill did */
    const char *src = getenv("KVP_SOURCE_DIR");
    snprintf(cmd, sizeof(cmd),
             "%s bench -m %s/models/kvpred-default.gguf --prefill 1500 -c 1600 -n 2 -r 1 --json "
             "--prefill-policy sparse --prefill-budget 1/8 --prefill-min-keys 512 "
             "--prefill-tail 64",
             cli, src ? src : ".");
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    assert_non_null(strstr(out, "\"prefill_policy\":\"pooled\""));
    assert_non_null(strstr(out, "\"prefill_budget\":\"1/8\""));
    assert_non_null(strstr(out, "\"prefill_density_layers\":["));
    assert_non_null(strstr(out, "\"prefill_estimate_s\":"));
    assert_non_null(strstr(out, "\"prefill_attention_s\":"));
    const char *d = strstr(out, "\"prefill_density\":");
    assert_non_null(d);
    const double density = strtod(d + strlen("\"prefill_density\":"), NULL);
    assert_true(density > 0 && density < 1);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_density_one_is_dense),
        cmocka_unit_test(test_choice_holds_sink_window_budget),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_batched_step),
        cmocka_unit_test(test_prompt_head_piece),
        cmocka_unit_test(test_tiered_reads_chosen_blocks),
        cmocka_unit_test(test_gate_file_refusals),
        cmocka_unit_test(test_gate_at_pooled_weights_is_pooled),
        cmocka_unit_test(test_gate_distance_prior_ranks_nearest),
        cmocka_unit_test(test_estimates_beat_random),
        cmocka_unit_test(test_passkey_after_sparse_prefill),
        cmocka_unit_test(test_cli_switch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
