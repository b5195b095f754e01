/**
 * @file gpu_decode.cu
 * @brief The decode GEMM of the GPU layer: few tokens, weights streamed from every SM.
 *
 * With a handful of tokens the MoE layer is a stream of weights: at T = 1 the six routed
 * experts and the shared one are ~105 MB of MXFP4 and FP8 bytes that each take part in one
 * multiply-add per token.  The tile GEMMs (gpu_gemm.cu, gpu_gemm_wgmma.cu) give each block a
 * 128-row weight tile and walk K through a shallow shared-memory ring, so a few hundred blocks
 * each keep a few KB in flight.  This kernel (the "decode16" family) is organized the other
 * way round:
 *
 *   - **A warp = 16 weight rows x all of K x up to 8 tokens of one expert.**  The weights are
 *     the MMA's M operand (`mma.sync.m16n8k16` F16, "swap AB") and the tokens its N operand,
 *     so one instruction multiplies 16 rows by 8 tokens over 16 K.  A block is 4 warps, 4
 *     consecutive row groups of one tile, sharing the tile's activations, which the block
 *     stages in shared memory once, as FP8 bytes.  At T = 1 the V4-Flash layer's L1 GEMM has
 *     1792 warps of work (7 experts x 256 row groups) in 448 blocks: every SM gets several.
 *   - **A deep copy ring per warp.**  The warp copies each K block of its 16 rows and their
 *     scale words with `cp.async` into a 9 KB ring of its own: 8 (MXFP4) or 4 (FP8) K blocks,
 *     up to 7 KB of weights per warp in flight.  The layer's tile-major layout (gpu_moe.cu)
 *     makes the warp's rows one contiguous 1 KB (2 KB) run per K block.  MXFP4: each lane
 *     copies two 16-byte pieces (one per 8 rows), so a copy instruction moves 512 contiguous
 *     bytes, and the lanes read the block back with two `ldmatrix.x4`, each lane receiving the
 *     words its fragments need from other lanes' pieces; a warp barrier after the per-thread
 *     `cp.async.wait_group` orders every lane's copies before those reads (the warp is
 *     converged there, and the sm_90a build issues no instruction for it).  FP8: each lane
 *     copies and reads back only its own slots, so the wait alone is the synchronisation.
 *   - **The K order inside an MMA is free**, since each output is a dot product: the fragment
 *     positions of m16n8k16 ("logical" k = 2t, 2t + 1, 2t + 8, 2t + 9 for lane t = lane % 4)
 *     may stand for any actual k, as long as the activation fragment of the same lane uses the
 *     same map.  The block stages the activations in the order the weight fragments need.
 *
 * **MXFP4 weights** (the routed experts): lane (g, t) (g = lane / 4) holds word t, codes
 * 8t..8t+7, of each of the four 32-wide groups of rows g and g + 8 (what ldmatrix gives it
 * from the stage: gpu_decode16_map.h), so the MMA steps of group
 * j cover group j alone: two steps from zero, the even codes in the first, the odd ones in the
 * second.  A code becomes the F16 number e2m1 * 2^-14 by moving its bits (exact, no table),
 * and each group's sum is scaled by its own 2^(k - 127) in FP32 (an exact product); the four
 * are added, and the sum is promoted with the token's activation scale times 2^14.  No scale
 * spread needs another path.  With per-32 activation scales (sm100 recipe) each group is
 * promoted on its own.
 *
 * **FP8 weights** (the shared expert): lane (g, t) copies the 32 bytes of group t of rows g and
 * g + 8 and converts them to F16 pairs; a K block is 8 MMA steps, each spanning the four
 * groups.  When the four scale bytes of the K block are equal in all 16 rows (the checkpoint's
 * 128x128 block scales, expanded), the step sums are promoted once with 2^(k - 127) and the
 * activation scale; otherwise (or with per-32 activation scales) each group is multiplied on
 * its own, the other lanes' fragments zeroed, and promoted with its own factors.
 *
 * Every product of an FP8 activation and a weight is exact in the tensor core, and so are the
 * power-of-two scalings, so the result differs from the oracle's only in the order of the FP32
 * additions: per output, one warp adds its K blocks in ascending order (fixed: a call is
 * deterministic).
 *
 * **Routing on the host, once per call.**  The kernel needs no routing kernel before it: the
 * layer checks each call's topk_idx on the host and builds the table of its routed tiles there
 * (gpu_decode_route.h: the experts in ascending order, each expert's valid (token, slot) pairs
 * in ascending pair order cut into runs of 8), uploaded with the routing; a block reads its
 * tile's entry with one load.  The rows of the routed L1 output and L2 input are the pair
 * indices (token * topk + slot).  So a block knows its weights before any earlier kernel has
 * finished: launched with programmatic dependent launch, its warps issue their first weight
 * copies, and only then does the block wait (griddepcontrol.wait) for the activations of the
 * kernel before it.  Deriving the tile in the block instead would cost every block two passes
 * over the T * topk pairs before its first copy (docs/perf.md, "Sixth pass").
 *
 * **One launch, routed and shared.**  A launch carries two parts: the shared expert (grid rows
 * [0, shared tiles), uniform tiles of 8 tokens, weight 1, slot topk) and the routed experts
 * (the next rows).  The shared expert's blocks stream the most bytes (FP8, twice as many per
 * row), so they are dispatched in the first round of blocks (one per SM), where each is the
 * oldest block of its SM, which the warp schedulers favour; and where the launch has fewer
 * blocks than two rounds of SMs (the one-token launches), after enough routed blocks that
 * the partial last round, which goes to the SMs served first, does not land on an SM that
 * holds a shared block (mmoe_decode_shared_lead, gpu_decode_route.h; decode_block_pos maps
 * the dispatch position back to the block's row block and grid row).
 *
 * **The requantization in L1 (when rq_counters is set).**  The L2 launch reads the L1 outputs as E4M3 rows with a scale per
 * 128 (sm90) or 32 (sm100) channels, and a 128-channel group of a tile's rows is written by
 * RQ_BLOCKS = 4 neighbouring blocks (32 channels each).  Each block, after its epilogue's
 * stores and a fence, counts itself in the group's counter (one per grid row and group, in the
 * layer's workspace); the block that counts last quantizes the group of every row of its tile
 * with the quantizer's device steps (gpu_quant.cuh: the same bytes and scales as the separate
 * quantization kernel) and sets the counter back to zero for the next launch.  The layer then
 * runs no requantization kernel, and the L2 launch depends on L1 directly.
 *
 * **The combine in L2 (when cb_counters is set).**  Likewise the L2 launch sums each token's slot rows into the output:
 * the rows of one token's 64-channel chunk (CB_CHUNK: one block's channels) are written by the
 * blocks of its unmasked slots' tiles and of its shared tile; each counts its rows after its
 * stores and a fence, and the last one sums the chunk in the combine kernel's order
 * (gpu_combine.cu) and resets the counter.  The decode pipeline is then three launches:
 * quantize x, L1, L2.  The layer sets both counters only for calls of few tokens
 * (gpu_moe.cu, MMOE_DECODE_FUSE_MAX_T): there the two launches saved are most of the call,
 * while with more tokens the last block's serial epilogue costs more than they do.  With the
 * counters NULL the same kernel only stores its FP32 rows and BF16 slots, never touches a
 * counter, and the layer launches the requantization (gpu_quant.cu) and combine
 * (gpu_combine.cu) kernels after it: five launches.
 *
 * **Shared memory per block, and blocks per SM.**  A block holds its 4 warps' rings (36 KB),
 * the tile's staged activation rows (K + 16 bytes each) and their scales.
 * The rows are sized by the launch, not by the tile's upper bound of 8: the host, which checks
 * the routing when it uploads it, passes the most rows any tile of the call holds (tile_rows:
 * min(8, T) for the shared part, min(8, the most pairs of one expert) for the routed part).  At
 * T = 1 with distinct experts that is one row: the V4-Flash L1 launch (K = 4096, 256 experts)
 * needs 36864 + 4112 + 1024 = 42000 bytes, so five blocks fit in an SM's 228 KB (with
 * the 144 static bytes and the 1 KB each block reserves; the kernel is compiled for five
 * blocks of 128 threads, at most 96 registers a thread, and the sm_90a build uses 90 to 93),
 * and its 448 blocks run in one wave on 132 SMs.  With the shared expert, T
 * tokens need min(8, T) rows: four blocks fit from 2 to 4 rows, three from 5 to 8.  A token
 * that names one expert in several slots has that many rows in the expert's tile (at most 8),
 * and the launch stages that many; a block whose tile holds more rows than the launch says
 * traps rather than overrun its staging.  The L2 launch (K = 2048) fits five blocks up to 3
 * rows and four up to 8.  The ring's size is what sets these counts: with 10 KB rings L1
 * would fit four blocks at one row and L2 three at 8 rows, and the layer measured 6% slower
 * at T = 128 that way (docs/perf.md).  The FP8 stage (2304 bytes) needs the 9 KB for four
 * stages; the MXFP4 stage (1088 bytes) uses 8704 of them.  Staging F16 rows instead of FP8 bytes would double the
 * activation bytes and cost blocks: the activations are converted in registers instead.
 *
 * **Handing over to the next launch.**  A block signals the launch after it
 * (griddepcontrol.launch_dependents) as soon as its warps have left the K loop, before the
 * epilogue stores and the counted requantization or combine: the next GEMM's blocks take the
 * SM slots that finish first and issue their first weight copies while the last blocks of
 * this one finish; they read this launch's outputs only after their griddepcontrol.wait, which
 * waits for the whole launch to complete.  Triggered at the start of a block instead, the
 * waiting blocks would hold slots that this launch still needs.  The counted epilogues make
 * the block's stores visible with one fence by the counting thread after the block's barrier
 * (the barrier orders every thread's stores before it), not one fence per thread.
 *
 * **Why F16 MMAs, not E4M3 ones.**  An `mma.sync.m16n8k32` E4M3 MMA would take the FP8
 * fragments as they are, but sm_90 has no such tensor-core instruction: the compiler emulates
 * each one with two F16 HMMAs, a conversion of every A and B register pair (12 per MMA) and 4
 * additions of the accumulator, so per K block of one warp (16 rows x 128 K of MXFP4) the L1
 * loop would issue 248 instructions against this kernel's 214, and on an H200 the V4-Flash
 * layer is 5 to 7% slower with them at every T from 1 to 128.  This kernel issues the F16 MMAs
 * itself and converts each operand once (see "The F16 operands" below).
 */
