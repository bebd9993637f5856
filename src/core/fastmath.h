/*
 * Elementwise math written so that the compiler vectorizes the loops that call it (no calls into
 * libm, no branches): Gemma 2's GELU and score soft-capping call tanh once per feed-forward
 * activation and once per attention score, and glibc's tanhf (through expm1f) took about 5 % of
 * Gemma-2-2B's decode time (perf, Q4_K, 2 threads) before this.
 */
#ifndef KVP_CORE_FASTMATH_H
#define KVP_CORE_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* tanh(y) as 1 - 2 / (e^{2y} + 1), e^x from Cody-Waite range reduction (x = n ln2 + r, |r| <=
 * ln2 / 2) and a degree-7 polynomial for e^r (relative error about 2e-7, Cephes's expf
 * coefficients), 2^n put together from its exponent bits. |y| is clamped at 9, where tanh is
 * 1 to float precision. The absolute error is below 3e-7 everywhere (tests/test_kernels.c:
 * test_tanh_fast measures it against double tanh); near 0, where tanh(y) ~ y, that is an
 * absolute, not a relative, error, which is what GELU's 1 + tanh and a soft-capped score need. */
static inline float kvp_tanh_fast(float y)
{
    const float a = y > 9.0f ? 9.0f : (y < -9.0f ? -9.0f : y);
    const float x = 2.0f * a;
    /* n = round(x / ln2): adding and taking away 1.5 * 2^23 rounds to the nearest integer */
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* n is within [-26, 26] for every number; a NaN (which stays NaN through p) is kept away
     * from the conversion, where it would be undefined */
    const float nn = n >= -126.0f ? n : -126.0f;
    const int32_t bits = ((int32_t)nn + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return 1.0f - 2.0f / (p * scale + 1.0f);
}

#endif
