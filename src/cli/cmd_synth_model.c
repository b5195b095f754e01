/**
 * @file cmd_synth_model.c
 * @brief `megamoe synth-model`: write a random DeepSeek-V4 checkpoint directory in the published format.
 *
 *     megamoe synth-model --shape tiny|v4-flash|v4-pro --layers N --seed S --out DIR [--shard-mib M]
 *
 * The directory gets config.json (Hugging Face keys), model.safetensors.index.json and
 * the shards; see mmoe_synth_model.h for the values and the quantization.  The tiny
 * shape keeps every layer type: hash-routed layers, window-only, ratio 4 (CSA with
 * the indexer), ratio 128 (HCA) and the MTP block.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_config.h"
#include "mmoe_synth_model.h"

/** Print the usage text to @p out. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe synth-model --shape tiny|v4-flash|v4-pro --out DIR [--layers N] [--seed S]\n"
            "                           [--shard-mib M]\n"
            "  Write a random checkpoint (config.json, index, shards) with the real tensor names,\n"
            "  dtypes and quantization (FP8 128x128 blocks + UE8M0; experts FP4 1x32 + UE8M0).\n"
            "  --layers N     main layers (default: the shape's own; tiny 4); plus one MTP layer\n"
            "  --experts E    routed experts per layer (default: the shape's; >= its top-k)\n"
            "  --vocab V      vocabulary rows of embedding and head (default: the shape's)\n"
            "  --seed S       RNG seed (default 1)\n"
            "  --shard-mib M  shard size target in MiB (default 4096)\n");
}

/** Progress line on stderr. */
static void progress(void *ctx, int shard, int n_shards, uint64_t bytes)
{
    (void)ctx;
    fprintf(stderr, "synth-model: shard %d/%d written (%.1f MiB so far)\n", shard, n_shards,
            (double)bytes / (1024.0 * 1024.0));
}

/** Parse a non-negative integer (0x allowed); 0 on success, -1 on error. */
static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    if (!s[0] || s[0] == '-')
        return -1;
    *v = strtoull(s, &end, 0);
    return *end ? -1 : 0;
}

int mmoe_cmd_synth_model(int argc, char **argv)
{
    static const struct option opts[] = {{"shape", required_argument, 0, 's'}, {"layers", required_argument, 0, 'l'},
                                         {"seed", required_argument, 0, 'S'},  {"out", required_argument, 0, 'o'},
                                         {"shard-mib", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'},
                                         {"experts", required_argument, 0, 'e'}, {"vocab", required_argument, 0, 'v'},
                                         {0, 0, 0, 0}};
    const char *shape = NULL, *out = NULL;
    uint64_t layers = 0, seed = 1, shard_mib = 4096, experts = 0, vocab = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 's': shape = optarg; break;
        case 'o': out = optarg; break;
        case 'l':
            if (parse_u64(optarg, &layers) || layers < 1 || layers > 200) {
                fprintf(stderr, "megamoe synth-model: --layers '%s': expected an integer in [1, 200]\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'S':
            if (parse_u64(optarg, &seed)) {
                fprintf(stderr, "megamoe synth-model: --seed '%s': expected a non-negative integer\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'm':
            if (parse_u64(optarg, &shard_mib) || shard_mib < 1) {
                fprintf(stderr, "megamoe synth-model: --shard-mib '%s': expected a positive integer\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'e':
            if (parse_u64(optarg, &experts) || experts < 1 || experts > 4096) {
                fprintf(stderr, "megamoe synth-model: --experts '%s': expected an integer in [1, 4096]\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'v':
            if (parse_u64(optarg, &vocab) || vocab < 2 || vocab > (1u << 24)) {
                fprintf(stderr, "megamoe synth-model: --vocab '%s': expected an integer in [2, 16777216]\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
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
    fprintf(stderr, "synth-model: shape %s, %d layers + %d MTP, seed %llu -> %s\n", shape, cfg.n_layers,
            cfg.n_mtp_layers, (unsigned long long)seed, out);
    if (mmoe_synth_model_write(&cfg, seed, out, shard_mib << 20, progress, NULL, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe %s\n", err.msg); /* the message starts with "synth-model: " */
        return 1;
    }
    return 0;
}
