/**
 * @file mmoe_gpu_moe.h
 * @brief The GPU fast path of the fused MegaMoE layer: a C API over CUDA kernels.
 *
 * This header is plain C and is compiled with or without CUDA.  Without CUDA
 * (configure --without-cuda, or no nvcc found) every entry point exists and
 * returns ::MMOE_ENODEV, so programs and tests link the same way and a test
 * can skip (exit 77) where there is no GPU.
 *
 * The layer object ::mmoe_gpu_moe owns all device memory of one MoE layer:
 * the routed experts' MXFP4 weights exactly as the checkpoint has them (E2M1
 * codes packed two per byte, low nibble first, K-major, one UE8M0 byte per
 * 1x32 block along K), the shared expert's FP8 E4M3 weights with their scales
 * expanded to 1x32 UE8M0 bytes, and a workspace that grows with the token
 * count.  The weights stay in that 4.25-bit form in GPU memory: the E2M1 to
 * E4M3 decode happens inside the GEMM (tile by tile in shared memory, or in
 * registers in the decode kernel), never into a persistent FP8 copy.
 *
 * One call of mmoe_gpu_moe_run() computes, for T tokens whose routing is
 * given by the caller (topk_idx with -1 for a masked slot, topk_weights with
 * the routed scaling already applied):
 *   1. the input quantization of x (BF16 [T, D]) to FP8 E4M3 with the
 *      recipe's scales (sm90: one FP32 scale per 128 channels,
 *      sf = fl(max(amax,1e-4)/448), q = e4m3(x * fl(1/sf)); sm100: one UE8M0
 *      scale per 32 channels, ceil rule with the 1e-4 clamp);
 *   2. the grouping of the valid (token, slot) pairs by expert;
 *   3. the routed L1 GEMM (FP8 x MXFP4 -> FP32), BF16 rounding of gate and
 *      up, the clamp in BF16, silu(g)*u*w in FP32, stored FP32;
 *   4. the requantization of that intermediate (sm90: FP32 per 128 with the
 *      same formula; sm100: UE8M0 per 32 with the kernel rule, no clamps);
 *   5. the routed L2 GEMM, each output rounded to BF16 into its combine slot;
 *   6. the shared expert(s) as one more slot (routing weight 1.0);
 *   7. the combine: ascending slot order, shared slot last, FP32 sum from
 *      zero, one BF16 store.
 * This is the oracle's recipe (src/cpu_ref/mmoe_moe.h) in the precise mode
 * (expf, IEEE division); only the order of the FP32 accumulation inside the
 * GEMMs differs, hence the tests' tolerance.
 */
#ifndef MMOE_GPU_MOE_H
#define MMOE_GPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Which activation formats the GPU layer computes: the oracle's recipes, with the oracle's
 * numbers (mmoe_moe_recipe: SM100 = 0, SM90 = 1), and AUTO outside that range.  A description
 * cleared to zero therefore asks for SM100: set the recipe explicitly.
 */
typedef enum mmoe_gpu_recipe {
    MMOE_GPU_RECIPE_AUTO = -1, /**< pick from the device: sm_90 -> SM90, sm_100 -> SM100 */
    MMOE_GPU_RECIPE_SM100 = 0, /**< UE8M0 scale per 32 channels (input ceil rule, kernel requant rule) */
    MMOE_GPU_RECIPE_SM90 = 1   /**< FP32 scale per 128 channels for input and intermediate */
} mmoe_gpu_recipe;

/**
 * Which GEMM kernel family the layer runs.  All compute the same exact products with FP32
 * sums (the GPU suite checks each family alone and in the layer).  AUTO picks per call: on a
 * compute-capability-9.0 device with the sm90 recipe, the decode kernel (decode16) up to a
 * measured token count; above it, on an sm_90a build, the wgmma kernel once the expected pairs per expert
 * exceed a measured threshold (prefill), else the mma.sync tile kernel; on other devices
 * mma.sync.
 */
