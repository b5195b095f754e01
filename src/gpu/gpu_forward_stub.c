/**
 * @file gpu_forward_stub.c
 * @brief The GPU forward's API in a build without CUDA: every entry point answers MMOE_ENODEV.
 */
#include <string.h>

#include "gpu_forward_internal.h"

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

mmoe_status mmoe_gpu_model_set_cuda_graph(mmoe_gpu_model *g, int on, mmoe_error *err)
{
    (void)g;
    (void)on;
    return no_cuda(err);
}

mmoe_status mmoe_gpu_model_set_fp8_linears(mmoe_gpu_model *g, mmoe_gpu_fp8_linears r, mmoe_error *err)
{
    (void)g;
    (void)r;
    return no_cuda(err);
}

mmoe_gpu_fp8_linears mmoe_gpu_model_fp8_linears(const mmoe_gpu_model *g)
{
    (void)g;
    return MMOE_GPU_FP8_LINEARS_EXACT;
}

void mmoe_gpu_model_graph_stats(const mmoe_gpu_model *g, mmoe_gpu_graph_stats *out)
{
    (void)g;
    memset(out, 0, sizeof *out);
}

void mmoe_gpu_model_timings_get(const mmoe_gpu_model *g, mmoe_gpu_model_timings *out)
{
    (void)g;
    memset(out, 0, sizeof *out);
}

mmoe_status gfw_test_rmsnorm(const uint16_t *x, int64_t T, int64_t n, const uint16_t *w, float eps, uint16_t *y,
                             mmoe_error *err)
{
    (void)x; (void)T; (void)n; (void)w; (void)eps; (void)y;
    return no_cuda(err);
}

mmoe_status gfw_test_linear_fp8_tc(const gfw_test_tc_args *args, mmoe_error *err)
{
    (void)args;
    return no_cuda(err);
}

mmoe_status gfw_test_linear_fp8(const uint16_t *x, int64_t T, const uint8_t *w, const uint8_t *scale, int64_t N,
                                int64_t K, int block, uint16_t *y, mmoe_error *err)
{
    (void)x; (void)T; (void)w; (void)scale; (void)N; (void)K; (void)block; (void)y;
    return no_cuda(err);
}

mmoe_status gfw_test_linear_fp8_pair(const uint16_t *x, int64_t T, int64_t K, const uint8_t *w0,
                                     const uint8_t *scale0, int64_t N0, const uint8_t *w1, const uint8_t *scale1,
                                     int64_t N1, uint16_t *y0, uint16_t *y1, mmoe_error *err)
{
    (void)x; (void)T; (void)K; (void)w0; (void)scale0; (void)N0; (void)w1; (void)scale1; (void)N1; (void)y0;
    (void)y1;
    return no_cuda(err);
}

mmoe_status gfw_test_linear_dense(const uint16_t *x, int64_t T, int64_t K, const void *w, int w_f32, int64_t N,
                                  float *y, mmoe_error *err)
{
    (void)x; (void)T; (void)K; (void)w; (void)w_f32; (void)N; (void)y;
    return no_cuda(err);
}

mmoe_status gfw_test_linear_dense_f8(const uint16_t *x, int64_t T, int64_t K, const uint8_t *w,
                                     const uint8_t *scale, int block, int64_t N, float *y, mmoe_error *err)
{
    (void)x; (void)T; (void)K; (void)w; (void)scale; (void)block; (void)N; (void)y;
    return no_cuda(err);
}

mmoe_status gfw_test_hc_pre(int hc, int64_t D, int iters, float norm_eps, float hc_eps, const uint16_t *X, int64_t T,
                            const float *fn, const float *base, const float *scale, uint16_t *y, float *post,
                            float *comb, mmoe_error *err)
{
    (void)hc; (void)D; (void)iters; (void)norm_eps; (void)hc_eps; (void)X; (void)T; (void)fn; (void)base;
    (void)scale; (void)y; (void)post; (void)comb;
    return no_cuda(err);
}

