/**
 * @file moe_pad.c
 * @brief Padding the intermediate width: zero weights, unit scales, one new buffer per tensor.
 *
 * Some kernels need the intermediate width I to be a multiple of a tile width P (the old
 * "512 rule": DeepSeek-V4.1's I = 2304 was padded to 2560).  Padding appends
 *  - zero rows to W1 and W3 ([I, D] -> [Ip, D]) with unit scales (UE8M0 byte 127 = 1.0),
 *  - zero columns to W2 ([D, I] -> [D, Ip]) with unit scales,
 * and pads the shared expert to the routed width the same way (each of the S shared experts
 * separately, so that S * Ip stays a multiple of Ip).
 *
 * Why the output does not change, bit for bit: a padded gate/up channel has L1 = 0 exactly,
 * so g = u = 0, silu(0) * 0 = 0, and its requantization group (32 or 128 channels, never
 * straddling the boundary because I is a multiple of 128) has amax 0 and codes 0; in L2 those
 * zero activations meet zero weights, and the GEMM's fixed 128-wide K chunks
 * (moe_expert_gemm.c) add exact zeros after the real chunks.
 *
 * Memory: each tensor that grows is written once into a new buffer of the padded size; if
 * the layer owned the old buffer it is freed at once, and a borrowed view is simply dropped.
 * The peak is therefore the final size plus one tensor, never two copies of the layer (the
 * implementation this mirrors kept both, +1.87 GiB per GPU).  The layer reports owned bytes
 * at the peak and at the end.
 */
#include "moe_internal.h"

#include <stdlib.h>
#include <string.h>

