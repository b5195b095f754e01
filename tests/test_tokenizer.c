/**
 * @file test_tokenizer.c
 * @brief Suite "tokenizer": BPE, pre-tokenizer, added tokens, decode and streaming decode on a
 *        hand-written tokenizer (fixtures/tokenizer/tiny-tokenizer.json), UTF-8 lossy rules,
 *        and the error messages for bad tokenizer.json files.
 *
 * Every expected encoding below is derived by hand from the fixture's merge list
 * (ranks: 0 `a b`, 1 `ab c`, 2 `Ġ a`, 3 `Ġa b`, 4 `b c`, 5 `1 2`) and its split regex
 * ` ?\p{L}+|\p{N}|\s+`; the derivation is written next to each case.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_test.h"
#include "mmoe_tokenizer.h"

static mmoe_tokenizer *load_tiny(void)
{
    const char *src = getenv("MMOE_SRCDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/fixtures/tokenizer/tiny-tokenizer.json", src ? src : ".");
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_tokenizer_load(path, &tok, &err);
    ck_assert_msg(st == MMOE_OK, "loading %s: %s", path, err.msg);
    return tok;
}

static void expect_ids(const mmoe_tokenizer *tok, const char *text, const int32_t *want, size_t n_want)
{
    mmoe_token_ids ids = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_tokenizer_encode(tok, text, strlen(text), 0, &ids, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(ids.n == n_want, "'%s': %zu ids, expected %zu", text, ids.n, n_want);
    for (size_t i = 0; i < n_want; i++)
        ck_assert_msg(ids.ids[i] == want[i], "'%s': id %zu is %d, expected %d", text, i, ids.ids[i], want[i]);
    mmoe_token_ids_free(&ids);
}

#define EXPECT(tok, text, ...)                                                          \
    do {                                                                                \
        static const int32_t want_[] = {__VA_ARGS__};                                   \
        expect_ids(tok, text, want_, sizeof want_ / sizeof want_[0]);                   \
    } while (0)

START_TEST(bpe_merge_order)
{
    mmoe_tokenizer *tok = load_tiny();
    /* a b c: pairs (a,b) rank 0 and (b,c) rank 4; rank 0 first -> ab c; then (ab,c) rank 1 -> abc */
    EXPECT(tok, "abc", 9);
    /* b c a b: (b,c) r4, (c,a) none, (a,b) r0 -> b c ab; then (b,c) r4 -> bc ab */
    EXPECT(tok, "bcab", 13, 8);
    /* " ab": Ġ a b: (Ġ,a) r2 loses to (a,b) r0 -> Ġ ab, and (Ġ,ab) has no merge: two tokens */
    EXPECT(tok, " ab", 5, 8);
    /* " a": Ġ a -> Ġa; " c": no merge */
    EXPECT(tok, " a c", 10, 5, 3);
    /* a a b: (a,a) none, (a,b) r0 at position 1 -> a ab */
    EXPECT(tok, "aab", 1, 8);
    /* "abab": the two (a,b) pairs have equal rank: leftmost first, then the second one */
    EXPECT(tok, "abab", 8, 8);
    /* no pair merges: d stays alone */
    EXPECT(tok, "dd", 4, 4);
    mmoe_tokenizer_free(tok);
}
END_TEST

START_TEST(pretokenizer_boundaries)
{
    mmoe_tokenizer *tok = load_tiny();
    /* \p{N} isolates each digit, so the merge "1 2" can never apply across pieces */
    EXPECT(tok, "12", 6, 7);
    /* "ab 12": pieces "ab", " " (\s+), "1", "2" */
    EXPECT(tok, "ab 12", 8, 5, 6, 7);
    /* newline run is one \s+ piece: Ċ Ċ (no merge) */
    EXPECT(tok, "a\n\n", 1, 14, 14);
    /* empty text: no ids */
    mmoe_token_ids ids = {0};
    ck_assert_int_eq(mmoe_tokenizer_encode(tok, "", 0, 0, &ids, NULL), MMOE_OK);
    ck_assert_uint_eq(ids.n, 0);
    mmoe_token_ids_free(&ids);
    mmoe_tokenizer_free(tok);
}
END_TEST

