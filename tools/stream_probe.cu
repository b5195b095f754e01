/**
 * @file stream_probe.cu
 * @brief How fast one H200 reads a weight it has not seen: the floor under every weight-streaming
 *        kernel of a decode step, measured apart from the project's kernels.
 *
 * A decode step reads each weight once, cold (nothing of it in the L2), in kernels of a few to a
 * few hundred megabytes.  The copy bandwidth of a large transfer says little about such
 * kernels: a launch, the ramp until enough requests are in flight, and the tail of the last
 * blocks cost a fixed time that a 32 MB read does not amortize.  This probe times, with CUDA
 * events and the L2 flushed by a 256 MB memset before each run (best of 20):
 *
 * - reads of S = 8 .. 512 MB by plain 16-byte loads over a grid of 4 blocks of 512 threads per
 *   multiprocessor (more blocks did not read faster);
 * - the 32 MB of a [32768, 1024] byte matrix by 2-D TMA boxes through a ring of stages per
 *   block (one thread issues, one thread waits and gives each stage back), for several box
 *   shapes, ring depths and grids: whether the copy engine reads faster than loads;
 * - four 32 MB reads as four launches back to back against one 128 MB read: the fixed cost
 *   of a launch;
 * - the weight bytes of the V4-Flash MoE layer at one token (six routed experts and the shared
 *   one: 71 MB in L1, 35 MB in L2) read in one launch and in two: the floor under the layer's
 *   one-token call (docs/perf.md);
 * - the weight streams of one V4-Flash decode layer with the indexer (wq_a with wkv 6 MB, wq_b
 *   32, the indexer's wq_b 8, the compressors' and indexer's projections 40, W_oa 32, W_ob 32,
 *   the MoE's L1 71 and L2 35) as eight launches in that order, against one read of their
 *   250 MB: the floor under a decode step's layer; and the eight launches chained by
 *   programmatic dependent launch, each read after or before its griddepcontrol.wait, with
 *   none, one or two one-block kernels between two reads (the dependency hops of the layer's
 *   small kernels): the floor under a layer whose weights stream in launches of their own;
 *   and the eight reads in one cooperative launch with one to three grid barriers between two
 *   (a persistent kernel's dependent steps, no read started before its barrier).
 *
 * Build and run on the device (not part of the project's build):
 *
 *     nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/stream_probe tools/stream_probe.cu && /tmp/stream_probe
 */
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                               \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

/** How a read launch is chained to the launch before it. */
enum chain_mode {
    CHAIN_PLAIN,       /**< a plain launch: it starts once the launch before has completed */
    CHAIN_PDL_AFTER,   /**< programmatic dependent launch, the loads after griddepcontrol.wait */
    CHAIN_PDL_BEFORE   /**< programmatic dependent launch, the loads before griddepcontrol.wait */
};

/**
 * Read n 16-byte words; the XOR of all keeps the loads alive.  Under the PDL modes the block
 * lets the next launch start at once (griddepcontrol.launch_dependents) and waits for the launch
 * before (griddepcontrol.wait) before or after its loads: after, as a kernel whose reads depend
 * on the one before; before, as a weight stream that needs nothing of it but its end.
 */
template <int MODE>
__global__ void k_ldg(const uint4 *p, size_t n, unsigned *out)
{
    if (MODE != CHAIN_PLAIN)
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (MODE == CHAIN_PDL_AFTER)
        asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (MODE == CHAIN_PDL_BEFORE)
        asm volatile("griddepcontrol.wait;" ::: "memory");
    if (acc == 0x12345678u)
        *out = acc;
}

/** A dependency hop: one block that waits for the launch before and lets the next one start. */
__global__ void k_hop(unsigned *out)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 1000)
        *out = 0;
}

/** The most reads of k_ldg_stages. */
#define STAGES_MAX 8

/** The reads of one k_ldg_stages launch: read l covers words [first[l], first[l] + n[l]). */
struct stage_list {
    size_t first[STAGES_MAX]; /**< the read's first 16-byte word */
    size_t n[STAGES_MAX];     /**< its words */
    int count;                /**< reads */
    int hops;                 /**< grid barriers between two reads (at least one) */
};

/**
 * The reads of @p s in one cooperative launch, each after @p s.hops grid-wide barriers behind
 * the one before: the floor of a layer whose dependent steps are barriers inside one kernel
 * (a persistent kernel) rather than launches, when no step's loads start before its barrier.
 */
