/* tools/train.c — `zeropp train`: train GPT-2 under mpirun, log each step,
 * write metrics, and (--demo) compare ZeRO-3 with ZeRO++ side by side. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "core/env.h"
#include "core/error.h"
#include "plan/cost.h"
#include "train/hf_gpt2.h"
#include "train/hf_model.h"
#include "train/llmc.h"
#include "train/trainer.h"

typedef struct train_args {
    const char *config, *data, *metrics, *save, *resume, *init_from;
    const char *origin; /* --resume: the checkpoint's init_from, kept in its saves */
    long steps, eval_every, seed, save_every;
    long sample_every, sample_tokens; /* < 0: not given */
    int node_size;
    int gpu, emulate_nodes;
    int demo;
    int quiet;
    int profile;
    double collective_timeout; /* seconds; < 0: not given */
    double peak_tflops;        /* --peak-tflops; <= 0: not given */
    int data_order;            /* zpp_data_order; < 0: not given */
    int prune_newer;           /* --prune-newer */
    int recompute;             /* --recompute */
    zpp_cli_list sets;         /* --set KEY=VALUE, in order */
} train_args;

typedef struct run_summary {
    const char *label;
    char mode[32];
    float train_loss, val_loss;
    double cross_bytes, intra_bytes, step_ms, tokens_per_s;
    double compute_ms, exposed_ms; /* --profile: rank 0's, mean per step */
} run_summary;

/* --profile: per-step figures summed over the steps after the first (it
 * pays one-time costs), or the first alone when it is the only one. */
typedef struct prof_sum {
    double stream, compute, exposed, exposed_max, wall, peak;
    int n, first, last;
} prof_sum;

static void usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np N zeropp train [options]\n"
            "  --config FILE     DeepSpeed-style JSON config (every key: docs/config.md or\n"
            "                    --list-config-keys; an example: examples/zeropp.json)\n"
            "  --set KEY=VALUE   override one config key by its dotted path, after --config\n"
            "                    (or the resumed checkpoint's config); repeatable:\n"
            "                    --set optimizer.params.lr=3e-4\n"
            "                    --set zero_optimization.zero_quantized_weights=true\n"
            "  --data FILE       llm.c token file (.bin) or any text file; default: a "
            "built-in synthetic corpus\n"
            "  --steps N         optimizer steps (overrides zeropp.train_steps); 0 with --save\n"
            "                    writes a checkpoint of the initial weights\n"
            "  --eval-every K    validation loss every K steps (0 = never)\n"
            "  --metrics FILE    one JSON object per step\n"
            "  --sample-every K  print a sample of --sample-tokens M (64) tokens every K steps\n"
            "                    (and put it in the metrics); 0 = never (docs/sampling.md)\n"
            "  --seed S          initialisation and data order\n"
            "  --data-order O    shuffled (default) or sequential: step s reads tokens\n"
            "                    [s G T, (s+1) G T] of the training split, as llm.c does\n"
            "                    (overrides zeropp.data_order)\n"
            "  --node-size S     ranks per (emulated) node; must divide the world size\n"
            "  --device D        cpu (host ranks, MPI) or gpu (one GPU per rank, NCCL)\n"
            "  --emulate-nodes   gpu: a distinct NCCL_HOSTID per node, so nodes talk over\n"
            "                    sockets (launch with mpirun --bind-to none); ranks of a node\n"
            "                    that share a GPU each get their own (docs/emulated-nodes.md)\n"
            "  --save DIR        write a checkpoint to DIR at the end (and every --save-every K);\n"
            "                    DIR is created before step 1 and locked for the run (a second\n"
            "                    job on DIR stops at start); each save is a new DIR/step-N\n"
            "                    folder, published atomically; the newest\n"
            "                    zeropp.keep_checkpoints (2) stay\n"
            "  --save-every K    also checkpoint every K steps (needs --save)\n"
            "  --init-from FILE  start from an llm.c GPT-2 model file (fp32 or bf16): the model's\n"
            "                    shape comes from it (a model section in --config must agree);\n"
            "                    its padded vocabulary rows stay outside the softmax; or a\n"
            "                    Hugging Face Llama, Mistral, Qwen2 or GPT-2 folder (config.json\n"
            "                    + safetensors): its config.json sets the shape\n"
            "                    (docs/training.md, docs/llmc.md)\n"
            "  --resume DIR      continue from the newest checkpoint published in DIR (or from\n"
            "                    the step folder DIR), on any number of ranks; the same ranks\n"
            "                    continue bit for bit. Without --config the run takes the\n"
            "                    config the checkpoint was saved with, and without --data its\n"
            "                    data file; what differs from the save (a --set, --steps, ...)\n"
            "                    is listed in one \"changed since the save\" note, with the lr\n"
            "                    of the first step before and after. A different model shape\n"
            "                    or dtype is refused. A checkpoint at or past --steps is an\n"
            "                    error (exit 1): nothing would be trained\n"
            "  --prune-newer     resumed from an older checkpoint into the same --save folder,\n"
            "                    delete the step folders newer than it at the first save\n"
            "                    (default: they stay; zeropp.prune_newer)\n"
            "  --recompute       activation checkpointing: each block keeps only its input\n"
            "                    and recomputes the rest in its backward (one block's\n"
            "                    activations in memory instead of every block's, for one more\n"
            "                    forward; the same bits; zeropp.activation_checkpointing)\n"
            "  --demo            train with ZeRO-3, then ZeRO++ (qwZ+hpZ+qgZ), and compare\n"
            "  --quiet           no per-step log lines\n"
            "  --profile         time each step: compute and exposed communication (the time\n"
            "                    the compute stream stood waiting for a collective) on the log\n"
            "                    line, in the metrics (stream_ms, compute_ms, exposed_comm_ms,\n"
            "                    exposed_comm_ms_max) and in a summary at the end\n"
            "  --collective-timeout S  seconds a rank waits for its peers in a collective\n"
            "                    before the job stops (a rank stalled or died); 0 = forever\n"
            "                    (overrides zeropp.collective_timeout_s, default 600)\n"
            "  --peak-tflops X   peak TFLOP/s of one rank's device, for the MFU of the log and\n"
            "                    the metrics (overrides zeropp.peak_tflops; default: the GPU's\n"
            "                    preset when its name is known, bf16/fp16 tensor or fp32 peak;\n"
            "                    none on CPU ranks: MFU n/a)\n"
            "Options take their value as --name VALUE or --name=VALUE; counts take\n"
            "suffixes (" ZPP_CLI_COUNT_HELP ").\n"
            "The log (docs/logs.md says what every line and metrics field means): a header\n"
            "naming the mode, precision, devices and the FLOPs counted per token; a line per\n"
            "step (loss, lr, tokens/s, TFLOP/s a rank, MFU, bytes moved); a line per saved\n"
            "checkpoint; a summary at the end. Rank 0 draws a progress bar with an ETA when\n"
            "its output reaches a terminal (under mpirun: when mpirun's does);\n"
            "ZPP_PROGRESS=0 turns it off, ZPP_PROGRESS=1 draws it anyway.\n"
            "SIGTERM, SIGINT or SIGUSR1 stops the run after the step in progress, with a\n"
            "checkpoint of that step (with --save), and exit status 75; a second signal\n"
            "ends it at once. Under Open MPI's mpirun send SIGUSR1 (docs/checkpoints.md,\n"
            "\"Preemption\").\n");
}

/* The largest seed: counts are exact up to 2^53. */
#define TRAIN_SEED_MAX (1ll << 53)

/* The options parse_args takes as text: --collective-timeout, --peak-tflops,
 * --data-order and --device, into a. 0, or -1 after printing (print) what
 * is wrong. */