#include "gpu_internal.cuh"
#include "gpu_decode16_map.h"
#include "gpu_decode_route.h"
#include "gpu_quant.cuh"
#include "gpu_e2m1_decode.cuh"

namespace {

constexpr int DEC_WARPS = 4;               /* warps per block: 4 row groups of one tile */
constexpr int DEC_THREADS = DEC_WARPS * 32;
constexpr int DEC_BK = 128;                /* K block: the tile-major layout's and sm90's group */

/**
 * The block's tile of the routed part, from the call's table (gpu_decode_route.h): its entry
 * (the expert, then 8 pair indices, -1 past the tile's end) into @p s_tile; returns the expert,
 * or -1 when tile @p y does not exist.  The block of tile 0 and row group 0 also stores the
 * call's routing counters (pairs per expert, their running totals and the number of valid
 * pairs).  All threads of the block call it.
 */
__device__ int read_tile(const mmoe_decode_args &p, int y, int bx, int *s_tile)
{
    const int tid = threadIdx.x;
    if (tid < MMOE_DECODE_TILE_INTS)
        s_tile[tid] = p.route[(size_t)y * MMOE_DECODE_TILE_INTS + tid];
    if (p.counts != nullptr && y == 0 && bx == 0) {
        const int32_t *counts = p.route + (size_t)p.routed_tiles * MMOE_DECODE_TILE_INTS;
        for (int e = tid; e < p.E; e += DEC_THREADS) {
            p.counts[e] = counts[e];
            p.cum_counts[e] += counts[e];
        }
        if (tid == 0)
            *p.num_pairs = counts[p.E];
    }
    __syncthreads();
    return s_tile[0];
}

/** A fragment register, kept by the lanes of the group being multiplied, zero in the others (per-group path). */
__device__ __forceinline__ uint32_t keep_if(uint32_t v, bool keep)
{
    return keep ? v : 0u;
}

/** Bytes of the per-warp copy ring (both weight formats; see ring_of). */
constexpr int RING_BYTES = 9216;

/**
 * The copy ring of one warp for weight format BFMT.  FP8: each lane copies, per K block, the 32
 * bytes of its group of rows g and g + 8 and their two scale words into its own slots (stage
 * layout: [row][piece][lane] of uint4, then [row][lane] of scale words, so that the lanes'
 * reads back are contiguous) and reads back only those.  MXFP4: the warp copies the K block's
 * 16 rows of 64 bytes in two halves of 8 rows, one 16-byte cp.async per lane and half, at the
 * offsets of gpu_decode16_map.h (mmoe_d16_fp4_piece_offset), then the 16 rows' scale words (64
 * bytes, four lanes); after its wait a warp barrier makes every lane's copies visible to all,
 * and two ldmatrix.x4 give each lane its words.  STAGES K blocks are in flight.
 */
template <int BFMT>
struct ring_of {
    static constexpr int V = BFMT == MMOE_B_FP4 ? 1 : 2;         /* uint4 per lane, row and K block */
    static constexpr int STAGE_BYTES = BFMT == MMOE_B_FP4 ? 16 * 64 + 16 * 4 : 32 * (2 * V * 16 + 2 * 4);
    static constexpr int STAGES = RING_BYTES / STAGE_BYTES;        /* 8 (MXFP4) or 4 (FP8) */
};

/**
 * ldmatrix.x4 of 8x8 16-bit matrices at shared-window address @p sa (lanes 8i .. 8i + 7 name the
 * rows of matrix i): register i of lane l is word l % 4 of row l / 4 of matrix i.
 */
__device__ __forceinline__ void ldmatrix_x4(unsigned sa, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sa)
                 : "memory");
}

