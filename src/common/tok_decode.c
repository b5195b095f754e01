/**
 * @file tok_decode.c
 * @brief Decoding ids to text, in one call or one token at a time.
 *
 * Each id's decoded bytes were computed at load time (tok_json.c): the ByteLevel
 * decoder maps the token string's characters back to bytes, or keeps the string's
 * own UTF-8 when a character is not a byte stand-in (added tokens).  Decoding is
 * concatenation followed by the lossy UTF-8 rule of tok_utf8.c.
 *
 * The streaming decoder emits, after each token, the longest prefix of the bytes so
 * far that the lossy rule can already decide: a trailing *valid but unfinished*
 * character (at most 3 bytes) is held back, because the next token may finish it;
 * anything else (valid characters, invalid subsequences) is final.  A held-back
 * sequence that the next byte does not continue is an invalid subsequence of
 * exactly the same extent as in the one-call decode, so both give the same text.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/** Refuse ids with no token (and tokenizers without a ByteLevel decoder). */
static mmoe_status check_id(const mmoe_tokenizer *tok, int32_t id, mmoe_error *err)
{
    if (!tok->decoder_byte_level)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "tokenizer %s: decoding needs a ByteLevel decoder (tokenizer.json key 'decoder')",
                              tok->name);
    if (id < 0 || id >= tok->n_ids || tok->tok_len[id] == UINT32_MAX)
        return mmoe_error_set(err, MMOE_ERANGE, "tokenizer %s: token id %ld is not in the vocabulary (ids 0..%ld)",
                              tok->name, (long)id, (long)tok->n_ids - 1);
    return MMOE_OK;
}

mmoe_status mmoe_tokenizer_decode(const mmoe_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                                  mmoe_text *out, mmoe_error *err)
{
    mmoe_text bytes = {0};
    for (size_t i = 0; i < n; i++) {
        mmoe_status st = check_id(tok, ids[i], err);
        if (st != MMOE_OK) {
            mmoe_text_free(&bytes);
            return st;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && tok->is_special[id])
            continue;
        if (mmoe_text_append(&bytes, (const char *)tok->dec + tok->dec_off[id], tok->dec_len[id]) != MMOE_OK) {
            mmoe_text_free(&bytes);
            return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
        }
    }
    mmoe_status st = tok_utf8_append_lossy(out, (const unsigned char *)bytes.data, bytes.len);
    mmoe_text_free(&bytes);
    if (st != MMOE_OK)
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    if (out->data == NULL && mmoe_text_append(out, "", 0) != MMOE_OK)
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    return MMOE_OK;
}

void mmoe_decode_stream_init(mmoe_decode_stream *s, const mmoe_tokenizer *tok, int skip_special)
{
    s->tok = tok;
    s->skip_special = skip_special;
    s->n_pending = 0;
}

mmoe_status mmoe_decode_stream_push(mmoe_decode_stream *s, int32_t id, mmoe_text *out, mmoe_error *err)
{
    const mmoe_tokenizer *tok = s->tok;
    mmoe_status st = check_id(tok, id, err);
    if (st != MMOE_OK)
        return st;
    if (s->skip_special && tok->is_special[id])
        return MMOE_OK;
    size_t dlen = tok->dec_len[id], total = s->n_pending + dlen;
    unsigned char local[256];
    unsigned char *buf = total <= sizeof local ? local : malloc(total);
    if (buf == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    memcpy(buf, s->pending, s->n_pending);
    memcpy(buf + s->n_pending, tok->dec + tok->dec_off[id], dlen);
    /* find where a trailing unfinished character starts, if there is one */
    size_t i = 0, keep = total;
    while (i < total) {
        size_t len;
        if (buf[i] < 0x80u) {
            i++;
            continue;
        }
        if (tok_utf8_next(buf + i, total - i, &len, NULL) == TOK_UTF8_INCOMPLETE) {
            keep = i;
            break;
        }
        i += len;
    }
    st = tok_utf8_append_lossy(out, buf, keep);
    if (st == MMOE_OK && out->data == NULL)
        st = mmoe_text_append(out, "", 0);
    if (st == MMOE_OK) {
        memcpy(s->pending, buf + keep, total - keep); /* at most 3 bytes */
        s->n_pending = total - keep;
    }
    if (buf != local)
        free(buf);
    return st == MMOE_OK ? MMOE_OK : mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
}

mmoe_status mmoe_decode_stream_finish(mmoe_decode_stream *s, mmoe_text *out, mmoe_error *err)
{
    mmoe_status st = tok_utf8_append_lossy(out, s->pending, s->n_pending);
    if (st == MMOE_OK && out->data == NULL)
        st = mmoe_text_append(out, "", 0);
    s->n_pending = 0;
    return st == MMOE_OK ? MMOE_OK : mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
}
