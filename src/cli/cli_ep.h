/**
 * @file cli_ep.h
 * @brief The expert-parallel options shared by `megamoe logits`, `generate` and `bench forward`.
 *
 *     --ep-ranks N       the MoE sub-layers over N in-process ranks (threads) on the CPU:
 *                        the same split, bookkeeping and combine as on N GPUs, same bits
 *     --gpus N           the GPU forward over N GPUs (expert parallel, NCCL): planned before
 *                        loading (a model whose weights per GPU exceed a GPU is refused with the
 *                        bytes per GPU; N above the GPUs present or without NCCL: refused), then
 *                        one GPU forward per GPU with its block of routed experts, same bits as
 *                        one GPU
 *     --gpu-memory GIB   the GPU size to plan --gpus with (default: GPU 0's own memory)
 */
#ifndef MMOE_CLI_EP_H
#define MMOE_CLI_EP_H

#include <stdio.h>

#include "mmoe_ep.h"
#include "mmoe_ep_gpu_forward.h"
#include "mmoe_model.h"

/** Share of a GPU's memory that the weights may take; the rest is left to activations,
 *  workspaces and the KV caches. */
#define MMOE_CLI_EP_WEIGHT_SHARE 0.90

/** The options as parsed. */
typedef struct mmoe_cli_ep {
    int ep_ranks;      /**< --ep-ranks (0: not given) */
    int gpus;          /**< --gpus (0: not given) */
    double gpu_mem_gib;/**< --gpu-memory (0: not given) */
} mmoe_cli_ep;

/** Usage lines of the options (for a command's help text). */
#define MMOE_CLI_EP_USAGE                                                                                   \
    "  --ep-ranks N      MoE sub-layers over N in-process ranks on the CPU (expert parallel, same bits; default: none)\n" \
    "  --gpus N          the GPU forward over N GPUs (expert parallel, NCCL; same bits as one GPU) (default: none)\n"      \
    "  --gpu-memory GIB  GPU size for the --gpus plan (default: GPU 0's memory)\n"

/**
 * Take option @p name ("ep-ranks", "gpus", "gpu-memory") with value @p arg into @p o.
 * @return 0, or MMOE_EXIT_USAGE after a message naming @p cmd, the option and the value
 */
int mmoe_cli_ep_option(const char *cmd, const char *name, const char *arg, mmoe_cli_ep *o);

/**
 * What is decided before loading: --ep-ranks and --gpus exclude each other; for --gpus, the
 * weights per GPU of the model in @p model_dir (its config.json) against the GPU size, the
 * number of GPUs present, and NCCL in the build.
 * @return MMOE_OK (nothing or --ep-ranks to do); MMOE_EINVAL, MMOE_EUNSUPPORTED, MMOE_ENODEV with
 *         the message
 */
mmoe_status mmoe_cli_ep_before_load(const mmoe_cli_ep *o, const char *model_dir, mmoe_error *err);

/** --ep-ranks N: spread @p m's MoE layers over N in-process ranks (*out NULL when not given). */
mmoe_status mmoe_cli_ep_attach(const mmoe_cli_ep *o, mmoe_model *m, mmoe_ep_model **out, mmoe_error *err);

/**
 * --gpus N: upload @p m over N GPUs (*out NULL when not given); unless @p quiet, one line on
 * stderr naming @p cmd, the bytes and experts of each GPU.
 */
mmoe_status mmoe_cli_ep_open_gpus(const mmoe_cli_ep *o, const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                  const char *cmd, int quiet, mmoe_ep_gpu_model **out, mmoe_error *err);

/** One line on @p f: GPUs, MoE exchanges and the routed pairs each GPU computed (nothing for NULL). */
void mmoe_cli_ep_gpus_report(FILE *f, const mmoe_ep_gpu_model *e);

/** One line on @p f: ranks and the routed pairs each computed (nothing for NULL). */
void mmoe_cli_ep_report(FILE *f, const mmoe_ep_model *e);

/**
 * `megamoe bench moe --gpus N | --ep-ranks N ...` (bench_moe_ep.c).
 * @return -1 when neither option is in @p argv (another benchmark's arguments), else the
 *         command's exit status
 */
int mmoe_bench_moe_ep(int argc, char **argv);

/**
 * `megamoe bench forward --gpus N` after loading (bench_forward_ep.c): a warm-up pass and a
 * timed pass of prefill and greedy decode on @p e; prints the report (text, or with @p json one
 * JSON object) on stdout.
 * @param e          the model over N GPUs
 * @param cfg        its config
 * @param model_dir  for the report
 * @param t_load     seconds the checkpoint took to open (for the report)
 * @param ids        [n_prefill + n_decode]: the prompt, then room for the decoded ids
 * @param n_prefill  prompt tokens
 * @param n_decode   tokens decoded greedily after the prompt
 * @param json       1: one JSON object instead of the text report
 * @param err        the error, when the forward fails
 * @return MMOE_OK, or the forward's error
 */
mmoe_status mmoe_bench_forward_gpus(mmoe_ep_gpu_model *e, const mmoe_config *cfg, const char *model_dir,
                                    double t_load, int32_t *ids, int64_t n_prefill, int64_t n_decode, int json,
                                    mmoe_error *err);

#endif /* MMOE_CLI_EP_H */
