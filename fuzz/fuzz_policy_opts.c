/*
 * libFuzzer target for the policy option strings (`--policy-opts`, kvp_policy_params.opts),
 * driven through the highest-level entry point that takes them, kvp_ctx_set_policy, so it keeps
 * working whichever module parses them (today each policy's option table read by
 * src/policy/options.c).
 *
 * A tiny random model (3 layers, GQA 2:1, blocks of 4), a matching tiny predictor file and a head
 * profile of the model's shape (good.profile) are made at start, the files in a fresh temporary
 * folder (fixtures.h). Input: byte 0 picks the policy (quest,
 * predictor, catekv with predictor-driven adaptive heads, catekv with Quest-driven ones), byte 1
 * the token budget (0..63), the rest, up to the first NUL, is the option string. Options the
 * parser accepts must give a policy that runs: a 20-token prefill and 4 decode steps. A refusal
 * must be an error code with a message.
 *
 * catekv's head-profile=FILE names a file to read: FILE is taken inside that folder, and inputs
 * whose FILE has a '/' are skipped, so the fuzzer reads only the folder's files (never, say,
 * /dev/stdin).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "kvpred.h"
#include "policy/catekv_profile.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvp_model *model;
static kvp_ctx *ctx;
static char dir[] = "/tmp/kvpred-fuzz-XXXXXX", pred_path[64], prof_path[64];

static void remove_dir(void)
{
    unlink(pred_path);
    unlink(prof_path);
    rmdir(dir);
}

/* A profile of the tiny model's shape (3 layers, 1 KV head), one adaptive head. */
static int write_profile(const char *path)
{
    struct kvp_head_profile *hp;
    struct kvp_err err;
    if (kvp_head_profile_alloc(3, 1, &hp, &err) < 0)
        return -1;
    hp->ratio = 0.4;
    hp->adaptive[1] = 1;
    for (int i = 0; i < 3; i++)
        hp->cv[i] = 0.5 + i;
    int rc = kvp_head_profile_write(hp, path, &err);
    kvp_head_profile_free(hp);
    return rc;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct kvp_err err = {0};
    model = fz_tiny_model();
    struct kvp_ctx_params cp = {.n_ctx = 64, .n_threads = 1, .block_size = 4};
    if (!model || !mkdtemp(dir) ||
        snprintf(pred_path, sizeof(pred_path), "%s/tiny.kvpp", dir) >= (int)sizeof(pred_path) ||
        snprintf(prof_path, sizeof(prof_path), "%s/good.profile", dir) >= (int)sizeof(prof_path) ||
        fz_write_predictor(pred_path, 4) < 0 || write_profile(prof_path) < 0 ||
        kvp_ctx_init(model, &cp, &ctx, &err) < 0) {
        fprintf(stderr, "fuzz_policy_opts: setup failed: %s\n", err.msg);
        abort();
    }
    atexit(remove_dir);
    return 0;
}

/* opts with every head-profile=FILE made dir/FILE, or NULL when a FILE has a '/' (or no memory). */
static char *in_folder(const char *opts)
{
    static const char key[] = "head-profile=";
    size_t n = 0;
    for (const char *p = strstr(opts, key); p; p = strstr(p + 1, key))
        n++;
    char *out = malloc(strlen(opts) + n * (sizeof(dir) + 1) + 1), *o = out;
    if (!out)
        return NULL;
    const char *p = opts;
    for (const char *k = strstr(p, key); k; k = strstr(p, key)) {
        const char *v = k + sizeof(key) - 1;
        if (memchr(v, '/', strcspn(v, ","))) {
            free(out);
            return NULL;
        }
        memcpy(o, p, (size_t)(v - p));
        o += v - p;
        o += sprintf(o, "%s/", dir);
        p = v;
    }
    strcpy(o, p);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    char *raw = malloc(size - 1);
    if (!raw)
        return 0;
    memcpy(raw, data + 2, size - 2);
    raw[size - 2] = 0;
    char *opts = in_folder(raw);
    free(raw);
    if (!opts)
        return 0;

    struct kvp_policy_params p = {.budget = data[1] & 63, .sink = 2, .local = 2, .window = 4,
                                  .dense_layers = 1, .opts = opts};
    switch (data[0] & 3) {
    case 0:
        p.name = "quest";
        break;
    case 1:
        p.name = "predictor";
        p.aux_path = pred_path;
        break;
    case 2:
        p.name = "catekv";
        p.adaptive_mode = KVP_ADAPTIVE_PREDICTOR;
        p.aux_path = pred_path;
        break;
    default:
        p.name = "catekv";
        p.adaptive_mode = KVP_ADAPTIVE_QUEST;
        break;
    }
    struct kvp_err err = {0};
    int rc = kvp_ctx_set_policy(ctx, &p, &err);
    if (rc < 0 && (rc < KVP_ENOTFOUND || !err.msg[0]))
        abort(); /* an error is a known code with one line */
    if (rc == 0) {
        int32_t toks[24];
        for (int i = 0; i < 24; i++)
            toks[i] = (i * 7 + 3) % 32;
        if (kvp_eval(ctx, toks, 20, NULL, false, &err) < 0)
            abort();
        for (int i = 20; i < 24; i++)
            if (kvp_eval(ctx, toks + i, 1, NULL, false, &err) < 0)
                abort();
    }
    kvp_ctx_set_policy(ctx, NULL, &err); /* release the policy's state before the next input */
    free(opts);
    return 0;
}
