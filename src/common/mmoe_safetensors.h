/**
 * @file mmoe_safetensors.h
 * @brief Safetensors files and checkpoints: a validating zero-copy reader, an atomic writer.
 *
 * A safetensors file is three parts, back to back:
 *
 *     [ u64 little-endian N ][ N bytes of UTF-8 JSON header ][ data section ]
 *
 * The header is one JSON object.  Each key except "__metadata__" names a
 * tensor and maps to `{"dtype": "BF16", "shape": [4096, 2048],
 * "data_offsets": [begin, end]}`; the offsets are byte offsets relative to the
 * start of the data section.  "__metadata__", if present, is an object of
 * string values (free-form notes such as {"format": "pt"}).
 *
 * **Reader.**  mmoe_st_open() maps the whole file read-only (mmap), parses the
 * header with jansson and validates *everything* before it returns: the length
 * field, UTF-8, the JSON shape of each entry, dtypes, shapes (no negative
 * extents, no overflow of numel or byte count), that each tensor's byte count
 * equals numel * dtype size, and that the tensors tile the data section
 * exactly (no overlap, no hole, no trailing bytes: the rule of the reference
 * implementation).  After a successful open every ::mmoe_tensor view points
 * into the mapping and lies inside the file; the views are read-only (writing
 * through them faults) and live until mmoe_st_close().  Tensors are indexed
 * in sorted name order (byte-wise strcmp), whatever the order in the header.
 *
 * **Alignment.**  The format does not require a tensor to start at a multiple of
 * its element size (writers other than the reference one, and its older versions
 * whose header length was not padded, produce such files), but typed loads need
 * it.  The reader accepts every file the format allows: a tensor whose bytes are
 * not aligned to its dtype's size in the mapping is copied once, at open, into
 * aligned memory owned by the file, and its view points at the copy
 * (::mmoe_st_entry::realigned; mmoe_st_realigned_bytes() counts the copies,
 * `megamoe inspect` lists them).  Every view is therefore aligned to its dtype.
 *
 * **Opening.**  Only regular files are opened (a FIFO or device is refused before
 * anything blocks on it).  A file whose first bytes cannot be a safetensors
 * header (a length beyond the limit or the file, not followed by `{`) is named
 * as "not a safetensors file".  Each mapping is registered with mmoe_cleanup.h,
 * so that a program that installed its handlers reports a file truncated under
 * it by name instead of dying of SIGBUS.
 *
 * **Checkpoints.**  A ::mmoe_ckpt is a set of safetensors shards seen as one
 * name -> tensor map: one file, a directory with `model.safetensors`, or a
 * directory with `model.safetensors.index.json` whose "weight_map" maps each
 * tensor name to its shard file.  All shards are opened (mapped and validated)
 * at mmoe_ckpt_open(), so that a broken checkpoint fails at once, not in the
 * middle of a forward pass; mapping is virtual, pages are read on first touch.
 *
 * **Writer.**  A ::mmoe_st_writer collects tensors (borrowing their bytes) and
 * metadata, then mmoe_st_writer_finish() writes the file atomically: a
 * temporary file in the target's directory, fsync, rename.  On any error no
 * file exists at the target path and the temporary file is removed.  Tensors
 * are laid out in sorted name order and the header is padded with spaces to a
 * multiple of 8 bytes, as the reference implementation does, so that every
 * tensor of an 8-byte-aligned dtype starts 8-byte aligned in the file.
 *
 * All functions report failures through ::mmoe_status and an ::mmoe_error
 * message that names the file, the tensor, what was expected and what was
 * found.  Nothing here holds global state; distinct objects may be used from
 * distinct threads, and a reader or checkpoint may be read concurrently.
 */
#ifndef MMOE_SAFETENSORS_H
#define MMOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"
#include "mmoe_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest header the reader accepts, in bytes (the reference implementation's limit). */
#define MMOE_ST_MAX_HEADER_BYTES 100000000u

/** File name of the index of a multi-shard checkpoint. */
#define MMOE_ST_INDEX_NAME "model.safetensors.index.json"

/** File name of a single-file checkpoint inside a directory. */
#define MMOE_ST_SINGLE_NAME "model.safetensors"

/* ---------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------- */

/** An open, validated safetensors file (opaque). */
typedef struct mmoe_st_file mmoe_st_file;

/** One tensor of a file. */
typedef struct mmoe_st_entry {
    const char *name;     /**< tensor name (UTF-8, NUL-terminated); owned by the file */
    mmoe_tensor view;     /**< dtype, shape and read-only bytes inside the mapping */
    uint64_t file_offset; /**< byte offset of the first byte in the file (8 + N + begin) */
    int realigned;        /**< 1: not aligned to its dtype in the file; view.data is an aligned copy */
} mmoe_st_entry;

