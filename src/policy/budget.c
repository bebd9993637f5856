/* Budget text (see budget.h). */
#include "policy/budget.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Whole decimal integer in lo..hi: digits only, nothing before or after. */
static bool parse_count(const char *s, size_t n, long lo, long hi, long *out)
{
    if (n == 0 || n > 18)
        return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool kvp_budget_parse(const char *s, int *budget, float *ratio)
{
    *budget = 0;
    *ratio = 0;
    if (!s)
        return false;
    size_t len = strlen(s);
    long num, den;
    const char *slash = strchr(s, '/');
    if (slash) {
        if (!parse_count(s, (size_t)(slash - s), 1, 1 << 30, &num) ||
            !parse_count(slash + 1, len - (size_t)(slash - s) - 1, 1, 1 << 30, &den) ||
            num > den)
            return false;
        *ratio = (float)((double)num / (double)den);
        return true;
    }
    if (parse_count(s, len, 1, 1 << 30, &num)) {
        *budget = (int)num;
        return true;
    }
    if (len == 0 || !((s[0] >= '0' && s[0] <= '9') || s[0] == '.'))
        return false;
    char *end;
    errno = 0;
    double r = strtod(s, &end);
    if (errno || *end || !kvp_budget_ratio_ok(r))
        return false;
    *ratio = (float)r;
    return true;
}

bool kvp_budget_ratio_ok(double r)
{
    return isfinite(r) && r > 0.0 && r <= 1.0 && (float)r > 0.0f;
}
