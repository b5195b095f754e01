/**
 * @file gpu_linear_fp8_tokens.cuh
 * @brief The FP8 linear for many tokens (prefill): exact block partials on the FP64 tensor
 *        cores, each weight code decoded once for up to 32 tokens.
 *
 * ## Why a second FP8 linear
 *
 * k_linear_fp8_128_split (gpu_forward.cu) serves one token per thread block: at decode that
 * is the whole call, but a prefill of T tokens streams every weight T times and decodes every
 * code T times, so a 64-token prefill of V4-Flash's W_qb (32 MB) costs about as much as 64
 * decode steps.  This kernel gives each weight code to 32 tokens at once.
 *
 * ## The arithmetic is the oracle's
 *
 * linear_fp8.c defines y[t, n] = bf16(sum_kb fl32(P[t, n, kb]) (s_x[t, kb] s_w[n/128, kb])),
 * the fp32 sum in ascending kb from +0, where P is the exact sum of the 128 products of E4M3
 * values of K block kb.  Every product is an integer multiple of 2^-18 below 2^18 and any sum
 * of at most 128 of them a multiple of 2^-18 below 2^25 (43 bits), so every partial sum of the
 * block, in any order and any grouping, is a double exactly.  The FP64 MMA
 * (`mma.sync.m8n8k4.f64`) computes D = A B + C with IEEE double operations, none of which has
 * anything to round here: the 8 x 8 block partials it leaves are the oracle's exact P, and
 * the rest (fl32, the scale product, the term, the fp32 sum in block order) is written out
 * with the oracle's operands in the oracle's order.  The operands are the codes' true values
 * as doubles, never a subnormal double: the smallest nonzero product is 2^-18.  A NaN code
 * gives a NaN value and a NaN partial, as in the oracle.
 *
 * ## The decode
 *
 * A code's double is built from its bits (fp8t_word_values()): e4m3_times_2m1016() places
 * the code's magnitude and sign in a double that is the value times 2^-1016 exactly (two
 * integer instructions), and a multiplication by 2^1016 restores the value, exactly (no
 * conversion instruction, no branch).  The NaN codes, which that function leaves finite, take
 * the table path (gfw_e4m3_value()): a lane tests its K block's 32 weight codes once (and the
 * warp takes the table path if any lane holds one), a thread its x words one at a time.
 *
 * ## Data layout
 *
 * A block is GFW_FP8T_WARPS warps and tb = 8, 16 or 32 tokens (fewer where the grid would
 * otherwise leave multiprocessors idle); warp v owns the 8 weight rows
 * n0 = 8 (GFW_FP8T_WARPS b + v) .. n0 + 7, the MMA's M.  The K order inside a 128-block is free
 * (the partial is exact), so MMA step j (0..31) of a block multiplies the four k = 32 q + j,
 * q = 0..3, fragment column q standing for k = 32 q + j:
 *
 *   - A (8 x 4, weights): lane (g, q) = (lane / 4, lane % 4) holds row n0 + g at k = 32 q + j;
 *     over the 32 steps a lane needs the 32 contiguous codes [32 q, 32 q + 32) of its row,
 *     which it loads as two 16-byte words (the block's next K block is loaded while this one
 *     is summed).
 *   - B (4 x 8, tokens): lane (g, q) holds token 8 i + g of n-tile i at k = 32 q + j.  The
 *     block stages the K block's values of its tb tokens as doubles in shared memory once
 *     (each thread decodes up to 32 codes, loaded during the previous K block), token r's
 *     value k at r GFW_FP8T_ROW + (k / 32)
 *     GFW_FP8T_SEG + k % 32: the row stride of 132 doubles (1056 bytes, 32 mod 128) and the
 *     segment stride of 33 (264 bytes, 8 mod 128) put the 16 lanes of a half warp on 16
 *     different 8-byte bank pairs.
 *   - C/D (8 x 8): lane (g, q) holds rows n0 + g, tokens 8 i + 2 q and 8 i + 2 q + 1.  After the
 *     32 steps of a K block the lane turns its 2 partials per n-tile into terms and adds them
 *     to its fp32 outputs; the partials start again from zero.
 *
 * Tokens past T (the last tile) are zero codes whose outputs are not written, and n-tiles
 * wholly past T are skipped; rows past N reread row N - 1 and are not written.
 *
 * ## Short projections: K split over the warps
 *
 * Where even 8-token blocks of 32 rows leave most multiprocessors idle (wq_a and wkv are 1024
 * and 512 rows), k_linear_fp8_tokens_ksplit gives a block 8 rows and 8 tokens and its warps
 * consecutive K blocks: the same staged layout holds four K blocks of 8 tokens where it held
 * one of 32, warp v takes n-tile v, and the fp32 terms, each computed as above, wait in shared
 * memory until warp 0 adds them in ascending K block order.
 *
 * ## Cost
 *
 * Per K block a warp issues 32 MMAs per live n-tile (8 rows x 8 tokens x 4 k each), 32 weight
 * decodes per lane (three instructions each) and a shared-memory read per MMA.  A block of
 * one or two live n-tiles (8 or 16 tokens) spreads each n-tile's 32 steps over four or two
 * accumulators (fp8t_block_mmas()), so that every warp has four independent MMA chains.  An
 * H200's FP64 tensor rate (half an m8n8k4 per cycle and multiprocessor) bounds a 64-token
 * W_qb (32768 x 1024) at about 64 us, where the one-token kernel would pass over the weights
 * once per token.
 */
