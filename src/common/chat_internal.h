/**
 * @file chat_internal.h
 * @brief Helpers of the chat encoder shared between its files (Python-style JSON text).
 */
#ifndef MMOE_CHAT_INTERNAL_H
#define MMOE_CHAT_INTERNAL_H

#include <jansson.h>

#include "mmoe_error.h"
#include "mmoe_tokenizer.h"

/** Append @p v as Python's json.dumps(v, ensure_ascii=False) writes it. */
mmoe_status chat_json_dump(const json_t *v, mmoe_text *out);
/** Append a JSON string literal (quotes and Python's escapes). */
mmoe_status chat_json_string(const char *s, size_t len, mmoe_text *out);
/** Append a double as Python's repr() writes it (NaN, Infinity for non-finite). */
mmoe_status chat_json_float(double x, mmoe_text *out);

#endif /* MMOE_CHAT_INTERNAL_H */
