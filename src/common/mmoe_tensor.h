/**
 * @file mmoe_tensor.h
 * @brief Element types and tensor views: the vocabulary shared by the loader, the oracle and the GPU path.
 *
 * A ::mmoe_tensor is a *view*: a dtype, a row-major shape and a pointer to the
 * bytes.  It never owns memory; whoever created the bytes (an mmapped
 * safetensors file, a layer object, a test) keeps them alive.  Shapes are
 * row-major (C order): the last dimension is contiguous.
 *
 * Sub-byte data (FP4 E2M1) is stored two codes per byte, as the DeepSeek-V4
 * checkpoints do it, and typed U8 or I8: a tensor [N, K/2] of bytes holds a
 * logical [N, K] FP4 matrix (see mmoe_formats.h for the nibble order).
 */
#ifndef MMOE_TENSOR_H
#define MMOE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Element types, named as in the safetensors header ("BF16", "F8_E4M3", ...). */
typedef enum mmoe_dtype {
    MMOE_DT_BF16 = 0,   /**< bfloat16, 2 bytes */
    MMOE_DT_F16,        /**< IEEE half, 2 bytes */
    MMOE_DT_F32,        /**< IEEE single, 4 bytes */
    MMOE_DT_F64,        /**< IEEE double, 8 bytes */
    MMOE_DT_I8,         /**< int8 (also packed FP4 pairs) */
    MMOE_DT_U8,         /**< uint8 (also packed FP4 pairs) */
    MMOE_DT_I16,        /**< int16 */
    MMOE_DT_I32,        /**< int32 (also 4 packed UE8M0 bytes) */
    MMOE_DT_I64,        /**< int64 */
    MMOE_DT_F8_E4M3,    /**< FP8 E4M3FN, 1 byte */
    MMOE_DT_F8_E5M2,    /**< FP8 E5M2, 1 byte */
    MMOE_DT_F8_E8M0,    /**< E8M0 / UE8M0 scale, 1 byte */
    MMOE_DT_BOOL,       /**< boolean, 1 byte (0 false, else true) */
    MMOE_DT_U16,        /**< uint16 */
    MMOE_DT_U32,        /**< uint32 */
    MMOE_DT_U64,        /**< uint64 */
    MMOE_DT_COUNT       /**< number of dtypes (not a dtype) */
} mmoe_dtype;

/** Largest number of dimensions a tensor may have. */
#define MMOE_MAX_DIMS 8

/** A borrowed view of a dense row-major tensor. */
typedef struct mmoe_tensor {
    mmoe_dtype dtype;              /**< element type */
    int ndim;                      /**< number of dimensions, 0..MMOE_MAX_DIMS (0 = scalar) */
    int64_t shape[MMOE_MAX_DIMS];  /**< extent of each dimension */
    void *data;                    /**< first byte; not owned */
    size_t nbytes;                 /**< size of the data in bytes (= numel * dtype size) */
} mmoe_tensor;

/** Bytes per element of @p dt (0 for an invalid dtype). */
size_t mmoe_dtype_size(mmoe_dtype dt);

/** The safetensors name of @p dt ("BF16", "F8_E4M3", ...); "?" for an invalid one. */
const char *mmoe_dtype_name(mmoe_dtype dt);

/**
 * Parse a safetensors dtype name.
 * @param name  e.g. "F32"
 * @param out   the dtype, written on success
 * @return MMOE_OK, or MMOE_EFORMAT if the name is unknown
 */
mmoe_status mmoe_dtype_from_name(const char *name, mmoe_dtype *out);

/** A 2-D view of @p data: dtype @p dt, shape [@p rows, @p cols], nbytes = rows * cols * dtype size. */
mmoe_tensor mmoe_tensor_view2(mmoe_dtype dt, int64_t rows, int64_t cols, void *data);

/** Number of elements (product of the shape; 1 for a scalar). */
int64_t mmoe_tensor_numel(const mmoe_tensor *t);

/**
 * Format a shape as "[4096, 2048]" into @p buf (always NUL-terminated).
 * @return @p buf
 */
char *mmoe_shape_str(int ndim, const int64_t *shape, char *buf, size_t buflen);

/**
 * Check that @p t has dtype @p dt and the given shape; on mismatch, write an
 * error naming @p what (a tensor name) with the expected and found values.
 * @return MMOE_OK, MMOE_EDTYPE or MMOE_ESHAPE
 */
mmoe_status mmoe_tensor_expect(const mmoe_tensor *t, const char *what, mmoe_dtype dt,
                               int ndim, const int64_t *shape, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_TENSOR_H */
