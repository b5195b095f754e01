/**
 * @file cmd_generate.c
 * @brief `megamoe generate`: text generation on the CPU forward, one prompt or an interactive chat.
 *
 *     megamoe generate --model DIR [--prompt TEXT | --chat] [--max-tokens N] [--temperature T]
 *                      [--top-p P] [--top-k K] [--min-p M] [--repeat-penalty R] [--stop STRING]...
 *                      [--logprobs N] [--seed S] [--threads N] [--json] [--quiet] [--thinking] ...
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
 * ## A chat survives its input
 *
 * A line that cannot become a turn -- not valid UTF-8, or too long for the context left --
 * is reported on stderr (with advice that can be followed: --ctx-size only up to the
 * model's max_seq_len) and dropped; the conversation and its KV cache go on as if it had
 * not been typed.  Only errors after the model has run (a forward that fails) end the
 * session.
 *
 * Ctrl-C (SIGINT): the first one stops the answer being generated; its stats line ends in
 * `stop: interrupted` and the next prompt appears (the partial answer stays in the
 * conversation).  A second Ctrl-C before the next answer starts exits (killed by SIGINT, as
 * usual); one at the prompt ends the chat like Ctrl-D.  The counter lives in the one
 * process-wide variable a signal handler can write.
 *
 * ## Sampling and threads
 *
 * Temperature 0 (the default) is greedy and deterministic: the same command prints the
 * same tokens.  With --temperature > 0 (and --top-p) the sampler of mmoe_sampler.h draws
 * with a seeded generator: --seed S replays a generation (the default seed is 1, printed).
 * --top-k, --min-p and --repeat-penalty (over the last --repeat-last-n tokens, prompt
 * included) are the other cuts of mmoe_sampler.h, in its order; none changes what a seed
 * replays.  --stop STRING (repeatable) ends the answer where the string is completed; the
 * string itself is not printed (mmoe_stop_strings.h: the text that could still start one is
 * held back, so the output streams at most a stop string's length behind).
 * --logprobs N lists, after each turn, every generated token with its log-probability and
 * the N most probable alternatives (mmoe_logprobs_top(): the model's own distribution over
 * the ids the tokenizer can decode, before temperature and cuts), on stderr.
 * --json prints the stats (and logprobs) as JSON Lines on stderr instead of the human
 * lines (mmoe_json_report.h), and drops the progress and model lines.
 *
 * --threads N sets the model's worker threads, which every part of the forward shares its work
 * with, and OpenBLAS runs one thread (mmoe_cli_set_forward_threads(), cli_util.c "Threads").  The expert-parallel options (--ep-ranks, --gpus, --gpu-memory) are
 * cli_ep.h's.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include "mmoe_chat.h"
#include "cli_ep.h"
#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_fwd_backend.h"
#include "mmoe_generate.h"
#include "mmoe_json_report.h"
#include "mmoe_model.h"
#include "mmoe_stop_strings.h"
#include "mmoe_tokenizer.h"
#include "mmoe_utf8.h"

/** Ctrl-C presses since the current answer started (written by the SIGINT handler only, and reset per answer). */
static volatile sig_atomic_t g_interrupts;

/** SIGINT: count; the second press restores the default action and dies of it. */
static void on_interrupt(int sig)
{
    if (++g_interrupts >= 2) {
        signal(sig, SIG_DFL);
        raise(sig); /* delivered when the handler returns */
    }
}

/** Install on_interrupt() without SA_RESTART, so that a Ctrl-C at the prompt interrupts the read. */
static void install_interrupt_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/** Default context size (tokens) when the config allows more: keeps the KV caches small. */
#define GEN_DEFAULT_CTX 4096

/** Most --stop strings on one command line. */
#define GEN_MAX_STOPS 16

/** Most --logprobs alternatives per token (OpenAI's limit). */
#define GEN_MAX_LOGPROBS 20

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
    int threads;             /**< --threads (0: the worker pool's default) */
    mmoe_cli_ep ep;          /**< --ep-ranks, --gpus, --gpu-memory (cli_ep.h) */
    long long ctx_size;      /**< --ctx-size (0: min(config max_seq_len, GEN_DEFAULT_CTX)) */
    int64_t top_k;           /**< --top-k (0: off) */
    double min_p;            /**< --min-p (0: off) */
    double repeat_penalty;   /**< --repeat-penalty (1: off) */
    int64_t repeat_last_n;   /**< --repeat-last-n */
    const char *stops[GEN_MAX_STOPS]; /**< --stop strings */
    size_t n_stops;          /**< how many */
    int64_t logprobs;        /**< --logprobs N (-1: not asked) */
    int json;                /**< --json: stats as JSON Lines */
    mmoe_backend backend;    /**< --backend (default cpu) */
    int backend_given;       /**< --backend was on the command line */
    mmoe_cuda_graph_opt graph; /**< --cuda-graph, else MMOE_GPU_GRAPH */
} gen_options;

