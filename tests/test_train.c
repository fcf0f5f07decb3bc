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
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "device/device.h"

#include "testlib.h"

#define MAX_STEPS 256

static void expect_clean_failure(int np, const char *args, const char *needle);

static char tmpdir[256];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Runs at a successful exit only (a failing test _exits and keeps its files
 * for the message that points at them). */
static void remove_tmpdir(void) {
    if (tmpdir[0]) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *tmp_path(const char *name, char *buf) {
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/zpp_train_XXXXXX");
        EXPECT(mkdtemp(tmpdir) != NULL, "mkdtemp: %s", strerror(errno));
        atexit(remove_tmpdir);
    }
    snprintf(buf, 512, "%s/%s", tmpdir, name);
    return buf;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    EXPECT(f != NULL, "cannot write %s", path);
    EXPECT(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void write_text(const char *path, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    write_file(path, buf, (size_t)n);
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

/* Reads "loss" (or "val_loss") of each line of a metrics file. */
static int read_metric(const char *path, const char *key, double *out, int cap) {
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "no metrics file %s", path);
    char line[2048], pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        const char *p = strstr(line, pat);
        if (p) out[n++] = strtod(p + strlen(pat), NULL);
    }
    fclose(f);
    return n;
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
    write_text(tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "met_w%d_m%d_a%d_b%d.jsonl", world, micro, accum, bf16);
    tmp_path(name, met);
    snprintf(args, sizeof args, "--config %s --steps %d --metrics %s", cfg, steps, met);
    int rc = run_train(world, args, tmp_path("err.txt", err));
    EXPECT(rc == 0, "training on %d ranks failed (exit %d); stderr in %s", world, rc, err);
    int n = read_metric(met, "loss", loss, MAX_STEPS);
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
            write_text(tmp_path("det.json", cfg), "%s", json);
            snprintf(args, sizeof args, "--config %s --steps 8 --node-size 2 --metrics %s", cfg,
                     tmp_path("det.jsonl", met));
            EXPECT(run_train(4, args, tmp_path("err.txt", err)) == 0);
            /* the metrics print fp32 losses with 9 significant digits, which
             * round-trip: equal text means equal bits */
            double l[MAX_STEPS];
            int n = read_metric(met, "loss", l, MAX_STEPS);
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

/* A run saved after 5 steps and resumed continues exactly as the run that
 * never stopped: steps 6..10 have the same losses, bit for bit (ZeRO++ with
 * every option, 4 ranks as 2 nodes). A damaged checkpoint, one from another
 * world size, and a directory that is none are refused with one line. */
static void test_checkpoint_resume_bitwise(void) {
    char cfg[512], met[512], err[512], json[2048], args[2048], dir[512], f[600];
    model_json(json, sizeof json, 1,
               "\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3,"
               " \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 2,"
               " \"zero_quantized_gradients\": true}");
    write_text(tmp_path("ckpt.json", cfg), "%s", json);
    tmp_path("ckpt_dir", dir);
    double full[MAX_STEPS], resumed[MAX_STEPS];
    snprintf(args, sizeof args, "--config %s --steps 10 --metrics %s", cfg,
             tmp_path("full.jsonl", met));
    EXPECT(run_train(4, args, tmp_path("err.txt", err)) == 0);
    EXPECT(read_metric(met, "loss", full, MAX_STEPS) == 10);
    snprintf(args, sizeof args, "--config %s --steps 5 --save %s", cfg, dir);
    EXPECT(run_train(4, args, err) == 0, "save failed, see %s", err);
    snprintf(args, sizeof args, "--config %s --steps 10 --resume %s --metrics %s", cfg, dir,
             tmp_path("resumed.jsonl", met));
    EXPECT(run_train(4, args, err) == 0, "resume failed, see %s", err);
    EXPECT(read_metric(met, "loss", resumed, MAX_STEPS) == 5);
    for (int i = 0; i < 5; i++)
        EXPECT(resumed[i] == full[5 + i], "step %d: resumed %a, uninterrupted %a", 6 + i,
               resumed[i], full[5 + i]);

    /* another world size */
    snprintf(args, sizeof args, "--config %s --steps 10 --resume %s", cfg, dir);
    expect_clean_failure(2, args, "ranks");
    /* a damaged rank file: cut its last byte */
    snprintf(f, sizeof f, "%s/rank-00002.ckpt", dir);
    FILE *fp = fopen(f, "rb");
    EXPECT(fp != NULL);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fclose(fp);
    EXPECT(truncate(f, len - 1) == 0);
    expect_clean_failure(4, args, "ckpt");
    /* not a checkpoint */
    snprintf(args, sizeof args, "--config %s --resume %s", cfg, tmp_path("no_such_dir", f));
    expect_clean_failure(4, args, "not a checkpoint");
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
    if (!zpp_test_shared_data("tinyshakespeare.txt", data, sizeof data)) {
        printf("  skipped: ../shared/data/tinyshakespeare.txt not found\n");
        return;
    }
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
        write_text(tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "met_%s.jsonl", modes[m][0]);
        tmp_path(name, met);
        snprintf(args, sizeof args,
                 "--config %s --data %s --steps %d --eval-every %d --node-size 2 --metrics %s",
                 cfg, data, steps, steps, met);
        int rc = run_train(4, args, tmp_path("err.txt", err));
        EXPECT(rc == 0, "%s: exit %d", modes[m][0], rc);
        double val[MAX_STEPS], loss[MAX_STEPS];
        EXPECT(read_metric(met, "val_loss", val, MAX_STEPS) == 1);
        EXPECT(read_metric(met, "loss", loss, MAX_STEPS) == steps);
        printf("  %-6s train loss %.4f -> %.4f, val loss %.4f\n", modes[m][0], loss[0],
               loss[steps - 1], val[0]);
        EXPECT(val[0] < 0.55 * loss[0], "%s did not learn: val loss %.4f", modes[m][0], val[0]);
        if (m == 0) val0 = val[0];
        else
            EXPECT(fabs(val[0] - val0) <= 0.02 * val0, "%s: val loss %.4f vs ZeRO-3 %.4f",
                   modes[m][0], val[0], val0);
    }
}

/* Counts the lines of a file that contain `needle`. */
static int count_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

static void expect_clean_failure(int np, const char *args, const char *needle) {
    char err[512];
    tmp_path("bad_err.txt", err);
    int rc = run_train(np, args, err);
    EXPECT(rc != 0, "'%s' succeeded; expected an error mentioning '%s'", args, needle);
    int lines = count_lines(err, "zeropp");
    int named = count_lines(err, needle);
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
    snprintf(args, sizeof args, "--data %s --steps 2", tmp_path("does_not_exist.bin", p));
    expect_clean_failure(2, args, "does_not_exist.bin");

    /* truncated llm.c file: header says 10000 tokens, 100 are there */
    int32_t header[256] = {20240520, 1, 10000};
    uint16_t toks[100];
    for (int i = 0; i < 100; i++) toks[i] = (uint16_t)(i % 50);
    unsigned char buf[sizeof header + sizeof toks];
    memcpy(buf, header, sizeof header);
    memcpy(buf + sizeof header, toks, sizeof toks);
    write_file(tmp_path("truncated.bin", p), buf, sizeof buf);
    snprintf(args, sizeof args, "--data %s --steps 2", p);
    expect_clean_failure(2, args, "truncated");

    /* wrong magic in a token file */
    header[0] = 12345;
    memcpy(buf, header, sizeof header);
    write_file(tmp_path("wrong_magic.bin", p), buf, sizeof buf);
    snprintf(args, sizeof args, "--data %s --steps 2", p);
    expect_clean_failure(2, args, "magic");

    /* malformed config */
    write_text(tmp_path("malformed.json", cfg), "{\"model\": {\"n_layer\": 2,,}}");
    snprintf(args, sizeof args, "--config %s --steps 2", cfg);
    expect_clean_failure(2, args, "malformed.json");

    /* unknown key */
    write_text(tmp_path("unknown.json", cfg), "{\"zero_optimization\": {\"stge\": 3}}");
    snprintf(args, sizeof args, "--config %s --steps 2", cfg);
    expect_clean_failure(2, args, "stge");

    /* a batch that does not divide: 10 sequences over 4 ranks x micro 2 */
    write_text(tmp_path("batch.json", cfg),
               "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 2}");
    snprintf(args, sizeof args, "--config %s --steps 2", cfg);
    expect_clean_failure(4, args, "train_batch_size");

    /* a node size that does not divide the world */
    expect_clean_failure(4, "--node-size 3 --steps 2", "node size 3");
}

/* The demo prints the side-by-side summary and ZeRO++ sends about a quarter
 * of ZeRO-3's cross-node bytes. */
static void test_demo_summary(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char out[512], cmd[2048];
    tmp_path("demo.txt", out);
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np 4 %s train --demo --quiet "
             "--steps 6 --eval-every 3 > %s 2>&1",
             mpi, cli, out);
    int rc = system(cmd);
    EXPECT(rc == 0, "demo failed; output in %s", out);
    EXPECT(count_lines(out, "final val loss") == 1, "no summary table in %s", out);
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
     * (+6% at block 128), plus padding of this tiny model's units. */
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
    int rc = run_train(np, args, tmp_path("err.txt", err));
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

/* One rank file of a checkpoint, as engine.h documents it:
 *   "ZPPCKPT1", u32 world_size, u32 rank, u32 n_units, u32 0, u64 step,
 *   per unit: u64 shard_len, f32 master[shard_len], f32 m[..], f32 v[..],
 *   then u64 FNV-1a of every byte before. */
#define MAX_UNITS 16
typedef struct ckpt {
    uint32_t world, rank, n_units;
    uint64_t step;
    size_t len[MAX_UNITS];
    float *state[MAX_UNITS][3]; /* master, m, v */
} ckpt;

/* Parses and validates a rank file; 0 and a reason in `why` if it is not a
 * whole, intact checkpoint file. */
static int ckpt_read(const char *path, ckpt *c, char *why, size_t cap) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(why, cap, "cannot open %s", path), 0;
    fclose(f);
    unsigned char *b;
    size_t n, off = 32;
    read_all(path, &b, &n);
    uint32_t zero = 1;
    if (n < 40 || memcmp(b, "ZPPCKPT1", 8) != 0) {
        snprintf(why, cap, "%s: no magic", path);
        goto bad;
    }
    memcpy(&c->world, b + 8, 4), memcpy(&c->rank, b + 12, 4), memcpy(&c->n_units, b + 16, 4);
    memcpy(&zero, b + 20, 4), memcpy(&c->step, b + 24, 8);
    if (zero != 0 || c->n_units == 0 || c->n_units > MAX_UNITS) {
        snprintf(why, cap, "%s: bad header", path);
        goto bad;
    }
    for (uint32_t u = 0; u < c->n_units; u++) {
        uint64_t len;
        if (off + 8 > n) goto short_;
        memcpy(&len, b + off, 8);
        off += 8;
        if (len > n || off + 12 * len > n) goto short_;
        c->len[u] = (size_t)len;
        for (int k = 0; k < 3; k++) {
            c->state[u][k] = malloc((len ? len : 1) * sizeof(float));
            memcpy(c->state[u][k], b + off, len * sizeof(float));
            off += len * sizeof(float);
        }
    }
    if (off + 8 != n) goto short_;
    uint64_t h = 14695981039346656037ull, sum;
    for (size_t i = 0; i < off; i++) h = (h ^ b[i]) * 1099511628211ull;
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

/* A checkpoint directory's state, whole: unit u's rank shards end to end
 * (rank r holds elements [r*len, (r+1)*len) of the padded unit). */
typedef struct model_state {
    int n_units;
    uint64_t step;
    size_t len[MAX_UNITS];        /* W * shard_len, padded */
    float *x[MAX_UNITS][3];       /* master, m, v */
} model_state;

static void state_load(const char *dir, int world, model_state *s) {
    memset(s, 0, sizeof *s);
    for (int r = 0; r < world; r++) {
        char path[600], why[700];
        ckpt c;
        snprintf(path, sizeof path, "%s/rank-%05d.ckpt", dir, r);
        EXPECT(ckpt_read(path, &c, why, sizeof why), "%s", why);
        EXPECT(c.world == (uint32_t)world && c.rank == (uint32_t)r,
               "%s: world %u rank %u, expected %d %d", path, c.world, c.rank, world, r);
        if (r == 0) {
            s->n_units = (int)c.n_units;
            s->step = c.step;
            for (int u = 0; u < s->n_units; u++) {
                s->len[u] = (size_t)world * c.len[u];
                for (int k = 0; k < 3; k++) s->x[u][k] = malloc((s->len[u] + 1) * sizeof(float));
            }
        }
        EXPECT((int)c.n_units == s->n_units && c.step == s->step, "%s: rank files disagree",
               dir);
        for (int u = 0; u < s->n_units; u++) {
            EXPECT(c.len[u] * (size_t)world == s->len[u], "%s unit %d: shard lengths differ",
                   dir, u);
            for (int k = 0; k < 3; k++)
                memcpy(s->x[u][k] + (size_t)r * c.len[u], c.state[u][k],
                       c.len[u] * sizeof(float));
        }
        ckpt_free(&c);
    }
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
    write_text(tmp_path(name, cfg), "%s", json);
    snprintf(name, sizeof name, "math_w%d_m%d_a%d.jsonl", world, micro, accum);
    tmp_path(name, met);
    snprintf(name, sizeof name, "math_w%d_m%d_a%d", world, micro, accum);
    tmp_path(name, dir);
    snprintf(args, sizeof args, "--config %s --steps %d --metrics %s --save %s %s", cfg, steps,
             met, dir, seed_arg());
    train_ok(world, args);
    EXPECT(read_metric(met, "loss", loss, MAX_STEPS) == steps);
    EXPECT(read_metric(met, "grad_norm", norm, MAX_STEPS) == steps);
    state_load(dir, world, st);
    EXPECT(st->step == (uint64_t)steps, "%s: step %llu", dir, (unsigned long long)st->step);
}

/* ZeRO-3 on W ranks computes what one rank computes — the gradient norm of
 * every step and the parameters (and both Adam moments) after the steps,
 * not only the loss. Reassembled from the rank files of a checkpoint, each
 * unit's shards give the 1-rank unit followed by zero padding (the padding's
 * gradient is zero and AdamW keeps zero at zero).
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
            EXPECT(got.len[u] >= numel && got.len[u] - numel < (size_t)W,
                   "unit %d: %zu padded for %zu elements on %d ranks", u, got.len[u], numel, W);
            for (int k = 0; k < 3; k++) {
                for (size_t i = 0; i < numel; i++) {
                    double d = fabs((double)got.x[u][k][i] - ref[r].x[u][k][i]);
                    if (d > worst[k]) worst[k] = d;
                    EXPECT(d <= tol[k],
                           "world %d unit %d element %zu: %s %.9g vs 1 rank %.9g", W, u, i,
                           k == 0 ? "parameter" : k == 1 ? "m" : "v", got.x[u][k][i],
                           ref[r].x[u][k][i]);
                }
                for (size_t i = numel; i < got.len[u]; i++)
                    EXPECT(got.x[u][k][i] == 0.0f, "world %d unit %d: padding %zu is %g", W,
                           u, i, got.x[u][k][i]);
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
        write_text(tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "qgz_w%d.jsonl", W);
        snprintf(args, sizeof args, "--config %s --steps 1 --node-size %d --metrics %s %s", cfg,
                 shapes[c][1], tmp_path(name, met), seed_arg());
        train_ok(W, args);
        double norm;
        EXPECT(read_metric(met, "grad_norm", &norm, 1) == 1);
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
 *     p1 = p0 - lr * (g / (|g| + eps) + wd * p0)
 *     D := p0 * (1 - lr*wd) - p1 = lr * g / (|g| + eps),
 * which is lr * sign(g) wherever |g| >> eps. p0 comes from a run whose
 * first step has lr = 0 (WarmupLR from warmup_min_lr 0: p1 = p0 exactly);
 * the measured run takes its step-1 lr from WarmupCosineLR (lr * 0.5 at
 * s = 0), read back from the metrics. g is recovered from the checkpoint's m
 * (g = m / (1-b1)), and v is checked against it.
 * Rounding (fp32, u = 2^-24): p1 is rounded once (u |p1|), lr * (...) once
 * (u * lr * 1.01), the moments and the division a few ulps of lr; so
 * |D - lr * g/(|g|+eps)| <= 2u |p1| + 8u lr (a factor 2 to spare). Missing
 * weight decay is off by lr * wd * |p0| = 1e-4 * |p0| (>> 2u |p1|);
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
        write_text(tmp_path(name, cfg), "%s", json);
        snprintf(name, sizeof name, "adamw%d", run);
        tmp_path(name, dir[run]);
        snprintf(name, sizeof name, "adamw%d.jsonl", run);
        snprintf(args, sizeof args, "--config %s --steps 1 --metrics %s --save %s %s", cfg,
                 tmp_path(name, met), dir[run], seed_arg());
        train_ok(1, args);
        EXPECT(read_metric(met, "lr", &lr[run], 1) == 1);
    }
    EXPECT(lr[0] == 0.0, "step 1 of WarmupLR from 0 ran at lr %g", lr[0]);
    EXPECT(fabs(lr[1] - lr_opt * ratio) <= 1e-6 * lr_opt * ratio,
           "step 1 of WarmupCosineLR ran at lr %g, the schedule says %g", lr[1], lr_opt * ratio);
    /* the engine's values: fp32 */
    const double L = (float)(lr_opt * ratio), WD = (float)wd, B1 = (float)b1, B2 = (float)b2;
    const double c1 = 1.0 - B1, c2 = 1.0 - B2, E = (float)eps, u = 0x1p-24;
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
            double D = p0 * (1 - L * WD) - p1, want = L * g / (fabs(g) + E);
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

/* Reads "step" of a checkpoint manifest; -1 if there is none. */
static int manifest_step(const char *dir) {
    char path[600], buf[256] = {0};
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    FILE *f = fopen(path, "r");
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
        char path[600];
        ckpt c;
        snprintf(path, sizeof path, "%s/rank-%05d.ckpt", dir, r);
        if (!ckpt_read(path, &c, why, cap)) return 0;
        int ok = c.step == (uint64_t)step && c.world == (uint32_t)world &&
                 c.rank == (uint32_t)r;
        ckpt_free(&c);
        if (!ok) return snprintf(why, cap, "%s: rank file of another save", path), 0;
    }
    return 1;
}

