/**
 * @file chat_encode.c
 * @brief The DeepSeek-V4 chat encoder (@ref spec_arch_chat), step by step.
 *
 * The input is parsed with jansson; the encoder then works on jansson values:
 *
 *  1. **Merge** (@ref spec_arch_chat_preprocess): `tool` messages become `tool_result` blocks and `user`
 *     messages become `text` blocks of one user message (key `content_blocks`); a tool
 *     result joins the preceding user turn, a user message joins a preceding user turn
 *     without `task`.  Context and new messages are merged separately.
 *  2. **Order tool results** like the calls of the assistant message that made them.
 *  3. **Drop filter** (thinking mode with drop_thinking, unless some message has tools):
 *     before the last user/developer message u, assistant messages lose their
 *     reasoning and developer messages disappear.
 *  4. **Render** each message after the context: its body (@ref spec_arch_chat_bodies), then the
 *     transition suffix (@ref spec_arch_chat_suffix) that opens the next assistant turn.
 *
 * Fixed strings and text blocks are spelled out below exactly as the encoder emits them; the
 * four official test vectors (fixtures/chat-encoding/) pin them down byte for byte.
 * JSON inside the prompt is written in Python's style (chat_json.c).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"
#include "mmoe_chat.h"


/** The TOOLS block up to the tool schemas (lines 1-22 of the TOOLS block, @ref spec_arch_chat_blocks, each ending with NL). */
static const char tools_head[] =
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" DSML "tool_calls>\" block like the following:\n"
    "\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n";

