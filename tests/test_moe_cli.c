/**
 * @file test_moe_cli.c
 * @brief Suite "moe_cli": `megamoe synth-layer`, `megamoe moe` and `megamoe bench moe` through
 *        $MMOE_BIN: round trips, options, and bad inputs (clear message, exit != 0, no output);
 *        the GPU GEMM kernel family names those options take.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmoe_formats.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_safetensors.h"
#include "mmoe_test.h"

static uint64_t g_seed;
static char g_dir[512];
static const char *g_bin;

/** Run "$MMOE_BIN ARGS > dir/out.txt 2>&1"; return the exit status. */
static int cli(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s > out.txt 2>&1", g_dir, g_bin, args);
    int rc = mmoe_test_system(cmd);
    char show[4200];
    snprintf(show, sizeof show, "cat '%s/out.txt' >&2", g_dir);
    (void)mmoe_test_system(show);
    return rc;
}

/** Does dir/out.txt contain @p needle? */
static int output_has(const char *needle)
{
    char path[600], buf[16384];
    snprintf(path, sizeof path, "%s/out.txt", g_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static int exists(const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    return access(path, F_OK) == 0;
}

static void setup(void)
{
    g_bin = getenv("MMOE_BIN");
    ck_assert_msg(g_bin != NULL, "MMOE_BIN is not set (run through make check)");
    ck_assert_int_eq(mmoe_test_mkdtemp(g_dir, sizeof g_dir), 0);
}

static void teardown(void)
{
    mmoe_test_rmtree(g_dir);
}

START_TEST(synth_then_moe_round_trip)
{
    char args[512];
    snprintf(args, sizeof args, "synth-layer --shape tiny --experts 6 --seed %llu --input-tokens 5 --layer 7 --out l.safetensors",
             (unsigned long long)g_seed);
    ck_assert_int_eq(cli(args), 0);
    ck_assert(exists("l.safetensors") && exists("l.input.safetensors"));
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors"), 0);
    ck_assert(output_has("shared: path fused"));
    ck_assert(output_has("time (ms)"));
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out yp.safetensors --pad-to 512 "
                         "--layer 7"),
                     0);
    ck_assert(output_has("padded (routed I 256 -> 512"));
    /* padding does not change the bits of y */
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/y.safetensors", g_dir);
    snprintf(p2, sizeof p2, "%s/yp.safetensors", g_dir);
    mmoe_st_file *a, *b;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_open(p1, &a, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_open(p2, &b, &err), MMOE_OK);
    const mmoe_tensor *ya = mmoe_st_find(a, "y"), *yb = mmoe_st_find(b, "y");
    ck_assert_ptr_nonnull(ya);
    ck_assert_ptr_nonnull(yb);
    ck_assert_int_eq(ya->shape[0], 5);
    ck_assert_int_eq(ya->shape[1], 256);
    ck_assert(memcmp(ya->data, yb->data, ya->nbytes) == 0);
    ck_assert_ptr_nonnull(mmoe_st_find(a, "topk_idx"));
    ck_assert_ptr_nonnull(mmoe_st_find(a, "topk_weights"));
    mmoe_st_close(a);
    mmoe_st_close(b);
    /* serial and the other recipes run, and say so */
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out ys.safetensors --shared serial "
                         "--recipe dsv4-ref"),
                     0);
    ck_assert(output_has("path serial (fallback: serial shared expert requested"));
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out y9.safetensors --recipe sm90"), 0);
    ck_assert(output_has("recipe sm90"));
}
END_TEST

START_TEST(hash_layer_via_cli)
{
    char args[512];
    snprintf(args, sizeof args, "synth-layer --shape tiny --hash --seed %llu --input-tokens 3 --out h.safetensors",
             (unsigned long long)g_seed);
    ck_assert_int_eq(cli(args), 0);
    ck_assert_int_eq(cli("moe --weights h.safetensors --input h.input.safetensors --out y.safetensors"), 0);
    ck_assert(output_has("routing hash"));
}
END_TEST