/* `--save DIR --save-every K` checkpoints after steps K, 2K, ... and after
 * the last step, into DIR (each save replaces the one before). 10 steps,
 * K = 4, 2 ranks: saves after steps 4, 8 and 10, no others. Resuming from
 * the step-4 or step-8 checkpoint continues bit for bit as the run that
 * never stopped (same losses; the final rank files byte for byte).
 *
 * How the intermediate checkpoints are seen: inotify reports every rename
 * of the manifest into DIR (a save's last act, the events queue in the
 * kernel: none is missed), and on each the test hard-links the manifest
 * and the rank files into a snapshot folder. The trainer replaces files by
 * renaming new ones over them, so a link keeps the old file; a snapshot
 * taken late (after the next save began) shows rank files of another step
 * and is discarded. The trainer takes 4 steps (~10 ms) between saves; on a
 * machine too busy to link 3 files in that time, the run is repeated. */
static void test_save_every(void) {
    const int W = 2, steps = 10, every = 4, want[3] = {4, 8, 10};
    char cfg[512], met[512], dir[512], json[2048], args[2048], snap[3][512], err[512];
    model_json(json, sizeof json, 1, "\"train_micro_batch_size_per_gpu\": 2");
    write_text(tmp_path("every.json", cfg), "%s", json);
    tmp_path("every.jsonl", met);
    int captured = -1;
    for (int attempt = 0; attempt < 3 && captured < 0; attempt++) {
        char name[64];
        snprintf(name, sizeof name, "every_%d", attempt);
        tmp_path(name, dir);
        EXPECT(mkdir(dir, 0777) == 0);
        int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        EXPECT(ifd >= 0 && inotify_add_watch(ifd, dir, IN_MOVED_TO) >= 0, "inotify: %s",
               strerror(errno));
        const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
        EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "timeout 240 %s --oversubscribe --bind-to none -np %d %s train --quiet "
                 "--config %s --steps %d --save %s --save-every %d --metrics %s >/dev/null "
                 "2>%s",
                 mpi, W, cli, cfg, steps, dir, every, met, tmp_path("err.txt", err));
        pid_t pid = fork();
        EXPECT(pid >= 0);
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        int saves = 0, status = 0, done = 0;
        while (!done) {
            done = waitpid(pid, &status, WNOHANG) == pid; /* then drain the queue once */
            struct pollfd pf = {ifd, POLLIN, 0};
            if (!done) poll(&pf, 1, 20);
            char ev[4096] __attribute__((aligned(8)));
            ssize_t len;
            while ((len = read(ifd, ev, sizeof ev)) > 0) {
                for (char *p = ev; p < ev + len;) {
                    struct inotify_event *e = (struct inotify_event *)p;
                    p += sizeof *e + e->len;
                    if (e->len == 0 || strcmp(e->name, "checkpoint.json") != 0) continue;
                    if (saves < 3) {
                        snprintf(name, sizeof name, "every_%d_snap%d", attempt, saves);
                        tmp_path(name, snap[saves]);
                        EXPECT(mkdir(snap[saves], 0777) == 0);
                        char from[600], to[600];
                        snprintf(from, sizeof from, "%s/checkpoint.json", dir);
                        snprintf(to, sizeof to, "%s/checkpoint.json", snap[saves]);
                        int ok = link(from, to) == 0;
                        for (int r = 0; r < W && ok; r++) {
                            snprintf(from, sizeof from, "%s/rank-%05d.ckpt", dir, r);
                            snprintf(to, sizeof to, "%s/rank-%05d.ckpt", snap[saves], r);
                            ok = link(from, to) == 0;
                        }
                    }
                    saves++;
                }
            }
        }
        close(ifd);
        EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the run failed; stderr in %s",
               err);
        EXPECT(saves == 3, "%d checkpoints written; expected 3 (after steps 4, 8, 10)", saves);
        char why[800];
        EXPECT(ckpt_dir_valid(dir, W, steps, why, sizeof why), "final checkpoint: %s", why);
        for (int j = 0; j < 3; j++) {
            /* a snapshot is either the checkpoint of its save, or (taken
             * late) inconsistent or one of a later save */
            int ok = ckpt_dir_valid(snap[j], W, want[j], why, sizeof why);
            if (!ok) {
                int ms = manifest_step(snap[j]);
                EXPECT(ms == -1 || ms > want[j], "save %d: manifest says step %d, expected %d",
                       j + 1, ms, want[j]);
                printf("  attempt %d: save %d (step %d) not captured: %s\n", attempt + 1, j + 1,
                       want[j], why);
            } else if (j < 2 && captured < 0) {
                captured = j;
            }
        }
    }
    EXPECT(captured >= 0, "no intermediate checkpoint captured in 3 runs");
    double full[MAX_STEPS], resumed[MAX_STEPS];
    EXPECT(read_metric(met, "loss", full, MAX_STEPS) == steps);
    int from = want[captured];
    char met2[512], dir2[512];
    snprintf(args, sizeof args, "--config %s --steps %d --resume %s --metrics %s --save %s", cfg,
             steps, snap[captured], tmp_path("every_resumed.jsonl", met2),
             tmp_path("every_resumed", dir2));
    train_ok(W, args);
    EXPECT(read_metric(met2, "loss", resumed, MAX_STEPS) == steps - from);
    for (int i = 0; i < steps - from; i++)
        EXPECT(resumed[i] == full[from + i], "step %d: resumed from step %d %a, uninterrupted %a",
               from + i + 1, from, resumed[i], full[from + i]);
    for (int r = 0; r < W; r++) {
        char a[600], b[600];
        unsigned char *x, *y;
        size_t nx, ny;
        snprintf(a, sizeof a, "%s/rank-%05d.ckpt", dir, r);
        snprintf(b, sizeof b, "%s/rank-%05d.ckpt", dir2, r);
        read_all(a, &x, &nx);
        read_all(b, &y, &ny);
        EXPECT(nx == ny && memcmp(x, y, nx) == 0, "%s and %s differ", a, b);
        free(x);
        free(y);
    }
    printf("  resumed from the step-%d checkpoint: steps %d..%d bit for bit\n", from, from + 1,
           steps);
}

