/**
 * @file gpu_decode_route.h
 * @brief The decode GEMM's routed tiles (gpu_decode.cu), computed once per call on the host, in
 *        plain C that the layer (gpu_moe.cu) and a CPU test (tests/test_gpu_decode_route.c) share.
 *
 * The decode GEMM's routed part is a list of tiles of at most 8 (token, slot) pairs of one
 * expert: the experts in ascending order, each expert's valid pairs in ascending pair order
 * (pair i = token * topk + slot) cut into runs of 8.  A tile is one grid row of the launch, and
 * every block of that row needs its expert and its pairs before it can issue its first weight
 * copy.  The layer checks each call's routing on the host as it uploads it; it builds this table
 * there too and uploads it with the routing, so that a block reads its tile with one load
 * instead of scanning the T * topk pairs of topk_idx itself, as each of a launch's thousands of
 * blocks would.
 *
 * The table, MMOE_DECODE_TILE_INTS ints per tile for the launch's upper bound of tiles
 * (mmoe_decode_route_max_tiles), then the call's routing counters:
 *
 *     tile y:  [expert, pair 0, ..., pair 7]   (expert -1: no such tile; pair -1: past the tile's end)
 *     then:    [pairs of expert 0, ..., pairs of expert E - 1, valid pairs]
 */
#ifndef MMOE_GPU_DECODE_ROUTE_H
#define MMOE_GPU_DECODE_ROUTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define MMOE_DROUTE_FN __host__ __device__ static inline
#else
/** The qualifiers of the functions a kernel also calls: host and device under nvcc, static inline in C. */
#define MMOE_DROUTE_FN static inline
#endif

/** Ints of one tile's entry: the expert and 8 pair indices. */
enum { MMOE_DECODE_TILE_INTS = 9 };

/** Upper bound of the routed tiles of 8 pairs for @p T tokens, @p topk slots and @p E experts. */
static inline int mmoe_decode_route_max_tiles(int T, int topk, int E)
{
    const long long pairs = (long long)T * topk, bound = (pairs + 7) / 8 + E;
    return (int)(pairs < bound ? pairs : bound);
}

/** Ints of the table for @p max_tiles tiles and @p E experts. */
static inline size_t mmoe_decode_route_ints(int max_tiles, int E)
{
    return (size_t)max_tiles * MMOE_DECODE_TILE_INTS + (size_t)E + 1;
}

/**
 * Fill @p table (mmoe_decode_route_ints(max_tiles, E) ints, max_tiles from
 * mmoe_decode_route_max_tiles) from @p topk_idx ([T, topk], entries -1..E-1, checked by the
 * caller); @p cursor is scratch of E ints.  Returns the number of tiles.
 */
static inline int mmoe_decode_route_table(int T, int topk, int E, const int32_t *topk_idx, int max_tiles,
                                          int32_t *table, int *cursor)
{
    const long long pairs = (long long)T * topk;
    int32_t *counts = table + (size_t)max_tiles * MMOE_DECODE_TILE_INTS;
    for (size_t i = 0; i < (size_t)max_tiles * MMOE_DECODE_TILE_INTS; i++)
        table[i] = -1;
    for (int e = 0; e < E; e++)
        counts[e] = 0;
    int32_t valid = 0;
    for (long long i = 0; i < pairs; i++)
        if (topk_idx[i] >= 0) {
            counts[topk_idx[i]]++;
            valid++;
        }
    counts[E] = valid;
    /* cursor[e]: the table position (tile * 8 + place) of expert e's next pair */
    int tiles = 0;
    for (int e = 0; e < E; e++) {
        cursor[e] = tiles * 8;
        tiles += (counts[e] + 7) / 8;
    }
    for (long long i = 0; i < pairs; i++) {
        const int e = topk_idx[i];
        if (e < 0)
            continue;
        const int pos = cursor[e]++, y = pos / 8;
        table[(size_t)y * MMOE_DECODE_TILE_INTS] = e;
        table[(size_t)y * MMOE_DECODE_TILE_INTS + 1 + pos % 8] = (int32_t)i;
    }
    return tiles;
}

/**
 * The most pairs one tile of @p table (built for @p max_tiles tiles and @p E experts) holds:
 * the most pairs of one expert, capped at 8, the rows a routed tile stages at most.
 */
static inline int mmoe_decode_route_most_rows(const int32_t *table, int max_tiles, int E)
{
    const int32_t *counts = table + (size_t)max_tiles * MMOE_DECODE_TILE_INTS;
    int most = 0;
    for (int e = 0; e < E; e++)
        most = counts[e] > most ? counts[e] : most;
    return most < 8 ? most : 8;
}

/**
 * The dispatch order of a decode GEMM launch's blocks.  In the natural order the shared part's
 * @p shared_blocks blocks come first (grid rows [0, shared_tiles)), then the routed ones.  The
 * GPU hands out a launch's blocks in order, one to each SM in turn, so with fewer blocks than
 * two rounds of SMs the blocks of the last, partial round land on the SMs that got the first
 * blocks.  The shared expert's blocks stream twice the bytes of a routed block (FP8 against
 * MXFP4), so they should not share an SM with a block of that last round: the launch lets
 * @p lead routed blocks go first, so that the shared blocks take the last places of the first
 * round.  Returns min(routed_blocks, n_sm - shared_blocks), or 0 when the shared blocks fill a
 * round (or there are none).
 */
static inline int mmoe_decode_shared_lead(int n_sm, int shared_blocks, int routed_blocks)
{
    if (shared_blocks <= 0 || shared_blocks >= n_sm)
        return 0;
    const int free_places = n_sm - shared_blocks;
    return routed_blocks < free_places ? routed_blocks : free_places;
}

/**
 * The natural number of the block at dispatch position @p order: positions [0, lead) hold
 * routed blocks shared_blocks .. shared_blocks + lead - 1, the next @p shared_blocks positions
 * the shared part's blocks, the rest the remaining routed blocks in order (a permutation of
 * the launch's blocks for every 0 <= lead).
 */
MMOE_DROUTE_FN int mmoe_decode_block_natural(int order, int shared_blocks, int lead)
{
    if (order < lead)
        return shared_blocks + order;
    if (order < lead + shared_blocks)
        return order - lead;
    return order;
}

#endif /* MMOE_GPU_DECODE_ROUTE_H */