START_TEST(bad_inputs_fail_clearly)
{
    char args[512];
    snprintf(args, sizeof args, "synth-layer --shape tiny --seed %llu --input-tokens 2 --out l.safetensors",
             (unsigned long long)g_seed);
    ck_assert_int_eq(cli(args), 0);
    /* missing file */
    ck_assert_int_ne(cli("moe --weights nope.safetensors --input l.input.safetensors --out y.safetensors"), 0);
    ck_assert(output_has("nope.safetensors"));
    ck_assert(!exists("y.safetensors"));
    /* input of the wrong width: the weights file itself as input has no 'x' */
    ck_assert_int_ne(cli("moe --weights l.safetensors --input l.safetensors --out y.safetensors"), 0);
    ck_assert(output_has("tensor 'x'"));
    ck_assert(!exists("y.safetensors"));
    /* bad option values */
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors --recipe sm80"), 1);
    ck_assert(output_has("unknown recipe 'sm80'"));
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors --pad-to 100"), 2);
    ck_assert_int_eq(cli("moe --weights l.safetensors"), 2);
    /* fused required but impossible */
    ck_assert_int_ne(cli("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors --shared fused "
                         "--topk 32"),
                     0);
    ck_assert(!exists("y.safetensors"));
    /* the GPU backend where there is no GPU (these suites run on machines without one; the
     * GPU suite tests/test_gpu_moe covers the device): a clear error, exit 1, no output file */
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors --backend gpu"), 1);
    ck_assert(output_has("--backend gpu: gpu: "));
    ck_assert(output_has("no CUDA"));
    ck_assert(!exists("y.safetensors"));
    ck_assert_int_eq(cli("bench moe --shape tiny --backend gpu"), 1);
    ck_assert(output_has("no CUDA"));
    /* an unknown GEMM kernel family is a usage error, named, before any device is touched */
    ck_assert_int_eq(cli("bench moe --shape tiny --backend gpu --gemm tcgen05"), 2);
    ck_assert(output_has("--gemm must be one of auto, mma, wgmma, decode16, got 'tcgen05'"));
    /* "decode" names no family (the decode kernel's family is decode16): refused, not mapped */
    ck_assert_int_eq(cli("bench moe --shape tiny --backend gpu --gemm decode"), 2);
    ck_assert(output_has("--gemm must be one of auto, mma, wgmma, decode16, got 'decode'"));
    /* the same name through MMOE_GPU_GEMM: the layer refuses it before it looks for a device */
    setenv("MMOE_GPU_GEMM", "decode", 1);
    const int rc_env = cli("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors --backend gpu");
    unsetenv("MMOE_GPU_GEMM");
    ck_assert_int_eq(rc_env, 1);
    ck_assert(output_has("MMOE_GPU_GEMM=decode is not a GEMM kernel family (expected one of auto, mma, wgmma, "
                         "decode16)"));
    ck_assert(!exists("y.safetensors"));
    ck_assert_int_eq(cli("synth-layer --shape huge --seed 1 --out z.safetensors"), 1);
    ck_assert(output_has("unknown shape 'huge'"));
}
END_TEST

/** Write x BF16 [t, d] (small values) and token_ids I32 [t] to dir/NAME. */
static void write_input_file(const char *name, int64_t t, int64_t d)
{
    uint16_t *x = malloc((size_t)(t * d) * 2);
    int32_t *ids = malloc((size_t)t * 4);
    ck_assert(x != NULL && ids != NULL);
    for (int64_t i = 0; i < t * d; i++) { /* k/64 with |k| <= 11: exact in BF16, the top half of the FP32 bits */
        float v = (float)((i * 7) % 23 - 11) / 64.0f;
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        x[i] = (uint16_t)(bits >> 16);
    }
    for (int64_t i = 0; i < t; i++)
        ids[i] = (int32_t)(i * 5 % 17);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    mmoe_error err;
    mmoe_st_writer *w = NULL;
    const int64_t xs[2] = {t, d}, is[1] = {t};
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "x", MMOE_DT_BF16, 2, xs, x, (size_t)(t * d) * 2, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "token_ids", MMOE_DT_I32, 1, is, ids, (size_t)t * 4, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_finish(w, path, &err), MMOE_OK);
    mmoe_st_writer_destroy(w);
    free(x);
    free(ids);
}

