/**
 * @file fmt_layout.c
 * @brief Where the scales and weight rows go: the SM100 scale layouts and the L1 gate/up
 *        interleave, each with its inverse (@ref spec_fmt_sm100_layouts).
 *
 * None of these transforms changes a value; they only move bytes so that the tensor
 * memory accelerator (TMA) and the UTCCP copy into tensor memory read them in the order
 * the SM100 MMA wants.  Nothing in the library calls them today: the CPU oracle reads the
 * checkpoint layout directly, and the SM90 kernels of src/gpu load their own tiles
 * (gpu_moe.cu).  They stay, with their tests (each against its inverse and against the index
 * formulas written out again), as the executable definition of the SM100 layouts of
 * @ref spec_fmt_sm100_layouts, i.e. what an SM100 kernel of this project, or a caller preparing
 * inputs for DeepGEMM's kernel, has to produce.
 *
 * ## 1. MN-major, TMA-aligned, packed UE8M0 (`transform_sf_into_required_layout`)
 *
 * Input: scale bytes [G, MN, Ksf] (row-major, one byte per K-group).  Output: int32
 * [G, MN, P] with P = ceil(Ksf/4) and strides (P*A, 1, A), A = align(MN, 4):
 *
 *     word(g, r, p) = out[g*P*A + p*A + r] = bytes 4p..4p+3 of row r, little-endian
 *
 * The *rows* (MN) are contiguous, hence "MN-major"; A pads MN to 4 words = 16 bytes,
 * the TMA alignment.  Padding rows and padding bytes are 0.
 *
 * ## 2. UTCCP 4x32 transpose within 128 rows (`_transpose_sf_for_utccp`)
 *
 * The weight scales are then permuted within every group of 128 rows: view the rows
 * as [4][32] and transpose to [32][4].  Row r (0 <= r < 128) moves to
 *
 *     r' = 4 * (r % 32) + (r / 32) % 4      inverse: r = 32 * (r' % 4) + r' / 4
 *
 * so rows 0, 32, 64, 96 end up next to each other (0, 1, 2, 3).  MN must be a
 * multiple of 128; the MN-major strides are kept.
 *
 * ## 3. Activation-SF pool rows (dispatch, shared-expert SF)
 *
 * Token m of an expert's pool, with M-blocks of BM tokens, i = m % BM:
 *
 *     row = (m / BM) * align(BM, 128) + (i & ~127) + (i % 32) * 4 + (i / 32) % 4
 *
 * the same 4x32 transpose, applied per 128 tokens of each block, each block padded to
 * a multiple of 128 rows.  The pool is MN-major: word (row, kp) is at
 * `kp * num_sf_rows + row`.  Rows of a block that no token maps to are padding; vLLM
 * fills them with the last token's scales (mmoe_sf_to_pool() offers both).
 *
 * ## 4. L1 gate/up interleave by 8
 *
 * The L1 weight is [gate 0..I-1 | up 0..I-1] (DeepSeek-V4 w1 and w3 stacked).  The
 * kernel wants [g0..g7, u0..u7, g8..g15, u8..u15, ...], so each 128-row N-block holds
 * 64 gate and 64 up rows of the same 64 intermediate channels and SwiGLU can be applied
 * in the epilogue.  The same permutation moves the scale rows (before the UTCCP
 * transpose).  It works on whole rows of any byte width.
 */
#include <string.h>

#include "mmoe_formats.h"

size_t mmoe_align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* ------------------------------------------------------------------------------------------ */
/* 1. MN-major packing                                                                        */
/* ------------------------------------------------------------------------------------------ */

size_t mmoe_sf_mn_major_words(size_t g, size_t mn, size_t ksf)
{
    return g * ((ksf + 3) / 4) * mmoe_align_up(mn, 4);
}

/** int32 <-> uint32 by bits (the words are bit patterns, not numbers). */
static int32_t word_from_u32(uint32_t w)
{
    int32_t s;
    memcpy(&s, &w, sizeof s);
    return s;
}

/** The bits of an int32 word as uint32. */
static uint32_t word_to_u32(int32_t s)
{
    uint32_t w;
    memcpy(&w, &s, sizeof w);
    return w;
}

/**
 * The packing loop of both entry points: scale (gi, r, kk) is bytes[...] or, when
 * @p bytes is NULL, the truncated exponent of floats[...].
 */
