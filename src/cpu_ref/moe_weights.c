/**
 * @file moe_weights.c
 * @brief Checking the weight views of a layer before anything uses them, and wrapping them as
 *        ::moe_mat matrices.
 *
 * Every tensor is checked against the description: dtype, shape, and the values that would
 * poison the output (a UE8M0 scale byte 255 is NaN; an F32 scale must be finite and > 0; a
 * tid2eid entry must name an expert).  The messages use the checkpoint names
 * (`ffn.experts.3.w1.scale`) so that a user can find the tensor in the file.
 *
 * Accepted dtypes (checkpoints differ in how they tag raw bytes):
 *  - routed weights: I8 or U8 (two FP4 codes per byte); their scales F8_E8M0 or U8;
 *  - shared weights: F8_E4M3 (fused or serial) or BF16 (serial only: a fallback reason);
 *    their block scales F8_E8M0, U8 or F32;
 *  - gate BF16 [E, D]; bias F32 [E]; tid2eid I32 or I64 [vocab, topk].
 */
#include "moe_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/** Present, 2-D and [r, c]? */
static mmoe_status expect_shape2(const mmoe_tensor *t, const char *name, int64_t r, int64_t c, mmoe_error *err)
{
    if (t->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "moe weights: tensor '%s' is missing", name);
    if (t->ndim != 2 || t->shape[0] != r || t->shape[1] != c) {
        char found[96];
        mmoe_shape_str(t->ndim, t->shape, found, sizeof found);
        return mmoe_error_set(err, MMOE_ESHAPE, "moe weights: tensor '%s': expected shape [%lld, %lld], found %s",
                              name, (long long)r, (long long)c, found);
    }
    return MMOE_OK;
}

/**
 * The oracle reads weights in place through typed pointers (float, uint16_t, int64_t), so
 * each tensor must start at a multiple of its element size.  The safetensors format does not
 * require that (megamoe's writer aligns every tensor; other writers may not): a misaligned
 * tensor is refused with its name rather than read through a misaligned pointer.
 */
static mmoe_status expect_aligned(const mmoe_tensor *t, const char *name, mmoe_error *err)
{
    size_t align = mmoe_dtype_size(t->dtype);
    if (t->data != NULL && align > 1 && (uintptr_t)t->data % align != 0)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "moe weights: tensor '%s' (%s) is not aligned to %zu bytes in its file; "
                              "rewrite the file with an aligning writer (e.g. megamoe's)",
                              name, mmoe_dtype_name(t->dtype), align);
    return MMOE_OK;
}

/** The dtype of @p t is one of @p ok (and the tensor is aligned for it). */
static mmoe_status expect_dtype(const mmoe_tensor *t, const char *name, const mmoe_dtype *ok, int n_ok,
                                mmoe_error *err)
{
    char want[128] = "";
    for (int i = 0; i < n_ok; i++) {
        if (t->dtype == ok[i])
            return expect_aligned(t, name, err);
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? " or " : "",
                 mmoe_dtype_name(ok[i]));
    }
    return mmoe_error_set(err, MMOE_EDTYPE, "moe weights: tensor '%s': expected dtype %s, found %s", name, want,
                          mmoe_dtype_name(t->dtype));
}

/** No UE8M0 byte 255; F32 scales finite and positive. */
static mmoe_status check_scales(const mmoe_tensor *t, const char *name, mmoe_error *err)
{
    int64_t n = mmoe_tensor_numel(t);
    if (t->dtype == MMOE_DT_F32) {
        const float *f = t->data;
        for (int64_t i = 0; i < n; i++)
            if (!(f[i] > 0.0f) || isinf(f[i]))
                return mmoe_error_set(err, MMOE_ERANGE,
                                      "moe weights: tensor '%s': scale #%lld is %g (expected finite and > 0)",
                                      name, (long long)i, (double)f[i]);
        return MMOE_OK;
    }
    const uint8_t *b = t->data;
    for (int64_t i = 0; i < n; i++)
        if (b[i] == 255)
            return mmoe_error_set(err, MMOE_ERANGE,
                                  "moe weights: tensor '%s': UE8M0 scale byte 255 (NaN) at element %lld (row %lld)",
                                  name, (long long)i, (long long)(i / t->shape[t->ndim - 1]));
    return MMOE_OK;
}