/* A gradient that stops being finite ends the run on every rank with one
 * line naming the step and the cause, and leaves no damaged checkpoint.
 * lr = 1e30 makes step 1's update ~1e30 per weight; step 2's forward then
 * overflows fp32 (squares of 1e30 in LayerNorm and attention), and its
 * gradient norm is NaN or Inf. 2 ranks: each rank's exit status is
 * recorded by a wrapper, since mpirun reports only the first. With
 * --save-every 1 the step-1 checkpoint stays intact (manifest, rank files,
 * checksums; no leftover .tmp) and resumes into the same error; with --save
 * alone there is no checkpoint at all. */
static void test_nonfinite_gradient_fails_cleanly(void) {
    const int W = 2;
    char cfg[512], json[2048], err[512], met[512], dir[512], cmd[4096], args[2048];
    model_json(json, sizeof json, 0, "\"train_micro_batch_size_per_gpu\": 2");
    subst(json, sizeof json, "\"lr\": 0.001", "\"lr\": 1e30");
    write_text(tmp_path("nonfinite.json", cfg), "%s", json);
    tmp_path("nonfinite_ckpt", dir);
    EXPECT(getenv("ZPP_CLI") && getenv("ZPP_MPIEXEC"), "ZPP_CLI and ZPP_MPIEXEC must be set");
    char codes[512];
    tmp_path("nonfinite_exit", codes);
    snprintf(cmd, sizeof cmd,
             "timeout 240 %s --oversubscribe --bind-to none -np %d sh -c '%s train --quiet "
             "--config %s --steps 5 --save %s --save-every 1 --metrics %s; echo $? > "
             "%s.${OMPI_COMM_WORLD_RANK:-$PMI_RANK}' >/dev/null 2>%s",
             getenv("ZPP_MPIEXEC"), W, getenv("ZPP_CLI"), cfg, dir,
             tmp_path("nonfinite.jsonl", met), codes, tmp_path("nonfinite_err.txt", err));
    int rc = system(cmd);
    EXPECT(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 124, "%s: hang?", cmd);
    for (int r = 0; r < W; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s.%d", codes, r);
        FILE *f = fopen(path, "r");
        int code = -1;
        EXPECT(f && fscanf(f, "%d", &code) == 1, "rank %d left no exit status", r);
        fclose(f);
        EXPECT(code != 0, "rank %d exited 0 after a non-finite gradient", r);
    }
    /* one line, naming the step and the cause */
    EXPECT(count_lines(err, "zeropp") == 1, "expected one error line; see %s", err);
    FILE *f = fopen(err, "r");
    char line[4096] = "", l[4096];
    while (fgets(l, sizeof l, f))
        if (strstr(l, "zeropp")) snprintf(line, sizeof line, "%s", l);
    fclose(f);
    EXPECT(strstr(line, "step 2") != NULL, "the error does not name step 2: %s", line);
    EXPECT(strcasestr(line, "nan") || strcasestr(line, "inf") || strcasestr(line, "non-finite"),
           "the error does not say the value is not finite: %s", line);
    printf("  %s", line);
    double loss[MAX_STEPS];
    EXPECT(read_metric(met, "loss", loss, MAX_STEPS) == 1, "metrics past the failing step");
    /* the last good checkpoint, intact; nothing half-written beside it */
    char why[800];
    EXPECT(ckpt_dir_valid(dir, W, 1, why, sizeof why), "%s", why);
    DIR *d = opendir(dir);
    EXPECT(d != NULL);
    struct dirent *de;
    while ((de = readdir(d)))
        EXPECT(strstr(de->d_name, ".tmp") == NULL, "leftover %s/%s", dir, de->d_name);
    closedir(d);
    for (int r = 0; r < W; r++) {
        char path[600];
        ckpt c;
        snprintf(path, sizeof path, "%s/rank-%05d.ckpt", dir, r);
        EXPECT(ckpt_read(path, &c, why, sizeof why), "%s", why);
        for (uint32_t u = 0; u < c.n_units; u++)
            for (int k = 0; k < 3; k++)
                for (size_t i = 0; i < c.len[u]; i++)
                    EXPECT(isfinite(c.state[u][k][i]), "%s unit %u: %g", path, u,
                           c.state[u][k][i]);
        ckpt_free(&c);
    }
    /* it loads, and the same step fails the same way */
    snprintf(args, sizeof args, "--config %s --steps 5 --resume %s", cfg, dir);
    EXPECT(run_train(W, args, err) != 0);
    EXPECT(count_lines(err, "zeropp") == 1 && count_lines(err, "step 2") == 1,
           "resumed: expected the step-2 error again; see %s", err);
    /* --save without --save-every: the run never reaches its save */
    tmp_path("nonfinite_nosave", dir);
    snprintf(args, sizeof args, "--config %s --steps 5 --save %s", cfg, dir);
    EXPECT(run_train(W, args, err) != 0);
    EXPECT(manifest_step(dir) == -1, "a checkpoint was written by a failed run in %s", dir);
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
 *   samples: CUDA and OpenBLAS differ only in the order of fp32 sums
 *   (test_gpt2_cuda bounds those at ~1e-6 relative per output), so 1e-5.
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
    const char *runs[][3] = {
        {"zero3", "\"zero_optimization\": {\"stage\": 3}",
         one_gpu ? "--node-size 1" : "--node-size 2"},
        {"qwz_qgz",
         "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true,"
         " \"zero_quantized_gradients\": true}",
         "--node-size 1"},
    };
    const int steps = 6;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        double loss[2][MAX_STEPS], cross[2][MAX_STEPS], intra[2][MAX_STEPS];
        for (int gpu = 0; gpu < 2; gpu++) {
            char cfg[512], met[512], err[512], json[2048], extra[512], args[2048], name[64];
            snprintf(extra, sizeof extra, "\"train_micro_batch_size_per_gpu\": 4, %s",
                     runs[r][1]);
            model_json_w(json, sizeof json, 64, 1, extra);
            snprintf(name, sizeof name, "gpu_%s.json", runs[r][0]);
            write_text(tmp_path(name, cfg), "%s", json);
            snprintf(name, sizeof name, "gpu_%s_%d.jsonl", runs[r][0], gpu);
            tmp_path(name, met);
            snprintf(args, sizeof args, "--config %s --steps %d %s --device %s%s --metrics %s",
                     cfg, steps, runs[r][2], gpu ? "gpu" : "cpu",
                     gpu && !strcmp(runs[r][2], "--node-size 1") ? " --emulate-nodes" : "",
                     met);
            int rc = run_train(2, args, tmp_path("err.txt", err));
            EXPECT(rc == 0, "%s on the %s: exit %d; stderr in %s", runs[r][0],
                   gpu ? "GPU" : "CPU", rc, err);
            EXPECT(read_metric(met, "loss", loss[gpu], MAX_STEPS) == steps);
            EXPECT(read_metric(met, "cross_node_bytes", cross[gpu], MAX_STEPS) == steps);
            EXPECT(read_metric(met, "intra_node_bytes", intra[gpu], MAX_STEPS) == steps);
        }
        printf("  %-7s step 1 loss: cpu %.9g gpu %.9g; step %d: cpu %.9g gpu %.9g\n",
               runs[r][0], loss[0][0], loss[1][0], steps, loss[0][steps - 1],
               loss[1][steps - 1]);
        EXPECT(fabs(loss[1][0] - loss[0][0]) <= 1e-5 * loss[0][0], "%s step 1: %.9g vs %.9g",
               runs[r][0], loss[1][0], loss[0][0]);
        for (int s = 0; s < steps; s++) {
            EXPECT(fabs(loss[1][s] - loss[0][s]) <= 1e-3 * loss[0][s],
                   "%s step %d: gpu %.9g vs cpu %.9g", runs[r][0], s + 1, loss[1][s],
                   loss[0][s]);
            EXPECT(cross[1][s] == cross[0][s] && intra[1][s] == intra[0][s],
                   "%s step %d: %.0f + %.0f cross- + intra-node bytes vs %.0f + %.0f",
                   runs[r][0], s + 1, cross[1][s], intra[1][s], cross[0][s], intra[0][s]);
        }
        EXPECT(loss[1][steps - 1] < loss[1][0], "%s: the loss did not fall", runs[r][0]);
    }
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
    if (seconds) *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    EXPECT(WIFEXITED(rc), "killed by a signal: %s", line);
    return WEXITSTATUS(rc);
}

