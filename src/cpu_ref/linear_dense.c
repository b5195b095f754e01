/**
 * @file linear_dense.c
 * @brief Linear layers with BF16 or FP32 weights: a fixed-order, double-accumulated dot product.
 *
 * The reference runs these as plain matmuls (`F.linear`) with fp32 accumulation:
 * the compressors' wkv/wgate (held in fp32, values from bf16), the indexer's
 * weights_proj (bf16) and the wo_a einsum of the output projection (bf16, from
 * convert.py's exact FP8 dequantization).  The accumulation order of a GEMM is not
 * specified, so the oracle picks the most accurate deterministic one: every product
 * of two bf16 values is exact in double (16 significant bits; 32 for a bf16 input
 * times an fp32 weight), the products are summed in double in the order of
 * @ref spec_arch_sum_order (chunks of 16, then a pairwise tree: a GPU sums them in
 * parallel to the same bits), and the sum is rounded once to fp32.  The error against
 * the exact dot product is below K * 2^-53 relative to sum |x_k w_k| before the final
 * fp32 rounding, i.e. within any fp32-accumulated result's error bound, and an output
 * row depends only on its input row (prefill and decode agree bit for bit).
 *
 * Weight rows are converted to double once per call and reused for all T rows.
 * An F8_E4M3 weight (the published, unconverted wo_a) is dequantized with its E8M0 (or
 * FP32) scales and rounded to bf16 -- exactly what convert.py stores; the 256 possible
 * values under each distinct scale of the rows a call reads are computed once
 * (f8_values_build(), the same fp32 product and rounding as mmoe_dequant_row_fp8()) and the
 * codes looked up, or, where an E8M0 scale keeps every product a normal fp32 number (then the
 * bf16 rounding cannot act), decoded in AVX2 registers (load_f8_rows4_avx2()).  BF16 and F32
 * rows are widened eight columns at a time (load_plain_rows4_avx2()).
 *
 * The scalar dot_f64() is the definition; on a CPU with AVX2 the kernel takes four weight
 * rows at once, one per lane of a double vector (dot4_f64_avx2(): the rows interleaved as
 * they are converted), every lane performing dot_f64()'s multiplications and additions in
 * dot_f64()'s order, so that the bits are the same (tests/test_sum_order.c checks both
 * against the order written from its definition).  Each product is exact for the callers'
 * operands (bf16 or fp32 values against bf16 or fp32 weights), so a multiplication and its
 * addition fused into one step (the vector kernels' FMA, or a compiler's contraction) round
 * the same sum once and change no bit.  Calls of four x rows or more (prefill) take eight
 * weight rows against four x rows per pass (dot8x4_f64_avx2()), so that each loaded value
 * serves several products, and the tree's merges run on four lanes at once (pairwise4).  Calls
 * of one x row (decode) of a BF16 or F32 weight, or of an F8 one with E8M0 scales, take the
 * chunk-lane kernel instead (dense_rows4_chunks_avx2()): a register holds the four chains of one
 * row's node, so the weights go straight into the sums, with nothing written to memory.  The
 * same kernel sums the attention's scores (attn_dot_rows_bf16(): one query head against BF16 kv
 * rows given by their addresses).  On a CPU with AVX-512, calls of four x rows or more take
 * sixteen weight rows a pass, eight in the lanes of a 512-bit double vector
 * (dense_rows_avx512()).
 *
 * The weight rows of a call are shared out over a worker pool (moe_pool_rows(), the model's
 * pool of the MoE layers): each output is one row's dot products, computed by the same code
 * whatever thread takes the row, with per-thread row buffers.
 */
#include "attn_internal.h"

#include <stdlib.h>
#include <string.h>

#include "cpu_avx512.h"
#include "fmt_minifloat.h"
#include "mmoe_formats.h"
#include "mmoe_sum_order.h"
#include "moe_internal.h"

float attn_tensor_f32_at(const mmoe_tensor *t, int64_t i)
{
    if (t->dtype == MMOE_DT_F32)
        return ((const float *)t->data)[i];
    return fmt_bf16_to_f32(((const uint16_t *)t->data)[i]);
}

/** Weight rows the vector kernel sums at once: one per lane of a double vector. */
#define DENSE_LANES 4

/** Terms of one aligned node of four chunks (the kernels' step along K). */
#define DENSE_NODE MMOE_SUM_NODE4

/** Weight rows (two groups of ::DENSE_LANES) and x rows of one pass of dot8x4_f64_avx2(). */
#define DENSE_BLOCK_ROWS (2 * DENSE_LANES)
/** See ::DENSE_BLOCK_ROWS. */
#define DENSE_BLOCK_TOKENS 4

/**
 * Weight rows of one pass of dense_rows_avx512(): two groups of eight, one per lane of a 512-bit
 * double vector; also the rows a thread's buffer holds interleaved.
 */
#define DENSE_BLOCK_ROWS_512 16

/**
 * The bf16 values of an F8 weight's codes: for each distinct scale s among the K blocks of the
 * rows a call reads, value[j * 256 + c] = (double)bf16(e4m3(c) * s_j), the fp32 product and
 * rounding that mmoe_dequant_row_fp8() and convert.py perform per element, here once per code
 * and scale; table[(rb - rb0) * nkb + kb] is the j of row block rb's K block kb.  Built by the
 * caller before the rows are shared out, read by every thread.
 */
typedef struct {
    double *value;   /**< [distinct scales][256] */
    int32_t *table;  /**< [row blocks read][nkb]: the scale's index in value */
    int64_t rb0;     /**< the first row block read */
    int64_t nkb;     /**< K blocks of a row */
    int block;       /**< the block edge */
} f8_values;

/** The scale of row block @p rb, K block @p kb (E8M0 or F32). */
static float f8_scale_at(const mmoe_tensor *scale, int64_t rb, int64_t kb, int64_t nkb)
{
    const int64_t i = rb * nkb + kb;
    return scale->dtype == MMOE_DT_F32 ? ((const float *)scale->data)[i]
                                       : fmt_ue8m0_to_f32(((const uint8_t *)scale->data)[i]);
}

/** Fill @p v for rows row0 .. row0 + N - 1 of an F8 weight [*, K] (scale [*, ceil(K / block)]). */
static mmoe_status f8_values_build(f8_values *v, const mmoe_tensor *scale, int block, int64_t row0, int64_t N,
                                   int64_t K, mmoe_error *err)
{
    if (scale == NULL || scale->data == NULL)
        return mmoe_error_set(err, MMOE_ENOTFOUND, "dense linear: F8 weight without a scale");
    if (scale->dtype != MMOE_DT_F8_E8M0 && scale->dtype != MMOE_DT_F32)
        return mmoe_error_set(err, MMOE_EDTYPE, "dense linear: F8 weight scale dtype %s, expected F8_E8M0 or F32",
                              mmoe_dtype_name(scale->dtype));
    v->block = block;
    v->nkb = (K + block - 1) / block;
    v->rb0 = row0 / block;
    const int64_t n_entries = ((row0 + N - 1) / block - v->rb0 + 1) * v->nkb;
    v->table = malloc(sizeof(int32_t) * (size_t)n_entries);
    float *distinct = malloc(sizeof(float) * (size_t)n_entries);
    if (v->table == NULL || distinct == NULL) {
        free(distinct);
        return mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (%lld scale blocks)",
                              (long long)n_entries);
    }
    int32_t n_distinct = 0;
    for (int64_t e = 0; e < n_entries; e++) {
        const float s = f8_scale_at(scale, v->rb0 + e / v->nkb, e % v->nkb, v->nkb);
        int32_t j = 0;
        while (j < n_distinct && memcmp(&distinct[j], &s, sizeof s) != 0)
            j++;
        if (j == n_distinct)
            distinct[n_distinct++] = s;
        v->table[e] = j;
    }
    v->value = malloc(sizeof(double) * 256 * (size_t)n_distinct);
    if (v->value == NULL) {
        free(distinct);
        return mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (%d scale tables)", (int)n_distinct);
    }
    const float *e4m3 = mmoe_fp8_e4m3_table();
    for (int32_t j = 0; j < n_distinct; j++)
        for (int c = 0; c < 256; c++)
            v->value[j * 256 + c] = (double)mmoe_bf16_round(e4m3[c] * distinct[j]);
    free(distinct);
    return MMOE_OK;
}

