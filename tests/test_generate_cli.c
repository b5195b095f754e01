/**
 * @file test_generate_cli.c
 * @brief `megamoe generate` end to end: the CLI ($MMOE_BIN) against an independent greedy driver.
 *
 * Fixture: a fresh random tiny checkpoint (mmoe_synth_model_write, seed printed) with the
 * 512-id tokenizer of fixtures/generate/tokenizer.json, written once in main() into a
 * temporary directory (Check forks every test from that state).
 *
 * The reference is a driver written here, independent of the CLI's generation loop: it
 * tokenizes BOS + prompt, calls mmoe_model_forward() on the whole sequence so far *from a
 * fresh state* at every step (no KV-cache reuse, no pending tokens, no chunking) and takes
 * the argmax itself (lowest id on ties).  The forward is deterministic and prefill equals
 * decode bit for bit (mmoe_model.h), so the CLI's greedy ids must equal the driver's exactly.
 * The chat test uses the same driver on the whole conversation so far, which checks that the
 * KV cache kept between turns holds exactly the tokens the chat encoding says it should.
 */
#include <check.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gen_fixture.h"
#include "mmoe_model.h"
#include "mmoe_test.h"
#include "mmoe_tokenizer.h"

static char g_root[512];  /**< temp dir of the fixture (set in main, read by the forked tests) */
static char g_model[600]; /**< the model directory inside it */
static uint64_t g_seed;

#define BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
#define USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"

/**
 * Run `megamoe generate ARGS` with @p stdin_text on stdin (NULL: /dev/null); return the exit
 * status, stdout and stderr (caller frees).
 */
static int run_generate(const char *args, const char *stdin_text, char **out, char **err)
{
    char cli_args[3000];
    snprintf(cli_args, sizeof cli_args, "generate %s", args);
    return mmoe_test_run_cli(g_root, cli_args, stdin_text, out, err);
}

/** Parse the whitespace-separated integers of @p s (at most @p cap); returns the count. */
static int parse_ids(const char *s, int32_t *ids, int cap)
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) {
            s++;
            continue;
        }
        ck_assert_int_lt(n, cap);
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

/**
 * The independent driver: greedy continuation of @p ctx (n_ctx ids) for at most @p max
 * tokens, stopping before @p eos; every step reruns the whole sequence on a fresh state.
 * @return the number of ids written to @p gen
 */
static int driver_greedy(const char *dir, const int32_t *ctx, int n_ctx, int max, int32_t eos, int32_t *gen)
{
    mmoe_error err = {0};
    mmoe_model *m = NULL;
    ck_assert_msg(mmoe_model_open(dir, NULL, NULL, &m, &err) == MMOE_OK, "%s", err.msg);
    int64_t vocab = mmoe_model_config(m)->vocab_size;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(n_ctx + max + 1));
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    ck_assert(seq && logits);
    memcpy(seq, ctx, sizeof(int32_t) * (size_t)n_ctx);
    int n_gen = 0;
    while (n_gen < max) {
        mmoe_model_state *s = NULL;
        ck_assert(mmoe_model_state_create(m, 0, &s, &err) == MMOE_OK);
        mmoe_test_poison_f32(logits, (size_t)vocab);
        ck_assert_msg(mmoe_model_forward(m, s, seq, n_ctx + n_gen, logits, 1, NULL, &err) == MMOE_OK, "%s", err.msg);
        mmoe_model_state_destroy(s);
        int32_t id = mmoe_test_argmax_f32(logits, vocab);
        if (id == eos)
            break;
        seq[n_ctx + n_gen] = id;
        gen[n_gen++] = id;
    }
    free(seq);
    free(logits);
    mmoe_model_close(m);
    return n_gen;
}

