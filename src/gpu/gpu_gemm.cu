/**
 * @file gpu_gemm.cu
 * @brief The grouped GEMM of the GPU layer: FP8 activations x MXFP4 (or FP8) weights on tensor cores.
 *
 * One thread block (4 warps) computes a tile of BLOCK_M pool rows (tokens of
 * one expert) by 128 weight rows, walking K in blocks of 128:
 *
 *   - A (activations): BLOCK_M rows of FP8 E4M3, gathered by token for the
 *     routed L1 (no permuted copy of x is made), with FP32 scales per row and
 *     per group of AG = 128 (SM90) or 32 (SM100) channels.
 *   - B (weights): 128 rows.  For L1 these are 64 gate rows and the 64 up rows
 *     of the same intermediate channels, so that SwiGLU runs in registers.
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
 * Iteration plan (not done yet): wgmma with TMA-fed, 128B-swizzled tiles and
 * a persistent warp-specialized schedule.
 */
#include "gpu_internal.cuh"

namespace {

constexpr int BN = 128;        /* weight rows per tile */
constexpr int BK = 128;        /* K per pipeline step */
constexpr int LDS = BK + 16;   /* shared-memory row stride in bytes (bank-conflict padding) */

/** 2^e as a float, exact for e in [-149, 127]. */
__device__ __forceinline__ float pow2i(int e)
{
    return e >= -126 ? __uint_as_float((uint32_t)(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

/**
 * E4M3 byte of the E2M1 magnitude code c3 (0..7) times 2^r, for -8 <= r <= 6
 * (exact there).  E2M1: c3 = 1 is 0.5; c3 >= 2 is (1 + (c3&1)/2) * 2^((c3>>1)-1).
 */
__device__ __forceinline__ uint32_t e2m1_mag_to_e4m3(int c3, int r)
{
    if (c3 == 0)
        return 0u;
    int x = c3 >= 2 ? (c3 >> 1) - 1 : -1;   /* unbiased exponent */
    int m = c3 >= 2 ? (c3 & 1) : 0;          /* the one mantissa bit */
    int xs = x + r;
    if (xs >= -6)
        return (uint32_t)(((xs + 7) << 3) | (m << 2));
    /* subnormal: value / 2^-9 = (2 + m) * 2^(xs + 8) */
    int units = xs + 8 >= 0 ? (2 + m) << (xs + 8) : (2 + m) >> 1;
    return (uint32_t)units;
}

/** Lookup table of the 8 E2M1 magnitudes scaled by 2^r, as 8 E4M3 bytes in two words. */
__device__ __forceinline__ void e2m1_lut(int r, uint32_t *lo, uint32_t *hi)
{
    uint32_t l = 0, h = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        l |= e2m1_mag_to_e4m3(c, r) << (8 * c);
        h |= e2m1_mag_to_e4m3(c + 4, r) << (8 * c);
    }
    *lo = l;
    *hi = h;
}

/** Four E2M1 codes (one 16-bit half of a packed word, low nibble first) to four E4M3 bytes. */
__device__ __forceinline__ uint32_t decode4(uint32_t codes16, uint32_t lo, uint32_t hi)
{
    uint32_t mag = __byte_perm(lo, hi, codes16 & 0x7777u);
    uint32_t s = codes16 & 0x8888u;
    uint32_t sign = ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) | ((s & 0x8000u) << 16);
    return mag | sign;
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_round(float x)
{
    return __bfloat162float(__float2bfloat16_rn(x));
}

template <int BM, int BFMT, int AG, int EPI>
__global__ void __launch_bounds__(128) gemm_kernel(const mmoe_gemm_args p)
{
    constexpr int WM = BM == 16 ? 1 : 2;      /* warps along M */
    constexpr int WN = 4 / WM;                /* warps along N */
    constexpr int MT = BM / (16 * WM);        /* m16 tiles per warp */
    constexpr int NTH = 8 / WN;               /* n8 tiles per warp in each half (gate / up) */
    constexpr int NT = 2 * NTH;
    constexpr int AGPB = BK / AG;             /* activation scale groups per K block */

    __shared__ __align__(16) uint8_t sA[BM * LDS];
    __shared__ __align__(16) uint8_t sB[BN * LDS];
    __shared__ float sBs[BN][4];
    __shared__ float sAs[BM][AGPB];
    __shared__ int sRowFlag[BN];
    __shared__ int sTileFlag[BN / 8];
    __shared__ int sArow[BM];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp % WN;
    const int gid = lane >> 2, tig = lane & 3;

    int expert = 0, row0, nrows;
    if (p.tiles != nullptr) {
        if ((int)blockIdx.x >= *p.num_tiles)
            return;
        mmoe_tile tl = p.tiles[blockIdx.x];
        expert = tl.expert;
        row0 = tl.row0;
        nrows = tl.nrows;
    } else {
        row0 = blockIdx.x * BM;
        if (row0 >= p.total_rows)
            return;
        nrows = min(BM, p.total_rows - row0);
    }
    const int nb = blockIdx.y;
    const int K = p.K;

    for (int r = tid; r < BM; r += 128) {
        int pr = row0 + r;
        sArow[r] = r < nrows ? (p.a_gather != nullptr ? p.a_gather[pr].token : pr) : -1;
    }

    /* this thread's weight row in global memory */
    int grow;
    if (EPI == MMOE_EPI_SWIGLU)
        grow = tid < 64 ? nb * 64 + tid : p.b_up_row0 + nb * 64 + (tid - 64);
    else
        grow = nb * BN + tid;
    const size_t brow_bytes = BFMT == MMOE_B_FP4 ? (size_t)K / 2 : (size_t)K;
    const uint8_t *brow = p.b + (size_t)expert * p.b_expert_stride + (size_t)grow * brow_bytes;
    const uint8_t *bsrow = p.b_scale + (size_t)expert * p.bs_expert_stride + (size_t)grow * (K / 32);

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

    for (int kb = 0; kb < K / BK; kb++) {
        __syncthreads(); /* the previous step's readers are done with the tiles */
        /* ---- A tile and its scales */
        for (int i = tid; i < BM * 8; i += 128) {
            int r = i >> 3, c = i & 7;
            int ar = sArow[r];
            uint4 v = make_uint4(0, 0, 0, 0);
            if (ar >= 0)
                v = *reinterpret_cast<const uint4 *>(p.a + (size_t)ar * K + (size_t)kb * BK + c * 16);
            *reinterpret_cast<uint4 *>(sA + r * LDS + c * 16) = v;
        }
        for (int i = tid; i < BM * AGPB; i += 128) {
            int r = i / AGPB, g = i % AGPB;
            int ar = sArow[r];
            sAs[r][g] = ar >= 0 ? p.a_scale[(size_t)ar * (K / AG) + (size_t)kb * AGPB + g] : 0.0f;
        }
        /* ---- B: scale exponents of this row's four 32-groups; can they be folded? */
        uint32_t sw = *reinterpret_cast<const uint32_t *>(bsrow + kb * 4);
        int k[4];
        int kmax = 0, kmin = 255;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            k[g] = (int)((sw >> (8 * g)) & 0xffu);
            kmax = max(kmax, k[g]);
            kmin = min(kmin, k[g]);
        }
        const int fold_ok = BFMT == MMOE_B_FP4 ? (kmax - kmin <= 14) : (kmax == kmin);
        sRowFlag[tid] = !fold_ok;
        __syncthreads();
        int tile_flag = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            tile_flag |= sRowFlag[(tid & ~7) + i];
        if ((tid & 7) == 0)
            sTileFlag[tid >> 3] = tile_flag;
        const int base = BFMT == MMOE_B_FP4 ? kmax - 6 : kmax;
        int r[4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            r[g] = tile_flag ? 0 : k[g] - base;
            sBs[tid][g] = pow2i((tile_flag ? k[g] : base) - 127);
        }
        uint8_t *dst = sB + tid * LDS;
        if (BFMT == MMOE_B_FP4) {
            const uint4 *src = reinterpret_cast<const uint4 *>(brow + (size_t)kb * (BK / 2));
#pragma unroll
            for (int q = 0; q < 4; q++) { /* 16 bytes = 32 codes = one 32-group */
                uint4 v = src[q];
                uint32_t lo, hi;
                e2m1_lut(r[q], &lo, &hi);
                uint32_t w[4] = {v.x, v.y, v.z, v.w};
                uint4 o0, o1;
                o0.x = decode4(w[0] & 0xffffu, lo, hi);
                o0.y = decode4(w[0] >> 16, lo, hi);
                o0.z = decode4(w[1] & 0xffffu, lo, hi);
                o0.w = decode4(w[1] >> 16, lo, hi);
                o1.x = decode4(w[2] & 0xffffu, lo, hi);
                o1.y = decode4(w[2] >> 16, lo, hi);
                o1.z = decode4(w[3] & 0xffffu, lo, hi);
                o1.w = decode4(w[3] >> 16, lo, hi);
                *reinterpret_cast<uint4 *>(dst + q * 32) = o0;
                *reinterpret_cast<uint4 *>(dst + q * 32 + 16) = o1;
            }
        } else {
            const uint4 *src = reinterpret_cast<const uint4 *>(brow + (size_t)kb * BK);
#pragma unroll
            for (int q = 0; q < 8; q++)
                *reinterpret_cast<uint4 *>(dst + q * 16) = src[q];
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
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            const int row = wm * MT * 16 + mt * 16 + gid + (c >> 1) * 8;
                            const int col = ntile * 8 + tig * 2 + (c & 1);
                            const float f = __fmul_rn(sAs[row][AG == 32 ? ks : 0], sBs[col][ks]);
                            acc[mt][j][c] = fmaf(tmp[mt][j][c], f, acc[mt][j][c]);
                            tmp[mt][j][c] = 0.0f;
                        }
                }
            }
        }
        if (AG == 128) {
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int ntile = j < NTH ? wn * NTH + j : 8 + wn * NTH + (j - NTH);
                if (sTileFlag[ntile] != 0)
                    continue;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const int row = wm * MT * 16 + mt * 16 + gid + (c >> 1) * 8;
                        const int col = ntile * 8 + tig * 2 + (c & 1);
                        const float f = __fmul_rn(sAs[row][0], sBs[col][0]);
                        acc[mt][j][c] = fmaf(tmp[mt][j][c], f, acc[mt][j][c]);
                        tmp[mt][j][c] = 0.0f;
                    }
            }
        }
    }

    /* ---- epilogue */
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
                const float cb = p.clamp > 0.0f ? bf16_round(p.clamp) : 0.0f;
