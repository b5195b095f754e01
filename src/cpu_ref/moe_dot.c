/**
 * @file moe_dot.c
 * @brief The MoE oracle's GEMM with one fixed summation order: every output element is the same
 *        sequence of FP32 fused multiply-adds on every CPU, whatever the batch, the thread count,
 *        the vector width or the BLAS installed.
 *
 * ## The order
 * Every GEMM of the MoE oracle (the experts' L1 and L2, the fused shared expert, the serial
 * shared expert, the router's logits) is C[t, j] = sum_k a[t, k] w[j, k] with both operands
 * K-contiguous, and every output element is evaluated in the order that
 * @ref spec_moe_gemm_order defines: ::MOE_DOT_LANES = 8 FP32 lanes, lane k mod 8 taking one
 * fused multiply-add per k in ascending order, then the fixed combine of combine_lanes().
 * That section also says why the fma's single rounding is part of the definition and why
 * zero runs (the padding) change no bit.  The scalar loop of dot_generic() is the definition
 * written out; an AVX2 loop that keeps the eight lanes in one register, and a loop over
 * several tokens and rows at once, perform exactly the same operations on exactly the same
 * values, so they give the same bits.  The combine is the usual horizontal sum of an 8-float
 * register (upper half onto lower half, then pairs), so the vector variant needs no extra
 * step.
 *
 * Why lanes and not one accumulator: the operands are stored with K contiguous (the checkpoint
 * layout, and the layout the weight decoder writes), so the natural vector loop runs along K;
 * one accumulator per output would need either a transposed weight tile or horizontal work per
 * k.  With 8 lanes the vector loop is one fused multiply-add per 8 products, and the order is
 * still a plain formula that a scalar loop reproduces.
 *
 * The vector variant uses the FMA instruction, the scalar variant C's fmaf(), which is
 * correctly rounded on every platform (a library call where the CPU has no FMA unit: slow, but
 * the same bits).  No compiler contraction can change a bit: the source has no separate
 * multiply to contract.
 *
 * ## Variants
 * ::MOE_DOT_ISA_GENERIC is the scalar formula (every CPU).  ::MOE_DOT_ISA_AVX2_FMA (x86-64,
 * compiled with GCC's target attribute, used when the CPU reports AVX2, FMA and F16C) keeps the eight
 * lanes of one output in one YMM register and computes a register block of several tokens x
 * several weight rows per pass, so that each loaded weight vector serves several tokens and each
 * activation vector several rows.  ::MOE_DOT_ISA_AVX512 (x86-64 with AVX-512 F, DQ, BW and VL,
 * cpu_avx512.h) does the same for weights decoded in registers with two outputs in each 16-lane
 * register: the lower half holds the eight lanes of weight row j, the upper half those of row
 * j + 1, and the activations of k .. k + 7 are broadcast into both halves, so each half receives
 * the AVX2 register's fused multiply-adds and one decode serves two rows; its GEMM of FP32
 * weights pairs rows the same way (an odd last row beside a row of zeros whose outputs are not
 * read).  All must give the
 * same bits; tests/test_moe_dot.c checks every variant that the CPU runs against an independent
 * scalar loop, on random inputs whose products are not exact.
 *
 * ## Blocking
 * The GEMM of FP32 weights (prefill's decoded tiles) for three tokens or more is blocked for the
 * L1 cache: chunks of 256 k of 24 rows, copied into row pairs, passed by 64 tokens, the lanes
 * kept in memory between chunks (gemm_blocked(); AVX-512 takes a pair a register, AVX2 a row).
 * Fewer tokens take the weight rows in blocks of about
 * ::DOT_ROW_BLOCK_BYTES (they stay in the L2 cache
 * while every token passes over them); inside a block, groups of 4 tokens x 3 rows (12
 * accumulators), then single tokens x 8 rows (8 independent FMA chains, enough to hide the FMA
 * latency), then what is left one row at a time.  The blocking decides only which outputs are
 * computed together, never the operations of one output.  The loops over a register block are
 * unrolled by pragma so that the accumulator arrays live in registers (left to itself, GCC 12
 * -O2 kept some blocks in memory, and the FP4 kernel for two tokens ran about 10x slower than
 * for one; thread CPU time per 2048 x 4096 FP4 matrix with the pragma: 1.5 ms for one token,
 * 2.3 ms for two, 3.4 ms for four, on the Zen 3 development machine).
 */
#include "moe_internal.h"

#include <math.h>
#include <stdlib.h>

#include "cpu_avx512.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** Weight bytes per row block (kept in the L2 cache while all tokens pass over it). */
#define DOT_ROW_BLOCK_BYTES ((int64_t)192 * 1024)

const char *moe_dot_isa_name(moe_dot_isa isa)
{
    switch (isa) {
    case MOE_DOT_ISA_GENERIC: return "generic";
    case MOE_DOT_ISA_AVX2_FMA: return "avx2+fma";
    case MOE_DOT_ISA_AVX512: return "avx512";
    case MOE_DOT_ISA_COUNT: break;
    }
    return "?";
}

