/**
 * @file test_model.c
 * @brief Suite "model": prefill = decode (bit-exact), the forward's observer, the head against float64, loader errors that name the tensor.
 *
 * Every case writes a fresh tiny checkpoint with mmoe_synth_model_write() (a few MB,
 * every layer type: hash + window-only, hash + ratio 4, ratio 128, MTP) and opens it.
 * The writer's files are the same bytes for 1 and 3 threads, in one shard and in six.
 *
 * Prefill versus decode: the attention, mHC, norms and head are row-independent and
 * order-fixed, and the MoE oracle is batch-invariant (every GEMM output is summed in one fixed
 * order, src/cpu_ref/moe_dot.c), so a prefill, token-by-token decode, a chunked prefill and
 * the MTP head row by row give the same bits: the comparisons are bit-exact.  The sequence length crosses the window (16 in the tiny shape), has more
 * ratio-4 blocks than index_topk (4) and completes a ratio-128 block.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <dirent.h>
#include <unistd.h>

#include "mmoe_formats.h"
#include "mmoe_model.h"
#include "mmoe_safetensors.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/** Write a tiny checkpoint with @p layers layers into the new directory @p dir on @p threads threads. */
static void write_tiny(const char *dir, int layers, uint64_t shard_bytes, int threads)
{
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert(mmoe_config_preset("tiny", layers, &cfg, &err) == MMOE_OK);
    ck_assert_msg(mmoe_synth_model_write(&cfg, g_seed, dir, shard_bytes, threads, NULL, NULL, &err) == MMOE_OK, "%s",
                  err.msg);
}

/** A tiny checkpoint in a fresh temporary directory: @p root gets the temp dir, @p dir the checkpoint. */
static void make_tiny(char *root, size_t rn, char *dir, size_t dn, int layers, uint64_t shard_bytes)
{
    ck_assert_int_eq(mmoe_test_mkdtemp(root, rn), 0);
    snprintf(dir, dn, "%s/ckpt", root);
    write_tiny(dir, layers, shard_bytes, 0);
}

/**
 * Are @p a and @p b ([T, V] logits) the same bits?  Prints the verdict (or the first differing
 * row and logit) to stderr.
 */
static int same_bits(const char *what, const float *a, const float *b, int64_t T, int64_t V)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < V; v++)
            if (memcmp(a + t * V + v, b + t * V + v, sizeof(float)) != 0) {
                fprintf(stderr, "%s: rows 0..%lld bit-exact, row %lld logit %lld differs: %.9g vs %.9g\n", what,
                        (long long)t - 1, (long long)t, (long long)v, a[t * V + v], b[t * V + v]);
                return 0;
            }
    fprintf(stderr, "%s: bit-exact (%lld rows)\n", what, (long long)T);
    return 1;
}

static int32_t *random_ids(int64_t T, int64_t V, uint64_t seed)
{
    mmoe_rng r;
    mmoe_rng_seed(&r, seed);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t i = 0; i < T; i++)
        ids[i] = (int32_t)mmoe_rng_below(&r, (uint64_t)V);
    return ids;
}

