/**
 * @file test_formats_quant.c
 * @brief Suite "formats_quant": the row quantizers and dequantizers (fmt_quant.c) against a
 *        scalar reference written here.
 *
 * The reference follows the scale rules of docs/spec/formats.md in
 * double precision: the amax in double, the power-of-two ceiling from frexp, the element
 * rounding from the brute-force nearest-even oracle of fmt_oracle.h, the FP4 and E4M3 values
 * from their field formulas.  Where a rule is defined by an fp32 operation (fl(a/448),
 * a * fl(1/448), x * fl(1/sf)), the reference performs that one fp32 operation too: it is
 * the definition, not an implementation detail.  Every comparison is bit exact.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_oracle.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

#define N_ROWS 300
#define K_MAX 1024

static fmt_oracle e4m3_o, e2m1_o;

static void init_oracles(void)
{
    oracle_init(&e4m3_o, 0x7E, 3, 7);
    oracle_init(&e2m1_o, 7, 1, 1);
}

/* E4M3 SATFINITE code of x (finite or not), from the oracle. */
static uint8_t ref_e4m3(double x)
{
    if (isnan(x))
        return 0x7F;
    int c = isinf(x) ? 0x7F : oracle_nearest(&e4m3_o, fabs(x));
    if (c > 0x7E)
        c = 0x7E;
    return (uint8_t)((signbit(x) ? 0x80 : 0) | c);
}

static double ref_e4m3_value(uint8_t b)
{
    double v = oracle_minifloat_value(b & 0x7F, 3, 7);
    return (b & 0x80) ? -v : v;
}

static uint8_t ref_e2m1(double x, int ties_down)
{
    double a = fabs(x);
    int c;
    if (!ties_down) {
        c = oracle_nearest(&e2m1_o, a);
        c = c > 7 ? 7 : c;
        return (uint8_t)((signbit(x) ? 8 : 0) | c);
    }
    /* DeepGEMM: nearest, ties to the LOWER code (strict <), saturating */
    c = 0;
    if (a >= e2m1_o.value[7])
        c = 7;
    else
        for (int j = 1; j <= 7; j++)
            if (fabs(a - e2m1_o.value[j]) < fabs(a - e2m1_o.value[c]))
                c = j;
    return (uint8_t)((c != 0 && x < 0) ? (c | 8) : c);
}

/* Exponent k of the smallest power of two >= a > 0 (a normal double). */
static int ceil_log2(double a)
{
    int e;
    double f = frexp(a, &e);
    return f == 0.5 ? e - 1 : e;
}

static double block_amax(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fabs((double)x[i]) > m ? fabs((double)x[i]) : m;
    return m;
}

/* DeepGEMM / V4 scale byte: ceil of fl(max(amax,1e-4)/fmt_max), clamped to [1,254]. */
static int ref_sf_deepgemm(double amax, float fmt_max)
{
    float a = amax < 1e-4f ? 1e-4f : (float)amax;
    int e = ceil_log2((double)(a / fmt_max)) + 127;
    return e < 1 ? 1 : e > 254 ? 254 : e;
}

/* SM100: s = fl(amax * fl(1/448)); byte 0 when s = 0; no clamps (s normal here). */
static int ref_sf_sm100(double amax)
{
    float s = (float)amax * (1.0f / 448.0f);
    if (s == 0.0f)
        return 0;
    return s < 0x1p-126f ? 1 : ceil_log2((double)s) + 127;
}

/* A row that exercises the rules: per block a random magnitude (2^-30 .. 2^20), some
 * all-zero blocks, some tiny (amax < 1e-4) blocks, values at exact E4M3 ties. */
static void random_row(mmoe_rng *rng, float *x, size_t k, size_t block)
{
    for (size_t b = 0; b < k / block; b++) {
        int kind = (int)mmoe_rng_below(rng, 8);
        double mag = ldexp(1.0, (int)mmoe_rng_below(rng, 51) - 30);
        for (size_t i = 0; i < block; i++) {
            double v = mmoe_rng_normal(rng) * mag;
            if (kind == 0)
                v = 0.0;
            else if (kind == 1)
                v *= 1e-7;
            else if (kind == 2) /* an E4M3 tie at a power-of-two scale */
                v = ldexp(1.0 + (2 * (double)mmoe_rng_below(rng, 8) + 1) / 16.0, (int)mmoe_rng_below(rng, 8) - 4) *
                    (mmoe_rng_below(rng, 2) ? -1 : 1);
            x[i + b * block] = (float)v;
        }
    }
}

