/**
 * @file test_ep_gpu_forward.c
 * @brief Suite "ep_gpu_forward": the whole GPU forward over N ranks (mmoe_ep_gpu_forward.h)
 *        against the one-GPU forward, bit for bit (the GPU cases skip, exit 77, without a GPU).
 *
 * The reference is the unsplit GPU forward (mmoe_gpu_model_forward()): the claim under test is
 * that splitting the routed experts over ranks changes no bit of the logits, so the one-GPU
 * logits are the independent result to match, exactly.  Each model runs one sequence: a
 * prefill of a prompt (all positions' logits and the final streams), two decode steps (one
 * token per call: the MoE sub-layers then have 2 routed pairs, so with 3 ranks at least one
 * rank gets no pair in every layer of those calls), and the MTP block over the prompt's
 * streams; then a reset and the prefill again.
 *
 *  - the embedded tiny model (fixtures/tiny-dsv4: hash layers, every attention type, MTP; 8
 *    experts of top 2): NCCL with one rank (the communicator logits/generate use), in-process
 *    with 1, 2 and 3 ranks sharing GPU 0 (ncclCommInitAll refuses one device twice; the
 *    in-process communicator runs the same forward code);
 *  - a fresh synth-model checkpoint (seed printed) of the "tiny" preset, 3 layers, with 7
 *    experts: an uneven split (4 + 3, 3 + 2 + 2);
 *  - the statistics: every routed pair computed once (pairs add up to tokens x topk per MoE
 *    sub-layer), with 3 ranks some rank idle in some exchange, and every rank's exchange time
 *    of every sub-layer (MTP included) positive;
 *  - the CLI: `logits --gpus 1 --mtp` writes the same logits and MTP logits (bytes) as
 *    `logits --backend gpu`, and `generate --gpus 1` the same greedy ids as `--backend gpu`;
 *    `--gpus N` with N above the GPUs present is refused before loading;
 *  - `bench forward --gpus 1`: the JSON report's keys, and its counts derived by hand (4 layers,
 *    top 2: per phase one exchange per layer and call, tokens x 2 x 4 routed pairs on the one
 *    rank, no bytes sent), a positive exchange time per layer; the text report's lines.
 *
 * Without a GPU: N above the experts is refused before any device is touched, a creation
 * names the rank and the missing device, and the CLI refuses `--gpus` with a contradicting
 * `--backend` (exit 2) and `--gpus 1` without a GPU (exit 1, no output file).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "ep_internal.h"
#include "mmoe_config.h"
#include "mmoe_ep_gpu_forward.h"
#include "mmoe_gpu_forward.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_model.h"
#include "mmoe_safetensors.h"
#include "mmoe_synth_model.h"
#include "mmoe_test.h"

static uint64_t g_seed;
static char g_tmp[1024];

/** The prompt and the two decode steps. */
static const int32_t k_prompt[] = {0, 20, 21, 22, 23, 24, 25, 26, 27};
static const int32_t k_next[] = {28, 29};
enum { T_PROMPT = sizeof k_prompt / sizeof k_prompt[0], T_NEXT = sizeof k_next / sizeof k_next[0] };

static void tiny_dir(char *buf, size_t n)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(buf, n, "%s/fixtures/tiny-dsv4", src ? src : ".");
}

/** The outputs of one sequence. */
typedef struct seq_out {
    float *logits;  /**< [(T_PROMPT + T_NEXT + T_PROMPT), V]: prefill, decodes, prefill after reset */
    float *mtp;     /**< [T_PROMPT - 1, V] */
    size_t n, n_mtp;
} seq_out;

/** Either forward: one GPU (@p g) or N ranks (@p e). */
static mmoe_status fwd(mmoe_gpu_model *g, mmoe_ep_gpu_model *e, const int32_t *ids, int64_t T, float *logits,
                       uint16_t *streams, mmoe_error *err)
{
    return e ? mmoe_ep_gpu_model_forward(e, ids, T, logits, 0, streams, err)
             : mmoe_gpu_model_forward(g, ids, T, logits, 0, streams, err);
}

