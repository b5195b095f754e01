/**
 * @file gpu_fwd_moe.cu
 * @brief The GPU forward's MoE sub-layer: router, routed experts, shared expert and combine,
 *        bit-identical to the CPU oracle and streaming the weights at close to memory speed.
 *
 * ## The order that is fixed, and what is free
 *
 * Every GEMM of the layer (router logits, L1 gate and up, L2; routed and shared experts) sums
 * each output as @ref spec_moe_gemm_order defines (moe_dot.c): eight FP32 chains, chain l
 * taking k = l, l + 8, l + 16, ... in ascending order with one fused multiply-add each, then
 * the fixed combine ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)).  The products are
 * exact (bf16 x bf16, E4M3 value x E2M1 * 2^s, E4M3 value x fl(E4M3 * scale)), so the fma's
 * one rounding is the oracle's.  Which thread runs a chain, how its weights reach it and how
 * many chains run at once is free; here one thread runs one chain of one output row for up
 * to TT tokens at once, so every weight is decoded once per CTA and used TT times.
 *
 * ## Chain-major packing
 *
 * A chain reads every eighth element of a row.  So that it reads whole words, gfw_moe_pack()
 * reorders each weight row in place right after the upload: the row is cut into groups of
 * 8 * 4 * vb bytes (vb = 4 where D and I are multiples of 256 and the shared block of 128,
 * else 1); inside a group the 4 * vb bytes of chain l come together, holding chain l's next
 * elements in ascending order
 * (element i of a 32-bit word at bits [i * w, (i + 1) * w) for elements of w bits).  For
 * E2M1 (w = 4) chain word v of group g holds chain elements m = 8 (g vb + v) .. + 7, i.e.
 * k = 8 m + l; their two UE8M0 scales are bytes m/4 and m/4 + 1 of the row's scales (k / 32 =
 * m / 4), which stay in the checkpoint's order.  Each E2M1 chain word is then stored as its
 * slot word (gpu_moe_decode.h: the same 32 bits rearranged so that each code's tiny float below
 * takes fewer shifts and masks).  E4M3 words hold 4 elements, and a group's
 * 32 * vb columns share one block scale (the shared block is a multiple of 32 * vb); bf16
 * words hold 2.  Thread (row, l) then loads its 4 * vb bytes per group with one aligned load,
 * and the 8 threads of a row read 32 * vb contiguous bytes: coalesced without staging through
 * shared memory.  Activations are stored the same way, chain-major: x[t][l][m] = x[t][8 m + l],
 * so a chain's values are contiguous.
 *
 * ## Staged activations
 *
 * All rows of a CTA read the same activations, so the CTA stages them in shared memory
 * before its chains run (moe_chain_dot): a chunk of mc values of each of the 8 chains of each
 * of the item's nt tokens, copied with cp.async by every thread of the CTA, then one barrier;
 * the next chunk after another barrier.  The tile of a token tile TT holds MC = 512 / TT
 * values per chain of TT tokens, 16 KB of fp32 (moe_xs; 17 KB with the padding below); mc is
 * all K/8 values when they fit, else MC (moe_xs_chunk): all of K = 4096 for one token, 64
 * values per chain for 8.  Inside
 * the tile chain l of token t starts at (8 t + l) (MC + 4), whatever nt: the four floats of
 * padding put the 8 chains' 16-byte reads of one instruction in 8 distinct bank quads (MC is
 * a multiple of 64), the rows of a warp read the same words (a broadcast), and since the
 * stride is a constant a chain reads all its tokens' values from one register with immediate
 * offsets.  Each thread stages one chain (its index mod 8) by pointer steps, no index
 * arithmetic per copy (moe_stage).  A chunk holds whole batches of
 * PF groups (a batch is 16, 32 or 64 values per chain), so the weight loads still run one
 * batch ahead across chunks.
 * Only where the values come from changed: every chain runs the same fma in the same order.
 *
 * ## Decode
 *
 * E2M1 code n becomes the float d with bits (n & 7) << 22 | (n & 8) << 28, which is
 * e2m1(n) * 2^-126 exactly (codes 0 and 1 land on the subnormals 0 and 2^-127); the slot word
 * gives it by mmoe_moe_slot_tiny_bits(): one shift and one mask for three of a word's eight
 * codes, a mask alone for one, two shifts, a mask and a merge for the other four.  Times 2^126
 * and then times the UE8M0 scale 2^(s - 127) gives fl(e2m1(n) * 2^(s - 127)), the oracle's
 * weight, for every s (no flush to zero in this build).  E4M3 codes go through the hardware's
 * E4M3 -> F16 conversion (exact), then one fp32 multiply by the block scale, as the oracle.
 *
 * Where the scale allows, one multiply does it: fl(d * 2^(s - 1)) is the same float as the two
 * multiplies whenever 2^(s - 1) is one, i.e. for scale bytes s <= 128 (gpu_moe_decode.h, where
 * the bits, the factor and the proof's bounds are; the CPU suite gpu_moe_decode checks it for
 * every code and scale against the oracle).  Each group of VB words checks its scale bytes
 * first (moe_one_step_slot(): a few integer operations per group) and takes the one-multiply
 * body, or the two-multiply one when a byte exceeds 128 (never for real checkpoints, whose
 * scales are far below 1; correct either way, a divergent branch at worst).  Per E2M1 weight
 * that leaves the bit moves (23 integer operations per word of eight, gpu_moe_decode.h), one
 * FMUL and the fma; the factors 2^(s - 1) of a scale word's four bytes take one add for all
 * four, then one shift and one mask each (mmoe_moe_one_step_fields()).  E4M3 codes are
 * converted two at a time (one E4M3x2 -> F16x2 conversion per pair, exact).
 *
 * ## The kernels of one call
 *
 * | kernel            | what                                                             |
 * |-------------------|------------------------------------------------------------------|
 * | k_moe_in          | x -> fp32 values and 1x128 E4M3 values, both chain-major (or the norm: x_staged) |
 * | k_moe_logits      | router logits [T, E]; CTA = 4 rows x 8 chains, TT tokens         |
 * | k_moe_logits_one  | the same for one token, gate rows and x staged in shared memory  |
 * | k_moe_route_plan  | one CTA: sqrt-softplus, top-k (a warp per token) or hash, weights; then the plan |
 * | k_moe_route_plan_one | the same for one token: a thread an expert's score, then one warp, its values in registers |
 * | k_moe_shared_plan | the shared expert's tasks alone, for its own stream (moe_run_split()) |
 * | k_moe_l1          | CTA = 16 rows (32 for 8-token tiles) x 8 chains of one item; gate and up; SwiGLU epilogue |
 * | k_moe_requant     | L1 outputs -> 1x128 E4M3 values, chain-major                     |
 * | k_moe_l2          | CTA = 2 x 16 rows (4 x 16 for 8-token tiles) x 8 chains of one item; bf16 per slot |
 * | k_moe_combine     | ascending expert id, ties in slot order, shared last             |
 *
 * **The plan.**  A task is one (token, slot) pair of a routed expert, or one token of the
 * shared expert (treated as expert E).  The plan sorts the valid tasks by expert, the shared
 * expert first and the routed ones in ascending id (in task order within one expert), and
 * cuts each expert's run into items of at most TT tasks (a stable counting sort, one CTA:
 * moe_plan_counting(); a one-token call's few tasks by their pairwise ranks, a lane each,
 * moe_plan_tally()); an L1 CTA owns 16 output rows of one
 * item and an L2 CTA 32 (twice that for 8-token tiles: MOE_ROW_SETS), so an expert's weights
 * are streamed once per TT of its tokens.  The
 * grid is sized for the worst case and CTAs beyond the plan's count exit.  The order of the
 * items decides only when each CTA runs (every output is written at its task's row, whatever
 * the item): with the shared expert's items first, its CTAs, which stream the most bytes
 * (E4M3, twice an E2M1 row's), are the first CTA of almost every SM in a decode step's one
 * wave, and the warp schedulers, which favour a multiprocessor's oldest warps, run them
 * ahead of the routed CTAs instead of last (docs/perf.md: 13% off the one-token L1 launch).
 * A one-token call of the forward goes further (gfw_moe_rows_split()): the shared expert,
 * which needs no routing, runs its L1, requantization and L2 on a second stream forked right
 * after the input's quantization, while the router's one-block kernels run on the first; the
 * plan there leaves the shared expert out, and the first stream waits for the second before
 * the combine.
 *
 * **Rounding points**, all the oracle's (moe_layer.c, dsv4-ref recipe): the input's 1x128
 * E4M3 quantization (UE8M0 ceil scale, clamp +-448); bf16 of the L1 sums; clamp; silu =
 * g / (1 + exp(-g)) (gfw_expf, glibc's expf); (silu * u) * w; bf16; 1x128 requantization;
 * bf16 of the L2 sums; fp32 combine from +0; one bf16.
 *
 * ## Limits
 *
 * At decode every thread's chain is K/8 dependent fma (512 for D = 4096), so a GEMM takes at
 * least ~K/8 * 4 cycles; the weights of one token (6 routed + 1 shared expert at V4-Flash
 * widths) are streamed by about 3500 warps in each GEMM.  The chains read their activations from shared memory (the staging above), so the fma wait on shared-memory
 * latency rather than on L1 or L2; the decode kernels are compiled for 7 CTAs per SM
 * (MOE_MIN_CTAS) so that a decode step's L1 grid runs in one wave.  In that wave the shared
 * expert's CTAs run longest: a thread waits for its weights once per batch, and an E4M3 row
 * has twice the groups of an E2M1 one (32 at D = 4096), so with one group per batch they
 * would wait 32 times against the routed experts' 16.  So their L1 groups load two per batch
 * (MOE_L1_SHARED_PF), which fits the same 72 registers (an E2M1 batch of two groups does not:
 * it spills in the loop); the order of every fma is unchanged.  L2 gives each thread two
 * output rows (MOE_L2_NM), so that its grid of D / 32 CTAs per item also runs in one wave
 * (with one row per thread, 7 items x 256 CTAs took two, the shared expert's last), its E4M3
 * rows again two groups per batch.  For prefill the fp32
 * fma rate bounds the work: the exact order leaves the tensor cores out, so what counts is
 * the instructions issued besides the fma.  An E2M1 word of 8 weights takes ~37 to decode
 * (bit moves, factors, 8 FMUL), and one LDS.128 of staged x feeds 4 fma of each of the
 * thread's weight rows; what bounds a prefill tile is then the shared-memory pipe as much as
 * the issue (Nsight Compute on a 16-token L1 tile of one row set, a gate and an up row a
 * thread: the memory pipes 88% busy, stall_short_sb 30% of the warps' samples).  So calls of
 * at least 8 tokens use an 8-token tile (MOE_TT_MAX) whose threads run two row sets
 * (MOE_ROW_SETS): four weight rows a thread in L1 (gate and up of rows j and j + 16) and in
 * L2, so one LDS.128 feeds 16 fma instead of 8, and each decoded weight 8; the groups per
 * batch are divided by the row sets where there are several (moe_batch_groups()), so the
 * kernels fit 168 registers (three CTAs an SM).  This tile beat a 16-token tile of one row
 * set (the L1 and L2 of a 512-token prefill 18% faster) and one of two row sets (255
 * registers, two CTAs an SM: its L1 8% slower): docs/perf.md.  A full tile runs a body
 * without per-token tests (moe_chain_dot).  The router's top-k runs one warp per token.
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gpu_forward_kernels.cuh"
#include "gpu_cp_async.cuh"
#include "gpu_fwd_moe.cuh"
#include "gpu_moe_decode.h"
#include "mmoe_log1p.h"

/** Bits of one weight element per format. */
enum moe_wfmt { MOE_WF_FP4 = 4, MOE_WF_FP8 = 8, MOE_WF_BF16 = 16 };

