/*
 * The Redis cold tier against real servers started here, on loopback ports nobody else uses:
 * one plain redis-server, a 3-master Redis Cluster and a 3-master cluster with one replica per
 * master (redis-cli --cluster create). Logits of tiered runs equal the untiered ones bit for bit
 * on all three; the faults (a wrong URL, a refused connection, a server that never answers, one
 * that stops answering mid-run, maxmemory full, a slot migration during decode, a master killed
 * or stopped mid-run with and without a replica) are each recovered or one clear error within a
 * bound, and after an error every later call errors too: no call ever returns logits that
 * differ from the untiered run's. A clean exit leaves no key behind (DBSIZE 0 on every master).
 *
 * The servers run as children that die with this process (PR_SET_PDEATHSIG) and are killed by the
 * group teardown, so a failing test leaves none behind. Without redis-server (or without hiredis
 * in the build) the server tests skip with a message; the CRC16 and slot tests always run.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "kvpred.h"
#include "kvpred_lab.h"
#include "store/redis_slot.h"
#include "testutil.h"

#ifdef KVP_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

#define VOCAB    80
#define N_PROMPT 200
#define N_DECODE 40

static char *model_path;
static kvp_model *model;

/* ==================================== CRC16 and slots ===================================== */

/* By hand from the definition (shift left, xor 0x1021 when a 1 falls out): "\x01" is x^8, whose
 * remainder is the polynomial itself; "\x80" is x^15 * x^8 = x^23: 0x1021 after the first
 * shift, three plain shifts to 0x8108, then 0x0210 ^ 0x1021 = 0x1231 and three plain shifts to
 * 0x9188. "123456789" is the catalogued check value of CRC-16/XMODEM, 0x31C3. */
static void test_crc16(void **state)
{
    (void)state;
    assert_int_equal(kvp_redis_crc16("", 0), 0);
    assert_int_equal(kvp_redis_crc16("\x00", 1), 0);
    assert_int_equal(kvp_redis_crc16("\x01", 1), 0x1021);
    assert_int_equal(kvp_redis_crc16("\x80", 1), 0x9188);
    assert_int_equal(kvp_redis_crc16("123456789", 9), 0x31C3);
    /* hash tags: only a non-empty {...} counts, the first one */
    assert_int_equal(kvp_redis_key_slot("123456789", 9), 0x31C3 % 16384);
    assert_int_equal(kvp_redis_key_slot("{user1000}.following", 20),
                     kvp_redis_key_slot("user1000", 8));
    assert_int_equal(kvp_redis_key_slot("foo{}{bar}", 10),
                     kvp_redis_crc16("foo{}{bar}", 10) % 16384);
    assert_int_equal(kvp_redis_key_slot("foo{{bar}}zap", 13), kvp_redis_key_slot("{bar", 4));
    assert_int_equal(kvp_redis_key_slot("a{b", 3), kvp_redis_crc16("a{b", 3) % 16384);
}

/* the seed list both Redis clients parse their URLs' nodes with */
struct seeds {
    char got[256];
    int limit; /* add refuses (-2) past this many */
    int n;
};

static int add_seed(void *arg, const char *host, size_t host_len, int port)
{
    struct seeds *s = arg;
    if (s->n == s->limit)
        return -2;
    size_t at = strlen(s->got);
    snprintf(s->got + at, sizeof(s->got) - at, "%s%.*s|%d", s->n ? " " : "", (int)host_len, host,
             port);
    s->n++;
    return 0;
}

static int seeds_of(const char *list, int limit, struct seeds *s)
{
    *s = (struct seeds){.limit = limit};
    return kvp_redis_seed_list(list, strlen(list), add_seed, s);
}

static void test_seed_list(void **state)
{
    (void)state;
    struct seeds s;
    assert_int_equal(seeds_of("127.0.0.1:6379", 8, &s), 1);
    assert_string_equal(s.got, "127.0.0.1|6379");
    assert_int_equal(seeds_of("a:1,b.example:65535,::1:7000", 8, &s), 3);
    assert_string_equal(s.got, "a|1 b.example|65535 ::1|7000"); /* the last ':' splits */
    const char *bad[] = {"", "a", "a:", ":1", "a:0", "a:65536", "a:99999999999", "a:1,",
                         ",a:1", "a:1,,b:2", "a:1x", "a:-1", "a:+1", "a: 1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(seeds_of(bad[i], 8, &s), -1);
    assert_int_equal(seeds_of("a:1,b:2,c:3", 2, &s), -2); /* the caller's refusal passes on */
    assert_int_equal(s.n, 2);
    /* the length bounds the list: what follows (a URL's options) is not read */
    s = (struct seeds){.limit = 8};
    assert_int_equal(kvp_redis_seed_list("a:1?ttl_ms=5", 3, add_seed, &s), 1);
    assert_string_equal(s.got, "a|1");
}

/* =================================== servers on loopback ================================== */

static struct kvp_ctx_params base_params(const char *url)
{
    return (struct kvp_ctx_params){.n_ctx = 512,
                                   .n_threads = 2,
                                   .n_batch = 64,
                                   .kv_tier = url ? KVP_TIER_REDIS : KVP_TIER_NONE,
                                   .kv_url = url,
                                   .hot_budget = 48,
                                   .prefetch = KVP_PREFETCH_TOKEN};
}

#ifndef KVP_HAVE_HIREDIS

static void test_not_built(void **state)
{
    (void)state;
    struct kvp_ctx_params cp = base_params("redis://127.0.0.1:6379");
    kvp_ctx *c = NULL;
    struct kvp_err err = {0};
    assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), KVP_EUNSUPPORTED);
    print_message("[  SKIP    ] built without hiredis: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "hiredis"));
}

