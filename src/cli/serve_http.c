/**
 * @file serve_http.c
 * @brief `megamoe serve`: the HTTP side on libmicrohttpd (routes, bodies, server-sent events).
 *
 * ## Routes
 *
 * | method and path | answer |
 * | --- | --- |
 * | `GET /health` | `{"status": "ok", "model", "queued", "busy", "served", "cancelled", "scheduling"}` |
 * | `GET /v1/models` | the one model: `{"object": "list", "data": [{"id", "object": "model", "context_length", ...}]}` |
 * | `POST /v1/completions` | a `text_completion` (serve_request.c) |
 * | `POST /v1/chat/completions` | a `chat.completion` |
 *
 * Anything else gets 404 (unknown path) or 405 (known path, other method), in OpenAI's
 * error shape like every error.
 *
 * ## Connections
 *
 * libmicrohttpd runs a thread per connection, so a connection may wait (for its turn in
 * the queue, for the next token) without holding up the others: /health answers while a
 * long generation runs.  Limits, each answered cleanly: a body larger than --max-body
 * bytes gets 413 (at once when Content-Length announces it, else as soon as the bytes
 * pass the limit, the rest being read and dropped); a full queue gets 503; a connection
 * silent for --timeout seconds (headers or body that never finish) is closed by
 * libmicrohttpd; at most --max-connections connections are open at once.
 *
 * ## Streams and disconnects
 *
 * With `"stream": true` the answer is `text/event-stream`: `data: {chunk}` events as the
 * text grows, a last chunk with the finish reason (and one with the usage when asked), then
 * `data: [DONE]`.  The status line is sent only once the worker has accepted the prompt,
 * so a refused prompt (context too long) still gets its 400.  While a connection waits it
 * checks its socket every ::SERVE_POLL_MS milliseconds: a client that hung up cancels its
 * job, which frees the worker at the next token (or skips the job if still queued).
 */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "serve_internal.h"

/** How often a waiting connection looks at its socket for a hang-up (milliseconds). */
#define SERVE_POLL_MS 200

/** How the queue is served (shown by /health and /v1/models). */
#define SERVE_SCHEDULING "fifo, one request at a time"

/** The HTTP front end: the libmicrohttpd daemon and the server it feeds. */
struct serve_http {
    struct MHD_Daemon *daemon; /**< the listening daemon */
    serve_server *srv;         /**< the server (borrowed) */
    int port;                  /**< the bound port */
};

/** Per-request state of a connection (libmicrohttpd's con_cls). */
typedef struct conn_state {
    serve_kind kind;  /**< the generation endpoint (POST) */
    mmoe_text body;   /**< the body so far */
    int too_big;      /**< the body passed --max-body: dropped, answered 413 */
} conn_state;

/** A streamed answer: the job and what of its text was framed already. */
typedef struct sse_stream {
    serve_server *srv; /**< the server */
    serve_job *job;    /**< the job (one reference) */
    int fd;            /**< the connection's socket (hang-up checks) */
    size_t sent;       /**< bytes of job->text framed */
    int role_sent;     /**< chat: the first chunk (role) was framed */
    int finished;      /**< the last events were framed */
    mmoe_text frames;  /**< framed bytes not yet handed to libmicrohttpd */
    size_t off;        /**< how many of them were handed */
} sse_stream;

/** Send @p obj (reference taken) as a JSON answer with @p status. */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *obj)
{
    char *text = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (text == NULL) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        text = strdup(oom);
        status = MHD_HTTP_INTERNAL_SERVER_ERROR;
        if (text == NULL)
            return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/** Send an OpenAI error. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type, const char *code,
                                  const char *message)
{
    return send_json(c, status, serve_error_json(message, type, NULL, code));
}

/** The socket of a connection. */
static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci != NULL ? ci->connect_fd : -1;
}

/** Nonzero when the peer of @p fd hung up (or the socket failed). */
static int client_gone(int fd)
{
    if (fd < 0)
        return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/** Wait on the server's condition for at most SERVE_POLL_MS (lock held). */
static void wait_a_little(serve_server *srv)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += SERVE_POLL_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&srv->changed, &srv->lock, &until);
}

/**
 * Wait (lock held) while the job is queued, or also while it runs when @p until_done.
 * @return 0, or -1 when the client hung up (the job is then cancelled)
 */
static int wait_job_locked(serve_server *srv, serve_job *job, int fd, int until_done)
{
    while (job->state == SERVE_JOB_QUEUED || (until_done && job->state == SERVE_JOB_RUNNING)) {
        wait_a_little(srv);
        if (client_gone(fd)) {
            job->cancelled = 1;
            return -1;
        }
    }
    return 0;
}

