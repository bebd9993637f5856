/* `kvpred serve`: the OpenAI-compatible HTTP server (src/server/, docs/server.md). */
#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "cli/measure_opts.h"
#include "cli/prefill_opts.h"
#include "cli/tier_opts.h"
#include "server/server.h"

static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    unsigned char b = (unsigned char)sig;
    ssize_t n = write(sig_pipe[1], &b, 1);
    (void)n; /* a full pipe already holds a stop request */
}

static void help(void)
{
    printf("usage: kvpred serve [-m MODEL] [--host ADDR] [--port N] [-np SLOTS] [options]\n\n"
           "Serve the model over HTTP with OpenAI's API: POST /v1/completions and\n"
           "/v1/chat/completions (stream or not), GET /v1/models, /health, /metrics\n"
           "(Prometheus) and / (a chat page). Each slot keeps its KV cache between requests;\n"
           "a prompt that starts like a cached one only prefills the rest. SIGINT or SIGTERM\n"
           "stops taking requests and lets those in flight finish. docs/server.md has more.\n\n%s"
           "  --host ADDR          address to listen on (default 127.0.0.1; 0.0.0.0 for all)\n"
           "  --port N             TCP port (default 8080; 0: any free port, printed)\n"
           "  -np, --parallel N    slots: requests generated at the same time (default 2)\n"
           "                       (-c is the context of each slot)\n"
           "  --queue N            requests waiting for a slot before 429 (default 4 x slots)\n"
           "  --api-key KEY        require 'Authorization: Bearer KEY' (all but /health); also\n"
           "                       read from $KVP_API_KEY\n"
           "  --max-body BYTES     largest request body (default 8388608)\n"
           "  --max-tokens N       largest max_tokens a request may ask (default: the context)\n"
           "  --n-predict N        max_tokens when a request gives none (default 128)\n"
           "  --temp T, --top-k K, --top-p P, --seed S\n"
           "                       sampling defaults of requests that give none (kvpred run's:\n"
           "                       0 = greedy, 40, 0.95, 42)\n"
           "  --grace S            seconds requests in flight get to finish on shutdown (10)\n"
           "  --timeout S          close a connection that sends nothing for S seconds while\n"
           "                       its request arrives, or between requests (5)\n"
           "  --send-timeout S     cut an answer its client takes nothing of for S seconds;\n"
           "                       a request waiting for a slot or its tokens is not cut (60)\n"
           "  --max-connections N  open connections (1024; 16 more are kept for /health and\n"
           "                       /metrics only); more are closed at once\n"
           "  --max-client-connections N\n"
           "                       open connections from one address (64; 0: no limit)\n"
           "  --http-threads N     threads that serve every connection, event-driven (4)\n"
           "  --cache-ram MIB      RAM for cached prompt prefixes, least recently used out\n"
           "                       (default 1024; 0: no prefix cache beyond each slot's own)\n"
           "  --kv-cache-dir DIR   also keep cached prefixes in DIR, for the next run with the\n"
           "                       same model file and KV types (checked when read back)\n"
           "  --prefix-store redis://HOST:PORT[,HOST:PORT...][?ttl_s=N&timeout_ms=N]\n"
           "                       also keep cached prefixes in a Redis Cluster (or one Redis\n"
           "                       server) shared by every server of the same model file and\n"
           "                       KV types: a document prefilled by one is copied in by all\n"
           "                       (blocks expire ttl_s after their last use, default 86400)\n"
           "%s"
           "                       (each slot's cache; tiered slots too take part in the prefix\n"
           "                       cache and --kv-cache-dir, and copy prefixes from each other)\n"
           "  --policy P           default KV selection policy (a request may choose another\n"
           "                       with \"kvpred\": {\"policy\": P, \"budget\": B}); known: %s\n"
           "  --budget B           tokens per layer and KV head, or a ratio such as 1/16\n"
           "  predictor, qpredictor and catekv find their file beside the model\n"
           "  (MODEL.kvpp, .qkvpp, .catekv-r0.2.profile) when --aux / --head-profile is not given\n"
           "  KVP_SERVE_TRACE=1 in the environment logs where each prompt's time went\n"
           "%s"
           "                       (every slot's prompts)\n"
           "%s",
           cli_model_flags_help, cli_tier_flags_help, cli_policy_names(), cli_prefill_flags_help,
           cli_policy_flags_help());
}

