/**
 * @file tok_json.c
 * @brief Reading a Hugging Face `tokenizer.json` into an ::mmoe_tokenizer.
 *
 * The file is one JSON object (parsed with jansson) with these keys, all read here:
 *
 * | key              | what megamoe understands |
 * |------------------|--------------------------|
 * | `model`          | `type` "BPE": `vocab` {string: id}, `merges` ["a b", ...] or [["a", "b"], ...] (rank = position), `unk_token`, `ignore_merges`; `dropout` must be null or 0, `byte_fallback` false, no subword prefix/suffix |
 * | `added_tokens`   | [{id, content, special, normalized, lstrip, rstrip, single_word (must be false)}] |
 * | `normalizer`     | null, `Sequence`, `Prepend`, `Replace` with a `String` pattern |
 * | `pre_tokenizer`  | null, `Sequence`, `Split` (`Regex` or `String` pattern, any behavior, invert), `Digits`, `ByteLevel` (last) |
 * | `post_processor` | null, `ByteLevel`, `Sequence` of those (they add no tokens); others load but encode with add_special fails |
 * | `decoder`        | null (then decode fails), `ByteLevel` |
 *
 * Anything else is rejected with a message that names the key path
 * (`pre_tokenizer.pretokenizers[2].pattern`), what was expected and what was found,
 * never ignored.  After parsing, all token strings are copied into one pool and the
 * jansson tree is freed; the hash tables, the added-token tries, the byte-level
 * symbol table and the per-token decoded bytes are built once here.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/** A sanity bound on token ids (64 M): larger ids would only waste memory. */
#define MMOE_TOK_MAX_IDS (1 << 26)
/**
 * The id tables are indexed by id, so their size is the largest id + 1.  Real vocabularies are
 * dense (ids 0..n-1, added tokens just after); gaps of up to this many unused ids are accepted,
 * more are refused, so that a 100-byte file with one id near the 64 M bound cannot make the
 * loader allocate a gigabyte (found by the json_fuzz suite).
 */
#define MMOE_TOK_MAX_UNUSED_IDS (1 << 16)

/** Loader state: the tokenizer being built and the file name for messages. */
typedef struct loader {
    mmoe_tokenizer *tok; /**< the tokenizer being built */
    const char *name;    /**< the file name, for messages */
    mmoe_error *err;     /**< where failures are reported */
} loader;

/** The JSON type of @p v in words, for messages. */
static const char *json_type_name(const json_t *v)
{
    if (v == NULL)
        return "nothing (key missing)";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "?";
}

/** Report "key PATH: expected EXPECTED, found FOUND" and return @p code. */
static mmoe_status bad(loader *L, mmoe_status code, const char *path, const char *expected, const json_t *found)
{
    if (found != NULL && json_is_string(found))
        return mmoe_error_set(L->err, code, "tokenizer %s: key '%s': expected %s, found \"%.80s\"", L->name, path,
                              expected, json_string_value(found));
    return mmoe_error_set(L->err, code, "tokenizer %s: key '%s': expected %s, found %s", L->name, path, expected,
                          json_type_name(found));
}

/** Read an optional boolean (missing or null gives @p dflt). */
static mmoe_status get_bool(loader *L, const json_t *obj, const char *key, const char *path, int dflt, int *out)
{
    const json_t *v = json_object_get(obj, key);
    char p[256];
    if (v == NULL || json_is_null(v)) {
        *out = dflt;
        return MMOE_OK;
    }
    if (!json_is_boolean(v)) {
        snprintf(p, sizeof p, "%s.%s", path, key);
        return bad(L, MMOE_EFORMAT, p, "true or false", v);
    }
    *out = json_is_true(v);
    return MMOE_OK;
}

/** The value of "type" of a component object, or an error. */
static mmoe_status get_type(loader *L, const json_t *obj, const char *path, const char **type)
{
    char p[256];
    if (!json_is_object(obj))
        return bad(L, MMOE_EFORMAT, path, "an object", obj);
    const json_t *t = json_object_get(obj, "type");
    snprintf(p, sizeof p, "%s.type", path);
    if (!json_is_string(t))
        return bad(L, MMOE_EFORMAT, p, "a string", t);
    *type = json_string_value(t);
    return MMOE_OK;
}

/* ------------------------------------------------------------------ model */

