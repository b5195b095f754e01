/**
 * @file gpu_gemm_wgmma.cu
 * @brief The grouped GEMM on sm_90a: warp-specialized, mbarrier ring, F16 wgmma from shared memory.
 *
 * The same computation as gpu_gemm.cu (read that chapter first: the operands,
 * the scale folding, the epilogues are identical), organised the way Hopper
 * wants it:
 *
 *   - **Roles.**  Warpgroup 0 is the *producer*: it copies each K block of the
 *     weights (raw bytes) and of the activations (already F16, below) into a
 *     ring of shared-memory stages with cp.async and converts the weights
 *     there to F16.  Warpgroups 1 (and 2) are *consumers*: they run
 *     `wgmma` on the converted stage and promote the partial sums into FP32
 *     accumulators.  No block-wide barrier sits in the K loop; the roles meet
 *     only at two mbarriers per stage ("full": the producer's 128 threads have
 *     landed and converted stage s; "empty": every consumer thread is done
 *     reading it).
 *   - **Why F16 operands, not E4M3.**  Hopper's E4M3 wgmma (QGMMA) returns its
 *     sums with about 13 mantissa bits (truncated), i.e. a relative error near
 *     1e-4 in every 128-wide partial sum however often it is promoted.  The
 *     layer requantizes the SwiGLU output to E4M3 (steps of 2^-3..2^-4
 *     relative), and an error e in front of a rounding with step s moves about
 *     e/s of the roundings by a whole step: the output error grows to about
 *     sqrt(e * s) ~ 3e-3, which the oracle comparison rejects.  Every E4M3 and
 *     every E2M1 value (times the folded scale below) is an F16 number, and the
 *     F16 wgmma keeps FP32 sums: the products are the oracle's, exactly, and
 *     only the order of the FP32 additions differs, as in the mma.sync kernel
 *     (whose FP8 mma.sync runs on the F16 tensor-core path of sm_90 too).  The
 *     price is the F16 rate (half the E4M3 rate) and twice the shared memory
 *     per converted tile.
 *   - **Swap AB.**  The weights are the wgmma's M operand (64 rows per
 *     instruction; a tile of 128 weight rows is two m64 halves: gate and up for
 *     L1, so SwiGLU stays in registers), the tokens its N operand (16, 32 or 64
 *     per warpgroup).  MoE tiles have few tokens per expert: with tokens as N the
 *     tensor-core work is not padded to 64 tokens.
 *   - **Layout.**  Both operands are K-major F16, 256 bytes (one K block of
 *     128) per row, held as two 128B-swizzled sub-tiles of 64 K values each
 *     (gpu_wgmma.cuh).  The raw bytes of a weight row (64 B of E2M1 codes or
 *     128 B of E4M3) are copied into the row's place in the second sub-tile
 *     and converted in place by the one producer thread that owns the row.
 *   - **Activations widened once.**  A tile of tokens meets every 128-row
 *     weight block of its expert (32 of them in the V4-Flash L1), so
 *     converting its E4M3 bytes in each block would repeat the same work 32
 *     times, about a third of the producer's instructions.  The layer widens
 *     each activation matrix to F16 once per call (mmoe_launch_widen_e4m3:
 *     exact, every E4M3 value is an F16 value; two bytes per value in the
 *     workspace), and the producer copies the F16 rows into their swizzled
 *     places as they are, having read the A rows of its chunks together
 *     first: read one by one between the copies (asm statements with a
 *     memory clobber, which the compiler does not reorder), each read would
 *     wait out its own shared-memory latency.
 *   - **Scale folding into F16.**  A weight is e2m1(code) * 2^(k_g - 127) per
 *     32-group g.  Per row and K block the producer folds 2^(k_g - base) into
 *     the F16 value, with base = max_g k_g - 13 (E2M1) or - 7 (E4M3), and
 *     2^(base - 127) is applied in FP32 at the promotion.  E2M1 magnitudes
 *     {0.5 .. 6} times 2^r are F16 numbers exactly for -23 <= r <= 13, E4M3
 *     ones (2^-9 .. 448) for -15 <= r <= 7: the fold is exact when the four
 *     exponents span at most 36 (E2M1) or 22 (E4M3).  Rows beyond that take
 *     the exact path: decoded unscaled, promoted per 32-group with
 *     2^(k_g - 127).  The decision is taken per K block and per m64 half (from
 *     one flag per producer warp of 32 rows); unflagged rows of a flagged half
 *     keep their folded values and are promoted per group with 2^(base - 127).
 *   - **Promotion.**  Per K block (128) the eight k16 wgmmas of each half sum
 *     into a scratch accumulator (scale-d = 0 on the first), which is then added
 *     to the FP32 accumulator times a_scale(token) * 2^(base - 127)(row), with the
 *     same rounding as the mma.sync kernel; per 32-group (two k16 steps) on the
 *     exact path and with SM100's per-32 activation scales.
 *   - **Overlap.**  The producer converts block i while the consumers multiply
 *     block i - 1 (its copies run S - 2 blocks ahead of the conversion).  A
 *     variant with a separate, deeper raw ring (copies up to 7 blocks ahead, two
 *     converted slots) measured no faster on the H200 (T=8192: 20.0 ms against
 *     19.5; T=128 with 16-token tiles: 4.1 ms against 3.9): the producer's
 *     conversion, not the copy latency, limits this kernel (Nsight Compute:
 *     one issue every 2.6 cycles per scheduler, 12 warps per SM).
 *
 * Tile sizes: BT = 16 tokens (one consumer warpgroup, wgmma n16, 4 stages),
 * BT = 64 (two consumer warpgroups of n32, 4 stages) or BT = 128 (two of n64,
 * 3 stages); one block per SM.  The grid is the mma.sync kernel's: (tile,
 * 128-row weight block, K split).
 *
 * The kernel body exists only for sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`): wgmma
 * is not part of sm_100a.  The host chooses it only on a compute-capability-9.0
 * device; elsewhere the portable kernel runs and the layer reports why.
 */
