/**
 * @file mmoe_cleanup.h
 * @brief What a signal must not leave behind: temporary outputs, and a bus error on a mapped input.
 *
 * ## Why a process-wide table
 *
 * Outputs are written to temporary files (mmoe_atomic_file.h) or a temporary directory
 * (`DIR.partial-PID/`, mmoe_synth_model.h) and renamed into place at the end.  Ctrl-C or a
 * `kill` in the middle used to leave them on disk (hundreds of megabytes).  A signal handler
 * can reach nothing but global state, so this module keeps the one table of the library that
 * is global: the temporaries being written now.  The writers add a path when they create it and
 * remove it when they rename or delete it; nothing else reads the table but the handler.
 *
 * The second table lists the mapped input files (mmoe_safetensors.h maps every file it reads).
 * When such a file is truncated by another process while it is mapped, reading the vanished
 * pages raises SIGBUS; the handler finds the file whose mapping holds the faulting address and
 * prints `megamoe: FILE: the file shrank while it was being read (bus error at byte N)`.
 *
 * ## The handlers
 *
 * The library never installs a handler itself: a program calls mmoe_cleanup_install() once
 * (the `megamoe` program does, first thing).  On SIGINT, SIGTERM or SIGHUP the handler removes
 * every registered temporary (a temporary directory with the plain files in it), restores the
 * default action and raises the signal again, so that the exit status still says "killed by
 * SIGINT".  On SIGBUS it prints the message above (or a generic one for an address outside the
 * table), removes the temporaries and exits with status 1.  The handler only uses
 * async-signal-safe calls (unlink, unlinkat, rmdir, open, write, the getdents64 system call).
 *
 * A full table is not an error: a temporary that does not fit is simply not removed by a
 * signal (it still is on every ordinary error path); a mapping that does not fit gets the
 * generic SIGBUS message.
 */
#ifndef MMOE_CLEANUP_H
#define MMOE_CLEANUP_H

#include <stddef.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a registered temporary is. */
typedef enum mmoe_cleanup_kind {
    MMOE_CLEANUP_FILE = 1, /**< a file: unlinked */
    MMOE_CLEANUP_DIR = 2   /**< a directory of plain files: its files unlinked, then the directory removed */
} mmoe_cleanup_kind;

/** Temporaries the table holds at once. */
#define MMOE_CLEANUP_MAX_PATHS 64
/** Mapped files the table holds at once. */
#define MMOE_CLEANUP_MAX_MAPS 1024

/**
 * Register a temporary to remove on a signal.
 * @return a slot number for mmoe_cleanup_remove(), or -1 when the table is full or the path is too long
 */
int mmoe_cleanup_add(const char *path, mmoe_cleanup_kind kind);

/** Forget slot @p slot (after the temporary was renamed or removed); -1 is a no-op. */
void mmoe_cleanup_remove(int slot);

/**
 * Register a mapping of @p len bytes at @p addr of the file @p path (for the SIGBUS message).
 * @return a slot number for mmoe_cleanup_unmap(), or -1 when the table is full
 */
int mmoe_cleanup_map(const void *addr, size_t len, const char *path);

/** Forget mapping slot @p slot (before munmap); -1 is a no-op. */
void mmoe_cleanup_unmap(int slot);

/**
 * Install the handlers of SIGINT, SIGTERM, SIGHUP and SIGBUS (see the file comment).  A signal
 * whose action is "ignore" when this is called (a background job's SIGINT) stays ignored.
 * @return MMOE_OK, or MMOE_EINVAL naming the signal sigaction() refused
 */
mmoe_status mmoe_cleanup_install(mmoe_error *err);

/**
 * Remove every registered temporary now (what the handler does; also usable by a program that
 * handles a signal itself and then exits).  Async-signal-safe.
 */
void mmoe_cleanup_run(void);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_CLEANUP_H */