/* The command line. */
struct serve_opts {
    struct cli_model_opts mo;
    const char *host, *api_key, *budget;
    long port, n_slots, queue, max_body, max_tokens, n_predict, top_k, seed;
    double temp, top_p, grace;
    long timeout, send_timeout, max_conn, max_client_conn, http_threads, cache_mib;
    const char *cache_dir, *prefix_store;
    struct cli_tier_opts to;
    struct cli_prefill_opts pf;
    struct kvp_policy_params pp;
    char aux[4096]; /* the policy's file beside the model, when pp names it */
};

/* Parse argv into o. Returns 0, 1 after printing an error, or 2 after printing the help. */
static int parse_args(struct serve_opts *o, int argc, char **argv)
{
    const struct cli_flag flags[] = {
        CLI_STR("--host", &o->host),
        CLI_INT("--port", 0, 65535, &o->port, "a port in 0..65535"),
        CLI_INT("-np|--parallel", 1, 256, &o->n_slots, "a slot count in 1..256"),
        CLI_INT("--queue", 0, 1 << 16, &o->queue, "a count"),
        CLI_STR("--api-key", &o->api_key),
        CLI_INT("--max-body", 1024, 1L << 30, &o->max_body, "a byte count in 1024..2^30"),
        CLI_INT("--max-tokens", 1, 1 << 24, &o->max_tokens, "a token count"),
        CLI_INT("--n-predict", 0, 1 << 24, &o->n_predict, "a token count"),
        CLI_FLOAT("--temp", 0.0, 2.0, &o->temp, "a temperature in 0..2"),
        CLI_INT("--top-k", 0, 1 << 24, &o->top_k, "a count"),
        CLI_FLOAT("--top-p", 0.0, 1.0, &o->top_p, NULL),
        CLI_INT("--seed", 0, 0x7fffffffffffffffL, &o->seed, "a non-negative integer"),
        CLI_FLOAT("--grace", 0.0, 3600.0, &o->grace, "seconds in 0..3600"),
        CLI_INT("--timeout", 1, 3600, &o->timeout, "seconds in 1..3600"),
        CLI_INT("--send-timeout", 1, 3600, &o->send_timeout, "seconds in 1..3600"),
        CLI_INT("--max-connections", 1, 1 << 20, &o->max_conn, "a count in 1..2^20"),
        CLI_INT("--max-client-connections", 0, 1 << 20, &o->max_client_conn, "a count in 0..2^20"),
        CLI_INT("--http-threads", 1, 64, &o->http_threads, "a count in 1..64"),
        CLI_STR("--kv-cache-dir", &o->cache_dir),
        CLI_STR("--prefix-store", &o->prefix_store),
        CLI_INT("--cache-ram", 0, 1L << 22, &o->cache_mib, "MiB in 0..2^22"),
        CLI_TIER_FLAGS(&o->to),
        CLI_STR("--policy", &o->pp.name),
        CLI_STR("--budget", &o->budget),
        CLI_PREFILL_FLAGS(&o->pf),
        {0},
    };
    int rc = cli_parse_policy_command("serve", &o->mo, &o->pp, &o->budget, flags, help, argc, argv);
    if (rc)
        return rc;
    if (cli_tier_check(&o->to, true) || /* no warning without --policy: requests may name one */
        cli_prefill_check(&o->pf))
        return 1;
    if (!o->api_key)
        o->api_key = getenv("KVP_API_KEY");
    if (o->api_key && !*o->api_key)
        return cli_fail("serve: --api-key is empty");
    return 0;
}

/* The server's configuration from the flags; *n_ctx receives each slot's context (-c, else the
 * model's training length). */
