/**
 * @file attn_test_util.h
 * @brief Test support of the attention suites: tiny configurations and seeded random weights.
 *
 * The tiny configuration keeps every structural feature of V4 attention (rope dims
 * after 64 nope dims, 2 output groups, a window much shorter than the test
 * sequences, compress ratios 4 and 128, an indexer with fewer top-k slots than
 * blocks) while staying small enough for sanitizer runs.  Weights are random: FP8
 * codes of normal samples with E8M0 scales around 2^-7, bf16 normals elsewhere,
 * chosen so that activations stay O(1) through the layer.
 */
#ifndef ATTN_TEST_UTIL_H
#define ATTN_TEST_UTIL_H

#include <stdint.h>

#include "mmoe_attention.h"
#include "mmoe_rng.h"

/** Maximum number of buffers a test layer owns. */
#define ATTN_TEST_MAX_BUFS 48

/** A layer's weights plus the memory behind them. */
typedef struct attn_test_layer {
    mmoe_attn_weights w;                 /**< views into bufs */
    void *bufs[ATTN_TEST_MAX_BUFS];      /**< owned allocations */
    int n_bufs;                          /**< number used */
} attn_test_layer;

/** A tiny configuration: D 128, H 4, d 128 (rope 64), q_lora 128, G 2 x 64, window 8, indexer 4 x 64, top-3. */
void attn_test_params_tiny(mmoe_attn_params *p, int compress_ratio);

/** Fill @p layer with random weights for @p p; @p wo_a_fp8 stores wo_a as F8 + scale. */
void attn_test_layer_make(attn_test_layer *layer, const mmoe_attn_params *p, mmoe_rng *rng,
                          int wo_a_fp8);

/** Free what attn_test_layer_make() allocated. */
void attn_test_layer_free(attn_test_layer *layer);

/** Random FP8 weight [N, K] with scales [ceil(N/b), ceil(K/b)] into tensors owned by @p layer. */
void attn_test_fp8_weight(attn_test_layer *layer, mmoe_rng *rng, int64_t N, int64_t K, int block,
                          mmoe_tensor *w, mmoe_tensor *scale);

/** @p n bf16 values N(mean, sigma^2), RNE. */
void attn_test_fill_bf16(mmoe_rng *rng, uint16_t *x, int64_t n, double mean, double sigma);

/** A BF16 tensor of @p n values N(mean, sigma^2) owned by @p layer (1-D, or 2-D when cols > 0). */
mmoe_tensor attn_test_bf16_tensor(attn_test_layer *layer, mmoe_rng *rng, int64_t rows, int64_t cols,
                                  double mean, double sigma);

#endif /* ATTN_TEST_UTIL_H */
