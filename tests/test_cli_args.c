/**
 * @file test_cli_args.c
 * @brief Suite "cli_args": the strict numeric option parser of the CLI (src/cli/cli_args.c).
 *
 * Golden values are written by hand from the rules of mmoe_cli.h: the whole string is the
 * number, decimal or 0x-hexadecimal (never octal), it fits its type and lies in its range.
 * The boundary cases are the ones atoi/strtoll/strtod get wrong: an empty string, leading
 * blanks, trailing characters, a sign on an unsigned value, overflow, NaN and infinity,
 * and the open ends of a range.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmoe_cli.h"
#include "mmoe_test.h"

/** Parse @p s as i64 in [lo, hi]; the status, and the value in *v (poisoned with 0x5A5A... before). */
static mmoe_status i64(const char *s, int64_t lo, int64_t hi, int64_t *v, mmoe_error *err)
{
    *v = 0x5A5A5A5A5A5A5A5ALL;
    mmoe_error_clear(err);
    return mmoe_cli_parse_i64(s, lo, hi, v, err);
}

START_TEST(i64_accepts_whole_numbers)
{
    mmoe_error err;
    int64_t v;
    ck_assert_int_eq(i64("42", 1, 64, &v, &err), MMOE_OK);
    ck_assert_int_eq(v, 42);
    ck_assert_int_eq(i64("-5", -10, 10, &v, &err), MMOE_OK);
    ck_assert_int_eq(v, -5);
    ck_assert_int_eq(i64("010", 0, 100, &v, &err), MMOE_OK); /* decimal, not octal 8 */
    ck_assert_int_eq(v, 10);
    ck_assert_int_eq(i64("0x10", 0, 100, &v, &err), MMOE_OK);
    ck_assert_int_eq(v, 16);
    ck_assert_int_eq(i64("-0x10", -100, 0, &v, &err), MMOE_OK);
    ck_assert_int_eq(v, -16);
    ck_assert_int_eq(i64("9223372036854775807", INT64_MIN, INT64_MAX, &v, &err), MMOE_OK);
    ck_assert(v == INT64_MAX);
    ck_assert_int_eq(i64("-9223372036854775808", INT64_MIN, INT64_MAX, &v, &err), MMOE_OK);
    ck_assert(v == INT64_MIN);
    ck_assert_int_eq(i64("1", 1, 1, &v, &err), MMOE_OK); /* both ends are inclusive */
}
END_TEST

