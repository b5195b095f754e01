/**
 * @file test_formats_bf16.c
 * @brief Suite "formats_bf16": BF16 decoding, RNE encoding with quiet NaN (fmt_bf16.c).
 *
 * Golden values: (1 + m/128) * 2^(e-127) by ldexp for every one of the 65536 codes; the
 * vector table of docs/spec/formats.md (BF16); and, for random floats, the nearer of the two bf16
 * values that bracket x (computed from the field formula in double), ties to the even code,
 * with 2^128 standing for "past the largest finite value" (IEEE overflow to Inf).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_oracle.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

#define N_RANDOM 2000000
/** Unit roundoff of bf16 (8-bit significand): 2^-8. */
#define BF16_UNIT_ROUNDOFF 0x1p-8

/* Value of positive bf16 code h (sign ignored) from its fields; 2^128 for the Inf code. */
static double bf16_field_value(uint32_t h)
{
    int e = (int)((h >> 7) & 0xFF), m = (int)(h & 0x7F);
    if (e == 255)
        return m == 0 ? ldexp(1.0, 128) : NAN;
    if (e == 0)
        return ldexp(m / 128.0, -126);
    return ldexp(1.0 + m / 128.0, e - 127);
}

START_TEST(every_code)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float got = mmoe_bf16_to_f32((uint16_t)h);
        double mag = bf16_field_value(h & 0x7FFF);
        if (isnan(mag)) {
            FMT_CHECK(isnan(got), "%04x: expected NaN", h);
            uint16_t back = mmoe_bf16_from_f32(got);
            FMT_CHECK((back & 0x7F80) == 0x7F80 && (back & 0x7F) != 0 && (back & 0x40), "%04x -> %04x is not a quiet NaN",
                      h, back);
            continue;
        }
        double want = (h & 0x8000) ? -mag : mag;
        if ((h & 0x7FFF) == 0x7F80)
            want = (h & 0x8000) ? -INFINITY : INFINITY;
        FMT_CHECK((double)got == want && !signbit(got) == !(h & 0x8000), "%04x: got %a want %a", h, (double)got, want);
        FMT_CHECK(mmoe_bf16_from_f32(got) == h, "round trip %04x -> %04x", h, mmoe_bf16_from_f32(got));
    }
}
END_TEST