/** A 32-bit load from shared-window address @p sa. */
__device__ __forceinline__ uint32_t ld_shared_u32(unsigned sa)
{
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(sa) : "memory");
    return v;
}

/**
 * The block stages the tile's activations in shared memory: it waits for the kernel before it
 * (programmatic dependent launch: the activations are that kernel's output), copies the @p ntok
 * token rows of A (rows @p s_arow) and their scales (zero past ntok), and meets at a barrier.
 * Every thread of the block calls it once, after its warp has issued its first weight copies.
 */
__device__ void stage_activations(const mmoe_decode_part &q, int ag, int ntok, const int *s_arow, uint8_t *sA, int lda,
                                  float *sAs)
{
    mmoe_grid_dependency_wait();
    const int K = q.K, chunks = K / 16, ng = K / ag, n = ntok * chunks;
    /* STAGE_LOADS chunks of 16 bytes per thread and round, their loads issued together */
    constexpr int STAGE_LOADS = 4;
    for (int i0 = threadIdx.x; i0 < n; i0 += STAGE_LOADS * DEC_THREADS) {
        uint4 v[STAGE_LOADS];
        int rows[STAGE_LOADS], cols[STAGE_LOADS]; /* chunk i's row i / chunks and chunk i % chunks */
#pragma unroll
        for (int u = 0; u < STAGE_LOADS; u++) {
            const int i = i0 + u * DEC_THREADS;
            rows[u] = i / chunks;
            cols[u] = i % chunks;
            if (i < n)
                v[u] = *reinterpret_cast<const uint4 *>(q.a + (size_t)s_arow[rows[u]] * K + cols[u] * 16);
        }
#pragma unroll
        for (int u = 0; u < STAGE_LOADS; u++) {
            const int r = rows[u], c = cols[u];
            if (i0 + u * DEC_THREADS >= n)
                break;
            if (q.bfmt == MMOE_B_FP4) {
                /*
                 * MXFP4 order (see decode_warp_fp4 and gpu_decode16_map.h): inside each K block,
                 * run (j, t) of 8 bytes at 32 j + 8 t goes to 32 t + 8 j, even positions first:
                 * lane t then reads its four groups' bytes as 32 contiguous bytes, each group's B
                 * registers in a row.  This chunk holds runs 2 (c % 8) and 2 (c % 8) + 1.
                 */
                const int kb = c / 8, run = (c % 8) * 2;
                uint8_t *blk = sA + r * lda + kb * DEC_BK;
                *reinterpret_cast<uint2 *>(blk + mmoe_d16_run_offset(run, 1)) =
                    make_uint2(mmoe_d16_byte_perm(v[u].x, v[u].y, MMOE_D16_SEL_EVEN),
                               mmoe_d16_byte_perm(v[u].x, v[u].y, MMOE_D16_SEL_ODD));
                *reinterpret_cast<uint2 *>(blk + mmoe_d16_run_offset(run + 1, 1)) =
                    make_uint2(mmoe_d16_byte_perm(v[u].z, v[u].w, MMOE_D16_SEL_EVEN),
                               mmoe_d16_byte_perm(v[u].z, v[u].w, MMOE_D16_SEL_ODD));
            } else {
                *reinterpret_cast<uint4 *>(sA + r * lda + c * 16) = v[u];
            }
        }
    }
    for (int i = threadIdx.x; i < 8 * ng; i += DEC_THREADS) {
        const int r = i / ng;
        sAs[i] = r < ntok ? q.a_scale[(size_t)s_arow[r] * ng + i % ng] : 0.0f;
    }
    __syncthreads();
}

/** The epilogue of one warp: acc0, acc1 = row g, columns 2t, 2t+1; acc2, acc3 = row g + 8. */
template <int EPI>
__device__ __forceinline__ void decode_epilogue(const mmoe_decode_args &p, const mmoe_decode_part &q, int row_group,
                                                const float (&acc)[4], const int *s_orow, const float *s_w, int ntok)
{
    const int lane = threadIdx.x & 31, gid = lane >> 2, tok0 = (lane & 3) * 2;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int col = tok0 + e;
        if (col >= ntok)
            continue;
        const int orow = s_orow[col];
        if (EPI == MMOE_EPI_SWIGLU) {
            const int ch = row_group * 8 + gid;
            q.out_f32[(size_t)orow * q.n_out + ch] = mmoe_swiglu_channel(acc[e], acc[2 + e], p.clamp, s_w[col]);
        } else if (p.raw != nullptr) {
            const int n = row_group * 16 + gid;
            p.raw[(size_t)orow * q.n_out + n] = acc[e];
            p.raw[(size_t)orow * q.n_out + n + 8] = acc[2 + e];
        } else {
            /* orow = token * slots + slot: the (token, slot) row of the combine buffer */
            const int n = row_group * 16 + gid;
            __nv_bfloat16 *o = p.out_slots + (size_t)orow * q.n_out;
            o[n] = __float2bfloat16_rn(acc[e]);
            o[n + 8] = __float2bfloat16_rn(acc[2 + e]);
        }
    }
}

/*
 * The F16 operands.  The kernel issues m16n8k16 F16 MMAs: the weights become F16 by moving bits
 * (MXFP4) or by one paired conversion per two bytes (FP8), and each lane converts its B
 * registers from the staged FP8 activations right before the MMAs.
 *
 * **Staging and B conversion.**  The block stages the activations as FP8 bytes (one byte per
 * value, in the permuted order of gpu_decode16_map.h, K + 16 bytes a row).  A lane's 8 staged
 * words of a K block (its 32 contiguous bytes) become 16 F16 pairs with cvt.rn.f16x2.e4m3x2:
 * MXFP4 group j's step 0 takes the pairs of word 2j, step 1 those of word 2j + 1; FP8 step s
 * those of word s.  One conversion feeds one B register of an MMA whose A operand (16 rows x
 * 16 k) the lane's weights fill: 16 conversions per warp K block, against 64 weight registers
 * moved or converted (MXFP4: 1 KB of weights, FP8: 2 KB).
 *
 * **Exactness.**  Every E4M3 number is an F16 number (F16 has 5 exponent and 10 mantissa bits,
 * E4M3 4 and 3; E4M3's subnormals, down to 2^-9, are F16 normals), and so is every E2M1 number
 * times 2^-14.  Products of two F16 numbers with at most 4 significant bits each are exact in
 * the tensor core's FP32 path, so the partial sums are sums of exact products of the FP8
 * activations and the weights, scaled by a power of two.  An MXFP4 product is x * w * 2^-14,
 * so the promotion multiplies by a_scale * 2^14 (exact).  The smallest nonzero product is
 * 2^-9 * 2^-1 * 2^-14 = 2^-24, and a group sum times its factor 2^(k - 127) stays an FP32
 * normal for every UE8M0 byte k >= 25 (weights down to 2^-102): all the powers of two are exact.
 * Each 32-wide MXFP4 group has its own zeroed sum (two m16n8k16 steps), so its exponent applies
 * to its sum alone.
 *
 * **Operands.**  gpu_decode16_map.h holds the bit moves and index maps, shared with a CPU test:
 * an E2M1 code moved to F16 bits is the F16 number e2m1 * 2^-14 (one byte permute per pair of
 * codes after two word-wide bit moves per 8 codes); the scale bytes become factors in three
 * integer instructions; the staging order and the words each step's B registers come from.
 *
 * **Fragments.**  m16n8k16: lane (g, t) holds A rows g and g + 8 at logical k = 2t, 2t + 1
 * (a0, a1) and 2t + 8, 2t + 9 (a2, a3), and B (token g) at the same k (b0, b1).  The logical k
 * may stand for any actual k as long as all lanes with the same t use the same map, which the
 * maps of gpu_decode16_map.h do.
 */

