/**
 * @file mmoe_stop_strings.h
 * @brief Stop strings over streamed text: release what cannot start a stop string, cut at the first match.
 *
 * A stop string ends the generation when it appears in the generated text; the text up to
 * it is the answer and the stop string itself is not (OpenAI's `stop`, llama.cpp's
 * `--reverse-prompt`-like `stop`).  The text arrives a token at a time and a stop string
 * may span several tokens, so the matcher holds back the longest tail of the text that is
 * a prefix of some stop string: that tail may still become a match.  Everything before it
 * is released at once, so a stream is delayed by at most (longest stop string - 1) bytes.
 *
 * Matching is on bytes: the stop string that is *completed* first wins (the longer one when
 * two end at the same byte), as when the text is read one byte at a time, so the answer does
 * not depend on how the text was split into tokens.  A held tail starts on the first byte of a stop
 * string, which is the first byte of a UTF-8 character, so released text never ends in
 * the middle of a character that was complete on input.
 */
#ifndef MMOE_STOP_STRINGS_H
#define MMOE_STOP_STRINGS_H

#include <stddef.h>

#include "mmoe_error.h"
#include "mmoe_tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A matcher over the stop strings it borrows. */
typedef struct mmoe_stop_matcher {
    const char *const *stops; /**< borrowed: the stop strings (non-empty, NUL-terminated) */
    size_t n_stops;           /**< how many (0: everything is released at once) */
    mmoe_text held;           /**< owned: text received but not released */
    int matched;              /**< a stop string was found: later text is dropped */
} mmoe_stop_matcher;

/** Set up a matcher over @p n_stops strings (borrowed until mmoe_stop_free()). */
void mmoe_stop_init(mmoe_stop_matcher *m, const char *const *stops, size_t n_stops);

/**
 * Add @p len bytes of generated text; append what is safe to release to @p out.
 * @param m        the matcher
 * @param text     the new text
 * @param len      its length in bytes
 * @param out      receives (appended) the text that can no longer be part of a stop string
 * @param matched  set to 1 when a stop string was found (the text before it is released,
 *                 the stop string and anything after are dropped), else left as is
 * @return MMOE_OK or MMOE_ENOMEM
 */
mmoe_status mmoe_stop_push(mmoe_stop_matcher *m, const char *text, size_t len, mmoe_text *out, int *matched);

/** End of text without a match: release what is held to @p out. @return MMOE_OK or MMOE_ENOMEM */
mmoe_status mmoe_stop_finish(mmoe_stop_matcher *m, mmoe_text *out);

/** Free the held text. */
void mmoe_stop_free(mmoe_stop_matcher *m);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_STOP_STRINGS_H */
