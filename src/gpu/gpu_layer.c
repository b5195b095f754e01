/**
 * @file gpu_layer.c
 * @brief The backend-neutral MoE interface on the GPU: checks, scale expansion, shared plan, result.
 *
 * The GPU kernels (mmoe_gpu_moe.h) take raw byte arrays; this file turns the
 * oracle's borrowed tensor views into them:
 *
 * - routed experts: w1/w3 [I, D/2] and w2 [D, I/2] packed E2M1 (I8 or U8)
 *   with [rows, K/32] UE8M0 scales (F8_E8M0 or U8) are passed through;
 * - the shared expert's FP8 weights keep their bytes, and their B x B block
 *   scales are written out per (row, 32 along K): byte(r, g) = sc[r/B][32g/B].
 *   The same real weight is expressed at 1x32 granularity, so the expansion
 *   is exact.  F32 block scales are accepted when they are powers of two
 *   (byte = bits >> 23); otherwise the shared expert cannot be fused.
 *
 * The shared-expert plan is the oracle's, mmoe_moe_shared_plan() (one
 * function for both backends).  The GPU has only the
 * fused path: a serial plan is refused with MMOE_EUNSUPPORTED naming the
 * reason (never run silently in another way).
 *
 * Padding (pad_to) is done like the oracle: I up to a multiple of pad_to,
 * the shared width padded along when it equals I; the device copy is padded
 * once at upload (zero codes, unit scales), so there is no second copy.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_gpu_layer.h"

/** The adapter's layer: the description, the GPU layer and what a result reports. */
struct mmoe_gpu_layer {
    mmoe_moe_desc desc;          /**< the caller's description (copied) */
    mmoe_gpu_moe *g;             /**< the GPU layer */
    int64_t inter_used;          /**< routed width after padding */
    int64_t shared_inter_used;   /**< shared width after padding */
    int padded;                  /**< 1 when a width grew */
    mmoe_moe_path shared_path;   /**< none or fused */
    mmoe_gpu_moe_result last;    /**< GPU details of the last call */
};

/** I8 or U8: a packed FP4 tensor. */
static int is_byte_dtype(mmoe_dtype dt)
{
    return dt == MMOE_DT_U8 || dt == MMOE_DT_I8;
}

/** F8_E8M0 or U8: a UE8M0 scale tensor. */
static int is_scale_byte_dtype(mmoe_dtype dt)
{
    return dt == MMOE_DT_F8_E8M0 || dt == MMOE_DT_U8;
}

/** Check a 2-D byte tensor (kind 0: codes, 1: scales, bytes 255 rejected); the error names it. */
static mmoe_status expect2(const mmoe_tensor *t, const char *what, int byte_kind, int64_t rows, int64_t cols,
                           mmoe_error *err)
{
    int ok_dtype = byte_kind == 0 ? is_byte_dtype(t->dtype) : is_scale_byte_dtype(t->dtype);
    if (t->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "gpu layer: tensor %s has no data", what);
    if (!ok_dtype)
        return mmoe_error_set(err, MMOE_EDTYPE, "gpu layer: tensor %s: expected %s, found %s", what,
                              byte_kind == 0 ? "I8/U8 (packed FP4)" : "F8_E8M0/U8", mmoe_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: tensor %s: expected shape [%lld, %lld], found ndim %d",
                              what, (long long)rows, (long long)cols, t->ndim);
    if (byte_kind == 1) {
        const uint8_t *b = (const uint8_t *)t->data;
        for (int64_t i = 0; i < rows * cols; i++)
            if (b[i] == 255)
                return mmoe_error_set(err, MMOE_ERANGE, "gpu layer: tensor %s: scale byte 255 (NaN) at [%lld, %lld]",
                                      what, (long long)(i / cols), (long long)(i % cols));
    }
    return MMOE_OK;
}

/**
 * Expand a shared block-scale tensor [ceil(rows/B), ceil(cols/B)] to [rows, cols/32] bytes.
 * @return 0, or -1 when an F32 scale has no UE8M0 form (caller reports SCALE_NOT_POW2)
 */
static int expand_shared_scales(const mmoe_tensor *sc, int64_t rows, int64_t cols, int64_t B, uint8_t *out)
{
    const int64_t bcols = (cols + B - 1) / B;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < cols / 32; g++) {
            int b = mmoe_moe_scale_ue8m0_byte(sc, (r / B) * bcols + (g * 32) / B);
            if (b < 0 || b == 255)
                return -1;
            out[r * (cols / 32) + g] = (uint8_t)b;
        }
    return 0;
}

