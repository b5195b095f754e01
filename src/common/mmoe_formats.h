/**
 * @file mmoe_formats.h
 * @brief The number formats of megamoe: FP8 E4M3FN/E5M2, FP4 E2M1, UE8M0 scales, BF16,
 *        the block quantizers built from them, and the scale/weight layout transforms.
 *
 * This header is the single public entry to the "formats" chapters; each family
 * lives in its own source file, which tells its story in its @c \@file comment:
 *
 * | file            | contents                                                              |
 * |-----------------|-----------------------------------------------------------------------|
 * | fmt_fp8.c       | FP8 E4M3FN and E5M2: decode tables, RNE encoders (saturating and not)   |
 * | fmt_fp4.c       | FP4 E2M1: decode table, RNE-sat and "ties down" encoders, nibble packing |
 * | fmt_ue8m0.c     | E8M0/UE8M0 scale bytes: ceil, floor, truncation; scale rules per library |
 * | fmt_bf16.c      | BF16: RNE with quiet NaN, rows                                          |
 * | fmt_quant.c     | row quantizers (1x32 / 1x128 UE8M0, 1x128 FP32), the 2-D block FP8     |
 * |                 | weight quantizer, and fast dequantizers                               |
 * | fmt_layout.c    | MN-major packing, UTCCP transpose, SF pool rows, gate/up interleave     |
 *
 * The exact rules are @ref spec_formats; @ref formats says which rule each
 * function implements and why.  All functions are pure (no global mutable
 * state) and thread-safe.
 *
 * Conventions:
 * - An FP4 code is a 4-bit value in the low nibble of a uint8_t (bit 3 sign,
 *   bits 2..0 the magnitude index into {0, .5, 1, 1.5, 2, 3, 4, 6}).  Packed
 *   FP4 rows hold element 2j in the low nibble and element 2j+1 in the high
 *   nibble of byte j (OCP / DeepSeek-V4 checkpoints / DeepGEMM).
 * - A UE8M0 byte e means 2^(e-127); 255 is NaN; there is no zero.  Four UE8M0
 *   bytes pack into an int32 word little-endian: group 4j+b in byte b of word j.
 * - Sizes are element counts (size_t); shapes are row-major unless a function
 *   says otherwise (the MN-major scale layouts).
 */
#ifndef MMOE_FORMATS_H
#define MMOE_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================ */
/** @name FP8 E4M3FN and E5M2 (fmt_fp8.c)                                                      */
/* ============================================================================================ */
/** @{ */

/** Largest finite E4M3FN value (code 0x7E). */
#define MMOE_FP8_E4M3_MAX 448.0f
/** Largest finite E5M2 value (code 0x7B). */
#define MMOE_FP8_E5M2_MAX 57344.0f

/**
 * fp32 -> E4M3FN, round to nearest even, SATFINITE (CUDA `cvt.rn.satfinite.e4m3x2.f32`):
 * finite values and +-Inf beyond +-448 become +-448 (0x7E / 0xFE); any NaN becomes 0x7F
 * (sign dropped); -0 stays 0x80.
 */
uint8_t mmoe_fp8_e4m3_from_f32(float x);

/**
 * fp32 -> E4M3FN, round to nearest even, NON-saturating (PyTorch `.to(torch.float8_e4m3fn)`,
 * ml_dtypes `float8_e4m3fn`): anything that rounds beyond 448 (|x| > 464, and +-Inf) becomes
 * NaN with the input's sign (0x7F / 0xFF); NaN keeps its sign (0x7F / 0xFF).
 */
uint8_t mmoe_fp8_e4m3_from_f32_nosat(float x);

/** E4M3FN -> fp32 (exact).  0x7F / 0xFF decode to NaN (with sign). */
float mmoe_fp8_e4m3_to_f32(uint8_t b);

/**
 * fp32 -> E5M2, round to nearest even, SATFINITE: overflow and +-Inf become +-57344
 * (0x7B / 0xFB); any NaN becomes 0x7F.
 */
uint8_t mmoe_fp8_e5m2_from_f32(float x);

