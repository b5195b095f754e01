/**
 * @file tok_pretokenize.c
 * @brief Normalizer and pre-tokenizer: cutting a text span into the pieces BPE works on.
 *
 * BPE never merges across a piece boundary, so the pre-tokenizer decides which
 * byte sequences can ever become one token.  DeepSeek-V4's pre-tokenizer is a
 * sequence of three regex splits and a ByteLevel step:
 *
 *  1. `\p{N}{1,3}`: numbers are cut into groups of at most three digits, left to right;
 *  2. `[\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+`: runs of CJK ideographs
 *     and kana become pieces of their own;
 *  3. a GPT-style word pattern: a punctuation mark glued to the letters after it,
 *     an optional non-letter glued to a word, punctuation runs with their trailing
 *     newlines, newline runs, and whitespace runs (a run before a non-space keeps its
 *     last space for the next word: `\s+(?!\S)`);
 *  4. ByteLevel (without its own regex): the bytes of each piece go to BPE.
 *
 * Every step applies to each piece the previous step produced, *separately*: a
 * regex sees one piece as its whole subject, so a lookahead never looks past the end
 * of a piece.  All split steps use the behaviour "Isolated" here (each match and
 * each gap between matches is a piece); Removed, MergedWithPrevious, MergedWithNext
 * and Contiguous are implemented too, with the Hugging Face semantics.  Empty
 * pieces are dropped.
 *
 * The regexes are compiled with PCRE2_UTF | PCRE2_UCP, so `\s`, `\p{L}`, `\p{N}` are
 * Unicode-aware, as in the Oniguruma engine of the Hugging Face library.
 *
 * Pieces are (offset, length) spans of the encoder's work buffer; a ByteLevel step
 * with add_prefix_space writes a copy " "+piece at the end of the buffer, so the
 * buffer only grows during one encode call.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

mmoe_status tok_normalize(const struct mmoe_tokenizer *tok, const char *s, size_t len, mmoe_text *out)
{
    mmoe_text cur = {0}, next = {0};
    mmoe_status st = mmoe_text_append(&cur, s, len);
    for (size_t k = 0; st == MMOE_OK && k < tok->n_norm; k++) {
        const tok_norm_step *step = &tok->norm[k];
        next.len = 0;
        if (step->kind == TOK_NORM_PREPEND) {
            if (cur.len > 0) {
                st = mmoe_text_append(&next, step->a, step->a_len);
                if (st == MMOE_OK)
                    st = mmoe_text_append(&next, cur.data, cur.len);
            } else {
                st = mmoe_text_append(&next, "", 0);
            }
        } else { /* Replace: every non-overlapping occurrence, left to right */
            size_t i = 0, run = 0;
            st = mmoe_text_append(&next, "", 0);
            while (st == MMOE_OK && step->a_len > 0 && i + step->a_len <= cur.len) {
                if (memcmp(cur.data + i, step->a, step->a_len) == 0) {
                    st = mmoe_text_append(&next, cur.data + run, i - run);
                    if (st == MMOE_OK)
                        st = mmoe_text_append(&next, step->b, step->b_len);
                    i += step->a_len;
                    run = i;
                } else {
                    i++;
                }
            }
            if (st == MMOE_OK)
                st = mmoe_text_append(&next, cur.data + run, cur.len - run);
        }
        mmoe_text swap = cur;
        cur = next;
        next = swap;
    }
    if (st == MMOE_OK)
        st = mmoe_text_append(out, cur.data ? cur.data : "", cur.len);
    mmoe_text_free(&cur);
    mmoe_text_free(&next);
    return st;
}

/** Append a piece (empty pieces are dropped, as in HF). */
static mmoe_status push_piece(tok_pieces *p, size_t off, size_t len)
{
    if (len == 0)
        return MMOE_OK;
    if (tok_grow((void **)&p->v, &p->cap, p->n + 1, sizeof *p->v) != MMOE_OK)
        return MMOE_ENOMEM;
    p->v[p->n].off = off;
    p->v[p->n].len = len;
    p->n++;
    return MMOE_OK;
}

/** One span of a piece with a flag: the regex matched it (1) or it lies between matches (0). */
typedef struct split_span {
    size_t start;  /**< first byte (relative to the piece) */
    size_t end;    /**< one past the last byte */
    int is_match;  /**< 1: the pattern matched it */
} split_span;

/** A growable list of spans. */
typedef struct split_spans {
    split_span *v; /**< the spans */
    size_t n;      /**< in use */
    size_t cap;    /**< allocated */
} split_spans;

/** Append a span. */
static mmoe_status push_span(split_spans *s, size_t start, size_t end, int is_match)
{
    if (tok_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v) != MMOE_OK)
        return MMOE_ENOMEM;
    s->v[s->n].start = start;
    s->v[s->n].end = end;
    s->v[s->n].is_match = is_match;
    s->n++;
    return MMOE_OK;
}