#else

struct server {
    int port;
    pid_t pid;
};

/* The replicated cluster's node timeout: a master that stops answering is failed over about
 * this long after (plus an election), so its tests take seconds, not the default 15 s. */
#define NODE_TIMEOUT_MS 1000

static char tmp_dir[4096];
static bool have_redis;
static struct server single;     /* the plain server */
static struct server cluster[3]; /* the cluster's masters */
static struct server repl[6];    /* the replicated cluster: 3 masters and their replicas */
static bool cluster_up, repl_up;
static char single_url[64], cluster_url[128], repl_url[128];

/* A reply from a one-off connection (NULL on any failure). */
static redisReply *cmdv(int port, int argc, const char **argv, const size_t *lens)
{
    struct timeval tv = {.tv_sec = 3};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    redisFree(c);
    return r;
}

static redisReply *cmd(int port, const char *fmt, ...)
{
    struct timeval tv = {.tv_sec = 3};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

static long long cmd_int(int port, const char *what)
{
    redisReply *r = cmd(port, what);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return v;
}

static bool cmd_ok(int port, const char *fmt, const char *a, const char *b)
{
    redisReply *r = cmd(port, fmt, a, b);
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok)
        print_message("port %d: %s %s %s: %s\n", port, fmt, a, b, r ? r->str : "no reply");
    if (r)
        freeReplyObject(r);
    return ok;
}

static bool port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* A port free now whose cluster bus port (+10000) is free too. */
static int pick_port(void)
{
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u;
    for (;;) {
        seed = seed * 1103515245u + 12345u;
        int p = 20000 + (int)(seed >> 8) % 20000;
        if (port_free(p) && port_free(p + 10000))
            return p;
    }
}

/* Start redis-server on a fresh port (cluster mode with this node timeout when it is not 0)
 * and wait for its PONG. */
static bool start_server(struct server *sv, int node_timeout_ms)
{
    sv->port = pick_port();
    char port[16], conf[64], node_timeout[16];
    snprintf(port, sizeof(port), "%d", sv->port);
    snprintf(conf, sizeof(conf), "nodes-%d.conf", sv->port);
    snprintf(node_timeout, sizeof(node_timeout), "%d", node_timeout_ms);
    sv->pid = fork();
    if (sv->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(126);
        if (node_timeout_ms)
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--dir", tmp_dir, "--cluster-enabled", "yes",
                   "--cluster-config-file", conf, "--cluster-require-full-coverage", "no",
                   "--cluster-node-timeout", node_timeout, (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save",
                   "", "--appendonly", "no", "--dir", tmp_dir, (char *)NULL);
        _exit(127);
    }
    if (sv->pid < 0)
        return false;
    for (int i = 0; i < 500; i++) { /* 5 s */
        redisReply *r = cmd(sv->port, "PING");
        bool up = r && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
        if (up)
            return true;
        usleep(10000);
    }
    return false;
}

static void stop_server(struct server *sv)
{
    if (sv->pid > 0) {
        kill(sv->pid, SIGKILL);
        waitpid(sv->pid, NULL, 0);
    }
    sv->pid = 0;
}

/* The ranges of CLUSTER SLOTS as node n sees them, and how many of them have at least
 * `replicas` replicas; -1 when it does not answer. */
static int slot_ranges(const struct server *n, int replicas, int *with)
{
    redisReply *r = cmd(n->port, "CLUSTER SLOTS");
    int ranges = -1;
    *with = 0;
    if (r && r->type == REDIS_REPLY_ARRAY) {
        ranges = (int)r->elements;
        for (size_t i = 0; i < r->elements; i++)
            *with += (int)r->element[i]->elements >= 3 + replicas;
    }
    if (r)
        freeReplyObject(r);
    return ranges;
}

/* Every node of the cluster says cluster_state:ok, and sees 3 slot ranges whose masters each
 * have `replicas` replicas. */
static bool cluster_ok(const struct server *nodes, int n, int replicas)
{
    for (int i = 0; i < n; i++) {
        redisReply *r = cmd(nodes[i].port, "CLUSTER INFO");
        bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
        if (r)
            freeReplyObject(r);
        int with = 0;
        if (!ok || slot_ranges(&nodes[i], replicas, &with) != 3 || with != 3)
            return false;
    }
    return true;
}

/* n servers in cluster mode made one cluster of 3 masters with `replicas` replicas each. With
 * replicas the node timeout is NODE_TIMEOUT_MS; without, Redis's default 15 s, so a node slowed
 * by a loaded host is not taken for failed (the cluster would answer CLUSTERDOWN meanwhile). */
