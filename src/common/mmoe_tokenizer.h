/**
 * @file mmoe_tokenizer.h
 * @brief Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json`: encode, decode, streaming decode.
 *
 * The tokenizer turns UTF-8 text into token ids in five stages, the same stages
 * (and the same semantics) as the Hugging Face `tokenizers` library:
 *
 *  1. **Added tokens** (`added_tokens`): exact strings such as `<｜User｜>` are cut
 *     out of the text first, leftmost-longest, and become one id each.  Tokens
 *     with `"normalized": false` are matched on the raw text, the others on the
 *     normalized text (stage 2).
 *  2. **Normalizer** (`normalizer`): DeepSeek-V4's is an empty sequence; Prepend
 *     and Replace (string pattern) are also understood.
 *  3. **Pre-tokenizer** (`pre_tokenizer`): regex splits (PCRE2 with Unicode
 *     classes) cut each text span into pieces; the ByteLevel step maps every byte
 *     of a piece to one printable code point (GPT-2's table).
 *  4. **BPE model** (`model`): each piece starts as one symbol per byte and the
 *     merge with the lowest rank is applied first (ties: leftmost) until no merge
 *     applies; each final symbol is one vocabulary id.
 *  5. **Post-processor**: DeepSeek-V4's (ByteLevel) adds nothing, so
 *     `encode` never adds a BOS of its own (the chat encoder writes it as text).
 *
 * Decoding maps each id back to its string; the ByteLevel decoder maps the code
 * points back to bytes, and invalid UTF-8 in the result becomes U+FFFD, one per
 * maximal invalid subsequence.  mmoe_decode_stream does the same one token at a
 * time and holds back an incomplete UTF-8 character until its last byte arrives,
 * so that a generation loop can print text as it comes.
 *
 * A loaded ::mmoe_tokenizer is immutable: encode and decode may be called from
 * several threads at once.
 */
#ifndef MMOE_TOKENIZER_H
#define MMOE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A loaded tokenizer (opaque, immutable after loading). */
typedef struct mmoe_tokenizer mmoe_tokenizer;

/** A growable array of token ids; zero-initialise, free with mmoe_token_ids_free(). */
typedef struct mmoe_token_ids {
    int32_t *ids; /**< the ids (owned) */
    size_t n;     /**< number of ids */
    size_t cap;   /**< allocated capacity */
} mmoe_token_ids;

/** A growable byte string (NUL-terminated when non-empty); zero-initialise, free with mmoe_text_free(). */
typedef struct mmoe_text {
    char *data; /**< the bytes (owned), NUL-terminated */
    size_t len; /**< number of bytes, without the NUL */
    size_t cap; /**< allocated capacity */
} mmoe_text;

/**
 * Load a tokenizer from a `tokenizer.json` file.
 * @param path  path of the JSON file
 * @param out   receives the tokenizer (free with mmoe_tokenizer_free()); NULL on error
 * @param err   message naming the file and JSON key on failure (key, expected, found)
 * @return MMOE_OK, MMOE_EIO (unreadable), MMOE_EFORMAT (bad JSON or values),
 *         MMOE_EUNSUPPORTED (a component type this implementation does not know), MMOE_ENOMEM
 */
mmoe_status mmoe_tokenizer_load(const char *path, mmoe_tokenizer **out, mmoe_error *err);

/**
 * Load a tokenizer from `tokenizer.json` text held in memory.
 * @param json  the JSON text (need not be NUL-terminated)
 * @param len   its length in bytes
 * @param name  a name for error messages (for example the file it came from)
 * @param out, err as for mmoe_tokenizer_load()
 */
mmoe_status mmoe_tokenizer_load_string(const char *json, size_t len, const char *name,
                                       mmoe_tokenizer **out, mmoe_error *err);

/** Find `tokenizer.json` in a model directory and load it (error names the path tried). */
mmoe_status mmoe_tokenizer_load_dir(const char *dir, mmoe_tokenizer **out, mmoe_error *err);

/** Free a tokenizer; NULL is allowed. */
void mmoe_tokenizer_free(mmoe_tokenizer *tok);

/** One more than the largest token id (model vocabulary and added tokens together). */
int32_t mmoe_tokenizer_n_ids(const mmoe_tokenizer *tok);

