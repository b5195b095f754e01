/**
 * @file test_moe_dequant.c
 * @brief The threaded weight-tile dequantization (moe_dequant_pool.c) is bit-identical to the
 *        single-threaded one and to the scalar formulas of the formats, for odd sizes.
 *
 * Dequantization is exact, so there is no tolerance anywhere here: every float is compared by
 * its bits.  The golden values come from the formats' definitions written out below in double
 * precision (E2M1: sign, 2-bit exponent with bias 1, 1-bit mantissa, subnormal at exponent 0;
 * E4M3: bias 7, subnormal at exponent 0; UE8M0: 2^(b-127); BF16: the high half of an FP32), not
 * from the decoders under test.  A product code x scale has at most 4 + 24 significant bits, so it
 * is exact in double and rounds once to float: (float)(x * s) is fl(x * s), the oracle's rule
 * for F32 block scales, and exact for power-of-two scales.
 *
 * Shapes are random with the seed printed: row counts from 1 (fewer grabs than threads) to a
 * few hundred, FP8 column counts and scale blocks odd, several chunks per job,
 * thread counts 1 to 5, jobs above and below the pool's parallel threshold.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "moe_internal.h"

static uint64_t g_seed;

/* ------------------------------------------------------------------ the formulas (double) */

/** E2M1 code (0..15) by its definition. */
static double e2m1_value(unsigned code)
{
    const double sign = (code & 8u) ? -1.0 : 1.0;
    const unsigned e = (code >> 1) & 3u, m = code & 1u;
    if (e == 0)
        return sign * 0.5 * m; /* subnormal: m * 2^(1-1) * 2^-1 */
    return sign * ldexp(1.0 + 0.5 * m, (int)e - 1);
}

/** E4M3 (OCP, no infinities; 0x7F/0xFF are NaN and not generated) by its definition. */
static double e4m3_value(unsigned b)
{
    const double sign = (b & 0x80u) ? -1.0 : 1.0;
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    if (e == 0)
        return sign * ldexp(m / 8.0, -6);
    return sign * ldexp(1.0 + m / 8.0, (int)e - 7);
}

/** UE8M0 byte (0..254) by its definition. */
static double ue8m0_value(unsigned b)
{
    return ldexp(1.0, (int)b - 127);
}