/** Row @p row's K block @p kb (its codes k0 .. k1 - 1 of @p codes) looked up in @p v, into out[k * stride]. */
static void f8_lookup_block(const f8_values *v, const uint8_t *codes, int64_t row, int64_t kb, int64_t k0, int64_t k1,
                            double *out, int64_t stride)
{
    const double *val = v->value + (int64_t)v->table[(row / v->block - v->rb0) * v->nkb + kb] * 256;
    for (int64_t k = k0; k < k1; k++)
        out[k * stride] = val[codes[k]];
}

/**
 * Load columns k0 .. k1 - 1 of weight row @p row (K values a row) as doubles into out[k * stride]:
 * BF16 through fp32 (@p tmp, K floats) and F32 widened, F8 looked up in @p v.
 */
static void load_cols(const mmoe_tensor *w, const f8_values *v, int64_t row, int64_t K, int64_t k0, int64_t k1,
                      float *tmp, double *out, int64_t stride)
{
    switch (w->dtype) {
    case MMOE_DT_BF16: {
        mmoe_bf16_to_f32_row((const uint16_t *)w->data + row * K + k0, (size_t)(k1 - k0), tmp + k0);
        for (int64_t k = k0; k < k1; k++)
            out[k * stride] = (double)tmp[k];
        return;
    }
    case MMOE_DT_F32: {
        const float *r = (const float *)w->data + row * K;
        for (int64_t k = k0; k < k1; k++)
            out[k * stride] = (double)r[k];
        return;
    }
    default: { /* F8_E4M3 (attn_dense_sums() admits no other) */
        const uint8_t *r = (const uint8_t *)w->data + row * K;
        for (int64_t k = k0; k < k1;) {
            const int64_t kb = k / v->block, end = (kb + 1) * v->block < k1 ? (kb + 1) * v->block : k1;
            f8_lookup_block(v, r, row, kb, k, end, out, stride);
            k = end;
        }
        return;
    }
    }
}

/** Load weight row @p row whole (load_cols()). */
static void load_row(const mmoe_tensor *w, const f8_values *v, int64_t row, int64_t K, float *tmp, double *out,
                     int64_t stride)
{
    load_cols(w, v, row, K, 0, K, tmp, out, stride);
}

/** The chunks of k0 .. K - 1 that do not fill a node, each pushed onto @p pw (b[k * stride]). */
static void dot_f64_tail(const double *a, const double *b, int64_t stride, int64_t k0, int64_t K, mmoe_pairwise *pw)
{
    for (; k0 < K; k0 += MMOE_SUM_CHUNK) {
        const int64_t k1 = K - k0 < MMOE_SUM_CHUNK ? K : k0 + MMOE_SUM_CHUNK;
        double c = 0.0;
        for (int64_t k = k0; k < k1; k++)
            c += a[k] * b[k * stride];
        mmoe_pairwise_push(pw, c);
    }
}

/**
 * dot_f64_tail() for an F32 row against a BF16 x (attn_dot_f32_rows()): the chunks of k0 .. K - 1,
 * each the products row[k] * x[k] in double from +0, pushed onto @p pw.
 */
static void dot_f32_bf16_tail(const float *row, const uint16_t *x, int64_t k0, int64_t K, mmoe_pairwise *pw)
{
    for (; k0 < K; k0 += MMOE_SUM_CHUNK) {
        const int64_t k1 = K - k0 < MMOE_SUM_CHUNK ? K : k0 + MMOE_SUM_CHUNK;
        double c = 0.0;
        for (int64_t k = k0; k < k1; k++)
            c += (double)row[k] * (double)fmt_bf16_to_f32(x[k]);
        mmoe_pairwise_push(pw, c);
    }
}

/**
 * The double dot product of the file comment: chunks of 16 products, four chunks at a time
 * (four independent chains for the CPU's pipelines; each chunk still ascending from +0; k0 a
 * multiple of 64, so the four form a node of the tree), the chunk sums folded by the pairwise
 * tree of mmoe_sum_order.h.  The scalar definition that the vector kernel reproduces.
 */
static double dot_f64(const double *a, const double *b, int64_t K)
{
    mmoe_pairwise pw;
    mmoe_pairwise_init(&pw);
    int64_t k0 = 0;
    for (; k0 + DENSE_NODE <= K; k0 += DENSE_NODE)
        mmoe_pairwise_push_node(&pw, mmoe_sum_node4_f64(a + k0, b + k0), 2); /* an aligned run of four chunks */
    dot_f64_tail(a, b, 1, k0, K, &pw);
    return mmoe_pairwise_result(&pw);
}

/** One call's operands, shared by the threads that take its rows (attn_dense_sums()). */
typedef struct {
    moe_dot_isa isa;      /**< the kernels */
    const double *x;      /**< [T, ldx] */
    int64_t T;            /**< rows of x */
    int64_t ldx;          /**< their stride */
    int64_t K;            /**< the width */
    const mmoe_tensor *w; /**< the weight */
    const f8_values *v;   /**< an F8 weight's values */
    const mmoe_tensor *scale; /**< an F8 weight's scales */
    int64_t row0;         /**< the first weight row */
    double *y;            /**< [T, ldy] */
    int64_t ldy;          /**< its stride */
    double *wbuf;         /**< per thread: DENSE_BLOCK_ROWS_512 * K doubles */
    float *tmp;           /**< per thread: K floats (a BF16 row in fp32) */
    double *xp;           /**< one-row calls of the chunk-lane kernel: x in chunk-lane order, else NULL */
    unsigned char *trees; /**< AVX-512 calls of four x rows or more, per thread: dense_trees_bytes(), else NULL */
} dense_job;

/** Bytes of one thread's trees in dense_rows_avx512() (0 where the build has no x86 kernels). */
static size_t dense_trees_bytes(void);

/** Weight rows [n0, n1) of the call, one at a time, each against every x row (the definition). */
static void dense_rows_generic(const dense_job *j, float *tmp, double *wrow, int64_t n0, int64_t n1)
{
    for (int64_t n = n0; n < n1; n++) {
        load_row(j->w, j->v, j->row0 + n, j->K, tmp, wrow, 1);
        for (int64_t i = 0; i < j->T; i++)
            j->y[i * j->ldy + n] = dot_f64(j->x + i * j->ldx, wrow, j->K);
    }
}

void attn_dot_chunk_x(const double *x, int64_t K, double *xp)
{
    for (int64_t n = 0; n + DENSE_NODE <= K; n += DENSE_NODE)
        for (int i = 0; i < MMOE_SUM_CHUNK; i++)
            for (int q = 0; q < 4; q++)
                xp[n + 4 * i + q] = x[n + q * MMOE_SUM_CHUNK + i];
}

#if MMOE_CPU_HAVE_X86
/**
 * Four pairwise sums of the same shape in progress, one per lane (the four weight rows of a
 * vector kernel, whose sums have the same number of chunks): mmoe_pairwise_push_node()'s binary
 * counter with vectors for subtree sums, so that one merge step adds four lanes.
 */
typedef struct {
    __m256d s[MMOE_SUM_LEVELS]; /**< subtree sums, one per lane, levels strictly decreasing */
    int lvl[MMOE_SUM_LEVELS];   /**< their levels, common to the lanes */
    int n;                      /**< subtrees held */
} pairwise4;

/** mmoe_pairwise_push_node() in every lane of @p p. */
MMOE_AVX2 static inline __attribute__((always_inline)) void pairwise4_push_node(pairwise4 *p, __m256d c, int level)
{
    while (p->n > 0 && p->lvl[p->n - 1] == level) {
        c = _mm256_add_pd(p->s[p->n - 1], c);
        p->n--;
        level++;
    }
    p->s[p->n] = c;
    p->lvl[p->n] = level;
    p->n++;
}

/**
 * The four sums of a vector kernel into out[0..3]: @p p's subtrees, then the chunks of columns
 * k0 .. K - 1 that do not fill a node (x row @p a times wq[k * 4 + r] in lane r; each chunk from
 * +0 in ascending k, as dot_f64_tail() sums it), folded from the right as mmoe_pairwise_result()
 * folds them, in every lane at once.
 */
