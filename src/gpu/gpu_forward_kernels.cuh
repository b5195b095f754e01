/**
 * @file gpu_forward_kernels.cuh
 * @brief Device building blocks of the GPU forward: number formats and the rounding helpers.
 *
 * Every fp32 operation of the oracle's recipe that is followed by a rounding is written here
 * with an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, ...), so that
 * the compiler cannot contract a multiply and an add into one FMA: the oracle (plain C11,
 * no contraction) rounds after each.  Double accumulations of exact products may use FMA: an
 * exact product is the same whether rounded alone or inside the FMA.
 *
 * The E4M3 decode table is the oracle's (uploaded to constant memory at model creation);
 * E4M3 encoding is CUDA's round-to-nearest-even conversion with saturation; E2M1 encoding
 * is written out (nearest, ties to the even code, saturating, sign kept).
 */
#ifndef MMOE_GPU_FORWARD_KERNELS_CUH
#define MMOE_GPU_FORWARD_KERNELS_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "gpu_pdl.cuh"
#include "mmoe_sum_order.h"

/** bf16 bits -> fp32 (exact). */
__device__ __forceinline__ float gfw_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/** fp32 -> bf16 bits, round to nearest even; NaN keeps its sign and becomes quiet (the oracle's rule). */
__device__ __forceinline__ uint16_t gfw_f2bf(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/** Round fp32 to bf16 and back. */
__device__ __forceinline__ float gfw_bfr(float f) { return gfw_bf2f(gfw_f2bf(f)); }

/** UE8M0 byte -> fp32: 2^(b-127); 0 -> 2^-127; 255 -> NaN. */
__device__ __forceinline__ float gfw_ue8m0(uint8_t b)
{
    if (b == 255)
        return __uint_as_float(0x7FC00000u);
    if (b == 0)
        return __uint_as_float(0x00400000u);
    return __uint_as_float((uint32_t)b << 23);
}

/** Biased exponent of the smallest power of two >= |s|, clamped to [1, 254]. */
__device__ __forceinline__ uint8_t gfw_ue8m0_ceil_clamped(float s)
{
    uint32_t ua = __float_as_uint(s) & 0x7FFFFFFFu;
    int e = (int)(ua >> 23) + ((ua & 0x7FFFFFu) != 0);
    e = e < 1 ? 1 : (e > 254 ? 254 : e);
    return (uint8_t)e;
}

/**
 * 1 / gfw_ue8m0(@p e) for a byte of gfw_ue8m0_ceil_clamped() (1 <= e <= 254): 2^(127-e), an
 * exact float (2^-127, for e = 254, is subnormal; the byte 254 - e is never 255), so that
 * x / s may be computed as x * (1/s) with the same bits.  Proof: IEEE division and
 * multiplication both return the exact result rounded to nearest even, and the exact
 * quotient x / 2^(e-127) equals the exact product x * 2^(127-e); the special operands agree too
 * (+-0 and +-inf keep their sign and kind, a NaN stays a NaN, whose E4M3 code is 0x7F either way
 * since the conversion ignores a NaN's sign).  The scale byte 255 (NaN) never reaches here.
 */
__device__ __forceinline__ float gfw_ue8m0_inv(uint8_t e) { return gfw_ue8m0((uint8_t)(254 - e)); }

/** Whether @p p may be read or written as one 16-byte vector. */
__host__ __device__ __forceinline__ bool gfw_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/**
 * The 16 bf16 values held by @p a, @p b (ascending) as fp32; value 2i is the low half of 32-bit
 * word i (little-endian), value 2i + 1 its high half.
 */
__device__ __forceinline__ void gfw_bf16x16_to_f32(uint4 a, uint4 b, float *v)
{
    const uint32_t word[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[2 * i] = __uint_as_float(word[i] << 16);
        v[2 * i + 1] = __uint_as_float(word[i] & 0xFFFF0000u);
    }
}

/** The 16 bf16 values at @p p (16-byte aligned) as fp32, in two 16-byte loads. */
__device__ __forceinline__ void gfw_load_bf16x16(const uint16_t *p, float *v)
{
    gfw_bf16x16_to_f32(((const uint4 *)p)[0], ((const uint4 *)p)[1], v);
}

/** The 16 floats at @p p (16-byte aligned), in four 16-byte loads. */
__device__ __forceinline__ void gfw_load_f32x16(const float *p, float *v)
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float4 f = ((const float4 *)p)[j];
        v[4 * j] = f.x;
        v[4 * j + 1] = f.y;
        v[4 * j + 2] = f.z;
        v[4 * j + 3] = f.w;
    }
}

