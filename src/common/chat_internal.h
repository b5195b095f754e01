/**
 * @file chat_internal.h
 * @brief Helpers of the chat encoder shared between its files (Python-style JSON text).
 */
#ifndef MMOE_CHAT_INTERNAL_H
#define MMOE_CHAT_INTERNAL_H

#include <jansson.h>

#include "mmoe_error.h"
#include "mmoe_tokenizer.h"

/* Fixed strings of docs/spec/architecture.md (chat encoding), UTF-8 spelled out: ｜ is EF BD 9C, ▁ is E2 96 81. */
/** BOS `<｜begin▁of▁sentence｜>` */
#define BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
/** EOS `<｜end▁of▁sentence｜>` */
#define EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
/** `<｜User｜>` */
#define USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
/** `<｜Assistant｜>` */
#define ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"
/** `<｜latest_reminder｜>` */
#define REMINDER "<\xEF\xBD\x9Clatest_reminder\xEF\xBD\x9C>"
/** `<think>` */
#define THINK_OPEN "<think>"
/** `</think>` */
#define THINK_CLOSE "</think>"
/** the DSML marker `｜DSML｜` */
#define DSML "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"

/** Append @p v as Python's json.dumps(v, ensure_ascii=False) writes it. */
mmoe_status chat_json_dump(const json_t *v, mmoe_text *out);
/** Append a JSON string literal (quotes and Python's escapes). */
mmoe_status chat_json_string(const char *s, size_t len, mmoe_text *out);
/** Append a double as Python's repr() writes it (NaN, Infinity for non-finite). */
mmoe_status chat_json_float(double x, mmoe_text *out);

#endif /* MMOE_CHAT_INTERNAL_H */
