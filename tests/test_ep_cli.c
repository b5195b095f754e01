/**
 * @file test_ep_cli.c
 * @brief Suite "ep_cli": the expert-parallel options of `megamoe logits` and `generate`.
 *
 *  - `logits --mtp --ep-ranks N` (N = 2, 8) writes the same file (logits and MTP logits), byte
 *    for byte, as without it, and reports the routed pairs per rank (which add up to
 *    tokens x topk x layers + MTP rows x topk);
 *  - `generate --ep-ranks 3` prints the same greedy continuation as without it;
 *  - `--gpus 2 --gpu-memory` smaller than the model's weights per GPU is refused before
 *    loading, with the bytes per GPU (tiny-dsv4: its tensors' bytes, derived below);
 *  - bad values and `--ep-ranks` with `--gpus` are refused with exit status 2 or 1, naming the
 *    option; N above the experts (9 > 8) is refused naming both counts; every refusal comes
 *    before the model is loaded (no progress line), and no output file appears;
 *  - `bench forward --gpus N` makes the same refusals (the bytes per GPU of the 2-GPU plan as
 *    derived below for `generate`), and refuses a contradicting --backend; no report appears.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mmoe_test.h"

static char g_dir[1024];

static void model_dir(char *buf, size_t n)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(buf, n, "%s/fixtures/tiny-dsv4", src ? src : ".");
}

/** Run `megamoe ARGS` in g_dir; returns the status, stderr in *err (caller frees). */
static int run(const char *args, char **out, char **err)
{
    return mmoe_test_run_cli(g_dir, args, NULL, out, err);
}

START_TEST(logits_same_bytes)
{
    char m[1100], args[4096], *out, *err;
    model_dir(m, sizeof m);
    snprintf(args, sizeof args, "logits --model '%s' --ids 0,20,21,22,23 --mtp --out '%s/ref.st'", m, g_dir);
    ck_assert_int_eq(run(args, &out, &err), 0);
    free(out);
    free(err);
    char ref_path[1200], path[1200];
    snprintf(ref_path, sizeof ref_path, "%s/ref.st", g_dir);
    size_t n_ref, n;
    uint8_t *ref = mmoe_test_read_file(ref_path, &n_ref);
    static const int ranks[] = {2, 8};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "logits --model '%s' --ids 0,20,21,22,23 --mtp --out '%s/ep.st' --ep-ranks %d", m,
                 g_dir, ranks[i]);
        ck_assert_int_eq(run(args, &out, &err), 0);
        ck_assert_msg(strstr(err, "in-process ranks, routed pairs per rank:") != NULL, "%s", err);
        /* the pairs add up to 5 tokens x top 2 x 4 layers + 4 MTP rows x top 2 = 48 */
        const char *p = strstr(err, "per rank:") + strlen("per rank:");
        long sum = 0;
        for (int r = 0; r < ranks[i]; r++)
            sum += strtol(p, (char **)&p, 10);
        ck_assert_int_eq(sum, 48);
        free(out);
        free(err);
        snprintf(path, sizeof path, "%s/ep.st", g_dir);
        uint8_t *got = mmoe_test_read_file(path, &n);
        ck_assert_msg(n == n_ref && memcmp(got, ref, n) == 0, "--ep-ranks %d: the logits file differs", ranks[i]);
        free(got);
    }
    free(ref);
}
END_TEST

START_TEST(generate_same_text)
{
    char m[1100], args[4096], *out1, *out2, *err;
    model_dir(m, sizeof m);
    snprintf(args, sizeof args, "generate --model '%s' --prompt '1 2 3 4' --max-tokens 8 --quiet", m);
    ck_assert_int_eq(run(args, &out1, &err), 0);
    free(err);
    snprintf(args, sizeof args, "generate --model '%s' --prompt '1 2 3 4' --max-tokens 8 --quiet --ep-ranks 3", m);
    ck_assert_int_eq(run(args, &out2, &err), 0);
    ck_assert_str_eq(out1, out2);
    ck_assert_msg(strstr(out1, " 5 6 7 8") != NULL, "continuation: %s", out1);
    free(out1);
    free(out2);
    free(err);
}
END_TEST

