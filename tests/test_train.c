/* test_train.c — `zeropp train` end to end, as a user runs it: mpirun with
 * several ranks, configs and data files written here, metrics read back.
 *
 * ZPP_CLI (the zeropp command) and ZPP_MPIEXEC (mpirun) come from ctest. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "device/device.h"
#include "model/gpt2.h"
#include "train/config.h"

#include "testlib.h"

#define MAX_STEPS 512

static void expect_clean_failure(int np, const char *args, const char *needle);
static int run_train_env(int np, const char *fault, const char *args, const char *out,
                         const char *err);
static const char *ckpt_rank_path(const char *dir, int r, char *out);


static void write_text(const char *path, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    zpp_test_write_file(path, buf, (size_t)n);
}

/* Runs `zeropp train ARGS` on np ranks with a hang guard; returns the exit
 * code and leaves stderr in `err_path`. */
static int run_train(int np, const char *args, const char *err_path) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np %d %s train --quiet %s "
             ">/dev/null 2>%s",
             mpi, np, cli, args, err_path);
    int rc = system(cmd);
    EXPECT(rc != -1, "system() failed");
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    EXPECT(code != 124, "timed out (hang?): %s", cmd);
    return code;
}

/* Reads "skipped" (true/false) of each line of a metrics file. */
static int read_skipped(const char *path, int *out, int cap) {
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "no metrics file %s", path);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        const char *p = strstr(line, "\"skipped\":");
        EXPECT(p != NULL, "no \"skipped\" in %s: %s", path, line);
        out[n++] = !strncmp(p + 10, "true", 4);
    }
    fclose(f);
    return n;
}

/* --profile's metrics (tools/train.c): on each of `steps` lines, rank 0's
 * compute stream time splits into compute and exposed communication (each
 * printed to 1e-3 ms), none negative, rank 0's exposure is at most the
 * most of any rank, and the stream's window lies inside the step's wall
 * time (step_ms, the slowest rank's). */
static void expect_profile_fields(const char *met, int steps) {
    double stream[MAX_STEPS], compute[MAX_STEPS], exposed[MAX_STEPS], most[MAX_STEPS],
        wall[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met, "stream_ms", stream, MAX_STEPS) == steps,
           "no stream_ms in %s", met);
    EXPECT(zpp_test_read_metric(met, "compute_ms", compute, MAX_STEPS) == steps);
    EXPECT(zpp_test_read_metric(met, "exposed_comm_ms", exposed, MAX_STEPS) == steps);
    EXPECT(zpp_test_read_metric(met, "exposed_comm_ms_max", most, MAX_STEPS) == steps);
    EXPECT(zpp_test_read_metric(met, "step_ms", wall, MAX_STEPS) == steps);
    for (int s = 0; s < steps; s++) {
        EXPECT(stream[s] > 0 && compute[s] >= 0 && exposed[s] >= 0,
               "step %d: stream %g, compute %g, exposed %g ms", s + 1, stream[s], compute[s],
               exposed[s]);
        EXPECT(fabs(compute[s] + exposed[s] - stream[s]) <= 2e-3,
               "step %d: compute %g + exposed %g ms != stream %g ms", s + 1, compute[s],
               exposed[s], stream[s]);
        EXPECT(exposed[s] <= most[s] + 1e-3 && stream[s] <= wall[s] + 1e-3,
               "step %d: exposed %g ms (most %g), stream %g ms in a step of %g ms", s + 1,
               exposed[s], most[s], stream[s], wall[s]);
    }
}

/* A small GPT: 2 layers; `width` channels in width/16 heads; T = width/2. */
static void model_json_w(char *buf, size_t cap, int width, int bf16, const char *extra) {
    snprintf(buf, cap,
             "{\"model\": {\"n_layer\": 2, \"n_head\": %d, \"n_embd\": %d, \"seq_len\": %d,"
             " \"vocab_size\": 256},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001,"
             " \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.01}},"
             " \"gradient_clipping\": 1.0, \"bf16\": {\"enabled\": %s},"
             " \"zeropp\": {\"eval_every\": 0, \"seed\": 7}%s%s}",
             width / 16, width, width / 2, bf16 ? "true" : "false", extra[0] ? ", " : "", extra);
}

static void model_json(char *buf, size_t cap, int bf16, const char *extra) {
    model_json_w(buf, cap, 32, bf16, extra);
}

/* Trains with (world, micro, accum) for `steps` and returns the losses. */
static int train_losses(int world, int micro, int accum, int bf16, int steps, double *loss) {
    char cfg[512], met[512], err[512], json[2048], extra[256], args[2048];
    snprintf(extra, sizeof extra,
             "\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d,"
             " \"gradient_accumulation_steps\": %d",
             world * micro * accum, micro, accum);
    model_json(json, sizeof json, bf16, extra);
    char name[64];
    snprintf(name, sizeof name, "cfg_w%d_m%d_a%d_b%d.json", world, micro, accum, bf16);
    write_text(zpp_test_tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "met_w%d_m%d_a%d_b%d.jsonl", world, micro, accum, bf16);
    zpp_test_tmp_path(name, met);
    snprintf(args, sizeof args, "--config %s --steps %d --metrics %s", cfg, steps, met);
    int rc = run_train(world, args, zpp_test_tmp_path("err.txt", err));
    EXPECT(rc == 0, "training on %d ranks failed (exit %d); stderr in %s", world, rc, err);
    int n = zpp_test_read_metric(met, "loss", loss, MAX_STEPS);
    EXPECT(n == steps, "%d losses for %d steps", n, steps);
    return n;
}

/* ZeRO-3 on 2 and 4 ranks equals 1-rank training with the same global batch
 * and seed. In fp32 only the order of the gradient sums differs (the gathers
 * are exact copies), so the losses agree to a few fp32 ulps amplified by 20
 * AdamW steps: 1e-5 relative. The global batch (8 sequences) is the same
 * however it is split over ranks and accumulation. */
static void test_zero3_matches_single_rank_fp32(void) {
    const int steps = 20;
    double ref[MAX_STEPS], got[MAX_STEPS];
    train_losses(1, 8, 1, 0, steps, ref);
    const int cases[][3] = {{2, 4, 1}, {4, 2, 1}, {2, 2, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        train_losses(cases[c][0], cases[c][1], cases[c][2], 0, steps, got);
        for (int s = 0; s < steps; s++)
            EXPECT(fabs(got[s] - ref[s]) <= 1e-5 * fabs(ref[s]),
                   "world %d micro %d accum %d step %d: loss %.9g vs 1 rank %.9g", cases[c][0],
                   cases[c][1], cases[c][2], s + 1, got[s], ref[s]);
    }
    /* The first step's loss is computed before any update: it sees exactly
     * the same samples and weights, so it agrees much more tightly. */
    EXPECT(fabs(got[0] - ref[0]) <= 1e-6 * fabs(ref[0]));
}

/* Same seed and config give the same losses, bit for bit, on the CPU: in
 * every mode, including the quantized paths (round-to-nearest, and a
 * deterministic counter-based stream where rounding is stochastic). */
static void test_same_seed_same_losses_bitwise(void) {
    const char *zero[] = {"\"zero_optimization\": {\"stage\": 3}",
                          "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true,"
                          " \"zero_hpz_partition_size\": 2, \"zero_quantized_gradients\": true}"};
    for (int z = 0; z < 2; z++) {
        char raw[2][MAX_STEPS * 24];
        for (int run = 0; run < 2; run++) {
            char cfg[512], met[512], err[512], json[2048], extra[512], args[2048];
            snprintf(extra, sizeof extra, "\"train_micro_batch_size_per_gpu\": 2, %s", zero[z]);
            model_json(json, sizeof json, 1, extra);
            write_text(zpp_test_tmp_path("det.json", cfg), "%s", json);
            snprintf(args, sizeof args, "--config %s --steps 8 --node-size 2 --metrics %s", cfg,
                     zpp_test_tmp_path("det.jsonl", met));
            EXPECT(run_train(4, args, zpp_test_tmp_path("err.txt", err)) == 0);
            /* the metrics print fp32 losses with 9 significant digits, which
             * round-trip: equal text means equal bits */
            double l[MAX_STEPS];
            int n = zpp_test_read_metric(met, "loss", l, MAX_STEPS);
            EXPECT(n == 8);
            raw[run][0] = '\0';
            for (int i = 0; i < n; i++) {
                char b[24];
                snprintf(b, sizeof b, "%a,", l[i]);
                strcat(raw[run], b);
            }
        }
        EXPECT(strcmp(raw[0], raw[1]) == 0, "mode %d: %s vs %s", z, raw[0], raw[1]);
    }
}

/* zero_optimization.zeropp_grad_e2m1 reaches qgZ: the same ZeRO++ run with
 * E2M1 gradients (the default) and with int4 takes the same first loss
 * (no update yet) and then other ones (the rounding of every reduced
 * gradient differs). */
static void test_grad_format_key_reaches_qgz(void) {
    double l[2][MAX_STEPS];
    for (int run = 0; run < 2; run++) {
        char cfg[512], met[512], err[512], json[2048], extra[512], args[2048];
        snprintf(extra, sizeof extra,
                 "\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,"
                 " \"zero_quantized_gradients\": true%s}",
                 run ? ", \"zeropp_grad_e2m1\": false" : "");
        model_json(json, sizeof json, 1, extra);
        write_text(zpp_test_tmp_path("fmt.json", cfg), "%s", json);
        snprintf(args, sizeof args, "--config %s --steps 4 --node-size 2 --metrics %s", cfg,
                 zpp_test_tmp_path("fmt.jsonl", met));
        EXPECT(run_train(4, args, zpp_test_tmp_path("err.txt", err)) == 0);
        EXPECT(zpp_test_read_metric(met, "loss", l[run], MAX_STEPS) == 4);
    }
    EXPECT(l[0][0] == l[1][0], "step 1: E2M1 %.9g, int4 %.9g", l[0][0], l[1][0]);
    EXPECT(l[0][3] != l[1][3], "step 4: E2M1 and int4 both %.9g: the key did not reach qgZ",
           l[0][3]);
}

/* A run saved after 5 steps and resumed continues exactly as the run that
 * never stopped: steps 6..10 have the same losses, bit for bit (ZeRO++ with
 * every option, stochastic rounding of qgZ's 4 bits included: its streams
 * follow the step, 4 ranks as 2 nodes). Another world size resumes; a damaged
 * checkpoint and a directory that is none are refused with one line. */
static void test_checkpoint_resume_bitwise(void) {
    char cfg[512], met[512], err[512], json[2048], args[2048], dir[512], f[700];
    model_json(json, sizeof json, 1,
               "\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,"
               " \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 2,"
               " \"zero_quantized_gradients\": true,"
               " \"zeropp_grad_stochastic_rounding\": true}");
    write_text(zpp_test_tmp_path("ckpt.json", cfg), "%s", json);
    zpp_test_tmp_path("ckpt_dir", dir);
    double full[MAX_STEPS], resumed[MAX_STEPS];
    snprintf(args, sizeof args, "--config %s --steps 10 --metrics %s", cfg,
             zpp_test_tmp_path("full.jsonl", met));
    EXPECT(run_train(4, args, zpp_test_tmp_path("err.txt", err)) == 0);
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == 10);
    snprintf(args, sizeof args, "--config %s --steps 5 --save %s", cfg, dir);
    EXPECT(run_train(4, args, err) == 0, "save failed, see %s", err);
    snprintf(args, sizeof args, "--config %s --steps 10 --resume %s --metrics %s", cfg, dir,
             zpp_test_tmp_path("resumed.jsonl", met));
    EXPECT(run_train(4, args, err) == 0, "resume failed, see %s", err);
    EXPECT(zpp_test_read_metric(met, "loss", resumed, MAX_STEPS) == 5);
    for (int i = 0; i < 5; i++)
        EXPECT(resumed[i] == full[5 + i], "step %d: resumed %a, uninterrupted %a", 6 + i,
               resumed[i], full[5 + i]);

    /* another world size resumes (the checkpoint does not depend on it) */
    snprintf(args, sizeof args, "--config %s --steps 10 --resume %s", cfg, dir);
    EXPECT(run_train(2, args, err) == 0, "resume on 2 ranks failed, see %s", err);
    /* a damaged rank file: cut its last byte */
    ckpt_rank_path(dir, 2, f);
    FILE *fp = fopen(f, "rb");
    EXPECT(fp != NULL);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fclose(fp);
    EXPECT(truncate(f, len - 1) == 0);
    expect_clean_failure(4, args, "ckpt");
    /* not a checkpoint */
    snprintf(args, sizeof args, "--config %s --resume %s", cfg,
             zpp_test_tmp_path("no_such_dir", f));
    expect_clean_failure(4, args, "not a checkpoint");
}

/* qgZ error feedback (zeropp_loco_param) end to end, 4 ranks as 2 nodes:
 *  - reset_T 1 clears the buffers after every step, and with one reduction
 *    a unit a step the feedback then always adds zero: the losses equal
 *    those without feedback, bit for bit; reset_T 1000 changes them (the
 *    feedback does act);
 *  - reset_T 3: steps 1-4 as with reset_T 1000 (the first reset lands after
 *    step 3; step 4's loss is computed before its reduction), step 5 not;
 *  - a run saved at step 5 (after a reset at step 3, with buffers from step
 *    4 and 5 in the checkpoint) and resumed continues bit for bit, through
 *    the next reset at step 6; on 2 ranks it resumes with the buffers
 *    cleared, and says so. */
static void loco_losses(const char *tag, const char *loco, const char *more, double *loss,
                        int steps) {
    char cfg[512], met[512], err[512], json[2048], extra[512], args[2048], name[64];
    snprintf(extra, sizeof extra,
             "\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,"
             " \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 2,"
             " \"zero_quantized_gradients\": true%s%s}",
             loco[0] ? ", " : "", loco);
    model_json(json, sizeof json, 1, extra);
    snprintf(name, sizeof name, "loco_%s.json", tag);
    write_text(zpp_test_tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "loco_%s.jsonl", tag);
    snprintf(args, sizeof args, "--config %s --steps %d --metrics %s %s", cfg, steps,
             zpp_test_tmp_path(name, met), more);
    EXPECT(run_train(4, args, zpp_test_tmp_path("err.txt", err)) == 0, "%s failed, see %s", tag,
           err);
    EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) ==
           steps - (strstr(more, "--resume") ? 5 : 0));
}

static void test_loco_reset_and_resume_bitwise(void) {
    const int steps = 10;
    double off[MAX_STEPS], t1[MAX_STEPS], t3[MAX_STEPS], big[MAX_STEPS], resumed[MAX_STEPS];
    loco_losses("off", "", "", off, steps);
    loco_losses("t1", "\"zeropp_loco_param\": {\"err_beta\": 0.8, \"reset_T\": 1}", "", t1, steps);
    loco_losses("big", "\"zeropp_loco_param\": {\"err_beta\": 0.8, \"reset_T\": 1000}", "", big,
                steps);
    const char *l3 = "\"zeropp_loco_param\": {\"err_beta\": 0.8, \"reset_T\": 3}";
    loco_losses("t3", l3, "", t3, steps);
    int differ = 0;
    for (int i = 0; i < steps; i++) {
        EXPECT(t1[i] == off[i], "step %d: reset_T 1 %a, no feedback %a", i + 1, t1[i], off[i]);
        differ += big[i] != off[i];
    }
    EXPECT(differ > 0, "error feedback with reset_T 1000 changed no loss");
    for (int i = 0; i < 4; i++)
        EXPECT(t3[i] == big[i], "step %d: reset_T 3 %a, reset_T 1000 %a", i + 1, t3[i], big[i]);
    EXPECT(t3[4] != big[4], "step 5: the reset after step 3 changed nothing");
    char dir[512], more[1024], err[512], args[2048], cfg[512];
    zpp_test_tmp_path("loco_ckpt", dir);
    snprintf(more, sizeof more, "--save %s", dir);
    double first[MAX_STEPS];
    loco_losses("save", l3, more, first, 5);
    snprintf(more, sizeof more, "--resume %s", dir);
    loco_losses("resume", l3, more, resumed, steps);
    for (int i = 0; i < 5; i++)
        EXPECT(resumed[i] == t3[5 + i], "step %d: resumed %a, uninterrupted %a", 6 + i,
               resumed[i], t3[5 + i]);
    /* another world size: the error buffers start from zero, said in the note */
    snprintf(args, sizeof args, "--config %s --steps 10 --resume %s",
             zpp_test_tmp_path("loco_t3.json", cfg), dir);
    char out[512];
    zpp_test_tmp_path("loco_out.txt", out);
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np 2 %s train %s > %s 2> %s", mpi,
             cli, args, out, zpp_test_tmp_path("err.txt", err));
    EXPECT(system(cmd) == 0, "resume on 2 ranks failed, see %s", err);
    FILE *f = fopen(out, "r");
    EXPECT(f != NULL);
    char text[1 << 14];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    EXPECT(strstr(text, "error feedback buffers start from zero"),
           "the resume note does not say the buffers were reset: see %s", out);
}

/* With bf16 on, the gathered weights are bf16 and the gradients cross the
 * wire in bf16: a reduce-scatter over W ranks rounds each partial sum to bf16
 * (relative error up to 2^-9 per rounding, ~log2(W) roundings), where one
 * rank rounds the gradient once. AdamW divides by sqrt(v), so relative
 * gradient errors of ~2^-8 move each update by about that fraction of lr;
 * over 20 steps the weights drift by <= 20 * 1e-3 * 2^-8 ~ 1e-4 and the loss
 * (itself computed from bf16-rounded weights, which a drift can flip by one
 * bf16 ulp, 2^-8 relative) moves by well under 1%. We allow 1% relative,
 * and demand the first step (identical weights, identical samples) within
 * the fp32-vs-bf16-grouping noise of the loss, 1e-5. */
static void test_zero3_matches_single_rank_bf16(void) {
    const int steps = 20;
    double ref[MAX_STEPS], got[MAX_STEPS];
    train_losses(1, 8, 1, 1, steps, ref);
    train_losses(4, 2, 1, 1, steps, got);
    EXPECT(fabs(got[0] - ref[0]) <= 1e-5 * fabs(ref[0]), "step 1: %.9g vs %.9g", got[0],
           ref[0]);
    for (int s = 0; s < steps; s++)
        EXPECT(fabs(got[s] - ref[s]) <= 1e-2 * fabs(ref[s]), "step %d: loss %.9g vs %.9g",
               s + 1, got[s], ref[s]);
    EXPECT(got[steps - 1] < got[0], "the loss did not fall: %g -> %g", got[0], got[steps - 1]);
}

/* Each ZeRO++ option alone and all three together, 4 ranks as 2 nodes of 2,
 * on Tiny Shakespeare: the validation loss after a fixed budget is within 2%
 * of ZeRO-3's (the paper's claim: no loss of convergence). The budget takes
 * the model well past unigram statistics (val loss ~2.5 nats against 5.5 at
 * the start), so the quantized paths must carry real learning signal. */
static void test_zeropp_options_match_zero3_validation_loss(void) {
    char data[512];
    zpp_test_data("tinyshakespeare.txt", data, sizeof data);
    const char *modes[][2] = {
        {"zero3", "\"zero_optimization\": {\"stage\": 3}"},
        {"qwz", "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true}"},
        {"hpz", "\"zero_optimization\": {\"stage\": 3, \"zero_hpz_partition_size\": 2}"},
        {"qgz", "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_gradients\": true}"},
        {"zeropp",
         "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true,"
         " \"zero_hpz_partition_size\": 2, \"zero_quantized_gradients\": true}"},
    };
    const int steps = 250;
    double val0 = 0.0;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        char cfg[512], met[512], err[512], json[2048], extra[512], args[2048], name[64];
        snprintf(extra, sizeof extra,
                 "\"train_micro_batch_size_per_gpu\": 4, %s,"
                 " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {"
                 "\"warmup_num_steps\": 20, \"warmup_type\": \"linear\"}}",
                 modes[m][1]);
        model_json_w(json, sizeof json, 64, 1, extra);
        /* a higher learning rate, so the budget shows real learning */
        char *lr = strstr(json, "0.001");
        memcpy(lr, "0.002", 5);
        snprintf(name, sizeof name, "cfg_%s.json", modes[m][0]);
        write_text(zpp_test_tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "met_%s.jsonl", modes[m][0]);
        zpp_test_tmp_path(name, met);
        snprintf(args, sizeof args,
                 "--config %s --data %s --steps %d --eval-every %d --node-size 2 --metrics %s",
                 cfg, data, steps, steps, met);
        int rc = run_train(4, args, zpp_test_tmp_path("err.txt", err));
        EXPECT(rc == 0, "%s: exit %d", modes[m][0], rc);
        double val[MAX_STEPS], loss[MAX_STEPS];
        EXPECT(zpp_test_read_metric(met, "val_loss", val, MAX_STEPS) == 1);
        EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == steps);
        printf("  %-6s train loss %.4f -> %.4f, val loss %.4f\n", modes[m][0], loss[0],
               loss[steps - 1], val[0]);
        EXPECT(val[0] < 0.55 * loss[0], "%s did not learn: val loss %.4f", modes[m][0], val[0]);
        if (m == 0) val0 = val[0];
        else
            EXPECT(fabs(val[0] - val0) <= 0.02 * val0, "%s: val loss %.4f vs ZeRO-3 %.4f",
                   modes[m][0], val[0], val0);
    }
}