/* Integers are range-checked for the field they land in: 2^31 and 2^32 + 2
 * used to wrap to 0 and 2 steps (or a node size of 2). The error names the
 * range, once, with 2 ranks. */
static void test_cli_integers_range_checked(void) {
    expect_clean_failure(2, "--steps 2147483648", "[1, 2147483647]");
    expect_clean_failure(2, "--steps 4294967298", "[1, 2147483647]");
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
             tmp_path("eq_metrics.jsonl", met));
    EXPECT(run_train(2, args, tmp_path("eq_err.txt", err)) == 0, "'%s' failed; see %s", args,
           err);
    EXPECT(count_lines(met, "\"step\"") == 3, "--steps=3 did not run 3 steps; see %s", met);

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
             mpi, cli, tmp_path("bench_err.txt", err));
    EXPECT(run_timed(120, cmd, NULL) != 0, "bench comm took an unknown option");
    EXPECT(count_lines(err, "zeropp") == 1 && count_lines(err, "unknown option '--bogus'") == 1,
           "bench comm: expected one line naming the unknown option; see %s", err);
}

/* A FIFO as --data or --config blocked forever in open(); now it is refused
 * at once (the timeout turns a regression into a failure, not a hang). */
static void test_fifo_inputs_refused(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char fifo[512], err[512], cmd[2048];
    tmp_path("input.fifo", fifo);
    EXPECT(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    const char *flags[] = {"--data", "--config"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s --oversubscribe --bind-to none -np 2 %s train --quiet --steps 1 %s %s "
                 ">/dev/null 2>%s",
                 mpi, cli, flags[i], fifo, tmp_path("fifo_err.txt", err));
        double secs = 0;
        int rc = run_timed(60, cmd, &secs);
        EXPECT(rc != 124, "%s FIFO: hung (killed after 60 s)", flags[i]);
        EXPECT(rc != 0, "%s FIFO: succeeded", flags[i]);
        EXPECT(count_lines(err, "zeropp") == 1 && count_lines(err, "FIFO") == 1,
               "%s FIFO: expected one line saying it is a FIFO; see %s", flags[i], err);
        /* the refusal itself is immediate; the rest is mpirun's start-up */
        EXPECT(secs < 30, "%s FIFO: took %.1f s", flags[i], secs);
    }
    /* a directory as --config is refused the same way */
    snprintf(cmd, sizeof cmd, "--config %s --steps 1", tmpdir);
    expect_clean_failure(1, cmd, "a directory");
}