static void pack_mn_major(const uint8_t *bytes, const float *floats, size_t g, size_t mn, size_t ksf, int32_t *out)
{
    size_t P = (ksf + 3) / 4, A = mmoe_align_up(mn, 4);
    for (size_t gi = 0; gi < g; gi++)
        for (size_t p = 0; p < P; p++)
            for (size_t r = 0; r < A; r++) {
                uint32_t w = 0;
                for (size_t b = 0; r < mn && b < 4 && 4 * p + b < ksf; b++) {
                    size_t idx = (gi * mn + r) * ksf + 4 * p + b;
                    uint8_t e = bytes ? bytes[idx] : mmoe_ue8m0_from_f32_trunc(floats[idx]);
                    w |= (uint32_t)e << (8 * b);
                }
                out[gi * P * A + p * A + r] = word_from_u32(w);
            }
}

void mmoe_sf_pack_mn_major(const uint8_t *sf, size_t g, size_t mn, size_t ksf, int32_t *out)
{
    pack_mn_major(sf, NULL, g, mn, ksf, out);
}

void mmoe_sf_pack_mn_major_f32(const float *sf, size_t g, size_t mn, size_t ksf, int32_t *out)
{
    pack_mn_major(NULL, sf, g, mn, ksf, out);
}

void mmoe_sf_unpack_mn_major(const int32_t *in, size_t g, size_t mn, size_t ksf, uint8_t *sf)
{
    size_t P = (ksf + 3) / 4, A = mmoe_align_up(mn, 4);
    for (size_t gi = 0; gi < g; gi++)
        for (size_t r = 0; r < mn; r++)
            for (size_t kk = 0; kk < ksf; kk++) {
                uint32_t w = word_to_u32(in[gi * P * A + (kk / 4) * A + r]);
                sf[(gi * mn + r) * ksf + kk] = (uint8_t)(w >> (8 * (kk % 4)));
            }
}

/* ------------------------------------------------------------------------------------------ */
/* 2. UTCCP transpose                                                                         */
/* ------------------------------------------------------------------------------------------ */

size_t mmoe_utccp_row(size_t r)
{
    size_t i = r % 128;
    return (r - i) + 4 * (i % 32) + (i / 32) % 4;
}

size_t mmoe_utccp_row_inv(size_t r)
{
    size_t j = r % 128;
    return (r - j) + 32 * (j % 4) + j / 4;
}

/** Apply the UTCCP permutation (or its inverse) to every (group, word column). */
static mmoe_status utccp_apply(const char *fn, const int32_t *in, size_t g, size_t mn, size_t ksf,
                               int32_t *out, int inverse, mmoe_error *err)
{
    if (mn % 128 != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: MN=%zu must be a multiple of 128", fn, mn);
    size_t P = (ksf + 3) / 4;
    for (size_t gi = 0; gi < g; gi++)
        for (size_t p = 0; p < P; p++) {
            const int32_t *src = in + (gi * P + p) * mn;
            int32_t *dst = out + (gi * P + p) * mn;
            for (size_t r = 0; r < mn; r++) {
                if (inverse)
                    dst[r] = src[mmoe_utccp_row(r)];
                else
                    dst[mmoe_utccp_row(r)] = src[r];
            }
        }
    return MMOE_OK;
}

mmoe_status mmoe_sf_utccp_transpose(const int32_t *in, size_t g, size_t mn, size_t ksf,
                                    int32_t *out, mmoe_error *err)
{
    return utccp_apply("mmoe_sf_utccp_transpose", in, g, mn, ksf, out, 0, err);
}

mmoe_status mmoe_sf_utccp_untranspose(const int32_t *in, size_t g, size_t mn, size_t ksf,
                                      int32_t *out, mmoe_error *err)
{
    return utccp_apply("mmoe_sf_utccp_untranspose", in, g, mn, ksf, out, 1, err);
}

/* ------------------------------------------------------------------------------------------ */
/* 3. Activation-SF pool                                                                      */
/* ------------------------------------------------------------------------------------------ */

size_t mmoe_sf_pool_row(size_t m, size_t block_m)
{
    size_t i = m % block_m;
    return (m / block_m) * mmoe_align_up(block_m, 128) + (i & ~(size_t)127) + (i % 32) * 4 + (i / 32) % 4;
}

int mmoe_sf_pool_token(size_t row, size_t block_m, size_t *m)
{
    size_t rows_per_block = mmoe_align_up(block_m, 128);
    size_t blk = row / rows_per_block, j = row % rows_per_block;
    size_t l = j % 128;
    size_t i = (j - l) + 32 * (l % 4) + l / 4;
    if (i >= block_m)
        return 0;
    *m = blk * block_m + i;
    return 1;
}

size_t mmoe_sf_pool_rows(size_t num_tokens, size_t block_m)
{
    return (num_tokens + block_m - 1) / block_m * mmoe_align_up(block_m, 128);
}

/** Validate BLOCK_M and the pool size for @p t tokens. */
static mmoe_status check_pool(const char *fn, size_t t, size_t block_m, size_t num_sf_rows, mmoe_error *err)
{
    if (block_m == 0)
        return mmoe_error_set(err, MMOE_EINVAL, "%s: BLOCK_M must be positive, found 0", fn);
    size_t need = mmoe_sf_pool_rows(t, block_m);
    if (num_sf_rows < need)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "%s: pool of %zu SF rows is too small for %zu tokens with BLOCK_M %zu "
                              "(needs %zu)", fn, num_sf_rows, t, block_m, need);
    return MMOE_OK;
}