START_TEST(added_tokens)
{
    mmoe_tokenizer *tok = load_tiny();
    /* <s> is cut out before pre-tokenization: a | <s> | b */
    EXPECT(tok, "a<s>b", 1, 0, 2);
    /* <sep> (normalized) likewise; "abc" on both sides merges as usual */
    EXPECT(tok, "abc<sep>abc", 9, 20, 9);
    /* adjacent added tokens */
    EXPECT(tok, "<s><s><sep>", 0, 0, 20);
    ck_assert_int_eq(mmoe_tokenizer_token_id(tok, "<sep>", 5), 20);
    ck_assert_int_eq(mmoe_tokenizer_token_id(tok, "abc", 3), 9);
    ck_assert_int_eq(mmoe_tokenizer_token_id(tok, "zzz", 3), -1);
    ck_assert(mmoe_tokenizer_is_special(tok, 0));
    ck_assert(!mmoe_tokenizer_is_special(tok, 20));
    ck_assert_int_eq(mmoe_tokenizer_n_ids(tok), 34);
    /* '<' alone has no byte token in this vocabulary and there is no unk: a clear error */
    mmoe_token_ids ids = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_tokenizer_encode(tok, "a<b", 3, 0, &ids, &err), MMOE_EFORMAT);
    ck_assert_msg(strstr(err.msg, "0x3C") != NULL, "%s", err.msg);
    ck_assert_uint_eq(ids.n, 0);
    /* invalid UTF-8 input is refused with its byte offset */
    ck_assert_int_eq(mmoe_tokenizer_encode(tok, "ab\xC3(", 4, 0, &ids, &err), MMOE_EFORMAT);
    ck_assert_msg(strstr(err.msg, "byte 2") != NULL, "%s", err.msg);
    mmoe_token_ids_free(&ids);
    mmoe_tokenizer_free(tok);
}
END_TEST