/**
 * The string of token @p id as written in tokenizer.json (byte-level form for
 * model tokens, e.g. "Ġthe"; the literal content for added tokens).
 * @return a pointer into the tokenizer (not NUL-terminated: use @p len), or NULL
 *         when no token has this id
 */
const char *mmoe_tokenizer_token_string(const mmoe_tokenizer *tok, int32_t id, size_t *len);

/** The id of the token whose tokenizer.json string is exactly @p s (added tokens first); -1 if none. */
int32_t mmoe_tokenizer_token_id(const mmoe_tokenizer *tok, const char *s, size_t len);

/** Nonzero when @p id is an added token marked `"special": true` (BOS, EOS, pad...). */
int mmoe_tokenizer_is_special(const mmoe_tokenizer *tok, int32_t id);

/**
 * Encode UTF-8 text to token ids, appending them to @p out.
 * @param tok           the tokenizer
 * @param text          UTF-8 text (need not be NUL-terminated; may contain NUL bytes)
 * @param len           its length in bytes
 * @param add_special   apply the post-processor's special tokens (DeepSeek-V4: none)
 * @param out           ids are appended here (on error, @p out keeps its old length)
 * @param err           message on failure
 * @return MMOE_OK; MMOE_EFORMAT when @p text is not valid UTF-8 (the message gives the
 *         byte offset) or a piece has a character with no vocabulary entry and no unk token
 */
mmoe_status mmoe_tokenizer_encode(const mmoe_tokenizer *tok, const char *text, size_t len,
                                  int add_special, mmoe_token_ids *out, mmoe_error *err);

/**
 * Decode token ids to UTF-8 text, appending to @p out.  Invalid UTF-8 produced by
 * the byte-level decoder becomes U+FFFD (one per maximal invalid subsequence).
 * @param tok           the tokenizer
 * @param ids           the ids
 * @param n             how many
 * @param skip_special  leave out tokens marked special (BOS, EOS)
 * @param out           the text is appended here
 * @param err           message on failure
 * @return MMOE_OK; MMOE_ERANGE when an id has no token (the message names it)
 */
mmoe_status mmoe_tokenizer_decode(const mmoe_tokenizer *tok, const int32_t *ids, size_t n,
                                  int skip_special, mmoe_text *out, mmoe_error *err);

/** Append @p n ids to @p ids (grows the array).  MMOE_ENOMEM on failure. */
mmoe_status mmoe_token_ids_push(mmoe_token_ids *ids, const int32_t *v, size_t n);
/** Free the ids array and zero the struct. */
void mmoe_token_ids_free(mmoe_token_ids *ids);
/** Append @p n bytes to @p t (keeps it NUL-terminated).  MMOE_ENOMEM on failure. */
mmoe_status mmoe_text_append(mmoe_text *t, const char *s, size_t n);
/** Free the text and zero the struct. */
void mmoe_text_free(mmoe_text *t);

/**
 * Streaming decoder: feed ids one at a time, get the text that is complete so far.
 * Bytes of a UTF-8 character whose last byte has not arrived yet are held back
 * (at most 3); the concatenation of everything pushed and finished equals
 * mmoe_tokenizer_decode() of all ids, for every way of splitting the ids.
 */
typedef struct mmoe_decode_stream {
    const mmoe_tokenizer *tok; /**< borrowed tokenizer */
    int skip_special;          /**< as in mmoe_tokenizer_decode() */
    unsigned char pending[4];  /**< held-back bytes of an incomplete character */
    size_t n_pending;          /**< how many */
} mmoe_decode_stream;

/** Start a stream over @p tok. */
void mmoe_decode_stream_init(mmoe_decode_stream *s, const mmoe_tokenizer *tok, int skip_special);

/**
 * Decode one more token; append the text that became complete to @p out (possibly nothing).
 * @return MMOE_OK, or MMOE_ERANGE for an unknown id (the stream is unchanged)
 */
mmoe_status mmoe_decode_stream_push(mmoe_decode_stream *s, int32_t id, mmoe_text *out, mmoe_error *err);

/** End the stream: held-back bytes (an unfinished character) become U+FFFD.  Resets the stream. */
mmoe_status mmoe_decode_stream_finish(mmoe_decode_stream *s, mmoe_text *out, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_TOKENIZER_H */
