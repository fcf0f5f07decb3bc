/* tools/main.c — `zeropp train | eval | export | sample | tokenize | bench | plan | plot | help`.
 * The one place that initialises and finalises MPI: the commands that run
 * over ranks (train, eval of a checkpoint, bench comm) start it here; the
 * library reaches it through comm/ only. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "core/cpu.h"
#include "core/env.h"
#include "core/suggest.h"
#include "device/device.h"
#include "zeropp.h"

static void usage(FILE *f) {
    fprintf(f,
            "zeropp %s — ZeRO-3 training with the ZeRO++ communication optimizations\n"
            "\n"
            "usage:\n"
            "  zeropp train [--config FILE] [--data FILE] [--steps N] [--set KEY=VALUE] ...\n"
            "                                  train GPT-2 or a Llama (under mpirun for several\n"
            "                                  ranks)\n"
            "  zeropp train --resume DIR [--steps N] ...   continue a checkpoint with the\n"
            "                                  settings it was saved with\n"
            "  zeropp train --init-from MODEL.bin ...   start from an llm.c model file\n"
            "  zeropp train --init-from HF_DIR ...   start from a Hugging Face Llama, Mistral,\n"
            "                                  Qwen2 or GPT-2 folder\n"
            "  zeropp eval DIR [--split val|train] [--json]   loss and perplexity of a\n"
            "                                  checkpoint on its held-out (or training) data\n"
            "  zeropp eval --init-from MODEL.bin|HF_DIR --data TOKENS --batch-size B --batches K\n"
            "  zeropp export --from DIR --to MODEL.bin [--dtype fp32|bf16]   checkpoint -> "
            "llm.c\n"
            "  zeropp export --from DIR --to HF_DIR --format hf   checkpoint -> Hugging Face\n"
            "  zeropp sample DIR|HF_DIR [--prompt TEXT] [--max-new-tokens N]   text from a\n"
            "                                  checkpoint or a Hugging Face folder\n"
            "  zeropp tokenize --tokenizer tokenizer.json IN.txt OUT.bin   text -> a token\n"
            "                                  file (a Hugging Face BPE, or GPT-2's with\n"
            "                                  --vocab vocab.json --merges merges.txt)\n"
            "  zeropp bench quant [--dtype bf16] [--bits 8] [--block B] [--n N] [--json]\n"
            "  zeropp bench comm --params P [--units U] [--node-size S] [--json]\n"
            "  zeropp plan --params P --world W --node-size S   cross-node bytes per step\n"
            "  zeropp plot METRICS.jsonl... --out FILE.png   loss, tokens/s, traffic (gnuplot)\n"
            "  zeropp help [COMMAND]           this text, or a command's options\n"
            "  zeropp help env                 the environment variables zeropp reads\n"
            "  zeropp --version                the version and what this build runs on\n"
            "\n"
            "Run `zeropp help COMMAND` (or `zeropp COMMAND --help`) for a command's options.\n"
            "Counts (--params, --n, --steps, ...) take suffixes:\n"
            "  " ZPP_CLI_COUNT_HELP ".\n",
            zpp_version());
}

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp bench quant [options]   quantization kernels: GB/s and error\n"
            "       mpirun -np W zeropp bench comm --params P [options]   the collectives of\n"
            "                                      every mode, timed and checked\n"
            "Run `zeropp bench quant --help` or `zeropp bench comm --help` for the options.\n");
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

/* `zeropp --version`: what was compiled in, so a user can tell a CPU-only
 * build from a GPU one without running it. */
static int version(void) {
    printf("zeropp %s\n", zpp_version());
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(mpi, &len); /* callable before MPI_Init */
    mpi[strcspn(mpi, "\n,")] = '\0';    /* its first line or clause */
    printf("  communication: MPI (%s)", mpi[0] ? mpi : "unknown library");
    const char *nccl = zpp_comm_nccl_build();
    printf(", %s\n", nccl ? nccl : "no NCCL (built without CUDA)");
    const char *cuda = zpp_device_cuda_build();
    printf("  compute: host (OpenBLAS), %s\n", cuda ? cuda : "no GPU backend (built without CUDA)");
    printf("  CPU kernel paths:");
    for (int i = 0; i < ZPP_CPU_ISA_COUNT; i++)
        if (i == ZPP_CPU_GENERIC || ZPP_CPU_X86_PATHS)
            printf("%s %s%s", i ? "," : "", zpp_cpu_isa_name((zpp_cpu_isa)i),
                   zpp_cpu_isa_supported((zpp_cpu_isa)i) ? "" : " (not on this CPU)");
    printf("; in use: %s (ZPP_CPU_ISA=generic|avx2|avx512 caps it)\n",
           zpp_cpu_isa_name(zpp_cpu_isa_active()));
    return 0;
}