/**
 * fp32 -> E5M2, round to nearest even, non-saturating (IEEE-like, PyTorch / ml_dtypes):
 * values that round beyond 57344 (|x| >= 61440) become +-Inf (0x7C / 0xFC); NaN becomes
 * 0x7F / 0xFF (sign kept).
 */
uint8_t mmoe_fp8_e5m2_from_f32_nosat(float x);

/** E5M2 -> fp32 (exact).  0x7C/0xFC are +-Inf, 0x7D..0x7F and 0xFD..0xFF NaN. */
float mmoe_fp8_e5m2_to_f32(uint8_t b);

/**
 * The 256-entry E4M3FN decode table (a `static const` array, valid for the program's
 * lifetime): table[b] == mmoe_fp8_e4m3_to_f32(b).
 */
const float *mmoe_fp8_e4m3_table(void);

/** The 256-entry E5M2 decode table: table[b] == mmoe_fp8_e5m2_to_f32(b). */
const float *mmoe_fp8_e5m2_table(void);

/** @} */

/* ============================================================================================ */
/** @name FP4 E2M1 (fmt_fp4.c)                                                                 */
/* ============================================================================================ */
/** @{ */

/** Largest E2M1 magnitude (code 7). */
#define MMOE_FP4_E2M1_MAX 6.0f

/**
 * fp32 -> E2M1 code (low nibble), round to nearest, ties to the even code, saturate to +-6
 * (CUDA `__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)`, SM100
 * `cvt.rn.satfinite.e2m1x2.f32`).  -0 and tiny negatives give code 8 (-0 is kept);
 * +-Inf give 7 / 15; NaN gives 7 (+6).
 */
uint8_t mmoe_fp4_e2m1_from_f32(float x);

/**
 * fp32 -> E2M1 code, DeepGEMM's test reference (`_quantize_to_fp4_e2m1`): the magnitude
 * code counts the strict thresholds 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0 that |x| exceeds
 * (so ties go DOWN, toward zero), the sign bit is set only for a non-zero code (-0 -> 0),
 * and NaN gives 0.
 */
uint8_t mmoe_fp4_e2m1_from_f32_ties_down(float x);

/** E2M1 code (low nibble; the high nibble is ignored) -> fp32.  Code 8 decodes to -0.0f. */
float mmoe_fp4_e2m1_to_f32(uint8_t code);

/**
 * Decode table of packed FP4 bytes: table[2*b] is the value of the low nibble of byte b and
 * table[2*b+1] that of the high nibble (512 floats, `static const`).
 */
const float *mmoe_fp4_e2m1_pair_table(void);

/** Pack two codes into a byte: @p lo (element 2j) in bits 0-3, @p hi (element 2j+1) in bits 4-7. */
uint8_t mmoe_fp4_pack2(uint8_t lo, uint8_t hi);

/**
 * Pack a row of @p k FP4 codes (one per byte, low nibble) into (k+1)/2 bytes, element 2j in
 * the low nibble of byte j.  For odd @p k the high nibble of the last byte is 0.
 */
void mmoe_fp4_pack_row(const uint8_t *codes, size_t k, uint8_t *packed);

/** Inverse of mmoe_fp4_pack_row(): write @p k codes (0..15, one per byte) from (k+1)/2 bytes. */
void mmoe_fp4_unpack_row(const uint8_t *packed, size_t k, uint8_t *codes);

/** @} */

/* ============================================================================================ */
/** @name UE8M0 scale bytes and the scale rules of each library (fmt_ue8m0.c)                  */
/* ============================================================================================ */
/** @{ */

/**
 * Smallest power of two >= |s|, as a biased exponent byte (CUDA `__nv_cvt_float_to_e8m0(s,
 * __NV_SATFINITE, cudaRoundPosInf)`): the sign is ignored; 0 and |s| <= 2^-127 give 0x00;
 * |s| > 2^127 and +-Inf saturate to 0xFE; NaN gives 0xFF.
 */
uint8_t mmoe_ue8m0_from_f32_ceil(float s);