/** The sequence of the file comment on @p g or @p e. */
static seq_out run_seq(const mmoe_config *cfg, mmoe_gpu_model *g, mmoe_ep_gpu_model *e)
{
    const int64_t V = cfg->vocab_size;
    seq_out o;
    o.n = (size_t)((2 * T_PROMPT + T_NEXT) * V);
    o.n_mtp = (size_t)((T_PROMPT - 1) * V);
    o.logits = malloc(sizeof(float) * o.n);
    o.mtp = malloc(sizeof(float) * o.n_mtp);
    uint16_t *streams = malloc(2 * (size_t)(T_PROMPT * cfg->hc_mult * cfg->dim));
    ck_assert(o.logits && o.mtp && streams);
    mmoe_test_poison_f32(o.logits, o.n);
    mmoe_test_poison_f32(o.mtp, o.n_mtp);
    mmoe_error err;
    ck_assert_msg(fwd(g, e, k_prompt, T_PROMPT, o.logits, streams, &err) == MMOE_OK, "%s", err.msg);
    for (int i = 0; i < T_NEXT; i++)
        ck_assert_msg(fwd(g, e, k_next + i, 1, o.logits + (T_PROMPT + i) * V, NULL, &err) == MMOE_OK, "%s", err.msg);
    mmoe_status st = e ? mmoe_ep_gpu_model_mtp_forward(e, streams, k_prompt + 1, T_PROMPT - 1, o.mtp, &err)
                       : mmoe_gpu_model_mtp_forward(g, streams, k_prompt + 1, T_PROMPT - 1, o.mtp, &err);
    ck_assert_msg(st == MMOE_OK, "%s", err.msg);
    st = e ? mmoe_ep_gpu_model_reset(e, &err) : mmoe_gpu_model_reset(g, &err);
    ck_assert_msg(st == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(e ? mmoe_ep_gpu_model_pos(e) : mmoe_gpu_model_pos(g), 0);
    ck_assert_msg(fwd(g, e, k_prompt, T_PROMPT, o.logits + (T_PROMPT + T_NEXT) * V, NULL, &err) == MMOE_OK, "%s",
                  err.msg);
    free(streams);
    return o;
}

static void seq_free(seq_out *o)
{
    free(o->logits);
    free(o->mtp);
}

/** The first differing float of two arrays, or -1. */
static long long first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return (long long)i;
    return -1;
}

/**
 * Model @p dir: the one-GPU sequence, then each (kind, N) of the list: the same bits, and the
 * statistics of the file comment.
 */
