/*
 * Many sequences in one step (kvp_batch_eval): each sequence's logits in a batch equal its
 * logits run alone, bit for bit, for every registered policy, every KV type and the RAM and disk
 * tiers, with sequences of different lengths joining, prefilling in pieces next to others'
 * decoding, and leaving mid-run; fork and copy give the logits of prefilling the shared prefix
 * again; a lone context's kvp_eval and a sequence's steps agree; bad steps are refused whole.
 *
 * Why bit for bit and not a bound: the step is built so that no row's arithmetic depends on the
 * other rows. A multi-token piece goes through the batch kernels as that one piece (the same
 * products a step of its own runs), single tokens through the decode mat-vec kernel per row
 * (batch.c, forward.c: matvec_multi), norms, RoPE and SwiGLU per row, attention per sequence.
 * So "alone" means the same schedule of pieces with the other sequences left out, and any
 * difference is a bug.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/matvec.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/types.h"
#include "forward/context.h"
#include "kvpred.h"
#include "kvpred_lab.h"
#include "policy/policy.h"
#include "store/store.h"
#include "testutil.h"

/* the disk tier's reads submitted by syscall: no polling kernel thread competing for the
 * test's cores */
static const struct kvp_disk_ring_params by_syscall = {.syscall_submit = true};

enum { NSEQ = 4, PIECE = 48, MAXSTEP = 64 };

/* A sequence of the schedule: it joins at step `join`, feeds its prompt in pieces of PIECE
 * tokens, then decodes `n_dec` tokens, one per step, and leaves. */
struct sched {
    int join, n_prompt, n_dec;
};

static const struct sched SCHED[NSEQ] = {
    {0, 37, 9},   /* short prompt, leaves early */
    {0, 130, 6},  /* three pieces */
    {2, 5, 14},   /* joins while the others prefill */
    {5, 100, 7},  /* joins after the first one left... almost: while others decode */
};

static int32_t token_of(int seq, int i, int n_vocab)
{
    return (int32_t)((i * 7 + 3 + seq * 11 + i / 13) % n_vocab);
}

/* The logits of sequence s at item k of its own (the last token of each piece, then each
 * decoded token). */
struct run {
    int n_vocab;
    int n_items[NSEQ];
    float *lg[NSEQ]; /* [MAXSTEP][n_vocab] */
};

struct setup {
    struct kvp_ctx_params cp;
    struct kvp_policy_params pp;
    bool has_policy;
    int n_threads;
    bool fast; /* an engine that is not exact (kvp_engine_params.exact false) */
    bool has_mix; /* each sequence its own policy: mix[s] (NULL: dense), not pp */
    const char *mix[NSEQ];
    unsigned disk; /* bit s: sequence s on the disk tier (in cp.kv_dir), the others in RAM */
};

static struct kvp_policy_params policy(const char *name);

static void run_free(struct run *r)
{
    for (int s = 0; s < NSEQ; s++)
        free(r->lg[s]);
}

/* Run the schedule with the sequences in `mask` (bit s: sequence s) on one engine. */
static void run_schedule(kvp_model *m, const struct setup *su, unsigned mask, struct run *r)
{
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    kvp_engine *e = NULL;
    struct kvp_engine_params ep = {.n_threads = su->n_threads, .n_batch = 256,
                                   .n_ctx = su->cp.n_ctx, .exact = !su->fast};
    assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
    kvp_seq *seq[NSEQ] = {0};
    int fed[NSEQ] = {0}, done[NSEQ] = {0};
    memset(r, 0, sizeof(*r));
    r->n_vocab = in.n_vocab;
    int32_t toks[NSEQ][512];
    for (int s = 0; s < NSEQ; s++) {
        r->lg[s] = calloc((size_t)MAXSTEP * in.n_vocab, sizeof(float));
        for (int i = 0; i < SCHED[s].n_prompt + SCHED[s].n_dec; i++)
            toks[s][i] = token_of(s, i, in.n_vocab);
    }
    for (int step = 0;; step++) {
        struct kvp_batch_item items[NSEQ];
        int n = 0, left = 0;
        for (int s = 0; s < NSEQ; s++)
            left += (mask >> s & 1) && !done[s];
        if (!left)
            break;
        for (int s = 0; s < NSEQ; s++) {
            if (!(mask >> s & 1) || done[s] || step < SCHED[s].join)
                continue;
            if (!seq[s]) {
                struct kvp_ctx_params cp = su->cp;
                if (su->disk >> s & 1)
                    cp.kv_tier = KVP_TIER_DISK;
                int rc = kvp_seq_init(e, &cp, &seq[s], &err);
                if (rc < 0)
                    fail_msg("seq_init: %s", err.msg);
                struct kvp_policy_params pp = su->has_mix ? policy(su->mix[s]) : su->pp;
                if ((su->has_policy || (su->has_mix && su->mix[s])) &&
                    kvp_ctx_set_policy(seq[s], &pp, &err) < 0)
                    fail_msg("set_policy %s: %s", pp.name, err.msg);
            }
            int np = SCHED[s].n_prompt, total = np + SCHED[s].n_dec;
            int take = fed[s] < np ? (np - fed[s] < PIECE ? np - fed[s] : PIECE) : 1;
            int rest = fed[s] < np ? np - fed[s] - take : 0;
            assert_true(r->n_items[s] < MAXSTEP);
            items[n++] = (struct kvp_batch_item){
                .seq = seq[s], .tokens = toks[s] + fed[s], .n = take, .prompt_rest = rest,
                .logits = r->lg[s] + (size_t)r->n_items[s]++ * in.n_vocab};
            fed[s] += take;
            if (fed[s] == total)
                done[s] = 1;
        }
        if (n && kvp_batch_eval(e, items, n, &err) < 0)
            fail_msg("step %d: %s", step, err.msg);
        /* leavers are freed between steps, so the others continue without them */
        for (int s = 0; s < NSEQ; s++)
            if (done[s] == 1) {
                kvp_ctx_free(seq[s]);
                seq[s] = NULL;
                done[s] = 2;
            }
    }
    kvp_engine_free(e);
}

/* Run everything together, then each sequence alone; every logit must agree bit for bit. */
static void check_setup(kvp_model *m, const struct setup *su, const char *what)
{
    struct run all, one;
    run_schedule(m, su, (1u << NSEQ) - 1, &all);
    for (int s = 0; s < NSEQ; s++) {
        run_schedule(m, su, 1u << s, &one);
        assert_int_equal(one.n_items[s], all.n_items[s]);
        size_t bytes = (size_t)all.n_items[s] * all.n_vocab * sizeof(float);
        if (memcmp(one.lg[s], all.lg[s], bytes) != 0) {
            double d = 0;
            for (size_t i = 0; i < bytes / sizeof(float); i++) {
                double x = (double)one.lg[s][i] - all.lg[s][i];
                d = x > d ? x : -x > d ? -x : d;
            }
            fail_msg("%s: sequence %d differs in a batch from alone by up to %g", what, s, d);
        }
        run_free(&one);
    }
    run_free(&all);
}

/* A fast engine (not exact): all together against each alone on an exact one. The two differ
 * as prefill's kernels differ from decode's, and test_forward bounds what decode's kernels (8-bit
 * activations, the mat-vec's order) do to the logits against exact products by 0.03·max|logit|
 * on the same kind of random fixture; so the fast step, which is exact products or the same
 * block products in another order, stays within that of the mat-vec. On the integer GEMM a
 * kernel-level difference of ~1e-7 relative grows through this random fixture's layers and the
 * decode steps' shared cache to ~2e-3·max|logit| (measured), well inside. */
