/**
 * @file ep_gpu_rows.cu
 * @brief The device side of the expert-parallel GPU forward's exchange (ep_gpu_forward.c):
 *        the routing to the host, a rank's slot rows gathered into one device batch, and the
 *        received rows scattered back to their slot positions.
 *
 * A slot-row buffer of the GPU forward holds row t * k + s for slot s of token t
 * (gfw_ep_part).  A rank's pairs are scattered over it; the exchange wants them as one
 * contiguous batch in dispatch order.  Gather and scatter are one thread per BF16 value: a
 * pure copy, no arithmetic, so the bits that arrive are the bits that were computed.  The rows
 * never leave the device: the exchange (exchange_device of mmoe_ep_comm.h) moves the scratch's
 * batches between the ranks' devices.
 *
 * Everything runs on the calling thread's current device and its default stream, the stream
 * the GPU forward's kernels run on: a gather is ordered after the kernels that wrote the slot
 * rows, and a scatter before the combine kernel the forward launches next.  The row lists are
 * copied from pageable host memory, which orders them after the stream's earlier work.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "ep_internal.h"

/** out[j, :] = rows[which[j], :]. */
__global__ void k_rows_gather(const uint16_t *rows, int64_t width, const int64_t *which, int64_t n, uint16_t *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * width)
        out[i] = rows[which[i / width] * width + i % width];
}

/** rows[which[j], :] = in[j, :]. */
__global__ void k_rows_scatter(const uint16_t *in, int64_t width, const int64_t *which, int64_t n, uint16_t *rows)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * width)
        rows[which[i / width] * width + i % width] = in[i];
}

/** The CUDA error @p e of step @p what as an mmoe error. */
static mmoe_status rows_fail(mmoe_error *err, cudaError_t e, const char *what)
{
    return mmoe_error_set(err, e == cudaErrorMemoryAllocation ? MMOE_ENOMEM : MMOE_EINTERNAL, "ep rows: %s: %s", what,
                          cudaGetErrorString(e));
}

/** Blocks of 256 threads for @p n values (n >= 1). */
static unsigned blocks_for(int64_t n)
{
    return (unsigned)((n + 255) / 256);
}

/** Check that @p n rows fit @p s. */
static mmoe_status rows_fit(const ep_rows_scratch *s, int64_t n, mmoe_error *err)
{
    if (n < 0 || n > s->max_rows)
        return mmoe_error_set(err, MMOE_EINTERNAL, "ep rows: %lld rows, the scratch holds %lld", (long long)n,
                              (long long)s->max_rows);
    return MMOE_OK;
}

extern "C" mmoe_status ep_rows_scratch_init(ep_rows_scratch *s, int64_t max_rows, int64_t width, mmoe_error *err)
{
    memset(s, 0, sizeof *s);
    const size_t wb = sizeof(int64_t) * (size_t)max_rows, rb = 2 * (size_t)(max_rows * width);
    cudaError_t e = cudaMalloc((void **)&s->d_which, wb > 0 ? wb : 1);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->d_rows, rb > 0 ? rb : 1);
    if (e != cudaSuccess) {
        ep_rows_scratch_free(s);
        return mmoe_error_set(err, e == cudaErrorMemoryAllocation ? MMOE_ENOMEM : MMOE_EINTERNAL,
                              "ep rows: scratch of %zu bytes: %s", wb + rb, cudaGetErrorString(e));
    }
    s->max_rows = max_rows;
    s->width = width;
    return MMOE_OK;
}

extern "C" void ep_rows_scratch_free(ep_rows_scratch *s)
{
    cudaFree(s->d_which);
    cudaFree(s->d_rows);
    memset(s, 0, sizeof *s);
}

extern "C" mmoe_status ep_rows_download_i32(const int32_t *dev, int64_t n, int32_t *host, mmoe_error *err)
{
    cudaError_t e = n > 0 ? cudaMemcpy(host, dev, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost) : cudaSuccess;
    return e == cudaSuccess ? MMOE_OK : rows_fail(err, e, "routing download");
}

extern "C" mmoe_status ep_rows_gather(ep_rows_scratch *s, const uint16_t *rows_dev, const int64_t *which, int64_t n,
                                      mmoe_error *err)
{
    mmoe_status st = rows_fit(s, n, err);
    if (st != MMOE_OK || n == 0)
        return st;
    cudaError_t e = cudaMemcpy(s->d_which, which, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        k_rows_gather<<<blocks_for(n * s->width), 256>>>(rows_dev, s->width, s->d_which, n, s->d_rows);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? MMOE_OK : rows_fail(err, e, "gather");
}

extern "C" mmoe_status ep_rows_scatter(ep_rows_scratch *s, int64_t first, const int64_t *which, int64_t n,
                                       uint16_t *rows_dev, mmoe_error *err)
{
    mmoe_status st = rows_fit(s, first + n, err);
    if (st != MMOE_OK || n == 0)
        return st;
    cudaError_t e = cudaMemcpy(s->d_which, which, sizeof(int64_t) * (size_t)n, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        k_rows_scatter<<<blocks_for(n * s->width), 256>>>(s->d_rows + first * s->width, s->width, s->d_which, n,
                                                          rows_dev);
        e = cudaGetLastError();
    }
    return e == cudaSuccess ? MMOE_OK : rows_fail(err, e, "scatter");
}
