/**
 * @file test_formats_ue8m0.c
 * @brief Suite "formats_ue8m0": UE8M0 scale bytes, the rounding rules, the block-scale rules
 *        of DeepGEMM / DeepSeek-V4 / SM100 / SM90 / OCP, and packed int32 words (fmt_ue8m0.c).
 *
 * Golden values: 2^(b-127) by ldexp; ceil/floor of log2 from frexp in double precision;
 * the UE8M0 rules of docs/spec/formats.md and its test vectors; the
 * SM100 requant rule (fl(1/448) = 0x3B124925, byte 0 for amax 0).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_oracle.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

#define N_RANDOM 1000000

START_TEST(decode_every_byte)
{
    for (int b = 0; b < 255; b++) {
        float got = mmoe_ue8m0_to_f32((uint8_t)b);
        FMT_CHECK((double)got == ldexp(1.0, b - 127), "byte %02x: got %a", b, (double)got);
    }
    ck_assert(isnan(mmoe_ue8m0_to_f32(0xFF)));
    ck_assert(mmoe_ue8m0_to_f32(0) > 0.0f); /* no zero: 2^-127 */
    ck_assert_uint_eq(oracle_bits(mmoe_ue8m0_to_f32(0)), 0x00400000u);
    /* round trip: every finite byte is a power of two, and every encoder returns it */
    for (int b = 0; b < 255; b++) {
        float s = mmoe_ue8m0_to_f32((uint8_t)b);
        FMT_CHECK(mmoe_ue8m0_from_f32_ceil(s) == b, "ceil round trip %02x", b);
        FMT_CHECK(mmoe_ue8m0_from_f32_floor(s) == b, "floor round trip %02x", b);
        FMT_CHECK(mmoe_ue8m0_from_f32_trunc(s) == b || b == 0, "trunc round trip %02x", b);
        FMT_CHECK(mmoe_ue8m0_from_f32_ceil_clamped(s) == (b == 0 ? 1 : b), "ceil_clamped round trip %02x", b);
    }
}
END_TEST

/* Smallest k with 2^k >= a > 0: frexp gives a = f * 2^e with f in [0.5, 1), so the
 * ceiling is e, or e - 1 when a is exactly 2^(e-1). */
static int oracle_ceil_log2(double a)
{
    int e;
    double f = frexp(a, &e);
    return f == 0.5 ? e - 1 : e;
}

/* Largest k with 2^k <= a (a > 0). */
static int oracle_floor_log2(double a)
{
    int e;
    frexp(a, &e);
    return e - 1;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Expected bytes of the four encoders for s (from the definitions in mmoe_formats.h). */
static void oracle_encoders(float s, int *ceil_b, int *floor_b, int *clamped_b, int *bits_b)
{
    double a = fabs((double)s);
    if (isnan(s)) {
        *ceil_b = 0xFF, *floor_b = 0xFF, *clamped_b = 254, *bits_b = 256;
        return;
    }
    if (isinf(s)) {
        *ceil_b = 0xFE, *floor_b = 0xFE, *clamped_b = 254, *bits_b = 255;
        return;
    }
    if (a == 0.0) {
        *ceil_b = 0, *floor_b = 0, *clamped_b = 1, *bits_b = 0;
        return;
    }
    int kc = oracle_ceil_log2(a), kf = oracle_floor_log2(a);
    *ceil_b = clampi(kc + 127, 0, 254);
    *floor_b = clampi(kf + 127, 0, 254);
    *clamped_b = clampi(kc + 127, 1, 254);
    /* the bit formula: exact ceil for normals, 1 for every subnormal */
    *bits_b = a < 0x1p-126 ? 1 : kc + 127;
}

static void check_encoders(float s)
{
    int c, f, cl, bits;
    oracle_encoders(s, &c, &f, &cl, &bits);
    FMT_CHECK(mmoe_ue8m0_from_f32_ceil(s) == c, "ceil(%a): got %02x want %02x", (double)s, mmoe_ue8m0_from_f32_ceil(s), c);
    FMT_CHECK(mmoe_ue8m0_from_f32_floor(s) == f, "floor(%a): got %02x want %02x", (double)s, mmoe_ue8m0_from_f32_floor(s), f);
    FMT_CHECK(mmoe_ue8m0_from_f32_ceil_clamped(s) == cl, "ceil_clamped(%a): got %02x want %02x", (double)s,
              mmoe_ue8m0_from_f32_ceil_clamped(s), cl);
    FMT_CHECK(mmoe_ue8m0_ceil_bits(s) == bits, "ceil_bits(%a): got %d want %d", (double)s, mmoe_ue8m0_ceil_bits(s), bits);
}

START_TEST(random_against_oracle)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_ue8m0"));
    for (int i = 0; i < N_RANDOM / 10; i++) {
        uint32_t u = mmoe_rng_u32(&rng);
        if (i % 4 == 1) /* a power of two, or one ulp either side */
            u = (u & 0xFF800000u) + (uint32_t)((int)(i / 4 % 3) - 1);
        check_encoders(oracle_float(u));
    }
    /* every subnormal boundary and the specials */
    static const uint32_t edges[] = {0, 1, 0x00200000u, 0x003FFFFFu, 0x00400000u, 0x00400001u, 0x007FFFFFu,
                                     0x00800000u, 0x00800001u, 0x7F000000u, 0x7F000001u, 0x7F7FFFFFu,
                                     0x7F800000u, 0x7F800001u, 0x7FC00000u};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        check_encoders(oracle_float(edges[i]));
        check_encoders(oracle_float(edges[i] | 0x80000000u));
    }
}
END_TEST

