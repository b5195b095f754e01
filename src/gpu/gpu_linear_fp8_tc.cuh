/**
 * @file gpu_linear_fp8_tc.cuh
 * @brief The FP8 linear of a few tokens on the tensor cores (the `tc` recipe of the FP8
 *        linears): the block partials summed by F16 MMAs instead of exactly, within a stated
 *        bound of the oracle.
 *
 * ## Why a second recipe
 *
 * The oracle's FP8 linear (@ref spec_arch_linear, linear_fp8.c) forms each 128-wide block
 * partial \f$p_\kappa = \sum_i \hat q_{x,i} \hat q_{w,i}\f$ exactly and rounds it once to FP32.
 * The exact kernels reproduce that bit for bit (k_linear_fp8_128_split: every weight code
 * becomes a double by bit moves and costs one DFMA), and at one token they are bound by
 * instruction issue rather than by memory: about 255 instructions per kilobyte of weights and
 * warp, 1.4 to 1.9 TB/s (docs/perf.md, "Tenth pass").  A tensor core takes 4096 products in one
 * instruction, but it adds them in FP32 in an order and with a truncation the hardware does not
 * specify, so no CPU loop can match its bits: this kernel is a *recipe* of its own, chosen by
 * the forward's setting (#MMOE_GPU_FP8_LINEARS_ENV, mmoe_gpu_model_fp8_linears()), and tested
 * against the oracle within the bound below, not bit for bit.
 *
 * ## What it computes
 *
 * Everything but the partial is the oracle's: the same E4M3 codes and UE8M0 scales of x
 * (k_act_quant) and of the weight, the term \f$t_\kappa = \tilde p_\kappa \cdot (s_x s_w)\f$
 * in FP32, the terms added in FP32, the output rounded to BF16 (and, for the attention's
 * wo_b, k_hc_post's update of the streams from the stored BF16, hc_post_channel()).
 * \f$\tilde p_\kappa\f$ is the sum of the block's 128 products by eight F16 MMA steps of 16
 * products each (`wgmma.m64n8k16` with FP32 accumulation, two chains of four from \f$+0\f$,
 * added): every E4M3 value is an F16 value exactly (`cvt.rn.f16x2.e4m3x2`, NaN codes to NaN),
 * and a product of two F16 values is exact in the tensor core.  The terms of a row are added
 * in ascending block order within each block's chunk of K, and the chunks' sums in ascending K
 * (a tile summed by one block: the oracle's order of the terms).
 *
 * ## The bound
 *
 * Let \f$\pi_i = \hat q_{x,i} \hat q_{w,i}\f$ be a block's products, \f$P_\kappa\f$ their exact
 * sum, \f$S_\kappa = \sum_i |\pi_i|\f$,
 * \f$A = \sum_\kappa s_{x,\kappa} s_{w,\kappa} S_\kappa = \sum_k |\hat x_k \hat w_k|\f$ (the dot
 * product of the absolute dequantized values) and \f$u = 2^{-24}\f$.
 *
 * - *One MMA step* adds 16 exact products to its accumulator \f$c\f$.  The model: the 17
 *   addends are aligned to the largest and truncated to FP32's 24 bits, each losing less than
 *   one unit in the last place of the largest (\f$2u\f$ times its magnitude), and the sum is
 *   rounded once more (less than \f$2u\f$ of it); so the step errs by less than
 *   \f$18 \cdot 2u\,(|c| + \sum |\pi_i|) < 2^{-18} (|c| + \sum|\pi_i|)\f$.
 * - *A block* is two chains of four steps from \f$+0\f$ (the even and the odd steps), each
 *   step with \f$|c| + \sum|\pi_i| \le S_\kappa (1 + 2^{-16})\f$, and one FP32 addition of the
 *   two: \f$|\tilde p_\kappa - P_\kappa| \le (2^{-16} + u)(1 + 2^{-16}) S_\kappa
 *   < 2^{-15} S_\kappa\f$; the oracle's \f$p_\kappa = \mathrm{fl}(P_\kappa)\f$ is within
 *   \f$u S_\kappa\f$ of \f$P_\kappa\f$.
 * - *The terms* (the partials times powers of two, exact) are added with \f$n_b - 1\f$ FP32
 *   additions on each side (\f$n_b = K/128\f$), each rounding by at most \f$u\f$ times a partial
 *   sum no larger than \f$A (1 + 2^{-14})\f$.
 *
 * So, before the BF16 rounding,
 * \f[ |\tilde y - y| \le \big(2^{-15} + u + 2 (n_b - 1)\, u\, (1 + 2^{-14})\big) A
 *     \le 2^{-14} A \qquad (K \le 16384,\ n_b \le 128), \f]
 * and the stored BF16 values differ by at most that plus one BF16 unit in the last place of the
 * larger.  The MMA model is the one measured for the F16 tensor cores of earlier generations
 * (products exact, alignment with truncation, FP32-wide sums); the blocks suite checks every
 * output of random, wide-range and NaN cases against the bound (test_linear_fp8_tc), so a device
 * whose MMAs sum less precisely fails there.  In practice almost every output is the oracle's
 * bit for bit: a block's 128 products usually fit FP32's 24 bits, and then any order is exact.
 *
 * ## Data layout
 *
 * A *tile* is 64 weight rows (the wgmma's M: warp w of the consumer warpgroup holds rows
 * 16w..16w+15), a *unit* one tile's 128-wide K block (8 KB of codes): row r of the unit sits in
 * the ring stage at bytes [128 r, 128 r + 128), its 16-byte chunk c at position c XOR (r mod 8)
 * (the TMA copy's 128-byte swizzle, which also keeps a quarter-warp's loads on
 * distinct banks).  Lane \f$4g + t\f$ of warp w reads the 32 codes
 * \f$[32t, 32t + 32)\f$ of rows \f$16w + g\f$ and \f$16w + g + 8\f$ and uses word m of them in
 * step m: its low two codes as the fragment's \f$k = 2t, 2t+1\f$, its high two as
 * \f$k = 2t+8, 2t+9\f$.  So step m's logical k is the block's code
 * \f[ \mathrm{code}(m, k) = 32 \lfloor (k \bmod 8) / 2 \rfloor + 4m + 2 \lfloor k / 8 \rfloor + (k \bmod 2), \f]
 * and x is stored in the same order: a dot product does not depend on the order of its K, only
 * weight and x must agree.  x (all T <= 8 tokens, tokens past T zero) is converted to F16 once
 * per block into shared memory, two 128-byte-swizzled tiles of 8 rows per K block (gpu_wgmma.cuh:
 * step m reads tile m / 4 at byte offset 32 (m mod 4)), for the K blocks the block's range
 * touches (at most GFW_TC_XBLOCKS: tc_job_for() cuts K so).
 *
 * ## Roles
 *
 * A block is one consumer warpgroup and one producer warp.  The producer's first thread streams
 * the block's units with one 2-D TMA copy each (tma_load_2d(), a 128 x 64
 * box of the weight's own [N, K] layout, described by a tensor map made at launch) into a ring
 * of GFW_TC_STAGES stages; an mbarrier per stage counts the bytes in, another the consumer warps
 * out.  It starts before the kernel waits for the one before it: a weight is no kernel's output.
 * The consumers wait for the previous kernel, convert x, then per unit: wait for the stage, read
 * their 32 codes of two rows, give the stage back, convert, and issue the 8 wgmmas; the next
 * unit's codes are read and converted while the wgmmas run (two fragment sets take turns).
 *
 * ## Work
 *
 * Where a linear has at least as many tiles as its share of the grid (GFW_TC_BLOCKS_PER_SM
 * blocks on every multiprocessor; wq_b, 512 tiles), blocks take whole tiles and no partial sum
 * exists.  Otherwise each tile's K blocks are cut into equal chunks, one block a chunk (wo_b: 4
 * chunks of 16; wq_a with wkv: 8 of 4), each chunk's sums go to its slot, and the tile's last
 * block to count (an acquire-release atomic per tile, after a barrier of the consumers) adds
 * the slots in ascending K, stores, and resets the count for the next launch.  Sharing the
 * units out evenly instead would split nearly every tile between two blocks and end almost
 * every block with the count and the last block's reads: wq_b takes 22 us that way against 14
 * (docs/perf.md, "Fifteenth pass").  The partials and counts (gfw_tc_ws) belong to the model.
 */
