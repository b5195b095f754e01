/**
 * @file cmd_perplexity.c
 * @brief `megamoe perplexity`: how well the model predicts a text, with a sliding window.
 *
 *     megamoe perplexity --model DIR --text-file F [--ctx N] [--stride S] [--threads N] [--json]
 *
 * ## What is measured
 *
 * The file's text is tokenized as a whole (no BOS), giving tokens \f$t_0 \dots t_{T-1}\f$.
 * The model reads it in windows of at most N positions, each starting with BOS followed by
 * up to N - 1 text tokens; window k starts at text position \f$kS\f$.  Every text token is
 * scored exactly once, by the first window that contains it: window 0 scores all its
 * tokens (the first one predicted from BOS alone), a later window only the tokens past the
 * previous window's end, so each of them is predicted with at least N - 1 - S tokens of
 * context.  The windows stop once one reaches the end of the text.  With
 *
 * \f[ \mathrm{NLL}_i = -\log \mathrm{softmax}(z_i)_{t_i}, \qquad
 *     \mathrm{PPL} = \exp\Big(\frac{1}{n}\sum_{i} \mathrm{NLL}_i\Big) \f]
 *
 * over the n scored tokens (\f$z_i\f$ the logits of the position before \f$t_i\f$, all
 * vocabulary rows), the command prints the perplexity, n, and the mean NLL in nats.  The
 * log-softmax is computed in double from the FP32 logits.
 *
 * Defaults: N = min(512, the model's max_seq_len), S = (N - 1) / 2, so every token after the
 * first window has at least half a window of context.  (llama.cpp's `perplexity` uses
 * disjoint chunks and scores only the second half of each; with S = N - 1 this command
 * uses disjoint windows too but scores every token.)
 *
 * Each window runs from a fresh KV state, in forward calls of at most ::PPL_CHUNK positions
 * (the forward is row-independent and fixed-order, so the chunking does not change the
 * logits), so memory is PPL_CHUNK x vocab logits whatever N is.
 */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_cli.h"
#include "mmoe_clock.h"
#include "mmoe_json_report.h"
#include "mmoe_model.h"
#include "mmoe_tokenizer.h"

/** Positions per forward call inside a window. */
#define PPL_CHUNK 64

/** Default window (positions, BOS included) when the model allows it. */
#define PPL_DEFAULT_CTX 512

/** The command line, parsed. */
typedef struct ppl_options {
    const char *model_dir; /**< --model */
    const char *text_file; /**< --text-file */
    int64_t ctx;           /**< --ctx (0: default) */
    int64_t stride;        /**< --stride (0: default) */
    int64_t threads;       /**< --threads (0: the worker pool's default) */
    int json;              /**< --json */
} ppl_options;

/** The result. */
typedef struct ppl_result {
    int64_t text_tokens; /**< tokens of the file */
    int64_t scored;      /**< tokens scored */
    int64_t windows;     /**< windows run */
    double nll_sum;      /**< sum of the scored tokens' NLL (nats) */
    double seconds;      /**< wall time of the forwards */
} ppl_result;

/** Print the usage text of megamoe perplexity to @p out. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe perplexity --model DIR --text-file F [OPTIONS]\n"
            "  Perplexity of the text in F under the model, with a sliding window; every token is\n"
            "  scored once.\n"
            "  --ctx N          window in positions, BOS included, N >= 2 (default: min(%d, max_seq_len))\n"
            "  --stride S       window step in tokens, 1 <= S <= N - 1 (default (N - 1) / 2)\n"
            "  --threads N      worker threads of the forward (OpenBLAS then runs one), 1..1024 (default: MMOE_DEQUANT_THREADS, else the cores up to 16)\n"
            "  --json           the result as one JSON object on stdout (default: one human line)\n\n"
            "example:\n"
            "  megamoe perplexity --model fixtures/tiny-dsv4 --text-file notes.txt --ctx 256\n",
            PPL_DEFAULT_CTX);
}

/**
 * Parse the command line of megamoe perplexity into @p o (messages on stderr).
 * @return 0 to run, -1 after --help, or MMOE_EXIT_USAGE
 */
