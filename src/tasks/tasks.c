/*
 * RULER-style retrieval tasks (docs/tasks.md §1–2) and the training samples built from
 * them, one fixed-length token sequence per sample.
 *
 * Samples. A sample is [BOS] prompt answer [EOS], then [BOS] plain text [EOS]... packed to
 * exactly T+1 tokens. The prompt is the task's text with the haystack sized so the sample takes
 * a random length in [T/2, T]; it is encoded as one text with the space prefix, exactly as the
 * engine will encode an evaluation prompt, and the answer is encoded separately without a prefix,
 * as the tokens greedy decoding must produce after the prompt. Templates, needle sentences,
 * answer prefixes and the singular forms follow docs/tasks.md word for word; the passkey
 * task follows the Quest/Landmark form. Needle keys are two words of the corpus joined by "-" (the
 * RULER adjective-noun form, drawn from thousands of words so keys are copied, not memorised).
 *
 * Haystack kinds. Each task has its own haystack (noise lines, corpus sentences or distractor
 * needles); a model trained only on those learned the filler's surface as much as retrieval. So
 * a share of the samples (kvp_task_mix.hay_frac, drawn from a generator of its own so the rest
 * of a sample does not move) takes its haystack from a kind drawn uniformly among noise lines,
 * the corpus's own sentences and every extra haystack corpus (kvp_corpus_add_hay: verse, legal
 * text, quotations, technical prose, ...), each with its own held-out share for evaluation.
 * The prompt tokens of a sample whose haystack comes from an extra corpus weigh 0 in the loss:
 * the model reads such text to find the needle, but does not spend its capacity modelling it.
 *
 * The copy task (not a RULER task) is a random list of corpus words and numbers followed by a
 * newline and the same list again, as many times as it fits. Every token of a repeat can be
 * predicted only by looking back, which is the skill every retrieval task needs; in short test runs a model saw far too few
 * needle answers to discover it, so the list gives it a dense signal from the first steps.
 *
 * Tokens are counted and encoded through the caller's tokenizer (struct kvp_task_tok: the
 * trainer's BPE; kvp_task_count_fn: the model under test), so this folder needs no trainer.
 *
 * Determinism and seeds: the contract is in tasks.h (kvp_task_seed) and enforced here.
 */
#include "tasks/tasks.h"

#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "tasks/sbuf.h"

static const char *const task_names[KVP_TASK_COUNT] = {
    "lm",
    "passkey",
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "copy",
};

const char *kvp_task_name(int task)
{
    return task >= 0 && task < KVP_TASK_COUNT ? task_names[task] : "?";
}

int kvp_task_by_name(const char *s, size_t len)
{
    for (int t = 0; t < KVP_TASK_COUNT; t++)
        if (strlen(task_names[t]) == len && !strncmp(task_names[t], s, len))
            return t;
    return -1;
}

void kvp_task_mix_default(struct kvp_task_mix *mix)
{
    /* Plain text keeps the language model honest; the needle tasks carry the retrieval signal. */
    static const float w[KVP_TASK_COUNT] = {
        [KVP_TASK_LM] = 0.10f,
        [KVP_TASK_PASSKEY] = 0.14f,
        [KVP_TASK_NIAH_SINGLE_1] = 0.10f,
        [KVP_TASK_NIAH_SINGLE_2] = 0.12f,
        [KVP_TASK_NIAH_SINGLE_3] = 0.06f,
        [KVP_TASK_NIAH_MULTIKEY_1] = 0.12f,
        [KVP_TASK_NIAH_MULTIKEY_2] = 0.08f,
        [KVP_TASK_NIAH_MULTIKEY_3] = 0.05f,
        [KVP_TASK_NIAH_MULTIVALUE] = 0.08f,
        [KVP_TASK_NIAH_MULTIQUERY] = 0.08f,
        [KVP_TASK_VT] = 0.07f,
        [KVP_TASK_COPY] = 0.08f,
    };
    memcpy(mix->w, w, sizeof(w));
    mix->edge_frac = KVP_EDGE_FRAC_DEFAULT;
    mix->fill_min = KVP_FILL_MIN_DEFAULT;
    mix->hay_frac = 0.0f;
}

/* ======================================= tasks ================================================ */

/* TEXT: sentences joined by spaces; NOISE: noise lines, one per line; NEEDLE: distractor needles,
 * one per line; PASSKEY: noise lines joined by spaces with the needle on a line of its own (the
 * Landmark/Quest layout); PASSKEY_TEXT: the same layout with sentences instead of noise lines. */
enum hay_kind { HAY_TEXT, HAY_NOISE, HAY_NEEDLE, HAY_PASSKEY, HAY_PASSKEY_TEXT };

#define MAX_NEEDLES 12 /* KVP_TASK_MAX_QUESTIONS asked needles and 3 distractors */

/* Everything random about a task instance except the haystack length. */
struct task_inst {
    int task;
    int hay;                   /* enum hay_kind */
    const struct kvp_corpus *hc; /* the sentences of a text haystack */
    long sent0;                /* first haystack sentence of hc (text haystack) */
    uint64_t hay_seed;         /* distractor needles (needle haystack) */
    bool key_uuid, val_uuid;
    int n_needles;
    char needle[MAX_NEEDLES][256]; /* inserted sentences or lines, in insertion order */
    float depth[MAX_NEEDLES];      /* sorted fractions of the haystack */
    char head[1024];           /* text before the context */
    char tail[1024];           /* question and answer prefix after the context */
    char answer[320];
    bool vt;
    bool asked[MAX_NEEDLES];   /* needle i holds (part of) the answer */
    float edge_frac;           /* share of needles exactly at a haystack edge */
    char refs[16][48];         /* the reference strings string_match_all looks for */
    int n_refs;
};

static void rand_uuid(struct kvp_rng *r, char *out)
{
    static const char hx[] = "0123456789abcdef";
    int k = 0;
    for (int i = 0; i < 32; i++) {
        if (i == 8 || i == 12 || i == 16 || i == 20)
            out[k++] = '-';
        int d = (int)kvp_rng_below(r, 16);
        if (i == 12)
            d = 4;
        if (i == 16)
            d = 8 + (d & 3);
        out[k++] = hx[d];
    }
    out[k] = 0;
}

static void rand_key(const struct kvp_corpus *c, struct kvp_rng *r, bool uuid, char *out)
{
    if (uuid) {
        rand_uuid(r, out);
        return;
    }
    const char *a = c->words[kvp_rng_below(r, (uint64_t)c->n_words)];
    const char *b = c->words[kvp_rng_below(r, (uint64_t)c->n_words)];
    snprintf(out, 48, "%s-%s", a, b);
}

