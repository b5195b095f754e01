/**
 * @file gpu_decode16_map.h
 * @brief The bit moves and index maps of the decode GEMM with F16 MMAs (decode16, gpu_decode.cu)
 *        and of the wgmma GEMM's register fragments (gpu_gemm_wgmma.cu), in plain C that the
 *        CUDA kernels and a CPU test (tests/test_gpu_decode16_map.c) share.
 *
 * decode16 multiplies with `mma.sync.m16n8k16` F16 MMAs.  Its weight operand comes from MXFP4
 * codes by moving bits (or from FP8 bytes by the paired conversion), its activation operand from
 * the FP8 bytes the block stages in shared memory as they are (one byte per value), converted
 * to F16 pairs in registers right before the MMA; the two must
 * meet at the same k in every fragment.  Everything that decides which bits go where and which
 * k sits where is here, once:
 *
 *   - **E2M1 to F16.**  Code s e1 e0 m becomes the F16 bits s 0 0 0 e1 e0 m 0 0000 0000: sign to
 *     bit 15, e1 e0 to the two low exponent bits, m to the top mantissa bit.  That is the F16
 *     number e2m1 * 2^-14 for every code (the E2M1 subnormal 0.5 lands on the F16 subnormal
 *     2^-15, zero on zero).  Its low byte is zero, so a word of 8 codes yields the high bytes of
 *     its 4 even codes (low nibbles) and of its 4 odd codes in one word each, and one byte
 *     permute (PRMT) places two high bytes over two zero bytes: an F16 pair.
 *   - **E4M3 to F16.**  Every E4M3 number is an F16 number (4 exponent bits of bias 7 inside 5 of
 *     bias 15, 3 mantissa bits inside 10; E4M3's subnormals, down to 2^-9, are F16 normals), so
 *     the conversion is exact; NaN stays NaN.  On the device it is cvt.rn.f16x2.e4m3x2, one
 *     instruction per pair; the host model below derives the F16 fields from E4M3's.
 *   - **Scale bytes.**  2^(k - 127) of a UE8M0 byte k is the FP32 with k in its exponent field for
 *     k >= 1 (k = 255: infinity), and 2^-127 (bits 0x00400000, below every normal exponent field)
 *     for k = 0: the unsigned maximum of the two is the factor's bits for every k.
 *   - **Where activation k is staged.**  A staged row holds, per K block of 128, 128 E4M3 bytes
 *     in runs of 8 (run r holds k = 8r .. 8r + 7 of the block, r = 4j + t: group j, lane column
 *     t).  MXFP4 launches move run (j, t) to byte 32t + 8j with its even k first (x0 x2 x4 x6
 *     x1 x3 x5 x7); FP8 launches keep every run in place.  Either way lane (g, t) of a warp reads
 *     the 32 bytes at 32t of the block, 8 words: word w at byte 32t + 4w.
 *   - **Which codes form a step.**  MXFP4 lane (g, t) holds codes 8t .. 8t + 7 of group j of its
 *     two rows; step 0 of the group multiplies codes 8t + {0, 2} (fragment a0, a1) and
 *     8t + {4, 6} (a2, a3), step 1 codes 8t + {1, 3} and 8t + {5, 7}; the B registers of step 0
 *     are the low and high F16 pairs of word 2j (x0 x2 | x4 x6), of step 1 those of word 2j + 1
 *     (x1 x3 | x5 x7).  FP8 lane (g, t) holds the 32 bytes of group t; step s (0..7) multiplies
 *     bytes 4s, 4s + 1 (a0, a1) and 4s + 2, 4s + 3 (a2, a3), with B registers the low and high
 *     F16 pairs of word s (the same k).
 *   - **The wgmma kernel** builds its A fragments the way decode16 builds its MXFP4 ones, for
 *     both weight formats (mmoe_d16_a_pairs_fp4, mmoe_d16_a_pairs_fp8: lane (g, t) holds k 8t..
 *     8t + 7 of each group, even k in the group's first step, odd k in its second), but its B
 *     operand is a K-major tile in shared memory that the tensor core reads at logical k: the
 *     activations are widened to F16 once, into the order those fragments need
 *     (mmoe_d16_wg_k_of_position, mmoe_d16_wg_widen_group).
 */
