/**
 * @file test_forward_xval.c
 * @brief Suite "forward_xval": the whole model against the independent NumPy forward (tests/xval/forward_numpy.py).
 *
 * A tiny random checkpoint (3 layers: hash + window-only, hash + ratio 4 with the indexer,
 * ratio 128, plus the MTP block) is written by mmoe_synth_model_write(); `megamoe logits
 * --mtp` computes the logits of 136 random tokens (past the 16-token window, 34 ratio-4
 * blocks for index_topk 4, one complete ratio-128 block); forward_numpy.py recomputes
 * them from the spec and compares.  A second run compares the decode path (`--decode`)
 * with the same NumPy prefill.  Skipped (77) without python3, NumPy or ml_dtypes.
 *
 * Expected: bit-exact in most models.  The MoE oracle's fp32 GEMMs (eight FMA lanes,
 * src/cpu_ref/moe_dot.c) and NumPy's double sums may round one fp32 result differently, which
 * flips one bf16 rounding and spreads from there (measured: 2 of 10 models on the Zen 3
 * development machine; see the script).  So the test accepts a flip-like divergence (script
 * exit 3) only if another random model (up to ::XVAL_MAX_MODELS in all, each seed printed) then
 * comes out bit-exact in both runs: a wrong formula makes every model differ, a flip does not.
 * A gross mismatch (exit 1) fails at once.  Even at one flip-like model in three, the chance that a
 * correct build sees no bit-exact model among eight is (1/3)^8 = 0.015%.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_config.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"

static uint64_t g_seed;
static int g_skipped;

/** Random models tried before a run of flip-like divergences counts as a failure. */
#define XVAL_MAX_MODELS 8

/** Exit status of forward_numpy.py --compare for a flip-like (not bit-exact) divergence. */
#define XVAL_FLIP_LIKE 3

/**
 * Compare one random model (seed @p seed) in prefill and decode with the NumPy forward:
 * 0 bit-exact in both, XVAL_FLIP_LIKE, 1 mismatch, MMOE_TEST_SKIP without NumPy.
 */
static int compare_one_model(uint64_t seed)
{
    const char *bin = getenv("MMOE_BIN"), *builddir = getenv("MMOE_BUILDDIR");
    ck_assert_msg(bin != NULL, "MMOE_BIN is not set (run through make check)");
    char root[512], dir[600], cmd[8192], tokens[4096];
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert(mmoe_config_preset("tiny", 3, &cfg, &err) == MMOE_OK);
    ck_assert_msg(mmoe_synth_model_write(&cfg, seed, dir, 1 << 20, 0, NULL, NULL, &err) == MMOE_OK, "%s", err.msg);
    mmoe_rng r;
    mmoe_rng_seed(&r, seed ^ 0x5eed);
    size_t len = 0;
    for (int i = 0; i < 136; i++)
        len += (size_t)snprintf(tokens + len, sizeof tokens - len, "%s%llu", i ? "," : "",
                                (unsigned long long)mmoe_rng_below(&r, (uint64_t)cfg.vocab_size));
    int verdict = 0;
    for (int decode = 0; decode < 2; decode++) {
        snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids %s --out '%s/logits.st' --mtp %s", bin, dir,
                 tokens, root, decode ? "--decode" : "");
        ck_assert_int_eq(mmoe_test_system(cmd), 0);
        snprintf(cmd, sizeof cmd, "sh '%s/tests/xval/run-xval.sh' forward_numpy.py '%s' %s --compare '%s/logits.st'",
                 builddir ? builddir : ".", dir, tokens, root);
        int rc = mmoe_test_system(cmd);
        if (rc == MMOE_TEST_SKIP) {
            verdict = MMOE_TEST_SKIP;
            break;
        }
        ck_assert_msg(rc == 0 || rc == XVAL_FLIP_LIKE, "%s logits differ from the NumPy forward (seed %llu)",
                      decode ? "decode" : "prefill", (unsigned long long)seed);
        if (rc == XVAL_FLIP_LIKE)
            verdict = XVAL_FLIP_LIKE;
    }
    mmoe_test_rmtree(root);
    return verdict;
}

START_TEST(logits_match_numpy)
{
    for (int model = 0; model < XVAL_MAX_MODELS; model++) {
        uint64_t seed = g_seed + (uint64_t)model;
        int verdict = compare_one_model(seed);
        if (verdict == MMOE_TEST_SKIP) {
            g_skipped = 1;
            return;
        }
        if (verdict == 0) {
            fprintf(stderr, "forward_xval: model %d (seed %llu) bit-exact\n", model, (unsigned long long)seed);
            return;
        }
        fprintf(stderr, "forward_xval: model %d (seed %llu) flip-like divergence; trying another model\n", model,
                (unsigned long long)seed);
    }
    ck_abort_msg("no bit-exact model among %d (seeds %llu..%llu): a systematic difference, not a rounding flip",
                 XVAL_MAX_MODELS, (unsigned long long)g_seed, (unsigned long long)(g_seed + XVAL_MAX_MODELS - 1));
}
END_TEST

int main(void)
{
    g_seed = mmoe_test_seed("forward_xval");
    Suite *s = suite_create("forward_xval");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, logits_match_numpy);
    suite_add_tcase(s, tc);
    int rc = mmoe_test_run(s);
    /* a forked test cannot set g_skipped in this process: ask Python directly */
    if (rc == 0) {
        const char *builddir = getenv("MMOE_BUILDDIR");
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "sh '%s/tests/xval/run-xval.sh' forward_numpy.py --probe >/dev/null",
                 builddir ? builddir : ".");
        if (g_skipped || mmoe_test_system(cmd) == MMOE_TEST_SKIP)
            return MMOE_TEST_SKIP;
    }
    return rc;
}