/** Append one server-sent event `data: TEXT\n\n` with @p obj serialized (reference taken). */
static void frame_json(sse_stream *s, json_t *obj)
{
    char *text = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (text == NULL)
        text = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    mmoe_text_append(&s->frames, "data: ", 6);
    if (text != NULL)
        mmoe_text_append(&s->frames, text, strlen(text));
    mmoe_text_append(&s->frames, "\n\n", 2);
    free(text);
}

/**
 * Frame what is new in the job: the text since the last call, and once the job ended the
 * last chunk (finish reason, usage) and `[DONE]`.  Blocks until there is something.
 * @return 0, or -1 when the client hung up
 */
static int frame_next(sse_stream *s)
{
    serve_server *srv = s->srv;
    serve_job *job = s->job;
    if (job->req.kind == SERVE_CHAT && !s->role_sent) {
        s->role_sent = 1;
        frame_json(s, serve_chunk_json(srv, job, "", 0, 1, NULL));
        return 0;
    }
    pthread_mutex_lock(&srv->lock);
    while (job->text.len == s->sent && job->state == SERVE_JOB_RUNNING) {
        wait_a_little(srv);
        if (client_gone(s->fd)) {
            job->cancelled = 1;
            pthread_mutex_unlock(&srv->lock);
            return -1;
        }
    }
    size_t n = job->text.len - s->sent;
    char *delta = n > 0 ? malloc(n) : NULL;
    if (delta != NULL)
        memcpy(delta, job->text.data + s->sent, n);
    s->sent = job->text.len;
    serve_job_state state = job->state;
    pthread_mutex_unlock(&srv->lock);
    if (delta != NULL)
        frame_json(s, serve_chunk_json(srv, job, delta, n, 0, NULL));
    free(delta);
    if (state == SERVE_JOB_DONE) {
        frame_json(s, serve_chunk_json(srv, job, "", 0, 0, job->finish_reason));
        if (job->req.include_usage)
            frame_json(s, serve_usage_chunk_json(srv, job));
    } else if (state == SERVE_JOB_FAILED) {
        frame_json(s, json_incref(job->error));
    }
    if (state == SERVE_JOB_DONE || state == SERVE_JOB_FAILED) {
        mmoe_text_append(&s->frames, "data: [DONE]\n\n", 14);
        s->finished = 1;
    }
    return 0;
}

/** libmicrohttpd's content reader of a stream: hand out framed bytes, framing more when none are left. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    sse_stream *s = cls;
    (void)pos;
    while (s->off == s->frames.len) {
        s->frames.len = 0;
        s->off = 0;
        if (s->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (frame_next(s) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->frames.len - s->off < max ? s->frames.len - s->off : max;
    memcpy(buf, s->frames.data + s->off, n);
    s->off += n;
    return (ssize_t)n;
}

/** The stream is over (sent, or the connection closed): cancel an unfinished job, let go of it. */
static void sse_free(void *cls)
{
    sse_stream *s = cls;
    serve_job_cancel(s->srv, s->job);
    serve_job_release(s->srv, s->job);
    mmoe_text_free(&s->frames);
    free(s);
}

/** Start the streamed answer of a running job (the stream takes the connection's job reference). */
static enum MHD_Result send_stream(struct MHD_Connection *c, serve_server *srv, serve_job *job)
{
    sse_stream *s = calloc(1, sizeof *s);
    if (s == NULL) {
        serve_job_cancel(srv, job);
        serve_job_release(srv, job);
        return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, "out of memory");
    }
    s->srv = srv;
    s->job = job;
    s->fd = conn_fd(c);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, s, sse_free);
    if (r == NULL) {
        sse_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/** A finished or failed job's answer (lock not held; the job will not change any more). */
static enum MHD_Result send_result(struct MHD_Connection *c, serve_server *srv, serve_job *job)
{
    enum MHD_Result ret = job->state == SERVE_JOB_FAILED
                              ? send_json(c, (unsigned)job->http_status, json_incref(job->error))
                              : send_json(c, MHD_HTTP_OK, serve_answer_json(srv, job));
    serve_job_release(srv, job);
    return ret;
}

/** Parse, queue, wait, answer: the last call of a generation request. */
static enum MHD_Result handle_generation(struct MHD_Connection *c, serve_server *srv, conn_state *cs)
{
    if (cs->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", srv->max_body);
        return send_error(c, 413 /* Content Too Large */, "invalid_request_error", "body_too_large", msg);
    }
    serve_request req;
    json_t *error = NULL;
    if (serve_request_parse(cs->body.data ? cs->body.data : "", cs->body.len, cs->kind, srv->default_seed, &req,
                            &error) != MMOE_OK)
        return send_json(c, MHD_HTTP_BAD_REQUEST, error);
    int stream = req.stream;
    serve_job *job = serve_engine_submit(srv, &req);
    if (job == NULL) {
        serve_request_free(&req);
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "queue_full",
                          "the request queue is full or the server is stopping; retry later");
    }
    int fd = conn_fd(c);
    pthread_mutex_lock(&srv->lock);
    int gone = wait_job_locked(srv, job, fd, !stream);
    serve_job_state state = job->state;
    pthread_mutex_unlock(&srv->lock);
    if (gone) {
        serve_job_release(srv, job);
        return MHD_NO; /* nobody to answer: close */
    }
    if (stream && state != SERVE_JOB_FAILED) /* running, or already done: the stream catches up */
        return send_stream(c, srv, job);
    return send_result(c, srv, job);
}

