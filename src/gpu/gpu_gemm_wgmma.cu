/**
 * @file gpu_gemm_wgmma.cu
 * @brief The grouped GEMM on sm_90a: warp-specialized, mbarrier ring, weights decoded into the
 *        registers of F16 wgmma.
 *
 * The same computation as gpu_gemm.cu (read that chapter first: the operands,
 * the scale folding, the epilogues are identical), organised the way Hopper
 * wants it:
 *
 *   - **Roles.**  Warpgroup 0 is the *producer*: it copies each K block of the
 *     weights (raw MXFP4 or FP8 bytes, with their UE8M0 scale words) and of the
 *     activations (already F16, below) into a ring of shared-memory stages with
 *     cp.async, and turns each weight row's scale word into the factors the
 *     consumers apply.  Warpgroups 1 and 2 are the *consumers*: each owns 64 of
 *     the tile's 128 weight rows, decodes them from the stage into the A
 *     registers of `wgmma` (register A, shared-memory B: gpu_wgmma.cuh),
 *     multiplies them with all of the tile's tokens, and promotes the partial
 *     sums into FP32 accumulators.  The roles meet only at two mbarriers per
 *     stage ("full": the producer's 128 threads have landed stage s and written
 *     its factors; "empty": every consumer thread is done reading it).  The
 *     producer gives back registers (setmaxnreg) that the consumers take.
 *   - **Why decode in the consumers.**  Decoded by one producer warpgroup into
 *     shared memory, the weights cost about 460 instructions per producer
 *     thread and K block, issued by one warp per scheduler that could not keep
 *     the tensor cores fed (a third of their time waiting).  Decoded by the
 *     consumers, the work is spread over twice the warps, goes straight into
 *     registers (no F16 copy of the weights in shared memory, so the stages are
 *     smaller and the ring deeper), and the two consumer warpgroups' decoding
 *     and promotions overlap each other's wgmmas.
 *   - **Why F16 operands, not E4M3.**  Hopper's E4M3 wgmma (QGMMA) returns its
 *     sums with about 13 mantissa bits (truncated), i.e. a relative error near
 *     1e-4 in every 128-wide partial sum however often it is promoted.  The
 *     layer requantizes the SwiGLU output to E4M3 (steps of 2^-3..2^-4
 *     relative), and an error e in front of a rounding with step s moves about
 *     e/s of the roundings by a whole step: the output error grows to about
 *     sqrt(e * s) ~ 3e-3, which the oracle comparison rejects.  Every E4M3 and
 *     every E2M1 value (times the folded scale below) is an F16 number, and the
 *     F16 wgmma keeps FP32 sums: the products are the oracle's, exactly, and
 *     only the order of the FP32 additions differs, as in the mma.sync kernel.
 *     The price is the F16 rate (half the E4M3 rate).
 *   - **Swap AB.**  The weights are the wgmma's M operand (64 rows per
 *     consumer warpgroup), the tokens its N operand (16, 64 or 128: the tile).
 *     MoE tiles have few tokens per expert: with tokens as N the tensor-core
 *     work is not padded to 64 tokens.  For L1 a consumer thread's two
 *     fragment rows (g and g + 8 of its warp) are the gate and the up row of
 *     one channel, so SwiGLU stays in the thread.
 *   - **Fragments and the K order.**  A thread decodes its rows exactly as the
 *     decode kernel's warps do (gpu_decode16_map.h): lane (g, t) takes word t
 *     (codes 8t..8t+7) of each 32-wide group j, and the group's two k16 steps
 *     multiply its even codes, then its odd codes.  The K order inside a
 *     wgmma is free as long as B uses the same map, so the layer widens the
 *     activations into that order once per call (mmoe_launch_widen_e4m3; the
 *     map of each 32-group is mmoe_d16_wg_k_of_position), and the producer
 *     copies the F16 rows as they are into the 128B-swizzled B tile.
 *     FP8 weights follow the same map (bytes 8t..8t+7 of group j, even bytes
 *     for step 2j, odd ones for step 2j + 1).  The producer copies each
 *     thread's weight words next to each other (4-byte or 8-byte cp.async into
 *     [row][t][group] order), so a consumer reads a row's K block with one
 *     16-byte load (MXFP4) or two (FP8).
 *   - **Scale folding into F16.**  A weight is w(code) * 2^(k_g - 127) per
 *     32-group g.  Per row and K block the producer chooses a base and the
 *     consumer multiplies each decoded F16 pair by 2^(k_g - base) (HMUL2, exact),
 *     and 2^(base - 127) is applied in FP32 at the promotion.  MXFP4: the bit
 *     move gives e2m1 * 2^-14 (gpu_decode16_map.h), so the multiplier is
 *     2^(k_g - kmax + 15) and base = kmax - 1: values up to 12, the smallest
 *     nonzero 0.5 * 2^(k_g - kmax + 1) an F16 number down to 2^-24, exact while
 *     the four exponents span at most 24.  FP8: multiplier 2^(k_g - kmax + 7),
 *     base = kmax - 7, exact within a span of 22 (E4M3 values are multiples of
 *     2^-9).  A row beyond that is decoded unscaled (e2m1 itself, or the E4M3
 *     value) and promoted per 32-group with 2^(k_g - 127).  The decision is
 *     taken per K block and consumer warpgroup (from one flag per producer
 *     warp of 32 rows); the unflagged rows of a flagged warpgroup keep their
 *     folded values and are promoted per group with 2^(base - 127).
 *   - **Promotion.**  Per K block (128) the eight k16 wgmmas sum into a scratch
 *     accumulator (scale-d = 0 on the first), which is then added to the FP32
 *     accumulator times a_scale(token) * 2^(base - 127)(row), with the same
 *     rounding as the mma.sync kernel; per 32-group (two k16 steps) on the
 *     exact path and with SM100's per-32 activation scales.
 *
 * Tile sizes: BT = 16, 64 or 128 tokens; one block per SM; the ring holds as
 * many stages as fit (up to 6).  The grid is the mma.sync kernel's: (tile,
 * 128-row weight block, K split).
 *
 * The kernel body exists only for sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`): wgmma
 * is not part of sm_100a.  The host chooses it only on a compute-capability-9.0
 * device; elsewhere the portable kernel runs and the layer reports why.
 */