static void rand_value(struct kvp_rng *r, bool uuid, char *out)
{
    if (uuid)
        rand_uuid(r, out);
    else
        snprintf(out, 48, "%d", 1000000 + (int)kvp_rng_below(r, 9000000));
}

/* "a", "a and b", "a, b, and c" (RULER's join). */
static void join_list(char *out, size_t cap, char list[][48], int n)
{
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        const char *sep = i == 0 ? "" : n == 2 ? " and " : i == n - 1 ? ", and " : ", ";
        k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "%s%s", sep, list[i]);
    }
}

/* A needle depth: uniform, except that a share edge_frac lands exactly at an edge of the haystack
 * (first or last unit). The evaluation grid puts 2 of its 5 depths there, and a uniform draw
 * almost never does: a model trained on uniform depths missed most needles at depth 0 of a
 * 2048-token prompt. */
static float sample_depth(struct kvp_rng *r, float edge_frac)
{
    float u = kvp_rng_uniform(r);
    if (kvp_rng_uniform(r) >= edge_frac)
        return u;
    return u < 0.5f ? 0.0f : 1.0f;
}

static void sorted_depths(struct kvp_rng *r, float *d, int n, float edge_frac)
{
    for (int i = 0; i < n; i++)
        d[i] = sample_depth(r, edge_frac);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && d[j] < d[j - 1]; j--) {
            float t = d[j];
            d[j] = d[j - 1];
            d[j - 1] = t;
        }
}

static void shuffle_needles(struct kvp_rng *r, struct task_inst *ti)
{
    for (int i = ti->n_needles - 1; i > 0; i--) {
        int j = (int)kvp_rng_below(r, (uint64_t)i + 1);
        char tmp[256];
        memcpy(tmp, ti->needle[i], sizeof(tmp));
        memcpy(ti->needle[i], ti->needle[j], sizeof(tmp));
        memcpy(ti->needle[j], tmp, sizeof(tmp));
        bool a = ti->asked[i];
        ti->asked[i] = ti->asked[j];
        ti->asked[j] = a;
    }
}

static void setup_niah(const struct kvp_corpus *c, struct kvp_rng *r, struct task_inst *ti)
{
    int nk = 1, nv = 1, nq = 1;
    ti->hay = HAY_TEXT;
    switch (ti->task) {
    case KVP_TASK_NIAH_SINGLE_1: ti->hay = HAY_NOISE; break;
    case KVP_TASK_NIAH_SINGLE_3: ti->val_uuid = true; break;
    case KVP_TASK_NIAH_MULTIKEY_1: nk = 4; break;
    case KVP_TASK_NIAH_MULTIKEY_2: ti->hay = HAY_NEEDLE; break;
    case KVP_TASK_NIAH_MULTIKEY_3: ti->hay = HAY_NEEDLE; ti->key_uuid = ti->val_uuid = true; break;
    case KVP_TASK_NIAH_MULTIVALUE: nv = 4; break;
    case KVP_TASK_NIAH_MULTIQUERY: nk = nq = 4; break;
    default: break;
    }
    const char *tv = ti->val_uuid ? "uuids" : "numbers";
    char keys[4][48], vals[4][4][48];
    for (int k = 0; k < nk; k++) {
        bool dup;
        do {
            rand_key(c, r, ti->key_uuid, keys[k]);
            dup = false;
            for (int j = 0; j < k; j++)
                dup |= !strcmp(keys[j], keys[k]);
        } while (dup);
        for (int v = 0; v < nv; v++)
            rand_value(r, ti->val_uuid, vals[k][v]);
    }
    ti->n_needles = 0;
    for (int k = 0; k < nk; k++)
        for (int v = 0; v < nv; v++) {
            ti->asked[ti->n_needles] = k < nq;
            /* %.47s: a key or value fills at most its 48-byte buffer, which GCC cannot see
             * through the indices (it warns of truncation on some targets) */
            snprintf(ti->needle[ti->n_needles++], sizeof(ti->needle[0]),
                     "One of the special magic %s for %.47s is: %.47s.", tv, keys[k], vals[k][v]);
        }
    shuffle_needles(r, ti);
    sorted_depths(r, ti->depth, ti->n_needles, ti->edge_frac);
    /* the queried keys: the first nq (keys are random, so any nq of them are a random choice) */
    char query[256], ans_list[16][48];
    join_list(query, sizeof(query), keys, nq);
    int na = 0;
    for (int q = 0; q < nq; q++)
        for (int v = 0; v < nv; v++)
            memcpy(ans_list[na++], vals[q][v], 48);
    for (int i = 0; i < na; i++)
        memcpy(ti->refs[i], ans_list[i], 48);
    ti->n_refs = na;
    bool single = nq * nv == 1;
    char tvs[16];
    snprintf(tvs, sizeof(tvs), "%s", tv);
    if (single)
        tvs[strlen(tvs) - 1] = 0; /* drop the final s */
    if (single)
        snprintf(ti->head, sizeof(ti->head),
                 "A special magic %s is hidden within the following text. Make sure to memorize "
                 "it. I will quiz you about the %s afterwards.\n", tvs, tvs);
    else
        snprintf(ti->head, sizeof(ti->head),
                 "Some special magic %s are hidden within the following text. Make sure to "
                 "memorize it. I will quiz you about the %s afterwards.\n", tvs, tvs);
    snprintf(ti->tail, sizeof(ti->tail),
             "\nWhat %s the special magic %s for %s mentioned in the provided text? The special "
             "magic %s for %s mentioned in the provided text %s",
             single ? "is" : "are all", tvs, query, tvs, query, single ? "is" : "are");
    char joined[256];
    join_list(joined, sizeof(joined), ans_list, na);
    snprintf(ti->answer, sizeof(ti->answer), " %s.", joined);
}

