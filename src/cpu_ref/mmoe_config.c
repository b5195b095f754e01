/**
 * @file mmoe_config.c
 * @brief config.json → ::mmoe_config: one table of keys, two spellings, the reference's defaults.
 *
 * The heart of this file is `key_table`: one row per scalar field with its
 * Hugging Face key (dotted for nested objects, `rope_scaling.factor`), its
 * reference `ModelArgs` key, whether a default exists, and the range the value
 * must lie in.  Parsing walks the table once; the non-scalar fields (score
 * function, compress ratios, quantization block, expert dtype) follow in small
 * functions of their own.  Validation then checks the rules that tie several
 * keys together.
 */
#include "mmoe_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/** How a field is stored in ::mmoe_config. */
typedef enum { KEY_I64, KEY_INT, KEY_DOUBLE } key_kind;

/** One scalar field: its two spellings, default and allowed range. */
typedef struct key_spec {
    const char *hf_key;   /**< Hugging Face key (dotted path), NULL if none */
    const char *ref_key;  /**< reference ModelArgs key, NULL if none */
    key_kind kind;        /**< storage type */
    size_t offset;        /**< offsetof(mmoe_config, field) */
    int has_default;      /**< 1: missing key takes def */
    double def;           /**< the reference's default */
    double min;           /**< smallest allowed value */
    double max;           /**< largest allowed value */
} key_spec;

/** Offset of a field of ::mmoe_config. */
#define OFF(f) offsetof(mmoe_config, f)
/** Every scalar field: HF key, reference key, storage, default, range (@ref spec_arch_config). */
static const key_spec key_table[] = {
    {"vocab_size", "vocab_size", KEY_I64, OFF(vocab_size), 0, 0, 1, 1e9},
    {"hidden_size", "dim", KEY_I64, OFF(dim), 0, 0, 128, 1e6},
    {"moe_intermediate_size", "moe_inter_dim", KEY_I64, OFF(moe_inter_dim), 0, 0, 128, 1e6},
    {"num_hidden_layers", "n_layers", KEY_INT, OFF(n_layers), 0, 0, 1, 200},
    {"num_hash_layers", "n_hash_layers", KEY_INT, OFF(n_hash_layers), 1, 0, 0, 200},
    {"num_nextn_predict_layers", "n_mtp_layers", KEY_INT, OFF(n_mtp_layers), 1, 1, 0, 8},
    {"num_attention_heads", "n_heads", KEY_INT, OFF(n_heads), 0, 0, 1, 4096},
    {"n_routed_experts", "n_routed_experts", KEY_INT, OFF(n_routed_experts), 0, 0, 1, 65536},
    {"n_shared_experts", "n_shared_experts", KEY_INT, OFF(n_shared_experts), 1, 1, 0, 1},
    {"num_experts_per_tok", "n_activated_experts", KEY_INT, OFF(n_activated_experts), 0, 0, 1, 256},
    {"routed_scaling_factor", "route_scale", KEY_DOUBLE, OFF(route_scale), 1, 1.0, 1e-6, 1e6},
    {"swiglu_limit", "swiglu_limit", KEY_DOUBLE, OFF(swiglu_limit), 1, 0.0, 0.0, 1e6},
    {"q_lora_rank", "q_lora_rank", KEY_I64, OFF(q_lora_rank), 0, 0, 128, 1e6},
    {"head_dim", "head_dim", KEY_INT, OFF(head_dim), 0, 0, 2, 65536},
    {"qk_rope_head_dim", "rope_head_dim", KEY_INT, OFF(rope_head_dim), 0, 0, 2, 65536},
    {"o_groups", "o_groups", KEY_INT, OFF(o_groups), 0, 0, 1, 4096},
    {"o_lora_rank", "o_lora_rank", KEY_I64, OFF(o_lora_rank), 0, 0, 1, 1e6},
    {"sliding_window", "window_size", KEY_INT, OFF(window_size), 0, 0, 1, 1 << 20},
    {"rope_scaling.original_max_position_embeddings", "original_seq_len", KEY_I64,
     OFF(original_seq_len), 1, 0, 0, 1e12},
    {"rope_theta", "rope_theta", KEY_DOUBLE, OFF(rope_theta), 1, 10000.0, 1.0, 1e12},
    {"compress_rope_theta", "compress_rope_theta", KEY_DOUBLE, OFF(compress_rope_theta), 1, 40000.0,
     1.0, 1e12},
    {"rope_scaling.factor", "rope_factor", KEY_DOUBLE, OFF(rope_factor), 1, 40.0, 1.0, 1e6},
    {"rope_scaling.beta_fast", "beta_fast", KEY_DOUBLE, OFF(beta_fast), 1, 32.0, 0.0, 1e6},
    {"rope_scaling.beta_slow", "beta_slow", KEY_DOUBLE, OFF(beta_slow), 1, 1.0, 0.0, 1e6},
    {"index_n_heads", "index_n_heads", KEY_INT, OFF(index_n_heads), 0, 0, 1, 4096},
    {"index_head_dim", "index_head_dim", KEY_INT, OFF(index_head_dim), 0, 0, 32, 65536},
    {"index_topk", "index_topk", KEY_INT, OFF(index_topk), 0, 0, 1, 1 << 24},
    {"hc_mult", "hc_mult", KEY_INT, OFF(hc_mult), 1, 4, 1, 64},
    {"hc_sinkhorn_iters", "hc_sinkhorn_iters", KEY_INT, OFF(hc_sinkhorn_iters), 1, 20, 1, 1000},
    {"hc_eps", "hc_eps", KEY_DOUBLE, OFF(hc_eps), 1, 1e-6, 0.0, 1.0},
    {"rms_norm_eps", "norm_eps", KEY_DOUBLE, OFF(norm_eps), 1, 1e-6, 0.0, 1.0},
    {NULL, "max_seq_len", KEY_I64, OFF(max_seq_len), 1, 4096, 1, 1e9},
    {"bos_token_id", NULL, KEY_I64, OFF(bos_token_id), 1, 0, 0, 1e9},
    {"eos_token_id", NULL, KEY_I64, OFF(eos_token_id), 1, 1, 0, 1e9},
};
#undef OFF
/** Number of rows of key_table. */
#define N_KEYS (sizeof key_table / sizeof key_table[0])

