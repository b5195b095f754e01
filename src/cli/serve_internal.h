/**
 * @file serve_internal.h
 * @brief `megamoe serve`: the OpenAI-compatible HTTP server's parts (requests, queue, HTTP).
 *
 * ## Threads and ownership
 *
 * libmicrohttpd runs one thread per connection (plus its listening thread); those threads
 * parse and check the request bodies (serve_request.c) and wait.  One **worker** thread
 * (serve_engine.c) owns the model, its KV state, the tokenizer and the generation session:
 * it takes jobs from a FIFO queue and runs them one at a time, so requests are served in
 * arrival order, never batched, and a request's answer is exactly what `megamoe generate`
 * would produce for it.  Everything shared between the threads (the queue, each job's
 * state, its text so far) is guarded by the server's one mutex; the condition variable is
 * broadcast whenever a job changes.
 *
 * A job is shared by the connection that submitted it and the worker: it holds a reference
 * count, and the last one to let go frees it.  A connection that goes away marks its job
 * cancelled: a queued job is then skipped, a running one stops at its next token (the
 * slot is free for the next request).
 */
#ifndef MMOE_SERVE_INTERNAL_H
#define MMOE_SERVE_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "mmoe_fwd_backend.h"
#include "mmoe_error.h"
#include "mmoe_generate.h"
#include "mmoe_model.h"
#include "mmoe_sampler.h"
#include "mmoe_tokenizer.h"

/** Most stop strings per request (OpenAI's limit). */
#define SERVE_MAX_STOPS 4

/** Most log-probability alternatives per token (chat's top_logprobs limit; completions allow 5). */
#define SERVE_MAX_LOGPROBS 20

/** The two generation endpoints. */
typedef enum serve_kind {
    SERVE_COMPLETION = 1, /**< POST /v1/completions: raw text, BOS + the prompt's tokens */
    SERVE_CHAT            /**< POST /v1/chat/completions: the DeepSeek-V4 chat encoding */
} serve_kind;

/** A request body, parsed and checked (serve_request_parse()). */
typedef struct serve_request {
    serve_kind kind;                   /**< which endpoint */
    char *prompt;                      /**< completion: the prompt (owned) */
    char *messages;                    /**< chat: the messages array as JSON text (owned) */
    int64_t max_tokens;                /**< most tokens to generate; -1: up to the context */
    mmoe_sampler_params sampling;      /**< temperature, top_p, top_k, min_p, repeat_penalty, seed */
    char *stops[SERVE_MAX_STOPS];      /**< stop strings (owned) */
    size_t n_stops;                    /**< how many */
    int stream;                        /**< answer as server-sent events */
    int include_usage;                 /**< stream_options.include_usage: a last chunk with the usage */
    int logprobs;                      /**< -1: none; else the alternatives per token (0..SERVE_MAX_LOGPROBS) */
} serve_request;

/** A request's life in the queue. */
typedef enum serve_job_state {
    SERVE_JOB_QUEUED = 0, /**< waiting for the worker */
    SERVE_JOB_RUNNING,    /**< prompt accepted, tokens being generated (an HTTP 200 can be sent) */
    SERVE_JOB_DONE,       /**< finished: text, finish reason and usage are final */
    SERVE_JOB_FAILED      /**< refused or failed: http_status and error hold the answer */
} serve_job_state;

/** One request in the queue, shared by its connection and the worker (guarded by the server's lock). */
typedef struct serve_job {
    serve_request req;        /**< what was asked (owned) */
    int refs;                 /**< references: the connection's and the worker's */
    serve_job_state state;    /**< where it is */
    int cancelled;            /**< the client went away: skip or stop */
    int64_t number;           /**< the request's number (ids "cmpl-N", "chatcmpl-N") */
    time_t created;           /**< when it was accepted (the "created" field) */
    mmoe_text text;           /**< the answer so far: complete UTF-8, stop strings cut */
    json_t *lp_tokens;        /**< logprobs >= 0: per generated token {"text", "bytes", "logprob",
                                   "top": [{"text", "bytes", "logprob"}]} (built by the worker) */
    int64_t prompt_tokens;    /**< usage: tokens of the prompt */
    int64_t completion_tokens;/**< usage: tokens generated (EOS not counted) */
    const char *finish_reason;/**< "stop" (EOS or a stop string) or "length" (max_tokens, context) */
    int http_status;          /**< FAILED: the HTTP status */
    json_t *error;            /**< FAILED: the OpenAI error object (owned) */
    struct serve_job *next;   /**< queue link */
} serve_job;

