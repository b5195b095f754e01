/**
 * @file attn_params.c
 * @brief Attention hyper-parameters (defaults, invariants) and the binding and checking of a layer's weights.
 *
 * The invariants checked here are the ones the forward relies on: every FP8 GEMM
 * input width (dim, q_lora_rank, G * o_lora_rank) is a multiple of the reference's
 * 128-wide activation quantization block; the nope part of a head (head_dim -
 * rope_dim) is a multiple of the 64-wide FP8 round-trip block of the kv cache; the
 * indexer head is a power of two (Hadamard) and a multiple of the 32-wide FP4 block;
 * the heads split evenly into o_groups.
 *
 * The weight tables follow @ref spec_arch_checkpoint; names are relative to the layer prefix
 * ("layers.L.attn" or "mtp.0.attn").  Norm weights, wkv/wgate of the compressors and
 * weights_proj are accepted as BF16 (the checkpoint) or F32 (an upcast copy); wo_a
 * as BF16 (converted) or F8_E4M3 + scale (published).
 */
#include "attn_internal.h"

#include <stdio.h>
#include <string.h>

void mmoe_attn_params_from_config(const mmoe_config *c, int compress_ratio, mmoe_attn_params *p)
{
    memset(p, 0, sizeof *p);
    p->dim = (int)c->dim;
    p->n_heads = c->n_heads;
    p->head_dim = c->head_dim;
    p->rope_dim = c->rope_head_dim;
    p->q_lora_rank = (int)c->q_lora_rank;
    p->o_groups = c->o_groups;
    p->o_lora_rank = (int)c->o_lora_rank;
    p->window = c->window_size;
    p->compress_ratio = compress_ratio;
    p->index_n_heads = c->index_n_heads;
    p->index_head_dim = c->index_head_dim;
    p->index_topk = c->index_topk;
    p->weight_block = c->weight_block_n;
    p->rope_theta = c->rope_theta;
    p->compress_rope_theta = c->compress_rope_theta;
    p->rope_factor = c->rope_factor;
    p->original_seq_len = c->original_seq_len;
    p->beta_fast = c->beta_fast;
    p->beta_slow = c->beta_slow;
    p->norm_eps = c->norm_eps;
}

void mmoe_attn_params_default_v4_flash(mmoe_attn_params *p, int compress_ratio)
{
    mmoe_config c;
    /* the "v4-flash" preset with its own layer count cannot fail; if it ever did, the params
     * stay zero and mmoe_attn_params_validate() rejects them */
    memset(p, 0, sizeof *p);
    if (mmoe_config_preset("v4-flash", 0, &c, NULL) == MMOE_OK)
        mmoe_attn_params_from_config(&c, compress_ratio, p);
}

/** Return MMOE_ERANGE with a message when @p cond holds. */
#define RANGE_FAIL(cond, ...)                                                                      \
    do {                                                                                           \
        if (cond)                                                                                  \
            return mmoe_error_set(err, MMOE_ERANGE, "attention params: " __VA_ARGS__);             \
    } while (0)

