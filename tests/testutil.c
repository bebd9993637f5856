/* Test helpers (see testutil.h). */
#include "testutil.h"

#include <fnmatch.h>
#include <stdbool.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <math.h>

#include <cjson/cJSON.h>

#include "core/stream.h"

/* KVP_TEST_FILTER=PATTERN: run only the cmocka tests of this program whose names match (cmocka's
 * * and ? wildcards), before main runs its group. CMake uses it to register the numeric part of a
 * long program on its own (test_store_equality), which scripts/test.sh repeats per SIMD table. */
__attribute__((constructor)) static void test_filter_from_env(void)
{
    const char *f = getenv("KVP_TEST_FILTER");
    if (f && *f)
        cmocka_set_test_filter(f);
}

double kvp_test_gamma(double n)
{
    const double nu = n * 0x1p-24;
    return nu / (1 - nu);
}

double kvp_test_max_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

const char *kvp_test_shared(const char *relpath)
{
    static char bufs[8][4096];
    static unsigned next;
    char *buf = bufs[next++ % 8];
    const char *dir = getenv("KVP_SHARED_DIR");
    if (!dir || !*dir)
        dir = "../shared";
    snprintf(buf, sizeof(bufs[0]), "%s/%s", dir, relpath);
    struct stat st;
    if (stat(buf, &st) != 0) {
        /* under CI every optional input must be there: a lost one fails here, whatever the
         * caller would do with NULL; outside CI the part that needed it is counted as skipped */
        char what[4200];
        snprintf(what, sizeof(what), "../shared/%s not found", relpath);
        if (kvp_test_in_ci())
            fail_msg("%s (CI=true: a missing input fails the run)", what);
        kvp_test_note_skip(what);
        return NULL;
    }
    return buf;
}

bool kvp_test_in_ci(void)
{
    const char *ci = getenv("CI");
    return ci && (!strcmp(ci, "true") || !strcmp(ci, "1"));
}

void kvp_test_note_skip(const char *why)
{
    const char *log = getenv("KVP_SKIP_LOG");
    FILE *f = log && *log ? fopen(log, "a") : NULL;
    if (!f)
        return;
    char self[256] = "?";
    FILE *c = fopen("/proc/self/comm", "r");
    if (c) {
        if (fgets(self, sizeof(self), c))
            self[strcspn(self, "\n")] = 0;
        fclose(c);
    }
    fprintf(f, "%s: %s\n", self, why);
    fclose(f);
}

void kvp_test_skip_missing(const char *what)
{
    if (kvp_test_in_ci())
        fail_msg("%s (CI=true: a missing input fails the run)", what);
    print_message("[  SKIP    ] %s, test skipped\n", what);
    kvp_test_note_skip(what);
    skip();
}

void kvp_test_skip_unsupported(const char *why)
{
    print_message("[  SKIP    ] %s, test skipped\n", why);
    kvp_test_note_skip(why);
    skip();
}

int kvp_test_filter_check(const struct CMUnitTest *tests, size_t n)
{
    const char *f = getenv("KVP_TEST_FILTER");
    if (!f || !*f)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (fnmatch(f, tests[i].name, 0) == 0)
            return 0;
    fprintf(stderr, "KVP_TEST_FILTER=%s matches none of this program's %zu tests\n", f, n);
    return 1;
}

const char *kvp_test_cli(void)
{
    const char *p = getenv("KVP_CLI");
    return (p && *p) ? p : NULL;
}

void kvp_test_expect_error(const char *cmd, const char *needle)
{
    char *out = NULL;
    int st = kvp_test_run(cmd, &out, 1);
    assert_non_null(out);
    if (st != 1 || strncmp(out, "kvpred: error: ", 15) != 0 || !strstr(out, needle) ||
        strchr(out, '\n') != out + strlen(out) - 1)
        print_message("command: %s\nstatus %d, output: %s\n", cmd, st, out);
    assert_int_equal(st, 1);
    assert_memory_equal(out, "kvpred: error: ", 15);
    assert_non_null(strstr(out, needle));
    assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1);
    free(out);
}

char *kvp_test_tmpfile(const char *suffix)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    size_t n = strlen(tmp) + 64 + (suffix ? strlen(suffix) : 0);
    char *path = malloc(n);
    if (!path)
        return NULL;
    snprintf(path, n, "%s/kvptestXXXXXX%s", tmp, suffix ? suffix : "");
    int fd = mkstemps(path, suffix ? (int)strlen(suffix) : 0);
    if (fd < 0) {
        free(path);
        return NULL;
    }
    close(fd);
    return path;
}