/** The log-probabilities of one generated token (--logprobs). */
typedef struct gen_logprob {
    int32_t id;                         /**< the token */
    double logprob;                     /**< its log-probability */
    int32_t top_ids[GEN_MAX_LOGPROBS];  /**< the most probable ids */
    double top_lp[GEN_MAX_LOGPROBS];    /**< their log-probabilities */
} gen_logprob;

/** Everything a run holds: owned resources are released by gen_cleanup(). */
typedef struct gen_run {
    const gen_options *opt;    /**< the command line (borrowed) */
    mmoe_tokenizer *tok;       /**< DIR/tokenizer.json (owned) */
    mmoe_model *model;         /**< the checkpoint (owned) */
    mmoe_ep_model *ep;         /**< --ep-ranks: the MoE layers over in-process ranks (owned) */
    mmoe_model_state *state;   /**< the sequence's KV caches (owned) */
    mmoe_gpu_model *gpu;       /**< the model on the GPU with --backend gpu/auto (owned), else NULL */
    mmoe_ep_gpu_model *gpus;   /**< the model over N GPUs with --gpus N (owned), else NULL */
    mmoe_gen_session session;  /**< the generation loop (owned) */
    int have_session;          /**< session is initialised (to free) */
    mmoe_decode_stream stream; /**< streaming UTF-8 decoder of the current turn */
    mmoe_text out_text;        /**< scratch: text of the current token */
    mmoe_text answer;          /**< the whole answer of the current turn (chat history) */
    int stderr_tty;            /**< stderr is a terminal: progress lines rewrite themselves */
    mmoe_status out_status;    /**< a decode error inside the token callback */
    mmoe_error out_err;        /**< its message */
    mmoe_stop_matcher stop;    /**< the --stop strings over the current turn's text */
    mmoe_text released;        /**< scratch: text the stop matcher released */
    int stop_matched;          /**< a stop string ended the current turn */
    gen_logprob *lp;           /**< --logprobs of the current turn's tokens (owned) */
    size_t n_lp, cap_lp;       /**< entries used and allocated */
    /** @var gen_run::n_lp
     *  entries of lp used */
    int interrupted;           /**< the current answer was stopped by Ctrl-C */
} gen_run;

