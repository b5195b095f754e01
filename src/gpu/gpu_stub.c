/**
 * @file gpu_stub.c
 * @brief The GPU API in a build without CUDA: every entry point answers MMOE_ENODEV.
 *
 * This keeps one link interface for programs and tests in both builds: a test
 * calls mmoe_gpu_available(), gets MMOE_ENODEV and exits 77 (automake SKIP).
 */
#include <stddef.h>

#include "mmoe_gpu_moe.h"
#include "mmoe_gpu_stage.h"

/** The answer of every entry point: MMOE_ENODEV. */
static mmoe_status no_cuda(mmoe_error *err)
{
    return mmoe_error_set(err, MMOE_ENODEV, "gpu: this build has no CUDA support (configure found no nvcc)");
}

mmoe_status mmoe_gpu_available(int *cc, mmoe_error *err)
{
    (void)cc;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_moe_create(const mmoe_gpu_moe_desc *desc, const mmoe_gpu_moe_weights *w, uint64_t seed,
                                mmoe_gpu_moe **out, mmoe_error *err)
{
    (void)desc;
    (void)w;
    (void)seed;
    if (out != NULL)
        *out = NULL;
    return no_cuda(err);
}

void mmoe_gpu_moe_destroy(mmoe_gpu_moe *layer)
{
    (void)layer;
}

mmoe_status mmoe_gpu_moe_run(mmoe_gpu_moe *layer, int T, const uint16_t *x, const int32_t *topk_idx,
                             const float *topk_w, uint16_t *y, mmoe_gpu_moe_result *res, mmoe_error *err)
{
    (void)layer; (void)T; (void)x; (void)topk_idx; (void)topk_w; (void)y; (void)res;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_moe_expert_counts(mmoe_gpu_moe *layer, int64_t *counts, mmoe_error *err)
{
    (void)layer;
    (void)counts;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_moe_time(mmoe_gpu_moe *layer, int T, const uint16_t *x, const int32_t *topk_idx,
                              const float *topk_w, int warmup, int iters, double *median_us, double *min_us,
                              mmoe_gpu_moe_result *res, mmoe_error *err)
{
    (void)layer; (void)T; (void)x; (void)topk_idx; (void)topk_w; (void)warmup; (void)iters;
    (void)median_us; (void)min_us; (void)res;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_quantize_input(mmoe_gpu_recipe recipe, int rows, int cols, const uint16_t *x, uint8_t *q,
                                    float *scales, mmoe_error *err)
{
    (void)recipe; (void)rows; (void)cols; (void)x; (void)q; (void)scales;
    return no_cuda(err);
}


mmoe_status mmoe_gpu_stage_gemm(const mmoe_gpu_stage_gemm_desc *d, const uint8_t *a, const float *a_scale,
                                const uint8_t *w, const uint8_t *w_scale, float *out, mmoe_error *err)
{
    (void)d; (void)a; (void)a_scale; (void)w; (void)w_scale; (void)out;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_stage_requant(mmoe_gpu_recipe recipe, int rows, int cols, const float *x, uint8_t *q,
                                   float *scales, mmoe_error *err)
{
    (void)recipe; (void)rows; (void)cols; (void)x; (void)q; (void)scales;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_stage_route(int T, int topk, int E, int block_m, const int32_t *topk_idx, const float *topk_w,
                                 mmoe_gpu_stage_route_out *out, mmoe_error *err)
{
    (void)T; (void)topk; (void)E; (void)block_m; (void)topk_idx; (void)topk_w; (void)out;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_stage_combine(int T, int topk, int has_shared, int D, const uint16_t *slots,
                                   const int32_t *topk_idx, uint16_t *y, mmoe_error *err)
{
    (void)T; (void)topk; (void)has_shared; (void)D; (void)slots; (void)topk_idx; (void)y;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_stage_split_sum(int nsplit, int rows, int cols, const float *partial, uint16_t *out,
                                     mmoe_error *err)
{
    (void)nsplit; (void)rows; (void)cols; (void)partial; (void)out;
    return no_cuda(err);
}
