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
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mmoe_safetensors.h"
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
    expect_error_line("bench forward --model ck --peer --backend gpu", 2,
                      "megamoe bench forward: --peer times the CPU oracle's peer (OpenBLAS); it needs --backend cpu "
                      "(the GPU layer's peer is bench moe's PyTorch layer)");
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
        "synth-model --shape tiny --layers 1 --out t1 --threads 1",
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
    expect_error_line("synth-model --shape tiny --out t0 --threads 1025", 2,
                      "megamoe synth-model: --threads: expected an integer in [1, 1024], got '1025'");
    expect_error_line("synth-model --shape tiny --out t0 --threads 2x", 2,
                      "megamoe synth-model: --threads: expected an integer in [1, 1024], got '2x'");
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

/** Copy the safetensors file @p src to @p dst with one more space in its header: every tensor moves by one byte. */
static void misaligned_copy(const char *src, const char *dst)
{
    size_t n;
    uint8_t *in = mmoe_test_read_file(src, &n);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++)
        hl |= (uint64_t)in[i] << (8 * i);
    uint8_t *out = malloc(n + 1);
    ck_assert_ptr_nonnull(out);
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)((hl + 1) >> (8 * i));
    memcpy(out + 8, in + 8, hl);
    out[8 + hl] = ' '; /* trailing blanks after the JSON object are allowed */
    memcpy(out + 9 + hl, in + 8 + hl, n - 8 - hl);
    mmoe_test_write_file(dst, out, n + 1);
    free(in);
    free(out);
}

