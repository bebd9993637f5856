/* Request bodies of `kvpred serve` (see request.h): JSON through cJSON, every field type- and
 * range-checked before anything else sees it. */
#include "server/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpred.h"
#include "policy/budget.h"

int srv_error_set(struct srv_error *e, int status, const char *type, const char *param,
                  const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(e, param, ...) srv_error_set((e), 400, "invalid_request_error", (param), __VA_ARGS__)

void srv_request_free(struct srv_request *r)
{
    if (!r)
        return;
    free(r->model);
    free(r->prompt);
    for (int i = 0; i < r->n_msgs; i++) {
        free(r->msgs[i].role);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->policy);
    memset(r, 0, sizeof(*r));
}

static char *dup_str(const cJSON *j, struct srv_error *e)
{
    char *s = strdup(j->valuestring);
    if (!s)
        srv_error_set(e, 500, "server_error", NULL, "out of memory");
    return s;
}

/* A JSON number that is a whole number in lo..hi. */
static bool json_int(const cJSON *j, double lo, double hi, long long *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!isfinite(v) || v != floor(v) || v < lo || v > hi)
        return false;
    *out = (long long)v;
    return true;
}

static int get_number(const cJSON *root, const char *key, double lo, double hi, double *out,
                      struct srv_error *e)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < lo ||
        j->valuedouble > hi)
        return BAD(e, key, "'%s' must be a number in %g..%g", key, lo, hi);
    *out = j->valuedouble;
    return 0;
}

/* Text of a chat message's content: a string, or text parts joined. */
static int message_content(const cJSON *c, int i, char **out, struct srv_error *e)
{
    if (cJSON_IsString(c))
        return (*out = dup_str(c, e)) ? 0 : -1;
    if (!cJSON_IsArray(c))
        return BAD(e, "messages", "messages[%d].content must be a string or an array of text "
                   "parts", i);
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text))
            return BAD(e, "messages", "messages[%d].content: only parts of type \"text\" with a "
                       "string \"text\" are supported", i);
        len += strlen(text->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s)
        return srv_error_set(e, 500, "server_error", NULL, "out of memory");
    size_t n = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t tl = strlen(t);
        memcpy(s + n, t, tl);
        n += tl;
    }
    s[n] = 0;
    *out = s;
    return 0;
}

static int parse_messages(const cJSON *root, const struct srv_limits *lim, struct srv_request *r,
                          struct srv_error *e)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!m)
        return BAD(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(m))
        return BAD(e, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(m);
    if (n < 1 || n > lim->max_messages)
        return BAD(e, "messages", "'messages' must hold 1..%d messages", lim->max_messages);
    r->msgs = calloc((size_t)n, sizeof(*r->msgs));
    if (!r->msgs)
        return srv_error_set(e, 500, "server_error", NULL, "out of memory");
    static const char *const roles[] = {"system", "developer", "user", "assistant"};
    const cJSON *msg;
    int i = 0;
    cJSON_ArrayForEach(msg, m) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsObject(msg) || !cJSON_IsString(role))
            return BAD(e, "messages", "messages[%d] must be an object with a string 'role'", i);
        bool known = false;
        for (size_t k = 0; k < sizeof(roles) / sizeof(roles[0]); k++)
            known |= !strcmp(role->valuestring, roles[k]);
        if (!known)
            return BAD(e, "messages", "messages[%d].role must be system, developer, user or "
                       "assistant", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!content)
            return BAD(e, "messages", "messages[%d].content is required", i);
        /* "developer" is the newer name of "system" */
        r->msgs[i].role = strdup(!strcmp(role->valuestring, "developer") ? "system"
                                                                          : role->valuestring);
        r->n_msgs = i + 1;
        if (!r->msgs[i].role)
            return srv_error_set(e, 500, "server_error", NULL, "out of memory");
        if (message_content(content, i, &r->msgs[i].content, e) < 0)
            return -1;
        i++;
    }
    return 0;
}

static int parse_prompt(const cJSON *root, struct srv_request *r, struct srv_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p)
        return BAD(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p)) {
        if (cJSON_GetArraySize(p) != 1 || !cJSON_IsString(p->child))
            return BAD(e, "prompt", "'prompt' as an array must hold exactly one string (one "
                       "completion per request)");
        p = p->child;
    }
    if (!cJSON_IsString(p))
        return BAD(e, "prompt", "'prompt' must be a string");
    return (r->prompt = dup_str(p, e)) ? 0 : -1;
}

