/**
 * @file gpu_linear_dense_tokens.cuh
 * @brief The dense linears for many tokens (prefill): each weight chunk read and decoded once
 *        for GFW_DENSE_TT tokens, every sum in the oracle's order.
 *
 * ## Why a second dense linear
 *
 * k_linear_dense_split (gpu_forward.cu) gives one warp to one (token, output) pair: at decode
 * that is the whole call, but in a prefill of T tokens every weight row is loaded and decoded
 * T times.  Here a warp owns one output row for GFW_DENSE_TT tokens: per round of 32 chunks,
 * lane l loads and decodes chunk 32 r + l of the row once, as 16 doubles, and sums it against
 * each token's 16 x values.
 *
 * ## The order is the oracle's, unchanged
 *
 * Each (token, output) value is computed exactly as k_linear_dense_split computes it (see its
 * comment): the chunk sum is the fma chain over the chunk's 16 products in ascending order
 * from +0, with the same double weights (the F8 weights built by e4m3_times_2m1016 times
 * 2^(sb+889) where dense_f8_chunk16 does so, else the oracle's fp32 decode and bf16 rounding;
 * BF16 weights as they are); the warp's butterfly (gfw_group_pairwise) forms the node over the
 * round's 32 chunks; and the round nodes are added as the full binary tree over them (their
 * count is a power of two, the spec's tree padded with +0 leaves), which is what the split
 * kernel's batches and mmoe_pairwise add.  Here the round nodes wait in shared memory, one row
 * of GFW_DENSE_TT_ROUNDS per (warp, token), and lane tt of the warp folds token tt's row in
 * that tree at the end.  Only which warp computes a value and when its operands are loaded
 * changed; every operation, operand and order is the same, so are the bits.
 *
 * ## Where it applies
 *
 * launch_linear_dense() takes it from GFW_DENSE_TT_MIN_T tokens on for sets whose every
 * linear reads whole aligned chunks (K a multiple of 16, 16-byte aligned rows of x and of the
 * weights, BF16 weights or F8 ones whose scale block is a multiple of 16) and K <= 8192 (at
 * most GFW_DENSE_TT_ROUNDS rounds); anything else runs k_linear_dense_split as before.
 */
#ifndef MMOE_GPU_LINEAR_DENSE_TOKENS_CUH
/** Include guard (this file is included in the middle of gpu_forward.cu). */
#define MMOE_GPU_LINEAR_DENSE_TOKENS_CUH

/** Tokens one warp of k_linear_dense_tokens sums each decoded weight chunk against. */
#define GFW_DENSE_TT 8
/** Most rounds of 32 chunks k_linear_dense_tokens holds per row: K <= 16 * 32 * 16 = 8192. */
#define GFW_DENSE_TT_ROUNDS 16
/** The fewest tokens for which launch_linear_dense() takes k_linear_dense_tokens. */
#define GFW_DENSE_TT_MIN_T 8

/**
 * Chunk @p k's 16 weights of row @p n of @p w as the doubles the oracle multiplies by (zeros
 * when @p in is false), read as dense_warp_sum reads an F8 (@p f8) or BF16 row.  The F8 decode
 * is dense_f8_chunk16's, written out here because that function decodes each weight beside
 * its fma: made to decode all 16 first (one function for both), the one-token kernel
 * k_linear_dense_split spills about ten times more (ptxas, sm_90a).
 */
__device__ __forceinline__ void dense_tokens_weights(const ddense &w, bool f8, int64_t n, int64_t k, bool in,
                                                     double *wd)
{
    if (!in) {
#pragma unroll
        for (int i = 0; i < 16; i++)
            wd[i] = 0.0;
        return;
    }
    if (!f8) {
        const uint4 *p = (const uint4 *)((const uint16_t *)w.p + n * w.cols + k * MMOE_SUM_CHUNK);
        float wv[16];
        gfw_bf16x16_to_f32(__ldg(p), __ldg(p + 1), wv);
#pragma unroll
        for (int i = 0; i < 16; i++)
            wd[i] = (double)wv[i];
        return;
    }
    const uint4 q = __ldg((const uint4 *)((const uint8_t *)w.p + n * w.cols + k * MMOE_SUM_CHUNK));
    const uint8_t sb = __ldg(w.scale + (int64_t)((int)n / w.block) * w.scols + (int)(k * MMOE_SUM_CHUNK) / w.block);
    const uint32_t codes[4] = {q.x, q.y, q.z, q.w};
    const uint32_t nan =
        e4m3_nan_bits(codes[0]) | e4m3_nan_bits(codes[1]) | e4m3_nan_bits(codes[2]) | e4m3_nan_bits(codes[3]);
    if (sb >= 10 && sb <= 134 && nan == 0) { /* dense_f8_chunk16's direct doubles */
        const double S = __longlong_as_double((long long)(sb + 1912) << 52); /* 2^(sb+889) */
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const uint32_t wq = codes[c], wq1 = wq << 1;
            wd[4 * c] = __dmul_rn(e4m3_times_2m1016<0>(wq, wq1), S);
            wd[4 * c + 1] = __dmul_rn(e4m3_times_2m1016<1>(wq, wq1), S);
            wd[4 * c + 2] = __dmul_rn(e4m3_times_2m1016<2>(wq, wq1), S);
            wd[4 * c + 3] = __dmul_rn(e4m3_times_2m1016<3>(wq, wq1), S);
        }
        return;
    }
    const float sc = gfw_ue8m0(sb);
