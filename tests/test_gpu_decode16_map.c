/**
 * @file test_gpu_decode16_map.c
 * @brief Suite "gpu_decode16_map": the bit moves and index maps of the decode16 GEMM
 *        (src/gpu/gpu_decode16_map.h), on the CPU, against the oracle's format decoders and a
 *        model of the m16n8k16 MMA written here from the PTX fragment layout.
 *
 * The decode16 kernel runs only on a device; what decides its numbers besides the tensor core
 * is plain integer code, shared with this test:
 * - every E2M1 code, in every nibble position of a packed word, moved to F16 bits is
 *   e2m1 * 2^-14 (mmoe_fp4_e2m1_to_f32 is the reference; the F16 bits are decoded here from the
 *   format's fields), sign included;
 * - every E4M3 byte, in every byte position of a word, converted by the header's host model
 *   of cvt.rn.f16x2.e4m3x2 is the F16 number of the same value (mmoe_fp8_e4m3_to_f32 is the
 *   reference), sign of zero included, NaN stays NaN;
 * - every UE8M0 byte in every position of a scale word gives the FP32 bits of 2^(k - 127)
 *   (ldexpf is the reference: k = 0 is the subnormal 2^-127, k = 255 infinity);
 * - one warp's K block modelled end to end with the header's maps: the staging of FP8
 *   activations as bytes (byte permutes, run offsets), each lane's staged words and their F16
 *   pairs, the weight fragments (MXFP4 bit moves and pairs; FP8 bytes in order), then m16n8k16
 *   as the PTX layout defines it (lane (g, t): A rows g, g + 8 at k = 2t, 2t + 1 and 2t + 8,
 *   2t + 9; B column g at the same k).  One-hot weights times one-hot activations: each (row,
 *   k) x (token, k) product is formed exactly once, in the sum of its own 32-wide group (MXFP4
 *   group sums; FP8 per-group path), never across k; tokens past the tile's rows read row 0
 *   and are not checked (the kernel writes no such column); random blocks equal the float64 dot product exactly.
 * - the wgmma kernel's maps (gpu_gemm_wgmma.cu): its K order names every k of a 32-group once,
 *   and the widened activations hold at each position the E4M3 byte it names; one consumer
 *   warp's K block modelled with the same m16n8k16 layout (the wgmma's A fragments per warp),
 *   the A registers from the header's pair functions, B read from the widened rows the way the
 *   tensor core reads its K-major tile: one-hot weights times one-hot activations meet once, in
 *   their own group, for both weight formats, and random blocks equal the float64 dot products.
 * - the decode kernel's MXFP4 copy stage: its pieces tile a half once, the rows of each
 *   ldmatrix matrix fall in different banks, and ldmatrix (modelled here from the PTX ISA) gives
 *   each lane the words its fragments take.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gpu_decode16_map.h"
#include "mmoe_formats.h"
#include "mmoe_rng.h"
#include "mmoe_test.h"

enum { KB = 128, ROWS = 16, TOKS = 8, LANES = 32 };

static uint64_t g_seed;

/**
 * REQUIRE() without its per-call bookkeeping (Check records every passing assertion, a
 * system call each): the loops below make millions of checks.
 */
#define REQUIRE(cond, ...)                                                                          \
    do {                                                                                            \
        if (!(cond))                                                                                \
            ck_abort_msg(__VA_ARGS__);                                                              \
    } while (0)

/** An F16 number from its bits, from the format's fields (1 sign, 5 exponent bits of bias 15, 10 mantissa bits). */
static double f16_value(uint16_t h)
{
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/** Half @p i (0: low) of an F16 pair. */
static double half_of(uint32_t r, int i)
{
    return f16_value((uint16_t)(r >> (16 * i)));
}

START_TEST(e2m1_to_f16_every_code_and_position)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed);
    for (int fill = 0; fill < 64; fill++) {
        const uint32_t others = fill == 0 ? 0u : fill == 1 ? 0xFFFFFFFFu : mmoe_rng_u32(&rng);
        for (int c = 0; c < 16; c++)
            for (int pos = 0; pos < 8; pos++) {
                const uint32_t w = (others & ~(0xFu << (4 * pos))) | (uint32_t)c << (4 * pos);
                /* byte pos / 2 holds the code; even positions are the low nibbles */
                const uint32_t high = pos % 2 == 0 ? mmoe_d16_e2m1_even_high(w) : mmoe_d16_e2m1_odd_high(w);
                const int byte = pos / 2;
                const uint32_t pair = byte < 2 ? mmoe_d16_f16_pair_lo(high) : mmoe_d16_f16_pair_hi(high);
                const double got = half_of(pair, byte % 2), want = ldexp(mmoe_fp4_e2m1_to_f32((uint8_t)c), -14);
                REQUIRE(got == want && !!signbit(got) == !!(c & 8),
                              "code %d at nibble %d of %08x: F16 %g, want %g (seed %llu)", c, pos, w, got, want,
                              (unsigned long long)g_seed);
            }
    }
}
END_TEST

