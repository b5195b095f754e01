/**
 * @file test_formats_fp8.c
 * @brief Suite "formats_fp8": FP8 E4M3FN and E5M2 decoding and encoding (fmt_fp8.c).
 *
 * - every code decoded and checked against 1.m * 2^(e-bias) from its fields;
 * - every non-NaN code survives decode -> encode, saturating and not;
 * - the tricky vectors of docs/spec/formats.md (FP8);
 * - random floats (random bits, in-range values, exact RNE ties and their neighbours)
 *   against the brute-force "nearest, ties to even" oracle of fmt_oracle.h;
 * - monotonicity over a stride of the whole float line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fmt_oracle.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

/** Random floats per format and policy (each costs one ~130-entry oracle search). */
#define N_RANDOM 1000000

typedef uint8_t (*enc_fn)(float);
typedef float (*dec_fn)(uint8_t);

/** A format under test: its fields, its special codes, its functions. */
typedef struct fp8_case {
    const char *name;
    int mbits, bias, max_code;   /* max_code: largest finite positive code */
    int has_inf;                 /* E5M2: 0x7C is Inf */
    enc_fn sat, nosat;
    dec_fn dec;
} fp8_case;

static const fp8_case E4M3 = {"E4M3", 3, 7, 0x7E, 0, mmoe_fp8_e4m3_from_f32, mmoe_fp8_e4m3_from_f32_nosat,
                              mmoe_fp8_e4m3_to_f32};
static const fp8_case E5M2 = {"E5M2", 2, 15, 0x7B, 1, mmoe_fp8_e5m2_from_f32, mmoe_fp8_e5m2_from_f32_nosat,
                              mmoe_fp8_e5m2_to_f32};

/* Expected decode of byte b from the field formula; *is_nan set for NaN codes. */
static double expected_value(const fp8_case *c, int b, int *is_nan)
{
    int mag = b & 0x7F;
    double sign = (b & 0x80) ? -1.0 : 1.0;
    *is_nan = 0;
    if (mag > c->max_code) {
        if (c->has_inf && mag == c->max_code + 1)
            return sign * INFINITY;
        *is_nan = 1;
        return NAN;
    }
    return sign * oracle_minifloat_value(mag, c->mbits, c->bias);
}

static void check_decode_all(const fp8_case *c, const float *table)
{
    int n_nan = 0;
    for (int b = 0; b < 256; b++) {
        int is_nan;
        double want = expected_value(c, b, &is_nan);
        float got = c->dec((uint8_t)b);
        FMT_CHECK(oracle_bits(table[b]) == oracle_bits(got), "%s table[%02x] differs from decode", c->name, b);
        if (is_nan) {
            n_nan++;
            FMT_CHECK(isnan(got), "%s %02x: expected NaN, got %g", c->name, b, got);
            continue;
        }
        FMT_CHECK((double)got == want && !signbit(got) == !signbit(want), "%s %02x: expected %a, got %a",
                      c->name, b, want, (double)got);
    }
    ck_assert_int_eq(n_nan, c->has_inf ? 6 : 2);
}

START_TEST(decode_every_code)
{
    check_decode_all(&E4M3, mmoe_fp8_e4m3_table());
    check_decode_all(&E5M2, mmoe_fp8_e5m2_table());
    /* the named limits of docs/spec/formats.md */
    ck_assert(mmoe_fp8_e4m3_to_f32(0x7E) == 448.0f && mmoe_fp8_e4m3_to_f32(0x08) == 0x1p-6f);
    ck_assert(mmoe_fp8_e4m3_to_f32(0x01) == 0x1p-9f);
    ck_assert(mmoe_fp8_e5m2_to_f32(0x7B) == 57344.0f && mmoe_fp8_e5m2_to_f32(0x04) == 0x1p-14f);
    ck_assert(mmoe_fp8_e5m2_to_f32(0x01) == 0x1p-16f && mmoe_fp8_e5m2_to_f32(0xFC) == -INFINITY);
}
END_TEST

static void check_round_trip(const fp8_case *c)
{
    for (int b = 0; b < 256; b++) {
        int is_nan;
        double v = expected_value(c, b, &is_nan);
        if (is_nan)
            continue;
        float x = c->dec((uint8_t)b);
        FMT_CHECK(c->nosat(x) == b, "%s nosat round trip of %02x gave %02x", c->name, b, c->nosat(x));
        if (isinf(v))
            ck_assert_int_eq(c->sat(x), (b & 0x80) | c->max_code);
        else
            FMT_CHECK(c->sat(x) == b, "%s sat round trip of %02x gave %02x", c->name, b, c->sat(x));
    }
}

