/* tools/train.c — `zeropp train`: train GPT-2 under mpirun, log each step,
 * write metrics, and (--demo) compare ZeRO-3 with ZeRO++ side by side. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "core/error.h"
#include "train/llmc.h"
#include "train/trainer.h"

typedef struct train_args {
    const char *config, *data, *metrics, *save, *resume, *init_from;
    long steps, eval_every, seed, save_every;
    long sample_every, sample_tokens; /* < 0: not given */
    int node_size;
    int gpu, emulate_nodes;
    int demo;
    int quiet;
    int profile;
    double collective_timeout; /* seconds; < 0: not given */
    int data_order;            /* zpp_data_order; < 0: not given */
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
            "                    sockets (launch with mpirun --bind-to none)\n"
            "  --save DIR        write a checkpoint to DIR at the end (and every --save-every K);\n"
            "                    DIR is created before step 1 and locked for the run (a second\n"
            "                    job on DIR stops at start); each save is a new DIR/step-N\n"
            "                    folder, published atomically; the newest\n"
            "                    zeropp.keep_checkpoints (2) stay\n"
            "  --save-every K    also checkpoint every K steps (needs --save)\n"
            "  --init-from FILE  start from an llm.c GPT-2 model file (fp32 or bf16): the model's\n"
            "                    shape comes from it (a model section in --config must agree);\n"
            "                    its padded vocabulary rows stay outside the softmax\n"
            "  --resume DIR      continue from the newest checkpoint published in DIR (or from\n"
            "                    the step folder DIR), on any number of ranks; the same ranks\n"
            "                    continue bit for bit. Without --config the run takes the\n"
            "                    config the checkpoint was saved with, and without --data its\n"
            "                    data file; what differs from the save (a --set, --steps, ...)\n"
            "                    is listed in one \"changed since the save\" note, with the lr\n"
            "                    of the first step before and after. A different model shape\n"
            "                    or dtype is refused. A checkpoint at or past --steps is an\n"
            "                    error (exit 1): nothing would be trained\n"
            "  --demo            train with ZeRO-3, then ZeRO++ (qwZ+hpZ+qgZ), and compare\n"
            "  --quiet           no per-step log lines\n"
            "  --profile         time each step: compute and exposed communication (the time\n"
            "                    the compute stream stood waiting for a collective) on the log\n"
            "                    line, in the metrics (stream_ms, compute_ms, exposed_comm_ms,\n"
            "                    exposed_comm_ms_max) and in a summary at the end\n"
            "  --collective-timeout S  seconds a rank waits for its peers in a collective\n"
            "                    before the job stops (a rank stalled or died); 0 = forever\n"
            "                    (overrides zeropp.collective_timeout_s, default 600)\n"
            "Options take their value as --name VALUE or --name=VALUE; counts take\n"
            "suffixes (" ZPP_CLI_COUNT_HELP ").\n"
            "A progress bar is drawn when stdout is a terminal; under mpirun set\n"
            "ZPP_PROGRESS=1 to ask for it (scripts/demo.sh does).\n");
}

/* The largest seed: counts are exact up to 2^53. */
#define TRAIN_SEED_MAX (1ll << 53)

/* Prints argument errors on rank 0 only: every rank parses the same line
 * and reaches the same verdict, so they agree without a collective. */
