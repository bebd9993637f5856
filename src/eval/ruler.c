/*
 * RULER scoring (docs/tasks.md §1.1): post-processing and string_match_all. Predictions
 * are short (at most a few hundred bytes), so a plain case-insensitive search is all it needs.
 */
#include <ctype.h>
#include <stdbool.h>
#include <string.h>

#include "eval/ruler.h"

void kvp_ruler_postprocess(const char *pred, char *out, size_t cap)
{
    if (cap == 0)
        return;
    size_t b = 0, e = strlen(pred);
    while (b < e && isspace((unsigned char)pred[b]))
        b++;
    while (e > b && isspace((unsigned char)pred[e - 1]))
        e--;
    size_t k = 0;
    for (size_t i = b; i < e && k + 1 < cap; i++) {
        unsigned char ch = (unsigned char)pred[i];
        out[k++] = ch < 0x20 ? '\n' : (char)ch;
    }
    out[k] = 0;
}

/* Does hay contain needle[0, n) ignoring ASCII case? */
static bool contains_nocase(const char *hay, const char *needle, size_t n)
{
    if (n == 0)
        return true;
    for (const char *h = hay; *h; h++) {
        size_t i = 0;
        while (i < n && h[i] && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return true;
    }
    return false;
}

double kvp_ruler_match_all(const char *pred, const char *refs, int n_refs)
{
    if (n_refs <= 0)
        return 0.0;
    char buf[2048];
    kvp_ruler_postprocess(pred, buf, sizeof(buf));
    int hit = 0;
    const char *r = refs;
    for (int i = 0; i < n_refs && *r; i++) {
        const char *nl = strchr(r, '\n');
        size_t n = nl ? (size_t)(nl - r) : strlen(r);
        hit += contains_nocase(buf, r, n);
        r += n + (nl ? 1 : 0);
    }
    return (double)hit / n_refs;
}
