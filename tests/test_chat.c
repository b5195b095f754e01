/**
 * @file test_chat.c
 * @brief Suite "chat": the DeepSeek-V4 chat encoding against the four official test vectors
 *        (fixtures/chat-encoding/), plus rules the vectors do not reach: Python's JSON text,
 *        chat/thinking suffixes, the max-effort preamble, argument fallbacks and errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_chat.h"
#include "mmoe_test.h"

static char *read_fixture(const char *name, size_t *len)
{
    const char *src = getenv("MMOE_SRCDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/fixtures/chat-encoding/%s", src ? src : ".", name);
    return (char *)mmoe_test_read_file(path, len);
}

static void check_case(int n, mmoe_chat_mode mode)
{
    char in_name[64], out_name[64];
    snprintf(in_name, sizeof in_name, "test_input_%d.json", n);
    snprintf(out_name, sizeof out_name, "test_output_%d.txt", n);
    size_t in_len, want_len;
    char *in = read_fixture(in_name, &in_len), *want = read_fixture(out_name, &want_len);
    mmoe_chat_options opt;
    mmoe_chat_options_default(&opt);
    opt.mode = mode;
    mmoe_text got = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_chat_encode_json(in, in_len, &opt, &got, &err) == MMOE_OK, "case %d: %s", n, err.msg);
    size_t first_diff = 0;
    while (first_diff < got.len && first_diff < want_len && got.data[first_diff] == want[first_diff])
        first_diff++;
    ck_assert_msg(got.len == want_len && first_diff == want_len,
                  "case %d: %zu bytes, expected %zu; first difference at byte %zu: got '%.40s', want '%.40s'", n,
                  got.len, want_len, first_diff, got.data + (first_diff < got.len ? first_diff : got.len),
                  want + (first_diff < want_len ? first_diff : want_len));
    mmoe_text_free(&got);
    free(in);
    free(want);
}

START_TEST(official_vectors)
{
    check_case(1, MMOE_CHAT_MODE_THINKING);
    check_case(2, MMOE_CHAT_MODE_THINKING);
    check_case(3, MMOE_CHAT_MODE_THINKING);
    check_case(4, MMOE_CHAT_MODE_CHAT);
}
END_TEST

static void expect_prompt(const char *json, mmoe_chat_mode mode, mmoe_chat_effort effort, const char *want)
{
    mmoe_chat_options opt;
    mmoe_chat_options_default(&opt);
    opt.mode = mode;
    opt.effort = effort;
    mmoe_text got = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_chat_encode_json(json, strlen(json), &opt, &got, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(strcmp(got.data, want) == 0, "got  '%s'\nwant '%s'", got.data, want);
    mmoe_text_free(&got);
}

#define BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
#define EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
#define USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"
#define DSML "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"

START_TEST(generation_prompts)
{
    const char *conv = "[{\"role\": \"user\", \"content\": \"Hi\"}]";
    /* transition suffix (docs/spec/architecture.md): a prompt for generation ends with ASSISTANT + THINK_CLOSE (chat) or THINK_OPEN (thinking) */
    expect_prompt(conv, MMOE_CHAT_MODE_CHAT, MMOE_CHAT_EFFORT_NONE, BOS USER "Hi" ASSISTANT "</think>");
    expect_prompt(conv, MMOE_CHAT_MODE_THINKING, MMOE_CHAT_EFFORT_NONE, BOS USER "Hi" ASSISTANT "<think>");
    /* high effort changes nothing; max puts the preamble before message 0 (thinking only) */
    expect_prompt(conv, MMOE_CHAT_MODE_THINKING, MMOE_CHAT_EFFORT_HIGH, BOS USER "Hi" ASSISTANT "<think>");
    expect_prompt(conv, MMOE_CHAT_MODE_CHAT, MMOE_CHAT_EFFORT_MAX, BOS USER "Hi" ASSISTANT "</think>");
    expect_prompt(conv, MMOE_CHAT_MODE_THINKING, MMOE_CHAT_EFFORT_MAX,
                  BOS "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
                  "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
                  "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
                  "adversarial scenarios.\n"
                  "Explicitly write out your entire deliberation process, documenting every intermediate step, "
                  "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
                  "unchecked.\n\n" USER "Hi" ASSISTANT "<think>");
    /* consecutive user messages merge into one turn, blocks joined by NL NL */
    expect_prompt("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]",
                  MMOE_CHAT_MODE_CHAT, MMOE_CHAT_EFFORT_NONE, BOS USER "a\n\nb" ASSISTANT "</think>");
    /* a non-action task gets only its token; wo_eos leaves out EOS */
    expect_prompt("[{\"role\": \"user\", \"content\": \"q\", \"task\": \"query\"},"
                  " {\"role\": \"assistant\", \"content\": \"x\", \"wo_eos\": true}]",
                  MMOE_CHAT_MODE_THINKING, MMOE_CHAT_EFFORT_NONE,
                  BOS USER "q<\xEF\xBD\x9Cquery\xEF\xBD\x9C>x");
}
END_TEST

