/**
 * @file test_formats_fp4.c
 * @brief Suite "formats_fp4": FP4 E2M1 codes, both rounding conventions, nibble packing
 *        (fmt_fp4.c).
 *
 * Golden values: the field formula (0.m * 2^0 or 1.m * 2^(e-1)), the conversion table of
 * docs/spec/formats.md (E2M1: RNE-sat and DeepGEMM's ties-down), the E2M1 and packing lines
 * of the section-5 sheet, and the brute-force nearest-value oracle of fmt_oracle.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_oracle.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

#define N_RANDOM 1000000

START_TEST(decode_every_code)
{
    /* docs/spec/formats.md, E2M1: codes 0..7 are 0, .5, 1, 1.5, 2, 3, 4, 6; 8..15 the negatives */
    static const double listed[8] = {0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    const float *pair = mmoe_fp4_e2m1_pair_table();
    for (int c = 0; c < 16; c++) {
        double mag = oracle_minifloat_value(c & 7, 1, 1);
        ck_assert(mag == listed[c & 7]);
        double want = (c & 8) ? -mag : mag;
        float got = mmoe_fp4_e2m1_to_f32((uint8_t)c);
        ck_assert_msg((double)got == want && !signbit(got) == !(c & 8), "code %d: got %a want %a", c,
                      (double)got, want);
        /* the high nibble is ignored */
        ck_assert(oracle_bits(mmoe_fp4_e2m1_to_f32((uint8_t)(c | 0xA0))) == oracle_bits(got));
    }
    for (int b = 0; b < 256; b++) {
        FMT_CHECK(oracle_bits(pair[2 * b]) == oracle_bits(mmoe_fp4_e2m1_to_f32((uint8_t)(b & 15))), "pair lo %02x", b);
        FMT_CHECK(oracle_bits(pair[2 * b + 1]) == oracle_bits(mmoe_fp4_e2m1_to_f32((uint8_t)(b >> 4))), "pair hi %02x", b);
    }
}
END_TEST

START_TEST(round_trip_every_code)
{
    for (int c = 0; c < 16; c++) {
        float x = mmoe_fp4_e2m1_to_f32((uint8_t)c);
        ck_assert_int_eq(mmoe_fp4_e2m1_from_f32(x), c);
        /* DeepGEMM's rule keeps every code except -0, which loses its sign */
        ck_assert_int_eq(mmoe_fp4_e2m1_from_f32_ties_down(x), c == 8 ? 0 : c);
    }
}
END_TEST

/* docs/spec/formats.md, E2M1 (RNE-sat and ties-down vectors). */
static const struct { uint32_t bits; int rne, down; const char *what; } fp4_vectors[] = {
    {0x3e800000u, 0x0, 0x0, "0.25 tie 0/0.5"},
    {0x3e800001u, 0x1, 0x1, "0.25+ulp"},
    {0x3f400000u, 0x2, 0x1, "0.75 tie 0.5/1"},
    {0x3fa00000u, 0x2, 0x2, "1.25 tie 1/1.5"},
    {0x3fe00000u, 0x4, 0x3, "1.75 tie 1.5/2"},
    {0x40200000u, 0x4, 0x4, "2.5 tie 2/3"},
    {0x40600000u, 0x6, 0x5, "3.5 tie 3/4"},
    {0x40a00000u, 0x6, 0x6, "5.0 tie 4/6"},
    {0x40c00000u, 0x7, 0x7, "6"},
    {0x40e00000u, 0x7, 0x7, "7 saturates"},
    {0x42c80000u, 0x7, 0x7, "100"},
    {0x7f800000u, 0x7, 0x7, "+Inf"},
    {0xff800000u, 0xf, 0xf, "-Inf"},
    {0x80000000u, 0x8, 0x0, "-0"},
    {0xbe800000u, 0x8, 0x0, "-0.25"},
    {0xbf400000u, 0xa, 0x9, "-0.75"},
    {0xc0e00000u, 0xf, 0xf, "-7"},
    {0x7fc00000u, 0x7, 0x0, "NaN -> +6 (CUDA), 0 (DeepGEMM)"},
    {0xffc00000u, 0x7, 0x0, "-NaN"},
};

START_TEST(spec_vectors)
{
    for (size_t i = 0; i < sizeof fp4_vectors / sizeof fp4_vectors[0]; i++) {
        float x = oracle_float(fp4_vectors[i].bits);
        ck_assert_msg(mmoe_fp4_e2m1_from_f32(x) == fp4_vectors[i].rne, "RNE %s: got %x want %x",
                      fp4_vectors[i].what, mmoe_fp4_e2m1_from_f32(x), fp4_vectors[i].rne);
        ck_assert_msg(mmoe_fp4_e2m1_from_f32_ties_down(x) == fp4_vectors[i].down, "ties-down %s: got %x want %x",
                      fp4_vectors[i].what, mmoe_fp4_e2m1_from_f32_ties_down(x), fp4_vectors[i].down);
    }
}
END_TEST

