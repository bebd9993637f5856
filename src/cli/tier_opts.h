/* The tiered KV store's flags, shared by the commands that create contexts with one
 * (tier_opts.c): --kv-tier and the store options, their checks and their help text. */
#ifndef KVP_CLI_TIER_OPTS_H
#define KVP_CLI_TIER_OPTS_H

#include <stdbool.h>

#include "cli/common.h"
#include "kvpred_lab.h"

struct cli_tier_opts {
    int tier;            /* enum kvp_kv_tier (0: untiered) */
    const char *kv_dir;  /* disk tier */
    const char *kv_url;  /* redis tier */
    long hot_budget;     /* tokens per tiered layer (0: from the policy's budget) */
    int prefetch;        /* enum kvp_prefetch */
    bool syscall_submit; /* disk tier, io_uring: no polling thread */
    long sq_cpu;         /* disk tier, io_uring: the polling thread's CPU (-1: any) */
    int disk_io;         /* enum kvp_disk_io */
    struct kvp_disk_ring_params ring; /* syscall_submit and sq_cpu as the library takes them
                                         (cli_tier_check) */
};

#define CLI_TIER_OPTS_INIT {.sq_cpu = -1}

extern const char *const cli_tier_names[];     /* by enum kvp_kv_tier */
extern const char *const cli_prefetch_names[]; /* by enum kvp_prefetch */
extern const char *const cli_disk_io_names[];  /* by enum kvp_disk_io */

/* The flag table rows (inside a command's struct cli_flag array). --kv-tier none is the
 * default, untiered. */
#define CLI_TIER_FLAGS(o)                                                                          \
    CLI_CHOICE("--kv-tier", cli_tier_names, KVP_TIER_NONE, &(o)->tier,                            \
               "none, ram, disk or redis"),                                                        \
        CLI_STR("--kv-dir", &(o)->kv_dir), CLI_STR("--kv-url", &(o)->kv_url),                      \
        CLI_INT("--hot-budget", 1, 1 << 24, &(o)->hot_budget, "a positive token count"),           \
        CLI_CHOICE("--prefetch", cli_prefetch_names, KVP_PREFETCH_NONE, &(o)->prefetch,            \
                   "dense, none, layer or token"),                                                 \
        CLI_BOOL("--kv-syscall-submit", &(o)->syscall_submit),                                     \
        CLI_INT("--kv-sq-cpu", 0, 4095, &(o)->sq_cpu, "a CPU number"),                             \
        CLI_CHOICE("--kv-disk-io", cli_disk_io_names, KVP_DISK_IO_AUTO, &(o)->disk_io,             \
                   "auto, io_uring or pread")

/* Help lines for those flags. */
extern const char *cli_tier_flags_help;

/* The flags' combinations: 0, or 1 after printing the error (a store option without
 * --kv-tier, redis without --kv-url, ...). Warns when nothing would be tiered (no policy and
 * no dense prefetch). Fills o->ring. */
int cli_tier_check(struct cli_tier_opts *o, bool has_policy);

/* Put the checked options into a context's parameters (cp->kv_ring points into o). */
void cli_tier_apply(const struct cli_tier_opts *o, struct kvp_ctx_params *cp);

#endif
