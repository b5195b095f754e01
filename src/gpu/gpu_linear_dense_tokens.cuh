/**
 * @file gpu_linear_dense_tokens.cuh
 * @brief The dense linears for many tokens (prefill): each weight chunk read and decoded once
 *        for GFW_DENSE_TT tokens, each token's x converted once per block, every sum in the
 *        oracle's order.
 *
 * ## Why a second dense linear
 *
 * k_linear_dense_split (gpu_forward.cu) gives one warp to one (token, output) pair: at decode
 * that is the whole call, but in a prefill of T tokens every weight row is loaded and decoded
 * T times.  Here a block owns GFW_DENSE_TT_BROWS output rows for GFW_DENSE_TT tokens: every
 * weight chunk is loaded and decoded once for the block's tokens, and every x value is
 * converted to double once for the block's rows.
 *
 * ## Data layout
 *
 * A block is GFW_DENSE_TT_WARPS warps, a warp GFW_DENSE_TT_WROWS = 8 rows from n0: lane
 * (s, h) = (lane / 4, lane % 4) owns rows n0 + h and n0 + 4 + h and, in group g of 8 chunks,
 * chunk k = 8 g + s of both, whose 2 x 16 weights it decodes into doubles once and sums
 * against each token's 16 x values (one x double, two fmas).  The block stages the x values
 * of its tokens, a round of 32 chunks at a time, as doubles in shared memory
 * (sx[token][chunk][GFW_DENSE_TT_CSTRIDE doubles]); the raw words of the next round's x and of
 * the lane's next weight chunks are loaded while the current ones are summed.  The chunk
 * stride of 18 doubles (144 bytes, 16 mod 128) puts the 8 chunks a warp reads in one 16-byte
 * load on 8 different 16-byte bank groups, and the four lanes of a slot (lanes 4 s .. 4 s + 3,
 * its eight rows) read the same address: lane pairs (l, l ^ 1) and (l, l ^ 2) with equal
 * addresses let the shared memory return two registers a lane per cycle rather than one.
 *
 * ## Cost
 *
 * Per group of 8 chunks a warp issues 256 DFMAs (8 tokens x 2 rows x 16 products a lane), 64
 * 16-byte shared loads of x, 28 shuffles and 14 additions for the nodes, and decodes 2 x 16
 * weights a lane: about as much shared-memory traffic (two registers a lane per cycle) as
 * FP64 work (half a warp DFMA per cycle and multiprocessor), every x value converted once per
 * block rather than once per row.
 *
 * ## The order is the oracle's, unchanged
 *
 * Each (token, output) value is computed exactly as k_linear_dense_split computes it (see its
 * comment): the chunk sum is the fma chain over the chunk's 16 products in ascending order
 * from +0, with the same double weights (the F8 weights built by e4m3_times_2m1016 times
 * 2^(sb+889) where dense_f8_chunk16 does so, else the oracle's fp32 decode and bf16 rounding;
 * BF16 weights as they are) and the x values widened exactly from bf16; chunks past the row
 * are +0 (zero weights times zero x).  The sums above the chunks form the full binary tree
 * over the M chunk leaves (M the chunk count rounded up to a power of two, at least 32, the
 * spec's tree padded with +0 leaves), which is what the split kernel's butterflies and batches
 * and mmoe_pairwise add: here the row's 8 lanes form the nodes over the 8 chunks of group g
 * for the 8 tokens, lane s ending with token s's (dense_slot_scatter(): at each level a lane
 * keeps half its tokens' nodes and hands its partner the other half), and the lane folds the
 * M / 8 group nodes in order into the same tree with a stack of its pending left subtrees
 * (dense_tree_push()), one stack per row.  The addition is commutative, bit for bit, so which
 * operand of a node comes from which lane does not matter.  Only which thread computes a
 * value and when its operands are loaded changed; every operation, operand and order is the
 * same, so are the bits.
 *
 * ## Where it applies
 *
 * launch_linear_dense() takes it from GFW_DENSE_TT_MIN_T tokens on for sets whose every
 * linear reads whole aligned chunks (K a multiple of 16, 16-byte aligned rows of x and of the
 * weights, BF16 weights or F8 ones whose scale block is a multiple of 16), K <= 8192 (at most
 * GFW_DENSE_TT_GROUPS groups: the stack's depth) and, for a grouped x (group_rows > 0), one
 * linear whose groups are whole blocks of rows (group_rows a multiple of GFW_DENSE_TT_BROWS:
 * the block stages one x); anything else runs k_linear_dense_split, one token at a time.
 */
