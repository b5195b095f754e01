/**
 * @file cli_ep.c
 * @brief The expert-parallel options of `logits` and `generate` (cli_ep.h): parsing, the plan
 *        before loading, and the in-process split after it.
 *
 * `--gpus N` is decided entirely before the checkpoint is opened: the weights per GPU come from
 * the config's tensor list (the bytes the checkpoint must hold, mmoe_model_tensors.h), split as
 * the EP layer splits them (mmoe_ep_memory_plan_make()), so a model that cannot fit N GPUs is
 * refused with its bytes per GPU before a byte of it is read; so is N above the GPUs present or
 * the routed experts, and a build without NCCL.  After loading, the model is uploaded over the
 * N GPUs (mmoe_ep_gpu_forward.h: one GPU forward per rank, NCCL over GPUs 0..N-1), and the
 * command's forward calls go there; N = 1 is the same code with a one-rank communicator.
 */
#include <stdlib.h>
#include <string.h>

#include "cli_ep.h"
#include "config.h"
#include "ep_internal.h"
#include "mmoe_cli.h"
#include "mmoe_config.h"
#include "mmoe_model_tensors.h"

int mmoe_cli_ep_option(const char *cmd, const char *name, const char *arg, mmoe_cli_ep *o)
{
    if (strcmp(name, "gpu-memory") == 0)
        return mmoe_cli_opt_f64(cmd, name, arg, 0.0, 1e6, MMOE_CLI_LO_OPEN, &o->gpu_mem_gib);
    return mmoe_cli_opt_int(cmd, name, arg, 1, MMOE_EP_MAX_RANKS, strcmp(name, "gpus") == 0 ? &o->gpus : &o->ep_ranks);
}

/** The weights-per-GPU plan of the checkpoint in @p dir over @p o->gpus GPUs. */
static mmoe_status plan_gpus(const mmoe_cli_ep *o, const char *dir, uint64_t capacity, mmoe_ep_memory_plan *plan,
                             mmoe_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    mmoe_config cfg;
    mmoe_status st = mmoe_config_load(path, &cfg, err);
    if (st != MMOE_OK)
        return st;
    mmoe_tensor_spec *specs = NULL;
    size_t n = 0;
    if ((st = mmoe_model_tensor_list(&cfg, &specs, &n, err)) != MMOE_OK)
        return st;
    const char **names = malloc((n + 1) * sizeof *names);
    uint64_t *bytes = malloc((n + 1) * sizeof *bytes);
    if (names == NULL || bytes == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "out of memory for the tensor list");
    } else {
        for (size_t i = 0; i < n; i++) {
            names[i] = specs[i].name;
            bytes[i] = mmoe_model_tensor_bytes(&specs[i], 1);
        }
        st = mmoe_ep_memory_plan_make(names, bytes, n, cfg.n_routed_experts, o->gpus, capacity, plan, err);
    }
    free(names);
    free(bytes);
    free(specs);
    return st;
}

mmoe_status mmoe_cli_ep_before_load(const mmoe_cli_ep *o, const char *model_dir, mmoe_error *err)
{
    if (o->ep_ranks > 0 && o->gpus > 0)
        return mmoe_error_set(err, MMOE_EINVAL, "--ep-ranks (CPU ranks) and --gpus exclude each other");
    if (o->gpus == 0 && o->gpu_mem_gib > 0)
        return mmoe_error_set(err, MMOE_EINVAL, "--gpu-memory plans --gpus, which was not given");
    if (o->ep_ranks > 0) { /* N > E is known from the config: refused before loading */
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", model_dir);
        mmoe_config cfg;
        mmoe_status st = mmoe_config_load(path, &cfg, err);
        mmoe_ep_partition part;
        if (st == MMOE_OK)
            st = mmoe_ep_partition_make(cfg.n_routed_experts, o->ep_ranks, &part, err);
        return st != MMOE_OK ? mmoe_error_prefix(err, "--ep-ranks %d: %s: ", o->ep_ranks, model_dir) : MMOE_OK;
    }
    if (o->gpus == 0)
        return MMOE_OK;
    int n_dev = 0;
    uint64_t dev_bytes = 0;
    mmoe_error dev_err;
    mmoe_status dev_st = ep_cuda_devices(&n_dev, &dev_bytes, &dev_err);
    uint64_t gpu_bytes = o->gpu_mem_gib > 0 ? (uint64_t)(o->gpu_mem_gib * 1024.0 * 1024.0 * 1024.0) : dev_bytes;
    if (gpu_bytes == 0)
        return mmoe_error_set(err, MMOE_ENODEV, "--gpus %d: %s; --gpu-memory GIB plans without a GPU", o->gpus,
                              dev_err.msg);
    mmoe_ep_memory_plan plan;
    mmoe_status st = plan_gpus(o, model_dir, (uint64_t)((double)gpu_bytes * MMOE_CLI_EP_WEIGHT_SHARE), &plan, err);
    if (st == MMOE_OK)
        st = mmoe_ep_memory_check(&plan, err);
    if (st != MMOE_OK)
        return mmoe_error_prefix(err, "--gpus %d: %s: ", o->gpus, model_dir);
    fprintf(stderr, "gpus: %d, %.3f GiB of weights per GPU (%.3f GiB replicated, %.3f GiB of experts in all)\n",
            o->gpus, (double)plan.per_gpu_bytes / (1024.0 * 1024.0 * 1024.0),
            (double)plan.replicated_bytes / (1024.0 * 1024.0 * 1024.0),
            (double)plan.expert_bytes / (1024.0 * 1024.0 * 1024.0));
    if (dev_st != MMOE_OK)
        return mmoe_error_set(err, MMOE_ENODEV, "--gpus %d: %s", o->gpus, dev_err.msg);
    if (n_dev < o->gpus)
        return mmoe_error_set(err, MMOE_ENODEV, "--gpus %d: this machine has %d GPU(s)", o->gpus, n_dev);
#ifndef MMOE_HAVE_NCCL
    return mmoe_error_set(err, MMOE_ENODEV, "--gpus %d: this build has no NCCL (configure --with-nccl)", o->gpus);
#else
    return MMOE_OK;
#endif
}

