/**
 * @file cmd_synth_model.c
 * @brief `megamoe synth-model`: write a random DeepSeek-V4 checkpoint directory in the published format.
 *
 *     megamoe synth-model --shape tiny|v4-flash|v4-pro --layers N --seed S --out DIR [--shard-mib M] [--threads N]
 *
 * The directory gets config.json (Hugging Face keys), model.safetensors.index.json and
 * the shards; see mmoe_synth_model.h for the values and the quantization.  The tiny
 * shape keeps every layer type: hash-routed layers, window-only, ratio 4 (CSA with
 * the indexer), ratio 128 (HCA) and the MTP block.  `--threads` sets how many threads
 * generate a shard's tensors (default: every online CPU); the files do not depend on it.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_config.h"
#include "mmoe_synth_model.h"

/** @cond */
_Static_assert(MMOE_CLI_MAX_THREADS <= MMOE_SYNTH_MAX_THREADS, "--threads accepts more threads than the writer");
/** @endcond */

/** Print the usage text to @p out. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe synth-model --shape tiny|v4-flash|v4-pro --out DIR [options]\n\n"
            "Write a random checkpoint (config.json, index, shards) with the real tensor names,\n"
            "dtypes and quantization (FP8 128x128 blocks + UE8M0; experts FP4 1x32 + UE8M0).\n\n"
            "  --shape S      tiny, v4-flash or v4-pro (required)\n"
            "  --out DIR      the checkpoint directory (required; must not exist, or be empty)\n"
            "  --layers N     main layers, 1..200 (default: the shape's own; tiny 4); plus one MTP layer\n"
            "  --experts E    routed experts per layer, 1..4096 (default: the shape's; >= its top-k)\n"
            "  --vocab V      vocabulary rows of embedding and head, 2..16777216 (default: the shape's)\n"
            "  --seed S       RNG seed (default 1)\n"
            "  --shard-mib M  shard size target in MiB, >= 1 (default 4096)\n"
            "  --threads N    threads generating the tensors, 1..%d (default: the online CPU count, here %d);\n"
            "                 the files are the same for every N\n\n"
            "example:\n"
            "  megamoe synth-model --shape tiny --seed 1 --out tiny-ck\n",
            MMOE_CLI_MAX_THREADS, mmoe_synth_model_online_threads());
}

/** Progress line on stderr. */
static void progress(void *ctx, int shard, int n_shards, uint64_t bytes)
{
    (void)ctx;
    fprintf(stderr, "synth-model: shard %d/%d written (%.1f MiB so far)\n", shard, n_shards,
            (double)bytes / (1024.0 * 1024.0));
}

int mmoe_cmd_synth_model(int argc, char **argv)
{
    static const struct option opts[] = {{"shape", required_argument, 0, 's'}, {"layers", required_argument, 0, 'l'},
                                         {"seed", required_argument, 0, 'S'},  {"out", required_argument, 0, 'o'},
                                         {"shard-mib", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'},
                                         {"experts", required_argument, 0, 'e'}, {"vocab", required_argument, 0, 'v'},
                                         {"threads", required_argument, 0, 't'}, {0, 0, 0, 0}};
    const char *shape = NULL, *out = NULL;
    const char *cmd = "synth-model";
    uint64_t layers = 0, seed = 1, shard_mib = 4096, experts = 0, vocab = 0;
    int threads = mmoe_synth_model_online_threads();
    int c, rc = 0;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's': shape = optarg; break;
        case 'o': out = optarg; break;
        case 'l': rc = mmoe_cli_opt_u64(cmd, "layers", optarg, 1, 200, &layers); break;
        case 'S': rc = mmoe_cli_opt_u64(cmd, "seed", optarg, 0, UINT64_MAX, &seed); break;
        case 'm': rc = mmoe_cli_opt_u64(cmd, "shard-mib", optarg, 1, UINT64_C(1) << 30, &shard_mib); break;
        case 'e': rc = mmoe_cli_opt_u64(cmd, "experts", optarg, 1, 4096, &experts); break;
        case 'v': rc = mmoe_cli_opt_u64(cmd, "vocab", optarg, 2, UINT64_C(1) << 24, &vocab); break;
        case 't': rc = mmoe_cli_opt_int(cmd, "threads", optarg, 1, MMOE_CLI_MAX_THREADS, &threads); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
    if (!shape || !out || optind != argc) {
        fprintf(stderr, "megamoe synth-model: %s\n", !shape ? "--shape is required" : !out ? "--out is required"
                                                                                       : "unexpected argument");
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_config_preset(shape, (int)layers, &cfg, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe synth-model: %s\n", err.msg);
        return MMOE_EXIT_USAGE;
    }
    if (experts > 0 && (int64_t)experts < cfg.n_activated_experts) {
        fprintf(stderr, "megamoe synth-model: --experts %llu: the shape routes to %d experts per token\n",
                (unsigned long long)experts, cfg.n_activated_experts);
        return MMOE_EXIT_USAGE;
    }
    if (experts > 0)
        cfg.n_routed_experts = (int)experts;
    if (vocab > 0)
        cfg.vocab_size = (int64_t)vocab;
    fprintf(stderr, "synth-model: shape %s, %d layers + %d MTP, seed %llu, %d thread%s -> %s\n", shape,
            cfg.n_layers, cfg.n_mtp_layers, (unsigned long long)seed, threads, threads == 1 ? "" : "s", out);
    if (mmoe_synth_model_write(&cfg, seed, out, shard_mib << 20, threads, progress, NULL, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe %s\n", err.msg); /* the message starts with "synth-model: " */
        return 1;
    }
    return 0;
}