mmoe_status mmoe_sf_to_pool(const int32_t *x_sf, size_t t, size_t p, size_t block_m,
                            size_t num_sf_rows, int pad_with_last, int32_t *pool,
                            mmoe_error *err)
{
    mmoe_status st = check_pool("mmoe_sf_to_pool", t, block_m, num_sf_rows, err);
    if (st != MMOE_OK || t == 0)
        return st;
    size_t used_rows = mmoe_sf_pool_rows(t, block_m);
    for (size_t row = 0; row < used_rows; row++) {
        size_t m = 0;
        int is_token = mmoe_sf_pool_token(row, block_m, &m) && m < t;
        for (size_t kp = 0; kp < p; kp++) {
            int32_t v = is_token ? x_sf[m * p + kp] : pad_with_last ? x_sf[(t - 1) * p + kp] : 0;
            pool[kp * num_sf_rows + row] = v;
        }
    }
    return MMOE_OK;
}

mmoe_status mmoe_sf_from_pool(const int32_t *pool, size_t t, size_t p, size_t block_m,
                              size_t num_sf_rows, int32_t *x_sf, mmoe_error *err)
{
    mmoe_status st = check_pool("mmoe_sf_from_pool", t, block_m, num_sf_rows, err);
    if (st != MMOE_OK)
        return st;
    for (size_t m = 0; m < t; m++) {
        size_t row = mmoe_sf_pool_row(m, block_m);
        for (size_t kp = 0; kp < p; kp++)
            x_sf[m * p + kp] = pool[kp * num_sf_rows + row];
    }
    return MMOE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* 4. Gate/up interleave                                                                      */
/* ------------------------------------------------------------------------------------------ */

size_t mmoe_l1_interleave_row(size_t r, size_t inter)
{
    int is_up = r >= inter;
    size_t j = is_up ? r - inter : r;
    return 16 * (j / 8) + (is_up ? 8 : 0) + j % 8;
}

size_t mmoe_l1_deinterleave_row(size_t p, size_t inter)
{
    size_t w = p % 16, j = 8 * (p / 16) + w % 8;
    return w < 8 ? j : inter + j;
}

/** Move whole rows by the interleave permutation (or its inverse). */
static mmoe_status interleave_apply(const char *fn, const void *in, size_t inter, size_t row_bytes,
                                    void *out, int inverse, mmoe_error *err)
{
    if (inter % 8 != 0)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "%s: intermediate size I=%zu must be a multiple of 8", fn, inter);
    const uint8_t *src = in;
    uint8_t *dst = out;
    for (size_t r = 0; r < 2 * inter; r++) {
        size_t p = mmoe_l1_interleave_row(r, inter);
        if (inverse)
            memcpy(dst + r * row_bytes, src + p * row_bytes, row_bytes);
        else
            memcpy(dst + p * row_bytes, src + r * row_bytes, row_bytes);
    }
    return MMOE_OK;
}

mmoe_status mmoe_l1_interleave(const void *in, size_t inter, size_t row_bytes, void *out,
                               mmoe_error *err)
{
    return interleave_apply("mmoe_l1_interleave", in, inter, row_bytes, out, 0, err);
}

mmoe_status mmoe_l1_deinterleave(const void *in, size_t inter, size_t row_bytes, void *out,
                                 mmoe_error *err)
{
    return interleave_apply("mmoe_l1_deinterleave", in, inter, row_bytes, out, 1, err);
}
