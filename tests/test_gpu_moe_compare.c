/**
 * @file test_gpu_moe_compare.c
 * @brief Suite "gpu_moe_compare": the GPU suite's comparison (gpu_moe_compare.h) on outputs
 *        built here, on the CPU: runs everywhere.
 *
 * A small layer (D 512, I 256, 4 experts, top-2, one shared expert of 256 with 128-blocks)
 * with random W2 codes and scales; a random BF16 reference output of 3 tokens; "GPU" outputs
 * made from it by hand:
 *   - the reference itself passes with nothing explained;
 *   - the reference plus alpha times one W2 column of one of the token's routed experts
 *     (or of the shared expert), rounded to BF16, fails the plain bounds and passes with
 *     exactly that flip found, one or two of them in a token, also with a BF16 ulp of
 *     rounding noise in every element (an explained token's own bounds), and two flips whose
 *     columns are strongly correlated, which only the joint least-squares fit explains;
 *   - a column of an expert the token does not use, three columns, a few elements moved by
 *     several BF16 ulps, or a NaN: refused.
 * The W2 columns are decoded here from the codes with the E2M1 values and UE8M0 powers of two
 * written out below, not with the module's decoder.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe_compare.h"
#include "mmoe_formats.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"

enum { D = 512, I = 256, E = 4, TOPK = 2, SW = 256, BLK = 128, T = 3 };

static uint64_t g_seed;

/** The layer of this suite: W2 of each routed expert and of the shared one, and a routing. */
typedef struct cmp_layer {
    uint8_t w2[E][D * I / 2], s2[E][D * I / 32];
    uint8_t sh_w2[D * SW], sh_s2[(D / BLK) * (SW / BLK)];
    mmoe_moe_expert_weights experts[E];
    mmoe_moe_weights w;
    mmoe_moe_desc desc;
    int64_t idx[T * TOPK];
} cmp_layer;

static cmp_layer *make_layer(mmoe_rng *rng)
{
    cmp_layer *L = calloc(1, sizeof *L);
    ck_assert_ptr_nonnull(L);
    for (int e = 0; e < E; e++) {
        for (size_t i = 0; i < sizeof L->w2[e]; i++)
            L->w2[e][i] = (uint8_t)mmoe_rng_u32(rng);
        for (size_t i = 0; i < sizeof L->s2[e]; i++)
            L->s2[e][i] = (uint8_t)(122 - mmoe_rng_below(rng, 3));
        L->experts[e].w2 = mmoe_tensor_view2(MMOE_DT_U8, D, I / 2, L->w2[e]);
        L->experts[e].w2_scale = mmoe_tensor_view2(MMOE_DT_F8_E8M0, D, I / 32, L->s2[e]);
    }
    for (size_t i = 0; i < sizeof L->sh_w2; i++)
        L->sh_w2[i] = (uint8_t)(mmoe_rng_u32(rng) & 0xBF); /* |v| < 2, never NaN */
    for (size_t i = 0; i < sizeof L->sh_s2; i++)
        L->sh_s2[i] = (uint8_t)(121 - mmoe_rng_below(rng, 3));
    L->w.experts = L->experts;
    L->w.shared.w2 = mmoe_tensor_view2(MMOE_DT_F8_E4M3, D, SW, L->sh_w2);
    L->w.shared.w2_scale = mmoe_tensor_view2(MMOE_DT_F8_E8M0, D / BLK, SW / BLK, L->sh_s2);
    mmoe_moe_desc_init(&L->desc);
    L->desc.hidden = D;
    L->desc.inter = I;
    L->desc.n_experts = E;
    L->desc.topk = TOPK;
    L->desc.n_shared = 1;
    L->desc.shared_inter = SW;
    L->desc.shared_block = BLK;
    /* token 0: experts 0, 1; token 1: experts 2, 3; token 2: expert 1 and a masked slot */
    const int64_t idx[T * TOPK] = {0, 1, 2, 3, 1, -1};
    memcpy(L->idx, idx, sizeof idx);
    return L;
}

