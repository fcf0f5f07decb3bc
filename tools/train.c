/* tools/train.c — placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int zpp_cli_train(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "zeropp: 'train' is not built yet\n");
    return 1;
}
