/**
 * @file linear_fp8.c
 * @brief The FP8 block-scaled linear layer of DeepSeek-V4 (@ref spec_arch_linear), with an order-free exact partial.
 *
 * Every FP8 `Linear` of the reference (wq_a, wq_b, wkv, wo_b, the indexer's wq_b,
 * the shared experts, the MTP projections) computes y = x W^T as follows.
 *
 * 1. **Activation quantization**, per row, in blocks of 128 along K: the block's
 *    amax (at least 1e-4) gives the power-of-two scale s_x = 2^ceil(log2(amax/448))
 *    (UE8M0), and every element becomes xq = e4m3(clamp(x/s_x, +-448)), rounded to
 *    nearest even.  The rule is mmoe_formats.h's ::MMOE_SF_RULE_V4.
 * 2. **Block partials**: for each K block of the weight (128 wide for V4's 128x128
 *    weight blocks; 32 for 32x32-block checkpoints) a fresh partial sum(xq * wq) over
 *    the block is formed.
 * 3. **Scaled accumulation**: acc += partial * (s_x[row, k/128] * s_w[n/b, k/b]) in
 *    fp32, blocks in ascending order; finally y = bf16(acc).
 *
 * The reference leaves the summation order of step 2 to the tensor core.  Here the
 * partial is computed *exactly*: each product of two E4M3 values has <= 8
 * significant bits and a magnitude in [2^-18, 448^2 < 2^18], so a sum of at most 128
 * of them is a multiple of 2^-18 below 2^25 -- 43 bits, well inside a double's 53.
 * cblas_dgemm therefore returns the exact sum whatever its blocking, FMA use or
 * thread count, and rounding it once to fp32 gives the canonical partial.  The
 * result of a row depends on that row only, bit for bit.
 *
 * Because the partials are exact, how they are computed is free, and two ways give the same
 * bits.  The weight is read as E4M3 bytes [N, K]; rows of x are processed in chunks of
 * ATTN_FP8_TILE_T so that the double copies stay small.  A chunk of up to ::FP8_REG_MAX_T rows
 * (decode) on a CPU with AVX2 and FMA takes each weight row's codes straight into registers
 * (fp8_row_partials_avx2(), or sixteen codes at a time with AVX-512: fp8_row_partials_avx512());
 * otherwise the weight is taken in tiles of ATTN_FP8_TILE_N rows,
 * each K block of a tile converted into doubles (in AVX2 registers where the CPU has them) and
 * multiplied by one cblas_dgemm.  Both then run step 3 with fp8_scaled_add()'s operations (the
 * tile path eight outputs at a time, which share a weight scale).  tests/test_attn_linear.c
 * checks both against a float64 oracle.  Both share the weight's rows out over the worker pool
 * (the tile path only where OpenBLAS runs one thread: fp8_tiles_on_pool()).
 */
#include "attn_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_avx512.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/**
 * Output rows (weight rows) of one tile: each K block of the tile is converted to double and
 * multiplied by one dgemm; the tiles are shared out over the worker pool.
 */
#define ATTN_FP8_TILE_N 256
/** Activation rows quantized at a time. */
#define ATTN_FP8_TILE_T 64
/** The activation quantization block of the reference (`act_quant` block_size). */
#define ACT_BLOCK 128
/**
 * Activation rows up to which the AVX2 kernel computes the partials in registers (above, the
 * decoded tile's dgemm is faster: on a Zen 4 core the kernel takes 0.33-0.38 ns a weight for
 * one row and 0.52-0.54 for four, the tile path 0.46-0.68 and 0.61-0.66, and for eight 1.0
 * against 0.9).
 */
#define FP8_REG_MAX_T 4

