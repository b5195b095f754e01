/**
 * @file mmoe_model_tensors.h
 * @brief The tensor list of a DeepSeek-V4 checkpoint: every name, dtype and shape a config implies (@ref spec_arch_checkpoint).
 *
 * One function, mmoe_model_tensor_list(), turns an ::mmoe_config into the
 * list of tensors the published checkpoint format holds for it, in a fixed
 * order (globals, then layer by layer, then the MTP block).  Two users share
 * it, so that they can never disagree:
 *
 * - the loader checks a checkpoint against it (a missing tensor, a wrong
 *   dtype or shape is reported with the tensor's name before any compute);
 * - `megamoe synth-model` generates exactly these tensors.
 *
 * Layout choices where the published checkpoint is the reference: FP8
 * weights are F8_E4M3 [out, in] with F8_E8M0 scales [ceil(out/bn),
 * ceil(in/bk)]; `attn.wo_a` is stored FP8 with a scale (convert.py
 * dequantizes it to bf16 later); routed experts are I8 [out, in/2] packed FP4
 * with F8_E8M0 scales [out, in/32] (or FP8 when expert_dtype says so); norms,
 * embedding, head, gate weight, compressor wkv/wgate and the indexer's
 * weights_proj are BF16; every hc_* tensor, attn_sink, compressor ape and the
 * gate bias are F32; tid2eid is I64 [vocab, topk] (the ref holds it as int32).
 */
#ifndef MMOE_MODEL_TENSORS_H
#define MMOE_MODEL_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_config.h"
#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What kind of values a tensor holds (how synth-model initialises it). */
typedef enum mmoe_tensor_role {
    MMOE_ROLE_EMBED = 0,    /**< embedding rows (BF16, unit variance) */
    MMOE_ROLE_LINEAR,       /**< a weight matrix [out, in]; std 1/sqrt(in) */
    MMOE_ROLE_SCALE,        /**< the E8M0 scale of the preceding FP8/FP4 weight */
    MMOE_ROLE_NORM,         /**< RMSNorm weight, around 1 */
    MMOE_ROLE_HC_FN,        /**< mHC mixing rows [n, hc*D] */
    MMOE_ROLE_HC_BASE,      /**< mHC biases */
    MMOE_ROLE_HC_SCALE,     /**< mHC scales (around 1) */
    MMOE_ROLE_SINK,         /**< attention sink logits */
    MMOE_ROLE_APE,          /**< compressor position embedding */
    MMOE_ROLE_BIAS,         /**< router bias */
    MMOE_ROLE_TID2EID       /**< hash routing table: topk distinct experts per token */
} mmoe_tensor_role;

/** Longest tensor name, including the NUL. */
#define MMOE_TENSOR_NAME_LEN 96

/** One expected tensor. */
typedef struct mmoe_tensor_spec {
    char name[MMOE_TENSOR_NAME_LEN]; /**< full checkpoint name, e.g. "layers.2.attn.wq_a.weight" */
    mmoe_dtype dtype;                /**< on-disk dtype */
    int ndim;                        /**< 1 or 2 */
    int64_t shape[2];                /**< on-disk shape (packed FP4: [out, in/2]) */
    mmoe_tensor_role role;           /**< kind of values */
    int layer;                       /**< layer index (n_layers + i for MTP block i), -1 for globals */
} mmoe_tensor_spec;

/**
 * The full tensor list of @p cfg.
 * @param cfg  the configuration
 * @param out  receives a malloc'ed array (caller frees)
 * @param n    receives its length
 * @param err  message on failure
 * @return MMOE_OK, MMOE_ENOMEM, or MMOE_EUNSUPPORTED for a layer type without a published layout
 */
mmoe_status mmoe_model_tensor_list(const mmoe_config *cfg, mmoe_tensor_spec **out, size_t *n,
                                   mmoe_error *err);

/** Total bytes of the tensors of a list. */
uint64_t mmoe_model_tensor_bytes(const mmoe_tensor_spec *specs, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_MODEL_TENSORS_H */
