/**
 * @file cmd_logits.c
 * @brief `megamoe logits`: the full model's F32 logits for a token sequence, written to a safetensors file.
 *
 *     megamoe logits --model DIR --tokens 0,15,27,... --out FILE [--last] [--mtp] [--decode]
 *
 * Loads the checkpoint (a progress line per layer on stderr), runs one prefill over the
 * tokens from position 0 and writes `logits` F32 [T, vocab] (`--last`: [1, vocab]) to
 * FILE atomically.  `--mtp` also writes `mtp_logits` F32 [T-1, vocab]: the MTP block fed
 * with the final streams of positions 0..T-2 and the tokens 1..T-1 (the DeepSeek-V3
 * wiring; an assumption, @ref spec_arch_mtp).  `--decode` runs the tokens one at a time instead of
 * one prefill (same logits; for comparisons).  The metadata records the token list and
 * the mode.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_model.h"
#include "mmoe_safetensors.h"

/** Print the usage text to @p out. */
static void usage(FILE *out)
{
    fprintf(out, "usage: megamoe logits --model DIR --tokens ID,ID,... --out FILE [--last] [--mtp] [--decode]\n"
                 "  Run the CPU oracle of the whole model and write F32 'logits' [T, vocab] (safetensors).\n"
                 "  --last    only the last position's logits ([1, vocab])\n"
                 "  --mtp     also 'mtp_logits' [T-1, vocab] (MTP block on streams t and token t+1)\n"
                 "  --decode  feed the tokens one by one (decode path) instead of one prefill\n");
}

/** Parse "0,15,27" into a new array; returns the count, or -1 with a message. */
static int64_t parse_tokens(const char *s, int32_t **out)
{
    int64_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids)
        return -1;
    const char *p = s;
    for (int64_t i = 0; i < n; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end != ',' && *end != '\0') || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "megamoe logits: --tokens: item %lld ('%.*s') is not a token id\n", (long long)i,
                    (int)strcspn(p, ","), p);
            free(ids);
            return -1;
        }
        ids[i] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    *out = ids;
    return n;
}

/** Progress line on stderr. */
static void progress(void *ctx, int done, int total, const char *what)
{
    (void)ctx;
    fprintf(stderr, "\rloading: %d/%d layers (%s)%s", done, total, what, done == total ? "\n" : "   ");
}

int mmoe_cmd_logits(int argc, char **argv)
{
    static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"tokens", required_argument, 0, 't'},
                                         {"out", required_argument, 0, 'o'},   {"last", no_argument, 0, 'l'},
                                         {"mtp", no_argument, 0, 'p'},         {"decode", no_argument, 0, 'd'},
                                         {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    const char *model_dir = NULL, *tokens = NULL, *out_path = NULL;
    int last = 0, mtp = 0, decode = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 't': tokens = optarg; break;
        case 'o': out_path = optarg; break;
        case 'l': last = 1; break;
        case 'p': mtp = 1; break;
        case 'd': decode = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (!model_dir || !tokens || !out_path || optind != argc) {
        fprintf(stderr, "megamoe logits: --model, --tokens and --out are required\n");
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    int32_t *ids = NULL;
    int64_t T = parse_tokens(tokens, &ids);
    if (T < 0)
        return MMOE_EXIT_USAGE;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_model *m = NULL;
    mmoe_model_state *s = NULL;
    float *logits = NULL, *mtp_logits = NULL;
    uint16_t *streams = NULL;
    mmoe_st_writer *w = NULL;
    int rc = 1;
    mmoe_status st = mmoe_model_open(model_dir, progress, NULL, &m, &err);
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
    logits = malloc(sizeof(float) * (size_t)(rows * V));
    if (mtp) {
        mtp_logits = malloc(sizeof(float) * (size_t)((T - 1) * V));
        streams = malloc(sizeof(uint16_t) * (size_t)(T * cfg->hc_mult * cfg->dim));
    }
    if (!logits || (mtp && (!mtp_logits || !streams))) {
        st = mmoe_error_set(&err, MMOE_ENOMEM, "out of memory for the logits");
        goto done;
    }
    if (!decode) {
        st = mmoe_model_forward(m, s, ids, T, logits, last, streams, &err);
    } else {
        const size_t srow = (size_t)(cfg->hc_mult * cfg->dim);
        for (int64_t t = 0; t < T && st == MMOE_OK; t++) {
            float *dst = last ? (t == T - 1 ? logits : NULL) : logits + t * V;
            st = mmoe_model_forward(m, s, ids + t, 1, dst, 0, streams ? streams + (size_t)t * srow : NULL, &err);
        }
    }
    if (st == MMOE_OK && mtp)
        st = mmoe_model_mtp_forward(m, s, streams, ids + 1, T - 1, mtp_logits, &err);
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
        st = mmoe_st_writer_finish(w, out_path, &err);
    if (st == MMOE_OK) {
        fprintf(stderr, "logits: %lld x %lld written to %s\n", (long long)rows, (long long)V, out_path);
        rc = 0;
    }
done:
    if (st != MMOE_OK)
        fprintf(stderr, "megamoe logits: %s\n", err.msg);
    mmoe_st_writer_destroy(w);
    free(logits);
    free(mtp_logits);
    free(streams);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
    free(ids);
    return rc;
}
