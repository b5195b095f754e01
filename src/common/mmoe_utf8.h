/**
 * @file mmoe_utf8.h
 * @brief UTF-8 (RFC 3629): the one classifier, validator and encoder of the library.
 *
 * A byte string is valid UTF-8 when it is a sequence of well-formed code
 * points: 1 to 4 bytes each, shortest form only (no "overlong" encodings such
 * as C0 80 for NUL), no UTF-16 surrogates (U+D800..U+DFFF), nothing above
 * U+10FFFF.  The safetensors reader validates every header with it (reporting
 * the offset of the first bad byte); the tokenizer classifies characters one at
 * a time with mmoe_utf8_next(), including the invalid and unfinished sequences
 * that its byte-level decoder can produce (tok_utf8.c turns those into U+FFFD).
 */
#ifndef MMOE_UTF8_H
#define MMOE_UTF8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** What the bytes at one position are. */
typedef enum mmoe_utf8_kind {
    MMOE_UTF8_VALID = 0,     /**< a complete, valid character of `len` bytes */
    MMOE_UTF8_INVALID = 1,   /**< `len` bytes form one maximal invalid subsequence */
    MMOE_UTF8_INCOMPLETE = 2 /**< all remaining bytes are a valid but unfinished prefix */
} mmoe_utf8_kind;

/**
 * Classify the character that starts at @p p.
 * @param p    the bytes; @p n >= 1 of them are readable
 * @param n    bytes available from @p p
 * @param len  receives the length of the character, of the maximal invalid subsequence
 *             (Unicode chapter 3, "substitution of maximal subparts"), or of the unfinished
 *             prefix (then all @p n bytes)
 * @param cp   if not NULL and the character is valid, receives its code point
 * @return the kind of the bytes at @p p
 */
mmoe_utf8_kind mmoe_utf8_next(const unsigned char *p, size_t n, size_t *len, uint32_t *cp);

/**
 * Offset of the first byte of the first ill-formed (or unfinished) sequence of the @p n
 * bytes at @p s, or @p n when all of them are valid UTF-8.
 */
size_t mmoe_utf8_first_invalid(const char *s, size_t n);

/**
 * Check that @p len bytes at @p s are valid UTF-8 (NUL bytes count as valid
 * U+0000 code points; reject them separately if needed).
 * @param s           the bytes (need not be NUL-terminated)
 * @param len         their number
 * @param bad_offset  if not NULL and the text is invalid, receives the offset
 *                    of the first byte of the first ill-formed sequence
 * @return 1 if valid, 0 if not
 */
int mmoe_utf8_valid(const char *s, size_t len, size_t *bad_offset);

/**
 * Write the UTF-8 encoding of @p cp (<= U+10FFFF, not a surrogate) to @p buf, which has
 * room for 4 bytes; returns its length (1..4).
 */
size_t mmoe_utf8_put(uint32_t cp, char *buf);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_UTF8_H */