#define FAST_BOUND 0.03
static void check_fast(kvp_model *m, int type, struct setup *su)
{
    struct run all, one;
    su->fast = true;
    run_schedule(m, su, (1u << NSEQ) - 1, &all);
    su->fast = false;
    double worst = 0, scale = 0;
    for (int s = 0; s < NSEQ; s++) {
        run_schedule(m, su, 1u << s, &one);
        assert_int_equal(one.n_items[s], all.n_items[s]);
        for (size_t i = 0; i < (size_t)all.n_items[s] * all.n_vocab; i++) {
            double d = fabs((double)one.lg[s][i] - all.lg[s][i]);
            worst = d > worst ? d : worst;
            scale = fabs(one.lg[s][i]) > scale ? fabs(one.lg[s][i]) : scale;
        }
        run_free(&one);
    }
    run_free(&all);
    double bound = FAST_BOUND * scale;
    print_message("fast steps, type %d: |batch - alone| %.3g, bound %.3g\n", type, worst, bound);
    assert_true(worst <= bound);
}

/* ---- fixtures ---------------------------------------------------------------------------- */

static kvp_model *fixture(int type, char **path)
{
    /* n_embd and n_ff multiples of 256 so the K-quants apply; head_dim 64 as real models */
    struct kvp_test_model_spec sp = {.n_vocab = 96, .n_embd = 256, .n_layer = 4, .n_head = 4,
                                     .n_head_kv = 2, .n_ff = 256, .n_ctx = 512, .type = type,
                                     .embd_type = type, .tied = 1, .seed = 31};
    return kvp_test_model(&sp, path);
}

static void fixture_close(kvp_model *m, char *path)
{
    kvp_test_model_free(m, path);
}

static char *scratch_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    char *d = malloc(4096);
    snprintf(d, 4096, "%s/kvpbatchXXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(d));
    return d;
}

/* A budget well under the context so the policies select and evict. */
static struct kvp_policy_params policy(const char *name)
{
    return (struct kvp_policy_params){.name = name, .budget = 48, .sink = 4, .local = 8,
                                      .window = 8, .dense_layers = 1, .chunk = 4,
                                      .tail_tokens = 8};
}

/* ---- tests ------------------------------------------------------------------------------- */

/* Every weight type family: float, the integer GEMM's Q8_0, a K-quant; two threads. */
static void test_weight_types(void **state)
{
    (void)state;
    const int types[] = {KVP_TYPE_F32, KVP_TYPE_Q8_0, KVP_TYPE_Q4_0, KVP_TYPE_Q4_K,
                         KVP_TYPE_Q6_K};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        char *path;
        kvp_model *m = fixture(types[t], &path);
        struct setup su = {.cp = {.n_ctx = 512}, .n_threads = 2};
        char what[64];
        snprintf(what, sizeof(what), "weights type %d, dense", types[t]);
        check_setup(m, &su, what);
        fixture_close(m, path);
    }
}

/* Many sequences decoding together on a fast engine (enough single tokens for every weight
 * type's batch path) against each alone on an exact one, within check_fast's bounds. */
static void check_many(kvp_model *m, int type)
{
    enum { NS = 40, NP = 6, ND = 4 };
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    size_t nv = (size_t)in.n_vocab;
    struct kvp_err err = {0};
    float *lg[2];
    for (int fast = 1; fast >= 0; fast--) {
        lg[fast] = calloc((size_t)NS * ND * nv, sizeof(float));
        kvp_engine *e = NULL;
        struct kvp_engine_params ep = {.n_threads = 2, .n_ctx = 64, .exact = !fast};
        assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
        kvp_seq *sq[NS];
        int32_t toks[NS][NP + ND];
        for (int s = 0; s < NS; s++) {
            assert_int_equal(kvp_seq_init(e, NULL, &sq[s], &err), 0);
            for (int i = 0; i < NP + ND; i++)
                toks[s][i] = token_of(s, i, in.n_vocab);
            struct kvp_batch_item it = {.seq = sq[s], .tokens = toks[s], .n = NP};
            assert_int_equal(kvp_batch_eval(e, &it, 1, &err), 0);
        }
        for (int i = 0; i < ND; i++) {
            struct kvp_batch_item it[NS];
            for (int s = 0; s < NS; s++)
                it[s] = (struct kvp_batch_item){.seq = sq[s], .tokens = toks[s] + NP + i, .n = 1,
                                                .logits = lg[fast] + ((size_t)s * ND + i) * nv};
            /* fast: all in one step; exact: one at a time (alone) */
            for (int s = 0; s < NS; s += fast ? NS : 1)
                assert_int_equal(kvp_batch_eval(e, it + s, fast ? NS : 1, &err), 0);
        }
        for (int s = 0; s < NS; s++)
            kvp_ctx_free(sq[s]);
        kvp_engine_free(e);
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < (size_t)NS * ND * nv; i++) {
        worst = fmax(worst, fabs((double)lg[0][i] - lg[1][i]));
        scale = fmax(scale, fabs(lg[0][i]));
    }
    double bound = FAST_BOUND * scale;
    print_message("%d sequences together, type %d: |batch - alone| %.3g, bound %.3g\n", NS, type,
                  worst, bound);
    assert_true(worst <= bound);
    free(lg[0]), free(lg[1]);
}

/* Fast engines, dense, for the integer GEMM's type, a K-quant and the other types whose weights
 * a fast engine packs in lanes. */
static void test_fast_steps(void **state)
{
    (void)state;
    const int types[] = {KVP_TYPE_Q8_0, KVP_TYPE_Q4_K, KVP_TYPE_Q5_0, KVP_TYPE_Q4_0};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        char *path;
        kvp_model *m = fixture(types[t], &path);
        struct setup su = {.cp = {.n_ctx = 512}, .n_threads = 2};
        check_fast(m, types[t], &su);
        check_many(m, types[t]);
        fixture_close(m, path);
    }
}

/* Every registered policy that needs no file of its own, untiered, one and two threads. */
static void test_policies(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    for (int k = 0; kvp_policy_registry[k]; k++) {
        if (kvp_policy_registry[k]->needs_aux)
            continue;
        for (int nt = 1; nt <= 2; nt++) {
            struct setup su = {.cp = {.n_ctx = 512}, .pp = policy(kvp_policy_registry[k]->name),
                               .has_policy = true, .n_threads = nt};
            char what[96];
            snprintf(what, sizeof(what), "policy %s, %d threads", su.pp.name, nt);
            check_setup(m, &su, what);
        }
    }
    fixture_close(m, path);
}

/* The policies that need a trained file, on the shipped model they were trained for. */
static void test_aux_policies(void **state)
{
    (void)state;
    const char *src = getenv("KVP_SOURCE_DIR");
    char path[4096], aux[4096];
    snprintf(path, sizeof(path), "%s/models/kvpred-default.gguf", src ? src : ".");
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    if (kvp_model_open(path, NULL, &m, &err) < 0) {
        char what[4700];
        snprintf(what, sizeof(what), "%s: %s", path, err.msg);
        kvp_test_skip_missing(what);
    }
    for (int k = 0; kvp_policy_registry[k]; k++) {
        const struct kvp_policy_ops *ops = kvp_policy_registry[k];
        if (!ops->needs_aux)
            continue;
        const char *ext = !strcmp(ops->name, "qpredictor") ? "qkvpp" : "kvpp";
        snprintf(aux, sizeof(aux), "%s/models/kvpred-default.%s", src ? src : ".", ext);
        struct setup su = {.cp = {.n_ctx = 512}, .pp = policy(ops->name), .has_policy = true,
                           .n_threads = 2};
        su.pp.aux_path = aux;
        char what[96];
        snprintf(what, sizeof(what), "policy %s (shipped model)", ops->name);
        check_setup(m, &su, what);
    }
    kvp_model_close(m);
}

