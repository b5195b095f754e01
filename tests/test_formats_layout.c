/**
 * @file test_formats_layout.c
 * @brief Suite "formats_layout": scale and weight layout transforms (fmt_layout.c) and their
 *        inverses, on random shapes.
 *
 * The index formulas of docs/spec/formats.md (SM100 layouts) are written out again here and each
 * transform is checked element by element against them, then against its inverse.
 */
#include <stdlib.h>
#include <string.h>

#include "fmt_oracle.h"
#include "mmoe_formats.h"
#include "mmoe_test.h"

static uint32_t u32_of(int32_t w)
{
    uint32_t u;
    memcpy(&u, &w, sizeof u);
    return u;
}

START_TEST(mn_major_packing)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_layout.mn_major"));
    for (int trial = 0; trial < 100; trial++) {
        size_t g = 1 + (size_t)mmoe_rng_below(&rng, 3), mn = 1 + (size_t)mmoe_rng_below(&rng, 70);
        size_t ksf = 1 + (size_t)mmoe_rng_below(&rng, 23);
        size_t P = (ksf + 3) / 4, A = (mn + 3) / 4 * 4; /* strides (P*A, 1, A) */
        size_t nwords = mmoe_sf_mn_major_words(g, mn, ksf);
        ck_assert_uint_eq(nwords, g * P * A);
        uint8_t *sf = malloc(g * mn * ksf), *back = malloc(g * mn * ksf);
        float *sff = malloc(g * mn * ksf * sizeof(float));
        int32_t *out = malloc((nwords + 1) * sizeof(int32_t)), *outf = malloc(nwords * sizeof(int32_t));
        for (size_t i = 0; i < g * mn * ksf; i++) {
            sf[i] = (uint8_t)(1 + mmoe_rng_below(&rng, 254));
            sff[i] = mmoe_ue8m0_to_f32(sf[i]);
        }
        out[nwords] = 0x5A5A5A5A;
        mmoe_sf_pack_mn_major(sf, g, mn, ksf, out);
        ck_assert_int_eq(out[nwords], 0x5A5A5A5A);
        for (size_t gi = 0; gi < g; gi++)
            for (size_t p = 0; p < P; p++)
                for (size_t r = 0; r < A; r++) {
                    uint32_t w = u32_of(out[gi * P * A + p * A + r]);
                    for (size_t b = 0; b < 4; b++) {
                        size_t kk = 4 * p + b;
                        uint32_t want = (r < mn && kk < ksf) ? sf[(gi * mn + r) * ksf + kk] : 0;
                        FMT_CHECK(((w >> (8 * b)) & 0xFF) == want, "g%zu r%zu k%zu", gi, r, kk);
                    }
                }
        mmoe_sf_pack_mn_major_f32(sff, g, mn, ksf, outf);
        ck_assert_int_eq(memcmp(out, outf, nwords * sizeof(int32_t)), 0);
        memset(back, 0, g * mn * ksf);
        mmoe_sf_unpack_mn_major(out, g, mn, ksf, back);
        ck_assert_int_eq(memcmp(sf, back, g * mn * ksf), 0);
        free(sf), free(back), free(sff), free(out), free(outf);
    }
}
END_TEST

