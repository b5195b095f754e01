/**
 * @file test_generate_session.c
 * @brief Unit tests of the generation loop (src/cli/generate_session.c) on a random tiny checkpoint.
 *
 * What is checked, each against a reference computed here with mmoe_model_forward() directly:
 *  - chunked prefill (a prompt longer than MMOE_GEN_PREFILL_CHUNK) gives bit-identical logits
 *    to one forward over the whole prompt on a fresh state (the forward is fixed-order);
 *  - the pending-token bookkeeping: after a decode, state position + pending = the sequence
 *    length, and a following prefill gives the same logits as one forward over everything;
 *  - masking: head rows the tokenizer cannot decode (beyond its ids, holes) are never sampled;
 *  - the context limit: decode stops with "context-full" at the exact token, a prefill that
 *    would overflow fails with EINVAL; empty prefills and out-of-vocabulary ids fail.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen_fixture.h"
#include "mmoe_generate.h"
#include "mmoe_model.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "mmoe_tokenizer.h"

static char g_root[512];
static char g_model[600];
static uint64_t g_seed;

/** The model with a fresh state of @p ctx positions. */
typedef struct fixture {
    mmoe_model *model;
    mmoe_model_state *state;
    int64_t vocab;
} fixture;

static void open_fixture(fixture *f, int64_t ctx)
{
    mmoe_error err = {0};
    ck_assert_msg(mmoe_model_open(g_model, NULL, NULL, &f->model, &err) == MMOE_OK, "%s", err.msg);
    ck_assert(mmoe_model_state_create(f->model, ctx, &f->state, &err) == MMOE_OK);
    f->vocab = mmoe_model_config(f->model)->vocab_size;
}

static void close_fixture(fixture *f)
{
    mmoe_model_state_destroy(f->state);
    mmoe_model_close(f->model);
}

/** Random ids in [1, vocab) (never BOS 0), from the printed seed. */
static void random_ids(int32_t *ids, int n, int64_t vocab, uint64_t salt)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ salt);
    for (int i = 0; i < n; i++)
        ids[i] = 1 + (int32_t)mmoe_rng_below(&rng, (uint64_t)(vocab - 1));
}

/** Last-token logits of @p ids run in one forward on a fresh state. */
static void reference_logits(fixture *f, const int32_t *ids, int n, float *logits)
{
    mmoe_error err = {0};
    mmoe_model_state *s = NULL;
    ck_assert(mmoe_model_state_create(f->model, 0, &s, &err) == MMOE_OK);
    mmoe_test_poison_f32(logits, (size_t)f->vocab);
    ck_assert_msg(mmoe_model_forward(f->model, s, ids, n, logits, 1, NULL, &err) == MMOE_OK, "%s", err.msg);
    mmoe_model_state_destroy(s);
}

/** Collects the produced ids. */
typedef struct collected {
    int32_t ids[512];
    int n;
} collected;

static int collect(void *ctx, int32_t id)
{
    collected *c = ctx;
    c->ids[c->n++] = id;
    return 0;
}

/** Count the progress calls and check they grow to the total. */
typedef struct progress_log {
    int calls;
    int64_t last_done, total;
} progress_log;

static void on_progress(void *ctx, int64_t done, int64_t total)
{
    progress_log *p = ctx;
    ck_assert_int_gt(done, p->last_done);
    p->calls++;
    p->last_done = done;
    p->total = total;
}

