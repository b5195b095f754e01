/**
 * @file gpu_gemm.cu
 * @brief The grouped GEMM of the GPU layer: FP8 activations x MXFP4 (or FP8) weights on tensor cores.
 *
 * One thread block (4 or 8 warps) computes a tile of BLOCK_M pool rows (tokens of
 * one expert) by 128 weight rows, walking K in blocks of 128:
 *
 *   - A (activations): BLOCK_M rows of FP8 E4M3, gathered by token for the
 *     routed L1 (no permuted copy of x is made), with FP32 scales per row and
 *     per group of AG = 128 (SM90) or 32 (SM100) channels.
 *   - B (weights): 128 rows.  For L1 these are 64 gate rows and the 64 up rows
 *     of the same intermediate channels, so that SwiGLU runs in registers.
 *     The layer stores the weights tile-major (gpu_moe.cu): the 128 rows x one
 *     K block of a tile are contiguous, so each pipeline step streams one
 *     contiguous block (8 KB of E2M1 codes) instead of 128 scattered pieces.
 *     MXFP4 rows are decoded to E4M3 in shared memory, tile by tile; the
 *     weights stay packed in global memory.
 *   - The product runs on `mma.sync.m16n8k32` FP8 tensor-core instructions
 *     (FP32 accumulate), portable to sm_89 and later; see "iteration" below.
 *
 * **Scales and exactness.**  A weight is e2m1(code) * 2^(k_g - 127) with one
 * exponent byte k_g per 32 along K.  Within a 128-wide K block (the SM90
 * promotion block, where the activation scale is constant) the four k_g are
 * folded into the E4M3 values: with base = max_g k_g - 6, each value is
 * written as e2m1(code) * 2^(k_g - base), an E4M3 number, and 2^(base-127) is
 * applied in FP32 when the block's partial sum is promoted into the
 * accumulator.  E2M1 magnitudes {0.5 .. 6} times 2^r are E4M3 numbers exactly
 * when -8 <= r <= 6, so the fold is exact iff max_g k_g - min_g k_g <= 14.
 * Rows whose block spans more are detected here (and counted when the layer
 * is created); the 8-row MMA column group holding such a row takes the exact
 * path: its codes are decoded unscaled and each 32-wide part is promoted on
 * its own with its own factor 2^(k_g - 127).  FP8 weights (the shared expert)
 * fold only when the four bytes are equal (then r = 0).  With SM100's
 * per-32 activation scales every 32-wide part is promoted on its own anyway.
 * Every product of an FP8 and an E4M3 value is exact in the tensor core, so
 * the only difference from the oracle is the order of the FP32 additions.
 *
 * **Epilogues.**  L1: gate and up accumulators are rounded to BF16, clamped
 * in BF16, and a = (g * sigmoid(g)) * u * w is computed in FP32 (expf, IEEE
 * division: the oracle's precise mode) and stored FP32 for the requantizer.
 * L2: each output is rounded to BF16 and stored into the (token, slot) row of
 * the combine buffer.
 *
 * **Pipeline.**  The raw bytes of each K block (activation rows, packed weight
 * rows, their scales) are fetched with cp.async into a ring of STAGES shared-
 * memory stages, STAGES-1 blocks ahead of the tensor cores, so that the loads
 * of later blocks overlap the decode and the MMAs of the current one.
 *
 * The sm_90a family (gpu_gemm_wgmma.cu) computes the same GEMM with
 * warp-specialized wgmma; the layer picks between the two per call size.
 */
#include "gpu_internal.cuh"
#include "gpu_e2m1_decode.cuh"

