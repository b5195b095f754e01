/**
 * @file cmd_tokenize.c
 * @brief `megamoe tokenize`: encode text, decode ids, render a chat with the DeepSeek-V4 encoding.
 *
 *     megamoe tokenize --model DIR --text "Hello world"        -> 19923,2058
 *     megamoe tokenize --tokenizer tokenizer.json --ids 19923,2058 -> Hello world
 *     megamoe tokenize --model DIR --chat conv.json --thinking -> the prompt text, then its ids
 *     megamoe tokenize --parse completion.txt --thinking       -> the assistant message as JSON
 *     megamoe tokenize --tokenizer F --batch requests.jsonl    -> one JSON answer per line
 *
 * `--batch` reads JSON lines: `{"text": "..."}` is answered with `{"ids": [...]}`,
 * `{"ids": [...]}` with `{"text": "...", "stream": "..."}` (the second from the
 * streaming decoder).  The tokenizer loads once, so a cross-check can send thousands
 * of requests through one process (tests/xval/tokenizer_hf.py does).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_chat.h"
#include "mmoe_cli.h"
#include "mmoe_tokenizer.h"

/** Print the command's help. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe tokenize [--model DIR | --tokenizer FILE] ACTION [OPTIONS]\n"
            "\n"
            "Encode text to token ids, decode ids to text, or render a conversation with the\n"
            "DeepSeek-V4 chat encoding.  The tokenizer is DIR/tokenizer.json or FILE.\n"
            "\n"
            "actions (one of them is required):\n"
            "  --text TEXT        print the ids of TEXT, comma-separated\n"
            "  --text-file FILE   print the ids of the bytes of FILE\n"
            "  --ids 1,2,3        print the decoded text\n"
            "  --chat FILE.json   print the prompt of the conversation in FILE (OpenAI-style\n"
            "                     messages: an array, or {\"messages\": [...], \"tools\": [...]})\n"
            "                     and, with a tokenizer, its ids; without one, only the prompt\n"
            "  --parse FILE       parse a generated completion (text after the prompt, ending with\n"
            "                     EOS) into an assistant message, printed as JSON (--thinking: the\n"
            "                     completion starts with the reasoning)\n"
            "  --batch FILE       JSON lines: {\"text\": ...} -> {\"ids\": [...]},\n"
            "                     {\"ids\": [...]} -> {\"text\": ..., \"stream\": ...}  (FILE - is stdin)\n"
            "options:\n"
            "  --model DIR        the tokenizer is DIR/tokenizer.json (this or --tokenizer is required,\n"
            "                     except for --chat and --parse)\n"
            "  --tokenizer FILE   the tokenizer file (see --model)\n"
            "                     (default: --model's)\n"
            "  --thinking         chat: thinking mode (the prompt ends in <think>) (default: chat mode)\n"
            "  --keep-thinking    chat: keep the reasoning of earlier turns (default: dropped)\n"
            "  --effort max       chat: the maximum-reasoning-effort preamble (thinking mode) (default: none)\n"
            "  --skip-special     decode: leave out special tokens (BOS, EOS) (default: kept)\n"
            "  --verbose          encode: one line per token: id and its decoded text (default: ids only)\n"
            "  --help             this text\n\n"
            "example:\n"
            "  megamoe tokenize --model fixtures/tiny-dsv4 --text 'Hello world'\n");
}

/** Read a whole file (or stdin for "-") into a NUL-terminated buffer. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        if (n + 4096 + 1 > cap) {
            char *grown = realloc(buf, cap * 2);
            if (grown == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096)
            break;
    }
    if (buf != NULL && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    if (f != stdin)
        fclose(f);
    if (buf != NULL) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

/** Print ids comma-separated on one line. */
static void print_ids(const mmoe_token_ids *ids)
{
    for (size_t i = 0; i < ids->n; i++)
        printf(i ? ",%ld" : "%ld", (long)ids->ids[i]);
    printf("\n");
}