/** One m16n8k16 F16 MMA with FP32 accumulation: d += A(16x16) * B(16x8). */
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/** 2^(k - 127) of UE8M0 byte g of a scale word, for g = 0..3 in @p f[g] (gpu_decode16_map.h). */
__device__ __forceinline__ void ue8m0_pow2x4(uint32_t w, float (&f)[4])
{
#pragma unroll
    for (int g = 0; g < 4; g++)
        f[g] = __uint_as_float(mmoe_d16_ue8m0_pow2_bits(w, g));
}

/**
 * Lane (g, t)'s 8 staged words of K block @p kb: the 32 bytes at 128 kb + 32 t of staged row
 * @p row (word w at mmoe_d16_b_word_offset(t, w)); each word becomes two B registers.  For a
 * token g past the tile's rows the caller passes row 0: the MMA keeps the tokens (columns)
 * apart and the epilogue writes no column past the tile's rows, so those products are never
 * used, and no zeroing is issued.
 */
__device__ __forceinline__ void staged_words(const uint8_t *sA, int lda, int row, int tig, int kb, uint32_t (&xa)[8])
{
    const uint4 *src = reinterpret_cast<const uint4 *>(sA + row * lda + kb * DEC_BK + mmoe_d16_b_word_offset(tig, 0));
    const uint4 x0 = src[0], x1 = src[1];
    xa[0] = x0.x; xa[1] = x0.y; xa[2] = x0.z; xa[3] = x0.w;
    xa[4] = x1.x; xa[5] = x1.y; xa[6] = x1.z; xa[7] = x1.w;
}

/**
 * One warp's GEMM over MXFP4 weights, one 32-wide group per pair of MMA steps: lane (g, t)
 * copies group t of row g and of row g + 8 (16 bytes each) and receives, through ldmatrix,
 * word t (codes 8t..8t+7) of each of the four groups of rows g and g + 8, so that the
 * two m16n8k16 steps of group j cover group j alone (each lane's 8 codes of it: the 4 even
 * ones in the first step, the 4 odd ones in the second; the staged activations are permuted to
 * match).  The codes are moved to F16 without a table (e2m1 * 2^-14, exact), the staged
 * activations converted to F16 as they are, and every group's sum, from zero, is scaled with
 * its own exponent: no fold, no exact path, any scale spread.  Per K block and output: t = sum
 * over the groups in order of tmp_g * 2^(k_g - 127) (exact products), then
 * acc += t * (a_scale * 2^14).
 */