int moe_dot_isa_runs_here(moe_dot_isa isa)
{
    switch (isa) {
    case MOE_DOT_ISA_GENERIC: return 1;
    case MOE_DOT_ISA_AVX2_FMA:
#if MMOE_CPU_HAVE_X86
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
        return 0;
#endif
    case MOE_DOT_ISA_AVX512:
#if MMOE_CPU_HAVE_X86
        return moe_dot_isa_runs_here(MOE_DOT_ISA_AVX2_FMA) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
#else
        return 0;
#endif
    case MOE_DOT_ISA_COUNT: break;
    }
    return 0;
}

moe_dot_isa moe_dot_isa_best(void)
{
    if (moe_dot_isa_runs_here(MOE_DOT_ISA_AVX512))
        return MOE_DOT_ISA_AVX512;
    return moe_dot_isa_runs_here(MOE_DOT_ISA_AVX2_FMA) ? MOE_DOT_ISA_AVX2_FMA : MOE_DOT_ISA_GENERIC;
}

int moe_dot_isa_has_avx2(moe_dot_isa isa)
{
    return isa == MOE_DOT_ISA_AVX2_FMA || isa == MOE_DOT_ISA_AVX512;
}

const char *mmoe_cpu_kernels(void) { return moe_dot_isa_name(moe_dot_isa_best()); }

/** The fixed combine of the eight lanes. */
static float combine_lanes(const float p[MOE_DOT_LANES])
{
    return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

/** One output of the fixed order, scalar: the definition itself. */
static float dot_generic(const float *a, const float *w, int64_t k)
{
    float p[MOE_DOT_LANES] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = 0; i < k; i++)
        p[i % MOE_DOT_LANES] = fmaf(a[i], w[i], p[i % MOE_DOT_LANES]);
    return combine_lanes(p);
}

/** Every output of the GEMM by the scalar formula. */
static void gemm_generic(const float *a, int64_t lda, int64_t m, const float *w, int64_t ldw, int64_t n, int64_t k,
                         float *c, int64_t ldc)
{
    for (int64_t t = 0; t < m; t++)
        for (int64_t j = 0; j < n; j++)
            c[t * ldc + j] = dot_generic(a + t * lda, w + j * ldw, k);
}

/** FP4 or FP8 rows decoded one at a time (moe_weight_tile.c), then the scalar formula. */
static int gemm_coded_generic(const float *a, int64_t lda, int64_t m, const moe_mat *w, int64_t r0, int64_t n,
                              float *c, int64_t ldc)
{
    const int64_t k = w->cols;
    float *row = malloc((size_t)k * sizeof(float));
    if (row == NULL)
        return -1;
    for (int64_t j = 0; j < n; j++) {
        moe_weight_tile_f32(w, r0 + j, 1, 0, k, row);
        for (int64_t t = 0; t < m; t++)
            c[t * ldc + j] = dot_generic(a + t * lda, row, k);
    }
    free(row);
    return 0;
}

#if MMOE_CPU_HAVE_X86

/**
 * Finish one output from its eight lanes @p p: the k that do not fill a whole vector (k0 .. k - 1,
 * into their lanes k mod 8, in order), then the combine.
 */
static float finish_lanes(float p[MOE_DOT_LANES], const float *a, const float *w, int64_t k0, int64_t k)
{
    for (int64_t i = k0; i < k; i++)
        p[i % MOE_DOT_LANES] = fmaf(a[i], w[i], p[i % MOE_DOT_LANES]);
    return combine_lanes(p);
}

/** Finish one output from the lanes of @p acc (finish_lanes()). */
MMOE_AVX2 static inline float finish_avx2(__m256 acc, const float *a, const float *w, int64_t k0, int64_t k)
{
    float p[MOE_DOT_LANES];
    _mm256_storeu_ps(p, acc);
    return finish_lanes(p, a, w, k0, k);
}

/**
 * A register block of RT tokens x RN weight rows: RT * RN accumulators, one FMA each per
 * 8 values of k.  Always inlined with constant RT and RN, so the arrays live in registers.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void block_avx2(int rt, int rn, const float *a, int64_t lda,
                                                                       const float *w, int64_t ldw, int64_t k,
                                                                       float *c, int64_t ldc)
{
    __m256 acc[4][8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++)
            acc[t][j] = _mm256_setzero_ps();
    const int64_t kv = k - k % MOE_DOT_LANES;
    for (int64_t i = 0; i < kv; i += MOE_DOT_LANES) {
        __m256 wv[8];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++)
            wv[j] = _mm256_loadu_ps(w + j * ldw + i);
        _Pragma("GCC unroll 8")
        for (int t = 0; t < rt; t++) {
            const __m256 av = _mm256_loadu_ps(a + t * lda + i);
            _Pragma("GCC unroll 8")
            for (int j = 0; j < rn; j++)
                acc[t][j] = _mm256_fmadd_ps(av, wv[j], acc[t][j]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++)
            c[t * ldc + j] = finish_avx2(acc[t][j], a + t * lda, w + j * ldw, kv, k);
}

/** Tokens [0, m) against weight rows [0, n) of one row block. */
MMOE_AVX2 static void rows_avx2(const float *a, int64_t lda, int64_t m, const float *w, int64_t ldw, int64_t n,
                                int64_t k, float *c, int64_t ldc)
{
    int64_t t = 0;
    for (; t + 4 <= m; t += 4) {
        int64_t j = 0;
        for (; j + 3 <= n; j += 3)
            block_avx2(4, 3, a + t * lda, lda, w + j * ldw, ldw, k, c + t * ldc + j, ldc);
        for (; j < n; j++)
            block_avx2(4, 1, a + t * lda, lda, w + j * ldw, ldw, k, c + t * ldc + j, ldc);
    }
    for (; t < m; t++) {
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
            block_avx2(1, 8, a + t * lda, lda, w + j * ldw, ldw, k, c + t * ldc + j, ldc);
        for (; j < n; j++)
            block_avx2(1, 1, a + t * lda, lda, w + j * ldw, ldw, k, c + t * ldc + j, ldc);
    }
}