static int parse_options(int argc, char **argv, ppl_options *o)
{
    enum { O_MODEL = 256, O_TEXT, O_CTX, O_STRIDE, O_THREADS, O_JSON };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL}, {"text-file", required_argument, 0, O_TEXT},
        {"ctx", required_argument, 0, O_CTX},     {"stride", required_argument, 0, O_STRIDE},
        {"threads", required_argument, 0, O_THREADS}, {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    int c, bad = 0;
    optind = 1;
    opterr = 0;
    while (!bad && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: o->model_dir = optarg; break;
        case O_TEXT: o->text_file = optarg; break;
        case O_JSON: o->json = 1; break;
        case O_CTX: bad = mmoe_cli_opt_i64("perplexity", "ctx", optarg, 2, INT64_C(1) << 30, &o->ctx); break;
        case O_STRIDE: bad = mmoe_cli_opt_i64("perplexity", "stride", optarg, 1, INT64_C(1) << 30, &o->stride); break;
        case O_THREADS: bad = mmoe_cli_opt_i64("perplexity", "threads", optarg, 1, 1024, &o->threads); break;
        case 'h': usage(stdout); return -1;
        default:
            mmoe_cli_bad_option("perplexity", optopt >= O_MODEL, argv[optind - 1]);
            usage(stderr);
            return MMOE_EXIT_USAGE;
        }
    }
    if (bad)
        return MMOE_EXIT_USAGE;
    const char *problem = optind < argc ? "unexpected argument"
                          : o->model_dir == NULL ? "--model DIR is required"
                          : o->text_file == NULL ? "--text-file F is required"
                          : o->ctx > 0 && o->stride > o->ctx - 1 ? "--stride must be at most --ctx - 1"
                                                                  : NULL;
    if (problem != NULL) {
        fprintf(stderr, "megamoe perplexity: %s\n", problem);
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    return 0;
}

/** Read a whole file. */
static mmoe_status read_text(const char *path, mmoe_text *out, mmoe_error *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return mmoe_error_set(err, MMOE_EIO, "--text-file '%s': %s", path, strerror(errno));
    char buf[65536];
    size_t n;
    mmoe_status st = MMOE_OK;
    while (st == MMOE_OK && (n = fread(buf, 1, sizeof buf, f)) > 0)
        st = mmoe_text_append(out, buf, n);
    if (st == MMOE_OK && ferror(f))
        st = mmoe_error_set(err, MMOE_EIO, "--text-file '%s': read error", path);
    else if (st != MMOE_OK)
        st = mmoe_error_set(err, MMOE_ENOMEM, "--text-file '%s': out of memory", path);
    fclose(f);
    return st;
}

/** -log softmax(z)[target] in double. */
static double token_nll(const float *z, int64_t vocab, int32_t target)
{
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < vocab; i++)
        mx = fmax(mx, (double)z[i]);
    for (int64_t i = 0; i < vocab; i++)
        sum += exp((double)z[i] - mx);
    return mx + log(sum) - (double)z[target];
}

/**
 * One window: BOS + text[start, end), forward in chunks; score the text tokens at positions
 * [first, end) (first >= start).  Row j of the window predicts the text token at start + j.
 */
static mmoe_status run_window(mmoe_model *m, mmoe_model_state *s, const int32_t *text, int64_t start, int64_t end,
                              int64_t first, float *logits, ppl_result *r, mmoe_error *err)
{
    const mmoe_config *cfg = mmoe_model_config(m);
    int64_t n = 1 + (end - start); /* BOS + tokens */
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (ids == NULL)
        return mmoe_error_set(err, MMOE_ENOMEM, "out of memory");
    ids[0] = (int32_t)cfg->bos_token_id;
    memcpy(ids + 1, text + start, (size_t)(end - start) * sizeof *ids);
    mmoe_model_state_reset(s);
    mmoe_status st = MMOE_OK;
    /* the last row (predicting past the window) is never needed: run n - 1 rows */
    for (int64_t row = 0; st == MMOE_OK && row < n - 1; row += PPL_CHUNK) {
        int64_t rows = n - 1 - row < PPL_CHUNK ? n - 1 - row : PPL_CHUNK;
        st = mmoe_model_forward(m, s, ids + row, rows, logits, 0, NULL, err);
        for (int64_t j = 0; st == MMOE_OK && j < rows; j++) {
            int64_t pos = start + row + j; /* the text token this row predicts */
            if (pos >= first) {
                r->nll_sum += token_nll(logits + j * cfg->vocab_size, cfg->vocab_size, text[pos]);
                r->scored++;
            }
        }
    }
    free(ids);
    r->windows++;
    return st;
}

