/**
 * @file fmt_dump.c
 * @brief Test helper: run one megamoe number-format conversion over a binary stream, so that
 *        a Python cross-check (tests/xval/formats_mldtypes.py) can compare it with ml_dtypes.
 *
 *     fmt_dump MODE < input > output
 *
 * Encoding modes read native fp32 values and write one code per value: a byte
 * (e4m3, e4m3_nosat, e5m2, e5m2_nosat, e2m1, e2m1_down) or a native uint16 (bf16).
 * Decoding modes read codes (a byte each, or a uint16 for bf16_dec) and write fp32:
 * e4m3_dec, e5m2_dec, e2m1_dec, ue8m0_dec, bf16_dec.  Exit status 2 on a usage error,
 * 1 on an I/O error.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mmoe_formats.h"

typedef uint8_t (*enc8_fn)(float);
typedef float (*dec8_fn)(uint8_t);

static const struct { const char *name; enc8_fn fn; } enc8[] = {
    {"e4m3", mmoe_fp8_e4m3_from_f32},   {"e4m3_nosat", mmoe_fp8_e4m3_from_f32_nosat},
    {"e5m2", mmoe_fp8_e5m2_from_f32},   {"e5m2_nosat", mmoe_fp8_e5m2_from_f32_nosat},
    {"e2m1", mmoe_fp4_e2m1_from_f32},   {"e2m1_down", mmoe_fp4_e2m1_from_f32_ties_down},
};
static const struct { const char *name; dec8_fn fn; } dec8[] = {
    {"e4m3_dec", mmoe_fp8_e4m3_to_f32}, {"e5m2_dec", mmoe_fp8_e5m2_to_f32},
    {"e2m1_dec", mmoe_fp4_e2m1_to_f32}, {"ue8m0_dec", mmoe_ue8m0_to_f32},
};

static int fail_io(void)
{
    fprintf(stderr, "fmt_dump: I/O error\n");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fmt_dump MODE < input > output\n");
        return 2;
    }
    const char *mode = argv[1];
    for (size_t i = 0; i < sizeof enc8 / sizeof enc8[0]; i++)
        if (strcmp(mode, enc8[i].name) == 0) {
            float x;
            while (fread(&x, sizeof x, 1, stdin) == 1) {
                uint8_t b = enc8[i].fn(x);
                if (fwrite(&b, 1, 1, stdout) != 1)
                    return fail_io();
            }
            return ferror(stdin) || fflush(stdout) ? fail_io() : 0;
        }
    for (size_t i = 0; i < sizeof dec8 / sizeof dec8[0]; i++)
        if (strcmp(mode, dec8[i].name) == 0) {
            uint8_t b;
            while (fread(&b, 1, 1, stdin) == 1) {
                float x = dec8[i].fn(b);
                if (fwrite(&x, sizeof x, 1, stdout) != 1)
                    return fail_io();
            }
            return ferror(stdin) || fflush(stdout) ? fail_io() : 0;
        }
    if (strcmp(mode, "bf16") == 0) {
        float x;
        while (fread(&x, sizeof x, 1, stdin) == 1) {
            uint16_t h = mmoe_bf16_from_f32(x);
            if (fwrite(&h, sizeof h, 1, stdout) != 1)
                return fail_io();
        }
        return ferror(stdin) || fflush(stdout) ? fail_io() : 0;
    }
    if (strcmp(mode, "bf16_dec") == 0) {
        uint16_t h;
        while (fread(&h, sizeof h, 1, stdin) == 1) {
            float x = mmoe_bf16_to_f32(h);
            if (fwrite(&x, sizeof x, 1, stdout) != 1)
                return fail_io();
        }
        return ferror(stdin) || fflush(stdout) ? fail_io() : 0;
    }
    fprintf(stderr, "fmt_dump: unknown mode '%s'\n", mode);
    return 2;
}
