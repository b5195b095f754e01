/**
 * @file test_config.c
 * @brief Suite "config": config.json in both spellings, defaults, presets, and errors that name the key.
 *
 * Golden values are the published numbers of docs/spec/architecture.md (configuration) (written here by hand),
 * read from the verbatim config files in fixtures/configs/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmoe_config.h"
#include "mmoe_model_tensors.h"
#include "mmoe_test.h"

static void fixture(const char *name, char *buf, size_t n)
{
    const char *src = getenv("MMOE_SRCDIR");
    snprintf(buf, n, "%s/fixtures/configs/%s", src ? src : ".", name);
}

START_TEST(flash_hf_keys)
{
    char p[4096];
    mmoe_config c;
    mmoe_error err;
    mmoe_error_clear(&err);
    fixture("deepseek-v4-flash.json", p, sizeof p);
    ck_assert_msg(mmoe_config_load(p, &c, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(c.dim, 4096);
    ck_assert_int_eq(c.n_layers, 43);
    ck_assert_int_eq(c.n_mtp_layers, 1);
    ck_assert_int_eq(c.n_hash_layers, 3);
    ck_assert_int_eq(c.n_heads, 64);
    ck_assert_int_eq(c.q_lora_rank, 1024);
    ck_assert_int_eq(c.o_groups, 8);
    ck_assert_int_eq(c.n_routed_experts, 256);
    ck_assert_int_eq(c.n_activated_experts, 6);
    ck_assert_int_eq(c.moe_inter_dim, 2048);
    ck_assert_int_eq(c.window_size, 128);
    ck_assert_int_eq(c.index_topk, 512);
    ck_assert_int_eq(c.original_seq_len, 65536);
    ck_assert(c.rope_factor == 16.0 && c.beta_fast == 32.0 && c.beta_slow == 1.0);
    ck_assert(c.compress_rope_theta == 160000.0 && c.rope_theta == 10000.0);
    ck_assert(c.route_scale == 1.5 && c.swiglu_limit == 10.0 && c.norm_eps == 1e-6 && c.hc_eps == 1e-6);
    ck_assert_int_eq(c.score_func, MMOE_SCORE_SQRTSOFTPLUS);
    ck_assert_int_eq(c.n_ratios, 44);
    ck_assert_int_eq(c.compress_ratios[0], 0);
    ck_assert_int_eq(c.compress_ratios[2], 4);
    ck_assert_int_eq(c.compress_ratios[3], 128);
    ck_assert_int_eq(c.compress_ratios[42], 4);
    ck_assert_int_eq(c.compress_ratios[43], 0);
    ck_assert_int_eq(c.weight_block_n, 128);
    /* the initial HF revision has no expert_dtype: decided by the checkpoint */
    ck_assert_int_eq(c.expert_dtype, MMOE_EXPERT_UNSET);
}
END_TEST

START_TEST(flash_reference_keys_and_defaults)
{
    char p[4096];
    mmoe_config hf, ref;
    mmoe_error err;
    mmoe_error_clear(&err);
    fixture("deepseek-v4-flash.inference.json", p, sizeof p);
    ck_assert_msg(mmoe_config_load(p, &ref, &err) == MMOE_OK, "%s", err.msg);
    fixture("deepseek-v4-flash.json", p, sizeof p);
    ck_assert(mmoe_config_load(p, &hf, &err) == MMOE_OK);
    /* the ref file sets no norm_eps, hc_eps, n_mtp_layers, max_seq_len: the ref's defaults */
    ck_assert(ref.norm_eps == 1e-6 && ref.hc_eps == 1e-6);
    ck_assert_int_eq(ref.n_mtp_layers, 1);
    ck_assert_int_eq(ref.max_seq_len, 4096);
    ck_assert_int_eq(ref.expert_dtype, MMOE_EXPERT_FP4);
    /* every architectural number agrees with the HF spelling */
    ck_assert_int_eq(ref.dim, hf.dim);
    ck_assert_int_eq(ref.n_layers, hf.n_layers);
    ck_assert_int_eq(ref.q_lora_rank, hf.q_lora_rank);
    ck_assert_int_eq(ref.original_seq_len, hf.original_seq_len);
    ck_assert(ref.rope_factor == hf.rope_factor && ref.route_scale == hf.route_scale);
    ck_assert_int_eq(ref.n_ratios, hf.n_ratios);
    ck_assert_mem_eq(ref.compress_ratios, hf.compress_ratios, sizeof ref.compress_ratios);
}
END_TEST

