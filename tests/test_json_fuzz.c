/**
 * @file test_json_fuzz.c
 * @brief Suite "json_fuzz": seeded mutations of valid JSON documents, fed to every JSON reader.
 *
 * megamoe reads four kinds of JSON written by others: the model's `config.json`
 * (mmoe_config_parse / mmoe_config_load), the Hugging Face `tokenizer.json`
 * (mmoe_tokenizer_load_string), chat conversations (mmoe_chat_encode_json) and the
 * sharded checkpoint's `model.safetensors.index.json` (mmoe_ckpt_open).  Each reader
 * promises the same thing: a call either succeeds with a usable result, or returns a
 * non-OK ::mmoe_status with a message (and no half-built result); it never crashes,
 * never leaks, never reads outside its input and never hangs.  CI runs this suite under
 * ASan+UBSan, so a memory error, an undefined operation or a leak fails the run, and
 * Check's timeout catches a hang.
 *
 * **The mutator.**  Valid seed documents (the fixtures, the presets the config writer
 * produces, the conversations of the chat tests, a checkpoint written by the
 * safetensors writer) are mutated 1 to 3 times each, by two families of edits:
 *
 * - blind byte edits, which mostly test the JSON layer: a bit flip, a byte replaced by
 *   a JSON-significant character, truncation (at a random byte, or just before, inside
 *   or after a token of a chosen kind: string, number, brace, colon, comma), deletion
 *   and duplication of a span;
 * - JSON-aware edits done on the text, which keep the syntax valid and so reach the
 *   readers' own checks: a number replaced by one of the classic troublemakers (0, -1,
 *   1e308, 2147483648, -0, 1.5, "x", null, [], {} and a few more); a string value
 *   replaced by a number, "", a very long string or a word of a small dictionary of
 *   the keys and names the readers know ("tool_calls", "Split", "weight_map", ...);
 *   a key dropped, duplicated or renamed; a member inserted; a value replaced by
 *   another value of the same document; a number nudged to a plausible wrong value
 *   (+-1, x2, /2, x1000: multiples, divisibility, sums); true, false and null swapped;
 *   a value replaced by deep nesting (up to 10000 levels of '[' or '{"a":', balanced
 *   or not).
 *
 * A tiny tolerant lexer (strings, numbers, literals, punctuation; it never fails, even
 * on broken text) finds the tokens; a value's extent is its token, or for '[' and '{'
 * everything up to the matching close.  Every input reaches the reader as an
 * exactly-sized heap copy (the string readers take a length), so reading one byte past
 * the end is an ASan error.
 *
 * **What is checked.**  On refusal: the status is not OK, the error's code equals it,
 * its message is not empty, and nothing was handed out (NULL tokenizer or checkpoint,
 * prompt unchanged).  On success: the result is used the way a caller would use it.
 * A config is validated again and written back with mmoe_config_to_json, which must read
 * back and write the same text again; a tokenizer encodes a few texts (every id in range)
 * and decodes them both at once and streamed, which must agree; a chat prompt keeps the
 * text that was in the buffer before and is valid UTF-8; a checkpoint finds every entry
 * it lists.  A file-based twin of the string reader (mmoe_config_load, mmoe_tokenizer_load)
 * runs on every 16th mutant and must give the same status.
 *
 * **Fixed cases.**  Hand-written documents that must be refused, per reader, each
 * with the key or file the message must name (hidden_size 0, a merge with an unknown
 * token, a message without "role", an index naming a missing shard...), and the inputs
 * of the bugs this suite found, as regression cases.
 *
 * The seed is printed and `MMOE_SEED=n` replays a run; the iteration counts are printed
 * too.  They are chosen so that the suite takes a few seconds in a plain build on two
 * cores (CI's sanitizer build is 3-5x slower).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_chat.h"
#include "mmoe_config.h"
#include "mmoe_safetensors.h"
#include "mmoe_test.h"
#include "mmoe_tokenizer.h"
#include "mmoe_utf8.h"

#ifndef FUZZ_SCALE
/** Multiplies every iteration count (for a long exploration run, compile with -DFUZZ_SCALE=50). */
#define FUZZ_SCALE 1
#endif
/** Mutants per config seed (6 seeds; a parse takes microseconds). */
#define FUZZ_CONFIG_CASES (3000 * FUZZ_SCALE)
/** Mutants per tokenizer seed (3 seeds; a load of the 22 KB fixture takes about a millisecond). */
#define FUZZ_TOKENIZER_CASES (1200 * FUZZ_SCALE)
/** Mutants per chat seed (10 seeds). */
#define FUZZ_CHAT_CASES (1500 * FUZZ_SCALE)
/** Mutants of the checkpoint index (one file write and one open each). */
#define FUZZ_INDEX_CASES (2000 * FUZZ_SCALE)
/** A file-based twin of the string reader runs on every FUZZ_FILE_EVERY-th mutant. */
#define FUZZ_FILE_EVERY 16
/** A mutant never grows beyond this many bytes plus twice its seed. */
#define FUZZ_MAX_GROWTH ((size_t)1 << 19)

static uint64_t g_seed;

/**
 * The assertion of the hot loops.  Check's ck_assert_* report their location to the
 * parent process on every call (for its "after this point" messages), one system call
 * each, which took most of this suite's time; FUZZ_CHECK calls into Check only when the
 * condition fails.
 */
#define FUZZ_CHECK(cond, ...)                                                                                        \
    do {                                                                                                           \
        if (!(cond))                                                                                               \
            ck_abort_msg(__VA_ARGS__);                                                                             \
    } while (0)

/* ------------------------------------------------------------------ text buffer */

/** A growable byte buffer, always NUL-terminated (the config reader takes a C string). */
typedef struct fuzz_buf {
    char *p;    /**< the bytes, NUL after the last */
    size_t len; /**< bytes in use */
    size_t cap; /**< allocated bytes (without the NUL) */
} fuzz_buf;

/** Make room for @p need bytes. */
static void buf_reserve(fuzz_buf *b, size_t need)
{
    if (need <= b->cap && b->p != NULL)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->p, cap + 1);
    FUZZ_CHECK(p != NULL, "out of memory");
    b->p = p;
    b->cap = cap;
}

/** Set the buffer to @p n bytes at @p s. */
static void buf_set(fuzz_buf *b, const char *s, size_t n)
{
    buf_reserve(b, n);
    memcpy(b->p, s, n);
    b->len = n;
    b->p[n] = '\0';
}

/** Replace bytes [off, off + del) by @p n bytes at @p ins (which must not point into the buffer). */
static void buf_splice(fuzz_buf *b, size_t off, size_t del, const char *ins, size_t n)
{
    FUZZ_CHECK(off + del <= b->len, "splice past the end");
    buf_reserve(b, b->len - del + n);
    memmove(b->p + off + n, b->p + off + del, b->len - off - del);
    memcpy(b->p + off, ins, n);
    b->len = b->len - del + n;
    b->p[b->len] = '\0';
}

/** An exactly-sized heap copy of the buffer (no NUL after it), so that ASan sees a read past the end. */
static char *exact_copy(const fuzz_buf *b)
{
    char *c = malloc(b->len ? b->len : 1);
    FUZZ_CHECK(c != NULL, "out of memory");
    memcpy(c, b->p, b->len);
    return c;
}

/* ------------------------------------------------------------------ a tolerant JSON lexer */

/** Token kinds of the lexer. */
typedef enum lx_kind {
    LX_STRING,  /**< "..." (to the closing quote or the end of the text) */
    LX_NUMBER,  /**< a run of [-+0-9.eE] starting with '-' or a digit */
    LX_LITERAL, /**< a run of letters (true, false, null, or garbage) */
    LX_OPEN,    /**< '[' or '{' */
    LX_CLOSE,   /**< ']' or '}' */
    LX_COLON,   /**< ':' */
    LX_COMMA,   /**< ',' */
    LX_OTHER    /**< any other byte */
} lx_kind;

/** One token of the text. */
typedef struct lx_tok {
    lx_kind kind; /**< what it is */
    size_t off;   /**< first byte */
    size_t len;   /**< bytes */
    int is_key;   /**< a string followed by ':' */
} lx_tok;

/** The tokens of a text (a growable array). */
typedef struct lx_toks {
    lx_tok *v;  /**< the tokens */
    size_t n;   /**< in use */
    size_t cap; /**< allocated */
} lx_toks;

/** Append a token. */
static void lx_push(lx_toks *t, lx_kind kind, size_t off, size_t len)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->v = realloc(t->v, t->cap * sizeof *t->v);
        FUZZ_CHECK(t->v != NULL, "out of memory");
    }
    t->v[t->n].kind = kind;
    t->v[t->n].off = off;
    t->v[t->n].len = len;
    t->v[t->n].is_key = 0;
    t->n++;
}

