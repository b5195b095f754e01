/**
 * @file test_perplexity.c
 * @brief Suite "perplexity": `megamoe perplexity` on the embedded tiny model (fixtures/tiny-dsv4).
 *
 *  - The value: an independent computation here, one token at a time: for each text position p
 *    the test finds the window that scores it (the first window k = 0, 1, ... whose end
 *    min(kS + N - 1, T) is past p), runs BOS + text[kS, p) through mmoe_model_forward() from a
 *    fresh state keeping only the last logits, and takes the float64 log-softmax.  The mean NLL
 *    must match the CLI's --json value to 1e-9 (same forward, same double arithmetic per token;
 *    only the chunking of the CLI's forward calls differs, which the forward guarantees to be
 *    invisible).
 *  - The meaning: the model's own training patterns (counting, alphabets, one-digit sums; see
 *    tools/tiny_dsv4_data.py) have a perplexity below 3, the same words shuffled (seeded) above
 *    100 (measured 1.37 and 2.3e5: the bounds leave orders of magnitude).
 *  - Every token is scored once for any window and stride; bad options and files are refused.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_model.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"
#include "mmoe_tokenizer.h"

static char g_dir[1024]; /**< fixtures/tiny-dsv4 */
static char g_tmp[512];  /**< temp dir: texts and the CLI's output files */

/** The training patterns (counting, alphabets, sums), as the training documents write them. */
static const char *k_train = "20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45\n"
                             "a b c d e f g h i j k l m n o p q r s t u v w x y z\n"
                             "A B C D E F G H I J K L M N O P Q R S T\n"
                             "3+4=7\n2+5=7\n6+1=7\n0+8=8\n9+9=18\n4+4=8";

/** Write @p text to g_tmp/@p name; the path goes to @p path. */
static void write_text(const char *name, const char *text, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", g_tmp, name);
    mmoe_test_write_file(path, text, strlen(text));
}

/** The words of k_train in a seeded random order, joined by spaces (caller frees). */
static char *shuffled_train(uint64_t seed)
{
    char *copy = strdup(k_train), *words[256], *save = NULL;
    int n = 0;
    for (char *w = strtok_r(copy, " \n", &save); w != NULL && n < 256; w = strtok_r(NULL, " \n", &save))
        words[n++] = w;
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)mmoe_rng_below(&rng, (uint64_t)i + 1);
        char *t = words[i];
        words[i] = words[j];
        words[j] = t;
    }
    char *out = calloc(1, strlen(k_train) + 2);
    for (int i = 0; i < n; i++) {
        if (i > 0)
            strcat(out, " ");
        strcat(out, words[i]);
    }
    free(copy);
    return out;
}

/** Run the CLI with --json; returns the parsed object (asserts exit 0 and one JSON line). */
static json_t *run_json(const char *file, const char *extra)
{
    char cli[3000], *out, *err;
    snprintf(cli, sizeof cli, "perplexity --model %s --text-file %s --json %s", g_dir, file, extra);
    int rc = mmoe_test_run_cli(g_tmp, cli, NULL, &out, &err);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    ck_assert_msg(o != NULL, "not JSON: '%s' (%s)", out, je.text);
    ck_assert_str_eq(json_string_value(json_object_get(o, "type")), "perplexity");
    free(out), free(err);
    return o;
}

/** The tokens of @p text (no BOS); returns the count. */
static int tokens_of(const char *text, int32_t *ids, int cap)
{
    mmoe_error e = {0};
    mmoe_tokenizer *tok = NULL;
    ck_assert(mmoe_tokenizer_load_dir(g_dir, &tok, &e) == MMOE_OK);
    mmoe_token_ids t = {0};
    ck_assert(mmoe_tokenizer_encode(tok, text, strlen(text), 0, &t, &e) == MMOE_OK);
    ck_assert_int_le((int)t.n, cap);
    memcpy(ids, t.ids, t.n * sizeof *ids);
    int n = (int)t.n;
    mmoe_token_ids_free(&t);
    mmoe_tokenizer_free(tok);
    return n;
}

