/**
 * @file mmoe_utf8.c
 * @brief A table-free UTF-8 validator.
 *
 * The lead byte says how many continuation bytes (10xxxxxx) follow:
 *
 *     0xxxxxxx                      U+0000..U+007F   (ASCII)
 *     110xxxxx 10xxxxxx             U+0080..U+07FF   (lead C2..DF; C0, C1 would be overlong)
 *     1110xxxx 10xxxxxx 10xxxxxx    U+0800..U+FFFF   (minus the surrogates D800..DFFF)
 *     11110xxx 10xxxxxx x 3         U+10000..U+10FFFF (lead F0..F4)
 *
 * Overlong forms, surrogates and values past U+10FFFF are excluded by
 * narrowing the allowed range of the *first continuation byte* for the lead
 * bytes E0, ED, F0 and F4 (the approach of the Unicode standard's table 3-7).
 */
#include "mmoe_utf8.h"

#include <stdint.h>

/** Number of continuation bytes after @p lead, and the allowed range of the first one. */
static int utf8_lead(uint8_t lead, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (lead < 0x80)
        return 0;
    if (lead >= 0xC2 && lead <= 0xDF)
        return 1;
    if (lead >= 0xE0 && lead <= 0xEF) {
        if (lead == 0xE0)
            *lo = 0xA0; /* below would be overlong */
        if (lead == 0xED)
            *hi = 0x9F; /* above would be a surrogate */
        return 2;
    }
    if (lead >= 0xF0 && lead <= 0xF4) {
        if (lead == 0xF0)
            *lo = 0x90; /* below would be overlong */
        if (lead == 0xF4)
            *hi = 0x8F; /* above would exceed U+10FFFF */
        return 3;
    }
    return -1; /* a stray continuation byte, C0/C1, or F5..FF */
}

int mmoe_utf8_valid(const char *s, size_t len, size_t *bad_offset)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        uint8_t lo, hi;
        int n_cont = utf8_lead(p[i], &lo, &hi);
        /* the whole sequence must fit: n_cont bytes remain after the lead */
        int ok = n_cont >= 0 && (size_t)n_cont <= len - i - 1;
        for (int k = 1; ok && k <= n_cont; k++) {
            uint8_t c = p[i + (size_t)k];
            ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        }
        if (!ok) {
            if (bad_offset)
                *bad_offset = i;
            return 0;
        }
        i += (size_t)n_cont + 1;
    }
    return 1;
}
