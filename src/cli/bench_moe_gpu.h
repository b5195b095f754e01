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
 *   --block-m 16|64|128  force the GEMM tile height (default: by the expected pairs per expert)
 *   --gemm auto|mma|wgmma|decode16  the GEMM kernel family (default: auto, the fastest verified per shape)
 *   --peer PATH      bench/torch_peer.py to run in the same process tree ("none": skip;
 *                    default $MMOE_SRCDIR/bench/torch_peer.py when it exists)
 *   --seed S
 *   --json           one JSON object per line and token count on stdout (the table goes to stderr)
 * Prints one line per token count: us (median of CUDA-event timed calls), TFLOP/s with
 * 42*D*I FLOP per token (6 routed + 1 shared expert, 3 matrices, 2 FLOP per MAC), GB/s of
 * weights read (codes + scales of the distinct experts touched + the shared expert); then a
 * table with the fastest PyTorch peer variant (bench/torch_peer.py, CUDA-graphed), the ratio
 * ours / peer, and the speed of light max(weight bytes / copy bandwidth, FLOP / FP8 dense rate)
 * with both ceilings measured by the peer in the same run.  JSON keys: bench, backend, shape,
 * tokens, median_ms, min_ms, tflops, weight_gbps, peer, peer_median_ms, ratio_to_peer (ours /
 * peer: below 1 we are faster), sol_ms, weight_bytes, copy_gbps, fp8_dense_tflops,
 * peer_weight_bytes, gpu_weight_bytes, experts_touched, block_m, gemm, recipe, device_cc.
 * @return 0, 1 on a run-time error (message on stderr), 2 on a usage error, 77 without a GPU
 */
int mmoe_bench_moe_gpu(int argc, char **argv);

#endif /* MMOE_BENCH_MOE_GPU_H */