__global__ void k_ldg_stages(const uint4 *p, stage_list s, unsigned *out)
{
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    unsigned acc = 0;
    for (int l = 0; l < s.count; l++) {
        for (int h = 0; l > 0 && h < s.hops; h++)
            grid.sync();
        const uint4 *q = p + s.first[l];
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < s.n[l]; i += (size_t)gridDim.x * blockDim.x) {
            const uint4 v = __ldg(q + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x12345678u)
        *out = acc;
}

/** Launch @p f (k_ldg or k_hop) on @p grid x @p block, programmatically when @p pdl is set. */
template <typename... A>
static cudaError_t launch(void (*f)(A...), int grid, int block, bool pdl, A... args)
{
    cudaLaunchConfig_t c = {};
    cudaLaunchAttribute at[1];
    c.gridDim = dim3(grid);
    c.blockDim = dim3(block);
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&c, f, args...);
}

__device__ __forceinline__ uint32_t sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void wait_parity(uint64_t *bar, int parity)
{
    asm volatile("{.reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W;}" ::"r"(sa(bar)),
                 "r"(parity)
                 : "memory");
}

/** Units (BOXR rows x BOXK bytes) [b * per, (b + 1) * per) of the matrix, row-tile-major, through a ring of STAGES. */
template <int STAGES, int BOXK, int BOXR>
__global__ void __launch_bounds__(64) k_tma(const __grid_constant__ CUtensorMap map, int nb, int total, int per,
                                            unsigned *out)
{
    extern __shared__ uint8_t raw[];
    uint8_t *ring = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t full[STAGES], empty[STAGES];
    const int tid = threadIdx.x, bytes = BOXK * BOXR, u0 = blockIdx.x * per;
    const int u1 = u0 + per < total ? u0 + per : total;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(full + s)));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(empty + s)));
        }
        asm volatile("fence.proxy.async.shared::cta;");
    }
    __syncthreads();
    if (tid == 32) {
        for (int u = u0, s = 0, n = 0; u < u1; u++) {
            if (n > 0)
                wait_parity(empty + s, (n - 1) & 1);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(full + s)), "r"(bytes));
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, "
                         "{%2, %3}], [%4];" ::"r"(sa(ring + s * bytes)),
                         "l"((uint64_t)&map), "r"((u % nb) * BOXK), "r"((u / nb) * BOXR), "r"(sa(full + s))
                         : "memory");
            if (++s == STAGES) {
                s = 0;
                n++;
            }
        }
    } else if (tid == 0) {
        unsigned acc = 0;
        for (int u = u0, s = 0, ph = 0; u < u1; u++) {
            wait_parity(full + s, ph);
            acc ^= *(volatile unsigned *)(ring + s * bytes);
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(empty + s)) : "memory");
            if (++s == STAGES) {
                s = 0;
                ph ^= 1;
            }
        }
        if (acc == 0x12345678u)
            *out = acc;
    }
}

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/** What every timing needs: the events, the flush buffer, the sink. */
struct probe {
    cudaEvent_t a, b;
    uint8_t *flush;
    unsigned *out;
    int n_sm;
};

/**
 * Best time (ms) of 20 runs of @p launches reads back to back from @p w (loads), read l of
 * @p bytes[l] bytes after the ones before it, the L2 flushed first, chained as @p mode says,
 * with @p hops one-block dependency hops (k_hop) between two reads.
 */
