/**
 * @file chat_parse.c
 * @brief Parsing a generated completion back into an assistant message (@ref spec_arch_chat_parse).
 *
 * The completion is the text the model generated after the prompt, up to and
 * including EOS.  In thinking mode it starts with the reasoning (the prompt already
 * ended in `<think>`), closed by `</think>`; then comes the answer, and optionally a
 * tool-call block in the DSML layout the encoder writes (@ref spec_arch_chat_toolcalls):
 *
 * @verbatim
 *     reasoning</think>content\n\n<｜DSML｜tool_calls>\n
 *     <｜DSML｜invoke name="f">\n
 *     <｜DSML｜parameter name="k" string="true">v</｜DSML｜parameter>\n
 *     </｜DSML｜invoke>\n
 *     </｜DSML｜tool_calls><｜end▁of▁sentence｜>
 * @endverbatim
 *
 * The parser is strict: any deviation from this layout, a duplicate parameter, text
 * after EOS, or a marker (BOS, EOS, `<think>`, `</think>`, `｜DSML｜`) inside the reasoning or
 * the content is an error, so that a malformed generation is reported, not guessed at.
 * One leniency: an invoke with no parameters may contain the blank line the encoder
 * writes for it.  Each call's arguments are rebuilt as a JSON object string,
 * `{"k": "v", "n": 5}`: a `string="true"` value is JSON-quoted, a `string="false"`
 * value is inserted verbatim (it already is JSON).
 */
#include <jansson.h>
#include <string.h>

#include "chat_internal.h"
#include "mmoe_chat.h"

#define CALLS_MARKER "\n\n<" DSML "tool_calls" /**< where a tool-call block starts */

/** A cursor over the completion text. */
typedef struct cursor {
    const char *s;   /**< the text */
    size_t len;      /**< its length */
    size_t pos;      /**< the next byte to read */
    mmoe_error *err; /**< where failures are reported */
} cursor;

/** memmem over [from, len) of the cursor's text: offset of @p needle, or SIZE_MAX. */
static size_t find(const cursor *c, size_t from, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = from; i + n <= c->len; i++)
        if (memcmp(c->s + i, needle, n) == 0)
            return i;
    return SIZE_MAX;
}

/** Consume @p lit exactly at the cursor, or fail naming what was expected. */
static mmoe_status expect(cursor *c, const char *lit)
{
    size_t n = strlen(lit);
    if (c->pos + n > c->len || memcmp(c->s + c->pos, lit, n) != 0)
        return mmoe_error_set(c->err, MMOE_EFORMAT, "completion: byte %zu: expected '%s', found '%.30s'", c->pos, lit,
                              c->s + c->pos);
    c->pos += n;
    return MMOE_OK;
}

/** Nonzero when the text at the cursor starts with @p lit (nothing is consumed). */
static int at(const cursor *c, const char *lit)
{
    size_t n = strlen(lit);
    return c->pos + n <= c->len && memcmp(c->s + c->pos, lit, n) == 0;
}

/** Read up to (not including) the next @p delim; the delimiter is consumed too. */
static mmoe_status read_until(cursor *c, const char *delim, const char **out, size_t *out_len)
{
    size_t end = find(c, c->pos, delim);
    if (end == SIZE_MAX)
        return mmoe_error_set(c->err, MMOE_EFORMAT, "completion: byte %zu: expected '%s' later on, found none", c->pos,
                              delim);
    *out = c->s + c->pos;
    *out_len = end - c->pos;
    c->pos = end + strlen(delim);
    return MMOE_OK;
}

/** Fail when @p s contains one of the markers that may not appear in reasoning or content. */
static mmoe_status check_clean(const char *what, const char *s, size_t len, mmoe_error *err)
{
    static const char *markers[] = {BOS, EOS, "<think>", "</think>", DSML};
    cursor c = {s, len, 0, err};
    for (size_t k = 0; k < sizeof markers / sizeof markers[0]; k++)
        if (find(&c, 0, markers[k]) != SIZE_MAX)
            return mmoe_error_set(err, MMOE_EFORMAT, "completion: the %s contains the marker '%s'", what, markers[k]);
    return MMOE_OK;
}