static void expect_clean_failure(int np, const char *args, const char *needle) {
    char err[512];
    zpp_test_tmp_path("bad_err.txt", err);
    int rc = run_train(np, args, err);
    EXPECT(rc != 0, "'%s' succeeded; expected an error mentioning '%s'", args, needle);
    int lines = zpp_test_count_lines(err, "zeropp");
    int named = zpp_test_count_lines(err, needle);
    EXPECT(lines == 1 && named == 1,
           "'%s': expected one error line naming '%s', got %d zeropp lines (%d naming it); "
           "see %s",
           args, needle, lines, named, err);
}

/* Bad input ends with one line naming the problem and a non-zero exit on
 * every rank, with no hang (run_train's timeout catches hangs). */
static void test_bad_inputs_fail_cleanly(void) {
    char p[512], cfg[512], args[2048];
    /* missing data file */
    snprintf(args, sizeof args, "--data %s --steps 2", zpp_test_tmp_path("does_not_exist.bin", p));
    expect_clean_failure(2, args, "does_not_exist.bin");

    /* truncated llm.c file: header says 10000 tokens, 100 are there */
    int32_t header[256] = {20240520, 1, 10000};
    uint16_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = (uint16_t)(i % 50);
    unsigned char buf[sizeof header + sizeof toks];
    memcpy(buf, header, sizeof header);
    memcpy(buf + sizeof header, toks, sizeof toks);
    zpp_test_write_file(zpp_test_tmp_path("truncated.bin", p), buf, sizeof buf);
    snprintf(args, sizeof args, "--data %s --steps 2", p);
    expect_clean_failure(2, args, "truncated");

    /* wrong magic in a token file */
    header[0] = 12345;
    memcpy(buf, header, sizeof header);
    zpp_test_write_file(zpp_test_tmp_path("wrong_magic.bin", p), buf, sizeof buf);
    snprintf(args, sizeof args, "--data %s --steps 2", p);
    expect_clean_failure(2, args, "magic");

    /* malformed config */
    write_text(zpp_test_tmp_path("malformed.json", cfg), "{\"model\": {\"n_layer\": 2,,}}");
    snprintf(args, sizeof args, "--config %s --steps 2", cfg);
    expect_clean_failure(2, args, "malformed.json");

    /* unknown key */
    write_text(zpp_test_tmp_path("unknown.json", cfg), "{\"zero_optimization\": {\"stge\": 3}}");
    snprintf(args, sizeof args, "--config %s --steps 2", cfg);
    expect_clean_failure(2, args, "stge");

    /* a batch that does not divide: 10 sequences over 4 ranks x micro 2 */
    write_text(zpp_test_tmp_path("batch.json", cfg),
               "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 2}");
    snprintf(args, sizeof args, "--config %s --steps 2", cfg);
    expect_clean_failure(4, args, "train_batch_size");

    /* a node size that does not divide the world */
    expect_clean_failure(4, "--node-size 3 --steps 2", "node size 3");

    /* activations that cannot be allocated: T = 2^22 keeps T^2 attention
     * probabilities a head (2^44 x 4 bytes x 4 heads, 256 TiB, beyond
     * x86-64's address space, so it fails whatever the overcommit policy);
     * the one line says what the user can change. The data holds the two
     * sequences of T + 1 tokens the trainer asks first. */
    const int32_t n_big = (1 << 23) + 4;
    int32_t big_header[256] = {20240520, 1, n_big};
    unsigned char *big = zpp_test_malloc(sizeof big_header + (size_t)n_big * sizeof(uint16_t));
    memcpy(big, big_header, sizeof big_header);
    memset(big + sizeof big_header, 0, (size_t)n_big * sizeof(uint16_t)); /* token 0 */
    zpp_test_write_file(zpp_test_tmp_path("long.bin", p), big,
                        sizeof big_header + (size_t)n_big * sizeof(uint16_t));
    free(big);
    write_text(zpp_test_tmp_path("long.json", cfg),
               "{\"train_micro_batch_size_per_gpu\": 1, \"model\": {\"n_layer\": 1, "
               "\"n_head\": 4, \"n_embd\": 16, \"seq_len\": 4194304, \"vocab_size\": 64}}");
    snprintf(args, sizeof args, "--config %s --data %s --steps 1", cfg, p);
    expect_clean_failure(1, args, "train_micro_batch_size_per_gpu, 1, times model.seq_len");
    /* kept activations: the message also names them */
    write_text(zpp_test_tmp_path("long.json", cfg),
               "{\"train_micro_batch_size_per_gpu\": 1, \"model\": {\"n_layer\": 1, "
               "\"n_head\": 4, \"n_embd\": 16, \"seq_len\": 4194304, \"vocab_size\": 64}, "
               "\"zeropp\": {\"keep_activations\": true}}");
    expect_clean_failure(1, args, "set zeropp.keep_activations false");

    /* not bad input: a cosine schedule takes the run's length from --steps,
     * so a config whose train_steps (5) is shorter than the warm-up (10)
     * still runs 12 steps */
    write_text(zpp_test_tmp_path("sched.json", cfg),
               "{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
               "{\"warmup_num_steps\": 10}}, \"zeropp\": {\"train_steps\": 5}}");
    snprintf(args, sizeof args, "--config %s --steps 12", cfg);
    EXPECT(run_train(2, args, zpp_test_tmp_path("sched_err.txt", p)) == 0, "'%s' failed; see %s",
           args, p);
}

/* The demo prints the side-by-side summary and ZeRO++ sends about a quarter
 * of ZeRO-3's cross-node bytes. */
static void test_demo_summary(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char out[512], cmd[2048];
    zpp_test_tmp_path("demo.txt", out);
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np 4 %s train --demo --quiet "
             "--steps 6 --eval-every 3 > %s 2>&1",
             mpi, cli, out);
    int rc = system(cmd);
    EXPECT(rc == 0, "demo failed; output in %s", out);
    EXPECT(zpp_test_count_lines(out, "final val loss") == 1, "no summary table in %s", out);
    FILE *f = fopen(out, "r");
    char line[1024];
    double ratio = -1;
    while (fgets(line, sizeof line, f)) {
        const char *q = strstr(line, "ZeRO++ sends ");
        if (q) ratio = strtod(q + strlen("ZeRO++ sends "), NULL);
    }
    fclose(f);
    /* 0.25 of the bf16 bytes, plus the scales: one fp32 per int8 block of
     * the weights (+1.6% at block 256) and per int4 block of the gradients
     * (+6% at block 128), plus padding of this tiny model's units, plus the
     * vectors' two all-reduces a step (engine.h: 13 C a block of 12 C^2 +
     * 13 C, about +0.017 at the demo's width 128; 0.283 in all). */
    EXPECT(ratio > 0.24 && ratio <= 0.29, "cross-node ratio %g, expected about 0.25", ratio);
}

/* ---- The math, end to end: parameters, gradient norms, checkpoints -------- */

/* Replaces the first `from` in json (which must be there) with `to`. */
static void subst(char *json, size_t cap, const char *from, const char *to) {
    char *p = strstr(json, from);
    EXPECT(p != NULL, "'%s' not in %s", from, json);
    size_t lf = strlen(from), lt = strlen(to), rest = strlen(p + lf);
    EXPECT(strlen(json) - lf + lt < cap);
    memmove(p + lt, p + lf, rest + 1);
    memcpy(p, to, lt);
}

/* "--seed S": the run's fresh seed (testlib: printed, replayable), for the
 * model's initialisation and data order. */
static const char *seed_arg(void) {
    static char buf[64];
    snprintf(buf, sizeof buf, "--seed %llu",
             (unsigned long long)(zpp_test_seed(11) % 1000000007ull));
    return buf;
}

/* The launcher, with its result checked. */
static void train_ok(int np, const char *args) {
    char err[512];
    int rc = run_train(np, args, zpp_test_tmp_path("err.txt", err));
    EXPECT(rc == 0, "'%s' on %d ranks: exit %d; stderr in %s", args, np, rc, err);
}

static void read_all(const char *path, unsigned char **buf_p, size_t *n_p) {
    FILE *f = fopen(path, "rb");
    EXPECT(f != NULL, "cannot open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    EXPECT(b && fread(b, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    fclose(f);
    *buf_p = b;
    *n_p = (size_t)n;
}

/* One rank file of a checkpoint, as train/checkpoint.h documents it:
 *   "ZPPCKPT4", u32 world_size, u32 rank, u32 n_units, u32 0, u64 step,
 *   u64 run_id (not in format 2's "ZPPCKPT2"), per unit: u64 numel,
 *   u64 begin, u64 count, f32 master[count], f32 m[..], f32 v[..], then u64
 *   checksum of every byte before (zpp_test_checksum_ref; FNV-1a in
 *   formats 2 and 3). */
#define MAX_UNITS 16
typedef struct ckpt {
    uint32_t world, rank, n_units;
    uint64_t step, run_id;
    size_t numel[MAX_UNITS], begin[MAX_UNITS];
    size_t len[MAX_UNITS];      /* count: the elements this file holds */
    float *state[MAX_UNITS][3]; /* master, m, v */
} ckpt;

/* The folder holding the published checkpoint of DIR (DIR/checkpoint.json's
 * "folder"), or DIR itself when it is a step folder; "" if neither. */
static const char *ckpt_folder(const char *dir, char *out) {
    char path[600], buf[4096] = {0};
    out[0] = '\0';
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        if (access(path, F_OK) == 0) snprintf(out, 600, "%s", dir);
        return out;
    }
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strstr(buf, "\"folder\":\"");
    if (p) {
        p += 10;
        const char *q = strchr(p, '"');
        if (q) snprintf(out, 600, "%s/%.*s", dir, (int)(q - p), p);
    }
    return out;
}

/* The path of rank r's file in the published checkpoint of DIR. */
static const char *ckpt_rank_path(const char *dir, int r, char *out) {
    char folder[600];
    snprintf(out, 700, "%s/rank-%05d.ckpt", ckpt_folder(dir, folder), r);
    return out;
}

/* Parses and validates a rank file; 0 and a reason in `why` if it is not a
 * whole, intact checkpoint file. */
static int ckpt_read(const char *path, ckpt *c, char *why, size_t cap) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(why, cap, "cannot open %s", path), 0;
    fclose(f);
    unsigned char *b;
    size_t n, off = 40;
    read_all(path, &b, &n);
    uint32_t zero = 1;
    if (n < 48 || memcmp(b, "ZPPCKPT4", 8) != 0) {
        snprintf(why, cap, "%s: no magic", path);
        goto bad;
    }
    memcpy(&c->world, b + 8, 4), memcpy(&c->rank, b + 12, 4), memcpy(&c->n_units, b + 16, 4);
    memcpy(&zero, b + 20, 4), memcpy(&c->step, b + 24, 8), memcpy(&c->run_id, b + 32, 8);
    if (zero != 0 || c->n_units == 0 || c->n_units > MAX_UNITS) {
        snprintf(why, cap, "%s: bad header", path);
        goto bad;
    }
    for (uint32_t u = 0; u < c->n_units; u++) {
        uint64_t r[3];
        if (off + 24 > n) goto short_;
        memcpy(r, b + off, 24);
        off += 24;
        if (r[2] > n || off + 12 * r[2] > n || r[1] + r[2] > r[0]) goto short_;
        c->numel[u] = (size_t)r[0], c->begin[u] = (size_t)r[1], c->len[u] = (size_t)r[2];
        for (int k = 0; k < 3; k++) {
            c->state[u][k] = malloc((r[2] ? r[2] : 1) * sizeof(float));
            memcpy(c->state[u][k], b + off, r[2] * sizeof(float));
            off += r[2] * sizeof(float);
        }
    }
    if (off + 8 != n) goto short_;
    uint64_t h = zpp_test_checksum_ref(b, off), sum;
    memcpy(&sum, b + off, 8);
    if (h != sum) {
        snprintf(why, cap, "%s: checksum %016llx, stored %016llx", path, (unsigned long long)h,
                 (unsigned long long)sum);
        goto bad;
    }
    free(b);
    return 1;
short_:
    snprintf(why, cap, "%s: %zu bytes do not hold the units the header announces", path, n);
bad:
    free(b);
    return 0;
}

static void ckpt_free(ckpt *c) {
    for (int u = 0; u < MAX_UNITS; u++)
        for (int k = 0; k < 3; k++) free(c->state[u][k]);
    memset(c, 0, sizeof *c);
}

/* A checkpoint directory's state, whole: unit u's ranges from the rank
 * files end to end. Rank r of W holds [r*L, min((r+1)*L, numel)) of the
 * unpadded unit, L = ceil(numel / W); the ranges must tile the unit exactly
 * (the padding is not saved: the loader restores it as zeros). */
typedef struct model_state {
    int n_units;
    uint64_t step;
    size_t len[MAX_UNITS];        /* numel */
    float *x[MAX_UNITS][3];       /* master, m, v */
} model_state;

static void state_load(const char *dir, int world, model_state *s) {
    memset(s, 0, sizeof *s);
    size_t covered[MAX_UNITS] = {0};
    for (int r = 0; r < world; r++) {
        char path[700], why[800];
        ckpt c;
        ckpt_rank_path(dir, r, path);
        EXPECT(ckpt_read(path, &c, why, sizeof why), "%s", why);
        EXPECT(c.world == (uint32_t)world && c.rank == (uint32_t)r,
               "%s: world %u rank %u, expected %d %d", path, c.world, c.rank, world, r);
        if (r == 0) {
            s->n_units = (int)c.n_units;
            s->step = c.step;
            for (int u = 0; u < s->n_units; u++) {
                s->len[u] = c.numel[u];
                for (int k = 0; k < 3; k++) s->x[u][k] = malloc((s->len[u] + 1) * sizeof(float));
            }
        }
        EXPECT((int)c.n_units == s->n_units && c.step == s->step, "%s: rank files disagree",
               dir);
        for (int u = 0; u < s->n_units; u++) {
            size_t L = (s->len[u] + (size_t)world - 1) / (size_t)world;
            size_t b = (size_t)r * L < s->len[u] ? (size_t)r * L : s->len[u];
            EXPECT(c.numel[u] == s->len[u] && c.begin[u] == b && b == covered[u] &&
                       c.len[u] == (s->len[u] - b < L ? s->len[u] - b : L),
                   "%s unit %d: rank %d holds [%zu, +%zu) of %zu", dir, u, r, c.begin[u],
                   c.len[u], c.numel[u]);
            covered[u] += c.len[u];
            for (int k = 0; k < 3; k++)
                memcpy(s->x[u][k] + c.begin[u], c.state[u][k], c.len[u] * sizeof(float));
        }
        ckpt_free(&c);
    }
    for (int u = 0; u < s->n_units; u++)
        EXPECT(covered[u] == s->len[u], "%s unit %d: %zu of %zu elements saved", dir, u,
               covered[u], s->len[u]);
}

static void state_free(model_state *s) {
    for (int u = 0; u < MAX_UNITS; u++)
        for (int k = 0; k < 3; k++) free(s->x[u][k]);
}

/* A tiny fp32 model (34176 parameters, in 3 units) whose parameters are
 * sensitive to the size of the gradient: no clipping, and eps = 1e-3, about
 * the size of a typical gradient entry, so Adam's step g/(|g| + eps) is
 * neither sign-like nor scale invariant. Weight decay 0.1, so the parameters
 * see it. */
static void math_json(char *json, size_t cap, const char *batch) {
    model_json(json, cap, 0, batch);
    subst(json, cap, "\"eps\": 1e-8", "\"eps\": 1e-3");
    subst(json, cap, "\"weight_decay\": 0.01", "\"weight_decay\": 0.1");
    subst(json, cap, "\"gradient_clipping\": 1.0", "\"gradient_clipping\": 0");
}

/* Trains `steps` fp32 steps on `world` ranks (micro-batch `micro`), saving
 * to a directory; returns the losses and gradient norms, and the state. */
static void math_run(int world, int micro, int accum, int steps, double *loss, double *norm,
                     model_state *st) {
    char cfg[512], met[512], dir[512], json[2048], batch[256], args[2048], name[64];
    snprintf(batch, sizeof batch,
             "\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %d,"
             " \"gradient_accumulation_steps\": %d",
             world * micro * accum, micro, accum);
    math_json(json, sizeof json, batch);
    snprintf(name, sizeof name, "math_w%d_m%d_a%d.json", world, micro, accum);
    write_text(zpp_test_tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "math_w%d_m%d_a%d.jsonl", world, micro, accum);
    zpp_test_tmp_path(name, met);
    snprintf(name, sizeof name, "math_w%d_m%d_a%d", world, micro, accum);
    zpp_test_tmp_path(name, dir);
    snprintf(args, sizeof args, "--config %s --steps %d --metrics %s --save %s %s", cfg, steps,
             met, dir, seed_arg());
    train_ok(world, args);
    EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == steps);
    EXPECT(zpp_test_read_metric(met, "grad_norm", norm, MAX_STEPS) == steps);
    state_load(dir, world, st);
    EXPECT(st->step == (uint64_t)steps, "%s: step %llu", dir, (unsigned long long)st->step);
}

/* ZeRO-3 on W ranks computes what one rank computes — the gradient norm of
 * every step and the parameters (and both Adam moments) after the steps,
 * not only the loss. Reassembled from the rank files of a checkpoint, the
 * ranks' ranges tile each unpadded unit exactly (state_load checks it) and
 * give the 1-rank unit. (The padding, whose gradient is zero and which AdamW
 * keeps at zero, is not saved.)
 *
 * Tolerances. In fp32 the runs differ only in the order of the gradient sums
 * (the gathers copy exactly): each gradient entry moves by a few ulps of the
 * largest terms summed, ~1e-7 of the largest entry (|g| < 1 here).
 * - grad_norm: the metrics print 6 significant digits (5e-7 relative), the
 *   norm of step 1 comes from identical weights; later steps' weights differ
 *   by the few ulps below. 2e-5 relative. A sum instead of an average is
 *   off by a factor W.
 * - m and v: sums of (1-b) g and (1-b) g^2, so off by the same ~1e-7 of
 *   their largest value: 1e-5 of it (measured: 2e-7).
 * - parameters: Adam with eps = 1e-3 is Lipschitz in g, |du| <= 2|dg| / eps.
 *   On 3 ranks the average also carries the rounding of 1/3 (one ulp, 6e-8
 *   of every entry), so take |dg| <= 2e-7: |du| <= 4e-4, and a step moves a
 *   parameter by at most lr * 4e-4 = 4e-7 more or less than on 1 rank: 2e-6
 *   over 5 steps (measured: 1.5e-8 on 2 and 4 ranks, 1.2e-7 on 3). A lost,
 *   doubled or mis-scaled update moves a parameter by a good fraction of
 *   lr = 1e-3; summing instead of averaging (g x W) changes g/(|g|+eps) by
 *   up to eps/(2|g|) per step, 5% of lr where |g| = 0.01.
 * Also the losses, within 1e-5 relative as in the fp32 loss test. */
static void test_zero3_matches_single_rank_params(void) {
    const int steps = 5;
    /* {world, micro, accum}; 1 rank with the same global batch is the
     * reference. 3 ranks pad every unit (34176 is not a multiple of 3). */
    const int cases[][3] = {{2, 4, 1}, {4, 2, 1}, {2, 2, 2}, {3, 2, 1}};
    double ref_loss[2][MAX_STEPS], ref_norm[2][MAX_STEPS], loss[MAX_STEPS], norm[MAX_STEPS];
    model_state ref[2];
    math_run(1, 8, 1, steps, ref_loss[0], ref_norm[0], &ref[0]);
    math_run(1, 6, 1, steps, ref_loss[1], ref_norm[1], &ref[1]);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int W = cases[c][0], r = W * cases[c][1] * cases[c][2] == 8 ? 0 : 1;
        model_state got;
        math_run(W, cases[c][1], cases[c][2], steps, loss, norm, &got);
        for (int s = 0; s < steps; s++) {
            EXPECT(fabs(norm[s] - ref_norm[r][s]) <= 2e-5 * ref_norm[r][s],
                   "world %d micro %d accum %d step %d: grad norm %.6g vs 1 rank %.6g", W,
                   cases[c][1], cases[c][2], s + 1, norm[s], ref_norm[r][s]);
            EXPECT(fabs(loss[s] - ref_loss[r][s]) <= 1e-5 * ref_loss[r][s],
                   "world %d step %d: loss %.9g vs 1 rank %.9g", W, s + 1, loss[s],
                   ref_loss[r][s]);
        }
        EXPECT(got.n_units == ref[r].n_units);
        double worst[3] = {0, 0, 0}, scale[3] = {0, 0, 0};
        for (int u = 0; u < got.n_units; u++)
            for (int k = 0; k < 3; k++)
                for (size_t i = 0; i < ref[r].len[u]; i++)
                    scale[k] = fmax(scale[k], fabs(ref[r].x[u][k][i]));
        const double tol[3] = {2e-6, 1e-5 * scale[1], 1e-5 * scale[2]};
        for (int u = 0; u < got.n_units; u++) {
            size_t numel = ref[r].len[u]; /* 1 rank: no padding */
            EXPECT(got.len[u] == numel, "unit %d: %zu saved for %zu elements on %d ranks", u,
                   got.len[u], numel, W);
            for (int k = 0; k < 3; k++) {
                for (size_t i = 0; i < numel; i++) {
                    double d = fabs((double)got.x[u][k][i] - ref[r].x[u][k][i]);
                    if (d > worst[k]) worst[k] = d;
                    EXPECT(d <= tol[k],
                           "world %d unit %d element %zu: %s %.9g vs 1 rank %.9g", W, u, i,
                           k == 0 ? "parameter" : k == 1 ? "m" : "v", got.x[u][k][i],
                           ref[r].x[u][k][i]);
                }
            }
        }
        printf("  world %d micro %d accum %d: grad norm step %d %.6g (1 rank %.6g); max |diff| "
               "params %.2g, m %.2g, v %.2g\n",
               W, cases[c][1], cases[c][2], steps, norm[steps - 1], ref_norm[r][steps - 1],
               worst[0], worst[1], worst[2]);
        state_free(&got);
    }
    state_free(&ref[0]);
    state_free(&ref[1]);
}