namespace {

constexpr int BN = 128;        /* weight rows per tile */
constexpr int BK = 128;        /* K per pipeline step */
constexpr int LDS = BK + 16;   /* shared-memory row stride in bytes (bank-conflict padding) */
/*
 * Threads per block: 4 warps for the small tile (block_m 16: more blocks per SM is better
 * there), 8 warps for block_m 64 (two threads decode each weight row; registers limit the
 * large tile to 2 blocks per SM, so the extra warps are what hides the latency).
 */
template <int BM>
struct threads_of {
    static constexpr int value = BM == 16 ? 128 : 256;
};

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/*
 * K blocks in flight (the cp.async ring).  The small-tile kernel (block_m 16, the
 * memory-bound decode regime) keeps 2 stages, so that 4 thread blocks fit on an SM
 * (Nsight Compute showed it limited by shared memory at 3 with 4 stages, issuing on 54% of
 * the cycles); the large-tile kernel is limited by registers to 2 blocks and keeps 4.
 */
template <int BM>
struct stages_of {
    static constexpr int value = BM == 16 ? 2 : 4;
};

/** Shared-memory layout of one kernel instance (dynamic shared memory). */
template <int BM, int BFMT, int AG>
struct smem_layout {
    static constexpr int STAGES = stages_of<BM>::value;
    static constexpr int AGPB = BK / AG;
    static constexpr int BROW = BFMT == MMOE_B_FP4 ? BK / 2 : BK;          /* raw weight bytes per row and K block */
    static constexpr int BROW_S = BFMT == MMOE_B_FP4 ? BROW + 16 : LDS;     /* its padded stride */
    static constexpr int A_BYTES = BM * LDS;
    static constexpr int BRAW_BYTES = BN * BROW_S;
    static constexpr int STAGE_BYTES = A_BYTES + BRAW_BYTES + BN * 4 + BM * AGPB * 4;
    static constexpr int OFF_A = 0;
    static constexpr int OFF_BRAW = A_BYTES;
    static constexpr int OFF_BSC = A_BYTES + BRAW_BYTES;
    static constexpr int OFF_ASC = OFF_BSC + BN * 4;
    static constexpr int OFF_DEC = STAGES * STAGE_BYTES;                    /* decoded E4M3 tile (FP4 only) */
    static constexpr int DEC_BYTES = BFMT == MMOE_B_FP4 ? BN * LDS : 0;
    static constexpr int TOTAL = OFF_DEC + DEC_BYTES;
};

template <int BM, int BFMT, int AG, int EPI>
__global__ void __launch_bounds__(threads_of<BM>::value, BM == 16 ? 4 : 2) gemm_kernel(const mmoe_gemm_args p)
{
    constexpr int THREADS = threads_of<BM>::value;
    constexpr int TPR = THREADS / BN;         /* threads per weight row in the decode */
    constexpr int GPT = 4 / TPR;              /* 32-groups of a K block per decoding thread */
    constexpr int WM = BM == 16 ? 1 : 2;      /* warps along M */
    constexpr int WN = THREADS / 32 / WM;     /* warps along N */
    constexpr int MT = BM / (16 * WM);        /* m16 tiles per warp */
    constexpr int NTH = 8 / WN;               /* n8 tiles per warp in each half (gate / up) */
    constexpr int NT = 2 * NTH;
    using SL = smem_layout<BM, BFMT, AG>;
    constexpr int AGPB = SL::AGPB;
    constexpr int STAGES = SL::STAGES;

    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float sBs[4][BN];      /* per 32-group (row of this array) and weight row: the FP32 factor */
    __shared__ uint2 sLut[16];        /* E2M1 magnitude -> E4M3 tables for the shifts r = -8..7 */
    __shared__ int sTileFlag[BN / 8];
    __shared__ int sArow[BM];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;

    mmoe_gemm_work wk;
    if (!mmoe_gemm_work_of(p, (mmoe_epi)EPI, BM, &wk))
        return;
    const mmoe_gemm_block blk = wk.blk;
    const int expert = wk.expert, row0 = wk.row0, nrows = wk.nrows;
    const int nb = blk.nb;
    const int K = p.K;
    const int nkb = K / BK;
    /* split K: this block sums K blocks [kb0, kb0 + nk) only (all of them without a split) */
    const int kb0 = wk.kb0, nk = wk.nk;

    for (int r = tid; r < BM; r += THREADS) {
        int pr = row0 + r;
        sArow[r] = r < nrows ? (p.a_gather != nullptr ? p.a_gather[pr].token : pr) : -1;
    }
    if (tid < 16) {
        uint32_t lo, hi;
        e2m1_lut(tid - 8, &lo, &hi);
        sLut[tid] = make_uint2(lo, hi);
    }
    /* rows past the tile's end stay zero in every stage: write them once */
    for (int st = 0; st < STAGES; st++) {
        uint8_t *stage = smem + st * SL::STAGE_BYTES;
        for (int i = tid; i < BM * (LDS / 16); i += THREADS) {
            int r = i / (LDS / 16);
            if (r >= nrows)
                *reinterpret_cast<uint4 *>(stage + SL::OFF_A + i * 16) = make_uint4(0, 0, 0, 0);
        }
        for (int i = tid; i < BM * AGPB; i += THREADS)
            if (i / AGPB >= nrows)
                reinterpret_cast<float *>(stage + SL::OFF_ASC)[i] = 0.0f;
    }
    __syncthreads();

    /* weights are stored tile-major: tile (nb, kb) = 128 rows x one K block, contiguous */
    const uint8_t *bexp = p.b + (size_t)expert * p.b_expert_stride + (size_t)nb * nkb * (BN * SL::BROW);
    const uint8_t *bsexp = p.b_scale + (size_t)expert * p.bs_expert_stride + (size_t)nb * nkb * (BN * 4);

    /* issue the copies of K block kb into stage st */
    auto load_stage = [&](int st, int kb) {
        uint8_t *stage = smem + st * SL::STAGE_BYTES;
        for (int i = tid; i < BM * 8; i += THREADS) {
            int r = i >> 3, c = i & 7;
            int ar = sArow[r];
            if (ar >= 0)
                cp_async16(stage + SL::OFF_A + r * LDS + c * 16, p.a + (size_t)ar * K + (size_t)kb * BK + c * 16);
        }
        for (int i = tid; i < BM * AGPB; i += THREADS) {
            int ar = sArow[i / AGPB];
            if (ar >= 0)
                cp_async4(stage + SL::OFF_ASC + i * 4, p.a_scale + (size_t)ar * (K / AG) + (size_t)kb * AGPB + i % AGPB);
        }
        constexpr int CPR = SL::BROW / 16; /* 16-byte chunks per weight row */
        const uint8_t *btile = bexp + (size_t)kb * (BN * SL::BROW);
        for (int i = tid; i < BN * CPR; i += THREADS) {
            int n = i / CPR, c = i % CPR;
            cp_async16(stage + SL::OFF_BRAW + n * SL::BROW_S + c * 16, btile + (size_t)i * 16);
        }
        if (tid < BN)
            cp_async4(stage + SL::OFF_BSC + tid * 4, bsexp + (size_t)kb * (BN * 4) + tid * 4);
    };

    float acc[MT][NT][4];
    float tmp[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                acc[i][j][c] = 0.0f;
                tmp[i][j][c] = 0.0f;
            }

#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < nk)
            load_stage(st, kb0 + st);
        cp_async_commit();
    }