static int time_ldg(const probe &p, const uint8_t *w, const size_t *bytes, int launches, float *best,
                    int mode = CHAIN_PLAIN, int hops = 0)
{
    *best = 1e9f;
    const bool pdl = mode != CHAIN_PLAIN;
    for (int r = 0; r < 20; r++) {
        CK(cudaMemsetAsync(p.flush, r, (size_t)256 << 20));
        CK(cudaEventRecord(p.a));
        size_t off = 0;
        for (int l = 0; l < launches; off += bytes[l], l++) {
            for (int h = 0; l > 0 && h < hops; h++)
                CK(launch(k_hop, 1, 32, true, p.out));
            const uint4 *src = (const uint4 *)(w + off);
            const size_t n = bytes[l] / 16;
            if (mode == CHAIN_PLAIN)
                CK(launch(k_ldg<CHAIN_PLAIN>, p.n_sm * 4, 512, false, src, n, p.out));
            else if (mode == CHAIN_PDL_AFTER)
                CK(launch(k_ldg<CHAIN_PDL_AFTER>, p.n_sm * 4, 512, pdl && l > 0, src, n, p.out));
            else
                CK(launch(k_ldg<CHAIN_PDL_BEFORE>, p.n_sm * 4, 512, pdl && l > 0, src, n, p.out));
        }
        CK(cudaEventRecord(p.b));
        CK(cudaEventSynchronize(p.b));
        float ms;
        CK(cudaEventElapsedTime(&ms, p.a, p.b));
        *best = ms < *best ? ms : *best;
    }
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

/** Best time (ms) of 20 cooperative launches of k_ldg_stages over @p s, the L2 flushed first. */
static int time_stages(const probe &p, const uint8_t *w, stage_list s, float *best)
{
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_ldg_stages, 512, 0));
    const int blocks = p.n_sm * (per_sm < 4 ? per_sm : 4);
    const uint4 *src = (const uint4 *)w;
    void *args[] = {(void *)&src, (void *)&s, (void *)&p.out};
    *best = 1e9f;
    for (int r = 0; r < 20; r++) {
        CK(cudaMemsetAsync(p.flush, r, (size_t)256 << 20));
        CK(cudaEventRecord(p.a));
        CK(cudaLaunchCooperativeKernel((const void *)k_ldg_stages, blocks, 512, args, 0, 0));
        CK(cudaEventRecord(p.b));
        CK(cudaEventSynchronize(p.b));
        float ms;
        CK(cudaEventElapsedTime(&ms, p.a, p.b));
        *best = ms < *best ? ms : *best;
    }
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

