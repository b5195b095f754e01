/**
 * @file test_json_reports.c
 * @brief Suite "json_reports": `inspect --json`, `bench moe --json`, `bench forward --json` parse with
 *        jansson, line by line, and hold the keys and the relations the docs promise.
 *
 * The inspect counts are checked against fixtures/tiny-dsv4/README.md's figures (427 tensors,
 * 3,190,041 bytes), the bench rows against their own definitions (ratio_to_peer =
 * peer_median_ms / median_ms, tflops = gemm_flops / median time, the split's layers summing to
 * its totals); timings themselves are only checked to be positive numbers.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmoe_config.h"
#include "mmoe_test.h"

static char g_dir[1024]; /**< fixtures/tiny-dsv4 */
static char g_tmp[512];  /**< temp dir for the CLI's output files */

/** Run the CLI, assert exit 0, parse every stdout line; returns a JSON array of the objects. */
static json_t *run_lines(const char *args)
{
    char *out, *err;
    int rc = mmoe_test_run_cli(g_tmp, args, NULL, &out, &err);
    ck_assert_msg(rc == 0, "megamoe %s: exit %d: %s", args, rc, err);
    json_t *lines = json_array();
    char *save = NULL;
    for (char *line = strtok_r(out, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL && json_is_object(o), "megamoe %s: not a JSON object: '%s' (%s)", args, line, je.text);
        json_array_append_new(lines, o);
    }
    free(out), free(err);
    return lines;
}

/** The number at @p key (asserts it is one). */
static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_number(v), "key '%s' is not a number", key);
    return json_number_value(v);
}

/** |a - b| <= 1e-9 |b|. */
static void assert_rel(double a, double b, const char *what)
{
    ck_assert_msg(fabs(a - b) <= 1e-9 * fabs(b), "%s: %.17g vs %.17g", what, a, b);
}

START_TEST(inspect_json)
{
    char args[1200];
    snprintf(args, sizeof args, "inspect %s --json --stats", g_dir);
    json_t *lines = run_lines(args);
    size_t n = json_array_size(lines), tensors = 0;
    double bytes = 0;
    json_t *total = NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(lines, i);
        const char *type = json_string_value(json_object_get(o, "type"));
        ck_assert_ptr_nonnull(type);
        if (strcmp(type, "tensor") == 0) {
            ck_assert_ptr_null(total); /* tensors first */
            tensors++;
            bytes += num(o, "bytes");
            ck_assert(json_is_string(json_object_get(o, "name")) && json_is_array(json_object_get(o, "shape")));
            ck_assert(json_is_boolean(json_object_get(o, "stats_available")));
            if (strcmp(json_string_value(json_object_get(o, "name")), "norm.weight") == 0) {
                ck_assert_str_eq(json_string_value(json_object_get(o, "dtype")), "BF16");
                ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(o, "shape"), 0)), 128);
                ck_assert(num(o, "min") <= num(o, "mean") && num(o, "mean") <= num(o, "max"));
                ck_assert_int_eq(json_integer_value(json_object_get(o, "nan_count")), 0);
            }
        } else if (strcmp(type, "total") == 0) {
            total = o;
        } else {
            ck_assert_str_eq(type, "metadata");
            ck_assert(json_is_object(json_object_get(o, "metadata")));
        }
    }
    ck_assert_ptr_nonnull(total);
    ck_assert_uint_eq(tensors, 427);       /* fixtures/tiny-dsv4/README.md */
    ck_assert(bytes == 3190041.0);          /* idem */
    ck_assert(num(total, "tensors") == 427.0 && num(total, "bytes") == 3190041.0);
    json_t *by = json_object_get(total, "by_dtype");
    double sum = 0;
    const char *k;
    json_t *v;
    json_object_foreach(by, k, v) sum += num(v, "bytes");
    ck_assert(sum == 3190041.0);
    json_decref(lines);
}
END_TEST