START_TEST(round_trip_every_code)
{
    check_round_trip(&E4M3);
    check_round_trip(&E5M2);
}
END_TEST

/* docs/spec/formats.md (FP8 ties and overflow): fp32 bits ->
 * expected byte, SATFINITE and non-saturating.  -1 = "NaN with the input's sign". */
static const struct { uint32_t bits; int sat, nosat; const char *what; } e4m3_vectors[] = {
    {0x00000000u, 0x00, 0x00, "+0"},
    {0x80000000u, 0x80, 0x80, "-0"},
    {0x3f880000u, 0x38, 0x38, "1.0625 tie -> 1.0 (even)"},
    {0x3f980000u, 0x3a, 0x3a, "1.1875 tie -> 1.25"},
    {0x43780000u, 0x78, 0x78, "248 tie -> 256"},
    {0x43e00000u, 0x7e, 0x7e, "448"},
    {0x43e80000u, 0x7e, 0x7e, "464 tie 448/480 -> 448"},
    {0x43e80001u, 0x7e, 0x7f, "464+ulp"},
    {0x43f00000u, 0x7e, 0x7f, "480"},
    {0x43fa0000u, 0x7e, 0x7f, "500"},
    {0x49742400u, 0x7e, 0x7f, "1e6"},
    {0x47700000u, 0x7e, 0x7f, "61440"},
    {0x7f800000u, 0x7e, 0x7f, "+Inf"},
    {0xff800000u, 0xfe, 0xff, "-Inf"},
    {0x7fc00000u, 0x7f, 0x7f, "NaN"},
    {0xffc00000u, 0x7f, 0xff, "-NaN (SATFINITE drops the sign)"},
    {0x3a800000u, 0x00, 0x00, "2^-10 tie -> 0"},
    {0x3a800001u, 0x01, 0x01, "2^-10+ulp"},
    {0x3ac00000u, 0x01, 0x01, "0.75*2^-9 -> 2^-9"},
    {0x3b400000u, 0x02, 0x02, "1.5*2^-9 tie -> 2*2^-9"},
    {0x3ba00000u, 0x02, 0x02, "2.5*2^-9 tie -> 2*2^-9"},
    {0x3be00000u, 0x04, 0x04, "3.5*2^-9 tie -> 4*2^-9"},
    {0x3c700000u, 0x08, 0x08, "7.5*2^-9 tie -> min normal (sheet: 3c700000 -> 08)"},
    {0x3b000000u, 0x01, 0x01, "2^-9 min subnormal"},
};

static const struct { uint32_t bits; int sat, nosat; const char *what; } e5m2_vectors[] = {
    {0x43e00000u, 0x5f, 0x5f, "448"},
    {0x43e80000u, 0x5f, 0x5f, "464"},
    {0x43e80001u, 0x5f, 0x5f, "464+ulp"},
    {0x43f00000u, 0x60, 0x60, "480 -> 512"},
    {0x47600000u, 0x7b, 0x7b, "57344"},
    {0x47700000u, 0x7b, 0x7c, "61440 tie 57344/Inf"},
    {0x49742400u, 0x7b, 0x7c, "1e6"},
    {0x7f800000u, 0x7b, 0x7c, "+Inf"},
    {0xff800000u, 0xfb, 0xfc, "-Inf"},
    {0x7fc00000u, 0x7f, 0x7f, "NaN"},
    {0xffc00000u, 0x7f, 0xff, "-NaN"},
    {0x37800000u, 0x01, 0x01, "2^-16 min subnormal"},
    {0x37000000u, 0x00, 0x00, "2^-17 tie -> 0"},
    {0x80000000u, 0x80, 0x80, "-0"},
};