/**
 * DeepGEMM `ceil_to_ue8m0` by bits: e = biased_exponent(|s|) + (mantissa(|s|) != 0), clamped
 * to [1, 254] (minimum scale 2^-126; never byte 0).  NaN and Inf give 254.
 */
uint8_t mmoe_ue8m0_from_f32_ceil_clamped(float s);

/**
 * The same bit formula without any clamp, as an int: biased_exponent(|s|) + (mantissa != 0),
 * in [0, 256] (0 for s = +-0; 1 for every non-zero fp32 subnormal; 255 for Inf; 256 for NaN).
 * This is the SM100 in-kernel rule's exponent before it is stored.
 */
int mmoe_ue8m0_ceil_bits(float s);

/**
 * Largest power of two <= |s| (OCP floor rule; CUDA `cudaRoundZero`, SATFINITE): 0 and
 * subnormals give 0x00, |s| >= 2^127 and Inf give 0xFE, NaN gives 0xFF.
 */
uint8_t mmoe_ue8m0_from_f32_floor(float s);

/**
 * `bits(s) >> 23` truncated to 8 bits: the FP32 -> packed UE8M0 rule of DeepGEMM's
 * `get_mn_major_tma_aligned_packed_ue8m0_tensor`.  Exact for positive powers of two;
 * otherwise it drops the mantissa (rounds down).
 */
uint8_t mmoe_ue8m0_from_f32_trunc(float s);

/** UE8M0 byte -> fp32: 2^(b-127); 255 -> NaN; 0 -> 2^-127 (an fp32 subnormal). */
float mmoe_ue8m0_to_f32(uint8_t b);

/**
 * OCP MX shared exponent: floor(log2(amax)) - @p emax_elem + 127, clamped to [0, 254]
 * (emax_elem: FP4 2, E4M3 8, E5M2 15).  amax = 0 (or subnormal) gives 0 (as ggml stores it);
 * NaN gives 0xFF.
 */
uint8_t mmoe_ue8m0_mx_shared_exp(float amax, int emax_elem);

/** Amax floor of the DeepSeek/DeepGEMM recipes (fp32 nearest to 1e-4). */
#define MMOE_AMAX_EPS 1e-4f

/**
 * Caller-side activation scale of DeepGEMM (`per_token_cast_to_fp8(..., use_ue8m0=True)`,
 * `per_token_cast_to_fp4`): ceil_clamped(fl(max(amax, 1e-4) / fmt_max)), i.e. with the
 * 1e-4 amax clamp and the [1, 254] exponent clamp.  @p fmt_max is 448 (FP8) or 6 (FP4).
 */
uint8_t mmoe_sf_ue8m0_deepgemm(float amax, float fmt_max);

/**
 * DeepSeek-V4 reference `act_quant` scale: ceil_clamped(fl(max(amax, 1e-4) * fl(1/fmt_max)))
 * (multiplication by the rounded reciprocal, as the tilelang kernel does).  Equal to
 * mmoe_sf_ue8m0_deepgemm() for every finite amax (@ref spec_fmt_ue8m0).
 */
uint8_t mmoe_sf_ue8m0_v4(float amax, float fmt_max);

/**
 * DeepSeek-V4 reference `fp4_act_quant` scale (block 32): amax clamped to >= 6*2^-126, then
 * the ceil of fl(amax * fl(1/6)) with the [1, 254] clamp.
 */
uint8_t mmoe_sf_ue8m0_v4_fp4(float amax);

/** fl(1/448) as fp32 bits (0x3B124925), the SM100 requant multiplier. */
#define MMOE_RCP_448_BITS 0x3B124925u

/**
 * SM100 in-kernel requant scale (L1 epilogue, `get_e4m3_sf_and_sf_inv`): s = fl(amax *
 * fl(1/448)); e = ceil bits of s (mmoe_ue8m0_ceil_bits), NO 1e-4 clamp, NO [1, 254] clamp.
 * amax = 0 gives byte 0 and sf_inv = 2^127.  sf_inv = 2^(127 - (byte - 127)) is built from
 * bits.  A non-finite amax gives byte 0xFF and sf_inv NaN.
 * @param amax    max |x| over the block (>= 0)
 * @param sf_inv  if non-NULL, receives the multiplier applied before the E4M3 cast
 * @return the stored scale byte (2^(byte-127) is the scale)
 */
