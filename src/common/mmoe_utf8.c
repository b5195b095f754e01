/**
 * @file mmoe_utf8.c
 * @brief A table-free UTF-8 classifier, validator and encoder.
 *
 * The lead byte says how many continuation bytes (10xxxxxx) follow:
 *
 *     0xxxxxxx                      U+0000..U+007F   (ASCII)
 *     110xxxxx 10xxxxxx             U+0080..U+07FF   (lead C2..DF; C0, C1 would be overlong)
 *     1110xxxx 10xxxxxx 10xxxxxx    U+0800..U+FFFF   (minus the surrogates D800..DFFF)
 *     11110xxx 10xxxxxx x 3         U+10000..U+10FFFF (lead F0..F4)
 *
 * Overlong forms, surrogates and values past U+10FFFF are excluded by
 * narrowing the allowed range of the *first continuation byte* for the lead
 * bytes E0, ED, F0 and F4 (the approach of the Unicode standard's table 3-7:
 * E0 needs A0..BF, ED needs 80..9F, F0 needs 90..BF, F4 needs 80..8F).
 *
 * mmoe_utf8_next() is the one classifier: it says whether the bytes at a position
 * form a valid character, an invalid subsequence (and how long it is), or a valid
 * prefix that the input ends inside.  Invalid subsequences are *maximal* in the sense
 * of Rust's `String::from_utf8_lossy` and of the Unicode standard (chapter 3): a lead
 * byte followed by fewer continuation bytes than it needs is one subsequence; a byte
 * that can never start a character (80..BF, C0, C1, F5..FF) is one on its own.  The
 * validator and the tokenizer's lossy decoder (tok_utf8.c) are built on it.
 */
#include "mmoe_utf8.h"

/** Nonzero for a continuation byte 10xxxxxx. */
static int is_cont(unsigned char b)
{
    return (b & 0xC0u) == 0x80u;
}

mmoe_utf8_kind mmoe_utf8_next(const unsigned char *p, size_t n, size_t *len, uint32_t *cp)
{
    unsigned char b0 = p[0];
    if (b0 < 0x80u) {
        *len = 1;
        if (cp)
            *cp = b0;
        return MMOE_UTF8_VALID;
    }
    size_t width;
    unsigned char lo = 0x80u, hi = 0xBFu; /* allowed range of the first continuation byte */
    if (b0 >= 0xC2u && b0 <= 0xDFu) {
        width = 2;
    } else if (b0 >= 0xE0u && b0 <= 0xEFu) {
        width = 3;
        if (b0 == 0xE0u)
            lo = 0xA0u; /* below would be overlong */
        else if (b0 == 0xEDu)
            hi = 0x9Fu; /* above would be a surrogate */
    } else if (b0 >= 0xF0u && b0 <= 0xF4u) {
        width = 4;
        if (b0 == 0xF0u)
            lo = 0x90u; /* below would be overlong */
        else if (b0 == 0xF4u)
            hi = 0x8Fu; /* above would exceed U+10FFFF */
    } else {
        *len = 1; /* a stray continuation byte, C0/C1, or F5..FF */
        return MMOE_UTF8_INVALID;
    }
    if (n < 2) {
        *len = n;
        return MMOE_UTF8_INCOMPLETE;
    }
    if (p[1] < lo || p[1] > hi) {
        *len = 1;
        return MMOE_UTF8_INVALID;
    }
    for (size_t k = 2; k < width; k++) {
        if (n <= k) {
            *len = n;
            return MMOE_UTF8_INCOMPLETE;
        }
        if (!is_cont(p[k])) {
            *len = k;
            return MMOE_UTF8_INVALID;
        }
    }
    *len = width;
    if (cp) {
        uint32_t v = (uint32_t)b0 & (width == 2 ? 0x1Fu : width == 3 ? 0x0Fu : 0x07u);
        for (size_t k = 1; k < width; k++)
            v = (v << 6) | ((uint32_t)p[k] & 0x3Fu);
        *cp = v;
    }
    return MMOE_UTF8_VALID;
}

size_t mmoe_utf8_first_invalid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80u) { /* the ASCII fast path */
            i++;
            continue;
        }
        size_t len;
        if (mmoe_utf8_next(p + i, n - i, &len, NULL) != MMOE_UTF8_VALID)
            return i;
        i += len;
    }
    return n;
}

int mmoe_utf8_valid(const char *s, size_t len, size_t *bad_offset)
{
    size_t bad = mmoe_utf8_first_invalid(s, len);
    if (bad == len)
        return 1;
    if (bad_offset)
        *bad_offset = bad;
    return 0;
}

size_t mmoe_utf8_put(uint32_t cp, char *buf)
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