#ifndef MMOE_GPU_LINEAR_FP8_TOKENS_CUH
/** Include guard (this file is included in the middle of gpu_forward.cu). */
#define MMOE_GPU_LINEAR_FP8_TOKENS_CUH

/** Warps of a k_linear_fp8_tokens block (8 weight rows each). */
#define GFW_FP8T_WARPS 4
/** Tokens of a k_linear_fp8_tokens block: four n-tiles of the FP64 MMA. */
#define GFW_FP8T_TOKENS 32
/** Doubles of one 32-value segment of a staged token row, with one of padding (bank spread). */
#define GFW_FP8T_SEG 33
/** Doubles of one staged token row: four segments. */
#define GFW_FP8T_ROW (4 * GFW_FP8T_SEG)
/** The fewest tokens for which launch_linear_fp8() takes this kernel rather than the one-token one. */
#define GFW_FP8T_MIN_T 8

/** D += A B for one m8n8k4 FP64 MMA: this lane's A and B elements and its two D elements. */
__device__ __forceinline__ void dmma_m8n8k4(double &d0, double &d1, double a, double b)
{
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
                 : "+d"(d0), "+d"(d1)
                 : "d"(a), "d"(b));
}

/** Most 4-code words of x one thread of k_linear_fp8_tokens stages per K block (32 tokens x 32 words / 128 threads). */
#define GFW_FP8T_XWORDS (GFW_FP8T_TOKENS * 32 / (GFW_FP8T_WARPS * 32))

/**
 * Load this thread's words of K block @p kb of the block's @p tb tokens from t0 (zero past T)
 * into @p xw: word u is word threadIdx.x + u blockDim.x of the block's tb x 32 words (token
 * w / 32, codes 4 (w % 32) ..), for u < tb / 4.  Every thread of the block calls it.
 */
__device__ __forceinline__ void fp8t_load_x(const uint8_t *xq, int64_t T, int64_t K, int64_t t0, int tb, int kb,
                                            uint32_t *xw)
{
#pragma unroll
    for (int u = 0; u < GFW_FP8T_XWORDS; u++) {
        const int i = threadIdx.x + u * blockDim.x, r = i >> 5;
        xw[u] = u < tb / 4 && t0 + r < T ? *(const uint32_t *)(xq + (t0 + r) * K + (int64_t)kb * 128 + (i & 31) * 4)
                                         : 0u;
    }
}