/** How a group's E2M1 weights are decoded (gpu_moe_decode.h). */
enum moe_dec {
    MOE_DEC_TWO_STEP, /**< fl(fl(d * 2^126) * 2^(s - 127)): every scale byte (groups with a byte above 128) */
    MOE_DEC_ONE_STEP  /**< fl(d * 2^(s - 1)): groups whose scale bytes are all <= 128 */
};

/** Rows per CTA of the expert GEMMs (times 8 chains = 128 threads: small CTAs fill the SMs evenly at T = 1). */
#define MOE_ROWS 16
/** Threads of an expert-GEMM CTA. */
#define MOE_THREADS (MOE_ROWS * 8)
/**
 * CTAs per SM the expert GEMMs are compiled for: 7 for the decode kernels (one token per
 * tile, 4-word packing: at most 72 registers, no spill), so that V4-Flash's decode grid of
 * 7 items x 128 CTAs fits the 132 SMs in one wave; 3 otherwise (at most 168 registers).
 */
#define MOE_MIN_CTAS(VB, TT) ((TT) == 1 && (VB) == 4 ? 7 : 3)
/** Groups per batch of the shared expert's L1 (E4M3 gate and up rows): two 4-word groups (see "Limits"). */
#define MOE_L1_SHARED_PF(VB) (8 / (VB))
/** Rows per CTA of the router GEMM (one warp: the router has few rows). */
#define MOE_ROUTER_ROWS 4
/** Threads of a router CTA. */
#define MOE_ROUTER_THREADS (MOE_ROUTER_ROWS * 8)
/**
 * Largest token tile of the expert GEMMs: 8 tokens per decoded weight (prefill calls of at
 * least 8 tokens), whose threads run two row sets (MOE_ROW_SETS).
 */
#define MOE_TT_MAX 8
/**
 * Row sets a thread of the expert GEMMs runs for token tile TT: rows j + i MOE_ROWS, i <
 * MOE_ROW_SETS(TT), of the gate and the up matrix in L1 (so 2 MOE_ROW_SETS(TT) chains of
 * weights), of W_2 in L2 (MOE_L2_NM MOE_ROW_SETS(TT)).  Each staged x value a thread reads
 * then feeds twice the fma: the 8-token tiles run two (see "Limits"), the others one.
 */
#define MOE_ROW_SETS(TT) ((TT) >= 8 ? 2 : 1)
/**
 * Most dynamic shared memory of k_moe_logits_one: its gate rows and the token's staged chains
 * (moe_logits_one_smem(); 49.5 KB at D = 4096, 86 KB at D = 7168).
 */
#define MOE_LOGITS_ONE_SMEM_MAX (96 * 1024)
/** Largest token tile of the router GEMM (one warp per CTA: few rows, TT accumulators each). */
#define MOE_ROUTER_TT_MAX 8
/** Threads of the routing / planning CTA. */
#define MOE_PLAN_THREADS 512
/**
 * The most experts one GPU holds (a layer's, or a rank's block of them): k_moe_route_plan's
 * counting sort keeps MOE_PLAN_THREADS / 32 + 2 counts a held expert in shared memory
 * (moe_plan_smem(): 144 KB here, within the 227 KB a block may have on SM90 and SM100).
 */
#define MOE_PLAN_HELD_MAX 2048
/** Selection values a lane of k_moe_route_plan_one holds: the most experts it routes, over 32. */
#define MOE_PLAN_ONE_PER 16
/** The most experts k_moe_route_plan_one routes (one thread each for the scores). */
#define MOE_PLAN_ONE_E_MAX (32 * MOE_PLAN_ONE_PER)

/* ================================================================== helpers */

/**
 * E4M3 codes in bytes 2h and 2h + 1 of @p word -> their fp32 values @p v0, @p v1, by one
 * hardware conversion of the pair to F16 (exact), then each F16 to fp32 (exact).
 */
__device__ __forceinline__ void moe_e4m3_pair_values(uint32_t word, int h, float &v0, float &v1)
{
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(word >> (16 * h)), __NV_E4M3);
    v0 = __half2float(__half(__half_raw{hr.x}));
    v1 = __half2float(__half(__half_raw{hr.y}));
}

/**
 * The V4 1x128 quantization of one group held by a block of 128 threads (one value each):
 * s = 2^ceil(log2(max(amax, 1e-4) * fl(1/448))), returns e4m3(clamp(v / s, +-448)) * s.
 * amax is NaN when any value is (the scale then saturates, whatever the NaN).
 */
__device__ __forceinline__ float moe_quant128(float v)
{
    __shared__ float red[4];
    __shared__ int nan_any[4];
    float a = isnan(v) ? 0.0f : fabsf(v);
    for (int o = 16; o > 0; o >>= 1)
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    const int nan_w = __any_sync(0xffffffffu, isnan(v));
    if ((threadIdx.x & 31) == 0) {
        red[threadIdx.x >> 5] = a;
        nan_any[threadIdx.x >> 5] = nan_w;
    }
    __syncthreads();
    float amax = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    if (nan_any[0] | nan_any[1] | nan_any[2] | nan_any[3])
        amax = __uint_as_float(0x7FC00000u);
    const float clamped = amax < 1e-4f ? 1e-4f : amax;
    const float s = gfw_ue8m0(gfw_ue8m0_ceil_clamped(__fmul_rn(clamped, 1.0f / 448.0f)));
    float w = __fdiv_rn(v, s);
    w = w > 448.0f ? 448.0f : (w < -448.0f ? -448.0f : w);
    return __fmul_rn(gfw_e4m3_to_f32(gfw_e4m3_code(w)), s);
}

/** The fixed combine of the eight chains held by the 8-lane group of the calling lane. */
__device__ __forceinline__ float moe_combine8(float acc)
{
    float p[8];
#pragma unroll
    for (int l = 0; l < 8; l++)
        p[l] = __shfl_sync(0xffffffffu, acc, l, 8);
    return __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[4]), __fadd_rn(p[2], p[6])),
                     __fadd_rn(__fadd_rn(p[1], p[5]), __fadd_rn(p[3], p[7])));
}

/* ================================================================== the chain GEMM core */

/** One weight row as chain l reads it. */
struct moe_row {
    const uint8_t *w;     /**< chain l's first word: row start + l * 4 * vb */
    const uint8_t *s8;    /**< E2M1: the row's UE8M0 scale bytes */
    const float *sf;      /**< E4M3: the row's block-scale row */
    int gpb;              /**< E4M3: groups per scale block, B / (32 vb) */
};

/** The words (and raw scales) of PF groups of NM rows. */
template <int FMT, int VB, int NM, int PF>
struct moe_batch {
    uint32_t w[PF][NM][VB];            /**< chain words */
    uint32_t s[PF][NM][VB == 4 ? 2 : 1]; /**< E2M1: 2 * VB scale bytes per group */
    float f[PF][NM];                   /**< E4M3: the group's block scale */
};

/** Load group @p g (< @p groups) of each row into slot @p q of @p b. */
template <int FMT, int VB, int NM, int PF>
__device__ __forceinline__ void moe_load(moe_batch<FMT, VB, NM, PF> &b, int q, const moe_row (&r)[NM], int64_t g)
{
#pragma unroll
    for (int n = 0; n < NM; n++) {
        const uint8_t *p = r[n].w + g * (32 * VB);
        if (VB == 4) {
            const uint4 v = __ldg((const uint4 *)p);
            b.w[q][n][0] = v.x;
            b.w[q][n][VB > 1 ? 1 : 0] = v.y;
            b.w[q][n][VB > 2 ? 2 : 0] = v.z;
            b.w[q][n][VB > 3 ? 3 : 0] = v.w;
        } else {
            b.w[q][n][0] = __ldg((const unsigned int *)p);
        }
        if (FMT == MOE_WF_FP4) {
            if (VB == 4) {
                const uint2 s = __ldg((const uint2 *)(r[n].s8 + g * 8));
                b.s[q][n][0] = s.x;
                b.s[q][n][VB == 4 ? 1 : 0] = s.y;
            } else {
                b.s[q][n][0] = __ldg((const unsigned short *)(r[n].s8 + g * 2));
            }
        } else if (FMT == MOE_WF_FP8) {
            b.f[q][n] = __ldg(r[n].sf + (int)g / r[n].gpb);
        }
    }
}

/** Elements per 32-bit word. */
template <int FMT> struct moe_epw {
    static const int n = 32 / FMT; /**< elements of FMT bits in 32 */
};

/**
 * Decode word v of slot q of row n into w[] (the oracle's weight values); E2M1 words the
 * DEC way (a one-step group: every scale byte of the slot at most 128, moe_one_step_slot()),
 * E4M3 words two codes per conversion.
 */
template <int FMT, int VB, int NM, int PF, int DEC>
__device__ __forceinline__ void moe_decode(const moe_batch<FMT, VB, NM, PF> &b, int q, int n, int v,
                                           float (&w)[moe_epw<FMT>::n])
{
    const uint32_t word = b.w[q][n][v];
    if (FMT == MOE_WF_FP4 && DEC == MOE_DEC_ONE_STEP) {
        const uint32_t fs = mmoe_moe_one_step_fields(b.s[q][n][v >> 1]);
        const float f0 = mmoe_moe_one_step_factor_of(fs, 2 * (v & 1)), f1 = mmoe_moe_one_step_factor_of(fs, 2 * (v & 1) + 1);
#pragma unroll
        for (int i = 0; i < moe_epw<FMT>::n; i++)
            w[i] = mmoe_moe_tiny_one_step(mmoe_moe_slot_tiny(word, i), i < 4 ? f0 : f1);
    } else if (FMT == MOE_WF_FP4) {
        const uint32_t sb = b.s[q][n][v >> 1] >> (16 * (v & 1));
        const float s0 = gfw_ue8m0((uint8_t)(sb & 0xFF)), s1 = gfw_ue8m0((uint8_t)((sb >> 8) & 0xFF));
#pragma unroll
        for (int i = 0; i < moe_epw<FMT>::n; i++)
            w[i] = mmoe_moe_tiny_two_step(mmoe_moe_slot_tiny(word, i), i < 4 ? s0 : s1);
    } else if (FMT == MOE_WF_FP8) {
        const float s = b.f[q][n];
        float v[moe_epw<FMT>::n];
#pragma unroll
        for (int h = 0; h < moe_epw<FMT>::n / 2; h++)
            moe_e4m3_pair_values(word, h, v[2 * h], v[2 * h + 1]);
#pragma unroll
        for (int i = 0; i < moe_epw<FMT>::n; i++)
            w[i] = __fmul_rn(v[i], s);
    } else {
        w[0] = __uint_as_float(word << 16);
        w[moe_epw<FMT>::n > 1 ? 1 : 0] = __uint_as_float(word & 0xFFFF0000u);
    }
}