mmoe_status mmoe_linear_fp8_check(const mmoe_tensor *w, const mmoe_tensor *scale, int64_t N,
                                  int64_t K, int block, const char *name, mmoe_error *err)
{
    if (block <= 0 || ACT_BLOCK % block != 0)
        return mmoe_error_set(err, MMOE_ERANGE,
                              "linear '%s': weight block %d must divide the activation block 128",
                              name, block);
    if (K <= 0 || K % ACT_BLOCK != 0 || N <= 0)
        return mmoe_error_set(err, MMOE_ERANGE,
                              "linear '%s': input width %lld must be a positive multiple of 128 "
                              "(the reference's act_quant block), output width %lld positive",
                              name, (long long)K, (long long)N);
    char what[512];
    snprintf(what, sizeof what, "%s.weight", name);
    int64_t wshape[2] = {N, K};
    mmoe_status st = mmoe_tensor_expect(w, what, MMOE_DT_F8_E4M3, 2, wshape, err);
    if (st != MMOE_OK)
        return st;
    snprintf(what, sizeof what, "%s.scale", name);
    int64_t sshape[2] = {(N + block - 1) / block, (K + block - 1) / block};
    st = mmoe_tensor_expect(scale, what, MMOE_DT_F8_E8M0, 2, sshape, err);
    if (st != MMOE_OK)
        return st;
    if (w->data == NULL || scale->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "linear '%s': weight or scale has no data", name);
    const uint8_t *sb = (const uint8_t *)scale->data;
    for (int64_t i = 0; i < sshape[0] * sshape[1]; i++)
        if (sb[i] == 0xFF)
            return mmoe_error_set(err, MMOE_ERANGE,
                                  "tensor '%s': scale byte %lld is 255 (E8M0 NaN)", what, (long long)i);
    return MMOE_OK;
}

#if MMOE_CPU_HAVE_X86
/**
 * Step 1 for one 128-wide block of finite values under AVX2, eight at a time, with the
 * operations of mmoe_quant_row_fp8_ue8m0() (rule ::MMOE_SF_RULE_V4): the scale byte from the
 * block's amax (the largest |x|, whatever the order for finite values), v = x / s, clamped to
 * +-448, rounded to E4M3 to nearest even, as a value: at or above 2^-6 (E4M3's normal range) by
 * rounding the fp32 bits to three mantissa bits (a carry moves to the next binade, as the code
 * does), below it to a multiple of 2^-9 (roundeven(|v| 2^9) 2^-9, exact); the sign put back
 * last, so that a value rounding to zero keeps its sign as the code 0x80 does.
 */
MMOE_AVX2 static void quantize_block_avx2(const float *xb, double *xq, uint8_t *sf)
{
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < ACT_BLOCK; i += 8)
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(xb + i)));
    float lanes[8];
    _mm256_storeu_ps(lanes, amax);
    float a = lanes[0];
    for (int l = 1; l < 8; l++)
        a = lanes[l] > a ? lanes[l] : a;
    *sf = mmoe_sf_ue8m0_v4(a, MMOE_FP8_E4M3_MAX);
    const __m256 s = _mm256_set1_ps(fmt_ue8m0_to_f32(*sf)), hi = _mm256_set1_ps(MMOE_FP8_E4M3_MAX);
    const __m256 lo = _mm256_set1_ps(-MMOE_FP8_E4M3_MAX), min_normal = _mm256_set1_ps(0x1p-6f);
    for (int i = 0; i < ACT_BLOCK; i += 8) {
        const __m256 v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(xb + i), s), lo), hi);
        const __m256 mag = _mm256_andnot_ps(sign_mask, v);
        const __m256i u = _mm256_castps_si256(mag);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1));
        const __m256i up = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFFF)), odd);
        const __m256 normal = _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32((int)0xFFF00000u)));
        const __m256 sub = _mm256_mul_ps(
            _mm256_round_ps(_mm256_mul_ps(mag, _mm256_set1_ps(0x1p9f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
            _mm256_set1_ps(0x1p-9f));
        const __m256 r = _mm256_blendv_ps(sub, normal, _mm256_cmp_ps(mag, min_normal, _CMP_GE_OQ));
        const __m256 q = _mm256_or_ps(r, _mm256_and_ps(v, sign_mask));
        _mm256_storeu_pd(xq + i, _mm256_cvtps_pd(_mm256_castps256_ps128(q)));
        _mm256_storeu_pd(xq + i + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(q, 1)));
    }
}

