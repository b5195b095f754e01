/**
 * @file cli_args.c
 * @brief Strict parsing of the numeric option values of every `megamoe` command.
 *
 * ## The idea
 *
 * `atoi("abc")` is 0, `atoi("4294967298")` is 2 on a 32-bit int, `strtoull("-1")` is
 * 2^64-1 and `strtod(" 1x")` stops silently at the `x`: each turns a typing mistake into
 * a different run than the one asked for.  Every numeric option value therefore goes
 * through one of the three parsers here, which accept a value only when
 *
 *  - the **whole** string is the number: no leading blank, no trailing character, not empty;
 *  - it is **representable**: no overflow of int64/uint64 (strtoll's ERANGE), no NaN or
 *    infinity, a uint64 never starts with a minus sign;
 *  - it lies in the option's **range** [lo, hi] (a double range may be open at either end).
 *
 * Integers are decimal, or hexadecimal with a `0x` prefix (seeds are often written so);
 * a leading zero does not mean octal (`010` is ten).  A rejected value gets one message
 * that names the command, the option, what it accepts and what it got:
 *
 *     megamoe moe: --topk: expected an integer in [1, 64], got 'abc'
 *
 * The `mmoe_cli_parse_*` functions return a status with that text (without the command)
 * in an ::mmoe_error; the `mmoe_cli_opt_*` wrappers, which the commands call from their
 * getopt loops, print it with the `megamoe CMD: ` prefix and return ::MMOE_EXIT_USAGE.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"

/** Most characters of a rejected value quoted back in a message (longer ones end in "..."). */
#define CLI_QUOTE_MAX 64

/** The value quoted for a message: at most CLI_QUOTE_MAX characters, control characters as '?'. */
static void quote_value(const char *s, char *buf, size_t len)
{
    size_t n = 0, i = 0;
    for (; s[i] != '\0' && i < CLI_QUOTE_MAX && n + 1 < len; i++)
        buf[n++] = iscntrl((unsigned char)s[i]) ? '?' : s[i];
    buf[n] = '\0';
    if (s[i] != '\0' && n + 4 <= len)
        strcat(buf, "...");
}

/** "an integer in [lo, hi]", "an integer >= lo" or "an integer" for the signed range. */
static void describe_i64(int64_t lo, int64_t hi, char *buf, size_t len)
{
    if (lo == INT64_MIN && hi == INT64_MAX)
        snprintf(buf, len, "an integer");
    else if (hi == INT64_MAX)
        snprintf(buf, len, "an integer >= %" PRId64, lo);
    else if (lo == INT64_MIN)
        snprintf(buf, len, "an integer <= %" PRId64, hi);
    else
        snprintf(buf, len, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
}

/** The same for the unsigned range ("a non-negative integer" when unbounded). */
static void describe_u64(uint64_t lo, uint64_t hi, char *buf, size_t len)
{
    if (lo == 0 && hi == UINT64_MAX)
        snprintf(buf, len, "a non-negative integer");
    else if (hi == UINT64_MAX)
        snprintf(buf, len, "an integer >= %" PRIu64, lo);
    else
        snprintf(buf, len, "an integer in [%" PRIu64 ", %" PRIu64 "]", lo, hi);
}

/** "a number in (lo, hi]" and its half-bounded forms for the double range. */
static void describe_f64(double lo, double hi, unsigned open, char *buf, size_t len)
{
    const int has_lo = isfinite(lo), has_hi = isfinite(hi);
    if (has_lo && has_hi)
        snprintf(buf, len, "a number in %c%g, %g%c", open & MMOE_CLI_LO_OPEN ? '(' : '[', lo, hi,
                 open & MMOE_CLI_HI_OPEN ? ')' : ']');
    else if (has_lo)
        snprintf(buf, len, "a number %s %g", open & MMOE_CLI_LO_OPEN ? ">" : ">=", lo);
    else if (has_hi)
        snprintf(buf, len, "a number %s %g", open & MMOE_CLI_HI_OPEN ? "<" : "<=", hi);
    else
        snprintf(buf, len, "a finite number");
}

/** The rejection message: "expected WHAT, got 'VALUE'". */
static mmoe_status reject(mmoe_error *err, const char *what, const char *s)
{
    char q[CLI_QUOTE_MAX + 4];
    quote_value(s, q, sizeof q);
    return mmoe_error_set(err, MMOE_EINVAL, "expected %s, got '%s'", what, q);
}

/**
 * The digits of an unsigned integer: decimal, or hex after "0x"/"0X".  Returns 0 and the
 * value when the whole of @p s is such a number that fits in uint64, else -1.
 */
static int digits_u64(const char *s, uint64_t *v)
{
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (!(base == 10 ? isdigit((unsigned char)s[0]) : isxdigit((unsigned char)s[0])))
        return -1; /* empty, a sign, a blank: strtoull would accept the last two */
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, base);
    if (*end != '\0' || errno == ERANGE)
        return -1;
    *v = (uint64_t)x;
    return 0;
}