template <int AG, int EPI>
__device__ void decode_warp_fp4(const mmoe_decode_part &q, int expert, int row_group,
                                const int *s_arow, uint8_t *sA, int lda, float *sAs, int ntok, uint8_t *ring,
                                float (&acc)[4])
{
    using R = ring_of<MMOE_B_FP4>;
    constexpr int STAGES = R::STAGES;
    constexpr int ROW_BYTES = DEC_BK / 2;
    constexpr int HALF_BYTES = 8 * ROW_BYTES; /* one half of a stage: 8 rows */
    constexpr float A_UNIT = 16384.0f; /* 1 / (the product's power of two) */
    const int lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int K = q.K, nkb = K / DEC_BK;
    const int nb = row_group / 8;
    const int trow0 = EPI == MMOE_EPI_SWIGLU ? (row_group % 8) * 8 + gid : (row_group % 8) * 16 + gid;
    const uint8_t *bw = q.b + (size_t)expert * q.b_expert_stride + (size_t)nb * nkb * (128 * ROW_BYTES);
    const uint8_t *bs = q.b_scale + (size_t)expert * q.bs_expert_stride + (size_t)nb * nkb * (128 * 4);
    /*
     * The next K block to copy (blocks 0, 1, ... in turn, block j into stage j % STAGES): group
     * tig of row trow0 (16 bytes), the lane's piece of the first half; its piece of the second
     * half, row trow0 + ROW1, is a constant distance further (an immediate offset of the copy).
     * Lanes 0..3 copy the scale words, 16 bytes each: lane 2h + i the i-th 16 bytes of half h's
     * 8 rows.  Each copy advances the three pointers.
     */
    constexpr int ROW1 = EPI == MMOE_EPI_SWIGLU ? 64 : 8; /* L1: the up channel of gate row trow0; L2: row g + 8 */
    const uint8_t *next_w = bw + trow0 * ROW_BYTES + tig * 16;
    const uint8_t *next_s = bs + (trow0 - gid + (lane >> 1 & 1) * ROW1) * 4 + (lane & 1) * 16;
    const bool copies_scales = lane < 4;
    const unsigned ring_sa = (unsigned)__cvta_generic_to_shared(ring);
    const unsigned piece_sa = (unsigned)mmoe_d16_fp4_piece_offset(gid, tig);
    const unsigned scale_sa = 2 * HALF_BYTES + lane * 16;
    const unsigned ldm_sa = (unsigned)mmoe_d16_fp4_ldmatrix_row_offset(lane);
    unsigned next_stage = ring_sa;
    const unsigned last_stage = ring_sa + (STAGES - 1) * R::STAGE_BYTES;

    /* stage layout: [half h][pieces of 8 rows] (gpu_decode16_map.h), then [half h][row] of scale words */
    auto issue_next = [&]() {
        cp_async16_sa(next_stage + piece_sa, next_w);
        cp_async16_sa(next_stage + HALF_BYTES + piece_sa, next_w + ROW1 * ROW_BYTES);
        if (copies_scales)
            cp_async16_sa(next_stage + scale_sa, next_s);
        next_w += 128 * ROW_BYTES;
        next_s += 128 * 4;
        next_stage = next_stage == last_stage ? ring_sa : next_stage + R::STAGE_BYTES;
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nkb)
            issue_next();
        cp_async_commit();
    }
    stage_activations(q, AG, ntok, s_arow, sA, lda, sAs);

    const int tok0 = tig * 2;
    const int brow = gid < ntok ? gid : 0; /* see staged_words() */
    unsigned stage = ring_sa; /* K block kb's stage: kb % STAGES */
    for (int kb = 0; kb < nkb; kb++) {
        cp_async_wait<STAGES - 2>();
        __syncwarp(); /* every lane's copies of K block kb are complete and visible to the warp */
        uint32_t ww0[4], ww1[4];
        ldmatrix_x4(stage + ldm_sa, ww0);
        ldmatrix_x4(stage + HALF_BYTES + ldm_sa, ww1);
        const uint32_t sw0 = ld_shared_u32(stage + 2 * HALF_BYTES + gid * 4);
        const uint32_t sw1 = ld_shared_u32(stage + 2 * HALF_BYTES + 32 + gid * 4);
        stage = stage == last_stage ? ring_sa : stage + R::STAGE_BYTES;
        /* the stage read last step is free again (every lane has passed this step's barrier): K
           block kb + STAGES - 1 goes there */
        if (kb + STAGES - 1 < nkb)
            issue_next();
        cp_async_commit();

        /* activations, permuted at staging: group g's words are 2g (even k), 2g + 1 (odd k) */
        uint32_t xa[8];
        staged_words(sA, lda, brow, tig, kb, xa);
        float tmp[4][4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            uint32_t xe[2], xo[2];
            mmoe_d16_e4m3x4_to_f16x2(xa[2 * g], &xe[0], &xe[1]);
            mmoe_d16_e4m3x4_to_f16x2(xa[2 * g + 1], &xo[0], &xo[1]);
            const uint32_t e0 = mmoe_d16_e2m1_even_high(ww0[g]), e1 = mmoe_d16_e2m1_even_high(ww1[g]);
            const uint32_t o0 = mmoe_d16_e2m1_odd_high(ww0[g]), o1 = mmoe_d16_e2m1_odd_high(ww1[g]);
            const uint32_t a_even[4] = {mmoe_d16_f16_pair_lo(e0), mmoe_d16_f16_pair_lo(e1), mmoe_d16_f16_pair_hi(e0),
                                        mmoe_d16_f16_pair_hi(e1)};
            const uint32_t a_odd[4] = {mmoe_d16_f16_pair_lo(o0), mmoe_d16_f16_pair_lo(o1), mmoe_d16_f16_pair_hi(o0),
                                       mmoe_d16_f16_pair_hi(o1)};
#pragma unroll
            for (int c = 0; c < 4; c++)
                tmp[g][c] = 0.0f;
            mma_f16(tmp[g], a_even, xe[0], xe[1]);
            mma_f16(tmp[g], a_odd, xo[0], xo[1]);
        }
        /* the groups' sums with their exponents (exact products), then the activation scale */
        float t[4], f0[4], f1[4];
        ue8m0_pow2x4(sw0, f0);
        ue8m0_pow2x4(sw1, f1);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const float p0 = f0[g], p1 = f1[g];
            if (AG == 32) {
                /* per-32 activation scales: each group promoted on its own */
                const float sa0 = __fmul_rn(sAs[tok0 * (K / AG) + kb * 4 + g], A_UNIT);
                const float sa1 = __fmul_rn(sAs[(tok0 + 1) * (K / AG) + kb * 4 + g], A_UNIT);
                acc[0] = fmaf(tmp[g][0], __fmul_rn(sa0, p0), acc[0]);
                acc[1] = fmaf(tmp[g][1], __fmul_rn(sa1, p0), acc[1]);
                acc[2] = fmaf(tmp[g][2], __fmul_rn(sa0, p1), acc[2]);
                acc[3] = fmaf(tmp[g][3], __fmul_rn(sa1, p1), acc[3]);
            } else if (g == 0) {
                t[0] = __fmul_rn(tmp[0][0], p0);
                t[1] = __fmul_rn(tmp[0][1], p0);
                t[2] = __fmul_rn(tmp[0][2], p1);
                t[3] = __fmul_rn(tmp[0][3], p1);
            } else {
                t[0] = fmaf(tmp[g][0], p0, t[0]);
                t[1] = fmaf(tmp[g][1], p0, t[1]);
                t[2] = fmaf(tmp[g][2], p1, t[2]);
                t[3] = fmaf(tmp[g][3], p1, t[3]);
            }
        }
        if (AG == 128) {
            const float sa0 = __fmul_rn(sAs[tok0 * (K / AG) + kb], A_UNIT);
            const float sa1 = __fmul_rn(sAs[(tok0 + 1) * (K / AG) + kb], A_UNIT);
            acc[0] = fmaf(t[0], sa0, acc[0]);
            acc[1] = fmaf(t[1], sa1, acc[1]);
            acc[2] = fmaf(t[2], sa0, acc[2]);
            acc[3] = fmaf(t[3], sa1, acc[3]);
        }
    }
    cp_async_wait<0>();
}

/**
 * One warp's GEMM over FP8 weights (the shared expert): 16 weight rows (L1: 8 gate channels
 * and their 8 up channels) over all of K against the tile's tokens (activations staged in shared
 * memory by the block), streamed through the warp's cp.async ring; then the epilogue.  Lane t
 * holds the 32 bytes of group t, so an MMA step spans the four groups: a K block whose four
 * scale bytes are equal in all 16 rows is promoted once (the usual case: the checkpoint's
 * scales are per 128x128 block), any other (or every one, with AG = 32) per group, the other
 * lanes' fragments zeroed.  The 32 bytes of each row and the lane's 32 staged activation bytes
 * become F16 pairs with the paired conversion once per K block, and the K block takes 8
 * m16n8k16 steps (step s: weight word s of both rows, activation word s).
 */
template <int AG, int EPI>
__device__ void decode_warp_fp8(const mmoe_decode_part &q, int expert, int row_group,
                                const int *s_arow, uint8_t *sA, int lda, float *sAs, int ntok, uint8_t *ring,
                                float (&acc)[4])
{
    using R = ring_of<MMOE_B_FP8>;
    constexpr int V = R::V, STAGES = R::STAGES;
    constexpr int ROW_BYTES = DEC_BK; /* bytes of a row in one K block */
    constexpr int STEPS = 8; /* MMA steps per K block */
    const int lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int K = q.K, nkb = K / DEC_BK;
    /* the two weight rows of this lane inside the 128-row tile of n-block nb */
    const int nb = row_group / 8;
    const int trow0 = EPI == MMOE_EPI_SWIGLU ? (row_group % 8) * 8 + gid : (row_group % 8) * 16 + gid;
    const int trow1 = EPI == MMOE_EPI_SWIGLU ? 64 + trow0 : trow0 + 8; /* L1: the up channel of trow0 */
    const uint8_t *bw = q.b + (size_t)expert * q.b_expert_stride + (size_t)nb * nkb * (128 * ROW_BYTES);
    const uint8_t *bs = q.b_scale + (size_t)expert * q.bs_expert_stride + (size_t)nb * nkb * (128 * 4);

    /* issue the copies of K block kb into ring stage st (this lane's slots only) */
    auto issue = [&](int kb, int st) {
        uint8_t *stage = ring + st * R::STAGE_BYTES;
        const uint8_t *tile = bw + (size_t)kb * (128 * ROW_BYTES);
#pragma unroll
        for (int v = 0; v < V; v++) {
            cp_async16(stage + ((0 * V + v) * 32 + lane) * 16, tile + trow0 * ROW_BYTES + tig * 16 * V + v * 16);
            cp_async16(stage + ((1 * V + v) * 32 + lane) * 16, tile + trow1 * ROW_BYTES + tig * 16 * V + v * 16);
        }
        const uint8_t *stile = bs + (size_t)kb * (128 * 4);
        cp_async4(stage + 2 * V * 32 * 16 + lane * 4, stile + trow0 * 4);
        cp_async4(stage + 2 * V * 32 * 16 + (32 + lane) * 4, stile + trow1 * 4);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nkb)
            issue(s, s);
        cp_async_commit();
    }
    /* the weights are on their way; now the block stages the activations (after the wait) */
    stage_activations(q, AG, ntok, s_arow, sA, lda, sAs);

    const int tok0 = tig * 2; /* this lane's two output columns */
    const int brow = gid < ntok ? gid : 0; /* see staged_words() */
    for (int kb = 0; kb < nkb; kb++) {
        cp_async_wait<STAGES - 2>(); /* K block kb has landed in this lane's slots */
        const uint8_t *stage = ring + (kb % STAGES) * R::STAGE_BYTES;
        uint4 wv[2][V];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int v = 0; v < V; v++)
                wv[h][v] = reinterpret_cast<const uint4 *>(stage)[(h * V + v) * 32 + lane];
        const uint32_t sw0 = reinterpret_cast<const uint32_t *>(stage + 2 * V * 32 * 16)[lane];
        const uint32_t sw1 = reinterpret_cast<const uint32_t *>(stage + 2 * V * 32 * 16)[32 + lane];
        /* the stage read last step is free again: refill it STAGES - 1 blocks ahead */
        if (kb + STAGES - 1 < nkb)
            issue(kb + STAGES - 1, (kb + STAGES - 1) % STAGES);
        cp_async_commit();

        /*
         * The A fragments [step][a0..a3] and B fragments [step][b0, b1] of the K block's steps:
         * step s takes weight word s, converted; its B registers are staged word s converted
         * (k = 32 tig + 4s .. + 3).
         */
        uint32_t af[STEPS][4], xb[STEPS][2], xa[8];
        staged_words(sA, lda, brow, tig, kb, xa);
