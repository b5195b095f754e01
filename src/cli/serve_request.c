/**
 * @file serve_request.c
 * @brief `megamoe serve`: request bodies in, answers out, in the shapes of OpenAI's API.
 *
 * ## Requests
 *
 * A body must be one JSON object.  Every field the server reads is type- and range-checked,
 * and a bad one is answered with HTTP 400 and OpenAI's error shape
 * `{"error": {"message", "type": "invalid_request_error", "param": FIELD, "code"}}`:
 *
 * | field | endpoint | accepted |
 * | --- | --- | --- |
 * | `prompt` | completions | a string, or an array of one string |
 * | `messages` | chat | a non-empty array of objects; `content` a string, null, or an array of `{"type": "text", "text"}` parts |
 * | `max_tokens`, `max_completion_tokens` | both | integer >= 1 (default: 16 for completions, the rest of the context for chat) |
 * | `temperature` | both | number in [0, 100] (default 1, as OpenAI) |
 * | `top_p` | both | number in (0, 1] |
 * | `top_k`, `min_p`, `repeat_penalty` | both | as `megamoe generate`'s options (llama.cpp's names) |
 * | `seed` | both | integer in [0, 2^63) (default: the server's --seed) |
 * | `stop` | both | a string or an array of at most 4 non-empty strings |
 * | `stream`, `stream_options.include_usage` | both | booleans |
 * | `logprobs` | completions | integer in [0, 5]: the alternatives per token |
 * | `logprobs`, `top_logprobs` | chat | boolean; integer in [0, 20] |
 *
 * Fields that would change the answer in ways this server does not implement are refused
 * rather than ignored: `n` and `best_of` other than 1, `echo`, `suffix`, non-zero
 * `frequency_penalty` / `presence_penalty`, a non-empty `logit_bias` or `tools`, a
 * `response_format` other than text, and `logprobs` together with `stream`.  Other fields
 * (`model`, `user`, ...) are ignored: there is one model.
 *
 * ## Answers
 *
 * `text_completion` and `chat.completion` objects with `usage` (prompt, completion and
 * total tokens); streamed, `text_completion` / `chat.completion.chunk` objects, one per
 * server-sent event.  Log-probabilities are given per generated token, with the token's
 * text (`null` where the token alone is not valid UTF-8) and its bytes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_internal.h"

json_t *serve_error_json(const char *message, const char *type, const char *param, const char *code)
{
    json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", message, "type", type, "param",
                          param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null());
    return json_pack("{s:o}", "error", e);
}

/** A 400 answer about @p param (printf-style message). */
static json_t *bad_field(const char *param, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *bad_field(const char *param, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return serve_error_json(msg, "invalid_request_error", param, NULL);
}

/** The field @p key, NULL when absent or null. */
static json_t *field(json_t *body, const char *key)
{
    json_t *v = json_object_get(body, key);
    return json_is_null(v) ? NULL : v;
}

/** A number field in [lo, hi] (lo excluded when @p lo_open); absent leaves *v. 0 or -1 with *error set. */
static int get_number(json_t *body, const char *key, double lo, double hi, int lo_open, double *v, json_t **error)
{
    json_t *x = field(body, key);
    if (x == NULL)
        return 0;
    double d = json_number_value(x);
    if (!json_is_number(x) || !isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
        *error = bad_field(key, "'%s' must be a number in %s%g, %g]", key, lo_open ? "(" : "[", lo, hi);
        return -1;
    }
    *v = d;
    return 0;
}

/** An integer field in [lo, hi]; absent leaves *v. 0 or -1 with *error set. */
static int get_integer(json_t *body, const char *key, int64_t lo, int64_t hi, int64_t *v, json_t **error)
{
    json_t *x = field(body, key);
    if (x == NULL)
        return 0;
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) {
        *error = bad_field(key, "'%s' must be an integer in [%lld, %lld]", key, (long long)lo, (long long)hi);
        return -1;
    }
    *v = json_integer_value(x);
    return 0;
}

