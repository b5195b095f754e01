/**
 * @file gpu_forward_stub.c
 * @brief The GPU forward's API in a build without CUDA: every entry point answers MMOE_ENODEV.
 */
#include <string.h>

#include "mmoe_gpu_forward.h"

/** The answer of every entry point. */
static mmoe_status no_cuda(mmoe_error *err)
{
    return mmoe_error_set(err, MMOE_ENODEV, "gpu: this build has no CUDA support (configure found no nvcc)");
}

mmoe_status mmoe_gpu_model_bytes_needed(const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                        mmoe_gpu_model_bytes *out, mmoe_error *err)
{
    (void)m;
    (void)max_seq_len;
    (void)max_tokens;
    memset(out, 0, sizeof *out);
    return no_cuda(err);
}

mmoe_status mmoe_gpu_model_create(const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                  mmoe_gpu_model **out, mmoe_error *err)
{
    (void)m;
    (void)max_seq_len;
    (void)max_tokens;
    *out = NULL;
    return no_cuda(err);
}

void mmoe_gpu_model_destroy(mmoe_gpu_model *g) { (void)g; }

mmoe_status mmoe_gpu_model_reset(mmoe_gpu_model *g, mmoe_error *err)
{
    (void)g;
    return no_cuda(err);
}

int64_t mmoe_gpu_model_pos(const mmoe_gpu_model *g)
{
    (void)g;
    return 0;
}

int64_t mmoe_gpu_model_max_seq_len(const mmoe_gpu_model *g)
{
    (void)g;
    return 0;
}

void mmoe_gpu_model_bytes_held(const mmoe_gpu_model *g, mmoe_gpu_model_bytes *out)
{
    (void)g;
    memset(out, 0, sizeof *out);
}

mmoe_status mmoe_gpu_model_forward(mmoe_gpu_model *g, const int32_t *ids, int64_t T, float *logits,
                                   int last_only, uint16_t *streams, mmoe_error *err)
{
    (void)g; (void)ids; (void)T; (void)logits; (void)last_only; (void)streams;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_model_mtp_forward(mmoe_gpu_model *g, const uint16_t *streams, const int32_t *next_ids,
                                       int64_t T, float *logits, mmoe_error *err)
{
    (void)g; (void)streams; (void)next_ids; (void)T; (void)logits;
    return no_cuda(err);
}

void mmoe_gpu_model_set_timing(mmoe_gpu_model *g, int on)
{
    (void)g;
    (void)on;
}

void mmoe_gpu_model_timings_get(const mmoe_gpu_model *g, mmoe_gpu_model_timings *out)
{
    (void)g;
    memset(out, 0, sizeof *out);
}