/** Tokenize @p text with the fixture's tokenizer, appending to @p ids (count returned). */
static int encode(const char *text, int32_t *ids, int n, int cap)
{
    mmoe_error err = {0};
    mmoe_tokenizer *tok = NULL;
    ck_assert_msg(mmoe_tokenizer_load_dir(g_model, &tok, &err) == MMOE_OK, "%s", err.msg);
    mmoe_token_ids out = {0};
    ck_assert_msg(mmoe_tokenizer_encode(tok, text, strlen(text), 0, &out, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_le(n + (int)out.n, cap);
    memcpy(ids + n, out.ids, out.n * sizeof(int32_t));
    n += (int)out.n;
    mmoe_token_ids_free(&out);
    mmoe_tokenizer_free(tok);
    return n;
}

/** BOS (id 0 in the tiny config) + the tokens of @p prompt. */
static int raw_prompt(const char *prompt, int32_t *ids, int cap)
{
    ids[0] = 0;
    return encode(prompt, ids, 1, cap);
}

static const char *k_prompt = "The quick brown fox";

START_TEST(greedy_is_deterministic_and_matches_the_driver)
{
    char args[1024], *out1, *err1, *out2, *err2;
    snprintf(args, sizeof args, "--model %s --prompt '%s' --max-tokens 12 --print-ids", g_model, k_prompt);
    ck_assert_int_eq(run_generate(args, NULL, &out1, &err1), 0);
    ck_assert_int_eq(run_generate(args, NULL, &out2, &err2), 0);
    ck_assert_str_eq(out1, out2);

    int32_t cli[64], want[64], prompt[64];
    int n_cli = parse_ids(out1, cli, 64);
    int n_prompt = raw_prompt(k_prompt, prompt, 64);
    int n_want = driver_greedy(g_model, prompt, n_prompt, 12, 1, want);
    ck_assert_int_eq(n_cli, n_want);
    for (int i = 0; i < n_want; i++)
        ck_assert_int_eq(cli[i], want[i]);
    /* the stats line counts what was run and why it stopped */
    char expect[256];
    snprintf(expect, sizeof expect, "prefilled %d new tokens (0 reused from the KV cache)", n_prompt);
    ck_assert_msg(strstr(err1, expect) != NULL, "stats line without '%s'", expect);
    snprintf(expect, sizeof expect, "generated %d tokens", n_want);
    ck_assert_msg(strstr(err1, expect) != NULL, "stats line without '%s'", expect);
    ck_assert(strstr(err1, n_want == 12 ? "stop: max-tokens" : "stop: eos") != NULL);
    ck_assert(strstr(err1, "tokens/s") && strstr(err1, "ms/token"));
    free(out1), free(err1), free(out2), free(err2);
}
END_TEST

START_TEST(text_output_is_the_decoded_ids)
{
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "--model %s --prompt '%s' --max-tokens 10 --quiet", g_model, k_prompt);
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), 0);
    ck_assert_str_eq(err, ""); /* --quiet: no progress, no stats */
    int32_t want[64], prompt[64];
    int n_want = driver_greedy(g_model, prompt, raw_prompt(k_prompt, prompt, 64), 10, 1, want);
    mmoe_error e = {0};
    mmoe_tokenizer *tok = NULL;
    ck_assert(mmoe_tokenizer_load_dir(g_model, &tok, &e) == MMOE_OK);
    mmoe_text text = {0};
    ck_assert(mmoe_tokenizer_decode(tok, want, (size_t)n_want, 0, &text, &e) == MMOE_OK);
    ck_assert(mmoe_text_append(&text, "\n", 1) == MMOE_OK);
    ck_assert_str_eq(out, text.data);
    mmoe_text_free(&text);
    mmoe_tokenizer_free(tok);
    free(out), free(err);
}
END_TEST

START_TEST(max_tokens_is_respected)
{
    int32_t want[64], prompt[64], cli[64];
    int n_prompt = raw_prompt("one two three", prompt, 64);
    int n_want = driver_greedy(g_model, prompt, n_prompt, 3, 1, want);
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "--model %s --prompt 'one two three' --max-tokens 3 --print-ids", g_model);
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), 0);
    ck_assert_int_eq(parse_ids(out, cli, 64), n_want);
    for (int i = 0; i < n_want; i++)
        ck_assert_int_eq(cli[i], want[i]);
    free(out), free(err);
    snprintf(args, sizeof args, "--model %s --prompt 'one two three' --max-tokens 0 --print-ids", g_model);
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), 0);
    ck_assert_int_eq(parse_ids(out, cli, 64), 0);
    ck_assert(strstr(err, "generated 0 tokens") != NULL);
    free(out), free(err);
}
END_TEST

