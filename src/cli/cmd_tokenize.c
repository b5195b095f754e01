/**
 * @file cmd_tokenize.c
 * @brief `megamoe tokenize`: not implemented yet (issue 6).
 *
 * This placeholder keeps the command table complete; it prints what is
 * missing and exits with status 1.  The issue that owns it replaces this file.
 */
#include <stdio.h>

#include "mmoe_cli.h"

int mmoe_cmd_tokenize(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe tokenize: not implemented yet (see issue 6)\n");
    return 1;
}