START_TEST(value_matches_a_token_by_token_reference)
{
    const char *text = "5 6 7 8 9 10 11 12 13 14 15 16 17\nk l m n o p q r s\n1+2=3\n7+2=9";
    const int ctx = 12, stride = 5;
    char path[700];
    write_text("ref.txt", text, path, sizeof path);
    int32_t t[256], seq[64];
    int T = tokens_of(text, t, 256);
    ck_assert_int_gt(T, 2 * ctx); /* several windows */
    mmoe_error e = {0};
    mmoe_model *m = NULL;
    ck_assert(mmoe_model_open(g_dir, NULL, NULL, &m, &e) == MMOE_OK);
    int64_t vocab = mmoe_model_config(m)->vocab_size;
    float *z = malloc((size_t)vocab * sizeof *z);
    double sum = 0.0;
    for (int p = 0; p < T; p++) {
        int k = 0;
        while (!(p < (k * stride + ctx - 1 < T ? k * stride + ctx - 1 : T)))
            k++;
        int start = k * stride, n = 0;
        seq[n++] = 0; /* BOS of the tiny config */
        for (int i = start; i < p; i++)
            seq[n++] = t[i];
        mmoe_model_state *s = NULL;
        ck_assert(mmoe_model_state_create(m, 0, &s, &e) == MMOE_OK);
        mmoe_test_poison_f32(z, (size_t)vocab);
        ck_assert_msg(mmoe_model_forward(m, s, seq, n, z, 1, NULL, &e) == MMOE_OK, "%s", e.msg);
        mmoe_model_state_destroy(s);
        double mx = -INFINITY, zsum = 0.0;
        for (int64_t i = 0; i < vocab; i++)
            mx = fmax(mx, z[i]);
        for (int64_t i = 0; i < vocab; i++)
            zsum += exp((double)z[i] - mx);
        sum += mx + log(zsum) - (double)z[t[p]];
    }
    free(z);
    mmoe_model_close(m);
    char extra[64];
    snprintf(extra, sizeof extra, "--ctx %d --stride %d", ctx, stride);
    json_t *o = run_json(path, extra);
    double nll = json_real_value(json_object_get(o, "nll_mean_nats"));
    ck_assert_int_eq(json_integer_value(json_object_get(o, "tokens_scored")), T);
    ck_assert_msg(fabs(nll - sum / T) < 1e-9, "CLI mean NLL %.17g, reference %.17g", nll, sum / T);
    ck_assert_msg(fabs(json_real_value(json_object_get(o, "perplexity")) - exp(sum / T)) < 1e-9 * exp(sum / T),
                  "perplexity");
    json_decref(o);
}
END_TEST

START_TEST(training_patterns_low_shuffled_high)
{
    char train[700], shuf[700];
    write_text("train.txt", k_train, train, sizeof train);
    char *s = shuffled_train(20261201);
    write_text("shuffled.txt", s, shuf, sizeof shuf);
    free(s);
    json_t *a = run_json(train, ""), *b = run_json(shuf, "");
    double pa = json_real_value(json_object_get(a, "perplexity")), pb = json_real_value(json_object_get(b, "perplexity"));
    fprintf(stderr, "perplexity: training patterns %.4f, shuffled %.4g\n", pa, pb);
    ck_assert_msg(pa < 3.0, "training patterns: perplexity %g, expected < 3", pa);
    ck_assert_msg(pb > 100.0, "shuffled: perplexity %g, expected > 100", pb);
    json_decref(a);
    json_decref(b);
}
END_TEST

START_TEST(every_token_scored_once)
{
    char path[700];
    write_text("count.txt", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22", path, sizeof path);
    int32_t t[128];
    int T = tokens_of("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22", t, 128);
    static const int cases[][2] = {{2, 1}, {5, 4}, {8, 3}, {8, 7}, {64, 10}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, "--ctx %d --stride %d", cases[i][0], cases[i][1]);
        json_t *o = run_json(path, extra);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "tokens_scored")), T);
        /* windows: the first k with k * S + N - 1 >= T, plus one */
        int n = cases[i][0], st = cases[i][1], k = 0;
        while (k * st + n - 1 < T)
            k++;
        ck_assert_int_eq(json_integer_value(json_object_get(o, "windows")), k + 1);
        json_decref(o);
    }
}
END_TEST

/** Expect exit status @p want and @p needle on stderr. */
static void expect_failure(const char *args, int want, const char *needle)
{
    char cli[3000], *out, *err;
    snprintf(cli, sizeof cli, "perplexity --model %s %s", g_dir, args);
    ck_assert_int_eq(mmoe_test_run_cli(g_tmp, cli, NULL, &out, &err), want);
    ck_assert_msg(strstr(err, needle) != NULL, "stderr lacks '%s': %s", needle, err);
    free(out), free(err);
}

START_TEST(bad_inputs_are_refused)
{
    char path[700], empty[700], args[1600];
    write_text("ok.txt", "1 2 3", path, sizeof path);
    write_text("empty.txt", "", empty, sizeof empty);
    expect_failure("--text-file /nonexistent/x.txt", 1, "/nonexistent/x.txt");
    snprintf(args, sizeof args, "--text-file %s", empty);
    expect_failure(args, 1, "no tokens");
    snprintf(args, sizeof args, "--text-file %s --ctx 1", path);
    expect_failure(args, 2, "--ctx");
    snprintf(args, sizeof args, "--text-file %s --ctx 8 --stride 8", path);
    expect_failure(args, 2, "--stride");
    snprintf(args, sizeof args, "--text-file %s --ctx 1000000000", path);
    expect_failure(args, 1, "max_seq_len");
    expect_failure("", 2, "--text-file");
}
END_TEST

int main(void)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fixtures/tiny-dsv4", src ? src : ".");
    if (mmoe_test_mkdtemp(g_tmp, sizeof g_tmp) != 0)
        return 1;
    Suite *s = suite_create("perplexity");
    TCase *tc = tcase_create("cli");
    tcase_add_test(tc, value_matches_a_token_by_token_reference);
    tcase_add_test(tc, training_patterns_low_shuffled_high);
    tcase_add_test(tc, every_token_scored_once);
    tcase_add_test(tc, bad_inputs_are_refused);
    suite_add_tcase(s, tc);
    int rc = mmoe_test_run(s);
    mmoe_test_rmtree(g_tmp);
    return rc;
}
