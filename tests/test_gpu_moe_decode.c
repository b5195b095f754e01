/**
 * @file test_gpu_moe_decode.c
 * @brief Suite "gpu_moe_decode": the E2M1 weight decode of the GPU forward's MoE chains
 *        (src/gpu/gpu_moe_decode.h), on the CPU, against the oracle's format decoders.
 *
 * The chains of gpu_fwd_moe.cu build each routed-expert weight with the header's functions;
 * the oracle's weight is mmoe_fp4_e2m1_to_f32(n) * mmoe_ue8m0_to_f32(s), one fp32 product
 * (moe_naive.c).  Here, exhaustively:
 * - the tiny float of every code is e2m1(n) * 2^-126 (ldexp of the oracle's value: an exact
 *   double, equal as a float), with the code's sign, zeros included, whatever the other bits of
 *   the word hold;
 * - the two-step weight equals the oracle's weight bit for bit for all 16 codes x 256 scale
 *   bytes (NaN for s = 255, with both NaN);
 * - the one-step weight, and the factor's value 2^(s - 1) (ldexp), for all 16 codes x every
 *   scale byte s <= 128, bit for bit (subnormal weights at small s, large ones at s = 128);
 * - the word test "every byte <= 128" for every byte value in every byte position, the other
 *   bytes 0, 128 or random;
 * - the slot word (the kernels' storage of a chain word) is a permutation of the 32 bits, and
 *   the tiny float read from it is the code's, for every code in every position;
 * - the one-step factors read four at a time from a scale word (mmoe_moe_one_step_fields()),
 *   for every byte <= 128 in every position.
 * Built with -ffp-contract=off (tests.am): every product here is one rounding.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_moe_decode.h"
#include "mmoe_formats.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/** The bits of @p f. */
static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/** The oracle's weight for code @p n and scale byte @p s (moe_naive.c). */
static float oracle_weight(int n, int s)
{
    return mmoe_fp4_e2m1_to_f32((uint8_t)n) * mmoe_ue8m0_to_f32((uint8_t)s);
}

/** Same float, or both NaN. */
static int same_weight(float got, float want)
{
    return (isnan(got) && isnan(want)) || bits_of(got) == bits_of(want);
}

START_TEST(tiny_float_every_code)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed);
    for (int fill = 0; fill < 64; fill++) {
        const uint32_t others = fill == 0 ? 0u : fill == 1 ? 0xFFFFFFF0u : mmoe_rng_u32(&rng) & ~0xFu;
        for (int n = 0; n < 16; n++) {
            const float got = mmoe_moe_e2m1_tiny(others | (uint32_t)n);
            const float want = (float)ldexp((double)mmoe_fp4_e2m1_to_f32((uint8_t)n), -126);
            ck_assert_msg(bits_of(got) == bits_of(want), "code %d (word %08x): tiny %a, want %a (seed %llu)", n,
                          others | (uint32_t)n, (double)got, (double)want, (unsigned long long)g_seed);
            ck_assert_msg(!!signbit(got) == !!(n & 8), "code %d: sign", n);
        }
    }
}
END_TEST

START_TEST(two_step_every_code_and_scale)
{
    for (int s = 0; s < 256; s++) {
        const float scale = mmoe_moe_ue8m0((uint32_t)s);
        ck_assert_msg(same_weight(scale, mmoe_ue8m0_to_f32((uint8_t)s)), "scale byte %d: %a", s, (double)scale);
        for (int n = 0; n < 16; n++) {
            const float got = mmoe_moe_e2m1_two_step((uint32_t)n, scale), want = oracle_weight(n, s);
            ck_assert_msg(same_weight(got, want), "code %d, scale %d: two-step %a, oracle %a", n, s, (double)got,
                          (double)want);
        }
    }
}
END_TEST

START_TEST(one_step_every_code_and_scale)
{
    int subnormal = 0, zero_signs = 0;
    for (int s = 0; s <= MMOE_MOE_DEC_ONE_STEP_MAX; s++) {
        const float factor = mmoe_moe_one_step_factor((uint32_t)s);
        ck_assert_msg(bits_of(factor) == bits_of((float)ldexp(1.0, s - 1)), "scale %d: factor %a, want 2^%d", s,
                      (double)factor, s - 1);
        for (int n = 0; n < 16; n++) {
            const float got = mmoe_moe_e2m1_one_step((uint32_t)n, factor), want = oracle_weight(n, s);
            ck_assert_msg(bits_of(got) == bits_of(want), "code %d, scale %d: one-step %a, oracle %a", n, s,
                          (double)got, (double)want);
            subnormal += fpclassify(want) == FP_SUBNORMAL;
            zero_signs += want == 0.0f && signbit(want);
        }
    }
    /* the proof covered the rounding cases, not only normal products */
    ck_assert_int_gt(subnormal, 0);
    ck_assert_int_eq(zero_signs, MMOE_MOE_DEC_ONE_STEP_MAX + 1);
}
END_TEST

