/**
 * @file main.c
 * @brief `megamoe`: the command-line front end (subcommand dispatch).
 *
 * `megamoe COMMAND [OPTIONS]`; `megamoe COMMAND --help` describes each command.
 * Before a command runs, the signal handlers of mmoe_cleanup.h are installed: an
 * interrupted run leaves no temporary file behind.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "mmoe_cleanup.h"
#include "mmoe_cli.h"

/** One subcommand: its name on the command line, its entry point and a one-line summary. */
typedef struct cli_command {
    const char *name;                  /**< the word after `megamoe` */
    int (*run)(int argc, char **argv); /**< entry point; argv[0] is "megamoe NAME" (getopt's message prefix) */
    const char *summary;               /**< one line for `megamoe --help` */
} cli_command;

/** The command table, in the order `megamoe --help` lists it. */
static const cli_command commands[] = {
    {"generate", mmoe_cmd_generate, "generate text with a DeepSeek-V4 checkpoint"},
    {"serve", mmoe_cmd_serve, "an OpenAI-compatible HTTP server (completions, chat)"},
    {"perplexity", mmoe_cmd_perplexity, "perplexity of a text file"},
    {"logits", mmoe_cmd_logits, "write the logits of a token sequence (CPU forward)"},
    {"moe", mmoe_cmd_moe, "run one fused MoE layer on an input file"},
    {"bench", mmoe_cmd_bench, "benchmarks: `bench moe`, `bench forward`"},
    {"inspect", mmoe_cmd_inspect, "list the tensors of a safetensors file or checkpoint"},
    {"tokenize", mmoe_cmd_tokenize, "encode text, decode ids, render a chat"},
    {"synth-layer", mmoe_cmd_synth_layer, "write a random MoE layer with real shapes and dtypes"},
    {"synth-model", mmoe_cmd_synth_model, "write a random checkpoint directory"},
};

/** Print the list of commands to @p out. */
static void usage(FILE *out)
{
    fprintf(out, "usage: megamoe COMMAND [OPTIONS]   (megamoe COMMAND --help for details)\n\n"
                 "DeepSeek-V4 fused MoE layer and forward pass: CPU oracle and GPU fast path.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n  --version    print the version and build features\n");
}

/** Print the version and the features this binary was built with. */
static void version(void)
{
    printf("megamoe %s\n", PACKAGE_VERSION);
#ifdef MMOE_HAVE_CUDA
    printf("  GPU path: built (CUDA)\n");
#else
    printf("  GPU path: not built (CPU only)\n");
#endif
#ifdef MMOE_HAVE_NCCL
    printf("  NCCL: yes\n");
#else
    printf("  NCCL: no\n");
#endif
}

/** Dispatch `megamoe COMMAND ...` to the command's entry point. */
int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return MMOE_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        version();
        return 0;
    }
    /* Ctrl-C, SIGTERM, SIGHUP remove the temporaries of unfinished outputs; a mapped input that
     * shrinks under us is named instead of a bare SIGBUS (mmoe_cleanup.h) */
    mmoe_error err;
    mmoe_error_clear(&err);
    if (mmoe_cleanup_install(&err) != MMOE_OK) {
        fprintf(stderr, "megamoe: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0) {
            /* getopt names argv[0] in its messages: make it the prefix every message has */
            char prog[64];
            snprintf(prog, sizeof prog, "megamoe %s", commands[i].name);
            argv[1] = prog;
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "megamoe: unknown command '%s'\n", name);
    usage(stderr);
    return MMOE_EXIT_USAGE;
}