/** Whether the @p n values at @p x are all finite (no NaN, no infinity). */
MMOE_AVX2 static int all_finite_avx2(const float *x, int64_t n)
{
    const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
    __m256i bad = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i e = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), exp_mask);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp_mask));
    }
    int ok = _mm256_testz_si256(bad, bad);
    for (; i < n; i++)
        ok = ok && isfinite(x[i]);
    return ok;
}
#endif

/**
 * Quantize rows [t0, t0+tn) of x to E4M3 values (as doubles) and their fp32 block scales (step 1):
 * mmoe_quant_row_fp8_ue8m0() and the E4M3 table, or, for a row of finite values where @p isa has
 * AVX2, quantize_block_avx2() (the same values; a row with a NaN or an infinity takes the
 * definition).
 */
static mmoe_status quantize_rows(moe_dot_isa isa, const uint16_t *x, int64_t t0, int64_t tn, int64_t K,
                                 float *row_f32, uint8_t *codes, uint8_t *sf, double *xq, float *sx, mmoe_error *err)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const int64_t kb_act = K / ACT_BLOCK;
    for (int64_t t = 0; t < tn; t++) {
        mmoe_bf16_to_f32_row(x + (t0 + t) * K, (size_t)K, row_f32);
#if MMOE_CPU_HAVE_X86
        if (moe_dot_isa_has_avx2(isa) && all_finite_avx2(row_f32, K)) {
            for (int64_t b = 0; b < kb_act; b++)
                quantize_block_avx2(row_f32 + b * ACT_BLOCK, xq + t * K + b * ACT_BLOCK, &sf[b]);
        } else
#endif
        {
            mmoe_status st = mmoe_quant_row_fp8_ue8m0(row_f32, (size_t)K, ACT_BLOCK, MMOE_SF_RULE_V4, codes, sf, err);
            if (st != MMOE_OK)
                return st;
            for (int64_t k = 0; k < K; k++)
                xq[t * K + k] = (double)e4m3[codes[k]];
        }
        for (int64_t b = 0; b < kb_act; b++)
            sx[t * kb_act + b] = fmt_ue8m0_to_f32(sf[b]);
    }
    (void)isa;
    return MMOE_OK;
}

mmoe_status attn_fp8_quantize_rows(moe_dot_isa isa, const uint16_t *x, int64_t T, int64_t K, double *xq, float *sx,
                                   mmoe_error *err)
{
    float *row_f32 = malloc(sizeof(float) * (size_t)K);
    uint8_t *codes = malloc((size_t)K), *sf = malloc((size_t)(K / ACT_BLOCK + 1));
    mmoe_status st = row_f32 && codes && sf ? quantize_rows(isa, x, 0, T, K, row_f32, codes, sf, xq, sx, err)
                                            : mmoe_error_set(err, MMOE_ENOMEM, "fp8 quantize: out of memory (K=%lld)",
                                                             (long long)K);
    free(row_f32);
    free(codes);
    free(sf);
    return st;
}

#if MMOE_CPU_HAVE_X86
/**
 * The exact block partials of @p tn <= ::FP8_REG_MAX_T activation rows (E4M3 values as doubles,
 * xq[t * ldx + k]) against one weight row of codes, in registers: eight codes decoded at a time
 * (mmoe_e4m3_codes_avx2(): the E4M3 values, exactly), widened to double, and every
 * product added by a fused multiply-add in double: each product of two E4M3 values and each
 * partial sum is exact (the file comment's bound), so the partials are the decoded tile's dgemm
 * ones, whatever the order.  partial[t * nkb + kb], block a multiple of 8.
 */