#ifndef MMOE_GPU_DECODE16_MAP_H
#define MMOE_GPU_DECODE16_MAP_H

#include <stdint.h>

#ifdef __CUDACC__
#define MMOE_D16_FN __host__ __device__ static inline
#else
/** The qualifiers of this header's functions: host and device under nvcc, static inline in C. */
#define MMOE_D16_FN static inline
#endif

/** Byte-permute selectors (byte i of the result = byte s_i of the pair y:x, see mmoe_d16_byte_perm). */
enum mmoe_d16_selector {
    MMOE_D16_SEL_PAIR_LO = 0x1404, /**< high bytes 0, 1 of x over zero bytes: an F16 pair */
    MMOE_D16_SEL_PAIR_HI = 0x3424, /**< high bytes 2, 3 of x over zero bytes */
    MMOE_D16_SEL_EVEN = 0x6420,    /**< bytes 0, 2, 4, 6 of y:x (a run's even k) */
    MMOE_D16_SEL_ODD = 0x7531      /**< bytes 1, 3, 5, 7 of y:x (a run's odd k) */
};

/**
 * CUDA's __byte_perm(x, y, s): byte i of the result is byte (s >> 4i) & 7 of the 8 bytes x
 * (bytes 0..3) and y (bytes 4..7).  On the device it is the PRMT instruction.
 */