/* Every KV element type, dense and with quest. */
static void test_kv_types(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    for (int kt = KVP_KV_F32; kt < KVP_KV_COUNT; kt++)
        for (int pol = 0; pol < 2; pol++) {
            struct setup su = {.cp = {.n_ctx = 512, .type_k = kt, .type_v = kt},
                               .pp = policy("quest"), .has_policy = pol == 1, .n_threads = 2};
            char what[96];
            snprintf(what, sizeof(what), "KV %s, %s", kvp_kv_type_name(kt),
                     pol ? "quest" : "dense");
            check_setup(m, &su, what);
        }
    fixture_close(m, path);
}

/* The RAM and disk tiers with every policy they accept (a tiered store refuses evicting ones),
 * each sequence with its own store. Redis is left to test_redis (it needs a server). */
static void test_tiers(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    char *dir = scratch_dir();
    const int tiers[] = {KVP_TIER_RAM, KVP_TIER_DISK};
    for (int t = 0; t < 2; t++)
        for (int k = 0; kvp_policy_registry[k]; k++) {
            const struct kvp_policy_ops *ops = kvp_policy_registry[k];
            if (ops->needs_aux || ops->evicting)
                continue;
            struct setup su = {.cp = {.n_ctx = 512, .kv_tier = tiers[t], .kv_dir = dir,
                                      .prefetch = KVP_PREFETCH_TOKEN, .kv_ring = &by_syscall},
                               .pp = policy(ops->name), .has_policy = true, .n_threads = 2};
            char what[96];
            snprintf(what, sizeof(what), "tier %d, policy %s", tiers[t], ops->name);
            check_setup(m, &su, what);
        }
    rmdir(dir);
    free(dir);
    fixture_close(m, path);
}

/* Sequences with different policies in one step (dense and sparse layers, evicting and not),
 * some on the disk tier beside untiered ones, on 2 and 3 threads (2 KV heads: the pairs of
 * (sequence, KV head) do not divide among 3): the untiered single tokens of a step share one
 * work queue (kv_step.c, kvp_kv_step), so this is where one sequence could disturb another. */
static void test_mixed(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    char *dir = scratch_dir();
    for (int nt = 2; nt <= 3; nt++)
        for (int tiered = 0; tiered < 2; tiered++) {
            struct setup su = {.cp = {.n_ctx = 512, .kv_dir = dir, .prefetch = KVP_PREFETCH_TOKEN,
                                      .kv_ring = &by_syscall},
                               .n_threads = nt, .has_mix = true,
                               .mix = {"quest", NULL, tiered ? "quest" : "streaming", "quest"},
                               .disk = tiered ? 0x6u : 0};
            char what[96];
            snprintf(what, sizeof(what), "mixed policies, %s, %d threads",
                     tiered ? "two on disk" : "untiered", nt);
            check_setup(m, &su, what);
        }
    rmdir(dir);
    free(dir);
    fixture_close(m, path);
}

/* A lone context's kvp_eval and a sequence's steps: the same logits (the same pass). */
static void test_eval_matches_steps(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    enum { NP = 70, ND = 5 };
    int32_t ids[NP + ND];
    for (int i = 0; i < NP + ND; i++)
        ids[i] = token_of(0, i, in.n_vocab);
    size_t nv = (size_t)in.n_vocab;
    float *a = calloc((ND + 1) * nv, sizeof(float)), *b = calloc((ND + 1) * nv, sizeof(float));
    kvp_ctx *c = NULL;
    struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 2};
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    assert_int_equal(kvp_eval(c, ids, NP, a, false, &err), 0);
    for (int i = 0; i < ND; i++)
        assert_int_equal(kvp_eval(c, ids + NP + i, 1, a + (i + 1) * nv, false, &err), 0);
    kvp_ctx_free(c);
    kvp_engine *e = NULL;
    struct kvp_engine_params ep = {.n_threads = 2, .n_ctx = 256};
    assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
    kvp_seq *s = NULL;
    assert_int_equal(kvp_seq_init(e, &(struct kvp_ctx_params){0}, &s, &err), 0);
    struct kvp_batch_item it = {.seq = s, .tokens = ids, .n = NP, .logits = b};
    assert_int_equal(kvp_batch_eval(e, &it, 1, &err), 0);
    for (int i = 0; i < ND; i++) {
        it = (struct kvp_batch_item){.seq = s, .tokens = ids + NP + i, .n = 1,
                                     .logits = b + (i + 1) * nv};
        assert_int_equal(kvp_batch_eval(e, &it, 1, &err), 0);
    }
    assert_memory_equal(a, b, (ND + 1) * nv * sizeof(float));
    assert_int_equal(kvp_ctx_n_tokens(s), NP + ND);
    kvp_ctx_free(s);
    kvp_engine_free(e);
    free(a), free(b);
    fixture_close(m, path);
}

/* Two questions about one document: the prefix prefilled once and forked (or copied), then each
 * question appended in one step, against each question after prefilling the prefix again. */
static void check_fork(kvp_model *m, const struct kvp_ctx_params *cp, const char *pol,
                       bool use_copy, char *what)
{
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    enum { NP = 90, NQ = 12, ND = 6 };
    size_t nv = (size_t)in.n_vocab;
    int32_t doc[NP], q[2][NQ + ND];
    for (int i = 0; i < NP; i++)
        doc[i] = token_of(3, i, in.n_vocab);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NQ + ND; i++)
            q[k][i] = token_of(k + 5, i, in.n_vocab);
    kvp_engine *e = NULL;
    struct kvp_engine_params ep = {.n_threads = 2, .n_ctx = cp->n_ctx, .exact = true};
    assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
    struct kvp_policy_params pp = policy(pol);
    float *got = calloc(2 * (ND + 1) * nv, sizeof(float));
    float *want = calloc(2 * (ND + 1) * nv, sizeof(float));
    /* forked: prefill once, fork, both questions in the same steps */
    kvp_seq *s[2] = {0};
    assert_int_equal(kvp_seq_init(e, cp, &s[0], &err), 0);
    assert_int_equal(kvp_ctx_set_policy(s[0], &pp, &err), 0);
    struct kvp_batch_item it[2] = {{.seq = s[0], .tokens = doc, .n = NP}};
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
    if (use_copy) {
        assert_int_equal(kvp_seq_init(e, cp, &s[1], &err), 0);
        assert_int_equal(kvp_ctx_set_policy(s[1], &pp, &err), 0);
        assert_int_equal(kvp_seq_copy(s[1], s[0], NP, &err), 0);
    } else if (kvp_seq_fork(e, s[0], &pp, &s[1], &err) < 0) {
        fail_msg("%s: fork: %s", what, err.msg);
    }
    assert_int_equal(kvp_ctx_n_tokens(s[1]), NP);
    for (int st = 0; st <= ND; st++) {
        for (int k = 0; k < 2; k++)
            it[k] = (struct kvp_batch_item){.seq = s[k], .tokens = st ? q[k] + NQ + st - 1 : q[k],
                                            .n = st ? 1 : NQ,
                                            .logits = got + ((size_t)k * (ND + 1) + st) * nv};
        if (kvp_batch_eval(e, it, 2, &err) < 0)
            fail_msg("%s: %s", what, err.msg);
    }
    kvp_ctx_free(s[0]);
    kvp_ctx_free(s[1]);
    /* the reference: each question after its own prefill of the document */
    for (int k = 0; k < 2; k++) {
        kvp_seq *r = NULL;
        assert_int_equal(kvp_seq_init(e, cp, &r, &err), 0);
        assert_int_equal(kvp_ctx_set_policy(r, &pp, &err), 0);
        it[0] = (struct kvp_batch_item){.seq = r, .tokens = doc, .n = NP};
        assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
        for (int st = 0; st <= ND; st++) {
            it[0] = (struct kvp_batch_item){.seq = r, .tokens = st ? q[k] + NQ + st - 1 : q[k],
                                            .n = st ? 1 : NQ,
                                            .logits = want + ((size_t)k * (ND + 1) + st) * nv};
            assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
        }
        kvp_ctx_free(r);
    }
    if (memcmp(got, want, 2 * (ND + 1) * nv * sizeof(float)) != 0)
        fail_msg("%s: the forked questions' logits differ from prefilling again", what);
    free(got), free(want);
    kvp_engine_free(e);
}

