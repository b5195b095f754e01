/**
 * @file test_attn_blocks.c
 * @brief Suite "attn_blocks": compressor, indexer scores and top-k, sparse attention with sink, output projection.
 *
 * Each block is checked in isolation against a float64 oracle written here from
 * the spec (sections 3.3-3.5), or against hand-derived values.  Tolerances are
 * derived next to each check.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "attn_ref.h"
#include "attn_test_util.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

/* ================================================================ compressor */

/** Float64 pooling of one block from the per-token projections (docs/spec/architecture.md, compressor). */
static void oracle_pool(int r, int dh, int64_t j, const float *kv, const float *gate, const float *ape,
                        double *out)
{
    const int c = r == 4 ? 2 : 1, width = c * dh;
    for (int ch = 0; ch < dh; ch++) {
        double s[8 + 128], v[8 + 128];
        int n = 0;
        if (c == 2 && j > 0)
            for (int t = 0; t < r; t++) { /* previous block, first half of the channels */
                const int64_t tok = (j - 1) * r + t;
                s[n] = (double)(gate[tok * width + ch] + ape[t * width + ch]);
                v[n++] = kv[tok * width + ch];
            }
        for (int t = 0; t < r; t++) {
            const int64_t tok = j * r + t;
            const int off = c == 2 ? dh : 0;
            s[n] = (double)(gate[tok * width + off + ch] + ape[t * width + off + ch]);
            v[n++] = kv[tok * width + off + ch];
        }
        const double acc = attn_ref_softmax_pool(s, v, n);
        out[ch] = acc;
    }
}

static void check_pooling(int r, int dh, int64_t n_tokens)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/compressor"));
    const int c = r == 4 ? 2 : 1, width = c * dh;
    float *kv = malloc(sizeof(float) * (size_t)(n_tokens * width));
    float *gate = malloc(sizeof(float) * (size_t)(n_tokens * width));
    float *ape = malloc(sizeof(float) * (size_t)(r * width));
    float *state_kv = malloc(sizeof(float) * (size_t)(c * r * width));
    float *state_sc = malloc(sizeof(float) * (size_t)(c * r * width));
    float pooled[256];
    double ref[256];
    for (int64_t i = 0; i < n_tokens * width; i++) {
        kv[i] = (float)mmoe_rng_normal(&rng);
        gate[i] = (float)(2.0 * mmoe_rng_normal(&rng));
    }
    for (int i = 0; i < r * width; i++)
        ape[i] = (float)mmoe_rng_normal(&rng);
    attn_compressor_state st = {r, c, dh, state_kv, state_sc};
    attn_compressor_reset(&st);
    for (int64_t pos = 0; pos < n_tokens; pos++) {
        mmoe_test_poison_f32(pooled, 256);
        const int done = attn_compressor_push(&st, pos, kv + pos * width, gate + pos * width, ape, pooled);
        ck_assert_int_eq(done, (pos + 1) % r == 0);
        if (!done)
            continue;
        oracle_pool(r, dh, pos / r, kv, gate, ape, ref);
        for (int ch = 0; ch < dh; ch++)
            /* a convex combination of O(1) values: fp32 exp/sum/div over <= 128 terms
               errs by < 128 * 4 * 2^-24 relative to max |kv| (<= 6 here) */
            ck_assert_msg(fabs(pooled[ch] - ref[ch]) <= 128 * 4 * ldexp(1.0, -24) * 6.0,
                          "r %d block %lld ch %d: %.9g vs %.9g", r, (long long)(pos / r), ch, pooled[ch], ref[ch]);
    }
    free(kv);
    free(gate);
    free(ape);
    free(state_kv);
    free(state_sc);
}

START_TEST(compressor_overlap_ratio4)
{
    check_pooling(4, 64, 4 * 5 + 3);
}
END_TEST

START_TEST(compressor_ratio128)
{
    check_pooling(128, 32, 128 * 2 + 17);
}
END_TEST

