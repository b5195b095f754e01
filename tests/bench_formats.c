/**
 * @file bench_formats.c
 * @brief Throughput of the formats hot paths: row dequantizers (MXFP4, FP8), row quantizers
 *        and the scalar encoders, on one core.
 *
 *     tests/bench_formats [K] [ROWS]      (defaults: K = 7168, ROWS = 2048)
 *
 * Prints elements per second for each function over ROWS rows of K elements (the
 * DeepSeek-V4 hidden size by default).  Built by `make check`, not run by it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mmoe_formats.h"
#include "mmoe_rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void report(const char *what, size_t elems, double seconds, double checksum)
{
    printf("%-34s %8.3f Gelem/s  (%.3f s, checksum %g)\n", what, (double)elems / seconds * 1e-9, seconds, checksum);
}

int main(int argc, char **argv)
{
    size_t k = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 7168;
    size_t rows = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 2048;
    if (k == 0 || k % 128 != 0 || rows == 0) {
        fprintf(stderr, "bench_formats: K must be a positive multiple of 128, ROWS positive\n");
        return 2;
    }
    float *x = malloc(k * sizeof *x), *out = malloc(k * sizeof *out), *sf32 = malloc(k / 128 * sizeof *sf32);
    uint8_t *q = malloc(k), *packed = malloc(k / 2), *sf = malloc(k / 32);
    uint16_t *h = malloc(k * sizeof *h);
    if (!x || !out || !sf32 || !q || !packed || !sf || !h) {
        fprintf(stderr, "bench_formats: out of memory\n");
        return 1;
    }
    mmoe_rng rng;
    mmoe_rng_seed(&rng, 42);
    for (size_t i = 0; i < k; i++)
        x[i] = (float)mmoe_rng_normal(&rng);
    mmoe_quant_row_fp4_1x32_ue8m0(x, k, MMOE_FP4_RNE, packed, sf, NULL);
    mmoe_quant_row_fp8_1x128_f32(x, k, q, sf32, NULL);
    size_t n = k * rows;
    double sum = 0, t;

    t = now_s();
    for (size_t r = 0; r < rows; r++) {
        mmoe_dequant_row_mxfp4(packed, sf, k, out, NULL);
        sum += out[r % k];
    }
    report("dequant_row_mxfp4 (1x32 UE8M0)", n, now_s() - t, sum);

    t = now_s();
    for (size_t r = 0; r < rows; r++) {
        mmoe_dequant_row_fp8(q, sf32, MMOE_DT_F32, k, 128, out, NULL);
        sum += out[r % k];
    }
    report("dequant_row_fp8 (1x128 F32)", n, now_s() - t, sum);

    t = now_s();
    for (size_t r = 0; r < rows; r++) {
        mmoe_quant_row_fp8_1x32_ue8m0(x, k, q, sf, NULL);
        sum += q[r % k];
    }
    report("quant_row_fp8_1x32_ue8m0", n, now_s() - t, sum);

    t = now_s();
    for (size_t r = 0; r < rows; r++) {
        mmoe_quant_row_fp4_1x32_ue8m0(x, k, MMOE_FP4_RNE, packed, sf, NULL);
        sum += packed[r % (k / 2)];
    }
    report("quant_row_fp4_1x32_ue8m0 (RNE)", n, now_s() - t, sum);

    t = now_s();
    for (size_t r = 0; r < rows; r++) {
        mmoe_bf16_from_f32_row(x, k, h);
        sum += h[r % k];
    }
    report("bf16_from_f32_row", n, now_s() - t, sum);

    free(x), free(out), free(sf32), free(q), free(packed), free(sf), free(h);
    return 0;
}