#pragma unroll
                for (int j = 0; j < NTH; j++) {
                    const int ntile = wn * NTH + j;
                    float out[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float g = bf16_round(acc[mt][j][2 * h + e]);
                        float u = bf16_round(acc[mt][j + NTH][2 * h + e]);
                        if (p.clamp > 0.0f) {
                            g = fminf(g, cb);
                            u = fminf(fmaxf(u, -cb), cb);
                        }
                        const float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
                        out[e] = __fmul_rn(__fmul_rn(__fmul_rn(g, sig), u), w);
                    }
                    const int ch = nb * 64 + ntile * 8 + tig * 2;
                    *reinterpret_cast<float2 *>(p.out_f32 + (size_t)pr * p.n_out + ch) = make_float2(out[0], out[1]);
                }
            } else {
                int token = pr, slot = p.shared_slot;
                if (p.pool != nullptr) {
                    token = p.pool[pr].token;
                    slot = p.pool[pr].slot;
                }
                __nv_bfloat16 *orow = p.out_slots + ((size_t)token * p.slots + slot) * p.n_out;
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

template <int BM, int BFMT, int AG>
cudaError_t launch3(const mmoe_gemm_args *a, int epi, dim3 grid, cudaStream_t s)
{
    if (epi == MMOE_EPI_SWIGLU)
        gemm_kernel<BM, BFMT, AG, MMOE_EPI_SWIGLU><<<grid, 128, 0, s>>>(*a);
    else
        gemm_kernel<BM, BFMT, AG, MMOE_EPI_SLOT_BF16><<<grid, 128, 0, s>>>(*a);
    return cudaGetLastError();
}

template <int BM, int BFMT>
cudaError_t launch2(const mmoe_gemm_args *a, int ag, int epi, dim3 grid, cudaStream_t s)
{
    return ag == 32 ? launch3<BM, BFMT, 32>(a, epi, grid, s) : launch3<BM, BFMT, 128>(a, epi, grid, s);
}

template <int BM>
cudaError_t launch1(const mmoe_gemm_args *a, int bfmt, int ag, int epi, dim3 grid, cudaStream_t s)
{
    return bfmt == MMOE_B_FP4 ? launch2<BM, MMOE_B_FP4>(a, ag, epi, grid, s)
                              : launch2<BM, MMOE_B_FP8>(a, ag, epi, grid, s);
}

} // namespace

cudaError_t mmoe_launch_gemm(const mmoe_gemm_args *args, int block_m, int b_fmt, int a_group, int epi,
                             int max_tiles, cudaStream_t stream)
{
    if (max_tiles <= 0)
        return cudaSuccess;
    const int nblocks = epi == MMOE_EPI_SWIGLU ? args->n_out / 64 : args->n_out / BN;
    dim3 grid((unsigned)max_tiles, (unsigned)nblocks);
    return block_m == 16 ? launch1<16>(args, b_fmt, a_group, epi, grid, stream)
                         : launch1<64>(args, b_fmt, a_group, epi, grid, stream);
}
