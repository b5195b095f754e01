/**
 * @file gpu_quant.cu
 * @brief Activation quantization on the GPU: rows to FP8 E4M3 with per-group scales.
 *
 * Used twice per layer call: on the input x (BF16) and on the L1 output (the
 * FP32 value silu(g)*u*w, the L2 input).  In the decode pipeline one launch
 * requantizes the routed and the shared intermediates together; at the fewest
 * tokens the L1 GEMM requantizes its own output instead, with the same device
 * steps (gpu_quant.cuh, gpu_decode.cu).  One warp handles one 128-channel chunk
 * of one row; each lane holds four consecutive channels.  The kernels take part
 * in programmatic dependent launch: they wait for the kernel before them and let
 * the next one start its blocks at once.
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
#include "gpu_quant.cuh"
#include "gpu_decode16_map.h"

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
    cudaError_t e = mmoe_launch_pdl(requant_decode_kernel<MODE>, dim3(blocks), dim3(256), 0, stream, routed, routed_rows,
                                    topk_idx, I, shared, shared_rows, SI, routed_q, routed_s, shared_q, shared_s);
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

/**
 * One 32-group of E4M3 bytes per thread to its 32 F16 values in the wgmma kernel's K order
 * (mmoe_d16_wg_widen_group, gpu_decode16_map.h, whose CPU model a suite checks).
 */
__global__ void widen_e4m3_kernel(const uint4 *q, long long groups, uint4 *out)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= groups)
        return;
    const uint4 x0 = q[2 * i], x1 = q[2 * i + 1];
    const uint32_t w[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    uint32_t h[16];
    mmoe_d16_wg_widen_group(w, h);
#pragma unroll
    for (int c = 0; c < 4; c++)
        out[4 * i + c] = make_uint4(h[4 * c], h[4 * c + 1], h[4 * c + 2], h[4 * c + 3]);
}

cudaError_t mmoe_launch_widen_e4m3(const uint8_t *q, long long n, uint16_t *out, cudaStream_t stream)
{
    const long long groups = n / 32;
    if (groups == 0)
        return cudaSuccess;
    const int threads = 256;
    widen_e4m3_kernel<<<(unsigned)((groups + threads - 1) / threads), threads, 0, stream>>>(
        reinterpret_cast<const uint4 *>(q), groups, reinterpret_cast<uint4 *>(out));
    return cudaGetLastError();
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
