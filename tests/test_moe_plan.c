/**
 * @file test_moe_plan.c
 * @brief Suite "moe_plan": the shared-expert plan that both backends call
 *        (mmoe_moe_shared_plan()) and the exact UE8M0 form of a shared block scale.
 *
 * Golden values are written here by hand from docs/spec/formats.md (a UE8M0 byte b is
 * 2^(b-127), b in 0..254) and docs/spec/moe-layer.md (the fallback conditions, first one wins).
 */
#include <math.h>
#include <string.h>

#include "mmoe_moe.h"
#include "mmoe_test.h"

/** The byte of one F32 scale through the public helper. */
static int byte_of(float v)
{
    mmoe_tensor t = {MMOE_DT_F32, 1, {1}, &v, sizeof v};
    return mmoe_moe_scale_ue8m0_byte(&t, 0);
}

START_TEST(f32_scales_and_their_bytes)
{
    ck_assert_int_eq(byte_of(1.0f), 127);
    ck_assert_int_eq(byte_of(2.0f), 128);
    ck_assert_int_eq(byte_of(0.5f), 126);
    ck_assert_int_eq(byte_of(0x1p-126f), 1);
    ck_assert_int_eq(byte_of(0x1p127f), 254);
    ck_assert_int_eq(byte_of(0x1p-127f), 0);  /* the one subnormal with a byte */
    ck_assert_int_eq(byte_of(0x1p-128f), -1); /* below the range */
    ck_assert_int_eq(byte_of(3.0f), -1);      /* not a power of two */
    ck_assert_int_eq(byte_of(-1.0f), -1);     /* no sign */
    ck_assert_int_eq(byte_of(0.0f), -1);      /* no zero */
    ck_assert_int_eq(byte_of(INFINITY), -1);
    ck_assert_int_eq(byte_of(NAN), -1);
    uint8_t bytes[3] = {0, 127, 254};
    mmoe_tensor t = {MMOE_DT_F8_E8M0, 1, {3}, bytes, 3};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(mmoe_moe_scale_ue8m0_byte(&t, i), bytes[i]);
}
END_TEST

/** The plan of a description with one shared expert and the given facts. */
static mmoe_moe_path plan(mmoe_moe_shared_mode mode, int topk, int block, mmoe_dtype dtype, int ue8m0,
                          int64_t width, mmoe_moe_fallback *fb, char *reason)
{
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    d.n_shared = 1;
    d.topk = topk;
    d.shared_block = block;
    d.shared_mode = mode;
    const mmoe_moe_shared_facts f = {dtype, ue8m0, width, 256};
    return mmoe_moe_shared_plan(&d, &f, fb, reason);
}