START_TEST(long_prompt_reports_prefill_progress)
{
    /* more than one 64-token prefill chunk: a progress line, and the same ids as the driver */
    char text[1024] = "", args[2048], *out, *err;
    for (int i = 0; i < 30; i++)
        strcat(text, "one two three ");
    int32_t prompt[256], want[8], cli[8];
    int n_prompt = raw_prompt(text, prompt, 256);
    ck_assert_int_gt(n_prompt, 64);
    int n_want = driver_greedy(g_model, prompt, n_prompt, 3, 1, want);
    snprintf(args, sizeof args, "--model %s --prompt '%s' --max-tokens 3 --print-ids", g_model, text);
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), 0);
    ck_assert_int_eq(parse_ids(out, cli, 8), n_want);
    for (int i = 0; i < n_want; i++)
        ck_assert_int_eq(cli[i], want[i]);
    char expect[128];
    snprintf(expect, sizeof expect, "prefill: %d/%d tokens", n_prompt, n_prompt);
    ck_assert_msg(strstr(err, expect) != NULL, "no '%s'", expect);
    free(out), free(err);
}
END_TEST

/** Copy the fixture model into @p dir with config.json's eos_token_id replaced by @p eos. */
static void model_with_eos(const char *dir, int32_t eos)
{
    char path[1024], cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/*.safetensors %s/*.json %s/", dir, g_model, g_model, dir);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    ck_assert_msg(cfg != NULL, "%s", jerr.text);
    json_object_set_new(cfg, "eos_token_id", json_integer(eos));
    ck_assert_int_eq(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg);
}

START_TEST(stops_at_eos)
{
    /* Make the model's EOS a token that greedy decoding produces: the 5th token of the
     * driver's continuation.  Generation must stop right before its first occurrence. */
    int32_t prompt[64], ref[64], cli[64];
    int n_prompt = raw_prompt(k_prompt, prompt, 64);
    int n_ref = driver_greedy(g_model, prompt, n_prompt, 8, -1, ref);
    ck_assert_int_eq(n_ref, 8);
    int32_t eos = ref[4];
    int first = 0;
    while (ref[first] != eos)
        first++;
    char dir[700], args[1024], *out, *err;
    snprintf(dir, sizeof dir, "%s/eos-model", g_root);
    model_with_eos(dir, eos);
    snprintf(args, sizeof args, "--model %s --prompt '%s' --max-tokens 20 --print-ids", dir, k_prompt);
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), 0);
    ck_assert_int_eq(parse_ids(out, cli, 64), first);
    for (int i = 0; i < first; i++)
        ck_assert_int_eq(cli[i], ref[i]);
    ck_assert(strstr(err, "stop: eos") != NULL);
    free(out), free(err);
}
END_TEST

START_TEST(seed_replays_sampling)
{
    char args[1024], *a, *ea, *b, *eb, *c, *ec;
    snprintf(args, sizeof args, "--model %s --prompt '%s' --max-tokens 16 --print-ids --temperature 3 --seed 7",
             g_model, k_prompt);
    ck_assert_int_eq(run_generate(args, NULL, &a, &ea), 0);
    ck_assert_int_eq(run_generate(args, NULL, &b, &eb), 0);
    ck_assert_str_eq(a, b);
    ck_assert(strstr(ea, "seed 7") != NULL);
    snprintf(args, sizeof args, "--model %s --prompt '%s' --max-tokens 16 --print-ids --temperature 3 --seed 8",
             g_model, k_prompt);
    ck_assert_int_eq(run_generate(args, NULL, &c, &ec), 0);
    /* At temperature 3 a random model's next-token distribution is nearly flat over 512 ids:
     * two seeds giving the same 16 tokens has probability far below 1e-6. */
    int32_t ia[64], ic[64];
    int na = parse_ids(a, ia, 64), nc = parse_ids(c, ic, 64);
    ck_assert_int_gt(na, 2);
    ck_assert(na != nc || memcmp(ia, ic, sizeof(int32_t) * (size_t)na) != 0);
    free(a), free(ea), free(b), free(eb), free(c), free(ec);
}
END_TEST