/** Column @p c of W2 of routed expert @p e (or of the shared expert for e = -1), decoded by hand. */
static void column(const cmp_layer *L, int e, int c, double *out)
{
    static const double e2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    for (int j = 0; j < D; j++) {
        if (e >= 0) {
            const uint8_t byte = L->w2[e][j * (I / 2) + c / 2], code = (uint8_t)(c % 2 ? byte >> 4 : byte & 15);
            const double v = (code & 8 ? -1.0 : 1.0) * e2m1[code & 7];
            out[j] = v * ldexp(1.0, L->s2[e][j * (I / 32) + c / 32] - 127);
        } else {
            out[j] = (double)mmoe_fp8_e4m3_to_f32(L->sh_w2[j * SW + c]) *
                     ldexp(1.0, L->sh_s2[(j / BLK) * (SW / BLK) + c / BLK] - 127);
        }
    }
}

/** A reference output: normal values of about 1, BF16. */
static void make_ref(mmoe_rng *rng, uint16_t *ref)
{
    for (int i = 0; i < T * D; i++)
        ref[i] = mmoe_bf16_from_f32((float)mmoe_rng_normal(rng));
}

/**
 * Add to token @p t of @p y (a copy of the reference) alpha times a column, alpha chosen so
 * that the column moves the row by @p frac of its RMS; the sum is rounded to BF16.
 */
static void add_column(const cmp_layer *L, uint16_t *y, int t, int e, int c, double frac)
{
    double col[D], row_sq = 0.0, col_sq = 0.0;
    column(L, e, c, col);
    for (int j = 0; j < D; j++) {
        const double r = mmoe_bf16_to_f32(y[t * D + j]);
        row_sq += r * r;
        col_sq += col[j] * col[j];
    }
    ck_assert(col_sq > 0.0);
    const double alpha = frac * sqrt(row_sq / col_sq);
    for (int j = 0; j < D; j++)
        y[t * D + j] = mmoe_bf16_from_f32((float)((double)mmoe_bf16_to_f32(y[t * D + j]) + alpha * col[j]));
}

typedef struct fixture {
    cmp_layer *L;
    gmc_layer view;
    uint16_t ref[T * D], gpu[T * D];
} fixture;

static fixture *make_fixture(uint64_t salt)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ salt);
    fixture *f = calloc(1, sizeof *f);
    ck_assert_ptr_nonnull(f);
    f->L = make_layer(&rng);
    f->view = (gmc_layer){&f->L->desc, &f->L->w, f->L->idx};
    make_ref(&rng, f->ref);
    memcpy(f->gpu, f->ref, sizeof f->ref);
    return f;
}

static void free_fixture(fixture *f)
{
    free(f->L);
    free(f);
}

START_TEST(equal_outputs_pass)
{
    fixture *f = make_fixture(1);
    const gmc_verdict v = gmc_compare("equal", &f->view, f->gpu, f->ref, T, D);
    ck_assert(v.pass);
    ck_assert_int_eq(v.explained, 0);
    ck_assert_int_eq(v.beyond, 0);
    ck_assert(v.rel_l2 == 0.0);
    gmc_assert_close("equal, asserted", &f->view, f->gpu, f->ref, T, D, g_seed);
    free_fixture(f);
}
END_TEST

START_TEST(one_flip_is_found)
{
    fixture *f = make_fixture(2);
    const int e = 3, c = 77; /* expert 3 is token 1's */
    add_column(f->L, f->gpu, 1, e, c, 0.05);
    const gmc_verdict plain = gmc_compare("one flip, no layer", NULL, f->gpu, f->ref, T, D);
    ck_assert_msg(!plain.pass, "a column at 5%% of the RMS must fail the plain bounds (seed %llu)",
                  (unsigned long long)g_seed);
    const gmc_verdict v = gmc_compare("one flip", &f->view, f->gpu, f->ref, T, D);
    ck_assert_msg(v.pass && v.explained == 1, "pass %d explained %lld (seed %llu)", v.pass, (long long)v.explained,
                  (unsigned long long)g_seed);
    double err[D];
    for (int j = 0; j < D; j++)
        err[j] = (double)mmoe_bf16_to_f32(f->gpu[D + j]) - (double)mmoe_bf16_to_f32(f->ref[D + j]);
    gmc_flip flips[GMC_MAX_FLIPS];
    ck_assert_int_eq(gmc_explain_token(&f->view, 1, err, f->ref + D, GMC_MAX_FLIPS, flips), 1);
    ck_assert_int_eq(flips[0].expert, e);
    ck_assert_int_eq(flips[0].channel, c);
    gmc_assert_close("one flip, asserted", &f->view, f->gpu, f->ref, T, D, g_seed);
    free_fixture(f);
}
END_TEST