/**
 * The staged activation tile of a CTA for token tile TT: each token's eight chains, MC values
 * each, chain after chain with the fixed stride MC + 4 (the four extra floats put the 8
 * chains' 16-byte words in 8 distinct bank quads, MC being a multiple of 64).  MC = 512 / TT
 * values per chain keep the tile at 16 KB (64 values at most at TT = MOE_TT_MAX, the smallest
 * chunk of whole batches).  The stride is a constant so that a chain's reads for its TT tokens
 * are one register plus immediate offsets.
 */
template <int TT> struct moe_xs {
    static const int MC = 512 / TT < 64 ? 64 : 512 / TT; /**< values per chain of a chunk */
    static const int STRIDE = MC + 4;            /**< floats from one staged chain to the next */
    static const int FLOATS = TT * 8 * STRIDE;   /**< the tile's floats */
};

/**
 * Values per chain of one staged chunk: all K8 = K/8 when they fit the tile, else MC (512/TT,
 * a multiple of 64, so a chunk holds whole batches).
 */
template <int TT> __host__ __device__ __forceinline__ int moe_xs_chunk(int64_t K8)
{
    return (int)(K8 < moe_xs<TT>::MC ? K8 : moe_xs<TT>::MC);
}

/** Offset in the staged tile of chain @p l of token @p t, value @p m of the chunk. */
template <int TT> __host__ __device__ __forceinline__ int moe_xs_pos(int t, int l, int m)
{
    return (t * 8 + l) * moe_xs<TT>::STRIDE + m;
}

/**
 * Start the asynchronous copy of 16 bytes (both ends 16-byte aligned) from global to shared
 * memory (a plain load and store before compute capability 8.0, which has no cp.async).
 */
__device__ __forceinline__ void moe_cp16(float *dst, const float *src)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    *(float4 *)dst = __ldg((const float4 *)src);
#else
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(__cvta_generic_to_global(src)) : "memory");
#endif
}

/** Wait for the calling thread's cp.async copies (moe_cp16). */
__device__ __forceinline__ void moe_cp_wait(void)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/**
 * Stage values [c0, c0 + n) of every chain of tokens t < @p nt into @p xs (n <= MC, a
 * multiple of 4), all NTH threads of the CTA together; @p xt[t] is token t's
 * chain-major row of K values (K8 = K / 8 per chain).  Where a chain's chunk has at most
 * NTH / 8 16-byte words (W = MC / 4 <= NTH / 8: the tile of 8 tokens in a CTA of 128),
 * thread i copies word i / 8 of chain i mod 8 of each token, no loop and no division; the 8
 * chains' words of one warp land in 8 distinct bank quads.  Longer chunks (the tiles of 1 to
 * 4 tokens) are copied by TPC = min(W, NTH) consecutive threads per chain, NTH / TPC chains at
 * a time (all compile-time powers of two: shifts, not divisions), each thread stepping by
 * pointer, W / TPC words a chain when the chunk is whole (a count known at compile time, so
 * a one-warp router CTA issues them back to back): a warp's 32 copies are 512 contiguous
 * bytes of one chain at both ends where W >= 32 (a warp copying a 64-byte piece of each of the
 * 8 chains instead measured 10% slower in the one-token kernels: docs/perf.md).
 * The 16-byte copies are asynchronous (cp.async: no registers hold them, all are in flight at
 * once) and cached in L1 (.ca: the other CTAs of the SM stage the same tokens); the caller's
 * barrier after this makes them visible to the CTA.
 */
template <int TT, int NTH, bool FULL>
__device__ __forceinline__ void moe_stage(float *xs, const float *const (&xt)[TT], int nt, int64_t K8, int c0, int n)
{
    static_assert(NTH % 8 == 0, "a thread stages one chain");
    constexpr int W = moe_xs<TT>::MC / 4;
    if constexpr (W <= NTH / 8) {
        const int l = (int)threadIdx.x & 7, q0 = (int)threadIdx.x >> 3;
        if (q0 < n / 4) {
#pragma unroll
            for (int t = 0; t < TT; t++)
                if (FULL || t < nt)
                    moe_cp16(xs + moe_xs_pos<TT>(t, l, 4 * q0), xt[t] + l * K8 + c0 + 4 * q0);
        }
    } else {
        constexpr int TPC = W < NTH ? W : NTH, PASS = NTH / TPC; /* threads per chain, chains at a time */
        static_assert((TPC & (TPC - 1)) == 0 && NTH % TPC == 0 && 8 % PASS == 0, "whole chains per pass");
        const int l0 = PASS == 1 ? 0 : (int)threadIdx.x / TPC, q0 = PASS == 1 ? (int)threadIdx.x : (int)threadIdx.x % TPC;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (FULL || t < nt) {
                const float *chain = xt[t] + l0 * K8 + c0 + 4 * q0;
                float *staged = xs + moe_xs_pos<TT>(t, l0, 4 * q0);
#pragma unroll 1
                for (int l = l0; l < 8; l += PASS, chain += PASS * K8, staged += PASS * moe_xs<TT>::STRIDE) {
                    if (n == 4 * W) {
                        /* a whole chunk: W / TPC words a thread, a count known here, so issued back to back */
#pragma unroll
                        for (int k = 0; k < W / TPC; k++)
                            moe_cp16(staged + 4 * TPC * k, chain + 4 * TPC * k);
                    } else {
                        const float *src = chain;
                        float *dst = staged;
#pragma unroll 1
                        for (int q = q0; q < n / 4; q += TPC, src += 4 * TPC, dst += 4 * TPC)
                            moe_cp16(dst, src);
                    }
                }
            }
        }
    }
    moe_cp_wait();
}

/** Read the staged chain values x[m .. m + EPW) (16-byte aligned for EPW >= 4, 8-byte for 2). */
template <int EPW>
__device__ __forceinline__ void moe_xread(const float *x, float (&xv)[EPW])
{
    if (EPW == 8) {
        const float4 a = *(const float4 *)x, c = *(const float4 *)(x + 4);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
        xv[EPW > 4 ? 4 : 0] = c.x, xv[EPW > 5 ? 5 : 0] = c.y, xv[EPW > 6 ? 6 : 0] = c.z, xv[EPW > 7 ? 7 : 0] = c.w;
    } else if (EPW == 4) {
        const float4 a = *(const float4 *)x;
        xv[0] = a.x, xv[EPW > 1 ? 1 : 0] = a.y, xv[EPW > 2 ? 2 : 0] = a.z, xv[EPW > 3 ? 3 : 0] = a.w;
    } else {
        const float2 a = *(const float2 *)x;
        xv[0] = a.x, xv[EPW > 1 ? 1 : 0] = a.y;
    }
}

/**
 * Whether every scale byte of slot @p q (all NM rows) is at most 128, so that its E2M1 weights
 * decode in one multiply (gpu_moe_decode.h).  Uniform over a warp for real checkpoints, whose
 * scales are all below 2^1.
 */
template <int FMT, int VB, int NM, int PF>
__device__ __forceinline__ int moe_one_step_slot(const moe_batch<FMT, VB, NM, PF> &b, int q)
{
    uint32_t bad = 0;
#pragma unroll
    for (int n = 0; n < NM; n++)
#pragma unroll
        for (int j = 0; j < (VB == 4 ? 2 : 1); j++)
            bad |= !mmoe_moe_one_step_word(b.s[q][n][j]);
    return bad == 0;
}

/**
 * The fma of slot @p q's VB words of NM rows, for tokens t < @p nt: chain @p l's staged values
 * from @p m0 (chunk offset), the weights decoded by moe_decode(), E2M1 the DEC way.  Token t's
 * values lie a constant t * 8 * STRIDE floats after token 0's (moe_xs_pos).
 */
template <int FMT, int VB, int TT, int NM, int PF, int DEC, bool FULL>
__device__ __forceinline__ void moe_group_fma(const moe_batch<FMT, VB, NM, PF> &cur, int q, const float *xs, int l,
                                              int m0, int nt, float (&acc)[NM][TT])
{
    constexpr int EPW = moe_epw<FMT>::n;
    const float *const x0 = xs + moe_xs_pos<TT>(0, l, m0);
#pragma unroll
    for (int v = 0; v < VB; v++) {
        float w[NM][EPW];
#pragma unroll
        for (int n = 0; n < NM; n++)
            moe_decode<FMT, VB, NM, PF, DEC>(cur, q, n, v, w[n]);
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (FULL || t < nt) {
                float xv[EPW];
                moe_xread<EPW>(x0 + (moe_xs_pos<TT>(t, 0, 0) + v * EPW), xv);
#pragma unroll
                for (int n = 0; n < NM; n++)
#pragma unroll
                    for (int i = 0; i < EPW; i++)
                        acc[n][t] = __fmaf_rn(xv[i], w[n][i], acc[n][t]);
            }
        }
    }
}

/**
 * Chain @p l of NM rows over all @p groups groups, for tokens t < @p nt of the tile:
 * acc[n][t] = fma(x_t[m], w_n[m], acc[n][t]) for the chain's elements m in ascending order.
 * @p xt[t] is token t's chain-major row of K = 8 K8 values.  The activations are staged in
 * @p xs (moe_xs) one chunk of every chain at a time, by the whole CTA of NTH threads (so every
 * thread of the CTA calls this, with the same @p nt and @p groups); the weights are loaded
 * one batch of PF groups ahead, across the chunks.  FULL: nt = TT, no token test.
 */
template <int FMT, int VB, int TT, int NM, int PF, int NTH, bool FULL>
__device__ __forceinline__ void moe_chain_run(const moe_row (&r)[NM], const float *const (&xt)[TT], int64_t K8,
                                              int l, int nt, int64_t groups, float *xs, float (&acc)[NM][TT])
{
    constexpr int EPW = moe_epw<FMT>::n;
    static_assert(64 % (PF * VB * EPW) == 0, "a batch must not straddle two staged chunks");
    const int mc = moe_xs_chunk<TT>(K8);
    moe_batch<FMT, VB, NM, PF> cur, nxt;
#pragma unroll
    for (int q = 0; q < PF; q++)
        if (q < groups)
            moe_load(cur, q, r, q);
    int c0 = 0, c_next = 0;
    for (int64_t g0 = 0; g0 < groups; g0 += PF) {
        if ((int)g0 * (VB * EPW) == c_next) {
            if (c_next > 0)
                __syncthreads();
            c0 = c_next;
            const int n_c = (int)(K8 - c0 < mc ? K8 - c0 : mc);
            moe_stage<TT, NTH, FULL>(xs, xt, nt, K8, c0, n_c);
            c_next = c0 + mc;
            __syncthreads();
        }
#pragma unroll
        for (int q = 0; q < PF; q++)
            if (g0 + PF + q < groups)
                moe_load(nxt, q, r, g0 + PF + q);
#pragma unroll
        for (int q = 0; q < PF; q++) {
            if (g0 + q < groups) {
                const int m0 = (int)(g0 + q) * VB * EPW - c0;
                if (FMT == MOE_WF_FP4 && moe_one_step_slot(cur, q))
                    moe_group_fma<FMT, VB, TT, NM, PF, MOE_DEC_ONE_STEP, FULL>(cur, q, xs, l, m0, nt, acc);
                else
                    moe_group_fma<FMT, VB, TT, NM, PF, MOE_DEC_TWO_STEP, FULL>(cur, q, xs, l, m0, nt, acc);
            }
        }
        cur = nxt;
    }
}

