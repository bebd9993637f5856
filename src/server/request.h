/*
 * `kvpred serve`: one OpenAI-style request body (JSON) turned into a validated request, with
 * nothing else touched (no model, no sockets), so it can be fuzzed on its own
 * (fuzz/fuzz_server_request.c).
 *
 * Accepted fields (everything else an OpenAI client may send is ignored):
 *   model        string (checked against the served model by the caller)
 *   prompt       /v1/completions: a string, or an array of exactly one string
 *   messages     /v1/chat/completions: [{role, content}], content a string or an array of
 *                {"type": "text", "text": ...} parts
 *   max_tokens   (chat also max_completion_tokens) integer in 0..limits.max_tokens
 *   temperature  number in 0..2 (0: greedy)    top_p  number in 0..1    top_k  integer >= 0
 *   seed         integer >= 0                  stop   string or array of at most 4 strings
 *   stream       bool; stream_options.include_usage bool
 *   n            1 if given
 *   kvpred       {"policy": NAME, "budget": "1/16" | 0.0625 | 256, "prefill_policy": NAME,
 *                 "prefill_budget": as budget} (the extension field)
 * A refusal fills struct srv_error with the HTTP status, the OpenAI error type, the offending
 * parameter and one line.
 */
#ifndef KVP_SERVER_REQUEST_H
#define KVP_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SRV_MAX_STOP 4
#define SRV_STOP_MAX_LEN 64

enum srv_kind { SRV_COMPLETION = 0, SRV_CHAT = 1 };

struct srv_limits {
    size_t max_body;    /* bytes of a request body */
    int max_tokens;     /* largest max_tokens accepted */
    int max_messages;   /* chat messages */
};

struct srv_msg {
    char *role;
    char *content;
};

struct srv_request {
    int kind;            /* enum srv_kind */
    char *model;         /* NULL when not given */
    char *prompt;        /* completions */
    struct srv_msg *msgs;/* chat */
    int n_msgs;
    int max_tokens;      /* -1 when not given (the server's default applies) */
    double temperature;  /* the fields below hold the server's defaults when not given */
    double top_p;
    int top_k;
    uint64_t seed;
    char *stop[SRV_MAX_STOP];
    int n_stop;
    bool stream;
    bool include_usage;
    /* the extension field */
    char *policy;        /* NULL: the server's policy */
    bool has_budget;
    int budget;          /* tokens, or 0 with budget_ratio in (0, 1] */
    float budget_ratio;
    int prefill_policy;  /* enum kvp_prefill_policy; -1: the server's prefill */
    bool has_prefill_budget; /* with a sparse prefill_policy (or the server's) */
    int prefill_budget;  /* keys per query block, or 0 with prefill_budget_ratio */
    float prefill_budget_ratio;
};

struct srv_error {
    int status;          /* HTTP status */
    const char *type;    /* "invalid_request_error", ... */
    const char *code;    /* NULL or a short code ("model_not_found") */
    char param[48];      /* the offending field, "" for none */
    char msg[256];
};

/* Sampling defaults the request starts from (the server's, like `kvpred run`'s). */
struct srv_defaults {
    double temperature, top_p;
    int top_k;
    uint64_t seed;
};

/* Parse body[0..len) (need not be NUL-terminated) for endpoint kind into *req (zeroed first;
 * release with srv_request_free even after a failure). 0, or -1 with *e filled. */
int srv_request_parse(const char *body, size_t len, int kind, const struct srv_limits *lim,
                      const struct srv_defaults *def, struct srv_request *req,
                      struct srv_error *e);
void srv_request_free(struct srv_request *req);

/* Fill e (status, type, param, printf-style message); returns -1. */
int srv_error_set(struct srv_error *e, int status, const char *type, const char *param,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