static int parse_values(train_args *a, const char *timeout, const char *peak, const char *order,
                        const char *device, int print) {
    if (timeout) {
        char *end = NULL;
        double sec = strtod(timeout, &end);
        if (end == timeout || *end || !isfinite(sec) || sec < 0) {
            if (print)
                fprintf(stderr, "zeropp train: --collective-timeout expects seconds >= 0 "
                        "(0 = wait forever), got '%s'\n", timeout);
            return -1;
        }
        a->collective_timeout = sec;
    }
    if (peak) {
        char *end = NULL;
        double x = strtod(peak, &end);
        if (end == peak || *end || !isfinite(x) || !(x > 0)) {
            if (print)
                fprintf(stderr, "zeropp train: --peak-tflops expects a peak TFLOP/s > 0 of one "
                        "rank's device, got '%s'\n", peak);
            return -1;
        }
        a->peak_tflops = x;
    }
    if (order) {
        zpp_data_order o;
        if (zpp_data_order_parse(order, &o) != ZPP_OK) {
            if (print)
                fprintf(stderr, "zeropp train: --data-order takes shuffled or sequential, not "
                        "'%s'\n", order);
            return -1;
        }
        a->data_order = (int)o;
    }
    if (device) {
        if (strcmp(device, "cpu") && strcmp(device, "gpu")) {
            if (print)
                fprintf(stderr, "zeropp train: --device takes cpu or gpu, not '%s'\n", device);
            return -1;
        }
        a->gpu = !strcmp(device, "gpu");
    }
    return 0;
}

/* Options that do not go together: 0, or -1 after printing (print) why. */
static int check_combinations(const train_args *a, int print) {
    if (a->save_every && !a->save) {
        if (print) fprintf(stderr, "zeropp train: --save-every needs --save DIR\n");
        return -1;
    }
    if (a->demo && (a->save || a->resume || a->init_from || a->steps == 0)) {
        if (print)
            fprintf(stderr, "zeropp train: --demo does not take --save, --resume, --init-from "
                            "or --steps 0\n");
        return -1;
    }
    if (a->init_from && a->resume) {
        if (print)
            fprintf(stderr, "zeropp train: --init-from and --resume both set the weights; give "
                            "one\n");
        return -1;
    }
    return 0;
}

/* 0: train; 1: done (--help, --list-config-keys); -1: a wrong command
 * line. Prints argument errors on rank 0 only: every rank parses the same
 * line and reaches the same verdict, so they agree without a collective. */
static int parse_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = a->eval_every = a->seed = -1;
    a->sample_every = a->sample_tokens = -1;
    a->save_every = 0;
    const int print = zpp_comm_world_rank() == 0;
    int list_keys = 0;
    const char *device = NULL, *timeout = NULL, *order = NULL, *peak = NULL;
    a->collective_timeout = -1.0;
    a->peak_tflops = -1.0;
    a->data_order = -1;
    const zpp_cli_opt opts[] = {
        {"--list-config-keys", ZPP_CLI_FLAG, &list_keys, 0, 0},
        {"--demo", ZPP_CLI_FLAG, &a->demo, 0, 0},
        {"--quiet", ZPP_CLI_FLAG, &a->quiet, 0, 0},
        {"--profile", ZPP_CLI_FLAG, &a->profile, 0, 0},
        {"--emulate-nodes", ZPP_CLI_FLAG, &a->emulate_nodes, 0, 0},
        {"--prune-newer", ZPP_CLI_FLAG, &a->prune_newer, 0, 0},
        {"--recompute", ZPP_CLI_FLAG, &a->recompute, 0, 0},
        {"--config", ZPP_CLI_STR, &a->config, 0, 0},
        {"--data", ZPP_CLI_STR, &a->data, 0, 0},
        {"--metrics", ZPP_CLI_STR, &a->metrics, 0, 0},
        {"--device", ZPP_CLI_STR, &device, 0, 0},
        {"--data-order", ZPP_CLI_STR, &order, 0, 0},
        {"--save", ZPP_CLI_STR, &a->save, 0, 0},
        {"--resume", ZPP_CLI_STR, &a->resume, 0, 0},
        {"--init-from", ZPP_CLI_STR, &a->init_from, 0, 0},
        /* step counts land in int (zpp_train_config.train_steps and co.) */
        {"--save-every", ZPP_CLI_LONG, &a->save_every, 1, INT_MAX},
        {"--steps", ZPP_CLI_LONG, &a->steps, 0, INT_MAX},
        {"--eval-every", ZPP_CLI_LONG, &a->eval_every, 0, INT_MAX},
        {"--sample-every", ZPP_CLI_LONG, &a->sample_every, 0, INT_MAX},
        {"--sample-tokens", ZPP_CLI_LONG, &a->sample_tokens, 1, 65536},
        {"--seed", ZPP_CLI_LONG, &a->seed, 0, TRAIN_SEED_MAX},
        {"--node-size", ZPP_CLI_INT, &a->node_size, 1, INT_MAX},
        {"--collective-timeout", ZPP_CLI_STR, &timeout, 0, 0}, /* seconds: parse_values */
        {"--peak-tflops", ZPP_CLI_STR, &peak, 0, 0},
        {"--set", ZPP_CLI_LIST, &a->sets, 0, 0},
    };
    int pr = zpp_cli_parse_opts("train", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]),
                                print);
    if (pr > 0) {
        if (print) usage(stdout);
        return 1;
    }
    if (pr < 0) return -1;
    if (list_keys) {
        if (print) zpp_train_config_write_keys(stdout); /* docs/config.md */
        return 1;
    }
    if (parse_values(a, timeout, peak, order, device, print) != 0) return -1;
    return check_combinations(a, print);
}

/* ---- The progress bar (rank 0) ------------------------------------------ */

/* One line, redrawn in place with \r; any other line printed while it is
 * up clears it first (bar_clear), so a log line never lands in the middle
 * of the bar. */
typedef struct progress_bar {
    int on;
    int len;           /* characters of the bar now on the line; 0: none */
    double last;       /* when the previous step ended (now_s) */
    double sum;        /* wall seconds of the steps after the first */
    int n, first_done; /* steps in sum; the first has been timed and dropped */
} progress_bar;

static progress_bar bar; /* the one bar: report() clears it too */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bar_clear(void) {
    if (bar.len) printf("\r%*s\r", bar.len, "");
    bar.len = 0;
}

/* Prints the message of a failed call, once: the trainer's calls agree
 * over the world, so every rank holds the same status and message (the
 * lowest failing rank's), and rank 0 prints it. */
static int report(const char *context, zpp_status st) {
    if (zpp_comm_world_rank() == 0) {
        bar_clear();
        fflush(stdout);
    }
    if (st == ZPP_ERR_TIMEOUT) {
        /* Not agreed: the rank that stalled cannot answer. Each rank that
         * timed out says so, and the job is brought down (MPI_Finalize
         * would wait for the stalled rank too). */
        char ctx[128];
        snprintf(ctx, sizeof ctx, "%s, rank %d", context, zpp_comm_world_rank());
        zpp_cli_fail(ctx, st);
        zpp_cli_abort(3);
    }
    if (zpp_comm_world_rank() == 0) zpp_cli_fail(context, st);
    return 1;
}

/* Where file descriptor `fd` of process `pid` leads: 't' a terminal
 * (/dev/pts/N, /dev/ttyN), 'p' a pipe or socket (output that something
 * forwards), 'o' anything else (a file, /dev/null) or unreadable. */
static char fd_kind(long pid, int fd) {
    char path[64], dst[256];
    snprintf(path, sizeof path, "/proc/%ld/fd/%d", pid, fd);
    ssize_t n = readlink(path, dst, sizeof dst - 1);
    if (n <= 0) return 'o';
    dst[n] = '\0';
    if (!strncmp(dst, "/dev/pts/", 9) || !strncmp(dst, "/dev/tty", 8)) return 't';
    if (!strncmp(dst, "pipe:", 5) || !strncmp(dst, "socket:", 7)) return 'p';
    return 'o';
}

/* The parent of `pid` (field 4 of /proc/PID/stat, after the command in
 * parentheses, which may itself hold spaces), or 0. */
static long parent_of(long pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    long ppid = 0;
    if (!p || sscanf(p + 1, " %*c %ld", &ppid) != 1) return 0;
    return ppid;
}

/* Whether rank 0's output reaches a terminal. Alone, isatty says it.
 * Under mpirun it cannot: Open MPI hands each rank a pty of its own even
 * when mpirun writes into a file (checked with Open MPI 4.1), so the
 * answer is mpirun's: walk up the parents (Linux /proc) past those whose
 * stdout is a pipe or socket (mpirun forwarding to `tee`, a launcher
 * daemon) to the first whose stdout is a terminal (draw) or anything else
 * (a file, /dev/null: don't). Stdout, not stdin: `mpirun ... > log` from
 * an interactive shell has a terminal for stdin and must not get the bar
 * in its log. ZPP_PROGRESS=1 / =0 decide instead of all this. */