MMOE_AVX2 static void pairwise4_finish(pairwise4 *p, const double *a, const double *wq, int64_t k0, int64_t K,
                                       double *out)
{
    for (; k0 < K; k0 += MMOE_SUM_CHUNK) {
        const int64_t k1 = K - k0 < MMOE_SUM_CHUNK ? K : k0 + MMOE_SUM_CHUNK;
        __m256d c = _mm256_setzero_pd();
        for (int64_t k = k0; k < k1; k++)
            c = _mm256_fmadd_pd(_mm256_broadcast_sd(a + k), _mm256_loadu_pd(wq + k * DENSE_LANES), c);
        pairwise4_push_node(p, c, 0);
    }
    __m256d r = _mm256_setzero_pd();
    if (p->n > 0) {
        r = p->s[p->n - 1];
        for (int i = p->n - 2; i >= 0; i--)
            r = _mm256_add_pd(p->s[i], r);
    }
    _mm256_storeu_pd(out, r);
}

/** x rows that one pass of dot4_f64_avx2() takes at once (each loaded weight vector serves them all). */
#define DENSE_TOKENS 3

/**
 * Four weight rows against @p rt x rows at once, lane r of every vector holding weight row r (@p wq
 * interleaved: wq[k * 4 + r]), x row t at a + t * lda, its four sums at out + t * ldo: per lane and
 * x row exactly dot_f64()'s operations (the four chunks of a node as four vector chains, each
 * product then its addition, the node as (c0 + c1) + (c2 + c3)), so that each lane gives dot_f64()'s
 * bits for its pair of rows.  The product then its addition is one fused multiply-add here: every
 * product of the callers' operands is exact in double (the file comment), so the fused step rounds
 * the same sum once, as the two steps do.  Always inlined with a constant @p rt, so that the
 * 4 x rt accumulators live in registers.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void dot4_f64_avx2(int rt, const double *a, int64_t lda,
                                                                          const double *wq, int64_t K, double *out,
                                                                          int64_t ldo)
{
    pairwise4 pw[DENSE_TOKENS];
    _Pragma("GCC unroll 4")
    for (int t = 0; t < rt; t++)
        pw[t].n = 0;
    int64_t k0 = 0;
    for (; k0 + DENSE_NODE <= K; k0 += DENSE_NODE) {
        const double *a0 = a + k0, *w0 = wq + k0 * DENSE_LANES;
        __m256d c[DENSE_TOKENS][4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < rt; t++)
            _Pragma("GCC unroll 4")
            for (int q = 0; q < 4; q++)
                c[t][q] = _mm256_setzero_pd();
        for (int i = 0; i < MMOE_SUM_CHUNK; i++)
            _Pragma("GCC unroll 4")
            for (int q = 0; q < 4; q++) {
                const int64_t k = q * MMOE_SUM_CHUNK + i;
                const __m256d wv = _mm256_loadu_pd(w0 + k * DENSE_LANES);
                _Pragma("GCC unroll 4")
                for (int t = 0; t < rt; t++)
                    c[t][q] = _mm256_fmadd_pd(_mm256_broadcast_sd(a0 + t * lda + k), wv, c[t][q]);
            }
        _Pragma("GCC unroll 4")
        for (int t = 0; t < rt; t++)
            pairwise4_push_node(&pw[t], _mm256_add_pd(_mm256_add_pd(c[t][0], c[t][1]), _mm256_add_pd(c[t][2], c[t][3])),
                                2);
    }
    _Pragma("GCC unroll 4")
    for (int t = 0; t < rt; t++)
        pairwise4_finish(&pw[t], a + t * lda, wq, k0, K, out + t * ldo);
}

/**
 * Eight weight rows (two groups of four, each interleaved as dot4_f64_avx2() takes them: group g at
 * wq + g * 4 * K) against four x rows: the same operations per lane and x row as dot4_f64_avx2(),
 * in another arrangement.  There each x row's four chunks of a node run as four chains at once;
 * here the chunks of a node run one after the other, each as eight chains (two weight vectors x
 * four x rows), so that a loaded weight vector serves four x rows and a broadcast x value two
 * weight vectors (six loads for eight fused multiply-adds, against sixteen for twelve); a chunk's
 * sum is kept until its node's four are complete, then combined as (c0 + c1) + (c2 + c3).
 * Calls with fewer x rows (decode's one) keep dot4_f64_avx2(), whose four chains per x row hide
 * the adder's latency.
 */
MMOE_AVX2 static void dot8x4_f64_avx2(const double *a, int64_t lda, const double *wq, int64_t K, double *out,
                                      int64_t ldo)
{
    enum { G = DENSE_BLOCK_ROWS / DENSE_LANES, RT = DENSE_BLOCK_TOKENS };
    pairwise4 pw[RT][G];
    for (int t = 0; t < RT; t++)
        for (int g = 0; g < G; g++)
            pw[t][g].n = 0;
    int64_t k0 = 0;
    for (; k0 + DENSE_NODE <= K; k0 += DENSE_NODE) {
        __m256d chunk[4][RT][G];
        for (int q = 0; q < 4; q++) {
            const int64_t kq = k0 + q * MMOE_SUM_CHUNK;
            __m256d c[RT][G];
            _Pragma("GCC unroll 4")
            for (int t = 0; t < RT; t++)
                _Pragma("GCC unroll 2")
                for (int g = 0; g < G; g++)
                    c[t][g] = _mm256_setzero_pd();
            for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
                __m256d wv[G];
                _Pragma("GCC unroll 2")
                for (int g = 0; g < G; g++)
                    wv[g] = _mm256_loadu_pd(wq + g * DENSE_LANES * K + (kq + i) * DENSE_LANES);
                _Pragma("GCC unroll 4")
                for (int t = 0; t < RT; t++) {
                    const __m256d av = _mm256_broadcast_sd(a + t * lda + kq + i);
                    _Pragma("GCC unroll 2")
                    for (int g = 0; g < G; g++)
                        c[t][g] = _mm256_fmadd_pd(av, wv[g], c[t][g]);
                }
            }
            _Pragma("GCC unroll 4")
            for (int t = 0; t < RT; t++)
                _Pragma("GCC unroll 2")
                for (int g = 0; g < G; g++)
                    chunk[q][t][g] = c[t][g];
        }
        for (int t = 0; t < RT; t++)
            for (int g = 0; g < G; g++)
                pairwise4_push_node(&pw[t][g], _mm256_add_pd(_mm256_add_pd(chunk[0][t][g], chunk[1][t][g]),
                                                             _mm256_add_pd(chunk[2][t][g], chunk[3][t][g])), 2);
    }
    for (int t = 0; t < RT; t++)
        for (int g = 0; g < G; g++)
            pairwise4_finish(&pw[t][g], a + t * lda, wq + g * DENSE_LANES * K, k0, K, out + t * ldo + g * DENSE_LANES);
}

/**
 * E8M0 scale bytes whose products with every E4M3 value are normal fp32 numbers (2^-9 * 2^(b - 127)
 * >= 2^-126 and 448 * 2^(b - 127) below the fp32 maximum): for them e4m3(c) * s is exact in fp32
 * and, with at most 4 significant bits, its bf16 rounding changes nothing, so the table's value
 * is the decoded code times the scale.
 */
#define F8_EXACT_MIN_BYTE 10
/** The largest such byte (see ::F8_EXACT_MIN_BYTE). */
#define F8_EXACT_MAX_BYTE 246

