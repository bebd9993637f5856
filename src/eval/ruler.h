/*
 * Scoring of RULER-style predictions (docs/tasks.md §1.1): the prediction is stripped and
 * every character in U+0000–U+001F becomes '\n'; string_match_all is the fraction of the reference
 * strings that occur in it, case-insensitively, as substrings. Passkey and numeric needles use the
 * same rule with one reference (§2.3 there: 1 if the number appears in the output).
 */
#ifndef KVP_EVAL_RULER_H
#define KVP_EVAL_RULER_H

#include <stddef.h>

/* Post-process pred into out (cap bytes, NUL-terminated; truncated to fit). */
void kvp_ruler_postprocess(const char *pred, char *out, size_t cap);

/* string_match_all of pred (post-processed here) against refs: n_refs strings, each followed by
 * '\n' (the kvp_task_text.refs form). Returns a score in [0, 1]; 0 when n_refs is 0. */
double kvp_ruler_match_all(const char *pred, const char *refs, int n_refs);

#endif