static int progress_wanted(void) {
    const char *env = zpp_env_get(ZPP_ENV_PROGRESS);
    if (env) return env[0] == '1';
    if (!zpp_comm_launched()) return isatty(STDOUT_FILENO);
    long pid = parent_of((long)getpid());
    for (int depth = 0; pid > 1 && depth < 16; depth++) {
        char k = fd_kind(pid, 1);
        if (k != 'p') return k == 't';
        pid = parent_of(pid);
    }
    return 0;
}

/* "1h02m", "3m05s", "12s". */
static void fmt_duration(char *buf, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, cap, "%lds", t);
}

/* Times the step that just ended (the whole loop iteration: the step, and
 * any evaluation, save or sample in it), dropping the first, which pays
 * one-time costs: the ETA is the mean of the rest times the steps left. */
static void bar_time_step(void) {
    double t = now_s();
    if (bar.first_done) {
        bar.sum += t - bar.last;
        bar.n++;
    }
    bar.first_done = 1;
    bar.last = t;
}

static void bar_draw(int step, int total, float loss) {
    if (!bar.on) return;
    char line[160], eta[32] = "--";
    int width = 30, done = (int)((long)width * step / total);
    int k = 0;
    line[k++] = '[';
    for (int i = 0; i < width; i++) line[k++] = i < done ? '#' : '.';
    line[k] = '\0';
    double mean = bar.n ? bar.sum / bar.n : 0.0;
    if (bar.n) fmt_duration(eta, sizeof eta, mean * (total - step));
    char pace[32] = "";
    if (bar.n && mean < 1.0) snprintf(pace, sizeof pace, " | %.0f ms/step", mean * 1e3);
    else if (bar.n) snprintf(pace, sizeof pace, " | %.2f s/step", mean);
    k += snprintf(line + k, sizeof line - (size_t)k, "] %d/%d loss %.4f%s | ETA %s", step,
                  total, (double)loss, pace, eta);
    if (k > (int)sizeof line - 1) k = (int)sizeof line - 1;
    printf("\r%s", line);
    if (bar.len > k) printf("%*s\r%s", bar.len - k, "", line); /* a shorter line: wipe the tail */
    bar.len = k;
    fflush(stdout);
}

/* The metrics line's skip fields: "skipped" and "skipped_total" always,
 * "loss_scale" with fp16, "param_sumsq" when ZPP_PARAM_SUMSQ=1 (engine.h). A
 * skipped step's loss or norm may be NaN or Inf: JSON has no such numbers,
 * so the line holds null there (json_num). */
static const char *json_num(char *buf, size_t cap, const char *fmt, double v) {
    if (isfinite(v)) snprintf(buf, cap, fmt, v);
    else snprintf(buf, cap, "null");
    return buf;
}

static void json_skip_fields(FILE *f, const zpp_update_stats *st, int fp16) {
    fprintf(f, ",\"skipped\":%s,\"skipped_total\":%d", st->skipped ? "true" : "false",
            st->skipped_total);
    if (fp16) fprintf(f, ",\"loss_scale\":%.17g", (double)st->loss_scale);
    if (!isnan(st->param_sumsq)) fprintf(f, ",\"param_sumsq\":%.9g", st->param_sumsq);
}

/* --profile's fields: rank 0's compute stream, and the most exposed
 * communication of any rank (zeropp.h, zpp_update_stats). */
static void json_profile_fields(FILE *f, const zpp_trainer_step_result *r) {
    const zpp_update_stats *p = &r->stats;
    if (!p->profiled) return;
    fprintf(f, ",\"stream_ms\":%.3f,\"compute_ms\":%.3f,\"exposed_comm_ms\":%.3f,"
            "\"exposed_comm_ms_max\":%.3f",
            p->stream_ms, p->compute_ms, p->exposed_comm_ms, r->exposed_comm_ms_max);
}

static void prof_add(prof_sum *ps, int step, int start, const zpp_trainer_step_result *r) {
    const zpp_update_stats *p = &r->stats;
    if (step == start + 1) memset(ps, 0, sizeof *ps); /* drop the first step */
    ps->stream += p->stream_ms;
    ps->compute += p->compute_ms;
    ps->exposed += p->exposed_comm_ms;
    ps->exposed_max += r->exposed_comm_ms_max;
    ps->wall += r->seconds * 1e3;
    if (r->device_peak_bytes > ps->peak) ps->peak = r->device_peak_bytes;
    if (ps->n++ == 0) ps->first = step + 1;
    ps->last = step + 1;
}

static void prof_print(const prof_sum *ps) {
    if (ps->n == 0) return;
    const double n = ps->n;
    if (ps->n > 1)
        printf("profile, mean of steps %d-%d (rank 0's compute stream):\n", ps->first, ps->last);
    else
        printf("profile of step %d (rank 0's compute stream):\n", ps->first);
    printf("  compute         %10.3f ms\n", ps->compute / n);
    printf("  exposed comm    %10.3f ms  (%.1f%% of the stream's %.3f ms; the most on one "
           "rank %.3f ms)\n",
           ps->exposed / n, ps->stream > 0 ? 100.0 * ps->exposed / ps->stream : 0.0,
           ps->stream / n, ps->exposed_max / n);
    printf("  wall time       %10.3f ms  (the slowest rank's step)\n", ps->wall / n);
    printf("  device peak     %10.3f MB  (the most allocated through one rank's device)\n",
           ps->peak / 1e6);
}

/* ---- The header, the save line and the summary (docs/logs.md) ------------ */

/* "ZeRO-3", or "ZeRO++ (qwZ, hpZ partition 2, qgZ)" naming exactly the
 * optimizations that are on, then what changes qgZ's or the vectors'
 * arithmetic. */
static void mode_text(const zpp_trainer_info *in, const zpp_train_config *cfg, char *buf,
                      size_t cap) {
    if (!in->qwz && !in->hpz_partition && !in->qgz) {
        snprintf(buf, cap, "ZeRO-3");
        return;
    }
    char hpz[48] = "";
    if (in->hpz_partition) snprintf(hpz, sizeof hpz, "hpZ partition %d", in->hpz_partition);
    const char *parts[3] = {in->qwz ? "qwZ" : "", hpz, in->qgz ? "qgZ" : ""};
    size_t k = (size_t)snprintf(buf, cap, "ZeRO++ (");
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (parts[i][0] && k < cap)
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", n++ ? ", " : "", parts[i]);
    if (k < cap) k += (size_t)snprintf(buf + k, cap - k, ")");
    if (in->qgz && cfg->zero.loco && k < cap)
        k += (size_t)snprintf(buf + k, cap - k, " + error feedback");
    if (in->qgz && cfg->zero.grad_stochastic && k < cap)
        k += (size_t)snprintf(buf + k, cap - k, " + stochastic rounding");
    if (in->qgz && !cfg->zero.grad_e2m1 && k < cap)
        k += (size_t)snprintf(buf + k, cap - k, " + int4 gradients");
    if ((in->qwz || in->qgz) && cfg->zero.quantize_vectors && k < cap)
        snprintf(buf + k, cap - k, " + vectors quantized");
}

/* The peak one rank's device can do, for MFU: --peak-tflops, else
 * zeropp.peak_tflops, else the preset of the GPU's name for the run's
 * dtype; 0 (MFU n/a) on CPU ranks or an unknown GPU. `why` says where it
 * came from, for the header. */
static double peak_tflops(const train_args *a, const zpp_train_config *cfg,
                          const zpp_trainer_info *in, char *why, size_t cap) {
    if (a->peak_tflops > 0) {
        snprintf(why, cap, "--peak-tflops");
        return a->peak_tflops;
    }
    if (cfg->peak_tflops > 0) {
        snprintf(why, cap, "zeropp.peak_tflops");
        return cfg->peak_tflops;
    }
    const zpp_cost_gpu *g = in->gpu ? zpp_cost_gpu_for_device(in->device) : NULL;
    if (g) {
        snprintf(why, cap, "%s preset, %s", g->name,
                 in->dtype == ZPP_FP32 ? "fp32 without TF32" : "bf16/fp16 tensor cores, dense");
        return zpp_cost_gpu_peak_tflops(g, in->dtype);
    }
    if (in->gpu)
        snprintf(why, cap, "no preset for %.*s: --peak-tflops or zeropp.peak_tflops gives one",
                 (int)(cap > 64 ? cap - 64 : 1), in->device);
    else
        snprintf(why, cap, "CPU ranks: --peak-tflops or zeropp.peak_tflops gives one");
    return 0.0;
}