START_TEST(compressor_finish_order)
{
    /* finish = bf16 -> RMSNorm -> RoPE at j*r -> QAT; compose the tested primitives by hand */
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/finish"));
    attn_test_layer L = {0};
    const int dh = 128, rope = 64;
    mmoe_tensor norm = attn_test_bf16_tensor(&L, &rng, dh, 0, 1.0, 0.2);
    float pooled[128], freqs[32], cs[32], sn[32];
    for (int i = 0; i < dh; i++)
        pooled[i] = (float)mmoe_rng_normal(&rng);
    attn_rope_freqs(rope, 160000.0, 1, 16.0, 65536, 32.0, 1.0, freqs);
    for (int kind = 0; kind < 2; kind++) {
        uint16_t got[128], want[128];
        mmoe_test_poison_bf16(got, 128);
        attn_compressor_finish(pooled, dh, &norm, 1e-6f, rope, freqs, 12, (attn_compressor_kind)kind, got);
        mmoe_bf16_from_f32_row(pooled, dh, want);
        mmoe_rmsnorm_bf16(want, 1, dh, &norm, 1e-6f, want);
        attn_rope_cos_sin(freqs, rope / 2, 12, cs, sn);
        attn_rope_rotate_bf16(want + dh - rope, rope, cs, sn, 0);
        if (kind == ATTN_COMPRESSOR_KV) {
            mmoe_roundtrip_fp8_bf16(want, dh - rope, 64);
        } else {
            attn_hadamard_bf16(want, dh);
            mmoe_roundtrip_fp4_bf16(want, dh, 32);
        }
        ck_assert_int_eq(memcmp(got, want, sizeof got), 0);
        if (kind == ATTN_COMPRESSOR_INDEXER) {
            /* every value of an FP4 block is a grid value times one power-of-two scale
               (amax/6 <= scale <= amax, so one of four candidates must fit) */
            static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
            for (int b = 0; b < dh / 32; b++) {
                double amax = 0.0;
                for (int i = 0; i < 32; i++)
                    amax = fmax(amax, fabs(mmoe_bf16_to_f32(got[b * 32 + i])));
                int fits_some = 0;
                for (int e = ilogb(amax) - 3; e <= ilogb(amax) && !fits_some; e++) {
                    int fits = 1;
                    for (int i = 0; i < 32 && fits; i++) {
                        const double q = fabs(mmoe_bf16_to_f32(got[b * 32 + i])) / ldexp(1.0, e);
                        int on = 0;
                        for (int g = 0; g < 8; g++)
                            on |= q == grid[g];
                        fits = on;
                    }
                    fits_some = fits;
                }
                ck_assert_msg(fits_some, "block %d is not on one FP4 grid", b);
            }
        }
    }
    attn_test_layer_free(&L);
}
END_TEST

/* ================================================================ indexer */

START_TEST(indexer_scores_hand_values)
{
    /* 2 heads of width 32: q_0 = e_0, q_1 = e_1, w = (1, 0.5):
       score(K) = bf16(relu(K[0]) * 1 + relu(K[1]) * 0.5) */
    enum { HD = 32 };
    uint16_t qi[2 * HD] = {0}, w[2], keys[4 * HD] = {0};
    qi[0] = mmoe_bf16_from_f32(1.0f);
    qi[HD + 1] = mmoe_bf16_from_f32(1.0f);
    w[0] = mmoe_bf16_from_f32(1.0f);
    w[1] = mmoe_bf16_from_f32(0.5f);
    const float k0[4] = {2.0f, -3.0f, 0.25f, -1.0f}, k1[4] = {4.0f, 8.0f, -2.0f, -1.0f};
    const float want[4] = {4.0f, 4.0f, 0.25f, 0.0f};
    for (int j = 0; j < 4; j++) {
        keys[j * HD] = mmoe_bf16_from_f32(k0[j]);
        keys[j * HD + 1] = mmoe_bf16_from_f32(k1[j]);
    }
    float scores[4];
    mmoe_test_poison_f32(scores, 4);
    attn_indexer_scores(qi, w, keys, 2, HD, 4, scores);
    for (int j = 0; j < 4; j++)
        ck_assert_float_eq(scores[j], want[j]);
    /* the bf16 rounding of the head sum: 1 + 2^-9 is not a bf16 value; RNE gives 1 */
    keys[0] = mmoe_bf16_from_f32(1.0f);
    keys[1] = mmoe_bf16_from_f32(ldexp(1.0, -8)); /* * 0.5 = 2^-9 */
    attn_indexer_scores(qi, w, keys, 2, HD, 1, scores);
    ck_assert_float_eq(scores[0], 1.0f);
}
END_TEST