MMOE_AVX2 static void fp8_row_partials_avx2(const double *xq, int64_t ldx, int tn, const uint8_t *wrow, int64_t K,
                                            int block, double *partial, int64_t nkb)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m256 nan_pos = _mm256_set1_ps(e4m3[0x7F]), nan_neg = _mm256_set1_ps(e4m3[0xFF]);
    for (int64_t kb = 0; kb < K / block; kb++) {
        __m256d acc[FP8_REG_MAX_T][2];
        for (int t = 0; t < FP8_REG_MAX_T; t++)
            acc[t][0] = acc[t][1] = _mm256_setzero_pd();
        for (int64_t k = kb * block; k < (kb + 1) * block; k += 8) {
            const __m256 wv = mmoe_e4m3_codes_avx2(wrow + k, nan_pos, nan_neg);
            const __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(wv));
            const __m256d w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(wv, 1));
            _Pragma("GCC unroll 4")
            for (int t = 0; t < FP8_REG_MAX_T; t++) {
                if (t < tn) {
                    acc[t][0] = _mm256_fmadd_pd(_mm256_loadu_pd(xq + t * ldx + k), w0, acc[t][0]);
                    acc[t][1] = _mm256_fmadd_pd(_mm256_loadu_pd(xq + t * ldx + k + 4), w1, acc[t][1]);
                }
            }
        }
        for (int t = 0; t < tn; t++) {
            double v[4];
            _mm256_storeu_pd(v, _mm256_add_pd(acc[t][0], acc[t][1]));
            partial[t * nkb + kb] = (v[0] + v[1]) + (v[2] + v[3]);
        }
    }
}

/**
 * fp8_row_partials_avx2() sixteen codes at a time, eight doubles a register; block a multiple of
 * 16.  The codes are decoded as their values times 2^-8 (mmoe_e4m3_codes_x256th_avx512()), so
 * every product and sum is 2^-8 times the exact one (each product still exact, each sum a
 * multiple of 2^-26 below 2^17: exact), and the partial is multiplied by 2^8 (exact).  The
 * partials are exact, so the wider sums change no bit.
 */
MMOE_AVX512 static void fp8_row_partials_avx512(const double *xq, int64_t ldx, int tn, const uint8_t *wrow,
                                                int64_t K, int block, double *partial, int64_t nkb)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m512 nan_pos = _mm512_set1_ps(e4m3[0x7F]), nan_neg = _mm512_set1_ps(e4m3[0xFF]);
    for (int64_t kb = 0; kb < K / block; kb++) {
        __m512d acc[FP8_REG_MAX_T][2];
        for (int t = 0; t < FP8_REG_MAX_T; t++)
            acc[t][0] = acc[t][1] = _mm512_setzero_pd();
        for (int64_t k = kb * block; k < (kb + 1) * block; k += 16) {
            const __m512 wv = mmoe_e4m3_codes_x256th_avx512(wrow + k, nan_pos, nan_neg);
            const __m512d w0 = _mm512_cvtps_pd(_mm512_castps512_ps256(wv));
            const __m512d w1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wv), 1)));
            _Pragma("GCC unroll 4")
            for (int t = 0; t < FP8_REG_MAX_T; t++) {
                if (t < tn) {
                    acc[t][0] = _mm512_fmadd_pd(_mm512_loadu_pd(xq + t * ldx + k), w0, acc[t][0]);
                    acc[t][1] = _mm512_fmadd_pd(_mm512_loadu_pd(xq + t * ldx + k + 8), w1, acc[t][1]);
                }
            }
        }
        for (int t = 0; t < tn; t++)
            partial[t * nkb + kb] = 0x1p8 * _mm512_reduce_add_pd(_mm512_add_pd(acc[t][0], acc[t][1]));
    }
}
#endif

