/**
 * @file gpu_decode16_map.h
 * @brief The bit moves and index maps of the decode GEMM with F16 MMAs (decode16, gpu_decode.cu),
 *        in plain C that the CUDA kernel and a CPU test (tests/test_gpu_decode16_map.c) share.
 *
 * decode16 multiplies with `mma.sync.m16n8k16` F16 MMAs.  Its weight operand comes from MXFP4
 * codes by moving bits, its activation operand from FP8 bytes the block converts and stages in
 * shared memory, and the two must meet at the same k in every fragment.  Everything that decides
 * which bits go where and which k sits where is here, once:
 *
 *   - **E2M1 to F16.**  Code s e1 e0 m becomes the F16 bits s 0 0 0 e1 e0 m 0 0000 0000: sign to
 *     bit 15, e1 e0 to the two low exponent bits, m to the top mantissa bit.  That is the F16
 *     number e2m1 * 2^-14 for every code (the E2M1 subnormal 0.5 lands on the F16 subnormal
 *     2^-15, zero on zero).  Its low byte is zero, so a word of 8 codes yields the high bytes of
 *     its 4 even codes (low nibbles) and of its 4 odd codes in one word each, and one byte
 *     permute (PRMT) places two high bytes over two zero bytes: an F16 pair.
 *   - **Scale bytes.**  2^(k - 127) of a UE8M0 byte k is the FP32 with k in its exponent field for
 *     k >= 1 (k = 255: infinity), and 2^-127 (bits 0x00400000, below every normal exponent field)
 *     for k = 0: the unsigned maximum of the two is the factor's bits for every k.
 *   - **Where activation k is staged.**  A staged row holds, per K block of 128, 128 F16 values
 *     in runs of 8 (run r holds k = 8r .. 8r + 7 of the block, r = 4j + t: group j, lane column
 *     t).  MXFP4 launches keep each run in place with its even k first (x0 x2 x4 x6 x1 x3 x5 x7),
 *     FP8 launches move run (j, t) to position 32t + 8j in order.  Lane (g, t) of a warp reads
 *     its B registers of group j (MXFP4) or of steps 2c, 2c + 1 (FP8) as the 16 bytes at
 *     64 c + 16 t of the block: run (c, t) for MXFP4, run (t, c) for FP8.
 *   - **Which codes form a step.**  MXFP4 lane (g, t) holds codes 8t .. 8t + 7 of group j of its
 *     two rows; step 0 of the group multiplies codes 8t + {0, 2} (fragment a0, a1) and
 *     8t + {4, 6} (a2, a3), step 1 codes 8t + {1, 3} and 8t + {5, 7}, matching the B registers
 *     (x0 x2 | x4 x6 for step 0, x1 x3 | x5 x7 for step 1).  FP8 lane (g, t) holds the 32 bytes
 *     of group t; step s multiplies bytes 4s, 4s + 1 (a0, a1) and 4s + 2, 4s + 3 (a2, a3), with
 *     B registers the staged pairs of the same k.
 */
#ifndef MMOE_GPU_DECODE16_MAP_H
#define MMOE_GPU_DECODE16_MAP_H

#include <stdint.h>

#ifdef __CUDACC__
#define MMOE_D16_FN __host__ __device__ static inline
#else
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

/** Position (in F16 values, inside its K block) where run @p run (0..15: k = 8 run ..) is staged. */
MMOE_D16_FN int mmoe_d16_run_pos(int run, int fp4)
{
    const int j = run / 4, t = run % 4;
    return fp4 ? j * 32 + t * 8 : t * 32 + j * 8;
}

/** Byte offset, inside a staged K block, of lane column @p t's B registers of group / step pair @p c. */
MMOE_D16_FN int mmoe_d16_b_offset(int t, int c)
{
    return c * 64 + t * 16;
}

#endif /* MMOE_GPU_DECODE16_MAP_H */
