/* Shared CLI plumbing (common.c): errors and warnings, strict number parsing, the flag tables,
 * model/context flags, default model lookup, reading prompt files. */
#ifndef KVP_CLI_COMMON_H
#define KVP_CLI_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpred.h"

/* Print "kvpred: error: <msg>" on stderr; returns 1 (the exit status for errors). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print an error from the library. */
int cli_fail_err(const struct kvp_err *err);
/* Print "kvpred: warning: <msg>" on stderr. */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Strict number parsing for flags: the whole string must be a number in range. */
bool cli_parse_int(const char *s, long min, long max, long *out);
bool cli_parse_float(const char *s, double min, double max, double *out);
/* Split s in place at commas into at most max non-empty items; the count, or -1 for an empty
 * item or too many. */
int cli_split_list(char *s, char **items, int max);
/* A comma-separated list of at most max integers in [lo, hi] into out: the count, or -1 for a
 * bad list (an empty item, a number out of range, too many). */
int cli_parse_int_list(const char *s, long lo, long hi, long *out, int max);

struct cli_model_opts {
    const char *model_path;     /* -m */
    const char *tokenizer_path; /* --tokenizer */
    long n_ctx;                 /* -c (0: model default) */
    long n_threads;             /* -t */
    long block_size;            /* --block */
    long n_batch;               /* -b */
    int type_k, type_v;         /* -ctk / -ctv: enum kvp_kv_type (0: the default, f16) */
    bool no_pack;               /* --no-pack */
    bool no_mmap;               /* --no-mmap */
};

/* The context parameters the shared flags give (n_ctx overrides o->n_ctx when > 0). */
struct kvp_ctx_params cli_ctx_params(const struct cli_model_opts *o, long n_ctx);

/* If argv[*i] is one of the shared flags, consume it (and its value) and return 1; return 0 if
 * it is not; return -1 after printing an error for a bad value. */
int cli_model_flag(struct cli_model_opts *o, int argc, char **argv, int *i);

/* Help text for the shared flags; _sans_ctx leaves -c out, for commands that give it their own
 * meaning or size the context themselves. */
extern const char *cli_model_flags_help;
extern const char *cli_model_flags_help_sans_ctx;

/* Open the model named by o (or the default model). Prints the error and returns NULL. */
kvp_model *cli_open_model(const struct cli_model_opts *o);

/* Create a context; n_ctx overrides o->n_ctx when > 0. Warns when the context exceeds the
 * model's training length. Prints the error and returns NULL. */
kvp_ctx *cli_open_ctx(const kvp_model *m, const struct cli_model_opts *o, long n_ctx);
/* The same with every parameter given (cli_ctx_params plus, say, a tier's). */
kvp_ctx *cli_open_ctx_params(const kvp_model *m, const struct kvp_ctx_params *p);

/* Read a whole file (NUL-terminated). Prints the error and returns NULL. */
char *cli_read_file(const char *path, size_t *len);

/* Tokenize text into a malloc'd array. Prints the error and returns NULL. */
int32_t *cli_tokenize(const kvp_model *m, const char *text, size_t len, bool add_bos, size_t *n);

/* A text file scored whole (logits, perplexity): the model, its info, and the file's token ids
 * (BOS first) from at most max_bytes of it (0: all). cmd names the command in the errors. */
struct cli_scored_text {
    kvp_model *m;
    struct kvp_model_info in;
    int32_t *ids;
    size_t n;
};
/* Open the model, read and tokenize the file (-f, required). 0, or 1 after printing the error
 * (t is then closed). */
int cli_scored_text_open(struct cli_scored_text *t, const struct cli_model_opts *o,
                         const char *cmd, const char *path, size_t max_bytes);
void cli_scored_text_close(struct cli_scored_text *t);

/* The filler of `eval --task` / `prompt` task ti: --filler, or the essays under $KVP_SHARED_DIR
 * (../shared without it); the pass key without --filler needs none (its own noise line). *path
 * is set to what the JSON names. NULL after printing the error. */
struct kvp_corpus;
struct kvp_corpus *cli_open_filler(const char **path, int ti);

/* Value of the flag at argv[*i]: advances *i; prints an error and returns NULL if missing. */
const char *cli_flag_value(int argc, char **argv, int *i);

/* A command's flags as a table ending in {0}, one row per flag, written with the CLI_* macros
 * below. names lists the spellings, '|'-separated: "-f|--file". The kind is the type of *dst,
 * picked by _Generic in the macros, so a row whose dst has another type does not compile. */