/**
 * moe_chain_run() for the item's @p nt tokens: a full tile (nt = TT, always for TT = 1) runs
 * the body without a test per token, a partial one the body that tests t < nt.  With 16
 * tokens the tests do not fit the predicate registers and are recomputed per word (about one
 * in ten of the instructions of the E4M3 rows' loop).
 */
template <int FMT, int VB, int TT, int NM, int PF, int NTH>
__device__ __forceinline__ void moe_chain_dot(const moe_row (&r)[NM], const float *const (&xt)[TT], int64_t K8,
                                              int l, int nt, int64_t groups, float *xs, float (&acc)[NM][TT])
{
    if constexpr (TT == 1)
        moe_chain_run<FMT, VB, TT, NM, PF, NTH, true>(r, xt, K8, l, nt, groups, xs, acc);
    else if (nt == TT)
        moe_chain_run<FMT, VB, TT, NM, PF, NTH, true>(r, xt, K8, l, nt, groups, xs, acc);
    else
        moe_chain_run<FMT, VB, TT, NM, PF, NTH, false>(r, xt, K8, l, nt, groups, xs, acc);
}

/**
 * Groups per batch for a thread of @p r row sets whose one row set loads @p pf groups per
 * batch: the same words in flight (at least one group).
 */
__host__ __device__ constexpr int moe_batch_groups(int pf, int r) { return pf / r > 0 ? pf / r : 1; }

/** Zero the accumulators of NM rows and TT tokens. */
template <int NM, int TT> __device__ __forceinline__ void moe_acc_zero(float (&acc)[NM][TT])
{
#pragma unroll
    for (int n = 0; n < NM; n++)
#pragma unroll
        for (int t = 0; t < TT; t++)
            acc[n][t] = 0.0f;
}

/**
 * The rows a thread reads, @p j + 16 i for i < N, each clamped to @p lim - 1: every thread
 * takes part in the staging, so a row past the matrix (none while lim is a multiple of the
 * CTA's rows) reads the last row and stores nothing.
 */
template <int N> __device__ __forceinline__ void moe_rows_read(int64_t j, int64_t lim, int64_t (&jr)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        jr[i] = j + i * MOE_ROWS < lim ? j + i * MOE_ROWS : lim - 1;
}

/** Groups of a chain-packed row of @p K elements of @p bits bits. */
__host__ __device__ __forceinline__ int64_t moe_groups(int64_t K, int bits, int vb) { return K * bits / 8 / (32 * vb); }

/* ================================================================== kernels */

/** x bf16 [T, D] -> xb (fp32 values) and xq (1x128 E4M3 values), both chain-major; block (D/128, T) x 128. */
__global__ void k_moe_in(const uint16_t *x, int64_t D, float *xb, float *xq)
{
    gfw_pdl_enter();
    const int64_t t = blockIdx.y, k = (int64_t)blockIdx.x * 128 + threadIdx.x;
    const float v = gfw_bf2f(x[t * D + k]);
    const int64_t o = t * D + gfw_moe_chain_pos(k, D);
    xb[o] = v;
    xq[o] = moe_quant128(v);
}

