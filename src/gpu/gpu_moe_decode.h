/**
 * @file gpu_moe_decode.h
 * @brief The E2M1 weight decode of the GPU forward's MoE chains (gpu_fwd_moe.cu), in plain C
 *        that the CUDA kernels and a CPU test (tests/test_gpu_moe_decode.c) share.
 *
 * A routed expert's weight is the oracle's fl(e2m1(n) * 2^(s - 127)): E2M1 code n (sign bit 3,
 * magnitude bits 0..2), UE8M0 scale byte s of its 32-wide group, one fp32 rounding.  The chains
 * of gpu_fwd_moe.cu build it from integer bit moves and fp32 multiplies, never from a table:
 *
 *   - **The tiny float.**  Code n placed as the fp32 bits (n & 7) << 22 | (n & 8) << 28 is the
 *     number d = e2m1(n) * 2^-126 exactly: magnitude bits e1 e0 m land on the two low exponent
 *     bits and the top mantissa bit, so codes 2..7 are normal numbers 2^-126 .. 1.5 * 2^-124 and
 *     code 1 (0.5) is the subnormal 2^-127, code 0 is zero, with the code's sign
 *     (mmoe_moe_e2m1_tiny_bits()).
 *   - **Two steps (every s).**  fl(fl(d * 2^126) * 2^(s - 127)): the first product is e2m1(n)
 *     exactly, the second is the oracle's product with its one rounding; 2^(s - 127) is the
 *     UE8M0 value (2^-127 the subnormal for s = 0, NaN for s = 255).  Two FMUL per weight.
 *   - **One step (s <= 128).**  fl(d * 2^(s - 1)).  For s <= 128 the factor 2^(s - 1) is a
 *     normal fp32 number (exponent field s + 126, from 126 for s = 0 to 254 for s = 128), and
 *     d * 2^(s - 1) is the same real number e2m1(n) * 2^(s - 127) that the two-step path rounds
 *     once: the same float, subnormal results and zeros (with their sign) included, whatever
 *     the code.  One FMUL per weight.  For s >= 129 the factor would not be a float (2^128
 *     and up), so those groups (and s = 255, NaN) keep the two steps; real checkpoints have
 *     scales far below 2^1 (s < 128), so the choice is the same for every group of a layer.
 *
 * The test proves the one-step product equal to the oracle's weight (mmoe_fp4_e2m1_to_f32()
 * times mmoe_ue8m0_to_f32()) bit for bit for all 16 codes x 129 scales, the two-step product for
 * all 16 x 256, and the kernel's per-word test of "every scale byte <= 128" on every byte value
 * in every position.  It is compiled without contraction (no fma may replace a multiply) and
 * the kernels are built without flush-to-zero (subnormals matter here).
 */
#ifndef MMOE_GPU_MOE_DECODE_H
#define MMOE_GPU_MOE_DECODE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MMOE_MOE_DEC_FN __host__ __device__ static inline
#else
/** The qualifiers of this header's functions: host and device under nvcc, static inline in C. */
#define MMOE_MOE_DEC_FN static inline
#endif

/** Bounds of the decode paths (UE8M0 scale bytes). */
enum mmoe_moe_dec_bound {
    MMOE_MOE_DEC_ONE_STEP_MAX = 128, /**< largest scale byte whose 2^(s - 1) is a float: one FMUL */
    MMOE_MOE_DEC_UE8M0_NAN = 255     /**< the UE8M0 byte that means NaN */
};

/** The fp32 number with bits @p u (on the device: no instruction). */
MMOE_MOE_DEC_FN float mmoe_moe_f32_from_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/** fl(a * b), never contracted into a neighbouring add (__fmul_rn on the device). */
MMOE_MOE_DEC_FN float mmoe_moe_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/** The fp32 bits of e2m1(n) * 2^-126 for the code in the low 4 bits of @p n (higher bits ignored). */
MMOE_MOE_DEC_FN uint32_t mmoe_moe_e2m1_tiny_bits(uint32_t n)
{
    return ((n & 7u) << 22) | ((n & 8u) << 28);
}

