/**
 * @file bench_moe_gpu.h
 * @brief `megamoe bench moe --backend gpu`: the GPU layer's benchmark, callable from cmd_bench_moe.c.
 */
#ifndef MMOE_BENCH_MOE_GPU_H
#define MMOE_BENCH_MOE_GPU_H

/**
 * Run the GPU benchmark with the options of `megamoe bench moe` (argv[0] is "moe" or the
 * program name; "--backend gpu" is accepted and ignored):
 *   --shape v4-flash|v4.1-flash|v4-pro|tiny  (default v4-flash)
 *   --experts N      routed experts (default: the shape's)
 *   --tokens LIST    comma-separated token counts (default 1,8,32,128,512,2048,8192)
 *   --iters N        timed calls per point (default 50; the median is reported); --reps N is the same
 *   --shared fused|auto   accepted (the GPU always fuses); serial is refused
 *   --recipe sm90|sm100  (default: the device's)
 *   --block-m 16|64  force the GEMM tile height (default: by the expected pairs per expert)
 *   --peer PATH      bench/torch_peer.py to run in the same process tree ("none": skip;
 *                    default $MMOE_SRCDIR/bench/torch_peer.py when it exists)
 *   --seed S
 * Prints one line per token count: us (median of CUDA-event timed calls), TFLOP/s with
 * 42*D*I FLOP per token (6 routed + 1 shared expert, 3 matrices, 2 FLOP per MAC), GB/s of
 * weights read (codes + scales of the distinct experts touched + the shared expert), and the
 * PyTorch peers (bf16 torch._grouped_mm, FP8 torch._scaled_grouped_mm) with ratios.
 * @return 0, 1 on a run-time error (message on stderr), 2 on a usage error, 77 without a GPU
 */
int mmoe_bench_moe_gpu(int argc, char **argv);

#endif /* MMOE_BENCH_MOE_GPU_H */