/** Add @p s to the pool and return its offset (the pool is sized beforehand). */
static uint32_t pool_add(mmoe_tokenizer *tok, const char *s, size_t len)
{
    uint32_t off = (uint32_t)tok->pool_len;
    memcpy(tok->pool + off, s, len);
    tok->pool_len += len;
    return off;
}

/** Read model.vocab and added_tokens: ids, the string pool, the vocabulary table. */
static mmoe_status read_ids_and_pool(loader *L, const json_t *vocab, const json_t *added)
{
    mmoe_tokenizer *tok = L->tok;
    const char *key;
    json_t *val;
    int64_t max_id = -1;
    size_t pool_size = 1;
    char p[512];
    json_object_foreach((json_t *)vocab, key, val) {
        snprintf(p, sizeof p, "model.vocab.%.200s", key);
        if (!json_is_integer(val))
            return bad(L, MMOE_EFORMAT, p, "an integer id", val);
        json_int_t id = json_integer_value(val);
        if (id < 0 || id >= MMOE_TOK_MAX_IDS)
            return mmoe_error_set(L->err, MMOE_EFORMAT, "tokenizer %s: key '%s': expected an id in [0, %d), found %lld",
                                  L->name, p, MMOE_TOK_MAX_IDS, (long long)id);
        if (id > max_id)
            max_id = id;
        pool_size += strlen(key);
    }
    size_t n_added = added ? json_array_size(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        const json_t *a = json_array_get(added, i);
        snprintf(p, sizeof p, "added_tokens[%zu]", i);
        if (!json_is_object(a))
            return bad(L, MMOE_EFORMAT, p, "an object", a);
        const json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        snprintf(p, sizeof p, "added_tokens[%zu].id", i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MMOE_TOK_MAX_IDS)
            return bad(L, MMOE_EFORMAT, p, "a non-negative integer id", id);
        snprintf(p, sizeof p, "added_tokens[%zu].content", i);
        if (!json_is_string(content))
            return bad(L, MMOE_EFORMAT, p, "a string", content);
        if (json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
        pool_size += json_string_length(content);
    }
    if (pool_size > UINT32_MAX)
        return mmoe_error_set(L->err, MMOE_EFORMAT, "tokenizer %s: token strings too large (%zu bytes)", L->name,
                              pool_size);
    const size_t n_defined = json_object_size(vocab) + n_added;
    if ((size_t)(max_id + 1) > n_defined + MMOE_TOK_MAX_UNUSED_IDS)
        return mmoe_error_set(L->err, MMOE_EFORMAT,
                              "tokenizer %s: ids reach %lld but only %zu tokens are defined: expected nearly dense ids "
                              "(at most %d unused below the largest)",
                              L->name, (long long)max_id, n_defined, MMOE_TOK_MAX_UNUSED_IDS);
    tok->n_ids = (int32_t)(max_id + 1);
    tok->pool = malloc(pool_size);
    tok->tok_off = malloc((size_t)tok->n_ids * sizeof *tok->tok_off + 1);
    tok->tok_len = malloc((size_t)tok->n_ids * sizeof *tok->tok_len + 1);
    tok->is_special = calloc((size_t)tok->n_ids + 1, 1);
    tok->added = calloc(n_added + 1, sizeof *tok->added);
    if (tok->pool == NULL || tok->tok_off == NULL || tok->tok_len == NULL || tok->is_special == NULL ||
        tok->added == NULL)
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    for (int32_t i = 0; i < tok->n_ids; i++)
        tok->tok_len[i] = UINT32_MAX;
    json_object_foreach((json_t *)vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (tok->tok_len[id] != UINT32_MAX)
            return mmoe_error_set(L->err, MMOE_EFORMAT,
                                  "tokenizer %s: key 'model.vocab': id %ld is given to two strings ('%.100s' and another)",
                                  L->name, (long)id, key);
        size_t len = strlen(key);
        tok->tok_off[id] = pool_add(tok, key, len);
        tok->tok_len[id] = (uint32_t)len;
    }
    tok->voc_off = malloc((size_t)tok->n_ids * sizeof *tok->voc_off + 1);
    tok->voc_len = malloc((size_t)tok->n_ids * sizeof *tok->voc_len + 1);
    if (tok->voc_off == NULL || tok->voc_len == NULL || tok_strmap_init(&tok->vocab, json_object_size(vocab)) != MMOE_OK)
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    memcpy(tok->voc_off, tok->tok_off, (size_t)tok->n_ids * sizeof *tok->voc_off);
    memcpy(tok->voc_len, tok->tok_len, (size_t)tok->n_ids * sizeof *tok->voc_len);
    for (int32_t i = 0; i < tok->n_ids; i++)
        if (tok->tok_len[i] != UINT32_MAX)
            tok_strmap_insert(&tok->vocab, tok, i);
    /* added tokens override the string of their id (HF looks added tokens up first) */
    for (size_t i = 0; i < n_added; i++) {
        const json_t *a = json_array_get(added, i);
        tok_added *t = &tok->added[tok->n_added];
        const json_t *content = json_object_get(a, "content");
        int special, normalized, single_word;
        int lstrip, rstrip;
        snprintf(p, sizeof p, "added_tokens[%zu]", i);
        mmoe_status st = get_bool(L, a, "special", p, 0, &special);
        if (st == MMOE_OK)
            st = get_bool(L, a, "normalized", p, !special, &normalized);
        if (st == MMOE_OK)
            st = get_bool(L, a, "lstrip", p, 0, &lstrip);
        if (st == MMOE_OK)
            st = get_bool(L, a, "rstrip", p, 0, &rstrip);
        if (st == MMOE_OK)
            st = get_bool(L, a, "single_word", p, 0, &single_word);
        if (st != MMOE_OK)
            return st;
        if (single_word)
            return mmoe_error_set(L->err, MMOE_EUNSUPPORTED,
                                  "tokenizer %s: key '%s.single_word': expected false, found true (not supported)",
                                  L->name, p);
        t->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->len = (uint32_t)json_string_length(content);
        t->off = pool_add(tok, json_string_value(content), t->len);
        t->special = (unsigned char)special;
        t->normalized = (unsigned char)normalized;
        t->lstrip = (unsigned char)lstrip;
        t->rstrip = (unsigned char)rstrip;
        tok->tok_off[t->id] = t->off;
        tok->tok_len[t->id] = t->len;
        tok->is_special[t->id] = (unsigned char)special;
        tok->n_added++;
    }
    return MMOE_OK;
}

/** Split one merges entry into its two token strings. */
static mmoe_status merge_parts(loader *L, const json_t *m, size_t rank, const char **a, size_t *a_len,
                               const char **b, size_t *b_len)
{
    char p[64];
    snprintf(p, sizeof p, "model.merges[%zu]", rank);
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *space = strchr(s, ' ');
        if (space == NULL || strchr(space + 1, ' ') != NULL)
            return bad(L, MMOE_EFORMAT, p, "\"left right\" (two tokens separated by one space)", m);
        *a = s;
        *a_len = (size_t)(space - s);
        *b = space + 1;
        *b_len = strlen(space + 1);
        return MMOE_OK;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *a_len = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *b_len = json_string_length(json_array_get(m, 1));
        return MMOE_OK;
    }
    return bad(L, MMOE_EFORMAT, p, "a string \"left right\" or an array [left, right]", m);
}