uint8_t mmoe_sf_ue8m0_sm100_requant(float amax, float *sf_inv);

/**
 * SM90 FP32 per-128 activation scale: sf = fl(max(amax, 1e-4) / 448) (correctly rounded
 * division, no power-of-two rounding).  Quantize with q = e4m3(x * fl(1/sf)).
 */
float mmoe_sf_f32_sm90(float amax);

/** Pack @p n scale bytes into ceil(n/4) int32 words, group 4j+b in byte b; missing bytes are 0. */
void mmoe_ue8m0_pack_words(const uint8_t *bytes, size_t n, int32_t *words);

/** Inverse of mmoe_ue8m0_pack_words(): write @p n bytes from ceil(n/4) words. */
void mmoe_ue8m0_unpack_words(const int32_t *words, size_t n, uint8_t *bytes);

/** @} */

/* ============================================================================================ */
/** @name BF16 (fmt_bf16.c)                                                                    */
/* ============================================================================================ */
/** @{ */

/**
 * fp32 -> bf16 bits, round to nearest even (FLT_MAX rounds to Inf); NaN stays NaN and is
 * quieted: the result is (u >> 16) | 0x0040 with the input's sign (0x7F800001 -> 0x7FC0).
 */
uint16_t mmoe_bf16_from_f32(float x);

/** bf16 bits -> fp32 (exact: bits << 16). */
float mmoe_bf16_to_f32(uint16_t h);

/** fp32 -> nearest bf16 value, returned as fp32 (mmoe_bf16_to_f32(mmoe_bf16_from_f32(x))). */
float mmoe_bf16_round(float x);

/** Convert @p n floats to bf16 (RNE). */
void mmoe_bf16_from_f32_row(const float *x, size_t n, uint16_t *out);

/** Convert @p n bf16 values to floats. */
void mmoe_bf16_to_f32_row(const uint16_t *h, size_t n, float *out);

/** @} */

/* ============================================================================================ */
/** @name Row quantizers and dequantizers (fmt_quant.c)                                        */
/* ============================================================================================ */
/** @{ */

/** Which rule turns a block's amax into its UE8M0 scale, and how elements are scaled. */
typedef enum mmoe_sf_rule {
    /** DeepGEMM caller side: mmoe_sf_ue8m0_deepgemm(); q = e4m3(x * (1/sf)). */
    MMOE_SF_RULE_DEEPGEMM = 0,
    /** SM100 L1-epilogue requant: mmoe_sf_ue8m0_sm100_requant(); q = e4m3(x * sf_inv). */
    MMOE_SF_RULE_SM100_REQUANT = 1,
    /** DeepSeek-V4 reference `act_quant`: mmoe_sf_ue8m0_v4(); q = e4m3(clamp(x / sf, +-448)). */
    MMOE_SF_RULE_V4 = 2
} mmoe_sf_rule;

/** Rounding of the FP4 element quantizer. */
typedef enum mmoe_fp4_rounding {
    MMOE_FP4_RNE = 0,       /**< mmoe_fp4_e2m1_from_f32(): nearest even, saturating (hardware) */
    MMOE_FP4_TIES_DOWN = 1  /**< mmoe_fp4_e2m1_from_f32_ties_down(): DeepGEMM test reference */
} mmoe_fp4_rounding;

/**
 * Quantize a row of @p k floats to E4M3 with one UE8M0 scale per @p block elements.
 * @param x      k input values
 * @param k      row length; must be a positive multiple of @p block
 * @param block  32 or 128 (any positive value is accepted)
 * @param rule   the scale rule (see ::mmoe_sf_rule)
 * @param q      k E4M3 codes (output)
 * @param sf     k/block UE8M0 bytes (output)
 * @param err    may be NULL
 * @return MMOE_OK, or MMOE_EINVAL (k not a multiple of block, block 0, NULL pointer); on
 *         error nothing is written
 */
