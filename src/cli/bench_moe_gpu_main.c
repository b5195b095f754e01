/**
 * @file bench_moe_gpu_main.c
 * @brief Stand-alone driver of the GPU MoE benchmark (the same code as `megamoe bench moe --backend gpu`).
 */
#include "bench_moe_gpu.h"

/** Run the benchmark with the command line. */
int main(int argc, char **argv)
{
    return mmoe_bench_moe_gpu(argc, argv);
}
