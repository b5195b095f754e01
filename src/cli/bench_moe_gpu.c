/**
 * @file bench_moe_gpu.c
 * @brief The GPU layer's benchmark (`megamoe bench moe --backend gpu`) and its PyTorch peer.
 *
 * For each token count T the benchmark draws inputs on the host (x ~ N(0,1)
 * in BF16; top-6 distinct experts uniform at random, weights uniform), builds
 * the layer once with random weights drawn on the device (a full V4-Flash
 * layer is 3.4 GB of MXFP4; uploading it from the host would only slow the
 * benchmark down), and times mmoe_gpu_moe_time(): one call captured into a
 * CUDA graph, warm-up replays, then many replays each between two CUDA events;
 * the median is reported.
 *
 * Work and bytes are counted as the issue defines them:
 *   FLOP  = 42 * D * I per token: 6 routed + 1 shared expert, 3 matrices,
 *           2 FLOP per multiply-add (masked slots: none here);
 *   bytes = weight bytes of the distinct routed experts the call touches
 *           (E2M1 codes 3*D*I/2 + UE8M0 scales 3*D*I/32) + the shared expert
 *           (E4M3 3*D*S*I + its scales).
 * The peer (bench/torch_peer.py) receives the same x, topk_idx and topk_w
 * through files in a temporary directory and prints one line per T; its
 * numbers are merged into the table with the ratio peer_time / our_time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_moe_gpu.h"
#include "mmoe_cli.h"
#include "mmoe_formats.h"
#include "mmoe_gpu_moe.h"
#include "mmoe_rng.h"

/** A named layer shape. */
typedef struct bench_shape {
    const char *name; /**< --shape name */
    int D;            /**< hidden */
    int I;            /**< routed width */
    int E;            /**< routed experts */
    int topk;         /**< slots per token */
    int SI;           /**< shared width */
} bench_shape;

/** The shapes of @ref spec_arch_config. */
static const bench_shape shapes[] = {
    {"v4-flash", 4096, 2048, 256, 6, 2048},
    {"v4.1-flash", 5120, 2304, 384, 6, 2304},
    {"v4-pro", 7168, 3072, 384, 6, 3072},
    {"tiny", 256, 256, 8, 2, 256},
};

/** Write the inputs of one T for the peer: x.bf16, idx.i32, w.f32 in @p dir. */
static int dump_inputs(const char *dir, int T, int D, int K, const uint16_t *x, const int32_t *idx, const float *w)
{
    char path[512];
    struct { const char *name; const void *p; size_t n; } f[3] = {
        {"x", x, (size_t)T * D * 2}, {"idx", idx, (size_t)T * K * 4}, {"w", w, (size_t)T * K * 4}};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s_%d.bin", dir, f[i].name, T);
        FILE *fp = fopen(path, "wb");
        if (fp == NULL)
            return -1;
        size_t wrote = fwrite(f[i].p, 1, f[i].n, fp);
        if (fclose(fp) != 0 || wrote != f[i].n)
            return -1;
    }
    return 0;
}

