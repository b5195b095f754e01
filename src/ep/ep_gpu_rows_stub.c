/**
 * @file ep_gpu_rows_stub.c
 * @brief ep_gpu_rows.cu's entry points in a build without CUDA: there are no device rows.
 */
#include <string.h>

#include "ep_internal.h"

/** The answer of every entry point. */
static mmoe_status no_cuda(mmoe_error *err)
{
    return mmoe_error_set(err, MMOE_ENODEV, "ep rows: this build has no CUDA");
}

mmoe_status ep_rows_scratch_init(ep_rows_scratch *s, int64_t max_rows, int64_t width, mmoe_error *err)
{
    (void)max_rows;
    (void)width;
    memset(s, 0, sizeof *s);
    return no_cuda(err);
}

void ep_rows_scratch_free(ep_rows_scratch *s)
{
    memset(s, 0, sizeof *s);
}

mmoe_status ep_rows_download_i32(const int32_t *dev, int64_t n, int32_t *host, mmoe_error *err)
{
    (void)dev;
    (void)n;
    (void)host;
    return no_cuda(err);
}

mmoe_status ep_rows_gather(ep_rows_scratch *s, const uint16_t *rows_dev, const int64_t *which, int64_t n,
                           mmoe_error *err)
{
    (void)s;
    (void)rows_dev;
    (void)which;
    (void)n;
    return no_cuda(err);
}

mmoe_status ep_rows_scatter(ep_rows_scratch *s, int64_t first, const int64_t *which, int64_t n, uint16_t *rows_dev,
                            mmoe_error *err)
{
    (void)s;
    (void)first;
    (void)which;
    (void)n;
    (void)rows_dev;
    return no_cuda(err);
}
