/**
 * @file model_head.c
 * @brief The head (@ref spec_arch_head): stream mix, final RMSNorm, fp32 logits.
 *
 * `y = norm(hc_head(X))` is bf16 [T, D]; the logits are `fp32(y) @ fp32(head)^T`.
 * The reference runs this as one fp32 GEMM.  Here it is the dense linear of the attention
 * oracle (attn_linear_dense(), its rows shared out over the model's worker threads): each logit is a dot product of D exact products (bf16 x bf16 has
 * at most 16 significant bits, exact in double) summed in double in a fixed order and
 * rounded once to fp32: at least as accurate as any fp32 order, and the same bits for
 * a row alone or in a batch (prefill = decode).
 */
#include "attn_internal.h"
#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "model_internal.h"

mmoe_status mmoe_model_head_logits(const mmoe_model *m, const model_head *h, const uint16_t *X, int64_t T,
                                   float *logits, uint16_t *work, mmoe_error *err)
{
    const int64_t D = m->cfg.dim, V = m->cfg.vocab_size;
    mmoe_hc_head(&m->hcp, X, T, h->hc.fn, h->hc.base, h->hc.scale, work);
    mmoe_rmsnorm_bf16(work, T, D, &h->norm, (float)m->cfg.norm_eps, work);
    /* the bf16 head as a dense linear: exact products, fixed-order double sum, one fp32 rounding */
    return attn_linear_dense(m->moe_pool, work, T, D, &m->head_w, V, logits, NULL, err);
}