START_TEST(refusals)
{
    char m[1100], args[4096], *out, *err, path[1200];
    struct stat sb;
    model_dir(m, sizeof m);
    snprintf(path, sizeof path, "%s/no.st", g_dir);
    static const struct {
        const char *opts;
        int status;
        const char *msg;
    } cases[] = {
        /* tiny-dsv4 holds 3,190,041 tensor bytes; 1e-6 GiB * 0.9 = 966 bytes fit nothing */
        {"--gpus 2 --gpu-memory 0.000001", 1, "of weights per GPU on 2 GPUs"},
        {"--ep-ranks 9", 1, "9 ranks for 8 routed experts"},
        {"--ep-ranks 2 --gpus 2", 1, "--ep-ranks (CPU ranks) and --gpus exclude each other"},
        {"--ep-ranks 0", 2, "--ep-ranks: expected an integer in [1, 64], got '0'"},
        {"--gpus 2x", 2, "--gpus: expected an integer in [1, 64], got '2x'"},
        {"--gpu-memory -1 --gpus 1", 2, "--gpu-memory: expected a number in (0, 1e+06], got '-1'"},
        {"--gpu-memory 1", 1, "--gpu-memory plans --gpus"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "logits --model '%s' --ids 0,20 --out '%s' %s", m, path, cases[i].opts);
        ck_assert_int_eq(run(args, &out, &err), cases[i].status);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "%s: %s", cases[i].opts, err);
        ck_assert_msg(strstr(err, "loading:") == NULL, "%s: refused only after loading the model", cases[i].opts);
        ck_assert_int_ne(stat(path, &sb), 0);
        free(out);
        free(err);
    }
    /* the bytes per GPU of tiny-dsv4 on 2 GPUs, by hand: the README's 3,190,041 tensor bytes hold
     * 5 MoE blocks (4 layers + MTP) x 8 experts x 3 matrices of 128 x 64 FP4 bytes + 128 x 4 scale
     * bytes = 1,044,480 expert bytes; per GPU: the other 2,145,561 + half of the experts */
    const long long experts = 5LL * 8 * 3 * (128 * 64 + 128 * 4), per_gpu = 3190041 - experts + experts / 2;
    char want[64];
    snprintf(want, sizeof want, "needs %lld bytes", per_gpu);
    snprintf(args, sizeof args, "generate --model '%s' --prompt 1 --gpus 2 --gpu-memory 0.000001", m);
    ck_assert_int_eq(run(args, &out, &err), 1);
    ck_assert_msg(strstr(err, want) != NULL && strstr(err, "of weights per GPU on 2 GPUs") != NULL, "%s", err);
    free(out);
    free(err);
}
END_TEST

/* `bench forward --gpus N`: the same plan and refusals before loading, on any machine (the
 * device runs are test_ep_gpu_forward's); nothing on stdout */
START_TEST(bench_forward_refusals)
{
    char m[1100], args[4096], *out, *err;
    model_dir(m, sizeof m);
    static const struct {
        const char *opts;
        int status;
        const char *msg;
    } cases[] = {
        {"--gpus 2 --gpu-memory 0.000001", 1, "needs 2667801 bytes (0.00 GiB) of weights per GPU on 2 GPUs"},
        {"--gpus 9 --gpu-memory 100", 1, "9 ranks for 8 routed experts"},
        {"--gpus 1 --backend cpu", 2, "--gpus runs the GPU forward over N GPUs: --backend cpu or auto contradicts it"},
        {"--gpus 1 --backend auto", 2, "--backend cpu or auto contradicts it"},
        {"--gpus 0", 2, "--gpus: expected an integer in [1, 64], got '0'"},
        {"--gpus 65", 2, "--gpus: expected an integer in [1, 64], got '65'"},
        {"--gpus 1 --gpu-memory 0", 2, "--gpu-memory: expected a number in (0, 1e+06], got '0'"},
        {"--gpu-memory 1", 1, "--gpu-memory plans --gpus, which was not given"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "bench forward --model '%s' --prefill 4 --decode 2 %s", m, cases[i].opts);
        ck_assert_int_eq(run(args, &out, &err), cases[i].status);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "%s: %s", cases[i].opts, err);
        ck_assert_msg(strstr(err, "megamoe bench forward: ") != NULL, "%s: the command is not named: %s",
                      cases[i].opts, err);
        ck_assert_msg(out[0] == '\0', "%s: a report on stdout: %s", cases[i].opts, out);
        free(out);
        free(err);
    }
}
END_TEST

static Suite *ep_cli_suite(void)
{
    Suite *s = suite_create("ep_cli");
    TCase *tc = tcase_create("cli");
    tcase_add_test(tc, logits_same_bytes);
    tcase_add_test(tc, generate_same_text);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, bench_forward_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (mmoe_test_mkdtemp(g_dir, sizeof g_dir) != 0)
        return 99;
    int rc = mmoe_test_run(ep_cli_suite());
    mmoe_test_rmtree(g_dir);
    return rc;
}
