/**
 * @file cmd_inspect.c
 * @brief `megamoe inspect`: list the tensors of a safetensors file or checkpoint.
 *
 *     megamoe inspect FILE|DIR [--stats] [--filter SUBSTRING] [--json]
 *
 * The argument is anything mmoe_ckpt_open() accepts: one .safetensors file, a
 * directory with model.safetensors.index.json and its shards, or a directory
 * with model.safetensors.  Opening validates the whole file set (see
 * mmoe_safetensors.h), so `inspect` doubles as a checker: a malformed file
 * gives a message naming the file and the tensor, and exit status 1.
 *
 * One line per tensor (sorted by name): name, dtype, shape, bytes, the shard
 * for a multi-shard checkpoint and, with --stats, min / max / mean / abs-max
 * of the finite values and the NaN and Inf counts (mmoe_tensor_stats.h).
 * Dtypes whose values cannot be decoded yet show "-" and are listed under
 * the table, so that a missing statistic is never mistaken for a zero.
 * Then the totals, overall and per dtype, and the file's metadata.
 *
 * With --json the same report is JSON Lines on stdout (mmoe_json_report.h): one
 * {"type": "tensor", "name", "dtype", "shape": [...], "bytes", "shard"} per tensor (with
 * --stats also "min", "max", "mean", "absmax", "nan_count", "inf_count", null where the dtype
 * cannot be decoded or no value is finite, and "stats_available"), then one {"type": "total",
 * "tensors", "bytes", "filter", "by_dtype": {DTYPE: {"tensors", "bytes"}}}, then one
 * {"type": "metadata", "file", "metadata": {...}} per shard that has metadata.
 *
 * A tensor that is not aligned to its dtype in the file (the format allows it; the
 * reader copies it once into aligned memory) is marked `copied` after its line, and
 * a note gives the count and the bytes copied.  Names, metadata keys and values are
 * printed with control characters escaped (`\x1b`), so that a hostile file cannot
 * move the cursor or rewrite the terminal.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_json_report.h"
#include "mmoe_safetensors.h"
#include "mmoe_tensor_stats.h"

/** Widest name column before names overflow it (long names still print whole). */
#define INSPECT_MAX_NAME_COL 64

/** The parsed command line. */
typedef struct inspect_opts {
    const char *path;   /**< the file or directory */
    const char *filter; /**< NULL: all tensors */
    int stats;          /**< 1: print statistics */
    int json;           /**< 1: JSON Lines instead of the table */
} inspect_opts;

/** Print the --help text to @p out. */
static void inspect_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe inspect FILE|DIR [--stats] [--filter SUBSTRING]\n\n"
            "List the tensors of a safetensors file or checkpoint directory (with\n"
            "model.safetensors.index.json, or a lone model.safetensors): name, dtype,\n"
            "shape, bytes and shard, then totals per dtype and the metadata.\n"
            "Every file is fully validated first; a malformed one is an error (exit 1).\n\n"
            "options:\n"
            "  --stats             also print min, max, mean, abs-max of the finite values\n"
            "                      and the NaN and Inf counts (default: not computed)\n"
            "  --filter SUBSTRING  only tensors whose name contains SUBSTRING (default: all)\n"
            "  --json              the report as JSON Lines, one object per tensor, then totals\n"
            "                      (default: the table)\n"
            "  -h, --help          this text\n\n"
            "example:\n"
            "  megamoe inspect fixtures/tiny-dsv4 --filter layers.0.ffn --stats\n");
}

/** Parse the options; returns -1 to go on, else the exit status. */
static int parse_inspect_args(int argc, char **argv, inspect_opts *o)
{
    static const struct option long_opts[] = {
        {"stats", no_argument, NULL, 's'},
        {"filter", required_argument, NULL, 'f'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (c) {
        case 's': o->stats = 1; break;
        case 'f': o->filter = optarg; break;
        case 'j': o->json = 1; break;
        case 'h': inspect_usage(stdout); return 0;
        default: inspect_usage(stderr); return MMOE_EXIT_USAGE;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "megamoe inspect: expected one FILE or DIR, got %d arguments\n",
                argc - optind);
        inspect_usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    o->path = argv[optind];
    return -1;
}

/** Bytes of @p s as printed by print_escaped(). */
static int escaped_len(const char *s)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        n += *p < 0x20 || *p == 0x7f ? 4 : 1;
    return n;
}

/** Print @p s with each control character as a backslash, an x and two hex digits, padded with spaces to @p width. */
static void print_escaped(const char *s, int width)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
    for (int n = escaped_len(s); n < width; n++)
        putchar(' ');
}

/** Does the tensor @p name pass the --filter? */
static int matches(const inspect_opts *o, const char *name)
{
    return !o->filter || strstr(name, o->filter) != NULL;
}

/** Format @p n bytes as "1.50 GiB". */
static void human_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, units[u]);
}

/** One statistics column; NaN (no finite value) prints as "-". */
static void print_stat(double v)
{
    if (isnan(v))
        printf(" %11s", "-");
    else
        printf(" %11.5g", v);
}

