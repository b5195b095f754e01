/**
 * @file cmd_moe.c
 * @brief `megamoe moe`: run one fused MoE layer of a checkpoint on an input file.
 *
 *     megamoe moe --weights FILE|DIR --input FILE --out FILE [--recipe sm100|sm90|dsv4-ref]
 *                 [--shared auto|fused|serial] [--pad-to N] [--layer L] [--backend cpu|gpu]
 *                 [--math precise|fast] [--topk K] [--route-scale S] [--swiglu-limit C]
 *
 * The weights use DeepSeek-V4's checkpoint names (moe_load.c), with or without a
 * `layers.L.` prefix: without --layer, bare names are used if present, else the one layer
 * whose `layers.L.ffn.gate.weight` is in the file (several: --layer is required).  The layer's
 * sizes come from the tensors' shapes (D and E from the gate, I from expert 0's w1, hash routing
 * when `ffn.gate.tid2eid` exists, the shared width and scale block from the shared tensors);
 * what shapes cannot tell (topk of a score-routed layer, routed_scaling_factor, swiglu_limit)
 * comes from the file's `moe.*` metadata (written by synth-layer), else from the options, else
 * from DeepSeek-V4's values (6, 1.5 for D=4096/5120, 2.5 for D=7168, 10).
 *
 * Input file: `x` BF16 [T, D]; optional `token_ids` I32/I64 [T] (hash layers), `topk_idx`
 * I64/I32 [T, topk] (-1 = masked) with `topk_weights` F32 [T, topk].  Output file (written
 * atomically): `y` BF16 [T, D], `topk_idx` I64 [T, topk], `topk_weights` F32 [T, topk].
 * The command prints the recipe, the shared expert's path and any fallback reason, the
 * padding, the weight memory and the per-stage timings.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_gpu_layer.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_moe.h"
#include "mmoe_safetensors.h"

/** Options of `megamoe moe`. */
typedef struct moe_opts {
    const char *weights;  /**< --weights */
    const char *input;    /**< --input */
    const char *out;      /**< --out */
    const char *recipe;   /**< --recipe (NULL: sm100) */
    const char *shared;   /**< --shared (NULL: auto) */
    const char *backend;  /**< --backend */
    const char *math;     /**< --math (NULL: precise) */
    long long pad_to;     /**< --pad-to (0: none) */
    int layer;            /**< --layer (-1: detect) */
    int topk;             /**< --topk (0: from the file) */
    double route_scale;   /**< --route-scale (0: from the file) */
    double swiglu_limit;  /**< --swiglu-limit (< 0: from the file) */
} moe_opts;

/** Print the usage. */
static void moe_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe moe --weights FILE|DIR --input FILE --out FILE [options]\n\n"
            "Run one DeepSeek-V4 MoE layer (CPU oracle) on an input file.\n\n"
            "  --weights FILE|DIR   safetensors file or checkpoint (DeepSeek-V4 names, optional layers.L. prefix)\n"
            "  --input FILE         x BF16 [T, D]; optional token_ids [T], topk_idx [T, topk] + topk_weights\n"
            "  --out FILE           y BF16 [T, D], topk_idx I64 [T, topk], topk_weights F32 [T, topk]\n"
            "  --recipe R           sm100 (default), sm90 or dsv4-ref\n"
            "  --shared M           auto (default), fused or serial\n"
            "  --pad-to N           pad the intermediate width to a multiple of N (multiple of 128)\n"
            "  --layer L            use the tensors named layers.L.*\n"
            "  --backend B          cpu (default) or gpu\n"
            "  --math M             precise (default) or fast\n"
            "  --topk K, --route-scale S, --swiglu-limit C   override the layer's values\n");
}

/** Lookup callback over a checkpoint. */
static mmoe_status ckpt_lookup(void *ctx, const char *name, mmoe_tensor *out, mmoe_error *err)
{
    (void)err;
    const mmoe_tensor *t = mmoe_ckpt_find((const mmoe_ckpt *)ctx, name);
    if (t == NULL)
        return MMOE_ENOTFOUND;
    *out = *t;
    return MMOE_OK;
}

/** The tensor "layers.L.name" (L >= 0) or "name". */
static const mmoe_tensor *find_layer_tensor(const mmoe_ckpt *ck, int layer, const char *name)
{
    char full[256];
    if (layer >= 0) {
        snprintf(full, sizeof full, "layers.%d.%s", layer, name);
        const mmoe_tensor *t = mmoe_ckpt_find(ck, full);
        if (t != NULL)
            return t;
    }
    return mmoe_ckpt_find(ck, name);
}

