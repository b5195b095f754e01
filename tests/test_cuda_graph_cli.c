/**
 * @file test_cuda_graph_cli.c
 * @brief Suite "cuda_graph_cli": the switch of the GPU forward's decode-step CUDA graph without a
 *        GPU: MMOE_GPU_GRAPH's values and `--cuda-graph on|off` of logits, generate, serve and
 *        bench forward, through $MMOE_BIN.
 *
 * The rules under test (mmoe_gpu_forward.h, mmoe_fwd_backend.h): the variable is unset, "0" or
 * "1", anything else is refused naming it (exit 1, even under `--cuda-graph off`, since the
 * GPU model reads it again); the option takes "on" or "off" (else a usage error, exit 2);
 * `--cuda-graph on` with `--backend cpu` is a usage error; graphs with `--gpus N` are refused
 * (exit 2 for the option, 1 for the variable); with neither option nor variable, graphs are on
 * where one GPU model runs (`--backend gpu|auto`) and off on the CPU and over `--gpus N`; with
 * the CPU running, the reports say that no step was graphed.  The expected messages are written here from those rules.
 * Also MMOE_GPU_FP8_LINEARS, the recipe of the GPU forward's FP8 linears: unset, "exact" or
 * "tc"; anything else refused by every command (exit 1), whatever the backend.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mmoe_gpu_forward.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_safetensors.h"
#include "mmoe_test.h"

static char g_dir[512];
static char g_model[4096];

static void setup(void)
{
    ck_assert_msg(getenv("MMOE_BIN") != NULL && getenv("MMOE_SRCDIR") != NULL, "run through make check");
    ck_assert_int_eq(mmoe_test_mkdtemp(g_dir, sizeof g_dir), 0);
    snprintf(g_model, sizeof g_model, "%s/fixtures/tiny-dsv4", getenv("MMOE_SRCDIR"));
    unsetenv(MMOE_GPU_GRAPH_ENV);
}

static void teardown(void)
{
    unsetenv(MMOE_GPU_GRAPH_ENV);
    unsetenv(MMOE_GPU_FP8_LINEARS_ENV);
    mmoe_test_rmtree(g_dir);
}

/** Is a CUDA device usable (then `--backend auto` takes it)? */
static int have_gpu(void)
{
    int cc = 0;
    mmoe_error err;
    mmoe_error_clear(&err);
    return mmoe_gpu_available(&cc, &err) == MMOE_OK;
}

/** Run `megamoe ARGS` (MMOE_GPU_GRAPH=@p env, NULL: unset); expect exit @p want; stderr returned (free it). */
static char *run_expect(const char *env, const char *args, int want)
{
    if (env)
        ck_assert_int_eq(setenv(MMOE_GPU_GRAPH_ENV, env, 1), 0);
    else
        unsetenv(MMOE_GPU_GRAPH_ENV);
    char *out, *err;
    const int rc = mmoe_test_run_cli(g_dir, args, NULL, &out, &err);
    unsetenv(MMOE_GPU_GRAPH_ENV);
    ck_assert_msg(rc == want, "megamoe %s (MMOE_GPU_GRAPH=%s): exit %d, expected %d; stderr: %s", args,
                  env ? env : "(unset)", rc, want, err);
    free(out);
    return err;
}

/** Expect exit @p want and exactly @p line as the first line of stderr. */
static void expect_line(const char *env, const char *args, int want, const char *line)
{
    char *err = run_expect(env, args, want);
    const size_t n = strcspn(err, "\n");
    ck_assert_msg(strlen(line) == n && strncmp(err, line, n) == 0, "megamoe %s:\n  got      '%.*s'\n  expected '%s'",
                  args, (int)n, err, line);
    free(err);
}

/** The four commands with their required options (the model is the embedded fixture). */
static void command_args(int i, char *buf, size_t n, const char **name)
{
    static const char *const names[4] = {"logits", "generate", "serve", "bench forward"};
    *name = names[i];
    switch (i) {
    case 0: snprintf(buf, n, "logits --model '%s' --ids 1,2,3 --out '%s/l.st'", g_model, g_dir); break;
    case 1: snprintf(buf, n, "generate --model '%s' --prompt x --max-tokens 2", g_model); break;
    case 2: snprintf(buf, n, "serve --model '%s' --port 0", g_model); break;
    default: snprintf(buf, n, "bench forward --model '%s' --prefill 2 --decode 1", g_model); break;
    }
}

