/* tools/cli.h — the subcommands of the zeropp command. Each returns the
 * process exit code; only tools/ prints errors and exits. */
#ifndef ZPP_TOOLS_CLI_H
#define ZPP_TOOLS_CLI_H

int zpp_cli_train(int argc, char **argv);
int zpp_cli_bench_quant(int argc, char **argv);
int zpp_cli_bench_comm(int argc, char **argv);
int zpp_cli_plan(int argc, char **argv);

/* Prints "zeropp: <context>: <zpp_last_error()>" to stderr, returns 1. */
int zpp_cli_fail(const char *context, int status);

#endif