/**
 * The values of the four E4M3 codes of @p w (byte b in @p v[b]) as doubles, exactly, for a
 * word without NaN codes (the chapter's decode).
 */
__device__ __forceinline__ void fp8t_word_values(uint32_t w, double *v)
{
    const uint32_t w1 = w << 1;
    v[0] = __dmul_rn(e4m3_times_2m1016<0>(w, w1), 0x1p1016);
    v[1] = __dmul_rn(e4m3_times_2m1016<1>(w, w1), 0x1p1016);
    v[2] = __dmul_rn(e4m3_times_2m1016<2>(w, w1), 0x1p1016);
    v[3] = __dmul_rn(e4m3_times_2m1016<3>(w, w1), 0x1p1016);
}

/** The values of the four E4M3 codes of @p w through the table path (NaN codes included). */
__device__ __forceinline__ void fp8t_word_values_table(uint32_t w, double *v)
{
#pragma unroll
    for (int b = 0; b < 4; b++)
        v[b] = (double)gfw_e4m3_value((w >> (8 * b)) & 0xFFu);
}

/** Decode the words fp8t_load_x() left in @p xw into the staged doubles @p sx (the layout of the chapter above). */
__device__ __forceinline__ void fp8t_store_x(const uint32_t *xw, int tb, double *sx)
{
#pragma unroll
    for (int u = 0; u < GFW_FP8T_XWORDS; u++) {
        if (u >= tb / 4)
            break;
        const int i = threadIdx.x + u * blockDim.x, r = i >> 5, k = (i & 31) * 4;
        double *dst = sx + r * GFW_FP8T_ROW + (k >> 5) * GFW_FP8T_SEG + (k & 31);
        double v[4];
        if (e4m3_nan_bits(xw[u]) == 0)
            fp8t_word_values(xw[u], v);
        else
            fp8t_word_values_table(xw[u], v);
#pragma unroll
        for (int b = 0; b < 4; b++)
            dst[b] = v[b];
    }
}

/**
 * The 32 MMA steps of one K block: step j = 4 u + b multiplies the lane's weight value of code
 * b of word @p wq[u] (fp8t_word_values(), or the table path where @p table) by each live
 * n-tile's staged x (@p xb, the lane's column).  With @p CHAINS > 1 (CHAINS x @p tiles = 4)
 * n-tile i's steps alternate over the accumulators i + tiles (j % CHAINS), so that one warp
 * keeps four independent MMA chains in flight; the caller adds them (every partial sum of a
 * block is exact: the chapter above).
 */
template <int CHAINS>
__device__ __forceinline__ void fp8t_block_mmas(const uint32_t *wq, bool table, const double *xb, int tiles,
                                                double (*d)[2])
{
#pragma unroll
    for (int u = 0; u < 8; u++) { /* steps j = 4 u + b */
        double a[4];
        if (table)
            fp8t_word_values_table(wq[u], a);
        else
            fp8t_word_values(wq[u], a);
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int i = 0; i < 4 / CHAINS; i++)
                if (i < tiles) {
                    double *acc = d[i + (4 / CHAINS) * (b % CHAINS)];
                    dmma_m8n8k4(acc[0], acc[1], a[b], xb[i * 8 * GFW_FP8T_ROW + 4 * u + b]);
                }
    }
}

/**
 * y = fp8_linear(x) for T >= 1 tokens of 128-block scales (linear_fp8.c's bits): grid
 * (ceil(N / (8 GFW_FP8T_WARPS)), ceil(T / tb)), GFW_FP8T_WARPS warps a block, @p tb = 8, 16
 * or 32 tokens a block.  @p xq codes [T, K] (4-byte aligned), @p xs fp32 scales [T, K/128],
 * weight codes 16-byte aligned, K a multiple of 128.  The codes of K block kb + 1 (weights
 * in registers, x in fp8t_load_x's words) are loaded while block kb is summed.
 */
