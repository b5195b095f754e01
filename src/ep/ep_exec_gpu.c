/**
 * @file ep_exec_gpu.c
 * @brief The per-rank executor on the GPU layer (mmoe_gpu_layer.h), on the rank's GPU.
 *
 * The same two-layer construction as the CPU executor (ep_exec_cpu.c): a routed layer with the
 * rank's experts, topk 1 and no shared expert, whose rows are the pairs; and a shared layer
 * whose slots are all masked.  Here the shared layer describes one routed expert and topk 1,
 * because every expert it describes is copied to the GPU: the GPU layer fuses the shared expert
 * whenever it runs at all (it has no serial path) and takes topk <= 31, so the shared layer's
 * topk changes no decision once the unsplit topk is checked here.
 *
 * Both layers are created on the calling thread's current GPU: the rank's thread, bound to GPU
 * r by the team (ep_team.c).  The rows travel through host memory, as the GPU layer's calls of
 * this build take and return host arrays.
 */
#include <stdlib.h>

#include "ep_internal.h"
#include "mmoe_ep.h"
#include "mmoe_gpu_layer.h"

/** The unsplit topk the GPU layer takes. */
#define GPU_MAX_TOPK 31

/** The GPU executor: its two GPU layers. */
typedef struct gpu_exec {
    mmoe_ep_executor head;  /**< the common head (first member) */
    mmoe_gpu_layer *routed; /**< the rank's experts, topk 1, no shared expert */
    mmoe_gpu_layer *shared; /**< the shared expert, its one slot masked (NULL: none) */
} gpu_exec;

/** run_pairs: the pairs as rows of the routed GPU layer (topk 1). */
static mmoe_status gpu_run_pairs(mmoe_ep_executor *x, int64_t n, const uint16_t *x_rows, const int64_t *local_expert,
                                 const float *weight, uint16_t *y_rows, mmoe_error *err)
{
    gpu_exec *g = (gpu_exec *)x;
    if (n == 0)
        return MMOE_OK;
    mmoe_moe_input in = {n, x_rows, NULL, local_expert, weight};
    mmoe_moe_output out = {y_rows, NULL, NULL};
    return mmoe_gpu_layer_run(g->routed, &in, &out, NULL, err);
}

/** run_shared: the rows through the shared GPU layer, its slot masked. */
static mmoe_status gpu_run_shared(mmoe_ep_executor *x, int64_t n, const uint16_t *x_rows, uint16_t *y, mmoe_error *err)
{
    gpu_exec *g = (gpu_exec *)x;
    if (n == 0)
        return MMOE_OK;
    int64_t *idx;
    float *w;
    mmoe_status st = ep_masked_routing(n, 1, "ep gpu", &idx, &w, err);
    if (st != MMOE_OK)
        return st;
    mmoe_moe_input in = {n, x_rows, NULL, idx, w};
    mmoe_moe_output out = {y, NULL, NULL};
    st = mmoe_gpu_layer_run(g->shared, &in, &out, NULL, err);
    free(idx);
    free(w);
    return st;
}

/** destroy: both GPU layers (on the calling thread's GPU). */
static void gpu_destroy(mmoe_ep_executor *x)
{
    gpu_exec *g = (gpu_exec *)x;
    if (g == NULL)
        return;
    mmoe_gpu_layer_destroy(g->routed);
    mmoe_gpu_layer_destroy(g->shared);
    free(g);
}

/** The GPU executor's functions. */
static const mmoe_ep_executor_ops gpu_ops = {gpu_run_pairs, gpu_run_shared, gpu_destroy};

mmoe_status mmoe_ep_executor_gpu(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w, int rank,
                                 int64_t first, int64_t n_local, mmoe_ep_executor **out, mmoe_error *err)
{
    (void)ctx;
    (void)rank;
    *out = NULL;
    if (desc->topk > GPU_MAX_TOPK)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "ep gpu: topk %d > %d is not supported on the GPU", desc->topk,
                              GPU_MAX_TOPK);
    gpu_exec *g = calloc(1, sizeof *g);
    if (g == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep gpu: out of memory");
    g->head.ops = &gpu_ops;
    g->head.backend = "gpu";
    mmoe_moe_desc rd = *desc;
    rd.n_experts = n_local;
    rd.topk = 1;
    rd.n_shared = 0;
    rd.routing = MMOE_ROUTING_BIASED;
    mmoe_moe_weights rw = {0};
    rw.gate = ep_row_slice(&w->gate, first, n_local);
    rw.experts = w->experts + first;
    mmoe_status st = mmoe_gpu_layer_create(&rd, &rw, &g->routed, err);
    if (st == MMOE_OK && desc->n_shared > 0) {
        mmoe_moe_desc sd = *desc;
        sd.n_experts = 1;
        sd.topk = 1;
        sd.routing = MMOE_ROUTING_BIASED;
        mmoe_moe_weights sw = {0};
        sw.gate = ep_row_slice(&w->gate, first, 1);
        sw.experts = w->experts + first;
        sw.shared = w->shared;
        st = mmoe_gpu_layer_create(&sd, &sw, &g->shared, err);
        g->head.shared_path = MMOE_PATH_FUSED;
    }
    if (st != MMOE_OK) {
        gpu_destroy(&g->head);
        return st;
    }
    *out = &g->head;
    return MMOE_OK;
}