/** Parse "1,2,3" (spaces allowed as separators too) into ids, each with the strict option parser. */
static int parse_ids(const char *s, mmoe_token_ids *ids)
{
    char item[64];
    size_t k = 0;
    for (const char *p = s;; p++) {
        if (*p != '\0' && *p != ',' && *p != ' ') {
            if (k + 1 >= sizeof item) {
                fprintf(stderr, "megamoe tokenize: --ids: item %zu is too long\n", ids->n + 1);
                return 1;
            }
            item[k++] = *p;
            continue;
        }
        if (k > 0) {
            item[k] = '\0';
            int64_t v;
            mmoe_error err;
            mmoe_error_clear(&err);
            if (mmoe_cli_parse_i64(item, 0, INT32_MAX, &v, &err) != MMOE_OK) {
                fprintf(stderr, "megamoe tokenize: --ids: item %zu: %s\n", ids->n + 1, err.msg);
                return 1;
            }
            int32_t id = (int32_t)v;
            if (mmoe_token_ids_push(ids, &id, 1) != MMOE_OK) {
                fprintf(stderr, "megamoe tokenize: --ids: out of memory\n");
                return 1;
            }
            k = 0;
        }
        if (*p == '\0')
            return 0;
    }
}

/** `--text` / `--text-file`: encode and print the ids (and with --verbose one line per token). */
static int encode_and_print(const mmoe_tokenizer *tok, const char *text, size_t len, int verbose)
{
    mmoe_token_ids ids = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_tokenizer_encode(tok, text, len, 0, &ids, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe tokenize: %s\n", err.msg);
        mmoe_token_ids_free(&ids); /* a failed encode may leave a partial buffer */
        return 1;
    }
    print_ids(&ids);
    if (verbose) {
        for (size_t i = 0; i < ids.n; i++) {
            mmoe_text t = {0};
            mmoe_tokenizer_decode(tok, &ids.ids[i], 1, 0, &t, NULL);
            printf("%8ld  ", (long)ids.ids[i]);
            json_t *s = json_stringn(t.data ? t.data : "", t.len);
            char *quoted = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
            printf("%s\n", quoted ? quoted : "?");
            free(quoted);
            json_decref(s);
            mmoe_text_free(&t);
        }
    }
    mmoe_token_ids_free(&ids);
    return 0;
}