/**
 * Open, map and validate a safetensors file.
 * @param path  the file
 * @param out   receives the file on success (NULL on failure)
 * @param err   message on failure, naming @p path and the offending tensor
 * @return MMOE_OK; MMOE_ENOTFOUND (no such file); MMOE_EIO (cannot
 *         open/stat/map, or not a regular file); MMOE_EFORMAT (any
 *         malformed header, entry or offset); MMOE_EUNSUPPORTED (more than
 *         ::MMOE_MAX_DIMS dimensions); MMOE_ENOMEM
 */
mmoe_status mmoe_st_open(const char *path, mmoe_st_file **out, mmoe_error *err);

/**
 * Validate a safetensors image already in memory (same checks as
 * mmoe_st_open()).  The bytes are borrowed: they must outlive the file object
 * and must not change.  Used by tests and the fuzzer.
 * @param data   the image
 * @param size   its length in bytes
 * @param label  the name used in error messages (e.g. a path); copied
 * @param out    receives the file on success (NULL on failure)
 * @param err    message on failure
 * @return as mmoe_st_open(), without MMOE_ENOTFOUND and MMOE_EIO
 */
mmoe_status mmoe_st_open_memory(const void *data, size_t size, const char *label,
                                mmoe_st_file **out, mmoe_error *err);

/** Unmap and free @p f.  NULL is allowed.  Every view of @p f becomes invalid. */
void mmoe_st_close(mmoe_st_file *f);

/** The path (or label) the file was opened with. */
const char *mmoe_st_path(const mmoe_st_file *f);

/** Size of the whole file in bytes. */
uint64_t mmoe_st_file_size(const mmoe_st_file *f);

/** Bytes of the tensors that were copied into aligned memory at open (0: every view is in the mapping). */
uint64_t mmoe_st_realigned_bytes(const mmoe_st_file *f);

/** Number of tensors (the "__metadata__" entry is not a tensor). */
size_t mmoe_st_count(const mmoe_st_file *f);

/** Tensor @p i in sorted name order, 0 <= i < mmoe_st_count(); NULL if out of range. */
const mmoe_st_entry *mmoe_st_get(const mmoe_st_file *f, size_t i);

/** The tensor named @p name, or NULL if the file has none (binary search). */
const mmoe_tensor *mmoe_st_find(const mmoe_st_file *f, const char *name);

/** The whole entry named @p name, or NULL. */
const mmoe_st_entry *mmoe_st_find_entry(const mmoe_st_file *f, const char *name);

/** Value of "__metadata__"[@p key], or NULL if absent.  Owned by the file. */
const char *mmoe_st_metadata(const mmoe_st_file *f, const char *key);

/** Number of "__metadata__" entries. */
size_t mmoe_st_metadata_count(const mmoe_st_file *f);

/**
 * Metadata entry @p i in sorted key order.
 * @return MMOE_OK, or MMOE_EINVAL if @p i is out of range
 */
mmoe_status mmoe_st_metadata_at(const mmoe_st_file *f, size_t i, const char **key,
                                const char **value);

/* ---------------------------------------------------------------------------
 * Checkpoints (one file or an indexed set of shards)
 * ------------------------------------------------------------------------- */

/** A checkpoint: a name -> tensor map over one or more shards (opaque). */
typedef struct mmoe_ckpt mmoe_ckpt;

/** One tensor of a checkpoint. */
typedef struct mmoe_ckpt_entry {
    const char *name;     /**< tensor name; owned by the checkpoint */
    mmoe_tensor view;     /**< read-only view into the shard's mapping */
    const char *shard;    /**< the shard's file name as in the index (or the file's path) */
    int shard_index;      /**< 0-based shard number, in sorted shard-name order */
    int realigned;        /**< the view is an aligned copy (see mmoe_st_entry::realigned) */
} mmoe_ckpt_entry;

/**
 * Open a checkpoint.  @p path is either
 * - a .safetensors file (one shard), or
 * - a directory holding ::MMOE_ST_INDEX_NAME: its "weight_map" object maps each
 *   tensor name to a shard file name in the same directory; or
 * - a directory holding only ::MMOE_ST_SINGLE_NAME (no index).
 *
 * Every shard is opened and validated now.  The index must be consistent
 * with the shards: a listed shard that is missing, a tensor listed for a shard
 * that does not contain it, and a tensor in a shard that the index does not
 * list for that shard are all errors.
 * @return MMOE_OK; MMOE_ENOTFOUND (path, index, shard or listed tensor
 *         missing); MMOE_EFORMAT (malformed index or shard); MMOE_EIO; MMOE_ENOMEM
 */
mmoe_status mmoe_ckpt_open(const char *path, mmoe_ckpt **out, mmoe_error *err);

/** Unmap all shards and free @p ck.  NULL is allowed. */
void mmoe_ckpt_close(mmoe_ckpt *ck);

