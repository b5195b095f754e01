/**
 * @file cmd_serve.c
 * @brief `megamoe serve`: an OpenAI-compatible HTTP server over one checkpoint.
 *
 *     megamoe serve --model DIR [--host 127.0.0.1] [--port 8080] [--ctx-size N] [--threads N]
 *                   [--seed S] [--name NAME] [--max-body BYTES] [--max-queue N]
 *                   [--timeout S] [--max-connections N] [--backend cpu|gpu|auto] [--cuda-graph on|off]
 *
 * Loads the tokenizer and the model once, then answers `POST /v1/completions`,
 * `POST /v1/chat/completions`, `GET /v1/models` and `GET /health` (serve_http.c, with the
 * request fields of serve_request.c).  Requests are queued and served **one at a time, in
 * arrival order** by one worker thread (serve_engine.c); each starts from a fresh KV state,
 * so a greedy answer is exactly `megamoe generate`'s for the same prompt.
 *
 * The server listens only on --host (default the loopback address 127.0.0.1; give 0.0.0.0
 * to accept other machines, which the server does nothing to authenticate).  --port 0 asks
 * the system for a free port.  Once listening, one line on stderr gives the address:
 *
 *     megamoe serve: listening on http://127.0.0.1:8080 (model tiny-dsv4, context 1024 tokens, ...)
 *
 * SIGINT or SIGTERM stops it: the running request ends at its next token, queued ones get
 * 503, connections close, exit status 0.  The signals are blocked in every thread and
 * taken by sigwait() in the main thread, so no handler runs asynchronously.
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "mmoe_cli.h"
#include "serve_internal.h"

/** Default context size (tokens) when the config allows more, as `generate`. */
#define SERVE_DEFAULT_CTX 4096

/** The command line, parsed. */
typedef struct serve_options {
    const char *model_dir;  /**< --model */
    const char *host;       /**< --host */
    int64_t port;           /**< --port (0: any free port) */
    int64_t ctx_size;       /**< --ctx-size (0: min(config max_seq_len, SERVE_DEFAULT_CTX)) */
    int64_t threads;        /**< --threads (0: the worker pool's default) */
    uint64_t seed;          /**< --seed: of requests that give none */
    const char *name;       /**< --name (NULL: the model directory's name) */
    int64_t max_body;       /**< --max-body bytes */
    int64_t max_queue;      /**< --max-queue */
    int64_t timeout_s;      /**< --timeout seconds */
    int64_t max_conn;       /**< --max-connections */
    mmoe_backend backend;   /**< --backend */
    mmoe_cuda_graph_opt graph; /**< --cuda-graph, else MMOE_GPU_GRAPH */
} serve_options;

/** Print the command's help to @p out. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe serve --model DIR [OPTIONS]\n"
            "  An OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions,\n"
            "  GET /v1/models, GET /health.  Requests are served one at a time, in arrival order.\n"
            "  --host HOST             address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N                TCP port, 0 = any free port (default 8080)\n"
            "  --ctx-size N            context of each request in tokens (default: min(config max_seq_len, %d))\n"
            "  --threads N             worker threads of the forward (OpenBLAS then runs one), 1..1024 (default: MMOE_DEQUANT_THREADS, else the cores up to 16)\n"
            "  --seed S                sampler seed of requests that give no 'seed' (default 1)\n"
            "  --name NAME             the model's name in the API (default: the directory's name)\n"
            "  --max-body BYTES        largest request body (default 1048576)\n"
            "  --max-queue N           most requests waiting; more get HTTP 503 (default 16)\n"
            "  --timeout S             close a connection silent for S seconds (default 30)\n"
            "  --max-connections N     most open connections (default 64)\n"
            "  --backend B             cpu (the oracle), gpu (refused without a usable GPU) or auto\n"
            "                          (the GPU when there is one, said on stderr) (default cpu)\n"
            MMOE_CUDA_GRAPH_USAGE "\n"
            "example:\n"
            "  megamoe serve --model fixtures/tiny-dsv4 --port 8080\n",
            SERVE_DEFAULT_CTX);
}

/** Parse argv into @p o. Returns 0, MMOE_EXIT_USAGE, 1 (a bad MMOE_GPU_GRAPH), or -1 after --help. */
static int parse_options(int argc, char **argv, serve_options *o)
{
    enum { O_MODEL = 256, O_HOST, O_PORT, O_CTX, O_THREADS, O_SEED, O_NAME, O_BODY, O_QUEUE, O_TIMEOUT, O_CONN, O_BACKEND,
           O_GRAPH };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},     {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},       {"ctx-size", required_argument, 0, O_CTX},
        {"threads", required_argument, 0, O_THREADS}, {"seed", required_argument, 0, O_SEED},
        {"name", required_argument, 0, O_NAME},       {"max-body", required_argument, 0, O_BODY},
        {"max-queue", required_argument, 0, O_QUEUE}, {"timeout", required_argument, 0, O_TIMEOUT},
        {"max-connections", required_argument, 0, O_CONN}, {"backend", required_argument, 0, O_BACKEND},
        {"cuda-graph", required_argument, 0, O_GRAPH}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->seed = 1;
    o->max_body = 1 << 20;
    o->max_queue = 16;
    o->timeout_s = 30;
    o->max_conn = 64;
    int c, bad = 0;
    optind = 1;
    opterr = 0;
    while (!bad && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model_dir = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_NAME: o->name = optarg; break;
        case O_PORT: bad = mmoe_cli_opt_i64("serve", "port", optarg, 0, 65535, &o->port); break;
        case O_CTX: bad = mmoe_cli_opt_i64("serve", "ctx-size", optarg, 1, INT64_C(1) << 40, &o->ctx_size); break;
        case O_THREADS: bad = mmoe_cli_opt_i64("serve", "threads", optarg, 1, 1024, &o->threads); break;
        case O_SEED: bad = mmoe_cli_opt_u64("serve", "seed", optarg, 0, INT64_MAX, &o->seed); break;
        case O_BODY: bad = mmoe_cli_opt_i64("serve", "max-body", optarg, 64, INT64_C(1) << 30, &o->max_body); break;
        case O_QUEUE: bad = mmoe_cli_opt_i64("serve", "max-queue", optarg, 1, 4096, &o->max_queue); break;
        case O_TIMEOUT: bad = mmoe_cli_opt_i64("serve", "timeout", optarg, 1, 86400, &o->timeout_s); break;
        case O_CONN: bad = mmoe_cli_opt_i64("serve", "max-connections", optarg, 2, 4096, &o->max_conn); break;
        case O_BACKEND:
            if (mmoe_backend_parse(optarg, &o->backend) != 0) {
                fprintf(stderr, "megamoe serve: --backend '%s': expected cpu, gpu or auto\n", optarg);
                bad = MMOE_EXIT_USAGE;
            }
            break;
        case O_GRAPH: bad = mmoe_cuda_graph_option("serve", optarg, &o->graph); break;
        case 'h': usage(stdout); return -1;
        default:
            mmoe_cli_bad_option("serve", optopt >= O_MODEL, argv[optind - 1]);
            usage(stderr);
            return MMOE_EXIT_USAGE;
        }
    }
    if (bad)
        return MMOE_EXIT_USAGE;
    const char *problem = optind < argc ? "unexpected argument" : o->model_dir == NULL ? "--model DIR is required" : NULL;
    if (problem != NULL) {
        fprintf(stderr, "megamoe serve: %s%s%s\n", problem, optind < argc ? ": " : "", optind < argc ? argv[optind] : "");
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    return mmoe_cuda_graph_resolve("serve", &o->graph, o->backend, 0);
}