/** Find all non-overlapping matches of @p re in subject[0, len) and list matches and gaps. */
static mmoe_status find_spans(const tok_pre_step *step, tok_work *work, const char *subject, size_t len,
                              split_spans *spans, mmoe_error *err)
{
    size_t prev = 0, pos = 0;
    spans->n = 0;
    while (pos <= len) {
        int rc = pcre2_match(step->re, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, work->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return mmoe_error_set(err, MMOE_EINTERNAL, "tokenizer: pre-tokenizer regex failed on a %zu-byte piece: %s",
                                  len, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(work->md);
        size_t m_start = ov[0], m_end = ov[1];
        if (m_start != prev && push_span(spans, prev, m_start, 0) != MMOE_OK)
            return MMOE_ENOMEM;
        if (m_end > m_start) {
            if (push_span(spans, m_start, m_end, 1) != MMOE_OK)
                return MMOE_ENOMEM;
            pos = m_end;
        } else { /* an empty match is a split point; step over one character */
            if (m_end >= len)
                break;
            size_t clen = 1;
            while (m_end + clen < len && ((unsigned char)subject[m_end + clen] & 0xC0u) == 0x80u)
                clen++;
            pos = m_end + clen;
        }
        prev = m_end;
    }
    if (prev != len && push_span(spans, prev, len, 0) != MMOE_OK)
        return MMOE_ENOMEM;
    return MMOE_OK;
}

/** Apply the split behaviour to the spans of one piece (in place); afterwards every span is a piece. */
static void apply_behavior(tok_split_behavior behavior, int invert, split_spans *s)
{
    size_t n_out = 0;
    int previous_match = 0;
    if (invert)
        for (size_t i = 0; i < s->n; i++)
            s->v[i].is_match = !s->v[i].is_match;
    switch (behavior) {
    case TOK_SPLIT_ISOLATED:
        return;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < s->n; i++)
            if (!s->v[i].is_match)
                s->v[n_out++] = s->v[i];
        break;
    case TOK_SPLIT_MERGED_PREV: /* a match joins the piece before it */
        for (size_t i = 0; i < s->n; i++) {
            if (s->v[i].is_match && !previous_match && n_out > 0)
                s->v[n_out - 1].end = s->v[i].end;
            else
                s->v[n_out++] = s->v[i];
            previous_match = s->v[i].is_match;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: { /* a match joins the piece after it: walk backwards */
        size_t w = s->n;
        for (size_t r = s->n; r-- > 0;) {
            split_span cur = s->v[r];
            if (cur.is_match && !previous_match && w < s->n)
                s->v[w].start = cur.start;
            else
                s->v[--w] = cur;
            previous_match = cur.is_match;
        }
        for (size_t i = w; i < s->n; i++)
            s->v[n_out++] = s->v[i];
        break;
    }
    case TOK_SPLIT_CONTIGUOUS: /* runs of matches (and runs of gaps) become one piece */
        for (size_t i = 0; i < s->n; i++) {
            if (s->v[i].is_match == previous_match && n_out > 0)
                s->v[n_out - 1].end = s->v[i].end;
            else
                s->v[n_out++] = s->v[i];
            previous_match = s->v[i].is_match;
        }
        break;
    }
    s->n = n_out;
}

/**
 * Write " " + piece at the end of @p buf and point the piece there.  The piece's
 * bytes live in @p buf itself, so the buffer is grown first and copied from by offset.
 */
static mmoe_status append_prefixed_copy(mmoe_text *buf, tok_piece *p)
{
    size_t new_off = buf->len, need = buf->len + 1 + p->len + 1;
    if (need > buf->cap) {
        char *grown = realloc(buf->data, 2 * need);
        if (grown == NULL)
            return MMOE_ENOMEM;
        buf->data = grown;
        buf->cap = 2 * need;
    }
    buf->data[new_off] = ' ';
    memmove(buf->data + new_off + 1, buf->data + p->off, p->len);
    buf->len = new_off + 1 + p->len;
    buf->data[buf->len] = '\0';
    p->off = new_off;
    p->len += 1;
    return MMOE_OK;
}

mmoe_status tok_pretokenize(const struct mmoe_tokenizer *tok, tok_work *work, size_t off, size_t len,
                            mmoe_error *err)
{
    split_spans spans = {0};
    mmoe_status st = MMOE_OK;
    work->a.n = 0;
    st = push_piece(&work->a, off, len);
    for (size_t k = 0; st == MMOE_OK && k < tok->n_pre; k++) {
        const tok_pre_step *step = &tok->pre[k];
        if (step->kind == TOK_PRE_BYTELEVEL) {
            if (!step->add_prefix_space)
                continue;
            for (size_t i = 0; st == MMOE_OK && i < work->a.n; i++) {
                tok_piece *p = &work->a.v[i];
                if (work->buf.data[p->off] == ' ')
                    continue;
                st = append_prefixed_copy(&work->buf, p);
            }
            continue;
        }
        work->b.n = 0;
        for (size_t i = 0; st == MMOE_OK && i < work->a.n; i++) {
            tok_piece p = work->a.v[i];
            st = find_spans(step, work, work->buf.data + p.off, p.len, &spans, err);
            if (st != MMOE_OK)
                break;
            apply_behavior(step->behavior, step->invert, &spans);
            for (size_t j = 0; st == MMOE_OK && j < spans.n; j++)
                st = push_piece(&work->b, p.off + spans.v[j].start, spans.v[j].end - spans.v[j].start);
        }
        tok_pieces swap = work->a;
        work->a = work->b;
        work->b = swap;
    }
    free(spans.v);
    if (st == MMOE_ENOMEM)
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory while pre-tokenizing");
    return st;
}