/** Find "turn K stats: prefilled P new tokens (R reused ...; generated G tokens ...; stop: S". */
static void turn_stats(const char *err, int turn, int *prefilled, int *reused, int *generated, char *stop)
{
    char key[64];
    snprintf(key, sizeof key, "turn %d stats: ", turn);
    const char *p = strstr(err, key);
    ck_assert_msg(p != NULL, "no '%s' line", key);
    ck_assert_int_eq(sscanf(p + strlen(key), "prefilled %d new tokens (%d reused", prefilled, reused), 2);
    const char *g = strstr(p, "generated ");
    ck_assert(g != NULL);
    ck_assert_int_eq(sscanf(g, "generated %d tokens", generated), 1);
    const char *s = strstr(p, "stop: ");
    ck_assert(s != NULL);
    ck_assert_int_eq(sscanf(s, "stop: %31s", stop), 1);
}

START_TEST(chat_two_turns_reuse_the_kv_cache)
{
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "--model %s --chat --max-tokens 6 --print-ids", g_model);
    ck_assert_int_eq(run_generate(args, "Hello there\n\nWhat is two plus two?\n", &out, &err), 0);

    /* stdout: "> ids of turn 1 \n> ids of turn 2 \n> \n" (the empty line is skipped) */
    int32_t got1[64], got2[64];
    char *line2 = strchr(out, '\n');
    ck_assert(line2 != NULL);
    *line2++ = '\0';
    int n1 = parse_ids(out, got1, 64), n2 = parse_ids(line2, got2, 64);

    /* turn 1 = BOS <User>Hello there<Assistant></think>, rendered by hand here */
    int32_t conv[256];
    int n_turn1 = encode(BOS USER "Hello there" ASSISTANT "</think>", conv, 0, 256);
    int32_t want1[64], want2[64];
    int n_want1 = driver_greedy(g_model, conv, n_turn1, 6, 1, want1);
    ck_assert_int_eq(n1, n_want1);
    for (int i = 0; i < n1; i++)
        ck_assert_int_eq(got1[i], want1[i]);

    /* the conversation so far: turn 1, the answer, EOS (always closes an assistant message),
     * then turn 2's own tokens */
    int n_conv = n_turn1;
    memcpy(conv + n_conv, want1, sizeof(int32_t) * (size_t)n_want1);
    n_conv += n_want1;
    conv[n_conv++] = 1;
    int n_turn2_text = encode(USER "What is two plus two?" ASSISTANT "</think>", conv, n_conv, 256) - n_conv;
    n_conv += n_turn2_text;
    int n_want2 = driver_greedy(g_model, conv, n_conv, 6, 1, want2);
    ck_assert_int_eq(n2, n_want2);
    for (int i = 0; i < n2; i++)
        ck_assert_int_eq(got2[i], want2[i]);

    /* KV reuse: turn 2 prefilled only what the cache did not hold.  After a stop at
     * max-tokens the last answer token was never run (pending), after EOS every answer
     * token was; either way turn 2 runs the unrun tokens, EOS and its own text. */
    int p1, r1, g1, p2, r2, g2;
    char stop1[32], stop2[32];
    turn_stats(err, 1, &p1, &r1, &g1, stop1);
    turn_stats(err, 2, &p2, &r2, &g2, stop2);
    ck_assert_int_eq(p1, n_turn1);
    ck_assert_int_eq(r1, 0);
    ck_assert_int_eq(g1, n_want1);
    int unrun = strcmp(stop1, "max-tokens") == 0 ? 1 : 0;
    ck_assert_str_eq(stop1, n_want1 == 6 ? "max-tokens" : "eos");
    ck_assert_int_eq(r2, n_turn1 + n_want1 - unrun);
    ck_assert_int_eq(p2, unrun + 1 + n_turn2_text);
    ck_assert_int_eq(r2 + p2, n_conv);
    ck_assert_int_lt(p2, n_conv);
    ck_assert(strstr(err, "turn 3") == NULL);
    free(out), free(err);
}
END_TEST

