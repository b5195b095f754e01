/**
 * @file cmd_bench_moe.c
 * @brief `megamoe bench moe`: not implemented yet (issue 3).
 *
 * This placeholder keeps the command table complete; it prints what is
 * missing and exits with status 1.  The issue that owns it replaces this file.
 */
#include <stdio.h>

#include "mmoe_cli.h"

int mmoe_cmd_bench_moe(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe bench moe: not implemented yet (see issue 3)\n");
    return 1;
}