#ifndef MMOE_GPU_LINEAR_FP8_TC_CUH
/** Include guard (this file is included in the middle of gpu_forward.cu). */
#define MMOE_GPU_LINEAR_FP8_TC_CUH

#include "gpu_wgmma.cuh"

#include <cuda.h>

/** Weight rows of a tile: the wgmma's M. */
#define GFW_TC_ROWS 64
/** Most tokens of a call: the wgmma's N (x's rows past T are zeros). */
#define GFW_TC_TOKENS 8
static_assert(GFW_TC_TOKENS == 8, "the m64n8 wgmma, the fragments' token columns and tc_fill_x()'s index bits take 8 tokens");
/** Stages of the weight ring. */
#define GFW_TC_STAGES 6
/** Bytes between two rows of a ring stage (the 128-byte swizzle's row). */
#define GFW_TC_PITCH 128
/** Bytes of a ring stage. */
#define GFW_TC_STAGE_BYTES (GFW_TC_ROWS * GFW_TC_PITCH)
/** K blocks of x a block holds (the most its chunk of K spans). */
#define GFW_TC_XBLOCKS 16
/** Threads: the consumer warpgroup, then the producer warp. */
#define GFW_TC_THREADS 160
/** Blocks per multiprocessor: the grid's wave. */
#define GFW_TC_BLOCKS_PER_SM 2
/** Fewest K blocks of a chunk where a tile is cut (tc_job_for()). */
#define GFW_TC_MIN_UNITS 4
/** Dynamic shared memory: x, the ring, x's scales, the barriers, a broadcast word, and the slack to align x to 1 KB. */
#define GFW_TC_SMEM                                                                                                    \
    (GFW_TC_XBLOCKS * 2048 + GFW_TC_STAGES * GFW_TC_STAGE_BYTES + GFW_TC_XBLOCKS * GFW_TC_TOKENS * 128 + GFW_TC_XBLOCKS * GFW_TC_TOKENS * 4 +   \
     GFW_TC_STAGES * 16 + 16 + 1024)