struct cli_flag {
    const char *names;
    enum {
        CLI_FLAG_INT, /* int, long, uint64_t: integers in min..max */
        CLI_FLAG_LONG,
        CLI_FLAG_U64,
        CLI_FLAG_FLOAT, /* float, double: numbers in fmin..fmax */
        CLI_FLAG_DOUBLE,
        CLI_FLAG_STR,    /* const char *: the argument itself */
        CLI_FLAG_BOOL,   /* bool, no value: set to true */
        CLI_FLAG_SET,    /* int, no value: set to 1 */
        CLI_FLAG_CHOICE, /* int: the index of the value in choices */
        CLI_FLAG_LIST,   /* const char *[max]: each occurrence appends its value (*count) */
    } kind;
    void *dst;
    long min, max;              /* integers: the range; CHOICE: min is the first index accepted */
    double fmin, fmax;          /* FLOAT, DOUBLE: the range */
    const char *const *choices; /* CHOICE: NULL-terminated */
    bool zero_unset;            /* store a given 0 as -1 (see CLI_INT0) */
    int *count;                 /* LIST: values stored so far */
    const char *what;           /* ends the error "--flag: 'v' is not <what>"; NULL: the range */
};

#define CLI_INT(n, lo, hi, d, w)                                                                   \
    {.names = (n), .dst = (d), .min = (lo), .max = (hi), .what = (w),                              \
     .kind = _Generic((d), int *: CLI_FLAG_INT, long *: CLI_FLAG_LONG, uint64_t *: CLI_FLAG_U64)}
#define CLI_FLOAT(n, lo, hi, d, w)                                                                 \
    {.names = (n), .dst = (d), .fmin = (lo), .fmax = (hi), .what = (w),                            \
     .kind = _Generic((d), float *: CLI_FLAG_FLOAT, double *: CLI_FLAG_DOUBLE)}
#define CLI_STR(n, d) {.names = (n), .dst = (d), .kind = _Generic((d), const char **: CLI_FLAG_STR)}
/* a flag without a value */
#define CLI_BOOL(n, d)                                                                             \
    {.names = (n), .dst = (d), .kind = _Generic((d), bool *: CLI_FLAG_BOOL, int *: CLI_FLAG_SET)}
/* one of the names list[first..] (w lists them for the error), stored as its index in list */
#define CLI_CHOICE(n, list, first, d, w)                                                           \
    {.names = (n), .dst = (d), .choices = (list), .min = (first), .what = (w),                     \
     .kind = _Generic((d), int *: CLI_FLAG_CHOICE)}
/* a repeatable flag: every value is appended to list (at most cap; *count of them) */
#define CLI_LIST(n, list, cnt, cap)                                                                \
    {.names = (n), .dst = (list), .count = (cnt), .max = (cap),                                  \
     .kind = _Generic((list), const char **: CLI_FLAG_LIST)}
/* CLI_INT and CLI_FLOAT for kvp_policy_params-like fields that read 0 as "the default": a 0 given
 * on the command line is stored as -1, which they read as zero */
#define CLI_INT0(n, lo, hi, d, w)                                                                  \
    {.names = (n), .dst = (d), .min = (lo), .max = (hi), .what = (w), .zero_unset = true,          \
     .kind = _Generic((d), int *: CLI_FLAG_INT)}
#define CLI_FLOAT0(n, lo, hi, d, w)                                                                \
    {.names = (n), .dst = (d), .fmin = (lo), .fmax = (hi), .what = (w), .zero_unset = true,        \
     .kind = _Generic((d), float *: CLI_FLAG_FLOAT)}

/* If argv[*i] is one of the table's flags, store its value, consume it and return 1; return 0 if
 * it is not; return -1 after printing an error for a missing or bad value. */
int cli_parse_flags(const struct cli_flag *table, int argc, char **argv, int *i);

/* A subcommand's whole command line: the shared model flags (mo; NULL: none), the policy flags
 * (pp; NULL: none; policy_seed: --seed is the policy's), its own table, -h/--help (prints help)
 * and at most one bare argument (*positional; NULL: none allowed), or two with positional2. Returns 0, 1 after printing
 * the error (an unknown flag names `name`), or 2 after printing the help. */
struct kvp_policy_params;
struct cli_command {
    const char *name;
    struct cli_model_opts *mo;
    struct kvp_policy_params *pp;
    bool policy_seed;
    const struct cli_flag *flags;
    void (*help)(void);
    const char **positional;
    const char **positional2; /* with positional: a second bare argument (NULL: none) */
    const char *const *budget; /* with pp: a --budget value to parse into pp (NULL: none), and
                                  pp->name, if given, must name a policy */
};
int cli_parse_command(const struct cli_command *cmd, int argc, char **argv);
/* The same for a command with the model flags, one policy (pp) and its --budget (run, serve,
 * bench, batched-bench): --policy and --budget are rows of flags. */
int cli_parse_policy_command(const char *name, struct cli_model_opts *mo,
                             struct kvp_policy_params *pp, const char **budget,
                             const struct cli_flag *flags, void (*help)(void), int argc,
                             char **argv);

/* A policy that needs a file (predictor, qpredictor, catekv) and was given none takes the one
 * beside the model (srv_policy_default_file), written into buf (cap bytes) and named on stderr
 * after "who: ". */
void cli_policy_default_file(const struct cli_model_opts *mo, struct kvp_policy_params *pp,
                             char *buf, size_t cap, const char *who);

#endif
