/**
 * @file cmd_moe.c
 * @brief `megamoe moe`: run one fused MoE layer of a checkpoint on an input file.
 *
 *     megamoe moe --weights FILE|DIR --input FILE --out FILE [--recipe sm100|sm90|dsv4-ref]
 *                 [--shared auto|fused|serial] [--pad-to N] [--layer L] [--backend cpu|gpu]
 *                 [--math precise|fast] [--topk K] [--route-scale S] [--swiglu-limit C]
 *                 [--scoring-func sqrtsoftplus] [--threads N]
 *
 * The weights use DeepSeek-V4's checkpoint names (moe_load.c), with or without a
 * `layers.L.` prefix: without --layer, bare names are used if present, else the one layer
 * whose `layers.L.ffn.gate.weight` is in the file (several: --layer is required).  The layer's
 * sizes come from the tensors' shapes (D and E from the gate, I from expert 0's w1, the shared
 * width and scale block from the shared tensors).
 *
 * What shapes cannot tell -- top-k, routed_scaling_factor, swiglu_limit, the score function
 * and whether the layer routes by hash -- comes, in this order, from the option, the
 * checkpoint's `config.json` (when --weights is a checkpoint directory: num_experts_per_tok,
 * routed_scaling_factor, swiglu_limit, scoring_func, num_hash_layers) or the file's `moe.*`
 * metadata (written by synth-layer).  A hash layer is one below num_hash_layers, or, without a
 * config, one with `ffn.gate.tid2eid` (whose columns are its top-k).  A value none of them
 * gives is refused, naming the value and where it was looked for: no model's values are
 * assumed.  The run prints each value with its source.
 *
 * Input file: `x` BF16 [T, D]; optional `token_ids` I32/I64 [T] (hash layers), `topk_idx`
 * I64/I32 [T, topk] (-1 = masked) with `topk_weights` F32 [T, topk].  Output file (written
 * atomically; never one of the inputs): `y` BF16 [T, D], `topk_idx` I64 [T, topk],
 * `topk_weights` F32 [T, topk].  The command prints the recipe, the shared expert's path and
 * any fallback reason, the padding, the weight memory and the per-stage timings.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_config.h"
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
    int topk;             /**< --topk (0: from the checkpoint) */
    double route_scale;   /**< --route-scale (0: from the checkpoint) */
    double swiglu_limit;  /**< --swiglu-limit (< 0: from the checkpoint) */
    const char *scoring;  /**< --scoring-func (NULL: from the checkpoint) */
    int threads;          /**< --threads (0: the defaults) */
} moe_opts;

/** Print the usage. */
static void moe_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe moe --weights FILE|DIR --input FILE --out FILE [options]\n\n"
            "Run one DeepSeek-V4 MoE layer (CPU oracle) on an input file.\n\n"
            "  --weights FILE|DIR   safetensors file or checkpoint directory (required; DeepSeek-V4 names,\n"
            "                       optional layers.L. prefix)\n"
            "  --input FILE         x BF16 [T, D]; optional token_ids [T], topk_idx [T, topk] + topk_weights (required)\n"
            "  --out FILE           y BF16 [T, D], topk_idx I64 [T, topk], topk_weights F32 [T, topk] (required;\n"
            "                       written atomically; may not be one of the inputs)\n"
            "  --recipe R           sm100, sm90 or dsv4-ref (default sm100)\n"
            "  --shared M           auto, fused or serial (default auto)\n"
            "  --pad-to N           pad the intermediate width to a multiple of N, a multiple of 128\n"
            "                       (default 0: no padding)\n"
            "  --layer L            use the tensors named layers.L.* (default: the only layer in the file)\n"
            "  --backend B          cpu or gpu (default cpu)\n"
            "  --math M             precise or fast (default precise)\n"
            "  --topk K             experts per token, 1..%d (default: config.json num_experts_per_tok,\n"
            "                       else the file's moe.topk, else a hash layer's tid2eid width)\n"
            "  --route-scale S      routed_scaling_factor > 0 (default: config.json, else moe.routed_scaling_factor)\n"
            "  --swiglu-limit C     SwiGLU clamp >= 0, 0 = none (default: config.json, else moe.swiglu_limit)\n"
            "  --scoring-func F     sqrtsoftplus (default: config.json scoring_func, else moe.scoring_func)\n"
            "  --threads N          OpenBLAS and dequantization threads, 1..%d (default: their own defaults)\n"
            "A value that neither the options, config.json nor the metadata give is an error.\n\n"
            "example:\n"
            "  megamoe moe --weights layer.safetensors --input layer.input.safetensors --out y.safetensors\n",
            MMOE_MOE_MAX_TOPK, MMOE_CLI_MAX_THREADS);
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