static void expect_decode(const mmoe_tokenizer *tok, const int32_t *ids, size_t n, const char *want)
{
    mmoe_text full = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_tokenizer_decode(tok, ids, n, 0, &full, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(full.len, strlen(want));
    ck_assert_msg(memcmp(full.data, want, full.len) == 0, "decoded '%s', expected '%s'", full.data, want);
    /* the streaming decoder gives the same text for every split of the ids into two calls' worth,
       here: every prefix pushed token by token, the output checked after finishing */
    mmoe_decode_stream ds;
    mmoe_text streamed = {0};
    mmoe_decode_stream_init(&ds, tok, 0);
    for (size_t i = 0; i < n; i++) {
        size_t before = streamed.len;
        ck_assert_int_eq(mmoe_decode_stream_push(&ds, ids[i], &streamed, &err), MMOE_OK);
        /* whatever was emitted is final: it is a prefix of the full decode */
        ck_assert(streamed.len >= before && streamed.len <= full.len);
        ck_assert(memcmp(streamed.data, full.data, streamed.len) == 0);
    }
    ck_assert_int_eq(mmoe_decode_stream_finish(&ds, &streamed, &err), MMOE_OK);
    ck_assert_uint_eq(streamed.len, full.len);
    ck_assert(memcmp(streamed.data, full.data, full.len) == 0);
    mmoe_text_free(&full);
    mmoe_text_free(&streamed);
}

#define DECODE(tok, want, ...)                                                          \
    do {                                                                                \
        static const int32_t ids_[] = {__VA_ARGS__};                                    \
        expect_decode(tok, ids_, sizeof ids_ / sizeof ids_[0], want);                   \
    } while (0)

#define FFFD "\xEF\xBF\xBD"

START_TEST(decode_and_odd_bytes)
{
    mmoe_tokenizer *tok = load_tiny();
    DECODE(tok, "abc", 9);
    DECODE(tok, " ab c\n", 5, 8, 5, 3, 14);
    DECODE(tok, "<s>a<sep>", 0, 1, 20);
    /* ids 30, 31, 32 are the bytes E4 BD A0 = U+4F60 '你' */
    DECODE(tok, "\xE4\xBD\xA0", 30, 31, 32);
    /* a truncated character at the end is one U+FFFD (E4 BD is a maximal subpart) */
    DECODE(tok, FFFD, 30, 31);
    /* a lone continuation byte 80 is one U+FFFD */
    DECODE(tok, FFFD, 33);
    /* E4 then 'a': E4 alone is invalid (one U+FFFD), then 'a' */
    DECODE(tok, FFFD "a", 30, 1);
    /* E4 BD 'a': E4 BD is one maximal subpart -> one U+FFFD, then 'a' */
    DECODE(tok, FFFD "a", 30, 31, 1);
    /* 80 80 A0: three lone continuation bytes, three U+FFFD */
    DECODE(tok, FFFD FFFD FFFD, 33, 33, 32);
    /* a complete character split over three tokens, then text */
    DECODE(tok, "\xE4\xBD\xA0" "abc", 30, 31, 32, 9);
    /* skip_special drops <s> but keeps the non-special <sep> */
    mmoe_text t = {0};
    static const int32_t ids[] = {0, 1, 20, 0};
    ck_assert_int_eq(mmoe_tokenizer_decode(tok, ids, 4, 1, &t, NULL), MMOE_OK);
    ck_assert_str_eq(t.data, "a<sep>");
    mmoe_text_free(&t);
    /* unknown ids are errors naming the id, in both decoders */
    mmoe_error err;
    mmoe_error_clear(&err);
    static const int32_t bad[] = {1, 25};
    ck_assert_int_eq(mmoe_tokenizer_decode(tok, bad, 2, 0, &t, &err), MMOE_ERANGE);
    ck_assert_msg(strstr(err.msg, "25") != NULL, "%s", err.msg);
    mmoe_decode_stream ds;
    mmoe_decode_stream_init(&ds, tok, 0);
    ck_assert_int_eq(mmoe_decode_stream_push(&ds, 99, &t, &err), MMOE_ERANGE);
    mmoe_text_free(&t);
    mmoe_tokenizer_free(tok);
}
END_TEST

START_TEST(random_roundtrip_and_stream)
{
    /* random texts over the fixture's alphabet: decode(encode(x)) == x, and streaming
       decode of random byte-token sequences equals the full decode */
    uint64_t seed = mmoe_test_seed("tokenizer/random");
    mmoe_rng rng;
    mmoe_rng_seed(&rng, seed);
    mmoe_tokenizer *tok = load_tiny();
    static const char *alphabet[] = {"a", "b", "c", "d", " ", "\n", "1", "2", "<s>", "<sep>", "\xE4\xBD\xA0"};
    for (int trial = 0; trial < 300; trial++) {
        char text[512];
        size_t len = 0, n = mmoe_rng_below(&rng, 40);
        for (size_t i = 0; i < n; i++) {
            const char *piece = alphabet[mmoe_rng_below(&rng, sizeof alphabet / sizeof alphabet[0])];
            memcpy(text + len, piece, strlen(piece));
            len += strlen(piece);
        }
        mmoe_token_ids ids = {0};
        mmoe_text back = {0};
        ck_assert_int_eq(mmoe_tokenizer_encode(tok, text, len, 0, &ids, NULL), MMOE_OK);
        ck_assert_int_eq(mmoe_tokenizer_decode(tok, ids.ids, ids.n, 0, &back, NULL), MMOE_OK);
        ck_assert_uint_eq(back.len, len);
        ck_assert(len == 0 || memcmp(back.data, text, len) == 0);
        mmoe_token_ids_free(&ids);
        mmoe_text_free(&back);
    }
    static const int32_t pool[] = {30, 31, 32, 33, 1, 9, 5};
    for (int trial = 0; trial < 300; trial++) {
        int32_t ids[16];
        size_t n = 1 + mmoe_rng_below(&rng, 16);
        for (size_t i = 0; i < n; i++)
            ids[i] = pool[mmoe_rng_below(&rng, 7)];
        mmoe_text full = {0}, streamed = {0};
        ck_assert_int_eq(mmoe_tokenizer_decode(tok, ids, n, 0, &full, NULL), MMOE_OK);
        mmoe_decode_stream ds;
        mmoe_decode_stream_init(&ds, tok, 0);
        for (size_t i = 0; i < n; i++)
            ck_assert_int_eq(mmoe_decode_stream_push(&ds, ids[i], &streamed, NULL), MMOE_OK);
        ck_assert_int_eq(mmoe_decode_stream_finish(&ds, &streamed, NULL), MMOE_OK);
        ck_assert_uint_eq(streamed.len, full.len);
        ck_assert(memcmp(streamed.data, full.data, full.len) == 0);
        mmoe_text_free(&full);
        mmoe_text_free(&streamed);
    }
    mmoe_tokenizer_free(tok);
}
END_TEST

/** Load @p json and expect failure @p code with every string of @p needles in the message. */
static void expect_load_error(const char *json, mmoe_status code, const char *needle1, const char *needle2)
{
    mmoe_tokenizer *tok = (mmoe_tokenizer *)1;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_tokenizer_load_string(json, strlen(json), "bad.json", &tok, &err), code);
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(err.msg, needle1) != NULL, "message '%s' lacks '%s'", err.msg, needle1);
    ck_assert_msg(needle2 == NULL || strstr(err.msg, needle2) != NULL, "message '%s' lacks '%s'", err.msg, needle2);
}