/** Whether the register kernel of @p isa serves @p tn rows with weight blocks of @p block. */
static int fp8_in_registers(moe_dot_isa isa, int64_t tn, int block)
{
    return MMOE_CPU_HAVE_X86 && moe_dot_isa_has_avx2(isa) && tn <= FP8_REG_MAX_T && block % 8 == 0;
}

/** One step of the scaled accumulation (step 3): @p acc plus the fp32 partial times s_x * s_w. */
static inline float fp8_scaled_add(float acc, double partial, float s_x, uint8_t sw_byte)
{
    const float s = s_x * fmt_ue8m0_to_f32(sw_byte);
    return acc + (float)partial * s;
}

#if MMOE_CPU_HAVE_X86
/** Step 3 for one output: the partials of K blocks 0 .. nkb - 1 in ascending order (the register path's). */
static float fp8_accumulate(const double *partial, int64_t nkb, const float *sx_row, const uint8_t *sw_row, int block)
{
    float acc = 0.0f;
    for (int64_t kb = 0; kb < nkb; kb++)
        acc = fp8_scaled_add(acc, partial[kb], sx_row[kb * block / ACT_BLOCK], sw_row[kb]);
    return acc;
}
#endif

/** One chunk of rows of x, shared by the threads that take W's rows (the register path or the tile path). */
typedef struct {
    moe_dot_isa isa;   /**< the tile path's conversion and step 3 kernels */
    const double *xq;  /**< [tn, K] E4M3 values */
    const float *sx;   /**< [tn, K / 128] their scales */
    int64_t t0;        /**< the chunk's first row of y */
    int64_t tn;        /**< its rows */
    int64_t K;         /**< the weight's width */
    int64_t N;         /**< its rows */
    const uint8_t *wb; /**< the weight's codes [N, K] */
    const uint8_t *sb; /**< its scale bytes */
    int64_t sw_cols;   /**< scale bytes per scale row */
    int block;         /**< the weight's block edge */
    double *wd;        /**< tile path, per thread: ATTN_FP8_TILE_N * block doubles */
    double *partial;   /**< per thread: FP8_REG_MAX_T * K / block doubles (registers), tn * ATTN_FP8_TILE_N (tiles) */
    float *acc;        /**< tile path, per thread: tn * ATTN_FP8_TILE_N floats */
    uint16_t *y;       /**< [T, N] */
} fp8_job;

/** moe_rows_fn of the register path: outputs of W's rows [n0, n1) for the chunk's rows. */
static void fp8_rows_in_registers(void *ctx, int thread, int64_t n0, int64_t n1)
{
#if MMOE_CPU_HAVE_X86
    const fp8_job *j = ctx;
    const int64_t nkb = j->K / j->block, kb_act = j->K / ACT_BLOCK;
    double *partial = j->partial + (int64_t)thread * FP8_REG_MAX_T * nkb;
    const int wide = j->isa == MOE_DOT_ISA_AVX512 && j->block % 16 == 0;
    for (int64_t n = n0; n < n1; n++) {
        if (wide)
            fp8_row_partials_avx512(j->xq, j->K, (int)j->tn, j->wb + n * j->K, j->K, j->block, partial, nkb);
        else
            fp8_row_partials_avx2(j->xq, j->K, (int)j->tn, j->wb + n * j->K, j->K, j->block, partial, nkb);
        for (int64_t t = 0; t < j->tn; t++)
            j->y[(j->t0 + t) * j->N + n] = mmoe_bf16_from_f32(fp8_accumulate(
                partial + t * nkb, nkb, j->sx + t * kb_act, j->sb + (n / j->block) * j->sw_cols, j->block));
    }
#else
    (void)ctx, (void)thread, (void)n0, (void)n1;
#endif
}

