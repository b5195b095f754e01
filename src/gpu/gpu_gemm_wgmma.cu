/**
 * @file gpu_gemm_wgmma.cu
 * @brief The grouped GEMM on sm_90a: warp-specialized, mbarrier ring, wgmma from shared memory.
 *
 * The same computation as gpu_gemm.cu (read that chapter first: the operands,
 * the scale folding and its exactness, the epilogues are identical), organised
 * the way Hopper wants it:
 *
 *   - **Roles.**  Warpgroup 0 is the *producer*: it copies the raw bytes of each
 *     K block into a ring of shared-memory stages with cp.async and decodes the
 *     E2M1 weight codes into E4M3 there.  Warpgroups 1 (and 2) are *consumers*:
 *     they run `wgmma` on the decoded stage and promote the partial sums into
 *     FP32 accumulators.  No block-wide barrier sits in the K loop; the roles
 *     meet only at two mbarriers per stage ("full": the producer's 128 threads
 *     have landed and decoded stage s; "empty": every consumer thread is done
 *     reading it).
 *   - **Swap AB.**  The weights are the wgmma's M operand (64 rows per
 *     instruction; a tile of 128 weight rows is two m64 halves: gate and up for
 *     L1, so SwiGLU stays in registers), the tokens its N operand (16, 32 or 64
 *     per warpgroup).  MoE tiles have few tokens per expert: with tokens as N the
 *     tensor-core work is not padded to 64 tokens.
 *   - **Layout.**  Both operands are K-major, 128 bytes (one K block) per row,
 *     in the 128-byte swizzle of gpu_wgmma.cuh.  The producer writes the
 *     decoded weight rows and places each activation chunk at its swizzled
 *     position directly with cp.async; FP8 weights (the shared expert) need no
 *     decode and are copied straight into place.
 *   - **Promotion.**  Per K block (128) the four k32 wgmmas of each half sum
 *     into a scratch accumulator (scale-d = 0 on the first), which is then added
 *     to the FP32 accumulator times a_scale(token) * 2^(base - 127)(row), with the
 *     same rounding as the mma.sync kernel.  When a weight row's four UE8M0
 *     exponents span more than E4M3 can hold (or with SM100's per-32 activation
 *     scales), every k32 part is promoted on its own: the exact path.  Here the
 *     decision is taken per stage and per m64 half (from one flag per producer
 *     warp of 32 rows): rows of a flagged warp are decoded unscaled and promoted
 *     with 2^(k_g - 127) per group; the other rows of a flagged half keep their
 *     folded values and are promoted with 2^(base - 127) per group: the same
 *     products, summed in a different order than the mma.sync kernel (whose flag
 *     covers 8 rows), so the two kernels may differ in the last FP32 bits there.
 *   - **Overlap.**  The producer decodes block i while the consumers multiply
 *     block i - 1 (its copies run S - 2 blocks ahead of the decode).
 *
 * Tile sizes: BT = 16 tokens (one consumer warpgroup, wgmma n16, 3 stages, two
 * blocks per SM), BT = 64 (two consumer warpgroups of n32, 4 stages) or BT = 128
 * (two of n64, 4 stages).  The grid is the mma.sync kernel's: (tile, 128-row
 * weight block, K split).
 *
 * The kernel body exists only for sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`): wgmma
 * is not part of sm_100a.  The host chooses it only on a compute-capability-9.0
 * device; elsewhere the portable kernel runs and the layer reports why.
 */
#include "gpu_internal.cuh"
#include "gpu_e2m1_decode.cuh"
#include "gpu_wgmma.cuh"

