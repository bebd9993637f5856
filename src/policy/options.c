/* The one parser of policy options (see options.h). */
#include "policy/options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *field(const struct kvp_policy_opt *o, struct kvp_policy_params *params, void *block)
{
    if (o->home == KVP_OPT_PARAMS)
        return (char *)params + o->offset;
    return block ? (char *)block + o->offset : NULL;
}

void kvp_policy_opts_defaults(const struct kvp_policy_opt *t, void *block)
{
    for (; t && t->type != KVP_OPT_END; t++) {
        if (t->home == KVP_OPT_PARAMS)
            continue;
        void *f = (char *)block + t->offset;
        switch (t->type) {
        case KVP_OPT_INT:
        case KVP_OPT_CHOICE:
            *(int *)f = (int)t->def;
            break;
        case KVP_OPT_FLOAT:
            *(float *)f = (float)t->def;
            break;
        case KVP_OPT_STR:
            *(const char **)f = NULL;
            break;
        case KVP_OPT_INCLUDE:
            kvp_policy_opts_defaults(t->sub, f);
            break;
        }
    }
}

/* The row for key, and the block it lives in (INCLUDE rows shift the block). */
static const struct kvp_policy_opt *find_key(const struct kvp_policy_opt *t, const char *key,
                                             size_t key_len, void *block, void **row_block)
{
    for (; t && t->type != KVP_OPT_END; t++) {
        if (t->type == KVP_OPT_INCLUDE) {
            const struct kvp_policy_opt *o =
                find_key(t->sub, key, key_len, block ? (char *)block + t->offset : NULL,
                         row_block);
            if (o)
                return o;
            continue;
        }
        if (strlen(t->key) == key_len && !memcmp(t->key, key, key_len)) {
            *row_block = block;
            return t;
        }
    }
    return NULL;
}

const struct kvp_policy_opt *kvp_policy_opt_by_flag(const struct kvp_policy_opt *t,
                                                    const char *flag)
{
    for (; t && t->type != KVP_OPT_END; t++) {
        if (t->type == KVP_OPT_INCLUDE) {
            const struct kvp_policy_opt *o = kvp_policy_opt_by_flag(t->sub, flag);
            if (o)
                return o;
        } else if (t->flag && !strcmp(t->flag, flag)) {
            return t;
        }
    }
    return NULL;
}

static void keys_into(const struct kvp_policy_opt *t, char *buf, size_t cap)
{
    for (; t && t->type != KVP_OPT_END; t++) {
        if (t->type == KVP_OPT_INCLUDE) {
            keys_into(t->sub, buf, cap);
            continue;
        }
        char one[160];
        if (t->type == KVP_OPT_CHOICE) {
            size_t n = (size_t)snprintf(one, sizeof(one), "%s=", t->key);
            for (int k = 0; t->choices[k] && n < sizeof(one); k++)
                n += (size_t)snprintf(one + n, sizeof(one) - n, "%s%s", k ? "|" : "",
                                      t->choices[k]);
        } else if (t->type == KVP_OPT_STR) {
            snprintf(one, sizeof(one), "%s=PATH", t->key);
        } else if (t->type == KVP_OPT_INT) {
            snprintf(one, sizeof(one), "%s=%ld..%ld", t->key, (long)t->min, (long)t->max);
        } else {
            snprintf(one, sizeof(one), "%s=%g..%g", t->key, t->min, t->max);
        }
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", one);
    }
}

void kvp_policy_opts_keys(const struct kvp_policy_opt *t, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = 0;
    keys_into(t, buf, cap);
}

/* Parse value for row o into *out (int, float or string); false when it is not acceptable. */
static bool parse_value(const struct kvp_policy_opt *o, const char *v, int *iv, float *fv)
{
    char *end = NULL;
    switch (o->type) {
    case KVP_OPT_INT: {
        errno = 0;
        long n = strtol(v, &end, 10);
        if (!*v || *end || errno || n < o->min || n > o->max)
            return false;
        *iv = (int)n;
        return true;
    }
    case KVP_OPT_FLOAT: {
        errno = 0;
        double d = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(d) || d < o->min || d > o->max)
            return false;
        *fv = (float)d;
        return true;
    }
    case KVP_OPT_CHOICE:
        for (int k = 0; o->choices[k]; k++)
            if (!strcmp(v, o->choices[k])) {
                *iv = k;
                return true;
            }
        return false;
    default:
        return *v != 0;
    }
}

/* Store a parsed value at f. */
static void store(const struct kvp_policy_opt *o, void *f, const char *v, int iv, float fv)
{
    if (o->type == KVP_OPT_INT || o->type == KVP_OPT_CHOICE)
        *(int *)f = iv == 0 && o->zero_unset ? -1 : iv;
    else if (o->type == KVP_OPT_FLOAT)
        *(float *)f = fv == 0.0f && o->zero_unset ? -1.0f : fv;
    else
        *(const char **)f = v;
}

int kvp_policy_opt_set(const struct kvp_policy_opt *o, const char *value,
                       struct kvp_policy_params *params, void *block, struct kvp_err *err)
{
    int iv = 0;
    float fv = 0;
    void *f = field(o, params, block);
    if (!parse_value(o, value, &iv, &fv) || !f) {
        char keys[256] = "";
        kvp_policy_opts_keys((const struct kvp_policy_opt[]){*o, {0}}, keys, sizeof(keys));
        return kvp_err_set(err, KVP_EINVAL, "'%s' is not a value for %s", value, keys);
    }
    store(o, f, value, iv, fv);
    return 0;
}

int kvp_policy_opts_parse(const struct kvp_policy_opt *table, const char *who, const char *s,
                          struct kvp_policy_params *params, void *block, struct kvp_err *err)
{
    while (s && *s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        void *row_block = NULL;
        const struct kvp_policy_opt *o = eq ? find_key(table, s, (size_t)(eq - s), block,
                                                       &row_block)
                                            : NULL;
        char v[256];
        size_t vlen = eq ? len - (size_t)(eq + 1 - s) : 0;
        int iv = 0;
        float fv = 0;
        bool ok = o && vlen < sizeof(v);
        if (ok) {
            memcpy(v, eq + 1, vlen);
            v[vlen] = 0;
            /* a string option keeps pointing into s, so it must end where s's item ends */
            ok = parse_value(o, v, &iv, &fv) && (o->type != KVP_OPT_STR || !end);
        }
        if (!ok || !field(o, params, row_block)) {
            char keys[512] = "";
            kvp_policy_opts_keys(table, keys, sizeof(keys));
            return kvp_err_set(err, KVP_EINVAL, "%s: bad option '%.*s' (known: %s)", who,
                               (int)(len < 64 ? len : 64), s, keys[0] ? keys : "none");
        }
        store(o, field(o, params, row_block), eq + 1, iv, fv);
        s = end ? end + 1 : NULL;
    }
    return 0;
}
