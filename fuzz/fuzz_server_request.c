/*
 * libFuzzer target for `kvpred serve`'s request parser (src/server/request.c): a request body
 * straight from the network turned into a validated request. Byte 0 picks the endpoint
 * (completions or chat); the rest is the body. Whatever the parser accepts must hold what
 * request.h promises (a prompt or 1..max_messages messages with roles and contents, limits
 * kept, at most SRV_MAX_STOP non-empty stop strings, a known policy); a refusal must be a
 * 4xx/5xx status with a message.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpred.h"
#include "server/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int kind = data[0] & 1 ? SRV_CHAT : SRV_COMPLETION;
    size_t n = size - 1;
    char *body = malloc(n ? n : 1); /* exactly sized, not NUL-terminated: ASan sees overreads */
    if (!body)
        return 0;
    memcpy(body, data + 1, n);
    const struct srv_limits lim = {.max_body = 3000, .max_tokens = 4096, .max_messages = 8};
    const struct srv_defaults def = {.temperature = 0, .top_p = 0.95, .top_k = 40, .seed = 42};
    struct srv_request r;
    struct srv_error e;
    int rc = srv_request_parse(body, n, kind, &lim, &def, &r, &e);
    if (rc < 0) {
        if (e.status < 400 || e.status > 599 || !e.msg[0] || !e.type)
            abort();
    } else {
        if (kind == SRV_COMPLETION && !r.prompt)
            abort();
        if (kind == SRV_CHAT && (r.n_msgs < 1 || r.n_msgs > lim.max_messages))
            abort();
        for (int i = 0; i < r.n_msgs; i++)
            if (!r.msgs[i].role || !r.msgs[i].content)
                abort();
        if (r.max_tokens < -1 || r.max_tokens > lim.max_tokens || r.top_k < 0 ||
            !(r.temperature >= 0 && r.temperature <= 2) || !(r.top_p >= 0 && r.top_p <= 1) ||
            r.n_stop < 0 || r.n_stop > SRV_MAX_STOP)
            abort();
        for (int i = 0; i < r.n_stop; i++) {
            size_t sl = strlen(r.stop[i]);
            if (sl == 0 || sl > SRV_STOP_MAX_LEN)
                abort();
        }
        if (r.has_budget && !(r.budget > 0 || (r.budget_ratio > 0 && r.budget_ratio <= 1)))
            abort();
        if (r.policy) {
            bool known = false;
            for (int i = 0; kvp_policy_name(i); i++)
                known |= !strcmp(kvp_policy_name(i), r.policy);
            if (!known)
                abort();
        }
    }
    srv_request_free(&r);
    free(body);
    return 0;
}