/** Floats of the partials buffer (gfw_tc_ws::part): 4 MB. */
#define GFW_TC_PART_FLOATS (1 << 20)
/** Counts of the partials buffer (gfw_tc_ws::count): tiles of one launch. */
#define GFW_TC_COUNTS 8192

/** The model's work space of k_linear_fp8_tc: partial sums of split tiles and a count per tile (zero between launches). */
struct gfw_tc_ws {
    float *part;     /**< GFW_TC_PART_FLOATS floats */
    unsigned *count; /**< GFW_TC_COUNTS counts, zero between launches */
};

/**
 * Four E4M3 codes (a word, code 0 lowest) as two F16 pairs: codes 0, 1 into @p lo, codes 2, 3
 * into @p hi (the lower code in the lower half), exactly.
 */
__device__ __forceinline__ void tc_e4m3x4_f16(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
}

/**
 * One linear of a k_linear_fp8_tc launch and its blocks.  Its tiles are either shared out whole
 * (splits = 1: block b takes tiles [b tpc, (b + 1) tpc), all K blocks: no partial sums at all),
 * or each tile's K blocks are cut into `splits` chunks of `chunk` blocks (the last may be
 * shorter), block b taking chunk b mod splits of tile b / splits; the tile's last block to
 * count adds the chunks' partials in order.
 */
struct tc_job {
    CUtensorMap map;  /**< the weight's codes as a 2-D tensor (K bytes x N rows), boxes of 128 x 64, 128-byte swizzle */
    dfp8 w;           /**< the weight (128x128 scale blocks) */
    uint16_t *y;      /**< its output [T, w.N] */
    fp8_hc_post post; /**< an hc_post of the output after it is written, or none (X NULL) */
    int tiles;        /**< ceil(N / GFW_TC_ROWS) */
    int splits;       /**< K chunks a tile (1: whole tiles) */
    int chunk;        /**< K blocks of a chunk */
    int tpc;          /**< tiles a block where splits = 1 */
    int blocks;       /**< blocks of the job (0: no second linear) */
    float *part;      /**< [tiles, splits, 64 rows, 8 tokens] where splits > 1 */
    unsigned *count;  /**< [tiles], zero between launches */
};

/** A k_linear_fp8_tc launch: one or two linears of the same x (the second one's blocks after the first one's). */
struct tc_plan {
    tc_job j0; /**< the first linear */
    tc_job j1; /**< the second (j1.blocks = 0: none) */
    int nb;    /**< K blocks of both (the same K) */
};

/** Units [*u0, *u1) (tile-major, a unit a tile's K block) of block @p b of @p j. */
__host__ __device__ __forceinline__ void tc_range(const tc_job &j, int nb, int64_t b, int *u0, int *u1)
{
    if (j.splits == 1) {
        const int64_t t1 = (b + 1) * j.tpc < j.tiles ? (b + 1) * j.tpc : j.tiles;
        *u0 = (int)(b * j.tpc * nb);
        *u1 = (int)(t1 * nb);
    } else {
        const int64_t tile = b / j.splits, c = b % j.splits;
        const int64_t k1 = (c + 1) * j.chunk < nb ? (c + 1) * j.chunk : nb;
        *u0 = (int)(tile * nb + c * j.chunk);
        *u1 = (int)(tile * nb + k1);
    }
}

/** Barrier of the consumer warpgroup alone (named barrier 1; the producer warp may have left). */
__device__ __forceinline__ void tc_consumers_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

/** The shared memory of a k_linear_fp8_tc block (carved from the dynamic allocation). */
struct tc_smem {
    uint8_t *xh;     /**< x as F16, [GFW_TC_XBLOCKS][2 tiles][8 rows][128 bytes], 128-byte swizzle */
    uint8_t *ring;   /**< [GFW_TC_STAGES][GFW_TC_STAGE_BYTES] weight codes */
    uint8_t *xc;     /**< x's codes, [GFW_TC_XBLOCKS][8 tokens][128] */
    float *xsc;      /**< [GFW_TC_XBLOCKS][8] x scales */
    uint64_t *full;  /**< [GFW_TC_STAGES] a stage's bytes have landed */
    uint64_t *empty; /**< [GFW_TC_STAGES] the consumers are done with a stage */
    unsigned *bcast; /**< the count a block's thread 0 read */
};

