/**
 * @file mmoe_atomic_file.c
 * @brief Temporary file + fsync + rename (see mmoe_atomic_file.h for the protocol).
 *
 * The temporary name is `<path>.tmp.<pid>.<k>` where k is derived from the
 * monotonic clock and the attempt number; O_EXCL makes a collision (another
 * writer, a stale file) a retry rather than a clobber.
 */
#include "mmoe_atomic_file.h"
#include "mmoe_cleanup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/** How many temporary names to try before giving up. */
#define ATOMIC_MAX_ATTEMPTS 64

/** Free the paths and mark @p af closed (the descriptor must be closed already). */
static void atomic_release(mmoe_atomic_file *af)
{
    mmoe_cleanup_remove(af->cleanup_slot);
    af->cleanup_slot = -1;
    free(af->path);
    free(af->tmp_path);
    af->path = NULL;
    af->tmp_path = NULL;
    af->fd = -1;
}

/**
 * The file to replace for @p path: @p path itself, or the file a symbolic link leads to
 * (malloc'd).  *@p mode receives an existing target's permission bits, else -1.
 */
static mmoe_status resolve_target(const char *path, char **target, int *mode, mmoe_error *err)
{
    struct stat lsb, sb;
    *target = NULL;
    *mode = -1;
    if (lstat(path, &lsb) != 0) {
        *target = strdup(path); /* a new file (or a missing directory: open reports it) */
        return *target ? MMOE_OK : mmoe_error_set(err, MMOE_ENOMEM, "%s: out of memory", path);
    }
    if (S_ISLNK(lsb.st_mode)) {
        if (stat(path, &sb) != 0)
            return mmoe_error_set(err, MMOE_EIO, "%s: a symbolic link to a file that does not exist (%s): "
                                  "refusing to guess where to write", path, strerror(errno));
        *target = realpath(path, NULL);
        if (*target == NULL)
            return mmoe_error_set(err, MMOE_EIO, "%s: cannot resolve the symbolic link: %s", path, strerror(errno));
    } else {
        sb = lsb;
        *target = strdup(path);
        if (*target == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "%s: out of memory", path);
    }
    if (!S_ISREG(sb.st_mode)) {
        free(*target);
        *target = NULL;
        return mmoe_error_set(err, MMOE_EIO, "%s: exists and is not a regular file (%s): refusing to replace it", path,
                              S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ? "a FIFO" : "a special file");
    }
    *mode = (int)(sb.st_mode & 07777);
    return MMOE_OK;
}

mmoe_status mmoe_atomic_open(mmoe_atomic_file *af, const char *path, mmoe_error *err)
{
    af->fd = -1;
    af->cleanup_slot = -1;
    af->path = NULL;
    af->tmp_path = NULL;
    int mode;
    mmoe_status rst = resolve_target(path, &af->path, &mode, err);
    if (rst != MMOE_OK)
        return rst;
    size_t tmp_len = strlen(af->path) + 64;
    af->tmp_path = malloc(tmp_len);
    if (!af->tmp_path) {
        atomic_release(af);
        return mmoe_error_set(err, MMOE_ENOMEM, "%s: out of memory", path);
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t salt = (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20);
    int last_errno = 0;
    for (int attempt = 0; attempt < ATOMIC_MAX_ATTEMPTS; attempt++) {
        snprintf(af->tmp_path, tmp_len, "%s.tmp.%ld.%llu", af->path, (long)getpid(),
                 (unsigned long long)((salt + (uint64_t)attempt * 7919u) % 1000000007u));
        af->fd = open(af->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (af->fd >= 0) {
            af->cleanup_slot = mmoe_cleanup_add(af->tmp_path, MMOE_CLEANUP_FILE);
            if (mode >= 0 && fchmod(af->fd, (mode_t)mode) != 0) {
                last_errno = errno;
                mmoe_status st = mmoe_error_set(err, MMOE_EIO, "%s: cannot give %s the mode %04o of the file it "
                                                "replaces: %s", path, af->tmp_path, (unsigned)mode,
                                                strerror(last_errno));
                mmoe_atomic_abort(af);
                return st;
            }
            return MMOE_OK;
        }
        last_errno = errno;
        if (errno != EEXIST)
            break;
    }
    mmoe_status st = mmoe_error_set(err, MMOE_EIO, "%s: cannot create temporary file %s: %s", path,
                                    af->tmp_path, strerror(last_errno));
    atomic_release(af);
    return st;
}

void mmoe_atomic_abort(mmoe_atomic_file *af)
{
    if (af->fd >= 0)
        close(af->fd);
    if (af->tmp_path)
        unlink(af->tmp_path);
    atomic_release(af); /* after the unlink: a signal in between finds it registered */
}

mmoe_status mmoe_atomic_write(mmoe_atomic_file *af, const void *buf, size_t n, mmoe_error *err)
{
    const char *p = buf;
    while (n > 0) {
        /* stay below the 2 GiB per-call limit some kernels impose */
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t w = write(af->fd, p, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            mmoe_status st = mmoe_error_set(err, MMOE_EIO, "%s: write to %s failed: %s", af->path,
                                            af->tmp_path, strerror(e));
            mmoe_atomic_abort(af);
            return st;
        }
        p += w;
        n -= (size_t)w;
    }
    return MMOE_OK;
}

/** fsync the directory that holds @p path so the rename itself is durable (best effort). */
static void fsync_parent_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir)
        return;
    char *slash = strrchr(dir, '/');
    const char *dir_path = ".";
    if (slash == dir)
        dir_path = "/";
    else if (slash) {
        *slash = '\0';
        dir_path = dir;
    }
    int dfd = open(dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd); /* some file systems reject fsync on directories */
        close(dfd);
    }
    free(dir);
}

mmoe_status mmoe_atomic_commit(mmoe_atomic_file *af, mmoe_error *err)
{
    const char *step = NULL;
    if (fsync(af->fd) != 0)
        step = "fsync of";
    else if (close(af->fd) != 0) {
        af->fd = -1;
        step = "close of";
    } else {
        af->fd = -1;
        if (rename(af->tmp_path, af->path) != 0)
            step = "rename of";
    }
    if (step) {
        int e = errno;
        mmoe_status st = mmoe_error_set(err, MMOE_EIO, "%s: %s %s failed: %s", af->path, step,
                                        af->tmp_path, strerror(e));
        mmoe_atomic_abort(af);
        return st;
    }
    fsync_parent_dir(af->path);
    atomic_release(af);
    return MMOE_OK;
}