/** A boolean field; absent leaves *v. 0 or -1 with *error set. */
static int get_bool(json_t *body, const char *key, int *v, json_t **error)
{
    json_t *x = field(body, key);
    if (x == NULL)
        return 0;
    if (!json_is_boolean(x)) {
        *error = bad_field(key, "'%s' must be a boolean", key);
        return -1;
    }
    *v = json_is_true(x);
    return 0;
}

/** Refuse the fields this server does not implement when they ask for something (see the file comment). */
static int refuse_unsupported(json_t *body, json_t **error)
{
    static const char *const must_be_one[] = {"n", "best_of"};
    for (size_t i = 0; i < 2; i++) {
        json_t *x = field(body, must_be_one[i]);
        if (x != NULL && !(json_is_integer(x) && json_integer_value(x) == 1)) {
            *error = bad_field(must_be_one[i], "'%s' other than 1 is not supported (one answer per request)",
                               must_be_one[i]);
            return -1;
        }
    }
    static const char *const must_be_zero[] = {"frequency_penalty", "presence_penalty"};
    for (size_t i = 0; i < 2; i++) {
        json_t *x = field(body, must_be_zero[i]);
        if (x != NULL && !(json_is_number(x) && json_number_value(x) == 0.0)) {
            *error = bad_field(must_be_zero[i], "'%s' is not supported (use repeat_penalty)", must_be_zero[i]);
            return -1;
        }
    }
    json_t *x;
    if ((x = field(body, "echo")) != NULL && !json_is_false(x))
        *error = bad_field("echo", "'echo' is not supported");
    else if (field(body, "suffix") != NULL)
        *error = bad_field("suffix", "'suffix' is not supported");
    else if ((x = field(body, "logit_bias")) != NULL && !(json_is_object(x) && json_object_size(x) == 0))
        *error = bad_field("logit_bias", "'logit_bias' is not supported");
    else if ((x = field(body, "tools")) != NULL && !(json_is_array(x) && json_array_size(x) == 0))
        *error = bad_field("tools", "'tools' is not supported by this server");
    else if ((x = field(body, "response_format")) != NULL &&
             !(json_is_object(x) && json_is_string(json_object_get(x, "type")) &&
               strcmp(json_string_value(json_object_get(x, "type")), "text") == 0))
        *error = bad_field("response_format", "only 'response_format' {\"type\": \"text\"} is supported");
    return *error != NULL ? -1 : 0;
}

/** The stop field: a string or an array of at most SERVE_MAX_STOPS non-empty strings. */
static int get_stops(json_t *body, serve_request *req, json_t **error)
{
    json_t *x = field(body, "stop");
    if (x == NULL)
        return 0;
    json_t *one = json_is_string(x) ? x : NULL;
    size_t n = one ? 1 : json_is_array(x) ? json_array_size(x) : SERVE_MAX_STOPS + 1;
    if (n > SERVE_MAX_STOPS) {
        *error = bad_field("stop", "'stop' must be a string or an array of at most %d strings", SERVE_MAX_STOPS);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = one ? one : json_array_get(x, i);
        if (!json_is_string(s) || json_string_length(s) == 0 || strlen(json_string_value(s)) != json_string_length(s)) {
            *error = bad_field("stop", "'stop' entries must be non-empty strings without NUL characters");
            return -1;
        }
        if ((req->stops[req->n_stops] = strdup(json_string_value(s))) == NULL) {
            *error = serve_error_json("out of memory", "server_error", NULL, NULL);
            return -1;
        }
        req->n_stops++;
    }
    return 0;
}