/** Carve tc_smem from @p raw (x aligned to 1 KB for the swizzle). */
__device__ __forceinline__ tc_smem tc_carve(uint8_t *raw)
{
    tc_smem s;
    const uint32_t a = smem_u32(raw);
    s.xh = raw + (((a + 1023u) & ~1023u) - a);
    s.ring = s.xh + GFW_TC_XBLOCKS * 2048;
    s.xc = s.ring + GFW_TC_STAGES * GFW_TC_STAGE_BYTES;
    s.xsc = (float *)(s.xc + GFW_TC_XBLOCKS * GFW_TC_TOKENS * 128);
    s.full = (uint64_t *)(s.xsc + GFW_TC_XBLOCKS * GFW_TC_TOKENS);
    s.empty = s.full + GFW_TC_STAGES;
    s.bcast = (unsigned *)(s.empty + GFW_TC_STAGES);
    return s;
}

/** The producer warp: units [@p u0, @p u1) of @p j, one TMA copy each into the ring (rows past N read as zeros). */
__device__ __forceinline__ void tc_produce(const tc_job &j, int nb, int u0, int u1, const tc_smem &sm, int lane)
{
    for (int u = u0, s = 0, n = 0; u < u1; u++) {
        if (n > 0)
            mbar_wait(sm.empty + s, (n - 1) & 1); /* the consumers' (n-1)th pass over stage s */
        const int64_t tile = u / nb, kb = u % nb;
        if (lane == 0) {
            mbar_arrive_expect_tx(sm.full + s, GFW_TC_ROWS * 128);
            tma_load_2d(sm.ring + s * GFW_TC_STAGE_BYTES, &j.map, (int)(kb * 128), (int)(tile * GFW_TC_ROWS), sm.full + s);
        }
        if (++s == GFW_TC_STAGES) {
            s = 0;
            n++;
        }
    }
}

/**
 * x of the K blocks (kb0 + i) mod nb, i < @p nx, into the block's F16 tiles (the chapter's K
 * order, tokens past T zero) and its scales; by the 128 consumer threads.  The codes are first
 * copied to shared memory whole (every thread's loads issued at once: one memory latency), then
 * converted there.
 */
__device__ __forceinline__ void tc_fill_x(const uint8_t *xq, const float *xs, int T, int64_t K, int nb, int kb0,
                                          int nx, const tc_smem &sm, int tid)
{
    const int rows = nx * T; /* (block, token) rows of 128 codes */
    uint4 v[GFW_TC_XBLOCKS * GFW_TC_TOKENS * 8 / 128]; /* 8 16-byte pieces a row of 128 codes */
#pragma unroll
    for (int r = 0; r < GFW_TC_XBLOCKS * GFW_TC_TOKENS * 8 / 128; r++) {
        const int idx = tid + 128 * r, row = idx >> 3, i = row / T, n = row - i * T;
        if (row < rows)
            v[r] = __ldg((const uint4 *)(xq + (int64_t)n * K + (int64_t)((kb0 + i) % nb) * 128) + (idx & 7));
    }
#pragma unroll
    for (int r = 0; r < GFW_TC_XBLOCKS * GFW_TC_TOKENS * 8 / 128; r++) {
        const int idx = tid + 128 * r, row = idx >> 3, i = row / T, n = row - i * T;
        if (row < rows)
            *((uint4 *)(sm.xc + (i * GFW_TC_TOKENS + n) * 128) + (idx & 7)) = v[r];
    }
    for (int c = tid; c < nx * GFW_TC_TOKENS; c += 128) {
        const int i = c >> 3, n = c & 7;
        sm.xsc[c] = n < T ? xs[(int64_t)n * nb + (kb0 + i) % nb] : 0.0f;
    }
    tc_consumers_sync();
    for (int c = tid; c < nx * 128; c += 128) {
        const int i = c >> 7, h = (c >> 6) & 1, n = (c >> 3) & 7, chunk = c & 7;
        const int m = 4 * h + (chunk >> 1), hi = chunk & 1;
        uint32_t w4[4] = {0u, 0u, 0u, 0u};
        if (n < T) {
            const uint8_t *px = sm.xc + (i * GFW_TC_TOKENS + n) * 128 + 4 * m + 2 * hi;
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const uint16_t pair = *(const uint16_t *)(px + 32 * t);
                asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(w4[t]) : "h"(pair));
            }
        }
        *(uint4 *)(sm.xh + (i * 2 + h) * 1024 + sw128_offset(n, chunk)) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
    }
}