/** Look a dotted path ("rope_scaling.factor") up in @p obj; NULL if any step is missing. */
static json_t *lookup_path(json_t *obj, const char *path)
{
    char part[128];
    const char *p = path;
    while (obj && json_is_object(obj)) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof part)
            return NULL;
        memcpy(part, p, n);
        part[n] = '\0';
        obj = json_object_get(obj, part);
        if (!dot)
            return obj;
        p = dot + 1;
    }
    return NULL;
}

/** Find a key in either spelling; writes the spelling used into *used. */
static json_t *find_key(json_t *root, const char *hf, const char *ref, const char **used)
{
    json_t *v = NULL;
    if (hf && (v = lookup_path(root, hf)) != NULL && !json_is_null(v)) {
        *used = hf;
        return v;
    }
    if (ref && (v = json_object_get(root, ref)) != NULL && !json_is_null(v)) {
        *used = ref;
        return v;
    }
    *used = hf ? hf : ref;
    return NULL;
}

/** Read one scalar field (either spelling, default, type and range checks). */
static mmoe_status read_scalar(json_t *root, const key_spec *k, const char *source, mmoe_config *cfg,
                               mmoe_error *err)
{
    const char *used;
    json_t *v = find_key(root, k->hf_key, k->ref_key, &used);
    double val;
    if (!v) {
        if (!k->has_default) {
            if (k->hf_key && k->ref_key && strcmp(k->hf_key, k->ref_key) != 0)
                return mmoe_error_set(err, MMOE_ENOTFOUND,
                                      "%s: missing required key '%s' (reference name '%s')", source,
                                      k->hf_key, k->ref_key);
            return mmoe_error_set(err, MMOE_ENOTFOUND, "%s: missing required key '%s'", source, used);
        }
        val = k->def;
    } else {
        if (!json_is_number(v))
            return mmoe_error_set(err, MMOE_EFORMAT, "%s: key '%s': expected a number, found %s",
                                  source, used,
                                  json_is_string(v) ? "a string" : json_is_array(v) ? "an array"
                                  : json_is_boolean(v)                               ? "a boolean"
                                                                                      : "an object");
        val = json_number_value(v);
        if (k->kind != KEY_DOUBLE && val != floor(val))
            return mmoe_error_set(err, MMOE_EFORMAT, "%s: key '%s': expected an integer, found %g",
                                  source, used, val);
        if (!(val >= k->min && val <= k->max))
            return mmoe_error_set(err, MMOE_ERANGE, "%s: key '%s' = %g is out of range [%g, %g]",
                                  source, used, val, k->min, k->max);
    }
    char *base = (char *)cfg;
    switch (k->kind) {
    case KEY_I64: *(int64_t *)(base + k->offset) = (int64_t)val; break;
    case KEY_INT: *(int *)(base + k->offset) = (int)val; break;
    case KEY_DOUBLE: *(double *)(base + k->offset) = val; break;
    }
    return MMOE_OK;
}

