/*
 * libFuzzer harness for `kvpred serve` at the socket: raw bytes go over a loopback TCP
 * connection into a real server (src/server/, libmicrohttpd in its event-driven mode), so what is
 * fuzzed is everything a client can reach: libmicrohttpd's HTTP parsing, the connection limits,
 * the routes, the body limit, the API key, the request parser, tokenizing, the queue, generation,
 * streaming, and clients that leave at any point.
 *
 * The server runs in this process for the whole campaign (started on the first input), with the
 * default model when the checkout has it (models/kvpred-default.gguf: answers are generated, a
 * few tokens each) and else the fixtures' tiny model (no tokenizer: completions are refused
 * after parsing). Byte 0 of an input picks how the client behaves; the rest is sent as it is:
 *   bits 0-1  0: send, close the sending side, read the answer
 *             1: send, read the answer with the connection left open
 *             2: send half, then vanish (reset)
 *             3: send, then vanish at once (reset), answer unread
 *   bit 2     send in pieces of 7 bytes
 * Checks: the sanitizers in every server thread, and every 64 inputs a GET /health that must be
 * answered 200 within 2 seconds (a wedged or dead server aborts).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "fixtures.h"
#include "kvpred.h"
#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct srv_server *server;
static int port;
static unsigned long long n_inputs;

static void start_server(void)
{
    signal(SIGPIPE, SIG_IGN);
    static char model_path[4096];
    snprintf(model_path, sizeof(model_path), "%s/models/kvpred-default.gguf", KVP_SOURCE_DIR);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    if (kvp_model_open(model_path, NULL, &m, &err) < 0) {
        fprintf(stderr, "fuzz_server_http: %s: %s; using the tiny model (no tokenizer)\n",
                model_path, err.msg);
        m = fz_tiny_model();
        snprintf(model_path, sizeof(model_path), "fuzz-tiny.gguf");
    }
    if (!m)
        abort();
    struct srv_config cfg = {
        .host = "127.0.0.1", .port = 0, .model_path = model_path, .api_key = NULL,
        .n_slots = 1, .max_queue = 2, .max_body = 65536, .max_tokens = 8,
        .default_max_tokens = 4, .timeout_s = 1, .send_timeout_s = 2, .max_conn = 64,
        .max_client_conn = 0, .http_threads = 2, .cache_ram = 1 << 20,
        .cp = {.n_ctx = 128, .n_threads = 1}, .temperature = 0, .top_p = 0.95, .top_k = 40,
        .seed = 42,
    };
    if (srv_server_start(&cfg, m, &server, &err) < 0) {
        fprintf(stderr, "fuzz_server_http: %s\n", err.msg);
        abort();
    }
    port = srv_server_port(server);
}

static int connect_local(int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Close with a reset: the server's side goes at once (no FIN handshake left to it). */
static void vanish(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

static void send_bytes(int fd, const uint8_t *p, size_t n, bool pieces)
{
    size_t step = pieces ? 7 : n;
    for (size_t off = 0; off < n;) {
        size_t k = n - off < step ? n - off : step;
        ssize_t w = send(fd, p + off, k, MSG_NOSIGNAL);
        if (w <= 0)
            return; /* the server closed or refused: fine, it may */
        off += (size_t)w;
    }
}

/* Read until EOF, an error, or a pause longer than the socket's timeout; bytes read. */
static size_t drain(int fd)
{
    char buf[65536];
    size_t total = 0;
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r <= 0)
            return total;
        total += (size_t)r;
    }
}

static void health_or_abort(void)
{
    int fd = connect_local(2000);
    if (fd < 0) {
        fprintf(stderr, "fuzz_server_http: cannot connect for /health: %s\n", strerror(errno));
        abort();
    }
    static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    send_bytes(fd, (const uint8_t *)req, sizeof(req) - 1, false);
    char buf[256] = {0};
    size_t got = 0;
    while (got < sizeof(buf) - 1) {
        ssize_t r = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (strncmp(buf, "HTTP/1.1 200", 12) != 0) {
        fprintf(stderr, "fuzz_server_http: /health answered '%.40s'\n", buf);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!server)
        start_server();
    if (size < 1)
        return 0;
    int mode = data[0] & 3;
    bool pieces = data[0] & 4;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    /* a short read timeout: an answer (a few tokens of a tiny model) comes within it, or its
     * request is incomplete or kept alive, and the client leaves (the server notices the reset
     * at once, or its own --timeout of 1 s closes the connection) */
    int fd = connect_local(mode == 1 ? 20 : 30);
    if (fd >= 0) {
        switch (mode) {
        case 0:
            send_bytes(fd, p, n, pieces);
            shutdown(fd, SHUT_WR);
            drain(fd);
            vanish(fd);
            break;
        case 1:
            send_bytes(fd, p, n, pieces);
            drain(fd);
            vanish(fd);
            break;
        case 2:
            send_bytes(fd, p, n / 2, pieces);
            vanish(fd);
            break;
        default:
            send_bytes(fd, p, n, pieces);
            vanish(fd);
            break;
        }
    }
    if (++n_inputs % 64 == 0)
        health_or_abort();
    return 0;
}