static void setup_passkey(struct kvp_rng *r, struct task_inst *ti)
{
    /* mostly 5 digits (the Landmark/Quest range), sometimes 4 to 7 */
    int nd = kvp_rng_below(r, 4) ? 5 : 4 + (int)kvp_rng_below(r, 4);
    long lo = 1;
    for (int i = 1; i < nd; i++)
        lo *= 10;
    long key = lo + (long)kvp_rng_below(r, (uint64_t)(lo * 9));
    ti->hay = HAY_PASSKEY;
    ti->n_needles = 1;
    snprintf(ti->needle[0], sizeof(ti->needle[0]), "The pass key is %ld. Remember it. %ld is the pass key.", key, key);
    ti->depth[0] = sample_depth(r, ti->edge_frac);
    snprintf(ti->head, sizeof(ti->head),
             "There is an important info hidden inside a lot of irrelevant text. Find it and "
             "memorize them. I will quiz you about the important information there.\n");
    snprintf(ti->tail, sizeof(ti->tail), "\nWhat is the pass key? The pass key is");
    snprintf(ti->answer, sizeof(ti->answer), " %ld.", key);
    snprintf(ti->refs[0], sizeof(ti->refs[0]), "%ld", key);
    ti->n_refs = 1;
    ti->asked[0] = true;
}

static void rand_name(struct kvp_rng *r, char *out)
{
    for (int i = 0; i < 5; i++)
        out[i] = (char)('A' + kvp_rng_below(r, 26));
    out[5] = 0;
}

/* One chain of 4 hops: names[0..4], value; lines into ti->needle. */
static void vt_chain(struct kvp_rng *r, struct task_inst *ti, char names[5][8], int *value)
{
    for (int i = 0; i < 5; i++) {
        bool dup;
        do {
            rand_name(r, names[i]);
            dup = false;
            for (int j = 0; j < i; j++)
                dup |= !strcmp(names[i], names[j]);
        } while (dup);
    }
    *value = 10000 + (int)kvp_rng_below(r, 90000);
    snprintf(ti->needle[0], sizeof(ti->needle[0]), "VAR %s = %d", names[0], *value);
    for (int i = 1; i < 5; i++)
        snprintf(ti->needle[i], sizeof(ti->needle[0]), "VAR %s = VAR %s ", names[i], names[i - 1]);
    ti->n_needles = 5;
}

static const char vt_head[] =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

static void vt_question(char *out, size_t cap, int value)
{
    snprintf(out, cap,
             "\nQuestion: Find all variables that are assigned the value %d in the text above. "
             "Answer: According to the chain(s) of variable assignment in the text above, 5 "
             "variables are assigned the value %d, they are: ",
             value, value);
}

static void setup_vt(struct kvp_rng *r, struct task_inst *ti)
{
    /* the solved example, with a few noise lines */
    char names[5][8];
    int value;
    vt_chain(r, ti, names, &value);
    int n_noise = 1 + (int)kvp_rng_below(r, 4);
    struct sbuf ex = {0};
    sb_str(&ex, vt_head);
    int pos[5];
    for (int i = 0; i < 5; i++)
        pos[i] = (int)kvp_rng_below(r, (uint64_t)n_noise + 1);
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && pos[j] < pos[j - 1]; j--) {
            int t = pos[j];
            pos[j] = pos[j - 1];
            pos[j - 1] = t;
        }
    int ni = 0;
    bool first = true;
    for (int l = 0; l <= n_noise; l++) {
        while (ni < 5 && pos[ni] == l) {
            sb_str(&ex, first ? "" : "\n");
            sb_str(&ex, ti->needle[ni++]);
            first = false;
        }
        if (l < n_noise) {
            sb_str(&ex, first ? "" : "\n");
            sb_str(&ex, KVP_TASK_NOISE_LINE);
            first = false;
        }
    }
    char q[512];
    vt_question(q, sizeof(q), value);
    sb_str(&ex, q);
    sb_fmt(&ex, " %s %s %s %s %s\n", names[0], names[1], names[2], names[3], names[4]);
    /* the real chain */
    vt_chain(r, ti, names, &value);
    snprintf(ti->head, sizeof(ti->head), "%s%s", ex.oom ? "" : ex.p, vt_head);
    free(ex.p);
    vt_question(ti->tail, sizeof(ti->tail), value);
    snprintf(ti->answer, sizeof(ti->answer), "%s %s %s %s %s", names[0], names[1], names[2],
             names[3], names[4]);
    sorted_depths(r, ti->depth, 5, ti->edge_frac);
    for (int i = 0; i < 5; i++) {
        snprintf(ti->refs[i], sizeof(ti->refs[i]), "%s", names[i]);
        ti->asked[i] = true;
    }
    ti->n_refs = 5;
    ti->hay = HAY_NOISE;
    ti->vt = true;
}

/* The sentences of c a sample may read: the training ones, or the held-out ones for evaluation
 * (all of them when that share is empty). */
static void sent_range(const struct kvp_corpus *c, bool eval, long *lo, long *hi)
{
    *lo = eval ? c->n_train : 0;
    *hi = eval ? c->n_sent : c->n_train;
    if (*hi - *lo < 1)
        *lo = 0, *hi = c->n_sent;
}

static void setup_task(const struct kvp_corpus *c, struct kvp_rng *r, bool eval,
                       float edge_frac, struct task_inst *ti)
{
    ti->edge_frac = edge_frac;
    long lo, hi;
    sent_range(c, eval, &lo, &hi);
    ti->hc = c;
    ti->sent0 = lo + (long)kvp_rng_below(r, (uint64_t)(hi - lo));
    ti->hay_seed = kvp_rng_next(r);
    switch (ti->task) {
    case KVP_TASK_PASSKEY: setup_passkey(r, ti); break;
    case KVP_TASK_VT: setup_vt(r, ti); break;
    case KVP_TASK_LM: ti->hay = HAY_TEXT; break;
    default: setup_niah(c, r, ti); break;
    }
}

/* Draw the haystack kind of a retrieval sample (kvp_task_mix.hay_frac), from a generator of
 * its own so that the rest of the sample stays what it was without the draw: uniformly among
 * noise lines, c's sentences and each of c's extra haystack corpora. The pass key keeps its
 * layout (the needle on a line of its own), the niah tasks theirs (the needle as a sentence or
 * a line); the needle-haystack tasks and variable tracking are left as they are. */
static void choose_haystack(const struct kvp_corpus *c, uint64_t seed, bool eval, float hay_frac,
                            struct task_inst *ti)
{
    bool passkey = ti->hay == HAY_PASSKEY;
    if (!(hay_frac > 0.0f) || ti->vt || !(passkey || ti->hay == HAY_TEXT || ti->hay == HAY_NOISE))
        return;
    struct kvp_rng r;
    kvp_rng_seed(&r, kvp_rng_mix(seed, 0x4841595354ULL)); /* "HAYST" */
    if (kvp_rng_uniform(&r) >= hay_frac)
        return;
    int kind = (int)kvp_rng_below(&r, (uint64_t)c->n_hay + 2);
    if (kind == 0) {
        ti->hay = passkey ? HAY_PASSKEY : HAY_NOISE;
        return;
    }
    ti->hc = kind == 1 ? c : c->hay[kind - 2];
    long lo, hi;
    sent_range(ti->hc, eval, &lo, &hi);
    ti->sent0 = lo + (long)kvp_rng_below(&r, (uint64_t)(hi - lo));
    ti->hay = passkey ? HAY_PASSKEY_TEXT : HAY_TEXT;
}

