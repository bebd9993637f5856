/*
 * RoPE frequencies (see rope.h).
 *
 * YaRN as llama.cpp's GGUF keys define it (rope.scaling.type "yarn", factor s,
 * original_context_length L, attn_factor a; beta_fast 32 and beta_slow 1 unless the file says
 * otherwise): pair i of d rotary dimensions turns r_i = L · base^(-2i/d) / 2π times over the
 * original context. Pairs that turn more than beta_fast times keep their angle (they already
 * resolve positions locally), pairs that turn fewer than beta_slow times are interpolated (angle
 * / s), and a linear ramp in i between the two pair indices mixes them. The pair index where
 * r_i = β is d · ln(L / (2π β)) / (2 ln base); the ramp runs from its floor at beta_fast to its
 * ceiling at beta_slow, clamped to [0, d - 1]. Softmax logits are sharpened by scaling both q
 * and k by a · (1 + 0.1 ln s), applied to cos and sin.
 */
#include "model/rope.h"

#include <math.h>

static double yarn_pair(int d, int n_ctx_orig, double beta, double base)
{
    return d * log(n_ctx_orig / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

void kvp_rope_freqs(const struct kvp_model *m, int n_ctx, bool local, double *inv_freq,
                    double *mscale)
{
    const struct kvp_hparams *hp = &m->hp;
    if (local) {
        for (int i = 0; i < hp->head_dim / 2; i++)
            inv_freq[i] = pow((double)hp->rope_base_local, -2.0 * i / hp->head_dim);
        *mscale = 1.0;
        return;
    }
    /* LongRoPE: the long factors once the context exceeds the original one, as llama.cpp picks
     * them (by the context's size, not the position), cos and sin times attn_factor */
    const float *factors = m->rope_freqs;
    if (m->rope_factors_short) {
        factors = n_ctx > hp->n_ctx_orig ? m->rope_factors_long : m->rope_factors_short;
        *mscale = hp->rope_attn_factor;
    }
    const int d = hp->head_dim;
    double lo = 0, hi = 0;
    const bool yarn = hp->rope_scaling == KVP_ROPE_SCALING_YARN;
    if (!m->rope_factors_short)
        *mscale = 1.0;
    if (yarn) {
        lo = floor(yarn_pair(d, hp->n_ctx_orig, hp->yarn_beta_fast, hp->rope_base));
        hi = ceil(yarn_pair(d, hp->n_ctx_orig, hp->yarn_beta_slow, hp->rope_base));
        lo = lo > 0 ? lo : 0;
        hi = hi < d - 1 ? hi : d - 1;
        *mscale = hp->rope_attn_factor * (1.0 + 0.1 * log(1.0 / hp->rope_freq_scale));
    }
    for (int i = 0; i < d / 2; i++) {
        double base_freq = pow((double)hp->rope_base, -2.0 * i / d);
        double scale = hp->rope_freq_scale;
        if (yarn) {
            double span = hi - lo > 0.001 ? hi - lo : 0.001;
            double t = (i - lo) / span;
            double keep = 1.0 - (t < 0 ? 0 : t > 1 ? 1 : t); /* 1: unscaled, 0: interpolated */
            scale = hp->rope_freq_scale * (1.0 - keep) + keep;
        }
        inv_freq[i] = base_freq * scale;
        if (factors)
            inv_freq[i] /= factors[i];
    }
}
