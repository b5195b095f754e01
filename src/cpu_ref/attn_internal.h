/**
 * @file attn_internal.h
 * @brief The building blocks of the attention sub-layer, one per source file, exposed to the tests.
 *
 * mmoe_attention_forward() (attn_forward.c) is assembled from these blocks:
 *
 * | file              | block                                                                 |
 * |-------------------|-----------------------------------------------------------------------|
 * | attn_rope.c       | RoPE frequency tables with and without YaRN; rotation and its inverse  |
 * | attn_hadamard.c   | the Sylvester-ordered Walsh-Hadamard rotation of the indexer           |
 * | attn_compressor.c | the gated pooling of 4- or 128-token blocks (overlapping for ratio 4)  |
 * | attn_indexer.c    | the lightning indexer's block scores and their top-k selection         |
 * | attn_sparse.c     | attention over an index list with an online softmax and a sink         |
 * | attn_out_proj.c   | the grouped low-rank output projection (wo_a einsum, wo_b)             |
 * | attn_cache.c      | the per-sequence KV cache and scratch memory                          |
 * | attn_params.c     | hyper-parameters, weight binding and validation                       |
 *
 * Activations are bf16 bit patterns (uint16_t) unless a name says f32.
 */
#ifndef MMOE_ATTN_INTERNAL_H
#define MMOE_ATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_attention.h"
#include "mmoe_linear.h"
#include "moe_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ attn_rope.c */

/** Largest supported rope_dim (so that tables fit on the stack). */
#define ATTN_MAX_ROPE_DIM 256

/**
 * The rope_dim/2 rotation frequencies, in fp32 as the reference builds them:
 * f_i = 1 / fp32(base^(fp32(2i)/rope_dim)); with @p yarn, blended towards f_i/factor
 * by the YaRN ramp between the correction dims of beta_fast and beta_slow.
 */
void attn_rope_freqs(int rope_dim, double base, int yarn, double factor, int64_t original_seq_len,
                     double beta_fast, double beta_slow, float *freqs);

/** The frequencies of a layer: base rope_theta without YaRN if ratio 0, else compress_rope_theta with YaRN. */
void attn_rope_freqs_for_layer(const mmoe_attn_params *p, float *freqs);

/** cos/sin of the fp32 angle fp32(pos) * freqs[i], for i < half. */
void attn_rope_cos_sin(const float *freqs, int half, int64_t pos, float *cos_out, float *sin_out);

/**
 * Rotate the interleaved pairs (x[2i], x[2i+1]) of @p x (bf16, rope_dim values) by the
 * angle whose cos/sin are given: in fp32, result rounded to bf16.  @p inverse rotates by
 * the conjugate (the inverse RoPE on the attention output).
 */
void attn_rope_rotate_bf16(uint16_t *x, int rope_dim, const float *cos_v, const float *sin_v,
                           int inverse);

/* ------------------------------------------------------------------ attn_hadamard.c */

/**
 * In-place x <- bf16(H_n x / sqrt(n)) with H_n the Sylvester Hadamard matrix
 * (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]), fp32 butterflies; n a power of two.
 */
void attn_hadamard_bf16(uint16_t *x, int n);

/* ------------------------------------------------------------------ attn_compressor.c */

/** What a compressor's finished block goes through after its norm and RoPE. */
typedef enum attn_compressor_kind {
    ATTN_COMPRESSOR_KV = 0,      /**< attention compressor: FP8 round trip of the nope dims, block 64 */
    ATTN_COMPRESSOR_INDEXER = 1  /**< indexer compressor: Hadamard rotation, FP4 round trip block 32 */
} attn_compressor_kind;