/** Run the logits command on the CPU (MMOE_GPU_GRAPH=@p env) and expect its file to say no call was graphed. */
static void expect_cpu_logits_not_graphed(const char *env)
{
    char args[8192], path[700];
    const char *name;
    command_args(0, args, sizeof args, &name);
    free(run_expect(env, args, 0));
    snprintf(path, sizeof path, "%s/l.st", g_dir);
    mmoe_st_file *f = NULL;
    mmoe_error e;
    mmoe_error_clear(&e);
    ck_assert_msg(mmoe_st_open(path, &f, &e) == MMOE_OK, "%s", e.msg);
    ck_assert_ptr_nonnull(mmoe_st_metadata(f, "cuda_graph"));
    ck_assert_str_eq(mmoe_st_metadata(f, "cuda_graph"), "false");
    ck_assert_str_eq(mmoe_st_metadata(f, "backend"), "cpu");
    mmoe_st_close(f);
}

START_TEST(env_values)
{
    static const struct {
        const char *value; /* NULL: unset */
        mmoe_status st;
        mmoe_gpu_graph_setting setting;
    } cases[] = {{NULL, MMOE_OK, MMOE_GPU_GRAPH_UNSET},   {"0", MMOE_OK, MMOE_GPU_GRAPH_OFF},
                 {"1", MMOE_OK, MMOE_GPU_GRAPH_ON},       {"", MMOE_EINVAL, MMOE_GPU_GRAPH_UNSET},
                 {"2", MMOE_EINVAL, MMOE_GPU_GRAPH_UNSET}, {"on", MMOE_EINVAL, MMOE_GPU_GRAPH_UNSET},
                 {"1 ", MMOE_EINVAL, MMOE_GPU_GRAPH_UNSET}, {"true", MMOE_EINVAL, MMOE_GPU_GRAPH_UNSET},
                 {"01", MMOE_EINVAL, MMOE_GPU_GRAPH_UNSET}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].value)
            ck_assert_int_eq(setenv(MMOE_GPU_GRAPH_ENV, cases[i].value, 1), 0);
        else
            unsetenv(MMOE_GPU_GRAPH_ENV);
        mmoe_error err;
        mmoe_error_clear(&err);
        mmoe_gpu_graph_setting setting = (mmoe_gpu_graph_setting)-1;
        const mmoe_status st = mmoe_gpu_graph_env(&setting, &err);
        ck_assert_msg(st == cases[i].st, "MMOE_GPU_GRAPH='%s': status %d, expected %d", cases[i].value, (int)st,
                      (int)cases[i].st);
        ck_assert_int_eq(setting, cases[i].setting); /* UNSET when refused: nothing half-set */
        if (st != MMOE_OK) {
            char want[128];
            snprintf(want, sizeof want, "MMOE_GPU_GRAPH='%s': expected 1", cases[i].value);
            ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "message '%s'", err.msg);
        }
    }
}
END_TEST

START_TEST(fp8_linears_values)
{
    static const struct {
        const char *value; /* NULL: unset */
        mmoe_status st;
        mmoe_gpu_fp8_linears r;
    } cases[] = {{NULL, MMOE_OK, MMOE_GPU_FP8_LINEARS_EXACT},     {"exact", MMOE_OK, MMOE_GPU_FP8_LINEARS_EXACT},
                 {"tc", MMOE_OK, MMOE_GPU_FP8_LINEARS_TC},         {"", MMOE_EINVAL, MMOE_GPU_FP8_LINEARS_EXACT},
                 {"TC", MMOE_EINVAL, MMOE_GPU_FP8_LINEARS_EXACT},  {"tc ", MMOE_EINVAL, MMOE_GPU_FP8_LINEARS_EXACT},
                 {"fast", MMOE_EINVAL, MMOE_GPU_FP8_LINEARS_EXACT}, {"1", MMOE_EINVAL, MMOE_GPU_FP8_LINEARS_EXACT}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].value)
            ck_assert_int_eq(setenv(MMOE_GPU_FP8_LINEARS_ENV, cases[i].value, 1), 0);
        else
            unsetenv(MMOE_GPU_FP8_LINEARS_ENV);
        mmoe_error err;
        mmoe_error_clear(&err);
        mmoe_gpu_fp8_linears r = (mmoe_gpu_fp8_linears)-1;
        const mmoe_status st = mmoe_gpu_fp8_linears_env(&r, &err);
        ck_assert_msg(st == cases[i].st, "MMOE_GPU_FP8_LINEARS='%s': status %d, expected %d", cases[i].value, (int)st,
                      (int)cases[i].st);
        ck_assert_int_eq(r, cases[i].r); /* exact when refused: nothing half-set */
        if (st != MMOE_OK) {
            char want[128];
            snprintf(want, sizeof want, "MMOE_GPU_FP8_LINEARS='%s': expected exact", cases[i].value);
            ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "message '%s'", err.msg);
        }
    }
    ck_assert_str_eq(mmoe_gpu_fp8_linears_name(MMOE_GPU_FP8_LINEARS_EXACT), "exact");
    ck_assert_str_eq(mmoe_gpu_fp8_linears_name(MMOE_GPU_FP8_LINEARS_TC), "tc");
    unsetenv(MMOE_GPU_FP8_LINEARS_ENV);
}
END_TEST

