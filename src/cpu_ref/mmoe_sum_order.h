/**
 * @file mmoe_sum_order.h
 * @brief The order of the forward's double sums: chunks of 16, then a pairwise tree
 *        (@ref spec_arch_sum_order).
 *
 * The RMSNorms, mHC's mixing logits, the per-head q rescaling, the attention scores and the
 * indexer's head dot products are sums of terms that are exact in double (squares and
 * products of BF16 and FP32 values) but whose double sum rounds: the order of the additions
 * is part of the result.  One order serves them all, so that the CPU oracle and the GPU
 * forward agree bit for bit while the GPU sums in parallel:
 *
 * 1. the n terms are cut into chunks of @ref MMOE_SUM_CHUNK consecutive terms (the last one
 *    may be shorter); chunk k's sum starts at +0 and adds its terms in ascending order;
 * 2. the m = ceil(n / 16) chunk sums c_0 .. c_{m-1} are combined by the pairwise tree
 *    \f[ P(c_0 .. c_{m-1}) = c_0 \ (m = 1),\qquad
 *        P(c_0 .. c_{m-1}) = P(c_0 .. c_{h-1}) + P(c_h .. c_{m-1}),\ h = \text{the largest power of two} < m. \f]
 *    An empty sum (n = 0) is +0.
 *
 * P is the perfect binary tree over the next power of two of chunks, the missing chunks read as
 * +0: no partial sum is ever -0 (each starts at +0, and a rounded sum is -0 only when both
 * addends are), so adding a +0 changes no bit.  A thread that owns an aligned power-of-two run
 * of chunks therefore computes a node of the tree, and a warp's butterfly (lane i adds lane
 * i xor s for s = 1, 2, 4, ...) computes the levels above, in every lane (x + y = y + x).
 *
 * The streaming form below (a binary counter of subtree sums, folded from the right at the
 * end) computes P without storing the chunk sums; it is plain C that nvcc also compiles for the
 * device, so the oracle and the GPU kernels share this one definition.
 */
#ifndef MMOE_SUM_ORDER_H
#define MMOE_SUM_ORDER_H

#include <stdint.h>

/** Storage of the functions below: static inline, and for the device too under nvcc. */
#ifdef __CUDACC__
#define MMOE_SUM_FN __host__ __device__ static inline
#else
#define MMOE_SUM_FN static inline
#endif

/** Terms per chunk of the forward's double sums. */
#define MMOE_SUM_CHUNK 16

/** Deepest binary counter: 2^40 chunks. */
#define MMOE_SUM_LEVELS 40

/** A pairwise sum in progress: the sums of complete subtrees, deepest first. */
typedef struct {
    double s[MMOE_SUM_LEVELS]; /**< subtree sums, levels strictly decreasing */
    int lvl[MMOE_SUM_LEVELS];  /**< their levels (a level-k subtree holds 2^k chunks) */
    int n;                     /**< subtrees held */
} mmoe_pairwise;

/** Start an empty pairwise sum. */
MMOE_SUM_FN void mmoe_pairwise_init(mmoe_pairwise *p) { p->n = 0; }

/**
 * Append the sum @p c of the next aligned run of 2^@p level chunks (a node of the tree; every
 * subtree held must be at least that deep): two subtrees of equal level merge (left + right)
 * until the levels are strictly decreasing again.
 */
MMOE_SUM_FN void mmoe_pairwise_push_node(mmoe_pairwise *p, double c, int level)
{
    while (p->n > 0 && p->lvl[p->n - 1] == level) {
        c = p->s[p->n - 1] + c;
        p->n--;
        level++;
    }
    p->s[p->n] = c;
    p->lvl[p->n] = level;
    p->n++;
}

/** Append the next chunk sum @p c. */
MMOE_SUM_FN void mmoe_pairwise_push(mmoe_pairwise *p, double c) { mmoe_pairwise_push_node(p, c, 0); }

/** Terms of an aligned node of four chunks, the unit of the four-chain sums below. */
#define MMOE_SUM_NODE4 (4 * MMOE_SUM_CHUNK)

/**
 * The sum of one aligned node of four chunks, terms a[i] * b[i] (i < ::MMOE_SUM_NODE4) of fp32
 * operands, each product exact in double: each chunk from +0 in ascending order (four
 * independent chains), then (c0 + c1) + (c2 + c3), as the tree adds them; push it with
 * mmoe_pairwise_push_node(p, node, 2) at a node boundary.
 */
MMOE_SUM_FN double mmoe_sum_node4_f32(const float *a, const float *b)
{
    double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
    for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
        c0 += (double)a[i] * (double)b[i];
        c1 += (double)a[MMOE_SUM_CHUNK + i] * (double)b[MMOE_SUM_CHUNK + i];
        c2 += (double)a[2 * MMOE_SUM_CHUNK + i] * (double)b[2 * MMOE_SUM_CHUNK + i];
        c3 += (double)a[3 * MMOE_SUM_CHUNK + i] * (double)b[3 * MMOE_SUM_CHUNK + i];
    }
    return (c0 + c1) + (c2 + c3);
}

/** mmoe_sum_node4_f32() of double operands (the products a[i] * b[i] as the caller's operands allow). */
MMOE_SUM_FN double mmoe_sum_node4_f64(const double *a, const double *b)
{
    double c0 = 0.0, c1 = 0.0, c2 = 0.0, c3 = 0.0;
    for (int i = 0; i < MMOE_SUM_CHUNK; i++) {
        c0 += a[i] * b[i];
        c1 += a[MMOE_SUM_CHUNK + i] * b[MMOE_SUM_CHUNK + i];
        c2 += a[2 * MMOE_SUM_CHUNK + i] * b[2 * MMOE_SUM_CHUNK + i];
        c3 += a[3 * MMOE_SUM_CHUNK + i] * b[3 * MMOE_SUM_CHUNK + i];
    }
    return (c0 + c1) + (c2 + c3);
}

/** P of the chunk sums pushed so far: the subtrees folded from the right (+0 when none). */
MMOE_SUM_FN double mmoe_pairwise_result(const mmoe_pairwise *p)
{
    if (p->n == 0)
        return 0.0;
    double r = p->s[p->n - 1];
    for (int i = p->n - 2; i >= 0; i--)
        r = p->s[i] + r;
    return r;
}

#endif /* MMOE_SUM_ORDER_H */
