/**
 * @file mmoe_cli.h
 * @brief The `megamoe` program: one entry point per subcommand.
 *
 * main() (src/cli/main.c) looks the first argument up in a table and calls the
 * subcommand with the remaining arguments (argv[0] is "megamoe NAME", so that getopt's own
 * messages carry the same prefix as the command's).
 * Each subcommand lives in its own file `src/cli/cmd_<name>.c`, parses its own
 * options with getopt_long, prints `--help`, and returns the process exit
 * status: 0 on success, 1 on a runtime error (with a message on stderr that
 * names the file, tensor or option), 2 on a usage error.
 */
#ifndef MMOE_CLI_H
#define MMOE_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "mmoe_error.h"

/** Exit status of a usage error (unknown option, missing argument). */
#define MMOE_EXIT_USAGE 2

/**
 * @name Numeric option values (cli_args.c)
 *
 * Every numeric option of every command is parsed here: the whole string must be the
 * number (decimal, or hexadecimal after `0x`; no blank, no trailing character), it must
 * fit, and it must lie in the option's range.  A rejected value gives
 * `megamoe CMD: --OPT: expected an integer in [LO, HI], got 'VALUE'`.
 * @{
 */

/** Open ends of a double range for mmoe_cli_parse_f64() (bit flags; 0: both ends closed). */
enum mmoe_cli_open {
    MMOE_CLI_LO_OPEN = 1u, /**< the lower bound itself is refused: (lo, ... */
    MMOE_CLI_HI_OPEN = 2u  /**< the upper bound itself is refused: ..., hi) */
};

/**
 * Parse a signed integer in [@p lo, @p hi].
 * @return MMOE_OK and *@p v, or MMOE_EINVAL with "expected an integer in [lo, hi], got 'S'"
 */
mmoe_status mmoe_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *v, mmoe_error *err);

/** Parse an unsigned integer in [@p lo, @p hi] (a minus sign is refused); as mmoe_cli_parse_i64(). */
mmoe_status mmoe_cli_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *v, mmoe_error *err);

/**
 * Parse a finite number in the range from @p lo to @p hi (either may be +-INFINITY: unbounded),
 * with the ends named in @p open (::mmoe_cli_open flags) excluded.
 * @return MMOE_OK and *@p v, or MMOE_EINVAL with "expected a number in (lo, hi], got 'S'"
 */
mmoe_status mmoe_cli_parse_f64(const char *s, double lo, double hi, unsigned open, double *v, mmoe_error *err);

/**
 * Parse a comma-separated list of at most @p max_n integers in [@p lo, @p hi] ("1,8,64").
 * @param s      the text
 * @param lo     smallest value taken
 * @param hi     largest value taken
 * @param max_n  most items taken
 * @param items  receives a malloc'd array (caller frees), NULL on failure
 * @param n      receives the count (>= 1: an empty item is refused)
 * @param err    message on failure
 * @return MMOE_OK, MMOE_EINVAL naming the item ("item 2: expected ..."), MMOE_ENOMEM
 */
mmoe_status mmoe_cli_parse_i64_list(const char *s, int64_t lo, int64_t hi, size_t max_n, int64_t **items, size_t *n,
                                    mmoe_error *err);

/**
 * The getopt-loop forms: parse the value @p s of option --@p opt of command @p cmd
 * ("moe", "bench moe"); on failure print `megamoe CMD: --OPT: ...` on stderr.
 * @return 0 (value stored) or ::MMOE_EXIT_USAGE (nothing stored)
 */
int mmoe_cli_opt_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *v);
/**
 * Report the option getopt refused in command @p cmd: "megamoe CMD: option 'ARG' needs a
 * value" when @p needs_value (a known option without its value), else "unknown option".
 */
void mmoe_cli_bad_option(const char *cmd, int needs_value, const char *arg);
/** As mmoe_cli_opt_i64() into an int. */
int mmoe_cli_opt_int(const char *cmd, const char *opt, const char *s, int lo, int hi, int *v);
/** As mmoe_cli_opt_i64() for an unsigned value. */
int mmoe_cli_opt_u64(const char *cmd, const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *v);
/** As mmoe_cli_opt_i64() for a number (see mmoe_cli_parse_f64()). */
int mmoe_cli_opt_f64(const char *cmd, const char *opt, const char *s, double lo, double hi, unsigned open, double *v);
/** As mmoe_cli_opt_i64() for a list (see mmoe_cli_parse_i64_list()); 1 when out of memory. */
int mmoe_cli_opt_i64_list(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, size_t max_n,
                          int64_t **items, size_t *n);

/** @} */

/**
 * @name Shared by the commands (cli_util.c)
 * @{
 */

/** A path given on the command line and the option that gave it (for messages). */
typedef struct mmoe_cli_path {
    const char *opt;  /**< the option's name without dashes ("out", "weights") */
    const char *path; /**< the path (NULL: option not given, skipped) */
    int is_output;    /**< set internally when comparing two outputs */
} mmoe_cli_path;

/**
 * Refuse outputs that would replace an input or another output: same device and inode after
 * following links; a directory input stands for every file directly in it (a checkpoint).
 * @return MMOE_OK or MMOE_EINVAL naming both options and paths
 */
mmoe_status mmoe_cli_check_outputs(const mmoe_cli_path *outs, size_t n_out, const mmoe_cli_path *ins, size_t n_in,
                                   mmoe_error *err);

/** `--threads N` of the MoE commands: OpenBLAS threads and MoE dequantization threads (N <= 0: leave the defaults). */
void mmoe_cli_set_threads(int n);

/**
 * `--threads N` of the commands that run the forward: N worker threads (N <= 0: the pool's
 * default), OpenBLAS one thread (without `--threads`, unless OPENBLAS_NUM_THREADS is set).
 * See cli_util.c, "Threads".
 */
void mmoe_cli_set_forward_threads(int n);

/** Most threads `--threads` accepts. */
#define MMOE_CLI_MAX_THREADS 1024

/** May progress lines (rewritten in place with a carriage return) be printed?  Only when stderr is a terminal. */
int mmoe_cli_progress_allowed(void);

struct mmoe_config;

/**
 * The CPU forward's peer (bench_forward_peer.c): one step of @p T tokens of the model of @p c as
 * OpenBLAS SGEMM on FP32 weights, the median of @p reps timed runs after a warm-up.
 * @param c        the model's configuration (its shapes)
 * @param T        tokens of the step, >= 1
 * @param reps     timed runs, >= 1
 * @param seconds  written: the median step time
 * @param flops    written: the step's products' floating-point operations
 * @param err      the message of a failure
 * @return MMOE_OK, MMOE_EINVAL or MMOE_ENOMEM (the message gives the FP32 weight buffer's size)
 */
mmoe_status mmoe_bench_forward_peer(const struct mmoe_config *c, int64_t T, int reps, double *seconds, double *flops,
                                    mmoe_error *err);

/** @} */

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
int mmoe_cmd_serve(int argc, char **argv);       /**< `megamoe serve`: the OpenAI-compatible server */
int mmoe_cmd_perplexity(int argc, char **argv);  /**< `megamoe perplexity` */

#endif /* MMOE_CLI_H */