/** Print the command's help to @p out. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe generate --model DIR [--prompt TEXT | --chat] [OPTIONS]\n"
            "  Generate text with a DeepSeek-V4 checkpoint on the CPU (DIR holds config.json,\n"
            "  the safetensors shards and tokenizer.json).\n"
            "  --model DIR         the checkpoint directory (required)\n"
            "  --prompt TEXT       complete TEXT (raw: BOS + the text's tokens) (this or --chat is required)\n"
            "  --chat              interactive chat: one user turn per stdin line, Ctrl-D ends (default off);\n"
            "                      the KV cache is kept between turns; Ctrl-C stops an answer, twice exits\n"
            "  --raw               --prompt is raw text (the default)\n"
            "  --chat-format       --prompt is one user message in the DeepSeek-V4 chat encoding (default off)\n"
            "  --system TEXT       a system message (chat encodings) (default: none)\n"
            "  --thinking          thinking mode: the assistant turn opens with <think> (default off)\n"
            "  --no-bos            do not start a raw prompt with BOS (default: BOS first)\n"
            "  --max-tokens N      most tokens to generate per turn (default 256)\n"
            "  --temperature T     0 = greedy, deterministic (default 0)\n"
            "  --top-p P           nucleus sampling mass in (0, 1] (default 1)\n"
            "  --top-k K           sample among the K most probable tokens (default 0: off)\n"
            "  --min-p M           drop tokens below M times the top probability, M in [0, 1] (default 0: off)\n"
            "  --repeat-penalty R  divide positive / multiply negative logits of recent tokens by R > 0\n"
            "                      (default 1: off)\n"
            "  --repeat-last-n N   recent tokens the penalty looks at, prompt included (default %d)\n"
            "  --stop STRING       end the answer where STRING appears (not printed); repeatable, at most %d\n"
            "                      (default: none)\n"
            "  --logprobs N        list each generated token's log-probability and the N most probable\n"
            "                      alternatives (N in [0, %d]) on stderr after each turn (default: off)\n"
            "  --json              stats (and logprobs) as JSON Lines on stderr; no progress lines\n"
            "                      (default: human lines)\n"
            "  --seed S            sampler seed (default 1)\n"
            "  --threads N         worker threads of the forward (OpenBLAS then runs one), 1..1024 (default: MMOE_DEQUANT_THREADS, else the cores up to 16)\n"
            "  --ctx-size N        KV cache size in tokens (default: min(config max_seq_len, %d))\n"
            "  --print-ids         print generated token ids instead of text (default: text)\n"
            "  --backend B         cpu (the oracle), gpu (refused without a usable GPU), or auto\n"
            "                      (the GPU when there is one and the model fits, else the CPU; says which)\n"
            "                      (default cpu)\n"
            "  --quiet             no progress or stats lines (default: shown)\n" MMOE_CUDA_GRAPH_USAGE
            MMOE_CLI_EP_USAGE "\n"
            "example:\n"
            "  megamoe generate --model fixtures/tiny-dsv4 --prompt '1 2 3 4' --max-tokens 8\n",
            MMOE_SAMPLER_REPEAT_LAST_N, GEN_MAX_STOPS, GEN_MAX_LOGPROBS, GEN_DEFAULT_CTX);
}

/** Parse argv into @p o. Returns 0, MMOE_EXIT_USAGE on a usage error, 1 on a bad MMOE_GPU_GRAPH, or -1 after --help. */
static int parse_options(int argc, char **argv, gen_options *o)
{
    enum { O_MODEL = 256, O_PROMPT, O_CHAT, O_RAW, O_CHATFMT, O_SYSTEM, O_THINK, O_NOBOS, O_MAX, O_TEMP,
           O_TOPP, O_SEED, O_THREADS, O_CTX, O_IDS, O_QUIET, O_TOPK, O_MINP, O_PENALTY, O_LASTN, O_STOP,
           O_LOGPROBS, O_JSON, O_EP_RANKS, O_GPUS, O_GPU_MEM, O_BACKEND, O_GRAPH };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},  {"prompt", required_argument, 0, O_PROMPT},
        {"chat", no_argument, 0, O_CHAT},          {"raw", no_argument, 0, O_RAW},
        {"chat-format", no_argument, 0, O_CHATFMT}, {"system", required_argument, 0, O_SYSTEM},
        {"thinking", no_argument, 0, O_THINK},     {"no-bos", no_argument, 0, O_NOBOS},
        {"max-tokens", required_argument, 0, O_MAX}, {"temperature", required_argument, 0, O_TEMP},
        {"top-p", required_argument, 0, O_TOPP},   {"seed", required_argument, 0, O_SEED},
        {"threads", required_argument, 0, O_THREADS}, {"ctx-size", required_argument, 0, O_CTX},
        {"print-ids", no_argument, 0, O_IDS},      {"quiet", no_argument, 0, O_QUIET},
        {"top-k", required_argument, 0, O_TOPK},   {"min-p", required_argument, 0, O_MINP},
        {"repeat-penalty", required_argument, 0, O_PENALTY}, {"repeat-last-n", required_argument, 0, O_LASTN},
        {"stop", required_argument, 0, O_STOP},    {"logprobs", required_argument, 0, O_LOGPROBS},
        {"json", no_argument, 0, O_JSON},
        {"ep-ranks", required_argument, 0, O_EP_RANKS}, {"gpus", required_argument, 0, O_GPUS},
        {"gpu-memory", required_argument, 0, O_GPU_MEM},
        {"backend", required_argument, 0, O_BACKEND},
        {"cuda-graph", required_argument, 0, O_GRAPH},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->max_tokens = 256;
    o->top_p = 1.0f;
    o->seed = 1;
    o->repeat_penalty = 1.0;
    o->repeat_last_n = MMOE_SAMPLER_REPEAT_LAST_N;
    o->logprobs = -1;
    const char *cmd = "generate";
    int64_t v = 0;
    uint64_t u = 0;
    double d = 0;
    int c, rc = 0;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
        case O_MAX: rc = mmoe_cli_opt_i64(cmd, "max-tokens", optarg, 0, INT64_C(1) << 40, &v), o->max_tokens = v; break;
        case O_TEMP: rc = mmoe_cli_opt_f64(cmd, "temperature", optarg, 0.0, 1e6, 0, &d), o->temperature = (float)d; break;
        case O_TOPP: rc = mmoe_cli_opt_f64(cmd, "top-p", optarg, 0.0, 1.0, MMOE_CLI_LO_OPEN, &d), o->top_p = (float)d; break;
        case O_SEED: rc = mmoe_cli_opt_u64(cmd, "seed", optarg, 0, UINT64_MAX, &u), o->seed = u; break;
        case O_THREADS: rc = mmoe_cli_opt_int(cmd, "threads", optarg, 1, MMOE_CLI_MAX_THREADS, &o->threads); break;
        case O_CTX: rc = mmoe_cli_opt_i64(cmd, "ctx-size", optarg, 1, INT64_C(1) << 40, &v), o->ctx_size = v; break;
        case O_TOPK: rc = mmoe_cli_opt_i64(cmd, "top-k", optarg, 0, INT32_MAX, &o->top_k); break;
        case O_MINP: rc = mmoe_cli_opt_f64(cmd, "min-p", optarg, 0.0, 1.0, 0, &o->min_p); break;
        case O_PENALTY:
            rc = mmoe_cli_opt_f64(cmd, "repeat-penalty", optarg, 0.0, 1e6, MMOE_CLI_LO_OPEN, &o->repeat_penalty);
            break;
        case O_LASTN:
            rc = mmoe_cli_opt_i64(cmd, "repeat-last-n", optarg, 0, MMOE_SAMPLER_REPEAT_LAST_N_MAX, &o->repeat_last_n);
            break;
        case O_STOP:
            if (optarg[0] == '\0' || o->n_stops == GEN_MAX_STOPS) {
                fprintf(stderr, "megamoe generate: --stop: expected a non-empty string, at most %d of them\n",
                        GEN_MAX_STOPS);
                rc = MMOE_EXIT_USAGE;
            } else {
                o->stops[o->n_stops++] = optarg;
            }
            break;
        case O_LOGPROBS: rc = mmoe_cli_opt_i64(cmd, "logprobs", optarg, 0, GEN_MAX_LOGPROBS, &o->logprobs); break;
        case O_JSON: o->json = 1; break;
        case O_EP_RANKS:
        case O_GPUS:
        case O_GPU_MEM:
            rc = mmoe_cli_ep_option("generate", c == O_EP_RANKS ? "ep-ranks" : c == O_GPUS ? "gpus" : "gpu-memory", optarg,
                                    &o->ep);
            break;
        case O_BACKEND:
            o->backend_given = 1;
            if (mmoe_backend_parse(optarg, &o->backend) != 0) {
                fprintf(stderr, "megamoe generate: --backend '%s': expected cpu, gpu or auto\n", optarg);
                rc = MMOE_EXIT_USAGE;
            }
            break;
        case O_GRAPH: rc = mmoe_cuda_graph_option("generate", optarg, &o->graph); break;
        case 'h': usage(stdout); return -1;
        default:
            mmoe_cli_bad_option("generate", optopt >= O_MODEL, argv[optind - 1]);
            usage(stderr);
            return MMOE_EXIT_USAGE;
        }
    }
    if (rc != 0)
        return rc;
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
    else if (o->ep.ep_ranks > 0 && o->backend != MMOE_BACKEND_CPU)
        problem = "--ep-ranks splits the CPU forward's MoE layers: use it with --backend cpu";
    else if (o->ep.gpus > 0 && o->backend_given && o->backend != MMOE_BACKEND_GPU)
        problem = "--gpus runs the GPU forward over N GPUs: --backend cpu or auto contradicts it";
    if (problem != NULL) {
        fprintf(stderr, "megamoe generate: %s\n", problem);
        if (optind < argc)
            fprintf(stderr, "  argument: '%s'\n", argv[optind]);
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    return mmoe_cuda_graph_resolve("generate", &o->graph, o->backend, o->ep.gpus);
}