#pragma unroll
        for (int j = 0; j < STEPS; j++)
            mmoe_d16_e4m3x4_to_f16x2(xa[j], &xb[j][0], &xb[j][1]);
#pragma unroll
        for (int v = 0; v < V; v++) {
            const uint32_t r0[4] = {wv[0][v].x, wv[0][v].y, wv[0][v].z, wv[0][v].w};
            const uint32_t r1[4] = {wv[1][v].x, wv[1][v].y, wv[1][v].z, wv[1][v].w};
#pragma unroll
            for (int m = 0; m < 4; m++) {
                mmoe_d16_e4m3x4_to_f16x2(r0[m], &af[4 * v + m][0], &af[4 * v + m][2]);
                mmoe_d16_e4m3x4_to_f16x2(r1[m], &af[4 * v + m][1], &af[4 * v + m][3]);
            }
        }
        /* fold test of both rows, and whether the whole warp can fold */
        int hi0, lo0, hi1, lo1;
        scale_span(sw0, &hi0, &lo0);
        scale_span(sw1, &hi1, &lo1);
        const bool fold = AG == 128 && __all_sync(0xffffffffu, hi0 == lo0 && hi1 == lo1);
        const int base0 = fold ? hi0 : 127, base1 = fold ? hi1 : 127;
        if (fold) {
            float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < STEPS; j++)
                mma_f16(tmp, af[j], xb[j][0], xb[j][1]);
            const float sa0 = sAs[tok0 * (K / AG) + kb], sa1 = sAs[(tok0 + 1) * (K / AG) + kb];
            const float f0 = pow2i(base0 - 127), f1 = pow2i(base1 - 127);
            acc[0] = fmaf(tmp[0], __fmul_rn(sa0, f0), acc[0]);
            acc[1] = fmaf(tmp[1], __fmul_rn(sa1, f0), acc[1]);
            acc[2] = fmaf(tmp[2], __fmul_rn(sa0, f1), acc[2]);
            acc[3] = fmaf(tmp[3], __fmul_rn(sa1, f1), acc[3]);
        } else {
#pragma unroll 1
            for (int g = 0; g < 4; g++) {
                float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const bool mine = tig == g;
#pragma unroll
                for (int j = 0; j < STEPS; j++) {
                    const uint32_t a[4] = {keep_if(af[j][0], mine), keep_if(af[j][1], mine),
                                           keep_if(af[j][2], mine), keep_if(af[j][3], mine)};
                    mma_f16(tmp, a, xb[j][0], xb[j][1]);
                }
                const int ga = AG == 32 ? kb * 4 + g : kb;
                const float sa0 = sAs[tok0 * (K / AG) + ga], sa1 = sAs[(tok0 + 1) * (K / AG) + ga];
                const float f0 = pow2i(byte_of(sw0, g) - 127), f1 = pow2i(byte_of(sw1, g) - 127);
                acc[0] = fmaf(tmp[0], __fmul_rn(sa0, f0), acc[0]);
                acc[1] = fmaf(tmp[1], __fmul_rn(sa1, f0), acc[1]);
                acc[2] = fmaf(tmp[2], __fmul_rn(sa0, f1), acc[2]);
                acc[3] = fmaf(tmp[3], __fmul_rn(sa1, f1), acc[3]);
            }
        }
    }
    cp_async_wait<0>();
}

/** Blocks of the decode GEMM whose SwiGLU outputs make up one 128-channel group (8 channels a warp). */
constexpr int RQ_BLOCKS = 128 / (DEC_WARPS * 8);

/**
 * The L1 launch's requantization (rq_counters set): the block has stored its 32 channels of the
 * tile's rows; the last of the RQ_BLOCKS blocks of the same tile and 128-channel group to get
 * here (an atomic count, after a fence that makes each thread's stores visible to the whole
 * device) quantizes that group of every row of the tile, one warp per row, with the quantizer's
 * own steps (quant_chunk, gpu_quant.cuh) reading the FP32 rows through L2; it also resets the
 * count for the next launch.  The rows and the rule are those of a separate requantization
 * kernel: the same bytes and scales.
 */
template <int AG>
__device__ void requant_group_if_last(const mmoe_decode_args &p, const mmoe_decode_part &q, int2 pos,
                                      bool shared_part, int ntok, const int *s_orow, int *s_last)
{
    constexpr int MODE = AG == 128 ? MMOE_QUANT_SM90 : MMOE_QUANT_SM100_REQUANT; /* the recipe's requant rule */
    const int c = pos.x / RQ_BLOCKS;
    int *count = p.rq_counters + (size_t)pos.y * p.rq_groups + c;
    __syncthreads(); /* every thread's L1 outputs are stored ... */
    if (threadIdx.x == 0) {
        __threadfence(); /* ... and, through the barrier, ordered before this count for every block */
        const int before = atomicAdd(count, 1);
        *s_last = before == RQ_BLOCKS - 1;
        if (before == RQ_BLOCKS - 1)
            *count = 0; /* every block of the group has counted: ready for the next launch */
    }
    __syncthreads();
    if (!*s_last)
        return;
    __threadfence(); /* the other blocks' outputs, seen after their count */
    uint8_t *out_q = shared_part ? p.rq_shared_q : p.rq_routed_q;
    float *out_s = shared_part ? p.rq_shared_s : p.rq_routed_s;
    for (int r = (int)threadIdx.x >> 5; r < ntok; r += DEC_WARPS)
        quant_chunk<float, MODE, true>(q.out_f32, s_orow[r], c * 128, q.n_out, out_q, out_s);
}

