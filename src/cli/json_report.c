/**
 * @file json_report.c
 * @brief JSON Lines output of the reports (see mmoe_json_report.h).
 *
 * jansson builds the objects (so strings are escaped correctly) and serializes each one
 * compactly; the line is written with one fwrite so that lines of a report never interleave
 * with other output of the same stream.  Reals use jansson's shortest round-trip format
 * (17 significant digits at most), so a reader gets the value the command computed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_json_report.h"

void mmoe_json_set_real(json_t *obj, const char *key, double v)
{
    json_object_set_new(obj, key, isfinite(v) ? json_real(v) : json_null());
}

void mmoe_json_set_int(json_t *obj, const char *key, int64_t v)
{
    json_object_set_new(obj, key, json_integer((json_int_t)v));
}

void mmoe_json_set_str(json_t *obj, const char *key, const char *s)
{
    json_t *v = s != NULL ? json_string(s) : NULL;
    json_object_set_new(obj, key, v != NULL ? v : json_null());
}

void mmoe_json_bench_forward_model(json_t *obj, const char *model_dir, int n_layers, int n_mtp_layers, double load_s)
{
    mmoe_json_set_str(obj, "model", model_dir);
    mmoe_json_set_int(obj, "layers", n_layers);
    mmoe_json_set_int(obj, "mtp_layers", n_mtp_layers);
    mmoe_json_set_real(obj, "load_s", load_s);
}

void mmoe_json_bench_forward_prefill(json_t *obj, int64_t tokens, double seconds)
{
    mmoe_json_set_int(obj, "prefill_tokens", tokens);
    mmoe_json_set_real(obj, "prefill_s", seconds);
    mmoe_json_set_real(obj, "prefill_tokens_per_s", (double)tokens / seconds);
}

void mmoe_json_bench_forward_decode(json_t *obj, int64_t tokens, double seconds)
{
    mmoe_json_set_int(obj, "decode_tokens", tokens);
    mmoe_json_set_real(obj, "decode_s", seconds);
    mmoe_json_set_real(obj, "decode_ms_per_token", tokens > 0 ? 1e3 * seconds / (double)tokens : NAN);
}

mmoe_status mmoe_json_print_line(FILE *out, json_t *obj, mmoe_error *err)
{
    if (obj == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "json report: out of memory");
    char *line = json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(obj);
    if (line == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "json report: cannot serialize (out of memory)");
    size_t len = strlen(line);
    line[len] = '\n'; /* the NUL becomes the newline: written by length, never read as a C string again */
    size_t wrote = fwrite(line, 1, len + 1, out);
    free(line);
    if (wrote != len + 1 || fflush(out) != 0)
        return mmoe_error_set(err, MMOE_EIO, "json report: write failed");
    return MMOE_OK;
}
