/**
 * @file cmd_generate.c
 * @brief `megamoe generate`: text generation on the CPU forward, one prompt or an interactive chat.
 *
 *     megamoe generate --model DIR [--prompt TEXT | --chat] [--max-tokens N] [--temperature T]
 *                      [--top-p P] [--seed S] [--threads N] [--quiet] [--thinking] ...
 *
 * ## What it does
 *
 *  1. Opens the tokenizer (`DIR/tokenizer.json`) first, so that a missing tokenizer fails
 *     before the (slow) model load; then the checkpoint, with a progress line per layer.
 *  2. Turns the input into token ids (below), prefills them with a progress line for long
 *     prompts, then decodes: each token is printed as soon as it is sampled, through the
 *     streaming UTF-8 decoder (a character split over two tokens is printed once complete).
 *  3. Stops at the model's EOS (config.json `eos_token_id`), after --max-tokens tokens, or
 *     when the context is full, and prints one stats line on stderr: prompt tokens and
 *     generated tokens with their tokens/s and ms/token (--quiet suppresses it and the
 *     progress lines).
 *
 * ## Prompt formats (the defaults follow llama.cpp's completion tool)
 *
 *  - `--prompt TEXT` alone is a **raw completion**: BOS (config `bos_token_id`) followed by
 *    the text's tokens, exactly what a base model continues (`--no-bos` drops the BOS, as
 *    llama.cpp does when the vocabulary says not to add one).  `--raw` names this default.
 *  - `--prompt TEXT --chat-format` wraps the text as one user message with the DeepSeek-V4
 *    chat encoding (mmoe_chat.h): `BOS [system] <｜User｜>TEXT<｜Assistant｜></think>`, or
 *    `...<think>` with --thinking.  --system adds a system message.
 *  - `--chat` is the interactive chat: each line read on stdin is one user turn (prompt
 *    `> ` on stdout), the answer streams, Ctrl-D (end of input) ends.  The conversation
 *    stays in the KV cache: a turn prefills only its own tokens (the EOS that closes the
 *    previous answer, then `<｜User｜>TEXT<｜Assistant｜></think>`), never the history, and
 *    its stats line says how many tokens were prefilled and how many were reused.
 *
 * ## Sampling and threads
 *
 * Temperature 0 (the default) is greedy and deterministic: the same command prints the
 * same tokens.  With --temperature > 0 (and --top-p) the sampler of mmoe_sampler.h draws
 * with a seeded generator: --seed S replays a generation (the default seed is 1, printed).
 * --threads N sets OpenBLAS's thread count (openblas_set_num_threads); without it
 * OpenBLAS decides (OPENBLAS_NUM_THREADS, else one thread per core).  The forward's own
 * code is single-threaded: only the GEMMs inside OpenBLAS use the threads.
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat_internal.h" /* the marker strings of the chat encoding */
#include "mmoe_chat.h"
#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_fwd_backend.h"
#include "mmoe_generate.h"
#include "mmoe_model.h"
#include "mmoe_tokenizer.h"

/** Default context size (tokens) when the config allows more: keeps the KV caches small. */
#define GEN_DEFAULT_CTX 4096

/** The command line, parsed. */
typedef struct gen_options {
    const char *model_dir;   /**< --model */
    const char *prompt;      /**< --prompt (NULL with --chat) */
    const char *system;      /**< --system (chat formats only) */
    int chat;                /**< --chat: interactive */
    int chat_format;         /**< --chat-format: wrap --prompt as a user message */
    int raw;                 /**< --raw given */
    int no_bos;              /**< --no-bos */
    int thinking;            /**< --thinking */
    int quiet;               /**< --quiet */
    int print_ids;           /**< --print-ids: print token ids instead of text */
    long long max_tokens;    /**< --max-tokens */
    float temperature;       /**< --temperature */
    float top_p;             /**< --top-p */
    unsigned long long seed; /**< --seed */
    int threads;             /**< --threads (0: OpenBLAS's default) */
    long long ctx_size;      /**< --ctx-size (0: min(config max_seq_len, GEN_DEFAULT_CTX)) */
    mmoe_backend backend;    /**< --backend (default cpu) */
} gen_options;