template <int STAGES, int BOXK, int BOXR>
static int time_tma(const probe &p, encode_fn enc, uint8_t *w, int64_t N, int64_t K, int blocks, CUtensorMapSwizzle sw)
{
    CUtensorMap map;
    const cuuint64_t dim[2] = {(cuuint64_t)K, (cuuint64_t)N}, stride[1] = {(cuuint64_t)K};
    const cuuint32_t box[2] = {BOXK, BOXR}, es[2] = {1, 1};
    if (enc(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, w, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
        return 1;
    }
    const int nb = (int)(K / BOXK), total = (int)(N / BOXR) * nb, per = (total + blocks - 1) / blocks;
    const int smem = STAGES * BOXK * BOXR + 1024;
    CK(cudaFuncSetAttribute(k_tma<STAGES, BOXK, BOXR>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    float best = 1e9f;
    for (int r = 0; r < 20; r++) {
        CK(cudaMemsetAsync(p.flush, r, (size_t)256 << 20));
        CK(cudaEventRecord(p.a));
        k_tma<STAGES, BOXK, BOXR><<<(total + per - 1) / per, 64, smem>>>(map, nb, total, per, p.out);
        CK(cudaEventRecord(p.b));
        CK(cudaEventSynchronize(p.b));
        float ms;
        CK(cudaEventElapsedTime(&ms, p.a, p.b));
        best = ms < best ? ms : best;
    }
    CK(cudaGetLastError());
    printf("tma  32 MB, box %3d x %3d, %2d stages, %4d blocks (%2d units each), swizzle %d: %6.2f us, %.2f TB/s\n", BOXK,
           BOXR, STAGES, (total + per - 1) / per, per, (int)sw, best * 1e3, N * K / (best * 1e-3) / 1e12);
    return 0;
}

int main(void)
{
    const size_t big = (size_t)512 << 20;
    probe p;
    uint8_t *w;
    CK(cudaMalloc(&w, big));
    CK(cudaMalloc(&p.flush, (size_t)256 << 20));
    CK(cudaMalloc(&p.out, 4));
    CK(cudaMemset(w, 1, big));
    CK(cudaDeviceGetAttribute(&p.n_sm, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaEventCreate(&p.a));
    CK(cudaEventCreate(&p.b));
    for (size_t mb = 8; mb <= 512; mb *= 2) {
        float ms;
        const size_t bytes = mb << 20;
        if (time_ldg(p, w, &bytes, 1, &ms))
            return 1;
        printf("ldg %3zu MB, one launch:  %7.2f us, %.2f TB/s\n", mb, ms * 1e3, (double)(mb << 20) / (ms * 1e-3) / 1e12);
    }
    /* four 32 MB launches; the one-token V4-Flash MoE layer's bytes (L1 71 MB, L2 35 MB) in one
       launch and in two; a V4-Flash decode layer's eight weight streams and their 250 MB in one */
    const struct {
        const char *name;
        int launches;
        size_t mb[8];
    } sets[] = {{"4 x 32 MB, four launches", 4, {32, 32, 32, 32}},
                {"106 MB, one launch", 1, {106}},
                {"71 + 35 MB, two launches", 2, {71, 35}},
                {"250 MB, one launch", 1, {250}},
                {"6 + 32 + 8 + 40 + 32 + 32 + 71 + 35 MB, eight launches", 8, {6, 32, 8, 40, 32, 32, 71, 35}}};
    for (const auto &set : sets) {
        size_t bytes[8], total = 0;
        for (int l = 0; l < set.launches; l++)
            total += bytes[l] = set.mb[l] << 20;
        float ms;
        if (time_ldg(p, w, bytes, set.launches, &ms))
            return 1;
        printf("ldg %s: %7.2f us, %.2f TB/s\n", set.name, ms * 1e3, (double)total / (ms * 1e-3) / 1e12);
        if (set.launches < 8)
            continue;
        /* the same launches chained programmatically: the reads after or before the wait, and
           with one or two dependency hops (one-block kernels) between two reads */
        const struct {
            int mode, hops;
            const char *what;
        } chains[] = {{CHAIN_PDL_AFTER, 0, "PDL, loads after the wait"},
                      {CHAIN_PDL_BEFORE, 0, "PDL, loads before the wait"},
                      {CHAIN_PDL_AFTER, 1, "PDL, loads after the wait, one hop between"},
                      {CHAIN_PDL_AFTER, 2, "PDL, loads after the wait, two hops between"},
                      {CHAIN_PDL_BEFORE, 2, "PDL, loads before the wait, two hops between"}};
        for (const auto &c : chains) {
            if (time_ldg(p, w, bytes, set.launches, &ms, c.mode, c.hops))
                return 1;
            printf("ldg %s, %s: %7.2f us, %.2f TB/s\n", set.name, c.what, ms * 1e3,
                   (double)total / (ms * 1e-3) / 1e12);
        }
    }
    /* the layer's eight reads in one persistent launch, one to three grid barriers between two */
    {
        const size_t mb[8] = {6, 32, 8, 40, 32, 32, 71, 35};
        stage_list s = {};
        size_t word = 0, total = 0;
        for (int l = 0; l < 8; l++) {
            s.first[l] = word;
            s.n[l] = (mb[l] << 20) / 16;
            word += s.n[l];
            total += mb[l] << 20;
        }
        s.count = 8;
        for (int hops = 1; hops <= 3; hops++) {
            float ms;
            s.hops = hops;
            if (time_stages(p, w, s, &ms))
                return 1;
            printf("ldg 250 MB as eight reads in one cooperative launch, %d grid barrier(s) between two: %7.2f us, "
                   "%.2f TB/s\n", hops, ms * 1e3, (double)total / (ms * 1e-3) / 1e12);
        }
        s.count = 1;
        s.n[0] = word;
        float ms;
        if (time_stages(p, w, s, &ms))
            return 1;
        printf("ldg 250 MB as one read in one cooperative launch: %7.2f us, %.2f TB/s\n", ms * 1e3,
               (double)total / (ms * 1e-3) / 1e12);
    }
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == NULL) {
        fprintf(stderr, "no cuTensorMapEncodeTiled\n");
        return 1;
    }
    const encode_fn enc = (encode_fn)fn;
    const int64_t N = 32768, K = 1024;
    const CUtensorMapSwizzle S = CU_TENSOR_MAP_SWIZZLE_128B, Z = CU_TENSOR_MAP_SWIZZLE_NONE;
    int bad = 0;
    bad |= time_tma<6, 128, 64>(p, enc, w, N, K, p.n_sm * 2, S);
    bad |= time_tma<6, 128, 64>(p, enc, w, N, K, p.n_sm * 4, S);
    bad |= time_tma<12, 128, 64>(p, enc, w, N, K, p.n_sm * 2, S);
    bad |= time_tma<4, 128, 128>(p, enc, w, N, K, p.n_sm * 2, S);
    bad |= time_tma<6, 256, 64>(p, enc, w, N, K, p.n_sm * 2, Z);
    return bad;
}