/** The F16 bits of a value that F16 holds exactly (normal, subnormal, zero or infinity), from F16's fields. */
static uint16_t f16_bits_of(double v)
{
    const uint16_t sign = signbit(v) ? 0x8000u : 0u;
    const double a = fabs(v);
    if (a == 0.0)
        return sign;
    if (isinf(a))
        return sign | 0x7C00u;
    int e;
    const double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    if (e - 1 < -14)                /* subnormal: a = m * 2^-24 */
        return sign | (uint16_t)ldexp(a, 24);
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(ldexp(fr, 11) - 1024.0);
}

START_TEST(e4m3_to_f16_every_byte_and_position)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 3);
    for (int fill = 0; fill < 16; fill++) {
        const uint32_t others = fill == 0 ? 0u : fill == 1 ? 0xFFFFFFFFu : mmoe_rng_u32(&rng);
        for (int b = 0; b < 256; b++)
            for (int pos = 0; pos < 4; pos++) {
                const uint32_t v = (others & ~(0xFFu << (8 * pos))) | (uint32_t)b << (8 * pos);
                uint32_t lo, hi;
                mmoe_d16_e4m3x4_to_f16x2(v, &lo, &hi);
                const uint16_t got = (uint16_t)((pos < 2 ? lo : hi) >> (16 * (pos % 2)));
                const float want = mmoe_fp8_e4m3_to_f32((uint8_t)b);
                if (isnan(want)) {
                    REQUIRE(isnan(f16_value(got)) && (got >> 15) == (uint16_t)(b >> 7),
                            "E4M3 NaN %02x at byte %d of %08x: F16 %04x is not a NaN of its sign", b, pos, v, got);
                } else {
                    REQUIRE(got == f16_bits_of(want), "E4M3 %02x (%g) at byte %d of %08x: F16 %04x, want %04x", b,
                            (double)want, pos, v, got, f16_bits_of(want));
                }
            }
    }
}
END_TEST

START_TEST(ue8m0_factor_bits)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 1);
    for (int k = 0; k < 256; k++)
        for (int g = 0; g < 4; g++)
            for (int rep = 0; rep < 8; rep++) {
                const uint32_t w = (mmoe_rng_u32(&rng) & ~(0xFFu << (8 * g))) | (uint32_t)k << (8 * g);
                const float want = k == 255 ? INFINITY : ldexpf(1.0f, k - 127);
                uint32_t want_bits;
                memcpy(&want_bits, &want, 4);
                REQUIRE(mmoe_d16_ue8m0_pow2_bits(w, g) == want_bits, "byte %d at %d of %08x: %08x, want %08x", k,
                              g, w, mmoe_d16_ue8m0_pow2_bits(w, g), want_bits);
            }
}
END_TEST

/** One lane's A (4 F16 pairs) and B (2 pairs) fragment registers of one MMA step, as doubles. */
typedef struct frag {
    double a[4][2], b[2][2];
} frag;

/** m16n8k16 as the PTX layout defines it: D[16][8] += A B from the 32 lanes' fragments. */
static void mma_m16n8k16(double d[ROWS][TOKS], const frag f[LANES])
{
    double A[ROWS][16], B[16][TOKS];
    for (int lane = 0; lane < LANES; lane++) {
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 2; i++) {
            A[g][2 * t + i] = f[lane].a[0][i];
            A[g + 8][2 * t + i] = f[lane].a[1][i];
            A[g][2 * t + 8 + i] = f[lane].a[2][i];
            A[g + 8][2 * t + 8 + i] = f[lane].a[3][i];
            B[2 * t + i][g] = f[lane].b[0][i];
            B[2 * t + 8 + i][g] = f[lane].b[1][i];
        }
    }
    for (int r = 0; r < ROWS; r++)
        for (int n = 0; n < TOKS; n++)
            for (int k = 0; k < 16; k++)
                d[r][n] += A[r][k] * B[k][n];
}