static int parse_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = a->eval_every = a->seed = -1;
    a->sample_every = a->sample_tokens = -1;
    a->save_every = 0;
    const int print = zpp_comm_world_rank() == 0;
    int list_keys = 0;
    const char *device = NULL, *timeout = NULL, *order = NULL;
    a->collective_timeout = -1.0;
    a->data_order = -1;
    const zpp_cli_opt opts[] = {
        {"--list-config-keys", ZPP_CLI_FLAG, &list_keys, 0, 0},
        {"--demo", ZPP_CLI_FLAG, &a->demo, 0, 0},
        {"--quiet", ZPP_CLI_FLAG, &a->quiet, 0, 0},
        {"--profile", ZPP_CLI_FLAG, &a->profile, 0, 0},
        {"--emulate-nodes", ZPP_CLI_FLAG, &a->emulate_nodes, 0, 0},
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
        {"--collective-timeout", ZPP_CLI_STR, &timeout, 0, 0}, /* seconds, below */
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

/* Prints the message of a failed call, once: the trainer's calls agree
 * over the world, so every rank holds the same status and message (the
 * lowest failing rank's), and rank 0 prints it. */
static int report(const char *context, zpp_status st) {
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

/* Under mpirun a rank's stdout is a pipe or pty of Open MPI's whatever the
 * user's terminal is, so isatty() cannot tell: there ZPP_PROGRESS=1 (set by
 * scripts/demo.sh when its own stdout is a terminal) asks for the bar, and
 * ZPP_PROGRESS=0 always turns it off. */
static int progress_wanted(void) {
    const char *env = getenv("ZPP_PROGRESS");
    if (env) return env[0] == '1';
    if (zpp_comm_launched()) return 0;
    return isatty(STDOUT_FILENO);
}

static void progress(int step, int total, float loss) {
    int width = 30, done = (int)((long)width * step / total);
    printf("\r[");
    for (int i = 0; i < width; i++) putchar(i < done ? '#' : '.');
    printf("] %d/%d loss %.4f", step, total, (double)loss);
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

static void json_skip_fields(FILE *f, const zpp_step_stats *st, int fp16) {
    fprintf(f, ",\"skipped\":%s,\"skipped_total\":%d", st->skipped ? "true" : "false",
            st->skipped_total);
    if (fp16) fprintf(f, ",\"loss_scale\":%.17g", (double)st->loss_scale);
    if (!isnan(st->param_sumsq)) fprintf(f, ",\"param_sumsq\":%.9g", st->param_sumsq);
}

/* --profile's fields: rank 0's compute stream, and the most exposed
 * communication of any rank (engine.h, zpp_engine_profile). */
static void json_profile_fields(FILE *f, const zpp_trainer_step_result *r) {
    const zpp_engine_profile *p = &r->stats.profile;
    if (!p->valid) return;
    fprintf(f, ",\"stream_ms\":%.3f,\"compute_ms\":%.3f,\"exposed_comm_ms\":%.3f,"
            "\"exposed_comm_ms_max\":%.3f",
            p->stream_ms, p->compute_ms, p->exposed_comm_ms, r->exposed_comm_ms_max);
}

static void prof_add(prof_sum *ps, int step, int start, const zpp_trainer_step_result *r) {
    const zpp_engine_profile *p = &r->stats.profile;
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

static int run(const zpp_train_config *cfg, const train_args *a, const char *label,
               FILE *metrics, run_summary *sum) {
    int rank = zpp_comm_world_rank();
    zpp_trainer *t = NULL;
    zpp_trainer_opts to = {a->data,    a->node_size, a->gpu, a->emulate_nodes,
                           a->profile, a->init_from};
    zpp_status st = zpp_trainer_create(cfg, &to, &t);
    if (st != ZPP_OK) return report("train", st);
    const zpp_trainer_info *in = zpp_trainer_get_info(t);
    int start = 0;
    if (a->init_from && rank == 0)
        printf("starting from llm.c model file %s (vocabulary %d, padded to %d)\n", a->init_from,
               zpp_gpt2_real_vocab(&cfg->model), cfg->model.vocab_size);
    if (a->save) { /* a folder that cannot take the checkpoint, or that another
                    * run holds, fails now: before the resume reads it */
        st = zpp_trainer_check_save_dir(t, a->save);
        if (st != ZPP_OK) {
            zpp_trainer_destroy(t);
            return report("checkpoint", st);
        }
        if (rank == 0 && zpp_trainer_save_dir_note(t)[0])
            printf("note: %s\n", zpp_trainer_save_dir_note(t));
    }
    if (a->resume) {
        st = zpp_trainer_load(t, a->resume, &start);
        if (st != ZPP_OK) {
            zpp_trainer_destroy(t);
            return report("resume", st);
        }
        if (rank == 0) printf("resumed from %s after step %d\n", a->resume, start);
        const char *note = zpp_trainer_resume_note(t);
        if (rank == 0 && note[0]) { /* one note, a line per change */
            printf("resume: changed since the save:\n");
            for (const char *p = note; *p;) {
                size_t n = strcspn(p, "\n");
                printf("  %.*s\n", (int)n, p);
                p += n + (p[n] == '\n');
            }
        }
        if (start >= cfg->train_steps) {
            zpp_trainer_destroy(t);
            return report("resume",
                          zpp_error(ZPP_ERR_CONFIG,
                                    "the checkpoint in %s is at step %d and the run ends at "
                                    "step %d: nothing to train; raise --steps",
                                    a->resume, start, cfg->train_steps));
        }
    }
    int tty = rank == 0 && !a->quiet && progress_wanted();
    if (rank == 0) {
        printf("%s: %d rank%s = %d node%s of %d, GPT-2 %zu params (%d layers, %d wide, T=%d), "
               "%s data (%zu tokens), global batch %d = %d x %d accum x %d rank%s, %s\n",
               label ? label : "train", in->world_size, in->world_size == 1 ? "" : "s",
               in->nodes, in->nodes == 1 ? "" : "s", in->node_size, in->n_params,
               cfg->model.n_layer, cfg->model.n_embd, in->seq_len,
               zpp_data_kind_name(in->data.kind), in->data.n_tokens, in->global_batch,
               in->micro_batch, in->accum, in->world_size, in->world_size == 1 ? "" : "s",
               cfg->bf16 ? "bf16" : cfg->fp16.enabled ? "fp16" : "fp32");
        int continued = 0;
        unsigned long long id = (unsigned long long)zpp_trainer_run_id(t, &continued);
        printf("run %016llx%s\n", id, continued ? " (continued from the checkpoint)" : "");
        fflush(stdout);
    }
    double ms_sum = 0.0, cross_sum = 0.0, intra_sum = 0.0, tps_sum = 0.0;
    int timed = 0;
    prof_sum prof;
    memset(&prof, 0, sizeof prof);
    float loss = 0.0f, val = -1.0f;
    for (int s = start; s < cfg->train_steps; s++) {
        zpp_trainer_step_result r;
        st = zpp_trainer_step(t, s, &r);
        if (st != ZPP_OK) {
            zpp_trainer_destroy(t);
            return report("train", st);
        }
        loss = r.stats.loss;
        int last = s + 1 == cfg->train_steps;
        int eval = cfg->eval_every > 0 && ((s + 1) % cfg->eval_every == 0 || last);
        float v = -1.0f;
        zpp_volume ev;
        memset(&ev, 0, sizeof ev);
        if (eval) {
            st = zpp_trainer_eval(t, &v, &ev);
            if (st != ZPP_OK) {
                zpp_trainer_destroy(t);
                return report("validation", st);
            }
            val = v;
        }
        double cross = zpp_volume_cross_total(&r.stats.volume);
        double intra = zpp_volume_intra_total(&r.stats.volume);
        if (s > start) { /* the first step pays one-time costs */
            ms_sum += r.seconds * 1e3;
            tps_sum += r.tokens_per_s;
            timed++;
        }
        cross_sum += cross;
        intra_sum += intra;
        if (r.stats.profile.valid) prof_add(&prof, s, start, &r);
        if (a->save && ((a->save_every && (s + 1) % a->save_every == 0) || last)) {
            st = zpp_trainer_save(t, a->save, s + 1);
            if (st != ZPP_OK) {
                zpp_trainer_destroy(t);
                return report("checkpoint", st);
            }
        }
        /* a sample: every rank takes part (the engine gathers the weights) */
        zpp_cli_sample_result smp = {0};
        if (cfg->sample_every > 0 && ((s + 1) % cfg->sample_every == 0 || last)) {
            st = zpp_cli_sample_trainer(t, cfg, &smp);
            if (st != ZPP_OK) {
                zpp_trainer_destroy(t);
                return report("sample", st);
            }
        }
        if (rank != 0) {
            zpp_cli_sample_result_free(&smp);
            continue;
        }
        if (metrics) {
            char lb[32], nb[32];
            fprintf(metrics,
                    "{\"step\":%d,\"mode\":\"%s\",\"loss\":%s,\"lr\":%.6g,\"grad_norm\":%s,"
                    "\"tokens_per_s\":%.1f,\"step_ms\":%.3f,\"cross_node_bytes\":%.0f,"
                    "\"intra_node_bytes\":%.0f,\"device_peak_bytes\":%.0f,"
                    "\"device_live_bytes\":%.0f,\"device_used_bytes\":%.0f",
                    s + 1, in->mode, json_num(lb, sizeof lb, "%.9g", loss), (double)r.stats.lr,
                    json_num(nb, sizeof nb, "%.6g", r.stats.grad_norm), r.tokens_per_s,
                    r.seconds * 1e3, cross, intra, r.device_peak_bytes, r.device_live_bytes,
                    r.device_used_bytes);
            json_skip_fields(metrics, &r.stats, cfg->fp16.enabled);
            json_profile_fields(metrics, &r);
            if (eval)
                fprintf(metrics,
                        ",\"val_loss\":%.9g,\"val_cross_node_bytes\":%.0f,"
                        "\"val_intra_node_bytes\":%.0f",
                        (double)v, zpp_volume_cross_total(&ev), zpp_volume_intra_total(&ev));
            if (smp.gen) zpp_cli_sample_json(metrics, &smp); /* last: the longest field */
            fprintf(metrics, "}\n");
            fflush(metrics);
        }
        int print = !a->quiet && cfg->steps_per_print > 0 &&
                    ((s + 1) % cfg->steps_per_print == 0 || s == 0 || last);
        if (print || eval) {
            if (tty) printf("\r%70s\r", ""); /* clear the bar */
            printf("step %5d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | "
                   "cross-node %.3f MB | intra-node %.3f MB",
                   s + 1, (double)loss, (double)r.stats.lr, (double)r.stats.grad_norm,
                   r.tokens_per_s, cross / 1e6, intra / 1e6);
            if (cfg->fp16.enabled) printf(" | loss scale %g", (double)r.stats.loss_scale);
            if (r.stats.skipped) printf(" | skipped (non-finite gradient)");
            if (r.stats.profile.valid)
                printf(" | compute %.1f ms | exposed comm %.1f ms (max rank %.1f)",
                       r.stats.profile.compute_ms, r.stats.profile.exposed_comm_ms,
                       r.exposed_comm_ms_max);
            if (eval) printf(" | val loss %.4f", (double)v);
            printf("\n");
        }
        if (smp.gen) {
            if (tty) printf("\r%70s\r", "");
            zpp_cli_sample_print(stdout, s + 1, &smp);
            zpp_cli_sample_result_free(&smp);
        }
        if (tty) progress(s + 1, cfg->train_steps, loss);
        fflush(stdout);
    }
    if (a->save && cfg->train_steps == 0) { /* --steps 0: the initial weights */
        st = zpp_trainer_save(t, a->save, 0);
        if (st != ZPP_OK) {
            zpp_trainer_destroy(t);
            return report("checkpoint", st);
        }
        if (rank == 0) printf("saved the initial weights (step 0) to %s\n", a->save);
    }
    if (tty) printf("\n");
    if (rank == 0) prof_print(&prof);
    if (sum) {
        snprintf(sum->mode, sizeof sum->mode, "%s", in->mode);
        sum->train_loss = loss;
        sum->val_loss = val;
        sum->cross_bytes = cross_sum / cfg->train_steps;
        sum->intra_bytes = intra_sum / cfg->train_steps;
        sum->step_ms = timed ? ms_sum / timed : 0.0;
        sum->tokens_per_s = timed ? tps_sum / timed : 0.0;
        sum->compute_ms = prof.n ? prof.compute / prof.n : 0.0;
        sum->exposed_ms = prof.n ? prof.exposed / prof.n : 0.0;
    }
    zpp_trainer_destroy(t);
    return 0;
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
               "quantization scales and the biases and LayerNorm parameters, sent at full "
               "precision).\n",
               r[1].cross_bytes / r[0].cross_bytes);
}

int zpp_cli_train(int argc, char **argv) {
    train_args a;
    int pr = parse_args(argc, argv, &a);
    if (pr != 0) return pr > 0 ? 0 : 2;
    /* MPI is initialised by main.c. */
    int rank = zpp_comm_world_rank(), world = zpp_comm_world_size(), rc = 0;
    FILE *metrics = NULL;

    zpp_train_config cfg;
    zpp_status st = zpp_train_config_defaults(&cfg);
    zpp_comm_world_set_timeout(a.collective_timeout >= 0 ? a.collective_timeout
                                                         : cfg.collective_timeout_s);
    /* The config, in order: the defaults; the llm.c file's shape
     * (--init-from) or the checkpoint's own config (--resume without
     * --config); the --config file; each --set; then the flags. A model
     * section loaded over an llm.c shape must leave it as it was. */
    const char *stage = "config";
    zpp_llmc_file *llmc = NULL;
    zpp_trainer_saved_run saved;
    memset(&saved, 0, sizeof saved);
    if (st == ZPP_OK && a.init_from) {
        stage = "init-from";
        st = zpp_llmc_open(a.init_from, &llmc);
        if (st == ZPP_OK) cfg.model = zpp_llmc_get_info(llmc)->model;
        if (st == ZPP_OK) stage = "config";
    }
    if (st == ZPP_OK && a.resume) {
        /* read even with --config: the data file it trained on */
        zpp_train_config from_ckpt;
        stage = "resume";
        st = zpp_trainer_config_from_checkpoint(a.resume, &from_ckpt, &saved);
        if (st == ZPP_OK && !a.config) cfg = from_ckpt;
        if (st == ZPP_OK) stage = "config";
    }
    if (st == ZPP_OK && a.config) st = zpp_train_config_load_file(a.config, &cfg);
    if (st == ZPP_OK && a.sets.n) {
        stage = "--set";
        st = zpp_train_config_set(&cfg, a.sets.v, a.sets.n);
    }
    if (st == ZPP_OK && llmc) st = zpp_llmc_check_model(llmc, &cfg.model);
    zpp_llmc_close(llmc);
    /* the data the checkpoint trained on, unless --data names another */
    if (st == ZPP_OK && a.resume && !a.data && saved.data_path) {
        a.data = saved.data_path;
        if (access(a.data, R_OK) != 0)
            st = zpp_error(ZPP_ERR_IO,
                           "checkpoint %s was trained on %s, which cannot be read (%s); pass "
                           "--data FILE to continue on another file",
                           a.resume, a.data, strerror(errno));
    }
    st = zpp_comm_agree_world(st);
    if (st != ZPP_OK) {
        rc = report(stage, st);
        goto done;
    }
    if (rank == 0 && a.resume && !a.config && !saved.has_config)
        printf("note: %s was saved before checkpoints kept their config: its model shape, "
               "dtype, global batch and seed are used, and the defaults for the rest (optimizer, "
               "schedule, ZeRO++ options); give --config with the file it was trained with to "
               "continue it as it was\n",
               a.resume);
    if (rank == 0 && a.resume && !a.data && !saved.has_data)
        printf("note: %s does not record its training data: this run reads the built-in "
               "synthetic corpus; give --data FILE to continue on yours\n",
               a.resume);
    if (a.steps >= 0) cfg.train_steps = (int)a.steps;
    if (a.eval_every >= 0) cfg.eval_every = (int)a.eval_every;
    if (a.sample_every >= 0) cfg.sample_every = (int)a.sample_every;
    if (a.sample_tokens > 0) cfg.sample_tokens = (int)a.sample_tokens;
    if (a.seed >= 0) cfg.seed = (uint64_t)a.seed;
    if (a.data_order >= 0) cfg.data_order = (zpp_data_order)a.data_order;
    if (a.collective_timeout >= 0) cfg.collective_timeout_s = a.collective_timeout;
    if (rank == 0 && cfg.ignored[0])
        printf("note: DeepSpeed keys accepted and ignored: %s\n", cfg.ignored);
    st = ZPP_OK;
    if (rank == 0 && a.metrics) {
        metrics = fopen(a.metrics, "w");
        if (!metrics)
            st = zpp_error(ZPP_ERR_IO, "cannot write metrics file %s: %s", a.metrics,
                           strerror(errno));
    }
    st = zpp_comm_agree_world(st);
    if (st != ZPP_OK) {
        rc = report("train", st);
        goto done;
    }

    if (!a.demo) {
        rc = run(&cfg, &a, NULL, metrics, NULL);
        goto done;
    }

    /* The demo: the same model, data and seed, first with plain ZeRO-3, then
     * with all three ZeRO++ optimizations, on emulated nodes. */
    if (a.node_size == 0) a.node_size = world % 2 == 0 ? world / 2 : 1;
    if (!a.config) {
        if (a.steps <= 0) cfg.train_steps = 300;
        if (a.eval_every < 0) cfg.eval_every = 100;
        cfg.steps_per_print = 50;
        cfg.train_micro_batch_size_per_gpu = 4;
        cfg.scheduler.type = ZPP_SCHED_WARMUP_COSINE_LR;
        cfg.scheduler.warmup_type = ZPP_WARMUP_LINEAR;
        cfg.scheduler.warmup_num_steps = 20;
        cfg.optimizer.lr = 2e-3;
        cfg.gradient_clipping = 1.0;
        cfg.bf16 = 1;
        cfg.model.n_layer = 4;
        cfg.model.n_embd = 128;
        cfg.model.n_head = 4;
        /* This model is small enough that DeepSpeed's reuse rule (1e9
         * parameters) would keep every unit gathered from the forward to
         * its backward: no backward gather at all, nothing for hpZ to do.
         * Distance 0 shows what a model too large to keep gathered does,
         * a gather in each pass: the paper's 3M against 0.75M. */
        cfg.zero.max_reuse_distance = 0;
    }
    run_summary sums[2];
    memset(sums, 0, sizeof sums);
    zpp_train_config c0 = cfg, c1 = cfg;
    c0.zero.quantized_weights = 0;
    c0.zero.hpz_partition_size = 1;
    c0.zero.quantized_gradients = 0;
    c0.zero.loco = 0; /* error feedback belongs to qgZ */
    c1.zero.quantized_weights = 1;
    c1.zero.hpz_partition_size = a.node_size > 1 ? a.node_size : 1;
    c1.zero.quantized_gradients = 1;
    sums[0].label = "ZeRO-3";
    sums[1].label = "ZeRO++";
    rc = run(&c0, &a, "ZeRO-3", metrics, &sums[0]);
    if (rc == 0) {
        if (rank == 0) printf("\n");
        rc = run(&c1, &a, "ZeRO++", metrics, &sums[1]);
    }
    if (rc == 0 && rank == 0) print_comparison(sums, 2, a.profile);

done:
    if (metrics) fclose(metrics);
    free(saved.data_path);
    fflush(stdout);
    return rc;
}