static void test_fork_and_copy(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    char *dir = scratch_dir();
    const char *pols[] = {"full", "quest", "random", "oracle"};
    const int tiers[] = {KVP_TIER_NONE, KVP_TIER_RAM, KVP_TIER_DISK};
    for (int t = 0; t < 3; t++)
        for (size_t p = 0; p < sizeof(pols) / sizeof(pols[0]); p++)
            for (int cp_ = 0; cp_ < 2; cp_++) {
                /* a hot tier of two blocks: most of the copied prefix lives cold */
                struct kvp_ctx_params cp = {.n_ctx = 256, .kv_tier = tiers[t], .kv_dir = dir,
                                            .kv_ring = &by_syscall,
                                            .hot_budget = tiers[t] ? 32 : 0};
                char what[96];
                snprintf(what, sizeof(what), "%s, tier %d, %s", cp_ ? "copy" : "fork", tiers[t],
                         pols[p]);
                check_fork(m, &cp, pols[p], cp_ == 1, what);
            }
    /* an evicting policy's state is not in its keys and values: refused, by name */
    struct kvp_err err = {0};
    kvp_engine *e = NULL;
    assert_int_equal(kvp_engine_init(m, &(struct kvp_engine_params){.n_ctx = 256}, &e, &err), 0);
    kvp_seq *a = NULL, *b = NULL;
    assert_int_equal(kvp_seq_init(e, NULL, &a, &err), 0);
    struct kvp_policy_params pp = policy("snapkv");
    assert_int_equal(kvp_ctx_set_policy(a, &pp, &err), 0);
    int32_t ids[20] = {1, 2, 3};
    assert_int_equal(kvp_eval(a, ids, 20, NULL, false, &err), 0);
    assert_int_equal(kvp_seq_fork(e, a, &pp, &b, &err), KVP_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "snapkv"));
    assert_null(b);
    kvp_ctx_free(a);
    kvp_engine_free(e);
    rmdir(dir);
    free(dir);
    fixture_close(m, path);
}

/* Truncate and the KV byte counts: a truncated sequence continues as if it had only ever held
 * the first n tokens; a tiered sequence reports its cold bytes. */
static void test_truncate_and_bytes(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    kvp_engine *e = NULL;
    assert_int_equal(kvp_engine_init(m, &(struct kvp_engine_params){.n_ctx = 256, .n_threads = 2},
                                     &e, &err),
                     0);
    char *dir = scratch_dir();
    kvp_seq *a = NULL, *b = NULL;
    struct kvp_ctx_params tiered = {.kv_tier = KVP_TIER_DISK, .kv_dir = dir};
    assert_int_equal(kvp_seq_init(e, NULL, &a, &err), 0);
    assert_int_equal(kvp_seq_init(e, &tiered, &b, &err), 0);
    struct kvp_policy_params pp = policy("quest");
    assert_int_equal(kvp_ctx_set_policy(b, &pp, &err), 0);
    int32_t ids[80];
    for (int i = 0; i < 80; i++)
        ids[i] = token_of(1, i, in.n_vocab);
    float *l1 = calloc(in.n_vocab, sizeof(float)), *l2 = calloc(in.n_vocab, sizeof(float));
    struct kvp_batch_item it[2] = {{.seq = a, .tokens = ids, .n = 60},
                                   {.seq = b, .tokens = ids, .n = 60}};
    assert_int_equal(kvp_batch_eval(e, it, 2, &err), 0);
    size_t res, cold;
    kvp_seq_kv_bytes(a, &res, &cold);
    assert_true(res >= 60 * kvp_kv_bytes_per_token(m, 0, 0, 0) && cold == 0);
    kvp_seq_kv_bytes(b, &res, &cold);
    assert_true(cold > 0);
    /* a: 60 tokens, truncated to 40, then 40..59 again -> the logits of 60 in one go */
    it[0] = (struct kvp_batch_item){.seq = a, .tokens = ids + 60, .n = 1, .logits = l1};
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
    kvp_ctx_truncate(a, 40);
    assert_int_equal(kvp_ctx_n_tokens(a), 40);
    it[0] = (struct kvp_batch_item){.seq = a, .tokens = ids + 40, .n = 20};
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
    it[0] = (struct kvp_batch_item){.seq = a, .tokens = ids + 60, .n = 1, .logits = l2};
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
    assert_memory_equal(l1, l2, in.n_vocab * sizeof(float));
    kvp_ctx_free(a);
    kvp_ctx_free(b);
    kvp_engine_free(e);
    rmdir(dir);
    free(dir);
    free(l1), free(l2);
    fixture_close(m, path);
}

/* A server's follow-up question: a document prefilled and answered, the answer cut off (and a
 * few of the document's tokens, inside a block), another question prefilled after what is left,
 * and decoded. quest keeps the block bounds below the cut (kvp_prefill_obs.first) instead of
 * refolding them; the logits must equal those of the same tokens prefilled in one go, untiered
 * and with most of the cache in the disk tier. */
static void test_quest_follow_up(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    char *dir = scratch_dir();
    enum { NP = 150, CUT = 139, NQ = 20, ND = 6 }; /* CUT is inside a block of 16 */
    int32_t doc[NP], q[NQ + ND], all[CUT + NQ];
    for (int i = 0; i < NP; i++)
        doc[i] = token_of(2, i, in.n_vocab);
    for (int i = 0; i < NQ + ND; i++)
        q[i] = token_of(6, i, in.n_vocab);
    memcpy(all, doc, CUT * sizeof(int32_t));
    memcpy(all + CUT, q, NQ * sizeof(int32_t));
    size_t nv = (size_t)in.n_vocab;
    float *got = calloc((ND + 1) * nv, sizeof(float)), *want = calloc((ND + 1) * nv, sizeof(float));
    const int tiers[] = {KVP_TIER_NONE, KVP_TIER_DISK};
    for (int t = 0; t < 2; t++) {
        struct kvp_ctx_params cp = {.n_ctx = 256, .kv_tier = tiers[t], .kv_dir = dir,
                                    .kv_ring = &by_syscall, .hot_budget = tiers[t] ? 32 : 0};
        kvp_engine *e = NULL;
        struct kvp_engine_params ep = {.n_threads = 2, .n_ctx = 256, .exact = true};
        assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
        struct kvp_policy_params pp = policy("quest");
        for (int ref = 0; ref < 2; ref++) {
            kvp_seq *s = NULL;
            assert_int_equal(kvp_seq_init(e, &cp, &s, &err), 0);
            assert_int_equal(kvp_ctx_set_policy(s, &pp, &err), 0);
            struct kvp_batch_item it = {.seq = s};
            if (!ref) {
                /* the document and a few answer tokens, then the cut */
                it.tokens = doc, it.n = NP;
                assert_int_equal(kvp_batch_eval(e, &it, 1, &err), 0);
                for (int i = 0; i < 4; i++) {
                    it = (struct kvp_batch_item){.seq = s, .tokens = q + i, .n = 1};
                    assert_int_equal(kvp_batch_eval(e, &it, 1, &err), 0);
                }
                kvp_ctx_truncate(s, CUT);
                it = (struct kvp_batch_item){.seq = s, .tokens = q, .n = NQ, .logits = got};
            } else {
                it = (struct kvp_batch_item){.seq = s, .tokens = all, .n = CUT + NQ,
                                             .logits = want};
            }
            if (kvp_batch_eval(e, &it, 1, &err) < 0)
                fail_msg("tier %d: %s", tiers[t], err.msg);
            float *out = ref ? want : got;
            for (int st = 1; st <= ND; st++) {
                it = (struct kvp_batch_item){.seq = s, .tokens = q + NQ + st - 1, .n = 1,
                                             .logits = out + (size_t)st * nv};
                assert_int_equal(kvp_batch_eval(e, &it, 1, &err), 0);
            }
            kvp_ctx_free(s);
        }
        if (memcmp(got, want, (ND + 1) * nv * sizeof(float)) != 0)
            fail_msg("tier %d: a follow-up after a cut differs from one prefill", tiers[t]);
        kvp_engine_free(e);
    }
    rmdir(dir);
    free(dir);
    free(got), free(want);
    fixture_close(m, path);
}

