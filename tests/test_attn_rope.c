/**
 * @file test_attn_rope.c
 * @brief Suite "attn_rope": RoPE frequency tables with and without YaRN, rotation and inverse rotation.
 *
 * Hand derivations used below (docs/spec/architecture.md, attention):
 * - base 10000, rope_dim 64: f_0 = 1, f_16 = 10000^-0.5 = 0.01, f_31 = 10000^(-62/64).
 * - YaRN for base 160000, original 65536, beta_fast 32, beta_slow 1:
 *   corr(32) = 64 ln(65536 / 64 pi) / (2 ln 160000) = 15.45..  -> low = 15,
 *   corr(1)  = 64 ln(65536 / 2 pi)  / (2 ln 160000) = 24.71..  -> high = 25;
 *   so pairs i <= 15 keep f_i, pairs i >= 25 use f_i / 16, and pair 20 is the
 *   midpoint (ramp 0.5): f_20 (1/16 + 1) / 2 = f_20 * 17/32.
 * - rotation at pos 1 of the pair (1, 0) with f_0 = 1 gives (cos 1, sin 1) =
 *   (0.5403.., 0.8414..), i.e. bf16 0.5390625 and 0.83984375.
 * Tolerances: the table is built with fp32 powf (< 1 ulp in glibc) and one fp32
 * division: 2 ulps of fp32.  Rotations round to bf16 once from fp32 math: the
 * result is one of the two bf16 neighbours of the float64 value.
 *
 * The rounding points of the rotation are checked bit for bit on about two million
 * random pairs (both tables, forward and inverse) against an emulation written here in
 * double precision: re = fp32(a c - fp32(b s)) with one rounding (the reference's fused
 * multiply-add; emulated with an error-free sum, see fma_f32_emulated()), im =
 * fp32(fp32(a s) + fp32(b c)), each rounded to bf16 with an own round-to-nearest-even.
 * The plain form fp32(fp32(a c) - fp32(b s)) fails it (about 1.2e-5 of the outputs).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

/** |a - b| within @p ulps fp32 ulps of b. */
static int close_f32(float a, double b, int ulps)
{
    return fabs((double)a - b) <= ulps * ldexp(1.0, ilogb(b) - 23);
}

/** a is RNE(b) or a bf16 neighbour of b (the two roundings of b around a value). */
static int bf16_neighbour(uint16_t a, double b)
{
    const double av = mmoe_bf16_to_f32(a);
    return fabs(av - b) <= ldexp(1.0, ilogb(b) - 7) * 1.0000001 || (b == 0 && av == 0);
}

START_TEST(plain_table_hand_values)
{
    float f[32];
    attn_rope_freqs(64, 10000.0, 0, 1.0, 0, 0.0, 0.0, f);
    ck_assert_float_eq(f[0], 1.0f);
    ck_assert(close_f32(f[16], 0.01, 2));
    for (int i = 0; i < 32; i++)
        ck_assert_msg(close_f32(f[i], pow(10000.0, -2.0 * i / 64.0), 2), "f[%d] = %.9g", i, f[i]);
}
END_TEST

