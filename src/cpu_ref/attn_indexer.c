/**
 * @file attn_indexer.c
 * @brief The lightning indexer of CSA layers: which compressed 4-token blocks a query attends to (@ref spec_arch_indexer).
 *
 * A CSA layer compresses every 4 tokens into one kv vector but attends only to the
 * index_topk (512 or 1024) most relevant ones.  Relevance comes from a cheap
 * multi-head scorer with its own small queries and keys:
 *
 *     qi[h]  = FP4(Hadamard(RoPE(wq_b_idx(qr))[h]))      bf16, index_n_heads x 128
 *     K[j]   = FP4(Hadamard(RoPE(norm(pool_j))))           bf16, one per block (indexer compressor)
 *     w[h]   = bf16(bf16(weights_proj(x)[h]) * (128 * 64)^-0.5)
 *     score[j] = sum_h relu(qi[h] . K[j]) * w[h]
 *
 * The reference evaluates the score with bf16 tensor operations, so every step is
 * rounded: the dot product qi[h].K[j] (fp32 accumulation, here exact-product double
 * accumulation in the order of @ref spec_arch_sum_order, rounded to fp32) is rounded to bf16; relu; the product with w[h] is
 * rounded to bf16; the sum over heads (fp32 accumulation, here double then fp32) is
 * rounded to bf16.  Only blocks complete at the query's position are candidates
 * (j < (p+1)/4; the block completed by this very token included).
 *
 * The dot products of a pass of 64 keys are computed head by head, each head's query against
 * the 64 rows through attn_dot_rows_bf16() (the chunk-lane kernel under AVX2: the bits of
 * attn_dot_bf16()), then added into the keys' sums in the heads' order.
 *
 * **Top-k.**  The count is min(index_topk, number of causal blocks); the result is
 * in descending score order.  bf16 scores tie often (all ReLU terms zero, equal
 * sums), and the reference's CUDA top-k keeps the tied candidate with the lowest
 * block index first, like a stable descending sort; attn_topk_desc() implements
 * exactly that order, so the selected set *and* its order are defined.
 */
#include "attn_internal.h"

#include <math.h>
#include <stdlib.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** Key rows whose dot products a pass computes for every head before the heads' sums. */
#define INDEX_PASS_BLOCKS 64

void attn_indexer_scores_isa(moe_dot_isa isa, const uint16_t *qi, const uint16_t *w, const uint16_t *keys,
                             int n_heads, int head_dim, int64_t n_blocks, float *scores)
{
    double qd[ATTN_INDEX_MAX_HEAD_DIM], qp[ATTN_INDEX_MAX_HEAD_DIM], tail[ATTN_INDEX_MAX_HEAD_DIM];
    double dots[INDEX_PASS_BLOCKS], head_sum[INDEX_PASS_BLOCKS];
    const uint16_t *rows[INDEX_PASS_BLOCKS];
    for (int64_t j0 = 0; j0 < n_blocks; j0 += INDEX_PASS_BLOCKS) {
        const int64_t nb = n_blocks - j0 < INDEX_PASS_BLOCKS ? n_blocks - j0 : INDEX_PASS_BLOCKS;
        for (int64_t i = 0; i < nb; i++) {
            rows[i] = keys + (j0 + i) * head_dim;
            head_sum[i] = 0.0;
        }
        for (int h = 0; h < n_heads; h++) { /* per block, the heads in ascending order */
            const uint16_t *q = qi + (size_t)h * (size_t)head_dim;
            for (int c = 0; c < head_dim; c++)
                qd[c] = (double)fmt_bf16_to_f32(q[c]);
            attn_dot_chunk_x(qd, head_dim, qp);
            attn_dot_rows_bf16(isa, qd, qp, head_dim, rows, nb, tail, dots);
            const float wh = fmt_bf16_to_f32(w[h]);
            for (int64_t i = 0; i < nb; i++) {
                float s = mmoe_bf16_round((float)dots[i]);
                if (s < 0.0f)
                    s = 0.0f;
                head_sum[i] += (double)mmoe_bf16_round(s * wh);
            }
        }
        for (int64_t i = 0; i < nb; i++)
            scores[j0 + i] = mmoe_bf16_round((float)head_sum[i]);
    }
}

void attn_indexer_scores(const uint16_t *qi, const uint16_t *w, const uint16_t *keys, int n_heads,
                         int head_dim, int64_t n_blocks, float *scores)
{
    attn_indexer_scores_isa(moe_dot_isa_best(), qi, w, keys, n_heads, head_dim, n_blocks, scores);
}

/** Descending score; NaN last; equal scores: lower index first. */
static int cmp_scored_desc(const void *pa, const void *pb)
{
    const attn_scored *a = pa, *b = pb;
    const int a_nan = isnan(a->score), b_nan = isnan(b->score);
    if (a_nan != b_nan)
        return a_nan - b_nan;
    if (!a_nan && a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

int64_t attn_topk_desc(const float *scores, int64_t n, int64_t k, attn_scored *work, int64_t *idx_out)
{
    if (k > n)
        k = n;
    if (k <= 0)
        return 0;
    for (int64_t i = 0; i < n; i++) {
        work[i].score = scores[i];
        work[i].index = i;
    }
    qsort(work, (size_t)n, sizeof(attn_scored), cmp_scored_desc);
    for (int64_t i = 0; i < k; i++)
        idx_out[i] = work[i].index;
    return k;
}
