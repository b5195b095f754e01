/**
 * @file ep_cuda_stub.c
 * @brief ep_cuda.cu's entry points in a build without CUDA: there is no GPU to count or select.
 */
#include "ep_internal.h"

mmoe_status ep_cuda_devices(int *count, uint64_t *mem_bytes, mmoe_error *err)
{
    *count = 0;
    if (mem_bytes != NULL)
        *mem_bytes = 0;
    return mmoe_error_set(err, MMOE_ENODEV, "ep: this build has no CUDA (configure found no nvcc)");
}

mmoe_status ep_cuda_set_device(int device, mmoe_error *err)
{
    return mmoe_error_set(err, MMOE_ENODEV, "ep: cannot select GPU %d: this build has no CUDA", device);
}

mmoe_status ep_cuda_sync(mmoe_error *err)
{
    return mmoe_error_set(err, MMOE_ENODEV, "ep: device synchronization: this build has no CUDA");
}

mmoe_status ep_cuda_copy(void *dst, const void *src, size_t bytes, mmoe_error *err)
{
    (void)dst;
    (void)src;
    return mmoe_error_set(err, MMOE_ENODEV, "ep: device copy of %zu bytes: this build has no CUDA", bytes);
}
