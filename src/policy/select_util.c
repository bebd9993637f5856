/* Helpers shared by the policy files: budgets, masks, top-k and GQA aggregation (policy.h). */
#include <stdlib.h>
#include <string.h>

#include "policy/policy.h"

int kvp_policy_budget(const struct kvp_policy *p, int n_tokens)
{
    int b;
    if (p->p.budget > 0)
        b = p->p.budget;
    else if (p->p.budget_ratio > 0)
        b = (int)(p->p.budget_ratio * (float)n_tokens);
    else
        b = n_tokens;
    int floor = p->p.sink + p->p.local;
    return b < floor ? floor : b;
}

void kvp_sel_all(struct kvp_sel *sel, int n_tokens, int block_size)
{
    int nb = (n_tokens + block_size - 1) / block_size;
    for (int b = 0; b < nb; b++) {
        sel->blocks[b] = b;
        sel->mask[b] = ~0ULL;
    }
    sel->n = nb;
}

void kvp_mask_add_range(uint64_t *masks, int begin, int end, int block_size)
{
    if (begin < 0)
        begin = 0;
    for (int t = begin; t < end; t++)
        masks[t / block_size] |= 1ULL << (t % block_size);
}

void kvp_sel_from_masks(struct kvp_sel *sel, const uint64_t *masks, int n_blocks)
{
    int n = 0;
    for (int b = 0; b < n_blocks; b++)
        if (masks[b]) {
            sel->blocks[n] = b;
            sel->mask[n] = masks[b];
            n++;
        }
    sel->n = n;
}

/* heap of indices ordered so the root is the weakest kept element: smallest value, and among
 * equal values the highest index (ties go to the lower index) */
static int weaker(const float *x, int a, int b)
{
    return x[a] < x[b] || (x[a] == x[b] && a > b);
}

static void sift_down(const float *x, int *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && weaker(x, h[l], h[m]))
            m = l;
        if (r < n && weaker(x, h[r], h[m]))
            m = r;
        if (m == i)
            return;
        int t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

void kvp_topk_indices(const float *x, int n, int k, int *out, int *scratch)
{
    if (k > n)
        k = n;
    if (k <= 0)
        return;
    int *h = scratch;
    for (int i = 0; i < k; i++)
        h[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(x, h, k, i);
    for (int i = k; i < n; i++)
        if (weaker(x, h[0], i)) {
            h[0] = i;
            sift_down(x, h, k, 0);
        }
    memcpy(out, h, (size_t)k * sizeof(int));
    qsort(out, (size_t)k, sizeof(int), cmp_int);
}

void kvp_gqa_combine(const float *rows, int g, int stride, int n, int agg, float *out)
{
    memcpy(out, rows, (size_t)n * sizeof(float));
    for (int j = 1; j < g; j++) {
        const float *r = rows + (size_t)j * stride;
        if (agg == KVP_AGG_MAX)
            for (int i = 0; i < n; i++)
                out[i] = r[i] > out[i] ? r[i] : out[i];
        else
            for (int i = 0; i < n; i++)
                out[i] += r[i];
    }
    if (agg == KVP_AGG_MEAN && g > 1)
        for (int i = 0; i < n; i++)
            out[i] /= (float)g;
}
