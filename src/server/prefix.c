/* The server's prefix cache (see prefix.h). */
#include "server/prefix.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fnv.h"
#include "core/platform.h"
#include "forward/context.h"
#include "kv/kvcache.h"
#include "server/bytes.h"

#define HEADER_BYTES 72
/* tokens a prompt must add to the longest cached prefix it starts with to be kept itself */
#define SRV_PREFIX_MIN_GAIN 256
static const char MAGIC[8] = {'K', 'V', 'P', 'P', 'F', 'X', '0', '1'};
#define FILE_VERSION 1u

struct entry {
    int32_t *toks;
    int n;                /* tokens, whole blocks */
    uint8_t *data;        /* [n_layer][n / bs] units; NULL while only on disk */
    char *path;           /* the file, or NULL */
    bool writing;         /* queued for or being written by the writer */
    bool loading;         /* being read back from its file (by a loader or a load) */
    bool queued;          /* in the loaders' queue */
    double last_used;
    struct entry *next;
    struct entry *wnext;  /* writer queue */
    struct entry *lnext;  /* loader queue */
};

/* Threads that read entries back from their files ahead of their use (srv_prefix_prefetch):
 * two, so two documents asked for at once (after a restart) are read and checked side by
 * side instead of one after the other on the scheduler thread. */
#define SRV_PREFIX_LOADERS 2

struct srv_prefix {
    struct srv_prefix_config cfg;
    int bs, n_layer, n_head_kv, head_dim, type_k, type_v;
    size_t k_bytes, v_bytes, unit_bytes;
    uint64_t fingerprint;
    char *dir;
    pthread_mutex_t mu;   /* everything below */
    pthread_cond_t cv;
    struct entry *list;
    struct entry *wq_head, *wq_tail;
    struct entry *lq_head, *lq_tail;
    pthread_t loaders[SRV_PREFIX_LOADERS];
    int n_loaders;
    bool quit;
    bool persistent;
    bool warned;
    pthread_t writer;
    bool writer_started;
    size_t ram_used;
    struct srv_prefix_stats st;
};

/* The model file's identity: its size, its first and last 64 KiB and its shapes. Reading the
 * whole file would cost seconds for a large model at every start; a changed file that keeps its
 * size, head and tail is not a case this guards against. */
uint64_t srv_prefix_fingerprint(const char *path, const kvp_model *m, const char *variant)
{
    uint64_t h = KVP_FNV64_INIT;
    if (variant && variant[0])
        h = kvp_fnv64(h, variant, strlen(variant));
    struct kvp_model_info info;
    kvp_model_get_info(m, &info);
    int shape[] = {info.n_vocab, info.n_embd, info.n_layer, info.n_head, info.n_head_kv,
                   info.head_dim, info.n_ff};
    h = kvp_fnv64(h, shape, sizeof(shape));
    int fd = path ? open(path, O_RDONLY) : -1;
    if (fd < 0)
        return h;
    struct stat st;
    if (fstat(fd, &st) == 0) {
        uint64_t size = (uint64_t)st.st_size;
        h = kvp_fnv64(h, &size, 8);
        static uint8_t buf[65536];
        ssize_t n = pread(fd, buf, sizeof(buf), 0);
        if (n > 0)
            h = kvp_fnv64(h, buf, (size_t)n);
        off_t tail = st.st_size > (off_t)sizeof(buf) ? st.st_size - (off_t)sizeof(buf) : 0;
        n = pread(fd, buf, sizeof(buf), tail);
        if (n > 0)
            h = kvp_fnv64(h, buf, (size_t)n);
    }
    close(fd);
    return h;
}

bool srv_prefix_ctx_ok(const kvp_ctx *ctx)
{
    const struct kvp_policy *p = kvp_ctx_policy_host_const(ctx)->p;
    return !p || (!p->ops->evicting && !p->ops->wants_obs && !p->ops->wants_colsum &&
                  !p->ops->on_step);
}

/* One layer's units between an entry's data (nb_e blocks per layer) and a cache whose blocks
 * [0, nb) are addressable (kvp_seq_read_kv / kvp_seq_write_kv stage a tiered layer). */
struct unit_copy {
    const struct srv_prefix *p;
    uint8_t *data;
    int nb_e, nb;
    bool to_cache;
};