/**
 * The block's staging of one K block of @p ntok token rows of FP8 activations, as bytes, with the
 * header's byte permutes and run offsets: staged[token][byte].  Rows past the tile's tokens hold
 * E4M3 NaN bytes (never staged, never read: the kernel reads row 0 for them instead).
 */
static void stage(const uint8_t act[TOKS][KB], int ntok, int fp4, uint8_t staged[TOKS][KB])
{
    memset(staged, 0x7F, sizeof(uint8_t) * TOKS * KB);
    for (int r = 0; r < ntok; r++)
        for (int run = 0; run < KB / 8; run++) {
            uint32_t x, y;
            memcpy(&x, act[r] + 8 * run, 4);
            memcpy(&y, act[r] + 8 * run + 4, 4);
            uint32_t q[2] = {x, y};
            if (fp4) {
                q[0] = mmoe_d16_byte_perm(x, y, MMOE_D16_SEL_EVEN);
                q[1] = mmoe_d16_byte_perm(x, y, MMOE_D16_SEL_ODD);
            }
            memcpy(staged[r] + mmoe_d16_run_offset(run, fp4), q, 8);
        }
}

/**
 * Lane (g, t)'s staged word @p w (token @p g's row; row 0 when the tile has no token g, as the
 * kernel reads) converted to its two B registers, as doubles: out[0] low pair, out[1] high.
 */
static void b_read(const uint8_t staged[TOKS][KB], int g, int ntok, int t, int w, double out[2][2])
{
    uint32_t word, lo, hi;
    memcpy(&word, staged[g < ntok ? g : 0] + mmoe_d16_b_word_offset(t, w), 4);
    mmoe_d16_e4m3x4_to_f16x2(word, &lo, &hi);
    for (int i = 0; i < 2; i++) {
        out[0][i] = half_of(lo, i);
        out[1][i] = half_of(hi, i);
    }
}

/**
 * One K block of the MXFP4 warp GEMM: codes w[row][64 bytes], lane (g, t) holding word t of
 * each group of rows g and g + 8; the four group sums, each from two steps, into sums[group].
 */
static void warp_fp4(const uint8_t w[ROWS][KB / 2], const uint8_t act[TOKS][KB], int ntok,
                     double sums[4][ROWS][TOKS])
{
    static uint8_t staged[TOKS][KB];
    stage(act, ntok, 1, staged);
    memset(sums, 0, sizeof(double) * 4 * ROWS * TOKS);
    for (int j = 0; j < 4; j++) {
        frag even[LANES], odd[LANES];
        for (int lane = 0; lane < LANES; lane++) {
            const int g = lane >> 2, t = lane & 3;
            uint32_t w0, w1;
            memcpy(&w0, w[g] + 16 * j + 4 * t, 4);
            memcpy(&w1, w[g + 8] + 16 * j + 4 * t, 4);
            const uint32_t e0 = mmoe_d16_e2m1_even_high(w0), e1 = mmoe_d16_e2m1_even_high(w1);
            const uint32_t o0 = mmoe_d16_e2m1_odd_high(w0), o1 = mmoe_d16_e2m1_odd_high(w1);
            const uint32_t ae[4] = {mmoe_d16_f16_pair_lo(e0), mmoe_d16_f16_pair_lo(e1), mmoe_d16_f16_pair_hi(e0),
                                    mmoe_d16_f16_pair_hi(e1)};
            const uint32_t ao[4] = {mmoe_d16_f16_pair_lo(o0), mmoe_d16_f16_pair_lo(o1), mmoe_d16_f16_pair_hi(o0),
                                    mmoe_d16_f16_pair_hi(o1)};
            double xe[2][2], xo[2][2];
            b_read(staged, g, ntok, t, 2 * j, xe);     /* step 0: word 2j (even k) */
            b_read(staged, g, ntok, t, 2 * j + 1, xo); /* step 1: word 2j + 1 (odd k) */
            for (int q = 0; q < 4; q++)
                for (int i = 0; i < 2; i++) {
                    even[lane].a[q][i] = half_of(ae[q], i);
                    odd[lane].a[q][i] = half_of(ao[q], i);
                }
            for (int i = 0; i < 2; i++) {
                even[lane].b[0][i] = xe[0][i];
                even[lane].b[1][i] = xe[1][i];
                odd[lane].b[0][i] = xo[0][i];
                odd[lane].b[1][i] = xo[1][i];
            }
        }
        mma_m16n8k16(sums[j], even);
        mma_m16n8k16(sums[j], odd);
    }
}

