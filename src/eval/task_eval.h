/*
 * The evaluation protocol of `kvpred eval --task` (RULER-style retrieval accuracy,
 * docs/tasks.md §1 and the needle grid of §2.3), in the library so the CLI only parses
 * and prints and the tests reach it directly.
 *
 * Tasks: each evaluation task names one of the task generators (src/tasks) and RULER's
 * answer length (tokens_to_generate: passkey 16, niah 128, vt 30).
 *
 * Prompts: sample i of a task at (length L, depth d) is the largest prompt (instruction,
 * haystack with the answer needle(s) at fraction d of it, question, answer prefix) whose tokens
 * in the model under test, BOS included, fit in L. Its seed is mix(mix(S, task), i) in the
 * evaluation range (kvp_task_eval_seed), so it never repeats a training sample; the same seed
 * serves every length and depth, so within a sample index only the haystack size and the
 * needle position change.
 *
 * Protocol per cell and sample: the prompt is prefilled with the run's policy attached, then
 * decoded greedily for at most the task's answer length, stopping at an end-of-generation token
 * or at the first newline after the first token; the prediction is scored by string_match_all
 * (ruler.h; for passkey the exact-number match of §2.3). Every run sees the very same prompts.
 *
 * One fill for many runs: the runs whose policy neither evicts nor decides at prompt time
 * (full, oracle, quest, qpredictor, predictor: those kvp_ctx_set_policy_keep takes) share one
 * prefill of each prompt. Its head, up to the last boundary of kvp_eval's passes at least
 * KVP_TASK_EVAL_TAIL tokens (or the largest observation window of those runs) before the end, is
 * evaluated once without a policy, as a piece of the whole prompt (kvp_eval_prompt_head: a
 * sparse prefill treats it as it treats the whole prompt); each run then truncates back to the
 * head, attaches its policy to it (kvp_ctx_set_policy_keep), evaluates the rest, so its policy
 * sees the prompt's last queries and attention rows as when set from the start, and decodes.
 * The head and the rest run the very passes of the whole prompt, and these policies leave the
 * cache as they find it, so a run's answers are bit for bit those of its own whole prefill with
 * its policy set from the start (grid.own_prefill), and those it gives alone. The other runs (snapkv, pyramidkv, h2o, streaming, catekv), every run of a
 * tiered cache or of a model with sliding-window layers (whose caches cannot go back), and every
 * run with grid.own_prefill prefill the whole prompt themselves with their policy attached.
 * The context holds L + answer length tokens (kvp_task_eval_ctx_tokens); a budget ratio such as
 * 1/16 resolves against the prompt length. A cell's figures are means over its samples
 * (seconds: the total).
 */
#ifndef KVP_EVAL_TASK_EVAL_H
#define KVP_EVAL_TASK_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"

struct kvp_corpus;
struct kvp_task_text;

/* An evaluation task: its name, the generator it uses (enum kvp_task) and its answer length. */
struct kvp_task_eval_kind {
    const char *name;
    int task;
    int max_new;
};

/* The ti-th evaluation task (kvp_task_eval_index's numbering), or NULL. */
const struct kvp_task_eval_kind *kvp_task_eval_kind(int ti);
/* Index of the evaluation task called name, or -1 (also for NULL). */
int kvp_task_eval_index(const char *name);

/* The filler corpus of task ti: path (a text file or directory) prepared whole, every sentence
 * usable; with path NULL only the pass key, whose haystack is then its own noise line (any other
 * task needs a filler: KVP_EINVAL). With a path the pass key hides in that text, on a line of
 * its own. */
int kvp_task_eval_filler(const char *path, int ti, struct kvp_corpus **out, struct kvp_err *err);

/* Tokens of text as the engine feeds a prompt (BOS included): a kvp_task_count_fn, ud the
 * model. */
int kvp_task_eval_count_tokens(void *ud, const char *text, size_t len, size_t *n_tok);