#include "gpu_internal.cuh"
#include "gpu_decode16_map.h"
#include "gpu_e2m1_decode.cuh"
#include "gpu_wgmma.cuh"

#include <cuda_fp16.h>

namespace {

constexpr int WROWS = 128;     /* weight rows per tile: 64 per consumer warpgroup */
constexpr int WK = 128;        /* K per step (one promotion block on SM90) */
constexpr int THREADS = 384;   /* the producer warpgroup and two consumer warpgroups */
/*
 * Registers: the block is launched with the count its launch bounds give every thread (65536 /
 * 384, rounded down to a multiple of 8: 168), and setmaxnreg only moves registers between the
 * warpgroups of that allocation: a warpgroup that asks for more than the others gave back waits
 * for ever.  The producer keeps 40, the consumers take 232: 128 * 40 + 256 * 232 = 384 * 168.
 */
constexpr int ENTRY_REGS = 65536 / THREADS / 8 * 8;
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * ENTRY_REGS,
              "the consumers take no more registers than the producer gives back");

/**
 * Shared-memory layout: STAGES stages (1024-aligned), then the barriers and the row map.  A
 * stage holds the F16 activation tile (two 128B-swizzled sub-tiles: logical K 0..63, 64..127),
 * the raw weight bytes in the consumers' order, the scale words, the activation scales and
 * the producer's per-row factors.
 */