/** `scoring_func` / `score_func`. */
static mmoe_status read_score_func(json_t *root, const char *source, mmoe_config *cfg, mmoe_error *err)
{
    const char *used;
    json_t *v = find_key(root, "scoring_func", "score_func", &used);
    if (!v) {
        cfg->score_func = MMOE_SCORE_SOFTMAX; /* the ref's ModelArgs default */
        return MMOE_OK;
    }
    const char *s = json_string_value(v);
    if (!s)
        return mmoe_error_set(err, MMOE_EFORMAT, "%s: key '%s': expected a string", source, used);
    if (strcmp(s, "softmax") == 0)
        cfg->score_func = MMOE_SCORE_SOFTMAX;
    else if (strcmp(s, "sigmoid") == 0)
        cfg->score_func = MMOE_SCORE_SIGMOID;
    else if (strcmp(s, "sqrtsoftplus") == 0)
        cfg->score_func = MMOE_SCORE_SQRTSOFTPLUS;
    else
        return mmoe_error_set(err, MMOE_ERANGE,
                              "%s: key '%s' = \"%s\": expected softmax, sigmoid or sqrtsoftplus", source,
                              used, s);
    return MMOE_OK;
}

/** `compress_ratios`: n_layers or n_layers + n_mtp_layers entries of 0, 4, 128 (1, 2: V4.1). */
static mmoe_status read_ratios(json_t *root, const char *source, mmoe_config *cfg, mmoe_error *err)
{
    json_t *v = json_object_get(root, "compress_ratios");
    int want_main = cfg->n_layers, want_all = cfg->n_layers + cfg->n_mtp_layers;
    if (want_all > MMOE_CONFIG_MAX_LAYERS)
        return mmoe_error_set(err, MMOE_ERANGE, "%s: %d layers in all: more than the supported %d",
                              source, want_all, MMOE_CONFIG_MAX_LAYERS);
    if (!v) {
        /* the ref's default: no compression anywhere */
        memset(cfg->compress_ratios, 0, sizeof cfg->compress_ratios);
        cfg->n_ratios = want_all;
        return MMOE_OK;
    }
    if (!json_is_array(v))
        return mmoe_error_set(err, MMOE_EFORMAT, "%s: key 'compress_ratios': expected an array", source);
    size_t n = json_array_size(v);
    if ((int)n != want_main && (int)n != want_all)
        return mmoe_error_set(err, MMOE_ERANGE,
                              "%s: key 'compress_ratios' has %zu entries: expected n_layers (%d) or "
                              "n_layers + n_mtp_layers (%d)",
                              source, n, want_main, want_all);
    memset(cfg->compress_ratios, 0, sizeof cfg->compress_ratios);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return mmoe_error_set(err, MMOE_EFORMAT, "%s: key 'compress_ratios[%zu]': expected an integer",
                                  source, i);
        json_int_t r = json_integer_value(e);
        if (r != 0 && r != 1 && r != 2 && r != 4 && r != 128)
            return mmoe_error_set(err, MMOE_ERANGE,
                                  "%s: key 'compress_ratios[%zu]' = %lld: expected 0, 4 or 128 (1, 2: V4.1)",
                                  source, i, (long long)r);
        cfg->compress_ratios[i] = (int)r;
    }
    cfg->n_ratios = want_all; /* missing MTP entries are 0: window-only, as in the published files */
    return MMOE_OK;
}