/** Output channels of one decode GEMM block in the L2 launch (16 rows a warp): one combine chunk. */
constexpr int CB_CHUNK = DEC_WARPS * 16;

/**
 * The L2 launch's combine (cb_counters set): the block has stored its 64 channels of the tile's
 * slot rows (BF16).  For each of its rows (token t, slot k), after a fence, one thread counts the
 * row in the counter of (t, chunk); a token's chunk is complete when all its unmasked slots and
 * the shared slot have counted, and the block that counts last sums them with one warp (two
 * channels a lane) with the combine kernel's own steps (mmoe_combine_slot_mask and
 * mmoe_combine_pair, gpu_internal.cuh: from 0, the unmasked slots in ascending order, the shared
 * slot last, FP32 additions, one BF16 rounding), and resets the counter.  A token with no slot to count (every slot
 * masked, no shared expert) is never summed: the layer zeroes the output first in that case.
 */
__device__ void combine_rows_if_last(const mmoe_decode_args &p, int bx, int n_out, int ntok, const int *s_orow,
                                     int *s_tok)
{
    const int slots = p.topk + 1, x = bx;
    __syncthreads(); /* every thread's slot stores are done ... */
    if (threadIdx.x < 8) {
        __threadfence(); /* ... and, through the barrier, ordered before this warp's counts */
        int last = -1;
        if ((int)threadIdx.x < ntok) {
            const int t = s_orow[threadIdx.x] / slots;
            const int want = __popc(mmoe_combine_slot_mask(p.topk_idx, t, p.topk, p.cb_has_shared));
            int *count = p.cb_counters + (size_t)t * p.cb_chunks + x;
            if (atomicAdd(count, 1) == want - 1) {
                *count = 0; /* every row of the chunk has counted: ready for the next launch */
                last = t;
            }
        }
        s_tok[threadIdx.x] = last;
    }
    __syncthreads();
    __threadfence(); /* the other blocks' slot rows, seen after their count */
    const int lane = (int)threadIdx.x & 31, d = x * CB_CHUNK + lane * 2;
    for (int r = (int)threadIdx.x >> 5; r < 8; r += DEC_WARPS) {
        const int t = s_tok[r];
        if (t >= 0)
            *reinterpret_cast<__nv_bfloat162 *>(p.cb_out + (size_t)t * n_out + d) = mmoe_combine_pair(
                p.out_slots, mmoe_combine_slot_mask(p.topk_idx, t, p.topk, p.cb_has_shared), t, p.topk, n_out, d);
    }
}

/**
 * Byte stride of a staged FP8 activation row: K plus 16, so that the 8 rows fall in different
 * banks.
 */
__host__ __device__ inline int staged_row_bytes(int K)
{
    return K + 16;
}

/**
 * Dynamic shared memory of a launch: the warps' rings, the @p tile_rows staged activation rows,
 * the scales of 8 (zero past the tile's rows: the lanes of absent tokens read them).
 */
inline size_t decode_smem_bytes(int Kmax, int a_group, int tile_rows)
{
    return (size_t)DEC_WARPS * RING_BYTES + (size_t)tile_rows * staged_row_bytes(Kmax) +
           (size_t)8 * (Kmax / a_group) * sizeof(float);
}

/** Largest reduction length of a launch's two parts: the staged rows' length. */
inline int decode_kmax(const mmoe_decode_args *a)
{
    return a->shared.K > a->routed.K ? a->shared.K : a->routed.K;
}

/**
 * The (row block, grid row) this block computes: the GPU dispatches p.shared_lead routed blocks
 * first, then the shared part's, then the other routed ones (mmoe_decode_block_natural(),
 * gpu_decode_route.h).  In the natural order row block x of grid row y is block
 * y * gridDim.x + x, the shared part's rows first.
 */
__device__ __forceinline__ int2 decode_block_pos(const mmoe_decode_args &p)
{
    const int gx = (int)gridDim.x, order = (int)blockIdx.y * gx + (int)blockIdx.x;
    const int natural = mmoe_decode_block_natural(order, p.shared_tiles * gx, p.shared_lead);
    return make_int2(natural % gx, natural / gx);
}

/**
 * The decode GEMM (see the file comment).  Grid: x = blocks of DEC_WARPS row groups of 16
 * weight rows (L1: 8 channels each), y = the shared part's tiles, then the routed part's.
 * EPI: SwiGLU (L1, FP32 out), BF16 combine slots (L2) or raw FP32 sums (the per-stage test).
 */
template <int AG, int EPI>
__device__ __forceinline__ void decode_gemm_block(const mmoe_decode_args &p)
{
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int s_tile[MMOE_DECODE_TILE_INTS], s_arow[8], s_orow[8], s_last, s_tok[8];
    const int *s_pair = s_tile + 1; /* the routed tile's pairs */
    __shared__ float s_w[8];
    const int tid = threadIdx.x, warp = tid >> 5;
    const int2 pos = decode_block_pos(p);
    const int y = pos.y;
    const bool shared_part = y < p.shared_tiles;
    const mmoe_decode_part &q = shared_part ? p.shared : p.routed;
    const int row_group = pos.x * DEC_WARPS + warp;
    const int groups = EPI == MMOE_EPI_SWIGLU ? q.n_out / 8 : q.n_out / 16;
    /* dynamic shared memory: rings | staged activations | their scales */
    const int kmax = max(p.shared.K, p.routed.K);
    const int lda = staged_row_bytes(kmax);
    uint8_t *rings = smem;
    uint8_t *sA = rings + DEC_WARPS * RING_BYTES;
    float *sAs = reinterpret_cast<float *>(sA + p.tile_rows * lda);
    int expert = 0, ntok = 0;
    if (shared_part) {
        const int t0 = y * 8;
        ntok = min(8, p.T - t0);
        if (tid < 8) {
            const int t = t0 + tid;
            s_arow[tid] = tid < ntok ? t : -1;
            /* L1 rows of the shared part are tokens; L2 outputs go to slot topk of each token */
            s_orow[tid] = EPI == MMOE_EPI_SLOT_BF16 && p.raw == nullptr ? t * (p.topk + 1) + p.topk : t;
            s_w[tid] = 1.0f;
        }
        __syncthreads();
    } else {
        expert = read_tile(p, y - p.shared_tiles, pos.x, s_tile);
        if (expert < 0)
            return; /* beyond the call's tiles (the grid has an upper bound of them) */
        if (tid < 8) {
            const int i = s_pair[tid];
            /* L1 routed: A row = token; L2 routed: A row = pair (the requantized L1 output row) */
            s_arow[tid] = i < 0 ? -1 : p.routed_a_by_pair ? i : i / p.topk;
            s_orow[tid] = i < 0 ? -1 : EPI == MMOE_EPI_SLOT_BF16 ? (i / p.topk) * (p.topk + 1) + i % p.topk : i;
            s_w[tid] = i < 0 ? 0.0f : p.topk_w[i];
        }
        __syncthreads();
        for (int c = 0; c < 8; c++)
            ntok += s_pair[c] >= 0;
    }
    if (ntok > p.tile_rows)
        __trap(); /* the host's bound of the rows is wrong: staging would overrun sA */
    const bool active = row_group < groups; /* the other part may have more row groups */
    uint8_t *ring = rings + warp * RING_BYTES;
    /* each warp issues its first weight copies, then the block stages the activations (after the
       wait), then each warp streams the rest of its K blocks */
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (!active)
        stage_activations(q, AG, ntok, s_arow, sA, lda, sAs); /* its barrier counts every thread */
    else if (q.bfmt == MMOE_B_FP4)
        decode_warp_fp4<AG, EPI>(q, expert, row_group, s_arow, sA, lda, sAs, ntok, ring, acc);
    else
        decode_warp_fp8<AG, EPI>(q, expert, row_group, s_arow, sA, lda, sAs, ntok, ring, acc);
    /* the weights are read: the next launch's blocks may take the SM slots this block leaves
       and start their own weight copies while the epilogues below run */
    mmoe_grid_launch_dependents();
    if (active)
        decode_epilogue<EPI>(p, q, row_group, acc, s_orow, s_w, ntok);
    /* L1: the last block of each 128-channel group requantizes it (whole groups: n_out % 128 == 0) */
    if constexpr (EPI == MMOE_EPI_SWIGLU)
        if (p.rq_counters != nullptr && pos.x * DEC_WARPS < groups)
            requant_group_if_last<AG>(p, q, pos, shared_part, ntok, s_orow, &s_last);
    /* L2: the last writer of each token's 64-channel chunk sums the token's slots there */
    if constexpr (EPI == MMOE_EPI_SLOT_BF16)
        if (p.cb_counters != nullptr && pos.x * DEC_WARPS < groups)
            combine_rows_if_last(p, pos.x, q.n_out, ntok, s_orow, s_tok);
}