START_TEST(context_messages)
{
    /* the first two messages are context (already in the KV cache): no BOS, not rendered;
       in thinking mode the drop filter sees the whole list, the new user turn opens <think> */
    const char *conv = "[{\"role\": \"user\", \"content\": \"q1\"},"
                       " {\"role\": \"assistant\", \"reasoning_content\": \"r\", \"content\": \"a1\"},"
                       " {\"role\": \"user\", \"content\": \"q2\"}]";
    mmoe_chat_options opt;
    mmoe_chat_options_default(&opt);
    opt.n_context = 2;
    opt.mode = MMOE_CHAT_MODE_THINKING;
    mmoe_text got = {0};
    ck_assert_int_eq(mmoe_chat_encode_json(conv, strlen(conv), &opt, &got, NULL), MMOE_OK);
    ck_assert_str_eq(got.data, USER "q2" ASSISTANT "<think>");
    got.len = 0;
    opt.mode = MMOE_CHAT_MODE_CHAT;
    opt.n_context = 1; /* the assistant turn is new: rendered, followed by the next user turn */
    ck_assert_int_eq(mmoe_chat_encode_json(conv, strlen(conv), &opt, &got, NULL), MMOE_OK);
    ck_assert_str_eq(got.data, "a1" EOS USER "q2" ASSISTANT "</think>");
    opt.n_context = 4;
    mmoe_error err;
    ck_assert_int_eq(mmoe_chat_encode_json(conv, strlen(conv), &opt, &got, &err), MMOE_EINVAL);
    mmoe_text_free(&got);
}
END_TEST

START_TEST(tool_call_arguments)
{
    /* non-string values are JSON in Python's style (2.50 -> 2.5, 1e5 -> 100000.0, lowercase \u escapes);
       strings are inserted raw */
    const char *conv =
        "[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
        "\"{\\\"n\\\": 5, \\\"x\\\": 2.50, \\\"big\\\": 1e5, \\\"small\\\": 1e-7, \\\"s\\\": \\\"a\\\\u001fb\\\","
        " \\\"l\\\": [true, null, {}], \\\"u\\\": \\\"\xC3\xA9/\\\"}\"}},"
        "{\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"not json\"}}]}]";
    expect_prompt(conv, MMOE_CHAT_MODE_CHAT, MMOE_CHAT_EFFORT_NONE,
                  BOS USER "u" ASSISTANT "</think>\n\n<" DSML "tool_calls>\n"
                  "<" DSML "invoke name=\"f\">\n"
                  "<" DSML "parameter name=\"n\" string=\"false\">5</" DSML "parameter>\n"
                  "<" DSML "parameter name=\"x\" string=\"false\">2.5</" DSML "parameter>\n"
                  "<" DSML "parameter name=\"big\" string=\"false\">100000.0</" DSML "parameter>\n"
                  "<" DSML "parameter name=\"small\" string=\"false\">1e-07</" DSML "parameter>\n"
                  "<" DSML "parameter name=\"s\" string=\"true\">a\x1f" "b</" DSML "parameter>\n"
                  "<" DSML "parameter name=\"l\" string=\"false\">[true, null, {}]</" DSML "parameter>\n"
                  "<" DSML "parameter name=\"u\" string=\"true\">\xC3\xA9/</" DSML "parameter>\n"
                  "</" DSML "invoke>\n"
                  "<" DSML "invoke name=\"g\">\n"
                  "<" DSML "parameter name=\"arguments\" string=\"true\">not json</" DSML "parameter>\n"
                  "</" DSML "invoke>\n"
                  "</" DSML "tool_calls>" EOS);
    /* the response format is Python-style JSON: control characters as lowercase \u00xx, floats as repr */
    expect_prompt("[{\"role\": \"system\", \"content\": \"S\", \"response_format\": {\"a\": \"\\u001f\\n\", "
                  "\"b\": 1e16, \"c\": 0.0001, \"d\": -0.0, \"e\": 123456789.125}}]",
                  MMOE_CHAT_MODE_CHAT, MMOE_CHAT_EFFORT_NONE,
                  BOS "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                  "{\"a\": \"\\u001f\\n\", \"b\": 1e+16, \"c\": 0.0001, \"d\": -0.0, \"e\": 123456789.125}");
}
END_TEST

START_TEST(tool_result_order)
{
    /* results come back in call order, whatever order the tool messages had */
    const char *conv =
        "[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"tool_calls\": ["
        "{\"id\": \"A\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}},"
        "{\"id\": \"B\", \"function\": {\"name\": \"g\", \"arguments\": \"{}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"B\", \"content\": \"rb\"},"
        "{\"role\": \"tool\", \"tool_call_id\": \"A\", \"content\": \"ra\"}]";
    expect_prompt(conv, MMOE_CHAT_MODE_CHAT, MMOE_CHAT_EFFORT_NONE,
                  BOS USER "u" ASSISTANT "</think>\n\n<" DSML "tool_calls>\n"
                  "<" DSML "invoke name=\"f\">\n\n</" DSML "invoke>\n"
                  "<" DSML "invoke name=\"g\">\n\n</" DSML "invoke>\n</" DSML "tool_calls>" EOS
                  USER "<tool_result>ra</tool_result>\n\n<tool_result>rb</tool_result>" ASSISTANT "</think>");
}
END_TEST

static void expect_error(const char *json, mmoe_status code, const char *needle)
{
    mmoe_text got = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_chat_encode_json(json, strlen(json), NULL, &got, &err), code);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    ck_assert(got.len == 0);
    mmoe_text_free(&got);
}

