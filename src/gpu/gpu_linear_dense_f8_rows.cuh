/**
 * @file gpu_linear_dense_f8_rows.cuh
 * @brief The dense linear with an FP8 weight for a few tokens (decode): the token's x staged
 *        once per block as doubles that carry the weight's scale, so that a weight costs one
 *        fma and the two integer instructions of its code, in the oracle's order.
 *
 * ## What it computes
 *
 * The grouped output projection W_oa of every attention layer is a dense linear (linear_dense.c)
 * whose weight is E4M3 with a UE8M0 scale per 128 x 128 block: y[t, n] = fl32(the double sum of
 * x_k w_k in the order of @ref spec_arch_sum_order), x in BF16 and w_k the oracle's weight
 * bf16(fl32(e4m3(code) 2^(sb - 127))).  k_linear_dense_split (gpu_forward.cu) computes it one
 * warp per output: every weight is built as a double (e4m3_times_2m1016 times 2^(sb + 889), a
 * DMUL), every x value converted to double (F2F, which an SM runs at 16 a cycle) for each output
 * row again, and at decode the V4-Flash W_oa (8192 x 4096) took 34 us, about 18 instructions a
 * weight (Nsight Compute), a quarter of the copy bandwidth.
 *
 * ## The scale goes into x
 *
 * For a scale byte sb in 10..134 and a code that is not NaN, the oracle's weight is exactly
 * e 2^(sb - 127) (dense_f8_chunk16 says why), and e4m3_times_2m1016 gives E = e 2^-1016 exactly
 * in two integer instructions.  So
 * \f[ x_k w_k \, 2^{-512} = \big(x_k\, 2^{sb + 377}\big) \cdot E_k, \f]
 * both factors exact doubles (|x 2^(sb+377)| stays within 2^254 .. 2^639 for finite non-zero
 * BF16 x).  The block stages its token's x row once, each value times 2^(sb + 377) of its
 * scale column (the rows of a block share their scale row), and a weight then costs its two
 * integer instructions, the move of the zero low word and one DFMA.  A chunk whose scale byte
 * lies outside 10..134 is staged as x 2^-512 and summed with the oracle's fp32 decode of its
 * weights; a chunk with a NaN code sums to NaN, as the oracle's does (the NAN_TEST instance,
 * which serves the weights that have a NaN code, ddense::nan_free; the other one leaves the
 * tests out).
 *
 * ## Why the bits are the oracle's
 *
 * Every value of the computation, each product, each fma's rounded sum and each node of the
 * tree, is the oracle's value times 2^-512: the oracle's weight is a BF16 value, so a finite
 * product is an integer multiple of 2^-266 (two BF16 subnormal steps) below 2^256 in
 * magnitude, every partial sum is zero or at least 2^-266 and (with K <= 12288) below 2^270,
 * and times 2^-512 it stays a normal double, where rounding commutes with a power-of-two
 * scaling.  Signed zeros are unchanged (each chunk starts at +0 and adds the same products),
 * infinities and NaNs propagate alike.  The result is multiplied by 2^512 (exact) and rounded
 * to fp32 as before.  The order is k_linear_dense_split's: lane l sums chunk 32 r + l of round
 * r ascending from +0 (+0 past the row), a butterfly over the warp forms the round's node, and
 * the rounds' nodes form the tree above them (mmoe_pairwise: with M a power of two, as here, the
 * perfect binary tree).  The constants, the direct range and the codes' bits are
 * gpu_dense_f8_scaled.h's, whose arithmetic a CPU suite runs for every scale byte against the
 * oracle.
 *
 * ## The trees, in few instructions
 *
 * Which lane adds which two values is free as long as every node adds the same two children
 * (x + y = y + x exactly).  So one butterfly serves both rows of a warp (df8_round_node(): its
 * first level hands each lane's other-row sum to its neighbour and keeps row a's pair sums on
 * the even lanes, row b's on the odd ones; five shuffles of a double and five additions a round
 * instead of ten and ten), the rounds' nodes wait in shared memory (lanes 0 and 1 store them) and
 * a last butterfly over the rounds, lane r holding round r, forms the tree above them, instead
 * of mmoe_pairwise's stack, which the compiler kept in local memory.  Where a scale block's
 * chunks divide 32, a lane's scale column in round r is r (32 / cpb) + lane / cpb, the lane's
 * part divided once before the loop (a pointer to its round-0 byte), instead of a 64-bit
 * division of its chunk index every round (docs/perf.md, nineteenth and twentieth passes: what
 * a round of a warp issues, 32 of its instructions the DFMA).
 *
 * ## Data layout
 *
 * A block is GFW_DF8_WARPS warps, a warp two consecutive output rows of one token: the block's
 * GFW_DF8_ROWS rows lie in one scale row block and one head group (the weight's block and the
 * group's row count are multiples of GFW_DF8_ROWS).  The staged row is m = K / 16 chunks of 8
 * pairs of doubles, stored pair-major (sx[p m + c] holds values 16 c + 2 p and 16 c + 2 p + 1)
 * so that the 32 lanes of a round, reading pair p of chunks 32 r .. 32 r + 31, read 512
 * consecutive bytes with 16-byte loads, free of bank conflicts; each pair read serves both
 * rows of the warp.  A lane loads its two 16-byte chunks of codes of round r + GFW_DF8_AHEAD
 * while it sums round r, and the first rounds' codes before the block waits for the kernel
 * before it (they are the model's weights, not that kernel's output).
 *
 * ## Where it applies
 *
 * launch_linear_dense() takes it below GFW_DENSE_TT_MIN_T tokens for one F8 linear whose x rows
 * and weight rows are 16-byte aligned, K a multiple of 16 with the staged row within
 * GFW_DF8_SMEM_MAX, the weight's scale block and the group's row count multiples of
 * GFW_DF8_ROWS; anything else runs k_linear_dense_split.
 */