START_TEST(fp8_ue8m0_rules_match_reference)
{
    init_oracles();
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_quant.fp8"));
    static float x[K_MAX];
    static uint8_t q[K_MAX + 1], sf[K_MAX / 32 + 1];
    static const size_t blocks[2] = {32, 128};
    static const mmoe_sf_rule rules[3] = {MMOE_SF_RULE_DEEPGEMM, MMOE_SF_RULE_SM100_REQUANT, MMOE_SF_RULE_V4};
    for (int row = 0; row < N_ROWS; row++) {
        size_t block = blocks[row % 2];
        size_t k = block * (1 + (size_t)mmoe_rng_below(&rng, K_MAX / block));
        random_row(&rng, x, k, block);
        for (int r = 0; r < 3; r++) {
            memset(q, 0xAA, sizeof q);
            memset(sf, 0xAA, sizeof sf);
            mmoe_status st;
            if (rules[r] == MMOE_SF_RULE_DEEPGEMM && block == 32)
                st = mmoe_quant_row_fp8_1x32_ue8m0(x, k, q, sf, NULL);
            else if (rules[r] == MMOE_SF_RULE_DEEPGEMM)
                st = mmoe_quant_row_fp8_1x128_ue8m0(x, k, q, sf, NULL);
            else
                st = mmoe_quant_row_fp8_ue8m0(x, k, block, rules[r], q, sf, NULL);
            ck_assert_int_eq(st, MMOE_OK);
            for (size_t b = 0; b < k / block; b++) {
                double amax = block_amax(x + b * block, block);
                int want_sf = rules[r] == MMOE_SF_RULE_SM100_REQUANT ? ref_sf_sm100(amax)
                                                                    : ref_sf_deepgemm(amax, 448.0f);
                FMT_CHECK(sf[b] == want_sf, "rule %d block %zu amax %a: sf %02x want %02x", r, b, amax, sf[b], want_sf);
                double s = ldexp(1.0, want_sf - 127);
                for (size_t i = b * block; i < (b + 1) * block; i++) {
                    uint8_t want = ref_e4m3((double)x[i] / s); /* exact: s is a power of two */
                    FMT_CHECK(q[i] == want, "rule %d x[%zu] = %a: q %02x want %02x", r, i, (double)x[i], q[i], want);
                }
            }
            ck_assert_uint_eq(sf[k / block], 0xAA); /* nothing past the last scale */
            if (k < K_MAX)
                ck_assert_uint_eq(q[k], 0xAA);
        }
    }
}
END_TEST

START_TEST(fp8_f32_sm90_matches_reference)
{
    init_oracles();
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_quant.sm90"));
    static float x[K_MAX], sf[K_MAX / 128];
    static uint8_t q[K_MAX];
    for (int row = 0; row < N_ROWS; row++) {
        size_t k = 128 * (1 + (size_t)mmoe_rng_below(&rng, K_MAX / 128));
        random_row(&rng, x, k, 128);
        mmoe_test_poison_f32(sf, K_MAX / 128);
        ck_assert_int_eq(mmoe_quant_row_fp8_1x128_f32(x, k, q, sf, NULL), MMOE_OK);
        for (size_t b = 0; b < k / 128; b++) {
            double amax = block_amax(x + b * 128, 128);
            float a = amax < 1e-4f ? 1e-4f : (float)amax;
            float want_sf = a / 448.0f;             /* fl(max(amax,1e-4)/448) */
            FMT_CHECK(sf[b] == want_sf, "block %zu: sf %a want %a", b, (double)sf[b], (double)want_sf);
            float inv = 1.0f / want_sf;             /* fl(1/sf) */
            for (size_t i = b * 128; i < (b + 1) * 128; i++) {
                float prod = x[i] * inv;            /* one RN fp32 product */
                FMT_CHECK(q[i] == ref_e4m3(prod), "x[%zu] = %a: q %02x want %02x", i, (double)x[i], q[i], ref_e4m3(prod));
            }
        }
        ck_assert(isnan(sf[k / 128 < K_MAX / 128 ? k / 128 : 0]) || k == K_MAX);
    }
}
END_TEST