/** Where the values that shapes cannot tell come from (the checkpoint's config, its metadata). */
typedef struct layer_sources {
    const mmoe_ckpt *ck;  /**< the weights */
    const char *weights;  /**< --weights, for messages */
    int have_config;      /**< config.json was found next to the weights */
    mmoe_config cfg;      /**< its values */
    char config_path[4200]; /**< its path */
} layer_sources;

/** A metadata value of the first shard, or NULL. */
static const char *meta(const mmoe_ckpt *ck, const char *key)
{
    return mmoe_ckpt_shard_count(ck) > 0 ? mmoe_st_metadata(mmoe_ckpt_shard(ck, 0), key) : NULL;
}

/** Metadata @p key as an integer in [lo, hi]: 1 when present (value in *v), 0 when absent, -1 when malformed. */
static int meta_int(const layer_sources *src, const char *key, int64_t lo, int64_t hi, int64_t *v, mmoe_error *err)
{
    const char *m = meta(src->ck, key);
    if (m == NULL)
        return 0;
    if (mmoe_cli_parse_i64(m, lo, hi, v, err) != MMOE_OK) {
        mmoe_error_prefix(err, "%s: metadata '%s': ", src->weights, key);
        return -1;
    }
    return 1;
}

/** Metadata @p key as a number in [lo, +inf) (open at lo when @p open): as meta_int(). */
static int meta_num(const layer_sources *src, const char *key, double lo, unsigned open, double *v, mmoe_error *err)
{
    const char *m = meta(src->ck, key);
    if (m == NULL)
        return 0;
    if (mmoe_cli_parse_f64(m, lo, INFINITY, open, v, err) != MMOE_OK) {
        mmoe_error_prefix(err, "%s: metadata '%s': ", src->weights, key);
        return -1;
    }
    return 1;
}

