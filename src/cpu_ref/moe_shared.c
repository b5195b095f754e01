/**
 * @file moe_shared.c
 * @brief The shared expert: fused as one more combine slot, or serial; the conditions under
 *        which fusion is impossible, and the exact 1x32 expansion of its block scales.
 *
 * ## Fused
 * The fused kernel treats the shared expert as one more task per token: its L1 reads the
 * same FP8 activations as the routed experts (the recipe's x format), its epilogue is the
 * routed one with weight 1.0, and its BF16 output is combine slot `topk`, added last.  The
 * kernel's MMA wants 1x32 UE8M0 weight scales, so the checkpoint's B x B block scales
 * (B = 128 for V4, 32 for V4.1) are *expanded*: scale(r, g) = block(r / B, 32 g / B).  Every
 * weight keeps its real value (the expansion repeats a power of two), which the oracle shows
 * by running the fused path on the expanded copy (moe_shared_expand()).
 *
 * ## Serial
 * DeepSeek's plain FP8 linear, per-128 activation scales (moe_recipe.c), on the checkpoint
 * block scales; its BF16 output joins the combine at the same place (last).  So fused and
 * serial differ only in the shared expert's activation quantization and epilogue; the tests
 * bound the difference.
 *
 * ## When fusion is impossible (checked in this order; the first reason is reported)
 *  1. shared_mode = serial: the caller asked for it;
 *  2. topk + 1 > 32: the combine's slot mask is one 32-bit ballot;
 *  3. the shared weights are not F8_E4M3 (e.g. BF16): the MMA kind is FP8;
 *  4. the scale block B is not a multiple of 32: a 1x32 group would straddle two blocks;
 *  5. an F32 block scale is not a power of two: it has no UE8M0 form;
 *  6. the shared width S * I_s is not a multiple of the routed width I (after padding):
 *     shared tasks reuse the routed N-tiling (e.g. I_s = 2304 with the routed experts padded to
 *     2560; padding the shared expert too, as pad_to does, restores fusion).
 * In auto mode the layer then runs the serial path and records the reason; in fused mode
 * the call fails with MMOE_EUNSUPPORTED and the same reason.  Nothing falls back silently.
 */
#include "moe_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"

int mmoe_moe_scale_ue8m0_byte(const mmoe_tensor *sc, int64_t i)
{
    if (sc->dtype != MMOE_DT_F32)
        return ((const uint8_t *)sc->data)[i];
    float f;
    uint32_t u;
    memcpy(&f, (const uint8_t *)sc->data + 4 * i, sizeof f);
    memcpy(&u, &f, sizeof u);
    if (u == 0x00400000u) /* 2^-127, the one subnormal with a UE8M0 byte */
        return 0;
    const uint32_t e = u >> 23; /* the sign bit makes e > 255 */
    return (u & 0x007FFFFFu) == 0 && e >= 1 && e <= 254 ? (int)e : -1;
}

/** 1 when every scale of @p sc has an exact UE8M0 byte. */
static int scales_ue8m0(const mmoe_tensor *sc)
{
    const int64_t n = mmoe_tensor_numel(sc);
    for (int64_t i = 0; i < n; i++)
        if (mmoe_moe_scale_ue8m0_byte(sc, i) < 0)
            return 0;
    return 1;
}

void mmoe_moe_shared_facts_of(const mmoe_moe_expert_weights *shared, int64_t inter_used, int64_t width_used,
                              mmoe_moe_shared_facts *f)
{
    const mmoe_tensor *w[3] = {&shared->w1, &shared->w3, &shared->w2};
    f->dtype = MMOE_DT_F8_E4M3;
    for (int i = 2; i >= 0; i--)
        if (w[i]->dtype != MMOE_DT_F8_E4M3)
            f->dtype = w[i]->dtype;
    f->scales_ue8m0 = scales_ue8m0(&shared->w1_scale) && scales_ue8m0(&shared->w3_scale) &&
                      scales_ue8m0(&shared->w2_scale);
    f->width_used = width_used;
    f->inter_used = inter_used;
}

