/**
 * @file gpu_pdl.cuh
 * @brief Programmatic dependent launch: how one kernel on a stream lets the next one start
 *        before it has finished, for the layer's kernels and the forward's.
 *
 * Two kernels in a row on one stream normally run one after the other: the second is launched
 * (its blocks dispatched, their registers and shared memory set up) only when the first has
 * completed.  A kernel launched with the programmatic-serialization attribute
 * (mmoe_launch_pdl()) may instead be launched as soon as every block of the kernel before it
 * has executed griddepcontrol.launch_dependents (mmoe_grid_launch_dependents()), or exited;
 * its blocks must then execute griddepcontrol.wait (mmoe_grid_dependency_wait()) before they
 * read anything the kernel before wrote: that wait returns when the kernel before has completed
 * and its writes are visible.  Both instructions are no-ops for a kernel launched without the
 * attribute, and the attribute is an ordinary dependency when the operation before is not a
 * kernel (a copy, a kernel of another library).  Inside a captured CUDA graph the two kernels
 * keep this relation (a programmatic edge).
 *
 *     kernel N:    [blocks ... launch_dependents ......................... done]
 *     kernel N+1:                    [dispatched, wait ..................]   [work ...]
 *
 * So what overlaps is the second kernel's launch and dispatch, and whatever its blocks do before
 * the wait; never a read of the first kernel's results.
 */
#ifndef MMOE_GPU_PDL_CUH
#define MMOE_GPU_PDL_CUH

#include <cuda_runtime.h>

#include <utility>

/**
 * Programmatic dependent launch, the consumer side: wait until the kernel before this one on
 * the stream has finished and its writes are visible.  A no-op for a kernel launched without
 * the programmatic-serialization attribute.
 */
__device__ __forceinline__ void mmoe_grid_dependency_wait()
{
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/**
 * Programmatic dependent launch, the producer side: the next kernel on the stream, when it was
 * launched with the programmatic-serialization attribute, may start its blocks now (they wait
 * in mmoe_grid_dependency_wait() before reading this kernel's results).
 */
__device__ __forceinline__ void mmoe_grid_launch_dependents()
{
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/**
 * Launch @p kernel on @p st with the attributes asked for: programmatic serialization when
 * @p pdl is set (see mmoe_launch_ex()), and thread-block clusters of @p cluster blocks when
 * that is more than one block (the grid a multiple of it in each dimension; the blocks of a
 * cluster run at once on one GPC and may read and write each other's shared memory).
 */
template <typename... Params, typename... Args>
static inline cudaError_t mmoe_launch_cfg(bool pdl, dim3 cluster, void (*kernel)(Params...), dim3 grid, dim3 block,
                                          size_t smem, cudaStream_t st, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n].val.clusterDim.z = cluster.z;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

/**
 * Launch @p kernel on @p st, with the programmatic-serialization attribute when @p pdl is set:
 * it may then start once every block of the kernel before it has called
 * mmoe_grid_launch_dependents() (see the file comment), so it must call
 * mmoe_grid_dependency_wait() before reading that kernel's results.  The arguments are converted
 * to the kernel's parameter types, as with <<< >>>.
 */
template <typename... Params, typename... Args>
static inline cudaError_t mmoe_launch_ex(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                         cudaStream_t st, Args &&...args)
{
    return mmoe_launch_cfg(pdl, dim3(1, 1, 1), kernel, grid, block, smem, st, std::forward<Args>(args)...);
}

/** mmoe_launch_ex() with the attribute: the launch of every forward kernel and of the layer's helpers. */
template <typename... Params, typename... Args>
static inline cudaError_t mmoe_launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                          cudaStream_t st, Args &&...args)
{
    return mmoe_launch_ex(true, kernel, grid, block, smem, st, std::forward<Args>(args)...);
}

/** mmoe_launch_pdl() of clusters of @p cluster blocks (mmoe_launch_cfg()). */
template <typename... Params, typename... Args>
static inline cudaError_t mmoe_launch_pdl_cluster(dim3 cluster, void (*kernel)(Params...), dim3 grid, dim3 block,
                                                  size_t smem, cudaStream_t st, Args &&...args)
{
    return mmoe_launch_cfg(true, cluster, kernel, grid, block, smem, st, std::forward<Args>(args)...);
}

#endif
