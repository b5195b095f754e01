/**
 * @file mmoe_tensor.c
 * @brief Dtype tables and shape checks for ::mmoe_tensor views.
 *
 * The dtype table is the single place that knows element sizes and the
 * safetensors spelling of each type.
 */
#include "mmoe_tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/** Name and element size of every ::mmoe_dtype, indexed by the enum value. */
static const struct {
    const char *name; /**< safetensors spelling */
    size_t size;      /**< bytes per element */
} dtype_table[MMOE_DT_COUNT] = {
    [MMOE_DT_BF16] = {"BF16", 2},    [MMOE_DT_F16] = {"F16", 2},
    [MMOE_DT_F32] = {"F32", 4},      [MMOE_DT_F64] = {"F64", 8},
    [MMOE_DT_I8] = {"I8", 1},        [MMOE_DT_U8] = {"U8", 1},
    [MMOE_DT_I16] = {"I16", 2},      [MMOE_DT_I32] = {"I32", 4},
    [MMOE_DT_I64] = {"I64", 8},      [MMOE_DT_F8_E4M3] = {"F8_E4M3", 1},
    [MMOE_DT_F8_E5M2] = {"F8_E5M2", 1}, [MMOE_DT_F8_E8M0] = {"F8_E8M0", 1},
    [MMOE_DT_BOOL] = {"BOOL", 1},    [MMOE_DT_U16] = {"U16", 2},
    [MMOE_DT_U32] = {"U32", 4},      [MMOE_DT_U64] = {"U64", 8},
};

size_t mmoe_dtype_size(mmoe_dtype dt)
{
    if ((unsigned)dt >= MMOE_DT_COUNT)
        return 0;
    return dtype_table[dt].size;
}

const char *mmoe_dtype_name(mmoe_dtype dt)
{
    if ((unsigned)dt >= MMOE_DT_COUNT)
        return "?";
    return dtype_table[dt].name;
}

mmoe_status mmoe_dtype_from_name(const char *name, mmoe_dtype *out)
{
    for (int i = 0; i < MMOE_DT_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (mmoe_dtype)i;
            return MMOE_OK;
        }
    }
    return MMOE_EFORMAT;
}

mmoe_tensor mmoe_tensor_view2(mmoe_dtype dt, int64_t rows, int64_t cols, void *data)
{
    mmoe_tensor t = {dt, 2, {rows, cols}, data, (size_t)(rows * cols) * mmoe_dtype_size(dt)};
    return t;
}

int64_t mmoe_tensor_numel(const mmoe_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

char *mmoe_shape_str(int ndim, const int64_t *shape, char *buf, size_t buflen)
{
    size_t used = 0;
    if (buflen == 0)
        return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, buflen, "[");
    for (int i = 0; i < ndim && used < buflen; i++)
        used += (size_t)snprintf(buf + used, buflen - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (used < buflen)
        snprintf(buf + used, buflen - used, "]");
    return buf;
}

mmoe_status mmoe_tensor_expect(const mmoe_tensor *t, const char *what, mmoe_dtype dt,
                               int ndim, const int64_t *shape, mmoe_error *err)
{
    if (t->dtype != dt)
        return mmoe_error_set(err, MMOE_EDTYPE, "tensor '%s': expected dtype %s, found %s", what,
                              mmoe_dtype_name(dt), mmoe_dtype_name(t->dtype));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char want[128], found[128];
        return mmoe_error_set(err, MMOE_ESHAPE, "tensor '%s': expected shape %s, found %s", what,
                              mmoe_shape_str(ndim, shape, want, sizeof want),
                              mmoe_shape_str(t->ndim, t->shape, found, sizeof found));
    }
    return MMOE_OK;
}