/** The scalar formula for weight (r, c) of @p m. */
static float weight_formula(const moe_mat *m, int64_t r, int64_t c)
{
    if (m->fmt == MOE_W_BF16) {
        uint16_t h;
        memcpy(&h, m->w + 2 * (r * m->cols + c), 2);
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    if (m->fmt == MOE_W_FP4) {
        const uint8_t byte = m->w[r * (m->cols / 2) + c / 2];
        const unsigned code = (c % 2 == 0) ? (byte & 15u) : (byte >> 4);
        const uint8_t sb = ((const uint8_t *)m->sf)[r * m->sf_cols + c / 32];
        return (float)(e2m1_value(code) * ue8m0_value(sb));
    }
    const int64_t si = (r / m->block_n) * m->sf_cols + c / m->block_k;
    const double s = m->sf_f32 ? (double)((const float *)m->sf)[si] : ue8m0_value(((const uint8_t *)m->sf)[si]);
    return (float)(e4m3_value(m->w[r * m->cols + c]) * s);
}

/* ------------------------------------------------------------------ random matrices */

/** A random matrix and its buffers. */
typedef struct rand_mat {
    moe_mat m;   /**< the view */
    uint8_t *w;  /**< codes */
    void *sf;    /**< scales */
} rand_mat;

/** Random @p fmt matrix [rows, cols]; FP8 scale blocks block_n x block_k, F32 scales if @p sf_f32. */
static void rand_mat_make(rand_mat *rm, mmoe_rng *rng, moe_wfmt fmt, int64_t rows, int64_t cols, int64_t block_n,
                          int64_t block_k, int sf_f32)
{
    moe_mat *m = &rm->m;
    *m = (moe_mat){.fmt = fmt, .rows = rows, .cols = cols};
    size_t wb = fmt == MOE_W_FP4 ? (size_t)(rows * cols / 2) : (size_t)(rows * cols) * (fmt == MOE_W_BF16 ? 2 : 1);
    rm->w = malloc(wb);
    ck_assert_ptr_nonnull(rm->w);
    for (size_t i = 0; i < wb; i++)
        rm->w[i] = (uint8_t)mmoe_rng_u32(rng);
    if (fmt == MOE_W_FP8)
        for (size_t i = 0; i < wb; i++)
            if ((rm->w[i] & 0x7Fu) == 0x7Fu)
                rm->w[i] ^= 1u; /* no NaN codes */
    if (fmt == MOE_W_BF16)
        for (size_t i = 1; i < wb; i += 2)
            if ((rm->w[i] & 0x7Fu) == 0x7Fu)
                rm->w[i] ^= 0x01u; /* keep the exponent off all-ones (no Inf/NaN) */
    m->w = rm->w;
    m->w_bytes = wb;
    if (fmt == MOE_W_FP4) {
        m->block_n = 1;
        m->block_k = 32;
    } else if (fmt == MOE_W_BF16) {
        m->block_n = 1; /* no scales; one dummy byte per row keeps the code uniform */
        m->block_k = cols;
    } else {
        m->block_n = block_n;
        m->block_k = block_k;
    }
    m->sf_rows = moe_ceil_div(rows, m->block_n);
    m->sf_cols = moe_ceil_div(cols, m->block_k);
    const size_t ns = (size_t)(m->sf_rows * m->sf_cols);
    m->sf_f32 = fmt == MOE_W_FP8 && sf_f32;
    if (m->sf_f32) {
        float *s = malloc(ns * sizeof(float));
        ck_assert_ptr_nonnull(s);
        for (size_t i = 0; i < ns; i++)
            s[i] = (float)(0.001 + mmoe_rng_uniform(rng)); /* not powers of two: fl(w * s) rounds */
        rm->sf = s;
    } else {
        uint8_t *s = malloc(ns);
        ck_assert_ptr_nonnull(s);
        for (size_t i = 0; i < ns; i++)
            s[i] = (uint8_t)mmoe_rng_below(rng, 255); /* 0..254, extremes included */
        if (ns > 1) {
            s[0] = 0;
            s[ns - 1] = 254;
        }
        rm->sf = s;
    }
    m->sf = rm->sf;
}

static void rand_mat_free(rand_mat *rm)
{
    free(rm->w);
    free(rm->sf);
}

/* ------------------------------------------------------------------ one job, all thread counts */

/** A tile-decoding job for moe_pool_rows(): rows [r0, r0 + nr) of columns [c0, c0 + nc) as tiles of chunk. */
typedef struct tile_job {
    const moe_mat *m; /**< the matrix */
    int64_t r0;       /**< first row */
    int64_t nr;       /**< rows */
    int64_t c0;       /**< first column */
    int64_t nc;       /**< columns (a multiple of chunk) */
    int64_t chunk;    /**< columns per tile */
    float *out;       /**< nc / chunk tiles of [nr, chunk], tile t at out + t * nr * chunk */
} tile_job;

/** moe_rows_fn: decode rows [a, b) of the job into every tile (thread index unused). */
static void tile_job_rows(void *ctx, int thread, int64_t a, int64_t b)
{
    (void)thread;
    const tile_job *j = ctx;
    for (int64_t t = 0; t < j->nc / j->chunk; t++)
        moe_weight_tile_f32(j->m, j->r0 + a, b - a, j->c0 + t * j->chunk, j->chunk,
                            j->out + t * j->nr * j->chunk + a * j->chunk);
}

/**
 * Dequantize W[r0 : r0+nr, c0 : c0+nc] as tiles of @p chunk columns, the rows shared out by a
 * pool of every thread count 1..5 (and a NULL pool), and compare to the per-tile
 * single-threaded decoder and to the formula: the pool's grabs cover every row once, whoever
 * takes them.
 */
static void check_job(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t chunk)
{
    const size_t n = (size_t)(nr * nc);
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    ck_assert(ref != NULL && got != NULL);
    /* reference 1: the scalar formula, in the job's tile layout */
    for (int64_t t = 0; t < nc / chunk; t++)
        for (int64_t r = 0; r < nr; r++)
            for (int64_t j = 0; j < chunk; j++)
                ref[t * nr * chunk + r * chunk + j] = weight_formula(m, r0 + r, c0 + t * chunk + j);
    /* reference 2: the single-threaded tile decoder, tile by tile, with every variant that runs here */
    for (int isa = 0; isa < MOE_DOT_ISA_COUNT; isa++)
        for (int64_t t = 0; t < nc / chunk && moe_dot_isa_runs_here((moe_dot_isa)isa); t++) {
            mmoe_test_poison_f32(got, (size_t)(nr * chunk));
            moe_weight_tile_f32_isa((moe_dot_isa)isa, m, r0, nr, c0 + t * chunk, chunk, got);
            ck_assert_msg(memcmp(got, ref + t * nr * chunk, (size_t)(nr * chunk) * sizeof(float)) == 0,
                          "%s: single-threaded tile %lld differs from the formula (fmt %d, rows %lld+%lld, "
                          "cols %lld+%lld)",
                          moe_dot_isa_name((moe_dot_isa)isa), (long long)t, (int)m->fmt, (long long)r0, (long long)nr,
                          (long long)c0, (long long)nc);
        }
    tile_job job = {.m = m, .r0 = r0, .nr = nr, .c0 = c0, .nc = nc, .chunk = chunk, .out = got};
    mmoe_test_poison_f32(got, n);
    moe_pool_rows(NULL, nr, nc, 1, tile_job_rows, &job);
    ck_assert(memcmp(got, ref, n * sizeof(float)) == 0);
    for (int threads = 1; threads <= 5; threads++) {
        moe_dequant_pool *pool;
        mmoe_error err;
        ck_assert_int_eq(moe_dequant_pool_create(threads, &pool, &err), MMOE_OK);
        ck_assert_int_eq(moe_dequant_pool_threads(pool), threads);
        for (int rep = 0; rep < 3; rep++) { /* a pool is reused across jobs */
            mmoe_test_poison_f32(got, n);
            moe_pool_rows(pool, nr, nc, 1, tile_job_rows, &job);
            ck_assert_msg(memcmp(got, ref, n * sizeof(float)) == 0,
                          "%d threads differ (fmt %d, rows %lld+%lld, cols %lld+%lld, chunk %lld, rep %d)", threads,
                          (int)m->fmt, (long long)r0, (long long)nr, (long long)c0, (long long)nc, (long long)chunk,
                          rep);
        }
        moe_dequant_pool_release(pool);
    }
    free(ref);
    free(got);
}

/* ------------------------------------------------------------------ tests */

START_TEST(fp4_threads_bit_identical)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 1);
    for (int it = 0; it < 6; it++) {
        const int64_t rows = 1 + (int64_t)mmoe_rng_below(&rng, 300), groups = 1 + (int64_t)mmoe_rng_below(&rng, 24);
        rand_mat rm;
        rand_mat_make(&rm, &rng, MOE_W_FP4, rows, 32 * groups, 0, 0, 0);
        const int64_t r0 = (int64_t)mmoe_rng_below(&rng, (uint64_t)rows), nr = rows - r0;
        const int64_t g0 = (int64_t)mmoe_rng_below(&rng, (uint64_t)groups), ng = groups - g0;
        /* chunk: a divisor of the job's groups */
        int64_t cg = 1 + (int64_t)mmoe_rng_below(&rng, (uint64_t)ng);
        while (ng % cg != 0)
            cg--;
        check_job(&rm.m, r0, nr, 32 * g0, 32 * ng, 32 * cg);
        rand_mat_free(&rm);
    }
    /* a job above the parallel threshold with fewer rows (grabs) than threads */
    rand_mat rm;
    rand_mat_make(&rm, &rng, MOE_W_FP4, 3, 8192, 0, 0, 0);
    check_job(&rm.m, 0, 3, 0, 8192, 8192);
    rand_mat_free(&rm);
    /* the L2 form: one 256-row tile, K in chunks of 128 */
    rand_mat_make(&rm, &rng, MOE_W_FP4, 259, 640, 0, 0, 0);
    check_job(&rm.m, 0, 256, 0, 640, 128);
    check_job(&rm.m, 256, 3, 0, 640, 128);
    rand_mat_free(&rm);
}
END_TEST