static const char *const commands[] = {"train", "eval",     "export", "sample", "tokenize",
                                       "bench", "plan",     "plot",   "help"};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static int unknown(const char *what, const char *word, const char *const *known, size_t n) {
    const char *guess = zpp_suggest(word, known, n);
    if (guess) fprintf(stderr, "zeropp: unknown %s '%s': did you mean '%s'?\n\n", what, word, guess);
    else fprintf(stderr, "zeropp: unknown %s '%s'\n\n", what, word);
    return 2;
}

/* `zeropp eval` of a checkpoint runs over ranks (the trainer's machinery);
 * of an llm.c model file (--init-from) in one process without MPI. */
static int eval_of_model_file(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--init-from", 11) || !strcmp(argv[i], "--help") ||
            !strcmp(argv[i], "-h"))
            return 1;
    return 0;
}

static int dispatch(int argc, char **argv);

/* `text` indented by `indent` spaces, broken at spaces before `width`. */
static void print_wrapped(const char *text, int indent, int width) {
    const char *p = text;
    while (*p) {
        int room = width - indent, n = (int)strlen(p);
        if (n > room) {
            n = room;
            while (n > 0 && p[n] != ' ') n--;
            if (n == 0) n = room; /* a word longer than a line */
        }
        printf("%*s%.*s\n", indent, "", n, p);
        p += n;
        while (*p == ' ') p++;
    }
}

/* `zeropp help env`: core/env.h's table, each variable with what it does
 * and its value in this environment. */
static int env_help(void) {
    printf("Environment variables zeropp reads (options and config keys come first; these\n"
           "reach a process before any option can):\n");
    for (int v = 0; v < ZPP_ENV_COUNT; v++) {
        const char *now = zpp_env_get((zpp_env_var)v);
        printf("\n  %s%s%s\n", zpp_env_name((zpp_env_var)v), now ? "=" : "", now ? now : "");
        print_wrapped(zpp_env_doc((zpp_env_var)v), 6, 80);
    }
    return 0;
}

/* `zeropp help [COMMAND]`: the overview, or COMMAND --help. */
static int help(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "env")) return env_help();
    if (argc > 3 || (argc == 3 && strcmp(argv[1], "bench"))) {
        fprintf(stderr, "zeropp help: takes one command (zeropp help train)\n");
        return 2;
    }
    char help_flag[] = "--help";
    char *args[4] = {argv[1], argc == 3 ? argv[2] : help_flag, help_flag, NULL};
    if (!strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    return dispatch(argc == 3 ? 3 : 2, args);
}

/* argv[0] is the command's name. */
static int dispatch(int argc, char **argv) {
    const char *c = argv[0];
    if (!strcmp(c, "train")) return with_mpi(zpp_cli_train, argc, argv);
    if (!strcmp(c, "plan")) return zpp_cli_plan(argc, argv);
    if (!strcmp(c, "export")) return zpp_cli_export(argc, argv);
    if (!strcmp(c, "eval"))
        return eval_of_model_file(argc, argv) ? zpp_cli_eval(argc, argv)
                                              : with_mpi(zpp_cli_eval_checkpoint, argc, argv);
    if (!strcmp(c, "plot")) return zpp_cli_plot(argc, argv);
    if (!strcmp(c, "sample")) return zpp_cli_sample(argc, argv);
    if (!strcmp(c, "tokenize")) return zpp_cli_tokenize(argc, argv);
    if (!strcmp(c, "help")) return help(argc, argv);
    if (!strcmp(c, "bench")) {
        static const char *const benches[] = {"quant", "comm"};
        if (argc >= 2 && !strcmp(argv[1], "quant")) return zpp_cli_bench_quant(argc - 1, argv + 1);
        if (argc >= 2 && !strcmp(argv[1], "comm"))
            return with_mpi(zpp_cli_bench_comm, argc - 1, argv + 1);
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            bench_usage(stdout);
            return 0;
        }
        if (argc >= 2 && argv[1][0] != '-') unknown("benchmark", argv[1], benches, 2);
        else fprintf(stderr, "zeropp bench: name a benchmark: quant or comm\n\n");
        bench_usage(stderr);
        return 2;
    }
    unknown("command", c, commands, N_COMMANDS);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) return version();
    if (argv[1][0] == '-') {
        static const char *const top[] = {"--help", "--version"};
        unknown("option", argv[1], top, 2);
        usage(stderr);
        return 2;
    }
    return dispatch(argc - 1, argv + 1);
}