static void check_model(const char *what, const char *dir, const mmoe_ep_comm_kind *kinds, const int *ranks, int n_cases)
{
    mmoe_model *m = mmoe_test_open_model(dir);
    const mmoe_config *cfg = mmoe_model_config(m);
    mmoe_error err;
    mmoe_gpu_model *g = NULL;
    ck_assert_msg(mmoe_gpu_model_create(m, 64, 16, &g, &err) == MMOE_OK, "%s", err.msg);
    seq_out ref = run_seq(cfg, g, NULL);
    mmoe_gpu_model_destroy(g);
    for (int c = 0; c < n_cases; c++) {
        mmoe_ep_gpu_model *e = NULL;
        ck_assert_msg(mmoe_ep_gpu_model_create(m, ranks[c], kinds[c], 64, 16, &e, &err) == MMOE_OK, "%s: %s x %d: %s",
                      what, mmoe_ep_comm_kind_name(kinds[c]), ranks[c], err.msg);
        seq_out got = run_seq(cfg, NULL, e);
        const long long d = first_diff(got.logits, ref.logits, ref.n), dm = first_diff(got.mtp, ref.mtp, ref.n_mtp);
        ck_assert_msg(d < 0, "%s: %s x %d: logit %lld (row %lld): %a, one GPU %a", what,
                      mmoe_ep_comm_kind_name(kinds[c]), ranks[c], d, d / cfg->vocab_size, (double)got.logits[d < 0 ? 0 : d],
                      (double)ref.logits[d < 0 ? 0 : d]);
        ck_assert_msg(dm < 0, "%s: %s x %d: MTP logit %lld differs", what, mmoe_ep_comm_kind_name(kinds[c]), ranks[c], dm);
        /* every routed pair once: per main call tokens x topk x layers, per MTP call rows x topk */
        mmoe_ep_gpu_stats s;
        mmoe_ep_gpu_model_stats(e, &s);
        const int64_t k = cfg->n_activated_experts, L = cfg->n_layers;
        const int64_t calls_main = 1 + T_NEXT + 1, pairs_main = (2 * T_PROMPT + T_NEXT) * k * L,
                      pairs_mtp = (T_PROMPT - 1) * k;
        ck_assert_int_eq(s.exchanges, calls_main * L + 1);
        int64_t total = 0, idle = 0;
        for (int r = 0; r < ranks[c]; r++) {
            total += s.pairs[r];
            idle += s.idle[r];
        }
        ck_assert_int_eq(total, pairs_main + pairs_mtp);
        if (ranks[c] == 3)
            ck_assert_int_ge(idle, T_NEXT * L); /* a decode step's 2 pairs leave a rank out */
        /* every rank took part in every sub-layer's exchanges (MTP last): each has a time > 0 */
        double *xs = malloc(sizeof(double) * (size_t)(L + 1));
        ck_assert_ptr_nonnull(xs);
        for (int r = 0; r < ranks[c]; r++) {
            mmoe_ep_gpu_model_exchange_seconds(e, r, xs);
            for (int64_t l = 0; l <= L; l++)
                ck_assert_msg(xs[l] > 0 && xs[l] < 60, "rank %d, sub-layer %lld: exchange seconds %g", r, (long long)l,
                              xs[l]);
        }
        free(xs);
        fprintf(stderr, "%s: %s x %d: %zu logits and %zu MTP logits bit-identical to one GPU; pairs per rank:", what,
                mmoe_ep_comm_kind_name(kinds[c]), ranks[c], ref.n, ref.n_mtp);
        for (int r = 0; r < ranks[c]; r++)
            fprintf(stderr, " %lld", (long long)s.pairs[r]);
        fprintf(stderr, "; idle rank-exchanges %lld\n", (long long)idle);
        seq_free(&got);
        mmoe_ep_gpu_model_destroy(e);
    }
    seq_free(&ref);
    mmoe_model_close(m);
}

START_TEST(tiny_fixture)
{
    char dir[1100];
    tiny_dir(dir, sizeof dir);
#ifdef MMOE_HAVE_NCCL
    static const mmoe_ep_comm_kind kinds[] = {MMOE_EP_COMM_NCCL, MMOE_EP_COMM_INPROC, MMOE_EP_COMM_INPROC,
                                              MMOE_EP_COMM_INPROC};
    static const int ranks[] = {1, 1, 2, 3};
#else
    static const mmoe_ep_comm_kind kinds[] = {MMOE_EP_COMM_INPROC, MMOE_EP_COMM_INPROC, MMOE_EP_COMM_INPROC};
    static const int ranks[] = {1, 2, 3};
#endif
    check_model("tiny-dsv4", dir, kinds, ranks, (int)(sizeof ranks / sizeof ranks[0]));
}
END_TEST

START_TEST(synth_uneven)
{
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/synth", g_tmp);
    mmoe_config cfg;
    mmoe_error err;
    ck_assert(mmoe_config_preset("tiny", 3, &cfg, &err) == MMOE_OK);
    cfg.n_routed_experts = 7;
    ck_assert_msg(mmoe_synth_model_write(&cfg, g_seed, dir, 256 << 20, 0, NULL, NULL, &err) == MMOE_OK, "%s", err.msg);
    static const mmoe_ep_comm_kind kinds[] = {MMOE_EP_COMM_INPROC, MMOE_EP_COMM_INPROC};
    static const int ranks[] = {2, 3};
    check_model("synth tiny x3, 7 experts", dir, kinds, ranks, 2);
    mmoe_test_rmtree(dir);
}
END_TEST

/** Run `megamoe ARGS` in the temporary directory; status, stdout and stderr (caller frees). */
static int cli(const char *args, char **out, char **err)
{
    return mmoe_test_run_cli(g_tmp, args, NULL, out, err);
}

