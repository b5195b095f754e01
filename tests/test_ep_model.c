/**
 * @file test_ep_model.c
 * @brief Suite "ep_model": the whole forward of the embedded model (fixtures/tiny-dsv4) with its
 *        MoE sub-layers over N = 1, 2, 3, 8 in-process ranks, against the unsplit forward.
 *
 * The fixture has every V4 layer type (hash-routed layers 0 and 1, biased layers 2 and 3, the
 * MTP block), 8 routed experts of top 2 and a shared expert, recipe dsv4-ref with the serial
 * shared expert: the model's own MoE configuration.  For each N the test runs a prefill of a
 * prompt and two decode steps, and requires the same logits, bit for bit, as the forward with
 * the oracle layers (the reference: EP must reproduce it exactly); then detaches and checks the
 * model is its old self.  It also checks that the ranks computed every routed pair once (the
 * pair counts add up to tokens x topk) and that with N = 8 (one expert per rank) more than one
 * rank did work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_ep.h"
#include "mmoe_model.h"
#include "mmoe_test.h"

/** The prompt: BOS and a few byte tokens; then two decode steps. */
static const int32_t k_prompt[] = {0, 20, 21, 22, 23, 24, 25, 26, 27};
static const int32_t k_next[] = {28, 29};
enum { T_PROMPT = sizeof k_prompt / sizeof k_prompt[0], T_NEXT = sizeof k_next / sizeof k_next[0] };

static mmoe_model *open_fixture(void)
{
    char dir[1024];
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(dir, sizeof dir, "%s/fixtures/tiny-dsv4", src ? src : ".");
    return mmoe_test_open_model(dir);
}

/** Prefill the prompt (all positions' logits), then decode two tokens: [T_PROMPT + T_NEXT, V]. */
static float *run_forward(mmoe_model *m)
{
    const int64_t V = mmoe_model_config(m)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)((T_PROMPT + T_NEXT) * V));
    ck_assert_ptr_nonnull(logits);
    mmoe_test_poison_f32(logits, (size_t)((T_PROMPT + T_NEXT) * V));
    mmoe_model_state *s;
    mmoe_error err;
    ck_assert_int_eq(mmoe_model_state_create(m, 64, &s, &err), MMOE_OK);
    ck_assert_msg(mmoe_model_forward(m, s, k_prompt, T_PROMPT, logits, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    for (int i = 0; i < T_NEXT; i++)
        ck_assert_msg(mmoe_model_forward(m, s, k_next + i, 1, logits + (T_PROMPT + i) * V, 0, NULL, &err) == MMOE_OK,
                      "%s", err.msg);
    mmoe_model_state_destroy(s);
    return logits;
}

START_TEST(forward_matches_unsplit)
{
    static const int ranks[] = {1, 2, 3, 8};
    mmoe_model *m = open_fixture();
    const mmoe_config *cfg = mmoe_model_config(m);
    const size_t n = (size_t)((T_PROMPT + T_NEXT) * cfg->vocab_size);
    float *ref = run_forward(m);
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
        mmoe_ep_model *e;
        mmoe_error err;
        ck_assert_msg(mmoe_ep_model_attach(m, ranks[i], MMOE_EP_COMM_INPROC, NULL, NULL, &e, &err) == MMOE_OK, "%s",
                      err.msg);
        float *got = run_forward(m);
        for (size_t j = 0; j < n; j++)
            ck_assert_msg(memcmp(&got[j], &ref[j], sizeof(float)) == 0,
                          "N = %d: logit %zu (position %zu, id %zu): EP %a, unsplit %a", ranks[i], j,
                          j / (size_t)cfg->vocab_size, j % (size_t)cfg->vocab_size, (double)got[j], (double)ref[j]);
        /* every routed pair of every main layer computed once: tokens x topk x layers */
        const int64_t *pairs = mmoe_ep_model_pairs(e);
        int64_t total = 0;
        int busy = 0;
        for (int r = 0; r < ranks[i]; r++) {
            total += pairs[r];
            busy += pairs[r] > 0;
        }
        ck_assert_int_eq(total, (int64_t)(T_PROMPT + T_NEXT) * cfg->n_activated_experts * cfg->n_layers);
        if (ranks[i] == 8)
            ck_assert_int_gt(busy, 1);
        mmoe_ep_model_detach(e);
        free(got);
    }
    float *again = run_forward(m);
    ck_assert_int_eq(memcmp(again, ref, n * sizeof(float)), 0);
    free(again);
    free(ref);
    mmoe_model_close(m);
}
END_TEST

START_TEST(too_many_ranks_refused)
{
    mmoe_model *m = open_fixture();
    mmoe_ep_model *e = NULL;
    mmoe_error err;
    ck_assert_int_eq(mmoe_ep_model_attach(m, 9, MMOE_EP_COMM_INPROC, NULL, NULL, &e, &err), MMOE_EINVAL);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(err.msg, "9 ranks for 8 routed experts") != NULL, "%s", err.msg);
    mmoe_model_close(m);
}
END_TEST

static Suite *ep_model_suite(void)
{
    Suite *s = suite_create("ep_model");
    TCase *tc = tcase_create("tiny");
    tcase_add_test(tc, forward_matches_unsplit);
    tcase_add_test(tc, too_many_ranks_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(ep_model_suite());
}
