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

/* ---- helpers (cli_util.c) ---- */
#include <stddef.h>
/* "125M", "1.5B", "10000000", "1e9" -> a count (decimal suffixes k, M, B/G);
 * 0 on success, -1 on a malformed value. */
int zpp_cli_parse_count(const char *s, size_t *out);
/* A decimal integer in [lo, 2^24]; 0 on success, -1 otherwise. */
int zpp_cli_parse_int(const char *s, int lo, int *out);
/* Monotonic clock in milliseconds. */
double zpp_cli_now_ms(void);
/* Median of n values (sorts them). */
double zpp_cli_median(double *t, int n);
/* 1234567 -> "1.23 MB" (decimal units, as network rates are quoted). */
const char *zpp_cli_bytes(double b, char *buf, size_t cap);

#endif
