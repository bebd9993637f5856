/* The shared prefix store on Redis (see prefix_store.h). */
#include "server/prefix_store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/err.h"
#include "core/fnv.h"
#include "core/platform.h"
#include "forward/context.h"
#include "kv/kvcache.h"
#include "server/bytes.h"
#include "server/prefix.h"
#include "server/prefix_redis.h"

#ifndef KVP_HAVE_HIREDIS

int srv_pstore_open(const struct srv_pstore_config *cfg, struct srv_pstore **out,
                    struct kvp_err *err)
{
    *out = NULL;
    return kvp_err_set(err, KVP_EINVAL,
                       "--prefix-store: this kvpred was built without hiredis (libhiredis-dev)");
}
void srv_pstore_close(struct srv_pstore *ps)
{
}
void srv_pstore_prefetch(struct srv_pstore *ps, const int32_t *ids, int n, int have)
{
}
bool srv_pstore_pending(struct srv_pstore *ps, const int32_t *ids, int n)
{
    return false;
}
int srv_pstore_load(struct srv_pstore *ps, kvp_ctx *ctx, const int32_t *ids, int n, int have)
{
    return 0;
}
void srv_pstore_forget(struct srv_pstore *ps, const int32_t *ids, int n)
{
}
void srv_pstore_put(struct srv_pstore *ps, kvp_ctx *ctx, const int32_t *ids, int n)
{
}
size_t srv_pstore_metrics(struct srv_pstore *ps, char *buf, size_t cap)
{
    return 0;
}

#else

#define VALUE_VERSION   1u
#define KEY_PREFIX      "kvpfx:"
#define KEY_LEN         (6 + 32) /* the prefix and 128 bits in hex */
#define READERS         2        /* fetch threads: two documents asked for at once side by side */
#define MAX_FETCHES     32       /* lookups queued or done and not yet taken */
#define FETCH_MAX_AGE_S 60.0     /* a fetch nobody took (the request went away) is dropped */
#define FETCH_BYTES_MAX ((size_t)4 << 30)  /* read and not yet taken: beyond, reads wait */
#define CHUNK_BYTES     ((size_t)64 << 20) /* values per pipelined batch: bounds the buffers */
#define WRITE_QUEUE_MAX ((size_t)2 << 30)  /* bytes waiting for the writer before puts are dropped */
#define RETRY_S         5.0      /* an unreachable store is tried again after this */
#define MIN_GAIN        256      /* tokens a prompt must add to what is stored to be stored */
#define KNOWN_CAP       (1 << 16)
#define REPAIRS         16       /* blocks found damaged or evicted inside a stored prefix */
#define DEFAULT_TTL_S   86400
#define DEFAULT_TIMEOUT_MS 2000
static const char MAGIC[8] = {'K', 'V', 'P', 'S', 'B', 'L', 'K', '1'};

/* The chain's hash is FNV-1a with 128 bits (core/fnv.h). Keys are checked against the stored
 * header and tokens anyway; 128 bits keep two different prefixes from ever fighting over one
 * key. */

enum { FETCH_QUEUED, FETCH_RUNNING, FETCH_DONE };

struct fetch {
    int32_t *ids;
    int n;        /* tokens looked up: whole blocks */
    int have;     /* the server held this much when it was asked: no read unless longer */
    int state;
    bool abandoned; /* its request needs it no more: the reader frees it when done */
    int m;        /* tokens read and checked (data holds them) */
    int nb_e;     /* blocks per layer in data */
    uint8_t *data;/* [n_layer][nb_e] units */
    size_t data_bytes; /* counted in fetch_bytes */
    double t_made;
    struct fetch *next;
};

struct write {
    int first, nb;    /* blocks [first, first + nb) */
    kvp_u128 *chain;      /* [nb + 1]: the parent of `first`, then each block's key */
    int32_t *toks;    /* [nb * bs] */
    uint8_t *data;    /* [n_layer][nb] units */
    size_t bytes;
    struct write *next;
};

struct pstats {
    uint64_t lookups, hits, tokens_loaded, written, shared, refused, missing, errors, dropped;
    double lookup_s, read_s;
};

struct srv_pstore {
    char *seeds;
    int ttl_s, timeout_ms, min_tokens;
    int bs, n_layer, n_head_kv, head_dim, type_k, type_v;
    size_t k_bytes, v_bytes, unit_bytes, hdr_bytes, value_bytes;
    kvp_u128 seed;
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    struct fetch *fetches;
    int n_fetches;
    struct write *wq_head, *wq_tail;
    size_t wq_bytes;
    size_t fetch_bytes; /* data of fetches read and not yet taken */
    uint64_t *known; /* open addressing: chain keys known to be stored (0 empty, 1 deleted) */
    int known_used;
    kvp_u128 repair[REPAIRS]; /* ring: a put starting at one of these writes it whatever it adds */
    int repair_next;
    bool up;
    double retry_at;
    bool quit;
    pthread_t readers[READERS], writer;
    int n_readers;
    bool writer_started;
    void (*on_ready)(void *arg);
    void *on_ready_arg;
    struct pstats st;
};

static void say(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "kvpred serve: prefix store: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
}

/* ---- keys ------------------------------------------------------------------------------- */

/* chain[b] = the key of block b of ids (chain[-1] is the store's seed). */
static void make_chain(const struct srv_pstore *ps, const int32_t *ids, int nb, kvp_u128 *chain)
{
    kvp_u128 h = ps->seed;
    for (int b = 0; b < nb; b++) {
        uint8_t prev[16];
        memcpy(prev, &h, 16);
        h = kvp_fnv128(kvp_fnv128(kvp_fnv128_init(), prev, 16), ids + (size_t)b * ps->bs,
                   (size_t)ps->bs * sizeof(int32_t));
        chain[b] = h;
    }
}