/** Output @p i (0..3) of a consumer thread's fragment: its row in the tile. */
__device__ __forceinline__ int tc_frag_row(int tid, int i) { return 16 * (tid >> 5) + ((tid & 31) >> 2) + (i >= 2 ? 8 : 0); }
/** Output @p i of a consumer thread's fragment: its token. */
__device__ __forceinline__ int tc_frag_token(int tid, int i) { return 2 * (tid & 3) + (i & 1); }

/**
 * A run of the block's units in tile @p tile over blocks [@p k0, @p k1] ended with sums @p acc:
 * the whole tile is stored (false), or the run is written to its slot (true: count it later).
 */
__device__ __forceinline__ bool tc_end_run(const tc_job &j, int nb, int tile, int k0, int k1, int64_t w,
                                           const float (&acc)[4], int T, int tid)
{
    const int64_t row0 = (int64_t)tile * GFW_TC_ROWS, N = j.w.N;
    if (k0 == 0 && k1 == nb - 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t n = row0 + tc_frag_row(tid, i);
            const int tok = tc_frag_token(tid, i);
            if (n < N && tok < T)
                fp8_store_output(j.y, j.post, tok, n, N, acc[i]);
        }
        return false;
    }
    const int per = GFW_TC_ROWS * GFW_TC_TOKENS;
    float *slot = j.part + w * per; /* block w = tile * splits + its chunk */
#pragma unroll
    for (int i = 0; i < 4; i++)
        slot[tc_frag_row(tid, i) * GFW_TC_TOKENS + tc_frag_token(tid, i)] = acc[i];
    return true;
}

/**
 * Count the block's slot of tile @p tile; the tile's last block adds the slots in ascending K,
 * stores the outputs and resets the count.  Thread 0's count is a release of every consumer's
 * slot stores (ordered before it by the consumers' barrier) and an acquire of the other blocks'.
 */
__device__ __forceinline__ void tc_count(const tc_job &j, int nb, int tile, int T, const tc_smem &sm, int tid)
{
    const int64_t row0 = (int64_t)tile * GFW_TC_ROWS, N = j.w.N;
    const int64_t first = (int64_t)tile * j.splits, last = first + j.splits - 1;
    tc_consumers_sync();
    if (tid == 0) {
        unsigned before;
        asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], 1;" : "=r"(before) : "l"(j.count + tile) : "memory");
        *sm.bcast = before;
    }
    tc_consumers_sync();
    if (*sm.bcast != (unsigned)(last - first))
        return;
    const int per = GFW_TC_ROWS * GFW_TC_TOKENS;
    const float *slots = j.part + first * per;
    for (int o = tid; o < per; o += 128) {
        const int64_t n = row0 + o / GFW_TC_TOKENS;
        const int tok = o % GFW_TC_TOKENS;
        if (n >= N || tok >= T)
            continue;
        float v = 0.0f;
        for (int64_t s = 0; s <= last - first; s++)
            v = __fadd_rn(v, __ldcg(slots + s * per + o));
        fp8_store_output(j.y, j.post, tok, n, N, v);
    }
    if (tid == 0)
        j.count[tile] = 0u; /* for the next launch: every block of the tile has counted */
}

/** A consumer thread's place: its rows, the next stage it loads, the unit it sums, and the run's sums. */
struct tc_cons {
    int r0;        /**< its first row in the tile (the second is r0 + 8) */
    int t;         /**< lane % 4 */
    int lane;      /**< its lane */
    uint32_t xh_sa; /**< x's F16 tiles (shared address) */
    int ls;        /**< the stage loaded next */
    int lph;       /**< its phase parity */
    int tile;      /**< the tile of the unit summed next */
    int kb;        /**< its K block */
    int k0;        /**< the first block of the current run */
    float acc[4];  /**< the run's sums (tc_frag_row(), tc_frag_token()) */
};

