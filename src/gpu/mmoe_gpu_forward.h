/**
 * @file mmoe_gpu_forward.h
 * @brief The whole DeepSeek-V4 forward on one GPU: weights uploaded once, caches on the device, the
 *        CPU oracle's recipe block by block.
 *
 * ## What it is
 *
 * An ::mmoe_gpu_model is a loaded CPU model (mmoe_model.h) whose tensors have been copied to
 * device 0 once, in the checkpoint's formats (FP8 E4M3 weights with their block scales, packed
 * MXFP4 experts with UE8M0 bytes, BF16 or F32 where the checkpoint has them), together with one
 * sequence's state on the device: the sliding-window ring, the compressed kv blocks, the
 * compressor states and the indexer keys of every layer, and the activation buffers of a call.
 * mmoe_gpu_model_forward() has the contract of mmoe_model_forward(): T consecutive tokens from
 * the current position, logits of all or of the last token, optionally the final streams.
 *
 * ## The recipe
 *
 * Every block is the oracle's block, step by step, with the same rounding points
 * (src/gpu/gpu_forward.cu lists them per kernel).  Two kinds of steps:
 *
 * - **exact** (bit-identical to the oracle): embedding and stream expansion, RMSNorm (the
 *   sum of squares in double in the order of @ref spec_arch_sum_order, summed in parallel),
 *   mHC's logits (the same order), the FP8 block-scaled linear (exact block
 *   partials, fp32 scaled accumulation in block order), the dense BF16/F32 linear (the
 *   oracle's four-lane double order), the stream write-back of mHC, the per-head q scaling,
 *   RoPE (cos/sin tables computed on the host by the oracle's own function), the FP8 and FP4
 *   round trips, the Hadamard rotation, the indexer scores and their top-k order, the grouped
 *   output projection, the head's logits, the router's log1p (mmoe_log1p.h's evaluation, which
 *   the oracle's router also uses), the MoE's GEMM sums (router logits, L1, L2: the fixed
 *   order of @ref spec_moe_gemm_order on both);
 * - **exp**: the device's expf is the C library's algorithm (glibc's expf as built for CPUs
 *   with FMA: a 32-entry table of 2^(i/32) and a cubic in double), so sigmoid and Sinkhorn of
 *   mHC, the compressor's softmax pooling, the attention softmax and its sink and SiLU give the
 *   oracle's bits where the oracle runs on such a library (checked by the tests, which
 *   otherwise fall back to a one-ulp-per-exp bound).
 *
 * The tests (tests/test_gpu_forward.c, tests/test_gpu_forward_blocks.c) hold the exact blocks
 * to bit equality and the others to the bounds derived there.
 *
 * The MoE sub-layer here is its own sequence of small kernels with the `dsv4-ref` rounding
 * points and the serial shared expert, which is what the model's oracle computes (router,
 * hash table, L1 with the BF16 gate/up, the clamp, SiLU as one division, BF16 h, the E4M3
 * requantization per 128, L2, the combine in ascending expert id); the fused GPU layer
 * (mmoe_gpu_moe.h) implements the sm90/sm100 recipes instead.
 *
 * ## Memory
 *
 * mmoe_gpu_model_create() first adds up the bytes it will allocate (weights as uploaded, the
 * caches for @p max_seq_len positions, the work buffers for @p max_tokens tokens per call) and
 * refuses with MMOE_ENOMEM, naming bytes needed and available, when the device's free memory
 * is smaller; nothing is allocated then.
 *
 * ## One decode step, one CUDA graph (opt-in)
 *
 * With CUDA graphs on, a decode step (T = 1, logits wanted, timing off) is one replay of a
 * captured graph: the embedding, every layer and the head, bit-identical to the same kernels
 * launched one by one (which the other calls still do: prefill, MTP, timing).  Off by default;
 * on with the environment variable `MMOE_GPU_GRAPH=1`, read once by mmoe_gpu_model_create()
 * (unset or `0`: off; any other value is refused, mmoe_gpu_graph_env()), or with
 * mmoe_gpu_model_set_cuda_graph().  mmoe_gpu_model_graph_stats() says how many calls replayed
 * the graph.  A rank of the expert-parallel forward (src/ep) never graphs: its MoE sub-layer
 * exchanges rows through the host.
 *
 * Without CUDA every entry point answers MMOE_ENODEV (gpu_forward_stub.c); mmoe_gpu_graph_env()
 * works in every build.
 */
#ifndef MMOE_GPU_FORWARD_H
#define MMOE_GPU_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A model on the GPU with one sequence's state (opaque). */
typedef struct mmoe_gpu_model mmoe_gpu_model;

