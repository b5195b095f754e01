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
 * The tensors of a shard are generated on a pool of threads while the shard is written; the
 * files are the same bytes for every thread count.
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

/** The largest thread count mmoe_synth_model_write() takes. */
#define MMOE_SYNTH_MAX_THREADS 1024

/** Progress callback: called after each shard with (shards written, shards total, bytes written). */
typedef void (*mmoe_synth_progress_fn)(void *ctx, int shard, int n_shards, uint64_t bytes);

/**
 * Write a random checkpoint for @p cfg into the new directory @p dir.
 * @param cfg              the configuration (validated again here)
 * @param seed             RNG seed
 * @param dir              the directory to create (absent or empty)
 * @param max_shard_bytes  shard size target (a shard holds at least one tensor); 0 = 4 GiB
 * @param n_threads        threads generating a shard's tensors, 1..::MMOE_SYNTH_MAX_THREADS, or 0 for
 *                         mmoe_synth_model_online_threads(); the output does not depend on it
 * @param progress         optional callback (NULL: none)
 * @param progress_ctx     passed to @p progress
 * @param err              message on failure
 * @return MMOE_OK; MMOE_EINVAL (@p dir exists and is not empty, or @p n_threads out of range), MMOE_EIO,
 *         MMOE_ENOMEM (also: a thread cannot be started),
 *         MMOE_EUNSUPPORTED (a layer type without a published layout)
 */
mmoe_status mmoe_synth_model_write(const mmoe_config *cfg, uint64_t seed, const char *dir,
                                   uint64_t max_shard_bytes, int n_threads, mmoe_synth_progress_fn progress,
                                   void *progress_ctx, mmoe_error *err);

/** The online CPU count (sysconf(_SC_NPROCESSORS_ONLN)), clamped to [1, ::MMOE_SYNTH_MAX_THREADS]. */
int mmoe_synth_model_online_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_SYNTH_MODEL_H */
