/*
 * Settings from the environment (settings.h): the only file of the library that calls getenv.
 */
#include "core/settings.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[KVP_SETTING_COUNT] = {
    [KVP_SETTING_SIMD] = "KVP_SIMD",
    [KVP_SETTING_PREFILL] = "KVP_PREFILL",
    [KVP_SETTING_TRAIN_KERNELS] = "KVP_TRAIN_KERNELS",
    [KVP_SETTING_DISK_IO] = "KVP_DISK_IO",
    [KVP_SETTING_SQ_BYPASS] = "KVP_SQ_BYPASS",
    [KVP_SETTING_TMPDIR] = "TMPDIR",
};

const char *kvp_setting_name(enum kvp_setting s)
{
    return s >= 0 && s < KVP_SETTING_COUNT ? names[s] : "";
}

const char *kvp_setting(enum kvp_setting s)
{
    if (s < 0 || s >= KVP_SETTING_COUNT)
        return NULL;
    const char *v = getenv(names[s]);
    return v && *v ? v : NULL;
}

bool kvp_setting_is(enum kvp_setting s, const char *value)
{
    const char *v = kvp_setting(s);
    return v && strcmp(v, value) == 0;
}