/** Store the 16 bf16 bit patterns @p h at @p p (16-byte aligned) in two 16-byte stores. */
__device__ __forceinline__ void gfw_store_bf16x16(uint16_t *p, const uint16_t *h)
{
    uint32_t word[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        word[i] = (uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
    ((uint4 *)p)[0] = make_uint4(word[0], word[1], word[2], word[3]);
    ((uint4 *)p)[1] = make_uint4(word[4], word[5], word[6], word[7]);
}

/** E4M3 code of @p v: nearest even, saturating to +-448. */
__device__ __forceinline__ uint8_t gfw_e4m3_code(float v)
{
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/**
 * E4M3 code -> fp32 value by the hardware's exact E4M3 -> F16 conversion (NaN codes give the
 * F16 conversion's NaN): the MoE input's quantized values, written by gpu_fwd_moe.cu's k_moe_in
 * and by the norm before the MoE (gpu_forward.cu), the same bits from both.
 */
__device__ __forceinline__ float gfw_e4m3_to_f32(uint32_t code)
{
    const __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E4M3);
    return __half2float(__half(hr));
}

/**
 * Offset of element @p k in a chain-major row of width @p K, the layout of the MoE kernels'
 * inputs (gpu_fwd_moe.cu): chain k mod 8, then k / 8.
 */
__device__ __forceinline__ int64_t gfw_moe_chain_pos(int64_t k, int64_t K) { return (k & 7) * (K / 8) + (k >> 3); }

/** Magnitudes of the eight E2M1 codes. */
__device__ __forceinline__ float gfw_e2m1_mag(int c)
{
    const float t[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return t[c & 7];
}

/** Signed value of an E2M1 nibble (code 8 is -0). */
__device__ __forceinline__ float gfw_e2m1_value(int n) { return (n & 8) ? -gfw_e2m1_mag(n) : gfw_e2m1_mag(n); }

/** E2M1 round trip of @p v (|v| <= 6 expected): nearest, ties to the even code, sign kept. */
__device__ __forceinline__ float gfw_e2m1_round(float v)
{
    const float a = fabsf(v);
    float m;
    if (a <= 0.25f) m = 0.0f;
    else if (a < 0.75f) m = 0.5f;
    else if (a <= 1.25f) m = 1.0f;
    else if (a < 1.75f) m = 1.5f;
    else if (a <= 2.5f) m = 2.0f;
    else if (a < 3.5f) m = 3.0f;
    else if (a <= 5.0f) m = 4.0f;
    else m = 6.0f;
    return copysignf(m, v);
}

/**
 * The 32-entry table of gfw_expf(): bits of 2^(i/32) minus i << 47 (so that adding k << 47 scales
 * by 2^(k/32)); filled at model creation from exp_table() (gpu_forward.cu).  Every CUDA file that
 * includes this header holds its own copy, and each copy must be filled (gpu_forward.cu fills
 * its own and, through gfw_moe_upload_tables(), gpu_fwd_moe.cu's): an unfilled copy makes
 * gfw_expf() return garbage, NaN for negative arguments.
 */
__constant__ unsigned long long c_exp2_tab[32];

/**
 * expf as the host's C library computes it (glibc's expf, the variant for CPUs with FMA, which the
 * oracle's machines have), so that the device reproduces the oracle's fp32 exp bit for bit:
 * with N = 32, z = x * N/ln2 is split into an integer k (rounded through the 1.5 * 2^52 shift)
 * and r = z - k in [-1/2, 1/2]; exp(x) = 2^(k/N) * p(r) with 2^(k/N) from the table and
 * p(r) = C0 r^3 + C1 r^2 + C2 r + 1, everything in double with the fused multiply-adds of that
 * build, and one rounding to fp32 at the end.  +-inf and NaN are answered first.  A C library
 * without this algorithm makes the comparison of the exp-based blocks bounded rather than exact.
 */
__device__ __forceinline__ float gfw_expf(float x)
{
    if (isnan(x))
        return x + x;
    if (isinf(x))
        return x > 0.0f ? x : 0.0f;
    const double inv_ln2_n = 0x1.71547652b82fep+0 * 32, shift = 0x1.8p+52;
    const double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32, c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32,
                 c2 = 0x1.62e42ff0c52d6p-1 / 32;
    const double xd = (double)x;
    double kd = fma(inv_ln2_n, xd, shift);
    const unsigned long long ki = (unsigned long long)__double_as_longlong(kd);
    kd = __dsub_rn(kd, shift);
    const double r = fma(inv_ln2_n, xd, -kd);
    const unsigned long long t = c_exp2_tab[ki % 32] + (ki << 47);
    const double s = __longlong_as_double((long long)t);
    const double z = fma(c0, r, c1);
    const double r2 = __dmul_rn(r, r);
    double y = fma(c2, r, 1.0);
    y = fma(z, r2, y);
    y = __dmul_rn(y, s);
    return __double2float_rn(y);
}

/** 1 / (1 + exp(-z)) with IEEE operations. */
__device__ __forceinline__ float gfw_sigmoid(float z) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, gfw_expf(-z))); }