__global__ void __launch_bounds__(GFW_FP8T_WARPS * 32)
    k_linear_fp8_tokens(const uint8_t *xq, const float *xs, int64_t T, dfp8 w, int tb, uint16_t *y)
{
    gfw_pdl_enter();
    __shared__ double sx[GFW_FP8T_TOKENS * GFW_FP8T_ROW];
    const int64_t K = w.K;
    const int kb_w = (int)(K / 128);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.y * tb;
    const int64_t live_t = T - t0 < tb ? T - t0 : tb;
    const int tiles = (int)((live_t + 7) / 8); /* n-tiles holding a token; the same for the whole block */
    const int64_t row = ((int64_t)blockIdx.x * GFW_FP8T_WARPS + warp) * 8 + g;
    const bool row_live = row < w.N;
    const int64_t row_rd = row_live ? row : w.N - 1;
    const uint8_t *wr = w.w + row_rd * K + 32 * q; /* the lane's 32 codes of K block 0 */
    const uint8_t *ws = w.s + (row_rd >> 7) * w.scols;

    uint4 c0 = *(const uint4 *)wr, c1 = *(const uint4 *)(wr + 16);
    uint32_t xw[GFW_FP8T_XWORDS];
    fp8t_load_x(xq, T, K, t0, tb, 0, xw);
    float acc[4][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int kb = 0; kb < kb_w; kb++) {
        __syncthreads(); /* every warp is done with the previous block's values */
        fp8t_store_x(xw, tb, sx);
        uint4 n0 = c0, n1 = c1; /* the next K block's codes, in flight while this one is summed */
        if (kb + 1 < kb_w) {
            n0 = *(const uint4 *)(wr + (int64_t)(kb + 1) * 128);
            n1 = *(const uint4 *)(wr + (int64_t)(kb + 1) * 128 + 16);
            fp8t_load_x(xq, T, K, t0, tb, kb + 1, xw);
        }
        __syncthreads();
        const uint32_t wq[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        const double *xb = sx + g * GFW_FP8T_ROW + q * GFW_FP8T_SEG;
        double d[4][2] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
        uint32_t nan = 0;
#pragma unroll
        for (int u = 0; u < 8; u++)
            nan |= e4m3_nan_bits(wq[u]);
        const bool table = __any_sync(0xFFFFFFFFu, nan != 0); /* warp-uniform: the MMAs need every lane */
        if (tiles == 1) { /* four chains, added after (exact) */
            fp8t_block_mmas<4>(wq, table, xb, 1, d);
            d[0][0] = __dadd_rn(__dadd_rn(d[0][0], d[1][0]), __dadd_rn(d[2][0], d[3][0]));
            d[0][1] = __dadd_rn(__dadd_rn(d[0][1], d[1][1]), __dadd_rn(d[2][1], d[3][1]));
        } else if (tiles == 2) { /* two chains per n-tile */
            fp8t_block_mmas<2>(wq, table, xb, 2, d);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                d[i][0] = __dadd_rn(d[i][0], d[i + 2][0]);
                d[i][1] = __dadd_rn(d[i][1], d[i + 2][1]);
            }
        } else {
            fp8t_block_mmas<1>(wq, table, xb, tiles, d);
        }
        const float s_w = gfw_ue8m0(ws[kb]);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int64_t t = t0 + 8 * i + 2 * q + c;
                if (i < tiles && t < T) /* n-tiles past the block's are the next block's tokens */
                    acc[i][c] = __fadd_rn(acc[i][c],
                                          __fmul_rn(__double2float_rn(d[i][c]), __fmul_rn(xs[t * kb_w + kb], s_w)));
            }
        c0 = n0;
        c1 = n1;
    }
    if (!row_live)
        return;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int64_t t = t0 + 8 * i + 2 * q + c;
            if (i < tiles && t < T)
                y[t * w.N + row] = gfw_f2bf(acc[i][c]);
        }
}

