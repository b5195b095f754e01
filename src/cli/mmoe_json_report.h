/**
 * @file mmoe_json_report.h
 * @brief `--json` reports: one compact JSON object per line, numbers with their unit in the key.
 *
 * Every command that prints a report (`inspect`, `bench moe`, `bench forward`, the stats of
 * `generate`, `perplexity`) can print it as JSON Lines instead: each line one object,
 * written whole with a single fwrite and flushed, so a reader can parse line by line while
 * the command runs.  Keys carry their units (`median_ms`, `prefill_s`, `weight_bytes`,
 * `tflops`); a number that is not finite (an empty interval's rate) is written as `null`,
 * since JSON has no NaN or infinity.
 */
#ifndef MMOE_JSON_REPORT_H
#define MMOE_JSON_REPORT_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "mmoe_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Set @p key of @p obj to the number @p v, or to null when @p v is NaN or infinite. */
void mmoe_json_set_real(json_t *obj, const char *key, double v);

/** Set @p key of @p obj to the integer @p v. */
void mmoe_json_set_int(json_t *obj, const char *key, int64_t v);

/** Set @p key of @p obj to the string @p s (null when @p s is NULL or not valid UTF-8). */
void mmoe_json_set_str(json_t *obj, const char *key, const char *s);

/**
 * The keys of a `bench forward` report that describe the model: "model" (@p model_dir),
 * "layers", "mtp_layers" and "load_s" (seconds the checkpoint took to open).
 */
void mmoe_json_bench_forward_model(json_t *obj, const char *model_dir, int n_layers, int n_mtp_layers, double load_s);

/** A `bench forward` report's prefill keys: "prefill_tokens", "prefill_s", "prefill_tokens_per_s". */
void mmoe_json_bench_forward_prefill(json_t *obj, int64_t tokens, double seconds);

/**
 * A `bench forward` report's decode keys: "decode_tokens", "decode_s", "decode_ms_per_token"
 * (null when no token was decoded).
 */
void mmoe_json_bench_forward_decode(json_t *obj, int64_t tokens, double seconds);

/**
 * Write @p obj as one compact line to @p out and flush; takes the reference (@p obj is
 * released).  A NULL @p obj (a failed allocation upstream) is an error.
 * @return MMOE_OK, MMOE_ENOMEM (serialization failed) or MMOE_EIO (the write failed)
 */
mmoe_status mmoe_json_print_line(FILE *out, json_t *obj, mmoe_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MMOE_JSON_REPORT_H */