/** Model-loading progress: one line rewritten in place on a terminal, nothing otherwise. */
static void load_progress(void *ctx, int done, int total, const char *what)
{
    const gen_run *r = ctx;
    if (r->opt->quiet || r->opt->json || !r->stderr_tty)
        return;
    fprintf(stderr, "\rloading model: %d/%d %s\033[K", done, total, what ? what : "");
    fflush(stderr);
}

/** Prefill progress (called per chunk): shown only for prompts longer than one chunk. */
static void prefill_progress(void *ctx, int64_t done, int64_t total)
{
    const gen_run *r = ctx;
    if (r->opt->quiet || r->opt->json || total <= MMOE_GEN_PREFILL_CHUNK)
        return;
    if (r->stderr_tty)
        fprintf(stderr, "\rprefill: %lld/%lld tokens\033[K%s", (long long)done, (long long)total,
                done == total ? "\n" : "");
    else if (done == total)
        fprintf(stderr, "prefill: %lld/%lld tokens\n", (long long)done, (long long)total);
    fflush(stderr);
}

/** Pass answer text through the stop matcher; print and keep what it releases. Nonzero: stop (or error). */
static int emit_text(gen_run *r, const char *text, size_t len)
{
    r->released.len = 0;
    if (mmoe_stop_push(&r->stop, text, len, &r->released, &r->stop_matched) != MMOE_OK ||
        mmoe_text_append(&r->answer, r->released.data ? r->released.data : "", r->released.len) != MMOE_OK) {
        r->out_status = mmoe_error_set(&r->out_err, MMOE_ENOMEM, "out of memory for the answer text");
        return 1;
    }
    if (r->released.len > 0 && !r->opt->print_ids) {
        fwrite(r->released.data, 1, r->released.len, stdout);
        fflush(stdout);
    }
    return r->stop_matched;
}

