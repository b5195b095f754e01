/**
 * @file tok_maps.c
 * @brief The two lookup tables of the BPE model: string -> id and (id, id) -> merge.
 *
 * Both are open-addressing hash tables with linear probing and a power-of-two
 * capacity at least twice the number of entries, so a lookup touches one or two
 * slots on average.  The vocabulary table stores only ids; the strings stay in the
 * tokenizer's pool and are compared there.  The merge table keys a pair of ids as one
 * 64-bit word (left << 32 | right), plus one so that 0 can mark an empty slot.
 * The hash of a string is 64-bit FNV-1a; the hash of a pair is a splitmix64 finalizer.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

uint64_t tok_hash_bytes(const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/** splitmix64 finalizer: spreads a pair key over all bits. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/** Smallest power of two >= 16 and > 2 n. */
static size_t capacity_for(size_t n_entries)
{
    size_t cap = 16;
    while (cap < 2 * n_entries + 1)
        cap *= 2;
    return cap;
}

mmoe_status tok_strmap_init(tok_strmap *m, size_t n_entries)
{
    size_t cap = capacity_for(n_entries);
    m->slot = malloc(cap * sizeof *m->slot);
    if (m->slot == NULL)
        return MMOE_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        m->slot[i] = -1;
    m->mask = cap - 1;
    return MMOE_OK;
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slot);
    m->slot = NULL;
}

/** Nonzero when id's model-vocabulary string equals @p s. */
static int token_equals(const struct mmoe_tokenizer *tok, int32_t id, const char *s, size_t len)
{
    return tok->voc_len[id] == len && memcmp(tok->pool + tok->voc_off[id], s, len) == 0;
}

int32_t tok_strmap_insert(tok_strmap *m, const struct mmoe_tokenizer *tok, int32_t id)
{
    const char *s = tok->pool + tok->voc_off[id];
    size_t len = tok->voc_len[id];
    size_t i = (size_t)tok_hash_bytes(s, len) & m->mask;
    while (m->slot[i] >= 0) {
        if (token_equals(tok, m->slot[i], s, len))
            return m->slot[i];
        i = (i + 1) & m->mask;
    }
    m->slot[i] = id;
    return -1;
}

int32_t tok_strmap_find(const tok_strmap *m, const struct mmoe_tokenizer *tok, const char *s, size_t len)
{
    if (m->slot == NULL)
        return -1;
    size_t i = (size_t)tok_hash_bytes(s, len) & m->mask;
    while (m->slot[i] >= 0) {
        if (token_equals(tok, m->slot[i], s, len))
            return m->slot[i];
        i = (i + 1) & m->mask;
    }
    return -1;
}

mmoe_status tok_pairmap_init(tok_pairmap *m, size_t n_entries)
{
    size_t cap = capacity_for(n_entries);
    m->key = calloc(cap, sizeof *m->key);
    m->value = malloc(cap * sizeof *m->value);
    if (m->key == NULL || m->value == NULL) {
        tok_pairmap_free(m);
        return MMOE_ENOMEM;
    }
    m->mask = cap - 1;
    m->n = 0;
    return MMOE_OK;
}

void tok_pairmap_free(tok_pairmap *m)
{
    free(m->key);
    free(m->value);
    m->key = NULL;
    m->value = NULL;
}

/** The table key of a pair: (left << 32 | right) + 1, never 0. */
static uint64_t pair_key(int32_t left, int32_t right)
{
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1u;
}

int tok_pairmap_insert(tok_pairmap *m, int32_t left, int32_t right, tok_merge merge)
{
    uint64_t key = pair_key(left, right);
    size_t i = (size_t)mix64(key) & m->mask;
    while (m->key[i] != 0) {
        if (m->key[i] == key) {
            m->value[i] = merge; /* a repeated pair: the later line wins, as in a hash map built in order */
            return 1;
        }
        i = (i + 1) & m->mask;
    }
    m->key[i] = key;
    m->value[i] = merge;
    m->n++;
    return 0;
}

const tok_merge *tok_pairmap_find(const tok_pairmap *m, int32_t left, int32_t right)
{
    if (m->key == NULL)
        return NULL;
    uint64_t key = pair_key(left, right);
    size_t i = (size_t)mix64(key) & m->mask;
    while (m->key[i] != 0) {
        if (m->key[i] == key)
            return &m->value[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}
