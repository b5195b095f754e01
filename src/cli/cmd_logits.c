/**
 * @file cmd_logits.c
 * @brief `megamoe logits`: the full model's F32 logits for a token sequence, written to a safetensors file.
 *
 *     megamoe logits --model DIR --ids 0,15,27,... --out FILE [--last] [--mtp] [--decode] [--threads N]
 *                    [--backend cpu|gpu|auto] [--cuda-graph on|off] [--ep-ranks N | --gpus N [--gpu-memory GIB]]
 *
 * Loads the checkpoint (a progress line per layer on stderr when it is a terminal), runs one
 * prefill over the token ids from position 0 and writes `logits` F32 [T, vocab] (`--last`:
 * [1, vocab]) to FILE atomically; FILE may not be a file of the checkpoint.  `--mtp` also writes `mtp_logits` F32 [T-1, vocab]: the MTP block fed
 * with the final streams of positions 0..T-2 and the tokens 1..T-1 (the DeepSeek-V3
 * wiring; an assumption, @ref spec_arch_mtp).  `--decode` runs the tokens one at a time instead of
 * one prefill (same logits; for comparisons).  The metadata records the id list and
 * the mode (key `tokens`) and the backend.  `--backend gpu` runs the forward on the GPU
 * (mmoe_gpu_forward.h) in calls of at most LOGITS_GPU_CHUNK tokens; `auto` takes the GPU when
 * there is one and says so.  The expert-parallel options are cli_ep.h's: `--ep-ranks N` splits the
 * CPU forward, `--gpus N` runs the GPU forward over N GPUs (same chunks, same bits as one GPU).
 * `--cuda-graph on` (mmoe_fwd_backend.h) makes the GPU's one-token calls with logits (`--decode`)
 * replays of one captured graph; the metadata key `cuda_graph` says whether a call did.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_ep.h"
#include "mmoe_cli.h"
#include "mmoe_fwd_backend.h"
#include "mmoe_model.h"
#include "mmoe_safetensors.h"

/** Most ids in one --ids list. */
#define LOGITS_MAX_IDS (1 << 20)
/** Tokens per GPU forward call (the GPU model's work buffers hold this many). */
#define LOGITS_GPU_CHUNK 64

/** Print the usage text to @p out. */
static void usage(FILE *out)
{
    fprintf(out, "usage: megamoe logits --model DIR --ids ID,ID,... --out FILE [options]\n\n"
                 "Run the whole model (CPU oracle or GPU) and write F32 'logits' [T, vocab] (safetensors).\n\n"
                 "  --model DIR   checkpoint directory (required)\n"
                 "  --ids LIST    the token ids, comma-separated, each 0..2147483647 (required)\n"
                 "  --out FILE    the output (required; written atomically, never a file of DIR)\n"
                 "  --last        only the last position's logits ([1, vocab]) (default: all positions)\n"
                 "  --mtp         also 'mtp_logits' [T-1, vocab] (MTP block on streams t and token t+1) (default off)\n"
                 "  --decode      feed the tokens one by one (decode path) instead of one prefill (default off)\n"
                 "  --threads N   worker threads of the forward (OpenBLAS then runs one), 1..%d (default: MMOE_DEQUANT_THREADS, else the cores up to 16)\n"
                 "  --backend B   cpu (the oracle), gpu (refused without a usable GPU) or auto (default cpu)\n"
                 MMOE_CUDA_GRAPH_USAGE MMOE_CLI_EP_USAGE "\n"
                 "example:\n"
                 "  megamoe logits --model fixtures/tiny-dsv4 --ids 0,15,27 --out logits.safetensors\n",
            MMOE_CLI_MAX_THREADS);
}

/** Progress line on stderr, rewritten in place: only on a terminal. */
static void progress(void *ctx, int done, int total, const char *what)
{
    (void)ctx;
    if (mmoe_cli_progress_allowed())
        fprintf(stderr, "\rloading: %d/%d layers (%s)%s", done, total, what, done == total ? "\n" : "   ");
}

