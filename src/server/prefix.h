/*
 * The server's prefix cache: the KV of prompts it has prefilled, kept after their slot moves on,
 * so a later request that starts with one of them (in any slot, or after a restart) copies it in
 * instead of prefilling it again.
 *
 * An entry is a prompt's first n tokens, n a whole number of KV blocks, and their keys and values
 * as units: one unit per (layer, block) holding every KV head's key block then value block, in
 * the cache's own element types. Only prompt tokens are kept (prefill computes them with dense
 * attention whatever the policy, so one entry serves every policy that keeps the whole cache).
 * Entries live in RAM within a byte budget, least recently used first out; with a folder they
 * are also written there (by a thread of their own, so the slots never wait for the disk), one
 * file per entry, and a restarted server lists the folder and reads an entry back when a prompt
 * asks for it.
 *
 * File (little-endian): the header below, the token ids (int32), then every unit followed by
 * the FNV-1a 64 checksum of its bytes. A file is used only if its header matches this server
 * (magic, version, model fingerprint, KV types, block size, shapes), its token ids match their
 * checksum and its size is exact; each unit is checked as it is read. A file that fails is
 * refused with one log line, deleted and never used; the prompt is prefilled instead. When the
 * folder cannot be written (full, read-only), the server says so once and keeps the RAM cache.
 */
#ifndef KVP_SERVER_PREFIX_H
#define KVP_SERVER_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpred.h"

struct srv_prefix;

struct srv_prefix_config {
    const char *model_path;   /* for the fingerprint */
    const kvp_model *model;
    const kvp_ctx *like;      /* a context of the slots' shape and KV types */
    size_t ram_bytes;         /* RAM budget of the entries' data */
    const char *dir;          /* NULL: no persistence */
    int min_tokens;           /* shorter prompts are not kept */
    const char *variant;      /* what else the cached KV depends on, hashed into the
                                 fingerprint: the server's sparse prefill settings (a sparse
                                 prefill leaves other keys and values than a dense one); NULL
                                 for a dense prefill */
};

/* 0, or an error only when out of memory: a folder that cannot be made, listed or later
 * written turns persistence off with one line on stderr. Refused files are logged there too. */
int srv_prefix_open(const struct srv_prefix_config *cfg, struct srv_prefix **out,
                    struct kvp_err *err);
/* Write out what is still queued for the folder, stop the writer, free everything. */
void srv_prefix_close(struct srv_prefix *p);

/* The model file's identity (its size, first and last 64 KiB, shapes) and the variant of the
 * cached KV (srv_prefix_config.variant, NULL: dense prefill): what keys the folder's files and
 * the shared prefix store's blocks (prefix_store.h). */
uint64_t srv_prefix_fingerprint(const char *path, const kvp_model *m, const char *variant);

/* Whether a context can take part (no evicting or prompt-reading policy; untiered or tiered:
 * a tiered one's units are read and written through its store's staging area). */
bool srv_prefix_ctx_ok(const kvp_ctx *ctx);

/* Keep the first n_prompt prompt tokens of ctx (rounded down to whole blocks) unless an entry
 * already covers them. Called by the scheduler thread after the prompt is prefilled. */
void srv_prefix_put(struct srv_prefix *p, kvp_ctx *ctx, const int32_t *ids, int n_prompt);

/* The longest cached prefix of ids[0..n) in whole blocks, at most `limit` tokens: its length
 * (0: none better than `have`). */
int srv_prefix_match(struct srv_prefix *p, const int32_t *ids, int n, int limit, int have);

/* A request for ids[0..n) arrived: start reading the longest cached prefix it starts with back
 * from its file in the background, if it is only there, so it is in RAM (or nearly) when the
 * request gets a slot. Cheap; any thread. */
void srv_prefix_prefetch(struct srv_prefix *p, const int32_t *ids, int n);

/* Copy the cached prefix of ids of length m (from srv_prefix_match) into ctx, replacing what it
 * held. 0, or -1 when the entry is gone or refused (ctx is then empty). */
int srv_prefix_load(struct srv_prefix *p, kvp_ctx *ctx, const int32_t *ids, int m);

struct srv_prefix_stats {
    uint64_t entries, ram_bytes, disk_entries, disk_bytes;
    uint64_t hits, tokens_loaded, refused, written;
    bool persistent;          /* the folder is in use */
};
void srv_prefix_stats(struct srv_prefix *p, struct srv_prefix_stats *st);

#endif