/** Lex @p s (never fails: broken text gives odd tokens, which is fine for a mutator). */
static void lex(const char *s, size_t n, lx_toks *t)
{
    t->n = 0;
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t start = i;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
            i++;
            continue;
        }
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\' && i + 1 < n)
                    i++;
            if (i < n)
                i++;
            lx_push(t, LX_STRING, start, i - start);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            while (i < n && strchr("-+0123456789.eE", s[i]) != NULL && s[i] != '\0')
                i++;
            lx_push(t, LX_NUMBER, start, i - start);
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            while (i < n && (((unsigned char)s[i] | 0x20u) >= 'a' && ((unsigned char)s[i] | 0x20u) <= 'z'))
                i++;
            lx_push(t, LX_LITERAL, start, i - start);
        } else {
            lx_kind k = c == '[' || c == '{' ? LX_OPEN : c == ']' || c == '}' ? LX_CLOSE
                        : c == ':' ? LX_COLON : c == ',' ? LX_COMMA : LX_OTHER;
            lx_push(t, k, start, 1);
            i++;
        }
    }
    for (size_t k = 0; k + 1 < t->n; k++)
        t->v[k].is_key = t->v[k].kind == LX_STRING && t->v[k + 1].kind == LX_COLON;
}

/** Nonzero when token @p k can start a value (not a key, not punctuation). */
static int lx_is_value(const lx_tok *k)
{
    return (k->kind == LX_STRING && !k->is_key) || k->kind == LX_NUMBER || k->kind == LX_LITERAL ||
           k->kind == LX_OPEN;
}

/** End offset of the value starting at token @p i: the token, or up to the matching close. */
static size_t lx_value_end(const lx_toks *t, size_t i, size_t text_len)
{
    if (t->v[i].kind != LX_OPEN)
        return t->v[i].off + t->v[i].len;
    int depth = 0;
    for (size_t j = i; j < t->n; j++) {
        if (t->v[j].kind == LX_OPEN)
            depth++;
        else if (t->v[j].kind == LX_CLOSE && --depth == 0)
            return t->v[j].off + 1;
    }
    return text_len;
}

/** Index of the first token at or after offset @p off (t->n if none). */
static size_t lx_token_at(const lx_toks *t, size_t off)
{
    size_t k = 0;
    while (k < t->n && t->v[k].off < off)
        k++;
    return k;
}

/** A random token for which @p want(tok) holds; returns t->n when there is none. */
static size_t lx_pick(mmoe_rng *rng, const lx_toks *t, int (*want)(const lx_tok *))
{
    size_t count = 0;
    for (size_t k = 0; k < t->n; k++)
        count += want(&t->v[k]) != 0;
    if (count == 0)
        return t->n;
    size_t pick = (size_t)mmoe_rng_below(rng, count);
    for (size_t k = 0; k < t->n; k++)
        if (want(&t->v[k]) && pick-- == 0)
            return k;
    return t->n;
}

static int lx_is_number(const lx_tok *k) { return k->kind == LX_NUMBER; }
static int lx_is_string_value(const lx_tok *k) { return k->kind == LX_STRING && !k->is_key; }
static int lx_is_key(const lx_tok *k) { return k->is_key; }
static int lx_is_open_brace(const lx_tok *k) { return k->kind == LX_OPEN; }
static int lx_is_literal(const lx_tok *k) { return k->kind == LX_LITERAL; }
static int lx_is_any(const lx_tok *k) { (void)k; return 1; }

/* ------------------------------------------------------------------ the mutator */

/** Bytes that mean something to a JSON parser (and two that break UTF-8). */
static const char fuzz_chars[] = "\"{}[],:-.eE+0123456789 \\/tnu\xff\xc3\x80";

/** Replacements for a number (and for any value): the classic troublemakers. */
static const char *const bad_numbers[] = {
    "0", "-1", "1e308", "2147483648", "-0", "1.5", "\"x\"", "null", "[]", "{}",
    "-2147483649", "4294967296", "4294967424", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "1e-320", "1e400", "-1e308", "65536", "128", "3", "0.0", "1E2", "true", "false",
    "0.30000000000000004", "1e-7", "\"\"", "[1]", "{\"a\": 1}",
};

/**
 * Words the readers know (keys, type names, roles, file names) and odd strings: a string
 * replaced by one of them reaches code that random bytes never would.
 */
static const char *const dict_words[] = {
    /* config */
    "hidden_size", "dim", "num_hidden_layers", "n_layers", "n_routed_experts", "compress_ratios",
    "quantization_config", "weight_block_size", "scale_fmt", "expert_dtype", "text_config", "rope_scaling",
    "num_key_value_heads", "scoring_func", "score_func", "softmax", "sigmoid", "sqrtsoftplus", "fp4", "fp8", "ue8m0",
    /* tokenizer */
    "model", "vocab", "merges", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "type",
    "BPE", "WordPiece", "Sequence", "Split", "Digits", "ByteLevel", "Prepend", "Replace", "Regex", "String",
    "pattern", "behavior", "invert", "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous",
    "normalizers", "pretokenizers", "processors", "prepend", "content", "unk_token", "ignore_merges",
    "individual_digits", "use_regex", "add_prefix_space", "lstrip", "rstrip", "normalized", "special",
    "single_word", "dropout", "TemplateProcessing", "\\\\p{L}+", "(", "a*", "(?:)", "\\\\s+(?!\\\\S)", "[^\\\\x00]+",
    "\\u0120", "\\u0120a", "a b", "a", " ",
    /* chat */
    "role", "system", "user", "assistant", "tool", "developer", "latest_reminder", "tools", "tool_calls",
    "tool_call_id", "function", "name", "arguments", "reasoning_content", "response_format", "task", "wo_eos",
    "mask", "messages", "text", "tool_result", "action", "query", "read_url", "id",
    "{\\\"k\\\": [1, 2.5, null]}", "[1]", "<\xEF\xBD\x9CUser\xEF\xBD\x9C>", "</think>",
    /* checkpoint index */
    "weight_map", "metadata", "total_size", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors", "model.safetensors", ".", "..", "a/b", "/etc/passwd",
    /* odd strings */
    "", "\\u0000", "x\\u0000y", "\\ud83d\\ude00", "\\ud800", "\\\\", "\\\"", "\xC3\xA9", "\xE6\x9D\xB1",
};

/** Random span [*off, *off + *len) of a text of @p n bytes: mostly short, sometimes long. */
static void random_span(mmoe_rng *rng, size_t n, size_t *off, size_t *len)
{
    *off = n ? (size_t)mmoe_rng_below(rng, n) : 0;
    size_t max = n - *off;
    size_t want = mmoe_rng_below(rng, 4) != 0 ? 1 + (size_t)mmoe_rng_below(rng, 16)
                                             : 1 + (size_t)mmoe_rng_below(rng, n / 2 + 1);
    *len = want < max ? want : max;
}

/** A deeply nested value: @p depth levels of '[' or '{"a":', closed or left open. */
static char *deep_nesting(size_t depth, int objects, int closed, size_t *len)
{
    size_t open_len = objects ? 5 : 1;
    char *s = malloc(depth * (open_len + 1) + 2);
    FUZZ_CHECK(s != NULL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < depth; i++) {
        memcpy(s + n, objects ? "{\"a\":" : "[", open_len);
        n += open_len;
    }
    s[n++] = '1';
    if (closed)
        for (size_t i = 0; i < depth; i++)
            s[n++] = objects ? '}' : ']';
    *len = n;
    return s;
}

/** A long JSON string literal (quotes included) of about @p n characters of one kind. */
static char *long_string(mmoe_rng *rng, size_t n, size_t *len)
{
    static const char *const units[] = {"a", " ", "\\u0000", "\xC3\xA9", "\\n", "\xC4\xA0", "<"};
    const char *u = units[mmoe_rng_below(rng, sizeof units / sizeof units[0])];
    size_t ul = strlen(u);
    char *s = malloc(n * ul + 3);
    FUZZ_CHECK(s != NULL, "out of memory");
    size_t k = 0;
    s[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        memcpy(s + k, u, ul);
        k += ul;
    }
    s[k++] = '"';
    *len = k;
    return s;
}

/** Splice a NUL-terminated replacement. */
static void splice_str(fuzz_buf *b, size_t off, size_t del, const char *s)
{
    buf_splice(b, off, del, s, strlen(s));
}

/** Splice a copy of bytes [from, from + n) of the buffer itself. */
static void splice_self(fuzz_buf *b, size_t off, size_t del, size_t from, size_t n)
{
    char *copy = malloc(n ? n : 1);
    FUZZ_CHECK(copy != NULL, "out of memory");
    memcpy(copy, b->p + from, n);
    buf_splice(b, off, del, copy, n);
    free(copy);
}

/** The kinds of mutation (see the file comment). */
typedef enum mut_kind {
    MUT_BIT_FLIP, MUT_JSON_CHAR, MUT_TRUNCATE, MUT_TRUNCATE_AT_TOKEN, MUT_DELETE_SPAN, MUT_DUP_SPAN,
    MUT_NUMBER, MUT_STRING_VALUE, MUT_DROP_KEY, MUT_DUP_KEY, MUT_RENAME_KEY, MUT_INSERT_MEMBER, MUT_SWAP_VALUE,
    MUT_NEST, MUT_LITERAL, MUT_NUMBER_NUDGE, MUT_COUNT
} mut_kind;