static int add_stop(struct srv_request *r, const cJSON *s, struct srv_error *e)
{
    if (!cJSON_IsString(s))
        return BAD(e, "stop", "'stop' must be a string or an array of strings");
    size_t n = strlen(s->valuestring);
    if (n == 0 || n > SRV_STOP_MAX_LEN)
        return BAD(e, "stop", "each stop string must have 1..%d bytes", SRV_STOP_MAX_LEN);
    if (r->n_stop == SRV_MAX_STOP)
        return BAD(e, "stop", "at most %d stop strings", SRV_MAX_STOP);
    if (!(r->stop[r->n_stop] = dup_str(s, e)))
        return -1;
    r->n_stop++;
    return 0;
}

static bool policy_known(const char *name)
{
    for (int i = 0; kvp_policy_name(i); i++)
        if (!strcmp(kvp_policy_name(i), name))
            return true;
    return false;
}

/* A budget: a count (> 1), a ratio in (0, 1] or a fraction string ("1/16"). */
static bool budget_value(const cJSON *b, int *count, float *ratio)
{
    if (cJSON_IsString(b))
        return kvp_budget_parse(b->valuestring, count, ratio);
    if (!cJSON_IsNumber(b))
        return false;
    long long v;
    if (json_int(b, 1, 1 << 30, &v) && b->valuedouble > 1.0)
        *count = (int)v;
    else if (kvp_budget_ratio_ok(b->valuedouble))
        *ratio = (float)b->valuedouble;
    else
        return false;
    return true;
}

static int parse_extension(const cJSON *root, struct srv_request *r, struct srv_error *e)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "kvpred");
    if (!x || cJSON_IsNull(x))
        return 0;
    if (!cJSON_IsObject(x))
        return BAD(e, "kvpred", "'kvpred' must be an object {\"policy\": ..., \"budget\": ...}");
    const cJSON *f;
    cJSON_ArrayForEach(f, x) {
        if (strcmp(f->string, "policy") && strcmp(f->string, "budget") &&
            strcmp(f->string, "prefill_policy") && strcmp(f->string, "prefill_budget"))
            return BAD(e, "kvpred", "kvpred.%.40s: unknown field (known: policy, budget, "
                       "prefill_policy, prefill_budget)", f->string);
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(x, "policy");
    if (p && !cJSON_IsNull(p)) {
        if (!cJSON_IsString(p))
            return BAD(e, "kvpred.policy", "kvpred.policy must be a string");
        if (!policy_known(p->valuestring))
            return BAD(e, "kvpred.policy", "kvpred.policy: unknown policy '%.40s'",
                       p->valuestring);
        if (!(r->policy = dup_str(p, e)))
            return -1;
    }
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(x, "budget");
    if (b && !cJSON_IsNull(b)) {
        if (!budget_value(b, &r->budget, &r->budget_ratio))
            return BAD(e, "kvpred.budget", "kvpred.budget must be a token count (256), a ratio "
                       "in (0, 1] (0.0625) or a fraction (\"1/16\")");
        r->has_budget = true;
    }
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(x, "prefill_policy");
    if (pp && !cJSON_IsNull(pp)) {
        if (!cJSON_IsString(pp) ||
            (r->prefill_policy = kvp_prefill_policy_parse(pp->valuestring)) < 0)
            return BAD(e, "kvpred.prefill_policy", "kvpred.prefill_policy must be one of "
                       "dense, sparse, pooled, bound, strided, learned");
    }
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(x, "prefill_budget");
    if (pb && !cJSON_IsNull(pb)) {
        if (!budget_value(pb, &r->prefill_budget, &r->prefill_budget_ratio))
            return BAD(e, "kvpred.prefill_budget", "kvpred.prefill_budget must be a key count "
                       "(256), a ratio in (0, 1] (0.0625) or a fraction (\"1/16\")");
        if (r->prefill_policy == KVP_PREFILL_DENSE)
            return BAD(e, "kvpred.prefill_budget", "kvpred.prefill_budget needs a sparse "
                       "prefill_policy");
        r->has_prefill_budget = true;
    }
    return 0;
}