START_TEST(indexer_scores_match_f64)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/indexer"));
    enum { NH = 4, HD = 64, NB = 37 };
    uint16_t qi[NH * HD], w[NH], keys[NB * HD];
    attn_test_fill_bf16(&rng, qi, NH * HD, 0.0, 1.0);
    attn_test_fill_bf16(&rng, w, NH, 0.0, 0.1);
    attn_test_fill_bf16(&rng, keys, NB * HD, 0.0, 1.0);
    float scores[NB];
    mmoe_test_poison_f32(scores, NB);
    attn_indexer_scores(qi, w, keys, NH, HD, NB, scores);
    for (int j = 0; j < NB; j++) {
        double ref = 0.0, mag = 0.0;
        for (int h = 0; h < NH; h++) {
            double dot = 0.0;
            for (int c = 0; c < HD; c++)
                dot += (double)mmoe_bf16_to_f32(qi[h * HD + c]) * mmoe_bf16_to_f32(keys[j * HD + c]);
            ref += fmax(dot, 0.0) * mmoe_bf16_to_f32(w[h]);
            mag += fabs(dot * mmoe_bf16_to_f32(w[h]));
        }
        /* three bf16 roundings on the way (dot, product, sum): <= 3 * 2^-8 of the magnitudes */
        ck_assert_msg(fabs(scores[j] - ref) <= 3 * ldexp(1.0, -8) * (mag + fabs(ref)), "block %d: %g vs %g",
                      j, scores[j], ref);
        ck_assert_float_eq(scores[j], mmoe_bf16_round(scores[j])); /* scores are bf16 values */
    }
}
END_TEST

/*
 * The scores with every kernel variant that runs here, bit for bit against the definition
 * written here from attn_dot_bf16() (the dot product whose order test_sum_order checks): per
 * block, the heads in ascending order, each term bf16(relu(bf16(dot)) * w[h]) added in double.
 * 150 blocks (two passes of 64 and one of 22), head widths 128 (two nodes of 64 terms) and 32 (no
 * node: the tail alone), five heads, weights of both signs.
 */
START_TEST(indexer_scores_every_kernel)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/indexer_kernels"));
    enum { NH = 5, NB = 150, HDMAX = 128 };
    const int widths[] = {128, 32};
    uint16_t *qi = malloc(2 * NH * HDMAX), w[NH], *keys = malloc(2 * (size_t)(NB * HDMAX));
    float want[NB], got[NB];
    ck_assert(qi && keys);
    int compared = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int HD = widths[wi];
        attn_test_fill_bf16(&rng, qi, NH * HD, 0.0, 1.0);
        attn_test_fill_bf16(&rng, w, NH, 0.0, 0.1);
        attn_test_fill_bf16(&rng, keys, NB * HD, 0.0, 1.0);
        for (int j = 0; j < NB; j++) {
            double head_sum = 0.0;
            for (int h = 0; h < NH; h++) {
                float sc = mmoe_bf16_round((float)attn_dot_bf16(qi + h * HD, keys + j * HD, HD));
                sc = sc < 0.0f ? 0.0f : sc;
                head_sum += (double)mmoe_bf16_round(sc * mmoe_bf16_to_f32(w[h]));
            }
            want[j] = mmoe_bf16_round((float)head_sum);
        }
        for (int isa = 0; isa < MOE_DOT_ISA_COUNT; isa++) {
            if (!moe_dot_isa_runs_here((moe_dot_isa)isa))
                continue;
            mmoe_test_poison_f32(got, NB);
            attn_indexer_scores_isa((moe_dot_isa)isa, qi, w, keys, NH, HD, NB, got);
            for (int j = 0; j < NB; j++)
                ck_assert_msg(memcmp(&got[j], &want[j], sizeof got[j]) == 0, "%s, width %d, block %d: %a, expected %a",
                              moe_dot_isa_name((moe_dot_isa)isa), HD, j, got[j], want[j]);
            compared++;
        }
    }
    ck_assert_int_gt(compared, 0);
    free(qi);
    free(keys);
}
END_TEST