START_TEST(errors)
{
    expect_error("[{\"role\": \"user\", \"content\": ", MMOE_EFORMAT, "invalid JSON");
    expect_error("[{\"role\": \"wizard\", \"content\": \"x\"}]", MMOE_EINVAL, "wizard");
    expect_error("[{\"role\": \"user\", \"content\": \"x\", \"task\": \"dance\"}]", MMOE_EINVAL, "dance");
    expect_error("[{\"role\": \"developer\", \"content\": \"\"}]", MMOE_EFORMAT, "non-empty");
    expect_error("[{\"content\": \"x\"}]", MMOE_EFORMAT, "'role'");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": []}", MMOE_EFORMAT, "system");
    expect_error("[{\"role\": \"user\", \"content\": [1]}]", MMOE_EFORMAT, "message 0");
    /* tools and tool_calls must be arrays (a lone object rendered an empty block before) */
    expect_error("[{\"role\": \"system\", \"content\": \"s\", \"tools\": {\"type\": \"function\"}},"
                 " {\"role\": \"user\", \"content\": \"x\"}]",
                 MMOE_EFORMAT, "message 0 (system): key 'tools': expected an array");
    expect_error("[{\"role\": \"user\", \"content\": \"x\"},"
                 " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": \"get_weather\"}]",
                 MMOE_EFORMAT, "message 1 (assistant): key 'tool_calls': expected an array");
}
END_TEST

static void expect_parse(const char *completion, mmoe_chat_mode mode, const char *want)
{
    mmoe_text got = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_chat_parse_completion(completion, strlen(completion), mode, &got, &err) == MMOE_OK, "%s",
                  err.msg);
    ck_assert_msg(strcmp(got.data, want) == 0, "got  '%s'\nwant '%s'", got.data, want);
    mmoe_text_free(&got);
}

static void expect_parse_error(const char *completion, mmoe_chat_mode mode, const char *needle)
{
    mmoe_text got = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_chat_parse_completion(completion, strlen(completion), mode, &got, &err), MMOE_EFORMAT);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    mmoe_text_free(&got);
}

