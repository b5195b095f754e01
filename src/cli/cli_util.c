/**
 * @file cli_util.c
 * @brief What every `megamoe` command shares besides option parsing: the thread count, the
 *        check that no output replaces an input, and terminal-only progress lines.
 *
 * ## Outputs never replace inputs
 *
 * Every output is written atomically (mmoe_atomic_file.h): a temporary file renamed over the
 * target.  That protects an output from a crash, but not an input from a careless `--out`:
 * `megamoe logits --model ck --out ck/model-00001-of-00001.safetensors` would rename the
 * logits over the shard it is reading.  So before any work, each command hands its outputs
 * and inputs to mmoe_cli_check_outputs(), which compares **files**, not strings: two paths
 * are the same file when stat() (which follows symbolic links) gives the same device and
 * inode, so `./a`, `dir/../a`, a hard link and a symbolic link to `a` all count as `a`.  An
 * input that is a directory (a checkpoint) stands for every file directly in it: config.json,
 * the index, the shards, tokenizer.json.  Two outputs that do not exist yet are the same when
 * their directories are the same file and their last components are equal.
 *
 * ## Threads
 *
 * Two sets of threads can run the CPU oracle's work: OpenBLAS's (openblas_set_num_threads) and
 * the worker pool of the MoE layers, which reads MMOE_DEQUANT_THREADS when a layer or model
 * creates it (moe_dequant_pool.c; at most 64 threads).  The MoE commands (`moe`, `bench moe`)
 * run the MoE layer alone, which calls no BLAS: there `--threads N` sets both, N for
 * OpenBLAS (the SGEMM peer of `bench moe`) and min(N, 64) for the pool (mmoe_cli_set_threads()).
 * The commands that run the whole forward (`logits`, `generate`, `bench forward`, `serve`,
 * `perplexity`) share every part of it out over the pool, the FP8 linears' dgemm tiles
 * included, and give OpenBLAS one thread (mmoe_cli_set_forward_threads()): OpenBLAS's threads
 * would take turns with the pool's on the same cores (linear_fp8.c).  `--threads N` then sets
 * the pool to min(N, 64); without it the pool keeps its default (MMOE_DEQUANT_THREADS, else the
 * machine's cores up to 16) and OpenBLAS stays as the environment sets it when
 * OPENBLAS_NUM_THREADS is given, else one thread.
 */
#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mmoe_cli.h"

/** Most decode threads of a dequantization pool (moe_dequant_pool.c). */
#define CLI_MAX_DEQUANT_THREADS 64

void mmoe_cli_set_threads(int n)
{
    if (n <= 0)
        return;
    openblas_set_num_threads(n);
    char v[16];
    snprintf(v, sizeof v, "%d", n < CLI_MAX_DEQUANT_THREADS ? n : CLI_MAX_DEQUANT_THREADS);
    setenv("MMOE_DEQUANT_THREADS", v, 1);
}

void mmoe_cli_set_forward_threads(int n)
{
    if (n > 0 || getenv("OPENBLAS_NUM_THREADS") == NULL)
        openblas_set_num_threads(1);
    if (n <= 0)
        return;
    char v[16];
    snprintf(v, sizeof v, "%d", n < CLI_MAX_DEQUANT_THREADS ? n : CLI_MAX_DEQUANT_THREADS);
    setenv("MMOE_DEQUANT_THREADS", v, 1);
}

int mmoe_cli_progress_allowed(void)
{
    return isatty(STDERR_FILENO);
}

/** The identity of a path that may not exist yet: its file, else its directory and last name. */
typedef struct path_id {
    int exists;      /**< stat() succeeded: dev/ino are the file's */
    dev_t dev;       /**< device of the file (or of its directory) */
    ino_t ino;       /**< inode of the file (or of its directory) */
    const char *leaf;/**< the last component, for a path that does not exist */
    size_t leaf_len; /**< its length (trailing slashes excluded) */
} path_id;