/* qgZ averages too: step 1's gradient norm (identical weights on every
 * rank) on 4 ranks as 2 nodes of 2 (the intra-node all-to-all and the
 * inter-node exchange, each quantizing to int4) and on 2 ranks as 2 nodes
 * (the exchange alone) is within 20% of 1 rank's. The quantization error e
 * is nearly uncorrelated with g, so ||g + e||^2 = ||g||^2 + ||e||^2: with
 * int4 blocks of 128 (relative L2 error 0.12 on N(0,1), DESIGN.md §8; up to
 * ~0.3 on gradients' heavier-tailed blocks) that is under 1% per rounding,
 * and 2% at most over 12 seeds measured. A sum instead of an average is
 * off by +100% or +300%. */
static void test_qgz_grad_norm_matches_single_rank(void) {
    const int shapes[][2] = {{1, 1}, {4, 2}, {2, 1}}; /* {world, node size} */
    double ref = 0;
    for (int c = 0; c < 3; c++) {
        int W = shapes[c][0];
        char cfg[512], met[512], json[2048], batch[256], args[2048], name[64];
        snprintf(batch, sizeof batch,
                 "\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": %d,"
                 " \"zero_optimization\": {\"stage\": 3, \"zero_quantized_gradients\": %s}",
                 8 / W, W > 1 ? "true" : "false");
        math_json(json, sizeof json, batch);
        snprintf(name, sizeof name, "qgz_w%d.json", W);
        write_text(zpp_test_tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "qgz_w%d.jsonl", W);
        snprintf(args, sizeof args, "--config %s --steps 1 --node-size %d --metrics %s %s", cfg,
                 shapes[c][1], zpp_test_tmp_path(name, met), seed_arg());
        train_ok(W, args);
        double norm;
        EXPECT(zpp_test_read_metric(met, "grad_norm", &norm, 1) == 1);
        if (c == 0) ref = norm;
        printf("  %d ranks, node size %d: step 1 grad norm %.6g (1 rank, no qgZ: %.6g)\n", W,
               shapes[c][1], norm, ref);
        EXPECT(fabs(norm - ref) <= 0.2 * ref, "qgZ on %d ranks: grad norm %.6g, 1 rank %.6g",
               W, norm, ref);
    }
}

/* AdamW's first step, end to end on the CPU. At step 1 the moments are
 * m = (1-b1) g and v = (1-b2) g^2, and with bias correction m^ = g,
 * v^ = g^2, so
 *     p1 = p0 - lr * (g / (|g| + eps) + wd' * p0)
 *     D := p0 * (1 - lr*wd') - p1 = lr * g / (|g| + eps),
 * with wd' = wd on GPT-2's matrices (wte, wpe, qkv_w, proj_w, fc_w, fc2_w)
 * and 0 on biases and LayerNorm parameters (DESIGN.md §3, the optimizer
 * step),
 * which is lr * sign(g) wherever |g| >> eps. p0 comes from a run whose
 * first step has lr = 0 (WarmupLR from warmup_min_lr 0: p1 = p0 exactly);
 * the measured run takes its step-1 lr from WarmupCosineLR (lr * 0.5 at
 * s = 0), read back from the metrics. g is recovered from the checkpoint's m
 * (g = m / (1-b1)), and v is checked against it.
 * Rounding (fp32, u = 2^-24): p1 is rounded once (u |p1|), lr * (...) once
 * (u * lr * 1.01), the moments and the division a few ulps of lr; so
 * |D - lr * g/(|g|+eps)| <= 2u |p1| + 8u lr (a factor 2 to spare). Missing
 * weight decay (or decay on a LayerNorm weight, |p0| ~ 1) is off by
 * lr * wd * |p0| = 1e-4 * |p0| (>> 2u |p1|);
 * a missing bias correction gives m/sqrt(v) = 0.1/sqrt(0.05) = 0.45, not 1. */
static void test_adamw_first_step(void) {
    const double lr_opt = 0.002, ratio = 0.5, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-12;
    char json[2048], cfg[512], met[512], dir[2][512], args[4096];
    const char *sched[2] = {
        "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10,"
        " \"warmup_type\": \"linear\", \"warmup_min_lr\": 0, \"warmup_max_lr\": 0.001}}",
        "\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10,"
        " \"warmup_type\": \"linear\", \"warmup_min_ratio\": 0.5}}"};
    double lr[2];
    for (int run = 0; run < 2; run++) {
        char extra[512], name[64];
        snprintf(extra, sizeof extra, "\"train_batch_size\": 8, %s", sched[run]);
        model_json(json, sizeof json, 0, extra);
        subst(json, sizeof json, "\"lr\": 0.001", "\"lr\": 0.002");
        subst(json, sizeof json, "\"eps\": 1e-8", "\"eps\": 1e-12");
        subst(json, sizeof json, "\"weight_decay\": 0.01", "\"weight_decay\": 0.1");
        snprintf(name, sizeof name, "adamw%d.json", run);
        write_text(zpp_test_tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "adamw%d", run);
        zpp_test_tmp_path(name, dir[run]);
        snprintf(name, sizeof name, "adamw%d.jsonl", run);
        snprintf(args, sizeof args, "--config %s --steps 1 --metrics %s --save %s %s", cfg,
                 zpp_test_tmp_path(name, met), dir[run], seed_arg());
        train_ok(1, args);
        EXPECT(zpp_test_read_metric(met, "lr", &lr[run], 1) == 1);
    }
    EXPECT(lr[0] == 0.0, "step 1 of WarmupLR from 0 ran at lr %g", lr[0]);
    EXPECT(fabs(lr[1] - lr_opt * ratio) <= 1e-6 * lr_opt * ratio,
           "step 1 of WarmupCosineLR ran at lr %g, the schedule says %g", lr[1], lr_opt * ratio);
    /* the engine's values: fp32 */
    const double L = (float)(lr_opt * ratio), WD = (float)wd, B1 = (float)b1, B2 = (float)b2;
    const double c1 = 1.0 - B1, c2 = 1.0 - B2, E = (float)eps, u = 0x1p-24;
    /* the shape of model_json: which elements are matrices */
    const zpp_gpt2_config shape = {2, 2, 32, 16, 256, 0, 0, 0};
    zpp_gpt2_layout lay;
    zpp_gpt2_layout_make(&shape, &lay);
    model_state s0, s1;
    state_load(dir[0], 1, &s0);
    state_load(dir[1], 1, &s1);
    EXPECT(s0.step == 1 && s1.step == 1 && s0.n_units == s1.n_units);
    size_t n = 0, at_lr = 0;
    double worst = 0;
    for (int k = 0; k < s1.n_units; k++) {
        EXPECT(s0.len[k] == s1.len[k]);
        for (size_t i = 0; i < s1.len[k]; i++, n++) {
            double p0 = s0.x[k][0][i], p1 = s1.x[k][0][i], m = s1.x[k][1][i],
                   v = s1.x[k][2][i];
            /* the same gradient in both runs (same weights, same batch) */
            EXPECT(m == s0.x[k][1][i] && v == s0.x[k][2][i]);
            double g = m / c1;
            EXPECT(fabs(v - c2 * g * g) <= 8 * u * c2 * g * g + 1e-37,
                   "unit %d element %zu: v = %.9g, (1-b2) g^2 = %.9g with g = m/(1-b1) = %.9g",
                   k, i, v, c2 * g * g, g);
            const int matrix =
                k == 0 ? i < lay.lnf_w
                       : (i >= lay.qkv_w && i < lay.qkv_b) || (i >= lay.proj_w && i < lay.proj_b) ||
                             (i >= lay.fc_w && i < lay.fc_b) || (i >= lay.fc2_w && i < lay.fc2_b);
            EXPECT(s1.len[k] == (k == 0 ? lay.embed_numel : lay.block_numel));
            double D = p0 * (1 - L * (matrix ? WD : 0.0)) - p1, want = L * g / (fabs(g) + E);
            double tol = 2 * u * fabs(p1) + 8 * u * L;
            if (fabs(D - want) > worst) worst = fabs(D - want);
            EXPECT(fabs(D - want) <= tol,
                   "unit %d element %zu: p0 %.9g -> p1 %.9g; p0 (1 - lr wd) - p1 = %.9g, "
                   "expected lr g/(|g|+eps) = %.9g (g %.3g, tolerance %.2g)",
                   k, i, p0, p1, D, want, g, tol);
            if (fabs(fabs(D) - L) <= tol) at_lr++;
        }
    }
    /* Where |g| >> eps the step is lr itself; below ~1e5 eps (1e-7) it is
     * measurably less. Those are about 1% (gradients near zero, and the
     * attention key biases, whose gradient is zero up to rounding). */
    printf("  %zu parameters, %zu (%.2f%%) moved by lr to within rounding; worst residual "
           "%.2g (lr %.3g)\n",
           n, at_lr, 100.0 * at_lr / n, worst, L);
    EXPECT(at_lr >= 0.95 * n, "only %zu of %zu parameters moved by lr", at_lr, n);
    state_free(&s0);
    state_free(&s1);
}

/* Reads "step" of a checkpoint's published manifest (or of a step folder's
 * own); -1 if there is none. */
static int manifest_step(const char *dir) {
    char path[600], buf[256] = {0};
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(path, sizeof path, "%s/manifest.json", dir);
        f = fopen(path, "r");
    }
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strstr(buf, "\"step\":");
    return p ? atoi(p + 7) : -1;
}

/* Whether a checkpoint directory holds an intact checkpoint of `step` (the
 * manifest and every rank file agree, every checksum holds). */
static int ckpt_dir_valid(const char *dir, int world, int step, char *why, size_t cap) {
    int ms = manifest_step(dir);
    if (ms != step) return snprintf(why, cap, "%s: manifest step %d", dir, ms), 0;
    for (int r = 0; r < world; r++) {
        char path[700];
        ckpt c;
        ckpt_rank_path(dir, r, path);
        if (!ckpt_read(path, &c, why, cap)) return 0;
        int ok = c.step == (uint64_t)step && c.world == (uint32_t)world &&
                 c.rank == (uint32_t)r;
        ckpt_free(&c);
        if (!ok) return snprintf(why, cap, "%s: rank file of another save", path), 0;
    }
    return 1;
}

/* `--save DIR --save-every K` checkpoints after steps K, 2K, ... and after
 * the last step, into DIR: each save a new step folder, published by
 * renaming DIR/checkpoint.json, the newest 2 kept (zeropp.keep_checkpoints'
 * default). 10 steps, K = 4, 2 ranks: publishes after steps 4, 8 and 10, no
 * others (inotify counts the renames of the pointer into DIR: the events
 * queue in the kernel, none is missed); step-00000008 and step-00000010
 * stay, step-00000004 is gone. Resuming from the step-8 folder continues bit
 * for bit as the run that never stopped (same losses; the final rank files
 * byte for byte). */
static void test_save_every(void) {
    const int W = 2, steps = 10, every = 4;
    char cfg[512], met[512], dir[512], json[2048], args[4096], err[512], sub[600];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("every.json", cfg), "%s", json);
    zpp_test_tmp_path("every.jsonl", met);
    zpp_test_tmp_path("every", dir);
    EXPECT(mkdir(dir, 0777) == 0);
    int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    EXPECT(ifd >= 0 && inotify_add_watch(ifd, dir, IN_MOVED_TO | IN_CREATE) >= 0,
           "inotify: %s", strerror(errno));
    snprintf(args, sizeof args, "--config %s --steps %d --save %s --save-every %d --metrics %s",
             cfg, steps, dir, every, met);
    EXPECT(run_train(W, args, zpp_test_tmp_path("err.txt", err)) == 0,
           "the run failed; stderr in %s", err);
    int saves = 0;
    char ev[4096] __attribute__((aligned(8)));
    ssize_t len;
    while ((len = read(ifd, ev, sizeof ev)) > 0) {
        for (char *p = ev; p < ev + len;) {
            struct inotify_event *e = (struct inotify_event *)p;
            p += sizeof *e + e->len;
            /* (IN_CREATE events between the renames keep the kernel from
             * merging them into one) */
            if ((e->mask & IN_MOVED_TO) && e->len && strcmp(e->name, "checkpoint.json") == 0)
                saves++;
        }
    }
    close(ifd);
    EXPECT(saves == 3, "%d checkpoints published; expected 3 (after steps 4, 8, 10)", saves);
    char why[800];
    EXPECT(ckpt_dir_valid(dir, W, steps, why, sizeof why), "final checkpoint: %s", why);
    snprintf(sub, sizeof sub, "%s/step-00000008", dir);
    EXPECT(ckpt_dir_valid(sub, W, 8, why, sizeof why), "kept checkpoint: %s", why);
    snprintf(sub, sizeof sub, "%s/step-00000004", dir);
    EXPECT(access(sub, F_OK) != 0, "%s was kept beside 2 newer checkpoints", sub);
    double full[MAX_STEPS], resumed[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == steps);
    const int from = 8;
    char met2[512], dir2[512];
    snprintf(sub, sizeof sub, "%s/step-00000008", dir);
    snprintf(args, sizeof args, "--config %s --steps %d --resume %s --metrics %s --save %s", cfg,
             steps, sub, zpp_test_tmp_path("every_resumed.jsonl", met2),
             zpp_test_tmp_path("every_resumed", dir2));
    train_ok(W, args);
    EXPECT(zpp_test_read_metric(met2, "loss", resumed, MAX_STEPS) == steps - from);
    for (int i = 0; i < steps - from; i++)
        EXPECT(resumed[i] == full[from + i], "step %d: resumed from step %d %a, uninterrupted %a",
               from + i + 1, from, resumed[i], full[from + i]);
    for (int r = 0; r < W; r++) {
        char a[700], b[700];
        unsigned char *x, *y;
        size_t nx, ny;
        read_all(ckpt_rank_path(dir, r, a), &x, &nx);
        read_all(ckpt_rank_path(dir2, r, b), &y, &ny);
        EXPECT(nx == ny && memcmp(x, y, nx) == 0, "%s and %s differ", a, b);
        free(x);
        free(y);
    }
    printf("  resumed from the step-%d checkpoint: steps %d..%d bit for bit\n", from, from + 1,
           steps);
}

/* Weights that overflow make every step non-finite: each is skipped (no
 * update), and after zeropp.max_consecutive_skips (default 5) in a row the
 * run ends on every rank with one line naming the steps and the cause, with
 * the last checkpoint intact. lr = 1e30 makes step 1's update ~1e30 per
 * weight; from step 2 on the forward overflows fp32 (squares of 1e30 in
 * LayerNorm and attention), so steps 2-6 are skipped and step 6 stops the
 * run. 2 ranks: each rank's exit status is recorded by a wrapper, since
 * mpirun reports only the first. With --save-every 1 the step-5 checkpoint
 * is intact (manifest, rank files, checksums; no leftover .tmp), finite, and
 * holds exactly the step-1 state (masters and both moments: the skipped
 * steps changed nothing); it resumes into the same stop (steps 6-10); with
 * --save alone (the run ends at step 8) there is no checkpoint at all. */
static void test_nonfinite_gradient_fails_cleanly(void) {
    const int W = 2;
    char cfg[512], json[2048], err[512], met[512], dir[512], dir1[512], cmd[4096], args[2048];
    model_json(json, sizeof json, 0, "\"train_micro_batch_size_per_gpu\": 2");
    subst(json, sizeof json, "\"lr\": 0.001", "\"lr\": 1e30");
    write_text(zpp_test_tmp_path("nonfinite.json", cfg), "%s", json);
    zpp_test_tmp_path("nonfinite_ckpt", dir);
    EXPECT(getenv("ZPP_CLI") && getenv("ZPP_MPIEXEC"), "ZPP_CLI and ZPP_MPIEXEC must be set");
    char codes[512];
    zpp_test_tmp_path("nonfinite_exit", codes);
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np %d sh -c '%s train --quiet "
             "--config %s --steps 8 --save %s --save-every 1 --metrics %s; echo $? > "
             "%s.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}' >/dev/null 2>%s",
             getenv("ZPP_MPIEXEC"), W, getenv("ZPP_CLI"), cfg, dir,
             zpp_test_tmp_path("nonfinite.jsonl", met), codes,
             zpp_test_tmp_path("nonfinite_err.txt", err));
    int rc = system(cmd);
    EXPECT(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 124, "%s: hang?", cmd);
    for (int r = 0; r < W; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s.%d", codes, r);
        FILE *f = fopen(path, "r");
        int code = -1;
        EXPECT(f && fscanf(f, "%d", &code) == 1, "rank %d left no exit status", r);
        fclose(f);
        EXPECT(code != 0, "rank %d exited 0 after 5 non-finite steps", r);
    }
    /* one line, naming the steps and the cause */
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1, "expected one error line; see %s", err);
    FILE *f = fopen(err, "r");
    char line[4096] = "", l[4096];
    while (fgets(l, sizeof l, f))
        if (strstr(l, "zeropp")) snprintf(line, sizeof line, "%s", l);
    fclose(f);
    EXPECT(strstr(line, "steps 2-6") != NULL, "the error does not name steps 2-6: %s", line);
    EXPECT(strcasestr(line, "nan") || strcasestr(line, "inf") || strcasestr(line, "non-finite"),
           "the error does not say the value is not finite: %s", line);
    printf("  %s", line);
    /* steps 1-5 logged, 2-5 as skipped */
    int skipped[MAX_STEPS];
    EXPECT(read_skipped(met, skipped, MAX_STEPS) == 5, "expected 5 metrics lines in %s", met);
    for (int s = 0; s < 5; s++)
        EXPECT(skipped[s] == (s >= 1), "step %d: skipped %d", s + 1, skipped[s]);
    /* the last good checkpoint, intact; nothing half-written beside it */
    char why[800];
    EXPECT(ckpt_dir_valid(dir, W, 5, why, sizeof why), "%s", why);
    DIR *d = opendir(dir);
    EXPECT(d != NULL);
    struct dirent *de;
    while ((de = readdir(d)))
        EXPECT(strstr(de->d_name, ".tmp") == NULL, "leftover %s/%s", dir, de->d_name);
    closedir(d);
    /* the same state as after step 1 */
    snprintf(args, sizeof args, "--config %s --steps 1 --save %s", cfg,
             zpp_test_tmp_path("nonfinite_step1", dir1));
    EXPECT(run_train(W, args, err) == 0, "the 1-step run failed; see %s", err);
    for (int r = 0; r < W; r++) {
        char path[700], path1[700];
        ckpt c, c1;
        ckpt_rank_path(dir, r, path);
        ckpt_rank_path(dir1, r, path1);
        EXPECT(ckpt_read(path, &c, why, sizeof why), "%s", why);
        EXPECT(ckpt_read(path1, &c1, why, sizeof why), "%s", why);
        EXPECT(c.n_units == c1.n_units);
        for (uint32_t u = 0; u < c.n_units; u++)
            for (int k = 0; k < 3; k++)
                for (size_t i = 0; i < c.len[u]; i++) {
                    EXPECT(isfinite(c.state[u][k][i]), "%s unit %u: %g", path, u,
                           c.state[u][k][i]);
                    EXPECT(c.state[u][k][i] == c1.state[u][k][i],
                           "%s unit %u state %d [%zu]: %g after step 5, %g after step 1", path,
                           u, k, i, c.state[u][k][i], c1.state[u][k][i]);
                }
        ckpt_free(&c);
        ckpt_free(&c1);
    }
    /* it loads, and the next steps stop the same way */
    snprintf(args, sizeof args, "--config %s --steps 12 --resume %s", cfg, dir);
    EXPECT(run_train(W, args, err) != 0);
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1 && zpp_test_count_lines(err, "steps 6-10") == 1,
           "resumed: expected the steps 6-10 error; see %s", err);
    /* --save without --save-every: the run never reaches its save */
    zpp_test_tmp_path("nonfinite_nosave", dir);
    snprintf(args, sizeof args, "--config %s --steps 8 --save %s", cfg, dir);
    EXPECT(run_train(W, args, err) != 0);
    EXPECT(manifest_step(dir) == -1, "a checkpoint was written by a failed run in %s", dir);
}

/* The Llama that the GPU tests train: GQA 2:1 with head dim 64 (the fused
 * attention's in bf16), untied head, llama3 rope scaling; the first %s is
 * the dtype's entry ("bf16": ..., or none for fp32), the second the rest. */
#define GPU_LLAMA_JSON                                                                          \
    "{\"model\": {\"family\": \"llama\", \"n_layer\": 2, \"n_head\": 2, \"n_kv_head\": 1,"      \
    " \"n_embd\": 128, \"n_ffn\": 256, \"seq_len\": 32, \"vocab_size\": 256,"                   \
    " \"untied_head\": true, \"rope_theta\": 500000, \"rope_factor\": 8,"                        \
    " \"rope_low_freq_factor\": 1, \"rope_high_freq_factor\": 4, \"rope_original_max_pos\": 16},"   \
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001,"                          \
    " \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.01}},"                           \
    " \"gradient_clipping\": 1.0, %s"                                                         \
    " \"zeropp\": {\"eval_every\": 0, \"seed\": 7}, %s}"

/* What expect_family_gpu_matches_cpu trains. */
enum { GPU_GPT_BF16 = 0, GPU_LLAMA_BF16 = 1, GPU_LLAMA_FP32 = 2 };

