/**
 * @file attn_test_util.c
 * @brief Implementation of attn_test_util.h.
 */
#include "attn_test_util.h"

#include <stdlib.h>
#include <string.h>

#include "mmoe_formats.h"

void attn_test_params_tiny(mmoe_attn_params *p, int compress_ratio)
{
    mmoe_attn_params_default_v4_flash(p, compress_ratio);
    p->dim = 128;
    p->n_heads = 4;
    p->head_dim = 128;
    p->rope_dim = 64;
    p->q_lora_rank = 128;
    p->o_groups = 2;
    p->o_lora_rank = 64;
    p->window = 8;
    p->index_n_heads = 4;
    p->index_head_dim = 64;
    p->index_topk = 3;
}

static void *own(attn_test_layer *layer, size_t bytes)
{
    void *p = calloc(1, bytes);
    if (p == NULL || layer->n_bufs >= ATTN_TEST_MAX_BUFS)
        abort();
    layer->bufs[layer->n_bufs++] = p;
    return p;
}

void attn_test_fill_bf16(mmoe_rng *rng, uint16_t *x, int64_t n, double mean, double sigma)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = mmoe_bf16_from_f32((float)(mean + sigma * mmoe_rng_normal(rng)));
}

static mmoe_tensor make_tensor(mmoe_dtype dt, int64_t rows, int64_t cols, void *data)
{
    mmoe_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = cols > 0 ? 2 : 1;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = data;
    t.nbytes = (size_t)(rows * (cols > 0 ? cols : 1)) * mmoe_dtype_size(dt);
    return t;
}

mmoe_tensor attn_test_bf16_tensor(attn_test_layer *layer, mmoe_rng *rng, int64_t rows, int64_t cols,
                                  double mean, double sigma)
{
    const int64_t n = rows * (cols > 0 ? cols : 1);
    uint16_t *d = own(layer, sizeof(uint16_t) * (size_t)n);
    attn_test_fill_bf16(rng, d, n, mean, sigma);
    return make_tensor(MMOE_DT_BF16, rows, cols, d);
}

static mmoe_tensor f32_tensor(attn_test_layer *layer, mmoe_rng *rng, int64_t rows, int64_t cols,
                              double mean, double sigma)
{
    const int64_t n = rows * (cols > 0 ? cols : 1);
    float *d = own(layer, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        d[i] = (float)(mean + sigma * mmoe_rng_normal(rng));
    return make_tensor(MMOE_DT_F32, rows, cols, d);
}

void attn_test_fp8_weight(attn_test_layer *layer, mmoe_rng *rng, int64_t N, int64_t K, int block,
                          mmoe_tensor *w, mmoe_tensor *scale)
{
    uint8_t *wd = own(layer, (size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++)
        wd[i] = mmoe_fp8_e4m3_from_f32((float)(64.0 * mmoe_rng_normal(rng)));
    const int64_t sr = (N + block - 1) / block, sc = (K + block - 1) / block;
    uint8_t *sd = own(layer, (size_t)(sr * sc));
    /* 64 * 2^-7 / sqrt(K) keeps outputs O(1) for O(1) inputs at K = 128 */
    for (int64_t i = 0; i < sr * sc; i++)
        sd[i] = (uint8_t)(127 - 10 + (int)mmoe_rng_below(rng, 3));
    *w = make_tensor(MMOE_DT_F8_E4M3, N, K, wd);
    *scale = make_tensor(MMOE_DT_F8_E8M0, sr, sc, sd);
}

static void make_compressor(attn_test_layer *layer, mmoe_rng *rng, int ratio, int64_t dh, int64_t D,
                            mmoe_compressor_weights *c)
{
    const int64_t width = (ratio == 4 ? 2 : 1) * dh;
    c->wkv = attn_test_bf16_tensor(layer, rng, width, D, 0.0, 0.1);
    c->wgate = attn_test_bf16_tensor(layer, rng, width, D, 0.0, 0.1);
    c->ape = f32_tensor(layer, rng, ratio, width, 0.0, 0.5);
    c->norm = attn_test_bf16_tensor(layer, rng, dh, 0, 1.0, 0.1);
}

void attn_test_layer_make(attn_test_layer *layer, const mmoe_attn_params *p, mmoe_rng *rng,
                          int wo_a_fp8)
{
    memset(layer, 0, sizeof *layer);
    mmoe_attn_weights *w = &layer->w;
    const int64_t D = p->dim, H = p->n_heads, d = p->head_dim, q = p->q_lora_rank;
    const int64_t G = p->o_groups, R = p->o_lora_rank;
    const int b = p->weight_block;
    attn_test_fp8_weight(layer, rng, q, D, b, &w->wq_a, &w->wq_a_scale);
    w->q_norm = attn_test_bf16_tensor(layer, rng, q, 0, 1.0, 0.1);
    attn_test_fp8_weight(layer, rng, H * d, q, b, &w->wq_b, &w->wq_b_scale);
    attn_test_fp8_weight(layer, rng, d, D, b, &w->wkv, &w->wkv_scale);
    w->kv_norm = attn_test_bf16_tensor(layer, rng, d, 0, 1.0, 0.1);
    if (wo_a_fp8) {
        attn_test_fp8_weight(layer, rng, G * R, H * d / G, b, &w->wo_a, &w->wo_a_scale);
    } else {
        w->wo_a = attn_test_bf16_tensor(layer, rng, G * R, H * d / G, 0.0, 0.05);
    }
    attn_test_fp8_weight(layer, rng, D, G * R, b, &w->wo_b, &w->wo_b_scale);
    w->attn_sink = f32_tensor(layer, rng, H, 0, 0.0, 1.0);
    if (p->compress_ratio > 0)
        make_compressor(layer, rng, p->compress_ratio, d, D, &w->compressor);
    if (p->compress_ratio == 4) {
        const int64_t ih = p->index_n_heads, id = p->index_head_dim;
        attn_test_fp8_weight(layer, rng, ih * id, q, b, &w->idx_wq_b, &w->idx_wq_b_scale);
        w->idx_weights_proj = attn_test_bf16_tensor(layer, rng, ih, D, 0.0, 0.1);
        make_compressor(layer, rng, 4, id, D, &w->idx_compressor);
    }
}

void attn_test_layer_free(attn_test_layer *layer)
{
    for (int i = 0; i < layer->n_bufs; i++)
        free(layer->bufs[i]);
    layer->n_bufs = 0;
}