mmoe_status mmoe_cli_ep_open_gpus(const mmoe_cli_ep *o, const mmoe_model *m, int64_t max_seq_len, int64_t max_tokens,
                                  const char *cmd, int quiet, mmoe_ep_gpu_model **out, mmoe_error *err)
{
    *out = NULL;
    if (o->gpus == 0)
        return MMOE_OK;
    mmoe_status st = mmoe_ep_gpu_model_create(m, o->gpus, MMOE_EP_COMM_NCCL, max_seq_len, max_tokens, out, err);
    if (st != MMOE_OK)
        return mmoe_error_prefix(err, "--gpus %d: ", o->gpus);
    if (!quiet) {
        const mmoe_ep_partition *p = mmoe_ep_gpu_model_partition(*out);
        fprintf(stderr, "%s: backend: gpu over %d GPU(s) (expert parallel, nccl); MiB on each GPU, experts:", cmd,
                o->gpus);
        for (int r = 0; r < o->gpus; r++) {
            mmoe_gpu_model_bytes b;
            mmoe_gpu_model_bytes_held(mmoe_ep_gpu_model_rank(*out, r), &b);
            fprintf(stderr, " GPU %d %.1f, [%lld, %lld)%s", r, (double)b.total / 1048576.0, (long long)p->first[r],
                    (long long)p->first[r + 1],
                    r + 1 < o->gpus ? ";" : "; cuda graph: off (the ranks run kernel by kernel)\n");
        }
    }
    return MMOE_OK;
}

mmoe_status mmoe_cli_ep_attach(const mmoe_cli_ep *o, mmoe_model *m, mmoe_ep_model **out, mmoe_error *err)
{
    *out = NULL;
    if (o->ep_ranks == 0)
        return MMOE_OK;
    return mmoe_ep_model_attach(m, o->ep_ranks, MMOE_EP_COMM_INPROC, NULL, NULL, out, err);
}

void mmoe_cli_ep_gpus_report(FILE *f, const mmoe_ep_gpu_model *e)
{
    if (e == NULL)
        return;
    mmoe_ep_gpu_stats s;
    mmoe_ep_gpu_model_stats(e, &s);
    const int n = mmoe_ep_gpu_model_ranks(e);
    fprintf(f, "gpus: %d ranks, %lld MoE exchanges, routed pairs per rank:", n, (long long)s.exchanges);
    for (int r = 0; r < n; r++)
        fprintf(f, " %lld", (long long)s.pairs[r]);
    fputc('\n', f);
}

void mmoe_cli_ep_report(FILE *f, const mmoe_ep_model *e)
{
    if (e == NULL)
        return;
    const int n = mmoe_ep_model_ranks(e);
    const int64_t *pairs = mmoe_ep_model_pairs(e);
    fprintf(f, "ep: %d in-process ranks, routed pairs per rank:", n);
    for (int r = 0; r < n; r++)
        fprintf(f, " %lld", (long long)pairs[r]);
    fputc('\n', f);
}
