/**
 * @file moe_expert_gemm.c
 * @brief The GEMMs of one expert: weight rows dequantized once per call and multiplied in the
 *        fixed order of moe_dot.c, the rows shared out over the dequantization threads.
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
 * Every weight of an expert that received tokens is decoded once per call and used by all m
 * tokens.  The rows of W are shared out over the layer's dequantization threads and the caller
 * (moe_pool_rows_held(), moe_dequant_pool.c) in grabs of ::MOE_POOLED_ROWS rows; a thread
 * decodes its rows into a tile of its own (moe_weight_tile.c; 384 KiB at V4-Flash's D = 4096,
 * small enough to stay in the L2 cache while every token passes over it) and multiplies them by
 * all m tokens.  Decoding and multiplying are thus split evenly over the threads; which thread
 * takes which rows changes nothing in the values an output is computed from, nor in its
 * operations.  (A pipeline that decodes the next large tile on the workers while the caller
 * multiplies the current one keeps the multiplications on one thread: on the 2-core development
 * VM a 64-token prefill's MoE took 1.30 s that way on two threads, against 1.49 s on one and
 * 0.82 s with the rows shared out; docs/perf.md.)

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

/** Weight rows a thread decodes and multiplies at a time in pooled_gemm(): a multiple of moe_dot.c's 3 and 8. */
#define MOE_POOLED_ROWS 24

/** One pooled_gemm() call's operands, shared by the threads that take its rows. */
typedef struct {
    const moe_mat *w;   /**< the weight matrix */
    const float *a;     /**< the tokens' activations [m, K] */
    int64_t m;          /**< tokens */
    float *out;         /**< [m, rows(W)] */
    float *tiles;       /**< per thread: ::MOE_POOLED_ROWS x K floats */
    moe_dot_isa isa;    /**< the GEMM's kernels */
    double caller_decode_s; /**< seconds the caller (thread 0) spent decoding */
} pooled_job;

/** moe_rows_fn of pooled_gemm(): rows [r0, r1), ::MOE_POOLED_ROWS at a time, decoded then multiplied. */
static void pooled_rows(void *ctx, int thread, int64_t r0, int64_t r1)
{
    pooled_job *j = ctx;
    const int64_t k = j->w->cols, n = j->w->rows;
    float *tile = j->tiles + (int64_t)thread * MOE_POOLED_ROWS * k;
    for (int64_t r = r0; r < r1; r += MOE_POOLED_ROWS) {
        const int64_t nr = min_i64(MOE_POOLED_ROWS, r1 - r);
        const double t0 = thread == 0 ? mmoe_clock_s() : 0.0;
        moe_weight_tile_f32(j->w, r, nr, 0, k, tile);
        if (thread == 0)
            j->caller_decode_s += mmoe_clock_s() - t0;
        moe_dot_gemm(j->isa, j->a, k, j->m, tile, k, nr, k, j->out + r, n);
    }
}

/**
 * out[m, N] = a[m, K] . W^T with every thread of the pool decoding rows and multiplying them
 * ("Cost" above).  The time is booked as GEMM time, less the caller's own decoding, booked as
 * dequantization (the threads do the same mix).
 */
static int pooled_gemm(const moe_mat *w, const float *a, int64_t m, float *out, moe_scratch *s, moe_gemm_clock *clk)
{
    const int64_t k = w->cols, n = w->rows;
    const int threads = moe_dequant_pool_threads(s->pool);
    if (moe_scratch_reserve(&s->tile, &s->tile_cap, (size_t)threads * MOE_POOLED_ROWS * (size_t)k) != 0)
        return -1;
    pooled_job j = {w, a, m, out, s->tile, moe_dot_isa_best(), 0.0};
    const double t0 = mmoe_clock_s();
    moe_pool_rows_held(s->pool, n, k * m, MOE_POOLED_ROWS, pooled_rows, &j);
    const double wall = mmoe_clock_s() - t0;
    clk->dequant_s += j.caller_decode_s;
    clk->gemm_s += wall - j.caller_decode_s;
    clk->flops += 2.0 * (double)m * (double)n * (double)k;
    return 0;
}

int moe_expert_gemm(const moe_mat *w, const float *a, int64_t m, float *out, moe_scratch *s, moe_gemm_clock *clk)
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
    return pooled_gemm(w, a, m, out, s, clk);
}