START_TEST(fp4_matches_reference)
{
    init_oracles();
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_quant.fp4"));
    static float x[K_MAX], deq[K_MAX];
    static uint8_t packed[K_MAX / 2], sf[K_MAX / 32];
    for (int row = 0; row < N_ROWS; row++) {
        size_t k = 32 * (1 + (size_t)mmoe_rng_below(&rng, K_MAX / 32));
        random_row(&rng, x, k, 32);
        for (int ties_down = 0; ties_down < 2; ties_down++) {
            memset(packed, 0xAA, sizeof packed);
            ck_assert_int_eq(mmoe_quant_row_fp4_1x32_ue8m0(x, k, ties_down ? MMOE_FP4_TIES_DOWN : MMOE_FP4_RNE, packed,
                                                           sf, NULL),
                             MMOE_OK);
            for (size_t b = 0; b < k / 32; b++) {
                int want_sf = ref_sf_deepgemm(block_amax(x + 32 * b, 32), 6.0f);
                FMT_CHECK(sf[b] == want_sf, "fp4 block %zu: sf %02x want %02x", b, sf[b], want_sf);
                double s = ldexp(1.0, want_sf - 127);
                for (size_t i = 32 * b; i < 32 * (b + 1); i++) {
                    uint8_t want = ref_e2m1((double)x[i] / s, ties_down);
                    /* docs/spec/formats.md, FP4 packing: packed = c[2i] | c[2i+1] << 4 */
                    uint8_t got = (uint8_t)((packed[i / 2] >> (4 * (i % 2))) & 15);
                    FMT_CHECK(got == want, "fp4(%s) x[%zu] = %a: %x want %x", ties_down ? "down" : "rne", i,
                              (double)x[i], got, want);
                }
            }
            ck_assert_uint_eq(packed[k / 2 < K_MAX / 2 ? k / 2 : 0], k < K_MAX ? 0xAA : packed[0]);
            /* dequantization: code value * 2^(sf-127), exact */
            mmoe_test_poison_f32(deq, K_MAX);
            ck_assert_int_eq(mmoe_dequant_row_mxfp4(packed, sf, k, deq, NULL), MMOE_OK);
            for (size_t i = 0; i < k; i++) {
                uint8_t c = (uint8_t)((packed[i / 2] >> (4 * (i % 2))) & 15);
                double v = oracle_minifloat_value(c & 7, 1, 1) * ((c & 8) ? -1 : 1);
                double want = v * ldexp(1.0, sf[i / 32] - 127);
                FMT_CHECK((double)deq[i] == want, "mxfp4 dequant [%zu]: %a want %a", i, (double)deq[i], want);
            }
            if (k < K_MAX)
                ck_assert(isnan(deq[k]));
        }
    }
}
END_TEST

START_TEST(fp8_dequant_matches_reference)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_quant.deq"));
    enum { NMAX = 300, KW = 300 };
    static uint8_t w[NMAX * KW], sfb[(NMAX / 32 + 1) * (KW / 32 + 1)];
    static float sff[(NMAX / 32 + 1) * (KW / 32 + 1)], out[KW + 1];
    static const size_t blocks[2] = {128, 32};
    for (int trial = 0; trial < 40; trial++) {
        size_t n = 1 + (size_t)mmoe_rng_below(&rng, NMAX), k = 1 + (size_t)mmoe_rng_below(&rng, KW);
        size_t block = blocks[trial % 2];
        size_t sr = (n + block - 1) / block, sc = (k + block - 1) / block;
        for (size_t i = 0; i < n * k; i++)
            w[i] = (uint8_t)mmoe_rng_below(&rng, 256);
        for (size_t i = 0; i < sr * sc; i++) {
            sfb[i] = (uint8_t)(100 + mmoe_rng_below(&rng, 50));
            sff[i] = (float)(mmoe_rng_uniform(&rng) * 3.0 + 1e-3);
        }
        for (int dt = 0; dt < 2; dt++) {
            size_t row = (size_t)mmoe_rng_below(&rng, n);
            mmoe_test_poison_f32(out, KW + 1);
            ck_assert_int_eq(mmoe_dequant_fp8_weight_row(w, n, k, row, dt ? (const void *)sff : sfb,
                                                         dt ? MMOE_DT_F32 : MMOE_DT_F8_E8M0, block, out, NULL),
                             MMOE_OK);
            for (size_t j = 0; j < k; j++) {
                uint8_t b = w[row * k + j];
                size_t si = (row / block) * sc + j / block;
                if ((b & 0x7F) == 0x7F) {
                    FMT_CHECK(isnan(out[j]), "NaN code must dequantize to NaN");
                    continue;
                }
                double s = dt ? (double)sff[si] : ldexp(1.0, sfb[si] - 127);
                float want = (float)(ref_e4m3_value(b) * s); /* product exact in double, one rounding */
                FMT_CHECK(oracle_bits(out[j]) == oracle_bits(want), "w[%zu,%zu] code %02x: %a want %a", row, j, b,
                          (double)out[j], (double)want);
            }
            ck_assert(isnan(out[k]));
        }
    }
}
END_TEST