#include "gpu_internal.cuh"
#include "gpu_e2m1_decode.cuh"
#include "gpu_wgmma.cuh"

#include <cuda_fp16.h>

namespace {

constexpr int WROWS = 128;     /* weight rows per tile: two m64 halves */
constexpr int WK = 128;        /* K per step (one promotion block on SM90) */

/** Thread roles and pipeline depth per tile width. */
template <int BT>
struct wg_cfg {
    static constexpr int NWG = BT == 16 ? 1 : 2;      /* consumer warpgroups */
    static constexpr int NT = BT / NWG;               /* tokens (wgmma N) per consumer warpgroup */
    static constexpr int THREADS = 128 * (1 + NWG);
    static constexpr int STAGES = BT == 128 ? 3 : 4;
    static constexpr int MIN_BLOCKS = 1;
};

/**
 * Shared-memory layout: STAGES stages (1024-aligned), then the barriers, row map and decode
 * tables.  Each F16 tile is two 128B-swizzled sub-tiles (K 0..63, K 64..127).
 */
template <int BT, int BFMT, int AG>
struct wg_layout {
    static constexpr int AGPB = WK / AG;                                  /* activation scales per row and step */
    static constexpr int W_HALF = WROWS * 128;                            /* one weight sub-tile */
    static constexpr int A_HALF = BT * 128;                               /* one activation sub-tile */
    static constexpr int OFF_W = 0;                                       /* 128 x 256 B F16, swizzled */
    static constexpr int OFF_ACT = 2 * W_HALF;                            /* BT x 256 B F16, swizzled */
    static constexpr int OFF_WSC = OFF_ACT + 2 * A_HALF;                  /* 128 x 4 UE8M0 bytes */
    static constexpr int OFF_ASC = OFF_WSC + WROWS * 4;                   /* BT x AGPB FP32 */
    static constexpr int OFF_SB = OFF_ASC + BT * AGPB * 4;                /* [4][128] FP32 promotion factors */
    static constexpr int OFF_FLAG = OFF_SB + 4 * WROWS * 4;               /* 4 ints: exact path, per producer warp */
    static constexpr int STAGE_BYTES = (OFF_FLAG + 16 + 1023) / 1024 * 1024;
    static constexpr int STAGES = wg_cfg<BT>::STAGES;
    static constexpr int OFF_BAR = STAGES * STAGE_BYTES;                  /* full[STAGES], empty[STAGES] */
    static constexpr int OFF_AROW = OFF_BAR + 2 * STAGES * 8;             /* BT ints: A row of each tile row */
    static constexpr int OFF_LUT = OFF_AROW + BT * 4;                     /* E2M1 -> E4M3 table (shift 0) */
    static constexpr int TOTAL = OFF_LUT + 8 + 1024;                      /* + slack to align the base */
};

/** Largest spread of the four UE8M0 exponents of a row and K block that folds into F16 exactly. */
template <int BFMT>
struct f16_fold {
    static constexpr int TOP = BFMT == MMOE_B_FP4 ? 13 : 7;      /* r of the largest group: 6 * 2^13, 448 * 2^7 < 65504 */
    static constexpr int SPREAD = BFMT == MMOE_B_FP4 ? 36 : 22;  /* r >= -23 (0.5 * 2^-23) or -15 (2^-9 * 2^-15) */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) /* the conversion helpers exist where the kernel body does */
/** 2^r as an F16 pair, exact for -24 <= r <= 15. */
__device__ __forceinline__ __half2 pow2_h2(int r)
{
    const unsigned short bits = (unsigned short)(r >= -14 ? (r + 15) << 10 : 1 << (r + 24));
    const __half h = __ushort_as_half(bits);
    return __halves2half2(h, h);
}

/** Two E4M3 bytes (low byte first) to an F16 pair, exactly. */
__device__ __forceinline__ __half2 e4m3x2_to_h2(uint32_t two)
{
    const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return __half2(r);
}

/** Eight E4M3 bytes (two words, K order) to eight F16 values times @p scale (a power of two), as one 16-byte chunk. */
__device__ __forceinline__ uint4 e4m3x8_to_f16(uint32_t lo, uint32_t hi, __half2 scale)
{
    const __half2 h0 = __hmul2(e4m3x2_to_h2(lo), scale), h1 = __hmul2(e4m3x2_to_h2(lo >> 16), scale);
    const __half2 h2 = __hmul2(e4m3x2_to_h2(hi), scale), h3 = __hmul2(e4m3x2_to_h2(hi >> 16), scale);
    return make_uint4(*reinterpret_cast<const uint32_t *>(&h0), *reinterpret_cast<const uint32_t *>(&h1),
                      *reinterpret_cast<const uint32_t *>(&h2), *reinterpret_cast<const uint32_t *>(&h3));
}

/** Byte offset of F16 chunk @p kc (8 values: K 8kc..8kc+7, kc < 16) of row @p row in a two-sub-tile F16 tile. */
__device__ __forceinline__ int f16_chunk_offset(int row, int kc, int half_bytes)
{
    return (kc >> 3) * half_bytes + sw128_offset(row, kc & 7);
}

#endif

/** Add the scratch sums of one promotion into the accumulators of one m64 half. */
template <int NT, int AGPB>
__device__ __forceinline__ void promote(float (&acc)[NT / 2], const float (&tmp)[NT / 2], const float *sb_rows,
                                        const float *asc, int g, int r0, int col0)
{
    const float sb0 = sb_rows[r0], sb1 = sb_rows[r0 + 8];
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
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
__global__ void __launch_bounds__(wg_cfg<BT>::THREADS, wg_cfg<BT>::MIN_BLOCKS) wgmma_gemm_kernel(const mmoe_gemm_args p)
{
    using SLc = wg_layout<BT, BFMT, AG>;
    static_assert(SLc::OFF_W % 1024 == 0 && SLc::OFF_ACT % 1024 == 0 && SLc::A_HALF % 1024 == 0 &&
                      (wg_cfg<BT>::NT * 128) % 1024 == 0,
                  "swizzled sub-tiles (and each consumer's token part) start on 1024-byte boundaries");
    static_assert(SLc::TOTAL <= 227 * 1024, "the stages fit the shared memory of one block");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using CFG = wg_cfg<BT>;
    using SL = wg_layout<BT, BFMT, AG>;
    constexpr int S = SL::STAGES, AGPB = SL::AGPB, NT = CFG::NT, NWG = CFG::NWG;
    constexpr int BROW = BFMT == MMOE_B_FP4 ? WK / 2 : WK; /* raw weight bytes per row and K block */
    constexpr int WCH = BROW / 16;                         /* raw 16-byte chunks per weight row */
    constexpr int ACT_CHUNKS = BT * 16 / 128;              /* F16 activation chunks per producer thread */

    extern __shared__ __align__(16) uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + SL::OFF_BAR);
    uint64_t *empty = full + S;
    int *sArow = reinterpret_cast<int *>(smem + SL::OFF_AROW);
    uint2 *sLut = reinterpret_cast<uint2 *>(smem + SL::OFF_LUT);

    const int tid = threadIdx.x;
    int expert = 0, row0, nrows;
    if (p.tiles != nullptr) {
        if ((int)blockIdx.x >= *p.num_tiles)
            return;
        const mmoe_tile tl = p.tiles[blockIdx.x];
        expert = tl.expert;
        row0 = tl.row0;
        nrows = tl.nrows;
    } else {
        row0 = blockIdx.x * BT;
        if (row0 >= p.total_rows)
            return;
        nrows = min(BT, p.total_rows - row0);
    }
    const int nb = blockIdx.y;
    const int K = p.K;
    const int nkb = K / WK;
    const int kb0 = p.split_kb > 0 ? (int)blockIdx.z * p.split_kb : 0;
    const int nk = p.split_kb > 0 ? min(p.split_kb, nkb - kb0) : nkb;

    for (int r = tid; r < BT; r += CFG::THREADS)
        sArow[r] = r < nrows ? (p.a_gather != nullptr ? p.a_gather[row0 + r].token : row0 + r) : -1;
    if (tid == 0) {
        uint32_t lo, hi;
        e2m1_lut(0, &lo, &hi);
        *sLut = make_uint2(lo, hi);
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 128);
            mbar_init(&empty[s], 128 * NWG);
        }
    }
    /* token rows past the tile's end are never loaded nor converted: zero them (and their scales) once */
    for (int s = 0; s < S; s++) {
        uint8_t *st = smem + s * SL::STAGE_BYTES;
        for (int i = tid; i < 2 * BT * 8; i += CFG::THREADS)
            if ((i >> 3) % BT >= nrows)
                *reinterpret_cast<uint4 *>(st + SL::OFF_ACT + i * 16) = make_uint4(0, 0, 0, 0);
        for (int i = tid; i < BT * AGPB; i += CFG::THREADS)
            if (i / AGPB >= nrows)
                reinterpret_cast<float *>(st + SL::OFF_ASC)[i] = 0.0f;
    }
    fence_proxy_async_smem();
    __syncthreads();

    if (tid < 128) {
        /* ------------------------------------------------------------ producer */
        const int n = tid, lane = tid & 31, warp = tid >> 5;
        const uint8_t *bexp = p.b + (size_t)expert * p.b_expert_stride + (size_t)nb * nkb * (WROWS * BROW);
        const uint8_t *bsexp = p.b_scale + (size_t)expert * p.bs_expert_stride + (size_t)nb * nkb * (WROWS * 4);
        const uint2 lut = *sLut;
        /*
         * Step j: wait until block j - S has been released, issue the copies of block j, then
         * convert block i = j - P.  With P = S - 2 the conversion of block i waits (through that
         * release) only for block i - 2, so it overlaps the consumers' MMAs on block i - 1.
         * Raw bytes land in the second F16 sub-tile of their row and are converted in place.
         */
        static_assert(S >= 3, "the conversion runs one block ahead of the MMAs");
        constexpr int P = S - 2; /* K blocks whose copies are in flight ahead of the conversion */
        for (int j = 0; j < nk + P; j++) {
            if (j < nk) {
                if (j >= S)
                    mbar_wait(&empty[j % S], ((j / S) - 1) & 1);
                uint8_t *st = smem + (j % S) * SL::STAGE_BYTES;
                const int kb = kb0 + j;
                /* the widened activations: F16 chunk c (K 8c..8c+7) of row r straight to its
                   place, the chunks' A rows read together before the copies */
                int act_row[ACT_CHUNKS];
#pragma unroll
                for (int t = 0; t < ACT_CHUNKS; t++)
                    act_row[t] = sArow[(n + 128 * t) >> 4];
#pragma unroll
                for (int t = 0; t < ACT_CHUNKS; t++) {
                    const int i = n + 128 * t, r = i >> 4, c = i & 15, ar = act_row[t];
                    if (ar >= 0)
                        cp_async16(st + SL::OFF_ACT + (c >> 3) * SL::A_HALF + sw128_offset(r, c & 7),
                                   p.a16 + (size_t)ar * K + (size_t)kb * WK + c * 8);
                }
                for (int i = n; i < BT * AGPB; i += 128) {
                    const int ar = sArow[i / AGPB];
                    if (ar >= 0)
                        cp_async4(st + SL::OFF_ASC + i * 4,
                                  p.a_scale + (size_t)ar * (K / AG) + (size_t)kb * AGPB + i % AGPB);
                }
                const uint8_t *wrow = bexp + (size_t)kb * (WROWS * BROW) + (size_t)n * BROW;
#pragma unroll
                for (int c = 0; c < WCH; c++)
                    cp_async16(st + SL::OFF_W + SL::W_HALF + sw128_offset(n, c), wrow + c * 16);
                cp_async4(st + SL::OFF_WSC + n * 4, bsexp + (size_t)kb * (WROWS * 4) + n * 4);
            }
            cp_async_commit();
            const int i = j - P;
            if (i < 0)
                continue;
            cp_async_wait<P>(); /* this thread's copies of K block i have landed */
            uint8_t *st = smem + (i % S) * SL::STAGE_BYTES;
            const uint32_t sw = *reinterpret_cast<const uint32_t *>(st + SL::OFF_WSC + n * 4);
            int kmax = 0, kmin = 255;
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const int kg = (int)((sw >> (8 * g)) & 0xffu);
                kmax = max(kmax, kg);
                kmin = min(kmin, kg);
            }
            const int fold_ok = kmax - kmin <= f16_fold<BFMT>::SPREAD;
            const int flag = AG == 32 ? 1 : (__ballot_sync(0xffffffffu, !fold_ok) != 0u);
            if (lane == 0)
                reinterpret_cast<int *>(st + SL::OFF_FLAG)[warp] = flag;
            const int base = kmax - f16_fold<BFMT>::TOP;
            float *sb = reinterpret_cast<float *>(st + SL::OFF_SB);
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const int kg = (int)((sw >> (8 * g)) & 0xffu);
                sb[g * WROWS + n] = pow2i((flag ? kg : base) - 127);
            }
            /* read this thread's raw chunks (weight row n, its activation chunks), then meet */
            /* this thread's raw chunks of weight row n: the row is read and rewritten by this
               thread alone, so no barrier sits between the reads and the F16 writes */
            uint4 wraw[WCH];