static void copy_layer(void *arg, int l, struct kvp_kvcache *kv)
{
    const struct unit_copy *c = arg;
    const struct srv_prefix *p = c->p;
    for (int b = 0; b < c->nb; b++) {
        uint8_t *u = c->data + ((size_t)l * c->nb_e + b) * p->unit_bytes;
        for (int h = 0; h < p->n_head_kv; h++) {
            uint8_t *k = kvp_kvcache_kblock(kv, l, h, b), *v = kvp_kvcache_vblock(kv, l, h, b);
            if (!k) { /* older than a sliding-window layer's ring (kvp_seq_write_kv) */
                u += p->k_bytes + p->v_bytes;
                continue;
            }
            memcpy(c->to_cache ? k : u, c->to_cache ? u : k, p->k_bytes);
            u += p->k_bytes;
            memcpy(c->to_cache ? v : u, c->to_cache ? u : v, p->v_bytes);
            u += p->v_bytes;
        }
    }
}

static void entry_free(struct entry *e)
{
    if (!e)
        return;
    free(e->toks);
    free(e->data);
    free(e->path);
    free(e);
}

static size_t entry_bytes(const struct srv_prefix *p, int n)
{
    return (size_t)p->n_layer * (size_t)(n / p->bs) * p->unit_bytes;
}

static void say(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "kvpred serve: prefix cache: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
}

/* ---- files ------------------------------------------------------------------------------ */