/** Apply one random mutation to @p b; @p limit bounds its length. */
static void mutate(mmoe_rng *rng, fuzz_buf *b, lx_toks *t, size_t limit)
{
    size_t n = b->len, off, len;
    lex(b->p, n, t);
    mut_kind kind = (mut_kind)mmoe_rng_below(rng, MUT_COUNT);
    size_t k;
    switch (kind) {
    case MUT_BIT_FLIP:
        if (n)
            b->p[mmoe_rng_below(rng, n)] ^= (char)(1u << mmoe_rng_below(rng, 8));
        return;
    case MUT_JSON_CHAR:
        if (n)
            b->p[mmoe_rng_below(rng, n)] = fuzz_chars[mmoe_rng_below(rng, sizeof fuzz_chars - 1)];
        return;
    case MUT_TRUNCATE:
        b->len = n ? (size_t)mmoe_rng_below(rng, n) : 0;
        b->p[b->len] = '\0';
        return;
    case MUT_TRUNCATE_AT_TOKEN: /* before, inside or after a token of any kind */
        if ((k = lx_pick(rng, t, lx_is_any)) == t->n)
            return;
        switch (mmoe_rng_below(rng, 3)) {
        case 0: b->len = t->v[k].off; break;
        case 1: b->len = t->v[k].off + (size_t)mmoe_rng_below(rng, t->v[k].len); break;
        default: b->len = t->v[k].off + t->v[k].len; break;
        }
        b->p[b->len] = '\0';
        return;
    case MUT_DELETE_SPAN:
        random_span(rng, n, &off, &len);
        buf_splice(b, off, len, "", 0);
        return;
    case MUT_DUP_SPAN:
        random_span(rng, n, &off, &len);
        if (n + len <= limit)
            splice_self(b, mmoe_rng_below(rng, 2) ? off + len : (size_t)mmoe_rng_below(rng, n + 1), 0, off, len);
        return;
    case MUT_NUMBER:
        if ((k = lx_pick(rng, t, lx_is_number)) != t->n)
            splice_str(b, t->v[k].off, t->v[k].len,
                       bad_numbers[mmoe_rng_below(rng, sizeof bad_numbers / sizeof bad_numbers[0])]);
        return;
    case MUT_STRING_VALUE: {
        if ((k = lx_pick(rng, t, lx_is_string_value)) == t->n)
            return;
        uint64_t how = mmoe_rng_below(rng, 4);
        if (how == 0) {
            splice_str(b, t->v[k].off, t->v[k].len,
                       bad_numbers[mmoe_rng_below(rng, sizeof bad_numbers / sizeof bad_numbers[0])]);
        } else if (how == 1) {
            static const size_t lengths[] = {255, 256, 4096, 65536, 70000};
            size_t want = lengths[mmoe_rng_below(rng, 5)], sl;
            if (n + 6 * want > limit)
                return;
            char *s = long_string(rng, want, &sl);
            buf_splice(b, t->v[k].off, t->v[k].len, s, sl);
            free(s);
        } else {
            char q[256];
            snprintf(q, sizeof q, "\"%s\"", dict_words[mmoe_rng_below(rng, sizeof dict_words / sizeof dict_words[0])]);
            splice_str(b, t->v[k].off, t->v[k].len, q);
        }
        return;
    }
    case MUT_DROP_KEY: { /* "key": value and one comma next to it */
        if ((k = lx_pick(rng, t, lx_is_key)) == t->n || k + 2 >= t->n)
            return;
        size_t start = t->v[k].off, end = lx_value_end(t, k + 2, n);
        size_t after = lx_token_at(t, end);
        if (after < t->n && t->v[after].kind == LX_COMMA)
            end = t->v[after].off + 1;
        else if (k > 0 && t->v[k - 1].kind == LX_COMMA)
            start = t->v[k - 1].off;
        buf_splice(b, start, end - start, "", 0);
        return;
    }
    case MUT_DUP_KEY: { /* "key": value, "key": value */
        if ((k = lx_pick(rng, t, lx_is_key)) == t->n || k + 2 >= t->n)
            return;
        size_t start = t->v[k].off, end = lx_value_end(t, k + 2, n);
        if (n + end - start + 2 > limit)
            return;
        buf_splice(b, end, 0, ", ", 2);
        splice_self(b, end + 2, 0, start, end - start);
        return;
    }
    case MUT_RENAME_KEY: {
        if ((k = lx_pick(rng, t, lx_is_key)) == t->n)
            return;
        char q[256];
        snprintf(q, sizeof q, "\"%s\"", dict_words[mmoe_rng_below(rng, sizeof dict_words / sizeof dict_words[0])]);
        splice_str(b, t->v[k].off, t->v[k].len, q);
        return;
    }
    case MUT_INSERT_MEMBER: { /* after an opening brace: "word": value, */
        if ((k = lx_pick(rng, t, lx_is_open_brace)) == t->n)
            return;
        char q[512];
        const char *w = dict_words[mmoe_rng_below(rng, sizeof dict_words / sizeof dict_words[0])];
        int raw = (int)mmoe_rng_below(rng, 2); /* a JSON value as is, or a word in quotes */
        const char *v = raw ? bad_numbers[mmoe_rng_below(rng, sizeof bad_numbers / sizeof bad_numbers[0])]
                            : dict_words[mmoe_rng_below(rng, sizeof dict_words / sizeof dict_words[0])];
        const char *quote = raw ? "" : "\"";
        if (b->p[t->v[k].off] == '{')
            snprintf(q, sizeof q, "\"%s\": %s%s%s, ", w, quote, v, quote);
        else
            snprintf(q, sizeof q, "%s%s%s, ", quote, v, quote);
        splice_str(b, t->v[k].off + 1, 0, q);
        return;
    }
    case MUT_SWAP_VALUE: { /* a value becomes a copy of another value of the document */
        size_t a = lx_pick(rng, t, lx_is_value), c = lx_pick(rng, t, lx_is_value);
        if (a == t->n || c == t->n)
            return;
        size_t a_end = lx_value_end(t, a, n), c_end = lx_value_end(t, c, n);
        if ((c <= a && c_end > t->v[a].off) || (a <= c && a_end > t->v[c].off))
            return; /* nested in each other: skip */
        if (n + (c_end - t->v[c].off) > limit)
            return;
        splice_self(b, t->v[a].off, a_end - t->v[a].off, t->v[c].off, c_end - t->v[c].off);
        return;
    }
    case MUT_NEST: {
        static const size_t depths[] = {2, 64, 2047, 2048, 2049, 10000};
        if ((k = lx_pick(rng, t, lx_is_value)) == t->n)
            return;
        size_t depth = depths[mmoe_rng_below(rng, 6)], sl;
        if (n + 6 * depth + 2 > limit)
            return;
        int closed = mmoe_rng_below(rng, 4) != 0;
        char *s = deep_nesting(depth, (int)mmoe_rng_below(rng, 2), closed, &sl);
        size_t end = closed ? lx_value_end(t, k, n) : t->v[k].off;
        buf_splice(b, t->v[k].off, end - t->v[k].off, s, sl);
        free(s);
        return;
    }
    case MUT_LITERAL: { /* true, false and null become each other (flags the seeds never set) */
        static const char *const literals[] = {"true", "false", "null", "0", "1", "\"true\""};
        if ((k = lx_pick(rng, t, lx_is_literal)) != t->n)
            splice_str(b, t->v[k].off, t->v[k].len, literals[mmoe_rng_below(rng, 6)]);
        return;
    }
    case MUT_NUMBER_NUDGE: { /* a plausible but wrong value: +-1, x2, /2, x1000 (multiples, ranges, sums) */
        if ((k = lx_pick(rng, t, lx_is_number)) == t->n)
            return;
        char num[64], out[64];
        size_t nl = t->v[k].len < sizeof num - 1 ? t->v[k].len : sizeof num - 1;
        memcpy(num, b->p + t->v[k].off, nl);
        num[nl] = '\0';
        double v = strtod(num, NULL);
        switch (mmoe_rng_below(rng, 5)) {
        case 0: v += 1; break;
        case 1: v -= 1; break;
        case 2: v *= 2; break;
        case 3: v = floor(v / 2); break;
        default: v *= 1000; break;
        }
        if (v == floor(v) && fabs(v) < 1e15)
            snprintf(out, sizeof out, "%.0f", v);
        else
            snprintf(out, sizeof out, "%.17g", v);
        splice_str(b, t->v[k].off, t->v[k].len, out);
        return;
    }
    case MUT_COUNT:
        break;
    }
}

/** Set @p b to @p seed and apply 1 to 3 mutations. */
static void make_mutant(mmoe_rng *rng, fuzz_buf *b, lx_toks *t, const char *seed, size_t seed_len)
{
    buf_set(b, seed, seed_len);
    int n_mut = 1 + (int)mmoe_rng_below(rng, 3);
    for (int m = 0; m < n_mut; m++)
        mutate(rng, b, t, 2 * seed_len + FUZZ_MAX_GROWTH);
}

