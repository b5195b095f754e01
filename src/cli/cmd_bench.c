/**
 * @file cmd_bench.c
 * @brief `megamoe bench WHAT`: dispatch to the benchmarks (`moe`, `forward`).
 */
#include <stdio.h>
#include <string.h>

#include "mmoe_cli.h"

int mmoe_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "usage: megamoe bench moe [OPTIONS]       fused MoE layer (megamoe bench moe --help)\n"
                     "       megamoe bench forward [OPTIONS]   full forward (megamoe bench forward --help)\n");
        return argc < 2 ? MMOE_EXIT_USAGE : 0;
    }
    char prog[] = "megamoe bench moe", prog_fwd[] = "megamoe bench forward"; /* getopt's message prefix */
    if (strcmp(argv[1], "moe") == 0) {
        argv[1] = prog;
        return mmoe_cmd_bench_moe(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "forward") == 0) {
        argv[1] = prog_fwd;
        return mmoe_cmd_bench_forward(argc - 1, argv + 1);
    }
    fprintf(stderr, "megamoe bench: unknown benchmark '%s' (expected moe or forward)\n", argv[1]);
    return MMOE_EXIT_USAGE;
}
