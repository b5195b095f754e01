/**
 * @file mmoe_error.h
 * @brief Status codes and error messages: how every megamoe function reports failure.
 *
 * megamoe has no global error state.  A function that can fail returns an
 * ::mmoe_status and, when the caller passes a non-NULL ::mmoe_error, writes a
 * one-line message into it that says *where* (file, tensor or key), *what was
 * expected* and *what was found*, for example
 *
 *     safetensors: model.safetensors: tensor 'ffn.gate.weight': expected dtype BF16, found F32
 *
 * The first error wins: a function that fails keeps the most specific message
 * written by the callee and may prefix context with mmoe_error_prefix().
 * Messages are truncated to fit ::MMOE_ERROR_MSG_LEN bytes, never overflowed.
 */
#ifndef MMOE_ERROR_H
#define MMOE_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Status codes.  0 is success; every other value is a failure class. */
typedef enum mmoe_status {
    MMOE_OK = 0,          /**< success */
    MMOE_EINVAL = 1,      /**< invalid argument (a caller bug or bad option) */
    MMOE_EIO = 2,         /**< a file could not be opened, read, mapped or written */
    MMOE_EFORMAT = 3,     /**< malformed input data (header, JSON, offsets, UTF-8) */
    MMOE_ESHAPE = 4,      /**< a tensor has the wrong shape */
    MMOE_EDTYPE = 5,      /**< a tensor has the wrong dtype */
    MMOE_ENOTFOUND = 6,   /**< a tensor, key or file is missing */
    MMOE_ENOMEM = 7,      /**< allocation failed */
    MMOE_EUNSUPPORTED = 8,/**< valid but not supported by this build or layout */
    MMOE_ENODEV = 9,      /**< no GPU (or no CUDA in this build) */
    MMOE_ERANGE = 10,     /**< a value is out of its allowed range (scale byte 255, config key) */
    MMOE_EINTERNAL = 11   /**< an internal invariant failed (a megamoe bug) */
} mmoe_status;

/** Size of the message buffer in ::mmoe_error, including the NUL. */
#define MMOE_ERROR_MSG_LEN 1024

/** An error report: the status and a human-readable message. */
typedef struct mmoe_error {
    mmoe_status code;              /**< the status of the failure (MMOE_OK if none) */
    char msg[MMOE_ERROR_MSG_LEN];  /**< NUL-terminated message; empty if none */
} mmoe_error;

/** Reset @p err to "no error".  NULL is allowed. */
void mmoe_error_clear(mmoe_error *err);

/**
 * Record an error and return its code, so that a caller can write
 * `return mmoe_error_set(err, MMOE_ESHAPE, "tensor '%s': expected ...", name);`.
 * @param err   where to write; NULL only returns @p code
 * @param code  the status (should not be MMOE_OK)
 * @param fmt   printf-style format of the message
 * @return @p code
 */
mmoe_status mmoe_error_set(mmoe_error *err, mmoe_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/**
 * Prepend context ("loading layer 3: ") to an existing message, keeping its code.
 * @return err->code (or MMOE_EINTERNAL if @p err is NULL)
 */
mmoe_status mmoe_error_prefix(mmoe_error *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/** The symbolic name of a status code ("MMOE_ESHAPE"); never NULL. */
const char *mmoe_status_name(mmoe_status code);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_ERROR_H */