/** quantization_config.weight_block_size, scale_fmt, expert_dtype (root or quantization_config). */
static mmoe_status read_quant(json_t *root, json_t *top, const char *source, mmoe_config *cfg,
                              mmoe_error *err)
{
    cfg->weight_block_n = cfg->weight_block_k = 128;
    json_t *q = json_object_get(top, "quantization_config");
    if (!q)
        q = json_object_get(root, "quantization_config");
    json_t *bs = q ? json_object_get(q, "weight_block_size") : NULL;
    if (bs) {
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(json_array_get(bs, 0)) ||
            !json_is_integer(json_array_get(bs, 1)))
            return mmoe_error_set(err, MMOE_EFORMAT,
                                  "%s: key 'quantization_config.weight_block_size': expected [n, k]", source);
        json_int_t bn = json_integer_value(json_array_get(bs, 0)), bk = json_integer_value(json_array_get(bs, 1));
        /* range-check before narrowing to int: (int)4294967424 is 128, which validation would accept */
        if (bn < 1 || bn > 65536 || bk < 1 || bk > 65536)
            return mmoe_error_set(err, MMOE_ERANGE,
                                  "%s: key 'quantization_config.weight_block_size' = [%lld, %lld]: expected [128, 128] "
                                  "or [32, 32]",
                                  source, (long long)bn, (long long)bk);
        cfg->weight_block_n = (int)bn;
        cfg->weight_block_k = (int)bk;
    }
    /* scale format: "ue8m0" is the only one the V4 checkpoints use */
    const char *used;
    json_t *sf = find_key(q ? q : root, "scale_fmt", "scale_fmt", &used);
    if (!sf)
        sf = json_object_get(root, "scale_fmt");
    if (sf && json_is_string(sf) && strcmp(json_string_value(sf), "ue8m0") != 0)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "%s: key 'scale_fmt' = \"%s\": only \"ue8m0\" (power-of-two scales) is supported",
                              source, json_string_value(sf));
    json_t *ed = json_object_get(root, "expert_dtype");
    if (!ed)
        ed = json_object_get(top, "expert_dtype");
    if (!ed && q)
        ed = json_object_get(q, "expert_dtype");
    cfg->expert_dtype = MMOE_EXPERT_UNSET;
    if (ed && !json_is_null(ed)) {
        const char *s = json_string_value(ed);
        if (s && strcmp(s, "fp4") == 0)
            cfg->expert_dtype = MMOE_EXPERT_FP4;
        else if (s && strcmp(s, "fp8") == 0)
            cfg->expert_dtype = MMOE_EXPERT_FP8;
        else
            return mmoe_error_set(err, MMOE_ERANGE, "%s: key 'expert_dtype': expected \"fp4\" or \"fp8\"",
                                  source);
    }
    return MMOE_OK;
}

/**
 * mmoe_config_validate() knows no file and says "config: ..."; when it fails on a parsed file,
 * put the file's name (@p source) in place of that prefix, so that the message says which file.
 */
static void name_the_source(mmoe_error *err, mmoe_status st, const char *source)
{
    static const char prefix[] = "config: ";
    if (st == MMOE_OK || err == NULL || source == NULL || strncmp(err->msg, prefix, sizeof prefix - 1) != 0)
        return;
    char rest[MMOE_ERROR_MSG_LEN];
    snprintf(rest, sizeof rest, "%s", err->msg + sizeof prefix - 1);
    mmoe_error_set(err, st, "%s: %s", source, rest);
}