/**
 * Eight columns of four rows (@p r0 .. @p r3) transposed within each 128-bit half: g[i] holds
 * column i of the four rows in its low half and column i + 4 in its high half.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void transpose_rows4_avx2(__m256 r0, __m256 r1, __m256 r2,
                                                                                 __m256 r3, __m256 g[4])
{
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    g[0] = _mm256_shuffle_ps(t0, t2, 0x44);
    g[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    g[2] = _mm256_shuffle_ps(t1, t3, 0x44);
    g[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}

/**
 * Eight columns of four weight rows (@p r0 .. @p r3, FP32 values) into out[i * stride + r], i = 0
 * .. 7, as doubles: transposed (transpose_rows4_avx2()), then widened.  @p stride is the
 * interleave's row count: 4 (the AVX2 kernels), or 8 (the AVX-512 kernel, two calls filling
 * rows 0 .. 3 and 4 .. 7).
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void store_rows4_avx2(__m256 r0, __m256 r1, __m256 r2,
                                                                             __m256 r3, double *out, int64_t stride)
{
    __m256 g[4];
    transpose_rows4_avx2(r0, r1, r2, r3, g);
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_pd(out + i * stride, _mm256_cvtps_pd(_mm256_castps256_ps128(g[i])));
        _mm256_storeu_pd(out + (i + 4) * stride, _mm256_cvtps_pd(_mm256_extractf128_ps(g[i], 1)));
    }
}

/**
 * Four consecutive rows of a BF16 or F32 weight into wq[k * stride + r]: eight columns of each row
 * at a time, transposed and widened (store_rows4_avx2()); the last K mod 8 columns one by one.  The
 * values of load_row().
 */
MMOE_AVX2 static void load_plain_rows4_avx2(const dense_job *j, int64_t row, double *wq, int64_t stride)
{
    const int64_t K = j->K, kv = K - K % 8;
    if (j->w->dtype == MMOE_DT_BF16) {
        const uint16_t *h = (const uint16_t *)j->w->data + row * K;
        for (int64_t k = 0; k < kv; k += 8)
            store_rows4_avx2(mmoe_bf16x8_avx2(h + k), mmoe_bf16x8_avx2(h + K + k),
                             mmoe_bf16x8_avx2(h + 2 * K + k), mmoe_bf16x8_avx2(h + 3 * K + k), wq + k * stride,
                             stride);
    } else {
        const float *f = (const float *)j->w->data + row * K;
        for (int64_t k = 0; k < kv; k += 8)
            store_rows4_avx2(_mm256_loadu_ps(f + k), _mm256_loadu_ps(f + K + k), _mm256_loadu_ps(f + 2 * K + k),
                             _mm256_loadu_ps(f + 3 * K + k), wq + k * stride, stride);
    }
    for (int64_t k = kv; k < K; k++)
        for (int r = 0; r < DENSE_LANES; r++)
            wq[k * stride + r] = (double)attn_tensor_f32_at(j->w, (row + r) * K + k);
}

/**
 * Four consecutive rows of an F8 weight with E8M0 scales into wq[k * stride + r], K block by K block:
 * where the four rows' scale bytes of the block are all within ::F8_EXACT_MIN_BYTE ..
 * ::F8_EXACT_MAX_BYTE and the block a multiple of 8 wide, eight codes of each row decoded in
 * registers (mmoe_e4m3_codes_avx2()) and multiplied by its scale, the 4 x 8 values transposed
 * into eight groups of four and widened; elsewhere the table's values (the same numbers).
 */
MMOE_AVX2 static void load_f8_rows4_avx2(const dense_job *j, int64_t row, double *wq, int64_t stride)
{
    const int64_t K = j->K, nkb = j->v->nkb;
    const int block = j->v->block;
    const float *e4m3 = mmoe_fp8_e4m3_table();
    const __m256 nan_pos = _mm256_set1_ps(e4m3[0x7F]), nan_neg = _mm256_set1_ps(e4m3[0xFF]);
    const uint8_t *codes = (const uint8_t *)j->w->data + row * K;
    const uint8_t *sb = (const uint8_t *)j->scale->data;
    for (int64_t k0 = 0, kb = 0; k0 < K; k0 += block, kb++) {
        const int64_t k1 = K - k0 < block ? K : k0 + block;
        int exact = block % 8 == 0 && (k1 - k0) % 8 == 0;
        uint8_t b[DENSE_LANES];
        for (int r = 0; r < DENSE_LANES; r++) {
            b[r] = sb[((row + r) / block) * nkb + kb];
            exact = exact && b[r] >= F8_EXACT_MIN_BYTE && b[r] <= F8_EXACT_MAX_BYTE;
        }
        if (!exact) {
            for (int r = 0; r < DENSE_LANES; r++)
                f8_lookup_block(j->v, codes + r * K, row + r, kb, k0, k1, wq + r, stride);
            continue;
        }
        const __m256 s0 = _mm256_set1_ps(fmt_ue8m0_to_f32(b[0])), s1 = _mm256_set1_ps(fmt_ue8m0_to_f32(b[1]));
        const __m256 s2 = _mm256_set1_ps(fmt_ue8m0_to_f32(b[2])), s3 = _mm256_set1_ps(fmt_ue8m0_to_f32(b[3]));
        for (int64_t k = k0; k < k1; k += 8) {
            const __m256 r0 = _mm256_mul_ps(mmoe_e4m3_codes_avx2(codes + k, nan_pos, nan_neg), s0);
            const __m256 r1 = _mm256_mul_ps(mmoe_e4m3_codes_avx2(codes + K + k, nan_pos, nan_neg), s1);
            const __m256 r2 = _mm256_mul_ps(mmoe_e4m3_codes_avx2(codes + 2 * K + k, nan_pos, nan_neg), s2);
            const __m256 r3 = _mm256_mul_ps(mmoe_e4m3_codes_avx2(codes + 3 * K + k, nan_pos, nan_neg), s3);
            store_rows4_avx2(r0, r1, r2, r3, wq + k * stride, stride);
        }
    }
}

/*
 * The chunk-lane kernel (one x row; BF16 or F32 weights, or F8 ones with E8M0 scales in blocks
 * of a multiple of 64).
 *
 * dot_f64() sums a node of 64 terms as four chains, chunk q taking terms 16q .. 16q + 15 in
 * ascending order, then (c0 + c1) + (c2 + c3).  Here the four chains of one weight row are the
 * four lanes of a register: step i adds term 16q + i to lane q, so a step needs the values
 * 16q + i of the four chunks side by side (two rounds of byte unpacks give them for an F8 node's
 * 64 codes, transpose_rows4_avx2() for BF16 and F32 values), and x in the same order, which is
 * permuted once per call (attn_dot_chunk_x()).  No weight is written to memory, and no rows are
 * transposed into an interleave; four weight rows are summed at once so that four independent
 * chains hide the adder's latency.  An F8 code is decoded through FP16
 * (mmoe_e4m3x8_x256th_avx2(): its E4M3 value times 2^-8) and multiplied by its scale times 2^8:
 * where every scale byte of the node's rows lies within ::F8_EXACT_MIN_BYTE ..
 * ::F8_EXACT_MAX_BYTE and no code is NaN, that is the exact value of the table; any other F8
 * node, and the terms after the last full node, take load_cols()'s values and dot_f64()'s own
 * functions.
 */

/** Whether any of the 64 codes at @p c is a NaN code (magnitude 0x7F). */
MMOE_AVX2 static inline __attribute__((always_inline)) int node_has_nan_avx2(const uint8_t *c)
{
    const __m256i m = _mm256_set1_epi8(0x7F);
    const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)c);
    const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(c + 32));
    const __m256i na = _mm256_cmpeq_epi8(_mm256_and_si256(a, m), m), nb = _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m);
    const __m256i any = _mm256_or_si256(na, nb);
    return !_mm256_testz_si256(any, any);
}