/** One weight and its scales: shapes, dtypes, values. */
static mmoe_status check_mat(const mmoe_tensor *w, const mmoe_tensor *sf, const char *prefix, const char *wname,
                             const mmoe_dtype *w_ok, int n_w_ok, int64_t rows, int64_t wcols,
                             const mmoe_dtype *sf_ok, int n_sf_ok, int64_t sf_rows, int64_t sf_cols, int need_sf,
                             mmoe_error *err)
{
    char name[160];
    mmoe_status st;
    snprintf(name, sizeof name, "%s.%s.weight", prefix, wname);
    if ((st = expect_shape2(w, name, rows, wcols, err)) != MMOE_OK)
        return st;
    if ((st = expect_dtype(w, name, w_ok, n_w_ok, err)) != MMOE_OK)
        return st;
    if (!need_sf)
        return MMOE_OK;
    snprintf(name, sizeof name, "%s.%s.scale", prefix, wname);
    if ((st = expect_shape2(sf, name, sf_rows, sf_cols, err)) != MMOE_OK)
        return st;
    if ((st = expect_dtype(sf, name, sf_ok, n_sf_ok, err)) != MMOE_OK)
        return st;
    return check_scales(sf, name, err);
}

/** The six tensors of routed expert @p e. */
static mmoe_status check_routed(const mmoe_moe_desc *d, const mmoe_moe_expert_weights *x, int64_t e, mmoe_error *err)
{
    static const mmoe_dtype w_ok[] = {MMOE_DT_I8, MMOE_DT_U8};
    static const mmoe_dtype sf_ok[] = {MMOE_DT_F8_E8M0, MMOE_DT_U8};
    char prefix[64];
    snprintf(prefix, sizeof prefix, "ffn.experts.%lld", (long long)e);
    const int64_t D = d->hidden, I = d->inter;
    mmoe_status st;
    if ((st = check_mat(&x->w1, &x->w1_scale, prefix, "w1", w_ok, 2, I, D / 2, sf_ok, 2, I, D / 32, 1, err)) != MMOE_OK)
        return st;
    if ((st = check_mat(&x->w3, &x->w3_scale, prefix, "w3", w_ok, 2, I, D / 2, sf_ok, 2, I, D / 32, 1, err)) != MMOE_OK)
        return st;
    return check_mat(&x->w2, &x->w2_scale, prefix, "w2", w_ok, 2, D, I / 2, sf_ok, 2, D, I / 32, 1, err);
}

/** The six tensors of the shared experts. */
static mmoe_status check_shared(const mmoe_moe_desc *d, const mmoe_moe_expert_weights *x, mmoe_error *err)
{
    static const mmoe_dtype w_ok[] = {MMOE_DT_F8_E4M3, MMOE_DT_BF16};
    static const mmoe_dtype sf_ok[] = {MMOE_DT_F8_E8M0, MMOE_DT_U8, MMOE_DT_F32};
    const char *prefix = "ffn.shared_experts";
    const int64_t D = d->hidden, W = (int64_t)d->n_shared * d->shared_inter, B = d->shared_block;
    const int fp8 = x->w1.dtype == MMOE_DT_F8_E4M3;
    mmoe_status st;
    if ((st = check_mat(&x->w1, &x->w1_scale, prefix, "w1", w_ok, 2, W, D, sf_ok, 3, moe_ceil_div(W, B),
                        moe_ceil_div(D, B), fp8, err)) != MMOE_OK)
        return st;
    if (x->w3.dtype != x->w1.dtype || x->w2.dtype != x->w1.dtype)
        return mmoe_error_set(err, MMOE_EDTYPE,
                              "moe weights: shared experts: w1, w3, w2 must share one dtype (found %s, %s, %s)",
                              mmoe_dtype_name(x->w1.dtype), mmoe_dtype_name(x->w3.dtype),
                              mmoe_dtype_name(x->w2.dtype));
    if ((st = check_mat(&x->w3, &x->w3_scale, prefix, "w3", w_ok, 2, W, D, sf_ok, 3, moe_ceil_div(W, B),
                        moe_ceil_div(D, B), fp8, err)) != MMOE_OK)
        return st;
    return check_mat(&x->w2, &x->w2_scale, prefix, "w2", w_ok, 2, D, W, sf_ok, 3, moe_ceil_div(D, B), moe_ceil_div(W, B),
                     fp8, err);
}