mmoe_status mmoe_config_parse(const char *json_text, const char *source, mmoe_config *cfg,
                              mmoe_error *err)
{
    json_error_t jerr;
    json_t *top = json_loads(json_text, 0, &jerr);
    if (!top)
        return mmoe_error_set(err, MMOE_EFORMAT, "%s: invalid JSON at line %d: %s", source, jerr.line,
                              jerr.text);
    mmoe_status st = MMOE_OK;
    if (!json_is_object(top)) {
        st = mmoe_error_set(err, MMOE_EFORMAT, "%s: expected a JSON object", source);
        goto done;
    }
    /* V4.1 (multimodal wrapper) keeps the text model's keys under text_config */
    json_t *root = json_object_get(top, "text_config");
    if (!root || !json_is_object(root))
        root = top;
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_KEYS && st == MMOE_OK; i++)
        st = read_scalar(root, &key_table[i], source, cfg, err);
    if (st == MMOE_OK && !lookup_path(root, "rope_scaling.original_max_position_embeddings") &&
        !json_object_get(root, "original_seq_len"))
        cfg->original_seq_len = 0;
    if (st == MMOE_OK)
        st = read_score_func(root, source, cfg, err);
    if (st == MMOE_OK)
        st = read_ratios(root, source, cfg, err);
    if (st == MMOE_OK)
        st = read_quant(root, top, source, cfg, err);
    if (st == MMOE_OK) {
        json_t *kvh = json_object_get(root, "num_key_value_heads");
        if (kvh && (!json_is_integer(kvh) || json_integer_value(kvh) != 1))
            st = mmoe_error_set(err, MMOE_ERANGE,
                                "%s: key 'num_key_value_heads': DeepSeek-V4 has one shared kv latent (1)",
                                source);
    }
    if (st == MMOE_OK) {
        st = mmoe_config_validate(cfg, err);
        name_the_source(err, st, source);
    }
done:
    json_decref(top);
    return st;
}

mmoe_status mmoe_config_load(const char *path, mmoe_config *cfg, mmoe_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return mmoe_error_set(err, errno == ENOENT ? MMOE_ENOTFOUND : MMOE_EIO, "%s: cannot open: %s",
                              path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return mmoe_error_set(err, MMOE_ENOMEM, "%s: out of memory", path);
    }
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len > MMOE_CONFIG_MAX_BYTES) {
            free(buf);
            fclose(f);
            return mmoe_error_set(err, MMOE_EFORMAT, "%s: larger than %d MiB, not a config", path,
                                  MMOE_CONFIG_MAX_BYTES >> 20);
        }
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return mmoe_error_set(err, MMOE_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return mmoe_error_set(err, MMOE_EIO, "%s: read error", path);
    }
    buf[len] = '\0';
    mmoe_status st = mmoe_config_parse(buf, path, cfg, err);
    free(buf);
    return st;
}

/** Is @p v a positive power of two? */
static int is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

/** Fail the validation with MMOE_ERANGE and a message naming the key. */
#define BAD(...) return mmoe_error_set(err, MMOE_ERANGE, __VA_ARGS__)

