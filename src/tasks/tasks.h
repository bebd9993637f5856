/*
 * RULER-style retrieval tasks (docs/tasks.md §1–2): task instances, haystacks sized to a
 * token budget, prompts, the training samples built from them, and the train/eval seed contract.
 * Used by the trainer (src/train), the evaluation (src/eval), the CLI and the tests; it needs no
 * tokenizer of its own (struct kvp_task_tok, kvp_task_count_fn).
 */
#ifndef KVP_TASKS_TASKS_H
#define KVP_TASKS_TASKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/err.h"

/* The tokenizer the generator counts and encodes with, as kvp_tvocab_encode does: the tokens of
 * len bytes at text (with the SentencePiece space prefix when prefix), the first cap of them
 * written to ids (ids may be NULL with cap 0 to count), their number in *n. The trainer fills
 * it with its BPE vocabulary (kvp_tvocab_task_tok). */
struct kvp_task_tok {
    int (*encode)(const void *ud, const char *text, size_t len, bool prefix, int32_t *ids,
                  size_t cap, size_t *n, struct kvp_err *err);
    const void *ud;
};

/* One line of the noise haystack (passkey, niah_single_1). */
#define KVP_TASK_NOISE_LINE                                                                        \
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

enum kvp_task {
    KVP_TASK_LM = 0,          /* plain text */
    KVP_TASK_PASSKEY,         /* Quest passkey, noise filler */
    KVP_TASK_NIAH_SINGLE_1,   /* noise, word key, number */
    KVP_TASK_NIAH_SINGLE_2,   /* text filler, word key, number */
    KVP_TASK_NIAH_SINGLE_3,   /* text filler, word key, uuid */
    KVP_TASK_NIAH_MULTIKEY_1, /* text filler, 4 keys */
    KVP_TASK_NIAH_MULTIKEY_2, /* needle haystack, word keys, numbers */
    KVP_TASK_NIAH_MULTIKEY_3, /* needle haystack, uuid keys, uuids */
    KVP_TASK_NIAH_MULTIVALUE, /* 4 values for one key */
    KVP_TASK_NIAH_MULTIQUERY, /* 4 keys asked */
    KVP_TASK_VT,              /* variable tracking, 1 chain 4 hops */
    KVP_TASK_COPY,            /* a random list of words and numbers, then the same list again:
                                 dense in-context copying, which grows induction heads early */
    KVP_TASK_COUNT
};

const char *kvp_task_name(int task);
/* The task named by the len bytes at s (kvp_task_name's spelling), or -1. */
int kvp_task_by_name(const char *s, size_t len);

/* Corpus text prepared for sampling (kvp_corpus_init, src/tasks/corpus.c): whitespace
 * collapsed, split into sentences, each with its token count when encoded as " " + sentence.
 * Sentences [0, n_train) are for training, the rest held out for evaluation. */
struct kvp_corpus {
    char *text;          /* owned, whitespace-collapsed */
    size_t len;
    long n_sent;
    uint32_t *sent_off;  /* [n_sent + 1] byte offsets */
    uint16_t *sent_tok;  /* [n_sent] tokens of " " + sentence */
    long n_train;        /* sentences usable for training */
    char **words;        /* owned distinct lowercase words (3..10 letters) for needle keys */
    int n_words;
    int noise_tok;       /* tokens of one noise line */
    bool noise_only;     /* kvp_corpus_passkey_only's stand-in: the pass key keeps its noise line */
    struct kvp_corpus **hay; /* owned extra haystack corpora (kvp_corpus_add_hay), each its own
                                kind of prose: drawn from when kvp_task_mix.hay_frac > 0 */
    int n_hay;
};


/* The train/eval seed contract, written here only (the trainer, `kvpred trace --tasks` and
 * `kvpred eval --task` all take their seeds from it). A sample or prompt is a pure function of its
 * 64-bit seed. Training seeds keep bits 62 and 63 clear (kvp_task_seed); evaluation seeds set
 * bit 62 (kvp_task_eval_seed) and read held-out sentences only, so no evaluation sample (the
 * trainer's own evaluation, `kvpred eval --task`) can coincide with a training sample or a
 * training-range prompt (`kvpred trace --tasks`). kvp_sample_make refuses a seed of the other
 * range. */