mmoe_status mmoe_attn_params_validate(const mmoe_attn_params *p, mmoe_error *err)
{
    RANGE_FAIL(p->dim <= 0 || p->dim % 128 != 0, "dim %d must be a positive multiple of 128", p->dim);
    RANGE_FAIL(p->n_heads <= 0, "n_heads %d must be positive", p->n_heads);
    RANGE_FAIL(p->rope_dim <= 0 || p->rope_dim % 2 != 0 || p->rope_dim > ATTN_MAX_ROPE_DIM,
               "rope_dim %d must be even, in [2, %d]", p->rope_dim, ATTN_MAX_ROPE_DIM);
    RANGE_FAIL(p->head_dim < p->rope_dim || (p->head_dim - p->rope_dim) % 64 != 0,
               "head_dim %d must be rope_dim (%d) plus a multiple of 64 (the kv FP8 block)",
               p->head_dim, p->rope_dim);
    RANGE_FAIL(p->q_lora_rank <= 0 || p->q_lora_rank % 128 != 0,
               "q_lora_rank %d must be a positive multiple of 128", p->q_lora_rank);
    RANGE_FAIL(p->o_groups <= 0 || p->n_heads % p->o_groups != 0,
               "o_groups %d must divide n_heads %d", p->o_groups, p->n_heads);
    RANGE_FAIL(p->o_lora_rank <= 0 || ((int64_t)p->o_groups * p->o_lora_rank) % 128 != 0,
               "o_groups * o_lora_rank (%d * %d) must be a positive multiple of 128", p->o_groups,
               p->o_lora_rank);
    RANGE_FAIL(p->window <= 0, "window %d must be positive", p->window);
    RANGE_FAIL(p->compress_ratio != 0 && p->compress_ratio != 4 && p->compress_ratio != 128,
               "compress_ratio %d must be 0, 4 or 128", p->compress_ratio);
    RANGE_FAIL(p->weight_block <= 0 || 128 % p->weight_block != 0,
               "weight_block %d must divide 128", p->weight_block);
    RANGE_FAIL(!(p->rope_theta > 1.0), "rope_theta %g must be > 1", p->rope_theta);
    RANGE_FAIL(!(p->norm_eps >= 0.0), "norm_eps %g must be >= 0", p->norm_eps);
    if (p->compress_ratio > 0) {
        RANGE_FAIL(!(p->compress_rope_theta > 1.0), "compress_rope_theta %g must be > 1",
                   p->compress_rope_theta);
        RANGE_FAIL(!(p->rope_factor > 0.0), "rope_factor %g must be > 0", p->rope_factor);
        RANGE_FAIL(p->original_seq_len <= 0, "original_seq_len %lld must be positive",
                   (long long)p->original_seq_len);
        RANGE_FAIL(!(p->beta_fast > 0.0) || !(p->beta_slow > 0.0),
                   "beta_fast %g and beta_slow %g must be positive", p->beta_fast, p->beta_slow);
    }
    if (p->compress_ratio == 4) {
        const int ihd = p->index_head_dim;
        RANGE_FAIL(p->index_n_heads <= 0, "index_n_heads %d must be positive", p->index_n_heads);
        RANGE_FAIL(ihd < 32 || ihd > ATTN_INDEX_MAX_HEAD_DIM || (ihd & (ihd - 1)) != 0 || ihd < p->rope_dim,
                   "index_head_dim %d must be a power of two in [32, %d] and >= rope_dim %d", ihd,
                   ATTN_INDEX_MAX_HEAD_DIM, p->rope_dim);
        RANGE_FAIL(p->index_topk <= 0, "index_topk %d must be positive", p->index_topk);
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------ weight checks */

/** Expect a BF16-or-F32 tensor of the given shape. */
static mmoe_status expect_float(const mmoe_tensor *t, const char *prefix, const char *name, int ndim,
                                const int64_t *shape, mmoe_error *err)
{
    char what[256];
    snprintf(what, sizeof what, "%s.%s", prefix, name);
    if (t->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor '%s' is missing", what);
    return mmoe_tensor_expect(t, what, t->dtype == MMOE_DT_F32 ? MMOE_DT_F32 : MMOE_DT_BF16, ndim,
                              shape, err);
}

/** Expect an exact dtype and shape. */
static mmoe_status expect_exact(const mmoe_tensor *t, const char *prefix, const char *name,
                                mmoe_dtype dt, int ndim, const int64_t *shape, mmoe_error *err)
{
    char what[256];
    snprintf(what, sizeof what, "%s.%s", prefix, name);
    if (t->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor '%s' is missing", what);
    return mmoe_tensor_expect(t, what, dt, ndim, shape, err);
}

/** Expect the FP8 linear prefix.name (weight [N, K] and its scale). */
static mmoe_status expect_fp8(const mmoe_tensor *w, const mmoe_tensor *s, const char *prefix,
                              const char *name, int64_t N, int64_t K, int block, mmoe_error *err)
{
    char what[256];
    snprintf(what, sizeof what, "%s.%s", prefix, name);
    if (w->data == NULL || s->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor '%s.%s' is missing", what,
                              w->data == NULL ? "weight" : "scale");
    return mmoe_linear_fp8_check(w, s, N, K, block, what, err);
}

/** Check one compressor's four tensors (width c*dh, c = 2 for ratio 4). */
static mmoe_status check_compressor(const mmoe_compressor_weights *c, const char *prefix, int ratio,
                                    int dh, int D, mmoe_error *err)
{
    const int64_t width = (ratio == 4 ? 2 : 1) * (int64_t)dh;
    const int64_t proj[2] = {width, D}, ape[2] = {ratio, width}, norm[1] = {dh};
    mmoe_status st;
    if ((st = expect_float(&c->wkv, prefix, "wkv.weight", 2, proj, err)) != MMOE_OK ||
        (st = expect_float(&c->wgate, prefix, "wgate.weight", 2, proj, err)) != MMOE_OK ||
        (st = expect_exact(&c->ape, prefix, "ape", MMOE_DT_F32, 2, ape, err)) != MMOE_OK ||
        (st = expect_float(&c->norm, prefix, "norm.weight", 1, norm, err)) != MMOE_OK)
        return st;
    return MMOE_OK;
}

mmoe_status mmoe_attn_weights_validate(const mmoe_attn_params *p, const char *prefix,
                                       const mmoe_attn_weights *w, mmoe_error *err)
{
    mmoe_status st = mmoe_attn_params_validate(p, err);
    if (st != MMOE_OK)
        return st;
    const int64_t D = p->dim, H = p->n_heads, d = p->head_dim, q = p->q_lora_rank;
    const int64_t G = p->o_groups, R = p->o_lora_rank, b = p->weight_block;
    const int64_t qn[1] = {q}, dn[1] = {d}, hn[1] = {H};
    const int64_t wo_a[2] = {G * R, H * d / G};
    if ((st = expect_fp8(&w->wq_a, &w->wq_a_scale, prefix, "wq_a", q, D, (int)b, err)) != MMOE_OK ||
        (st = expect_float(&w->q_norm, prefix, "q_norm.weight", 1, qn, err)) != MMOE_OK ||
        (st = expect_fp8(&w->wq_b, &w->wq_b_scale, prefix, "wq_b", H * d, q, (int)b, err)) != MMOE_OK ||
        (st = expect_fp8(&w->wkv, &w->wkv_scale, prefix, "wkv", d, D, (int)b, err)) != MMOE_OK ||
        (st = expect_float(&w->kv_norm, prefix, "kv_norm.weight", 1, dn, err)) != MMOE_OK ||
        (st = expect_fp8(&w->wo_b, &w->wo_b_scale, prefix, "wo_b", D, G * R, (int)b, err)) != MMOE_OK ||
        (st = expect_exact(&w->attn_sink, prefix, "attn_sink", MMOE_DT_F32, 1, hn, err)) != MMOE_OK)
        return st;
    if (w->wo_a.data != NULL && w->wo_a.dtype == MMOE_DT_F8_E4M3) {
        char what[256];
        snprintf(what, sizeof what, "%s.wo_a", prefix);
        if (w->wo_a_scale.data == NULL)
            return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor '%s.scale' is missing (wo_a is F8)", what);
        if ((st = mmoe_linear_fp8_check(&w->wo_a, &w->wo_a_scale, wo_a[0], wo_a[1], (int)b, what,
                                        err)) != MMOE_OK)
            return st;
    } else if ((st = expect_exact(&w->wo_a, prefix, "wo_a.weight", MMOE_DT_BF16, 2, wo_a, err)) != MMOE_OK) {
        return st;
    }
    if (p->compress_ratio > 0) {
        char cp[256];
        snprintf(cp, sizeof cp, "%s.compressor", prefix);
        if ((st = check_compressor(&w->compressor, cp, p->compress_ratio, (int)d, (int)D, err)) != MMOE_OK)
            return st;
    }
    if (p->compress_ratio == 4) {
        const int64_t ih = p->index_n_heads, id = p->index_head_dim;
        const int64_t wp[2] = {ih, D};
        char ip[256];
        snprintf(ip, sizeof ip, "%s.indexer", prefix);
        if ((st = expect_fp8(&w->idx_wq_b, &w->idx_wq_b_scale, ip, "wq_b", ih * id, q, (int)b, err)) != MMOE_OK ||
            (st = expect_float(&w->idx_weights_proj, ip, "weights_proj.weight", 2, wp, err)) != MMOE_OK)
            return st;
        char cp[300];
        snprintf(cp, sizeof cp, "%s.compressor", ip);
        if ((st = check_compressor(&w->idx_compressor, cp, 4, (int)id, (int)D, err)) != MMOE_OK)
            return st;
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------ binding */

/** Look up the tensor named prefix + "." + name into @p out. */
static mmoe_status bind_one(mmoe_tensor_lookup_fn lookup, void *ctx, const char *prefix,
                            const char *name, mmoe_tensor *out, mmoe_error *err)
{
    char full[512];
    snprintf(full, sizeof full, "%s.%s", prefix, name);
    mmoe_status st = lookup(ctx, full, out, err);
    if (st == MMOE_ENOTFOUND)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor '%s' is missing", full);
    return st;
}

/** Look up one compressor's four tensors under @p prefix. */
static mmoe_status bind_compressor(mmoe_tensor_lookup_fn lookup, void *ctx, const char *prefix,
                                   mmoe_compressor_weights *c, mmoe_error *err)
{
    mmoe_status st;
    if ((st = bind_one(lookup, ctx, prefix, "wkv.weight", &c->wkv, err)) != MMOE_OK ||
        (st = bind_one(lookup, ctx, prefix, "wgate.weight", &c->wgate, err)) != MMOE_OK ||
        (st = bind_one(lookup, ctx, prefix, "ape", &c->ape, err)) != MMOE_OK ||
        (st = bind_one(lookup, ctx, prefix, "norm.weight", &c->norm, err)) != MMOE_OK)
        return st;
    return MMOE_OK;
}

mmoe_status mmoe_attn_weights_bind(const mmoe_attn_params *p, const char *prefix,
                                   mmoe_tensor_lookup_fn lookup, void *ctx,
                                   mmoe_attn_weights *w, mmoe_error *err)
{
    memset(w, 0, sizeof *w);
    static const struct {
        const char *name;
        size_t offset;
    } base[] = {
        {"wq_a.weight", offsetof(mmoe_attn_weights, wq_a)},
        {"wq_a.scale", offsetof(mmoe_attn_weights, wq_a_scale)},
        {"q_norm.weight", offsetof(mmoe_attn_weights, q_norm)},
        {"wq_b.weight", offsetof(mmoe_attn_weights, wq_b)},
        {"wq_b.scale", offsetof(mmoe_attn_weights, wq_b_scale)},
        {"wkv.weight", offsetof(mmoe_attn_weights, wkv)},
        {"wkv.scale", offsetof(mmoe_attn_weights, wkv_scale)},
        {"kv_norm.weight", offsetof(mmoe_attn_weights, kv_norm)},
        {"wo_a.weight", offsetof(mmoe_attn_weights, wo_a)},
        {"wo_b.weight", offsetof(mmoe_attn_weights, wo_b)},
        {"wo_b.scale", offsetof(mmoe_attn_weights, wo_b_scale)},
        {"attn_sink", offsetof(mmoe_attn_weights, attn_sink)},
    };
    mmoe_status st;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        if ((st = bind_one(lookup, ctx, prefix, base[i].name,
                           (mmoe_tensor *)((char *)w + base[i].offset), err)) != MMOE_OK)
            return st;
    if (w->wo_a.dtype == MMOE_DT_F8_E4M3 &&
        (st = bind_one(lookup, ctx, prefix, "wo_a.scale", &w->wo_a_scale, err)) != MMOE_OK)
        return st;
    char sub[300];
    if (p->compress_ratio > 0) {
        snprintf(sub, sizeof sub, "%s.compressor", prefix);
        if ((st = bind_compressor(lookup, ctx, sub, &w->compressor, err)) != MMOE_OK)
            return st;
    }
    if (p->compress_ratio == 4) {
        snprintf(sub, sizeof sub, "%s.indexer", prefix);
        if ((st = bind_one(lookup, ctx, sub, "wq_b.weight", &w->idx_wq_b, err)) != MMOE_OK ||
            (st = bind_one(lookup, ctx, sub, "wq_b.scale", &w->idx_wq_b_scale, err)) != MMOE_OK ||
            (st = bind_one(lookup, ctx, sub, "weights_proj.weight", &w->idx_weights_proj, err)) != MMOE_OK)
            return st;
        snprintf(sub, sizeof sub, "%s.indexer.compressor", prefix);
        if ((st = bind_compressor(lookup, ctx, sub, &w->idx_compressor, err)) != MMOE_OK)
            return st;
    }
    return mmoe_attn_weights_validate(p, prefix, w, err);
}