static void key_text(kvp_u128 k, char *out)
{
    static const char hex[] = "0123456789abcdef";
    memcpy(out, KEY_PREFIX, 6);
    for (int i = 0; i < 32; i++)
        out[6 + i] = hex[(int)(k >> (124 - 4 * i)) & 15];
    out[KEY_LEN] = 0;
}

static uint64_t known_slot_key(kvp_u128 k)
{
    return (uint64_t)k | 2; /* never 0 (empty) or 1 (deleted) */
}

static bool known_has(const struct srv_pstore *ps, kvp_u128 k)
{
    uint64_t v = known_slot_key(k);
    for (uint32_t i = (uint32_t)(v >> 32) & (KNOWN_CAP - 1);; i = (i + 1) & (KNOWN_CAP - 1)) {
        if (ps->known[i] == v)
            return true;
        if (ps->known[i] == 0)
            return false;
    }
}

static void known_set(struct srv_pstore *ps, kvp_u128 k, bool stored)
{
    uint64_t v = known_slot_key(k);
    if (stored && ps->known_used >= KNOWN_CAP / 2) {
        /* full: forget everything (a later put copies a little more than it must) */
        memset(ps->known, 0, KNOWN_CAP * sizeof(*ps->known));
        ps->known_used = 0;
    }
    uint32_t i = (uint32_t)(v >> 32) & (KNOWN_CAP - 1);
    int free_at = -1;
    for (;; i = (i + 1) & (KNOWN_CAP - 1)) {
        if (ps->known[i] == v) {
            if (!stored)
                ps->known[i] = 1;
            return;
        }
        if (ps->known[i] == 1 && free_at < 0)
            free_at = (int)i;
        if (ps->known[i] == 0)
            break;
    }
    if (!stored)
        return;
    if (free_at < 0) {
        free_at = (int)i;
        ps->known_used++;
    }
    ps->known[free_at] = v;
}

/* A block missing inside a stored prefix (refused, evicted while later blocks stay): unlike the
 * end of a document, which a follow-up question extends by a few tokens, it is worth a write
 * however short the rest of the prompt (lock held). */
static void repair_note(struct srv_pstore *ps, kvp_u128 k)
{
    ps->repair[ps->repair_next] = k;
    ps->repair_next = (ps->repair_next + 1) % REPAIRS;
}

static bool repair_take(struct srv_pstore *ps, kvp_u128 k)
{
    for (int i = 0; i < REPAIRS; i++)
        if (ps->repair[i] == k) {
            ps->repair[i] = 0;
            return true;
        }
    return false;
}

/* ---- availability ----------------------------------------------------------------------- */

static void went_down(struct srv_pstore *ps, const char *why)
{
    pthread_mutex_lock(&ps->mu);
    ps->retry_at = kvp_time_now() + RETRY_S;
    if (ps->up)
        say("%s unreachable (%s): serving from this server's own prefix cache, trying again "
            "every 5 s", ps->seeds, why);
    ps->up = false;
    pthread_mutex_unlock(&ps->mu);
}

static void came_up(struct srv_pstore *ps)
{
    pthread_mutex_lock(&ps->mu);
    if (!ps->up)
        say("%s answers again%s", ps->seeds, "");
    ps->up = true;
    pthread_mutex_unlock(&ps->mu);
}

/* Worth asking (lock held): up, or down long enough to try again. */
static bool usable(const struct srv_pstore *ps)
{
    return ps->up || kvp_time_now() >= ps->retry_at;
}

/* ---- values ----------------------------------------------------------------------------- */


/* Block b's value into out (value_bytes): units from data ([n_layer][nb_d] units, the block at
 * column col). */
static void value_fill(const struct srv_pstore *ps, int b, kvp_u128 key, kvp_u128 parent,
                       const int32_t *toks, const uint8_t *data, int nb_d, int col, uint8_t *out)
{
    memset(out, 0, 64);
    memcpy(out, MAGIC, 8);
    srv_put_u32(out + 8, VALUE_VERSION);
    srv_put_u32(out + 12, (uint32_t)b);
    srv_put_u32(out + 16, (uint32_t)ps->n_layer);
    srv_put_u32(out + 20, (uint32_t)ps->bs);
    memcpy(out + 24, &key, 16);
    memcpy(out + 40, &parent, 16);
    srv_put_u64(out + 56, ps->unit_bytes);
    memcpy(out + 64, toks, (size_t)ps->bs * 4);
    srv_put_u64(out + ps->hdr_bytes - 8, kvp_checksum(out, ps->hdr_bytes - 8));
    uint8_t *u = out + ps->hdr_bytes;
    for (int l = 0; l < ps->n_layer; l++) {
        const uint8_t *src = data + ((size_t)l * (size_t)nb_d + (size_t)col) * ps->unit_bytes;
        memcpy(u, src, ps->unit_bytes);
        srv_put_u64(u + ps->unit_bytes, kvp_checksum(src, ps->unit_bytes));
        u += ps->unit_bytes + 8;
    }
}

/* Check block b's value against what the prompt asks for and copy its units into data's column
 * b: NULL, or why it is refused. */
