/*
 * Several questions on one document (`kvpred eval --task T --questions N`): a server's reason to
 * exist is a cached document asked about again and again, and a policy that decides at prompt
 * time what to keep (SnapKV, PyramidKV, StreamingLLM, H2O, CateKV's static heads) may keep only
 * what the first question needed. This measures accuracy per question index.
 *
 * Documents: document i of a task at length L is kvp_task_render_multi's (src/tasks/tasks.h: N
 * needles with different keys at spread depths, N questions in a random order) for the seed
 * `eval --task` gives sample i (mix(mix(S, task), i) in the evaluation range); the document and
 * its longest question fit in L tokens. The document is tokenized with BOS; each question's
 * tokens are those that tokenizing document + question adds after the document's own (the
 * server tokenizes the whole text and keeps the cached prefix it shares: the document), and a
 * document whose text does not split there at a token boundary is refused (KVP_EFORMAT).
 *
 * Follow-ups (enum kvp_mq_follow_up):
 *   keep       the document is prefilled once with the policy attached (an evicting policy
 *              evicts at its end); before each question the cache is truncated back to the
 *              document (kvp_ctx_truncate: the question and answer before it are dropped, what
 *              the policy evicted stays evicted), then the question is evaluated after it and
 *              the answer decoded. This is what `kvpred serve` does with a slot's cache for the
 *              policies it keeps a prefix for (src/server/engine.c, piecewise_ok: those that
 *              neither evict nor read the prompt's attention at prefill: full, quest, oracle,
 *              random); for the others it is the cache that would save memory.
 *   recompute  every question is a prompt of its own: the policy is set again (the cache
 *              cleared) and document + question prefilled in one call. What the server does
 *              today for the policies it keeps no prefix for (evicting, or reading the prompt's
 *              attention rows or column sums at prefill: streaming, h2o, snapkv, pyramidkv,
 *              catekv, predictor, qpredictor).
 * For the policies the server keeps a prefix for, both give the same answers (tests/
 * test_multi_question.c checks it on the default model for full and quest).
 *
 * Decoding and scoring are `eval --task`'s (task_eval.h): greedy, at most the task's answer
 * length, stopping at an end-of-generation token or a newline; string_match_all against the
 * question's one reference.
 */
#ifndef KVP_EVAL_MULTI_QUESTION_H
#define KVP_EVAL_MULTI_QUESTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"
#include "tasks/tasks.h"

enum kvp_mq_follow_up { KVP_MQ_KEEP = 0, KVP_MQ_RECOMPUTE = 1 };

/* "keep" / "recompute", and back (-1 for anything else). */
const char *kvp_mq_follow_up_name(int follow_up);
int kvp_mq_follow_up_by_name(const char *name);

/* One document with its questions, tokenized for a model. */
struct kvp_mq_doc {
    struct kvp_task_multi text;
    int32_t *doc;                            /* owned [n_doc]: BOS and the document */
    int n_doc;
    int32_t *q[KVP_TASK_MAX_QUESTIONS];      /* owned: each question's tokens after the document */
    int n_q[KVP_TASK_MAX_QUESTIONS];
    int n_questions;
};

/* Document i of evaluation task ti (passkey, niah_single or niah_multikey; kvp_task_eval_index)
 * at length tokens with n_questions questions, for model m, from generation seed seed. *d must
 * be freed with kvp_mq_doc_free. */
int kvp_mq_doc_make(const struct kvp_corpus *c, const kvp_model *m, int ti, uint64_t seed, long i,
                    long length, int n_questions, struct kvp_mq_doc *d, struct kvp_err *err);
void kvp_mq_doc_free(struct kvp_mq_doc *d);

#define KVP_MQ_PRED_CAP 512

/* One question's outcome. */
struct kvp_mq_result {
    char pred[KVP_MQ_PRED_CAP]; /* the decoded answer */
    double score;               /* string_match_all in [0, 1] */
    int prefill_tokens;         /* tokens evaluated before the answer: the question alone after
                                   a kept document, else document and question */
    double read_tokens;         /* mean tokens a decode step of the answer read per compressed
                                   (layer, KV head) through the policy's selection; the cached
                                   tokens for full attention */
    size_t kv_resident, kv_kept;/* kvp_ctx_kv_bytes after the answer */
    double seconds;             /* the question's wall time (keep: the document's prefill
                                   counts in the first question's) */
};

/* Answer d's questions in their order on ctx (whose context holds the document, the longest
 * question and max_new tokens) with policy pp (NULL: full attention), set here, so the cache
 * starts empty; res[n_questions]. logits_q: NULL or [n_questions][n_vocab] for the next-token
 * logits after each question's last token. */
int kvp_mq_answer_doc(kvp_ctx *ctx, const kvp_model *m, const struct kvp_policy_params *pp,
                      const struct kvp_mq_doc *d, int follow_up, int max_new,
                      struct kvp_mq_result *res, float *logits_q, struct kvp_err *err);

/* Whether `kvpred serve` keeps a document's KV between requests for the policy ctx runs (no
 * policy: yes): the rule of src/server/engine.c (piecewise_ok), which this layer cannot call. */
bool kvp_mq_server_keeps(const kvp_ctx *ctx);

/* Figures of one (run, length, question index): sums while the grid runs, then means over the
 * documents (seconds: the total). */
struct kvp_mq_cell {
    double accuracy, exact;
    double prefill_tokens, read_tokens, budget_tokens;
    double document_tokens;
    double depth;             /* mean depth of the asked needle, fraction of the haystack */
    double kv_resident_bytes, kv_kept_bytes;
    double seconds;
};

/* One (policy, budget). cells [n_len][n_questions] and preds [n_len][docs][n_questions]
 * [KVP_MQ_PRED_CAP] (NULL: not kept) are allocated by the caller and zeroed. */
struct kvp_mq_run {
    struct kvp_policy_params pp;
    const char *label;
    struct kvp_mq_cell *cells;
    char *preds;
    bool server_keeps;        /* set by the grid: kvp_mq_server_keeps for this policy */
};

struct kvp_mq_grid {
    int ti;                   /* the evaluation task */
    const long *lengths;
    int n_len;
    long docs;                /* documents per length */
    int n_questions;
    uint64_t seed;
    int follow_up;            /* enum kvp_mq_follow_up */
};

/* Context tokens the grid needs: the longest length plus the answer and one. */
long kvp_mq_ctx_tokens(const struct kvp_mq_grid *g);

/* Called after every document (all runs done). */
typedef void (*kvp_mq_progress_fn)(void *ud, long done, long total, long length);

/* Every run on every (length, document) of g, on ctx (model m, filler c). */
int kvp_mq_run_grid(kvp_ctx *ctx, const kvp_model *m, const struct kvp_corpus *c,
                    const struct kvp_mq_grid *g, struct kvp_mq_run *runs, int n_runs,
                    kvp_mq_progress_fn progress, void *ud, struct kvp_err *err);

#endif