/* GPU against CPU, the bounds of test_gpu_matches_cpu (below, which says
 * why they hold): trains the 64-wide bf16 GPT (or GPU_LLAMA_JSON's Llama
 * in bf16 or fp32, as `family` says) with `zero` (a zero_optimization
 * entry) for 6 steps on np ranks, with `args` (the node size) on the CPU
 * and with `args` plus `gpu_args` on the GPU; the GPU run's stdout goes to
 * gpu_out (NULL: nowhere). Every step's loss within 1e-3 of the CPU's (step
 * 1 within 2^-8), the same cross- and intra-node bytes exactly, the profile
 * fields sound, and the loss falls. In fp32 both compute the same fp32
 * formulas, differing only in summation order (test_llama_cuda.c: ~1e-6 of
 * the loss), so step 1 within 1e-5 and every step within 1e-4 (AdamW's
 * first steps are near sign(g) lr: an element whose tiny gradient differs
 * in sign moves by 2 lr, a small effect on the loss). */
static void expect_family_gpu_matches_cpu(int family, const char *name, int np, const char *zero,
                                          const char *args, const char *gpu_args,
                                          const char *gpu_out) {
    const int steps = 6, llama = family != GPU_GPT_BF16, fp32 = family == GPU_LLAMA_FP32;
    const double tol1 = fp32 ? 1e-5 : 0x1p-8, tol = fp32 ? 1e-4 : 1e-3;
    double loss[2][MAX_STEPS], cross[2][MAX_STEPS], intra[2][MAX_STEPS];
    for (int gpu = 0; gpu < 2; gpu++) {
        char cfg[512], met[512], err[512], json[2048], extra[512], cmd[2048], file[64];
        snprintf(extra, sizeof extra, "\"train_micro_batch_size_per_gpu\": 4, %s", zero);
        if (llama)
            snprintf(json, sizeof json, GPU_LLAMA_JSON,
                     fp32 ? "" : "\"bf16\": {\"enabled\": true},", extra);
        else model_json_w(json, sizeof json, 64, 1, extra);
        snprintf(file, sizeof file, "gpu_%s.json", name);
        write_text(zpp_test_tmp_path(file, cfg), "%s", json);
        snprintf(file, sizeof file, "gpu_%s_%d.jsonl", name, gpu);
        zpp_test_tmp_path(file, met);
        snprintf(cmd, sizeof cmd, "--config %s --steps %d %s --device %s%s --profile --metrics %s",
                 cfg, steps, args, gpu ? "gpu" : "cpu", gpu ? gpu_args : "", met);
        int rc = run_train_env(np, NULL, cmd, gpu ? gpu_out : NULL,
                               zpp_test_tmp_path("err.txt", err));
        EXPECT(rc == 0, "%s on the %s: exit %d; stderr in %s", name, gpu ? "GPU" : "CPU", rc,
               err);
        EXPECT(zpp_test_read_metric(met, "loss", loss[gpu], MAX_STEPS) == steps);
        EXPECT(zpp_test_read_metric(met, "cross_node_bytes", cross[gpu], MAX_STEPS) == steps);
        EXPECT(zpp_test_read_metric(met, "intra_node_bytes", intra[gpu], MAX_STEPS) == steps);
        expect_profile_fields(met, steps);
    }
    printf("  %-7s step 1 loss: cpu %.9g gpu %.9g; step %d: cpu %.9g gpu %.9g\n", name,
           loss[0][0], loss[1][0], steps, loss[0][steps - 1], loss[1][steps - 1]);
    double worst = 0;
    for (int s = 0; s < steps; s++) worst = fmax(worst, fabs(loss[1][s] / loss[0][s] - 1));
    printf("  %-7s worst relative loss difference %.3g (bound %.3g; step 1 %.3g, bound %.3g)\n",
           name, worst, tol, fabs(loss[1][0] / loss[0][0] - 1), tol1);
    EXPECT(fabs(loss[1][0] - loss[0][0]) <= tol1 * loss[0][0],
           "%s step 1: gpu %.9g vs cpu %.9g (relative %.3g > bound %.3g)", name, loss[1][0],
           loss[0][0], fabs(loss[1][0] / loss[0][0] - 1), tol1);
    for (int s = 0; s < steps; s++) {
        EXPECT(fabs(loss[1][s] - loss[0][s]) <= tol * loss[0][s],
               "%s step %d: gpu %.9g vs cpu %.9g (relative %.3g > bound %.3g)", name, s + 1,
               loss[1][s], loss[0][s], fabs(loss[1][s] / loss[0][s] - 1), tol);
        EXPECT(cross[1][s] == cross[0][s] && intra[1][s] == intra[0][s],
               "%s step %d: %.0f + %.0f cross- + intra-node bytes vs %.0f + %.0f", name, s + 1,
               cross[1][s], intra[1][s], cross[0][s], intra[0][s]);
    }
    EXPECT(loss[1][steps - 1] < loss[1][0], "%s: the loss did not fall", name);
}

static void expect_gpu_matches_cpu(const char *name, int np, const char *zero, const char *args,
                                   const char *gpu_args, const char *gpu_out) {
    expect_family_gpu_matches_cpu(GPU_GPT_BF16, name, np, zero, args, gpu_args, gpu_out);
}

/* GPU (label gpu): the CUDA Llama (llama_cuda.cu) trains like the CPU one,
 * within test_gpu_matches_cpu's bounds (test_llama_cuda derives the same u
 * for one step of the Llama's model): world 1 with ZeRO-3 in bf16 (the
 * fused attention) and in fp32 (the GEMM attention, to the fp32 bounds),
 * and 2 ranks as 2 emulated nodes with qwZ + qgZ. */
static void test_gpu_llama_matches_cpu(void) {
    expect_family_gpu_matches_cpu(GPU_LLAMA_BF16, "llama_world1", 1,
                                  "\"zero_optimization\": {\"stage\": 3}", "", "", NULL);
    expect_family_gpu_matches_cpu(GPU_LLAMA_FP32, "llama_fp32_world1", 1,
                                  "\"zero_optimization\": {\"stage\": 3}", "", "", NULL);
    expect_family_gpu_matches_cpu(GPU_LLAMA_BF16, "llama_qwz_qgz", 2,
                                  "\"zero_optimization\": {\"stage\": 3, "
                                  "\"zero_quantized_weights\": true, "
                                  "\"zero_quantized_gradients\": true}",
                                  "--node-size 1", " --emulate-nodes", NULL);
}

/* GPU (label gpu, 2 GPUs or 1): `--device gpu` trains like `--device cpu`.
 * Two runs of each: ZeRO-3 with both ranks on one node (NVLink), and qwZ +
 * qgZ with each rank its own emulated node (NCCL over sockets between them).
 * With one GPU both ranks share it as two emulated nodes (DESIGN.md §6), so
 * the ZeRO-3 run does too, and the one-node (NVLink) variant is skipped.
 * - The collectives make the same calls with the same sizes on both
 *   backends, so the cross- and intra-node bytes of every step are equal,
 *   exactly.
 * - Step 1's loss is computed before any update, from the same weights and
 *   samples. The config is bf16: the CPU computes in fp32 on the bf16
 *   weights, the CUDA model stores what feeds its products in bf16
 *   (gpt2_cuda.cu, PRECISION), and test_gpt2_cuda derives for that a loss
 *   difference of at most u = 2^-8 relative (observed ~3e-5), so 2^-8.
 * - Later steps: gradients that differ in the last fp32 bits can flip an
 *   int4 or bf16 rounding; AdamW turns such a flip into an update change of
 *   at most ~lr (1e-3) on the few weights concerned, far below 1e-3 of the
 *   loss over 6 steps. */
static void test_gpu_matches_cpu(void) {
    int one_gpu = zpp_device_gpu_count() < 2;
    if (one_gpu)
        printf("  not run (it needs 2 GPUs, NVLink): zero3 on one node of 2 ranks; this host shows "
               "%d GPU, so zero3 runs as 2 emulated nodes sharing it\n",
               zpp_device_gpu_count());
    expect_gpu_matches_cpu("zero3", 2, "\"zero_optimization\": {\"stage\": 3}",
                           one_gpu ? "--node-size 1" : "--node-size 2",
                           one_gpu ? " --emulate-nodes" : "", NULL);
    expect_gpu_matches_cpu("qwz_qgz", 2,
                           "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": "
                           "true, \"zero_quantized_gradients\": true}",
                           "--node-size 1", " --emulate-nodes", NULL);
}

/* GPU (label gpu, 1 GPU or more): all three of ZeRO++ (qwZ, hpZ's
 * secondary shards gathered inside the node, qgZ's two hops) on 4 ranks as
 * 2 emulated nodes of 2 trains like the CPU, within test_gpu_matches_cpu's
 * bounds (issue 28 item 5). On one GPU the two ranks of each node share it,
 * which NCCL refuses within one host: each such rank becomes an NCCL host
 * of its own (sockets between all four; comm/hostid.h) while hpZ and qgZ
 * still see 2 nodes of 2, and rank 0 prints one note saying so. With 2 or
 * more GPUs a node's ranks have GPUs of their own and no note is printed. */
static void test_gpu_hpz_nodes_of_two_matches_cpu(void) {
    char out[512];
    expect_gpu_matches_cpu("hpz_2x2", 4,
                           "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": "
                           "true, \"zero_hpz_partition_size\": 2, "
                           "\"zero_quantized_gradients\": true}",
                           "--node-size 2", " --emulate-nodes",
                           zpp_test_tmp_path("gpu_hpz_2x2.out", out));
    const int shared = zpp_device_gpu_count() == 1;
    char met[512];
    zpp_test_tmp_path("gpu_hpz_2x2_1.jsonl", met);
    EXPECT(zpp_test_count_lines(met, "\"mode\":\"qwz+hpz+qgz\"") == 6,
           "the GPU run's steps are not all qwz+hpz+qgz; see %s", met);
    EXPECT(zpp_test_count_lines(out, "4 ranks = 2 nodes of 2") == 1,
           "the GPU run's header does not say 2 nodes of 2; see %s", out);
    EXPECT(zpp_test_count_lines(out, "share GPU") == shared,
           "%d GPU(s): expected %d note(s) of ranks sharing a GPU; see %s",
           zpp_device_gpu_count(), shared, out);
    if (shared)
        EXPECT(zpp_test_count_lines(out, "note: ranks of node 0 share GPU ") == 1 &&
                   zpp_test_count_lines(out, "each talks over sockets, as a separate host; the "
                                             "topology stays 2 nodes of 2") == 1,
               "the note is not the expected one; see %s", out);
}

/* GPU (label gpu): ZeRO++ learns as well as ZeRO-3 on the GPU, where the
 * model computes in bf16 on tensor cores. Both runs are 2 ranks as 2
 * emulated nodes (sharing the GPU when there is one), so the only
 * difference is the quantization: qwZ's int8 weights in every gather and
 * qgZ's int4 gradients. A 4-layer, 256-wide model with T 128 trains on Tiny
 * Shakespeare for 400 steps (val loss from ~5.5 nats at the start to ~2,
 * well past unigram statistics); ZeRO++'s validation loss must not exceed
 * ZeRO-3's by more than 1%, the issue's bar for "no loss of convergence".
 * One run each is one draw of the quantization's noise, which helps a
 * trajectory as often as it hurts it: with the same seed, the bits of a
 * new LayerNorm kernel put ZeRO++ more than 1% below ZeRO-3
 * (bench/RESULTS.md, 2026-12-04, sixth session). So the bar is one-sided,
 * and ZeRO++ far below ZeRO-3 (3%) is taken as a sign that the two runs
 * differ in more than quantization. */
static void test_gpu_zeropp_matches_zero3_validation_loss(void) {
    char data[512];
    zpp_test_data("tinyshakespeare.txt", data, sizeof data);
    const char *modes[][2] = {
        {"zero3", "{\"stage\": 3}"},
        {"zeropp", "{\"stage\": 3, \"zero_quantized_weights\": true,"
                   " \"zero_quantized_gradients\": true}"},
    };
    const int steps = 400;
    double val[2], first[2], last[2];
    for (int m = 0; m < 2; m++) {
        char cfg[512], met[512], err[512], json[2048], args[2048], name[64];
        snprintf(json, sizeof json,
                 "{\"model\": {\"n_layer\": 4, \"n_head\": 4, \"n_embd\": 256,"
                 " \"seq_len\": 128, \"vocab_size\": 256},"
                 " \"train_micro_batch_size_per_gpu\": 8,"
                 " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.002,"
                 " \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.01}},"
                 " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {"
                 "\"warmup_num_steps\": 40, \"warmup_type\": \"linear\"}},"
                 " \"gradient_clipping\": 1.0, \"bf16\": {\"enabled\": true},"
                 " \"zero_optimization\": %s, \"zeropp\": {\"seed\": 7}}",
                 modes[m][1]);
        snprintf(name, sizeof name, "gpu_quality_%s.json", modes[m][0]);
        write_text(zpp_test_tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "gpu_quality_%s.jsonl", modes[m][0]);
        zpp_test_tmp_path(name, met);
        snprintf(args, sizeof args,
                 "--config %s --data %s --steps %d --eval-every %d --device gpu --node-size 1 "
                 "--emulate-nodes --metrics %s",
                 cfg, data, steps, steps, met);
        int rc = run_train(2, args, zpp_test_tmp_path("err.txt", err));
        EXPECT(rc == 0, "%s on the GPU: exit %d; stderr in %s", modes[m][0], rc, err);
        double loss[MAX_STEPS];
        EXPECT(zpp_test_read_metric(met, "val_loss", &val[m], 1) == 1);
        EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == steps);
        first[m] = loss[0];
        last[m] = loss[steps - 1];
        printf("  %-6s train loss %.4f -> %.4f, val loss %.4f\n", modes[m][0], first[m],
               last[m], val[m]);
        EXPECT(val[m] < 0.45 * first[m], "%s did not learn: val loss %.4f from %.4f",
               modes[m][0], val[m], first[m]);
    }
    printf("  zeropp vs zero3 val loss: %+.2f%%\n", 100.0 * (val[1] - val[0]) / val[0]);
    EXPECT(val[1] - val[0] <= 0.01 * val[0], "ZeRO++ val loss %.4f vs ZeRO-3 %.4f (> 1%% above)",
           val[1], val[0]);
    EXPECT(val[0] - val[1] <= 0.03 * val[0],
           "ZeRO++ val loss %.4f vs ZeRO-3 %.4f (> 3%% below: the runs differ in more than "
           "quantization)", val[1], val[0]);
}

/* Trains the small fp32 GPT of model_json with `extra` keys on `world`
 * ranks for `steps`; returns the exit code, metrics in `met`, stderr in
 * `err` (both named after `name`). */
static int run_extra(const char *name, int world, const char *extra, int steps, char *met,
                     char *err) {
    char cfg[512], json[2048], args[2048], buf[128];
    model_json(json, sizeof json, 0, extra);
    snprintf(buf, sizeof buf, "%s.json", name);
    write_text(zpp_test_tmp_path(buf, cfg), "%s", json);
    snprintf(buf, sizeof buf, "%s.jsonl", name);
    zpp_test_tmp_path(buf, met);
    remove(met);
    snprintf(buf, sizeof buf, "%s_err.txt", name);
    zpp_test_tmp_path(buf, err);
    snprintf(args, sizeof args, "--config %s --steps %d --metrics %s", cfg, steps, met);
    return run_train(world, args, err);
}

/* ZPP_FAULT=nonfinite@3 (a NaN in rank 0's gradient at step 3) skips step
 * 3 and the run goes on: the metrics say skipped at step 3 only, and the
 * global sum of squares of the fp32 masters (ZPP_PARAM_SUMSQ=1) after step
 * 3 is exactly that after step 2, and changes at step 4. Steps 1-3 match an
 * unfaulted run bit for bit (the NaN is written after step 3's backward, so
 * its loss is the same). With qwZ + hpZ + qgZ too: the skipped step leaves
 * the hpZ secondary shards valid and the next steps train. */
static void test_nonfinite_step_skipped(void) {
    const char *modes[][2] = {
        {"zero3", "\"train_micro_batch_size_per_gpu\": 2"},
        {"zeropp",
         "\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,"
         " \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 2,"
         " \"zero_quantized_gradients\": true}"},
    };
    const int steps = 6;
    setenv("ZPP_PARAM_SUMSQ", "1", 1);
    for (int m = 0; m < 2; m++) {
        double ps[2][MAX_STEPS], loss[2][MAX_STEPS], total[MAX_STEPS];
        int sk[2][MAX_STEPS];
        for (int fault = 0; fault < 2; fault++) {
            char met[512], err[512], name[64];
            if (fault) setenv("ZPP_FAULT", "nonfinite@3", 1);
            else unsetenv("ZPP_FAULT");
            snprintf(name, sizeof name, "skip_%s_%d", modes[m][0], fault);
            int rc = run_extra(name, 2, modes[m][1], steps, met, err);
            unsetenv("ZPP_FAULT");
            EXPECT(rc == 0, "%s (fault %d): exit %d; see %s", modes[m][0], fault, rc, err);
            EXPECT(zpp_test_read_metric(met, "param_sumsq", ps[fault], MAX_STEPS) == steps);
            EXPECT(zpp_test_read_metric(met, "loss", loss[fault], MAX_STEPS) == steps);
            EXPECT(read_skipped(met, sk[fault], MAX_STEPS) == steps);
            if (fault)
                EXPECT(zpp_test_read_metric(met, "skipped_total", total, MAX_STEPS) == steps);
        }
        for (int s = 0; s < steps; s++) {
            EXPECT(!sk[0][s], "%s: unfaulted step %d skipped", modes[m][0], s + 1);
            EXPECT(sk[1][s] == (s == 2), "%s: step %d skipped %d", modes[m][0], s + 1, sk[1][s]);
            EXPECT(total[s] == (s >= 2), "%s: step %d skipped_total %g", modes[m][0], s + 1,
                   total[s]);
        }
        for (int s = 0; s < 3; s++)
            EXPECT(loss[1][s] == loss[0][s] && (s == 2 || ps[1][s] == ps[0][s]),
                   "%s step %d: faulted %.9g %.9g, unfaulted %.9g %.9g", modes[m][0], s + 1,
                   loss[1][s], ps[1][s], loss[0][s], ps[0][s]);
        EXPECT(ps[1][2] == ps[1][1], "%s: params changed at the skipped step: %.9g -> %.9g",
               modes[m][0], ps[1][1], ps[1][2]);
        EXPECT(ps[1][3] != ps[1][2], "%s: params did not change at step 4", modes[m][0]);
        EXPECT(isfinite(loss[1][steps - 1]) && loss[1][steps - 1] < loss[1][0],
               "%s: the loss did not fall after the skip: %.9g -> %.9g", modes[m][0],
               loss[1][0], loss[1][steps - 1]);
        printf("  %-6s step 3 skipped: param sumsq %.9g (step 2) = %.9g (step 3) -> %.9g\n",
               modes[m][0], ps[1][1], ps[1][2], ps[1][3]);
    }
    unsetenv("ZPP_PARAM_SUMSQ");
}

/* Non-finite steps in a row: 5 (the default max_consecutive_skips) stop
 * the run with one line naming the steps; 4 do not (the count restarts at
 * the next good step); zeropp.max_consecutive_skips sets the limit; a
 * malformed ZPP_FAULT is refused. */
static void test_consecutive_skips_stop(void) {
    const char *mb = "\"train_micro_batch_size_per_gpu\": 2";
    char met[512], err[512], extra[256];
    int sk[MAX_STEPS];
    setenv("ZPP_FAULT", "nonfinite@3-7", 1);
    int rc = run_extra("consec5", 2, mb, 10, met, err);
    EXPECT(rc != 0, "5 non-finite steps in a row did not stop the run");
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1 && zpp_test_count_lines(err, "steps 3-7") == 1,
           "expected one line naming steps 3-7; see %s", err);
    EXPECT(read_skipped(met, sk, MAX_STEPS) == 6, "expected steps 1-6 in the metrics");
    for (int s = 0; s < 6; s++) EXPECT(sk[s] == (s >= 2), "step %d: skipped %d", s + 1, sk[s]);
    setenv("ZPP_FAULT", "nonfinite@3-6", 1);
    rc = run_extra("consec4", 2, mb, 10, met, err);
    EXPECT(rc == 0, "4 non-finite steps in a row stopped the run; see %s", err);
    EXPECT(read_skipped(met, sk, MAX_STEPS) == 10);
    for (int s = 0; s < 10; s++)
        EXPECT(sk[s] == (s >= 2 && s <= 5), "step %d: skipped %d", s + 1, sk[s]);
    setenv("ZPP_FAULT", "nonfinite@3-4", 1);
    snprintf(extra, sizeof extra, "%s, \"zeropp\": {\"max_consecutive_skips\": 2}", mb);
    /* model_json already has a "zeropp" object: merge by substitution */
    char json[2048], cfg[512], args[2048];
    model_json(json, sizeof json, 0, mb);
    subst(json, sizeof json, "\"seed\": 7}", "\"seed\": 7, \"max_consecutive_skips\": 2}");
    write_text(zpp_test_tmp_path("consec_max2.json", cfg), "%s", json);
    snprintf(args, sizeof args, "--config %s --steps 10", cfg);
    rc = run_train(2, args, err);
    EXPECT(rc != 0 && zpp_test_count_lines(err, "zeropp") == 1 &&
               zpp_test_count_lines(err, "steps 3-4") == 1,
           "max_consecutive_skips 2: expected a stop naming steps 3-4; see %s", err);
    setenv("ZPP_FAULT", "nonfinite@x", 1);
    expect_clean_failure(2, args, "ZPP_FAULT");
    unsetenv("ZPP_FAULT");
}