mmoe_status mmoe_quant_row_fp8_ue8m0(const float *x, size_t k, size_t block, mmoe_sf_rule rule,
                                     uint8_t *q, uint8_t *sf, mmoe_error *err);

/** 1x32 UE8M0 FP8 row quantizer with the DeepGEMM rule (SM100 caller-side input x). */
mmoe_status mmoe_quant_row_fp8_1x32_ue8m0(const float *x, size_t k, uint8_t *q, uint8_t *sf,
                                          mmoe_error *err);

/** 1x128 UE8M0 FP8 row quantizer with the DeepGEMM rule (V4 linear-layer activations). */
mmoe_status mmoe_quant_row_fp8_1x128_ue8m0(const float *x, size_t k, uint8_t *q, uint8_t *sf,
                                           mmoe_error *err);

/**
 * 1x128 FP32-scale FP8 row quantizer (SM90): sf = mmoe_sf_f32_sm90(amax),
 * q = e4m3(x * fl(1/sf)).
 * @param x    k input values
 * @param k    row length, a positive multiple of 128
 * @param q    k E4M3 codes (output)
 * @param sf   k/128 fp32 scales (output)
 * @param err  may be NULL
 * @return MMOE_OK or MMOE_EINVAL (k not a positive multiple of 128); nothing written on error
 */
mmoe_status mmoe_quant_row_fp8_1x128_f32(const float *x, size_t k, uint8_t *q, float *sf,
                                         mmoe_error *err);

/**
 * MXFP4 row quantizer, 1x32 UE8M0 (DeepGEMM `per_token_cast_to_fp4`):
 * sf = mmoe_sf_ue8m0_deepgemm(amax, 6), code = fp4(x * (1/sf)) with @p rounding.
 * @param x         k input values
 * @param k         row length, a positive multiple of 32
 * @param rounding  MMOE_FP4_RNE (hardware) or MMOE_FP4_TIES_DOWN (DeepGEMM reference)
 * @param packed    k/2 bytes of packed codes, element 2j in the low nibble (output)
 * @param sf        k/32 UE8M0 bytes (output)
 * @param err       may be NULL
 * @return MMOE_OK or MMOE_EINVAL (k not a positive multiple of 32, unknown rounding)
 */
mmoe_status mmoe_quant_row_fp4_1x32_ue8m0(const float *x, size_t k, mmoe_fp4_rounding rounding,
                                          uint8_t *packed, uint8_t *sf, mmoe_error *err);

/**
 * Quantize a weight matrix to FP8 E4M3 with 2-D UE8M0 block scales (the checkpoint's FP8
 * weight format): for every block_n x block_k tile, sf = mmoe_sf_ue8m0_deepgemm(amax of the
 * tile, 448) and q = e4m3(w * (1/sf)) (::MMOE_SF_RULE_DEEPGEMM on a tile instead of a row).
 * Tiles at the bottom and right edges cover the remaining rows and columns when n or k is
 * not a multiple of the block.  A NaN makes its tile's amax NaN (scale 254, code 0x7F).
 * @param w        n x k floats, row-major
 * @param n        rows (output features); 0 quantizes nothing
 * @param k        columns (input features); 0 quantizes nothing
 * @param block_n  rows of a tile, > 0 (128 for DeepSeek-V4)
 * @param block_k  columns of a tile, > 0 (128 for DeepSeek-V4)
 * @param q        n x k E4M3 codes, row-major (output)
 * @param sf       ceil(n/block_n) x ceil(k/block_k) UE8M0 bytes, row-major (output)
 * @param err      may be NULL
 * @return MMOE_OK, or MMOE_EINVAL (NULL pointer, zero block); on error nothing is written
 */
mmoe_status mmoe_quant_fp8_weight_blocks(const float *w, size_t n, size_t k, size_t block_n, size_t block_k,
                                        uint8_t *q, uint8_t *sf, mmoe_error *err);