template <int BT, int BFMT, int AG>
struct wg_layout {
    static constexpr int AGPB = WK / AG;                                  /* activation scales per row and step */
    static constexpr int BROW = BFMT == MMOE_B_FP4 ? WK / 2 : WK;         /* raw weight bytes per row and K block */
    static constexpr int A_HALF = BT * 128;                               /* one activation sub-tile */
    static constexpr int OFF_ACT = 0;                                     /* BT x 256 B F16, swizzled */
    static constexpr int OFF_W = 2 * A_HALF;                              /* 128 rows x BROW, [row][t][group] */
    static constexpr int OFF_WSC = OFF_W + WROWS * BROW;                  /* 128 x 4 UE8M0 bytes */
    static constexpr int OFF_ASC = OFF_WSC + WROWS * 4;                   /* BT x AGPB FP32 */
    static constexpr int OFF_SB = OFF_ASC + BT * AGPB * 4;                /* [128][4] FP32 promotion factors */
    static constexpr int OFF_MUL = OFF_SB + WROWS * 16;                   /* [128][4] F16-pair multipliers */
    static constexpr int OFF_FLAG = OFF_MUL + WROWS * 16;                 /* 4 ints: exact path, per producer warp */
    static constexpr int STAGE_BYTES = (OFF_FLAG + 16 + 1023) / 1024 * 1024;
    static constexpr int MAX_STAGES = 6;
    static constexpr int FIXED = 2 * MAX_STAGES * 8 + BT * 4 + 1024;      /* barriers, row map, alignment slack */
    static constexpr int FIT = (227 * 1024 - FIXED) / STAGE_BYTES;
    static constexpr int STAGES = FIT > MAX_STAGES ? MAX_STAGES : FIT;
    static constexpr int OFF_BAR = STAGES * STAGE_BYTES;                  /* full[STAGES], empty[STAGES] */
    static constexpr int OFF_AROW = OFF_BAR + 2 * STAGES * 8;             /* BT ints: A row of each tile row */
    static constexpr int TOTAL = OFF_AROW + BT * 4 + 1024;                /* + slack to align the base */
};

/** The fold per weight format: the multiplier of the largest group, 2^TOP, and the largest exact span. */
template <int BFMT>
struct f16_fold {
    static constexpr int TOP = BFMT == MMOE_B_FP4 ? 15 : 7;      /* e2m1 * 2^-14 * 2^15 <= 12; 448 * 2^7 < 65504 */
    static constexpr int BASE = BFMT == MMOE_B_FP4 ? 1 : 7;      /* base = kmax - BASE */
    static constexpr int EXACT = BFMT == MMOE_B_FP4 ? 14 : 0;    /* unscaled path: multiplier 2^EXACT */
    static constexpr int SPREAD = BFMT == MMOE_B_FP4 ? 24 : 22;  /* smallest value >= 2^-24 */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) /* the helpers exist where the kernel body does */
/** 2^r as an F16 pair, exact for -24 <= r <= 15. */
__device__ __forceinline__ uint32_t pow2_h2(int r)
{
    const uint32_t bits = (uint32_t)(r >= -14 ? (r + 15) << 10 : 1 << (r + 24));
    return bits | bits << 16;
}

/** The F16-pair product of two F16-pair words (HMUL2; exact for the operands used here). */
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b)
{
    const __half2 r = __hmul2(*reinterpret_cast<const __half2 *>(&a), *reinterpret_cast<const __half2 *>(&b));
    return *reinterpret_cast<const uint32_t *>(&r);
}

/**
 * The A registers of one K block for the thread's two rows: 8 k16 steps, 4 registers each
 * (a[s][0]: row 0, k 2t, 2t+1; a[s][1]: row 1; a[s][2], a[s][3]: k 2t+8, 2t+9).  @p r0, @p r1
 * hold the rows' raw words (MXFP4: word j = word t of group j; FP8: words 2j, 2j + 1 = bytes
 * 8t..8t+7 of group j), @p m0, @p m1 the rows' F16-pair multipliers per group.  The F16 pairs
 * of a group's two steps come from gpu_decode16_map.h (mmoe_d16_a_pairs_fp4 / _fp8).
 */
template <int BFMT>
__device__ __forceinline__ void decode_a(const uint32_t (&r0)[BFMT == MMOE_B_FP4 ? 4 : 8],
                                         const uint32_t (&r1)[BFMT == MMOE_B_FP4 ? 4 : 8], const uint32_t (&m0)[4],
                                         const uint32_t (&m1)[4], uint32_t (&a)[8][4])
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t ev[4], od[4]; /* rows 0 / 1 in [0] / [1], k + 8 in [2] / [3] */
        if (BFMT == MMOE_B_FP4)
            mmoe_d16_a_pairs_fp4(r0[j], r1[j], ev, od);
        else
            mmoe_d16_a_pairs_fp8(r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1], ev, od);
#pragma unroll
        for (int c = 0; c < 4; c++)
            a[2 * j][c] = hmul2_bits(ev[c], c % 2 ? m1[j] : m0[j]);
#pragma unroll
        for (int c = 0; c < 4; c++)
            a[2 * j + 1][c] = hmul2_bits(od[c], c % 2 ? m1[j] : m0[j]);
    }
}
#endif