static const char *value_check(const struct srv_pstore *ps, const uint8_t *v, size_t len, int b,
                               kvp_u128 key, kvp_u128 parent, const int32_t *toks, uint8_t *data,
                               int nb_d)
{
    if (len != ps->value_bytes)
        return "wrong length";
    if (memcmp(v, MAGIC, 8) || srv_get_u32(v + 8) != VALUE_VERSION)
        return "not a block of this version";
    if (srv_get_u64(v + ps->hdr_bytes - 8) != kvp_checksum(v, ps->hdr_bytes - 8))
        return "header checksum mismatch";
    kvp_u128 k, p;
    memcpy(&k, v + 24, 16);
    memcpy(&p, v + 40, 16);
    if (srv_get_u32(v + 12) != (uint32_t)b || k != key || p != parent ||
        srv_get_u32(v + 16) != (uint32_t)ps->n_layer || srv_get_u32(v + 20) != (uint32_t)ps->bs ||
        srv_get_u64(v + 56) != ps->unit_bytes)
        return "another block under this key";
    if (memcmp(v + 64, toks, (size_t)ps->bs * 4))
        return "other token ids under this key";
    const uint8_t *u = v + ps->hdr_bytes;
    for (int l = 0; l < ps->n_layer; l++) {
        if (srv_get_u64(u + ps->unit_bytes) != kvp_checksum(u, ps->unit_bytes))
            return "a unit does not match its checksum";
        memcpy(data + ((size_t)l * (size_t)nb_d + (size_t)b) * ps->unit_bytes, u,
               ps->unit_bytes);
        u += ps->unit_bytes + 8;
    }
    return NULL;
}

/* ---- copies between a context and units ------------------------------------------------ */

struct unit_copy {
    const struct srv_pstore *ps;
    uint8_t *data;  /* [n_layer][nb_d] units */
    int nb_d;
    int b0, b1;     /* the cache's blocks [b0, b1) <-> data's columns [0, b1 - b0) */
    bool to_cache;
};

static void copy_layer(void *arg, int l, struct kvp_kvcache *kv)
{
    const struct unit_copy *c = arg;
    const struct srv_pstore *ps = c->ps;
    for (int b = c->b0; b < c->b1; b++) {
        uint8_t *u = c->data + ((size_t)l * (size_t)c->nb_d + (size_t)(b - c->b0)) *
                                   ps->unit_bytes;
        for (int h = 0; h < ps->n_head_kv; h++) {
            uint8_t *k = kvp_kvcache_kblock(kv, l, h, b), *v = kvp_kvcache_vblock(kv, l, h, b);
            if (!k) { /* older than a sliding-window layer's ring (kvp_seq_write_kv) */
                u += ps->k_bytes + ps->v_bytes;
                continue;
            }
            memcpy(c->to_cache ? k : u, c->to_cache ? u : k, ps->k_bytes);
            u += ps->k_bytes;
            memcpy(c->to_cache ? v : u, c->to_cache ? u : v, ps->v_bytes);
            u += ps->v_bytes;
        }
    }
}

/* ---- the reader threads ----------------------------------------------------------------- */

/* (lock held) */
static void fetch_free(struct srv_pstore *ps, struct fetch *f)
{
    if (!f)
        return;
    ps->fetch_bytes -= f->data_bytes;
    free(f->ids);
    free(f->data);
    free(f);
}

struct batch {
    struct srv_pstore *ps;
    const kvp_u128 *chain;
    const int32_t *ids;
    int base;          /* block of command 0 */
    uint8_t *flags;    /* per block: EXISTS said yes / GET checked it */
    uint8_t *data;
    int nb_d;
    int errors;
    const char **why;  /* per block: why refused (NULL: fine or missing) */
};

static void on_exists(void *arg, int i, redisReply *r)
{
    struct batch *bt = arg;
    bt->flags[bt->base + i] = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    bt->errors += !r || r->type == REDIS_REPLY_ERROR;
}

static void on_get(void *arg, int i, redisReply *r)
{
    struct batch *bt = arg;
    int b = bt->base + i;
    if (!r || r->type == REDIS_REPLY_ERROR) {
        bt->errors++;
        return;
    }
    if (r->type != REDIS_REPLY_STRING)
        return; /* gone since the lookup (evicted, expired): a miss */
    const struct srv_pstore *ps = bt->ps;
    kvp_u128 parent = b > 0 ? bt->chain[b - 1] : ps->seed;
    bt->why[b] = value_check(ps, (const uint8_t *)r->str, r->len, b, bt->chain[b], parent,
                             bt->ids + (size_t)b * ps->bs, bt->data, bt->nb_d);
    bt->flags[b] = bt->why[b] == NULL;
}

static void on_ignore(void *arg, int i, redisReply *r)
{
}

/* Look f up and read the longest stored prefix of it (without the lock). The keys of the blocks
 * read are left in *touch (*n_touch of them) for their expiry to be renewed after f is done. */
