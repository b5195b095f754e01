/**
 * @file mmoe_utf8.h
 * @brief UTF-8 validation (RFC 3629): the check every text read from a file passes first.
 *
 * A byte string is valid UTF-8 when it is a sequence of well-formed code
 * points: 1 to 4 bytes each, shortest form only (no "overlong" encodings such
 * as C0 80 for NUL), no UTF-16 surrogates (U+D800..U+DFFF), nothing above
 * U+10FFFF.  The validator reports the offset of the first bad byte so that
 * error messages can point at it.
 */
#ifndef MMOE_UTF8_H
#define MMOE_UTF8_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
#endif /* MMOE_UTF8_H */
