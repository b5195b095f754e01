/**
 * @file tok_added.c
 * @brief Added tokens: cutting exact strings (`<｜User｜>`, `<think>`) out of the text before BPE.
 *
 * The `added_tokens` of tokenizer.json are whole strings that must become one id
 * each, wherever they occur, instead of being split by the pre-tokenizer and
 * merged by BPE.  The matching rule is the Hugging Face one (an Aho-Corasick
 * automaton in *leftmost-longest* mode): scanning left to right, the first
 * position where any token starts wins, and of the tokens starting there the
 * longest wins; scanning resumes after it.  Here the tokens sit in a byte trie and
 * the scan walks the trie from every start position: O(text × depth), and the
 * walk stops at the first byte that no token continues with, so ordinary text
 * costs one or two node visits per byte.
 *
 * `lstrip` / `rstrip` let a token swallow the Unicode whitespace to its left /
 * right (never into the previous match).  `single_word` is rejected at load time.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/** Append a fresh node for edge byte @p byte; its index goes to @p index. */
static mmoe_status trie_new_node(tok_trie *t, unsigned char byte, int32_t *index)
{
    if (tok_grow((void **)&t->node, &t->cap, t->n + 1, sizeof *t->node) != MMOE_OK)
        return MMOE_ENOMEM;
    tok_trie_node *nd = &t->node[t->n];
    nd->first_child = nd->next_sibling = nd->token = -1;
    nd->byte = byte;
    *index = (int32_t)t->n++;
    return MMOE_OK;
}

mmoe_status tok_trie_insert(tok_trie *t, const char *s, size_t len, int32_t token)
{
    int32_t cur;
    if (t->n == 0 && trie_new_node(t, 0, &cur) != MMOE_OK)
        return MMOE_ENOMEM;
    cur = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t child = t->node[cur].first_child;
        while (child >= 0 && t->node[child].byte != b)
            child = t->node[child].next_sibling;
        if (child < 0) {
            if (trie_new_node(t, b, &child) != MMOE_OK)
                return MMOE_ENOMEM;
            t->node[child].next_sibling = t->node[cur].first_child;
            t->node[cur].first_child = child;
        }
        cur = child;
    }
    if (t->node[cur].token < 0) /* the first token with this string wins, as in HF */
        t->node[cur].token = token;
    return MMOE_OK;
}

void tok_trie_free(tok_trie *t)
{
    free(t->node);
    t->node = NULL;
    t->n = t->cap = 0;
}

/** Longest token starting at text[pos] (within [pos, end)): its added index, or -1; writes its length. */
static int32_t trie_longest(const tok_trie *t, const char *text, size_t pos, size_t end, size_t *match_len)
{
    int32_t best = -1, cur = 0;
    for (size_t i = pos; i < end; i++) {
        unsigned char b = (unsigned char)text[i];
        int32_t child = t->node[cur].first_child;
        while (child >= 0 && t->node[child].byte != b)
            child = t->node[child].next_sibling;
        if (child < 0)
            break;
        cur = child;
        if (t->node[cur].token >= 0) {
            best = t->node[cur].token;
            *match_len = i + 1 - pos;
        }
    }
    return best;
}

/** Unicode White_Space (what Rust's char::is_whitespace tests). */
static int cp_is_white_space(uint32_t cp)
{
    return (cp >= 0x09u && cp <= 0x0Du) || cp == 0x20u || cp == 0x85u || cp == 0xA0u || cp == 0x1680u ||
           (cp >= 0x2000u && cp <= 0x200Au) || cp == 0x2028u || cp == 0x2029u || cp == 0x202Fu ||
           cp == 0x205Fu || cp == 0x3000u;
}

/** Start of the whitespace run that ends at @p pos (not before @p floor). */
static size_t strip_left(const char *text, size_t floor, size_t pos)
{
    while (pos > floor) {
        size_t start = pos - 1;
        while (start > floor && ((unsigned char)text[start] & 0xC0u) == 0x80u)
            start--;
        size_t len;
        uint32_t cp;
        if (tok_utf8_next((const unsigned char *)text + start, pos - start, &len, &cp) != TOK_UTF8_VALID ||
            !cp_is_white_space(cp))
            break;
        pos = start;
    }
    return pos;
}

/** End of the whitespace run that starts at @p pos (not after @p end). */
static size_t strip_right(const char *text, size_t pos, size_t end)
{
    while (pos < end) {
        size_t len;
        uint32_t cp;
        if (tok_utf8_next((const unsigned char *)text + pos, end - pos, &len, &cp) != TOK_UTF8_VALID ||
            !cp_is_white_space(cp))
            break;
        pos += len;
    }
    return pos;
}

/** Append a segment (empty text spans are skipped). */
static mmoe_status push_segment(tok_segments *out, int32_t token, size_t off, size_t len)
{
    if (token < 0 && len == 0)
        return MMOE_OK;
    if (tok_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) != MMOE_OK)
        return MMOE_ENOMEM;
    out->v[out->n].token = token;
    out->v[out->n].off = off;
    out->v[out->n].len = len;
    out->n++;
    return MMOE_OK;
}

mmoe_status tok_added_split(const struct mmoe_tokenizer *tok, const tok_trie *trie, const char *text,
                            size_t off, size_t len, tok_segments *out)
{
    size_t end = off + len, text_start = off, pos = off;
    if (trie->n == 0)
        return push_segment(out, -1, off, len);
    while (pos < end) {
        size_t mlen = 0;
        int32_t a = trie_longest(trie, text, pos, end, &mlen);
        if (a < 0) {
            pos++;
            continue;
        }
        const tok_added *added = &tok->added[a];
        size_t m_start = pos, m_end = pos + mlen;
        if (added->lstrip)
            m_start = strip_left(text, text_start, m_start);
        if (added->rstrip)
            m_end = strip_right(text, m_end, end);
        if (push_segment(out, -1, text_start, m_start - text_start) != MMOE_OK ||
            push_segment(out, added->id, m_start, m_end - m_start) != MMOE_OK)
            return MMOE_ENOMEM;
        pos = text_start = m_end;
    }
    return push_segment(out, -1, text_start, end - text_start);
}