static bool start_cluster(struct server *nodes, int n, int replicas)
{
    char cmdline[512];
    int len = snprintf(cmdline, sizeof(cmdline), "redis-cli --cluster create");
    for (int i = 0; i < n; i++) {
        if (!start_server(&nodes[i], replicas ? NODE_TIMEOUT_MS : 15000))
            return false;
        len +=
            snprintf(cmdline + len, sizeof(cmdline) - (size_t)len, " 127.0.0.1:%d", nodes[i].port);
    }
    snprintf(cmdline + len, sizeof(cmdline) - (size_t)len,
             " --cluster-replicas %d --cluster-yes >/dev/null 2>&1", replicas);
    char *out = NULL;
    int rc = kvp_test_run(cmdline, &out, 1);
    free(out);
    if (rc != 0)
        return false;
    for (int i = 0; i < 1000; i++) { /* 10 s */
        if (cluster_ok(nodes, n, replicas))
            return true;
        usleep(10000);
    }
    return false;
}

static long long dbsize(const struct server *sv)
{
    return cmd_int(sv->port, "DBSIZE");
}

#define REQUIRE_REDIS()                                                                            \
    do {                                                                                           \
        if (!have_redis) {                                                                         \
            kvp_test_skip_missing("redis-server or redis-cli not found");                          \
        }                                                                                          \
    } while (0)

#define REQUIRE_CLUSTER()                                                                          \
    do {                                                                                           \
        REQUIRE_REDIS();                                                                           \
        assert_true(cluster_up);                                                                   \
    } while (0)

#define REQUIRE_REPL()                                                                             \
    do {                                                                                           \
        REQUIRE_REDIS();                                                                           \
        assert_true(repl_up);                                                                      \
    } while (0)

static int servers_up(void)
{
    have_redis = system("command -v redis-server >/dev/null 2>&1 && "
                        "command -v redis-cli >/dev/null 2>&1") == 0;
    if (!have_redis)
        return 0;
    const char *tmp = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof(tmp_dir), "%s/kvpredisXXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmp_dir) || !start_server(&single, 0))
        return -1;
    snprintf(single_url, sizeof(single_url), "redis://127.0.0.1:%d", single.port);
    cluster_up = start_cluster(cluster, 3, 0);
    snprintf(cluster_url, sizeof(cluster_url), "redis://127.0.0.1:%d,127.0.0.1:%d", cluster[0].port,
             cluster[1].port);
    repl_up = start_cluster(repl, 6, 1);
    snprintf(repl_url, sizeof(repl_url), "redis://127.0.0.1:%d,127.0.0.1:%d", repl[0].port,
             repl[3].port);
    return 0;
}

static void servers_down(void)
{
    stop_server(&single);
    for (int i = 0; i < 3; i++)
        stop_server(&cluster[i]);
    for (int i = 0; i < 6; i++) {
        if (repl[i].pid > 0)
            kill(repl[i].pid, SIGCONT); /* a stopped one dies of SIGKILL all the same */
        stop_server(&repl[i]);
    }
    if (tmp_dir[0]) {
        char cmdline[4200];
        snprintf(cmdline, sizeof(cmdline), "rm -rf '%s'", tmp_dir);
        if (system(cmdline) != 0)
            print_message("could not remove %s\n", tmp_dir);
    }
}

/* ====================================== the runs ========================================== */

static const int32_t *token_ids(void)
{
    static int32_t ids[N_PROMPT + N_DECODE];
    for (int i = 0; i < N_PROMPT + N_DECODE; i++)
        ids[i] = (i * 7 + 3) % VOCAB;
    return ids;
}

static kvp_ctx *new_ctx(const char *url, struct kvp_err *err)
{
    struct kvp_ctx_params cp = base_params(url);
    kvp_ctx *c = NULL;
    int rc = kvp_ctx_init(model, &cp, &c, err);
    if (rc < 0)
        return NULL;
    struct kvp_policy_params pp = {.name = "quest", .budget = 64, .dense_layers = 1};
    assert_int_equal(kvp_ctx_set_policy(c, &pp, err), 0);
    return c;
}

/* Between decode steps of run(): step i is about to be decoded. */
typedef void (*step_hook)(int step);

/* A context on url with the prompt's N_PROMPT tokens evaluated. */
static kvp_ctx *prefilled(const char *url)
{
    struct kvp_err err = {0};
    kvp_ctx *c = new_ctx(url, &err);
    if (!c)
        print_message("ctx: %s\n", err.msg);
    assert_non_null(c);
    assert_int_equal(kvp_eval(c, token_ids(), N_PROMPT, NULL, false, &err), 0);
    return c;
}

/* Prefill N_PROMPT tokens, decode N_DECODE, the logits of every decode step (caller frees). */
static float *run(const char *url, step_hook hook, struct kvp_store_stats *st)
{
    struct kvp_err err = {0};
    kvp_ctx *c = prefilled(url);
    const int32_t *ids = token_ids();
    float *lg = calloc((size_t)N_DECODE * VOCAB, sizeof(float));
    for (int i = 0; i < N_DECODE; i++) {
        if (hook)
            hook(i);
        int rc = kvp_eval(c, ids + N_PROMPT + i, 1, lg + (size_t)i * VOCAB, false, &err);
        if (rc < 0)
            print_message("step %d: %s\n", i, err.msg);
        assert_int_equal(rc, 0);
    }
    if (st)
        assert_int_equal(kvp_ctx_store_stats(c, st), 0);
    kvp_ctx_free(c);
    return lg;
}

static float *ref;

static float *reference(void)
{
    if (!ref)
        ref = run(NULL, NULL, NULL);
    return ref;
}