/** The running state of one compressor (the reference's kv_state / score_state). */
typedef struct attn_compressor_state {
    int ratio;          /**< r: tokens per block (4 or 128) */
    int overlap;        /**< c: 2 when r == 4 (overlapping windows), else 1 */
    int dh;             /**< width of one compressed vector */
    float *kv_state;    /**< fp32 [c*r, c*dh]: projected kv of the buffered tokens */
    float *score_state; /**< fp32 [c*r, c*dh]: gates + ape of the buffered tokens (-inf = empty) */
} attn_compressor_state;

/** Fill the state for a new sequence: kv = 0, score = -inf. */
void attn_compressor_reset(attn_compressor_state *st);

/**
 * Buffer the token at absolute position @p pos: its projected kv and gate (fp32 [c*dh]);
 * ape[pos % r] ([c*dh], fp32) is added to the gate.  If the token completes a block
 * ((pos+1) % r == 0), pool the block into @p pooled (fp32 [dh]) and return 1, else 0.
 * Pooling: per channel, softmax over the block's (c*r) gates, weighted sum of the kv;
 * for ratio 4 the candidates are the previous block's tokens (channels [0, dh)) and the
 * current block's (channels [dh, 2dh)).  Sums run in fp32 in slot order.
 */
int attn_compressor_push(attn_compressor_state *st, int64_t pos, const float *kv, const float *gate,
                         const float *ape, float *pooled);

/**
 * Finish a pooled block: bf16, RMSNorm with @p norm, RoPE of the last @p rope_dim dims at
 * position @p block_pos (= j*r) with the layer's @p freqs, then the QAT step of @p kind.
 * @param pooled     fp32 [dh] from attn_compressor_push()
 * @param dh         width of the compressed vector
 * @param norm       the compressor's norm weight [dh]
 * @param eps        RMSNorm epsilon
 * @param rope_dim   rotary dims at the end of the vector
 * @param freqs      the layer's rope_dim/2 frequencies
 * @param block_pos  position of the block's first token
 * @param kind       attention (FP8) or indexer (Hadamard + FP4) compressor
 * @param out        bf16 [dh]
 */
void attn_compressor_finish(const float *pooled, int dh, const mmoe_tensor *norm, float eps,
                            int rope_dim, const float *freqs, int64_t block_pos,
                            attn_compressor_kind kind, uint16_t *out);

/* ------------------------------------------------------------------ attn_indexer.c */

/**
 * Index scores of one query over @p n_blocks cached keys:
 * score[j] = bf16(sum_h bf16(relu(bf16(qi[h] . K[j])) * w[h])).
 * @param qi        bf16 [n_heads, head_dim] (rotated, Hadamard, FP4 round trip)
 * @param w         bf16 [n_heads] (weights_proj output, scaled)
 * @param keys      bf16 [n_blocks, head_dim]
 * @param n_heads   indexer heads
 * @param head_dim  indexer head width
 * @param n_blocks  candidate blocks (the causal ones)
 * @param scores    [n_blocks], bf16 values as fp32
 */
void attn_indexer_scores(const uint16_t *qi, const uint16_t *w, const uint16_t *keys, int n_heads,
                         int head_dim, int64_t n_blocks, float *scores);

/** Widest indexer head (index_head_dim) a layer may have: attn_params.c refuses wider ones. */
#define ATTN_INDEX_MAX_HEAD_DIM 1024

/**
 * attn_indexer_scores() with the kernels of @p isa (which must run here); the scores do not
 * depend on them.  attn_indexer_scores() takes moe_dot_isa_best().  @p head_dim at most
 * ::ATTN_INDEX_MAX_HEAD_DIM.
 */
void attn_indexer_scores_isa(moe_dot_isa isa, const uint16_t *qi, const uint16_t *w, const uint16_t *keys,
                             int n_heads, int head_dim, int64_t n_blocks, float *scores);

/** A candidate of the top-k selection (work space of attn_topk_desc()). */
typedef struct attn_scored {
    float score;    /**< the index score (bf16 value) */
    int64_t index;  /**< the compressed block */
} attn_scored;