/* fp16 with DeepSpeed's dynamic loss scaling, from a DeepSpeed fp16 block.
 * initial_scale_power 32: a scale of 2^32 overflows fp16 (gradients of
 * ~1e-2 become ~4e7 > 65504 on the fp16 wire), so the first steps are
 * skipped: step 1 at 2^32 spends the hysteresis (2) without halving, every
 * later overflow halves, until the scale fits; then no step is skipped (the
 * window, 1000, is not reached) and the loss falls. With hysteresis 1 the
 * first overflow halves already; with loss_scale_window 4 (and a scale
 * that does not overflow) the scale doubles every 4 steps. */
static void test_fp16_dynamic_loss_scale(void) {
    char met[512], err[512];
    double scale[MAX_STEPS], loss[MAX_STEPS];
    int sk[MAX_STEPS];
    const int steps = 30;
    int rc = run_extra("fp16_dyn", 2,
                       "\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": true,"
                       " \"loss_scale\": 0, \"initial_scale_power\": 32, \"loss_scale_window\":"
                       " 1000, \"hysteresis\": 2, \"min_loss_scale\": 1}",
                       steps, met, err);
    EXPECT(rc == 0, "fp16 dynamic: exit %d; see %s", rc, err);
    EXPECT(zpp_test_read_metric(met, "loss_scale", scale, MAX_STEPS) == steps);
    EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == steps);
    EXPECT(read_skipped(met, sk, MAX_STEPS) == steps);
    EXPECT(sk[0] && sk[1] && scale[0] == 0x1p32 && scale[1] == 0x1p32,
           "steps 1-2: skipped %d %d at scales %g %g (expected both, at 2^32)", sk[0], sk[1],
           scale[0], scale[1]);
    int k = 2;
    while (k < steps && sk[k]) k++;
    EXPECT(k < steps - 10, "%d steps skipped of %d", k, steps);
    for (int s = 2; s <= k; s++)
        EXPECT(scale[s] == scale[s - 1] / 2, "step %d: scale %g after %g", s + 1, scale[s],
               scale[s - 1]);
    for (int s = k; s < steps; s++) {
        EXPECT(!sk[s] && scale[s] == scale[k], "step %d: skipped %d at scale %g", s + 1, sk[s],
               scale[s]);
        EXPECT(isfinite(loss[s]), "step %d: loss %g", s + 1, loss[s]);
    }
    EXPECT(loss[steps - 1] < 0.98 * loss[k], "the loss did not fall: step %d %.6g, step %d %.6g",
           k + 1, loss[k], steps, loss[steps - 1]);
    printf("  steps 1-%d skipped, scale 2^32 -> %g; loss %.4f (step %d) -> %.4f (step %d)\n", k,
           scale[k], loss[k], k + 1, loss[steps - 1], steps);
    rc = run_extra("fp16_hyst1", 2,
                   "\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": true,"
                   " \"loss_scale\": 0, \"initial_scale_power\": 32, \"hysteresis\": 1}",
                   3, met, err);
    EXPECT(rc == 0, "fp16 hysteresis 1: exit %d; see %s", rc, err);
    EXPECT(zpp_test_read_metric(met, "loss_scale", scale, MAX_STEPS) == 3);
    EXPECT(scale[0] == 0x1p32 && scale[1] == 0x1p31 && scale[2] == 0x1p30,
           "hysteresis 1: scales %g %g %g", scale[0], scale[1], scale[2]);
    rc = run_extra("fp16_window", 2,
                   "\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": true,"
                   " \"loss_scale\": 0, \"initial_scale_power\": 4, \"loss_scale_window\": 4}",
                   9, met, err);
    EXPECT(rc == 0, "fp16 window 4: exit %d; see %s", rc, err);
    EXPECT(zpp_test_read_metric(met, "loss_scale", scale, MAX_STEPS) == 9);
    EXPECT(read_skipped(met, sk, MAX_STEPS) == 9);
    for (int s = 0; s < 9; s++)
        EXPECT(!sk[s] && scale[s] == ldexp(16.0, s / 4), "window 4, step %d: scale %g", s + 1,
               scale[s]);
}

/* A static fp16 loss scale (DeepSpeed "loss_scale": 128) trains: no step
 * skipped, the scale stays, the loss falls. */
static void test_fp16_static_loss_scale(void) {
    char met[512], err[512];
    double scale[MAX_STEPS], loss[MAX_STEPS];
    int sk[MAX_STEPS];
    const int steps = 12;
    int rc = run_extra("fp16_static", 2,
                       "\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": true,"
                       " \"loss_scale\": 128}",
                       steps, met, err);
    EXPECT(rc == 0, "fp16 static: exit %d; see %s", rc, err);
    EXPECT(zpp_test_read_metric(met, "loss_scale", scale, MAX_STEPS) == steps);
    EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == steps);
    EXPECT(read_skipped(met, sk, MAX_STEPS) == steps);
    for (int s = 0; s < steps; s++)
        EXPECT(!sk[s] && scale[s] == 128, "step %d: skipped %d, scale %g", s + 1, sk[s],
               scale[s]);
    EXPECT(loss[steps - 1] < 0.98 * loss[0], "the loss did not fall: %.6g -> %.6g", loss[0],
           loss[steps - 1]);
}

/* fp16 ZeRO-3 on 2 ranks (2 sequences each) against 1 rank (4 sequences),
 * the same global batch and seed, dynamic scale 2^10 (no overflow).
 * Step 1: the same fp16 weights and samples; only the order of fp32 sums
 * differs, so 1e-5 as for fp32. Later steps: the 1-rank gradient is the
 * batch gradient rounded once to fp16 (relative 2^-11); on 2 ranks each
 * half-batch gradient is rounded, then the two are summed and rounded: the
 * gradients differ by up to ~3 * 2^-11 relative per element, more where
 * the halves cancel. AdamW's m / sqrt(v) turns a relative gradient change
 * e into an update change of ~e * lr, and an fp16 working copy can round
 * the other way (one fp16 ulp, 2^-11 relative of the weight). Over 10 steps
 * of lr 1e-3 these move the weights by ~1e-5 absolute, far below what
 * changes the loss (~5.5) by 1e-3 relative; the bound is 1e-3 relative
 * (measured: ~1e-6). */
static void test_fp16_zero3_matches_single_rank(void) {
    const int steps = 10;
    double loss[2][MAX_STEPS];
    for (int w = 0; w < 2; w++) {
        char met[512], err[512], extra[512], name[32];
        int world = w ? 2 : 1;
        snprintf(extra, sizeof extra,
                 "\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": %d,"
                 " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 10}",
                 4 / world);
        snprintf(name, sizeof name, "fp16_w%d", world);
        int rc = run_extra(name, world, extra, steps, met, err);
        EXPECT(rc == 0, "fp16 on %d ranks: exit %d; see %s", world, rc, err);
        EXPECT(zpp_test_read_metric(met, "loss", loss[w], MAX_STEPS) == steps);
    }
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        double rel = fabs(loss[1][s] - loss[0][s]) / loss[0][s];
        if (rel > worst) worst = rel;
        EXPECT(rel <= (s == 0 ? 1e-5 : 1e-3), "step %d: 2 ranks %.9g, 1 rank %.9g", s + 1,
               loss[1][s], loss[0][s]);
    }
    EXPECT(loss[0][steps - 1] < loss[0][0], "the loss did not fall");
    printf("  fp16 2 ranks vs 1: largest relative loss difference %.2e over %d steps\n", worst,
           steps);
}

/* ---- Checkpoints: atomic saves, resharding, checks (issue 14) ------------- */

/* `zeropp train ARGS` on np ranks with ZPP_FAULT=fault (NULL: none); stdout
 * in `out` when given. Returns the exit code. */
static int run_train_env(int np, const char *fault, const char *args, const char *out,
                         const char *err) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s%s%stimeout 240 %s --oversubscribe --bind-to none -np %d %s train --quiet %s "
             ">%s 2>%s",
             fault ? "ZPP_FAULT=" : "", fault ? fault : "", fault ? " " : "", mpi, np, cli, args,
             out ? out : "/dev/null", err);
    int rc = system(cmd);
    EXPECT(rc != -1, "system() failed");
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    EXPECT(code != 124, "timed out (hang?): %s", cmd);
    return code;
}

/* Resumes DIR on W ranks to `steps` and checks the losses after `from`
 * against `full` (the uninterrupted run), bit for bit. */
static void expect_resume_bitwise(int W, const char *cfg, const char *dir, int from, int steps,
                                  const double *full, const char *extra) {
    char args[4096], met[512];
    double got[MAX_STEPS];
    snprintf(args, sizeof args, "--config %s --steps %d --resume %s --metrics %s %s", cfg, steps,
             dir, zpp_test_tmp_path("resumed_bitwise.jsonl", met), extra);
    train_ok(W, args);
    EXPECT(zpp_test_read_metric(met, "loss", got, MAX_STEPS) == steps - from);
    for (int i = 0; i < steps - from; i++)
        EXPECT(got[i] == full[from + i], "step %d: resumed from step %d %a, uninterrupted %a",
               from + i + 1, from, got[i], full[from + i]);
}

/* A save that fails leaves the previous checkpoint published and resumable,
 * bit for bit. 2 ranks, 6 steps, a save every 3: the step-6 save fails,
 * `injected` says how —
 * - 0, a file in the way: DIR/step-00000006 is a regular file, so the step
 *   folder cannot be made (DIR/rank-00001.ckpt.tmp, a folder, stands in the
 *   way of the older layout's save too, which deleted the manifest first:
 *   "is not a checkpoint" on resume);
 * - 1, ZPP_FAULT=save_fail@6 (a test hook): rank 1's write fails (an I/O
 *   error).
 * The run exits non-zero with one line, DIR/checkpoint.json still names the
 * intact step-3 checkpoint, the failed save left no folder, and resuming
 * gives steps 4..6 of the uninterrupted run bit for bit. */
static void failed_save_keeps_previous(int injected) {
    const int W = 2;
    char cfg[512], met[512], err[512], json[2048], args[2048], dir[512], p[700], why[800];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("failsave.json", cfg), "%s", json);
    double full[MAX_STEPS];
    snprintf(args, sizeof args, "--config %s --steps 6 --metrics %s", cfg,
             zpp_test_tmp_path("failsave_full.jsonl", met));
    train_ok(W, args);
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == 6);
    zpp_test_tmp_path(injected ? "failsave_injected" : "failsave_in_the_way", dir);
    EXPECT(mkdir(dir, 0777) == 0);
    if (!injected) {
        snprintf(p, sizeof p, "%s/step-00000006", dir);
        write_text(p, "in the way\n");
        snprintf(p, sizeof p, "%s/rank-00001.ckpt.tmp", dir);
        EXPECT(mkdir(p, 0777) == 0);
    }
    snprintf(args, sizeof args, "--config %s --steps 6 --save %s --save-every 3", cfg, dir);
    int rc = run_train_env(W, injected ? "save_fail@6" : NULL, args, NULL,
                           zpp_test_tmp_path("failsave_err.txt", err));
    EXPECT(rc != 0, "the step-6 save %s did not fail the run",
           injected ? "with ZPP_FAULT=save_fail@6" : "with a file in its way");
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1 &&
               zpp_test_count_lines(err, "checkpoint") == 1 &&
               zpp_test_count_lines(err, "checkpoint: checkpoint") == 0,
           "expected one line about the checkpoint (saying so once); see %s", err);
    EXPECT(ckpt_dir_valid(dir, W, 3, why, sizeof why), "after a failed save: %s", why);
    if (injected) {
        snprintf(p, sizeof p, "%s/step-00000006", dir);
        EXPECT(access(p, F_OK) != 0, "the failed save left %s", p);
    }
    expect_resume_bitwise(W, cfg, dir, 3, 6, full, "");
    printf("  a failed step-6 save (%s) left step 3 published; resumed bit for bit\n",
           injected ? "injected I/O error" : "file in the way");
}

static void test_checkpoint_failed_save_keeps_previous(void) { failed_save_keeps_previous(0); }

static void test_checkpoint_injected_save_failure_keeps_previous(void) {
    failed_save_keeps_previous(1);
}

/* A rank killed in the middle of a save (ZPP_FAULT=save_kill@6: rank 1
 * writes half its file and _exit(137)s, as kill -9 would leave it) leaves
 * the previous checkpoint published and resumable bit for bit; the resumed
 * run's step-6 save replaces the half-written step folder and publishes. */
static void test_checkpoint_killed_save_keeps_previous(void) {
    const int W = 2;
    char cfg[512], met[512], err[512], json[2048], args[2048], dir[512], p[700], why[800];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("killsave.json", cfg), "%s", json);
    double full[MAX_STEPS];
    snprintf(args, sizeof args, "--config %s --steps 6 --metrics %s", cfg,
             zpp_test_tmp_path("killsave_full.jsonl", met));
    train_ok(W, args);
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == 6);
    zpp_test_tmp_path("killsave", dir);
    snprintf(args, sizeof args, "--config %s --steps 6 --save %s --save-every 3", cfg, dir);
    int rc =
        run_train_env(W, "save_kill@6", args, NULL, zpp_test_tmp_path("killsave_err.txt", err));
    EXPECT(rc != 0, "a rank killed during the step-6 save, and the run exited 0");
    EXPECT(ckpt_dir_valid(dir, W, 3, why, sizeof why), "after a killed save: %s", why);
    snprintf(p, sizeof p, "%s/step-00000006/rank-00001.ckpt", dir);
    EXPECT(access(p, F_OK) == 0, "the fault did not fire: no half-written %s", p);
    /* resume into the same folder: steps 4..6 as if nothing happened, then
     * step 6 published and the leftover gone (replaced by the new save) */
    char extra[700];
    snprintf(extra, sizeof extra, "--save %s --save-every 3", dir);
    expect_resume_bitwise(W, cfg, dir, 3, 6, full, extra);
    EXPECT(ckpt_dir_valid(dir, W, 6, why, sizeof why), "after the resumed run: %s", why);
    printf("  rank 1 killed mid-save at step 6: step 3 stayed published, resumed bit for bit\n");
}

/* A slow save is not a stalled rank (issue 29): the last rank's write of
 * the step-3 save waits 8 s (ZPP_FAULT=save_slow@3) under a collective
 * deadline of 5 s, and the run finishes with both checkpoints; the save
 * waits on its own deadline, zeropp.save_timeout_s, which when shorter than
 * the delay (3 s) does end the run, with the step-3 folder unpublished. */
static void test_slow_save_outlives_collective_timeout(void) {
    const int W = 2;
    char cfg[512], err[512], json[2048], args[2048], dir[512], why[800];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("slowsave.json", cfg), "%s", json);
    zpp_test_tmp_path("slowsave", dir);
    snprintf(args, sizeof args,
             "--config %s --steps 4 --save %s --save-every 3 --collective-timeout 5", cfg, dir);
    int rc = run_train_env(W, "save_slow@3", args, NULL, zpp_test_tmp_path("slowsave_err.txt", err));
    EXPECT(rc == 0, "an 8 s save under a 5 s collective deadline ended the run: exit %d (%s)", rc,
           err);
    EXPECT(ckpt_dir_valid(dir, W, 4, why, sizeof why), "after the slow save: %s", why);
    char p[700];
    snprintf(p, sizeof p, "%s/step-00000003/manifest.json", dir);
    EXPECT(access(p, F_OK) == 0, "the slow step-3 save left no checkpoint: no %s", p);

    zpp_test_tmp_path("slowsave_short", dir);
    snprintf(args, sizeof args,
             "--config %s --steps 4 --save %s --save-every 3 --collective-timeout 5 "
             "--set zeropp.save_timeout_s=3",
             cfg, dir);
    rc = run_train_env(W, "save_slow@3", args, NULL, zpp_test_tmp_path("slowsave_err2.txt", err));
    EXPECT(rc != 0, "an 8 s save under zeropp.save_timeout_s 3 finished");
    snprintf(p, sizeof p, "%s/checkpoint.json", dir);
    EXPECT(access(p, F_OK) != 0, "a save past its deadline was published: %s", p);
    printf("  an 8 s save: done under a 5 s collective deadline, stopped by a 3 s save deadline\n");
}

/* Resuming an older step folder into the same --save folder (issue 29):
 * the step folders newer than it, another line of the run's history, stay
 * at the resumed run's first save and the one it resumed from is kept as
 * the newest before it; with --prune-newer the newer ones go. */
static void test_resume_older_keeps_newer(void) {
    const int W = 2;
    char cfg[512], json[2048], args[2048], dir[512], p[700];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("prunenewer.json", cfg), "%s", json);
    for (int prune = 0; prune <= 1; prune++) {
        zpp_test_tmp_path(prune ? "prunenewer_yes" : "prunenewer_no", dir);
        snprintf(args, sizeof args, "--config %s --steps 6 --save %s --save-every 2", cfg, dir);
        train_ok(W, args); /* leaves step-4 and step-6 (keep_checkpoints 2) */
        snprintf(args, sizeof args,
                 "--config %s --steps 5 --resume %s/step-00000004 --save %s --save-every 1%s",
                 cfg, dir, dir, prune ? " --prune-newer" : "");
        train_ok(W, args); /* saves step 5 */
        const int want[3][2] = {{4, 1}, {5, 1}, {6, !prune}};
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s/step-%08d/manifest.json", dir, want[i][0]);
            EXPECT((access(p, F_OK) == 0) == want[i][1], "%s: step %d %s after the resume",
                   prune ? "--prune-newer" : "by default", want[i][0],
                   want[i][1] ? "is gone" : "is still there");
        }
    }
    printf("  resumed from step 4 over step 6: step 6 stays, or goes with --prune-newer\n");
}

/* A --save folder that is not one folder for every rank (node-local
 * disks; issue 29: such a run trained up to its first save and died there)
 * is refused before step 1, naming the rank that does not see it. Two
 * ranks launched side by side (mpirun's A : B form), each given its own
 * folder, stand for two nodes with a disk each. */
static void test_save_folder_not_shared(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    char cfg[512], json[2048], a[512], b[512], met[512], err[512], cmd[4096];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("notshared.json", cfg), "%s", json);
    zpp_test_tmp_path("notshared_a", a);
    zpp_test_tmp_path("notshared_b", b);
    zpp_test_tmp_path("notshared.jsonl", met);
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np 1 %s train --quiet --config %s "
             "--steps 2 --metrics %s --save %s : -np 1 %s train --quiet --config %s --steps 2 "
             "--save %s >/dev/null 2>%s",
             mpi, cli, cfg, met, a, cli, cfg, b, zpp_test_tmp_path("notshared_err.txt", err));
    int rc = system(cmd);
    EXPECT(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 0 && WEXITSTATUS(rc) != 124,
           "a save folder rank 1 does not share ran (or hung): %s", cmd);
    char want[700];
    snprintf(want, sizeof want, "checkpoint directory %s is not shared: rank 1", b);
    EXPECT(zpp_test_count_lines(err, want) >= 1, "no line '%s' in %s", want, err);
    EXPECT(zpp_test_count_lines(met, "\"step\"") == 0, "steps trained before the refusal (%s)",
           met);
    printf("  a save folder rank 1 does not see: refused before step 1\n");
}

/* zeropp.eval_batches past what the held-out split holds (issue 29: 1e9
 * ran for hours over a few batches) is capped at the batches that cover
 * it once over the ranks, with a note naming both; the run ends at once. */
static void test_eval_batches_capped(void) {
    const int W = 2;
    char cfg[512], json[2048], args[2048], out[512], err[512];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("evalcap.json", cfg), "%s", json);
    snprintf(args, sizeof args,
             "--config %s --steps 1 --eval-every 1 --set zeropp.eval_batches=1000000000", cfg);
    int rc = run_train_env(W, NULL, args, zpp_test_tmp_path("evalcap_out.txt", out),
                           zpp_test_tmp_path("evalcap_err.txt", err));
    EXPECT(rc == 0, "exit %d; see %s", rc, err);
    EXPECT(zpp_test_count_lines(out, "note: zeropp.eval_batches 1000000000 is more than the "
                                     "held-out split holds") == 1,
           "no note of the cap in %s", out);
    EXPECT(zpp_test_count_lines(out, "val loss") >= 1, "no validation in %s", out);
    printf("  eval_batches 1e9: capped, with its note\n");
}

/* Checkpoints do not depend on the world size. fp32 ZeRO-3, global batch
 * 12 (micro-batch 1, accumulation 12 / W): 40 steps on 4 ranks, saving
 * every 20 (the step-20 folder stays: keep_checkpoints 2). Resumed from it
 * on 2 and on 3 ranks (3 pads every unit differently: 34176 is not a
 * multiple of 3 or of 4 per unit), steps 21..40 give the losses of the
 * uninterrupted 4-rank run within 1e-5 relative (only the order of the
 * gradient sums differs, as in test_zero3_matches_single_rank_fp32); on 4
 * ranks, bit for bit. The resume says what changed (the rank count). */