/** Router logits [T, E]: thread (row e, chain l) for tokens blockIdx.y * TT ..; bf16 x bf16, exact products. */
template <int VB, int TT, int PF>
__global__ void __launch_bounds__(MOE_ROUTER_THREADS) k_moe_logits(const uint16_t *gate, const float *xb, int64_t T,
                                                                   int64_t E, int64_t D, float *logits)
{
    gfw_pdl_enter();
    const int l = threadIdx.x & 7;
    const int64_t e = (int64_t)blockIdx.x * MOE_ROUTER_ROWS + (threadIdx.x >> 3);
    const int64_t t0 = (int64_t)blockIdx.y * TT;
    const int nt = (int)(T - t0 < TT ? T - t0 : TT);
    const int valid = e < E;
    __shared__ float4 xs4[moe_xs<TT>::FLOATS / 4]; /* float4: 16-byte aligned */
    float *const xs = (float *)xs4;
    const float *xt[TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        xt[t] = xb + (t0 + (t < nt ? t : 0)) * D;
    float acc[1][TT];
#pragma unroll
    for (int t = 0; t < TT; t++)
        acc[0][t] = 0.0f;
    /* every thread takes part in the staging: a row past E reads row E - 1 and stores nothing */
    const int64_t er = valid ? e : E - 1;
    const moe_row r[1] = {{(const uint8_t *)(gate + er * D) + l * 4 * VB, NULL, NULL, 1}};
    moe_chain_dot<MOE_WF_BF16, VB, TT, 1, PF, MOE_ROUTER_THREADS>(r, xt, D / 8, l, nt, moe_groups(D, 16, VB), xs, acc);
#pragma unroll
    for (int t = 0; t < TT; t++) {
        const float sum = moe_combine8(acc[0][t]);
        if (valid && t < nt && l == (t & 7))
            logits[(t0 + t) * E + e] = sum;
    }
}

/** Floats between two chains' starts in k_moe_logits_one's staged x (four of padding: distinct bank quads). */
__host__ __device__ __forceinline__ int64_t moe_logits_one_xstride(int64_t D) { return D / 8 + 4; }

/** Dynamic shared memory of k_moe_logits_one for width D: the CTA's gate rows, then the staged chains. */
__host__ __device__ __forceinline__ size_t moe_logits_one_smem(int64_t D)
{
    return (size_t)MOE_ROUTER_ROWS * 2 * (size_t)D + sizeof(float) * 8 * (size_t)moe_logits_one_xstride(D);
}

/**
 * The router logits of one token (decode), the same bits as k_moe_logits with TT = 1 and
 * 4-word groups: thread (row e, chain l) sums its chain in ascending order from +0 with fma,
 * then moe_combine8().  What differs is where the operands wait: the CTA's MOE_ROUTER_ROWS
 * gate rows (chain-packed bf16, 2 D bytes each, contiguous) are copied into shared memory with
 * cp.async before the programmatic wait (a weight is no kernel's output, so the copy overlaps
 * the kernel before: the ffn norm), and the token's eight chains of xb after it, all in
 * flight at once.  The chain then reads shared memory only.  Alone the kernel is no faster
 * than k_moe_logits (about 9.5 us at D = 4096: one warp per CTA runs a latency chain of 512
 * fma and their loads either way); in the graphed decode step the copy ahead of the wait is
 * what saves time (docs/perf.md, "Eleventh pass").  Layout: row r's chain l, group g (8 values,
 * m = 8 g .. 8 g + 7) at byte 2 D r + 128 g + 16 l, as in the packed row; chain l's values
 * at floats l moe_logits_one_xstride(D) + m, the 8 chains of one read in distinct bank quads.
 */
__global__ void __launch_bounds__(MOE_ROUTER_THREADS) k_moe_logits_one(const uint16_t *gate, const float *xb,
                                                                       int64_t E, int64_t D, float *logits)
{
    extern __shared__ __align__(16) uint8_t lg_sm[];
    const int l = threadIdx.x & 7, row = threadIdx.x >> 3;
    const int64_t e0 = (int64_t)blockIdx.x * MOE_ROUTER_ROWS;
    const int rows = (int)(E - e0 < MOE_ROUTER_ROWS ? E - e0 : MOE_ROUTER_ROWS);
    const int64_t K8 = D / 8, xstride = moe_logits_one_xstride(D), row_bytes = 2 * D;
    float *const xs = (float *)(lg_sm + MOE_ROUTER_ROWS * row_bytes);
    const uint8_t *src = (const uint8_t *)(gate + e0 * D);
    for (int64_t i = threadIdx.x; i < rows * row_bytes / 16; i += blockDim.x)
        cp_async16(lg_sm + 16 * i, src + 16 * i);
    cp_async_commit();
    gfw_pdl_enter();
    for (int64_t i = threadIdx.x; i < 2 * D / 8; i += blockDim.x) { /* 4 floats a copy, K8 / 4 copies a chain */
        const int64_t c = i / (K8 / 4), q = i % (K8 / 4);
        cp_async16(xs + c * xstride + 4 * q, xb + c * K8 + 4 * q);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    const uint8_t *wl = lg_sm + (row < rows ? row : rows - 1) * row_bytes + 16 * l;
    const float *xl = xs + l * xstride;
    float acc = 0.0f;
    for (int64_t g = 0; g < K8 / 8; g++) {
        const uint4 v = *(const uint4 *)(wl + 128 * g);
        const float4 xa = *(const float4 *)(xl + 8 * g), xc = *(const float4 *)(xl + 8 * g + 4);
        acc = __fmaf_rn(xa.x, __uint_as_float(v.x << 16), acc);
        acc = __fmaf_rn(xa.y, __uint_as_float(v.x & 0xFFFF0000u), acc);
        acc = __fmaf_rn(xa.z, __uint_as_float(v.y << 16), acc);
        acc = __fmaf_rn(xa.w, __uint_as_float(v.y & 0xFFFF0000u), acc);
        acc = __fmaf_rn(xc.x, __uint_as_float(v.z << 16), acc);
        acc = __fmaf_rn(xc.y, __uint_as_float(v.z & 0xFFFF0000u), acc);
        acc = __fmaf_rn(xc.z, __uint_as_float(v.w << 16), acc);
        acc = __fmaf_rn(xc.w, __uint_as_float(v.w & 0xFFFF0000u), acc);
    }
    const float sum = moe_combine8(acc);
    if (row < rows && l == 0)
        logits[e0 + row] = sum;
}

/** The index among the held experts of global expert @p e, or -1 (masked, or held by another rank). */
__device__ __forceinline__ int64_t moe_held_id(int64_t e, int64_t first, int64_t held)
{
    return e >= first && e < first + held ? e - first : -1;
}

/**
 * Does candidate @p a (expert @p ea) beat @p b (expert @p eb) in the top-k's order: any
 * candidate beats none (id -1), a number beats NaN, a larger number a smaller one, and
 * otherwise (equal numbers, +0 and -0 alike, or two NaN) the lower id wins.  This is a total
 * order, and a scan in ascending id keeping the winner is moe_router.c's rule (strictly
 * greater replaces; a NaN never beats a number), so its maximum does not depend on the order
 * in which candidates meet.
 */
__device__ __forceinline__ int moe_beats(float a, int64_t ea, float b, int64_t eb)
{
    if (ea < 0)
        return 0;
    if (eb < 0)
        return 1;
    const int na = isnan(a), nb = isnan(b);
    if (na != nb)
        return nb;
    if (!na && a != b)
        return a > b;
    return ea < eb;
}

/** The router's score of logit @p z (moe_router.c): sqrt(softplus(z)), softplus = z above 20. */
__device__ __forceinline__ float moe_route_score(float z)
{
    return __fsqrt_rn(z > 20.0f ? z : mmoe_log1pf(gfw_expf(z)));
}

/** The selection value of score @p s with bias @p b (0 without a bias): s + b, rounded once. */
__device__ __forceinline__ float moe_route_sel(float s, float b) { return __fadd_rn(s, b); }

/** A slot's routing weight: (its score @p s / the sum @p sum of the token's slot scores) times @p scale. */
__device__ __forceinline__ float moe_route_weight(float s, float sum, float scale)
{
    return __fmul_rn(__fdiv_rn(s, sum), scale);
}

/**
 * The key of a selection value in moe_beats()'s order of numbers and NaN, as an unsigned
 * integer: a larger key for a larger number, one key for +0 and -0, 0 for every NaN (below
 * -inf's key, 0x007fffff).  The bits of a float order its magnitude; a negative one's are
 * flipped so that a larger magnitude gives a smaller key, and a positive one's sign bit is set
 * so that it is above every negative.  With the id as the tie-break (the lower wins) this is
 * moe_beats() for any two candidates.
 */
__device__ __forceinline__ uint32_t moe_order_key(float v)
{
    if (isnan(v))
        return 0u;
    const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/**
 * The plan's sort key of held expert @p e (E: the shared expert): the shared expert before
 * every routed one, the routed ones in ascending id (see "The plan" in the file's chapter).
 */
__device__ __forceinline__ int64_t moe_plan_key(int64_t e, int64_t E) { return e == E ? -1 : e; }

/**
 * Task @p q (key @p kq) counted for task @p p (key @p kp): the tasks of a lower key (@p lt),
 * of p's key (@p same) and of p's key before p (@p before); p's rank in the plan is lt + before.
 */
__device__ __forceinline__ void moe_plan_tally(int64_t kp, int64_t p, int64_t kq, int64_t q, int &lt, int &same,
                                               int &before)
{
    lt += kq < kp;
    same += kq == kp;
    before += kq == kp && q < p;
}

/**
 * The plan's flag at a task's rank: the tasks of the item it starts (at most @p TT of the
 * @p same - @p before left of its expert), or 0 when an item of its expert started before it.
 */
__device__ __forceinline__ int32_t moe_plan_flag(int before, int same, int TT)
{
    return before % TT == 0 ? (same - before < TT ? same - before : TT) : 0;
}

/** Warps of the routing / planning CTA. */
#define MOE_PLAN_WARPS (MOE_PLAN_THREADS / 32)

/**
 * The plan's bucket of task @p p: its sort key (moe_plan_key()) + 1, so the shared expert's
 * tasks 0 and held routed expert e's e + 1; -1 for a task whose expert is not held
 * (moe_held_id()).
 */
__device__ __forceinline__ int moe_plan_bucket(const int32_t *idx, int64_t p, int64_t Tk, int64_t E, int64_t first,
                                               int64_t held)
{
    const int64_t ep = p < Tk ? moe_held_id(idx[p], first, held) : E;
    return ep < 0 ? -1 : (int)moe_plan_key(ep, E) + 1;
}

/** Dynamic shared memory of the plan's counting sort for @p held held experts (k_moe_route_plan). */
static size_t moe_plan_smem(int64_t held)
{
    return sizeof(int) * (size_t)(held + 1) * (MOE_PLAN_WARPS + 2);
}

/**
 * The plan (see the file's chapter) of the @p n tasks by a stable counting sort over the
 * @p NB = held + 1 buckets (moe_plan_bucket()), the same order as moe_plan_tally()'s ranks:
 * warp v takes a contiguous range of the tasks, counts its tasks per bucket (32 at a time,
 * __match_any_sync()), the counts are scanned over the warps and then the buckets, and each
 * warp walks its range again to place its tasks at their ranks, in task order within a bucket;
 * then one pass over the ranks numbers the items (a block scan of the flags).  @p sm:
 * moe_plan_smem() bytes.
 */
__device__ void moe_plan_counting(const int32_t *idx, int64_t Tk, int64_t n, int64_t E, int64_t first, int64_t held,
                                  int TT, gfw_moe_work w, int *sm)
{
    __shared__ int warp_sum[MOE_PLAN_WARPS];
    __shared__ int carry_sh;
    const int NB = (int)held + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int *wc = sm, *tot = sm + MOE_PLAN_WARPS * NB, *off = tot + NB; /* wc[v][b]: warp v's tasks of bucket b */
    for (int i = threadIdx.x; i < MOE_PLAN_WARPS * NB; i += blockDim.x)
        wc[i] = 0;
    __syncthreads();
    const int64_t per = (n + MOE_PLAN_WARPS - 1) / MOE_PLAN_WARPS, lo = warp * per, hi = lo + per < n ? lo + per : n;
    for (int64_t p0 = lo; p0 < hi; p0 += 32) {
        const int b = p0 + lane < hi ? moe_plan_bucket(idx, p0 + lane, Tk, E, first, held) : -1;
        const unsigned same = __match_any_sync(0xFFFFFFFFu, b);
        if (b >= 0 && lane == __ffs(same) - 1)
            wc[warp * NB + b] += __popc(same);
        __syncwarp();
    }
    __syncthreads();
    for (int b = threadIdx.x; b < NB; b += blockDim.x) { /* wc: exclusive over the warps; tot: the bucket's */
        int acc = 0;
        for (int v = 0; v < MOE_PLAN_WARPS; v++) {
            const int c = wc[v * NB + b];
            wc[v * NB + b] = acc;
            acc += c;
        }
        tot[b] = acc;
    }
    __syncthreads();
    if (warp == 0) { /* off: exclusive over the buckets, lane l a segment of them */
        const int seg = (NB + 31) / 32, b0 = lane * seg, b1 = b0 + seg < NB ? b0 + seg : NB;
        int part = 0;
        for (int b = b0; b < b1; b++)
            part += tot[b];
        int incl = part;
        for (int o = 1; o < 32; o <<= 1) {
            const int other = __shfl_up_sync(0xFFFFFFFFu, incl, o);
            if (lane >= o)
                incl += other;
        }
        int run = incl - part;
        for (int b = b0; b < b1; b++) {
            off[b] = run;
            run += tot[b];
        }
        if (lane == 31)
            carry_sh = incl; /* the valid tasks */
    }
    __syncthreads();
    const int n_valid = carry_sh;
    for (int i = threadIdx.x; i < MOE_PLAN_WARPS * NB; i += blockDim.x)
        wc[i] += off[i % NB];
    __syncthreads();
    for (int64_t p0 = lo; p0 < hi; p0 += 32) {
        const int64_t p = p0 + lane;
        const int b = p < hi ? moe_plan_bucket(idx, p, Tk, E, first, held) : -1;
        const unsigned same = __match_any_sync(0xFFFFFFFFu, b);
        if (b >= 0) {
            const int rank = wc[warp * NB + b] + __popc(same & ((1u << lane) - 1u));
            w.order[rank] = (int32_t)p;
            w.flag[rank] = moe_plan_flag(rank - off[b], tot[b], TT);
        }
        __syncwarp();
        if (b >= 0 && lane == __ffs(same) - 1)
            wc[warp * NB + b] += __popc(same);
        __syncwarp();
    }
    __syncthreads();
    int carry = 0; /* items numbered before this chunk of ranks */
    for (int r0 = 0; r0 < n_valid; r0 += blockDim.x) {
        const int rk = r0 + (int)threadIdx.x;
        const int32_t f = rk < n_valid ? w.flag[rk] : 0;
        const unsigned starts = __ballot_sync(0xFFFFFFFFu, f != 0);
        if (lane == 0)
            warp_sum[warp] = __popc(starts);
        __syncthreads();
        int before = carry + __popc(starts & ((1u << lane) - 1u)), chunk = 0;
        for (int v = 0; v < MOE_PLAN_WARPS; v++) {
            before += v < warp ? warp_sum[v] : 0;
            chunk += warp_sum[v];
        }
        if (f != 0) {
            const int64_t p = w.order[rk];
            w.items[before] = make_int4((int)(p < Tk ? moe_held_id(idx[p], first, held) : E), rk, f, 0);
        }
        carry += chunk;
        __syncthreads(); /* warp_sum is read before the next chunk writes it */
    }
    if (threadIdx.x == 0)
        *w.n_items = carry;
}

/**
 * Routing and the plan, one CTA.  Routing (unless @p given; moe_router.c): s = sqrt(softplus(z))
 * over all (token, expert) in parallel, then one warp per token: for each slot, every lane
 * scans its experts e = lane, lane + 32, .. in ascending order for the best not yet taken
 * (moe_beats on s + bias), and a butterfly of shuffles takes the best of the 32, the same
 * expert as one thread's scan over all of them; or the hash table's row;
 * w = (s[idx] / sum) * scale with the sum in slot order.  The plan: see the file's chapter;
 * @p TT tasks per item.
 */
__global__ void __launch_bounds__(MOE_PLAN_THREADS)
    k_moe_route_plan(float *scores, const float *bias, const int32_t *tid2eid, const int32_t *ids, int64_t T,
                     int64_t E, int k, float route_scale, int given, int has_shared, int TT, int64_t first,
                     int64_t held, int32_t *idx, float *wts, gfw_moe_work w)
{
    gfw_pdl_enter();
    if (!given) {
        for (int64_t i = threadIdx.x; i < T * E; i += blockDim.x) {
            scores[i] = moe_route_score(scores[i]);
        }
        __syncthreads();
        const int lane = threadIdx.x & 31;
        for (int64_t t = threadIdx.x >> 5; t < T; t += MOE_PLAN_THREADS / 32) {
            const float *s = scores + t * E;
            int32_t *ti = idx + t * k;
            if (tid2eid) {
                for (int j = lane; j < k; j += 32)
                    ti[j] = tid2eid[(int64_t)ids[t] * k + j];
            } else {
                for (int j = 0; j < k; j++) {
                    int64_t best = -1;
                    float bsel = 0.0f;
                    for (int64_t e = lane; e < E; e += 32) {
                        int taken = 0;
                        for (int p = 0; p < j; p++)
                            taken |= ti[p] == e;
                        if (taken)
                            continue;
                        const float sel = moe_route_sel(s[e], bias ? bias[e] : 0.0f);
                        if (moe_beats(sel, e, bsel, best)) {
                            best = e;
                            bsel = sel;
                        }
                    }
                    for (int o = 16; o > 0; o >>= 1) {
                        const float osel = __shfl_xor_sync(0xffffffffu, bsel, o);
                        const int64_t obest = __shfl_xor_sync(0xffffffffu, best, o);
                        if (moe_beats(osel, obest, bsel, best)) {
                            best = obest;
                            bsel = osel;
                        }
                    }
                    if (lane == 0)
                        ti[j] = (int32_t)best;
                    __syncwarp();
                }
            }
            __syncwarp();
            if (lane == 0) {
                float sum = 0.0f;
                for (int j = 0; j < k; j++)
                    sum = __fadd_rn(sum, s[ti[j]]);
                for (int j = 0; j < k; j++)
                    wts[t * k + j] = moe_route_weight(s[ti[j]], sum, route_scale);
            }
        }
    }
    const int64_t Tk = T * k, n = Tk + (has_shared ? T : 0);
    extern __shared__ int plan_sm[];
    __syncthreads(); /* the routing's writes to idx are the block's: visible after a barrier */
    moe_plan_counting(idx, Tk, n, E, first, held, TT, w, plan_sm);
}

/**
 * The one-token router and plan (T = 1, E <= MOE_PLAN_ONE_E_MAX, at most 32 tasks): the same
 * outputs, bit for bit, as k_moe_route_plan, with the values kept in registers instead of read
 * back from global memory between the steps.  Every thread computes the score of one expert
 * (k_moe_route_plan's operations; the bias, a weight, is loaded before the programmatic wait)
 * into shared memory; then one warp finishes: lane l holds the keys (moe_order_key()) of the
 * selection values of experts l, l + 32, .. (MOE_PLAN_ONE_PER of them), and each slot's expert
 * is the largest key of the lanes' bests, the lowest id among equal keys (two warp reductions:
 * moe_beats()'s order), a taken expert marked in its lane's mask instead of looked up in idx.
 * The plan: lane p holds task p (the routed slots, then the shared expert's task), its rank is
 * counted over the other lanes' keys by shuffles, and the items' positions come from one
 * ballot of the ranks that start an item.
 */
__global__ void __launch_bounds__(MOE_PLAN_ONE_E_MAX)
    k_moe_route_plan_one(float *scores, const float *bias, const int32_t *tid2eid, const int32_t *ids, int64_t E,
                         int k, float route_scale, int given, int has_shared, int TT, int64_t first, int64_t held,
                         int32_t *idx, float *wts, gfw_moe_work w)
{
    __shared__ float s_score[MOE_PLAN_ONE_E_MAX], s_sel[MOE_PLAN_ONE_E_MAX];
    __shared__ int32_t s_order[32], s_flag[32];
    const int e_mine = threadIdx.x;
    const float b_mine = bias && e_mine < E ? bias[e_mine] : 0.0f;
    gfw_pdl_enter();
    if (!given && e_mine < E) {
        const float sc = moe_route_score(scores[e_mine]);
        scores[e_mine] = sc;
        s_score[e_mine] = sc;
        s_sel[e_mine] = moe_route_sel(sc, b_mine);
    }
    __syncthreads();
    if (threadIdx.x >= 32)
        return;
    const int lane = threadIdx.x;
    int32_t my_idx = -1; /* lane j < k: slot j's expert */
    if (!given) {
        if (tid2eid) {
            if (lane < k)
                my_idx = tid2eid[(int64_t)ids[0] * k + lane];
        } else {
            uint32_t key[MOE_PLAN_ONE_PER]; /* moe_order_key() of the selection values */
#pragma unroll
            for (int i = 0; i < MOE_PLAN_ONE_PER; i++)
                key[i] = lane + 32 * i < E ? moe_order_key(s_sel[lane + 32 * i]) : 0u;
            unsigned taken = 0;
            for (int j = 0; j < k; j++) {
                /* the lane's best: ascending e, strictly greater replaces (ties keep the lower id) */
                uint32_t bkey = 0; /* 0: no candidate; else key + 1 */
                int be = 0;
#pragma unroll
                for (int i = 0; i < MOE_PLAN_ONE_PER; i++) {
                    const int e = lane + 32 * i;
                    if (e < E && !(taken >> i & 1u) && key[i] + 1u > bkey) {
                        bkey = key[i] + 1u;
                        be = e;
                    }
                }
                /* the warp's best: the largest key, then the lowest id among the lanes holding it */
                const uint32_t top = __reduce_max_sync(0xffffffffu, bkey);
                const int best = top == 0 ? -1 : (int)__reduce_min_sync(0xffffffffu, bkey == top ? (uint32_t)be : ~0u);
                if (best >= 0 && (best & 31) == lane)
                    taken |= 1u << (best >> 5);
                if (lane == j)
                    my_idx = best;
            }
        }
        /* the weights: slot j's score, summed in slot order */
        const float my_s = lane < k && my_idx >= 0 ? s_score[my_idx] : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < k; j++)
            sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, my_s, j));
        if (lane < k) {
            idx[lane] = my_idx;
            wts[lane] = moe_route_weight(my_s, sum, route_scale);
        }
    } else if (lane < k) {
        my_idx = idx[lane];
    }
    /* the plan: task p (lane p) is slot p's, or the shared expert's (p = k) */
    const int n = k + (has_shared ? 1 : 0);
    const int64_t ep = lane < k ? moe_held_id(my_idx, first, held) : (lane < n ? E : -1);
    const int64_t kp = moe_plan_key(ep, E);
    int lt = 0, same = 0, before = 0;
    for (int q = 0; q < n; q++) {
        const int64_t eq = __shfl_sync(0xffffffffu, ep, q);
        if (eq >= 0)
            moe_plan_tally(kp, lane, moe_plan_key(eq, E), q, lt, same, before);
    }
    const int valid = ep >= 0;
    const int n_valid = __popc(__ballot_sync(0xffffffffu, valid));
    const int rank = lt + before;
    if (valid) {
        const int32_t flag = moe_plan_flag(before, same, TT);
        w.order[rank] = lane;
        w.flag[rank] = flag;
        s_order[rank] = lane;
        s_flag[rank] = flag;
    }
    __syncwarp();
    const int starts = lane < n_valid && s_flag[lane] != 0;
    const unsigned starts_mask = __ballot_sync(0xffffffffu, starts);
    const int64_t e = __shfl_sync(0xffffffffu, ep, lane < n_valid ? s_order[lane] : 0);
    if (starts)
        w.items[__popc(starts_mask & ((1u << lane) - 1u))] = make_int4((int)e, lane, s_flag[lane], 0);
    if (lane == 0)
        *w.n_items = __popc(starts_mask);
}

