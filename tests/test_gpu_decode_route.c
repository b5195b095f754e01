/**
 * @file test_gpu_decode_route.c
 * @brief Suite "gpu_decode_route": the decode GEMM's table of routed tiles
 *        (src/gpu/gpu_decode_route.h), on the CPU.
 *
 * The decode kernel's blocks take their expert and their 8 (token, slot) pairs from this table,
 * so a wrong entry is a wrong expert or a lost pair on the GPU.  The tiles are checked against
 * a reference written here the slow way (for each expert in ascending order, a scan of every
 * pair, the hits cut into runs of 8), and one small case against a table derived by hand.
 * Random routings with masked slots (-1), tokens that name one expert in several slots, every
 * slot masked, one expert receiving many tiles, and the upper bound of tiles at its two regimes
 * (T * topk, and ceil(T * topk / 8) + E).  The most rows a tile holds (the rows the layer has
 * each block stage) against the reference's most pairs of one expert, capped at 8.  The launch's
 * dispatch order (the shared part's blocks after a lead of routed ones): a case derived by hand
 * and, for random SM counts and part sizes, that every block is computed exactly once, the shared
 * blocks in their window, which closes the first round of SMs.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_decode_route.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"

static uint64_t g_seed;

/** Build the table of @p idx and compare it with the reference; returns the number of tiles. */
static int check_table(int T, int topk, int E, const int32_t *idx, const char *what)
{
    const int max_tiles = mmoe_decode_route_max_tiles(T, topk, E);
    const size_t n = mmoe_decode_route_ints(max_tiles, E);
    int32_t *table = malloc(n * sizeof *table);
    int *cursor = malloc((size_t)E * sizeof *cursor);
    ck_assert(table != NULL && cursor != NULL);
    for (size_t i = 0; i < n; i++)
        table[i] = 0x5A5A5A5A; /* every int must be written */
    const int tiles = mmoe_decode_route_table(T, topk, E, idx, max_tiles, table, cursor);
    ck_assert_msg(tiles >= 0 && tiles <= max_tiles, "%s: %d tiles, bound %d", what, tiles, max_tiles);
    /* the reference: experts ascending, each expert's pairs ascending, runs of 8 */
    int y = 0, valid = 0;
    for (int e = 0; e < E; e++) {
        int count = 0;
        for (long long i = 0; i < (long long)T * topk; i++) {
            if (idx[i] != e)
                continue;
            const int ty = y + count / 8, place = count % 8;
            ck_assert_msg(ty < tiles, "%s: expert %d pair %lld beyond the %d tiles", what, e, i, tiles);
            ck_assert_msg(table[(size_t)ty * MMOE_DECODE_TILE_INTS] == e, "%s: tile %d expert %d, want %d", what, ty,
                          table[(size_t)ty * MMOE_DECODE_TILE_INTS], e);
            ck_assert_msg(table[(size_t)ty * MMOE_DECODE_TILE_INTS + 1 + place] == (int32_t)i,
                          "%s: tile %d place %d holds pair %d, want %lld (seed %llu)", what, ty, place,
                          table[(size_t)ty * MMOE_DECODE_TILE_INTS + 1 + place], i, (unsigned long long)g_seed);
            count++;
        }
        /* the places past the expert's last pair are empty */
        for (int c = count; c < (count + 7) / 8 * 8; c++)
            ck_assert_msg(table[(size_t)(y + c / 8) * MMOE_DECODE_TILE_INTS + 1 + c % 8] == -1,
                          "%s: tile %d place %d not empty", what, y + c / 8, c % 8);
        ck_assert_msg(table[(size_t)max_tiles * MMOE_DECODE_TILE_INTS + e] == count, "%s: count of expert %d %d, want %d",
                      what, e, table[(size_t)max_tiles * MMOE_DECODE_TILE_INTS + e], count);
        y += (count + 7) / 8;
        valid += count;
    }
    ck_assert_msg(tiles == y, "%s: %d tiles, want %d", what, tiles, y);
    for (int t = tiles; t < max_tiles; t++)
        for (int k = 0; k < MMOE_DECODE_TILE_INTS; k++)
            ck_assert_msg(table[(size_t)t * MMOE_DECODE_TILE_INTS + k] == -1, "%s: unused tile %d int %d = %d", what, t,
                          k, table[(size_t)t * MMOE_DECODE_TILE_INTS + k]);
    int most = 0;
    for (int e = 0; e < E; e++) {
        int count = 0;
        for (long long i = 0; i < (long long)T * topk; i++)
            count += idx[i] == e;
        most = count > most ? count : most;
    }
    ck_assert_msg(mmoe_decode_route_most_rows(table, max_tiles, E) == (most < 8 ? most : 8),
                  "%s: most rows %d, want min(8, %d)", what, mmoe_decode_route_most_rows(table, max_tiles, E), most);
    ck_assert_msg(table[(size_t)max_tiles * MMOE_DECODE_TILE_INTS + E] == valid, "%s: %d valid pairs, want %d", what,
                  table[(size_t)max_tiles * MMOE_DECODE_TILE_INTS + E], valid);
    free(table);
    free(cursor);
    return tiles;
}

