/**
 * @file model_head.c
 * @brief The head (spec 3.7): stream mix, final RMSNorm, fp32 logits.
 *
 * `y = norm(hc_head(X))` is bf16 [T, D]; the logits are `fp32(y) @ fp32(head)^T`.
 * The reference runs this as one fp32 GEMM.  Here each logit is a dot product of
 * D exact products (bf16 x bf16 has at most 16 significant bits, exact in double)
 * summed in double in ascending channel order and rounded once to fp32: at least
 * as accurate as any fp32 order, and the same bits for a row alone or in a batch
 * (prefill = decode).
 */
#include "mmoe_formats.h"
#include "mmoe_linear.h"
#include "model_internal.h"

void mmoe_model_head_logits(const mmoe_model *m, const model_head *h, const uint16_t *X, int64_t T,
                            float *logits, uint16_t *work)
{
    const int64_t D = m->cfg.dim, V = m->cfg.vocab_size;
    const uint16_t *W = m->head_w.data;
    mmoe_hc_head(&m->hcp, X, T, h->hc.fn, h->hc.base, h->hc.scale, work);
    mmoe_rmsnorm_bf16(work, T, D, &h->norm, (float)m->cfg.norm_eps, work);
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *yt = work + t * D;
        for (int64_t v = 0; v < V; v++) {
            const uint16_t *wr = W + v * D;
            double acc = 0.0;
            for (int64_t c = 0; c < D; c++)
                acc += (double)mmoe_bf16_to_f32(yt[c]) * (double)mmoe_bf16_to_f32(wr[c]);
            logits[t * V + v] = (float)acc;
        }
    }
}