/**
 * The @p k best of @p n scores, best first; equal scores keep the lower index first (a
 * stable descending sort), NaN ranks last.  @p work is scratch of @p n entries.
 * @return the number written to @p idx_out (min(k, n))
 */
int64_t attn_topk_desc(const float *scores, int64_t n, int64_t k, attn_scored *work, int64_t *idx_out);

/* ------------------------------------------------------------------ attn_sparse.c */

/** Entries of the index list processed per online-softmax step (the reference kernel's chunk). */
#define ATTN_SPARSE_CHUNK 64

/**
 * Floats of one thread's scratch @p acc of attn_sparse_attention() at head width @p d: the fp32
 * accumulators [d] (rounded up to an even count), then in double the query head [d], the same in
 * chunk-lane order [d], a row's terms after its last full node [d] and a chunk's scores
 * [::ATTN_SPARSE_CHUNK].
 */
#define ATTN_SPARSE_SCRATCH_FLOATS(d) \
    (2 * (((int64_t)(d) + 1) / 2) + 2 * (3 * (int64_t)(d) + ATTN_SPARSE_CHUNK))

/**
 * Attention of one query token over a list of kv rows, with an attention sink.
 * For each head h: s_t = fp32(q_h . kv_t) * scale; online softmax over chunks of 64 entries
 * (running max over the real scores), P rounded to bf16 for P.V, fp32 denominator; after the
 * last chunk the denominator gains exp(sink[h] - max).  o_h = bf16(acc / denom).
 * @param q        bf16 [n_heads, d]
 * @param n_heads  query heads
 * @param d        head width
 * @param kv_rows  @p n pointers to bf16 rows of d values (K = V), in list order
 * @param n        list length
 * @param sink     fp32 [n_heads]
 * @param scale    softmax scale applied to each dot product (d^-0.5)
 * @param acc      scratch of ATTN_SPARSE_SCRATCH_FLOATS(d) floats, 8-byte aligned
 * @param scores   fp32 scratch [ATTN_SPARSE_CHUNK]
 * @param out      bf16 [n_heads, d]
 */
void attn_sparse_attention(const uint16_t *q, int n_heads, int d, const uint16_t *const *kv_rows,
                           int64_t n, const float *sink, float scale, float *acc, float *scores,
                           uint16_t *out);

/**
 * attn_sparse_attention() with the heads shared out over @p pool's threads (NULL: the caller
 * alone); @p acc and @p scores hold one buffer per thread (moe_dequant_pool_threads(pool) of
 * ATTN_SPARSE_SCRATCH_FLOATS(d) and of [ATTN_SPARSE_CHUNK] floats).  A head's output does not
 * depend on the thread.
 */
void attn_sparse_attention_pool(moe_dequant_pool *pool, const uint16_t *q, int n_heads, int d,
                                const uint16_t *const *kv_rows, int64_t n, const float *sink, float scale,
                                float *acc, float *scores, uint16_t *out);

/**
 * attn_sparse_attention_pool() with the kernels of @p isa (which must run here:
 * moe_dot_isa_runs_here()); the output does not depend on them.  The other two take
 * moe_dot_isa_best().
 */
void attn_sparse_attention_isa(moe_dequant_pool *pool, moe_dot_isa isa, const uint16_t *q, int n_heads, int d,
                               const uint16_t *const *kv_rows, int64_t n, const float *sink, float scale,
                               float *acc, float *scores, uint16_t *out);

/* ------------------------------------------------------------------ attn_out_proj.c */

/**
 * The grouped low-rank output projection: z[t, g*o_lora + r] = bf16(sum_c o[t, g, c] *
 * wo_a[g*o_lora + r, c]) with o[t] viewed as [G, H*d/G]; out = wo_b(z).
 * @param pool the threads the projections share their rows with (NULL: the caller alone)
 * @param p    the layer's parameters
 * @param w    the layer's weights (wo_a BF16 or F8 + scale, wo_b FP8)
 * @param o    bf16 [T, H*d]
 * @param T    rows
 * @param z    bf16 [T, G*o_lora], written (the latents)
 * @param out  bf16 [T, D], written
 * @param err  error message, or NULL
 */