/** Read model.merges into the merge table (rank = position in the list). */
static mmoe_status read_merges(loader *L, const json_t *merges)
{
    mmoe_tokenizer *tok = L->tok;
    size_t n = json_array_size(merges);
    char *joined = NULL;
    size_t joined_cap = 0;
    if (tok_pairmap_init(&tok->merges, n) != MMOE_OK)
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    for (size_t r = 0; r < n; r++) {
        const char *a = NULL, *b = NULL;
        size_t a_len = 0, b_len = 0;
        mmoe_status st = merge_parts(L, json_array_get(merges, r), r, &a, &a_len, &b, &b_len);
        if (st != MMOE_OK) {
            free(joined);
            return st;
        }
        int32_t left = tok_strmap_find(&tok->vocab, tok, a, a_len);
        int32_t right = tok_strmap_find(&tok->vocab, tok, b, b_len);
        /* allocate on the first merge even when both halves are empty ("" + ""): memcpy to a NULL
           buffer is undefined even for 0 bytes */
        if (joined == NULL || a_len + b_len > joined_cap) {
            joined_cap = 2 * (a_len + b_len) + 16;
            char *grown = realloc(joined, joined_cap);
            if (grown == NULL) {
                free(joined);
                return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
            }
            joined = grown;
        }
        memcpy(joined, a, a_len);
        memcpy(joined + a_len, b, b_len);
        int32_t merged = tok_strmap_find(&tok->vocab, tok, joined, a_len + b_len);
        if (left < 0 || right < 0 || merged < 0) {
            const char *what = left < 0 ? a : right < 0 ? b : joined;
            int what_len = (int)(left < 0 ? a_len : right < 0 ? b_len : a_len + b_len);
            /* write the message before freeing: 'what' may point into 'joined' */
            mmoe_status bad_merge = mmoe_error_set(L->err, MMOE_EFORMAT,
                                                   "tokenizer %s: key 'model.merges[%zu]': expected tokens of "
                                                   "model.vocab, found '%.*s' which is not in the vocabulary",
                                                   L->name, r, what_len > 100 ? 100 : what_len, what);
            free(joined);
            return bad_merge;
        }
        tok_merge mg = {(int32_t)r, merged};
        tok_pairmap_insert(&tok->merges, left, right, mg);
    }
    free(joined);
    return MMOE_OK;
}