/**
 * One K block of the FP8 warp GEMM: bytes w[row][128], lane (g, t) holding the 32 bytes of group
 * t of rows g and g + 8; 8 steps; @p group < 0: all lanes (the folded path), else only the lanes
 * of that group keep their A fragments (the per-group path).
 */
static void warp_fp8(const uint8_t w[ROWS][KB], const uint8_t act[TOKS][KB], int ntok, int group,
                     double out[ROWS][TOKS])
{
    static uint8_t staged[TOKS][KB];
    stage(act, ntok, 0, staged);
    memset(out, 0, sizeof(double) * ROWS * TOKS);
    for (int s = 0; s < 8; s++) {
        frag f[LANES];
        for (int lane = 0; lane < LANES; lane++) {
            const int g = lane >> 2, t = lane & 3;
            const int keep = group < 0 || t == group;
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 2; i++) {
                    /* a0 / a1: bytes 4s, 4s + 1 of rows g / g + 8; a2 / a3: bytes 4s + 2, 4s + 3 */
                    f[lane].a[h][i] = keep ? mmoe_fp8_e4m3_to_f32(w[h ? g + 8 : g][32 * t + 4 * s + i]) : 0.0;
                    f[lane].a[2 + h][i] = keep ? mmoe_fp8_e4m3_to_f32(w[h ? g + 8 : g][32 * t + 4 * s + 2 + i]) : 0.0;
                }
            double xb[2][2];
            b_read(staged, g, ntok, t, s, xb); /* step s: word s */
            for (int i = 0; i < 2; i++) {
                f[lane].b[0][i] = xb[0][i];
                f[lane].b[1][i] = xb[1][i];
            }
        }
        mma_m16n8k16(out, f);
    }
}

START_TEST(fragments_pair_every_k_once_mxfp4)
{
    static const int ntoks[] = {1, 3, 8};
    for (size_t nt = 0; nt < sizeof ntoks / sizeof ntoks[0]; nt++) {
        const int ntok = ntoks[nt];
        for (int kw = 0; kw < KB; kw++)
            for (int ka = 0; ka < KB; ka++) {
                uint8_t w[ROWS][KB / 2], act[TOKS][KB];
                double sums[4][ROWS][TOKS];
                memset(w, 0, sizeof w);
                memset(act, 0, sizeof act);
                for (int r = 0; r < ROWS; r++)
                    w[r][kw / 2] = (uint8_t)(kw % 2 ? 0x20 : 0x02); /* E2M1 1.0 at k = kw */
                for (int n = 0; n < ntok; n++)
                    act[n][ka] = 0x38; /* E4M3 1.0 at k = ka */
                warp_fp4(w, act, ntok, sums);
                for (int j = 0; j < 4; j++)
                    for (int r = 0; r < ROWS; r++)
                        for (int n = 0; n < ntok; n++) {
                            /* 1.0 * 2^-14 times 1.0, once, in group kw / 32 only */
                            const double want = kw == ka && j == kw / 32 ? 0x1p-14 : 0.0;
                            REQUIRE(sums[j][r][n] == want,
                                          "MXFP4 %d tokens, weight k %d x activation k %d: group %d row %d token %d "
                                          "sum %g, want %g", ntok, kw, ka, j, r, n, sums[j][r][n], want);
                        }
            }
    }
}
END_TEST