/** Device bytes a model would take, split by use. */
typedef struct mmoe_gpu_model_bytes {
    size_t weights;   /**< uploaded tensors */
    size_t caches;    /**< window rings, compressed blocks, compressor states, indexer keys */
    size_t work;      /**< activations and scratch of a call of max_tokens tokens */
    size_t total;     /**< the sum */
    size_t free_now;  /**< free device memory when measured (0 without a device) */
} mmoe_gpu_model_bytes;

/**
 * The bytes mmoe_gpu_model_create() would allocate for @p m (no allocation).
 * @param m            the loaded model
 * @param max_seq_len  positions of the sequence state (0: the config's max_seq_len)
 * @param max_tokens   largest T of one forward call (> 0)
 * @param out          written
 * @param err          message on failure
 * @return MMOE_OK, MMOE_ENODEV (no CUDA, no device), MMOE_ERANGE (bad sizes)
 */
mmoe_status mmoe_gpu_model_bytes_needed(const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                        mmoe_gpu_model_bytes *out, mmoe_error *err);

/**
 * Upload @p m to device 0 and create a sequence state of @p max_seq_len positions.
 * The CPU model must outlive nothing: after the call the GPU model owns its copies (the CPU
 * model may be closed).
 * @param m            the loaded model
 * @param max_seq_len  positions (0: the config's max_seq_len)
 * @param max_tokens   largest T of one forward call (> 0)
 * @param out          the GPU model
 * @param err          message on failure
 * @return MMOE_OK; MMOE_ENODEV; MMOE_EINVAL (#MMOE_GPU_GRAPH_ENV or #MMOE_GPU_FP8_LINEARS_ENV holds a
 *         value it refuses);
 *         MMOE_ENOMEM (device memory: "needs N bytes, M available"), MMOE_EUNSUPPORTED (a tensor
 *         layout the kernels do not take, named; or #MMOE_GPU_FP8_LINEARS_ENV is "tc" on a device
 *         other than compute capability 9.x, whose kernel is built for sm_90a only),
 *         MMOE_EINTERNAL (a CUDA error, named)
 */
mmoe_status mmoe_gpu_model_create(const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                  mmoe_gpu_model **out, mmoe_error *err);

/** Free every device allocation (NULL allowed). */
void mmoe_gpu_model_destroy(mmoe_gpu_model *g);

/** Start a new sequence (position 0, caches and compressor states reset). */
mmoe_status mmoe_gpu_model_reset(mmoe_gpu_model *g, mmoe_error *err);

/** Tokens consumed so far by the main model. */
int64_t mmoe_gpu_model_pos(const mmoe_gpu_model *g);

/** The positions the state holds. */
int64_t mmoe_gpu_model_max_seq_len(const mmoe_gpu_model *g);

/** Device bytes held (as planned by mmoe_gpu_model_bytes_needed()). */
void mmoe_gpu_model_bytes_held(const mmoe_gpu_model *g, mmoe_gpu_model_bytes *out);

/**
 * mmoe_model_forward() on the GPU: T tokens at positions pos .. pos+T-1.
 * @param g          the GPU model
 * @param ids        [T] token ids (< vocab_size)
 * @param T          1 .. max_tokens (longer inputs: call repeatedly)
 * @param logits     F32 [T, vocab] or [1, vocab] with @p last_only; NULL: not wanted
 * @param last_only  1: only the last token's logits
 * @param streams    optional bf16 [T, hc, D]: the final streams, written
 * @param err        message on failure
 * @return MMOE_OK, MMOE_EINVAL (bad id, T, too long: named), MMOE_EINTERNAL (CUDA error, the
 *         kernel named)
 */
mmoe_status mmoe_gpu_model_forward(mmoe_gpu_model *g, const int32_t *ids, int64_t T, float *logits,
                                   int last_only, uint16_t *streams, mmoe_error *err);

/**
 * mmoe_model_mtp_forward() on the GPU (MTP block 0; its own cache advances by T).
 * @return as mmoe_gpu_model_forward(); MMOE_EUNSUPPORTED without an MTP layer
 */
mmoe_status mmoe_gpu_model_mtp_forward(mmoe_gpu_model *g, const uint16_t *streams, const int32_t *next_ids,
                                       int64_t T, float *logits, mmoe_error *err);

/** The environment variable that turns decode-step CUDA graphs on ("1") or off (unset, "0"). */
#define MMOE_GPU_GRAPH_ENV "MMOE_GPU_GRAPH"

/** What MMOE_GPU_GRAPH says: nothing (unset), off ("0") or on ("1"). */
typedef enum {
    MMOE_GPU_GRAPH_UNSET = 0, /**< the variable is not set: the caller's default applies */
    MMOE_GPU_GRAPH_OFF = 1,   /**< "0": decode steps run kernel by kernel */
    MMOE_GPU_GRAPH_ON = 2     /**< "1": a decode step is one graph replay */
} mmoe_gpu_graph_setting;