/**
 * The few-token GEMM of FP4 and FP8 weights decoded in registers, with its rows split over a
 * pool (moe_pool_gemm_coded()), against the same kernel on one thread over all rows
 * (moe_dot_gemm_coded()), bit for bit, for thread counts 1 to 5 and a NULL pool: rows from one
 * to several grabs (and not a multiple of a grab), 1 to 4 tokens, leading dimensions wider than
 * the rows and columns.
 */
START_TEST(coded_gemm_threads_bit_identical)
{
    const moe_dot_isa isa = moe_dot_isa_best();
    if (isa == MOE_DOT_ISA_GENERIC)
        return; /* the layer takes the tiled path there; the pooled GEMM needs an FMA kernel */
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 7);
    for (int it = 0; it < 8; it++) {
        const int64_t groups = 1 + (int64_t)mmoe_rng_below(&rng, 24), cols = 32 * groups;
        const int64_t rows = it == 0 ? 1 : 1 + (int64_t)mmoe_rng_below(&rng, 900);
        const int64_t tokens = 1 + (int64_t)mmoe_rng_below(&rng, 4), lda = cols + 8, ldc = rows + 3;
        const int fp8 = it % 2;
        rand_mat rm;
        rand_mat_make(&rm, &rng, fp8 ? MOE_W_FP8 : MOE_W_FP4, rows, cols, 1 + it % 3, 32, it % 4 == 3);
        ck_assert(moe_dot_coded_in_registers(isa, &rm.m));
        if (!rm.m.sf_f32)
            for (size_t i = 0; i < (size_t)(rm.m.sf_rows * rm.m.sf_cols); i++)
                ((uint8_t *)rm.sf)[i] = (uint8_t)(120 + mmoe_rng_below(&rng, 10)); /* finite products */
        float *a = malloc((size_t)(tokens * lda) * sizeof(float));
        float *ref = malloc((size_t)(tokens * ldc) * sizeof(float));
        float *got = malloc((size_t)(tokens * ldc) * sizeof(float));
        ck_assert(a != NULL && ref != NULL && got != NULL);
        for (int64_t i = 0; i < tokens * lda; i++)
            a[i] = (float)mmoe_rng_normal(&rng);
        mmoe_test_poison_f32(ref, (size_t)(tokens * ldc));
        ck_assert_int_eq(moe_dot_gemm_coded(isa, a, lda, tokens, &rm.m, 0, rows, ref, ldc), 0);
        for (int threads = 0; threads <= 5; threads++) { /* 0: no pool */
            moe_dequant_pool *pool = NULL;
            mmoe_error err;
            if (threads > 0)
                ck_assert_int_eq(moe_dequant_pool_create(threads, &pool, &err), MMOE_OK);
            for (int rep = 0; rep < 2; rep++) {
                mmoe_test_poison_f32(got, (size_t)(tokens * ldc));
                moe_pool_gemm_coded(pool, isa, a, lda, tokens, &rm.m, got, ldc);
                for (int64_t t = 0; t < tokens; t++)
                    ck_assert_msg(memcmp(got + t * ldc, ref + t * ldc, (size_t)rows * sizeof(float)) == 0,
                                  "seed %llu: %s, %d threads, token %lld of %lld differs (rows %lld, cols %lld, "
                                  "rep %d)",
                                  (unsigned long long)g_seed, fp8 ? "fp8" : "fp4", threads, (long long)t,
                                  (long long)tokens, (long long)rows, (long long)cols, rep);
            }
            moe_dequant_pool_release(pool);
        }
        free(a);
        free(ref);
        free(got);
        rand_mat_free(&rm);
    }
}
END_TEST