static void test_checkpoint_reshard(void) {
    char cfg[512], met[512], dir[512], json[2048], args[4096], sub[600], out[512], err[512];
    model_json(json, sizeof json, 0,
               "\"train_batch_size\": 12, \"train_micro_batch_size_per_gpu\": 1");
    write_text(zpp_test_tmp_path("reshard.json", cfg), "%s", json);
    zpp_test_tmp_path("reshard", dir);
    double full[MAX_STEPS], got[MAX_STEPS];
    snprintf(args, sizeof args, "--config %s --steps 40 --save %s --save-every 20 --metrics %s",
             cfg, dir, zpp_test_tmp_path("reshard_full.jsonl", met));
    train_ok(4, args);
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == 40);
    snprintf(sub, sizeof sub, "%s/step-00000020", dir);
    const int worlds[] = {2, 3, 4};
    for (int w = 0; w < 3; w++) {
        const int W = worlds[w];
        char mname[64]; /* one file a world: a resume continues its metrics file */
        snprintf(mname, sizeof mname, "reshard_resumed_%d.jsonl", W);
        snprintf(args, sizeof args, "--config %s --steps 40 --resume %s --metrics %s", cfg, sub,
                 zpp_test_tmp_path(mname, met));
        int rc = run_train_env(W, NULL, args, zpp_test_tmp_path("reshard_out.txt", out),
                               zpp_test_tmp_path("reshard_err.txt", err));
        EXPECT(rc == 0, "resume on %d ranks: exit %d; see %s", W, rc, err);
        EXPECT(zpp_test_read_metric(met, "loss", got, MAX_STEPS) == 20);
        double worst = 0;
        for (int s = 0; s < 20; s++) {
            double d = fabs(got[s] - full[20 + s]);
            if (d > worst) worst = d;
            if (W == 4)
                EXPECT(got[s] == full[20 + s], "4 ranks, step %d: %a vs %a", s + 21, got[s],
                       full[20 + s]);
            EXPECT(d <= 1e-5 * fabs(full[20 + s]),
                   "resumed on %d ranks, step %d: loss %.9g vs 40 steps on 4 ranks %.9g", W,
                   s + 21, got[s], full[20 + s]);
        }
        char want[64];
        snprintf(want, sizeof want, "ranks: 4 -> %d", W);
        EXPECT(W == 4 ? zpp_test_count_lines(out, "changed since the save") == 0
                      : zpp_test_count_lines(out, want) == 1,
               "%d ranks: the resume did not report '%s'; see %s", W, want, out);
        printf("  resumed on %d ranks: steps 21..40 within %.2g of 4 ranks (loss 40: %.6f)\n",
               W, worst, got[19]);
    }
}

/* Resume checks what must match and reports what may change. From a bf16
 * 2-rank checkpoint (n_head 2, 32 channels):
 * - n_head 4 has the same parameter count: refused, one line naming n_head;
 * - fp32 instead of bf16: refused, one line naming the dtype;
 * - qwZ + qgZ on, node size 1 instead of plain ZeRO-3: resumes, and says
 *   so in one line naming the modes. */
static void test_checkpoint_resume_checks_model(void) {
    char cfg[512], json[2048], args[4096], dir[512], out[512], err[512];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("shape.json", cfg), "%s", json);
    zpp_test_tmp_path("shape", dir);
    snprintf(args, sizeof args, "--config %s --steps 2 --save %s", cfg, dir);
    train_ok(2, args);
    /* n_head */
    char other[2048];
    snprintf(other, sizeof other, "%s", json);
    subst(other, sizeof other, "\"n_head\": 2", "\"n_head\": 4");
    write_text(zpp_test_tmp_path("shape_heads.json", cfg), "%s", other);
    snprintf(args, sizeof args, "--config %s --steps 4 --resume %s", cfg, dir);
    expect_clean_failure(2, args, "n_head");
    /* dtype */
    snprintf(other, sizeof other, "%s", json);
    subst(other, sizeof other, "\"enabled\": true", "\"enabled\": false");
    write_text(zpp_test_tmp_path("shape_fp32.json", cfg), "%s", other);
    snprintf(args, sizeof args, "--config %s --steps 4 --resume %s", cfg, dir);
    expect_clean_failure(2, args, "dtype");
    /* ZeRO++ switches */
    model_json(other, sizeof other, 1,
               "\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,"
               " \"zero_quantized_weights\": true, \"zero_quantized_gradients\": true}");
    write_text(zpp_test_tmp_path("shape_zeropp.json", cfg), "%s", other);
    snprintf(args, sizeof args, "--config %s --steps 4 --node-size 1 --resume %s", cfg, dir);
    int rc = run_train_env(2, NULL, args, zpp_test_tmp_path("shape_out.txt", out),
                           zpp_test_tmp_path("shape_err.txt", err));
    EXPECT(rc == 0, "resume with ZeRO++ switched on failed; see %s", err);
    EXPECT(zpp_test_count_lines(out, "changed since the save") == 1 &&
               zpp_test_count_lines(out, "ZeRO++ mode: zero3 -> qwz+qgz") == 1 &&
               zpp_test_count_lines(out, "node size: 2 -> 1") == 1 &&
               zpp_test_count_lines(out, "zero_optimization.zero_quantized_weights: false -> "
                                         "true") == 1,
           "the resume did not report the changed mode, keys and node size in one note; see %s",
           out);
}

/* `--save` into a folder that cannot be created fails before step 1 (one
 * line naming it, no step trained); resuming a checkpoint at or past
 * --steps says there is nothing to train and exits non-zero. */
static void test_checkpoint_cli_checks(void) {
    char cfg[512], json[2048], args[4096], file[512], met[512], dir[512];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(zpp_test_tmp_path("cli.json", cfg), "%s", json);
    write_text(zpp_test_tmp_path("cli_file", file), "a file, not a folder\n");
    snprintf(args, sizeof args, "--config %s --steps 3 --metrics %s --save %s/sub", cfg,
             zpp_test_tmp_path("cli.jsonl", met), file);
    expect_clean_failure(2, args, "cli_file");
    double loss[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == 0,
           "steps were trained before the unusable --save folder was noticed");
    /* a checkpoint at step 3; --steps 3 and 2 */
    snprintf(args, sizeof args, "--config %s --steps 3 --save %s", cfg,
             zpp_test_tmp_path("cli_ck", dir));
    train_ok(2, args);
    for (int steps = 3; steps >= 2; steps--) {
        snprintf(args, sizeof args, "--config %s --steps %d --resume %s", cfg, steps, dir);
        expect_clean_failure(2, args, "nothing to train");
    }
}

/* ---- A stalled rank (issue 14) --------------------------------------------
 * 4 ranks with --collective-timeout 10 train until the metrics show two
 * steps; then rank 2 is stopped (SIGSTOP). Each rank's shell wrapper wrote
 * its pid before exec'ing zeropp, so the test knows whom to stop without a
 * hook in the tool. Every live rank must be gone within 40 s, mpirun must
 * exit non-zero, and stderr must hold a line naming the stalled collective,
 * its communicator, the deadline and the step. Then the stopped rank is
 * continued and killed if anything of it is left, and no rank may remain. */

/* 1 while `pid` exists and is not a zombie. */
static int pid_alive(pid_t pid) {
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *p = strrchr(stat, ')'); /* "pid (comm) S ..." */
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Launches `zeropp train ARGS --steps 1000000 --metrics ...` on W ranks
 * (stderr to `err`, named after `tag`), waits until two steps are logged,
 * stops rank `stalled` with SIGSTOP and waits up to `bound` s for mpirun and
 * every live rank to end. Then continues and kills the stopped rank, and
 * checks that mpirun failed and no rank is left. Returns the seconds from
 * the stop to the end. */
static double stall_one_rank(int W, int stalled, const char *tag, const char *args,
                             double bound, char *err) {
    enum { MAXW = 8 };
    char cfg[512], json[2048], met[512], pids[512], cmd[4096], name[128];
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    EXPECT(W <= MAXW && stalled < W);
    model_json(json, sizeof json, 0, "\"train_micro_batch_size_per_gpu\": 2");
    snprintf(name, sizeof name, "%s.json", tag);
    write_text(zpp_test_tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "%s_pid", tag);
    zpp_test_tmp_path(name, pids);
    snprintf(name, sizeof name, "%s.jsonl", tag);
    zpp_test_tmp_path(name, met);
    snprintf(name, sizeof name, "%s_err.txt", tag);
    zpp_test_tmp_path(name, err);
    snprintf(cmd, sizeof cmd,
             "exec %s --oversubscribe --bind-to none -np %d sh -c 'echo $$ > "
             "%s.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}; exec %s train --quiet --config %s "
             "--steps 1000000 %s --metrics %s' >/dev/null 2>%s",
             mpi, W, pids, cli, cfg, args, met, err);
    pid_t job = fork();
    EXPECT(job >= 0, "fork: %s", strerror(errno));
    if (job == 0) {
        setpgid(0, 0); /* its own group: the cleanup below can end all of it */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(job, job);
    /* Training runs: every pid is known and two steps are logged. */
    pid_t rank_pid[MAXW] = {0};
    double t0 = mono_s();
    int ready = 0;
    while (!ready && mono_s() - t0 < 180) {
        ready = 1;
        for (int r = 0; r < W; r++) {
            char path[600];
            snprintf(path, sizeof path, "%s.%d", pids, r);
            FILE *f = fopen(path, "r");
            int v = 0;
            if (f && fscanf(f, "%d", &v) == 1) rank_pid[r] = (pid_t)v;
            if (f) fclose(f);
            if (!rank_pid[r]) ready = 0;
        }
        double loss[MAX_STEPS];
        FILE *m = fopen(met, "r");
        if (m) fclose(m);
        if (ready && (!m || zpp_test_read_metric(met, "loss", loss, MAX_STEPS) < 2)) ready = 0;
        if (!ready) {
            int status;
            EXPECT(waitpid(job, &status, WNOHANG) == 0, "the job ended before the stall; see %s",
                   err);
            usleep(100000);
        }
    }
    if (!ready) kill(-job, SIGKILL);
    EXPECT(ready, "training did not start within 180 s; see %s", err);

    EXPECT(kill(rank_pid[stalled], SIGSTOP) == 0, "SIGSTOP rank %d: %s", stalled,
           strerror(errno));
    double stopped = mono_s();
    int status = 0, done = 0;
    while (mono_s() - stopped < bound) {
        int live = 0;
        for (int r = 0; r < W; r++) live += r != stalled && pid_alive(rank_pid[r]);
        pid_t w = done ? job : waitpid(job, &status, WNOHANG);
        if (w == job) done = 1;
        if (done && !live) break;
        usleep(100000);
    }
    double took = mono_s() - stopped;
    int live = 0;
    for (int r = 0; r < W; r++) live += r != stalled && pid_alive(rank_pid[r]);
    /* whatever happened, leave nothing behind */
    kill(rank_pid[stalled], SIGCONT);
    if (pid_alive(rank_pid[stalled])) kill(rank_pid[stalled], SIGKILL);
    if (!done) {
        kill(-job, SIGCONT);
        kill(-job, SIGKILL);
        waitpid(job, &status, 0);
    }
    EXPECT(done && live == 0, "%d live rank(s) still running %.0f s after rank %d stopped "
           "(mpirun %s); see %s", live, took, stalled, done ? "ended" : "still running", err);
    EXPECT(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "mpirun exited 0 after a stall");
    for (double t1 = mono_s(); mono_s() - t1 < 10;) {
        int any = 0;
        for (int r = 0; r < W; r++) any += pid_alive(rank_pid[r]);
        if (!any) break;
        usleep(100000);
    }
    for (int r = 0; r < W; r++)
        EXPECT(!pid_alive(rank_pid[r]), "rank %d (pid %d) is still running", r, (int)rank_pid[r]);
    return took;
}

/* Whether a line names the collective that timed out (or was refused). */
static int names_collective(const char *line) {
    static const char *const ops[] = {"allgather", "reduce_scatter", "alltoall",
                                      "allreduce", "broadcast",      "barrier",
                                      "agree",     "max over the world", "topology setup"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strstr(line, ops[i])) return 1;
    return 0;
}

static void test_stalled_rank_times_out(void) {
    enum { W = 4, STALLED = 2 };
    char err[512];
    double took = stall_one_rank(W, STALLED, "stall", "--collective-timeout 10", 40, err);
    /* the line: which collective, where, for how long, at which step */
    FILE *f = fopen(err, "r");
    EXPECT(f != NULL, "no stderr file %s", err);
    char line[4096] = "", l[4096];
    while (fgets(l, sizeof l, f))
        if (strstr(l, "no peer answered for 10 s")) snprintf(line, sizeof line, "%s", l);
    fclose(f);
    EXPECT(line[0], "no line names the timeout; see %s", err);
    EXPECT(strstr(line, "(a rank stalled or died); every rank stops") &&
               strstr(line, " communicator (") && strstr(line, " bytes)") &&
               names_collective(line),
           "the line does not name the collective: %s", line);
    EXPECT(strstr(line, "step ") != NULL, "the line does not name the step: %s", line);
    printf("  stopped rank %d; every rank gone after %.1f s\n  %s", STALLED, took, line);
}

/* ---- Stalls that say where (issue 29) ----------------------------------------
 * 4 ranks on two emulated nodes with qgZ (its all-to-alls run on intra and
 * inter, so one stopped rank holds up three communicators) and a 2 s
 * deadline; rank 2 is stopped. The job must end within 30 s, every line
 * the tool prints must name the collective that timed out (not a later
 * refusal's "destroy the topology"), and at least one must name the
 * stopped rank. Before, the cleanup's message replaced the timeout's in
 * most runs, and no run named the rank. */
static void test_stalled_rank_named(void) {
    enum { W = 4, STALLED = 2 };
    char err[512];
    double took = stall_one_rank(W, STALLED, "stall_named",
                                 "--collective-timeout 2 --node-size 2 "
                                 "--set zero_optimization.zero_quantized_gradients=true",
                                 30, err);
    FILE *f = fopen(err, "r");
    EXPECT(f != NULL, "no stderr file %s", err);
    char l[4096], who[4096] = "";
    int lines = 0;
    while (fgets(l, sizeof l, f)) {
        if (strncmp(l, "zeropp", 6) != 0) continue; /* mpirun's own notes */
        lines++;
        EXPECT(strstr(l, "no peer answered for 2 s") && names_collective(l) &&
                   strstr(l, " communicator (") && strstr(l, "step "),
               "a line does not name the timed-out collective, its communicator and step: %s",
               l);
        EXPECT(!strstr(l, "destroy the topology"), "a cleanup's line: %s", l);
        char needle[64], entered[64];
        snprintf(needle, sizeof needle, "rank %d did not arrive (pid ", STALLED);
        snprintf(entered, sizeof entered, "rank %d entered it but pid ", STALLED);
        if ((strstr(l, needle) || strstr(l, entered)) && strstr(l, "is stopped"))
            snprintf(who, sizeof who, "%s", l);
    }
    fclose(f);
    EXPECT(lines > 0, "no line says why the job stopped; see %s", err);
    EXPECT(who[0], "no line names the stopped rank %d; see %s", STALLED, err);
    printf("  stopped rank %d; every rank gone after %.1f s; %d line(s)\n  %s", STALLED, took,
           lines, who);
}

/* ---- Hostile input (issue 14): numbers, flags, files, JSON ----------------- */

/* Runs `cmd` (a shell line that ends by redirecting stderr to err) under
 * `timeout secs`; returns the exit code (124: timed out) and the seconds
 * it took. */
static int run_timed(int secs, const char *cmd, double *seconds) {
    char line[4096];
    snprintf(line, sizeof line, "timeout %d %s", secs, cmd);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = system(line);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    EXPECT(rc != -1, "system() failed");
    if (seconds)
        *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    EXPECT(WIFEXITED(rc), "killed by a signal: %s", line);
    return WEXITSTATUS(rc);
}

/* Integers are range-checked for the field they land in: 2^31 and 2^32 + 2
 * used to wrap to 0 and 2 steps (or a node size of 2). The error names the
 * range, once, with 2 ranks. */
static void test_cli_integers_range_checked(void) {
    expect_clean_failure(2, "--steps 2147483648", "[0, 2147483647]");
    expect_clean_failure(2, "--steps 4294967298", "[0, 2147483647]");
    expect_clean_failure(2, "--node-size 4294967298", "[1, 2147483647]");
    expect_clean_failure(2, "--eval-every=4294967296", "[0, 2147483647]");
    expect_clean_failure(2, "--save-every 2147483648 --save /tmp/x", "--save-every");
    expect_clean_failure(2, "--seed 1e20", "--seed");
}

/* --flag=value works as --flag value does; an unknown flag is named unknown
 * wherever it is (it was "needs a value" at the end of the line); each
 * argument error is printed once with 2 ranks, by train and bench comm. */
static void test_cli_flag_syntax(void) {
    char met[512], args[1024], err[512];
    snprintf(args, sizeof args, "--steps=3 --seed=5 --eval-every=0 --metrics=%s",
             zpp_test_tmp_path("eq_metrics.jsonl", met));
    EXPECT(run_train(2, args, zpp_test_tmp_path("eq_err.txt", err)) == 0, "'%s' failed; see %s",
           args, err);
    EXPECT(zpp_test_count_lines(met, "\"step\"") == 3, "--steps=3 did not run 3 steps; see %s",
           met);

    expect_clean_failure(2, "--steps 2 --bogus", "unknown option '--bogus'");
    expect_clean_failure(2, "--bogus --steps 2", "unknown option '--bogus'");
    expect_clean_failure(2, "--bogus=1 --steps 2", "unknown option '--bogus'");
    expect_clean_failure(2, "--steps 2 --data", "--data needs a value");
    expect_clean_failure(2, "--quiet=1", "takes no value");
    expect_clean_failure(2, "--device tpu", "--device");

    /* bench comm parses with the same code: its errors come once too */
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s --oversubscribe --bind-to none -np 2 %s bench comm --params 1k --bogus "
             ">/dev/null 2>%s",
             mpi, cli, zpp_test_tmp_path("bench_err.txt", err));
    EXPECT(run_timed(120, cmd, NULL) != 0, "bench comm took an unknown option");
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1 &&
               zpp_test_count_lines(err, "unknown option '--bogus'") == 1,
           "bench comm: expected one line naming the unknown option; see %s", err);
}

/* A FIFO as --data or --config blocked forever in open(); now it is refused
 * at once (the timeout turns a regression into a failure, not a hang). */
static void test_fifo_inputs_refused(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char fifo[512], err[512], cmd[2048];
    zpp_test_tmp_path("input.fifo", fifo);
    EXPECT(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    const char *flags[] = {"--data", "--config"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s --oversubscribe --bind-to none -np 2 %s train --quiet --steps 1 %s %s "
                 ">/dev/null 2>%s",
                 mpi, cli, flags[i], fifo, zpp_test_tmp_path("fifo_err.txt", err));
        double secs = 0;
        int rc = run_timed(60, cmd, &secs);
        EXPECT(rc != 124, "%s FIFO: hung (killed after 60 s)", flags[i]);
        EXPECT(rc != 0, "%s FIFO: succeeded", flags[i]);
        EXPECT(zpp_test_count_lines(err, "zeropp") == 1 && zpp_test_count_lines(err, "FIFO") == 1,
               "%s FIFO: expected one line saying it is a FIFO; see %s", flags[i], err);
        /* the refusal itself is immediate; the rest is mpirun's start-up */
        EXPECT(secs < 30, "%s FIFO: took %.1f s", flags[i], secs);
    }
    /* a directory as --config is refused the same way */
    char dir[512];
    zpp_test_tmp_path("", dir); /* the test's folder itself */
    snprintf(cmd, sizeof cmd, "--config %s --steps 1", dir);
    expect_clean_failure(1, cmd, "a directory");
}

/* The data file was memory-mapped: truncating it during a run killed every
 * rank with SIGBUS. Now the reads are pread()s and the run ends with one
 * line saying the file shrank, and a non-zero exit. */
static void test_data_truncated_during_run(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char data[512], met[512], err[512], cfg[512], json[2048], cmd[4096];
    /* 64 KiB of text */
    FILE *f = fopen(zpp_test_tmp_path("shrinking.txt", data), "w");
    EXPECT(f != NULL);
    for (int i = 0; i < 1500; i++) fprintf(f, "line %d of a text that will shrink.\n", i);
    fclose(f);
    model_json(json, sizeof json, 0, "");
    write_text(zpp_test_tmp_path("shrink.json", cfg), "%s", json);
    zpp_test_tmp_path("shrink_metrics.jsonl", met);
    zpp_test_tmp_path("shrink_err.txt", err);
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np 2 %s train --quiet --config %s "
             "--data %s --steps 1000000 --metrics %s >/dev/null 2>%s",
             mpi, cli, cfg, data, met, err);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* wait for the first step in the metrics, then cut the file */
    int waited = 0;
    while (zpp_test_count_lines(met, "\"step\"") < 1 && waited < 2000) {
        usleep(100000);
        waited++;
    }
    EXPECT(zpp_test_count_lines(met, "\"step\"") >= 1, "no step in %s after 200 s; see %s", met,
           err);
    EXPECT(truncate(data, 0) == 0, "truncate %s: %s", data, strerror(errno));
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status), "the run was killed by a signal");
    int code = WEXITSTATUS(status);
    EXPECT(code != 124, "the run did not stop after the data file shrank (timed out)");
    EXPECT(code != 0, "the run succeeded on a data file truncated under it");
    EXPECT(zpp_test_count_lines(err, "signal") == 0 && zpp_test_count_lines(err, "SIGBUS") == 0,
           "a rank died of a signal; see %s", err);
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1 &&
               zpp_test_count_lines(err, "shrank from") == 1,
           "expected one line saying the data file shrank; see %s", err);
}

/* cJSON takes "lr\u0000x" as the key "lr" and 01 as 1; both are refused,
 * with the byte offset. */