static void do_fetch(struct srv_pstore *ps, struct pfx_redis *rc, struct fetch *f, char **touch,
                     int *n_touch)
{
    int nb = f->n / ps->bs;
    double t0 = kvp_time_now();
    kvp_u128 *chain = malloc((size_t)nb * sizeof(kvp_u128));
    char *keys = malloc((size_t)nb * (KEY_LEN + 1));
    struct pfx_cmd *cmds = calloc((size_t)nb, sizeof(*cmds));
    uint8_t *flags = calloc((size_t)nb, 1);
    const char **why = calloc((size_t)nb, sizeof(*why));
    if (!chain || !keys || !cmds || !flags || !why)
        goto out;
    make_chain(ps, f->ids, nb, chain);
    for (int b = 0; b < nb; b++) {
        key_text(chain[b], keys + (size_t)b * (KEY_LEN + 1));
        cmds[b] = (struct pfx_cmd){.argc = 2, .argv = {"EXISTS", keys + (size_t)b * (KEY_LEN + 1)},
                                   .len = {6, KEY_LEN}};
    }
    struct batch bt = {.ps = ps, .chain = chain, .ids = f->ids, .flags = flags, .why = why};
    int failed = pfx_redis_run(rc, cmds, nb, true, on_exists, &bt);
    double t1 = kvp_time_now();
    if (failed == nb) {
        went_down(ps, pfx_redis_why(rc));
        goto out;
    }
    came_up(ps);
    int run = 0;
    while (run < nb && flags[run])
        run++;
    pthread_mutex_lock(&ps->mu);
    ps->st.lookups++;
    ps->st.lookup_s += t1 - t0;
    ps->st.errors += (uint64_t)bt.errors;
    for (int b = 0; b < run; b++)
        known_set(ps, chain[b], true);
    if (run < nb) {
        known_set(ps, chain[run], false);
        bool later = false;
        for (int b = run + 1; b < nb; b++)
            later = later || flags[b];
        if (later)
            repair_note(ps, chain[run]);
    }
    pthread_mutex_unlock(&ps->mu);
    if (run * ps->bs <= f->have)
        goto out;
    /* read the run's blocks, pipelined, a bounded batch at a time */
    size_t bytes = (size_t)ps->n_layer * (size_t)run * ps->unit_bytes;
    pthread_mutex_lock(&ps->mu);
    bool room = ps->fetch_bytes + bytes <= FETCH_BYTES_MAX;
    ps->fetch_bytes += room ? bytes : 0;
    pthread_mutex_unlock(&ps->mu);
    if (!room) /* reads nobody has taken yet fill the bound: this prompt is prefilled */
        goto out;
    f->data = malloc(bytes);
    f->data_bytes = bytes;
    if (!f->data)
        goto out;
    f->nb_e = run;
    memset(flags, 0, (size_t)nb);
    bt = (struct batch){.ps = ps, .chain = chain, .ids = f->ids, .flags = flags, .why = why,
                        .data = f->data, .nb_d = run};
    int per = (int)(CHUNK_BYTES / ps->value_bytes);
    per = per < 1 ? 1 : per;
    for (int lo = 0; lo < run; lo += per) {
        int cnt = run - lo < per ? run - lo : per;
        for (int b = lo; b < lo + cnt; b++)
            /* GET, not GETEX: a replica serves only reads (a master that died) */
            cmds[b] = (struct pfx_cmd){.argc = 2,
                                       .argv = {"GET", keys + (size_t)b * (KEY_LEN + 1)},
                                       .len = {3, KEY_LEN}};
        bt.base = lo;
        pfx_redis_run(rc, cmds + lo, cnt, true, on_get, &bt);
        bool whole = true;
        for (int b = lo; b < lo + cnt; b++)
            whole = whole && flags[b];
        if (!whole)
            break; /* the prefix ends in this batch: the rest is of no use */
    }
    int cut = 0;
    while (cut < run && flags[cut])
        cut++;
    /* a block refused by the checks is deleted, so that the next server to prefill this prompt
     * stores it again (SET NX would otherwise keep the bad one) */
    int n_bad = 0;
    for (int b = 0; b < run; b++)
        if (why[b]) {
            fprintf(stderr, "kvpred serve: prefix store: refused block %d of a stored prefix "
                            "(%s); the prompt is prefilled from there\n", b, why[b]);
            cmds[n_bad++] = (struct pfx_cmd){.argc = 2,
                                             .argv = {"UNLINK", keys + (size_t)b * (KEY_LEN + 1)},
                                             .len = {6, KEY_LEN}};
        }
    if (n_bad)
        pfx_redis_run(rc, cmds, n_bad, false, on_ignore, NULL);
    pthread_mutex_lock(&ps->mu);
    ps->st.read_s += kvp_time_now() - t1;
    ps->st.errors += (uint64_t)bt.errors;
    ps->st.refused += (uint64_t)n_bad;
    ps->st.missing += cut < run && !why[cut] && !bt.errors;
    if (cut < run) {
        known_set(ps, chain[cut], false);
        repair_note(ps, chain[cut]);
    }
    f->m = cut * ps->bs;
    if (f->m <= f->have) {
        free(f->data);
        f->data = NULL;
        f->m = 0;
        ps->fetch_bytes -= f->data_bytes;
        f->data_bytes = 0;
    }
    pthread_mutex_unlock(&ps->mu);
    *touch = keys;
    *n_touch = cut;
    keys = NULL;
out:
    free(chain);
    free(keys);
    free(cmds);
    free(flags);
    free(why);
}

static void renew(struct srv_pstore *ps, struct pfx_redis *rc, const char *keys, int n)
{
    struct pfx_cmd *cmds = n > 0 ? calloc((size_t)n, sizeof(*cmds)) : NULL;
    if (!cmds)
        return;
    char ttl[24];
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ps->ttl_s * 1000);
    for (int b = 0; b < n; b++)
        cmds[b] = (struct pfx_cmd){.argc = 3,
                                   .argv = {"PEXPIRE", keys + (size_t)b * (KEY_LEN + 1), ttl},
                                   .len = {7, KEY_LEN, strlen(ttl)}};
    pfx_redis_run(rc, cmds, n, false, on_ignore, NULL);
    free(cmds);
}