/** GET /health. */
static json_t *health_json(serve_server *srv)
{
    pthread_mutex_lock(&srv->lock);
    json_t *o = json_pack("{s:s, s:s, s:I, s:b, s:I, s:I, s:s}", "status", srv->stopping ? "stopping" : "ok",
                          "model", srv->model_name, "queued", (json_int_t)srv->n_queued, "busy", srv->busy, "served",
                          (json_int_t)srv->n_served, "cancelled", (json_int_t)srv->n_cancelled, "scheduling",
                          SERVE_SCHEDULING);
    pthread_mutex_unlock(&srv->lock);
    return o;
}

/** GET /v1/models. */
static json_t *models_json(const serve_server *srv)
{
    return json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:I, s:s}]}", "object", "list", "data", "id", srv->model_name,
                     "object", "model", "created", (json_int_t)srv->started, "owned_by", "megamoe", "context_length",
                     (json_int_t)srv->ctx, "scheduling", SERVE_SCHEDULING);
}

/** The first call of a request: route it; POST bodies are then received by later calls. */
static enum MHD_Result route(struct MHD_Connection *c, serve_server *srv, conn_state *cs, const char *url,
                             const char *method)
{
    int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0, post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    int health = strcmp(url, "/health") == 0, models = strcmp(url, "/v1/models") == 0;
    int completions = strcmp(url, "/v1/completions") == 0, chat = strcmp(url, "/v1/chat/completions") == 0;
    char msg[300];
    if (get && health)
        return send_json(c, MHD_HTTP_OK, health_json(srv));
    if (get && models)
        return send_json(c, MHD_HTTP_OK, models_json(srv));
    if (post && (completions || chat)) {
        cs->kind = chat ? SERVE_CHAT : SERVE_COMPLETION;
        const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (len != NULL && strtoull(len, NULL, 10) > srv->max_body)
            cs->too_big = 1; /* answered 413 once the body is (dropped and) complete */
        return MHD_YES;
    }
    if (health || models || completions || chat) {
        snprintf(msg, sizeof msg, "%s is not allowed on %.200s", method, url);
        return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", msg);
    }
    snprintf(msg, sizeof msg, "no route for %.16s %.200s", method, url);
    return send_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error", "not_found", msg);
}

/** libmicrohttpd's access handler: called once with the headers, then per body piece, then at the end. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    serve_http *h = cls;
    conn_state *cs = *con_cls;
    (void)version;
    if (cs == NULL) {
        if ((cs = calloc(1, sizeof *cs)) == NULL)
            return MHD_NO;
        *con_cls = cs;
        return route(c, h->srv, cs, url, method);
    }
    if (*upload_data_size > 0) {
        if (!cs->too_big && cs->body.len + *upload_data_size > h->srv->max_body) {
            cs->too_big = 1;
            mmoe_text_free(&cs->body);
        }
        if (!cs->too_big && mmoe_text_append(&cs->body, upload_data, *upload_data_size) != MMOE_OK)
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    return handle_generation(c, h->srv, cs);
}

/** libmicrohttpd's end-of-request callback: free the per-request state. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    conn_state *cs = *con_cls;
    if (cs != NULL) {
        mmoe_text_free(&cs->body);
        free(cs);
    }
    *con_cls = NULL;
}

mmoe_status serve_http_start(serve_server *srv, const char *host, int port, unsigned timeout_s, unsigned max_conn,
                             serve_http **out, mmoe_error *err)
{
    *out = NULL;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port_text, &hints, &ai);
    if (gai != 0)
        return mmoe_error_set(err, MMOE_EINVAL, "--host '%s': %s", host, gai_strerror(gai));
    serve_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        freeaddrinfo(ai);
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    }
    h->srv = srv;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_CONNECTION_TIMEOUT, timeout_s, MHD_OPTION_CONNECTION_LIMIT, max_conn,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (h->daemon == NULL) {
        free(h);
        return mmoe_error_set(err, MMOE_EIO, "cannot listen on %s port %d (in use, or not an address of "
                              "this machine?)", host, port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di != NULL ? di->port : port;
    *out = h;
    return MMOE_OK;
}

int serve_http_port(const serve_http *h)
{
    return h->port;
}

void serve_http_stop(serve_http *h)
{
    if (h == NULL)
        return;
    MHD_stop_daemon(h->daemon);
    free(h);
}
