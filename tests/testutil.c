/* Test helpers (see testutil.h). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *kvp_test_shared(const char *relpath)
{
    static char buf[4096];
    const char *dir = getenv("KVP_SHARED_DIR");
    if (!dir || !*dir)
        dir = "../shared";
    snprintf(buf, sizeof(buf), "%s/%s", dir, relpath);
    struct stat st;
    if (stat(buf, &st) != 0)
        return NULL;
    return buf;
}

const char *kvp_test_cli(void)
{
    const char *p = getenv("KVP_CLI");
    return (p && *p) ? p : NULL;
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

char *kvp_test_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = 0;
    fclose(f);
    if (size)
        *size = (size_t)n;
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
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int status = pclose(p);
    if (buf)
        buf[len] = 0;
    if (output)
        *output = buf;
    else
        free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