static void *reader_main(void *arg)
{
    struct srv_pstore *ps = arg;
    char why[256];
    struct pfx_redis *rc = pfx_redis_new(ps->seeds, ps->timeout_ms, why, sizeof(why));
    pthread_mutex_lock(&ps->mu);
    bool up = ps->up;
    pthread_mutex_unlock(&ps->mu);
    if (rc && up)
        pfx_redis_connect(rc); /* the first request's lookup does not wait for connections */
    pthread_mutex_lock(&ps->mu);
    for (;;) {
        struct fetch *f = NULL;
        while (!ps->quit) {
            for (f = ps->fetches; f && f->state != FETCH_QUEUED; f = f->next)
                ;
            if (f)
                break;
            pthread_cond_wait(&ps->cv, &ps->mu);
        }
        if (ps->quit)
            break;
        f->state = FETCH_RUNNING;
        bool go = rc && usable(ps);
        pthread_mutex_unlock(&ps->mu);
        char *touch = NULL;
        int n_touch = 0;
        if (go)
            do_fetch(ps, rc, f, &touch, &n_touch);
        pthread_mutex_lock(&ps->mu);
        f->state = FETCH_DONE;
        if (f->abandoned)
            fetch_free(ps, f); /* already out of the list */
        pthread_cond_broadcast(&ps->cv);
        pthread_mutex_unlock(&ps->mu);
        if (ps->on_ready) /* the request may start now */
            ps->on_ready(ps->on_ready_arg);
        /* the blocks just read expire ttl_s from now: renewed once the request has them (a
         * write, so on the masters only, and it may wait for a failover) */
        renew(ps, rc, touch, n_touch);
        free(touch);
        pthread_mutex_lock(&ps->mu);
    }
    pthread_mutex_unlock(&ps->mu);
    pfx_redis_free(rc);
    return NULL;
}

/* ---- the writer thread ------------------------------------------------------------------ */

struct wbatch {
    int written, shared, errors, failed;
};

static void on_set(void *arg, int i, redisReply *r)
{
    struct wbatch *wb = arg;
    if (!r)
        wb->failed++;
    else if (r->type == REDIS_REPLY_STATUS)
        wb->written++;
    else if (r->type == REDIS_REPLY_NIL)
        wb->shared++; /* another server stored it first: its copy stays, the one copy */
    else
        wb->errors++; /* refused (OOM under maxmemory with noeviction, ...) */
}

static void do_write(struct srv_pstore *ps, struct pfx_redis *rc, struct write *w)
{
    int per = (int)(CHUNK_BYTES / ps->value_bytes);
    per = per < 1 ? 1 : per;
    per = per > w->nb ? w->nb : per;
    uint8_t *vals = malloc((size_t)per * ps->value_bytes);
    char *keys = malloc((size_t)per * (KEY_LEN + 1));
    struct pfx_cmd *cmds = calloc((size_t)per, sizeof(*cmds));
    char ttl[24];
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ps->ttl_s * 1000);
    struct wbatch wb = {0};
    if (!vals || !keys || !cmds)
        goto out;
    for (int lo = 0; lo < w->nb; lo += per) {
        int cnt = w->nb - lo < per ? w->nb - lo : per;
        for (int i = 0; i < cnt; i++) {
            int c = lo + i; /* column in w */
            uint8_t *v = vals + (size_t)i * ps->value_bytes;
            char *k = keys + (size_t)i * (KEY_LEN + 1);
            value_fill(ps, w->first + c, w->chain[c + 1], w->chain[c],
                       w->toks + (size_t)c * ps->bs, w->data, w->nb, c, v);
            key_text(w->chain[c + 1], k);
            cmds[i] = (struct pfx_cmd){.argc = 6,
                                       .argv = {"SET", k, (const char *)v, "NX", "PX", ttl},
                                       .len = {3, KEY_LEN, ps->value_bytes, 2, 2, strlen(ttl)}};
        }
        int failed_before = wb.failed;
        pfx_redis_run(rc, cmds, cnt, false, on_set, &wb);
        if (wb.failed - failed_before == cnt) {
            went_down(ps, pfx_redis_why(rc));
            break;
        }
        came_up(ps);
    }
out:
    pthread_mutex_lock(&ps->mu);
    ps->st.written += (uint64_t)wb.written;
    ps->st.shared += (uint64_t)wb.shared;
    ps->st.errors += (uint64_t)(wb.errors + wb.failed);
    if (wb.written + wb.shared < w->nb) /* not all stored: let the next put try again */
        for (int c = 0; c < w->nb; c++)
            known_set(ps, w->chain[c + 1], false);
    pthread_mutex_unlock(&ps->mu);
    free(vals);
    free(keys);
    free(cmds);
}

static void write_free(struct write *w)
{
    if (!w)
        return;
    free(w->chain);
    free(w->toks);
    free(w->data);
    free(w);
}

static void *writer_main(void *arg)
{
    struct srv_pstore *ps = arg;
    char why[256];
    struct pfx_redis *rc = pfx_redis_new(ps->seeds, ps->timeout_ms, why, sizeof(why));
    pthread_mutex_lock(&ps->mu);
    for (;;) {
        while (!ps->wq_head && !ps->quit)
            pthread_cond_wait(&ps->cv, &ps->mu);
        struct write *w = ps->wq_head;
        if (!w)
            break; /* quit with nothing left to write */
        ps->wq_head = w->next;
        if (!ps->wq_head)
            ps->wq_tail = NULL;
        bool go = rc && usable(ps);
        pthread_mutex_unlock(&ps->mu);
        if (go)
            do_write(ps, rc, w);
        pthread_mutex_lock(&ps->mu);
        ps->wq_bytes -= w->bytes;
        write_free(w);
    }
    pthread_mutex_unlock(&ps->mu);
    pfx_redis_free(rc);
    return NULL;
}

/* ---- the store -------------------------------------------------------------------------- */

