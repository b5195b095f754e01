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
 * 256 x 128 for L2) stay in the cache while SGEMM reads them.  Decoding used to dominate the
 * layer (a 2 MiB tile is written at the L3's store bandwidth), so it is done by the layer's
 * dequantization workers (moe_dequant_pool.c), one tile ahead: tile i + 1 is decoded into a
 * second buffer while the SGEMMs of tile i run, and the caller helps with what is left when
 * its SGEMMs are done.  L2 decodes all K chunks of a 256-row tile as one job (256 x I floats,
 * the same size as an L1 tile at I = D / 2).  Nothing of this reaches the SGEMMs: the same
 * calls, with the same shapes, the same K order and the same values, on the caller's thread.
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

/** The smaller of two sizes. */
static int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/**
 * out[m, N] = a[m, K] . W^T in row tiles of @p tile_rows rows, K in chunks of @p chunk columns
 * whose partial sums are added in ascending order (L1: chunk = K, one SGEMM per token and
 * tile; L2: chunk = ::MOE_K_CHUNK).  Pipelined: while the SGEMMs of tile i run on this thread,
 * the dequantization workers decode tile i + 1 into the other buffer (tile i lives in
 * bufs[i % 2]); with no workers the decode simply runs before the SGEMMs.  The SGEMM calls,
 * their shapes and their order are the same as without the pipeline.
 */
static void tiled_gemm(const moe_mat *w, const moe_token_blocks *tb, int64_t m, int64_t tile_rows, int64_t chunk,
                       float *const bufs[2], moe_dequant_pool *pool, moe_gemm_clock *clk)
{
    const int64_t k = w->cols, n = w->rows;
    double t0 = mmoe_clock_s();
    moe_dequant_start(pool, w, 0, min_i64(tile_rows, n), 0, k, chunk, bufs[0]);
    clk->dequant_s += mmoe_clock_s() - t0;
    for (int64_t i = 0, r0 = 0; r0 < n; i++, r0 += tile_rows) {
        const int64_t nr = min_i64(tile_rows, n - r0);
        const float *tile = bufs[i % 2];
        double t1 = mmoe_clock_s();
        moe_dequant_finish(pool); /* tile i is complete */
        if (r0 + tile_rows < n)   /* tile i + 1 decodes while the SGEMMs of tile i run */
            moe_dequant_start(pool, w, r0 + tile_rows, min_i64(tile_rows, n - r0 - tile_rows), 0, k, chunk,
                              bufs[(i + 1) % 2]);
        double t2 = mmoe_clock_s();
        for (int64_t k0 = 0; k0 < k; k0 += chunk)
            moe_token_blocks_sgemm(tb, k0, tile + (k0 / chunk) * nr * chunk, nr, chunk, chunk, k0 == 0 ? 0.0f : 1.0f,
                                   r0);
        double t3 = mmoe_clock_s();
        clk->dequant_s += t2 - t1;
        clk->gemm_s += t3 - t2;
    }
    clk->flops += 2.0 * (double)m * (double)n * (double)k;
}

int moe_expert_gemm(const moe_mat *w, const float *a, int64_t m, int k_chunked, float *out,
                    moe_scratch *s, moe_gemm_clock *clk)
{
    if (m <= 0)
        return 0;
    /* two tile buffers (decode of the next tile overlaps the SGEMMs of this one) */
    const int64_t tile_rows = k_chunked ? MOE_L2_ROWS : MOE_L1_ROWS;
    const size_t tile_n = (size_t)tile_rows * (size_t)w->cols;
    if (moe_scratch_reserve(&s->tile, &s->tile_cap, 2 * tile_n) != 0)
        return -1;
    moe_token_blocks tb;
    if (moe_token_blocks_begin(&tb, MOE_EXPERT_TOKEN_BLOCK, a, w->cols, m, out, w->rows, &s->tail_a, &s->tail_a_cap,
                               &s->tail_c, &s->tail_c_cap) != 0)
        return -1;
    float *const bufs[2] = {s->tile, s->tile + tile_n};
    tiled_gemm(w, &tb, m, tile_rows, k_chunked ? MOE_K_CHUNK : w->cols, bufs, s->pool, clk);
    moe_token_blocks_end(&tb);
    return 0;
}