/** Nonzero for a missing key, null or "". */
static int is_null_or_empty_string(const json_t *v)
{
    return v == NULL || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0);
}

/** Read the `model` object (BPE only) and the added tokens. */
static mmoe_status read_model(loader *L, const json_t *root)
{
    mmoe_tokenizer *tok = L->tok;
    const json_t *model = json_object_get(root, "model");
    const char *type;
    if (!json_is_object(model))
        return bad(L, MMOE_EFORMAT, "model", "an object", model);
    const json_t *t = json_object_get(model, "type");
    type = json_is_string(t) ? json_string_value(t) : "BPE"; /* HF omits the type in some old files */
    if (strcmp(type, "BPE") != 0)
        return bad(L, MMOE_EUNSUPPORTED, "model.type", "\"BPE\" (the only model supported)", t);
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return bad(L, MMOE_EFORMAT, "model.vocab", "an object {token: id}", vocab);
    if (!json_is_array(merges))
        return bad(L, MMOE_EFORMAT, "model.merges", "an array", merges);
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout != NULL && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return bad(L, MMOE_EUNSUPPORTED, "model.dropout", "null (BPE dropout is not supported)", dropout);
    if (!is_null_or_empty_string(json_object_get(model, "continuing_subword_prefix")))
        return bad(L, MMOE_EUNSUPPORTED, "model.continuing_subword_prefix", "null (not supported)",
                   json_object_get(model, "continuing_subword_prefix"));
    if (!is_null_or_empty_string(json_object_get(model, "end_of_word_suffix")))
        return bad(L, MMOE_EUNSUPPORTED, "model.end_of_word_suffix", "null (not supported)",
                   json_object_get(model, "end_of_word_suffix"));
    int byte_fallback, fuse_unk;
    mmoe_status st = get_bool(L, model, "byte_fallback", "model", 0, &byte_fallback);
    if (st == MMOE_OK)
        st = get_bool(L, model, "fuse_unk", "model", 0, &fuse_unk);
    if (st == MMOE_OK)
        st = get_bool(L, model, "ignore_merges", "model", 0, &tok->ignore_merges);
    if (st != MMOE_OK)
        return st;
    if (byte_fallback)
        return bad(L, MMOE_EUNSUPPORTED, "model.byte_fallback", "false (not supported)", json_true());
    if (fuse_unk)
        return bad(L, MMOE_EUNSUPPORTED, "model.fuse_unk", "false (not supported)", json_true());
    const json_t *added = json_object_get(root, "added_tokens");
    if (added != NULL && !json_is_null(added) && !json_is_array(added))
        return bad(L, MMOE_EFORMAT, "added_tokens", "an array", added);
    st = read_ids_and_pool(L, vocab, json_is_array(added) ? added : NULL);
    if (st != MMOE_OK)
        return st;
    const json_t *unk = json_object_get(model, "unk_token");
    tok->unk_id = -1;
    if (unk != NULL && !json_is_null(unk)) {
        if (!json_is_string(unk))
            return bad(L, MMOE_EFORMAT, "model.unk_token", "null or a token string", unk);
        tok->unk_id = tok_strmap_find(&tok->vocab, tok, json_string_value(unk), json_string_length(unk));
        if (tok->unk_id < 0)
            return bad(L, MMOE_EFORMAT, "model.unk_token", "a token of model.vocab", unk);
    }
    return read_merges(L, merges);
}

/** A reader of one component (normalizer, pre-tokenizer or post-processor) at a key path. */
typedef mmoe_status (*component_reader)(loader *L, const json_t *n, const char *path);

