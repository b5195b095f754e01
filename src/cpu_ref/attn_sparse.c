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
 */
#include "attn_internal.h"

#include <math.h>

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
            c += (double)mmoe_bf16_to_f32(a[i]) * (double)mmoe_bf16_to_f32(b[i]);
        mmoe_pairwise_push(&pw, c);
    }
    return mmoe_pairwise_result(&pw);
}

/** One head: q [d] bf16 -> out [d] bf16. */
static void attend_one_head(const uint16_t *q, int d, const uint16_t *const *kv_rows, int64_t n,
                            float sink, float scale, float *acc, float *scores, uint16_t *out)
{
    float m = -INFINITY, den = 0.0f;
    for (int c = 0; c < d; c++)
        acc[c] = 0.0f;
    for (int64_t c0 = 0; c0 < n; c0 += ATTN_SPARSE_CHUNK) {
        const int cn = (int)((n - c0) < ATTN_SPARSE_CHUNK ? (n - c0) : ATTN_SPARSE_CHUNK);
        float chunk_max = -INFINITY;
        for (int i = 0; i < cn; i++) {
            const uint16_t *kv = kv_rows[c0 + i];
            scores[i] = (float)attn_dot_bf16(q, kv, d) * scale;
            if (scores[i] > chunk_max)
                chunk_max = scores[i];
        }
        const float m_new = chunk_max > m ? chunk_max : m;
        if (m_new == -INFINITY)
            continue; /* nothing finite yet */
        const float alpha = expf(m - m_new); /* exp(-inf) = 0 on the first chunk */
        den *= alpha;
        for (int c = 0; c < d; c++)
            acc[c] *= alpha;
        for (int i = 0; i < cn; i++) {
            const float p = expf(scores[i] - m_new);
            den += p;
            const float p_bf16 = mmoe_bf16_round(p);
            const uint16_t *kv = kv_rows[c0 + i];
            for (int c = 0; c < d; c++)
                acc[c] += p_bf16 * mmoe_bf16_to_f32(kv[c]);
        }
        m = m_new;
    }
    den += expf(sink - m);
    for (int c = 0; c < d; c++)
        out[c] = mmoe_bf16_from_f32(acc[c] / den);
}

/** One call's operands, shared by the threads that take its heads (attn_sparse_attention_pool()). */
typedef struct {
    const uint16_t *q;              /**< [n_heads, d] */
    int d;                          /**< head width */
    const uint16_t *const *kv_rows; /**< the list */
    int64_t n;                      /**< its length */
    const float *sink;              /**< [n_heads] */
    float scale;                    /**< softmax scale */
    float *acc;                     /**< per thread: [d] */
    float *scores;                  /**< per thread: [ATTN_SPARSE_CHUNK] */
    uint16_t *out;                  /**< [n_heads, d] */
} sparse_job;

/** moe_rows_fn of attn_sparse_attention_pool(): heads [h0, h1) with thread @p thread's buffers. */
static void sparse_heads(void *ctx, int thread, int64_t h0, int64_t h1)
{
    const sparse_job *j = ctx;
    for (int64_t h = h0; h < h1; h++)
        attend_one_head(j->q + (size_t)h * (size_t)j->d, j->d, j->kv_rows, j->n, j->sink[h], j->scale,
                        j->acc + (size_t)thread * (size_t)j->d, j->scores + (size_t)thread * ATTN_SPARSE_CHUNK,
                        j->out + (size_t)h * (size_t)j->d);
}

void attn_sparse_attention_pool(moe_dequant_pool *pool, const uint16_t *q, int n_heads, int d,
                                const uint16_t *const *kv_rows, int64_t n, const float *sink, float scale,
                                float *acc, float *scores, uint16_t *out)
{
    sparse_job j = {q, d, kv_rows, n, sink, scale, acc, scores, out};
    moe_pool_rows(pool, n_heads, 2 * n * d, 1, sparse_heads, &j);
}

void attn_sparse_attention(const uint16_t *q, int n_heads, int d, const uint16_t *const *kv_rows,
                           int64_t n, const float *sink, float scale, float *acc, float *scores,
                           uint16_t *out)
{
    attn_sparse_attention_pool(NULL, q, n_heads, d, kv_rows, n, sink, scale, acc, scores, out);
}