#define KVP_EVAL_SEED_BIT (1ULL << 62)
/* A seed of the training range derived from (a, b): kvp_rng_mix with bits 62 and 63 cleared. */
uint64_t kvp_task_seed(uint64_t a, uint64_t b);
/* seed moved into the evaluation range (bit 62 set). */
uint64_t kvp_task_eval_seed(uint64_t seed);
/* Whether seed belongs to the range eval names. */
bool kvp_task_seed_ok(uint64_t seed, bool eval);

/* How training samples are drawn: probability weights per task (need not sum to 1), the share
 * of needles placed exactly at an edge of the haystack (first or last unit; the rest uniform),
 * the shortest retrieval sample as a fraction of the context (a sample takes [fill_min·T, T]
 * tokens, so fill_min near 1 trains the longest distances the evaluation asks for), and the
 * share of retrieval samples whose haystack kind is drawn uniformly among noise lines, the
 * corpus's own sentences and each of its extra haystack corpora instead of being the task's
 * own (passkey and the niah tasks with a text or noise haystack; 0 keeps every sample as it
 * was, bit for bit). */
struct kvp_task_mix {
    float w[KVP_TASK_COUNT];
    float edge_frac; /* default KVP_EDGE_FRAC_DEFAULT */
    float fill_min;  /* default KVP_FILL_MIN_DEFAULT */
    float hay_frac;  /* default 0 */
};
#define KVP_EDGE_FRAC_DEFAULT 0.125f
#define KVP_FILL_MIN_DEFAULT 0.5f
void kvp_task_mix_default(struct kvp_task_mix *mix);

/* One generated sequence of exactly T+1 tokens: BOS, the sample, EOS, then packed plain text.
 * Inputs are tok[0..T), targets tok[1..T]. weight[i] is the loss weight of target i (answer
 * tokens and the EOS after them get answer_weight). ans_begin/ans_end delimit the answer targets
 * (in target indices; equal when the sample has none). */
struct kvp_sample {
    int task;
    int T;
    int32_t *tok;    /* [T+1] */
    float *weight;   /* [T] */
    int ans_begin, ans_end;
};

int kvp_sample_alloc(struct kvp_sample *s, int T, struct kvp_err *err);
void kvp_sample_free(struct kvp_sample *s);

/* Generate the sample for (seed) deterministically: task drawn from mix (or forced when task ≥
 * 0), filler from the training sentences (eval = false) or the held-out ones (eval = true). The
 * seed must be of the range eval names (kvp_task_seed_ok; KVP_EINVAL otherwise). */
int kvp_sample_make(struct kvp_sample *s, const struct kvp_corpus *c,
                    const struct kvp_task_tok *tok, const struct kvp_task_mix *mix, int task,
                    uint64_t seed, bool eval, float answer_weight, struct kvp_err *err);

/* Text for vocabulary learning that holds the task templates the way training will show them:
 * per_task instances of every retrieval task with a two-unit haystack, prompt and answer, in a
 * malloc'd string. c may have been prepared without a vocabulary. */
int kvp_task_template_text(const struct kvp_corpus *c, int per_task, uint64_t seed, char **text,
                           size_t *len, struct kvp_err *err);

/* Render one task's prompt text and answer text (both malloc'd, NUL-terminated) for a seed, for
 * inspection and for the engine's evaluation harness to cross-check. target_tokens sizes the
 * haystack. */
int kvp_task_render(const struct kvp_corpus *c, const struct kvp_task_tok *tok, int task,
                    uint64_t seed, bool eval, int target_tokens, char **prompt, char **answer,
                    struct kvp_err *err);

