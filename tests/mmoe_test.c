/**
 * @file mmoe_test.c
 * @brief Implementation of the test helpers in mmoe_test.h.
 */
#include "mmoe_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mmoe_formats.h"

uint64_t mmoe_test_seed(const char *suite)
{
    const char *env = getenv("MMOE_SEED");
    uint64_t seed;
    if (env != NULL && *env != '\0') {
        seed = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000003u) ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)getpid();
    }
    fprintf(stderr, "%s: seed %llu (replay: MMOE_SEED=%llu)\n", suite, (unsigned long long)seed,
            (unsigned long long)seed);
    return seed;
}

void mmoe_test_poison_f32(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

void mmoe_test_poison_f64(double *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

void mmoe_test_poison_bf16(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = 0x7FC0u;
}

void mmoe_test_sum_order_row(int r, int64_t n, uint16_t *x)
{
    const int p = 1 + r / 8, q = r % 8;
    memset(x, 0, 2 * (size_t)n);
    x[0] = mmoe_bf16_from_f32(1.0f + (float)p / 128.0f);
    x[2] = mmoe_bf16_from_f32(1.0f + (float)q / 16.0f);
    const double big = (double)mmoe_bf16_to_f32(x[0]) * mmoe_bf16_to_f32(x[0]) +
                       (double)mmoe_bf16_to_f32(x[2]) * mmoe_bf16_to_f32(x[2]);
    const int e = ilogb(big);
    if ((e - 24) % 2 == 0) {
        x[1] = mmoe_bf16_from_f32(ldexpf(1.0f, (e - 24) / 2));
    } else {
        x[1] = mmoe_bf16_from_f32(ldexpf(1.0f, (e - 25) / 2));
        x[3] = x[1];
    }
    for (int64_t i = 16; i < n; i++)
        x[i] = mmoe_bf16_from_f32(ldexpf(1.0f + (float)((i * 37 + p) % 52) / 128.0f, -27));
}

void mmoe_test_sum_order_sum_row(int r, int64_t n, uint16_t *x)
{
    const int p = 1 + r / 8, q = r % 8;
    memset(x, 0, 2 * (size_t)n);
    x[0] = mmoe_bf16_from_f32(1.0f + (float)p / 128.0f);
    x[2] = mmoe_bf16_from_f32(1.0f + (float)q / 16.0f);
    x[1] = mmoe_bf16_from_f32(ldexpf(1.0f, -23)); /* half an fp32 ulp of x0 + x2 in [2, 4) */
    for (int64_t i = 16; i < n; i++)
        x[i] = mmoe_bf16_from_f32(ldexpf(1.0f + (float)((i * 37 + p) % 52) / 128.0f, -54));
}

void mmoe_test_sum_order_weight(int64_t n, uint16_t *w)
{
    for (int64_t i = 0; i < n; i++)
        w[i] = mmoe_bf16_from_f32(1.0f + (float)((i * 101) % 128) / 128.0f);
}

static int64_t ordered_bits(float x)
{
    int32_t i;
    memcpy(&i, &x, sizeof i);
    return i < 0 ? -(int64_t)(i & 0x7FFFFFFF) : (int64_t)i;
}

uint32_t mmoe_test_ulp_f32(float a, float b)
{
    if (isnan(a) || isnan(b))
        return UINT32_MAX;
    int64_t d = ordered_bits(a) - ordered_bits(b);
    if (d < 0)
        d = -d;
    return d > (int64_t)UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

double mmoe_test_rel_err_f32(const float *a, const double *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-300);
}

int mmoe_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int mmoe_test_mkdtemp(char *buf, size_t buflen)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || *tmp == '\0')
        tmp = "/tmp";
    if ((size_t)snprintf(buf, buflen, "%s/mmoe-test-XXXXXX", tmp) >= buflen)
        return -1;
    return mkdtemp(buf) == NULL ? -1 : 0;
}

void mmoe_test_rmtree(const char *path)
{
    char cmd[4096];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s'", path) < sizeof cmd)
        (void)mmoe_test_system(cmd);
}

int mmoe_test_system(const char *cmd)
{
    fflush(stdout);
    fflush(stderr);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc))
        return -1;
    return WEXITSTATUS(rc);
}

uint8_t *mmoe_test_read_file(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    ck_assert_int_eq(fseek(fp, 0, SEEK_END), 0);
    long len = ftell(fp);
    ck_assert_int_ge(len, 0);
    ck_assert_int_eq(fseek(fp, 0, SEEK_SET), 0);
    uint8_t *buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    buf[len] = 0; /* so that text files can be used as strings */
    *n = (size_t)len;
    return buf;
}

void mmoe_test_write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(p, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

int mmoe_test_run_cli(const char *dir, const char *args, const char *stdin_text, char **out, char **err)
{
    const char *bin = getenv("MMOE_BIN");
    if (bin == NULL)
        bin = "./megamoe";
    char in_path[700], out_path[700], err_path[700], cmd[4096];
    snprintf(in_path, sizeof in_path, "%s/stdin.txt", dir);
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    mmoe_test_write_file(in_path, stdin_text ? stdin_text : "", stdin_text ? strlen(stdin_text) : 0);
    int n = snprintf(cmd, sizeof cmd, "'%s' %s < '%s' > '%s' 2> '%s'", bin, args, in_path, out_path, err_path);
    ck_assert_msg(n > 0 && (size_t)n < sizeof cmd, "command line too long: %s", args);
    int rc = mmoe_test_system(cmd);
    size_t len; /* both files exist: the shell made them before running the command */
    *out = (char *)mmoe_test_read_file(out_path, &len);
    *err = (char *)mmoe_test_read_file(err_path, &len);
    fprintf(stderr, "$ %s\n  exit %d\n  stdout: %.400s\n  stderr: %.600s\n", cmd, rc, *out, *err);
    return rc;
}

int32_t mmoe_test_argmax_f32(const float *v, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = (int32_t)i;
    return best;
}

mmoe_model *mmoe_test_open_model(const char *dir)
{
    mmoe_model *m = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_msg(mmoe_model_open(dir, NULL, NULL, &m, &err) == MMOE_OK, "%s: %s", dir, err.msg);
    return m;
}