/**
 * One node (64 codes from @p c) of one row into the four chains of @p acc: the codes unpacked
 * into step order (t[m] holds steps 4m .. 4m + 3, four chunks each), decoded, scaled by @p s
 * (the row block's scale times 2^8), widened, and added step by step against xp.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) __m256d node_chunks_avx2(const uint8_t *c, __m256 s,
                                                                                const double *xp)
{
    const __m128i r0 = _mm_loadu_si128((const __m128i *)(const void *)c);
    const __m128i r1 = _mm_loadu_si128((const __m128i *)(const void *)(c + 16));
    const __m128i r2 = _mm_loadu_si128((const __m128i *)(const void *)(c + 32));
    const __m128i r3 = _mm_loadu_si128((const __m128i *)(const void *)(c + 48));
    const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
    const __m128i d = _mm_unpacklo_epi8(r2, r3), e = _mm_unpackhi_epi8(r2, r3);
    const __m128i t[4] = {_mm_unpacklo_epi16(a, d), _mm_unpackhi_epi16(a, d), _mm_unpacklo_epi16(b, e),
                          _mm_unpackhi_epi16(b, e)};
    __m256d acc = _mm256_setzero_pd();
    _Pragma("GCC unroll 4")
    for (int m = 0; m < 4; m++) {
        _Pragma("GCC unroll 2")
        for (int h = 0; h < 2; h++) {
            const __m256 v = _mm256_mul_ps(mmoe_e4m3x8_x256th_avx2(h ? _mm_srli_si128(t[m], 8) : t[m]), s);
            const int i = 4 * m + 2 * h;
            acc = _mm256_fmadd_pd(_mm256_loadu_pd(xp + 4 * i), _mm256_cvtps_pd(_mm256_castps256_ps128(v)), acc);
            acc = _mm256_fmadd_pd(_mm256_loadu_pd(xp + 4 * i + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), acc);
        }
    }
    return acc;
}

/** (c0 + c1) + (c2 + c3) of the four chains in @p acc. */
MMOE_AVX2 static inline __attribute__((always_inline)) double node_sum_avx2(__m256d acc)
{
    const __m128d h = _mm_hadd_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
    return _mm_cvtsd_f64(h) + _mm_cvtsd_f64(_mm_unpackhi_pd(h, h));
}

/**
 * Whether the node at column @p k0 of F8 rows @p row .. @p row + 3 takes the decoder: every row's
 * scale byte (into @p b) within ::F8_EXACT_MIN_BYTE .. ::F8_EXACT_MAX_BYTE and no NaN code.
 */
MMOE_AVX2 static int f8_node_decodes(const dense_job *j, int64_t row, int64_t k0, uint8_t b[DENSE_LANES])
{
    const uint8_t *codes = (const uint8_t *)j->w->data + row * j->K;
    const uint8_t *sb = (const uint8_t *)j->scale->data;
    const int64_t kb = k0 / j->v->block;
    for (int r = 0; r < DENSE_LANES; r++) {
        b[r] = sb[((row + r) / j->v->block) * j->v->nkb + kb];
        if (b[r] < F8_EXACT_MIN_BYTE || b[r] > F8_EXACT_MAX_BYTE || node_has_nan_avx2(codes + r * j->K + k0))
            return 0;
    }
    return 1;
}

/**
 * Four rows of the weight from row @p row on, interleaved into @p wq (wq[k * stride + r]; @p
 * stride: store_rows4_avx2()).
 */
MMOE_AVX2 static void load_rows4_avx2(const dense_job *j, int64_t row, float *tmp, double *wq, int64_t stride)
{
    if (j->w->dtype == MMOE_DT_F8_E4M3 && j->scale->dtype == MMOE_DT_F8_E8M0)
        load_f8_rows4_avx2(j, row, wq, stride);
    else if (j->w->dtype == MMOE_DT_BF16 || j->w->dtype == MMOE_DT_F32)
        load_plain_rows4_avx2(j, row, wq, stride);
    else
        for (int r = 0; r < DENSE_LANES; r++)
            load_row(j->w, j->v, row + r, j->K, tmp, wq + r, stride);
}

/** x rows [i0, T) against the four weight rows of @p wq (output columns from @p n), through dot4_f64_avx2(). */
MMOE_AVX2 static void dense_tokens4_avx2(const dense_job *j, const double *wq, int64_t n, int64_t i0)
{
    int64_t i = i0;
    for (; i + DENSE_TOKENS <= j->T; i += DENSE_TOKENS)
        dot4_f64_avx2(DENSE_TOKENS, j->x + i * j->ldx, j->ldx, wq, j->K, j->y + i * j->ldy + n, j->ldy);
    for (; i < j->T; i++)
        dot4_f64_avx2(1, j->x + i * j->ldx, j->ldx, wq, j->K, j->y + i * j->ldy + n, j->ldy);
}

/**
 * As dense_rows_generic(), with the same bits: eight weight rows at a time (@p wq holds two groups
 * of four) through dot8x4_f64_avx2() for every four x rows, the x rows left over and the last group
 * of four rows through dot4_f64_avx2(), the rows left after that one at a time.
 */
MMOE_AVX2 static void dense_rows_avx2(const dense_job *j, float *tmp, double *wq, int64_t n0, int64_t n1)
{
    const int64_t K = j->K;
    int64_t n = n0;
    for (; n + DENSE_BLOCK_ROWS <= n1; n += DENSE_BLOCK_ROWS) {
        load_rows4_avx2(j, j->row0 + n, tmp, wq, DENSE_LANES);
        load_rows4_avx2(j, j->row0 + n + DENSE_LANES, tmp, wq + DENSE_LANES * K, DENSE_LANES);
        int64_t i = 0;
        for (; i + DENSE_BLOCK_TOKENS <= j->T; i += DENSE_BLOCK_TOKENS)
            dot8x4_f64_avx2(j->x + i * j->ldx, j->ldx, wq, K, j->y + i * j->ldy + n, j->ldy);
        dense_tokens4_avx2(j, wq, n, i);
        dense_tokens4_avx2(j, wq + DENSE_LANES * K, n + DENSE_LANES, i);
    }
    for (; n + DENSE_LANES <= n1; n += DENSE_LANES) {
        load_rows4_avx2(j, j->row0 + n, tmp, wq, DENSE_LANES);
        dense_tokens4_avx2(j, wq, n, 0);
    }
    dense_rows_generic(j, tmp, wq, n, n1);
}

/**
 * One node (64 values from column @p k0 of a BF16 or F32 row at @p base) into the four chains of
 * a register: eight columns of each chunk at a time, transposed (transpose_rows4_avx2(): register
 * m holds step m in its low half and step m + 4 in its high half), widened, and added step by
 * step against xp.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) __m256d node_chunks_plain_avx2(int bf16, const void *base,
                                                                                      int64_t k0, const double *xp)
{
    __m256d acc = _mm256_setzero_pd();
    _Pragma("GCC unroll 2")
    for (int h = 0; h < 2; h++) {
        __m256 r[4];
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) {
            const int64_t k = k0 + q * MMOE_SUM_CHUNK + 8 * h;
            r[q] = bf16 ? mmoe_bf16x8_avx2((const uint16_t *)base + k) : _mm256_loadu_ps((const float *)base + k);
        }
        __m256 g[4];
        transpose_rows4_avx2(r[0], r[1], r[2], r[3], g);
        const double *x = xp + k0 + 4 * 8 * h;
        _Pragma("GCC unroll 4")
        for (int m = 0; m < 4; m++)
            acc = _mm256_fmadd_pd(_mm256_loadu_pd(x + 4 * m), _mm256_cvtps_pd(_mm256_castps256_ps128(g[m])), acc);
        _Pragma("GCC unroll 4")
        for (int m = 0; m < 4; m++)
            acc = _mm256_fmadd_pd(_mm256_loadu_pd(x + 4 * (m + 4)), _mm256_cvtps_pd(_mm256_extractf128_ps(g[m], 1)),
                                  acc);
    }
    return acc;
}

/**
 * Outputs n .. n + 3 of a one-row call through the chunk-lane kernels (the comment above): every
 * node of a BF16 or F32 weight, and every node of an F8 weight that f8_node_decodes(); the other
 * F8 nodes and the terms after the last full node from load_cols() (@p tmp, @p wv: K floats and
 * K doubles of scratch) through dot_f64()'s own functions.
 */