int mmoe_cmd_logits(int argc, char **argv)
{
    enum { O_THREADS = 256, O_TOKENS };
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"ids", required_argument, 0, 't'},
                                         {"out", required_argument, 0, 'o'},   {"last", no_argument, 0, 'l'},
                                         {"mtp", no_argument, 0, 'p'},         {"decode", no_argument, 0, 'd'},
                                         {"threads", required_argument, 0, O_THREADS},
                                         {"tokens", required_argument, 0, O_TOKENS},
                                         {"ep-ranks", required_argument, 0, 'E'}, {"gpus", required_argument, 0, 'G'},
                                         {"gpu-memory", required_argument, 0, 'M'},
                                         {"backend", required_argument, 0, 'b'}, {"help", no_argument, 0, 'h'},
                                         {"cuda-graph", required_argument, 0, 'g'}, {0, 0, 0, 0}};
    const char *model_dir = NULL, *tokens = NULL, *out_path = NULL;
    int last = 0, mtp = 0, decode = 0, threads = 0, c, rc = 0;
    mmoe_cli_ep ep_opt = {0};
    mmoe_backend backend = MMOE_BACKEND_CPU;
    int backend_given = 0;
    mmoe_cuda_graph_opt graph = {0, 0};
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tokens = optarg; break;
        case 'o': out_path = optarg; break;
        case 'l': last = 1; break;
        case 'p': mtp = 1; break;
        case 'd': decode = 1; break;
        case O_THREADS: rc = mmoe_cli_opt_int("logits", "threads", optarg, 1, MMOE_CLI_MAX_THREADS, &threads); break;
        case O_TOKENS:
            fprintf(stderr, "megamoe logits: --tokens is now --ids ID,ID,... (the token ids)\n");
            rc = MMOE_EXIT_USAGE;
            break;
        case 'E': rc = mmoe_cli_ep_option("logits", "ep-ranks", optarg, &ep_opt); break;
        case 'G': rc = mmoe_cli_ep_option("logits", "gpus", optarg, &ep_opt); break;
        case 'M': rc = mmoe_cli_ep_option("logits", "gpu-memory", optarg, &ep_opt);
            break;
        case 'b':
            backend_given = 1;
            if (mmoe_backend_parse(optarg, &backend) != 0) {
                fprintf(stderr, "megamoe logits: --backend '%s': expected cpu, gpu or auto\n", optarg);
                rc = MMOE_EXIT_USAGE;
            }
            break;
        case 'g': rc = mmoe_cuda_graph_option("logits", optarg, &graph); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
    if (ep_opt.ep_ranks > 0 && backend != MMOE_BACKEND_CPU) {
        fprintf(stderr, "megamoe logits: --ep-ranks splits the CPU forward's MoE layers: use it with --backend cpu\n");
        return MMOE_EXIT_USAGE;
    }
    if (ep_opt.gpus > 0 && backend_given && backend != MMOE_BACKEND_GPU) {
        fprintf(stderr, "megamoe logits: --gpus runs the GPU forward over N GPUs: --backend cpu or auto contradicts it\n");
        return MMOE_EXIT_USAGE;
    }
    if (!model_dir || !tokens || !out_path || optind != argc) {
        fprintf(stderr, "megamoe logits: %s\n", optind != argc ? "unexpected argument"
                                                               : "--model, --ids and --out are required");
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    if ((rc = mmoe_cuda_graph_resolve("logits", &graph, backend, ep_opt.gpus)) != 0)
        return rc;
    int64_t *list = NULL;
    size_t n_ids = 0;
    if ((rc = mmoe_cli_opt_i64_list("logits", "ids", tokens, 0, INT32_MAX, LOGITS_MAX_IDS, &list, &n_ids)) != 0)
        return rc;
    const int64_t T = (int64_t)n_ids;
    int32_t *ids = malloc(sizeof(int32_t) * n_ids);
    if (ids == NULL) {
        free(list);
        fprintf(stderr, "megamoe logits: out of memory for %zu ids\n", n_ids);
        return 1;
    }
    for (size_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)list[i];
    free(list);
    mmoe_cli_set_forward_threads(threads);
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_model *m = NULL;
    mmoe_model_state *s = NULL;
    mmoe_gpu_model *gpu = NULL;
    float *logits = NULL, *mtp_logits = NULL;
    uint16_t *streams = NULL;
    mmoe_st_writer *w = NULL;
    mmoe_ep_model *ep = NULL;
    mmoe_ep_gpu_model *gpus = NULL;
    rc = 1;
    const mmoe_cli_path outs[] = {{"out", out_path, 0}}, ins[] = {{"model", model_dir, 0}};
    mmoe_status st = mmoe_cli_check_outputs(outs, 1, ins, 1, &err);
    if (st != MMOE_OK)
        goto done;
    st = mmoe_cli_ep_before_load(&ep_opt, model_dir, &err);
    if (st == MMOE_OK)
        st = mmoe_model_open(model_dir, progress, NULL, &m, &err);
    if (st == MMOE_OK)
        st = mmoe_cli_ep_attach(&ep_opt, m, &ep, &err);
    if (st != MMOE_OK)
        goto done;
    const mmoe_config *cfg = mmoe_model_config(m);
    const int64_t V = cfg->vocab_size, rows = last ? 1 : T;
    if (mtp && (cfg->n_mtp_layers < 1 || T < 2)) {
        fprintf(stderr, "megamoe logits: --mtp needs an MTP layer and at least 2 tokens\n");
        rc = MMOE_EXIT_USAGE;
        goto done;
    }
    if ((st = mmoe_model_state_create(m, T + 1, &s, &err)) != MMOE_OK)
        goto done;
    if (ep_opt.gpus > 0)
        st = mmoe_cli_ep_open_gpus(&ep_opt, m, T + 1, LOGITS_GPU_CHUNK, "megamoe logits", 0, &gpus, &err);
    else
        st = mmoe_backend_open(backend, m, T + 1, LOGITS_GPU_CHUNK, graph.on, "megamoe logits", 0, &gpu, &err);
    if (st != MMOE_OK)
        goto done;
    const int on_gpu = gpu != NULL || gpus != NULL;
    logits = malloc(sizeof(float) * (size_t)(rows * V));
    if (mtp) {
        mtp_logits = malloc(sizeof(float) * (size_t)((T - 1) * V));
        streams = malloc(sizeof(uint16_t) * (size_t)(T * cfg->hc_mult * cfg->dim));
    }
    if (!logits || (mtp && (!mtp_logits || !streams))) {
        st = mmoe_error_set(&err, MMOE_ENOMEM, "out of memory for the logits");
        goto done;
    }
    const size_t srow = (size_t)(cfg->hc_mult * cfg->dim);
    if (!decode && !on_gpu) {
        st = mmoe_model_forward(m, s, ids, T, logits, last, streams, &err);
    } else {
        /* one token per call (--decode), or the GPU's chunks */
        const int64_t step = decode ? 1 : LOGITS_GPU_CHUNK;
        for (int64_t t = 0; t < T && st == MMOE_OK; t += step) {
            const int64_t n = T - t < step ? T - t : step;
            const int tail = last && t + n == T;
            float *dst = last ? (tail ? logits : NULL) : logits + t * V;
            uint16_t *sd = streams ? streams + (size_t)t * srow : NULL;
            st = gpus ? mmoe_ep_gpu_model_forward(gpus, ids + t, n, dst, tail, sd, &err)
                 : gpu ? mmoe_gpu_model_forward(gpu, ids + t, n, dst, tail, sd, &err)
                       : mmoe_model_forward(m, s, ids + t, n, dst, tail, sd, &err);
        }
    }
    for (int64_t t = 0; st == MMOE_OK && mtp && t < T - 1; t += LOGITS_GPU_CHUNK) {
        const int64_t n = !on_gpu ? T - 1 : (T - 1 - t < LOGITS_GPU_CHUNK ? T - 1 - t : LOGITS_GPU_CHUNK);
        const uint16_t *sin = streams + (size_t)t * srow;
        st = gpus  ? mmoe_ep_gpu_model_mtp_forward(gpus, sin, ids + 1 + t, n, mtp_logits + t * V, &err)
             : gpu ? mmoe_gpu_model_mtp_forward(gpu, sin, ids + 1 + t, n, mtp_logits + t * V, &err)
                   : mmoe_model_mtp_forward(m, s, streams, ids + 1, T - 1, mtp_logits, &err);
        if (!on_gpu)
            break;
    }
    if (st != MMOE_OK)
        goto done;
    if ((st = mmoe_st_writer_create(&w, &err)) != MMOE_OK)
        goto done;
    int64_t shape[2] = {rows, V}, mshape[2] = {T - 1, V};
    st = mmoe_st_writer_add(w, "logits", MMOE_DT_F32, 2, shape, logits, sizeof(float) * (size_t)(rows * V), &err);
    if (st == MMOE_OK && mtp)
        st = mmoe_st_writer_add(w, "mtp_logits", MMOE_DT_F32, 2, mshape, mtp_logits,
                                sizeof(float) * (size_t)((T - 1) * V), &err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "tokens", tokens, &err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "mode", decode ? "decode" : "prefill", &err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "backend", on_gpu ? "gpu" : "cpu", &err);
    if (st == MMOE_OK) /* whether a call replayed the decode graph (one-token calls with logits) */
        st = mmoe_st_writer_set_metadata(w, "cuda_graph", mmoe_backend_graphed(gpu) ? "true" : "false", &err);
    char n_gpus[16];
    snprintf(n_gpus, sizeof n_gpus, "%d", ep_opt.gpus);
    if (st == MMOE_OK && gpus)
        st = mmoe_st_writer_set_metadata(w, "gpus", n_gpus, &err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_finish(w, out_path, &err);
    if (st == MMOE_OK) {
        fprintf(stderr, "logits: %lld x %lld written to %s\n", (long long)rows, (long long)V, out_path);
        mmoe_cli_ep_report(stderr, ep);
        mmoe_cli_ep_gpus_report(stderr, gpus);
        rc = 0;
    }
done:
    if (st != MMOE_OK)
        fprintf(stderr, "megamoe logits: %s\n", err.msg);
    mmoe_st_writer_destroy(w);
    free(logits);
    free(mtp_logits);
    free(streams);
    mmoe_gpu_model_destroy(gpu);
    mmoe_ep_gpu_model_destroy(gpus);
    mmoe_model_state_destroy(s);
    mmoe_ep_model_detach(ep);
    mmoe_model_close(m);
    free(ids);
    return rc;
}