#pragma unroll
            for (int c = 0; c < WCH; c++)
                wraw[c] = *reinterpret_cast<const uint4 *>(st + SL::OFF_W + SL::W_HALF + sw128_offset(n, c));
            /* weights: 32-group q (K 32q..32q+31) becomes F16 chunks 4q..4q+3 of row n */
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int kq = (int)((sw >> (8 * q)) & 0xffu);
                const __half2 scale = pow2_h2(flag ? 0 : kq - base);
                uint32_t e8[8]; /* the group's 32 values as E4M3 bytes, K order */
                if (BFMT == MMOE_B_FP4) {
                    const uint4 v = wraw[q];
                    decode8(v.x, lut.x, lut.y, &e8[0], &e8[1]);
                    decode8(v.y, lut.x, lut.y, &e8[2], &e8[3]);
                    decode8(v.z, lut.x, lut.y, &e8[4], &e8[5]);
                    decode8(v.w, lut.x, lut.y, &e8[6], &e8[7]);
                } else {
                    const uint4 v0 = wraw[2 * q], v1 = wraw[2 * q + 1];
                    e8[0] = v0.x; e8[1] = v0.y; e8[2] = v0.z; e8[3] = v0.w;
                    e8[4] = v1.x; e8[5] = v1.y; e8[6] = v1.z; e8[7] = v1.w;
                }