/** Most truncation points of one document (8 token kinds x 2 tokens x 3 places). */
#define MAX_TRUNCATIONS 48

/**
 * The deterministic truncation sweep: for every token kind (string, number, literal, open,
 * close, colon, comma, other), just before, in the middle of and just after its first and
 * its last token.  Writes the lengths to cut at into @p out and returns their count.
 */
static size_t truncation_points(const char *s, size_t n, lx_toks *t, size_t out[MAX_TRUNCATIONS])
{
    size_t count = 0;
    lex(s, n, t);
    for (int kind = LX_STRING; kind <= LX_OTHER; kind++) {
        size_t first = t->n, last = t->n;
        for (size_t k = 0; k < t->n; k++)
            if ((int)t->v[k].kind == kind) {
                if (first == t->n)
                    first = k;
                last = k;
            }
        if (first == t->n)
            continue;
        const size_t which[2] = {first, last};
        for (int w = 0; w < 2; w++) {
            const lx_tok *k = &t->v[which[w]];
            out[count++] = k->off;
            out[count++] = k->off + k->len / 2;
            out[count++] = k->off + k->len;
        }
    }
    return count;
}

/** A refusal must carry its status and a message. */
static void check_refusal(mmoe_status st, const mmoe_error *err, const char *what, const fuzz_buf *b)
{
    FUZZ_CHECK(err->code == st, "%s: returned %s but the error says %s (input: %.200s)", what,
               mmoe_status_name(st), mmoe_status_name(err->code), b->p);
    FUZZ_CHECK(err->msg[0] != '\0', "%s: refused with %s but no message (input: %.200s)", what,
               mmoe_status_name(st), b->p);
}

/** Read a file of the source tree ($MMOE_SRCDIR/@p rel) into a NUL-terminated buffer. */
static char *read_src(const char *rel, size_t *len)
{
    const char *src = getenv("MMOE_SRCDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", src ? src : ".", rel);
    return (char *)mmoe_test_read_file(path, len);
}

/* ------------------------------------------------------------------ the driver */

/**
 * One reader under test.  try_input() feeds it one input and checks the outcome (the
 * refusal, or the use of the result); @p rng is NULL for the seeds and the truncations
 * (default options) and set for mutants, so that a reader with options can draw them.
 * try_file(), when not NULL, reads the same text from a file and returns its status.
 */
typedef struct fuzz_target {
    const char *name;                                                            /**< for messages */
    mmoe_status (*try_input)(void *ctx, mmoe_rng *rng, const fuzz_buf *b, mmoe_error *err); /**< see above */
    mmoe_status (*try_file)(const char *path);                                   /**< the file twin, or NULL */
    void *ctx;                                                                   /**< the reader's state */
} fuzz_target;

/**
 * Each seed must be accepted; then its truncation sweep and @p cases mutants go through the
 * target (every FUZZ_FILE_EVERY-th mutant through the file twin too, which must agree).
 * Prints the counts; both outcomes must occur (the mutations are neither too weak nor too strong).
 */
static void fuzz_seeds(mmoe_rng *rng, const fuzz_target *tg, const char *const *seeds, const size_t *seed_len, int n_seeds,
                       int cases)
{
    char dir[512], path[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/%s.json", dir, tg->name);
    fuzz_buf b = {0};
    lx_toks t = {0};
    mmoe_error err;
    int n_ok = 0, n_err = 0, n_trunc = 0;
    for (int s = 0; s < n_seeds; s++) {
        buf_set(&b, seeds[s], seed_len[s]);
        ck_assert_msg(tg->try_input(tg->ctx, NULL, &b, &err) == MMOE_OK, "%s: seed %d is refused: %s", tg->name, s,
                      err.msg);
        size_t cut[MAX_TRUNCATIONS], n_cut = truncation_points(seeds[s], seed_len[s], &t, cut);
        for (size_t i = 0; i < n_cut; i++, n_trunc++) {
            buf_set(&b, seeds[s], cut[i]);
            tg->try_input(tg->ctx, NULL, &b, &err);
        }
        for (int c = 0; c < cases; c++) {
            make_mutant(rng, &b, &t, seeds[s], seed_len[s]);
            mmoe_status st = tg->try_input(tg->ctx, rng, &b, &err);
            if (st == MMOE_OK)
                n_ok++;
            else
                n_err++;
            if (tg->try_file != NULL && c % FUZZ_FILE_EVERY == 0) {
                mmoe_test_write_file(path, b.p, b.len);
                mmoe_status st2 = tg->try_file(path);
                FUZZ_CHECK(st2 == st, "%s: the file reader says %s, the string reader %s", tg->name,
                           mmoe_status_name(st2), mmoe_status_name(st));
            }
        }
    }
    fprintf(stderr, "json_fuzz: %s: %d truncations; %d mutants (%d seed%s x %d): %d accepted, %d refused\n", tg->name,
            n_trunc, n_seeds * cases, n_seeds, n_seeds == 1 ? "" : "s", cases, n_ok, n_err);
    ck_assert_int_gt(n_ok, 0);
    ck_assert_int_gt(n_err, 0);
    free(b.p);
    free(t.v);
    mmoe_test_rmtree(dir);
}

/* ------------------------------------------------------------------ 1. config.json */

/** Parse the text; on success the config must validate and survive JSON -> config -> JSON. */
static mmoe_status config_try(void *ctx, mmoe_rng *rng, const fuzz_buf *b, mmoe_error *err)
{
    (void)ctx;
    (void)rng;
    mmoe_config cfg, again;
    mmoe_error_clear(err);
    mmoe_status st = mmoe_config_parse(b->p, "mutant.json", &cfg, err);
    if (st != MMOE_OK) {
        check_refusal(st, err, "config", b);
        return st;
    }
    mmoe_error e2;
    FUZZ_CHECK(mmoe_config_validate(&cfg, &e2) == MMOE_OK, "accepted config fails validation: %s", e2.msg);
    char *json1 = NULL, *json2 = NULL;
    FUZZ_CHECK(mmoe_config_to_json(&cfg, &json1, &e2) == MMOE_OK, "to_json: %s", e2.msg);
    FUZZ_CHECK(mmoe_config_parse(json1, "rewritten", &again, &e2) == MMOE_OK,
               "the writer's text of an accepted config is refused: %s\n%s", e2.msg, json1);
    FUZZ_CHECK(mmoe_config_to_json(&again, &json2, &e2) == MMOE_OK, "to_json: %s", e2.msg);
    FUZZ_CHECK(strcmp(json1, json2) == 0, "config text changed when written a second time:\n%s\n%s", json1, json2);
    free(json1);
    free(json2);
    return MMOE_OK;
}

/** Expect @p text to be refused with @p code and a message containing @p needle. */
static void config_refused(const char *text, mmoe_status code, const char *needle)
{
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_config_parse(text, "fixed.json", &cfg, &err);
    ck_assert_msg(st == code, "config %.120s: expected %s, got %s (%s)", text, mmoe_status_name(code),
                  mmoe_status_name(st), err.msg);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
}

/** The tiny preset's HF text with key @p key's value replaced by @p value (a new string). */
static char *tiny_with(const char *key, const char *value)
{
    mmoe_config cfg;
    mmoe_error err;
    char *json = NULL;
    ck_assert_int_eq(mmoe_config_preset("tiny", 0, &cfg, &err), MMOE_OK);
    ck_assert_int_eq(mmoe_config_to_json(&cfg, &json, &err), MMOE_OK);
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *at = strstr(json, pat);
    ck_assert_msg(at != NULL, "no key %s in the tiny preset", key);
    char *v = at + strlen(pat), *v_end = v;
    int depth = 0;
    while (*v_end && (depth > 0 || (*v_end != ',' && *v_end != '\n'))) {
        depth += *v_end == '[' || *v_end == '{';
        depth -= *v_end == ']' || *v_end == '}';
        v_end++;
    }
    size_t head = (size_t)(v - json), tail = strlen(v_end);
    char *out = malloc(head + strlen(value) + tail + 1);
    ck_assert_ptr_nonnull(out);
    memcpy(out, json, head);
    strcpy(out + head, value);
    strcat(out, v_end);
    free(json);
    return out;
}

START_TEST(config_fixed_refusals)
{
    static const struct { const char *key, *value, *needle; mmoe_status code; } cases[] = {
        {"hidden_size", "0", "hidden_size", MMOE_ERANGE},
        {"hidden_size", "1e308", "hidden_size", MMOE_ERANGE},
        {"hidden_size", "2147483648", "hidden_size", MMOE_ERANGE},
        {"hidden_size", "-0", "hidden_size", MMOE_ERANGE},
        {"n_routed_experts", "-8", "n_routed_experts", MMOE_ERANGE},
        {"n_routed_experts", "\"8\"", "n_routed_experts", MMOE_EFORMAT},
        {"n_routed_experts", "null", "n_routed_experts", MMOE_ENOTFOUND},
        {"n_routed_experts", "[]", "n_routed_experts", MMOE_EFORMAT},
        {"num_hidden_layers", "1.5", "num_hidden_layers", MMOE_EFORMAT},
        {"num_experts_per_tok", "9", "num_experts_per_tok", MMOE_ERANGE},
        {"compress_ratios", "[0, 4]", "compress_ratios", MMOE_ERANGE},
        {"compress_ratios", "[0, 4, 128, 3, 0]", "compress_ratios[3]", MMOE_ERANGE},
        {"compress_ratios", "{}", "compress_ratios", MMOE_EFORMAT},
        {"num_key_value_heads", "2", "num_key_value_heads", MMOE_ERANGE},
        {"scoring_func", "5", "scoring_func", MMOE_EFORMAT},
        {"scoring_func", "\"relu\"", "scoring_func", MMOE_ERANGE},
        {"expert_dtype", "\"fp16\"", "expert_dtype", MMOE_ERANGE},
        {"rope_scaling", "{\"factor\": \"x\"}", "rope_scaling.factor", MMOE_EFORMAT},
        {"quantization_config", "{\"weight_block_size\": [128]}", "weight_block_size", MMOE_EFORMAT},
        {"quantization_config", "{\"weight_block_size\": [64, 64]}", "weight_block_size", MMOE_ERANGE},
        /* regression: these two were narrowed to int before validation and read as [128, 128] */
        {"quantization_config", "{\"weight_block_size\": [4294967424, 128]}", "4294967424", MMOE_ERANGE},
        {"quantization_config", "{\"weight_block_size\": [128, -4294967168]}", "-4294967168", MMOE_ERANGE},
        {"quantization_config", "{\"scale_fmt\": \"fp32\"}", "scale_fmt", MMOE_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = tiny_with(cases[i].key, cases[i].value);
        config_refused(text, cases[i].code, cases[i].needle);
        free(text);
    }
    /* the reference code's spelling names its own key */
    size_t len;
    char *ref = read_src("fixtures/configs/deepseek-v4-flash.inference.json", &len);
    char *dim = strstr(ref, "\"dim\": 4096");
    ck_assert_ptr_nonnull(dim);
    memcpy(dim, "\"dim\": 0   ", 11);
    config_refused(ref, MMOE_ERANGE, "'dim'");
    free(ref);
    /* keys under text_config (V4.1) are checked like top-level ones */
    char *inner = tiny_with("hidden_size", "0"), *wrapped = malloc(strlen(inner) + 32);
    ck_assert_ptr_nonnull(wrapped);
    sprintf(wrapped, "{\"text_config\": %s}", inner);
    config_refused(wrapped, MMOE_ERANGE, "hidden_size");
    free(inner);
    free(wrapped);
    /* broken JSON names the source; deep nesting is refused by the JSON layer, not by the stack */
    config_refused("{\"hidden_size\": ", MMOE_EFORMAT, "fixed.json");
    config_refused("[]", MMOE_EFORMAT, "fixed.json");
    config_refused("", MMOE_EFORMAT, "fixed.json");
    size_t dl;
    char *deep = deep_nesting(10000, 0, 0, &dl);
    deep[dl - 1] = '\0'; /* 10000 '[' and nothing else */
    config_refused(deep, MMOE_EFORMAT, "fixed.json");
    free(deep);
    deep = deep_nesting(10000, 1, 1, &dl);
    deep[dl] = '\0';
    config_refused(deep, MMOE_EFORMAT, "fixed.json");
    free(deep);
}
END_TEST

/** The file twin of config_try(): mmoe_config_load(). */
static mmoe_status config_try_file(const char *path)
{
    mmoe_config cfg;
    mmoe_error err;
    return mmoe_config_load(path, &cfg, &err);
}

START_TEST(config_fuzz)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0xc0f1);
    char *seeds[6];
    size_t seed_len[6];
    static const char *const presets[] = {"tiny", "v4-flash", "v4-pro"};
    mmoe_error err;
    for (int i = 0; i < 3; i++) {
        mmoe_config cfg;
        ck_assert_int_eq(mmoe_config_preset(presets[i], 0, &cfg, &err), MMOE_OK);
        ck_assert_int_eq(mmoe_config_to_json(&cfg, &seeds[i], &err), MMOE_OK);
        seed_len[i] = strlen(seeds[i]);
    }
    seeds[3] = read_src("fixtures/tiny-dsv4/config.json", &seed_len[3]);
    seeds[4] = read_src("fixtures/configs/deepseek-v4-flash.inference.json", &seed_len[4]); /* reference keys */
    seeds[5] = read_src("fixtures/configs/deepseek-v4.1-flash.RECONSTRUCTED_NOT_VERBATIM.json", &seed_len[5]);
    const fuzz_target tg = {"config", config_try, config_try_file, NULL};
    fuzz_seeds(&rng, &tg, (const char *const *)seeds, seed_len, 6, FUZZ_CONFIG_CASES);
    for (int i = 0; i < 6; i++)
        free(seeds[i]);
}
END_TEST

