/**
 * @file gpu_quant.cuh
 * @brief The device steps of the activation quantizer (the scale rules of gpu_quant.cu's
 *        chapter): one warp quantizes one 128-channel chunk of one row.
 *
 * Shared by the quantization kernels (gpu_quant.cu) and the decode GEMM, whose L1 launch
 * requantizes its own output (gpu_decode.cu): both store the same bytes and scales for the
 * same FP32 row.  No FMA contraction is allowed here: every product uses __fmul_rn.
 */
#ifndef MMOE_GPU_QUANT_CUH
#define MMOE_GPU_QUANT_CUH

#include "gpu_internal.cuh"

/** The E4M3 byte of x, round to nearest even, saturating to +-448 (cvt.rn.satfinite). */
__device__ __forceinline__ uint8_t e4m3_rn_sat(float x)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/** SM90: FP32 scale of a group with maximum magnitude amax, and its rounded reciprocal. */
__device__ __forceinline__ void scale_sm90(float amax, float *sf, float *inv)
{
    *sf = __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f);
    *inv = __frcp_rn(*sf);
}

/** SM100 input rule: ceil to a power of two of max(amax,1e-4)/448, exponent clamped to [1,254]. */
__device__ __forceinline__ void scale_sm100_input(float amax, float *sf, float *inv)
{
    float s = __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f);
    uint32_t bits = __float_as_uint(s);
    int e = (int)((bits >> 23) & 0xffu) + ((bits & 0x7fffffu) != 0u);
    e = e < 1 ? 1 : (e > 254 ? 254 : e);
    *sf = __uint_as_float((uint32_t)e << 23);
    *inv = __fdiv_rn(1.0f, *sf); /* exact: the reciprocal of a power of two */
}

/** SM100 kernel requant rule (get_e4m3_sf_and_sf_inv): no clamps, byte 0 for amax = 0. */
__device__ __forceinline__ void scale_sm100_requant(float amax, float *sf, float *inv)
{
    float s = __fmul_rn(amax, __uint_as_float(0x3B124925u)); /* fl32(1/448) */
    uint32_t bits = __float_as_uint(s);
    int e = (int)((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0u);
    *sf = e >= -126 ? __uint_as_float((uint32_t)(e + 127) << 23) : __uint_as_float(0x00400000u);
    *inv = __uint_as_float((uint32_t)(127 - e) << 23);
}

/** Load four consecutive channels as floats (exact for BF16 and FP32). */
template <typename TIn>
__device__ __forceinline__ void load4(const TIn *p, float v[4]);

/** FP32 input: one 16-byte load. */
template <>
__device__ __forceinline__ void load4<float>(const float *p, float v[4])
{
    float4 f = *reinterpret_cast<const float4 *>(p);
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}

/** BF16 input: one 8-byte load, widened by shifting (bits << 16). */
template <>
__device__ __forceinline__ void load4<__nv_bfloat16>(const __nv_bfloat16 *p, float v[4])
{
    uint2 u = *reinterpret_cast<const uint2 *>(p);
    v[0] = __uint_as_float(u.x << 16);
    v[1] = __uint_as_float(u.x & 0xffff0000u);
    v[2] = __uint_as_float(u.y << 16);
    v[3] = __uint_as_float(u.y & 0xffff0000u);
}

/** FP32 input written by other blocks of the running kernel: one 16-byte load through L2 only (ld.global.cg). */
__device__ __forceinline__ void load4_l2(const float *p, float v[4])
{
    float4 f = __ldcg(reinterpret_cast<const float4 *>(p));
    v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
}

/**
 * One warp quantizes the 128 channels [c128, c128 + 128) of row @p row; MODE as in gpu_quant.cu's
 * file comment.  With L2_ONLY (FP32 input only) the row is read through L2 alone, for rows that
 * other blocks of the same kernel have just written.
 */
template <typename TIn, int MODE, bool L2_ONLY = false>
__device__ __forceinline__ void quant_chunk(const TIn *in, long long row, int c128, int cols, uint8_t *q, float *scales)
{
    const int lane = threadIdx.x & 31;
    const int c0 = c128 + lane * 4;
    float v[4];
    if constexpr (L2_ONLY)
        load4_l2(in + row * cols + c0, v);
    else
        load4<TIn>(in + row * cols + c0, v);
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    /* SM90 reduces over the whole warp (128 channels); the SM100 rules over 8 lanes (32 channels). */
    const int width = MODE == MMOE_QUANT_SM90 ? 32 : 8;
    for (int off = width / 2; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    float sf, inv;
    if (MODE == MMOE_QUANT_SM90)
        scale_sm90(amax, &sf, &inv);
    else if (MODE == MMOE_QUANT_SM100_INPUT)
        scale_sm100_input(amax, &sf, &inv);
    else
        scale_sm100_requant(amax, &sf, &inv);
    uint32_t packed = 0;
    for (int i = 0; i < 4; i++)
        packed |= (uint32_t)e4m3_rn_sat(__fmul_rn(v[i], inv)) << (8 * i);
    *reinterpret_cast<uint32_t *>(q + row * cols + c0) = packed;
    if (MODE == MMOE_QUANT_SM90) {
        if (lane == 0)
            scales[row * (cols >> 7) + (c0 >> 7)] = sf;
    } else if ((lane & 7) == 0) {
        scales[row * (cols >> 5) + (c0 >> 5)] = sf;
    }
}

#endif /* MMOE_GPU_QUANT_CUH */