START_TEST(fp8_threads_bit_identical)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 2 + (uint64_t)_i);
    static const int64_t blocks[4] = {1, 3, 32, 128};
    for (int it = 0; it < 6; it++) {
        const int64_t rows = 1 + (int64_t)mmoe_rng_below(&rng, 300), cols = 1 + (int64_t)mmoe_rng_below(&rng, 700);
        rand_mat rm;
        rand_mat_make(&rm, &rng, MOE_W_FP8, rows, cols, blocks[mmoe_rng_below(&rng, 4)],
                      blocks[mmoe_rng_below(&rng, 4)], _i);
        const int64_t r0 = (int64_t)mmoe_rng_below(&rng, (uint64_t)rows), nr = rows - r0;
        const int64_t c0 = (int64_t)mmoe_rng_below(&rng, (uint64_t)cols), nc = cols - c0;
        int64_t chunk = 1 + (int64_t)mmoe_rng_below(&rng, (uint64_t)nc);
        while (nc % chunk != 0)
            chunk--;
        check_job(&rm.m, r0, nr, c0, nc, chunk);
        rand_mat_free(&rm);
    }
}
END_TEST

START_TEST(bf16_threads_bit_identical)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 5);
    rand_mat rm;
    rand_mat_make(&rm, &rng, MOE_W_BF16, 131, 257, 0, 0, 0);
    check_job(&rm.m, 1, 129, 0, 257, 257);
    rand_mat_free(&rm);
}
END_TEST