/** Record the log-probabilities of @p id (--logprobs); the session's logits are those it was sampled from. */
static int record_logprobs(gen_run *r, int32_t id)
{
    if (r->n_lp == r->cap_lp) {
        size_t cap = r->cap_lp ? 2 * r->cap_lp : 64;
        gen_logprob *lp = realloc(r->lp, cap * sizeof *lp);
        if (lp == NULL) {
            r->out_status = mmoe_error_set(&r->out_err, MMOE_ENOMEM, "out of memory for logprobs");
            return 1;
        }
        r->lp = lp;
        r->cap_lp = cap;
    }
    gen_logprob *e = &r->lp[r->n_lp++];
    e->id = id;
    mmoe_status st = mmoe_logprobs_top(r->session.logits, (size_t)r->session.vocab, id, (size_t)r->opt->logprobs,
                                       &e->logprob, e->top_ids, e->top_lp, &r->out_err);
    if (st != MMOE_OK) {
        r->out_status = st;
        return 1;
    }
    return 0;
}

/** Token callback: print the token (text through the streaming decoder and the stop matcher, or its id). */
static int print_token(void *ctx, int32_t id)
{
    gen_run *r = ctx;
    if (g_interrupts > 0)
        r->interrupted = 1; /* this token is still shown; the answer stops after it */
    if (r->opt->logprobs >= 0 && record_logprobs(r, id) != 0)
        return 1;
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
    if (r->out_text.len > 0 && emit_text(r, r->out_text.data, r->out_text.len) != 0)
        return 1;
    return r->interrupted;
}

/** The text of one token as a JSON value (null when the token alone is not valid UTF-8); NULL on failure. */
static json_t *token_json(const gen_run *r, int32_t id)
{
    mmoe_text t = {0};
    json_t *v = NULL;
    if (mmoe_tokenizer_decode(r->tok, &id, 1, 0, &t, NULL) == MMOE_OK)
        v = json_stringn(t.data ? t.data : "", t.len);
    mmoe_text_free(&t);
    return v != NULL ? v : json_null();
}

/** One --logprobs entry as a JSON object {"index","id","text","logprob","top":[...]}. */
static json_t *logprob_json(const gen_run *r, size_t index)
{
    const gen_logprob *e = &r->lp[index];
    json_t *o = json_object(), *top = json_array();
    mmoe_json_set_int(o, "index", (int64_t)index);
    mmoe_json_set_int(o, "id", e->id);
    json_object_set_new(o, "text", token_json(r, e->id));
    mmoe_json_set_real(o, "logprob", e->logprob);
    for (int64_t k = 0; k < r->opt->logprobs; k++) {
        json_t *t = json_object();
        mmoe_json_set_int(t, "id", e->top_ids[k]);
        json_object_set_new(t, "text", token_json(r, e->top_ids[k]));
        mmoe_json_set_real(t, "logprob", e->top_lp[k]);
        json_array_append_new(top, t);
    }
    json_object_set_new(o, "top", top);
    return o;
}

/** Print the turn's --logprobs on stderr: JSON Lines with --json, else one human line per token. */
static mmoe_status print_logprobs(const gen_run *r, int turn, mmoe_error *err)
{
    for (size_t i = 0; i < r->n_lp; i++) {
        json_t *o = logprob_json(r, i);
        if (r->opt->json) {
            json_object_set_new(o, "type", json_string("logprobs"));
            mmoe_json_set_int(o, "turn", turn);
            mmoe_status st = mmoe_json_print_line(stderr, o, err);
            if (st != MMOE_OK)
                return st;
            continue;
        }
        char *text = json_dumps(json_object_get(o, "text"), JSON_ENCODE_ANY);
        fprintf(stderr, "logprobs: token %zu: id %d %s %.6f", i, r->lp[i].id, text ? text : "?", r->lp[i].logprob);
        free(text);
        json_t *top = json_object_get(o, "top");
        for (size_t k = 0; k < json_array_size(top); k++) {
            json_t *t = json_array_get(top, k);
            char *tt = json_dumps(json_object_get(t, "text"), JSON_ENCODE_ANY);
            fprintf(stderr, "%s%d %s %.6f", k == 0 ? " | top: " : ", ",
                    (int)json_integer_value(json_object_get(t, "id")), tt ? tt : "?",
                    json_real_value(json_object_get(t, "logprob")));
            free(tt);
        }
        fputc('\n', stderr);
        json_decref(o);
    }
    return MMOE_OK;
}