START_TEST(a_bad_fp8_linears_value_is_refused_by_every_command)
{
    char args[8192], line[256];
    const char *name;
    ck_assert_int_eq(setenv(MMOE_GPU_FP8_LINEARS_ENV, "fast", 1), 0);
    for (int i = 0; i < 4; i++) {
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --backend cpu"); /* refused whatever the backend: the value is wrong, not unused */
        snprintf(line, sizeof line,
                 "megamoe %s: MMOE_GPU_FP8_LINEARS='fast': expected exact (the oracle's bits) or tc (tensor-core "
                 "block partials, within a stated bound)", name);
        expect_line(NULL, args, 1, line);
    }
    unsetenv(MMOE_GPU_FP8_LINEARS_ENV);
}
END_TEST

START_TEST(option_values_are_on_or_off)
{
    char args[8192], line[256];
    const char *name;
    for (int i = 0; i < 4; i++) {
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --cuda-graph maybe");
        snprintf(line, sizeof line, "megamoe %s: --cuda-graph 'maybe': expected on or off", name);
        expect_line(NULL, args, 2, line);
    }
    struct stat sb;
    char path[700];
    snprintf(path, sizeof path, "%s/l.st", g_dir);
    ck_assert_msg(stat(path, &sb) != 0, "logits wrote its output after a usage error");
}
END_TEST

START_TEST(on_with_the_cpu_backend_is_refused)
{
    char args[8192], line[256];
    const char *name;
    for (int i = 0; i < 4; i++) {
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --cuda-graph on --backend cpu");
        snprintf(line, sizeof line,
                 "megamoe %s: --cuda-graph on runs the GPU forward's decode steps as graphs: --backend cpu contradicts it",
                 name);
        expect_line(NULL, args, 2, line);
    }
}
END_TEST

START_TEST(a_bad_variable_is_refused_by_every_command)
{
    char args[8192], line[256];
    const char *name;
    for (int i = 0; i < 4; i++) {
        command_args(i, args, sizeof args, &name);
        snprintf(line, sizeof line,
                 "megamoe %s: MMOE_GPU_GRAPH='maybe': expected 1 (decode steps as one CUDA graph) or 0 (off)", name);
        expect_line("maybe", args, 1, line);
    }
    /* the option does not hide it: the GPU model would read it again */
    command_args(0, args, sizeof args - 64, &name);
    strcat(args, " --cuda-graph off");
    expect_line("maybe", args, 1,
                "megamoe logits: MMOE_GPU_GRAPH='maybe': expected 1 (decode steps as one CUDA graph) or 0 (off)");
}
END_TEST

START_TEST(graphs_over_several_gpus_are_refused)
{
    char args[8192], line[512];
    const char *name;
    for (int i = 0; i < 4; i++) {
        if (i == 2)
            continue; /* serve has no --gpus */
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --gpus 2 --cuda-graph on");
        snprintf(line, sizeof line, "megamoe %s: --cuda-graph on: the forward over --gpus N exchanges rows through the "
                 "host inside each MoE sub-layer and runs kernel by kernel", name);
        expect_line(NULL, args, 2, line);
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --gpus 2");
        snprintf(line, sizeof line, "megamoe %s: MMOE_GPU_GRAPH=1: the forward over --gpus N exchanges rows through the "
                 "host inside each MoE sub-layer and runs kernel by kernel (pass --cuda-graph off or unset the "
                 "variable)", name);
        expect_line("1", args, 1, line);
    }
    /* --cuda-graph off wins over the variable: whatever happens next, it is not about graphs */
    command_args(0, args, sizeof args - 64, &name);
    strcat(args, " --gpus 2 --cuda-graph off");
    char *out, *err;
    ck_assert_int_eq(setenv(MMOE_GPU_GRAPH_ENV, "1", 1), 0);
    mmoe_test_run_cli(g_dir, args, NULL, &out, &err);
    ck_assert_msg(strstr(err, "cuda-graph") == NULL && strstr(err, MMOE_GPU_GRAPH_ENV) == NULL, "%s", err);
    free(out);
    free(err);
}
END_TEST

