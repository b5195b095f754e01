/**
 * @file test_safetensors_cli.c
 * @brief Suite "safetensors_cli": `megamoe inspect` on good and bad input, run as $MMOE_BIN.
 *
 * The expected lines are derived by hand from the tensors the test writes
 * (shapes, byte counts, min/max/mean of small known vectors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mmoe_safetensors.h"
#include "mmoe_test.h"
#include "st_test_files.h"

static char g_dir[512];

static const char *bin(void)
{
    const char *b = getenv("MMOE_BIN");
    return b ? b : "./megamoe";
}

/** Run `megamoe ARGS > out 2> err` in g_dir; return the exit status and the outputs. */
static int run_cli(const char *args, char **out, char **err_text)
{
    char cmd[2048], opath[700], epath[700];
    snprintf(opath, sizeof opath, "%s/stdout.txt", g_dir);
    snprintf(epath, sizeof epath, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "'%s' %s > '%s' 2> '%s'", bin(), args, opath, epath);
    int rc = mmoe_test_system(cmd);
    size_t n;
    *out = (char *)st_test_slurp(opath, &n);
    *err_text = (char *)st_test_slurp(epath, &n);
    return rc;
}

/** Does @p text hold a line containing all the words of @p words (space-separated)? */
static int has_line_with(const char *text, const char *words)
{
    const char *line = text;
    while (*line) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < 1023 ? len : 1023), line);
        char w[512];
        snprintf(w, sizeof w, "%s", words);
        int all = 1;
        for (char *save, *tok = strtok_r(w, " ", &save); tok && all;
             tok = strtok_r(NULL, " ", &save))
            all = strstr(buf, tok) != NULL;
        if (all)
            return 1;
        line = eol ? eol + 1 : line + len;
    }
    return 0;
}

static void setup(void)
{
    ck_assert_int_eq(mmoe_test_mkdtemp(g_dir, sizeof g_dir), 0);
}

static void teardown(void)
{
    mmoe_test_rmtree(g_dir);
}

/** Write the test file: F32 [2,3], BF16 [2], I8 [4], F8_E4M3 [2]. */
static void write_test_file(const char *path, const char *meta_value)
{
    static const float f32[6] = {1.0f, -3.0f, 0.5f, 2.5f, 0.0f, -1.0f};
    static const uint16_t bf16[2] = {0x3F80, 0x7FC0}; /* 1.0, NaN */
    static const int8_t i8[4] = {-7, 3, 0, 100};
    static const uint8_t fp8[2] = {0x38, 0xB8};
    mmoe_st_writer *w;
    mmoe_error err;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s4[1] = {4};
    ck_assert_int_eq(mmoe_st_writer_add(w, "layers.0.ffn.w1", MMOE_DT_F32, 2, s23, f32, 24, &err),
                     MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "norm.weight", MMOE_DT_BF16, 1, s2, bf16, 4, &err),
                     MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "layers.0.ffn.experts.0.w2.weight", MMOE_DT_I8, 1, s4,
                                        i8, 4, &err),
                     MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_add(w, "layers.0.attn.wq_a.weight", MMOE_DT_F8_E4M3, 1, s2,
                                        fp8, 2, &err),
                     MMOE_OK);
    if (meta_value)
        ck_assert_int_eq(mmoe_st_writer_set_metadata(w, "format", meta_value, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_finish(w, path, &err), MMOE_OK);
    mmoe_st_writer_destroy(w);
}

START_TEST(inspect_lists_tensors)
{
    char path[700], args[800];
    snprintf(path, sizeof path, "%s/t.safetensors", g_dir);
    write_test_file(path, "pt");
    char *out, *err;
    snprintf(args, sizeof args, "inspect '%s'", path);
    ck_assert_int_eq(run_cli(args, &out, &err), 0);
    ck_assert_msg(has_line_with(out, "layers.0.ffn.w1 F32 [2, 3] 24"), "%s", out);
    ck_assert(has_line_with(out, "norm.weight BF16 [2] 4"));
    ck_assert(has_line_with(out, "layers.0.ffn.experts.0.w2.weight I8 [4] 4"));
    ck_assert(has_line_with(out, "layers.0.attn.wq_a.weight F8_E4M3 [2] 2"));
    ck_assert(has_line_with(out, "total: 4 tensors, 34 bytes"));
    ck_assert(has_line_with(out, "format = pt"));
    free(out);
    free(err);
    /* --filter */
    snprintf(args, sizeof args, "inspect '%s' --filter ffn", path);
    ck_assert_int_eq(run_cli(args, &out, &err), 0);
    ck_assert(has_line_with(out, "layers.0.ffn.w1"));
    ck_assert(!has_line_with(out, "norm.weight"));
    ck_assert(has_line_with(out, "total: 2 tensors, 28 bytes"));
    free(out);
    free(err);
}
END_TEST

START_TEST(inspect_stats)
{
    char path[700], args[800];
    snprintf(path, sizeof path, "%s/t.safetensors", g_dir);
    write_test_file(path, NULL);
    char *out, *err;
    snprintf(args, sizeof args, "inspect --stats '%s'", path);
    ck_assert_int_eq(run_cli(args, &out, &err), 0);
    /* F32 {1,-3,.5,2.5,0,-1}: min -3, max 2.5, mean 0, absmax 3, no NaN/Inf */
    ck_assert_msg(has_line_with(out, "layers.0.ffn.w1 F32 [2, 3] 24 -3 2.5 0 3 0 0"), "%s", out);
    /* BF16 {1, NaN}: min = max = mean = absmax = 1, one NaN */
    ck_assert(has_line_with(out, "norm.weight BF16 [2] 4 1 1 1 1 1 0"));
    /* I8 {-7,3,0,100}: mean 96/4 = 24, absmax 100 */
    ck_assert(has_line_with(out, "w2.weight I8 [4] 4 -7 100 24 100 0 0"));
    /* FP8 E4M3 {0x38, 0xB8} = {1, -1}: mean 0, absmax 1 */
    ck_assert(has_line_with(out, "wq_a.weight F8_E4M3 [2] 2 -1 1 0 1 0 0"));
    ck_assert(!has_line_with(out, "note: no statistics"));
    free(out);
    free(err);
}
END_TEST