mmoe_status mmoe_config_validate(const mmoe_config *c, mmoe_error *err)
{
    const int64_t B = MMOE_ACT_BLOCK;
    if (c->dim % B)
        BAD("config: key 'hidden_size' (dim) = %lld: must be a multiple of %lld (activation quant block)",
            (long long)c->dim, (long long)B);
    if (c->q_lora_rank % B)
        BAD("config: key 'q_lora_rank' = %lld: must be a multiple of %lld (activation quant block)",
            (long long)c->q_lora_rank, (long long)B);
    if (c->moe_inter_dim % B)
        BAD("config: key 'moe_intermediate_size' = %lld: must be a multiple of %lld (w2 input width)",
            (long long)c->moe_inter_dim, (long long)B);
    if (c->n_heads % c->o_groups)
        BAD("config: key 'o_groups' = %d: must divide num_attention_heads = %d", c->o_groups, c->n_heads);
    if ((c->o_groups * c->o_lora_rank) % B)
        BAD("config: key 'o_lora_rank' = %lld: o_groups * o_lora_rank = %lld must be a multiple of %lld",
            (long long)c->o_lora_rank, (long long)(c->o_groups * c->o_lora_rank), (long long)B);
    if (c->rope_head_dim % 2 || c->rope_head_dim >= c->head_dim)
        BAD("config: key 'qk_rope_head_dim' = %d: must be even and below head_dim = %d", c->rope_head_dim,
            c->head_dim);
    if ((c->head_dim - c->rope_head_dim) % 64)
        BAD("config: key 'head_dim' = %d: the non-rope part (%d) must be a multiple of 64 (FP8 kv block)",
            c->head_dim, c->head_dim - c->rope_head_dim);
    if (!is_pow2(c->index_head_dim) || c->index_head_dim % 32 || c->index_head_dim < c->rope_head_dim)
        BAD("config: key 'index_head_dim' = %d: must be a power of two, a multiple of 32 and >= "
            "qk_rope_head_dim (%d)",
            c->index_head_dim, c->rope_head_dim);
    if (c->n_activated_experts > c->n_routed_experts)
        BAD("config: key 'num_experts_per_tok' = %d: more than n_routed_experts = %d",
            c->n_activated_experts, c->n_routed_experts);
    if (c->n_hash_layers > c->n_layers)
        BAD("config: key 'num_hash_layers' = %d: more than num_hidden_layers = %d", c->n_hash_layers,
            c->n_layers);
    if (c->n_layers + c->n_mtp_layers > MMOE_CONFIG_MAX_LAYERS)
        BAD("config: key 'num_hidden_layers' = %d: too many layers (max %d with MTP)", c->n_layers,
            MMOE_CONFIG_MAX_LAYERS);
    if (c->n_ratios != c->n_layers + c->n_mtp_layers)
        BAD("config: key 'compress_ratios' has %d entries: expected %d", c->n_ratios,
            c->n_layers + c->n_mtp_layers);
    for (int i = 0; i < c->n_ratios; i++) {
        int r = c->compress_ratios[i];
        if (r != 0 && r != 1 && r != 2 && r != 4 && r != 128)
            BAD("config: key 'compress_ratios[%d]' = %d: expected 0, 4 or 128", i, r);
    }
    if (!(c->weight_block_n == 128 && c->weight_block_k == 128) &&
        !(c->weight_block_n == 32 && c->weight_block_k == 32))
        BAD("config: key 'quantization_config.weight_block_size' = [%d, %d]: expected [128, 128] or "
            "[32, 32]",
            c->weight_block_n, c->weight_block_k);
    for (int i = 0; i < c->n_ratios; i++)
        if (c->compress_ratios[i] > 1 && c->original_seq_len <= 0)
            BAD("config: key 'rope_scaling.original_max_position_embeddings' is missing (or not positive): "
                "layer %d is compressed (ratio %d) and its YaRN RoPE needs the original context length", i,
                c->compress_ratios[i]);
    if (c->beta_fast < c->beta_slow)
        BAD("config: key 'rope_scaling.beta_fast' = %g: must not be below beta_slow = %g", c->beta_fast,
            c->beta_slow);
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
        BAD("config: key 'bos_token_id'/'eos_token_id' (%lld/%lld): must be below vocab_size = %lld",
            (long long)c->bos_token_id, (long long)c->eos_token_id, (long long)c->vocab_size);
    if (c->norm_eps <= 0 || c->hc_eps < 0)
        BAD("config: key 'rms_norm_eps' = %g: must be positive", c->norm_eps);
#undef BAD
    return MMOE_OK;
}

int mmoe_config_ratio(const mmoe_config *cfg, int layer)
{
    if (layer < 0 || layer >= cfg->n_ratios)
        return 0;
    return cfg->compress_ratios[layer];
}

const char *mmoe_score_func_name(mmoe_score_func f)
{
    switch (f) {
    case MMOE_SCORE_SOFTMAX: return "softmax";
    case MMOE_SCORE_SIGMOID: return "sigmoid";
    case MMOE_SCORE_SQRTSOFTPLUS: return "sqrtsoftplus";
    }
    return "?";
}