    for (int it = 0; it < nk; it++) {
        const int st = it % STAGES;
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* stage st landed for everyone; the previous step's readers are done */
        if (it + STAGES - 1 < nk)
            load_stage((it + STAGES - 1) % STAGES, kb0 + it + STAGES - 1);
        cp_async_commit();
        const uint8_t *stage = smem + st * SL::STAGE_BYTES;
        const uint8_t *sA = stage + SL::OFF_A;
        const float *sAs = reinterpret_cast<const float *>(stage + SL::OFF_ASC);

        /* ---- B: scale exponents of this row's four 32-groups; can they be folded? */
        const int brow = tid / TPR, bhalf = tid % TPR; /* this thread's weight row and part of it */
        const uint32_t sw = reinterpret_cast<const uint32_t *>(stage + SL::OFF_BSC)[brow];
        int kmax, kmin;
        scale_span(sw, &kmax, &kmin);
        const int fold_ok = BFMT == MMOE_B_FP4 ? (kmax - kmin <= 14) : (kmax == kmin);
        /*
         * The 8 rows of an MMA column group are decoded by 8 * TPR consecutive lanes of one warp
         * (row = tid / TPR), so one warp vote gives the group's flag, without a shared-memory
         * array of per-row flags or a block-wide barrier for it (the K step has two).
         */
        const uint32_t unfoldable = __ballot_sync(0xffffffffu, !fold_ok);
        static_assert(TPR == 1 || TPR == 2, "a column group spans 8 or 16 lanes of one warp");
        constexpr uint32_t GROUP_MASK = TPR == 1 ? 0xffu : 0xffffu;
        const int group_lane0 = lane & ~(8 * TPR - 1);
        const int tile_flag = ((unfoldable >> group_lane0) & GROUP_MASK) != 0u;
        if (tid % (8 * TPR) == 0)
            sTileFlag[brow >> 3] = tile_flag;
        const int base = BFMT == MMOE_B_FP4 ? kmax - 6 : kmax;
#pragma unroll
        for (int gg = 0; gg < GPT; gg++) {
            const int g = GPT * bhalf + gg;
            const int kg = byte_of(sw, g);
            sBs[g][brow] = pow2i((tile_flag ? kg : base) - 127);
        }
        const uint8_t *sB;
        if (BFMT == MMOE_B_FP4) {
            uint8_t *dec = smem + SL::OFF_DEC;
            const uint4 *src = reinterpret_cast<const uint4 *>(stage + SL::OFF_BRAW + brow * SL::BROW_S);
            uint8_t *dst = dec + brow * LDS;
#pragma unroll
            for (int qq = 0; qq < GPT; qq++) { /* 16 bytes = 32 codes = one 32-group */
                const int q = GPT * bhalf + qq;
                const uint4 v = src[q];
                const int kq = (int)((sw >> (8 * q)) & 0xffu);
                const uint2 lut = sLut[(tile_flag ? 0 : kq - base) + 8];
                uint4 o0, o1;
                decode8(v.x, lut.x, lut.y, &o0.x, &o0.y);
                decode8(v.y, lut.x, lut.y, &o0.z, &o0.w);
                decode8(v.z, lut.x, lut.y, &o1.x, &o1.y);
                decode8(v.w, lut.x, lut.y, &o1.z, &o1.w);
                *reinterpret_cast<uint4 *>(dst + q * 32) = o0;
                *reinterpret_cast<uint4 *>(dst + q * 32 + 16) = o1;
            }
            sB = dec;
        } else {
            sB = stage + SL::OFF_BRAW; /* FP8 weights are used as they are */
        }
        __syncthreads();

        /* ---- tensor-core steps of 32 along K */
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint8_t *base_a = sA + (wm * MT * 16 + mt * 16 + gid) * LDS + ks * 32 + tig * 4;
                af[mt][0] = *reinterpret_cast<const uint32_t *>(base_a);
                af[mt][1] = *reinterpret_cast<const uint32_t *>(base_a + 8 * LDS);
                af[mt][2] = *reinterpret_cast<const uint32_t *>(base_a + 16);
                af[mt][3] = *reinterpret_cast<const uint32_t *>(base_a + 8 * LDS + 16);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int ntile = j < NTH ? wn * NTH + j : 8 + wn * NTH + (j - NTH);
                const uint8_t *base_b = sB + (ntile * 8 + gid) * LDS + ks * 32 + tig * 4;
                uint32_t b0 = *reinterpret_cast<const uint32_t *>(base_b);
                uint32_t b1 = *reinterpret_cast<const uint32_t *>(base_b + 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    mma_e4m3(tmp[mt][j], af[mt], b0, b1);
                const bool per_group = AG == 32 || sTileFlag[ntile] != 0;
                if (per_group) {
                    const float2 sb = *reinterpret_cast<const float2 *>(&sBs[ks][ntile * 8 + tig * 2]);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            const int row = wm * MT * 16 + mt * 16 + gid + (c >> 1) * 8;
                            const float f = __fmul_rn(sAs[row * AGPB + (AG == 32 ? ks : 0)], (c & 1) ? sb.y : sb.x);
                            acc[mt][j][c] = fmaf(tmp[mt][j][c], f, acc[mt][j][c]);
                            tmp[mt][j][c] = 0.0f;
                        }
                }
            }
        }
        if (AG == 128) {
            float sa[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                sa[mt][0] = sAs[wm * MT * 16 + mt * 16 + gid];
                sa[mt][1] = sAs[wm * MT * 16 + mt * 16 + gid + 8];
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int ntile = j < NTH ? wn * NTH + j : 8 + wn * NTH + (j - NTH);
                if (sTileFlag[ntile] != 0)
                    continue;
                const float2 sb = *reinterpret_cast<const float2 *>(&sBs[0][ntile * 8 + tig * 2]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const float f = __fmul_rn(sa[mt][c >> 1], (c & 1) ? sb.y : sb.x);
                        acc[mt][j][c] = fmaf(tmp[mt][j][c], f, acc[mt][j][c]);
                        tmp[mt][j][c] = 0.0f;
                    }
            }
        }
    }
    cp_async_wait<0>();

    /* ---- epilogue */
    if (p.partial != nullptr) {
        /* split K: store the raw FP32 sums; mmoe_launch_split_finish() adds the splits in order */
        float *part = p.partial + (size_t)blk.split * p.partial_rows * p.partial_cols;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = wm * MT * 16 + mt * 16 + gid + h * 8;
                if (r >= nrows)
                    continue;
                float *prow = part + (size_t)(row0 + r) * p.partial_cols;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int ntile = j < NTH ? wn * NTH + j : 8 + wn * NTH + (j - NTH);
                    const int n = ntile * 8 + tig * 2;
                    int col;
                    if (EPI == MMOE_EPI_SWIGLU)
                        col = n < 64 ? nb * 64 + n : p.n_out + nb * 64 + (n - 64);
                    else
                        col = nb * BN + n;
                    *reinterpret_cast<float2 *>(prow + col) = make_float2(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
                }
            }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = wm * MT * 16 + mt * 16 + gid + h * 8;
            if (r >= nrows)
                continue;
            const int pr = row0 + r;
            if (EPI == MMOE_EPI_SWIGLU) {
                const float w = p.pool != nullptr ? p.pool[pr].weight : 1.0f;
#pragma unroll
                for (int j = 0; j < NTH; j++) {
                    const int ntile = wn * NTH + j;
                    float out[2];
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        out[e] = mmoe_swiglu_channel(acc[mt][j][2 * h + e], acc[mt][j + NTH][2 * h + e], p.clamp, w);
                    const int ch = nb * 64 + ntile * 8 + tig * 2;
                    *reinterpret_cast<float2 *>(p.out_f32 + (size_t)pr * p.n_out + ch) = make_float2(out[0], out[1]);
                }
            } else {
                __nv_bfloat16 *orow = mmoe_gemm_slot_row(p, pr);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int ntile = j < NTH ? wn * NTH + j : 8 + wn * NTH + (j - NTH);
                    const int col = nb * BN + ntile * 8 + tig * 2;
                    *reinterpret_cast<__nv_bfloat162 *>(orow + col) =
                        __floats2bfloat162_rn(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
                }
            }
        }
}

