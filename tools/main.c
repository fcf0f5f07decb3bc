/* tools/main.c — `zeropp train | eval | export | bench | plan | plot | tokenize`. The one place that
 * initialises and finalises MPI: the commands that run over ranks (train,
 * bench comm) start it here; the library reaches it through comm/ only. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "zeropp.h"

static void usage(FILE *f) {
    fprintf(f,
            "zeropp %s — ZeRO-3 training with the ZeRO++ communication optimizations\n"
            "\n"
            "usage:\n"
            "  zeropp train [--config FILE] [--data FILE] [--steps N] ...   train GPT-2 "
            "(under mpirun)\n"
            "  zeropp train --init-from MODEL.bin ...   start from an llm.c model file\n"
            "  zeropp eval --init-from MODEL.bin --data TOKENS --batch-size B --batches K "
            "[--json]\n"
            "  zeropp export --from DIR --to MODEL.bin [--dtype fp32|bf16]   checkpoint -> "
            "llm.c\n"
            "  zeropp sample --from DIR|MODEL.bin [--prompt TEXT] [--max-new-tokens N] ...   "
            "generate text\n"
            "  zeropp bench quant [--dtype bf16] [--bits 8] [--block B] [--n N] [--json]\n"
            "  zeropp bench comm --params P [--units U] [--node-size S] [--json]\n"
            "  zeropp plan --params P --world W --node-size S   cross-node bytes per step\n"
            "  zeropp plot METRICS.jsonl... --out FILE.png   loss, tokens/s, traffic (gnuplot)\n"
            "  zeropp tokenize --vocab vocab.json --merges merges.txt IN.txt OUT.bin   GPT-2 "
            "BPE\n"
            "\n"
            "Run `zeropp COMMAND --help` for a command's options.\n"
            "Counts (--params, --n, --steps, ...) take suffixes:\n"
            "  " ZPP_CLI_COUNT_HELP ".\n",
            zpp_version());
}

void zpp_cli_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code); /* MPI_Abort does not return; keep the promise anyway */
}

/* Runs a command over the ranks the launcher started (one rank without a
 * launcher). A failing rank may exit early; the launcher ends the rest. */
static int with_mpi(int (*cmd)(int, char **), int argc, char **argv) {
    MPI_Init(NULL, NULL);
    int rc = cmd(argc, argv);
    fflush(stdout);
    MPI_Finalize();
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("zeropp %s\n", zpp_version());
        return 0;
    }
    if (!strcmp(argv[1], "train")) return with_mpi(zpp_cli_train, argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan")) return zpp_cli_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "export")) return zpp_cli_export(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return zpp_cli_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plot")) return zpp_cli_plot(argc - 1, argv + 1);
    if (!strcmp(argv[1], "sample")) return zpp_cli_sample(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize")) return zpp_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) {
        if (argc >= 3 && !strcmp(argv[2], "quant")) return zpp_cli_bench_quant(argc - 2, argv + 2);
        if (argc >= 3 && !strcmp(argv[2], "comm"))
            return with_mpi(zpp_cli_bench_comm, argc - 2, argv + 2);
        fprintf(stderr, "zeropp bench: name a benchmark: quant or comm\n");
        return 2;
    }
    fprintf(stderr, "zeropp: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