static void assert_same_logits(const float *a, const float *b)
{
    assert_memory_equal(a, b, (size_t)N_DECODE * VOCAB * sizeof(float));
}

/* Prefill, then decode N_DECODE tokens, hook before each step. Every call either returns the
 * untiered run's logits bit for bit or fails with one line, and once one failed every later
 * one fails too (the context's KV is no longer trusted), checked for after_error more steps;
 * a failure is KVP_EKVLOST. Returns the steps that succeeded, the first error in first_err and
 * the slowest step's seconds in worst_s. */
static int run_faulty(const char *url, step_hook hook, char *first_err, size_t cap, double *worst_s,
                      int after_error)
{
    const float *want = reference();
    struct kvp_err err = {0};
    kvp_ctx *c = prefilled(url);
    const int32_t *ids = token_ids();
    float lg[VOCAB];
    int n_ok = 0, failed_at = -1;
    first_err[0] = 0;
    *worst_s = 0;
    for (int i = 0; i < N_DECODE; i++) {
        if (hook)
            hook(i);
        double t0 = kvp_time_now();
        int rc = kvp_eval(c, ids + N_PROMPT + i, 1, lg, false, &err);
        double dt = kvp_time_now() - t0;
        *worst_s = dt > *worst_s ? dt : *worst_s;
        if (rc == 0) {
            if (failed_at >= 0)
                print_message("step %d succeeded after the error of step %d\n", i, failed_at);
            assert_int_equal(failed_at, -1);
            assert_memory_equal(lg, want + (size_t)i * VOCAB, sizeof(lg));
            n_ok++;
            continue;
        }
        assert_null(strchr(err.msg, '\n'));
        assert_int_equal(rc, KVP_EKVLOST);
        if (failed_at < 0) {
            failed_at = i;
            snprintf(first_err, cap, "%s", err.msg);
        }
        if (i - failed_at >= after_error)
            break;
    }
    kvp_ctx_free(c);
    return n_ok;
}

/* Keys on the nodes while a context lives, none once it is freed. */
static int n_keys_seen;
static const struct server *keys_on;
static int n_keys_on;

static void count_keys(int step)
{
    if (step != N_DECODE - 1)
        return;
    for (int i = 0; i < n_keys_on; i++) {
        long long n = dbsize(&keys_on[i]);
        print_message("port %d: %lld keys\n", keys_on[i].port, n);
        assert_true(n > 0); /* the cluster spreads the units over every master */
        n_keys_seen += (int)n;
    }
}

static void test_single_equal(void **state)
{
    (void)state;
    REQUIRE_REDIS();
    keys_on = &single;
    n_keys_on = 1;
    struct kvp_store_stats st;
    float *lg = run(single_url, count_keys, &st);
    print_message("single: hits %llu, misses %llu, prefetched %llu, read %llu B, written %llu B\n",
                  (unsigned long long)st.hits, (unsigned long long)st.misses,
                  (unsigned long long)st.prefetched, (unsigned long long)st.bytes_read,
                  (unsigned long long)st.bytes_written);
    assert_true(st.bytes_read > 0 && st.misses > 0 && st.prefetched > 0);
    assert_same_logits(reference(), lg);
    free(lg);
    assert_int_equal(dbsize(&single), 0);
    /* one request per round trip: slower, the same bytes */
    char url[96];
    snprintf(url, sizeof(url), "%s?pipeline=1", single_url);
    lg = run(url, NULL, NULL);
    assert_same_logits(reference(), lg);
    free(lg);
    assert_int_equal(dbsize(&single), 0);
}

static void test_cluster_equal(void **state)
{
    (void)state;
    REQUIRE_CLUSTER();
    /* our slots are the server's */
    for (int i = 0; i < 50; i++) {
        char key[64];
        snprintf(key, sizeof(key), "kvp:%d.%d.%08x:%d:%d", 4242 + i, i, i * 77777u, i % 4, i);
        long long want = -1;
        redisReply *r = cmd(cluster[0].port, "CLUSTER KEYSLOT %s", key);
        if (r && r->type == REDIS_REPLY_INTEGER)
            want = r->integer;
        if (r)
            freeReplyObject(r);
        assert_int_equal(kvp_redis_key_slot(key, strlen(key)), want);
    }
    keys_on = cluster;
    n_keys_on = 3;
    struct kvp_store_stats st;
    float *lg = run(cluster_url, count_keys, &st);
    assert_true(st.bytes_read > 0);
    assert_same_logits(reference(), lg);
    free(lg);
    for (int i = 0; i < 3; i++)
        assert_int_equal(dbsize(&cluster[i]), 0);
}

/* ====================================== faults ============================================ */

static void expect_init_error(const char *url, int code, const char *needle, double max_s)
{
    struct kvp_err err = {0};
    double t0 = kvp_time_now();
    struct kvp_ctx_params cp = base_params(url);
    kvp_ctx *c = NULL;
    int rc = kvp_ctx_init(model, &cp, &c, &err);
    double dt = kvp_time_now() - t0;
    print_message("%s: %s (%.2f s)\n", url, err.msg, dt);
    assert_int_equal(rc, code);
    assert_null(c);
    assert_non_null(strstr(err.msg, needle));
    assert_null(strchr(err.msg, '\n'));
    assert_true(dt < max_s);
}

