/**
 * @file tok_utf8.c
 * @brief UTF-8 classification, validation and lossy conversion (U+FFFD for invalid bytes).
 *
 * The tokenizer meets invalid UTF-8 in one place only: the byte-level decoder can
 * produce any byte string (a generation can stop in the middle of a character, or
 * a caller can decode arbitrary ids).  The Hugging Face decoder then applies Rust's
 * `String::from_utf8_lossy`, which replaces each *maximal invalid subsequence* by one
 * U+FFFD (the "substitution of maximal subparts" practice of the Unicode standard,
 * chapter 3): a lead byte followed by fewer continuation bytes than it needs is one
 * subsequence; a byte that can never start a character (80..BF, C0, C1, F5..FF) is one
 * subsequence on its own.  The allowed second bytes follow table 3-7 of the standard
 * (E0 needs A0..BF, ED needs 80..9F, F0 needs 90..BF, F4 needs 80..8F), which excludes
 * overlong forms, surrogates and code points above U+10FFFF.
 *
 * tok_utf8_next() is the one classifier: it says whether the bytes at a position form a
 * valid character, an invalid subsequence (and how long it is), or a valid prefix that
 * the input ends inside.  The full decoder turns the last case into U+FFFD; the
 * streaming decoder (tok_decode.c) holds those bytes back instead.
 */
#include <stdint.h>
#include <string.h>

#include "tok_internal.h"

/** Nonzero for a continuation byte 10xxxxxx. */
static int is_cont(unsigned char b)
{
    return (b & 0xC0u) == 0x80u;
}

tok_utf8_kind tok_utf8_next(const unsigned char *p, size_t n, size_t *len, uint32_t *cp)
{
    unsigned char b0 = p[0];
    if (b0 < 0x80u) {
        *len = 1;
        if (cp)
            *cp = b0;
        return TOK_UTF8_VALID;
    }
    size_t width;
    unsigned char lo = 0x80u, hi = 0xBFu;
    if (b0 >= 0xC2u && b0 <= 0xDFu) {
        width = 2;
    } else if (b0 >= 0xE0u && b0 <= 0xEFu) {
        width = 3;
        if (b0 == 0xE0u)
            lo = 0xA0u;
        else if (b0 == 0xEDu)
            hi = 0x9Fu;
    } else if (b0 >= 0xF0u && b0 <= 0xF4u) {
        width = 4;
        if (b0 == 0xF0u)
            lo = 0x90u;
        else if (b0 == 0xF4u)
            hi = 0x8Fu;
    } else {
        *len = 1;
        return TOK_UTF8_INVALID;
    }
    if (n < 2) {
        *len = n;
        return TOK_UTF8_INCOMPLETE;
    }
    if (p[1] < lo || p[1] > hi) {
        *len = 1;
        return TOK_UTF8_INVALID;
    }
    for (size_t k = 2; k < width; k++) {
        if (n <= k) {
            *len = n;
            return TOK_UTF8_INCOMPLETE;
        }
        if (!is_cont(p[k])) {
            *len = k;
            return TOK_UTF8_INVALID;
        }
    }
    *len = width;
    if (cp) {
        uint32_t v = (uint32_t)b0 & (width == 2 ? 0x1Fu : width == 3 ? 0x0Fu : 0x07u);
        for (size_t k = 1; k < width; k++)
            v = (v << 6) | ((uint32_t)p[k] & 0x3Fu);
        *cp = v;
    }
    return TOK_UTF8_VALID;
}

size_t tok_utf8_first_invalid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80u) {
            i++;
            continue;
        }
        size_t len;
        if (tok_utf8_next(p + i, n - i, &len, NULL) != TOK_UTF8_VALID)
            return i;
        i += len;
    }
    return n;
}

size_t tok_utf8_put(uint32_t cp, char *buf)
{
    unsigned char *b = (unsigned char *)buf;
    if (cp < 0x80u) {
        b[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800u) {
        b[0] = (unsigned char)(0xC0u | (cp >> 6));
        b[1] = (unsigned char)(0x80u | (cp & 0x3Fu));
        return 2;
    }
    if (cp < 0x10000u) {
        b[0] = (unsigned char)(0xE0u | (cp >> 12));
        b[1] = (unsigned char)(0x80u | ((cp >> 6) & 0x3Fu));
        b[2] = (unsigned char)(0x80u | (cp & 0x3Fu));
        return 3;
    }
    b[0] = (unsigned char)(0xF0u | (cp >> 18));
    b[1] = (unsigned char)(0x80u | ((cp >> 12) & 0x3Fu));
    b[2] = (unsigned char)(0x80u | ((cp >> 6) & 0x3Fu));
    b[3] = (unsigned char)(0x80u | (cp & 0x3Fu));
    return 4;
}

mmoe_status tok_utf8_append_lossy(mmoe_text *out, const unsigned char *p, size_t n)
{
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* [run, i) is valid text not yet appended */
    while (i < n) {
        size_t len;
        tok_utf8_kind kind = p[i] < 0x80u ? (len = 1, TOK_UTF8_VALID) : tok_utf8_next(p + i, n - i, &len, NULL);
        if (kind == TOK_UTF8_VALID) {
            i += len;
            continue;
        }
        if (mmoe_text_append(out, (const char *)p + run, i - run) != MMOE_OK ||
            mmoe_text_append(out, replacement, 3) != MMOE_OK)
            return MMOE_ENOMEM;
        i += len;
        run = i;
    }
    return mmoe_text_append(out, (const char *)p + run, n - run);
}