/**
 * Read MMOE_GPU_GRAPH.
 * @param setting  written: #MMOE_GPU_GRAPH_UNSET, _OFF ("0") or _ON ("1"); _UNSET when refused
 * @param err      message on failure
 * @return MMOE_OK; MMOE_EINVAL for any other value, the empty one included (the message names
 *         the variable and the value)
 */
mmoe_status mmoe_gpu_graph_env(mmoe_gpu_graph_setting *setting, mmoe_error *err);

/**
 * Turn decode-step CUDA graphs on or off (replaces what MMOE_GPU_GRAPH set at creation).  The
 * graph is captured at the first graphed decode step and replayed by every later one, across
 * mmoe_gpu_model_reset() (it holds no position: every kernel reads the step's position and
 * token id from device memory); it is freed by mmoe_gpu_model_destroy().
 * @return MMOE_OK; MMOE_EUNSUPPORTED to turn it on for a rank of the expert-parallel forward
 */
mmoe_status mmoe_gpu_model_set_cuda_graph(mmoe_gpu_model *g, int on, mmoe_error *err);

/** What the CUDA graph did since creation. */
typedef struct mmoe_gpu_graph_stats {
    int enabled;          /**< 1: decode steps replay the graph */
    int64_t captures;     /**< captures of the decode step (0 or 1) */
    int64_t replays;      /**< forward calls that replayed it */
    int64_t eager_calls;  /**< forward calls launched kernel by kernel (prefill, timing, graphs off) */
} mmoe_gpu_graph_stats;

/** The CUDA graph's counters (all 0 without CUDA). */
void mmoe_gpu_model_graph_stats(const mmoe_gpu_model *g, mmoe_gpu_graph_stats *out);

/** The environment variable that picks the recipe of the GPU forward's FP8 linears ("exact" or "tc"). */
#define MMOE_GPU_FP8_LINEARS_ENV "MMOE_GPU_FP8_LINEARS"

/**
 * The recipe of the GPU forward's FP8 linears (docs/spec/architecture.md, "Linear layers").
 */
typedef enum {
    MMOE_GPU_FP8_LINEARS_EXACT = 0, /**< "exact": the oracle's exact block partials, bit for bit (the default) */
    MMOE_GPU_FP8_LINEARS_TC = 1     /**< "tc": block partials by the tensor cores for calls of 1 to 8 tokens,
                                         within the stated bound of the oracle; longer calls stay exact */
} mmoe_gpu_fp8_linears;

/** The name of a recipe of the FP8 linears ("exact", "tc"). */
const char *mmoe_gpu_fp8_linears_name(mmoe_gpu_fp8_linears r);

/**
 * Read MMOE_GPU_FP8_LINEARS.
 * @param r    written: the recipe it names, #MMOE_GPU_FP8_LINEARS_EXACT where unset or refused
 * @param err  message on failure
 * @return MMOE_OK; MMOE_EINVAL for any value but "exact" and "tc" (named with the variable)
 */
mmoe_status mmoe_gpu_fp8_linears_env(mmoe_gpu_fp8_linears *r, mmoe_error *err);

/**
 * Pick the recipe of @p g's FP8 linears (replaces what MMOE_GPU_FP8_LINEARS set at creation;
 * a captured decode graph is dropped and captured again at the next graphed step).
 * @return MMOE_OK; MMOE_EINVAL for a value outside the enum; MMOE_EUNSUPPORTED for
 *         #MMOE_GPU_FP8_LINEARS_TC on a device other than compute capability 9.x (the recipe's
 *         kernel is built for sm_90a only), the recipe unchanged
 */
mmoe_status mmoe_gpu_model_set_fp8_linears(mmoe_gpu_model *g, mmoe_gpu_fp8_linears r, mmoe_error *err);

/** The recipe of @p g's FP8 linears (#MMOE_GPU_FP8_LINEARS_EXACT without CUDA). */
mmoe_gpu_fp8_linears mmoe_gpu_model_fp8_linears(const mmoe_gpu_model *g);

/** Seconds spent per part (device time, measured with events; cumulative since reset). */
typedef struct mmoe_gpu_model_timings {
    int n_layers;          /**< blocks (main + MTP) of the arrays */
    const double *attn_s;  /**< [n_layers] attn_norm + attention */
    const double *moe_s;   /**< [n_layers] ffn_norm + router + experts */
    const double *mhc_s;   /**< [n_layers] hc_pre + hc_post */
    double embed_s;        /**< embedding + expansion */
    double head_s;         /**< head mix, norm and logits */
} mmoe_gpu_model_timings;

/** Turn per-part timing on (1) or off (0, the default: no synchronization between parts). */
void mmoe_gpu_model_set_timing(mmoe_gpu_model *g, int on);

/** The cumulative timings (arrays owned by @p g). */
void mmoe_gpu_model_timings_get(const mmoe_gpu_model *g, mmoe_gpu_model_timings *out);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_GPU_FORWARD_H */