static int oracle_rne(const fmt_oracle *o, float x)
{
    if (isnan(x))
        return 7;
    int sign = signbit(x) ? 8 : 0;
    int c = isinf(x) ? 8 : oracle_nearest(o, fabs((double)x));
    return sign | (c > 7 ? 7 : c);
}

/* DeepGEMM: nearest value, ties to the LOWER magnitude, saturate, sign only if non-zero. */
static int oracle_ties_down(const fmt_oracle *o, float x)
{
    if (isnan(x))
        return 0;
    double a = fabs((double)x);
    int best = 0;
    if (a >= o->value[7])
        best = 7; /* past the top (and Inf): distances to huge values lose precision */
    else
        for (int c = 1; c <= 7; c++)
            if (fabs(a - o->value[c]) < fabs(a - o->value[best]))
                best = c;
    return (best != 0 && x < 0) ? (best | 8) : best;
}

START_TEST(random_against_oracle)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_fp4"));
    fmt_oracle o;
    oracle_init(&o, 7, 1, 1);
    for (int i = 0; i < N_RANDOM; i++) {
        float x = oracle_random_float(&rng, &o, -4, 4);
        int want = oracle_rne(&o, x), got = mmoe_fp4_e2m1_from_f32(x);
        FMT_CHECK(got == want, "RNE(%a = %08x): got %x want %x", (double)x, oracle_bits(x), got, want);
        want = oracle_ties_down(&o, x);
        got = mmoe_fp4_e2m1_from_f32_ties_down(x);
        FMT_CHECK(got == want, "ties-down(%a = %08x): got %x want %x", (double)x, oracle_bits(x), got, want);
    }
}
END_TEST

START_TEST(packing)
{
    /* sheet: fp4x2(1.0, 6.0) -> 0x72: element 2j low nibble, 2j+1 high */
    ck_assert_uint_eq(mmoe_fp4_pack2(mmoe_fp4_e2m1_from_f32(1.0f), mmoe_fp4_e2m1_from_f32(6.0f)), 0x72);
    ck_assert_uint_eq(mmoe_fp4_pack2(0x1F, 0xF2), 0x2F); /* only the low nibbles are used */

    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_fp4.packing"));
    enum { KMAX = 301 };
    uint8_t codes[KMAX], packed[(KMAX + 1) / 2 + 1], back[KMAX];
    for (int trial = 0; trial < 200; trial++) {
        size_t k = 1 + (size_t)mmoe_rng_below(&rng, KMAX);
        for (size_t i = 0; i < k; i++)
            codes[i] = (uint8_t)mmoe_rng_below(&rng, 16);
        memset(packed, 0xEE, sizeof packed);
        memset(back, 0xEE, sizeof back);
        mmoe_fp4_pack_row(codes, k, packed);
        ck_assert_uint_eq(packed[(k + 1) / 2], 0xEE); /* nothing written past (k+1)/2 bytes */
        for (size_t i = 0; i < k; i++) {
            unsigned nib = (i % 2) ? (packed[i / 2] >> 4) : (packed[i / 2] & 15u);
            ck_assert_uint_eq(nib, codes[i]);
        }
        if (k % 2)
            ck_assert_uint_eq(packed[k / 2] >> 4, 0);
        mmoe_fp4_unpack_row(packed, k, back);
        ck_assert_int_eq(memcmp(codes, back, k), 0);
        ck_assert_uint_eq(back[k - 1 + (k < KMAX)], k < KMAX ? 0xEE : back[k - 1]);
    }
}
END_TEST

/* Decoded values never decrease along the float line (a stride over every float of each
 * sign), for both rounding conventions. */
START_TEST(monotone)
{
    enum { STRIDE = 4099 };
    for (int down = 0; down < 2; down++)
        for (int neg = 0; neg < 2; neg++) {
            double prev = -INFINITY;
            for (uint32_t u = 0; u <= 0x7F800000u; u += STRIDE) {
                float x = oracle_float(neg ? (0x80000000u | (0x7F800000u - u)) : u);
                uint8_t c = down ? mmoe_fp4_e2m1_from_f32_ties_down(x) : mmoe_fp4_e2m1_from_f32(x);
                double v = mmoe_fp4_e2m1_to_f32(c);
                FMT_CHECK(v >= prev, "%s not monotone at %a", down ? "ties-down" : "RNE", (double)x);
                prev = v;
            }
        }
}
END_TEST

static Suite *fp4_suite(void)
{
    Suite *s = suite_create("formats_fp4");
    TCase *tc = tcase_create("fp4");
    tcase_add_test(tc, decode_every_code);
    tcase_add_test(tc, round_trip_every_code);
    tcase_add_test(tc, spec_vectors);
    tcase_add_test(tc, random_against_oracle);
    tcase_add_test(tc, packing);
    tcase_add_test(tc, monotone);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(fp4_suite());
}