static void print_header(const char *label, const zpp_train_config *cfg,
                         const zpp_trainer_info *in, double fpt, double peak, const char *why) {
    const char *dt = zpp_dtype_name(in->dtype);
    char mode[160];
    mode_text(in, cfg, mode, sizeof mode);
    printf("%s: %d rank%s = %d node%s of %d, %s %zu params (%d layers, %d wide, T=%d%s), "
           "%s data (%zu tokens), global batch %d = %d x %d accum x %d rank%s, %s\n",
           label ? label : "train", in->world_size, in->world_size == 1 ? "" : "s", in->nodes,
           in->nodes == 1 ? "" : "s", in->node_size,
           cfg->model_family == ZPP_FAMILY_LLAMA ? "Llama" : "GPT-2", in->n_params,
           cfg->model.n_layer,
           cfg->model.n_embd, in->seq_len,
           cfg->activation_checkpointing ? ", activation checkpointing" : "",
           zpp_data_kind_name(in->data.kind), in->data.n_tokens,
           in->global_batch, in->micro_batch, in->accum, in->world_size,
           in->world_size == 1 ? "" : "s", dt);
    if (in->gpu)
        printf("mode: %s, %s, %d rank%s on %s (one GPU a rank, NCCL)\n", mode, dt,
               in->world_size, in->world_size == 1 ? "" : "s", in->device);
    else
        printf("mode: %s, %s, %d rank%s on CPU (host memory, MPI)\n", mode, dt, in->world_size,
               in->world_size == 1 ? "" : "s");
    printf("flops: %.0f per token = 6 x %zu params + 12 x %d layers x %d wide x T=%d "
           "(forward + backward), %.4g per step; ",
           fpt, in->n_params, cfg->model.n_layer, cfg->model.n_embd, in->seq_len,
           fpt * in->global_batch * in->seq_len);
    if (peak > 0) printf("peak %.6g TFLOP/s a rank (%s)\n", peak, why);
    else printf("peak n/a (%s), so MFU n/a\n", why);
}

/* Bytes as MB for a person: 3 significant digits below 100 MB. */
static void fmt_mb(char *buf, size_t cap, double bytes) {
    double mb = bytes / 1e6;
    snprintf(buf, cap, mb < 100 ? "%.3g MB" : "%.0f MB", mb);
}

static void print_saved(int step, const zpp_ckpt_saved *sv) {
    char mb[32];
    fmt_mb(mb, sizeof mb, sv->bytes);
    bar_clear();
    if (step == 0) /* --steps 0 */
        printf("saved the initial weights (step 0) to %s (%s, %.2f s)\n", sv->folder, mb,
               sv->seconds);
    else
        printf("saved step %d to %s (%s, %.2f s)\n", step, sv->folder, mb, sv->seconds);
    fflush(stdout);
}

/* The run's totals for the summary: steps after the first are "timed". */
typedef struct run_totals {
    double t0;                 /* run() entered (now_s) */
    int steps, first_step;     /* steps trained in this run, the first (1-based) */
    double timed_s, timed_tokens; /* the steps after the first: their time and tokens */
    int timed;
    double first_s;               /* the first step's time: the rate of a 1-step run */
    float loss;                /* the last step's */
    float val, best_val;       /* the last and the lowest validation loss; < 0: none */
    int val_step, best_step;
    char ckpt[ZPP_CKPT_PATH_MAX]; /* the last save's folder; "" none */
} run_totals;

static void print_summary(const run_totals *rt, const zpp_trainer_info *in, double fpt,
                          double peak) {
    bar_clear();
    char wall[32];
    const double secs = now_s() - rt->t0, step_tokens = (double)in->global_batch * in->seq_len;
    if (secs < 60) snprintf(wall, sizeof wall, "%.1fs", secs);
    else fmt_duration(wall, sizeof wall, secs);
    const int last = rt->first_step + rt->steps - 1;
    printf("summary: %d step%s (%d-%d) in %s wall, %.0f tokens\n", rt->steps,
           rt->steps == 1 ? "" : "s", rt->first_step, last, wall, rt->steps * step_tokens);
    /* the mean rate of the steps after the first (it pays one-time costs),
     * or the first alone when it is the only one */
    const double ts = rt->timed ? rt->timed_s : rt->first_s;
    if (ts > 0) {
        double tps = (rt->timed ? rt->timed_tokens : step_tokens) / ts;
        double tflops = fpt * tps / in->world_size / 1e12;
        char rng[48];
        if (!rt->timed) snprintf(rng, sizeof rng, "step %d alone", rt->first_step);
        else if (rt->timed == 1) snprintf(rng, sizeof rng, "step %d", last);
        else snprintf(rng, sizeof rng, "steps %d-%d", rt->first_step + 1, last);
        printf("  tokens/s          %.0f (%s: their tokens / their time)\n", tps, rng);
        printf("  TFLOP/s a rank    %.4g", tflops);
        if (peak > 0) printf(" | MFU %.2f%% of %.6g\n", 100.0 * tflops / peak, peak);
        else printf(" | MFU n/a\n");
    }
    printf("  final train loss  %.4f (step %d)\n", (double)rt->loss, last);
    if (rt->val >= 0)
        printf("  val loss          %.4f (step %d), best %.4f (step %d)\n", (double)rt->val,
               rt->val_step, (double)rt->best_val, rt->best_step);
    if (rt->ckpt[0]) printf("  checkpoint        %s\n", rt->ckpt);
    fflush(stdout);
}

/* ---- One run: set up, the step loop, the end ------------------------------ */

/* What a run keeps from its start to its end. */
typedef struct train_run {
    const zpp_train_config *cfg;
    const train_args *a;
    zpp_trainer *t;
    const zpp_trainer_info *in;
    int rank;
    int start;        /* the steps done before this run: 0, or the checkpoint's */
    double fpt, peak; /* FLOPs a token (the planner's count) and the peak MFU is taken of */
    run_totals rt;    /* for the summary */
    /* for the demo's comparison (run_summary) */
    double ms_sum, tps_sum; /* the steps after the first (it pays one-time costs) */
    int timed;
    double cross_sum, intra_sum;
    float loss, val; /* the last step's, the last validation's (< 0: none) */
    prof_sum prof;
} train_run;

/* One step's results, carried from the step to its log. */
typedef struct step_out {
    int s;                 /* the step's index from 0; it is step s + 1 in the log */
    int last, eval, saved; /* the run's last step; validated; checkpointed */
    zpp_trainer_step_result r;
    float val;           /* the validation loss, when eval */
    zpp_volume ev;       /* the validation's bytes */
    double cross, intra; /* the step's bytes */
    double tflops, mfu;  /* achieved model FLOP/s of one rank, and its share of the peak */
    zpp_ckpt_saved sv;   /* printed after the step's line */
    zpp_cli_sample_result smp;
} step_out;

/* --resume: the checkpoint's state, what changed since its save, and a
 * refusal when it is at or past the last step (nothing would be trained). */
static zpp_status run_resume(train_run *tr) {
    const train_args *a = tr->a;
    ZPP_CHECK(zpp_trainer_load(tr->t, a->resume, &tr->start));
    if (tr->rank == 0) printf("resumed from %s after step %d\n", a->resume, tr->start);
    const char *note = zpp_trainer_resume_note(tr->t);
    if (tr->rank == 0 && note[0]) { /* one note, a line per change */
        printf("resume: changed since the save:\n");
        for (const char *p = note; *p;) {
            size_t n = strcspn(p, "\n");
            printf("  %.*s\n", (int)n, p);
            p += n + (p[n] == '\n');
        }
    }
    if (tr->start >= tr->cfg->train_steps)
        return zpp_error(ZPP_ERR_CONFIG,
                         "the checkpoint in %s is at step %d and the run ends at step %d: "
                         "nothing to train; raise --steps",
                         a->resume, tr->start, tr->cfg->train_steps);
    return ZPP_OK;
}

/* Setting up longer than this many seconds gets its line. */
#define SETUP_LINE_S 2.0