/* ------------------------------------------------------------------ the order of the double sums */

/**
 * Butterfly over an aligned group of @p G lanes (a power of two <= 32): lane i adds lane i xor s
 * for s = 1, 2, .., G/2, so every lane of the group ends with the pairwise tree of the group's
 * values (@ref spec_arch_sum_order; x + y = y + x exactly).  Every lane of the warp must call it.
 */
__device__ __forceinline__ double gfw_group_pairwise(double v, int G)
{
    for (int s = 1; s < G; s <<= 1)
        v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, s));
    return v;
}

/** Chunk @p k of the n terms term(i): ascending from +0 (mmoe_sum_order.h, step 1). */
template <class Term>
__device__ __forceinline__ double gfw_chunk_sum(const Term &term, int64_t k, int64_t n)
{
    const int64_t i0 = k * MMOE_SUM_CHUNK;
    double c = 0.0;
    if (i0 + MMOE_SUM_CHUNK <= n) {
#pragma unroll
        for (int i = 0; i < MMOE_SUM_CHUNK; i++)
            c = __dadd_rn(c, term(i0 + i));
    } else {
        for (int64_t i = i0; i < n; i++)
            c = __dadd_rn(c, term(i));
    }
    return c;
}

/** The tree node over the aligned run of @p r chunks (a power of two) from chunk @p k0; +0 beyond the end. */
template <class Term>
__device__ __forceinline__ double gfw_run_sum(const Term &term, int64_t k0, int64_t r, int64_t n)
{
    if (r == 1)
        return gfw_chunk_sum(term, k0, n);
    const int64_t m = (n + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK;
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    for (int64_t k = k0; k < k0 + r && k < m; k++)
        mmoe_pairwise_push(&pw, gfw_chunk_sum(term, k, n));
    return mmoe_pairwise_result(&pw);
}

/** Chunks per lane when @p lanes lanes (a power of two) share the m chunks of n terms. */
__device__ __forceinline__ int64_t gfw_chunks_per_lane(int64_t n, int64_t lanes)
{
    const int64_t m = (n + MMOE_SUM_CHUNK - 1) / MMOE_SUM_CHUNK;
    int64_t M = 1;
    while (M < m)
        M <<= 1;
    return M > lanes ? M / lanes : 1;
}

/** The spec's sum of term(0 .. n-1) by an aligned group of G lanes (g = lane in group); all G lanes get it. */
template <class Term>
__device__ __forceinline__ double gfw_group_sum(const Term &term, int64_t n, int g, int G)
{
    const int64_t r = gfw_chunks_per_lane(n, G);
    return gfw_group_pairwise(gfw_run_sum(term, (int64_t)g * r, r, n), G);
}

/**
 * Barrier @p id for the first @p nt threads of the block (a multiple of 32): __syncthreads()
 * for id 0 and nt = blockDim.x; a named barrier otherwise, which the block's other warps do not
 * wait for.
 */
__device__ __forceinline__ void gfw_bar(int id, int nt)
{
    if (id == 0)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nt) : "memory");
}

/**
 * The tree above the values @p v of the first @p B threads of the block (B a multiple of 32 up
 * to 1024; thread b holds node b of one level, the nodes past the level's last are +0),
 * returned to each of them; they synchronize on barrier @p bar_id (gfw_bar(): 0 when B is the
 * whole block).  @p sh: 33 doubles of shared memory.  Level one is each warp's pairwise tree,
 * level two the tree over the B / 32 warp sums padded with +0 to 32.
 */
__device__ __forceinline__ double gfw_threads_tree(double v, double *sh, int B, int bar_id)
{
    const int b = threadIdx.x;
    v = gfw_group_pairwise(v, 32);
    if ((b & 31) == 0)
        sh[b >> 5] = v;
    gfw_bar(bar_id, B);
    if (b < 32) {
        v = gfw_group_pairwise(b < B / 32 ? sh[b] : 0.0, 32);
        if (b == 0)
            sh[32] = v;
    }
    gfw_bar(bar_id, B);
    v = sh[32];
    gfw_bar(bar_id, B);
    return v;
}