/** The model's name: --name, else the last component of the model directory. */
static void model_name(const serve_options *o, char *buf, size_t len)
{
    if (o->name != NULL) {
        snprintf(buf, len, "%s", o->name);
        return;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", o->model_dir);
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = '\0';
    snprintf(buf, len, "%s", basename(dir));
}

/** Load, listen, wait for SIGINT/SIGTERM, stop. */
static mmoe_status serve(const serve_options *o, mmoe_error *err)
{
    struct stat sb;
    if (stat(o->model_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mmoe_error_set(err, MMOE_ENOTFOUND, "model directory '%s': %s", o->model_dir,
                              stat(o->model_dir, &sb) != 0 ? strerror(errno) : "not a directory");
    serve_server srv;
    memset(&srv, 0, sizeof srv);
    srv.model_dir = o->model_dir;
    srv.backend = o->backend;
    srv.cuda_graph = o->graph.on;
    srv.max_body = (size_t)o->max_body;
    srv.max_queue = (size_t)o->max_queue;
    srv.default_seed = o->seed;
    srv.started = time(NULL);
    srv.next_number = 1;
    model_name(o, srv.model_name, sizeof srv.model_name);
    pthread_mutex_init(&srv.lock, NULL);
    pthread_cond_init(&srv.changed, NULL);
    mmoe_cli_set_forward_threads((int)o->threads);

    /* SIGINT/SIGTERM are taken by sigwait() below: block them before any thread starts */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    serve_http *http = NULL;
    mmoe_status st = serve_engine_load(&srv, o->ctx_size, SERVE_DEFAULT_CTX, err);
    if (st == MMOE_OK)
        st = serve_engine_start(&srv, err);
    if (st == MMOE_OK)
        st = serve_http_start(&srv, o->host, (int)o->port, (unsigned)o->timeout_s, (unsigned)o->max_conn, &http, err);
    if (st == MMOE_OK) {
        const char *colon = strchr(o->host, ':') ? "[" : "";
        fprintf(stderr, "megamoe serve: listening on http://%s%s%s:%d (model %s, context %lld tokens; requests are "
                "served one at a time, in arrival order)\n", colon, o->host, colon[0] ? "]" : "",
                serve_http_port(http), srv.model_name, (long long)srv.ctx);
        if (srv.chat_refusal[0] != '\0')
            fprintf(stderr, "megamoe serve: /v1/chat/completions is refused: %s\n", srv.chat_refusal);
        fflush(stderr);
        int sig = 0;
        sigwait(&stop_signals, &sig);
        fprintf(stderr, "megamoe serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    serve_engine_stop(&srv); /* the running job ends, queued ones get 503, waiting connections wake */
    serve_http_stop(http);
    pthread_cond_destroy(&srv.changed);
    pthread_mutex_destroy(&srv.lock);
    return st;
}

int mmoe_cmd_serve(int argc, char **argv)
{
    serve_options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    mmoe_error err = {0};
    mmoe_status st = serve(&opt, &err);
    if (st != MMOE_OK) {
        fprintf(stderr, "megamoe serve: %s (%s)\n", err.msg, mmoe_status_name(st));
        return 1;
    }
    return 0;
}
