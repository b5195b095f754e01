/**
 * @file mmoe_fwd_backend.h
 * @brief `--backend cpu|gpu|auto` of the model commands (logits, generate, bench forward).
 *
 * The CPU oracle (mmoe_model.h) always runs the forward unless the GPU is chosen: then the
 * loaded model is uploaded once (mmoe_gpu_forward.h) and the command's forward calls go to
 * the device.  `auto` takes the GPU when mmoe_gpu_available() finds one and the model fits
 * its memory; otherwise it takes the CPU, and the line it prints says why.  `gpu` never
 * falls back: no device, no CUDA in the build, or a model that does not fit is an error.
 */
#ifndef MMOE_FWD_BACKEND_H
#define MMOE_FWD_BACKEND_H

#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_gpu_forward.h"
#include "mmoe_model.h"

/** Which device runs the forward. */
typedef enum mmoe_backend {
    MMOE_BACKEND_CPU = 0,  /**< the CPU oracle (the default) */
    MMOE_BACKEND_GPU = 1,  /**< the GPU forward; refused when impossible */
    MMOE_BACKEND_AUTO = 2  /**< the GPU when there is one and the model fits, else the CPU (said so) */
} mmoe_backend;

/** Parse "cpu", "gpu" or "auto"; 0 on success, -1 otherwise. */
int mmoe_backend_parse(const char *s, mmoe_backend *out);

/**
 * Resolve @p want for model @p m and, for the GPU, create the GPU model.
 * @param want         the requested backend
 * @param m            the loaded model
 * @param max_seq_len  positions of the sequence (GPU state)
 * @param max_tokens   largest forward call (GPU work buffers)
 * @param cmd          the command's name for the message line ("megamoe logits")
 * @param quiet        1: no "backend: ..." line on stderr
 * @param gpu          receives the GPU model, or NULL when the CPU runs
 * @param err          message on failure
 * @return MMOE_OK; with MMOE_BACKEND_GPU the GPU's error (MMOE_ENODEV, MMOE_ENOMEM with the bytes, ...);
 *         with GPU or auto MMOE_EINVAL when MMOE_GPU_FWD_KERNELS names no kernel set (never a
 *         reason to run on the CPU)
 */
mmoe_status mmoe_backend_open(mmoe_backend want, const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                              const char *cmd, int quiet, mmoe_gpu_model **gpu, mmoe_error *err);

#endif /* MMOE_FWD_BACKEND_H */
