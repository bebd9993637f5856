/*
 * The library's one random-number module: splitmix64 (Steele, Lea and Flood) for seeding and for
 * single-word streams, xorshift64 for the benchmark's token ids, and xoshiro256** (Blackman and
 * Vigna) seeded through splitmix64 for long streams. Every seeded choice in kvpred (the sampler,
 * the random policy, the trainer, the predictor's sample picks, the retrieval tasks,
 * tokenizer-less fixtures, the benchmark) draws from here, so a
 * stream is the same bits wherever it is used; tests and committed outputs depend on that.
 */
#ifndef KVP_CORE_RNG_H
#define KVP_CORE_RNG_H

#include <stdint.h>

/* splitmix64: advances *state by the golden-ratio increment and returns the mixed word. */
uint64_t kvp_splitmix64(uint64_t *state);

/* xorshift64 (Marsaglia; shifts 13, 7, 17): a cheap single-word stream; *state must not be 0. */
uint64_t kvp_xorshift64(uint64_t *state);

/* xoshiro256** seeded through splitmix64; the whole state is 4 words so checkpoints store it. */
struct kvp_rng {
    uint64_t s[4];
};

void kvp_rng_seed(struct kvp_rng *r, uint64_t seed);
uint64_t kvp_rng_next(struct kvp_rng *r);
/* Uniform in [0, n); n > 0 (rejection sampling: no modulo bias). */
uint64_t kvp_rng_below(struct kvp_rng *r, uint64_t n);
/* Uniform float in [0, 1) from the top 24 bits. */
float kvp_rng_uniform(struct kvp_rng *r);
/* Uniform double in [0, 1) from the top 53 bits. */
double kvp_rng_double(struct kvp_rng *r);
/* Standard normal by Box–Muller; each call consumes exactly two draws and returns one value, so
 * the stream position is easy to reason about. */
float kvp_rng_normal(struct kvp_rng *r);
/* Mix two 64-bit values into one seed (splitmix64 of a combination); used to derive per-sample
 * seeds from (run seed, step, index). */
uint64_t kvp_rng_mix(uint64_t a, uint64_t b);

#endif