/** Add the scratch sums into the accumulators: rows 0 / 1 of the thread with factors sb0 / sb1. */
template <int BT, int AGPB>
__device__ __forceinline__ void promote(float (&acc)[BT / 2], const float (&tmp)[BT / 2], float sb0, float sb1,
                                        const float *asc, int g, int col0)
{
#pragma unroll
    for (int j = 0; j < BT / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float sa = asc[(col0 + 8 * j + e) * AGPB + g];
            acc[4 * j + e] = fmaf(tmp[4 * j + e], __fmul_rn(sa, sb0), acc[4 * j + e]);
            acc[4 * j + 2 + e] = fmaf(tmp[4 * j + 2 + e], __fmul_rn(sa, sb1), acc[4 * j + 2 + e]);
        }
}

template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        reg_fence(r[i]);
}

template <int BT, int BFMT, int AG, int EPI>
__global__ void __launch_bounds__(THREADS, 1) wgmma_gemm_kernel(const mmoe_gemm_args p)
{
    using SL = wg_layout<BT, BFMT, AG>;
    static_assert(SL::OFF_ACT % 1024 == 0 && SL::A_HALF % 1024 == 0 && SL::STAGE_BYTES % 1024 == 0,
                  "swizzled sub-tiles start on 1024-byte boundaries");
    static_assert(SL::STAGES >= 2 && SL::TOTAL <= 227 * 1024, "at least two stages fit the shared memory of one block");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using FOLD = f16_fold<BFMT>;
    constexpr int S = SL::STAGES, AGPB = SL::AGPB, BROW = SL::BROW;
    constexpr int ACT_CHUNKS = BT * 16 / 128; /* F16 activation chunks per producer thread and K block */
    constexpr int NRAW = BROW / 16;           /* raw 32-bit words of one row a consumer thread reads: 4 or 8 */

    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + SL::OFF_BAR);
    uint64_t *empty = full + S;
    int *sArow = reinterpret_cast<int *>(smem + SL::OFF_AROW);

    const int tid = threadIdx.x;
    mmoe_gemm_work wk;
    if (!mmoe_gemm_work_of(p, (mmoe_epi)EPI, BT, &wk))
        return;
    const mmoe_gemm_block blk = wk.blk;
    const int expert = wk.expert, row0 = wk.row0, nrows = wk.nrows;
    const int nb = blk.nb;
    const int K = p.K;
    const int nkb = K / WK;
    const int kb0 = wk.kb0, nk = wk.nk;

    for (int r = tid; r < BT; r += THREADS)
        sArow[r] = r < nrows ? (p.a_gather != nullptr ? p.a_gather[row0 + r].token : row0 + r) : -1;
    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 128);
            mbar_init(&empty[s], 256);
        }
    }
    /* token rows past the tile's end are never loaded: zero them (and their scales) once */
    for (int s = 0; s < S; s++) {
        uint8_t *st = smem + s * SL::STAGE_BYTES;
        for (int i = tid; i < 2 * BT * 8; i += THREADS)
            if ((i >> 3) % BT >= nrows)
                *reinterpret_cast<uint4 *>(st + SL::OFF_ACT + i * 16) = make_uint4(0, 0, 0, 0);
        for (int i = tid; i < BT * AGPB; i += THREADS)
            if (i / AGPB >= nrows)
                reinterpret_cast<float *>(st + SL::OFF_ASC)[i] = 0.0f;
    }
    fence_proxy_async_smem();
    __syncthreads();

    if (tid < 128) {
        /* ------------------------------------------------------------ producer */
        warpgroup_reg_dealloc<PRODUCER_REGS>();
        const int n = tid, lane = tid & 31, warp = tid >> 5;
        const uint8_t *bexp = p.b + (size_t)expert * p.b_expert_stride + (size_t)nb * nkb * (WROWS * BROW);
        const uint8_t *bsexp = p.b_scale + (size_t)expert * p.bs_expert_stride + (size_t)nb * nkb * (WROWS * 4);
        /*
         * Step j: finish K block i = j - P (its copies have landed: write the factors of row n,
         * signal "full"), then wait until block j - S has been released and issue the copies of
         * block j.  P = S - 1 blocks of copies are in flight.
         */
        constexpr int P = S - 1;
        const unsigned act_dst = (n & 15) / 8 * SL::A_HALF + sw128_offset(n >> 4, n & 7); /* + 1024 per 8 rows */
        const unsigned w_dst = (n >> 4) * BROW + (n & 3) * (BROW / 4) + ((n >> 2) & 3) * (BROW / 16);
        for (int j = 0; j < nk + P; j++) {
            const int i = j - P;
            if (i >= 0) {
                cp_async_wait<P - 1>(); /* this thread's copies of K block i have landed */
                uint8_t *st = smem + (i % S) * SL::STAGE_BYTES;
                const uint32_t sw = *reinterpret_cast<const uint32_t *>(st + SL::OFF_WSC + n * 4);
                int kmax, kmin;
                scale_span(sw, &kmax, &kmin);
                const bool fold = kmax - kmin <= FOLD::SPREAD;
                const int flag = AG == 32 ? 1 : (__ballot_sync(0xffffffffu, !fold) != 0u);
                if (lane == 0)
                    reinterpret_cast<int *>(st + SL::OFF_FLAG)[warp] = flag;
                float sb[4];
                uint32_t mul[4];
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    const int kg = byte_of(sw, g);
                    sb[g] = pow2i((fold ? kmax - FOLD::BASE : kg) - 127);
                    mul[g] = pow2_h2(fold ? kg - kmax + FOLD::TOP : FOLD::EXACT);
                }
                *reinterpret_cast<float4 *>(st + SL::OFF_SB + n * 16) = make_float4(sb[0], sb[1], sb[2], sb[3]);
                *reinterpret_cast<uint4 *>(st + SL::OFF_MUL + n * 16) = make_uint4(mul[0], mul[1], mul[2], mul[3]);
                fence_proxy_async_smem(); /* the activation tile is read by the tensor cores */
                mbar_arrive(&full[i % S]);
            }
            if (j < nk) {
                if (j >= S)
                    mbar_wait(&empty[j % S], ((j / S) - 1) & 1);
                uint8_t *st = smem + (j % S) * SL::STAGE_BYTES;
                const int kb = kb0 + j;
                /* the widened activations: F16 chunk c = n % 16 of rows n / 16 + 8 u straight to
                   their swizzled places (1024 bytes apart), the A rows read together first */
                int act_row[ACT_CHUNKS];
#pragma unroll
                for (int u = 0; u < ACT_CHUNKS; u++)
                    act_row[u] = sArow[(n >> 4) + 8 * u];
                const unsigned adst = smem_u32(st + SL::OFF_ACT) + act_dst;
                const uint16_t *asrc = p.a16 + (size_t)kb * WK + (n & 15) * 8;
#pragma unroll
                for (int u = 0; u < ACT_CHUNKS; u++)
                    if (act_row[u] >= 0)
                        cp_async16_sa(adst + 1024 * u, asrc + (size_t)act_row[u] * K);
                /* activation scale n % AGPB of rows n / AGPB + (128 / AGPB) u */
                const float *ssrc = p.a_scale + (size_t)kb * AGPB + n % AGPB;
#pragma unroll
                for (int u = 0; u < (BT * AGPB + 127) / 128; u++) {
                    const int q = n + 128 * u, ar = q < BT * AGPB ? sArow[q / AGPB] : -1;
                    if (ar >= 0)
                        cp_async4(st + SL::OFF_ASC + q * 4, ssrc + (size_t)ar * (K / AG));
                }
                /* the weights, coalesced: piece n + 128 m of the K block (row n / 16 + 8 m, group
                   (n / 4) % 4, column t = n % 4: a word or 8 bytes) to its [row][t][group] place */
                const unsigned wdst = smem_u32(st + SL::OFF_W) + w_dst;
                const uint8_t *wsrc = bexp + (size_t)kb * (WROWS * BROW) + n * (BROW / 16);
#pragma unroll
                for (int m = 0; m < 16; m++) {
                    if (BFMT == MMOE_B_FP4)
                        cp_async4_sa(wdst + m * 8 * BROW, wsrc + m * 8 * BROW);
                    else
                        cp_async8_sa(wdst + m * 8 * BROW, wsrc + m * 8 * BROW);
                }
                cp_async4(st + SL::OFF_WSC + n * 4, bsexp + (size_t)kb * (WROWS * 4) + n * 4);
            }
            cp_async_commit();
        }
        return;
    }

    /* ---------------------------------------------------------------- consumers */
    warpgroup_reg_alloc<CONSUMER_REGS>();
    using MMA = wgmma_rs<BT>;
    const int cw = (tid - 128) >> 7;            /* consumer warpgroup: weight rows of its half */
    const int ct = (tid - 128) & 127, w = ct >> 5, g = (ct & 31) >> 2, t = ct & 3;
    /* the thread's fragment rows g and g + 8: L1 the gate and up rows of channel 32 cw + 8 w + g */
    const int R0 = EPI == MMOE_EPI_SWIGLU ? 32 * cw + 8 * w + g : 64 * cw + 16 * w + g;
    const int R1 = EPI == MMOE_EPI_SWIGLU ? 64 + R0 : R0 + 8;
    /* the producer warps (32 rows each) that flagged the warpgroup's 64 rows: the promotion path
       must be the same for the whole warpgroup, whose wgmmas are collective */
    const int fw0 = EPI == MMOE_EPI_SWIGLU ? cw : 2 * cw, fw1 = EPI == MMOE_EPI_SWIGLU ? 2 + cw : 2 * cw + 1;
    const int col0 = 2 * t;                 /* first token column of this thread */
    float acc[BT / 2], tmp[BT / 2];