mmoe_moe_path mmoe_moe_shared_plan(const mmoe_moe_desc *d, const mmoe_moe_shared_facts *f,
                                   mmoe_moe_fallback *fallback, char *reason)
{
    char buf[MMOE_MOE_REASON_LEN] = "";
    mmoe_moe_fallback fb = MMOE_FALLBACK_NONE;
    if (d->n_shared == 0) {
        /* nothing to fuse */
    } else if (d->shared_mode == MMOE_SHARED_SERIAL) {
        fb = MMOE_FALLBACK_REQUESTED;
        snprintf(buf, sizeof buf, "serial shared expert requested (--shared serial)");
    } else if (d->topk + 1 > 32) {
        fb = MMOE_FALLBACK_TOPK_LIMIT;
        snprintf(buf, sizeof buf, "topk %d + 1 shared slot > 32 combine slots", d->topk);
    } else if (f->dtype != MMOE_DT_F8_E4M3) {
        fb = MMOE_FALLBACK_SHARED_DTYPE;
        snprintf(buf, sizeof buf, "shared weights are %s, the fused MMA needs F8_E4M3", mmoe_dtype_name(f->dtype));
    } else if (d->shared_block <= 0 || d->shared_block % 32 != 0) {
        fb = MMOE_FALLBACK_SCALE_BLOCK;
        snprintf(buf, sizeof buf, "shared scale block %d is not a multiple of 32 (no 1x32 expansion)",
                 d->shared_block);
    } else if (!f->scales_ue8m0) {
        fb = MMOE_FALLBACK_SCALE_NOT_POW2;
        snprintf(buf, sizeof buf, "an F32 shared scale is not a power of two (no UE8M0 form)");
    } else if (f->inter_used <= 0 || f->width_used % f->inter_used != 0) {
        fb = MMOE_FALLBACK_SHARED_WIDTH;
        snprintf(buf, sizeof buf,
                 "shared width %lld is not a multiple of the routed width %lld (pad the shared expert too)",
                 (long long)f->width_used, (long long)f->inter_used);
    }
    if (fallback)
        *fallback = fb;
    if (reason)
        memcpy(reason, buf, sizeof buf);
    if (d->n_shared == 0)
        return MMOE_PATH_NONE;
    return fb == MMOE_FALLBACK_NONE ? MMOE_PATH_FUSED : MMOE_PATH_SERIAL;
}

mmoe_moe_path moe_shared_decide(const mmoe_moe_layer *layer, mmoe_moe_fallback *fb, char *reason)
{
    const mmoe_moe_desc *d = &layer->desc;
    if (d->n_shared == 0 || !layer->has_weights || layer->inter_used <= 0) {
        if (fb)
            *fb = MMOE_FALLBACK_NONE;
        if (reason)
            reason[0] = '\0';
        return MMOE_PATH_NONE;
    }
    mmoe_moe_shared_facts f = layer->shared_facts;
    f.inter_used = layer->inter_used;
    f.width_used = (int64_t)d->n_shared * layer->shared_inter_used;
    return mmoe_moe_shared_plan(d, &f, fb, reason);
}

/** The UE8M0 byte of block scale (br, bc) of @p m. */
static uint8_t block_byte(const moe_mat *m, int64_t br, int64_t bc)
{
    int64_t i = br * m->sf_cols + bc;
    if (m->sf_f32)
        return mmoe_ue8m0_from_f32_trunc(((const float *)m->sf)[i]); /* exact: a power of two */
    return ((const uint8_t *)m->sf)[i];
}

/** Expand the block scales of @p src to 1x32 UE8M0 bytes in @p dst (weights shared). */
static mmoe_status expand_one(mmoe_moe_layer *layer, const moe_mat *src, moe_mat *dst, mmoe_error *err)
{
    const int64_t groups = src->cols / 32;
    size_t bytes = (size_t)src->rows * (size_t)groups;
    uint8_t *sf = malloc(bytes > 0 ? bytes : 1);
    if (sf == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe: out of memory expanding the shared scales (%zu bytes)", bytes);
    for (int64_t r = 0; r < src->rows; r++)
        for (int64_t g = 0; g < groups; g++)
            sf[r * groups + g] = block_byte(src, r / src->block_n, (32 * g) / src->block_k);
    memset(dst, 0, sizeof *dst);
    dst->fmt = MOE_W_FP8;
    dst->rows = src->rows;
    dst->cols = src->cols;
    dst->w = src->w; /* the weights are shared with the checkpoint-layout matrix */
    dst->w_bytes = 0;
    dst->sf = sf;
    dst->sf_owned = sf;
    dst->sf_bytes = bytes;
    dst->block_n = 1;
    dst->block_k = 32;
    dst->sf_rows = src->rows;
    dst->sf_cols = groups;
    moe_layer_account(layer, (long long)bytes);
    return MMOE_OK;
}

/** Free the expanded scales. */
static void release_expanded(mmoe_moe_layer *layer)
{
    moe_mat *m[3] = {&layer->shared_fused_w1, &layer->shared_fused_w3, &layer->shared_fused_w2};
    for (int i = 0; i < 3; i++) {
        if (m[i]->sf_owned != NULL)
            moe_layer_account(layer, -(long long)m[i]->sf_bytes);
        moe_mat_release(m[i]);
    }
    layer->shared_fused_ready = 0;
}

mmoe_status moe_shared_expand(mmoe_moe_layer *layer, mmoe_error *err)
{
    release_expanded(layer);
    if (moe_shared_decide(layer, NULL, NULL) != MMOE_PATH_FUSED)
        return MMOE_OK;
    mmoe_status st;
    if ((st = expand_one(layer, &layer->shared.w1, &layer->shared_fused_w1, err)) != MMOE_OK ||
        (st = expand_one(layer, &layer->shared.w3, &layer->shared_fused_w3, err)) != MMOE_OK ||
        (st = expand_one(layer, &layer->shared.w2, &layer->shared_fused_w2, err)) != MMOE_OK) {
        release_expanded(layer);
        return st;
    }
    layer->shared_fused_ready = 1;
    return MMOE_OK;
}

void moe_shared_release(mmoe_moe_layer *layer)
{
    release_expanded(layer);
}