/** Everything a run holds: owned resources are released by gen_cleanup(). */
typedef struct gen_run {
    const gen_options *opt;    /**< the command line (borrowed) */
    mmoe_tokenizer *tok;       /**< DIR/tokenizer.json (owned) */
    mmoe_model *model;         /**< the checkpoint (owned) */
    mmoe_model_state *state;   /**< the sequence's KV caches (owned) */
    mmoe_gpu_model *gpu;       /**< the model on the GPU with --backend gpu/auto (owned), else NULL */
    mmoe_gen_session session;  /**< the generation loop (owned) */
    int have_session;          /**< session is initialised (to free) */
    mmoe_decode_stream stream; /**< streaming UTF-8 decoder of the current turn */
    mmoe_text out_text;        /**< scratch: text of the current token */
    mmoe_text answer;          /**< the whole answer of the current turn (chat history) */
    int stderr_tty;            /**< stderr is a terminal: progress lines rewrite themselves */
    mmoe_status out_status;    /**< a decode error inside the token callback */
    mmoe_error out_err;        /**< its message */
} gen_run;

/** Print the command's help to @p out. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe generate --model DIR [--prompt TEXT | --chat] [OPTIONS]\n"
            "  Generate text with a DeepSeek-V4 checkpoint on the CPU (DIR holds config.json,\n"
            "  the safetensors shards and tokenizer.json).\n"
            "  --prompt TEXT       complete TEXT (raw: BOS + the text's tokens)\n"
            "  --chat              interactive chat: one user turn per stdin line, Ctrl-D ends;\n"
            "                      the KV cache is kept between turns\n"
            "  --raw               --prompt is raw text (the default)\n"
            "  --chat-format       --prompt is one user message in the DeepSeek-V4 chat encoding\n"
            "  --system TEXT       a system message (chat encodings)\n"
            "  --thinking          thinking mode: the assistant turn opens with <think>\n"
            "  --no-bos            do not start a raw prompt with BOS\n"
            "  --max-tokens N      most tokens to generate per turn (default 256)\n"
            "  --temperature T     0 = greedy, deterministic (default 0)\n"
            "  --top-p P           nucleus sampling mass in (0, 1] (default 1)\n"
            "  --seed S            sampler seed (default 1)\n"
            "  --threads N         OpenBLAS threads (default: OpenBLAS's own choice)\n"
            "  --ctx-size N        KV cache size in tokens (default: min(config max_seq_len, %d))\n"
            "  --print-ids         print generated token ids instead of text\n"
            "  --backend B         cpu (the oracle, default), gpu (refused without a usable GPU), or auto\n"
            "                      (the GPU when there is one and the model fits, else the CPU; says which)\n"
            "  --quiet             no progress or stats lines\n",
            GEN_DEFAULT_CTX);
}

/** Parse a decimal integer in [lo, hi]; -1 when @p s is not one. */
static int parse_ll(const char *s, long long lo, long long hi, long long *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (!s[0] || *end || errno || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

/** Parse a finite float in [lo, hi]; -1 when @p s is not one. */
static int parse_float(const char *s, float lo, float hi, float *v)
{
    char *end;
    errno = 0;
    float x = strtof(s, &end);
    if (!s[0] || *end || errno || !isfinite(x) || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

/** Report a bad option value; returns the usage exit status. */
static int bad_value(const char *name, const char *value, const char *expected)
{
    fprintf(stderr, "megamoe generate: --%s '%s': expected %s\n", name, value, expected);
    return MMOE_EXIT_USAGE;
}

/** Parse argv into @p o. Returns 0, MMOE_EXIT_USAGE on a usage error, or -1 after --help. */
static int parse_options(int argc, char **argv, gen_options *o)
{
    enum { O_MODEL = 256, O_PROMPT, O_CHAT, O_RAW, O_CHATFMT, O_SYSTEM, O_THINK, O_NOBOS, O_MAX, O_TEMP,
           O_TOPP, O_SEED, O_THREADS, O_CTX, O_IDS, O_QUIET, O_BACKEND };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},  {"prompt", required_argument, 0, O_PROMPT},
        {"chat", no_argument, 0, O_CHAT},          {"raw", no_argument, 0, O_RAW},
        {"chat-format", no_argument, 0, O_CHATFMT}, {"system", required_argument, 0, O_SYSTEM},
        {"thinking", no_argument, 0, O_THINK},     {"no-bos", no_argument, 0, O_NOBOS},
        {"max-tokens", required_argument, 0, O_MAX}, {"temperature", required_argument, 0, O_TEMP},
        {"top-p", required_argument, 0, O_TOPP},   {"seed", required_argument, 0, O_SEED},
        {"threads", required_argument, 0, O_THREADS}, {"ctx-size", required_argument, 0, O_CTX},
        {"print-ids", no_argument, 0, O_IDS},      {"quiet", no_argument, 0, O_QUIET},
        {"backend", required_argument, 0, O_BACKEND},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->top_p = 1.0f;
    o->seed = 1;
    long long v;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model_dir = optarg; break;
        case O_PROMPT: o->prompt = optarg; break;
        case O_CHAT: o->chat = 1; break;
        case O_RAW: o->raw = 1; break;
        case O_CHATFMT: o->chat_format = 1; break;
        case O_SYSTEM: o->system = optarg; break;
        case O_THINK: o->thinking = 1; break;
        case O_NOBOS: o->no_bos = 1; break;
        case O_IDS: o->print_ids = 1; break;
        case O_QUIET: o->quiet = 1; break;
        case O_MAX:
            if (parse_ll(optarg, 0, 1LL << 40, &o->max_tokens))
                return bad_value("max-tokens", optarg, "an integer >= 0");
            break;
        case O_TEMP:
            if (parse_float(optarg, 0.0f, 1e6f, &o->temperature))
                return bad_value("temperature", optarg, "a finite number >= 0");
            break;
        case O_TOPP:
            if (parse_float(optarg, 0.0f, 1.0f, &o->top_p) || o->top_p <= 0.0f)
                return bad_value("top-p", optarg, "a number in (0, 1]");
            break;
        case O_SEED:
            if (parse_ll(optarg, 0, INT64_MAX, &v))
                return bad_value("seed", optarg, "a non-negative integer");
            o->seed = (unsigned long long)v;
            break;
        case O_THREADS:
            if (parse_ll(optarg, 1, 1024, &v))
                return bad_value("threads", optarg, "an integer in [1, 1024]");
            o->threads = (int)v;
            break;
        case O_CTX:
            if (parse_ll(optarg, 1, 1LL << 40, &o->ctx_size))
                return bad_value("ctx-size", optarg, "a positive integer");
            break;
        case O_BACKEND:
            if (mmoe_backend_parse(optarg, &o->backend) != 0)
                return bad_value("backend", optarg, "cpu, gpu or auto");
            break;
        case 'h': usage(stdout); return -1;
        default:
            if (optopt >= O_MODEL)
                fprintf(stderr, "megamoe generate: option '%s' needs a value\n", argv[optind - 1]);
            else
                fprintf(stderr, "megamoe generate: unknown option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return MMOE_EXIT_USAGE;
        }
    }
    const char *problem = NULL;
    if (optind < argc)
        problem = "unexpected argument (text goes after --prompt)";
    else if (o->model_dir == NULL)
        problem = "--model DIR is required";
    else if (o->chat && o->prompt != NULL)
        problem = "--prompt and --chat exclude each other";
    else if (!o->chat && o->prompt == NULL)
        problem = "one of --prompt TEXT or --chat is required";
    else if (o->raw && (o->chat_format || o->chat))
        problem = "--raw excludes --chat-format and --chat";
    else if ((o->system || o->thinking) && !(o->chat_format || o->chat))
        problem = "--system and --thinking need a chat encoding (--chat-format or --chat)";
    else if (o->no_bos && (o->chat_format || o->chat))
        problem = "--no-bos applies to raw prompts only";
    if (problem != NULL) {
        fprintf(stderr, "megamoe generate: %s\n", problem);
        if (optind < argc)
            fprintf(stderr, "  argument: '%s'\n", argv[optind]);
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    return 0;
}

/** Model-loading progress: one line rewritten in place on a terminal, nothing otherwise. */
static void load_progress(void *ctx, int done, int total, const char *what)
{
    const gen_run *r = ctx;
    if (r->opt->quiet || !r->stderr_tty)
        return;
    fprintf(stderr, "\rloading model: %d/%d %s\033[K", done, total, what ? what : "");
    fflush(stderr);
}

/** Prefill progress (called per chunk): shown only for prompts longer than one chunk. */
static void prefill_progress(void *ctx, int64_t done, int64_t total)
{
    const gen_run *r = ctx;
    if (r->opt->quiet || total <= MMOE_GEN_PREFILL_CHUNK)
        return;
    if (r->stderr_tty)
        fprintf(stderr, "\rprefill: %lld/%lld tokens\033[K%s", (long long)done, (long long)total,
                done == total ? "\n" : "");
    else if (done == total)
        fprintf(stderr, "prefill: %lld/%lld tokens\n", (long long)done, (long long)total);
    fflush(stderr);
}

/** Token callback: print the token (text through the streaming decoder, or its id). */
static int print_token(void *ctx, int32_t id)
{
    gen_run *r = ctx;
    if (r->opt->print_ids) {
        printf("%d ", id);
        fflush(stdout);
    }
    r->out_text.len = 0;
    mmoe_status st = mmoe_decode_stream_push(&r->stream, id, &r->out_text, &r->out_err);
    if (st != MMOE_OK) {
        r->out_status = st;
        return 1;
    }
    if (r->out_text.len > 0) {
        if (!r->opt->print_ids) {
            fwrite(r->out_text.data, 1, r->out_text.len, stdout);
            fflush(stdout);
        }
        if (mmoe_text_append(&r->answer, r->out_text.data, r->out_text.len) != MMOE_OK) {
            r->out_status = mmoe_error_set(&r->out_err, MMOE_ENOMEM, "generate: out of memory for the answer text");
            return 1;
        }
    }
    return 0;
}

/** Tokens per second and milliseconds per token, 0 for an empty interval. */
static void rates(int64_t n, double s, double *tok_s, double *ms_tok)
{
    *tok_s = n > 0 && s > 0 ? (double)n / s : 0.0;
    *ms_tok = n > 0 ? 1e3 * s / (double)n : 0.0;
}

/** The stats line of one turn (stderr). */
static void print_stats(const gen_run *r, int turn, const mmoe_gen_stats *p, const mmoe_gen_stats *d)
{
    if (r->opt->quiet)
        return;
    double pt, pm, gt, gm;
    rates(p->n_prefill, p->prefill_s, &pt, &pm);
    rates(d->n_generated, d->generate_s, &gt, &gm);
    if (turn > 0)
        fprintf(stderr, "turn %d ", turn);
    fprintf(stderr,
            "stats: prefilled %lld new tokens (%lld reused from the KV cache) in %.3f s (%.1f tokens/s, %.2f "
            "ms/token); generated %lld tokens in %.3f s (%.1f tokens/s, %.2f ms/token); stop: %s\n",
            (long long)p->n_prefill, (long long)p->n_reused, p->prefill_s, pt, pm, (long long)d->n_generated,
            d->generate_s, gt, gm, mmoe_gen_stop_name(d->stop));
}

/** Print an error message and return the runtime-error exit status. */
static int fail(mmoe_status st, const mmoe_error *err)
{
    fprintf(stderr, "megamoe generate: %s (%s)\n", err->msg, mmoe_status_name(st));
    return 1;
}

/**
 * The chat encoding writes its markers as text; they must be single tokens of this
 * tokenizer, and BOS/EOS must be the config's ids, or the model would see something else
 * than it was trained on (a tokenizer without them gets an error, not a silent byte split).
 */
static mmoe_status check_chat_markers(const gen_run *r, mmoe_error *err)
{
    const mmoe_config *cfg = mmoe_model_config(r->model);
    static const char *const markers[] = {BOS, EOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE};
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        int32_t id = mmoe_tokenizer_token_id(r->tok, markers[i], strlen(markers[i]));
        if (id < 0)
            return mmoe_error_set(err, MMOE_EFORMAT, "%s/tokenizer.json has no token '%s': the chat encoding needs "
                                  "DeepSeek-V4's chat markers (use a raw --prompt)", r->opt->model_dir, markers[i]);
        int64_t want = i == 0 ? cfg->bos_token_id : i == 1 ? cfg->eos_token_id : id;
        if (id != want)
            return mmoe_error_set(err, MMOE_EFORMAT, "%s: token '%s' has id %d in tokenizer.json but config.json "
                                  "says %lld", r->opt->model_dir, markers[i], id, (long long)want);
    }
    return MMOE_OK;
}

/** Load tokenizer and model, create the state and the session. */
static mmoe_status gen_load(gen_run *r, mmoe_error *err)
{
    const gen_options *o = r->opt;
    struct stat sb;
    if (stat(o->model_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mmoe_error_set(err, MMOE_ENOTFOUND, "model directory '%s': %s", o->model_dir,
                              stat(o->model_dir, &sb) != 0 ? strerror(errno) : "not a directory");
    mmoe_status st = mmoe_tokenizer_load_dir(o->model_dir, &r->tok, err);
    if (st != MMOE_OK)
        return st;
    if (o->threads > 0)
        openblas_set_num_threads(o->threads);
    double t0 = mmoe_clock_s();
    if ((st = mmoe_model_open(o->model_dir, load_progress, r, &r->model, err)) != MMOE_OK) {
        if (r->stderr_tty && !o->quiet)
            fputc('\n', stderr);
        return st;
    }
    const mmoe_config *cfg = mmoe_model_config(r->model);
    int32_t n_tok = mmoe_tokenizer_n_ids(r->tok);
    if (n_tok > cfg->vocab_size)
        return mmoe_error_set(err, MMOE_ESHAPE, "%s/tokenizer.json has %d ids but the model's vocab_size is %lld: "
                              "tokenizer and checkpoint do not belong together", o->model_dir, n_tok,
                              (long long)cfg->vocab_size);
    if ((o->chat || o->chat_format) && (st = check_chat_markers(r, err)) != MMOE_OK)
        return st;
    int64_t ctx = o->ctx_size > 0 ? o->ctx_size
                                  : (cfg->max_seq_len < GEN_DEFAULT_CTX ? cfg->max_seq_len : GEN_DEFAULT_CTX);
    if (ctx > cfg->max_seq_len)
        return mmoe_error_set(err, MMOE_ERANGE, "--ctx-size %lld: the model's max_seq_len is %lld", (long long)ctx,
                              (long long)cfg->max_seq_len);
    if ((st = mmoe_model_state_create(r->model, ctx, &r->state, err)) != MMOE_OK)
        return st;
    if ((st = mmoe_backend_open(o->backend, r->model, ctx, MMOE_GEN_PREFILL_CHUNK, "megamoe generate", o->quiet,
                                &r->gpu, err)) != MMOE_OK)
        return st;
    st = mmoe_gen_session_init(&r->session, r->model, r->state, ctx, r->tok, o->temperature, o->top_p, o->seed, err);
    if (st != MMOE_OK)
        return st;
    r->session.gpu = r->gpu;
    r->have_session = 1;
    if (!o->quiet) {
        fprintf(stderr, "%smodel: %s: %lld layers, vocab %lld, %.1f MiB of weights, loaded in %.2f s; context %lld "
                "tokens (KV cache %.1f MiB)\n", r->stderr_tty ? "\r\033[K" : "", o->model_dir,
                (long long)cfg->n_layers, (long long)cfg->vocab_size,
                (double)mmoe_model_weight_bytes(r->model) / (1024.0 * 1024.0), mmoe_clock_s() - t0, (long long)ctx,
                (double)mmoe_model_state_bytes(r->state) / (1024.0 * 1024.0));
        if (r->session.n_masked > 0)
            fprintf(stderr, "model: %lld of the %lld head rows have no token in tokenizer.json: never sampled\n",
                    (long long)r->session.n_masked, (long long)cfg->vocab_size);
        if (o->temperature > 0)
            fprintf(stderr, "sampling: temperature %g, top-p %g, seed %llu\n", o->temperature, o->top_p, o->seed);
        else
            fprintf(stderr, "sampling: greedy (temperature 0)\n");
    }
    return MMOE_OK;
}

/** Release everything gen_load() and the turns acquired. */
static void gen_cleanup(gen_run *r)
{
    if (r->have_session)
        mmoe_gen_session_free(&r->session);
    mmoe_gpu_model_destroy(r->gpu);
    mmoe_model_state_destroy(r->state);
    mmoe_model_close(r->model);
    mmoe_tokenizer_free(r->tok);
    mmoe_text_free(&r->out_text);
    mmoe_text_free(&r->answer);
}

/**
 * One turn: prefill @p ids (after the pending tokens), then decode and stream.
 * @p turn is 0 for a single prompt, k >= 1 for the k-th chat turn (stats prefix).
 */
static mmoe_status gen_turn(gen_run *r, const mmoe_token_ids *ids, int turn, mmoe_error *err)
{
    mmoe_gen_stats pre, dec;
    mmoe_status st = mmoe_gen_prefill(&r->session, ids->ids, (int64_t)ids->n, prefill_progress, r, &pre, err);
    if (st != MMOE_OK)
        return st;
    mmoe_decode_stream_init(&r->stream, r->tok, 0);
    r->answer.len = 0;
    r->out_status = MMOE_OK;
    st = mmoe_gen_decode(&r->session, r->opt->max_tokens, print_token, r, &dec, err);
    if (st == MMOE_OK && r->out_status != MMOE_OK) {
        *err = r->out_err;
        st = r->out_status;
    }
    r->out_text.len = 0;
    mmoe_status fin = mmoe_decode_stream_finish(&r->stream, &r->out_text, st == MMOE_OK ? err : &r->out_err);
    if (st == MMOE_OK)
        st = fin;
    if (st == MMOE_OK && r->out_text.len > 0) {
        if (!r->opt->print_ids)
            fwrite(r->out_text.data, 1, r->out_text.len, stdout);
        st = mmoe_text_append(&r->answer, r->out_text.data, r->out_text.len);
    }
    fputc('\n', stdout);
    fflush(stdout);
    if (st == MMOE_OK)
        print_stats(r, turn, &pre, &dec);
    return st;
}

/** Chat options of this command line, with @p n_context messages already in the cache. */
static void chat_options(const gen_options *o, size_t n_context, mmoe_chat_options *co)
{
    mmoe_chat_options_default(co);
    co->mode = o->thinking ? MMOE_CHAT_MODE_THINKING : MMOE_CHAT_MODE_CHAT;
    co->n_context = n_context;
}

/** Render the messages from @p n_context on with the chat encoding and append their tokens to @p ids. */
static mmoe_status encode_conversation(gen_run *r, json_t *msgs, size_t n_context, mmoe_token_ids *ids,
                                       mmoe_error *err)
{
    char *json = json_dumps(msgs, JSON_COMPACT);
    if (json == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "generate: out of memory for the conversation");
    mmoe_chat_options co;
    chat_options(r->opt, n_context, &co);
    mmoe_text prompt = {0};
    mmoe_status st = mmoe_chat_encode_json(json, strlen(json), &co, &prompt, err);
    if (st == MMOE_OK)
        st = mmoe_tokenizer_encode(r->tok, prompt.data ? prompt.data : "", prompt.len, 0, ids, err);
    mmoe_text_free(&prompt);
    free(json);
    return st;
}

/** Append {"role": role, "content": text} to @p msgs. */
static mmoe_status push_message(json_t *msgs, const char *role, const char *text, size_t len, mmoe_error *err)
{
    json_t *m = json_pack("{s:s, s:s%}", "role", role, "content", text ? text : "", text ? len : 0);
    if (m == NULL || json_array_append_new(msgs, m) != 0)
        return mmoe_error_set(err, MMOE_EFORMAT, "generate: cannot store the %s message (invalid UTF-8?)", role);
    return MMOE_OK;
}

/** The single-prompt mode: raw or chat-formatted. */
static mmoe_status run_prompt(gen_run *r, mmoe_error *err)
{
    const gen_options *o = r->opt;
    mmoe_token_ids ids = {0};
    mmoe_status st = MMOE_OK;
    if (o->chat_format) {
        json_t *msgs = json_array();
        if (msgs == NULL)
            return mmoe_error_set(err, MMOE_ENOMEM, "generate: out of memory");
        if (o->system)
            st = push_message(msgs, "system", o->system, strlen(o->system), err);
        if (st == MMOE_OK)
            st = push_message(msgs, "user", o->prompt, strlen(o->prompt), err);
        if (st == MMOE_OK)
            st = encode_conversation(r, msgs, 0, &ids, err);
        json_decref(msgs);
    } else {
        int32_t bos = (int32_t)mmoe_model_config(r->model)->bos_token_id;
        if (!o->no_bos)
            st = mmoe_token_ids_push(&ids, &bos, 1);
        if (st == MMOE_OK)
            st = mmoe_tokenizer_encode(r->tok, o->prompt, strlen(o->prompt), 0, &ids, err);
    }
    if (st == MMOE_OK)
        st = gen_turn(r, &ids, 0, err);
    mmoe_token_ids_free(&ids);
    return st;
}

/** Strip the trailing newline (and CR) of a line read by getline. */
static size_t chomp(char *line, size_t len)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        line[--len] = '\0';
    return len;
}

/**
 * One chat turn: render the new user message (everything earlier is context in the cache),
 * close the previous answer with EOS when it did not end with one, generate, record the answer.
 */
static mmoe_status chat_turn(gen_run *r, json_t *msgs, const char *line, size_t len, int turn, mmoe_error *err)
{
    size_t n_context = turn == 1 ? 0 : json_array_size(msgs); /* turn 1 renders the system message too */
    mmoe_status st = push_message(msgs, "user", line, len, err);
    mmoe_token_ids ids = {0};
    if (st == MMOE_OK)
        st = encode_conversation(r, msgs, n_context, &ids, err);
    mmoe_gen_session *g = &r->session;
    /* The previous answer is in the cache up to its last token (pending); the chat encoding
     * closes an assistant message with EOS: queue it unless the model already sampled it. */
    if (st == MMOE_OK && turn > 1 && !(g->n_pending == 1 && g->pending[0] == g->eos_id))
        st = mmoe_gen_push_pending(g, g->eos_id, err);
    if (st == MMOE_OK)
        st = gen_turn(r, &ids, turn, err);
    mmoe_token_ids_free(&ids);
    if (st == MMOE_OK)
        st = push_message(msgs, "assistant", r->answer.data, r->answer.len, err);
    return st;
}

/** The interactive chat: one user turn per line of stdin until end of input. */
static mmoe_status run_chat(gen_run *r, mmoe_error *err)
{
    json_t *msgs = json_array();
    if (msgs == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "generate: out of memory");
    mmoe_status st = MMOE_OK;
    if (r->opt->system)
        st = push_message(msgs, "system", r->opt->system, strlen(r->opt->system), err);
    char *line = NULL;
    size_t cap = 0;
    int turn = 0;
    while (st == MMOE_OK) {
        fputs("> ", stdout);
        fflush(stdout);
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) {
            fputc('\n', stdout);
            break;
        }
        size_t len = chomp(line, (size_t)got);
        if (len == 0)
            continue;
        st = chat_turn(r, msgs, line, len, ++turn, err);
    }
    free(line);
    json_decref(msgs);
    return st;
}

int mmoe_cmd_generate(int argc, char **argv)
{
    gen_options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    gen_run r;
    memset(&r, 0, sizeof r);
    r.opt = &opt;
    r.stderr_tty = isatty(STDERR_FILENO);
    mmoe_error err = {0};
    mmoe_status st = gen_load(&r, &err);
    if (st == MMOE_OK)
        st = opt.chat ? run_chat(&r, &err) : run_prompt(&r, &err);
    gen_cleanup(&r);
    return st == MMOE_OK ? 0 : fail(st, &err);
}
