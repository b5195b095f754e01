/**
 * @file mmoe_moe_synth.h
 * @brief Random MoE layers with real shapes and dtypes, for tests, cross-checks and benchmarks.
 *
 * A synthetic layer holds every tensor of a DeepSeek-V4 MoE layer (mmoe_moe.h's table), made
 * the way a checkpoint is made: real-valued weights quantized with the spec's quantizers.
 * Two value families:
 *  - MMOE_SYNTH_NORMAL: weights ~ N(0, 0.02^2) quantized to MXFP4 (1x32 UE8M0 ceil scales,
 *    RNE codes) and to FP8 with B x B UE8M0 block scales; gate N(0, 1/D) in BF16; bias
 *    N(0, 0.1^2); x ~ N(0, 1) in BF16.
 *  - MMOE_SYNTH_DYADIC: values chosen so that every FP8 x FP4 product and every L1 sum is
 *    exact in FP32 whatever the order (x: integers in [-14, 14] with |14| in every 32-group, so
 *    each activation scale is exactly 2^-5; weights: random codes with scales 2^-1..2^1).  The
 *    L1 accumulators are then reproducible bit for bit, which lets the tests compare whole
 *    layers against independent float64 references with tight bounds.
 * Everything is deterministic in the seed.
 */
#ifndef MMOE_MOE_SYNTH_H
#define MMOE_MOE_SYNTH_H

#include <stdint.h>

#include "mmoe_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Value family of a synthetic layer. */
typedef enum mmoe_moe_synth_values {
    MMOE_SYNTH_NORMAL = 0, /**< quantized normals (realistic) */
    MMOE_SYNTH_DYADIC = 1  /**< small dyadic values: exact L1 sums (for bit-level tests) */
} mmoe_moe_synth_values;

/** A synthetic layer: owns all its tensors. */
typedef struct mmoe_moe_synth mmoe_moe_synth;

/**
 * Make a random layer for @p desc (routing hash or biased, n_shared, shared_block as given).
 * @return MMOE_OK, MMOE_EINVAL (invalid desc) or MMOE_ENOMEM
 */
mmoe_status mmoe_moe_synth_create(const mmoe_moe_desc *desc, uint64_t seed, mmoe_moe_synth_values values,
                                  mmoe_moe_synth **out, mmoe_error *err);

/** The weights (views into the synth's memory; valid until mmoe_moe_synth_destroy()). */
const mmoe_moe_weights *mmoe_moe_synth_weights(const mmoe_moe_synth *s);

/** The mutable weights (tests corrupt a byte to check errors). */
mmoe_moe_weights *mmoe_moe_synth_weights_mut(mmoe_moe_synth *s);

/** Free a synthetic layer.  NULL is allowed. */
void mmoe_moe_synth_destroy(mmoe_moe_synth *s);

/**
 * Random inputs: @p x [t, D] BF16 and, if non-NULL, @p token_ids [t] in [0, vocab).
 */
void mmoe_moe_synth_input(const mmoe_moe_desc *desc, int64_t t, uint64_t seed, mmoe_moe_synth_values values,
                          uint16_t *x, int32_t *token_ids);

/**
 * Write the layer as a safetensors file with the checkpoint names (prefixed "layers.L." when
 * @p layer_index >= 0) and the metadata keys moe.topk, moe.n_shared, moe.shared_inter,
 * moe.shared_block, moe.routed_scaling_factor, moe.swiglu_limit and moe.scoring_func (atomic write).
 */
mmoe_status mmoe_moe_synth_write(const mmoe_moe_synth *s, int layer_index, const char *path, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_MOE_SYNTH_H */