START_TEST(parse_completion)
{
    expect_parse("r</think>a" EOS, MMOE_CHAT_MODE_THINKING,
                 "{\"role\": \"assistant\", \"content\": \"a\", \"reasoning_content\": \"r\", \"tool_calls\": []}");
    expect_parse("Just text." EOS, MMOE_CHAT_MODE_CHAT,
                 "{\"role\": \"assistant\", \"content\": \"Just text.\", \"reasoning_content\": \"\", "
                 "\"tool_calls\": []}");
    /* the first assistant turn of test case 1, as the model would generate it after "<think>":
       the rebuilt arguments equal the input's arguments string */
    expect_parse("why</think>\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"get_weather\">\n"
                 "<" DSML "parameter name=\"location\" string=\"true\">Beijing</" DSML "parameter>\n"
                 "<" DSML "parameter name=\"unit\" string=\"true\">celsius</" DSML "parameter>\n"
                 "</" DSML "invoke>\n</" DSML "tool_calls>" EOS,
                 MMOE_CHAT_MODE_THINKING,
                 "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"why\", \"tool_calls\": "
                 "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
                 "\"{\\\"location\\\": \\\"Beijing\\\", \\\"unit\\\": \\\"celsius\\\"}\"}}]}");
    /* string="false" values go in verbatim; a multi-line string value is JSON-escaped; two calls */
    expect_parse("ok\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n"
                 "<" DSML "parameter name=\"n\" string=\"false\">[1, 2.5]</" DSML "parameter>\n"
                 "<" DSML "parameter name=\"s\" string=\"true\">a\"\nb</" DSML "parameter>\n"
                 "</" DSML "invoke>\n<" DSML "invoke name=\"g\">\n\n</" DSML "invoke>\n</" DSML "tool_calls>" EOS,
                 MMOE_CHAT_MODE_CHAT,
                 "{\"role\": \"assistant\", \"content\": \"ok\", \"reasoning_content\": \"\", \"tool_calls\": "
                 "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
                 "\"{\\\"n\\\": [1, 2.5], \\\"s\\\": \\\"a\\\\\\\"\\\\nb\\\"}\"}}, "
                 "{\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"{}\"}}]}");
    expect_parse_error("no end", MMOE_CHAT_MODE_CHAT, "EOS");
    expect_parse_error("a" EOS "b", MMOE_CHAT_MODE_CHAT, "follow EOS");
    expect_parse_error("no close" EOS, MMOE_CHAT_MODE_THINKING, "</think>");
    expect_parse_error("x<think>y" EOS, MMOE_CHAT_MODE_CHAT, "content contains");
    expect_parse_error("a\n\n<" DSML "tool_calls>\n</" DSML "tool_calls></think>" EOS, MMOE_CHAT_MODE_THINKING,
                       "before");
    expect_parse_error("\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n"
                       "<" DSML "parameter name=\"k\" string=\"true\">1</" DSML "parameter>\n"
                       "<" DSML "parameter name=\"k\" string=\"true\">2</" DSML "parameter>\n"
                       "</" DSML "invoke>\n</" DSML "tool_calls>" EOS, MMOE_CHAT_MODE_CHAT, "twice");
    expect_parse_error("\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n"
                       "<" DSML "parameter name=\"k\" string=\"maybe\">1</" DSML "parameter>\n"
                       "</" DSML "invoke>\n</" DSML "tool_calls>" EOS, MMOE_CHAT_MODE_CHAT, "true or false");
    expect_parse_error("\n\n<" DSML "tool_calls>\n</" DSML "tool_calls>x" EOS, MMOE_CHAT_MODE_CHAT, "expected");
}
END_TEST

START_TEST(render_then_parse)
{
    /* the encoder's tool-call block, cut after the prompt's "<｜Assistant｜></think>", parses back to
       the same content and the same arguments (in Python's JSON spelling) */
    const char *conv =
        "[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"c\", \"tool_calls\": ["
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
        "\"{\\\"a\\\": \\\"x y\\\", \\\"b\\\": 3, \\\"c\\\": {\\\"d\\\": [true]}}\"}}]}]";
    mmoe_text prompt = {0}, msg = {0};
    ck_assert_int_eq(mmoe_chat_encode_json(conv, strlen(conv), NULL, &prompt, NULL), MMOE_OK);
    const char *start = strstr(prompt.data, ASSISTANT "</think>");
    ck_assert_ptr_nonnull(start);
    start += strlen(ASSISTANT "</think>");
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_chat_parse_completion(start, strlen(start), MMOE_CHAT_MODE_CHAT, &msg, &err) == MMOE_OK, "%s",
                  err.msg);
    ck_assert_str_eq(msg.data, "{\"role\": \"assistant\", \"content\": \"c\", \"reasoning_content\": \"\", "
                               "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                               "\"arguments\": \"{\\\"a\\\": \\\"x y\\\", \\\"b\\\": 3, "
                               "\\\"c\\\": {\\\"d\\\": [true]}}\"}}]}");
    mmoe_text_free(&prompt);
    mmoe_text_free(&msg);
}
END_TEST

static Suite *chat_suite(void)
{
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("encode");
    tcase_add_test(tc, official_vectors);
    tcase_add_test(tc, generation_prompts);
    tcase_add_test(tc, context_messages);
    tcase_add_test(tc, tool_call_arguments);
    tcase_add_test(tc, tool_result_order);
    tcase_add_test(tc, errors);
    tcase_add_test(tc, parse_completion);
    tcase_add_test(tc, render_then_parse);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(chat_suite());
}