START_TEST(readme_model_when_present)
{
    /* fixtures/tiny-dsv4 (the trained model of the README, branch tinymodel): when it is in
     * the tree, the README's command must run and match the driver token for token */
    char dir[1024], path[1100], args[2048], *out, *err;
    snprintf(dir, sizeof dir, "%s/fixtures/tiny-dsv4", getenv("MMOE_SRCDIR"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "%s absent: nothing to check\n", dir);
        return;
    }
    fclose(f);
    mmoe_error e = {0};
    mmoe_model *m = NULL;
    ck_assert_msg(mmoe_model_open(dir, NULL, NULL, &m, &e) == MMOE_OK, "%s", e.msg);
    int32_t bos = (int32_t)mmoe_model_config(m)->bos_token_id, eos = (int32_t)mmoe_model_config(m)->eos_token_id;
    mmoe_model_close(m);
    mmoe_tokenizer *tok = NULL;
    ck_assert_msg(mmoe_tokenizer_load_dir(dir, &tok, &e) == MMOE_OK, "%s", e.msg);
    mmoe_token_ids ids = {0};
    ck_assert(mmoe_token_ids_push(&ids, &bos, 1) == MMOE_OK);
    ck_assert(mmoe_tokenizer_encode(tok, "1 2 3 4", 7, 0, &ids, &e) == MMOE_OK);
    int32_t want[16], cli[16];
    int n_want = driver_greedy(dir, ids.ids, (int)ids.n, 8, eos, want);
    mmoe_token_ids_free(&ids);
    mmoe_tokenizer_free(tok);
    snprintf(args, sizeof args, "--model %s --prompt '1 2 3 4' --max-tokens 8 --print-ids", dir);
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), 0);
    ck_assert_int_eq(parse_ids(out, cli, 16), n_want);
    for (int i = 0; i < n_want; i++)
        ck_assert_int_eq(cli[i], want[i]);
    free(out), free(err);
}
END_TEST

/** Expect exit status @p want and a stderr containing @p needle. */
static void expect_failure(const char *args, int want, const char *needle)
{
    char *out, *err;
    ck_assert_int_eq(run_generate(args, NULL, &out, &err), want);
    ck_assert_msg(strstr(err, needle) != NULL, "stderr lacks '%s': %s", needle, err);
    free(out), free(err);
}

