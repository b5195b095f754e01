/**
 * @file fwd_backend.c
 * @brief The `--backend` switch of the model commands (see mmoe_fwd_backend.h).
 */
#include "mmoe_fwd_backend.h"

#include <stdio.h>
#include <string.h>

#include "mmoe_gpu_moe.h"

int mmoe_backend_parse(const char *s, mmoe_backend *out)
{
    if (strcmp(s, "cpu") == 0)
        *out = MMOE_BACKEND_CPU;
    else if (strcmp(s, "gpu") == 0)
        *out = MMOE_BACKEND_GPU;
    else if (strcmp(s, "auto") == 0)
        *out = MMOE_BACKEND_AUTO;
    else
        return -1;
    return 0;
}

mmoe_status mmoe_backend_open(mmoe_backend want, const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                              const char *cmd, int quiet, mmoe_gpu_model **gpu, mmoe_error *err)
{
    *gpu = NULL;
    if (want == MMOE_BACKEND_CPU)
        return MMOE_OK;
    mmoe_gpu_fwd_kernels kernels; /* a kernel set the environment names wrongly is an error, not a reason for the CPU */
    mmoe_status st = mmoe_gpu_fwd_kernels_from_env(&kernels, err);
    if (st != MMOE_OK)
        return st;
    int cc = 0;
    mmoe_error probe;
    mmoe_error_clear(&probe);
    st = mmoe_gpu_available(&cc, &probe);
    if (st != MMOE_OK) {
        if (want == MMOE_BACKEND_GPU)
            return mmoe_error_set(err, st, "--backend gpu: %s", probe.msg);
        if (!quiet)
            fprintf(stderr, "%s: backend: cpu (auto: %s)\n", cmd, probe.msg);
        return MMOE_OK;
    }
    st = mmoe_gpu_model_create(m, max_seq_len, max_tokens, gpu, &probe);
    if (st != MMOE_OK) {
        if (want == MMOE_BACKEND_GPU)
            return mmoe_error_set(err, st, "--backend gpu: %s", probe.msg);
        if (!quiet)
            fprintf(stderr, "%s: backend: cpu (auto: the GPU was found but cannot run the model: %s)\n", cmd,
                    probe.msg);
        return MMOE_OK;
    }
    if (!quiet) {
        mmoe_gpu_model_bytes b;
        mmoe_gpu_model_bytes_held(*gpu, &b);
        fprintf(stderr,
                "%s: backend: gpu (%s; device sm_%d, %.1f MiB on the device: weights %.1f, caches %.1f, work %.1f; "
                "forward kernels %s)\n",
                cmd, want == MMOE_BACKEND_AUTO ? "auto: a CUDA device is present" : "requested", cc,
                (double)b.total / 1048576.0, (double)b.weights / 1048576.0, (double)b.caches / 1048576.0,
                (double)b.work / 1048576.0, mmoe_gpu_fwd_kernels_name(mmoe_gpu_model_fwd_kernels(*gpu)));
    }
    return MMOE_OK;
}