/* docs/spec/formats.md, UE8M0: the ceil and floor rules. */
START_TEST(spec_vectors)
{
    static const struct { float x; int ceil_b, floor_b; } t[] = {
        {1.0625f, 0x80, 0x7f}, {1.25f, 0x80, 0x7f}, {1.5f, 0x80, 0x7f}, {1.75f, 0x80, 0x7f},
        {0.0f, 0x00, 0x00}, {0x1p-128f, 0x00, 0x00}, {-448.0f, 0x88, 0x87}, {INFINITY, 0xfe, 0xfe},
        {NAN, 0xff, 0xff}, {FLT_MAX, 0xfe, 0xfe},
        {1.0f, 0x7f, 0x7f}, {448.0f, 0x88, 0x87}, {0.75f, 0x7f, 0x7e}, {0x1p-127f, 0x00, 0x00},
        {3.5f, 0x81, 0x80},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        ck_assert_msg(mmoe_ue8m0_from_f32_ceil(t[i].x) == t[i].ceil_b, "ceil(%a)", (double)t[i].x);
        ck_assert_msg(mmoe_ue8m0_from_f32_floor(t[i].x) == t[i].floor_b, "floor(%a)", (double)t[i].x);
    }
    /* DeepGEMM end to end: amax 448 -> s = 1; 449 -> 2; 0 -> clamp 1e-4 -> 2^-22 (0x69) */
    ck_assert_uint_eq(mmoe_sf_ue8m0_deepgemm(448.0f, 448.0f), 0x7f);
    ck_assert_uint_eq(mmoe_sf_ue8m0_deepgemm(449.0f, 448.0f), 0x80);
    ck_assert_uint_eq(mmoe_sf_ue8m0_deepgemm(0.0f, 448.0f), 0x69);
    ck_assert_uint_eq(mmoe_sf_ue8m0_deepgemm(6.0f, 6.0f), 0x7f);
    ck_assert_uint_eq(mmoe_sf_ue8m0_deepgemm(6.5f, 6.0f), 0x80);
    /* DeepGEMM ceil_to_ue8m0 never yields byte 0; the truncating packer drops the mantissa */
    ck_assert_uint_eq(mmoe_ue8m0_from_f32_ceil_clamped(0.0f), 1);
    ck_assert_uint_eq(mmoe_ue8m0_from_f32_trunc(0.75f), 0x7e);
    ck_assert_uint_eq(mmoe_ue8m0_from_f32_trunc(1.99f), 0x7f);
}
END_TEST

