/**
 * @file ep_model.c
 * @brief A model's MoE sub-layers through expert-parallel layers: the model forward runs as
 *        before and calls, at each MoE sub-layer, the block's ::mmoe_ep_moe.
 *
 * The model (mmoe_model.h) keeps the single-threaded control flow of the forward pass -- its
 * embedding, mHC, attention and head are the replicated part -- and hands each MoE sub-layer to
 * the executor installed here.  With in-process ranks this is what `megamoe logits --ep-ranks N`
 * runs on the CPU; a GPU forward keeps the same hook and brings a GPU executor
 * (::mmoe_ep_executor_factory).
 *
 * Every block gets its own EP layer, built from the model's views of the block's weights
 * (mmoe_model_moe_layer()); all layers share one group, one team of rank threads and, on the
 * CPU, one dequantization pool (the blocks run one after another).
 */
#include <stdlib.h>
#include <string.h>

#include "mmoe_ep.h"
#include "mmoe_model.h"

/** The attachment: the group, team, pool and one EP layer per block of the model. */
struct mmoe_ep_model {
    mmoe_model *model;      /**< the model (borrowed) */
    mmoe_ep_group *group;   /**< the ranks' communicators */
    mmoe_ep_team *team;     /**< the ranks' threads */
    mmoe_moe_pool *pool;    /**< the CPU executors' pool (made here), or NULL */
    int n_blocks;           /**< blocks of the model */
    mmoe_ep_moe **layers;   /**< [n_blocks] */
    mmoe_ep_result last;    /**< statistics of the last call */
    int64_t pairs[MMOE_EP_MAX_RANKS]; /**< pairs per rank, all calls */
};

/** The model's MoE executor: block @p block's EP layer. */
static mmoe_status run_block(void *ctx, int block, const mmoe_moe_input *in, const mmoe_moe_output *out,
                             mmoe_error *err)
{
    mmoe_ep_model *e = ctx;
    mmoe_status st = mmoe_ep_moe_run(e->layers[block], in, out, &e->last, err);
    if (st == MMOE_OK)
        for (int r = 0; r < e->last.n_ranks; r++)
            e->pairs[r] += e->last.pairs[r];
    return st;
}

void mmoe_ep_model_detach(mmoe_ep_model *e)
{
    if (e == NULL)
        return;
    mmoe_model_set_moe_executor(e->model, NULL, NULL);
    if (e->layers != NULL)
        for (int b = 0; b < e->n_blocks; b++)
            mmoe_ep_moe_destroy(e->layers[b]);
    free(e->layers);
    mmoe_ep_team_destroy(e->team);
    mmoe_ep_group_destroy(e->group);
    mmoe_moe_pool_destroy(e->pool);
    free(e);
}

mmoe_status mmoe_ep_model_attach(mmoe_model *model, int n_ranks, mmoe_ep_comm_kind kind,
                                 mmoe_ep_executor_factory factory, void *factory_ctx, mmoe_ep_model **out,
                                 mmoe_error *err)
{
    *out = NULL;
    mmoe_ep_model *e = calloc(1, sizeof *e);
    if (e == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory");
    e->model = model;
    e->n_blocks = mmoe_model_n_blocks(model);
    if (factory == NULL)
        factory = mmoe_ep_executor_cpu;
    mmoe_status st = kind == MMOE_EP_COMM_NCCL ? mmoe_ep_group_create_nccl(n_ranks, &e->group, err)
                                               : mmoe_ep_group_create_inproc(n_ranks, &e->group, err);
    if (st == MMOE_OK)
        st = mmoe_ep_team_create(e->group, &e->team, err);
    if (st == MMOE_OK && factory == mmoe_ep_executor_cpu && factory_ctx == NULL &&
        (st = mmoe_moe_pool_create(0, &e->pool, err)) == MMOE_OK)
        factory_ctx = e->pool;
    if (st == MMOE_OK && (e->layers = calloc((size_t)e->n_blocks, sizeof *e->layers)) == NULL)
        st = mmoe_error_set(err, MMOE_ENOMEM, "ep: out of memory");
    for (int b = 0; b < e->n_blocks && st == MMOE_OK; b++) {
        mmoe_moe_desc d;
        mmoe_moe_weights w;
        st = mmoe_model_moe_layer(model, b, &d, &w, err);
        if (st == MMOE_OK) {
            st = mmoe_ep_moe_create(&d, &w, e->team, factory, factory_ctx, &e->layers[b], err);
            mmoe_moe_weights_release(&w);
        }
        if (st != MMOE_OK)
            mmoe_error_prefix(err, "block %d: ", b);
    }
    if (st != MMOE_OK) {
        mmoe_ep_model_detach(e);
        return st;
    }
    mmoe_model_set_moe_executor(model, run_block, e);
    *out = e;
    return MMOE_OK;
}

int mmoe_ep_model_ranks(const mmoe_ep_model *e)
{
    return mmoe_ep_group_size(e->group);
}

const mmoe_ep_result *mmoe_ep_model_last(const mmoe_ep_model *e)
{
    return &e->last;
}

const int64_t *mmoe_ep_model_pairs(const mmoe_ep_model *e)
{
    return e->pairs;
}
