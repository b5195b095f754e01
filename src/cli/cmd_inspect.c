/**
 * @file cmd_inspect.c
 * @brief `megamoe inspect`: not implemented yet (issue 2).
 *
 * This placeholder keeps the command table complete; it prints what is
 * missing and exits with status 1.  The issue that owns it replaces this file.
 */
#include <stdio.h>

#include "mmoe_cli.h"

int mmoe_cmd_inspect(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe inspect: not implemented yet (see issue 2)\n");
    return 1;
}