#pragma unroll
    for (int i = 0; i < BT / 2; i++) {
        acc[i] = 0.0f;
        tmp[i] = 0.0f;
    }
    for (int i = 0; i < nk; i++) {
        const int s = i % S;
        uint8_t *st = smem + s * SL::STAGE_BYTES;
        mbar_wait(&full[s], (i / S) & 1);
        const int *flags = reinterpret_cast<const int *>(st + SL::OFF_FLAG);
        const bool per_group = AG == 32 || (flags[fw0] | flags[fw1]) != 0;
        uint32_t r0[NRAW], r1[NRAW], m0[4], m1[4];
#pragma unroll
        for (int v = 0; v < NRAW / 4; v++) {
            const uint4 x0 = *reinterpret_cast<const uint4 *>(st + SL::OFF_W + R0 * BROW + t * (BROW / 4) + 16 * v);
            const uint4 x1 = *reinterpret_cast<const uint4 *>(st + SL::OFF_W + R1 * BROW + t * (BROW / 4) + 16 * v);
            r0[4 * v] = x0.x; r0[4 * v + 1] = x0.y; r0[4 * v + 2] = x0.z; r0[4 * v + 3] = x0.w;
            r1[4 * v] = x1.x; r1[4 * v + 1] = x1.y; r1[4 * v + 2] = x1.z; r1[4 * v + 3] = x1.w;
        }
        {
            const uint4 y0 = *reinterpret_cast<const uint4 *>(st + SL::OFF_MUL + R0 * 16);
            const uint4 y1 = *reinterpret_cast<const uint4 *>(st + SL::OFF_MUL + R1 * 16);
            m0[0] = y0.x; m0[1] = y0.y; m0[2] = y0.z; m0[3] = y0.w;
            m1[0] = y1.x; m1[1] = y1.y; m1[2] = y1.z; m1[3] = y1.w;
        }
        uint32_t a[8][4];
        decode_a<BFMT>(r0, r1, m0, m1, a);
        const uint32_t ab = smem_u32(st + SL::OFF_ACT);
        const uint64_t db[2] = {wgmma_desc_sw128(ab), wgmma_desc_sw128(ab + SL::A_HALF)};
        const float *asc = reinterpret_cast<const float *>(st + SL::OFF_ASC);
        const float *sb0 = reinterpret_cast<const float *>(st + SL::OFF_SB + R0 * 16);
        const float *sb1 = reinterpret_cast<const float *>(st + SL::OFF_SB + R1 * 16);
        if (!per_group) {
            fence_regs(tmp);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 8; ks++) /* k16 step ks: sub-tile ks / 4, slice ks % 4 */
                MMA::mma(tmp, a[ks], db[ks >> 2] + 2 * (ks & 3), ks);
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(tmp);
            promote<BT, AGPB>(acc, tmp, sb0[0], sb1[0], asc, 0, col0);
        } else {
            /* each 32-group (two k16 steps) summed from zero and promoted with its own factors */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                fence_regs(tmp);
                wgmma_fence();
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int ks = 2 * q + h;
                    MMA::mma(tmp, a[ks], db[ks >> 2] + 2 * (ks & 3), h);
                }
                wgmma_commit();
                wgmma_wait_all();
                fence_regs(tmp);
                promote<BT, AGPB>(acc, tmp, sb0[q], sb1[q], asc, AG == 32 ? q : 0, col0);
            }
        }
        mbar_arrive(&empty[s]);
    }
    /* ---------------------------------------------------------------- epilogue */