/* ------------------------------------------------------------------ 2. tokenizer.json */

/** A third tokenizer seed that reaches what the fixtures do not: normalizers, Split/Digits, unk, strip flags. */
static const char tokenizer_seed_rich[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 40, \"content\": \"<sep>\", \"special\": false, \"normalized\": true, \"lstrip\": true,"
    " \"rstrip\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\":"
    " {\"String\": \"x\"}, \"content\": \"ab\"}, {\"type\": \"Prepend\", \"prepend\": \" \"}]},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    " {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"MergedWithPrevious\"},"
    " {\"type\": \"Split\", \"pattern\": {\"String\": \"!\"}, \"behavior\": \"Removed\"},"
    " {\"type\": \"Digits\", \"individual_digits\": true},"
    " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+\"}, \"behavior\": \"Contiguous\", \"invert\": true},"
    " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s*\"}, \"behavior\": \"MergedWithNext\"},"
    " {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": false}]},"
    " \"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}]},"
    " \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"ignore_merges\": true,"
    " \"vocab\": {\"<s>\": 0, \"<unk>\": 1, \"a\": 2, \"b\": 3, \"c\": 4, \"\\u0120\": 5, \"1\": 6, \"2\": 7,"
    " \"-\": 8, \"ab\": 9, \"abc\": 10, \"\\u0120a\": 11, \"\\u0120ab\": 12, \"bc\": 13, \"\\u010a\": 14,"
    " \"\\u00c3\": 15, \"\\u00a9\": 16, \"\\u00c3\\u00a9\": 17, \"e\": 18},"
    " \"merges\": [\"a b\", [\"ab\", \"c\"], \"\\u0120 a\", \"\\u0120a b\", \"b c\", \"\\u00c3 \\u00a9\"]}}";

/** Texts every accepted tokenizer encodes and decodes. */
static const char *const tokenizer_texts[] = {
    "Hello, world! 12345",
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>hi<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C></think>ok<s>",
    "na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x99\x82",
    "  \n\t x-c ab-12 <sep> abc",
    "",
};

/** Use an accepted tokenizer as a caller would: encode, check ids, decode at once and streamed. */
static void tokenizer_exercise(const mmoe_tokenizer *tok)
{
    int32_t n_ids = mmoe_tokenizer_n_ids(tok);
    FUZZ_CHECK(n_ids > 0, "a tokenizer without ids");
    for (size_t k = 0; k < sizeof tokenizer_texts / sizeof tokenizer_texts[0]; k++) {
        const char *text = tokenizer_texts[k];
        mmoe_token_ids ids = {0};
        mmoe_error err;
        mmoe_error_clear(&err);
        mmoe_status st = mmoe_tokenizer_encode(tok, text, strlen(text), (int)(k & 1), &ids, &err);
        if (st != MMOE_OK) {
            FUZZ_CHECK(err.code == st && err.msg[0] != '\0', "encode refused without a message");
            FUZZ_CHECK(ids.n == 0, "a refused encode left %zu ids", ids.n);
            mmoe_token_ids_free(&ids);
            continue;
        }
        for (size_t i = 0; i < ids.n; i++) {
            FUZZ_CHECK(ids.ids[i] >= 0 && ids.ids[i] < n_ids, "encode gave id %d of %d", ids.ids[i], n_ids);
            size_t sl;
            const char *str = mmoe_tokenizer_token_string(tok, ids.ids[i], &sl);
            FUZZ_CHECK(str != NULL, "encode gave id %d, which has no string", ids.ids[i]);
            int32_t back = mmoe_tokenizer_token_id(tok, str, sl);
            size_t back_len = 0;
            const char *back_str = back >= 0 ? mmoe_tokenizer_token_string(tok, back, &back_len) : NULL;
            FUZZ_CHECK(back_str != NULL && back_len == sl && memcmp(back_str, str, sl) == 0,
                       "id %d: its string '%.*s' looks up id %d", ids.ids[i], (int)sl, str, back);
            (void)mmoe_tokenizer_is_special(tok, ids.ids[i]);
        }
        for (int skip = 0; skip < 2; skip++) {
            mmoe_text whole = {0}, streamed = {0};
            st = mmoe_tokenizer_decode(tok, ids.ids, ids.n, skip, &whole, &err);
            if (st != MMOE_OK) {
                FUZZ_CHECK(err.code == st && err.msg[0] != '\0', "decode refused without a message");
            } else {
                mmoe_decode_stream ds;
                mmoe_decode_stream_init(&ds, tok, skip);
                for (size_t i = 0; i < ids.n; i++)
                    FUZZ_CHECK(mmoe_decode_stream_push(&ds, ids.ids[i], &streamed, &err) == MMOE_OK,
                               "stream refuses id %d that decode took: %s", ids.ids[i], err.msg);
                FUZZ_CHECK(mmoe_decode_stream_finish(&ds, &streamed, &err) == MMOE_OK, "%s", err.msg);
                FUZZ_CHECK(streamed.len == whole.len, "streamed %zu bytes, decoded %zu", streamed.len, whole.len);
                FUZZ_CHECK(whole.len == 0 || memcmp(streamed.data, whole.data, whole.len) == 0,
                           "streamed text differs from decoded text");
                FUZZ_CHECK(mmoe_utf8_first_invalid(whole.data, whole.len) == whole.len, "decode gave invalid UTF-8");
            }
            mmoe_text_free(&whole);
            mmoe_text_free(&streamed);
        }
        mmoe_token_ids_free(&ids);
    }
    /* ids that no token has are refused by name */
    const int32_t bad[] = {-1, n_ids, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        mmoe_text out = {0};
        mmoe_error err;
        mmoe_error_clear(&err);
        FUZZ_CHECK(mmoe_tokenizer_decode(tok, &bad[i], 1, 0, &out, &err) != MMOE_OK, "decode took id %d", bad[i]);
        FUZZ_CHECK(err.msg[0] != '\0', "decode refused id %d without a message", bad[i]);
        mmoe_text_free(&out);
    }
}