START_TEST(hand_derived_table)
{
    /* T = 3, topk = 2, E = 2: pairs 0..5 route to 1, 0, 1, 1, masked, 0.  Expert 0 holds pairs 1
       and 5 (tile 0), expert 1 pairs 0, 2, 3 (tile 1); the bound is min(6, ceil(6 / 8) + 2) = 3
       tiles, so tile 2 is empty; counts 2 and 3, 5 valid pairs. */
    const int32_t idx[6] = {1, 0, 1, 1, -1, 0};
    const int32_t want[3 * MMOE_DECODE_TILE_INTS + 3] = {
        0, 1, 5, -1, -1, -1, -1, -1, -1, /* tile 0 */
        1, 0, 2, 3, -1, -1, -1, -1, -1,  /* tile 1 */
        -1, -1, -1, -1, -1, -1, -1, -1, -1, /* tile 2: none */
        2, 3, 5};
    ck_assert_int_eq(mmoe_decode_route_max_tiles(3, 2, 2), 3);
    ck_assert_uint_eq(mmoe_decode_route_ints(3, 2), sizeof want / sizeof want[0]);
    int32_t table[sizeof want / sizeof want[0]];
    int cursor[2];
    ck_assert_int_eq(mmoe_decode_route_table(3, 2, 2, idx, 3, table, cursor), 2);
    ck_assert_int_eq(mmoe_decode_route_most_rows(table, 3, 2), 3); /* expert 1's three pairs */
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(table[i] == want[i], "int %zu: %d, want %d", i, table[i], want[i]);
    check_table(3, 2, 2, idx, "hand");
}
END_TEST

START_TEST(random_routings_match_the_reference)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed);
    static const int shapes[][3] = {{1, 6, 256}, {2, 6, 256}, {8, 6, 256}, {128, 6, 256}, {300, 8, 64},
                                    {1000, 6, 256}, {64, 2, 3}, {17, 4, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], topk = shapes[s][1], E = shapes[s][2];
        int32_t *idx = malloc((size_t)T * topk * sizeof *idx);
        ck_assert(idx != NULL);
        for (int kind = 0; kind < 3; kind++) {
            for (long long i = 0; i < (long long)T * topk; i++) {
                const uint32_t r = mmoe_rng_u32(&rng);
                /* kind 0: any expert; 1: a fifth of the slots masked; 2: few experts, repeats */
                idx[i] = kind == 2 ? (int32_t)(r % (uint32_t)(E < 3 ? E : 3))
                         : kind == 1 && r % 5 == 0 ? -1
                                                    : (int32_t)(r % (uint32_t)E);
            }
            char what[64];
            snprintf(what, sizeof what, "T=%d topk=%d E=%d kind %d", T, topk, E, kind);
            check_table(T, topk, E, idx, what);
        }
        for (long long i = 0; i < (long long)T * topk; i++)
            idx[i] = -1;
        ck_assert_int_eq(check_table(T, topk, E, idx, "all masked"), 0);
        free(idx);
    }
}
END_TEST