/* The context of n haystack units with the needles inserted at their depths. */
static void build_context(const struct kvp_corpus *c, const struct task_inst *ti, long n,
                          bool eval, struct sbuf *b)
{
    long lo, hi;
    sent_range(ti->hc, eval, &lo, &hi);
    struct kvp_rng hr;
    kvp_rng_seed(&hr, ti->hay_seed);
    bool pk = ti->hay == HAY_PASSKEY || ti->hay == HAY_PASSKEY_TEXT;
    const char *sep = ti->hay == HAY_TEXT || pk ? " " : "\n";
    int ni = 0;
    bool first = true;
    for (long u = 0; u <= n; u++) {
        while (ni < ti->n_needles && (long)(ti->depth[ni] * (float)n) <= u) {
            if (pk) {
                sb_str(b, "\n");
                sb_str(b, ti->needle[ni++]);
                sb_str(b, "\n");
                first = true;
                continue;
            }
            sb_str(b, first ? "" : sep);
            sb_str(b, ti->needle[ni++]);
            first = false;
        }
        if (u == n)
            break;
        sb_str(b, first ? "" : sep);
        first = false;
        if (ti->hay == HAY_NOISE || ti->hay == HAY_PASSKEY) {
            sb_str(b, KVP_TASK_NOISE_LINE);
        } else if (ti->hay == HAY_NEEDLE) {
            char k[48], v[48];
            rand_key(c, &hr, ti->key_uuid, k);
            rand_value(&hr, ti->val_uuid, v);
            sb_fmt(b, "One of the special magic %s for %s is: %s.", ti->val_uuid ? "uuids" : "numbers", k, v);
        } else {
            const struct kvp_corpus *h = ti->hc;
            long s = lo + (ti->sent0 - lo + u) % (hi - lo);
            size_t off = h->sent_off[s], end = h->sent_off[s + 1] - 1;
            sb_add(b, h->text + off, end - off);
        }
    }
}

static void build_prompt(const struct kvp_corpus *c, const struct task_inst *ti, long n,
                         bool eval, struct sbuf *b)
{
    b->n = 0;
    if (b->p)
        b->p[0] = 0;
    sb_str(b, ti->head);
    build_context(c, ti, n, eval, b);
    sb_str(b, ti->tail);
}

/* Counts the tokens of a prompt: the trainer's vocabulary, or the caller's tokenizer (the model
 * under test, for evaluation). */
struct tok_counter {
    const struct kvp_task_tok *tok; /* borrowed; used when count is NULL */
    kvp_task_count_fn count;
    void *ud;
};

static long prompt_tokens(const struct kvp_corpus *c, const struct tok_counter *tc,
                          const struct task_inst *ti, long n, bool eval, struct sbuf *b)
{
    build_prompt(c, ti, n, eval, b);
    if (b->oom)
        return -1;
    size_t cnt = 0;
    if (tc->count) {
        if (tc->count(tc->ud, b->p, b->n, &cnt) < 0)
            return -1;
    } else {
        tc->tok->encode(tc->tok->ud, b->p, b->n, true, NULL, 0, &cnt, NULL);
    }
    return (long)cnt;
}

/* Largest haystack (in units) whose prompt fits in budget tokens; -1 if not even an empty one. */
static long fit_haystack(const struct kvp_corpus *c, const struct tok_counter *v,
                         const struct task_inst *ti, long budget, bool eval, struct sbuf *b)
{
    long t0 = prompt_tokens(c, v, ti, 0, eval, b);
    if (t0 < 0 || t0 > budget)
        return -1;
    double per;
    if (ti->hay == HAY_TEXT || ti->hay == HAY_PASSKEY_TEXT) {
        long lo, hi;
        sent_range(ti->hc, eval, &lo, &hi);
        double sum = 0;
        int k = 0;
        for (long s = ti->sent0; s < hi && k < 64; s++, k++)
            sum += ti->hc->sent_tok[s];
        per = k ? sum / k : 20.0;
    } else if (ti->hay == HAY_NOISE || ti->hay == HAY_PASSKEY) {
        per = c->noise_tok;
    } else {
        per = ti->key_uuid ? 60.0 : 22.0;
    }
    if (per < 1.0)
        per = 1.0;
    long n = (long)((double)(budget - t0) / per);
    long best = 0; /* largest n known to fit */
    for (int iter = 0; iter < 8 && n > best; iter++) {
        long t = prompt_tokens(c, v, ti, n, eval, b);
        if (t < 0)
            return -1;
        per = t > t0 ? (double)(t - t0) / (double)n : per; /* measured tokens per unit */
        if (t <= budget) {
            best = n;
            if ((double)(budget - t) < per)
                return n;
            n += (long)((double)(budget - t) / per);
        } else {
            n -= (long)((double)(t - budget) / per) + 1;
        }
    }
    n = best;
    while (n > 0 && prompt_tokens(c, v, ti, n, eval, b) > budget)
        n--;
    return n < 0 ? 0 : n;
}

/* The copy task's list: items (corpus words, 2..7-digit numbers) until about n_tok tokens. */
static void copy_list(const struct kvp_corpus *c, struct kvp_rng *r, long n_tok, struct sbuf *b)
{
    long est = 0;
    while (est < n_tok) {
        if (b->n)
            sb_add(b, " ", 1);
        if (kvp_rng_below(r, 4) == 0) {
            int nd = 2 + (int)kvp_rng_below(r, 6);
            for (int i = 0; i < nd; i++) {
                char d = (char)('0' + kvp_rng_below(r, 10));
                sb_add(b, &d, 1);
            }
            est += nd + 1;
        } else {
            sb_str(b, c->words[kvp_rng_below(r, (uint64_t)c->n_words)]);
            est += 2;
        }
    }
}