/** Identify @p path; 0 on success, -1 when neither it nor its directory can be examined. */
static int identify(const char *path, path_id *id)
{
    struct stat sb;
    memset(id, 0, sizeof *id);
    if (stat(path, &sb) == 0) {
        id->exists = 1;
        id->dev = sb.st_dev;
        id->ino = sb.st_ino;
        return 0;
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t cut = n;
    while (cut > 0 && path[cut - 1] != '/')
        cut--;
    id->leaf = path + cut;
    id->leaf_len = n - cut;
    char *dir = cut == 0 ? strdup(".") : strndup(path, cut);
    int rc = dir != NULL && stat(dir, &sb) == 0 ? 0 : -1;
    free(dir);
    id->dev = sb.st_dev;
    id->ino = sb.st_ino;
    return rc;
}

/** Do two identified paths name the same file? */
static int same_file(const path_id *a, const path_id *b)
{
    if (a->exists != b->exists)
        return 0;
    if (a->dev != b->dev || a->ino != b->ino)
        return 0;
    return a->exists || (a->leaf_len == b->leaf_len && memcmp(a->leaf, b->leaf, a->leaf_len) == 0);
}

/** The refusal message. */
static mmoe_status refuse(mmoe_error *err, const mmoe_cli_path *out, const mmoe_cli_path *in, const char *member)
{
    if (member != NULL)
        return mmoe_error_set(err, MMOE_EINVAL, "--%s '%s' is the file '%s' of --%s '%s': an output may not "
                              "replace an input", out->opt, out->path, member, in->opt, in->path);
    return mmoe_error_set(err, MMOE_EINVAL, "--%s '%s' is the same file as --%s '%s': an output may not replace "
                          "%s", out->opt, out->path, in->opt, in->path, in->is_output ? "another output" : "an input");
}

/** Compare @p o with every regular file directly in the directory @p in. */
static mmoe_status check_against_dir(const mmoe_cli_path *out, const path_id *o, const mmoe_cli_path *in,
                                     mmoe_error *err)
{
    DIR *d = opendir(in->path);
    if (d == NULL)
        return MMOE_OK; /* the command's own open reports an unreadable input */
    mmoe_status st = MMOE_OK;
    struct dirent *e;
    char member[4096];
    while (st == MMOE_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(member, sizeof member, "%s/%s", in->path, e->d_name);
        struct stat sb;
        if (stat(member, &sb) == 0 && !S_ISDIR(sb.st_mode) && sb.st_dev == o->dev && sb.st_ino == o->ino)
            st = refuse(err, out, in, member);
    }
    closedir(d);
    return st;
}

mmoe_status mmoe_cli_check_outputs(const mmoe_cli_path *outs, size_t n_out, const mmoe_cli_path *ins, size_t n_in,
                                   mmoe_error *err)
{
    for (size_t i = 0; i < n_out; i++) {
        if (outs[i].path == NULL)
            continue;
        path_id o;
        if (identify(outs[i].path, &o) != 0)
            continue; /* its directory does not exist: the write fails with its own message */
        for (size_t j = 0; j < n_in; j++) {
            if (ins[j].path == NULL)
                continue;
            path_id in;
            if (identify(ins[j].path, &in) != 0 || !in.exists)
                continue;
            struct stat sb;
            mmoe_status st = MMOE_OK;
            if (o.exists && same_file(&o, &in))
                st = refuse(err, &outs[i], &ins[j], NULL);
            else if (o.exists && stat(ins[j].path, &sb) == 0 && S_ISDIR(sb.st_mode))
                st = check_against_dir(&outs[i], &o, &ins[j], err);
            if (st != MMOE_OK)
                return st;
        }
        for (size_t j = 0; j < i; j++) { /* two outputs: the second would replace the first */
            path_id p;
            if (outs[j].path != NULL && identify(outs[j].path, &p) == 0 && same_file(&o, &p)) {
                mmoe_cli_path first = outs[j];
                first.is_output = 1;
                return refuse(err, &outs[i], &first, NULL);
            }
        }
    }
    return MMOE_OK;
}