/** Load the text from an exactly-sized copy; check the refusal or exercise the tokenizer. */
static mmoe_status tokenizer_try(void *ctx, mmoe_rng *rng, const fuzz_buf *b, mmoe_error *err)
{
    (void)ctx;
    (void)rng;
    char *img = exact_copy(b);
    mmoe_tokenizer *tok = (mmoe_tokenizer *)&tok; /* poison: must become NULL on failure */
    mmoe_error_clear(err);
    mmoe_status st = mmoe_tokenizer_load_string(img, b->len, "mutant.json", &tok, err);
    if (st != MMOE_OK) {
        FUZZ_CHECK(tok == NULL, "a refusal handed out a result");
        check_refusal(st, err, "tokenizer", b);
    } else {
        tokenizer_exercise(tok);
        mmoe_tokenizer_free(tok);
    }
    free(img);
    return st;
}

/** Expect the tokenizer @p json to be refused with @p code and both needles in the message. */
static void tokenizer_refused(const char *json, mmoe_status code, const char *needle1, const char *needle2)
{
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_tokenizer_load_string(json, strlen(json), "fixed.json", &tok, &err);
    ck_assert_msg(st == code, "tokenizer %.150s: expected %s, got %s (%s)", json, mmoe_status_name(code),
                  mmoe_status_name(st), err.msg);
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(err.msg, needle1) != NULL, "message '%s' lacks '%s'", err.msg, needle1);
    ck_assert_msg(needle2 == NULL || strstr(err.msg, needle2) != NULL, "message '%s' lacks '%s'", err.msg, needle2);
}

/** A minimal model object around @p vocab_and_merges. */
#define TOK_MODEL(x) "{\"model\": {\"type\": \"BPE\", " x "}}"

START_TEST(tokenizer_fixed_refusals)
{
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a q\"]"), MMOE_EFORMAT,
                      "model.merges[0]", "'q'");
    /* regression: this message was formatted from a freed buffer */
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]"), MMOE_EFORMAT,
                      "model.merges[0]", "'ab'");
    /* regression: a first merge with two empty halves copied 0 bytes to a NULL buffer (UBSan) */
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0}, \"merges\": [\" \"]"), MMOE_EFORMAT, "model.merges[0]", "''");
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0}, \"merges\": [[\"\", \"\"], \"a a\"]"), MMOE_EFORMAT,
                      "model.merges[0]", NULL);
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": -1}, \"merges\": []"), MMOE_EFORMAT, "model.vocab.a", "-1");
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 2147483648}, \"merges\": []"), MMOE_EFORMAT, "model.vocab.a",
                      NULL);
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 1.5}, \"merges\": []"), MMOE_EFORMAT, "model.vocab.a", NULL);
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []"), MMOE_EFORMAT, "model.vocab",
                      "two strings");
    tokenizer_refused(TOK_MODEL("\"vocab\": [], \"merges\": []"), MMOE_EFORMAT, "model.vocab", NULL);
    tokenizer_refused(TOK_MODEL("\"vocab\": {}, \"merges\": {}"), MMOE_EFORMAT, "model.merges", NULL);
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": \"<unk>\""), MMOE_EFORMAT,
                      "model.unk_token", "<unk>");
    tokenizer_refused(TOK_MODEL("\"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1"), MMOE_EUNSUPPORTED,
                      "model.dropout", NULL);
    tokenizer_refused("{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", MMOE_EUNSUPPORTED, "model.type",
                      "Unigram");
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"added_tokens\": [{\"id\": -3, \"content\": \"x\"}]}", MMOE_EFORMAT, "added_tokens[0].id",
                      NULL);
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"added_tokens\": {}}", MMOE_EFORMAT, "added_tokens", NULL);
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"special\": 1}]}", MMOE_EFORMAT,
                      "added_tokens[0].special", NULL);
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\","
                      " \"pattern\": {\"Regex\": \"[a-\"}, \"behavior\": \"Isolated\"}]}}", MMOE_EFORMAT,
                      "pre_tokenizer.pretokenizers[0].pattern.Regex", NULL);
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"},"
                      " {\"type\": \"Digits\"}]}}", MMOE_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1]", NULL);
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"normalizer\": {\"type\": \"Prepend\"}}", MMOE_EFORMAT, "normalizer.prepend", NULL);
    tokenizer_refused("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"decoder\": {\"type\": \"WordPiece\"}}", MMOE_EUNSUPPORTED, "decoder.type", NULL);
    tokenizer_refused("{\"model\": ", MMOE_EFORMAT, "fixed.json", "invalid JSON");
    tokenizer_refused("{\"model\": {\"vocab\": {\"a\\u0000b\": 0}, \"merges\": []}}", MMOE_EFORMAT, "fixed.json",
                      NULL);
    size_t dl;
    char *deep = deep_nesting(10000, 0, 1, &dl);
    deep[dl] = '\0';
    tokenizer_refused(deep, MMOE_EFORMAT, "fixed.json", NULL);
    free(deep);
}
END_TEST

/*
 * Regression: a Split with a {"String": ...} pattern was refused ("invalid option bits with
 * PCRE2_LITERAL").  By hand: merges rank (b,-) before (a,b); split on "-" first, "ab-b" is
 * the pieces "ab" "-" "b" = ids 3 1 2; without the split, (b,-) would merge first: 0 4 2.
 */
START_TEST(tokenizer_string_split_loads)
{
    const char *json = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"-\": 1, \"b\": 2, \"ab\": 3,"
                       " \"b-\": 4}, \"merges\": [\"b -\", \"a b\"]}, \"pre_tokenizer\": {\"type\": \"Split\","
                       " \"pattern\": {\"String\": \"-\"}, \"behavior\": \"Isolated\"}}";
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_tokenizer_load_string(json, strlen(json), "split.json", &tok, &err) == MMOE_OK, "%s", err.msg);
    mmoe_token_ids ids = {0};
    ck_assert_int_eq(mmoe_tokenizer_encode(tok, "ab-b", 4, 0, &ids, &err), MMOE_OK);
    ck_assert_uint_eq(ids.n, 3);
    ck_assert_int_eq(ids.ids[0], 3);
    ck_assert_int_eq(ids.ids[1], 1);
    ck_assert_int_eq(ids.ids[2], 2);
    mmoe_token_ids_free(&ids);
    mmoe_tokenizer_free(tok);
}
END_TEST

/** The file twin of tokenizer_try(): mmoe_tokenizer_load(). */
static mmoe_status tokenizer_try_file(const char *path)
{
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    mmoe_status st = mmoe_tokenizer_load(path, &tok, &err);
    mmoe_tokenizer_free(tok);
    return st;
}

START_TEST(tokenizer_fuzz)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0x70c3);
    size_t seed_len[3];
    char *dsv4 = read_src("fixtures/tiny-dsv4/tokenizer.json", &seed_len[0]);
    char *tiny = read_src("fixtures/tokenizer/tiny-tokenizer.json", &seed_len[1]);
    const char *seeds[3] = {dsv4, tiny, tokenizer_seed_rich};
    seed_len[2] = strlen(tokenizer_seed_rich);
    const fuzz_target tg = {"tokenizer", tokenizer_try, tokenizer_try_file, NULL};
    fuzz_seeds(&rng, &tg, seeds, seed_len, 3, FUZZ_TOKENIZER_CASES);
    free(dsv4);
    free(tiny);
}
END_TEST