/**
 * Dequantize an MXFP4 row: out[i] = e2m1(code i) * 2^(sf[i/32]-127) (exact products).
 * @param packed  k/2 bytes of packed codes
 * @param sf      k/32 UE8M0 bytes
 * @param k       row length, a positive multiple of 32
 * @param out     k floats (output)
 * @param err     may be NULL
 * @return MMOE_OK or MMOE_EINVAL (k not a positive multiple of 32)
 */
mmoe_status mmoe_dequant_row_mxfp4(const uint8_t *packed, const uint8_t *sf, size_t k, float *out,
                                   mmoe_error *err);

/**
 * Dequantize an E4M3 row with one scale per @p block elements: out[i] = e4m3(q[i]) *
 * scale[i/block], an fp32 product.  The last block may be partial (ceil(k/block) scales).
 * @param q         k E4M3 codes
 * @param sf        the scales: fp32 (MMOE_DT_F32) or UE8M0 bytes (MMOE_DT_F8_E8M0)
 * @param sf_dtype  MMOE_DT_F32 or MMOE_DT_F8_E8M0
 * @param k         row length
 * @param block     elements per scale (> 0)
 * @param out       k floats (output)
 * @param err       may be NULL
 * @return MMOE_OK, MMOE_EINVAL (block 0, NULL pointer) or MMOE_EDTYPE (other sf_dtype)
 */
mmoe_status mmoe_dequant_row_fp8(const uint8_t *q, const void *sf, mmoe_dtype sf_dtype, size_t k,
                                 size_t block, float *out, mmoe_error *err);

/**
 * Dequantize row @p row of an E4M3 weight [n, k] with 2-D block scales
 * [ceil(n/block), ceil(k/block)] (block 128 for V4, 32 for V4.1): out[j] = w[row, j] *
 * sf[row/block, j/block].
 * @return MMOE_OK, MMOE_EINVAL (row >= n, block 0) or MMOE_EDTYPE
 */
mmoe_status mmoe_dequant_fp8_weight_row(const uint8_t *w, size_t n, size_t k, size_t row,
                                        const void *sf, mmoe_dtype sf_dtype, size_t block,
                                        float *out, mmoe_error *err);

/** @} */

/* ============================================================================================ */
/** @name Scale and weight layout transforms (fmt_layout.c)                                    */
/* ============================================================================================ */
/** @{ */

/** Round @p x up to a multiple of @p a (a > 0). */
size_t mmoe_align_up(size_t x, size_t a);

/**
 * Number of int32 words of the MN-major TMA-aligned packed UE8M0 tensor for @p g groups,
 * @p mn rows and @p ksf scales per row: g * ceil(ksf/4) * align(mn, 4).
 */
size_t mmoe_sf_mn_major_words(size_t g, size_t mn, size_t ksf);

/**
 * MN-major, TMA-aligned packed UE8M0 (`transform_sf_into_required_layout`, SM100): from
 * row-major bytes [g, mn, ksf] to int32 [g, mn, P] (P = ceil(ksf/4)) with strides
 * (P*A, 1, A), A = align(mn, 4): word (gi, r, p) is at out[gi*P*A + p*A + r] and holds the
 * bytes of groups 4p..4p+3 little-endian.  Padding (rows mn..A-1, bytes past ksf) is 0.
 * @p out has mmoe_sf_mn_major_words() words.
 */
void mmoe_sf_pack_mn_major(const uint8_t *sf, size_t g, size_t mn, size_t ksf, int32_t *out);

/** The same from fp32 power-of-two scales [g, mn, ksf], each byte by mmoe_ue8m0_from_f32_trunc(). */
void mmoe_sf_pack_mn_major_f32(const float *sf, size_t g, size_t mn, size_t ksf, int32_t *out);

/** Inverse of mmoe_sf_pack_mn_major(): bytes [g, mn, ksf] from the packed tensor. */
void mmoe_sf_unpack_mn_major(const int32_t *in, size_t g, size_t mn, size_t ksf, uint8_t *sf);

/** UTCCP 4x32 transpose within a 128-row group: r' = 4*(r%32) + (r/32)%4 (plus the group base). */
size_t mmoe_utccp_row(size_t r);

