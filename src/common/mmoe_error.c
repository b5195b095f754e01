/**
 * @file mmoe_error.c
 * @brief Error reporting: formatting bounded messages into ::mmoe_error.
 *
 * Every message is formatted with vsnprintf into a fixed buffer, so a long tensor
 * name can truncate a message but never overflow it.  mmoe_error_prefix() builds
 * the new text in a scratch buffer first, then copies it back.
 */
#include "mmoe_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void mmoe_error_clear(mmoe_error *err)
{
    if (err == NULL)
        return;
    err->code = MMOE_OK;
    err->msg[0] = '\0';
}

mmoe_status mmoe_error_set(mmoe_error *err, mmoe_status code, const char *fmt, ...)
{
    if (err == NULL)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

mmoe_status mmoe_error_prefix(mmoe_error *err, const char *fmt, ...)
{
    if (err == NULL)
        return MMOE_EINTERNAL;
    char prefix[MMOE_ERROR_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Join by hand with explicit bounds: prefix first, then as much of the old message as fits. */
    char joined[MMOE_ERROR_MSG_LEN];
    size_t plen = strnlen(prefix, sizeof joined - 1);
    size_t mlen = strnlen(err->msg, sizeof err->msg);
    if (mlen > sizeof joined - 1 - plen)
        mlen = sizeof joined - 1 - plen;
    memcpy(joined, prefix, plen);
    memcpy(joined + plen, err->msg, mlen);
    joined[plen + mlen] = '\0';
    memcpy(err->msg, joined, sizeof err->msg);
    return err->code;
}

const char *mmoe_status_name(mmoe_status code)
{
    switch (code) {
    case MMOE_OK: return "MMOE_OK";
    case MMOE_EINVAL: return "MMOE_EINVAL";
    case MMOE_EIO: return "MMOE_EIO";
    case MMOE_EFORMAT: return "MMOE_EFORMAT";
    case MMOE_ESHAPE: return "MMOE_ESHAPE";
    case MMOE_EDTYPE: return "MMOE_EDTYPE";
    case MMOE_ENOTFOUND: return "MMOE_ENOTFOUND";
    case MMOE_ENOMEM: return "MMOE_ENOMEM";
    case MMOE_EUNSUPPORTED: return "MMOE_EUNSUPPORTED";
    case MMOE_ENODEV: return "MMOE_ENODEV";
    case MMOE_ERANGE: return "MMOE_ERANGE";
    case MMOE_EINTERNAL: return "MMOE_EINTERNAL";
    }
    return "MMOE_E(unknown)";
}
