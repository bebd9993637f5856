/* Shared CLI plumbing: model/context flags, default model lookup, reading prompt files, JSON
 * printing. */
#ifndef KVP_CLI_COMMON_H
#define KVP_CLI_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpred.h"

struct cli_model_opts {
    const char *model_path;     /* -m */
    const char *tokenizer_path; /* --tokenizer */
    long n_ctx;                 /* -c (0: model default) */
    long n_threads;             /* -t */
    long block_size;            /* --block */
    long n_batch;               /* -b */
};

/* If argv[*i] is one of the shared flags, consume it (and its value) and return 1; return 0 if
 * it is not; return -1 after printing an error for a bad value. */
int cli_model_flag(struct cli_model_opts *o, int argc, char **argv, int *i);

/* Help text for the shared flags. */
extern const char *cli_model_flags_help;

/* Open the model named by o (or the default model). Prints the error and returns NULL. */
kvp_model *cli_open_model(const struct cli_model_opts *o);

/* Create a context; n_ctx overrides o->n_ctx when > 0. Warns when the context exceeds the
 * model's training length. Prints the error and returns NULL. */
kvp_ctx *cli_open_ctx(const kvp_model *m, const struct cli_model_opts *o, long n_ctx);

/* Read a whole file (NUL-terminated). Prints the error and returns NULL. */
char *cli_read_file(const char *path, size_t *len);

/* Tokenize text into a malloc'd array. Prints the error and returns NULL. */
int32_t *cli_tokenize(const kvp_model *m, const char *text, size_t len, bool add_bos, size_t *n);

/* True if a is one of the NULL-terminated names. */
bool cli_flag_in(const char *a, const char *const *names);

/* Value of the flag at argv[*i]: advances *i; prints an error and returns NULL if missing. */
const char *cli_flag_value(int argc, char **argv, int *i);

#endif