/** The AVX2 GEMM: row blocks of about ::DOT_ROW_BLOCK_BYTES, each passed by every token. */
MMOE_AVX2 static void gemm_avx2(const float *a, int64_t lda, int64_t m, const float *w, int64_t ldw, int64_t n,
                                int64_t k, float *c, int64_t ldc)
{
    int64_t rb = DOT_ROW_BLOCK_BYTES / ((k > 0 ? k : 1) * (int64_t)sizeof(float));
    rb = rb < 24 ? 24 : rb - rb % 24; /* a multiple of 3 and of 8 */
    for (int64_t j0 = 0; j0 < n; j0 += rb)
        rows_avx2(a, lda, m, w + j0 * ldw, ldw, n - j0 < rb ? n - j0 : rb, k, c + j0, ldc);
}

/** The RT x RN outputs of a register block of weights decoded in registers: each accumulator's combined lanes. */
MMOE_AVX2 static inline __attribute__((always_inline)) void store_block_avx2(int rt, int rn, __m256 acc[2][8], float *c,
                                                                             int64_t ldc)
{
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++) {
            float p[MOE_DOT_LANES];
            _mm256_storeu_ps(p, acc[t][j]);
            c[t * ldc + j] = combine_lanes(p);
        }
}

/**
 * The 32 weights of one FP4 group (16 bytes: element 2i in the low nibble of byte i, 2i + 1 in
 * the high one) as four vectors of exact FP32 values.  A 16-entry byte table holds 2 x the E2M1
 * value of each code (0, 1, 2, 3, 4, 6, 8, 12 and their negatives; code 8, -0, becomes +0, which
 * no lane can tell from -0, @ref spec_moe_gemm_order); the integers are converted exactly and
 * multiplied by half the group's power-of-two scale, an exact product (or the same infinity) as
 * the decoder's e2m1 x scale.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void fp4_group_avx2(const uint8_t *bytes, float half_scale,
                                                                           __m256 out[4])
{
    const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)bytes);
    const __m128i lo = _mm_and_si128(b, nibble), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
    const __m128i v0 = _mm_shuffle_epi8(table, _mm_unpacklo_epi8(lo, hi)); /* elements 0 .. 15 */
    const __m128i v1 = _mm_shuffle_epi8(table, _mm_unpackhi_epi8(lo, hi)); /* elements 16 .. 31 */
    const __m256 hs = _mm256_set1_ps(half_scale);
    out[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), hs);
    out[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), hs);
    out[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), hs);
    out[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), hs);
}