/** Check every routed expert's six tensors (dtype, shape, scale bytes). */
static mmoe_status check_routed(const mmoe_moe_desc *d, const mmoe_moe_weights *w, mmoe_error *err)
{
    const int64_t D = d->hidden, I = d->inter;
    char what[96];
    mmoe_status st = MMOE_OK;
    if (w->experts == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "gpu layer: no routed expert weights");
    for (int64_t e = 0; e < d->n_experts && st == MMOE_OK; e++) {
        const mmoe_moe_expert_weights *x = &w->experts[e];
        const struct {
            const mmoe_tensor *t;
            const char *name;
            int kind;
            int64_t rows, cols;
        } chk[6] = {{&x->w1, "w1", 0, I, D / 2},           {&x->w3, "w3", 0, I, D / 2},
                    {&x->w2, "w2", 0, D, I / 2},           {&x->w1_scale, "w1_scale", 1, I, D / 32},
                    {&x->w3_scale, "w3_scale", 1, I, D / 32}, {&x->w2_scale, "w2_scale", 1, D, I / 32}};
        for (int i = 0; i < 6 && st == MMOE_OK; i++) {
            snprintf(what, sizeof what, "experts.%lld.%s", (long long)e, chk[i].name);
            st = expect2(chk[i].t, what, chk[i].kind, chk[i].rows, chk[i].cols, err);
        }
    }
    return st;
}

