/**
 * @file chat_json.c
 * @brief JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it.
 *
 * The DeepSeek-V4 chat encoder puts JSON into the prompt (tool schemas, the
 * response format, non-string tool-call arguments), and the model was trained on
 * Python's rendering of it, so these bytes must match Python's, not jansson's:
 *
 * - separators `", "` and `": "`, no newlines, keys in input order;
 * - strings: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other code points below U+0020 as
 *   `\u00xx` with *lowercase* hex; everything else (non-ASCII, `/`, DEL) raw UTF-8;
 * - integers in decimal; floats as Python's `repr`: the shortest digit string that
 *   reads back to the same double, in positional notation when the decimal exponent
 *   is in [-4, 16), else as `1e-06` / `1.5e+20` (at least two exponent digits);
 *   integral floats keep `.0`; non-finite values are `NaN`, `Infinity`, `-Infinity`.
 *
 * The shortest digits come from printing with increasing precision (`%.{p}e`, p = 1..17)
 * until strtod reads the same double back; glibc rounds correctly, so the first
 * precision that round-trips gives the digits Python's repr uses.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_internal.h"

/** Append a NUL-terminated string. */
static mmoe_status put(mmoe_text *out, const char *s)
{
    return mmoe_text_append(out, s, strlen(s));
}

mmoe_status chat_json_string(const char *s, size_t len, mmoe_text *out)
{
    static const char hex[] = "0123456789abcdef";
    mmoe_status st = put(out, "\"");
    size_t run = 0;
    for (size_t i = 0; st == MMOE_OK && i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20u) {
                u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
                u[4] = hex[c >> 4]; u[5] = hex[c & 15u]; u[6] = '\0';
                esc = u;
            }
        }
        if (esc == NULL)
            continue;
        st = mmoe_text_append(out, s + run, i - run);
        if (st == MMOE_OK)
            st = put(out, esc);
        run = i + 1;
    }
    if (st == MMOE_OK)
        st = mmoe_text_append(out, s + run, len - run);
    return st == MMOE_OK ? put(out, "\"") : st;
}

mmoe_status chat_json_float(double x, mmoe_text *out)
{
    if (isnan(x))
        return put(out, "NaN");
    if (isinf(x))
        return put(out, x > 0 ? "Infinity" : "-Infinity");
    char buf[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    /* buf = [-]d[.ddd]e±XX: collect the digits and the decimal exponent */
    char digits[32];
    size_t nd = 0;
    const char *p = buf;
    int negative = (*p == '-');
    if (negative)
        p++;
    for (; *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') /* shortest form has no trailing zeros */
        nd--;
    digits[nd] = '\0';
    char res[96];
    size_t r = 0;
    if (negative)
        res[r++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            res[r++] = '0';
            res[r++] = '.';
            for (int k = 0; k < -exp10 - 1; k++)
                res[r++] = '0';
            for (size_t k = 0; k < nd; k++)
                res[r++] = digits[k];
        } else {
            size_t int_digits = (size_t)exp10 + 1;
            for (size_t k = 0; k < int_digits; k++)
                res[r++] = k < nd ? digits[k] : '0';
            res[r++] = '.';
            if (nd > int_digits)
                for (size_t k = int_digits; k < nd; k++)
                    res[r++] = digits[k];
            else
                res[r++] = '0';
        }
        res[r] = '\0';
    } else {
        res[r++] = digits[0];
        if (nd > 1) {
            res[r++] = '.';
            for (size_t k = 1; k < nd; k++)
                res[r++] = digits[k];
        }
        snprintf(res + r, sizeof res - r, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    return put(out, res);
}

mmoe_status chat_json_dump(const json_t *v, mmoe_text *out)
{
    mmoe_status st = MMOE_OK;
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        int first = 1;
        st = put(out, "{");
        json_object_foreach((json_t *)v, key, val) {
            if (st == MMOE_OK && !first)
                st = put(out, ", ");
            first = 0;
            if (st == MMOE_OK)
                st = chat_json_string(key, strlen(key), out);
            if (st == MMOE_OK)
                st = put(out, ": ");
            if (st == MMOE_OK)
                st = chat_json_dump(val, out);
        }
        return st == MMOE_OK ? put(out, "}") : st;
    }
    case JSON_ARRAY:
        st = put(out, "[");
        for (size_t i = 0; st == MMOE_OK && i < json_array_size(v); i++) {
            if (i > 0)
                st = put(out, ", ");
            if (st == MMOE_OK)
                st = chat_json_dump(json_array_get(v, i), out);
        }
        return st == MMOE_OK ? put(out, "]") : st;
    case JSON_STRING:
        return chat_json_string(json_string_value(v), json_string_length(v), out);
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return put(out, num);
    case JSON_REAL:
        return chat_json_float(json_real_value(v), out);
    case JSON_TRUE:
        return put(out, "true");
    case JSON_FALSE:
        return put(out, "false");
    case JSON_NULL:
        return put(out, "null");
    }
    return MMOE_EINTERNAL;
}