static void test_wrong_urls(void **state)
{
    (void)state;
    expect_init_error("http://127.0.0.1:6379", KVP_EINVAL, "expected redis://", 1);
    expect_init_error("redis://127.0.0.1", KVP_EINVAL, "expected redis://", 1);
    expect_init_error("redis://127.0.0.1:0", KVP_EINVAL, "expected redis://", 1);
    expect_init_error("redis://127.0.0.1:70000", KVP_EINVAL, "expected redis://", 1);
    expect_init_error("redis://:6379", KVP_EINVAL, "expected redis://", 1);
    expect_init_error("redis://127.0.0.1:6379,", KVP_EINVAL, "expected redis://", 1);
    expect_init_error("redis://127.0.0.1:6379?timeout=5", KVP_EINVAL, "timeout_ms", 1);
    expect_init_error("redis://127.0.0.1:6379?ttl_ms=10", KVP_EINVAL, "ttl_ms", 1);
    /* nothing listens on a port we just found free: refused at once */
    int port = pick_port();
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
    expect_init_error(url, KVP_EIO, "Connection refused", 2);
    expect_init_error("redis://no-such-host.invalid:6379?timeout_ms=500", KVP_EIO,
                      "no server answered", 10);
    /* the CLI says it in one line */
    KVP_REQUIRE_CLI(cli);
    char cmdline[512];
    snprintf(cmdline, sizeof(cmdline),
             "%s bench -m %s -c 64 -n 4 -r 1 --prefill 16 --policy quest --budget 32 "
             "--kv-tier redis --kv-url %s 2>&1",
             cli, model_path, url);
    kvp_test_expect_error(cmdline, "Connection refused");
    snprintf(cmdline, sizeof(cmdline), "%s bench -m %s -c 64 --kv-tier redis 2>&1", cli,
             model_path);
    kvp_test_expect_error(cmdline, "--kv-url");
}

/* A socket that accepts connections (the kernel's backlog does) and never answers. */
static void test_silent_server(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char url[96];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d?timeout_ms=300", ntohs(a.sin_port));
    expect_init_error(url, KVP_EIO, "no reply within 300 ms", 3);
    close(fd);
}

/* Step 1: the single server stops (SIGSTOP); step 6: it answers again. */
static void stall_hook(int step)
{
    if (step == 1)
        kill(single.pid, SIGSTOP);
    if (step == 6)
        kill(single.pid, SIGCONT);
}

/* The server stops answering in the middle of decoding: a step that needs it fails with one
 * error within the timeout (a single server has no replica to wait for), and every later step
 * fails too, also once it answers again; the context is then freed cleanly. */
static void test_stalled_server(void **state)
{
    (void)state;
    REQUIRE_REDIS();
    char url[96], msg[512];
    snprintf(url, sizeof(url), "%s?timeout_ms=400", single_url);
    double worst;
    int n_ok = run_faulty(url, stall_hook, msg, sizeof(msg), &worst, N_DECODE);
    kill(single.pid, SIGCONT);
    print_message("stalled: %d steps fine, then %s (slowest step %.2f s)\n", n_ok, msg, worst);
    assert_true(n_ok < N_DECODE);
    assert_non_null(strstr(msg, "no reply within 400 ms"));
    /* one timeout per try of the failed record: the store's few retries each meet it */
    assert_true(worst < 5);
    assert_int_equal(dbsize(&single), 0);
}

/* maxmemory reached with noeviction: the writes of the prompt are refused, one error naming OOM;
 * what was written is deleted with the context. */
/* A bit flipped in Redis in the first, a middle and the last unit of one read is caught: with
 * every block read at each step (dense prefetch, no policy), the first decode step after the
 * prompt (200 tokens, blocks of 16) reads each layer's blocks 0..11 in one request (block 12,
 * the newest, is being written). Each flip (the last byte of the unit's value, written back
 * with SET) gets a fresh context; the step fails with KVP_EKVLOST and the KV is trusted up to
 * the flipped block's first token. */
