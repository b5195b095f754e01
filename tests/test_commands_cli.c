/**
 * @file test_commands_cli.c
 * @brief Suite "commands_cli": what every `megamoe` command must do the same way, through
 *        $MMOE_BIN: strict numeric options, one error prefix, help texts, --threads, progress
 *        lines only on a terminal, and no output that replaces an input.
 *
 * The model is a copy of fixtures/tiny-dsv4 in a temporary directory (a command that wrongly
 * wrote over an input destroys only the copy); layers come from `megamoe synth-layer`.
 * Expected messages are written here from the rules of mmoe_cli.h, not taken from a run.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmoe_test.h"

static char g_dir[512];
static char g_model[700];

static void setup(void)
{
    ck_assert_msg(getenv("MMOE_BIN") != NULL && getenv("MMOE_SRCDIR") != NULL, "run through make check");
    ck_assert_int_eq(mmoe_test_mkdtemp(g_dir, sizeof g_dir), 0);
    snprintf(g_model, sizeof g_model, "%s/ck", g_dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp -r '%s/fixtures/tiny-dsv4' '%s' && cd '%s' && '%s' synth-layer --shape tiny --seed 5 "
             "--input-tokens 3 --out l.safetensors > /dev/null", getenv("MMOE_SRCDIR"), g_model, g_dir,
             getenv("MMOE_BIN"));
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    ck_assert_int_eq(chdir(g_dir), 0); /* the commands' relative paths are relative to it */
}

/** The size of a file in the temporary directory (-1: absent). */
static long long file_size(const char *name)
{
    struct stat sb;
    return stat(name, &sb) == 0 ? (long long)sb.st_size : -1;
}

static void teardown(void)
{
    ck_assert_int_eq(chdir("/"), 0);
    mmoe_test_rmtree(g_dir);
}

/** Run `megamoe ARGS` in the temporary directory; stdout and stderr into *out / *err. */
static int run(const char *args, char **out, char **err)
{
    return mmoe_test_run_cli(g_dir, args, NULL, out, err);
}

/** Expect exit status @p want and exactly @p line as the first line of stderr. */
static void expect_error_line(const char *args, int want, const char *line)
{
    char *out, *err;
    int rc = run(args, &out, &err);
    ck_assert_msg(rc == want, "megamoe %s: exit %d, expected %d; stderr: %s", args, rc, want, err);
    size_t n = strcspn(err, "\n");
    ck_assert_msg(strlen(line) == n && strncmp(err, line, n) == 0, "megamoe %s:\n  got      '%.*s'\n  expected '%s'",
                  args, (int)n, err, line);
    free(out);
    free(err);
}

START_TEST(numeric_options_are_strict)
{
    const char *moe = "moe --weights l.safetensors --input l.input.safetensors --out y.safetensors";
    char args[1024];
    snprintf(args, sizeof args, "%s --topk abc", moe);
    expect_error_line(args, 2, "megamoe moe: --topk: expected an integer in [1, 64], got 'abc'");
    snprintf(args, sizeof args, "%s --topk -1", moe);
    expect_error_line(args, 2, "megamoe moe: --topk: expected an integer in [1, 64], got '-1'");
    snprintf(args, sizeof args, "%s --topk 4294967298", moe);
    expect_error_line(args, 2, "megamoe moe: --topk: expected an integer in [1, 64], got '4294967298'");
    snprintf(args, sizeof args, "%s --swiglu-limit abc", moe);
    expect_error_line(args, 2, "megamoe moe: --swiglu-limit: expected a number in [0, 1e+06], got 'abc'");
    snprintf(args, sizeof args, "%s --route-scale 0", moe);
    expect_error_line(args, 2, "megamoe moe: --route-scale: expected a number in (0, 1e+06], got '0'");
    snprintf(args, sizeof args, "%s --layer 1x", moe);
    expect_error_line(args, 2, "megamoe moe: --layer: expected an integer in [0, 1048576], got '1x'");
    expect_error_line("synth-layer --shape tiny --seed xyz --out s.safetensors", 2,
                      "megamoe synth-layer: --seed: expected a non-negative integer, got 'xyz'");
    expect_error_line("synth-layer --shape tiny --seed 1 --experts 0 --out s.safetensors", 2,
                      "megamoe synth-layer: --experts: expected an integer in [1, 65536], got '0'");
    expect_error_line("synth-layer --shape tiny --seed 1 --input-tokens 1000000000000 --out s.safetensors", 2,
                      "megamoe synth-layer: --input-tokens: expected an integer in [0, 16777216], got '1000000000000'");
    ck_assert_msg(file_size("s.safetensors") < 0, "a refused synth-layer left its layer file");
    expect_error_line("bench moe --shape tiny --tokens 1,,3", 2,
                      "megamoe bench moe: --tokens: item 2: expected an integer in [0, 1048576], got ''");
    expect_error_line("bench moe --shape tiny --reps 2.5", 2,
                      "megamoe bench moe: --reps: expected an integer in [1, 100000], got '2.5'");
    expect_error_line("bench moe --shape tiny --seed -1", 2,
                      "megamoe bench moe: --seed: expected a non-negative integer, got '-1'");
    snprintf(args, sizeof args, "bench forward --model ck --prefill 0");
    expect_error_line(args, 2, "megamoe bench forward: --prefill: expected an integer in [1, 1000000], got '0'");
    expect_error_line("logits --model ck --ids 1,-2 --out o.safetensors", 2,
                      "megamoe logits: --ids: item 2: expected an integer in [0, 2147483647], got '-2'");
    expect_error_line("synth-model --shape tiny --seed 1e3 --out m", 2,
                      "megamoe synth-model: --seed: expected a non-negative integer, got '1e3'");
    expect_error_line("generate --model ck --prompt hi --top-p nan", 2,
                      "megamoe generate: --top-p: expected a number in (0, 1], got 'nan'");
}
END_TEST

