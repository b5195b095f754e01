/**
 * @file moe_desc.c
 * @brief Layer descriptions: defaults, the named shapes of DeepSeek-V4, validation, option names.
 *
 * A ::mmoe_moe_desc is plain data.  The named shapes come from the model configurations
 * (@ref spec_arch_config): V4-Flash D 4096 / I 2048 / E 256, V4-Pro D 7168 / I 3072 /
 * E 384 (routed_scaling_factor 2.5), V4.1-Flash D 5120 / I 2304 / E 384 with 32x32 shared
 * scale blocks (unverified model, used here for its awkward I = 2304 = 4.5 x 512).  Every shape
 * has top-6 routing, one shared expert of width I and swiglu_limit 10.  "tiny" is a test shape
 * that keeps every alignment rule (D and I multiples of 128).
 *
 * Validation states the layout rules the oracle relies on: D and I multiples of 128 (so every
 * 32- and 128-channel quantization group and every 128-wide K chunk is whole), the shared width
 * a multiple of 128, pad_to a multiple of 128, 1 <= topk <= E.
 */
#include "mmoe_moe.h"

#include <math.h>
#include <string.h>

void mmoe_moe_desc_init(mmoe_moe_desc *desc)
{
    memset(desc, 0, sizeof *desc);
    desc->shared_block = 128;
    desc->routed_scaling_factor = 1.0f;
    desc->swiglu_limit = 10.0f;
    desc->scoring = MMOE_SCORING_SQRTSOFTPLUS;
    desc->routing = MMOE_ROUTING_BIASED;
    desc->recipe = MMOE_RECIPE_SM100;
    desc->math = MMOE_MATH_PRECISE;
    desc->shared_mode = MMOE_SHARED_AUTO;
}

/** One named shape. */
typedef struct shape_row {
    const char *name;  /**< --shape name */
    int64_t hidden;    /**< D */
    int64_t inter;     /**< I */
    int64_t n_experts; /**< E of the model */
    int topk;          /**< experts per token */
    int shared_block;  /**< FP8 scale block of the shared expert */
    float route_scale; /**< routed_scaling_factor */
} shape_row;

/** The shapes of @ref spec_arch_config (and "tiny" for tests). */
static const shape_row shapes[] = {
    {"v4-flash", 4096, 2048, 256, 6, 128, 1.5f},
    {"v4-pro", 7168, 3072, 384, 6, 128, 2.5f},
    {"v4.1-flash", 5120, 2304, 384, 6, 32, 1.5f},
    {"tiny", 256, 256, 8, 2, 128, 1.5f},
};

mmoe_status mmoe_moe_desc_from_shape(const char *shape, int64_t n_experts, mmoe_moe_desc *desc,
                                     mmoe_error *err)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (strcmp(shape, shapes[i].name) != 0)
            continue;
        mmoe_moe_desc_init(desc);
        desc->hidden = shapes[i].hidden;
        desc->inter = shapes[i].inter;
        desc->n_experts = n_experts > 0 ? n_experts : shapes[i].n_experts;
        desc->topk = shapes[i].topk;
        desc->n_shared = 1;
        desc->shared_inter = shapes[i].inter;
        desc->shared_block = shapes[i].shared_block;
        desc->routed_scaling_factor = shapes[i].route_scale;
        desc->vocab = 129280;
        if (desc->n_experts < desc->topk)
            return mmoe_error_set(err, MMOE_EINVAL,
                                  "shape '%s': --experts %lld is fewer than topk %d", shape,
                                  (long long)desc->n_experts, desc->topk);
        return MMOE_OK;
    }
    return mmoe_error_set(err, MMOE_EINVAL,
                          "unknown shape '%s' (expected v4-flash, v4-pro, v4.1-flash or tiny)", shape);
}