/** Gate, bias or tid2eid. */
static mmoe_status check_router(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_error *err)
{
    static const mmoe_dtype bf16[] = {MMOE_DT_BF16};
    static const mmoe_dtype f32[] = {MMOE_DT_F32};
    static const mmoe_dtype ids[] = {MMOE_DT_I32, MMOE_DT_I64};
    mmoe_status st;
    if ((st = expect_shape2(&w->gate, "ffn.gate.weight", d->n_experts, d->hidden, err)) != MMOE_OK ||
        (st = expect_dtype(&w->gate, "ffn.gate.weight", bf16, 1, err)) != MMOE_OK)
        return st;
    if (d->routing == MMOE_ROUTING_BIASED) {
        if (w->gate_bias.data == NULL)
            return MMOE_OK; /* zero bias */
        if (w->gate_bias.ndim != 1 || w->gate_bias.shape[0] != d->n_experts)
            return mmoe_error_set(err, MMOE_ESHAPE, "moe weights: tensor 'ffn.gate.bias': expected shape [%lld]",
                                  (long long)d->n_experts);
        return expect_dtype(&w->gate_bias, "ffn.gate.bias", f32, 1, err);
    }
    if ((st = expect_shape2(&w->tid2eid, "ffn.gate.tid2eid", d->vocab, d->topk, err)) != MMOE_OK ||
        (st = expect_dtype(&w->tid2eid, "ffn.gate.tid2eid", ids, 2, err)) != MMOE_OK)
        return st;
    int64_t n = d->vocab * d->topk;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = w->tid2eid.dtype == MMOE_DT_I64 ? ((const int64_t *)w->tid2eid.data)[i]
                                                     : ((const int32_t *)w->tid2eid.data)[i];
        if (v < 0 || v >= d->n_experts)
            return mmoe_error_set(err, MMOE_ERANGE,
                                  "moe weights: tensor 'ffn.gate.tid2eid': entry [%lld, %lld] = %lld is not an expert id in [0, %lld)",
                                  (long long)(i / d->topk), (long long)(i % d->topk), (long long)v,
                                  (long long)d->n_experts);
    }
    return MMOE_OK;
}

mmoe_status moe_weights_validate(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_error *err)
{
    mmoe_status st = check_router(desc, w, err);
    if (st != MMOE_OK)
        return st;
    if (w->experts == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "moe weights: no routed experts given (experts == NULL)");
    for (int64_t e = 0; e < desc->n_experts; e++)
        if ((st = check_routed(desc, &w->experts[e], e, err)) != MMOE_OK)
            return st;
    if (desc->n_shared > 0)
        return check_shared(desc, &w->shared, err);
    return MMOE_OK;
}

void moe_mat_from_fp4(moe_mat *m, const mmoe_tensor *w, const mmoe_tensor *sf)
{
    memset(m, 0, sizeof *m);
    m->fmt = MOE_W_FP4;
    m->rows = w->shape[0];
    m->cols = 2 * w->shape[1];
    m->w = w->data;
    m->w_bytes = w->nbytes;
    m->sf = sf->data;
    m->sf_bytes = sf->nbytes;
    m->block_n = 1;
    m->block_k = 32;
    m->sf_rows = sf->shape[0];
    m->sf_cols = sf->shape[1];
}

void moe_mat_from_fp8(moe_mat *m, const mmoe_tensor *w, const mmoe_tensor *sf, int64_t block)
{
    memset(m, 0, sizeof *m);
    m->rows = w->shape[0];
    m->cols = w->shape[1];
    m->w = w->data;
    m->w_bytes = w->nbytes;
    if (w->dtype == MMOE_DT_BF16) {
        m->fmt = MOE_W_BF16;
        return;
    }
    m->fmt = MOE_W_FP8;
    m->sf = sf->data;
    m->sf_bytes = sf->nbytes;
    m->sf_f32 = sf->dtype == MMOE_DT_F32;
    m->block_n = block;
    m->block_k = block;
    m->sf_rows = sf->shape[0];
    m->sf_cols = sf->shape[1];
}

void moe_mat_release(moe_mat *m)
{
    free(m->w_owned);
    free(m->sf_owned);
    memset(m, 0, sizeof *m);
}