#if MMOE_CPU_HAVE_X86
/** fp8_block_to_f64() in AVX2 registers (block a multiple of 8). */
MMOE_AVX2 static void fp8_block_to_f64_avx2(const uint8_t *wb, int64_t K, int64_t n0, int64_t nn, int64_t k0,
                                            int block, double *wd)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m256 nan_pos = _mm256_set1_ps(e4m3[0x7F]), nan_neg = _mm256_set1_ps(e4m3[0xFF]);
    for (int64_t n = 0; n < nn; n++) {
        const uint8_t *c = wb + (n0 + n) * K + k0;
        double *o = wd + n * block;
        for (int j = 0; j < block; j += 8) {
            const __m256 v = mmoe_e4m3_codes_avx2(c + j, nan_pos, nan_neg);
            _mm256_storeu_pd(o + j, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            _mm256_storeu_pd(o + j + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        }
    }
}

/** fp8_block_to_f64() with AVX-512, sixteen codes at a time (mmoe_e4m3_lanes_avx512(); block a multiple of 16). */
MMOE_AVX512 static void fp8_block_to_f64_avx512(const uint8_t *wb, int64_t K, int64_t n0, int64_t nn, int64_t k0,
                                                int block, double *wd)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m512 nan_pos = _mm512_set1_ps(e4m3[0x7F]), nan_neg = _mm512_set1_ps(e4m3[0xFF]);
    for (int64_t n = 0; n < nn; n++) {
        const uint8_t *c = wb + (n0 + n) * K + k0;
        double *o = wd + n * block;
        for (int j = 0; j < block; j += 16) {
            const __m512 v = mmoe_e4m3_lanes_avx512(
                _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(c + j))), nan_pos, nan_neg);
            _mm512_storeu_pd(o + j, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
            _mm512_storeu_pd(o + j + 8, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
        }
    }
}

/**
 * Step 3 for one x row and one K block over @p nn outputs that share the weight scale byte
 * @p sw_byte: acc[n] = fp8_scaled_add(acc[n], partial[n], s_x, sw_byte), eight outputs at a time
 * with fp8_scaled_add()'s operations (the fp32 scale product, the partial rounded to fp32, the
 * product, then the sum: two roundings, no fused step).
 */
MMOE_AVX2 static void fp8_scaled_add_row_avx2(float *acc, const double *partial, int64_t nn, float s_x, uint8_t sw_byte)
{
    const float s = s_x * fmt_ue8m0_to_f32(sw_byte);
    const __m256 sv = _mm256_set1_ps(s);
    int64_t n = 0;
    for (; n + 8 <= nn; n += 8) {
        const __m256 p = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(partial + n + 4)),
                                         _mm256_cvtpd_ps(_mm256_loadu_pd(partial + n)));
        _mm256_storeu_ps(acc + n, _mm256_add_ps(_mm256_loadu_ps(acc + n), _mm256_mul_ps(p, sv)));
    }
    for (; n < nn; n++)
        acc[n] = fp8_scaled_add(acc[n], partial[n], s_x, sw_byte);
}
#endif

/**
 * Rows n0 .. n0 + nn - 1 of the weight's codes (row stride K), columns k0 .. k0 + block - 1, as
 * doubles into wd[n * block + j]: the E4M3 values, exactly (sixteen at a time in AVX-512
 * registers or eight in AVX2 ones where @p isa has them and the block is a multiple of 16 or 8,
 * else the table).
 */
static void fp8_block_to_f64(moe_dot_isa isa, const uint8_t *wb, int64_t K, int64_t n0, int64_t nn, int64_t k0,
                             int block, double *wd)
{
#if MMOE_CPU_HAVE_X86
    if (isa == MOE_DOT_ISA_AVX512 && block % 16 == 0) {
        fp8_block_to_f64_avx512(wb, K, n0, nn, k0, block, wd);
        return;
    }
    if (moe_dot_isa_has_avx2(isa) && block % 8 == 0) {
        fp8_block_to_f64_avx2(wb, K, n0, nn, k0, block, wd);
        return;
    }
#endif
    const float *e4m3 = mmoe_fp8_e4m3_table();
    for (int64_t n = 0; n < nn; n++)
        for (int j = 0; j < block; j++)
            wd[n * block + j] = (double)e4m3[wb[(n0 + n) * K + k0 + j]];
}