/* The data file was memory-mapped: truncating it during a run killed every
 * rank with SIGBUS. Now the reads are pread()s and the run ends with one
 * line saying the file shrank, and a non-zero exit. */
static void test_data_truncated_during_run(void) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char data[512], met[512], err[512], cfg[512], json[2048], cmd[4096];
    /* 64 KiB of text */
    FILE *f = fopen(tmp_path("shrinking.txt", data), "w");
    EXPECT(f != NULL);
    for (int i = 0; i < 1500; i++) fprintf(f, "line %d of a text that will shrink.\n", i);
    fclose(f);
    model_json(json, sizeof json, 0, "");
    write_text(tmp_path("shrink.json", cfg), "%s", json);
    tmp_path("shrink_metrics.jsonl", met);
    tmp_path("shrink_err.txt", err);
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
    while (count_lines(met, "\"step\"") < 1 && waited < 2000) {
        usleep(100000);
        waited++;
    }
    EXPECT(count_lines(met, "\"step\"") >= 1, "no step in %s after 200 s; see %s", met, err);
    EXPECT(truncate(data, 0) == 0, "truncate %s: %s", data, strerror(errno));
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status), "the run was killed by a signal");
    int code = WEXITSTATUS(status);
    EXPECT(code != 124, "the run did not stop after the data file shrank (timed out)");
    EXPECT(code != 0, "the run succeeded on a data file truncated under it");
    EXPECT(count_lines(err, "signal") == 0 && count_lines(err, "SIGBUS") == 0,
           "a rank died of a signal; see %s", err);
    EXPECT(count_lines(err, "zeropp") == 1 && count_lines(err, "shrank from") == 1,
           "expected one line saying the data file shrank; see %s", err);
}