START_TEST(inspect_checkpoint_dir)
{
    char path[700], args[800];
    snprintf(path, sizeof path, "%s/ck", g_dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    char shard[800];
    snprintf(shard, sizeof shard, "%s/model-00001-of-00002.safetensors", path);
    write_test_file(shard, NULL);
    snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", path);
    static const float head[2] = {4.0f, 8.0f};
    mmoe_st_writer *w;
    mmoe_error e;
    ck_assert_int_eq(mmoe_st_writer_create(&w, &e), MMOE_OK);
    int64_t s2[1] = {2};
    ck_assert_int_eq(mmoe_st_writer_add(w, "head.weight", MMOE_DT_F32, 1, s2, head, 8, &e),
                     MMOE_OK);
    ck_assert_int_eq(mmoe_st_writer_finish(w, shard, &e), MMOE_OK);
    mmoe_st_writer_destroy(w);
    const char *names[5] = {"layers.0.ffn.w1", "norm.weight", "layers.0.ffn.experts.0.w2.weight",
                            "layers.0.attn.wq_a.weight", "head.weight"};
    const char *files[5] = {"model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                            "model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                            "model-00002-of-00002.safetensors"};
    char idx[800];
    snprintf(idx, sizeof idx, "%s/%s", path, MMOE_ST_INDEX_NAME);
    ck_assert_int_eq(mmoe_st_write_index(idx, 5, names, files, 42, &e), MMOE_OK);
    char *out, *err;
    snprintf(args, sizeof args, "inspect '%s'", path);
    ck_assert_int_eq(run_cli(args, &out, &err), 0);
    ck_assert_msg(has_line_with(out, "5 tensors in 2 shards"), "%s", out);
    ck_assert(has_line_with(out, "head.weight F32 [2] 8 model-00002-of-00002.safetensors"));
    ck_assert(has_line_with(out, "norm.weight BF16 [2] 4 model-00001-of-00002.safetensors"));
    ck_assert(has_line_with(out, "total: 5 tensors, 42 bytes"));
    free(out);
    free(err);
}
END_TEST

START_TEST(inspect_bad_input)
{
    char path[700], args[800];
    char *out, *err;
    /* missing file: exit 1, the message names it */
    snprintf(path, sizeof path, "%s/absent.safetensors", g_dir);
    snprintf(args, sizeof args, "inspect '%s'", path);
    ck_assert_int_eq(run_cli(args, &out, &err), 1);
    ck_assert_msg(strstr(err, path) && strstr(err, "megamoe inspect"), "%s", err);
    free(out);
    free(err);
    /* corrupt file: header length past the end */
    snprintf(path, sizeof path, "%s/bad.safetensors", g_dir);
    st_test_spill(path, "\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
    snprintf(args, sizeof args, "inspect --stats '%s'", path);
    ck_assert_int_eq(run_cli(args, &out, &err), 1);
    ck_assert_msg(strstr(err, path) && strstr(err, "header length 255"), "%s", err);
    free(out);
    free(err);
    /* a tensor whose bytes do not match its shape: the message names it */
    const char *hdr = "{\"w.bad\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    char img[256] = {(char)strlen(hdr)}; /* little-endian length, then header, then 4 bytes */
    memcpy(img + 8, hdr, strlen(hdr));
    memcpy(img + 8 + strlen(hdr), "abcd", 4);
    st_test_spill(path, img, 8 + strlen(hdr) + 4);
    ck_assert_int_eq(run_cli(args, &out, &err), 1);
    ck_assert_msg(strstr(err, "'w.bad'") && strstr(err, "needs 8 bytes"), "%s", err);
    free(out);
    free(err);
    /* usage errors: exit 2 */
    ck_assert_int_eq(run_cli("inspect", &out, &err), 2);
    ck_assert(strstr(err, "usage"));
    free(out);
    free(err);
    ck_assert_int_eq(run_cli("inspect --no-such-option x", &out, &err), 2);
    free(out);
    free(err);
    ck_assert_int_eq(run_cli("inspect a b", &out, &err), 2);
    free(out);
    free(err);
    ck_assert_int_eq(run_cli("inspect --filter", &out, &err), 2);
    free(out);
    free(err);
    /* --help: exit 0, usage on stdout */
    ck_assert_int_eq(run_cli("inspect --help", &out, &err), 0);
    ck_assert(strstr(out, "usage: megamoe inspect") && strstr(out, "--stats"));
    free(out);
    free(err);
    /* a directory without a checkpoint */
    snprintf(args, sizeof args, "inspect '%s'", g_dir);
    ck_assert_int_eq(run_cli(args, &out, &err), 1);
    ck_assert(strstr(err, MMOE_ST_INDEX_NAME));
    free(out);
    free(err);
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("safetensors_cli");
    TCase *tc = tcase_create("inspect");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, inspect_lists_tensors);
    tcase_add_test(tc, inspect_stats);
    tcase_add_test(tc, inspect_checkpoint_dir);
    tcase_add_test(tc, inspect_bad_input);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(cli_suite());
}