/** Wait for the stage c.ls, read the thread's codes, give the stage back, convert them to F16 fragments @p f. */
__device__ __forceinline__ void tc_load(const tc_smem &sm, tc_cons &c, uint32_t (&f)[8][4])
{
    mbar_wait(sm.full + c.ls, c.lph);
    const uint8_t *st = sm.ring + c.ls * GFW_TC_STAGE_BYTES;
    const int c0 = ((2 * c.t) ^ (c.r0 & 7)) * 16, c1 = ((2 * c.t + 1) ^ (c.r0 & 7)) * 16; /* rows r0, r0 + 8 alike */
    const uint4 a_lo = *(const uint4 *)(st + c.r0 * GFW_TC_PITCH + c0), a_hi = *(const uint4 *)(st + c.r0 * GFW_TC_PITCH + c1);
    const uint4 b_lo = *(const uint4 *)(st + (c.r0 + 8) * GFW_TC_PITCH + c0),
                b_hi = *(const uint4 *)(st + (c.r0 + 8) * GFW_TC_PITCH + c1);
    __syncwarp();
    if (c.lane == 0)
        mbar_arrive(sm.empty + c.ls); /* the stage is in registers: the producer may refill it */
    const uint32_t ra[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
    const uint32_t rb[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
    for (int m = 0; m < 8; m++) {
        tc_e4m3x4_f16(ra[m], f[m][0], f[m][2]);
        tc_e4m3x4_f16(rb[m], f[m][1], f[m][3]);
    }
    if (++c.ls == GFW_TC_STAGES) {
        c.ls = 0;
        c.lph ^= 1;
    }
}

/**
 * Unit @p u of the block's range [.., @p u1): its 8 wgmmas from fragments @p cur, the next
 * unit's fragments loaded into @p next while they run, then the block partials' terms added to
 * the run, and at the end of a run in one tile the run stored or left in its slot.
 */
__device__ __forceinline__ void tc_unit(const tc_job &j, const tc_smem &sm, tc_cons &c, int u, int u1, int kb0, int nb,
                                        int64_t w, int T, int tid, uint32_t (&cur)[8][4], uint32_t (&next)[8][4],
                                        int (&pend)[2], int &pending)
{
    const int xi = (c.kb - kb0 + nb) % nb;
    /* the weight's scale byte asked for first: its latency passes while the wgmmas run */
    const uint8_t swb = __ldg(j.w.s + ((int64_t)c.tile * GFW_TC_ROWS >> 7) * j.w.scols + c.kb);
    float e[2][4];
    wgmma_fence();
#pragma unroll
    for (int m = 0; m < 8; m++)
        wgmma_rs<8>::mma(e[m & 1], cur[m], wgmma_desc_sw128(c.xh_sa + (xi * 2 + (m >> 2)) * 1024) + 2 * (m & 3),
                         m >= 2);
    wgmma_commit();
    if (u + 1 < u1)
        tc_load(sm, c, next);
    wgmma_wait_all();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        reg_fence(e[0][i]);
        reg_fence(e[1][i]);
    }
    /* the wgmmas read cur until the wait: keep its registers from the loads above */
#pragma unroll
    for (int m = 0; m < 8; m++)
        asm volatile("" : "+r"(cur[m][0]), "+r"(cur[m][1]), "+r"(cur[m][2]), "+r"(cur[m][3])::"memory");
    const float sw = gfw_ue8m0(swb);
    const float s0 = __fmul_rn(sm.xsc[xi * GFW_TC_TOKENS + 2 * c.t], sw), s1 = __fmul_rn(sm.xsc[xi * GFW_TC_TOKENS + 2 * c.t + 1], sw);
    c.acc[0] = __fadd_rn(c.acc[0], __fmul_rn(__fadd_rn(e[0][0], e[1][0]), s0));
    c.acc[1] = __fadd_rn(c.acc[1], __fmul_rn(__fadd_rn(e[0][1], e[1][1]), s1));
    c.acc[2] = __fadd_rn(c.acc[2], __fmul_rn(__fadd_rn(e[0][2], e[1][2]), s0));
    c.acc[3] = __fadd_rn(c.acc[3], __fmul_rn(__fadd_rn(e[0][3], e[1][3]), s1));
    const bool tile_ends = c.kb + 1 == nb;
    if (u + 1 == u1 || tile_ends) {
        if (tc_end_run(j, nb, c.tile, c.k0, c.kb, w, c.acc, T, tid))
            pend[pending++] = c.tile;
        c.acc[0] = c.acc[1] = c.acc[2] = c.acc[3] = 0.0f;
        c.k0 = 0;
    }
    if (tile_ends) {
        c.kb = 0;
        c.tile++;
    } else {
        c.kb++;
    }
}

/**
 * The FP8 linear of T <= 8 quantized rows by wgmma (the chapter): block b of the grid is block
 * b of the first linear's, then of the second's.
 */
__global__ void __launch_bounds__(GFW_TC_THREADS, GFW_TC_BLOCKS_PER_SM)
    k_linear_fp8_tc(const uint8_t *xq, const float *xs, int T, const __grid_constant__ tc_plan p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t tc_raw[];
    const tc_smem sm = tc_carve(tc_raw);
    const int64_t b = blockIdx.x;
    const bool second = b >= p.j0.blocks;
    const tc_job &j = second ? p.j1 : p.j0;
    const int64_t w = second ? b - p.j0.blocks : b;
    const int nb = p.nb;
    int u0, u1;
    tc_range(j, nb, w, &u0, &u1);
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < GFW_TC_STAGES; s++) {
            mbar_init(sm.full + s, 1);
            mbar_init(sm.empty + s, 4);
        }
        fence_proxy_async_smem();
    }
    __syncthreads();
    if (tid >= 128) { /* the producer: the weight is no kernel's output, so it starts before the wait */
        tc_produce(j, nb, u0, u1, sm, tid - 128);
        return;
    }
    gfw_pdl_enter();
    const int kb0 = u0 % nb, nx = u1 - u0 < nb ? u1 - u0 : nb;
    tc_fill_x(xq, xs, T, j.w.K, nb, kb0, nx, sm, tid);
    fence_proxy_async_smem();
    tc_consumers_sync();
    const int lane = tid & 31, warp = tid >> 5;
    tc_cons c;
    c.r0 = 16 * warp + (lane >> 2);
    c.t = lane & 3;
    c.lane = lane;
    c.xh_sa = smem_u32(sm.xh);
    c.tile = u0 / nb;
    c.kb = c.k0 = kb0;
    c.ls = c.lph = 0;
    c.acc[0] = c.acc[1] = c.acc[2] = c.acc[3] = 0.0f;
    int pending = 0, pend[2] = {0, 0};
    /* two fragment sets that take turns: the next unit's are loaded while this one's wgmmas run */
    uint32_t fa[8][4], fb[8][4];
    tc_load(sm, c, fa);
    for (int u = u0; u < u1; u += 2) {
        tc_unit(j, sm, c, u, u1, kb0, nb, w, T, tid, fa, fb, pend, pending);
        if (u + 1 >= u1)
            break;
        tc_unit(j, sm, c, u + 1, u1, kb0, nb, w, T, tid, fb, fa, pend, pending);
    }
    for (int i = 0; i < pending; i++)
        tc_count(j, nb, pend[i], T, sm, tid);