/* Rank 0's line saying where a slow setup's time went (docs/logs.md). */
static void print_setup(const zpp_trainer_info *in, const char *init_from) {
    double total = in->setup_ranks_s + in->setup_model_s + in->setup_engine_s +
                   in->setup_init_from_s;
    if (total <= SETUP_LINE_S) return;
    printf("set up in %.1f s: ranks and device %.1f s, data and model %.1f s, engine %.1f s "
           "(initial weights drawn on the %s)",
           total, in->setup_ranks_s, in->setup_model_s, in->setup_engine_s,
           in->init_on_device ? "GPU" : "host");
    if (init_from)
        printf(", %s %.1f s",
               zpp_hf_is_model_dir(init_from) ? "Hugging Face model" : "llm.c model file",
               in->setup_init_from_s);
    printf("\n");
}

/* A Hugging Face model trained at model.seq_len's default (64) while it
 * takes many more positions is most likely a forgotten key: say so. */
static void print_seq_len_note(const char *init_from, int seq_len) {
    zpp_train_config d;
    zpp_hf_config hf;
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", init_from);
    zpp_error_hold(); /* a probe (a GPT-2's config.json is no Llama's): no message */
    const int read = zpp_hf_is_model_dir(init_from) && zpp_train_config_defaults(&d) == ZPP_OK &&
                     seq_len == d.model.seq_len && zpp_hf_config_read(path, &hf) == ZPP_OK;
    zpp_error_release();
    if (!read || hf.max_position_embeddings <= seq_len) return;
    printf("note: sequences of %d tokens, model.seq_len's default; the model takes up to %d "
           "positions: set the length to train at (--set model.seq_len=2048, or in --config)\n",
           seq_len, hf.max_position_embeddings);
}

/* Set up: the trainer, then the save folder, then the resume. *ctx names
 * the stage that failed, for report. */
static zpp_status run_open(train_run *tr, const char **ctx) {
    const train_args *a = tr->a;
    zpp_trainer_opts to = {a->data,    a->node_size, a->gpu,   a->emulate_nodes,
                           a->profile, a->init_from, a->origin};
    *ctx = "train";
    ZPP_CHECK(zpp_trainer_create(tr->cfg, &to, &tr->t));
    tr->in = zpp_trainer_info_get(tr->t);
    if (tr->rank == 0) print_setup(tr->in, a->init_from);
    if (a->init_from && tr->rank == 0) {
        printf("starting from %s %s (vocabulary %d, padded to %d)\n",
               zpp_hf_gpt2_is_dir(a->init_from)    ? "Hugging Face GPT-2"
               : zpp_hf_is_model_dir(a->init_from) ? "Hugging Face Llama"
                                                   : "llm.c model file",
               a->init_from,
               zpp_gpt2_real_vocab(&tr->cfg->model), tr->cfg->model.vocab_size);
        print_seq_len_note(a->init_from, tr->cfg->model.seq_len);
    }
    if (a->save) { /* a folder that cannot take the checkpoint, or that another
                    * run holds, fails now: before the resume reads it */
        *ctx = "checkpoint";
        ZPP_CHECK(zpp_trainer_check_save_dir(tr->t, a->save));
        if (tr->rank == 0 && zpp_trainer_save_dir_note(tr->t)[0])
            printf("note: %s\n", zpp_trainer_save_dir_note(tr->t));
    }
    if (a->resume) {
        *ctx = "resume";
        ZPP_CHECK(run_resume(tr));
    }
    return ZPP_OK;
}

/* Before the first step: the progress bar, the FLOPs and the peak, and
 * the header on rank 0. */
static void run_begin(train_run *tr, const char *label) {
    const zpp_train_config *cfg = tr->cfg;
    const zpp_trainer_info *in = tr->in;
    memset(&bar, 0, sizeof bar);
    bar.on = tr->rank == 0 && !tr->a->quiet && progress_wanted();
    bar.last = now_s();
    /* FLOPs a token (the planner's count) and the peak MFU is taken of */
    tr->fpt = zpp_cost_flops_per_token((double)in->n_params, cfg->model.n_layer,
                                       cfg->model.n_embd, in->seq_len);
    char why[256];
    tr->peak = peak_tflops(tr->a, cfg, in, why, sizeof why);
    if (tr->rank == 0) {
        print_header(label, cfg, in, tr->fpt, tr->peak, why);
        const char *comm_note = zpp_trainer_comm_note(tr->t);
        if (comm_note[0]) printf("note: %s\n", comm_note);
        const char *eval_note = zpp_trainer_eval_note(tr->t);
        if (cfg->eval_every > 0 && eval_note[0]) printf("note: %s\n", eval_note);
        int continued = 0;
        unsigned long long id = (unsigned long long)zpp_trainer_run_id(tr->t, &continued);
        printf("run %016llx%s\n", id, continued ? " (continued from the checkpoint)" : "");
        fflush(stdout);
    }
    tr->rt.first_step = tr->start + 1;
}

/* The step's share of the totals (the summary's, the demo's) and its rates;
 * the first step pays one-time costs, so the rates are of the steps after. */
static void run_tally(train_run *tr, step_out *so) {
    const zpp_trainer_step_result *r = &so->r;
    const zpp_trainer_info *in = tr->in;
    run_totals *rt = &tr->rt;
    tr->loss = r->stats.loss;
    so->cross = r->stats.cross_node_bytes;
    so->intra = r->stats.intra_node_bytes;
    const double step_tokens = (double)in->global_batch * in->seq_len;
    if (so->s > tr->start) {
        tr->ms_sum += r->seconds * 1e3;
        tr->tps_sum += r->tokens_per_s;
        tr->timed++;
        rt->timed_s += r->seconds;
        rt->timed_tokens += step_tokens;
        rt->timed++;
    } else {
        rt->first_s = r->seconds;
    }
    rt->steps++;
    rt->loss = tr->loss;
    /* achieved model FLOP/s of one rank, and its share of the peak */
    so->tflops = tr->fpt * r->tokens_per_s / in->world_size / 1e12;
    so->mfu = tr->peak > 0 ? so->tflops / tr->peak : NAN;
    tr->cross_sum += so->cross;
    tr->intra_sum += so->intra;
    if (r->stats.profiled) prof_add(&tr->prof, so->s, tr->start, r);
}

/* Step s on every rank: train, then when due validate, checkpoint and
 * sample (each a collective). *ctx names the stage that failed. */
static zpp_status run_step(train_run *tr, int s, step_out *so, const char **ctx) {
    const zpp_train_config *cfg = tr->cfg;
    const train_args *a = tr->a;
    memset(so, 0, sizeof *so);
    so->s = s;
    so->val = -1.0f;
    so->last = s + 1 == cfg->train_steps;
    so->eval = cfg->eval_every > 0 && ((s + 1) % cfg->eval_every == 0 || so->last);
    *ctx = "train";
    ZPP_CHECK(zpp_trainer_step(tr->t, s, &so->r));
    if (so->eval) {
        *ctx = "validation";
        ZPP_CHECK(zpp_trainer_eval(tr->t, &so->val, &so->ev));
        tr->val = so->val;
        if (tr->rt.best_val < 0 || so->val < tr->rt.best_val) {
            tr->rt.best_val = so->val;
            tr->rt.best_step = s + 1;
        }
        tr->rt.val = so->val;
        tr->rt.val_step = s + 1;
    }
    run_tally(tr, so);
    so->saved = a->save && ((a->save_every && (s + 1) % a->save_every == 0) || so->last);
    if (so->saved) {
        *ctx = "checkpoint";
        ZPP_CHECK(zpp_trainer_save(tr->t, a->save, s + 1, &so->sv));
        snprintf(tr->rt.ckpt, sizeof tr->rt.ckpt, "%s", so->sv.folder);
    }
    /* a sample: every rank takes part (the engine gathers the weights) */
    if (cfg->sample_every > 0 && ((s + 1) % cfg->sample_every == 0 || so->last)) {
        *ctx = "sample";
        ZPP_CHECK(zpp_cli_sample_trainer(tr->t, cfg, &so->smp));
    }
    return ZPP_OK;
}