START_TEST(fallbacks_in_order)
{
    mmoe_moe_fallback fb;
    char reason[MMOE_MOE_REASON_LEN];
    /* everything fine: fused, empty reason */
    ck_assert_int_eq(plan(MMOE_SHARED_AUTO, 6, 128, MMOE_DT_F8_E4M3, 1, 512, &fb, reason), MMOE_PATH_FUSED);
    ck_assert_int_eq(fb, MMOE_FALLBACK_NONE);
    ck_assert_str_eq(reason, "");
    /* every condition broken at once: the first in the order wins, and so on down the list */
    ck_assert_int_eq(plan(MMOE_SHARED_SERIAL, 32, 16, MMOE_DT_BF16, 0, 300, &fb, reason), MMOE_PATH_SERIAL);
    ck_assert_int_eq(fb, MMOE_FALLBACK_REQUESTED);
    ck_assert_ptr_nonnull(strstr(reason, "serial shared expert requested"));
    plan(MMOE_SHARED_AUTO, 32, 16, MMOE_DT_BF16, 0, 300, &fb, reason);
    ck_assert_int_eq(fb, MMOE_FALLBACK_TOPK_LIMIT);
    plan(MMOE_SHARED_AUTO, 31, 16, MMOE_DT_BF16, 0, 300, &fb, reason);
    ck_assert_int_eq(fb, MMOE_FALLBACK_SHARED_DTYPE);
    ck_assert_ptr_nonnull(strstr(reason, "BF16"));
    plan(MMOE_SHARED_AUTO, 31, 16, MMOE_DT_F8_E4M3, 0, 300, &fb, reason);
    ck_assert_int_eq(fb, MMOE_FALLBACK_SCALE_BLOCK);
    plan(MMOE_SHARED_AUTO, 31, 32, MMOE_DT_F8_E4M3, 0, 300, &fb, reason);
    ck_assert_int_eq(fb, MMOE_FALLBACK_SCALE_NOT_POW2);
    plan(MMOE_SHARED_AUTO, 31, 32, MMOE_DT_F8_E4M3, 1, 300, &fb, reason);
    ck_assert_int_eq(fb, MMOE_FALLBACK_SHARED_WIDTH);
    ck_assert_ptr_nonnull(strstr(reason, "300"));
    /* fused mode does not change the plan (the layer refuses to run it) */
    ck_assert_int_eq(plan(MMOE_SHARED_FUSED, 31, 32, MMOE_DT_F8_E4M3, 1, 300, &fb, NULL), MMOE_PATH_SERIAL);
    /* no shared expert: nothing to plan */
    mmoe_moe_desc d;
    mmoe_moe_desc_init(&d);
    const mmoe_moe_shared_facts f = {MMOE_DT_BF16, 0, 300, 256};
    ck_assert_int_eq(mmoe_moe_shared_plan(&d, &f, &fb, reason), MMOE_PATH_NONE);
    ck_assert_int_eq(fb, MMOE_FALLBACK_NONE);
}
END_TEST

START_TEST(facts_from_weight_views)
{
    uint8_t w[4] = {0}, sb[1] = {127};
    float sf_ok = 0x1p-127f, sf_bad = 0x1p-130f;
    mmoe_moe_expert_weights s;
    const mmoe_tensor fp8 = {MMOE_DT_F8_E4M3, 2, {2, 2}, w, 4};
    s.w1 = s.w3 = s.w2 = fp8;
    const mmoe_tensor byte_sc = {MMOE_DT_F8_E8M0, 2, {1, 1}, sb, 1};
    const mmoe_tensor f32_ok = {MMOE_DT_F32, 2, {1, 1}, &sf_ok, 4};
    const mmoe_tensor f32_bad = {MMOE_DT_F32, 2, {1, 1}, &sf_bad, 4};
    s.w1_scale = s.w3_scale = byte_sc;
    s.w2_scale = f32_ok;
    mmoe_moe_shared_facts f;
    mmoe_moe_shared_facts_of(&s, 256, 512, &f);
    ck_assert_int_eq(f.dtype, MMOE_DT_F8_E4M3);
    ck_assert_int_eq(f.scales_ue8m0, 1);
    ck_assert_int_eq(f.width_used, 512);
    ck_assert_int_eq(f.inter_used, 256);
    s.w2_scale = f32_bad;
    mmoe_moe_shared_facts_of(&s, 256, 512, &f);
    ck_assert_int_eq(f.scales_ue8m0, 0);
    s.w3.dtype = MMOE_DT_BF16; /* one matrix of another dtype is enough */
    mmoe_moe_shared_facts_of(&s, 256, 512, &f);
    ck_assert_int_eq(f.dtype, MMOE_DT_BF16);
}
END_TEST

static Suite *plan_suite(void)
{
    Suite *s = suite_create("moe_plan");
    TCase *tc = tcase_create("shared-expert plan");
    tcase_add_test(tc, f32_scales_and_their_bytes);
    tcase_add_test(tc, fallbacks_in_order);
    tcase_add_test(tc, facts_from_weight_views);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(plan_suite());
}
