/**
 * @file gpu_forward.cu
 * @brief The DeepSeek-V4 forward on one GPU: upload, caches, and one simple kernel per step of the
 *        oracle's recipe (see mmoe_gpu_forward.h for the contract and the three kinds of steps).
 *
 * ## Layout
 *
 * Weights keep the checkpoint's bytes: FP8 linears as E4M3 codes [N, K] plus their E8M0 block
 * scale bytes; routed experts as packed E2M1 [E][rows][cols/2] plus UE8M0 [E][rows][cols/32];
 * the shared expert as E4M3 plus its block scales widened to fp32 values; BF16 and F32 tensors
 * as they are.  Activations are bf16 bit patterns [T, ...] unless a name says f32, exactly the
 * oracle's buffers (model_forward.c, attn_forward.c, moe_layer.c).
 *
 * ## Kernels and their rounding points (oracle file in brackets)
 *
 * | kernel            | what                                                   | exact? |
 * |-------------------|--------------------------------------------------------|--------|
 * | k_embed           | X[t,j,:] = E[id] [model_forward.c, mmoe_mhc.c]          | yes    |
 * | k_rmsnorm         | sum of squares in double, the block's tree [rmsnorm.c]; | yes    |
 * |                   | optionally k_act_quant's codes of its output            |        |
 * | k_act_quant       | 1x128 E4M3, UE8M0 ceil scale of the V4 rule [linear_fp8.c] | yes |
 * | k_linear_fp8_128_split | exact block partials, fp32 scaled sum in block order; grid per SM count | yes |
 * | k_linear_fp8_tokens | the same from 8 tokens on, FP64 tensor-core partials [gpu_linear_fp8_tokens.cuh] | yes |
 * | k_linear_fp8      | the same for other scale blocks (one warp per output)   | yes    |
 * | k_linear_fp8_tc   | the `tc` recipe, 1 to 8 tokens: F16 wgmma block partials, sm_90a [gpu_linear_fp8_tc.cuh] | bound |
 * | k_linear_dense_split | double dot in the chunked pairwise order [linear_dense.c] | yes  |
 * | k_linear_dense_tokens | the same from 8 tokens on, a weight chunk for 8 tokens [gpu_linear_dense_tokens.cuh] | yes |
 * | k_linear_dense_f8_rows | the same below 8 tokens for an FP8 weight, the scale staged with x [gpu_linear_dense_f8_rows.cuh] | yes |
 * | k_hc_part, k_hc_finish_split | mHC logits (double, block trees), sigmoid, Sinkhorn, mix | yes* |
 * | k_hc_pre_norm     | the same and k_rmsnorm after it, one launch (decode steps) | yes* |
 * | k_hc_sinkhorn     | a one-token step's Sinkhorn on the side stream, from k_hc_pre_norm's logits | yes |
 * | k_hc_post         | fp32 write-back, j ascending, then the post term       | yes    |
 * | k_q_kv_finish     | per-head q scaling in bf16 steps, RoPE [attn_forward.c]; | yes  |
 * |                   | kv RMSNorm, RoPE, FP8 round trip (block 64)             |        |
 * | k_indexer_q_split | RoPE, Hadamard, FP4 round trip; head weights scaling    | yes    |
 * | k_compress        | gated pooling per channel, finish [attn_compressor.c]   | yes*   |
 * | k_indexer_scores  | bf16-rounded head terms, double sums [attn_indexer.c]   | yes    |
 * | k_topk_split      | descending, NaN last, ties to the lower index           | yes    |
 * | k_attend          | chunked online softmax, sink, bf16 P, inverse RoPE [attn_sparse.c] | exp |
 * | k_attend_one      | the same for one token at V4's head width, a pass of chunks at once | exp |
 * | MoE sub-layer     | gpu_fwd_moe.cu: the oracle's GEMM order, chain-packed weights | yes |
 * | (its router)      | sqrt-softplus, bias for selection, top-k or hash        | exp/log|
 *
 * The "exact" kernels are bit-identical to the oracle given identical inputs (yes*: where the
 * host's expf is glibc's FMA build, which gfw_expf() reproduces); the others are bounded in
 * tests/test_gpu_forward.c and tests/test_gpu_forward_blocks.c.
 *
 * ## The FP8 linears' two recipes
 *
 * A model's FP8 linears run one of two recipes, picked by MMOE_GPU_FP8_LINEARS at creation or
 * mmoe_gpu_model_set_fp8_linears() and reported by mmoe_gpu_model_fp8_linears() (and by
 * `bench forward`): `exact` (the default), the kernels above, bit for bit the oracle's; or `tc`,
 * where a call of 1 to 8 tokens (decode, MTP) runs k_linear_fp8_tc, whose block partials the
 * tensor cores sum in FP32 (within 2^-14 A of the oracle before the BF16 rounding, A the dot
 * product of the absolute dequantized values: @ref spec_arch_linear), and longer calls stay
 * exact; `tc` is refused on devices other than compute capability 9.x (its kernel is a wgmma
 * kernel, built for sm_90a only).  The recipe changes only which kernel computes the linears (wq_a with wkv, wq_b and the
 * indexer's, wo_b with its hc_post, the MTP's); a captured decode graph is dropped when it
 * changes.
 *
 * ## Parallel sums in the oracle's order
 *
 * The double sums of the norms, of mHC's logits, of the q rescaling and of the attention and
 * indexer dot products follow @ref spec_arch_sum_order (mmoe_sum_order.h): chunks of 16 terms,
 * then a pairwise tree.  A thread sums one chunk (or an aligned power-of-two run of chunks), a
 * warp's butterfly adds the levels above it (gfw_group_pairwise), a block's warps combine in
 * shared memory (gfw_block_tree), and mHC's 4D-long sums are split over blocks of 256 chunks
 * whose sums a second kernel folds with the oracle's own code: every level is a node of the
 * same tree, so the bits are the oracle's.  Maxima (the FP8/FP4 scales, the softmax's running
 * max) are order-free and reduced by warps.  The rest keeps its sequential order but not its
 * serial shape: the Sinkhorn iterations run one lane of a warp per matrix entry, each summing
 * its row or column in order; the Hadamard stages split their independent butterflies; the
 * attention's exps run in parallel and only the denominator's fp32 chain stays on one thread.
 *
 * ## The per-token steps spread over warps
 *
 * At decode (one token per call) the steps that are sequential per token would leave all but
 * one thread block idle if each ran in one block; their work is spread instead, every
 * butterfly, sum, division and rounding keeping its operands and its order.  The indexer's
 * query transform (64 heads of 128 values at V4-Flash widths: RoPE, seven Hadamard stages,
 * the FP4 round trip) runs in k_indexer_q_split, which gives each head to one warp and keeps
 * the head in registers (value V lane + r in register r of lane lane, V = id / 32), runs the
 * Hadamard stages below V inside a lane and the others by xor shuffles between lanes, and takes
 * each FP4 block's maximum over the 32 / V lanes that hold it.  mHC's Sinkhorn iterations run
 * in warp 0 of block 0 of k_hc_finish_split, the matrix in registers and every row and column
 * sum fetched by shuffles in the oracle's order, while the other blocks mix one channel per
 * thread, their stream values loaded while the block sums are still being folded (the mix
 * needs only pre).  At decode (hc_pre_norm_fits()) one kernel, k_hc_pre_norm, does all of that
 * and the norm after it: the block sums' blocks count themselves done, and the last block of a
 * token finishes it alone (the Sinkhorn in one warp, the mix and the norm in the others, a
 * chunk of 16 channels per thread), so a decode step's mHC costs one launch instead of three;
 * in a one-token call on one GPU the Sinkhorn, whose chain of dependent steps outlasts the mix
 * and the norm, leaves the kernel for k_hc_sinkhorn on the side stream (sinkhorn_side()).
 * k_topk_split ranks the candidates (eight threads each, O(n) comparisons against the scores,
 * which each block stages in shared memory a tile at a time) in blocks of 32 candidates, which
 * matters at long contexts (n = position / 4).  A one-token call's attention at V4's head width
 * runs k_attend_one: a head's two blocks hold a pass of five chunks' rows in shared memory and
 * sum every score of the pass before the softmax's chain, which needs the scores but which no
 * score needs, instead of waiting for each chunk's barriers in turn.  The linears of a decode
 * step are bound by how fast their weights stream in: k_linear_dense_split gives each output
 * of a dense linear (the compressors' and the indexer's projections, the head's logits) one
 * warp, with about 2 KiB of its weight loads in flight (one to four rounds of 32 chunks); the
 * grouped output projection, whose weight is FP8, runs k_linear_dense_f8_rows
 * (gpu_linear_dense_f8_rows.cuh: the token's x staged once per block with the weight's scale
 * folded in, one fma per weight); and k_linear_fp8_128_split streams a warp's weight codes
 * through a per-warp ring of cp.async copies in shared memory (3 KB per warp in flight while it
 * sums, the first copies issued before the block decodes x); its grid is sized for the
 * multiprocessors and the blocks that fit one (fp8_split_choose()): the steps
 * of a row pair of a short projection are shared by up to 8 warps, and a warp of a tall one
 * streams up to 8 row pairs in one stream of loads (the (row, K block) terms are exact, so
 * who computes them is free).
 *
 * ## The linears of a prefill
 *
 * The one-token kernels above give a token to a thread block or a warp, so a prefill of T
 * tokens streams and decodes every weight T times.  From 8 tokens on, the FP8 linears run
 * k_linear_fp8_tokens (gpu_linear_fp8_tokens.cuh: 32 tokens per block, the exact block
 * partials on the FP64 tensor cores) and the dense ones k_linear_dense_tokens
 * (gpu_linear_dense_tokens.cuh: a weight chunk decoded once for 8 tokens); both keep every bit.
 *
 * ## Expert parallelism
 *
 * One rank of an N-GPU forward (gfw_ep_part, src/ep/ep_gpu_forward.c) is this model with only
 * its block of routed experts uploaded.  The MoE sub-layer then computes the slot rows of the
 * pairs it holds (gfw_moe_rows() skips the others), hands the rows to the part's exchange,
 * which brings in the other ranks' rows, and combines as always: the same rows in the same
 * order, hence the unsplit bits.
 *
 * ## Attention within one call
 *
 * The oracle appends each token's kv to the window ring before that token attends.  Here all
 * T tokens of a call attend in parallel, so a window entry at a position of this call is read
 * from the call's kv buffer and an older one from the ring; the ring is updated after the
 * attention.  The compressor runs first, token by token in one block (its state is
 * sequential; the indexer's compressor in a second block of the same launch), and writes
 * every block completed in the call: a token reads only blocks j < (pos+1)/ratio, all
 * complete at its position, so the values read are the oracle's.
 *
 * ## One stream, one step record, one graph
 *
 * Every launch and copy of a call goes to the model's own stream (g->stream; the MoE's too,
 * gfw_fwd_moe.cuh), and a call ends by synchronizing that stream.  The stream is a blocking
 * one: the expert-parallel exchange, which copies on the legacy default stream, stays ordered
 * with it as it was when everything ran there.  One exception, joined before anything reads
 * it: a one-token call's MoE forks its shared expert onto g->side (moe_side(),
 * gfw_moe_rows_split(): an event recorded on g->stream and waited for on g->side, and back),
 * which a graph capture follows as two branches of the same graph; and so does a one-token
 * call's Sinkhorn of each sub-layer (sinkhorn_side(): the attention's joined before its output
 * projection, the MoE's behind the shared expert's branch, before the hc_post).
 *
 * What changes from call to call lives in device memory, the **step record** g->step: the
 * call's first position (int64) followed by its token ids (int32).  The host writes it into a
 * pinned copy (g->step_host) and the call's first operation copies it over (step_send()).  The
 * kernels that depend on the position read it there, never as an argument: k_q_kv_finish,
 * k_indexer_q_split (RoPE), k_compress (slot, "block complete", the output row),
 * k_indexer_scores and k_topk_split (the causal block count), k_attend and k_attend_one (window
 * and compressed lists) and k_ring_store (the ring slot); k_embed and the hash router read the ids.  The
 * one launch whose size follows the position, the indexer scores (one warp per causal
 * block), strides over the live count computed on the device, with a grid the host sizes for
 * the live count when it knows it and for max_blocks when it does not (both capped at
 * GFW_SCORES_CTAS_PER_SM CTAs per multiprocessor).  Each (token, block) score is
 * still computed by one warp with the same code, so the grid does not change a bit.
 *
 * With graphs on (mmoe_gpu_model_set_cuda_graph(), MMOE_GPU_GRAPH=1), a decode step (T = 1,
 * logits wanted, timing off, not a rank of an expert-parallel forward) is captured once, at
 * the first such call: step record copy, embedding, every layer, the head's mix, norm and
 * logits (graph_capture(), thread-local capture mode, so a forbidden call fails the capture
 * and is reported).  Every later decode step writes the record, launches the graph and copies
 * the logits out.  The graph holds only device addresses that live as long as the model and
 * shapes fixed by T = 1, so nothing invalidates it: mmoe_gpu_model_reset() refills the same
 * caches, a new sequence writes new positions into the same record; it is never re-captured,
 * and mmoe_gpu_model_destroy() frees it.  Prefill, the MTP block, timing runs and graphs off
 * run the same functions launched one by one, so both ways run identical kernels on identical
 * inputs.
 *
 * Every kernel is launched with programmatic dependent launch (mmoe_launch_pdl(), gpu_pdl.cuh;
 * a one-token k_attend or k_attend_one in clusters of two blocks, mmoe_launch_pdl_cluster())
 * (but the first kernel of a branch on the side stream, whose dependency crosses streams and is
 * a full one; a kernel after a join keeps its programmatic edge to the kernel before it on the
 * main stream, the join adding a full one) and first waits for the kernel before it
 * (gfw_pdl_enter()), so the next launch and the
 * dispatch of its blocks overlap the end of the one before, eagerly and inside the graph alike;
 * the one-token FP8 linears (k_linear_fp8_128_split, k_linear_dense_f8_rows) issue their first
 * weight loads before that wait, and the one-block kernels ask the L2 for their weights there
 * (k_rmsnorm's and the kv finish's norm weights, k_hc_pre_norm's fn chunks: gfw_prefetch_l2()),
 * as k_attend does for the kv rows of earlier calls, so that those reads, cold in every step,
 * do not wait after the kernel before.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_cp_async.cuh"
#include "gpu_forward_internal.h"
#include "gpu_forward_kernels.cuh"
#include "gpu_dense_f8_scaled.h"
#include "gpu_fwd_moe.cuh"
#include "mmoe_formats.h"
#include "mmoe_log1p.h"

namespace cg = cooperative_groups;

/* ================================================================== device structures */

/** A dense weight on the device. */
struct ddense {
    int dtype;              /**< gfw_dtype */
    const void *p;          /**< elements */
    const uint8_t *scale;   /**< F8 only */
    int64_t rows, cols;     /**< shape */
    /** @var ddense::rows
     *  shape: rows */
    int block;              /**< F8 only */
    int64_t scols;          /**< F8 only: scale columns */
    int nan_free;           /**< F8 only: 1 when no code is NaN (e4m3_codes_nan_free(), at upload) */
};

/** Bytes of one element of @p w (the device twin of gfw_dense_bytes()'s rule). */
__device__ __forceinline__ int ddense_elem_bytes(const ddense &w)
{
    return w.dtype == GFW_F32 ? 4 : w.dtype == GFW_BF16 ? 2 : 1;
}

/**
 * Ask the L2 for the first @p n elements of @p w (a norm's weight) by all threads of the block,
 * one 128-byte line each in turn: before a kernel's programmatic wait, so that a one-block
 * kernel finds its weight in the L2 when the kernel before is done.
 */
__device__ __forceinline__ void ddense_prefetch_l2(const ddense &w, int64_t n)
{
    if (w.p == NULL)
        return;
    const int64_t bytes = n * ddense_elem_bytes(w);
    for (int64_t off = (int64_t)threadIdx.x * 128; off < bytes; off += (int64_t)blockDim.x * 128)
        gfw_prefetch_l2((const uint8_t *)w.p + off);
}

/** An FP8 linear on the device. */
struct dfp8 {
    const uint8_t *w, *s;   /**< codes [N, K], scale bytes */
    int64_t N, K;           /**< shape */
    /** @var dfp8::w
     *  codes [N, K]
     *  @var dfp8::N
     *  shape: output width */
    int block;              /**< scale block */
    int64_t scols;          /**< scale columns */
    int nan_free;           /**< 1 when no code is NaN (e4m3_codes_nan_free(), at upload): no NaN tests */
};

/** E4M3 decode table (the oracle's values). */
__constant__ float c_e4m3[256];

/**
 * E4M3 code -> fp32, the table's value: normal codes build the bits (2^(e-7) (1 + m/8)),
 * subnormal ones are m 2^-9 with the sign (so 0x80 is -0), and only the two NaN codes read the
 * table (a constant-memory read with 32 different addresses in a warp would serialize).
 */
__device__ __forceinline__ float gfw_e4m3_value(uint32_t code)
{
    if ((code & 0x7Fu) == 0x7Fu)
        return c_e4m3[code & 0xFFu];
    const uint32_t e = (code >> 3) & 15u, m = code & 7u;
    const float mag = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : __fmul_rn((float)m, 0x1p-9f);
    return __uint_as_float(__float_as_uint(mag) | ((code & 0x80u) << 24));
}

/**
 * The oracle's weight of FP8 code @p code under scale @p scale (a UE8M0 value, gfw_ue8m0()): the
 * fp32 product rounded to bf16, as the oracle dequantizes the grouped output projection.
 */
__device__ __forceinline__ float gfw_f8_weight(uint32_t code, float scale)
{
    return gfw_bfr(__fmul_rn(gfw_e4m3_value(code), scale));
}

/** 2^@p e as a double, for e in -1022 .. 1023 (its bits). */
__device__ __forceinline__ double gfw_pow2(int e)
{
    return __longlong_as_double((long long)(e + 1023) << 52);
}

/** Element (r, k) of a dense weight as the oracle's dense linear reads it. */
__device__ __forceinline__ double dd_at(const ddense &w, int64_t r, int64_t k)
{
    const int64_t i = r * w.cols + k;
    if (w.dtype == GFW_BF16)
        return (double)gfw_bf2f(((const uint16_t *)w.p)[i]);
    if (w.dtype == GFW_F32)
        return (double)((const float *)w.p)[i];
    const int blk = w.block;
    return (double)gfw_f8_weight(((const uint8_t *)w.p)[i],
                                 gfw_ue8m0(w.scale[(int64_t)((int)r / blk) * w.scols + (int)k / blk]));
}

/** Element i of a vector (BF16 or F32) as fp32. */
__device__ __forceinline__ float dv_at(const ddense &w, int64_t i)
{
    return w.dtype == GFW_F32 ? ((const float *)w.p)[i] : gfw_bf2f(((const uint16_t *)w.p)[i]);
}

/** Warp sum of doubles (butterfly: every lane gets the same value). */
__device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* ================================================================== kernels: embedding, norms, linears */

/**
 * X[t, j, :] = E[ids[t], :] for j < hc (hc = 1: the plain embedding): token blockIdx.y, one
 * channel per thread over the blocks blockIdx.x (launch_embed()), so each thread waits for one
 * load of the table and no more (a loop over the row would wait for each of its loads in turn:
 * the stores to X keep the next load behind them).
 */
__global__ void k_embed(const uint16_t *E, const int32_t *ids, int64_t D, int hc, uint16_t *X)
{
    gfw_pdl_enter();
    const int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D)
        return;
    const uint16_t v = E[(int64_t)ids[t] * D + c];
    for (int j = 0; j < hc; j++)
        X[(t * hc + j) * D + c] = v;
}

/**
 * sumsq / n in double for n >= 1.  A power of two n = 2^k (the model's widths) takes the
 * product by 2^-k, an exact double for k <= 1022, instead of the division's long sequence: both
 * round the same exact value (sumsq 2^-k) to nearest even, so the bits are the same, specials
 * included (+-0, +-inf and NaN stay what they are).
 */
__device__ __forceinline__ double rms_mean(double sumsq, int64_t n)
{
    if ((n & (n - 1)) != 0)
        return __ddiv_rn(sumsq, (double)n);
    const int k = __ffsll((long long)n) - 1;
    return __dmul_rn(sumsq, __longlong_as_double((long long)(1023 - k) << 52));
}

/** 1 / sqrt(fp32(sumsq / n) + eps): the RMSNorm factor of rmsnorm.c from its double sum of squares. */
__device__ __forceinline__ float rms_factor(double sumsq, int64_t n, float eps)
{
    const float mean = __double2float_rn(rms_mean(sumsq, n));
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

/** The square of bf16 value i of @p x, exact in double. */
struct sq_term {
    const uint16_t *x; /**< the values */
    /** Term @p i: x_i^2. */
    __device__ double operator()(int64_t i) const
    {
        const double v = (double)gfw_bf2f(x[i]);
        return __dmul_rn(v, v);
    }
};

/** Larger of two FP8 amax candidates where any NaN wins (k_act_quant's rule; the result does not depend on order). */
__device__ __forceinline__ float amax_nan(float a, float o) { return isnan(a) ? a : (isnan(o) ? o : (o > a ? o : a)); }

/**
 * k_act_quant of a chunk of 16 normed values @p yb (bf16 bits; @p len of them, 0 or 16) that
 * k_rmsnorm's thread holds, for row @p row of width n (a multiple of 128): the 8 threads of a
 * 128-block (aligned lanes of one warp) take its amax by xor shuffles, then the V4 scale
 * s = 2^ceil(log2(max(amax, 1e-4) * fl(1/448))) and each thread's 16 codes e4m3(clamp(y/s)),
 * the quotient as the product by the exact 1/s (gfw_ue8m0_inv()), stored as one 16-byte vector
 * when q's chunk is aligned for it (with @p q; @p qs gets s).  With @p mq, the same quantization
 * is also the MoE's input as gpu_fwd_moe.cu's k_moe_in writes it (the same rule and bits, its
 * moe_quant128()): the values y into @p mb and e4m3(y/s) s into @p mq, both chain-major
 * (gfw_moe_chain_pos()).  Every lane of the warp must call it.
 */
__device__ __forceinline__ void rmsnorm_chunk_quant(const uint16_t *yb, int len, int64_t row, int64_t n, uint8_t *q,
                                                    float *qs, float *mb, float *mq)
{
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < MMOE_SUM_CHUNK; i++)
        if (i < len)
            a = amax_nan(a, fabsf(gfw_bf2f(yb[i])));
    for (int s = 1; s < 128 / MMOE_SUM_CHUNK; s <<= 1)
        a = amax_nan(a, __shfl_xor_sync(0xFFFFFFFFu, a, s));
    if (len == 0)
        return;
    const float clamped = a < 1e-4f ? 1e-4f : a;
    const uint8_t e = gfw_ue8m0_ceil_clamped(__fmul_rn(clamped, 1.0f / 448.0f));
    const float sc = gfw_ue8m0(e), inv = gfw_ue8m0_inv(e);
    const int64_t i0 = (int64_t)threadIdx.x * MMOE_SUM_CHUNK;
    uint8_t code[MMOE_SUM_CHUNK];
#pragma unroll
    for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
        float w = __fmul_rn(gfw_bf2f(yb[i]), inv);
        w = w > 448.0f ? 448.0f : (w < -448.0f ? -448.0f : w);
        code[i] = gfw_e4m3_code(w);
    }
    if (mq != NULL) { /* values i and i + 8 of the chunk are neighbours in chain i: one 8-byte store each */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int64_t o = row * n + gfw_moe_chain_pos(i0 + i, n); /* even: i0 / 8 is */
            *(float2 *)(mb + o) = make_float2(gfw_bf2f(yb[i]), gfw_bf2f(yb[i + 8]));
            *(float2 *)(mq + o) = make_float2(__fmul_rn(gfw_e4m3_to_f32(code[i]), sc),
                                              __fmul_rn(gfw_e4m3_to_f32(code[i + 8]), sc));
        }
    }
    if (q == NULL)
        return;
    uint8_t *qc = q + row * n + i0;
    if (gfw_aligned16(qc)) {
        uint32_t word[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            word[j] = (uint32_t)code[4 * j] | ((uint32_t)code[4 * j + 1] << 8) | ((uint32_t)code[4 * j + 2] << 16) |
                      ((uint32_t)code[4 * j + 3] << 24);
        *(uint4 *)qc = make_uint4(word[0], word[1], word[2], word[3]);
    } else {
#pragma unroll
        for (int i = 0; i < MMOE_SUM_CHUNK; i++)
            qc[i] = code[i];
    }
    if ((threadIdx.x & 7) == 0)
        qs[row * (n / 128) + i0 / 128] = sc;
}

/**
 * Chunk @p i0 (16 values from index i0, all inside the row) of a row of bf16 values @p xr and
 * of the weight @p w, as fp32, in 16-byte vector loads when both are aligned for them (two for
 * x, two or four for w), else value by value: the same values either way.
 */
__device__ __forceinline__ void rmsnorm_load_chunk(const uint16_t *xr, const ddense &w, int64_t i0, float *xv,
                                                   float *wv)
{
    const uint16_t *xc = xr + i0;
    const void *wc = w.dtype == GFW_F32 ? (const void *)((const float *)w.p + i0)
                                        : (const void *)((const uint16_t *)w.p + i0);
    if (!gfw_aligned16(xc) || !gfw_aligned16(wc)) {
#pragma unroll
        for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
            xv[i] = gfw_bf2f(xc[i]);
            wv[i] = dv_at(w, i0 + i);
        }
        return;
    }
    gfw_load_bf16x16(xc, xv);
    if (w.dtype == GFW_F32) {
        gfw_load_f32x16((const float *)wc, wv);
    } else {
        gfw_load_bf16x16((const uint16_t *)wc, wv);
    }
}

/**
 * RMSNorm of rows of width n, one block per row: y = bf16(w * (x * rsqrt(mean + eps))); y may
 * alias x.  The squares are summed by the whole block in the order of @ref spec_arch_sum_order.
 *
 * When the block has a thread per chunk of 16 (rmsnorm_threads() launches so up to 8192
 * values), thread b holds chunk b: it loads the chunk's 16 values of x and of w at once, sums
 * the chunk (gfw_chunk_sum's order), joins the block's tree and writes the same 16 values of y,
 * so the row costs one wait for memory, not one per value of a strided loop (whose stores to
 * y, which may alias x, keep every next load behind them).  A whole chunk moves in 16-byte
 * vectors where its addresses allow (rmsnorm_load_chunk(), gfw_store_bf16x16()): a warp's
 * loads of x are then 1 KiB in 64 fully used sectors, instead of 16 loads of 2 bytes a lane
 * that each touch 32 sectors for 64 useful bytes.  Wider rows take the strided loop.
 *
 * With @p q (only on the register path, n a multiple of 128: rmsnorm_quant()), the block also
 * quantizes y as k_act_quant does, codes into q [rows, n] and scales into @p qs [rows, n/128]
 * (rmsnorm_chunk_quant()), which saves that kernel's launch and its read of y.  With @p mq
 * (the same path: rmsnorm_moe_in()) it writes the MoE's two inputs as k_moe_in does, y as fp32
 * into @p mb and its 1x128 quantized values into @p mq, both [rows][8][n/8] (chain-major).
 */
__global__ void k_rmsnorm(const uint16_t *x, int64_t n, ddense w, float eps, uint16_t *y, uint8_t *q, float *qs,
                          float *mb, float *mq)
{
    ddense_prefetch_l2(w, n);
    gfw_pdl_enter();
    __shared__ double sh[33];
    const uint16_t *xr = x + (int64_t)blockIdx.x * n;
    uint16_t *yr = y + (int64_t)blockIdx.x * n;
    if (gfw_chunks_per_lane(n, blockDim.x) == 1) {
        const int64_t i0 = (int64_t)threadIdx.x * MMOE_SUM_CHUNK;
        const int len = i0 >= n ? 0 : (n - i0 < MMOE_SUM_CHUNK ? (int)(n - i0) : MMOE_SUM_CHUNK);
        float xv[MMOE_SUM_CHUNK], wv[MMOE_SUM_CHUNK];
        if (len == MMOE_SUM_CHUNK) {
            rmsnorm_load_chunk(xr, w, i0, xv, wv);
        } else {
#pragma unroll
            for (int i = 0; i < MMOE_SUM_CHUNK; i++)
                if (i < len) {
                    xv[i] = gfw_bf2f(xr[i0 + i]);
                    wv[i] = dv_at(w, i0 + i);
                }
        }
        double chunk = 0.0;
#pragma unroll
        for (int i = 0; i < MMOE_SUM_CHUNK; i++)
            if (i < len)
                chunk = __dadd_rn(chunk, __dmul_rn((double)xv[i], (double)xv[i]));
        const float rs = rms_factor(gfw_block_tree(chunk, sh), n, eps);
        uint16_t yb[MMOE_SUM_CHUNK];
#pragma unroll
        for (int i = 0; i < MMOE_SUM_CHUNK; i++)
            if (i < len)
                yb[i] = gfw_f2bf(__fmul_rn(wv[i], __fmul_rn(xv[i], rs)));
        if (len == MMOE_SUM_CHUNK && gfw_aligned16(yr + i0)) {
            gfw_store_bf16x16(yr + i0, yb);
        } else {
#pragma unroll
            for (int i = 0; i < MMOE_SUM_CHUNK; i++)
                if (i < len)
                    yr[i0 + i] = yb[i];
        }
        if (q != NULL || mq != NULL)
            rmsnorm_chunk_quant(yb, len, blockIdx.x, n, q, qs, mb, mq);
        return;
    }
    const float rs = rms_factor(gfw_block_sum(sq_term{xr}, n, sh), n, eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = gfw_f2bf(__fmul_rn(dv_at(w, i), __fmul_rn(gfw_bf2f(xr[i]), rs)));
}

/**
 * Quantize rows of width K (multiple of 128) to E4M3 with one UE8M0 scale per 128 (V4 rule:
 * s = 2^ceil(log2(max(amax, 1e-4) * fl(1/448))), q = e4m3(clamp(x/s, +-448))).  One block of
 * 128 threads per (row, 128-block).  @p q codes [rows, K], @p s fp32 scale values [rows, K/128].
 */
__global__ void k_act_quant(const uint16_t *x, int64_t K, uint8_t *q, float *s)
{
    gfw_pdl_enter();
    __shared__ float red[4];
    const int64_t row = blockIdx.y, kb = blockIdx.x;
    const int64_t i = row * K + kb * 128 + threadIdx.x;
    const float v = gfw_bf2f(x[i]);
    /* amax with the oracle's rule (any NaN makes it NaN; which one does not change the scale) */
    const float wmax = gfw_warp_amax_nan(fabsf(v));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = wmax;
    __syncthreads();
    if (threadIdx.x == 0) {
        float amax = red[0];
        for (int k = 1; k < 4; k++)
            amax = isnan(amax) ? amax : (isnan(red[k]) ? red[k] : (red[k] > amax ? red[k] : amax));
        const float clamped = amax < 1e-4f ? 1e-4f : amax;
        red[0] = gfw_ue8m0(gfw_ue8m0_ceil_clamped(__fmul_rn(clamped, 1.0f / 448.0f)));
    }
    __syncthreads();
    const float sc = red[0];
    float w = __fdiv_rn(v, sc);
    w = w > 448.0f ? 448.0f : (w < -448.0f ? -448.0f : w);
    q[i] = gfw_e4m3_code(w);
    if (threadIdx.x == 0)
        s[row * (K / 128) + kb] = sc;
}

/** K blocks of 128 whose codes k_linear_fp8 loads at once. */
#define GFW_FP8_BATCH 8

/**
 * y[t, n] = bf16(sum_kb fl(partial_kb) * (s_x * s_w)) with the exact block partials of
 * linear_fp8.c: one warp per output; the lanes' double partial sums of E4M3 products are
 * exact, so their reduction order does not matter.  The forward's linears (128-blocks) run
 * k_linear_fp8_128_split; this kernel serves other scale blocks and x rows wider than its shared
 * memory (see launch_linear_fp8()).
 */
__global__ void k_linear_fp8(const uint8_t *xq, const float *xs, int64_t T, dfp8 w, uint16_t *y)
{
    gfw_pdl_enter();
    const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (warp >= T * w.N)
        return;
    const int64_t t = warp / w.N, n = warp % w.N;
    const int64_t K = w.K, kb_w = K / w.block;
    const uint8_t *xr = xq + t * K, *wr = w.w + n * K;
    float acc = 0.0f;
    if (w.block == 128) {
        /* 4 contiguous codes per lane and block; the codes of GFW_FP8_BATCH blocks are loaded
           before any is summed, so that the loads are in flight together */
        for (int64_t kb0 = 0; kb0 < kb_w; kb0 += GFW_FP8_BATCH) {
            uint32_t xa[GFW_FP8_BATCH], wa[GFW_FP8_BATCH];
#pragma unroll
            for (int u = 0; u < GFW_FP8_BATCH; u++) {
                const int64_t k0 = (kb0 + u) * 128 + (int64_t)lane * 4;
                xa[u] = kb0 + u < kb_w ? *(const uint32_t *)(xr + k0) : 0u;
                wa[u] = kb0 + u < kb_w ? *(const uint32_t *)(wr + k0) : 0u;
            }
#pragma unroll
            for (int u = 0; u < GFW_FP8_BATCH; u++) {
                if (kb0 + u >= kb_w)
                    break;
                double part = 0.0;
                for (int i = 0; i < 4; i++)
                    part += (double)gfw_e4m3_value((xa[u] >> (8 * i)) & 0xFF) *
                            (double)gfw_e4m3_value((wa[u] >> (8 * i)) & 0xFF);
                part = warp_sum(part); /* exact: the order of the additions does not matter */
                const float s_x = xs[t * (K / 128) + kb0 + u];
                const float s_w = gfw_ue8m0(w.s[(n / 128) * w.scols + kb0 + u]);
                acc = __fadd_rn(acc, __fmul_rn(__double2float_rn(part), __fmul_rn(s_x, s_w)));
            }
        }
    } else {
        const int per_lane = w.block / 32; /* 1 code per lane for 32-blocks */
        for (int64_t kb = 0; kb < kb_w; kb++) {
            double part = 0.0;
            const int64_t k0 = kb * w.block + (int64_t)lane * per_lane;
            for (int i = 0; i < per_lane; i++)
                part += (double)gfw_e4m3_value(xr[k0 + i]) * (double)gfw_e4m3_value(wr[k0 + i]);
            part = warp_sum(part); /* exact: the order of the additions does not matter */
            const float s_x = xs[t * (K / 128) + kb * w.block / 128];
            const float s_w = gfw_ue8m0(w.s[(n / w.block) * w.scols + kb]);
            acc = __fadd_rn(acc, __fmul_rn(__double2float_rn(part), __fmul_rn(s_x, s_w)));
        }
    }
    if (lane == 0)
        y[t * w.N + n] = gfw_f2bf(acc);
}

/* ------------------------------------------------------------------ the 128-block FP8 linear */

/** Outputs (weight rows) of one warp of k_linear_fp8_128_split: the two rows share the x values. */
#define GFW_FP8_ROWS 2
/** Warps of one k_linear_fp8_128_split block (one token, GFW_FP8_ROWS * GFW_FP8_WARPS outputs). */
#define GFW_FP8_WARPS 8
/** Dynamic shared memory k_linear_fp8_128_split may use (the limit set in upload_tables()). */
#define GFW_FP8_SMEM_MAX (192 * 1024)

/** The dynamic shared memory of k_linear_fp8_128_split: the x row, the warps' copy rings, then the block terms. */
__device__ __forceinline__ double *fp8_sx_row()
{
    extern __shared__ __align__(16) double fp8_sx[];
    return fp8_sx;
}

/**
 * Shared-memory index of x value k: the values are stored in the order the lanes read them.
 * Within step s (values [512 s, 512 s + 512)) lane l sums values [16 l, 16 l + 16) as 8 pairs;
 * pair j of all 32 lanes is one run of 32 16-byte slots, so a warp's read of pair j is 512
 * contiguous bytes (four wavefronts, no bank conflict) at an offset the code fixes (j * 512
 * bytes from the lane's base): index = 512 s + 64 j + 2 l + (k mod 2).  The row takes
 * 512 ceil(K / 512) doubles (a short last step leaves holes no lane reads).
 */
__device__ __forceinline__ int fp8_x_slot(int k)
{
    return (k & ~511) | (((k >> 1) & 7) << 6) | (((k >> 4) & 31) << 1) | (k & 1);
}

/**
 * The E4M3 code in byte @p I of @p w as the double of its value times 2^-1016, exactly, from
 * @p w and @p w1 = w << 1 in two integer instructions.  Placing the code's seven magnitude
 * bits eeeemmm at bits 55..49 of a double gives exponent field e and mantissa m/8: a normal
 * code (e > 0) becomes (1 + m/8) 2^(e - 1023) = (1 + m/8) 2^(e-7) 2^-1016, a subnormal one the
 * double subnormal m 2^49 2^-1074 = m 2^-9 2^-1016: one factor for all.  prmt puts byte I of
 * w1 (the magnitude, shifted left by one) at bits 23..16 of the high word and byte I of w (its
 * top bit the sign) at bits 31..24; the mask keeps bit 31 and bits 23..17.  The NaN codes
 * (0x7F, 0xFF) come out as finite values: the caller tests them.
 */
template <int I>
__device__ __forceinline__ double e4m3_times_2m1016(uint32_t w, uint32_t w1)
{
    uint32_t hi;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(hi) : "r"(w1), "r"(w), "n"(((4 + I) << 12) | (I << 8)));
    return __hiloint2double((int)(hi & 0x80FE0000u), 0);
}

/**
 * Any NaN code (low seven bits all set) among the four codes of @p w, as bit 7 of a byte of
 * the result: adding 1 to a byte's low seven bits carries into its bit 7 only from 0x7F, and
 * never into the next byte.
 */
__device__ __forceinline__ uint32_t e4m3_nan_bits(uint32_t w)
{
    return ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

/** Whether any of the 16 codes of @p q (four per word) is NaN. */
__device__ __forceinline__ bool e4m3_has_nan16(uint4 q)
{
    return (e4m3_nan_bits(q.x) | e4m3_nan_bits(q.y) | e4m3_nan_bits(q.z) | e4m3_nan_bits(q.w)) != 0u;
}

/* The many-token FP8 linear (its own chapter), which needs dfp8, gfw_e4m3_value(),
   e4m3_times_2m1016() and e4m3_nan_bits() above. */
#include "gpu_linear_fp8_tokens.cuh"

/**
 * The lane's sums of its 16 products for both weight rows of a unit: x pairs from the lane's
 * slots of the shared row (@p xl: pair j at xl[32 j], fp8_x_slot()), codes @p q0 and @p q1.
 * Every product x w 2^-1016 is an integer multiple of 2^-1034 below 2^(17.7-1016) in magnitude,
 * so each fma and each addition is exact (see k_linear_fp8_128_split): the products of words
 * 0, 2 and of words 1, 3 run in two independent chains per row, added at the end.  With
 * @p NAN_TEST a NaN code makes the row's sum NaN; without it (a weight that has no NaN code,
 * dfp8::nan_free) the tests are left out.
 */
template <bool NAN_TEST>
__device__ __forceinline__ void fp8_pair_sums(const double2 *xl, uint4 q0, uint4 q1, double *p0, double *p1)
{
    const uint32_t w0[4] = {q0.x, q0.y, q0.z, q0.w}, w1[4] = {q1.x, q1.y, q1.z, q1.w};
    double c0[2] = {0.0, 0.0}, c1[2] = {0.0, 0.0};
    uint32_t nan0 = 0, nan1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const double2 a = xl[32 * (2 * i)], b = xl[32 * (2 * i + 1)];
        const uint32_t u = w0[i], u1 = u << 1, v = w1[i], v1 = v << 1;
        double &r0 = c0[i & 1], &r1 = c1[i & 1];
        r0 = __fma_rn(a.x, e4m3_times_2m1016<0>(u, u1), r0);
        r1 = __fma_rn(a.x, e4m3_times_2m1016<0>(v, v1), r1);
        r0 = __fma_rn(a.y, e4m3_times_2m1016<1>(u, u1), r0);
        r1 = __fma_rn(a.y, e4m3_times_2m1016<1>(v, v1), r1);
        r0 = __fma_rn(b.x, e4m3_times_2m1016<2>(u, u1), r0);
        r1 = __fma_rn(b.x, e4m3_times_2m1016<2>(v, v1), r1);
        r0 = __fma_rn(b.y, e4m3_times_2m1016<3>(u, u1), r0);
        r1 = __fma_rn(b.y, e4m3_times_2m1016<3>(v, v1), r1);
        if (NAN_TEST) {
            nan0 |= e4m3_nan_bits(u);
            nan1 |= e4m3_nan_bits(v);
        }
    }
    *p0 = nan0 ? __longlong_as_double(0x7FF8000000000000LL) : c0[0] + c0[1];
    *p1 = nan1 ? __longlong_as_double(0x7FF8000000000000LL) : c1[0] + c1[1];
}

/**
 * The eight lanes of a scale block add their sums @p p0, @p p1 in a butterfly transposed over
 * the two rows (after the first exchange lane l keeps row (l >> 2) & 1; exact sums), and lane
 * l with l mod 4 = 0 gets the (row, block) partial times 2^-1016.
 */
__device__ __forceinline__ double fp8_block_sum(int row, double p0, double p1)
{
    double v = (row ? p1 : p0) + __shfl_xor_sync(0xFFFFFFFFu, row ? p0 : p1, 4);
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
    v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
    return v;
}

/**
 * Blocks per multiprocessor k_linear_fp8_128_split is compiled for and shapes its grids for
 * (fp8_split_choose()): three, so 76 registers.  Four (64 registers, the register file full)
 * gave V4-Flash's one-token wq_b 512 blocks of 4 row pairs per warp, one in every slot of the
 * device; three give it 256 blocks of 8 pairs, the same units on the busiest multiprocessor and
 * as fast alone, but a graphed decode step about 2% faster (docs/perf.md, "Eleventh pass": the
 * same with four blocks' registers and three blocks' grids), which points at the room the
 * kernels after it find free on each multiprocessor.
 */
#define GFW_FP8_SPLIT_BLOCKS_PER_SM 3
/** Most row pairs one warp of k_linear_fp8_128_split streams one after the other. */
#define GFW_FP8_SPLIT_PAIRS_MAX 8
/** Most bytes of block terms per k_linear_fp8_128_split block (bounds the row pairs per warp). */
#define GFW_FP8_SPLIT_TERM_BYTES (8 * 1024)
/** Bytes of one unit of k_linear_fp8_128_split: one 512-code step of a row pair. */
#define GFW_FP8_UNIT_BYTES (GFW_FP8_ROWS * 512)
/** Units in a warp's copy ring (GFW_FP8_RING - 1 of them in flight while the warp sums one). */
#define GFW_FP8_RING 4
/** Shared memory of one multiprocessor on sm_90 and sm_100. */
#define GFW_FP8_SM_SMEM (228 * 1024)
/** Shared memory the hardware keeps for each resident block. */
#define GFW_FP8_BLOCK_RESERVED 1024

/**
 * How the GFW_FP8_WARPS warps of a k_linear_fp8_128_split block share its rows: every warp
 * streams `pairs` row pairs one after the other, and `slices` warps share one row pair, each
 * summing its own slice of the pair's 512-code steps (pairs > 1 only with slices == 1).
 */
struct fp8_split_shape {
    int pairs;  /**< row pairs per warp */
    int slices; /**< warps per row pair */
};

/** Rows of one k_linear_fp8_128_split block. */
__host__ __device__ __forceinline__ int64_t fp8_split_rows(fp8_split_shape sh)
{
    return (int64_t)GFW_FP8_ROWS * GFW_FP8_WARPS * sh.pairs / sh.slices;
}

/** Doubles of the shared x row of k_linear_fp8_128_split: whole 512-value steps (fp8_x_slot()). */
__host__ __device__ __forceinline__ int64_t fp8_x_row_len(int64_t K)
{
    return (K + 511) / 512 * 512;
}

/** Bytes of the x row and the warps' copy rings, the part of the shared memory the shape does not change. */
__host__ __device__ __forceinline__ int64_t fp8_split_fixed_smem(int64_t K)
{
    return (int64_t)sizeof(double) * fp8_x_row_len(K) + (int64_t)GFW_FP8_WARPS * GFW_FP8_RING * GFW_FP8_UNIT_BYTES;
}

/** Dynamic shared memory of k_linear_fp8_128_split: the x row, the warps' rings, then a term per (row, K block). */
static size_t fp8_split_smem(int64_t K, fp8_split_shape sh)
{
    return (size_t)fp8_split_fixed_smem(K) + sizeof(float) * (size_t)(fp8_split_rows(sh) * (K / 128));
}

/** The least dynamic shared memory of k_linear_fp8_128_split for input width K (one row pair per warp). */
static size_t fp8_128_smem(int64_t K)
{
    return fp8_split_smem(K, fp8_split_shape{1, 1});
}

/**
 * Blocks of k_linear_fp8_128_split that fit one multiprocessor's shared memory for input
 * width K (at least the least shape's, at most GFW_FP8_SPLIT_BLOCKS_PER_SM), and the bytes of
 * block terms each may then hold (@p term_bytes, at most GFW_FP8_SPLIT_TERM_BYTES).
 */
static int fp8_split_blocks_per_sm(int64_t K, int64_t *term_bytes)
{
    const int64_t least_terms = (int64_t)sizeof(float) * fp8_split_rows(fp8_split_shape{1, 1}) * (K / 128);
    int b = GFW_FP8_SPLIT_BLOCKS_PER_SM;
    while (b > 1 && GFW_FP8_SM_SMEM / b - GFW_FP8_BLOCK_RESERVED - fp8_split_fixed_smem(K) < least_terms)
        b--;
    const int64_t room = GFW_FP8_SM_SMEM / b - GFW_FP8_BLOCK_RESERVED - fp8_split_fixed_smem(K);
    *term_bytes = room < GFW_FP8_SPLIT_TERM_BYTES ? (room > least_terms ? room : least_terms) : GFW_FP8_SPLIT_TERM_BYTES;
    return b;
}

/**
 * The largest number of blocks of @p blocks that one of @p n_sm multiprocessors runs when
 * they are spread evenly: ceil(blocks / n_sm).
 */
static int64_t fp8_split_blocks_on_busiest(int64_t blocks, int64_t n_sm)
{
    return (blocks + n_sm - 1) / n_sm;
}

/**
 * The shape of k_linear_fp8_128_split for T tokens of an [N, K] weight on @p n_sm
 * multiprocessors.  One warp per row pair gives T ceil(N / 16) blocks.  When they are fewer
 * than the blocks that run at once (fp8_split_blocks_per_sm() per multiprocessor: three up to
 * K = 4096, two at K = 8192), the steps of a pair are split over 2, 4 or 8
 * warps (as long as the grid still runs at once and every slice gets a step), so that a short
 * wide projection (V4-Flash's wq_a, wkv) still reaches every multiprocessor.  When there are
 * more, each warp streams p row pairs, p from ceil(blocks / slots) (one wave) up to
 * GFW_FP8_SPLIT_PAIRS_MAX and the terms that still let the blocks fit, chosen to give the
 * busiest multiprocessor the fewest units (p times its ceil(grid / n_sm) blocks; the smallest
 * such p), so that a tall one (wq_b) runs in one wave that loads the multiprocessors evenly and
 * whose warps keep their copies in flight from pair to pair instead of many short blocks each
 * waiting for its first.  V4-Flash at T = 1 on 132 multiprocessors: wq_a (1024 x 4096) 4
 * slices, 256 blocks; wkv (512 x 4096) 8 slices, 256 blocks; wq_b (32768 x 1024) 8 pairs, 256
 * blocks, two per multiprocessor (6 pairs, 342 blocks, would give 78 of them 3 blocks of 12
 * units per warp, 36 units against 32); the indexer's wq_b (8192 x 1024) 2 pairs, 256 blocks;
 * wo_b (4096 x 8192) one pair, 256 blocks, two per multiprocessor.
 */
static fp8_split_shape fp8_split_choose(int64_t T, int64_t N, int64_t K, int n_sm)
{
    int64_t term_bytes = 0;
    const int64_t sms = n_sm > 0 ? n_sm : 1;
    const int64_t slots = sms * fp8_split_blocks_per_sm(K, &term_bytes);
    const int64_t nsteps = (K + 511) / 512, kb_w = K / 128;
    fp8_split_shape sh = {1, 1};
    const int64_t base = T * ((N + fp8_split_rows(sh) - 1) / fp8_split_rows(sh));
    if (base > slots) {
        const int64_t p_smem = term_bytes / ((int64_t)sizeof(float) * fp8_split_rows(sh) * (kb_w > 0 ? kb_w : 1));
        int64_t p_max = p_smem < GFW_FP8_SPLIT_PAIRS_MAX ? p_smem : GFW_FP8_SPLIT_PAIRS_MAX;
        p_max = p_max > 1 ? p_max : 1;
        const int64_t one_wave = (base + slots - 1) / slots;
        const int64_t p_min = one_wave < p_max ? one_wave : p_max;
        int64_t best = 0, best_units = 0;
        for (int64_t p = p_min; p <= p_max; p++) {
            const int64_t rows = fp8_split_rows(fp8_split_shape{(int)p, 1});
            const int64_t units = p * fp8_split_blocks_on_busiest(T * ((N + rows - 1) / rows), sms);
            if (best == 0 || units < best_units)
                best = p, best_units = units;
        }
        sh.pairs = (int)best;
    } else {
        for (;;) {
            const fp8_split_shape next = {1, 2 * sh.slices};
            const int64_t rows = fp8_split_rows(next);
            if (next.slices > GFW_FP8_WARPS || next.slices > nsteps || T * ((N + rows - 1) / rows) > slots)
                break;
            sh = next;
        }
    }
    return sh;
}

/**
 * hc_post of channel c of token t: X[t,k,c] = bf16(post[k]*o + sum_j comb[j][k] * R[t,j,c])
 * (j ascending, fp32; R the streams before the update; @p o the sub-layer's output out[t, c]),
 * in place.  The hc stream values, the comb matrix and post are loaded once into registers,
 * all before the first product (the loops have fixed bounds: HC > 0 fixes hc at compile time,
 * HC = 0 takes @p hc_rt <= 8 behind predicates), so the thread waits for memory once; the
 * operations and their order are those of mmoe_hc_post.
 */
template <int HC>
__device__ __forceinline__ void hc_post_channel(float o, uint16_t *X, int64_t t, int64_t c, int64_t D, int hc_rt,
                                                const float *post, const float *comb)
{
    constexpr int NMAX = HC > 0 ? HC : 8;
    const int hc = HC > 0 ? HC : hc_rt;
    uint16_t *Xt = X + t * hc * D;
    const float *C = comb + t * hc * hc;
    float xv[NMAX], pv[NMAX], cv[NMAX][NMAX];
#pragma unroll
    for (int j = 0; j < NMAX; j++)
        if (j < hc) {
            xv[j] = gfw_bf2f(Xt[j * D + c]);
            pv[j] = post[t * hc + j];
#pragma unroll
            for (int k = 0; k < NMAX; k++)
                if (k < hc)
                    cv[j][k] = C[j * hc + k];
        }
    float res[NMAX];
#pragma unroll
    for (int k = 0; k < NMAX; k++)
        if (k < hc) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < NMAX; j++)
                if (j < hc)
                    acc = __fadd_rn(acc, __fmul_rn(cv[j][k], xv[j]));
            res[k] = __fadd_rn(__fmul_rn(pv[k], o), acc);
        }
#pragma unroll
    for (int k = 0; k < NMAX; k++)
        if (k < hc)
            Xt[k * D + c] = gfw_f2bf(res[k]);
}

/** hc_post_channel() with hc fixed at compile time for the model's hc = 4, else at run time. */
__device__ __forceinline__ void hc_post_channel_any(float o, uint16_t *X, int64_t t, int64_t c, int64_t D, int hc,
                                                    const float *post, const float *comb)
{
    if (hc == 4)
        hc_post_channel<4>(o, X, t, c, D, hc, post, comb);
    else
        hc_post_channel<0>(o, X, t, c, D, hc, post, comb);
}

/** The mHC width of the FP8 linear's hc_post epilogue (compiled for the model's 4 streams only). */
#define GFW_FP8_HC_POST_HC 4

/**
 * An hc_post applied to a linear's output as it is written (the attention's wo_b, whose outputs
 * are the sub-layer's: output n of token t is channel n): X NULL for none.
 */
struct fp8_hc_post {
    uint16_t *X;       /**< the streams [T, GFW_FP8_HC_POST_HC, D], updated in place */
    const float *post; /**< [T, hc] */
    const float *comb; /**< [T, hc, hc] */
    int hc;            /**< streams (GFW_FP8_HC_POST_HC where X is given) */
};

/** No hc_post after the linear. */
__host__ __device__ __forceinline__ fp8_hc_post fp8_no_hc_post() { return fp8_hc_post{NULL, NULL, NULL, 0}; }

/**
 * Output @p n of token @p t of an FP8 linear of width @p N: y = bf16(@p acc), then where @p hp
 * has streams, k_hc_post's step for channel n from the stored bf16 (hc = GFW_FP8_HC_POST_HC).
 */
__device__ __forceinline__ void fp8_store_output(uint16_t *y, const fp8_hc_post &hp, int64_t t, int64_t n, int64_t N,
                                                 float acc)
{
    const uint16_t out = gfw_f2bf(acc);
    y[t * N + n] = out;
    if (hp.X != NULL)
        hc_post_channel<GFW_FP8_HC_POST_HC>(gfw_bf2f(out), hp.X, t, n, N, GFW_FP8_HC_POST_HC, hp.post, hp.comb);
}

/**
 * One linear of a k_linear_fp8_128_split launch: its weight, the shape its rows are shared out
 * in (fp8_split_choose()) and its output.  A launch runs one linear, or two on the same x rows
 * (the same K: wq_a and wkv, wq_b and the indexer's wq_b), the second one's blocks after the
 * first one's, so that neither waits for the other's last blocks.
 */
struct fp8_split_job {
    dfp8 w;            /**< the weight (128x128 scale blocks) */
    fp8_split_shape sh; /**< its rows per block and warp */
    uint16_t *y;       /**< its output [T, w.N] */
    fp8_hc_post post;  /**< an hc_post of the output (width w.N) after it is written, or none */
};

/** Blocks of @p j's linear for T tokens: T ceil(N / rows per block). */
static int64_t fp8_split_job_blocks(int64_t T, const fp8_split_job &j)
{
    const int64_t rows = fp8_split_rows(j.sh);
    return T * ((j.w.N + rows - 1) / rows);
}

/** One warp's share of a k_linear_fp8_128_split block: `units` (pair, step) units, pair-major. */
struct fp8_split_warp {
    int64_t n0;  /**< first row of the warp's first pair */
    int local0;  /**< that row's index within the block */
    int s0;      /**< first step of the warp's slice */
    int cnt;     /**< steps of the slice (0: an empty slice) */
    int units;   /**< live pairs times cnt */
    int rows;    /**< rows of the warp's pairs that exist (rows n0 .. n0 + rows - 1) */
};

/**
 * A position in a warp's stream of units, pair-major (the steps of a pair, then the next
 * pair): pair r of the warp (rows n0 + 2 r, n0 + 2 r + 1), step s, and the lane's first code of
 * row n0 + 2 r at step s (@p src).
 */
struct fp8_unit_pos {
    int r;              /**< the pair, within the warp's pairs */
    int s;              /**< the 512-code step */
    const uint8_t *src; /**< the lane's 16 codes of the pair's first row at step s */
};

/** The unit after @p p in the warp's stream; @p pair_jump = 2 K - 512 cnt bytes from a pair's end to the next pair. */
__device__ __forceinline__ void fp8_unit_next(const fp8_split_warp &wp, int64_t pair_jump, fp8_unit_pos *p)
{
    p->src += 512;
    if (++p->s == wp.s0 + wp.cnt) {
        p->s = wp.s0;
        p->r++;
        p->src += pair_jump;
    }
}

/**
 * Lane copies its 16 codes of both rows of unit @p p (when the warp has it, @p live, and the
 * lane's codes lie below K, @p in_k) to shared address @p slot_sa (row 0) and 512 bytes later
 * (row 1), and closes a group (empty otherwise): a missing row 1 (n + 1 = N) rereads row 0.
 */
__device__ __forceinline__ void fp8_ring_issue(bool live, bool in_k, const fp8_split_warp &wp, const fp8_unit_pos &p,
                                               int K, unsigned slot_sa)
{
    if (live && in_k) {
        cp_async16_sa(slot_sa, p.src);
        cp_async16_sa(slot_sa + 512, 2 * p.r + 1 < wp.rows ? p.src + K : p.src);
    }
    cp_async_commit();
}

/**
 * The FP8 linear for 128x128 weight scale blocks (the model's), same bits as k_linear_fp8 and
 * linear_fp8.c.
 *
 * The block first decodes the token's x codes (read four at a time) once into shared memory
 * as exact doubles, in the order the lanes read them (fp8_x_slot(): a warp's read of a pair
 * of x values is 512 contiguous bytes at a fixed offset from the lane's base, no bank
 * conflict, no address arithmetic).  A warp streams pairs of weight rows in steps of 512
 * codes: lane l holds the 16 codes [16 l, 16 l + 16) of each row (the warp's 32 lanes cover
 * 512 contiguous bytes of a row: scale blocks 4s..4s+3, eight lanes each).  A weight code
 * becomes the double of its value times 2^-1016 in two integer instructions
 * (e4m3_times_2m1016), and the lane sums its 16 products per row with fma in two independent
 * chains (fp8_pair_sums()).  Per 1 KB unit a warp runs about 250 instructions (sm_90a SASS of
 * the loop): 32 DFMA, 32 PRMT, 32 masks, 32 moves of the zero low words, 24 NaN tests, 10
 * shared loads, the butterfly, the copies and the bookkeeping.  The NaN tests run only in the
 * NAN_TEST instance, which serves a weight with a NaN code: whether a weight has one is
 * looked up once, at upload (dfp8::nan_free), and a checkpoint's weights have none.
 *
 * The rows are shared out by @p sh (fp8_split_choose()).  Block b of token t = b mod T owns
 * the fp8_split_rows(sh) rows from (b / T) fp8_split_rows(sh); warp v runs the `pairs` row
 * pairs from 2 (v / slices) pairs within them, each over slice v mod slices of the pair's
 * steps (ceil(steps / slices) steps per slice, the last ones shorter or empty), as one stream
 * of (pair, step) units.
 *
 * **The copy ring.**  The codes reach the lanes through a ring of GFW_FP8_RING units of
 * shared memory per warp (1 KB each: row 0's 512 bytes, then row 1's), fed by 16-byte
 * cp.async copies: lane l copies its own 16 bytes of each row into bytes [16 l, 16 l + 16) of
 * each half, and later reads back exactly those bytes, so a lane's `cp.async.wait_group` is
 * the whole synchronisation (no barrier, no other lane involved).  Unit u lives in slot
 * u mod GFW_FP8_RING.  Each warp issues the copies of its first GFW_FP8_RING - 1 units before
 * the block waits for the kernel before it (the weight is no kernel's output) and decodes x,
 * so the prologue overlaps the kernel before and the memory latency; then for each unit u it
 * waits for u's group (one group per unit, empty ones past the warp's units keep the count),
 * reads its codes into registers, issues unit u + GFW_FP8_RING - 1 into the slot it read in the
 * previous iteration, and sums unit u: GFW_FP8_RING - 1 units (3 KB per warp) stay in flight
 * while the warp computes, without holding registers, also across the end of a pair.
 * Shared memory per block: 8 K bytes of x, 8 x 4 KB of rings and the terms: at K = 4096 about
 * 66 KB (three blocks per multiprocessor, 24 warps, about 72 KB in flight), at K = 8192 about
 * 100 KB (two blocks, 16 warps, about 48 KB in flight), at K = 1024 at most 45 KB (three).
 *
 * Exactness: an E4M3 value is an integer multiple of 2^-9 of magnitude <= 448 < 2^9, so a
 * product x w 2^-1016 is an integer multiple of 2^-1034 (>= 2^-1074, the double grid's
 * spacing near zero) of magnitude < 2^18 2^-1016, and any sum of at most 128 of them is a
 * multiple of 2^-1034 below 2^25 2^-1016: 43 bits, within the 53 of a double, so every fma,
 * every addition below and the final scaling by 2^1016 are exact, whatever the order (and
 * whichever warp computes a term, whichever path brought its codes).  The block partial is
 * therefore the oracle's exact double, and fl32 of it the oracle's float.  A NaN weight code
 * (tested four at a time, in the NAN_TEST instance, the only one that serves a weight with such
 * a code) makes the lane's sum NaN, as the oracle's product would; NaN x values are NaN doubles
 * already.  The only inexact operations are the oracle's own: fl32 of the
 * partial, the product s_x s_w, the term's product and the fp32 sum of the terms in block order,
 * each with the oracle's operands in the oracle's order.
 *
 * The eight lanes of a scale block add their sums in a butterfly that is transposed over the
 * two rows (after the first exchange a lane keeps row ((l >> 2) & 1)), so that one lane in four
 * ends with a (row, block) sum (fp8_block_sum()) and stores fl32(partial) in shared memory.
 * After a barrier the block's threads turn every (row, block) value into the term
 * fl32(partial) (s_x s_w) (the scales read there, not in the loop), and after another thread i
 * adds row i's terms in block order from +0 (the oracle's fp32 sum) and writes the output.
 */
template <bool NAN_TEST>
__global__ void __launch_bounds__(GFW_FP8_WARPS * 32, GFW_FP8_SPLIT_BLOCKS_PER_SM)
    k_linear_fp8_128_split(const uint8_t *xq, const float *xs, int64_t T, fp8_split_job j0, int64_t blocks0,
                           fp8_split_job j1)
{
    /* the blocks from blocks0 on are the second linear's (fp8_split_job) */
    const bool second = blockIdx.x >= blocks0;
    const dfp8 w = second ? j1.w : j0.w;
    const fp8_split_shape sh = second ? j1.sh : j0.sh;
    uint16_t *const y = second ? j1.y : j0.y;
    const int64_t bid = second ? blockIdx.x - blocks0 : blockIdx.x;
    double *sx = fp8_sx_row();
    const int K = (int)w.K, kb_w = K / 128, nsteps = (K + 511) / 512; /* K < 2^15: the x row fits the shared memory */
    const int64_t t = bid % T, rows_blk = fp8_split_rows(sh), nb = (bid / T) * rows_blk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    fp8_split_warp wp;
    wp.local0 = GFW_FP8_ROWS * (warp / sh.slices) * sh.pairs;
    wp.n0 = nb + wp.local0;
    const int per_slice = (nsteps + sh.slices - 1) / sh.slices;
    wp.s0 = (warp % sh.slices) * per_slice;
    const int left = nsteps - wp.s0;
    wp.cnt = left <= 0 ? 0 : left < per_slice ? left : per_slice;
    const int64_t rows_left = wp.n0 < w.N ? w.N - wp.n0 : 0;
    wp.rows = (int)(rows_left < 2 * sh.pairs ? rows_left : 2 * sh.pairs);
    wp.units = (wp.rows + 1) / 2 * wp.cnt;
    const int64_t pair_jump = 2 * (int64_t)K - 512 * (int64_t)wp.cnt;
    /* only the last step may be short: the lane's codes lie below K at step s if s < nsteps - 1 or this holds */
    const bool lane_in_last = lane * 16 < K - (nsteps - 1) * 512;

    uint8_t *ring = (uint8_t *)(sx + fp8_x_row_len(K)) + warp * (GFW_FP8_RING * GFW_FP8_UNIT_BYTES) + lane * 16;
    float *term = (float *)((uint8_t *)(sx + fp8_x_row_len(K)) + GFW_FP8_WARPS * GFW_FP8_RING * GFW_FP8_UNIT_BYTES);
    const fp8_unit_pos first = {0, wp.s0, w.w + wp.n0 * K + wp.s0 * 512 + lane * 16};
    fp8_unit_pos in = first; /* the next unit to copy */
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring);
    /* the weight is no kernel's output: the first units are copied while the kernel before still runs */
#pragma unroll
    for (int u = 0; u < GFW_FP8_RING - 1; u++) {
        fp8_ring_issue(u < wp.units, in.s < nsteps - 1 || lane_in_last, wp, in, K, ring_sa + u * GFW_FP8_UNIT_BYTES);
        fp8_unit_next(wp, pair_jump, &in);
    }
    gfw_pdl_enter();

    const uint8_t *xr = xq + t * K; /* K is a multiple of 128: whole, aligned words of 4 codes */
    for (int k = 4 * (int)threadIdx.x; k < (int)K; k += 4 * (int)blockDim.x) {
        const uint32_t c = *(const uint32_t *)(xr + k);
        /* codes k, k + 1 and k + 2, k + 3 are two pairs of the same lane: two 16-byte slots */
        ((double2 *)sx)[fp8_x_slot(k) >> 1] =
            make_double2((double)gfw_e4m3_value(c & 0xFFu), (double)gfw_e4m3_value((c >> 8) & 0xFFu));
        ((double2 *)sx)[fp8_x_slot(k + 2) >> 1] =
            make_double2((double)gfw_e4m3_value((c >> 16) & 0xFFu), (double)gfw_e4m3_value(c >> 24));
    }
    __syncthreads();

    const int row = (lane >> 2) & 1;
    const double2 *xl = (const double2 *)sx + lane; /* the lane's pair 0 at step 0 */
    fp8_unit_pos at = first;                        /* the unit summed */
    /* the lane's (row, block) term of the unit summed: row local0 + 2 r + row, block 4 s + lane / 8 */
    float *term_at = term + (wp.local0 + row) * kb_w + 4 * wp.s0 + (lane >> 3);
    for (int u = 0; u < wp.units; u++) {
        cp_async_wait<GFW_FP8_RING - 2>(); /* unit u's group has landed in this lane's bytes */
        const uint8_t *slot = ring + (u % GFW_FP8_RING) * GFW_FP8_UNIT_BYTES;
        const bool has = at.s < nsteps - 1 || lane_in_last; /* false only for the lanes past a short last step */
        const uint4 q0 = *(const uint4 *)slot, q1 = *(const uint4 *)(slot + 512); /* used only when has */
        /* the slot read in the previous iteration is free again: refill it GFW_FP8_RING - 1 units ahead */
        fp8_ring_issue(u + GFW_FP8_RING - 1 < wp.units, in.s < nsteps - 1 || lane_in_last, wp, in, K,
                       ring_sa + ((u + GFW_FP8_RING - 1) % GFW_FP8_RING) * GFW_FP8_UNIT_BYTES);
        fp8_unit_next(wp, pair_jump, &in);

        double p0 = 0.0, p1 = 0.0;
        if (has)
            fp8_pair_sums<NAN_TEST>(xl + at.s * 256, q0, q1, &p0, &p1);
        const double v = fp8_block_sum(row, p0, p1);
        /* one lane in four holds a (row, block) partial: its fl32, scaled after the loop (its
           block kb = 4 s + lane / 8 is below K / 128 exactly when the lane's codes are, has) */
        if ((lane & 3) == 0 && has && (row == 0 || 2 * at.r + 1 < wp.rows))
            term_at[0] = __double2float_rn(v * 0x1p1016);
        term_at += at.s + 1 == wp.s0 + wp.cnt ? 2 * kb_w - 4 * (wp.cnt - 1) : 4;
        fp8_unit_next(wp, pair_jump, &at);
    }
    __syncthreads();
    /* the terms fl32(partial) (s_x s_w), all (row, block) pairs of the block in parallel */
    const float *xs_t = xs + t * kb_w;
    for (int64_t i = threadIdx.x; i < rows_blk * kb_w && nb + i / kb_w < w.N; i += blockDim.x) {
        const int64_t kb = i % kb_w, n = nb + i / kb_w;
        term[i] = __fmul_rn(term[i], __fmul_rn(xs_t[kb], gfw_ue8m0(w.s[(n >> 7) * w.scols + kb])));
    }
    __syncthreads();
    const fp8_hc_post hp = second ? j1.post : j0.post;
    for (int64_t i = threadIdx.x; i < rows_blk && nb + i < w.N; i += blockDim.x) {
        float acc = 0.0f;
        for (int64_t kb = 0; kb < kb_w; kb++)
            acc = __fadd_rn(acc, term[i * kb_w + kb]);
        fp8_store_output(y, hp, t, nb + i, w.N, acc);
    }
}

/**
 * Whether the 128-block kernels serve @p w with x codes @p xq: 128x128 scale blocks, 16-byte
 * aligned weight codes and 4-byte aligned x codes.
 */
static bool fp8_blocks128(const uint8_t *xq, const dfp8 &w)
{
    return w.block == 128 && ((uintptr_t)w.w & 15) == 0 && ((uintptr_t)xq & 3) == 0;
}

/** Whether k_linear_fp8_128_split serves @p w for T rows of x codes @p xq (launch_linear_fp8()). */
static bool fp8_split_serves(const uint8_t *xq, int64_t T, const dfp8 &w)
{
    return fp8_blocks128(xq, w) && T < GFW_FP8T_MIN_T && fp8_128_smem(w.K) <= GFW_FP8_SMEM_MAX;
}

/** The job of k_linear_fp8_128_split for @p w on T rows with @p n_sm multiprocessors (fp8_split_choose()). */
static fp8_split_job fp8_split_job_for(int64_t T, const dfp8 &w, uint16_t *y, int n_sm)
{
    fp8_split_job j;
    j.w = w;
    j.y = y;
    j.post = fp8_no_hc_post();
    j.sh = fp8_split_choose(T, w.N, w.K, n_sm);
    if (fp8_split_smem(w.K, j.sh) > GFW_FP8_SMEM_MAX)
        j.sh = fp8_split_shape{1, 1}; /* one row pair per warp: the least shared memory, fp8_128_smem(K) */
    return j;
}

/** A k_linear_fp8_128_split instance. */
typedef void (*fp8_split_fn)(const uint8_t *, const float *, int64_t, fp8_split_job, int64_t, fp8_split_job);

/** The instance of k_linear_fp8_128_split for weights all free of NaN codes (@p nan_free: dfp8::nan_free) or not. */
static fp8_split_fn fp8_split_kernel(bool nan_free)
{
    return nan_free ? k_linear_fp8_128_split<false> : k_linear_fp8_128_split<true>;
}

/**
 * One k_linear_fp8_128_split launch for T quantized rows: job @p j0's blocks, then, with @p j1,
 * j1's (fp8_split_job), with the shared memory the larger of the two needs.
 */
static void launch_fp8_split(const uint8_t *xq, const float *xs, int64_t T, const fp8_split_job &j0,
                             const fp8_split_job *j1, cudaStream_t st)
{
    const fp8_split_job &second = j1 != NULL ? *j1 : j0;
    const int64_t blocks0 = fp8_split_job_blocks(T, j0);
    const int64_t blocks = blocks0 + (j1 != NULL ? fp8_split_job_blocks(T, *j1) : 0);
    const size_t smem0 = fp8_split_smem(j0.w.K, j0.sh), smem1 = fp8_split_smem(second.w.K, second.sh);
    mmoe_launch_pdl(fp8_split_kernel(j0.w.nan_free && second.w.nan_free), (unsigned)blocks, GFW_FP8_WARPS * 32,
                    smem0 > smem1 ? smem0 : smem1, st, xq, xs, T, j0, blocks0, second);
}

/**
 * The attention's output projection y = fp8_linear(x) of T quantized rows with k_hc_post's
 * update of the streams @p hp done by the thread that stores each output (the same operations
 * on the same values: hc_post_channel() of the stored bf16), where k_linear_fp8_128_split
 * serves @p w (fp8_split_serves()) and hc = GFW_FP8_HC_POST_HC: returns true; else nothing is
 * launched and it returns false.
 */
static bool launch_linear_fp8_hc_post(const uint8_t *xq, const float *xs, int64_t T, const dfp8 &w, uint16_t *y,
                                      const fp8_hc_post &hp, int n_sm, cudaStream_t st)
{
    if (!fp8_split_serves(xq, T, w) || hp.hc != GFW_FP8_HC_POST_HC)
        return false;
    fp8_split_job j = fp8_split_job_for(T, w, y, n_sm);
    j.post = hp;
    launch_fp8_split(xq, xs, T, j, NULL, st);
    return true;
}

/**
 * Launch the FP8 linear y = fp8_linear(x) of T quantized rows: for 128-blocks, 16-byte aligned
 * weight codes and 4-byte aligned x codes, k_linear_fp8_tokens from GFW_FP8T_MIN_T tokens on,
 * and below that, where the x row and rings fit the shared memory, k_linear_fp8_128_split with
 * its rows shared out for @p n_sm multiprocessors by fp8_split_choose(); k_linear_fp8
 * otherwise (same bits on every path).
 */
static void launch_linear_fp8(const uint8_t *xq, const float *xs, int64_t T, const dfp8 &w, uint16_t *y, int n_sm,
                              cudaStream_t st)
{
    if (fp8_blocks128(xq, w) && T >= GFW_FP8T_MIN_T) {
        launch_linear_fp8_tokens(xq, xs, T, w, y, n_sm, st);
        return;
    }
    if (fp8_split_serves(xq, T, w))
        launch_fp8_split(xq, xs, T, fp8_split_job_for(T, w, y, n_sm), NULL, st);
    else
        mmoe_launch_pdl(k_linear_fp8, (unsigned)((T * w.N * 32 + 255) / 256), 256, 0, st, xq, xs, T, w, y);
}

/**
 * Launch y0 = fp8_linear(x) with @p w0 and y1 = fp8_linear(x) with @p w1 on the same T
 * quantized rows: as one k_linear_fp8_128_split launch when it serves both (the same K), each
 * shaped for its share of the @p n_sm multiprocessors in proportion to its rows, so that the
 * two short projections of a decode step fill the device together; else as two launches of
 * launch_linear_fp8().  The same bits either way (each block computes what it would alone).
 */
static void launch_linear_fp8_pair(const uint8_t *xq, const float *xs, int64_t T, const dfp8 &w0, uint16_t *y0,
                                   const dfp8 &w1, uint16_t *y1, int n_sm, cudaStream_t st)
{
    if (w0.K != w1.K || !fp8_split_serves(xq, T, w0) || !fp8_split_serves(xq, T, w1) || n_sm < 2) {
        launch_linear_fp8(xq, xs, T, w0, y0, n_sm, st);
        launch_linear_fp8(xq, xs, T, w1, y1, n_sm, st);
        return;
    }
    int sm0 = (int)((int64_t)n_sm * w0.N / (w0.N + w1.N));
    sm0 = sm0 < 1 ? 1 : sm0 > n_sm - 1 ? n_sm - 1 : sm0;
    const fp8_split_job j0 = fp8_split_job_for(T, w0, y0, sm0), j1 = fp8_split_job_for(T, w1, y1, n_sm - sm0);
    launch_fp8_split(xq, xs, T, j0, &j1, st);
}

/* The few-token FP8 linear on the tensor cores, the `tc` recipe (its own chapter), which needs
   dfp8, fp8_hc_post and hc_post_channel() above. */
#include "gpu_linear_fp8_tc.cuh"

/** 16 bf16 values from @p p (16-byte aligned when @p vec) as fp32. */
__device__ __forceinline__ void load16_bf16(const uint16_t *p, bool vec, float *out)
{
    if (vec) {
        gfw_load_bf16x16(p, out);
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            out[i] = gfw_bf2f(p[i]);
    }
}

/**
 * The sum of one full 16-value chunk of a dense dot product with an FP8 weight: x values @p xv,
 * codes @p codes (four per word, ascending), one scale byte @p sb; products ascending from +0
 * (@ref spec_arch_sum_order).  Without NaN codes and with a scale byte in the direct range
 * (mmoe_df8_scale_direct(): 10..134) the weights are built as doubles directly
 * (e4m3_times_2m1016 times a power of two), the same values as the oracle's fp32 decode and
 * bf16 rounding; otherwise they are decoded as the oracle does.
 */
__device__ __forceinline__ double dense_f8_chunk16(const float *xv, const uint32_t *codes, uint8_t sb)
{
    double c = 0.0;
    if (mmoe_df8_scale_direct(sb) && !e4m3_has_nan16(make_uint4(codes[0], codes[1], codes[2], codes[3]))) {
        /* For scale bytes 10..134 the value v 2^(sb-127) of a finite code is a normal fp32 of
           at most 4 significant bits (2^-126 <= |v s| < 2^16), so fl32 and the bf16 rounding
           keep it, and it is the double e4m3_times_2m1016 times 2^(sb+889) exactly: the
           oracle's weight without the fp32 decode, the bf16 rounding and the conversion. */
        const double S = gfw_pow2((int)sb + 889);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t wq = codes[q], wq1 = wq << 1;
            c = __fma_rn((double)xv[4 * q], __dmul_rn(e4m3_times_2m1016<0>(wq, wq1), S), c);
            c = __fma_rn((double)xv[4 * q + 1], __dmul_rn(e4m3_times_2m1016<1>(wq, wq1), S), c);
            c = __fma_rn((double)xv[4 * q + 2], __dmul_rn(e4m3_times_2m1016<2>(wq, wq1), S), c);
            c = __fma_rn((double)xv[4 * q + 3], __dmul_rn(e4m3_times_2m1016<3>(wq, wq1), S), c);
        }
        return c;
    }
    const float sc = gfw_ue8m0(sb);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const float wv = gfw_f8_weight((codes[i / 4] >> (8 * (i % 4))) & 0xFFu, sc);
        c = __fma_rn((double)xv[i], (double)wv, c); /* an exact product: one rounding, the sum's */
    }
    return c;
}

/**
 * Chunk @p k of the dense dot product of x row @p xr (bf16) with weight row @p n: the exact
 * double products of its (up to) 16 values, ascending from +0 (@ref spec_arch_sum_order).  A
 * full chunk is read with 16-byte loads where aligned, and an FP8 weight's chunk shares one
 * scale when the scale block is a multiple of 16; such a chunk without NaN codes and with a
 * scale byte in 10..134 builds its weights as doubles directly (e4m3_times_2m1016 times a
 * power of two), the same values as the oracle's fp32 decode and bf16 rounding.
 */
__device__ double dense_chunk(const ddense &w, int64_t n, const uint16_t *xr, int64_t k, int64_t K)
{
    const int64_t i0 = k * MMOE_SUM_CHUNK;
    if (i0 >= K)
        return 0.0;
    double c = 0.0;
    if (i0 + MMOE_SUM_CHUNK > K) { /* the short last chunk */
        for (int64_t i = i0; i < K; i++)
            c = __dadd_rn(c, __dmul_rn((double)gfw_bf2f(xr[i]), dd_at(w, n, i)));
        return c;
    }
    float xv[16], wv[16];
    load16_bf16(xr + i0, ((uintptr_t)(xr + i0) & 15) == 0, xv);
    const int64_t e = n * w.cols + i0;
    if (w.dtype == GFW_BF16) {
        const uint16_t *p = (const uint16_t *)w.p + e;
        load16_bf16(p, ((uintptr_t)p & 15) == 0, wv);
    } else if (w.dtype == GFW_F32) {
        const float *p = (const float *)w.p + e;
        if (((uintptr_t)p & 15) == 0) {
            gfw_load_f32x16(p, wv);
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++)
                wv[i] = p[i];
        }
    } else if (w.block % MMOE_SUM_CHUNK == 0) { /* F8: the chunk lies in one scale block */
        const uint8_t *p = (const uint8_t *)w.p + e;
        const uint8_t sb = w.scale[(int64_t)((int)n / w.block) * w.scols + (int)i0 / w.block];
        uint32_t codes[4];
        if (((uintptr_t)p & 15) == 0) {
            const uint4 u = *(const uint4 *)p;
            codes[0] = u.x, codes[1] = u.y, codes[2] = u.z, codes[3] = u.w;
        } else {
            for (int q = 0; q < 4; q++)
                codes[q] = (uint32_t)p[4 * q] | ((uint32_t)p[4 * q + 1] << 8) | ((uint32_t)p[4 * q + 2] << 16) |
                           ((uint32_t)p[4 * q + 3] << 24);
        }
        return dense_f8_chunk16(xv, codes, sb);
    } else {
        for (int i = 0; i < 16; i++)
            wv[i] = (float)dd_at(w, n, i0 + i);
    }
#pragma unroll
    for (int i = 0; i < 16; i++)
        c = __fma_rn((double)xv[i], (double)wv[i], c); /* an exact product: one rounding, the sum's */
    return c;
}

/** Most dense linears of one input that k_linear_dense_split runs in one launch. */
#define GFW_DENSE_SET 5

/** Dense linears of one input: weight j [N[j], K] into yf[j] (fp32) and/or yb[j] (bf16), [T, N[j]]. */
struct dense_set {
    ddense w[GFW_DENSE_SET];        /**< weights */
    int64_t N[GFW_DENSE_SET];       /**< output widths */
    float *yf[GFW_DENSE_SET];       /**< fp32 outputs or NULL */
    uint16_t *yb[GFW_DENSE_SET];    /**< bf16 outputs or NULL */
    int n;                          /**< linears in the set */
};

/** Warps (one output each) of a k_linear_dense_split block. */
#define GFW_DENSE_WARPS 8
/**
 * Blocks per multiprocessor k_linear_dense_split is compiled for: 3 (at most 85 registers;
 * unbounded it takes 120, which leaves 2 blocks, 16 warps, to stream the weights).  The few
 * values that then live in local memory are read once per batch of rounds, outside the sums.
 */
#define GFW_DENSE_BLOCKS_PER_SM 3

/** The output of a dense set that global index @p o names: linear *j, token *t, row *n; false past the end. */
__device__ __forceinline__ bool dense_output(const dense_set &set, int64_t T, int64_t o, int *j, int64_t *t,
                                             int64_t *n)
{
    int jj = 0;
    while (jj < set.n && o >= T * set.N[jj]) {
        o -= T * set.N[jj];
        jj++;
    }
    if (jj >= set.n)
        return false;
    *j = jj, *t = o / set.N[jj], *n = o % set.N[jj];
    return true;
}

/** How k_linear_dense_split reads a weight: the loads of a batch issued together, or dense_chunk per round. */
enum dense_read {
    DENSE_READ_F8,   /**< E4M3 codes, 16-aligned chunks in one scale block: 16 bytes per chunk */
    DENSE_READ_BF16, /**< BF16: 32 bytes per chunk */
    DENSE_READ_F32,  /**< F32: 64 bytes per chunk */
    DENSE_READ_ANY   /**< anything else (short last chunk, unaligned rows): dense_chunk */
};

/** Rounds of 32 chunks per batch of k_linear_dense_split (about 2 KiB of a warp's weight loads in flight). */
__host__ __device__ constexpr int dense_batch(dense_read R)
{
    return R == DENSE_READ_F8 ? 4 : R == DENSE_READ_BF16 ? 2 : 1;
}

/** The tree's node over the first @p k (1, 2 or 4) round nodes of @p c: c0, c0 + c1, (c0 + c1) + (c2 + c3). */
template <int B>
__device__ __forceinline__ double dense_batch_node(const double *c, int64_t k)
{
    if (B >= 4 && k == 4)
        return __dadd_rn(__dadd_rn(c[0], c[1]), __dadd_rn(c[2], c[3]));
    if (B >= 2 && k == 2)
        return __dadd_rn(c[0], c[1]);
    return c[0];
}

/**
 * The spec's sum for output row @p n of weight @p w and x row @p xr (m chunks, `rounds` rounds
 * of 32 chunks, a power of two), by one warp, read as @p R says; every lane gets it.
 */
template <dense_read R>
__device__ __forceinline__ double dense_warp_sum(const ddense &w, int64_t n, const uint16_t *xr, int64_t K, int64_t m,
                                                 int64_t rounds, int lane)
{
    constexpr int B = dense_batch(R);
    constexpr int WQ = R == DENSE_READ_F8 ? 1 : R == DENSE_READ_BF16 ? 2 : 4; /* 16-byte words per chunk */
    const int64_t per_batch = rounds < B ? rounds : B;
    const char *wrow = (const char *)w.p + n * w.cols * (R == DENSE_READ_F8 ? 1 : R == DENSE_READ_BF16 ? 2 : 4);
    const uint8_t *srow = R == DENSE_READ_F8 ? w.scale + (int64_t)((int)n / w.block) * w.scols : NULL;
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    for (int64_t r0 = 0; r0 < rounds; r0 += per_batch) {
        double c[B];
        if constexpr (R == DENSE_READ_ANY) {
            c[0] = dense_chunk(w, n, xr, r0 * 32 + lane, K);
        } else {
            uint4 q[B][WQ], xa[B], xb[B];
            uint8_t sb[B];
            const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int u = 0; u < B; u++) {
                const int64_t k = (r0 + u) * 32 + lane;
                const bool in = u < per_batch && k < m;
                const uint4 *wp = (const uint4 *)(wrow + k * 16 * WQ);
#pragma unroll
                for (int i = 0; i < WQ; i++)
                    q[u][i] = in ? __ldg(wp + i) : zero;
                xa[u] = in ? __ldg((const uint4 *)(xr + k * MMOE_SUM_CHUNK)) : zero;
                xb[u] = in ? __ldg((const uint4 *)(xr + k * MMOE_SUM_CHUNK) + 1) : zero;
                sb[u] = R == DENSE_READ_F8 && in ? __ldg(srow + (int)(k * MMOE_SUM_CHUNK) / w.block) : (uint8_t)0;
            }
#pragma unroll
            for (int u = 0; u < B; u++) {
                const int64_t k = (r0 + u) * 32 + lane;
                float xv[16];
                gfw_bf16x16_to_f32(xa[u], xb[u], xv);
                double v = 0.0;
                if constexpr (R == DENSE_READ_F8) {
                    const uint32_t codes[4] = {q[u][0].x, q[u][0].y, q[u][0].z, q[u][0].w};
                    v = dense_f8_chunk16(xv, codes, sb[u]);
                } else {
                    float wv[16];
                    if constexpr (R == DENSE_READ_BF16) {
                        gfw_bf16x16_to_f32(q[u][0], q[u][1], wv);
                    } else {
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            wv[4 * i] = __uint_as_float(q[u][i].x), wv[4 * i + 1] = __uint_as_float(q[u][i].y);
                            wv[4 * i + 2] = __uint_as_float(q[u][i].z), wv[4 * i + 3] = __uint_as_float(q[u][i].w);
                        }
                    }
#pragma unroll
                    for (int i = 0; i < 16; i++)
                        v = __fma_rn((double)xv[i], (double)wv[i], v); /* exact products, as dense_chunk */
                }
                c[u] = u < per_batch && k < m ? v : 0.0;
            }
        }
#pragma unroll
        for (int u = 0; u < B; u++)
            c[u] = gfw_group_pairwise(c[u], 32); /* the node over the round's 32 chunks */
        mmoe_pairwise_push(&pw, dense_batch_node<B>(c, per_batch));
    }
    return mmoe_pairwise_result(&pw);
}

/**
 * Dense linears (linear_dense.c) of one input x: y[t, n] = fl32(the double sum of x_k w_k in the
 * order of @ref spec_arch_sum_order), one WARP per output of any linear of the set (the outputs
 * of linear 0 first), GFW_DENSE_WARPS outputs per block, no shared memory, no block barrier.
 * x row t starts at x + t*ldx + (n / group_rows) * group_width (the grouped output projection
 * reads its head group; group_rows = 0: no grouping).
 *
 * Order.  Let m be the chunk count and M the next power of two (the spec's tree has M leaves,
 * the missing ones +0).  In round r lane l sums chunk 32 r + l (+0 past the end) and the
 * warp's butterfly (gfw_group_pairwise) adds the five levels above: the node over the aligned
 * run of 32 chunks [32 r, 32 r + 32), in every lane.  A batch of 1, 2 or 4 rounds (a power of
 * two dividing the round count) is added as the tree adds it, ((r0 + r1) + (r2 + r3)), and the
 * batches' nodes go through mmoe_pairwise.  With M <= 32 there is one round, and the butterfly
 * over the padded 32 leaves adds only +0 nodes above the root (no node is -0), so the result
 * is P either way.  Every addition is one of the tree's (IEEE addition commutes, so lane l +
 * lane l^s in the butterfly is the same bits in both lanes).
 *
 * Memory.  A round's weight loads are 32 consecutive chunks of the row: 512 contiguous bytes
 * of an FP8 row, 1 KiB of a BF16 one, 2 KiB of an F32 one.  When the chunks are whole and
 * rows and x 16-byte aligned (and an FP8 chunk lies in one scale block), a warp issues the
 * weight, x and scale-byte loads of a batch (dense_batch: about 2 KiB of weights) before it
 * sums any, with the chunk sums of dense_chunk (dense_f8_chunk16 for FP8); otherwise it runs
 * dense_chunk per round.  The x row (the head group's for the grouped output projection) is
 * read by all warps of the block through L1.
 */
__global__ void __launch_bounds__(GFW_DENSE_WARPS * 32, GFW_DENSE_BLOCKS_PER_SM)
    k_linear_dense_split(const uint16_t *x, int64_t T, int64_t ldx, int64_t K, dense_set set, int64_t group_rows,
                         int64_t group_width)
{
    gfw_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * GFW_DENSE_WARPS + (threadIdx.x >> 5);
    int j;
    int64_t t, n;
    if (!dense_output(set, T, o, &j, &t, &n))
        return;
    const ddense &w = set.w[j];
    const uint16_t *xr = x + t * ldx + (group_rows > 0 ? (n / group_rows) * group_width : 0);
    const int64_t m = (K + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK;
    int64_t M = 1;
    while (M < m)
        M <<= 1;
    const int64_t rounds = M > 32 ? M / 32 : 1;
    const int esize = ddense_elem_bytes(w);
    const bool whole = K % MMOE_SUM_CHUNK == 0 && ((uintptr_t)xr & 15) == 0 &&
                       ((uintptr_t)((const char *)w.p + n * w.cols * esize) & 15) == 0;
    double v;
    if (whole && w.dtype == GFW_F8 && w.block % MMOE_SUM_CHUNK == 0)
        v = dense_warp_sum<DENSE_READ_F8>(w, n, xr, K, m, rounds, lane);
    else if (whole && w.dtype == GFW_BF16)
        v = dense_warp_sum<DENSE_READ_BF16>(w, n, xr, K, m, rounds, lane);
    else if (whole && w.dtype == GFW_F32)
        v = dense_warp_sum<DENSE_READ_F32>(w, n, xr, K, m, rounds, lane);
    else
        v = dense_warp_sum<DENSE_READ_ANY>(w, n, xr, K, m, rounds, lane);
    if (lane == 0) {
        const float f = __double2float_rn(v);
        if (set.yf[j])
            set.yf[j][t * set.N[j] + n] = f;
        if (set.yb[j])
            set.yb[j][t * set.N[j] + n] = gfw_f2bf(f);
    }
}

/* ================================================================== kernels: mHC */

/** Chunks of the spec's sum one block of k_hc_part covers (its threads, one chunk each). */
#define GFW_HC_PART_CHUNKS 256

/** Blocks of k_hc_part per reduction for n = hc*D terms. */
static int hc_part_blocks(int64_t n)
{
    const int64_t m = (n + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK;
    return (int)((m + GFW_HC_PART_CHUNKS - 1) / GFW_HC_PART_CHUNKS);
}

/** Product of row value i of mHC's fn (fp32) and stream value i (bf16): exact in double. */
struct fn_term {
    const float *row;  /**< fn row */
    const uint16_t *x; /**< the token's flattened streams */
    /** Term @p i: fn_i x_i. */
    __device__ double operator()(int64_t i) const { return __dmul_rn((double)row[i], (double)gfw_bf2f(x[i])); }
};

/**
 * Chunk @p k of mHC's reduction (gfw_chunk_sum's order: ascending from +0) when its 16 terms
 * are whole and their operands 16-byte aligned, from 16-byte vector loads: the stream values
 * @p Xt in two, the fn row @p row (NULL: the sum of squares) in four.  Returns 0 and leaves
 * @p sum alone when the chunk does not qualify (the caller then sums it value by value).
 */
__device__ __forceinline__ int hc_chunk_vec(const uint16_t *Xt, const float *row, int64_t k, int64_t n, double *sum)
{
    const int64_t i0 = k * MMOE_SUM_CHUNK;
    if (i0 + MMOE_SUM_CHUNK > n || !gfw_aligned16(Xt + i0) || (row != NULL && !gfw_aligned16(row + i0)))
        return 0;
    float xv[MMOE_SUM_CHUNK], fv[MMOE_SUM_CHUNK];
    gfw_load_bf16x16(Xt + i0, xv);
    if (row != NULL)
        gfw_load_f32x16(row + i0, fv);
    double c = 0.0;
#pragma unroll
    for (int i = 0; i < MMOE_SUM_CHUNK; i++)
        c = __dadd_rn(c, __dmul_rn(row != NULL ? (double)fv[i] : (double)xv[i], (double)xv[i]));
    *sum = c;
    return 1;
}

/**
 * First half of hc_pre / hc_head (mmoe_mhc.c, stream_mix_logits): the partial sums of the n_out
 * dot products fn[r] . x and of the sum of squares (r = n_out) over the n = hc*D stream values
 * of token blockIdx.z.  Block (s, r) sums the aligned run of 256 chunks s of reduction r, a node
 * of the spec's tree (@ref spec_arch_sum_order), into part[(t * (n_out + 1) + r) * S + s].
 * A thread's chunk comes in 16-byte vectors where it can (hc_chunk_vec(): a warp then reads
 * 2 KiB of fn and 1 KiB of x in fully used sectors, not 16 scalar loads a lane that each touch
 * 32 sectors); the terms (fn_term, sq_term) and their order are the same either way.
 */
__global__ void k_hc_part(const uint16_t *X, int64_t n, const float *fn, int n_out, double *part)
{
    gfw_pdl_enter();
    __shared__ double sh[33];
    const int64_t t = blockIdx.z, r = blockIdx.y, s = blockIdx.x;
    const uint16_t *Xt = X + t * n;
    const int64_t k = s * GFW_HC_PART_CHUNKS + threadIdx.x;
    double v;
    if (!hc_chunk_vec(Xt, r < n_out ? fn + r * n : NULL, k, n, &v))
        v = r < n_out ? gfw_run_sum(fn_term{fn + r * n, Xt}, k, 1, n) : gfw_run_sum(sq_term{Xt}, k, 1, n);
    const double node = gfw_block_tree(v, sh);
    if (threadIdx.x == 0)
        part[(t * (n_out + 1) + r) * gridDim.x + s] = node;
}

/** Most block sums of one mHC reduction that hc_fold_parts() folds in registers. */
#define GFW_HC_FOLD_MAX 8

/**
 * The spec's tree over the S <= GFW_HC_FOLD_MAX block sums @p p of one reduction (what
 * mmoe_pairwise_push() of each, then mmoe_pairwise_result(), give), in registers: the S values
 * are loaded at once and padded with +0 to eight, then ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)).
 * The same bits: the balanced tree over the next power of two with +0 leaves is the binary
 * counter's subtrees folded from the right (each padded subtree reduces to its live part, since
 * x + (+0) = x for every x but -0), and no block sum is -0 (a chunk sum starts at +0, and
 * +0 + (-0) = +0; a sum of two values is -0 only when both are).  Saves the counter's stack in
 * local memory and the loads' one-at-a-time waits.  The loads go through the L2 (ld.global.cg): in
 * k_hc_pre_norm the sums were written by other blocks of the same kernel.
 */
__device__ __forceinline__ double hc_fold_parts(const double *p, int S)
{
    double v[GFW_HC_FOLD_MAX];
#pragma unroll
    for (int s = 0; s < GFW_HC_FOLD_MAX; s++)
        v[s] = s < S ? __ldcg(p + s) : 0.0;
    return __dadd_rn(__dadd_rn(__dadd_rn(v[0], v[1]), __dadd_rn(v[2], v[3])),
                     __dadd_rn(__dadd_rn(v[4], v[5]), __dadd_rn(v[6], v[7])));
}

/**
 * The first steps of k_hc_finish_split and k_hc_pre_norm for token @p t (whole block): the S
 * block sums of each reduction folded by the spec's tree, the logits m[0, n_out) (m[n_out]: the
 * rms factor), pre[0, hc), and with @p has_post (one block of an hc_pre) also post.  Ends with
 * m visible to the block (pre is written after the last barrier: the caller synchronizes before
 * reading it).
 */
__device__ __forceinline__ void hc_finish_logits(int64_t t, int64_t n, int hc, const double *part, int S,
                                                 const float *base, const float *scale, int n_out, float norm_eps,
                                                 float hc_eps, int has_post, float *post, float *m, float *pre)
{
    const int tid = threadIdx.x;
    /* the parameters this thread needs later, loaded with the block sums (not after the barriers) */
    const float pre_scale = scale[0], pre_base = tid < hc ? base[tid] : 0.0f;
    const float post_scale = has_post ? scale[1] : 0.0f, post_base = has_post && tid < hc ? base[hc + tid] : 0.0f;
    double raw = 0.0;
    if (tid <= n_out) {
        const double *p = part + (t * (n_out + 1) + tid) * S;
        if (S <= GFW_HC_FOLD_MAX) {
            raw = hc_fold_parts(p, S);
        } else {
            mmoe_pairwise pw;
            mmoe_pairwise_init(&pw);
            for (int s = 0; s < S; s++)
                mmoe_pairwise_push(&pw, __ldcg(p + s));
            raw = mmoe_pairwise_result(&pw);
        }
        if (tid == n_out)
            m[n_out] = rms_factor(raw, n, norm_eps);
    }
    __syncthreads();
    if (tid < n_out)
        m[tid] = __fmul_rn(__double2float_rn(raw), m[n_out]);
    __syncthreads();
    if (tid < hc) {
        pre[tid] = __fadd_rn(gfw_sigmoid(__fadd_rn(__fmul_rn(m[tid], pre_scale), pre_base)), hc_eps);
        if (has_post)
            post[t * hc + tid] = __fmul_rn(2.0f, gfw_sigmoid(__fadd_rn(__fmul_rn(m[hc + tid], post_scale), post_base)));
    }
}

/**
 * Entry @p e (< 64) of a Sinkhorn matrix held by a warp, entry i in lane i % 32 of register
 * i / 32 (@p c0, @p c1); @p two: 0 when hc*hc <= 32 (c1 unused).  Every lane must call it.
 */
__device__ __forceinline__ float sk_entry(float c0, float c1, int e, int two)
{
    const float v0 = __shfl_sync(0xFFFFFFFFu, c0, e & 31);
    if (!two)
        return v0;
    const float v1 = __shfl_sync(0xFFFFFFFFu, c1, e & 31);
    return e < 32 ? v0 : v1;
}

/** Sum of row @p j (@p by_col 0) or column @p j (1) of the hc x hc matrix, index ascending, fp32. */
__device__ __forceinline__ float sk_line_sum(float c0, float c1, int hc, int j, int by_col, int two)
{
    float sum = 0.0f;
    for (int kk = 0; kk < hc; kk++)
        sum = __fadd_rn(sum, sk_entry(c0, c1, by_col ? kk * hc + j : j * hc + kk, two));
    return sum;
}

/**
 * The hc x hc base values of the Sinkhorn's logits that lane @p lane of its warp holds
 * (sinkhorn_warp()'s @p c_base: entries lane and lane + 32 of base[2 hc ..]; one past hc x hc
 * keeps the value the caller gave it).
 */
template <int HC>
__device__ __forceinline__ void sinkhorn_lane_base(const float *base, int lane, float (&c_base)[2])
{
#pragma unroll
    for (int q = 0; q < 2; q++)
        if (lane + 32 * q < HC * HC)
            c_base[q] = base[2 * HC + lane + 32 * q];
}

/**
 * The Sinkhorn iterations of mmoe_hc_sinkhorn by one warp in registers: entry i = j*hc + k of
 * C in lane i % 32, register i / 32 (hc <= 8: at most 64 entries); each row or column sum is
 * the oracle's sequential fp32 sum, the entries fetched by shuffles, so every lane of a row gets
 * the same bits, the oracle's; no barrier but the shuffles' own.  With
 * hc*hc <= 32 (hc <= 5) only the first register is live and the second is never computed.
 * @p logit: the block's shared logits of C (m + 2 hc); @p c_scale: scale[2]; @p c_base: the
 * lane's base[2 hc + i] for its two entries (loaded by the caller long before); writes
 * comb[t * hc*hc + i].  HC > 0 fixes hc at compile time (its loops unroll: a line sum issues
 * its hc shuffles together, then adds in order); HC = 0 takes @p hc_rt.
 */
template <int HC>
__device__ void sinkhorn_warp(const float *logit, float c_scale, const float *c_base, int hc_rt, float hc_eps,
                              int iters, float *comb)
{
    const int hc = HC > 0 ? HC : hc_rt;
    const int lane = threadIdx.x & 31, nn = hc * hc, two = nn > 32;
    float c[2] = {0.0f, 0.0f}, e[2] = {0.0f, 0.0f}, s[2] = {1.0f, 1.0f};
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int i = lane + 32 * q;
        if (i < nn)
            c[q] = __fadd_rn(__fmul_rn(logit[i], c_scale), c_base[q]);
    }
#pragma unroll
    for (int q = 0; q < 2; q++) { /* row softmax, + eps */
        const int i = lane + 32 * q, j = (i / hc) % hc; /* rows of dead entries: any valid row */
        if (q == 1 && !two)
            break;
        float mx = sk_entry(c[0], c[1], j * hc, two);
        for (int kk = 1; kk < hc; kk++) {
            const float v = sk_entry(c[0], c[1], j * hc + kk, two);
            mx = v > mx ? v : mx;
        }
        e[q] = gfw_expf(__fsub_rn(c[q], mx));
    }
#pragma unroll
    for (int q = 0; q < 2; q++) {
        if (q == 1 && !two)
            break;
        s[q] = sk_line_sum(e[0], e[1], hc, ((lane + 32 * q) / hc) % hc, 0, two);
    }
#pragma unroll
    for (int q = 0; q < 2; q++)
        if (q == 0 || two)
            c[q] = __fadd_rn(__fdiv_rn(e[q], s[q]), hc_eps);
    for (int it = 0; it < iters; it++) {
        for (int pass = it > 0 ? 0 : 1; pass < 2; pass++) { /* rows (from the second iteration), columns */
#pragma unroll
            for (int q = 0; q < 2; q++) {
                const int i = lane + 32 * q, j = pass == 0 ? (i / hc) % hc : i % hc;
                if (q == 1 && !two)
                    break;
                s[q] = sk_line_sum(c[0], c[1], hc, j, pass, two);
            }
#pragma unroll
            for (int q = 0; q < 2; q++)
                if (q == 0 || two)
                    c[q] = __fdiv_rn(c[q], __fadd_rn(s[q], hc_eps));
        }
    }
#pragma unroll
    for (int q = 0; q < 2; q++)
        if (lane + 32 * q < nn)
            comb[lane + 32 * q] = c[q];
}

/** sinkhorn_warp() with hc fixed at compile time for the model's hc = 4, else at run time. */
__device__ void sinkhorn_warp_any(const float *logit, float c_scale, const float *c_base, int hc, float hc_eps,
                                  int iters, float *comb)
{
    if (hc == 4)
        sinkhorn_warp<4>(logit, c_scale, c_base, hc, hc_eps, iters, comb);
    else
        sinkhorn_warp<0>(logit, c_scale, c_base, hc, hc_eps, iters, comb);
}

/**
 * Second half of hc_pre (n_out = (2+hc)*hc: pre, post, Sinkhorn comb, mix) or hc_head
 * (n_out = hc: pre and mix only) for token blockIdx.y (mmoe_mhc.c, step by step), spread so
 * that nothing waits for memory twice: with a Sinkhorn (n_out > hc), block 0 computes the
 * logits (hc_finish_logits), post, and the Sinkhorn iterations in its warp 0 (sinkhorn_warp:
 * registers and shuffles, no block barrier inside the iterations); the other blocks, or all of
 * them for hc_head, mix one channel per thread, c = (blockIdx.x - 1 or - 0) * blockDim.x +
 * threadIdx.x.  Each thread loads what it needs (its hc stream values, its Sinkhorn base
 * entries) before the logits, so those loads overlap the wait for the block sums.  Every step
 * has the oracle's operations on the same operands in the same order, so the same bits.
 * blockDim.x: a multiple of 32, at least n_out + 1; grid: nblk(D) + (n_out > hc) blocks of 256
 * (launch_hc_mix()).
 */
__global__ void k_hc_finish_split(const uint16_t *X, int64_t D, int hc, const double *part, int S, const float *base,
                                  const float *scale, int n_out, float norm_eps, float hc_eps, int iters, uint16_t *y,
                                  float *post, float *comb)
{
    gfw_pdl_enter();
    __shared__ float m[(2 + 8) * 8 + 1];
    __shared__ float pre[8];
    const int64_t t = blockIdx.y, n = (int64_t)hc * D;
    const int has_sinkhorn = n_out > hc, sinkhorn = has_sinkhorn && blockIdx.x == 0;
    const int64_t c = (int64_t)(blockIdx.x - has_sinkhorn) * blockDim.x + threadIdx.x;
    const uint16_t *Xt = X + t * n;
    float xv[8], c_scale = 0.0f, c_base[2] = {0.0f, 0.0f};
    if (sinkhorn) {
        if (threadIdx.x < 32) {
            c_scale = scale[2];
#pragma unroll
            for (int q = 0; q < 2; q++)
                if ((int)threadIdx.x + 32 * q < hc * hc)
                    c_base[q] = base[2 * hc + threadIdx.x + 32 * q];
        }
    } else if (c < D) {
#pragma unroll
        for (int jj = 0; jj < 8; jj++)
            if (jj < hc)
                xv[jj] = gfw_bf2f(Xt[jj * D + c]);
    }
    hc_finish_logits(t, n, hc, part, S, base, scale, n_out, norm_eps, hc_eps, sinkhorn, post, m, pre);
    __syncthreads();
    if (sinkhorn) {
        if (threadIdx.x < 32)
            sinkhorn_warp_any(m + 2 * hc, c_scale, c_base, hc, hc_eps, iters, comb + t * hc * hc);
        return;
    }
    if (c >= D)
        return;
    float acc = 0.0f; /* the mix y = bf16(sum_j pre[j] X[j]): j ascending from +0, fp32 (mmoe_hc_pre's) */
#pragma unroll
    for (int jj = 0; jj < 8; jj++)
        if (jj < hc)
            acc = __fadd_rn(acc, __fmul_rn(pre[jj], xv[jj]));
    y[t * D + c] = gfw_f2bf(acc);
}

/** The mHC width k_hc_pre_norm is compiled for (the model's: DeepSeek-V4 has hc = 4). */
#define GFW_HC_FUSED_HC 4

/**
 * Threads of k_hc_pre_norm: GFW_HC_PART_CHUNKS for the block sums, the mix and the norm (one
 * chunk of 16 each), and one warp more for the Sinkhorn iterations.
 */
#define GFW_HC_FUSED_THREADS (GFW_HC_PART_CHUNKS + 32)

/**
 * Blocks of k_hc_pre_norm per multiprocessor that its registers allow (it is compiled for at
 * least this many): its grid is used where it fits one wave of them (hc_pre_norm_fits()).
 */
#define GFW_HC_FUSED_BLOCKS_PER_SM 2

/** What k_hc_pre_norm reads and writes (one struct: the launch takes one argument). */
struct hc_pre_norm_args {
    const uint16_t *X;          /**< streams [T, hc, D] */
    int64_t D;                  /**< width */
    const float *fn;            /**< mHC fn [n_out, hc D] */
    const float *base;          /**< mHC base [n_out] */
    const float *scale;         /**< mHC scale [3] */
    int n_out;                  /**< (2 + hc) hc for an hc_pre, hc for hc_head */
    int iters;                  /**< Sinkhorn iterations */
    float hc_eps;               /**< the Sinkhorn's epsilon */
    float norm_eps;             /**< the epsilon of the logits' rms factor */
    double *part;               /**< block sums [T, n_out + 1, S] */
    unsigned *arrive;           /**< [T] blocks of each token done; 0 between launches */
    float *post;                /**< hc_pre only: [T, hc] */
    float *comb;                /**< hc_pre only: [T, hc, hc] */
    float *comb_logits;         /**< hc_pre only: NULL (the kernel runs the Sinkhorn), or where its logits go [T, hc, hc] */
    ddense w;                   /**< the RMSNorm's weight [D] */
    float eps;                  /**< the RMSNorm's epsilon */
    uint16_t *y;                /**< the normed mix [T, D] */
    uint8_t *q;                 /**< NULL, or y quantized: codes [T, D] (rmsnorm_chunk_quant()) */
    float *qs;                  /**< with q: scales [T, D / 128] */
    float *mb;                  /**< NULL, or the MoE's fp32 input (rmsnorm_chunk_quant()) */
    float *mq;                  /**< with mb: the MoE's quantized input */
};

/**
 * hc_pre (or hc_head) and the RMSNorm after it in one launch, for widths D <= 16
 * GFW_HC_PART_CHUNKS (one chunk of 16 channels per thread) and hc = GFW_HC_FUSED_HC: the same
 * operations on the same operands in the same order as k_hc_part, k_hc_finish_split and
 * k_rmsnorm (with its quantization) one after the other, so the same bits, in one kernel
 * instead of three.
 *
 * Every block (s, r, t) first sums its node of reduction r as k_hc_part does, its first
 * GFW_HC_PART_CHUNKS threads one chunk each and the last warp +0 (a ninth warp sum of +0 is the
 * tree's own padding: the same node), and stores it into @p part; then its thread 0 counts
 * the block in arrive[t] (after a fence, so that the sum is visible before the count).  The
 * block that counts last for token t (each token's sums are then all stored) resets the count
 * for the next launch and finishes the token alone: the logits, pre and post
 * (hc_finish_logits(), reading the sums through the L2), then its last warp runs the Sinkhorn
 * iterations (sinkhorn_warp()) while thread b of the others mixes channels [16 b, 16 b + 16)
 * (the mix's sum, as k_hc_finish_split's), sums their squares as k_rmsnorm's chunk b, joins the norm's tree
 * (barrier 1: the Sinkhorn warp is not waited for) and stores its 16 normed values (and their
 * quantization, rmsnorm_chunk_quant()).  Thread b's stream values and norm weights are loaded
 * before the logits, so the finishing block waits for memory once.  Nothing waits on another
 * block: a block that is not last exits.
 */
__global__ void __launch_bounds__(GFW_HC_FUSED_THREADS, GFW_HC_FUSED_BLOCKS_PER_SM) k_hc_pre_norm(hc_pre_norm_args a)
{
    constexpr int HC = GFW_HC_FUSED_HC, NT = GFW_HC_PART_CHUNKS, C = MMOE_SUM_CHUNK;
    const int64_t n = HC * a.D, r = blockIdx.y, k = (int64_t)blockIdx.x * NT + threadIdx.x;
    const int mixer = threadIdx.x < NT;
    const float *row = r < a.n_out ? a.fn + r * n : NULL; /* NULL: the sum of squares */
    /* fn is no kernel's output: the chunk is asked of the L2 while the kernel before still runs */
    if (mixer && row != NULL && k * C < n)
        gfw_prefetch_l2(row + k * C);
    gfw_pdl_enter();
    __shared__ double sh[33];
    __shared__ float m[(2 + HC) * HC + 1];
    __shared__ float pre[HC];
    __shared__ int last;
    const int64_t t = blockIdx.z;
    const int tid = threadIdx.x, S = (int)gridDim.x;
    const uint16_t *Xt = a.X + t * n;
    double leaf = 0.0; /* the Sinkhorn warp's leaves: +0, as the tree's padding */
    if (mixer) {
        if (!hc_chunk_vec(Xt, row, k, n, &leaf))
            leaf = row != NULL ? gfw_run_sum(fn_term{row, Xt}, k, 1, n) : gfw_run_sum(sq_term{Xt}, k, 1, n);
    }
    const double node = gfw_threads_tree(leaf, sh, GFW_HC_FUSED_THREADS, 0);
    if (tid == 0) {
        a.part[(t * (a.n_out + 1) + blockIdx.y) * S + blockIdx.x] = node;
        __threadfence();
        last = atomicAdd(a.arrive + t, 1u) == (unsigned)(S * (int)gridDim.y) - 1u;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    if (tid == 0)
        a.arrive[t] = 0u; /* every block of token t has counted */
    const int has_sinkhorn = a.n_out > HC;
    const int64_t i0 = (int64_t)tid * C;
    const int live = mixer && i0 < a.D;
    const void *wc = a.w.dtype == GFW_F32 ? (const void *)((const float *)a.w.p + i0)
                                          : (const void *)((const uint16_t *)a.w.p + i0);
    const int w_vec = gfw_aligned16(wc), w_words = a.w.dtype == GFW_F32 ? 4 : 2;
    float c_scale = 0.0f, c_base[2] = {0.0f, 0.0f};
    uint4 xr[HC][2], wr[4]; /* the chunk's stream values and norm weights as loaded (bf16 or fp32 bits) */
    if (!mixer) {
        if (has_sinkhorn) {
            c_scale = a.scale[2];
            sinkhorn_lane_base<HC>(a.base, tid - NT, c_base);
        }
    } else if (live) {
#pragma unroll
        for (int j = 0; j < HC; j++) { /* aligned: D is a multiple of 128 */
            xr[j][0] = ((const uint4 *)(Xt + j * a.D + i0))[0];
            xr[j][1] = ((const uint4 *)(Xt + j * a.D + i0))[1];
        }
        if (w_vec) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (k < w_words)
                    wr[k] = ((const uint4 *)wc)[k];
        }
    }
    hc_finish_logits(t, n, HC, a.part, S, a.base, a.scale, a.n_out, a.norm_eps, a.hc_eps, has_sinkhorn, a.post, m, pre);
    __syncthreads();
    if (!mixer) {
        if (has_sinkhorn && a.comb_logits != NULL) { /* k_hc_sinkhorn, on the side stream, runs the iterations */
            if (tid - NT < HC * HC)
                a.comb_logits[t * HC * HC + (tid - NT)] = m[2 * HC + (tid - NT)];
        } else if (has_sinkhorn) {
            sinkhorn_warp<HC>(m + 2 * HC, c_scale, c_base, HC, a.hc_eps, a.iters, a.comb + t * HC * HC);
        }
        return;
    }
    float acc[C], v[C]; /* the mix's sums (stream j ascending from +0); v: one stream's values */
#pragma unroll
    for (int i = 0; i < C; i++)
        acc[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < HC; j++) {
        if (live)
            gfw_bf16x16_to_f32(xr[j][0], xr[j][1], v);
#pragma unroll
        for (int i = 0; i < C; i++)
            acc[i] = __fadd_rn(acc[i], __fmul_rn(pre[j], live ? v[i] : 0.0f));
    }
    uint16_t yb[C];
    double chunk = 0.0; /* k_rmsnorm's chunk of squares */
#pragma unroll
    for (int i = 0; i < C; i++) {
        yb[i] = gfw_f2bf(acc[i]);
        const double x = (double)gfw_bf2f(yb[i]);
        if (live) /* a chunk past the row is +0, as in k_rmsnorm */
            chunk = __dadd_rn(chunk, __dmul_rn(x, x));
    }
    const float rs = rms_factor(gfw_threads_tree(chunk, sh, NT, 1), a.D, a.eps);
    float wv[C];
    if (live && w_vec && a.w.dtype == GFW_F32) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[4 * k] = __uint_as_float(wr[k].x), wv[4 * k + 1] = __uint_as_float(wr[k].y);
            wv[4 * k + 2] = __uint_as_float(wr[k].z), wv[4 * k + 3] = __uint_as_float(wr[k].w);
        }
    } else if (live && w_vec) {
        gfw_bf16x16_to_f32(wr[0], wr[1], wv);
    } else {
#pragma unroll
        for (int i = 0; i < C; i++)
            wv[i] = live ? dv_at(a.w, i0 + i) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < C; i++)
        yb[i] = gfw_f2bf(__fmul_rn(wv[i], __fmul_rn(gfw_bf2f(yb[i]), rs)));
    if (live)
        gfw_store_bf16x16(a.y + t * a.D + i0, yb);
    if (a.q != NULL || a.mq != NULL) /* every lane of the warp: its 128-blocks' amax are shuffles */
        rmsnorm_chunk_quant(yb, live ? C : 0, t, a.D, a.q, a.qs, a.mb, a.mq);
}


/**
 * The Sinkhorn iterations of token blockIdx.x's hc_pre from the hc x hc logits that
 * k_hc_pre_norm stored in @p logit (its comb_logits) into @p comb: sinkhorn_warp() in one warp,
 * the same steps as k_hc_pre_norm's own Sinkhorn warp, so the same bits.  A plain launch on the
 * side stream (sinkhorn_side()), after an event recorded behind k_hc_pre_norm: nothing on the
 * main stream waits for it before the sub-layer's hc_post.
 */
__global__ void k_hc_sinkhorn(const float *logit, const float *base, const float *scale, float hc_eps, int iters,
                              float *comb)
{
    constexpr int HC = GFW_HC_FUSED_HC;
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x;
    float c_base[2] = {0.0f, 0.0f};
    sinkhorn_lane_base<HC>(base, lane, c_base);
    sinkhorn_warp<HC>(logit + t * HC * HC, scale[2], c_base, HC, hc_eps, iters, comb + t * HC * HC);
}

/**
 * hc_post (mmoe_mhc.c) of token blockIdx.y of width D, one channel per thread over the blocks
 * blockIdx.x (launch_hc_post(); hc_post_channel(): hc = 4, the model's, with its loops unrolled).
 */
__global__ void k_hc_post(const uint16_t *out, uint16_t *X, int64_t D, int hc, const float *post, const float *comb)
{
    gfw_pdl_enter();
    const int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D)
        return;
    hc_post_channel_any(gfw_bf2f(out[t * D + c]), X, t, c, D, hc, post, comb);
}

/**
 * The MoE sub-layer's combine and the hc_post after it in one launch: channel c of token
 * blockIdx.y takes its combined output from the slot rows (gfw_moe_combine_channel(), the
 * combine kernel's rule and bits), stores it in @p out as the combine kernel does, and updates
 * the streams with it as k_hc_post does.  Both steps are per channel, so one thread does both.
 */
__global__ void k_hc_post_moe(const uint16_t *slot_y, const int32_t *idx, int64_t T, int k, int has_shared,
                              uint16_t *out, uint16_t *X, int64_t D, int hc, const float *post, const float *comb)
{
    gfw_pdl_enter();
    const int64_t t = blockIdx.y, c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D)
        return;
    const uint16_t y = gfw_moe_combine_channel(slot_y, idx, T, k, D, has_shared, t, c);
    out[t * D + c] = y;
    hc_post_channel_any(gfw_bf2f(y), X, t, c, D, hc, post, comb);
}

/* ================================================================== kernels: attention */

/**
 * The rotation of attn_rope.c of the pair (@p a, @p b), pair @p p of @p half at position @p pos
 * (inverse: by the conjugate), into @p re and @p im (fp32, before their bf16 rounding).
 */
__device__ __forceinline__ void rope_rotate(float a, float b, const float *cs, int64_t pos, int half, int p,
                                            int inverse, float *re, float *im)
{
    const float c = cs[(pos * half + p) * 2], s = cs[(pos * half + p) * 2 + 1];
    if (!inverse) {
        *re = __fmaf_rn(a, c, -__fmul_rn(b, s)); /* the real part fused, as attn_rope.c */
        *im = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    } else {
        *re = __fmaf_rn(a, c, __fmul_rn(b, s));
        *im = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

/** Rotate pair @p p of the rope dims @p v at position @p pos (attn_rope.c; inverse: the conjugate). */
__device__ __forceinline__ void rope_pair(uint16_t *v, int p, int half, const float *cs, int64_t pos, int inverse)
{
    float re, im;
    rope_rotate(gfw_bf2f(v[2 * p]), gfw_bf2f(v[2 * p + 1]), cs, pos, half, p, inverse, &re, &im);
    v[2 * p] = gfw_f2bf(re);
    v[2 * p + 1] = gfw_f2bf(im);
}

/** The bf16-rounded square of bf16 value i (the q rescaling's term). */
struct bf_sq_term {
    const uint16_t *x; /**< the values */
    /** Term @p i: bf16(x_i^2). */
    __device__ double operator()(int64_t i) const
    {
        const float v = gfw_bf2f(x[i]);
        return (double)gfw_bfr(__fmul_rn(v, v));
    }
};

/**
 * q_h <- q_h * rsqrt(mean(q_h^2) + eps) in bf16 steps (attn_forward.c), then RoPE on its last
 * rope_dim dims at position pos0 + row / H (pos0 from the step record); one warp per row of
 * @p rows (t, head), the rows of block @p bx of k_q_kv_finish's q part, the squares summed in
 * the order of @ref spec_arch_sum_order.  When each lane's run is one chunk, d a multiple of 16
 * and the row 16-byte aligned (d = 128 and 512), lane l loads its chunk [16 l, 16 l + 16) in
 * two 16-byte vectors, keeps it in registers for the scaling and stores the scaled chunk the
 * same way; else the lanes stride over the row.  The values, operations and order are the same
 * either way.
 */
__device__ __forceinline__ void scale_heads_block(uint16_t *q, int64_t rows, int64_t d, float eps, int64_t H,
                                                  int rope_dim, const float *cs, int64_t pos0, int64_t bx)
{
    const int64_t row = (bx * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    uint16_t *qh = q + row * d;
    const int64_t r = gfw_chunks_per_lane(d, 32), i0 = (int64_t)lane * MMOE_SUM_CHUNK;
    const bool vec = r == 1 && d % MMOE_SUM_CHUNK == 0 && gfw_aligned16(qh), live = i0 < d;
    float xv[MMOE_SUM_CHUNK];
    double part = 0.0;
    if (vec) {
        if (live) {
            gfw_load_bf16x16(qh + i0, xv);
#pragma unroll
            for (int i = 0; i < MMOE_SUM_CHUNK; i++) /* bf_sq_term, gfw_chunk_sum's order */
                part = __dadd_rn(part, (double)gfw_bfr(__fmul_rn(xv[i], xv[i])));
        }
    } else {
        part = gfw_run_sum(bf_sq_term{qh}, (int64_t)lane * r, r, d);
    }
    const double sum = gfw_group_pairwise(part, 32);
    const float mean = gfw_bfr(__fdiv_rn(__double2float_rn(sum), (float)d));
    const float with_eps = gfw_bfr(__fadd_rn(mean, eps));
    const float rs = gfw_bfr(__fdiv_rn(1.0f, __fsqrt_rn(with_eps)));
    if (vec) {
        if (live) {
            uint16_t yb[MMOE_SUM_CHUNK];
#pragma unroll
            for (int i = 0; i < MMOE_SUM_CHUNK; i++)
                yb[i] = gfw_f2bf(__fmul_rn(xv[i], rs));
            gfw_store_bf16x16(qh + i0, yb);
        }
    } else {
        for (int64_t c = lane; c < d; c += 32)
            qh[c] = gfw_f2bf(__fmul_rn(gfw_bf2f(qh[c]), rs));
    }
    __syncwarp();
    for (int p = lane; p < rope_dim / 2; p += 32)
        rope_pair(qh + d - rope_dim, p, rope_dim / 2, cs, pos0 + row / H, 0);
}

/**
 * In-place FP8 round trip of the first n values (whole blocks of 64) of a row (qat_roundtrip.c),
 * by warp @p warp of @p nwarps: warp w takes blocks w, w + nwarps, ...; lane l holds values l and
 * l + 32 of a block.  The amax is a maximum (any order gives it; a NaN makes it NaN, and every NaN
 * gives the same scale).
 */
__device__ void fp8_roundtrip_warps(uint16_t *x, int64_t n, int warp, int nwarps)
{
    const int lane = threadIdx.x & 31;
    for (int64_t b0 = (int64_t)warp * 64; b0 + 64 <= n; b0 += (int64_t)nwarps * 64) {
        const float v0 = gfw_bf2f(x[b0 + lane]), v1 = gfw_bf2f(x[b0 + 32 + lane]);
        const float a0 = fabsf(v0), a1 = fabsf(v1);
        const float amax = gfw_warp_amax_nan(isnan(a0) ? a0 : (isnan(a1) ? a1 : (a1 > a0 ? a1 : a0)));
        const float clamped = amax < 1e-4f ? 1e-4f : amax;
        const float s = gfw_ue8m0(gfw_ue8m0_ceil_clamped(__fmul_rn(clamped, 1.0f / 448.0f)));
        float w0 = __fdiv_rn(v0, s), w1 = __fdiv_rn(v1, s);
        w0 = w0 > 448.0f ? 448.0f : (w0 < -448.0f ? -448.0f : w0);
        w1 = w1 > 448.0f ? 448.0f : (w1 < -448.0f ? -448.0f : w1);
        x[b0 + lane] = gfw_f2bf(__fmul_rn(gfw_e4m3_value(gfw_e4m3_code(w0)), s));
        x[b0 + 32 + lane] = gfw_f2bf(__fmul_rn(gfw_e4m3_value(gfw_e4m3_code(w1)), s));
    }
}

/**
 * In-place FP4 round trip of n values (whole blocks of 32), warp w of @p nwarps taking blocks
 * w, w + nwarps, ..., lane l value l of a block (the amax ignores NaN, as the oracle's).
 */
__device__ void fp4_roundtrip_warps(uint16_t *x, int64_t n, int warp, int nwarps)
{
    const int lane = threadIdx.x & 31;
    for (int64_t b0 = (int64_t)warp * 32; b0 + 32 <= n; b0 += (int64_t)nwarps * 32) {
        const float v = gfw_bf2f(x[b0 + lane]);
        const float amax = gfw_warp_amax(fabsf(v));
        const float clamped = amax < 0x1.8p-124f ? 0x1.8p-124f : amax;
        const float s = gfw_ue8m0(gfw_ue8m0_ceil_clamped(__fmul_rn(clamped, 1.0f / 6.0f)));
        float w = __fdiv_rn(v, s);
        w = w > 6.0f ? 6.0f : (w < -6.0f ? -6.0f : w);
        x[b0 + lane] = gfw_f2bf(__fmul_rn(gfw_e2m1_round(w), s));
    }
}

/**
 * Normalized Walsh-Hadamard rotation of @p rows rows of n (a power of two) bf16 values by the
 * whole block, fp32 butterflies in the oracle's stages (attn_hadamard.c): in stage h every pair
 * (i, i + h) is independent, so the threads split the pairs; @p v: rows * n floats of shared
 * memory.  Contains __syncthreads().
 */
__device__ void hadamard_block(uint16_t *x, int64_t rows, int n, float *v)
{
    const int64_t total = rows * n, pairs = total / 2;
    for (int64_t i = threadIdx.x; i < total; i += blockDim.x)
        v[i] = gfw_bf2f(x[i]);
    __syncthreads();
    for (int h = 1; h < n; h *= 2) {
        for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
            const int64_t row = p / (n / 2), q = p % (n / 2);
            const int64_t i = row * n + (q / h) * 2 * h + q % h;
            const float a = v[i], b = v[i + h];
            v[i] = __fadd_rn(a, b);
            v[i + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float scale = (float)(1.0 / sqrt((double)n));
    for (int64_t i = threadIdx.x; i < total; i += blockDim.x)
        x[i] = gfw_f2bf(__fmul_rn(v[i], scale));
    __syncthreads();
}

/**
 * The kv row @p row of a call (by one block, blockDim.x a power of two): RMSNorm with @p w
 * (the block's tree of squares, @ref spec_arch_sum_order), RoPE on the last rope_dim dims at
 * position pos0 + row (pos0 from the step record), and the FP8 round trip of the others
 * (attn_forward.c), in place.  With @p ring (one-token calls only: k_ring_store's step, see
 * k_q_kv_finish) the finished row is also stored in the window ring of @p W rows.
 */
__device__ __forceinline__ void kv_finish_row(uint16_t *kv, int64_t d, const ddense &w, float eps, int rope_dim,
                                              const float *cs, int64_t pos0, int64_t row, uint16_t *ring, int W)
{
    __shared__ double sh[33];
    uint16_t *x = kv + row * d;
    const float rs = rms_factor(gfw_block_sum(sq_term{x}, d, sh), d, eps);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        x[i] = gfw_f2bf(__fmul_rn(dv_at(w, i), __fmul_rn(gfw_bf2f(x[i]), rs)));
    __syncthreads();
    for (int p = threadIdx.x; p < rope_dim / 2; p += blockDim.x)
        rope_pair(x + d - rope_dim, p, rope_dim / 2, cs, pos0 + row, 0);
    fp8_roundtrip_warps(x, d - rope_dim, threadIdx.x / 32, blockDim.x / 32);
    if (ring == NULL)
        return;
    __syncthreads(); /* the row is final */
    uint16_t *slot = ring + ((pos0 + row) % W) * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
        slot[i] = x[i];
}

/**
 * The q heads' scaling and RoPE (scale_heads_block(), blocks [0, q_blocks)) and the kv rows'
 * norm, RoPE and FP8 round trip (kv_finish_row(), one block per token after them) in one
 * launch: the two write different tensors (q from W_qb, kv from W_kv), so they run side by
 * side, each block as its own kernel ran it.  With @p ring (a one-token call) the kv row also
 * goes into the window ring of @p W rows, k_ring_store's step done here, before the attention
 * instead of after it: the slot it overwrites holds position pos - W, which the window of the
 * token at pos (positions pos - W + 1 .. pos) does not read.  With more tokens a row's slot
 * can hold a position an earlier token of the call still reads, so k_ring_store runs after
 * k_attend.
 */
__global__ void k_q_kv_finish(uint16_t *q, int64_t q_rows, int64_t d, float eps, int64_t H, int64_t q_blocks,
                              uint16_t *kv, ddense kv_w, float kv_eps, int rope_dim, const float *cs,
                              const int64_t *pos_dev, uint16_t *ring, int W)
{
    if ((int64_t)blockIdx.x >= q_blocks)
        ddense_prefetch_l2(kv_w, d);
    gfw_pdl_enter();
    const int64_t pos0 = *pos_dev;
    if ((int64_t)blockIdx.x < q_blocks)
        scale_heads_block(q, q_rows, d, eps, H, rope_dim, cs, pos0, blockIdx.x);
    else
        kv_finish_row(kv, d, kv_w, kv_eps, rope_dim, cs, pos0, (int64_t)blockIdx.x - q_blocks, ring, W);
}

/** Warps of a k_indexer_q_split block (one indexer head each). */
#define GFW_IDXQ_WARPS 4

/**
 * The indexer query transform (attn_forward.c) of one head of n = 32 V values by one warp, in
 * registers: value i = V lane + r is register r of lane lane (the FP4 blocks of 32 values are
 * the aligned groups of 32 / V lanes).  The steps and their operations are those of rope_pair,
 * hadamard_block and fp4_roundtrip_warps (the oracle's), value by value:
 *   - RoPE of the pairs (2p, 2p + 1) of the last rope_dim values, each rounded to bf16 (for V = 1
 *     the partner of a pair is the neighbour lane's register, fetched by a shuffle);
 *   - the Hadamard stages h = 1, 2, ..., n/2 in that order, each butterfly a + b and a - b of
 *     the same two fp32 operands as the shared-memory version: stages h < V within a lane,
 *     stages h >= V between lanes l and l ^ (h / V) (the lane without that bit keeps a + b, the
 *     other a - b with a its partner's value); then the scale and the bf16 rounding;
 *   - the FP4 round trip of each block (unless @p fp4 is 0): amax over the block ignoring NaN
 *     (a maximum: any order gives it), the UE8M0 scale, the E2M1 rounding, bf16.
 */
template <int V>
__device__ __forceinline__ void indexer_q_head_warp(uint16_t *qh, int rope_dim, const float *cs, int64_t pos, int fp4)
{
    const int lane = threadIdx.x & 31, n = 32 * V, half = rope_dim / 2, r0 = n - rope_dim;
    float v[V], rot[V];
#pragma unroll
    for (int r = 0; r < V; r++)
        v[r] = gfw_bf2f(qh[lane * V + r]);
#pragma unroll
    for (int r = 0; r < V; r++) { /* RoPE (rope_pair) */
        const int i = lane * V + r;
        const float other = V > 1 ? v[r ^ 1] : __shfl_xor_sync(0xFFFFFFFFu, v[r], 1);
        rot[r] = v[r];
        if (i >= r0) {
            const int p = (i - r0) / 2;
            const float c = cs[(pos * half + p) * 2], s = cs[(pos * half + p) * 2 + 1];
            const float a = (i & 1) ? other : v[r], b = (i & 1) ? v[r] : other;
            rot[r] = gfw_bfr((i & 1) ? __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)) : __fmaf_rn(a, c, -__fmul_rn(b, s)));
        }
    }
#pragma unroll
    for (int h = 1; h < V; h *= 2) /* Hadamard stages within a lane */
#pragma unroll
        for (int r = 0; r < V; r++)
            if (!(r & h)) {
                const float a = rot[r], b = rot[r + h];
                rot[r] = __fadd_rn(a, b);
                rot[r + h] = __fsub_rn(a, b);
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) /* stages h = V m between lanes */
#pragma unroll
        for (int r = 0; r < V; r++) {
            const float o = __shfl_xor_sync(0xFFFFFFFFu, rot[r], m);
            rot[r] = (lane & m) ? __fsub_rn(o, rot[r]) : __fadd_rn(rot[r], o);
        }
    const float scale = (float)(1.0 / sqrt((double)n));
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < V; r++) {
        rot[r] = gfw_bfr(__fmul_rn(rot[r], scale));
        const float a = fabsf(rot[r]);
        amax = a > amax ? a : amax; /* NaN never wins */
    }
    if (!fp4) { /* the Hadamard output alone (a test of the stages) */
#pragma unroll
        for (int r = 0; r < V; r++)
            qh[lane * V + r] = gfw_f2bf(rot[r]);
        return;
    }
#pragma unroll
    for (int o = 1; o < 32 / V; o *= 2) { /* the other lanes of the block */
        const float b = __shfl_xor_sync(0xFFFFFFFFu, amax, o);
        amax = b > amax ? b : amax;
    }
    const float clamped = amax < 0x1.8p-124f ? 0x1.8p-124f : amax;
    const float s = gfw_ue8m0(gfw_ue8m0_ceil_clamped(__fmul_rn(clamped, 1.0f / 6.0f)));
#pragma unroll
    for (int r = 0; r < V; r++) {
        float w = __fdiv_rn(rot[r], s);
        w = w > 6.0f ? 6.0f : (w < -6.0f ? -6.0f : w);
        qh[lane * V + r] = gfw_f2bf(__fmul_rn(gfw_e2m1_round(w), s));
    }
}

/**
 * Indexer queries (attn_forward.c), split over heads: RoPE on the last rope_dim dims of each
 * head at position pos0 + t (pos0 = *pos_dev, the step record), Hadamard per head, FP4 (every
 * FP4 block lies in one head as id >= 32).  Warp w of block (x, t) takes head
 * GFW_IDXQ_WARPS x + w of token t (indexer_q_head_warp, head width 32 V) and that head's weight
 * wi = bf16(wi * w_scale); no block barrier.
 * @p fp4 0 stops after the Hadamard (for the tests; the forward passes 1).
 */
template <int V>
__global__ void __launch_bounds__(GFW_IDXQ_WARPS * 32)
    k_indexer_q_split(uint16_t *qi, int ih, int rope_dim, const float *cs, const int64_t *pos_dev, uint16_t *wi,
                      float w_scale, int fp4)
{
    gfw_pdl_enter();
    const int64_t pos0 = *pos_dev;
    const int h = blockIdx.x * GFW_IDXQ_WARPS + threadIdx.x / 32;
    const int64_t t = blockIdx.y;
    if (h >= ih) /* whole warps */
        return;
    indexer_q_head_warp<V>(qi + (t * ih + h) * 32 * V, rope_dim, cs, pos0 + t, fp4);
    if ((threadIdx.x & 31) == 0 && wi != NULL)
        wi[t * ih + h] = gfw_f2bf(__fmul_rn(gfw_bf2f(wi[t * ih + h]), w_scale));
}

/** Arguments of the compressor kernel. */
struct comp_args {
    const float *kv, *gate;   /**< [T, c*dh] projections of the call */
    const float *ape;         /**< [ratio, c*dh] */
    float *kv_state, *score_state; /**< [c*ratio, c*dh] */
    ddense norm;              /**< [dh] */
    int ratio, overlap, dh, rope_dim;
    float eps;
    const float *cs;          /**< cos/sin table of the layer */
    int kind;                 /**< 0: attention kv (FP8 round trip), 1: indexer (Hadamard + FP4) */
    uint16_t *out;            /**< [max_blocks, dh]: block j in row j */
    const int64_t *pos0;      /**< device: position of the call's first token (the step record) */
    int64_t T;                /**< tokens of the call */
    /** @var comp_args::kv
     *  [T, c*dh] kv projection of the call
     *  @var comp_args::kv_state
     *  [c*ratio, c*dh] kv state
     *  @var comp_args::ratio
     *  compression ratio
     *  @var comp_args::overlap
     *  c: 2 for overlapping blocks (ratio 4), else 1
     *  @var comp_args::dh
     *  head dimension
     *  @var comp_args::rope_dim
     *  rotary dimensions
     *  @var comp_args::eps
     *  RMSNorm epsilon */
};

/** Values of a thread that k_compress loads before it stores any (each batch one wait for memory). */
#define GFW_COMP_BATCH 8

/** Slots of a pooled block up to which k_compress holds a channel's scores and values in registers
 *  (the 2 * 4 of the overlapping ratio-4 blocks). */
#define GFW_COMP_POOL_REGS 8

/** Most threads of k_compress (its launch bound: at most 128 registers a thread). */
#define GFW_COMP_MAX_THREADS 512

/** The square of the bf16 rounding of fp32 value i (the compressed row's RMSNorm term), exact in double. */
struct bfr_sq_term {
    const float *v; /**< the fp32 values */
    /** Term @p i: bf16(v_i)^2. */
    __device__ double operator()(int64_t i) const
    {
        const double b = (double)gfw_bfr(v[i]);
        return __dmul_rn(b, b);
    }
};

/**
 * Channel @p ch of a completed block (attn_compressor.c): the max of the n gated scores of slot
 * order, the fp32 sum of their exps in slot order, and the sum of p_i kv_i in slot order, with
 * p_i = exp_i / den; 0 when every score is -inf.  Up to GFW_COMP_POOL_REGS slots are loaded at
 * once and each exp computed once (the same function of the same operand, so the same bits as
 * computing it again for the weighted sum); longer blocks read the state in each pass.
 */
__device__ __forceinline__ float comp_pool_channel(const comp_args &a, int ch)
{
    const int r = a.ratio, c = a.overlap, dh = a.dh, width = c * dh, n = c == 2 ? 2 * r : r;
    if (n <= GFW_COMP_POOL_REGS) {
        float g[GFW_COMP_POOL_REGS], v[GFW_COMP_POOL_REGS], e[GFW_COMP_POOL_REGS];
#pragma unroll
        for (int i = 0; i < GFW_COMP_POOL_REGS; i++)
            if (i < n) {
                const int cc = (c == 2 && i >= r) ? dh + ch : ch;
                g[i] = a.score_state[(int64_t)i * width + cc];
                v[i] = a.kv_state[(int64_t)i * width + cc];
            }
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < GFW_COMP_POOL_REGS; i++)
            if (i < n && g[i] > m)
                m = g[i];
        if (m == -INFINITY)
            return 0.0f;
        float den = 0.0f;
#pragma unroll
        for (int i = 0; i < GFW_COMP_POOL_REGS; i++)
            if (i < n) {
                e[i] = gfw_expf(__fsub_rn(g[i], m));
                den = __fadd_rn(den, e[i]);
            }
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < GFW_COMP_POOL_REGS; i++)
            if (i < n)
                acc = __fadd_rn(acc, __fmul_rn(__fdiv_rn(e[i], den), v[i]));
        return acc;
    }
    float m = -INFINITY;
    for (int i = 0; i < n; i++) {
        const int cc = (c == 2 && i >= r) ? dh + ch : ch;
        const float g = a.score_state[(int64_t)i * width + cc];
        if (g > m)
            m = g;
    }
    if (m == -INFINITY)
        return 0.0f;
    float den = 0.0f;
    for (int i = 0; i < n; i++) {
        const int cc = (c == 2 && i >= r) ? dh + ch : ch;
        den = __fadd_rn(den, gfw_expf(__fsub_rn(a.score_state[(int64_t)i * width + cc], m)));
    }
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        const int cc = (c == 2 && i >= r) ? dh + ch : ch;
        const float p = __fdiv_rn(gfw_expf(__fsub_rn(a.score_state[(int64_t)i * width + cc], m)), den);
        acc = __fadd_rn(acc, __fmul_rn(p, a.kv_state[(int64_t)i * width + cc]));
    }
    return acc;
}

/**
 * The compressor of attn_compressor.c for the T tokens of a call, in order, one block of
 * threads (a power of two) per compressor: block b runs @p a0 (b = 0) or @p a1 (b = 1; the
 * layer's two compressors, attention and indexer, are independent and run side by side).  Each
 * token is stored in its slot; a completed block is pooled (one thread per channel:
 * comp_pool_channel()), and with overlapping blocks the current half of the state becomes the
 * previous one; the pooled row is finished by all threads (bf16, RMSNorm, RoPE at the block's
 * first position, FP8 round trip or Hadamard + FP4).  The copies (slot store, state shift) load
 * GFW_COMP_BATCH values per thread before they store any, the RMSNorm sums the bf16 rounding of
 * the pooled values from shared memory (the values the oracle's row holds), and the state
 * shift's loads wait under that sum, so a completed block waits for memory a few times, not
 * once per value of a thread.
 */
__global__ void __launch_bounds__(GFW_COMP_MAX_THREADS) k_compress(comp_args a0, comp_args a1)
{
    gfw_pdl_enter();
    extern __shared__ float sh[]; /* pooled [dh], then hadamard scratch [dh] */
    __shared__ double ssum[33];
    const comp_args a = blockIdx.x == 0 ? a0 : a1;
    const int r = a.ratio, c = a.overlap, dh = a.dh, width = c * dh;
    const int64_t halfn = (int64_t)r * width, B = blockDim.x;
    const float w_own = (int)threadIdx.x < dh ? dv_at(a.norm, threadIdx.x) : 0.0f; /* the norm's first pass */
    for (int64_t t = 0; t < a.T; t++) {
        const int64_t pos = *a.pos0 + t;
        const int in_block = (int)(pos % r);
        const int slot = (c - 1) * r + in_block;
        for (int64_t ch0 = threadIdx.x; ch0 < width; ch0 += GFW_COMP_BATCH * B) {
            float kv[GFW_COMP_BATCH], sc[GFW_COMP_BATCH];
#pragma unroll
            for (int u = 0; u < GFW_COMP_BATCH; u++) {
                const int64_t ch = ch0 + u * B;
                if (ch < width) {
                    kv[u] = a.kv[t * width + ch];
                    sc[u] = __fadd_rn(a.gate[t * width + ch], a.ape[(int64_t)in_block * width + ch]);
                }
            }
#pragma unroll
            for (int u = 0; u < GFW_COMP_BATCH; u++) {
                const int64_t ch = ch0 + u * B;
                if (ch < width) {
                    a.kv_state[(int64_t)slot * width + ch] = kv[u];
                    a.score_state[(int64_t)slot * width + ch] = sc[u];
                }
            }
        }
        __syncthreads();
        if (in_block != r - 1)
            continue;
        for (int ch = threadIdx.x; ch < dh; ch += (int)B)
            sh[ch] = comp_pool_channel(a, ch);
        __syncthreads();
        /* the state shift's first batch (c == 2), loaded now and stored after the norm's sum */
        float kv_prev[GFW_COMP_BATCH], sc_prev[GFW_COMP_BATCH];
        if (c == 2) {
#pragma unroll
            for (int u = 0; u < GFW_COMP_BATCH; u++) {
                const int64_t i = threadIdx.x + u * B;
                if (i < halfn) {
                    kv_prev[u] = a.kv_state[halfn + i];
                    sc_prev[u] = a.score_state[halfn + i];
                }
            }
        }
        const int64_t j = pos / r;
        uint16_t *row_out = a.out + j * dh;
        /* RMSNorm of the bf16 row: the block sums the squares in the order of spec_arch_sum_order */
        const float rs = rms_factor(gfw_block_sum(bfr_sq_term{sh}, dh, ssum), dh, a.eps);
        if (c == 2) { /* the current block becomes the previous one: all its reads are done */
#pragma unroll
            for (int u = 0; u < GFW_COMP_BATCH; u++) {
                const int64_t i = threadIdx.x + u * B;
                if (i < halfn) {
                    a.kv_state[i] = kv_prev[u];
                    a.score_state[i] = sc_prev[u];
                }
            }
            for (int64_t i0 = threadIdx.x + GFW_COMP_BATCH * B; i0 < halfn; i0 += GFW_COMP_BATCH * B) {
#pragma unroll
                for (int u = 0; u < GFW_COMP_BATCH; u++) {
                    const int64_t i = i0 + u * B;
                    if (i < halfn) {
                        kv_prev[u] = a.kv_state[halfn + i];
                        sc_prev[u] = a.score_state[halfn + i];
                    }
                }
#pragma unroll
                for (int u = 0; u < GFW_COMP_BATCH; u++) {
                    const int64_t i = i0 + u * B;
                    if (i < halfn) {
                        a.kv_state[i] = kv_prev[u];
                        a.score_state[i] = sc_prev[u];
                    }
                }
            }
        }
        for (int ch = threadIdx.x; ch < dh; ch += (int)B)
            row_out[ch] = gfw_f2bf(
                __fmul_rn(ch == (int)threadIdx.x ? w_own : dv_at(a.norm, ch), __fmul_rn(gfw_bfr(sh[ch]), rs)));
        __syncthreads();
        { /* RoPE at the block's first position: the pairs are independent */
            const int half = a.rope_dim / 2;
            const int64_t bp = j * r;
            uint16_t *v = row_out + dh - a.rope_dim;
            for (int p = threadIdx.x; p < half; p += (int)B)
                rope_pair(v, p, half, a.cs, bp, 0);
        }
        __syncthreads();
        if (a.kind == 0) {
            fp8_roundtrip_warps(row_out, dh - a.rope_dim, threadIdx.x / 32, (int)B / 32);
        } else {
            hadamard_block(row_out, 1, dh, sh + dh);
            fp4_roundtrip_warps(row_out, dh, threadIdx.x / 32, (int)B / 32);
        }
        __syncthreads();
    }
}

/** Product of bf16 values i of two rows, exact in double (attention scores, indexer heads). */
struct bf_dot_term {
    const uint16_t *a; /**< the first row */
    const uint16_t *b; /**< the second row */
    /** Term @p i: a_i b_i. */
    __device__ double operator()(int64_t i) const { return __dmul_rn((double)gfw_bf2f(a[i]), (double)gfw_bf2f(b[i])); }
};

/** Lanes per head of the indexer's scores: the chunks of a head's dot product, a power of two, at most 32. */
__device__ __forceinline__ int indexer_group(int id)
{
    const int64_t m = (id + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK;
    int G = 1;
    while (G < m && G < 32)
        G <<= 1;
    return G;
}

/**
 * Head @p h's term of a block score, bf16(max(bf16(q_h . k), 0) * w_h), by an aligned group of
 * G lanes (g: lane in group), which sums the dot product in the order of
 * @ref spec_arch_sum_order; every lane of the group gets it.
 */
__device__ __forceinline__ float indexer_head_term(const uint16_t *qi, const uint16_t *wi, const uint16_t *k, int ih,
                                                   int id, int64_t t, int h, int g, int G)
{
    const double dot = gfw_group_sum(bf_dot_term{qi + (t * ih + h) * id, k}, id, g, G);
    float s = gfw_bfr(__double2float_rn(dot));
    if (s < 0.0f)
        s = 0.0f;
    return gfw_bfr(__fmul_rn(s, gfw_bf2f(wi[t * ih + h])));
}

/**
 * The score of compressed block j for token t of the call (one warp; pos0: the call's first
 * position): nothing when the block is not causal for the token, j >= (pos0 + t + 1) / 4.
 */
__device__ __forceinline__ void indexer_score(const uint16_t *qi, const uint16_t *wi, const uint16_t *keys, int ih,
                                              int id, int64_t pos0, int64_t t, int64_t j, int64_t max_blocks,
                                              float *scores)
{
    const int lane = threadIdx.x & 31;
    const int64_t n_causal = (pos0 + t + 1) / 4;
    if (j >= n_causal)
        return;
    const uint16_t *k = keys + j * id;
    const int G = indexer_group(id);
    const int per_pass = 32 / G, grp = lane / G, g = lane % G;
    double head_sum = 0.0;
    for (int h0 = 0; h0 < ih; h0 += per_pass) {
        const int h = h0 + grp < ih ? h0 + grp : ih - 1; /* a group past the last head repeats it, unused */
        const float term = indexer_head_term(qi, wi, k, ih, id, t, h, g, G);
        for (int u = 0; u < per_pass; u++) {
            const float tu = __shfl_sync(0xFFFFFFFFu, term, u * G);
            if (h0 + u < ih)
                head_sum = __dadd_rn(head_sum, (double)tu);
        }
    }
    if (lane == 0)
        scores[t * max_blocks + j] = gfw_bfr(__double2float_rn(head_sum));
}

/** Most indexer heads whose terms k_indexer_scores' block mode holds in shared memory. */
#define GFW_SCORES_MAX_HEADS 256

/**
 * indexer_score() by a whole block (its block mode): the warps share the heads (a group of G
 * lanes per head, warp w taking the heads from w * 32 / G on, blockDim.x / G heads a round), so
 * a warp waits for one or two rounds of loads instead of ih * G / 32; the terms meet in
 * shared memory and thread 0 adds them in ascending head order, as indexer_score()'s lane 0.
 * Every thread of the block must call it (it contains barriers).
 */
__device__ __forceinline__ void indexer_score_block(const uint16_t *qi, const uint16_t *wi, const uint16_t *keys,
                                                    int ih, int id, int64_t pos0, int64_t t, int64_t j,
                                                    int64_t max_blocks, float *scores, float *terms)
{
    const int64_t n_causal = (pos0 + t + 1) / 4;
    if (j >= n_causal) /* the same for the whole block */
        return;
    const uint16_t *k = keys + j * id;
    const int G = indexer_group(id), per_round = (int)blockDim.x / G, g = (int)threadIdx.x % G;
    for (int h0 = 0; h0 < ih; h0 += per_round) {
        const int hh = h0 + (int)threadIdx.x / G, h = hh < ih ? hh : ih - 1; /* past the last head: unused */
        const float term = indexer_head_term(qi, wi, k, ih, id, t, h, g, G);
        if (g == 0 && hh < ih)
            terms[hh] = term;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double head_sum = 0.0;
        for (int h = 0; h < ih; h++)
            head_sum = __dadd_rn(head_sum, (double)terms[h]);
        scores[t * max_blocks + j] = gfw_bfr(__double2float_rn(head_sum));
    }
}

/**
 * Most CTAs of 256 threads per multiprocessor in k_indexer_scores' grid: as many as are
 * resident at once (56 registers per thread on sm_90a, 60 on sm_100a, 16 K registers per CTA:
 * four); in block mode that many scores at once, in warp mode its warps stride over the rest.
 */
#define GFW_SCORES_CTAS_PER_SM 4

/**
 * Indexer block scores (attn_indexer.c) into scores[t * max_blocks + j] for the causal blocks j
 * < nb, nb = min((pos0 + T) / 4, max_blocks), the causal count of the call's last token, with
 * pos0 = *pos_dev (the step record); blocks j >= (pos+1)/4 are not written.  Two modes, chosen
 * on the device from the live count (the grid of a CUDA graph is sized before nb is known):
 *  - block mode, when the grid has a block for each of the T * nb pairs (t, j) (short contexts,
 *    decode): block (t, j) computes that score (indexer_score_block()), so a decode step waits
 *    for one or two rounds of loads, not one per group of heads;
 *  - warp mode otherwise: one warp per pair, the warps striding over the T * nb pairs
 *    (indexer_score()): aligned groups of G lanes (G = the chunks of a head's dot product,
 *    rounded up to a power of two, at most 32) sum one head each in the order of
 *    @ref spec_arch_sum_order; lane 0 adds the heads' bf16 terms in ascending head order.
 * Both modes compute every head term with the same code and add the terms in the same order,
 * so the grid does not change a bit.  The host sizes the grid with indexer_scores_grid().
 */
__global__ void k_indexer_scores(const uint16_t *qi, const uint16_t *wi, const uint16_t *keys, int ih, int id,
                                 int64_t T, const int64_t *pos_dev, int64_t max_blocks, float *scores)
{
    gfw_pdl_enter();
    __shared__ float terms[GFW_SCORES_MAX_HEADS];
    const int64_t pos0 = *pos_dev;
    const int64_t nb = (pos0 + T) / 4 < max_blocks ? (pos0 + T) / 4 : max_blocks;
    if (T * nb <= (int64_t)gridDim.x && ih <= GFW_SCORES_MAX_HEADS) {
        if ((int64_t)blockIdx.x < T * nb)
            indexer_score_block(qi, wi, keys, ih, id, pos0, blockIdx.x / nb, blockIdx.x % nb, max_blocks, scores,
                                terms);
        return;
    }
    const int64_t n_warps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < T * nb; w += n_warps)
        indexer_score(qi, wi, keys, ih, id, pos0, w / nb, w % nb, max_blocks, scores);
}

/** Does candidate a (score sa) come before b in the indexer's order? */
__device__ __forceinline__ int topk_before(float sa, int64_t a, float sb, int64_t b)
{
    const int an = isnan(sa), bn = isnan(sb);
    if (an != bn)
        return bn;
    if (!an && sa != sb)
        return sa > sb;
    return a < b;
}

/** Scores a block of k_topk_split stages in shared memory at a time. */
#define TOPK_TILE 1024
/** Threads of k_topk_split that count one candidate's rank, each over a slice of the scores. */
#define TOPK_SLICES 8
/** Threads of a k_topk_split block. */
#define TOPK_THREADS 256
/** Candidates of a k_topk_split block. */
#define TOPK_PER_BLOCK (TOPK_THREADS / TOPK_SLICES)

/**
 * Top-k by rank counting (pos0 = *pos_dev; idx[t, rank] = block), split over blocks: the
 * TOPK_SLICES threads (neighbouring lanes) of candidate i of token blockIdx.y (i = blockIdx.x
 * TOPK_PER_BLOCK + threadIdx.x / TOPK_SLICES) each count the scores of every
 * TOPK_SLICES-th candidate that come before it among the n = (pos0 + t + 1) / 4 causal blocks,
 * and their counts' sum (shuffles) is its rank: the same integer in any order.  The scores are
 * read TOPK_TILE at a time into shared memory by the whole block (one coalesced pass), so that
 * the counts compare against shared memory instead of a chain of loads; a count stops adding
 * (it cannot fall) once the sum has reached k, checked once a tile, and a block stages no more
 * tiles once every count of it has (at long contexts most candidates are out after a tile or
 * two, and the tiles are every block's to read).  A count is a chain of dependent compares,
 * hence the slices: with one thread a candidate the kernel is bound by that chain's latency
 * (docs/perf.md, "Eighteenth pass").
 */
__global__ void __launch_bounds__(TOPK_THREADS)
    k_topk_split(const float *scores, const int64_t *pos_dev, int64_t max_blocks, int topk, int32_t *idx)
{
    gfw_pdl_enter();
    __shared__ float tile[TOPK_TILE];
    const int64_t pos0 = *pos_dev;
    const int sl = (int)threadIdx.x % TOPK_SLICES;
    const int64_t t = blockIdx.y, i = (int64_t)blockIdx.x * TOPK_PER_BLOCK + threadIdx.x / TOPK_SLICES;
    const int64_t n = (pos0 + t + 1) / 4;
    const int k = (int)(n < topk ? n : topk);
    const float *s = scores + t * max_blocks;
    if ((int64_t)blockIdx.x * TOPK_PER_BLOCK >= n)
        return; /* the whole block is past the count (uniform: the block's barriers are not reached) */
    const int live = i < n;
    const float si = live ? s[i] : 0.0f;
    int part = 0, rank = 0; /* this slice's count; all slices' sum at the last tile's end */
    for (int64_t j0 = 0; j0 < n; j0 += TOPK_TILE) {
        const int m = (int)(n - j0 < TOPK_TILE ? n - j0 : TOPK_TILE);
        __syncthreads();
        for (int jj = threadIdx.x; jj < m; jj += TOPK_THREADS)
            tile[jj] = s[j0 + jj];
        __syncthreads();
        if (live && rank < k) {
#pragma unroll 4
            for (int jj = sl; jj < m; jj += TOPK_SLICES)
                part += (j0 + jj != i) && topk_before(tile[jj], j0 + jj, si, i);
        }
        rank = part;
#pragma unroll
        for (int o = 1; o < TOPK_SLICES; o <<= 1)
            rank += __shfl_xor_sync(0xffffffffu, rank, o);
        if (!__syncthreads_or(live && rank < k))
            break; /* every candidate of the block is past the top k: no more tiles to stage */
    }
    if (live && sl == 0 && rank < k)
        idx[t * topk + rank] = (int32_t)i;
}


/** Arguments of the attention kernel. */
struct attend_args {
    const uint16_t *q;        /**< [T, H, d] */
    const uint16_t *kv_call;  /**< [T, d] this call's kv rows */
    const uint16_t *ring;     /**< [W, d] window ring (positions before pos0) */
    const uint16_t *comp;     /**< [max_blocks, d] */
    const int32_t *topk_idx;  /**< [T, topk] (ratio 4) */
    const float *sink;        /**< [H] */
    const float *cs;          /**< cos/sin table for the inverse RoPE of the output (NULL: none) */
    int H, d, W, ratio, topk, rope_dim;
    const int64_t *pos0;      /**< device: position of the call's first token (the step record) */
    float scale;
    /** @var attend_args::H
     *  heads
     *  @var attend_args::d
     *  head dimension
     *  @var attend_args::W
     *  window (rows of ring)
     *  @var attend_args::ratio
     *  compression ratio (0: none)
     *  @var attend_args::topk
     *  compressed blocks per token (ratio 4)
     *  @var attend_args::scale
     *  score scale, 1/sqrt(d)
     *  @var attend_args::rope_dim
     *  rotary dimensions of the inverse RoPE */
    uint16_t *out;            /**< [T, H, d] */
};

/**
 * The shape of the attention list of the token at position @p pos: the window's rows from
 * position @p first, @p n_win of them (the token's own the last), then @p n_comp compressed rows
 * (ratio 128: every whole block; ratio 4: the indexer's top-k of the whole blocks).
 */
__device__ __forceinline__ void attend_list_shape(const attend_args &a, int64_t pos, int64_t *first, int64_t *n_win,
                                                  int64_t *n_comp)
{
    *first = pos - a.W + 1 > 0 ? pos - a.W + 1 : 0;
    *n_win = pos - *first + 1;
    *n_comp = 0;
    if (a.ratio == 128)
        *n_comp = (pos + 1) / 128;
    else if (a.ratio == 4) {
        const int64_t nc = (pos + 1) / 4;
        *n_comp = nc < a.topk ? nc : a.topk;
    }
}

/** Row e of token t's attention list (pos0: the call's first position). */
__device__ __forceinline__ const uint16_t *attend_row(const attend_args &a, int64_t pos0, int64_t t, int64_t first,
                                                      int64_t n_win, int64_t e)
{
    if (e < n_win) {
        const int64_t q = first + e;
        return q >= pos0 ? a.kv_call + (q - pos0) * a.d : a.ring + (q % a.W) * a.d;
    }
    const int64_t j = a.ratio == 128 ? e - n_win : a.topk_idx[t * a.topk + (e - n_win)];
    return a.comp + j * a.d;
}

/** The 16 q values of lane @p lane's chunk (16-byte aligned), each converted to double. */
__device__ __forceinline__ void attend_q_doubles(const uint16_t *qh, int lane, double *qd)
{
    float qv[MMOE_SUM_CHUNK];
    gfw_load_bf16x16(qh + (int64_t)lane * MMOE_SUM_CHUNK, qv);
#pragma unroll
    for (int i = 0; i < MMOE_SUM_CHUNK; i++)
        qd[i] = (double)qv[i];
}

/**
 * Lane @p lane's sum of the terms q_i k_i of its whole chunk of kv row @p row (16-byte aligned),
 * ascending from +0 (gfw_chunk_sum's order); the chunk's q values @p q as floats (converted at
 * each product) or already as doubles (attend_q_doubles()): the same products either way.
 */
template <typename Q>
__device__ __forceinline__ double attend_lane_sum_q(const Q *q, const uint16_t *row, int lane)
{
    float kv[MMOE_SUM_CHUNK];
    gfw_load_bf16x16(row + (int64_t)lane * MMOE_SUM_CHUNK, kv);
    double c = 0.0;
#pragma unroll
    for (int i = 0; i < MMOE_SUM_CHUNK; i++)
        c = __dadd_rn(c, __dmul_rn((double)q[i], (double)kv[i]));
    return c;
}

/**
 * The tree node that lane @p lane of k_attend's warp sums for the score of kv row @p row:
 * gfw_run_sum() of the terms q_i k_i over its run of @p r chunks.  A single whole chunk whose
 * 16 values of q and of the row are 16-byte aligned is loaded in two vectors each (a warp then
 * reads a 1 KiB row in fully used sectors, not 16 loads of 2 bytes a lane) and summed with the
 * same terms in the same order (gfw_chunk_sum's: ascending from +0).
 */
__device__ __forceinline__ double attend_lane_sum(const uint16_t *qh, const uint16_t *row, int lane, int64_t r, int d)
{
    const int64_t i0 = (int64_t)lane * MMOE_SUM_CHUNK;
    if (r != 1 || i0 + MMOE_SUM_CHUNK > d || !gfw_aligned16(qh + i0) || !gfw_aligned16(row + i0))
        return gfw_run_sum(bf_dot_term{qh, row}, (int64_t)lane * r, r, d);
    float qv[MMOE_SUM_CHUNK];
    gfw_load_bf16x16(qh + i0, qv);
    return attend_lane_sum_q(qv, row, lane);
}

/**
 * A one-token call's kv rows that earlier calls wrote, asked of the L2 before k_attend's wait:
 * in a decode step the weight streams have evicted them since.  They are the window's rows
 * before the token's own (list entries 0 .. n_win - 2; entry n_win - 1 is this call's row) and,
 * at ratio 128, the compressed rows (entries n_win ..); the ratio-4 rows are chosen by this
 * call's indexer and not known yet.  Their addresses are attend_row()'s; their 128-byte lines
 * are shared out over all threads of all heads' blocks.
 */
__device__ __forceinline__ void attend_prefetch_rows(const attend_args &a, int64_t pos0, int64_t first, int64_t n_win,
                                                     int64_t n_comp)
{
    const int64_t n_old = n_win - 1 + (a.ratio == 128 ? n_comp : 0);
    const int64_t lines = (2 * (int64_t)a.d + 127) / 128, total = n_old * lines;
    const int64_t stride = (int64_t)gridDim.y * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; j < total; j += stride) {
        const int64_t i = j / lines, e = i < n_win - 1 ? i : i + 1; /* entry n_win - 1 skipped */
        gfw_prefetch_l2((const uint8_t *)attend_row(a, pos0, 0, first, n_win, e) + 128 * (j - i * lines));
    }
}

/**
 * The largest of the @p cn scores @p s of a chunk, by one warp (lane l scans l, l + 32, ..,
 * then a butterfly), every lane getting it: the oracle's loop's maximum, a NaN score never
 * winning; -inf when every score is -inf or NaN.
 */
__device__ __forceinline__ float attend_chunk_max(const float *s, int cn, int lane)
{
    float cmax = -INFINITY;
    for (int i = lane; i < cn; i += 32)
        cmax = s[i] > cmax ? s[i] : cmax;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xFFFFFFFFu, cmax, o);
        cmax = other > cmax ? other : cmax;
    }
    return cmax;
}

/** Rows of a chunk whose scores one warp of k_attend sums at once (independent loads in flight). */
#define GFW_ATTEND_ROWS 4

/** Threads of a k_attend block. */
#define GFW_ATTEND_THREADS 256

/** Rows of k_attend's chunks (the reference kernel's, ATTN_SPARSE_CHUNK). */
#define GFW_ATTEND_CHUNK 64

/**
 * The instances of k_attend: every call's (ATTEND_ANY), and a one-token call's split in two
 * parts (attend_splits()) whose two blocks of a head form a cluster and share out the chunk's
 * scores (ATTEND_PAIR).
 */
enum attend_mode { ATTEND_ANY, ATTEND_PAIR };

/**
 * Whether every lane's run of a score is one whole chunk of 16 values at 16-byte aligned
 * addresses in q and in every kv row (d = 32 chunks, aligned bases): then the lanes hold their q
 * values as doubles once and attend_lane_sum_q() sums a row.
 */
__device__ __forceinline__ bool attend_vec(const attend_args &a, const uint16_t *qh)
{
    return a.d == 32 * MMOE_SUM_CHUNK && gfw_aligned16(qh) && gfw_aligned16(a.kv_call) && gfw_aligned16(a.ring) &&
           (a.comp == NULL || gfw_aligned16(a.comp));
}

/**
 * k_attend's barrier around its scores: the cluster's for ATTEND_PAIR (the other block writes
 * them too), else the block's.
 */
template <bool PAIR>
__device__ __forceinline__ void attend_scores_sync()
{
    if (PAIR)
        cg::this_cluster().sync();
    else
        __syncthreads();
}

/**
 * Sparse attention of attn_sparse.c for one (token, head) per block (blockDim.x =
 * GFW_ATTEND_THREADS, d <= 8 blockDim.x): the window, then the compressed rows; chunks of
 * GFW_ATTEND_CHUNK with the running-max softmax; P rounded to bf16 for P.V; the sink joins the
 * denominator at the end.  Each warp sums the scores of rows warp, warp + nw, ... (the order of
 * @ref spec_arch_sum_order, GFW_ATTEND_ROWS rows at a time, attend_lane_sum()); the exps are
 * taken in parallel, the denominator is summed in row order by one thread, and each thread
 * extends the P.V sums of its channels in row order; with gridDim.z parts (attend_splits()) a
 * block sums only its part of the channels.  With a.cs the output gets its inverse RoPE at the
 * end.
 *
 * MODE ATTEND_PAIR (a one-token call in two parts): the two blocks of a head are one cluster;
 * each sums the scores of half the chunk's rows (warp w of part z: rows 8 z + w, + 16, ...) and
 * writes each into its own and the other block's shared scores (distributed shared memory),
 * and the barriers around the scores are the cluster's.  With attend_vec() the lanes convert
 * their q values to doubles once.  A score is the same operations in the same order whichever
 * block sums it: the same bits.  In a decode step this halves each block's share of the scores
 * (the kernel is a chain of latencies: few warps a multiprocessor, each waiting on its loads,
 * its double adds and the barriers).
 *
 * Registers: ATTEND_ANY is bounded to three CTAs per multiprocessor (80 registers on sm_90a and
 * sm_100a, no spills; unbounded, the compiler takes 99 on sm_90a and two fit, fewer of a
 * prefill's (token, head) blocks at once); ATTEND_PAIR, whose grid is one block of each head's
 * pair, to two (128 registers, no spills: the lane's q as doubles).
 */
template <attend_mode MODE>
__global__ void __launch_bounds__(GFW_ATTEND_THREADS, MODE == ATTEND_PAIR ? 2 : 3) k_attend(attend_args a)
{
    constexpr int CH = GFW_ATTEND_CHUNK;
    constexpr bool PAIR = MODE == ATTEND_PAIR;
    /* the list's shape needs only the position: the step record is the call's first node */
    const int64_t t = blockIdx.x;
    const int64_t pos0 = *a.pos0, pos = pos0 + t;
    int64_t first, n_win, n_comp;
    attend_list_shape(a, pos, &first, &n_win, &n_comp);
    if (gridDim.x == 1 && blockIdx.z == 0) /* one part's blocks ask for the rows */
        attend_prefetch_rows(a, pos0, first, n_win, n_comp);
    gfw_pdl_enter();
    __shared__ float sc[CH];
    __shared__ float pf[CH];
    __shared__ float pb[CH];
    __shared__ const uint16_t *rowp[CH]; /* the chunk's kv rows */
    __shared__ float alpha_sh, m_sh, m_new_sh, den_sh;
    const int h = blockIdx.y;
    const int d = a.d;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, nw = blockDim.x / 32;
    const int64_t n = n_win + n_comp;
    const uint16_t *qh = a.q + (t * a.H + h) * (int64_t)d;
    const int64_t r = gfw_chunks_per_lane(d, 32);
    /* this block's channels: [cb, ce), the gridDim.z-th part blockIdx.z (attend_splits()) */
    const int cw = d / (int)gridDim.z, cb = (int)blockIdx.z * cw, ce = cb + cw;
    /* the score rows of this warp: w0, w0 + ws, ... */
    const int w0 = PAIR ? (int)blockIdx.z * nw + warp : warp, ws = PAIR ? 2 * nw : nw;
    float *sc_other = sc;
    if (PAIR) {
        cg::cluster_group cl = cg::this_cluster();
        sc_other = cl.map_shared_rank(sc, (int)cl.block_rank() ^ 1);
    }
    const bool vec = PAIR && attend_vec(a, qh);
    double qd[MMOE_SUM_CHUNK]; /* with vec only: ATTEND_ANY never holds it */
    if (vec)
        attend_q_doubles(qh, lane, qd);
    float acc[8]; /* channels cb + tid + i*blockDim.x */
    for (int i = 0; i < 8; i++)
        acc[i] = 0.0f;
    if (tid == 0) {
        m_sh = -INFINITY;
        den_sh = 0.0f;
    }
    if (PAIR) /* the other block runs before its shared memory is written */
        cg::this_cluster().sync();
    for (int64_t c0 = 0; c0 < n; c0 += CH) {
        const int cn = (int)((n - c0) < CH ? (n - c0) : CH);
        if (tid < cn)
            rowp[tid] = attend_row(a, pos0, t, first, n_win, c0 + tid);
        __syncthreads();
        for (int i = w0; i < cn; i += GFW_ATTEND_ROWS * ws) {
            double v[GFW_ATTEND_ROWS];
#pragma unroll
            for (int u = 0; u < GFW_ATTEND_ROWS; u++) {
                const int iu = i + u * ws;
                v[u] = iu >= cn ? 0.0
                       : vec  ? attend_lane_sum_q(qd, rowp[iu], lane)
                              : attend_lane_sum(qh, rowp[iu], lane, r, d);
            }
#pragma unroll
            for (int u = 0; u < GFW_ATTEND_ROWS; u++) {
                const int iu = i + u * ws;
                const double dot = gfw_group_pairwise(v[u], 32);
                if (lane == 0 && iu < cn) {
                    const float s = __fmul_rn(__double2float_rn(dot), a.scale);
                    sc[iu] = s;
                    if (PAIR)
                        sc_other[iu] = s;
                }
            }
        }
        attend_scores_sync<PAIR>();
        if (warp == 0) {
            const float cmax = attend_chunk_max(sc, cn, lane);
            if (lane == 0) {
                const float m_new = cmax > m_sh ? cmax : m_sh;
                m_new_sh = m_new;
                alpha_sh = m_new == -INFINITY ? NAN /* marker: skip the chunk */ : gfw_expf(__fsub_rn(m_sh, m_new));
            }
        }
        __syncthreads();
        const float alpha = alpha_sh;
        if (!isnan(alpha)) {
            const float m_new = m_new_sh;
            if (tid < cn) {
                const float p = gfw_expf(__fsub_rn(sc[tid], m_new));
                pf[tid] = p;
                pb[tid] = gfw_bfr(p);
            }
            __syncthreads();
            if (tid == 0) {
                float den = __fmul_rn(den_sh, alpha);
                for (int i = 0; i < cn; i++)
                    den = __fadd_rn(den, pf[i]);
                den_sh = den;
                m_sh = m_new;
            }
            for (int ci = 0; ci < 8; ci++) {
                const int c = cb + tid + ci * blockDim.x;
                if (c >= ce)
                    break;
                float v = __fmul_rn(acc[ci], alpha);
#pragma unroll 8
                for (int i = 0; i < cn; i++)
                    v = __fadd_rn(v, __fmul_rn(pb[i], gfw_bf2f(rowp[i][c])));
                acc[ci] = v;
            }
        }
        /* PAIR: the other block has read its scores before this one writes the next chunk's */
        attend_scores_sync<PAIR>();
    }
    const float den = __fadd_rn(den_sh, gfw_expf(__fsub_rn(a.sink[h], m_sh)));
    uint16_t *o = a.out + (t * a.H + h) * (int64_t)d;
    for (int ci = 0; ci < 8; ci++) {
        const int c = cb + tid + ci * blockDim.x;
        if (c >= ce)
            break;
        o[c] = gfw_f2bf(__fdiv_rn(acc[ci], den));
    }
    if (a.cs && ce == d) { /* the inverse RoPE of the output at the query's position (attn_forward.c): the
                              last part holds the rotary channels (attend_splits()) */
        __syncthreads();
        for (int p = tid; p < a.rope_dim / 2; p += blockDim.x)
            rope_pair(o + d - a.rope_dim, p, a.rope_dim / 2, a.cs, pos, 1);
    }
}

/** Head dimension of k_attend_one: V4's (32 lanes x one chunk of 16 values). */
#define GFW_ATTEND_ONE_D (32 * MMOE_SUM_CHUNK)

/** Channels of a k_attend_one block: half the head (the other block of its cluster holds the other half). */
#define GFW_ATTEND_ONE_HALF (GFW_ATTEND_ONE_D / 2)

/**
 * Rows of a k_attend_one pass: their scores, probabilities and the block's half of their values
 * are held at once (160 KiB of shared memory, whole chunks of GFW_ATTEND_CHUNK).  Five chunks:
 * V4-Flash's longest list (a window of 128 and the top 512 blocks) is two passes.
 */
#define GFW_ATTEND_PASS (5 * GFW_ATTEND_CHUNK)

/** Chunks of a k_attend_one pass. */
#define GFW_ATTEND_PASS_CHUNKS (GFW_ATTEND_PASS / GFW_ATTEND_CHUNK)

/** Rows whose scores one warp of k_attend_one sums at once (all their loads in flight together). */
#define GFW_ATTEND_ONE_ROWS 8

/** Threads of a k_attend_one block: a warp a 32 channels of its half, and one for the softmax's denominator. */
#define GFW_ATTEND_ONE_THREADS (GFW_ATTEND_ONE_HALF + 32)

/** Dynamic shared memory of k_attend_one: the block's half of a pass's rows, bf16. */
#define GFW_ATTEND_ONE_SMEM ((size_t)GFW_ATTEND_PASS * GFW_ATTEND_ONE_HALF * sizeof(uint16_t))

/** Arrive on the cluster's barrier (relaxed: orders nothing; the matching wait follows). */
__device__ __forceinline__ void attend_cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

/** Wait on the cluster's barrier that this thread arrived on. */
__device__ __forceinline__ void attend_cluster_wait()
{
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

/** Term i of k_attend_one's P.V chain of a channel: P_i (bf16) times the channel's value of row i. */
struct attend_pv_term {
    const float *pb;    /**< the pass's P, bf16-rounded */
    const uint16_t *xc; /**< the channel's value of the pass's row 0 in the shared rows */
    /** Term @p i. */
    __device__ float operator()(int i) const
    {
        return __fmul_rn(pb[i], gfw_bf2f(xc[(int64_t)i * GFW_ATTEND_ONE_HALF]));
    }
};

/** Term i of k_attend_one's denominator: P_i in fp32. */
struct attend_den_term {
    const float *pf; /**< the pass's P */
    /** Term @p i. */
    __device__ float operator()(int i) const { return pf[i]; }
};

/**
 * A chain of k_attend_one (a channel's P.V sum or the denominator) over the @p nc chunks of a
 * pass of @p pn rows, as attn_sparse.c extends it: for each chunk j not skipped (its factor
 * @p alpha [j] not NaN), v = v alpha_j, then v + term(i) for the chunk's rows in order.  The loop
 * over chunks is not unrolled (k_attend_one's code stays small).
 */
template <class Term>
__device__ __forceinline__ float attend_chunks_chain(float v, const float *alpha, int nc, int pn, const Term &term)
{
#pragma unroll 1
    for (int j = 0; j < nc; j++) {
        const float al = alpha[j];
        if (isnan(al))
            continue;
        const int c0 = j * GFW_ATTEND_CHUNK, cn = pn - c0 < GFW_ATTEND_CHUNK ? pn - c0 : GFW_ATTEND_CHUNK;
        v = __fmul_rn(v, al);
#pragma unroll 8
        for (int i = c0; i < c0 + cn; i++)
            v = __fadd_rn(v, term(i));
    }
    return v;
}

/**
 * k_attend's one-token call at V4's head width (GFW_ATTEND_ONE_D), the same operations in the
 * same order, so the same bits, with the chunk's steps regrouped: the chunks' chain (running
 * max, rescale, sums in row order) needs the scores of a chunk before its exps, but no score
 * needs the chain, so a pass of GFW_ATTEND_PASS rows (several chunks) first has all its scores
 * summed, then every chunk's max, factor and exps, then the P.V sums over the pass's rows, chunk
 * after chunk; k_attend waits for each chunk's barriers in turn (about 8 us a chunk in a decode
 * step, "docs/perf.md").
 *
 * The two blocks of a head form a cluster (blockIdx.z, as ATTEND_PAIR), each of nine warps:
 * warp w of block z sums the scores of rows 9 z + w, + 18, ... of the pass, GFW_ATTEND_ONE_ROWS
 * rows at a time (attend_lane_sum_q()'s terms: lane l holds chunk l of q as doubles and loads
 * chunk l of each row; a batch's rows past the pass load its last row again and keep nothing),
 * writes each score into both blocks' shared memory, and writes the row's 16 values to the
 * block that sums those channels in its P.V (lanes 0-15: block 0, 16-31: block 1; distributed
 * shared memory), so the P.V sums read shared memory and no row is loaded twice.  After the
 * cluster's barrier, warp j takes chunk j's max (k_attend's lanes and butterfly); every thread
 * runs the chunks' chain of max and factor itself (the same operations: the same bits in every
 * thread), then the exps of rows tid, tid + GFW_ATTEND_ONE_THREADS; the ninth warp sums the
 * denominator (each of its lanes the same chain) while thread c of the others extends the P.V
 * sum of channel c of the block's half, chunk after chunk in row order (attend_chunks_chain(),
 * whose loop over chunks is not unrolled: the kernel's code stays small, else its warps wait for
 * instructions).  A pass's shared rows are overwritten only after the cluster's barrier at its
 * end.  The output's rotary channels (in block 1) get the inverse RoPE in registers: a channel's
 * pair partner is the neighbouring lane, whose bf16 output one shuffle brings (rope_rotate(),
 * the operations of rope_pair()).
 *
 * Registers and memory: one block a multiprocessor (the pass's rows, 160 KiB of dynamic shared
 * memory; up to 224 registers a thread, of which the GFW_ATTEND_ONE_ROWS rows in flight use
 * most); a head's two blocks are 128 blocks for V4-Flash's 64 heads.
 */
__global__ void __launch_bounds__(GFW_ATTEND_ONE_THREADS, 1) k_attend_one(attend_args a)
{
    constexpr int CH = GFW_ATTEND_CHUNK, P = GFW_ATTEND_PASS, NC = GFW_ATTEND_PASS_CHUNKS;
    constexpr int HALF = GFW_ATTEND_ONE_HALF, R = GFW_ATTEND_ONE_ROWS;
    const int64_t pos0 = *a.pos0, pos = pos0;
    int64_t first, n_win, n_comp;
    attend_list_shape(a, pos, &first, &n_win, &n_comp);
    if (blockIdx.z == 0) /* one part's blocks ask for the rows */
        attend_prefetch_rows(a, pos0, first, n_win, n_comp);
    attend_cluster_arrive(); /* the other block runs before its shared memory is written */
    gfw_pdl_enter();
    extern __shared__ __align__(16) uint16_t attend_xs[]; /* [P][HALF]: this block's channels of the pass's rows */
    __shared__ float sc[P];
    __shared__ float pf[P];
    __shared__ float pb[P];
    __shared__ float cm[NC];
    __shared__ float alpha_sh[NC];
    __shared__ float den_sh;
    cg::cluster_group cl = cg::this_cluster();
    const int z = (int)cl.block_rank(), h = blockIdx.y;
    float *sc_other = cl.map_shared_rank(sc, z ^ 1);
    uint16_t *xs_other = cl.map_shared_rank(attend_xs, z ^ 1);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, nw = GFW_ATTEND_ONE_THREADS / 32;
    const int64_t n = n_win + n_comp;
    const uint16_t *qh = a.q + (int64_t)h * GFW_ATTEND_ONE_D;
    double qd[MMOE_SUM_CHUNK];
    attend_q_doubles(qh, lane, qd);
    /* the lane's 16 values of a row go to the block holding them, at the lane's place there */
    uint16_t *const stage = ((lane >> 4) == z ? attend_xs : xs_other) + (lane & 15) * MMOE_SUM_CHUNK;
    const int w0 = z * nw + warp, ws = 2 * nw; /* this warp's rows: w0, w0 + ws, ... */
    float m = -INFINITY, den = 0.0f, acc = 0.0f; /* the chain: every thread's m the same; den in the last warp */
    attend_cluster_wait();
    for (int64_t p0 = 0; p0 < n; p0 += P) {
        const int pn = (int)(n - p0 < P ? n - p0 : P);
        for (int i = w0; i < pn; i += R * ws) {
            uint4 raw[R][2]; /* rows past the pass load its last row again, and are neither summed nor kept */
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int iu = i + u * ws < pn ? i + u * ws : pn - 1;
                const uint4 *rp =
                    (const uint4 *)(attend_row(a, pos0, 0, first, n_win, p0 + iu) + (int64_t)lane * MMOE_SUM_CHUNK);
                raw[u][0] = rp[0];
                raw[u][1] = rp[1];
            }
#pragma unroll
            for (int u = 0; u < R; u++) {
                const int iu = i + u * ws;
                float kv[MMOE_SUM_CHUNK];
                gfw_bf16x16_to_f32(raw[u][0], raw[u][1], kv);
                double c = 0.0;
#pragma unroll
                for (int k = 0; k < MMOE_SUM_CHUNK; k++)
                    c = __dadd_rn(c, __dmul_rn(qd[k], (double)kv[k]));
                const double dot = gfw_group_pairwise(c, 32);
                if (iu < pn) {
                    uint4 *dst = (uint4 *)(stage + (int64_t)iu * HALF);
                    dst[0] = raw[u][0];
                    dst[1] = raw[u][1];
                    if (lane == 0) {
                        const float s = __fmul_rn(__double2float_rn(dot), a.scale);
                        sc[iu] = s;
                        sc_other[iu] = s;
                    }
                }
            }
        }
        cl.sync(); /* both blocks' scores and rows are in place */
        const int nc = (pn + CH - 1) / CH;
        if (warp < nc) { /* chunk warp's max */
            const int c0 = warp * CH, cn = pn - c0 < CH ? pn - c0 : CH;
            const float cmax = attend_chunk_max(sc + c0, cn, lane);
            if (lane == 0)
                cm[warp] = cmax;
        }
        __syncthreads();
        float alpha[NC], m_new[NC]; /* chunk j's factor (NaN: the chunk is skipped) and max */
#pragma unroll
        for (int j = 0; j < NC; j++) {
            if (j < nc) {
                m_new[j] = cm[j] > m ? cm[j] : m;
                alpha[j] = m_new[j] == -INFINITY ? NAN : gfw_expf(__fsub_rn(m, m_new[j]));
                if (!isnan(alpha[j]))
                    m = m_new[j];
                if (tid == 0)
                    alpha_sh[j] = alpha[j];
            }
        }
        for (int r = tid; r < pn; r += GFW_ATTEND_ONE_THREADS) {
            const int j = r / CH;
            float mj = m_new[0], aj = alpha[0];
#pragma unroll
            for (int jj = 1; jj < NC; jj++)
                if (jj == j)
                    mj = m_new[jj], aj = alpha[jj];
            if (!isnan(aj)) {
                const float p = gfw_expf(__fsub_rn(sc[r], mj));
                pf[r] = p;
                pb[r] = gfw_bfr(p);
            }
        }
        __syncthreads();
        if (tid < HALF) /* the P.V sum of channel z HALF + tid */
            acc = attend_chunks_chain(acc, alpha_sh, nc, pn, attend_pv_term{pb, attend_xs + tid});
        else /* the last warp: the denominator (each lane the same chain) */
            den = attend_chunks_chain(den, alpha_sh, nc, pn, attend_den_term{pf});
        if (p0 + P < n)
            cl.sync(); /* the other block has read this pass's scores before either writes the next */
    }
    if (tid == HALF)
        den_sh = den;
    __syncthreads();
    if (tid >= HALF)
        return;
    const float dn = __fadd_rn(den_sh, gfw_expf(__fsub_rn(a.sink[h], m)));
    const int c = z * HALF + tid, r0 = GFW_ATTEND_ONE_D - a.rope_dim; /* the rotary channels: [r0, d) */
    uint16_t y = gfw_f2bf(__fdiv_rn(acc, dn));
    const uint16_t y_pair = (uint16_t)__shfl_xor_sync(0xFFFFFFFFu, (unsigned)y, 1); /* channel c xor 1 (r0 is even) */
    if (a.cs && c >= r0) { /* the inverse RoPE at the query's position, of the pair's bf16 outputs (rope_pair()) */
        const int odd = (c - r0) & 1;
        float re, im;
        rope_rotate(gfw_bf2f(odd ? y_pair : y), gfw_bf2f(odd ? y : y_pair), a.cs, pos, a.rope_dim / 2, (c - r0) / 2, 1,
                    &re, &im);
        y = gfw_f2bf(odd ? im : re);
    }
    a.out[(int64_t)h * GFW_ATTEND_ONE_D + c] = y;
}

/**
 * Parts the channels of k_attend's heads are split into, one block each (gridDim.z): two for a
 * one-token call, whose grid of H blocks leaves half of an H200's multiprocessors idle, where
 * each part is whole per thread (d / 2 <= 8 x 256) and holds the rotary channels in one part
 * (d / 2 >= rope_dim); else one.  The two parts of a head are a cluster that shares out the
 * scores (ATTEND_PAIR); every part computes the same softmax (the same operations in the same
 * order) and the P.V sums of its own channels: the outputs are the same bits whatever the split.
 */
static int attend_splits(int64_t T, int d, int rope_dim)
{
    return T == 1 && d % 2 == 0 && d / 2 >= rope_dim ? 2 : 1;
}

/**
 * Whether a call of @p T tokens takes k_attend_one: one token in two parts (attend_splits()) at
 * V4's head width, every row and q at 16-byte aligned addresses (attend_vec()'s conditions).
 */
static bool attend_one_serves(const attend_args &aa, int64_t T)
{
    return attend_splits(T, aa.d, aa.rope_dim) == 2 && aa.d == GFW_ATTEND_ONE_D && gfw_aligned16(aa.q) &&
           gfw_aligned16(aa.kv_call) && gfw_aligned16(aa.ring) && gfw_aligned16(aa.comp); /* NULL comp: aligned */
}

/**
 * Launch k_attend for T tokens of H heads: k_attend_one where it serves (attend_one_serves()),
 * else ATTEND_PAIR (a cluster of two blocks a head) for two parts, else ATTEND_ANY.
 */
static void launch_attend(const attend_args &aa, int64_t T, cudaStream_t st)
{
    const int splits = attend_splits(T, aa.d, aa.rope_dim);
    const dim3 grid((unsigned)T, (unsigned)aa.H, (unsigned)splits);
    if (attend_one_serves(aa, T)) {
        mmoe_launch_pdl_cluster(dim3(1, 1, 2), k_attend_one, grid, GFW_ATTEND_ONE_THREADS, GFW_ATTEND_ONE_SMEM, st, aa);
        return;
    }
    if (splits != 2) {
        mmoe_launch_pdl(k_attend<ATTEND_ANY>, grid, GFW_ATTEND_THREADS, 0, st, aa);
        return;
    }
    mmoe_launch_pdl_cluster(dim3(1, 1, 2), k_attend<ATTEND_PAIR>, grid, GFW_ATTEND_THREADS, 0, st, aa);
}

/** Copy the last min(T, W) kv rows of the call into the ring (slot pos % W; pos0 = *pos_dev). */
__global__ void k_ring_store(const uint16_t *kv, int64_t T, const int64_t *pos_dev, int W, int d, uint16_t *ring)
{
    gfw_pdl_enter();
    const int64_t pos0 = *pos_dev;
    const int64_t first = T > W ? T - W : 0;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (T - first) * d)
        return;
    const int64_t t = first + i / d, c = i % d;
    ring[((pos0 + t) % W) * d + c] = kv[t * d + c];
}

/* ================================================================== kernels: MoE (gpu_fwd_moe.cu) */

/** X[t, j, :] = bf16(e[t, :] + hp[t, j, :]) (the MTP input). */
__global__ void k_mtp_sum(const uint16_t *e, const uint16_t *hp, int64_t T, int hc, int64_t D, uint16_t *X)
{
    gfw_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * hc * D)
        return;
    const int64_t r = i / (hc * D), c = i % D;
    X[i] = gfw_f2bf(__fadd_rn(gfw_bf2f(e[r * D + c]), gfw_bf2f(hp[i])));
}

/* ================================================================== host side: the model object */

/** One block on the device. */
struct gblock {
    gfw_attn_dims a;
    const float *hca_fn, *hca_base, *hca_scale, *hcf_fn, *hcf_base, *hcf_scale;
    ddense attn_norm, ffn_norm, q_norm, kv_norm, wo_a, idx_wp;
    dfp8 wq_a, wq_b, wkv, wo_b, idx_wq_b;
    const float *sink;
    ddense c_wkv, c_wgate, c_norm, i_wkv, i_wgate, i_norm;
    const float *c_ape, *i_ape;
    const float *cs;              /**< cos/sin table [max_seq_len][half][2] */
    /* MoE */
    dmoe moe;
    const uint16_t *gate;
    const float *bias;
    const int32_t *tid2eid;
    float route_scale;
    /* caches */
    uint16_t *ring, *comp, *idx_keys;
    float *c_kv, *c_score, *i_kv, *i_score;
    int64_t max_blocks;
    size_t c_state_n, i_state_n;  /**< floats per compressor state array */
    /** @var gblock::a
     *  attention shapes
     *  @var gblock::hca_fn
     *  mHC fn of the attention sub-layer
     *  @var gblock::hca_base
     *  mHC base of the attention sub-layer
     *  @var gblock::hca_scale
     *  mHC scale of the attention sub-layer
     *  @var gblock::hcf_fn
     *  mHC fn of the MoE sub-layer
     *  @var gblock::hcf_base
     *  mHC base of the MoE sub-layer
     *  @var gblock::hcf_scale
     *  mHC scale of the MoE sub-layer
     *  @var gblock::attn_norm
     *  attention norm [D]
     *  @var gblock::ffn_norm
     *  MoE norm [D]
     *  @var gblock::q_norm
     *  query low-rank norm [q_lora]
     *  @var gblock::kv_norm
     *  kv norm [d]
     *  @var gblock::wo_a
     *  grouped output projection
     *  @var gblock::idx_wp
     *  indexer head weights [ih, D] (ratio 4)
     *  @var gblock::wq_a
     *  query down projection
     *  @var gblock::wq_b
     *  query up projection
     *  @var gblock::wkv
     *  kv projection
     *  @var gblock::wo_b
     *  output projection
     *  @var gblock::idx_wq_b
     *  indexer query projection (ratio 4)
     *  @var gblock::sink
     *  attention sinks [H]
     *  @var gblock::c_wkv
     *  compressor kv projection
     *  @var gblock::c_wgate
     *  compressor gate projection
     *  @var gblock::c_norm
     *  compressor norm
     *  @var gblock::i_wkv
     *  indexer compressor kv projection
     *  @var gblock::i_wgate
     *  indexer compressor gate projection
     *  @var gblock::i_norm
     *  indexer compressor norm
     *  @var gblock::c_ape
     *  compressor position bias [ratio, c*d]
     *  @var gblock::i_ape
     *  indexer compressor position bias
     *  @var gblock::moe
     *  the MoE weights
     *  @var gblock::gate
     *  router weights bf16 [E, D]
     *  @var gblock::bias
     *  router bias [E] or NULL
     *  @var gblock::tid2eid
     *  hash layers: experts of each token id, NULL otherwise
     *  @var gblock::route_scale
     *  routed scaling factor
     *  @var gblock::ring
     *  window ring [window, d]
     *  @var gblock::comp
     *  compressed kv blocks [max_blocks, d]
     *  @var gblock::idx_keys
     *  indexer keys [max_blocks, id] (ratio 4)
     *  @var gblock::c_kv
     *  compressor kv state
     *  @var gblock::c_score
     *  compressor score state
     *  @var gblock::i_kv
     *  indexer compressor kv state
     *  @var gblock::i_score
     *  indexer compressor score state
     *  @var gblock::max_blocks
     *  compressed blocks of max_seq_len positions
     *  @var gblock::c_state_n
     *  floats per attention compressor state array */
};

/** The model. */
struct mmoe_gpu_model {
    int plan;                     /**< 1 while counting bytes only */
    mmoe_gpu_model_bytes bytes;   /**< planned / held */
    size_t *bucket;               /**< which counter galloc adds to */
    void **allocs;                /**< device allocations */
    int n_allocs, cap_allocs;
    int64_t D, V, hc, max_seq_len, Tm;
    int n_layers, n_blocks, iters, has_mtp;
    float eps, hc_eps;
    const uint16_t *embed, *head_w;
    const float *hh_fn, *hh_base, *hh_scale;
    ddense head_norm;
    gblock *blocks;
    /* MTP */
    dfp8 e_proj, h_proj;
    ddense enorm, hnorm, mtp_norm;
    const float *mh_fn, *mh_base, *mh_scale;
    /* work */
    uint16_t *X, *y, *o, *qr, *q, *kv, *att, *z, *hn, *hp, *e;
    double *hc_part;
    unsigned *hc_arrive;
    float *post, *comb, *comb_logits, *ckv, *cgate, *ikv, *igate, *scores, *logits, *moe_x, *moe_scores, *moe_w, *moe_h;
    uint16_t *qi, *wi, *slot_y;
    int32_t *ids, *topk_idx, *moe_idx;
    int has_part;                 /**< 1: one rank of an expert-parallel forward (part) */
    gfw_ep_part part;             /**< its expert range and exchange */
    uint8_t *aq;
    float *as;
    int64_t max_blocks_all, kmax, moe_width, moe_kmax;
    gfw_moe_work moe_work;        /**< the MoE sub-layer's own work buffers */
    gfw_moe_work moe_side_work;   /**< the shared expert's branch: its own plan arrays, moe_work's xb and hq */
    mmoe_gpu_fp8_linears fp8_linears; /**< the FP8 linears' recipe (MMOE_GPU_FP8_LINEARS, mmoe_gpu_model_set_fp8_linears()) */
    gfw_tc_ws tc_ws;              /**< k_linear_fp8_tc's partials and counts (the `tc` recipe) */
    /* state */
    int64_t pos, mtp_pos;
    int timing;
    double *attn_s, *moe_s, *mhc_s, embed_s, head_s;
    /* the stream, the step record and the decode graph (the chapter "One stream, one step record, one graph") */
    cudaStream_t stream;          /**< every launch and copy of a call */
    cudaStream_t side;            /**< branches forked from and joined to stream: the one-token MoE's shared expert (moe_side()), the Sinkhorn (sinkhorn_side()) */
    cudaEvent_t moe_fork;         /**< recorded on stream before the shared expert's branch */
    cudaEvent_t moe_join;         /**< recorded on side after it */
    cudaEvent_t hc_fork;          /**< recorded on stream after a one-token k_hc_pre_norm (sinkhorn_side()) */
    cudaEvent_t hc_join;          /**< recorded on side after its k_hc_sinkhorn */
    int64_t *step;                /**< device step record: step[0] the call's first position, then its ids (ids) */
    int64_t *step_host;           /**< its pinned host copy, written before each call */
    int n_sm;                     /**< multiprocessors of the device (grids sized for the largest live count) */
    int graph_on;                 /**< 1: decode steps (T = 1, logits wanted, timing off) replay one graph */
    int capturing;                /**< 1 while the decode step is being captured */
    cudaGraphExec_t graph_exec;   /**< the captured decode step (NULL until the first graphed step) */
    int64_t graph_captures, graph_replays, eager_calls; /**< since creation */
    mmoe_model_observer obs_fn;   /**< gfw_test_set_observer()'s observer (NULL: none) */
    void *obs_ctx;                /**< its context */
    uint16_t *obs_in;             /**< host copy [Tm, D] of a sub-layer's input, for the observer */
    uint16_t *obs_out;            /**< host copy [Tm, D] of the attention's output, for the observer */
    /** @var mmoe_gpu_model::graph_captures
     *  captures of the decode graph
     *  @var mmoe_gpu_model::graph_replays
     *  forward calls that replayed it
     *  @var mmoe_gpu_model::eager_calls
     *  forward calls launched kernel by kernel */
    /** @var mmoe_gpu_model::n_allocs
     *  allocations held
     *  @var mmoe_gpu_model::cap_allocs
     *  capacity of allocs
     *  @var mmoe_gpu_model::D
     *  model width
     *  @var mmoe_gpu_model::V
     *  vocabulary
     *  @var mmoe_gpu_model::hc
     *  mHC streams
     *  @var mmoe_gpu_model::max_seq_len
     *  positions the caches hold
     *  @var mmoe_gpu_model::Tm
     *  most tokens per call
     *  @var mmoe_gpu_model::n_layers
     *  main layers
     *  @var mmoe_gpu_model::n_blocks
     *  main + MTP blocks
     *  @var mmoe_gpu_model::iters
     *  Sinkhorn iterations of the mHC mix
     *  @var mmoe_gpu_model::has_mtp
     *  1: the MTP block is loaded
     *  @var mmoe_gpu_model::eps
     *  RMSNorm epsilon
     *  @var mmoe_gpu_model::hc_eps
     *  mHC epsilon
     *  @var mmoe_gpu_model::embed
     *  embedding bf16 [V, D]
     *  @var mmoe_gpu_model::head_w
     *  output head bf16 [V, D]
     *  @var mmoe_gpu_model::hh_fn
     *  mHC fn of the main head
     *  @var mmoe_gpu_model::hh_base
     *  mHC base of the main head
     *  @var mmoe_gpu_model::hh_scale
     *  mHC scale of the main head
     *  @var mmoe_gpu_model::head_norm
     *  final norm [D]
     *  @var mmoe_gpu_model::blocks
     *  [n_blocks] main then MTP blocks
     *  @var mmoe_gpu_model::e_proj
     *  MTP embedding projection
     *  @var mmoe_gpu_model::h_proj
     *  MTP stream projection
     *  @var mmoe_gpu_model::enorm
     *  MTP embedding norm
     *  @var mmoe_gpu_model::hnorm
     *  MTP stream norm
     *  @var mmoe_gpu_model::mtp_norm
     *  MTP final norm
     *  @var mmoe_gpu_model::mh_fn
     *  mHC fn of the MTP head
     *  @var mmoe_gpu_model::mh_base
     *  mHC base of the MTP head
     *  @var mmoe_gpu_model::mh_scale
     *  mHC scale of the MTP head
     *  @var mmoe_gpu_model::X
     *  residual streams [Tm*hc, D]
     *  @var mmoe_gpu_model::y
     *  sub-layer input [Tm, D]
     *  @var mmoe_gpu_model::o
     *  sub-layer output [Tm, D]
     *  @var mmoe_gpu_model::qr
     *  query low-rank [Tm, q_lora]
     *  @var mmoe_gpu_model::q
     *  queries [Tm, H*d]
     *  @var mmoe_gpu_model::kv
     *  kv rows of the call [Tm, d]
     *  @var mmoe_gpu_model::att
     *  attention output [Tm, H*d]
     *  @var mmoe_gpu_model::z
     *  grouped output projection [Tm, G*o_lora]
     *  @var mmoe_gpu_model::hn
     *  MTP normed streams [Tm*hc, D]
     *  @var mmoe_gpu_model::hp
     *  MTP projected streams [Tm*hc, D]
     *  @var mmoe_gpu_model::e
     *  MTP projected embedding [Tm, D]
     *  @var mmoe_gpu_model::hc_part
     *  mHC block sums [Tm, (2+hc)*hc + 1, hc_part_blocks(hc*D)]
     *  @var mmoe_gpu_model::hc_arrive
     *  k_hc_pre_norm's count of the blocks done, per token [Tm] (0 between launches)
     *  @var mmoe_gpu_model::post
     *  mHC post weights [Tm, hc]
     *  @var mmoe_gpu_model::comb
     *  mHC combine matrices [Tm, hc, hc]
     *  @var mmoe_gpu_model::comb_logits
     *  their logits, from k_hc_pre_norm to k_hc_sinkhorn (sinkhorn_side()) [Tm, hc, hc]
     *  @var mmoe_gpu_model::ckv
     *  compressor kv projection [Tm, 2*d]
     *  @var mmoe_gpu_model::cgate
     *  compressor gate projection [Tm, 2*d]
     *  @var mmoe_gpu_model::ikv
     *  indexer compressor kv projection [Tm, 2*id]
     *  @var mmoe_gpu_model::igate
     *  indexer compressor gate projection [Tm, 2*id]
     *  @var mmoe_gpu_model::scores
     *  indexer scores [Tm, max_blocks_all]
     *  @var mmoe_gpu_model::logits
     *  logits [Tm, V]
     *  @var mmoe_gpu_model::moe_x
     *  dequantized MoE input [Tm, D], chain-major per row (gpu_fwd_moe.cu)
     *  @var mmoe_gpu_model::moe_scores
     *  router scores [Tm, E]
     *  @var mmoe_gpu_model::moe_w
     *  routing weights [Tm, moe_kmax]
     *  @var mmoe_gpu_model::moe_h
     *  expert hidden rows [Tm, moe_kmax + 1, moe_width]
     *  @var mmoe_gpu_model::qi
     *  indexer queries [Tm, ih*id]
     *  @var mmoe_gpu_model::wi
     *  indexer head weights [Tm, ih]
     *  @var mmoe_gpu_model::slot_y
     *  expert outputs per slot [Tm, moe_kmax + 1, D]
     *  @var mmoe_gpu_model::ids
     *  token ids of the call [Tm]
     *  @var mmoe_gpu_model::topk_idx
     *  selected compressed blocks [Tm, topk]
     *  @var mmoe_gpu_model::moe_idx
     *  routed experts [Tm, moe_kmax]
     *  @var mmoe_gpu_model::aq
     *  E4M3 activations of an FP8 linear [Tm*hc, kmax]
     *  @var mmoe_gpu_model::as
     *  their scales per 128
     *  @var mmoe_gpu_model::max_blocks_all
     *  largest max_blocks of the blocks
     *  @var mmoe_gpu_model::kmax
     *  largest input width of an FP8 linear
     *  @var mmoe_gpu_model::moe_width
     *  largest expert or shared width
     *  @var mmoe_gpu_model::moe_kmax
     *  largest experts per token
     *  @var mmoe_gpu_model::pos
     *  positions the main model has consumed
     *  @var mmoe_gpu_model::mtp_pos
     *  positions the MTP block has consumed
     *  @var mmoe_gpu_model::timing
     *  1: per-stage timing on
     *  @var mmoe_gpu_model::attn_s
     *  seconds of attention per block
     *  @var mmoe_gpu_model::moe_s
     *  seconds of MoE per block
     *  @var mmoe_gpu_model::mhc_s
     *  seconds of mHC per block
     *  @var mmoe_gpu_model::embed_s
     *  seconds of embedding
     *  @var mmoe_gpu_model::head_s
     *  seconds of the heads */
};

/** Allocate @p bytes on the device (or count them while planning). */
static void *galloc(mmoe_gpu_model *g, size_t bytes, cudaError_t *ce)
{
    bytes = (bytes + 255) & ~(size_t)255;
    *g->bucket += bytes;
    if (g->plan || *ce != cudaSuccess || bytes == 0)
        return NULL;
    void *p = NULL;
    if ((*ce = cudaMalloc(&p, bytes)) != cudaSuccess)
        return NULL;
    if ((*ce = cudaMemset(p, 0, bytes)) != cudaSuccess) { /* no read of a never-written byte, ever */
        cudaFree(p);
        return NULL;
    }
    if (g->n_allocs == g->cap_allocs) {
        int nc = g->cap_allocs ? 2 * g->cap_allocs : 256;
        void **na = (void **)realloc(g->allocs, sizeof(void *) * (size_t)nc);
        if (!na) {
            cudaFree(p);
            *ce = cudaErrorMemoryAllocation;
            return NULL;
        }
        g->allocs = na;
        g->cap_allocs = nc;
    }
    g->allocs[g->n_allocs++] = p;
    return p;
}

/** Allocate and copy @p bytes of host data. */
static const void *gupload(mmoe_gpu_model *g, const void *src, size_t bytes, cudaError_t *ce)
{
    void *p = galloc(g, bytes, ce);
    if (p && src && *ce == cudaSuccess)
        *ce = cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    return p;
}

/**
 * 1 when none of the @p n E4M3 codes at @p p (host memory) is NaN (0x7F or 0xFF), else 0.  The
 * FP8 kernels of a NaN-free weight skip their per-code NaN tests (a weight is constant, so one
 * look at upload answers for every call); a weight with a NaN code keeps them, and its NaN
 * reaches the outputs as in the oracle.
 */
static int e4m3_codes_nan_free(const uint8_t *p, size_t n)
{
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++)
        any |= (uint8_t)((p[i] & 0x7Fu) == 0x7Fu);
    return !any;
}

/** Upload a dense weight. */
static ddense up_dense(mmoe_gpu_model *g, const gfw_dense *w, cudaError_t *ce)
{
    ddense d;
    memset(&d, 0, sizeof d);
    if (!w->data)
        return d;
    d.dtype = w->dtype;
    d.rows = w->rows;
    d.cols = w->cols;
    d.block = w->block;
    d.p = gupload(g, w->data, gfw_dense_bytes(w), ce);
    if (w->dtype == GFW_F8) {
        d.scols = (w->cols + w->block - 1) / w->block;
        d.scale = (const uint8_t *)gupload(g, w->scale, (size_t)(((w->rows + w->block - 1) / w->block) * d.scols), ce);
        d.nan_free = e4m3_codes_nan_free((const uint8_t *)w->data, gfw_dense_bytes(w));
    }
    return d;
}

/** Upload an FP8 linear. */
static dfp8 up_fp8(mmoe_gpu_model *g, const gfw_fp8 *w, cudaError_t *ce)
{
    dfp8 d;
    memset(&d, 0, sizeof d);
    if (!w->w)
        return d;
    d.N = w->N;
    d.K = w->K;
    d.block = w->block;
    d.scols = (w->K + w->block - 1) / w->block;
    d.w = (const uint8_t *)gupload(g, w->w, (size_t)(w->N * w->K), ce);
    d.s = (const uint8_t *)gupload(g, w->scale, (size_t)(((w->N + w->block - 1) / w->block) * d.scols), ce);
    d.nan_free = e4m3_codes_nan_free(w->w, (size_t)(w->N * w->K));
    return d;
}

/** Upload [E] per-expert arrays of @p each bytes into one device array. */
static const uint8_t *up_experts(mmoe_gpu_model *g, const uint8_t *const *src, int64_t E, size_t each, cudaError_t *ce)
{
    uint8_t *p = (uint8_t *)galloc(g, each * (size_t)E, ce);
    for (int64_t e = 0; p && e < E && *ce == cudaSuccess; e++)
        *ce = cudaMemcpy(p + (size_t)e * each, src[e], each, cudaMemcpyHostToDevice);
    return p;
}

/** The cos/sin table [max_seq_len][half][2] of a frequency table, with the oracle's function. */
static float *rope_table(const float *freqs, int rope_dim, int64_t n_pos)
{
    const int half = rope_dim / 2;
    float *t = (float *)malloc(sizeof(float) * (size_t)(n_pos * half * 2));
    float cv[128], sv[128];
    if (!t)
        return NULL;
    for (int64_t p = 0; p < n_pos; p++) {
        /* attn_rope_cos_sin() of the oracle: fp32 angle pos*f, cosf/sinf */
        const float fpos = (float)p;
        for (int i = 0; i < half; i++) {
            const float angle = fpos * freqs[i];
            cv[i] = cosf(angle);
            sv[i] = sinf(angle);
        }
        for (int i = 0; i < half; i++) {
            t[(p * half + i) * 2] = cv[i];
            t[(p * half + i) * 2 + 1] = sv[i];
        }
    }
    return t;
}

/** The routed experts of a layer of @p n_experts that this GPU holds: the rank's block of @p part, or all (NULL). */
static int64_t experts_held(const gfw_ep_part *part, int64_t n_experts)
{
    return part ? part->n_local : n_experts;
}

/** Upload (or plan) everything; returns a CUDA error or cudaSuccess, or -1 through *oom for host memory. */
static cudaError_t build(mmoe_gpu_model *g, const gfw_model_src *s, int *host_oom)
{
    cudaError_t ce = cudaSuccess;
    const int64_t D = s->D, Tm = g->Tm, hc = s->hc;
    g->bucket = &g->bytes.weights;
    g->embed = (const uint16_t *)gupload(g, s->embed, (size_t)(s->V * D) * 2, &ce);
    g->head_w = (const uint16_t *)gupload(g, s->head_w, (size_t)(s->V * D) * 2, &ce);
    g->hh_fn = (const float *)gupload(g, s->hc_head.fn, sizeof(float) * (size_t)(hc * hc * D), &ce);
    g->hh_base = (const float *)gupload(g, s->hc_head.base, sizeof(float) * (size_t)hc, &ce);
    g->hh_scale = (const float *)gupload(g, s->hc_head.scale, sizeof(float), &ce);
    g->head_norm = up_dense(g, &s->head_norm, &ce);
    int64_t kmax = D, maxb = 1, moe_width = 128, moe_k = 1;
    for (int L = 0; L < s->n_blocks; L++) {
        const gfw_block_src *b = &s->blocks[L];
        gblock *d = &g->blocks[L];
        const gfw_attn_dims *a = &b->a;
        const int n_mix = (int)((2 + hc) * hc);
        d->a = *a;
        g->bucket = &g->bytes.weights;
        d->hca_fn = (const float *)gupload(g, b->hc_attn.fn, sizeof(float) * (size_t)(n_mix * hc * D), &ce);
        d->hca_base = (const float *)gupload(g, b->hc_attn.base, sizeof(float) * (size_t)n_mix, &ce);
        d->hca_scale = (const float *)gupload(g, b->hc_attn.scale, sizeof(float) * 3, &ce);
        d->hcf_fn = (const float *)gupload(g, b->hc_ffn.fn, sizeof(float) * (size_t)(n_mix * hc * D), &ce);
        d->hcf_base = (const float *)gupload(g, b->hc_ffn.base, sizeof(float) * (size_t)n_mix, &ce);
        d->hcf_scale = (const float *)gupload(g, b->hc_ffn.scale, sizeof(float) * 3, &ce);
        d->attn_norm = up_dense(g, &b->attn_norm, &ce);
        d->ffn_norm = up_dense(g, &b->ffn_norm, &ce);
        d->q_norm = up_dense(g, &b->q_norm, &ce);
        d->kv_norm = up_dense(g, &b->kv_norm, &ce);
        d->wo_a = up_dense(g, &b->wo_a, &ce);
        d->idx_wp = up_dense(g, &b->idx_weights_proj, &ce);
        d->wq_a = up_fp8(g, &b->wq_a, &ce);
        d->wq_b = up_fp8(g, &b->wq_b, &ce);
        d->wkv = up_fp8(g, &b->wkv, &ce);
        d->wo_b = up_fp8(g, &b->wo_b, &ce);
        d->idx_wq_b = up_fp8(g, &b->idx_wq_b, &ce);
        d->sink = (const float *)gupload(g, b->sink, sizeof(float) * (size_t)a->H, &ce);
        const int c = a->ratio == 4 ? 2 : 1;
        if (a->ratio > 0) {
            d->c_wkv = up_dense(g, &b->comp.wkv, &ce);
            d->c_wgate = up_dense(g, &b->comp.wgate, &ce);
            d->c_norm = up_dense(g, &b->comp.norm, &ce);
            d->c_ape = (const float *)gupload(g, b->comp.ape, sizeof(float) * (size_t)(a->ratio * c * a->d), &ce);
        }
        if (a->ratio == 4) {
            d->i_wkv = up_dense(g, &b->idx_comp.wkv, &ce);
            d->i_wgate = up_dense(g, &b->idx_comp.wgate, &ce);
            d->i_norm = up_dense(g, &b->idx_comp.norm, &ce);
            d->i_ape = (const float *)gupload(g, b->idx_comp.ape, sizeof(float) * (size_t)(4 * 2 * a->id), &ce);
        }
        /* RoPE table: shared with an earlier block of the same frequencies */
        d->cs = NULL;
        for (int P = 0; P < L; P++)
            if (s->blocks[P].a.rope_dim == a->rope_dim && memcmp(s->blocks[P].freqs, b->freqs, sizeof(float) * (size_t)(a->rope_dim / 2)) == 0) {
                d->cs = g->blocks[P].cs;
                break;
            }
        if (d->cs == NULL && !(g->plan == 0 && ce != cudaSuccess)) {
            int found = 0;
            for (int P = 0; P < L; P++)
                found |= s->blocks[P].a.rope_dim == a->rope_dim &&
                         memcmp(s->blocks[P].freqs, b->freqs, sizeof(float) * (size_t)(a->rope_dim / 2)) == 0;
            if (!found) {
                const size_t tb = sizeof(float) * (size_t)(g->max_seq_len * a->rope_dim);
                if (g->plan) {
                    g->bytes.weights += (tb + 255) & ~(size_t)255;
                } else {
                    float *tab = rope_table(b->freqs, a->rope_dim, g->max_seq_len);
                    if (!tab) {
                        *host_oom = 1;
                        return ce;
                    }
                    d->cs = (const float *)gupload(g, tab, tb, &ce);
                    free(tab);
                }
            }
        }
        /* MoE */
        const gfw_moe *m = &b->moe;
        dmoe *dm = &d->moe;
        dm->E = m->n_experts;
        dm->first = g->has_part ? g->part.first : 0;
        dm->held = experts_held(g->has_part ? &g->part : NULL, m->n_experts);
        dm->I = m->inter;
        dm->D = D;
        dm->k = m->topk;
        dm->Ws = m->shared_width;
        dm->B = m->shared_block;
        dm->limit = m->swiglu_limit;
        d->route_scale = m->route_scale;
        d->gate = (const uint16_t *)gupload(g, m->gate, (size_t)(m->n_experts * D) * 2, &ce);
        d->bias = m->bias ? (const float *)gupload(g, m->bias, sizeof(float) * (size_t)m->n_experts, &ce) : NULL;
        d->tid2eid = m->hash ? (const int32_t *)gupload(g, m->tid2eid, sizeof(int32_t) * (size_t)(m->vocab * m->topk), &ce) : NULL;
        /* the routed experts: all, or the rank's block [e0, e0 + ne) */
        const int64_t e0 = dm->first, ne = dm->held;
        dm->w1 = up_experts(g, m->w1 + e0, ne, (size_t)(m->inter * D / 2), &ce);
        dm->w3 = up_experts(g, m->w3 + e0, ne, (size_t)(m->inter * D / 2), &ce);
        dm->w2 = up_experts(g, m->w2 + e0, ne, (size_t)(D * m->inter / 2), &ce);
        dm->s1 = up_experts(g, m->s1 + e0, ne, (size_t)(m->inter * D / 32), &ce);
        dm->s3 = up_experts(g, m->s3 + e0, ne, (size_t)(m->inter * D / 32), &ce);
        dm->s2 = up_experts(g, m->s2 + e0, ne, (size_t)(D * m->inter / 32), &ce);
        if (m->shared_width > 0) {
            const int64_t Ws = m->shared_width, B = m->shared_block;
            dm->sw1 = (const uint8_t *)gupload(g, m->sw1, (size_t)(Ws * D), &ce);
            dm->sw3 = (const uint8_t *)gupload(g, m->sw3, (size_t)(Ws * D), &ce);
            dm->sw2 = (const uint8_t *)gupload(g, m->sw2, (size_t)(Ws * D), &ce);
            const size_t n13 = (size_t)(((Ws + B - 1) / B) * ((D + B - 1) / B));
            const size_t n2 = (size_t)(((D + B - 1) / B) * ((Ws + B - 1) / B));
            dm->ss1 = (const float *)gupload(g, m->ss1, sizeof(float) * n13, &ce);
            dm->ss3 = (const float *)gupload(g, m->ss3, sizeof(float) * n13, &ce);
            dm->ss2 = (const float *)gupload(g, m->ss2, sizeof(float) * n2, &ce);
        }
        if (!g->plan && ce == cudaSuccess)
            ce = gfw_moe_pack(dm, (uint16_t *)d->gate);
        /* caches */
        g->bucket = &g->bytes.caches;
        d->ring = (uint16_t *)galloc(g, (size_t)(a->window * a->d) * 2, &ce);
        d->max_blocks = a->ratio > 0 ? g->max_seq_len / a->ratio : 0;
        if (a->ratio > 0) {
            d->comp = (uint16_t *)galloc(g, (size_t)((d->max_blocks > 0 ? d->max_blocks : 1) * a->d) * 2, &ce);
            d->c_state_n = (size_t)(c * a->ratio) * (size_t)(c * a->d);
            d->c_kv = (float *)galloc(g, sizeof(float) * d->c_state_n, &ce);
            d->c_score = (float *)galloc(g, sizeof(float) * d->c_state_n, &ce);
        }
        if (a->ratio == 4) {
            d->idx_keys = (uint16_t *)galloc(g, (size_t)((d->max_blocks > 0 ? d->max_blocks : 1) * a->id) * 2, &ce);
            d->i_state_n = (size_t)(2 * 4) * (size_t)(2 * a->id);
            d->i_kv = (float *)galloc(g, sizeof(float) * d->i_state_n, &ce);
            d->i_score = (float *)galloc(g, sizeof(float) * d->i_state_n, &ce);
            if (d->max_blocks > maxb)
                maxb = d->max_blocks;
        }
        kmax = kmax > a->q_lora ? kmax : a->q_lora;
        kmax = kmax > (int64_t)a->G * a->o_lora ? kmax : (int64_t)a->G * a->o_lora;
        moe_width = moe_width > m->inter ? moe_width : m->inter;
        moe_width = moe_width > m->shared_width ? moe_width : m->shared_width;
        moe_k = moe_k > m->topk ? moe_k : m->topk;
    }
    if (s->has_mtp) {
        g->bucket = &g->bytes.weights;
        g->e_proj = up_fp8(g, &s->mtp.e_proj, &ce);
        g->h_proj = up_fp8(g, &s->mtp.h_proj, &ce);
        g->enorm = up_dense(g, &s->mtp.enorm, &ce);
        g->hnorm = up_dense(g, &s->mtp.hnorm, &ce);
        g->mtp_norm = up_dense(g, &s->mtp.norm, &ce);
        g->mh_fn = (const float *)gupload(g, s->mtp.hc_head.fn, sizeof(float) * (size_t)(hc * hc * D), &ce);
        g->mh_base = (const float *)gupload(g, s->mtp.hc_head.base, sizeof(float) * (size_t)hc, &ce);
        g->mh_scale = (const float *)gupload(g, s->mtp.hc_head.scale, sizeof(float), &ce);
    }
    /* work buffers for Tm tokens (T*hc rows for the MTP's stream projections) */
    g->bucket = &g->bytes.work;
    g->kmax = kmax;
    g->max_blocks_all = maxb;
    g->moe_width = moe_width;
    g->moe_kmax = moe_k;
    int64_t H = 0, d = 0, q = 0, gr = 0, ih = 0, id = 0, E = 0;
    for (int L = 0; L < s->n_blocks; L++) {
        const gfw_attn_dims *a = &s->blocks[L].a;
        H = H > a->H ? H : a->H;
        d = d > a->d ? d : a->d;
        q = q > a->q_lora ? q : a->q_lora;
        gr = gr > (int64_t)a->G * a->o_lora ? gr : (int64_t)a->G * a->o_lora;
        ih = ih > a->ih ? ih : a->ih;
        id = id > a->id ? id : a->id;
        E = E > s->blocks[L].moe.n_experts ? E : s->blocks[L].moe.n_experts;
    }
    const int64_t rows = Tm * hc;
    g->step = (int64_t *)galloc(g, sizeof(int64_t) + sizeof(int32_t) * (size_t)Tm, &ce);
    g->ids = g->step ? (int32_t *)(g->step + 1) : NULL;
    g->X = (uint16_t *)galloc(g, 2 * (size_t)(rows * D), &ce);
    g->y = (uint16_t *)galloc(g, 2 * (size_t)(Tm * D), &ce);
    g->o = (uint16_t *)galloc(g, 2 * (size_t)(Tm * D), &ce);
    g->e = (uint16_t *)galloc(g, 2 * (size_t)(Tm * D), &ce);
    g->hn = (uint16_t *)galloc(g, 2 * (size_t)(rows * D), &ce);
    g->hp = (uint16_t *)galloc(g, 2 * (size_t)(rows * D), &ce);
    g->post = (float *)galloc(g, sizeof(float) * (size_t)(Tm * hc), &ce);
    g->hc_part = (double *)galloc(g, sizeof(double) * (size_t)(Tm * ((2 + hc) * hc + 1) * hc_part_blocks(hc * D)), &ce);
    g->hc_arrive = (unsigned *)galloc(g, sizeof(unsigned) * (size_t)Tm, &ce);
    g->comb = (float *)galloc(g, sizeof(float) * (size_t)(Tm * hc * hc), &ce);
    g->comb_logits = (float *)galloc(g, sizeof(float) * (size_t)(Tm * hc * hc), &ce);
    g->qr = (uint16_t *)galloc(g, 2 * (size_t)(Tm * q), &ce);
    g->q = (uint16_t *)galloc(g, 2 * (size_t)(Tm * H * d), &ce);
    g->kv = (uint16_t *)galloc(g, 2 * (size_t)(Tm * d), &ce);
    g->att = (uint16_t *)galloc(g, 2 * (size_t)(Tm * H * d), &ce);
    g->z = (uint16_t *)galloc(g, 2 * (size_t)(Tm * gr), &ce);
    g->ckv = (float *)galloc(g, sizeof(float) * (size_t)(Tm * 2 * d), &ce);
    g->cgate = (float *)galloc(g, sizeof(float) * (size_t)(Tm * 2 * d), &ce);
    g->ikv = (float *)galloc(g, sizeof(float) * (size_t)(Tm * 2 * (id > 0 ? id : 1)), &ce);
    g->igate = (float *)galloc(g, sizeof(float) * (size_t)(Tm * 2 * (id > 0 ? id : 1)), &ce);
    g->qi = (uint16_t *)galloc(g, 2 * (size_t)(Tm * (ih > 0 ? ih * id : 1)), &ce);
    g->wi = (uint16_t *)galloc(g, 2 * (size_t)(Tm * (ih > 0 ? ih : 1)), &ce);
    g->scores = (float *)galloc(g, sizeof(float) * (size_t)(Tm * maxb), &ce);
    int64_t topk_max = 1;
    for (int L = 0; L < s->n_blocks; L++)
        topk_max = topk_max > s->blocks[L].a.topk ? topk_max : s->blocks[L].a.topk;
    g->topk_idx = (int32_t *)galloc(g, sizeof(int32_t) * (size_t)(Tm * topk_max), &ce);
    g->aq = (uint8_t *)galloc(g, (size_t)(rows * kmax), &ce);
    g->as = (float *)galloc(g, sizeof(float) * (size_t)(rows * kmax / 128), &ce);
    g->logits = (float *)galloc(g, sizeof(float) * (size_t)(Tm * s->V), &ce);
    g->moe_x = (float *)galloc(g, sizeof(float) * (size_t)(Tm * D), &ce);
    g->moe_scores = (float *)galloc(g, sizeof(float) * (size_t)(Tm * E), &ce);
    g->moe_idx = (int32_t *)galloc(g, sizeof(int32_t) * (size_t)(Tm * moe_k), &ce);
    g->moe_w = (float *)galloc(g, sizeof(float) * (size_t)(Tm * moe_k), &ce);
    g->moe_h = (float *)galloc(g, sizeof(float) * (size_t)(Tm * (moe_k + 1) * moe_width), &ce);
    g->slot_y = (uint16_t *)galloc(g, 2 * (size_t)(Tm * (moe_k + 1) * D), &ce);
    void *mw = galloc(g, gfw_moe_work_bytes(Tm, D, moe_k, moe_width), &ce);
    if (mw)
        gfw_moe_work_carve(mw, Tm, D, moe_k, moe_width, &g->moe_work);
    void *sw = galloc(g, gfw_moe_side_bytes(Tm), &ce);
    if (sw && mw)
        gfw_moe_side_carve(sw, Tm, g->moe_work, &g->moe_side_work);
    /* held whatever the recipe, so that switching it needs no allocation (4 MB) */
    g->tc_ws.part = (float *)galloc(g, sizeof(float) * GFW_TC_PART_FLOATS, &ce);
    g->tc_ws.count = (unsigned *)galloc(g, sizeof(unsigned) * GFW_TC_COUNTS, &ce);
    return ce;
}

/** Free every device allocation. */
static void free_all(mmoe_gpu_model *g)
{
    for (int i = 0; i < g->n_allocs; i++)
        cudaFree(g->allocs[i]);
    free(g->allocs);
    g->allocs = NULL;
    g->n_allocs = g->cap_allocs = 0;
}

/** The CUDA error as an mmoe error naming @p what. */
static mmoe_status cuda_fail(mmoe_error *err, cudaError_t ce, const char *what)
{
    if (ce == cudaErrorMemoryAllocation)
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: %s: out of device memory", what);
    return mmoe_error_set(err, MMOE_EINTERNAL, "gpu forward: %s: CUDA error: %s", what, cudaGetErrorString(ce));
}

/** Fill the model's scalar fields from @p s (shared by planning and creation). */
static mmoe_status model_init(mmoe_gpu_model *g, const gfw_model_src *s, const gfw_ep_part *part, int64_t max_seq_len,
                              int64_t max_tokens, mmoe_error *err)
{
    if (max_tokens < 1)
        return mmoe_error_set(err, MMOE_ERANGE, "gpu forward: max_tokens %lld must be >= 1", (long long)max_tokens);
    g->max_seq_len = max_seq_len > 0 ? max_seq_len : s->max_seq_len;
    if (g->max_seq_len < 1)
        return mmoe_error_set(err, MMOE_ERANGE, "gpu forward: max_seq_len %lld must be >= 1", (long long)g->max_seq_len);
    if (s->hc > 8)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu forward: hc_mult %lld > 8", (long long)s->hc);
    for (int L = 0; L < s->n_blocks; L++) {
        const gfw_attn_dims *a = &s->blocks[L].a;
        if (a->d > 8 * 128 || (a->ratio == 4 && a->id > 1024) || s->blocks[L].moe.topk > 32)
            return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                                  "gpu forward: block %d: head_dim %d (<= 1024), index_head_dim %d (<= 1024), topk %lld (<= 32)",
                                  L, a->d, a->id, (long long)s->blocks[L].moe.topk);
        if (part && (part->first < 0 || part->n_local < 1 || part->first + part->n_local > s->blocks[L].moe.n_experts))
            return mmoe_error_set(err, MMOE_EINVAL, "gpu forward: block %d: experts [%lld, %lld) of a rank, the layer has %lld",
                                  L, (long long)part->first, (long long)(part->first + part->n_local),
                                  (long long)s->blocks[L].moe.n_experts);
        const gfw_moe *mo = &s->blocks[L].moe;
        const int64_t held = experts_held(part, mo->n_experts);
        const char *why = gfw_moe_unsupported(s->D, mo->inter, mo->shared_width, mo->shared_block, held,
                                              max_tokens * (mo->topk + 1));
        if (why)
            return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                                  "gpu forward: block %d: MoE width %lld, intermediate %lld, shared %lld (block %d), "
                                  "%lld experts held, max_tokens %lld: %s",
                                  L, (long long)s->D, (long long)mo->inter, (long long)mo->shared_width,
                                  mo->shared_block, (long long)held, (long long)max_tokens, why);
    }
    if (part) {
        g->has_part = 1;
        g->part = *part;
    }
    g->Tm = max_tokens;
    g->D = s->D;
    g->V = s->V;
    g->hc = s->hc;
    g->n_layers = s->n_layers;
    g->n_blocks = s->n_blocks;
    g->iters = s->sinkhorn_iters;
    g->has_mtp = s->has_mtp;
    g->eps = s->norm_eps;
    g->hc_eps = s->hc_eps;
    g->blocks = (gblock *)calloc((size_t)s->n_blocks, sizeof(gblock));
    if (!g->blocks)
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of memory");
    return MMOE_OK;
}

/** Does a device exist? */
static mmoe_status need_device(mmoe_error *err)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess || n < 1)
        return mmoe_error_set(err, MMOE_ENODEV, "gpu forward: no CUDA device (%s)",
                              ce != cudaSuccess ? cudaGetErrorString(ce) : "none found");
    return MMOE_OK;
}

extern "C" mmoe_status mmoe_gpu_model_bytes_needed(const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                                   mmoe_gpu_model_bytes *out, mmoe_error *err)
{
    return gfw_model_bytes_part(m, NULL, max_seq_len, max_tokens, out, err);
}

extern "C" mmoe_status gfw_model_bytes_part(const mmoe_model *m, const gfw_ep_part *part, int64_t max_seq_len,
                                            int64_t max_tokens, mmoe_gpu_model_bytes *out, mmoe_error *err)
{
    memset(out, 0, sizeof *out);
    mmoe_status st = need_device(err);
    if (st != MMOE_OK)
        return st;
    gfw_model_src s;
    if ((st = gfw_model_src_build(m, &s, err)) != MMOE_OK)
        return st;
    mmoe_gpu_model g;
    memset(&g, 0, sizeof g);
    g.plan = 1;
    if ((st = model_init(&g, &s, part, max_seq_len, max_tokens, err)) == MMOE_OK) {
        int oom = 0;
        build(&g, &s, &oom);
        g.bytes.total = g.bytes.weights + g.bytes.caches + g.bytes.work;
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
            g.bytes.free_now = fr;
        *out = g.bytes;
    }
    free(g.blocks);
    gfw_model_src_free(&s);
    return st;
}

/** The table of gfw_expf(): bits of the double nearest 2^(i/32), minus i << 47. */
static void exp_table(unsigned long long *tab)
{
    for (int i = 0; i < 32; i++) {
        const double v = (double)exp2l((long double)i / 32.0L);
        unsigned long long u;
        memcpy(&u, &v, sizeof u);
        tab[i] = u - ((unsigned long long)i << 47);
    }
}

/** The staged-x dense FP8 linear's shared memory limit (gpu_linear_dense_f8_rows.cuh, included below). */
static cudaError_t dense_f8_rows_allow_smem(void);

/**
 * Upload the E4M3 and exp tables to constant memory; allow k_linear_fp8_128_split,
 * k_linear_dense_f8_rows and k_linear_fp8_tc their shared memory.
 */
static cudaError_t upload_tables(void)
{
    unsigned long long tab[32];
    exp_table(tab);
    cudaError_t ce = cudaMemcpyToSymbol(c_exp2_tab, tab, sizeof tab);
    if (ce == cudaSuccess)
        ce = cudaMemcpyToSymbol(c_e4m3, mmoe_fp8_e4m3_table(), sizeof(float) * 256);
    if (ce == cudaSuccess)
        ce = gfw_moe_upload_tables(tab);
    /* the x row of k_linear_fp8_128_split may exceed the default 48 KiB (both instances) */
    for (int nan_free = 0; nan_free < 2 && ce == cudaSuccess; nan_free++)
        ce = cudaFuncSetAttribute(fp8_split_kernel(nan_free), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GFW_FP8_SMEM_MAX);
    if (ce == cudaSuccess)
        ce = dense_f8_rows_allow_smem();
    if (ce == cudaSuccess)
        ce = tc_allow_smem();
    if (ce == cudaSuccess) /* k_attend_one's rows */
        ce = cudaFuncSetAttribute(k_attend_one, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GFW_ATTEND_ONE_SMEM);
    return ce;
}

extern "C" mmoe_status mmoe_gpu_model_create(const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                             mmoe_gpu_model **out, mmoe_error *err)
{
    return gfw_model_create_part(m, NULL, max_seq_len, max_tokens, out, err);
}

/** The model's stream, the step record's pinned host copy and the device's multiprocessor count. */
static cudaError_t create_stream_and_step(mmoe_gpu_model *g)
{
    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce == cudaSuccess)
        ce = cudaDeviceGetAttribute(&g->n_sm, cudaDevAttrMultiProcessorCount, dev);
    /* a blocking stream: the expert-parallel exchange's copies on the legacy stream stay ordered with it */
    if (ce == cudaSuccess)
        ce = cudaStreamCreate(&g->stream);
    if (ce == cudaSuccess)
        ce = cudaStreamCreate(&g->side);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&g->moe_fork, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&g->moe_join, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&g->hc_fork, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaEventCreateWithFlags(&g->hc_join, cudaEventDisableTiming);
    if (ce == cudaSuccess)
        ce = cudaHostAlloc((void **)&g->step_host, sizeof(int64_t) + sizeof(int32_t) * (size_t)g->Tm,
                           cudaHostAllocDefault);
    return ce;
}

extern "C" mmoe_status gfw_model_create_part(const mmoe_model *m, const gfw_ep_part *part, int64_t max_seq_len,
                                             int64_t max_tokens, mmoe_gpu_model **out, mmoe_error *err)
{
    *out = NULL;
    /* MMOE_GPU_GRAPH: read for a whole model (a rank of an expert-parallel forward stays eager); unset is off */
    mmoe_gpu_graph_setting graph_env = MMOE_GPU_GRAPH_UNSET;
    mmoe_status st = part ? MMOE_OK : mmoe_gpu_graph_env(&graph_env, err);
    if (st != MMOE_OK)
        return st;
    const int graph_on = graph_env == MMOE_GPU_GRAPH_ON;
    mmoe_gpu_fp8_linears fp8_linears = MMOE_GPU_FP8_LINEARS_EXACT;
    if ((st = mmoe_gpu_fp8_linears_env(&fp8_linears, err)) != MMOE_OK)
        return st;
    if (fp8_linears == MMOE_GPU_FP8_LINEARS_TC && (st = tc_device_check(err)) != MMOE_OK)
        return st;
    mmoe_gpu_model_bytes need;
    st = gfw_model_bytes_part(m, part, max_seq_len, max_tokens, &need, err);
    if (st != MMOE_OK)
        return st;
    const size_t margin = (size_t)256 << 20; /* the CUDA context and allocator slack */
    if (need.total + margin > need.free_now)
        return mmoe_error_set(err, MMOE_ENOMEM,
                              "gpu forward: the model needs %zu bytes on the GPU (weights %zu, caches %zu for %lld "
                              "positions, work %zu for %lld tokens, + %zu reserve), %zu are available",
                              need.total + margin, need.weights, need.caches,
                              (long long)(max_seq_len > 0 ? max_seq_len : mmoe_model_config(m)->max_seq_len), need.work,
                              (long long)max_tokens, margin, need.free_now);
    gfw_model_src s;
    if ((st = gfw_model_src_build(m, &s, err)) != MMOE_OK)
        return st;
    mmoe_gpu_model *g = (mmoe_gpu_model *)calloc(1, sizeof *g);
    if (!g) {
        gfw_model_src_free(&s);
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of memory");
    }
    if ((st = model_init(g, &s, part, max_seq_len, max_tokens, err)) != MMOE_OK) {
        gfw_model_src_free(&s);
        mmoe_gpu_model_destroy(g);
        return st;
    }
    g->attn_s = (double *)calloc((size_t)g->n_blocks, sizeof(double));
    g->moe_s = (double *)calloc((size_t)g->n_blocks, sizeof(double));
    g->mhc_s = (double *)calloc((size_t)g->n_blocks, sizeof(double));
    cudaError_t ce = upload_tables();
    int oom = 0;
    if (ce == cudaSuccess)
        ce = create_stream_and_step(g);
    if (ce == cudaSuccess)
        ce = build(g, &s, &oom);
    g->graph_on = graph_on;
    g->fp8_linears = fp8_linears;
    g->bytes.total = g->bytes.weights + g->bytes.caches + g->bytes.work;
    gfw_model_src_free(&s);
    if (oom || !g->attn_s || !g->moe_s || !g->mhc_s)
        st = mmoe_error_set(err, MMOE_ENOMEM, "gpu forward: out of host memory");
    else if (ce != cudaSuccess)
        st = cuda_fail(err, ce, "upload");
    if (st == MMOE_OK)
        st = mmoe_gpu_model_reset(g, err);
    if (st != MMOE_OK) {
        mmoe_gpu_model_destroy(g);
        return st;
    }
    *out = g;
    return MMOE_OK;
}

extern "C" void mmoe_gpu_model_destroy(mmoe_gpu_model *g)
{
    if (!g)
        return;
    if (g->graph_exec)
        cudaGraphExecDestroy(g->graph_exec);
    if (g->stream)
        cudaStreamSynchronize(g->stream);
    free_all(g);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    if (g->side)
        cudaStreamDestroy(g->side);
    if (g->moe_fork)
        cudaEventDestroy(g->moe_fork);
    if (g->moe_join)
        cudaEventDestroy(g->moe_join);
    if (g->hc_fork)
        cudaEventDestroy(g->hc_fork);
    if (g->hc_join)
        cudaEventDestroy(g->hc_join);
    if (g->step_host)
        cudaFreeHost(g->step_host);
    free(g->obs_in);
    free(g->obs_out);
    free(g->blocks);
    free(g->attn_s);
    free(g->moe_s);
    free(g->mhc_s);
    free(g);
}

/** Fill @p n floats with @p v. */
__global__ void k_fill(float *p, size_t n, float v)
{
    gfw_pdl_enter();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = v;
}

/** Blocks of 256 threads covering @p n. */
static unsigned nblk(int64_t n, int bs = 256) { return (unsigned)((n + bs - 1) / bs); }

/**
 * Blocks of 256 threads of k_indexer_scores for @p pairs (token, block) scores, at most @p cap:
 * a block per pair (its block mode) when they fit under the cap, else a warp per pair (capped).
 */
static unsigned indexer_scores_grid(int64_t pairs, unsigned cap)
{
    if (pairs <= (int64_t)cap)
        return (unsigned)(pairs > 0 ? pairs : 1);
    return nblk(pairs * 32) < cap ? nblk(pairs * 32) : cap;
}

/**
 * hc_pre (n_out = (2+hc)*hc, with post and comb) or hc_head (n_out = hc) of T tokens: the block
 * sums into @p part, then the logits, Sinkhorn and the mix.
 */
static void launch_hc_mix(const uint16_t *X, int64_t D, int hc, int64_t T, const float *fn, const float *base,
                          const float *scale, int n_out, float norm_eps, float hc_eps, int iters, double *part,
                          uint16_t *y, float *post, float *comb, cudaStream_t st)
{
    const int64_t n = (int64_t)hc * D;
    const int S = hc_part_blocks(n);
    mmoe_launch_pdl(k_hc_part, dim3((unsigned)S, (unsigned)(n_out + 1), (unsigned)T), GFW_HC_PART_CHUNKS, 0, st, X, n,
                    fn, n_out, part);
    mmoe_launch_pdl(k_hc_finish_split, dim3(nblk(D) + (n_out > hc), (unsigned)T), 256, 0, st, X, D, hc, part, S, base,
                    scale, n_out, norm_eps, hc_eps, iters, y, post, comb);
}

/**
 * Whether k_hc_pre_norm serves an mHC of width @p D and @p hc streams with the norm after it
 * (one chunk of 16 channels per thread, whole 128-blocks for the quantization).
 */
static bool hc_pre_norm_serves(int hc, int64_t D)
{
    return hc == GFW_HC_FUSED_HC && D % 128 == 0 && D <= (int64_t)MMOE_SUM_CHUNK * GFW_HC_PART_CHUNKS;
}

/**
 * Whether the forward takes k_hc_pre_norm for @p T tokens (n_out + 1 reductions): where it
 * serves the width and its grid fits one wave on @p n_sm multiprocessors (the decode steps).
 * Longer calls take launch_hc_mix() and the norm's own kernel, the same bits: there the one
 * finishing block per token, holding its chunk in registers, would leave the sums' many blocks
 * fewer places to run.
 */
static bool hc_pre_norm_fits(int hc, int64_t D, int64_t T, int n_out, int n_sm)
{
    return hc_pre_norm_serves(hc, D) &&
           (int64_t)hc_part_blocks(hc * D) * (n_out + 1) * T <= (int64_t)GFW_HC_FUSED_BLOCKS_PER_SM * n_sm;
}

/** k_hc_pre_norm for T tokens of @p a on stream @p st: S x (n_out + 1) blocks per token. */
static void launch_hc_pre_norm(const hc_pre_norm_args &a, int64_t T, cudaStream_t st)
{
    const int S = hc_part_blocks(GFW_HC_FUSED_HC * a.D);
    mmoe_launch_pdl(k_hc_pre_norm, dim3((unsigned)S, (unsigned)(a.n_out + 1), (unsigned)T), GFW_HC_FUSED_THREADS, 0,
                    st, a);
}

/**
 * k_hc_sinkhorn for T tokens on stream @p st (a plain launch: its stream's dependency crosses
 * streams), one warp a token; the launch's error.
 */
static cudaError_t launch_hc_sinkhorn(const float *logit, const float *base, const float *scale, float hc_eps,
                                      int iters, float *comb, int64_t T, cudaStream_t st)
{
    const cudaError_t ce = mmoe_launch_ex(false, k_hc_sinkhorn, dim3((unsigned)T), 32, 0, st, logit, base, scale,
                                          hc_eps, iters, comb);
    return ce == cudaSuccess ? cudaGetLastError() : ce;
}

/** k_hc_post for T tokens on stream @p st: a row of blocks per token. */
static void launch_hc_post(const uint16_t *out, uint16_t *X, int64_t T, int64_t D, int hc, const float *post,
                           const float *comb, cudaStream_t st)
{
    mmoe_launch_pdl(k_hc_post, dim3(nblk(D), (unsigned)T), 256, 0, st, out, X, D, hc, post, comb);
}

/**
 * The indexer's top-k of T tokens at positions *pos_dev.. (scores [T, max_blocks]): k_topk_split
 * (TOPK_PER_BLOCK candidates a block, enough blocks for @p n_most candidates: the call's last
 * token's count when launched alone, max_blocks in a captured step, whose blocks past the live
 * count exit at once).
 */
static void launch_topk(const float *scores, int64_t T, const int64_t *pos_dev, int64_t n_most, int64_t max_blocks,
                        int topk, int32_t *idx, cudaStream_t st)
{
    if (n_most > 0)
        mmoe_launch_pdl(k_topk_split, dim3((unsigned)((n_most + TOPK_PER_BLOCK - 1) / TOPK_PER_BLOCK), (unsigned)T),
                        TOPK_THREADS, 0, st, scores, pos_dev, max_blocks, topk, idx);
}

/**
 * The indexer queries of T tokens (qi [T, ih, id], wi [T, ih]; cs the layer's RoPE table):
 * k_indexer_q_split (one warp per head; id a power of two in [32, 1024], as the model's
 * parameters require; @p fp4 0: stop after the Hadamard).
 */
static void launch_indexer_q(uint16_t *qi, int64_t T, int ih, int id, int rope_dim, const float *cs,
                             const int64_t *pos_dev, uint16_t *wi, float w_scale, cudaStream_t st, int fp4 = 1)
{
    const dim3 grid((unsigned)((ih + GFW_IDXQ_WARPS - 1) / GFW_IDXQ_WARPS), (unsigned)T);
    const unsigned threads = GFW_IDXQ_WARPS * 32;
    void (*kernel)(uint16_t *, int, int, const float *, const int64_t *, uint16_t *, float, int);
    switch (id) {
    case 32: kernel = k_indexer_q_split<1>; break;
    case 64: kernel = k_indexer_q_split<2>; break;
    case 128: kernel = k_indexer_q_split<4>; break;
    case 256: kernel = k_indexer_q_split<8>; break;
    case 512: kernel = k_indexer_q_split<16>; break;
    default: kernel = k_indexer_q_split<32>; break; /* 1024: the parameters admit no other width */
    }
    mmoe_launch_pdl(kernel, grid, threads, 0, st, qi, ih, rope_dim, cs, pos_dev, wi, w_scale, fp4);
}

extern "C" mmoe_status mmoe_gpu_model_reset(mmoe_gpu_model *g, mmoe_error *err)
{
    for (int L = 0; L < g->n_blocks; L++) {
        gblock *d = &g->blocks[L];
        if (d->c_kv) {
            mmoe_launch_pdl(k_fill, nblk((int64_t)d->c_state_n), 256, 0, g->stream, d->c_kv, d->c_state_n, 0.0f);
            mmoe_launch_pdl(k_fill, nblk((int64_t)d->c_state_n), 256, 0, g->stream, d->c_score, d->c_state_n,
                            -INFINITY);
        }
        if (d->i_kv) {
            mmoe_launch_pdl(k_fill, nblk((int64_t)d->i_state_n), 256, 0, g->stream, d->i_kv, d->i_state_n, 0.0f);
            mmoe_launch_pdl(k_fill, nblk((int64_t)d->i_state_n), 256, 0, g->stream, d->i_score, d->i_state_n,
                            -INFINITY);
        }
        g->attn_s[L] = g->moe_s[L] = g->mhc_s[L] = 0.0;
    }
    g->pos = g->mtp_pos = 0;
    g->embed_s = g->head_s = 0.0;
    cudaError_t ce = cudaGetLastError();
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(g->stream);
    return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, "reset");
}

extern "C" int64_t mmoe_gpu_model_pos(const mmoe_gpu_model *g) { return g->pos; }
extern "C" int64_t mmoe_gpu_model_max_seq_len(const mmoe_gpu_model *g) { return g->max_seq_len; }
extern "C" void mmoe_gpu_model_bytes_held(const mmoe_gpu_model *g, mmoe_gpu_model_bytes *out) { *out = g->bytes; }
extern "C" void mmoe_gpu_model_set_timing(mmoe_gpu_model *g, int on) { g->timing = on; }

extern "C" mmoe_status mmoe_gpu_model_set_cuda_graph(mmoe_gpu_model *g, int on, mmoe_error *err)
{
    if (on && g->has_part)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "cuda graph: a rank of the expert-parallel forward exchanges rows through the host "
                              "inside each MoE sub-layer; its steps run kernel by kernel");
    g->graph_on = on != 0;
    return MMOE_OK;
}

extern "C" mmoe_status mmoe_gpu_model_set_fp8_linears(mmoe_gpu_model *g, mmoe_gpu_fp8_linears r, mmoe_error *err)
{
    if (r != MMOE_GPU_FP8_LINEARS_EXACT && r != MMOE_GPU_FP8_LINEARS_TC)
        return mmoe_error_set(err, MMOE_EINVAL, "fp8 linears: recipe %d is neither exact nor tc", (int)r);
    if (r == MMOE_GPU_FP8_LINEARS_TC) {
        const mmoe_status st = tc_device_check(err);
        if (st != MMOE_OK)
            return st;
    }
    if (r != g->fp8_linears && g->graph_exec != NULL) { /* the graph holds the other recipe's kernels */
        cudaGraphExecDestroy(g->graph_exec);
        g->graph_exec = NULL;
    }
    g->fp8_linears = r;
    return MMOE_OK;
}

extern "C" mmoe_gpu_fp8_linears mmoe_gpu_model_fp8_linears(const mmoe_gpu_model *g) { return g->fp8_linears; }

extern "C" void mmoe_gpu_model_graph_stats(const mmoe_gpu_model *g, mmoe_gpu_graph_stats *out)
{
    out->enabled = g->graph_on;
    out->captures = g->graph_captures;
    out->replays = g->graph_replays;
    out->eager_calls = g->eager_calls;
}

extern "C" void mmoe_gpu_model_timings_get(const mmoe_gpu_model *g, mmoe_gpu_model_timings *out)
{
    out->n_layers = g->n_blocks;
    out->attn_s = g->attn_s;
    out->moe_s = g->moe_s;
    out->mhc_s = g->mhc_s;
    out->embed_s = g->embed_s;
    out->head_s = g->head_s;
}

/* ================================================================== host side: the forward */

/** Check the last launch; on error set @p err naming @p what. */
#define GFW_CHECK(what)                                                                                                \
    do {                                                                                                               \
        cudaError_t ce_ = cudaGetLastError();                                                                          \
        if (ce_ != cudaSuccess)                                                                                        \
            return cuda_fail(err, ce_, what);                                                                          \
    } while (0)

/** Wall clock (seconds) after the device has finished, when timing is on. */
static double tick(const mmoe_gpu_model *g)
{
    if (!g->timing)
        return 0.0;
    cudaDeviceSynchronize();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/**
 * Most threads of k_rmsnorm, hence the widest row (512 chunks of 16) its register path takes:
 * with more than 64 registers a thread (66 to 74 on sm_90a), 1024 would not fit in a block's 64 K.
 */
#define GFW_RMSNORM_MAX_THREADS 512

/**
 * Threads of k_rmsnorm for rows of width @p n: one per chunk of 16 (a power of two, 32 to
 * GFW_RMSNORM_MAX_THREADS), 256 for rows of more chunks (the strided loop).
 */
static unsigned rmsnorm_threads(int64_t n)
{
    const int64_t chunks = (n + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK;
    unsigned b = 32;
    while (b < chunks && b < GFW_RMSNORM_MAX_THREADS)
        b <<= 1;
    return chunks > GFW_RMSNORM_MAX_THREADS ? 256 : b;
}

/**
 * Whether k_rmsnorm takes its register path for rows of width @p n and can quantize them on the
 * way (n a multiple of 128, at most GFW_RMSNORM_MAX_THREADS chunks of 16).
 */
static bool rmsnorm_quantizes(int64_t n)
{
    return n % 128 == 0 && (n + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK <= GFW_RMSNORM_MAX_THREADS;
}

/** y = rmsnorm(x) for @p rows rows of width n. */
static mmoe_status rmsnorm(const uint16_t *x, int64_t rows, int64_t n, const ddense &w, float eps, uint16_t *y,
                           cudaStream_t st, mmoe_error *err)
{
    mmoe_launch_pdl(k_rmsnorm, (unsigned)rows, rmsnorm_threads(n), 0, st, x, n, w, eps, y, nullptr, nullptr, nullptr,
                    nullptr);
    GFW_CHECK("rmsnorm");
    return MMOE_OK;
}

/** Quantize @p rows rows of width K of @p x into g->aq, g->as (the input of the next FP8 linears). */
static mmoe_status act_quant(mmoe_gpu_model *g, const uint16_t *x, int64_t rows, int64_t K, mmoe_error *err)
{
    mmoe_launch_pdl(k_act_quant, dim3((unsigned)(K / 128), (unsigned)rows), 128, 0, g->stream, x, K, g->aq, g->as);
    GFW_CHECK("activation quantization");
    return MMOE_OK;
}

/**
 * y = rmsnorm(x) for @p rows rows of width n, and y quantized into g->aq, g->as as act_quant()
 * does: in the norm's own kernel when its register path applies (n a multiple of 128, at most
 * GFW_RMSNORM_MAX_THREADS chunks of 16), else rmsnorm() then act_quant(); the same bits either way.
 */
static mmoe_status rmsnorm_quant(mmoe_gpu_model *g, const uint16_t *x, int64_t rows, int64_t n, const ddense &w,
                                 float eps, uint16_t *y, mmoe_error *err)
{
    if (!rmsnorm_quantizes(n)) {
        mmoe_status st = rmsnorm(x, rows, n, w, eps, y, g->stream, err);
        return st == MMOE_OK ? act_quant(g, y, rows, n, err) : st;
    }
    mmoe_launch_pdl(k_rmsnorm, (unsigned)rows, rmsnorm_threads(n), 0, g->stream, x, n, w, eps, y, g->aq, g->as, nullptr,
                    nullptr);
    GFW_CHECK("rmsnorm and activation quantization");
    return MMOE_OK;
}

/**
 * y = rmsnorm(x) for @p rows rows of width n, the norm before the MoE: where the norm's kernel
 * can quantize (rmsnorm_quantizes()), it also writes the MoE's inputs as k_moe_in would (into
 * the MoE's work buffers: @p staged is then 1, and the MoE sub-layer skips k_moe_in); else
 * rmsnorm() alone (@p staged 0).  The same bits either way.
 */
static mmoe_status rmsnorm_moe_in(mmoe_gpu_model *g, const uint16_t *x, int64_t rows, int64_t n, const ddense &w,
                                  float eps, uint16_t *y, int *staged, mmoe_error *err)
{
    *staged = rmsnorm_quantizes(n);
    if (!*staged)
        return rmsnorm(x, rows, n, w, eps, y, g->stream, err);
    mmoe_launch_pdl(k_rmsnorm, (unsigned)rows, rmsnorm_threads(n), 0, g->stream, x, n, w, eps, y, nullptr, nullptr,
                    g->moe_work.xb, g->moe_x);
    GFW_CHECK("rmsnorm and the moe input");
    return MMOE_OK;
}

/**
 * The `tc` recipe's launch of the linear(s) of the rows in g->aq, g->as (launch_linear_fp8_tc())
 * where @p g has chosen that recipe and the kernel serves the call: true; else nothing is
 * launched and the caller runs the exact kernels.
 */
static bool linear_fp8_tc_chosen(mmoe_gpu_model *g, int64_t rows, const dfp8 &w0, uint16_t *y0, const fp8_hc_post &p0,
                                 const dfp8 *w1, uint16_t *y1, cudaStream_t st)
{
    return g->fp8_linears == MMOE_GPU_FP8_LINEARS_TC &&
           launch_linear_fp8_tc(g->aq, g->as, rows, w0, y0, p0, w1, y1, g->tc_ws, g->n_sm, st);
}

/** y = fp8_linear of the rows act_quant() left in g->aq, g->as (width w.K). */
static mmoe_status linear_fp8_quantized(mmoe_gpu_model *g, int64_t rows, const dfp8 &w, uint16_t *y,
                                        mmoe_error *err)
{
    if (!linear_fp8_tc_chosen(g, rows, w, y, fp8_no_hc_post(), NULL, NULL, g->stream))
        launch_linear_fp8(g->aq, g->as, rows, w, y, g->n_sm, g->stream);
    GFW_CHECK("fp8 linear");
    return MMOE_OK;
}

/** y0 = fp8_linear with @p w0 and y1 = fp8_linear with @p w1 of the rows in g->aq, g->as (launch_linear_fp8_pair()). */
static mmoe_status linear_fp8_quantized_pair(mmoe_gpu_model *g, int64_t rows, const dfp8 &w0, uint16_t *y0,
                                             const dfp8 &w1, uint16_t *y1, mmoe_error *err)
{
    if (!linear_fp8_tc_chosen(g, rows, w0, y0, fp8_no_hc_post(), &w1, y1, g->stream))
        launch_linear_fp8_pair(g->aq, g->as, rows, w0, y0, w1, y1, g->n_sm, g->stream);
    GFW_CHECK("fp8 linears");
    return MMOE_OK;
}

/** y = fp8_linear(x) for @p rows rows. */
static mmoe_status linear_fp8(mmoe_gpu_model *g, const uint16_t *x, int64_t rows, const dfp8 &w, uint16_t *y,
                              mmoe_error *err)
{
    mmoe_status st = act_quant(g, x, rows, w.K, err);
    return st == MMOE_OK ? linear_fp8_quantized(g, rows, w, y, err) : st;
}

/* The many-token dense linear (its own chapter), which needs the dense-sum helpers above. */
#include "gpu_linear_dense_tokens.cuh"
/* The few-token dense linear of an FP8 weight (its own chapter). */
#include "gpu_linear_dense_f8_rows.cuh"

/**
 * Launch the dense linears of set @p s on x rows [rows, ldx] (width K; grouped as in
 * k_linear_dense_split): k_linear_dense_tokens from GFW_DENSE_TT_MIN_T rows on where
 * dense_tokens_fit() holds, else k_linear_dense_split, one warp per output (same bits).
 */
static void launch_linear_dense(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const dense_set &s,
                                int64_t group_rows, int64_t group_width, cudaStream_t st)
{
    if (dense_tokens_fit(x, rows, ldx, K, s, group_rows, group_width)) {
        launch_linear_dense_tokens(x, rows, ldx, K, s, group_rows, group_width, st);
        return;
    }
    if (dense_f8_rows_fit(x, rows, ldx, K, s, group_rows, group_width)) {
        launch_linear_dense_f8_rows(x, rows, ldx, K, s, group_rows, group_width, st);
        return;
    }
    int64_t outputs = 0;
    for (int j = 0; j < s.n; j++)
        outputs += rows * s.N[j];
    mmoe_launch_pdl(k_linear_dense_split, (unsigned)((outputs + GFW_DENSE_WARPS - 1) / GFW_DENSE_WARPS),
                    GFW_DENSE_WARPS * 32, 0, st, x, rows, ldx, K, s, group_rows, group_width);
}

/** Dense linear. */
static mmoe_status linear_dense(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const ddense &w, int64_t N,
                                int64_t group_rows, int64_t group_width, float *yf, uint16_t *yb, cudaStream_t st,
                                mmoe_error *err)
{
    dense_set s;
    memset(&s, 0, sizeof s);
    s.w[0] = w, s.N[0] = N, s.yf[0] = yf, s.yb[0] = yb, s.n = 1;
    launch_linear_dense(x, rows, ldx, K, s, group_rows, group_width, st);
    GFW_CHECK("dense linear");
    return MMOE_OK;
}

/** Add linear w (N outputs) to a dense set. */
static void dense_add(dense_set *s, const ddense &w, int64_t N, float *yf, uint16_t *yb)
{
    s->w[s->n] = w, s->N[s->n] = N, s->yf[s->n] = yf, s->yb[s->n] = yb;
    s->n++;
}

/** The dense linears of a set on the same input x [rows, K] in one launch. */
static mmoe_status linear_dense_set(const uint16_t *x, int64_t rows, int64_t K, const dense_set &s, cudaStream_t st,
                                    mmoe_error *err)
{
    launch_linear_dense(x, rows, K, K, s, 0, 0, st);
    GFW_CHECK("dense linears");
    return MMOE_OK;
}

/** Threads of k_compress for rows of dh values: one per channel (a power of two, 256 to GFW_COMP_MAX_THREADS). */
static unsigned compress_threads(int64_t dh)
{
    unsigned b = 256;
    while (b < dh && b < GFW_COMP_MAX_THREADS)
        b <<= 1;
    return b;
}

/**
 * Whether a sub-layer's Sinkhorn runs apart from its k_hc_pre_norm: a one-token call on one
 * GPU.  Its iterations are a chain of about 40 dependent shuffles, sums and divisions
 * (sinkhorn_warp()), which in k_hc_pre_norm's last block outlast the mix and the norm, and
 * the kernel after it waits for the whole kernel; but comb is read only by the sub-layer's
 * hc_post.  So k_hc_pre_norm leaves the logits in g->comb_logits, k_hc_sinkhorn runs the
 * iterations on g->side (sinkhorn_fork(), sinkhorn_launch()), and g->stream waits for it just
 * before the hc_post (sinkhorn_join()): in the attention before the output projection that
 * does the hc_post, in the MoE after the shared expert's branch on the same side stream.
 */
static bool sinkhorn_side(const mmoe_gpu_model *g, int64_t T, bool fused)
{
    return T == 1 && fused && !g->has_part;
}

/** g->side waits for what g->stream has queued (the sub-layer's k_hc_pre_norm). */
static cudaError_t sinkhorn_fork(mmoe_gpu_model *g)
{
    cudaError_t ce = cudaEventRecord(g->hc_fork, g->stream);
    return ce == cudaSuccess ? cudaStreamWaitEvent(g->side, g->hc_fork, 0) : ce;
}

/** k_hc_sinkhorn of T tokens on g->side (mHC parameters @p base, @p scale), then g->hc_join recorded there. */
static cudaError_t sinkhorn_launch(mmoe_gpu_model *g, int64_t T, const float *base, const float *scale)
{
    cudaError_t ce = launch_hc_sinkhorn(g->comb_logits, base, scale, g->hc_eps, g->iters, g->comb, T, g->side);
    return ce == cudaSuccess ? cudaEventRecord(g->hc_join, g->side) : ce;
}

/** g->stream waits for k_hc_sinkhorn (everything after this reads comb). */
static cudaError_t sinkhorn_join(mmoe_gpu_model *g)
{
    return cudaStreamWaitEvent(g->stream, g->hc_join, 0);
}

/**
 * The attention sub-layer on g->y (attn_norm output), result in g->o.  The kernels read the
 * call's first position from the step record (g->step); @p pos0, its value, only sizes the
 * indexer scores' grid when the step is launched eagerly (a captured step sizes it for
 * max_blocks).  @p y_quantized: g->aq, g->as already hold g->y quantized (the layer's
 * rmsnorm_quant()); else the sub-layer quantizes it first.  @p post_done: NULL, or set to 1 when
 * the output projection also did the hc_post after the sub-layer on g->X
 * (launch_linear_fp8_hc_post()), else 0.  @p comb_apart: comb comes from k_hc_sinkhorn on
 * g->side (sinkhorn_side()), which g->stream waits for before the output projection.
 */
static mmoe_status attention(mmoe_gpu_model *g, gblock *b, int64_t pos0, int64_t T, int y_quantized,
                             int *post_done, mmoe_error *err, bool comb_apart = false)
{
    const gfw_attn_dims &a = b->a;
    const int64_t D = g->D, d = a.d, H = a.H, ih = a.ih, id = a.id;
    const cudaStream_t sm = g->stream;
    const int64_t *pos_dev = g->step;
    mmoe_status st;
    /* projections */
    /* x quantized once for wq_a and wkv, q_r once for wq_b and the indexer's wq_b */
    if ((!y_quantized && (st = act_quant(g, g->y, T, a.D, err)) != MMOE_OK) ||
        (st = linear_fp8_quantized_pair(g, T, b->wq_a, g->qr, b->wkv, g->kv, err)) != MMOE_OK ||
        (st = rmsnorm_quant(g, g->qr, T, a.q_lora, b->q_norm, a.eps, g->qr, err)) != MMOE_OK ||
        (a.ratio == 4 ? (st = linear_fp8_quantized_pair(g, T, b->wq_b, g->q, b->idx_wq_b, g->qi, err))
                      : (st = linear_fp8_quantized(g, T, b->wq_b, g->q, err))) != MMOE_OK)
        return st;
    const unsigned q_blocks = nblk(T * H * 32);
    const bool ring_early = T == 1; /* k_q_kv_finish stores the window row (see there) */
    mmoe_launch_pdl(k_q_kv_finish, q_blocks + (unsigned)T, 256, 0, sm, g->q, T * H, d, a.eps, H, (int64_t)q_blocks,
                    g->kv, b->kv_norm, a.eps, a.rope_dim, b->cs, pos_dev, ring_early ? b->ring : nullptr, a.window);
    GFW_CHECK("q head scaling and rope; kv norm, rope and fp8 round trip");
    const int c = a.ratio == 4 ? 2 : 1;
    if (a.ratio > 0) { /* the compressors' and the indexer's dense projections of x, one launch */
        dense_set ds;
        memset(&ds, 0, sizeof ds);
        dense_add(&ds, b->c_wkv, c * d, g->ckv, NULL);
        dense_add(&ds, b->c_wgate, c * d, g->cgate, NULL);
        if (a.ratio == 4) {
            dense_add(&ds, b->idx_wp, ih, NULL, g->wi);
            dense_add(&ds, b->i_wkv, 2 * id, g->ikv, NULL);
            dense_add(&ds, b->i_wgate, 2 * id, g->igate, NULL);
        }
        if ((st = linear_dense_set(g->y, T, D, ds, sm, err)) != MMOE_OK)
            return st;
    }
    if (a.ratio == 4) {
        const float w_scale = (float)(1.0 / sqrt((double)id) * (1.0 / sqrt((double)ih)));
        launch_indexer_q(g->qi, T, (int)ih, (int)id, a.rope_dim, b->cs, pos_dev, g->wi, w_scale, sm);
        GFW_CHECK("indexer queries");
    }
    /* compressors (sequential over the call's tokens; the attention's and the indexer's side by side) */
    if (a.ratio > 0) {
        const comp_args ca = {g->ckv, g->cgate, b->c_ape, b->c_kv, b->c_score, b->c_norm, a.ratio, c, (int)d,
                              a.rope_dim, a.eps, b->cs, 0, b->comp, pos_dev, T};
        const int with_indexer = a.ratio == 4;
        comp_args ia = ca;
        if (with_indexer)
            ia = comp_args{g->ikv, g->igate, b->i_ape, b->i_kv, b->i_score, b->i_norm, 4, 2, (int)id, a.rope_dim,
                           a.eps, b->cs, 1, b->idx_keys, pos_dev, T};
        const int64_t widest = with_indexer && id > d ? id : d;
        mmoe_launch_pdl(k_compress, 1 + with_indexer, compress_threads(widest), sizeof(float) * (size_t)(2 * widest),
                        sm, ca, ia);
        GFW_CHECK(with_indexer ? "compressors" : "compressor");
    }
    if (a.ratio == 4) {
        if (b->max_blocks > 0) {
            /* warps for the causal blocks of the call's last token (scores keep the stride max_blocks);
             * a captured step cannot know them: its grid covers max_blocks, the warps past the live
             * count exit at once; either grid is capped, the warps striding over the rest */
            const int64_t live = (pos0 + T) / 4 < b->max_blocks ? (pos0 + T) / 4 : b->max_blocks;
            const int64_t nb = g->capturing ? b->max_blocks : live;
            const unsigned cap = (unsigned)(GFW_SCORES_CTAS_PER_SM * g->n_sm);
            if (nb > 0) { /* none before the first block is complete */
                const unsigned grid = indexer_scores_grid(T * nb, cap);
                mmoe_launch_pdl(k_indexer_scores, grid, 256, 0, sm, g->qi, g->wi, b->idx_keys, (int)ih, (int)id, T,
                                pos_dev, b->max_blocks, g->scores);
                GFW_CHECK("indexer scores");
            }
            launch_topk(g->scores, T, pos_dev, g->capturing ? b->max_blocks : (pos0 + T) / 4, b->max_blocks,
                        a.topk, g->topk_idx, sm);
            GFW_CHECK("indexer top-k");
        }
    }
    attend_args aa = {g->q, g->kv, b->ring, b->comp, g->topk_idx, b->sink, b->cs, (int)H, (int)d, a.window, a.ratio,
                      a.topk, a.rope_dim, pos_dev, (float)(1.0 / sqrt((double)d)), g->att};
    launch_attend(aa, T, sm);
    GFW_CHECK("attention and inverse rope");
    if (!ring_early) {
        mmoe_launch_pdl(k_ring_store, nblk((T < a.window ? T : a.window) * d), 256, 0, sm, g->kv, T, pos_dev,
                        a.window, (int)d, b->ring);
        GFW_CHECK("window store");
    }
    /* grouped output projection */
    const int64_t hd = H * d, gw = hd / a.G, gr = (int64_t)a.G * a.o_lora;
    if ((st = linear_dense(g->att, T, hd, gw, b->wo_a, gr, a.o_lora, gw, NULL, g->z, sm, err)) != MMOE_OK)
        return st;
    if ((st = act_quant(g, g->z, T, b->wo_b.K, err)) != MMOE_OK)
        return st;
    cudaError_t ce;
    if (comb_apart && (ce = sinkhorn_join(g)) != cudaSuccess)
        return cuda_fail(err, ce, "attention: the Sinkhorn's join");
    const fp8_hc_post hp = {g->X, g->post, g->comb, (int)g->hc};
    if (post_done != NULL && (*post_done = linear_fp8_tc_chosen(g, T, b->wo_b, g->o, hp, NULL, NULL, sm))) {
        GFW_CHECK("fp8 linear (tc) and hc_post");
        return MMOE_OK;
    }
    if (post_done != NULL && (*post_done = launch_linear_fp8_hc_post(g->aq, g->as, T, b->wo_b, g->o, hp, g->n_sm,
                                                                     sm))) {
        GFW_CHECK("fp8 linear and hc_post");
        return MMOE_OK;
    }
    return linear_fp8_quantized(g, T, b->wo_b, g->o, err);
}

/**
 * Whether the MoE sub-layer of block @p b runs its shared expert on g->side
 * (gfw_moe_rows_split()): a one-token call of the forward on one GPU (rows only, the router's
 * own routing) of a layer with a shared expert.  Then the shared expert's weight stream runs
 * while the router's one-block kernels (logits, top-k and plan) leave the device idle, instead
 * of after them.
 */
static bool moe_side(const mmoe_gpu_model *g, const gblock *b, int64_t T, int given, int rows_only)
{
    return T == 1 && rows_only && !given && !g->has_part && b->moe.Ws > 0;
}

/**
 * The MoE sub-layer on g->y (ffn_norm output), result in g->o (gpu_fwd_moe.cu; @p given: see
 * gfw_moe_forward()).  @p rows_only: on one GPU, stop before the combine (the slot rows in
 * g->slot_y); the caller combines in its hc_post (k_hc_post_moe), which also writes g->o.
 * @p x_staged: the ffn norm's kernel already wrote the MoE's inputs (rmsnorm_moe_in()).
 */
static mmoe_status moe(mmoe_gpu_model *g, gblock *b, const int32_t *ids_dev, int64_t T, mmoe_error *err, int given = 0,
                       int rows_only = 0, int x_staged = 0)
{
    const gfw_moe_router r = {b->gate, b->bias, b->tid2eid, b->route_scale};
    const gfw_moe_io io = {g->y, ids_dev, T, g->o, g->moe_scores, g->moe_idx, g->moe_w, g->moe_x, g->moe_h, g->slot_y,
                           g->moe_width, x_staged};
    const char *what = "moe";
    if (moe_side(g, b, T, given, rows_only)) {
        const cudaError_t ce = gfw_moe_rows_split(b->moe, r, g->moe_work, g->moe_side_work, io, g->stream, g->side,
                                                  g->moe_fork, g->moe_join, &what);
        return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, what);
    }
    if (!g->has_part) {
        const cudaError_t ce = rows_only ? gfw_moe_rows(b->moe, r, g->moe_work, io, given, g->stream, &what)
                                         : gfw_moe_forward(b->moe, r, g->moe_work, io, given, g->stream, &what);
        return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, what);
    }
    /* one rank of an expert-parallel forward: the slot rows of the pairs whose expert it holds
     * and the shared rows; the exchange brings in the other ranks' rows; then the combine of all */
    cudaError_t ce = gfw_moe_rows(b->moe, r, g->moe_work, io, given, g->stream, &what);
    if (ce != cudaSuccess)
        return cuda_fail(err, ce, what);
    const mmoe_status st = g->part.exchange(g->part.ctx, g->moe_idx, T, (int)b->moe.k, g->D, g->slot_y, err);
    if (st != MMOE_OK)
        return st;
    ce = gfw_moe_combine(b->moe, io, g->stream, &what);
    return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, what);
}

/**
 * hc_pre (@p n_out = (2+hc)*hc, with g->post and g->comb) or hc_head (n_out = hc) of T tokens
 * of @p X and the RMSNorm of the mix by @p w into g->y, in one k_hc_pre_norm launch
 * (hc_pre_norm_fits()); with @p q or @p mq also its quantizations (rmsnorm_chunk_quant()).
 * @p sinkhorn_apart (hc_pre only): the kernel leaves the Sinkhorn's logits in g->comb_logits
 * for k_hc_sinkhorn (sinkhorn_side()) instead of running the iterations.
 */
static void hc_pre_norm(mmoe_gpu_model *g, const uint16_t *X, int64_t T, const float *fn, const float *base,
                        const float *scale, int n_out, const ddense &w, uint8_t *q, float *qs, float *mb, float *mq,
                        bool sinkhorn_apart = false)
{
    const int with_post = n_out > (int)g->hc;
    const hc_pre_norm_args a = {X, g->D, fn, base, scale, n_out, with_post ? g->iters : 0, g->hc_eps, g->eps,
                                g->hc_part, g->hc_arrive, with_post ? g->post : NULL, with_post ? g->comb : NULL,
                                with_post && sinkhorn_apart ? g->comb_logits : NULL, w, g->eps, g->y, q, qs, mb, mq};
    launch_hc_pre_norm(a, T, g->stream);
}

/**
 * The hc_pre of a sub-layer on g->X (fn, base, scale: its mHC parameters): with @p fused
 * (hc_pre_norm_fits()) k_hc_pre_norm, which also writes the norm's output by @p norm into g->y
 * and the quantizations named by @p q or @p mb, and with @p sinkhorn_apart (sinkhorn_side(),
 * decided by the caller, which then launches k_hc_sinkhorn) leaves the Sinkhorn to it; else
 * launch_hc_mix() alone, the mix into g->y.
 */
static void sublayer_hc_pre(mmoe_gpu_model *g, int64_t T, const float *fn, const float *base, const float *scale,
                            bool fused, bool sinkhorn_apart, const ddense &norm, uint8_t *q, float *qs, float *mb,
                            float *mq)
{
    const int hc = (int)g->hc, n_mix = (2 + hc) * hc;
    if (fused)
        hc_pre_norm(g, g->X, T, fn, base, scale, n_mix, norm, q, qs, mb, mq, sinkhorn_apart);
    else
        launch_hc_mix(g->X, g->D, hc, T, fn, base, scale, n_mix, g->eps, g->hc_eps, g->iters, g->hc_part, g->y,
                      g->post, g->comb, g->stream);
}

/** With an observer: keep the sub-layer's input g->y [T, D] on the host before the sub-layer runs. */
static mmoe_status obs_keep_input(mmoe_gpu_model *g, int64_t T, mmoe_error *err)
{
    if (g->obs_fn == NULL)
        return MMOE_OK;
    cudaError_t ce = cudaMemcpyAsync(g->obs_in, g->y, 2 * (size_t)(T * g->D), cudaMemcpyDeviceToHost, g->stream);
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(g->stream);
    return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, "observer: sub-layer input copy");
}

/**
 * With an observer: report sub-layer @p which of block @p L, its kept input and (attention only)
 * its output g->o.
 */
static mmoe_status obs_report(mmoe_gpu_model *g, int L, mmoe_sublayer which, int64_t pos0, int64_t T,
                              mmoe_error *err)
{
    if (g->obs_fn == NULL)
        return MMOE_OK;
    const int with_out = which == MMOE_SUBLAYER_ATTENTION;
    cudaError_t ce = with_out ? cudaMemcpyAsync(g->obs_out, g->o, 2 * (size_t)(T * g->D), cudaMemcpyDeviceToHost,
                                                g->stream)
                              : cudaSuccess;
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(g->stream);
    if (ce != cudaSuccess)
        return cuda_fail(err, ce, "observer: sub-layer output copy");
    if (g->obs_fn(g->obs_ctx, L, which, pos0, T, g->obs_in, with_out ? g->obs_out : NULL) != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu forward: the observer stopped the forward after block %d's %s", L,
                              with_out ? "attention" : "MoE");
    return MMOE_OK;
}

/** One block (spec 3.2) on g->X. */
static mmoe_status run_block(mmoe_gpu_model *g, int L, const int32_t *ids_dev, int64_t pos0, int64_t T,
                             mmoe_error *err)
{
    gblock *b = &g->blocks[L];
    const int64_t D = g->D;
    const int hc = (int)g->hc, n_mix = (2 + hc) * hc;
    const bool fused = hc_pre_norm_fits(hc, D, T, n_mix, g->n_sm);
    double t0 = tick(g);
    mmoe_status st = MMOE_OK;
    int post_done = 0; /* the attention's output projection did its hc_post */
    const bool apart = sinkhorn_side(g, T, fused);
    cudaError_t ce = cudaSuccess;
    sublayer_hc_pre(g, T, b->hca_fn, b->hca_base, b->hca_scale, fused, apart, b->attn_norm, g->aq, g->as, NULL, NULL);
    GFW_CHECK("hc_pre (attention)");
    if (apart && ((ce = sinkhorn_fork(g)) != cudaSuccess || (ce = sinkhorn_launch(g, T, b->hca_base, b->hca_scale)) != cudaSuccess))
        return cuda_fail(err, ce, "the attention's Sinkhorn (side stream)");
    double t1 = tick(g);
    if (!fused)
        st = rmsnorm_quant(g, g->y, T, D, b->attn_norm, g->eps, g->y, err);
    if (st == MMOE_OK)
        st = obs_keep_input(g, T, err);
    if (st == MMOE_OK)
        st = attention(g, b, pos0, T, 1, &post_done, err, apart);
    if (st == MMOE_OK)
        st = obs_report(g, L, MMOE_SUBLAYER_ATTENTION, pos0, T, err);
    if (st != MMOE_OK)
        return st;
    double t2 = tick(g);
    if (!post_done)
        launch_hc_post(g->o, g->X, T, D, hc, g->post, g->comb, g->stream);
    sublayer_hc_pre(g, T, b->hcf_fn, b->hcf_base, b->hcf_scale, fused, apart, b->ffn_norm, NULL, NULL, g->moe_work.xb,
                    g->moe_x);
    GFW_CHECK("hc_post / hc_pre (moe)");
    if (apart && (ce = sinkhorn_fork(g)) != cudaSuccess)
        return cuda_fail(err, ce, "the MoE's Sinkhorn (side stream)");
    int staged = fused; /* k_hc_pre_norm wrote the MoE's inputs */
    double t3 = tick(g);
    if ((!fused && (st = rmsnorm_moe_in(g, g->y, T, D, b->ffn_norm, g->eps, g->y, &staged, err)) != MMOE_OK) ||
        (st = obs_keep_input(g, T, err)) != MMOE_OK || (st = moe(g, b, ids_dev, T, err, 0, 1, staged)) != MMOE_OK ||
        (st = obs_report(g, L, MMOE_SUBLAYER_MOE, pos0, T, err)) != MMOE_OK)
        return st;
    /* behind the shared expert's branch on g->side, whose join the hc_post waits for anyway */
    if (apart && ((ce = sinkhorn_launch(g, T, b->hcf_base, b->hcf_scale)) != cudaSuccess ||
                  (ce = sinkhorn_join(g)) != cudaSuccess))
        return cuda_fail(err, ce, "the MoE's Sinkhorn (side stream)");
    double t4 = tick(g);
    if (g->has_part) /* the expert-parallel rank combined after its exchange */
        launch_hc_post(g->o, g->X, T, D, hc, g->post, g->comb, g->stream);
    else /* also after a join of g->side: the join is a full dependency, the L2 before it a programmatic one */
        mmoe_launch_pdl(k_hc_post_moe, dim3(nblk(D), (unsigned)T), 256, 0, g->stream, g->slot_y, g->moe_idx, T,
                        (int)b->moe.k, b->moe.Ws > 0, g->o, g->X, D, hc, g->post, g->comb);
    GFW_CHECK("hc_post (moe)");
    double t5 = tick(g);
    g->mhc_s[L] += (t1 - t0) + (t3 - t2) + (t5 - t4);
    g->attn_s[L] += t2 - t1;
    g->moe_s[L] += t4 - t3;
    return MMOE_OK;
}

/** Head: logits of rows X[first .. first+n) into g->logits (device; the caller copies them out). */
static mmoe_status head(mmoe_gpu_model *g, const float *fn, const float *base, const float *scale, const ddense &norm,
                        int64_t first, int64_t n, mmoe_error *err)
{
    const int hc = (int)g->hc;
    const uint16_t *Xf = g->X + first * hc * g->D;
    if (hc_pre_norm_fits(hc, g->D, n, hc, g->n_sm)) {
        hc_pre_norm(g, Xf, n, fn, base, scale, hc, norm, NULL, NULL, NULL, NULL);
        GFW_CHECK("hc_head and the final norm");
    } else {
        launch_hc_mix(Xf, g->D, hc, n, fn, base, scale, hc, g->eps, g->hc_eps, 0, g->hc_part, g->y, NULL, NULL,
                      g->stream);
        GFW_CHECK("hc_head");
        mmoe_status st = rmsnorm(g->y, n, g->D, norm, g->eps, g->y, g->stream, err);
        if (st != MMOE_OK)
            return st;
    }
    ddense hw;
    memset(&hw, 0, sizeof hw);
    hw.dtype = GFW_BF16;
    hw.p = g->head_w;
    hw.rows = g->V;
    hw.cols = g->D;
    return linear_dense(g->y, n, g->D, g->D, hw, g->V, 0, 0, g->logits, NULL, g->stream, err);
}

/** Ids in range, T in range. */
static mmoe_status check_call(const mmoe_gpu_model *g, const int32_t *ids, int64_t T, int64_t pos, mmoe_error *err)
{
    if (T < 1 || T > g->Tm)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu forward: T = %lld, expected 1..%lld (the model's max_tokens)",
                              (long long)T, (long long)g->Tm);
    if (pos + T > g->max_seq_len)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu forward: positions %lld..%lld exceed the state's max_seq_len %lld",
                              (long long)pos, (long long)(pos + T - 1), (long long)g->max_seq_len);
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= g->V)
            return mmoe_error_set(err, MMOE_EINVAL, "token %lld: id %d is outside the vocabulary [0, %lld)", (long long)t,
                                  ids[t], (long long)g->V);
    return MMOE_OK;
}

/**
 * Write the step record of a call into its pinned host copy: the first position @p pos and, when
 * @p ids is given, the @p T ids.  Only between calls: every call ends with its stream
 * synchronized (finish_call()), so no copy of an earlier call still reads the host copy.
 */
static void step_write(mmoe_gpu_model *g, int64_t pos, const int32_t *ids, int64_t T)
{
    g->step_host[0] = pos;
    if (ids)
        memcpy(g->step_host + 1, ids, sizeof(int32_t) * (size_t)T);
}

/** Enqueue the copy of the step record (position and @p T ids) to the device: the first node of a call. */
static mmoe_status step_send(mmoe_gpu_model *g, int64_t T, mmoe_error *err)
{
    const cudaError_t ce = cudaMemcpyAsync(g->step, g->step_host, sizeof(int64_t) + sizeof(int32_t) * (size_t)T,
                                           cudaMemcpyHostToDevice, g->stream);
    return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, "step record copy");
}

/** k_embed of the T tokens whose ids are @p ids: X[t, j, :] = E[ids[t], :], j < hc. */
static void launch_embed(const uint16_t *E, const int32_t *ids, int64_t T, int64_t D, int hc, uint16_t *X,
                         cudaStream_t st)
{
    mmoe_launch_pdl(k_embed, dim3(nblk(D), (unsigned)T), 256, 0, st, E, ids, D, hc, X);
}

/**
 * Enqueue the main model's step of T tokens at position g->pos on the model's stream: the step
 * record's copy, the embedding and every layer (with the timing split when it is on).  The
 * same function is launched eagerly and captured into the decode graph.
 */
static mmoe_status enqueue_layers(mmoe_gpu_model *g, int64_t T, mmoe_error *err)
{
    mmoe_status st = step_send(g, T, err);
    if (st != MMOE_OK)
        return st;
    double t0 = tick(g);
    launch_embed(g->embed, g->ids, T, g->D, (int)g->hc, g->X, g->stream);
    GFW_CHECK("embedding");
    g->embed_s += tick(g) - t0;
    for (int L = 0; L < g->n_layers; L++)
        if ((st = run_block(g, L, g->ids, g->pos, T, err)) != MMOE_OK)
            return mmoe_error_prefix(err, "layer %d: ", L);
    return MMOE_OK;
}

/**
 * Capture the decode step (T = 1: enqueue_layers() and the head of its one row) into
 * g->graph_exec.  The capture is thread-local: a call that may not be captured (a synchronous
 * copy, an allocation, a wait on the device) fails the capture instead of running, and the
 * error says so.
 */
static mmoe_status graph_capture(mmoe_gpu_model *g, mmoe_error *err)
{
    cudaError_t ce = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal);
    if (ce != cudaSuccess)
        return cuda_fail(err, ce, "cuda graph: begin capture");
    g->capturing = 1;
    mmoe_status st = enqueue_layers(g, 1, err);
    if (st == MMOE_OK)
        st = head(g, g->hh_fn, g->hh_base, g->hh_scale, g->head_norm, 0, 1, err);
    g->capturing = 0;
    cudaGraph_t graph = NULL;
    ce = cudaStreamEndCapture(g->stream, &graph); /* always: the stream leaves capture mode */
    if (st != MMOE_OK || ce != cudaSuccess) {
        if (graph)
            cudaGraphDestroy(graph);
        (void)cudaGetLastError(); /* the capture's own error, reported below */
        return st != MMOE_OK ? mmoe_error_prefix(err, "cuda graph capture of the decode step: ")
                             : cuda_fail(err, ce, "cuda graph: end capture of the decode step");
    }
    ce = cudaGraphInstantiate(&g->graph_exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ce != cudaSuccess) {
        g->graph_exec = NULL;
        return cuda_fail(err, ce, "cuda graph: instantiate the decode step");
    }
    g->graph_captures++;
    return MMOE_OK;
}

/** Is this call a decode step that replays the graph? */
static int call_is_graphed(const mmoe_gpu_model *g, int64_t T, const float *logits)
{
    return g->graph_on && T == 1 && logits != NULL && !g->timing && !g->has_part && g->obs_fn == NULL;
}

/** Enqueue the copies out of a call (streams [T, hc, D], logits [n, V]) on the model's stream. */
static mmoe_status copy_out(mmoe_gpu_model *g, int64_t T, uint16_t *streams, float *logits, int64_t n,
                            mmoe_error *err)
{
    cudaError_t ce = cudaSuccess;
    if (streams)
        ce = cudaMemcpyAsync(streams, g->X, 2 * (size_t)(T * g->hc * g->D), cudaMemcpyDeviceToHost, g->stream);
    if (ce != cudaSuccess)
        return cuda_fail(err, ce, "streams copy");
    if (logits)
        ce = cudaMemcpyAsync(logits, g->logits, sizeof(float) * (size_t)(n * g->V), cudaMemcpyDeviceToHost, g->stream);
    return ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, "logits copy");
}

/**
 * End a call: wait for its stream, whatever happened (the step record's host copy may be
 * rewritten by the next call only then); the first error wins.
 */
static mmoe_status finish_call(mmoe_gpu_model *g, mmoe_status st, mmoe_error *err, const char *what)
{
    const cudaError_t ce = cudaStreamSynchronize(g->stream);
    if (st == MMOE_OK && ce != cudaSuccess)
        return cuda_fail(err, ce, what);
    return st;
}

/** The decode step by the graph: capture at the first one, then one launch; the logits copied out. */
static mmoe_status forward_graphed(mmoe_gpu_model *g, float *logits, uint16_t *streams, mmoe_error *err)
{
    mmoe_status st = g->graph_exec ? MMOE_OK : graph_capture(g, err);
    if (st != MMOE_OK)
        return st;
    const cudaError_t ce = cudaGraphLaunch(g->graph_exec, g->stream);
    if (ce != cudaSuccess)
        return cuda_fail(err, ce, "cuda graph launch of the decode step");
    g->graph_replays++;
    g->pos += 1;
    return copy_out(g, 1, streams, logits, 1, err);
}

/** The call kernel by kernel (prefill, timing, or graphs off). */
static mmoe_status forward_eager(mmoe_gpu_model *g, int64_t T, float *logits, int last_only, uint16_t *streams,
                                 mmoe_error *err)
{
    mmoe_status st = enqueue_layers(g, T, err);
    if (st != MMOE_OK)
        return st;
    g->eager_calls++;
    g->pos += T;
    if ((st = copy_out(g, T, streams, NULL, 0, err)) != MMOE_OK || !logits)
        return st;
    const double t0 = tick(g);
    const int64_t first = last_only ? T - 1 : 0;
    st = head(g, g->hh_fn, g->hh_base, g->hh_scale, g->head_norm, first, T - first, err);
    if (st == MMOE_OK)
        st = copy_out(g, T, NULL, logits, T - first, err);
    g->head_s += tick(g) - t0;
    return st;
}

extern "C" mmoe_status mmoe_gpu_model_forward(mmoe_gpu_model *g, const int32_t *ids, int64_t T, float *logits,
                                              int last_only, uint16_t *streams, mmoe_error *err)
{
    mmoe_status st = check_call(g, ids, T, g->pos, err);
    if (st != MMOE_OK)
        return st;
    step_write(g, g->pos, ids, T);
    st = call_is_graphed(g, T, logits) ? forward_graphed(g, logits, streams, err)
                                       : forward_eager(g, T, logits, last_only, streams, err);
    return finish_call(g, st, err, "forward");
}

extern "C" mmoe_status mmoe_gpu_model_mtp_forward(mmoe_gpu_model *g, const uint16_t *streams, const int32_t *next_ids,
                                                  int64_t T, float *logits, mmoe_error *err)
{
    if (!g->has_mtp)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "mtp: the model has no MTP layer");
    mmoe_status st = check_call(g, next_ids, T, g->mtp_pos, err);
    if (st != MMOE_OK)
        return st;
    const int64_t D = g->D, hc = g->hc;
    step_write(g, g->mtp_pos, next_ids, T);
    st = step_send(g, T, err);
    cudaError_t ce = cudaSuccess;
    if (st == MMOE_OK &&
        (ce = cudaMemcpyAsync(g->hn, streams, 2 * (size_t)(T * hc * D), cudaMemcpyHostToDevice, g->stream)) !=
            cudaSuccess)
        st = cuda_fail(err, ce, "mtp input copy");
    if (st == MMOE_OK) {
        launch_embed(g->embed, g->ids, T, D, 1, g->y, g->stream);
        if ((ce = cudaGetLastError()) != cudaSuccess)
            st = cuda_fail(err, ce, "mtp embedding");
    }
    if (st == MMOE_OK &&
        ((st = rmsnorm(g->y, T, D, g->enorm, g->eps, g->y, g->stream, err)) != MMOE_OK ||
         (st = linear_fp8(g, g->y, T, g->e_proj, g->e, err)) != MMOE_OK ||
         (st = rmsnorm(g->hn, T * hc, D, g->hnorm, g->eps, g->hn, g->stream, err)) != MMOE_OK ||
         (st = linear_fp8(g, g->hn, T * hc, g->h_proj, g->hp, err)) != MMOE_OK))
        st = mmoe_error_prefix(err, "mtp: ");
    if (st == MMOE_OK) {
        mmoe_launch_pdl(k_mtp_sum, nblk(T * hc * D), 256, 0, g->stream, g->e, g->hp, T, (int)hc, D, g->X);
        if ((ce = cudaGetLastError()) != cudaSuccess)
            st = cuda_fail(err, ce, "mtp input sum");
    }
    if (st == MMOE_OK && (st = run_block(g, g->n_layers, g->ids, g->mtp_pos, T, err)) != MMOE_OK)
        st = mmoe_error_prefix(err, "mtp: ");
    if (st == MMOE_OK) {
        g->mtp_pos += T;
        if (logits && (st = head(g, g->mh_fn, g->mh_base, g->mh_scale, g->mtp_norm, 0, T, err)) == MMOE_OK)
            st = copy_out(g, T, NULL, logits, T, err);
    }
    return finish_call(g, st, err, "mtp forward");
}

/* ================================================================== single blocks for the tests */

/** Device buffers of one test call, freed together. */
struct tarena {
    void *p[16];      /**< the buffers */
    int n;            /**< buffers held */
    cudaError_t ce;   /**< first CUDA error */
};

/** Allocate @p bytes and copy @p src (when given) into them. */
static void *tput(tarena *a, const void *src, size_t bytes)
{
    void *p = NULL;
    if (a->ce != cudaSuccess)
        return NULL;
    if ((a->ce = cudaMalloc(&p, bytes > 0 ? bytes : 1)) != cudaSuccess)
        return NULL;
    a->p[a->n++] = p;
    if (src)
        a->ce = cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice);
    return p;
}

/** Copy back @p bytes (if all went well), free everything, report. */
static mmoe_status tfinish(tarena *a, void *dst, const void *src, size_t bytes, mmoe_error *err, const char *what)
{
    if (a->ce == cudaSuccess)
        a->ce = cudaGetLastError();
    if (a->ce == cudaSuccess)
        a->ce = cudaDeviceSynchronize();
    if (a->ce == cudaSuccess && dst)
        a->ce = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    for (int i = 0; i < a->n; i++)
        cudaFree(a->p[i]);
    return a->ce == cudaSuccess ? MMOE_OK : cuda_fail(err, a->ce, what);
}

/** Start a test call: a device and the E4M3 table. */
static mmoe_status tbegin(tarena *a, mmoe_error *err)
{
    memset(a, 0, sizeof *a);
    mmoe_status st = need_device(err);
    if (st == MMOE_OK && (a->ce = upload_tables()) != cudaSuccess)
        st = cuda_fail(err, a->ce, "constant tables");
    return st;
}

/** Fill the @p n device buffers @p p (@p bytes each) with byte @p value (0xFF: NaN in bf16, fp32 and E4M3). */
static void tfill(tarena *a, void *const *p, const size_t *bytes, int n, int value)
{
    for (int i = 0; i < n && a->ce == cudaSuccess; i++)
        a->ce = cudaMemset(p[i], value, bytes[i]);
}

/** A bf16 vector [n] of a test hook (an RMSNorm's weight) on the device. */
static ddense tput_bf16_vector(tarena *a, const uint16_t *w, int64_t n)
{
    ddense wd;
    memset(&wd, 0, sizeof wd);
    wd.dtype = GFW_BF16;
    wd.cols = n;
    wd.rows = 1;
    wd.p = tput(a, w, 2 * (size_t)n);
    return wd;
}

extern "C" mmoe_status gfw_test_rmsnorm(const uint16_t *x, int64_t T, int64_t n, const uint16_t *w, float eps,
                                        uint16_t *y, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const ddense wd = tput_bf16_vector(&a, w, n);
    uint16_t *dx = (uint16_t *)tput(&a, x, 2 * (size_t)(T * n));
    if (a.ce == cudaSuccess)
        k_rmsnorm<<<(unsigned)T, rmsnorm_threads(n)>>>(dx, n, wd, eps, dx, NULL, NULL, NULL, NULL);
    return tfinish(&a, y, dx, 2 * (size_t)(T * n), err, "rmsnorm");
}

/** An FP8 weight of a test hook on the device: codes [N, K] and E8M0 scales of @p block blocks. */
static dfp8 tput_fp8(tarena *a, const uint8_t *w, const uint8_t *scale, int64_t N, int64_t K, int block)
{
    dfp8 f;
    f.N = N;
    f.K = K;
    f.block = block;
    f.scols = (K + block - 1) / block;
    f.w = (const uint8_t *)tput(a, w, (size_t)(N * K));
    f.s = (const uint8_t *)tput(a, scale, (size_t)(((N + block - 1) / block) * f.scols));
    f.nan_free = e4m3_codes_nan_free(w, (size_t)(N * K));
    return f;
}

/** The device's multiprocessor count into @p n_sm (the arena's error otherwise). */
static void tget_sm_count(tarena *a, int *n_sm)
{
    int dev = 0;
    if (a->ce == cudaSuccess)
        a->ce = cudaGetDevice(&dev);
    if (a->ce == cudaSuccess)
        a->ce = cudaDeviceGetAttribute(n_sm, cudaDevAttrMultiProcessorCount, dev);
}

/**
 * x bf16 [T, K] on the device, quantized there as act_quant() does (k_act_quant) into codes
 * @p q [T, K] and scale values @p s [T, K/128].
 */
static void tput_quantized_x(tarena *a, const uint16_t *x, int64_t T, int64_t K, uint8_t **q, float **s)
{
    uint16_t *dx = (uint16_t *)tput(a, x, 2 * (size_t)(T * K));
    *q = (uint8_t *)tput(a, NULL, (size_t)(T * K));
    *s = (float *)tput(a, NULL, sizeof(float) * (size_t)(T * K / 128));
    if (a->ce == cudaSuccess)
        k_act_quant<<<dim3((unsigned)(K / 128), (unsigned)T), 128>>>(dx, K, *q, *s);
}

extern "C" mmoe_status gfw_test_linear_fp8(const uint16_t *x, int64_t T, const uint8_t *w, const uint8_t *scale,
                                           int64_t N, int64_t K, int block, uint16_t *y, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const dfp8 f = tput_fp8(&a, w, scale, N, K, block);
    uint8_t *q;
    float *s;
    tput_quantized_x(&a, x, T, K, &q, &s);
    uint16_t *dy = (uint16_t *)tput(&a, NULL, 2 * (size_t)(T * N));
    int n_sm = 0;
    tget_sm_count(&a, &n_sm);
    if (a.ce == cudaSuccess)
        launch_linear_fp8(q, s, T, f, dy, n_sm, 0);
    return tfinish(&a, y, dy, 2 * (size_t)(T * N), err, "fp8 linear");
}

extern "C" mmoe_status gfw_test_linear_fp8_pair(const uint16_t *x, int64_t T, int64_t K, const uint8_t *w0,
                                                const uint8_t *scale0, int64_t N0, const uint8_t *w1,
                                                const uint8_t *scale1, int64_t N1, uint16_t *y0, uint16_t *y1,
                                                mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const dfp8 f0 = tput_fp8(&a, w0, scale0, N0, K, 128), f1 = tput_fp8(&a, w1, scale1, N1, K, 128);
    uint8_t *q;
    float *s;
    tput_quantized_x(&a, x, T, K, &q, &s);
    /* both outputs in one buffer, y0's rows then y1's */
    uint16_t *dy = (uint16_t *)tput(&a, NULL, 2 * (size_t)(T * (N0 + N1)));
    int n_sm = 0;
    tget_sm_count(&a, &n_sm);
    if (a.ce == cudaSuccess) /* NaN bits in every output until the kernel writes it */
        a.ce = cudaMemset(dy, 0xFF, 2 * (size_t)(T * (N0 + N1)));
    if (a.ce == cudaSuccess)
        launch_linear_fp8_pair(q, s, T, f0, dy, f1, dy + T * N0, n_sm, 0);
    if (a.ce == cudaSuccess)
        a.ce = cudaMemcpy(y1, dy + T * N0, 2 * (size_t)(T * N1), cudaMemcpyDeviceToHost);
    return tfinish(&a, y0, dy, 2 * (size_t)(T * N0), err, "fp8 linear pair");
}

extern "C" mmoe_status gfw_test_linear_fp8_tc(const gfw_test_tc_args *a_in, mmoe_error *err)
{
    const gfw_test_tc_args &t = *a_in;
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    if ((st = tc_device_check(err)) != MMOE_OK) {
        tfinish(&a, NULL, NULL, 0, err, "fp8 linear (tc)");
        return st;
    }
    const int64_t T = t.T, K = t.K, N0 = t.N0, N1 = t.w1 != NULL ? t.N1 : 0, hc = GFW_FP8_HC_POST_HC;
    const dfp8 f0 = tput_fp8(&a, t.w0, t.scale0, N0, K, 128);
    const dfp8 f1 = t.w1 != NULL ? tput_fp8(&a, t.w1, t.scale1, N1, K, 128) : f0;
    uint8_t *q;
    float *s;
    tput_quantized_x(&a, t.x, T, K, &q, &s);
    uint16_t *dy = (uint16_t *)tput(&a, NULL, 2 * (size_t)(T * (N0 + N1)));
    gfw_tc_ws ws;
    ws.part = (float *)tput(&a, NULL, sizeof(float) * GFW_TC_PART_FLOATS);
    ws.count = (unsigned *)tput(&a, NULL, sizeof(unsigned) * GFW_TC_COUNTS);
    fp8_hc_post hp = fp8_no_hc_post();
    if (t.X != NULL) {
        hp.X = (uint16_t *)tput(&a, t.X, 2 * (size_t)(T * hc * N0));
        hp.post = (const float *)tput(&a, t.post, sizeof(float) * (size_t)(T * hc));
        hp.comb = (const float *)tput(&a, t.comb, sizeof(float) * (size_t)(T * hc * hc));
        hp.hc = (int)hc;
    }
    int n_sm = 0;
    tget_sm_count(&a, &n_sm);
    if (a.ce == cudaSuccess) /* the counts start at zero, as the model's do */
        a.ce = cudaMemset(ws.count, 0, sizeof(unsigned) * GFW_TC_COUNTS);
    bool served = true;
    for (int r = 0; r < t.runs && a.ce == cudaSuccess && served; r++) {
        /* NaN bits in every output and partial until a launch writes it: a launch that finds a
           count another left behind leaves NaN outputs */
        void *const fill[2] = {dy, ws.part};
        const size_t bytes[2] = {2 * (size_t)(T * (N0 + N1)), sizeof(float) * GFW_TC_PART_FLOATS};
        tfill(&a, fill, bytes, 2, 0xFF);
        if (r == t.runs - 1 && hp.X != NULL) /* the streams are updated in place: the last run's update is returned */
            a.ce = a.ce == cudaSuccess ? cudaMemcpy(hp.X, t.X, 2 * (size_t)(T * hc * N0), cudaMemcpyHostToDevice) : a.ce;
        if (a.ce == cudaSuccess)
            served = launch_linear_fp8_tc(q, s, T, f0, dy, hp, t.w1 != NULL ? &f1 : NULL, dy + T * N0, ws, n_sm, 0);
    }
    if (!served) {
        tfinish(&a, NULL, NULL, 0, err, "fp8 linear (tc)");
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "fp8 linear (tc): T = %lld, K = %lld is not served",
                              (long long)T, (long long)K);
    }
    if (a.ce == cudaSuccess)
        a.ce = cudaDeviceSynchronize();
    if (a.ce == cudaSuccess && N1 > 0)
        a.ce = cudaMemcpy(t.y1, dy + T * N0, 2 * (size_t)(T * N1), cudaMemcpyDeviceToHost);
    if (a.ce == cudaSuccess && hp.X != NULL)
        a.ce = cudaMemcpy(t.X_out, hp.X, 2 * (size_t)(T * hc * N0), cudaMemcpyDeviceToHost);
    return tfinish(&a, t.y0, dy, 2 * (size_t)(T * N0), err, "fp8 linear (tc)");
}

/**
 * The rest of a dense-linear test hook once its weight @p wd is on the device: x [T, K] up, the
 * linear into fp32 [T, N], the result down into @p y (@p what names a failure).
 */
static mmoe_status test_dense_run(tarena *a, const ddense &wd, const uint16_t *x, int64_t T, int64_t K, int64_t N,
                                  float *y, mmoe_error *err, const char *what)
{
    uint16_t *dx = (uint16_t *)tput(a, x, 2 * (size_t)(T * K));
    float *dy = (float *)tput(a, NULL, sizeof(float) * (size_t)(T * N));
    dense_set ds;
    memset(&ds, 0, sizeof ds);
    dense_add(&ds, wd, N, dy, NULL);
    if (a->ce == cudaSuccess)
        launch_linear_dense(dx, T, K, K, ds, 0, 0, 0);
    return tfinish(a, y, dy, sizeof(float) * (size_t)(T * N), err, what);
}

extern "C" mmoe_status gfw_test_linear_dense(const uint16_t *x, int64_t T, int64_t K, const void *w, int w_f32,
                                             int64_t N, float *y, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    ddense wd;
    memset(&wd, 0, sizeof wd);
    wd.dtype = w_f32 ? GFW_F32 : GFW_BF16;
    wd.rows = N;
    wd.cols = K;
    wd.p = tput(&a, w, (w_f32 ? 4 : 2) * (size_t)(N * K));
    return test_dense_run(&a, wd, x, T, K, N, y, err, "dense linear");
}

extern "C" mmoe_status gfw_test_linear_dense_f8(const uint16_t *x, int64_t T, int64_t K, const uint8_t *w,
                                                const uint8_t *scale, int block, int64_t N, float *y,
                                                mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    ddense wd;
    memset(&wd, 0, sizeof wd);
    wd.dtype = GFW_F8;
    wd.rows = N;
    wd.cols = K;
    wd.block = block;
    wd.scols = (K + block - 1) / block;
    wd.p = tput(&a, w, (size_t)(N * K));
    wd.scale = (const uint8_t *)tput(&a, scale, (size_t)(((N + block - 1) / block) * wd.scols));
    wd.nan_free = e4m3_codes_nan_free(w, (size_t)(N * K));
    return test_dense_run(&a, wd, x, T, K, N, y, err, "dense linear (fp8 weight)");
}

extern "C" mmoe_status gfw_test_hc_pre(int hc, int64_t D, int iters, float norm_eps, float hc_eps, const uint16_t *X,
                                       int64_t T, const float *fn, const float *base, const float *scale, uint16_t *y,
                                       float *post, float *comb, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const int n_mix = (2 + hc) * hc;
    const uint16_t *dX = (const uint16_t *)tput(&a, X, 2 * (size_t)(T * hc * D));
    const float *dfn = (const float *)tput(&a, fn, sizeof(float) * (size_t)(n_mix * hc * D));
    const float *db = (const float *)tput(&a, base, sizeof(float) * (size_t)n_mix);
    const float *ds = (const float *)tput(&a, scale, sizeof(float) * 3);
    uint16_t *dy = (uint16_t *)tput(&a, NULL, 2 * (size_t)(T * D));
    float *dp = (float *)tput(&a, NULL, sizeof(float) * (size_t)(T * hc));
    float *dc = (float *)tput(&a, NULL, sizeof(float) * (size_t)(T * hc * hc));
    double *dpart = (double *)tput(&a, NULL, sizeof(double) * (size_t)(T * (n_mix + 1) * hc_part_blocks(hc * D)));
    if (a.ce == cudaSuccess)
        launch_hc_mix(dX, D, hc, T, dfn, db, ds, n_mix, norm_eps, hc_eps, iters, dpart, dy, dp, dc, 0);
    if (a.ce == cudaSuccess)
        a.ce = cudaDeviceSynchronize();
    if (a.ce == cudaSuccess)
        a.ce = cudaMemcpy(post, dp, sizeof(float) * (size_t)(T * hc), cudaMemcpyDeviceToHost);
    if (a.ce == cudaSuccess)
        a.ce = cudaMemcpy(comb, dc, sizeof(float) * (size_t)(T * hc * hc), cudaMemcpyDeviceToHost);
    return tfinish(&a, y, dy, 2 * (size_t)(T * D), err, "hc_pre");
}

extern "C" mmoe_status gfw_test_hc_pre_norm(int64_t D, int n_out, int iters, float norm_eps, float hc_eps,
                                            const uint16_t *X, int64_t T, const float *fn, const float *base,
                                            const float *scale, const uint16_t *w, float eps, int out, int fused,
                                            uint16_t *y, float *post, float *comb, uint8_t *q, float *qs, float *mq,
                                            mmoe_error *err)
{
    const int hc = GFW_HC_FUSED_HC;
    if (!hc_pre_norm_serves(hc, D))
        return mmoe_error_set(err, MMOE_EINVAL, "hc_pre_norm: width %lld is not served by k_hc_pre_norm", (long long)D);
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const int64_t n = hc * D;
    const int with_post = n_out > hc, S = hc_part_blocks(n);
    const ddense wd = tput_bf16_vector(&a, w, D);
    const uint16_t *dX = (const uint16_t *)tput(&a, X, 2 * (size_t)(T * n));
    const float *dfn = (const float *)tput(&a, fn, sizeof(float) * (size_t)(n_out * n));
    const float *db = (const float *)tput(&a, base, sizeof(float) * (size_t)n_out);
    const float *ds = (const float *)tput(&a, scale, sizeof(float) * 3);
    double *dpart = (double *)tput(&a, NULL, sizeof(double) * (size_t)(T * (n_out + 1) * S));
    unsigned *darrive = (unsigned *)tput(&a, NULL, sizeof(unsigned) * (size_t)T);
    /* every output starts as NaN (0xFF bytes: bf16, fp32 and E4M3 NaN), the work buffers zero */
    const size_t y_bytes = 2 * (size_t)(T * D), p_bytes = sizeof(float) * (size_t)(T * hc),
                 c_bytes = sizeof(float) * (size_t)(T * hc * hc), q_bytes = (size_t)(T * D),
                 qs_bytes = sizeof(float) * (size_t)(T * D / 128), m_bytes = sizeof(float) * (size_t)(T * D);
    uint16_t *dy = (uint16_t *)tput(&a, NULL, y_bytes);
    float *dp = (float *)tput(&a, NULL, p_bytes), *dc = (float *)tput(&a, NULL, c_bytes);
    uint8_t *dq = (uint8_t *)tput(&a, NULL, q_bytes);
    float *dqs = (float *)tput(&a, NULL, qs_bytes), *dmb = (float *)tput(&a, NULL, m_bytes);
    float *dmq = (float *)tput(&a, NULL, m_bytes);
    void *nan_fill[] = {dy, dp, dc, dq, dqs, dmb, dmq};
    const size_t nan_bytes[] = {y_bytes, p_bytes, c_bytes, q_bytes, qs_bytes, m_bytes, m_bytes};
    tfill(&a, nan_fill, nan_bytes, 7, 0xFF);
    if (a.ce == cudaSuccess)
        a.ce = cudaMemset(dpart, 0, sizeof(double) * (size_t)(T * (n_out + 1) * S));
    if (a.ce == cudaSuccess)
        a.ce = cudaMemset(darrive, 0, sizeof(unsigned) * (size_t)T);
    uint8_t *oq = out == 1 ? dq : NULL;
    float *oqs = out == 1 ? dqs : NULL, *omb = out == 2 ? dmb : NULL, *omq = out == 2 ? dmq : NULL;
    /* fused 2: the Sinkhorn's logits through a NaN-filled buffer to k_hc_sinkhorn */
    float *dl = fused == 2 && with_post ? (float *)tput(&a, NULL, c_bytes) : NULL;
    if (a.ce == cudaSuccess && fused) {
        const hc_pre_norm_args args = {dX, D, dfn, db, ds, n_out, with_post ? iters : 0, hc_eps, norm_eps, dpart,
                                       darrive, with_post ? dp : NULL, with_post ? dc : NULL, dl, wd, eps, dy, oq,
                                       oqs, omb, omq};
        for (int run = 0; run < 2 && a.ce == cudaSuccess; run++) {
            /* from NaN outputs each time: the second launch must find the counts the first reset */
            tfill(&a, nan_fill, nan_bytes, 7, 0xFF);
            if (dl != NULL && a.ce == cudaSuccess)
                a.ce = cudaMemset(dl, 0xFF, c_bytes);
            if (a.ce == cudaSuccess)
                launch_hc_pre_norm(args, T, 0);
            if (dl != NULL && a.ce == cudaSuccess)
                a.ce = launch_hc_sinkhorn(dl, db, ds, hc_eps, iters, dc, T, 0);
        }
    } else if (a.ce == cudaSuccess) {
        launch_hc_mix(dX, D, hc, T, dfn, db, ds, n_out, norm_eps, hc_eps, with_post ? iters : 0, dpart, dy,
                      with_post ? dp : NULL, with_post ? dc : NULL, 0);
        k_rmsnorm<<<(unsigned)T, rmsnorm_threads(D)>>>(dy, D, wd, eps, dy, oq, oqs, omb, omq);
    }
    if (a.ce == cudaSuccess)
        a.ce = cudaGetLastError();
    if (a.ce == cudaSuccess)
        a.ce = cudaDeviceSynchronize();
    const void *src[] = {dp, dc, dq, dqs, dmq};
    void *dst[] = {post, comb, q, qs, mq};
    const size_t bytes[] = {p_bytes, c_bytes, q_bytes, qs_bytes, m_bytes};
    for (int i = 0; i < 5 && a.ce == cudaSuccess; i++)
        a.ce = cudaMemcpy(dst[i], src[i], bytes[i], cudaMemcpyDeviceToHost);
    return tfinish(&a, y, dy, y_bytes, err, "hc_pre_norm");
}

extern "C" mmoe_status gfw_test_hc_post(int hc, int64_t D, const uint16_t *out, uint16_t *X, int64_t T,
                                        const float *post, const float *comb, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const uint16_t *dout = (const uint16_t *)tput(&a, out, 2 * (size_t)(T * D));
    uint16_t *dX = (uint16_t *)tput(&a, X, 2 * (size_t)(T * hc * D));
    const float *dp = (const float *)tput(&a, post, sizeof(float) * (size_t)(T * hc));
    const float *dc = (const float *)tput(&a, comb, sizeof(float) * (size_t)(T * hc * hc));
    if (a.ce == cudaSuccess)
        launch_hc_post(dout, dX, T, D, hc, dp, dc, 0);
    return tfinish(&a, X, dX, 2 * (size_t)(T * hc * D), err, "hc_post");
}

extern "C" mmoe_status gfw_test_attend(const uint16_t *q, int64_t T, int H, int d, const uint16_t *rows, int64_t n,
                                       const float *sink, int rope_dim, const float *cs, uint16_t *out,
                                       mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    /* the list as a window of n positions: the queries at positions n-T .. n-1, whose rows are the
       call's, the earlier rows in the ring (slot q % n = q) */
    const size_t q_elems = (size_t)T * (size_t)H * (size_t)d;
    const uint16_t *dq = (const uint16_t *)tput(&a, q, 2 * q_elems);
    const uint16_t *dr = (const uint16_t *)tput(&a, rows, 2 * (size_t)(n * d));
    const float *dsink = (const float *)tput(&a, sink, sizeof(float) * (size_t)H);
    uint16_t *dout = (uint16_t *)tput(&a, NULL, 2 * q_elems);
    const int64_t pos0 = n - T;
    const int64_t *dpos = (const int64_t *)tput(&a, &pos0, sizeof pos0);
    /* the table's rows for positions 0 .. n-1, NaN but at the queries' */
    const int64_t pair = (rope_dim / 2) * 2, cs_n = cs != NULL ? n * pair : 0;
    float *cst = cs_n > 0 ? (float *)malloc(sizeof(float) * (size_t)cs_n) : NULL;
    if (cs_n > 0 && cst == NULL && a.ce == cudaSuccess)
        a.ce = cudaErrorMemoryAllocation; /* the host's: reported as out of memory */
    for (int64_t i = 0; cst != NULL && i < cs_n; i++)
        cst[i] = i >= pos0 * pair ? cs[i - pos0 * pair] : NAN;
    const float *dcs = cst != NULL ? (const float *)tput(&a, cst, sizeof(float) * (size_t)cs_n) : NULL;
    free(cst);
    if (a.ce == cudaSuccess) {
        attend_args aa = {dq, dr + pos0 * d, dr, NULL, NULL, dsink, dcs, H, d, (int)n, 0, 0, rope_dim, dpos,
                          (float)(1.0 / sqrt((double)d)), dout};
        launch_attend(aa, T, 0);
    }
    return tfinish(&a, out, dout, 2 * q_elems, err, "attention");
}

/**
 * The QAT steps of the forward on whole rows, one block of 128 threads per row: the kv FP8
 * round trip (kind 0, all but the last 64 values) or the Hadamard and FP4 round trip of the
 * indexer's compressed keys (kind 1, k_compress's device code; dynamic shared memory: width
 * floats).  Kinds 2 and 3 (k_indexer_q_split) are launched by gfw_test_qat() itself.
 */
__global__ void k_test_qat(uint16_t *x, int64_t rows, int width, int kind)
{
    gfw_pdl_enter();
    extern __shared__ float hv[];
    uint16_t *xr = x + (int64_t)blockIdx.x * width;
    if (kind == 0) {
        fp8_roundtrip_warps(xr, width - 64, threadIdx.x / 32, blockDim.x / 32);
    } else {
        hadamard_block(xr, 1, width, hv);
        fp4_roundtrip_warps(xr, width, threadIdx.x / 32, blockDim.x / 32);
    }
}

extern "C" mmoe_status gfw_test_qat(uint16_t *x, int64_t rows, int width, int kind, mmoe_error *err)
{
    if (kind >= 2 && (width < 32 || width > 1024 || (width & (width - 1)) != 0))
        return mmoe_error_set(err, MMOE_EINVAL, "gfw_test_qat: width %d: k_indexer_q_split takes a power of two in "
                              "[32, 1024]", width);
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    uint16_t *dx = (uint16_t *)tput(&a, x, 2 * (size_t)(rows * width));
    const int64_t pos = 0;
    const int64_t *dpos = (const int64_t *)tput(&a, &pos, sizeof pos);
    if (a.ce == cudaSuccess && kind >= 2) /* the rows as the heads of one token, without RoPE */
        launch_indexer_q(dx, 1, (int)rows, width, 0, NULL, dpos, NULL, 0.0f, 0, kind == 2);
    else if (a.ce == cudaSuccess)
        k_test_qat<<<(unsigned)rows, 128, sizeof(float) * (size_t)width>>>(dx, rows, width, kind);
    return tfinish(&a, x, dx, 2 * (size_t)(rows * width), err, "qat round trip");
}

extern "C" mmoe_status gfw_test_indexer(const uint16_t *qi, const uint16_t *wi, const uint16_t *keys, int ih, int id,
                                        int64_t n_blocks, int topk, float *scores, int32_t *idx, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const uint16_t *dq = (const uint16_t *)tput(&a, qi, 2 * (size_t)ih * (size_t)id);
    const uint16_t *dw = (const uint16_t *)tput(&a, wi, 2 * (size_t)ih);
    const uint16_t *dk = (const uint16_t *)tput(&a, keys, 2 * (size_t)(n_blocks * id));
    float *ds = (float *)tput(&a, NULL, sizeof(float) * (size_t)n_blocks);
    int32_t *di = (int32_t *)tput(&a, NULL, sizeof(int32_t) * (size_t)topk);
    const int64_t pos = 4 * n_blocks - 1;
    const int64_t *dpos = (const int64_t *)tput(&a, &pos, sizeof pos);
    if (a.ce == cudaSuccess) {
        int n_sm = 0;
        a.ce = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);
        if (a.ce == cudaSuccess)
            k_indexer_scores<<<indexer_scores_grid(n_blocks, (unsigned)(GFW_SCORES_CTAS_PER_SM * n_sm)), 256>>>(
                dq, dw, dk, ih, id, 1, dpos, n_blocks, ds);
        launch_topk(ds, 1, dpos, n_blocks, n_blocks, topk, di, 0);
    }
    if (a.ce == cudaSuccess)
        a.ce = cudaDeviceSynchronize();
    const int64_t k = n_blocks < topk ? n_blocks : topk;
    if (a.ce == cudaSuccess)
        a.ce = cudaMemcpy(idx, di, sizeof(int32_t) * (size_t)k, cudaMemcpyDeviceToHost);
    return tfinish(&a, scores, ds, sizeof(float) * (size_t)n_blocks, err, "indexer");
}

/** y[i] = fn(x[i]) (gfw_test_unary()). */
__global__ void k_test_unary(gfw_test_fn fn, const float *x, int64_t n, float *y)
{
    gfw_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = fn == GFW_TEST_LOG1PF ? mmoe_log1pf(x[i]) : gfw_expf(x[i]);
}

extern "C" mmoe_status gfw_test_unary(gfw_test_fn fn, const float *x, int64_t n, float *y, mmoe_error *err)
{
    tarena a;
    mmoe_status st = tbegin(&a, err);
    if (st != MMOE_OK)
        return st;
    const float *dx = (const float *)tput(&a, x, sizeof(float) * (size_t)n);
    float *dy = (float *)tput(&a, NULL, sizeof(float) * (size_t)n);
    if (a.ce == cudaSuccess)
        k_test_unary<<<nblk(n), 256>>>(fn, dx, n, dy);
    return tfinish(&a, y, dy, sizeof(float) * (size_t)n, err, fn == GFW_TEST_LOG1PF ? "log1pf" : "expf");
}

extern "C" mmoe_status gfw_test_route(const gfw_test_route_args *a, mmoe_error *err)
{
    tarena ar;
    mmoe_status st = tbegin(&ar, err);
    if (st != MMOE_OK)
        return st;
    const int64_t T = a->T, E = a->E, k = a->k, n = T * (k + 1);
    dmoe m;
    memset(&m, 0, sizeof m);
    m.E = E;
    m.k = k;
    m.Ws = a->shared ? 128 : 0;
    m.vb = 4;
    m.first = 0;
    m.held = E;
    gfw_moe_router r = {NULL, NULL, NULL, a->route_scale};
    if (a->bias)
        r.bias = (const float *)tput(&ar, a->bias, sizeof(float) * (size_t)E);
    gfw_moe_io io;
    memset(&io, 0, sizeof io);
    io.T = T;
    io.logits = (float *)tput(&ar, a->logits, sizeof(float) * (size_t)(T * E));
    io.idx = (int32_t *)tput(&ar, NULL, sizeof(int32_t) * (size_t)(T * k));
    io.wts = (float *)tput(&ar, NULL, sizeof(float) * (size_t)(T * k));
    gfw_moe_work w;
    memset(&w, 0, sizeof w);
    w.order = (int32_t *)tput(&ar, NULL, sizeof(int32_t) * (size_t)n);
    w.flag = (int32_t *)tput(&ar, NULL, sizeof(int32_t) * (size_t)n);
    w.items = (int4 *)tput(&ar, NULL, sizeof(int4) * (size_t)n);
    w.n_items = (int32_t *)tput(&ar, NULL, sizeof(int32_t));
    void *const outs[6] = {io.idx, io.wts, w.order, w.flag, w.items, w.n_items};
    const size_t out_bytes[6] = {sizeof(int32_t) * (size_t)(T * k), sizeof(float) * (size_t)(T * k),
                                 sizeof(int32_t) * (size_t)n, sizeof(int32_t) * (size_t)n, sizeof(int4) * (size_t)n,
                                 sizeof(int32_t)};
    tfill(&ar, outs, out_bytes, 6, 0xFF); /* NaN and -1: what the kernels leave unwritten shows */
    if (ar.ce == cudaSuccess)
        ar.ce = gfw_moe_route(m, r, w, io, 0);
    if (ar.ce == cudaSuccess)
        ar.ce = cudaDeviceSynchronize();
    void *const host[6] = {a->idx, a->wts, a->order, a->flag, a->items, a->n_items};
    for (int i = 0; i < 6 && ar.ce == cudaSuccess; i++)
        ar.ce = cudaMemcpy(host[i], outs[i], out_bytes[i], cudaMemcpyDeviceToHost);
    *a->tt = gfw_moe_tile(T);
    return tfinish(&ar, a->scores, io.logits, sizeof(float) * (size_t)(T * E), err, "routing");
}

extern "C" mmoe_status gfw_test_sublayer(mmoe_gpu_model *g, int L, int which, const uint16_t *x, const int32_t *ids,
                                         int64_t T, int64_t pos0, uint16_t *out, mmoe_error *err)
{
    if (L < 0 || L >= g->n_blocks || T < 1 || T > g->Tm || pos0 + T > g->max_seq_len)
        return mmoe_error_set(err, MMOE_EINVAL, "gfw_test_sublayer: block %d, T %lld, pos0 %lld out of range", L,
                              (long long)T, (long long)pos0);
    step_write(g, pos0, ids, T);
    mmoe_status st = step_send(g, ids ? T : 0, err);
    cudaError_t ce = cudaSuccess;
    if (st == MMOE_OK &&
        (ce = cudaMemcpyAsync(g->y, x, 2 * (size_t)(T * g->D), cudaMemcpyHostToDevice, g->stream)) != cudaSuccess)
        st = cuda_fail(err, ce, "sub-layer input copy");
    if (st == MMOE_OK)
        st = which == 0 ? attention(g, &g->blocks[L], pos0, T, 0, NULL, err) : moe(g, &g->blocks[L], g->ids, T, err);
    if (st == MMOE_OK &&
        (ce = cudaMemcpyAsync(out, g->o, 2 * (size_t)(T * g->D), cudaMemcpyDeviceToHost, g->stream)) != cudaSuccess)
        st = cuda_fail(err, ce, "sub-layer output copy");
    return finish_call(g, st, err, "sub-layer");
}

extern "C" mmoe_status gfw_test_last_routing(mmoe_gpu_model *g, int L, int64_t T, int32_t *idx, float *w,
                                             mmoe_error *err)
{
    if (L < 0 || L >= g->n_blocks || T < 1 || T > g->Tm)
        return mmoe_error_set(err, MMOE_EINVAL, "gfw_test_last_routing: block %d, T %lld out of range", L,
                              (long long)T);
    const size_t k = (size_t)g->blocks[L].moe.k;
    cudaError_t ce = cudaMemcpyAsync(idx, g->moe_idx, sizeof(int32_t) * k * (size_t)T, cudaMemcpyDeviceToHost,
                                     g->stream);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(w, g->moe_w, sizeof(float) * k * (size_t)T, cudaMemcpyDeviceToHost, g->stream);
    return finish_call(g, ce == cudaSuccess ? MMOE_OK : cuda_fail(err, ce, "routing copy"), err, "routing copy");
}

extern "C" mmoe_status gfw_test_set_observer(mmoe_gpu_model *g, mmoe_model_observer fn, void *ctx,
                                             mmoe_error *err)
{
    if (fn != NULL) { /* the host copies, kept until the model is destroyed */
        if (g->obs_in == NULL)
            g->obs_in = (uint16_t *)malloc(2 * (size_t)(g->Tm * g->D));
        if (g->obs_out == NULL)
            g->obs_out = (uint16_t *)malloc(2 * (size_t)(g->Tm * g->D));
        if (g->obs_in == NULL || g->obs_out == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "gfw_test_set_observer: out of host memory");
    }
    g->obs_fn = fn;
    g->obs_ctx = ctx;
    return MMOE_OK;
}

extern "C" mmoe_status gfw_test_moe_given(mmoe_gpu_model *g, int L, const uint16_t *x, const int32_t *idx,
                                          const float *wts, int64_t T, float *logits, uint16_t *out, mmoe_error *err)
{
    if (L < 0 || L >= g->n_blocks || T < 1 || T > g->Tm)
        return mmoe_error_set(err, MMOE_EINVAL, "gfw_test_moe_given: block %d, T %lld out of range", L, (long long)T);
    const dmoe &m = g->blocks[L].moe;
    const cudaMemcpyKind in = cudaMemcpyHostToDevice, back = cudaMemcpyDeviceToHost;
    cudaError_t ce = cudaMemcpyAsync(g->y, x, 2 * (size_t)(T * g->D), in, g->stream);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(g->moe_idx, idx, sizeof(int32_t) * (size_t)(T * m.k), in, g->stream);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(g->moe_w, wts, sizeof(float) * (size_t)(T * m.k), in, g->stream);
    mmoe_status st = ce == cudaSuccess ? moe(g, &g->blocks[L], g->ids, T, err, 1)
                                       : cuda_fail(err, ce, "moe input copy");
    if (st == MMOE_OK && (ce = cudaMemcpyAsync(out, g->o, 2 * (size_t)(T * g->D), back, g->stream)) == cudaSuccess)
        ce = cudaMemcpyAsync(logits, g->moe_scores, sizeof(float) * (size_t)(T * m.E), back, g->stream);
    if (st == MMOE_OK && ce != cudaSuccess)
        st = cuda_fail(err, ce, "moe output copy");
    return finish_call(g, st, err, "moe sub-layer");
}