#ifndef MMOE_GPU_LINEAR_DENSE_F8_ROWS_CUH
/** Include guard (this file is included in the middle of gpu_forward.cu). */
#define MMOE_GPU_LINEAR_DENSE_F8_ROWS_CUH

#include "gpu_dense_f8_scaled.h"

/** Warps of a k_linear_dense_f8_rows block, two output rows each. */
#define GFW_DF8_WARPS 8
/** Output rows of a k_linear_dense_f8_rows block. */
#define GFW_DF8_ROWS (2 * GFW_DF8_WARPS)
/** Most dynamic shared memory of a k_linear_dense_f8_rows block: its x row, 8 bytes a value (K <= 12288). */
#define GFW_DF8_SMEM_MAX (96 * 1024)
/** Rounds of codes a lane has loaded ahead of the round it sums. */
#define GFW_DF8_AHEAD 1


/**
 * The chunk sum of one row over 16 codes @p q with staged pairs @p xp (pair j at xp[j m]):
 * direct doubles (scale byte in range), or the oracle's fp32 decode with scale byte @p sb
 * (then the pairs hold x 2^-512).  Either way the oracle's chunk sum times 2^-512, NaN when a
 * code is NaN.
 */
__device__ __forceinline__ double df8_chunk_slow(const double2 *xp, int m, uint4 q, uint32_t sb)
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const float sc = gfw_ue8m0((uint8_t)sb);
    double c = 0.0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const double2 x = xp[j * m];
        const uint32_t c0 = (w[j / 2] >> (16 * (j % 2))) & 0xFFu, c1 = (w[j / 2] >> (16 * (j % 2) + 8)) & 0xFFu;
        c = __fma_rn(x.x, (double)gfw_f8_weight(c0, sc), c);
        c = __fma_rn(x.y, (double)gfw_f8_weight(c1, sc), c);
    }
    return c;
}

/**
 * The direct chunk sums of both rows of a warp (codes @p qa, @p qb; staged pairs @p xp, which
 * carry the scale): two independent fma chains, one pair read per two products of each row.
 */
