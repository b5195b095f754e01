/**
 * @file attn_sparse.c
 * @brief Sparse attention with an attention sink: one query over an explicit list of kv rows (@ref spec_arch_attention).
 *
 * Every V4 attention layer reduces to the same core: a query token with H heads
 * attends to a *list* of 512-d kv rows -- the raw kv of the sliding window, then
 * the compressed blocks (all complete ones for HCA, the indexer's choice for CSA).
 * There is a single kv head and K = V: the same bf16 row (rope dims included)
 * serves as key and as value.
 *
 * For head h and list entry t:  s_t = fp32(q_h . kv_t) * d^-0.5  (the scale applied
 * after the dot product).  The list is consumed in chunks of 64 with the online
 * (running-max) softmax of flash attention, all in fp32:
 *
 *     m' = max(m, max_chunk s);  alpha = exp(m - m')
 *     den = den * alpha + sum_chunk exp(s_t - m')
 *     acc = acc * alpha + sum_chunk bf16(exp(s_t - m')) * kv_t
 *
 * The un-normalized probabilities are rounded to bf16 for the P.V product (the
 * reference's kernel feeds them to a bf16 GEMM), while the denominator sums the
 * fp32 values.  After the last chunk the **attention sink** joins the denominator
 * only: den += exp(sink_h - m), m the running max over the real scores (the sink
 * has no value vector and does not move the max).  Finally o_h = bf16(acc / den).
 * The sink lets a head put probability mass "nowhere" when no entry is relevant.
 *
 * Dot products: bf16 x bf16 products are exact in double; they are summed in double
 * in the chunked pairwise order of @ref spec_arch_sum_order (mmoe_sum_order.h) and
 * rounded once to fp32 (attn_dot_bf16(): the four chunks of an aligned node as four
 * independent chains, the node added as the tree adds it).  Empty list slots (-1 in the reference)
 * are simply not in the list: in exact arithmetic they contribute nothing, and
 * leaving them out keeps chunk boundaries identical between prefill and decode.
 *
 * ## Kernels
 *
 * A head's query is widened to double once and permuted into chunk-lane order; a chunk's 64
 * scores are then attn_dot_rows_bf16() of it against the chunk's rows (linear_dense.c: under
 * AVX2 the four chains of a node in the four lanes of a register, four rows at a time), the bits
 * of attn_dot_bf16().  P.V and the rescale by alpha run eight channels at a time under AVX2, the
 * product and the sum as two roundings like the scalar loop (the product of two bf16 values is
 * exact in fp32 except below the normal range, where a fused multiply-add would round once
 * instead of twice).  tests/test_attn_blocks.c checks every variant against the generic one.
 */
#include "attn_internal.h"

#include <math.h>

#include "cpu_avx2.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_sum_order.h"

double attn_dot_bf16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    float af[MMOE_SUM_NODE4], bf[MMOE_SUM_NODE4];
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    int64_t i0 = 0;
    for (; i0 + MMOE_SUM_NODE4 <= n; i0 += MMOE_SUM_NODE4) {
        mmoe_bf16_to_f32_row(a + i0, MMOE_SUM_NODE4, af);
        mmoe_bf16_to_f32_row(b + i0, MMOE_SUM_NODE4, bf);
        mmoe_pairwise_push_node(&pw, mmoe_sum_node4_f32(af, bf), 2);
    }
    for (; i0 < n; i0 += MMOE_SUM_CHUNK) {
        const int64_t i1 = n - i0 < MMOE_SUM_CHUNK ? n : i0 + MMOE_SUM_CHUNK;
        double c = 0.0;
        for (int64_t i = i0; i < i1; i++)
            c += (double)fmt_bf16_to_f32(a[i]) * (double)fmt_bf16_to_f32(b[i]);
        mmoe_pairwise_push(&pw, c);
    }
    return mmoe_pairwise_result(&pw);
}