/** Print the statistics columns of @p e; returns 1 if its dtype was unsupported. */
static int print_stats_columns(const mmoe_ckpt_entry *e)
{
    mmoe_tensor_stats s;
    if (mmoe_tensor_stats_compute(&e->view, &s, NULL) != MMOE_OK) {
        printf(" %11s %11s %11s %11s %6s %6s", "-", "-", "-", "-", "-", "-");
        return 1;
    }
    print_stat(s.min);
    print_stat(s.max);
    print_stat(s.mean);
    print_stat(s.absmax);
    printf(" %6" PRId64 " %6" PRId64, s.n_nan, s.n_inf);
    return 0;
}

/** Print the "__metadata__" of each shard that has any. */
static void print_metadata(const mmoe_ckpt *ck)
{
    for (size_t s = 0; s < mmoe_ckpt_shard_count(ck); s++) {
        const mmoe_st_file *f = mmoe_ckpt_shard(ck, s);
        size_t n = mmoe_st_metadata_count(f);
        if (n == 0)
            continue;
        printf("metadata of %s:\n", mmoe_st_path(f));
        for (size_t i = 0; i < n; i++) {
            const char *k, *v;
            if (mmoe_st_metadata_at(f, i, &k, &v) == MMOE_OK) {
                printf("  ");
                print_escaped(k, 0);
                printf(" = ");
                print_escaped(v, 0);
                printf("\n");
            }
        }
    }
}

/** One tensor as a JSON object (--json). */
static json_t *tensor_json(const inspect_opts *o, const mmoe_ckpt_entry *e)
{
    json_t *t = json_object(), *shape = json_array();
    json_object_set_new(t, "type", json_string("tensor"));
    mmoe_json_set_str(t, "name", e->name);
    mmoe_json_set_str(t, "dtype", mmoe_dtype_name(e->view.dtype));
    for (int d = 0; d < e->view.ndim; d++)
        json_array_append_new(shape, json_integer((json_int_t)e->view.shape[d]));
    json_object_set_new(t, "shape", shape);
    mmoe_json_set_int(t, "bytes", (int64_t)e->view.nbytes);
    mmoe_json_set_str(t, "shard", e->shard);
    if (o->stats) {
        mmoe_tensor_stats st;
        int ok = mmoe_tensor_stats_compute(&e->view, &st, NULL) == MMOE_OK;
        json_object_set_new(t, "stats_available", json_boolean(ok));
        mmoe_json_set_real(t, "min", ok ? st.min : NAN);
        mmoe_json_set_real(t, "max", ok ? st.max : NAN);
        mmoe_json_set_real(t, "mean", ok ? st.mean : NAN);
        mmoe_json_set_real(t, "absmax", ok ? st.absmax : NAN);
        json_object_set_new(t, "nan_count", ok ? json_integer((json_int_t)st.n_nan) : json_null());
        json_object_set_new(t, "inf_count", ok ? json_integer((json_int_t)st.n_inf) : json_null());
    }
    return t;
}

/** The whole report as JSON Lines (--json); returns the exit status. */
static int inspect_json(const inspect_opts *o, const mmoe_ckpt *ck)
{
    mmoe_error err;
    uint64_t total_bytes = 0, dt_bytes[MMOE_DT_COUNT] = {0};
    size_t total_n = 0, dt_n[MMOE_DT_COUNT] = {0};
    for (size_t i = 0; i < mmoe_ckpt_count(ck); i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_get(ck, i);
        if (!matches(o, e->name))
            continue;
        if (mmoe_json_print_line(stdout, tensor_json(o, e), &err) != MMOE_OK)
            goto fail;
        total_n++;
        total_bytes += e->view.nbytes;
        dt_n[e->view.dtype]++;
        dt_bytes[e->view.dtype] += e->view.nbytes;
    }
    json_t *by = json_object();
    for (int d = 0; d < MMOE_DT_COUNT; d++)
        if (dt_n[d] > 0)
            json_object_set_new(by, mmoe_dtype_name((mmoe_dtype)d),
                                json_pack("{s:I, s:I}", "tensors", (json_int_t)dt_n[d], "bytes", (json_int_t)dt_bytes[d]));
    json_t *total = json_object();
    json_object_set_new(total, "type", json_string("total"));
    mmoe_json_set_str(total, "path", o->path);
    mmoe_json_set_int(total, "shards", (int64_t)mmoe_ckpt_shard_count(ck));
    mmoe_json_set_int(total, "tensors", (int64_t)total_n);
    mmoe_json_set_int(total, "bytes", (int64_t)total_bytes);
    mmoe_json_set_str(total, "filter", o->filter);
    json_object_set_new(total, "by_dtype", by);
    if (mmoe_json_print_line(stdout, total, &err) != MMOE_OK)
        goto fail;
    for (size_t s = 0; s < mmoe_ckpt_shard_count(ck); s++) {
        const mmoe_st_file *f = mmoe_ckpt_shard(ck, s);
        if (mmoe_st_metadata_count(f) == 0)
            continue;
        json_t *md = json_object();
        for (size_t i = 0; i < mmoe_st_metadata_count(f); i++) {
            const char *k, *v;
            if (mmoe_st_metadata_at(f, i, &k, &v) == MMOE_OK)
                mmoe_json_set_str(md, k, v);
        }
        json_t *line = json_pack("{s:s, s:o}", "type", "metadata", "metadata", md);
        mmoe_json_set_str(line, "file", mmoe_st_path(f));
        if (mmoe_json_print_line(stdout, line, &err) != MMOE_OK)
            goto fail;
    }
    return 0;
fail:
    fprintf(stderr, "megamoe inspect: %s\n", err.msg);
    return 1;
}