START_TEST(fragments_pair_every_k_once_fp8)
{
    static const int ntoks[] = {1, 8};
    for (size_t nt = 0; nt < sizeof ntoks / sizeof ntoks[0]; nt++) {
        const int ntok = ntoks[nt];
        for (int kw = 0; kw < KB; kw++) {
            uint8_t w[ROWS][KB], act[TOKS][KB];
            double out[ROWS][TOKS];
            memset(w, 0, sizeof w);
            for (int r = 0; r < ROWS; r++)
                w[r][kw] = 0x38;
            for (int ka = 0; ka < KB; ka++) {
                memset(act, 0, sizeof act);
                for (int n = 0; n < ntok; n++)
                    act[n][ka] = 0x38;
                warp_fp8(w, act, ntok, -1, out);
                for (int r = 0; r < ROWS; r++)
                    for (int n = 0; n < ntok; n++)
                        REQUIRE(out[r][n] == (kw == ka ? 1.0 : 0.0),
                                      "FP8 %d tokens, weight k %d x activation k %d: row %d token %d: %g", ntok, kw,
                                      ka, r, n, out[r][n]);
            }
            /* the per-group path: all activations 1.0, group g's sum holds weight k in group g only */
            for (int n = 0; n < TOKS; n++)
                for (int k = 0; k < KB; k++)
                    act[n][k] = 0x38;
            for (int g = 0; g < 4; g++) {
                warp_fp8(w, act, ntok, g, out);
                for (int r = 0; r < ROWS; r++)
                    for (int n = 0; n < ntok; n++)
                        REQUIRE(out[r][n] == (kw / 32 == g ? 1.0 : 0.0),
                                      "FP8 per-group %d, weight k %d: row %d token %d: %g", g, kw, r, n, out[r][n]);
            }
        }
    }
}
END_TEST

/** A random E4M3 byte other than NaN (0x7F, 0xFF become zero). */
static uint8_t random_e4m3(mmoe_rng *rng)
{
    const uint8_t b = (uint8_t)mmoe_rng_u32(rng);
    return (b & 0x7F) == 0x7F ? 0 : b;
}

/**
 * Random operands of one K block: MXFP4 codes (KB / 2 bytes per row, rows @p w4_stride bytes
 * apart), FP8 weights and FP8 activations without NaN.
 */
static void random_block(mmoe_rng *rng, uint8_t *w4, int w4_stride, uint8_t w8[ROWS][KB], uint8_t act[TOKS][KB])
{
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < KB / 2; i++)
            w4[r * w4_stride + i] = (uint8_t)mmoe_rng_u32(rng);
        for (int i = 0; i < KB; i++)
            w8[r][i] = random_e4m3(rng);
    }
    for (int n = 0; n < TOKS; n++)
        for (int i = 0; i < KB; i++)
            act[n][i] = random_e4m3(rng);
}

START_TEST(fragments_random_blocks_equal_dot_products)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 2);
    for (int trial = 0; trial < 100; trial++) {
        const int ntok = 1 + (int)mmoe_rng_below(&rng, TOKS);
        uint8_t w4[ROWS][KB / 2], w8[ROWS][KB], act[TOKS][KB];
        random_block(&rng, &w4[0][0], KB / 2, w8, act);
        double sums[4][ROWS][TOKS], out[ROWS][TOKS];
        warp_fp4(w4, act, ntok, sums);
        warp_fp8(w8, act, ntok, -1, out);
        for (int r = 0; r < ROWS; r++)
            for (int n = 0; n < ntok; n++) {
                /* sums of at most 128 products of <= 7 significant bits: exact in double */
                for (int j = 0; j < 4; j++) {
                    double ref = 0.0;
                    for (int k = 32 * j; k < 32 * j + 32; k++) {
                        const uint8_t byte = w4[r][k / 2];
                        ref += (double)mmoe_fp4_e2m1_to_f32((uint8_t)(k % 2 ? byte >> 4 : byte & 15)) *
                               mmoe_fp8_e4m3_to_f32(act[n][k]);
                    }
                    REQUIRE(sums[j][r][n] == ldexp(ref, -14), "MXFP4 trial %d group %d row %d token %d: %.17g, "
                                  "want %.17g (seed %llu)", trial, j, r, n, sums[j][r][n], ldexp(ref, -14),
                                  (unsigned long long)g_seed);
                }
                double ref = 0.0;
                for (int k = 0; k < KB; k++)
                    ref += (double)mmoe_fp8_e4m3_to_f32(w8[r][k]) * mmoe_fp8_e4m3_to_f32(act[n][k]);
                for (int m = ntok; m < TOKS; m++) /* columns past the tile's rows: token 0's (row 0 read) */
                    REQUIRE(out[r][m] == out[r][0] && sums[0][r][m] == sums[0][r][0] && sums[3][r][m] == sums[3][r][0],
                            "trial %d row %d: column %d past %d tokens is not token 0's", trial, r, m, ntok);
                REQUIRE(out[r][n] == ref, "FP8 trial %d row %d token %d: %.17g, want %.17g (seed %llu)", trial, r,
                              n, out[r][n], ref, (unsigned long long)g_seed);
            }
    }
}
END_TEST