__device__ __forceinline__ void df8_chunk_pair(const double2 *xp, int m, uint4 qa, uint4 qb, double *ca,
                                               double *cb)
{
    const uint32_t a[4] = {qa.x, qa.y, qa.z, qa.w}, b[4] = {qb.x, qb.y, qb.z, qb.w};
    double sa = 0.0, sb = 0.0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const double2 lo = xp[(2 * i) * m], hi = xp[(2 * i + 1) * m];
        const uint32_t a1 = a[i] << 1, b1 = b[i] << 1;
        sa = __fma_rn(lo.x, e4m3_times_2m1016<0>(a[i], a1), sa);
        sb = __fma_rn(lo.x, e4m3_times_2m1016<0>(b[i], b1), sb);
        sa = __fma_rn(lo.y, e4m3_times_2m1016<1>(a[i], a1), sa);
        sb = __fma_rn(lo.y, e4m3_times_2m1016<1>(b[i], b1), sb);
        sa = __fma_rn(hi.x, e4m3_times_2m1016<2>(a[i], a1), sa);
        sb = __fma_rn(hi.x, e4m3_times_2m1016<2>(b[i], b1), sb);
        sa = __fma_rn(hi.y, e4m3_times_2m1016<3>(a[i], a1), sa);
        sb = __fma_rn(hi.y, e4m3_times_2m1016<3>(b[i], b1), sb);
    }
    *ca = sa, *cb = sb;
}

/**
 * The node of one round (32 chunks, lane l chunk 32 r + l) for both rows of a warp: @p keep is
 * the lane's chunk sum of its own row (row a on the even lanes, row b on the odd ones) and
 * @p give that of the other row.  The first level adds each lane's kept sum to the one its
 * neighbour gives (lane l xor 1: the same row), so that the even lanes carry row a's pair sums
 * and the odd ones row b's; the levels xor 2 .. 16 finish both trees at once.  Every node adds
 * the same two children as gfw_group_pairwise(), so each row's node is its bits (x + y = y + x
 * exactly), at half the shuffles and additions of two butterflies.
 */
__device__ __forceinline__ double df8_round_node(double keep, double give)
{
    double v = __dadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, give, 1));
#pragma unroll
    for (int s = 2; s < 32; s <<= 1)
        v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, s));
    return v;
}

/**
 * Stage the block's x row @p xr (K values, m chunks) into @p sx, pair-major, each value times
 * 2^(sb + 377) of its scale column (scale bytes @p srow, columns of @p block values), or times
 * 2^-512 where the scale byte is out of the direct range.  All threads of the block call it.
 */
__device__ __forceinline__ void df8_stage_x(double2 *sx, const uint16_t *xr, int m, const uint8_t *srow, int block)
{
    for (int v = (int)threadIdx.x; v < 2 * m; v += (int)blockDim.x) { /* 8 values: half a chunk */
        const int c = v >> 1;
        const int p0 = 4 * (v & 1);
        const uint32_t sb = __ldg(srow + c * MMOE_SUM_CHUNK / block);
        const double f = gfw_pow2(mmoe_df8_x_exponent(sb));
        const uint4 u = __ldg((const uint4 *)(xr + 8 * v));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++)
            sx[(p0 + j) * m + c] = make_double2(__dmul_rn((double)gfw_bf2f((uint16_t)(w[j] & 0xFFFFu)), f),
                                                __dmul_rn((double)gfw_bf2f((uint16_t)(w[j] >> 16)), f));
    }
}

/**
 * The dense linear of one F8 weight for T tokens (x rows t * ldx, head group n / group_rows at
 * offset (n / group_rows) * group_width; group_rows = 0: no grouping): block (i, t) computes
 * output rows GFW_DF8_ROWS i .. of token t into yf and/or yb ([T, N]).  See the file comment.
 */