/** The decode GEMM (the "decode16" family: the name a profiler shows). */
template <int AG, int EPI>
__global__ void __launch_bounds__(DEC_THREADS, 5) decode16_gemm_kernel(const __grid_constant__ mmoe_decode_args p)
{
    decode_gemm_block<AG, EPI>(p);
}

/** The kernel instance of one launch: its activation group and epilogue. */
typedef void (*decode_kernel_fn)(mmoe_decode_args);

/** The instance for @p a_group (32 or 128) and @p epi. */
template <int AG>
decode_kernel_fn decode_instance_of_group(mmoe_epi epi)
{
    return epi == MMOE_EPI_SWIGLU ? decode16_gemm_kernel<AG, MMOE_EPI_SWIGLU>
                                  : decode16_gemm_kernel<AG, MMOE_EPI_SLOT_BF16>;
}

decode_kernel_fn decode_instance_of(int a_group, mmoe_epi epi)
{
    return a_group == 32 ? decode_instance_of_group<32>(epi) : decode_instance_of_group<128>(epi);
}

/**
 * Let instance @p fn have the dynamic shared memory of launch @p a (activation group
 * @p a_group); returns its bytes in @p smem.
 */
cudaError_t set_instance_smem(decode_kernel_fn fn, const mmoe_decode_args *a, int a_group, size_t *smem)
{
    *smem = decode_smem_bytes(decode_kmax(a), a_group, a->tile_rows);
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem);
    /* all of the unified L1 as shared memory: the rings are what keeps bytes in flight */
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return e;
}

/** Whether part @p q (with @p tiles grid rows) fits the requantization's counters: whole 128-channel groups. */
bool requant_part_ok(const mmoe_decode_part &q, int tiles, int rq_groups)
{
    return tiles == 0 || (q.n_out % 128 == 0 && q.n_out / 128 <= rq_groups);
}

/** Whether part @p q (with @p tiles grid rows) fits the combine's counters: rows of cb_chunks whole chunks. */
bool combine_part_ok(const mmoe_decode_part &q, int tiles, int cb_chunks)
{
    return tiles == 0 || q.n_out == cb_chunks * CB_CHUNK;
}

/**
 * Whether launch @p a with epilogue @p epi can run: staged rows 1..8, a
 * requantization only on the SwiGLU epilogue with whole groups counted, and a combine only on
 * the BF16 slot epilogue with whole chunks counted.
 */
bool decode_args_ok(const mmoe_decode_args *a, mmoe_epi epi)
{
    if (a->rq_counters != nullptr &&
        (epi != MMOE_EPI_SWIGLU || !requant_part_ok(a->shared, a->shared_tiles, a->rq_groups) ||
         !requant_part_ok(a->routed, a->routed_tiles, a->rq_groups)))
        return false;
    if (a->cb_counters != nullptr &&
        (epi != MMOE_EPI_SLOT_BF16 || a->raw != nullptr || !combine_part_ok(a->shared, a->shared_tiles, a->cb_chunks) ||
         !combine_part_ok(a->routed, a->routed_tiles, a->cb_chunks)))
        return false;
    return a->tile_rows >= 1 && a->tile_rows <= 8;
}

} // namespace

cudaError_t mmoe_launch_decode_gemm(const mmoe_decode_args *a, int a_group, mmoe_epi epi, int pdl, cudaStream_t s)
{
    const int rows_per_group = epi == MMOE_EPI_SWIGLU ? 8 : 16;
    int groups = 0;
    if (a->shared_tiles > 0)
        groups = a->shared.n_out / rows_per_group;
    if (a->routed_tiles > 0 && a->routed.n_out / rows_per_group > groups)
        groups = a->routed.n_out / rows_per_group;
    const int gy = a->shared_tiles + a->routed_tiles;
    if (groups == 0 || gy == 0)
        return cudaSuccess;
    if (!decode_args_ok(a, epi))
        return cudaErrorInvalidValue; /* the staged rows must hold every tile's tokens */
    const decode_kernel_fn fn = decode_instance_of(a_group, epi);
    size_t smem = 0;
    cudaError_t e = set_instance_smem(fn, a, a_group, &smem);
    if (e != cudaSuccess)
        return e;
    const int gx = (groups + DEC_WARPS - 1) / DEC_WARPS;
    int dev = 0, n_sm = 0;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
        return e;
    mmoe_decode_args args = *a;
    args.shared_lead = mmoe_decode_shared_lead(n_sm, a->shared_tiles * gx, a->routed_tiles * gx);
    e = mmoe_launch_ex(pdl, fn, dim3((unsigned)gx, (unsigned)gy), dim3(DEC_THREADS), smem, s, args);
    if (e != cudaSuccess)
        return e;
    return cudaGetLastError();
}

cudaError_t mmoe_decode_gemm_occupancy(const mmoe_decode_args *a, int a_group, mmoe_epi epi, int *blocks)
{
    *blocks = 0;
    if (!decode_args_ok(a, epi))
        return cudaErrorInvalidValue;
    const decode_kernel_fn fn = decode_instance_of(a_group, epi);
    size_t smem = 0;
    cudaError_t e = set_instance_smem(fn, a, a_group, &smem);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, fn, DEC_THREADS, smem);
    return e;
}
