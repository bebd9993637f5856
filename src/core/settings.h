/*
 * The settings the library takes from the environment, read in this one place so that every
 * variable is named once, has one prefix (KVP_) and is listed with what it does in
 * docs/api.md ("Environment"). Callers ask for a setting by id; the value is read at the call
 * (the modules that pick kernels read it once, as before, and keep their choice).
 */
#ifndef KVP_CORE_SETTINGS_H
#define KVP_CORE_SETTINGS_H

#include <stdbool.h>

enum kvp_setting {
    KVP_SETTING_SIMD,          /* KVP_SIMD: the SIMD kernel table (scalar, avx2, avx512, ...) */
    KVP_SETTING_PREFILL,       /* KVP_PREFILL=sgemm: prefill through dequantize + sgemm */
    KVP_SETTING_TRAIN_KERNELS, /* KVP_TRAIN_KERNELS=scalar: the trainer's portable kernels */
    KVP_SETTING_DISK_IO,       /* KVP_DISK_IO=pread|io_uring: the disk tier's IO path */
    KVP_SETTING_SQ_BYPASS,     /* KVP_SQ_BYPASS=never|always: the io_uring busy-host bypass */
    KVP_SETTING_TMPDIR,        /* TMPDIR: where the disk tier's file goes without kv_dir */
    KVP_SETTING_COUNT
};

/* The variable's name (for messages and docs). */
const char *kvp_setting_name(enum kvp_setting s);

/* Its value, or NULL when unset or empty. */
const char *kvp_setting(enum kvp_setting s);

/* Whether it is set to exactly value. */
bool kvp_setting_is(enum kvp_setting s, const char *value);

#endif