mmoe_status attn_out_proj(moe_dequant_pool *pool, const mmoe_attn_params *p, const mmoe_attn_weights *w,
                          const uint16_t *o, int64_t T, uint16_t *z, uint16_t *out, mmoe_error *err);

/* ------------------------------------------------------------------ attn_cache.c */

/** The per-sequence state of one attention layer (see mmoe_attention.h). */
struct mmoe_attn_cache {
    mmoe_attn_params p;            /**< the layer's parameters (copied at creation) */
    int64_t max_seq_len;           /**< positions 0 .. max_seq_len-1 may be processed */
    int64_t next_pos;              /**< tokens consumed so far */
    int64_t max_blocks;            /**< max_seq_len / ratio (0 for ratio 0) */
    uint16_t *window_kv;           /**< bf16 [window, head_dim]: raw kv of position q in slot q % window */
    uint16_t *comp_kv;             /**< bf16 [max_blocks, head_dim]: compressed block j in row j */
    attn_compressor_state comp;    /**< the attention compressor (ratio > 0) */
    uint16_t *idx_keys;            /**< bf16 [max_blocks, index_head_dim]: indexer keys (ratio 4) */
    attn_compressor_state idx_comp;/**< the indexer's compressor (ratio 4) */
    size_t bytes;                  /**< bytes allocated */
};

/** Working memory: one growable buffer carved into pieces per call. */
struct mmoe_attn_scratch {
    unsigned char *buf;     /**< the buffer (64-byte aligned pieces) */
    size_t cap;             /**< its size in bytes */
    size_t used;            /**< bytes handed out since the last attn_scratch_begin() */
    moe_dequant_pool *pool; /**< the threads the linears share their rows with (borrowed; NULL: none) */
};

/** Make @p s hold at least @p bytes and forget earlier pieces.  Returns 0 on success. */
int attn_scratch_begin(mmoe_attn_scratch *s, size_t bytes);

/** The next 64-byte aligned piece of @p bytes (within what attn_scratch_begin() reserved). */
void *attn_scratch_take(mmoe_attn_scratch *s, size_t bytes);

/** Size that attn_scratch_take() consumes for a piece of @p bytes. */
size_t attn_scratch_piece(size_t bytes);

/* ------------------------------------------------------------------ linear_dense.c */

/**
 * y[t*ldy + n] = fp32(sum_k x[t*ldx + k] * W[row0 + n, k]) for t < T, n < N, the sum in
 * double in a fixed order.  W is BF16 or F32 [*, K], or F8_E4M3 with E8M0 or F32 @p scale
 * (block edge @p block), whose values are dequantized exactly and rounded to bf16 as
 * convert.py does for wo_a.  The weight rows are shared out over @p pool's threads (NULL: the
 * caller alone); the bits do not depend on it.
 * @return MMOE_OK, MMOE_ENOMEM, MMOE_EDTYPE (weight or scale dtype), MMOE_ENOTFOUND (an F8 weight
 *         without a scale) or MMOE_ERANGE (an F8 block edge below 1)
 */
mmoe_status attn_dense_rows(moe_dequant_pool *pool, const double *x, int64_t T, int64_t ldx, int64_t K,
                            const mmoe_tensor *w, const mmoe_tensor *scale, int block, int64_t row0, int64_t N,
                            float *y, int64_t ldy, mmoe_error *err);

/**
 * The double sums that attn_dense_rows() rounds to fp32 (y[t*ldy + n], the fixed order), with
 * the kernel of @p isa (which must run here: moe_dot_isa_runs_here()); the result depends
 * neither on it nor on @p pool.  attn_dense_rows() takes moe_dot_isa_best().
 */