/** Tokens per second and milliseconds per token, 0 for an empty interval. */
static void rates(int64_t n, double s, double *tok_s, double *ms_tok)
{
    *tok_s = n > 0 && s > 0 ? (double)n / s : 0.0;
    *ms_tok = n > 0 ? 1e3 * s / (double)n : 0.0;
}

/** Why the turn stopped, in words ("stop-string" when a --stop string ended it). */
static const char *stop_name(const gen_run *r, const mmoe_gen_stats *d)
{
    return r->interrupted ? "interrupted" : r->stop_matched ? "stop-string" : mmoe_gen_stop_name(d->stop);
}

/** The stats of one turn as one JSON object (--json), units in the keys. */
static mmoe_status print_stats_json(const gen_run *r, int turn, const mmoe_gen_stats *p, const mmoe_gen_stats *d,
                                    mmoe_error *err)
{
    double pt, pm, gt, gm;
    rates(p->n_prefill, p->prefill_s, &pt, &pm);
    rates(d->n_generated, d->generate_s, &gt, &gm);
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("stats"));
    mmoe_json_set_int(o, "turn", turn);
    mmoe_json_set_int(o, "prefill_tokens", p->n_prefill);
    mmoe_json_set_int(o, "reused_tokens", p->n_reused);
    mmoe_json_set_real(o, "prefill_s", p->prefill_s);
    mmoe_json_set_real(o, "prefill_tokens_per_s", pt);
    mmoe_json_set_real(o, "prefill_ms_per_token", pm);
    mmoe_json_set_int(o, "generated_tokens", d->n_generated);
    mmoe_json_set_real(o, "generate_s", d->generate_s);
    mmoe_json_set_real(o, "generate_tokens_per_s", gt);
    mmoe_json_set_real(o, "generate_ms_per_token", gm);
    json_object_set_new(o, "stop", json_string(stop_name(r, d)));
    json_object_set_new(o, "cuda_graph", json_boolean(mmoe_backend_graphed(r->gpu)));
    return mmoe_json_print_line(stderr, o, err);
}

/** The stats line of one turn (stderr). */
static void print_stats(const gen_run *r, int turn, const mmoe_gen_stats *p, const mmoe_gen_stats *d)
{
    if (r->opt->quiet || r->opt->json)
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
            d->generate_s, gt, gm, stop_name(r, d));
}