/**
 * The plan of the shared expert's tasks alone (moe_run_split()): rank r is task T k + r (token
 * r's shared row), items of TT tasks in token order, as k_moe_route_plan would cut them (the
 * shared expert's run of the full plan, without the routed experts' runs).  One block.
 */
__global__ void k_moe_shared_plan(int64_t T, int k, int64_t E, int TT, gfw_moe_work w)
{
    gfw_pdl_enter(); /* no programmatic prerequisite: lets the shared L1 launch early */
    const int64_t n_items = (T + TT - 1) / TT;
    for (int64_t r = threadIdx.x; r < T; r += blockDim.x) {
        w.order[r] = (int32_t)(T * k + r);
        w.flag[r] = r % TT == 0 ? (int32_t)(T - r < TT ? T - r : TT) : 0;
    }
    for (int64_t i = threadIdx.x; i < n_items; i += blockDim.x)
        w.items[i] = make_int4((int)E, (int)(i * TT), (int)(T - i * TT < TT ? T - i * TT : TT), 0);
    if (threadIdx.x == 0)
        *w.n_items = (int32_t)n_items;
}

/**
 * L1 and the dsv4-ref epilogue for R = MOE_ROW_SETS(TT) sets of 16 rows of one item: thread
 * (row j, chain l) runs chain l of the gate and the up row j + 16 i, i < R, for the item's
 * tokens.  Task p < T*k is (token p/k, slot p%k) of expert idx[p] with weight wts[p]; task
 * T*k + t is token t's shared expert (weight 1).
 * h[p, j] = bf16((silu(g) * u) * w) with g, u = bf16 of the sums, clamped, silu = g / (1 + exp(-g)).
 */
template <int VB, int TT>
__global__ void __launch_bounds__(MOE_THREADS, MOE_MIN_CTAS(VB, TT)) k_moe_l1(dmoe m, gfw_moe_work w, const float *xq, const float *wts,
                                                         int64_t T, int64_t width, float *h)
{
    gfw_pdl_enter();
    constexpr int R = MOE_ROW_SETS(TT), NM = 2 * R;
    if ((int)blockIdx.y >= *w.n_items)
        return;
    const int4 it = w.items[blockIdx.y];
    const int shared = it.x == m.E;
    const int64_t Iw = shared ? m.Ws : m.I, j0 = (int64_t)blockIdx.x * (R * MOE_ROWS);
    if (j0 >= Iw)
        return;
    const int l = threadIdx.x & 7;
    const int64_t j = j0 + (threadIdx.x >> 3), D = m.D;
    const int nt = it.z;
    int32_t task[TT]; /* the plan's task ids, 32 bits (one register each) */
    const float *xt[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) {
        task[t] = w.order[it.y + (t < nt ? t : 0)];
        const int64_t tok = shared ? (int64_t)task[t] - T * m.k : (int64_t)task[t] / m.k;
        xt[t] = xq + tok * D;
    }
    __shared__ float4 xs4[moe_xs<TT>::FLOATS / 4]; /* float4: 16-byte aligned */
    float *const xs = (float *)xs4;
    float acc[NM][TT]; /* acc[2 i], acc[2 i + 1]: gate and up row j + 16 i */
    moe_acc_zero(acc);
    int64_t jr[R];
    moe_rows_read(j, Iw, jr);
    moe_row r[NM];
    if (shared) {
        const int scols = (int)((D + m.B - 1) / m.B);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float *srow1 = m.ss1 + (jr[i] / m.B) * scols, *srow3 = m.ss3 + (jr[i] / m.B) * scols;
            r[2 * i] = moe_row{m.sw1 + jr[i] * D + l * 4 * VB, NULL, srow1, m.B / (32 * VB)};
            r[2 * i + 1] = moe_row{m.sw3 + jr[i] * D + l * 4 * VB, NULL, srow3, m.B / (32 * VB)};
        }
        moe_chain_dot<MOE_WF_FP8, VB, TT, NM, moe_batch_groups(MOE_L1_SHARED_PF(VB), R), MOE_THREADS>(
            r, xt, D / 8, l, nt, moe_groups(D, 8, VB), xs, acc);
    } else {
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int64_t row = (int64_t)it.x * m.I + jr[i];
            r[2 * i] = moe_row{m.w1 + row * (D / 2) + l * 4 * VB, m.s1 + row * (D / 32), NULL, 1};
            r[2 * i + 1] = moe_row{m.w3 + row * (D / 2) + l * 4 * VB, m.s3 + row * (D / 32), NULL, 1};
        }
        moe_chain_dot<MOE_WF_FP4, VB, TT, NM, moe_batch_groups(4 / VB, R), MOE_THREADS>(r, xt, D / 8, l, nt,
                                                                                         moe_groups(D, 4, VB), xs, acc);
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            const float gsum = moe_combine8(acc[2 * i][t]), usum = moe_combine8(acc[2 * i + 1][t]);
            const int64_t ji = j + i * MOE_ROWS;
            if (ji >= Iw || t >= nt || l != (t & 7))
                continue;
            const float wt = shared ? 1.0f : wts[task[t]];
            float gf = gfw_bfr(gsum), uf = gfw_bfr(usum);
            if (m.limit > 0.0f && !isinf(m.limit)) {
                if (gf > m.limit)
                    gf = m.limit;
                if (uf > m.limit)
                    uf = m.limit;
                else if (uf < -m.limit)
                    uf = -m.limit;
            }
            const float silu = __fdiv_rn(gf, __fadd_rn(1.0f, gfw_expf(-gf)));
            const float a = __fmul_rn(__fmul_rn(silu, uf), wt);
            h[(int64_t)task[t] * width + ji] = gfw_bfr(a);
        }
    }
}

/**
 * h rows -> 1x128 E4M3 values, chain-major over the task's width; block (width/128, tasks) x
 * 128 for the tasks p0, p0 + 1, ...
 */
__global__ void k_moe_requant(dmoe m, const int32_t *idx, int64_t T, const float *h, int64_t width, float *hq,
                              int64_t p0)
{
    gfw_pdl_enter();
    const int64_t p = p0 + blockIdx.y, k = (int64_t)blockIdx.x * 128 + threadIdx.x;
    const int shared = p >= T * m.k;
    const int64_t Iw = shared ? m.Ws : m.I;
    if ((!shared && moe_held_id(idx[p], m.first, m.held) < 0) || (int64_t)blockIdx.x * 128 >= Iw)
        return;
    hq[p * width + gfw_moe_chain_pos(k, Iw)] = moe_quant128(h[p * width + k]);
}