mmoe_status mmoe_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *v, mmoe_error *err)
{
    char what[96];
    describe_i64(lo, hi, what, sizeof what);
    const int neg = s[0] == '-';
    uint64_t mag;
    if (digits_u64(s + neg, &mag) != 0)
        return reject(err, what, s);
    if (!neg && mag > (uint64_t)INT64_MAX)
        return reject(err, what, s);
    if (neg && mag > (uint64_t)INT64_MAX + 1u)
        return reject(err, what, s);
    const int64_t x = neg ? (mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    if (x < lo || x > hi)
        return reject(err, what, s);
    *v = x;
    return MMOE_OK;
}

mmoe_status mmoe_cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *v, mmoe_error *err)
{
    char what[96];
    describe_u64(lo, hi, what, sizeof what);
    uint64_t x;
    if (digits_u64(s, &x) != 0 || x < lo || x > hi)
        return reject(err, what, s);
    *v = x;
    return MMOE_OK;
}

mmoe_status mmoe_cli_parse_f64(const char *s, double lo, double hi, unsigned open, double *v, mmoe_error *err)
{
    char what[96];
    describe_f64(lo, hi, open, what, sizeof what);
    if (s[0] == '\0' || isspace((unsigned char)s[0]))
        return reject(err, what, s);
    char *end;
    errno = 0;
    const double x = strtod(s, &end);
    if (*end != '\0' || !isfinite(x) || (errno == ERANGE && fabs(x) > 1.0))
        return reject(err, what, s); /* ERANGE on underflow (1e-400) is a 0 or a subnormal: accepted */
    if (x < lo || x > hi || ((open & MMOE_CLI_LO_OPEN) && x == lo) || ((open & MMOE_CLI_HI_OPEN) && x == hi))
        return reject(err, what, s);
    *v = x;
    return MMOE_OK;
}

/** Print "megamoe CMD: --OPT: MESSAGE" and return the usage exit status. */
static int print_option_error(const char *cmd, const char *opt, const mmoe_error *err)
{
    fprintf(stderr, "megamoe %s: --%s: %s\n", cmd, opt, err->msg);
    return MMOE_EXIT_USAGE;
}

int mmoe_cli_opt_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *v)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    return mmoe_cli_parse_i64(s, lo, hi, v, &err) == MMOE_OK ? 0 : print_option_error(cmd, opt, &err);
}

int mmoe_cli_opt_int(const char *cmd, const char *opt, const char *s, int lo, int hi, int *v)
{
    int64_t x;
    int rc = mmoe_cli_opt_i64(cmd, opt, s, lo, hi, &x);
    if (rc == 0)
        *v = (int)x;
    return rc;
}

int mmoe_cli_opt_u64(const char *cmd, const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *v)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    return mmoe_cli_parse_u64(s, lo, hi, v, &err) == MMOE_OK ? 0 : print_option_error(cmd, opt, &err);
}

int mmoe_cli_opt_f64(const char *cmd, const char *opt, const char *s, double lo, double hi, unsigned open, double *v)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    return mmoe_cli_parse_f64(s, lo, hi, open, v, &err) == MMOE_OK ? 0 : print_option_error(cmd, opt, &err);
}

mmoe_status mmoe_cli_parse_i64_list(const char *s, int64_t lo, int64_t hi, size_t max_n, int64_t **items, size_t *n,
                                    mmoe_error *err)
{
    *items = NULL;
    *n = 0;
    size_t count = 1;
    for (const char *p = s; *p != '\0'; p++)
        count += *p == ',';
    if (count > max_n)
        return mmoe_error_set(err, MMOE_EINVAL, "at most %zu comma-separated values, got %zu", max_n, count);
    int64_t *v = malloc(count * sizeof *v);
    char *item = malloc(strlen(s) + 1);
    if (v == NULL || item == NULL) {
        free(v);
        free(item);
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory for %zu values", count);
    }
    const char *p = s;
    for (size_t i = 0; i < count; i++) {
        size_t len = strcspn(p, ",");
        memcpy(item, p, len);
        item[len] = '\0';
        if (mmoe_cli_parse_i64(item, lo, hi, &v[i], err) != MMOE_OK) {
            mmoe_error_prefix(err, "item %zu: ", i + 1);
            free(v);
            free(item);
            return err->code;
        }
        p += len + (p[len] == ',');
    }
    free(item);
    *items = v;
    *n = count;
    return MMOE_OK;
}

int mmoe_cli_opt_i64_list(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, size_t max_n,
                          int64_t **items, size_t *n)
{
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_cli_parse_i64_list(s, lo, hi, max_n, items, n, &err) == MMOE_OK)
        return 0;
    return err.code == MMOE_ENOMEM ? (fprintf(stderr, "megamoe %s: %s\n", cmd, err.msg), 1)
                                   : print_option_error(cmd, opt, &err);
}

void mmoe_cli_bad_option(const char *cmd, int needs_value, const char *arg)
{
    fprintf(stderr, "megamoe %s: %s '%s'%s\n", cmd, needs_value ? "option" : "unknown option", arg,
            needs_value ? " needs a value" : "");
}
