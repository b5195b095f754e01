/**
 * @file gpu_wgmma.cuh
 * @brief sm_90a building blocks: wgmma with register A and shared-memory B, mbarriers (also counting bytes of bulk copies), proxy fences, setmaxnreg.
 *
 * **wgmma.**  A warpgroup (4 warps, 128 threads) issues
 * `wgmma.mma_async.m64nNk16.f32.f16.f16`: D (64 x N, FP32, in registers)
 * += A (64 x 16, F16) * B (N x 16, F16)^T.  Here A comes from the threads'
 * registers (the GEMM kernel decodes the weights into them) and B from shared
 * memory through a 64-bit matrix descriptor, K-major: each of the N rows holds
 * its 16 K values contiguously.
 *
 * **The shared-memory layout (128-byte swizzle).**  A tile of R rows x 128
 * bytes of K (64 F16 values: half a K block of the GEMM) is stored row after row, 128 bytes per
 * row, with the 16-byte chunk c of row r placed at chunk position c ^ (r % 8):
 *
 *     byte (r, k)  at  r * 128 + (((k / 16) ^ (r % 8)) * 16) + k % 16
 *
 * Eight rows form a 1024-byte swizzle atom; the tile must start on a 1024-byte
 * boundary.  The descriptor holds the start address / 16, the stride between
 * 8-row groups (SBO = 1024 bytes), and the swizzle mode (1 = 128 B in bits
 * 62-63); the leading-byte offset is unused for a K-major swizzled operand whose
 * K extent fits in the 128-byte row.  The k-th 16-wide F16 slice of the tile is
 * addressed by adding 32 * k bytes to the start address: the hardware applies
 * the XOR to the final address bits, so the slice reads the right chunks.  The
 * swizzle spreads the 8 rows of a core matrix over all 32 banks, for the
 * tensor cores and for the threads that write the tile.
 *
 * **Accumulator layout.**  Thread t of the warpgroup holds, for j = 0..N/8-1,
 * d[4j + 0..3] = D(row, col), D(row, col+1), D(row+8, col), D(row+8, col+1)
 * with row = 16 * (t / 32) + (t % 32) / 4 and col = 8j + 2 * (t % 4).
 *
 * **Ordering.**  `wgmma.fence` before the first wgmma of a batch (the
 * accumulators or the A registers were written by ordinary instructions), `commit_group` after the
 * batch, `wait_group 0` before the accumulators are read.  Shared memory
 * written by ordinary stores or cp.async (the generic proxy) must be made
 * visible to wgmma (the async proxy) with `fence.proxy.async.shared::cta` by
 * the writing thread before it signals the consumers.
 *
 * **mbarriers.**  A 64-bit shared-memory barrier completes a phase when its
 * expected number of arrivals is reached; waiters spin on `try_wait.parity`
 * with the parity of the phase they need (0, 1, 0, ... for the uses of one
 * ring stage).
 */
#ifndef MMOE_GPU_WGMMA_CUH
#define MMOE_GPU_WGMMA_CUH

#include <stdint.h>

namespace {

/** Shared-memory address of a generic pointer, as the 32-bit value the PTX instructions take. */
__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/** Descriptor of a K-major, 128B-swizzled tile of rows x 128 bytes starting at @p smem_addr (1024-aligned). */
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr)
{
    uint64_t d = (uint64_t)((smem_addr & 0x3FFFFu) >> 4);
    d |= (uint64_t)1 << 16;               /* leading-byte offset: unused here, 16 bytes */
    d |= (uint64_t)(1024 >> 4) << 32;     /* stride-byte offset: 8 rows x 128 bytes */
    d |= (uint64_t)1 << 62;               /* 128-byte swizzle */
    return d;
}

/** Byte offset of (row, 16-byte chunk) inside a 128B-swizzled tile. */
__device__ __forceinline__ int sw128_offset(int row, int chunk)
{
    return row * 128 + ((chunk ^ (row & 7)) << 4);
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_wait_all()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

/** Keep the compiler from moving accesses of an accumulator register across a wgmma fence or wait. */
__device__ __forceinline__ void reg_fence(float &r)
{
    asm volatile("" : "+f"(r)::"memory");
}

__device__ __forceinline__ void fence_proxy_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

/** Spin until the phase of parity @p parity of @p bar has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}

/**
 * Give back registers: the warpgroup's warps continue with at most @p N registers per thread
 * (setmaxnreg; the kernel must declare its block size and one block per SM in its launch bounds,
 * so that the compiler knows the count at entry).
 */
template <int N>
__device__ __forceinline__ void warpgroup_reg_dealloc()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

/** Take registers: the warpgroup's warps continue with @p N registers per thread (setmaxnreg). */
template <int N>
__device__ __forceinline__ void warpgroup_reg_alloc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/**
 * The F16 x F16 -> FP32 wgmma of width N (8, 16, 64 or 128 columns) with A from registers: each
 * warp of the warpgroup holds 16 of the 64 rows of A in the m16n8k16 fragment layout (lane
 * (g, t) = (lane / 4, lane % 4): a[0] rows g, k 2t, 2t + 1; a[1] row g + 8, same k; a[2] row
 * g, k 2t + 8, 2t + 9; a[3] row g + 8, same k), B from shared memory, K-major (transpose flag
 * 0).  The A registers must keep their values until the wgmma has completed (wait_group).  The
 * GEMM kernel uses F16 rather than E4M3 operands: the E4M3 form (QGMMA) returns its sums with
 * about 13 mantissa bits, the F16 form keeps FP32 sums (see gpu_gemm_wgmma.cu).
 */
template <int N>
struct wgmma_rs;

/** D(64x16, FP32) (+)= A(64x16, F16, registers) * B(16x16, F16, smem)^T; scale_d = 0 overwrites D. */
template <>
struct wgmma_rs<16> {
    static __device__ __forceinline__ void mma(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
    }
};

/** D(64x64, FP32) (+)= A(64x16, F16, registers) * B(64x16, F16, smem)^T; scale_d = 0 overwrites D. */
template <>
struct wgmma_rs<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
    }
};

/** D(64x128, FP32) (+)= A(64x16, F16, registers) * B(128x16, F16, smem)^T; scale_d = 0 overwrites D. */
template <>
struct wgmma_rs<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
    }
};

/** D(64x8, FP32) (+)= A(64x16, F16, registers) * B(8x16, F16, smem)^T; scale_d = 0 overwrites D. */
template <>
struct wgmma_rs<8> {
    static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
    }
};

/** Arrive on @p bar and expect @p bytes more of bulk copies in the current phase. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

/**
 * One TMA copy (`cp.async.bulk.tensor.2d`) of the box at column @p c0, row @p c1 of the tensor
 * that @p map describes (a __grid_constant__ kernel parameter) to @p dst (aligned as the map's
 * swizzle needs: 1024 bytes for 128-byte swizzle), its bytes counted on @p bar.
 */
__device__ __forceinline__ void tma_load_2d(void *dst, const void *map, int c0, int c1, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}

} // namespace

#endif /* MMOE_GPU_WGMMA_CUH */