/**
 * Step 3 for one x row and one K block over outputs n0 .. n0 + nn - 1 (acc and partial indexed
 * from n0): the outputs of one weight row block share a scale, so each run of them is one call
 * of the vector step where @p isa has it.
 */
static void fp8_scaled_add_row(moe_dot_isa isa, float *acc, const double *partial, int64_t n0, int64_t nn, float s_x,
                               const uint8_t *sb_col, int64_t sw_cols, int block)
{
    for (int64_t a = 0; a < nn;) {
        const int64_t rb = (n0 + a) / block;
        const int64_t b = (rb + 1) * block - n0 < nn ? (rb + 1) * block - n0 : nn;
        const uint8_t sw = sb_col[rb * sw_cols];
#if MMOE_CPU_HAVE_X86
        if (moe_dot_isa_has_avx2(isa)) {
            fp8_scaled_add_row_avx2(acc + a, partial + a, b - a, s_x, sw);
            a = b;
            continue;
        }
#endif
        for (; a < b; a++)
            acc[a] = fp8_scaled_add(acc[a], partial[a], s_x, sw);
    }
}

/** moe_rows_fn of the tile path: outputs of W's rows [n0, n1) for the chunk's rows, a tile at a time. */
static void fp8_rows_in_tiles(void *ctx, int thread, int64_t r0, int64_t r1)
{
    const fp8_job *j = ctx;
    const int64_t tn = j->tn, kb_act = j->K / ACT_BLOCK, kb_w = j->K / j->block;
    double *wd = j->wd + (int64_t)thread * ATTN_FP8_TILE_N * j->block;
    double *partial = j->partial + (int64_t)thread * tn * ATTN_FP8_TILE_N;
    float *acc = j->acc + (int64_t)thread * tn * ATTN_FP8_TILE_N;
    for (int64_t n0 = r0; n0 < r1; n0 += ATTN_FP8_TILE_N) {
        const int64_t nn = (r1 - n0) < ATTN_FP8_TILE_N ? (r1 - n0) : ATTN_FP8_TILE_N;
        memset(acc, 0, sizeof(float) * (size_t)(tn * nn));
        for (int64_t kb = 0; kb < kb_w; kb++) {
            fp8_block_to_f64(j->isa, j->wb, j->K, n0, nn, kb * j->block, j->block, wd);
            /* exact: see the file comment */
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tn, (int)nn, j->block, 1.0,
                        j->xq + kb * j->block, (int)j->K, wd, j->block, 0.0, partial, (int)nn);
            const int64_t kact = kb * j->block / ACT_BLOCK;
            for (int64_t t = 0; t < tn; t++)
                fp8_scaled_add_row(j->isa, acc + t * nn, partial + t * nn, n0, nn, j->sx[t * kb_act + kact],
                                   j->sb + kb, j->sw_cols, j->block);
        }
        for (int64_t t = 0; t < tn; t++)
            mmoe_bf16_from_f32_row(acc + t * nn, (size_t)nn, j->y + (j->t0 + t) * j->N + n0);
    }
}

/**
 * Whether the tile path shares its tiles out over @p pool: only where OpenBLAS runs one thread
 * (the command line's setting, cli_util.c), so that each dgemm runs on the thread that calls it.
 * With more OpenBLAS threads, OpenBLAS shares out each dgemm instead and the tiles stay on the
 * caller: two sets of threads taking turns on the same cores lose more than they gain (on the
 * 2-core development VM a 64-token V4-Flash-width prefill took 3.0-3.8 s with both, 2.4-2.5 s
 * with the tiles on the pool and OpenBLAS on one thread).  The bits are the same either way.
 */