MMOE_AVX2 static void dense_rows4_chunks_avx2(const dense_job *j, int64_t n, float *tmp, double *wv)
{
    const int64_t K = j->K, row = j->row0 + n;
    const mmoe_dtype dt = j->w->dtype;
    const size_t esize = dt == MMOE_DT_F8_E4M3 ? 1 : dt == MMOE_DT_BF16 ? sizeof(uint16_t) : sizeof(float);
    const char *base = (const char *)j->w->data + (size_t)(row * K) * esize;
    mmoe_pairwise pw[DENSE_LANES];
    for (int r = 0; r < DENSE_LANES; r++)
        mmoe_pairwise_init(&pw[r]);
    int64_t k0 = 0;
    for (; k0 + DENSE_NODE <= K; k0 += DENSE_NODE) {
        uint8_t b[DENSE_LANES];
        if (dt != MMOE_DT_F8_E4M3 || f8_node_decodes(j, row, k0, b)) {
            __m256d acc[DENSE_LANES];
            _Pragma("GCC unroll 4")
            for (int r = 0; r < DENSE_LANES; r++) {
                const char *rb = base + (size_t)(r * K) * esize;
                acc[r] = dt == MMOE_DT_F8_E4M3
                             ? node_chunks_avx2((const uint8_t *)rb + k0,
                                                _mm256_set1_ps(fmt_ue8m0_to_f32(b[r]) * 0x1p8f), j->xp + k0)
                             : node_chunks_plain_avx2(dt == MMOE_DT_BF16, rb, k0, j->xp);
            }
            for (int r = 0; r < DENSE_LANES; r++)
                mmoe_pairwise_push_node(&pw[r], node_sum_avx2(acc[r]), 2);
        } else {
            for (int r = 0; r < DENSE_LANES; r++) {
                load_cols(j->w, j->v, row + r, K, k0, k0 + DENSE_NODE, tmp, wv, 1);
                mmoe_pairwise_push_node(&pw[r], mmoe_sum_node4_f64(j->x + k0, wv + k0), 2);
            }
        }
    }
    for (int r = 0; r < DENSE_LANES; r++) {
        load_cols(j->w, j->v, row + r, K, k0, K, tmp, wv, 1);
        dot_f64_tail(j->x, wv, 1, k0, K, &pw[r]);
        j->y[n + r] = mmoe_pairwise_result(&pw[r]);
    }
}

/** Weight rows [n0, n1) of a one-row call: four at a time through the chunk-lane kernels, the rest by dense_rows_avx2(). */
MMOE_AVX2 static void dense_rows_chunks_avx2(const dense_job *j, float *tmp, double *wbuf, int64_t n0, int64_t n1)
{
    int64_t n = n0;
    for (; n + DENSE_LANES <= n1; n += DENSE_LANES)
        dense_rows4_chunks_avx2(j, n, tmp, wbuf);
    dense_rows_avx2(j, tmp, wbuf, n, n1);
}

/**
 * @p R (1 or 4) BF16 rows given by their addresses against x, through the chunk-lane kernel: each
 * full node into the four chains of a register (node_chunks_plain_avx2() against @p xp), the
 * terms after the last full node widened into @p tmp (K doubles) and summed by dot_f64()'s own
 * tail.  Always inlined with a constant @p R, so that the four rows' chains run side by side.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void dot_rows_bf16_avx2(int R, const double *x,
                                                                              const double *xp, int64_t K,
                                                                              const uint16_t *const *rows,
                                                                              double *tmp, double *out)
{
    mmoe_pairwise pw[DENSE_LANES];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++)
        mmoe_pairwise_init(&pw[r]);
    int64_t k0 = 0;
    for (; k0 + DENSE_NODE <= K; k0 += DENSE_NODE) {
        __m256d acc[DENSE_LANES];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++)
            acc[r] = node_chunks_plain_avx2(1, rows[r], k0, xp);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++)
            mmoe_pairwise_push_node(&pw[r], node_sum_avx2(acc[r]), 2);
    }
    for (int r = 0; r < R; r++) {
        for (int64_t k = k0; k < K; k++)
            tmp[k] = (double)fmt_bf16_to_f32(rows[r][k]);
        dot_f64_tail(x, tmp, 1, k0, K, &pw[r]);
        out[r] = mmoe_pairwise_result(&pw[r]);
    }
}

/**
 * @p R (1 or 4) F32 rows (at @p rows, stride @p ldr) against one BF16 x: each full node's 64 x values
 * widened and permuted into chunk-lane order once (for the R rows), the rows' nodes into the four
 * chains of a register (node_chunks_plain_avx2()), the terms after the last full node by
 * dot_f32_bf16_tail().  Always inlined with a constant @p R.
 */
MMOE_AVX2 static inline __attribute__((always_inline)) void dot_f32_rows_avx2(int R, const uint16_t *x, int64_t K,
                                                                             const float *rows, int64_t ldr,
                                                                             double *out)
{
    mmoe_pairwise pw[DENSE_LANES];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < R; r++)
        mmoe_pairwise_init(&pw[r]);
    double xn[DENSE_NODE], xpn[DENSE_NODE];
    int64_t k0 = 0;
    for (; k0 + DENSE_NODE <= K; k0 += DENSE_NODE) {
        for (int i = 0; i < DENSE_NODE; i++)
            xn[i] = (double)fmt_bf16_to_f32(x[k0 + i]);
        attn_dot_chunk_x(xn, DENSE_NODE, xpn);
        __m256d acc[DENSE_LANES];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++)
            acc[r] = node_chunks_plain_avx2(0, rows + r * ldr + k0, 0, xpn);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < R; r++)
            mmoe_pairwise_push_node(&pw[r], node_sum_avx2(acc[r]), 2);
    }
    for (int r = 0; r < R; r++) {
        dot_f32_bf16_tail(rows + r * ldr, x, k0, K, &pw[r]);
        out[r] = mmoe_pairwise_result(&pw[r]);
    }
}

/** attn_dot_f32_rows() under AVX2: four rows at a time, the last n mod 4 one at a time. */
MMOE_AVX2 static void dot_f32_rows_list_avx2(const uint16_t *x, int64_t K, const float *rows, int64_t ldr, int64_t n,
                                             double *out)
{
    int64_t r = 0;
    for (; r + DENSE_LANES <= n; r += DENSE_LANES)
        dot_f32_rows_avx2(DENSE_LANES, x, K, rows + r * ldr, ldr, out + r);
    for (; r < n; r++)
        dot_f32_rows_avx2(1, x, K, rows + r * ldr, ldr, out + r);
}

/** attn_dot_rows_bf16() under AVX2: four rows at a time, the last n mod 4 one at a time. */
MMOE_AVX2 static void dot_rows_list_avx2(const double *x, const double *xp, int64_t K, const uint16_t *const *rows,
                                         int64_t n, double *tmp, double *out)
{
    int64_t r = 0;
    for (; r + DENSE_LANES <= n; r += DENSE_LANES)
        dot_rows_bf16_avx2(DENSE_LANES, x, xp, K, rows + r, tmp, out + r);
    for (; r < n; r++)
        dot_rows_bf16_avx2(1, x, xp, K, rows + r, tmp, out + r);
}

/*
 * The AVX-512 kernel of calls with four x rows or more: dot8x4_f64_avx2() with eight weight rows
 * in the lanes of a 512-bit double vector instead of four, so sixteen rows (two vectors) against
 * four x rows per pass.  The rows are interleaved by eight (wq[k * 8 + r], filled four rows at a
 * time by load_rows4_avx2() with stride 8), and the tree's merges run on eight lanes at once
 * (pairwise8).  Every lane performs the operations of one lane of dot4_f64_avx2() on the same
 * values in the same order, so the bits are dot_f64()'s.
 */

/** pairwise4 with eight lanes. */
typedef struct {
    __m512d s[MMOE_SUM_LEVELS]; /**< subtree sums, one per lane, levels strictly decreasing */
    int lvl[MMOE_SUM_LEVELS];   /**< their levels, common to the lanes */
    int n;                      /**< subtrees held */
} pairwise8;

/** pairwise4_push_node() on eight lanes. */
MMOE_AVX512 static inline __attribute__((always_inline)) void pairwise8_push_node(pairwise8 *p, __m512d c, int level)
{
    while (p->n > 0 && p->lvl[p->n - 1] == level) {
        c = _mm512_add_pd(p->s[p->n - 1], c);
        p->n--;
        level++;
    }
    p->s[p->n] = c;
    p->lvl[p->n] = level;
    p->n++;
}