/* ------------------------------------------------------------------ 3. chat conversations */

/**
 * Conversations of tests/test_chat.c (the four official vectors are read from fixtures/), and
 * one more that reaches tool results given as a list of parts and the rarer string escapes.
 */
static const char *const chat_seeds_inline[] = {
    "[{\"role\": \"user\", \"content\": \"q1\"},"
    " {\"role\": \"assistant\", \"reasoning_content\": \"r\", \"content\": \"a1\"},"
    " {\"role\": \"user\", \"content\": \"q2\"}]",
    "[{\"role\": \"user\", \"content\": \"q\", \"task\": \"query\"},"
    " {\"role\": \"assistant\", \"content\": \"x\", \"wo_eos\": true}]",
    "[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
    "\"{\\\"n\\\": 5, \\\"x\\\": 2.50, \\\"big\\\": 1e5, \\\"small\\\": 1e-7, \\\"s\\\": \\\"a\\\\u001fb\\\","
    " \\\"l\\\": [true, null, {}], \\\"u\\\": \\\"\xC3\xA9/\\\"}\"}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"not json\"}}]}]",
    "[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"tool_calls\": ["
    "{\"id\": \"A\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}},"
    "{\"id\": \"B\", \"function\": {\"name\": \"g\", \"arguments\": \"{}\"}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"B\", \"content\": \"rb\"},"
    "{\"role\": \"tool\", \"tool_call_id\": \"A\", \"content\": \"ra\"}]",
    "[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"tool_calls\": ["
    "{\"id\": \"A\", \"function\": {\"name\": \"f\", \"arguments\": {\"k\": \"\\r\\t\\b\\f\", \"n\": 1.5e300}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"A\", \"content\": [{\"type\": \"text\", \"text\": \"r\"},"
    " {\"type\": \"image_url\"}]}, {\"role\": \"user\", \"content\": \"more\", \"task\": \"action\"}]",
    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\", \"response_format\": {\"a\": \"\\u001f\\n\","
    " \"b\": 1e16, \"c\": 0.0001, \"d\": -0.0, \"e\": 123456789.125}}, {\"role\": \"developer\", \"content\": \"d\"},"
    " {\"role\": \"latest_reminder\", \"content\": \"r\"}, {\"role\": \"user\", \"content\": \"x\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"t\", \"parameters\": {}}}]}",
};

/** Random encoder options (both modes, drop on/off, BOS, effort, a few context messages). */
static void random_chat_options(mmoe_rng *rng, mmoe_chat_options *o)
{
    mmoe_chat_options_default(o);
    o->mode = mmoe_rng_below(rng, 2) ? MMOE_CHAT_MODE_THINKING : MMOE_CHAT_MODE_CHAT;
    o->drop_thinking = (int)mmoe_rng_below(rng, 2);
    o->add_bos = (int)mmoe_rng_below(rng, 2);
    o->effort = (mmoe_chat_effort)mmoe_rng_below(rng, 3);
    o->n_context = mmoe_rng_below(rng, 3) == 0 ? (size_t)mmoe_rng_below(rng, 4) : 0;
}

/** Text already in the prompt buffer: it must survive every call, successful or not. */
#define CHAT_PREFIX "earlier turn\n"

/**
 * Encode the text from an exactly-sized copy, with random options for a mutant (@p rng set),
 * and check the prompt buffer (@p ctx, an ::mmoe_text, which is set to CHAT_PREFIX's text first).
 */
static mmoe_status chat_try(void *ctx, mmoe_rng *rng, const fuzz_buf *b, mmoe_error *err)
{
    mmoe_text *prompt = ctx;
    mmoe_chat_options opt;
    if (rng != NULL)
        random_chat_options(rng, &opt);
    else
        mmoe_chat_options_default(&opt);
    char *img = exact_copy(b);
    prompt->len = 0;
    FUZZ_CHECK(mmoe_text_append(prompt, CHAT_PREFIX, strlen(CHAT_PREFIX)) == MMOE_OK, "out of memory");
    mmoe_error_clear(err);
    mmoe_status st = mmoe_chat_encode_json(img, b->len, &opt, prompt, err);
    FUZZ_CHECK(prompt->len >= strlen(CHAT_PREFIX) && memcmp(prompt->data, CHAT_PREFIX, strlen(CHAT_PREFIX)) == 0,
               "the text already in the prompt was changed");
    if (st != MMOE_OK) {
        check_refusal(st, err, "chat", b);
        FUZZ_CHECK(prompt->len == strlen(CHAT_PREFIX) && prompt->data[prompt->len] == '\0',
                   "a refused conversation left %zu bytes in the prompt", prompt->len - strlen(CHAT_PREFIX));
    } else {
        FUZZ_CHECK(mmoe_utf8_first_invalid(prompt->data, prompt->len) == prompt->len, "the prompt is not valid UTF-8");
    }
    free(img);
    return st;
}

/** Expect the conversation @p json to be refused with @p code and a message containing @p needle. */
static void chat_refused(const char *json, mmoe_status code, const char *needle)
{
    mmoe_text prompt = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_chat_encode_json(json, strlen(json), NULL, &prompt, &err);
    ck_assert_msg(st == code, "chat %.150s: expected %s, got %s (%s)", json, mmoe_status_name(code),
                  mmoe_status_name(st), err.msg);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
    ck_assert_uint_eq(prompt.len, 0);
    mmoe_text_free(&prompt);
}

START_TEST(chat_fixed_refusals)
{
    chat_refused("[{\"content\": \"x\"}]", MMOE_EFORMAT, "'role'");
    chat_refused("[{\"role\": \"user\", \"content\": \"a\"}, {\"content\": \"b\"}]", MMOE_EFORMAT, "message 1");
    chat_refused("[{\"role\": 5, \"content\": \"x\"}]", MMOE_EFORMAT, "'role'");
    chat_refused("[{\"role\": \"wizard\"}]", MMOE_EINVAL, "wizard");
    chat_refused("[\"hello\"]", MMOE_EFORMAT, "message 0");
    chat_refused("[{\"role\": \"user\", \"content\": 5}]", MMOE_EFORMAT, "'content'");
    chat_refused("[{\"role\": \"system\", \"content\": {}}]", MMOE_EFORMAT, "'content'");
    chat_refused("[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": 1}]",
                 MMOE_EFORMAT, "message 1 (assistant): key 'content'");
    chat_refused("[{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"tool_calls\":"
                 " [{\"function\": {\"name\": 7}}]}]", MMOE_EFORMAT, "tool_calls[0].function.name");
    chat_refused("[{\"role\": \"system\", \"content\": \"s\", \"tools\": [{\"type\": \"function\"}]}]", MMOE_EFORMAT,
                 "tools[0].function");
    chat_refused("[{\"role\": \"user\", \"content\": \"x\", \"task\": 3}]", MMOE_EINVAL, "'task'");
    chat_refused("{\"messages\": {}}", MMOE_EFORMAT, "'messages'");
    chat_refused("{\"messages\": [], \"tools\": []}", MMOE_EFORMAT, "'tools'");
    chat_refused("42", MMOE_EFORMAT, "invalid JSON");
    chat_refused("[{\"role\": \"user\", \"content\": ", MMOE_EFORMAT, "invalid JSON");
    size_t dl;
    char *deep = deep_nesting(10000, 0, 1, &dl);
    deep[dl] = '\0';
    chat_refused(deep, MMOE_EFORMAT, "invalid JSON");
    free(deep);
}
END_TEST

START_TEST(chat_fuzz)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0xc4a7);
    enum { N_INLINE = sizeof chat_seeds_inline / sizeof chat_seeds_inline[0], N_SEEDS = N_INLINE + 4 };
    char *vectors[4];
    const char *seeds[N_SEEDS];
    size_t seed_len[N_SEEDS];
    for (int i = 0; i < 4; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "fixtures/chat-encoding/test_input_%d.json", i + 1);
        seeds[i] = vectors[i] = read_src(rel, &seed_len[i]);
    }
    for (int i = 0; i < N_INLINE; i++) {
        seeds[4 + i] = chat_seeds_inline[i];
        seed_len[4 + i] = strlen(chat_seeds_inline[i]);
    }
    mmoe_text prompt = {0};
    const fuzz_target tg = {"chat", chat_try, NULL, &prompt};
    fuzz_seeds(&rng, &tg, seeds, seed_len, N_SEEDS, FUZZ_CHAT_CASES);
    mmoe_text_free(&prompt);
    for (int i = 0; i < 4; i++)
        free(vectors[i]);
}
END_TEST

/* ------------------------------------------------------------------ 4. checkpoint index */

/** Tensor names of the small checkpoint, in name order, and their sizes (F32 elements). */
static const char *const ckpt_names[] = {
    "embed.weight", "layers.0.attn.wq.weight", "layers.0.ffn.w1.weight", "layers.0.ffn.w2.weight",
    "layers.1.attn.wq.weight", "layers.1.ffn.w1.weight", "norm.weight",
};
static const int64_t ckpt_sizes[] = {4, 4, 4, 4, 4, 4, 2};
/** Number of tensors of the small checkpoint. */
#define N_CKPT_NAMES (sizeof ckpt_names / sizeof ckpt_names[0])

