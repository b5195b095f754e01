/**
 * @file test_moe_xval.c
 * @brief Runs tests/xval/moe_numpy.py (the NumPy cross-check of every recipe) through
 *        tests/xval/run-xval.sh; exit 77 (SKIP) when python3, NumPy or ml_dtypes is missing.
 */
#include <stdio.h>
#include <stdlib.h>

#include "mmoe_test.h"

int main(void)
{
    const char *build = getenv("MMOE_BUILDDIR");
    if (build == NULL || getenv("MMOE_BIN") == NULL) {
        fprintf(stderr, "SKIP: MMOE_BUILDDIR / MMOE_BIN not set (run through make check)\n");
        return MMOE_TEST_SKIP;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s/tests/xval/run-xval.sh' moe_numpy.py", build);
    int rc = mmoe_test_system(cmd);
    if (rc == MMOE_TEST_SKIP)
        return MMOE_TEST_SKIP;
    return rc == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