/**
 * RT tokens x RN FP4 weight rows, decoded in registers group by group: the same values and the
 * same fused multiply-adds, in the same lane order, as decoding the rows and calling block_avx2.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void fp4_block_avx2(int rt, int rn, const float *a,
                                                                           int64_t lda, const moe_mat *w, int64_t r0,
                                                                           float *c, int64_t ldc)
{
    const int64_t k = w->cols, row_bytes = k / 2;
    const uint8_t *sf = (const uint8_t *)w->sf;
    __m256 acc[2][8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++)
            acc[t][j] = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / 32; g++) {
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++) {
            __m256 wv[4];
            const float half_scale = fmt_ue8m0_to_f32(sf[(r0 + j) * w->sf_cols + g]) * 0.5f;
            fp4_group_avx2(w->w + (r0 + j) * row_bytes + g * 16, half_scale, wv);
            _Pragma("GCC unroll 8")
            for (int t = 0; t < rt; t++)
                _Pragma("GCC unroll 8")
                for (int q = 0; q < 4; q++)
                    acc[t][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + t * lda + g * 32 + q * 8), wv[q], acc[t][j]);
        }
    }
    store_block_avx2(rt, rn, acc, c, ldc);
}

/**
 * RT tokens x RN FP8 weight rows, decoded in registers 8 codes at a time: the code's value
 * (mmoe_e4m3_codes_avx2(), exact) times its block's scale, one rounding, as the decoder's
 * e4m3 x scale; then the same fused multiply-adds, in the same lane order, as decoding the rows
 * and calling block_avx2.  The width and the scale-block width are multiples of 8.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void fp8_block_avx2(int rt, int rn, const float *a,
                                                                           int64_t lda, const moe_mat *w, int64_t r0,
                                                                           float *c, int64_t ldc)
{
    const int64_t k = w->cols;
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m256 nan_pos = _mm256_set1_ps(e4m3[0x7F]), nan_neg = _mm256_set1_ps(e4m3[0xFF]);
    __m256 acc[2][8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++)
            acc[t][j] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < k; k0 += w->block_k) {
        const int64_t k1 = k0 + w->block_k < k ? k0 + w->block_k : k;
        __m256 sv[8];
        _Pragma("GCC unroll 8")
        for (int j = 0; j < rn; j++)
            sv[j] = _mm256_set1_ps(moe_fp8_block_scale(w, r0 + j, k0));
        for (int64_t i = k0; i < k1; i += MOE_DOT_LANES) {
            _Pragma("GCC unroll 8")
            for (int j = 0; j < rn; j++) {
                const __m256 v = mmoe_e4m3_codes_avx2(w->w + (r0 + j) * k + i, nan_pos, nan_neg);
                const __m256 wv = _mm256_mul_ps(v, sv[j]);
                _Pragma("GCC unroll 8")
                for (int t = 0; t < rt; t++)
                    acc[t][j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + t * lda + i), wv, acc[t][j]);
            }
        }
    }
    store_block_avx2(rt, rn, acc, c, ldc);
}

/** RT tokens x RN rows of an FP4 or FP8 matrix in registers (fp4_block_avx2, fp8_block_avx2). */
MMOE_AVX2 static inline __attribute__((always_inline)) void coded_block_avx2(int rt, int rn, const float *a,
                                                                             int64_t lda, const moe_mat *w, int64_t r0,
                                                                             float *c, int64_t ldc)
{
    if (w->fmt == MOE_W_FP8)
        fp8_block_avx2(rt, rn, a, lda, w, r0, c, ldc);
    else
        fp4_block_avx2(rt, rn, a, lda, w, r0, c, ldc);
}