/** Read DIR/config.json when --weights is a directory that has one. */
static mmoe_status load_config(layer_sources *src, mmoe_error *err)
{
    struct stat sb;
    src->have_config = 0;
    if (stat(src->weights, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return MMOE_OK;
    snprintf(src->config_path, sizeof src->config_path, "%s/config.json", src->weights);
    if (access(src->config_path, F_OK) != 0)
        return MMOE_OK;
    mmoe_status st = mmoe_config_load(src->config_path, &src->cfg, err);
    src->have_config = st == MMOE_OK;
    return st;
}

/** The refusal of a value nobody gives. */
static mmoe_status missing(const layer_sources *src, const char *what, const char *meta_key, const char *option,
                           mmoe_error *err)
{
    return mmoe_error_set(err, MMOE_ENOTFOUND,
                          "%s: the layer's %s is not given: no config.json next to the weights and no '%s' metadata "
                          "in them; pass %s", src->weights, what, meta_key, option);
}

/** Top-k, route scale, SwiGLU limit, score function and routing; each one's source in @p from. */
static mmoe_status layer_values(const layer_sources *src, int layer, const mmoe_tensor *t2e, const moe_opts *o,
                                mmoe_moe_desc *d, const char *from[4], mmoe_error *err)
{
    const mmoe_config *c = src->have_config ? &src->cfg : NULL;
    int64_t iv;
    double fv;
    int got;
    /* routing: config's num_hash_layers for a layers.L. layer, else the presence of tid2eid */
    if (c != NULL && layer >= 0)
        d->routing = layer < c->n_hash_layers ? MMOE_ROUTING_HASH : MMOE_ROUTING_BIASED;
    else
        d->routing = t2e != NULL ? MMOE_ROUTING_HASH : MMOE_ROUTING_BIASED;
    if (d->routing == MMOE_ROUTING_HASH) {
        if (t2e == NULL || t2e->ndim != 2)
            return mmoe_error_set(err, MMOE_ENOTFOUND, "%s: layer %d is a hash layer (config.json num_hash_layers %d) "
                                  "but has no tensor 'ffn.gate.tid2eid' [vocab, topk]", src->weights, layer,
                                  c ? c->n_hash_layers : 0);
        d->vocab = t2e->shape[0];
    }
    /* top-k */
    if (o->topk > 0)
        d->topk = o->topk, from[0] = "--topk";
    else if (c != NULL)
        d->topk = c->n_activated_experts, from[0] = "config.json";
    else if ((got = meta_int(src, "moe.topk", 1, MMOE_MOE_MAX_TOPK, &iv, err)) != 0) {
        if (got < 0)
            return err->code;
        d->topk = (int)iv, from[0] = "metadata";
    } else if (d->routing == MMOE_ROUTING_HASH)
        d->topk = (int)t2e->shape[1], from[0] = "tid2eid";
    else
        return missing(src, "top-k", "moe.topk", "--topk K", err);
    /* route scale */
    if (o->route_scale > 0)
        d->routed_scaling_factor = (float)o->route_scale, from[1] = "--route-scale";
    else if (c != NULL)
        d->routed_scaling_factor = (float)c->route_scale, from[1] = "config.json";
    else if ((got = meta_num(src, "moe.routed_scaling_factor", 0.0, MMOE_CLI_LO_OPEN, &fv, err)) != 0) {
        if (got < 0)
            return err->code;
        d->routed_scaling_factor = (float)fv, from[1] = "metadata";
    } else
        return missing(src, "routed scaling factor", "moe.routed_scaling_factor",
                       "--route-scale S", err);
    /* SwiGLU limit */
    if (o->swiglu_limit >= 0)
        d->swiglu_limit = (float)o->swiglu_limit, from[2] = "--swiglu-limit";
    else if (c != NULL)
        d->swiglu_limit = (float)c->swiglu_limit, from[2] = "config.json";
    else if ((got = meta_num(src, "moe.swiglu_limit", 0.0, 0, &fv, err)) != 0) {
        if (got < 0)
            return err->code;
        d->swiglu_limit = (float)fv, from[2] = "metadata";
    } else
        return missing(src, "SwiGLU limit", "moe.swiglu_limit", "--swiglu-limit C", err);
    /* score function: the oracle implements sqrtsoftplus, and is told so explicitly */
    const char *scoring = NULL;
    if (o->scoring != NULL)
        scoring = o->scoring, from[3] = "--scoring-func";
    else if (c != NULL)
        scoring = mmoe_score_func_name(c->score_func), from[3] = "config.json";
    else if ((scoring = meta(src->ck, "moe.scoring_func")) != NULL)
        from[3] = "metadata";
    else
        return missing(src, "score function", "moe.scoring_func", "--scoring-func sqrtsoftplus", err);
    if (strcmp(scoring, "sqrtsoftplus") != 0)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "%s: score function '%s' (from %s): the MoE oracle implements "
                              "sqrtsoftplus only", src->weights, scoring, from[3]);
    d->scoring = MMOE_SCORING_SQRTSOFTPLUS;
    return MMOE_OK;
}

/** Sizes and options of the layer from the tensors, the config or metadata, and the options. */
static mmoe_status desc_from_ckpt(const layer_sources *src, int layer, const moe_opts *o, mmoe_moe_desc *d,
                                  const char *from[4], mmoe_error *err)
{
    const mmoe_ckpt *ck = src->ck;
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
    mmoe_status st = layer_values(src, layer, find_layer_tensor(ck, layer, "ffn.gate.tid2eid"), o, d, from, err);
    if (st != MMOE_OK)
        return st;
    const mmoe_tensor *sw1 = find_layer_tensor(ck, layer, "ffn.shared_experts.w1.weight");
    const mmoe_tensor *ssf = find_layer_tensor(ck, layer, "ffn.shared_experts.w1.scale");
    if (sw1 != NULL && sw1->ndim == 2) {
        const int64_t ws = sw1->shape[0];
        int64_t iv;
        int got;
        d->n_shared = ws % d->inter == 0 ? (int)(ws / d->inter) : 1;
        if (src->have_config && src->cfg.n_shared_experts > 0)
            d->n_shared = src->cfg.n_shared_experts;
        else if ((got = meta_int(src, "moe.n_shared", 1, 1024, &iv, err)) != 0) {
            if (got < 0)
                return err->code;
            d->n_shared = (int)iv;
        }
        d->shared_inter = ws / d->n_shared;
        if ((got = meta_int(src, "moe.shared_block", 1, 1 << 20, &iv, err)) != 0) {
            if (got < 0)
                return err->code;
            d->shared_block = (int)iv;
        } else if (ssf != NULL && ssf->ndim == 2 && ssf->shape[0] > 0)
            d->shared_block = (ws + 127) / 128 == ssf->shape[0] ? 128 : (int)((ws + ssf->shape[0] - 1) / ssf->shape[0]);
    }
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
            return mmoe_error_set(err, MMOE_EINVAL, "--math: expected precise or fast, got '%s'", o->math);
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
            if (v < 0 || v > INT32_MAX || (d->routing == MMOE_ROUTING_HASH && v >= d->vocab))
                return mmoe_error_set(err, MMOE_ERANGE, "%s: tensor 'token_ids': element %lld is %lld, outside [0, %lld)",
                                      path, (long long)i, (long long)v,
                                      d->routing == MMOE_ROUTING_HASH ? (long long)d->vocab : (long long)INT32_MAX + 1);
            bufs->token_ids[i] = (int32_t)v;
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
    enum { O_PAD = 256, O_LAYER, O_TOPK, O_RSCALE, O_SWIGLU, O_SCORING, O_THREADS };
    static const struct option longopts[] = {
        {"weights", required_argument, 0, 'w'}, {"input", required_argument, 0, 'i'},
        {"out", required_argument, 0, 'o'},     {"recipe", required_argument, 0, 'r'},
        {"shared", required_argument, 0, 's'},  {"pad-to", required_argument, 0, O_PAD},
        {"layer", required_argument, 0, O_LAYER}, {"backend", required_argument, 0, 'b'},
        {"math", required_argument, 0, 'm'},    {"topk", required_argument, 0, O_TOPK},
        {"route-scale", required_argument, 0, O_RSCALE}, {"swiglu-limit", required_argument, 0, O_SWIGLU},
        {"scoring-func", required_argument, 0, O_SCORING}, {"threads", required_argument, 0, O_THREADS},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->layer = -1;
    o->swiglu_limit = -1;
    o->backend = "cpu";
    int c, rc = 0;
    int64_t v;
    optind = 1;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'w': o->weights = optarg; break;
        case 'i': o->input = optarg; break;
        case 'o': o->out = optarg; break;
        case 'r': o->recipe = optarg; break;
        case 's': o->shared = optarg; break;
        case 'b': o->backend = optarg; break;
        case 'm': o->math = optarg; break;
        case O_PAD:
            if ((rc = mmoe_cli_opt_i64("moe", "pad-to", optarg, 0, INT64_C(1) << 40, &v)) == 0 && v % 128 != 0) {
                fprintf(stderr, "megamoe moe: --pad-to: expected a multiple of 128, got '%s'\n", optarg);
                rc = MMOE_EXIT_USAGE;
            }
            o->pad_to = v;
            break;
        case O_LAYER: rc = mmoe_cli_opt_int("moe", "layer", optarg, 0, 1 << 20, &o->layer); break;
        case O_TOPK: rc = mmoe_cli_opt_int("moe", "topk", optarg, 1, MMOE_MOE_MAX_TOPK, &o->topk); break;
        case O_RSCALE:
            rc = mmoe_cli_opt_f64("moe", "route-scale", optarg, 0.0, 1e6, MMOE_CLI_LO_OPEN, &o->route_scale);
            break;
        case O_SWIGLU: rc = mmoe_cli_opt_f64("moe", "swiglu-limit", optarg, 0.0, 1e6, 0, &o->swiglu_limit); break;
        case O_SCORING: o->scoring = optarg; break;
        case O_THREADS: rc = mmoe_cli_opt_int("moe", "threads", optarg, 1, MMOE_CLI_MAX_THREADS, &o->threads); break;
        case 'h': moe_usage(stdout); return -1;
        default: moe_usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
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
        fprintf(stderr, "megamoe moe: --backend: expected cpu or gpu, got '%s'\n", o->backend);
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
    mmoe_status st = mmoe_moe_weights_lookup(d, mmoe_ckpt_lookup, ck, li, &w, err);
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
    const mmoe_cli_path outs[] = {{"out", o.out, 0}}, ins[] = {{"weights", o.weights, 0}, {"input", o.input, 0}};
    mmoe_status st = mmoe_cli_check_outputs(outs, 1, ins, 2, &err);
    mmoe_cli_set_threads(o.threads);
    layer_sources src;
    memset(&src, 0, sizeof src);
    src.weights = o.weights;
    const char *from[4] = {"?", "?", "?", "?"};
    if (st == MMOE_OK)
        st = mmoe_ckpt_open(o.weights, &ck, &err);
    src.ck = ck;
    if (st == MMOE_OK)
        st = load_config(&src, &err);
    if (st == MMOE_OK && pick_layer(ck, o.layer, &err, &li) != 0)
        st = err.code;
    if (st == MMOE_OK)
        st = desc_from_ckpt(&src, li, &o, &d, from, &err);
    if (st == MMOE_OK)
        printf("values: topk %d (%s), route scale %g (%s), swiglu limit %g (%s), scoring sqrtsoftplus (%s)\n", d.topk,
               from[0], (double)d.routed_scaling_factor, from[1], (double)d.swiglu_limit, from[2], from[3]);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_create(&d, &layer, &err);
    if (st == MMOE_OK)
        st = mmoe_moe_layer_load(layer, mmoe_ckpt_lookup, ck, li, &err);
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