/* ------------------------------------------------------------- the wgmma kernel's maps */

/**
 * One activation row of a K block widened in the wgmma kernel's order (mmoe_d16_wg_widen_group
 * per 32-group), as doubles: pos[p] is the value at position p of the block.
 */
static void widen_row(const uint8_t act[KB], double pos[KB])
{
    for (int j = 0; j < KB / 32; j++) {
        uint32_t w[8], h[16];
        memcpy(w, act + 32 * j, 32);
        mmoe_d16_wg_widen_group(w, h);
        for (int v = 0; v < 16; v++)
            for (int i = 0; i < 2; i++)
                pos[32 * j + 2 * v + i] = half_of(h[v], i);
    }
}

/**
 * One K block of one consumer warp of the wgmma kernel (16 of its 64 rows) against 8 tokens:
 * lane (g, t)'s A registers from the header's pair functions (MXFP4: word t of group j of rows
 * g, g + 8; FP8: bytes 8t..8t+7 of group j), unscaled; B from the widened rows, logical k l of
 * step s at position 16 s + l (the B tile the tensor core reads, K-major).  sums[j]: the two
 * steps of group j (the per-group path); their total is the folded path's block sum.
 */
static void warp_wg(int fp4, const uint8_t *w, const uint8_t act[TOKS][KB], double sums[4][ROWS][TOKS])
{
    double pos[TOKS][KB];
    for (int n = 0; n < TOKS; n++)
        widen_row(act[n], pos[n]);
    memset(sums, 0, sizeof(double) * 4 * ROWS * TOKS);
    const int row_bytes = KB; /* w: ROWS rows of KB bytes (MXFP4 codes in the first KB / 2) */
    for (int j = 0; j < 4; j++) {
        frag step[2][LANES];
        for (int lane = 0; lane < LANES; lane++) {
            const int g = lane >> 2, t = lane & 3;
            uint32_t ev[4], od[4];
            if (fp4) {
                uint32_t w0, w1;
                memcpy(&w0, w + g * row_bytes + 16 * j + 4 * t, 4);
                memcpy(&w1, w + (g + 8) * row_bytes + 16 * j + 4 * t, 4);
                mmoe_d16_a_pairs_fp4(w0, w1, ev, od);
            } else {
                uint32_t u[2], v[2];
                memcpy(u, w + g * row_bytes + 32 * j + 8 * t, 8);
                memcpy(v, w + (g + 8) * row_bytes + 32 * j + 8 * t, 8);
                mmoe_d16_a_pairs_fp8(u[0], u[1], v[0], v[1], ev, od);
            }
            for (int h = 0; h < 2; h++) {
                const int s = 2 * j + h;
                for (int q = 0; q < 4; q++)
                    for (int i = 0; i < 2; i++)
                        step[h][lane].a[q][i] = half_of(h ? od[q] : ev[q], i);
                for (int i = 0; i < 2; i++) {
                    step[h][lane].b[0][i] = pos[g][16 * s + 2 * t + i];
                    step[h][lane].b[1][i] = pos[g][16 * s + 2 * t + 8 + i];
                }
            }
        }
        mma_m16n8k16(sums[j], step[0]);
        mma_m16n8k16(sums[j], step[1]);
    }
}