/* Evaluation prompts for the model under test (`kvpred eval --task`). The filler is any corpus,
 * normally the Paul Graham essays read with kvp_corpus_read_filler and prepared with
 * kvp_corpus_init(..., NULL, 0.0, ...) so every sentence is available; lengths are counted by
 * the caller's tokenizer through count (tokens of the prompt text as the engine will feed it,
 * BOS included). Seeds: kvp_task_eval_seed (the contract above). */
typedef int (*kvp_task_count_fn)(void *ud, const char *text, size_t len, size_t *n_tok);

struct kvp_task_req {
    int task;              /* KVP_TASK_PASSKEY .. KVP_TASK_VT */
    uint64_t seed;
    int target_tokens;     /* the largest prompt that fits this many tokens */
    float depth;           /* fraction of the haystack for the answer needle(s) in [0, 1];
                              < 0: random as in training */
    bool prose;            /* passkey: the corpus's sentences as haystack (the needle on a line
                              of its own) instead of the noise line */
    kvp_task_count_fn count;
    void *ud;
};

struct kvp_task_text {
    char *prompt;  /* owned: instruction, context, question and answer prefix */
    char *answer;  /* owned: the answer text training uses (" 1234567.") */
    char *refs;    /* owned: the reference strings, each followed by '\n' */
    int n_refs;
    long n_units;  /* haystack units (sentences or lines) */
};

/* Render one evaluation prompt; *out is zeroed first and must be freed with kvp_task_text_free.
 * KVP_ERANGE when not even an empty haystack fits. */
int kvp_task_render_eval(const struct kvp_corpus *c, const struct kvp_task_req *req,
                         struct kvp_task_text *out, struct kvp_err *err);
void kvp_task_text_free(struct kvp_task_text *t);

/* Several questions on one document (`kvpred eval --task T --questions N`): one haystack holding
 * N needles with different keys at spread depths (needle k at a uniform draw within the k-th of
 * N equal slices of the haystack), and N questions, each about a different needle, asked in a
 * random order (so a question's index says nothing about its needle's depth). Tasks:
 *   passkey          N pass keys, each named by a colour ("The pass key of the red box is
 *                    71234. Remember it. 71234 is the pass key of the red box."), noise filler
 *                    (or the corpus's sentences with req->prose);
 *   niah_single_2    N needles of niah_single_2's form (word key, 7-digit number), text filler;
 *   niah_multikey_1  the same plus 3 distractor needles of other keys, never asked.
 * The head is the task's own (the single-needle wording niah_multikey_1 trained with). The
 * document (head and haystack) ends where every question begins ("
What is ..."), so a server
 * holding the document appends each question to it. target_tokens bounds the document plus its
 * longest question (tokens of req->count, BOS included), so each single question's prompt fits
 * as `eval --task` sizes one. req->depth is not used. */
#define KVP_TASK_MAX_QUESTIONS 8

struct kvp_task_multi {
    char *document;                           /* owned: head and haystack */
    int n_questions;
    char *question[KVP_TASK_MAX_QUESTIONS];   /* owned: question and answer prefix, in the order
                                                 they are asked */
    char *answer[KVP_TASK_MAX_QUESTIONS];     /* owned: the answer text training uses */
    char ref[KVP_TASK_MAX_QUESTIONS][48];     /* the reference string of each question */
    char key[KVP_TASK_MAX_QUESTIONS][48];     /* the key each question names */
    float depth[KVP_TASK_MAX_QUESTIONS];      /* the asked needle's fraction of the haystack */
    int n_needles;                            /* needles in the haystack, distractors included */
    long n_units;                             /* haystack units */
};

/* Render one multi-question document (passkey, niah_single_2 or niah_multikey_1; 1 <=
 * n_questions <= KVP_TASK_MAX_QUESTIONS); *out is zeroed first and must be freed with
 * kvp_task_multi_free. The seed must be of the evaluation range. */
int kvp_task_render_multi(const struct kvp_corpus *c, const struct kvp_task_req *req,
                          int n_questions, struct kvp_task_multi *out, struct kvp_err *err);
void kvp_task_multi_free(struct kvp_task_multi *t);

#endif
