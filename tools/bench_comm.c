/* tools/bench_comm.c — placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int zpp_cli_bench_comm(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "zeropp: 'bench_comm' is not built yet\n");
    return 1;
}
