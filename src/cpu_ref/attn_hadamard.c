/**
 * @file attn_hadamard.c
 * @brief The Walsh-Hadamard rotation that the lightning indexer applies before its FP4 round trip.
 *
 * Outliers concentrated in a few channels would waste the 4-bit range of a 32-wide
 * FP4 block; an orthogonal rotation spreads them over all channels first.  V4 uses
 * the normalized Hadamard matrix in Sylvester order (as `fast_hadamard_transform`):
 *
 *     H_1 = [1],  H_2n = [[H_n, H_n], [H_n, -H_n]],   y = H_n x / sqrt(n)
 *
 * so that H_n[i][j] = (-1)^popcount(i & j).  It is computed by log2(n) butterfly
 * stages (a, b) -> (a + b, a - b) over element pairs at distance h = 1, 2, 4, ...,
 * in fp32 from the bf16 input; the result is multiplied by fp32(1/sqrt(n)) and
 * rounded to bf16.  Applied to the indexer's queries (per head) and to its
 * compressed keys, it leaves the q.k products unchanged in exact arithmetic
 * (H is orthogonal), so only the FP4 rounding sees the difference.
 */
#include "attn_internal.h"

#include <math.h>

#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** Largest supported transform length. */
#define ATTN_HADAMARD_MAX 1024

void attn_hadamard_bf16(uint16_t *x, int n)
{
    float v[ATTN_HADAMARD_MAX];
    if (n > ATTN_HADAMARD_MAX)
        return;
    for (int i = 0; i < n; i++)
        v[i] = fmt_bf16_to_f32(x[i]);
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
    const float scale = (float)(1.0 / sqrt((double)n));
    for (int i = 0; i < n; i++)
        x[i] = mmoe_bf16_from_f32(v[i] * scale);
}