/** Inverse of mmoe_utccp_row(): r = 32*(r'%4) + (r'%128)/4 (plus the group base). */
size_t mmoe_utccp_row_inv(size_t r);

/**
 * Apply the UTCCP row permutation to an MN-major packed tensor (as made by
 * mmoe_sf_pack_mn_major(); mn must be a multiple of 128, so A = mn): out word (gi, r', p) =
 * in word (gi, r, p).  @p in and @p out must not overlap.
 * @return MMOE_OK or MMOE_EINVAL (mn not a multiple of 128)
 */
mmoe_status mmoe_sf_utccp_transpose(const int32_t *in, size_t g, size_t mn, size_t ksf,
                                    int32_t *out, mmoe_error *err);

/** Inverse of mmoe_sf_utccp_transpose(). */
mmoe_status mmoe_sf_utccp_untranspose(const int32_t *in, size_t g, size_t mn, size_t ksf,
                                      int32_t *out, mmoe_error *err);

/**
 * Activation-SF pool row of token @p m for M-blocks of @p block_m tokens (@ref
 * spec_fmt_sm100_layouts): (m / BM) * align(BM, 128) + (i & ~127) + (i % 32) * 4 + (i / 32) % 4, i = m % BM.
 */
size_t mmoe_sf_pool_row(size_t m, size_t block_m);

/**
 * Inverse of mmoe_sf_pool_row(): the token whose SF lives in pool row @p row.
 * @return 1 and *m, or 0 when the row is a padding row of its block (no token maps to it)
 */
int mmoe_sf_pool_token(size_t row, size_t block_m, size_t *m);

/** Number of pool rows for @p num_tokens tokens: ceil(T/BM) * align(BM, 128). */
size_t mmoe_sf_pool_rows(size_t num_tokens, size_t block_m);

/**
 * Scatter row-major (K-major) packed activation SFs x_sf int32 [t, p] into the MN-major pool:
 * word (row, kp) at pool[kp * num_sf_rows + row], row = mmoe_sf_pool_row(m, block_m).
 * Padding rows of the used blocks get the last token's words when @p pad_with_last is
 * non-zero (vLLM `_copy_fp8_sf`), else 0; other pool words are left untouched.
 * @return MMOE_OK or MMOE_EINVAL (num_sf_rows < mmoe_sf_pool_rows(t, block_m), block_m 0)
 */
mmoe_status mmoe_sf_to_pool(const int32_t *x_sf, size_t t, size_t p, size_t block_m,
                            size_t num_sf_rows, int pad_with_last, int32_t *pool,
                            mmoe_error *err);

/** Inverse of mmoe_sf_to_pool(): gather x_sf [t, p] from the pool. */
mmoe_status mmoe_sf_from_pool(const int32_t *pool, size_t t, size_t p, size_t block_m,
                              size_t num_sf_rows, int32_t *x_sf, mmoe_error *err);

/**
 * Physical row of logical L1 row @p r (rows [gate 0..I-1 | up 0..I-1]) after the gate/up
 * interleave by 8: gate j -> 16*(j/8) + j%8, up j -> 16*(j/8) + 8 + j%8.
 */
size_t mmoe_l1_interleave_row(size_t r, size_t inter);

/** Inverse of mmoe_l1_interleave_row(). */
size_t mmoe_l1_deinterleave_row(size_t p, size_t inter);

/**
 * Interleave the 2*@p inter rows (each @p row_bytes bytes: packed FP4 weight rows, or their
 * UE8M0 scale rows) of an L1 weight [gate | up] by 8.  @p in and @p out must not overlap.
 * @return MMOE_OK or MMOE_EINVAL (inter not a multiple of 8)
 */
mmoe_status mmoe_l1_interleave(const void *in, size_t inter, size_t row_bytes, void *out,
                               mmoe_error *err);

/** Inverse of mmoe_l1_interleave(). */
mmoe_status mmoe_l1_deinterleave(const void *in, size_t inter, size_t row_bytes, void *out,
                                 mmoe_error *err);

/** @} */

#ifdef __cplusplus
}
#endif
#endif /* MMOE_FORMATS_H */