/**
 * Write the checkpoint into @p dir: random F32 values, shards of at most 40 data bytes, which
 * puts the tensors of 16, 16 | 16, 16 | 16, 16, 8 bytes into exactly three shards, plus the index.
 */
static void write_small_checkpoint(mmoe_rng *rng, const char *dir)
{
    mmoe_st_writer *w;
    mmoe_error err;
    float data[N_CKPT_NAMES][4];
    ck_assert_int_eq(mmoe_st_writer_create(&w, &err), MMOE_OK);
    for (size_t i = 0; i < N_CKPT_NAMES; i++) {
        int64_t shape[1] = {ckpt_sizes[i]};
        for (int k = 0; k < 4; k++)
            data[i][k] = (float)mmoe_rng_normal(rng);
        ck_assert_int_eq(mmoe_st_writer_add(w, ckpt_names[i], MMOE_DT_F32, 1, shape, data[i],
                                            (size_t)shape[0] * sizeof(float), &err), MMOE_OK);
    }
    size_t n_shards = 0;
    ck_assert_msg(mmoe_st_writer_finish_sharded(w, dir, 40, &n_shards, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(n_shards, 3);
    mmoe_st_writer_destroy(w);
}

/** A checkpoint directory and the path of its index. */
typedef struct ckpt_place {
    char dir[512];  /**< the directory */
    char idx[600];  /**< dir/model.safetensors.index.json */
} ckpt_place;

/** Write the text as the index of the checkpoint at @p ctx (a ::ckpt_place), open it, check the refusal or use every entry. */
static mmoe_status ckpt_try(void *ctx, mmoe_rng *rng, const fuzz_buf *b, mmoe_error *err)
{
    const ckpt_place *at = ctx;
    (void)rng;
    mmoe_test_write_file(at->idx, b->p, b->len);
    mmoe_ckpt *ck = (mmoe_ckpt *)&ck; /* poison: must become NULL on failure */
    mmoe_error_clear(err);
    mmoe_status st = mmoe_ckpt_open(at->dir, &ck, err);
    if (st != MMOE_OK) {
        FUZZ_CHECK(ck == NULL, "a refusal handed out a result");
        check_refusal(st, err, "checkpoint index", b);
        return st;
    }
    FUZZ_CHECK(mmoe_ckpt_count(ck) <= N_CKPT_NAMES, "%zu tensors", mmoe_ckpt_count(ck));
    for (size_t i = 0; i < mmoe_ckpt_count(ck); i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_get(ck, i);
        FUZZ_CHECK(mmoe_ckpt_find_entry(ck, e->name) == e, "tensor %s: lookup finds another entry", e->name);
        FUZZ_CHECK(e->shard_index >= 0 && (size_t)e->shard_index < mmoe_ckpt_shard_count(ck), "tensor %s: shard %d",
                   e->name, e->shard_index);
        FUZZ_CHECK(strchr(e->shard, '/') == NULL, "tensor %s in shard %s, outside the directory", e->name, e->shard);
        mmoe_tensor view;
        FUZZ_CHECK(mmoe_ckpt_require(ck, e->name, MMOE_DT_F32, -1, NULL, &view, err) == MMOE_OK, "%s", err->msg);
        volatile float sink = 0;
        for (int64_t k = 0; k < mmoe_tensor_numel(&view); k++)
            sink += ((const float *)view.data)[k];
        (void)sink;
    }
    mmoe_ckpt_close(ck);
    return MMOE_OK;
}

/** Expect the index text @p json to be refused with @p code, naming @p needle. */
static void ckpt_refused(const char *dir, const char *index_path, const char *json, mmoe_status code,
                         const char *needle)
{
    mmoe_test_write_file(index_path, json, strlen(json));
    mmoe_ckpt *ck = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_ckpt_open(dir, &ck, &err);
    ck_assert_msg(st == code, "index %.150s: expected %s, got %s (%s)", json, mmoe_status_name(code),
                  mmoe_status_name(st), err.msg);
    ck_assert_ptr_null(ck);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s'", err.msg, needle);
}

START_TEST(index_fixed_refusals)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0x1dc5);
    char dir[512], idx[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    write_small_checkpoint(&rng, dir);
    snprintf(idx, sizeof idx, "%s/%s", dir, MMOE_ST_INDEX_NAME);
    size_t len;
    char *orig = (char *)mmoe_test_read_file(idx, &len);
    /* a shard that does not exist: the message names the shard and the index */
    char *missing = strdup(orig), *at = strstr(missing, "model-00001-of-");
    ck_assert_ptr_nonnull(at);
    memcpy(at, "model-00009-of-", 15);
    ckpt_refused(dir, idx, missing, MMOE_ENOTFOUND, "model-00009-of-");
    ckpt_refused(dir, idx, missing, MMOE_ENOTFOUND, MMOE_ST_INDEX_NAME);
    free(missing);
    ckpt_refused(dir, idx, "{\"metadata\": {}}", MMOE_EFORMAT, "weight_map");
    ckpt_refused(dir, idx, "{\"weight_map\": []}", MMOE_EFORMAT, "weight_map");
    ckpt_refused(dir, idx, "[]", MMOE_EFORMAT, MMOE_ST_INDEX_NAME);
    ckpt_refused(dir, idx, "{\"weight_map\": {\"embed.weight\": 1}}", MMOE_EFORMAT, "embed.weight");
    ckpt_refused(dir, idx, "{\"weight_map\": {\"embed.weight\": \"../x.safetensors\"}}", MMOE_EFORMAT,
                 "../x.safetensors");
    ckpt_refused(dir, idx, "{\"weight_map\": {\"embed.weight\": \"..\"}}", MMOE_EFORMAT, "embed.weight");
    ckpt_refused(dir, idx, "{\"weight_map\": {\"embed.weight\": \"\"}}", MMOE_EFORMAT, "embed.weight");
    ckpt_refused(dir, idx, "{\"weight_map\": {\"embed.weight\": \"" MMOE_ST_INDEX_NAME "\"}}", MMOE_EFORMAT,
                 MMOE_ST_INDEX_NAME);
    ckpt_refused(dir, idx, "{\"weight_map\": {\"a\": \"x\", \"a\": \"x\"}}", MMOE_EFORMAT, MMOE_ST_INDEX_NAME);
    ckpt_refused(dir, idx, "{\"weight_map\": {", MMOE_EFORMAT, MMOE_ST_INDEX_NAME);
    size_t dl;
    char *deep = deep_nesting(10000, 1, 1, &dl);
    deep[dl] = '\0';
    ckpt_refused(dir, idx, deep, MMOE_EFORMAT, MMOE_ST_INDEX_NAME);
    free(deep);
    /* a tensor listed in a shard that does not hold it, and a shard tensor the index omits */
    char *moved = strdup(orig), *emb = strstr(moved, "\"embed.weight\"");
    ck_assert_ptr_nonnull(emb);
    memcpy(emb, "\"embed.weighs\"", 14);
    ckpt_refused(dir, idx, moved, MMOE_ENOTFOUND, "embed.weighs");
    free(moved);
    free(orig);
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(index_fuzz)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0x1d3c);
    ckpt_place at;
    ck_assert_int_eq(mmoe_test_mkdtemp(at.dir, sizeof at.dir), 0);
    write_small_checkpoint(&rng, at.dir);
    snprintf(at.idx, sizeof at.idx, "%s/%s", at.dir, MMOE_ST_INDEX_NAME);
    size_t seed_len;
    char *seed = (char *)mmoe_test_read_file(at.idx, &seed_len);
    const fuzz_target tg = {"checkpoint index", ckpt_try, NULL, &at};
    const char *seeds[1] = {seed};
    fuzz_seeds(&rng, &tg, seeds, &seed_len, 1, FUZZ_INDEX_CASES);
    free(seed);
    mmoe_test_rmtree(at.dir);
}
END_TEST

static Suite *json_fuzz_suite(void)
{
    Suite *s = suite_create("json_fuzz");
    TCase *fixed = tcase_create("fixed");
    tcase_add_test(fixed, config_fixed_refusals);
    tcase_add_test(fixed, tokenizer_fixed_refusals);
    tcase_add_test(fixed, tokenizer_string_split_loads);
    tcase_add_test(fixed, chat_fixed_refusals);
    tcase_add_test(fixed, index_fixed_refusals);
    suite_add_tcase(s, fixed);
    TCase *fuzz = tcase_create("fuzz");
    tcase_add_test(fuzz, config_fuzz);
    tcase_add_test(fuzz, tokenizer_fuzz);
    tcase_add_test(fuzz, chat_fuzz);
    tcase_add_test(fuzz, index_fuzz);
    suite_add_tcase(s, fuzz);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("json_fuzz");
    return mmoe_test_run(json_fuzz_suite());
}