/** Sampling fields into req->sampling. */
static int get_sampling(json_t *body, uint64_t default_seed, serve_request *req, json_t **error)
{
    mmoe_sampler_params *sp = &req->sampling;
    mmoe_sampler_params_default(sp);
    double t = 1.0, top_p = 1.0, min_p = 0.0, penalty = 1.0;
    int64_t top_k = 0, seed = (int64_t)(default_seed & INT64_MAX);
    if (get_number(body, "temperature", 0.0, 100.0, 0, &t, error) || get_number(body, "top_p", 0.0, 1.0, 1, &top_p, error) ||
        get_number(body, "min_p", 0.0, 1.0, 0, &min_p, error) ||
        get_number(body, "repeat_penalty", 0.0, 1e6, 1, &penalty, error) ||
        get_integer(body, "top_k", 0, INT32_MAX, &top_k, error) || get_integer(body, "seed", 0, INT64_MAX, &seed, error))
        return -1;
    sp->temperature = (float)t;
    sp->top_p = (float)top_p;
    sp->min_p = (float)min_p;
    sp->repeat_penalty = (float)penalty;
    sp->top_k = (int32_t)top_k;
    sp->seed = (uint64_t)seed;
    if (sp->top_p <= 0.0f) /* a positive double below FP32's smallest */
        sp->top_p = 1e-45f;
    return 0;
}

/** Join a content array of {"type": "text", "text"} parts into one string (a new reference), or NULL. */
static json_t *join_text_parts(json_t *content, size_t index, json_t **error)
{
    mmoe_text t = {0};
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *part = json_array_get(content, i), *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            char param[64];
            snprintf(param, sizeof param, "messages[%zu].content[%zu]", index, i);
            *error = bad_field(param, "%s: only {\"type\": \"text\", \"text\": STRING} parts are supported", param);
            mmoe_text_free(&t);
            return NULL;
        }
        mmoe_text_append(&t, json_string_value(text), json_string_length(text));
    }
    json_t *s = json_stringn(t.data ? t.data : "", t.len);
    mmoe_text_free(&t);
    return s;
}

/** The chat messages: checked as objects, content parts joined, serialized for the chat encoder. */
static int get_messages(json_t *body, serve_request *req, json_t **error)
{
    json_t *msgs = field(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        *error = bad_field("messages", "'messages' must be a non-empty array of message objects");
        return -1;
    }
    json_t *copy = json_deep_copy(msgs);
    for (size_t i = 0; copy != NULL && i < json_array_size(copy); i++) {
        json_t *m = json_array_get(copy, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            char param[32];
            snprintf(param, sizeof param, "messages[%zu]", i);
            *error = bad_field(param, "%s must be an object with a string 'role'", param);
            json_decref(copy);
            return -1;
        }
        json_t *content = json_object_get(m, "content");
        if (json_is_array(content)) {
            json_t *joined = join_text_parts(content, i, error);
            if (joined == NULL) {
                json_decref(copy);
                return -1;
            }
            json_object_set_new(m, "content", joined);
        } else if (content != NULL && !json_is_string(content) && !json_is_null(content)) {
            char param[40];
            snprintf(param, sizeof param, "messages[%zu].content", i);
            *error = bad_field(param, "%s must be a string, null or an array of text parts", param);
            json_decref(copy);
            return -1;
        }
    }
    req->messages = copy ? json_dumps(copy, JSON_COMPACT) : NULL;
    json_decref(copy);
    if (req->messages == NULL) {
        *error = serve_error_json("out of memory", "server_error", NULL, NULL);
        return -1;
    }
    return 0;
}

/** The completion prompt: a string or an array of one string. */
static int get_prompt(json_t *body, serve_request *req, json_t **error)
{
    json_t *p = field(body, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1)
        p = json_array_get(p, 0);
    if (!json_is_string(p) || strlen(json_string_value(p)) != json_string_length(p)) {
        *error = bad_field("prompt", "'prompt' must be a string (or an array of one string) without NUL characters");
        return -1;
    }
    if ((req->prompt = strdup(json_string_value(p))) == NULL) {
        *error = serve_error_json("out of memory", "server_error", NULL, NULL);
        return -1;
    }
    return 0;
}

