/**
 * @file cmd_synth_layer.c
 * @brief `megamoe synth-layer`: write a random MoE layer with real shapes and dtypes.
 *
 *     megamoe synth-layer --shape v4-flash|v4-pro|v4.1-flash|tiny --seed S --out FILE
 *                         [--experts N] [--tokens T] [--input-out FILE] [--layer L]
 *                         [--values normal|dyadic] [--hash] [--topk K]
 *
 * The layer (mmoe_moe_synth.h) is written with DeepSeek-V4's checkpoint names (prefixed
 * `layers.L.` with --layer) and `moe.*` metadata, so that `megamoe moe` reads it like a
 * checkpoint shard.  With --tokens, a random input file (`x` BF16 [T, D], `token_ids` I32 [T])
 * is written too, to --input-out or next to FILE as FILE's stem + ".input.safetensors".
 * --hash makes a hash-routed layer (`ffn.gate.tid2eid`, vocab 1024 for tiny shapes).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_moe_synth.h"
#include "mmoe_safetensors.h"

/** Print the usage. */
static void synth_usage(FILE *out)
{
    fprintf(out, "usage: megamoe synth-layer --shape v4-flash|v4-pro|v4.1-flash|tiny --seed S --out FILE\n"
                 "                           [--experts N] [--tokens T] [--input-out FILE] [--layer L]\n"
                 "                           [--values normal|dyadic] [--hash] [--topk K]\n\n"
                 "Write a random MoE layer (checkpoint names and dtypes) and optionally a random input.\n");
}

/** Write a random input file: x [t, D] and token_ids [t]. */
static mmoe_status write_input(const mmoe_moe_desc *d, int64_t t, uint64_t seed, mmoe_moe_synth_values v,
                               const char *path, mmoe_error *err)
{
    uint16_t *x = malloc((size_t)(t * d->hidden > 0 ? t * d->hidden : 1) * 2);
    int32_t *ids = malloc((size_t)(t > 0 ? t : 1) * 4);
    mmoe_st_writer *w = NULL;
    mmoe_status st = x == NULL || ids == NULL ? mmoe_error_set(err, MMOE_ENOMEM, "out of memory for %lld tokens", (long long)t)
                                              : mmoe_st_writer_create(&w, err);
    if (st == MMOE_OK) {
        mmoe_moe_synth_input(d, t, seed, v, x, ids);
        const int64_t xs[2] = {t, d->hidden}, is[1] = {t};
        st = mmoe_st_writer_add(w, "x", MMOE_DT_BF16, 2, xs, x, (size_t)(t * d->hidden) * 2, err);
        if (st == MMOE_OK)
            st = mmoe_st_writer_add(w, "token_ids", MMOE_DT_I32, 1, is, ids, (size_t)t * 4, err);
        if (st == MMOE_OK)
            st = mmoe_st_writer_finish(w, path, err);
    }
    mmoe_st_writer_destroy(w);
    free(x);
    free(ids);
    return st;
}

int mmoe_cmd_synth_layer(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"shape", required_argument, 0, 'S'}, {"experts", required_argument, 0, 'e'},
        {"tokens", required_argument, 0, 't'}, {"seed", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'}, {"input-out", required_argument, 0, 'i'},
        {"layer", required_argument, 0, 'l'}, {"values", required_argument, 0, 'v'},
        {"hash", no_argument, 0, 'H'}, {"topk", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *shape = NULL, *out = NULL, *input_out = NULL, *values = "normal";
    long long experts = 0, tokens = -1;
    int layer = -1, hash = 0, topk = 0, have_seed = 0;
    unsigned long long seed = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'S': shape = optarg; break;
        case 'e': experts = atoll(optarg); break;
        case 't': tokens = atoll(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 0); have_seed = 1; break;
        case 'o': out = optarg; break;
        case 'i': input_out = optarg; break;
        case 'l': layer = atoi(optarg); break;
        case 'v': values = optarg; break;
        case 'H': hash = 1; break;
        case 'k': topk = atoi(optarg); break;
        case 'h': synth_usage(stdout); return 0;
        default: synth_usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (shape == NULL || out == NULL || !have_seed) {
        fprintf(stderr, "megamoe synth-layer: --shape, --seed and --out are required\n");
        synth_usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    mmoe_moe_synth_values v;
    if (strcmp(values, "normal") == 0)
        v = MMOE_SYNTH_NORMAL;
    else if (strcmp(values, "dyadic") == 0)
        v = MMOE_SYNTH_DYADIC;
    else {
        fprintf(stderr, "megamoe synth-layer: unknown --values '%s' (expected normal or dyadic)\n", values);
        return MMOE_EXIT_USAGE;
    }
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_moe_desc d;
    mmoe_status st = mmoe_moe_desc_from_shape(shape, experts, &d, &err);
    if (st == MMOE_OK) {
        if (topk > 0)
            d.topk = topk;
        if (hash) {
            d.routing = MMOE_ROUTING_HASH;
            if (strcmp(shape, "tiny") == 0)
                d.vocab = 1024;
        }
    }
    mmoe_moe_synth *s = NULL;
    if (st == MMOE_OK)
        st = mmoe_moe_synth_create(&d, seed, v, &s, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_synth_write(s, layer, out, &err);
    if (st == MMOE_OK)
        printf("wrote %s: %s, D %lld, I %lld, E %lld, topk %d, %s routing, %d shared (block %d), %s values, seed %llu\n",
               out, shape, (long long)d.hidden, (long long)d.inter, (long long)d.n_experts, d.topk,
               d.routing == MMOE_ROUTING_HASH ? "hash" : "biased", d.n_shared, d.shared_block, values, seed);
    if (st == MMOE_OK && tokens >= 0) {
        char path[4096];
        if (input_out == NULL) {
            size_t n = strlen(out);
            const char *ext = ".safetensors";
            size_t el = strlen(ext);
            size_t stem = n >= el && strcmp(out + n - el, ext) == 0 ? n - el : n;
            snprintf(path, sizeof path, "%.*s.input.safetensors", (int)stem, out);
            input_out = path;
        }
        st = write_input(&d, tokens, seed, v, input_out, &err);
        if (st == MMOE_OK)
            printf("wrote %s: x [%lld, %lld], token_ids [%lld]\n", input_out, tokens, (long long)d.hidden, tokens);
    }
    mmoe_moe_synth_destroy(s);
    if (st != MMOE_OK) {
        fprintf(stderr, "megamoe synth-layer: %s\n", err.msg);
        return 1;
    }
    return 0;
}