static int fp8_tiles_on_pool(const moe_dequant_pool *pool)
{
    return moe_dequant_pool_threads(pool) > 1 && openblas_get_num_threads() == 1;
}

mmoe_status attn_linear_fp8(moe_dequant_pool *pool, moe_dot_isa isa, const uint16_t *x, int64_t T,
                            const mmoe_tensor *w, const mmoe_tensor *scale, int block, uint16_t *y, mmoe_error *err)
{
    if (w->ndim != 2)
        return mmoe_error_set(err, MMOE_ESHAPE, "linear: FP8 weight must be 2-D, found %d-D", w->ndim);
    const int64_t N = w->shape[0], K = w->shape[1];
    mmoe_status st = mmoe_linear_fp8_check(w, scale, N, K, block, "fp8 linear", err);
    if (st != MMOE_OK)
        return st;
    if (T <= 0)
        return MMOE_OK;

    const int64_t kb_act = K / ACT_BLOCK, kb_w = K / block, sw_cols = scale->shape[1];
    const int64_t tt = T < ATTN_FP8_TILE_T ? T : ATTN_FP8_TILE_T;
    const int threads = moe_dequant_pool_threads(pool);
    const int64_t pn = tt * ATTN_FP8_TILE_N > FP8_REG_MAX_T * kb_w ? tt * ATTN_FP8_TILE_N : FP8_REG_MAX_T * kb_w;
    float *row_f32 = malloc(sizeof(float) * (size_t)K);
    uint8_t *codes = malloc((size_t)K);
    uint8_t *sf = malloc((size_t)kb_act);
    double *xq = malloc(sizeof(double) * (size_t)(tt * K));
    float *sx = malloc(sizeof(float) * (size_t)(tt * kb_act));
    double *wd = malloc(sizeof(double) * (size_t)(threads * ATTN_FP8_TILE_N * block));
    double *partial = malloc(sizeof(double) * (size_t)(threads * pn));
    float *acc = malloc(sizeof(float) * (size_t)(threads * tt * ATTN_FP8_TILE_N));
    if (!row_f32 || !codes || !sf || !xq || !sx || !wd || !partial || !acc) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "linear: out of memory (K=%lld, N=%lld)", (long long)K,
                            (long long)N);
        goto done;
    }
    const uint8_t *wb = (const uint8_t *)w->data;
    const uint8_t *sb = (const uint8_t *)scale->data;

    for (int64_t t0 = 0; t0 < T; t0 += tt) {
        const int64_t tn = (T - t0) < tt ? (T - t0) : tt;
        st = quantize_rows(isa, x, t0, tn, K, row_f32, codes, sf, xq, sx, err);
        if (st != MMOE_OK)
            goto done;
        if (fp8_in_registers(isa, tn, block)) {
            fp8_job j = {isa, xq, sx, t0, tn, K, N, wb, sb, sw_cols, block, NULL, partial, NULL, y};
            moe_pool_rows(pool, N, K * tn, 1, fp8_rows_in_registers, &j);
            continue;
        }
        fp8_job j = {isa, xq, sx, t0, tn, K, N, wb, sb, sw_cols, block, wd, partial, acc, y};
        moe_pool_rows(fp8_tiles_on_pool(pool) ? pool : NULL, N, K * tn, ATTN_FP8_TILE_N, fp8_rows_in_tiles, &j);
    }
    st = MMOE_OK;
done:
    free(row_f32);
    free(codes);
    free(sf);
    free(xq);
    free(sx);
    free(wd);
    free(partial);
    free(acc);
    return st;
}

mmoe_status mmoe_linear_fp8(const uint16_t *x, int64_t T, const mmoe_tensor *w, const mmoe_tensor *scale, int block,
                            uint16_t *y, mmoe_error *err)
{
    return attn_linear_fp8(NULL, moe_dot_isa_best(), x, T, w, scale, block, y, err);
}