#ifndef MMOE_GPU_LINEAR_DENSE_TOKENS_CUH
/** Include guard (this file is included in the middle of gpu_forward.cu). */
#define MMOE_GPU_LINEAR_DENSE_TOKENS_CUH

/** Tokens of a k_linear_dense_tokens block: each decoded weight chunk is summed against all of them. */
#define GFW_DENSE_TT 8
/** Lanes of one row in k_linear_dense_tokens: the chunks of a group, one per lane. */
#define GFW_DENSE_TT_SLOTS 8
/** Lanes of one chunk slot in k_linear_dense_tokens (lanes 4 s .. 4 s + 3 of slot s). */
#define GFW_DENSE_TT_SLANES (32 / GFW_DENSE_TT_SLOTS)
/** Rows of one lane of k_linear_dense_tokens (h and GFW_DENSE_TT_SLANES + h of its warp's). */
#define GFW_DENSE_TT_LROWS 2
/** Rows of one warp of k_linear_dense_tokens. */
#define GFW_DENSE_TT_WROWS (GFW_DENSE_TT_SLANES * GFW_DENSE_TT_LROWS)
/** Warps of a k_linear_dense_tokens block. */
#define GFW_DENSE_TT_WARPS 4
/** Rows of one k_linear_dense_tokens block. */
#define GFW_DENSE_TT_BROWS (GFW_DENSE_TT_WARPS * GFW_DENSE_TT_WROWS)
/** Chunks of x a k_linear_dense_tokens block stages at a time (a round: four groups). */
#define GFW_DENSE_TT_RCHUNKS 32
/** Doubles between two staged chunks of x: 16 and two of padding (bank spread). */
#define GFW_DENSE_TT_CSTRIDE 18
/** Most groups of 8 chunks k_linear_dense_tokens folds per row: K <= 64 * 8 * 16 = 8192. */
#define GFW_DENSE_TT_GROUPS 64
/** Levels of the stack that folds the group nodes (log2 GFW_DENSE_TT_GROUPS + 1). */
#define GFW_DENSE_TT_LEVELS 7
/** The fewest tokens for which launch_linear_dense() takes k_linear_dense_tokens. */
#define GFW_DENSE_TT_MIN_T 8

/** The raw words of one weight chunk: 16 codes and the scale byte (F8) or 16 bf16 values. */
struct dense_raw {
    uint4 a;     /**< the chunk's first 16 bytes (all of an F8 chunk) */
    uint4 b;     /**< its second 16 bytes (BF16 only) */
    uint32_t sb; /**< F8: the chunk's scale byte */
};

/**
 * Load chunk @p k of row @p n of @p w (an @p f8 or BF16 row) as dense_warp_sum reads it;
 * nothing when @p in is false (the chunk is past the row).
 */
__device__ __forceinline__ dense_raw dense_tokens_load(const ddense &w, bool f8, int64_t n, int64_t k, bool in)
{
    dense_raw r = {make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u), 0u};
    if (!in)
        return r;
    if (!f8) {
        const uint4 *p = (const uint4 *)((const uint16_t *)w.p + n * w.cols + k * MMOE_SUM_CHUNK);
        r.a = __ldg(p);
        r.b = __ldg(p + 1);
        return r;
    }
    r.a = __ldg((const uint4 *)((const uint8_t *)w.p + n * w.cols + k * MMOE_SUM_CHUNK));
    r.sb = __ldg(w.scale + (int64_t)((int)n / w.block) * w.scols + (int)(k * MMOE_SUM_CHUNK) / w.block);
    return r;
}