static void test_json_strict(void) {
    char cfg[512], args[1024];
    write_text(zpp_test_tmp_path("nul_key.json", cfg),
               "{\"optimizer\": {\"params\": {\"lr\\u0000x\": 0.1}}}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "\\u0000");
    expect_clean_failure(2, args, "byte offset 29");
    write_text(zpp_test_tmp_path("nul_value.json", cfg),
               "{\"optimizer\": {\"type\": \"AdamW\\u0000\"}}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "\\u0000");
    write_text(zpp_test_tmp_path("leading_zero.json", cfg), "{\"steps_per_print\": 01}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "leading zero");
    write_text(zpp_test_tmp_path("plus.json", cfg), "{\"steps_per_print\": +1}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "malformed JSON"); /* cJSON refuses this one itself */
}

/* A run resumed after skipped steps, under fp16's dynamic loss scaling,
 * continues as the uninterrupted one, bit for bit: the checkpoint carries
 * AdamW's update count (which a skip does not advance) and the scaler's
 * state (scale, hysteresis, iterations, last overflow), not only the step.
 * A scale of 2^24 overflows fp16 at first, so the first steps are skipped
 * while the scale falls; ZPP_FAULT adds a skip after the save point. */
static void test_resume_after_skips_bitwise(void) {
    char cfg[512], met[512], err[512], json[2048], args[2048], dir[512];
    model_json(json, sizeof json, 0,
               "\"train_micro_batch_size_per_gpu\": 2, \"fp16\": {\"enabled\": true,"
               " \"loss_scale\": 0, \"initial_scale_power\": 24, \"hysteresis\": 2,"
               " \"loss_scale_window\": 3}");
    write_text(zpp_test_tmp_path("skips.json", cfg), "%s", json);
    zpp_test_tmp_path("skips_dir", dir);
    double full[MAX_STEPS], resumed[MAX_STEPS], scale_full[MAX_STEPS], scale_res[MAX_STEPS];
    int skipped[MAX_STEPS];
    setenv("ZPP_FAULT", "nonfinite@9", 1);
    snprintf(args, sizeof args, "--config %s --steps 12 --metrics %s", cfg,
             zpp_test_tmp_path("skips_full.jsonl", met));
    EXPECT(run_train(2, args, zpp_test_tmp_path("skips_err.txt", err)) == 0, "see %s", err);
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == 12);
    EXPECT(zpp_test_read_metric(met, "loss_scale", scale_full, MAX_STEPS) == 12);
    EXPECT(read_skipped(met, skipped, MAX_STEPS) == 12);
    int before = 0;
    for (int i = 0; i < 6; i++) before += skipped[i];
    EXPECT(before >= 1 && skipped[8], "expected skips before the save and at step 9");
    snprintf(args, sizeof args, "--config %s --steps 6 --save %s", cfg, dir);
    EXPECT(run_train(2, args, err) == 0, "save failed, see %s", err);
    snprintf(args, sizeof args, "--config %s --steps 12 --resume %s --metrics %s", cfg, dir,
             zpp_test_tmp_path("skips_resumed.jsonl", met));
    EXPECT(run_train(2, args, err) == 0, "resume failed, see %s", err);
    unsetenv("ZPP_FAULT");
    EXPECT(zpp_test_read_metric(met, "loss", resumed, MAX_STEPS) == 6);
    EXPECT(zpp_test_read_metric(met, "loss_scale", scale_res, MAX_STEPS) == 6);
    for (int i = 0; i < 6; i++) {
        EXPECT(resumed[i] == full[6 + i] || (isnan(resumed[i]) && isnan(full[6 + i])),
               "step %d: resumed %a, uninterrupted %a", 7 + i, resumed[i], full[6 + i]);
        EXPECT(scale_res[i] == scale_full[6 + i], "step %d: loss scale %g, uninterrupted %g",
               7 + i, scale_res[i], scale_full[6 + i]);
    }
}

/* `zeropp train --profile` writes the step's profile into the metrics
 * (expect_profile_fields), with qwZ + hpZ + qgZ on 2 nodes of 2; without
 * the flag the fields are absent. */
static void test_profile_metrics(void) {
    char cfg[512], met[512], err[512], json[2048], args[2048];
    model_json(json, sizeof json, 1,
               "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true,"
               " \"zero_hpz_partition_size\": 2, \"zero_quantized_gradients\": true}");
    write_text(zpp_test_tmp_path("profile.json", cfg), "%s", json);
    zpp_test_tmp_path("profile.jsonl", met);
    snprintf(args, sizeof args, "--config %s --steps 3 --profile --metrics %s", cfg, met);
    int rc = run_train(4, args, zpp_test_tmp_path("profile_err.txt", err));
    EXPECT(rc == 0, "--profile: exit %d; stderr in %s", rc, err);
    expect_profile_fields(met, 3);
    snprintf(args, sizeof args, "--config %s --steps 1 --metrics %s", cfg, met);
    rc = run_train(4, args, err);
    EXPECT(rc == 0, "exit %d; stderr in %s", rc, err);
    double x[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met, "loss", x, MAX_STEPS) == 1 &&
               zpp_test_read_metric(met, "exposed_comm_ms", x, MAX_STEPS) == 0,
           "profile fields without --profile");
}

/* ---- Resume and eval that remember (issue 28), resume that notices (29) ----
 * A 2-rank run on a text file of random words, WarmupCosineLR over the
 * run's own length (total_num_steps 0), ZeRO++ with hpZ sized from the node
 * (zero_hpz_partition_size 0), checkpoints every 4 of 8 steps. */

#define RW_STEPS 8
#define RW_T 16 /* model_json's seq_len at width 32 */

static const char *rw_extra =
    "\"train_micro_batch_size_per_gpu\": 2, \"scheduler\": {\"type\": \"WarmupCosineLR\","
    " \"params\": {\"warmup_num_steps\": 2, \"warmup_type\": \"linear\", \"cos_min_ratio\": 0.1}},"
    " \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true,"
    " \"zero_hpz_partition_size\": 0, \"zero_quantized_gradients\": true}";

/* A text of random words (fresh each run); returns its length in bytes. */
static size_t write_random_text(const char *path, uint64_t stream) {
    static const char *words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran",
                                  "to", "its", "red", "ball", "under", "green", "tree", "while",
                                  "birds", "sang", "softly"};
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream));
    static char text[48000];
    size_t n = 0;
    while (n + 16 < sizeof text) {
        const char *w = words[zpp_rng_u64(&r) % 20];
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%s", w,
                              zpp_rng_u64(&r) % 9 ? " " : ".\n");
    }
    zpp_test_write_file(path, text, n);
    return n;
}

/* Runs `[mpirun -np np] zeropp ARGS` (np 0: no launcher), stdout and
 * stderr to files; returns the exit code. */
static int run_zeropp(int np, const char *args, const char *out, const char *err) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    char cmd[4096], launch[1024] = "";
    if (np > 0)
        snprintf(launch, sizeof launch, "%s --oversubscribe --bind-to none -np %d ", mpi, np);
    snprintf(cmd, sizeof cmd, "timeout 240 %s%s %s >%s 2>%s", launch, cli, args, out, err);
    int rc = system(cmd);
    EXPECT(rc != -1 && WIFEXITED(rc), "system() failed: %s", cmd);
    EXPECT(WEXITSTATUS(rc) != 124, "timed out (hang?): %s", cmd);
    return WEXITSTATUS(rc);
}

/* A file's text, NUL-terminated (free it). */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "cannot open %s: %s", path, strerror(errno));
    char *text = malloc(1 << 16);
    EXPECT(text != NULL);
    size_t n = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

/* The number after "key": in a JSON line. */
static double json_field(const char *text, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(text, k);
    EXPECT(p != NULL, "no %s in %s", k, text);
    return strtod(p + strlen(k), NULL);
}

/* The run every case below starts from: config `cfg`, data `data`, 8 steps
 * with a checkpoint every 4 in `dir`, metrics in `met` (losses in full). */
static void rw_fixture(const char *tag, char *cfg, char *data, char *dir, char *met,
                       double *full, const char *more) {
    char json[2048], args[4096], name[64];
    model_json(json, sizeof json, 0, rw_extra);
    snprintf(name, sizeof name, "%s.json", tag);
    write_text(zpp_test_tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "%s.txt", tag);
    write_random_text(zpp_test_tmp_path(name, data), 21);
    snprintf(name, sizeof name, "%s_ckpt", tag);
    zpp_test_tmp_path(name, dir);
    snprintf(name, sizeof name, "%s_full.jsonl", tag);
    snprintf(args, sizeof args,
             "--config %s --data %s --steps %d --save %s --save-every 4 --metrics %s %s", cfg,
             data, RW_STEPS, dir, zpp_test_tmp_path(name, met), more);
    train_ok(2, args);
    EXPECT(zpp_test_read_metric(met, "loss", full, MAX_STEPS) == RW_STEPS);
}

/* `--resume DIR` alone continues with everything the checkpoint was saved
 * with — model, optimizer, schedule and its length, ZeRO++ options, data
 * file, seed — bit for bit as the run that never stopped, and has nothing
 * to note. */
static void test_resume_without_config_bitwise(void) {
    char cfg[512], data[512], dir[512], met[512], args[4096], out[512], err[512];
    double full[MAX_STEPS], got[MAX_STEPS];
    rw_fixture("rw", cfg, data, dir, met, full, "");
    EXPECT(zpp_test_count_lines(met, "\"mode\":\"qwz+hpz+qgz\"") == RW_STEPS,
           "hpZ sized from the node did not run; see %s", met);
    snprintf(args, sizeof args, "train --quiet --resume %s/step-00000004 --metrics %s", dir,
             zpp_test_tmp_path("rw_resumed.jsonl", met));
    int rc = run_zeropp(2, args, zpp_test_tmp_path("rw_out.txt", out),
                        zpp_test_tmp_path("rw_err.txt", err));
    EXPECT(rc == 0, "resume without --config: exit %d; see %s", rc, err);
    EXPECT(zpp_test_read_metric(met, "loss", got, MAX_STEPS) == RW_STEPS - 4,
           "the resumed run did not take its length from the checkpoint; see %s", met);
    for (int i = 0; i < RW_STEPS - 4; i++)
        EXPECT(got[i] == full[4 + i], "step %d: resumed %a, uninterrupted %a", 5 + i, got[i],
               full[4 + i]);
    EXPECT(zpp_test_count_lines(met, "\"mode\":\"qwz+hpz+qgz\"") == RW_STEPS - 4);
    EXPECT(zpp_test_count_lines(out, "resumed from") == 1 &&
               zpp_test_count_lines(out, "changed since the save") == 0 &&
               zpp_test_count_lines(out, "raw text data") == 1,
           "expected a quiet resume on the saved text file; see %s", out);
}

/* What changed since the save is listed in one note: a --set lr and
 * --steps 16 (key: old -> new each, and the lr of step 5 before and after,
 * as zpp_train_lr gives it under each config, with the cosine's new length);
 * a --config with other betas and data order and another --data file (the
 * config wins). Another model shape is refused. */
static void test_resume_note_lists_changes(void) {
    char cfg[512], data[512], dir[512], met[512], args[4096], out[512], err[512], sub[600];
    double full[MAX_STEPS], lr[MAX_STEPS];
    rw_fixture("note", cfg, data, dir, met, full, "");
    snprintf(sub, sizeof sub, "%s/step-00000004", dir);
    snprintf(args, sizeof args,
             "train --quiet --resume %s --set optimizer.params.lr=0.004 --steps 16 --metrics %s",
             sub, zpp_test_tmp_path("note_resumed.jsonl", met));
    int rc = run_zeropp(2, args, zpp_test_tmp_path("note_out.txt", out),
                        zpp_test_tmp_path("note_err.txt", err));
    EXPECT(rc == 0, "resume with a new lr and length: exit %d; see %s", rc, err);
    /* the schedule function itself, under the saved config and this one */
    char json[2048];
    model_json(json, sizeof json, 0, rw_extra);
    zpp_train_config was, is;
    EXPECT_OK(zpp_train_config_defaults(&was));
    EXPECT_OK(zpp_train_config_load_string(json, &was));
    was.train_steps = RW_STEPS;
    is = was;
    is.optimizer.lr = 0.004;
    is.train_steps = 16;
    const double a = zpp_train_lr(&was, 4), b = zpp_train_lr(&is, 4);
    char line[256];
    snprintf(line, sizeof line,
             "  lr at step 5, the first trained now: %.6g -> %.6g (x%.3g); the WarmupCosineLR "
             "schedule's length: 8 -> 16 steps",
             a, b, b / a);
    EXPECT(zpp_test_count_lines(out, "resume: changed since the save:") == 1 &&
               zpp_test_count_lines(out, "  optimizer.params.lr: 0.001 -> 0.004") == 1 &&
               zpp_test_count_lines(out, "  zeropp.train_steps: 8 -> 16") == 1 &&
               zpp_test_count_lines(out, line) == 1,
           "the note lacks a line (expected, among others, '%s'); see %s", line, out);
    EXPECT(zpp_test_count_lines(out, " -> ") == 3, "the note lists more than changed; see %s",
           out);
    EXPECT(zpp_test_read_metric(met, "lr", lr, MAX_STEPS) == 12);
    EXPECT(fabs(lr[0] - b) <= 1e-5 * b, "step 5 ran at lr %g; the note says %g", lr[0], b);

    /* --config wins over the saved config; another data file */
    char cfg2[512], json2[2048], data2[512];
    snprintf(json2, sizeof json2, "%s", json);
    subst(json2, sizeof json2, "[0.9, 0.95]", "[0.8, 0.9]");
    subst(json2, sizeof json2, "\"seed\": 7", "\"seed\": 7, \"data_order\": \"sequential\"");
    write_text(zpp_test_tmp_path("note2.json", cfg2), "%s", json2);
    write_random_text(zpp_test_tmp_path("note_other.txt", data2), 22);
    snprintf(args, sizeof args, "train --quiet --resume %s --config %s --data %s --steps 8", sub,
             cfg2, data2);
    rc = run_zeropp(2, args, out, err);
    EXPECT(rc == 0, "resume with --config: exit %d; see %s", rc, err);
    EXPECT(zpp_test_count_lines(out, "  optimizer.params.betas: [0.9, 0.95] -> [0.8, 0.9]") == 1 &&
               zpp_test_count_lines(out, "  zeropp.data_order: shuffled -> sequential") == 1 &&
               zpp_test_count_lines(out, "note_other.txt") == 1 &&
               zpp_test_count_lines(out, "lr at step") == 0,
           "the note does not list the config's changes (and only them); see %s", out);
    /* the model's shape cannot change */
    snprintf(args, sizeof args, "--resume %s --set model.n_layer=3 --steps 8", sub);
    expect_clean_failure(2, args, "n_layer");
}

/* `zeropp eval DIR` scores the checkpoint on the held-out split of its own
 * data: on the ranks that trained it, the run's last validation loss bit
 * for bit; perplexity = exp(loss); the split named and sized. One rank
 * scores the same batches (the sum in another order); --split train reads
 * the first part of the file. */
static void test_eval_checkpoint(void) {
    char cfg[512], data[512], dir[512], met[512], args[4096], out[512], err[512];
    double full[MAX_STEPS], val[MAX_STEPS];
    rw_fixture("ev", cfg, data, dir, met, full, "--eval-every 4");
    EXPECT(zpp_test_read_metric(met, "val_loss", val, MAX_STEPS) == 2);
    struct stat sb;
    EXPECT(stat(data, &sb) == 0);
    const size_t n = (size_t)sb.st_size;
    const size_t n_val = n / 10 > RW_T + 1 ? n / 10 : RW_T + 1, n_train = n - n_val;
    snprintf(args, sizeof args, "eval %s --json", dir);
    int rc = run_zeropp(2, args, zpp_test_tmp_path("ev_out.txt", out),
                        zpp_test_tmp_path("ev_err.txt", err));
    EXPECT(rc == 0, "eval: exit %d; see %s", rc, err);
    char *j = read_text(out);
    const double loss = json_field(j, "loss"), ppl = json_field(j, "perplexity");
    EXPECT(loss == val[1], "eval on 2 ranks %.9g, the run's last validation loss %.9g", loss,
           val[1]);
    EXPECT(fabs(ppl - exp(loss)) <= 1e-8 * exp(loss), "perplexity %.9g, exp(loss) %.9g", ppl,
           exp(loss));
    EXPECT(strstr(j, "\"split\":\"val\"") && json_field(j, "step") == RW_STEPS &&
               json_field(j, "split_begin") == (double)n_train &&
               json_field(j, "split_end") == (double)n && json_field(j, "batches") == 8 &&
               json_field(j, "tokens") == 8 * 2 * RW_T,
           "the held-out split of %zu bytes is [%zu, %zu), 4 x 2 batches; got %s", n, n_train, n,
           j);
    free(j);
    /* one rank, for people */
    snprintf(args, sizeof args, "eval %s", dir);
    EXPECT(run_zeropp(0, args, out, err) == 0, "eval on one rank failed; see %s", err);
    char want[160];
    snprintf(want, sizeof want, "the last tenth, bytes [%zu, %zu)", n_train, n);
    EXPECT(zpp_test_count_lines(out, "held-out split") == 1 &&
               zpp_test_count_lines(out, want) == 1 &&
               zpp_test_count_lines(out, "perplexity") == 1,
           "eval does not say what it read ('%s'); see %s", want, out);
    j = read_text(out);
    const char *p = strstr(j, "\nloss ");
    EXPECT(p != NULL, "no loss line in %s", out);
    double l1 = strtod(p + 6, NULL);
    EXPECT(fabs(l1 - val[1]) <= 1e-5 * val[1], "one rank: %.9g vs %.9g", l1, val[1]);
    free(j);
    /* the training split */
    snprintf(args, sizeof args, "eval %s --split train --json", dir);
    EXPECT(run_zeropp(0, args, out, err) == 0, "eval --split train failed; see %s", err);
    j = read_text(out);
    EXPECT(strstr(j, "\"split\":\"train\"") && json_field(j, "split_begin") == 0 &&
               json_field(j, "split_end") == (double)n_train && json_field(j, "loss") > 0,
           "%s", j);
    free(j);
    /* not a checkpoint: one line */
    snprintf(args, sizeof args, "eval %s", data);
    EXPECT(run_zeropp(0, args, out, err) != 0 && zpp_test_count_lines(err, "zeropp") == 1 &&
               zpp_test_count_lines(err, "is not a checkpoint") == 1,
           "eval of a text file; see %s", err);
}

/* --set overrides a config key without a file (the effect in the metrics:
 * the lr, the mode); an unknown key, or flag, fails with the likeliest one
 * meant. The header counts one rank as one rank. */
static void test_set_and_did_you_mean(void) {
    char met[512], args[2048], out[512], err[512];
    snprintf(args, sizeof args,
             "--set optimizer.params.lr=0.0123 --set zero_optimization.zero_quantized_weights=true "
             "--steps 2 --metrics %s",
             zpp_test_tmp_path("set.jsonl", met));
    train_ok(2, args);
    double lr[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met, "lr", lr, MAX_STEPS) == 2 && lr[0] == 0.0123 &&
               lr[1] == 0.0123 && zpp_test_count_lines(met, "\"mode\":\"qwz\"") == 2,
           "--set did not reach the run; see %s", met);
    expect_clean_failure(2, "--set zero_optimization.zero_quantized_weight=true --steps 2",
                         "did you mean 'zero_optimization.zero_quantized_weights'?");
    expect_clean_failure(2, "--set optimizer.params.lr=fast --steps 2", "'fast' is not a value");
    expect_clean_failure(2, "--stpes 2", "did you mean --steps?");
    snprintf(args, sizeof args, "train --steps 1");
    EXPECT(run_zeropp(1, args, zpp_test_tmp_path("one_out.txt", out),
                      zpp_test_tmp_path("one_err.txt", err)) == 0);
    EXPECT(zpp_test_count_lines(out, "train: 1 rank = 1 node of 1,") == 1 &&
               zpp_test_count_lines(out, "x 1 rank,") == 1 &&
               zpp_test_count_lines(out, "1 ranks") == 0,
           "the header miscounts one rank; see %s", out);
}


/* ---- One --save folder, one run (issue 29) -------------------------------- */

/* The "run_id" of a manifest file (16 hex digits) into out. */
static const char *manifest_run_id(const char *path, char *out) {
    char *t = read_text(path);
    const char *p = strstr(t, "\"run_id\":\"");
    EXPECT(p != NULL, "no run_id in %s", path);
    snprintf(out, 17, "%.16s", p + 10);
    free(t);
    return out;
}

static void copy_file(const char *from, const char *to) {
    unsigned char *b;
    size_t n;
    read_all(from, &b, &n);
    zpp_test_write_file(to, b, n);
    free(b);
}

/* Two jobs on one --save folder: while the first runs (it holds
 * DIR/.zeropp.lock), the second stops at start with one line naming the
 * holder's run, pid and host, and writes nothing; the first ends normally
 * with its checkpoints intact and removes its lock. */