static void test_bit_flip_in_redis(void **state)
{
    (void)state;
    REQUIRE_REDIS();
    static const int blocks[] = {0, 5, 11};
    for (size_t k = 0; k < sizeof(blocks) / sizeof(blocks[0]); k++) {
        struct kvp_ctx_params cp = base_params(single_url);
        cp.prefetch = KVP_PREFETCH_DENSE;
        cp.hot_budget = 0;
        kvp_ctx *c = NULL;
        struct kvp_err err = {0};
        assert_int_equal(kvp_ctx_init(model, &cp, &c, &err), 0);
        assert_int_equal(kvp_eval(c, token_ids(), N_PROMPT, NULL, false, &err), 0);
        redisReply *keys = cmd(single.port, "KEYS kvp:*:1:%d", blocks[k]);
        assert_non_null(keys);
        assert_int_equal(keys->type, REDIS_REPLY_ARRAY);
        assert_int_equal(keys->elements, 1);
        const char *key = keys->element[0]->str;
        redisReply *v = cmd(single.port, "GET %s", key);
        assert_true(v && v->type == REDIS_REPLY_STRING && v->len > 0);
        v->str[v->len - 1] ^= 0x20;
        const char *argv[] = {"SET", key, v->str};
        const size_t lens[] = {3, strlen(key), v->len};
        redisReply *r = cmdv(single.port, 3, argv, lens);
        assert_true(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
        freeReplyObject(v);
        freeReplyObject(keys);
        float lg[VOCAB];
        int rc = kvp_eval(c, token_ids() + N_PROMPT, 1, lg, false, &err);
        print_message("block %d flipped: %s\n", blocks[k], rc < 0 ? err.msg : "not caught");
        assert_int_equal(rc, KVP_EKVLOST);
        assert_int_equal(kvp_ctx_trusted_tokens(c), blocks[k] * 16);
        kvp_ctx_free(c);
    }
    assert_int_equal(dbsize(&single), 0);
}

static void test_maxmemory(void **state)
{
    (void)state;
    REQUIRE_REDIS();
    redisReply *r = cmd(single.port, "INFO memory");
    assert_non_null(r);
    const char *u = strstr(r->str, "used_memory:");
    assert_non_null(u);
    long long used = atoll(u + 12);
    freeReplyObject(r);
    char limit[32];
    snprintf(limit, sizeof(limit), "%lld", used + 128 * 1024); /* a third of the prompt's units */
    assert_true(cmd_ok(single.port, "CONFIG SET maxmemory-policy %s", "noeviction", NULL));
    assert_true(cmd_ok(single.port, "CONFIG SET maxmemory %s", limit, NULL));
    struct kvp_err err = {0};
    kvp_ctx *c = new_ctx(single_url, &err);
    assert_non_null(c);
    const int32_t *ids = token_ids();
    int rc = kvp_eval(c, ids, N_PROMPT, NULL, false, &err);
    print_message("maxmemory: %s\n", err.msg);
    assert_int_equal(rc, KVP_EKVLOST);
    assert_non_null(strstr(err.msg, "OOM"));
    assert_true(dbsize(&single) > 0);
    kvp_ctx_free(c);
    assert_true(cmd_ok(single.port, "CONFIG SET maxmemory %s", "0", NULL));
    assert_int_equal(dbsize(&single), 0);
}

/* ---- slot migration during decode ---- */

static char node_id[3][64];

static void read_node_ids(void)
{
    for (int i = 0; i < 3; i++) {
        redisReply *r = cmd(cluster[i].port, "CLUSTER MYID");
        assert_true(r && r->type == REDIS_REPLY_STRING && r->len < sizeof(node_id[i]));
        memcpy(node_id[i], r->str, r->len + 1);
        freeReplyObject(r);
    }
}

/* The slots of node 0 holding our keys (up to cap), from a SCAN of it. */
static int busy_slots(int *slots, int cap)
{
    int n = 0;
    char cursor[32] = "0";
    do {
        redisReply *r = cmd(cluster[0].port, "SCAN %s COUNT 1000", cursor);
        assert_true(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
        snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            const redisReply *k = r->element[1]->element[i];
            int sl = kvp_redis_key_slot(k->str, k->len), seen = 0;
            for (int j = 0; j < n; j++)
                seen |= slots[j] == sl;
            if (!seen && n < cap)
                slots[n++] = sl;
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0"));
    return n;
}

/* MIGRATE the keys of slot sl on node 0 to node 1: all of them, or every other one. */
static void migrate_keys(int sl, bool half)
{
    redisReply *r = cmd(cluster[0].port, "CLUSTER GETKEYSINSLOT %d 1000", sl);
    assert_true(r && r->type == REDIS_REPLY_ARRAY);
    const char *argv[1100];
    size_t lens[1100];
    char port[16];
    snprintf(port, sizeof(port), "%d", cluster[1].port);
    int n = 0;
    const char *head[] = {"MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS"};
    for (int i = 0; i < 7; i++) {
        argv[n] = head[i];
        lens[n++] = strlen(head[i]);
    }
    for (size_t i = 0; i < r->elements; i += half ? 2 : 1) {
        argv[n] = r->element[i]->str;
        lens[n++] = r->element[i]->len;
    }
    if (n > 7) {
        redisReply *m = cmdv(cluster[0].port, n, argv, lens);
        assert_true(m && m->type == REDIS_REPLY_STATUS);
        freeReplyObject(m);
    }
    freeReplyObject(r);
}

static int mig_slots[512], n_mig;

static long long stat_calls(int port, const char *name)
{
    redisReply *r = cmd(port, "INFO commandstats");
    long long v = 0;
    char pat[64];
    snprintf(pat, sizeof(pat), "cmdstat_%s:calls=", name);
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, pat) : NULL;
    if (p)
        v = atoll(p + strlen(pat));
    if (r)
        freeReplyObject(r);
    return v;
}

/* Step 5: every busy slot of node 0 starts moving to node 1 and half its keys go (requests for
 * them get ASK); step 20: the rest go and node 1 owns the slots (requests get MOVED). */
static void migrate_hook(int step)
{
    char sl[16];
    if (step == 5) {
        read_node_ids();
        n_mig = busy_slots(mig_slots, 512);
        print_message("migrating %d slots\n", n_mig);
        assert_true(n_mig > 0);
        for (int i = 0; i < n_mig; i++) {
            snprintf(sl, sizeof(sl), "%d", mig_slots[i]);
            assert_true(cmd_ok(cluster[1].port, "CLUSTER SETSLOT %s IMPORTING %s", sl, node_id[0]));
            assert_true(cmd_ok(cluster[0].port, "CLUSTER SETSLOT %s MIGRATING %s", sl, node_id[1]));
            migrate_keys(mig_slots[i], true);
        }
    }
    if (step == 20)
        for (int i = 0; i < n_mig; i++) {
            snprintf(sl, sizeof(sl), "%d", mig_slots[i]);
            /* a rewrite of a key node 0 still held may land after a MIGRATE (our writes are
             * asynchronous): move until the slot is empty there, as SETSLOT NODE requires */
            for (int t = 0; t < 100; t++) {
                migrate_keys(mig_slots[i], false);
                char q[48];
                snprintf(q, sizeof(q), "CLUSTER COUNTKEYSINSLOT %s", sl);
                if (cmd_int(cluster[0].port, q) == 0)
                    break;
                usleep(10000);
            }
            for (int k = 0; k < 3; k++) /* the owner last, as redis-cli does */
                assert_true(cmd_ok(cluster[(k + 1) % 3].port, "CLUSTER SETSLOT %s NODE %s", sl,
                                   node_id[1]));
        }
}

static void test_slot_migration(void **state)
{
    (void)state;
    REQUIRE_CLUSTER();
    long long asking0 = stat_calls(cluster[1].port, "asking");
    long long slots0 = 0;
    for (int i = 0; i < 3; i++)
        slots0 += stat_calls(cluster[i].port, "cluster|slots");
    float *lg = run(cluster_url, migrate_hook, NULL);
    assert_same_logits(reference(), lg);
    free(lg);
    long long asking = stat_calls(cluster[1].port, "asking") - asking0, slots = -slots0;
    for (int i = 0; i < 3; i++)
        slots += stat_calls(cluster[i].port, "cluster|slots");
    print_message("ASKING sent %lld times, CLUSTER SLOTS %lld times\n", asking, slots);
    assert_true(asking > 0); /* ASK was followed */
    assert_true(slots > 1);  /* MOVED refreshed the map (the first one is the open's) */
    for (int i = 0; i < 3; i++)
        assert_int_equal(dbsize(&cluster[i]), 0);
}

/* ---- masters killed or stopped ---- */

static struct server *victim;
static int victim_sig, victim_step;

/* Step victim_step: the victim gets victim_sig. */
static void victim_hook(int step)
{
    if (step != victim_step)
        return;
    print_message("step %d: signal %d to the master on port %d\n", step, victim_sig, victim->port);
    if (victim_sig == SIGKILL) {
        stop_server(victim);
        return;
    }
    kill(victim->pid, victim_sig);
}

/* A master without a replica is killed mid-run: the step that needs it fails with one error
 * naming it, quickly (nothing can take its place, so there is nothing to wait for), and so does
 * every later step; the context is freed without a hang and the others' keys are deleted. Runs
 * last of the plain cluster's tests: it has lost a third of its slots afterwards. */
static void test_killed_node(void **state)
{
    (void)state;
    REQUIRE_CLUSTER();
    char url[160], msg[512];
    snprintf(url, sizeof(url), "%s?timeout_ms=1000", cluster_url);
    victim = &cluster[2];
    victim_sig = SIGKILL;
    victim_step = 1;
    double worst, t0 = kvp_time_now();
    int n_ok = run_faulty(url, victim_hook, msg, sizeof(msg), &worst, N_DECODE);
    print_message("killed node: %d steps fine, then %s (slowest step %.2f s, %.2f s in all)\n",
                  n_ok, msg, worst, kvp_time_now() - t0);
    assert_true(n_ok < N_DECODE);
    char port[32];
    snprintf(port, sizeof(port), ":%d", victim->port);
    assert_non_null(strstr(msg, port));
    assert_true(worst < 5);
    assert_int_equal(dbsize(&cluster[0]), 0);
    assert_int_equal(dbsize(&cluster[1]), 0);
}

/* A live node of the replicated cluster: not killed, not stopped. */
static const struct server *repl_live(void)
{
    for (int i = 0; i < 6; i++)
        if (repl[i].pid > 0 && &repl[i] != victim)
            return &repl[i];
    return NULL;
}

/* The port of the master of slot range i (CLUSTER SLOTS order) and its replica count, as a
 * live node sees it; -1 when it does not answer. */
static int range_master(int i, int *replicas)
{
    redisReply *r = cmd(repl_live()->port, "CLUSTER SLOTS");
    int port = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && (size_t)i < r->elements) {
        const redisReply *e = r->element[i];
        port = (int)e->element[2]->element[1]->integer;
        *replicas = (int)e->elements - 3;
    }
    if (r)
        freeReplyObject(r);
    return port;
}

/* The master of the slot range that starts at `first` (CLUSTER SLOTS does not keep its ranges in
 * one order across a failover), or -1. */
static int master_of_slot(long long first)
{
    redisReply *r = cmd(repl_live()->port, "CLUSTER SLOTS");
    int port = -1;
    for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
        const redisReply *e = r->element[k];
        if (e->type == REDIS_REPLY_ARRAY && e->elements >= 3 && e->element[0]->integer == first)
            port = (int)e->element[2]->element[1]->integer;
    }
    if (r)
        freeReplyObject(r);
    return port;
}

