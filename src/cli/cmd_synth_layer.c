/**
 * @file cmd_synth_layer.c
 * @brief `megamoe synth-layer`: write a random MoE layer with real shapes and dtypes.
 *
 *     megamoe synth-layer --shape v4-flash|v4-pro|v4.1-flash|tiny --seed S --out FILE
 *                         [--experts N] [--input-tokens T] [--input-out FILE] [--layer L]
 *                         [--values normal|dyadic] [--hash] [--topk K]
 *
 * The layer (mmoe_moe_synth.h) is written with DeepSeek-V4's checkpoint names (prefixed
 * `layers.L.` with --layer) and `moe.*` metadata, so that `megamoe moe` reads it like a
 * checkpoint shard.  With --input-tokens, a random input file (`x` BF16 [T, D], `token_ids`
 * I32 [T]) is written too, to --input-out or next to FILE as FILE's stem +
 * ".input.safetensors".  --hash makes a hash-routed layer (`ffn.gate.tid2eid`, vocab 1024 for
 * tiny shapes).  The input is made in memory before anything is written, so a run that fails
 * (out of memory for T tokens) leaves no layer file behind; the two outputs may not be the
 * same file.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mmoe_cli.h"
#include "mmoe_moe_synth.h"
#include "mmoe_safetensors.h"

/** Most tokens of a random input file (2^24: 8 GiB of x at D = 256). */
#define SYNTH_MAX_INPUT_TOKENS (INT64_C(1) << 24)

/** Print the usage. */
static void synth_usage(FILE *out)
{
    fprintf(out, "usage: megamoe synth-layer --shape SHAPE --seed S --out FILE [options]\n\n"
                 "Write a random MoE layer (checkpoint names and dtypes) and optionally a random input.\n\n"
                 "  --shape SHAPE       v4-flash, v4-pro, v4.1-flash or tiny (required)\n"
                 "  --seed S            RNG seed, a non-negative integer (required)\n"
                 "  --out FILE          the layer file (required; written atomically)\n"
                 "  --experts N         routed experts, >= the top-k (default: the shape's own)\n"
                 "  --input-tokens T    also write a random input of T tokens, 0..%lld (default: none)\n"
                 "  --input-out FILE    where the input goes (default: FILE's stem + .input.safetensors)\n"
                 "  --layer L           prefix the names with layers.L. (default: bare names)\n"
                 "  --values V          normal or dyadic (default normal)\n"
                 "  --hash              a hash-routed layer (ffn.gate.tid2eid) (default: biased top-k)\n"
                 "  --topk K            experts per token, 1..%d (default: the shape's own)\n\n"
                 "example:\n"
                 "  megamoe synth-layer --shape tiny --seed 1 --input-tokens 16 --out layer.safetensors\n",
            (long long)SYNTH_MAX_INPUT_TOKENS, MMOE_MOE_MAX_TOPK);
}

/** A random input: x [t, D] and token_ids [t], made before anything is written. */
typedef struct synth_input {
    int64_t t;    /**< tokens */
    uint16_t *x;  /**< BF16 [t, D] */
    int32_t *ids; /**< [t] */
} synth_input;