/** Do two files have the same bytes? */
static int same_bytes(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = mmoe_test_read_file(a, &na), *y = mmoe_test_read_file(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

START_TEST(unaligned_tensors_are_read)
{
    misaligned_copy("l.safetensors", "lu.safetensors");
    misaligned_copy("l.input.safetensors", "lu.input.safetensors");
    char *out, *err;
    ck_assert_int_eq(run("moe --weights l.safetensors --input l.input.safetensors --out y.safetensors", &out, &err), 0);
    free(out), free(err);
    ck_assert_int_eq(run("moe --weights lu.safetensors --input lu.input.safetensors --out yu.safetensors", &out, &err),
                     0);
    free(out), free(err);
    ck_assert(same_bytes("y.safetensors", "yu.safetensors"));
    /* a whole checkpoint whose shard is misaligned gives the same logits */
    ck_assert_int_eq(mmoe_test_system("cp -r ck cku"), 0);
    misaligned_copy("ck/model.safetensors", "cku/model.safetensors");
    ck_assert_int_eq(run("logits --model ck --ids 1,2,3 --out a.safetensors", &out, &err), 0);
    free(out), free(err);
    ck_assert_int_eq(run("logits --model cku --ids 1,2,3 --out b.safetensors", &out, &err), 0);
    free(out), free(err);
    ck_assert(same_bytes("a.safetensors", "b.safetensors"));
    /* inspect says which tensors were copied */
    ck_assert_int_eq(run("inspect lu.safetensors", &out, &err), 0);
    ck_assert_msg(strstr(out, "ffn.gate.weight") && strstr(out, "  copied\n") &&
                      strstr(out, "marked 'copied' are not aligned to their dtype in the file"), "%s", out);
    free(out), free(err);
}
END_TEST

/** Write a safetensors file from a header (padded here to 8 bytes) and its data section. */
static void write_raw(const char *name, const char *header, const void *data, size_t n)
{
    size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
    uint8_t *img = malloc(8 + padded + n);
    ck_assert_ptr_nonnull(img);
    for (int i = 0; i < 8; i++)
        img[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(img + 8, header, hl);
    memset(img + 8 + hl, ' ', padded - hl);
    memcpy(img + 8 + padded, data, n);
    mmoe_test_write_file(name, img, 8 + padded + n);
    free(img);
}

START_TEST(inspect_shows_what_the_file_is)
{
    char *out, *err;
    /* control characters in a name are escaped, never written raw */
    write_raw("esc.safetensors", "{\"a\\u001b[2Jb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x", 1);
    ck_assert_int_eq(run("inspect esc.safetensors", &out, &err), 0);
    ck_assert_msg(strstr(out, "a\\x1b[2Jb") != NULL && strchr(out, 0x1b) == NULL, "%s", out);
    free(out), free(err);
    /* BOOL, U16, U32, U64 are safetensors dtypes: listed, with statistics */
    const uint8_t data[16] = {1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0, 0, 0, 0, 0};
    write_raw("u.safetensors",
              "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]},"
              "\"h\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[2,4]},"
              "\"w\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[4,8]},"
              "\"q\":{\"dtype\":\"U64\",\"shape\":[1],\"data_offsets\":[8,16]}}",
              data, sizeof data);
    ck_assert_int_eq(run("inspect u.safetensors --stats", &out, &err), 0);
    /* the hand-derived maxima: BOOL {1, 0} -> 1; U16 0xffff = 65535; U32 0xffffffff; U64 7 */
    ck_assert_msg(strstr(out, "BOOL") && strstr(out, "U16") && strstr(out, "U32") && strstr(out, "U64"), "%s", out);
    ck_assert_msg(strstr(out, "65535") && strstr(out, "4.295e+09") && strstr(out, "note: no statistics") == NULL,
                  "%s", out);
    free(out), free(err);
    /* a file of another format is named as such */
    mmoe_test_write_file("model.gguf", "GGUF\x03\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00", 16);
    expect_error_line("inspect model.gguf", 1, "megamoe inspect: safetensors: model.gguf: not a safetensors file (a "
                      "safetensors file starts with an 8-byte header length and a JSON header '{...'; this one starts "
                      "with 'GGUF....')");
    /* a FIFO is refused at once (timeout: an open that waits for a writer would hang) */
    ck_assert_int_eq(mkfifo("pipe.safetensors", 0600), 0);
    ck_assert_int_eq(mmoe_test_system("timeout 20 \"$MMOE_BIN\" inspect pipe.safetensors 2> fifo.txt; test $? = 1"), 0);
    size_t n;
    char *msg = (char *)mmoe_test_read_file("fifo.txt", &n);
    ck_assert_msg(strstr(msg, "pipe.safetensors: not a regular file (a FIFO)") != NULL, "%s", msg);
    free(msg);
}
END_TEST

START_TEST(outputs_keep_their_mode_and_links)
{
    char *out, *err;
    ck_assert_int_eq(run("logits --model ck --ids 1,2 --out o.safetensors", &out, &err), 0);
    free(out), free(err);
    ck_assert_int_eq(chmod("o.safetensors", 0600), 0);
    ck_assert_int_eq(run("logits --model ck --ids 1,2,3 --out o.safetensors", &out, &err), 0);
    free(out), free(err);
    struct stat sb;
    ck_assert_int_eq(stat("o.safetensors", &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 07777, 0600);
    /* through a link: the link stays a link, the file it names gets the logits */
    ck_assert_int_eq(symlink("real.safetensors", "via-link.safetensors"), 0);
    mmoe_test_write_file("real.safetensors", "old", 3);
    ck_assert_int_eq(run("logits --model ck --ids 1,2 --out via-link.safetensors", &out, &err), 0);
    free(out), free(err);
    ck_assert_int_eq(lstat("via-link.safetensors", &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    ck_assert_int_eq(stat("real.safetensors", &sb), 0);
    ck_assert_int_gt(sb.st_size, 3);
    /* a link to nothing: refused, named */
    ck_assert_int_eq(symlink("no/such/dir/x.safetensors", "dangling.safetensors"), 0);
    ck_assert_int_eq(run("logits --model ck --ids 1,2 --out dangling.safetensors", &out, &err), 1);
    ck_assert_msg(strstr(err, "dangling.safetensors: a symbolic link to a file that does not exist") != NULL, "%s", err);
    free(out), free(err);
}
END_TEST

START_TEST(token_ids_out_of_range_are_named)
{
    char *out, *err;
    ck_assert_int_eq(run("synth-layer --shape tiny --hash --seed 2 --out h.safetensors", &out, &err), 0);
    free(out), free(err);
    /* x [2, 256] zeros, token_ids I64 {3, 2^63 - 1} */
    static uint16_t x[2 * 256];
    const int64_t ids[2] = {3, INT64_MAX};
    mmoe_st_writer *w;
    mmoe_error e;
    const int64_t xs[2] = {2, 256}, is[1] = {2};
    ck_assert_int_eq(mmoe_st_writer_create(&w, &e), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "x", MMOE_DT_BF16, 2, xs, x, sizeof x, &e), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "token_ids", MMOE_DT_I64, 1, is, ids, sizeof ids, &e), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_finish(w, "big-ids.safetensors", &e), MMOE_OK);
    mmoe_st_writer_destroy(w);
    ck_assert_int_eq(run("moe --weights h.safetensors --input big-ids.safetensors --out y.safetensors", &out, &err), 1);
    ck_assert_msg(strstr(err, "tensor 'token_ids': element 1 is 9223372036854775807, outside [0, 1024)") != NULL,
                  "%s", err);
    free(out), free(err);
    ck_assert_int_eq(file_size("y.safetensors"), -1);
}
END_TEST

/**
 * Does directory @p dir hold an entry whose name starts with @p prefix?  With @p names, the
 * names of all such entries (and of the entries inside those that are directories) are
 * appended to it, space-separated, as far as @p n bytes allow.
 */
static int has_entry_in(const char *dir, const char *prefix, char *names, size_t n)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        found = 1;
        if (names == NULL)
            break;
        size_t len = strlen(names);
        snprintf(names + len, n - len, "%s%s/%s", len ? " " : "", dir, e->d_name);
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        DIR *inner = opendir(sub);
        if (inner != NULL) {
            closedir(inner);
            if (strcmp(dir, ".") == 0) /* one level down: the partial directory's files */
                has_entry_in(sub, "", names, n);
        }
    }
    closedir(d);
    return found;
}

/** Does the current directory hold an entry whose name starts with @p prefix? */
static int has_entry(const char *prefix)
{
    return has_entry_in(".", prefix, NULL, 0);
}

START_TEST(ctrl_c_leaves_no_temporaries)
{
    /* a tiny-shape checkpoint of 200 layers of 128 experts (about 1.5 GB, tens of seconds to write
       on a 2-core machine) is far from done 300 ms in, also when a loaded machine delays the
       signal: a checkpoint finished before the signal lands is rightly kept, and would fail the
       check.  Its DIR.partial-PID/ exists from the start. */
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        if (freopen("/dev/null", "w", stderr) == NULL)
            _exit(99);
        execl(getenv("MMOE_BIN"), "megamoe", "synth-model", "--shape", "tiny", "--layers", "200", "--experts", "128",
              "--seed", "1", "--shard-mib", "4", "--out", "big", (char *)NULL);
        _exit(98);
    }
    int seen = 0;
    for (int i = 0; i < 60000 && !seen; i++) {
        seen = has_entry("big.partial-");
        if (!seen) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    ck_assert_msg(seen, "no big.partial-PID directory appeared");
    struct timespec ts = {0, 300 * 1000 * 1000}; /* a few shards in: temporary files inside too */
    nanosleep(&ts, NULL);
    kill(pid, SIGINT);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "status 0x%x: not ended by SIGINT", status);
    char left[4096] = "";
    ck_assert_msg(!has_entry_in(".", "big", left, sizeof left), "an interrupted synth-model left files behind: %s",
                  left);
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
    tcase_add_test(tc, unaligned_tensors_are_read);
    tcase_add_test(tc, inspect_shows_what_the_file_is);
    tcase_add_test(tc, outputs_keep_their_mode_and_links);
    tcase_add_test(tc, token_ids_out_of_range_are_named);
    tcase_add_test(tc, ctrl_c_leaves_no_temporaries);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(commands_cli_suite());
}