/* The step's metrics line (docs/logs.md), rank 0. */
static void write_metrics_line(FILE *metrics, const train_run *tr, const step_out *so) {
    const zpp_trainer_step_result *r = &so->r;
    char lb[32], nb[32], mb[32];
    fprintf(metrics,
            "{\"step\":%d,\"mode\":\"%s\",\"loss\":%s,\"lr\":%.6g,\"grad_norm\":%s,"
            "\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"cross_node_bytes\":%.0f,"
            "\"intra_node_bytes\":%.0f,\"device_peak_bytes\":%.0f,"
            "\"device_live_bytes\":%.0f,\"device_used_bytes\":%.0f,"
            "\"tflops\":%.6g,\"mfu\":%s",
            so->s + 1, tr->in->mode, json_num(lb, sizeof lb, "%.9g", tr->loss),
            (double)r->lr, json_num(nb, sizeof nb, "%.6g", r->stats.grad_norm),
            r->tokens_per_s, r->seconds * 1e3, so->cross, so->intra, r->device_peak_bytes,
            r->device_live_bytes, r->device_used_bytes, so->tflops,
            json_num(mb, sizeof mb, "%.6g", so->mfu));
    json_skip_fields(metrics, &r->stats, tr->cfg->fp16.enabled);
    json_profile_fields(metrics, r);
    if (so->eval)
        fprintf(metrics,
                ",\"val_loss\":%.9g,\"val_cross_node_bytes\":%.0f,"
                "\"val_intra_node_bytes\":%.0f",
                (double)so->val, zpp_volume_cross_total(&so->ev), zpp_volume_intra_total(&so->ev));
    if (tr->a->resume && so->s == tr->start) /* the first step after a resume */
        fprintf(metrics, ",\"resumed_from\":%d", tr->start);
    if (so->smp.gen) zpp_cli_sample_json(metrics, &so->smp); /* last: the longest field */
    fprintf(metrics, "}\n");
    fflush(metrics);
}

/* The step's log line (docs/logs.md), rank 0. */
static void print_step_line(const train_run *tr, const step_out *so) {
    const zpp_trainer_step_result *r = &so->r;
    bar_clear();
    printf("step %5d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | "
           "%.3g TFLOP/s/rank | MFU ",
           so->s + 1, (double)tr->loss, (double)r->lr, (double)r->stats.grad_norm,
           r->tokens_per_s, so->tflops);
    if (tr->peak > 0) printf("%.2f%%", 100.0 * so->mfu);
    else printf("n/a");
    printf(" | cross-node %.3f MB | intra-node %.3f MB", so->cross / 1e6, so->intra / 1e6);
    if (tr->cfg->fp16.enabled) printf(" | loss scale %g", (double)r->stats.loss_scale);
    if (r->stats.skipped) printf(" | skipped (non-finite gradient)");
    if (r->stats.profiled)
        printf(" | compute %.1f ms | exposed comm %.1f ms (max rank %.1f)", r->stats.compute_ms,
               r->stats.exposed_comm_ms, r->exposed_comm_ms_max);
    if (so->eval) printf(" | val loss %.4f", (double)so->val);
    printf("\n");
}

/* Everything step s shows, rank 0: the metrics line, the log line (every
 * steps_per_print steps, the first, the last, and with a validation), the
 * sample, the save line, the progress bar. */
static void log_step(const train_run *tr, const step_out *so, FILE *metrics) {
    const zpp_train_config *cfg = tr->cfg;
    const int s = so->s;
    if (metrics) write_metrics_line(metrics, tr, so);
    int print = !tr->a->quiet && cfg->steps_per_print > 0 &&
                ((s + 1) % cfg->steps_per_print == 0 || s == 0 || so->last);
    if (print || so->eval) print_step_line(tr, so);
    if (so->smp.gen) {
        bar_clear();
        zpp_cli_sample_print(stdout, s + 1, &so->smp);
    }
    if (so->saved) print_saved(s + 1, &so->sv);
    bar_time_step();
    bar_draw(s + 1, cfg->train_steps, tr->loss);
    fflush(stdout);
}

/* After the last step: --steps 0's checkpoint of the initial weights, then
 * on rank 0 the summary and --profile's figures. *ctx names the stage that
 * failed. */
static zpp_status run_finish(train_run *tr, const char **ctx) {
    const train_args *a = tr->a;
    if (a->save && tr->cfg->train_steps == 0) { /* --steps 0: the initial weights */
        zpp_ckpt_saved sv;
        *ctx = "checkpoint";
        ZPP_CHECK(zpp_trainer_save(tr->t, a->save, 0, &sv));
        if (tr->rank == 0) print_saved(0, &sv);
    }
    if (tr->rank == 0) {
        bar_clear();
        if (tr->rt.steps > 0) print_summary(&tr->rt, tr->in, tr->fpt, tr->peak);
        prof_print(&tr->prof);
    }
    return ZPP_OK;
}

/* The run's column of the demo's comparison. */
static void run_summarize(const train_run *tr, run_summary *sum) {
    const zpp_train_config *cfg = tr->cfg;
    snprintf(sum->mode, sizeof sum->mode, "%s", tr->in->mode);
    sum->train_loss = tr->loss;
    sum->val_loss = tr->val;
    sum->cross_bytes = tr->cross_sum / cfg->train_steps;
    sum->intra_bytes = tr->intra_sum / cfg->train_steps;
    sum->step_ms = tr->timed ? tr->ms_sum / tr->timed : 0.0;
    sum->tokens_per_s = tr->timed ? tr->tps_sum / tr->timed : 0.0;
    sum->compute_ms = tr->prof.n ? tr->prof.compute / tr->prof.n : 0.0;
    sum->exposed_ms = tr->prof.n ? tr->prof.exposed / tr->prof.n : 0.0;
}

/* ---- Preemption -------------------------------------------------------------
 * Schedulers warn before they kill: srun sends SIGTERM and, asked with
 * --signal, SIGUSR1 ahead of time; a terminal sends SIGINT; Open MPI's
 * mpirun forwards SIGUSR1 as it is and SIGTERM with a SIGKILL a second
 * later. The first of these only sets stop_signal. After each step every
 * rank learns the largest signal any rank got (a max over the world, so all
 * stop after the same step), a checkpoint of that step is saved when
 * --save is given, and the run ends with ZPP_CLI_EXIT_INTERRUPTED. A second
 * signal takes the signal's default action at once. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    if (stop_signal) { /* the second: now (both calls are async-signal-safe) */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
}

static const int stop_signals[] = {SIGTERM, SIGINT, SIGUSR1};
#define N_STOP_SIGNALS (int)(sizeof stop_signals / sizeof stop_signals[0])

/* Installs on_stop_signal, keeping the handlers it replaces in old[]. */
static void catch_stop_signals(struct sigaction old[N_STOP_SIGNALS]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* a read or a wait in progress goes on */
    stop_signal = 0;
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(stop_signals[i], &sa, &old[i]);
}

static void restore_stop_signals(const struct sigaction old[N_STOP_SIGNALS]) {
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(stop_signals[i], &old[i], NULL);
}

static const char *signal_name(int sig) {
    return sig == SIGTERM  ? "SIGTERM"
           : sig == SIGINT ? "SIGINT"
           : sig == SIGUSR1 ? "SIGUSR1"
                            : "a signal";
}

/* The signal that stops the run after step `step` on every rank, 0 for
 * none. Collective. */
static zpp_status stop_agreed(int step, int *sig_p) {
    double sig = (double)stop_signal;
    const zpp_status st = zpp_comm_max_world(&sig);
    /* a rank that stalls between steps is met here first: say after which */
    if (st == ZPP_ERR_TIMEOUT) return zpp_error_context(st, "after step %d", step);
    ZPP_CHECK(st);
    *sig_p = (int)sig;
    return ZPP_OK;
}

/* Stopped by `sig` after step s + 1: that step's checkpoint (unless the
 * step saved one already, or there is no --save), the line that says so,
 * the summary. *ctx names the stage that failed. */
static zpp_status run_interrupted(train_run *tr, const step_out *so, int sig, const char **ctx) {
    const train_args *a = tr->a;
    const int step = so->s + 1;
    zpp_ckpt_saved sv = so->sv;
    if (a->save && !so->saved) {
        *ctx = "checkpoint";
        ZPP_CHECK(zpp_trainer_save(tr->t, a->save, step, &sv));
        if (tr->rank == 0) print_saved(step, &sv);
    }
    if (tr->rank == 0) {
        bar_clear();
        if (a->save)
            printf("interrupted at step %d by %s: saved to %s; continue with --resume %s\n", step,
                   signal_name(sig), sv.folder, a->save);
        else
            printf("interrupted at step %d by %s: nothing saved (no --save)\n", step,
                   signal_name(sig));
        if (tr->rt.steps > 0) print_summary(&tr->rt, tr->in, tr->fpt, tr->peak);
        fflush(stdout);
    }
    return ZPP_OK;
}