int mmoe_cmd_inspect(int argc, char **argv)
{
    inspect_opts o;
    int rc = parse_inspect_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    mmoe_ckpt *ck;
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_ckpt_open(o.path, &ck, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe inspect: %s\n", err.msg);
        return 1;
    }
    if (o.json) {
        rc = inspect_json(&o, ck);
        mmoe_ckpt_close(ck);
        return rc;
    }
    size_t n_shards = mmoe_ckpt_shard_count(ck);
    int show_shard = n_shards > 1;
    printf("%s: %zu tensors in %zu shard%s\n", o.path, mmoe_ckpt_count(ck), n_shards,
           n_shards == 1 ? "" : "s");

    /* column widths */
    int name_w = 4, shape_w = 5;
    for (size_t i = 0; i < mmoe_ckpt_count(ck); i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_get(ck, i);
        if (!matches(&o, e->name))
            continue;
        char shape[256];
        mmoe_shape_str(e->view.ndim, e->view.shape, shape, sizeof shape);
        int nl = escaped_len(e->name), sl = (int)strlen(shape);
        name_w = nl > name_w ? (nl < INSPECT_MAX_NAME_COL ? nl : INSPECT_MAX_NAME_COL) : name_w;
        shape_w = sl > shape_w ? sl : shape_w;
    }
    printf("%-*s %-8s %-*s %14s", name_w, "name", "dtype", shape_w, "shape", "bytes");
    if (o.stats)
        printf(" %11s %11s %11s %11s %6s %6s", "min", "max", "mean", "absmax", "nan", "inf");
    if (show_shard)
        printf("  shard");
    printf("\n");

    uint64_t total_bytes = 0, dt_bytes[MMOE_DT_COUNT] = {0};
    size_t total_n = 0, dt_n[MMOE_DT_COUNT] = {0};
    int no_stats[MMOE_DT_COUNT] = {0};
    size_t n_copied = 0;
    uint64_t copied_bytes = 0;
    for (size_t i = 0; i < mmoe_ckpt_count(ck); i++) {
        const mmoe_ckpt_entry *e = mmoe_ckpt_get(ck, i);
        if (!matches(&o, e->name))
            continue;
        char shape[256];
        mmoe_shape_str(e->view.ndim, e->view.shape, shape, sizeof shape);
        print_escaped(e->name, name_w);
        printf(" %-8s %-*s %14zu", mmoe_dtype_name(e->view.dtype), shape_w, shape, e->view.nbytes);
        if (o.stats && print_stats_columns(e))
            no_stats[e->view.dtype] = 1;
        if (show_shard)
            printf("  %s", e->shard);
        if (e->realigned) {
            printf("  copied");
            n_copied++;
            copied_bytes += e->view.nbytes;
        }
        printf("\n");
        total_n++;
        total_bytes += e->view.nbytes;
        dt_n[e->view.dtype]++;
        dt_bytes[e->view.dtype] += e->view.nbytes;
    }
    char human[32];
    human_bytes(total_bytes, human, sizeof human);
    printf("total: %zu tensors, %" PRIu64 " bytes (%s)%s%s%s\n", total_n, total_bytes, human,
           o.filter ? " matching '" : "", o.filter ? o.filter : "", o.filter ? "'" : "");
    for (int d = 0; d < MMOE_DT_COUNT; d++) {
        if (dt_n[d] == 0)
            continue;
        human_bytes(dt_bytes[d], human, sizeof human);
        printf("  %-8s %8zu tensors %16" PRIu64 " bytes (%s)\n", mmoe_dtype_name((mmoe_dtype)d),
               dt_n[d], dt_bytes[d], human);
    }
    for (int d = 0; d < MMOE_DT_COUNT; d++)
        if (no_stats[d])
            printf("note: no statistics for %s tensors (shown as '-'): decoding of this dtype "
                   "is not available in inspect yet\n",
                   mmoe_dtype_name((mmoe_dtype)d));
    if (n_copied > 0)
        printf("note: %zu tensors (%" PRIu64 " bytes) marked 'copied' are not aligned to their dtype in the file; "
               "they were copied once into aligned memory\n", n_copied, copied_bytes);
    print_metadata(ck);
    mmoe_ckpt_close(ck);
    return 0;
}