START_TEST(topk_order_ties_and_short_lists)
{
    const float s[8] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, NAN, -1.0f, 2.0f};
    attn_scored work[8];
    int64_t idx[8];
    /* descending; equal scores keep the lower index first; NaN last */
    ck_assert_int_eq(attn_topk_desc(s, 8, 5, work, idx), 5);
    const int64_t want[5] = {1, 2, 4, 3, 7};
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(idx[i], want[i]);
    ck_assert_int_eq(attn_topk_desc(s, 8, 100, work, idx), 8);
    ck_assert_int_eq(idx[6], 6);
    ck_assert_int_eq(idx[7], 5);
    ck_assert_int_eq(attn_topk_desc(s, 0, 3, work, idx), 0);
    /* all-equal scores (all ReLU terms zero): the first k blocks */
    const float z[6] = {0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(attn_topk_desc(z, 6, 3, work, idx), 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(idx[i], i);
}
END_TEST

/* ================================================================ sparse attention */

/** Dense float64 softmax attention with an extra sink logit in the denominator. */
static void oracle_attention(const uint16_t *q, int d, const uint16_t *const *rows, int64_t n, double sink,
                             double *out, double *abs_weighted)
{
    double *s = malloc(sizeof(double) * (size_t)n);
    double m = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        double dot = 0.0;
        for (int c = 0; c < d; c++)
            dot += (double)mmoe_bf16_to_f32(q[c]) * mmoe_bf16_to_f32(rows[t][c]);
        s[t] = dot / sqrt((double)d);
        m = fmax(m, s[t]);
    }
    double den = exp(sink - m);
    for (int64_t t = 0; t < n; t++)
        den += exp(s[t] - m);
    for (int c = 0; c < d; c++) {
        double acc = 0.0, mag = 0.0;
        for (int64_t t = 0; t < n; t++) {
            acc += exp(s[t] - m) * mmoe_bf16_to_f32(rows[t][c]);
            mag += exp(s[t] - m) * fabs(mmoe_bf16_to_f32(rows[t][c]));
        }
        out[c] = acc / den;
        abs_weighted[c] = mag / den;
    }
    free(s);
}

START_TEST(sparse_attention_with_sink)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/sparse"));
    enum { H = 3, D = 64, N = 150 }; /* 150 entries: three online-softmax chunks */
    uint16_t q[H * D], kvbuf[N * D], out[H * D];
    const uint16_t *rows[N];
    attn_test_fill_bf16(&rng, q, H * D, 0.0, 2.0);
    attn_test_fill_bf16(&rng, kvbuf, N * D, 0.0, 1.0);
    for (int t = 0; t < N; t++) /* list order is not position order */
        rows[t] = kvbuf + ((t * 7) % N) * D;
    const float sink[H] = {0.5f, 30.0f, -INFINITY}; /* normal, dominant, absent */
    _Alignas(double) float acc[ATTN_SPARSE_SCRATCH_FLOATS(D)];
    float chunk[ATTN_SPARSE_CHUNK];
    const int64_t lens[3] = {N, 64, 1};
    /* the heads shared out over 3 threads (one head each) give the same bits */
    enum { THREADS = 3 };
    moe_dequant_pool *pool;
    mmoe_error perr;
    ck_assert_msg(moe_dequant_pool_create(THREADS, &pool, &perr) == MMOE_OK, "%s", perr.msg);
    _Alignas(double) float pacc[THREADS * ATTN_SPARSE_SCRATCH_FLOATS(D)];
    float pchunk[THREADS * ATTN_SPARSE_CHUNK];
    uint16_t pout[H * D];
    for (int li = 0; li < 3; li++) {
        mmoe_test_poison_bf16(out, H * D);
        attn_sparse_attention(q, H, D, rows, lens[li], sink, (float)(1.0 / sqrt((double)D)), acc, chunk, out);
        mmoe_test_poison_bf16(pout, H * D);
        attn_sparse_attention_pool(pool, q, H, D, rows, lens[li], sink, (float)(1.0 / sqrt((double)D)), pacc, pchunk,
                                   pout);
        ck_assert_msg(memcmp(out, pout, sizeof out) == 0, "n %lld: the heads on 3 threads differ", (long long)lens[li]);
        for (int h = 0; h < H; h++) {
            double ref[D], mag[D];
            oracle_attention(q + h * D, D, rows, lens[li], sink[h], ref, mag);
            for (int c = 0; c < D; c++) {
                /* P is rounded to bf16 before P.V (2^-8 of each weighted term), the output
                   is rounded to bf16 (2^-8 of it); fp32 softmax arithmetic adds < 2^-16 */
                const double tol = ldexp(1.0, -8) * mag[c] + ldexp(1.0, -8) * fabs(ref[c]) +
                                   ldexp(1.0, -16) * (mag[c] + 1e-30);
                ck_assert_msg(fabs(mmoe_bf16_to_f32(out[h * D + c]) - ref[c]) <= tol,
                              "n %lld head %d ch %d: %g vs %g", (long long)lens[li], h, c,
                              mmoe_bf16_to_f32(out[h * D + c]), ref[c]);
            }
        }
    }
    moe_dequant_pool_release(pool);
}
END_TEST

