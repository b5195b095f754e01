/**
 * @file tok_internal.h
 * @brief The tokenizer's internal data structures, shared by the tok_*.c files.
 *
 * Layout of a loaded tokenizer:
 * - every token string (model vocabulary and added tokens) lives in one pool,
 *   `pool`; token id i has `tok_off[i]`, `tok_len[i]` (len UINT32_MAX: no token);
 * - `dec_off`/`dec_len` hold each token's *decoded bytes* (after the ByteLevel
 *   decoder), computed once at load time so decoding is a table lookup;
 * - `vocab` maps a model-vocabulary string to its id, `merges` maps a pair of
 *   ids to (rank, merged id): both are open-addressing hash tables;
 * - the added tokens sit in two byte tries (raw and normalized matching);
 * - the normalizer and the pre-tokenizer are flat lists of steps.
 */
#ifndef MMOE_TOK_INTERNAL_H
#define MMOE_TOK_INTERNAL_H

/** PCRE2 works on 8-bit code units (UTF-8). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_tokenizer.h"
#include "mmoe_utf8.h"

/* ------------------------------------------------------------------ UTF-8 (mmoe_utf8.h, tok_utf8.c) */

/**
 * Make room for at least @p need elements of @p elem_size bytes in the array *@p v of
 * capacity *@p cap (doubling, starting at 16).  MMOE_ENOMEM leaves the array unchanged.
 */
mmoe_status tok_grow(void **v, size_t *cap, size_t need, size_t elem_size);
/** Append @p n bytes to @p out, replacing invalid UTF-8 by U+FFFD (Rust's from_utf8_lossy rule). */
mmoe_status tok_utf8_append_lossy(mmoe_text *out, const unsigned char *p, size_t n);

/* ------------------------------------------------------------------ byte-level table (tok_bytelevel.c) */

/** GPT-2's byte -> code point table (printable stand-ins for every byte). */
void tok_bytelevel_table(uint32_t byte_to_cp[256]);
/**
 * Map a UTF-8 token string back through the byte-level table.  When every character
 * is a byte stand-in, writes the bytes to @p out (at most @p len bytes) and returns
 * their count; otherwise returns SIZE_MAX (the token is then decoded as its raw text).
 */
size_t tok_bytelevel_unmap(const char *s, size_t len, unsigned char *out);

/* ------------------------------------------------------------------ hash tables (tok_maps.c) */

/** String -> id table over the tokenizer's pool. */
typedef struct tok_strmap {
    int32_t *slot;  /**< token id per slot, -1 when empty */
    size_t mask;    /**< capacity - 1 (capacity is a power of two) */
} tok_strmap;

/** One merge: the rank (priority; lower first) and the id of the merged token. */
typedef struct tok_merge {
    int32_t rank;   /**< line number in `merges` */
    int32_t new_id; /**< id of the concatenation */
} tok_merge;

/** (left id, right id) -> merge table. */
typedef struct tok_pairmap {
    uint64_t *key;     /**< (left << 32 | right) + 1; 0 = empty */
    tok_merge *value;  /**< the merge per slot */
    size_t mask;       /**< capacity - 1 */
    size_t n;          /**< entries */
} tok_pairmap;

/** 64-bit FNV-1a hash of @p len bytes. */
uint64_t tok_hash_bytes(const char *s, size_t len);
/** Allocate an empty table for up to @p n_entries ids. */
mmoe_status tok_strmap_init(tok_strmap *m, size_t n_entries);
/** Free the table. */
void tok_strmap_free(tok_strmap *m);
struct mmoe_tokenizer;
/** Insert id (its string is in tok's pool); returns the id already there for the same string, or -1. */
int32_t tok_strmap_insert(tok_strmap *m, const struct mmoe_tokenizer *tok, int32_t id);
/** The id of the model-vocabulary string @p s, or -1. */
int32_t tok_strmap_find(const tok_strmap *m, const struct mmoe_tokenizer *tok, const char *s, size_t len);
/** Allocate an empty merge table for up to @p n_entries pairs. */
mmoe_status tok_pairmap_init(tok_pairmap *m, size_t n_entries);
/** Free the merge table. */
void tok_pairmap_free(tok_pairmap *m);
/** Insert a merge; returns 0, or 1 when the pair was already present (its merge is replaced). */
int tok_pairmap_insert(tok_pairmap *m, int32_t left, int32_t right, tok_merge merge);
/** The merge of the pair (left, right), or NULL when the pair does not merge. */
const tok_merge *tok_pairmap_find(const tok_pairmap *m, int32_t left, int32_t right);