/** e2m1(n) * 2^-126 as a float (mmoe_moe_e2m1_tiny_bits()). */
MMOE_MOE_DEC_FN float mmoe_moe_e2m1_tiny(uint32_t n)
{
    return mmoe_moe_f32_from_bits(mmoe_moe_e2m1_tiny_bits(n));
}

/** 2^(s - 127) for UE8M0 byte @p s: 2^-127 (subnormal) for 0, NaN for 255. */
MMOE_MOE_DEC_FN float mmoe_moe_ue8m0(uint32_t s)
{
    return s == MMOE_MOE_DEC_UE8M0_NAN ? mmoe_moe_f32_from_bits(0x7FC00000u)
                                       : mmoe_moe_f32_from_bits(s == 0 ? 0x00400000u : s << 23);
}

/** The one-step factor 2^(s - 1) for a scale byte @p s <= MMOE_MOE_DEC_ONE_STEP_MAX (exponent field s + 126). */
MMOE_MOE_DEC_FN float mmoe_moe_one_step_factor(uint32_t s)
{
    return mmoe_moe_f32_from_bits((s + 126u) << 23);
}

/**
 * The exponent fields s + 126 of the one-step factors of the four scale bytes of @p w at once,
 * for a word whose bytes are all at most MMOE_MOE_DEC_ONE_STEP_MAX (mmoe_moe_one_step_word()):
 * s + 126 <= 254 fits its byte, so no carry crosses into the next.
 */
MMOE_MOE_DEC_FN uint32_t mmoe_moe_one_step_fields(uint32_t w)
{
    return w + 0x7E7E7E7Eu;
}

/**
 * The one-step factor of byte @p j (0..3, a constant after unrolling) of a fields word @p f
 * (mmoe_moe_one_step_fields()): the byte moved to the exponent bits 23..30 and the rest
 * masked off, one shift and one mask (mmoe_moe_one_step_factor() of the byte, bit for bit).
 */
MMOE_MOE_DEC_FN float mmoe_moe_one_step_factor_of(uint32_t f, int j)
{
    const uint32_t placed = j < 3 ? f << (23 - 8 * j) : f >> 1;
    return mmoe_moe_f32_from_bits(placed & 0x7F800000u);
}

/**
 * Nonzero when every byte of @p w is at most MMOE_MOE_DEC_ONE_STEP_MAX (= 0x80): a byte is
 * larger exactly when its top bit and one of its low 7 bits are set.  Adding 0x7F to each low
 * 7-bit field sets that field's bit 7 exactly when the field is nonzero (no carry leaves the
 * byte: 0x7F + 0x7F < 0x100).
 */
