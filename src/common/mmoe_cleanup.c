/**
 * @file mmoe_cleanup.c
 * @brief The tables of temporaries and mappings, and the signal handlers that use them.
 *
 * See mmoe_cleanup.h.  Each slot has an atomic state (free, being filled, active): a writer
 * claims a free slot with a compare-and-swap, fills it, then publishes it as active; the
 * handler only reads active slots.  The handler may interrupt a writer half-way through a
 * slot: that slot is not active yet and is skipped.
 */
#include "mmoe_cleanup.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/** Longest registered path (with its NUL). */
#define CLEANUP_PATH_MAX 4096
/** Longest path kept for a mapping's message. */
#define CLEANUP_MAP_PATH_MAX 1024
/**
 * Passes over a temporary directory at most: a pass unlinks the files it lists, then removes
 * the directory; another pass follows only when the directory is still not empty (an entry the
 * listing did not return while its neighbours were being unlinked).
 */
#define CLEANUP_DIR_PASSES 8

/** Slot states. */
enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_ACTIVE = 2 };

/** A registered temporary. */
typedef struct cleanup_path {
    atomic_int state;             /**< SLOT_* */
    mmoe_cleanup_kind kind;       /**< file or directory */
    char path[CLEANUP_PATH_MAX];  /**< NUL-terminated */
} cleanup_path;

/** A registered mapping. */
typedef struct cleanup_mapping {
    atomic_int state;                /**< SLOT_* */
    uintptr_t addr;                  /**< first byte */
    size_t len;                      /**< bytes */
    char path[CLEANUP_MAP_PATH_MAX]; /**< the file (cut if longer) */
} cleanup_mapping;

/** The temporaries being written (with g_maps, the only global mutable state of the library: a signal
 *  handler can reach nothing else). */
static cleanup_path g_paths[MMOE_CLEANUP_MAX_PATHS];
/** The mapped input files. */
static cleanup_mapping g_maps[MMOE_CLEANUP_MAX_MAPS];

int mmoe_cleanup_add(const char *path, mmoe_cleanup_kind kind)
{
    size_t n = strlen(path);
    if (n >= CLEANUP_PATH_MAX)
        return -1;
    for (int i = 0; i < MMOE_CLEANUP_MAX_PATHS; i++) {
        int expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&g_paths[i].state, &expected, SLOT_FILLING)) {
            memcpy(g_paths[i].path, path, n + 1);
            g_paths[i].kind = kind;
            atomic_store(&g_paths[i].state, SLOT_ACTIVE);
            return i;
        }
    }
    return -1;
}

void mmoe_cleanup_remove(int slot)
{
    if (slot >= 0 && slot < MMOE_CLEANUP_MAX_PATHS)
        atomic_store(&g_paths[slot].state, SLOT_FREE);
}

int mmoe_cleanup_map(const void *addr, size_t len, const char *path)
{
    for (int i = 0; i < MMOE_CLEANUP_MAX_MAPS; i++) {
        int expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&g_maps[i].state, &expected, SLOT_FILLING)) {
            g_maps[i].addr = (uintptr_t)addr;
            g_maps[i].len = len;
            size_t n = strlen(path);
            if (n >= CLEANUP_MAP_PATH_MAX)
                n = CLEANUP_MAP_PATH_MAX - 1;
            memcpy(g_maps[i].path, path, n);
            g_maps[i].path[n] = '\0';
            atomic_store(&g_maps[i].state, SLOT_ACTIVE);
            return i;
        }
    }
    return -1;
}

void mmoe_cleanup_unmap(int slot)
{
    if (slot >= 0 && slot < MMOE_CLEANUP_MAX_MAPS)
        atomic_store(&g_maps[slot].state, SLOT_FREE);
}

/** One record of the getdents64 system call (no libc wrapper is async-signal-safe). */
typedef struct linux_dirent64_rec {
    uint64_t d_ino;          /**< inode */
    int64_t d_off;           /**< offset of the next record */
    unsigned short d_reclen; /**< length of this record */
    unsigned char d_type;    /**< file type */
    char d_name[];           /**< NUL-terminated name */
} linux_dirent64_rec;