#if MMOE_CPU_HAVE_X86
/** scale_acc() eight values at a time; returns the first c left to the caller. */
MMOE_AVX2 static int scale_acc_avx2(float *acc, int d, float alpha)
{
    const __m256 a = _mm256_set1_ps(alpha);
    int c = 0;
    for (; c + 8 <= d; c += 8)
        _mm256_storeu_ps(acc + c, _mm256_mul_ps(_mm256_loadu_ps(acc + c), a));
    return c;
}

/**
 * add_weighted_row() eight values at a time, the product and the sum as two roundings (a fused
 * multiply-add would round once, which differs where p * kv[c] is not exact in fp32: a product
 * below the normal range); returns the first c left to the caller.
 */
MMOE_AVX2 static int add_weighted_row_avx2(float *acc, const uint16_t *kv, int d, float p)
{
    const __m256 pv = _mm256_set1_ps(p);
    int c = 0;
    for (; c + 8 <= d; c += 8) {
        const __m256 v = mmoe_bf16x8_avx2(kv + c);
        _mm256_storeu_ps(acc + c, _mm256_add_ps(_mm256_loadu_ps(acc + c), _mm256_mul_ps(pv, v)));
    }
    return c;
}
#endif

/** acc[c] = acc[c] * alpha, c < d: the rescale of the online softmax. */
static void scale_acc(moe_dot_isa isa, float *acc, int d, float alpha)
{
    int c = 0;
#if MMOE_CPU_HAVE_X86
    if (moe_dot_isa_has_avx2(isa))
        c = scale_acc_avx2(acc, d, alpha);
#endif
    (void)isa;
    for (; c < d; c++)
        acc[c] *= alpha;
}

/** acc[c] = acc[c] + p * kv[c], c < d (the product, then the sum, each rounded to fp32): one row of P.V. */
static void add_weighted_row(moe_dot_isa isa, float *acc, const uint16_t *kv, int d, float p)
{
    int c = 0;
#if MMOE_CPU_HAVE_X86
    if (moe_dot_isa_has_avx2(isa))
        c = add_weighted_row_avx2(acc, kv, d, p);
#endif
    (void)isa;
    for (; c < d; c++)
        acc[c] += p * fmt_bf16_to_f32(kv[c]);
}

/** One thread's scratch (ATTN_SPARSE_SCRATCH_FLOATS()), carved up. */
typedef struct {
    float *acc;     /**< fp32 accumulators [d] */
    double *qd;     /**< the query head [d] */
    double *qp;     /**< the same in chunk-lane order [d] */
    double *tail;   /**< a row's terms after its last full node [d] */
    double *sums;   /**< a chunk's scores before their fp32 rounding [ATTN_SPARSE_CHUNK] */
    float *scores;  /**< a chunk's scores [ATTN_SPARSE_CHUNK] */
} head_scratch;

/** One head: q [d] bf16 -> out [d] bf16. */
static void attend_one_head(moe_dot_isa isa, const uint16_t *q, int d, const uint16_t *const *kv_rows, int64_t n,
                            float sink, float scale, const head_scratch *w, uint16_t *out)
{
    float *acc = w->acc, *scores = w->scores;
    for (int c = 0; c < d; c++)
        w->qd[c] = (double)fmt_bf16_to_f32(q[c]);
    attn_dot_chunk_x(w->qd, d, w->qp);
    float m = -INFINITY, den = 0.0f;
    for (int c = 0; c < d; c++)
        acc[c] = 0.0f;
    for (int64_t c0 = 0; c0 < n; c0 += ATTN_SPARSE_CHUNK) {
        const int cn = (int)((n - c0) < ATTN_SPARSE_CHUNK ? (n - c0) : ATTN_SPARSE_CHUNK);
        attn_dot_rows_bf16(isa, w->qd, w->qp, d, kv_rows + c0, cn, w->tail, w->sums);
        float chunk_max = -INFINITY;
        for (int i = 0; i < cn; i++) {
            scores[i] = (float)w->sums[i] * scale;
            if (scores[i] > chunk_max)
                chunk_max = scores[i];
        }
        const float m_new = chunk_max > m ? chunk_max : m;
        if (m_new == -INFINITY)
            continue; /* nothing finite yet */
        const float alpha = expf(m - m_new); /* exp(-inf) = 0 on the first chunk */
        den *= alpha;
        scale_acc(isa, acc, d, alpha);
        for (int i = 0; i < cn; i++) {
            const float p = expf(scores[i] - m_new);
            den += p;
            add_weighted_row(isa, acc, kv_rows[c0 + i], d, mmoe_bf16_round(p));
        }
        m = m_new;
    }
    den += expf(sink - m);
    for (int c = 0; c < d; c++)
        out[c] = mmoe_bf16_from_f32(acc[c] / den);
}