static struct srv_config server_config(struct serve_opts *o, const kvp_model *model, int *n_ctx)
{
    struct srv_config cfg = {
        .host = o->host,
        .port = (int)o->port,
        .model_path = o->mo.model_path ? o->mo.model_path : "models/kvpred-default.gguf",
        .api_key = o->api_key,
        .n_slots = (int)o->n_slots,
        .max_queue = (int)(o->queue >= 0 ? o->queue : 4 * o->n_slots),
        .max_body = (size_t)o->max_body,
        .default_max_tokens = (int)o->n_predict,
        .timeout_s = (int)o->timeout,
        .send_timeout_s = (int)o->send_timeout,
        .max_conn = (int)o->max_conn,
        .max_client_conn = (int)o->max_client_conn,
        .http_threads = (int)o->http_threads,
        .cache_ram = (size_t)o->cache_mib << 20,
        .cache_dir = o->cache_dir,
        .prefix_store = o->prefix_store,
        .cp = cli_ctx_params(&o->mo, 0),
        .pol = o->pp.name ? &o->pp : NULL,
        .temperature = o->temp,
        .top_p = o->top_p,
        .top_k = (int)o->top_k,
        .seed = (unsigned long long)o->seed,
    };
    cli_tier_apply(&o->to, &cfg.cp);
    cfg.cp.prefill = &o->pf.p;
    if (cfg.max_queue < 1)
        cfg.max_queue = 1;
    struct kvp_model_info info;
    kvp_model_get_info(model, &info);
    *n_ctx = cfg.cp.n_ctx > 0 ? cfg.cp.n_ctx : info.n_ctx_train;
    cfg.max_tokens = (int)(o->max_tokens > 0 ? o->max_tokens : *n_ctx);
    return cfg;
}

/* SIGINT and SIGTERM write their number to a pipe the main thread waits on. A handler, not
 * sigwait: threads started before main (the BLAS pool) do not block the signals, so the kernel
 * may deliver them anywhere. A closed client socket must not kill the server. Returns 0, or 1
 * after printing the error. */
static int catch_signals(void)
{
    if (pipe(sig_pipe) != 0)
        return cli_fail("serve: cannot create a pipe");
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* Serve until SIGINT or SIGTERM, then stop, giving the requests in flight o->grace seconds. */
static void serve_until_signal(struct srv_server *srv, const struct srv_config *cfg,
                               const struct serve_opts *o, int n_ctx)
{
    fprintf(stderr, "kvpred serve: %s on http://%s:%d/ (%d slots of %d tokens, policy %s%s)\n",
            cfg->model_path, o->host, srv_server_port(srv), cfg->n_slots, n_ctx,
            o->pp.name ? o->pp.name : "full", o->api_key ? ", API key required" : "");
    /* the port line on stdout alone, for scripts that start it with --port 0 */
    printf("listening %d\n", srv_server_port(srv));
    fflush(stdout);
    unsigned char sig = 0;
    while (read(sig_pipe[0], &sig, 1) < 0 && errno == EINTR)
        ;
    fprintf(stderr, "kvpred serve: %s: stopping (requests in flight get %.0f s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", o->grace);
    srv_server_stop(srv, o->grace);
}

int cmd_serve(int argc, char **argv)
{
    struct serve_opts o = {.host = "127.0.0.1",
                           .port = 8080,
                           .n_slots = 2,
                           .queue = -1,
                           .max_body = 8 << 20,
                           .n_predict = 128,
                           .top_k = 40,
                           .seed = 42,
                           .top_p = 0.95,
                           .grace = 10.0,
                           .timeout = 5,
                           .send_timeout = 60,
                           .max_conn = 1024,
                           .max_client_conn = 64,
                           .http_threads = 4,
                           .cache_mib = 1024,
                           .to = CLI_TIER_OPTS_INIT,
                           .pf = CLI_PREFILL_OPTS_INIT,
                           .pp = {.gqa_agg = KVP_AGG_MEAN}};
    int rc = parse_args(&o, argc, argv);
    if (rc)
        return rc == 2 ? 0 : 1;
    kvp_model *model = cli_open_model(&o.mo);
    if (!model)
        return 1;
    cli_policy_default_file(&o.mo, &o.pp, o.aux, sizeof(o.aux), "kvpred serve");
    int n_ctx;
    struct srv_config cfg = server_config(&o, model, &n_ctx);
    if (catch_signals())
        return 1;
    struct srv_server *srv = NULL;
    struct kvp_err err = {0};
    if (srv_server_start(&cfg, model, &srv, &err) < 0) {
        cli_fail_err(&err);
        kvp_model_close(model);
        return 1;
    }
    serve_until_signal(srv, &cfg, &o, n_ctx);
    kvp_model_close(model);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    fprintf(stderr, "kvpred serve: stopped\n");
    return 0;
}
