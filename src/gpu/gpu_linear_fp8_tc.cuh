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
 * instruction issue, not by memory: about 255 instructions per kilobyte of weights and warp,
 * 1.4 to 1.9 TB/s (docs/perf.md, "Tenth pass").  A tensor core takes 4096 products in one
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
 * \f$\tilde p_\kappa\f$ is the sum of the block's 128 products by eight
 * `mma.sync.m16n8k16` F16 MMAs with FP32 accumulation (two chains of four from \f$+0\f$,
 * added): every E4M3 value is an F16 value exactly (`cvt.rn.f16x2.e4m3x2`, NaN codes to NaN),
 * and a product of two F16 values is exact in the tensor core.  The terms of a row are added
 * in ascending block order within each warp's run of blocks, and the runs' sums in ascending
 * K (a tile summed by one warp: the oracle's order of the terms).
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
 * A *tile* is 16 weight rows (the MMA's M) for all T <= 8 tokens (the MMA's N: tokens past T
 * are columns whose sums are never stored), a *unit* one tile's 128-wide K block: 2 KB of codes.
 * Lane \f$4g + t\f$ holds the 32 codes \f$[16t, 16t + 16) \cup [64 + 16t, 80 + 16t)\f$ of the
 * block from rows \f$g\f$ and \f$g + 8\f$ of the tile and from token \f$g\f$'s x (so that
 * the four lanes of a row copy 64 contiguous bytes, whole 32-byte sectors, with each
 * instruction), and uses word \f$m\f$ of them in MMA step \f$m\f$: its low two codes as
 * the fragment's \f$k = 2t, 2t+1\f$, its high two as \f$k = 2t + 8, 2t + 9\f$.  A dot
 * product does not depend on the order of its K, so weight and x need only agree, and they do:
 * both take the same permutation, which lets every lane copy whole 16-byte pieces of a row (no
 * shuffle of the checkpoint's layout, no second copy of the weight).  A unit costs a lane four
 * 16-byte copies, four shared loads, two loads of x (an L2 hit), 48 conversions and 8 MMAs;
 * with the bookkeeping, Nsight Compute counts about 320 warp instructions a unit (2 KB of
 * weights), against about 510 for the exact kernel's same 2 KB, and the kernel is bound by
 * latency rather than by issue or memory (docs/perf.md, "Fourteenth pass").
 *
 * ## One wave, a copy ring per warp
 *
 * The grid is one wave (GFW_TC_BLOCKS_PER_SM blocks of GFW_TC_WARPS warps on every
 * multiprocessor), and the launch's units, tile-major (the first linear's tiles, then the
 * second's: wq_a with wkv), are shared out evenly: warp w streams units
 * \f$[\lfloor wU/W \rfloor, \lfloor (w+1)U/W \rfloor)\f$ (tc_plan) through a ring of
 * GFW_TC_RING slots in shared memory filled by cp.async, GFW_TC_RING - 1 units (6 KB) in
 * flight while it sums one, the first ones copied before the kernel waits for the one before it
 * (a weight is no kernel's output).  Each lane copies and later reads only its own bytes, so
 * its `cp.async.wait_group` is the whole synchronisation.  A warp adds its terms in ascending
 * K while its units stay in one tile; where its run ends, the run is either the whole tile
 * (the output is stored: the oracle's order of the terms) or a part of it, written to the
 * tile's slot for that warp (a range has at most two such runs, its first and its last).  When
 * its range is done, and so no copy of its ring is in flight, the warp counts its partial runs
 * (an atomic add with release semantics per tile: the fence it implies would otherwise wait for
 * the ring's copies); the warp that counts a tile last adds the slots in ascending K, stores,
 * and resets the count for the next launch.  The partials and counts (gfw_tc_ws) belong to
 * the model.
 */
#ifndef MMOE_GPU_LINEAR_FP8_TC_CUH
/** Include guard (this file is included in the middle of gpu_forward.cu). */
#define MMOE_GPU_LINEAR_FP8_TC_CUH

/** Warps of one k_linear_fp8_tc block (each works alone). */
#define GFW_TC_WARPS 4
/** Blocks of k_linear_fp8_tc per multiprocessor: the grid is one wave of them. */
#define GFW_TC_BLOCKS_PER_SM 5
/** Weight rows of a tile: the MMA's M. */
#define GFW_TC_ROWS 16
/** Most tokens of a call: the MMA's N. */
#define GFW_TC_TOKENS 8
/** Fewest units a warp streams where the wave would give it fewer (launch_linear_fp8_tc()). */
#define GFW_TC_MIN_UNITS 4
/** Units (a tile's K block, 2 KB of codes) in a warp's copy ring: GFW_TC_RING - 1 in flight while one is summed. */
#define GFW_TC_RING 4
/** Bytes of one ring slot: a lane's four 16-byte pieces (rows g and g + 8, two each), for 32 lanes. */
#define GFW_TC_SLOT_BYTES (4 * 16 * 32)
/** Floats of the partials buffer (gfw_tc_ws::part): 4 MB. */
#define GFW_TC_PART_FLOATS (1 << 20)
/** Counts of the partials buffer (gfw_tc_ws::count): tiles of one launch. */
#define GFW_TC_COUNTS 8192

/** The model's work space of k_linear_fp8_tc: partial sums of shared tiles and a count per tile (zero between launches). */
struct gfw_tc_ws {
    float *part;     /**< GFW_TC_PART_FLOATS floats */
    unsigned *count; /**< GFW_TC_COUNTS counts, zero between launches */
};

/** One linear of a k_linear_fp8_tc launch. */
struct tc_job {
    dfp8 w;           /**< the weight (128x128 scale blocks) */
    uint16_t *y;      /**< its output [T, w.N] */
    fp8_hc_post post; /**< an hc_post of the output after it is written, or none (X NULL) */
    int64_t tiles;    /**< ceil(N / GFW_TC_ROWS) */
};

/**
 * How a k_linear_fp8_tc launch shares its units out: U = (tiles of both jobs) x nb units in
 * tile-major order (j0's tiles, then j1's), warp w of W <= U takes units
 * [floor(w U / W), floor((w + 1) U / W)), at least one.
 */
struct tc_plan {
    tc_job j0;        /**< the first linear */
    tc_job j1;        /**< the second (j1.tiles = 0: none) */
    int nb;           /**< K blocks of both (the same K) */
    int64_t units;    /**< U */
    int64_t warps;    /**< W */
    int slots;        /**< partial slots per tile: the most warps one tile can span */
    float *part;      /**< [tiles, slots, 16 rows, 8 tokens] */
    unsigned *count;  /**< [tiles] */
};

/** First unit of warp @p w. */
__host__ __device__ __forceinline__ int64_t tc_unit0(const tc_plan &p, int64_t w) { return w * p.units / p.warps; }

/** The warp whose range holds unit @p u: the largest w with tc_unit0(w) <= u. */
__host__ __device__ __forceinline__ int64_t tc_warp_of(const tc_plan &p, int64_t u)
{
    return ((u + 1) * p.warps + p.units - 1) / p.units - 1;
}

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

/** d += A B, one m16n8k16 F16 MMA with FP32 accumulation (fragments in the PTX layout). */
__device__ __forceinline__ void tc_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/** A lane's 32 codes of one K block for one row or token: two 16-byte pieces, 64 codes apart. */
struct tc_codes {
    uint4 lo; /**< codes 0..15: piece 0 */
    uint4 hi; /**< codes 16..31: piece 1 */
};

/** Word @p m (0..7) of a lane's 32 codes. */
__device__ __forceinline__ uint32_t tc_word(const tc_codes &c, int m)
{
    const uint4 &q = m < 4 ? c.lo : c.hi;
    const int i = m & 3;
    return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

/**
 * The block partials of the tile's rows g and g + 8 (@p r0, @p r1) and token g's x (@p xv)
 * for tokens 2t, 2t + 1 into @p d (d[0], d[1]: row g; d[2], d[3]: row g + 8): word m of each
 * lane's codes in MMA step m (the chapter's K permutation), the even steps and the odd ones in
 * two chains from +0 (half the dependent MMAs), added at the end.
 */
__device__ __forceinline__ void tc_block_partials(const tc_codes &r0, const tc_codes &r1, const tc_codes &xv,
                                                  float (&d)[4])
{
    float e[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int m = 0; m < 8; m++) {
        uint32_t a0, a2, a1, a3, b0, b1;
        tc_e4m3x4_f16(tc_word(r0, m), a0, a2);
        tc_e4m3x4_f16(tc_word(r1, m), a1, a3);
        tc_e4m3x4_f16(tc_word(xv, m), b0, b1);
        tc_mma(e[m & 1], a0, a1, a2, a3, b0, b1);
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
        d[i] = __fadd_rn(e[0][i], e[1][i]);
}

/** The row (g or g + 8, within the tile) of output @p i (0..3) of a lane's fragment. */
__device__ __forceinline__ int tc_frag_row(int lane, int i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
/** The token (2t or 2t + 1) of output @p i of a lane's fragment. */
__device__ __forceinline__ int tc_frag_token(int lane, int i) { return 2 * (lane & 3) + (i & 1); }

/** Writes output @p v of token @p t, row @p n of @p j (bf16), and its hc_post where the job has one. */
__device__ __forceinline__ void tc_store(const tc_job &j, int64_t t, int64_t n, float v)
{
    fp8_store_output(j.y, j.post, t, n, j.w.N, v);
}

/** A unit of the launch: its job, tile (within the job and in the launch) and K block. */
struct tc_unit {
    bool second; /**< j1's */
    int tile;    /**< within its job */
    int gtile;   /**< in the launch (fewer than GFW_TC_COUNTS) */
    int kb;      /**< K block */
};

/** Unit @p u of the plan (two divisions: once a warp). */
__device__ __forceinline__ tc_unit tc_unit_at(const tc_plan &p, int64_t u)
{
    tc_unit x;
    x.gtile = (int)(u / p.nb);
    x.kb = (int)(u % p.nb);
    x.second = x.gtile >= p.j0.tiles;
    x.tile = x.second ? x.gtile - (int)p.j0.tiles : x.gtile;
    return x;
}

/** The unit after @p x (the next K block, or the next tile's first). */
__device__ __forceinline__ tc_unit tc_unit_next(const tc_plan &p, tc_unit x)
{
    if (++x.kb == p.nb) {
        x.kb = 0;
        x.gtile++;
        x.tile++;
        if (!x.second && x.gtile == (int)p.j0.tiles) {
            x.second = true;
            x.tile = 0;
        }
    }
    return x;
}

/** Lane's first codes of a unit's block in rows g and g + 8 of its tile. */
struct tc_rows {
    const uint8_t *a; /**< row g */
    const uint8_t *b; /**< row g + 8 */
};

/** Lane's first codes of unit @p x, piece 0 (piece 1 is 64 codes on; rows past N read row N - 1: never stored). */
__device__ __forceinline__ tc_rows tc_rows_at(const tc_plan &p, const tc_unit &x, int lane)
{
    const dfp8 &w = x.second ? p.j1.w : p.j0.w;
    const int g = lane >> 2, t = lane & 3;
    const int64_t n0 = x.tile * GFW_TC_ROWS + g, n1 = n0 + 8;
    const uint8_t *base = w.w + (int64_t)x.kb * 128 + 16 * t;
    return tc_rows{base + (n0 < w.N ? n0 : w.N - 1) * w.K, base + (n1 < w.N ? n1 : w.N - 1) * w.K};
}

/** The rows of the unit after @p x, now @p nx: the next block, or the next tile's from scratch. */
__device__ __forceinline__ tc_rows tc_rows_next(const tc_plan &p, tc_rows r, const tc_unit &nx, int lane)
{
    if (nx.kb == 0)
        return tc_rows_at(p, nx, lane);
    r.a += 128;
    r.b += 128;
    return r;
}

/** The scale row of unit @p x's tile (a tile lies in one 128-row scale block). */
__device__ __forceinline__ const uint8_t *tc_scale_row(const tc_plan &p, const tc_unit &x)
{
    const dfp8 &w = x.second ? p.j1.w : p.j0.w;
    return w.s + ((x.tile * GFW_TC_ROWS) >> 7) * w.scols;
}

/**
 * Lane's copies of unit @p u at @p r (rows g and g + 8, 32 codes each) into ring slot
 * @p slot_sa (piece i of the lane at slot + 512 i + 16 lane), as one group; an empty group past
 * @p u_end.
 */
__device__ __forceinline__ void tc_issue(const tc_rows &r, int u, int u_end, int lane, unsigned slot_sa)
{
    if (u < u_end) {
        cp_async16_sa(slot_sa + 16 * lane, r.a);
        cp_async16_sa(slot_sa + 512 + 16 * lane, r.a + 64);
        cp_async16_sa(slot_sa + 1024 + 16 * lane, r.b);
        cp_async16_sa(slot_sa + 1536 + 16 * lane, r.b + 64);
    }
    cp_async_commit();
}

/** Where a lane reads what it needs of a unit besides the weight (tokens past T read token T - 1: never stored). */
struct tc_side_src {
    const uint8_t *px;       /**< token g's codes of block 0, lane's 32 */
    const float *xs0;        /**< the x scales of token 2t, block 0 */
    const float *xs1;        /**< the x scales of token 2t + 1, block 0 */
    const uint8_t *sw_row;   /**< the current tile's weight scale row */
};

/** What a lane reads of a unit besides the weight: token g's 32 codes, the weight's scale byte, tokens 2t, 2t + 1's x scales. */
struct tc_side {
    tc_codes xv;  /**< token g's codes */
    uint8_t swb;  /**< the weight's scale byte */
    float x0;     /**< token 2t's x scale */
    float x1;     /**< token 2t + 1's x scale */
};

/** Lane's side inputs of block @p kb. */
__device__ __forceinline__ tc_side tc_side_load(const tc_side_src &src, int kb)
{
    tc_side sd;
    const uint8_t *px = src.px + kb * 128;
    sd.xv.lo = __ldg((const uint4 *)px);
    sd.xv.hi = __ldg((const uint4 *)(px + 64));
    sd.swb = src.sw_row[kb];
    sd.x0 = src.xs0[kb];
    sd.x1 = src.xs1[kb];
    return sd;
}

/** The first and last warps whose ranges hold units of tile @p gtile. */
__device__ __forceinline__ void tc_tile_warps(const tc_plan &p, int gtile, int64_t *first, int64_t *last)
{
    *first = tc_warp_of(p, (int64_t)gtile * p.nb);
    *last = tc_warp_of(p, (int64_t)gtile * p.nb + p.nb - 1);
}

/**
 * The end of a warp's run of units in tile @p x, sums @p acc: stored at once when the run is
 * the whole tile (returns false); else written to the run's slot (the warp's place among the
 * tile's warps) with plain stores, and the tile is left for tc_count() (returns true).
 */
__device__ __forceinline__ bool tc_end_run(const tc_plan &p, const tc_unit &x, int64_t w, const float (&acc)[4], int T,
                                           int lane)
{
    const tc_job &j = x.second ? p.j1 : p.j0;
    const int64_t row0 = (int64_t)x.tile * GFW_TC_ROWS, N = j.w.N;
    int64_t first, last;
    tc_tile_warps(p, x.gtile, &first, &last);
    if (first == last) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t n = row0 + tc_frag_row(lane, i);
            const int tok = tc_frag_token(lane, i);
            if (n < N && tok < T)
                tc_store(j, tok, n, acc[i]);
        }
        return false;
    }
    const int per = GFW_TC_ROWS * GFW_TC_TOKENS;
    float *slot = p.part + ((int64_t)x.gtile * p.slots + (w - first)) * per;
#pragma unroll
    for (int i = 0; i < 4; i++)
        slot[tc_frag_row(lane, i) * GFW_TC_TOKENS + tc_frag_token(lane, i)] = acc[i];
    return true;
}

/**
 * Count the warp's slot of tile @p x, whose partial sums it wrote (tc_end_run()), and if it is
 * the tile's last warp to count, add the tile's slots in order (ascending K), store the
 * outputs and reset the count for the next launch.  Lane 0's count is a release (its MEMBAR
 * waits for the warp's slot stores, ordered before it by the warp barrier): called once the
 * warp's copies are all consumed, so the barrier drains nothing of its ring.  The last warp
 * reads the slots from L2 (ld.global.cg), where the release made them visible.
 */
__device__ __forceinline__ void tc_count(const tc_plan &p, const tc_unit &x, int T, int lane)
{
    const tc_job &j = x.second ? p.j1 : p.j0;
    const int64_t row0 = (int64_t)x.tile * GFW_TC_ROWS, N = j.w.N;
    int64_t first, last;
    tc_tile_warps(p, x.gtile, &first, &last);
    __syncwarp();
    unsigned before = 0;
    if (lane == 0)
        asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;" : "=r"(before) : "l"(p.count + x.gtile) : "memory");
    before = __shfl_sync(0xFFFFFFFFu, before, 0);
    if (before != (unsigned)(last - first))
        return;
    const int per = GFW_TC_ROWS * GFW_TC_TOKENS;
    const float *slots = p.part + (int64_t)x.gtile * p.slots * per;
    for (int o = lane; o < per; o += 32) {
        const int64_t n = row0 + o / GFW_TC_TOKENS;
        const int tok = o % GFW_TC_TOKENS;
        if (n >= N || tok >= T)
            continue;
        float v = 0.0f;
        for (int64_t s = 0; s <= last - first; s++)
            v = __fadd_rn(v, __ldcg(slots + s * per + o));
        tc_store(j, tok, n, v);
    }
    if (lane == 0)
        p.count[x.gtile] = 0u; /* for the next launch: every warp of the tile has counted */
}

/** A warp's place in its stream of units: the unit summed, the unit copied next, and its sums. */
struct tc_stream {
    tc_unit x;      /**< the unit summed next */
    tc_unit in;     /**< the unit copied next */
    tc_rows ir;     /**< that unit's codes */
    tc_side_src ss; /**< where the side inputs are read (the summed unit's tile) */
    float acc[4];   /**< the sums of the current run (tc_frag_row(), tc_frag_token()) */
    int pending;    /**< partial runs written, not yet counted (at most two: a range's first and last run) */
    int pend0;      /**< the first one's tile (in the launch) */
    int pend1;      /**< the second one's tile */
};

/**
 * Unit @p u of the warp's range [u0, u1): wait for its copy, read it, refill the slot read
 * before with unit u + GFW_TC_RING - 1, load the next unit's side inputs into @p next while
 * this one's (@p cur, loaded one unit earlier) are used, add the block's terms, and at the end
 * of a run in one tile store it or leave it for tc_count() (tc_end_run()).
 */
__device__ __forceinline__ void tc_step(const tc_plan &p, tc_stream &st, int u, int u0, int u1, const tc_side &cur,
                                        tc_side &next, uint8_t (*ring)[GFW_TC_SLOT_BYTES], unsigned ring_sa,
                                        int64_t w, int T, int lane)
{
    cp_async_wait<GFW_TC_RING - 2>(); /* unit u's group has landed in this lane's bytes */
    const uint8_t *slot = &ring[(u - u0) % GFW_TC_RING][16 * lane];
    tc_codes ra, rb;
    ra.lo = *(const uint4 *)slot;
    ra.hi = *(const uint4 *)(slot + 512);
    rb.lo = *(const uint4 *)(slot + 1024);
    rb.hi = *(const uint4 *)(slot + 1536);
    /* the slot read in the previous step is free again: refill it GFW_TC_RING - 1 units ahead */
    tc_issue(st.ir, u + GFW_TC_RING - 1, u1, lane, ring_sa + ((u - u0 + GFW_TC_RING - 1) % GFW_TC_RING) * GFW_TC_SLOT_BYTES);
    st.in = tc_unit_next(p, st.in);
    st.ir = tc_rows_next(p, st.ir, st.in, lane);
    const bool more = u + 1 < u1;
    const tc_unit nx = tc_unit_next(p, st.x);
    if (more && nx.kb == 0)
        st.ss.sw_row = tc_scale_row(p, nx);
    next = tc_side_load(st.ss, more ? nx.kb : st.x.kb);
    float d[4];
    tc_block_partials(ra, rb, cur.xv, d);
    const float sw = gfw_ue8m0(cur.swb);
    const float s0 = __fmul_rn(cur.x0, sw), s1 = __fmul_rn(cur.x1, sw);
    st.acc[0] = __fadd_rn(st.acc[0], __fmul_rn(d[0], s0));
    st.acc[1] = __fadd_rn(st.acc[1], __fmul_rn(d[1], s1));
    st.acc[2] = __fadd_rn(st.acc[2], __fmul_rn(d[2], s0));
    st.acc[3] = __fadd_rn(st.acc[3], __fmul_rn(d[3], s1));
    if (!more || nx.gtile != st.x.gtile) {
        if (tc_end_run(p, st.x, w, st.acc, T, lane)) {
            if (st.pending == 0)
                st.pend0 = st.x.gtile;
            else
                st.pend1 = st.x.gtile;
            st.pending++;
        }
        st.acc[0] = st.acc[1] = st.acc[2] = st.acc[3] = 0.0f;
    }
    st.x = nx;
}

/**
 * The FP8 linear of T <= 8 quantized rows on the tensor cores (the chapter): one wave of
 * warps, warp w streaming its units [tc_unit0(w), tc_unit0(w + 1)) through its copy ring.
 */
__global__ void __launch_bounds__(GFW_TC_WARPS * 32, GFW_TC_BLOCKS_PER_SM)
    k_linear_fp8_tc(const uint8_t *xq, const float *xs, int T, tc_plan p)
{
    __shared__ __align__(16) uint8_t ring[GFW_TC_WARPS][GFW_TC_RING][GFW_TC_SLOT_BYTES];
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int64_t w = (int64_t)blockIdx.x * GFW_TC_WARPS + wib;
    /* fewer than GFW_TC_COUNTS tiles of at most 128 blocks: unit numbers fit an int */
    const int u0 = w < p.warps ? (int)tc_unit0(p, w) : 0, u1 = w < p.warps ? (int)tc_unit0(p, w + 1) : 0;
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(&ring[wib][0][0]);
    /* the weight is no kernel's output: the first units are copied before the wait */
    tc_unit x = tc_unit_at(p, u0), in = x; /* the unit summed, the next unit copied */
    tc_rows ir = tc_rows_at(p, in, lane);
#pragma unroll
    for (int i = 0; i < GFW_TC_RING - 1; i++) {
        tc_issue(ir, u0 + i, u1, lane, ring_sa + i * GFW_TC_SLOT_BYTES);
        in = tc_unit_next(p, in);
        ir = tc_rows_next(p, ir, in, lane);
    }
    gfw_pdl_enter();
    if (u0 >= u1)
        return;
    const int g = lane >> 2, t = lane & 3;
    const int tg = g < T ? g : T - 1, t0 = 2 * t < T ? 2 * t : T - 1, t1 = 2 * t + 1 < T ? 2 * t + 1 : T - 1;
    tc_side_src ss;
    ss.px = xq + (int64_t)tg * p.j0.w.K + 16 * t; /* both linears have the same K */
    ss.xs0 = xs + (int64_t)t0 * p.nb;
    ss.xs1 = xs + (int64_t)t1 * p.nb;
    ss.sw_row = tc_scale_row(p, x);
    tc_stream st = {x, in, ir, ss, {0.0f, 0.0f, 0.0f, 0.0f}, 0, 0, 0};
    /* two units an iteration, their side inputs in two sets of registers that take turns: the
       loads for the next unit land while this one is summed, and no move waits for them */
    tc_side sa = tc_side_load(ss, x.kb), sb;
    for (int u = u0; u < u1; u += 2) {
        tc_step(p, st, u, u0, u1, sa, sb, ring[wib], ring_sa, w, T, lane);
        if (u + 1 >= u1)
            break;
        tc_step(p, st, u + 1, u0, u1, sb, sa, ring[wib], ring_sa, w, T, lane);
    }
    /* the partial runs counted at the end, when no copy is in flight */
    if (st.pending > 0)
        tc_count(p, tc_unit_at(p, (int64_t)st.pend0 * p.nb), T, lane);
    if (st.pending > 1)
        tc_count(p, tc_unit_at(p, (int64_t)st.pend1 * p.nb), T, lane);
}

/**
 * Ask for the largest shared-memory carveout for k_linear_fp8_tc, so that its one wave of
 * GFW_TC_BLOCKS_PER_SM blocks (32 KB of rings each) is resident at once on every multiprocessor
 * (a smaller carveout would leave part of the grid for a second wave).
 */
static cudaError_t tc_allow_smem(void)
{
    return cudaFuncSetAttribute(k_linear_fp8_tc, cudaFuncAttributePreferredSharedMemoryCarveout,
                                (int)cudaSharedmemCarveoutMaxShared);
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

/** The job of k_linear_fp8_tc for @p w. */
static tc_job tc_job_for(const dfp8 &w, uint16_t *y, fp8_hc_post post)
{
    tc_job j;
    j.w = w;
    j.y = y;
    j.post = post;
    j.tiles = (w.N + GFW_TC_ROWS - 1) / GFW_TC_ROWS;
    return j;
}

/**
 * Launch y0 = fp8_linear(x) with @p w0 (and its hc_post @p p0) and, with @p w1, y1 = fp8_linear(x)
 * in the same launch, on the tensor cores (the chapter) for T quantized rows: one wave of
 * GFW_TC_BLOCKS_PER_SM blocks on each of @p n_sm multiprocessors, the units of both shared
 * out evenly.  Returns false and launches nothing where the kernel does not serve a weight
 * (tc_serves()), @p p0 updates another number of streams than GFW_FP8_HC_POST_HC, or the
 * partials do not fit @p ws.
 */
static bool launch_linear_fp8_tc(const uint8_t *xq, const float *xs, int64_t T, const dfp8 &w0, uint16_t *y0,
                                 fp8_hc_post p0, const dfp8 *w1, uint16_t *y1, const gfw_tc_ws &ws, int n_sm,
                                 cudaStream_t st)
{
    if (!tc_serves(xq, T, w0) || (w1 != NULL && (!tc_serves(xq, T, *w1) || w1->K != w0.K)) ||
        (p0.X != NULL && p0.hc != GFW_FP8_HC_POST_HC))
        return false;
    const fp8_hc_post none = fp8_no_hc_post();
    tc_plan p;
    p.j0 = tc_job_for(w0, y0, p0);
    p.j1 = w1 != NULL ? tc_job_for(*w1, y1, none) : p.j0;
    if (w1 == NULL)
        p.j1.tiles = 0;
    p.nb = (int)(w0.K / 128);
    const int64_t tiles = p.j0.tiles + p.j1.tiles;
    p.units = tiles * p.nb;
    /* at least GFW_TC_MIN_UNITS units a warp where the wave would give fewer (a short weight:
       fewer warps, each a deeper copy pipeline, fewer partial slots per tile), and so no warp
       without a unit (a tile's count waits for every warp between its first and last) */
    const int64_t wave = (int64_t)(n_sm > 0 ? n_sm : 1) * GFW_TC_BLOCKS_PER_SM * GFW_TC_WARPS;
    const int64_t enough = p.units / GFW_TC_MIN_UNITS > 0 ? p.units / GFW_TC_MIN_UNITS : 1;
    p.warps = wave < enough ? wave : enough;
    const int64_t blocks = (p.warps + GFW_TC_WARPS - 1) / GFW_TC_WARPS;
    /* a tile's nb units span at most ceil(nb W / U) + 1 warps */
    p.slots = (int)((p.nb * p.warps + p.units - 1) / p.units + 1);
    p.part = ws.part;
    p.count = ws.count;
    if (tiles > GFW_TC_COUNTS || tiles * p.slots * GFW_TC_ROWS * GFW_TC_TOKENS > GFW_TC_PART_FLOATS)
        return false;
    mmoe_launch_pdl(k_linear_fp8_tc, (unsigned)blocks, GFW_TC_WARPS * 32, 0, st, xq, xs, (int)T, p);
    return true;
}

#endif /* MMOE_GPU_LINEAR_FP8_TC_CUH */