/* ------------------------------------------------------------------ added tokens (tok_added.c) */

/** One node of a byte trie. */
typedef struct tok_trie_node {
    int32_t first_child;  /**< index of the first child, -1 if none */
    int32_t next_sibling; /**< index of the next sibling, -1 if none */
    int32_t token;        /**< index into tok->added when a token ends here, else -1 */
    unsigned char byte;   /**< the byte on the edge into this node */
} tok_trie_node;

/** A byte trie over added-token strings (node 0 is the root). */
typedef struct tok_trie {
    tok_trie_node *node; /**< the nodes */
    size_t n;            /**< nodes in use */
    size_t cap;          /**< allocated nodes */
} tok_trie;

/** An added token (`added_tokens` entry). */
typedef struct tok_added {
    int32_t id;                 /**< the token id */
    uint32_t off;               /**< content: offset in the pool */
    uint32_t len;               /**< content: length in bytes */
    unsigned char special;      /**< "special": skipped by decode with skip_special */
    unsigned char normalized;   /**< "normalized": matched after the normalizer */
    unsigned char lstrip;       /**< swallows whitespace on its left */
    unsigned char rstrip;       /**< swallows whitespace on its right */
} tok_added;

/** A span of text produced by splitting on added tokens: token >= 0, or text [off, off+len). */
typedef struct tok_segment {
    int32_t token;  /**< token id, or -1 for a text span */
    size_t off;     /**< span start (bytes) */
    size_t len;     /**< span length (bytes) */
} tok_segment;

/** A growable list of segments. */
typedef struct tok_segments {
    tok_segment *v; /**< the segments */
    size_t n;       /**< in use */
    size_t cap;     /**< allocated */
} tok_segments;

/** Add string @p s to the trie, ending in token index @p token (the first insert of a string wins). */
mmoe_status tok_trie_insert(tok_trie *t, const char *s, size_t len, int32_t token);
/** Free the trie's nodes. */
void tok_trie_free(tok_trie *t);
/**
 * Split text[off, off+len) on the tokens of @p trie (leftmost-longest), appending
 * segments to @p out.  Offsets are relative to @p text.
 */
mmoe_status tok_added_split(const struct mmoe_tokenizer *tok, const tok_trie *trie, const char *text,
                            size_t off, size_t len, tok_segments *out);

/* ------------------------------------------------------------------ normalizer and pre-tokenizer */

/** Normalizer step kinds. */
typedef enum tok_norm_kind {
    TOK_NORM_PREPEND, /**< prefix non-empty text with a string */
    TOK_NORM_REPLACE  /**< replace every occurrence of a string */
} tok_norm_kind;

/** One normalizer step. */
typedef struct tok_norm_step {
    tok_norm_kind kind; /**< what the step does */
    char *a;            /**< Prepend: the prefix; Replace: the pattern string */
    size_t a_len;       /**< length of a */
    char *b;            /**< Replace: the replacement */
    size_t b_len;       /**< length of b */
} tok_norm_step;

/** What a Split step does with the matches of its pattern (HF "behavior"). */
typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,     /**< matches are dropped */
    TOK_SPLIT_ISOLATED,    /**< each match is a piece of its own */
    TOK_SPLIT_MERGED_PREV, /**< a match joins the piece before it */
    TOK_SPLIT_MERGED_NEXT, /**< a match joins the piece after it */
    TOK_SPLIT_CONTIGUOUS   /**< runs of adjacent matches become one piece */
} tok_split_behavior;

/** Pre-tokenizer step kinds. */
typedef enum tok_pre_kind {
    TOK_PRE_SPLIT,    /**< a regex split */
    TOK_PRE_BYTELEVEL /**< the ByteLevel step (prefix space; bytes go to BPE) */
} tok_pre_kind;

/** One pre-tokenizer step (Digits and the ByteLevel regex are compiled to Split steps). */
typedef struct tok_pre_step {
    tok_pre_kind kind;           /**< what the step does */
    pcre2_code *re;              /**< Split: the compiled pattern */
    tok_split_behavior behavior; /**< Split */
    int invert;                  /**< Split: the pattern marks the pieces to keep, not the delimiters */
    int add_prefix_space;        /**< ByteLevel */
} tok_pre_step;