/** The TOOLS block after the schema lines (an empty line, the last line, NL). */
static const char tools_tail[] =
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/** The RESPONSE-FORMAT block before the JSON schema. */
static const char response_format_head[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/** The MAX-EFFORT preamble (three lines and a blank line). */
static const char max_effort_text[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n"
    "\n";

/** Task value -> the token written for it. */
static const char *task_token(const char *task)
{
    static const struct { const char *task, *token; } tasks[] = {
        {"action", "<\xEF\xBD\x9C" "action\xEF\xBD\x9C>"}, {"query", "<\xEF\xBD\x9Cquery\xEF\xBD\x9C>"},
        {"authority", "<\xEF\xBD\x9C" "authority\xEF\xBD\x9C>"}, {"domain", "<\xEF\xBD\x9C" "domain\xEF\xBD\x9C>"},
        {"title", "<\xEF\xBD\x9Ctitle\xEF\xBD\x9C>"}, {"read_url", "<\xEF\xBD\x9Cread_url\xEF\xBD\x9C>"},
    };
    for (size_t i = 0; i < sizeof tasks / sizeof tasks[0]; i++)
        if (strcmp(task, tasks[i].task) == 0)
            return tasks[i].token;
    return NULL;
}

/** Encoder state of one call. */
typedef struct chat_enc {
    const mmoe_chat_options *opt; /**< the caller's options */
    mmoe_text *out;               /**< the prompt being written */
    mmoe_error *err;              /**< where failures are reported */
    mmoe_status st;               /**< first failure (MMOE_ENOMEM from appends) */
    int effective_drop;           /**< drop_thinking, forced off when some message has tools */
} chat_enc;

/** Append @p len bytes to the prompt (records MMOE_ENOMEM in e->st). */
static void emit(chat_enc *e, const char *s, size_t len)
{
    if (e->st == MMOE_OK && mmoe_text_append(e->out, s, len) != MMOE_OK)
        e->st = mmoe_error_set(e->err, MMOE_ENOMEM, "chat encode: out of memory");
}

/** Append a NUL-terminated string to the prompt. */
static void emit_str(chat_enc *e, const char *s)
{
    emit(e, s, strlen(s));
}

/** Append the text of a JSON string value (NUL bytes included). */
static void emit_json_string_value(chat_enc *e, const json_t *s)
{
    emit(e, json_string_value(s), json_string_length(s));
}

/** Append a JSON value in Python's json.dumps spelling. */
static void emit_json(chat_enc *e, const json_t *v)
{
    if (e->st == MMOE_OK && chat_json_dump(v, e->out) != MMOE_OK)
        e->st = mmoe_error_set(e->err, MMOE_ENOMEM, "chat encode: out of memory");
}

/** The role of a message, "" when missing. */
static const char *role_of(const json_t *m)
{
    const json_t *r = json_object_get(m, "role");
    return json_is_string(r) ? json_string_value(r) : "";
}

/** Nonzero when message @p m has role @p role. */
static int role_is(const json_t *m, const char *role)
{
    return strcmp(role_of(m), role) == 0;
}

/** Python truthiness of an optional field: missing, null, false, 0, "", [] and {} are false. */
static int truthy(const json_t *v)
{
    if (v == NULL)
        return 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_TRUE: return 1;
    case JSON_FALSE:
    case JSON_NULL: return 0;
    }
    return 0;
}

/** A message's text field: a string, or "" when missing/null; anything else is an error. */
static mmoe_status text_field(chat_enc *e, const json_t *m, size_t index, const char *key, const char **s,
                              size_t *len)
{
    const json_t *v = json_object_get(m, key);
    if (v == NULL || json_is_null(v)) {
        *s = "";
        *len = 0;
        return MMOE_OK;
    }
    if (!json_is_string(v))
        return mmoe_error_set(e->err, MMOE_EFORMAT, "chat: message %zu (%s): key '%s': expected a string, found %s",
                              index, role_of(m), key, json_is_array(v) ? "an array" : "a non-string value");
    *s = json_string_value(v);
    *len = json_string_length(v);
    return MMOE_OK;
}

/* ------------------------------------------------------------------ 1. merging */

/** Merge messages [first, end) of @p in into @p merged: tool and user messages become user turns with content_blocks. */
static mmoe_status merge_messages(chat_enc *e, const json_t *in, size_t first, size_t end, json_t *merged)
{
    for (size_t i = first; i < end; i++) {
        const json_t *m = json_array_get(in, i);
        json_t *last = json_array_size(merged) ? json_array_get(merged, json_array_size(merged) - 1) : NULL;
        int last_is_user = last != NULL && role_is(last, "user");
        if (role_is(m, "tool")) {
            const json_t *content = json_object_get(m, "content"), *id = json_object_get(m, "tool_call_id");
            json_t *c = content ? json_incref((json_t *)content) : json_string("");
            json_t *idv = json_is_string(id) ? json_incref((json_t *)id) : json_string("");
            json_t *block = json_pack("{s:s, s:o, s:o}", "type", "tool_result", "content", c, "tool_call_id", idv);
            if (block == NULL)
                return mmoe_error_set(e->err, MMOE_ENOMEM, "chat encode: out of memory");
            if (last_is_user) {
                json_array_append_new(json_object_get(last, "content_blocks"), block);
            } else {
                json_t *user = json_pack("{s:s, s:[o]}", "role", "user", "content_blocks", block);
                json_array_append_new(merged, user);
            }
        } else if (role_is(m, "user")) {
            const char *text;
            size_t text_len;
            mmoe_status st = text_field(e, m, i, "content", &text, &text_len);
            if (st != MMOE_OK)
                return st;
            json_t *block = json_pack("{s:s, s:s%}", "type", "text", "text", text, text_len);
            if (block == NULL)
                return mmoe_error_set(e->err, MMOE_ENOMEM, "chat encode: out of memory");
            const json_t *last_task = last_is_user ? json_object_get(last, "task") : NULL;
            if (last_is_user && (last_task == NULL || json_is_null(last_task))) {
                json_array_append_new(json_object_get(last, "content_blocks"), block);
            } else {
                json_t *user = json_pack("{s:s, s:[o]}", "role", "user", "content_blocks", block);
                static const char *kept[] = {"task", "wo_eos", "mask"};
                for (size_t k = 0; k < 3; k++)
                    if (json_object_get(m, kept[k]) != NULL)
                        json_object_set(user, kept[k], json_object_get(m, kept[k]));
                json_array_append_new(merged, user);
            }
        } else {
            json_array_append_new(merged, json_deep_copy(m));
        }
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------ 2. tool-result order */

/** The id of a tool call (its `id`, else `function.id`), or NULL. */
static const char *call_id(const json_t *call)
{
    const json_t *id = json_object_get(call, "id");
    if (!json_is_string(id))
        id = json_object_get(json_object_get(call, "function"), "id");
    return json_is_string(id) ? json_string_value(id) : NULL;
}

/** Position of call id @p id in the list of calls (0 when unknown). */
static int call_position(const json_t *calls, const char *id)
{
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const char *cid = call_id(json_array_get(calls, k));
        if (cid != NULL && strcmp(cid, id) == 0)
            return (int)k;
    }
    return 0; /* unknown ids count as position 0 */
}

/** Nonzero when at least one call of the list has an id. */
static int map_has_ids(const json_t *calls)
{
    for (size_t k = 0; k < json_array_size(calls); k++)
        if (call_id(json_array_get(calls, k)) != NULL)
            return 1;
    return 0;
}

/** Sort the tool-result blocks of each user turn by the position of their call (stable). */
static void order_tool_results(json_t *msgs)
{
    const json_t *calls = NULL; /* the tool calls of the last assistant message that had some */
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (role_is(m, "assistant") && truthy(json_object_get(m, "tool_calls"))) {
            calls = json_object_get(m, "tool_calls");
            continue;
        }
        json_t *blocks = json_object_get(m, "content_blocks");
        if (!role_is(m, "user") || !json_is_array(blocks) || calls == NULL || !map_has_ids(calls))
            continue;
        size_t slot[256], n = 0;
        for (size_t k = 0; k < json_array_size(blocks) && n < 256; k++) {
            const json_t *type = json_object_get(json_array_get(blocks, k), "type");
            if (json_is_string(type) && strcmp(json_string_value(type), "tool_result") == 0)
                slot[n++] = k;
        }
        if (n < 2)
            continue;
        json_t *sorted[256];
        int pos[256];
        for (size_t k = 0; k < n; k++) {
            sorted[k] = json_incref(json_array_get(blocks, slot[k]));
            const json_t *id = json_object_get(sorted[k], "tool_call_id");
            pos[k] = call_position(calls, json_is_string(id) ? json_string_value(id) : "");
        }
        for (size_t k = 1; k < n; k++) { /* insertion sort: stable */
            json_t *b = sorted[k];
            int p = pos[k];
            size_t j = k;
            while (j > 0 && pos[j - 1] > p) {
                sorted[j] = sorted[j - 1];
                pos[j] = pos[j - 1];
                j--;
            }
            sorted[j] = b;
            pos[j] = p;
        }
        for (size_t k = 0; k < n; k++)
            json_array_set_new(blocks, slot[k], sorted[k]);
    }
}

/* ------------------------------------------------------------------ 3. drop filter */

/** Index of the last user or developer message, -1 if none. */
static long last_user_index(const json_t *msgs)
{
    for (size_t i = json_array_size(msgs); i-- > 0;)
        if (role_is(json_array_get(msgs, i), "user") || role_is(json_array_get(msgs, i), "developer"))
            return (long)i;
    return -1;
}

/** A new list (the drop filter of @ref spec_arch_chat_preprocess) without earlier reasoning and earlier developer messages. */
static json_t *drop_filter(const json_t *msgs)
{
    long u = last_user_index(msgs);
    json_t *kept = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if ((long)i >= u || role_is(m, "user") || role_is(m, "system") || role_is(m, "latest_reminder")) {
            json_array_append(kept, m);
        } else if (role_is(m, "assistant")) {
            json_t *copy = json_copy(m);
            json_object_del(copy, "reasoning_content");
            json_array_append_new(kept, copy);
        }
    }
    return kept;
}

