/**
 * @file stop_strings.c
 * @brief The stop-string matcher (see mmoe_stop_strings.h).
 *
 * After each push the held text is searched for every stop string (memmem); with no match,
 * the held tail kept back is the longest suffix that is a proper prefix of a stop string,
 * found by trying each suffix length from the longest possible down.  Both scans are
 * bounded by the held length, which is at most (longest stop string - 1) + the pushed text.
 */
#include <string.h>

#include "mmoe_stop_strings.h"

void mmoe_stop_init(mmoe_stop_matcher *m, const char *const *stops, size_t n_stops)
{
    memset(m, 0, sizeof *m);
    m->stops = stops;
    m->n_stops = n_stops;
}

void mmoe_stop_free(mmoe_stop_matcher *m)
{
    mmoe_text_free(&m->held);
}

/**
 * Offset of the stop string that ends first in the held text (the longer when two end at
 * the same byte), or -1.  The first occurrence of a string is also the one that ends first.
 */
static long earliest_match(const mmoe_stop_matcher *m)
{
    long best = -1;
    size_t best_len = 0;
    for (size_t i = 0; i < m->n_stops; i++) {
        size_t n = strlen(m->stops[i]);
        const char *hit = n > 0 ? memmem(m->held.data, m->held.len, m->stops[i], n) : NULL;
        if (hit == NULL)
            continue;
        long at = (long)(hit - m->held.data);
        if (best < 0 || at + (long)n < best + (long)best_len || (at + (long)n == best + (long)best_len && n > best_len)) {
            best = at;
            best_len = n;
        }
    }
    return best;
}

/** Length of the longest suffix of the held text that is a proper prefix of a stop string. */
static size_t prefix_tail(const mmoe_stop_matcher *m)
{
    size_t best = 0;
    for (size_t i = 0; i < m->n_stops; i++) {
        size_t n = strlen(m->stops[i]);
        size_t most = n - 1 < m->held.len ? n - 1 : m->held.len;
        for (size_t k = most; k > best; k--)
            if (memcmp(m->held.data + m->held.len - k, m->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/** Release the first @p n held bytes to @p out and keep the rest. */
static mmoe_status release(mmoe_stop_matcher *m, size_t n, mmoe_text *out)
{
    if (n > 0 && mmoe_text_append(out, m->held.data, n) != MMOE_OK)
        return MMOE_ENOMEM;
    if (m->held.data == NULL) /* nothing was ever held (an answer of no tokens) */
        return MMOE_OK;
    memmove(m->held.data, m->held.data + n, m->held.len - n);
    m->held.len -= n;
    m->held.data[m->held.len] = '\0';
    return MMOE_OK;
}

mmoe_status mmoe_stop_push(mmoe_stop_matcher *m, const char *text, size_t len, mmoe_text *out, int *matched)
{
    if (m->matched || len == 0)
        return MMOE_OK;
    if (mmoe_text_append(&m->held, text, len) != MMOE_OK)
        return MMOE_ENOMEM;
    long at = earliest_match(m);
    if (at >= 0) {
        m->matched = 1;
        *matched = 1;
        mmoe_status st = release(m, (size_t)at, out);
        m->held.len = 0;
        return st;
    }
    return release(m, m->held.len - prefix_tail(m), out);
}

mmoe_status mmoe_stop_finish(mmoe_stop_matcher *m, mmoe_text *out)
{
    if (m->matched)
        return MMOE_OK;
    return release(m, m->held.len, out);
}