START_TEST(spec_vectors)
{
    for (size_t i = 0; i < sizeof e4m3_vectors / sizeof e4m3_vectors[0]; i++) {
        float x = oracle_float(e4m3_vectors[i].bits);
        FMT_CHECK(mmoe_fp8_e4m3_from_f32(x) == e4m3_vectors[i].sat, "E4M3 sat %s: got %02x want %02x",
                      e4m3_vectors[i].what, mmoe_fp8_e4m3_from_f32(x), e4m3_vectors[i].sat);
        FMT_CHECK(mmoe_fp8_e4m3_from_f32_nosat(x) == e4m3_vectors[i].nosat, "E4M3 nosat %s: got %02x want %02x",
                      e4m3_vectors[i].what, mmoe_fp8_e4m3_from_f32_nosat(x), e4m3_vectors[i].nosat);
    }
    for (size_t i = 0; i < sizeof e5m2_vectors / sizeof e5m2_vectors[0]; i++) {
        float x = oracle_float(e5m2_vectors[i].bits);
        FMT_CHECK(mmoe_fp8_e5m2_from_f32(x) == e5m2_vectors[i].sat, "E5M2 sat %s: got %02x want %02x",
                      e5m2_vectors[i].what, mmoe_fp8_e5m2_from_f32(x), e5m2_vectors[i].sat);
        FMT_CHECK(mmoe_fp8_e5m2_from_f32_nosat(x) == e5m2_vectors[i].nosat, "E5M2 nosat %s: got %02x want %02x",
                      e5m2_vectors[i].what, mmoe_fp8_e5m2_from_f32_nosat(x), e5m2_vectors[i].nosat);
    }
    /* packing of an fp8 pair as CUDA's fp8x2 does it (sheet: (1.0, 448) -> 0x7e38, byte0 = 0x38) */
    uint16_t pair = (uint16_t)(mmoe_fp8_e4m3_from_f32(1.0f) | (mmoe_fp8_e4m3_from_f32(448.0f) << 8));
    ck_assert_uint_eq(pair, 0x7e38);
}
END_TEST

/* The oracle's expected byte for x under one policy. */
static int oracle_encode(const fp8_case *c, const fmt_oracle *o, float x, int saturate)
{
    uint32_t u = oracle_bits(x);
    int sign = (u >> 31) ? 0x80 : 0;
    if (isnan(x))
        return saturate ? 0x7F : (sign | 0x7F);
    int code = isinf(x) ? o->max_code + 1 : oracle_nearest(o, fabs((double)x));
    if (code > o->max_code)
        code = saturate ? o->max_code : (c->has_inf ? o->max_code + 1 : 0x7F);
    return sign | code;
}

static void check_random(const fp8_case *c, mmoe_rng *rng)
{
    fmt_oracle o;
    oracle_init(&o, c->max_code, c->mbits, c->bias);
    int lo = 1 - c->bias - c->mbits - 3, hi = c->max_code >> c->mbits;
    hi = hi - c->bias + 2;
    for (int i = 0; i < N_RANDOM; i++) {
        float x = oracle_random_float(rng, &o, lo, hi);
        int want_sat = oracle_encode(c, &o, x, 1), want_nosat = oracle_encode(c, &o, x, 0);
        FMT_CHECK(c->sat(x) == want_sat, "%s sat(%a = %08x): got %02x want %02x", c->name, (double)x,
                      oracle_bits(x), c->sat(x), want_sat);
        FMT_CHECK(c->nosat(x) == want_nosat, "%s nosat(%a = %08x): got %02x want %02x", c->name, (double)x,
                      oracle_bits(x), c->nosat(x), want_nosat);
    }
}

START_TEST(random_against_oracle)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_fp8"));
    check_random(&E4M3, &rng);
    check_random(&E5M2, &rng);
}
END_TEST

/* Decoded values never decrease along the float line (stride over all positive finite
 * floats and their negatives), and SATFINITE never gives NaN for a non-NaN input. */
static void check_monotone(const fp8_case *c)
{
    enum { STRIDE = 4099 };
    for (int neg = 0; neg < 2; neg++) {
        double prev = -INFINITY;
        for (uint32_t u = 0; u <= 0x7F800000u; u += STRIDE) {
            /* walk upward in value: positives from 0, negatives from -Inf down to -0 */
            uint32_t bits = neg ? (0x80000000u | (0x7F800000u - u)) : u;
            float x = oracle_float(bits);
            uint8_t b = c->sat(x);
            double v = c->dec(b);
            FMT_CHECK(!isnan(v), "%s sat(%a) is NaN", c->name, (double)x);
            FMT_CHECK(v >= prev, "%s sat not monotone at %a", c->name, (double)x);
            prev = v;
            double vn = c->dec(c->nosat(x));
            if (!isnan(vn))
                FMT_CHECK(fabs(vn) >= fabs(v) || vn == v, "%s nosat below sat at %a", c->name, (double)x);
        }
    }
}

START_TEST(monotone)
{
    check_monotone(&E4M3);
    check_monotone(&E5M2);
}
END_TEST

static Suite *fp8_suite(void)
{
    Suite *s = suite_create("formats_fp8");
    TCase *tc = tcase_create("fp8");
    tcase_add_test(tc, decode_every_code);
    tcase_add_test(tc, round_trip_every_code);
    tcase_add_test(tc, spec_vectors);
    tcase_add_test(tc, random_against_oracle);
    tcase_add_test(tc, monotone);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(fp8_suite());
}
