/**
 * @file tok_bytelevel.c
 * @brief The byte-level alphabet: every byte gets a printable Unicode stand-in.
 *
 * Byte-level BPE (GPT-2 and every model since that uses a `ByteLevel`
 * pre-tokenizer, DeepSeek-V4 included) runs BPE on *bytes*, so no text is ever
 * out of vocabulary.  To keep the vocabulary a list of readable strings, each of
 * the 256 bytes is written as one code point: the 188 bytes that are printable
 * Latin-1 characters (0x21..0x7E, 0xA1..0xAC, 0xAE..0xFF) stand for themselves, and
 * the other 68 (control characters, space, DEL, 0x80..0xA0, the soft hyphen 0xAD)
 * get U+0100, U+0101, ... in increasing byte order.  So the space 0x20 becomes
 * U+0120 `Ġ` and the newline 0x0A becomes U+010A `Ċ`; the token "Ġthe" is the
 * bytes " the".
 *
 * Decoding inverts the table.  A token string that contains a character outside
 * the table (an added token such as `<｜User｜>`, whose content is plain text) is
 * decoded as its own UTF-8 bytes, which is what the Hugging Face ByteLevel decoder
 * does as well.
 */
#include <stdint.h>

#include "tok_internal.h"

/** Nonzero for the 188 bytes that stand for themselves. */
static int byte_is_printable_stand_in(unsigned b)
{
    return (b >= 0x21u && b <= 0x7Eu) || (b >= 0xA1u && b <= 0xACu) || (b >= 0xAEu && b <= 0xFFu);
}

void tok_bytelevel_table(uint32_t byte_to_cp[256])
{
    uint32_t next_extra = 0x100u;
    for (unsigned b = 0; b < 256u; b++)
        byte_to_cp[b] = byte_is_printable_stand_in(b) ? b : next_extra++;
}

/** Inverse of the table for one code point: the byte, or -1 when @p cp stands for no byte. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 0x100u)
        return byte_is_printable_stand_in(cp) ? (int)cp : -1;
    if (cp >= 0x100u + 68u)
        return -1;
    /* the n-th non-printable byte, counting from 0 */
    uint32_t n = cp - 0x100u;
    for (unsigned b = 0; b < 256u; b++) {
        if (!byte_is_printable_stand_in(b)) {
            if (n == 0)
                return (int)b;
            n--;
        }
    }
    return -1;
}

size_t tok_bytelevel_unmap(const char *s, size_t len, unsigned char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, n_out = 0;
    while (i < len) {
        size_t clen;
        uint32_t cp;
        if (tok_utf8_next(p + i, len - i, &clen, &cp) != TOK_UTF8_VALID)
            return SIZE_MAX;
        int b = cp_to_byte(cp);
        if (b < 0)
            return SIZE_MAX;
        out[n_out++] = (unsigned char)b;
        i += clen;
    }
    return n_out;
}
