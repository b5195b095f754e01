/**
 * @file moe_expert_gemm.c
 * @brief The GEMMs of one expert: weight tiles dequantized once per call (one tile ahead, by
 *        the dequantization workers), multiplied in the fixed order of moe_dot.c.
 *
 * An expert that received m tokens computes
 *
 *     L1:  gate[m, I] = a[m, D] . W1^T      up[m, I] = a[m, D] . W3^T
 *     L2:  y[m, D]    = h[m, I] . W2^T
 *
 * with a the dequantized FP8 activations (moe_act_quant.c) and W the dequantized weights
 * (moe_weight_tile.c).  Every output element is one dot product over the whole K in the order
 * that moe_dot.c defines (eight FMA lanes in ascending k, a fixed combine), so:
 *  - a token's row does not depend on the other tokens of the expert (batch invariance), nor on
 *    how the rows are tiled or blocked, nor on the CPU or the BLAS;
 *  - padding I (2304 -> 2560) changes no bit: L1 gains output rows that are separate outputs,
 *    L2 gains K columns of zero products in runs of 128, which moe_dot.c shows leave every
 *    lane unchanged.
 *
 * ## Cost
 * Each weight tile (::MOE_L1_ROWS x D for L1, ::MOE_L2_ROWS x I for L2; 2 MiB at V4-Flash's
 * D = 4096, I = 2048) is decoded once per call (only for experts that received tokens) and
 * used by all m tokens of the expert.  Decoding is a large share of the layer (a 2 MiB tile is
 * written at the cache's store bandwidth), so it is done by the layer's dequantization workers
 * (moe_dequant_pool.c), one tile ahead: tile i + 1 is decoded into a second buffer while the
 * GEMM of tile i runs on the caller's thread, and the caller helps with what is left when its
 * GEMM is done.  Which buffer holds which tile, and which thread decodes which rows, changes
 * nothing in the values the GEMM reads.
 *
 * ## Few tokens: weights decoded in registers
 * An expert with at most ::MOE_FP4_FUSED_MAX_TOKENS tokens of FP4 weights (the common case at
 * decode sizes), or ::MOE_FP8_FUSED_MAX_TOKENS of FP8 ones (the shared expert, whose m is every
 * token of the call), skips the tiles: moe_dot_gemm_coded() decodes each 32-weight FP4 group, or
 * each 8 FP8 codes and their block scale, in AVX2 registers, with the decoder's exact values,
 * and feeds them to the same FMA lanes, so the bits are those of the tiled path (suite
 * moe_batchinv runs every token alone, on this path, and in a batch, on the tiled one).  The
 * weight rows are shared out over the layer's dequantization threads and the caller
 * (moe_pool_gemm_coded(), moe_dequant_pool.c): each output row is one call of the same kernel
 * on the same operands whichever thread runs it.  Thread CPU time per 2048 x 4096 FP4 matrix
 * on one thread of the Zen 3 development machine: 1.5 / 2.3 / 3.4 / 5.0 ms for 1 / 2 / 4 / 6
 * tokens in registers, against 4.4-6.7 ms for decoding the tiles on one thread and multiplying
 * (at 8 tokens and more the tiles win, and their decoding runs on the worker pool besides).
 * Without AVX2 the tiled path is used for every m.
 */
#include "moe_internal.h"

#include <stdlib.h>

/** Rows of W1/W3 per L1 tile. */
#define MOE_L1_ROWS 128
/** Rows of W2 per L2 tile. */
#define MOE_L2_ROWS 256
/** Experts with at most this many tokens multiply FP4 weights decoded in registers (no tiles). */
#define MOE_FP4_FUSED_MAX_TOKENS 4
/**
 * The same for FP8 weights (the shared expert): decoding 8 codes and their scale costs more
 * than a 32-weight FP4 group, and with 4 tokens the tiles measured faster (docs/perf.md).
 */
#define MOE_FP8_FUSED_MAX_TOKENS 2

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
    *s = (moe_scratch){.pool = s->pool};
}

/** The smaller of two sizes. */
static int64_t min_i64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/**
 * out[m, N] = a[m, K] . W^T in row tiles of @p tile_rows rows.  Pipelined: while the GEMM of
 * tile i runs on this thread, the dequantization workers decode tile i + 1 into the other
 * buffer (tile i lives in bufs[i % 2]); with no workers the decode simply runs before the GEMM.
 */
static void tiled_gemm(const moe_mat *w, const float *a, int64_t m, int64_t tile_rows, float *out,
                       float *const bufs[2], moe_dequant_pool *pool, moe_gemm_clock *clk)
{
    const int64_t k = w->cols, n = w->rows;
    const moe_dot_isa isa = moe_dot_isa_best();
    double t0 = mmoe_clock_s();
    moe_dequant_start(pool, w, 0, min_i64(tile_rows, n), 0, k, k, bufs[0]);
    clk->dequant_s += mmoe_clock_s() - t0;
    for (int64_t i = 0, r0 = 0; r0 < n; i++, r0 += tile_rows) {
        const int64_t nr = min_i64(tile_rows, n - r0);
        double t1 = mmoe_clock_s();
        moe_dequant_finish(pool); /* tile i is complete */
        if (r0 + tile_rows < n)   /* tile i + 1 decodes while the GEMM of tile i runs */
            moe_dequant_start(pool, w, r0 + tile_rows, min_i64(tile_rows, n - r0 - tile_rows), 0, k, k,
                              bufs[(i + 1) % 2]);
        double t2 = mmoe_clock_s();
        moe_dot_gemm(isa, a, k, m, bufs[i % 2], k, nr, k, out + r0, n);
        double t3 = mmoe_clock_s();
        clk->dequant_s += t2 - t1;
        clk->gemm_s += t3 - t2;
    }
    clk->flops += 2.0 * (double)m * (double)n * (double)k;
}

int moe_expert_gemm(const moe_mat *w, const float *a, int64_t m, moe_gemm_kind kind, float *out,
                    moe_scratch *s, moe_gemm_clock *clk)
{
    if (m <= 0)
        return 0;
    const moe_dot_isa isa = moe_dot_isa_best();
    const int64_t fused_max = w->fmt == MOE_W_FP8 ? MOE_FP8_FUSED_MAX_TOKENS : MOE_FP4_FUSED_MAX_TOKENS;
    if (m <= fused_max && moe_dot_coded_in_registers(isa, w)) {
        double t0 = mmoe_clock_s();
        moe_pool_gemm_coded(s->pool, isa, a, w->cols, m, w, out, w->rows);
        clk->gemm_s += mmoe_clock_s() - t0;
        clk->flops += 2.0 * (double)m * (double)w->rows * (double)w->cols;
        return 0;
    }
    /* two tile buffers (decode of the next tile overlaps the GEMM of this one) */
    const int64_t tile_rows = kind == MOE_GEMM_L2 ? MOE_L2_ROWS : MOE_L1_ROWS;
    const size_t tile_n = (size_t)tile_rows * (size_t)w->cols;
    if (moe_scratch_reserve(&s->tile, &s->tile_cap, 2 * tile_n) != 0)
        return -1;
    float *const bufs[2] = {s->tile, s->tile + tile_n};
    tiled_gemm(w, a, m, tile_rows, out, bufs, s->pool, clk);
    return 0;
}