char *kvp_test_tmpdir(void)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    size_t n = strlen(tmp) + 32;
    char *path = malloc(n);
    assert_non_null(path);
    snprintf(path, n, "%s/kvptestXXXXXX", tmp);
    if (!mkdtemp(path))
        fail_msg("cannot create a directory %s", path);
    return path;
}

char *kvp_test_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = kvp_read_stream(f, size);
    fclose(f);
    return buf;
}

int kvp_test_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, size, f);
    int rc = fclose(f);
    return (w == size && rc == 0) ? 0 : -1;
}

int kvp_test_run(const char *cmd, char **output, int merge_stderr)
{
    size_t n = strlen(cmd) + 16;
    char *full = malloc(n);
    if (!full)
        return -1;
    snprintf(full, n, "%s%s", cmd, merge_stderr ? " 2>&1" : "");
    FILE *p = popen(full, "r");
    free(full);
    if (!p)
        return -1;
    char *buf = kvp_read_stream(p, NULL);
    int status = pclose(p);
    if (output)
        *output = buf;
    else
        free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int kvp_test_run_json_lines(const char *cmd, cJSON **js, int cap)
{
    char *out = NULL;
    assert_int_equal(kvp_test_run(cmd, &out, 0), 0);
    int n = 0;
    for (char *line = strtok(out, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
        js[n] = cJSON_Parse(line);
        if (!js[n])
            print_message("%s printed:\n%s\n", cmd, line);
        assert_non_null(js[n++]);
    }
    free(out);
    return n;
}

/* ---- llama.cpp tokenizer test vectors ---- */
#include "tokenizer/vocab.h"

int kvp_test_vocab_vectors(const struct kvp_vocab *v, char *inp, char *out,
                           kvp_test_vector_check extra, int *failed)
{
    const char *sep = "\n__ggml_vocab_test__\n";
    char *ic = inp, *oc = out;
    int cases = 0;
    *failed = 0;
    for (bool last = false; !last; cases++) {
        char *end = strstr(ic, sep);
        if (!end) {
            end = ic + strlen(ic);
            last = true;
        }
        *end = 0;
        assert_non_null(oc);
        char *oline_end = strchr(oc, '\n');
        if (oline_end)
            *oline_end = 0;
        size_t len = strlen(ic), n = 0, cap = 3 * len + 16;
        int32_t *ids = malloc(cap * sizeof(*ids));
        assert_non_null(ids);
        struct kvp_err err = {0};
        if (kvp_vocab_encode(v, ic, len, false, false, ids, cap, &n, &err) != 0)
            fail_msg("case %d: encode: %s", cases, err.msg);
        char got[8192] = {0};
        size_t o = 0;
        for (size_t i = 0; i < n && o < sizeof(got) - 16; i++)
            o += (size_t)snprintf(got + o, sizeof(got) - o, i ? " %d" : "%d", ids[i]);
        const char *want = oc; /* .out lines start with a space before each id */
        while (*want == ' ')
            want++;
        if (strcmp(got, want) != 0) {
            print_message("case %d '%s':\n  got  %s\n  want %s\n", cases, ic, got, want);
            (*failed)++;
        }
        if (extra)
            *failed += extra(v, cases, ic, ids, n);
        free(ids);
        ic = last ? end : end + strlen(sep);
        oc = oline_end ? oline_end + 1 : NULL;
    }
    assert_null(oc); /* as many expected lines as cases */
    return cases;
}

/* ---- random-weight model fixtures ---- */
#include "kernels/types.h"
#include "gguf/gguf.h"

static float fixture_rand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return ((float)((*s >> 8) & 0xffff) / 65535.0f - 0.5f);
}

struct fixture_tensor {
    void *q;     /* data in the requested type */
    float *deq;  /* dequantized copy */
};

static int fixture_make(int type, int64_t cols, int64_t rows, float scale, unsigned *seed,
                        struct fixture_tensor *t)
{
    size_t n = (size_t)(cols * rows);
    float *w = malloc(n * sizeof(float));
    size_t row_bytes;
    if (!w || !kvp_type_row_bytes(type, cols, &row_bytes))
        return -1;
    for (size_t i = 0; i < n; i++)
        w[i] = fixture_rand(seed) * scale;
    const struct kvp_type_traits *tt = kvp_type_traits(type);
    t->q = malloc(row_bytes * (size_t)rows);
    t->deq = malloc(n * sizeof(float));
    if (!t->q || !t->deq)
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        tt->from_f32(w + r * cols, (uint8_t *)t->q + r * row_bytes, cols);
        tt->to_f32((uint8_t *)t->q + r * row_bytes, t->deq + r * cols, cols);
    }
    free(w);
    return 0;
}

