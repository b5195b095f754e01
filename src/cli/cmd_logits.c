/**
 * @file cmd_logits.c
 * @brief `megamoe logits`: not implemented yet (issue 5).
 *
 * This placeholder keeps the command table complete; it prints what is
 * missing and exits with status 1.  The issue that owns it replaces this file.
 */
#include <stdio.h>

#include "mmoe_cli.h"

int mmoe_cmd_logits(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe logits: not implemented yet (see issue 5)\n");
    return 1;
}