/** Number of tensors over all shards. */
size_t mmoe_ckpt_count(const mmoe_ckpt *ck);

/** Tensor @p i in sorted name order, or NULL if out of range. */
const mmoe_ckpt_entry *mmoe_ckpt_get(const mmoe_ckpt *ck, size_t i);

/** Number of shards (1 for a single file). */
size_t mmoe_ckpt_shard_count(const mmoe_ckpt *ck);

/** Shard @p i (sorted by file name), or NULL if out of range. */
const mmoe_st_file *mmoe_ckpt_shard(const mmoe_ckpt *ck, size_t i);

/** The tensor named @p name, or NULL. */
const mmoe_tensor *mmoe_ckpt_find(const mmoe_ckpt *ck, const char *name);

/**
 * A name lookup over a checkpoint in the form the loaders take (::mmoe_moe_lookup_fn of
 * mmoe_moe.h, ::mmoe_tensor_lookup_fn of mmoe_attention.h):
 * `mmoe_moe_layer_load(layer, mmoe_ckpt_lookup, ck, 3, &err)` loads layer 3 of @p ck.
 * @param ckpt  the checkpoint (a `const mmoe_ckpt *`, passed as the loaders' context)
 * @param name  the tensor's name
 * @param out   receives the view (borrowed from the checkpoint)
 * @param err   error report
 * @return MMOE_OK, or MMOE_ENOTFOUND naming the tensor and the checkpoint
 */
mmoe_status mmoe_ckpt_lookup(void *ckpt, const char *name, mmoe_tensor *out, mmoe_error *err);

/** The entry named @p name (with its shard), or NULL. */
const mmoe_ckpt_entry *mmoe_ckpt_find_entry(const mmoe_ckpt *ck, const char *name);

/**
 * Look up a tensor and check its dtype and shape, and that its data is
 * aligned to its element size (so that it may be read as a typed array).
 * @param ck     the checkpoint
 * @param name   tensor name
 * @param dtype  expected dtype
 * @param ndim   expected number of dimensions; a negative value skips the shape check
 * @param shape  expected extents (ndim values; may be NULL if ndim <= 0)
 * @param view   receives a copy of the view on success (may be NULL)
 * @param err    on failure: the tensor, expected vs found, and the shard file
 * @return MMOE_OK, MMOE_ENOTFOUND, MMOE_EDTYPE, MMOE_ESHAPE, or MMOE_EUNSUPPORTED
 *         (the data is not aligned: a file from a writer that does not align)
 */
mmoe_status mmoe_ckpt_require(const mmoe_ckpt *ck, const char *name, mmoe_dtype dtype, int ndim,
                              const int64_t *shape, mmoe_tensor *view, mmoe_error *err);

/* ---------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------- */

/** A safetensors file being assembled (opaque). */
typedef struct mmoe_st_writer mmoe_st_writer;

/** Make an empty writer. @return MMOE_OK or MMOE_ENOMEM */
mmoe_status mmoe_st_writer_create(mmoe_st_writer **out, mmoe_error *err);

/** Free @p w (without writing anything).  NULL is allowed. */
void mmoe_st_writer_destroy(mmoe_st_writer *w);

/**
 * Add a tensor.  The name is copied; the bytes are **borrowed**: @p data must
 * stay valid and unchanged until mmoe_st_writer_finish() returns.
 * @param w       the writer
 * @param name    non-empty UTF-8, not "__metadata__", not yet added
 * @param dtype   element type
 * @param ndim    0..::MMOE_MAX_DIMS
 * @param shape   ndim extents >= 0 (may be NULL if ndim == 0)
 * @param data    the row-major bytes (may be NULL only if nbytes == 0)
 * @param nbytes  must equal numel * dtype size
 * @param err     message on failure
 * @return MMOE_OK; MMOE_EINVAL (bad name, duplicate, bad shape, nbytes
 *         mismatch; the message names the tensor); MMOE_ENOMEM
 */
mmoe_status mmoe_st_writer_add(mmoe_st_writer *w, const char *name, mmoe_dtype dtype, int ndim,
                               const int64_t *shape, const void *data, size_t nbytes,
                               mmoe_error *err);

/**
 * Add a tensor whose bytes come later: mmoe_st_writer_finish_streamed() asks for them just
 * before it writes them.  Checks as mmoe_st_writer_add(); a writer holding such a tensor can only
 * be finished by mmoe_st_writer_finish_streamed().
 * @return MMOE_OK; MMOE_EINVAL (as mmoe_st_writer_add()); MMOE_ENOMEM
 */
mmoe_status mmoe_st_writer_add_deferred(mmoe_st_writer *w, const char *name, mmoe_dtype dtype, int ndim,
                                        const int64_t *shape, size_t nbytes, mmoe_error *err);