START_TEST(utccp_transpose)
{
    /* r' = 4*(r%32) + (r/32)%4 within each 128 rows */
    ck_assert_uint_eq(mmoe_utccp_row(0), 0);
    ck_assert_uint_eq(mmoe_utccp_row(32), 1);
    ck_assert_uint_eq(mmoe_utccp_row(64), 2);
    ck_assert_uint_eq(mmoe_utccp_row(96), 3);
    ck_assert_uint_eq(mmoe_utccp_row(1), 4);
    ck_assert_uint_eq(mmoe_utccp_row(127), 127);
    ck_assert_uint_eq(mmoe_utccp_row(128 + 33), 128 + 5);
    int seen[128] = {0};
    for (size_t r = 0; r < 512; r++) {
        size_t want = (r / 128) * 128 + 4 * (r % 32) + ((r % 128) / 32) % 4;
        ck_assert_uint_eq(mmoe_utccp_row(r), want);
        ck_assert_uint_eq(mmoe_utccp_row_inv(mmoe_utccp_row(r)), r);
        if (r < 128)
            seen[want]++;
    }
    for (int i = 0; i < 128; i++)
        ck_assert_int_eq(seen[i], 1); /* a permutation */

    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_layout.utccp"));
    for (int trial = 0; trial < 30; trial++) {
        size_t g = 1 + (size_t)mmoe_rng_below(&rng, 3), mn = 128 * (1 + (size_t)mmoe_rng_below(&rng, 4));
        size_t ksf = 1 + (size_t)mmoe_rng_below(&rng, 40), P = (ksf + 3) / 4;
        size_t n = mmoe_sf_mn_major_words(g, mn, ksf);
        ck_assert_uint_eq(n, g * P * mn);
        int32_t *a = malloc(n * sizeof *a), *t = malloc(n * sizeof *t), *b = malloc(n * sizeof *b);
        for (size_t i = 0; i < n; i++)
            a[i] = (int32_t)mmoe_rng_u32(&rng);
        ck_assert_int_eq(mmoe_sf_utccp_transpose(a, g, mn, ksf, t, NULL), MMOE_OK);
        for (size_t gi = 0; gi < g; gi++)
            for (size_t p = 0; p < P; p++)
                for (size_t r = 0; r < mn; r++) {
                    size_t rp = (r / 128) * 128 + 4 * (r % 32) + ((r % 128) / 32);
                    FMT_CHECK(t[(gi * P + p) * mn + rp] == a[(gi * P + p) * mn + r], "utccp g%zu p%zu r%zu", gi, p, r);
                }
        ck_assert_int_eq(mmoe_sf_utccp_untranspose(t, g, mn, ksf, b, NULL), MMOE_OK);
        ck_assert_int_eq(memcmp(a, b, n * sizeof *a), 0);
        free(a), free(t), free(b);
    }
    mmoe_error err;
    int32_t dummy[4] = {0};
    ck_assert_int_eq(mmoe_sf_utccp_transpose(dummy, 1, 100, 4, dummy, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "MN=100"));
    ck_assert_int_eq(mmoe_sf_utccp_untranspose(dummy, 1, 4, 4, dummy, &err), MMOE_EINVAL);
}
END_TEST

static size_t spec_pool_row(size_t m, size_t bm)
{
    size_t i = m % bm, a = (bm + 127) / 128 * 128;
    return (m / bm) * a + (i & ~(size_t)127) + (i % 32) * 4 + (i / 32) % 4;
}

START_TEST(sf_pool_rows)
{
    static const size_t bms[] = {8, 16, 32, 48, 64, 96, 128, 160, 192, 240, 256, 384};
    for (size_t bi = 0; bi < sizeof bms / sizeof bms[0]; bi++) {
        size_t bm = bms[bi];
        size_t t = 3 * bm + 5, rows = mmoe_sf_pool_rows(t, bm);
        ck_assert_uint_eq(rows, 4 * ((bm + 127) / 128 * 128));
        char *hit = calloc(rows, 1);
        for (size_t m = 0; m < t; m++) {
            size_t row = mmoe_sf_pool_row(m, bm);
            ck_assert_uint_eq(row, spec_pool_row(m, bm));
            ck_assert_uint_lt(row, rows);
            ck_assert_int_eq(hit[row], 0); /* injective */
            hit[row] = 1;
            size_t back = 0;
            ck_assert_int_eq(mmoe_sf_pool_token(row, bm, &back), 1);
            ck_assert_uint_eq(back, m);
        }
        /* rows no token of a full block maps to are padding */
        for (size_t row = 0; row < 3 * ((bm + 127) / 128 * 128); row++) {
            size_t m;
            ck_assert_int_eq(mmoe_sf_pool_token(row, bm, &m), hit[row]);
        }
        free(hit);
    }
}
END_TEST