/* "redis://SEEDS[?ttl_s=N&timeout_ms=N]" into ps: NULL, or what is wrong. */
static const char *parse_url(struct srv_pstore *ps, const char *url)
{
    if (strncmp(url, "redis://", 8))
        return "must start with redis://";
    const char *q = strchr(url + 8, '?');
    size_t len = q ? (size_t)(q - url - 8) : strlen(url + 8);
    if (!(ps->seeds = strndup(url + 8, len)))
        return "out of memory";
    ps->ttl_s = DEFAULT_TTL_S;
    ps->timeout_ms = DEFAULT_TIMEOUT_MS;
    while (q && *q) {
        q++;
        const char *amp = strchr(q, '&');
        size_t ol = amp ? (size_t)(amp - q) : strlen(q);
        char *end = NULL;
        int *dst = NULL;
        if (!strncmp(q, "ttl_s=", 6))
            dst = &ps->ttl_s;
        else if (!strncmp(q, "timeout_ms=", 11))
            dst = &ps->timeout_ms;
        else
            return "unknown option (ttl_s=N, timeout_ms=N)";
        const char *num = strchr(q, '=') + 1;
        long v = strtol(num, &end, 10);
        if (end != q + ol || end == num || v < 1 || v > 100000000)
            return "an option's value is not a number in 1..1e8";
        *dst = (int)v;
        q = amp;
    }
    return NULL;
}

int srv_pstore_open(const struct srv_pstore_config *cfg, struct srv_pstore **out,
                    struct kvp_err *err)
{
    *out = NULL;
    struct srv_pstore *ps = calloc(1, sizeof(*ps));
    if (!ps || !(ps->known = calloc(KNOWN_CAP, sizeof(*ps->known)))) {
        free(ps);
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&ps->mu, NULL);
    pthread_cond_init(&ps->cv, NULL);
    const char *bad = parse_url(ps, cfg->url);
    char why[256] = "";
    struct pfx_redis *probe = NULL;
    if (!bad && !(probe = pfx_redis_new(ps->seeds, ps->timeout_ms, why, sizeof(why))))
        bad = why;
    if (bad) {
        int rc = kvp_err_set(err, KVP_EINVAL, "--prefix-store %s: %s", cfg->url, bad);
        srv_pstore_close(ps);
        return rc;
    }
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(cfg->like);
    ps->min_tokens = cfg->min_tokens;
    ps->on_ready = cfg->on_ready;
    ps->on_ready_arg = cfg->on_ready_arg;
    ps->bs = kv->block_size;
    ps->n_layer = kv->n_layer;
    ps->n_head_kv = kv->n_head_kv;
    ps->head_dim = kv->head_dim;
    ps->type_k = kv->type_k;
    ps->type_v = kv->type_v;
    ps->k_bytes = kv->k_bytes;
    ps->v_bytes = kv->v_bytes;
    ps->unit_bytes = (size_t)ps->n_head_kv * (ps->k_bytes + ps->v_bytes);
    ps->hdr_bytes = 64 + (size_t)ps->bs * 4 + 8;
    ps->value_bytes = ps->hdr_bytes + (size_t)ps->n_layer * (ps->unit_bytes + 8);
    /* the chain's seed: what makes one server's blocks another's (model, types, layout) */
    uint8_t id[64] = {0};
    memcpy(id, MAGIC, 8);
    srv_put_u64(id + 8, cfg->fingerprint);
    int layout[] = {VALUE_VERSION, ps->type_k, ps->type_v, ps->bs, ps->n_layer, ps->n_head_kv,
                    ps->head_dim};
    for (int i = 0; i < 7; i++)
        srv_put_u32(id + 16 + 4 * i, (uint32_t)layout[i]);
    srv_put_u64(id + 44, ps->unit_bytes);
    ps->seed = kvp_fnv128(kvp_fnv128_init(), id, sizeof(id));
    /* one command now, so that a cluster that is not there is said at start */
    ps->up = true;
    char probe_key[KEY_LEN + 1];
    key_text(ps->seed, probe_key);
    struct pfx_cmd c = {.argc = 2, .argv = {"EXISTS", probe_key}, .len = {6, KEY_LEN}};
    if (pfx_redis_run(probe, &c, 1, true, on_ignore, NULL) == 1)
        went_down(ps, pfx_redis_why(probe));
    pfx_redis_free(probe);
    if (pthread_create(&ps->writer, NULL, writer_main, ps) != 0) {
        srv_pstore_close(ps);
        return kvp_err_set(err, KVP_ENOMEM, "cannot start the prefix store's writer");
    }
    ps->writer_started = true;
    for (int i = 0; i < READERS; i++) {
        if (pthread_create(&ps->readers[i], NULL, reader_main, ps) != 0)
            break;
        ps->n_readers++;
    }
    if (ps->n_readers == 0) {
        srv_pstore_close(ps);
        return kvp_err_set(err, KVP_ENOMEM, "cannot start the prefix store's readers");
    }
    *out = ps;
    return 0;
}

void srv_pstore_close(struct srv_pstore *ps)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->mu);
    ps->quit = true;
    pthread_cond_broadcast(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
    if (ps->writer_started)
        pthread_join(ps->writer, NULL);
    for (int i = 0; i < ps->n_readers; i++)
        pthread_join(ps->readers[i], NULL);
    for (struct fetch *f = ps->fetches, *n; f; f = n) {
        n = f->next;
        fetch_free(ps, f);
    }
    for (struct write *w = ps->wq_head, *n; w; w = n) {
        n = w->next;
        write_free(w);
    }
    pthread_mutex_destroy(&ps->mu);
    pthread_cond_destroy(&ps->cv);
    free(ps->known);
    free(ps->seeds);
    free(ps);
}

