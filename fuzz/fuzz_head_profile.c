/*
 * libFuzzer target for the CateKV head-profile reader (src/policy/catekv_profile.c): parse the
 * input as a profile text. An accepted profile must keep its promises: a shape in range, a 0/1
 * class per head, finite non-negative CVs, and its adaptive count equal to the 1s.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy/catekv_profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1); /* exactly sized and not NUL-terminated */
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct kvp_head_profile *hp = NULL;
    struct kvp_err err;
    if (kvp_head_profile_parse(buf, size, "fuzz", &hp, &err) == 0) {
        if (hp->n_layer < 1 || hp->n_layer > KVP_HEAD_PROFILE_MAX_DIM || hp->n_head_kv < 1 ||
            hp->n_head_kv > KVP_HEAD_PROFILE_MAX_DIM || !(hp->ratio >= 0 && hp->ratio <= 1) ||
            hp->model[sizeof(hp->model) - 1] != 0)
            abort();
        size_t n = (size_t)hp->n_layer * hp->n_head_kv;
        int ones = 0;
        for (size_t i = 0; i < n; i++) {
            if (hp->adaptive[i] > 1 || !isfinite(hp->cv[i]) || hp->cv[i] < 0)
                abort();
            ones += hp->adaptive[i];
        }
        if (ones != kvp_head_profile_n_adaptive(hp))
            abort();
        kvp_head_profile_free(hp);
    }
    free(buf);
    return 0;
}