/** `--ids`: decode and print the text. */
static int decode_and_print(const mmoe_tokenizer *tok, const char *list, int skip_special)
{
    mmoe_token_ids ids = {0};
    mmoe_text text = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    int rc = parse_ids(list, &ids) ? MMOE_EXIT_USAGE : 0;
    if (rc == 0 && mmoe_tokenizer_decode(tok, ids.ids, ids.n, skip_special, &text, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe tokenize: %s\n", err.msg);
        rc = 1;
    }
    if (rc == 0) {
        fwrite(text.data, 1, text.len, stdout);
        printf("\n");
    }
    mmoe_token_ids_free(&ids);
    mmoe_text_free(&text);
    return rc;
}

/** `--parse`: parse a completion file and print the message JSON. */
static int parse_completion(const char *path, mmoe_chat_mode mode)
{
    size_t len;
    char *text = read_file(path, &len);
    if (text == NULL) {
        fprintf(stderr, "megamoe tokenize: --parse %s: cannot read the file: %s\n", path, strerror(errno));
        return 1;
    }
    mmoe_text msg = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    int rc = 0;
    if (mmoe_chat_parse_completion(text, len, mode, &msg, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe tokenize: %s: %s\n", path, err.msg);
        rc = 1;
    } else {
        printf("%s\n", msg.data);
    }
    mmoe_text_free(&msg);
    free(text);
    return rc;
}

/** `--chat`: render the conversation, print the prompt and (with a tokenizer) its ids. */
static int render_chat(const mmoe_tokenizer *tok, const char *path, const mmoe_chat_options *opt)
{
    size_t len;
    char *json = read_file(path, &len);
    if (json == NULL) {
        fprintf(stderr, "megamoe tokenize: --chat %s: cannot read the file: %s\n", path, strerror(errno));
        return 1;
    }
    mmoe_text prompt = {0};
    mmoe_error err;
    mmoe_error_clear(&err);
    int rc = 0;
    if (mmoe_chat_encode_json(json, len, opt, &prompt, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe tokenize: %s: %s\n", path, err.msg);
        rc = 1;
    } else {
        fwrite(prompt.data, 1, prompt.len, stdout);
        printf("\n");
        if (tok != NULL) {
            mmoe_token_ids ids = {0};
            if (mmoe_tokenizer_encode(tok, prompt.data, prompt.len, 0, &ids, &err) != MMOE_OK) {
                fprintf(stderr, "megamoe tokenize: %s\n", err.msg);
                rc = 1;
            } else {
                printf("-- %zu tokens --\n", ids.n);
                print_ids(&ids);
            }
            mmoe_token_ids_free(&ids);
        }
    }
    mmoe_text_free(&prompt);
    free(json);
    return rc;
}

/** Answer one batch request line; returns nonzero on a malformed request. */
static int batch_line(const mmoe_tokenizer *tok, const char *line, size_t len, size_t line_no)
{
    json_error_t jerr;
    json_t *req = json_loadb(line, len, JSON_ALLOW_NUL, &jerr), *answer = NULL;
    json_t *text = json_object_get(req, "text"), *idlist = json_object_get(req, "ids");
    mmoe_error err;
    mmoe_error_clear(&err);
    if (json_is_string(text)) {
        mmoe_token_ids ids = {0};
        if (mmoe_tokenizer_encode(tok, json_string_value(text), json_string_length(text), 0, &ids, &err) == MMOE_OK) {
            json_t *arr = json_array();
            for (size_t i = 0; i < ids.n; i++)
                json_array_append_new(arr, json_integer(ids.ids[i]));
            answer = json_pack("{s:o}", "ids", arr);
        }
        mmoe_token_ids_free(&ids);
    } else if (json_is_array(idlist)) {
        mmoe_token_ids ids = {0};
        mmoe_status st = MMOE_OK;
        for (size_t i = 0; st == MMOE_OK && i < json_array_size(idlist); i++) {
            const json_t *v = json_array_get(idlist, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                st = mmoe_error_set(&err, MMOE_EINVAL, "line %zu: ids[%zu]: expected a non-negative integer", line_no, i);
                break;
            }
            int32_t id = (int32_t)json_integer_value(v);
            mmoe_token_ids_push(&ids, &id, 1);
        }
        mmoe_text full = {0}, streamed = {0};
        mmoe_decode_stream ds;
        mmoe_decode_stream_init(&ds, tok, 0);
        if (st == MMOE_OK)
            st = mmoe_tokenizer_decode(tok, ids.ids, ids.n, 0, &full, &err);
        for (size_t i = 0; st == MMOE_OK && i < ids.n; i++)
            st = mmoe_decode_stream_push(&ds, ids.ids[i], &streamed, &err);
        if (st == MMOE_OK)
            st = mmoe_decode_stream_finish(&ds, &streamed, &err);
        if (st == MMOE_OK)
            answer = json_pack("{s:s%, s:s%}", "text", full.data ? full.data : "", full.len, "stream",
                               streamed.data ? streamed.data : "", streamed.len);
        mmoe_text_free(&full);
        mmoe_text_free(&streamed);
        mmoe_token_ids_free(&ids);
    } else {
        snprintf(err.msg, sizeof err.msg, "line %zu: expected {\"text\": STRING} or {\"ids\": [INT, ...]}%s%s", line_no,
                 req == NULL ? ": " : "", req == NULL ? jerr.text : "");
    }
    if (answer == NULL)
        answer = json_pack("{s:s}", "error", err.msg);
    char *out = json_dumps(answer, JSON_COMPACT | JSON_ENSURE_ASCII);
    printf("%s\n", out ? out : "{\"error\": \"out of memory\"}");
    free(out);
    json_decref(answer);
    json_decref(req);
    return 0;
}

/** `--batch`: answer every JSON line of the file. */
static int run_batch(const mmoe_tokenizer *tok, const char *path)
{
    size_t len;
    char *data = read_file(path, &len);
    if (data == NULL) {
        fprintf(stderr, "megamoe tokenize: --batch %s: cannot read the file: %s\n", path, strerror(errno));
        return 1;
    }
    size_t start = 0, line_no = 1;
    while (start < len) {
        char *nl = memchr(data + start, '\n', len - start);
        size_t end = nl ? (size_t)(nl - data) : len;
        if (end > start)
            batch_line(tok, data + start, end - start, line_no);
        start = end + 1;
        line_no++;
    }
    fflush(stdout);
    free(data);
    return 0;
}

int mmoe_cmd_tokenize(int argc, char **argv)
{
    enum { OPT_TEXT_FILE = 256, OPT_THINKING, OPT_KEEP, OPT_EFFORT, OPT_SKIP, OPT_BATCH, OPT_VERBOSE, OPT_PARSE };
    static const struct option options[] = {
        {"model", required_argument, NULL, 'm'},      {"tokenizer", required_argument, NULL, 't'},
        {"text", required_argument, NULL, 'x'},       {"text-file", required_argument, NULL, OPT_TEXT_FILE},
        {"ids", required_argument, NULL, 'i'},        {"chat", required_argument, NULL, 'c'},
        {"batch", required_argument, NULL, OPT_BATCH}, {"parse", required_argument, NULL, OPT_PARSE}, {"thinking", no_argument, NULL, OPT_THINKING},
        {"keep-thinking", no_argument, NULL, OPT_KEEP}, {"effort", required_argument, NULL, OPT_EFFORT},
        {"skip-special", no_argument, NULL, OPT_SKIP}, {"verbose", no_argument, NULL, OPT_VERBOSE},
        {"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *tok_file = NULL, *text = NULL, *text_file = NULL, *ids = NULL, *chat = NULL;
    const char *batch = NULL, *parse = NULL;
    int skip_special = 0, verbose = 0, c;
    mmoe_chat_options opt;
    mmoe_chat_options_default(&opt);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tok_file = optarg; break;
        case 'x': text = optarg; break;
        case OPT_TEXT_FILE: text_file = optarg; break;
        case 'i': ids = optarg; break;
        case 'c': chat = optarg; break;
        case OPT_BATCH: batch = optarg; break;
        case OPT_PARSE: parse = optarg; break;
        case OPT_THINKING: opt.mode = MMOE_CHAT_MODE_THINKING; break;
        case OPT_KEEP: opt.drop_thinking = 0; break;
        case OPT_SKIP: skip_special = 1; break;
        case OPT_VERBOSE: verbose = 1; break;
        case OPT_EFFORT:
            if (strcmp(optarg, "max") == 0)
                opt.effort = MMOE_CHAT_EFFORT_MAX;
            else if (strcmp(optarg, "high") == 0)
                opt.effort = MMOE_CHAT_EFFORT_HIGH;
            else if (strcmp(optarg, "none") == 0)
                opt.effort = MMOE_CHAT_EFFORT_NONE;
            else {
                fprintf(stderr, "megamoe tokenize: --effort: expected none, high or max, found '%s'\n", optarg);
                return MMOE_EXIT_USAGE;
            }
            break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "megamoe tokenize: unknown option or missing argument: '%s'\n", argv[optind - 1]);
            usage(stderr);
            return MMOE_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "megamoe tokenize: unexpected argument '%s'\n", argv[optind]);
        return MMOE_EXIT_USAGE;
    }
    int n_actions = (text != NULL) + (text_file != NULL) + (ids != NULL) + (chat != NULL) + (batch != NULL) +
                    (parse != NULL);
    if (n_actions != 1) {
        fprintf(stderr,
                "megamoe tokenize: give exactly one of --text, --text-file, --ids, --chat, --parse, --batch (%d given)\n",
                n_actions);
        return MMOE_EXIT_USAGE;
    }
    if (model != NULL && tok_file != NULL) {
        fprintf(stderr, "megamoe tokenize: give --model or --tokenizer, not both\n");
        return MMOE_EXIT_USAGE;
    }
    if (model == NULL && tok_file == NULL && chat == NULL && parse == NULL) {
        fprintf(stderr, "megamoe tokenize: a tokenizer is needed: --model DIR or --tokenizer FILE\n");
        return MMOE_EXIT_USAGE;
    }
    mmoe_tokenizer *tok = NULL;
    mmoe_error err;
    mmoe_error_clear(&err);
    if (model != NULL || tok_file != NULL) {
        mmoe_status st = model ? mmoe_tokenizer_load_dir(model, &tok, &err) : mmoe_tokenizer_load(tok_file, &tok, &err);
        if (st != MMOE_OK) {
            fprintf(stderr, "megamoe tokenize: %s\n", err.msg);
            return 1;
        }
    }
    int rc;
    if (text != NULL) {
        rc = encode_and_print(tok, text, strlen(text), verbose);
    } else if (text_file != NULL) {
        size_t len;
        char *data = read_file(text_file, &len);
        if (data == NULL) {
            fprintf(stderr, "megamoe tokenize: --text-file %s: cannot read the file: %s\n", text_file, strerror(errno));
            rc = 1;
        } else {
            rc = encode_and_print(tok, data, len, verbose);
            free(data);
        }
    } else if (ids != NULL) {
        rc = decode_and_print(tok, ids, skip_special);
    } else if (chat != NULL) {
        rc = render_chat(tok, chat, &opt);
    } else if (parse != NULL) {
        rc = parse_completion(parse, opt.mode);
    } else {
        rc = run_batch(tok, batch);
    }
    mmoe_tokenizer_free(tok);
    return rc;
}