START_TEST(wgmma_k_order_widens_every_byte_once)
{
    /* each position holds the byte mmoe_d16_wg_k_of_position names, each k exactly once */
    int seen[32] = {0};
    for (int p = 0; p < 32; p++) {
        const int k = mmoe_d16_wg_k_of_position(p);
        REQUIRE(k >= 0 && k < 32, "position %d: k %d", p, k);
        seen[k]++;
    }
    for (int k = 0; k < 32; k++)
        REQUIRE(seen[k] == 1, "k %d held by %d positions", k, seen[k]);
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 3);
    for (int trial = 0; trial < 1000; trial++) {
        uint8_t b[32];
        for (int i = 0; i < 32; i++)
            b[i] = (uint8_t)mmoe_rng_u32(&rng);
        uint32_t w[8], h[16];
        memcpy(w, b, 32);
        mmoe_d16_wg_widen_group(w, h);
        for (int p = 0; p < 32; p++) {
            const uint8_t byte = b[mmoe_d16_wg_k_of_position(p)];
            const double want = mmoe_fp8_e4m3_to_f32(byte), got = half_of(h[p / 2], p % 2);
            REQUIRE(got == want || (isnan(got) && isnan(want)),
                    "trial %d position %d: %g, want byte 0x%02x = %g (seed %llu)", trial, p, got, byte, want,
                    (unsigned long long)g_seed);
        }
    }
}
END_TEST

START_TEST(wgmma_fragments_pair_every_k_once)
{
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (int kw = 0; kw < KB; kw++)
            for (int ka = 0; ka < KB; ka++) {
                uint8_t w[ROWS][KB], act[TOKS][KB];
                double sums[4][ROWS][TOKS];
                memset(w, 0, sizeof w);
                memset(act, 0, sizeof act);
                for (int r = 0; r < ROWS; r++) {
                    if (fp4)
                        w[r][kw / 2] = (uint8_t)(kw % 2 ? 0x20 : 0x02); /* E2M1 1.0 at k = kw */
                    else
                        w[r][kw] = 0x38; /* E4M3 1.0 */
                }
                for (int n = 0; n < TOKS; n++)
                    act[n][ka] = 0x38;
                warp_wg(fp4, &w[0][0], act, sums);
                for (int j = 0; j < 4; j++)
                    for (int r = 0; r < ROWS; r++)
                        for (int n = 0; n < TOKS; n++) {
                            /* the product once, in group kw / 32 only (MXFP4: times 2^-14) */
                            const double want = kw == ka && j == kw / 32 ? (fp4 ? 0x1p-14 : 1.0) : 0.0;
                            REQUIRE(sums[j][r][n] == want,
                                    "%s weight k %d x activation k %d: group %d row %d token %d sum %g, want %g",
                                    fp4 ? "MXFP4" : "FP8", kw, ka, j, r, n, sums[j][r][n], want);
                        }
            }
}
END_TEST

START_TEST(wgmma_fragments_random_blocks_equal_dot_products)
{
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 4);
    for (int trial = 0; trial < 100; trial++) {
        uint8_t w4[ROWS][KB], w8[ROWS][KB], act[TOKS][KB];
        random_block(&rng, &w4[0][0], KB, w8, act);
        double s4[4][ROWS][TOKS], s8[4][ROWS][TOKS];
        warp_wg(1, &w4[0][0], act, s4);
        warp_wg(0, &w8[0][0], act, s8);
        for (int r = 0; r < ROWS; r++)
            for (int n = 0; n < TOKS; n++)
                for (int j = 0; j < 4; j++) {
                    /* sums of 32 products of <= 7 significant bits: exact in double */
                    double ref4 = 0.0, ref8 = 0.0;
                    for (int k = 32 * j; k < 32 * j + 32; k++) {
                        const uint8_t byte = w4[r][k / 2];
                        const double a = mmoe_fp8_e4m3_to_f32(act[n][k]);
                        ref4 += (double)mmoe_fp4_e2m1_to_f32((uint8_t)(k % 2 ? byte >> 4 : byte & 15)) * a;
                        ref8 += (double)mmoe_fp8_e4m3_to_f32(w8[r][k]) * a;
                    }
                    REQUIRE(s4[j][r][n] == ldexp(ref4, -14) && s8[j][r][n] == ref8,
                            "trial %d group %d row %d token %d: MXFP4 %.17g want %.17g, FP8 %.17g want %.17g "
                            "(seed %llu)", trial, j, r, n, s4[j][r][n], ldexp(ref4, -14), s8[j][r][n], ref8,
                            (unsigned long long)g_seed);
                }
    }
}
END_TEST

/*
 * ldmatrix.sync.aligned.m8n8.x4.shared.b16, from the PTX ISA: lanes 8i .. 8i + 7 give the
 * addresses of rows 0..7 of matrix i (16 bytes each); lane l receives in register i the 32-bit
 * word l % 4 of row l / 4 of matrix i.
 */
