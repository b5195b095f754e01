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
 * `--cuda-graph on|off`: whether the GPU forward runs each decode step as one CUDA graph
 * replay (mmoe_gpu_forward.h).  Without the option the environment variable MMOE_GPU_GRAPH
 * decides (0: off, 1: on, anything else refused); with neither, graphs are on wherever one GPU
 * model runs the forward (`--backend gpu` or `auto`) and off with `--backend cpu` and with
 * `--gpus N` (the backend line says which).  `on` with `--backend cpu` is a
 * usage error; graphs with `--gpus N` are refused (the forward over several GPUs exchanges
 * rows through the host inside each MoE sub-layer and runs kernel by kernel), whether asked by
 * the option (usage error) or by the variable (error: pass --cuda-graph off or unset it).
 */
typedef struct mmoe_cuda_graph_opt {
    int given;  /**< 1: --cuda-graph was on the command line */
    int on;     /**< the setting: the option's, else MMOE_GPU_GRAPH's, else the default (after mmoe_cuda_graph_resolve()) */
} mmoe_cuda_graph_opt;

/** Usage line of the option (for the commands' help texts). */
#define MMOE_CUDA_GRAPH_USAGE                                                                                          \
    "  --cuda-graph on|off  the GPU forward's decode steps (one token) as one CUDA graph replay each\n"                \
    "                   (default: the environment variable MMOE_GPU_GRAPH, 1 or 0; unset: on with one GPU,\n"     \
    "                   off with --gpus N, whose ranks run kernel by kernel)\n"

/** Parse the value of --cuda-graph for command @p cmd ("logits"): 0, or a message and MMOE_EXIT_USAGE. */
int mmoe_cuda_graph_option(const char *cmd, const char *value, mmoe_cuda_graph_opt *o);

/**
 * Settle the option after parsing: check MMOE_GPU_GRAPH (always: a bad value is refused even
 * under the option) and take its setting without --cuda-graph, the default without either (on
 * for one GPU model: @p backend gpu or auto and @p gpus 0); refuse graphs with the CPU
 * backend (only when asked by the option) and with @p gpus > 0 GPUs.
 * @return 0; 1 (a bad MMOE_GPU_GRAPH, or the variable asks for graphs with --gpus); MMOE_EXIT_USAGE
 */
int mmoe_cuda_graph_resolve(const char *cmd, mmoe_cuda_graph_opt *o, mmoe_backend backend, int gpus);

/**
 * Resolve @p want for model @p m and, for the GPU, create the GPU model.
 * @param want         the requested backend
 * @param m            the loaded model
 * @param max_seq_len  positions of the sequence (GPU state)
 * @param max_tokens   largest forward call (GPU work buffers)
 * @param cuda_graph   1: the GPU model's decode steps replay one CUDA graph (mmoe_gpu_model_set_cuda_graph())
 * @param cmd          the command's name for the message line ("megamoe logits")
 * @param quiet        1: no "backend: ..." line on stderr
 * @param gpu          receives the GPU model, or NULL when the CPU runs
 * @param err          message on failure
 * @return MMOE_OK; with MMOE_BACKEND_GPU the GPU's error (MMOE_ENODEV, MMOE_ENOMEM with the bytes, ...)
 */
mmoe_status mmoe_backend_open(mmoe_backend want, const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                              int cuda_graph, const char *cmd, int quiet, mmoe_gpu_model **gpu, mmoe_error *err);

/** Did the GPU model @p g (NULL: the CPU ran) replay its decode graph at least once? */
int mmoe_backend_graphed(const mmoe_gpu_model *g);

#endif /* MMOE_FWD_BACKEND_H */