typedef enum mmoe_gpu_gemm {
    MMOE_GPU_GEMM_AUTO = 0,  /**< the faster verified family for each call size (see above) */
    MMOE_GPU_GEMM_MMA = 1,   /**< the portable mma.sync tile kernel (gpu_gemm.cu), any sm_89+ device */
    MMOE_GPU_GEMM_WGMMA = 2, /**< the warp-specialized wgmma kernel (gpu_gemm_wgmma.cu), sm_90 only */
    MMOE_GPU_GEMM_DECODE16 = 4 /**< the weight-streaming decode kernel (gpu_decode.cu), 8-token tiles, sm_90+,
                                    F16 MMAs (m16n8k16; activations staged as E4M3 and converted, MXFP4 codes
                                    moved to F16, in registers); AUTO's decode kernel */
} mmoe_gpu_gemm;

/** Sizes and options of one layer. */
typedef struct mmoe_gpu_moe_desc {
    int hidden;           /**< D: model width, multiple of 128 */
    int inter;            /**< I: routed expert width the GEMMs run with (padded), multiple of 128 */
    int inter_src;        /**< width of the given routed weights (<= inter; the rest is zero padding); 0 = inter */
    int n_experts;        /**< E: routed experts (all local: one GPU) */
    int topk;             /**< routed slots per token, 1..31 */
    int shared_inter;     /**< S*I: total shared-expert width the GEMMs run with (multiple of 128), 0 = none */
    int shared_inter_src; /**< width of the given shared weights (<= shared_inter); 0 = shared_inter */
    float swiglu_limit;   /**< clamp c (gate <= c, -c <= up <= c); 0 or negative = no clamp */
    mmoe_gpu_recipe recipe; /**< activation formats; AUTO follows the device */
    int block_m;          /**< tokens per GEMM tile: 0 = by the expected pairs per expert, or 16 / 64
                               (/ 128 with the wgmma kernel); the decode kernel's tiles are 8 (0 here) */
    mmoe_gpu_gemm gemm;   /**< GEMM kernel family; AUTO follows the device */
} mmoe_gpu_moe_desc;

/**
 * Host weights of one layer, in the checkpoint's layout; copied to the GPU
 * by mmoe_gpu_moe_create() and not referenced afterwards.
 *
 * Routed expert e: w1[e] (gate) and w3[e] (up) are [I, D/2] bytes of packed
 * E2M1 codes with scales s1[e], s3[e] of [I, D/32] UE8M0 bytes; w2[e] is
 * [D, I/2] bytes with s2[e] of [D, I/32] bytes.  Shared expert (when
 * shared_inter > 0): sw1, sw3 are [S*I, D] FP8 E4M3 bytes with ss1, ss3 of
 * [S*I, D/32] UE8M0 bytes; sw2 is [D, S*I] with ss2 of [D, S*I/32] bytes
 * (checkpoint 128x128 block scales must be expanded to 1x32 by the caller;
 * the expansion is exact).  The given tensors have the *_src widths of the
 * description; the layer pads them to the used widths on the device with zero
 * codes and unit scales (byte 127), which changes no output bit: padded gate
 * and up rows give silu(0)*0 = 0, whole 128-groups of zeros requantize to
 * zeros, and the padded L2 columns add exact zeros to the sums.
 */
typedef struct mmoe_gpu_moe_weights {
    const uint8_t *const *w1; /**< [E] gate weights [I, D/2], packed E2M1 */
    const uint8_t *const *w3; /**< [E] up weights [I, D/2], packed E2M1 */
    const uint8_t *const *w2; /**< [E] down weights [D, I/2], packed E2M1 */
    const uint8_t *const *s1; /**< [E] gate scales [I, D/32], UE8M0 */
    const uint8_t *const *s3; /**< [E] up scales [I, D/32], UE8M0 */
    const uint8_t *const *s2; /**< [E] down scales [D, I/32], UE8M0 */
    const uint8_t *sw1;       /**< shared gate [S*I, D], E4M3 */
    const uint8_t *sw3;       /**< shared up [S*I, D], E4M3 */
    const uint8_t *sw2;       /**< shared down [D, S*I], E4M3 */
    const uint8_t *ss1;       /**< shared gate scales [S*I, D/32], UE8M0 */
    const uint8_t *ss3;       /**< shared up scales [S*I, D/32], UE8M0 */
    const uint8_t *ss2;       /**< shared down scales [D, S*I/32], UE8M0 */
} mmoe_gpu_moe_weights;