/** The values shared by V4-Flash and V4-Pro (@ref spec_arch_config). */
static void preset_v4_common(mmoe_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 129280;
    c->n_hash_layers = 3;
    c->n_mtp_layers = 1;
    c->n_shared_experts = 1;
    c->n_activated_experts = 6;
    c->score_func = MMOE_SCORE_SQRTSOFTPLUS;
    c->swiglu_limit = 10.0;
    c->head_dim = 512;
    c->rope_head_dim = 64;
    c->o_lora_rank = 1024;
    c->window_size = 128;
    c->original_seq_len = 65536;
    c->rope_theta = 10000;
    c->compress_rope_theta = 160000;
    c->rope_factor = 16;
    c->beta_fast = 32;
    c->beta_slow = 1;
    c->index_n_heads = 64;
    c->index_head_dim = 128;
    c->hc_mult = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6;
    c->norm_eps = 1e-6;
    c->weight_block_n = c->weight_block_k = 128;
    c->expert_dtype = MMOE_EXPERT_FP4;
    c->max_seq_len = 4096;
    c->bos_token_id = 0;
    c->eos_token_id = 1;
}

mmoe_status mmoe_config_preset(const char *name, int n_layers, mmoe_config *c, mmoe_error *err)
{
    if (n_layers < 0 || n_layers + 1 > MMOE_CONFIG_MAX_LAYERS)
        return mmoe_error_set(err, MMOE_EINVAL, "preset '%s': layer count %d out of range [1, %d]", name,
                              n_layers, MMOE_CONFIG_MAX_LAYERS - 1);
    if (strcmp(name, "v4-flash") == 0 || strcmp(name, "v4-pro") == 0) {
        int pro = name[3] == 'p';
        preset_v4_common(c);
        c->dim = pro ? 7168 : 4096;
        c->moe_inter_dim = pro ? 3072 : 2048;
        c->n_layers = n_layers ? n_layers : (pro ? 61 : 43);
        c->n_heads = pro ? 128 : 64;
        c->n_routed_experts = pro ? 384 : 256;
        c->route_scale = pro ? 2.5 : 1.5;
        c->q_lora_rank = pro ? 1536 : 1024;
        c->o_groups = pro ? 16 : 8;
        c->index_topk = pro ? 1024 : 512;
        if (c->n_hash_layers > c->n_layers)
            c->n_hash_layers = c->n_layers;
        /* Flash: [0,0] + [4,128]*... + [4]; Pro: [128,128] + [4,128]*...; then 0 for MTP */
        for (int i = 0; i < c->n_layers; i++)
            c->compress_ratios[i] = i < 2 ? (pro ? 128 : 0) : (i % 2 == 0 ? 4 : 128);
        c->compress_ratios[c->n_layers] = 0;
        c->n_ratios = c->n_layers + c->n_mtp_layers;
    } else if (strcmp(name, "tiny") == 0) {
        /* every layer type at test size; widths are multiples of the 128-wide quant block */
        preset_v4_common(c);
        c->vocab_size = 512;
        c->dim = 256;
        c->moe_inter_dim = 128;
        c->n_layers = n_layers ? n_layers : 4;
        c->n_hash_layers = c->n_layers < 2 ? c->n_layers : 2;
        c->n_heads = 4;
        c->n_routed_experts = 8;
        c->n_activated_experts = 2;
        c->route_scale = 1.5;
        c->q_lora_rank = 128;
        c->head_dim = 128;
        c->rope_head_dim = 64;
        c->o_groups = 2;
        c->o_lora_rank = 128;
        c->window_size = 16;
        c->index_n_heads = 4;
        c->index_head_dim = 128;
        c->index_topk = 4;
        c->max_seq_len = 512;
        /* layer 0 window-only (hash), 1 ratio 4 (hash), 2 ratio 128, then alternating 4/128 */
        for (int i = 0; i < c->n_layers; i++)
            c->compress_ratios[i] = i == 0 ? 0 : (i % 2 == 1 ? 4 : 128);
        c->compress_ratios[c->n_layers] = 0;
        c->n_ratios = c->n_layers + c->n_mtp_layers;
    } else {
        return mmoe_error_set(err, MMOE_EINVAL, "unknown shape '%s': expected tiny, v4-flash or v4-pro",
                              name);
    }
    return mmoe_config_validate(c, err);
}