#pragma unroll
    for (int i = 0; i < 16; i++)
        wd[i] = (double)gfw_bfr(__fmul_rn(gfw_e4m3_value((codes[i / 4] >> (8 * (i % 4))) & 0xFFu), sc));
}

/**
 * The dense linears of set @p set for tokens [GFW_DENSE_TT y, GFW_DENSE_TT y + GFW_DENSE_TT)
 * (y = blockIdx.y), one warp per output row of any linear of the set (the rows of linear 0
 * first), GFW_DENSE_WARPS rows a block; x rows and grouping as k_linear_dense_split's.  The
 * caller guarantees the conditions of the chapter above.
 */
__global__ void __launch_bounds__(GFW_DENSE_WARPS * 32)
    k_linear_dense_tokens(const uint16_t *x, int64_t T, int64_t ldx, int64_t K, dense_set set, int64_t group_rows,
                          int64_t group_width)
{
    __shared__ double node[GFW_DENSE_WARPS][GFW_DENSE_TT][GFW_DENSE_TT_ROUNDS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int j = 0;
    int64_t n = (int64_t)blockIdx.x * GFW_DENSE_WARPS + warp;
    while (j < set.n && n >= set.N[j]) {
        n -= set.N[j];
        j++;
    }
    if (j >= set.n)
        return; /* no barrier below: a warp past the set's rows just leaves */
    const ddense &w = set.w[j];
    const bool f8 = w.dtype == GFW_F8;
    const int64_t t0 = (int64_t)blockIdx.y * GFW_DENSE_TT;
    const int tn = (int)(T - t0 < GFW_DENSE_TT ? T - t0 : GFW_DENSE_TT);
    const uint16_t *xg = x + t0 * ldx + (group_rows > 0 ? (n / group_rows) * group_width : 0);
    const int64_t m = K / MMOE_SUM_CHUNK;
    int64_t M = 1;
    while (M < m)
        M <<= 1;
    const int rounds = M > 32 ? (int)(M / 32) : 1;
    for (int r = 0; r < rounds; r++) {
        const int64_t k = (int64_t)r * 32 + lane;
        const bool in = k < m;
        double wd[16];
        dense_tokens_weights(w, f8, n, k, in, wd);
        for (int tt = 0; tt < tn; tt++) {
            double c = 0.0;
            if (in) {
                const uint4 *xp = (const uint4 *)(xg + tt * ldx + k * MMOE_SUM_CHUNK);
                float xv[16];
                gfw_bf16x16_to_f32(__ldg(xp), __ldg(xp + 1), xv);
#pragma unroll
                for (int i = 0; i < 16; i++)
                    c = __fma_rn((double)xv[i], wd[i], c); /* exact products, as dense_chunk */
            }
            c = gfw_group_pairwise(c, 32); /* the node over the round's 32 chunks */
            if (lane == 0)
                node[warp][tt][r] = c;
        }
    }
    __syncwarp();
    if (lane < tn) {
        double *v = node[warp][lane];
        for (int s = 1; s < rounds; s <<= 1) /* the full binary tree over the round nodes */
            for (int i = 0; i < rounds; i += 2 * s)
                v[i] = __dadd_rn(v[i], v[i + s]);
        const int64_t t = t0 + lane;
        const float f = __double2float_rn(v[0]);
        if (set.yf[j])
            set.yf[j][t * set.N[j] + n] = f;
        if (set.yb[j])
            set.yb[j][t * set.N[j] + n] = gfw_f2bf(f);
    }
}

/**
 * Whether k_linear_dense_tokens serves set @p s for @p rows x rows [rows, ldx] of width K
 * (grouped by @p group_width): the conditions of the chapter above.
 */
static bool dense_tokens_fit(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const dense_set &s,
                             int64_t group_width)
{
    if (rows < GFW_DENSE_TT_MIN_T || K % MMOE_SUM_CHUNK != 0 || K > (int64_t)MMOE_SUM_CHUNK * 32 * GFW_DENSE_TT_ROUNDS ||
        ((uintptr_t)x & 15) != 0 || ldx % 8 != 0 || group_width % 8 != 0)
        return false;
    for (int j = 0; j < s.n; j++) {
        const ddense &w = s.w[j];
        const int esize = w.dtype == GFW_F8 ? 1 : w.dtype == GFW_BF16 ? 2 : 0;
        if (esize == 0 || ((uintptr_t)w.p & 15) != 0 || (w.cols * esize) % 16 != 0 ||
            (w.dtype == GFW_F8 && w.block % MMOE_SUM_CHUNK != 0))
            return false;
    }
    return true;
}

/** Launch k_linear_dense_tokens (dense_tokens_fit() holds). */
static void launch_linear_dense_tokens(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const dense_set &s,
                                       int64_t group_rows, int64_t group_width, cudaStream_t st)
{
    int64_t outputs = 0;
    for (int j = 0; j < s.n; j++)
        outputs += s.N[j];
    const dim3 grid((unsigned)((outputs + GFW_DENSE_WARPS - 1) / GFW_DENSE_WARPS),
                    (unsigned)((rows + GFW_DENSE_TT - 1) / GFW_DENSE_TT));
    k_linear_dense_tokens<<<grid, GFW_DENSE_WARPS * 32, 0, st>>>(x, rows, ldx, K, s, group_rows, group_width);
}

#endif