/** Map index i of an extent of n split into g equal groups onto the padded extent np. */
static int64_t map_grouped(int64_t i, int64_t n, int64_t np, int g)
{
    const int64_t gs = n / g, gsp = np / g;
    return (i / gs) * gsp + i % gs;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static mmoe_status pad_weights(mmoe_moe_layer *layer, moe_mat *m, int64_t nr, int64_t nc, int rg, int cg,
                               mmoe_error *err)
{
    const size_t esize = m->fmt == MOE_W_BF16 ? 2 : 1;
    /* bytes per row of w: FP4 packs two codes per byte */
    const int64_t old_rb = m->fmt == MOE_W_FP4 ? m->cols / 2 : m->cols * (int64_t)esize;
    const int64_t new_rb = m->fmt == MOE_W_FP4 ? nc / 2 : nc * (int64_t)esize;
    const size_t bytes = (size_t)nr * (size_t)new_rb;
    uint8_t *w = calloc(bytes > 0 ? bytes : 1, 1);
    if (w == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe pad: out of memory for a padded weight (%zu bytes)", bytes);
    moe_layer_account(layer, (long long)bytes);
    for (int64_t r = 0; r < m->rows; r++) {
        const int64_t r2 = map_grouped(r, m->rows, nr, rg);
        if (cg == 1) {
            memcpy(w + r2 * new_rb, m->w + r * old_rb, (size_t)old_rb);
        } else {
            /* column groups (shared W2): each group's columns move to its padded place */
            const int64_t gc = m->cols / cg, gcp = nc / cg;
            for (int g = 0; g < cg; g++)
                memcpy(w + r2 * new_rb + g * gcp * (int64_t)esize, m->w + r * old_rb + g * gc * (int64_t)esize,
                       (size_t)(gc * (int64_t)esize));
        }
    }
    if (m->w_owned != NULL) {
        free(m->w_owned);
        moe_layer_account(layer, -(long long)m->w_bytes);
    }
    m->w = w;
    m->w_owned = w;
    m->w_bytes = bytes;
    return MMOE_OK;
}

static mmoe_status pad_scales(mmoe_moe_layer *layer, moe_mat *m, int64_t nr, int64_t nc, int rg, int cg,
                              mmoe_error *err)
{
    const int64_t sr = ceil_div(nr, m->block_n), sc = ceil_div(nc, m->block_k);
    const size_t esize = m->sf_f32 ? 4 : 1;
    const size_t bytes = (size_t)sr * (size_t)sc * esize;
    void *sf = malloc(bytes > 0 ? bytes : 1);
    if (sf == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "moe pad: out of memory for padded scales (%zu bytes)", bytes);
    moe_layer_account(layer, (long long)bytes);
    for (int64_t i = 0; i < sr * sc; i++) {
        if (m->sf_f32)
            ((float *)sf)[i] = 1.0f;
        else
            ((uint8_t *)sf)[i] = 127; /* unit scale */
    }
    for (int64_t br = 0; br < m->sf_rows; br++) {
        const int64_t br2 = rg == 1 ? br : map_grouped(br, m->sf_rows, sr, rg);
        for (int64_t bc = 0; bc < m->sf_cols; bc++) {
            const int64_t bc2 = cg == 1 ? bc : map_grouped(bc, m->sf_cols, sc, cg);
            memcpy((uint8_t *)sf + (size_t)(br2 * sc + bc2) * esize,
                   (const uint8_t *)m->sf + (size_t)(br * m->sf_cols + bc) * esize, esize);
        }
    }
    if (m->sf_owned != NULL) {
        free(m->sf_owned);
        moe_layer_account(layer, -(long long)m->sf_bytes);
    }
    m->sf = sf;
    m->sf_owned = sf;
    m->sf_bytes = bytes;
    m->sf_rows = sr;
    m->sf_cols = sc;
    return MMOE_OK;
}

mmoe_status moe_pad_mat(mmoe_moe_layer *layer, moe_mat *m, int64_t new_rows, int64_t new_cols, int row_groups,
                        int col_groups, mmoe_error *err)
{
    if (new_rows == m->rows && new_cols == m->cols)
        return MMOE_OK;
    /* grouped padding must keep each group's scale blocks whole */
    if (m->fmt != MOE_W_BF16 && ((row_groups > 1 && (m->rows / row_groups) % m->block_n != 0) ||
                                 (col_groups > 1 && (m->cols / col_groups) % m->block_k != 0)))
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "moe pad: the width of one shared expert is not a multiple of the scale block %lld",
                              (long long)m->block_k);
    mmoe_status st = pad_weights(layer, m, new_rows, new_cols, row_groups, col_groups, err);
    if (st == MMOE_OK && m->fmt != MOE_W_BF16)
        st = pad_scales(layer, m, new_rows, new_cols, row_groups, col_groups, err);
    if (st != MMOE_OK)
        return st;
    m->rows = new_rows;
    m->cols = new_cols;
    return MMOE_OK;
}

static int64_t round_up(int64_t x, int64_t a)
{
    return (x + a - 1) / a * a;
}

mmoe_status mmoe_moe_layer_pad(mmoe_moe_layer *layer, int64_t pad_to, mmoe_error *err)
{
    if (layer == NULL || !layer->has_weights)
        return mmoe_error_set(err, MMOE_EINVAL, "moe pad: the layer has no weights yet");
    if (pad_to < 0 || pad_to % 128 != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "moe pad: pad_to %lld must be 0 or a multiple of 128",
                              (long long)pad_to);
    if (pad_to == 0)
        return MMOE_OK;
    const mmoe_moe_desc *d = &layer->desc;
    const int64_t ip = round_up(layer->inter_used, pad_to);
    mmoe_status st = MMOE_OK;
    for (int64_t e = 0; e < d->n_experts && st == MMOE_OK; e++) {
        moe_expert *x = &layer->experts[e];
        st = moe_pad_mat(layer, &x->w1, ip, x->w1.cols, 1, 1, err);
        if (st == MMOE_OK)
            st = moe_pad_mat(layer, &x->w3, ip, x->w3.cols, 1, 1, err);
        if (st == MMOE_OK)
            st = moe_pad_mat(layer, &x->w2, x->w2.rows, ip, 1, 1, err);
    }
    if (st != MMOE_OK)
        return st;
    layer->inter_used = ip;
    if (d->n_shared > 0) {
        /* the shared expert follows the routed width when it had the routed width */
        const int64_t sp = d->shared_inter == d->inter ? ip : round_up(layer->shared_inter_used, pad_to);
        const int64_t wp = (int64_t)d->n_shared * sp;
        moe_expert *s = &layer->shared;
        st = moe_pad_mat(layer, &s->w1, wp, s->w1.cols, d->n_shared, 1, err);
        if (st == MMOE_OK)
            st = moe_pad_mat(layer, &s->w3, wp, s->w3.cols, d->n_shared, 1, err);
        if (st == MMOE_OK)
            st = moe_pad_mat(layer, &s->w2, s->w2.rows, wp, 1, d->n_shared, err);
        if (st != MMOE_OK)
            return st;
        layer->shared_inter_used = sp;
    }
    return moe_shared_expand(layer, err);
}