/** Make the input in memory. */
static mmoe_status make_input(const mmoe_moe_desc *d, int64_t t, uint64_t seed, mmoe_moe_synth_values v,
                              synth_input *in, mmoe_error *err)
{
    in->t = t;
    in->x = malloc((size_t)(t * d->hidden > 0 ? t * d->hidden : 1) * 2);
    in->ids = malloc((size_t)(t > 0 ? t : 1) * 4);
    if (in->x == NULL || in->ids == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory for an input of %lld tokens", (long long)t);
    mmoe_moe_synth_input(d, t, seed, v, in->x, in->ids);
    return MMOE_OK;
}

/** Write the input file. */
static mmoe_status write_input(const mmoe_moe_desc *d, const synth_input *in, const char *path, mmoe_error *err)
{
    mmoe_st_writer *w = NULL;
    mmoe_status st = mmoe_st_writer_create(&w, err);
    const int64_t t = in->t, xs[2] = {t, d->hidden}, is[1] = {t};
    if (st == MMOE_OK)
        st = mmoe_st_writer_add(w, "x", MMOE_DT_BF16, 2, xs, in->x, (size_t)(t * d->hidden) * 2, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_add(w, "token_ids", MMOE_DT_I32, 1, is, in->ids, (size_t)t * 4, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_finish(w, path, err);
    mmoe_st_writer_destroy(w);
    return st;
}

int mmoe_cmd_synth_layer(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"shape", required_argument, 0, 'S'}, {"experts", required_argument, 0, 'e'},
        {"input-tokens", required_argument, 0, 't'}, {"tokens", required_argument, 0, 'T'},
        {"seed", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'}, {"input-out", required_argument, 0, 'i'},
        {"layer", required_argument, 0, 'l'}, {"values", required_argument, 0, 'v'},
        {"hash", no_argument, 0, 'H'}, {"topk", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *cmd = "synth-layer", *shape = NULL, *out = NULL, *input_out = NULL, *values = "normal";
    int64_t experts = 0, tokens = -1;
    int layer = -1, hash = 0, topk = 0, have_seed = 0, c, rc = 0;
    uint64_t seed = 0;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'S': shape = optarg; break;
        case 'e': rc = mmoe_cli_opt_i64(cmd, "experts", optarg, 1, 1 << 16, &experts); break;
        case 't': rc = mmoe_cli_opt_i64(cmd, "input-tokens", optarg, 0, SYNTH_MAX_INPUT_TOKENS, &tokens); break;
        case 'T':
            fprintf(stderr, "megamoe synth-layer: --tokens is now --input-tokens T (the input file's token count)\n");
            rc = MMOE_EXIT_USAGE;
            break;
        case 's': rc = mmoe_cli_opt_u64(cmd, "seed", optarg, 0, UINT64_MAX, &seed), have_seed = 1; break;
        case 'o': out = optarg; break;
        case 'i': input_out = optarg; break;
        case 'l': rc = mmoe_cli_opt_int(cmd, "layer", optarg, 0, 1 << 20, &layer); break;
        case 'v': values = optarg; break;
        case 'H': hash = 1; break;
        case 'k': rc = mmoe_cli_opt_int(cmd, "topk", optarg, 1, MMOE_MOE_MAX_TOPK, &topk); break;
        case 'h': synth_usage(stdout); return 0;
        default: synth_usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
    if (optind < argc) {
        fprintf(stderr, "megamoe synth-layer: unexpected argument '%s'\n", argv[optind]);
        return MMOE_EXIT_USAGE;
    }
    if (shape == NULL || out == NULL || !have_seed) {
        fprintf(stderr, "megamoe synth-layer: --shape, --seed and --out are required\n");
        synth_usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    if (input_out != NULL && tokens < 0) {
        fprintf(stderr, "megamoe synth-layer: --input-out needs --input-tokens T\n");
        return MMOE_EXIT_USAGE;
    }
    mmoe_moe_synth_values v;
    if (strcmp(values, "normal") == 0)
        v = MMOE_SYNTH_NORMAL;
    else if (strcmp(values, "dyadic") == 0)
        v = MMOE_SYNTH_DYADIC;
    else {
        fprintf(stderr, "megamoe synth-layer: --values: expected normal or dyadic, got '%s'\n", values);
        return MMOE_EXIT_USAGE;
    }
    char path[4096];
    if (tokens >= 0 && input_out == NULL) {
        size_t n = strlen(out);
        const char *ext = ".safetensors";
        size_t el = strlen(ext);
        size_t stem = n >= el && strcmp(out + n - el, ext) == 0 ? n - el : n;
        snprintf(path, sizeof path, "%.*s.input.safetensors", (int)stem, out);
        input_out = path;
    }
    mmoe_error err;
    mmoe_error_clear(&err);
    const mmoe_cli_path outs[] = {{"out", out, 0}, {"input-out", input_out, 0}};
    mmoe_status st = mmoe_cli_check_outputs(outs, 2, NULL, 0, &err);
    mmoe_moe_desc d;
    if (st == MMOE_OK)
        st = mmoe_moe_desc_from_shape(shape, experts, &d, &err);
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
    synth_input in = {0, NULL, NULL};
    if (st == MMOE_OK)
        st = mmoe_moe_synth_create(&d, seed, v, &s, &err);
    if (st == MMOE_OK && tokens >= 0)
        st = make_input(&d, tokens, seed, v, &in, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_synth_write(s, layer, out, &err);
    if (st == MMOE_OK)
        printf("wrote %s: %s, D %lld, I %lld, E %lld, topk %d, %s routing, %d shared (block %d), %s values, seed %llu\n",
               out, shape, (long long)d.hidden, (long long)d.inter, (long long)d.n_experts, d.topk,
               d.routing == MMOE_ROUTING_HASH ? "hash" : "biased", d.n_shared, d.shared_block, values,
               (unsigned long long)seed);
    if (st == MMOE_OK && tokens >= 0) {
        st = write_input(&d, &in, input_out, &err);
        if (st == MMOE_OK)
            printf("wrote %s: x [%lld, %lld], token_ids [%lld]\n", input_out, (long long)tokens, (long long)d.hidden,
                   (long long)tokens);
        else
            unlink(out); /* the pair is one result: no layer without its input */
    }
    free(in.x);
    free(in.ids);
    mmoe_moe_synth_destroy(s);
    if (st != MMOE_OK) {
        fprintf(stderr, "megamoe synth-layer: %s\n", err.msg);
        return 1;
    }
    return 0;
}