START_TEST(upper_bound_of_tiles)
{
    /* one pair per expert at most: every pair its own tile (bound T * topk) */
    ck_assert_int_eq(mmoe_decode_route_max_tiles(1, 6, 256), 6);
    /* many pairs: full tiles plus at most one partial tile per expert */
    ck_assert_int_eq(mmoe_decode_route_max_tiles(128, 6, 256), 96 + 256);
    /* the bound reached: 6 distinct experts of one token; 9 pairs of one expert: 8 + 1, 2 tiles */
    const int32_t one[6] = {5, 4, 3, 2, 1, 0};
    ck_assert_int_eq(check_table(1, 6, 6, one, "distinct"), 6);
    const int32_t nine[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(check_table(9, 1, 2, nine, "nine of one expert"), 2);
}
END_TEST

START_TEST(dispatch_order_hand_derived)
{
    /* 2 shared blocks, 6 routed, 3 routed first: positions 0..7 hold blocks 2 3 4 | 0 1 | 5 6 7 */
    const int want[8] = {2, 3, 4, 0, 1, 5, 6, 7};
    for (int o = 0; o < 8; o++)
        ck_assert_int_eq(mmoe_decode_block_natural(o, 2, 3), want[o]);
    /* the one-token V4-Flash launches on an H200: 64 shared and 384 routed blocks, 132 SMs:
       68 routed blocks first, so the shared ones take the last 64 places of the first round */
    ck_assert_int_eq(mmoe_decode_shared_lead(132, 64, 384), 68);
    /* fewer routed blocks than the free places: all of them first */
    ck_assert_int_eq(mmoe_decode_shared_lead(132, 64, 10), 10);
    /* shared blocks that fill a round, or none: the natural order */
    ck_assert_int_eq(mmoe_decode_shared_lead(132, 132, 384), 0);
    ck_assert_int_eq(mmoe_decode_shared_lead(132, 1024, 384), 0);
    ck_assert_int_eq(mmoe_decode_shared_lead(132, 0, 384), 0);
    for (int o = 0; o < 20; o++)
        ck_assert_int_eq(mmoe_decode_block_natural(o, 4, 0), o);
}
END_TEST

START_TEST(dispatch_order_is_a_permutation)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed ^ 0xD15Full);
    for (int trial = 0; trial < 200; trial++) {
        const int n_sm = 1 + (int)mmoe_rng_below(&rng, 200);
        const int shared = (int)mmoe_rng_below(&rng, 300), routed = (int)mmoe_rng_below(&rng, 700);
        const int lead = mmoe_decode_shared_lead(n_sm, shared, routed), n = shared + routed;
        ck_assert(lead >= 0 && lead <= routed);
        char *seen = calloc((size_t)n + 1, 1);
        ck_assert(seen != NULL);
        for (int o = 0; o < n; o++) {
            const int b = mmoe_decode_block_natural(o, shared, lead);
            ck_assert_msg(b >= 0 && b < n && !seen[b], "seed %llu trial %d: position %d gives block %d twice or "
                          "out of range (%d shared, %d routed, lead %d)", (unsigned long long)g_seed, trial, o, b,
                          shared, routed, lead);
            seen[b] = 1;
            /* the shared blocks occupy positions [lead, lead + shared) */
            ck_assert_int_eq(b < shared, o >= lead && o < lead + shared);
        }
        /* where the shared blocks do not fill a round of SMs, they end that round or precede
           every routed block that is left */
        if (shared > 0 && shared < n_sm)
            ck_assert(lead + shared == n_sm || lead == routed);
        free(seen);
    }
}
END_TEST

static Suite *decode_route_suite(void)
{
    Suite *s = suite_create("gpu_decode_route");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, hand_derived_table);
    tcase_add_test(tc, random_routings_match_the_reference);
    tcase_add_test(tc, upper_bound_of_tiles);
    tcase_add_test(tc, dispatch_order_hand_derived);
    tcase_add_test(tc, dispatch_order_is_a_permutation);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("gpu_decode_route");
    return mmoe_test_run(decode_route_suite());
}
