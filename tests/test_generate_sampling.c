/**
 * @file test_generate_sampling.c
 * @brief Suite "generate_sampling": `megamoe generate` with --stop, --repeat-penalty, --top-k,
 *        --min-p, --logprobs and --json on the embedded tiny model (fixtures/tiny-dsv4).
 *
 * References, none taken from the code under test:
 *  - the greedy continuation of "1 2 3 4 5 6 7 8" is PyTorch's, in fixtures/tiny-dsv4/golden.json
 *    (" 9 10 11 ... 22"): --stop " 13" must print exactly the text before " 13";
 *  - the repetition penalty is checked against a driver written here: the whole sequence so far
 *    through mmoe_model_forward() on a fresh state at each step, the CTRL rule applied to the
 *    last 64 ids by this file's own loop, the argmax taken here;
 *  - log-probabilities are checked against a float64 log-softmax of the same forward's logits
 *    computed here.
 * Every --json line on stderr is parsed with jansson.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_model.h"
#include "mmoe_test.h"
#include "mmoe_tokenizer.h"

static char g_dir[1024]; /**< fixtures/tiny-dsv4 */
static char g_tmp[512];  /**< temp dir for the CLI's stdin/stdout/stderr files */

/** Run `megamoe generate --model DIR ARGS`; exit status, stdout and stderr (caller frees). */
static int run_generate(const char *args, char **out, char **err)
{
    char cli[3000];
    snprintf(cli, sizeof cli, "generate --model %s %s", g_dir, args);
    return mmoe_test_run_cli(g_tmp, cli, NULL, out, err);
}

/** BOS + the tokens of @p text; returns the count. */
static int prompt_ids(const char *text, int32_t *ids, int cap)
{
    mmoe_error e = {0};
    mmoe_tokenizer *tok = NULL;
    ck_assert_msg(mmoe_tokenizer_load_dir(g_dir, &tok, &e) == MMOE_OK, "%s", e.msg);
    mmoe_token_ids t = {0};
    ck_assert(mmoe_tokenizer_encode(tok, text, strlen(text), 0, &t, &e) == MMOE_OK);
    ck_assert_int_le((int)t.n + 1, cap);
    ids[0] = 0; /* bos_token_id of the tiny config */
    memcpy(ids + 1, t.ids, t.n * sizeof *ids);
    int n = (int)t.n + 1;
    mmoe_token_ids_free(&t);
    mmoe_tokenizer_free(tok);
    return n;
}

/** The logits after the whole of seq[0..n) from a fresh state (vocab entries). */
static void forward_last(mmoe_model *m, const int32_t *seq, int n, float *logits)
{
    mmoe_error e = {0};
    mmoe_model_state *s = NULL;
    ck_assert(mmoe_model_state_create(m, 0, &s, &e) == MMOE_OK);
    mmoe_test_poison_f32(logits, (size_t)mmoe_model_config(m)->vocab_size);
    ck_assert_msg(mmoe_model_forward(m, s, seq, n, logits, 1, NULL, &e) == MMOE_OK, "%s", e.msg);
    mmoe_model_state_destroy(s);
}

START_TEST(stop_string_cuts_the_golden_text)
{
    char *out, *err;
    ck_assert_int_eq(run_generate("--prompt '1 2 3 4 5 6 7 8' --max-tokens 14 --quiet --stop ' 13' --stop 'zz'",
                                  &out, &err), 0);
    ck_assert_str_eq(out, " 9 10 11 12\n"); /* golden: " 9 10 11 12 13 14 ..." */
    free(out), free(err);
    /* a stop string that never appears changes nothing */
    ck_assert_int_eq(run_generate("--prompt '1 2 3 4 5 6 7 8' --max-tokens 16 --quiet --stop 'X'", &out, &err), 0);
    ck_assert_str_eq(out, " 9 10 11 12 13 14 15 16 17 18 19 20 21 22\n");
    free(out), free(err);
}
END_TEST