START_TEST(pro_and_v41)
{
    char p[4096];
    mmoe_config c;
    mmoe_error err;
    mmoe_error_clear(&err);
    fixture("deepseek-v4-pro.json", p, sizeof p);
    ck_assert_msg(mmoe_config_load(p, &c, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(c.dim, 7168);
    ck_assert_int_eq(c.n_layers, 61);
    ck_assert_int_eq(c.o_groups, 16);
    ck_assert_int_eq(c.compress_ratios[0], 128);
    ck_assert_int_eq(c.compress_ratios[61], 0);
    ck_assert(c.route_scale == 2.5);
    ck_assert_int_eq(c.expert_dtype, MMOE_EXPERT_FP4);
    /* V4.1: keys under text_config, 32x32 blocks, eps 1e-20, ratios 2 and 1, 3 MTP layers */
    fixture("deepseek-v4.1-flash.RECONSTRUCTED_NOT_VERBATIM.json", p, sizeof p);
    ck_assert_msg(mmoe_config_load(p, &c, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_int_eq(c.dim, 5120);
    ck_assert_int_eq(c.weight_block_n, 32);
    ck_assert_int_eq(c.weight_block_k, 32);
    ck_assert(c.norm_eps == 1e-20);
    ck_assert_int_eq(c.n_hash_layers, 0);
    ck_assert_int_eq(c.n_mtp_layers, 3);
    ck_assert_int_eq(c.compress_ratios[2], 2);
    ck_assert_int_eq(c.compress_ratios[39], 1);
    ck_assert_int_eq(c.expert_dtype, MMOE_EXPERT_FP4);
}
END_TEST

/** Parse the tiny preset's JSON with one key replaced (or removed when @p val is NULL). */
static mmoe_status parse_modified(const char *key, const char *val, mmoe_error *err)
{
    mmoe_config c;
    char *json = NULL;
    ck_assert(mmoe_config_preset("tiny", 0, &c, err) == MMOE_OK);
    ck_assert(mmoe_config_to_json(&c, &json, err) == MMOE_OK);
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *at = strstr(json, pat);
    ck_assert_msg(at != NULL, "key %s not in the JSON", key);
    char *vend = at + strlen(pat);
    int depth = 0;
    while (*vend && !(depth == 0 && (*vend == ',' || *vend == '\n' || *vend == '}'))) {
        depth += (*vend == '[' || *vend == '{') - (*vend == ']' || *vend == '}');
        vend++;
    }
    size_t cap = strlen(json) + 256;
    char *mod = malloc(cap);
    if (val)
        snprintf(mod, cap, "%.*s%s%s%s", (int)(at - json), json, pat, val, vend);
    else /* remove "key": value, (the preset never ends with this key) */
        snprintf(mod, cap, "%.*s%s", (int)(at - json), json, vend + (*vend == ',' ? 1 : 0));
    mmoe_status st = mmoe_config_parse(mod, "config.json", &c, err);
    free(mod);
    free(json);
    return st;
}

START_TEST(errors_name_the_key)
{
    mmoe_error err;
    static const struct {
        const char *key, *val;
        mmoe_status want;
        const char *in_msg;
    } cases[] = {
        {"hidden_size", NULL, MMOE_ENOTFOUND, "'hidden_size'"},
        {"num_experts_per_tok", "0", MMOE_ERANGE, "'num_experts_per_tok'"},
        {"num_experts_per_tok", "9", MMOE_ERANGE, "'num_experts_per_tok'"},
        {"o_groups", "3", MMOE_ERANGE, "'o_groups'"},
        {"q_lora_rank", "192", MMOE_ERANGE, "'q_lora_rank'"},
        {"hidden_size", "\"256\"", MMOE_EFORMAT, "'hidden_size'"},
        {"num_attention_heads", "4.5", MMOE_EFORMAT, "'num_attention_heads'"},
        {"compress_ratios", "[0, 4, 128]", MMOE_ERANGE, "'compress_ratios'"},
        {"compress_ratios", "[0, 4, 8, 4, 0]", MMOE_ERANGE, "'compress_ratios[2]'"},
        {"scoring_func", "\"relu\"", MMOE_ERANGE, "'scoring_func'"},
        {"weight_block_size", "[64, 64]", MMOE_ERANGE, "weight_block_size"},
        {"num_key_value_heads", "2", MMOE_ERANGE, "'num_key_value_heads'"},
        {"num_hash_layers", "7", MMOE_ERANGE, "'num_hash_layers'"},
        {"qk_rope_head_dim", "96", MMOE_ERANGE, "head_dim"},
        {"index_head_dim", "96", MMOE_ERANGE, "'index_head_dim'"},
        {"expert_dtype", "\"fp16\"", MMOE_ERANGE, "'expert_dtype'"},
        /* no rope_scaling at all: the compressed layers' YaRN needs its original length, named */
        {"rope_scaling", NULL, MMOE_ERANGE, "'rope_scaling.original_max_position_embeddings' is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mmoe_error_clear(&err);
        mmoe_status st = parse_modified(cases[i].key, cases[i].val, &err);
        ck_assert_msg(st == cases[i].want, "%s=%s: status %s, expected %s (%s)", cases[i].key,
                      cases[i].val ? cases[i].val : "(removed)", mmoe_status_name(st), mmoe_status_name(cases[i].want),
                      err.msg);
        ck_assert_msg(strstr(err.msg, cases[i].in_msg) != NULL, "message '%s' does not name %s", err.msg,
                      cases[i].in_msg);
        /* ... and the file: range checks too, not only the reader (parse_modified names it config.json) */
        ck_assert_msg(strncmp(err.msg, "config.json: ", 13) == 0, "message '%s' does not start with the file", err.msg);
    }
    mmoe_config c;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_config_parse("{\"hidden_size\": ", "bad.json", &c, &err), MMOE_EFORMAT);
    ck_assert(strstr(err.msg, "bad.json") != NULL);
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_config_load("/nonexistent/config.json", &c, &err), MMOE_ENOTFOUND);
    ck_assert(strstr(err.msg, "/nonexistent/config.json") != NULL);
}
END_TEST

START_TEST(config_size_cap_is_64_mib)
{
    /* "{" + spaces + "}": valid JSON of 70 MiB, past the cap, refused as "not a config" */
    char dir[512], path[600];
    ck_assert_int_eq(mmoe_test_mkdtemp(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const size_t n = (size_t)70 << 20;
    char *big = malloc(n);
    ck_assert_ptr_nonnull(big);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    mmoe_test_write_file(path, big, n);
    free(big);
    mmoe_config c;
    mmoe_error err;
    mmoe_error_clear(&err);
    ck_assert_int_eq(mmoe_config_load(path, &c, &err), MMOE_EFORMAT);
    ck_assert_msg(strstr(err.msg, "larger than 64 MiB, not a config") != NULL, "%s", err.msg);
    mmoe_test_rmtree(dir);
}
END_TEST

START_TEST(presets_round_trip)
{
    static const char *names[] = {"tiny", "v4-flash", "v4-pro"};
    mmoe_error err;
    mmoe_error_clear(&err);
    for (int i = 0; i < 3; i++) {
        mmoe_config a, b;
        char *json = NULL;
        ck_assert_msg(mmoe_config_preset(names[i], 0, &a, &err) == MMOE_OK, "%s", err.msg);
        ck_assert(mmoe_config_to_json(&a, &json, &err) == MMOE_OK);
        ck_assert_msg(mmoe_config_parse(json, names[i], &b, &err) == MMOE_OK, "%s", err.msg);
        ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "%s: config changed through JSON", names[i]);
        free(json);
    }
    /* the tiny shape keeps every layer type with 3 layers: hash + window, hash + ratio 4, ratio 128, MTP window */
    mmoe_config t;
    ck_assert(mmoe_config_preset("tiny", 3, &t, &err) == MMOE_OK);
    ck_assert_int_eq(t.compress_ratios[0], 0);
    ck_assert_int_eq(t.compress_ratios[1], 4);
    ck_assert_int_eq(t.compress_ratios[2], 128);
    ck_assert_int_eq(t.compress_ratios[3], 0);
    ck_assert_int_eq(t.n_hash_layers, 2);
    ck_assert_int_eq(t.n_mtp_layers, 1);
    /* v4-flash with 5 layers: the published pattern's first 5 entries */
    ck_assert(mmoe_config_preset("v4-flash", 5, &t, &err) == MMOE_OK);
    ck_assert_int_eq(t.n_ratios, 6);
    ck_assert_int_eq(t.compress_ratios[1], 0);
    ck_assert_int_eq(t.compress_ratios[4], 4);
    ck_assert_int_eq(mmoe_config_preset("huge", 0, &t, &err), MMOE_EINVAL);
    ck_assert(strstr(err.msg, "huge") != NULL);
}
END_TEST

/*
 * The tensor list of the V4-Flash config against the published checkpoint facts: 69,187 tensors, 159,609,485,896 bytes.  A
 * wrong shape, dtype or a missing/extra tensor anywhere would change one of the two.
 */
START_TEST(flash_tensor_list_matches_published_checkpoint)
{
    char p[4096];
    mmoe_config c;
    mmoe_error err;
    mmoe_error_clear(&err);
    fixture("deepseek-v4-flash.json", p, sizeof p);
    ck_assert(mmoe_config_load(p, &c, &err) == MMOE_OK);
    c.expert_dtype = MMOE_EXPERT_FP4; /* the current revision's value */
    mmoe_tensor_spec *specs = NULL;
    size_t n = 0;
    ck_assert_msg(mmoe_model_tensor_list(&c, &specs, &n, &err) == MMOE_OK, "%s", err.msg);
    ck_assert_uint_eq(n, 69187);
    ck_assert_uint_eq(mmoe_model_tensor_bytes(specs, n), 159609485896ull);
    /* spot checks from the checkpoint table of docs/spec/architecture.md */
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        const mmoe_tensor_spec *s = &specs[i];
        if (strcmp(s->name, "layers.2.attn.indexer.compressor.ape") == 0) {
            ck_assert(s->dtype == MMOE_DT_F32 && s->shape[0] == 4 && s->shape[1] == 256);
            seen++;
        } else if (strcmp(s->name, "layers.3.attn.compressor.wkv.weight") == 0) {
            ck_assert(s->dtype == MMOE_DT_BF16 && s->shape[0] == 512 && s->shape[1] == 4096);
            seen++;
        } else if (strcmp(s->name, "layers.0.ffn.gate.tid2eid") == 0) {
            ck_assert(s->dtype == MMOE_DT_I64 && s->shape[0] == 129280 && s->shape[1] == 6);
            seen++;
        } else if (strcmp(s->name, "layers.7.ffn.experts.255.w2.scale") == 0) {
            ck_assert(s->dtype == MMOE_DT_F8_E8M0 && s->shape[0] == 4096 && s->shape[1] == 64);
            seen++;
        } else if (strcmp(s->name, "mtp.0.e_proj.scale") == 0) {
            ck_assert(s->shape[0] == 32 && s->shape[1] == 32);
            seen++;
        } else if (strcmp(s->name, "layers.5.attn.wo_a.scale") == 0) {
            ck_assert(s->shape[0] == 64 && s->shape[1] == 32);
            seen++;
        }
    }
    ck_assert_int_eq(seen, 6);
    free(specs);
    /* V4.1 layer types have no published layout: refused, naming the layer */
    fixture("deepseek-v4.1-flash.RECONSTRUCTED_NOT_VERBATIM.json", p, sizeof p);
    ck_assert(mmoe_config_load(p, &c, &err) == MMOE_OK);
    ck_assert_int_eq(mmoe_model_tensor_list(&c, &specs, &n, &err), MMOE_EUNSUPPORTED);
    ck_assert(strstr(err.msg, "compress_ratios[2]") != NULL);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, flash_hf_keys);
    tcase_add_test(tc, flash_reference_keys_and_defaults);
    tcase_add_test(tc, pro_and_v41);
    tcase_add_test(tc, errors_name_the_key);
    tcase_add_test(tc, config_size_cap_is_64_mib);
    tcase_add_test(tc, presets_round_trip);
    tcase_add_test(tc, flash_tensor_list_matches_published_checkpoint);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    mmoe_test_seed("config");
    return mmoe_test_run(config_suite());
}