START_TEST(cli_one_gpu)
{
    char dir[1100], args[4096], path[1200], *out, *err, *ids[2];
    tiny_dir(dir, sizeof dir);
    const char *opts[2] = {"--backend gpu", "--gpus 1"}, *names[2] = {"gpu", "gpus"};
    mmoe_st_file *f[2];
    mmoe_error e;
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "logits --model '%s' --ids 0,20,21,22,23,24,25 --mtp %s --out '%s/%s.st'", dir,
                 opts[i], g_tmp, names[i]);
        ck_assert_msg(cli(args, &out, &err) == 0, "%s: %s", args, err);
        if (i == 1)
            ck_assert_msg(strstr(err, "backend: gpu over 1 GPU(s)") != NULL && strstr(err, "gpus: 1 ranks") != NULL,
                          "%s", err);
        free(out);
        free(err);
        snprintf(path, sizeof path, "%s/%s.st", g_tmp, names[i]);
        ck_assert_msg(mmoe_st_open(path, &f[i], &e) == MMOE_OK, "%s", e.msg);
    }
    static const char *tensors[2] = {"logits", "mtp_logits"};
    for (int t = 0; t < 2; t++) {
        const mmoe_tensor *a = mmoe_st_find(f[0], tensors[t]), *b = mmoe_st_find(f[1], tensors[t]);
        ck_assert(a && b && a->nbytes == b->nbytes);
        ck_assert_msg(memcmp(a->data, b->data, a->nbytes) == 0, "%s: --gpus 1 differs from --backend gpu", tensors[t]);
    }
    mmoe_st_close(f[0]);
    mmoe_st_close(f[1]);
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "generate --model '%s' --prompt 'the quick brown fox' --max-tokens 12 --print-ids %s",
                 dir, opts[i]);
        ck_assert_msg(cli(args, &ids[i], &err) == 0, "%s: %s", args, err);
        if (i == 1)
            ck_assert_msg(strstr(err, "gpus: 1 ranks") != NULL, "%s", err);
        free(err);
    }
    ck_assert_msg(strcmp(ids[0], ids[1]) == 0, "greedy ids: --backend gpu '%s', --gpus 1 '%s'", ids[0], ids[1]);
    fprintf(stderr, "cli: logits --gpus 1 == --backend gpu (bytes), generate ids %s", ids[1]);
    free(ids[0]);
    free(ids[1]);
    /* more GPUs than the machine has (and no more than the 8 experts): refused before loading */
    int n_dev = 0;
    ck_assert_int_eq(ep_cuda_devices(&n_dev, NULL, &e), MMOE_OK);
    if (n_dev < 8) {
        char want[64];
        snprintf(want, sizeof want, "--gpus %d: this machine has %d GPU(s)", n_dev + 1, n_dev);
        snprintf(args, sizeof args, "logits --model '%s' --ids 0,20 --gpus %d --out '%s/many.st'", dir, n_dev + 1, g_tmp);
        ck_assert_int_eq(cli(args, &out, &err), 1);
        ck_assert_msg(strstr(err, want) != NULL && strstr(err, "loading:") == NULL, "%s", err);
        snprintf(path, sizeof path, "%s/many.st", g_tmp);
        struct stat sb;
        ck_assert_int_ne(stat(path, &sb), 0);
        free(out);
        free(err);
    }
}
END_TEST

/** Integer @p key of object @p o (fails the test when absent or not an integer). */
static long long jint(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "JSON key %s: not an integer", key);
    return (long long)json_integer_value(v);
}

/** One phase's exchange object of `bench forward --gpus 1 --json` on tiny-dsv4 after @p tokens tokens in @p calls calls. */
static void check_phase(const json_t *x, long long tokens, long long calls)
{
    ck_assert_msg(json_is_object(x), "no exchange object");
    /* 4 layers, top 2: one exchange per layer and call, tokens x 2 x 4 pairs, all on the one rank */
    ck_assert_int_eq(jint(x, "exchanges"), 4 * calls);
    ck_assert_int_eq(jint(x, "bytes_sent"), 0); /* one rank has no peer to send to */
    const json_t *pairs = json_object_get(x, "pairs"), *idle = json_object_get(x, "idle"),
                 *tot = json_object_get(x, "exchange_s"), *layers = json_object_get(x, "layers");
    ck_assert(json_array_size(pairs) == 1 && json_array_size(idle) == 1 && json_array_size(tot) == 1);
    ck_assert_int_eq(json_integer_value(json_array_get(pairs, 0)), tokens * 2 * 4);
    ck_assert_int_eq(json_integer_value(json_array_get(idle, 0)), 0);
    ck_assert_uint_eq(json_array_size(layers), 4);
    double sum = 0;
    for (size_t L = 0; L < 4; L++) {
        const json_t *l = json_array_get(layers, L), *per = json_object_get(l, "exchange_s");
        ck_assert_int_eq(jint(l, "layer"), (long long)L);
        ck_assert_uint_eq(json_array_size(per), 1);
        const double t = json_real_value(json_array_get(per, 0));
        ck_assert_msg(t > 0 && t < 60, "layer %zu: exchange seconds %g", L, t);
        sum += t;
    }
    const double total = json_real_value(json_array_get(tot, 0));
    ck_assert_msg(total >= 0.999 * sum && total <= 1.001 * sum, "exchange seconds %g, the layers add up to %g", total,
                  sum);
}