/** Tokenize, slide the windows, sum the NLL. */
static mmoe_status perplexity(const ppl_options *o, ppl_result *r, int64_t *ctx_out, int64_t *stride_out,
                              mmoe_error *err)
{
    memset(r, 0, sizeof *r);
    mmoe_tokenizer *tok = NULL;
    mmoe_model *m = NULL;
    mmoe_model_state *s = NULL;
    mmoe_text text = {0};
    mmoe_token_ids ids = {0};
    float *logits = NULL;
    mmoe_status st = read_text(o->text_file, &text, err);
    if (st == MMOE_OK)
        st = mmoe_tokenizer_load_dir(o->model_dir, &tok, err);
    if (st == MMOE_OK)
        st = mmoe_tokenizer_encode(tok, text.data ? text.data : "", text.len, 0, &ids, err);
    if (st == MMOE_OK && ids.n == 0)
        st = mmoe_error_set(err, MMOE_EINVAL, "--text-file '%s': no tokens to score", o->text_file);
    if (st == MMOE_OK)
        st = mmoe_model_open(o->model_dir, NULL, NULL, &m, err);
    int64_t ctx = 0, stride = 0;
    if (st == MMOE_OK) {
        const mmoe_config *cfg = mmoe_model_config(m);
        ctx = o->ctx > 0 ? o->ctx : cfg->max_seq_len < PPL_DEFAULT_CTX ? cfg->max_seq_len : PPL_DEFAULT_CTX;
        stride = o->stride > 0 ? o->stride : (ctx - 1) / 2 > 0 ? (ctx - 1) / 2 : 1;
        for (size_t i = 0; st == MMOE_OK && i < ids.n; i++)
            if (ids.ids[i] >= cfg->vocab_size)
                st = mmoe_error_set(err, MMOE_ESHAPE, "%s/tokenizer.json gives id %d but the model's vocab_size is "
                                    "%lld", o->model_dir, ids.ids[i], (long long)cfg->vocab_size);
        if (st == MMOE_OK && ctx > cfg->max_seq_len)
            st = mmoe_error_set(err, MMOE_ERANGE, "--ctx %lld: the model's max_seq_len is %lld", (long long)ctx,
                                (long long)cfg->max_seq_len);
        if (st == MMOE_OK && stride > ctx - 1)
            st = mmoe_error_set(err, MMOE_ERANGE, "--stride %lld: at most --ctx - 1 = %lld", (long long)stride,
                                (long long)(ctx - 1));
        if (st == MMOE_OK && (logits = malloc((size_t)PPL_CHUNK * (size_t)cfg->vocab_size * sizeof *logits)) == NULL)
            st = mmoe_error_set(err, MMOE_ENOMEM, "out of memory for %d x %lld logits", PPL_CHUNK,
                                (long long)cfg->vocab_size);
    }
    if (st == MMOE_OK)
        st = mmoe_model_state_create(m, ctx, &s, err);
    r->text_tokens = (int64_t)ids.n;
    double t0 = mmoe_clock_s();
    int64_t scored_until = 0; /* text positions [0, scored_until) are scored */
    for (int64_t start = 0; st == MMOE_OK && scored_until < (int64_t)ids.n; start += stride) {
        int64_t end = start + ctx - 1 < (int64_t)ids.n ? start + ctx - 1 : (int64_t)ids.n;
        st = run_window(m, s, ids.ids, start, end, scored_until, logits, r, err);
        scored_until = end;
    }
    r->seconds = mmoe_clock_s() - t0;
    *ctx_out = ctx;
    *stride_out = stride;
    free(logits);
    mmoe_model_state_destroy(s);
    mmoe_model_close(m);
    mmoe_token_ids_free(&ids);
    mmoe_tokenizer_free(tok);
    mmoe_text_free(&text);
    return st;
}

int mmoe_cmd_perplexity(int argc, char **argv)
{
    ppl_options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    mmoe_cli_set_forward_threads((int)opt.threads);
    mmoe_error err = {0};
    ppl_result r;
    int64_t ctx = 0, stride = 0;
    mmoe_status st = perplexity(&opt, &r, &ctx, &stride, &err);
    if (st == MMOE_OK) {
        double nll = r.nll_sum / (double)r.scored, ppl = exp(nll);
        if (opt.json) {
            json_t *o = json_object();
            json_object_set_new(o, "type", json_string("perplexity"));
            mmoe_json_set_str(o, "text_file", opt.text_file);
            mmoe_json_set_real(o, "perplexity", ppl);
            mmoe_json_set_real(o, "nll_mean_nats", nll);
            mmoe_json_set_int(o, "tokens_scored", r.scored);
            mmoe_json_set_int(o, "text_tokens", r.text_tokens);
            mmoe_json_set_int(o, "windows", r.windows);
            mmoe_json_set_int(o, "ctx_tokens", ctx);
            mmoe_json_set_int(o, "stride_tokens", stride);
            mmoe_json_set_real(o, "seconds", r.seconds);
            st = mmoe_json_print_line(stdout, o, &err);
        } else {
            printf("perplexity: %.4f over %lld tokens scored (of %lld; mean NLL %.4f nats/token; %lld windows of "
                   "up to %lld positions, stride %lld; %.2f s)\n", ppl, (long long)r.scored,
                   (long long)r.text_tokens, nll, (long long)r.windows, (long long)ctx, (long long)stride, r.seconds);
        }
    }
    if (st != MMOE_OK) {
        fprintf(stderr, "megamoe perplexity: %s (%s)\n", err.msg, mmoe_status_name(st));
        return 1;
    }
    return 0;
}