/* ------------------------------------------------------------------ 4. rendering */

/**
 * Is @p v (a message's 'tools' or 'tool_calls') a JSON array?  If not, fail the encoding with a
 * message naming the message and the key: a lone object or a string there used to render an empty
 * block silently (found by the json_fuzz suite).
 */
static int require_array(chat_enc *e, const json_t *m, const json_t *v, size_t index, const char *key)
{
    if (json_is_array(v))
        return 1;
    if (e->st == MMOE_OK)
        e->st = mmoe_error_set(e->err, MMOE_EFORMAT, "chat: message %zu (%s): key '%s': expected an array, found %s",
                               index, role_of(m), key, json_is_object(v) ? "an object" : "a non-array value");
    return 0;
}

/** The TOOLS block: fixed text, one JSON line per tool function, fixed tail. */
static void render_tools(chat_enc *e, const json_t *tools, size_t index)
{
    emit_str(e, tools_head);
    for (size_t k = 0; k < json_array_size(tools); k++) {
        const json_t *fn = json_object_get(json_array_get(tools, k), "function");
        if (fn == NULL) {
            if (e->st == MMOE_OK)
                e->st = mmoe_error_set(e->err, MMOE_EFORMAT,
                                       "chat: message %zu: key 'tools[%zu].function': expected an object, found nothing",
                                       index, k);
            return;
        }
        emit_json(e, fn);
        emit_str(e, "\n");
    }
    emit_str(e, tools_tail);
}