/* `bench forward --gpus 1`: the report (JSON keys, pairs and exchanges counted by hand) and the text */
START_TEST(cli_bench_forward)
{
    char dir[1100], args[4096], *out, *err;
    tiny_dir(dir, sizeof dir);
    snprintf(args, sizeof args, "bench forward --model '%s' --gpus 1 --prefill 5 --decode 3 --json", dir);
    ck_assert_msg(cli(args, &out, &err) == 0, "%s: %s", args, err);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    ck_assert_msg(o != NULL, "not one JSON object (%s): %s", je.text, out);
    ck_assert_str_eq(json_string_value(json_object_get(o, "bench")), "forward");
    ck_assert_str_eq(json_string_value(json_object_get(o, "backend")), "gpu");
    ck_assert_str_eq(json_string_value(json_object_get(o, "comm")), "nccl");
    mmoe_gpu_fp8_linears recipe = MMOE_GPU_FP8_LINEARS_EXACT; /* the one MMOE_GPU_FP8_LINEARS names, as the ranks read it */
    mmoe_error e;
    mmoe_error_clear(&e);
    ck_assert_int_eq(mmoe_gpu_fp8_linears_env(&recipe, &e), MMOE_OK);
    ck_assert_ptr_nonnull(json_string_value(json_object_get(o, "fp8_linears")));
    ck_assert_str_eq(json_string_value(json_object_get(o, "fp8_linears")), mmoe_gpu_fp8_linears_name(recipe));
    ck_assert_int_eq(jint(o, "gpus"), 1);
    ck_assert_int_eq(jint(o, "layers"), 4);
    ck_assert_int_eq(jint(o, "prefill_tokens"), 5);
    ck_assert_int_eq(jint(o, "decode_tokens"), 3);
    ck_assert(json_real_value(json_object_get(o, "prefill_tokens_per_s")) > 0);
    ck_assert(json_real_value(json_object_get(o, "decode_ms_per_token")) > 0);
    const json_t *ranks = json_object_get(o, "ranks");
    ck_assert_uint_eq(json_array_size(ranks), 1);
    const json_t *r0 = json_array_get(ranks, 0);
    ck_assert(jint(r0, "rank") == 0 && jint(r0, "first_expert") == 0 && jint(r0, "end_expert") == 8);
    ck_assert(jint(r0, "device_bytes") > 0);
    check_phase(json_object_get(o, "prefill_exchange"), 5, 1);
    check_phase(json_object_get(o, "decode_exchange"), 3, 3);
    json_decref(o);
    free(out);
    free(err);
    snprintf(args, sizeof args, "bench forward --model '%s' --gpus 1 --prefill 5 --decode 3", dir);
    ck_assert_msg(cli(args, &out, &err) == 0, "%s: %s", args, err);
    ck_assert_msg(strstr(out, "backend gpu over 1 GPU(s) (expert parallel, nccl)") != NULL &&
                      strstr(out, "prefill exchanges: 4, payload sent by rank 0 0.0 KiB; routed pairs per rank: 40;") &&
                      strstr(out, "decode exchanges: 12, payload sent by rank 0 0.0 KiB; routed pairs per rank: 24;") &&
                      strstr(out, "exchange ms per MoE sub-layer"),
                  "%s", out);
    fprintf(stderr, "cli: bench forward --gpus 1:\n%s", out);
    free(out);
    free(err);
    /* one GPU model: the first line names the backend */
    snprintf(args, sizeof args, "bench forward --model '%s' --backend gpu --prefill 5 --decode 3", dir);
    const int rc_gpu = cli(args, &out, &err);
    ck_assert_msg(rc_gpu == 0 && strstr(out, "; backend gpu\n") != NULL, "%s: %s%s", args, out, err);
    free(out);
    free(err);
}
END_TEST