static long long range_first_slot(int i)
{
    redisReply *r = cmd(repl_live()->port, "CLUSTER SLOTS");
    long long first = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && (size_t)i < r->elements)
        first = r->element[i]->element[0]->integer;
    if (r)
        freeReplyObject(r);
    return first;
}

static struct server *repl_by_port(int port)
{
    for (int i = 0; i < 6; i++)
        if (repl[i].port == port && repl[i].pid > 0)
            return &repl[i];
    return NULL;
}

/* Wait (up to 15 s) until the replicated cluster has settled: every live node says ok and sees
 * 3 slot ranges, each master with `replicas` replicas. */
static bool repl_settled(int replicas)
{
    for (int t = 0; t < 1500; t++) {
        bool ok = true;
        for (int i = 0; i < 6 && ok; i++) {
            if (repl[i].pid <= 0)
                continue;
            redisReply *r = cmd(repl[i].port, "CLUSTER INFO");
            ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
            if (r)
                freeReplyObject(r);
            int with = 0;
            ok = ok && slot_ranges(&repl[i], replicas, &with) == 3 && with == 3;
        }
        if (ok)
            return true;
        usleep(10000);
    }
    return false;
}

/* Kill (SIGKILL) or stop (SIGSTOP) the master of slot range `range` of the replicated cluster at
 * step 10 and decode on (URL options opts): every step must succeed with the untiered logits, the
 * promoted replica serving the units its master held (its GET count grows). */
