/* tools/cli.h — the subcommands of the zeropp command. Each returns the
 * process exit code; only tools/ prints errors and exits. */
#ifndef ZPP_TOOLS_CLI_H
#define ZPP_TOOLS_CLI_H

#include <stdio.h>

/* The exit status of a run stopped by SIGTERM, SIGINT or SIGUSR1 at a step
 * boundary, after its checkpoint (docs/checkpoints.md, "Preemption"):
 * sysexits.h's EX_TEMPFAIL, "try again later". */
#define ZPP_CLI_EXIT_INTERRUPTED 75
int zpp_cli_train(int argc, char **argv);
int zpp_cli_bench_quant(int argc, char **argv);
int zpp_cli_bench_comm(int argc, char **argv);
int zpp_cli_plan(int argc, char **argv);
int zpp_cli_export(int argc, char **argv); /* llmc.c */
int zpp_cli_eval(int argc, char **argv);   /* llmc.c: of an llm.c model file */
int zpp_cli_eval_checkpoint(int argc, char **argv); /* eval.c: of a checkpoint, under MPI */
void zpp_cli_eval_usage(FILE *f);                  /* eval.c: both forms */
int zpp_cli_plot(int argc, char **argv);
int zpp_cli_sample(int argc, char **argv); /* sample.c */
int zpp_cli_tokenize(int argc, char **argv);

/* ---- samples while training (sample.c; `zeropp train --sample-every`) ---- */
#include <stdio.h>
#include "train/trainer.h"
typedef struct zpp_cli_sample_result {
    int32_t prompt[ZPP_TRAINER_SAMPLE_PROMPT];
    int n_prompt;
    int32_t *gen; /* n_gen new tokens */
    int n_gen;
    int real_vocab;
} zpp_cli_sample_result;
/* cfg->sample_tokens tokens after the trainer's fixed prompt, at
 * temperature 1 with the run's seed. Collective (zpp_trainer_sample). */
zpp_status zpp_cli_sample_trainer(zpp_trainer *t, const zpp_train_config *cfg,
                                  zpp_cli_sample_result *s);
void zpp_cli_sample_result_free(zpp_cli_sample_result *s);
/* The metrics fields: ,"sample":"<text, JSON-escaped>","sample_ids":[...] */
void zpp_cli_sample_json(FILE *f, const zpp_cli_sample_result *s);
/* The log: the prompt and the sample between two rules. */
void zpp_cli_sample_print(FILE *f, int step, const zpp_cli_sample_result *s);
/* Before training, on rank 0: where `data` is a token file with a tokenizer
 * note (`zeropp tokenize`, train/tokfile.h) and the model's vocabulary is
 * not bytes, the samples above print as text in that tokenizer (ids
 * otherwise; a note that cannot be used is said on stdout, once). */
void zpp_cli_sample_use_data_tokenizer(const char *data, const zpp_gpt2_config *model);

/* ---- helpers (cli_util.c) ---- */
#include <stddef.h>
/* Ends every rank of the job at once (MPI_Abort on the world, main.c):
 * for a rank that cannot finish together with the others (a collective
 * timed out, so a peer is stalled and MPI_Finalize would wait for it). */
void zpp_cli_abort(int code) __attribute__((noreturn));
/* Prints "zeropp: <context>: <zpp_last_error()>" to stderr (the context
 * left out where the message starts with it, as "checkpoint: cannot write"
 * does), returns 1. */
int zpp_cli_fail(const char *context, int status);
/* Every count on the command line (--params, --n, --steps, ...) is read by
 * this one parser (ZPP_CLI_COUNT_HELP is the line the usage texts print):
 * a whole number, written in decimal with an optional fraction and
 * exponent, times an optional suffix: k = 10^3, M = 10^6, B or G = 10^9
 * (as "125M", "1.5B" model sizes are quoted), or Ki = 2^10, Mi = 2^20,
 * Gi = 2^30 for exact powers of two ("64Mi" = 67108864). Suffixes are
 * case-insensitive. "1.5k" = 1500 and "2e9" are counts; "1.5", "-3", "0x10",
 * "12 M", "5Bi" and anything past 2^53 are not. 0 on success, -1 otherwise
 * (*out untouched). */
int zpp_cli_parse_count(const char *s, size_t *out);
#define ZPP_CLI_COUNT_HELP \
    "k, M, B/G = 10^3, 10^6, 10^9; Ki, Mi, Gi = 2^10, 2^20, 2^30 (125M, 1.5B, 64Mi)"
/* A count (zpp_cli_parse_count) in [lo, 2^24]; 0 on success, -1 otherwise. */
int zpp_cli_parse_int(const char *s, int lo, int *out);
/* An integer count (zpp_cli_parse_count) in [lo, hi]; 0 on success, -1
 * otherwise (*out untouched). hi <= 2^53. */
int zpp_cli_parse_range(const char *s, long long lo, long long hi, long long *out);

/* ---- the option parser: one table per subcommand ----
 * Every option is `--name VALUE` or `--name=VALUE` (a FLAG takes none).
 * Integers are counts (zpp_cli_parse_count) range-checked for the field
 * they land in: INT -> int, LONG -> long, SIZE -> size_t, U64 -> uint64_t,
 * within [lo, hi] (the message gives the range). An unknown option is named
 * unknown wherever it is on the line, with the closest known option when
 * one is a typo away ("did you mean --steps?"); a value option at the end
 * of the line "needs a value". */
typedef enum zpp_cli_kind {
    ZPP_CLI_FLAG, /* int *dst = 1 */
    ZPP_CLI_STR,  /* const char **dst */
    ZPP_CLI_INT,  /* int *dst */
    ZPP_CLI_LONG, /* long *dst */
    ZPP_CLI_SIZE, /* size_t *dst */
    ZPP_CLI_U64,  /* uint64_t *dst (unsigned long long) */
    ZPP_CLI_LIST, /* zpp_cli_list *dst: a repeatable string option, every value kept */
    ZPP_CLI_POS   /* const char **dst: the one argument that is not an option
                     (name: what it is, "DIR", for messages) */
} zpp_cli_kind;

/* The values of a repeatable option, in command-line order. */
#define ZPP_CLI_LIST_CAP 64
typedef struct zpp_cli_list {
    const char *v[ZPP_CLI_LIST_CAP];
    int n;
} zpp_cli_list;
typedef struct zpp_cli_opt {
    const char *name; /* "--steps" */
    zpp_cli_kind kind;
    void *dst;
    long long lo, hi; /* integer kinds */
} zpp_cli_opt;
/* Parses argv[1..argc) against opts[0..n). --help / -h: returns 1 (the
 * caller prints its usage). Errors: one line "zeropp CMD: ..." on stderr
 * when `print` (rank 0 of a launched command; every rank parses the same
 * line, so they agree without talking), returns -1. 0 on success. */
int zpp_cli_parse_opts(const char *cmd, int argc, char **argv, const zpp_cli_opt *opts, int n,
                       int print);

/* Monotonic clock in milliseconds. */
double zpp_cli_now_ms(void);
/* Median of n values (sorts them). */
double zpp_cli_median(double *t, int n);
/* 1234567 -> "1.23 MB" (decimal units, as network rates are quoted). */
const char *zpp_cli_bytes(double b, char *buf, size_t cap);

#endif