START_TEST(repeat_penalty_matches_the_driver)
{
    const float penalty = 3.0f;
    int32_t seq[128];
    int n0 = prompt_ids("a b c d e f g h i j k l m n o p q r", seq, 128), n = n0;
    mmoe_error e = {0};
    mmoe_model *m = NULL;
    ck_assert(mmoe_model_open(g_dir, NULL, NULL, &m, &e) == MMOE_OK);
    int64_t vocab = mmoe_model_config(m)->vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    ck_assert_ptr_nonnull(logits);
    for (int step = 0; step < 12; step++) {
        forward_last(m, seq, n, logits);
        int lo = n > 64 ? n - 64 : 0;
        for (int64_t id = 0; id < vocab; id++) {
            int seen = 0;
            for (int k = lo; k < n && !seen; k++)
                seen = seq[k] == id;
            if (seen)
                logits[id] = logits[id] > 0 ? logits[id] / penalty : logits[id] * penalty;
        }
        int32_t id = mmoe_test_argmax_f32(logits, vocab);
        if (id == 1) /* EOS */
            break;
        seq[n++] = id;
    }
    free(logits);
    mmoe_model_close(m);
    char *out, *err;
    ck_assert_int_eq(run_generate("--prompt 'a b c d e f g h i j k l m n o p q r' --max-tokens 12 --quiet "
                                  "--print-ids --repeat-penalty 3",
                                  &out, &err), 0);
    char *p = out;
    int differs_from_plain = 0;
    static const int32_t plain[12] = {491, 496, 498, 501, 504, 505, 507, 510, 227, 71, 444, 449}; /* golden */
    for (int i = n0; i < n; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        ck_assert_msg(end != p, "CLI printed fewer ids than the driver (%d): %s", n - n0, out);
        ck_assert_int_eq(v, seq[i]);
        differs_from_plain |= i - n0 < 12 && v != plain[i - n0];
        p = end;
    }
    ck_assert_msg(differs_from_plain, "penalty 3 left the golden continuation unchanged: a vacuous check");
    free(out), free(err);
}
END_TEST

START_TEST(logprobs_and_json_parse_and_match)
{
    char *out, *err;
    ck_assert_int_eq(run_generate("--prompt '3+4=7\n2+5=' --max-tokens 3 --logprobs 3 --json --stop '\n\n'",
                                  &out, &err), 0);
    int32_t seq[64];
    int n = prompt_ids("3+4=7\n2+5=", seq, 64);
    mmoe_error e = {0};
    mmoe_model *m = NULL;
    ck_assert(mmoe_model_open(g_dir, NULL, NULL, &m, &e) == MMOE_OK);
    int64_t vocab = mmoe_model_config(m)->vocab_size;
    float *logits = malloc((size_t)vocab * sizeof *logits);
    double *lp = malloc((size_t)vocab * sizeof *lp);
    int n_stats = 0, n_lp = 0;
    for (char *line = strtok(err, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL && json_is_object(o), "stderr line is not a JSON object: '%s' (%s)", line, je.text);
        const char *type = json_string_value(json_object_get(o, "type"));
        ck_assert_ptr_nonnull(type);
        if (strcmp(type, "stats") == 0) {
            n_stats++;
            ck_assert_int_eq(json_integer_value(json_object_get(o, "prefill_tokens")), n);
            ck_assert(json_is_number(json_object_get(o, "generate_ms_per_token")));
            ck_assert(json_is_number(json_object_get(o, "prefill_s")));
            ck_assert_int_eq(json_integer_value(json_object_get(o, "generated_tokens")), 3);
            ck_assert_str_eq(json_string_value(json_object_get(o, "stop")), "max-tokens");
        } else {
            ck_assert_str_eq(type, "logprobs");
            ck_assert_int_eq(json_integer_value(json_object_get(o, "index")), n_lp);
            /* float64 log-softmax of the forward's logits, computed here */
            forward_last(m, seq, n, logits);
            double mx = -INFINITY, z = 0.0;
            for (int64_t i = 0; i < vocab; i++)
                mx = fmax(mx, logits[i]);
            for (int64_t i = 0; i < vocab; i++)
                z += exp((double)logits[i] - mx);
            for (int64_t i = 0; i < vocab; i++)
                lp[i] = (double)logits[i] - mx - log(z);
            int32_t id = (int32_t)json_integer_value(json_object_get(o, "id"));
            ck_assert_int_eq(id, mmoe_test_argmax_f32(logits, vocab)); /* greedy */
            ck_assert_msg(fabs(json_real_value(json_object_get(o, "logprob")) - lp[id]) < 1e-9, "token %d", n_lp);
            json_t *top = json_object_get(o, "top");
            ck_assert_uint_eq(json_array_size(top), 3);
            double prev = 0.0;
            for (size_t k = 0; k < 3; k++) {
                json_t *t = json_array_get(top, k);
                int32_t tid = (int32_t)json_integer_value(json_object_get(t, "id"));
                double tl = json_real_value(json_object_get(t, "logprob"));
                ck_assert(fabs(tl - lp[tid]) < 1e-9);
                ck_assert(k == 0 ? tid == id : tl <= prev);
                for (int64_t i = 0; i < vocab; i++) /* nothing outside the list is more probable than its last */
                    ck_assert(k < 2 || lp[i] <= tl || i == id || i == json_integer_value(json_object_get(
                                  json_array_get(top, 1), "id")) || i == tid);
                prev = tl;
            }
            seq[n++] = id;
            n_lp++;
        }
        json_decref(o);
    }
    ck_assert_int_eq(n_stats, 1);
    ck_assert_int_eq(n_lp, 3);
    free(logits), free(lp);
    mmoe_model_close(m);
    free(out), free(err);
}
END_TEST