/** The optional TOOLS and RESPONSE-FORMAT parts of a system or developer message. */
static void render_tools_and_format(chat_enc *e, const json_t *m, size_t index)
{
    const json_t *tools = json_object_get(m, "tools"), *rf = json_object_get(m, "response_format");
    if (truthy(tools) && require_array(e, m, tools, index, "tools")) {
        emit_str(e, "\n\n");
        render_tools(e, tools, index);
    }
    if (truthy(rf)) {
        emit_str(e, "\n\n");
        emit_str(e, response_format_head);
        emit_json(e, rf);
    }
}

/** A user turn's blocks joined by NL NL: text as is, tool results wrapped in tool_result tags. */
static void render_user_blocks(chat_enc *e, const json_t *blocks)
{
    for (size_t k = 0; k < json_array_size(blocks); k++) {
        const json_t *b = json_array_get(blocks, k);
        const json_t *type = json_object_get(b, "type");
        const char *t = json_is_string(type) ? json_string_value(type) : "None";
        if (k > 0)
            emit_str(e, "\n\n");
        if (strcmp(t, "text") == 0) {
            emit_json_string_value(e, json_object_get(b, "text"));
        } else if (strcmp(t, "tool_result") == 0) {
            const json_t *c = json_object_get(b, "content");
            emit_str(e, "<tool_result>");
            if (json_is_string(c)) {
                emit_json_string_value(e, c);
            } else if (json_is_array(c)) { /* text items joined by NL NL, other items as [Unsupported TYPE] */
                for (size_t j = 0; j < json_array_size(c); j++) {
                    const json_t *item = json_array_get(c, j), *it = json_object_get(item, "type");
                    const json_t *txt = json_object_get(item, "text");
                    if (j > 0)
                        emit_str(e, "\n\n");
                    if (json_is_string(it) && strcmp(json_string_value(it), "text") == 0) {
                        if (json_is_string(txt))
                            emit_json_string_value(e, txt);
                    } else {
                        emit_str(e, "[Unsupported ");
                        emit_str(e, json_is_string(it) ? json_string_value(it) : "None");
                        emit_str(e, "]");
                    }
                }
            } else if (c != NULL && !json_is_null(c) && e->st == MMOE_OK) {
                e->st = mmoe_error_set(e->err, MMOE_EFORMAT,
                                       "chat: tool message content: expected a string or a list of parts, found another "
                                       "JSON value");
            }
            emit_str(e, "</tool_result>");
        } else {
            emit_str(e, "[Unsupported ");
            emit_str(e, t);
            emit_str(e, "]");
        }
    }
}

/** One DSML parameter element of a tool call. */
static void render_parameter(chat_enc *e, const char *key, const json_t *value)
{
    emit_str(e, "<" DSML "parameter name=\"");
    emit_str(e, key);
    emit_str(e, json_is_string(value) ? "\" string=\"true\">" : "\" string=\"false\">");
    if (json_is_string(value))
        emit_json_string_value(e, value);
    else
        emit_json(e, value);
    emit_str(e, "</" DSML "parameter>");
}

/** The DSML tool-call block of an assistant message (@ref spec_arch_chat_toolcalls). */
static void render_tool_calls(chat_enc *e, const json_t *calls, size_t index)
{
    emit_str(e, "\n\n<" DSML "tool_calls>\n");
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *fn = json_object_get(json_array_get(calls, k), "function");
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_string(name)) {
            if (e->st == MMOE_OK)
                e->st = mmoe_error_set(e->err, MMOE_EFORMAT,
                                       "chat: message %zu: key 'tool_calls[%zu].function.name': expected a string", index,
                                       k);
            return;
        }
        if (k > 0)
            emit_str(e, "\n");
        emit_str(e, "<" DSML "invoke name=\"");
        emit_json_string_value(e, name);
        emit_str(e, "\">\n");
        json_t *parsed = NULL;
        if (json_is_object(args))
            parsed = json_incref((json_t *)args);
        else if (json_is_string(args))
            parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY | JSON_ALLOW_NUL,
                                NULL);
        if (json_is_object(parsed)) {
            const char *key;
            json_t *val;
            int first = 1;
            json_object_foreach(parsed, key, val) {
                if (!first)
                    emit_str(e, "\n");
                first = 0;
                render_parameter(e, key, val);
            }
        } else { /* not a JSON object: one parameter 'arguments' with the raw value */
            render_parameter(e, "arguments", args ? args : json_null());
        }
        json_decref(parsed);
        emit_str(e, "\n</" DSML "invoke>");
    }
    emit_str(e, "\n</" DSML "tool_calls>");
}