START_TEST(routed_and_shared_flips_are_found)
{
    fixture *f = make_fixture(3);
    add_column(f->L, f->gpu, 2, 1, 200, 0.04);  /* token 2's routed expert 1 */
    add_column(f->L, f->gpu, 2, -1, 5, 0.03);   /* and the shared expert */
    const gmc_verdict v = gmc_compare("two flips", &f->view, f->gpu, f->ref, T, D);
    ck_assert_msg(v.pass && v.explained == 1, "pass %d explained %lld (seed %llu)", v.pass, (long long)v.explained,
                  (unsigned long long)g_seed);
    double err[D];
    for (int j = 0; j < D; j++)
        err[j] = (double)mmoe_bf16_to_f32(f->gpu[2 * D + j]) - (double)mmoe_bf16_to_f32(f->ref[2 * D + j]);
    gmc_flip flips[GMC_MAX_FLIPS];
    ck_assert_int_eq(gmc_explain_token(&f->view, 2, err, f->ref + 2 * D, GMC_MAX_FLIPS, flips), 2);
    ck_assert_int_eq(flips[0].expert, 1); /* the larger one first */
    ck_assert_int_eq(flips[0].channel, 200);
    ck_assert_int_eq(flips[1].expert, -1);
    ck_assert_int_eq(flips[1].channel, 5);
    free_fixture(f);
}
END_TEST

/*
 * Two flips whose W2 columns are far from orthogonal: expert 0's columns 40 and 41 share their
 * scale bytes (one 32-wide group) and, here, 80% of their codes, so the second column carries
 * about 0.8 of the first.  Fitting each chosen column alone against what the ones before left
 * would leave about rho^2 (1 - rho^2) of the error's energy, some 20% of it: more than an
 * explained token's 2^-7 normwise.  Fitted together, the two multiples remove it.
 */
START_TEST(correlated_flips_need_the_joint_fit)
{
    fixture *f = make_fixture(9);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 99);
    for (int j = 0; j < D; j++) {
        uint8_t *byte = &f->L->w2[0][j * (I / 2) + 20]; /* columns 40 (low nibble) and 41 (high) */
        if (mmoe_rng_below(&rng, 10) < 8)
            *byte = (uint8_t)((*byte & 15) | (*byte & 15) << 4);
    }
    double c40[D], c41[D], dot = 0.0, n40 = 0.0, n41 = 0.0;
    column(f->L, 0, 40, c40);
    column(f->L, 0, 41, c41);
    for (int j = 0; j < D; j++) {
        dot += c40[j] * c41[j];
        n40 += c40[j] * c40[j];
        n41 += c41[j] * c41[j];
    }
    const double rho = dot / sqrt(n40 * n41);
    ck_assert_msg(rho > 0.6, "the columns must be correlated: rho %.3f (seed %llu)", rho, (unsigned long long)g_seed);
    add_column(f->L, f->gpu, 0, 0, 40, 0.05); /* token 0's expert 0 */
    add_column(f->L, f->gpu, 0, 0, 41, 0.05);
    const gmc_verdict v = gmc_compare("correlated flips", &f->view, f->gpu, f->ref, T, D);
    ck_assert_msg(v.pass && v.explained == 1, "pass %d explained %lld, rho %.3f (seed %llu)", v.pass,
                  (long long)v.explained, rho, (unsigned long long)g_seed);
    double err[D];
    for (int j = 0; j < D; j++)
        err[j] = (double)mmoe_bf16_to_f32(f->gpu[j]) - (double)mmoe_bf16_to_f32(f->ref[j]);
    gmc_flip flips[GMC_MAX_FLIPS];
    ck_assert_int_eq(gmc_explain_token(&f->view, 0, err, f->ref, GMC_MAX_FLIPS, flips), 2);
    ck_assert_int_eq(flips[0].expert, 0);
    ck_assert_int_eq(flips[1].expert, 0);
    ck_assert_int_eq(flips[0].channel + flips[1].channel, 81); /* 40 and 41, in either order */
    free_fixture(f);
}
END_TEST