int kvp_task_template_text(const struct kvp_corpus *c, int per_task, uint64_t seed, char **text,
                           size_t *len, struct kvp_err *err)
{
    struct task_inst *ti = calloc(1, sizeof(*ti));
    struct sbuf all = {0}, b = {0};
    if (!ti)
        return kvp_err_set(err, KVP_ENOMEM, "task");
    for (int task = 1; task < KVP_TASK_COUNT; task++)
        for (int i = 0; i < per_task && task != KVP_TASK_COPY; i++) {
            struct kvp_rng r;
            kvp_rng_seed(&r, kvp_rng_mix(seed, (uint64_t)task * 100003u + (uint64_t)i));
            memset(ti, 0, sizeof(*ti));
            ti->task = task;
            setup_task(c, &r, false, KVP_EDGE_FRAC_DEFAULT, ti);
            build_prompt(c, ti, 2, false, &b);
            sb_add(&all, b.p ? b.p : "", b.n);
            sb_str(&all, ti->answer);
            sb_str(&all, "\n\n");
        }
    free(ti);
    free(b.p);
    if (all.oom || b.oom) {
        free(all.p);
        return kvp_err_set(err, KVP_ENOMEM, "task templates");
    }
    *text = all.p;
    *len = all.n;
    return 0;
}

int kvp_task_render(const struct kvp_corpus *c, const struct kvp_task_tok *tok, int task,
                    uint64_t seed, bool eval, int target_tokens, char **prompt, char **answer,
                    struct kvp_err *err)
{
    if (task <= KVP_TASK_LM || task >= KVP_TASK_COUNT)
        return kvp_err_set(err, KVP_EINVAL, "task %d has no prompt", task);
    struct task_inst *ti = calloc(1, sizeof(*ti));
    struct sbuf b = {0};
    if (!ti)
        return kvp_err_set(err, KVP_ENOMEM, "task");
    struct kvp_rng r;
    kvp_rng_seed(&r, seed);
    ti->task = task;
    setup_task(c, &r, eval, KVP_EDGE_FRAC_DEFAULT, ti);
    if (task == KVP_TASK_COPY) {
        copy_list(c, &r, target_tokens / 2 - 2, &b);
        *answer = b.oom ? NULL : strdup(b.p);
        sb_add(&b, "\n", 1);
    } else {
        struct tok_counter tc = {.tok = tok};
        long n = fit_haystack(c, &tc, ti, target_tokens, eval, &b);
        if (n < 0) {
            free(ti);
            free(b.p);
            return kvp_err_set(err, KVP_ERANGE, "%s does not fit in %d tokens",
                               kvp_task_name(task), target_tokens);
        }
        build_prompt(c, ti, n, eval, &b);
        *answer = strdup(ti->answer);
    }
    free(ti);
    if (b.oom || !*answer) {
        free(b.p);
        free(*answer);
        return kvp_err_set(err, KVP_ENOMEM, "task text");
    }
    *prompt = b.p;
    return 0;
}

/* Put the needles that hold the answer at fraction d of the haystack (adjacent, in their order)
 * and keep the distractors at their random depths; needles stay sorted by depth. */
static void force_depth(struct task_inst *ti, float d)
{
    for (int i = 0; i < ti->n_needles; i++)
        if (ti->asked[i])
            ti->depth[i] = d;
    for (int i = 1; i < ti->n_needles; i++)
        for (int j = i; j > 0 && ti->depth[j] < ti->depth[j - 1]; j--) {
            char tmp[256];
            float t = ti->depth[j];
            bool a = ti->asked[j];
            memcpy(tmp, ti->needle[j], sizeof(tmp));
            memcpy(ti->needle[j], ti->needle[j - 1], sizeof(tmp));
            memcpy(ti->needle[j - 1], tmp, sizeof(tmp));
            ti->depth[j] = ti->depth[j - 1];
            ti->depth[j - 1] = t;
            ti->asked[j] = ti->asked[j - 1];
            ti->asked[j - 1] = a;
        }
}

int kvp_task_render_eval(const struct kvp_corpus *c, const struct kvp_task_req *req,
                         struct kvp_task_text *out, struct kvp_err *err)
{
    memset(out, 0, sizeof(*out));
    if (req->task <= KVP_TASK_LM || req->task >= KVP_TASK_COPY || !req->count)
        return kvp_err_set(err, KVP_EINVAL, "task %d has no evaluation prompt", req->task);
    struct task_inst *ti = calloc(1, sizeof(*ti));
    struct sbuf b = {0}, refs = {0};
    if (!ti)
        return kvp_err_set(err, KVP_ENOMEM, "task");
    struct kvp_rng r;
    kvp_rng_seed(&r, req->seed);
    ti->task = req->task;
    setup_task(c, &r, true, KVP_EDGE_FRAC_DEFAULT, ti);
    if (req->prose && ti->hay == HAY_PASSKEY)
        ti->hay = HAY_PASSKEY_TEXT;
    if (req->depth >= 0.0f)
        force_depth(ti, req->depth > 1.0f ? 1.0f : req->depth);
    struct tok_counter tc = {.count = req->count, .ud = req->ud};
    long n = fit_haystack(c, &tc, ti, req->target_tokens, true, &b);
    /* fit_haystack stops within one average unit of the budget; evaluation wants the largest
     * prompt that fits, so try the next few units one by one (training keeps the plain fit so
     * its samples stay what checkpoints were trained on) */
    for (int k = 0; n >= 0 && k < 16; k++) {
        long t = prompt_tokens(c, &tc, ti, n + 1, true, &b);
        if (t < 0 || t > req->target_tokens)
            break;
        n++;
    }
    if (n < 0) {
        free(ti);
        free(b.p);
        return kvp_err_set(err, KVP_ERANGE, "%s does not fit in %d tokens",
                           kvp_task_name(req->task), req->target_tokens);
    }
    build_prompt(c, ti, n, true, &b);
    for (int i = 0; i < ti->n_refs; i++) {
        sb_str(&refs, ti->refs[i]);
        sb_str(&refs, "\n");
    }
    out->prompt = b.p;
    out->answer = strdup(ti->answer);
    out->refs = refs.p;
    out->n_refs = ti->n_refs;
    out->n_units = n;
    free(ti);
    if (b.oom || refs.oom || !out->answer || !out->refs) {
        kvp_task_text_free(out);
        return kvp_err_set(err, KVP_ENOMEM, "task text");
    }
    return 0;
}

void kvp_task_text_free(struct kvp_task_text *t)
{
    if (!t)
        return;
    free(t->prompt);
    free(t->answer);
    free(t->refs);
    memset(t, 0, sizeof(*t));
}

/* =============================== several questions on one document ============================ */

/* The names of the pass keys of a multi-question document: colours the noise line never uses
 * (it says green, blue and yellow), one token or two each. */