/* cJSON takes "lr\u0000x" as the key "lr" and 01 as 1; both are refused,
 * with the byte offset. */
static void test_json_strict(void) {
    char cfg[512], args[1024];
    write_text(tmp_path("nul_key.json", cfg),
               "{\"optimizer\": {\"params\": {\"lr\\u0000x\": 0.1}}}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "\\u0000");
    expect_clean_failure(2, args, "byte offset 29");
    write_text(tmp_path("nul_value.json", cfg), "{\"optimizer\": {\"type\": \"AdamW\\u0000\"}}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "\\u0000");
    write_text(tmp_path("leading_zero.json", cfg), "{\"steps_per_print\": 01}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "leading zero");
    write_text(tmp_path("plus.json", cfg), "{\"steps_per_print\": +1}");
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    expect_clean_failure(2, args, "malformed JSON"); /* cJSON refuses this one itself */
}

ZPP_TESTS(ZPP_TEST(test_bad_inputs_fail_cleanly), ZPP_TEST(test_zero3_matches_single_rank_fp32),
          ZPP_TEST(test_zero3_matches_single_rank_bf16),
          ZPP_TEST(test_same_seed_same_losses_bitwise), ZPP_TEST(test_checkpoint_resume_bitwise),
          ZPP_TEST(test_zeropp_options_match_zero3_validation_loss),
          ZPP_TEST(test_demo_summary), ZPP_TEST_GPU(test_gpu_matches_cpu),
          ZPP_TEST(test_zero3_matches_single_rank_params),
          ZPP_TEST(test_qgz_grad_norm_matches_single_rank), ZPP_TEST(test_adamw_first_step),
          ZPP_TEST(test_save_every), ZPP_TEST(test_nonfinite_gradient_fails_cleanly),
          ZPP_TEST(test_cli_integers_range_checked), ZPP_TEST(test_cli_flag_syntax),
          ZPP_TEST(test_fifo_inputs_refused), ZPP_TEST(test_data_truncated_during_run),
          ZPP_TEST(test_json_strict))