START_TEST(i64_refuses_partial_or_out_of_range)
{
    static const char *const bad[] = {"",    " 1", "1 ", "abc", "1x", "+", "-", "--1", "0x", "1.0", "1e3",
                                      "4294967298", "65", "0", "-1", "9223372036854775808", "\t7", "7\n"};
    mmoe_error err;
    int64_t v;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(i64(bad[i], 1, 64, &v, &err) == MMOE_EINVAL, "'%s' accepted", bad[i]);
        ck_assert_msg(v == 0x5A5A5A5A5A5A5A5ALL, "'%s' wrote the value", bad[i]);
    }
    ck_assert_int_eq(i64("9223372036854775808", INT64_MIN, INT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(i64("-9223372036854775809", INT64_MIN, INT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(i64("99999999999999999999999", INT64_MIN, INT64_MAX, &v, &err), MMOE_EINVAL);
}
END_TEST

START_TEST(messages_name_range_and_value)
{
    mmoe_error err;
    int64_t v;
    uint64_t u;
    double d;
    i64("abc", 1, 64, &v, &err);
    ck_assert_str_eq(err.msg, "expected an integer in [1, 64], got 'abc'");
    i64("-3", 0, INT64_MAX, &v, &err);
    ck_assert_str_eq(err.msg, "expected an integer >= 0, got '-3'");
    mmoe_cli_parse_u64("-1", 0, UINT64_MAX, &u, &err);
    ck_assert_str_eq(err.msg, "expected a non-negative integer, got '-1'");
    mmoe_cli_parse_f64("x", 0.0, 1.0, MMOE_CLI_LO_OPEN, &d, &err);
    ck_assert_str_eq(err.msg, "expected a number in (0, 1], got 'x'");
    mmoe_cli_parse_f64("-1", 0.0, INFINITY, MMOE_CLI_LO_OPEN, &d, &err);
    ck_assert_str_eq(err.msg, "expected a number > 0, got '-1'");
    /* control characters are not echoed raw; very long values are cut */
    i64("1\0332", 1, 64, &v, &err);
    ck_assert_str_eq(err.msg, "expected an integer in [1, 64], got '1?2'");
    char longv[200];
    memset(longv, '9', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    i64(longv, 1, 64, &v, &err);
    ck_assert_msg(strlen(err.msg) < 140 && strstr(err.msg, "...'") != NULL, "%s", err.msg);
}
END_TEST

START_TEST(u64_full_range_and_sign)
{
    mmoe_error err;
    uint64_t v = 7;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_cli_parse_u64("18446744073709551615", 0, UINT64_MAX, &v, &err), MMOE_OK);
    ck_assert(v == UINT64_MAX);
    ck_assert_int_eq(mmoe_cli_parse_u64("0xffffffffffffffff", 0, UINT64_MAX, &v, &err), MMOE_OK);
    ck_assert(v == UINT64_MAX);
    v = 7;
    ck_assert_int_eq(mmoe_cli_parse_u64("18446744073709551616", 0, UINT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_u64("-1", 0, UINT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_u64("+1", 0, UINT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_u64(" 1", 0, UINT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_u64("xyz", 0, UINT64_MAX, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_u64("0", 1, 10, &v, &err), MMOE_EINVAL);
    ck_assert(v == 7);
}
END_TEST

START_TEST(f64_finite_whole_and_open_ends)
{
    mmoe_error err;
    double v = -7;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_cli_parse_f64("1.5", 0, 10, 0, &v, &err), MMOE_OK);
    ck_assert(v == 1.5);
    ck_assert_int_eq(mmoe_cli_parse_f64("2.5e1", 0, 100, 0, &v, &err), MMOE_OK);
    ck_assert(v == 25.0);
    ck_assert_int_eq(mmoe_cli_parse_f64("1e-400", 0, 1, 0, &v, &err), MMOE_OK); /* underflow to 0: a number */
    ck_assert(v >= 0.0 && v < 1e-300);
    ck_assert_int_eq(mmoe_cli_parse_f64("1", 0, 1, 0, &v, &err), MMOE_OK);
    ck_assert(v == 1.0);
    static const char *const bad[] = {"", " 1", "1 ", "abc", "1.5x", "nan", "NaN", "inf", "-inf", "1e999", "-1e999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        v = -7;
        ck_assert_msg(mmoe_cli_parse_f64(bad[i], -INFINITY, INFINITY, 0, &v, &err) == MMOE_EINVAL, "'%s' accepted",
                      bad[i]);
        ck_assert(v == -7);
    }
    ck_assert_int_eq(mmoe_cli_parse_f64("0", 0, 1, MMOE_CLI_LO_OPEN, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_f64("1", 0, 1, MMOE_CLI_HI_OPEN, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_f64("1.0000001", 0, 1, 0, &v, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_f64("-0.5", 0, 1, 0, &v, &err), MMOE_EINVAL);
}
END_TEST

START_TEST(lists)
{
    mmoe_error err;
    int64_t *items = NULL;
    size_t n = 0;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("1,8,64", 0, 1000, 32, &items, &n, &err), MMOE_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert(items[0] == 1 && items[1] == 8 && items[2] == 64);
    free(items);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("7", 0, 1000, 32, &items, &n, &err), MMOE_OK);
    ck_assert(n == 1 && items[0] == 7);
    free(items);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("1,,2", 0, 1000, 32, &items, &n, &err), MMOE_EINVAL);
    ck_assert_str_eq(err.msg, "item 2: expected an integer in [0, 1000], got ''");
    ck_assert(items == NULL && n == 0);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("1,", 0, 1000, 32, &items, &n, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("", 0, 1000, 32, &items, &n, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("1, 2", 0, 1000, 32, &items, &n, &err), MMOE_EINVAL);
    ck_assert_int_eq(mmoe_cli_parse_i64_list("1,2,3", 0, 1000, 2, &items, &n, &err), MMOE_EINVAL);
    ck_assert_str_eq(err.msg, "at most 2 comma-separated values, got 3");
    ck_assert_int_eq(mmoe_cli_parse_i64_list("5,1001", 0, 1000, 32, &items, &n, &err), MMOE_EINVAL);
    ck_assert_str_eq(err.msg, "item 2: expected an integer in [0, 1000], got '1001'");
}
END_TEST

/** Run @p fn with stderr sent to a temporary file; returns what it printed (malloc'd). */
static char *capture_stderr(int (*fn)(void), int *rc)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    ck_assert(tmp != NULL);
    int saved = dup(STDERR_FILENO);
    ck_assert(saved >= 0 && dup2(fileno(tmp), STDERR_FILENO) >= 0);
    *rc = fn();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    long n = ftell(tmp) >= 0 ? (fseek(tmp, 0, SEEK_END), ftell(tmp)) : 0;
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    ck_assert(buf != NULL && fread(buf, 1, (size_t)n, tmp) == (size_t)n);
    fclose(tmp);
    return buf;
}

static int bad_topk(void)
{
    int v = 99;
    int rc = mmoe_cli_opt_int("moe", "topk", "abc", 1, 64, &v);
    ck_assert_int_eq(v, 99);
    return rc;
}

static int bad_tokens_list(void)
{
    int64_t *items = NULL;
    size_t n = 0;
    int rc = mmoe_cli_opt_i64_list("bench moe", "tokens", "1,x", 1, 100, 32, &items, &n);
    ck_assert(items == NULL);
    return rc;
}

START_TEST(option_messages_name_command_and_option)
{
    int rc;
    char *msg = capture_stderr(bad_topk, &rc);
    ck_assert_int_eq(rc, MMOE_EXIT_USAGE);
    ck_assert_str_eq(msg, "megamoe moe: --topk: expected an integer in [1, 64], got 'abc'\n");
    free(msg);
    msg = capture_stderr(bad_tokens_list, &rc);
    ck_assert_int_eq(rc, MMOE_EXIT_USAGE);
    ck_assert_str_eq(msg, "megamoe bench moe: --tokens: item 2: expected an integer in [1, 100], got 'x'\n");
    free(msg);
    int v = 0;
    ck_assert_int_eq(mmoe_cli_opt_int("moe", "topk", "6", 1, 64, &v), 0);
    ck_assert_int_eq(v, 6);
}
END_TEST

static Suite *cli_args_suite(void)
{
    Suite *s = suite_create("cli_args");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, i64_accepts_whole_numbers);
    tcase_add_test(tc, i64_refuses_partial_or_out_of_range);
    tcase_add_test(tc, messages_name_range_and_value);
    tcase_add_test(tc, u64_full_range_and_sign);
    tcase_add_test(tc, f64_finite_whole_and_open_ends);
    tcase_add_test(tc, lists);
    tcase_add_test(tc, option_messages_name_command_and_option);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(cli_args_suite());
}