/* Tokens a lookup of a prompt of n covers: at least two stay to prefill (engine.c). */
static int lookup_len(const struct srv_pstore *ps, int n)
{
    int lim = n - 2;
    return lim > 0 ? lim - lim % ps->bs : 0;
}

/* The fetch of exactly ids[0..n) (lock held). */
static struct fetch **find_fetch(struct srv_pstore *ps, const int32_t *ids, int n)
{
    for (struct fetch **pf = &ps->fetches; *pf; pf = &(*pf)->next)
        if ((*pf)->n == n && !memcmp((*pf)->ids, ids, (size_t)n * sizeof(int32_t)))
            return pf;
    return NULL;
}

/* The fetch at *pf is of no use (lock held): out of the list, freed now or by its reader. */
static void drop_fetch(struct srv_pstore *ps, struct fetch **pf)
{
    struct fetch *f = *pf;
    *pf = f->next;
    ps->n_fetches--;
    if (f->state == FETCH_RUNNING)
        f->abandoned = true;
    else
        fetch_free(ps, f);
}

/* Queue a fetch of ids[0..n) (lock held): it, or NULL when out of memory or too many. */
static struct fetch *add_fetch(struct srv_pstore *ps, const int32_t *ids, int n, int have)
{
    /* drop what nobody took (the request went away before it had a slot) */
    double now = kvp_time_now();
    for (struct fetch **pf = &ps->fetches; *pf;) {
        struct fetch *f = *pf;
        if (f->state == FETCH_DONE && now - f->t_made > FETCH_MAX_AGE_S) {
            drop_fetch(ps, pf);
        } else {
            pf = &f->next;
        }
    }
    if (ps->n_fetches >= MAX_FETCHES)
        return NULL;
    struct fetch *f = calloc(1, sizeof(*f));
    if (!f || !(f->ids = malloc((size_t)n * sizeof(int32_t)))) {
        free(f);
        return NULL;
    }
    memcpy(f->ids, ids, (size_t)n * sizeof(int32_t));
    f->n = n;
    f->have = have;
    f->state = FETCH_QUEUED;
    f->t_made = now;
    /* at the end: requests are looked up in the order they came */
    struct fetch **pf = &ps->fetches;
    while (*pf)
        pf = &(*pf)->next;
    *pf = f;
    ps->n_fetches++;
    pthread_cond_broadcast(&ps->cv);
    return f;
}

void srv_pstore_prefetch(struct srv_pstore *ps, const int32_t *ids, int n, int have)
{
    if (!ps)
        return;
    int lim = lookup_len(ps, n);
    if (lim < ps->min_tokens || lim <= have)
        return;
    pthread_mutex_lock(&ps->mu);
    if (usable(ps) && !find_fetch(ps, ids, lim))
        add_fetch(ps, ids, lim, have);
    pthread_mutex_unlock(&ps->mu);
}

bool srv_pstore_pending(struct srv_pstore *ps, const int32_t *ids, int n)
{
    if (!ps)
        return false;
    int lim = lookup_len(ps, n);
    if (lim < ps->min_tokens)
        return false;
    pthread_mutex_lock(&ps->mu);
    struct fetch **pf = find_fetch(ps, ids, lim);
    bool pending = pf && (*pf)->state != FETCH_DONE;
    pthread_mutex_unlock(&ps->mu);
    return pending;
}

int srv_pstore_load(struct srv_pstore *ps, kvp_ctx *ctx, const int32_t *ids, int n, int have)
{
    if (!ps)
        return 0;
    int lim = lookup_len(ps, n);
    if (lim < ps->min_tokens)
        return 0;
    pthread_mutex_lock(&ps->mu);
    struct fetch **pf = find_fetch(ps, ids, lim), *f = pf ? *pf : NULL;
    /* the slot holds as much already (a follow-up in the slot of its document), or the read is
     * not done (the scheduler starts a request once it is, so only a request that came while
     * the store was off, or found the fetch list full, gets here without one): nothing from the
     * store, and what was looked up for it goes */
    if (!f || lim <= have || f->state != FETCH_DONE) {
        if (pf)
            drop_fetch(ps, pf);
        pthread_mutex_unlock(&ps->mu);
        return 0;
    }
    *pf = f->next;
    ps->n_fetches--;
    pthread_mutex_unlock(&ps->mu);
    int m = f->m, rc = 0;
    if (m > have && f->data) {
        kvp_ctx_reset(ctx);
        struct unit_copy uc = {.ps = ps, .data = f->data, .nb_d = f->nb_e, .b0 = 0,
                               .b1 = m / ps->bs, .to_cache = true};
        struct kvp_err err = {0};
        rc = kvp_seq_write_kv(ctx, m, copy_layer, &uc, &err);
        if (rc < 0)
            kvp_ctx_reset(ctx);
        pthread_mutex_lock(&ps->mu);
        if (rc == 0) {
            ps->st.hits++;
            ps->st.tokens_loaded += (uint64_t)m;
        }
        pthread_mutex_unlock(&ps->mu);
    }
    pthread_mutex_lock(&ps->mu);
    fetch_free(ps, f);
    pthread_mutex_unlock(&ps->mu);
    return rc < 0 ? -1 : m > have ? m : 0;
}

void srv_pstore_forget(struct srv_pstore *ps, const int32_t *ids, int n)
{
    if (!ps)
        return;
    pthread_mutex_lock(&ps->mu);
    struct fetch **pf = find_fetch(ps, ids, lookup_len(ps, n));
    if (pf)
        drop_fetch(ps, pf);
    pthread_mutex_unlock(&ps->mu);
}