/* The prompt of sample i of task ti at length tokens (BOS included) and depth percent, for model
 * m's tokenizer, from generation seed seed. *tt must be freed with kvp_task_text_free. */
int kvp_task_eval_prompt(const struct kvp_corpus *c, const kvp_model *m, int ti, uint64_t seed,
                         long i, long length, long depth, struct kvp_task_text *tt,
                         struct kvp_err *err);

/* The answer after a prompt whose last token is prev and whose next-token logits (n_vocab floats)
 * are in logits: greedy decoding on ctx for at most max_new tokens into pred (cap bytes,
 * NUL-terminated), stopping at an end-of-generation token or at the first newline after the
 * first token (the newline left out). logits is overwritten. */
int kvp_task_eval_decode(const kvp_model *m, kvp_ctx *ctx, int32_t prev, int max_new,
                         float *logits, int n_vocab, char *pred, size_t cap, struct kvp_err *err);

/* One grid cell's figures: sums while the grid runs, then means over the samples. */
struct kvp_task_eval_cell {
    double accuracy;          /* mean string_match_all in [0, 1] */
    double exact;             /* share of samples with every reference found */
    double prompt_tokens;     /* mean prompt tokens, BOS included */
    double budget_tokens;     /* mean budget in tokens per (layer, KV head) at the prompt's
                                 length (kvp_budget_tokens); 0 for dense attention */
    double seconds;           /* wall time of the cell (all samples); a run that shares the
                                 fill: its tails and answers, without the shared heads */
    double fill_seconds;      /* a run that shares the fill: wall time of the shared heads of
                                 the cell's prompts (the same for every such run); else 0 */
    uint64_t answer_fnv;      /* FNV-1a 64 over every sample's prediction (with its NUL) and
                                 the logits of the last token evaluated for it: equal when the
                                 answers are bit for bit equal */
    double read_tokens;       /* mean tokens a decode step read per compressed (layer, KV head)
                                 through the policy's selections; full attention: the cached
                                 tokens (the prompt and half the answer, on average) */
    double kv_resident_bytes; /* mean KV bytes in the physical blocks held after the answer */
    double kv_kept_bytes;     /* mean bytes of the live tokens themselves */
};

/* One (policy, budget) pair; cells: [n_len][n_depth], zeroed by the caller. */
struct kvp_task_eval_run {
    struct kvp_policy_params pp;
    const char *label;                /* the budget as given, for messages ("all" for full) */
    struct kvp_task_eval_cell *cells;
    bool shared_fill;                 /* set by the grid: the run shared the prompts' fill */
};

/* The fewest of the prompt's last tokens that each run sharing a fill evaluates itself: the
 * default observation window of the policies that learn from the prompt's last rows. */
#define KVP_TASK_EVAL_TAIL 32

struct kvp_task_eval_grid {
    int ti;              /* the evaluation task */
    const long *lengths; /* [n_len] target lengths in tokens */
    const long *depths;  /* [n_depth] needle depths in percent */
    int n_len, n_depth;
    long samples;        /* prompts per cell */
    uint64_t seed;       /* generation seed S */
    bool own_prefill;    /* every run prefills every prompt itself (no shared fill) */
};

/* Called after every prompt (all runs done) with the prompts done and in all. */
typedef void (*kvp_task_eval_progress_fn)(void *ud, long done, long total, long length,
                                          long depth);

/* Context tokens the grid needs: the longest length plus the answer and one. */
long kvp_task_eval_ctx_tokens(const struct kvp_task_eval_grid *g);

/* Run every run on every (length, depth, sample) of g on ctx (model m, filler c). Returns 0, or
 * an error with err naming the length or the run ("streaming @ budget 64: ..."). progress may be
 * NULL. */
int kvp_task_eval_run_grid(kvp_ctx *ctx, const kvp_model *m, const struct kvp_corpus *c,
                           const struct kvp_task_eval_grid *g, struct kvp_task_eval_run *runs,
                           int n_runs, kvp_task_eval_progress_fn progress, void *ud,
                           struct kvp_err *err);

#endif