/** Print an error message and return the runtime-error exit status. */
static int fail(mmoe_status st, const mmoe_error *err)
{
    fprintf(stderr, "megamoe generate: %s (%s)\n", err->msg, mmoe_status_name(st));
    return 1;
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
    mmoe_cli_set_forward_threads(o->threads); /* before the model creates its worker pool */
    if ((st = mmoe_cli_ep_before_load(&o->ep, o->model_dir, err)) != MMOE_OK)
        return st;
    double t0 = mmoe_clock_s();
    if ((st = mmoe_model_open(o->model_dir, load_progress, r, &r->model, err)) != MMOE_OK) {
        if (r->stderr_tty && !o->quiet && !o->json)
            fputc('\n', stderr);
        return st;
    }
    if ((st = mmoe_cli_ep_attach(&o->ep, r->model, &r->ep, err)) != MMOE_OK)
        return st;
    const mmoe_config *cfg = mmoe_model_config(r->model);
    int32_t n_tok = mmoe_tokenizer_n_ids(r->tok);
    if (n_tok > cfg->vocab_size)
        return mmoe_error_set(err, MMOE_ESHAPE, "%s/tokenizer.json has %d ids but the model's vocab_size is %lld: "
                              "tokenizer and checkpoint do not belong together", o->model_dir, n_tok,
                              (long long)cfg->vocab_size);
    if ((o->chat || o->chat_format) && (st = mmoe_gen_check_chat_markers(r->tok, cfg, o->model_dir, err)) != MMOE_OK)
        return st;
    int64_t ctx = o->ctx_size > 0 ? o->ctx_size
                                  : (cfg->max_seq_len < GEN_DEFAULT_CTX ? cfg->max_seq_len : GEN_DEFAULT_CTX);
    if (ctx > cfg->max_seq_len)
        return mmoe_error_set(err, MMOE_ERANGE, "--ctx-size %lld: the model's max_seq_len is %lld", (long long)ctx,
                              (long long)cfg->max_seq_len);
    if ((st = mmoe_model_state_create(r->model, ctx, &r->state, err)) != MMOE_OK)
        return st;
    if (o->ep.gpus > 0)
        st = mmoe_cli_ep_open_gpus(&o->ep, r->model, ctx, MMOE_GEN_PREFILL_CHUNK, "megamoe generate", o->quiet || o->json,
                                   &r->gpus, err);
    else
        st = mmoe_backend_open(o->backend, r->model, ctx, MMOE_GEN_PREFILL_CHUNK, o->graph.on, "megamoe generate",
                               o->quiet || o->json, &r->gpu, err);
    if (st != MMOE_OK)
        return st;
    mmoe_sampler_params sp;
    mmoe_sampler_params_default(&sp);
    sp.temperature = o->temperature;
    sp.top_p = o->top_p;
    sp.top_k = (int32_t)o->top_k;
    sp.min_p = (float)o->min_p;
    sp.repeat_penalty = (float)o->repeat_penalty;
    sp.repeat_last_n = (int32_t)o->repeat_last_n;
    sp.seed = o->seed;
    st = mmoe_gen_session_init_params(&r->session, r->model, r->state, ctx, r->tok, &sp, err);
    if (st != MMOE_OK)
        return st;
    r->session.gpu = r->gpu;
    r->session.gpus = r->gpus;
    r->have_session = 1;
    if (!o->quiet && !o->json) {
        fprintf(stderr, "%smodel: %s: %lld layers, vocab %lld, %.1f MiB of weights, loaded in %.2f s; context %lld "
                "tokens (KV cache %.1f MiB)\n", r->stderr_tty ? "\r\033[K" : "", o->model_dir,
                (long long)cfg->n_layers, (long long)cfg->vocab_size,
                (double)mmoe_model_weight_bytes(r->model) / (1024.0 * 1024.0), mmoe_clock_s() - t0, (long long)ctx,
                (double)mmoe_model_state_bytes(r->state) / (1024.0 * 1024.0));
        if (r->session.n_masked > 0)
            fprintf(stderr, "model: %lld of the %lld head rows have no token in tokenizer.json: never sampled\n",
                    (long long)r->session.n_masked, (long long)cfg->vocab_size);
        if (o->temperature > 0)
            fprintf(stderr, "sampling: temperature %g, top-p %g, top-k %lld, min-p %g, seed %llu\n", o->temperature,
                    o->top_p, (long long)o->top_k, o->min_p, o->seed);
        else
            fprintf(stderr, "sampling: greedy (temperature 0)\n");
        if (o->repeat_penalty != 1.0)
            fprintf(stderr, "sampling: repeat penalty %g over the last %lld tokens\n", o->repeat_penalty,
                    (long long)o->repeat_last_n);
    }
    return MMOE_OK;
}