START_TEST(renamed_token_options_say_so)
{
    expect_error_line("logits --model ck --tokens 1,2 --out o.safetensors", 2,
                      "megamoe logits: --tokens is now --ids ID,ID,... (the token ids)");
    expect_error_line("bench forward --model ck --tokens 4", 2,
                      "megamoe bench forward: --tokens is now --prefill N (the prompt's token count)");
    expect_error_line("synth-layer --shape tiny --seed 1 --tokens 4 --out s.safetensors", 2,
                      "megamoe synth-layer: --tokens is now --input-tokens T (the input file's token count)");
}
END_TEST

START_TEST(every_error_has_the_command_prefix)
{
    static const struct {
        const char *args, *prefix;
    } cases[] = {
        {"inspect no-such-file.safetensors", "megamoe inspect: "},
        {"inspect --frobnicate x", "megamoe inspect: "},
        {"moe --frobnicate", "megamoe moe: "},
        {"bench moe --frobnicate", "megamoe bench moe: "},
        {"bench forward --model", "megamoe bench forward: "},
        {"bench moe --shape huge", "megamoe bench moe: "},
        {"bench moe --shape tiny --recipe sm80", "megamoe bench moe: "},
        {"bench forward --model no-such-dir", "megamoe bench forward: "},
        {"logits --model no-such-dir --ids 1 --out o.safetensors", "megamoe logits: "},
        {"generate --model ck --prompt 'one two three four five six' --ctx-size 3", "megamoe generate: "},
        {"synth-model --shape huge --out m", "megamoe synth-model: "},
        {"tokenize --model no-such-dir --text hi", "megamoe tokenize: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        int rc = run(cases[i].args, &out, &err);
        ck_assert_msg(rc != 0, "megamoe %s succeeded", cases[i].args);
        /* some line is the error with the prefix; no line starts with the bare command name
         * ("inspect: ", getopt's habit) or repeats the prefix ("megamoe generate: generate: ") */
        const char *bare = cases[i].prefix + strlen("megamoe ");
        int found = 0;
        for (char *line = strtok(err, "\n"); line != NULL; line = strtok(NULL, "\n")) {
            ck_assert_msg(strncmp(line, bare, strlen(bare)) != 0, "megamoe %s: '%s'", cases[i].args, line);
            if (strncmp(line, cases[i].prefix, strlen(cases[i].prefix)) == 0) {
                found = 1;
                ck_assert_msg(strncmp(line + strlen(cases[i].prefix), bare, strlen(bare)) != 0,
                              "megamoe %s: doubled prefix in '%s'", cases[i].args, line);
            }
        }
        ck_assert_msg(found, "megamoe %s: no line starts with '%s'", cases[i].args, cases[i].prefix);
        free(out);
        free(err);
    }
}
END_TEST

START_TEST(help_texts_give_defaults_and_an_example)
{
    static const char *const cmds[] = {"moe",   "synth-layer", "bench moe",   "bench forward",
                                       "logits", "synth-model", "generate", "inspect", "tokenize"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[128], *out, *err;
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        ck_assert_int_eq(run(args, &out, &err), 0);
        ck_assert_msg(strstr(out, "example:\n  megamoe ") != NULL, "megamoe %s --help has no example", cmds[i]);
        /* each option line ("  --name ...") says its default or that it is required (itself, on its
         * continuation line, or in the heading of its section: "actions (one of them is required):") */
        int section_required = 0;
        for (char *line = strtok(out, "\n"); line != NULL; line = strtok(NULL, "\n")) {
            if (line[0] != ' ')
                section_required = strstr(line, "required") != NULL;
            if (strncmp(line, "  --", 4) != 0 || strstr(line, "--help") != NULL)
                continue;
            char *next = line + strlen(line) + 1; /* a description may continue on the next line */
            int ok = section_required || strstr(line, "default") || strstr(line, "required") ||
                     (strncmp(next, "    ", 4) == 0 && (strstr(next, "default") || strstr(next, "required")));
            ck_assert_msg(ok, "megamoe %s --help: no default for '%s'", cmds[i], line);
        }
        free(out);
        free(err);
    }
}
END_TEST

START_TEST(threads_on_every_compute_command)
{
    const char *ok[] = {
        "moe --weights l.safetensors --input l.input.safetensors --out y.safetensors --threads 1",
        "bench moe --shape tiny --tokens 1 --reps 1 --threads 1",
        "bench forward --model ck --prefill 2 --decode 1 --threads 1",
        "logits --model ck --ids 1,2 --out o.safetensors --threads 1",
        "generate --model ck --prompt hi --max-tokens 1 --threads 1",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char *out, *err;
        int rc = run(ok[i], &out, &err);
        ck_assert_msg(rc == 0, "megamoe %s: exit %d: %s", ok[i], rc, err);
        free(out);
        free(err);
    }
    expect_error_line("logits --model ck --ids 1 --out o.safetensors --threads 0", 2,
                      "megamoe logits: --threads: expected an integer in [1, 1024], got '0'");
}
END_TEST

START_TEST(no_carriage_returns_off_a_terminal)
{
    const char *cmds[] = {"logits --model ck --ids 1,2 --out o.safetensors",
                          "bench forward --model ck --prefill 2 --decode 1"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out, *err;
        ck_assert_int_eq(run(cmds[i], &out, &err), 0);
        ck_assert_msg(strchr(err, '\r') == NULL && strchr(out, '\r') == NULL, "megamoe %s wrote \\r to a file: %s",
                      cmds[i], err);
        free(out);
        free(err);
    }
}
END_TEST


START_TEST(an_output_never_replaces_an_input)
{
    const long long shard = file_size("ck/model.safetensors"), config = file_size("ck/config.json");
    const long long layer = file_size("l.safetensors");
    ck_assert(shard > 0 && config > 0 && layer > 0);
    expect_error_line("logits --model ck --ids 1,2 --out ck/model.safetensors", 1,
                      "megamoe logits: --out 'ck/model.safetensors' is the file 'ck/model.safetensors' of --model "
                      "'ck': an output may not replace an input");
    expect_error_line("logits --model ck --ids 1,2 --out ck/../ck/config.json", 1,
                      "megamoe logits: --out 'ck/../ck/config.json' is the file 'ck/config.json' of --model 'ck': an "
                      "output may not replace an input");
    expect_error_line("moe --weights l.safetensors --input l.input.safetensors --out l.safetensors", 1,
                      "megamoe moe: --out 'l.safetensors' is the same file as --weights 'l.safetensors': an output "
                      "may not replace an input");
    expect_error_line("moe --weights l.safetensors --input l.input.safetensors --out ./l.input.safetensors", 1,
                      "megamoe moe: --out './l.input.safetensors' is the same file as --input 'l.input.safetensors': "
                      "an output may not replace an input");
    /* links: a symbolic link and a hard link to an input are that input */
    ck_assert_int_eq(symlink("l.safetensors", "sym.safetensors"), 0);
    ck_assert_int_eq(link("l.safetensors", "hard.safetensors"), 0);
    expect_error_line("moe --weights l.safetensors --input l.input.safetensors --out sym.safetensors", 1,
                      "megamoe moe: --out 'sym.safetensors' is the same file as --weights 'l.safetensors': an output "
                      "may not replace an input");
    expect_error_line("moe --weights l.safetensors --input l.input.safetensors --out hard.safetensors", 1,
                      "megamoe moe: --out 'hard.safetensors' is the same file as --weights 'l.safetensors': an output "
                      "may not replace an input");
    expect_error_line("synth-layer --shape tiny --seed 1 --input-tokens 2 --out same.safetensors --input-out "
                      "same.safetensors", 1,
                      "megamoe synth-layer: --input-out 'same.safetensors' is the same file as --out "
                      "'same.safetensors': an output may not replace another output");
    ck_assert_int_eq(file_size("same.safetensors"), -1);
    ck_assert_int_eq(file_size("ck/model.safetensors"), shard);
    ck_assert_int_eq(file_size("ck/config.json"), config);
    ck_assert_int_eq(file_size("l.safetensors"), layer);
    /* an output next to the inputs, with another name, is fine */
    char *out, *err;
    ck_assert_int_eq(run("logits --model ck --ids 1,2 --out logits.safetensors", &out, &err), 0);
    free(out);
    free(err);
}
END_TEST

static Suite *commands_cli_suite(void)
{
    Suite *s = suite_create("commands_cli");
    TCase *tc = tcase_create("cli");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, numeric_options_are_strict);
    tcase_add_test(tc, renamed_token_options_say_so);
    tcase_add_test(tc, every_error_has_the_command_prefix);
    tcase_add_test(tc, help_texts_give_defaults_and_an_example);
    tcase_add_test(tc, threads_on_every_compute_command);
    tcase_add_test(tc, no_carriage_returns_off_a_terminal);
    tcase_add_test(tc, an_output_never_replaces_an_input);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(commands_cli_suite());
}
