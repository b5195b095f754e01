/**
 * @file attn_compressor.c
 * @brief The KV compressor: gated softmax pooling of r-token blocks into one vector (@ref spec_arch_compressor).
 *
 * Compressed layers keep, besides the sliding window, one vector per block of r
 * tokens (r = 4 for CSA, 128 for HCA); the indexer of a CSA layer has its own,
 * narrower compressor.  For every token t the compressor projects the attention
 * input to a value kv_t and a gate g_t (fp32 matmuls, width c*dh) and adds the
 * learned position-in-block embedding ape[t mod r] to the gate.  When the block's
 * last token arrives, the block is pooled channel by channel:
 *
 *     comp[ch] = sum_t softmax_t(g_t[ch]) * kv_t[ch]
 *
 * - r = 128 (c = 1): the softmax runs over the block's 128 tokens.
 * - r = 4, "overlap" (c = 2): the kv/gate vectors are twice as wide; the softmax runs
 *   over 8 candidates: the *previous* block's 4 tokens with channels [0, dh) and the
 *   current block's 4 tokens with channels [dh, 2dh).  Consecutive compressed vectors
 *   thus see overlapping 8-token windows.  Before block 0 the previous half is
 *   kv = 0, gate = -inf, i.e. absent.
 *
 * **State.**  kv_state / score_state are fp32 [c*r, c*dh]: a token at position pos
 * is stored in slot (c-1)*r + pos mod r with all c*dh channels; for overlap the
 * slots [r, 2r) (current block) move to [0, r) when a block completes.  This is the
 * reference's decode state; the oracle uses it for prefill too, so both paths pool
 * exactly the same fp32 numbers in the same order.
 *
 * **Pooling arithmetic** (fp32, slot order): m = max_t g_t; e_t = exp(g_t - m);
 * den = sum e_t; comp = sum (e_t / den) * kv_t.  Empty slots (-inf gates) give e = 0.
 *
 * **Finishing** (attn_compressor_finish): comp -> bf16 -> RMSNorm(norm) -> RoPE of the
 * last rope_dim dims at the block's first position j*r (with the layer's YaRN table)
 * -> attention compressor: FP8 round trip of the nope dims (block 64); indexer
 * compressor: Hadamard rotation of all dh dims, then FP4 round trip (block 32).
 */
#include "attn_internal.h"

#include <math.h>
#include <string.h>

#include "mmoe_formats.h"

void attn_compressor_reset(attn_compressor_state *st)
{
    const size_t n = (size_t)(st->overlap * st->ratio) * (size_t)(st->overlap * st->dh);
    for (size_t i = 0; i < n; i++) {
        st->kv_state[i] = 0.0f;
        st->score_state[i] = -INFINITY;
    }
}

/** Pool channel @p ch over the @p n (slot, channel) candidates listed. */
static float pool_channel(const float *kv, const float *score, int width, const int *slots,
                          const int *chans, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++) {
        const float g = score[slots[i] * width + chans[i]];
        if (g > m)
            m = g;
    }
    if (m == -INFINITY)
        return 0.0f;
    float den = 0.0f;
    for (int i = 0; i < n; i++)
        den += expf(score[slots[i] * width + chans[i]] - m);
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        const float p = expf(score[slots[i] * width + chans[i]] - m) / den;
        acc += p * kv[slots[i] * width + chans[i]];
    }
    return acc;
}

int attn_compressor_push(attn_compressor_state *st, int64_t pos, const float *kv, const float *gate,
                         const float *ape, float *pooled)
{
    const int r = st->ratio, c = st->overlap, dh = st->dh, width = c * dh;
    const int in_block = (int)(pos % r);
    const int slot = (c - 1) * r + in_block;
    const float *ape_row = ape + (size_t)in_block * (size_t)width;
    for (int ch = 0; ch < width; ch++) {
        st->kv_state[(size_t)slot * width + ch] = kv[ch];
        st->score_state[(size_t)slot * width + ch] = gate[ch] + ape_row[ch];
    }
    if (in_block != r - 1)
        return 0;

    int slots[256], chans[256];
    for (int ch = 0; ch < dh; ch++) {
        int n = 0;
        if (c == 2) {
            for (int t = 0; t < r; t++) { /* previous block, first half of the channels */
                slots[n] = t;
                chans[n++] = ch;
            }
            for (int t = 0; t < r; t++) { /* current block, second half */
                slots[n] = r + t;
                chans[n++] = dh + ch;
            }
        } else {
            for (int t = 0; t < r; t++) {
                slots[n] = t;
                chans[n++] = ch;
            }
        }
        pooled[ch] = pool_channel(st->kv_state, st->score_state, width, slots, chans, n);
    }
    if (c == 2) {
        const size_t half = (size_t)r * (size_t)width;
        memcpy(st->kv_state, st->kv_state + half, sizeof(float) * half);
        memcpy(st->score_state, st->score_state + half, sizeof(float) * half);
    }
    return 1;
}

void attn_compressor_finish(const float *pooled, int dh, const mmoe_tensor *norm, float eps,
                            int rope_dim, const float *freqs, int64_t block_pos,
                            attn_compressor_kind kind, uint16_t *out)
{
    float cos_v[ATTN_MAX_ROPE_DIM / 2], sin_v[ATTN_MAX_ROPE_DIM / 2];
    mmoe_bf16_from_f32_row(pooled, (size_t)dh, out);
    mmoe_rmsnorm_bf16(out, 1, dh, norm, eps, out);
    attn_rope_cos_sin(freqs, rope_dim / 2, block_pos, cos_v, sin_v);
    attn_rope_rotate_bf16(out + dh - rope_dim, rope_dim, cos_v, sin_v, 0);
    if (kind == ATTN_COMPRESSOR_KV) {
        mmoe_roundtrip_fp8_bf16(out, dh - rope_dim, 64);
    } else {
        attn_hadamard_bf16(out, dh);
        mmoe_roundtrip_fp4_bf16(out, dh, 32);
    }
}