START_TEST(yarn_table_hand_values)
{
    float plain[32], yarn[32];
    attn_rope_freqs(64, 160000.0, 0, 16.0, 65536, 32.0, 1.0, plain);
    attn_rope_freqs(64, 160000.0, 1, 16.0, 65536, 32.0, 1.0, yarn);
    for (int i = 0; i <= 15; i++)
        ck_assert_msg(yarn[i] == plain[i], "pair %d must keep f_i", i);
    for (int i = 25; i < 32; i++)
        ck_assert_msg(yarn[i] == plain[i] / 16.0f, "pair %d must use f_i/16", i);
    ck_assert(close_f32(yarn[20], plain[20] * 17.0 / 32.0, 2));
    for (int i = 16; i < 25; i++) {
        const double ramp = (i - 15) / 10.0;
        ck_assert_msg(close_f32(yarn[i], plain[i] / 16.0 * ramp + plain[i] * (1 - ramp), 3), "pair %d", i);
    }
    /* the layer helper picks base and YaRN by compress ratio */
    mmoe_attn_params p;
    float layer[32];
    mmoe_attn_params_default_v4_flash(&p, 4);
    attn_rope_freqs_for_layer(&p, layer);
    ck_assert_int_eq(memcmp(layer, yarn, sizeof layer), 0);
    mmoe_attn_params_default_v4_flash(&p, 0);
    attn_rope_freqs_for_layer(&p, layer);
    attn_rope_freqs(64, 10000.0, 0, 1.0, 0, 0.0, 0.0, plain);
    ck_assert_int_eq(memcmp(layer, plain, sizeof layer), 0);
}
END_TEST

/** fp32 -> bf16, round to nearest even (finite inputs), written out independently. */
static uint16_t bf16_rne(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/**
 * fp32(x y + z) with one rounding, for an x y that is exact in double (here a bf16 value times
 * an fp32 value: 8 + 24 significant bits).  TwoSum: s = fl64(p + z) and e with p + z = s + e
 * exactly.  fp32 midpoints are doubles, so no midpoint lies strictly between s and the exact
 * sum (s is the double nearest to it); rounding s to fp32 is therefore right unless s *is* a
 * midpoint, and then the exact sum lies on the side of e's sign.
 */
static float fma_f32_emulated(float x, float y, float z)
{
    const double p = (double)x * (double)y, zd = z;
    const double s = p + zd, bb = s - p, e = (p - (s - bb)) + (zd - bb);
    const float f = (float)s;
    const float other = (double)f < s ? nextafterf(f, INFINITY) : nextafterf(f, -INFINITY);
    if ((double)f != s && fabs(s - (double)f) == fabs((double)other - s) && e != 0.0 &&
        (((double)other > (double)f) == (e > 0.0)))
        return other;
    return f;
}

/** The bf16 outputs of one pair as the reference rounds them (sin already negated for the inverse). */
static void reference_pair(float a, float b, float c, float s, uint16_t *re, uint16_t *im)
{
    const float bs = (float)((double)b * (double)s); /* products of a bf16 and an fp32: exact in double */
    *re = bf16_rne(fma_f32_emulated(a, c, -bs));
    const float as = (float)((double)a * (double)s), bc = (float)((double)b * (double)c);
    *im = bf16_rne((float)((double)as + (double)bc)); /* the sum of two fp32 is exact in double */
}

/* About two million random pairs: both tables, random positions, forward and inverse. */
START_TEST(rotation_rounds_like_the_reference)
{
    const uint64_t seed = mmoe_test_seed("attn_rope/reference-rounding");
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed + (uint64_t)_i);
    float f[32], c[32], s[32];
    if (_i == 0)
        attn_rope_freqs(64, 10000.0, 0, 1.0, 0, 0.0, 0.0, f);
    else
        attn_rope_freqs(64, 160000.0, 1, 16.0, 65536, 32.0, 1.0, f);
    const int n_pos = 16384;
    long checked = 0;
    for (int k = 0; k < n_pos; k++) {
        /* positions up to 2^20, a few near 2^24 where fp32(pos) still is exact */
        const int64_t pos = k % 64 == 63 ? (int64_t)(16777216 - mmoe_rng_below(&rng, 4096))
                                         : (int64_t)mmoe_rng_below(&rng, 1u << 20);
        attn_rope_cos_sin(f, 32, pos, c, s);
        uint16_t x[64], y[64];
        for (int i = 0; i < 64; i++)
            x[i] = mmoe_bf16_from_f32((float)ldexp(mmoe_rng_normal(&rng), (int)mmoe_rng_below(&rng, 17) - 8));
        for (int inverse = 0; inverse < 2; inverse++) {
            memcpy(y, x, sizeof y);
            attn_rope_rotate_bf16(y, 64, c, s, inverse);
            for (int i = 0; i < 32; i++) {
                uint16_t re, im;
                reference_pair(mmoe_bf16_to_f32(x[2 * i]), mmoe_bf16_to_f32(x[2 * i + 1]), c[i],
                               inverse ? -s[i] : s[i], &re, &im);
                ck_assert_msg(y[2 * i] == re && y[2 * i + 1] == im,
                              "table %d pos %lld pair %d inverse %d: (%04x, %04x), reference (%04x, %04x)", _i,
                              (long long)pos, i, inverse, y[2 * i], y[2 * i + 1], re, im);
                checked++;
            }
        }
    }
    ck_assert_int_eq(checked, 2L * n_pos * 32);
}
END_TEST

