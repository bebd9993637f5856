/*
 * CateKV head profiles: the static adaptive/consistent classification of a model's KV heads
 * (docs/methods.md §2.4, "static identification"), built by voting over a reference set,
 * stored in a small text file, read back by the `catekv` policy (params.head_profile) and drawn as
 * a PNG.
 *
 * File format, version 1 (text, UTF-8/ASCII, '\n' line ends, at most 4 MiB):
 *
 *     kvpred-head-profile 1            <- magic and version: must be the first line, exactly
 *     # comment lines start with '#' and may appear anywhere after the first line
 *     model stories260K                <- header: `key value` lines, each key at most once
 *     n_layer 5                           required: n_layer, n_head_kv (1..1024), ratio [0, 1]
 *     n_head_kv 4                         optional: model (rest of the line, < 128 bytes),
 *     ratio 0.4                           n_samples, n_prompt, chunk, tail_tokens, sink, recent,
 *     ...                                 window (integers >= 0), percentile, alpha (numbers),
 *                                         n_adaptive (must equal the number of 1s below)
 *     adaptive                         <- n_layer rows of n_head_kv integers, row = layer,
 *     0 1 0 0                             column = KV head: 1 = adaptive (full KV),
 *     ...                                 0 = consistent (sparse); upstream's static encoding
 *     cv                               <- n_layer rows of n_head_kv CVs (finite, >= 0): the mean
 *     1.02 0.31 0.88 0.95                 over the reference samples
 *     ...
 *     end                              <- nothing but comments and blank lines may follow
 *
 * Unknown keys, missing or extra values, values out of range and anything after `end` are
 * KVP_EFORMAT errors naming the file and line. A profile whose shape differs from the model's is
 * rejected by the policy with KVP_EINVAL.
 */
#ifndef KVP_POLICY_CATEKV_PROFILE_H
#define KVP_POLICY_CATEKV_PROFILE_H

#include <stdint.h>

#include "core/err.h"
#include "kvpred.h"
#include "policy/policy.h"

#define KVP_HEAD_PROFILE_MAGIC     "kvpred-head-profile"
#define KVP_HEAD_PROFILE_VERSION   1
#define KVP_HEAD_PROFILE_MAX_BYTES (4u << 20)
#define KVP_HEAD_PROFILE_MAX_DIM   1024

struct kvp_head_profile {
    int n_layer;                                  /* 1..1024 */
    int n_head_kv;                                /* 1..1024 */
    double ratio;                                 /* r the mask was voted for, [0, 1] */
    char model[128];                              /* model name ("" when unknown) */
    int n_samples;                                /* reference samples voted over (0: unknown) */
    int n_prompt;                                 /* tokens per sample */
    int chunk, tail_tokens, sink, recent, window; /* classification parameters (0: unknown) */
    double percentile, alpha;
    uint8_t *adaptive; /* owned [n_layer][n_head_kv], 1 = adaptive */
    double *cv;        /* owned [n_layer][n_head_kv], mean CV over the samples */
};

/* Allocate an empty profile of the given shape (everything 0). */
int kvp_head_profile_alloc(int n_layer, int n_head_kv, struct kvp_head_profile **out,
                           struct kvp_err *err);
void kvp_head_profile_free(struct kvp_head_profile *hp);

/* Number of adaptive heads. */
int kvp_head_profile_n_adaptive(const struct kvp_head_profile *hp);

/* Read / write the format above. Read returns KVP_EIO, KVP_EFORMAT or KVP_ENOMEM with the file
 * name in the message; *out is set only on success. */
int kvp_head_profile_read(const char *path, struct kvp_head_profile **out, struct kvp_err *err);
int kvp_head_profile_write(const struct kvp_head_profile *hp, const char *path,
                           struct kvp_err *err);

/* Parse a profile held in memory (name is used in messages). */
int kvp_head_profile_parse(const char *data, size_t size, const char *name,
                           struct kvp_head_profile **out, struct kvp_err *err);

/* Build a profile by voting (kvp_catekv_vote) over cvs[n_samples][n_layer·n_head_kv] for ratio r;
 * the CV matrix is the mean over samples. Metadata other than the shape, ratio and n_samples is
 * left 0 for the caller to fill. */
int kvp_head_profile_vote(const double *cvs, int n_samples, int n_layer, int n_head_kv, double r,
                          struct kvp_head_profile **out, struct kvp_err *err);

/* Draw the profile as a PNG: a grid with one cell per (layer = row, KV head = column), blue for
 * consistent and orange for adaptive heads, darker for a higher CV (scaled from the profile's
 * smallest to its largest CV); adaptive cells carry a black-and-white square so the classes read
 * without colour. Row and column numbers are drawn left and above; a legend below shows both
 * ramps from the smallest to the largest CV. */
int kvp_head_profile_draw(const struct kvp_head_profile *hp, const char *png_path,
                          struct kvp_err *err);
/* The same from a profile file (`kvpred viz-heads`, `kvpred viz --head-profile`). */
int kvp_head_profile_draw_file(const char *profile_path, const char *png_path,
                               struct kvp_err *err);

/* ---- access to a running catekv policy (policy_catekv.c) ---- */

/* CVs [n_layer·n_head_kv] of the last prompt a dynamic catekv policy classified. KVP_EINVAL when
 * p is not catekv, has seen no prompt or runs from a profile; KVP_ERANGE when the prompt was too
 * short to classify (geometry keep_all). */
int kvp_catekv_policy_cvs(const struct kvp_policy *p, double *cv, struct kvp_err *err);

/* Classes [n_layer·n_head_kv] (1 = adaptive) of the last prompt; returns the number of adaptive
 * heads, or -1 when p is not catekv or has seen no prompt. */
int kvp_catekv_policy_classes(const struct kvp_policy *p, uint8_t *adaptive);


#endif