/** The second dimension of tensor @p name in dir/FILE. */
static int64_t dim1_of(const char *file, const char *name)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", g_dir, file);
    mmoe_st_file *f;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_OK);
    const mmoe_tensor *t = mmoe_st_find(f, name);
    ck_assert_ptr_nonnull(t);
    int64_t n = t->shape[1];
    mmoe_st_close(f);
    return n;
}

START_TEST(checkpoint_values_come_from_its_config)
{
    /* the tiny preset (mmoe_config.h): top-2 of 8 experts, the first 2 layers hash-routed */
    char args[512];
    snprintf(args, sizeof args, "synth-model --shape tiny --layers 3 --seed %llu --out ck", (unsigned long long)g_seed);
    ck_assert_int_eq(cli(args), 0);
    write_input_file("in.safetensors", 3, 256);
    ck_assert_int_eq(cli("moe --weights ck --layer 2 --input in.safetensors --out y.safetensors"), 0);
    ck_assert_int_eq(dim1_of("y.safetensors", "topk_idx"), 2); /* 2 experts routed, not V4-Flash's 6 */
    ck_assert(output_has("routing biased"));
    ck_assert(output_has("values: topk 2 (config.json), route scale 1.5 (config.json)"));
    ck_assert_int_eq(cli("moe --weights ck --layer 0 --input in.safetensors --out y0.safetensors"), 0);
    ck_assert(output_has("routing hash"));
    ck_assert_int_eq(dim1_of("y0.safetensors", "topk_idx"), 2);
    /* an option still overrides */
    ck_assert_int_eq(cli("moe --weights ck --layer 2 --topk 3 --input in.safetensors --out y3.safetensors"), 0);
    ck_assert(output_has("topk 3 (--topk)"));
    ck_assert_int_eq(dim1_of("y3.safetensors", "topk_idx"), 3);
}
END_TEST

START_TEST(values_nobody_gives_are_refused)
{
    char args[512];
    snprintf(args, sizeof args, "synth-layer --shape tiny --seed %llu --input-tokens 2 --out l.safetensors",
             (unsigned long long)g_seed);
    ck_assert_int_eq(cli(args), 0);
    /* the same tensors without any metadata */
    char path[700];
    snprintf(path, sizeof path, "%s/l.safetensors", g_dir);
    mmoe_st_file *f;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_open(path, &f, &err), MMOE_OK);
    mmoe_st_writer *w = NULL;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    for (size_t i = 0; i < mmoe_st_count(f); i++)
        ck_assert_int_eq(mmoe_st_writer_add_tensor(w, mmoe_st_get(f, i)->name, &mmoe_st_get(f, i)->view, &err), MMOE_OK);
    snprintf(path, sizeof path, "%s/bare.safetensors", g_dir);
    ck_assert_int_eq(mmoe_st_writer_finish(w, path, &err), MMOE_OK);
    mmoe_st_writer_destroy(w);
    mmoe_st_close(f);
    const char *run = "moe --weights bare.safetensors --input l.input.safetensors --out y.safetensors";
    ck_assert_int_eq(cli(run), 1);
    ck_assert(output_has("megamoe moe: bare.safetensors: the layer's top-k is not given: no config.json next to the "
                         "weights and no 'moe.topk' metadata in them; pass --topk K"));
    snprintf(args, sizeof args, "%s --topk 2", run);
    ck_assert_int_eq(cli(args), 1);
    ck_assert(output_has("routed scaling factor is not given"));
    snprintf(args, sizeof args, "%s --topk 2 --route-scale 1.5", run);
    ck_assert_int_eq(cli(args), 1);
    ck_assert(output_has("SwiGLU limit is not given"));
    snprintf(args, sizeof args, "%s --topk 2 --route-scale 1.5 --swiglu-limit 10", run);
    ck_assert_int_eq(cli(args), 1);
    ck_assert(output_has("score function is not given"));
    ck_assert(!exists("y.safetensors"));
    snprintf(args, sizeof args, "%s --topk 2 --route-scale 1.5 --swiglu-limit 10 --scoring-func sqrtsoftplus", run);
    ck_assert_int_eq(cli(args), 0);
    /* the same bits as the file with metadata (which says the same values) */
    ck_assert_int_eq(cli("moe --weights l.safetensors --input l.input.safetensors --out ym.safetensors"), 0);
    uint8_t *a, *b;
    size_t na, nb;
    snprintf(path, sizeof path, "%s/y.safetensors", g_dir);
    a = mmoe_test_read_file(path, &na);
    snprintf(path, sizeof path, "%s/ym.safetensors", g_dir);
    b = mmoe_test_read_file(path, &nb);
    ck_assert(na == nb && memcmp(a, b, na) == 0);
    free(a);
    free(b);
    /* a malformed metadata value is named */
    ck_assert_int_eq(cli("moe --weights bare.safetensors --input l.input.safetensors --out y.safetensors --topk 2 "
                         "--route-scale 1.5 --swiglu-limit 10 --scoring-func softmax"), 1);
    ck_assert(output_has("score function 'softmax' (from --scoring-func): the MoE oracle implements sqrtsoftplus only"));
}
END_TEST