START_TEST(prefill_equals_decode)
{
    char root[512], dir[600];
    make_tiny(root, sizeof root, dir, sizeof dir, 3, 0);
    mmoe_model *m = mmoe_test_open_model(dir);
    mmoe_error err;
    mmoe_error_clear(&err);
    const mmoe_config *c = mmoe_model_config(m);
    const int64_t T = 132, V = c->vocab_size, S = c->hc_mult * c->dim;
    int32_t *ids = random_ids(T, V, g_seed + 7);
    float *a = malloc(sizeof(float) * (size_t)(T * V)), *b = malloc(sizeof(float) * (size_t)(T * V));
    uint16_t *sa = malloc(sizeof(uint16_t) * (size_t)(T * S)), *sb = malloc(sizeof(uint16_t) * (size_t)(T * S));
    mmoe_model_state *s;
    ck_assert(mmoe_model_state_create(m, T, &s, &err) == MMOE_OK);
    mmoe_test_poison_f32(a, (size_t)(T * V));
    mmoe_test_poison_f32(b, (size_t)(T * V));
    ck_assert_msg(mmoe_model_forward(m, s, ids, T, a, 0, sa, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(mmoe_model_state_pos(s), T);
    for (int64_t i = 0; i < T * V; i++)
        ck_assert_msg(isfinite(a[i]), "logit %lld not finite", (long long)i);
    /* token by token */
    mmoe_model_state_reset(s);
    for (int64_t t = 0; t < T; t++)
        ck_assert_msg(mmoe_model_forward(m, s, ids + t, 1, b + t * V, 0, sb + t * S, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(same_bits("decode vs prefill", b, a, T, V), "decode logits differ from prefill");
    /* chunks: 50, 1, the rest (a chunked prefill goes through the same path) */
    mmoe_model_state_reset(s);
    mmoe_test_poison_f32(b, (size_t)(T * V));
    ck_assert(mmoe_model_forward(m, s, ids, 50, b, 0, NULL, &err) == MMOE_OK);
    ck_assert(mmoe_model_forward(m, s, ids + 50, 1, b + 50 * V, 0, NULL, &err) == MMOE_OK);
    ck_assert(mmoe_model_forward(m, s, ids + 51, T - 51, b + 51 * V, 1, NULL, &err) == MMOE_OK);
    ck_assert(same_bits("chunks 50/1/rest vs prefill", b, a, 51, V));
    ck_assert(same_bits("last row of the last chunk", b + 51 * V, a + (T - 1) * V, 1, V)); /* --last */
    /* MTP: all rows at once = row by row */
    float *ma = malloc(sizeof(float) * (size_t)((T - 1) * V)), *mb = malloc(sizeof(float) * (size_t)((T - 1) * V));
    mmoe_model_state_reset(s);
    ck_assert_msg(mmoe_model_mtp_forward(m, s, sa, ids + 1, T - 1, ma, &err) == MMOE_OK, "%s", err.msg);
    mmoe_model_state_reset(s);
    for (int64_t t = 0; t < T - 1; t++)
        ck_assert(mmoe_model_mtp_forward(m, s, sa + t * S, ids + 1 + t, 1, mb + t * V, &err) == MMOE_OK);
    ck_assert(same_bits("MTP row by row vs all rows", mb, ma, T - 1, V));
    /* errors: a token id outside the vocabulary, a sequence longer than the state */
    int32_t bad = (int32_t)V;
    mmoe_model_state_reset(s);
    ck_assert_int_eq(mmoe_model_forward(m, s, &bad, 1, a, 0, NULL, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "vocabulary") != NULL);
    ck_assert_int_eq(mmoe_model_forward(m, s, ids, T, a, 0, NULL, &err), MMOE_OK); /* fills the state */
    ck_assert_int_eq(mmoe_model_forward(m, s, ids, 1, a, 0, NULL, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "max_seq_len") != NULL);
    free(ma);
    free(mb);
    free(ids);
    free(a);
    free(b);
    free(sa);
    free(sb);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
    mmoe_test_rmtree(root);
}
END_TEST

/** What the observer of observer_sees_each_sublayer saw. */
typedef struct seen {
    const mmoe_model *m;
    const int32_t *ids;   /**< the token ids of the whole sequence (hash layers' MoE) */
    int calls, stop_at;   /**< calls so far; the call that returns non-zero (-1: none) */
    int block[64], which[64];
    int64_t pos[64], T[64];
    int moe_checked, moe_mismatch;
} seen;

/**
 * Record each call; rerun each MoE call on a layer of its own made from the block's weights:
 * the observed output must be that layer's output of the observed input, bit for bit.
 */
static int observe(void *ctx, int block, mmoe_sublayer which, int64_t pos, int64_t T, const uint16_t *in,
                   const uint16_t *out)
{
    seen *o = ctx;
    if (o->calls < 64) {
        o->block[o->calls] = block;
        o->which[o->calls] = (int)which;
        o->pos[o->calls] = pos;
        o->T[o->calls] = T;
    }
    const int this_call = o->calls++;
    if (which == MMOE_SUBLAYER_MOE) {
        mmoe_moe_desc d;
        mmoe_moe_weights w;
        mmoe_moe_layer *layer = NULL;
        mmoe_error err;
        mmoe_error_clear(&err);
        uint16_t *y = malloc(sizeof(uint16_t) * (size_t)(T * mmoe_model_config(o->m)->dim));
        ck_assert(y != NULL);
        ck_assert_msg(mmoe_model_moe_layer(o->m, block, &d, &w, &err) == MMOE_OK, "%s", err.msg);
        ck_assert_msg(mmoe_moe_layer_create(&d, &layer, &err) == MMOE_OK, "%s", err.msg);
        ck_assert_msg(mmoe_moe_layer_set_weights(layer, &w, &err) == MMOE_OK, "%s", err.msg);
        mmoe_moe_input mi = {T, in, d.routing == MMOE_ROUTING_HASH ? o->ids + pos : NULL, NULL, NULL};
        mmoe_moe_output mo = {y, NULL, NULL};
        mmoe_test_poison_bf16(y, (size_t)(T * mmoe_model_config(o->m)->dim));
        ck_assert_msg(mmoe_moe_layer_run(layer, &mi, &mo, NULL, &err) == MMOE_OK, "%s", err.msg);
        o->moe_checked++;
        o->moe_mismatch += memcmp(y, out, sizeof(uint16_t) * (size_t)(T * mmoe_model_config(o->m)->dim)) != 0;
        mmoe_moe_layer_destroy(layer);
        mmoe_moe_weights_release(&w);
        free(y);
    }
    return this_call == o->stop_at;
}

/*
 * The forward's observer: called once per sub-layer in the blocks' order with the chunk's
 * positions; what it is given as the MoE's input and output are that (the block's MoE layer
 * rebuilt from its weights maps the one to the other); a non-zero return stops the forward
 * with an error that names the block.
 */
START_TEST(observer_sees_each_sublayer)
{
    char root[512], dir[600];
    make_tiny(root, sizeof root, dir, sizeof dir, 3, 0);
    mmoe_model *m = mmoe_test_open_model(dir);
    mmoe_error err;
    mmoe_error_clear(&err);
    const mmoe_config *c = mmoe_model_config(m);
    const int64_t T = 20, V = c->vocab_size;
    const int n_layers = c->n_layers;
    int32_t *ids = random_ids(T, V, g_seed + 11);
    mmoe_model_state *s;
    ck_assert(mmoe_model_state_create(m, T, &s, &err) == MMOE_OK);
    seen o = {.m = m, .ids = ids, .stop_at = -1};
    mmoe_model_set_observer(m, observe, &o);
    ck_assert_msg(mmoe_model_forward(m, s, ids, 12, NULL, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_msg(mmoe_model_forward(m, s, ids + 12, 8, NULL, 0, NULL, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(o.calls, 4 * n_layers);
    for (int i = 0; i < o.calls; i++) {
        const int chunk = i / (2 * n_layers), k = i % (2 * n_layers);
        ck_assert_int_eq(o.block[i], k / 2);
        ck_assert_int_eq(o.which[i], k % 2 ? MMOE_SUBLAYER_MOE : MMOE_SUBLAYER_ATTENTION);
        ck_assert_int_eq(o.pos[i], chunk ? 12 : 0);
        ck_assert_int_eq(o.T[i], chunk ? 8 : 12);
    }
    ck_assert_int_eq(o.moe_checked, 2 * n_layers);
    ck_assert_int_eq(o.moe_mismatch, 0);
    /* stop at the second block's MoE: the forward fails and says where */
    mmoe_model_state_reset(s);
    o.calls = 0;
    o.stop_at = 3;
    ck_assert_int_eq(mmoe_model_forward(m, s, ids, 4, NULL, 0, NULL, &err), MMOE_EINVAL);
    ck_assert_msg(strstr(err.msg, "block 1's MoE") != NULL, "%s", err.msg);
    ck_assert_int_eq(o.calls, 4);
    /* removed: no more calls */
    mmoe_model_set_observer(m, NULL, NULL);
    mmoe_model_state_reset(s);
    ck_assert_int_eq(mmoe_model_forward(m, s, ids, 4, NULL, 0, NULL, &err), MMOE_OK);
    ck_assert_int_eq(o.calls, 4);
    free(ids);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
    mmoe_test_rmtree(root);
}
END_TEST

static float f32_of(const mmoe_tensor *t, int64_t i)
{
    return t->dtype == MMOE_DT_F32 ? ((const float *)t->data)[i] : mmoe_bf16_to_f32(((const uint16_t *)t->data)[i]);
}

/**
 * The embedding (exact rows) and the head against float64 (docs/spec/architecture.md, head) on the final streams of a short prefill.
 * Bound: the C head's bf16 hc_head output and bf16 norm output may each differ by one
 * bf16 ulp (2^-8 relative) from the double path, so logit v may move by at most
 * 2^-7 * sum_c |y_c * w_vc| (+ fp32 rounding of the result).
 */
START_TEST(embed_and_head_vs_f64)
{
    char root[512], dir[600];
    make_tiny(root, sizeof root, dir, sizeof dir, 1, 0);
    mmoe_model *m = mmoe_test_open_model(dir);
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_ckpt *ck;
    ck_assert(mmoe_ckpt_open(dir, &ck, &err) == MMOE_OK);
    const mmoe_config *c = mmoe_model_config(m);
    const int64_t T = 6, V = c->vocab_size, D = c->dim, HC = c->hc_mult;
    int32_t *ids = random_ids(T, V, g_seed + 3);
    float *logits = malloc(sizeof(float) * (size_t)(T * V));
    uint16_t *X = malloc(sizeof(uint16_t) * (size_t)(T * HC * D));
    mmoe_model_state *s;
    ck_assert(mmoe_model_state_create(m, T, &s, &err) == MMOE_OK);
    mmoe_test_poison_f32(logits, (size_t)(T * V));
    ck_assert(mmoe_model_forward(m, s, ids, T, logits, 0, X, &err) == MMOE_OK);
    /* embedding: the rows of embed.weight, bit for bit; a bad id is named */
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(T * D));
    mmoe_test_poison_bf16(h, (size_t)(T * D));
    ck_assert(mmoe_model_embed(m, ids, T, h, &err) == MMOE_OK);
    const mmoe_tensor *emb = mmoe_ckpt_find(ck, "embed.weight");
    for (int64_t t = 0; t < T; t++)
        ck_assert_mem_eq(h + t * D, (const uint16_t *)emb->data + (int64_t)ids[t] * D, sizeof(uint16_t) * (size_t)D);
    int32_t bad_ids[2] = {1, -3};
    ck_assert_int_eq(mmoe_model_embed(m, bad_ids, 2, h, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "token 1: id -3") != NULL);
    free(h);
    const mmoe_tensor *fn = mmoe_ckpt_find(ck, "hc_head_fn"), *base = mmoe_ckpt_find(ck, "hc_head_base"),
                      *scale = mmoe_ckpt_find(ck, "hc_head_scale"), *norm = mmoe_ckpt_find(ck, "norm.weight"),
                      *head = mmoe_ckpt_find(ck, "head.weight");
    double *y = malloc(sizeof(double) * (size_t)D);
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *Xt = X + t * HC * D;
        double ss = 0;
        for (int64_t i = 0; i < HC * D; i++)
            ss += pow(mmoe_bf16_to_f32(Xt[i]), 2);
        double rs = 1.0 / sqrt(ss / (double)(HC * D) + c->norm_eps), pre[64];
        for (int j = 0; j < HC; j++) {
            double acc = 0;
            for (int64_t i = 0; i < HC * D; i++)
                acc += f32_of(fn, j * HC * D + i) * (double)mmoe_bf16_to_f32(Xt[i]);
            pre[j] = 1.0 / (1.0 + exp(-(acc * rs * f32_of(scale, 0) + f32_of(base, j)))) + c->hc_eps;
        }
        double ss2 = 0;
        for (int64_t k = 0; k < D; k++) {
            y[k] = 0;
            for (int j = 0; j < HC; j++)
                y[k] += pre[j] * mmoe_bf16_to_f32(Xt[j * D + k]);
            ss2 += y[k] * y[k];
        }
        double r2 = 1.0 / sqrt(ss2 / (double)D + c->norm_eps);
        for (int64_t k = 0; k < D; k++)
            y[k] *= r2 * f32_of(norm, k);
        for (int64_t v = 0; v < V; v++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < D; k++) {
                double w = f32_of(head, v * D + k);
                ref += y[k] * w;
                mag += fabs(y[k] * w);
            }
            double bound = 0x1p-7 * mag + 1e-6 * fabs(ref);
            ck_assert_msg(fabs(logits[t * V + v] - ref) <= bound, "logit [%lld, %lld] = %.9g, ref %.9g, bound %.3g",
                          (long long)t, (long long)v, logits[t * V + v], ref, bound);
        }
    }
    free(y);
    free(ids);
    free(logits);
    free(X);
    mmoe_model_state_destroy(s);
    mmoe_ckpt_close(ck);
    mmoe_model_close(m);
    mmoe_test_rmtree(root);
}
END_TEST

/** How to damage one tensor of a checkpoint. */
typedef enum { DROP, RETYPE, RESHAPE } damage;

/**
 * Rewrite the shard holding @p victim (and, for DROP, the index) so that the tensor is
 * missing, has dtype F16, or has one more element in its first dimension.
 */
static void damage_tensor(const char *dir, const char *victim, damage how)
{
    mmoe_ckpt *ck;
    mmoe_error err;
    ck_assert_msg(mmoe_ckpt_open(dir, &ck, &err) == MMOE_OK, "%s", err.msg);
    const mmoe_ckpt_entry *ve = mmoe_ckpt_find_entry(ck, victim);
    ck_assert_msg(ve != NULL, "no tensor %s", victim);
    char shard[600], tmp[1400], path[1400];
    snprintf(shard, sizeof shard, "%s", ve->shard);
    mmoe_st_writer *w;
    ck_assert(mmoe_st_writer_create(&w, &err) == MMOE_OK);
    size_t n = mmoe_ckpt_count(ck);
    const char **names = malloc(sizeof(char *) * n), **files = malloc(sizeof(char *) * n);
    size_t kept = 0;
    uint64_t total = 0;
    void *bigger = NULL;
    for (size_t i = 0; i < n; i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_get(ck, i);
        int is_victim = strcmp(e->name, victim) == 0;
        if (!(is_victim && how == DROP)) {
            names[kept] = e->name;
            files[kept++] = e->shard;
            total += e->view.nbytes;
        }
        if (strcmp(e->shard, shard) != 0)
            continue;
        if (!is_victim) {
            ck_assert(mmoe_st_writer_add_tensor(w, e->name, &e->view, &err) == MMOE_OK);
        } else if (how == RETYPE) {
            ck_assert_int_eq(mmoe_dtype_size(e->view.dtype) % 2, 0);
            int64_t shape[MMOE_MAX_DIMS];
            memcpy(shape, e->view.shape, sizeof shape);
            shape[e->view.ndim - 1] *= (int64_t)mmoe_dtype_size(e->view.dtype) / 2;
            ck_assert(mmoe_st_writer_add(w, e->name, MMOE_DT_F16, e->view.ndim, shape, e->view.data, e->view.nbytes,
                                         &err) == MMOE_OK);
        } else if (how == RESHAPE) {
            int64_t shape[MMOE_MAX_DIMS];
            memcpy(shape, e->view.shape, sizeof shape);
            size_t row = e->view.nbytes / (size_t)shape[0];
            shape[0] += 1;
            bigger = calloc(1, e->view.nbytes + row);
            memcpy(bigger, e->view.data, e->view.nbytes);
            ck_assert(mmoe_st_writer_add(w, e->name, e->view.dtype, e->view.ndim, shape, bigger,
                                         e->view.nbytes + row, &err) == MMOE_OK);
        }
    }
    snprintf(tmp, sizeof tmp, "%s/%s.new", dir, shard);
    ck_assert_msg(mmoe_st_writer_finish(w, tmp, &err) == MMOE_OK, "%s", err.msg);
    if (how == DROP) {
        snprintf(path, sizeof path, "%s/%s", dir, MMOE_ST_INDEX_NAME);
        ck_assert(mmoe_st_write_index(path, kept, names, files, total, &err) == MMOE_OK);
    }
    mmoe_st_writer_destroy(w);
    free(bigger);
    free(names);
    free(files);
    mmoe_ckpt_close(ck);
    snprintf(path, sizeof path, "%s/%s", dir, shard);
    ck_assert_int_eq(rename(tmp, path), 0);
}

/** Open @p dir, expecting status @p want and every string of @p needles in the message. */
static void expect_open_error(const char *dir, mmoe_status want, const char *n1, const char *n2)
{
    mmoe_model *m = (mmoe_model *)1;
    mmoe_error err;
    mmoe_error_clear(&err);
    mmoe_status st = mmoe_model_open(dir, NULL, NULL, &m, &err);
    ck_assert_msg(st == want, "status %s, expected %s: %s", mmoe_status_name(st), mmoe_status_name(want), err.msg);
    ck_assert(m == NULL);
    ck_assert_msg(strstr(err.msg, n1) != NULL, "message '%s' lacks '%s'", err.msg, n1);
    if (n2)
        ck_assert_msg(strstr(err.msg, n2) != NULL, "message '%s' lacks '%s'", err.msg, n2);
}

START_TEST(loader_errors_name_the_tensor)
{
    char root[512], dir[600], path[800];
    static const struct {
        const char *victim;
        damage how;
        mmoe_status want;
        const char *n2;
    } cases[] = {
        {"layers.1.attn.indexer.weights_proj.weight", DROP, MMOE_ENOTFOUND, "missing"},
        {"layers.2.ffn.experts.3.w2.scale", DROP, MMOE_ENOTFOUND, "missing"},
        {"mtp.0.h_proj.weight", DROP, MMOE_ENOTFOUND, "missing"},
        {"layers.2.ffn.gate.bias", RETYPE, MMOE_EDTYPE, "F16"},
        {"layers.0.attn.attn_sink", RESHAPE, MMOE_ESHAPE, "[5]"},
        {"layers.1.attn.wq_b.weight", RESHAPE, MMOE_ESHAPE, "[513, 128]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        make_tiny(root, sizeof root, dir, sizeof dir, 3, 1 << 20);
        damage_tensor(dir, cases[i].victim, cases[i].how);
        expect_open_error(dir, cases[i].want, cases[i].victim, cases[i].n2);
        mmoe_test_rmtree(root);
    }
    /* a missing shard is named */
    make_tiny(root, sizeof root, dir, sizeof dir, 3, 1 << 20);
    snprintf(path, sizeof path, "%s/model-00002-of-00006.safetensors", dir);
    ck_assert_msg(unlink(path) == 0, "the 1 MiB shard target should give 6 shards");
    expect_open_error(dir, MMOE_ENOTFOUND, "model-00002-of-00006.safetensors", NULL);
    /* a config key out of range is named */
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert(f != NULL);
    fputs("{\"vocab_size\": 512, \"hidden_size\": 256, \"moe_intermediate_size\": 128, \"num_hidden_layers\": 3,"
          "\"num_attention_heads\": 4, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"q_lora_rank\": 128,"
          "\"head_dim\": 128, \"qk_rope_head_dim\": 64, \"o_groups\": 3, \"o_lora_rank\": 128,"
          "\"sliding_window\": 16, \"index_n_heads\": 4, \"index_head_dim\": 128, \"index_topk\": 4}",
          f);
    fclose(f);
    expect_open_error(dir, MMOE_ERANGE, "'o_groups'", NULL);
    unlink(path);
    expect_open_error(dir, MMOE_ENOTFOUND, "config.json", NULL);
    mmoe_test_rmtree(root);
}
END_TEST

/**
 * The files of directory @p b are those of @p a, byte for byte (same names, same bytes).
 * @return the number of files
 */
static int expect_same_files(const char *a, const char *b)
{
    DIR *d = opendir(a);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char pa[1024], pb[1024];
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        size_t na = 0, nb = 0;
        uint8_t *fa = mmoe_test_read_file(pa, &na), *fb = mmoe_test_read_file(pb, &nb);
        ck_assert_msg(fa != NULL && fb != NULL, "%s or %s cannot be read", pa, pb);
        ck_assert_msg(na == nb, "%s: %zu bytes, %s: %zu bytes", pa, na, pb, nb);
        size_t at = 0;
        while (at < na && fa[at] == fb[at])
            at++;
        ck_assert_msg(at == na, "%s and %s differ first at byte %zu", pa, pb, at);
        free(fa);
        free(fb);
        n++;
    }
    closedir(d);
    d = opendir(b);
    ck_assert_ptr_nonnull(d);
    int nb_files = 0;
    while ((e = readdir(d)) != NULL)
        nb_files += e->d_name[0] != '.';
    closedir(d);
    ck_assert_msg(nb_files == n, "%s holds %d files, %s %d", a, n, b, nb_files);
    return n;
}

START_TEST(threads_write_the_same_bytes)
{
    /* each tensor has its own generator: 3 threads must give the one-thread files, whichever
     * thread takes which tensor, in one shard (every worker busy) and in six */
    static const struct {
        uint64_t shard_bytes;
        int files; /* shards + index + config */
    } cases[] = {{0, 3}, {1 << 20, 8}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char root[512], one[600], three[600];
        ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
        snprintf(one, sizeof one, "%s/one", root);
        snprintf(three, sizeof three, "%s/three", root);
        write_tiny(one, 3, cases[i].shard_bytes, 1);
        write_tiny(three, 3, cases[i].shard_bytes, 3);
        ck_assert_int_eq(expect_same_files(one, three), cases[i].files);
        fprintf(stderr, "synth-model, shard target %llu bytes: 1 and 3 threads wrote the same %d files\n",
                (unsigned long long)cases[i].shard_bytes, cases[i].files);
        mmoe_test_rmtree(root);
    }
    /* a thread count out of range is refused, and nothing is written */
    char root[512], dir[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(root, sizeof root), 0);
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    mmoe_config cfg;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert(mmoe_config_preset("tiny", 1, &cfg, &err) == MMOE_OK);
    const int bad[] = {-1, MMOE_SYNTH_MAX_THREADS + 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mmoe_status st = mmoe_synth_model_write(&cfg, g_seed, dir, 0, bad[i], NULL, NULL, &err);
        ck_assert_msg(st == MMOE_EINVAL && strstr(err.msg, "thread count") != NULL, "%d threads: %s: %s", bad[i],
                      mmoe_status_name(st), err.msg);
        ck_assert_msg(access(dir, F_OK) != 0, "a refused thread count left '%s'", dir);
    }
    mmoe_test_rmtree(root);
}
END_TEST

/** The CLI on bad input: a clear message and a non-zero exit. */
START_TEST(cli_bad_input)
{
    const char *bin = getenv("MMOE_BIN");
    if (!bin)
        return;
    char root[512], dir[600], cmd[2048];
    make_tiny(root, sizeof root, dir, sizeof dir, 1, 0);
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s/none' --ids 1,2 --out '%s/o.st'", bin, root, root);
    ck_assert_int_eq(mmoe_test_system(cmd), 1);
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids 1,x --out '%s/o.st'", bin, dir, root);
    ck_assert_int_eq(mmoe_test_system(cmd), 2);
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids 1,99999 --out '%s/o.st'", bin, dir, root);
    ck_assert_int_eq(mmoe_test_system(cmd), 1);
    snprintf(cmd, sizeof cmd, "test ! -e '%s/o.st'", root); /* no half-written output */
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids 1,2,3 --out '%s/o.st' --last", bin, dir, root);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' synth-model --shape tiny --layers 1 --out '%s'", bin, dir); /* not empty */
    ck_assert_int_eq(mmoe_test_system(cmd), 1);
    snprintf(cmd, sizeof cmd, "'%s' synth-model --shape huge --out '%s/x'", bin, root);
    ck_assert_int_eq(mmoe_test_system(cmd), 2);
    snprintf(cmd, sizeof cmd, "'%s' bench forward --model '%s' --prefill 4 --decode 2 >/dev/null", bin, dir);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    mmoe_test_rmtree(root);
}
END_TEST

static Suite *model_suite(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, prefill_equals_decode);
    tcase_add_test(tc, observer_sees_each_sublayer);
    tcase_add_test(tc, embed_and_head_vs_f64);
    tcase_add_test(tc, loader_errors_name_the_tensor);
    tcase_add_test(tc, cli_bad_input);
    tcase_add_test(tc, threads_write_the_same_bytes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("model");
    return mmoe_test_run(model_suite());
}