static uint32_t ldmatrix_x4_word(const uint8_t *smem, const int addr[LANES], int lane, int i)
{
    uint32_t w;
    memcpy(&w, smem + addr[8 * i + lane / 4] + 4 * (lane % 4), 4);
    return w;
}

START_TEST(fp4_stage_ldmatrix_gives_each_lane_its_words)
{
    /* the pieces of a half tile the 512 bytes once each */
    int owner[512];
    for (int b = 0; b < 512; b++)
        owner[b] = -1;
    for (int r = 0; r < 8; r++)
        for (int j = 0; j < 4; j++) {
            const int o = mmoe_d16_fp4_piece_offset(r, j);
            REQUIRE(o >= 0 && o + 16 <= 512 && o % 16 == 0, "piece (%d, %d) at %d", r, j, o);
            for (int b = o; b < o + 16; b++) {
                REQUIRE(owner[b] < 0, "byte %d of pieces %d and (%d, %d)", b, owner[b], r, j);
                owner[b] = 4 * r + j;
            }
        }
    /* each matrix's eight rows fall in eight different 16-byte quarters of the banks, at any
       stage base a multiple of 16 bytes */
    int addr[LANES];
    for (int l = 0; l < LANES; l++)
        addr[l] = mmoe_d16_fp4_ldmatrix_row_offset(l);
    for (int base = 0; base < 128; base += 16)
        for (int i = 0; i < 4; i++) {
            int quarter_used = 0;
            for (int r = 0; r < 8; r++) {
                const int q = ((base + addr[8 * i + r]) % 128) / 16;
                REQUIRE(!(quarter_used >> q & 1), "base %d matrix %d row %d: bank quarter %d twice", base, i, r, q);
                quarter_used |= 1 << q;
            }
        }
    /* random rows copied the way the lanes copy them (lane (g, t): group t of row g), read back
       with ldmatrix: lane (g, t) holds word t of group i of row g in register i */
    mmoe_rng rng;
    mmoe_rng_seed(&rng, g_seed + 5);
    for (int trial = 0; trial < 100; trial++) {
        uint8_t rows[8][64], stage[512];
        for (int r = 0; r < 8; r++)
            for (int b = 0; b < 64; b++)
                rows[r][b] = (uint8_t)mmoe_rng_u32(&rng);
        memset(stage, 0xA5, sizeof stage);
        for (int lane = 0; lane < LANES; lane++) {
            const int g = lane / 4, t = lane % 4;
            memcpy(stage + mmoe_d16_fp4_piece_offset(g, t), &rows[g][16 * t], 16);
        }
        for (int lane = 0; lane < LANES; lane++)
            for (int i = 0; i < 4; i++) {
                const int g = lane / 4, t = lane % 4;
                uint32_t want;
                memcpy(&want, &rows[g][16 * i + 4 * t], 4);
                const uint32_t got = ldmatrix_x4_word(stage, addr, lane, i);
                REQUIRE(got == want, "trial %d lane %d register %d: 0x%08x, want word %d of group %d of row %d 0x%08x "
                        "(seed %llu)", trial, lane, i, got, t, i, g, want, (unsigned long long)g_seed);
            }
    }
}
END_TEST

static Suite *decode16_map_suite(void)
{
    Suite *s = suite_create("gpu_decode16_map");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, e2m1_to_f16_every_code_and_position);
    tcase_add_test(tc, e4m3_to_f16_every_byte_and_position);
    tcase_add_test(tc, ue8m0_factor_bits);
    tcase_add_test(tc, fragments_pair_every_k_once_mxfp4);
    tcase_add_test(tc, fragments_pair_every_k_once_fp8);
    tcase_add_test(tc, fragments_random_blocks_equal_dot_products);
    tcase_add_test(tc, wgmma_k_order_widens_every_byte_once);
    tcase_add_test(tc, wgmma_fragments_pair_every_k_once);
    tcase_add_test(tc, wgmma_fragments_random_blocks_equal_dot_products);
    tcase_add_test(tc, fp4_stage_ldmatrix_gives_each_lane_its_words);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    g_seed = mmoe_test_seed("gpu_decode16_map");
    return mmoe_test_run(decode16_map_suite());
}