/**
 * Output rows per thread of k_moe_l2: rows n and n + MOE_ROWS of a CTA of 2 MOE_ROWS rows, so
 * that a decode step's L2 grid (D / 32 CTAs per item) runs in one wave like L1's instead of two.
 */
#define MOE_L2_NM 2
/**
 * Groups per batch of k_moe_l2: one 4-word E2M1 group of each of the two rows in flight (two
 * spill in the loop), two E4M3 groups each (as the shared expert's L1).
 */
#define MOE_L2_PF(VB, FMT) ((FMT) == MOE_WF_FP4 ? 4 / (VB) : 8 / (VB))

/**
 * L2 for NM = MOE_L2_NM MOE_ROW_SETS(TT) sets of 16 output rows of one item:
 * slot_y[p, n] = bf16(sum), thread (row n, chain l) runs chain l of rows n + 16 i, i < NM.
 */
template <int VB, int TT>
__global__ void __launch_bounds__(MOE_THREADS, MOE_MIN_CTAS(VB, TT)) k_moe_l2(dmoe m, gfw_moe_work w, int64_t T, int64_t width,
                                                         uint16_t *slot_y)
{
    gfw_pdl_enter();
    constexpr int R = MOE_ROW_SETS(TT), NM = MOE_L2_NM * R;
    if ((int)blockIdx.y >= *w.n_items)
        return;
    const int4 it = w.items[blockIdx.y];
    const int shared = it.x == m.E;
    const int64_t Iw = shared ? m.Ws : m.I, D = m.D;
    const int l = threadIdx.x & 7;
    const int64_t n = (int64_t)blockIdx.x * (NM * MOE_ROWS) + (threadIdx.x >> 3);
    const int nt = it.z;
    int32_t task[TT]; /* the plan's task ids, 32 bits (one register each) */
    const float *xt[TT];
#pragma unroll
    for (int t = 0; t < TT; t++) {
        task[t] = w.order[it.y + (t < nt ? t : 0)];
        xt[t] = w.hq + (int64_t)task[t] * width;
    }
    __shared__ float4 xs4[moe_xs<TT>::FLOATS / 4]; /* float4: 16-byte aligned */
    float *const xs = (float *)xs4;
    float acc[NM][TT];
    moe_acc_zero(acc);
    int64_t nr[NM];
    moe_rows_read(n, D, nr);
    moe_row r[NM];
    if (shared) {
        const int scols = (int)((Iw + m.B - 1) / m.B);
#pragma unroll
        for (int i = 0; i < NM; i++)
            r[i] = moe_row{m.sw2 + nr[i] * Iw + l * 4 * VB, NULL, m.ss2 + (nr[i] / m.B) * scols, m.B / (32 * VB)};
        moe_chain_dot<MOE_WF_FP8, VB, TT, NM, moe_batch_groups(MOE_L2_PF(VB, MOE_WF_FP8), R), MOE_THREADS>(
            r, xt, Iw / 8, l, nt, moe_groups(Iw, 8, VB), xs, acc);
    } else {
#pragma unroll
        for (int i = 0; i < NM; i++) {
            const int64_t row = (int64_t)it.x * D + nr[i];
            r[i] = moe_row{m.w2 + row * (Iw / 2) + l * 4 * VB, m.s2 + row * (Iw / 32), NULL, 1};
        }
        moe_chain_dot<MOE_WF_FP4, VB, TT, NM, moe_batch_groups(MOE_L2_PF(VB, MOE_WF_FP4), R), MOE_THREADS>(
            r, xt, Iw / 8, l, nt, moe_groups(Iw, 4, VB), xs, acc);
    }
#pragma unroll
    for (int t = 0; t < TT; t++) {
#pragma unroll
        for (int i = 0; i < NM; i++) {
            const float sum = moe_combine8(acc[i][t]);
            const int64_t ni = n + i * MOE_ROWS;
            if (ni < D && t < nt && l == (t & 7))
                slot_y[(int64_t)task[t] * D + ni] = gfw_f2bf(sum);
        }
    }
}

/** Combine (moe_combine.c, dsv4-ref order): gfw_moe_combine_channel() for every (token, channel). */
__global__ void k_moe_combine(const uint16_t *slot_y, const int32_t *idx, int64_t T, int k, int64_t D, int has_shared,
                              uint16_t *y)
{
    gfw_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * D)
        return;
    y[i] = gfw_moe_combine_channel(slot_y, idx, T, k, D, has_shared, i / D, i % D);
}

/**
 * Chain-pack @p rows rows of @p row_bytes bytes of @p bits-bit elements in place: one thread
 * per group of 8 * vb words (see the chapter).
 */
__global__ void k_moe_pack(uint8_t *base, int64_t rows, int64_t row_bytes, int bits, int vb)
{
    gfw_pdl_enter();
    const int64_t per_row = row_bytes / (32 * vb);
    const int64_t gi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (gi >= rows * per_row)
        return;
    uint32_t *p = (uint32_t *)(base + (gi / per_row) * row_bytes + (gi % per_row) * (32 * vb));
    uint32_t src[32], dst[32];
    const int nw = 8 * vb, epw = 32 / bits;
    const uint32_t mask = bits == 32 ? 0xFFFFFFFFu : ((1u << bits) - 1u);
    for (int i = 0; i < nw; i++) {
        src[i] = p[i];
        dst[i] = 0;
    }
    for (int e = 0; e < nw * epw; e++) {
        const uint32_t v = (src[e / epw] >> ((e % epw) * bits)) & mask;
        const int l = e % 8, c = e / 8;
        dst[l * vb + c / epw] |= v << ((c % epw) * bits);
    }
    for (int i = 0; i < nw; i++)
        p[i] = bits == MOE_WF_FP4 ? mmoe_moe_slot_word(dst[i]) : dst[i];
}

/* ================================================================== host side */

/** Blocks of @p threads for @p n threads. */
static unsigned moe_nblk(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/** 256-aligned bytes. */
static size_t moe_al(size_t b) { return (b + 255) & ~(size_t)255; }

size_t gfw_moe_work_bytes(int64_t Tm, int64_t D, int64_t kmax, int64_t width)
{
    const size_t tasks = (size_t)(Tm * (kmax + 1));
    return moe_al(sizeof(float) * (size_t)(Tm * D)) + moe_al(sizeof(float) * tasks * (size_t)width) +
           2 * moe_al(sizeof(int32_t) * tasks) + moe_al(sizeof(int4) * tasks) + moe_al(sizeof(int32_t));
}

void gfw_moe_work_carve(void *base, int64_t Tm, int64_t D, int64_t kmax, int64_t width, gfw_moe_work *w)
{
    const size_t tasks = (size_t)(Tm * (kmax + 1));
    uint8_t *p = (uint8_t *)base;
    w->xb = (float *)p;
    p += moe_al(sizeof(float) * (size_t)(Tm * D));
    w->hq = (float *)p;
    p += moe_al(sizeof(float) * tasks * (size_t)width);
    w->order = (int32_t *)p;
    p += moe_al(sizeof(int32_t) * tasks);
    w->flag = (int32_t *)p;
    p += moe_al(sizeof(int32_t) * tasks);
    w->items = (int4 *)p;
    p += moe_al(sizeof(int4) * tasks);
    w->n_items = (int32_t *)p;
}

const char *gfw_moe_unsupported(int64_t D, int64_t I, int64_t Ws, int B, int64_t held, int64_t tasks)
{
    static_assert(MOE_PLAN_HELD_MAX == 2048, "the sentence below names the limit");
    if (held > MOE_PLAN_HELD_MAX)
        return "more experts on one GPU than the plan's 2048 (MOE_PLAN_HELD_MAX)";
    if (tasks >= ((int64_t)1 << 31))
        return "max_tokens x (top-k + 1) tasks must be below 2^31 (the plan's ranks are int)";
    if (D % 128 != 0 || I % 128 != 0)
        return "the model width and the experts' intermediate width must be multiples of 128";
    if (Ws > 0 && (Ws % 128 != 0 || B <= 0 || B % 32 != 0))
        return "the shared expert's width must be a multiple of 128 and its scale block of 32";
    return NULL;
}

cudaError_t gfw_moe_upload_tables(const unsigned long long tab[32])
{
    const cudaError_t ce = cudaMemcpyToSymbol(c_exp2_tab, tab, sizeof(unsigned long long) * 32);
    if (ce != cudaSuccess)
        return ce;
    const cudaError_t cl = cudaFuncSetAttribute(k_moe_logits_one, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                MOE_LOGITS_ONE_SMEM_MAX);
    if (cl != cudaSuccess)
        return cl;
    return cudaFuncSetAttribute(k_moe_route_plan, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)moe_plan_smem(MOE_PLAN_HELD_MAX));
}

/** Chain-pack one matrix in place (nothing for NULL). */
static cudaError_t moe_pack1(const void *p, int64_t rows, int64_t row_bytes, int bits, int vb)
{
    if (p == NULL || rows == 0)
        return cudaSuccess;
    const int64_t n = rows * (row_bytes / (32 * vb));
    k_moe_pack<<<moe_nblk(n, 256), 256>>>((uint8_t *)p, rows, row_bytes, bits, vb);
    return cudaGetLastError();
}

cudaError_t gfw_moe_pack(dmoe *m, uint16_t *gate)
{
    m->vb = m->D % 256 == 0 && m->I % 256 == 0 && (m->Ws == 0 || m->B % 128 == 0) ? 4 : 1;
    const int vb = m->vb;
    cudaError_t ce = moe_pack1(m->w1, m->held * m->I, m->D / 2, 4, vb);
    if (ce == cudaSuccess)
        ce = moe_pack1(m->w3, m->held * m->I, m->D / 2, 4, vb);
    if (ce == cudaSuccess)
        ce = moe_pack1(m->w2, m->held * m->D, m->I / 2, 4, vb);
    if (ce == cudaSuccess && m->Ws > 0) {
        ce = moe_pack1(m->sw1, m->Ws, m->D, 8, vb);
        if (ce == cudaSuccess)
            ce = moe_pack1(m->sw3, m->Ws, m->D, 8, vb);
        if (ce == cudaSuccess)
            ce = moe_pack1(m->sw2, m->D, m->Ws, 8, vb);
    }
    if (ce == cudaSuccess)
        ce = moe_pack1(gate, m->E, 2 * m->D, 16, vb);
    return ce;
}

/** The token tile for @p T tokens per call, at most @p tt_max. */
static int moe_tile(int64_t T, int tt_max)
{
    return T >= tt_max ? tt_max : T >= 8 ? 8 : (T >= 4 ? 4 : (T >= 2 ? 2 : 1));
}

/** Launch the router GEMM for tile TT. */
template <int VB, int TT>
static void moe_launch_logits(const gfw_moe_router &r, const float *xb, int64_t T, int64_t E, int64_t D, float *lg,
                              cudaStream_t st)
{
    if (TT == 1 && VB == 4 && T == 1 && moe_logits_one_smem(D) <= MOE_LOGITS_ONE_SMEM_MAX) {
        mmoe_launch_pdl(k_moe_logits_one, moe_nblk(E, MOE_ROUTER_ROWS), MOE_ROUTER_THREADS, moe_logits_one_smem(D), st,
                        r.gate, xb, E, D, lg);
        return;
    }
    const dim3 grid(moe_nblk(E, MOE_ROUTER_ROWS), moe_nblk(T, TT));
    mmoe_launch_pdl(k_moe_logits<VB, TT, 32 / VB>, grid, MOE_ROUTER_THREADS, 0, st, r.gate, xb, T, E, D, lg);
}

