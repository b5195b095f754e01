/**
 * @file moe_token_blocks.c
 * @brief Batch invariance: every SGEMM of the MoE oracle sees token rows in blocks of a fixed
 *        count, so a token's result does not depend on which other tokens share its call.
 *
 * ## The problem
 * An oracle that is the specification must be *batch-invariant*: the output of a token is a
 * function of that token and of the weights, never of the other tokens of the call.  The
 * products of the MoE GEMMs are exact in FP32, so only the order of the sums is free -- and
 * OpenBLAS chooses that order from the *shape* of the call.  On AVX-512 (OpenBLAS 0.3.21,
 * SkylakeX/Cooperlake kernels) the result of one row depends on M, the number of rows of the
 * call: small-matrix kernels and the remainder kernels of the M loop sum in other orders.
 * Measured: with K = 256, N = 8 every M < 150 gives other bits for a row than M = 300.  In a
 * MoE layer M is the number of tokens that an expert received, so a token's output depended on
 * its batch, and a whole-model prefill differed from token-by-token decode by a flipped BF16
 * rounding in about one run in 16.
 *
 * ## The fix: one shape per GEMM
 * Every SGEMM call of the oracle has a fixed number of rows B, whatever the number of tokens:
 * B = ::MOE_EXPERT_TOKEN_BLOCK = 1 for the expert GEMMs (L1, L2, fused shared expert) and
 * B = ::MOE_ROUTER_TOKEN_BLOCK = 1 for the router's logits.  The other two dimensions were
 * already fixed by the tiling of moe_expert_gemm.c (a weight tile of a fixed height, K either
 * the full D or a fixed chunk of 128) and by the router (N = E, K = D).  A call of m token rows
 * runs floor(m / B) full blocks in place and, when m is not a multiple of B, one tail block:
 * the remaining rows are copied into a buffer of B rows whose other rows are zero, the SGEMM
 * runs on the whole block, and only the real rows of its output are copied back.  The tail
 * buffers have the same leading dimensions as the caller's matrices, so a tail block is the
 * same call as a full block, only on other addresses.
 *
 * Fixing the shape is necessary but not obviously sufficient: a row's bits could still depend
 * on its *position* inside the block (rows handled by different kernel paths), on its
 * companions (a kernel that mixes rows), or on the alignment of its address.  None of this
 * happens: OpenBLAS's kernels keep one accumulator chain per output element and broadcast over
 * rows, and the instruction sequence of a call depends on its shape only.  We verified this
 * empirically before relying on it: for B in {1, 4, 8, 16, 32, 64}, K x N in {256 x 8,
 * 256 x 16, 256 x 64, 256 x 128, 256 x 256, 128 x 128, 128 x 256, 512 x 256, 2048 x 128,
 * 4096 x 32, 4096 x 128, 4096 x 256, 7168 x 128, 7168 x 256, 7168 x 384}, beta 0 and 1, one
 * and two threads, a row moved to every position with random or zero companions gave the same
 * bits every time; shifting the A, W and C pointers by 0..15 floats (B = 1 and 16) did not
 * change a bit either.  The property is tested on whole layers of every recipe, with T
 * crossing the router's block, on the router alone (T up to 300 at D = 256, E = 8, where the
 * unblocked GEMM failed) and on the tail block [moe_batchinv].  With B = 1 the argument is
 * simplest: the call sees one token only.
 *
 * ## Why B = 1, for the experts and for the router
 * Measured on the development VM (OpenBLAS 0.3.21, Zen 4, per call of m rows, microseconds,
 * noisy): for an L1 tile (N = 128, K = 4096, tile in cache) OpenBLAS answers M = 1 without
 * packing (33 us) while every M from 2 to 16 pays for packing the 2 MiB tile (420-650 us); one
 * row per call therefore costs m x 33 us, which is less than or about the same as one padded
 * block of 16 up to m = 16 and as the unblocked call up to m of about 16-24.  Decode-sized
 * calls (an expert receives a few tokens) are the common case, so B = 1 is both the simplest
 * and the fastest fixed block; only large prefills (m >> 16 tokens per expert) pay, about 2x
 * on L1 against one unblocked call.  The L2 tile (N = 256, K = 128) behaves alike (1.6 us at
 * M = 1).  The router's gate (E x D = 256 x 4096 floats, 4 MiB) does not stay in the cache, so
 * one row per call streams it once per token (about 1.2 ms at E = 256; 1.6 ms for all 64
 * tokens at E = 32).  A block of 16 would stream it once per 16 tokens, but B = 1 needs no
 * assumption about the kernels at all (the position-in-block property above was verified on
 * one CPU only, while a one-row call sees nothing but its token on any BLAS and CPU), and the
 * router is a few percent of a layer either way, so the router uses B = 1 too.
 *
 * ## If the assumption ever breaks
 * The tests above fail loudly on a BLAS that mixes rows.  The exact fallback would be partial
 * sums per 32-channel block in double (exact) combined in a fixed order, as linear_fp8.c does
 * for the dense FP8 linears.
 */
#include "moe_internal.h"

#include <cblas.h>
#include <string.h>

int moe_token_blocks_begin(moe_token_blocks *tb, int64_t block, const float *a, int64_t lda, int64_t m, float *c,
                           int64_t ldc, float **tail_a, size_t *tail_a_cap, float **tail_c, size_t *tail_c_cap)
{
    *tb = (moe_token_blocks){.a = a, .lda = lda, .c = c, .ldc = ldc, .block = block, .m = m};
    tb->full = m - m % block;
    const int64_t tail = m - tb->full;
    if (tail == 0)
        return 0;
    const size_t na = (size_t)block * (size_t)lda, nc = (size_t)block * (size_t)ldc;
    if (moe_scratch_reserve(tail_a, tail_a_cap, na) != 0 || moe_scratch_reserve(tail_c, tail_c_cap, nc) != 0)
        return -1;
    tb->tail_a = *tail_a;
    tb->tail_c = *tail_c;
    memcpy(tb->tail_a, a + tb->full * lda, (size_t)tail * (size_t)lda * sizeof(float));
    memset(tb->tail_a + tail * lda, 0, (size_t)(block - tail) * (size_t)lda * sizeof(float));
    memset(tb->tail_c, 0, nc * sizeof(float));
    return 0;
}

/** One SGEMM of exactly @p rows rows. */
static void block_sgemm(int64_t rows, const float *a, int64_t lda, const float *w, int64_t nr, int64_t kk,
                        int64_t ldw, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)nr, (int)kk, 1.0f, a, (int)lda, w,
                (int)ldw, beta, c, (int)ldc);
}

void moe_token_blocks_sgemm(const moe_token_blocks *tb, int64_t a_col0, const float *w, int64_t nr, int64_t kk,
                            int64_t ldw, float beta, int64_t c_col0)
{
    for (int64_t r0 = 0; r0 < tb->full; r0 += tb->block)
        block_sgemm(tb->block, tb->a + r0 * tb->lda + a_col0, tb->lda, w, nr, kk, ldw, beta,
                    tb->c + r0 * tb->ldc + c_col0, tb->ldc);
    if (tb->m > tb->full)
        block_sgemm(tb->block, tb->tail_a + a_col0, tb->lda, w, nr, kk, ldw, beta, tb->tail_c + c_col0, tb->ldc);
}

void moe_token_blocks_end(const moe_token_blocks *tb)
{
    if (tb->m > tb->full)
        memcpy(tb->c + tb->full * tb->ldc, tb->tail_c, (size_t)(tb->m - tb->full) * (size_t)tb->ldc * sizeof(float));
}