/** mmoe_st_writer_add() with the dtype, shape, bytes and size of a view. */
mmoe_status mmoe_st_writer_add_tensor(mmoe_st_writer *w, const char *name, const mmoe_tensor *t,
                                      mmoe_error *err);

/**
 * Set "__metadata__"[@p key] = @p value (both copied, UTF-8; a later call
 * with the same key replaces the value).
 * @return MMOE_OK, MMOE_EINVAL (invalid UTF-8) or MMOE_ENOMEM
 */
mmoe_status mmoe_st_writer_set_metadata(mmoe_st_writer *w, const char *key, const char *value,
                                        mmoe_error *err);

/** Number of tensors added so far. */
size_t mmoe_st_writer_count(const mmoe_st_writer *w);

/** Total tensor bytes added so far (the size of the data section). */
uint64_t mmoe_st_writer_data_bytes(const mmoe_st_writer *w);

/**
 * Write the file to @p path atomically (temporary file in the same
 * directory, fsync, rename, fsync of the directory).  The writer stays
 * usable (it may be finished again to another path) and must still be
 * destroyed.  On failure no file exists at @p path (an existing file there is
 * left untouched) and no temporary file remains.
 * @return MMOE_OK, MMOE_EIO (naming the path and the system error), MMOE_ENOMEM
 */
mmoe_status mmoe_st_writer_finish(mmoe_st_writer *w, const char *path, mmoe_error *err);

/**
 * The tensors in the order of the data section (the order every finish writes them), as indices
 * in the order they were added: @p order[k] = the index of the k-th tensor written.
 * @param w      the writer
 * @param order  room for mmoe_st_writer_count() indices
 * @param err    message on failure
 * @return MMOE_OK or MMOE_ENOMEM
 */
mmoe_status mmoe_st_writer_data_order(const mmoe_st_writer *w, size_t *order, mmoe_error *err);

/**
 * Supplier of a deferred tensor's bytes (mmoe_st_writer_add_deferred()): sets *@p data to the
 * @p nbytes bytes of the tensor added @p index-th (0-based), which must stay valid until the
 * finish returns.  Called in data order (mmoe_st_writer_data_order()), once per deferred tensor.
 * @return MMOE_OK, or a failure that ends the finish (its message in @p err)
 */
typedef mmoe_status (*mmoe_st_bytes_fn)(void *ctx, size_t index, const void **data, mmoe_error *err);

/**
 * mmoe_st_writer_finish() for a writer with deferred tensors: each one's bytes are asked of
 * @p bytes just before they are written, so that a producer can make them while the file is
 * being written.  A failure of @p bytes is returned as is and leaves no file.
 */
mmoe_status mmoe_st_writer_finish_streamed(mmoe_st_writer *w, const char *path, mmoe_st_bytes_fn bytes, void *ctx,
                                           mmoe_error *err);

/**
 * Write all tensors as a sharded checkpoint into the existing directory
 * @p dir: shards `model-00001-of-0000N.safetensors` (tensors split in name
 * order, a new shard whenever the next tensor would push the current one past
 * @p max_shard_bytes; a tensor larger than that gets a shard of its own), each
 * with the writer's metadata, then ::MMOE_ST_INDEX_NAME, written last.  Always
 * writes an index, even for one shard, so that mmoe_ckpt_open(@p dir) reads
 * exactly these files.  Each file is written atomically; on failure the
 * shards this call wrote are removed and no index is written (files of an
 * older checkpoint in @p dir with the same names may already have been
 * replaced: the set as a whole is not atomic).
 * @param w                the writer (unchanged; may be finished again)
 * @param dir              an existing directory
 * @param max_shard_bytes  tensor bytes per shard (the data section, not the header)
 * @param n_shards_out     receives the number of shards written (may be NULL)
 * @param err              message on failure
 * @return MMOE_OK, MMOE_EIO, MMOE_ENOMEM
 */
mmoe_status mmoe_st_writer_finish_sharded(mmoe_st_writer *w, const char *dir,
                                          uint64_t max_shard_bytes, size_t *n_shards_out,
                                          mmoe_error *err);

/**
 * Write a `model.safetensors.index.json` atomically:
 * `{"metadata": {"total_size": total_size}, "weight_map": {name: shard, ...}}`.
 * @param path         the index file to write
 * @param n            number of tensors
 * @param names        tensor names
 * @param shard_files  for each tensor, its shard's file name (relative to the index's directory)
 * @param total_size   sum of all tensor bytes (written as metadata.total_size)
 * @param err          message on failure
 * @return MMOE_OK, MMOE_EINVAL (duplicate or empty name), MMOE_EIO, MMOE_ENOMEM
 */
mmoe_status mmoe_st_write_index(const char *path, size_t n, const char *const *names,
                                const char *const *shard_files, uint64_t total_size,
                                mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_SAFETENSORS_H */