START_TEST(bad_inputs_fail_with_a_message)
{
    char args[1024], dir[700], cmd[4096];
    expect_failure("--prompt hi", 2, "--model DIR is required");
    snprintf(args, sizeof args, "--model %s", g_model);
    expect_failure(args, 2, "one of --prompt TEXT or --chat");
    snprintf(args, sizeof args, "--model %s --prompt hi --chat", g_model);
    expect_failure(args, 2, "exclude each other");
    snprintf(args, sizeof args, "--model %s --prompt hi --temperature -1", g_model);
    expect_failure(args, 2, "megamoe generate: --temperature: expected a number in [0, 1e+06], got '-1'");
    snprintf(args, sizeof args, "--model %s --prompt hi --top-p 0", g_model);
    expect_failure(args, 2, "megamoe generate: --top-p: expected a number in (0, 1], got '0'");
    snprintf(args, sizeof args, "--model %s --prompt hi --max-tokens lots", g_model);
    expect_failure(args, 2, "megamoe generate: --max-tokens: expected an integer in [0, 1099511627776], got 'lots'");
    snprintf(args, sizeof args, "--model %s --prompt hi --threads 0", g_model);
    expect_failure(args, 2, "megamoe generate: --threads: expected an integer in [1, 1024], got '0'");
    snprintf(args, sizeof args, "--model %s --prompt hi --frobnicate", g_model);
    expect_failure(args, 2, "unknown option '--frobnicate'");
    snprintf(args, sizeof args, "--model %s --prompt hi --thinking", g_model);
    expect_failure(args, 2, "--thinking need a chat encoding");
    snprintf(args, sizeof args, "--model %s --prompt hi --ctx-size 100000", g_model);
    expect_failure(args, 1, "max_seq_len");

    snprintf(args, sizeof args, "--model %s/no-such-model --prompt hi", g_root);
    expect_failure(args, 1, "no-such-model");
    /* a checkpoint without tokenizer.json */
    snprintf(dir, sizeof dir, "%s/no-tokenizer", g_root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", dir, g_model, dir);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --prompt hi", dir);
    expect_failure(args, 1, "tokenizer.json");
    /* a tokenizer without a checkpoint */
    snprintf(dir, sizeof dir, "%s/tokenizer-only", g_root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/tokenizer.json %s/", dir, g_model, dir);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --prompt hi", dir);
    expect_failure(args, 1, "config.json");
    /* a tokenizer without the chat markers: raw prompts work, chat encodings are refused */
    snprintf(dir, sizeof dir, "%s/no-markers", g_root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/*.json %s/*.safetensors %s/ && cp '%s/fixtures/tokenizer/tiny-tokenizer.json' "
             "%s/tokenizer.json", dir, g_model, g_model, dir, getenv("MMOE_SRCDIR"), dir);
    ck_assert_int_eq(mmoe_test_system(cmd), 0);
    snprintf(args, sizeof args, "--model %s --chat", dir);
    expect_failure(args, 1, "chat markers");
    snprintf(args, sizeof args, "--model %s --prompt ab --max-tokens 2", dir);
    expect_failure(args, 0, "stop: ");
    /* a prompt longer than the context */
    snprintf(args, sizeof args, "--model %s --prompt 'one two three four five six' --ctx-size 4", g_model);
    expect_failure(args, 1, "context full");

    char *out, *err;
    ck_assert_int_eq(run_generate("--help", NULL, &out, &err), 0);
    ck_assert(strstr(out, "--max-tokens") != NULL);
    free(out), free(err);
}
END_TEST

/** The text of @p path ("" when absent), malloc'd. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc((size_t)n + 1, 1);
    ck_assert(buf != NULL && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    return buf;
}

/** Wait (at most 60 s) until @p path holds more than @p min_len bytes and contains @p needle. */
static void wait_for(const char *path, size_t min_len, const char *needle)
{
    for (int i = 0; i < 6000; i++) {
        char *t = slurp(path);
        int ok = strlen(t) > min_len && strstr(t + min_len, needle) != NULL;
        free(t);
        if (ok)
            return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char *t = slurp(path);
    fprintf(stderr, "%s:\n%.2000s\n", path, t);
    ck_abort_msg("timed out waiting for '%s' in %s (its start is in the log)", needle, path);
}

/** Write all of @p s to @p fd. */
static void write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        ck_assert(w > 0);
        s += w;
        n -= (size_t)w;
    }
}