void srv_pstore_put(struct srv_pstore *ps, kvp_ctx *ctx, const int32_t *ids, int n_prompt)
{
    if (!ps)
        return;
    int n = n_prompt - n_prompt % ps->bs, nb = n / ps->bs;
    if (n < ps->min_tokens || n <= 0 || !srv_prefix_ctx_ok(ctx) || kvp_ctx_n_tokens(ctx) < n)
        return;
    kvp_u128 *chain = malloc(((size_t)nb + 1) * sizeof(kvp_u128));
    if (!chain)
        return;
    chain[0] = ps->seed;
    make_chain(ps, ids, nb, chain + 1); /* chain[b + 1]: block b's key */
    pthread_mutex_lock(&ps->mu);
    int first = 0;
    while (first < nb && known_has(ps, chain[first + 1]))
        first++;
    size_t bytes = (size_t)ps->n_layer * (size_t)(nb - first) * ps->unit_bytes;
    bool skip = !usable(ps) || first == nb ||
                /* a follow-up question after a stored document: not worth a write */
                (first > 0 && (nb - first) * ps->bs < MIN_GAIN &&
                 !repair_take(ps, chain[first + 1]));
    if (!skip && ps->wq_bytes + bytes > WRITE_QUEUE_MAX) {
        ps->st.dropped++;
        skip = true;
    }
    pthread_mutex_unlock(&ps->mu);
    struct write *w = skip ? NULL : calloc(1, sizeof(*w));
    if (!w || !(w->chain = malloc(((size_t)(nb - first) + 1) * sizeof(kvp_u128))) ||
        !(w->toks = malloc((size_t)(nb - first) * (size_t)ps->bs * sizeof(int32_t))) ||
        !(w->data = malloc(bytes))) {
        write_free(w);
        free(chain);
        return;
    }
    w->first = first;
    w->nb = nb - first;
    w->bytes = bytes;
    memcpy(w->chain, chain + first, ((size_t)w->nb + 1) * sizeof(kvp_u128));
    memcpy(w->toks, ids + (size_t)first * ps->bs, (size_t)w->nb * (size_t)ps->bs * 4);
    free(chain);
    /* copied out now, on the scheduler thread: the slot moves on after this */
    struct unit_copy uc = {.ps = ps, .data = w->data, .nb_d = w->nb, .b0 = first, .b1 = nb};
    struct kvp_err err = {0};
    if (kvp_seq_read_kv(ctx, n, copy_layer, &uc, &err) < 0) {
        write_free(w);
        return;
    }
    pthread_mutex_lock(&ps->mu);
    for (int c = 0; c < w->nb; c++)
        known_set(ps, w->chain[c + 1], true); /* a follow-up does not queue it again */
    ps->wq_bytes += bytes;
    if (ps->wq_tail)
        ps->wq_tail->next = w;
    else
        ps->wq_head = w;
    ps->wq_tail = w;
    pthread_cond_broadcast(&ps->cv);
    pthread_mutex_unlock(&ps->mu);
}

size_t srv_pstore_metrics(struct srv_pstore *ps, char *buf, size_t cap)
{
    if (!ps)
        return 0;
    pthread_mutex_lock(&ps->mu);
    struct pstats s = ps->st;
    bool up = ps->up;
    pthread_mutex_unlock(&ps->mu);
    int n = snprintf(
        buf, cap,
        "# HELP kvpred_prefix_store_up Whether the shared prefix store (--prefix-store) answers.\n"
        "# TYPE kvpred_prefix_store_up gauge\n"
        "kvpred_prefix_store_up %d\n"
        "# HELP kvpred_prefix_store_lookups_total Prompts looked up in the shared prefix store.\n"
        "# TYPE kvpred_prefix_store_lookups_total counter\n"
        "kvpred_prefix_store_lookups_total %llu\n"
        "kvpred_prefix_store_lookup_seconds_total %.6f\n"
        "kvpred_prefix_store_read_seconds_total %.6f\n"
        "# HELP kvpred_prefix_store_loads_total Prefixes copied in from the shared store.\n"
        "# TYPE kvpred_prefix_store_loads_total counter\n"
        "kvpred_prefix_store_loads_total %llu\n"
        "kvpred_prefix_store_tokens_loaded_total %llu\n"
        "# HELP kvpred_prefix_store_blocks_written_total Blocks this server stored.\n"
        "# TYPE kvpred_prefix_store_blocks_written_total counter\n"
        "kvpred_prefix_store_blocks_written_total %llu\n"
        "# HELP kvpred_prefix_store_blocks_shared_total Blocks another server had stored first.\n"
        "kvpred_prefix_store_blocks_shared_total %llu\n"
        "# HELP kvpred_prefix_store_refused_total Stored blocks refused by their checks.\n"
        "# TYPE kvpred_prefix_store_refused_total counter\n"
        "kvpred_prefix_store_refused_total %llu\n"
        "kvpred_prefix_store_missing_total %llu\n"
        "kvpred_prefix_store_errors_total %llu\n"
        "kvpred_prefix_store_puts_dropped_total %llu\n",
        up ? 1 : 0, (unsigned long long)s.lookups, s.lookup_s, s.read_s,
        (unsigned long long)s.hits, (unsigned long long)s.tokens_loaded,
        (unsigned long long)s.written, (unsigned long long)s.shared,
        (unsigned long long)s.refused, (unsigned long long)s.missing,
        (unsigned long long)s.errors, (unsigned long long)s.dropped);
    return n < 0 ? 0 : (size_t)n;
}

#endif
