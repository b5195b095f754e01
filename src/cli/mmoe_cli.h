/**
 * @file mmoe_cli.h
 * @brief The `megamoe` program: one entry point per subcommand.
 *
 * main() (src/cli/main.c) looks the first argument up in a table and calls the
 * subcommand with the remaining arguments (argv[0] is the subcommand's name).
 * Each subcommand lives in its own file `src/cli/cmd_<name>.c`, parses its own
 * options with getopt_long, prints `--help`, and returns the process exit
 * status: 0 on success, 1 on a runtime error (with a message on stderr that
 * names the file, tensor or option), 2 on a usage error.
 */
#ifndef MMOE_CLI_H
#define MMOE_CLI_H

/** Exit status of a usage error (unknown option, missing argument). */
#define MMOE_EXIT_USAGE 2

int mmoe_cmd_inspect(int argc, char **argv);     /**< `megamoe inspect FILE` */
int mmoe_cmd_moe(int argc, char **argv);         /**< `megamoe moe`: one MoE layer */
int mmoe_cmd_synth_layer(int argc, char **argv); /**< `megamoe synth-layer`: a random layer file */
int mmoe_cmd_bench(int argc, char **argv);       /**< `megamoe bench moe|forward` */
int mmoe_cmd_bench_moe(int argc, char **argv);   /**< `megamoe bench moe` */
int mmoe_cmd_bench_forward(int argc, char **argv); /**< `megamoe bench forward` */
int mmoe_cmd_logits(int argc, char **argv);      /**< `megamoe logits`: full-model logits */
int mmoe_cmd_synth_model(int argc, char **argv); /**< `megamoe synth-model`: a random checkpoint */
int mmoe_cmd_tokenize(int argc, char **argv);    /**< `megamoe tokenize` */
int mmoe_cmd_generate(int argc, char **argv);    /**< `megamoe generate` */

#endif /* MMOE_CLI_H */