/** pairwise4_finish() on eight lanes: the weights at wq[k * 8 + r], the eight sums into out[0..7]. */
MMOE_AVX512 static void pairwise8_finish(pairwise8 *p, const double *a, const double *wq, int64_t k0, int64_t K,
                                         double *out)
{
    for (; k0 < K; k0 += MMOE_SUM_CHUNK) {
        const int64_t k1 = K - k0 < MMOE_SUM_CHUNK ? K : k0 + MMOE_SUM_CHUNK;
        __m512d c = _mm512_setzero_pd();
        for (int64_t k = k0; k < k1; k++)
            c = _mm512_fmadd_pd(_mm512_set1_pd(a[k]), _mm512_loadu_pd(wq + k * 2 * DENSE_LANES), c);
        pairwise8_push_node(p, c, 0);
    }
    __m512d r = _mm512_setzero_pd();
    if (p->n > 0) {
        r = p->s[p->n - 1];
        for (int i = p->n - 2; i >= 0; i--)
            r = _mm512_add_pd(p->s[i], r);
    }
    _mm512_storeu_pd(out, r);
}

/** x rows whose trees dense_rows_avx512() keeps between its chunks along K. */
#define DENSE_TB 64
/** Nodes of one chunk along K of dense_rows_avx512(): 16 rows x 256 values, 32 KiB, stay in the L1 cache. */
#define DENSE_KC_NODES 4

/**
 * Sixteen weight rows (two groups of eight interleaved by eight, group g at wq + g * 8 * K) against
 * @p rt x rows (1 .. 4), the nodes of columns k0 .. k1 - 1, each node's sum pushed onto pw[t][g]:
 * dot8x4_f64_avx2()'s arrangement with eight lanes a vector.  A node's chunks run one after the
 * other, each as 2 x rt chains; the first two chunks' sums are added as soon as the second is
 * complete, the last two likewise, then the two pairs: (c0 + c1) + (c2 + c3), with fewer sums
 * held.  Always inlined with a constant @p rt.
 */
MMOE_AVX512 static inline __attribute__((always_inline)) void dot16_nodes_avx512(int rt, const double *a, int64_t lda,
                                                                                 const double *wq, int64_t K,
                                                                                 int64_t k0, int64_t k1,
                                                                                 pairwise8 (*pw)[2])
{
    enum { G = 2, RT = DENSE_BLOCK_TOKENS, L = 2 * DENSE_LANES };
    for (; k0 < k1; k0 += DENSE_NODE) {
        __m512d pair01[RT][G], first[RT][G];
        _Pragma("GCC unroll 4")
        for (int q = 0; q < 4; q++) {
            const int64_t kq = k0 + q * MMOE_SUM_CHUNK;
            __m512d c[RT][G];
            _Pragma("GCC unroll 4")
            for (int t = 0; t < rt; t++)
                _Pragma("GCC unroll 2")
                for (int g = 0; g < G; g++)
                    c[t][g] = _mm512_setzero_pd();
            for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
                __m512d wv[G];
                _Pragma("GCC unroll 2")
                for (int g = 0; g < G; g++)
                    wv[g] = _mm512_loadu_pd(wq + g * L * K + (kq + i) * L);
                _Pragma("GCC unroll 4")
                for (int t = 0; t < rt; t++) {
                    const __m512d av = _mm512_set1_pd(a[t * lda + kq + i]);
                    _Pragma("GCC unroll 2")
                    for (int g = 0; g < G; g++)
                        c[t][g] = _mm512_fmadd_pd(av, wv[g], c[t][g]);
                }
            }
            _Pragma("GCC unroll 4")
            for (int t = 0; t < rt; t++)
                _Pragma("GCC unroll 2")
                for (int g = 0; g < G; g++) {
                    if (q == 0 || q == 2)
                        first[t][g] = c[t][g];
                    else if (q == 1)
                        pair01[t][g] = _mm512_add_pd(first[t][g], c[t][g]);
                    else
                        pairwise8_push_node(&pw[t][g], _mm512_add_pd(pair01[t][g], _mm512_add_pd(first[t][g], c[t][g])),
                                            2);
                }
        }
    }
}

/** dot16_nodes_avx512() with @p rt (1 .. 4) as a constant. */
MMOE_AVX512 static void dot16_nodes_any_avx512(int rt, const double *a, int64_t lda, const double *wq, int64_t K,
                                               int64_t k0, int64_t k1, pairwise8 (*pw)[2])
{
    switch (rt) {
    case 4: dot16_nodes_avx512(4, a, lda, wq, K, k0, k1, pw); return;
    case 3: dot16_nodes_avx512(3, a, lda, wq, K, k0, k1, pw); return;
    case 2: dot16_nodes_avx512(2, a, lda, wq, K, k0, k1, pw); return;
    default: dot16_nodes_avx512(1, a, lda, wq, K, k0, k1, pw); return;
    }
}

static size_t dense_trees_bytes(void)
{
    return sizeof(pairwise8) * 2 * DENSE_TB;
}

/**
 * As dense_rows_avx2(), with the same bits: sixteen weight rows at a time, x rows in blocks of
 * ::DENSE_TB whose trees (@p trees: DENSE_TB x 2 of them) are kept while the block passes
 * over the rows' nodes a chunk of ::DENSE_KC_NODES at a time (each chunk read from the L1 cache
 * by every group of four x rows; a tree's pushes come in the same order as without chunks),
 * then finished with the terms after the last node; the rows left after the last sixteen by
 * dense_rows_avx2().
 */
MMOE_AVX512 static void dense_rows_avx512(const dense_job *j, float *tmp, double *wq, pairwise8 (*trees)[2], int64_t n0,
                                          int64_t n1)
{
    const int64_t K = j->K, T = j->T, L = 2 * DENSE_LANES, kn = K - K % DENSE_NODE;
    int64_t n = n0;
    for (; n + DENSE_BLOCK_ROWS_512 <= n1; n += DENSE_BLOCK_ROWS_512) {
        for (int q = 0; q < 4; q++) /* rows n + 4q .. n + 4q + 3: group q / 2, lanes 4 (q mod 2) on */
            load_rows4_avx2(j, j->row0 + n + q * DENSE_LANES, tmp, wq + (q / 2) * L * K + (q % 2) * DENSE_LANES, L);
        for (int64_t t0 = 0; t0 < T; t0 += DENSE_TB) {
            const int64_t tb = T - t0 < DENSE_TB ? T - t0 : DENSE_TB;
            for (int64_t t = 0; t < tb; t++)
                trees[t][0].n = trees[t][1].n = 0;
            for (int64_t k0 = 0; k0 < kn; k0 += DENSE_KC_NODES * DENSE_NODE) {
                const int64_t k1 = kn - k0 < DENSE_KC_NODES * DENSE_NODE ? kn : k0 + DENSE_KC_NODES * DENSE_NODE;
                for (int64_t t = 0; t < tb; t += DENSE_BLOCK_TOKENS)
                    dot16_nodes_any_avx512(tb - t < DENSE_BLOCK_TOKENS ? (int)(tb - t) : DENSE_BLOCK_TOKENS,
                                           j->x + (t0 + t) * j->ldx, j->ldx, wq, K, k0, k1, trees + t);
            }
            for (int64_t t = 0; t < tb; t++)
                for (int g = 0; g < 2; g++)
                    pairwise8_finish(&trees[t][g], j->x + (t0 + t) * j->ldx, wq + g * L * K, kn, K,
                                     j->y + (t0 + t) * j->ldy + n + g * L);
        }
    }
    dense_rows_avx2(j, tmp, wq, n, n1);
}
#endif

void attn_dot_rows_bf16(moe_dot_isa isa, const double *x, const double *xp, int64_t K, const uint16_t *const *rows,
                        int64_t n, double *tmp, double *out)
{
#if MMOE_CPU_HAVE_X86
    if (moe_dot_isa_has_avx2(isa)) {
        dot_rows_list_avx2(x, xp, K, rows, n, tmp, out);
        return;
    }
#endif
    (void)isa;
    (void)xp;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t k = 0; k < K; k++)
            tmp[k] = (double)fmt_bf16_to_f32(rows[r][k]);
        out[r] = dot_f64(x, tmp, K);
    }
}

