/*
 * Corpora (corpus.c): the text the retrieval tasks' haystacks and the trainer's plain-text samples
 * are drawn from, read from files (plain text, JSON, JSON Lines) and split into sentences. Here,
 * below both the trainer and the evaluation, since both read corpora: training refuses
 * evaluation-only text (kvp_corpus_read), evaluation reads its filler (kvp_corpus_read_filler).
 */
#ifndef KVP_TASKS_CORPUS_H
#define KVP_TASKS_CORPUS_H

#include <stddef.h>

#include "core/err.h"
#include "tasks/tasks.h"

/* Read files (plain text) and concatenate them; fails with KVP_EINVAL for evaluation-only text:
 * a path under pg_essays, or heldout_stories.txt (also when met inside a directory). Training
 * text: mojibake punctuation is repaired (kvp_text_fix_mojibake), so a model does not learn it;
 * the evaluation's filler (kvp_corpus_read_filler) is read as it is. */
int kvp_corpus_read(const char *const *paths, int n_paths, char **text, size_t *len,
                    struct kvp_err *err);
/* Repair, in place, the mojibake of the punctuation U+2018..U+2026 read once as Windows-1252 and
 * written back as UTF-8 ("â€™" → "’", "â€œ" → "“", "â€" + a lost byte → "”", ...). Returns the
 * new length (never longer; the text is NUL-terminated again when it shrank). */
size_t kvp_text_fix_mojibake(char *text, size_t len);
/* Prepare a corpus from raw text (copied), its sentences counted with tokenizer tok (borrowed;
 * the trainer's is kvp_tvocab_task_tok; NULL: counts are estimated at 4 bytes per token).
 * holdout: fraction of sentences kept out of training. */
int kvp_corpus_init(struct kvp_corpus **out, const char *raw, size_t len,
                    const struct kvp_task_tok *tok, double holdout, struct kvp_err *err);
void kvp_corpus_free(struct kvp_corpus *c);
/* Give c an extra haystack corpus h (ownership passes to c, also on failure). Its sentences fill
 * the haystacks of retrieval samples whose kind is drawn (kvp_task_mix.hay_frac); its held-out
 * share serves evaluation samples as c's does. */
#define KVP_HAY_MAX 16
int kvp_corpus_add_hay(struct kvp_corpus *c, struct kvp_corpus *h, struct kvp_err *err);

/* Read text files or directories like kvp_corpus_read, evaluation filler allowed. */
int kvp_corpus_read_filler(const char *const *paths, int n_paths, char **text, size_t *len,
                           struct kvp_err *err);
/* The text of a .json or .jsonl file's bytes raw[0..n) (one JSON value filling them, else one
 * value per line; bytes past n are never read): every string member named "text", at any depth,
 * unescaped and followed by a blank line, appended to b. Returns how many (at least 1), or
 * KVP_EFORMAT when there is none (b unchanged) or KVP_ENOMEM; path names the file in messages.
 * kvp_corpus_read calls it for files named *.json and *.jsonl (fuzz/fuzz_corpus_json.c). */
struct sbuf;
int kvp_corpus_json_append(const char *path, const char *raw, size_t n, struct sbuf *b,
                           struct kvp_err *err);
/* A corpus for the passkey task alone, whose haystack is its own noise line: passkey prompts
 * rendered with it equal those rendered with any other filler, and need no file. */
int kvp_corpus_passkey_only(struct kvp_corpus **out, struct kvp_err *err);

#endif