/** logprobs / top_logprobs of either endpoint into req->logprobs. */
static int get_logprobs(json_t *body, serve_request *req, json_t **error)
{
    int64_t n = -1;
    if (req->kind == SERVE_COMPLETION) {
        if (get_integer(body, "logprobs", 0, 5, &n, error))
            return -1;
    } else {
        int want = 0;
        int64_t top = 0;
        if (get_bool(body, "logprobs", &want, error) || get_integer(body, "top_logprobs", 0, SERVE_MAX_LOGPROBS, &top, error))
            return -1;
        if (field(body, "top_logprobs") != NULL && !want) {
            *error = bad_field("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            return -1;
        }
        n = want ? top : -1;
    }
    req->logprobs = (int)n;
    if (n >= 0 && req->stream) {
        *error = bad_field("logprobs", "'logprobs' with 'stream': true is not supported");
        return -1;
    }
    return 0;
}

mmoe_status serve_request_parse(const char *body, size_t len, serve_kind kind, uint64_t default_seed,
                                serve_request *req, json_t **error)
{
    memset(req, 0, sizeof *req);
    req->kind = kind;
    *error = NULL;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        *error = bad_field(NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return MMOE_EFORMAT;
    }
    int64_t max_tokens = kind == SERVE_COMPLETION ? 16 : -1;
    json_t *so = field(root, "stream_options");
    int bad = !json_is_object(root);
    if (bad)
        *error = bad_field(NULL, "the body must be a JSON object");
    bad = bad || refuse_unsupported(root, error) ||
          (kind == SERVE_COMPLETION ? get_prompt(root, req, error) : get_messages(root, req, error)) ||
          get_integer(root, "max_tokens", 1, INT32_MAX, &max_tokens, error) ||
          (kind == SERVE_CHAT && get_integer(root, "max_completion_tokens", 1, INT32_MAX, &max_tokens, error)) ||
          get_sampling(root, default_seed, req, error) || get_stops(root, req, error) ||
          get_bool(root, "stream", &req->stream, error) || get_logprobs(root, req, error);
    if (!bad && so != NULL && (!json_is_object(so) || get_bool(so, "include_usage", &req->include_usage, error))) {
        if (*error == NULL)
            *error = bad_field("stream_options", "'stream_options' must be an object");
        bad = 1;
    }
    req->max_tokens = max_tokens;
    json_decref(root);
    if (bad) {
        serve_request_free(req);
        return MMOE_EFORMAT;
    }
    return MMOE_OK;
}

void serve_request_free(serve_request *req)
{
    free(req->prompt);
    free(req->messages);
    for (size_t i = 0; i < req->n_stops; i++)
        free(req->stops[i]);
    memset(req, 0, sizeof *req);
}

/** The "usage" object of a job. */
static json_t *usage_json(const serve_job *job)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)job->prompt_tokens, "completion_tokens",
                     (json_int_t)job->completion_tokens, "total_tokens",
                     (json_int_t)(job->prompt_tokens + job->completion_tokens));
}

/** A copy of @p v, or null (a token whose text is not valid UTF-8 has a null text). */
static json_t *copy_or_null(json_t *v)
{
    return v != NULL ? json_incref(v) : json_null();
}

/** Completions' logprobs object: tokens, token_logprobs, top_logprobs (text -> logprob), text_offset. */
static json_t *completion_logprobs(const serve_job *job)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array();
    size_t offset = 0;
    for (size_t i = 0; i < json_array_size(job->lp_tokens); i++) {
        json_t *e = json_array_get(job->lp_tokens, i), *text = json_object_get(e, "text");
        json_array_append_new(tokens, copy_or_null(text));
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += json_array_size(json_object_get(e, "bytes"));
        json_t *top = json_object(), *alts = json_object_get(e, "top");
        for (size_t k = 0; k < json_array_size(alts); k++) {
            json_t *a = json_array_get(alts, k);
            const char *t = json_string_value(json_object_get(a, "text"));
            if (t != NULL && json_object_get(top, t) == NULL)
                json_object_set(top, t, json_object_get(a, "logprob"));
        }
        json_array_append_new(tops, top);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offsets);
}