mmoe_status gfw_test_hc_pre_norm(int64_t D, int n_out, int iters, float norm_eps, float hc_eps, const uint16_t *X,
                                 int64_t T, const float *fn, const float *base, const float *scale,
                                 const uint16_t *w, float eps, int out, int fused, uint16_t *y, float *post,
                                 float *comb, uint8_t *q, float *qs, float *mq, mmoe_error *err)
{
    (void)D; (void)n_out; (void)iters; (void)norm_eps; (void)hc_eps; (void)X; (void)T; (void)fn; (void)base;
    (void)scale; (void)w; (void)eps; (void)out; (void)fused; (void)y; (void)post; (void)comb; (void)q; (void)qs;
    (void)mq;
    return no_cuda(err);
}

mmoe_status gfw_test_hc_post(int hc, int64_t D, const uint16_t *out, uint16_t *X, int64_t T, const float *post,
                             const float *comb, mmoe_error *err)
{
    (void)hc; (void)D; (void)out; (void)X; (void)T; (void)post; (void)comb;
    return no_cuda(err);
}

mmoe_status gfw_test_attend(const uint16_t *q, int64_t T, int H, int d, const uint16_t *rows, int64_t n,
                            const float *sink, int rope_dim, const float *cs, uint16_t *out, mmoe_error *err)
{
    (void)q; (void)T; (void)H; (void)d; (void)rows; (void)n; (void)sink; (void)rope_dim; (void)cs; (void)out;
    return no_cuda(err);
}

mmoe_status gfw_test_qat(uint16_t *x, int64_t rows, int width, int kind, mmoe_error *err)
{
    (void)x; (void)rows; (void)width; (void)kind;
    return no_cuda(err);
}

mmoe_status gfw_test_indexer(const uint16_t *qi, const uint16_t *wi, const uint16_t *keys, int ih, int id,
                             int64_t n_blocks, int topk, float *scores, int32_t *idx, mmoe_error *err)
{
    (void)qi; (void)wi; (void)keys; (void)ih; (void)id; (void)n_blocks; (void)topk; (void)scores; (void)idx;
    return no_cuda(err);
}

mmoe_status gfw_test_route(const gfw_test_route_args *args, mmoe_error *err)
{
    (void)args;
    return no_cuda(err);
}

mmoe_status gfw_test_unary(gfw_test_fn fn, const float *x, int64_t n, float *y, mmoe_error *err)
{
    (void)fn; (void)x; (void)n; (void)y;
    return no_cuda(err);
}

mmoe_status gfw_test_sublayer(mmoe_gpu_model *g, int L, int which, const uint16_t *x, const int32_t *ids,
                              int64_t T, int64_t pos0, uint16_t *out, mmoe_error *err)
{
    (void)g; (void)L; (void)which; (void)x; (void)ids; (void)T; (void)pos0; (void)out;
    return no_cuda(err);
}

mmoe_status gfw_model_bytes_part(const mmoe_model *m, const gfw_ep_part *part, int64_t max_seq_len, int64_t max_tokens,
                                 mmoe_gpu_model_bytes *out, mmoe_error *err)
{
    (void)part;
    return mmoe_gpu_model_bytes_needed(m, max_seq_len, max_tokens, out, err);
}

mmoe_status gfw_model_create_part(const mmoe_model *m, const gfw_ep_part *part, int64_t max_seq_len,
                                  int64_t max_tokens, mmoe_gpu_model **out, mmoe_error *err)
{
    (void)part;
    return mmoe_gpu_model_create(m, max_seq_len, max_tokens, out, err);
}

mmoe_status gfw_test_moe_given(mmoe_gpu_model *g, int L, const uint16_t *x, const int32_t *idx, const float *wts,
                               int64_t T, float *logits, uint16_t *out, mmoe_error *err)
{
    (void)g; (void)L; (void)x; (void)idx; (void)wts; (void)T; (void)logits; (void)out;
    return no_cuda(err);
}

mmoe_status gfw_test_set_observer(mmoe_gpu_model *g, mmoe_model_observer fn, void *ctx, mmoe_error *err)
{
    (void)g; (void)fn; (void)ctx;
    return no_cuda(err);
}

mmoe_status gfw_test_last_routing(mmoe_gpu_model *g, int L, int64_t T, int32_t *idx, float *w, mmoe_error *err)
{
    (void)g; (void)L; (void)T; (void)idx; (void)w;
    return no_cuda(err);
}