/**
 * Load this thread's words of K blocks 4 @p it .. 4 @p it + 3 of the block's 8 tokens from t0
 * for k_linear_fp8_tokens_ksplit (zero past T and past the @p kb_w K blocks) into @p xw:
 * staged row r = 8 v + t holds token t of K block 4 it + v, word w of the 32 x 32 words
 * being row w / 32, codes 4 (w % 32) .., as fp8t_load_x() lays out 32 tokens.
 */
__device__ __forceinline__ void fp8t_load_x_ksplit(const uint8_t *xq, int64_t T, int64_t K, int64_t t0, int kb_w,
                                                   int it, uint32_t *xw)
{
#pragma unroll
    for (int u = 0; u < GFW_FP8T_XWORDS; u++) {
        const int i = threadIdx.x + u * blockDim.x, r = i >> 5, t = r & 7, kb = 4 * it + (r >> 3);
        xw[u] = t0 + t < T && kb < kb_w ? *(const uint32_t *)(xq + (t0 + t) * K + (int64_t)kb * 128 + (i & 31) * 4)
                                        : 0u;
    }
}

/**
 * y = fp8_linear(x) as k_linear_fp8_tokens computes it, for 8 rows and 8 tokens a block with
 * K split over the block's warps: grid (ceil(N / 8), ceil(T / 8)), GFW_FP8T_WARPS warps; in
 * round it warp v sums K block kb = 4 it + v (the staged rows 8 v .. 8 v + 7 hold its x, the
 * buffer of 32 tokens holding four K blocks of 8) with four MMA chains, and leaves its terms
 * fl32(P) (s_x s_w) in shared memory; warp 0 adds them to its fp32 outputs in ascending kb
 * from +0, the oracle's order, one round later.  For projections whose 8-token grid would
 * leave most multiprocessors idle (launch_linear_fp8_tokens()); contract as
 * k_linear_fp8_tokens's.
 */
