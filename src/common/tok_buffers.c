/**
 * @file tok_buffers.c
 * @brief The growable id array and byte string that the tokenizer API fills.
 *
 * Both grow geometrically (doubling), so appending n items costs O(n) in total.
 * An ::mmoe_text is kept NUL-terminated whenever it holds a buffer, so that a
 * caller can print it with printf("%s") when it knows the text has no NUL bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

mmoe_status mmoe_token_ids_push(mmoe_token_ids *ids, const int32_t *v, size_t n)
{
    if (ids->n + n > ids->cap) {
        size_t cap = ids->cap ? ids->cap : 64;
        while (cap < ids->n + n)
            cap *= 2;
        int32_t *grown = realloc(ids->ids, cap * sizeof *grown);
        if (grown == NULL)
            return MMOE_ENOMEM;
        ids->ids = grown;
        ids->cap = cap;
    }
    if (n > 0)
        memcpy(ids->ids + ids->n, v, n * sizeof *v);
    ids->n += n;
    return MMOE_OK;
}

void mmoe_token_ids_free(mmoe_token_ids *ids)
{
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

mmoe_status mmoe_text_append(mmoe_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *grown = realloc(t->data, cap);
        if (grown == NULL)
            return MMOE_ENOMEM;
        t->data = grown;
        t->cap = cap;
    }
    if (n > 0)
        memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
    return MMOE_OK;
}

void mmoe_text_free(mmoe_text *t)
{
    free(t->data);
    t->data = NULL;
    t->len = t->cap = 0;
}

mmoe_status tok_grow(void **v, size_t *cap, size_t need, size_t elem_size)
{
    if (need <= *cap)
        return MMOE_OK;
    size_t new_cap = *cap ? *cap : 16;
    while (new_cap < need)
        new_cap *= 2;
    void *grown = realloc(*v, new_cap * elem_size);
    if (grown == NULL)
        return MMOE_ENOMEM;
    *v = grown;
    *cap = new_cap;
    return MMOE_OK;
}