/** Unlink the plain files that one listing of directory @p path returns (async-signal-safe). */
static void unlink_dir_files(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096] __attribute__((aligned(8)));
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            const linux_dirent64_rec *d = (const linux_dirent64_rec *)(buf + off);
            if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0)
                (void)unlinkat(fd, d->d_name, 0);
            off += d->d_reclen;
        }
    }
    close(fd);
}

/**
 * Remove the plain files of directory @p path, then the directory, in up to CLEANUP_DIR_PASSES
 * passes while it is not empty (async-signal-safe; errno as it was).
 */
static void remove_dir_files(const char *path)
{
    const int saved = errno;
    for (int pass = 0; pass < CLEANUP_DIR_PASSES; pass++) {
        unlink_dir_files(path);
        if (rmdir(path) == 0 || (errno != ENOTEMPTY && errno != EEXIST))
            break;
    }
    errno = saved;
}

void mmoe_cleanup_run(void)
{
    for (int i = 0; i < MMOE_CLEANUP_MAX_PATHS; i++) {
        if (atomic_load(&g_paths[i].state) != SLOT_ACTIVE)
            continue;
        if (g_paths[i].kind == MMOE_CLEANUP_DIR)
            remove_dir_files(g_paths[i].path);
        else
            (void)unlink(g_paths[i].path);
        atomic_store(&g_paths[i].state, SLOT_FREE);
    }
}

/** write(2) a NUL-terminated string to stderr (async-signal-safe). */
static void say(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/** @p v in decimal into @p buf (at least 21 bytes). */
static const char *decimal(uint64_t v, char *buf)
{
    char *p = buf + 20;
    *p = '\0';
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    return p;
}

/** SIGINT, SIGTERM, SIGHUP: remove the temporaries, then die of the same signal. */
static void on_terminate(int sig)
{
    mmoe_cleanup_run();
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* delivered when the handler returns (the signal is blocked inside it) */
}

/** SIGBUS: name the mapped file whose pages vanished, remove the temporaries, exit 1. */
static void on_bus_error(int sig, siginfo_t *info, void *uctx)
{
    (void)sig;
    (void)uctx;
    const uintptr_t a = (uintptr_t)info->si_addr;
    char num[21];
    for (int i = 0; i < MMOE_CLEANUP_MAX_MAPS; i++) {
        if (atomic_load(&g_maps[i].state) != SLOT_ACTIVE || a < g_maps[i].addr || a - g_maps[i].addr >= g_maps[i].len)
            continue;
        say("megamoe: ");
        say(g_maps[i].path);
        say(": the file shrank while it was being read (bus error at byte ");
        say(decimal(a - g_maps[i].addr, num));
        say(" of the mapping); was it truncated or rewritten by another program? No output was written.\n");
        mmoe_cleanup_run();
        _exit(1);
    }
    say("megamoe: bus error (SIGBUS) outside any mapped input file: no output was written.\n");
    mmoe_cleanup_run();
    _exit(1);
}

mmoe_status mmoe_cleanup_install(mmoe_error *err)
{
    static const int term_signals[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof term_signals / sizeof term_signals[0]; i++) {
        struct sigaction old, sa;
        if (sigaction(term_signals[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue; /* ignored by the parent (nohup, a background job): keep it ignored */
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_terminate;
        sigemptyset(&sa.sa_mask);
        if (sigaction(term_signals[i], &sa, NULL) != 0)
            return mmoe_error_set(err, MMOE_EINVAL, "cannot install the handler of signal %d", term_signals[i]);
    }
    struct sigaction bus;
    memset(&bus, 0, sizeof bus);
    bus.sa_sigaction = on_bus_error;
    bus.sa_flags = SA_SIGINFO;
    sigemptyset(&bus.sa_mask);
    if (sigaction(SIGBUS, &bus, NULL) != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "cannot install the handler of SIGBUS");
    return MMOE_OK;
}