START_TEST(bench_moe_json)
{
    json_t *lines = run_lines("bench moe --shape tiny --experts 8 --tokens 1,4 --reps 2 --json");
    ck_assert_uint_eq(json_array_size(lines), 2);
    static const char *const keys[] = {"median_ms", "tflops", "peer_median_ms", "ratio_to_peer", "gemm_flops"};
    for (size_t i = 0; i < 2; i++) {
        json_t *o = json_array_get(lines, i);
        ck_assert_str_eq(json_string_value(json_object_get(o, "bench")), "moe");
        ck_assert_str_eq(json_string_value(json_object_get(o, "backend")), "cpu");
        ck_assert_str_eq(json_string_value(json_object_get(o, "shape")), "tiny");
        ck_assert_str_eq(json_string_value(json_object_get(o, "peer")), "openblas-sgemm");
        ck_assert_int_eq(json_integer_value(json_object_get(o, "tokens")), i == 0 ? 1 : 4);
        for (size_t k2 = 0; k2 < sizeof keys / sizeof keys[0]; k2++)
            ck_assert_msg(num(o, keys[k2]) > 0, "%s", keys[k2]);
        assert_rel(num(o, "ratio_to_peer"), num(o, "peer_median_ms") / num(o, "median_ms"), "ratio_to_peer");
        assert_rel(num(o, "tflops"), num(o, "gemm_flops") / (num(o, "median_ms") * 1e-3) * 1e-12, "tflops");
    }
    json_decref(lines);
}
END_TEST

/** `megamoe bench forward --model <tiny> OPTIONS --json`: its one report line (in @p lines, to be freed). */
static json_t *bench_forward_report(const char *options, json_t **lines)
{
    char args[1200];
    snprintf(args, sizeof args, "bench forward --model %s %s --json", g_dir, options);
    *lines = run_lines(args);
    ck_assert_uint_eq(json_array_size(*lines), 1);
    json_t *o = json_array_get(*lines, 0);
    ck_assert_str_eq(json_string_value(json_object_get(o, "bench")), "forward");
    return o;
}

START_TEST(bench_forward_json)
{
    /* the default prefill (64 tokens): the option's name is not part of what this test checks */
    json_t *lines;
    json_t *o = bench_forward_report("--decode 2", &lines);
    ck_assert(num(o, "prefill_tokens") == 64 && num(o, "decode_tokens") == 2);
    assert_rel(num(o, "decode_ms_per_token"), 1e3 * num(o, "decode_s") / 2, "decode_ms_per_token");
    assert_rel(num(o, "prefill_tokens_per_s"), 64 / num(o, "prefill_s"), "prefill_tokens_per_s");
    ck_assert(num(o, "peak_rss_bytes") > 0 && num(o, "kv_cache_bytes") > 0 && num(o, "weight_bytes") > 0);
    /* what ran: the oracle's CPU kernels (either name; the same bits), the worker and OpenBLAS threads */
    const char *kernels = json_string_value(json_object_get(o, "cpu_kernels"));
    ck_assert_msg(kernels != NULL && (strcmp(kernels, "avx512") == 0 || strcmp(kernels, "avx2+fma") == 0 ||
                                     strcmp(kernels, "generic") == 0),
                  "cpu_kernels: %s", kernels ? kernels : "(missing)");
    ck_assert(num(o, "worker_threads") >= 1 && num(o, "openblas_threads") >= 1);
    ck_assert_ptr_nonnull(json_string_value(json_object_get(o, "openblas_core")));
    static const char *const splits[] = {"prefill_split", "decode_split"};
    for (int s = 0; s < 2; s++) {
        json_t *sp = json_object_get(o, splits[s]), *layers = json_object_get(sp, "layers");
        size_t nl = (size_t)(num(o, "layers") + num(o, "mtp_layers")); /* 4 + 1 (README) */
        ck_assert_uint_eq(nl, 5);
        ck_assert_uint_eq(json_array_size(layers), nl);
        double attn = 0;
        for (size_t L = 0; L < nl; L++)
            attn += num(json_array_get(layers, L), "attention_s");
        ck_assert_msg(fabs(attn - num(sp, "attention_s")) <= 1e-12 + 1e-9 * attn, "%s attention", splits[s]);
    }
    json_decref(lines);
}
END_TEST

/*
 * The forward's threads (cli_util.c, "Threads"): --threads N gives the worker pool N threads and
 * OpenBLAS one, whatever OPENBLAS_NUM_THREADS says; without --threads OpenBLAS keeps
 * OPENBLAS_NUM_THREADS when it is set (here 2, or fewer where OpenBLAS caps it at the CPUs), else
 * runs one thread.
 */