int kvp_test_write_model(const struct kvp_test_model_spec *sp, const char *path,
                         const char *deq_path)
{
    const char *arch = sp->arch ? sp->arch : "llama";
    int hd = sp->head_dim > 0 ? sp->head_dim : sp->n_embd / sp->n_head;
    int biases = sp->biases || (sp->arch && !strcmp(sp->arch, "qwen2"));
    int64_t qd = (int64_t)sp->n_head * hd, kvd = (int64_t)sp->n_head_kv * hd;
    unsigned seed = sp->seed ? sp->seed : 1;
    struct kvp_gguf_writer *w[2] = {NULL, NULL};
    enum { MAXT = 1024 };
    struct fixture_tensor ts[MAXT];
    float *norms[MAXT];
    int nt = 0, nn = 0, rc = -1;
    memset(ts, 0, sizeof(ts));
    if (kvp_gguf_writer_init(&w[0], NULL) < 0 || kvp_gguf_writer_init(&w[1], NULL) < 0)
        goto out;
    for (int f = 0; f < 2; f++) {
        char key[128];
        kvp_gguf_writer_set_str(w[f], "general.architecture", arch);
        kvp_gguf_writer_set_str(w[f], "general.name", "random test model");
#define KEY(s) (snprintf(key, sizeof(key), "%s.%s", arch, s), key)
        kvp_gguf_writer_set_u32(w[f], KEY("context_length"), (uint32_t)sp->n_ctx);
        kvp_gguf_writer_set_u32(w[f], KEY("embedding_length"), (uint32_t)sp->n_embd);
        kvp_gguf_writer_set_u32(w[f], KEY("block_count"), (uint32_t)sp->n_layer);
        kvp_gguf_writer_set_u32(w[f], KEY("feed_forward_length"), (uint32_t)sp->n_ff);
        kvp_gguf_writer_set_u32(w[f], KEY("attention.head_count"), (uint32_t)sp->n_head);
        kvp_gguf_writer_set_u32(w[f], KEY("attention.head_count_kv"), (uint32_t)sp->n_head_kv);
        kvp_gguf_writer_set_f32(w[f], KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
        kvp_gguf_writer_set_f32(w[f], KEY("rope.freq_base"),
                                sp->rope_base > 0 ? sp->rope_base : 10000.0f);
        if (sp->head_dim > 0) {
            kvp_gguf_writer_set_u32(w[f], KEY("attention.key_length"), (uint32_t)hd);
            kvp_gguf_writer_set_u32(w[f], KEY("attention.value_length"), (uint32_t)hd);
            kvp_gguf_writer_set_u32(w[f], KEY("rope.dimension_count"), (uint32_t)hd);
        }
#undef KEY
    }
    /* add one matrix to both files */
#define MAT(name, type, cols, rows, scale)                                                        \
    do {                                                                                           \
        if (nt >= MAXT || fixture_make(type, cols, rows, scale, &seed, &ts[nt]) < 0)               \
            goto out;                                                                              \
        int64_t ne_[2] = {cols, rows};                                                             \
        kvp_gguf_writer_add_tensor(w[0], name, type, 2, ne_, ts[nt].q);                            \
        kvp_gguf_writer_add_tensor(w[1], name, KVP_TYPE_F32, 2, ne_, ts[nt].deq);                  \
        nt++;                                                                                      \
    } while (0)
#define VEC(name, n)                                                                               \
    do {                                                                                           \
        float *v_ = malloc((size_t)(n) * sizeof(float));                                           \
        if (!v_ || nn >= MAXT)                                                                     \
            goto out;                                                                              \
        for (int i_ = 0; i_ < (n); i_++)                                                           \
            v_[i_] = 1.0f + 0.5f * fixture_rand(&seed);                                            \
        norms[nn++] = v_;                                                                          \
        int64_t ne_[1] = {n};                                                                      \
        kvp_gguf_writer_add_tensor(w[0], name, KVP_TYPE_F32, 1, ne_, v_);                          \
        kvp_gguf_writer_add_tensor(w[1], name, KVP_TYPE_F32, 1, ne_, v_);                          \
    } while (0)
    float ws = 1.0f / sqrtf((float)sp->n_embd) * 2.0f;
    MAT("token_embd.weight", sp->embd_type, sp->n_embd, sp->n_vocab, 2.0f);
    if (sp->rope_freqs) {
        float *v_ = malloc((size_t)(hd / 2) * sizeof(float));
        if (!v_ || nn >= MAXT)
            goto out;
        for (int i_ = 0; i_ < hd / 2; i_++)
            v_[i_] = 1.0f + 7.0f * (float)i_ / (float)(hd / 2);
        norms[nn++] = v_;
        int64_t ne_[1] = {hd / 2};
        kvp_gguf_writer_add_tensor(w[0], "rope_freqs.weight", KVP_TYPE_F32, 1, ne_, v_);
        kvp_gguf_writer_add_tensor(w[1], "rope_freqs.weight", KVP_TYPE_F32, 1, ne_, v_);
    }
    for (int l = 0; l < sp->n_layer; l++) {
        char nm[64];
        snprintf(nm, sizeof(nm), "blk.%d.attn_norm.weight", l);
        VEC(nm, sp->n_embd);
        snprintf(nm, sizeof(nm), "blk.%d.attn_q.weight", l);
        MAT(nm, sp->type, sp->n_embd, qd, ws * 2);
        snprintf(nm, sizeof(nm), "blk.%d.attn_k.weight", l);
        MAT(nm, sp->type, sp->n_embd, kvd, ws * 2);
        snprintf(nm, sizeof(nm), "blk.%d.attn_v.weight", l);
        MAT(nm, sp->type, sp->n_embd, kvd, ws);
        if (biases) {
            snprintf(nm, sizeof(nm), "blk.%d.attn_q.bias", l);
            VEC(nm, (int)qd);
            snprintf(nm, sizeof(nm), "blk.%d.attn_k.bias", l);
            VEC(nm, (int)kvd);
            snprintf(nm, sizeof(nm), "blk.%d.attn_v.bias", l);
            VEC(nm, (int)kvd);
        }
        snprintf(nm, sizeof(nm), "blk.%d.attn_output.weight", l);
        MAT(nm, sp->type, qd, sp->n_embd, ws);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_norm.weight", l);
        VEC(nm, sp->n_embd);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_gate.weight", l);
        MAT(nm, sp->type, sp->n_embd, sp->n_ff, ws);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_up.weight", l);
        MAT(nm, sp->type, sp->n_embd, sp->n_ff, ws);
        snprintf(nm, sizeof(nm), "blk.%d.ffn_down.weight", l);
        MAT(nm, sp->type, sp->n_ff, sp->n_embd, 1.0f / sqrtf((float)sp->n_ff) * 2.0f);
    }
    VEC("output_norm.weight", sp->n_embd);
    if (!sp->tied)
        MAT("output.weight", sp->type, sp->n_embd, sp->n_vocab, ws * 2);
#undef MAT
#undef VEC
    if (kvp_gguf_writer_write_file(w[0], path, NULL) < 0)
        goto out;
    if (deq_path && kvp_gguf_writer_write_file(w[1], deq_path, NULL) < 0)
        goto out;
    rc = 0;
out:
    for (int i = 0; i < nt; i++) {
        free(ts[i].q);
        free(ts[i].deq);
    }
    for (int i = 0; i < nn; i++)
        free(norms[i]);
    kvp_gguf_writer_free(w[0]);
    kvp_gguf_writer_free(w[1]);
    return rc;
}

#include "kvpred.h"

struct kvp_model *kvp_test_model(const struct kvp_test_model_spec *spec, char **path)
{
    *path = kvp_test_tmpfile(".gguf");
    assert_non_null(*path);
    assert_int_equal(kvp_test_write_model(spec, *path, NULL), 0);
    kvp_model *m = NULL;
    struct kvp_err err = {0};
    if (kvp_model_open(*path, NULL, &m, &err) < 0)
        print_message("%s: %s\n", *path, err.msg);
    assert_non_null(m);
    return m;
}

void kvp_test_model_free(struct kvp_model *model, char *path)
{
    kvp_model_close(model);
    if (path)
        remove(path);
    free(path);
}