/** What one call did: the path taken, fallbacks and their reasons, counters. */
typedef struct mmoe_gpu_moe_result {
    int device_cc;                /**< compute capability of the device, e.g. 90 */
    mmoe_gpu_recipe recipe;       /**< the recipe that was computed */
    int fallback;                 /**< 1 when a portable (non-native) kernel ran; see fallback_reason */
    char fallback_reason[256];    /**< why, or "" */
    const char *kernel;           /**< name of the GEMM kernel family that ran */
    mmoe_gpu_gemm gemm;           /**< the GEMM kernel family that ran (never AUTO) */
    int block_m;                  /**< tokens per GEMM tile chosen for this call */
    int shared_fused;             /**< 1 when the shared expert ran as the last combine slot */
    int64_t routed_pairs;         /**< valid (token, slot) pairs of this call */
    int64_t exact_path_blocks_l1; /**< (expert,row,128-K) weight blocks of L1 whose 1x32 scale exponents
                                       span more than E4M3 can hold: the mma.sync kernel computes them
                                       by per-32 promotion (the wgmma kernel folds into F16 and takes
                                       that path only for spreads beyond 24, or 22 for FP8 weights) */
    int64_t exact_path_blocks_l2; /**< the same for L2 (and the shared expert's blocks) */
    size_t gpu_weight_bytes;      /**< bytes of weights (codes + scales) held on the GPU */
    size_t gpu_workspace_bytes;   /**< bytes of the token workspace after this call */
    int graph;                    /**< mmoe_gpu_moe_time(): 1 when the timed calls were CUDA-graph replays */
    int decode_blocks_per_sm;     /**< decode calls (decode16): blocks of the L1 decode GEMM
                                       that fit on one SM at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor
                                       with its shared memory); 0 for the tile families */
    int decode_launches;          /**< decode calls: kernel launches of the call, 3 (the GEMMs requantize and
                                       combine themselves: few tokens) or 5 (separate requantization and
                                       combine kernels); 0 for the tile families */
} mmoe_gpu_moe_result;

/** Opaque GPU layer object. */
typedef struct mmoe_gpu_moe mmoe_gpu_moe;

/**
 * Is there a usable CUDA device?
 * @param cc   compute capability of device 0 (major*10+minor), written when found; may be NULL
 * @param err  receives the message on failure
 * @return MMOE_OK, or MMOE_ENODEV (no CUDA in this build, no device, driver error) with a message
 */
mmoe_status mmoe_gpu_available(int *cc, mmoe_error *err);

/**
 * Create a layer on device 0 and copy its weights there.
 * @param desc  sizes and options (checked: multiples of 128, topk in 1..31, ...)
 * @param w     host weights (see ::mmoe_gpu_moe_weights); NULL for random weights drawn on
 *              the device from @p seed (for benchmarks: codes uniform, scale bytes in 118..125)
 * @param seed  seed of the random weights when @p w is NULL
 * @param out   the new layer; free with mmoe_gpu_moe_destroy()
 * @param err   receives the message on failure
 * @return MMOE_OK, MMOE_EINVAL/MMOE_ESHAPE for bad sizes, MMOE_ENOMEM, MMOE_ENODEV
 */
mmoe_status mmoe_gpu_moe_create(const mmoe_gpu_moe_desc *desc, const mmoe_gpu_moe_weights *w,
                                uint64_t seed, mmoe_gpu_moe **out, mmoe_error *err);

/** Free a layer and all its device memory (NULL is accepted). */
void mmoe_gpu_moe_destroy(mmoe_gpu_moe *layer);

/**
 * Run the layer on T tokens (host arrays in, host array out).
 * @param layer     the layer
 * @param T         tokens, >= 0
 * @param x         BF16 [T, D] (raw uint16 bits)
 * @param topk_idx  int32 [T, topk], expert ids in [0, E) or -1 for a masked slot
 * @param topk_w    FP32 [T, topk] routing weights (routed scaling applied; ignored where masked)
 * @param y         BF16 [T, D] output; fully written on success, untouched on failure
 * @param res       what ran (may be NULL)
 * @param err       receives the message on failure
 * @return MMOE_OK, MMOE_ERANGE for an expert id out of range, MMOE_ENOMEM, MMOE_ENODEV,
 *         MMOE_EINTERNAL for a CUDA error (the message names the kernel)
 */
