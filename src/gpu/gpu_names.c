/**
 * @file gpu_names.c
 * @brief Names of the GPU layer's recipes and GEMM kernel families (built with or without CUDA).
 *
 * The command line and the benchmarks print and parse these names; keeping them
 * in one plain C file means the CUDA build and the stub build agree on them.
 */
#include <string.h>

#include "mmoe_gpu_moe.h"

const char *mmoe_gpu_recipe_name(mmoe_gpu_recipe r)
{
    return r == MMOE_GPU_RECIPE_SM90 ? "sm90" : r == MMOE_GPU_RECIPE_SM100 ? "sm100" : "auto";
}

const char *mmoe_gpu_gemm_name(mmoe_gpu_gemm g)
{
    return g == MMOE_GPU_GEMM_MMA        ? "mma"
           : g == MMOE_GPU_GEMM_WGMMA    ? "wgmma"
           : g == MMOE_GPU_GEMM_DECODE16 ? "decode16"
                                         : "auto";
}

/** Every GEMM kernel family, in the order of mmoe_gpu_gemm_names(). */
static const mmoe_gpu_gemm all_gemms[] = {MMOE_GPU_GEMM_AUTO, MMOE_GPU_GEMM_MMA, MMOE_GPU_GEMM_WGMMA,
                                          MMOE_GPU_GEMM_DECODE16};

const char *mmoe_gpu_gemm_names(void)
{
    return "auto, mma, wgmma, decode16";
}

int mmoe_gpu_gemm_parse(const char *s, mmoe_gpu_gemm *out)
{
    for (size_t i = 0; s != NULL && i < sizeof all_gemms / sizeof all_gemms[0]; i++)
        if (strcmp(s, mmoe_gpu_gemm_name(all_gemms[i])) == 0) {
            *out = all_gemms[i];
            return 0;
        }
    return -1;
}