/*
 * The attention with every kernel variant that runs here gives the generic variant's bits (the
 * scalar definition that the bound above checks): head widths with a partial node of 64 terms
 * (72, 512 + 40) and without one (16: no node at all; 128), lists of 1, 63, 64 and 150 rows, the
 * scores of the five heads spread over about 1, 8, 40, 150 and 400 (so that probabilities fall
 * below fp32's normal range and underflow), and a third of the kv values zero (channels where the row of the largest
 * score adds nothing), on the caller alone and with the heads over 3 threads.
 */
START_TEST(sparse_attention_every_kernel)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/sparse_kernels"));
    enum { H = 5, N = 150, DMAX = 512 + 40, THREADS = 3 };
    const int widths[] = {16, 72, 128, 512 + 40};
    const int64_t lens[] = {1, 63, 64, N};
    uint16_t *q = malloc(2 * (size_t)(H * DMAX)), *kvbuf = malloc(2 * (size_t)(N * DMAX));
    uint16_t *want = malloc(2 * (size_t)(H * DMAX)), *got = malloc(2 * (size_t)(H * DMAX));
    float *acc = malloc(sizeof(float) * (size_t)(THREADS * ATTN_SPARSE_SCRATCH_FLOATS(DMAX)));
    float chunk[THREADS * ATTN_SPARSE_CHUNK];
    const uint16_t *rows[N];
    ck_assert(q && kvbuf && want && got && acc);
    moe_dequant_pool *pool;
    mmoe_error perr;
    ck_assert_msg(moe_dequant_pool_create(THREADS, &pool, &perr) == MMOE_OK, "%s", perr.msg);
    const float sink[H] = {0.5f, 30.0f, -INFINITY, -3.0f, 1.0f};
    int compared = 0;
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int D = widths[wi];
        for (int h = 0; h < H; h++) /* score spreads of about 1, 8, 40, 150 and 400 */
            attn_test_fill_bf16(&rng, q + h * D, D, 0.0, (const double[H]){1.2, 10, 50, 180, 480}[h]);
        attn_test_fill_bf16(&rng, kvbuf, N * D, 0.0, 1.0);
        for (int i = 0; i < N * D; i++)
            if (mmoe_rng_below(&rng, 3) == 0)
                kvbuf[i] = 0;
        for (int t = 0; t < N; t++)
            rows[t] = kvbuf + (size_t)(((t * 7) % N) * D);
        const float scale = (float)(1.0 / sqrt((double)D));
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            mmoe_test_poison_bf16(want, H * D);
            attn_sparse_attention_isa(NULL, MOE_DOT_ISA_GENERIC, q, H, D, rows, lens[li], sink, scale, acc, chunk,
                                      want);
            for (int run = 0; run < 2 * MOE_DOT_ISA_COUNT; run++) {
                const moe_dot_isa isa = (moe_dot_isa)(run / 2);
                if (!moe_dot_isa_runs_here(isa))
                    continue;
                mmoe_test_poison_bf16(got, H * D);
                attn_sparse_attention_isa(run % 2 ? pool : NULL, isa, q, H, D, rows, lens[li], sink, scale, acc,
                                          chunk, got);
                for (int i = 0; i < H * D; i++)
                    ck_assert_msg(got[i] == want[i], "%s, %s, d %d, %lld rows: head %d channel %d: %04x, expected %04x",
                                  moe_dot_isa_name(isa), run % 2 ? "3 threads" : "one thread", D,
                                  (long long)lens[li], i / D, i % D, got[i], want[i]);
                compared++;
            }
        }
    }
    ck_assert_int_gt(compared, 0);
    moe_dequant_pool_release(pool);
    free(q);
    free(kvbuf);
    free(want);
    free(got);
    free(acc);
}
END_TEST

/* ================================================================ output projection */