/** A piece of text in the encoder's work buffer. */
typedef struct tok_piece {
    size_t off; /**< start in the work buffer */
    size_t len; /**< length in bytes */
} tok_piece;

/** A growable list of pieces. */
typedef struct tok_pieces {
    tok_piece *v; /**< the pieces */
    size_t n;     /**< in use */
    size_t cap;   /**< allocated */
} tok_pieces;

/** Per-call scratch of the encoder (nothing in it outlives one encode call). */
typedef struct tok_work {
    mmoe_text buf;          /**< normalized text and prefixed copies of pieces */
    tok_pieces a;           /**< pieces: the pre-tokenizer's current (and final) list */
    tok_pieces b;           /**< pieces: the list being built by the current step */
    pcre2_match_data *md;   /**< PCRE2 match data */
    int32_t *sym;           /**< BPE: symbol ids (-1: merged away) */
    int32_t *prev;          /**< BPE: previous live symbol, -1 at the start */
    int32_t *next;          /**< BPE: next live symbol, -1 at the end */
    void *heap;             /**< BPE: priority queue entries */
    size_t sym_cap;         /**< allocated symbols */
    size_t heap_cap;        /**< allocated heap entries */
} tok_work;

/** Apply the normalizer steps to @p s and append the result to @p out. */
mmoe_status tok_normalize(const struct mmoe_tokenizer *tok, const char *s, size_t len, mmoe_text *out);
/** Pre-tokenize work->buf[off, off+len) into work->a (the final list). */
mmoe_status tok_pretokenize(const struct mmoe_tokenizer *tok, tok_work *work, size_t off, size_t len,
                            mmoe_error *err);
/** BPE-encode one piece (bytes s[0..len)) and append its ids. */
mmoe_status tok_bpe_piece(const struct mmoe_tokenizer *tok, tok_work *work, const char *s, size_t len,
                          mmoe_token_ids *out, mmoe_error *err);

/* ------------------------------------------------------------------ the tokenizer */

/** A loaded tokenizer (see the layout at the top of this file). */
struct mmoe_tokenizer {
    char *name;                /**< file name for messages */
    char *pool;                /**< all token strings */
    size_t pool_len;           /**< bytes used in the pool */
    int32_t n_ids;             /**< max id + 1 */
    uint32_t *tok_off;         /**< per id: its string in the pool (added tokens override) */
    uint32_t *tok_len;         /**< per id: its string's length (UINT32_MAX: no token) */
    uint32_t *voc_off;         /**< per id: the model-vocabulary string (what `vocab` hashes) */
    uint32_t *voc_len;         /**< per id: its length (UINT32_MAX: not in the model vocabulary) */
    unsigned char *is_special; /**< per id: added token with special = true */
    unsigned char *dec;        /**< decoded bytes of all tokens */
    uint32_t *dec_off;         /**< per id: its decoded bytes in `dec` */
    uint32_t *dec_len;         /**< per id: their length */
    tok_strmap vocab;          /**< model vocabulary string -> id */
    tok_pairmap merges;        /**< (left, right) -> (rank, merged id) */
    int32_t unk_id;            /**< model.unk_token id, -1 if none */
    int ignore_merges;         /**< model.ignore_merges: a whole piece found in the vocab is one token */
    int byte_level;            /**< the pre-tokenizer has a ByteLevel step: pieces are mapped byte-wise */
    int32_t byte_sym[256];     /**< byte-level: vocab id of each byte's stand-in (-1 if absent) */
    int decoder_byte_level;    /**< decoder is ByteLevel (the only decoder supported) */
    int post_adds_tokens;      /**< the post-processor would add special tokens (not supported) */
    tok_added *added;          /**< the added tokens, in file order */
    size_t n_added;            /**< how many */
    tok_trie trie_raw;         /**< added tokens matched on the raw text */
    tok_trie trie_norm;        /**< added tokens matched on the normalized text */
    tok_norm_step *norm;       /**< normalizer steps, in order */
    size_t n_norm;             /**< how many */
    tok_pre_step *pre;         /**< pre-tokenizer steps, in order */
    size_t n_pre;              /**< how many */
};

#endif /* MMOE_TOK_INTERNAL_H */
