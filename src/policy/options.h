/*
 * Policy options: each policy declares its own parameters once, as a table (struct
 * kvp_policy_opt), and every way of setting them reads that table: the `opts` string of the
 * API ("key=value,...", what --policy-opts passes), the CLI flags of options that have one, and
 * the --help text. Adding a policy with parameters stays one file plus one registry line: the
 * file holds the table, and nothing else needs to know the keys.
 *
 * An option lives in one of two places: the policy's own option block (p->opt, opts_size
 * bytes, filled with the table's defaults before the string is applied), or a field of the public
 * struct kvp_policy_params (options the API has typed fields for; 0 there reads as "the
 * policy's default", so a CLI flag given 0 stores -1 when zero_unset). An INCLUDE row pulls in
 * another table whose block sits at `offset` inside this one (catekv's adaptive heads take the
 * predictor's options).
 */
#ifndef KVP_POLICY_OPTIONS_H
#define KVP_POLICY_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/err.h"
#include "kvpred.h"

struct kvp_policy_ops;

enum kvp_opt_type {
    KVP_OPT_END = 0, /* ends a table */
    KVP_OPT_INT,     /* int, in [min, max] */
    KVP_OPT_FLOAT,   /* float, in [min, max] */
    KVP_OPT_CHOICE,  /* int: index into choices */
    KVP_OPT_STR,     /* const char * (borrowed from the caller's string or argv) */
    KVP_OPT_INCLUDE, /* every row of sub, its block at offset */
};

enum kvp_opt_home {
    KVP_OPT_BLOCK = 0,  /* the policy's option block (p->opt) */
    KVP_OPT_PARAMS = 1, /* a field of struct kvp_policy_params */
};

struct kvp_policy_opt {
    int type;                   /* enum kvp_opt_type */
    const char *key;            /* the key of "key=value" */
    const char *flag;           /* CLI flag ("--eta"), or NULL: only through --policy-opts */
    int home;                   /* enum kvp_opt_home */
    size_t offset;              /* of the field in its home (INCLUDE: of the included block) */
    double min, max;            /* accepted range of INT and FLOAT */
    double def;                 /* default of a block option (params options: 0, the API's
                                   "default") */
    const char *const *choices; /* CHOICE: NULL-terminated names */
    bool zero_unset;            /* params option: a given 0 is stored as -1 (reads as zero) */
    const char *help;           /* one line for --help */
    const struct kvp_policy_opt *sub; /* INCLUDE */
};

/* Fill a block with the defaults of its table (INCLUDE rows recursively). */
void kvp_policy_opts_defaults(const struct kvp_policy_opt *table, void *block);

/* Apply "key=value,..." (NULL or "": nothing) for the policy `who` with table `table` to params
 * and block. KVP_EINVAL naming the bad item and listing the known keys. */
int kvp_policy_opts_parse(const struct kvp_policy_opt *table, const char *who, const char *s,
                          struct kvp_policy_params *params, void *block, struct kvp_err *err);

/* The row of table (INCLUDE rows searched too) whose CLI flag is `flag`, or NULL. */
const struct kvp_policy_opt *kvp_policy_opt_by_flag(const struct kvp_policy_opt *table,
                                                    const char *flag);

/* Store one value for row o (a params option, as a CLI flag sets it). KVP_EINVAL with a message
 * saying what was expected. */
int kvp_policy_opt_set(const struct kvp_policy_opt *o, const char *value,
                       struct kvp_policy_params *params, void *block, struct kvp_err *err);

/* "key=..." summaries of a table's keys, comma-separated, into buf (always terminated). */
void kvp_policy_opts_keys(const struct kvp_policy_opt *table, char *buf, size_t cap);

#endif