/** Launches the instance of gemm_kernel for tile height BM that mmoe_gemm_dispatch() picks. */
template <int BM>
struct mma_launcher {
    const mmoe_gemm_args *a;
    dim3 grid;
    cudaStream_t s;
    template <int BFMT, int AG, int EPI>
    cudaError_t run() const
    {
        return mmoe_launch_gemm_kernel(gemm_kernel<BM, BFMT, AG, EPI>, grid, threads_of<BM>::value,
                                       smem_layout<BM, BFMT, AG>::TOTAL, s, a);
    }
};

} // namespace

/** Grid-stride body of mmoe_tile_rows(). */
__global__ void tile_rows_kernel(const uint32_t *src, uint32_t *dst, int n_blocks, int nkb, int src_row_words,
                                 int trw, int l1, int half_rows)
{
    const size_t total = (size_t)n_blocks * nkb * BN * trw;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int w = (int)(i % trw);
        const int n = (int)(i / trw % BN);
        const int kb = (int)(i / ((size_t)trw * BN) % nkb);
        const int b = (int)(i / ((size_t)trw * BN * nkb));
        const int row = l1 ? (n < 64 ? b * 64 + n : half_rows + b * 64 + (n - 64)) : b * BN + n;
        dst[i] = src[(size_t)row * src_row_words + (size_t)kb * trw + w];
    }
}

cudaError_t mmoe_tile_rows(const uint32_t *src, uint32_t *dst, int n_blocks, int nkb, int src_row_words,
                           int tile_row_words, int l1_interleave, int half_rows, cudaStream_t stream)
{
    tile_rows_kernel<<<512, 256, 0, stream>>>(src, dst, n_blocks, nkb, src_row_words, tile_row_words, l1_interleave,
                                              half_rows);
    return cudaGetLastError();
}

cudaError_t mmoe_launch_gemm(const mmoe_gemm_args *args, int block_m, mmoe_bfmt b_fmt, int a_group, mmoe_epi epi,
                             int max_tiles, cudaStream_t stream)
{
    if (max_tiles <= 0)
        return cudaSuccess;
    const dim3 grid = mmoe_gemm_grid(args, epi, max_tiles);
    return block_m == 16 ? mmoe_gemm_dispatch(mma_launcher<16>{args, grid, stream}, b_fmt, a_group, epi)
                         : mmoe_gemm_dispatch(mma_launcher<64>{args, grid, stream}, b_fmt, a_group, epi);
}
