/*
 * `kvpred serve`'s HTTP side: libmicrohttpd parses HTTP on a few event-driven threads (epoll),
 * a request that waits for its answer parks its connection (waiter.h) instead of holding a
 * thread, conns.h limits and counts the connections, cJSON writes the answers, engine.h
 * generates. Endpoints: POST /v1/completions and /v1/chat/completions (stream or not),
 * GET /v1/models, /health, /metrics and / (the page). docs/server.md describes them.
 */
#ifndef KVP_SERVER_SERVER_H
#define KVP_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "kvpred.h"

struct srv_config {
    const char *host;         /* address to bind [127.0.0.1] */
    int port;                 /* [8080]; 0: any free port (srv_port tells which) */
    const char *model_path;
    const char *api_key;      /* NULL: no authentication */
    int n_slots;
    int max_queue;            /* waiting requests beyond the slots */
    size_t max_body;          /* request body bytes */
    int max_tokens;           /* largest max_tokens; also the default cap */
    int default_max_tokens;   /* when a request gives none */
    int timeout_s;            /* a connection that sends nothing this long while its request
                               * arrives, or between requests, is closed [5] */
    int send_timeout_s;       /* an answer the client takes nothing of this long is cut [60] */
    int max_conn;             /* open connections [1024] */
    int max_client_conn;      /* open connections from one address (0: no limit) [64] */
    int http_threads;         /* libmicrohttpd's event threads [4] */
    size_t cache_ram;         /* prefix cache RAM budget in bytes (0: none) */
    const char *cache_dir;    /* prefix cache folder (NULL: not persistent) */
    const char *prefix_store; /* redis://HOST:PORT[,...] shared by servers (NULL: none) */
    struct kvp_ctx_params cp; /* per slot */
    const struct kvp_policy_params *pol; /* the server's policy (NULL: full) */
    double temperature, top_p;/* sampling defaults (kvpred run's) */
    int top_k;
    unsigned long long seed;
};

struct srv_server;

/* Load nothing, bind, start the engine and the HTTP threads. Prints nothing; errors in err. */
int srv_server_start(const struct srv_config *cfg, const kvp_model *model,
                     struct srv_server **out, struct kvp_err *err);
int srv_server_port(const struct srv_server *s);
/* Stop accepting, let requests in flight finish for grace_s seconds (then cancel them), close
 * every connection and free. */
void srv_server_stop(struct srv_server *s, double grace_s);

/* The default auxiliary file of a policy that needs one, beside the model file: MODEL minus
 * ".gguf" plus ".kvpp" (predictor), ".qkvpp" (qpredictor) or ".catekv-r0.2.profile" (catekv's
 * head profile). Fills p->aux_path / p->head_profile into buf (cap bytes) when the policy
 * needs it, the field is unset and the file exists; returns true if it did. */
bool srv_policy_default_file(const char *model_path, struct kvp_policy_params *p, char *buf,
                             size_t cap);

#endif