void attn_dot_f32_rows(moe_dot_isa isa, const uint16_t *x, int64_t K, const float *rows, int64_t ldr, int64_t n,
                       double *out)
{
#if MMOE_CPU_HAVE_X86
    if (moe_dot_isa_has_avx2(isa)) {
        dot_f32_rows_list_avx2(x, K, rows, ldr, n, out);
        return;
    }
#endif
    (void)isa;
    float xf[DENSE_NODE];
    for (int64_t r = 0; r < n; r++) {
        const float *row = rows + r * ldr;
        mmoe_pairwise pw;
        mmoe_pairwise_init(&pw);
        int64_t i0 = 0;
        for (; i0 + DENSE_NODE <= K; i0 += DENSE_NODE) {
            mmoe_bf16_to_f32_row(x + i0, DENSE_NODE, xf);
            mmoe_pairwise_push_node(&pw, mmoe_sum_node4_f32(row + i0, xf), 2);
        }
        dot_f32_bf16_tail(row, x, i0, K, &pw);
        out[r] = mmoe_pairwise_result(&pw);
    }
}

#if !MMOE_CPU_HAVE_X86
static size_t dense_trees_bytes(void)
{
    return 0;
}
#endif

/** moe_rows_fn of attn_dense_sums(): weight rows [n0, n1) with thread @p thread's buffer. */
static void dense_rows(void *ctx, int thread, int64_t n0, int64_t n1)
{
    const dense_job *j = ctx;
    double *wbuf = j->wbuf + (int64_t)thread * DENSE_BLOCK_ROWS_512 * j->K;
    float *tmp = j->tmp + (int64_t)thread * j->K;
#if MMOE_CPU_HAVE_X86
    if (moe_dot_isa_has_avx2(j->isa)) {
        if (j->xp != NULL)
            dense_rows_chunks_avx2(j, tmp, wbuf, n0, n1);
        else if (j->trees != NULL)
            dense_rows_avx512(j, tmp, wbuf, (pairwise8(*)[2])(void *)(j->trees + (size_t)thread * dense_trees_bytes()),
                              n0, n1);
        else
            dense_rows_avx2(j, tmp, wbuf, n0, n1);
        return;
    }
#endif
    dense_rows_generic(j, tmp, wbuf, n0, n1);
}

mmoe_status attn_dense_sums(moe_dequant_pool *pool, moe_dot_isa isa, const double *x, int64_t T, int64_t ldx,
                            int64_t K, const mmoe_tensor *w, const mmoe_tensor *scale, int block, int64_t row0,
                            int64_t N, double *y, int64_t ldy, mmoe_error *err)
{
    if (w->dtype != MMOE_DT_BF16 && w->dtype != MMOE_DT_F32 && w->dtype != MMOE_DT_F8_E4M3)
        return mmoe_error_set(err, MMOE_EDTYPE, "dense linear: weight dtype %s, expected BF16, F32 or F8_E4M3",
                              mmoe_dtype_name(w->dtype));
    if (w->dtype == MMOE_DT_F8_E4M3 && block <= 0)
        return mmoe_error_set(err, MMOE_ERANGE, "dense linear: F8 weight block %d, expected a positive edge", block);
    if (N <= 0 || T <= 0)
        return MMOE_OK;
    f8_values v = {NULL, NULL, 0, 0, 1};
    mmoe_status st = MMOE_OK;
    if (w->dtype == MMOE_DT_F8_E4M3 && (st = f8_values_build(&v, scale, block, row0, N, K, err)) != MMOE_OK)
        goto done;
    const int threads = moe_dequant_pool_threads(pool);
    /* one x row of a BF16 or F32 weight, or of an F8 one with E8M0 scales in blocks of whole
       nodes: the chunk-lane kernels */
    const int chunk_lanes = MMOE_CPU_HAVE_X86 && moe_dot_isa_has_avx2(isa) && T == 1 && K >= DENSE_NODE &&
                            (w->dtype != MMOE_DT_F8_E4M3 ||
                             (scale->dtype == MMOE_DT_F8_E8M0 && block % DENSE_NODE == 0));
    /* four x rows or more under AVX-512: sixteen rows a pass, the x rows' trees per thread */
    const int wide = isa == MOE_DOT_ISA_AVX512 && T >= DENSE_BLOCK_TOKENS;
    dense_job j = {isa, x, T, ldx, K, w, &v, scale, row0, y, ldy,
                   malloc(sizeof(double) * (size_t)(threads * DENSE_BLOCK_ROWS_512 * K)),
                   malloc(sizeof(float) * (size_t)(threads * K)),
                   chunk_lanes ? malloc(sizeof(double) * (size_t)K) : NULL,
                   wide ? aligned_alloc(64, (size_t)threads * dense_trees_bytes()) : NULL};
    if (j.wbuf == NULL || j.tmp == NULL || (chunk_lanes && j.xp == NULL) || (wide && j.trees == NULL)) {
        free(j.wbuf);
        free(j.tmp);
        free(j.xp);
        free(j.trees);
        st = mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (K=%lld, %d threads)", (long long)K,
                            threads);
        goto done;
    }
    if (chunk_lanes)
        attn_dot_chunk_x(x, K, j.xp);
    moe_pool_rows(pool, N, K * T, wide ? DENSE_BLOCK_ROWS_512 : DENSE_BLOCK_ROWS, dense_rows, &j);
    free(j.wbuf);
    free(j.tmp);
    free(j.xp);
    free(j.trees);
done:
    free(v.value);
    free(v.table);
    return st;
}

mmoe_status attn_dense_rows(moe_dequant_pool *pool, const double *x, int64_t T, int64_t ldx, int64_t K,
                            const mmoe_tensor *w, const mmoe_tensor *scale, int block, int64_t row0, int64_t N,
                            float *y, int64_t ldy, mmoe_error *err)
{
    double *sums = malloc(sizeof(double) * (size_t)(T * N + 1));
    if (sums == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (T=%lld, N=%lld)", (long long)T,
                              (long long)N);
    mmoe_status st = attn_dense_sums(pool, moe_dot_isa_best(), x, T, ldx, K, w, scale, block, row0, N, sums, N, err);
    if (st == MMOE_OK)
        for (int64_t i = 0; i < T; i++)
            for (int64_t n = 0; n < N; n++)
                y[i * ldy + n] = (float)sums[i * N + n];
    free(sums);
    return st;
}

mmoe_status attn_linear_dense(moe_dequant_pool *pool, const uint16_t *x, int64_t T, int64_t K, const mmoe_tensor *w,
                              int64_t N, float *y_f32, uint16_t *y_bf16, mmoe_error *err)
{
    if (w->dtype != MMOE_DT_BF16 && w->dtype != MMOE_DT_F32)
        return mmoe_error_set(err, MMOE_EDTYPE, "dense linear: weight dtype %s, expected BF16 or F32",
                              mmoe_dtype_name(w->dtype));
    if (w->ndim != 2 || w->shape[0] != N || w->shape[1] != K)
        return mmoe_error_set(err, MMOE_ESHAPE, "dense linear: weight must be [%lld, %lld]",
                              (long long)N, (long long)K);
    if (T <= 0)
        return MMOE_OK;
    double *xd = malloc(sizeof(double) * (size_t)(T * K));
    float *y = y_f32 != NULL ? y_f32 : malloc(sizeof(float) * (size_t)(T * N));
    mmoe_status st = MMOE_OK;
    if (xd == NULL || y == NULL) {
        st = mmoe_error_set(err, MMOE_ENOMEM, "dense linear: out of memory (T=%lld, K=%lld)",
                            (long long)T, (long long)K);
        goto done;
    }
    for (int64_t i = 0; i < T * K; i++)
        xd[i] = (double)fmt_bf16_to_f32(x[i]);
    st = attn_dense_rows(pool, xd, T, K, K, w, NULL, 0, 0, N, y, N, err);
    if (st == MMOE_OK && y_bf16 != NULL)
        mmoe_bf16_from_f32_row(y, (size_t)(T * N), y_bf16);
done:
    free(xd);
    if (y != y_f32)
        free(y);
    return st;
}

mmoe_status mmoe_linear_dense(const uint16_t *x, int64_t T, int64_t K, const mmoe_tensor *w, int64_t N, float *y_f32,
                              uint16_t *y_bf16, mmoe_error *err)
{
    return attn_linear_dense(NULL, x, T, K, w, N, y_f32, y_bf16, err);
}