int mmoe_bench_moe_gpu(int argc, char **argv)
{
    const char *shape_name = "v4-flash", *tokens_s = "1,8,32,128,512,2048,8192", *peer = NULL;
    const char *cmd_name = "bench moe";
    int iters = 50, experts = 0, block_m = 0;
    uint64_t seed = 1234;
    mmoe_gpu_recipe recipe = MMOE_GPU_RECIPE_AUTO;
    mmoe_gpu_gemm gemm = MMOE_GPU_GEMM_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--backend") == 0 && v) {
            i++;
        } else if (strcmp(a, "--shape") == 0 && v) {
            shape_name = v, i++;
        } else if (strcmp(a, "--tokens") == 0 && v) {
            tokens_s = v, i++;
        } else if ((strcmp(a, "--iters") == 0 || strcmp(a, "--reps") == 0) && v) {
            if (mmoe_cli_opt_int(cmd_name, a + 2, v, 1, 1000000, &iters) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--block-m") == 0 && v) {
            if (mmoe_cli_opt_int(cmd_name, "block-m", v, 0, 1024, &block_m) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--gemm") == 0 && v) {
            if (mmoe_gpu_gemm_parse(v, &gemm) != 0) {
                fprintf(stderr, "megamoe bench moe: --gemm must be auto, mma or wgmma, got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--experts") == 0 && v) {
            if (mmoe_cli_opt_int(cmd_name, "experts", v, 1, 1 << 16, &experts) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--peer") == 0 && v) {
            peer = v, i++;
        } else if (strcmp(a, "--seed") == 0 && v) {
            if (mmoe_cli_opt_u64(cmd_name, "seed", v, 0, UINT64_MAX, &seed) != 0)
                return MMOE_EXIT_USAGE;
            i++;
        } else if (strcmp(a, "--shared") == 0 && v) {
            if (strcmp(v, "serial") == 0) {
                fprintf(stderr, "megamoe bench moe: the GPU layer has no serial shared path (--shared fused|auto)\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--recipe") == 0 && v) {
            if (strcmp(v, "sm90") == 0)
                recipe = MMOE_GPU_RECIPE_SM90;
            else if (strcmp(v, "sm100") == 0)
                recipe = MMOE_GPU_RECIPE_SM100;
            else {
                fprintf(stderr, "megamoe bench moe: --recipe must be sm90 or sm100, got '%s'\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "megamoe bench moe: unknown or incomplete option '%s'\n"
                            "usage: bench moe --backend gpu [--shape S] [--experts N] [--tokens LIST] [--iters N]\n"
                            "       [--recipe sm90|sm100] [--block-m 16|64|128] [--gemm auto|mma|wgmma]\n"
                            "       [--peer PATH|none] [--seed S]\n", a);
            return 2;
        }
    }
    const bench_shape *sh = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, shape_name) == 0)
            sh = &shapes[i];
    if (sh == NULL) {
        fprintf(stderr, "megamoe bench moe: unknown shape '%s' (v4-flash, v4.1-flash, v4-pro, tiny)\n", shape_name);
        return 2;
    }
    int Ts[64];
    int64_t *tlist = NULL;
    size_t nlist = 0;
    if (mmoe_cli_opt_i64_list(cmd_name, "tokens", tokens_s, 1, 1 << 20, 64, &tlist, &nlist) != 0)
        return MMOE_EXIT_USAGE;
    const int nT = (int)nlist;
    for (int it = 0; it < nT; it++)
        Ts[it] = (int)tlist[it];
    free(tlist);
    mmoe_error err;
    int cc = 0;
    if (mmoe_gpu_available(&cc, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        return 77;
    }
    mmoe_gpu_moe_desc d;
    memset(&d, 0, sizeof d);
    d.hidden = sh->D;
    d.inter = sh->I;
    d.n_experts = experts > 0 ? experts : sh->E;
    d.topk = sh->topk;
    d.shared_inter = sh->SI;
    d.swiglu_limit = 10.0f;
    d.recipe = recipe;
    d.block_m = block_m;
    d.gemm = gemm;
    mmoe_gpu_moe *L = NULL;
    if (mmoe_gpu_moe_create(&d, NULL, seed, &L, &err) != MMOE_OK) {
        fprintf(stderr, "megamoe bench moe: %s\n", err.msg);
        return 1;
    }
    /* peer inputs */
    char dir[] = "/tmp/mmoe-bench-XXXXXX";
    int have_dir = mkdtemp(dir) != NULL;
    char peer_path[1024] = "";
    if (peer == NULL) {
        const char *src = getenv("MMOE_SRCDIR");
        snprintf(peer_path, sizeof peer_path, "%s/bench/torch_peer.py", src ? src : ".");
        if (access(peer_path, R_OK) != 0)
            peer_path[0] = '\0';
    } else if (strcmp(peer, "none") != 0) {
        snprintf(peer_path, sizeof peer_path, "%s", peer);
    }

    const double D = d.hidden, I = d.inter, SI = d.shared_inter;
    const double routed_bytes_per_expert = 3.0 * D * I / 2.0 + 3.0 * D * I / 32.0;
    const double shared_bytes = 3.0 * D * SI + 3.0 * D * SI / 32.0;
    double us[64], tflops[64], gbs[64];
    mmoe_gpu_moe_result res;
    memset(&res, 0, sizeof res);
    printf("# megamoe bench moe --backend gpu: shape %s (D %d, I %d, E %d, top-%d, shared %d), %d timed calls each\n",
           sh->name, d.hidden, d.inter, d.n_experts, d.topk, d.shared_inter, iters);
    int rc = 0;
    for (int it = 0; it < nT; it++) {
        const int T = Ts[it], K = d.topk;
        mmoe_rng rng;
        mmoe_rng_seed(&rng, seed + (uint64_t)T);
        uint16_t *x = malloc((size_t)T * d.hidden * 2);
        int32_t *idx = malloc((size_t)T * K * 4);
        float *w = malloc((size_t)T * K * 4);
        char *touched = calloc((size_t)d.n_experts, 1);
        if (!x || !idx || !w || !touched) {
            fprintf(stderr, "megamoe bench moe: out of memory\n");
            free(x), free(idx), free(w), free(touched);
            rc = 1;
            break;
        }
        for (size_t i = 0; i < (size_t)T * d.hidden; i++)
            x[i] = mmoe_bf16_from_f32((float)mmoe_rng_normal(&rng));
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                int e, again;
                do {
                    e = (int)mmoe_rng_below(&rng, (uint64_t)d.n_experts);
                    again = 0;
                    for (int j = 0; j < k; j++)
                        again |= idx[t * K + j] == e;
                } while (again);
                idx[t * K + k] = e;
                w[t * K + k] = (float)(0.1 + 0.2 * mmoe_rng_uniform(&rng));
                touched[e] = 1;
            }
        int n_touched = 0;
        for (int e = 0; e < d.n_experts; e++)
            n_touched += touched[e];
        double med = 0, mn = 0;
        int n = T >= 2048 ? (iters + 3) / 4 : iters;
        if (mmoe_gpu_moe_time(L, T, x, idx, w, 3, n, &med, &mn, &res, &err) != MMOE_OK) {
            fprintf(stderr, "megamoe bench moe: T=%d: %s\n", T, err.msg);
            rc = 1;
        }
        us[it] = med;
        tflops[it] = 42.0 * D * I * T / (med * 1e-6) / 1e12;
        gbs[it] = (n_touched * routed_bytes_per_expert + shared_bytes) / (med * 1e-6) / 1e9;
        printf("T=%-5d  %10.1f us (min %.1f)  %7.1f TFLOP/s  %7.0f GB/s weights  block_m %d  experts touched %d%s\n",
               T, med, mn, tflops[it], gbs[it], res.block_m, n_touched, res.graph ? "" : "  (no CUDA graph)");
        fflush(stdout);
        if (have_dir && dump_inputs(dir, T, d.hidden, K, x, idx, w) != 0)
            have_dir = 0;
        free(x), free(idx), free(w), free(touched);
        if (rc != 0)
            break;
    }
    printf("# device sm_%d, recipe %s, kernel: %s%s%s\n# GPU weight bytes %.3f GB, exact-path blocks L1 %lld L2 %lld\n",
           res.device_cc, mmoe_gpu_recipe_name(res.recipe), res.kernel ? res.kernel : "?",
           res.fallback ? "; FALLBACK: " : "", res.fallback_reason, (double)res.gpu_weight_bytes / 1e9,
           (long long)res.exact_path_blocks_l1, (long long)res.exact_path_blocks_l2);
    mmoe_gpu_moe_destroy(L); /* free the GPU for the peer */
    if (rc == 0 && have_dir && peer_path[0] != '\0') {
        const char *py = getenv("PYTHON3");
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s %s --dir %s --D %d --I %d --E %d --topk %d --SI %d --tokens %s --iters %d 2>&1",
                 py && *py ? py : "python3", peer_path, dir, d.hidden, d.inter, d.n_experts, d.topk, d.shared_inter,
                 tokens_s, iters);
        fflush(stdout);
        FILE *pp = popen(cmd, "r");
        char line[1024];
        printf("# peer: %s\n", peer_path);
        printf("%-7s %12s %12s %12s %9s %9s\n", "T", "ours us", "torch bf16", "torch fp8", "bf16/ours", "fp8/ours");
        while (pp != NULL && fgets(line, sizeof line, pp) != NULL) {
            int T;
            double b, f;
            if (sscanf(line, "PEER T=%d bf16_us=%lf fp8_us=%lf", &T, &b, &f) == 3) {
                for (int it = 0; it < nT; it++)
                    if (Ts[it] == T)
                        printf("%-7d %12.1f %12.1f %12.1f %9.2f %9.2f\n", T, us[it], b, f,
                               b > 0 ? b / us[it] : NAN, f > 0 ? f / us[it] : NAN);
            } else {
                printf("# peer says: %s", line);
            }
        }
        if (pp != NULL)
            pclose(pp);
    }
    if (have_dir) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "megamoe bench moe: could not remove %s\n", dir);
    }
    return rc;
}