/** Nonzero when the message has a non-null task. */
static int has_task(const json_t *m)
{
    const json_t *t = json_object_get(m, "task");
    return t != NULL && !json_is_null(t);
}

/** Body (@ref spec_arch_chat_bodies) and transition suffix (@ref spec_arch_chat_suffix) of message @p i of the full list. */
static void render_message(chat_enc *e, const json_t *msgs, size_t i)
{
    const json_t *m = json_array_get(msgs, i);
    size_t n = json_array_size(msgs);
    long u = last_user_index(msgs);
    int thinking = e->opt->mode == MMOE_CHAT_MODE_THINKING;
    const char *text;
    size_t text_len;
    if (i == 0 && thinking && e->opt->effort == MMOE_CHAT_EFFORT_MAX)
        emit_str(e, max_effort_text);
    if (e->st != MMOE_OK)
        return;
    if (role_is(m, "system")) {
        if ((e->st = text_field(e, m, i, "content", &text, &text_len)) != MMOE_OK)
            return;
        emit(e, text, text_len);
        render_tools_and_format(e, m, i);
    } else if (role_is(m, "developer")) {
        if ((e->st = text_field(e, m, i, "content", &text, &text_len)) != MMOE_OK)
            return;
        if (text_len == 0) {
            e->st = mmoe_error_set(e->err, MMOE_EFORMAT, "chat: message %zu (developer): key 'content': expected a "
                                   "non-empty string", i);
            return;
        }
        emit_str(e, USER);
        emit(e, text, text_len);
        render_tools_and_format(e, m, i);
    } else if (role_is(m, "user")) {
        emit_str(e, USER);
        render_user_blocks(e, json_object_get(m, "content_blocks"));
    } else if (role_is(m, "latest_reminder")) {
        if ((e->st = text_field(e, m, i, "content", &text, &text_len)) != MMOE_OK)
            return;
        emit_str(e, REMINDER);
        emit(e, text, text_len);
    } else if (role_is(m, "assistant")) {
        int prev_has_task = i > 0 && has_task(json_array_get(msgs, i - 1));
        if (thinking && !prev_has_task && (!e->effective_drop || (long)i > u)) {
            if ((e->st = text_field(e, m, i, "reasoning_content", &text, &text_len)) != MMOE_OK)
                return;
            emit(e, text, text_len);
            emit_str(e, THINK_CLOSE);
        }
        if ((e->st = text_field(e, m, i, "content", &text, &text_len)) != MMOE_OK)
            return;
        emit(e, text, text_len);
        const json_t *calls = json_object_get(m, "tool_calls");
        if (truthy(calls) && require_array(e, m, calls, i, "tool_calls"))
            render_tool_calls(e, calls, i);
        if (!json_is_true(json_object_get(m, "wo_eos")))
            emit_str(e, EOS);
    } else {
        e->st = mmoe_error_set(e->err, MMOE_EINVAL, "chat: message %zu: unknown role '%s' (expected system, user, "
                               "assistant, tool, developer or latest_reminder)", i, role_of(m));
        return;
    }
    /* transition suffix */
    if (i + 1 < n && !role_is(json_array_get(msgs, i + 1), "assistant") &&
        !role_is(json_array_get(msgs, i + 1), "latest_reminder"))
        return;
    if (has_task(m)) {
        const json_t *t = json_object_get(m, "task");
        const char *tok = json_is_string(t) ? task_token(json_string_value(t)) : NULL;
        if (tok == NULL) {
            e->st = mmoe_error_set(e->err, MMOE_EINVAL, "chat: message %zu: key 'task': expected one of action, query, "
                                   "authority, domain, title, read_url, found '%s'", i,
                                   json_is_string(t) ? json_string_value(t) : "(not a string)");
            return;
        }
        if (strcmp(json_string_value(t), "action") == 0) {
            emit_str(e, ASSISTANT);
            emit_str(e, thinking ? THINK_OPEN : THINK_CLOSE);
        }
        emit_str(e, tok);
    } else if (role_is(m, "user") || role_is(m, "developer")) {
        emit_str(e, ASSISTANT);
        emit_str(e, thinking && (!e->effective_drop || (long)i >= u) ? THINK_OPEN : THINK_CLOSE);
    }
}

/** Nonzero when some message has a non-empty tools list. */
static int any_tools(const json_t *msgs)
{
    for (size_t i = 0; i < json_array_size(msgs); i++)
        if (truthy(json_object_get(json_array_get(msgs, i), "tools")))
            return 1;
    return 0;
}