#pragma unroll
                for (int c = 0; c < 4; c++)
                    *reinterpret_cast<uint4 *>(st + SL::OFF_W + f16_chunk_offset(n, 4 * q + c, SL::W_HALF)) =
                        e4m3x8_to_f16(e8[2 * c], e8[2 * c + 1], scale);
            }
            fence_proxy_async_smem();
            mbar_arrive(&full[i % S]);
        }
        return;
    }

    /* ---------------------------------------------------------------- consumers */
    using MMA = wgmma_f16<NT>;
    const int cw = (tid - 128) >> 7;        /* consumer warpgroup: tokens [cw * NT, cw * NT + NT) */
    const int ct = (tid - 128) & 127;
    const int r0 = 16 * (ct >> 5) + ((ct & 31) >> 2); /* accumulator rows r0, r0 + 8 of each half */
    const int col0 = cw * NT + 2 * (ct & 3);         /* first token column of this thread */
    float acc0[NT / 2], acc1[NT / 2], tmp0[NT / 2], tmp1[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; i++) {
        acc0[i] = 0.0f;
        acc1[i] = 0.0f;
        tmp0[i] = 0.0f;
        tmp1[i] = 0.0f;
    }
    for (int i = 0; i < nk; i++) {
        const int s = i % S;
        uint8_t *st = smem + s * SL::STAGE_BYTES;
        mbar_wait(&full[s], (i / S) & 1);
        const int *flags = reinterpret_cast<const int *>(st + SL::OFF_FLAG);
        /* the exact path per m64 half: producer warps 0-1 wrote the flags of rows 0-63, warps 2-3 of 64-127 */
        const bool pg0 = AG == 32 || (flags[0] | flags[1]) != 0;
        const bool pg1 = AG == 32 || (flags[2] | flags[3]) != 0;
        const uint32_t wb = smem_u32(st + SL::OFF_W), ab = smem_u32(st + SL::OFF_ACT + cw * NT * 128);
        /* descriptors of sub-tile h (K 64h..64h+63): weight rows 0-63, 64-127, this consumer's tokens */
        const uint64_t da0[2] = {wgmma_desc_sw128(wb), wgmma_desc_sw128(wb + SL::W_HALF)};
        const uint64_t da1[2] = {wgmma_desc_sw128(wb + 64 * 128), wgmma_desc_sw128(wb + SL::W_HALF + 64 * 128)};
        const uint64_t db[2] = {wgmma_desc_sw128(ab), wgmma_desc_sw128(ab + SL::A_HALF)};
        const float *asc = reinterpret_cast<const float *>(st + SL::OFF_ASC);
        const float *sb = reinterpret_cast<const float *>(st + SL::OFF_SB);
        if (!pg0 && !pg1) {
            fence_regs(tmp0);
            fence_regs(tmp1);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 8; ks++) { /* k16 step ks: sub-tile ks / 4, slice ks % 4 */
                MMA::mma(tmp0, da0[ks >> 2] + 2 * (ks & 3), db[ks >> 2] + 2 * (ks & 3), ks);
                MMA::mma(tmp1, da1[ks >> 2] + 2 * (ks & 3), db[ks >> 2] + 2 * (ks & 3), ks);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(tmp0);
            fence_regs(tmp1);
            promote<NT, AGPB>(acc0, tmp0, sb, asc, 0, r0, col0);
            promote<NT, AGPB>(acc1, tmp1, sb + 64, asc, 0, r0, col0);
        } else {
            /* a flagged half is promoted after each 32-group (two k16 steps) with its own factors
             * (scale-d = 0 restarts its scratch sum); an unflagged half keeps summing, promoted once */
#pragma unroll
            for (int g = 0; g < 4; g++) {
                fence_regs(tmp0);
                fence_regs(tmp1);
                wgmma_fence();
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int ks = 2 * g + h;
                    MMA::mma(tmp0, da0[ks >> 2] + 2 * (ks & 3), db[ks >> 2] + 2 * (ks & 3), pg0 ? h : ks);
                    MMA::mma(tmp1, da1[ks >> 2] + 2 * (ks & 3), db[ks >> 2] + 2 * (ks & 3), pg1 ? h : ks);
                }
                wgmma_commit();
                wgmma_wait_all();
                fence_regs(tmp0);
                fence_regs(tmp1);
                if (pg0)
                    promote<NT, AGPB>(acc0, tmp0, sb + g * WROWS, asc, AG == 32 ? g : 0, r0, col0);
                if (pg1)
                    promote<NT, AGPB>(acc1, tmp1, sb + g * WROWS + 64, asc, AG == 32 ? g : 0, r0, col0);
            }
            if (!pg0)
                promote<NT, AGPB>(acc0, tmp0, sb, asc, 0, r0, col0);
            if (!pg1)
                promote<NT, AGPB>(acc1, tmp1, sb + 64, asc, 0, r0, col0);
        }
        mbar_arrive(&empty[s]);
    }
    /* ---------------------------------------------------------------- epilogue */