/** The GEMM of weights decoded in registers: pairs of tokens x 4 rows, then single tokens x 8 rows. */
MMOE_AVX2 static void gemm_coded_avx2(const float *a, int64_t lda, int64_t m, const moe_mat *w, int64_t r0, int64_t n,
                                      float *c, int64_t ldc)
{
    int64_t t = 0;
    for (; t + 2 <= m; t += 2) {
        int64_t j = 0;
        for (; j + 4 <= n; j += 4)
            coded_block_avx2(2, 4, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j < n; j++)
            coded_block_avx2(2, 1, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
    }
    for (; t < m; t++) {
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
            coded_block_avx2(1, 8, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j < n; j++)
            coded_block_avx2(1, 1, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
    }
}

/*
 * The AVX-512 kernels: two weight rows in each register (the file comment's "Variants").  In a
 * register block of RT tokens x RP row pairs, acc[t][p] holds in its lower half the eight
 * lanes of token t and row 2p, in its upper half those of row 2p + 1.
 */

/** The activations a[0 .. 7] in both halves of a register. */
MMOE_AVX512 static inline __attribute__((always_inline)) __m512 act_pair_avx512(const float *a)
{
    return _mm512_broadcast_f32x8(_mm256_loadu_ps(a));
}

/** @p lo in the lower half of a register, @p hi in the upper half. */
MMOE_AVX512 static inline __attribute__((always_inline)) __m512 halves_avx512(float lo, float hi)
{
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

/** The RT x 2 RP outputs of a paired register block: each half's combined lanes. */
MMOE_AVX512 static inline __attribute__((always_inline)) void store_pairs_avx512(int rt, int rp, __m512 acc[2][8],
                                                                                float *c, int64_t ldc)
{
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int p = 0; p < rp; p++) {
            float q[2 * MOE_DOT_LANES];
            _mm512_storeu_ps(q, acc[t][p]);
            c[t * ldc + 2 * p] = combine_lanes(q);
            c[t * ldc + 2 * p + 1] = combine_lanes(q + MOE_DOT_LANES);
        }
}

/**
 * fp4_group_avx2() for the same group of two rows (16 bytes each at @p b0 and @p b1): out[q]
 * holds elements 8q .. 8q + 7 of row b0 in its lower half and of row b1 in its upper half, each
 * the exact integer 2 x e2m1 (a 16-entry float table, the byte table's values) times the row's
 * half scale (@p half_scales, by halves): the AVX2 decoder's values.
 */
MMOE_AVX512 static inline __attribute__((always_inline)) void fp4_group_pair_avx512(const uint8_t *b0,
                                                                                   const uint8_t *b1,
                                                                                   __m512 half_scales,
                                                                                   __m512 out[4])
{
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i b = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)b0)),
        _mm_loadu_si128((const __m128i *)(const void *)b1), 1);
    const __m256i lo = _mm256_and_si256(b, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
    /* per 128-bit half (one row): elements 0 .. 15, then 16 .. 31, as codes; then the quarters
       of the two rows side by side: [row b0 0..7, row b1 0..7 | row b0 8..15, row b1 8..15] */
    const __m256i e0 = _mm256_permute4x64_epi64(_mm256_unpacklo_epi8(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i e1 = _mm256_permute4x64_epi64(_mm256_unpackhi_epi8(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
    const __m128i quarter[4] = {_mm256_castsi256_si128(e0), _mm256_extracti128_si256(e0, 1),
                                _mm256_castsi256_si128(e1), _mm256_extracti128_si256(e1, 1)};
    _Pragma("GCC unroll 4")
    for (int q = 0; q < 4; q++)
        out[q] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(quarter[q]), table), half_scales);
}

/** fp4_block_avx2() for RT tokens x RP pairs of FP4 rows (rows r0 .. r0 + 2 RP - 1). */
MMOE_AVX512 static inline __attribute__((always_inline)) void fp4_pairs_avx512(int rt, int rp, const float *a,
                                                                              int64_t lda, const moe_mat *w,
                                                                              int64_t r0, float *c, int64_t ldc)
{
    const int64_t k = w->cols, row_bytes = k / 2;
    const uint8_t *sf = (const uint8_t *)w->sf;
    __m512 acc[2][8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int p = 0; p < rp; p++)
            acc[t][p] = _mm512_setzero_ps();
    for (int64_t g = 0; g < k / 32; g++) {
        __m512 av[2][4];
        _Pragma("GCC unroll 2")
        for (int t = 0; t < rt; t++)
            _Pragma("GCC unroll 4")
            for (int q = 0; q < 4; q++)
                av[t][q] = act_pair_avx512(a + t * lda + g * 32 + q * 8);
        _Pragma("GCC unroll 8")
        for (int p = 0; p < rp; p++) {
            const int64_t j0 = r0 + 2 * p, j1 = j0 + 1;
            __m512 wv[4];
            fp4_group_pair_avx512(w->w + j0 * row_bytes + g * 16, w->w + j1 * row_bytes + g * 16,
                                  halves_avx512(fmt_ue8m0_to_f32(sf[j0 * w->sf_cols + g]) * 0.5f,
                                                fmt_ue8m0_to_f32(sf[j1 * w->sf_cols + g]) * 0.5f),
                                  wv);
            _Pragma("GCC unroll 2")
            for (int t = 0; t < rt; t++)
                _Pragma("GCC unroll 4")
                for (int q = 0; q < 4; q++)
                    acc[t][p] = _mm512_fmadd_ps(av[t][q], wv[q], acc[t][p]);
        }
    }
    store_pairs_avx512(rt, rp, acc, c, ldc);
}

/** fp8_block_avx2() for RT tokens x RP pairs of FP8 rows (rows r0 .. r0 + 2 RP - 1). */
MMOE_AVX512 static inline __attribute__((always_inline)) void fp8_pairs_avx512(int rt, int rp, const float *a,
                                                                              int64_t lda, const moe_mat *w,
                                                                              int64_t r0, float *c, int64_t ldc)
{
    const int64_t k = w->cols;
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m512 nan_pos = _mm512_set1_ps(e4m3[0x7F]), nan_neg = _mm512_set1_ps(e4m3[0xFF]);
    __m512 acc[2][8];
    _Pragma("GCC unroll 8")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 8")
        for (int p = 0; p < rp; p++)
            acc[t][p] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < k; k0 += w->block_k) {
        const int64_t k1 = k0 + w->block_k < k ? k0 + w->block_k : k;
        __m512 sv[8];
        _Pragma("GCC unroll 8")
        for (int p = 0; p < rp; p++)
            sv[p] = halves_avx512(moe_fp8_block_scale(w, r0 + 2 * p, k0), moe_fp8_block_scale(w, r0 + 2 * p + 1, k0));
        for (int64_t i = k0; i < k1; i += MOE_DOT_LANES) {
            __m512 av[2];
            _Pragma("GCC unroll 2")
            for (int t = 0; t < rt; t++)
                av[t] = act_pair_avx512(a + t * lda + i);
            _Pragma("GCC unroll 8")
            for (int p = 0; p < rp; p++) {
                const __m512 v = mmoe_e4m3_pair_avx512(w->w + (r0 + 2 * p) * k + i, w->w + (r0 + 2 * p + 1) * k + i,
                                                       nan_pos, nan_neg);
                const __m512 wv = _mm512_mul_ps(v, sv[p]);
                _Pragma("GCC unroll 2")
                for (int t = 0; t < rt; t++)
                    acc[t][p] = _mm512_fmadd_ps(av[t], wv, acc[t][p]);
            }
        }
    }
    store_pairs_avx512(rt, rp, acc, c, ldc);
}

/** RT tokens x RP row pairs of an FP4 or FP8 matrix in registers. */
MMOE_AVX512 static inline __attribute__((always_inline)) void coded_pairs_avx512(int rt, int rp, const float *a,
                                                                                int64_t lda, const moe_mat *w,
                                                                                int64_t r0, float *c, int64_t ldc)
{
    if (w->fmt == MOE_W_FP8)
        fp8_pairs_avx512(rt, rp, a, lda, w, r0, c, ldc);
    else
        fp4_pairs_avx512(rt, rp, a, lda, w, r0, c, ldc);
}

/*
 * The blocked GEMM.  A pass of four tokens over whole rows of k weights (rows_avx2())
 * streams them from the L2 cache; here the weights are taken in chunks of ::DOT_KC values of
 * ::DOT_RB rows, copied once into pairs (row 2p's eight values of a step, then row 2p + 1's:
 * one 512-bit load per pair and step, no insert) that stay in the L1 cache while every token of
 * a block of ::DOT_MB passes over them.  A pair's sixteen lanes for a token are kept in memory
 * between chunks (a store and a load do not change a value), so every lane still receives its
 * fused multiply-adds in ascending k, and the output is finished by finish_lanes() as before.
 */

/** k values of one chunk of the blocked GEMM (a multiple of ::MOE_DOT_LANES). */
#define DOT_KC 256
/** Weight rows of one block of the blocked GEMM (an even number: pairs). */
#define DOT_RB 24
/** Tokens of one block of the blocked GEMM. */
#define DOT_MB 64
/**
 * The fewest tokens that take the blocked GEMM: one or two tokens read each weight about once,
 * so the copy into pairs costs more than the L1 cache saves (one token, 2048 x 4096: 1.2 ms
 * unblocked, 1.8-2.0 blocked; two about level, three 10-20% faster blocked).
 */
#define DOT_BLOCKED_MIN_TOKENS 3

/**
 * RT tokens x RP pairs of one chunk: the lanes of @p lanes (token t's pair p at lanes + (t * DOT_RB
 * / 2 + p) * 16; zero when @p first) plus @p steps steps of eight k, the pairs at wp + p * 16 *
 * DOT_KC, the activations at a + t * lda.
 */
MMOE_AVX512 static inline __attribute__((always_inline)) void chunk_pairs_avx512(int rt, int rp, int first,
                                                                                const float *a, int64_t lda,
                                                                                const float *wp, int64_t steps,
                                                                                float *lanes)
{
    __m512 acc[4][3];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 3")
        for (int p = 0; p < rp; p++)
            acc[t][p] = first ? _mm512_setzero_ps() : _mm512_load_ps(lanes + (t * DOT_RB / 2 + p) * 16);
    for (int64_t s = 0; s < steps; s++) {
        __m512 wv[3];
        _Pragma("GCC unroll 3")
        for (int p = 0; p < rp; p++)
            wv[p] = _mm512_load_ps(wp + p * 2 * DOT_KC + s * 16);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < rt; t++) {
            const __m512 av = act_pair_avx512(a + t * lda + s * MOE_DOT_LANES);
            _Pragma("GCC unroll 3")
            for (int p = 0; p < rp; p++)
                acc[t][p] = _mm512_fmadd_ps(av, wv[p], acc[t][p]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 3")
        for (int p = 0; p < rp; p++)
            _mm512_store_ps(lanes + (t * DOT_RB / 2 + p) * 16, acc[t][p]);
}

/**
 * The body of a chunk kernel's dispatcher: KERNEL(rt, rn, first, ...) with @p rt (1 .. 4), @p rn
 * (1 .. 3) and @p first (0 or 1) as constants, so that the kernel's arrays live in registers.
 */
#define DOT_CHUNK_CASE(KERNEL, RT, RN, ...)                                                                            \
    case (RT) * 4 + (RN):                                                                                              \
        if (first)                                                                                                     \
            KERNEL(RT, RN, 1, __VA_ARGS__);                                                                            \
        else                                                                                                           \
            KERNEL(RT, RN, 0, __VA_ARGS__);                                                                            \
        return;
/** See DOT_CHUNK_CASE(). */
#define DOT_CHUNK_DISPATCH(KERNEL, ...)                                                                                \
    switch (rt * 4 + rn) {                                                                                             \
        DOT_CHUNK_CASE(KERNEL, 4, 3, __VA_ARGS__) DOT_CHUNK_CASE(KERNEL, 4, 2, __VA_ARGS__)                            \
        DOT_CHUNK_CASE(KERNEL, 4, 1, __VA_ARGS__) DOT_CHUNK_CASE(KERNEL, 3, 3, __VA_ARGS__)                            \
        DOT_CHUNK_CASE(KERNEL, 3, 2, __VA_ARGS__) DOT_CHUNK_CASE(KERNEL, 3, 1, __VA_ARGS__)                            \
        DOT_CHUNK_CASE(KERNEL, 2, 3, __VA_ARGS__) DOT_CHUNK_CASE(KERNEL, 2, 2, __VA_ARGS__)                            \
        DOT_CHUNK_CASE(KERNEL, 2, 1, __VA_ARGS__) DOT_CHUNK_CASE(KERNEL, 1, 3, __VA_ARGS__)                            \
        DOT_CHUNK_CASE(KERNEL, 1, 2, __VA_ARGS__) DOT_CHUNK_CASE(KERNEL, 1, 1, __VA_ARGS__)                            \
    default: return;                                                                                                   \
    }

/** chunk_pairs_avx512() with @p rt (1 .. 4) and @p rn pairs (1 .. 3) as constants. */
MMOE_AVX512 static void chunk_pairs_any_avx512(int rt, int rn, int first, const float *a, int64_t lda,
                                               const float *wp, int64_t steps, float *lanes)
{
    DOT_CHUNK_DISPATCH(chunk_pairs_avx512, a, lda, wp, steps, lanes)
}

/**
 * The AVX2 form of chunk_pairs_avx512(): RT tokens x RN rows (rows j .. j + RN - 1 of the block,
 * row r's eight values of step s at wp + (r / 2) * 2 * DOT_KC + 16 s + 8 (r mod 2)), token t's row
 * r's lanes at lanes + t * 8 * DOT_RB + 8 r: the pairs' layout, read a row at a time.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void chunk_rows_avx2(int rt, int rn, int first, const float *a,
                                                                           int64_t lda, const float *wp, int64_t j,
                                                                           int64_t steps, float *lanes)
{
    __m256 acc[4][3];
    const float *wr[3];
    _Pragma("GCC unroll 3")
    for (int r = 0; r < rn; r++)
        wr[r] = wp + ((j + r) / 2) * 2 * DOT_KC + ((j + r) % 2) * MOE_DOT_LANES;
    _Pragma("GCC unroll 4")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 3")
        for (int r = 0; r < rn; r++)
            acc[t][r] = first ? _mm256_setzero_ps() : _mm256_load_ps(lanes + t * MOE_DOT_LANES * DOT_RB + (j + r) * 8);
    for (int64_t s = 0; s < steps; s++) {
        __m256 wv[3];
        _Pragma("GCC unroll 3")
        for (int r = 0; r < rn; r++)
            wv[r] = _mm256_load_ps(wr[r] + s * 16);
        _Pragma("GCC unroll 4")
        for (int t = 0; t < rt; t++) {
            const __m256 av = _mm256_loadu_ps(a + t * lda + s * MOE_DOT_LANES);
            _Pragma("GCC unroll 3")
            for (int r = 0; r < rn; r++)
                acc[t][r] = _mm256_fmadd_ps(av, wv[r], acc[t][r]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < rt; t++)
        _Pragma("GCC unroll 3")
        for (int r = 0; r < rn; r++)
            _mm256_store_ps(lanes + t * MOE_DOT_LANES * DOT_RB + (j + r) * 8, acc[t][r]);
}

/** chunk_rows_avx2() with @p rt (1 .. 4) and @p rn (1 .. 3) as constants. */
MMOE_AVX2 static void chunk_rows_any_avx2(int rt, int rn, int first, const float *a, int64_t lda, const float *wp,
                                          int64_t j, int64_t steps, float *lanes)
{
    DOT_CHUNK_DISPATCH(chunk_rows_avx2, a, lda, wp, j, steps, lanes)
}

/**
 * Rows j0 .. j0 + nj - 1 (nj <= DOT_RB) of @p w, columns k0 .. k0 + kc - 1, into pairs: pair p's step
 * s at wp + p * 2 * DOT_KC + 16 s (row 2p's eight values, then row 2p + 1's; zeros past the last row).
 */
MMOE_AVX2 static void pack_pairs(const float *w, int64_t ldw, int64_t j0, int64_t nj, int64_t k0, int64_t kc,
                                 float *wp)
{
    for (int64_t p = 0; 2 * p < nj; p++)
        for (int h = 0; h < 2; h++) {
            float *o = wp + p * 2 * DOT_KC + h * MOE_DOT_LANES;
            if (2 * p + h >= nj) {
                for (int64_t s = 0; s < kc / MOE_DOT_LANES; s++)
                    _mm256_store_ps(o + s * 16, _mm256_setzero_ps());
                continue;
            }
            const float *r = w + (j0 + 2 * p + h) * ldw + k0;
            for (int64_t s = 0; s < kc / MOE_DOT_LANES; s++)
                _mm256_store_ps(o + s * 16, _mm256_loadu_ps(r + s * MOE_DOT_LANES));
        }
}

/**
 * The blocked GEMM (the comment above) with the chunk kernel of @p isa: pairs of rows under
 * AVX-512, rows under AVX2; widths below eight by rows_avx2().
 */
MMOE_AVX2 static void gemm_blocked(moe_dot_isa isa, const float *a, int64_t lda, int64_t m, const float *w,
                                   int64_t ldw, int64_t n, int64_t k, float *c, int64_t ldc)
{
    const int64_t kv = k - k % MOE_DOT_LANES;
    if (kv == 0) {
        rows_avx2(a, lda, m, w, ldw, n, k, c, ldc);
        return;
    }
    _Alignas(64) float wp[DOT_RB / 2 * 2 * DOT_KC];
    _Alignas(64) float lanes[DOT_MB * DOT_RB / 2 * 16];
    for (int64_t t0 = 0; t0 < m; t0 += DOT_MB) {
        const int64_t mt = m - t0 < DOT_MB ? m - t0 : DOT_MB;
        for (int64_t j0 = 0; j0 < n; j0 += DOT_RB) {
            const int64_t nj = n - j0 < DOT_RB ? n - j0 : DOT_RB, np = (nj + 1) / 2;
            for (int64_t k0 = 0; k0 < kv; k0 += DOT_KC) {
                const int64_t kc = kv - k0 < DOT_KC ? kv - k0 : DOT_KC;
                pack_pairs(w, ldw, j0, nj, k0, kc, wp);
                for (int64_t t = 0; t < mt; t += 4) {
                    const int rt = mt - t < 4 ? (int)(mt - t) : 4;
                    const float *at = a + (t0 + t) * lda + k0;
                    if (isa == MOE_DOT_ISA_AVX512)
                        for (int64_t p = 0; p < np; p += 3)
                            chunk_pairs_any_avx512(rt, np - p < 3 ? (int)(np - p) : 3, k0 == 0, at, lda,
                                                   wp + p * 2 * DOT_KC, kc / MOE_DOT_LANES,
                                                   lanes + (t * DOT_RB / 2 + p) * 16);
                    else
                        for (int64_t j = 0; j < nj; j += 3)
                            chunk_rows_any_avx2(rt, nj - j < 3 ? (int)(nj - j) : 3, k0 == 0, at, lda, wp, j,
                                                kc / MOE_DOT_LANES, lanes + t * DOT_RB / 2 * 16);
                }
            }
            for (int64_t t = 0; t < mt; t++)
                for (int64_t j = 0; j < nj; j++)
                    c[(t0 + t) * ldc + j0 + j] =
                        finish_lanes(lanes + (t * DOT_RB / 2 + j / 2) * 16 + (j % 2) * MOE_DOT_LANES,
                                     a + (t0 + t) * lda, w + (j0 + j) * ldw, kv, k);
        }
    }
}

/**
 * gemm_coded_avx2() with row pairs: pairs of tokens x 8 rows, then single tokens x 16 or 8 rows
 * (the pool's grabs of a 4096-wide matrix are 8 rows), then one pair at a time; an odd last row
 * takes the AVX2 block.
 */
MMOE_AVX512 static void gemm_coded_avx512(const float *a, int64_t lda, int64_t m, const moe_mat *w, int64_t r0,
                                          int64_t n, float *c, int64_t ldc)
{
    int64_t t = 0;
    for (; t + 2 <= m; t += 2) {
        int64_t j = 0;
        for (; j + 8 <= n; j += 8)
            coded_pairs_avx512(2, 4, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j + 2 <= n; j += 2)
            coded_pairs_avx512(2, 1, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j < n; j++)
            coded_block_avx2(2, 1, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
    }
    for (; t < m; t++) {
        int64_t j = 0;
        for (; j + 16 <= n; j += 16)
            coded_pairs_avx512(1, 8, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j + 8 <= n; j += 8)
            coded_pairs_avx512(1, 4, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j + 2 <= n; j += 2)
            coded_pairs_avx512(1, 1, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
        for (; j < n; j++)
            coded_block_avx2(1, 1, a + t * lda, lda, w, r0 + j, c + t * ldc + j, ldc);
    }
}

#endif /* MMOE_CPU_HAVE_X86 */

void moe_dot_gemm(moe_dot_isa isa, const float *a, int64_t lda, int64_t m, const float *w, int64_t ldw, int64_t n,
                  int64_t k, float *c, int64_t ldc)
{
#if MMOE_CPU_HAVE_X86
    if (moe_dot_isa_has_avx2(isa)) {
        if (m >= DOT_BLOCKED_MIN_TOKENS)
            gemm_blocked(isa, a, lda, m, w, ldw, n, k, c, ldc);
        else
            gemm_avx2(a, lda, m, w, ldw, n, k, c, ldc);
        return;
    }
#endif
    (void)isa;
    gemm_generic(a, lda, m, w, ldw, n, k, c, ldc);
}

int moe_dot_coded_in_registers(moe_dot_isa isa, const moe_mat *w)
{
    if (!moe_dot_isa_has_avx2(isa) || !MMOE_CPU_HAVE_X86)
        return 0;
    if (w->fmt == MOE_W_FP4)
        return 1;
    return w->fmt == MOE_W_FP8 && w->cols % MOE_DOT_LANES == 0 && w->block_k > 0 && w->block_k % MOE_DOT_LANES == 0;
}

int moe_dot_gemm_coded(moe_dot_isa isa, const float *a, int64_t lda, int64_t m, const moe_mat *w, int64_t r0,
                       int64_t n, float *c, int64_t ldc)
{
#if MMOE_CPU_HAVE_X86
    if (moe_dot_coded_in_registers(isa, w)) {
        if (isa == MOE_DOT_ISA_AVX512)
            gemm_coded_avx512(a, lda, m, w, r0, n, c, ldc);
        else
            gemm_coded_avx2(a, lda, m, w, r0, n, c, ldc);
        return 0;
    }
#endif
    return gemm_coded_generic(a, lda, m, w, r0, n, c, ldc);
}
