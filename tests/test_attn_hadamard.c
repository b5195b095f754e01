/**
 * @file test_attn_hadamard.c
 * @brief Suite "attn_hadamard": the Sylvester Walsh-Hadamard rotation of the indexer.
 *
 * Known cases: H_2 (1, 0) / sqrt 2 = (1, 1)/sqrt 2; H_4 e_k / 2 = row k of H_4 / 2
 * with H_4 = [[1,1,1,1],[1,-1,1,-1],[1,1,-1,-1],[1,-1,-1,1]] (Sylvester order).
 * General case: against the float64 product with H[i][j] = (-1)^popcount(i & j);
 * the result rounds once to bf16 from fp32 butterflies whose error is far below a
 * bf16 ulp for these inputs, so it is within one bf16 ulp of the float64 value.
 * Orthogonality: applying it twice returns the input within two bf16 roundings
 * (bound derived at the check).
 */
#include <math.h>
#include <string.h>

#include "attn_internal.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

START_TEST(known_small_cases)
{
    uint16_t x2[2] = {mmoe_bf16_from_f32(1.0f), 0};
    attn_hadamard_bf16(x2, 2);
    ck_assert_uint_eq(x2[0], mmoe_bf16_from_f32((float)M_SQRT1_2));
    ck_assert_uint_eq(x2[1], mmoe_bf16_from_f32((float)M_SQRT1_2));
    static const int h4[4][4] = {{1, 1, 1, 1}, {1, -1, 1, -1}, {1, 1, -1, -1}, {1, -1, -1, 1}};
    for (int k = 0; k < 4; k++) {
        uint16_t e[4] = {0, 0, 0, 0};
        e[k] = mmoe_bf16_from_f32(1.0f);
        attn_hadamard_bf16(e, 4);
        for (int i = 0; i < 4; i++)
            ck_assert_float_eq(mmoe_bf16_to_f32(e[i]), 0.5f * (float)h4[i][k]);
    }
}
END_TEST

START_TEST(matches_f64_and_is_orthogonal)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_hadamard"));
    enum { N = 128 };
    uint16_t x[N], orig[N];
    for (int i = 0; i < N; i++)
        orig[i] = x[i] = mmoe_bf16_from_f32((float)mmoe_rng_normal(&rng));
    attn_hadamard_bf16(x, N);
    double norm_in = 0.0, norm_out = 0.0;
    for (int i = 0; i < N; i++) {
        double ref = 0.0;
        for (int j = 0; j < N; j++)
            ref += (__builtin_popcount((unsigned)(i & j)) % 2 ? -1.0 : 1.0) * mmoe_bf16_to_f32(orig[j]);
        ref /= sqrt((double)N);
        const double got = mmoe_bf16_to_f32(x[i]);
        ck_assert_msg(fabs(got - ref) <= ldexp(1.0, ilogb(ref) - 7) + 1e-6, "elt %d: %g vs %g", i, got, ref);
        norm_in += (double)mmoe_bf16_to_f32(orig[i]) * mmoe_bf16_to_f32(orig[i]);
        norm_out += got * got;
    }
    /* norm preserved up to the bf16 roundings (relative 2^-8 per element) */
    ck_assert(fabs(sqrt(norm_out) - sqrt(norm_in)) <= sqrt(norm_in) * ldexp(1.0, -7));
    attn_hadamard_bf16(x, N); /* H is its own inverse when normalized */
    /* the first pass leaves an error vector e with ||e|| <= 2^-8 ||x|| (bf16 unit
       roundoff); the second, orthogonal pass maps it to H e with |(H e)_i| <= ||e||, and
       rounds once more (2^-8 |x_i|) */
    for (int i = 0; i < N; i++) {
        const double o = mmoe_bf16_to_f32(orig[i]);
        const double tol = ldexp(sqrt(norm_in), -8) + ldexp(fabs(o), -8) * 1.01;
        ck_assert_msg(fabs(mmoe_bf16_to_f32(x[i]) - o) <= tol, "elt %d: %g vs %g", i, mmoe_bf16_to_f32(x[i]), o);
    }
}
END_TEST

static Suite *attn_hadamard_suite(void)
{
    Suite *s = suite_create("attn_hadamard");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, known_small_cases);
    tcase_add_test(tc, matches_f64_and_is_orthogonal);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(attn_hadamard_suite());
}