/** One chat logprob entry {"token", "logprob", "bytes"} (+ "top_logprobs" when @p with_top). */
static json_t *chat_logprob_entry(json_t *e, int with_top)
{
    json_t *text = json_object_get(e, "text");
    json_t *o = json_pack("{s:o, s:O, s:O}", "token", text ? json_incref(text) : json_string(""), "logprob",
                          json_object_get(e, "logprob"), "bytes", json_object_get(e, "bytes"));
    if (with_top) {
        json_t *top = json_array(), *alts = json_object_get(e, "top");
        for (size_t k = 0; k < json_array_size(alts); k++)
            json_array_append_new(top, chat_logprob_entry(json_array_get(alts, k), 0));
        json_object_set_new(o, "top_logprobs", top);
    }
    return o;
}

/** Chat's logprobs object: {"content": [entries]}. */
static json_t *chat_logprobs(const serve_job *job)
{
    json_t *content = json_array();
    for (size_t i = 0; i < json_array_size(job->lp_tokens); i++)
        json_array_append_new(content, chat_logprob_entry(json_array_get(job->lp_tokens, i), 1));
    return json_pack("{s:o}", "content", content);
}

/** "cmpl-N" or "chatcmpl-N". */
static void job_id(const serve_job *job, char *buf, size_t len)
{
    snprintf(buf, len, "%s-%lld", job->req.kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (long long)job->number);
}

json_t *serve_answer_json(const serve_server *srv, const serve_job *job)
{
    char id[48];
    job_id(job, id, sizeof id);
    json_t *text = json_stringn(job->text.data ? job->text.data : "", job->text.len);
    json_t *choice;
    if (job->req.kind == SERVE_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0, "message", "role", "assistant", "content",
                           text, "logprobs", job->req.logprobs >= 0 ? chat_logprobs(job) : json_null(),
                           "finish_reason", job->finish_reason);
    else
        choice = json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", text, "logprobs",
                           job->req.logprobs >= 0 ? completion_logprobs(job) : json_null(), "finish_reason",
                           job->finish_reason);
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
                     job->req.kind == SERVE_CHAT ? "chat.completion" : "text_completion", "created",
                     (json_int_t)job->created, "model", srv->model_name, "choices", choice, "usage", usage_json(job));
}

json_t *serve_chunk_json(const serve_server *srv, const serve_job *job, const char *delta, size_t len, int role,
                         const char *finish_reason)
{
    char id[48];
    job_id(job, id, sizeof id);
    json_t *fr = finish_reason ? json_string(finish_reason) : json_null();
    json_t *text = json_stringn(delta ? delta : "", len);
    json_t *choice;
    if (job->req.kind == SERVE_CHAT) {
        json_t *d = json_object();
        if (role)
            json_object_set_new(d, "role", json_string("assistant"));
        if (len > 0 || role)
            json_object_set(d, "content", text);
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", d, "logprobs", "finish_reason", fr);
    } else {
        choice = json_pack("{s:i, s:O, s:n, s:o}", "index", 0, "text", text, "logprobs", "finish_reason", fr);
    }
    json_decref(text);
    json_t *chunk = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
                              job->req.kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)job->created, "model", srv->model_name, "choices", choice);
    return chunk;
}

json_t *serve_usage_chunk_json(const serve_server *srv, const serve_job *job)
{
    char id[48];
    job_id(job, id, sizeof id);
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                     job->req.kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)job->created, "model", srv->model_name, "choices", "usage", usage_json(job));
}
