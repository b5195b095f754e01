/**
 * @file mmoe_synth_model.h
 * @brief A random DeepSeek-V4 checkpoint directory in the published format (`megamoe synth-model`).
 *
 * The directory holds `config.json` (Hugging Face keys), `model.safetensors.index.json`
 * and shards `model-0000i-of-0000n.safetensors`, with exactly the tensors of
 * mmoe_model_tensor_list() for the config.  Weights are quantized as in the real
 * checkpoint: dense linears FP8 E4M3 with one UE8M0 scale per 128x128 block (the
 * scale is the power-of-two ceiling of amax/448, so no element saturates), routed
 * experts FP4 E2M1 packed two per byte with one UE8M0 scale per 1x32 block.
 *
 * Values: unit-variance embedding rows, linear weights with std 1/sqrt(fan_in) (so
 * activations keep their scale), norm weights near 1, small mHC rows and biases,
 * hash tables with distinct experts per token.  Each tensor draws from its own
 * generator, seeded from (seed, tensor name): the bytes of a tensor do not depend on
 * the shard layout or on which other tensors exist.
 *
 * Atomicity: everything is written into `<dir>.partial-<pid>` and renamed to
 * `<dir>` at the end; on failure the partial directory is removed.
 */
#ifndef MMOE_SYNTH_MODEL_H
#define MMOE_SYNTH_MODEL_H

#include <stdint.h>

#include "mmoe_config.h"
#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Progress callback: called after each shard with (shards written, shards total, bytes written). */
typedef void (*mmoe_synth_progress_fn)(void *ctx, int shard, int n_shards, uint64_t bytes);

/**
 * Write a random checkpoint for @p cfg into the new directory @p dir.
 * @param cfg              the configuration (validated again here)
 * @param seed             RNG seed
 * @param dir              the directory to create (absent or empty)
 * @param max_shard_bytes  shard size target (a shard holds at least one tensor); 0 = 4 GiB
 * @param progress         optional callback (NULL: none)
 * @param progress_ctx     passed to @p progress
 * @param err              message on failure
 * @return MMOE_OK; MMOE_EINVAL (@p dir exists and is not empty), MMOE_EIO, MMOE_ENOMEM,
 *         MMOE_EUNSUPPORTED (a layer type without a published layout)
 */
mmoe_status mmoe_synth_model_write(const mmoe_config *cfg, uint64_t seed, const char *dir,
                                   uint64_t max_shard_bytes, mmoe_synth_progress_fn progress,
                                   void *progress_ctx, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_SYNTH_MODEL_H */