START_TEST(sf_pool_scatter_gather)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_layout.pool"));
    static const size_t bms[] = {32, 64, 96, 128, 192, 256};
    for (int trial = 0; trial < 40; trial++) {
        size_t bm = bms[trial % 6], t = 1 + (size_t)mmoe_rng_below(&rng, 600), p = 1 + (size_t)mmoe_rng_below(&rng, 5);
        size_t used = mmoe_sf_pool_rows(t, bm), nrows = used + (size_t)mmoe_rng_below(&rng, 64);
        int pad_last = trial % 2;
        int32_t *x = malloc(t * p * sizeof *x), *back = malloc(t * p * sizeof *back);
        int32_t *pool = malloc(nrows * p * sizeof *pool);
        for (size_t i = 0; i < t * p; i++)
            x[i] = (int32_t)mmoe_rng_u32(&rng);
        for (size_t i = 0; i < nrows * p; i++)
            pool[i] = 0x5A5A5A5A;
        ck_assert_int_eq(mmoe_sf_to_pool(x, t, p, bm, nrows, pad_last, pool, NULL), MMOE_OK);
        for (size_t row = 0; row < nrows; row++)
            for (size_t kp = 0; kp < p; kp++) {
                int32_t got = pool[kp * nrows + row];
                size_t m;
                int tok = mmoe_sf_pool_token(row, bm, &m) && m < t;
                int32_t want = row >= used ? 0x5A5A5A5A : tok ? x[m * p + kp] : pad_last ? x[(t - 1) * p + kp] : 0;
                FMT_CHECK(got == want, "pool row %zu kp %zu (bm %zu t %zu)", row, kp, bm, t);
            }
        memset(back, 0, t * p * sizeof *back);
        ck_assert_int_eq(mmoe_sf_from_pool(pool, t, p, bm, nrows, back, NULL), MMOE_OK);
        ck_assert_int_eq(memcmp(x, back, t * p * sizeof *x), 0);
        mmoe_error err;
        ck_assert_int_eq(mmoe_sf_to_pool(x, t, p, bm, used - 1, 0, pool, &err), MMOE_EINVAL);
        ck_assert_ptr_nonnull(strstr(err.msg, "too small"));
        ck_assert_int_eq(mmoe_sf_from_pool(pool, t, p, 0, nrows, back, &err), MMOE_EINVAL);
        free(x), free(back), free(pool);
    }
}
END_TEST

START_TEST(l1_interleave)
{
    /* I = 16: [g0..g7, u0..u7, g8..g15, u8..u15] */
    enum { I = 16 };
    uint8_t in[2 * I], out[2 * I], back[2 * I];
    for (int r = 0; r < 2 * I; r++)
        in[r] = (uint8_t)r; /* row r holds its logical index: gate j = j, up j = I + j */
    ck_assert_int_eq(mmoe_l1_interleave(in, I, 1, out, NULL), MMOE_OK);
    static const uint8_t want[2 * I] = {0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18, 19, 20, 21, 22, 23,
                                        8,  9,  10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    ck_assert_int_eq(memcmp(out, want, sizeof want), 0);
    ck_assert_int_eq(mmoe_l1_deinterleave(out, I, 1, back, NULL), MMOE_OK);
    ck_assert_int_eq(memcmp(in, back, sizeof in), 0);

    /* each 128-row N-block n holds gate and up of channels 64n .. 64n+63 */
    size_t inter = 256;
    for (size_t r = 0; r < 2 * inter; r++) {
        size_t p = mmoe_l1_interleave_row(r, inter), j = r % inter;
        ck_assert_uint_eq(p / 128, j / 64);
        ck_assert_uint_eq(mmoe_l1_deinterleave_row(p, inter), r);
    }

    mmoe_rng rng;
    mmoe_rng_seed(&rng, mmoe_test_seed("formats_layout.interleave"));
    for (int trial = 0; trial < 30; trial++) {
        size_t in_i = 8 * (1 + (size_t)mmoe_rng_below(&rng, 40)), rb = 1 + (size_t)mmoe_rng_below(&rng, 70);
        uint8_t *a = malloc(2 * in_i * rb), *t = malloc(2 * in_i * rb), *b = malloc(2 * in_i * rb);
        for (size_t i = 0; i < 2 * in_i * rb; i++)
            a[i] = (uint8_t)mmoe_rng_u32(&rng);
        ck_assert_int_eq(mmoe_l1_interleave(a, in_i, rb, t, NULL), MMOE_OK);
        for (size_t r = 0; r < 2 * in_i; r++) {
            size_t j = r % in_i, p = 16 * (j / 8) + (r >= in_i ? 8 : 0) + j % 8;
            FMT_CHECK(memcmp(t + p * rb, a + r * rb, rb) == 0, "row %zu", r);
        }
        ck_assert_int_eq(mmoe_l1_deinterleave(t, in_i, rb, b, NULL), MMOE_OK);
        ck_assert_int_eq(memcmp(a, b, 2 * in_i * rb), 0);
        free(a), free(t), free(b);
    }
    mmoe_error err;
    ck_assert_int_eq(mmoe_l1_interleave(in, 12, 1, out, &err), MMOE_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "I=12"));
    ck_assert_int_eq(mmoe_l1_deinterleave(in, 4, 1, out, &err), MMOE_EINVAL);
}
END_TEST

static Suite *layout_suite(void)
{
    Suite *s = suite_create("formats_layout");
    TCase *tc = tcase_create("layout");
    tcase_add_test(tc, mn_major_packing);
    tcase_add_test(tc, utccp_transpose);
    tcase_add_test(tc, sf_pool_rows);
    tcase_add_test(tc, sf_pool_scatter_gather);
    tcase_add_test(tc, l1_interleave);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mmoe_test_run(layout_suite());
}