/** Choose the layer prefix: --layer, bare names, or the single layers.L. present. */
static int pick_layer(const mmoe_ckpt *ck, int requested, mmoe_error *err, int *layer)
{
    *layer = requested;
    if (requested >= 0 || mmoe_ckpt_find(ck, "ffn.gate.weight") != NULL)
        return 0;
    int found = -1, count = 0;
    for (size_t i = 0; i < mmoe_ckpt_count(ck); i++) {
        int l;
        char rest[64];
        if (sscanf(mmoe_ckpt_get(ck, i)->name, "layers.%d.%63s", &l, rest) == 2 &&
            strcmp(rest, "ffn.gate.weight") == 0) {
            found = l;
            count++;
        }
    }
    if (count == 1) {
        *layer = found;
        return 0;
    }
    if (count == 0)
        mmoe_error_set(err, MMOE_ENOTFOUND, "no 'ffn.gate.weight' (with or without a layers.L. prefix) in the weights");
    else
        mmoe_error_set(err, MMOE_EINVAL, "the weights hold %d MoE layers: choose one with --layer L", count);
    return -1;
}

/** A metadata value of the first shard, or NULL. */
static const char *meta(const mmoe_ckpt *ck, const char *key)
{
    return mmoe_ckpt_shard_count(ck) > 0 ? mmoe_st_metadata(mmoe_ckpt_shard(ck, 0), key) : NULL;
}

/** Sizes and options of the layer from the tensors, metadata and options. */
static mmoe_status desc_from_ckpt(const mmoe_ckpt *ck, int layer, const moe_opts *o, mmoe_moe_desc *d,
                                  mmoe_error *err)
{
    mmoe_moe_desc_init(d);
    const mmoe_tensor *gate = find_layer_tensor(ck, layer, "ffn.gate.weight");
    const mmoe_tensor *w1 = find_layer_tensor(ck, layer, "ffn.experts.0.w1.weight");
    if (gate == NULL || gate->ndim != 2)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor 'ffn.gate.weight' [E, D] not found in the weights");
    if (w1 == NULL || w1->ndim != 2)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "tensor 'ffn.experts.0.w1.weight' [I, D/2] not found in the weights");
    d->n_experts = gate->shape[0];
    d->hidden = gate->shape[1];
    d->inter = w1->shape[0];
    const mmoe_tensor *t2e = find_layer_tensor(ck, layer, "ffn.gate.tid2eid");
    const char *m;
    d->topk = (m = meta(ck, "moe.topk")) != NULL ? atoi(m) : 6;
    if (t2e != NULL && t2e->ndim == 2) {
        d->routing = MMOE_ROUTING_HASH;
        d->vocab = t2e->shape[0];
        d->topk = (int)t2e->shape[1];
    }
    if (o->topk > 0)
        d->topk = o->topk;
    d->routed_scaling_factor = d->hidden == 7168 ? 2.5f : 1.5f;
    if ((m = meta(ck, "moe.routed_scaling_factor")) != NULL)
        d->routed_scaling_factor = strtof(m, NULL);
    if (o->route_scale > 0)
        d->routed_scaling_factor = (float)o->route_scale;
    if ((m = meta(ck, "moe.swiglu_limit")) != NULL)
        d->swiglu_limit = strtof(m, NULL);
    if (o->swiglu_limit >= 0)
        d->swiglu_limit = (float)o->swiglu_limit;
    const mmoe_tensor *sw1 = find_layer_tensor(ck, layer, "ffn.shared_experts.w1.weight");
    const mmoe_tensor *ssf = find_layer_tensor(ck, layer, "ffn.shared_experts.w1.scale");
    if (sw1 != NULL && sw1->ndim == 2) {
        const int64_t ws = sw1->shape[0];
        d->n_shared = ws % d->inter == 0 ? (int)(ws / d->inter) : 1;
        d->shared_inter = ws / d->n_shared;
        if ((m = meta(ck, "moe.n_shared")) != NULL && atoi(m) > 0) {
            d->n_shared = atoi(m);
            d->shared_inter = ws / d->n_shared;
        }
        if ((m = meta(ck, "moe.shared_block")) != NULL)
            d->shared_block = atoi(m);
        else if (ssf != NULL && ssf->ndim == 2 && ssf->shape[0] > 0)
            d->shared_block = (ws + 127) / 128 == ssf->shape[0] ? 128 : (int)((ws + ssf->shape[0] - 1) / ssf->shape[0]);
    }
    mmoe_status st;
    if (o->recipe != NULL && (st = mmoe_moe_recipe_from_name(o->recipe, &d->recipe, err)) != MMOE_OK)
        return st;
    if (o->shared != NULL && (st = mmoe_moe_shared_mode_from_name(o->shared, &d->shared_mode, err)) != MMOE_OK)
        return st;
    if (o->math != NULL) {
        if (strcmp(o->math, "precise") == 0)
            d->math = MMOE_MATH_PRECISE;
        else if (strcmp(o->math, "fast") == 0)
            d->math = MMOE_MATH_FAST;
        else
            return mmoe_error_set(err, MMOE_EINVAL, "unknown --math '%s' (expected precise or fast)", o->math);
    }
    d->pad_to = o->pad_to;
    return mmoe_moe_desc_validate(d, err);
}