static void header_fill(const struct srv_prefix *p, const struct entry *e, uint8_t *h)
{
    memset(h, 0, HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    srv_put_u32(h + 8, FILE_VERSION);
    srv_put_u32(h + 12, (uint32_t)e->n);
    srv_put_u64(h + 16, p->fingerprint);
    srv_put_u32(h + 24, (uint32_t)p->type_k);
    srv_put_u32(h + 28, (uint32_t)p->type_v);
    srv_put_u32(h + 32, (uint32_t)p->bs);
    srv_put_u32(h + 36, (uint32_t)p->n_layer);
    srv_put_u32(h + 40, (uint32_t)p->n_head_kv);
    srv_put_u32(h + 44, (uint32_t)p->head_dim);
    srv_put_u64(h + 48, p->unit_bytes);
    srv_put_u64(h + 56, kvp_fnv64(KVP_FNV64_INIT, e->toks, (size_t)e->n * sizeof(int32_t)));
    srv_put_u64(h + 64, kvp_fnv64(KVP_FNV64_INIT, h, 64));
}

static bool write_all(int fd, const void *buf, size_t n)
{
    const uint8_t *b = buf;
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *buf, size_t n)
{
    uint8_t *b = buf;
    while (n > 0) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* Write e to the folder (the writer thread, without the lock: e->data stays while writing). */
static char *write_entry(struct srv_prefix *p, const struct entry *e, int *err_no)
{
    /* named by what it was made with and its tokens, so servers of other models or KV types
     * sharing the folder never overwrite each other's files */
    int layout[] = {p->type_k, p->type_v, p->bs};
    uint64_t cfg = kvp_fnv64(kvp_fnv64(KVP_FNV64_INIT, &p->fingerprint, 8), layout, sizeof(layout));
    uint64_t key = kvp_fnv64(cfg, e->toks, (size_t)e->n * sizeof(int32_t));
    size_t pl = strlen(p->dir) + 64;
    char *path = malloc(pl), *tmp = malloc(pl);
    if (!path || !tmp) {
        free(path);
        free(tmp);
        *err_no = ENOMEM;
        return NULL;
    }
    snprintf(path, pl, "%s/%016llx-%d.kvpfx", p->dir, (unsigned long long)key, e->n);
    snprintf(tmp, pl, "%s/%016llx-%d.tmp", p->dir, (unsigned long long)key, e->n);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = fd >= 0;
    uint8_t h[HEADER_BYTES];
    header_fill(p, e, h);
    ok = ok && write_all(fd, h, sizeof(h)) &&
         write_all(fd, e->toks, (size_t)e->n * sizeof(int32_t));
    size_t units = (size_t)p->n_layer * (size_t)(e->n / p->bs);
    for (size_t u = 0; ok && u < units; u++) {
        const uint8_t *d = e->data + u * p->unit_bytes;
        uint8_t sum[8];
        srv_put_u64(sum, kvp_fnv64(KVP_FNV64_INIT, d, p->unit_bytes));
        ok = write_all(fd, d, p->unit_bytes) && write_all(fd, sum, 8);
    }
    *err_no = ok ? 0 : errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = false;
        *err_no = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        *err_no = errno;
    }
    if (!ok)
        unlink(tmp);
    free(tmp);
    if (!ok) {
        free(path);
        return NULL;
    }
    return path;
}

static void *writer_main(void *arg)
{
    struct srv_prefix *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->wq_head && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        struct entry *e = p->wq_head;
        if (!e)
            break; /* quit with nothing left to write */
        p->wq_head = e->wnext;
        if (!p->wq_head)
            p->wq_tail = NULL;
        bool go = p->persistent;
        pthread_mutex_unlock(&p->mu);
        int err_no = 0;
        char *path = go ? write_entry(p, e, &err_no) : NULL;
        pthread_mutex_lock(&p->mu);
        e->writing = false;
        if (path) {
            e->path = path;
            p->st.written++;
            p->st.disk_entries++;
            p->st.disk_bytes += HEADER_BYTES + (uint64_t)e->n * 4 +
                                (uint64_t)p->n_layer * (uint64_t)(e->n / p->bs) *
                                    (p->unit_bytes + 8);
        } else if (go) {
            p->persistent = false;
            if (!p->warned) {
                p->warned = true;
                say("cannot write to %s (%s): serving without a persistent prefix cache",
                    p->dir, strerror(err_no));
            }
        }
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Check a file's header against this server and read its tokens: the entry (data NULL), or
 * NULL with *why set (foreign: another model or KV layout, left alone; otherwise corrupt). */
static struct entry *read_index(struct srv_prefix *p, const char *path, const char **why,
                                bool *foreign)
{
    *foreign = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *why = "cannot open";
        return NULL;
    }
    uint8_t h[HEADER_BYTES];
    struct stat st;
    struct entry *e = NULL;
    if (fstat(fd, &st) != 0 || !read_all(fd, h, sizeof(h))) {
        *why = "truncated header";
        goto out;
    }
    if (memcmp(h, MAGIC, 8) || srv_get_u32(h + 8) != FILE_VERSION) {
        *why = "not a prefix file of this version";
        *foreign = true;
        goto out;
    }
    if (srv_get_u64(h + 64) != kvp_fnv64(KVP_FNV64_INIT, h, 64)) {
        *why = "header checksum mismatch";
        goto out;
    }
    if (srv_get_u64(h + 16) != p->fingerprint) {
        *why = "made with another model file";
        *foreign = true;
        goto out;
    }
    if ((int)srv_get_u32(h + 24) != p->type_k || (int)srv_get_u32(h + 28) != p->type_v ||
        (int)srv_get_u32(h + 32) != p->bs || (int)srv_get_u32(h + 36) != p->n_layer ||
        (int)srv_get_u32(h + 40) != p->n_head_kv || (int)srv_get_u32(h + 44) != p->head_dim ||
        srv_get_u64(h + 48) != p->unit_bytes) {
        *why = "another KV type, block size or shape";
        *foreign = true;
        goto out;
    }
    uint32_t n = srv_get_u32(h + 12);
    if (n == 0 || n % (uint32_t)p->bs || n > (1u << 24)) {
        *why = "bad token count";
        goto out;
    }
    uint64_t want = HEADER_BYTES + (uint64_t)n * 4 +
                    (uint64_t)p->n_layer * (n / (uint32_t)p->bs) * (p->unit_bytes + 8);
    if ((uint64_t)st.st_size != want) {
        *why = "wrong size (truncated or padded)";
        goto out;
    }
    e = calloc(1, sizeof(*e));
    if (!e || !(e->toks = malloc((size_t)n * 4)) || !(e->path = strdup(path))) {
        *why = "out of memory";
        entry_free(e);
        e = NULL;
        goto out;
    }
    e->n = (int)n;
    if (!read_all(fd, e->toks, (size_t)n * 4) ||
        kvp_fnv64(KVP_FNV64_INIT, e->toks, (size_t)n * 4) != srv_get_u64(h + 56)) {
        *why = "token ids do not match their checksum";
        entry_free(e);
        e = NULL;
    }
out:
    close(fd);
    return e;
}

/* Read the units of an entry of n tokens from its file, each checked as it is read: the data,
 * or NULL with *why set. Called without the lock. */
static uint8_t *read_data(struct srv_prefix *p, const char *path, int n, const char **why)
{
    size_t bytes = entry_bytes(p, n);
    uint8_t *d = malloc(bytes ? bytes : 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t *rc = NULL;
    *why = "cannot read";
    if (!d || fd < 0 || lseek(fd, HEADER_BYTES + (off_t)n * 4, SEEK_SET) < 0)
        goto out;
    size_t units = bytes / p->unit_bytes;
    for (size_t u = 0; u < units; u++) {
        uint8_t sum[8];
        if (!read_all(fd, d + u * p->unit_bytes, p->unit_bytes) || !read_all(fd, sum, 8)) {
            *why = "truncated";
            goto out;
        }
        if (srv_get_u64(sum) != kvp_fnv64(KVP_FNV64_INIT, d + u * p->unit_bytes, p->unit_bytes)) {
            *why = "a unit does not match its checksum";
            goto out;
        }
    }
    rc = d;
    d = NULL;
out:
    if (fd >= 0)
        close(fd);
    free(d);
    return rc;
}

static void lq_remove(struct srv_prefix *p, struct entry *e)
{
    if (!e->queued)
        return;
    struct entry *prev = NULL;
    for (struct entry *q = p->lq_head; q; prev = q, q = q->lnext)
        if (q == e) {
            if (prev)
                prev->lnext = e->lnext;
            else
                p->lq_head = e->lnext;
            if (p->lq_tail == e)
                p->lq_tail = prev;
            break;
        }
    e->queued = false;
    e->lnext = NULL;
}

static void trim(struct srv_prefix *p);

/* Read entry e (on disk only, not loading) back into RAM: called and returning with the lock
 * held, which is released while reading (e->loading keeps it in the list meanwhile). 0, or -1
 * when the file was refused (the entry is then gone: its file deleted, e freed). do_trim: keep
 * the RAM budget now (a load copying e out trims after its copy instead). */
static int fetch(struct srv_prefix *p, struct entry *e, bool do_trim)
{
    lq_remove(p, e);
    e->loading = true;
    char *path = strdup(e->path);
    int n = e->n;
    pthread_mutex_unlock(&p->mu);
    const char *why = "out of memory";
    uint8_t *d = path ? read_data(p, path, n, &why) : NULL;
    pthread_mutex_lock(&p->mu);
    free(path);
    e->loading = false;
    pthread_cond_broadcast(&p->cv);
    if (!d) {
        say("refused %s: %s; the prompt is prefilled instead", e->path, why);
        p->st.refused++;
        unlink(e->path);
        p->st.disk_entries--;
        for (struct entry **pe = &p->list; *pe; pe = &(*pe)->next)
            if (*pe == e) {
                *pe = e->next;
                break;
            }
        entry_free(e);
        return -1;
    }
    e->data = d;
    e->last_used = kvp_time_now();
    p->ram_used += entry_bytes(p, e->n);
    p->st.entries++;
    p->st.ram_bytes = p->ram_used;
    if (do_trim)
        trim(p);
    return 0;
}

static void *loader_main(void *arg)
{
    struct srv_prefix *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->lq_head && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit)
            break;
        struct entry *e = p->lq_head;
        lq_remove(p, e);
        if (!e->data && !e->loading)
            fetch(p, e, true);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the cache -------------------------------------------------------------------------- */

int srv_prefix_open(const struct srv_prefix_config *cfg, struct srv_prefix **out,
                    struct kvp_err *err)
{
    *out = NULL;
    struct srv_prefix *p = calloc(1, sizeof(*p));
    if (!p)
        return kvp_err_set(err, KVP_ENOMEM, "out of memory");
    p->cfg = *cfg;
    const struct kvp_kvcache *kv = kvp_ctx_kvcache_const(cfg->like);
    p->bs = kv->block_size;
    p->n_layer = kv->n_layer;
    p->n_head_kv = kv->n_head_kv;
    p->head_dim = kv->head_dim;
    p->type_k = kv->type_k;
    p->type_v = kv->type_v;
    p->k_bytes = kv->k_bytes;
    p->v_bytes = kv->v_bytes;
    p->unit_bytes = (size_t)p->n_head_kv * (p->k_bytes + p->v_bytes);
    p->fingerprint = srv_prefix_fingerprint(cfg->model_path, cfg->model, cfg->variant);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (cfg->dir) {
        if (!(p->dir = strdup(cfg->dir))) {
            srv_prefix_close(p);
            return kvp_err_set(err, KVP_ENOMEM, "out of memory");
        }
        DIR *d = mkdir(p->dir, 0755) == 0 || errno == EEXIST ? opendir(p->dir) : NULL;
        if (!d) {
            /* serve anyway, from RAM: the folder is an optimisation, not a requirement */
            say("cannot use %s (%s): serving without a persistent prefix cache", p->dir,
                strerror(errno));
            p->warned = true;
            *out = p;
            return 0;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t nl = strlen(de->d_name);
            char path[4096];
            if (snprintf(path, sizeof(path), "%s/%s", p->dir, de->d_name) >= (int)sizeof(path))
                continue;
            if (nl > 4 && !strcmp(de->d_name + nl - 4, ".tmp")) {
                unlink(path); /* a write the last run did not finish */
                continue;
            }
            if (nl < 7 || strcmp(de->d_name + nl - 6, ".kvpfx"))
                continue;
            const char *why = NULL;
            bool foreign = false;
            struct entry *e = read_index(p, path, &why, &foreign);
            if (!e) {
                say("refused %s: %s", path, why);
                p->st.refused++;
                if (!foreign)
                    unlink(path);
                continue;
            }
            e->next = p->list;
            p->list = e;
            p->st.disk_entries++;
            p->st.disk_bytes += HEADER_BYTES + (uint64_t)e->n * 4 + entry_bytes(p, e->n) +
                                (uint64_t)p->n_layer * (uint64_t)(e->n / p->bs) * 8;
        }
        closedir(d);
        p->persistent = true;
        if (pthread_create(&p->writer, NULL, writer_main, p) != 0) {
            srv_prefix_close(p);
            return kvp_err_set(err, KVP_ENOMEM, "cannot start the prefix cache's writer");
        }
        p->writer_started = true;
        for (int i = 0; i < SRV_PREFIX_LOADERS; i++) {
            if (pthread_create(&p->loaders[i], NULL, loader_main, p) != 0)
                break; /* fewer loaders: reads wait longer, nothing else changes */
            p->n_loaders++;
        }
    }
    *out = p;
    return 0;
}

void srv_prefix_close(struct srv_prefix *p)
{
    if (!p)
        return;
    if (p->writer_started) {
        pthread_mutex_lock(&p->mu);
        p->quit = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->writer, NULL);
    }
    for (int i = 0; i < p->n_loaders; i++)
        pthread_join(p->loaders[i], NULL);
    for (struct entry *e = p->list, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->dir);
    free(p);
}

/* Common prefix of an entry and ids[0..n), in whole blocks. */
static int common_blocks(const struct srv_prefix *p, const struct entry *e, const int32_t *ids,
                         int n)
{
    int lim = e->n < n ? e->n : n, m = 0;
    while (m < lim && e->toks[m] == ids[m])
        m++;
    return m - m % p->bs;
}

/* Drop the RAM copies of the least recently used entries until the budget holds (lock held).
 * An entry with no file goes entirely; one being written keeps its data until written. */
static void trim(struct srv_prefix *p)
{
    while (p->ram_used > p->cfg.ram_bytes) {
        struct entry **victim = NULL;
        for (struct entry **pe = &p->list; *pe; pe = &(*pe)->next)
            if ((*pe)->data && !(*pe)->writing &&
                (!victim || (*pe)->last_used < (*victim)->last_used))
                victim = pe;
        if (!victim)
            return;
        struct entry *e = *victim;
        p->ram_used -= entry_bytes(p, e->n);
        p->st.entries--;
        p->st.ram_bytes = p->ram_used;
        free(e->data);
        e->data = NULL;
        if (!e->path) {
            *victim = e->next;
            entry_free(e);
        }
    }
}

void srv_prefix_put(struct srv_prefix *p, kvp_ctx *ctx, const int32_t *ids, int n_prompt)
{
    if (!p)
        return;
    int n = n_prompt - n_prompt % p->bs;
    if (n < p->cfg.min_tokens || n <= 0 || !srv_prefix_ctx_ok(ctx) ||
        kvp_ctx_n_tokens(ctx) < n || entry_bytes(p, n) > p->cfg.ram_bytes)
        return;
    /* a prompt that adds little to a cached prefix (a follow-up question after a document) is
     * not kept again: copying and writing the whole document for a few more tokens would cost
     * far more than prefilling those tokens when they are asked for again */
    pthread_mutex_lock(&p->mu);
    struct entry *best = NULL;
    int best_m = 0;
    for (struct entry *e = p->list; e; e = e->next) {
        int m = common_blocks(p, e, ids, n);
        if (m > best_m) {
            best = e;
            best_m = m;
        }
    }
    if (best && n - best_m < SRV_PREFIX_MIN_GAIN) {
        best->last_used = kvp_time_now();
        pthread_mutex_unlock(&p->mu);
        return;
    }
    pthread_mutex_unlock(&p->mu);
    /* copy outside the lock: only this (the scheduler) thread touches the slots */
    struct entry *e = calloc(1, sizeof(*e));
    size_t bytes = entry_bytes(p, n);
    if (!e || !(e->toks = malloc((size_t)n * 4)) || !(e->data = malloc(bytes))) {
        entry_free(e);
        return;
    }
    memcpy(e->toks, ids, (size_t)n * 4);
    e->n = n;
    struct unit_copy uc = {.p = p, .data = e->data, .nb_e = n / p->bs, .nb = n / p->bs};
    struct kvp_err err = {0};
    if (kvp_seq_read_kv(ctx, n, copy_layer, &uc, &err) < 0) {
        /* a tiered store that lost data (the slot recovers on its own): nothing is kept */
        entry_free(e);
        return;
    }
    pthread_mutex_lock(&p->mu);
    e->last_used = kvp_time_now();
    e->next = p->list;
    p->list = e;
    p->ram_used += bytes;
    p->st.entries++;
    p->st.ram_bytes = p->ram_used;
    if (p->persistent) {
        e->writing = true;
        if (p->wq_tail)
            p->wq_tail->wnext = e;
        else
            p->wq_head = e;
        p->wq_tail = e;
        pthread_cond_broadcast(&p->cv);
    }
    trim(p);
    pthread_mutex_unlock(&p->mu);
}

int srv_prefix_match(struct srv_prefix *p, const int32_t *ids, int n, int limit, int have)
{
    if (!p)
        return 0;
    int best = 0;
    pthread_mutex_lock(&p->mu);
    for (struct entry *e = p->list; e; e = e->next) {
        int m = common_blocks(p, e, ids, n < limit ? n : limit);
        best = m > best ? m : best;
    }
    pthread_mutex_unlock(&p->mu);
    return best > have ? best : 0;
}

/* The entry that covers the first m tokens of ids, preferring one in RAM (lock held). */
static struct entry *find_cover(struct srv_prefix *p, const int32_t *ids, int m)
{
    struct entry *e = NULL;
    for (struct entry *q = p->list; q; q = q->next)
        if (common_blocks(p, q, ids, m) >= m && (!e || (q->data && !e->data)))
            e = q;
    return e;
}

void srv_prefix_prefetch(struct srv_prefix *p, const int32_t *ids, int n)
{
    if (!p || n < 3)
        return;
    pthread_mutex_lock(&p->mu);
    if (p->n_loaders > 0) {
        struct entry *best = NULL;
        int best_m = 0;
        for (struct entry *e = p->list; e; e = e->next) {
            int m = common_blocks(p, e, ids, n - 2);
            if (m > best_m || (m == best_m && best && e->data && !best->data)) {
                best = e;
                best_m = m;
            }
        }
        if (best && !best->data && !best->loading && !best->queued) {
            best->queued = true;
            if (p->lq_tail)
                p->lq_tail->lnext = best;
            else
                p->lq_head = best;
            p->lq_tail = best;
            pthread_cond_broadcast(&p->cv);
        }
    }
    pthread_mutex_unlock(&p->mu);
}

int srv_prefix_load(struct srv_prefix *p, kvp_ctx *ctx, const int32_t *ids, int m)
{
    kvp_ctx_reset(ctx);
    pthread_mutex_lock(&p->mu);
    struct entry *e = NULL;
    for (;;) {
        e = m % p->bs ? NULL : find_cover(p, ids, m);
        if (!e || e->data)
            break;
        if (e->loading) {
            /* a loader reads it now (asked for when the request arrived): wait for it */
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        if (fetch(p, e, false) < 0) { /* trimmed after the copy below, not before */
            pthread_mutex_unlock(&p->mu);
            return -1;
        }
    }
    if (!e) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    e->last_used = kvp_time_now();
    struct kvp_err err = {0};
    struct unit_copy uc = {.p = p, .data = e->data, .nb_e = e->n / p->bs, .nb = m / p->bs,
                           .to_cache = true};
    int rc = kvp_seq_write_kv(ctx, m, copy_layer, &uc, &err);
    if (rc < 0) {
        kvp_ctx_reset(ctx);
    } else {
        p->st.hits++;
        p->st.tokens_loaded += (uint64_t)m;
    }
    trim(p);
    pthread_mutex_unlock(&p->mu);
    return rc < 0 ? -1 : 0;
}

void srv_prefix_stats(struct srv_prefix *p, struct srv_prefix_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    st->persistent = p->persistent;
    pthread_mutex_unlock(&p->mu);
}
