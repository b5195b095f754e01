/**
 * @file fwd_backend.c
 * @brief The `--backend` switch of the model commands (see mmoe_fwd_backend.h).
 */
#include "mmoe_fwd_backend.h"

#include <stdio.h>
#include <string.h>

#include "mmoe_cli.h"
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

int mmoe_cuda_graph_option(const char *cmd, const char *value, mmoe_cuda_graph_opt *o)
{
    if (strcmp(value, "on") != 0 && strcmp(value, "off") != 0) {
        fprintf(stderr, "megamoe %s: --cuda-graph '%s': expected on or off\n", cmd, value);
        return MMOE_EXIT_USAGE;
    }
    o->given = 1;
    o->on = strcmp(value, "on") == 0;
    return 0;
}

int mmoe_cuda_graph_resolve(const char *cmd, mmoe_cuda_graph_opt *o, mmoe_backend backend, int gpus)
{
    /* the variable is checked even under the option: the GPU model reads it again when it is created */
    mmoe_gpu_graph_setting env = MMOE_GPU_GRAPH_UNSET;
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_gpu_graph_env(&env, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe %s: %s\n", cmd, err.msg);
        return 1;
    }
    /* the FP8 linears' recipe: read by the GPU model when it is created, refused here first */
    mmoe_gpu_fp8_linears fp8 = MMOE_GPU_FP8_LINEARS_EXACT;
    if (mmoe_gpu_fp8_linears_env(&fp8, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (!o->given && env == MMOE_GPU_GRAPH_UNSET) {
        o->on = gpus == 0 && backend != MMOE_BACKEND_CPU; /* the default: graphs wherever one GPU model runs */
        return 0;
    }
    if (!o->given)
        o->on = env == MMOE_GPU_GRAPH_ON;
    if (!o->on)
        return 0;
    if (gpus == 0 && o->given && backend == MMOE_BACKEND_CPU) {
        fprintf(stderr, "megamoe %s: --cuda-graph on runs the GPU forward's decode steps as graphs: --backend cpu "
                        "contradicts it\n", cmd);
        return MMOE_EXIT_USAGE;
    }
    if (gpus > 0) {
        fprintf(stderr, "megamoe %s: %s: the forward over --gpus N exchanges rows through the host inside each MoE "
                        "sub-layer and runs kernel by kernel%s\n", cmd,
                o->given ? "--cuda-graph on" : MMOE_GPU_GRAPH_ENV "=1",
                o->given ? "" : " (pass --cuda-graph off or unset the variable)");
        return o->given ? MMOE_EXIT_USAGE : 1;
    }
    return 0;
}

int mmoe_backend_graphed(const mmoe_gpu_model *g)
{
    if (g == NULL)
        return 0;
    mmoe_gpu_graph_stats gs;
    mmoe_gpu_model_graph_stats(g, &gs);
    return gs.replays > 0;
}

mmoe_status mmoe_backend_open(mmoe_backend want, const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                              int cuda_graph, const char *cmd, int quiet, mmoe_gpu_model **gpu, mmoe_error *err)
{
    *gpu = NULL;
    if (want == MMOE_BACKEND_CPU)
        return MMOE_OK;
    int cc = 0;
    mmoe_error probe;
    mmoe_error_clear(&probe);
    mmoe_status st = mmoe_gpu_available(&cc, &probe);
    if (st != MMOE_OK) {
        if (want == MMOE_BACKEND_GPU)
            return mmoe_error_set(err, st, "--backend gpu: %s", probe.msg);
        if (!quiet)
            fprintf(stderr, "%s: backend: cpu (auto: %s)%s\n", cmd, probe.msg,
                    cuda_graph ? "; cuda graph: not used (the CPU runs the forward)" : "");
        return MMOE_OK;
    }
    st = mmoe_gpu_model_create(m, max_seq_len, max_tokens, gpu, &probe);
    if (st != MMOE_OK) {
        if (want == MMOE_BACKEND_GPU)
            return mmoe_error_set(err, st, "--backend gpu: %s", probe.msg);
        if (!quiet)
            fprintf(stderr, "%s: backend: cpu (auto: the GPU was found but cannot run the model: %s)%s\n", cmd,
                    probe.msg, cuda_graph ? "; cuda graph: not used (the CPU runs the forward)" : "");
        return MMOE_OK;
    }
    if ((st = mmoe_gpu_model_set_cuda_graph(*gpu, cuda_graph, &probe)) != MMOE_OK) {
        mmoe_gpu_model_destroy(*gpu);
        *gpu = NULL;
        return mmoe_error_set(err, st, "--cuda-graph: %s", probe.msg);
    }
    if (!quiet) {
        mmoe_gpu_model_bytes b;
        mmoe_gpu_model_bytes_held(*gpu, &b);
        fprintf(stderr,
                "%s: backend: gpu (%s; device sm_%d, %.1f MiB on the device: weights %.1f, caches %.1f, work %.1f; "
                "cuda graph: %s)\n",
                cmd, want == MMOE_BACKEND_AUTO ? "auto: a CUDA device is present" : "requested", cc,
                (double)b.total / 1048576.0, (double)b.weights / 1048576.0, (double)b.caches / 1048576.0,
                (double)b.work / 1048576.0, cuda_graph ? "on, one replay per decode step" : "off");
    }
    return MMOE_OK;
}