/* The logits of nd decode steps of c on tokens q, into out[nd][nv]. */
static void decode_steps(kvp_ctx *c, const int32_t *q, int nd, float *out, size_t nv)
{
    struct kvp_err err = {0};
    for (int i = 0; i < nd; i++)
        if (kvp_eval(c, q + i, 1, out + (size_t)i * nv, false, &err) < 0)
            fail_msg("decode step %d: %s", i, err.msg);
}

/* kvp_ctx_set_policy_keep: a policy attached to a filled cache (after another one decoded from it
 * and was truncated away), with the prompt's last piece evaluated again, decodes bit for bit as
 * the same policy set before the prompt; evicting policies and tiered caches are refused and
 * leave the cache as it was. */
static void test_policy_keep(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    enum { NP = 200, TAIL = 24, ND = 6 };
    int32_t doc[NP], q[ND];
    for (int i = 0; i < NP; i++)
        doc[i] = token_of(3, i, in.n_vocab);
    for (int i = 0; i < ND; i++)
        q[i] = token_of(5, i, in.n_vocab);
    const size_t nv = (size_t)in.n_vocab;
    float *got = calloc(ND * nv, sizeof(float)), *want = calloc(ND * nv, sizeof(float));
    const struct kvp_ctx_params cp = {.n_ctx = 256, .n_threads = 2};
    const char *names[] = {"quest", "oracle", "random", NULL};
    for (int k = 0; k < 4; k++) {
        struct kvp_policy_params pp = policy(names[k]);
        kvp_ctx *a = NULL, *b = NULL;
        assert_int_equal(kvp_ctx_init(m, &cp, &a, &err), 0);
        assert_int_equal(kvp_ctx_init(m, &cp, &b, &err), 0);
        /* the policy from the start, the prompt in the same two pieces */
        if (names[k])
            assert_int_equal(kvp_ctx_set_policy(a, &pp, &err), 0);
        assert_int_equal(kvp_eval(a, doc, NP - TAIL, NULL, false, &err), 0);
        assert_int_equal(kvp_eval(a, doc + NP - TAIL, TAIL, NULL, false, &err), 0);
        decode_steps(a, q, ND, want, nv);
        /* another policy decodes first, then back to the fill and this one attached */
        struct kvp_policy_params other = policy("quest");
        other.budget = 32;
        assert_int_equal(kvp_eval(b, doc, NP - TAIL, NULL, false, &err), 0);
        assert_int_equal(kvp_ctx_set_policy_keep(b, &other, &err), 0);
        assert_int_equal(kvp_eval(b, doc + NP - TAIL, TAIL, NULL, false, &err), 0);
        decode_steps(b, q + 1, ND - 1, got, nv);
        kvp_ctx_truncate(b, NP - TAIL);
        assert_int_equal(kvp_ctx_set_policy_keep(b, names[k] ? &pp : NULL, &err), 0);
        assert_int_equal(kvp_ctx_n_tokens(b), NP - TAIL);
        assert_int_equal(kvp_eval(b, doc + NP - TAIL, TAIL, NULL, false, &err), 0);
        decode_steps(b, q, ND, got, nv);
        if (memcmp(got, want, ND * nv * sizeof(float)) != 0)
            fail_msg("%s attached to a filled cache decodes otherwise than set before it",
                     names[k] ? names[k] : "no policy");
        kvp_ctx_free(a);
        kvp_ctx_free(b);
    }
    /* refusals: an evicting policy, a tiered cache; the cache stays */
    kvp_ctx *c = NULL;
    assert_int_equal(kvp_ctx_init(m, &cp, &c, &err), 0);
    assert_int_equal(kvp_eval(c, doc, NP, NULL, false, &err), 0);
    struct kvp_policy_params snap = policy("snapkv");
    assert_int_equal(kvp_ctx_set_policy_keep(c, &snap, &err), KVP_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "evicts"));
    assert_int_equal(kvp_ctx_n_tokens(c), NP);
    kvp_ctx_free(c);
    char *dir = scratch_dir();
    const struct kvp_ctx_params tp = {.n_ctx = 256, .n_threads = 1, .kv_tier = KVP_TIER_RAM,
                                      .kv_dir = dir};
    assert_int_equal(kvp_ctx_init(m, &tp, &c, &err), 0);
    assert_int_equal(kvp_eval(c, doc, 40, NULL, false, &err), 0);
    struct kvp_policy_params qp = policy("quest");
    assert_int_equal(kvp_ctx_set_policy_keep(c, &qp, &err), KVP_EUNSUPPORTED);
    assert_int_equal(kvp_ctx_n_tokens(c), 40);
    kvp_ctx_free(c);
    rmdir(dir);
    free(dir);
    free(got), free(want);
    fixture_close(m, path);
}

/* Steps that cannot run are refused whole, with one line naming the item. */
static void test_refusals(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    struct kvp_err err = {0};
    kvp_engine *e = NULL, *e2 = NULL;
    struct kvp_engine_params ep = {.n_ctx = 128, .n_batch = 32};
    assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
    assert_int_equal(kvp_engine_init(m, &ep, &e2, &err), 0);
    kvp_seq *a = NULL, *b = NULL, *other = NULL;
    assert_int_equal(kvp_seq_init(e, NULL, &a, &err), 0);
    assert_int_equal(kvp_seq_init(e, NULL, &b, &err), 0);
    assert_int_equal(kvp_seq_init(e2, NULL, &other, &err), 0);
    assert_int_equal(kvp_seq_init(e, &(struct kvp_ctx_params){.n_ctx = 129}, &(kvp_seq *){0},
                                  &err),
                     KVP_EINVAL);
    int32_t ids[40] = {0};
    ids[3] = 5000;
    struct kvp_batch_item it[2] = {{.seq = a, .tokens = ids, .n = 2},
                                   {.seq = a, .tokens = ids, .n = 1}};
    assert_int_equal(kvp_batch_eval(e, it, 2, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "same sequence"));
    it[1].seq = other;
    assert_int_equal(kvp_batch_eval(e, it, 2, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "item 1"));
    it[1] = (struct kvp_batch_item){.seq = b, .tokens = ids + 4, .n = 31};
    assert_int_equal(kvp_batch_eval(e, it, 2, &err), KVP_ERANGE); /* 33 > n_batch 32 */
    it[0].n = 4;
    it[1].n = 1;
    assert_int_equal(kvp_batch_eval(e, it, 2, &err), KVP_EINVAL); /* token 5000 */
    assert_non_null(strstr(err.msg, "item 0"));
    assert_int_equal(kvp_ctx_n_tokens(a), 0); /* nothing ran */
    /* a prompt in pieces must end where it said */
    it[0] = (struct kvp_batch_item){.seq = a, .tokens = ids, .n = 2, .prompt_rest = 5};
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), 0);
    it[0].prompt_rest = 2;
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), KVP_EINVAL);
    assert_non_null(strstr(err.msg, "prompt ends"));
    it[0] = (struct kvp_batch_item){.seq = a, .tokens = ids + 4, .n = 200};
    assert_int_equal(kvp_batch_eval(e, it, 1, &err), KVP_ERANGE);
    assert_int_equal(kvp_batch_eval(e, NULL, 0, &err), KVP_EINVAL);
    kvp_ctx_free(a);
    kvp_ctx_free(b);
    kvp_ctx_free(other);
    kvp_engine_free(e);
    kvp_engine_free(e2);
    fixture_close(m, path);
}