mmoe_status mmoe_gpu_moe_run(mmoe_gpu_moe *layer, int T, const uint16_t *x, const int32_t *topk_idx,
                             const float *topk_w, uint16_t *y, mmoe_gpu_moe_result *res,
                             mmoe_error *err);

/**
 * Received (token, slot) pairs per routed expert, accumulated over all calls
 * since create (the layer's cumulative_local_expert_recv_stats).
 * @param layer   the layer
 * @param counts  int64 [E], written
 * @param err     receives the message on failure
 * @return MMOE_OK, or MMOE_EINTERNAL for a CUDA error
 */
mmoe_status mmoe_gpu_moe_expert_counts(mmoe_gpu_moe *layer, int64_t *counts, mmoe_error *err);

/**
 * Time the layer: upload the inputs once, capture one call (3 or 5 kernel launches on one
 * stream with the decode kernel, 9 to 15 on two streams with the tile kernels) into a
 * CUDA graph, run @p warmup untimed replays, then @p iters replays each timed with
 * CUDA events; report the median and the
 * minimum in microseconds.  Where the capture fails the calls are launched
 * directly and res->graph says so.  The output stays on the device.
 * @param layer      the layer
 * @param T          tokens
 * @param x          BF16 [T, D]
 * @param topk_idx   int32 [T, topk]
 * @param topk_w     FP32 [T, topk]
 * @param warmup     untimed calls first
 * @param iters      timed calls (> 0)
 * @param median_us  median time of a call, microseconds
 * @param min_us     fastest call, microseconds
 * @param res        what ran (may be NULL)
 * @param err        receives the message on failure
 * @return as mmoe_gpu_moe_run()
 */
mmoe_status mmoe_gpu_moe_time(mmoe_gpu_moe *layer, int T, const uint16_t *x, const int32_t *topk_idx,
                              const float *topk_w, int warmup, int iters, double *median_us,
                              double *min_us, mmoe_gpu_moe_result *res, mmoe_error *err);

/**
 * The input quantizer alone, for bit-exact tests: rows of BF16 to FP8 E4M3
 * with the recipe's scales, on the device.
 * @param recipe  MMOE_GPU_RECIPE_SM90 (FP32 per 128: @p scales holds rows*cols/128 floats) or
 *                MMOE_GPU_RECIPE_SM100 (UE8M0 per 32: @p scales holds rows*cols/32 floats, each a
 *                power of two 2^(byte-127))
 * @param rows    rows of x
 * @param cols    channels per row
 * @param x       BF16 [rows, cols], cols a multiple of 128
 * @param q       E4M3 [rows, cols], written
 * @param scales  written as described under @p recipe
 * @param err     receives the message on failure
 * @return MMOE_OK, MMOE_ESHAPE, MMOE_ENODEV, MMOE_EINTERNAL
 */
mmoe_status mmoe_gpu_quantize_input(mmoe_gpu_recipe recipe, int rows, int cols, const uint16_t *x,
                                    uint8_t *q, float *scales, mmoe_error *err);

/** Name of a recipe ("sm90", "sm100", "auto"). */
const char *mmoe_gpu_recipe_name(mmoe_gpu_recipe r);

/** Name of a GEMM kernel family ("auto", "mma", "wgmma", "decode16"). */
const char *mmoe_gpu_gemm_name(mmoe_gpu_gemm g);

/**
 * Parse a GEMM kernel family name: one of mmoe_gpu_gemm_names().
 * @param s    the name
 * @param out  the family, written on success (untouched on failure)
 * @return 0 on success, -1 for any other name
 */
int mmoe_gpu_gemm_parse(const char *s, mmoe_gpu_gemm *out);

/** The names mmoe_gpu_gemm_parse() accepts, as a list for messages: "auto, mma, wgmma, decode16". */
const char *mmoe_gpu_gemm_names(void);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_GPU_MOE_H */