/* docs/spec/formats.md, BF16: input bits -> expected bf16 (NaN: compared as a class, quiet). */
START_TEST(spec_vectors)
{
    static const struct { uint32_t bits; uint16_t want; const char *what; } t[] = {
        {0x3f808000u, 0x3f80, "1 + 2^-8, tie -> even"},
        {0x3f818000u, 0x3f82, "1 + 3*2^-8, tie -> even"},
        {0x3f808001u, 0x3f81, "just above the tie"},
        {0x7f7fffffu, 0x7f80, "FLT_MAX rounds to Inf"},
        {0x00008000u, 0x0000, "subnormal tie"},
        {0x00018000u, 0x0002, "subnormal tie"},
        {0x80000000u, 0x8000, "-0"},
        {0x7f800000u, 0x7f80, "+Inf"},
        {0xff800000u, 0xff80, "-Inf"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        ck_assert_msg(mmoe_bf16_from_f32(oracle_float(t[i].bits)) == t[i].want, "%s: got %04x want %04x", t[i].what,
                      mmoe_bf16_from_f32(oracle_float(t[i].bits)), t[i].want);
    /* NaN stays NaN: sNaN 0x7F800001 must not truncate to Inf; the sign is kept */
    static const uint32_t nans[] = {0x7f800001u, 0x7fc00000u, 0xffc00000u, 0x7fffffffu, 0xff800001u, 0x7f80ffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = mmoe_bf16_from_f32(oracle_float(nans[i]));
        ck_assert_msg((h & 0x7F80) == 0x7F80 && (h & 0x0040), "NaN %08x -> %04x", nans[i], h);
        ck_assert_uint_eq(h >> 15, nans[i] >> 31);
        ck_assert(isnan(mmoe_bf16_round(oracle_float(nans[i]))));
    }
    ck_assert_uint_eq(mmoe_bf16_from_f32(oracle_float(0x7f800001u)), 0x7fc0);
}
END_TEST

static uint16_t oracle_bf16(float x)
{
    uint32_t u = oracle_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u, t = (u & 0x7FFFFFFFu) >> 16;
    double a = fabs((double)x);
    double lo = bf16_field_value(t), hi = bf16_field_value(t + 1);
    uint32_t pick = (a - lo < hi - a || (a - lo == hi - a && (t & 1) == 0)) ? t : t + 1;
    return (uint16_t)(sign | pick);
}

START_TEST(random_against_oracle)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_bf16"));
    for (int i = 0; i < N_RANDOM; i++) {
        uint32_t u = mmoe_rng_u32(&rng);
        if (i % 2) /* an exact tie, or one ulp either side */
            u = (u & 0xFFFF0000u) + 0x8000u + (uint32_t)((int)(i / 2 % 3) - 1);
        if ((u & 0x7F800000u) == 0x7F800000u)
            continue; /* Inf/NaN: spec_vectors */
        float x = oracle_float(u);
        uint16_t want = oracle_bf16(x), got = mmoe_bf16_from_f32(x);
        FMT_CHECK(got == want, "bf16(%08x): got %04x want %04x", u, got, want);
        FMT_CHECK(oracle_bits(mmoe_bf16_round(x)) == ((uint32_t)want << 16), "bf16_round(%08x)", u);
    }
}
END_TEST

START_TEST(rows)
{
    enum { N = 257 };
    float x[N], back[N];
    uint16_t h[N];
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_bf16.rows"));
    for (int i = 0; i < N; i++)
        x[i] = (float)mmoe_rng_normal(&rng) * 100.0f;
    mmoe_test_poison_bf16(h, N);
    mmoe_test_poison_f32(back, N);
    mmoe_bf16_from_f32_row(x, N, h);
    mmoe_bf16_to_f32_row(h, N, back);
    for (int i = 0; i < N; i++) {
        ck_assert_uint_eq(h[i], mmoe_bf16_from_f32(x[i]));
        ck_assert(back[i] == mmoe_bf16_round(x[i]));
        /* RNE error bound: half a bf16 ulp.  bf16 keeps 8 significant bits, so the unit
         * roundoff is 2^-8 (note: mmoe_test.h's MMOE_EPS_BF16 says 2^-9, too tight). */
        ck_assert(fabs((double)back[i] - x[i]) <= fabs((double)x[i]) * BF16_UNIT_ROUNDOFF);
    }
}
END_TEST

/*
 * Every 16-bit pattern widened by the row function, at each of the eight start offsets (so that
 * every pattern passes both the vector steps and the one-by-one tail): bits << 16, the format's
 * definition, for NaN patterns too.
 */
START_TEST(to_f32_row_every_pattern)
{
    enum { N = 65536 + 8 };
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    float *out = malloc(sizeof(float) * N);
    ck_assert(h && out);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)i;
    for (int off = 0; off < 8; off++) {
        const size_t n = (size_t)(N - 8 + (off % 3)); /* lengths 65536 .. 65538 */
        mmoe_test_poison_f32(out, N);
        mmoe_bf16_to_f32_row(h + off, n, out);
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(oracle_bits(out[i]) == (uint32_t)h[off + i] << 16, "offset %d: pattern %04x -> %08x", off,
                          h[off + i], oracle_bits(out[i]));
    }
    free(h);
    free(out);
}
END_TEST

/* bf16 rounding is monotone along a stride over every float of each sign. */
START_TEST(monotone)
{
    enum { STRIDE = 997 };
    for (int neg = 0; neg < 2; neg++) {
        double prev = -INFINITY;
        for (uint32_t u = 0; u <= 0x7F800000u; u += STRIDE) {
            float x = oracle_float(neg ? (0x80000000u | (0x7F800000u - u)) : u);
            double v = mmoe_bf16_round(x);
            FMT_CHECK(v >= prev, "bf16 not monotone at %a", (double)x);
            prev = v;
        }
    }
}
END_TEST

static Suite *bf16_suite(void)
{
    Suite *s = suite_create("formats_bf16");
    TCase *tc = tcase_create("bf16");
    tcase_add_test(tc, every_code);
    tcase_add_test(tc, spec_vectors);
    tcase_add_test(tc, random_against_oracle);
    tcase_add_test(tc, rows);
    tcase_add_test(tc, to_f32_row_every_pattern);
    tcase_add_test(tc, monotone);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(bf16_suite());
}