mmoe_status mmoe_config_to_json(const mmoe_config *c, char **out, mmoe_error *err)
{
    json_t *o = json_object();
    json_t *ratios = json_array();
    json_t *rs = json_object();
    json_t *q = json_object();
    json_t *bs = json_array();
    if (!o || !ratios || !rs || !q || !bs) {
        json_decref(o);
        json_decref(ratios);
        json_decref(rs);
        json_decref(q);
        json_decref(bs);
        return mmoe_error_set(err, MMOE_ENOMEM, "config: out of memory");
    }
    json_object_set_new(o, "architectures", json_pack("[s]", "DeepseekV4ForCausalLM"));
    json_object_set_new(o, "model_type", json_string("deepseek_v4"));
    json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    json_object_set_new(o, "hc_eps", json_real(c->hc_eps));
    json_object_set_new(o, "hc_mult", json_integer(c->hc_mult));
    json_object_set_new(o, "hc_sinkhorn_iters", json_integer(c->hc_sinkhorn_iters));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "hidden_size", json_integer(c->dim));
    json_object_set_new(o, "index_head_dim", json_integer(c->index_head_dim));
    json_object_set_new(o, "index_n_heads", json_integer(c->index_n_heads));
    json_object_set_new(o, "index_topk", json_integer(c->index_topk));
    json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_inter_dim));
    json_object_set_new(o, "n_routed_experts", json_integer(c->n_routed_experts));
    json_object_set_new(o, "n_shared_experts", json_integer(c->n_shared_experts));
    json_object_set_new(o, "norm_topk_prob", json_true());
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_experts_per_tok", json_integer(c->n_activated_experts));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_hash_layers", json_integer(c->n_hash_layers));
    json_object_set_new(o, "num_key_value_heads", json_integer(1));
    json_object_set_new(o, "num_nextn_predict_layers", json_integer(c->n_mtp_layers));
    json_object_set_new(o, "o_groups", json_integer(c->o_groups));
    json_object_set_new(o, "o_lora_rank", json_integer(c->o_lora_rank));
    json_object_set_new(o, "q_lora_rank", json_integer(c->q_lora_rank));
    json_object_set_new(o, "qk_rope_head_dim", json_integer(c->rope_head_dim));
    json_array_append_new(bs, json_integer(c->weight_block_n));
    json_array_append_new(bs, json_integer(c->weight_block_k));
    json_object_set_new(q, "activation_scheme", json_string("dynamic"));
    json_object_set_new(q, "fmt", json_string("e4m3"));
    json_object_set_new(q, "quant_method", json_string("fp8"));
    json_object_set_new(q, "scale_fmt", json_string("ue8m0"));
    json_object_set_new(q, "weight_block_size", bs);
    json_object_set_new(o, "quantization_config", q);
    json_object_set_new(o, "rms_norm_eps", json_real(c->norm_eps));
    json_object_set_new(rs, "beta_fast", json_real(c->beta_fast));
    json_object_set_new(rs, "beta_slow", json_real(c->beta_slow));
    json_object_set_new(rs, "factor", json_real(c->rope_factor));
    json_object_set_new(rs, "original_max_position_embeddings", json_integer(c->original_seq_len));
    json_object_set_new(rs, "type", json_string("yarn"));
    json_object_set_new(o, "rope_scaling", rs);
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "routed_scaling_factor", json_real(c->route_scale));
    json_object_set_new(o, "scoring_func", json_string(mmoe_score_func_name(c->score_func)));
    json_object_set_new(o, "sliding_window", json_integer(c->window_size));
    json_object_set_new(o, "swiglu_limit", json_real(c->swiglu_limit));
    json_object_set_new(o, "tie_word_embeddings", json_false());
    json_object_set_new(o, "topk_method", json_string("noaux_tc"));
    json_object_set_new(o, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "compress_rope_theta", json_real(c->compress_rope_theta));
    for (int i = 0; i < c->n_ratios; i++)
        json_array_append_new(ratios, json_integer(c->compress_ratios[i]));
    json_object_set_new(o, "compress_ratios", ratios);
    if (c->expert_dtype != MMOE_EXPERT_UNSET)
        json_object_set_new(o, "expert_dtype",
                            json_string(c->expert_dtype == MMOE_EXPERT_FP4 ? "fp4" : "fp8"));
    json_object_set_new(o, "max_seq_len", json_integer(c->max_seq_len));
    *out = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!*out)
        return mmoe_error_set(err, MMOE_ENOMEM, "config: out of memory while writing JSON");
    return MMOE_OK;
}