/* One training run: 0, or 1 after printing what failed (once, rank 0).
 * `label` names it in the header (the demo's two runs), `sum` (or NULL)
 * takes its column of the demo's comparison. */
static int run(const zpp_train_config *cfg, const train_args *a, const char *label,
               FILE *metrics, run_summary *sum) {
    train_run tr;
    memset(&tr, 0, sizeof tr);
    tr.cfg = cfg;
    tr.a = a;
    tr.rank = zpp_comm_world_rank();
    tr.rt.t0 = now_s();
    tr.rt.val = tr.rt.best_val = -1.0f;
    tr.val = -1.0f;
    const char *ctx = "train";
    int sig = 0; /* the signal that stopped the run after a step */
    zpp_status st = run_open(&tr, &ctx);
    if (st != ZPP_OK) goto out;
    run_begin(&tr, label);
    for (int s = tr.start; s < cfg->train_steps; s++) {
        step_out so;
        st = run_step(&tr, s, &so, &ctx);
        if (st == ZPP_OK && tr.rank == 0) log_step(&tr, &so, metrics);
        zpp_cli_sample_result_free(&so.smp);
        if (st != ZPP_OK) goto out;
        ctx = "train";
        st = stop_agreed(so.s + 1, &sig);
        if (st == ZPP_OK && so.last) sig = 0; /* the run has ended anyway */
        if (st == ZPP_OK && sig) st = run_interrupted(&tr, &so, sig, &ctx);
        if (st != ZPP_OK || sig) goto out;
    }
    st = run_finish(&tr, &ctx);
    if (st == ZPP_OK && sum) run_summarize(&tr, sum);
out:
    /* the trainer goes first: report may end the job (a timeout) */
    zpp_trainer_destroy(tr.t);
    if (st != ZPP_OK) return report(ctx, st);
    return sig ? ZPP_CLI_EXIT_INTERRUPTED : 0;
}

static void print_comparison(const run_summary *r, int n, int profiled) {
    printf("\n%-22s", "");
    for (int i = 0; i < n; i++) printf(" %16s", r[i].label);
    printf("\n%-22s", "mode");
    for (int i = 0; i < n; i++) printf(" %16s", r[i].mode);
    printf("\n%-22s", "final train loss");
    for (int i = 0; i < n; i++) printf(" %16.4f", (double)r[i].train_loss);
    printf("\n%-22s", "final val loss");
    for (int i = 0; i < n; i++) printf(" %16.4f", (double)r[i].val_loss);
    printf("\n%-22s", "cross-node MB/step");
    for (int i = 0; i < n; i++) printf(" %16.3f", r[i].cross_bytes / 1e6);
    printf("\n%-22s", "intra-node MB/step");
    for (int i = 0; i < n; i++) printf(" %16.3f", r[i].intra_bytes / 1e6);
    printf("\n%-22s", "time per step (ms)");
    for (int i = 0; i < n; i++) printf(" %16.1f", r[i].step_ms);
    printf("\n%-22s", "tokens/s");
    for (int i = 0; i < n; i++) printf(" %16.0f", r[i].tokens_per_s);
    if (profiled) {
        printf("\n%-22s", "compute ms (rank 0)");
        for (int i = 0; i < n; i++) printf(" %16.3f", r[i].compute_ms);
        printf("\n%-22s", "exposed comm (rank 0)");
        for (int i = 0; i < n; i++) printf(" %16.3f", r[i].exposed_ms);
    }
    printf("\n");
    if (n == 2 && r[0].cross_bytes > 0)
        printf("\nZeRO++ sends %.3fx the cross-node bytes of ZeRO-3 (ideal: 0.25, plus "
               "quantization scales and the model's vectors (biases, norm gains), sent at full "
               "precision).\n",
               r[1].cross_bytes / r[0].cross_bytes);
}

/* A config over config.json's shape that failed: when it names another
 * family, the config's checks refused the llama keys config.json set
 * ("'model.n_kv_head' is a key of the llama family"), which the user never
 * wrote; say what they did write instead. Probed by loading the config and
 * the --set keys over the defaults with the family llama: the family
 * changes only if they name it. Otherwise st, its message kept. */
static zpp_status hf_family_refusal(const train_args *a, zpp_status st) {
    zpp_train_config probe;
    zpp_error_hold(); /* the probe's own errors do not replace st's message */
    int other = zpp_train_config_defaults(&probe) == ZPP_OK;
    probe.model_family = ZPP_FAMILY_LLAMA;
    if (other && a->config) other = zpp_train_config_load_file(a->config, &probe) == ZPP_OK;
    if (other && a->sets.n) other = zpp_train_config_set(&probe, a->sets.v, a->sets.n) == ZPP_OK;
    other = other && probe.model_family != ZPP_FAMILY_LLAMA;
    zpp_error_release();
    if (!other) return st;
    return zpp_error(ZPP_ERR_CONFIG,
                     "--init-from %s is a Hugging Face Llama, but the config sets "
                     "'model.family' to \"%s\"; drop the key or set it to \"llama\"",
                     a->init_from, zpp_model_family_name(probe.model_family));
}

/* The config, in order: the defaults; the llm.c file's or config.json's
 * shape (--init-from)
 * or the checkpoint's own config (--resume without --config; with one, its
 * model.hf_architecture and hf_sliding_window only); the --config
 * file; each --set. A model section loaded over an llm.c shape must leave
 * it as it was. With --resume and no --data, a->data becomes the data file
 * the checkpoint trained on (held in *saved). Not agreed: *stage names
 * what failed on this rank. */
static zpp_status load_config(train_args *a, zpp_train_config *cfg, zpp_trainer_saved_run *saved,
                              const char **stage) {
    zpp_status st = zpp_train_config_defaults(cfg);
    zpp_comm_world_set_timeout(a->collective_timeout >= 0 ? a->collective_timeout
                                                          : cfg->collective_timeout_s);
    *stage = "config";
    zpp_llmc_file *llmc = NULL;
    zpp_hf_config hf;
    zpp_gpt2_config hf_gpt2; /* a GPT-2 folder's shape (train/hf_gpt2.h) */
    const int is_gpt2 = a->init_from && zpp_hf_gpt2_is_dir(a->init_from);
    const int is_hf = a->init_from && zpp_hf_is_model_dir(a->init_from) && !is_gpt2;
    int hf_applied = 0; /* config.json's shape is in cfg: what fails next is the config's */
    if (st == ZPP_OK && a->init_from) {
        char path[4096];
        *stage = "init-from";
        snprintf(path, sizeof path, "%s/config.json", a->init_from);
        if (is_hf) st = zpp_hf_config_read(path, &hf); /* config.json's shape */
        if (st == ZPP_OK && is_hf) st = zpp_hf_apply_shape(&hf, cfg);
        hf_applied = st == ZPP_OK && is_hf;
        if (is_gpt2) st = zpp_hf_gpt2_read_config(a->init_from, &hf_gpt2);
        if (st == ZPP_OK && is_gpt2) cfg->model = hf_gpt2;
        if (!is_hf && !is_gpt2) st = zpp_llmc_open(a->init_from, &llmc);
        if (st == ZPP_OK && llmc) cfg->model = zpp_llmc_info_get(llmc)->model;
        if (st == ZPP_OK) *stage = "config";
    }
    if (st == ZPP_OK && a->resume) {
        /* read even with --config: the data file it trained on */
        zpp_train_config from_ckpt;
        *stage = "resume";
        st = zpp_trainer_config_from_checkpoint(a->resume, &from_ckpt, saved);
        if (st == ZPP_OK && !a->config) *cfg = from_ckpt;
        /* which Hugging Face architecture the weights came as is the
         * checkpoint's, not a run setting: kept under a --config that does
         * not name one (it may still), so an export names it */
        if (st == ZPP_OK && a->config) {
            cfg->hf_architecture = from_ckpt.hf_architecture;
            cfg->hf_sliding_window = from_ckpt.hf_sliding_window;
        }
        if (st == ZPP_OK) *stage = "config";
    }
    if (st == ZPP_OK && a->config) st = zpp_train_config_load_file(a->config, cfg);
    if (st == ZPP_OK && a->sets.n) {
        *stage = "--set";
        st = zpp_train_config_set(cfg, a->sets.v, a->sets.n);
    }
    if (st == ZPP_OK && llmc) st = zpp_llmc_check_model(llmc, &cfg->model);
    if (st != ZPP_OK && hf_applied) st = hf_family_refusal(a, st);
    if (st == ZPP_OK && is_hf) st = zpp_hf_check_shape(&hf, cfg, a->init_from);
    if (st == ZPP_OK && is_gpt2 && cfg->model_family != ZPP_FAMILY_GPT2)
        st = zpp_error(ZPP_ERR_CONFIG, "--init-from %s is a Hugging Face GPT-2, but the config "
                                       "sets 'model.family' to \"%s\"; drop the key",
                       a->init_from, zpp_model_family_name(cfg->model_family));
    if (st == ZPP_OK && is_gpt2) st = zpp_hf_gpt2_check_shape(&hf_gpt2, a->init_from, &cfg->model);
    zpp_llmc_close(llmc);
    /* the data the checkpoint trained on, unless --data names another */
    if (st == ZPP_OK && a->resume) a->origin = saved->init_from;
    if (st == ZPP_OK && a->resume && !a->data && saved->data_path) {
        a->data = saved->data_path;
        if (access(a->data, R_OK) != 0)
            st = zpp_error(ZPP_ERR_IO,
                           "checkpoint %s was trained on %s, which cannot be read (%s); pass "
                           "--data FILE to continue on another file",
                           a->resume, a->data, strerror(errno));
    }
    return st;
}