#pragma unroll
    for (int j = 0; j < BT / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int tc = col0 + 8 * j + e; /* token row of the tile */
            if (tc >= nrows)
                continue;
            const int pr = row0 + tc;
            const float a0 = acc[4 * j + e], a1 = acc[4 * j + 2 + e]; /* rows R0, R1 */
            if (p.partial != nullptr) {
                float *prow = p.partial + ((size_t)blk.split * p.partial_rows + pr) * p.partial_cols;
                if (EPI == MMOE_EPI_SWIGLU) {
                    prow[nb * 64 + R0] = a0;
                    prow[p.n_out + nb * 64 + R0] = a1;
                } else {
                    prow[nb * WROWS + R0] = a0;
                    prow[nb * WROWS + R1] = a1;
                }
            } else if (EPI == MMOE_EPI_SWIGLU) {
                const float wt = p.pool != nullptr ? p.pool[pr].weight : 1.0f;
                p.out_f32[(size_t)pr * p.n_out + nb * 64 + R0] = mmoe_swiglu_channel(a0, a1, p.clamp, wt);
            } else {
                __nv_bfloat16 *orow = mmoe_gemm_slot_row(p, pr);
                orow[nb * WROWS + R0] = __float2bfloat16_rn(a0);
                orow[nb * WROWS + R1] = __float2bfloat16_rn(a1);
            }
        }