START_TEST(rotation_hand_values_and_inverse)
{
    float f[32], c[32], s[32];
    attn_rope_freqs(64, 10000.0, 0, 1.0, 0, 0.0, 0.0, f);
    uint16_t x[64];
    for (int i = 0; i < 64; i++)
        x[i] = mmoe_bf16_from_f32(i % 2 == 0 ? 1.0f : 0.0f);
    attn_rope_cos_sin(f, 32, 1, c, s);
    attn_rope_rotate_bf16(x, 64, c, s, 0);
    ck_assert_float_eq(mmoe_bf16_to_f32(x[0]), 0.5390625f);
    ck_assert_float_eq(mmoe_bf16_to_f32(x[1]), 0.83984375f);
    /* position 0 is the identity, bit for bit */
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_rope/rotation"));
    uint16_t y[64], orig[64];
    for (int i = 0; i < 64; i++)
        orig[i] = y[i] = mmoe_bf16_from_f32((float)mmoe_rng_normal(&rng));
    attn_rope_cos_sin(f, 32, 0, c, s);
    attn_rope_rotate_bf16(y, 64, c, s, 0);
    ck_assert_int_eq(memcmp(y, orig, sizeof y), 0);
    /* a large position: the angle is fp32(pos) * f rounded to fp32 before cos/sin */
    const int64_t positions[3] = {7, 4099, 1000003};
    for (int pi = 0; pi < 3; pi++) {
        const int64_t pos = positions[pi];
        memcpy(y, orig, sizeof y);
        attn_rope_cos_sin(f, 32, pos, c, s);
        attn_rope_rotate_bf16(y, 64, c, s, 0);
        for (int i = 0; i < 32; i++) {
            const double ang = (double)((float)pos * f[i]);
            const double a = mmoe_bf16_to_f32(orig[2 * i]), b = mmoe_bf16_to_f32(orig[2 * i + 1]);
            ck_assert(bf16_neighbour(y[2 * i], a * cos(ang) - b * sin(ang)));
            ck_assert(bf16_neighbour(y[2 * i + 1], a * sin(ang) + b * cos(ang)));
        }
        /* the inverse rotation undoes it up to the two bf16 roundings */
        attn_rope_rotate_bf16(y, 64, c, s, 1);
        for (int i = 0; i < 64; i++) {
            const double o = mmoe_bf16_to_f32(orig[i]);
            ck_assert_msg(fabs(mmoe_bf16_to_f32(y[i]) - o) <= ldexp(1.0, -6) * 4.0,
                          "pos %lld elt %d: %g vs %g", (long long)pos, i, mmoe_bf16_to_f32(y[i]), o);
        }
    }
}
END_TEST

static Suite *attn_rope_suite(void)
{
    Suite *s = suite_create("attn_rope");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, plain_table_hand_values);
    tcase_add_test(tc, yarn_table_hand_values);
    tcase_add_test(tc, rotation_hand_values_and_inverse);
    tcase_add_loop_test(tc, rotation_rounds_like_the_reference, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(attn_rope_suite());
}