START_TEST(one_step_word_test_every_byte)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0x5ca1e);
    for (int fill = 0; fill < 66; fill++)
        for (int pos = 0; pos < 4; pos++)
            for (int b = 0; b < 256; b++) {
                uint32_t others = fill == 0 ? 0u : fill == 1 ? 0x80808080u : mmoe_rng_u32(&rng);
                others &= ~(0xFFu << (8 * pos));
                const uint32_t w = others | (uint32_t)b << (8 * pos);
                int want = 1;
                for (int i = 0; i < 4; i++)
                    want &= ((w >> (8 * i)) & 0xFFu) <= MMOE_MOE_DEC_ONE_STEP_MAX;
                ck_assert_msg(!!mmoe_moe_one_step_word(w) == want, "word %08x: one-step test %d, want %d (seed %llu)",
                              w, mmoe_moe_one_step_word(w), want, (unsigned long long)g_seed);
            }
}
END_TEST

START_TEST(slot_word_is_a_permutation)
{
    uint32_t seen = 0;
    for (int b = 0; b < 32; b++) {
        const uint32_t w = mmoe_moe_slot_word(1u << b);
        ck_assert_msg(w != 0 && (w & (w - 1)) == 0, "plain bit %d -> slot word %08x: not one bit", b, w);
        ck_assert_msg((seen & w) == 0, "plain bit %d -> slot word %08x: bit already taken", b, w);
        seen |= w;
    }
    ck_assert_uint_eq(seen, 0xFFFFFFFFu);
}
END_TEST

/* Every code in every position of a slot word, the seven others 0, 15 (all bits set) or
 * random: the tiny float is the oracle's e2m1(n) * 2^-126 (ldexp: an exact double), with the
 * code's sign; and the bits are (n & 7) << 22 | (n & 8) << 28, derived by hand in the header. */
START_TEST(slot_tiny_every_code_every_position)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0x510u);
    for (int fill = 0; fill < 66; fill++)
        for (int i = 0; i < 8; i++)
            for (int n = 0; n < 16; n++) {
                uint32_t plain = fill == 0 ? 0u : fill == 1 ? 0xFFFFFFFFu : mmoe_rng_u32(&rng);
                plain = (plain & ~(0xFu << (4 * i))) | (uint32_t)n << (4 * i);
                const uint32_t slot = mmoe_moe_slot_word(plain);
                const float got = mmoe_moe_slot_tiny(slot, i);
                const float want = (float)ldexp((double)mmoe_fp4_e2m1_to_f32((uint8_t)n), -126);
                const uint32_t want_bits = ((uint32_t)(n & 7) << 22) | ((uint32_t)(n & 8) << 28);
                ck_assert_msg(bits_of(got) == bits_of(want) && bits_of(got) == want_bits,
                              "code %d at position %d (plain %08x, slot %08x): tiny %08x, want %08x (seed %llu)", n,
                              i, plain, slot, bits_of(got), want_bits, (unsigned long long)g_seed);
            }
}
END_TEST

/* Every scale byte s <= 128 in every byte position of a word whose other bytes are 0, 128 or
 * random (<= 128): the factor read from the fields word is 2^(s - 1) (ldexp) and
 * mmoe_moe_one_step_factor(s), bit for bit. */
START_TEST(one_step_factor_of_every_byte)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0xfac7u);
    for (int fill = 0; fill < 66; fill++)
        for (int j = 0; j < 4; j++)
            for (int sb = 0; sb <= MMOE_MOE_DEC_ONE_STEP_MAX; sb++) {
                uint32_t w = 0;
                for (int i = 0; i < 4; i++) {
                    const uint32_t o = fill == 0 ? 0u : fill == 1 ? 128u : mmoe_rng_below(&rng, 129);
                    w |= (i == j ? (uint32_t)sb : o) << (8 * i);
                }
                const float got = mmoe_moe_one_step_factor_of(mmoe_moe_one_step_fields(w), j);
                ck_assert_msg(bits_of(got) == bits_of((float)ldexp(1.0, sb - 1)) &&
                                  bits_of(got) == bits_of(mmoe_moe_one_step_factor((uint32_t)sb)),
                              "word %08x byte %d (%d): factor %a, want 2^%d (seed %llu)", w, j, sb, (double)got,
                              sb - 1, (unsigned long long)g_seed);
            }
}
END_TEST

static Suite *moe_decode_suite(void)
{
    Suite *s = suite_create("gpu_moe_decode");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, tiny_float_every_code);
    tcase_add_test(tc, two_step_every_code_and_scale);
    tcase_add_test(tc, one_step_every_code_and_scale);
    tcase_add_test(tc, one_step_word_test_every_byte);
    tcase_add_test(tc, slot_word_is_a_permutation);
    tcase_add_test(tc, slot_tiny_every_code_every_position);
    tcase_add_test(tc, one_step_factor_of_every_byte);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("gpu_moe_decode");
    return mmoe_test_run(moe_decode_suite());
}
