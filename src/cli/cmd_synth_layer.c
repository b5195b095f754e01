/**
 * @file cmd_synth_layer.c
 * @brief `megamoe synth-layer`: not implemented yet (issue 3).
 *
 * This placeholder keeps the command table complete; it prints what is
 * missing and exits with status 1.  The issue that owns it replaces this file.
 */
#include <stdio.h>

#include "mmoe_cli.h"

int mmoe_cmd_synth_layer(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe synth-layer: not implemented yet (see issue 3)\n");
    return 1;
}
