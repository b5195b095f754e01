/**
 * @file moe_expert_gemm.c
 * @brief The GEMMs of one expert: weight tiles dequantized once per call, OpenBLAS SGEMM on the
 *        gathered tokens, with a tiling that makes padding and batch invisible in the bits.
 *
 * An expert that received m tokens computes
 *
 *     L1:  gate[m, I] = a[m, D] . W1^T      up[m, I] = a[m, D] . W3^T
 *     L2:  y[m, D]    = h[m, I] . W2^T
 *
 * with a the dequantized FP8 activations (moe_act_quant.c) and W the dequantized weights
 * (moe_weight_tile.c).  Each product a * w is exact in FP32, so only the order of the sums is
 * free; we let OpenBLAS choose it *inside* fixed blocks and fix everything else.
 *
 * ## Why the tiles are fixed
 * The layer must give bit-identical results when I is padded (2304 -> 2560) with zero rows
 * and columns.  Two things could change the sums:
 *  - L1: padding adds rows to W1/W3 (more output columns).  Each output column's sum runs over
 *    the same K = D in both layers, and we always call SGEMM on row tiles of
 *    ::MOE_L1_ROWS rows (I is a multiple of 128), so the calls over the real rows are the
 *    same calls, with the same shapes, as without padding.
 *  - L2: padding adds columns to W2 (a longer K).  A BLAS splits a long K into blocks whose
 *    size depends on K, which would regroup the sum.  So L2 runs over K in chunks of
 *    ::MOE_K_CHUNK = 128 channels (I is a multiple of 128): the chunk's partial sum comes from
 *    one SGEMM with K = 128, and the partial sums are added into the FP32 output in ascending
 *    chunk order (SGEMM with beta = 1 adds its partial to C).  A padded chunk has zero
 *    activations and zero weights: its partial is +-0 and C + 0 = C (C is never -0, since it
 *    starts as an RN sum).
 *
 * ## Why the token rows are blocked
 * The same argument in the third dimension: the bits of a token's row must not depend on how
 * many other tokens the expert received (batch invariance).  OpenBLAS picks its summation
 * order from M too, so no SGEMM here sees the caller's m: the rows go through
 * moe_token_blocks.c in blocks of exactly ::MOE_EXPERT_TOKEN_BLOCK = 1 row, i.e. one SGEMM
 * call per token and weight tile.  With all three dimensions of every call fixed by the
 * layer's shape, a token's row is summed by the same instruction sequence whatever the other
 * tokens are (see that file for the evidence and for why one row is also the fastest block).
 *
 * ## Cost
 * Every weight tile is decoded once per call (only for experts that received tokens) and used
 * by all m tokens of the expert (one single-row SGEMM per token); the tiles (128 x D for L1,
 * 256 x 128 for L2) stay in the cache while SGEMM reads them.
 */
#include "moe_internal.h"

#include <stdlib.h>

/** Rows of W1/W3 per L1 tile. */
#define MOE_L1_ROWS 128
/** Rows of W2 per L2 tile. */
#define MOE_L2_ROWS 256
/** K chunk of the L2 GEMM (the quantization group of 128 and the alignment of I). */
#define MOE_K_CHUNK 128

int moe_scratch_reserve(float **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    free(*buf);
    *buf = malloc(n * sizeof(float));
    *cap = *buf != NULL ? n : 0;
    return *buf != NULL ? 0 : -1;
}

void moe_scratch_free(moe_scratch *s)
{
    free(s->tile);
    free(s->xg);
    free(s->gate);
    free(s->up);
    free(s->yl2);
    free(s->tail_a);
    free(s->tail_c);
    *s = (moe_scratch){.pool = s->pool};
}

/** L1: out[m, N] = a[m, K] . W^T in row tiles of MOE_L1_ROWS over the full K. */
static void l1_gemm(const moe_mat *w, const moe_token_blocks *tb, int64_t m, float *tile, moe_dequant_pool *pool,
                    moe_gemm_clock *clk)
{
    const int64_t k = w->cols, n = w->rows;
    for (int64_t r0 = 0; r0 < n; r0 += MOE_L1_ROWS) {
        int64_t nr = n - r0 < MOE_L1_ROWS ? n - r0 : MOE_L1_ROWS;
        double t0 = moe_now_s();
        moe_dequant_tiles(pool, w, r0, nr, 0, k, k, tile);
        double t1 = moe_now_s();
        moe_token_blocks_sgemm(tb, 0, tile, nr, k, k, 0.0f, r0);
        double t2 = moe_now_s();
        clk->dequant_s += t1 - t0;
        clk->gemm_s += t2 - t1;
    }
    clk->flops += 2.0 * (double)m * (double)n * (double)k;
}

/** L2: out[m, N] = a[m, K] . W^T in row tiles, K in chunks of MOE_K_CHUNK added in order. */
static void l2_gemm(const moe_mat *w, const moe_token_blocks *tb, int64_t m, float *tile, moe_dequant_pool *pool,
                    moe_gemm_clock *clk)
{
    const int64_t k = w->cols, n = w->rows;
    for (int64_t r0 = 0; r0 < n; r0 += MOE_L2_ROWS) {
        int64_t nr = n - r0 < MOE_L2_ROWS ? n - r0 : MOE_L2_ROWS;
        /* all K chunks of the row tile in one job (one wake-up of the pool), chunk t at tile + t*nr*128 */
        double t0 = moe_now_s();
        moe_dequant_tiles(pool, w, r0, nr, 0, k, MOE_K_CHUNK, tile);
        double t1 = moe_now_s();
        for (int64_t k0 = 0; k0 < k; k0 += MOE_K_CHUNK)
            moe_token_blocks_sgemm(tb, k0, tile + (k0 / MOE_K_CHUNK) * nr * MOE_K_CHUNK, nr, MOE_K_CHUNK, MOE_K_CHUNK,
                                   k0 == 0 ? 0.0f : 1.0f, r0);
        double t2 = moe_now_s();
        clk->dequant_s += t1 - t0;
        clk->gemm_s += t2 - t1;
    }
    clk->flops += 2.0 * (double)m * (double)n * (double)k;
}

int moe_expert_gemm(const moe_mat *w, const float *a, int64_t m, int k_chunked, float *out,
                    moe_scratch *s, moe_gemm_clock *clk)
{
    if (m <= 0)
        return 0;
    size_t tile_n = k_chunked ? (size_t)MOE_L2_ROWS * (size_t)w->cols : (size_t)MOE_L1_ROWS * (size_t)w->cols;
    if (moe_scratch_reserve(&s->tile, &s->tile_cap, tile_n) != 0)
        return -1;
    moe_token_blocks tb;
    if (moe_token_blocks_begin(&tb, MOE_EXPERT_TOKEN_BLOCK, a, w->cols, m, out, w->rows, &s->tail_a, &s->tail_a_cap,
                               &s->tail_c, &s->tail_c_cap) != 0)
        return -1;
    if (k_chunked)
        l2_gemm(w, &tb, m, s->tile, s->pool, clk);
    else
        l1_gemm(w, &tb, m, s->tile, s->pool, clk);
    moe_token_blocks_end(&tb);
    return 0;
}
