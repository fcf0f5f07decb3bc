/* tools/bench_quant.c — placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int zpp_cli_bench_quant(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "zeropp: 'bench_quant' is not built yet\n");
    return 1;
}