/**
 * The tree above the values @p v of the block's threads (blockDim.x a power of two, 32..1024;
 * thread b holds node b of one level), returned to every thread.  @p sh: 33 doubles of shared
 * memory.  Contains __syncthreads().
 */
__device__ __forceinline__ double gfw_block_tree(double v, double *sh)
{
    return gfw_threads_tree(v, sh, (int)blockDim.x, 0);
}

/**
 * The spec's sum of term(0 .. n-1) by the whole block (blockDim.x a power of two, 32..1024),
 * returned to every thread.  @p sh: 33 doubles of shared memory.  Contains __syncthreads().
 */
template <class Term>
__device__ __forceinline__ double gfw_block_sum(const Term &term, int64_t n, double *sh)
{
    const int64_t r = gfw_chunks_per_lane(n, blockDim.x);
    return gfw_block_tree(gfw_run_sum(term, (int64_t)threadIdx.x * r, r, n), sh);
}

/** Warp maximum of non-negative values where any NaN wins (the FP8 scale rule: a NaN amax). */
__device__ __forceinline__ float gfw_warp_amax_nan(float a)
{
    for (int s = 16; s > 0; s >>= 1) {
        const float o = __shfl_xor_sync(0xFFFFFFFFu, a, s);
        a = isnan(a) ? a : (isnan(o) ? o : (o > a ? o : a));
    }
    return a;
}

/** Warp maximum of non-negative values, NaN ignored (the FP4 scale rule). */
__device__ __forceinline__ float gfw_warp_amax(float a)
{
    a = a > 0.0f ? a : 0.0f; /* NaN -> 0, never wins */
    for (int s = 16; s > 0; s >>= 1) {
        const float o = __shfl_xor_sync(0xFFFFFFFFu, a, s);
        a = o > a ? o : a;
    }
    return a;
}

/**
 * The MoE combine of channel @p c of token @p t (moe_combine.c, the dsv4-ref order): the slot
 * rows of the token's unmasked slots (idx >= 0) in ascending expert id, ties in slot order, then
 * the shared expert's row (row T k + t, when @p has_shared), added in fp32 from +0 and rounded
 * to bf16 (the bits returned).  slot_y holds the bf16 rows [T k (+ T), D].  One place for the
 * combine kernel (gpu_fwd_moe.cu) and for the hc_post that combines (gpu_forward.cu).
 */
__device__ __forceinline__ uint16_t gfw_moe_combine_channel(const uint16_t *slot_y, const int32_t *idx, int64_t T,
                                                            int k, int64_t D, int has_shared, int64_t t, int64_t c)
{
    int visit[32];
    int n = 0;
    for (int s = 0; s < k; s++) {
        if (idx[t * k + s] < 0)
            continue;
        int pos = n++;
        while (pos > 0 && idx[t * k + visit[pos - 1]] > idx[t * k + s]) {
            visit[pos] = visit[pos - 1];
            pos--;
        }
        visit[pos] = s;
    }
    float acc = 0.0f;
    for (int v = 0; v < n; v++)
        acc = __fadd_rn(acc, gfw_bf2f(slot_y[(t * k + visit[v]) * D + c]));
    if (has_shared)
        acc = __fadd_rn(acc, gfw_bf2f(slot_y[(T * k + t) * D + c]));
    return gfw_f2bf(acc);
}

/**
 * Ask the L2 for the 128-byte line that holds @p p (global memory) without waiting for it: a
 * kernel's parameters, which no kernel writes, requested before its programmatic wait.
 */
__device__ __forceinline__ void gfw_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(p)));
}

/**
 * The first step of every forward kernel.  The forward launches each of its kernels with
 * mmoe_launch_pdl() (programmatic dependent launch, gpu_pdl.cuh), so a kernel's blocks may be
 * dispatched while the kernel before it still runs: they first wait for it to complete (its
 * results visible), and only then let the kernel after them be launched.  So at most one
 * kernel waits ahead of the one that works, the kernels run one after the other as written,
 * each reading what the one before wrote, and what the attribute removes is the gap between
 * one kernel's end and the next one's first instructions (a step of the decode graph is about
 * 65 kernels, most of a few microseconds).
 */
__device__ __forceinline__ void gfw_pdl_enter()
{
    mmoe_grid_dependency_wait();
    mmoe_grid_launch_dependents();
}

#endif /* MMOE_GPU_FORWARD_KERNELS_CUH */
