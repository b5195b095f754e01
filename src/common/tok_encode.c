/**
 * @file tok_encode.c
 * @brief The encode pipeline: added tokens, normalizer, pre-tokenizer, BPE.
 *
 *     text ──(added tokens, raw)──► segments: token | span
 *     span ──normalizer──► normalized span ──(added tokens, normalized)──► token | span
 *     span ──pre-tokenizer──► pieces ──BPE──► ids
 *
 * The ids of all segments are appended in text order.  Everything per call (the
 * work buffer, piece lists, the PCRE2 match data, the BPE arrays) lives in a
 * ::tok_work on this call's stack, so the tokenizer itself stays read-only.
 * The input must be valid UTF-8 (checked once up front; the regexes then run
 * with PCRE2_NO_UTF_CHECK).  The DeepSeek-V4 post-processor (ByteLevel) adds no
 * tokens, so `add_special` changes nothing for it.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/** Free the per-call scratch. */
static void work_free(tok_work *w)
{
    mmoe_text_free(&w->buf);
    free(w->a.v);
    free(w->b.v);
    if (w->md != NULL)
        pcre2_match_data_free(w->md);
    free(w->sym);
    free(w->prev);
    free(w->next);
    free(w->heap);
}

/** Encode one span of normalized text (already free of added tokens) that sits in w->buf. */
static mmoe_status encode_span(const mmoe_tokenizer *tok, tok_work *w, size_t off, size_t len,
                               mmoe_token_ids *out, mmoe_error *err)
{
    mmoe_status st = tok_pretokenize(tok, w, off, len, err);
    /* pieces are offsets: BPE reads them only after the buffer stopped growing */
    for (size_t i = 0; st == MMOE_OK && i < w->a.n; i++)
        st = tok_bpe_piece(tok, w, w->buf.data + w->a.v[i].off, w->a.v[i].len, out, err);
    return st;
}

/** Normalize one raw text span, split it on the normalized added tokens, and encode the rest. */
static mmoe_status encode_text_segment(const mmoe_tokenizer *tok, tok_work *w, const char *s, size_t len,
                                       mmoe_token_ids *out, mmoe_error *err)
{
    tok_segments segs = {0};
    mmoe_status st;
    w->buf.len = 0;
    if (tok->n_norm > 0)
        st = tok_normalize(tok, s, len, &w->buf);
    else
        st = mmoe_text_append(&w->buf, s, len);
    if (st == MMOE_OK)
        st = tok_added_split(tok, &tok->trie_norm, w->buf.data, 0, w->buf.len, &segs);
    if (st != MMOE_OK) {
        free(segs.v);
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    }
    for (size_t i = 0; st == MMOE_OK && i < segs.n; i++) {
        if (segs.v[i].token >= 0)
            st = mmoe_token_ids_push(out, &segs.v[i].token, 1);
        else
            st = encode_span(tok, w, segs.v[i].off, segs.v[i].len, out, err);
    }
    free(segs.v);
    return st;
}

mmoe_status mmoe_tokenizer_encode(const mmoe_tokenizer *tok, const char *text, size_t len, int add_special,
                                  mmoe_token_ids *out, mmoe_error *err)
{
    if (tok == NULL || out == NULL || (text == NULL && len > 0))
        return mmoe_error_set(err, MMOE_EINVAL, "tokenizer encode: NULL argument");
    if (add_special && tok->post_adds_tokens)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "tokenizer %s: key 'post_processor': a post-processor that adds special tokens is not "
                              "supported (encode without add_special and add them yourself)", tok->name);
    size_t bad = tok_utf8_first_invalid(text, len);
    if (bad < len)
        return mmoe_error_set(err, MMOE_EFORMAT,
                              "tokenizer encode: input is not valid UTF-8 at byte %zu (byte 0x%02X)", bad,
                              (unsigned char)text[bad]);
    size_t n_before = out->n;
    tok_work w = {0};
    tok_segments raw = {0};
    mmoe_status st = MMOE_OK;
    w.md = pcre2_match_data_create(1, NULL);
    if (w.md == NULL || tok_added_split(tok, &tok->trie_raw, text, 0, len, &raw) != MMOE_OK)
        st = mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; st == MMOE_OK && i < raw.n; i++) {
        if (raw.v[i].token >= 0)
            st = mmoe_token_ids_push(out, &raw.v[i].token, 1);
        else
            st = encode_text_segment(tok, &w, text + raw.v[i].off, raw.v[i].len, out, err);
    }
    free(raw.v);
    work_free(&w);
    if (st == MMOE_ENOMEM && (err == NULL || err->msg[0] == '\0'))
        mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    if (st != MMOE_OK)
        out->n = n_before;
    return st;
}