static const char *const key_colours[KVP_TASK_MAX_QUESTIONS] = {
    "red", "orange", "purple", "silver", "golden", "pink", "brown", "white",
};

/* The needles, questions and answers of a multi-question document (kvp_task_render_multi):
 * needle k < nq is asked by question order^-1(k); the rest are distractors. Questions go into
 * out (asked order), the needles into ti sorted by depth. */
static void setup_multi(const struct kvp_corpus *c, struct kvp_rng *r, int nq,
                        struct task_inst *ti, struct kvp_task_multi *out, char quest[][320])
{
    bool pk = ti->task == KVP_TASK_PASSKEY;
    int nd = ti->task == KVP_TASK_NIAH_MULTIKEY_1 ? 3 : 0;
    char keys[MAX_NEEDLES][48], vals[MAX_NEEDLES][48];
    int colour[KVP_TASK_MAX_QUESTIONS];
    for (int i = 0; i < KVP_TASK_MAX_QUESTIONS; i++)
        colour[i] = i;
    for (int i = KVP_TASK_MAX_QUESTIONS - 1; i > 0; i--) {
        int j = (int)kvp_rng_below(r, (uint64_t)i + 1), t = colour[i];
        colour[i] = colour[j];
        colour[j] = t;
    }
    /* keys and values all distinct, so each question has exactly one needle that answers it */
    for (int k = 0; k < nq + nd; k++) {
        bool dup;
        do {
            if (pk) {
                snprintf(keys[k], sizeof(keys[k]), "%s", key_colours[colour[k]]);
                int ndig = kvp_rng_below(r, 4) ? 5 : 4 + (int)kvp_rng_below(r, 4);
                long lo = 1;
                for (int i = 1; i < ndig; i++)
                    lo *= 10;
                snprintf(vals[k], sizeof(vals[k]), "%ld",
                         lo + (long)kvp_rng_below(r, (uint64_t)(lo * 9)));
            } else {
                rand_key(c, r, false, keys[k]);
                rand_value(r, false, vals[k]);
            }
            dup = false;
            for (int j = 0; j < k; j++)
                dup |= !strcmp(keys[j], keys[k]) || !strcmp(vals[j], vals[k]) ||
                        strstr(vals[j], vals[k]) || strstr(vals[k], vals[j]);
        } while (dup);
    }
    /* depths: asked needle k within the k-th of nq equal slices, distractors anywhere */
    int owner[MAX_NEEDLES];
    ti->n_needles = nq + nd;
    for (int k = 0; k < nq + nd; k++) {
        owner[k] = k < nq ? k : -1;
        ti->depth[k] = k < nq ? ((float)k + kvp_rng_uniform(r)) / (float)nq : kvp_rng_uniform(r);
        ti->asked[k] = k < nq;
        if (pk)
            snprintf(ti->needle[k], sizeof(ti->needle[k]),
                     "The pass key of the %.15s box is %.15s. Remember it. %.15s is the pass key "
                     "of the %.15s box.", keys[k], vals[k], vals[k], keys[k]);
        else
            snprintf(ti->needle[k], sizeof(ti->needle[k]),
                     "One of the special magic numbers for %.47s is: %.47s.", keys[k], vals[k]);
    }
    for (int i = 1; i < ti->n_needles; i++)
        for (int j = i; j > 0 && ti->depth[j] < ti->depth[j - 1]; j--) {
            char tmp[256];
            memcpy(tmp, ti->needle[j], sizeof(tmp));
            memcpy(ti->needle[j], ti->needle[j - 1], sizeof(tmp));
            memcpy(ti->needle[j - 1], tmp, sizeof(tmp));
            float d = ti->depth[j];
            ti->depth[j] = ti->depth[j - 1];
            ti->depth[j - 1] = d;
            bool a = ti->asked[j];
            ti->asked[j] = ti->asked[j - 1];
            ti->asked[j - 1] = a;
            int o = owner[j];
            owner[j] = owner[j - 1];
            owner[j - 1] = o;
        }
    /* the order of the questions: a random permutation of the asked needles */
    int order[KVP_TASK_MAX_QUESTIONS];
    for (int q = 0; q < nq; q++)
        order[q] = q;
    for (int i = nq - 1; i > 0; i--) {
        int j = (int)kvp_rng_below(r, (uint64_t)i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    out->n_questions = nq;
    out->n_needles = ti->n_needles;
    for (int q = 0; q < nq; q++) {
        int k = order[q];
        for (int i = 0; i < ti->n_needles; i++)
            if (owner[i] == k)
                out->depth[q] = ti->depth[i];
        snprintf(out->ref[q], sizeof(out->ref[q]), "%s", vals[k]);
        snprintf(out->key[q], sizeof(out->key[q]), "%s", keys[k]);
        if (pk)
            snprintf(quest[q], 320, "\nWhat is the pass key of the %s box? The pass key of the %s "
                     "box is", keys[k], keys[k]);
        else
            snprintf(quest[q], 320,
                     "\nWhat is the special magic number for %s mentioned in the provided text? "
                     "The special magic number for %s mentioned in the provided text is",
                     keys[k], keys[k]);
    }
    if (pk)
        snprintf(ti->head, sizeof(ti->head),
                 "There is an important info hidden inside a lot of irrelevant text. Find it and "
                 "memorize them. I will quiz you about the important information there.\n");
    else
        snprintf(ti->head, sizeof(ti->head),
                 "A special magic number is hidden within the following text. Make sure to "
                 "memorize it. I will quiz you about the number afterwards.\n");
}

int kvp_task_render_multi(const struct kvp_corpus *c, const struct kvp_task_req *req,
                          int n_questions, struct kvp_task_multi *out, struct kvp_err *err)
{
    memset(out, 0, sizeof(*out));
    if (req->task != KVP_TASK_PASSKEY && req->task != KVP_TASK_NIAH_SINGLE_2 &&
        req->task != KVP_TASK_NIAH_MULTIKEY_1)
        return kvp_err_set(err, KVP_EINVAL, "task %s has no multi-question form",
                           kvp_task_name(req->task));
    if (n_questions < 1 || n_questions > KVP_TASK_MAX_QUESTIONS)
        return kvp_err_set(err, KVP_EINVAL, "%d questions: 1 to %d", n_questions,
                           KVP_TASK_MAX_QUESTIONS);
    if (!req->count || !kvp_task_seed_ok(req->seed, true))
        return kvp_err_set(err, KVP_EINVAL, "multi-question document: a token counter and an "
                           "evaluation seed are needed");
    if (req->task != KVP_TASK_PASSKEY && c->n_words < 2)
        return kvp_err_set(err, KVP_EINVAL, "%s needs a filler with words for its keys",
                           kvp_task_name(req->task));
    struct task_inst *ti = calloc(1, sizeof(*ti));
    char(*quest)[320] = calloc(KVP_TASK_MAX_QUESTIONS, sizeof(*quest));
    struct sbuf b = {0};
    int rc = 0;
    if (!ti || !quest) {
        rc = kvp_err_set(err, KVP_ENOMEM, "task");
        goto out;
    }
    struct kvp_rng r;
    kvp_rng_seed(&r, req->seed);
    ti->task = req->task;
    /* the haystack draws (first sentence, distractor seed) as every evaluation prompt makes them */
    setup_task(c, &r, true, KVP_EDGE_FRAC_DEFAULT, ti);
    ti->n_needles = 0;
    ti->hay = req->task == KVP_TASK_PASSKEY ? (req->prose ? HAY_PASSKEY_TEXT : HAY_PASSKEY)
                                            : HAY_TEXT;
    setup_multi(c, &r, n_questions, ti, out, quest);
    /* size the haystack with the longest question after it */
    size_t longest = 0;
    for (int q = 0; q < n_questions; q++) {
        size_t t = 0;
        if (req->count(req->ud, quest[q], strlen(quest[q]), &t) < 0) {
            rc = kvp_err_set(err, KVP_EINVAL, "cannot count the tokens of a question");
            goto out;
        }
        if (q == 0 || t > longest) {
            longest = t;
            snprintf(ti->tail, sizeof(ti->tail), "%s", quest[q]);
        }
    }
    struct tok_counter tc = {.count = req->count, .ud = req->ud};
    long n = fit_haystack(c, &tc, ti, req->target_tokens, true, &b);
    for (int k = 0; n >= 0 && k < 16; k++) { /* as kvp_task_render_eval: the largest that fits */
        long t = prompt_tokens(c, &tc, ti, n + 1, true, &b);
        if (t < 0 || t > req->target_tokens)
            break;
        n++;
    }
    if (n < 0) {
        rc = kvp_err_set(err, KVP_ERANGE, "%s with %d questions does not fit in %d tokens",
                         kvp_task_name(req->task), n_questions, req->target_tokens);
        goto out;
    }
    ti->tail[0] = 0;
    build_prompt(c, ti, n, true, &b);
    out->n_units = n;
    for (int q = 0; q < n_questions; q++) {
        char ans[64];
        snprintf(ans, sizeof(ans), " %s.", out->ref[q]);
        out->question[q] = strdup(quest[q]);
        out->answer[q] = strdup(ans);
        if (!out->question[q] || !out->answer[q])
            b.oom = true;
    }
    if (b.oom) {
        rc = kvp_err_set(err, KVP_ENOMEM, "task text");
        goto out;
    }
    out->document = b.p;
    b.p = NULL;
out:
    free(b.p);
    free(quest);
    free(ti);
    if (rc < 0)
        kvp_task_multi_free(out);
    return rc;
}

void kvp_task_multi_free(struct kvp_task_multi *t)
{
    if (!t)
        return;
    free(t->document);
    for (int q = 0; q < KVP_TASK_MAX_QUESTIONS; q++) {
        free(t->question[q]);
        free(t->answer[q]);
    }
    memset(t, 0, sizeof(*t));
}

/* ====================================== samples =============================================== */

int kvp_sample_alloc(struct kvp_sample *s, int T, struct kvp_err *err)
{
    memset(s, 0, sizeof(*s));
    s->tok = malloc(((size_t)T + 1) * sizeof(int32_t));
    s->weight = malloc((size_t)T * sizeof(float));
    if (!s->tok || !s->weight) {
        kvp_sample_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "sample of %d tokens", T);
    }
    s->T = T;
    return 0;
}

void kvp_sample_free(struct kvp_sample *s)
{
    if (!s)
        return;
    free(s->tok);
    free(s->weight);
    s->tok = NULL;
    s->weight = NULL;
}

/* Append the encoding of text to s->tok at *pos (truncating at T+1); weight w on the targets
 * that predict these tokens. */
static int put_text(struct kvp_sample *s, int *pos, const struct kvp_task_tok *tok,
                    const char *text, size_t len, bool prefix, float w, struct kvp_err *err)
{
    size_t cap = len + 8, n;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    if (!ids)
        return kvp_err_set(err, KVP_ENOMEM, "encode");
    int rc = tok->encode(tok->ud, text, len, prefix, ids, cap, &n, err);
    for (size_t i = 0; rc == 0 && i < n && *pos <= s->T; i++) {
        s->tok[*pos] = ids[i];
        if (*pos > 0)
            s->weight[*pos - 1] = w;
        (*pos)++;
    }
    free(ids);
    return rc;
}

static void put_tok(struct kvp_sample *s, int *pos, int32_t t, float w)
{
    if (*pos > s->T)
        return;
    s->tok[*pos] = t;
    if (*pos > 0)
        s->weight[*pos - 1] = w;
    (*pos)++;
}

/* Plain text from sentence `start` on until the sample is full: [BOS] text [EOS] ... */
static int put_plain(struct kvp_sample *s, int *pos, const struct kvp_corpus *c,
                     const struct kvp_task_tok *tok, uint64_t where, bool eval, struct kvp_err *err)
{
    long lo, hi;
    sent_range(c, eval, &lo, &hi);
    long start = lo + (long)(where % (uint64_t)(hi - lo));
    struct sbuf b = {0};
    while (*pos <= s->T) {
        put_tok(s, pos, 1, 1.0f);
        long need = s->T + 1 - *pos, got = 0;
        b.n = 0;
        for (long u = 0; got < need + 8 && u < hi - lo; u++) {
            long si = lo + (start - lo + u) % (hi - lo);
            size_t off = c->sent_off[si], end = c->sent_off[si + 1] - 1;
            if (b.n)
                sb_add(&b, " ", 1);
            sb_add(&b, c->text + off, end - off);
            got += c->sent_tok[si];
            start = si + 1 < hi ? si + 1 : lo;
        }
        if (b.oom) {
            free(b.p);
            return kvp_err_set(err, KVP_ENOMEM, "plain text");
        }
        int rc = put_text(s, pos, tok, b.p ? b.p : "", b.n, true, 1.0f, err);
        if (rc < 0) {
            free(b.p);
            return rc;
        }
        put_tok(s, pos, 2, 1.0f);
    }
    free(b.p);
    return 0;
}

/* [BOS] list "\n" list ["\n" list ...] [EOS]: a list of T/16..T/4 tokens repeated as often as
 * it fits in about T tokens (at least twice). Every repeat weighs `w` in the loss; the first
 * repeat is the answer (ans_begin..ans_end) that evaluation checks. */
static int put_copy(struct kvp_sample *s, int *pos, const struct kvp_corpus *c,
                    const struct kvp_task_tok *tok, struct kvp_rng *r, struct sbuf *b, float w,
                    struct kvp_err *err)
{
    int T = s->T;
    long want = T / 16 + (long)kvp_rng_below(r, (uint64_t)(T / 4 - T / 16) + 1);
    size_t n1 = 0;
    for (;;) {
        b->n = 0;
        copy_list(c, r, want, b);
        if (b->oom)
            return kvp_err_set(err, KVP_ENOMEM, "copy list");
        tok->encode(tok->ud, b->p, b->n, true, NULL, 0, &n1, NULL);
        if ((long)n1 * 2 + 4 <= T || want < 4)
            break;
        want = want * 3 / 4;
    }
    int reps = (int)((T - 2) / ((long)n1 + 1));
    if (reps < 2)
        reps = 2;
    put_tok(s, pos, 1, 1.0f);
    int rc = put_text(s, pos, tok, b->p, b->n, true, 1.0f, err);
    for (int k = 1; k < reps && rc == 0; k++) {
        rc = put_text(s, pos, tok, "\n", 1, false, 1.0f, err);
        if (k == 1)
            s->ans_begin = *pos - 1;
        if (rc == 0)
            rc = put_text(s, pos, tok, b->p, b->n, false, w, err);
        if (k == 1)
            s->ans_end = *pos - 1 > T ? T : *pos - 1;
    }
    put_tok(s, pos, 2, 1.0f);
    return rc;
}

uint64_t kvp_task_seed(uint64_t a, uint64_t b)
{
    return kvp_rng_mix(a, b) & ~(3ULL << 62);
}

uint64_t kvp_task_eval_seed(uint64_t seed)
{
    return seed | KVP_EVAL_SEED_BIT;
}

bool kvp_task_seed_ok(uint64_t seed, bool eval)
{
    return eval ? (seed & KVP_EVAL_SEED_BIT) != 0 : (seed & (3ULL << 62)) == 0;
}

int kvp_sample_make(struct kvp_sample *s, const struct kvp_corpus *c,
                    const struct kvp_task_tok *tok, const struct kvp_task_mix *mix, int task,
                    uint64_t seed, bool eval, float answer_weight, struct kvp_err *err)
{
    if (!kvp_task_seed_ok(seed, eval))
        return kvp_err_set(err, KVP_EINVAL, "sample: seed %#llx is not of the %s range",
                           (unsigned long long)seed, eval ? "evaluation" : "training");
    struct kvp_rng r;
    kvp_rng_seed(&r, seed);
    if (task < 0) {
        float tot = 0.0f;
        for (int t = 0; t < KVP_TASK_COUNT; t++)
            tot += mix->w[t] > 0.0f ? mix->w[t] : 0.0f;
        float x = kvp_rng_uniform(&r) * tot;
        task = KVP_TASK_LM;
        for (int t = 0; t < KVP_TASK_COUNT; t++) {
            float wt = mix->w[t] > 0.0f ? mix->w[t] : 0.0f;
            if (x < wt && wt > 0.0f) {
                task = t;
                break;
            }
            x -= wt;
        }
    }
    int T = s->T, pos = 0, rc = 0;
    s->task = task;
    s->ans_begin = s->ans_end = 0;
    for (int i = 0; i < T; i++)
        s->weight[i] = 1.0f;
    struct task_inst *ti = calloc(1, sizeof(*ti));
    struct sbuf b = {0};
    if (!ti)
        return kvp_err_set(err, KVP_ENOMEM, "task");
    ti->task = task;
    setup_task(c, &r, eval, mix->edge_frac, ti);
    choose_haystack(c, seed, eval, mix->hay_frac, ti);
    if (task == KVP_TASK_COPY) {
        rc = put_copy(s, &pos, c, tok, &r, &b, answer_weight, err);
        if (rc < 0)
            goto out;
    } else if (task != KVP_TASK_LM) {
        /* the sample takes [fill_min·T, T] tokens; the rest is packed plain text */
        float fm = mix->fill_min > 0.0f && mix->fill_min <= 1.0f ? mix->fill_min
                                                                 : KVP_FILL_MIN_DEFAULT;
        long lo = (long)(fm * (float)T);
        long len = lo + (long)kvp_rng_below(&r, (uint64_t)(T - lo) + 1);
        size_t n_ans;
        tok->encode(tok->ud, ti->answer, strlen(ti->answer), false, NULL, 0, &n_ans, NULL);
        long budget = len - 2 - (long)n_ans; /* BOS and EOS */
        struct tok_counter tc = {.tok = tok};
        long n = fit_haystack(c, &tc, ti, budget, eval, &b);
        if (n < 0) /* too long for the drawn length: try the whole context */
            n = fit_haystack(c, &tc, ti, T - 2 - (long)n_ans, eval, &b);
        if (n < 0) {
            s->task = task = KVP_TASK_LM; /* does not fit this context: plain text instead */
        } else {
            build_prompt(c, ti, n, eval, &b);
            if (b.oom) {
                rc = kvp_err_set(err, KVP_ENOMEM, "prompt");
                goto out;
            }
            /* a haystack of an extra corpus is read, not learnt: its tokens weigh 0, so the
             * model's small capacity stays on the --data text and the loss on the answer */
            float pw = ti->hc != c ? 0.0f : 1.0f;
            put_tok(s, &pos, 1, pw);
            if ((rc = put_text(s, &pos, tok, b.p, b.n, true, pw, err)) < 0)
                goto out;
            s->ans_begin = pos - 1;
            if ((rc = put_text(s, &pos, tok, ti->answer, strlen(ti->answer), false, answer_weight,
                               err)) < 0)
                goto out;
            s->ans_end = pos - 1;
            if (s->ans_end > T)
                s->ans_end = T;
            put_tok(s, &pos, 2, answer_weight);
        }
    }
    rc = put_plain(s, &pos, c, tok, task == KVP_TASK_LM ? (uint64_t)ti->sent0 : ti->hay_seed, eval,
                   err);
out:
    free(b.p);
    free(ti);
    return rc;
}