/* The 2-D weight quantizer: every tile (edge tiles included) against the DeepGEMM reference
 * on the tile's amax; nothing written past n x k codes or the tile grid's scales. */
START_TEST(fp8_weight_blocks_match_reference)
{
    init_oracles();
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_quant.wblocks"));
    enum { NMAX = 300, KW = 300 };
    static float w[NMAX * KW];
    static uint8_t q[NMAX * KW + 1], sf[(NMAX / 32 + 1) * (KW / 32 + 1) + 1];
    static const size_t tiles[3][2] = {{128, 128}, {32, 32}, {128, 32}};
    for (int trial = 0; trial < 30; trial++) {
        size_t n = 1 + (size_t)mmoe_rng_below(&rng, NMAX), k = 1 + (size_t)mmoe_rng_below(&rng, KW);
        size_t bn = tiles[trial % 3][0], bk = tiles[trial % 3][1];
        size_t sr = (n + bn - 1) / bn, sc = (k + bk - 1) / bk;
        for (size_t br = 0; br < sr; br++) /* one magnitude per tile, some zero or tiny tiles */
            for (size_t bc = 0; bc < sc; bc++) {
                int kind = (int)mmoe_rng_below(&rng, 8);
                double mag = kind == 0 ? 0.0 : kind == 1 ? 1e-7 : ldexp(1.0, (int)mmoe_rng_below(&rng, 41) - 20);
                for (size_t r = br * bn; r < n && r < (br + 1) * bn; r++)
                    for (size_t c = bc * bk; c < k && c < (bc + 1) * bk; c++)
                        w[r * k + c] = (float)(mmoe_rng_normal(&rng) * mag);
            }
        memset(q, 0xAA, sizeof q);
        memset(sf, 0xAA, sizeof sf);
        ck_assert_int_eq(mmoe_quant_fp8_weight_blocks(w, n, k, bn, bk, q, sf, NULL), MMOE_OK);
        for (size_t br = 0; br < sr; br++)
            for (size_t bc = 0; bc < sc; bc++) {
                double amax = 0;
                for (size_t r = br * bn; r < n && r < (br + 1) * bn; r++)
                    for (size_t c = bc * bk; c < k && c < (bc + 1) * bk; c++)
                        amax = fabs((double)w[r * k + c]) > amax ? fabs((double)w[r * k + c]) : amax;
                int want_sf = ref_sf_deepgemm(amax, 448.0f);
                FMT_CHECK(sf[br * sc + bc] == want_sf, "%zux%zu tile (%zu,%zu) of %zux%zu amax %a: sf %02x want %02x",
                          bn, bk, br, bc, n, k, amax, sf[br * sc + bc], want_sf);
                double s = ldexp(1.0, want_sf - 127);
                for (size_t r = br * bn; r < n && r < (br + 1) * bn; r++)
                    for (size_t c = bc * bk; c < k && c < (bc + 1) * bk; c++) {
                        uint8_t want = ref_e4m3((double)w[r * k + c] / s); /* exact: s is a power of two */
                        FMT_CHECK(q[r * k + c] == want, "w[%zu,%zu] = %a: q %02x want %02x", r, c,
                                  (double)w[r * k + c], q[r * k + c], want);
                    }
            }
        ck_assert_uint_eq(q[n * k], 0xAA);
        ck_assert_uint_eq(sf[sr * sc], 0xAA);
    }
    mmoe_error err;
    mmoe_error_clear(&err);
    memset(q, 0xAA, 4);
    ck_assert_int_eq(mmoe_quant_fp8_weight_blocks(w, 2, 2, 0, 128, q, sf, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "block"));
    ck_assert_int_eq(mmoe_quant_fp8_weight_blocks(NULL, 2, 2, 128, 128, q, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_fp8_weight_blocks(w, 2, 2, 128, 128, q, NULL, NULL), MMOE_EINVAL);
    ck_assert_uint_eq(q[0], 0xAA); /* nothing written */
}
END_TEST

START_TEST(bad_sizes_are_errors)
{
    float x[256];
    uint8_t q[256], sf[8], packed[128];
    float sff[8], out[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)i - 100.0f;
    mmoe_error err;
    memset(q, 0xAA, sizeof q);
    memset(sf, 0xAA, sizeof sf);
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_quant_row_fp8_1x32_ue8m0(x, 48, q, sf, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "k=48"));
    ck_assert_uint_eq(q[0], 0xAA); /* nothing written */
    ck_assert_uint_eq(sf[0], 0xAA);
    ck_assert_int_eq(mmoe_quant_row_fp8_1x128_ue8m0(x, 160, q, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_row_fp8_1x128_ue8m0(x, 0, q, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_row_fp8_ue8m0(x, 64, 0, MMOE_SF_RULE_DEEPGEMM, q, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_row_fp8_ue8m0(x, 64, 32, (mmoe_sf_rule)7, q, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_row_fp8_ue8m0(NULL, 64, 32, MMOE_SF_RULE_DEEPGEMM, q, sf, &err), MMOE_EINVAL);
    ck_assert_uint_eq(q[0], 0xAA);
    ck_assert_int_eq(mmoe_quant_row_fp8_1x128_f32(x, 129, q, sff, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_row_fp4_1x32_ue8m0(x, 16, MMOE_FP4_RNE, packed, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_quant_row_fp4_1x32_ue8m0(x, 32, (mmoe_fp4_rounding)5, packed, sf, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_dequant_row_mxfp4(packed, sf, 40, out, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_dequant_row_fp8(q, sff, MMOE_DT_BF16, 64, 32, out, &err), MMOE_EDTYPE);
    ck_assert_ptr_nonnull(strstr(err.msg, "BF16"));
    ck_assert_int_eq(mmoe_dequant_row_fp8(q, sff, MMOE_DT_F32, 64, 0, out, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_dequant_fp8_weight_row(q, 2, 128, 2, sff, MMOE_DT_F32, 128, out, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "row 2"));
    ck_assert_int_eq(mmoe_quant_row_fp8_1x32_ue8m0(x, 48, q, sf, NULL), MMOE_EINVAL); /* NULL err is fine */
}
END_TEST

/* NaN in a block: the amax is NaN (as torch.amax), the NaN element becomes 0x7F. */
START_TEST(nan_in_block)
{
    float x[32];
    uint8_t q[32], sf[1];
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i + 1);
    x[5] = NAN;
    ck_assert_int_eq(mmoe_quant_row_fp8_1x32_ue8m0(x, 32, q, sf, NULL), MMOE_OK);
    ck_assert_uint_eq(sf[0], 254); /* ceil_to_ue8m0(NaN) clamps to 254 */
    ck_assert_uint_eq(q[5], 0x7F);
    ck_assert_int_eq(mmoe_quant_row_fp8_ue8m0(x, 32, 32, MMOE_SF_RULE_SM100_REQUANT, q, sf, NULL), MMOE_OK);
    ck_assert_uint_eq(sf[0], 0xFF);
}
END_TEST

static Suite *quant_suite(void)
{
    Suite *s = suite_create("formats_quant");
    TCase *tc = tcase_create("quant");
    tcase_add_test(tc, fp8_ue8m0_rules_match_reference);
    tcase_add_test(tc, fp8_f32_sm90_matches_reference);
    tcase_add_test(tc, fp4_matches_reference);
    tcase_add_test(tc, fp8_dequant_matches_reference);
    tcase_add_test(tc, fp8_weight_blocks_match_reference);
    tcase_add_test(tc, bad_sizes_are_errors);
    tcase_add_test(tc, nan_in_block);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(quant_suite());
}
