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
 * only has to call mmoe_atomic_abort() when it stops for its own reasons.  While it exists,
 * the temporary file is registered with mmoe_cleanup.h, so that SIGINT or SIGTERM removes it.
 *
 * What an existing target keeps, deliberately:
 *  - **its mode**: the new file gets the old one's permission bits (a 0600 file stays 0600);
 *    a new target gets 0666 minus the umask;
 *  - **its links**: a target that is a symbolic link is written *through*: the link stays, and
 *    the file it points to (after every link, as realpath() resolves it) is replaced; the
 *    temporary file is made next to that file, so the rename stays on one file system.  A link
 *    that points nowhere is refused (there is no file to replace and no directory to assume);
 *  - a target that exists but is not a regular file (a directory, a FIFO, a device) is refused.
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
    int cleanup_slot;  /**< its slot in the signal-cleanup table (-1: none) */
} mmoe_atomic_file;

/**
 * Create the temporary file next to @p path (next to the file a symbolic link @p path leads to).
 * @return MMOE_OK, MMOE_EIO (message names @p path and the system error; a dangling link; a
 *         target that is not a regular file), MMOE_ENOMEM
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