/** Check the shape of the input list: objects with a string role. */
static mmoe_status check_messages(chat_enc *e, const json_t *msgs)
{
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            return mmoe_error_set(e->err, MMOE_EFORMAT, "chat: message %zu: expected an object", i);
        if (!json_is_string(json_object_get(m, "role")))
            return mmoe_error_set(e->err, MMOE_EFORMAT, "chat: message %zu: key 'role': expected a string", i);
    }
    return MMOE_OK;
}

void mmoe_chat_options_default(mmoe_chat_options *o)
{
    o->mode = MMOE_CHAT_MODE_CHAT;
    o->drop_thinking = 1;
    o->add_bos = 1;
    o->effort = MMOE_CHAT_EFFORT_NONE;
    o->n_context = 0;
}

/** The whole encoder on a parsed message list: merge, order, filter, render. */
static mmoe_status encode_list(chat_enc *e, const json_t *in)
{
    size_t n_in = json_array_size(in), n_ctx = e->opt->n_context;
    if (n_ctx > n_in)
        return mmoe_error_set(e->err, MMOE_EINVAL, "chat: %zu context messages requested, but only %zu given", n_ctx,
                              n_in);
    mmoe_status st = check_messages(e, in);
    json_t *ctx = json_array(), *rest = json_array();
    if (st == MMOE_OK)
        st = merge_messages(e, in, 0, n_ctx, ctx);
    if (st == MMOE_OK)
        st = merge_messages(e, in, n_ctx, n_in, rest);
    json_t *full = json_array();
    json_array_extend(full, ctx);
    json_array_extend(full, rest);
    if (st == MMOE_OK) {
        order_tool_results(full);
        e->effective_drop = e->opt->drop_thinking && !any_tools(full);
        size_t first = json_array_size(ctx);
        if (e->opt->mode == MMOE_CHAT_MODE_THINKING && e->effective_drop) {
            json_t *filtered = drop_filter(full), *ctx_filtered = drop_filter(ctx);
            first = json_array_size(ctx_filtered);
            json_decref(ctx_filtered);
            json_decref(full);
            full = filtered;
        }
        if (e->opt->add_bos && n_ctx == 0)
            emit_str(e, BOS);
        for (size_t i = first; e->st == MMOE_OK && i < json_array_size(full); i++)
            render_message(e, full, i);
        st = e->st;
    }
    json_decref(ctx);
    json_decref(rest);
    json_decref(full);
    return st;
}

mmoe_status mmoe_chat_encode_json(const char *json, size_t len, const mmoe_chat_options *opt, mmoe_text *prompt,
                                  mmoe_error *err)
{
    mmoe_chat_options defaults;
    if (opt == NULL) {
        mmoe_chat_options_default(&defaults);
        opt = &defaults;
    }
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (root == NULL)
        return mmoe_error_set(err, MMOE_EFORMAT, "chat: invalid JSON at line %d, column %d: %s", jerr.line,
                              jerr.column, jerr.text);
    json_t *msgs = root;
    mmoe_status st = MMOE_OK;
    if (json_is_object(root)) { /* {"messages": [...], "tools": [...]}: tools go to the first (system) message */
        msgs = json_object_get(root, "messages");
        const json_t *tools = json_object_get(root, "tools");
        if (!json_is_array(msgs)) {
            st = mmoe_error_set(err, MMOE_EFORMAT, "chat: key 'messages': expected an array of messages");
        } else if (tools != NULL && !json_is_null(tools)) {
            json_t *first = json_array_get(msgs, 0);
            if (first == NULL || !role_is(first, "system"))
                st = mmoe_error_set(err, MMOE_EFORMAT, "chat: key 'tools': top-level tools need a first message with "
                                    "role 'system' to attach them to");
            else
                json_object_set(first, "tools", (json_t *)tools);
        }
    } else if (!json_is_array(root)) {
        st = mmoe_error_set(err, MMOE_EFORMAT, "chat: expected a JSON array of messages or an object with 'messages'");
    }
    size_t len_before = prompt->len;
    if (st == MMOE_OK) {
        chat_enc e = {opt, prompt, err, MMOE_OK, 0};
        st = encode_list(&e, msgs);
    }
    if (st != MMOE_OK && prompt->data != NULL) { /* no half-written prompt */
        prompt->len = len_before;
        prompt->data[len_before] = '\0';
    }
    json_decref(root);
    return st;
}