mmoe_status mmoe_gpu_layer_create(const mmoe_moe_desc *desc, const mmoe_moe_weights *w, mmoe_gpu_layer **out,
                                  mmoe_error *err)
{
    *out = NULL;
    const mmoe_moe_desc *d = desc;
    if (d->recipe != MMOE_RECIPE_SM90 && d->recipe != MMOE_RECIPE_SM100)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu layer: recipe %s has no GPU kernel (sm90, sm100 do)",
                              mmoe_moe_recipe_name(d->recipe));
    if (d->hidden <= 0 || d->hidden % 128 || d->inter <= 0 || d->inter % 128 || d->n_experts <= 0 || d->topk <= 0 ||
        d->topk > d->n_experts || d->n_shared < 0 || d->pad_to < 0 || d->pad_to % 128)
        return mmoe_error_set(err, MMOE_EINVAL,
                              "gpu layer: invalid description (hidden %lld, inter %lld: multiples of 128; E %lld, topk %d, "
                              "pad_to %lld)", (long long)d->hidden, (long long)d->inter, (long long)d->n_experts,
                              d->topk, (long long)d->pad_to);
    if (d->topk > 31)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu layer: topk %d > 31 is not supported on the GPU", d->topk);
    /* The GEMM kernel family: the device's native one unless MMOE_GPU_GEMM says otherwise (the GPU
     * test suite runs once per family this way); checked before any device is touched. */
    mmoe_gpu_gemm gemm = MMOE_GPU_GEMM_AUTO;
    const char *gemm_env = getenv("MMOE_GPU_GEMM");
    if (gemm_env != NULL && gemm_env[0] != '\0' && mmoe_gpu_gemm_parse(gemm_env, &gemm) != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "gpu layer: MMOE_GPU_GEMM=%s is not a GEMM kernel family (expected "
                              "one of %s)", gemm_env, mmoe_gpu_gemm_names());
    int cc = 0;
    mmoe_status st = mmoe_gpu_available(&cc, err);
    if (st != MMOE_OK)
        return st;
    if ((st = check_routed(d, w, err)) != MMOE_OK)
        return st;
    mmoe_gpu_layer *L = (mmoe_gpu_layer *)calloc(1, sizeof *L);
    if (L == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
    L->desc = *d;
    const int64_t D = d->hidden, I = d->inter;
    L->inter_used = d->pad_to > 0 ? (I + d->pad_to - 1) / d->pad_to * d->pad_to : I;
    const int64_t SW = (int64_t)d->n_shared * d->shared_inter;
    L->shared_inter_used = d->shared_inter == I ? (int64_t)d->n_shared * L->inter_used : SW;
    L->padded = L->inter_used != I || L->shared_inter_used != SW;

    mmoe_gpu_moe_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.hidden = (int)D;
    gd.inter = (int)L->inter_used;
    gd.inter_src = (int)I;
    gd.n_experts = (int)d->n_experts;
    gd.topk = d->topk;
    gd.swiglu_limit = isinf(d->swiglu_limit) ? 0.0f : d->swiglu_limit;
    _Static_assert((int)MMOE_GPU_RECIPE_SM90 == (int)MMOE_RECIPE_SM90 &&
                       (int)MMOE_GPU_RECIPE_SM100 == (int)MMOE_RECIPE_SM100,
                   "the GPU recipes carry the oracle's numbers");
    gd.recipe = d->recipe == MMOE_RECIPE_SM90 ? MMOE_GPU_RECIPE_SM90 : MMOE_GPU_RECIPE_SM100;
    gd.gemm = gemm;

    const uint8_t **ptrs = (const uint8_t **)calloc(6 * (size_t)d->n_experts, sizeof *ptrs);
    uint8_t *ss1 = NULL, *ss3 = NULL, *ss2 = NULL;
    if (ptrs == NULL) {
        free(L);
        return mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
    }
    mmoe_gpu_moe_weights gw;
    memset(&gw, 0, sizeof gw);
    for (int64_t e = 0; e < d->n_experts; e++) {
        const mmoe_moe_expert_weights *x = &w->experts[e];
        ptrs[0 * d->n_experts + e] = (const uint8_t *)x->w1.data;
        ptrs[1 * d->n_experts + e] = (const uint8_t *)x->w3.data;
        ptrs[2 * d->n_experts + e] = (const uint8_t *)x->w2.data;
        ptrs[3 * d->n_experts + e] = (const uint8_t *)x->w1_scale.data;
        ptrs[4 * d->n_experts + e] = (const uint8_t *)x->w3_scale.data;
        ptrs[5 * d->n_experts + e] = (const uint8_t *)x->w2_scale.data;
    }
    gw.w1 = ptrs;
    gw.w3 = ptrs + d->n_experts;
    gw.w2 = ptrs + 2 * d->n_experts;
    gw.s1 = ptrs + 3 * d->n_experts;
    gw.s3 = ptrs + 4 * d->n_experts;
    gw.s2 = ptrs + 5 * d->n_experts;

    L->shared_path = MMOE_PATH_NONE;
    if (d->n_shared > 0) {
        char reason[MMOE_MOE_REASON_LEN];
        mmoe_moe_shared_facts facts;
        mmoe_moe_shared_facts_of(&w->shared, L->inter_used, L->shared_inter_used, &facts);
        if (mmoe_moe_shared_plan(d, &facts, NULL, reason) != MMOE_PATH_FUSED) {
            st = mmoe_error_set(err, MMOE_EUNSUPPORTED,
                                "gpu layer: the shared expert cannot be fused (%s) and the GPU has no serial shared path",
                                reason);
            goto fail;
        }
        const mmoe_moe_expert_weights *s = &w->shared;
        const int64_t B = d->shared_block;
        const int64_t tens_rows[3] = {SW, SW, D}, tens_cols[3] = {D, D, SW};
        const mmoe_tensor *tw[3] = {&s->w1, &s->w3, &s->w2};
        const mmoe_tensor *ts[3] = {&s->w1_scale, &s->w3_scale, &s->w2_scale};
        static const char *names[3] = {"shared.w1", "shared.w3", "shared.w2"};
        for (int i = 0; i < 3; i++) {
            if (tw[i]->data == NULL || tw[i]->ndim != 2 || tw[i]->shape[0] != tens_rows[i] ||
                tw[i]->shape[1] != tens_cols[i]) {
                st = mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: tensor %s: expected [%lld, %lld]", names[i],
                                    (long long)tens_rows[i], (long long)tens_cols[i]);
                goto fail;
            }
            const int64_t br = (tens_rows[i] + B - 1) / B, bc = (tens_cols[i] + B - 1) / B;
            if (ts[i]->data == NULL || ts[i]->ndim != 2 || ts[i]->shape[0] != br || ts[i]->shape[1] != bc) {
                st = mmoe_error_set(err, MMOE_ESHAPE, "gpu layer: tensor %s.scale: expected [%lld, %lld]", names[i],
                                    (long long)br, (long long)bc);
                goto fail;
            }
        }
        ss1 = (uint8_t *)malloc((size_t)(SW * D / 32));
        ss3 = (uint8_t *)malloc((size_t)(SW * D / 32));
        ss2 = (uint8_t *)malloc((size_t)(D * SW / 32));
        if (ss1 == NULL || ss3 == NULL || ss2 == NULL) {
            st = mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory (shared scales)");
            goto fail;
        }
        if (expand_shared_scales(&s->w1_scale, SW, D, B, ss1) || expand_shared_scales(&s->w3_scale, SW, D, B, ss3) ||
            expand_shared_scales(&s->w2_scale, D, SW, B, ss2)) {
            st = mmoe_error_set(err, MMOE_ERANGE, "gpu layer: a shared scale is NaN (byte 255)");
            goto fail;
        }
        gw.sw1 = (const uint8_t *)s->w1.data;
        gw.sw3 = (const uint8_t *)s->w3.data;
        gw.sw2 = (const uint8_t *)s->w2.data;
        gw.ss1 = ss1;
        gw.ss3 = ss3;
        gw.ss2 = ss2;
        gd.shared_inter = (int)L->shared_inter_used;
        gd.shared_inter_src = (int)SW;
        L->shared_path = MMOE_PATH_FUSED;
    }
    st = mmoe_gpu_moe_create(&gd, &gw, 0, &L->g, err);