mmoe_status mmoe_moe_desc_validate(const mmoe_moe_desc *d, mmoe_error *err)
{
    if (d->hidden <= 0 || d->hidden % 128 != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: hidden %lld must be a positive multiple of 128",
                              (long long)d->hidden);
    if (d->inter <= 0 || d->inter % 128 != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: inter %lld must be a positive multiple of 128",
                              (long long)d->inter);
    if (d->n_experts <= 0 || d->n_experts > (1 << 20))
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: n_experts %lld out of range [1, 2^20]",
                              (long long)d->n_experts);
    if (d->topk < 1 || d->topk > d->n_experts || d->topk > MMOE_MOE_MAX_TOPK)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: topk %d must be in [1, min(n_experts %lld, %d)]",
                              d->topk, (long long)d->n_experts, MMOE_MOE_MAX_TOPK);
    if (d->n_shared < 0 || d->n_shared > 64)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: n_shared %d out of range [0, 64]", d->n_shared);
    if (d->n_shared > 0 && (d->shared_inter <= 0 || d->shared_inter % 128 != 0))
        return mmoe_error_set(err, MMOE_EINVAL,
                              "moe desc: shared_inter %lld must be a positive multiple of 128",
                              (long long)d->shared_inter);
    if (d->n_shared > 0 && d->shared_block <= 0)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: shared_block %d must be positive",
                              d->shared_block);
    if (!(d->routed_scaling_factor > 0.0f) || isinf(d->routed_scaling_factor))
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: routed_scaling_factor %g must be finite and > 0",
                              (double)d->routed_scaling_factor);
    if (isnan(d->swiglu_limit) || d->swiglu_limit < 0.0f)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: swiglu_limit %g must be >= 0 (0 or inf: no clamp)",
                              (double)d->swiglu_limit);
    if ((unsigned)d->scoring != MMOE_SCORING_SQRTSOFTPLUS)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: unknown scoring %d", (int)d->scoring);
    if ((unsigned)d->routing > MMOE_ROUTING_HASH)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: unknown routing %d", (int)d->routing);
    if (d->routing == MMOE_ROUTING_HASH && d->vocab <= 0)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: hash routing needs vocab > 0 (found %lld)",
                              (long long)d->vocab);
    if ((unsigned)d->recipe >= MMOE_RECIPE_COUNT)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: unknown recipe %d", (int)d->recipe);
    if ((unsigned)d->math > MMOE_MATH_FAST)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: unknown math mode %d", (int)d->math);
    if ((unsigned)d->shared_mode > MMOE_SHARED_SERIAL)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: unknown shared mode %d", (int)d->shared_mode);
    if (d->pad_to < 0 || d->pad_to % 128 != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "moe desc: pad_to %lld must be 0 or a multiple of 128",
                              (long long)d->pad_to);
    return MMOE_OK;
}

/** Names of the recipes, by enum value. */
static const char *const recipe_names[MMOE_RECIPE_COUNT] = {"sm100", "sm90", "dsv4-ref"};
/** Names of the shared modes, by enum value. */
static const char *const shared_names[] = {"auto", "fused", "serial"};
/** Names of the shared paths, by enum value. */
static const char *const path_names[] = {"none", "fused", "serial"};

const char *mmoe_moe_recipe_name(mmoe_moe_recipe recipe)
{
    return (unsigned)recipe < MMOE_RECIPE_COUNT ? recipe_names[recipe] : "?";
}

mmoe_status mmoe_moe_recipe_from_name(const char *name, mmoe_moe_recipe *out, mmoe_error *err)
{
    for (int i = 0; i < MMOE_RECIPE_COUNT; i++)
        if (strcmp(name, recipe_names[i]) == 0) {
            *out = (mmoe_moe_recipe)i;
            return MMOE_OK;
        }
    return mmoe_error_set(err, MMOE_EINVAL, "unknown recipe '%s' (expected sm100, sm90 or dsv4-ref)", name);
}

const char *mmoe_moe_shared_mode_name(mmoe_moe_shared_mode mode)
{
    return (unsigned)mode <= MMOE_SHARED_SERIAL ? shared_names[mode] : "?";
}

mmoe_status mmoe_moe_shared_mode_from_name(const char *name, mmoe_moe_shared_mode *out, mmoe_error *err)
{
    for (int i = 0; i <= MMOE_SHARED_SERIAL; i++)
        if (strcmp(name, shared_names[i]) == 0) {
            *out = (mmoe_moe_shared_mode)i;
            return MMOE_OK;
        }
    return mmoe_error_set(err, MMOE_EINVAL, "unknown shared mode '%s' (expected auto, fused or serial)", name);
}

const char *mmoe_moe_path_name(mmoe_moe_path path)
{
    return (unsigned)path <= MMOE_PATH_SERIAL ? path_names[path] : "?";
}
