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
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(attn_rope_suite());
}
