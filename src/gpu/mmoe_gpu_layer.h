/**
 * @file mmoe_gpu_layer.h
 * @brief The backend-neutral MoE interface (mmoe_moe.h) on the GPU.
 *
 * A caller that already speaks to the CPU oracle through ::mmoe_moe_desc,
 * ::mmoe_moe_weights, ::mmoe_moe_input/::mmoe_moe_output and
 * ::mmoe_moe_result switches to the GPU by creating an ::mmoe_gpu_layer
 * instead.  This adapter (plain C, built with or without CUDA) checks the
 * weights, expands the shared expert's block scales to 1x32 UE8M0 bytes (an
 * exact re-expression), decides the shared-expert path with the oracle's
 * fallback rules, pads like the oracle (pad_to), and fills the same result.
 *
 * What is not (yet) on the GPU, and answered with MMOE_EUNSUPPORTED and a
 * message rather than run differently: the router (pass topk_idx), the
 * dsv4-ref recipe, and the serial shared-expert fallback.  MMOE_MATH_FAST is
 * computed in the precise mode and the result says MMOE_MATH_PRECISE.
 */
#ifndef MMOE_GPU_LAYER_H
#define MMOE_GPU_LAYER_H

#include "mmoe_gpu_moe.h"
#include "mmoe_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A GPU MoE layer behind the backend-neutral interface. */
typedef struct mmoe_gpu_layer mmoe_gpu_layer;

/**
 * Create the GPU layer of @p desc and upload @p w (not referenced afterwards).
 * @param desc  the layer description (recipe sm90 or sm100)
 * @param w     the weights, as for mmoe_moe_layer_set_weights()
 * @param out   the new layer
 * @param err   receives the message on failure
 * @return MMOE_OK; MMOE_ENODEV without CUDA or device; MMOE_EUNSUPPORTED (recipe dsv4-ref,
 *         shared_mode fused where fusion is impossible, a serial shared fallback);
 *         MMOE_EDTYPE / MMOE_ESHAPE / MMOE_ERANGE naming the tensor
 */
mmoe_status mmoe_gpu_layer_create(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_gpu_layer **out,
                                  mmoe_error *err);

/** Free the layer (NULL allowed). */
void mmoe_gpu_layer_destroy(mmoe_gpu_layer *layer);

/**
 * Run one call; same contract as mmoe_moe_layer_run() except that @p in->topk_idx is required.
 * @param layer   the layer
 * @param in      tokens and routing (host)
 * @param out     y (and optionally the routing used), host
 * @param result  optional; backend "gpu"
 * @param err     receives the message on failure
 * @return MMOE_OK, MMOE_EINVAL (bad routing), MMOE_EUNSUPPORTED (no topk_idx), MMOE_ENOMEM, MMOE_EINTERNAL
 */
mmoe_status mmoe_gpu_layer_run(mmoe_gpu_layer *layer, const mmoe_moe_input *in, const mmoe_moe_output *out,
                               mmoe_moe_result *result, mmoe_error *err);

/** GPU details of the last call (kernel, block_m, exact-path blocks, GPU bytes, kernel fallback). */
const mmoe_gpu_moe_result *mmoe_gpu_layer_details(const mmoe_gpu_layer *layer);

/** The underlying GPU layer (for mmoe_gpu_moe_time() and the counters). */
mmoe_gpu_moe *mmoe_gpu_layer_raw(mmoe_gpu_layer *layer);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_GPU_LAYER_H */
