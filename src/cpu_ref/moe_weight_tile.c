/**
 * @file moe_weight_tile.c
 * @brief Exact dequantization of weight tiles (FP4 E2M1 x UE8M0, FP8 E4M3 x block scale) to FP32.
 *
 * The GEMMs of the oracle run in FP32 on dequantized weights.  Dequantization is exact: an E2M1
 * value has a 2-bit significand and an E4M3 value a 4-bit one, and a UE8M0 scale is a power of
 * two, so value x scale is an FP32 number (for every scale a real checkpoint uses; an F32 block
 * scale that is not a power of two is rounded once, fl(w * s)).
 *
 * Cost is what matters here: a decoded tile is used by every token routed to the expert, so the
 * decoder touches each weight byte once per call and must be cheap next to the GEMM.  The FP4
 * decoder reads a byte and looks both nibbles up at once in the 512-float pair table of
 * mmoe_formats.h (element 2j = low nibble, 2j+1 = high nibble), then multiplies by the group's
 * scale: one table load and two multiplies per byte, no branches.  The loop takes two bytes per
 * step (independent loads, half the loop overhead): 0.25 -> 0.18 ms per 128 x 4096 tile (best
 * of 40, gcc 12 -O2, Zen 4 VM); on a quiet machine both forms run at about 0.14 ms,
 * the rate at which the 2 MiB tile can be stored, so the decoder is store-bound, not
 * compute-bound.  Alternatives measured and dropped: computing the E2M1 bits arithmetically
 * (vectorized by gcc -O2 with SSE2; 0.34-0.40 ms), a 16-entry table scaled once per 32-block
 * (no multiplies; 0.25 ms), SSE vector-extension pair loads (1 ms: store-forwarding stalls).
 * What helps is more cores (moe_dequant_pool.c) and overlap with the GEMMs (moe_expert_gemm.c).
 * Under AVX-512 the sixteen E2M1 values fit one register, and a permute looks up sixteen
 * nibbles at once (tile_fp4_avx512(): the same multiplications; moe_weight_tile_f32_isa()
 * chooses).
 *
 * Tile layout: row-major [nr, nc] with leading dimension nc, i.e. the same orientation as the
 * checkpoint (N rows, K contiguous), which the GEMM reads transposed.
 */
#include "moe_internal.h"

#include "cpu_avx512.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"

/** FP4 tile: pair-table decode of each byte, times the group's power-of-two scale. */
static void tile_fp4(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out)
{
    const float *pair = mmoe_fp4_e2m1_pair_table();
    const uint8_t *sf = (const uint8_t *)m->sf;
    const int64_t row_bytes = m->cols / 2;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *wrow = m->w + (r0 + r) * row_bytes + c0 / 2;
        const uint8_t *srow = sf + (r0 + r) * m->sf_cols + c0 / 32;
        float *orow = out + r * nc;
        for (int64_t g = 0; g < nc / 32; g++) {
            const float scale = fmt_ue8m0_to_f32(srow[g]);
            const uint8_t *b = wrow + g * 16;
            float *o = orow + g * 32;
            /* two bytes (four weights) per step: independent loads, fewer loop branches */
            for (int j = 0; j < 16; j += 2) {
                const float *p = pair + 2 * (unsigned)b[j];
                const float *q = pair + 2 * (unsigned)b[j + 1];
                float *o4 = o + 2 * j;
                o4[0] = p[0] * scale;
                o4[1] = p[1] * scale;
                o4[2] = q[0] * scale;
                o4[3] = q[1] * scale;
            }
        }
    }
}

#if MMOE_CPU_HAVE_X86
/**
 * tile_fp4() with AVX-512: the sixteen E2M1 values in one register, each group's 16 bytes split
 * into their 32 nibbles in element order (low nibble first) and looked up by one permute per
 * sixteen weights, then times the group's scale: the same fp32 multiplications as tile_fp4().
 */
MMOE_AVX512 static void tile_fp4_avx512(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out)
{
    const float *pair = mmoe_fp4_e2m1_pair_table();
    float values[16];
    for (int n = 0; n < 16; n++)
        values[n] = pair[2 * n]; /* byte n's low nibble is n */
    const __m512 table = _mm512_loadu_ps(values);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const uint8_t *sf = (const uint8_t *)m->sf;
    const int64_t row_bytes = m->cols / 2;
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *wrow = m->w + (r0 + r) * row_bytes + c0 / 2;
        const uint8_t *srow = sf + (r0 + r) * m->sf_cols + c0 / 32;
        float *orow = out + r * nc;
        for (int64_t g = 0; g < nc / 32; g++) {
            const __m512 scale = _mm512_set1_ps(fmt_ue8m0_to_f32(srow[g]));
            const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(wrow + g * 16));
            const __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
            const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
            float *o = orow + g * 32;
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(first), table), scale));
            _mm512_storeu_ps(o + 16,
                             _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(second), table), scale));
        }
    }
}
#endif

float moe_fp8_block_scale(const moe_mat *m, int64_t r, int64_t c)
{
    int64_t i = (r / m->block_n) * m->sf_cols + c / m->block_k;
    if (m->sf_f32)
        return ((const float *)m->sf)[i];
    return fmt_ue8m0_to_f32(((const uint8_t *)m->sf)[i]);
}

/** FP8 tile: table decode times the block scale, one run of columns per block. */
static void tile_fp8(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out)
{
    const float *e4m3 = mmoe_fp8_e4m3_table();
    for (int64_t r = 0; r < nr; r++) {
        const uint8_t *wrow = m->w + (r0 + r) * m->cols;
        float *orow = out + r * nc;
        int64_t c = c0;
        while (c < c0 + nc) {
            /* one run of columns that share a scale */
            int64_t run_end = (c / m->block_k + 1) * m->block_k;
            if (run_end > c0 + nc)
                run_end = c0 + nc;
            const float scale = moe_fp8_block_scale(m, r0 + r, c);
            for (int64_t j = c; j < run_end; j++)
                orow[j - c0] = e4m3[wrow[j]] * scale;
            c = run_end;
        }
    }
}

/** BF16 tile: widening. */
static void tile_bf16(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out)
{
    const uint16_t *w = (const uint16_t *)(const void *)m->w;
    for (int64_t r = 0; r < nr; r++)
        mmoe_bf16_to_f32_row(w + (r0 + r) * m->cols + c0, (size_t)nc, out + r * nc);
}

void moe_weight_tile_f32_isa(moe_dot_isa isa, const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                             float *out)
{
#if MMOE_CPU_HAVE_X86
    if (m->fmt == MOE_W_FP4 && isa == MOE_DOT_ISA_AVX512) {
        tile_fp4_avx512(m, r0, nr, c0, nc, out);
        return;
    }
#endif
    (void)isa;
    if (m->fmt == MOE_W_FP4)
        tile_fp4(m, r0, nr, c0, nc, out);
    else if (m->fmt == MOE_W_FP8)
        tile_fp8(m, r0, nr, c0, nc, out);
    else
        tile_bf16(m, r0, nr, c0, nc, out);
}

void moe_weight_tile_f32(const moe_mat *m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *out)
{
    moe_weight_tile_f32_isa(moe_dot_isa_best(), m, r0, nr, c0, nc, out);
}