/** Launch L1, requant (of the @p tasks tasks from @p p0 on) and L2 for tile TT. */
template <int VB, int TT>
static cudaError_t moe_launch_experts(const dmoe &m, const gfw_moe_work &w, const gfw_moe_io &io, int64_t items,
                                      int64_t p0, int64_t tasks, cudaStream_t st, const char **what)
{
    const int64_t T = io.T;
    *what = "moe L1";
    mmoe_launch_pdl(k_moe_l1<VB, TT>, dim3(moe_nblk(io.width, MOE_ROW_SETS(TT) * MOE_ROWS), (unsigned)items),
                    MOE_THREADS, 0, st, m, w, io.xq, io.wts, T, io.width, io.h);
    cudaError_t ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return ce;
    *what = "moe requantization";
    mmoe_launch_pdl(k_moe_requant, dim3((unsigned)(io.width / 128), (unsigned)tasks), 128, 0, st, m, io.idx, T, io.h,
                    io.width, w.hq, p0);
    if ((ce = cudaGetLastError()) != cudaSuccess)
        return ce;
    *what = "moe L2";
    mmoe_launch_pdl(k_moe_l2<VB, TT>, dim3(moe_nblk(m.D, MOE_L2_NM * MOE_ROW_SETS(TT) * MOE_ROWS), (unsigned)items),
                    MOE_THREADS, 0, st, m, w, T, io.width, io.slot_y);
    return cudaGetLastError();
}

/**
 * The router and the plan of @p io's T tokens (tasks of @p shared's shared expert too, items of
 * @p TT tasks): k_moe_route_plan_one for one token when its experts and tasks fit one CTA's
 * lanes, else k_moe_route_plan.
 */
static cudaError_t moe_launch_route(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w,
                                    const gfw_moe_io &io, int given, int shared, int TT, cudaStream_t st)
{
    if (io.T == 1 && m.E <= MOE_PLAN_ONE_E_MAX && m.k + (shared ? 1 : 0) <= 32)
        mmoe_launch_pdl(k_moe_route_plan_one, 1, MOE_PLAN_ONE_E_MAX, 0, st, io.logits, r.bias, r.tid2eid, io.ids, m.E,
                        (int)m.k, r.route_scale, given, shared, TT, m.first, m.held, io.idx, io.wts, w);
    else
        mmoe_launch_pdl(k_moe_route_plan, 1, MOE_PLAN_THREADS, moe_plan_smem(m.held), st, io.logits, r.bias,
                        r.tid2eid, io.ids, io.T, m.E, (int)m.k, r.route_scale, given, shared, TT, m.first, m.held,
                        io.idx, io.wts, w);
    return cudaGetLastError();
}

int gfw_moe_tile(int64_t T) { return moe_tile(T, MOE_TT_MAX); }

cudaError_t gfw_moe_route(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                          cudaStream_t st)
{
    return moe_launch_route(m, r, w, io, 0, m.Ws > 0, gfw_moe_tile(io.T), st);
}

/** moe_launch_experts() for the token tile @p TT that moe_tile() chose (1, 2, 4 or MOE_TT_MAX). */
template <int VB>
static cudaError_t moe_launch_experts_tt(int TT, const dmoe &m, const gfw_moe_work &w, const gfw_moe_io &io,
                                         int64_t items, int64_t p0, int64_t tasks, cudaStream_t st, const char **what)
{
    switch (TT) {
    case 1: return moe_launch_experts<VB, 1>(m, w, io, items, p0, tasks, st, what);
    case 2: return moe_launch_experts<VB, 2>(m, w, io, items, p0, tasks, st, what);
    case 4: return moe_launch_experts<VB, 4>(m, w, io, items, p0, tasks, st, what);
    default: return moe_launch_experts<VB, MOE_TT_MAX>(m, w, io, items, p0, tasks, st, what);
    }
}

/** The MoE input's 1x128 quantization (k_moe_in) of @p io's T rows, unless the norm before staged it. */
static cudaError_t moe_quantize_input(const dmoe &m, const gfw_moe_work &w, const gfw_moe_io &io, cudaStream_t st,
                                      const char **what)
{
    if (io.x_staged)
        return cudaSuccess;
    *what = "moe input quantization";
    mmoe_launch_pdl(k_moe_in, dim3((unsigned)(m.D / 128), (unsigned)io.T), 128, 0, st, io.x, m.D, w.xb, io.xq);
    return cudaGetLastError();
}

/**
 * Dispatch on the token tile.  With @p shared_in_plan 0 the plan, L1, requantization and L2
 * leave the shared expert out (moe_run_split() runs it on its own stream).
 */
template <int VB>
static cudaError_t moe_run_vb(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                              int given, cudaStream_t st, const char **what, int shared_in_plan = 1)
{
    const int64_t T = io.T, D = m.D, Tk = T * m.k;
    const int shared = m.Ws > 0 && shared_in_plan;
    const int TT = moe_tile(T, MOE_TT_MAX);
    cudaError_t ce;
    if ((ce = moe_quantize_input(m, w, io, st, what)) != cudaSuccess)
        return ce;
    *what = "router logits";
    switch (TT) {
    case 1: moe_launch_logits<VB, 1>(r, w.xb, T, m.E, D, io.logits, st); break;
    case 2: moe_launch_logits<VB, 2>(r, w.xb, T, m.E, D, io.logits, st); break;
    case 4: moe_launch_logits<VB, 4>(r, w.xb, T, m.E, D, io.logits, st); break;
    default: moe_launch_logits<VB, MOE_ROUTER_TT_MAX>(r, w.xb, T, m.E, D, io.logits, st); break;
    }
    if ((ce = cudaGetLastError()) != cudaSuccess)
        return ce;
    *what = "router";
    if ((ce = moe_launch_route(m, r, w, io, given, shared, TT, st)) != cudaSuccess)
        return ce;
    /* at most one partial item per expert (E + shared) beyond the full ones */
    const int64_t tasks = Tk + (shared ? T : 0), distinct = (Tk < m.E ? Tk : m.E) + (shared ? 1 : 0);
    int64_t items = tasks / TT + distinct;
    if (items > tasks)
        items = tasks;
    return moe_launch_experts_tt<VB>(TT, m, w, io, items, 0, tasks, st, what);
}

/**
 * moe_run_vb() with the shared expert on stream @p side: after the input's quantization (when
 * not staged) @p fork is recorded on @p st and waited for on @p side, which runs the shared
 * tasks' plan (k_moe_shared_plan, launched without the programmatic attribute: its one
 * dependency is the fork), L1, requantization and L2 into their slot rows, then records
 * @p join; @p st runs the router and the routed experts as moe_run_vb() with the shared
 * expert left out, then waits for @p join.  The two write different rows of h, hq and
 * slot_y, and the plan arrays of @p ws are the shared branch's own, so they share nothing
 * they write.  Every task's arithmetic is unchanged: the same bits as moe_run_vb().
 */
template <int VB>
static cudaError_t moe_run_split(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_work &ws,
                                 const gfw_moe_io &io, cudaStream_t st, cudaStream_t side, cudaEvent_t fork,
                                 cudaEvent_t join, const char **what)
{
    const int64_t T = io.T;
    const int TT = moe_tile(T, MOE_TT_MAX);
    cudaError_t ce;
    if ((ce = moe_quantize_input(m, w, io, st, what)) != cudaSuccess)
        return ce;
    *what = "moe: the shared expert's stream";
    if ((ce = cudaEventRecord(fork, st)) != cudaSuccess || (ce = cudaStreamWaitEvent(side, fork, 0)) != cudaSuccess)
        return ce;
    *what = "moe: the shared expert's plan";
    mmoe_launch_ex(false, k_moe_shared_plan, 1, 128, 0, side, T, (int)m.k, m.E, TT, ws);
    if ((ce = cudaGetLastError()) != cudaSuccess)
        return ce;
    const int64_t items = (T + TT - 1) / TT;
    if ((ce = moe_launch_experts_tt<VB>(TT, m, ws, io, items, T * m.k, T, side, what)) != cudaSuccess)
        return ce;
    *what = "moe: the shared expert's stream";
    if ((ce = cudaEventRecord(join, side)) != cudaSuccess)
        return ce;
    gfw_moe_io staged = io;
    staged.x_staged = 1;
    if ((ce = moe_run_vb<VB>(m, r, w, staged, 0, st, what, 0)) != cudaSuccess)
        return ce;
    *what = "moe: the shared expert's stream";
    return cudaStreamWaitEvent(st, join, 0);
}

cudaError_t gfw_moe_rows(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                         int given, cudaStream_t st, const char **what)
{
    return m.vb == 4 ? moe_run_vb<4>(m, r, w, io, given, st, what) : moe_run_vb<1>(m, r, w, io, given, st, what);
}

cudaError_t gfw_moe_rows_split(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_work &ws,
                               const gfw_moe_io &io, cudaStream_t st, cudaStream_t side, cudaEvent_t fork,
                               cudaEvent_t join, const char **what)
{
    if (m.Ws <= 0)
        return gfw_moe_rows(m, r, w, io, 0, st, what);
    return m.vb == 4 ? moe_run_split<4>(m, r, w, ws, io, st, side, fork, join, what)
                     : moe_run_split<1>(m, r, w, ws, io, st, side, fork, join, what);
}

size_t gfw_moe_side_bytes(int64_t Tm)
{
    return 2 * moe_al(sizeof(int32_t) * (size_t)Tm) + moe_al(sizeof(int4) * (size_t)Tm) + moe_al(sizeof(int32_t));
}

void gfw_moe_side_carve(void *base, int64_t Tm, const gfw_moe_work &w, gfw_moe_work *ws)
{
    uint8_t *p = (uint8_t *)base;
    ws->xb = w.xb;
    ws->hq = w.hq;
    ws->order = (int32_t *)p;
    p += moe_al(sizeof(int32_t) * (size_t)Tm);
    ws->flag = (int32_t *)p;
    p += moe_al(sizeof(int32_t) * (size_t)Tm);
    ws->items = (int4 *)p;
    p += moe_al(sizeof(int4) * (size_t)Tm);
    ws->n_items = (int32_t *)p;
}

cudaError_t gfw_moe_combine(const dmoe &m, const gfw_moe_io &io, cudaStream_t st, const char **what)
{
    *what = "moe combine";
    mmoe_launch_pdl(k_moe_combine, moe_nblk(io.T * m.D, 256), 256, 0, st, io.slot_y, io.idx, io.T, (int)m.k, m.D,
                    m.Ws > 0, io.y);
    return cudaGetLastError();
}

cudaError_t gfw_moe_forward(const dmoe &m, const gfw_moe_router &r, const gfw_moe_work &w, const gfw_moe_io &io,
                            int given, cudaStream_t st, const char **what)
{
    const cudaError_t ce = gfw_moe_rows(m, r, w, io, given, st, what);
    return ce != cudaSuccess ? ce : gfw_moe_combine(m, io, st, what);
}
