/**
 * @file attn_out_proj.c
 * @brief The grouped low-rank output projection of V4 attention: wo_a per head group, then wo_b.
 *
 * The attention output o has H heads of d = 512 values (64 x 512 = 32768 for
 * Flash), too wide for one dense D x (H d) matrix.  V4 splits the heads into G
 * groups of H/G consecutive heads (8 heads, 4096 values per group in Flash and
 * Pro) and projects each group to a rank-o_lora latent with its own matrix:
 *
 *     z[g, r] = bf16( sum_c o[g, c] * wo_a[g*o_lora + r, c] ),   o[g] = heads g*H/G .. (g+1)*H/G - 1
 *
 * (wo_a bf16 [G*o_lora, H*d/G], viewed as [G, o_lora, H*d/G]; bf16 inputs, fp32
 * accumulation -- here exact-product double accumulation, see linear_dense.c).  The
 * latents are flattened group-major (index g*o_lora + r) and mixed back to the
 * model width by the FP8 linear out = wo_b(z) (G*o_lora -> D).
 *
 * The published checkpoint stores wo_a as FP8 with 128x128 scales; the reference's
 * convert.py dequantizes it to bf16, exactly.  Both forms are accepted: an F8 wo_a
 * is dequantized row by row on use (attn_dense_rows()).
 */
#include "attn_internal.h"

#include <stdlib.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

mmoe_status attn_out_proj(moe_dequant_pool *pool, const mmoe_attn_params *p, const mmoe_attn_weights *w,
                          const uint16_t *o, int64_t T, uint16_t *z, uint16_t *out, mmoe_error *err)
{
    const int64_t G = p->o_groups, R = p->o_lora_rank;
    const int64_t hd = (int64_t)p->n_heads * p->head_dim, group_width = hd / G;
    double *od = malloc(sizeof(double) * (size_t)(T * hd));
    float *zf = malloc(sizeof(float) * (size_t)(T * G * R));
    mmoe_status st = MMOE_OK;
    if (od == NULL || zf == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "attention output projection: out of memory (T=%lld)",
                            (long long)T);
        goto done;
    }
    for (int64_t i = 0; i < T * hd; i++)
        od[i] = (double)fmt_bf16_to_f32(o[i]);
    for (int64_t g = 0; g < G; g++) {
        st = attn_dense_rows(pool, od + g * group_width, T, hd, group_width, &w->wo_a, &w->wo_a_scale,
                             p->weight_block, g * R, R, zf + g * R, G * R, err);
        if (st != MMOE_OK)
            goto done;
    }
    mmoe_bf16_from_f32_row(zf, (size_t)(T * G * R), z);
    st = attn_linear_fp8(pool, moe_dot_isa_best(), z, T, &w->wo_b, &w->wo_b_scale, p->weight_block, out, err);
    if (st != MMOE_OK)
        mmoe_error_prefix(err, "attention wo_b: ");
done:
    free(od);
    free(zf);
    return st;
}