START_TEST(bench_forward_threads)
{
    json_t *lines;
    setenv("OPENBLAS_NUM_THREADS", "2", 1);
    json_t *o = bench_forward_report("--prefill 2 --decode 1 --threads 3", &lines);
    ck_assert(num(o, "worker_threads") == 3 && num(o, "openblas_threads") == 1);
    json_decref(lines);
    o = bench_forward_report("--prefill 2 --decode 1", &lines);
    /* OpenBLAS caps its threads at the CPUs this process may run on */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < cpus)
        cpus = CPU_COUNT(&set);
    const double got = num(o, "openblas_threads");
    ck_assert_msg(got == 2 || (got == 1 && cpus < 2), "OPENBLAS_NUM_THREADS=2 (%ld CPUs): openblas_threads %g", cpus,
                  got);
    json_decref(lines);
    unsetenv("OPENBLAS_NUM_THREADS");
    o = bench_forward_report("--prefill 2 --decode 1", &lines);
    ck_assert(num(o, "openblas_threads") == 1);
    json_decref(lines);
}
END_TEST

/*
 * The peer's floating-point operations of a step of T tokens, from its definition (the table of
 * bench_forward_peer.c): per layer the attention's products (by the layer's compress ratio) for
 * T rows, the T top-k pairs spread evenly over min(E, T top-k) experts and T rows of the shared
 * experts, 2 I D + D I weights an expert; the head's last row.  2 flops a multiply-add.
 */
static double peer_flops(const mmoe_config *c, int64_t T)
{
    const double D = (double)c->dim, d = c->head_dim, hd = (double)c->n_heads * c->head_dim, q = (double)c->q_lora_rank;
    const double G = c->o_groups, R = (double)c->o_lora_rank, inter = (double)c->moe_inter_dim;
    const double ih = c->index_n_heads, id = c->index_head_dim, expert = 2 * inter * D + D * inter;
    const int64_t pairs = T * c->n_activated_experts;
    const int64_t experts = pairs < c->n_routed_experts ? pairs : c->n_routed_experts;
    const int64_t rows = (pairs + experts - 1) / experts;
    double f = 0;
    for (int L = 0; L < c->n_layers; L++) {
        const int r = c->compress_ratios[L];
        double w = q * D + d * D + hd * q + G * (R * hd / G) + D * G * R;
        if (r > 0)
            w += 2 * (r == 4 ? 2 : 1) * d * D;
        if (r == 4)
            w += ih * id * q + ih * D + 2 * (2 * id) * D;
        f += 2 * (double)T * w + 2 * (double)(experts * rows) * expert + 2 * (double)T * c->n_shared_experts * expert;
    }
    return f + 2 * (double)c->vocab_size * D;
}

/* --peer: the SGEMM peer's times, its flops, and the ratios computed from them and the oracle's */
START_TEST(bench_forward_peer_json)
{
    json_t *lines;
    json_t *o = bench_forward_report("--prefill 8 --decode 2 --peer", &lines);
    ck_assert_str_eq(json_string_value(json_object_get(o, "peer")), "openblas-sgemm");
    ck_assert(num(o, "peer_prefill_s") > 0 && num(o, "peer_decode_ms_per_token") > 0);
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    mmoe_config cfg;
    mmoe_error err;
    ck_assert_msg(mmoe_config_load(path, &cfg, &err) == MMOE_OK, "%s", err.msg);
    assert_rel(num(o, "peer_prefill_gflop"), peer_flops(&cfg, 8) * 1e-9, "peer_prefill_gflop");
    assert_rel(num(o, "ratio_to_peer_prefill"), num(o, "peer_prefill_s") / num(o, "prefill_s"), "ratio_to_peer_prefill");
    assert_rel(num(o, "ratio_to_peer_decode"), num(o, "peer_decode_ms_per_token") / num(o, "decode_ms_per_token"),
               "ratio_to_peer_decode");
    json_decref(lines);
}
END_TEST

int main(void)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fixtures/tiny-dsv4", src ? src : ".");
    if (mmoe_test_mkdtemp(g_tmp, sizeof g_tmp) != 0)
        return 1;
    Suite *s = suite_create("json_reports");
    TCase *tc = tcase_create("cli");
    tcase_add_test(tc, inspect_json);
    tcase_add_test(tc, bench_moe_json);
    tcase_add_test(tc, bench_forward_json);
    tcase_add_test(tc, bench_forward_threads);
    tcase_add_test(tc, bench_forward_peer_json);
    suite_add_tcase(s, tc);
    int rc = mmoe_test_run(s);
    mmoe_test_rmtree(g_tmp);
    return rc;
}