/* OCP MX shared exponent (the OCP MX rule of docs/spec/formats.md). */
START_TEST(mx_shared_exponent)
{
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(6.0f, 2), 0x7f);  /* floor(log2 6) - 2 = 0 */
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(7.0f, 2), 0x7f);  /* 7 then clips to 6 */
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(8.0f, 2), 0x80);  /* X = 2 */
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(0.0f, 2), 0x00);  /* ggml stores 0 */
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(448.0f, 8), 0x7f); /* E4M3: 2^8 / 2^8 */
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(0x1p-120f, 15), 0x00); /* clamps at 2^-127 */
    ck_assert_uint_eq(mmoe_ue8m0_mx_shared_exp(NAN, 2), 0xff);
    /* the block tests: the elements of each block under X = 2^(e-127), RNE-sat */
    float x1 = mmoe_ue8m0_to_f32(mmoe_ue8m0_mx_shared_exp(7.0f, 2));
    ck_assert_uint_eq(mmoe_fp4_e2m1_from_f32(7.0f / x1), 7);  /* clipped to 6 */
    float x2 = mmoe_ue8m0_to_f32(mmoe_ue8m0_mx_shared_exp(8.0f, 2));
    ck_assert_uint_eq(mmoe_fp4_e2m1_from_f32(8.0f / x2), 6);  /* 4.0 */
    ck_assert_uint_eq(mmoe_fp4_e2m1_from_f32(3.5f / x2), 4);  /* 1.75 ties to 2.0 */
    float x0 = mmoe_ue8m0_to_f32(mmoe_ue8m0_mx_shared_exp(0.0f, 2));
    ck_assert_uint_eq(mmoe_fp4_e2m1_from_f32(0.0f / x0), 0);
}
END_TEST

/* docs/spec/formats.md: the SM100 in-kernel requant scale. */
START_TEST(sm100_requant_rule)
{
    ck_assert_uint_eq(oracle_bits(1.0f / 448.0f), MMOE_RCP_448_BITS); /* fl(1/448) */
    float inv;
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(0.0f, &inv), 0);      /* no 1e-4 clamp */
    ck_assert_uint_eq(oracle_bits(inv), 0x7F000000u);                   /* 2^127 */
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(448.0f, &inv), 0x7f);
    ck_assert(inv == 1.0f);
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(449.0f, &inv), 0x80);
    ck_assert(inv == 0.5f);
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(1e-30f, &inv), 0x13); /* 2^-99.66 / 2^8.81 -> ceil 2^-108 */
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(0x1p-120f, &inv), 1); /* subnormal s: the bit formula */
    ck_assert(inv == 0x1p126f);
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(INFINITY, &inv), 0xff);
    ck_assert(isnan(inv));
    ck_assert_uint_eq(mmoe_sf_ue8m0_sm100_requant(NAN, NULL), 0xff);

    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_ue8m0.sm100"));
    for (int i = 0; i < N_RANDOM; i++) {
        /* positive normal amax whose s = amax/448 is normal too */
        float amax = oracle_float(0x05800000u + (uint32_t)mmoe_rng_below(&rng, 0x7F7FFFFFu - 0x05800000u));
        uint8_t b = mmoe_sf_ue8m0_sm100_requant(amax, &inv);
        /* spec: multiply-by-reciprocal agrees with the true ceil of amax / 448 */
        int want = oracle_ceil_log2((double)(amax / 448.0f)) + 127;
        FMT_CHECK(b == want, "sm100(%a): got %02x want %02x", (double)amax, b, want);
        FMT_CHECK((double)inv * ldexp(1.0, b - 127) == 1.0, "sm100(%a): sf_inv %a", (double)amax, (double)inv);
    }
}
END_TEST

/* The V4 rule (multiply by fl(1/max)) equals the DeepGEMM rule (divide), and the DeepGEMM
 * rule equals the clamped true ceil of fl(max(amax,1e-4)/max). */
START_TEST(deepgemm_and_v4_rules)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_ue8m0.rules"));
    static const float maxes[2] = {448.0f, 6.0f};
    for (int i = 0; i < N_RANDOM; i++) {
        float amax = oracle_float(mmoe_rng_u32(&rng) & 0x7F7FFFFFu); /* any finite >= 0 */
        if (i % 2)
            amax = ldexpf(1.0f + (float)mmoe_rng_uniform(&rng), (int)mmoe_rng_below(&rng, 60) - 40);
        for (int j = 0; j < 2; j++) {
            float m = maxes[j];
            uint8_t dg = mmoe_sf_ue8m0_deepgemm(amax, m);
            float a = amax < 1e-4f ? 1e-4f : amax;
            int want = clampi(oracle_ceil_log2((double)(a / m)) + 127, 1, 254);
            FMT_CHECK(dg == want, "deepgemm(%a, %g): got %02x want %02x", (double)amax, m, dg, want);
            FMT_CHECK(mmoe_sf_ue8m0_v4(amax, m) == dg, "v4(%a, %g) != deepgemm", (double)amax, m);
            /* the ceiling guarantees |x / s| <= max for every |x| <= amax */
            FMT_CHECK(a / mmoe_ue8m0_to_f32(dg) <= m || dg == 254, "scale too small for %a", (double)amax);
        }
    }
    ck_assert_uint_eq(mmoe_sf_ue8m0_v4_fp4(0.0f), 1);   /* 6*2^-126 * fl(1/6) rounds to 2^-126 */
    ck_assert_uint_eq(mmoe_sf_ue8m0_v4_fp4(6.0f), 0x7f);
    ck_assert_uint_eq(mmoe_sf_ue8m0_v4_fp4(7.0f), 0x80);
    ck_assert_uint_eq(mmoe_sf_ue8m0_v4_fp4(0.75f), 0x7c);
}
END_TEST