static void test_checkpoint_two_jobs_one_folder(void) {
    char cfg[512], json[2048], args[2048], dir[512], lock[700], errA[512], err[512], cmd[4096];
    model_json(json, sizeof json, 0, "");
    write_text(zpp_test_tmp_path("twojobs.json", cfg), "%s", json);
    zpp_test_tmp_path("twojobs_ckpt", dir);
    snprintf(lock, sizeof lock, "%s/.zeropp.lock", dir);
    const int steps = 10000; /* about 10 s: the second job starts in about 1 */
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np 2 %s train --quiet --config %s "
             "--steps %d --save-every 1000 --save %s >/dev/null 2>%s",
             getenv("ZPP_MPIEXEC"), getenv("ZPP_CLI"), cfg, steps, dir,
             zpp_test_tmp_path("twojobs_a_err.txt", errA));
    pid_t a = fork();
    EXPECT(a >= 0, "fork: %s", strerror(errno));
    if (a == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* the first job's lock, written */
    char *holder = NULL;
    int ended = 0;
    for (int i = 0; i < 1200 && !holder && !ended; i++) {
        struct stat sb;
        if (stat(lock, &sb) == 0 && sb.st_size > 0) holder = read_text(lock);
        else if (waitpid(a, NULL, WNOHANG) == a) ended = 1;
        else usleep(100000);
    }
    EXPECT(holder != NULL, "the first job %s no %s; see %s",
           ended ? "ended with" : "wrote in 120 s", lock, errA);
    const char *p = strstr(holder, "\"pid\":");
    EXPECT(p != NULL, "no pid in %s: %s", lock, holder);
    char pid[64], run[17];
    snprintf(pid, sizeof pid, "pid %ld on host", strtol(p + 6, NULL, 10));
    p = strstr(holder, "\"run_id\":\"");
    EXPECT(p != NULL, "no run_id in %s: %s", lock, holder);
    snprintf(run, sizeof run, "%.16s", p + 10);
    free(holder);
    /* the second job, on the same folder */
    snprintf(args, sizeof args, "--config %s --steps 3 --save %s", cfg, dir);
    int rc = run_train(2, args, zpp_test_tmp_path("twojobs_b_err.txt", err));
    EXPECT(waitpid(a, NULL, WNOHANG) == 0,
           "the first job ended before the second was checked: lengthen it");
    EXPECT(rc != 0, "the second job on %s succeeded while the first ran", dir);
    EXPECT(zpp_test_count_lines(err, "zeropp") == 1 &&
               zpp_test_count_lines(err, "is in use by run") == 1 &&
               zpp_test_count_lines(err, run) == 1 && zpp_test_count_lines(err, pid) == 1 &&
               zpp_test_count_lines(err, "pass another --save") == 1,
           "expected one line naming run %s (%s ...); see %s", run, pid, err);
    int status = 0;
    EXPECT(waitpid(a, &status, 0) == a && WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the first job failed (status %d); see %s", status, errA);
    char why[1024];
    EXPECT(ckpt_dir_valid(dir, 2, steps, why, sizeof why), "the first job's checkpoint: %s", why);
    char mpath[700], mrun[17];
    snprintf(mpath, sizeof mpath, "%s/checkpoint.json", dir);
    EXPECT(!strcmp(manifest_run_id(mpath, mrun), run), "the checkpoint is run %s's, not %s's",
           mrun, run);
    EXPECT(access(lock, F_OK) != 0, "%s stayed after the run", lock);
}

/* A step folder holding a rank file of another run (two jobs that raced
 * into one folder) is refused at resume with one line naming the file and
 * both run ids; so is a folder whose manifest is another run's, beside the
 * pointer. Each run (the same config, another seed) has an id of its own;
 * a resumed run keeps the id of the run it continues. */
static void test_checkpoint_mixed_runs_refused(void) {
    char cfg[512], json[2048], args[2048], a[512], b[512], from[700], to[700], err[512];
    char ida[17], idb[17], mp[700], line[256];
    model_json(json, sizeof json, 0, "");
    write_text(zpp_test_tmp_path("mixed.json", cfg), "%s", json);
    zpp_test_tmp_path("mixed_a", a);
    zpp_test_tmp_path("mixed_b", b);
    snprintf(args, sizeof args, "--config %s --steps 3 --save %s", cfg, a);
    train_ok(2, args);
    snprintf(args, sizeof args, "--config %s --steps 3 --seed 8 --save %s", cfg, b);
    train_ok(2, args);
    snprintf(mp, sizeof mp, "%s/checkpoint.json", a);
    manifest_run_id(mp, ida);
    snprintf(mp, sizeof mp, "%s/checkpoint.json", b);
    manifest_run_id(mp, idb);
    EXPECT(strcmp(ida, idb) != 0, "two fresh runs share run id %s", ida);
    /* a resume continues run A: its next checkpoint keeps A's id */
    char c[512], idc[17];
    zpp_test_tmp_path("mixed_c", c);
    snprintf(args, sizeof args, "--config %s --steps 4 --resume %s --save %s", cfg, a, c);
    train_ok(2, args);
    snprintf(mp, sizeof mp, "%s/checkpoint.json", c);
    EXPECT(!strcmp(manifest_run_id(mp, idc), ida), "the resumed run saved as %s, not %s", idc,
           ida);
    /* rank 1's file of run B in run A's step folder */
    snprintf(from, sizeof from, "%s/step-00000003/rank-00001.ckpt", b);
    snprintf(to, sizeof to, "%s/step-00000003/rank-00001.ckpt", a);
    copy_file(from, to);
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s", cfg, a);
    expect_clean_failure(2, args, "mixes two runs");
    zpp_test_tmp_path("bad_err.txt", err);
    snprintf(line, sizeof line, "was saved by run %s", idb);
    EXPECT(zpp_test_count_lines(err, line) == 1 && zpp_test_count_lines(err, ida) == 1 &&
               zpp_test_count_lines(err, "step-00000003/rank-00001.ckpt") == 1 &&
               zpp_test_count_lines(err, "step-00000003/manifest.json") == 1,
           "the line names neither the file nor both runs (%s, %s); see %s", ida, idb, err);
    /* the step folder's manifest of run B beside A's pointer */
    snprintf(from, sizeof from, "%s/step-00000003/manifest.json", b);
    snprintf(to, sizeof to, "%s/step-00000003/manifest.json", a);
    copy_file(from, to);
    expect_clean_failure(2, args, "differ");
    EXPECT(zpp_test_count_lines(err, ida) == 1 && zpp_test_count_lines(err, idb) == 1,
           "the line does not name both runs (%s, %s); see %s", ida, idb, err);
}

/* Flips one byte of a file: the digit after `key` goes one down (or up). */
static void flip_digit(const char *path, const char *key) {
    unsigned char *b;
    size_t n;
    read_all(path, &b, &n);
    b[n] = '\0';
    char *p = strstr((char *)b, key);
    EXPECT(p != NULL, "no %s in %s", key, path);
    p += strlen(key);
    EXPECT(*p >= '0' && *p <= '9', "no digit after %s in %s", key, path);
    *p = *p == '0' ? '1' : (char)(*p - 1);
    zpp_test_write_file(path, b, n);
    free(b);
}

/* One byte changed in a manifest (AdamW's update count, which would
 * otherwise load and silently change the bias correction) is caught by the
 * manifest's own checksum, in the pointer and in a step folder's copy,
 * with one line naming the file; so is a rank file that is intact but not
 * the one its manifest records. */
static void test_checkpoint_manifest_flipped_byte(void) {
    char cfg[512], json[2048], args[2048], dir[512], p[700], q[700], keep[700];
    model_json(json, sizeof json, 0, "");
    write_text(zpp_test_tmp_path("flip.json", cfg), "%s", json);
    zpp_test_tmp_path("flip_ckpt", dir);
    snprintf(args, sizeof args, "--config %s --steps 3 --save %s", cfg, dir);
    train_ok(2, args);
    snprintf(p, sizeof p, "%s/checkpoint.json", dir);
    copy_file(p, zpp_test_tmp_path("flip_keep.json", keep));
    flip_digit(p, "\"updates\":");
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s", cfg, dir);
    expect_clean_failure(2, args, "checkpoint.json is damaged");
    copy_file(keep, p);
    snprintf(q, sizeof q, "%s/step-00000003/manifest.json", dir);
    flip_digit(q, "\"updates\":");
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s/step-00000003", cfg, dir);
    expect_clean_failure(2, args, "manifest.json is damaged");
    copy_file(keep, q);
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s", cfg, dir);
    train_ok(2, args); /* restored: it loads */
}

/* A lock file left by a process that is gone, or one whose lock nobody
 * holds, is taken over with one note naming its run; a held one (this test
 * holds it) is never broken. */
static void test_checkpoint_stale_lock_taken_over(void) {
    char cfg[512], json[2048], args[2048], dir[512], lock[700], out[512], err[512], host[256];
    model_json(json, sizeof json, 0, "");
    write_text(zpp_test_tmp_path("stale.json", cfg), "%s", json);
    zpp_test_tmp_path("stale_ckpt", dir);
    EXPECT(mkdir(dir, 0777) == 0 || errno == EEXIST);
    snprintf(lock, sizeof lock, "%s/.zeropp.lock", dir);
    EXPECT(gethostname(host, sizeof host) == 0);
    pid_t dead = fork(); /* a pid that was and is no more */
    if (dead == 0) _exit(0);
    EXPECT(dead > 0 && waitpid(dead, NULL, 0) == dead);
    write_text(lock,
               "{\"run_id\":\"00000000deadbeef\",\"host\":\"%s\",\"pid\":%ld,\"started\":1,"
               "\"since\":\"1970-01-01 00:00:01 UTC\"}\n",
               host, (long)dead);
    snprintf(args, sizeof args, "train --config %s --steps 2 --save %s", cfg, dir);
    EXPECT(run_zeropp(2, args, zpp_test_tmp_path("stale_out.txt", out),
                      zpp_test_tmp_path("stale_err.txt", err)) == 0,
           "the run did not take over a dead process's lock; see %s", err);
    EXPECT(zpp_test_count_lines(out, "took over the stale lock") == 1 &&
               zpp_test_count_lines(out, "run 00000000deadbeef") == 1 &&
               zpp_test_count_lines(out, "that process is gone") == 1,
           "expected one note naming run 00000000deadbeef; see %s", out);
    EXPECT(access(lock, F_OK) != 0, "%s stayed after the run", lock);
    /* a live pid (this one) that does not hold the lock: stale too */
    write_text(lock,
               "{\"run_id\":\"00000000cafef00d\",\"host\":\"%s\",\"pid\":%ld,\"started\":1,"
               "\"since\":\"1970-01-01 00:00:01 UTC\"}\n",
               host, (long)getpid());
    snprintf(args, sizeof args, "train --config %s --steps 4 --resume %s --save %s", cfg, dir,
             dir);
    EXPECT(run_zeropp(2, args, out, err) == 0, "the resume did not take over; see %s", err);
    EXPECT(zpp_test_count_lines(out, "took over the stale lock") == 1 &&
               zpp_test_count_lines(out, "it was no longer held") == 1,
           "expected one note; see %s", out);
    /* held (by this process): never broken, and nothing written */
    write_text(lock,
               "{\"run_id\":\"00000000feedface\",\"host\":\"%s\",\"pid\":%ld,\"started\":1,"
               "\"since\":\"1970-01-01 00:00:01 UTC\"}\n",
               host, (long)getpid());
    int fd = open(lock, O_RDWR);
    EXPECT(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "cannot lock %s", lock);
    snprintf(args, sizeof args, "--config %s --steps 6 --resume %s --save %s", cfg, dir, dir);
    expect_clean_failure(2, args, "is in use by run 00000000feedface");
    close(fd);
    char why[1024];
    EXPECT(ckpt_dir_valid(dir, 2, 4, why, sizeof why), "after the refused run: %s", why);
}


/* Rewrites the rank files of the checkpoint in DIR/step-00000003 (2 ranks,
 * saved in format 4) as format `format` writes them: magic, run id (not in
 * format 2), FNV-1a as their last 8 bytes; sums[r] receives each file's. */
static void ckpt_files_as(const char *dir, int format, uint64_t sums[2]) {
    char path[700];
    for (int r = 0; r < 2; r++) {
        unsigned char *b;
        size_t n;
        snprintf(path, sizeof path, "%s/step-00000003/rank-%05d.ckpt", dir, r);
        read_all(path, &b, &n);
        EXPECT(n > 48 && !memcmp(b, "ZPPCKPT4", 8), "%s is not of format 4", path);
        memcpy(b, format == 2 ? "ZPPCKPT2" : "ZPPCKPT3", 8);
        if (format == 2) { /* the header without its run id */
            memmove(b + 32, b + 40, n - 40);
            n -= 8;
        }
        sums[r] = zpp_test_fnv1a(b, n - 8);
        memcpy(b + n - 8, &sums[r], 8);
        zpp_test_write_file(path, b, n);
        free(b);
    }
}

/* The manifest's own checksum as format 3 seals it: FNV-1a of its text
 * with the 16 digits read as zeros. */
static void manifest_reseal(char *t) {
    char *d = NULL, hex[17];
    for (char *p = strstr(t, "\"checksum\":\""); p; p = strstr(p + 1, "\"checksum\":\"")) d = p;
    EXPECT(d != NULL, "no checksum in the manifest");
    d += strlen("\"checksum\":\"");
    memset(d, '0', 16);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)zpp_test_fnv1a(t, strlen(t)));
    memcpy(d, hex, 16);
}

/* Saves 3 steps on 2 ranks, resumes to 5 (metrics in met_now); rewrites the
 * checkpoint as format `format` (rank files by ckpt_files_as; the pointer
 * and the manifest: format 2 without run_id, sums and checksum, format 3
 * with the files' FNV-1a sums and resealed); resumes to 5 again and expects
 * the same losses, bit for bit. */
static void check_old_format_loads(int format) {
    char cfg[512], json[2048], args[2048], dir[512], met_now[512], met_old[512], path[700];
    char name[64];
    model_json(json, sizeof json, 0, "");
    snprintf(name, sizeof name, "fmt%d.json", format);
    write_text(zpp_test_tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "fmt%d_ckpt", format);
    zpp_test_tmp_path(name, dir);
    snprintf(args, sizeof args, "--config %s --steps 3 --save %s", cfg, dir);
    train_ok(2, args);
    snprintf(name, sizeof name, "fmt%d_now.jsonl", format);
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s --metrics %s", cfg, dir,
             zpp_test_tmp_path(name, met_now));
    train_ok(2, args);
    uint64_t sums[2];
    ckpt_files_as(dir, format, sums);
    for (int k = 0; k < 2; k++) {
        if (k == 0) snprintf(path, sizeof path, "%s/checkpoint.json", dir);
        else snprintf(path, sizeof path, "%s/step-00000003/manifest.json", dir);
        char *t = read_text(path), *p = strstr(t, "\"format\":4"), *q, *e;
        EXPECT(p != NULL, "no format 4 in %s", path);
        p[9] = (char)('0' + format);
        if (format == 2) { /* without run_id, sums, checksum */
            p = strstr(t, ",\"run_id\":\""), q = strstr(t, ",\"files\":");
            EXPECT(p && q && q > p, "no run_id before files in %s", path);
            memmove(p, q, strlen(q) + 1);
            p = strstr(t, ",\"sums\":"), e = strrchr(t, '}');
            EXPECT(p && e && e > p, "no sums in %s", path);
            memmove(p, e, strlen(e) + 1);
        } else { /* the rank files' FNV-1a sums, the manifest resealed */
            p = strstr(t, "\"rank\":[\"");
            EXPECT(p != NULL, "no rank sums in %s", path);
            for (int r = 0; r < 2; r++) {
                char hex[17];
                snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sums[r]);
                memcpy(p + strlen("\"rank\":[\"") + r * 19, hex, 16);
            }
            manifest_reseal(t);
        }
        write_text(path, "%s", t);
        free(t);
    }
    snprintf(name, sizeof name, "fmt%d_old.jsonl", format);
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s --metrics %s", cfg, dir,
             zpp_test_tmp_path(name, met_old));
    train_ok(2, args);
    double l4[MAX_STEPS], lo[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met_now, "loss", l4, MAX_STEPS) == 2 &&
           zpp_test_read_metric(met_old, "loss", lo, MAX_STEPS) == 2);
    EXPECT(l4[0] == lo[0] && l4[1] == lo[1], "format %d resumed to %a %a, format 4 to %a %a",
           format, lo[0], lo[1], l4[0], l4[1]);
}

/* Checkpoints of formats 2 (before run ids: "ZPPCKPT2" rank files, a
 * manifest without run_id, sums or checksum) and 3 (FNV-1a sums), made here
 * from a format-4 one, still resume, bit for bit as the format-4 one does. */
static void test_checkpoint_format2_still_loads(void) { check_old_format_loads(2); }
static void test_checkpoint_format3_still_loads(void) { check_old_format_loads(3); }

/* model.family "llama" (src/model/llama.h) trains through `zeropp train`:
 * 3 steps of ZeRO-3 on 2 ranks give the losses of 1 rank on the same
 * global batch, within the fp32 bound of test_zero3_matches_single_rank_fp32
 * (only the order of the gradient sums differs), and the loss falls. */
static void test_llama_family_trains(void) {
    const int steps = 3;
    double loss[2][MAX_STEPS];
    for (int k = 0; k < 2; k++) {
        const int world = k + 1;
        char cfg[512], met[512], err[512], args[2048], name[64];
        snprintf(name, sizeof name, "llama_w%d.json", world);
        write_text(zpp_test_tmp_path(name, cfg),
                   "{\"model\": {\"family\": \"llama\", \"n_layer\": 2, \"n_head\": 4,"
                   " \"n_kv_head\": 2, \"n_embd\": 32, \"n_ffn\": 48, \"seq_len\": 16,"
                   " \"vocab_size\": 256, \"untied_head\": true, \"qkv_bias\": true,"
                   " \"rope_theta\": 500000, \"rope_factor\": 8, \"rope_low_freq_factor\": 1,"
                   " \"rope_high_freq_factor\": 4, \"rope_original_max_pos\": 8},"
                   " \"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": %d,"
                   " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},"
                   " \"zeropp\": {\"eval_every\": 0, \"seed\": 7}}",
                   8 / world);
        snprintf(name, sizeof name, "llama_w%d.jsonl", world);
        zpp_test_tmp_path(name, met);
        snprintf(args, sizeof args, "--config %s --steps %d --metrics %s", cfg, steps, met);
        const int rc = run_train(world, args, zpp_test_tmp_path("err.txt", err));
        EXPECT(rc == 0, "a llama on %d ranks failed (exit %d); stderr in %s", world, rc, err);
        EXPECT(zpp_test_read_metric(met, "loss", loss[k], MAX_STEPS) == steps);
    }
    for (int s = 0; s < steps; s++)
        EXPECT(isfinite(loss[0][s]) && fabs(loss[1][s] - loss[0][s]) <= 1e-5 * fabs(loss[0][s]),
               "step %d: loss %.9g on 2 ranks, %.9g on 1", s + 1, loss[1][s], loss[0][s]);
    EXPECT(loss[0][steps - 1] < loss[0][0], "the loss did not fall: %.6g -> %.6g", loss[0][0],
           loss[0][steps - 1]);
}

ZPP_TESTS(ZPP_TEST(test_bad_inputs_fail_cleanly), ZPP_TEST(test_loco_reset_and_resume_bitwise),
          ZPP_TEST(test_zero3_matches_single_rank_fp32),
          ZPP_TEST(test_zero3_matches_single_rank_bf16),
          ZPP_TEST(test_same_seed_same_losses_bitwise), ZPP_TEST(test_grad_format_key_reaches_qgz),
          ZPP_TEST(test_checkpoint_resume_bitwise),
          ZPP_TEST(test_zeropp_options_match_zero3_validation_loss), ZPP_TEST(test_demo_summary),
          ZPP_TEST_GPU(test_gpu_matches_cpu), ZPP_TEST_GPU(test_gpu_llama_matches_cpu), ZPP_TEST_GPU(test_gpu_hpz_nodes_of_two_matches_cpu),
          ZPP_TEST_GPU(test_gpu_zeropp_matches_zero3_validation_loss),
          ZPP_TEST(test_profile_metrics), ZPP_TEST(test_zero3_matches_single_rank_params),
          ZPP_TEST(test_qgz_grad_norm_matches_single_rank), ZPP_TEST(test_adamw_first_step),
          ZPP_TEST(test_save_every), ZPP_TEST(test_nonfinite_gradient_fails_cleanly),
          ZPP_TEST_HOOKS(test_nonfinite_step_skipped), ZPP_TEST_HOOKS(test_consecutive_skips_stop),
          ZPP_TEST(test_fp16_dynamic_loss_scale), ZPP_TEST(test_fp16_static_loss_scale),
          ZPP_TEST(test_fp16_zero3_matches_single_rank),
          ZPP_TEST(test_checkpoint_failed_save_keeps_previous),
          ZPP_TEST_HOOKS(test_checkpoint_injected_save_failure_keeps_previous),
          ZPP_TEST_HOOKS(test_checkpoint_killed_save_keeps_previous),
          ZPP_TEST_HOOKS(test_slow_save_outlives_collective_timeout),
          ZPP_TEST(test_checkpoint_reshard), ZPP_TEST(test_resume_older_keeps_newer),
          ZPP_TEST(test_eval_batches_capped), ZPP_TEST(test_save_folder_not_shared), ZPP_TEST(test_checkpoint_resume_checks_model),
          ZPP_TEST(test_checkpoint_cli_checks), ZPP_TEST(test_stalled_rank_times_out),
          ZPP_TEST(test_stalled_rank_named),
          ZPP_TEST_HOOKS(test_resume_after_skips_bitwise),
          ZPP_TEST(test_cli_integers_range_checked), ZPP_TEST(test_cli_flag_syntax),
          ZPP_TEST(test_fifo_inputs_refused), ZPP_TEST(test_data_truncated_during_run),
          ZPP_TEST(test_json_strict), ZPP_TEST(test_resume_without_config_bitwise),
          ZPP_TEST(test_resume_note_lists_changes), ZPP_TEST(test_eval_checkpoint),
          ZPP_TEST(test_set_and_did_you_mean), ZPP_TEST(test_checkpoint_two_jobs_one_folder),
          ZPP_TEST(test_checkpoint_mixed_runs_refused),
          ZPP_TEST(test_checkpoint_manifest_flipped_byte),
          ZPP_TEST(test_checkpoint_stale_lock_taken_over),
          ZPP_TEST(test_checkpoint_format2_still_loads),
          ZPP_TEST(test_checkpoint_format3_still_loads), ZPP_TEST(test_llama_family_trains))
