/**
 * @file mmoe_test.h
 * @brief Shared helpers of the Check suites: seeds, NaN poisoning, named tolerances, comparisons.
 *
 * Conventions every suite follows (DEVELOPERS.md, "Standards"):
 * - random inputs are fresh each run; the seed is printed, and `MMOE_SEED=n`
 *   replays a run;
 * - output buffers are filled with NaN before the code under test writes them,
 *   so an element it forgets to write fails the comparison;
 * - tolerances are named rungs (GSL style), in multiples of a format's epsilon,
 *   so that a loosened bound is visible in review;
 * - a suite that cannot run here (no GPU, no Python module) exits with 77,
 *   which automake reports as SKIP.
 */
#ifndef MMOE_TEST_H
#define MMOE_TEST_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "mmoe_model.h"
#include "mmoe_rng.h"

/** Exit status automake reads as "skipped". */
#define MMOE_TEST_SKIP 77

/** Unit roundoff of FP32 (2^-24) and its tolerance rungs. */
#define MMOE_EPS_F32 0x1.0p-24
/** Unit roundoff of BF16 (2^-8: 8 significant bits). */
#define MMOE_EPS_BF16 0x1.0p-8

/**
 * The seed of this run: $MMOE_SEED if set, else one drawn from the clock and pid.
 * Prints "<suite>: seed <n> (replay: MMOE_SEED=<n>)" to stderr once per call.
 */
uint64_t mmoe_test_seed(const char *suite);

/** Fill @p n floats with quiet NaN. */
void mmoe_test_poison_f32(float *p, size_t n);

/** Fill @p n doubles with quiet NaN. */
void mmoe_test_poison_f64(double *p, size_t n);

/** Fill @p n BF16 values (uint16 bit patterns) with a quiet NaN (0x7FC0). */
void mmoe_test_poison_bf16(uint16_t *p, size_t n);

/** Rows of mmoe_test_sum_order_row(): p = 1..127 times q = 0..7. */
#define MMOE_TEST_SUM_ORDER_ROWS (127 * 8)
/**
 * Row @p r (< MMOE_TEST_SUM_ORDER_ROWS) of @p n >= 16 bf16 values whose RMSNorm (eps 0, weight
 * mmoe_test_sum_order_weight()) shows the order of its double sum of squares in the bf16 output
 * for a few rows (tests/test_sum_order.c, rmsnorm_order_visible, derives the construction).
 */
void mmoe_test_sum_order_row(int r, int64_t n, uint16_t *x);
/** The weight of those rows: w_i = 1 + ((101 i) mod 128) / 128, bf16. */
void mmoe_test_sum_order_weight(int64_t n, uint16_t *w);
/**
 * Row @p r (< MMOE_TEST_SUM_ORDER_ROWS) of @p n >= 16 bf16 values whose plain sum, rounded to
 * fp32, differs between the order of the forward's double sums and the sequential order (a dot
 * product with a weight row of ones: tests/test_sum_order.c, dense_order_visible).
 */
void mmoe_test_sum_order_sum_row(int r, int64_t n, uint16_t *x);

/**
 * Distance in units in the last place between two floats (ordered-integer
 * distance; +0 and -0 are 0 apart).  Returns UINT32_MAX if either is NaN.
 */
uint32_t mmoe_test_ulp_f32(float a, float b);

/**
 * Relative Frobenius error ||a - b|| / max(||b||, tiny) in double precision,
 * with @p b the reference.  Returns +Inf if any element of @p a is NaN.
 */
double mmoe_test_rel_err_f32(const float *a, const double *b, size_t n);

/**
 * Run @p s with Check's runner (forking unless CK_FORK=no) and return the
 * process exit status: EXIT_SUCCESS when every test passed.
 */
int mmoe_test_run(Suite *s);

/**
 * Make a fresh temporary directory under $TMPDIR (or /tmp) and write its path
 * into @p buf.  Returns 0 on success.  The caller removes it with
 * mmoe_test_rmtree().
 */
int mmoe_test_mkdtemp(char *buf, size_t buflen);

/** Remove a directory tree made by mmoe_test_mkdtemp() (best effort). */
void mmoe_test_rmtree(const char *path);

/**
 * Run a shell command and return its exit status (or -1 if it could not run or
 * was killed by a signal).  Output goes to the test log.
 */
int mmoe_test_system(const char *cmd);

/**
 * Read the whole file @p path into a malloc'd buffer with a NUL byte after its @p n bytes
 * (so that text files can be used as strings); the caller frees it.  A file that cannot be
 * read fails the test.
 */
uint8_t *mmoe_test_read_file(const char *path, size_t *n);

/** Write @p n bytes at @p p to @p path (created or truncated); a failed write fails the test. */
void mmoe_test_write_file(const char *path, const void *p, size_t n);

/**
 * Index of the largest of @p n floats, the lowest index on ties (as torch.argmax and the
 * greedy sampler): the tests' own argmax, independent of the code under test.
 */
int32_t mmoe_test_argmax_f32(const float *v, int64_t n);

/**
 * Run the CLI: `$MMOE_BIN ARGS < dir/stdin.txt > dir/stdout.txt 2> dir/stderr.txt` ($MMOE_BIN
 * is set by `make check`; ./megamoe when unset), with @p stdin_text as its input (NULL: none).
 * The command, its status and the start of both outputs go to the test log.
 * @param dir         an existing directory for the three files (e.g. from mmoe_test_mkdtemp())
 * @param args        the arguments, already quoted for the shell
 * @param stdin_text  NUL-terminated input, or NULL for an empty stdin
 * @param out         receives stdout as a malloc'd NUL-terminated string (caller frees)
 * @param err         receives stderr likewise
 * @return the exit status, as mmoe_test_system()
 */
int mmoe_test_run_cli(const char *dir, const char *args, const char *stdin_text, char **out, char **err);

/** The model in directory @p dir, opened on the CPU; the test fails with the loader's message if it cannot be. */
mmoe_model *mmoe_test_open_model(const char *dir);

#endif /* MMOE_TEST_H */