#pragma unroll
    for (int j = 0; j < NT / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = col0 + 8 * j + e; /* token row of the tile */
            if (t >= nrows)
                continue;
            const int pr = row0 + t;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + 8 * h;
                const float a0 = acc0[4 * j + 2 * h + e], a1 = acc1[4 * j + 2 * h + e];
                if (p.partial != nullptr) {
                    float *prow = p.partial + ((size_t)blockIdx.z * p.partial_rows + pr) * p.partial_cols;
                    if (EPI == MMOE_EPI_SWIGLU) {
                        prow[nb * 64 + r] = a0;
                        prow[p.n_out + nb * 64 + r] = a1;
                    } else {
                        prow[nb * WROWS + r] = a0;
                        prow[nb * WROWS + 64 + r] = a1;
                    }
                } else if (EPI == MMOE_EPI_SWIGLU) {
                    const float w = p.pool != nullptr ? p.pool[pr].weight : 1.0f;
                    p.out_f32[(size_t)pr * p.n_out + nb * 64 + r] = mmoe_swiglu_channel(a0, a1, p.clamp, w);
                } else {
                    int token = pr, slot = p.shared_slot;
                    if (p.pool != nullptr) {
                        token = p.pool[pr].token;
                        slot = p.pool[pr].slot;
                    }
                    __nv_bfloat16 *orow = p.out_slots + ((size_t)token * p.slots + slot) * p.n_out;
                    orow[nb * WROWS + r] = __float2bfloat16_rn(a0);
                    orow[nb * WROWS + 64 + r] = __float2bfloat16_rn(a1);
                }
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
        return mmoe_launch_gemm_kernel(wgmma_gemm_kernel<BT, BFMT, AG, EPI>, grid, wg_cfg<BT>::THREADS,
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