__global__ void __launch_bounds__(GFW_FP8T_WARPS * 32)
    k_linear_fp8_tokens_ksplit(const uint8_t *xq, const float *xs, int64_t T, dfp8 w, uint16_t *y)
{
    gfw_pdl_enter();
    __shared__ double sx[GFW_FP8T_TOKENS * GFW_FP8T_ROW];
    __shared__ float term[2][GFW_FP8T_WARPS][64]; /* [round parity][warp][8 g + token] */
    const int64_t K = w.K;
    const int kb_w = (int)(K / 128), rounds = (kb_w + GFW_FP8T_WARPS - 1) / GFW_FP8T_WARPS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t t0 = (int64_t)blockIdx.y * 8;
    const int64_t row = (int64_t)blockIdx.x * 8 + g;
    const bool row_live = row < w.N;
    const int64_t row_rd = row_live ? row : w.N - 1;
    const uint8_t *wr = w.w + row_rd * K + 32 * q; /* the lane's 32 codes of K block 0 */
    const uint8_t *ws = w.s + (row_rd >> 7) * w.scols;
    const double *xb = sx + (8 * warp + g) * GFW_FP8T_ROW + q * GFW_FP8T_SEG;

    uint4 c0 = make_uint4(0u, 0u, 0u, 0u), c1 = c0;
    if (warp < kb_w) {
        c0 = *(const uint4 *)(wr + (int64_t)warp * 128);
        c1 = *(const uint4 *)(wr + (int64_t)warp * 128 + 16);
    }
    uint32_t xw[GFW_FP8T_XWORDS];
    fp8t_load_x_ksplit(xq, T, K, t0, kb_w, 0, xw);
    float acc[2] = {0.0f, 0.0f};
    for (int it = 0; it <= rounds; it++) {
        __syncthreads(); /* every warp is done with round it - 1's values and has left its terms */
        if (warp == 0 && it > 0) {
#pragma unroll
            for (int v = 0; v < GFW_FP8T_WARPS; v++)
                if (4 * (it - 1) + v < kb_w)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        acc[c] = __fadd_rn(acc[c], term[(it - 1) & 1][v][8 * g + 2 * q + c]);
        }
        if (it == rounds)
            break;
        fp8t_store_x(xw, GFW_FP8T_TOKENS, sx);
        const int kb = 4 * it + warp, kbn = kb + 4;
        uint4 n0 = c0, n1 = c1; /* the warp's next K block's codes, in flight while this one is summed */
        if (it + 1 < rounds) {
            if (kbn < kb_w) {
                n0 = *(const uint4 *)(wr + (int64_t)kbn * 128);
                n1 = *(const uint4 *)(wr + (int64_t)kbn * 128 + 16);
            }
            fp8t_load_x_ksplit(xq, T, K, t0, kb_w, it + 1, xw);
        }
        __syncthreads();
        if (kb < kb_w) { /* warp-uniform */
            const uint32_t wq[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            double d[4][2] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
            uint32_t nan = 0;
#pragma unroll
            for (int u = 0; u < 8; u++)
                nan |= e4m3_nan_bits(wq[u]);
            fp8t_block_mmas<4>(wq, __any_sync(0xFFFFFFFFu, nan != 0), xb, 1, d);
            const float s_w = gfw_ue8m0(ws[kb]);
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const double P = __dadd_rn(__dadd_rn(d[0][c], d[1][c]), __dadd_rn(d[2][c], d[3][c])); /* exact */
                const int64_t t = t0 + 2 * q + c;
                term[it & 1][warp][8 * g + 2 * q + c] =
                    t < T ? __fmul_rn(__double2float_rn(P), __fmul_rn(xs[t * kb_w + kb], s_w)) : 0.0f;
            }
        }
        c0 = n0;
        c1 = n1;
    }
    if (warp != 0 || !row_live)
        return;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int64_t t = t0 + 2 * q + c;
        if (t < T)
            y[t * w.N + row] = gfw_f2bf(acc[c]);
    }
}

/**
 * Launch the many-token FP8 linear for T tokens of @p w (see k_linear_fp8_tokens's contract)
 * on @p n_sm multiprocessors: 32 tokens a block, or 16 or 8 where that leaves fewer than two
 * blocks per multiprocessor (a short projection such as wq_a or wkv would otherwise run on a
 * fraction of them; each block walks all of K); where even 8 tokens a block leave fewer than
 * two, k_linear_fp8_tokens_ksplit with 8 rows a block and K split over its warps.
 */
static void launch_linear_fp8_tokens(const uint8_t *xq, const float *xs, int64_t T, const dfp8 &w, uint16_t *y,
                                     int n_sm, cudaStream_t st)
{
    const int64_t rows = 8 * GFW_FP8T_WARPS, row_blocks = (w.N + rows - 1) / rows;
    const int64_t few = 2 * (int64_t)(n_sm > 0 ? n_sm : 1);
    int tb = GFW_FP8T_TOKENS;
    while (tb > 8 && row_blocks * ((T + tb - 1) / tb) < few)
        tb /= 2;
    if (tb == 8 && row_blocks * ((T + 7) / 8) < few) {
        const dim3 grid((unsigned)((w.N + 7) / 8), (unsigned)((T + 7) / 8));
        mmoe_launch_pdl(k_linear_fp8_tokens_ksplit, grid, GFW_FP8T_WARPS * 32, 0, st, xq, xs, T, w, y);
        return;
    }
    const dim3 grid((unsigned)row_blocks, (unsigned)((T + tb - 1) / tb));
    mmoe_launch_pdl(k_linear_fp8_tokens, grid, GFW_FP8T_WARPS * 32, 0, st, xq, xs, T, w, tb, y);
}

#endif
