/**
 * @file mmoe_clock.h
 * @brief The one wall clock of the library, the CLI and the benchmarks.
 *
 * Stage timings (the MoE layer's route/quant/GEMM/combine split, the forward pass's
 * per-layer split, prefill and decode rates, benchmark loops) are differences of
 * mmoe_clock_s() readings.  It reads CLOCK_MONOTONIC, which never jumps with the
 * calendar time, and counts wall time: the numbers include OpenBLAS's worker threads.
 */
#ifndef MMOE_CLOCK_H
#define MMOE_CLOCK_H

#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Seconds on CLOCK_MONOTONIC, with nanosecond resolution; only differences are meaningful. */
static inline double mmoe_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef __cplusplus
}
#endif
#endif /* MMOE_CLOCK_H */