/** The server: the model side (worker only) and the shared queue (under lock). */
typedef struct serve_server {
    /* set at start, read-only afterwards */
    const char *model_dir;        /**< --model */
    char model_name[256];         /**< the name in /v1/models and the answers */
    int64_t ctx;                  /**< context size of the KV state (tokens) */
    size_t max_body;              /**< largest accepted request body (bytes) */
    size_t max_queue;             /**< most requests waiting at once (more: HTTP 503) */
    uint64_t default_seed;        /**< seed of requests that give none */
    char chat_refusal[1100];      /**< why chat requests are refused ("" when the chat encoding works) */
    time_t started;               /**< server start (the model's "created") */
    /* the worker's own */
    mmoe_tokenizer *tok;          /**< DIR/tokenizer.json */
    mmoe_model *model;            /**< the checkpoint */
    mmoe_model_state *state;      /**< the KV state, reset per request */
    mmoe_backend backend;         /**< --backend: where the forward runs */
    int cuda_graph;               /**< --cuda-graph: the GPU's decode steps as graph replays */
    mmoe_gpu_model *gpu;          /**< the model on the GPU (--backend gpu/auto found one), else NULL */
    mmoe_gen_session session;     /**< the generation loop */
    int have_session;             /**< session initialised */
    pthread_t worker;             /**< the worker thread */
    int have_worker;              /**< worker started */
    /* shared, under lock */
    pthread_mutex_t lock;         /**< guards everything below and every job */
    pthread_cond_t changed;       /**< broadcast on every job or queue change */
    serve_job *head;              /**< the FIFO queue: oldest job */
    serve_job *tail;              /**< the FIFO queue: newest job */
    size_t n_queued;              /**< jobs in it */
    int busy;                     /**< the worker is running a job */
    int stopping;                 /**< shutdown: the worker ends, waiters give up */
    int64_t next_number;          /**< number of the next accepted request */
    int64_t n_served;             /**< requests finished (DONE) */
    int64_t n_cancelled;          /**< requests skipped or stopped early because their client went away */
} serve_server;

/* serve_request.c */

/**
 * Parse and check a request body for @p kind.  On failure *@p error receives an OpenAI
 * error object (type invalid_request_error, param naming the field) for HTTP 400.
 * @param body          the request body (not NUL-terminated)
 * @param len           its length
 * @param kind          the endpoint
 * @param default_seed  the seed of a request that gives none
 * @param req           receives the request (free with serve_request_free())
 * @param error         receives the error object on failure (the caller owns it)
 * @return MMOE_OK or MMOE_EFORMAT
 */
mmoe_status serve_request_parse(const char *body, size_t len, serve_kind kind, uint64_t default_seed,
                                serve_request *req, json_t **error);

/** Free what a parsed request owns. */
void serve_request_free(serve_request *req);

/** An OpenAI error object {"error": {message, type, param, code}} (param and code may be NULL). */
json_t *serve_error_json(const char *message, const char *type, const char *param, const char *code);

/** The whole non-streamed answer of a finished job (text_completion or chat.completion). */
json_t *serve_answer_json(const serve_server *srv, const serve_job *job);

/**
 * One streamed chunk of a job (text_completion or chat.completion.chunk): @p delta text
 * (may be empty), @p role in the first chat chunk, @p finish_reason in the last.
 */
json_t *serve_chunk_json(const serve_server *srv, const serve_job *job, const char *delta, size_t len, int role,
                         const char *finish_reason);

/** The last streamed chunk when stream_options.include_usage: no choices, the usage. */
json_t *serve_usage_chunk_json(const serve_server *srv, const serve_job *job);

/* serve_engine.c */

/**
 * Load tokenizer and model, create state and session (before the worker starts).
 * @param srv          the server (model_dir set)
 * @param ctx_size     the context (--ctx-size); 0: min(config max_seq_len, @p default_ctx)
 * @param default_ctx  the default context cap
 * @param err          message on failure
 */
mmoe_status serve_engine_load(serve_server *srv, int64_t ctx_size, int64_t default_ctx, mmoe_error *err);

/** Start the worker thread. */
mmoe_status serve_engine_start(serve_server *srv, mmoe_error *err);

/** Stop the worker (queued jobs fail with 503) and release the model side. */
void serve_engine_stop(serve_server *srv);

/**
 * Queue a job for @p req (moved into the job: the caller's copy is emptied).  The job
 * starts with two references (the caller's and the worker's).
 * @return the job, or NULL when the queue is full or the server is stopping
 */
serve_job *serve_engine_submit(serve_server *srv, serve_request *req);

/** Mark the job cancelled (its client went away). Takes the lock. */
void serve_job_cancel(serve_server *srv, serve_job *job);

/** Drop one reference (the last frees the job). Takes the lock. */
void serve_job_release(serve_server *srv, serve_job *job);

/* serve_http.c */

/** The HTTP side: listening daemon over @p srv. */
typedef struct serve_http serve_http;

/**
 * Listen on @p host : @p port (port 0: any free port) with libmicrohttpd.
 * @param srv        the server (its worker started)
 * @param host       the address to bind (name or numeric, IPv4 or IPv6)
 * @param port       the TCP port, 0: any free one
 * @param timeout_s  seconds of silence after which a connection is closed
 * @param max_conn   most connections at once
 * @param out        receives the HTTP side (free with serve_http_stop())
 * @param err        message on failure
 */
mmoe_status serve_http_start(serve_server *srv, const char *host, int port, unsigned timeout_s, unsigned max_conn,
                             serve_http **out, mmoe_error *err);

/** The port actually bound. */
int serve_http_port(const serve_http *h);

/** Stop listening and close every connection. */
void serve_http_stop(serve_http *h);

#endif /* MMOE_SERVE_INTERNAL_H */