START_TEST(chunked_prefill_equals_one_forward)
{
    fixture f;
    open_fixture(&f, 0);
    mmoe_gen_session g;
    mmoe_error err = {0};
    ck_assert(mmoe_gen_session_init(&g, f.model, f.state, 512, NULL, 0.0f, 1.0f, 1, &err) == MMOE_OK);
    enum { N = 2 * MMOE_GEN_PREFILL_CHUNK + 7 };
    int32_t ids[N];
    random_ids(ids, N, f.vocab, 11);
    progress_log pl = {0, 0, 0};
    mmoe_gen_stats st;
    mmoe_test_poison_f32(g.logits, (size_t)f.vocab);
    ck_assert_msg(mmoe_gen_prefill(&g, ids, N, on_progress, &pl, &st, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(pl.calls, 3);
    ck_assert_int_eq(pl.last_done, N);
    ck_assert_int_eq(pl.total, N);
    ck_assert_int_eq(st.n_prefill, N);
    ck_assert_int_eq(st.n_reused, 0);
    ck_assert_int_eq(mmoe_model_state_pos(f.state), N);
    float *ref = malloc(sizeof(float) * (size_t)f.vocab);
    reference_logits(&f, ids, N, ref);
    ck_assert_int_eq(memcmp(ref, g.logits, sizeof(float) * (size_t)f.vocab), 0);
    free(ref);
    mmoe_gen_session_free(&g);
    close_fixture(&f);
}
END_TEST

START_TEST(pending_tokens_keep_the_sequence_exact)
{
    fixture f;
    open_fixture(&f, 0);
    mmoe_gen_session g;
    mmoe_error err = {0};
    ck_assert(mmoe_gen_session_init(&g, f.model, f.state, 512, NULL, 0.0f, 1.0f, 1, &err) == MMOE_OK);
    g.eos_id = -1; /* no EOS: the decode runs to max_tokens */
    int32_t seq[64];
    random_ids(seq, 5, f.vocab, 22);
    mmoe_gen_stats pre, dec;
    ck_assert(mmoe_gen_prefill(&g, seq, 5, NULL, NULL, &pre, &err) == MMOE_OK);
    collected c = {.n = 0};
    ck_assert(mmoe_gen_decode(&g, 4, collect, &c, &dec, &err) == MMOE_OK);
    ck_assert_int_eq(dec.n_generated, 4);
    ck_assert_int_eq(c.n, 4);
    ck_assert_int_eq(dec.stop, MMOE_GEN_STOP_MAX_TOKENS);
    ck_assert_str_eq(mmoe_gen_stop_name(dec.stop), "max-tokens");
    /* 5 prompt + 3 generated were run; the 4th generated token is pending */
    ck_assert_int_eq(mmoe_model_state_pos(f.state), 8);
    ck_assert_int_eq(g.n_pending, 1);
    ck_assert_int_eq(g.pending[0], c.ids[3]);
    /* a decode without a prefill is refused */
    ck_assert_int_eq(mmoe_gen_decode(&g, 4, collect, &c, &dec, &err), MMOE_EINVAL);
    /* close the turn with an extra token, then prefill 3 more */
    ck_assert(mmoe_gen_push_pending(&g, 7, &err) == MMOE_OK);
    memcpy(seq + 5, c.ids, 4 * sizeof(int32_t));
    seq[9] = 7;
    random_ids(seq + 10, 3, f.vocab, 33);
    ck_assert(mmoe_gen_prefill(&g, seq + 10, 3, NULL, NULL, &pre, &err) == MMOE_OK);
    ck_assert_int_eq(pre.n_reused, 8);
    ck_assert_int_eq(pre.n_prefill, 5);
    ck_assert_int_eq(mmoe_model_state_pos(f.state), 13);
    float *ref = malloc(sizeof(float) * (size_t)f.vocab);
    reference_logits(&f, seq, 13, ref);
    ck_assert_int_eq(memcmp(ref, g.logits, sizeof(float) * (size_t)f.vocab), 0);
    /* the greedy ids of the first decode are the argmax of the reference logits */
    for (int k = 0; k < 4; k++) {
        reference_logits(&f, seq, 5 + k, ref);
        int32_t best = 0;
        for (int64_t i = 1; i < f.vocab; i++)
            if (ref[i] > ref[best])
                best = (int32_t)i;
        ck_assert_int_eq(c.ids[k], best);
    }
    free(ref);
    /* the queue holds two tokens at most */
    ck_assert(mmoe_gen_push_pending(&g, 1, &err) == MMOE_OK);
    ck_assert(mmoe_gen_push_pending(&g, 1, &err) == MMOE_OK);
    ck_assert_int_eq(mmoe_gen_push_pending(&g, 1, &err), MMOE_EINVAL);
    mmoe_gen_session_free(&g);
    close_fixture(&f);
}
END_TEST

START_TEST(undecodable_ids_are_never_sampled)
{
    /* fixtures/tokenizer/tiny-tokenizer.json has holes in its id range (checked below); the
     * tiny model has 512 head rows, so most rows have no token */
    const char *src = getenv("MMOE_SRCDIR");
    if (src == NULL)
        return; /* run through make check */
    char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/tokenizer/tiny-tokenizer.json", src);
    mmoe_error err = {0};
    mmoe_tokenizer *tok = NULL;
    ck_assert_msg(mmoe_tokenizer_load(path, &tok, &err) == MMOE_OK, "%s", err.msg);
    fixture f;
    open_fixture(&f, 0);
    int64_t decodable = 0;
    for (int32_t id = 0; id < f.vocab; id++) {
        size_t len;
        decodable += mmoe_tokenizer_token_string(tok, id, &len) != NULL;
    }
    ck_assert_int_lt(decodable, mmoe_tokenizer_n_ids(tok)); /* the fixture has holes */
    for (int hot = 0; hot < 2; hot++) {
        mmoe_gen_session g;
        ck_assert(mmoe_gen_session_init(&g, f.model, f.state, 512, tok, hot ? 5.0f : 0.0f, 1.0f, g_seed, &err) ==
                  MMOE_OK);
        ck_assert_int_eq(g.n_masked, f.vocab - decodable);
        g.eos_id = -1;
        mmoe_model_state_reset(f.state);
        int32_t prompt[4];
        random_ids(prompt, 4, f.vocab, 44);
        mmoe_gen_stats pre, dec;
        ck_assert(mmoe_gen_prefill(&g, prompt, 4, NULL, NULL, &pre, &err) == MMOE_OK);
        collected c = {.n = 0};
        ck_assert(mmoe_gen_decode(&g, 24, collect, &c, &dec, &err) == MMOE_OK);
        ck_assert_int_eq(c.n, 24);
        for (int i = 0; i < c.n; i++) {
            size_t len;
            ck_assert_msg(mmoe_tokenizer_token_string(tok, c.ids[i], &len) != NULL, "sampled id %d has no token",
                          c.ids[i]);
        }
        mmoe_gen_session_free(&g);
    }
    close_fixture(&f);
    mmoe_tokenizer_free(tok);
}
END_TEST

START_TEST(context_limit_and_bad_prefills)
{
    fixture f;
    open_fixture(&f, 10);
    mmoe_gen_session g;
    mmoe_error err = {0};
    ck_assert(mmoe_gen_session_init(&g, f.model, f.state, 10, NULL, 0.0f, 1.0f, 1, &err) == MMOE_OK);
    g.eos_id = -1;
    mmoe_gen_stats pre, dec;
    ck_assert_int_eq(mmoe_gen_prefill(&g, NULL, 0, NULL, NULL, &pre, &err), MMOE_EINVAL);
    int32_t bad = (int32_t)f.vocab;
    ck_assert_int_eq(mmoe_gen_prefill(&g, &bad, 1, NULL, NULL, &pre, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "vocabulary") != NULL);
    int32_t ids[11];
    random_ids(ids, 11, f.vocab, 55);
    ck_assert_int_eq(mmoe_gen_prefill(&g, ids, 11, NULL, NULL, &pre, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "context full") != NULL);
    ck_assert_int_eq(mmoe_model_state_pos(f.state), 0);
    /* 6 prompt tokens in 10 positions: tokens 1..4 are run (positions 6..9), token 5 no longer fits */
    ck_assert(mmoe_gen_prefill(&g, ids, 6, NULL, NULL, &pre, &err) == MMOE_OK);
    collected c = {.n = 0};
    ck_assert(mmoe_gen_decode(&g, 100, collect, &c, &dec, &err) == MMOE_OK);
    ck_assert_int_eq(dec.stop, MMOE_GEN_STOP_CONTEXT_FULL);
    ck_assert_int_eq(dec.n_generated, 5);
    ck_assert_int_eq(mmoe_model_state_pos(f.state), 10);
    ck_assert_int_eq(mmoe_gen_prefill(&g, ids, 1, NULL, NULL, &pre, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "context full") != NULL);
    mmoe_gen_session_free(&g);
    /* bad sampler parameters are named */
    ck_assert_int_eq(mmoe_gen_session_init(&g, f.model, f.state, 10, NULL, 0.5f, 0.0f, 1, &err), MMOE_ERANGE);
    ck_assert_int_eq(mmoe_gen_session_init(&g, f.model, f.state, 0, NULL, 0.0f, 1.0f, 1, &err), MMOE_EINVAL);
    close_fixture(&f);
}
END_TEST

START_TEST(stop_names)
{
    ck_assert_str_eq(mmoe_gen_stop_name(MMOE_GEN_STOP_EOS), "eos");
    ck_assert_str_eq(mmoe_gen_stop_name(MMOE_GEN_STOP_CONTEXT_FULL), "context-full");
    ck_assert_str_eq(mmoe_gen_stop_name(MMOE_GEN_STOP_CALLER), "caller");
    ck_assert_str_eq(mmoe_gen_stop_name(MMOE_GEN_STOP_NONE), "none");
}
END_TEST

static Suite *generate_session_suite(void)
{
    Suite *s = suite_create("generate_session");
    TCase *tc = tcase_create("session");
    tcase_add_test(tc, chunked_prefill_equals_one_forward);
    tcase_add_test(tc, pending_tokens_keep_the_sequence_exact);
    tcase_add_test(tc, undecodable_ids_are_never_sampled);
    tcase_add_test(tc, context_limit_and_bad_prefills);
    tcase_add_test(tc, stop_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("generate_session");
    if (gen_fixture_make(g_seed, NULL, g_root, sizeof g_root, g_model, sizeof g_model) != 0)
        return 99;
    int rc = mmoe_test_run(generate_session_suite());
    mmoe_test_rmtree(g_root);
    return rc;
}