MMOE_D16_FN uint32_t mmoe_d16_byte_perm(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t in = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((in >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
    return r;
#endif
}

/** F16 high bytes of the 4 even codes (low nibbles) of a packed word: s e1 e0 m -> s 000 e1 e0 m 0. */
MMOE_D16_FN uint32_t mmoe_d16_e2m1_even_high(uint32_t w)
{
    return ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
}

/** F16 high bytes of the 4 odd codes (high nibbles) of a packed word. */
MMOE_D16_FN uint32_t mmoe_d16_e2m1_odd_high(uint32_t w)
{
    return ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
}

/** The F16 pair (low half first) of high bytes 0 and 1 of @p h. */
MMOE_D16_FN uint32_t mmoe_d16_f16_pair_lo(uint32_t h)
{
    return mmoe_d16_byte_perm(h, 0u, MMOE_D16_SEL_PAIR_LO);
}

/** The F16 pair of high bytes 2 and 3 of @p h. */
MMOE_D16_FN uint32_t mmoe_d16_f16_pair_hi(uint32_t h)
{
    return mmoe_d16_byte_perm(h, 0u, MMOE_D16_SEL_PAIR_HI);
}

/** FP32 bits of 2^(k - 127) for UE8M0 byte @p g (0..3) of scale word @p w (k = 0: 2^-127; 255: inf). */
MMOE_D16_FN uint32_t mmoe_d16_ue8m0_pow2_bits(uint32_t w, int g)
{
    const uint32_t e = (g < 3 ? w << (23 - 8 * g) : w >> 1) & 0x7F800000u;
    return e > 0x00400000u ? e : 0x00400000u;
}

/**
 * Four E4M3 bytes as two F16 pairs, exactly (NaN stays NaN): bytes 0, 1 into @p lo (byte 0 in
 * the low half), bytes 2, 3 into @p hi.  On the device two paired conversions; on the host the
 * same numbers from the formats' fields (a normal E4M3 keeps its mantissa, its exponent
 * rebiased by 8; a subnormal m * 2^-9 is normalized).
 */
MMOE_D16_FN void mmoe_d16_e4m3x4_to_f16x2(uint32_t v, uint32_t *lo, uint32_t *hi)
{
#ifdef __CUDA_ARCH__
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\t"
        "cvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(*lo), "=r"(*hi)
        : "r"(v));
#else
    uint32_t h[4];
    for (int i = 0; i < 4; i++) {
        const uint32_t b = (v >> (8 * i)) & 0xFFu, sign = (b >> 7) << 15;
        int e = (int)((b >> 3) & 15u), m = (int)(b & 7u);
        if (e == 15 && m == 7) {
            h[i] = sign | 0x7E00u; /* NaN */
        } else if (e == 0 && m == 0) {
            h[i] = sign; /* signed zero */
        } else {
            if (e == 0) {
                /* subnormal m * 2^-9 = 0.m * 2^(1 - 7): shift m up to the implicit bit */
                e = 1;
                while ((m & 8) == 0) {
                    m <<= 1;
                    e--;
                }
                m &= 7;
            }
            h[i] = sign | (uint32_t)(e + 8) << 10 | (uint32_t)m << 7; /* exponent bias 7 -> 15 */
        }
    }
    *lo = h[0] | h[1] << 16;
    *hi = h[2] | h[3] << 16;
#endif
}

/**
 * The A registers of one 32-wide MXFP4 group for lane (g, t) of a warp: word @p w0 of row g and
 * @p w1 of row g + 8 (codes 8t..8t+7 of the group each) to the F16 pairs of the group's first
 * step, @p ev (its even codes: 8t, 8t + 2 in ev[0] / ev[1], 8t + 4, 8t + 6 in ev[2] / ev[3],
 * rows g / g + 8), and of its second step, @p od (the odd codes).  Each value is e2m1 * 2^-14.
 */
MMOE_D16_FN void mmoe_d16_a_pairs_fp4(uint32_t w0, uint32_t w1, uint32_t ev[4], uint32_t od[4])
{
    const uint32_t e0 = mmoe_d16_e2m1_even_high(w0), e1 = mmoe_d16_e2m1_even_high(w1);
    const uint32_t o0 = mmoe_d16_e2m1_odd_high(w0), o1 = mmoe_d16_e2m1_odd_high(w1);
    ev[0] = mmoe_d16_f16_pair_lo(e0);
    ev[2] = mmoe_d16_f16_pair_hi(e0);
    ev[1] = mmoe_d16_f16_pair_lo(e1);
    ev[3] = mmoe_d16_f16_pair_hi(e1);
    od[0] = mmoe_d16_f16_pair_lo(o0);
    od[2] = mmoe_d16_f16_pair_hi(o0);
    od[1] = mmoe_d16_f16_pair_lo(o1);
    od[3] = mmoe_d16_f16_pair_hi(o1);
}

/**
 * The same for FP8 weights in the wgmma kernel's order (gpu_gemm_wgmma.cu): bytes 8t..8t+7 of the
 * group, @p u0, @p u1 of row g and @p v0, @p v1 of row g + 8, the even bytes to the first step's
 * F16 pairs @p ev, the odd ones to the second step's @p od, in the places mmoe_d16_a_pairs_fp4
 * gives the codes of the same k.
 */
MMOE_D16_FN void mmoe_d16_a_pairs_fp8(uint32_t u0, uint32_t u1, uint32_t v0, uint32_t v1, uint32_t ev[4],
                                      uint32_t od[4])
{
    mmoe_d16_e4m3x4_to_f16x2(mmoe_d16_byte_perm(u0, u1, MMOE_D16_SEL_EVEN), &ev[0], &ev[2]);
    mmoe_d16_e4m3x4_to_f16x2(mmoe_d16_byte_perm(v0, v1, MMOE_D16_SEL_EVEN), &ev[1], &ev[3]);
    mmoe_d16_e4m3x4_to_f16x2(mmoe_d16_byte_perm(u0, u1, MMOE_D16_SEL_ODD), &od[0], &od[2]);
    mmoe_d16_e4m3x4_to_f16x2(mmoe_d16_byte_perm(v0, v1, MMOE_D16_SEL_ODD), &od[1], &od[3]);
}

/**
 * The wgmma kernel's K order: position @p p (0..31) of a widened 32-group holds actual k =
 * 8t + 2q + h of the group, with h = p / 16 (the group's step), i = p % 16 (the step's logical
 * k), t = (i % 8) / 2 and q = i % 2 + 2 (i / 8): logical k 2t, 2t + 1, 2t + 8, 2t + 9 of a step
 * (lane column t's fragment places) are the codes or bytes 8t + h, 8t + 2 + h, 8t + 4 + h,
 * 8t + 6 + h that mmoe_d16_a_pairs_fp4 and _fp8 put there.
 */
MMOE_D16_FN int mmoe_d16_wg_k_of_position(int p)
{
    const int h = p / 16, i = p % 16, t = (i % 8) / 2, q = i % 2 + 2 * (i / 8);
    return 8 * t + 2 * q + h;
}

/**
 * One 32-group of E4M3 bytes (words @p w: word v = bytes 4v..4v+3) widened to F16 in the wgmma
 * kernel's K order: @p out[v] holds positions 2v (low half) and 2v + 1.  Positions 0-7 are the
 * even bytes of words 0, 2 and 4, 6 (k 0, 2, 8, 10, 16, 18, 24, 26), 8-15 those of words 1, 3
 * and 5, 7, 16-31 the odd bytes likewise: one byte permute gathers four, the paired conversion
 * makes them F16 (exact).
 */
MMOE_D16_FN void mmoe_d16_wg_widen_group(const uint32_t w[8], uint32_t out[16])
{
    for (int c = 0; c < 4; c++) { /* positions 8c..8c+7: step c / 2, words c % 2 + {0, 2} and + {4, 6} */
        const uint32_t sel = c < 2 ? MMOE_D16_SEL_EVEN : MMOE_D16_SEL_ODD;
        mmoe_d16_e4m3x4_to_f16x2(mmoe_d16_byte_perm(w[c % 2], w[c % 2 + 2], sel), &out[4 * c], &out[4 * c + 1]);
        mmoe_d16_e4m3x4_to_f16x2(mmoe_d16_byte_perm(w[c % 2 + 4], w[c % 2 + 6], sel), &out[4 * c + 2],
                                 &out[4 * c + 3]);
    }
}

/**
 * Byte offset, inside a staged K block, where run @p run (0..15: activations k = 8 run .. 8 run +
 * 7 of the block) is staged: MXFP4 (@p fp4) run (j, t) = (run / 4, run % 4) at 32t + 8j, its
 * bytes permuted even k first (MMOE_D16_SEL_EVEN, then MMOE_D16_SEL_ODD); FP8 in place.
 */
MMOE_D16_FN int mmoe_d16_run_offset(int run, int fp4)
{
    const unsigned r = (unsigned)run, j = r / 4u, t = r % 4u; /* unsigned: a shift and a mask */
    return (int)(fp4 ? t * 32u + j * 8u : r * 8u);
}

/** Byte offset, inside a staged K block, of lane column @p t's word @p w (0..7: its B source words). */
MMOE_D16_FN int mmoe_d16_b_word_offset(int t, int w)
{
    return t * 32 + w * 4;
}

/**
 * The decode kernel's MXFP4 copy stage (gpu_decode.cu): one K block of a warp's 16 weight rows,
 * 64 bytes a row, in two halves of 8 rows (rows g and g + 8 of the MMA fragments).  Lane (g, t)
 * copies 16 bytes with one cp.async per half: group t (codes 32t .. 32t + 31) of row g.  The
 * 16-byte piece (row r, group j) of a half lands at byte 64 r + 16 (j ^ ((r / 2) % 4)) of it, so
 * that one ldmatrix.x4 reads a half without a bank conflict: its matrix j is group j of rows
 * 0..7, lane (g, t) receives word t of each (codes 8t .. 8t + 7 of group j of row g, the word
 * the fragments of mmoe_d16_a_pairs_fp4 take), and the eight 16-byte rows of one matrix fall in
 * eight different quarters of the 32 banks.
 */
MMOE_D16_FN int mmoe_d16_fp4_piece_offset(int r, int j)
{
    const unsigned ur = (unsigned)r, uj = (unsigned)j;
    return (int)(ur * 64u + ((uj ^ ((ur >> 1) & 3u)) * 16u));
}

/**
 * The row address lane @p lane gives an ldmatrix.x4 of a half of the MXFP4 copy stage: lanes
 * 8j .. 8j + 7 name rows 0..7 of matrix j (group j), at their pieces' offsets.
 */
MMOE_D16_FN int mmoe_d16_fp4_ldmatrix_row_offset(int lane)
{
    return mmoe_d16_fp4_piece_offset(lane & 7, lane >> 3);
}

#endif /* MMOE_GPU_DECODE16_MAP_H */
