/**
 * @file tok_bpe.c
 * @brief The BPE merge loop: from one symbol per byte to the final tokens of a piece.
 *
 * A piece starts as a row of symbols, one per byte (byte-level tokenizers) or per
 * character, each a vocabulary id.  `merges` is a ranked list of pairs; a pair
 * (left, right) with rank r may be replaced by the token left+right.  The rule
 * (Hugging Face's, which the model was trained with) is:
 *
 *     repeat: among all adjacent pairs that have a merge, take the one with the
 *             lowest rank, the leftmost one on ties, and merge it;
 *     until no adjacent pair has a merge.
 *
 * Done naively that is O(n²) per piece.  Here the symbols form a doubly linked list
 * (arrays `prev`/`next` over positions) and the candidate pairs sit in a binary
 * min-heap keyed by (rank, position of the left symbol).  Merging the pair at
 * position i writes the merged id into i, unlinks i's right neighbour, and pushes
 * the (at most two) new pairs (prev(i), i) and (i, next(i)).  A heap entry can go
 * stale when one of its symbols was merged away; it is recognised when popped: the
 * left symbol is dead, has no right neighbour, or the current pair no longer merges
 * to the entry's id, and is skipped.  Total cost O(n log n) per piece, which keeps
 * long runs (a page of CJK text is one piece) fast.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

/** A candidate merge in the heap. */
typedef struct bpe_cand {
    int32_t rank;   /**< merge rank (lower first) */
    int32_t pos;    /**< position of the left symbol (lower first on equal rank) */
    int32_t new_id; /**< the token the merge produces (to detect stale entries) */
} bpe_cand;

/** Heap order: lower rank first, then lower position. */
static int cand_less(const bpe_cand *a, const bpe_cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

/** Insert a candidate into the min-heap of @p n entries (sift up). */
static void heap_push(bpe_cand *h, size_t *n, bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &h[parent]))
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

/** Remove and return the smallest candidate (sift down). */
static bpe_cand heap_pop(bpe_cand *h, size_t *n)
{
    bpe_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n)
            break;
        if (child + 1 < *n && cand_less(&h[child + 1], &h[child]))
            child++;
        if (!cand_less(&h[child], &last))
            break;
        h[i] = h[child];
        i = child;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/** Grow the BPE arrays for a piece of @p n_sym initial symbols. */
static mmoe_status reserve_work(tok_work *w, size_t n_sym)
{
    if (n_sym > w->sym_cap) {
        size_t cap = w->sym_cap ? w->sym_cap : 64;
        while (cap < n_sym)
            cap *= 2;
        int32_t *sym = realloc(w->sym, cap * sizeof *sym);
        if (sym != NULL)
            w->sym = sym;
        int32_t *prev = realloc(w->prev, cap * sizeof *prev);
        if (prev != NULL)
            w->prev = prev;
        int32_t *next = realloc(w->next, cap * sizeof *next);
        if (next != NULL)
            w->next = next;
        if (sym == NULL || prev == NULL || next == NULL)
            return MMOE_ENOMEM;
        w->sym_cap = cap;
    }
    /* every merge pushes at most two candidates, plus the n-1 initial ones */
    size_t heap_need = 3 * n_sym + 1;
    if (heap_need > w->heap_cap) {
        bpe_cand *heap = realloc(w->heap, heap_need * sizeof *heap);
        if (heap == NULL)
            return MMOE_ENOMEM;
        w->heap = heap;
        w->heap_cap = heap_need;
    }
    return MMOE_OK;
}