/* rows random rows of W's type (uniform in [-4, 4] before quantizing) into w and nv random
 * vectors prepared for it into xq; x is cols floats of scratch. */
static void random_rows(int type, int cols, int rows, int nv, uint64_t seed, float *x, uint8_t *w,
                        uint8_t *xq)
{
    const struct kvp_type_traits *tt = kvp_type_traits(type);
    size_t rb = 0, xb = kvp_matvec_xq_bytes(type, cols);
    assert_true(kvp_type_row_bytes(type, cols, &rb));
    for (int r = 0; r < rows + nv; r++) {
        for (int c = 0; c < cols; c++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            x[c] = (float)((int64_t)(seed >> 33) % 2001 - 1000) / 250.0f;
        }
        if (r < rows)
            tt->from_f32(x, w + r * rb, cols);
        else
            kvp_matvec_prepare(type, x, cols, xq + (r - rows) * xb);
    }
}

/* The multi-vector row kernels against the mat-vec one vector at a time, bit for bit, for every
 * type with one, over row counts that leave every tail (1..3 rows past whole tiles), vector
 * counts past one tile, and (32-element types) an odd number of blocks per row (the kernels'
 * one-block tail). */
static void check_multi_kernel(int type, int cols)
{
    enum { ROWS = 23, NV = 7 };
    size_t rb = 0;
    assert_true(kvp_type_row_bytes(type, cols, &rb));
    struct kvp_mat W = {.type = type, .cols = cols, .rows = ROWS, .row_bytes = rb};
    if (!kvp_matvec_has_multi(&W)) {
        print_message("type %d: no multi-vector kernel here\n", type);
        return;
    }
    size_t xb = kvp_matvec_xq_bytes(type, cols);
    uint8_t *w = malloc(ROWS * rb), *xq = malloc(NV * xb);
    float *x = malloc((size_t)cols * sizeof(float)), *ref = malloc(ROWS * sizeof(float));
    float *out = malloc(NV * ROWS * sizeof(float));
    random_rows(type, cols, ROWS, NV, 7, x, w, xq);
    W.data = w;
    for (int nv = 1; nv <= NV; nv++)
        for (int r0 = 0; r0 < 4; r0++)
            for (int r1 = r0 + 1; r1 <= ROWS; r1++) {
                const void *xp[NV];
                float *yp[NV];
                for (int j = 0; j < nv; j++) {
                    xp[j] = xq + j * xb;
                    yp[j] = out + j * ROWS;
                }
                kvp_matvec_rows_multi(&W, xp, nv, yp, r0, r1);
                for (int j = 0; j < nv; j++) {
                    kvp_matvec_rows(&W, NULL, xp[j], ref, r0, r1);
                    assert_memory_equal(ref + r0, out + j * ROWS, (size_t)(r1 - r0) * sizeof(float));
                }
            }
    free(w), free(xq), free(x), free(ref), free(out);
}

static void test_multi_kernel(void **state)
{
    (void)state;
    check_multi_kernel(KVP_TYPE_Q8_0, 96);
    check_multi_kernel(KVP_TYPE_Q4_0, 96);
    check_multi_kernel(KVP_TYPE_Q5_0, 96);
    check_multi_kernel(KVP_TYPE_Q4_K, 512);
    check_multi_kernel(KVP_TYPE_Q6_K, 512);
}

/* ---- cold reads of several sequences in flight together --------------------------------------- */

enum { NCOLD = 4, COLD_PROMPT = 150, COLD_DEC = 6, COLD_FAULT_STEP = 2 };

struct cold_run {
    float *lg;         /* [NCOLD][COLD_DEC][n_vocab] */
    int n_dec[NCOLD];  /* decode steps whose logits were written */
    int together;      /* steps in which two or more sequences read cold units */
    int lost_step;     /* the step the faulty sequence's call failed, or -1 */
    int overlapped;    /* steps in which a sequence's cold read of a layer was submitted before
                          the sequence ahead of it in the step finished waiting for that layer */
};

/* Whether b submitted a cold read of some layer before a's last wait for that layer ended
 * (the events of one step, store.h). */
static bool reads_overlap(const struct kvp_store *a, const struct kvp_store *b)
{
    const struct kvp_store_event *ea, *eb;
    int na = kvp_store_events(a, &ea), nb = kvp_store_events(b, &eb);
    for (int i = 0; i < na; i++) {
        if (ea[i].kind != KVP_EV_WAIT || ea[i].layer < 0)
            continue;
        for (int j = 0; j < nb; j++)
            if (eb[j].kind == KVP_EV_READ && eb[j].layer == ea[i].layer && eb[j].t0 < ea[i].t1)
                return true;
    }
    return false;
}

/* The sequences in mask, each with its own disk tier and a hot tier of two blocks, prefill their
 * own prompts and then decode COLD_DEC tokens in the same steps. With faulty >= 0, that
 * sequence's cold tier fails every request from step COLD_FAULT_STEP on; it is then left out of
 * the steps that follow. */
static void cold_schedule(kvp_model *m, const char *dir, int prefetch, unsigned mask, int faulty,
                          struct cold_run *r)
{
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    struct kvp_err err = {0};
    kvp_engine *e = NULL;
    struct kvp_engine_params ep = {.n_threads = 2, .n_batch = 256, .n_ctx = 256, .exact = true};
    assert_int_equal(kvp_engine_init(m, &ep, &e, &err), 0);
    struct kvp_ctx_params cp = {.n_ctx = 256, .kv_tier = KVP_TIER_DISK, .kv_dir = dir,
                                .kv_ring = &by_syscall, .hot_budget = 32,
                                .prefetch = prefetch};
    struct kvp_policy_params pp = policy("quest");
    kvp_seq *seq[NCOLD] = {0};
    int32_t toks[NCOLD][COLD_PROMPT + 8 * NCOLD + COLD_DEC];
    int np[NCOLD];
    memset(r, 0, sizeof(*r));
    r->lost_step = -1;
    r->lg = calloc((size_t)NCOLD * COLD_DEC * in.n_vocab, sizeof(float));
    assert_non_null(r->lg);
    for (int s = 0; s < NCOLD; s++) {
        if (!(mask >> s & 1))
            continue;
        np[s] = COLD_PROMPT + 8 * s; /* different lengths, different tokens */
        for (int i = 0; i < np[s] + COLD_DEC; i++)
            toks[s][i] = token_of(s, i, in.n_vocab);
        assert_int_equal(kvp_seq_init(e, &cp, &seq[s], &err), 0);
        assert_int_equal(kvp_ctx_set_policy(seq[s], &pp, &err), 0);
        struct kvp_batch_item it = {.seq = seq[s], .tokens = toks[s], .n = np[s]};
        if (kvp_batch_eval(e, &it, 1, &err) < 0)
            fail_msg("prompt %d: %s", s, err.msg);
    }
    for (int step = 0; step < COLD_DEC; step++) {
        struct kvp_batch_item items[NCOLD];
        uint64_t misses[NCOLD] = {0};
        int n = 0;
        for (int s = 0; s < NCOLD; s++) {
            if (!(mask >> s & 1) || (s == faulty && r->lost_step >= 0))
                continue;
            struct kvp_store_stats st;
            assert_int_equal(kvp_ctx_store_stats(seq[s], &st), 0);
            misses[s] = st.misses;
            if (s == faulty && step == COLD_FAULT_STEP)
                kvp_store_inject_faults(kvp_ctx_store(seq[s]), KVP_FAULT_EIO, 1, -1);
            kvp_ctx_store_timeline(seq[s], true);
            items[n++] = (struct kvp_batch_item){
                .seq = seq[s], .tokens = toks[s] + np[s] + step, .n = 1,
                .logits = r->lg + ((size_t)s * COLD_DEC + step) * in.n_vocab};
        }
        int rc = kvp_batch_eval(e, items, n, &err);
        if (rc < 0) {
            /* only the faulty sequence may fail, once, and say that its KV was lost */
            if (faulty < 0 || step != COLD_FAULT_STEP)
                fail_msg("step %d: %s", step, err.msg);
            assert_int_equal(rc, KVP_EKVLOST);
            r->lost_step = step;
            /* it refuses from now on, alone too, and nothing of it is used */
            struct kvp_batch_item it = {.seq = seq[faulty], .tokens = toks[faulty], .n = 1};
            assert_int_equal(kvp_batch_eval(e, &it, 1, &err), KVP_EKVLOST);
        }
        int reading = 0, prev = -1;
        bool overlap = false;
        for (int s = 0; s < NCOLD; s++) {
            if (!(mask >> s & 1) || (s == faulty && r->lost_step >= 0))
                continue;
            struct kvp_store_stats st;
            assert_int_equal(kvp_ctx_store_stats(seq[s], &st), 0);
            reading += st.misses > misses[s];
            r->n_dec[s]++;
            if (prev >= 0)
                overlap |= reads_overlap(kvp_ctx_store(seq[prev]), kvp_ctx_store(seq[s]));
            prev = s;
        }
        for (int s = 0; s < NCOLD; s++)
            if (seq[s])
                kvp_ctx_store_timeline(seq[s], false);
        r->together += reading >= 2;
        r->overlapped += overlap;
    }
    for (int s = 0; s < NCOLD; s++)
        kvp_ctx_free(seq[s]);
    kvp_engine_free(e);
}

