/* splitmix64, xorshift64 and xoshiro256**: see rng.h. */
#include "core/rng.h"

#include <math.h>

uint64_t kvp_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

uint64_t kvp_xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

void kvp_rng_seed(struct kvp_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = kvp_splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvp_rng_next(struct kvp_rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

uint64_t kvp_rng_below(struct kvp_rng *r, uint64_t n)
{
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = kvp_rng_next(r);
    while (x >= lim);
    return x % n;
}

float kvp_rng_uniform(struct kvp_rng *r)
{
    return (float)(kvp_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

double kvp_rng_double(struct kvp_rng *r)
{
    return (double)(kvp_rng_next(r) >> 11) * 0x1p-53;
}

float kvp_rng_normal(struct kvp_rng *r)
{
    double u1 = ((double)(kvp_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(kvp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t kvp_rng_mix(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ (b * 0xD1B54A32D192ED03ULL);
    kvp_splitmix64(&x);
    return kvp_splitmix64(&x);
}