/** Fill w->sym with the initial symbols of the piece; returns their count or an error. */
static mmoe_status initial_symbols(const struct mmoe_tokenizer *tok, tok_work *w, const char *s, size_t len,
                                   size_t *n_sym, mmoe_error *err)
{
    size_t n = 0;
    if (tok->byte_level) {
        for (size_t i = 0; i < len; i++) {
            unsigned char b = (unsigned char)s[i];
            int32_t id = tok->byte_sym[b] >= 0 ? tok->byte_sym[b] : tok->unk_id;
            if (id < 0)
                return mmoe_error_set(err, MMOE_EFORMAT,
                                      "tokenizer %s: byte 0x%02X has no byte-level token in model.vocab and there is "
                                      "no unk_token", tok->name, b);
            w->sym[n++] = id;
        }
    } else {
        size_t i = 0;
        while (i < len) {
            size_t clen;
            if (tok_utf8_next((const unsigned char *)s + i, len - i, &clen, NULL) != TOK_UTF8_VALID)
                clen = 1;
            int32_t id = tok_strmap_find(&tok->vocab, tok, s + i, clen);
            if (id < 0)
                id = tok->unk_id;
            if (id < 0)
                return mmoe_error_set(err, MMOE_EFORMAT,
                                      "tokenizer %s: character '%.*s' (at byte %zu of a piece) is not in model.vocab "
                                      "and there is no unk_token", tok->name, (int)clen, s + i, i);
            w->sym[n++] = id;
            i += clen;
        }
    }
    *n_sym = n;
    return MMOE_OK;
}

/** ignore_merges: the vocabulary id of the whole piece (byte-level mapped if needed), or -1. */
static int32_t whole_piece_id(const struct mmoe_tokenizer *tok, const char *s, size_t len)
{
    if (!tok->byte_level)
        return tok_strmap_find(&tok->vocab, tok, s, len);
    uint32_t table[256];
    tok_bytelevel_table(table);
    char *mapped = malloc(2 * len + 1);
    if (mapped == NULL)
        return -1;
    size_t m = 0;
    for (size_t i = 0; i < len; i++)
        m += tok_utf8_put(table[(unsigned char)s[i]], mapped + m);
    int32_t id = tok_strmap_find(&tok->vocab, tok, mapped, m);
    free(mapped);
    return id;
}

/** Push the pair starting at @p left_pos if it has a merge. */
static void push_pair(const struct mmoe_tokenizer *tok, tok_work *w, size_t *n_heap, int32_t left_pos)
{
    int32_t right_pos = w->next[left_pos];
    if (left_pos < 0 || right_pos < 0)
        return;
    const tok_merge *m = tok_pairmap_find(&tok->merges, w->sym[left_pos], w->sym[right_pos]);
    if (m == NULL)
        return;
    bpe_cand c = {m->rank, left_pos, m->new_id};
    heap_push((bpe_cand *)w->heap, n_heap, c);
}

mmoe_status tok_bpe_piece(const struct mmoe_tokenizer *tok, tok_work *w, const char *s, size_t len,
                          mmoe_token_ids *out, mmoe_error *err)
{
    if (len == 0)
        return MMOE_OK;
    if (tok->ignore_merges) {
        int32_t id = whole_piece_id(tok, s, len);
        if (id >= 0)
            return mmoe_token_ids_push(out, &id, 1);
    }
    if (reserve_work(w, len) != MMOE_OK)
        return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory in BPE (piece of %zu bytes)", len);
    size_t n_sym = 0;
    mmoe_status st = initial_symbols(tok, w, s, len, &n_sym, err);
    if (st != MMOE_OK)
        return st;
    for (size_t i = 0; i < n_sym; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < n_sym ? (int32_t)i + 1 : -1;
    }
    size_t n_heap = 0;
    for (size_t i = 0; i + 1 < n_sym; i++)
        push_pair(tok, w, &n_heap, (int32_t)i);
    bpe_cand *heap = (bpe_cand *)w->heap;
    while (n_heap > 0) {
        bpe_cand c = heap_pop(heap, &n_heap);
        int32_t left = c.pos, right = w->next[left];
        if (w->sym[left] < 0 || right < 0)
            continue; /* stale: the left symbol was merged away or has no neighbour now */
        const tok_merge *m = tok_pairmap_find(&tok->merges, w->sym[left], w->sym[right]);
        if (m == NULL || m->new_id != c.new_id)
            continue; /* stale: the pair at this position changed */
        w->sym[left] = c.new_id;
        w->sym[right] = -1;
        w->next[left] = w->next[right];
        if (w->next[right] >= 0)
            w->prev[w->next[right]] = left;
        if (w->prev[left] >= 0)
            push_pair(tok, w, &n_heap, w->prev[left]);
        push_pair(tok, w, &n_heap, left);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i])
        if (mmoe_token_ids_push(out, &w->sym[i], 1) != MMOE_OK)
            return mmoe_error_set(err, MMOE_ENOMEM, "tokenizer: out of memory");
    return MMOE_OK;
}