static void failover_run(int range, int sig, const char *opts)
{
    REQUIRE_REPL();
    char url[192];
    snprintf(url, sizeof(url), "%s%s", repl_url, opts);
    int replicas = 0, port = range_master(range, &replicas);
    long long first = range_first_slot(range);
    assert_true(port > 0 && replicas > 0 && first >= 0);
    victim = repl_by_port(port);
    assert_non_null(victim);
    victim_sig = sig;
    victim_step = 10;
    char msg[512];
    double worst, t0 = kvp_time_now();
    int n_ok = run_faulty(url, victim_hook, msg, sizeof(msg), &worst, 0);
    double all = kvp_time_now() - t0;
    /* the node asked may learn of the promotion after the store did (the store follows MOVED
     * and asks every node): wait up to 5 s for its view of the range to move */
    int promoted = master_of_slot(first);
    for (int t = 0; t < 500 && promoted == port; t++) {
        usleep(10000);
        promoted = master_of_slot(first);
    }
    print_message("failover of %d to %d: %d of %d steps equal (%s), slowest step %.2f s, "
                  "%.2f s in all\n",
                  port, promoted, n_ok, N_DECODE, msg[0] ? msg : "no error", worst, all);
    assert_int_equal(n_ok, N_DECODE);
    assert_true(promoted > 0 && promoted != port);
    assert_true(stat_calls(promoted, "get") > 0); /* it served what its master held */
    if (sig == SIGSTOP) {                         /* it comes back as the new master's replica */
        kill(victim->pid, SIGCONT);
        victim = NULL;
    }
    t0 = kvp_time_now();
    assert_true(repl_settled(sig == SIGSTOP));
    print_message("settled in %.2f s\n", kvp_time_now() - t0);
    for (int i = 0; i < 3; i++) { /* no key left on any master */
        int r = 0, m = range_master(i, &r);
        assert_int_equal(dbsize(repl_by_port(m)), 0);
    }
}

/* A master that stops answering (SIGSTOP) mid-decode: its requests time out, wait for the
 * cluster to fail it over (about NODE_TIMEOUT_MS) and are sent to the promoted replica. */
static void test_failover_stopped_master(void **state)
{
    (void)state;
    failover_run(0, SIGSTOP, "?timeout_ms=500");
}

/* A master killed (SIGKILL) mid-decode: the connection drops at once, the requests wait for the
 * failover and go to the promoted replica. With ?pipeline=3 the depth limit is exercised too. */
static void test_failover_killed_master(void **state)
{
    (void)state;
    failover_run(1, SIGKILL, "?pipeline=3");
}

#endif /* KVP_HAVE_HIREDIS */

/* ====================================== fixtures ========================================== */

static int setup(void **state)
{
    (void)state;
    struct kvp_test_model_spec sp = {.n_vocab = VOCAB,
                                     .n_embd = 64,
                                     .n_layer = 4,
                                     .n_head = 4,
                                     .n_head_kv = 2,
                                     .n_ff = 96,
                                     .n_ctx = 512,
                                     .type = 0,
                                     .embd_type = 0,
                                     .tied = 1,
                                     .seed = 29};
    model = kvp_test_model(&sp, &model_path);
#ifdef KVP_HAVE_HIREDIS
    return servers_up();
#else
    return 0;
#endif
}

static int teardown(void **state)
{
    (void)state;
#ifdef KVP_HAVE_HIREDIS
    servers_down();
    free(ref);
#endif
    kvp_test_model_free(model, model_path);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16),
        cmocka_unit_test(test_seed_list),
#ifdef KVP_HAVE_HIREDIS
        cmocka_unit_test(test_wrong_urls),
        cmocka_unit_test(test_silent_server),
        cmocka_unit_test(test_single_equal),
        cmocka_unit_test(test_bit_flip_in_redis),
        cmocka_unit_test(test_maxmemory),
        cmocka_unit_test(test_stalled_server),
        cmocka_unit_test(test_cluster_equal),
        cmocka_unit_test(test_slot_migration),
        cmocka_unit_test(test_killed_node),
        cmocka_unit_test(test_failover_stopped_master),
        cmocka_unit_test(test_failover_killed_master),
#else
        cmocka_unit_test(test_not_built),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
