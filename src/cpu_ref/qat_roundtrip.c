/**
 * @file qat_roundtrip.c
 * @brief The in-place FP8 and FP4 round trips by which the reference simulates quantization-aware training.
 *
 * Some bf16 tensors of the V4 forward are pushed through a narrow format and back,
 * so that the model sees the values a quantized cache or kernel would hold; the
 * tensor stays bf16 (@ref spec_arch_linear, "In-place round trips"):
 *
 * - FP8 (`act_quant(..., inplace)`): per block, s = 2^ceil(log2(max(amax, 1e-4)/448))
 *   (UE8M0, mmoe_formats.h's ::MMOE_SF_RULE_V4), x <- bf16(e4m3(clamp(x/s, +-448)) * s).
 *   Used on the nope dims of every kv vector (block 64).
 * - FP4 (`fp4_act_quant`, block 32): s = 2^ceil(log2(max(amax, 6*2^-126)/6)),
 *   x <- bf16(e2m1(clamp(x/s, +-6)) * s) with the hardware rounding (nearest, ties to
 *   the even code, saturating).  Used on the indexer's queries and keys.
 *
 * Both products are exact in fp32 (a power-of-two scale), so the only roundings are
 * the narrow format's and the final bf16 one (exact too for any realistic scale).
 */
#include "attn_internal.h"

#include <math.h>
#include <stdlib.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

void mmoe_roundtrip_fp8_bf16(uint16_t *x, int64_t n, int block)
{
    float vals[256];
    uint8_t codes[256], sf;
    const float *e4m3 = mmoe_fp8_e4m3_table();
    for (int64_t b0 = 0; b0 + block <= n; b0 += block) {
        for (int i = 0; i < block; i++)
            vals[i] = fmt_bf16_to_f32(x[b0 + i]);
        /* block <= 256 and a whole block: the quantizer cannot fail */
        (void)mmoe_quant_row_fp8_ue8m0(vals, (size_t)block, (size_t)block, MMOE_SF_RULE_V4, codes,
                                       &sf, NULL);
        const float s = fmt_ue8m0_to_f32(sf);
        for (int i = 0; i < block; i++)
            x[b0 + i] = mmoe_bf16_from_f32(e4m3[codes[i]] * s);
    }
}

void mmoe_roundtrip_fp4_bf16(uint16_t *x, int64_t n, int block)
{
    for (int64_t b0 = 0; b0 + block <= n; b0 += block) {
        float amax = 0.0f;
        for (int i = 0; i < block; i++) {
            const float a = fabsf(fmt_bf16_to_f32(x[b0 + i]));
            if (a > amax)
                amax = a;
        }
        const float s = fmt_ue8m0_to_f32(mmoe_sf_ue8m0_v4_fp4(amax));
        for (int i = 0; i < block; i++) {
            float v = fmt_bf16_to_f32(x[b0 + i]) / s;
            v = v > MMOE_FP4_E2M1_MAX ? MMOE_FP4_E2M1_MAX : (v < -MMOE_FP4_E2M1_MAX ? -MMOE_FP4_E2M1_MAX : v);
            x[b0 + i] = mmoe_bf16_from_f32(mmoe_fp4_e2m1_to_f32(mmoe_fp4_e2m1_from_f32(v)) * s);
        }
    }
}