static int parse_object(const cJSON *root, int kind, const struct srv_limits *lim,
                        struct srv_request *r, struct srv_error *e)
{
    if (!cJSON_IsObject(root))
        return BAD(e, NULL, "the request body must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model))
            return BAD(e, "model", "'model' must be a string");
        if (!(r->model = dup_str(model, e)))
            return -1;
    }
    if ((kind == SRV_CHAT ? parse_messages(root, lim, r, e) : parse_prompt(root, r, e)) < 0)
        return -1;

    const char *mt_key = "max_tokens";
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, mt_key);
    if (kind == SRV_CHAT && (!mt || cJSON_IsNull(mt))) {
        mt_key = "max_completion_tokens";
        mt = cJSON_GetObjectItemCaseSensitive(root, mt_key);
    }
    if (mt && !cJSON_IsNull(mt)) {
        long long v;
        if (!json_int(mt, 0, lim->max_tokens, &v))
            return BAD(e, mt_key, "'%s' must be an integer in 0..%d", mt_key, lim->max_tokens);
        r->max_tokens = (int)v;
    }
    if (get_number(root, "temperature", 0.0, 2.0, &r->temperature, e) < 0 ||
        get_number(root, "top_p", 0.0, 1.0, &r->top_p, e) < 0)
        return -1;
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (tk && !cJSON_IsNull(tk)) {
        long long v;
        if (!json_int(tk, 0, 1 << 24, &v))
            return BAD(e, "top_k", "'top_k' must be an integer in 0..%d", 1 << 24);
        r->top_k = (int)v;
    }
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (seed && !cJSON_IsNull(seed)) {
        long long v;
        /* 2^53: the largest range a JSON number carries exactly */
        if (!json_int(seed, 0, 9007199254740992.0, &v))
            return BAD(e, "seed", "'seed' must be an integer in 0..2^53");
        r->seed = (uint64_t)v;
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "n");
    if (n && !cJSON_IsNull(n)) {
        long long v;
        if (!json_int(n, 1, 1, &v))
            return BAD(e, "n", "'n' must be 1 (one completion per request)");
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        if (cJSON_IsArray(stop)) {
            const cJSON *s;
            cJSON_ArrayForEach(s, stop) {
                if (add_stop(r, s, e) < 0)
                    return -1;
            }
        } else if (add_stop(r, stop, e) < 0) {
            return -1;
        }
    }
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (st && !cJSON_IsNull(st)) {
        if (!cJSON_IsBool(st))
            return BAD(e, "stream", "'stream' must be true or false");
        r->stream = cJSON_IsTrue(st);
    }
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        if (!cJSON_IsObject(so) || (iu && !cJSON_IsBool(iu)))
            return BAD(e, "stream_options", "'stream_options' must be {\"include_usage\": bool}");
        r->include_usage = cJSON_IsTrue(iu);
    }
    return parse_extension(root, r, e);
}

int srv_request_parse(const char *body, size_t len, int kind, const struct srv_limits *lim,
                      const struct srv_defaults *def, struct srv_request *r,
                      struct srv_error *e)
{
    memset(r, 0, sizeof(*r));
    memset(e, 0, sizeof(*e));
    r->kind = kind;
    r->max_tokens = -1;
    r->prefill_policy = -1;
    r->temperature = def->temperature;
    r->top_p = def->top_p;
    r->top_k = def->top_k;
    r->seed = def->seed;
    if (len > lim->max_body)
        return srv_error_set(e, 413, "invalid_request_error", NULL,
                             "the request body has %zu bytes, more than the limit %zu", len,
                             lim->max_body);
    if (len == 0)
        return BAD(e, NULL, "the request body is empty; send a JSON object");
    if (memchr(body, 0, len))
        return BAD(e, NULL, "the request body holds a NUL byte");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return BAD(e, NULL, "the request body is not valid JSON (at byte %zu)", at);
    }
    /* only white space may follow the value */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return BAD(e, NULL, "the request body has text after the JSON value (at byte %zu)",
                       (size_t)(p - body));
        }
    int rc = parse_object(root, kind, lim, r, e);
    cJSON_Delete(root);
    return rc;
}