/* A step of several sequences starts every sequence's cold reads of a layer before it waits for
 * any (kv_step.c, ungrouped_layers): each sequence's logits must still be those it gets alone, bit
 * for bit, in every prefetch mode; and a sequence whose cold tier fails in such a step reports
 * KVP_EKVLOST while the others' logits stay those they get alone. */
static void test_cold_reads_together(void **state)
{
    (void)state;
    char *path;
    kvp_model *m = fixture(KVP_TYPE_Q8_0, &path);
    struct kvp_model_info in;
    kvp_model_get_info(m, &in);
    char *dir = scratch_dir();
    const int modes[] = {KVP_PREFETCH_NONE, KVP_PREFETCH_LAYER, KVP_PREFETCH_TOKEN};
    const size_t per = (size_t)COLD_DEC * in.n_vocab;
    for (int k = 0; k < 3; k++)
        for (int faulty = -1; faulty < 1; faulty++) {
            struct cold_run all, one;
            cold_schedule(m, dir, modes[k], (1u << NCOLD) - 1, faulty, &all);
            /* the hot tier of two blocks makes the sequences read cold units in the same steps */
            assert_true(all.together >= COLD_DEC / 2);
            /* and a later sequence's reads were in flight before an earlier one had waited for
             * its own (one sequence after another, they would start only after) */
            assert_true(all.overlapped >= all.together / 2);
            print_message("prefetch %d, faulty %d: %d steps of %d with cold reads of several "
                          "sequences, %d with them in flight together\n",
                          modes[k], faulty, all.together, COLD_DEC, all.overlapped);
            if (faulty >= 0)
                assert_int_equal(all.lost_step, COLD_FAULT_STEP);
            for (int s = 0; s < NCOLD; s++) {
                cold_schedule(m, dir, modes[k], 1u << s, -1, &one);
                assert_int_equal(one.n_dec[s], COLD_DEC);
                /* the faulty one: the steps before its fault; the others: every step */
                int n = s == faulty ? COLD_FAULT_STEP : COLD_DEC;
                assert_int_equal(all.n_dec[s], s == faulty ? COLD_FAULT_STEP : COLD_DEC);
                if (memcmp(one.lg + s * per, all.lg + s * per,
                           (size_t)n * in.n_vocab * sizeof(float)) != 0)
                    fail_msg("prefetch %d, faulty %d: sequence %d in a batch differs from alone",
                             modes[k], faulty, s);
                free(one.lg);
            }
            free(all.lg);
        }
    rmdir(dir);
    free(dir);
    fixture_close(m, path);
}

/* The exact value (in double) of one row's dot with one prepared vector, as the kernels split it:
 * per 32-element block b, dw_b·dx_b·Σ q·x (q the code as the block's integer sum takes it) minus,
 * for Q4_K, dmin·m·dx·Σ x; and *T, the sum of the terms' magnitudes (per element), which the
 * rounding bound below scales. Decoded from the formats (docs/formats.md §4), not
 * through any kernel. */
static double exact_dot(int type, const uint8_t *row, const uint8_t *xq, int cols, double *T)
{
    double e = 0.0, t = 0.0;
    for (int b = 0; b < cols / 32; b++) {
        int q[32];
        double dw, mw = 0.0, dx;
        const int8_t *xs;
        if (type == KVP_TYPE_Q4_K) {
            const struct kvp_block_q4_k *blk = (const void *)(row + (size_t)(b / 8) * 144);
            const struct kvp_block_q8_k *xb = (const void *)(xq + (size_t)(b / 8) * 292);
            uint8_t sc[8], mn[8];
            kvp_k_scales_unpack(blk->scales, sc, mn);
            int s = b % 8;
            dw = (double)kvp_f16_to_f32(blk->d) * sc[s];
            mw = (double)kvp_f16_to_f32(blk->dmin) * mn[s];
            for (int i = 0; i < 32; i++)
                q[i] = s % 2 ? blk->qs[32 * (s / 2) + i] >> 4 : blk->qs[32 * (s / 2) + i] & 15;
            dx = xb->d;
            xs = xb->qs + 32 * s;
        } else {
            const struct kvp_block_q8_0 *xb = (const void *)(xq + (size_t)b * 34);
            dx = kvp_f16_to_f32(xb->d);
            xs = xb->qs;
            if (type == KVP_TYPE_Q8_0) {
                const struct kvp_block_q8_0 *blk = (const void *)(row + (size_t)b * 34);
                dw = kvp_f16_to_f32(blk->d);
                for (int i = 0; i < 32; i++)
                    q[i] = blk->qs[i];
            } else if (type == KVP_TYPE_Q4_0) {
                const struct kvp_block_q4_0 *blk = (const void *)(row + (size_t)b * 18);
                dw = kvp_f16_to_f32(blk->d);
                for (int i = 0; i < 16; i++) {
                    q[i] = (blk->qs[i] & 15) - 8;
                    q[i + 16] = (blk->qs[i] >> 4) - 8;
                }
            } else {
                const struct kvp_block_q5_0 *blk = (const void *)(row + (size_t)b * 22);
                uint32_t h = (uint32_t)blk->qh[0] | (uint32_t)blk->qh[1] << 8 |
                             (uint32_t)blk->qh[2] << 16 | (uint32_t)blk->qh[3] << 24;
                dw = kvp_f16_to_f32(blk->d);
                for (int i = 0; i < 16; i++) {
                    q[i] = ((blk->qs[i] & 15) | (int)((h >> i) & 1) << 4) - 16;
                    q[i + 16] = ((blk->qs[i] >> 4) | (int)((h >> (i + 16)) & 1) << 4) - 16;
                }
            }
        }
        long sqx = 0, sx = 0, aqx = 0, ax = 0;
        for (int i = 0; i < 32; i++) {
            sqx += (long)q[i] * xs[i];
            sx += xs[i];
            aqx += labs((long)q[i] * xs[i]);
            ax += labs((long)xs[i]);
        }
        e += dw * dx * (double)sqx - mw * dx * (double)sx;
        t += fabs(dw * dx) * (double)aqx + fabs(mw * dx) * (double)ax;
    }
    *T = t;
    return e;
}