/** One invoke element: name, parameters, rebuilt arguments string. */
static mmoe_status parse_invoke(cursor *c, json_t *calls)
{
    const char *name, *key, *flag, *value;
    size_t name_len, key_len, flag_len, value_len;
    mmoe_status st = expect(c, "<" DSML "invoke");
    while (st == MMOE_OK && c->pos < c->len && (c->s[c->pos] == ' ' || c->s[c->pos] == '\t' || c->s[c->pos] == '\n'))
        c->pos++;
    if (st == MMOE_OK)
        st = expect(c, "name=\"");
    if (st == MMOE_OK)
        st = read_until(c, "\"", &name, &name_len);
    if (st == MMOE_OK)
        st = expect(c, ">\n");
    if (st == MMOE_OK && at(c, "\n</" DSML "invoke>")) /* no parameters, written with a blank line */
        c->pos++;
    mmoe_text args = {0};
    json_t *seen = json_object();
    if (st == MMOE_OK && mmoe_text_append(&args, "{", 1) != MMOE_OK)
        st = MMOE_ENOMEM;
    while (st == MMOE_OK && at(c, "<" DSML "parameter")) {
        st = expect(c, "<" DSML "parameter name=\"");
        if (st == MMOE_OK)
            st = read_until(c, "\"", &key, &key_len);
        if (st == MMOE_OK)
            st = expect(c, " string=\"");
        if (st == MMOE_OK)
            st = read_until(c, "\"", &flag, &flag_len);
        if (st == MMOE_OK)
            st = expect(c, ">");
        if (st == MMOE_OK)
            st = read_until(c, "</" DSML "parameter>", &value, &value_len);
        if (st == MMOE_OK)
            st = expect(c, "\n");
        if (st != MMOE_OK)
            break;
        int is_string = flag_len == 4 && memcmp(flag, "true", 4) == 0;
        if (!is_string && !(flag_len == 5 && memcmp(flag, "false", 5) == 0)) {
            st = mmoe_error_set(c->err, MMOE_EFORMAT, "completion: parameter '%.*s': string=\"%.*s\", expected true or "
                                "false", (int)key_len, key, (int)flag_len, flag);
            break;
        }
        json_t *k = json_stringn(key, key_len);
        if (k == NULL || json_object_get(seen, json_string_value(k)) != NULL) {
            json_decref(k);
            st = mmoe_error_set(c->err, MMOE_EFORMAT, "completion: call '%.*s': parameter '%.*s' appears twice",
                                (int)name_len, name, (int)key_len, key);
            break;
        }
        json_object_set_new(seen, json_string_value(k), json_true());
        json_decref(k);
        if (args.len > 1)
            st = mmoe_text_append(&args, ", ", 2);
        if (st == MMOE_OK)
            st = chat_json_string(key, key_len, &args);
        if (st == MMOE_OK)
            st = mmoe_text_append(&args, ": ", 2);
        if (st == MMOE_OK)
            st = is_string ? chat_json_string(value, value_len, &args) : mmoe_text_append(&args, value, value_len);
    }
    if (st == MMOE_OK)
        st = expect(c, "</" DSML "invoke>\n");
    if (st == MMOE_OK)
        st = mmoe_text_append(&args, "}", 1);
    if (st == MMOE_OK) {
        json_t *call = json_pack("{s:s, s:{s:s%, s:s%}}", "type", "function", "function", "name", name, name_len,
                                 "arguments", args.data, args.len);
        if (call == NULL)
            st = mmoe_error_set(c->err, MMOE_EFORMAT, "completion: call name or arguments are not valid UTF-8");
        else
            json_array_append_new(calls, call);
    }
    if (st == MMOE_ENOMEM)
        mmoe_error_set(c->err, MMOE_ENOMEM, "completion: out of memory");
    json_decref(seen);
    mmoe_text_free(&args);
    return st;
}

mmoe_status mmoe_chat_parse_completion(const char *text, size_t len, mmoe_chat_mode mode, mmoe_text *message,
                                       mmoe_error *err)
{
    cursor c = {text, len, 0, err};
    const char *reasoning = "";
    size_t reasoning_len = 0;
    mmoe_status st = MMOE_OK;
    if (mode == MMOE_CHAT_MODE_THINKING) {
        size_t close = find(&c, 0, "</think>"), calls = find(&c, 0, CALLS_MARKER);
        if (close == SIZE_MAX)
            return mmoe_error_set(err, MMOE_EFORMAT, "completion: thinking mode, but '</think>' is missing");
        if (calls < close)
            return mmoe_error_set(err, MMOE_EFORMAT, "completion: a tool-call block starts before '</think>'");
        reasoning = text;
        reasoning_len = close;
        c.pos = close + strlen("</think>");
    }
    size_t eos = find(&c, c.pos, EOS), calls = find(&c, c.pos, CALLS_MARKER);
    if (eos == SIZE_MAX)
        return mmoe_error_set(err, MMOE_EFORMAT, "completion: it does not end with EOS");
    size_t content_end = calls < eos ? calls : eos;
    const char *content = text + c.pos;
    size_t content_len = content_end - c.pos;
    if ((st = check_clean("reasoning", reasoning, reasoning_len, err)) != MMOE_OK ||
        (st = check_clean("content", content, content_len, err)) != MMOE_OK)
        return st;
    json_t *tool_calls = json_array();
    c.pos = content_end;
    if (calls < eos) {
        c.pos = calls + strlen(CALLS_MARKER);
        st = expect(&c, ">\n");
        while (st == MMOE_OK && at(&c, "<" DSML "invoke"))
            st = parse_invoke(&c, tool_calls);
        if (st == MMOE_OK)
            st = expect(&c, "</" DSML "tool_calls>");
    }
    if (st == MMOE_OK)
        st = expect(&c, EOS);
    if (st == MMOE_OK && c.pos != len)
        st = mmoe_error_set(err, MMOE_EFORMAT, "completion: %zu bytes follow EOS", len - c.pos);
    if (st == MMOE_OK) {
        json_t *msg = json_pack("{s:s, s:s%, s:s%, s:O}", "role", "assistant", "content", content, content_len,
                                "reasoning_content", reasoning, reasoning_len, "tool_calls", tool_calls);
        if (msg == NULL)
            st = mmoe_error_set(err, MMOE_EFORMAT, "completion: the text is not valid UTF-8");
        else if (chat_json_dump(msg, message) != MMOE_OK)
            st = mmoe_error_set(err, MMOE_ENOMEM, "completion: out of memory");
        json_decref(msg);
    }
    json_decref(tool_calls);
    return st;
}