namespace {

constexpr int WROWS = 128;     /* weight rows per tile: two m64 halves */
constexpr int WK = 128;        /* K per step (one promotion block on SM90) */
constexpr int RAW_STRIDE = 80; /* raw E2M1 row stride in shared memory: 64 bytes + 16 of padding (no bank conflicts) */

/** Thread roles and pipeline depth per tile width. */
template <int BT>
struct wg_cfg {
    static constexpr int NWG = BT == 16 ? 1 : 2;      /* consumer warpgroups */
    static constexpr int NT = BT / NWG;               /* tokens (wgmma N) per consumer warpgroup */
    static constexpr int THREADS = 128 * (1 + NWG);
    static constexpr int STAGES = BT == 16 ? 3 : 4;
    static constexpr int MIN_BLOCKS = BT == 16 ? 2 : 1;
};

/** Shared-memory layout: STAGES stages (1024-aligned), then the barriers, row map and decode tables. */
template <int BT, int BFMT, int AG>
struct wg_layout {
    static constexpr int AGPB = WK / AG;                                  /* activation scales per row and step */
    static constexpr int OFF_WDEC = 0;                                    /* 128 x 128 B E4M3, swizzled */
    static constexpr int OFF_ACT = WROWS * 128;                           /* BT x 128 B E4M3, swizzled */
    static constexpr int OFF_WRAW = OFF_ACT + BT * 128;                   /* FP4: 128 x RAW_STRIDE raw codes */
    static constexpr int WRAW_BYTES = BFMT == MMOE_B_FP4 ? WROWS * RAW_STRIDE : 0;
    static constexpr int OFF_WSC = OFF_WRAW + WRAW_BYTES;                 /* 128 x 4 UE8M0 bytes */
    static constexpr int OFF_ASC = OFF_WSC + WROWS * 4;                   /* BT x AGPB FP32 */
    static constexpr int OFF_SB = OFF_ASC + BT * AGPB * 4;                /* [4][128] FP32 promotion factors */
    static constexpr int OFF_FLAG = OFF_SB + 4 * WROWS * 4;               /* 4 ints: exact path, per producer warp */
    static constexpr int STAGE_BYTES = (OFF_FLAG + 16 + 1023) / 1024 * 1024;
    static constexpr int STAGES = wg_cfg<BT>::STAGES;
    static constexpr int OFF_BAR = STAGES * STAGE_BYTES;                  /* full[STAGES], empty[STAGES] */
    static constexpr int OFF_AROW = OFF_BAR + 2 * STAGES * 8;             /* BT ints: A row of each tile row */
    static constexpr int OFF_LUT = OFF_AROW + BT * 4;                     /* 16 x uint2 decode tables */
    static constexpr int TOTAL = OFF_LUT + 16 * 8 + 1024;                 /* + slack to align the base */
};

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
    static_assert(wg_layout<BT, BFMT, AG>::OFF_WDEC % 1024 == 0 && wg_layout<BT, BFMT, AG>::OFF_ACT % 1024 == 0 &&
                      (wg_layout<BT, BFMT, AG>::OFF_ACT + wg_cfg<BT>::NT * 128) % 1024 == 0,
                  "swizzled tiles (and each consumer's token half) start on 1024-byte boundaries");
    static_assert(wg_layout<BT, BFMT, AG>::TOTAL <= 227 * 1024 &&
                      wg_cfg<BT>::MIN_BLOCKS * (wg_layout<BT, BFMT, AG>::TOTAL + 1024) <= 228 * 1024,
                  "the stages fit the shared memory of MIN_BLOCKS blocks per SM (each block reserves 1 KB)");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using CFG = wg_cfg<BT>;
    using SL = wg_layout<BT, BFMT, AG>;
    constexpr int S = SL::STAGES, AGPB = SL::AGPB, NT = CFG::NT, NWG = CFG::NWG;
    constexpr int BROW = BFMT == MMOE_B_FP4 ? WK / 2 : WK; /* raw weight bytes per row and K block */

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
    if (tid < 16) {
        uint32_t lo, hi;
        e2m1_lut(tid - 8, &lo, &hi);
        sLut[tid] = make_uint2(lo, hi);
    }
    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 128);
            mbar_init(&empty[s], 128 * NWG);
        }
    }
    /* token rows past the tile's end are never loaded: zero them (and their scales) once */
    for (int s = 0; s < S; s++) {
        uint8_t *st = smem + s * SL::STAGE_BYTES;
        for (int i = tid; i < BT * 8; i += CFG::THREADS)
            if (i / 8 >= nrows)
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
        /*
         * Step j: wait until block j - S has been released, issue the copies of block j, then
         * decode block i = j - P.  With P = S - 2 the decode of block i waits (through that
         * release) only for block i - 2, so it overlaps the consumers' MMAs on block i - 1;
         * with P = S - 1 decode and MMA would strictly alternate (review finding, 2026-11-29).
         */
        static_assert(S >= 3, "the decode runs one block ahead of the MMAs");
        constexpr int P = S - 2; /* K blocks whose copies are in flight ahead of the decode */
        for (int j = 0; j < nk + P; j++) {
            if (j < nk) {
                if (j >= S)
                    mbar_wait(&empty[j % S], ((j / S) - 1) & 1);
                uint8_t *st = smem + (j % S) * SL::STAGE_BYTES;
                const int kb = kb0 + j;
                for (int i = n; i < BT * 8; i += 128) {
                    const int r = i >> 3, c = i & 7, ar = sArow[r];
                    if (ar >= 0)
                        cp_async16(st + SL::OFF_ACT + sw128_offset(r, c), p.a + (size_t)ar * K + (size_t)kb * WK + c * 16);
                }
                for (int i = n; i < BT * AGPB; i += 128) {
                    const int ar = sArow[i / AGPB];
                    if (ar >= 0)
                        cp_async4(st + SL::OFF_ASC + i * 4,
                                  p.a_scale + (size_t)ar * (K / AG) + (size_t)kb * AGPB + i % AGPB);
                }
                const uint8_t *wrow = bexp + (size_t)kb * (WROWS * BROW) + (size_t)n * BROW;
                if (BFMT == MMOE_B_FP4) {
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        cp_async16(st + SL::OFF_WRAW + n * RAW_STRIDE + c * 16, wrow + c * 16);
                } else {
#pragma unroll
                    for (int c = 0; c < 8; c++)
                        cp_async16(st + SL::OFF_WDEC + sw128_offset(n, c), wrow + c * 16);
                }
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
            const int fold_ok = BFMT == MMOE_B_FP4 ? (kmax - kmin <= 14) : (kmax == kmin);
            const int flag = AG == 32 ? 1 : (__ballot_sync(0xffffffffu, !fold_ok) != 0u);
            if (lane == 0)
                reinterpret_cast<int *>(st + SL::OFF_FLAG)[warp] = flag;
            const int base = BFMT == MMOE_B_FP4 ? kmax - 6 : kmax;
            float *sb = reinterpret_cast<float *>(st + SL::OFF_SB);
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const int kg = (int)((sw >> (8 * g)) & 0xffu);
                sb[g * WROWS + n] = pow2i((flag ? kg : base) - 127);
            }
            if (BFMT == MMOE_B_FP4) {
                const uint4 *src = reinterpret_cast<const uint4 *>(st + SL::OFF_WRAW + n * RAW_STRIDE);
                uint8_t *dst = st + SL::OFF_WDEC;
#pragma unroll
                for (int q = 0; q < 4; q++) { /* 16 bytes = 32 codes = one 32-group */
                    const uint4 v = src[q];
                    const int kq = (int)((sw >> (8 * q)) & 0xffu);
                    const uint2 lut = sLut[(flag ? 0 : kq - base) + 8];
                    uint4 o0, o1;
                    decode8(v.x, lut.x, lut.y, &o0.x, &o0.y);
                    decode8(v.y, lut.x, lut.y, &o0.z, &o0.w);
                    decode8(v.z, lut.x, lut.y, &o1.x, &o1.y);
                    decode8(v.w, lut.x, lut.y, &o1.z, &o1.w);
                    *reinterpret_cast<uint4 *>(dst + sw128_offset(n, 2 * q)) = o0;
                    *reinterpret_cast<uint4 *>(dst + sw128_offset(n, 2 * q + 1)) = o1;
                }
            }
            fence_proxy_async_smem();
            mbar_arrive(&full[i % S]);
        }
        return;
    }

    /* ---------------------------------------------------------------- consumers */
    using MMA = wgmma_e4m3<NT>;
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
        const uint32_t wdec = smem_u32(st + SL::OFF_WDEC);
        const uint64_t da0 = wgmma_desc_sw128(wdec), da1 = wgmma_desc_sw128(wdec + 64 * 128);
        const uint64_t db = wgmma_desc_sw128(smem_u32(st + SL::OFF_ACT + cw * NT * 128));
        const float *asc = reinterpret_cast<const float *>(st + SL::OFF_ASC);
        const float *sb = reinterpret_cast<const float *>(st + SL::OFF_SB);
        if (!pg0 && !pg1) {
            fence_regs(tmp0);
            fence_regs(tmp1);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                MMA::mma(tmp0, da0 + 2 * ks, db + 2 * ks, ks);
                MMA::mma(tmp1, da1 + 2 * ks, db + 2 * ks, ks);
            }
            wgmma_commit();
            wgmma_wait_all();
            fence_regs(tmp0);
            fence_regs(tmp1);
            promote<NT, AGPB>(acc0, tmp0, sb, asc, 0, r0, col0);
            promote<NT, AGPB>(acc1, tmp1, sb + 64, asc, 0, r0, col0);
        } else {
            /* a flagged half is promoted after each k32 part with its own factors (scale-d = 0
             * restarts its scratch sum); an unflagged half keeps summing and is promoted once */
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                fence_regs(tmp0);
                fence_regs(tmp1);
                wgmma_fence();
                MMA::mma(tmp0, da0 + 2 * ks, db + 2 * ks, pg0 ? 0 : ks);
                MMA::mma(tmp1, da1 + 2 * ks, db + 2 * ks, pg1 ? 0 : ks);
                wgmma_commit();
                wgmma_wait_all();
                fence_regs(tmp0);
                fence_regs(tmp1);
                if (pg0)
                    promote<NT, AGPB>(acc0, tmp0, sb + ks * WROWS, asc, AG == 32 ? ks : 0, r0, col0);
                if (pg1)
                    promote<NT, AGPB>(acc1, tmp1, sb + ks * WROWS + 64, asc, AG == 32 ? ks : 0, r0, col0);
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
                    float g = bf16_round(a0), u = bf16_round(a1);
                    if (p.clamp > 0.0f) {
                        const float cb = bf16_round(p.clamp);
                        g = fminf(g, cb);
                        u = fminf(fmaxf(u, -cb), cb);
                    }
                    const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
                    p.out_f32[(size_t)pr * p.n_out + nb * 64 + r] = __fmul_rn(__fmul_rn(__fmul_rn(g, sig), u), w);
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

cudaError_t mmoe_launch_gemm_wgmma(const mmoe_gemm_args *args, int block_m, int b_fmt, int a_group, int epi,
                                   int max_tiles, cudaStream_t stream)
{
    if (max_tiles <= 0)
        return cudaSuccess;
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