/** Read a `Sequence` component: each element of @p n[@p list_key] with @p read, in order. */
static mmoe_status read_sequence(loader *L, const json_t *n, const char *path, const char *list_key,
                                 component_reader read)
{
    char p[256];
    const json_t *list = json_object_get(n, list_key);
    snprintf(p, sizeof p, "%s.%s", path, list_key);
    if (!json_is_array(list))
        return bad(L, MMOE_EFORMAT, p, "an array", list);
    for (size_t i = 0; i < json_array_size(list); i++) {
        snprintf(p, sizeof p, "%s.%s[%zu]", path, list_key, i);
        mmoe_status st = read(L, json_array_get(list, i), p);
        if (st != MMOE_OK)
            return st;
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------ normalizer */

/** A NUL-terminated copy of @p len bytes. */
static char *dup_bytes(const char *s, size_t len)
{
    char *d = malloc(len + 1);
    if (d != NULL) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

/** Append a normalizer step with string arguments @p a and @p b (may be NULL). */
static mmoe_status add_norm_step(loader *L, tok_norm_kind kind, const json_t *a, const json_t *b)
{
    mmoe_tokenizer *tok = L->tok;
    tok_norm_step *grown = realloc(tok->norm, (tok->n_norm + 1) * sizeof *grown);
    if (grown == NULL)
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    tok->norm = grown;
    tok_norm_step *s = &tok->norm[tok->n_norm];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->a_len = json_string_length(a);
    s->a = dup_bytes(json_string_value(a), s->a_len);
    if (b != NULL) {
        s->b_len = json_string_length(b);
        s->b = dup_bytes(json_string_value(b), s->b_len);
    }
    tok->n_norm++;
    if (s->a == NULL || (b != NULL && s->b == NULL))
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    return MMOE_OK;
}

/** Read a normalizer component at @p path (recursively for Sequence). */
static mmoe_status read_normalizer(loader *L, const json_t *n, const char *path)
{
    const char *type;
    char p[256];
    if (n == NULL || json_is_null(n))
        return MMOE_OK;
    mmoe_status st = get_type(L, n, path, &type);
    if (st != MMOE_OK)
        return st;
    if (strcmp(type, "Sequence") == 0)
        return read_sequence(L, n, path, "normalizers", read_normalizer);
    if (strcmp(type, "Prepend") == 0) {
        const json_t *pre = json_object_get(n, "prepend");
        snprintf(p, sizeof p, "%s.prepend", path);
        if (!json_is_string(pre))
            return bad(L, MMOE_EFORMAT, p, "a string", pre);
        return add_norm_step(L, TOK_NORM_PREPEND, pre, NULL);
    }
    if (strcmp(type, "Replace") == 0) {
        const json_t *pattern = json_object_get(n, "pattern"), *content = json_object_get(n, "content");
        const json_t *str = json_is_object(pattern) ? json_object_get(pattern, "String") : NULL;
        snprintf(p, sizeof p, "%s.pattern", path);
        if (!json_is_string(str))
            return bad(L, MMOE_EUNSUPPORTED, p, "{\"String\": ...} (regex patterns are not supported here)", pattern);
        snprintf(p, sizeof p, "%s.content", path);
        if (!json_is_string(content))
            return bad(L, MMOE_EFORMAT, p, "a string", content);
        return add_norm_step(L, TOK_NORM_REPLACE, str, content);
    }
    snprintf(p, sizeof p, "%s.type", path);
    return bad(L, MMOE_EUNSUPPORTED, p, "one of Sequence, Prepend, Replace", json_object_get(n, "type"));
}

/* ------------------------------------------------------------------ pre-tokenizer */

/** Append a pre-tokenizer step (takes over its compiled regex). */
static mmoe_status add_pre_step(loader *L, tok_pre_step step)
{
    mmoe_tokenizer *tok = L->tok;
    tok_pre_step *grown = realloc(tok->pre, (tok->n_pre + 1) * sizeof *grown);
    if (grown == NULL) {
        if (step.re != NULL)
            pcre2_code_free(step.re);
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    }
    tok->pre = grown;
    tok->pre[tok->n_pre++] = step;
    return MMOE_OK;
}

/** Compile a pattern with PCRE2_UTF | PCRE2_UCP (PCRE2_UTF | PCRE2_LITERAL for String patterns), JIT if possible. */
static mmoe_status compile_regex(loader *L, const char *pattern, size_t len, int literal, const char *path,
                                 pcre2_code **out)
{
    int errcode;
    PCRE2_SIZE erroff;
    /* PCRE2_LITERAL admits PCRE2_UTF but refuses PCRE2_UCP ("invalid option bits"), and a literal
       has no character classes for UCP to change: String patterns get UTF only */
    uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, options, &errcode, &erroff, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return mmoe_error_set(L->err, MMOE_EFORMAT,
                              "tokenizer %s: key '%s': expected a regex PCRE2 can compile, found an error at offset "
                              "%zu: %s", L->name, path, (size_t)erroff, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* if it fails, the interpreter gives the same matches */
    *out = re;
    return MMOE_OK;
}

/** Compile a pattern and append a Split step. */
static mmoe_status add_split(loader *L, const char *pattern, size_t len, int literal, tok_split_behavior behavior,
                             int invert, const char *path)
{
    tok_pre_step step = {TOK_PRE_SPLIT, NULL, behavior, invert, 0};
    mmoe_status st = compile_regex(L, pattern, len, literal, path, &step.re);
    return st != MMOE_OK ? st : add_pre_step(L, step);
}

/** Read a Split pre-tokenizer: pattern, behavior, invert. */
static mmoe_status read_split(loader *L, const json_t *n, const char *path)
{
    static const struct { const char *name; tok_split_behavior b; } behaviors[] = {
        {"Removed", TOK_SPLIT_REMOVED}, {"Isolated", TOK_SPLIT_ISOLATED},
        {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV}, {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
        {"Contiguous", TOK_SPLIT_CONTIGUOUS},
    };
    char p[256];
    const json_t *pattern = json_object_get(n, "pattern"), *beh = json_object_get(n, "behavior");
    const json_t *re = json_is_object(pattern) ? json_object_get(pattern, "Regex") : NULL;
    const json_t *str = json_is_object(pattern) ? json_object_get(pattern, "String") : NULL;
    snprintf(p, sizeof p, "%s.pattern", path);
    if (!json_is_string(re) && !json_is_string(str))
        return bad(L, MMOE_EFORMAT, p, "{\"Regex\": \"...\"} or {\"String\": \"...\"}", pattern);
    snprintf(p, sizeof p, "%s.behavior", path);
    size_t k;
    for (k = 0; k < sizeof behaviors / sizeof behaviors[0]; k++)
        if (json_is_string(beh) && strcmp(json_string_value(beh), behaviors[k].name) == 0)
            break;
    if (k == sizeof behaviors / sizeof behaviors[0])
        return bad(L, MMOE_EFORMAT, p, "one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", beh);
    int invert;
    mmoe_status st = get_bool(L, n, "invert", path, 0, &invert);
    if (st != MMOE_OK)
        return st;
    const json_t *pat = json_is_string(re) ? re : str;
    snprintf(p, sizeof p, "%s.pattern.%s", path, json_is_string(re) ? "Regex" : "String");
    return add_split(L, json_string_value(pat), json_string_length(pat), !json_is_string(re), behaviors[k].b, invert,
                     p);
}

/** GPT-2's word regex, used by a ByteLevel pre-tokenizer with use_regex = true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/** Read a pre-tokenizer component at @p path (recursively for Sequence). */
static mmoe_status read_pre_tokenizer(loader *L, const json_t *n, const char *path)
{
    const char *type;
    char p[256];
    if (n == NULL || json_is_null(n))
        return MMOE_OK;
    mmoe_status st = get_type(L, n, path, &type);
    if (st != MMOE_OK)
        return st;
    if (L->tok->byte_level)
        return mmoe_error_set(L->err, MMOE_EUNSUPPORTED,
                              "tokenizer %s: key '%s': expected no pre-tokenizer after ByteLevel, found %s (not "
                              "supported)", L->name, path, type);
    if (strcmp(type, "Sequence") == 0)
        return read_sequence(L, n, path, "pretokenizers", read_pre_tokenizer);
    if (strcmp(type, "Split") == 0)
        return read_split(L, n, path);
    if (strcmp(type, "Digits") == 0) {
        int individual;
        st = get_bool(L, n, "individual_digits", path, 0, &individual);
        snprintf(p, sizeof p, "%s (Digits)", path);
        return st != MMOE_OK ? st
                             : add_split(L, individual ? "\\p{N}" : "\\p{N}+", individual ? 5 : 6, 0,
                                         TOK_SPLIT_ISOLATED, 0, p);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        int add_prefix_space, use_regex;
        st = get_bool(L, n, "add_prefix_space", path, 1, &add_prefix_space);
        if (st == MMOE_OK)
            st = get_bool(L, n, "use_regex", path, 1, &use_regex);
        if (st != MMOE_OK)
            return st;
        tok_pre_step step = {TOK_PRE_BYTELEVEL, NULL, TOK_SPLIT_ISOLATED, 0, add_prefix_space};
        st = add_pre_step(L, step);
        if (st == MMOE_OK && use_regex) {
            snprintf(p, sizeof p, "%s (ByteLevel regex)", path);
            st = add_split(L, gpt2_pattern, sizeof gpt2_pattern - 1, 0, TOK_SPLIT_ISOLATED, 0, p);
        }
        L->tok->byte_level = 1;
        return st;
    }
    snprintf(p, sizeof p, "%s.type", path);
    return bad(L, MMOE_EUNSUPPORTED, p, "one of Sequence, Split, Digits, ByteLevel", json_object_get(n, "type"));
}

/* ------------------------------------------------------------------ post-processor and decoder */

/** Read the post-processor: ByteLevel adds nothing; others are noted as adding tokens. */
static mmoe_status read_post_processor(loader *L, const json_t *n, const char *path)
{
    const char *type;
    if (n == NULL || json_is_null(n))
        return MMOE_OK;
    mmoe_status st = get_type(L, n, path, &type);
    if (st != MMOE_OK)
        return st;
    if (strcmp(type, "ByteLevel") == 0)
        return MMOE_OK; /* adjusts offsets only; megamoe does not report offsets */
    if (strcmp(type, "Sequence") == 0)
        return read_sequence(L, n, path, "processors", read_post_processor);
    L->tok->post_adds_tokens = 1; /* TemplateProcessing, BertProcessing...: encode(add_special) refuses */
    return MMOE_OK;
}

/** Read the decoder (ByteLevel or null). */
static mmoe_status read_decoder(loader *L, const json_t *n)
{
    const char *type;
    if (n == NULL || json_is_null(n))
        return MMOE_OK;
    mmoe_status st = get_type(L, n, "decoder", &type);
    if (st != MMOE_OK)
        return st;
    if (strcmp(type, "ByteLevel") != 0)
        return bad(L, MMOE_EUNSUPPORTED, "decoder.type", "\"ByteLevel\" (the only decoder supported)",
                   json_object_get(n, "type"));
    L->tok->decoder_byte_level = 1;
    return MMOE_OK;
}

/* ------------------------------------------------------------------ derived tables */

/** Build the byte-level symbol table, the added-token tries and the decoded bytes of every token. */
static mmoe_status build_tables(loader *L)
{
    mmoe_tokenizer *tok = L->tok;
    uint32_t table[256];
    tok_bytelevel_table(table);
    for (int b = 0; b < 256; b++) {
        char s[4];
        size_t len = mmoe_utf8_put(table[b], s);
        tok->byte_sym[b] = tok_strmap_find(&tok->vocab, tok, s, len);
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const tok_added *a = &tok->added[i];
        if (a->len == 0)
            continue;
        if (tok_trie_insert(a->normalized ? &tok->trie_norm : &tok->trie_raw, tok->pool + a->off, a->len,
                            (int32_t)i) != MMOE_OK)
            return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    }
    /* decoded bytes of every token: byte-level unmapped, or the raw string */
    tok->dec = malloc(tok->pool_len + 1);
    tok->dec_off = malloc((size_t)tok->n_ids * sizeof *tok->dec_off + 1);
    tok->dec_len = malloc((size_t)tok->n_ids * sizeof *tok->dec_len + 1);
    if (tok->dec == NULL || tok->dec_off == NULL || tok->dec_len == NULL)
        return mmoe_error_set(L->err, MMOE_ENOMEM, "tokenizer %s: out of memory", L->name);
    size_t used = 0;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        tok->dec_off[id] = (uint32_t)used;
        tok->dec_len[id] = 0;
        if (tok->tok_len[id] == UINT32_MAX)
            continue;
        const char *s = tok->pool + tok->tok_off[id];
        size_t len = tok->tok_len[id];
        size_t n = tok_bytelevel_unmap(s, len, tok->dec + used); /* never longer than the string */
        if (n == SIZE_MAX) {
            memcpy(tok->dec + used, s, len);
            n = len;
        }
        tok->dec_len[id] = (uint32_t)n;
        used += n;
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------ entry points */

void mmoe_tokenizer_free(mmoe_tokenizer *tok)
{
    if (tok == NULL)
        return;
    free(tok->name);
    free(tok->pool);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->voc_off);
    free(tok->voc_len);
    free(tok->is_special);
    free(tok->dec);
    free(tok->dec_off);
    free(tok->dec_len);
    tok_strmap_free(&tok->vocab);
    tok_pairmap_free(&tok->merges);
    free(tok->added);
    tok_trie_free(&tok->trie_raw);
    tok_trie_free(&tok->trie_norm);
    for (size_t i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].a);
        free(tok->norm[i].b);
    }
    free(tok->norm);
    for (size_t i = 0; i < tok->n_pre; i++)
        if (tok->pre[i].re != NULL)
            pcre2_code_free(tok->pre[i].re);
    free(tok->pre);
    free(tok);
}

/** Build a tokenizer from the parsed JSON root. */
static mmoe_status load_root(json_t *root, const char *name, mmoe_tokenizer **out, mmoe_error *err)
{
    mmoe_tokenizer *tok = calloc(1, sizeof *tok);
    if (tok == NULL || (tok->name = dup_bytes(name, strlen(name))) == NULL) {
        mmoe_tokenizer_free(tok);
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer %s: out of memory", name);
    }
    loader L = {tok, name, err};
    mmoe_status st = MMOE_OK;
    if (!json_is_object(root))
        st = mmoe_error_set(err, MMOE_EFORMAT, "tokenizer %s: expected a JSON object at the top level, found %s", name,
                            json_type_name(root));
    if (st == MMOE_OK)
        st = read_model(&L, root);
    if (st == MMOE_OK)
        st = read_normalizer(&L, json_object_get(root, "normalizer"), "normalizer");
    if (st == MMOE_OK)
        st = read_pre_tokenizer(&L, json_object_get(root, "pre_tokenizer"), "pre_tokenizer");
    if (st == MMOE_OK)
        st = read_post_processor(&L, json_object_get(root, "post_processor"), "post_processor");
    if (st == MMOE_OK)
        st = read_decoder(&L, json_object_get(root, "decoder"));
    if (st == MMOE_OK)
        st = build_tables(&L);
    if (st != MMOE_OK) {
        mmoe_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return MMOE_OK;
}

mmoe_status mmoe_tokenizer_load_string(const char *json, size_t len, const char *name, mmoe_tokenizer **out,
                                       mmoe_error *err)
{
    json_error_t jerr;
    *out = NULL;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (root == NULL)
        return mmoe_error_set(err, MMOE_EFORMAT, "tokenizer %s: invalid JSON at line %d, column %d: %s", name,
                              jerr.line, jerr.column, jerr.text);
    mmoe_status st = load_root(root, name, out, err);
    json_decref(root);
    return st;
}

mmoe_status mmoe_tokenizer_load(const char *path, mmoe_tokenizer **out, mmoe_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return mmoe_error_set(err, MMOE_EIO, "tokenizer %s: cannot open the file", path);
    fclose(f);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (root == NULL)
        return mmoe_error_set(err, MMOE_EFORMAT, "tokenizer %s: invalid JSON at line %d, column %d: %s", path,
                              jerr.line, jerr.column, jerr.text);
    mmoe_status st = load_root(root, path, out, err);
    json_decref(root);
    return st;
}

mmoe_status mmoe_tokenizer_load_dir(const char *dir, mmoe_tokenizer **out, mmoe_error *err)
{
    size_t n = strlen(dir);
    char *path = malloc(n + sizeof "/tokenizer.json");
    if (path == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    memcpy(path, dir, n);
    memcpy(path + n, "/tokenizer.json", sizeof "/tokenizer.json");
    mmoe_status st = mmoe_tokenizer_load(path, out, err);
    free(path);
    return st;
}

/* ------------------------------------------------------------------ accessors */

int32_t mmoe_tokenizer_n_ids(const mmoe_tokenizer *tok)
{
    return tok->n_ids;
}

const char *mmoe_tokenizer_token_string(const mmoe_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->n_ids || tok->tok_len[id] == UINT32_MAX)
        return NULL;
    *len = tok->tok_len[id];
    return tok->pool + tok->tok_off[id];
}

int32_t mmoe_tokenizer_token_id(const mmoe_tokenizer *tok, const char *s, size_t len)
{
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->pool + tok->added[i].off, s, len) == 0)
            return tok->added[i].id;
    return tok_strmap_find(&tok->vocab, tok, s, len);
}

int mmoe_tokenizer_is_special(const mmoe_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_ids && tok->is_special[id];
}