/* Rank 0: what a resume from an older checkpoint takes from the defaults. */
static void print_resume_notes(const train_args *a, const zpp_trainer_saved_run *saved) {
    if (a->resume && !a->config && !saved->has_config)
        printf("note: %s was saved before checkpoints kept their config: its model shape, "
               "dtype, global batch and seed are used, and the defaults for the rest (optimizer, "
               "schedule, ZeRO++ options); give --config with the file it was trained with to "
               "continue it as it was\n",
               a->resume);
    if (a->resume && !a->data && !saved->has_data)
        printf("note: %s does not record its training data: this run reads the built-in "
               "synthetic corpus; give --data FILE to continue on yours\n",
               a->resume);
}

/* The flags, last: over the config and the checkpoint's. */
static void apply_flags(const train_args *a, zpp_train_config *cfg) {
    if (a->steps >= 0) cfg->train_steps = (int)a->steps;
    if (a->eval_every >= 0) cfg->eval_every = (int)a->eval_every;
    if (a->sample_every >= 0) cfg->sample_every = (int)a->sample_every;
    if (a->sample_tokens > 0) cfg->sample_tokens = (int)a->sample_tokens;
    if (a->seed >= 0) cfg->seed = (uint64_t)a->seed;
    if (a->data_order >= 0) cfg->data_order = (zpp_data_order)a->data_order;
    if (a->collective_timeout >= 0) cfg->collective_timeout_s = a->collective_timeout;
    if (a->prune_newer) cfg->prune_newer = 1;
    if (a->recompute) cfg->activation_checkpointing = 1;
}

/* Rank 0 opens --metrics; not agreed. */
static zpp_status open_metrics(const train_args *a, FILE **metrics_p) {
    if (zpp_comm_world_rank() != 0 || !a->metrics) return ZPP_OK;
    /* A resumed run continues the file (its first line says so). */
    *metrics_p = fopen(a->metrics, a->resume ? "a" : "w");
    if (!*metrics_p)
        return zpp_error(ZPP_ERR_IO, "cannot write metrics file %s: %s", a->metrics,
                         strerror(errno));
    return ZPP_OK;
}

/* The demo's model and schedule, where no --config gives them. */
static void demo_defaults(const train_args *a, zpp_train_config *cfg) {
    if (a->steps <= 0) cfg->train_steps = 300;
    if (a->eval_every < 0) cfg->eval_every = 100;
    cfg->steps_per_print = 50;
    cfg->train_micro_batch_size_per_gpu = 4;
    cfg->scheduler.type = ZPP_SCHED_WARMUP_COSINE_LR;
    cfg->scheduler.warmup_type = ZPP_WARMUP_LINEAR;
    cfg->scheduler.warmup_num_steps = 20;
    cfg->optimizer.lr = 2e-3;
    cfg->gradient_clipping = 1.0;
    cfg->bf16 = 1;
    cfg->model.n_layer = 4;
    cfg->model.n_embd = 128;
    cfg->model.n_head = 4;
    /* This model is small enough that DeepSpeed's reuse rule (1e9
     * parameters) would keep every unit gathered from the forward to
     * its backward: no backward gather at all, nothing for hpZ to do.
     * Distance 0 shows what a model too large to keep gathered does,
     * a gather in each pass: the paper's 3M against 0.75M. */
    cfg->zero.max_reuse_distance = 0;
}

/* The demo: the same model, data and seed, first with plain ZeRO-3, then
 * with all three ZeRO++ optimizations, on emulated nodes; then the two
 * side by side. 0, or 1 after report. */
static int run_demo(const zpp_train_config *given, train_args *a, FILE *metrics) {
    const int rank = zpp_comm_world_rank(), world = zpp_comm_world_size();
    zpp_train_config cfg = *given;
    if (a->node_size == 0) a->node_size = world % 2 == 0 ? world / 2 : 1;
    if (!a->config) demo_defaults(a, &cfg);
    run_summary sums[2];
    memset(sums, 0, sizeof sums);
    zpp_train_config c0 = cfg, c1 = cfg;
    c0.zero.quantized_weights = 0;
    c0.zero.hpz_partition_size = 1;
    c0.zero.quantized_gradients = 0;
    c0.zero.loco = 0; /* error feedback belongs to qgZ */
    c1.zero.quantized_weights = 1;
    c1.zero.hpz_partition_size = a->node_size > 1 ? a->node_size : 1;
    c1.zero.quantized_gradients = 1;
    sums[0].label = "ZeRO-3";
    sums[1].label = "ZeRO++";
    int rc = run(&c0, a, "ZeRO-3", metrics, &sums[0]);
    if (rc == 0) {
        if (rank == 0) printf("\n");
        rc = run(&c1, a, "ZeRO++", metrics, &sums[1]);
    }
    if (rc == 0 && rank == 0) print_comparison(sums, 2, a->profile);
    return rc;
}

int zpp_cli_train(int argc, char **argv) {
    train_args a;
    int pr = parse_args(argc, argv, &a);
    if (pr != 0) return pr > 0 ? 0 : 2;
    /* MPI is initialised by main.c. */
    int rank = zpp_comm_world_rank(), rc = 0;
    FILE *metrics = NULL;
    zpp_train_config cfg;
    zpp_trainer_saved_run saved;
    memset(&saved, 0, sizeof saved);
    const char *stage = "config";
    zpp_status st = zpp_comm_agree_world(load_config(&a, &cfg, &saved, &stage));
    if (st != ZPP_OK) {
        rc = report(stage, st);
        goto out;
    }
    if (rank == 0) print_resume_notes(&a, &saved);
    apply_flags(&a, &cfg);
    /* samples of a BPE model print as text in the tokenizer noted beside its data */
    if (rank == 0 && cfg.sample_every > 0) zpp_cli_sample_use_data_tokenizer(a.data, &cfg.model);
    if (rank == 0 && cfg.ignored[0])
        printf("note: DeepSpeed keys accepted and ignored: %s\n", cfg.ignored);
    st = zpp_comm_agree_world(open_metrics(&a, &metrics));
    if (st != ZPP_OK) {
        rc = report("train", st);
        goto out;
    }
    struct sigaction old[N_STOP_SIGNALS];
    catch_stop_signals(old);
    rc = a.demo ? run_demo(&cfg, &a, metrics) : run(&cfg, &a, NULL, metrics, NULL);
    restore_stop_signals(old);
out:
    if (metrics) fclose(metrics);
    free(saved.data_path);
    free(saved.init_from);
    fflush(stdout);
    return rc;
}