START_TEST(chat_survives_bad_lines_and_ctrl_c)
{
    /* fixtures/tiny-dsv4 answers the chat turn "1 2 3 4 5 6 7 8" with sums ("3+9=12\n...") for more
     * than 1000 tokens without an EOS (greedy, deterministic): an answer long enough to interrupt */
    char model[1024], out_path[700], err_path[700];
    snprintf(model, sizeof model, "%s/fixtures/tiny-dsv4", getenv("MMOE_SRCDIR"));
    snprintf(out_path, sizeof out_path, "%s/chat-out.txt", g_root);
    snprintf(err_path, sizeof err_path, "%s/chat-err.txt", g_root);
    int in[2];
    ck_assert_int_eq(pipe(in), 0);
    signal(SIGPIPE, SIG_IGN);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        FILE *o = fopen(out_path, "w"), *e = fopen(err_path, "w");
        if (o == NULL || e == NULL || dup2(in[0], 0) < 0 || dup2(fileno(o), 1) < 0 || dup2(fileno(e), 2) < 0)
            _exit(99);
        close(in[1]);
        execl(getenv("MMOE_BIN"), "megamoe", "generate", "--model", model, "--chat", "--max-tokens", "100000",
              (char *)NULL);
        _exit(98);
    }
    close(in[0]);
    /* 1. invalid UTF-8, then a line longer than the whole context: reported, skipped */
    write_all(in[1], "\xff\xfe bad\n", 8);
    size_t long_len = 2 * 6000;
    char *longline = malloc(long_len + 1);
    ck_assert_ptr_nonnull(longline);
    for (size_t i = 0; i < long_len; i += 2)
        memcpy(longline + i, "a ", 2);
    longline[long_len - 1] = '\n';
    write_all(in[1], longline, long_len);
    free(longline);
    wait_for(err_path, 0, "line 1 is not valid UTF-8 (byte 0xff at offset 0): not sent; the conversation goes on");
    wait_for(err_path, 0, "line 2: context full: ");
    char *e = slurp(err_path);
    fprintf(stderr, "stderr so far:\n%.2000s\n", e);
    ck_assert(strstr(e, "(the model's max_seq_len is 4096: shorten the text): not sent") != NULL);
    ck_assert_msg(strstr(e, "raise --ctx-size") == NULL, "advice that cannot be followed");
    free(e);
    /* 2. a long answer, interrupted once: it stops, the stats say so, the chat goes on */
    write_all(in[1], "1 2 3 4 5 6 7 8\n", 16);
    wait_for(out_path, strlen("> > > ") + 40, "\n"); /* 40 bytes of the answer are out */
    kill(pid, SIGINT);
    wait_for(err_path, 0, "stop: interrupted");
    e = slurp(err_path);
    ck_assert(strstr(e, "turn 1 stats") != NULL);
    free(e);
    /* 3. the next turn runs on the same cache and is interrupted; a second Ctrl-C before another
     * answer starts ends the process.  The second press is sent once the first has stopped the
     * answer (its stats line is out), so two presses can never reach the process as one pending
     * signal, however late a loaded machine runs it. */
    char *o = slurp(out_path);
    size_t before = strlen(o);
    free(o);
    write_all(in[1], "1 2 3 4 5 6 7 8\n", 16);
    wait_for(out_path, before + 40, "\n");
    e = slurp(err_path);
    ck_assert_msg(strstr(e, "turn 2 stats") == NULL, "turn 2 ended by itself");
    const size_t err_before = strlen(e);
    free(e);
    kill(pid, SIGINT);
    wait_for(err_path, err_before, "stop: interrupted");
    kill(pid, SIGINT);
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 3000 && done == 0; i++) {
        done = waitpid(pid, &status, WNOHANG);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("two Ctrl-C did not end the chat");
    }
    ck_assert_msg((WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) || (WIFEXITED(status) && WEXITSTATUS(status) == 0),
                  "status 0x%x", status);
    close(in[1]);
}
END_TEST

static Suite *generate_cli_suite(void)
{
    Suite *s = suite_create("generate_cli");
    TCase *tc = tcase_create("cli");
    tcase_add_test(tc, greedy_is_deterministic_and_matches_the_driver);
    tcase_add_test(tc, text_output_is_the_decoded_ids);
    tcase_add_test(tc, max_tokens_is_respected);
    tcase_add_test(tc, long_prompt_reports_prefill_progress);
    tcase_add_test(tc, stops_at_eos);
    tcase_add_test(tc, seed_replays_sampling);
    tcase_add_test(tc, chat_two_turns_reuse_the_kv_cache);
    tcase_add_test(tc, bad_inputs_fail_with_a_message);
    tcase_add_test(tc, readme_model_when_present);
    tcase_add_test(tc, chat_survives_bad_lines_and_ctrl_c);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *src = getenv("MMOE_SRCDIR");
    if (getenv("MMOE_BIN") == NULL || src == NULL) {
        fprintf(stderr, "MMOE_BIN / MMOE_SRCDIR not set: run through make check\n");
        return 77;
    }
    g_seed = mmoe_test_seed("generate_cli");
    if (gen_fixture_make(g_seed, src, g_root, sizeof g_root, g_model, sizeof g_model) != 0)
        return 99;
    int rc = mmoe_test_run(generate_cli_suite());
    mmoe_test_rmtree(g_root);
    return rc;
}