/** The run inputs from the input file (converted copies are owned by @p bufs). */
typedef struct input_bufs {
    int32_t *token_ids; /**< token ids converted to int32 */
    int64_t *topk_idx;  /**< topk_idx converted to int64 */
} input_bufs;

/** Check and read x, token_ids, topk_idx, topk_weights of the input file. */
static mmoe_status read_input(const mmoe_st_file *f, const mmoe_moe_desc *d, mmoe_moe_input *in, input_bufs *bufs,
                              mmoe_error *err)
{
    const char *path = mmoe_st_path(f);
    const mmoe_tensor *x = mmoe_st_find(f, "x");
    if (x == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "%s: tensor 'x' (BF16 [T, %lld]) not found", path, (long long)d->hidden);
    if (x->dtype != MMOE_DT_BF16 || x->ndim != 2 || x->shape[1] != d->hidden) {
        char s[96];
        mmoe_shape_str(x->ndim, x->shape, s, sizeof s);
        return mmoe_error_set(err, x->dtype != MMOE_DT_BF16 ? MMOE_EDTYPE : MMOE_ESHAPE,
                              "%s: tensor 'x': expected BF16 [T, %lld], found %s %s", path, (long long)d->hidden,
                              mmoe_dtype_name(x->dtype), s);
    }
    const int64_t t = x->shape[0];
    in->n_tokens = t;
    in->x = x->data;
    const mmoe_tensor *ids = mmoe_st_find(f, "token_ids");
    if (ids != NULL) {
        if ((ids->dtype != MMOE_DT_I32 && ids->dtype != MMOE_DT_I64) || ids->ndim != 1 || ids->shape[0] != t)
            return mmoe_error_set(err, MMOE_ESHAPE, "%s: tensor 'token_ids': expected I32 or I64 [%lld]", path,
                                  (long long)t);
        bufs->token_ids = malloc((size_t)(t > 0 ? t : 1) * sizeof(int32_t));
        if (bufs->token_ids == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
        for (int64_t i = 0; i < t; i++) {
            int64_t v = ids->dtype == MMOE_DT_I64 ? ((const int64_t *)ids->data)[i] : ((const int32_t *)ids->data)[i];
            bufs->token_ids[i] = v < 0 || v > INT32_MAX ? -1 : (int32_t)v;
        }
        in->token_ids = bufs->token_ids;
    }
    const mmoe_tensor *ti = mmoe_st_find(f, "topk_idx");
    const mmoe_tensor *tw = mmoe_st_find(f, "topk_weights");
    if ((ti == NULL) != (tw == NULL))
        return mmoe_error_set(err, MMOE_ENOTFOUND, "%s: 'topk_idx' and 'topk_weights' must be given together", path);
    if (ti != NULL) {
        if ((ti->dtype != MMOE_DT_I32 && ti->dtype != MMOE_DT_I64) || ti->ndim != 2 || ti->shape[0] != t ||
            ti->shape[1] != d->topk)
            return mmoe_error_set(err, MMOE_ESHAPE, "%s: tensor 'topk_idx': expected I64 or I32 [%lld, %d]", path,
                                  (long long)t, d->topk);
        if (tw->dtype != MMOE_DT_F32 || tw->ndim != 2 || tw->shape[0] != t || tw->shape[1] != d->topk)
            return mmoe_error_set(err, MMOE_ESHAPE, "%s: tensor 'topk_weights': expected F32 [%lld, %d]", path,
                                  (long long)t, d->topk);
        bufs->topk_idx = malloc((size_t)(t * d->topk > 0 ? t * d->topk : 1) * sizeof(int64_t));
        if (bufs->topk_idx == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
        for (int64_t i = 0; i < t * d->topk; i++)
            bufs->topk_idx[i] = ti->dtype == MMOE_DT_I64 ? ((const int64_t *)ti->data)[i] : ((const int32_t *)ti->data)[i];
        in->topk_idx = bufs->topk_idx;
        in->topk_weights = tw->data;
    }
    return MMOE_OK;
}

/** Write y, topk_idx, topk_weights and the path metadata, atomically. */
static mmoe_status write_output(const char *path, const mmoe_moe_desc *d, int64_t t, const mmoe_moe_output *o,
                                const mmoe_moe_result *r, mmoe_error *err)
{
    mmoe_st_writer *w = NULL;
    mmoe_status st = mmoe_st_writer_create(&w, err);
    if (st != MMOE_OK)
        return st;
    const int64_t ys[2] = {t, d->hidden}, ks[2] = {t, d->topk};
    st = mmoe_st_writer_add(w, "y", MMOE_DT_BF16, 2, ys, o->y, (size_t)(t * d->hidden) * 2, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_add(w, "topk_idx", MMOE_DT_I64, 2, ks, o->topk_idx, (size_t)(t * d->topk) * 8, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_add(w, "topk_weights", MMOE_DT_F32, 2, ks, o->topk_weights, (size_t)(t * d->topk) * 4, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "moe.recipe", mmoe_moe_recipe_name(d->recipe), err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "moe.shared_path", mmoe_moe_path_name(r->shared_path), err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_set_metadata(w, "moe.fallback_reason", r->fallback_reason, err);
    if (st == MMOE_OK)
        st = mmoe_st_writer_finish(w, path, err);
    mmoe_st_writer_destroy(w);
    return st;
}

/** Print the path, padding, memory and timings of a call. */
static void print_result(const mmoe_moe_desc *d, const mmoe_moe_result *r, const mmoe_moe_memory *mem)
{
    printf("moe: backend %s, recipe %s, math %s, D %lld, I %lld, E %lld, topk %d, routing %s\n", r->backend,
           mmoe_moe_recipe_name(d->recipe), d->math == MMOE_MATH_FAST ? "fast" : "precise", (long long)d->hidden,
           (long long)d->inter, (long long)d->n_experts, d->topk, d->routing == MMOE_ROUTING_HASH ? "hash" : "biased");
    printf("shared: path %s", mmoe_moe_path_name(r->shared_path));
    if (r->shared_path == MMOE_PATH_SERIAL)
        printf(" (fallback: %s)", r->fallback_reason);
    printf("\n");
    printf("padding: %s (routed I %lld -> %lld, shared width %lld)\n", r->padded ? "padded" : "none",
           (long long)d->inter, (long long)r->inter_used, (long long)r->shared_inter_used);
    printf("weights: borrowed %.1f MiB, owned %.1f MiB (peak %.1f MiB)\n", mem->borrowed_bytes / 1048576.0,
           mem->owned_bytes / 1048576.0, mem->owned_peak_bytes / 1048576.0);
    printf("tokens %lld, routed pairs %lld, active experts %lld, GEMM %.3f GFLOP\n", (long long)r->n_tokens,
           (long long)r->routed_pairs, (long long)r->active_experts, r->gemm_flops * 1e-9);
    const mmoe_moe_timings *t = &r->time;
    printf("time (ms): total %.3f = route %.3f + quant %.3f + dequant %.3f + gemm %.3f + epilogue %.3f + combine %.3f\n",
           1e3 * t->total_s, 1e3 * t->route_s, 1e3 * t->quant_s, 1e3 * t->dequant_s, 1e3 * t->gemm_s,
           1e3 * t->epilogue_s, 1e3 * t->combine_s);
}

/** Parse the options: 0 to run, -1 after --help, else the exit status. */
static int parse(int argc, char **argv, moe_opts *o)
{
    static const struct option longopts[] = {
        {"weights", required_argument, 0, 'w'}, {"input", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},     {"recipe", required_argument, 0, 'r'},
        {"shared", required_argument, 0, 's'},  {"pad-to", required_argument, 0, 'p'},
        {"layer", required_argument, 0, 'l'},   {"backend", required_argument, 0, 'b'},
        {"math", required_argument, 0, 'm'},    {"topk", required_argument, 0, 'k'},
        {"route-scale", required_argument, 0, 'R'}, {"swiglu-limit", required_argument, 0, 'c'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->layer = -1;
    o->swiglu_limit = -1;
    o->backend = "cpu";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'w': o->weights = optarg; break;
        case 'i': o->input = optarg; break;
        case 'o': o->out = optarg; break;
        case 'r': o->recipe = optarg; break;
        case 's': o->shared = optarg; break;
        case 'b': o->backend = optarg; break;
        case 'm': o->math = optarg; break;
        case 'p':
            o->pad_to = strtoll(optarg, &end, 10);
            if (*end != '\0' || o->pad_to < 0 || o->pad_to % 128 != 0) {
                fprintf(stderr, "megamoe moe: --pad-to '%s' must be a non-negative multiple of 128\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'l':
            o->layer = (int)strtol(optarg, &end, 10);
            if (*end != '\0' || o->layer < 0) {
                fprintf(stderr, "megamoe moe: --layer '%s' must be a non-negative integer\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'k': o->topk = atoi(optarg); break;
        case 'R': o->route_scale = atof(optarg); break;
        case 'c': o->swiglu_limit = atof(optarg); break;
        case 'h': moe_usage(stdout); return -1;
        default: moe_usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "megamoe moe: unexpected argument '%s'\n", argv[optind]);
        return MMOE_EXIT_USAGE;
    }
    if (o->weights == NULL || o->input == NULL || o->out == NULL) {
        fprintf(stderr, "megamoe moe: --weights, --input and --out are required\n");
        moe_usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    if (strcmp(o->backend, "cpu") != 0 && strcmp(o->backend, "gpu") != 0) {
        fprintf(stderr, "megamoe moe: unknown --backend '%s' (expected cpu or gpu)\n", o->backend);
        return MMOE_EXIT_USAGE;
    }
    return 0;
}

/**
 * `--backend gpu`: the same layer on the GPU.  The GPU path takes its routing from the caller,
 * so it gets the routing the CPU run just used (the input file's, or the CPU router's); its
 * output replaces @p out->y, and the agreement with the CPU oracle is printed (bit-identical
 * values and the normwise relative error), with the GPU's kernel, tile height, exact-path
 * blocks and any kernel fallback.
 */
static mmoe_status run_on_gpu(mmoe_ckpt *ck, int li, const mmoe_moe_desc *d, const mmoe_moe_input *cpu_in,
                              const mmoe_moe_output *out, mmoe_error *err)
{
    mmoe_moe_weights w;
    mmoe_gpu_layer *g = NULL;
    const size_t n = (size_t)cpu_in->n_tokens * (size_t)d->hidden;
    uint16_t *y_gpu = malloc(n > 0 ? n * sizeof *y_gpu : 1);
    if (y_gpu == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory for the GPU output");
    for (size_t i = 0; i < n; i++)
        y_gpu[i] = 0x7FC0u; /* NaN: an element the GPU does not write shows up below */
    mmoe_status st = mmoe_moe_weights_lookup(d, ckpt_lookup, ck, li, &w, err);
    if (st == MMOE_OK) {
        st = mmoe_gpu_layer_create(d, &w, &g, err);
        mmoe_moe_weights_release(&w);
    }
    if (st != MMOE_OK) {
        mmoe_error_prefix(err, "--backend gpu: ");
        free(y_gpu);
        return st;
    }
    mmoe_moe_input gin = *cpu_in;
    gin.topk_idx = out->topk_idx;
    gin.topk_weights = out->topk_weights;
    mmoe_moe_output gout = {y_gpu, NULL, NULL};
    mmoe_moe_result gres;
    mmoe_moe_result_init(&gres);
    const double t0 = mmoe_clock_s();
    st = mmoe_gpu_layer_run(g, &gin, &gout, &gres, err);
    const double wall_s = mmoe_clock_s() - t0; /* one call, host to host (uploads and downloads included) */
    if (st == MMOE_OK) {
        const mmoe_gpu_moe_result *gd = mmoe_gpu_layer_details(g);
        printf("gpu: routing from %s; device cc %d, kernel %s, block_m %d, shared %s, "
               "exact-path blocks L1 %lld / L2 %lld, weights on the GPU %.1f MiB, call %.3f ms host to host "
               "(first call: includes warm-up; `megamoe bench moe --backend gpu` times the kernels)\n",
               cpu_in->topk_idx != NULL ? "the input file" : "the CPU router (the GPU path takes routing from the caller)",
               gd->device_cc, gd->kernel ? gd->kernel : "?", gd->block_m, gd->shared_fused ? "fused" : "not fused",
               (long long)gd->exact_path_blocks_l1, (long long)gd->exact_path_blocks_l2,
               gd->gpu_weight_bytes / 1048576.0, 1e3 * wall_s);
        if (gd->fallback)
            printf("gpu: FALLBACK: %s\n", gd->fallback_reason);
        size_t same = 0;
        double num = 0.0, den = 0.0;
        for (size_t i = 0; i < n; i++) {
            uint32_t a_bits = (uint32_t)y_gpu[i] << 16, b_bits = (uint32_t)out->y[i] << 16;
            float a, b;
            memcpy(&a, &a_bits, sizeof a);
            memcpy(&b, &b_bits, sizeof b);
            same += y_gpu[i] == out->y[i];
            num += ((double)a - b) * ((double)a - b);
            den += (double)b * b;
        }
        printf("gpu vs cpu oracle: %zu of %zu values bit-identical, normwise relative error %.3e\n", same, n,
               den > 0 ? sqrt(num / den) : sqrt(num));
        memcpy(out->y, y_gpu, n * sizeof *y_gpu);
    }
    mmoe_gpu_layer_destroy(g);
    free(y_gpu);
    return st;
}

int mmoe_cmd_moe(int argc, char **argv)
{
    moe_opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    const int on_gpu = strcmp(o.backend, "gpu") == 0;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_ckpt *ck = NULL;
    mmoe_st_file *inf = NULL;
    mmoe_moe_layer *layer = NULL;
    input_bufs bufs = {0};
    uint16_t *y = NULL;
    int64_t *idx = NULL;
    float *wts = NULL;
    mmoe_moe_desc d;
    int li = -1;
    mmoe_status st = mmoe_ckpt_open(o.weights, &ck, &err);
    if (st == MMOE_OK && pick_layer(ck, o.layer, &err, &li) != 0)
        st = err.code;
    if (st == MMOE_OK)
        st = desc_from_ckpt(ck, li, &o, &d, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_create(&d, &layer, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_load(layer, ckpt_lookup, ck, li, &err);
    if (st == MMOE_OK)
        st = mmoe_st_open(o.input, &inf, &err);
    mmoe_moe_input in = {0};
    if (st == MMOE_OK)
        st = read_input(inf, &d, &in, &bufs, &err);
    mmoe_moe_result res;
    mmoe_moe_result_init(&res);
    if (st == MMOE_OK) {
        const size_t t = (size_t)in.n_tokens;
        y = malloc((t * (size_t)d.hidden > 0 ? t * (size_t)d.hidden : 1) * 2);
        idx = malloc((t * (size_t)d.topk > 0 ? t * (size_t)d.topk : 1) * 8);
        wts = malloc((t * (size_t)d.topk > 0 ? t * (size_t)d.topk : 1) * 4);
        if (y == NULL || idx == NULL || wts == NULL)
            st = mmoe_error_set(&err, MMOE_ENOMEM, "out of memory for the outputs of %zu tokens", t);
    }
    mmoe_moe_output out = {y, idx, wts};
    if (st == MMOE_OK)
        st = mmoe_moe_layer_run(layer, &in, &out, &res, &err);
    if (st == MMOE_OK) {
        mmoe_moe_memory mem;
        mmoe_moe_layer_memory(layer, &mem);
        print_result(&d, &res, &mem);
        if (on_gpu)
            st = run_on_gpu(ck, li, &d, &in, &out, &err);
        if (st == MMOE_OK)
            st = write_output(o.out, &d, in.n_tokens, &out, &res, &err);
        if (st == MMOE_OK)
            printf("wrote %s\n", o.out);
    }
    if (st != MMOE_OK)
        fprintf(stderr, "megamoe moe: %s\n", err.msg);
    free(y);
    free(idx);
    free(wts);
    free(bufs.token_ids);
    free(bufs.topk_idx);
    mmoe_moe_layer_destroy(layer);
    mmoe_st_close(inf);
    mmoe_ckpt_close(ck);
    return st == MMOE_OK ? 0 : 1;
}
