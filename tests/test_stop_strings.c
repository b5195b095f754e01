/**
 * @file test_stop_strings.c
 * @brief Suite "stop_strings": the stop-string matcher against hand-written expected answers,
 *        for every way of splitting the text into pushes.
 *
 * A stream must not change the answer: each case pushes its text whole, byte by byte, and
 * cut at every pair of positions into three pushes, and checks the released text and the
 * match flag against the expected values written here by reading the text.
 */
#include <string.h>

#include "mmoe_stop_strings.h"
#include "mmoe_test.h"

/** One case: stop strings, text, the answer and whether a stop string ends it. */
typedef struct stop_case {
    const char *stops[3];
    size_t n_stops;
    const char *text;
    const char *answer;
    int matched;
} stop_case;

static const stop_case cases[] = {
    {{"\n\n"}, 1, "ab\n\ncd", "ab", 1},
    {{"xyz"}, 1, "axyw", "axyw", 0},
    {{"xyz"}, 1, "axyxyzq", "axy", 1},
    {{"bc", "abcd"}, 2, "zabcd", "za", 1},    /* "bc" is completed first (byte 4, "abcd" at byte 5) */
    {{"abc", "bc"}, 2, "xabcd", "x", 1},      /* both end at byte 4: the longer wins */
    {{"ab", "abc"}, 2, "xabcd", "x", 1},      /* "ab" is completed first */
    {{"END"}, 1, "no stop here EN", "no stop here EN", 0},
    {{"\xC3\xA9t\xC3\xA9"}, 1, "caf\xC3\xA9 \xC3\xA9t\xC3\xA9!", "caf\xC3\xA9 ", 1}, /* "été" in UTF-8 */
    {{"x"}, 1, "x", "", 1},
    {{0}, 0, "anything", "anything", 0},
};

/** Push @p text cut at @p a and @p b (a <= b), finish; compare with the case. */
static void run_split(const stop_case *c, size_t a, size_t b)
{
    mmoe_stop_matcher m;
    mmoe_stop_init(&m, c->stops, c->n_stops);
    mmoe_text out = {0};
    int matched = 0;
    size_t len = strlen(c->text);
    size_t cuts[4] = {0, a, b, len};
    for (int k = 0; k < 3; k++)
        ck_assert_int_eq(mmoe_stop_push(&m, c->text + cuts[k], cuts[k + 1] - cuts[k], &out, &matched), MMOE_OK);
    ck_assert_int_eq(mmoe_stop_finish(&m, &out), MMOE_OK);
    ck_assert_msg(out.len == strlen(c->answer) && memcmp(out.data ? out.data : "", c->answer, out.len) == 0,
                  "text '%s' cut at %zu,%zu: released '%.*s', expected '%s'", c->text, a, b, (int)out.len,
                  out.data ? out.data : "", c->answer);
    ck_assert_int_eq(matched, c->matched);
    mmoe_text_free(&out);
    mmoe_stop_free(&m);
}

START_TEST(every_split_gives_the_answer)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = strlen(cases[i].text);
        for (size_t a = 0; a <= len; a++)
            for (size_t b = a; b <= len; b++)
                run_split(&cases[i], a, b);
    }
}
END_TEST

START_TEST(held_back_only_while_a_match_is_possible)
{
    /* "axy" may grow into "xyz": only "a" is released; "w" rules it out: "xyw" follows */
    static const char *const stops[] = {"xyz"};
    mmoe_stop_matcher m;
    mmoe_stop_init(&m, stops, 1);
    mmoe_text out = {0};
    int matched = 0;
    ck_assert_int_eq(mmoe_stop_push(&m, "axy", 3, &out, &matched), MMOE_OK);
    ck_assert_uint_eq(out.len, 1);
    ck_assert_int_eq(mmoe_stop_push(&m, "w", 1, &out, &matched), MMOE_OK);
    ck_assert_uint_eq(out.len, 4);
    ck_assert_str_eq(out.data, "axyw");
    ck_assert_int_eq(matched, 0);
    /* after a match, later text is dropped */
    ck_assert_int_eq(mmoe_stop_push(&m, "xyz tail", 8, &out, &matched), MMOE_OK);
    ck_assert_int_eq(mmoe_stop_push(&m, "more", 4, &out, &matched), MMOE_OK);
    ck_assert_int_eq(mmoe_stop_finish(&m, &out), MMOE_OK);
    ck_assert_str_eq(out.data, "axyw");
    ck_assert_int_eq(matched, 1);
    mmoe_text_free(&out);
    mmoe_stop_free(&m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stop_strings");
    TCase *tc = tcase_create("match");
    tcase_add_test(tc, every_split_gives_the_answer);
    tcase_add_test(tc, held_back_only_while_a_match_is_possible);
    suite_add_tcase(s, tc);
    return mmoe_test_run(s);
}