/** One call's operands, shared by the threads that take its heads (attn_sparse_attention_isa()). */
typedef struct {
    moe_dot_isa isa;                /**< the kernels */
    const uint16_t *q;              /**< [n_heads, d] */
    int d;                          /**< head width */
    const uint16_t *const *kv_rows; /**< the list */
    int64_t n;                      /**< its length */
    const float *sink;              /**< [n_heads] */
    float scale;                    /**< softmax scale */
    float *acc;                     /**< per thread: ATTN_SPARSE_SCRATCH_FLOATS(d) */
    float *scores;                  /**< per thread: [ATTN_SPARSE_CHUNK] */
    uint16_t *out;                  /**< [n_heads, d] */
} sparse_job;

/** moe_rows_fn of attn_sparse_attention_isa(): heads [h0, h1) with thread @p thread's buffers. */
static void sparse_heads(void *ctx, int thread, int64_t h0, int64_t h1)
{
    const sparse_job *j = ctx;
    const int64_t d = j->d, even = 2 * ((d + 1) / 2);
    float *base = j->acc + (size_t)thread * (size_t)ATTN_SPARSE_SCRATCH_FLOATS(d);
    double *dbl = (double *)(void *)(base + even);
    const head_scratch w = {base, dbl, dbl + d, dbl + 2 * d, dbl + 3 * d,
                            j->scores + (size_t)thread * ATTN_SPARSE_CHUNK};
    for (int64_t h = h0; h < h1; h++)
        attend_one_head(j->isa, j->q + (size_t)h * (size_t)d, j->d, j->kv_rows, j->n, j->sink[h], j->scale, &w,
                        j->out + (size_t)h * (size_t)d);
}

void attn_sparse_attention_isa(moe_dequant_pool *pool, moe_dot_isa isa, const uint16_t *q, int n_heads, int d,
                               const uint16_t *const *kv_rows, int64_t n, const float *sink, float scale,
                               float *acc, float *scores, uint16_t *out)
{
    sparse_job j = {isa, q, d, kv_rows, n, sink, scale, acc, scores, out};
    moe_pool_rows(pool, n_heads, 2 * n * d, 1, sparse_heads, &j);
}

void attn_sparse_attention_pool(moe_dequant_pool *pool, const uint16_t *q, int n_heads, int d,
                                const uint16_t *const *kv_rows, int64_t n, const float *sink, float scale,
                                float *acc, float *scores, uint16_t *out)
{
    attn_sparse_attention_isa(pool, moe_dot_isa_best(), q, n_heads, d, kv_rows, n, sink, scale, acc, scores, out);
}

void attn_sparse_attention(const uint16_t *q, int n_heads, int d, const uint16_t *const *kv_rows,
                           int64_t n, const float *sink, float scale, float *acc, float *scores,
                           uint16_t *out)
{
    attn_sparse_attention_pool(NULL, q, n_heads, d, kv_rows, n, sink, scale, acc, scores, out);
}
