/**
 * @file attn_rope.c
 * @brief Rotary position embedding of DeepSeek-V4: interleaved pairs, fp32 tables, YaRN on compressed layers.
 *
 * RoPE acts on the last rope_dim (64) dims of every query head, of the kv vector,
 * of the compressed kv blocks and of the indexer's queries and keys.  The dims are
 * taken as rope_dim/2 *adjacent* pairs (x[2i], x[2i+1]) = real and imaginary part
 * of a complex number, which is multiplied by e^{i pos f_i} (@ref spec_arch_attention).
 *
 * **The frequency table** is built in fp32 like the reference:
 *     f_i = 1 / fp32(base ^ fp32(2i / rope_dim)),    i = 0 .. rope_dim/2 - 1
 * On layers with a compress ratio (base compress_rope_theta = 160000) **YaRN** is
 * always on: with the correction dims
 *     corr(b) = rope_dim * ln(original_seq_len / (b * 2 pi)) / (2 ln base)
 * low = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), rope_dim-1)
 * (high += 0.001 if equal), ramp_i = clamp((i - low) / (high - low), 0, 1) and
 * smooth = 1 - ramp, the frequency becomes (f/factor)(1 - smooth) + f * smooth,
 * every operation in fp32.  For V4 this keeps f_i for i <= 15, uses f_i/16 for
 * i >= 25 and blends linearly in between.  No attention-temperature (mscale)
 * factor exists anywhere.  Ratio-0 layers use base rope_theta (10000), no YaRN.
 *
 * **The angle** is fp32(pos) * f_i rounded to fp32 (this matters at large
 * positions), and cos/sin are taken in fp32.  The rotation
 *     (a + ib)(c + is) = (ac - bs) + i(as + bc)
 * is done in fp32 and rounded to bf16; the inverse rotation used on the attention
 * output multiplies by the conjugate, i.e. the same formula with s' = -s.
 *
 * **The rounding points of the rotation** are those of the reference, which multiplies
 * complex64 tensors on the GPU, where the compiler contracts the real part into one
 * fused multiply-add:
 *     re = fp32( a c - fp32(b s) )      one fma: a c is never rounded on its own
 *     im = fp32( fp32(a s) + fp32(b c) )
 * each then rounded once to bf16.  The plain form fp32(fp32(a c) - fp32(b s)) rounds a c
 * first and gives another bf16 result for about one output in 10^5, which a model
 * amplifies into visible differences later in a sequence (docs/moe-oracle.md, "agreement
 * with other implementations").  For the imaginary part no contraction of the reference is
 * established; it keeps the three roundings.  The fma is written with C's fmaf (correctly
 * rounded on every platform) and the file is compiled as ISO C, where the compiler does not
 * contract the other expressions on its own.
 */
#include "attn_internal.h"

#include <math.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** The YaRN correction dim of @p n_rotations (double, as Python's math module computes it). */
static double yarn_correction_dim(double n_rotations, int dim, double base, int64_t original_seq_len)
{
    return (double)dim * log((double)original_seq_len / (n_rotations * 2.0 * M_PI)) /
           (2.0 * log(base));
}

void attn_rope_freqs(int rope_dim, double base, int yarn, double factor, int64_t original_seq_len,
                     double beta_fast, double beta_slow, float *freqs)
{
    const int half = rope_dim / 2;
    for (int i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)rope_dim;
        freqs[i] = 1.0f / powf((float)base, expo);
    }
    if (!yarn)
        return;
    double low = floor(yarn_correction_dim(beta_fast, rope_dim, base, original_seq_len));
    double high = ceil(yarn_correction_dim(beta_slow, rope_dim, base, original_seq_len));
    if (low < 0.0)
        low = 0.0;
    if (high > (double)(rope_dim - 1))
        high = (double)(rope_dim - 1);
    if (low == high)
        high += 0.001;
    const float lo = (float)low, span = (float)(high - low), fac = (float)factor;
    for (int i = 0; i < half; i++) {
        float ramp = ((float)i - lo) / span;
        ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
        const float smooth = 1.0f - ramp;
        const float scaled = freqs[i] / fac;
        freqs[i] = scaled * (1.0f - smooth) + freqs[i] * smooth;
    }
}

void attn_rope_freqs_for_layer(const mmoe_attn_params *p, float *freqs)
{
    if (p->compress_ratio == 0)
        attn_rope_freqs(p->rope_dim, p->rope_theta, 0, 1.0, 0, 0.0, 0.0, freqs);
    else
        attn_rope_freqs(p->rope_dim, p->compress_rope_theta, 1, p->rope_factor, p->original_seq_len,
                        p->beta_fast, p->beta_slow, freqs);
}

void attn_rope_cos_sin(const float *freqs, int half, int64_t pos, float *cos_out, float *sin_out)
{
    const float fpos = (float)pos;
    for (int i = 0; i < half; i++) {
        const float angle = fpos * freqs[i];
        cos_out[i] = cosf(angle);
        sin_out[i] = sinf(angle);
    }
}

void attn_rope_rotate_bf16(uint16_t *x, int rope_dim, const float *cos_v, const float *sin_v,
                           int inverse)
{
    for (int i = 0; i < rope_dim / 2; i++) {
        const float a = fmt_bf16_to_f32(x[2 * i]), b = fmt_bf16_to_f32(x[2 * i + 1]);
        const float c = cos_v[i], s = inverse ? -sin_v[i] : sin_v[i];
        const float bs = b * s, as = a * s, bc = b * c;
        const float re = fmaf(a, c, -bs);
        const float im = as + bc;
        x[2 * i] = mmoe_bf16_from_f32(re);
        x[2 * i + 1] = mmoe_bf16_from_f32(im);
    }
}
