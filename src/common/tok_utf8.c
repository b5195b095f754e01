/**
 * @file tok_utf8.c
 * @brief Lossy UTF-8 conversion (U+FFFD for invalid bytes), on the classifier of mmoe_utf8.h.
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
 * mmoe_utf8_next() (mmoe_utf8.c) is the one classifier: it says whether the bytes at a
 * position form a valid character, an invalid subsequence (and how long it is), or a valid
 * prefix that the input ends inside.  The full decoder turns the last case into U+FFFD; the
 * streaming decoder (tok_decode.c) holds those bytes back instead.
 */
#include <stdint.h>
#include <string.h>

#include "tok_internal.h"

mmoe_status tok_utf8_append_lossy(mmoe_text *out, const unsigned char *p, size_t n)
{
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* [run, i) is valid text not yet appended */
    while (i < n) {
        size_t len;
        mmoe_utf8_kind kind = p[i] < 0x80u ? (len = 1, MMOE_UTF8_VALID) : mmoe_utf8_next(p + i, n - i, &len, NULL);
        if (kind == MMOE_UTF8_VALID) {
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