/* Whether y is the dot within the rounding of a kernel whose blocks go through at most `steps`
 * float operations each (a product's scale, the convert of the exact int32 sum, the fused adds
 * of the blocks or of lane partials and their horizontal sum): the usual bound
 * γ_n = n·u / (1 - n·u), u = 2^-24, times the sum of the terms' magnitudes. */
static bool dot_within(float y, double e, double T, int steps)
{
    double u = ldexp(1.0, -24), g = steps * u / (1.0 - steps * u);
    return fabs((double)y - e) <= g * T;
}

/* The lanes kernels (weights packed once with rows in the SIMD lanes, fast steps) against the
 * exact dot and against the mat-vec one vector at a time, for every type with one, over row
 * counts with every tail of a 16-row tile, ranges that start inside a tile, vector counts past
 * one pass of 16, odd block counts and rows longer than one column chunk of 64 blocks;
 * accumulating and not; the matrix packed in two pieces, as two threads pack it. A kernel that
 * drops a block fails the check. */
static void check_lanes_kernel(int type, int cols)
{
    enum { ROWS = 37, NV = 19 };
    size_t rb = 0;
    assert_true(kvp_type_row_bytes(type, cols, &rb));
    struct kvp_mat W = {.type = type, .cols = cols, .rows = ROWS, .row_bytes = rb};
    if (!kvp_lanes_has(type)) {
        print_message("type %d: no lanes kernel in table %s\n", type, kvp_simd()->name);
        return;
    }
    size_t xb = kvp_matvec_xq_bytes(type, cols);
    uint8_t *w = malloc(ROWS * rb), *xq = malloc(NV * xb);
    float *x = malloc((size_t)cols * sizeof(float)), *ref = malloc(ROWS * sizeof(float));
    float *out = malloc(NV * ROWS * sizeof(float));
    double *e = malloc(NV * ROWS * sizeof(double)), *T = malloc(NV * ROWS * sizeof(double));
    random_rows(type, cols, ROWS, NV, 11, x, w, xq);
    W.data = w;
    struct kvp_lanes P;
    assert_int_equal(kvp_lanes_init(&P, &W), 0);
    assert_true(P.bytes == kvp_lanes_bytes(&W) && kvp_lanes_tiles(&P) == (ROWS + 15) / 16);
    kvp_lanes_pack(&P, &W, 0, 1);
    kvp_lanes_pack(&P, &W, 1, kvp_lanes_tiles(&P));
    for (int j = 0; j < NV; j++)
        for (int r = 0; r < ROWS; r++)
            e[j * ROWS + r] = exact_dot(type, w + r * rb, xq + j * xb, cols, &T[j * ROWS + r]);
    /* lanes: per block a scale product, the fused add (Q4_K: and the mins' product and add);
     * the single-vector kernels: lane partials, their adds and the horizontal sum */
    const int nb = cols / 32, lanes_steps = 2 * nb + 4, single_steps = 2 * nb + 24;
    /* each vector alone over every row: what it must get, bit for bit, in any call (exact
     * engines run decode tokens through this kernel, whatever else shares the step) */
    float *lone = malloc(NV * ROWS * sizeof(float));
    for (int j = 0; j < NV; j++) {
        const void *xp1[1] = {xq + j * xb};
        float *yp1[1] = {lone + j * ROWS};
        kvp_lanes_rows(&P, xp1, 1, yp1, 0, ROWS, false);
    }
    for (int acc = 0; acc < 2; acc++)
        for (int nv = 1; nv <= NV; nv += nv < 4 ? 1 : 5)
            for (int r0 = 0; r0 < 18; r0 += r0 ? 16 : 1) /* 0, 1, 17 */
                for (int r1 = r0 + 1; r1 <= ROWS; r1++) {
                    const void *xp[NV];
                    float *yp[NV];
                    for (int j = 0; j < nv; j++) {
                        xp[j] = xq + j * xb;
                        yp[j] = out + j * ROWS;
                        for (int r = 0; r < ROWS; r++)
                            out[j * ROWS + r] = acc ? 0.5f * (float)r : 0.0f;
                    }
                    kvp_lanes_rows(&P, xp, nv, yp, r0, r1, acc);
                    for (int j = 0; j < nv; j++) {
                        kvp_matvec_rows(&W, NULL, xp[j], ref, r0, r1);
                        for (int r = r0; r < r1; r++) {
                            /* accumulating adds the dot to 0.5·i after the sum: one rounding */
                            float y = out[j * ROWS + r - r0], base = acc ? 0.5f * (float)(r - r0)
                                                                         : 0.0f;
                            double ee = e[j * ROWS + r], tt2 = T[j * ROWS + r];
                            assert_true(dot_within(y, ee + base, tt2 + fabs(ee) + base,
                                                   lanes_steps + 1));
                            assert_true(dot_within(ref[r], ee, tt2, single_steps));
                            assert_true(y == (acc ? base + lone[j * ROWS + r]
                                                  : lone[j * ROWS + r]));
                        }
                        /* beyond r1 nothing was written */
                        for (int r = r1 - r0; r < ROWS; r++)
                            assert_true(out[j * ROWS + r] == (acc ? 0.5f * (float)r : 0.0f));
                    }
                }
    /* a planted bug: a result that lacks one block's term fails the check */
    int bad = 0;
    for (int r = 0; r < ROWS; r++) {
        const void *xp[1] = {xq};
        float y1, *yp[1] = {&y1};
        kvp_lanes_rows(&P, xp, 1, yp, r, r + 1, false);
        /* drop the first block: its exact term, from a one-block view of the row and vector */
        double t1, e1 = exact_dot(type, w + r * rb, xq, 32, &t1);
        bad += !dot_within(y1 - (float)e1, e[r], T[r], lanes_steps);
    }
    assert_true(bad > ROWS / 2);
    kvp_lanes_free(&P);
    free(w), free(xq), free(x), free(ref), free(out), free(e), free(T), free(lone);
}

static void test_lanes_kernel(void **state)
{
    (void)state;
    check_lanes_kernel(KVP_TYPE_Q8_0, 96);
    check_lanes_kernel(KVP_TYPE_Q8_0, 2144); /* 67 blocks: two column chunks */
    check_lanes_kernel(KVP_TYPE_Q4_0, 96);
    check_lanes_kernel(KVP_TYPE_Q5_0, 96);
    check_lanes_kernel(KVP_TYPE_Q5_0, 2080);
    check_lanes_kernel(KVP_TYPE_Q4_K, 512);
    check_lanes_kernel(KVP_TYPE_Q4_K, 2304); /* 72 sub-blocks: two chunks */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_eval_matches_steps), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_weight_types),       cmocka_unit_test(test_policies),
        cmocka_unit_test(test_kv_types),           cmocka_unit_test(test_tiers),
        cmocka_unit_test(test_aux_policies),       cmocka_unit_test(test_fork_and_copy),
        cmocka_unit_test(test_truncate_and_bytes), cmocka_unit_test(test_multi_kernel),
        cmocka_unit_test(test_lanes_kernel),
        cmocka_unit_test(test_fast_steps),
        cmocka_unit_test(test_quest_follow_up),    cmocka_unit_test(test_cold_reads_together),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_policy_keep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
