/* tools/plan.c — placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int zpp_cli_plan(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "zeropp: 'plan' is not built yet\n");
    return 1;
}