/*
 * A flip in the sm90 recipe, whose slots are rounded to BF16 before the combine: the flipped
 * slot's two roundings then differ by up to one BF16 ulp of the slot's value in every element.
 * Modelled as one ulp of the reference with a random sign on top of the column: about 2^-7.5
 * normwise, beyond the call's 2^-8 but within an explained token's 2^-7.
 */
START_TEST(flip_with_slot_rounding_passes)
{
    fixture *f = make_fixture(8);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 88);
    add_column(f->L, f->gpu, 0, 0, 31, 0.05); /* token 0's expert 0 */
    for (int j = 0; j < D; j++) {
        const double r = mmoe_bf16_to_f32(f->ref[j]), g = mmoe_bf16_to_f32(f->gpu[j]);
        const double ulp = r != 0.0 ? ldexp(1.0, ilogb(r) - 7) : 0.0;
        f->gpu[j] = mmoe_bf16_from_f32((float)(g + (mmoe_rng_below(&rng, 2) ? ulp : -ulp)));
    }
    const gmc_verdict v = gmc_compare("flip and slot rounding", &f->view, f->gpu, f->ref, T, D);
    ck_assert_msg(v.pass && v.explained == 1, "pass %d explained %lld (seed %llu)", v.pass, (long long)v.explained,
                  (unsigned long long)g_seed);
    free_fixture(f);
}
END_TEST

START_TEST(other_expert_is_refused)
{
    fixture *f = make_fixture(4);
    add_column(f->L, f->gpu, 0, 2, 10, 0.05); /* expert 2 is token 1's, not token 0's */
    const gmc_verdict v = gmc_compare("another token's expert", &f->view, f->gpu, f->ref, T, D);
    ck_assert(!v.pass);
    ck_assert_int_eq(v.explained, 0);
    free_fixture(f);
}
END_TEST

START_TEST(three_flips_are_refused)
{
    fixture *f = make_fixture(5);
    add_column(f->L, f->gpu, 0, 0, 1, 0.05);
    add_column(f->L, f->gpu, 0, 1, 2, 0.05);
    add_column(f->L, f->gpu, 0, -1, 3, 0.05);
    const gmc_verdict v = gmc_compare("three flips", &f->view, f->gpu, f->ref, T, D);
    ck_assert(!v.pass);
    free_fixture(f);
}
END_TEST

START_TEST(scattered_errors_are_refused)
{
    fixture *f = make_fixture(6);
    /* 21 of token 1's elements (4%) moved by 0.1, about 6 to 13 BF16 ulps of the row's RMS of
       about 1: no column explains them */
    for (int j = 0; j < D; j += 25)
        f->gpu[D + j] = mmoe_bf16_from_f32(mmoe_bf16_to_f32(f->gpu[D + j]) + 0.1f);
    const gmc_verdict v = gmc_compare("scattered", &f->view, f->gpu, f->ref, T, D);
    ck_assert(!v.pass);
    ck_assert_int_eq(v.explained, 0);
    free_fixture(f);
}
END_TEST

START_TEST(nan_is_refused)
{
    fixture *f = make_fixture(7);
    f->gpu[2 * D + 9] = 0x7FC0; /* BF16 NaN */
    const gmc_verdict v = gmc_compare("nan", &f->view, f->gpu, f->ref, T, D);
    ck_assert(!v.pass);
    ck_assert_int_eq(v.nan_count, 1);
    free_fixture(f);
}
END_TEST

static Suite *compare_suite(void)
{
    Suite *s = suite_create("gpu_moe_compare");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, equal_outputs_pass);
    tcase_add_test(tc, one_flip_is_found);
    tcase_add_test(tc, routed_and_shared_flips_are_found);
    tcase_add_test(tc, flip_with_slot_rounding_passes);
    tcase_add_test(tc, correlated_flips_need_the_joint_fit);
    tcase_add_test(tc, other_expert_is_refused);
    tcase_add_test(tc, three_flips_are_refused);
    tcase_add_test(tc, scattered_errors_are_refused);
    tcase_add_test(tc, nan_is_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("gpu_moe_compare");
    return mmoe_test_run(compare_suite());
}