START_TEST(output_projection_groups)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("attn_blocks/out_proj"));
    mmoe_attn_params p;
    attn_test_params_tiny(&p, 0);
    attn_test_layer L8, L16;
    attn_test_layer_make(&L8, &p, &rng, 1); /* wo_a as published: F8 + scale */
    /* the same layer with wo_a converted to bf16 as convert.py does */
    L16 = L8;
    L16.n_bufs = 0;
    const int64_t T = 3, G = p.o_groups, R = p.o_lora_rank, HD = (int64_t)p.n_heads * p.head_dim;
    const int64_t GW = HD / G;
    uint16_t *wo_a16 = malloc(sizeof(uint16_t) * (size_t)(G * R * GW));
    const uint8_t *w8 = L8.w.wo_a.data, *s8 = L8.w.wo_a_scale.data;
    const int64_t sc = L8.w.wo_a_scale.shape[1];
    for (int64_t n = 0; n < G * R; n++)
        for (int64_t k = 0; k < GW; k++)
            wo_a16[n * GW + k] = mmoe_bf16_from_f32(mmoe_fp8_e4m3_to_f32(w8[n * GW + k]) *
                                                    ldexpf(1.0f, (int)s8[(n / 128) * sc + k / 128] - 127));
    L16.w.wo_a.dtype = MMOE_DT_BF16;
    L16.w.wo_a.data = wo_a16;
    memset(&L16.w.wo_a_scale, 0, sizeof L16.w.wo_a_scale);

    uint16_t *o = malloc(sizeof(uint16_t) * (size_t)(T * HD));
    uint16_t *z8 = malloc(sizeof(uint16_t) * (size_t)(T * G * R)), *z16 = malloc(sizeof(uint16_t) * (size_t)(T * G * R));
    uint16_t *out8 = malloc(sizeof(uint16_t) * (size_t)(T * p.dim)), *out16 = malloc(sizeof(uint16_t) * (size_t)(T * p.dim));
    uint16_t *want = malloc(sizeof(uint16_t) * (size_t)(T * p.dim));
    attn_test_fill_bf16(&rng, o, T * HD, 0.0, 1.0);
    mmoe_test_poison_bf16(z8, (size_t)(T * G * R));
    mmoe_test_poison_bf16(out8, (size_t)(T * p.dim));
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(attn_out_proj(NULL, &p, &L8.w, o, T, z8, out8, &err), MMOE_OK);
    ck_assert_int_eq(attn_out_proj(NULL, &p, &L16.w, o, T, z16, out16, &err), MMOE_OK);
    /* F8 wo_a dequantized on use == the convert.py bf16 wo_a, bit for bit */
    ck_assert_int_eq(memcmp(z8, z16, sizeof(uint16_t) * (size_t)(T * G * R)), 0);
    ck_assert_int_eq(memcmp(out8, out16, sizeof(uint16_t) * (size_t)(T * p.dim)), 0);
    /* z[t, g*R + r] = sum over the heads of group g only (float64, one bf16 rounding) */
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < G; g++)
            for (int64_t r = 0; r < R; r++) {
                double ref = 0.0;
                for (int64_t c = 0; c < GW; c++)
                    ref += (double)mmoe_bf16_to_f32(o[t * HD + g * GW + c]) *
                           mmoe_bf16_to_f32(wo_a16[(g * R + r) * GW + c]);
                const uint16_t got = z16[t * G * R + g * R + r];
                ck_assert_msg(got == mmoe_bf16_from_f32((float)ref) ||
                                  fabs(mmoe_bf16_to_f32(got) - ref) <= ldexp(fabs(ref), -8),
                              "z[%lld,%lld,%lld]", (long long)t, (long long)g, (long long)r);
            }
    /* out = wo_b(z): the tested FP8 linear applied to z */
    ck_assert_int_eq(mmoe_linear_fp8(z16, T, &L8.w.wo_b, &L8.w.wo_b_scale, 128, want, &err), MMOE_OK);
    ck_assert_int_eq(memcmp(out16, want, sizeof(uint16_t) * (size_t)(T * p.dim)), 0);
    free(o);
    free(z8);
    free(z16);
    free(out8);
    free(out16);
    free(want);
    free(wo_a16);
    attn_test_layer_free(&L8);
}
END_TEST

static Suite *attn_blocks_suite(void)
{
    Suite *s = suite_create("attn_blocks");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, compressor_overlap_ratio4);
    tcase_add_test(tc, compressor_ratio128);
    tcase_add_test(tc, compressor_finish_order);
    tcase_add_test(tc, indexer_scores_hand_values);
    tcase_add_test(tc, indexer_scores_match_f64);
    tcase_add_test(tc, indexer_scores_every_kernel);
    tcase_add_test(tc, topk_order_ties_and_short_lists);
    tcase_add_test(tc, sparse_attention_with_sink);
    tcase_add_test(tc, sparse_attention_every_kernel);
    tcase_add_test(tc, output_projection_groups);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(attn_blocks_suite());
}