START_TEST(the_cpu_reports_no_graph)
{
    char args[8192];
    const char *name;
    /* MMOE_GPU_GRAPH=1 is the GPU model's: the CPU backend runs and says no step was graphed */
    expect_cpu_logits_not_graphed("1");
    snprintf(args, sizeof args, "bench forward --model '%s' --prefill 2 --decode 1 --json", g_model);
    char *out, *err;
    ck_assert_int_eq(setenv(MMOE_GPU_GRAPH_ENV, "1", 1), 0);
    ck_assert_int_eq(mmoe_test_run_cli(g_dir, args, NULL, &out, &err), 0);
    ck_assert_msg(strstr(out, "\"cuda_graph\":false") != NULL, "%s", out);
    free(out);
    free(err);
    /* auto without a GPU runs on the CPU and says that the option had nothing to do */
    if (!have_gpu()) {
        command_args(0, args, sizeof args - 64, &name);
        strcat(args, " --backend auto --cuda-graph on");
        err = run_expect(NULL, args, 0);
        ck_assert_msg(strstr(err, "backend: cpu (auto") && strstr(err, "cuda graph: not used"), "%s", err);
        free(err);
    }
}
END_TEST

/* neither option nor variable: graphs wherever one GPU model runs, off on the CPU and over --gpus N */
START_TEST(the_default_follows_the_backend)
{
    char args[8192];
    const char *name;
    for (int i = 0; i < 4; i++) {
        /* the CPU (the default backend): nothing about graphs, no step graphed */
        command_args(i, args, sizeof args - 64, &name);
        if (i == 2)
            continue; /* serve would listen */
        char *err = run_expect(NULL, args, 0);
        ck_assert_msg(strstr(err, "cuda graph") == NULL && strstr(err, "cuda-graph") == NULL, "%s: %s", name, err);
        free(err);
        /* auto: on where a GPU is (the backend line says so); without one the CPU runs and says the graph had nothing to do */
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --backend auto");
        err = run_expect(NULL, args, 0);
        if (have_gpu())
            ck_assert_msg(strstr(err, "backend: gpu (auto") && strstr(err, "cuda graph: on"), "%s: %s", name, err);
        else
            ck_assert_msg(strstr(err, "backend: cpu (auto") && strstr(err, "cuda graph: not used"), "%s: %s", name, err);
        free(err);
        /* --gpus N: off by default, so no refusal about graphs whatever else happens */
        command_args(i, args, sizeof args - 64, &name);
        strcat(args, " --gpus 2");
        unsetenv(MMOE_GPU_GRAPH_ENV);
        char *out;
        mmoe_test_run_cli(g_dir, args, NULL, &out, &err);
        ck_assert_msg(strstr(err, "cuda-graph") == NULL && strstr(err, MMOE_GPU_GRAPH_ENV) == NULL, "%s: %s", name, err);
        free(out);
        free(err);
    }
    /* the logits file of the CPU run says no call was graphed */
    expect_cpu_logits_not_graphed(NULL);
}
END_TEST

static Suite *cuda_graph_cli_suite(void)
{
    Suite *s = suite_create("cuda_graph_cli");
    TCase *tc = tcase_create("cli");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, env_values);
    tcase_add_test(tc, fp8_linears_values);
    tcase_add_test(tc, a_bad_fp8_linears_value_is_refused_by_every_command);
    tcase_add_test(tc, option_values_are_on_or_off);
    tcase_add_test(tc, the_default_follows_the_backend);
    tcase_add_test(tc, on_with_the_cpu_backend_is_refused);
    tcase_add_test(tc, a_bad_variable_is_refused_by_every_command);
    tcase_add_test(tc, graphs_over_several_gpus_are_refused);
    tcase_add_test(tc, the_cpu_reports_no_graph);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mmoe_test_run(cuda_graph_cli_suite()); }
