/**
 * @file mmoe_atomic_file.h
 * @brief Atomic file replacement: write to a temporary file, fsync, rename.
 *
 * Every output file of megamoe is written through this helper, so that a
 * crash, a full disk or an error half-way leaves either the old file or no
 * file at the target path, never a truncated one.  The protocol:
 *
 * 1. mmoe_atomic_open() creates `<path>.tmp.<pid>.<n>` in the *same directory*
 *    (rename is atomic only within one file system) with O_EXCL and mode
 *    0666 minus the umask;
 * 2. the caller appends bytes with mmoe_atomic_write();
 * 3. mmoe_atomic_commit() fsyncs the file, closes it, renames it over @p path
 *    and fsyncs the directory (best effort: some file systems refuse it);
 *    mmoe_atomic_abort() closes and removes the temporary file instead.
 *
 * Any failing step removes the temporary file before it returns, so the caller
 * only has to call mmoe_atomic_abort() when it stops for its own reasons.
 */
#ifndef MMOE_ATOMIC_FILE_H
#define MMOE_ATOMIC_FILE_H

#include <stddef.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A file being written atomically.  Fields are private. */
typedef struct mmoe_atomic_file {
    int fd;            /**< descriptor of the temporary file (-1 when closed) */
    char *path;        /**< the target path (owned) */
    char *tmp_path;    /**< the temporary file's path (owned) */
} mmoe_atomic_file;

/**
 * Create the temporary file next to @p path.
 * @return MMOE_OK, MMOE_EIO (message names @p path and the system error), MMOE_ENOMEM
 */
mmoe_status mmoe_atomic_open(mmoe_atomic_file *af, const char *path, mmoe_error *err);

/**
 * Append @p n bytes (retrying short writes and EINTR).  On failure the
 * temporary file is removed and @p af is closed.
 * @return MMOE_OK or MMOE_EIO
 */
mmoe_status mmoe_atomic_write(mmoe_atomic_file *af, const void *buf, size_t n, mmoe_error *err);

/**
 * fsync, close and rename over the target; on failure the temporary file is
 * removed and the target is left as it was.
 * @return MMOE_OK or MMOE_EIO
 */
mmoe_status mmoe_atomic_commit(mmoe_atomic_file *af, mmoe_error *err);

/** Close and remove the temporary file (no-op if already closed). */
void mmoe_atomic_abort(mmoe_atomic_file *af);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_ATOMIC_FILE_H */