#endif
}

/**
 * Whether k_linear_fp8_tc serves @p w for T rows of x codes @p xq: 1 <= T <= 8 tokens,
 * 128x128 scale blocks, 16-byte aligned codes (K a multiple of 128 keeps every row aligned),
 * K <= 16384 (the bound's premise).
 */
static bool tc_serves(const uint8_t *xq, int64_t T, const dfp8 &w)
{
    return T >= 1 && T <= GFW_TC_TOKENS && fp8_blocks128(xq, w) && ((uintptr_t)xq & 15) == 0 && w.K % 128 == 0 &&
           w.K <= 16384;
}

/**
 * Whether the current device runs k_linear_fp8_tc: its body is compiled for sm_90a only (wgmma
 * is not part of sm_100a), so the `tc` recipe is refused elsewhere, with the device named.
 */
static mmoe_status tc_device_check(mmoe_error *err)
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return mmoe_error_set(err, MMOE_ENODEV, "fp8 linears (tc): cannot read the device's compute capability");
    if (major != 9)
        return mmoe_error_set(err, MMOE_EUNSUPPORTED,
                              "fp8 linears: the tc recipe's kernel (wgmma) is built for sm_90a; device %d is sm_%d%d: "
                              "use %s=exact",
                              dev, major, minor, MMOE_GPU_FP8_LINEARS_ENV);
    return MMOE_OK;
}

/** Let k_linear_fp8_tc have its GFW_TC_SMEM bytes of dynamic shared memory (more than the default 48 KiB). */
static cudaError_t tc_allow_smem(void)
{
    return cudaFuncSetAttribute(k_linear_fp8_tc, cudaFuncAttributeMaxDynamicSharedMemorySize, GFW_TC_SMEM);
}

/**
 * The tensor map of @p w's codes for the producer's copies: a 2-D byte tensor of K columns and
 * N rows (the checkpoint's layout), boxes of 128 bytes x GFW_TC_ROWS rows with the 128-byte
 * swizzle, rows past N read as zeros (their sums are never stored).  The encoder is the
 * driver's, reached through the runtime (no link against libcuda).  False where it fails.
 */
static bool tc_encode_map(CUtensorMap *map, const dfp8 &w)
{
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || fn == NULL)
        return false;
    const cuuint64_t dim[2] = {(cuuint64_t)w.K, (cuuint64_t)w.N}, stride[1] = {(cuuint64_t)w.K};
    const cuuint32_t box[2] = {128, GFW_TC_ROWS}, estride[2] = {1, 1};
    return ((encode_fn)fn)(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)w.w, dim, stride, box, estride,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/**
 * The job of k_linear_fp8_tc for @p w, given about @p share blocks (the chapter's "Work"): whole
 * tiles where there are at least as many tiles as blocks, else each tile cut into chunks of K;
 * its partials and counts from @p part, @p count, the floats and counts it uses added to
 * @p floats, @p counts.
 */