START_TEST(seed_replays_every_cut)
{
    const char *args = "--prompt 'K L M' --max-tokens 10 --quiet --print-ids --temperature 1.3 --top-k 5 "
                       "--min-p 0.02 --top-p 0.95 --repeat-penalty 1.2 --seed 77";
    char *o1, *e1, *o2, *e2;
    ck_assert_int_eq(run_generate(args, &o1, &e1), 0);
    ck_assert_int_eq(run_generate(args, &o2, &e2), 0);
    ck_assert_str_eq(o1, o2);
    free(o1), free(e1), free(o2), free(e2);
}
END_TEST

/** Expect exit status 2 and @p needle on stderr. */
static void expect_usage(const char *args, const char *needle)
{
    char *out, *err;
    ck_assert_int_eq(run_generate(args, &out, &err), 2);
    ck_assert_msg(strstr(err, needle) != NULL, "stderr lacks '%s': %s", needle, err);
    free(out), free(err);
}

START_TEST(bad_values_are_refused)
{
    expect_usage("--prompt x --top-k -1", "--top-k");
    expect_usage("--prompt x --min-p 1.5", "--min-p");
    expect_usage("--prompt x --repeat-penalty 0", "--repeat-penalty");
    expect_usage("--prompt x --repeat-penalty nan", "--repeat-penalty");
    expect_usage("--prompt x --logprobs 21", "--logprobs");
    expect_usage("--prompt x --stop ''", "--stop");
    expect_usage("--prompt x --repeat-last-n 5x", "--repeat-last-n");
}
END_TEST

int main(void)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fixtures/tiny-dsv4", src ? src : ".");
    if (mmoe_test_mkdtemp(g_tmp, sizeof g_tmp) != 0)
        return 1;
    Suite *s = suite_create("generate_sampling");
    TCase *tc = tcase_create("cli");
    tcase_add_test(tc, stop_string_cuts_the_golden_text);
    tcase_add_test(tc, repeat_penalty_matches_the_driver);
    tcase_add_test(tc, logprobs_and_json_parse_and_match);
    tcase_add_test(tc, seed_replays_every_cut);
    tcase_add_test(tc, bad_values_are_refused);
    suite_add_tcase(s, tc);
    int rc = mmoe_test_run(s);
    mmoe_test_rmtree(g_tmp);
    return rc;
}
