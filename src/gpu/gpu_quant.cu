/**
 * @file gpu_quant.cu
 * @brief Activation quantization on the GPU: rows to FP8 E4M3 with per-group scales.
 *
 * Used twice per layer call: on the input x (BF16) and on the L1 output (the
 * FP32 value silu(g)*u*w, the L2 input; in the decode pipeline one launch
 * requantizes the routed and the shared intermediates together).  One warp
 * handles one 128-channel chunk of one row; each lane holds four consecutive
 * channels.  Both kernels take part in programmatic dependent launch: they wait
 * for the kernel before them and let the next one start its blocks at once.
 *
 * Three scale rules, each bit-exact to the oracle (docs/spec/formats.md, UE8M0;
 * docs/spec/moe-layer.md, R1 and R7):
 * - MMOE_QUANT_SM90 (input and intermediate): one FP32 scale per 128 channels,
 *   sf = fl(max(amax, 1e-4) / 448) (IEEE division), then q = e4m3(x * fl(1/sf))
 *   where fl(1/sf) is the correctly rounded reciprocal and the product is
 *   rounded once before the E4M3 cast (RN, satfinite).
 * - MMOE_QUANT_SM100_INPUT: one UE8M0 scale per 32 channels, amax clamped to
 *   1e-4, s = amax/448, exponent e = biased_exp(s) + (mantissa != 0) clamped to
 *   [1, 254] (a ceil to a power of two); q = e4m3(x * 2^(127-e)).
 * - MMOE_QUANT_SM100_REQUANT, the SM100 in-kernel requant: s = amax * fl(1/448) with no clamp at all;
 *   amax = 0 gives the byte 0 (sf = 2^-127, sf_inv = 2^127) and zeros.
 * The stored scale is always the FP32 value of the scale (2^(e-127) for the
 * UE8M0 modes).  No FMA contraction is allowed here: every product uses
 * __fmul_rn so that the compiler cannot fuse it.
 */
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

/** One warp quantizes the 128 channels [c128, c128 + 128) of row @p row; MODE as in the file comment. */
template <typename TIn, int MODE>
__device__ __forceinline__ void quant_chunk(const TIn *in, long long row, int c128, int cols, uint8_t *q, float *scales)
{
    const int lane = threadIdx.x & 31;
    const int c0 = c128 + lane * 4;
    float v[4];
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

/**
 * One warp per (row, 128-channel chunk); MODE as in the file comment.  As the dependent of a
 * programmatic launch it waits for the kernel before it, and it lets the next kernel start at
 * once (both no-ops in a plain launch sequence).
 */
template <typename TIn, int MODE>
__global__ void quant_kernel(const TIn *in, int rows, int cols, uint8_t *q, float *scales)
{
    mmoe_grid_dependency_wait();
    mmoe_grid_launch_dependents();
    const long long chunk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int chunks_per_row = cols >> 7;
    if (chunk >= (long long)rows * chunks_per_row)
        return;
    quant_chunk<TIn, MODE>(in, chunk / chunks_per_row, (int)(chunk % chunks_per_row) * 128, cols, q, scales);
}

/**
 * The decode path's requantization: the routed L1 rows (one per (token, slot) pair; a masked
 * pair's row was never written and is skipped) and then the shared rows, one warp per chunk.
 */
template <int MODE>
__global__ void requant_decode_kernel(const float *routed, int routed_rows, const int32_t *topk_idx, int I,
                                      const float *shared, int shared_rows, int SI, uint8_t *routed_q,
                                      float *routed_s, uint8_t *shared_q, float *shared_s)
{
    mmoe_grid_dependency_wait();
    mmoe_grid_launch_dependents();
    long long chunk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long routed_chunks = (long long)routed_rows * (I >> 7);
    if (chunk < routed_chunks) {
        const long long row = chunk / (I >> 7);
        if (topk_idx[row] >= 0)
            quant_chunk<float, MODE>(routed, row, (int)(chunk % (I >> 7)) * 128, I, routed_q, routed_s);
        return;
    }
    chunk -= routed_chunks;
    if (SI > 0 && chunk < (long long)shared_rows * (SI >> 7))
        quant_chunk<float, MODE>(shared, chunk / (SI >> 7), (int)(chunk % (SI >> 7)) * 128, SI, shared_q, shared_s);
}

/** Launch one instance of requant_decode_kernel with programmatic dependent launch. */
template <int MODE>
static cudaError_t launch_requant_decode_t(unsigned blocks, const float *routed, int routed_rows,
                                           const int32_t *topk_idx, int I, const float *shared, int shared_rows,
                                           int SI, uint8_t *routed_q, float *routed_s, uint8_t *shared_q,
                                           float *shared_s, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, requant_decode_kernel<MODE>, routed, routed_rows, topk_idx, I, shared,
                                       shared_rows, SI, routed_q, routed_s, shared_q, shared_s);
    return e != cudaSuccess ? e : cudaGetLastError();
}

cudaError_t mmoe_launch_requant_decode(const float *routed, int routed_rows, const int32_t *topk_idx, int I,
                                       const float *shared, int shared_rows, int SI, mmoe_quant_mode mode,
                                       uint8_t *routed_q, float *routed_s, uint8_t *shared_q, float *shared_s,
                                       cudaStream_t stream)
{
    const long long warps = (long long)routed_rows * (I / 128) + (long long)shared_rows * (SI / 128);
    if (warps == 0)
        return cudaSuccess;
    const unsigned blocks = (unsigned)((warps + 7) / 8);
    if (mode == MMOE_QUANT_SM90)
        return launch_requant_decode_t<MMOE_QUANT_SM90>(blocks, routed, routed_rows, topk_idx, I, shared, shared_rows,
                                                        SI, routed_q, routed_s, shared_q, shared_s, stream);
    return launch_requant_decode_t<MMOE_QUANT_SM100_REQUANT>(blocks, routed, routed_rows, topk_idx, I, shared,
                                                             shared_rows, SI, routed_q, routed_s, shared_q, shared_s,
                                                             stream);
}

/** Launch quant_kernel for one input type and mode. */
template <typename TIn>
static cudaError_t launch_quant_t(const TIn *in, int rows, int cols, mmoe_quant_mode mode, uint8_t *q, float *scales,
                                  cudaStream_t stream)
{
    long long warps = (long long)rows * (cols / 128);
    if (warps == 0)
        return cudaSuccess;
    const int threads = 256;
    unsigned blocks = (unsigned)((warps + threads / 32 - 1) / (threads / 32));
    if (mode == MMOE_QUANT_SM90)
        quant_kernel<TIn, MMOE_QUANT_SM90><<<blocks, threads, 0, stream>>>(in, rows, cols, q, scales);
    else if (mode == MMOE_QUANT_SM100_INPUT)
        quant_kernel<TIn, MMOE_QUANT_SM100_INPUT><<<blocks, threads, 0, stream>>>(in, rows, cols, q, scales);
    else
        quant_kernel<TIn, MMOE_QUANT_SM100_REQUANT><<<blocks, threads, 0, stream>>>(in, rows, cols, q, scales);
    return cudaGetLastError();
}

cudaError_t mmoe_launch_quant(const __nv_bfloat16 *in_bf16, const float *in_f32, int rows, int cols, mmoe_quant_mode mode,
                              uint8_t *q, float *scales, cudaStream_t stream)
{
    if (in_bf16 != NULL)
        return launch_quant_t<__nv_bfloat16>(in_bf16, rows, cols, mode, q, scales, stream);
    return launch_quant_t<float>(in_f32, rows, cols, mode, q, scales, stream);
}