static tc_job tc_job_for(const dfp8 &w, uint16_t *y, fp8_hc_post post, int nb, int64_t share, float *part,
                         unsigned *count, int64_t *floats, int64_t *counts)
{
    tc_job j;
    memset(&j, 0, sizeof j);
    j.w = w;
    j.y = y;
    j.post = post;
    j.tiles = (int)((w.N + GFW_TC_ROWS - 1) / GFW_TC_ROWS);
    share = share < 1 ? 1 : share;
    /* as many chunks a tile as the share allows, at least GFW_TC_MIN_UNITS blocks a chunk, at
       most GFW_TC_XBLOCKS (the x a block holds) */
    int64_t s = share / j.tiles;
    const int64_t s_max = (nb + GFW_TC_MIN_UNITS - 1) / GFW_TC_MIN_UNITS, s_min = (nb + GFW_TC_XBLOCKS - 1) / GFW_TC_XBLOCKS;
    s = s > s_max ? s_max : s;
    s = s < s_min ? s_min : s;
    s = s < 1 ? 1 : s;
    j.chunk = (int)((nb + s - 1) / s);
    j.splits = (int)((nb + j.chunk - 1) / j.chunk);
    if (j.splits == 1) {
        j.tpc = (int)((j.tiles + share - 1) / share);
        j.blocks = (j.tiles + j.tpc - 1) / j.tpc;
    } else {
        j.tpc = 1;
        j.blocks = j.tiles * j.splits;
    }
    j.part = part;
    j.count = count;
    *floats += j.splits > 1 ? (int64_t)j.tiles * j.splits * GFW_TC_ROWS * GFW_TC_TOKENS : 0;
    *counts += j.tiles;
    return j;
}

/**
 * Launch y0 = fp8_linear(x) with @p w0 (and its hc_post @p p0) and, with @p w1, y1 = fp8_linear(x)
 * in the same launch, by k_linear_fp8_tc (the chapter) for T quantized rows: the grid's wave of
 * GFW_TC_BLOCKS_PER_SM blocks on each of @p n_sm multiprocessors shared between the two in
 * proportion to their units.  Returns false and launches nothing where the kernel does not serve
 * a weight (tc_serves()), @p p0 updates another number of streams than GFW_FP8_HC_POST_HC, the
 * partials do not fit @p ws, or a tensor map cannot be made.  The device must be one that
 * tc_device_check() accepts, and upload_tables() must have run on it (tc_allow_smem()).
 */
static bool launch_linear_fp8_tc(const uint8_t *xq, const float *xs, int64_t T, const dfp8 &w0, uint16_t *y0,
                                 fp8_hc_post p0, const dfp8 *w1, uint16_t *y1, const gfw_tc_ws &ws, int n_sm,
                                 cudaStream_t st)
{
    if (!tc_serves(xq, T, w0) || (w1 != NULL && (!tc_serves(xq, T, *w1) || w1->K != w0.K)) ||
        (p0.X != NULL && p0.hc != GFW_FP8_HC_POST_HC))
        return false;
    const int nb = (int)(w0.K / 128);
    const int64_t u0 = (w0.N + GFW_TC_ROWS - 1) / GFW_TC_ROWS * nb;
    const int64_t u1 = w1 != NULL ? (w1->N + GFW_TC_ROWS - 1) / GFW_TC_ROWS * nb : 0;
    if ((u0 + u1) / nb > GFW_TC_COUNTS)
        return false;
    const int64_t wave = (int64_t)(n_sm > 0 ? n_sm : 1) * GFW_TC_BLOCKS_PER_SM;
    const int64_t b0 = w1 != NULL ? (wave * u0 + (u0 + u1) / 2) / (u0 + u1) : wave;
    const int64_t b1 = w1 != NULL ? wave - b0 : 0;
    int64_t floats = 0, counts = 0;
    tc_plan p;
    p.nb = nb;
    p.j0 = tc_job_for(w0, y0, p0, nb, b0, ws.part, ws.count, &floats, &counts);
    if (w1 != NULL) {
        p.j1 = tc_job_for(*w1, y1, fp8_no_hc_post(), nb, b1, ws.part + floats, ws.count + counts, &floats, &counts);
    } else {
        p.j1 = p.j0;
        p.j1.blocks = 0;
    }
    if (floats > GFW_TC_PART_FLOATS || counts > GFW_TC_COUNTS)
        return false;
    if (!tc_encode_map(&p.j0.map, w0) || (w1 != NULL && !tc_encode_map(&p.j1.map, *w1)))
        return false;
    mmoe_launch_pdl(k_linear_fp8_tc, (unsigned)(p.j0.blocks + p.j1.blocks), GFW_TC_THREADS, GFW_TC_SMEM, st, xq, xs,
                    (int)T, p);
    return true;
}

#endif /* MMOE_GPU_LINEAR_FP8_TC_CUH */
