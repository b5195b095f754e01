/**
 * @file ep_exec_cpu.c
 * @brief The per-rank executor on the CPU oracle: two oracle layers per rank.
 *
 * The oracle's public layer gives per-token combined outputs; a rank needs per-pair rows.
 * Two layers built from views of the unsplit layer's weights (no copy) give them exactly:
 *
 *  - **routed**: the unsplit description with E = n_local (the rank's experts, their gate rows
 *    as the gate), topk = 1 and no shared expert.  Each pair is one "token" routed to its local
 *    expert with its weight, so the layer's output row is bf16(0 + y_e) = y_e (mmoe_ep.h, "Why
 *    bit-identical");
 *  - **shared**: the unsplit description with every slot masked, so the output row is
 *    bf16(0 + y_shared) = y_shared.  It keeps the unsplit topk (the fused/serial decision of the
 *    shared expert depends on topk + 1 <= 32) and so needs topk routed experts to describe: all
 *    of them are views of the rank's first expert, never computed (no slot reaches them).
 *
 * Both layers take routing from the caller (biased routing without bias: the router runs once
 * on the caller, mmoe_ep.h).  Their dequantization runs on the pool given as context, shared by
 * every rank's layers: the oracle serializes calls on one pool, so N ranks cost no more threads
 * than one.
 */
#include <stdlib.h>
#include <string.h>

#include "ep_internal.h"
#include "mmoe_ep.h"

/** The CPU executor: its two oracle layers and the views they borrow. */
typedef struct cpu_exec {
    mmoe_ep_executor head;            /**< the common head (first member) */
    mmoe_moe_layer *routed;           /**< the rank's experts, topk 1, no shared expert */
    mmoe_moe_layer *shared;           /**< the shared expert, all slots masked (NULL: none) */
    int topk;                         /**< the unsplit topk (the shared layer's) */
    mmoe_moe_expert_weights *aliases; /**< [topk] views of the first local expert (shared layer) */
} cpu_exec;

/** run_pairs: the pairs as rows of the routed layer (topk 1). */
static mmoe_status cpu_run_pairs(mmoe_ep_executor *x, int64_t n, const uint16_t *x_rows, const int64_t *local_expert,
                                 const float *weight, uint16_t *y_rows, mmoe_error *err)
{
    cpu_exec *c = (cpu_exec *)x;
    if (n == 0)
        return MMOE_OK;
    mmoe_moe_input in = {n, x_rows, NULL, local_expert, weight};
    mmoe_moe_output out = {y_rows, NULL, NULL};
    return mmoe_moe_layer_run(c->routed, &in, &out, NULL, err);
}

/** run_shared: the rows through the shared layer with every slot masked. */
static mmoe_status cpu_run_shared(mmoe_ep_executor *x, int64_t n, const uint16_t *x_rows, uint16_t *y, mmoe_error *err)
{
    cpu_exec *c = (cpu_exec *)x;
    if (n == 0)
        return MMOE_OK;
    int64_t *idx;
    float *w;
    mmoe_status st = ep_masked_routing(n, c->topk, "ep cpu", &idx, &w, err);
    if (st != MMOE_OK)
        return st;
    mmoe_moe_input in = {n, x_rows, NULL, idx, w};
    mmoe_moe_output out = {y, NULL, NULL};
    st = mmoe_moe_layer_run(c->shared, &in, &out, NULL, err);
    free(idx);
    free(w);
    return st;
}

/** destroy: both layers and the alias array. */
static void cpu_destroy(mmoe_ep_executor *x)
{
    cpu_exec *c = (cpu_exec *)x;
    if (c == NULL)
        return;
    mmoe_moe_layer_destroy(c->routed);
    mmoe_moe_layer_destroy(c->shared);
    free(c->aliases);
    free(c);
}

/** The CPU executor's functions. */
static const mmoe_ep_executor_ops cpu_ops = {cpu_run_pairs, cpu_run_shared, cpu_destroy};

/** Create one oracle layer (on @p pool when given) and attach @p w. */
static mmoe_status make_layer(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_moe_pool *pool,
                              mmoe_moe_layer **out, mmoe_error *err)
{
    mmoe_status st = pool != NULL ? mmoe_moe_layer_create_on_pool(d, pool, out, err) : mmoe_moe_layer_create(d, out, err);
    if (st == MMOE_OK && (st = mmoe_moe_layer_set_weights(*out, w, err)) != MMOE_OK) {
        mmoe_moe_layer_destroy(*out);
        *out = NULL;
    }
    return st;
}

mmoe_status mmoe_ep_executor_cpu(void *ctx, const mmoe_moe_desc *desc, const mmoe_moe_weights *w, int rank,
                                 int64_t first, int64_t n_local, mmoe_ep_executor **out, mmoe_error *err)
{
    (void)rank;
    *out = NULL;
    mmoe_moe_pool *pool = ctx;
    cpu_exec *c = calloc(1, sizeof *c);
    if (c == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep cpu: out of memory");
    c->head.ops = &cpu_ops;
    c->head.backend = "cpu";
    c->topk = desc->topk;
    /* routed: the rank's experts, topk 1, no shared expert */
    mmoe_moe_desc rd = *desc;
    rd.n_experts = n_local;
    rd.topk = 1;
    rd.n_shared = 0;
    rd.routing = MMOE_ROUTING_BIASED;
    mmoe_moe_weights rw = {0};
    rw.gate = ep_row_slice(&w->gate, first, n_local);
    rw.experts = w->experts + first;
    mmoe_status st = make_layer(&rd, &rw, pool, &c->routed, err);
    /* shared: the unsplit topk, every slot masked; topk aliases of the first local expert */
    if (st == MMOE_OK && desc->n_shared > 0) {
        mmoe_moe_desc sd = *desc;
        sd.n_experts = desc->topk;
        sd.routing = MMOE_ROUTING_BIASED;
        c->aliases = malloc((size_t)desc->topk * sizeof *c->aliases);
        if (c->aliases == NULL)
            st = mmoe_error_set(err, MMOE_ENOMEM, "ep cpu: out of memory");
        if (st == MMOE_OK) {
            for (int k = 0; k < desc->topk; k++)
                c->aliases[k] = w->experts[first];
            mmoe_moe_weights sw = {0};
            sw.gate = ep_row_slice(&w->gate, 0, desc->topk);
            sw.experts = c->aliases;
            sw.shared = w->shared;
            st = make_layer(&sd, &sw, pool, &c->shared, err);
        }
        if (st == MMOE_OK) {
            mmoe_moe_fallback fb;
            c->head.shared_path = mmoe_moe_layer_shared_plan(c->shared, &fb, c->head.shared_reason);
        }
    }
    if (st != MMOE_OK) {
        cpu_destroy(&c->head);
        return st;
    }
    *out = &c->head;
    return MMOE_OK;
}