fail:
    free(ptrs);
    free(ss1);
    free(ss3);
    free(ss2);
    if (st != MMOE_OK) {
        free(L);
        return st;
    }
    *out = L;
    return MMOE_OK;
}

void mmoe_gpu_layer_destroy(mmoe_gpu_layer *L)
{
    if (L == NULL)
        return;
    mmoe_gpu_moe_destroy(L->g);
    free(L);
}

const mmoe_gpu_moe_result *mmoe_gpu_layer_details(const mmoe_gpu_layer *L)
{
    return &L->last;
}

mmoe_gpu_moe *mmoe_gpu_layer_raw(mmoe_gpu_layer *L)
{
    return L->g;
}

mmoe_status mmoe_gpu_layer_run(mmoe_gpu_layer *L, const mmoe_moe_input *in, const mmoe_moe_output *out,
                               mmoe_moe_result *result, mmoe_error *err)
{
    const mmoe_moe_desc *d = &L->desc;
    const int64_t T = in->n_tokens, K = d->topk, E = d->n_experts;
    mmoe_status st = MMOE_OK;
    int32_t *idx32 = NULL;
    if (result != NULL) { /* reset every field but the caller's expert_recv_stats */
        int64_t *stats = result->expert_recv_stats;
        mmoe_moe_result_init(result);
        result->expert_recv_stats = stats;
    }
    if (T < 0 || T > (int64_t)1 << 24) {
        st = mmoe_error_set(err, MMOE_EINVAL, "gpu layer: n_tokens %lld out of range", (long long)T);
        goto done;
    }
    if (T > 0 && in->topk_idx == NULL) {
        st = mmoe_error_set(err, MMOE_EUNSUPPORTED, "gpu layer: the router is not on the GPU; pass topk_idx/topk_weights");
        goto done;
    }
    idx32 = (int32_t *)malloc((size_t)(T * K > 0 ? T * K : 1) * sizeof *idx32);
    if (idx32 == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "gpu layer: out of host memory");
        goto done;
    }
    for (int64_t i = 0; i < T * K; i++) {
        int64_t e = in->topk_idx[i];
        if (e < -1 || e >= E) {
            st = mmoe_error_set(err, MMOE_EINVAL, "gpu layer: topk_idx[%lld][%lld] = %lld outside [-1, %lld)",
                                (long long)(i / K), (long long)(i % K), (long long)e, (long long)E);
            goto done;
        }
        if (e >= 0 && isnan(in->topk_weights[i])) {
            st = mmoe_error_set(err, MMOE_EINVAL, "gpu layer: topk_weights[%lld][%lld] is NaN", (long long)(i / K),
                                (long long)(i % K));
            goto done;
        }
        idx32[i] = (int32_t)e;
    }
    st = mmoe_gpu_moe_run(L->g, (int)T, in->x, idx32, in->topk_weights, out->y, &L->last, err);
    if (st == MMOE_OK) {
        if (out->topk_idx != NULL)
            memcpy(out->topk_idx, in->topk_idx, (size_t)(T * K) * sizeof(int64_t));
        if (out->topk_weights != NULL)
            memcpy(out->topk_weights, in->topk_weights, (size_t)(T * K) * sizeof(float));
    }
done:
    if (result != NULL) {
        result->status = st;
        if (st != MMOE_OK && err != NULL)
            result->error = *err;
        result->backend = "gpu";
        result->recipe = d->recipe;
        result->math = MMOE_MATH_PRECISE;
        result->shared_path = L->shared_path;
        result->fallback = MMOE_FALLBACK_NONE;
        result->padded = L->padded;
        result->inter_used = L->inter_used;
        result->shared_inter_used = L->shared_inter_used;
        result->n_tokens = T;
        if (st == MMOE_OK) {
            int64_t pairs = 0, active = 0;
            int64_t *cnt = (int64_t *)calloc((size_t)E, sizeof *cnt);
            for (int64_t i = 0; i < T * K; i++)
                if (in->topk_idx[i] >= 0) {
                    pairs++;
                    if (cnt != NULL)
                        cnt[in->topk_idx[i]]++;
                }
            for (int64_t e = 0; cnt != NULL && e < E; e++) {
                active += cnt[e] > 0;
                if (result->expert_recv_stats != NULL)
                    result->expert_recv_stats[e] += cnt[e];
            }
            free(cnt);
            result->routed_pairs = pairs;
            result->active_experts = active;
            const double D = (double)d->hidden, Iu = (double)L->inter_used, SIu = (double)L->shared_inter_used;
            result->gemm_flops = 2.0 * (double)pairs * 3.0 * D * Iu + 2.0 * (double)T * 3.0 * D * SIu;
        }
    }
    free(idx32);
    return st;
}
