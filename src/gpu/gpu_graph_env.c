/**
 * @file gpu_graph_env.c
 * @brief MMOE_GPU_GRAPH, the switch of the GPU forward's decode-step CUDA graph, and
 *        MMOE_GPU_FP8_LINEARS, the recipe of its FP8 linears (mmoe_gpu_forward.h).
 *
 * Plain C in every build, so that a bad value is refused the same way with or without CUDA:
 * the variable is either unset (the caller's default applies: the CLI graphs wherever one GPU
 * model runs, the library API does not), "0" (the steps run kernel by kernel) or "1" (a decode
 * step is one graph replay); anything else, an empty value included, is an error naming the
 * variable.  MMOE_GPU_FP8_LINEARS is unset or "exact" (the oracle's bits) or "tc" (the tensor
 * cores' block partials, gpu_linear_fp8_tc.cuh); anything else is refused the same way.
 */
#include <stdlib.h>
#include <string.h>

#include "mmoe_gpu_forward.h"

mmoe_status mmoe_gpu_graph_env(mmoe_gpu_graph_setting *setting, mmoe_error *err)
{
    const char *v = getenv(MMOE_GPU_GRAPH_ENV);
    *setting = MMOE_GPU_GRAPH_UNSET;
    if (v == NULL)
        return MMOE_OK;
    if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0) {
        *setting = v[0] == '1' ? MMOE_GPU_GRAPH_ON : MMOE_GPU_GRAPH_OFF;
        return MMOE_OK;
    }
    return mmoe_error_set(err, MMOE_EINVAL, "%s='%.64s': expected 1 (decode steps as one CUDA graph) or 0 (off)",
                          MMOE_GPU_GRAPH_ENV, v);
}

const char *mmoe_gpu_fp8_linears_name(mmoe_gpu_fp8_linears r)
{
    return r == MMOE_GPU_FP8_LINEARS_TC ? "tc" : r == MMOE_GPU_FP8_LINEARS_EXACT ? "exact" : "?";
}

mmoe_status mmoe_gpu_fp8_linears_env(mmoe_gpu_fp8_linears *r, mmoe_error *err)
{
    const char *v = getenv(MMOE_GPU_FP8_LINEARS_ENV);
    *r = MMOE_GPU_FP8_LINEARS_EXACT;
    if (v == NULL || strcmp(v, "exact") == 0)
        return MMOE_OK;
    if (strcmp(v, "tc") == 0) {
        *r = MMOE_GPU_FP8_LINEARS_TC;
        return MMOE_OK;
    }
    return mmoe_error_set(err, MMOE_EINVAL,
                          "%s='%.64s': expected exact (the oracle's bits) or tc (tensor-core block partials, "
                          "within a stated bound)", MMOE_GPU_FP8_LINEARS_ENV, v);
}
