/**
 * @file ep_cuda.cu
 * @brief The CUDA facts expert parallelism needs outside the GPU layer: how many GPUs there
 *        are (and how much memory one has), which GPU the calling thread drives; and the two
 *        device operations of the in-process exchange on device memory (wait, copy).
 *
 * The GPU layer (mmoe_gpu_moe.h) allocates and launches on the calling thread's current device;
 * a rank's thread makes GPU r current once per job (ep_team.c), and every layer object of rank
 * r is created and run from that thread, so it lives on GPU r.
 */
#include <cuda_runtime.h>

#include "ep_internal.h"

extern "C" mmoe_status ep_cuda_devices(int *count, uint64_t *mem_bytes, mmoe_error *err)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return mmoe_error_set(err, MMOE_ENODEV, "ep: no CUDA device (%s)",
                              e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (mem_bytes != NULL) {
        cudaDeviceProp prop;
        e = cudaGetDeviceProperties(&prop, 0);
        if (e != cudaSuccess)
            return mmoe_error_set(err, MMOE_ENODEV, "ep: cannot read device 0: %s", cudaGetErrorString(e));
        *mem_bytes = (uint64_t)prop.totalGlobalMem;
    }
    *count = n;
    return MMOE_OK;
}

extern "C" mmoe_status ep_cuda_set_device(int device, mmoe_error *err)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return mmoe_error_set(err, MMOE_ENODEV, "ep: cannot select GPU %d: %s", device, cudaGetErrorString(e));
    return MMOE_OK;
}

extern "C" mmoe_status ep_cuda_sync(mmoe_error *err)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep: device synchronization: %s", cudaGetErrorString(e));
    return MMOE_OK;
}

extern "C" mmoe_status ep_cuda_copy(void *dst, const void *src, size_t bytes, mmoe_error *err)
{
    /* a device-to-device cudaMemcpy may return before the copy ends: wait for it */
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep: device copy of %zu bytes: %s", bytes, cudaGetErrorString(e));
    return MMOE_OK;
}