/* ------------------------------------------------------------------ without a GPU */

/* the checks that need no GPU (run only where there is none: they expect the refusals) */
START_TEST(refusals_without_gpu)
{
    char dir[1100], args[4096], path[1200], *out, *err;
    struct stat sb;
    tiny_dir(dir, sizeof dir);
    mmoe_model *m = mmoe_test_open_model(dir);
    mmoe_ep_gpu_model *e = NULL;
    mmoe_error er;
    mmoe_error_clear(&er);
    /* N > E: refused by the partition, before any device */
    ck_assert_int_eq(mmoe_ep_gpu_model_create(m, 9, MMOE_EP_COMM_INPROC, 64, 16, &e, &er), MMOE_EINVAL);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(er.msg, "9 ranks for 8 routed experts") != NULL, "%s", er.msg);
    /* no device: the first rank says so */
    ck_assert_int_eq(mmoe_ep_gpu_model_create(m, 2, MMOE_EP_COMM_INPROC, 64, 16, &e, &er), MMOE_ENODEV);
    ck_assert_ptr_null(e);
    ck_assert_msg(strstr(er.msg, "rank 0: ") != NULL, "%s", er.msg);
    mmoe_model_close(m);
    static const struct {
        const char *args;
        int status;
        const char *msg;
    } cases[] = {
        {"logits --ids 0,20 --gpus 1 --backend cpu", 2, "--backend cpu or auto contradicts it"},
        {"generate --prompt x --gpus 1 --backend auto", 2, "--backend cpu or auto contradicts it"},
        {"logits --ids 0,20 --gpus 1", 1, "--gpus 1: "},
        {"logits --ids 0,20 --ep-ranks 2 --backend gpu", 2, "--ep-ranks splits the CPU forward"},
    };
    snprintf(path, sizeof path, "%s/no.st", g_tmp);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int logits = strncmp(cases[i].args, "logits", 6) == 0;
        snprintf(args, sizeof args, "%s --model '%s'%s%s%s", cases[i].args, dir, logits ? " --out '" : "",
                 logits ? path : "", logits ? "'" : "");
        ck_assert_int_eq(cli(args, &out, &err), cases[i].status);
        ck_assert_msg(strstr(err, cases[i].msg) != NULL, "`%s`: %s", args, err);
        ck_assert_msg(strstr(err, "loading:") == NULL, "`%s`: refused only after loading", args);
        ck_assert_int_ne(stat(path, &sb), 0);
        free(out);
        free(err);
    }
}
END_TEST

static int have_gpu(void)
{
    mmoe_error err;
    int cc = 0;
    return mmoe_gpu_available(&cc, &err) == MMOE_OK;
}

static Suite *ep_gpu_forward_suite(int gpu)
{
    Suite *s = suite_create("ep_gpu_forward");
    TCase *tc = tcase_create(gpu ? "gpu" : "no_gpu");
    tcase_set_timeout(tc, 600);
    if (gpu) {
        tcase_add_test(tc, tiny_fixture);
        tcase_add_test(tc, synth_uneven);
        tcase_add_test(tc, cli_one_gpu);
        tcase_add_test(tc, cli_bench_forward);
    } else {
        tcase_add_test(tc, refusals_without_gpu);
    }
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (mmoe_test_mkdtemp(g_tmp, sizeof g_tmp) != 0)
        return 99;
    const int gpu = have_gpu();
    if (gpu) {
        /* CUDA state does not survive fork(): run the tests in this process */
        setenv("CK_FORK", "no", 1);
        setvbuf(stderr, NULL, _IONBF, 0);
    }
    g_seed = mmoe_test_seed("ep_gpu_forward");
    int rc = mmoe_test_run(ep_gpu_forward_suite(gpu));
    if (!gpu && rc == 0) {
        fprintf(stderr, "ep_gpu_forward: no GPU: the refusals checked, the GPU cases skipped\n");
        rc = MMOE_TEST_SKIP;
    }
    mmoe_test_rmtree(g_tmp);
    return rc;
}