#else
    (void)p;
    __trap(); /* never launched: the host picks this kernel only on sm_90 */
#endif
}

/** Launches the instance of wgmma_gemm_kernel for tile width BT that mmoe_gemm_dispatch() picks. */
template <int BT>
struct wgmma_launcher {
    const mmoe_gemm_args *a;
    dim3 grid;
    cudaStream_t s;
    template <int BFMT, int AG, int EPI>
    cudaError_t run() const
    {
        return mmoe_launch_gemm_kernel(wgmma_gemm_kernel<BT, BFMT, AG, EPI>, grid, THREADS,
                                       wg_layout<BT, BFMT, AG>::TOTAL, s, a);
    }
};

/** Writes 1 when this translation unit was compiled for sm_90a (the wgmma body exists), else 0. */
__global__ void wgmma_probe_kernel(int *built)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *built = 1;
#else
    *built = 0;
#endif
}

} // namespace

cudaError_t mmoe_wgmma_built_for_device(int *built)
{
    *built = 0;
    int *d = nullptr;
    cudaError_t e = cudaMalloc((void **)&d, sizeof *d);
    if (e != cudaSuccess)
        return e;
    wgmma_probe_kernel<<<1, 1>>>(d);
    e = cudaGetLastError();
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
        e = cudaSuccess; /* no code for this device at all: not built for it */
    } else if (e == cudaSuccess) {
        e = cudaMemcpy(built, d, sizeof *built, cudaMemcpyDeviceToHost);
    }
    cudaFree(d);
    return e;
}

cudaError_t mmoe_launch_gemm_wgmma(const mmoe_gemm_args *args, int block_m, mmoe_bfmt b_fmt, int a_group, mmoe_epi epi,
                                   int max_tiles, cudaStream_t stream)
{
    if (max_tiles <= 0)
        return cudaSuccess;
    if (args->a16 == nullptr)
        return cudaErrorInvalidValue; /* the kernel reads the activations widened to F16 only */
    const dim3 grid = mmoe_gemm_grid(args, epi, max_tiles);
    switch (block_m) {
    case 16:
        return mmoe_gemm_dispatch(wgmma_launcher<16>{args, grid, stream}, b_fmt, a_group, epi);
    case 64:
        return mmoe_gemm_dispatch(wgmma_launcher<64>{args, grid, stream}, b_fmt, a_group, epi);
    case 128:
        return mmoe_gemm_dispatch(wgmma_launcher<128>{args, grid, stream}, b_fmt, a_group, epi);
    default:
        return cudaErrorInvalidValue;
    }
}