START_TEST(bad_tokenizer_json)
{
    expect_load_error("{\"model\": ", MMOE_EFORMAT, "bad.json", "invalid JSON");
    expect_load_error("[1, 2]", MMOE_EFORMAT, "top level", "an array");
    expect_load_error("{}", MMOE_EFORMAT, "key 'model'", "key missing");
    expect_load_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", MMOE_EUNSUPPORTED, "model.type",
                      "WordPiece");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", MMOE_EFORMAT,
                      "model.vocab.a", "integer");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", MMOE_EFORMAT,
                      "model.merges[0]", "'b'");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}", MMOE_EFORMAT,
                      "model.merges[0]", "one space");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"},"
                      " \"behavior\": \"Isolated\"}}", MMOE_EFORMAT, "pre_tokenizer.pattern.Regex", "offset");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"},"
                      " \"behavior\": \"Sideways\"}}", MMOE_EFORMAT, "pre_tokenizer.behavior", "Sideways");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}}",
                      MMOE_EUNSUPPORTED, "normalizer.normalizers[0].type", "NFC");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                      " \"added_tokens\": [{\"id\": 1}]}", MMOE_EFORMAT, "added_tokens[0].content", "key missing");
    /* sparse ids: 2 tokens, one of them at id 67108863, would need 64 M table entries */
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 67108863}, \"merges\": []}}",
                      MMOE_EFORMAT, "ids reach 67108863", "nearly dense");
    /* gaps within the allowance load: 2 tokens at ids 0 and 65537 (65536 unused ids) */
    {
        static const char ok_json[] =
            "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 65537}, \"merges\": []}}";
        mmoe_tokenizer *sparse = NULL;
        mmoe_error e2;
        ck_assert_msg(mmoe_tokenizer_load_string(ok_json, strlen(ok_json), "gap.json", &sparse, &e2) == MMOE_OK, "%s",
                      e2.msg);
        mmoe_tokenizer_free(sparse);
    }
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    ck_assert_int_eq(mmoe_tokenizer_load("/nonexistent/tokenizer.json", &tok, &err), MMOE_EIO);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/tokenizer.json"));
}
END_TEST

START_TEST(normalizer_steps)
{
    /* Replace "x" -> "ab" then Prepend " ": "xc" -> " abc": pieces " abc" -> Ġ a b c:
       (Ġ,a) r2, (a,b) r0, (b,c) r3 -> Ġ ab c -> (Ġ,ab) none, (ab,c) r1 -> Ġ abc: ids 5, 6 */
    const char *json =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\xC4\xA0\": 3,"
        " \"ab\": 4, \"abc\": 6, \"\xC4\xA0" "a\": 7, \"bc\": 8}, \"merges\": [\"a b\", \"ab c\", \"\xC4\xA0 a\", \"b c\"]},"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"x\"},"
        " \"content\": \"ab\"}, {\"type\": \"Prepend\", \"prepend\": \" \"}]},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false},"
        " \"decoder\": {\"type\": \"ByteLevel\"}}";
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_tokenizer_load_string(json, strlen(json), "norm", &tok, &err) == MMOE_OK, "%s", err.msg);
    EXPECT(tok, "xc", 3, 6);
    mmoe_tokenizer_free(tok);
}
END_TEST

static Suite *tokenizer_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tiny");
    tcase_add_test(tc, bpe_merge_order);
    tcase_add_test(tc, pretokenizer_boundaries);
    tcase_add_test(tc, added_tokens);
    tcase_add_test(tc, decode_and_odd_bytes);
    tcase_add_test(tc, random_roundtrip_and_stream);
    tcase_add_test(tc, bad_tokenizer_json);
    tcase_add_test(tc, normalizer_steps);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(tokenizer_suite());
}