mmoe_status attn_dense_sums(moe_dequant_pool *pool, moe_dot_isa isa, const double *x, int64_t T, int64_t ldx,
                            int64_t K, const mmoe_tensor *w, const mmoe_tensor *scale, int block, int64_t row0,
                            int64_t N, double *y, int64_t ldy, mmoe_error *err);

/**
 * x permuted for attn_dot_rows_bf16()'s chunk-lane kernel: xp[n + 4 i + q] = x[n + 16 q + i] over
 * the full nodes of 64 terms (n < K - K mod 64); the terms after them are not written.
 */
void attn_dot_chunk_x(const double *x, int64_t K, double *xp);

/**
 * out[r] = the sum of x[k] * rows[r][k] over k < K for the @p n BF16 rows at rows[0 .. n-1], in
 * double in the fixed order of attn_dense_sums() (and of attn_dot_bf16(): the bits of either for
 * the same operands), with the kernel of @p isa (which must run here: moe_dot_isa_runs_here()):
 * the attention's scores of one query head.  @p x: K doubles (the products must be exact in
 * double: bf16 or fp32 values); @p xp: x through attn_dot_chunk_x() (read under AVX2 and
 * AVX-512 only); @p tmp: K doubles of scratch.
 */
void attn_dot_rows_bf16(moe_dot_isa isa, const double *x, const double *xp, int64_t K, const uint16_t *const *rows,
                        int64_t n, double *tmp, double *out);

/**
 * out[r] = the sum of rows[r * ldr + k] * x[k] over k < K for @p n F32 rows and one BF16 x, in
 * double in the fixed order of attn_dense_sums() (mHC's logits: the rows of fn against a token's
 * streams), with the kernel of @p isa (which must run here); the bits do not depend on it.
 */
void attn_dot_f32_rows(moe_dot_isa isa, const uint16_t *x, int64_t K, const float *rows, int64_t ldr, int64_t n,
                       double *out);

/**
 * Step 1 of the FP8 linear (linear_fp8.c) for @p T rows of K BF16 values (K a multiple of 128):
 * xq[t * K + k] the E4M3 values as doubles, sx[t * K / 128 + b] the fp32 block scales, with the
 * kernels of @p isa (which must run here); the values do not depend on them.
 */
mmoe_status attn_fp8_quantize_rows(moe_dot_isa isa, const uint16_t *x, int64_t T, int64_t K, double *xq, float *sx,
                                   mmoe_error *err);

/** mmoe_linear_dense() with its weight rows shared out over @p pool's threads (NULL: the caller alone). */
mmoe_status attn_linear_dense(moe_dequant_pool *pool, const uint16_t *x, int64_t T, int64_t K, const mmoe_tensor *w,
                              int64_t N, float *y_f32, uint16_t *y_bf16, mmoe_error *err);

/**
 * mmoe_linear_fp8() with the kernels of @p isa (which must run here) and, for calls the
 * register kernel takes, the weight rows shared out over @p pool's threads (NULL: the caller
 * alone); the result depends on neither.  mmoe_linear_fp8() takes moe_dot_isa_best() and no pool.
 */
mmoe_status attn_linear_fp8(moe_dequant_pool *pool, moe_dot_isa isa, const uint16_t *x, int64_t T,
                            const mmoe_tensor *w, const mmoe_tensor *scale, int block, uint16_t *y, mmoe_error *err);

/** fp32 value of element @p i of a BF16 or F32 vector (norm weights, sinks). */
float attn_tensor_f32_at(const mmoe_tensor *t, int64_t i);

/**
 * Dot product of two bf16 vectors of length @p n: the exact double products summed in the
 * chunked pairwise order of @ref spec_arch_sum_order (attention scores, indexer heads).
 */
double attn_dot_bf16(const uint16_t *a, const uint16_t *b, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_ATTN_INTERNAL_H */