MMOE_MOE_DEC_FN int mmoe_moe_one_step_word(uint32_t w)
{
    const uint32_t low_nonzero = ((w & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & 0x80808080u;
    return (w & low_nonzero & 0x80808080u) == 0;
}

/**
 * @name The slot word
 * A chain word of eight E2M1 codes is stored with its bits rearranged (gpu_fwd_moe.cu's
 * packing) so that the tiny float of each code takes fewer bit moves.  In the plain word code
 * i sits at bits [4i, 4i + 4); the tiny float wants its magnitude bits e1 e0 m at 24..22 and
 * its sign at 31.  In the slot word code i's magnitude bits sit at bits [p_i, p_i + 3) and its
 * sign at bit s_i:
 *
 * | i   | 0  | 1  | 2  | 3  | 4  | 5  | 6  | 7  |
 * |-----|----|----|----|----|----|----|----|----|
 * | p_i | 0  | 3  | 6  | 9  | 12 | 16 | 19 | 22 |
 * | s_i | 26 | 27 | 15 | 29 | 30 | 25 | 28 | 31 |
 *
 * (the 32 bits, each once).  The word shifted left by 22 - p_i holds code i's magnitude in
 * place; for i = 2, 5, 6, 7 the sign lies 9 bits above the magnitude (s_i = p_i + 9), so the
 * same shifted word holds the sign at 31 too and one mask gives the tiny float (no shift at all
 * for i = 7).  The other four signs come from the word shifted left by 31 - s_i (shifts 5, 4,
 * 2, 1), then one merge.  Per word: 11 shifts, 8 masks, 4 merges (23 integer operations)
 * where the plain word takes 31.  No placement of 8 magnitudes and 8 signs in 32 bits does
 * better in this scheme (an exhaustive search over the 12,870 orders of 8 triples and 8 single
 * bits); none puts every sign 9 bits above its magnitude.
 * @{
 */

/** The lowest bit of code @p i's magnitude in a slot word. */
MMOE_MOE_DEC_FN int mmoe_moe_slot_mag_bit(int i)
{
    return i < 5 ? 3 * i : 3 * i + 1;
}

/** The bit of code @p i's sign in a slot word. */
MMOE_MOE_DEC_FN int mmoe_moe_slot_sign_bit(int i)
{
    return i == 0 ? 26 : i == 1 ? 27 : i == 3 ? 29 : i == 4 ? 30 : mmoe_moe_slot_mag_bit(i) + 9;
}

/** The slot word of the plain word @p w (code i at bits [4i, 4i + 4)). */
MMOE_MOE_DEC_FN uint32_t mmoe_moe_slot_word(uint32_t w)
{
    uint32_t r = 0;
    for (int i = 0; i < 8; i++) {
        const uint32_t n = (w >> (4 * i)) & 0xFu;
        r |= (n & 7u) << mmoe_moe_slot_mag_bit(i);
        r |= (n >> 3) << mmoe_moe_slot_sign_bit(i);
    }
    return r;
}

/**
 * The tiny-float bits (mmoe_moe_e2m1_tiny_bits()) of code @p i (0..7, a constant after
 * unrolling) of slot word @p w.
 */
MMOE_MOE_DEC_FN uint32_t mmoe_moe_slot_tiny_bits(uint32_t w, int i)
{
    const int p = mmoe_moe_slot_mag_bit(i), s = mmoe_moe_slot_sign_bit(i);
    const uint32_t placed = w << (22 - p);
    if (s == p + 9)
        return placed & 0x81C00000u;
    return (placed & 0x01C00000u) | ((w << (31 - s)) & 0x80000000u);
}

/** Code @p i of slot word @p w as its tiny float. */
MMOE_MOE_DEC_FN float mmoe_moe_slot_tiny(uint32_t w, int i)
{
    return mmoe_moe_f32_from_bits(mmoe_moe_slot_tiny_bits(w, i));
}
/** @} */

/**
 * The weight fl(e2m1(n) * 2^(s - 127)) by two multiplies from the code's tiny float @p tiny
 * (e2m1(n) * 2^-126, from a plain or a slot word), for every scale byte: fl(tiny * 2^126) is
 * e2m1(n) exactly, then times the UE8M0 value @p scale.
 */
MMOE_MOE_DEC_FN float mmoe_moe_tiny_two_step(float tiny, float scale)
{
    return mmoe_moe_mul(mmoe_moe_mul(tiny, 0x1p126f), scale);
}

/** The same weight by one multiply, @p factor = mmoe_moe_one_step_factor(s) for s <= 128. */
MMOE_MOE_DEC_FN float mmoe_moe_tiny_one_step(float tiny, float factor)
{
    return mmoe_moe_mul(tiny, factor);
}

/** mmoe_moe_tiny_two_step() of the code in the low 4 bits of @p n. */
MMOE_MOE_DEC_FN float mmoe_moe_e2m1_two_step(uint32_t n, float scale)
{
    return mmoe_moe_tiny_two_step(mmoe_moe_e2m1_tiny(n), scale);
}

/** mmoe_moe_tiny_one_step() of the code in the low 4 bits of @p n. */
MMOE_MOE_DEC_FN float mmoe_moe_e2m1_one_step(uint32_t n, float factor)
{
    return mmoe_moe_tiny_one_step(mmoe_moe_e2m1_tiny(n), factor);
}

#endif