/**
 * The GEMM kernel family names that --gemm and MMOE_GPU_GEMM take (mmoe_gpu_gemm_parse): the
 * four families (written out here), each parsed to its value and named back; the list the
 * messages print; and names that are none of them ("decode", near misses, NULL) refused with
 * the output left as it was.
 */
START_TEST(gpu_gemm_family_names)
{
    static const struct {
        const char *name;
        mmoe_gpu_gemm gemm;
    } families[] = {{"auto", MMOE_GPU_GEMM_AUTO},
                    {"mma", MMOE_GPU_GEMM_MMA},
                    {"wgmma", MMOE_GPU_GEMM_WGMMA},
                    {"decode16", MMOE_GPU_GEMM_DECODE16}};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        mmoe_gpu_gemm g = families[i].gemm == MMOE_GPU_GEMM_AUTO ? MMOE_GPU_GEMM_MMA : MMOE_GPU_GEMM_AUTO;
        ck_assert_int_eq(mmoe_gpu_gemm_parse(families[i].name, &g), 0);
        ck_assert_int_eq(g, families[i].gemm);
        ck_assert_str_eq(mmoe_gpu_gemm_name(g), families[i].name);
    }
    ck_assert_str_eq(mmoe_gpu_gemm_names(), "auto, mma, wgmma, decode16");
    static const char *const not_families[] = {"decode", "decode8", "Decode16", "decode16 ", "e4m3", ""};
    for (size_t i = 0; i < sizeof not_families / sizeof not_families[0]; i++) {
        mmoe_gpu_gemm g = MMOE_GPU_GEMM_WGMMA;
        ck_assert_msg(mmoe_gpu_gemm_parse(not_families[i], &g) == -1, "'%s' parsed", not_families[i]);
        ck_assert_int_eq(g, MMOE_GPU_GEMM_WGMMA);
    }
    mmoe_gpu_gemm g = MMOE_GPU_GEMM_WGMMA;
    ck_assert_int_eq(mmoe_gpu_gemm_parse(NULL, &g), -1);
    ck_assert_int_eq(g, MMOE_GPU_GEMM_WGMMA);
}
END_TEST

START_TEST(bench_prints_the_shape_it_runs)
{
    ck_assert_int_eq(cli("bench moe --shape tiny --experts 4 --tokens 1 --reps 1"), 0);
    ck_assert(output_has("shape tiny with 4 of its 8 routed experts (--experts)"));
}
END_TEST

START_TEST(bench_runs_on_tiny)
{
    ck_assert_int_eq(cli("bench moe --shape tiny --experts 8 --tokens 0,3 --reps 1"), 0);
    ck_assert(output_has("ratio"));
}
END_TEST

int main(void)
{
    g_seed = mmoe_test_seed("moe_cli");
    Suite *s = suite_create("moe_cli");
    TCase *tc = tcase_create("cli");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, synth_then_moe_round_trip);
    tcase_add_test(tc, hash_layer_via_cli);
    tcase_add_test(tc, bad_inputs_fail_clearly);
    tcase_add_test(tc, bench_runs_on_tiny);
    tcase_add_test(tc, checkpoint_values_come_from_its_config);
    tcase_add_test(tc, values_nobody_gives_are_refused);
    tcase_add_test(tc, bench_prints_the_shape_it_runs);
    tcase_add_test(tc, gpu_gemm_family_names);
    suite_add_tcase(s, tc);
    return mmoe_test_run(s);
}