/* SM90: sf = fl(max(amax,1e-4)/448), correctly rounded: no float is closer to the quotient. */
START_TEST(sm90_scale)
{
    ck_assert(mmoe_sf_f32_sm90(448.0f) == 1.0f);
    ck_assert(mmoe_sf_f32_sm90(896.0f) == 2.0f);
    ck_assert(mmoe_sf_f32_sm90(0.0f) == mmoe_sf_f32_sm90(1e-4f));
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_ue8m0.sm90"));
    for (int i = 0; i < N_RANDOM / 10; i++) {
        float amax = ldexpf(1.0f + (float)mmoe_rng_uniform(&rng), (int)mmoe_rng_below(&rng, 40) - 20);
        double a = amax < 1e-4f ? (double)1e-4f : (double)amax;
        double q = a / 448.0; /* exact enough: 24-bit / 9-bit, error 2^-53 relative */
        float sf = mmoe_sf_f32_sm90(amax);
        double d = fabs((double)sf - q);
        FMT_CHECK(d <= fabs((double)nextafterf(sf, INFINITY) - q) && d <= fabs((double)nextafterf(sf, 0.0f) - q),
                  "sm90(%a) = %a is not the nearest float to %a", (double)amax, (double)sf, q);
    }
}
END_TEST

START_TEST(packed_words)
{
    const uint8_t four[4] = {0x7f, 0x80, 0x81, 0x01};
    int32_t w;
    mmoe_ue8m0_pack_words(four, 4, &w);
    ck_assert_int_eq(w, 0x0181807F); /* group 4j+b in byte b: little-endian */

    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_ue8m0.pack"));
    enum { NMAX = 203 };
    uint8_t bytes[NMAX], back[NMAX];
    int32_t words[(NMAX + 3) / 4 + 1];
    for (int trial = 0; trial < 200; trial++) {
        size_t n = 1 + (size_t)mmoe_rng_below(&rng, NMAX);
        for (size_t i = 0; i < n; i++)
            bytes[i] = (uint8_t)mmoe_rng_below(&rng, 256);
        memset(words, 0x5A, sizeof words);
        mmoe_ue8m0_pack_words(bytes, n, words);
        size_t nw = (n + 3) / 4;
        ck_assert_int_eq(words[nw], 0x5A5A5A5A);
        for (size_t i = 0; i < 4 * nw; i++) {
            uint32_t u;
            memcpy(&u, &words[i / 4], 4);
            uint32_t byte = (u >> (8 * (i % 4))) & 0xFFu;
            ck_assert_uint_eq(byte, i < n ? bytes[i] : 0);
        }
        memset(back, 0xEE, sizeof back);
        mmoe_ue8m0_unpack_words(words, n, back);
        ck_assert_int_eq(memcmp(bytes, back, n), 0);
        if (n < NMAX)
            ck_assert_uint_eq(back[n], 0xEE);
    }
}
END_TEST

static Suite *ue8m0_suite(void)
{
    Suite *s = suite_create("formats_ue8m0");
    TCase *tc = tcase_create("ue8m0");
    tcase_add_test(tc, decode_every_byte);
    tcase_add_test(tc, random_against_oracle);
    tcase_add_test(tc, spec_vectors);
    tcase_add_test(tc, mx_shared_exponent);
    tcase_add_test(tc, sm100_requant_rule);
    tcase_add_test(tc, deepgemm_and_v4_rules);
    tcase_add_test(tc, sm90_scale);
    tcase_add_test(tc, packed_words);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(ue8m0_suite());
}