template <bool NAN_TEST>
__global__ void __launch_bounds__(GFW_DF8_WARPS * 32, 4)
    k_linear_dense_f8_rows(const uint16_t *x, int64_t ldx, int64_t K, ddense w, int64_t N, int64_t group_rows,
                           int64_t group_width, float *yf, uint16_t *yb)
{
    extern __shared__ double2 df8_sx[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = blockIdx.y, n0 = (int64_t)blockIdx.x * GFW_DF8_ROWS;
    const int64_t na = n0 + 2 * warp, nb = na + 1;
    const int m = (int)(K / MMOE_SUM_CHUNK);              /* chunks of the row (K <= 12288: m <= 768) */
    const int M = m <= 1 ? 1 : 1 << (32 - __clz(m - 1)); /* the tree's leaves: m rounded up to a power of two */
    const int rounds = M > 32 ? M / 32 : 1;               /* a power of two, at most 32 */
    /* the scale column of chunk k is k / cpb; where cpb divides 32 a lane's column moves by 32 / cpb a round */
    const int cpb = w.block / MMOE_SUM_CHUNK;
    const int col_step = 32 % cpb == 0 ? 32 / cpb : 0;
    const uint8_t *srow = w.scale + (n0 / w.block) * w.scols;
    /* the lane's scale byte of round 0 where its column steps (one division, before the loop) */
    const uint8_t *slane = srow + (col_step > 0 ? lane / cpb : 0);
    const uint4 *wa = (const uint4 *)((const uint8_t *)w.p + (na < N ? na : n0) * w.cols);
    const uint4 *wb = (const uint4 *)((const uint8_t *)w.p + (nb < N ? nb : n0) * w.cols);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    /* the first rounds' codes: the weights, not the kernel before's output */
    uint4 qa[GFW_DF8_AHEAD], qb[GFW_DF8_AHEAD];
#pragma unroll
    for (int i = 0; i < GFW_DF8_AHEAD; i++) {
        const int k = i * 32 + lane;
        qa[i] = k < m ? __ldg(wa + k) : zero, qb[i] = k < m ? __ldg(wb + k) : zero;
    }
    mmoe_grid_dependency_wait();
    mmoe_grid_launch_dependents();
    const uint16_t *xr = x + t * ldx + (group_rows > 0 ? (n0 / group_rows) * group_width : 0);
    df8_stage_x(df8_sx, xr, m, srow, w.block);
    __syncthreads();
    /* the rounds' nodes of the warp's two rows, in shared memory until the loop ends */
    __shared__ double2 df8_nodes[GFW_DF8_WARPS][32];
    const bool odd = lane & 1;
    for (int r = 0; r < rounds; r++) {
        const int k = r * 32 + lane, kn = k + 32 * GFW_DF8_AHEAD;
        const uint4 ua = qa[0], ub = qb[0];
#pragma unroll
        for (int i = 0; i + 1 < GFW_DF8_AHEAD; i++)
            qa[i] = qa[i + 1], qb[i] = qb[i + 1];
        qa[GFW_DF8_AHEAD - 1] = kn < m ? __ldg(wa + kn) : zero;
        qb[GFW_DF8_AHEAD - 1] = kn < m ? __ldg(wb + kn) : zero;
        double ca = 0.0, cb = 0.0;
        if (k < m) {
            const double2 *xp = df8_sx + k;
            const uint32_t sb = __ldg(slane + (col_step > 0 ? r * col_step : k / cpb));
            if (mmoe_df8_scale_direct(sb)) {
                df8_chunk_pair(xp, m, ua, ub, &ca, &cb);
                if (NAN_TEST && e4m3_has_nan16(ua))
                    ca = __longlong_as_double(0x7FF8000000000000LL);
                if (NAN_TEST && e4m3_has_nan16(ub))
                    cb = __longlong_as_double(0x7FF8000000000000LL);
            } else {
                ca = df8_chunk_slow(xp, m, ua, sb);
                cb = df8_chunk_slow(xp, m, ub, sb);
            }
        }
        /* the round's node over its 32 chunks, both rows in one butterfly: the first level leaves row
           a's pair sums on the even lanes and row b's on the odd ones (df8_round_node) */
        const double v = df8_round_node(odd ? cb : ca, odd ? ca : cb);
        if (lane < 2)
            ((double *)&df8_nodes[warp][r])[lane] = v;
    }
    __syncwarp();
    /* the rounds' tree (rounds is a power of two: mmoe_pairwise's tree is the perfect one), lane r
       holding round r's nodes */
    double2 node = lane < rounds ? df8_nodes[warp][lane] : make_double2(0.0, 0.0);
    node.x = gfw_group_pairwise(node.x, rounds);
    node.y = gfw_group_pairwise(node.y, rounds);
    const double sum_b = __shfl_sync(0xFFFFFFFFu, node.y, 0); /* lane 0 holds both sums (rounds >= 1) */
    if (lane < 2) {
        const int64_t n = lane == 0 ? na : nb;
        if (n < N) {
            const double sum = lane == 0 ? node.x : sum_b;
            const float f = __double2float_rn(__dmul_rn(sum, gfw_pow2(MMOE_DF8_SHIFT)));
            if (yf)
                yf[t * N + n] = f;
            if (yb)
                yb[t * N + n] = gfw_f2bf(f);
        }
    }
}

/**
 * Whether k_linear_dense_f8_rows can run the set @p s on x [rows, ldx] (see the file comment,
 * "Where it applies").
 */
static bool dense_f8_rows_fit(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const dense_set &s,
                              int64_t group_rows, int64_t group_width)
{
    if (s.n != 1 || rows < 1 || rows >= GFW_DENSE_TT_MIN_T)
        return false;
    const ddense &w = s.w[0];
    return w.dtype == GFW_F8 && K % MMOE_SUM_CHUNK == 0 && K <= w.cols && K * (int64_t)sizeof(double) <= GFW_DF8_SMEM_MAX &&
           ((uintptr_t)x & 15) == 0 && ldx % 8 == 0 && group_width % 8 == 0 && ((uintptr_t)w.p & 15) == 0 &&
           w.cols % 16 == 0 && w.block > 0 && w.block % GFW_DF8_ROWS == 0 &&
           (group_rows == 0 || group_rows % GFW_DF8_ROWS == 0);
}

/** A k_linear_dense_f8_rows instance. */
typedef void (*dense_f8_rows_fn)(const uint16_t *, int64_t, int64_t, ddense, int64_t, int64_t, int64_t, float *,
                                 uint16_t *);

/** The instance of k_linear_dense_f8_rows for a weight free of NaN codes (@p nan_free: ddense::nan_free) or not. */
static dense_f8_rows_fn dense_f8_rows_kernel(bool nan_free)
{
    return nan_free ? k_linear_dense_f8_rows<false> : k_linear_dense_f8_rows<true>;
}

/** Allow k_linear_dense_f8_rows its staged x row (beyond the default 48 KiB; upload_tables() calls it). */
static cudaError_t dense_f8_rows_allow_smem(void)
{
    cudaError_t ce = cudaSuccess;
    for (int nan_free = 0; nan_free < 2 && ce == cudaSuccess; nan_free++)
        ce = cudaFuncSetAttribute(dense_f8_rows_kernel(nan_free), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  GFW_DF8_SMEM_MAX);
    return ce;
}

/** Launch k_linear_dense_f8_rows for the set @p s (dense_f8_rows_fit() holds). */
static void launch_linear_dense_f8_rows(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const dense_set &s,
                                        int64_t group_rows, int64_t group_width, cudaStream_t st)
{
    const dim3 grid((unsigned)((s.N[0] + GFW_DF8_ROWS - 1) / GFW_DF8_ROWS), (unsigned)rows);
    mmoe_launch_pdl(dense_f8_rows_kernel(s.w[0].nan_free), grid, GFW_DF8_WARPS * 32, (size_t)K * sizeof(double), st,
                    x, ldx, K, s.w[0], s.N[0], group_rows, group_width, s.yf[0], s.yb[0]);
}

#endif /* MMOE_GPU_LINEAR_DENSE_F8_ROWS_CUH */
