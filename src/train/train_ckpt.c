/*
 * Trainer checkpoints: everything a run needs to continue bit for bit, in one little-endian file.
 *
 *   "KVPTCKPT"  u32 version (3; 1 and 2 are read too)  u32 0
 *   config      i32 n_vocab n_embd n_layer n_head n_head_kv n_ff n_ctx tied, f32 rope_base norm_eps
 *   hparams     u64 seed, i64 steps tokens_per_step micro_tokens, f32 lr lr_min warmup_frac
 *               weight_decay beta1 beta2 adam_eps clip answer_weight, i32 n_phases,
 *               i32 phase_ctx[8], f32 phase_frac[8], u32 n_tasks, f32 mix[n_tasks],
 *               f32 edge_frac fill_min (version 2; version 1 files get the defaults),
 *               f32 hay_frac, i64 stage_step (version 3; older files get 0 and 0)
 *   state       i64 step, u64 rng[4], u64 data_cursor, f64 tokens_seen, u64 adam_t,
 *               u64 hay_hash (version 3)
 *   vocab       u32 n, then n × (u32 len, bytes, f32 score, i32 type)
 *   weights     u64 n_params, f32 params[n], f32 adam_m[n], f32 adam_v[n]
 *   u64 FNV-1a-64 of every byte before it
 *
 * The file is written to PATH.tmp and renamed, so a crash never leaves a torn checkpoint.
 * Loading maps the file, checks the checksum first, then decodes through the bounds-checked
 * cursor, validating the configuration like a fresh one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cursor.h"
#include "core/platform.h"
#include "train/train.h"

#define CKPT_MAGIC "KVPTCKPT"
#define CKPT_VERSION 3u

struct wr {
    FILE *f;
    uint64_t h;
    bool bad;
};

static void wr_bytes(struct wr *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        w->h ^= b[i];
        w->h *= 1099511628211ULL;
    }
    if (n && fwrite(p, 1, n, w->f) != n)
        w->bad = true;
}

#define WR(w, v)                                                                                   \
    do {                                                                                           \
        __typeof__(v) tmp_ = (v);                                                                  \
        wr_bytes(w, &tmp_, sizeof(tmp_));                                                          \
    } while (0)

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

int kvp_ckpt_save(const char *path, const struct kvp_train_model *m, const struct kvp_adamw *opt,
                  const struct kvp_tvocab *v, const struct kvp_train_hparams *hp,
                  const struct kvp_train_state *st, struct kvp_err *err)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp)
        return kvp_err_set(err, KVP_ENOMEM, "checkpoint path");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    struct wr w = {fopen(tmp, "wb"), 1469598103934665603ULL, false};
    if (!w.f) {
        int rc = kvp_err_set(err, KVP_EIO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    const struct kvp_train_config *c = &m->cfg;
    wr_bytes(&w, CKPT_MAGIC, 8);
    WR(&w, (uint32_t)CKPT_VERSION);
    WR(&w, (uint32_t)0);
    int32_t ci[8] = {c->n_vocab, c->n_embd, c->n_layer, c->n_head,
                     c->n_head_kv, c->n_ff, c->n_ctx, c->tied};
    wr_bytes(&w, ci, sizeof(ci));
    WR(&w, c->rope_base);
    WR(&w, c->norm_eps);
    WR(&w, (uint64_t)hp->seed);
    WR(&w, (int64_t)hp->steps);
    WR(&w, (int64_t)hp->tokens_per_step);
    WR(&w, (int64_t)hp->micro_tokens);
    float hf[9] = {hp->lr,    hp->lr_min,   hp->warmup_frac, hp->weight_decay, hp->beta1,
                   hp->beta2, hp->adam_eps, hp->clip,        hp->answer_weight};
    wr_bytes(&w, hf, sizeof(hf));
    WR(&w, (int32_t)hp->n_phases);
    for (int i = 0; i < KVP_TRAIN_MAX_PHASES; i++)
        WR(&w, (int32_t)hp->phase_ctx[i]);
    for (int i = 0; i < KVP_TRAIN_MAX_PHASES; i++)
        WR(&w, hp->phase_frac[i]);
    WR(&w, (uint32_t)KVP_TASK_COUNT);
    for (int i = 0; i < KVP_TASK_COUNT; i++)
        WR(&w, hp->mix.w[i]);
    WR(&w, hp->mix.edge_frac);
    WR(&w, hp->mix.fill_min);
    WR(&w, hp->mix.hay_frac);
    WR(&w, (int64_t)hp->stage_step);
    WR(&w, (int64_t)st->step);
    for (int i = 0; i < 4; i++)
        WR(&w, st->rng.s[i]);
    WR(&w, st->data_cursor);
    WR(&w, st->tokens_seen);
    WR(&w, (uint64_t)opt->t);
    WR(&w, st->hay_hash);
    WR(&w, (uint32_t)v->n);
    for (int i = 0; i < v->n; i++) {
        WR(&w, (uint32_t)v->len[i]);
        wr_bytes(&w, v->text[i], v->len[i]);
        WR(&w, v->score[i]);
        WR(&w, v->type[i]);
    }
    WR(&w, (uint64_t)m->n_params);
    wr_bytes(&w, m->params, m->n_params * sizeof(float));
    wr_bytes(&w, opt->m, m->n_params * sizeof(float));
    wr_bytes(&w, opt->v, m->n_params * sizeof(float));
    uint64_t h = w.h;
    wr_bytes(&w, &h, sizeof(h));
    if (fclose(w.f) != 0)
        w.bad = true;
    int rc = 0;
    if (w.bad)
        rc = kvp_err_set(err, KVP_EIO, "%s: write failed", tmp);
    else if (rename(tmp, path) != 0)
        rc = kvp_err_set(err, KVP_EIO, "%s: rename: %s", path, strerror(errno));
    if (rc < 0)
        remove(tmp);
    free(tmp);
    return rc;
}

static int rd_hparams(struct kvp_cursor *cur, uint32_t version, struct kvp_train_hparams *hp)
{
    int64_t steps, tps, micro;
    float hf[9];
    int32_t np;
    uint32_t nt;
    memset(hp, 0, sizeof(*hp));
    if (kvp_rd_u64(cur, &hp->seed) || kvp_rd_i64(cur, &steps) || kvp_rd_i64(cur, &tps) ||
        kvp_rd_i64(cur, &micro))
        return -1;
    for (int i = 0; i < 9; i++)
        if (kvp_rd_f32(cur, &hf[i]))
            return -1;
    if (kvp_rd_i32(cur, &np) || np < 1 || np > KVP_TRAIN_MAX_PHASES)
        return -1;
    for (int i = 0; i < KVP_TRAIN_MAX_PHASES; i++) {
        int32_t x;
        if (kvp_rd_i32(cur, &x))
            return -1;
        hp->phase_ctx[i] = x;
    }
    for (int i = 0; i < KVP_TRAIN_MAX_PHASES; i++)
        if (kvp_rd_f32(cur, &hp->phase_frac[i]))
            return -1;
    if (kvp_rd_u32(cur, &nt) || nt != KVP_TASK_COUNT)
        return -1;
    for (int i = 0; i < KVP_TASK_COUNT; i++)
        if (kvp_rd_f32(cur, &hp->mix.w[i]))
            return -1;
    hp->mix.edge_frac = KVP_EDGE_FRAC_DEFAULT;
    hp->mix.fill_min = KVP_FILL_MIN_DEFAULT;
    if (version >= 2 &&
        (kvp_rd_f32(cur, &hp->mix.edge_frac) || kvp_rd_f32(cur, &hp->mix.fill_min) ||
         !(hp->mix.edge_frac >= 0.0f && hp->mix.edge_frac <= 1.0f) ||
         !(hp->mix.fill_min > 0.0f && hp->mix.fill_min <= 1.0f)))
        return -1;
    int64_t stage = 0;
    if (version >= 3 &&
        (kvp_rd_f32(cur, &hp->mix.hay_frac) || kvp_rd_i64(cur, &stage) ||
         !(hp->mix.hay_frac >= 0.0f && hp->mix.hay_frac <= 1.0f) || stage < 0 || stage > steps))
        return -1;
    hp->stage_step = (long)stage;
    hp->steps = (long)steps;
    hp->tokens_per_step = (long)tps;
    hp->micro_tokens = (long)micro;
    hp->lr = hf[0];
    hp->lr_min = hf[1];
    hp->warmup_frac = hf[2];
    hp->weight_decay = hf[3];
    hp->beta1 = hf[4];
    hp->beta2 = hf[5];
    hp->adam_eps = hf[6];
    hp->clip = hf[7];
    hp->answer_weight = hf[8];
    hp->n_phases = np;
    if (hp->steps < 1 || hp->tokens_per_step < 1 || hp->micro_tokens < 2)
        return -1;
    return 0;
}

static int rd_vocab(struct kvp_cursor *cur, struct kvp_tvocab **out, struct kvp_err *err)
{
    uint32_t n;
    if (kvp_rd_u32(cur, &n) || n < 1 || n > 65536)
        return kvp_err_set(err, KVP_EFORMAT, "vocabulary size");
    const char **text = calloc(n, sizeof(*text));
    size_t *len = calloc(n, sizeof(*len));
    float *score = calloc(n, sizeof(*score));
    int32_t *type = calloc(n, sizeof(*type));
    int rc = 0;
    if (!text || !len || !score || !type) {
        rc = kvp_err_set(err, KVP_ENOMEM, "vocabulary");
        goto out;
    }
    char **copies = calloc(n, sizeof(*copies));
    if (!copies) {
        rc = kvp_err_set(err, KVP_ENOMEM, "vocabulary");
        goto out;
    }
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint32_t l;
        const uint8_t *b;
        if (kvp_rd_u32(cur, &l) || l > 256 || kvp_rd_bytes(cur, l, &b) ||
            kvp_rd_f32(cur, &score[i]) || kvp_rd_i32(cur, &type[i])) {
            rc = kvp_err_set(err, KVP_EFORMAT, "vocabulary token %u", i);
            break;
        }
        copies[i] = malloc(l + 1);
        if (!copies[i]) {
            rc = kvp_err_set(err, KVP_ENOMEM, "vocabulary");
            break;
        }
        memcpy(copies[i], b, l);
        copies[i][l] = 0;
        text[i] = copies[i];
        len[i] = l;
    }
    if (rc == 0)
        rc = kvp_tvocab_create((int)n, text, len, score, type, out, err);
    for (uint32_t i = 0; i < n; i++)
        free(copies[i]);
    free(copies);
out:
    free(text);
    free(len);
    free(score);
    free(type);
    return rc;
}

int kvp_ckpt_load(const char *path, long cap_tokens, int n_threads, struct kvp_train_model **mout,
                  struct kvp_adamw *opt, struct kvp_tvocab **vout, struct kvp_train_hparams *hp,
                  struct kvp_train_state *st, struct kvp_err *err)
{
    struct kvp_file_map map;
    int rc = kvp_file_map(path, &map, err);
    if (rc < 0)
        return rc;
    struct kvp_train_model *m = NULL;
    struct kvp_tvocab *v = NULL;
    memset(opt, 0, sizeof(*opt));
    struct kvp_cursor cur;
    uint64_t sum;
    if (map.size < 8 + 8 + 8 || memcmp(map.data, CKPT_MAGIC, 8)) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: not a kvpred checkpoint", path);
        goto fail_unmap;
    }
    memcpy(&sum, map.data + map.size - 8, 8);
    if (fnv(map.data, map.size - 8) != sum) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: checksum mismatch (truncated or corrupt)", path);
        goto fail_unmap;
    }
    kvp_cursor_init(&cur, map.data, map.size - 8);
    cur.pos = 8;
    uint32_t version, pad;
    int32_t ci[8];
    struct kvp_train_config cfg;
    if (kvp_rd_u32(&cur, &version) || kvp_rd_u32(&cur, &pad) || version < 1 ||
        version > CKPT_VERSION) {
        rc = kvp_err_set(err, KVP_EUNSUPPORTED, "%s: checkpoint version %u", path, version);
        goto fail_unmap;
    }
    for (int i = 0; i < 8; i++)
        if (kvp_rd_i32(&cur, &ci[i]))
            goto fail_format;
    cfg = (struct kvp_train_config){.n_vocab = ci[0], .n_embd = ci[1], .n_layer = ci[2],
                                    .n_head = ci[3], .n_head_kv = ci[4], .n_ff = ci[5],
                                    .n_ctx = ci[6], .tied = ci[7]};
    if (kvp_rd_f32(&cur, &cfg.rope_base) || kvp_rd_f32(&cur, &cfg.norm_eps) ||
        rd_hparams(&cur, version, hp))
        goto fail_format;
    int64_t step;
    uint64_t adam_t;
    if (kvp_rd_i64(&cur, &step))
        goto fail_format;
    st->step = (long)step;
    for (int i = 0; i < 4; i++)
        if (kvp_rd_u64(&cur, &st->rng.s[i]))
            goto fail_format;
    st->hay_hash = 0;
    if (kvp_rd_u64(&cur, &st->data_cursor) || kvp_rd_f64(&cur, &st->tokens_seen) ||
        kvp_rd_u64(&cur, &adam_t) || (version >= 3 && kvp_rd_u64(&cur, &st->hay_hash)))
        goto fail_format;
    if ((rc = rd_vocab(&cur, &v, err)) < 0)
        goto fail_unmap;
    if (cap_tokens <= 0)
        cap_tokens = hp->micro_tokens;
    if ((rc = kvp_train_model_init(&m, &cfg, cap_tokens, n_threads, 0, err)) < 0)
        goto fail_vocab;
    uint64_t np;
    const uint8_t *pp, *pm, *pv;
    size_t nb = m->n_params * sizeof(float);
    if (kvp_rd_u64(&cur, &np) || np != m->n_params || kvp_rd_bytes(&cur, nb, &pp) ||
        kvp_rd_bytes(&cur, nb, &pm) || kvp_rd_bytes(&cur, nb, &pv) || kvp_cursor_left(&cur)) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: weights do not match the configuration", path);
        goto fail_model;
    }
    if ((rc = kvp_adamw_init(opt, m->n_params, hp->beta1, hp->beta2, hp->adam_eps,
                             hp->weight_decay, err)) < 0)
        goto fail_model;
    memcpy(m->params, pp, nb);
    memcpy(opt->m, pm, nb);
    memcpy(opt->v, pv, nb);
    opt->t = adam_t;
    kvp_file_unmap(&map);
    *mout = m;
    *vout = v;
    return 0;

fail_format:
    rc = kvp_err_set(err, KVP_EFORMAT, "%s: malformed checkpoint header", path);
    goto fail_unmap;
fail_model:
    kvp_train_model_free(m);
fail_vocab:
    kvp_tvocab_free(v);
fail_unmap:
    kvp_file_unmap(&map);
    return rc;
}