/** Release everything gen_load() and the turns acquired. */
static void gen_cleanup(gen_run *r)
{
    if (r->have_session)
        mmoe_gen_session_free(&r->session);
    mmoe_gpu_model_destroy(r->gpu);
    if (r->gpus != NULL && !r->opt->quiet && !r->opt->json)
        mmoe_cli_ep_gpus_report(stderr, r->gpus);
    mmoe_ep_gpu_model_destroy(r->gpus);
    mmoe_model_state_destroy(r->state);
    if (r->ep != NULL && !r->opt->quiet)
        mmoe_cli_ep_report(stderr, r->ep);
    mmoe_ep_model_detach(r->ep);
    mmoe_model_close(r->model);
    mmoe_tokenizer_free(r->tok);
    mmoe_text_free(&r->out_text);
    mmoe_text_free(&r->answer);
    mmoe_text_free(&r->released);
    free(r->lp);
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
    mmoe_stop_init(&r->stop, r->opt->stops, r->opt->n_stops);
    r->stop_matched = 0;
    r->n_lp = 0;
    r->answer.len = 0;
    r->out_status = MMOE_OK;
    r->interrupted = 0;
    g_interrupts = 0; /* a Ctrl-C during the prefill would stop the answer at its first token */
    st = mmoe_gen_decode(&r->session, r->opt->max_tokens, print_token, r, &dec, err);
    if (st == MMOE_OK && r->out_status != MMOE_OK) {
        *err = r->out_err;
        st = r->out_status;
    }
    r->out_text.len = 0;
    mmoe_status fin = mmoe_decode_stream_finish(&r->stream, &r->out_text, st == MMOE_OK ? err : &r->out_err);
    if (st == MMOE_OK)
        st = fin;
    if (st == MMOE_OK && r->out_text.len > 0 && emit_text(r, r->out_text.data, r->out_text.len) != 0 &&
        r->out_status != MMOE_OK) {
        *err = r->out_err;
        st = r->out_status;
    }
    r->released.len = 0;
    if (st == MMOE_OK && (st = mmoe_stop_finish(&r->stop, &r->released)) == MMOE_OK && r->released.len > 0) {
        if (!r->opt->print_ids)
            fwrite(r->released.data, 1, r->released.len, stdout);
        st = mmoe_text_append(&r->answer, r->released.data, r->released.len);
    }
    mmoe_stop_free(&r->stop);
    fputc('\n', stdout);
    fflush(stdout);
    if (st == MMOE_OK) {
        print_stats(r, turn, &pre, &dec);
        if (r->opt->json)
            st = print_stats_json(r, turn, &pre, &dec, err);
    }
    if (st == MMOE_OK)
        st = print_logprobs(r, turn, err);
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
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory for the conversation");
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
        return mmoe_error_set(err, MMOE_EFORMAT, "cannot store the %s message (invalid UTF-8?)", role);
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
            return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
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
 * @p n_done is the number of turns completed so far.  A failure before the model ran (a line
 * the encoder or the context cannot take) leaves the conversation as it was: *@p skipped is
 * set and the caller reports the message and goes on.
 */
static mmoe_status chat_turn(gen_run *r, json_t *msgs, const char *line, size_t len, int n_done, int *skipped,
                             mmoe_error *err)
{
    mmoe_gen_session *g = &r->session;
    const size_t n_msgs = json_array_size(msgs);
    const int n_pending = g->n_pending;
    const int64_t pos = mmoe_model_state_pos(r->state);
    size_t n_context = n_done == 0 ? 0 : n_msgs; /* the first turn renders the system message too */
    *skipped = 0;
    mmoe_status st = push_message(msgs, "user", line, len, err);
    mmoe_token_ids ids = {0};
    if (st == MMOE_OK)
        st = encode_conversation(r, msgs, n_context, &ids, err);
    /* The previous answer is in the cache up to its last token (pending); the chat encoding
     * closes an assistant message with EOS: queue it unless the model already sampled it. */
    if (st == MMOE_OK && n_done > 0 && !(g->n_pending == 1 && g->pending[0] == g->eos_id))
        st = mmoe_gen_push_pending(g, g->eos_id, err);
    if (st == MMOE_OK)
        st = gen_turn(r, &ids, n_done + 1, err);
    mmoe_token_ids_free(&ids);
    if (st != MMOE_OK && mmoe_model_state_pos(r->state) == pos && st != MMOE_ENOMEM) {
        while (json_array_size(msgs) > n_msgs) /* undo: the conversation as before the line */
            json_array_remove(msgs, json_array_size(msgs) - 1);
        g->n_pending = n_pending;
        *skipped = 1;
        return st;
    }
    if (st == MMOE_OK)
        st = push_message(msgs, "assistant", r->answer.data, r->answer.len, err);
    return st;
}

/** The interactive chat: one user turn per line of stdin until end of input (or Ctrl-C at the prompt). */
static mmoe_status run_chat(gen_run *r, mmoe_error *err)
{
    json_t *msgs = json_array();
    if (msgs == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    mmoe_status st = MMOE_OK;
    if (r->opt->system)
        st = push_message(msgs, "system", r->opt->system, strlen(r->opt->system), err);
    char *line = NULL;
    size_t cap = 0;
    int n_done = 0;
    long long n_line = 0;
    install_interrupt_handler();
    while (st == MMOE_OK) {
        fputs("> ", stdout);
        fflush(stdout);
        errno = 0;
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) { /* end of input, or Ctrl-C at the prompt (EINTR) */
            fputc('\n', stdout);
            break;
        }
        n_line++;
        size_t len = chomp(line, (size_t)got);
        if (len == 0)
            continue;
        size_t bad;
        if (!mmoe_utf8_valid(line, len, &bad)) {
            fprintf(stderr, "megamoe generate: line %lld is not valid UTF-8 (byte 0x%02x at offset %zu): not sent; "
                    "the conversation goes on\n", n_line, (unsigned)(unsigned char)line[bad], bad);
            continue;
        }
        int skipped;
        st = chat_turn(r, msgs, line, len, n_done, &skipped, err);
        if (skipped) {
            fprintf(stderr, "megamoe generate: line %lld: %s: not sent; the conversation goes on\n", n_line, err->msg);
            st = MMOE_OK;
        } else if (st == MMOE_OK)
            n_done++;
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
    if (st == MMOE_OK && !opt.chat)
        install_interrupt_handler(); /* a single prompt: Ctrl-C stops the answer and prints the stats */
    if (st == MMOE_OK)
        st = opt.chat ? run_chat(&r, &err) : run_prompt(&r, &err);
    gen_cleanup(&r);
    return st == MMOE_OK ? 0 : fail(st, &err);
}