START_TEST(thread_count_from_environment)
{
    mmoe_error err;
    int n = 0;
    unsetenv("MMOE_DEQUANT_THREADS");
    ck_assert_int_eq(moe_dequant_threads_from_env(&n, &err), MMOE_OK);
    ck_assert(n >= 1 && n <= MOE_DEQUANT_DEFAULT_CAP);
    setenv("MMOE_DEQUANT_THREADS", "3", 1);
    ck_assert_int_eq(moe_dequant_threads_from_env(&n, &err), MMOE_OK);
    ck_assert_int_eq(n, 3);
    static const char *const bad[4] = {"0", "abc", "2x", "65"};
    for (int i = 0; i < 4; i++) {
        setenv("MMOE_DEQUANT_THREADS", bad[i], 1);
        ck_assert_int_eq(moe_dequant_threads_from_env(&n, &err), MMOE_EINVAL);
        ck_assert_msg(strstr(err.msg, "MMOE_DEQUANT_THREADS") != NULL, "message: %s", err.msg);
    }
    /* the layer refuses to start with a bad value, naming the variable */
    mmoe_moe_desc d;
    ck_assert_int_eq(mmoe_moe_desc_from_shape("tiny", 0, &d, &err), MMOE_OK);
    mmoe_moe_layer *layer = NULL;
    setenv("MMOE_DEQUANT_THREADS", "abc", 1);
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &layer, &err), MMOE_EINVAL);
    ck_assert_ptr_null(layer);
    ck_assert(strstr(err.msg, "MMOE_DEQUANT_THREADS") != NULL);
    setenv("MMOE_DEQUANT_THREADS", "2", 1);
    ck_assert_int_eq(mmoe_moe_layer_create(&d, &layer, &err), MMOE_OK);
    mmoe_moe_layer_destroy(layer);
    unsetenv("MMOE_DEQUANT_THREADS");
}
END_TEST

static Suite *dequant_suite(void)
{
    Suite *s = suite_create("moe_dequant");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fp4_threads_bit_identical);
    tcase_add_test(tc, coded_gemm_threads_bit_identical);
    tcase_add_loop_test(tc, fp8_threads_bit_identical, 0, 2);
    tcase_add_test(tc, bf16_threads_bit_identical);
    tcase_add_test(tc, thread_count_from_environment);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("moe_dequant");
    return mmoe_test_run(dequant_suite());
}