/**
 * The 16 weights of chunk @p r (dense_tokens_load()) as the doubles the oracle multiplies by
 * (zeros when @p in is false).  The F8 decode is dense_f8_chunk16's, written out here because
 * that function decodes each weight beside its fma: made to decode all 16 first (one function
 * for both), the one-token kernel k_linear_dense_split spills about ten times more (ptxas,
 * sm_90a).
 */
__device__ __forceinline__ void dense_tokens_weights(const dense_raw &r, bool f8, bool in, double *wd)
{
    if (!in) {
#pragma unroll
        for (int i = 0; i < 16; i++)
            wd[i] = 0.0;
        return;
    }
    if (!f8) {
        float wv[16];
        gfw_bf16x16_to_f32(r.a, r.b, wv);
#pragma unroll
        for (int i = 0; i < 16; i++)
            wd[i] = (double)wv[i];
        return;
    }
    const uint32_t sb = r.sb;
    const uint32_t codes[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    if (mmoe_df8_scale_direct(sb) && !e4m3_has_nan16(r.a)) { /* dense_f8_chunk16's direct doubles */
        const double S = gfw_pow2((int)sb + 889);
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
    const float sc = gfw_ue8m0((uint8_t)sb);
#pragma unroll
    for (int i = 0; i < 16; i++)
        wd[i] = (double)gfw_f8_weight((codes[i / 4] >> (8 * (i % 4))) & 0xFFu, sc);
}

/** Staged x words of one k_linear_dense_tokens thread: a round's GFW_DENSE_TT x 32 chunks x 2 halves, per thread. */
#define GFW_DENSE_TT_XWORDS (GFW_DENSE_TT * GFW_DENSE_TT_RCHUNKS * 2 / (GFW_DENSE_TT_WARPS * 32))

/**
 * Load this thread's words of round @p r of x (token rows @p xg, @p ldx apart; @p tn live
 * tokens, @p m chunks) into @p xv: word u is half h of chunk c of token tt for
 * i = threadIdx.x + u blockDim.x = 64 tt + 2 c + h, zero past the tokens and chunks.
 */
__device__ __forceinline__ void dense_tokens_load_x(const uint16_t *xg, int64_t ldx, int tn, int64_t m, int r,
                                                    uint4 *xv)
{
#pragma unroll
    for (int u = 0; u < GFW_DENSE_TT_XWORDS; u++) {
        const int i = threadIdx.x + u * blockDim.x, tt = i >> 6, c = (i >> 1) & 31, h = i & 1;
        const int64_t k = (int64_t)r * GFW_DENSE_TT_RCHUNKS + c;
        xv[u] = tt < tn && k < m ? __ldg((const uint4 *)(xg + tt * ldx + k * MMOE_SUM_CHUNK + 8 * h))
                                 : make_uint4(0u, 0u, 0u, 0u);
    }
}

/** Store the words dense_tokens_load_x() left in @p xv into @p sx as doubles (the chapter's layout). */
__device__ __forceinline__ void dense_tokens_store_x(const uint4 *xv, double *sx)
{
#pragma unroll
    for (int u = 0; u < GFW_DENSE_TT_XWORDS; u++) {
        const int i = threadIdx.x + u * blockDim.x, tt = i >> 6, c = (i >> 1) & 31, h = i & 1;
        double2 *dst = (double2 *)(sx + (tt * GFW_DENSE_TT_RCHUNKS + c) * GFW_DENSE_TT_CSTRIDE + 8 * h);
        const uint32_t wv[4] = {xv[u].x, xv[u].y, xv[u].z, xv[u].w};
#pragma unroll
        for (int b = 0; b < 4; b++)
            dst[b] = make_double2((double)__uint_as_float(wv[b] << 16),
                                  (double)__uint_as_float(wv[b] & 0xFFFF0000u)); /* exact */
    }
}

/**
 * The nodes over the 8 slots of a row (lanes 4 s + h, s = 0..7) of the 8 tokens' chunk sums
 * @p c (token t in c[t]), token s's in lane s: the pairwise tree over the slots, level l
 * adding the nodes of slots s and s ^ 2^(l-1) (lane stride 4 2^(l-1)), as a butterfly would;
 * at each level a lane keeps the tokens whose bit l-1 is its slot's and sends its partner the
 * others, so the shuffles halve from level to level (4, 2, 1 doubles).
 */
__device__ __forceinline__ double dense_slot_scatter(const double *c, int s)
{
    const bool b0 = s & 1, b1 = (s >> 1) & 1, b2 = (s >> 2) & 1;
    double n1[4], n2[2];
#pragma unroll
    for (int j = 0; j < 4; j++) { /* n1[j]: token 2 j + b0 */
        const double send = b0 ? c[2 * j] : c[2 * j + 1];
        n1[j] = __dadd_rn(b0 ? c[2 * j + 1] : c[2 * j], __shfl_xor_sync(0xFFFFFFFFu, send, GFW_DENSE_TT_SLANES));
    }
#pragma unroll
    for (int i = 0; i < 2; i++) { /* n2[i]: token 4 i + 2 b1 + b0 */
        const double send = b1 ? n1[2 * i] : n1[2 * i + 1];
        n2[i] = __dadd_rn(b1 ? n1[2 * i + 1] : n1[2 * i],
                          __shfl_xor_sync(0xFFFFFFFFu, send, 2 * GFW_DENSE_TT_SLANES));
    }
    const double send = b2 ? n2[0] : n2[1]; /* token 4 b2 + 2 b1 + b0 = s */
    return __dadd_rn(b2 ? n2[1] : n2[0], __shfl_xor_sync(0xFFFFFFFFu, send, 4 * GFW_DENSE_TT_SLANES));
}

/**
 * Fold node @p g (0, 1, 2, ...) of a level of the full binary tree into the stack @p st of
 * pending left subtrees: while bit l of g is set the node is a right child, added to the
 * left one at level l (left + right); it then waits at the first level whose bit is clear.
 * Returns the node formed last: after node 2^L - 1 the root over the 2^L nodes.
 */
__device__ __forceinline__ double dense_tree_push(double *st, int g, double v)
{
    bool placed = false;
#pragma unroll
    for (int l = 0; l < GFW_DENSE_TT_LEVELS; l++) {
        if (!placed) {
            if ((g >> l) & 1) {
                v = __dadd_rn(st[l], v);
            } else {
                st[l] = v;
                placed = true;
            }
        }
    }
    return v;
}

/** Row @p o of the rows of set @p set as linear *j, row *n; false (and its last row) past the set. */
__device__ __forceinline__ bool dense_tokens_row(const dense_set &set, int64_t o, int *j, int64_t *n)
{
    int jj = 0;
    while (jj < set.n && o >= set.N[jj]) {
        o -= set.N[jj];
        jj++;
    }
    if (jj >= set.n) {
        *j = set.n - 1;
        *n = set.N[set.n - 1] - 1;
        return false;
    }
    *j = jj;
    *n = o;
    return true;
}

/**
 * The dense linears of set @p set for tokens [GFW_DENSE_TT y, GFW_DENSE_TT y + GFW_DENSE_TT)
 * (y = blockIdx.y), GFW_DENSE_TT_BROWS output rows of the set a block (the rows of linear 0
 * first), laid out as the chapter above says; x rows and grouping as k_linear_dense_split's.
 * The caller guarantees the conditions of the chapter above.  Rows past the set reread its
 * last row and are not written (every warp takes part in the block's barriers).
 */
__global__ void __launch_bounds__(GFW_DENSE_TT_WARPS * 32, 2)
    k_linear_dense_tokens(const uint16_t *x, int64_t T, int64_t ldx, int64_t K, dense_set set, int64_t group_rows,
                          int64_t group_width)
{
    gfw_pdl_enter();
    __shared__ __align__(16) double sx[GFW_DENSE_TT * GFW_DENSE_TT_RCHUNKS * GFW_DENSE_TT_CSTRIDE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, s = lane / GFW_DENSE_TT_SLANES;
    const int64_t row0 = (int64_t)blockIdx.x * GFW_DENSE_TT_BROWS;
    const int64_t o0 = row0 + warp * GFW_DENSE_TT_WROWS + lane % GFW_DENSE_TT_SLANES;
    int j[GFW_DENSE_TT_LROWS];
    int64_t n[GFW_DENSE_TT_LROWS];
    bool live[GFW_DENSE_TT_LROWS], f8[GFW_DENSE_TT_LROWS];
#pragma unroll
    for (int q = 0; q < GFW_DENSE_TT_LROWS; q++) {
        live[q] = dense_tokens_row(set, o0 + q * GFW_DENSE_TT_SLANES, &j[q], &n[q]);
        f8[q] = set.w[j[q]].dtype == GFW_F8;
    }
    const int64_t t0 = (int64_t)blockIdx.y * GFW_DENSE_TT;
    const int tn = (int)(T - t0 < GFW_DENSE_TT ? T - t0 : GFW_DENSE_TT);
    /* one x for the block: with groups, the set is one linear and its groups are whole blocks */
    const uint16_t *xg = x + t0 * ldx + (group_rows > 0 ? (row0 / group_rows) * group_width : 0);
    const int64_t m = K / MMOE_SUM_CHUNK;
    int64_t M = 32;
    while (M < m)
        M <<= 1;
    const int groups = (int)(M / GFW_DENSE_TT_SLOTS), rounds = (int)(M / GFW_DENSE_TT_RCHUNKS);

    uint4 xv[GFW_DENSE_TT_XWORDS];
    dense_tokens_load_x(xg, ldx, tn, m, 0, xv);
    dense_raw raw[GFW_DENSE_TT_LROWS];
    double st[GFW_DENSE_TT_LROWS][GFW_DENSE_TT_LEVELS], root[GFW_DENSE_TT_LROWS];
#pragma unroll
    for (int q = 0; q < GFW_DENSE_TT_LROWS; q++) {
        raw[q] = dense_tokens_load(set.w[j[q]], f8[q], n[q], s, s < m);
        root[q] = 0.0;
#pragma unroll
        for (int l = 0; l < GFW_DENSE_TT_LEVELS; l++)
            st[q][l] = 0.0;
    }
    for (int r = 0; r < rounds; r++) {
        __syncthreads(); /* every warp is done with the previous round's x */
        dense_tokens_store_x(xv, sx);
        if (r + 1 < rounds)
            dense_tokens_load_x(xg, ldx, tn, m, r + 1, xv);
        __syncthreads();
        for (int gl = 0; gl < GFW_DENSE_TT_RCHUNKS / GFW_DENSE_TT_SLOTS; gl++) {
            const int g = r * (GFW_DENSE_TT_RCHUNKS / GFW_DENSE_TT_SLOTS) + gl;
            const int64_t k = (int64_t)g * GFW_DENSE_TT_SLOTS + s, kn = k + GFW_DENSE_TT_SLOTS;
            double wa[16], wb[16];
            dense_tokens_weights(raw[0], f8[0], k < m, wa);
            dense_tokens_weights(raw[1], f8[1], k < m, wb);
            if (g + 1 < groups) { /* the lane's next chunks, in flight while these are summed */
#pragma unroll
                for (int q = 0; q < GFW_DENSE_TT_LROWS; q++)
                    raw[q] = dense_tokens_load(set.w[j[q]], f8[q], n[q], kn, kn < m);
            }
            const double *xc = sx + (gl * GFW_DENSE_TT_SLOTS + s) * GFW_DENSE_TT_CSTRIDE;
            double ca[GFW_DENSE_TT], cb[GFW_DENSE_TT];
#pragma unroll
            for (int tt = 0; tt < GFW_DENSE_TT; tt++)
                ca[tt] = cb[tt] = 0.0;
            /* Every token, live or not (dense_tokens_load_x() staged zeros past tn; what a chain of
             * those sums is never leaves the lane's tree of that token, nor is it stored): the 16
             * chains of the lane in one straight run without a branch, each step of every chain
             * before the next step of any. */
#pragma unroll
            for (int i = 0; i < 8; i++) { /* exact products, as dense_chunk; products 2 i, 2 i + 1 */
                double2 u[GFW_DENSE_TT];
#pragma unroll
                for (int tt = 0; tt < GFW_DENSE_TT; tt++)
                    u[tt] = ((const double2 *)(xc + tt * GFW_DENSE_TT_RCHUNKS * GFW_DENSE_TT_CSTRIDE))[i];
#pragma unroll
                for (int tt = 0; tt < GFW_DENSE_TT; tt++) {
                    ca[tt] = __fma_rn(u[tt].x, wa[2 * i], ca[tt]);
                    cb[tt] = __fma_rn(u[tt].x, wb[2 * i], cb[tt]);
                }
#pragma unroll
                for (int tt = 0; tt < GFW_DENSE_TT; tt++) {
                    ca[tt] = __fma_rn(u[tt].y, wa[2 * i + 1], ca[tt]);
                    cb[tt] = __fma_rn(u[tt].y, wb[2 * i + 1], cb[tt]);
                }
            }
            root[0] = dense_tree_push(st[0], g, dense_slot_scatter(ca, s)); /* group g's node, token s */
            root[1] = dense_tree_push(st[1], g, dense_slot_scatter(cb, s));
        }
    }
    if (s < tn) {
        const int64_t t = t0 + s;
#pragma unroll
        for (int q = 0; q < GFW_DENSE_TT_LROWS; q++) {
            if (!live[q])
                continue;
            const float f = __double2float_rn(root[q]);
            if (set.yf[j[q]])
                set.yf[j[q]][t * set.N[j[q]] + n[q]] = f;
            if (set.yb[j[q]])
                set.yb[j[q]][t * set.N[j[q]] + n[q]] = gfw_f2bf(f);
        }
    }
}

/**
 * Whether k_linear_dense_tokens serves set @p s for @p rows x rows [rows, ldx] of width K
 * (grouped by @p group_rows and @p group_width): the conditions of the chapter above.
 */
static bool dense_tokens_fit(const uint16_t *x, int64_t rows, int64_t ldx, int64_t K, const dense_set &s,
                             int64_t group_rows, int64_t group_width)
{
    if (rows < GFW_DENSE_TT_MIN_T || K % MMOE_SUM_CHUNK != 0 ||
        K > (int64_t)MMOE_SUM_CHUNK * GFW_DENSE_TT_SLOTS * GFW_DENSE_TT_GROUPS || ((uintptr_t)x & 15) != 0 ||
        ldx % 8 != 0 || group_width % 8 != 0 || (group_rows > 0 && (s.n != 1 || group_rows % GFW_DENSE_TT_BROWS != 0)))
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
    const dim3 grid((unsigned)((outputs + GFW_DENSE_TT_BROWS - 1) / GFW_DENSE_TT_BROWS),
                    (unsigned)((rows + GFW_DENSE_TT - 1) / GFW_DENSE_TT));
    mmoe_launch_pdl(k_linear_dense_tokens, grid, GFW_DENSE_TT_WARPS * 32, 0, st, x, rows, ldx, K, s, group_rows,
                    group_width);
}

#endif
