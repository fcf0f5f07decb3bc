/* test_train_logs.c — what `zeropp train` prints for a person to read
 * (docs/logs.md): the header naming the mode, the FLOPs a token and the
 * peak; TFLOP/s and MFU on the step lines and in the metrics; a line per
 * saved checkpoint; the summary; the progress bar, on a terminal only. And
 * the FLOP count itself (zpp_cost_flops_per_token) against a hand count.
 *
 * ZPP_CLI (the zeropp command) and ZPP_MPIEXEC (mpirun) come from ctest. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan/cost.h"

#include "testlib.h"

#define MAX_STEPS 64

/* The model every run trains: 2 layers, 32 wide in 2 heads, T = 16,
 * vocabulary 256 (the synthetic corpus), 2 sequences a rank. */
#define L_ 2
#define C_ 32
#define T_ 16
#define V_ 256

static const char *model_cfg(const char *name, const char *zero, char *path) {
    char json[1024];
    int n = snprintf(json, sizeof json,
                     "{\"model\": {\"n_layer\": %d, \"n_head\": 2, \"n_embd\": %d, \"seq_len\": %d,"
                     " \"vocab_size\": %d}, \"train_micro_batch_size_per_gpu\": 2,"
                     " \"steps_per_print\": 1,"
                     " \"zeropp\": {\"eval_every\": 0, \"seed\": 3}%s%s}",
                     L_, C_, T_, V_, zero[0] ? ", " : "", zero);
    zpp_test_write_file(zpp_test_tmp_path(name, path), json, (size_t)n);
    return path;
}

/* Runs `[ENV] [mpirun -np np] zeropp train ARGS` (np 0: no launcher),
 * stdout and stderr to files; returns the exit code. */
static int run_train(const char *env, int np, const char *args, const char *out,
                     const char *err) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    char cmd[4096], launch[1024] = "";
    if (np > 0)
        snprintf(launch, sizeof launch, "%s --oversubscribe --bind-to none -np %d ", mpi, np);
    snprintf(cmd, sizeof cmd, "%s timeout 240 %s%s train %s >%s 2>%s </dev/null", env, launch,
             cli, args, out, err);
    int rc = system(cmd);
    EXPECT(rc != -1 && WIFEXITED(rc), "system() failed: %s", cmd);
    EXPECT(WEXITSTATUS(rc) != 124, "timed out (hang?): %s", cmd);
    return WEXITSTATUS(rc);
}

/* As run_train, and it must succeed. `tag` names the output files. */
static void train_ok(const char *tag, const char *env, int np, const char *args, char *out) {
    char name[96], err[512];
    snprintf(name, sizeof name, "%s_out.txt", tag);
    zpp_test_tmp_path(name, out);
    snprintf(name, sizeof name, "%s_err.txt", tag);
    int rc = run_train(env, np, args, out, zpp_test_tmp_path(name, err));
    EXPECT(rc == 0, "zeropp train %s failed (exit %d); stdout %s, stderr %s", args, rc, out, err);
}

/* A file's text, NUL-terminated (free it). */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 1 << 20;
    char *text = zpp_test_malloc(cap);
    size_t n = fread(text, 1, cap - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

/* The line of `text` that starts with `prefix` (the n-th such, from 0),
 * copied into line; NULL when there is none. */
static const char *line_starting(const char *text, const char *prefix, int nth, char *line,
                                 size_t cap) {
    size_t k = strlen(prefix);
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        if (n >= k && !strncmp(p, prefix, k) && nth-- == 0) {
            snprintf(line, cap, "%.*s", (int)n, p);
            return line;
        }
        p += n + (p[n] == '\n');
    }
    return NULL;
}

static int count_str(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* The numbers of "key": on each metrics line; returns how many lines had
 * it (a null counts, as NAN). */
static int read_field(const char *path, const char *key, double *out, int cap) {
    char *text = read_text(path), k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    int n = 0;
    for (const char *p = text; n < cap && (p = strstr(p, k)); p += strlen(k)) {
        const char *v = p + strlen(k);
        out[n++] = !strncmp(v, "null", 4) ? NAN : strtod(v, NULL);
    }
    free(text);
    return n;
}

/* ---- The FLOP count ------------------------------------------------------- */

/* GPT-2's parameters, tensor by tensor (tied head): the token and position
 * embeddings, per block two LayerNorms (gain and bias), the qkv and output
 * projections and the MLP's two matrices with their biases, and the final
 * LayerNorm. */
static double gpt2_params_by_tensor(double L, double C, double T, double V) {
    double block = 2 * C               /* ln_1 */
                   + C * 3 * C + 3 * C /* attn.c_attn */
                   + C * C + C         /* attn.c_proj */
                   + 2 * C             /* ln_2 */
                   + C * 4 * C + 4 * C /* mlp.c_fc */
                   + 4 * C * C + C;    /* mlp.c_proj */
    return V * C + T * C + L * block + 2 * C;
}

/* 6 FLOPs a parameter and 12 L C T for attention, against a count by hand
 * of the model the runs below train: P = 8192 + 512 + 2 x 12704 + 64 =
 * 34176; 6 P = 205056; 12 x 2 x 32 x 16 = 12288; 217344 in all. */
static void test_flops_per_token(void) {
    double P = gpt2_params_by_tensor(L_, C_, T_, V_);
    EXPECT(P == 34176, "params by tensor %.0f", P);
    EXPECT(P == zpp_cost_gpt_params(L_, C_, T_, V_), "the planner counts %.0f params",
           zpp_cost_gpt_params(L_, C_, T_, V_));
    double f = zpp_cost_flops_per_token(P, L_, C_, T_);
    EXPECT(f == 217344.0 && f == 6 * P + 12.0 * L_ * C_ * T_, "FLOPs a token %.0f", f);
    /* no GPT shape: the parameter term alone */
    EXPECT(zpp_cost_flops_per_token(1e9, 0, 0, 0) == 6e9);
    /* a 124M GPT-2 (12 layers, 768 wide, T 1024, vocabulary 50257) */
    double P124 = gpt2_params_by_tensor(12, 768, 1024, 50257);
    EXPECT(fabs(zpp_cost_flops_per_token(P124, 12, 768, 1024) -
                (6 * P124 + 12.0 * 12 * 768 * 1024)) <= 1e-6);
    /* the planner's step is tokens x this */
    zpp_cost_in in = zpp_cost_in_default();
    in.params = P;
    in.n_layer = L_, in.n_embd = C_, in.seq_len = T_, in.vocab = V_;
    in.tokens_per_gpu = 48;
    EXPECT(zpp_cost_step_flops(&in) == 48 * 217344.0);
}

/* The presets MFU takes its peak from, picked by the CUDA device's name. */
static void test_gpu_presets(void) {
    const zpp_cost_gpu *h200 = zpp_cost_gpu_for_device("NVIDIA H200");
    EXPECT(h200 && !strcmp(h200->name, "h200"));
    EXPECT(zpp_cost_gpu_peak_tflops(h200, ZPP_BF16) == 989 &&
           zpp_cost_gpu_peak_tflops(h200, ZPP_FP16) == 989 &&
           zpp_cost_gpu_peak_tflops(h200, ZPP_FP32) == 67);
    const zpp_cost_gpu *a = zpp_cost_gpu_for_device("NVIDIA A100-SXM4-80GB");
    EXPECT(a && !strcmp(a->name, "a100") && zpp_cost_gpu_peak_tflops(a, ZPP_BF16) == 312);
    const zpp_cost_gpu *h = zpp_cost_gpu_for_device("NVIDIA H100 80GB HBM3");
    EXPECT(h && !strcmp(h->name, "h100"));
    const zpp_cost_gpu *v = zpp_cost_gpu_for_device("Tesla V100-SXM2-32GB");
    EXPECT(v && !strcmp(v->name, "v100"));
    EXPECT(!zpp_cost_gpu_for_device("host") && !zpp_cost_gpu_for_device("NVIDIA GeForce GTX 1080") &&
           !zpp_cost_gpu_for_device(NULL));
    EXPECT(zpp_cost_gpu_by_name("a100") == a && !zpp_cost_gpu_by_name("A100"));
    int n = 0;
    const zpp_cost_gpu *all = zpp_cost_gpus(&n);
    EXPECT(n == 4 && all[3].mem_gib == 141 && all[0].hbm_gbs == 900);
}

/* ---- The header ------------------------------------------------------------ */

/* The header's flops line: FLOPs a token = 6 x the params the first line
 * counts + 12 L C T. */
static void expect_flops_line(const char *text, const char *out) {
    char line[1024];
    EXPECT(line_starting(text, "flops: ", 0, line, sizeof line), "no flops: line in %s", out);
    double fpt = strtod(line + 7, NULL);
    const char *p = strstr(text, "GPT-2 ");
    EXPECT(p, "no parameter count in %s", out);
    double params = strtod(p + 6, NULL);
    EXPECT(params == 34176 && fpt == 6 * params + 12.0 * L_ * C_ * T_,
           "flops %.0f a token for %.0f params; see %s", fpt, params, out);
}

static void test_header_names_mode(void) {
    char cfg[512], out[512], args[2048], line[1024];
    /* ZeRO-3 on one rank and on two */
    model_cfg("zero3.json", "", cfg);
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    train_ok("z3_1", "", 1, args, out);
    char *text = read_text(out);
    EXPECT(line_starting(text, "mode: ZeRO-3, fp32, 1 rank on CPU", 0, line, sizeof line) &&
               line_starting(text, "train: 1 rank = 1 node of 1,", 0, line, sizeof line) &&
               !strstr(text, "1 ranks"),
           "the header of a 1-rank ZeRO-3 run; see %s", out);
    expect_flops_line(text, out);
    EXPECT(strstr(text, "peak n/a (CPU ranks") && strstr(text, "MFU n/a"),
           "a CPU run without a peak has no MFU; see %s", out);
    free(text);
    train_ok("z3_2", "", 2, args, out);
    text = read_text(out);
    EXPECT(line_starting(text, "mode: ZeRO-3, fp32, 2 ranks on CPU (host memory, MPI)", 0, line,
                         sizeof line),
           "the header of a 2-rank ZeRO-3 run; see %s", out);
    free(text);

    /* ZeRO++: all three on 2 nodes of 2, in bf16 */
    model_cfg("zeropp.json",
              "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3,"
              " \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 2,"
              " \"zero_quantized_gradients\": true}",
              cfg);
    snprintf(args, sizeof args, "--config %s --steps 1 --node-size 2", cfg);
    train_ok("zpp_4", "", 4, args, out);
    text = read_text(out);
    EXPECT(line_starting(text, "mode: ZeRO++ (qwZ, hpZ partition 2, qgZ), bf16, 4 ranks on CPU",
                         0, line, sizeof line) &&
               line_starting(text, "train: 4 ranks = 2 nodes of 2,", 0, line, sizeof line),
           "the header of a qwZ + hpZ + qgZ run; see %s", out);
    expect_flops_line(text, out);
    free(text);

    /* exactly the ones that are on: qgZ alone */
    model_cfg("qgz.json",
              "\"zero_optimization\": {\"stage\": 3, \"zero_quantized_gradients\": true}", cfg);
    snprintf(args, sizeof args, "--config %s --steps 1", cfg);
    train_ok("qgz_2", "", 2, args, out);
    text = read_text(out);
    EXPECT(line_starting(text, "mode: ZeRO++ (qgZ), fp32, 2 ranks", 0, line, sizeof line),
           "the header of a qgZ run; see %s", out);
    free(text);
}

/* Activation checkpointing, by the flag (1 rank) and by the config key
 * (2 ranks, ZeRO++): the header's model names it, a run without it names
 * nothing, and every step's loss (the metrics' %.9g, a float exactly) is
 * the run's without it. */
static void test_header_names_checkpointing(void) {
    char cfg[512], out[512], met[2][512], args[2048], line[1024];
    const char *zero = "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3,"
                       " \"zero_quantized_weights\": true, \"zero_quantized_gradients\": true}";
    for (int np = 1; np <= 2; np++) {
        model_cfg("ckpt.json", np == 1 ? "" : zero, cfg);
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "ckpt%d_%d.jsonl", np, k);
            snprintf(args, sizeof args, "--config %s --steps 3 --metrics %s%s", cfg,
                     zpp_test_tmp_path(name, met[k]),
                     !k ? "" : np == 1 ? " --recompute"
                                       : " --set zeropp.activation_checkpointing=true");
            snprintf(name, sizeof name, "ckpt%d_%d", np, k);
            train_ok(name, "", np, args, out);
            char *text = read_text(out);
            EXPECT(line_starting(text, "train: ", 0, line, sizeof line), "see %s", out);
            EXPECT(!strstr(line, "activation checkpointing") == !k &&
                       (!k || strstr(line, ", T=16, activation checkpointing), ")),
                   "%s: the header's model says '%s'; see %s", args, line, out);
            free(text);
        }
        double loss[2][MAX_STEPS];
        for (int k = 0; k < 2; k++)
            EXPECT(zpp_test_read_metric(met[k], "loss", loss[k], MAX_STEPS) == 3, "%s", met[k]);
        for (int s = 0; s < 3; s++)
            EXPECT(loss[0][s] == loss[1][s],
                   "%d rank(s), step %d: loss %.9g with checkpointing, %.9g without", np, s + 1,
                   loss[1][s], loss[0][s]);
    }
}

/* ---- Save lines, summary, TFLOP/s and MFU ---------------------------------- */

/* The bytes of the regular files of a folder. */
static double folder_bytes(const char *dir) {
    DIR *d = opendir(dir);
    EXPECT(d != NULL, "cannot open %s", dir);
    double b = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char f[1024];
        struct stat sb;
        snprintf(f, sizeof f, "%s/%s", dir, de->d_name);
        if (stat(f, &sb) == 0 && S_ISREG(sb.st_mode)) b += (double)sb.st_size;
    }
    closedir(d);
    return b;
}

/* 5 steps saved every 2: a line for steps 2, 4 and 5 each, in order, after
 * the step's own line, naming the step folder, its size and time. The
 * summary's last checkpoint is the last save. */
static void test_save_lines(void) {
    char cfg[512], out[512], dir[512], args[2048], line[1024], want[1024];
    model_cfg("save.json", "", cfg);
    zpp_test_tmp_path("ckpt", dir);
    snprintf(args, sizeof args, "--config %s --steps 5 --save %s --save-every 2", cfg, dir);
    train_ok("save", "", 2, args, out);
    char *text = read_text(out);
    const int steps[3] = {2, 4, 5};
    EXPECT(count_str(text, "saved step ") == 3, "3 saves, 3 lines; see %s", out);
    const char *prev = text;
    for (int i = 0; i < 3; i++) {
        snprintf(want, sizeof want, "saved step %d to %s/step-%08d (", steps[i], dir, steps[i]);
        EXPECT(line_starting(text, want, 0, line, sizeof line), "no '%s' in %s", want, out);
        const char *at = strstr(text, want);
        char step_line[64];
        snprintf(step_line, sizeof step_line, "step %5d |", steps[i]);
        const char *sl = strstr(text, step_line);
        EXPECT(sl && sl < at && at > prev, "save %d is not after its step's line; see %s",
               steps[i], out);
        prev = at;
        double mb = 0, secs = -1;
        EXPECT(sscanf(line + strlen(want), "%lf MB, %lf s)", &mb, &secs) == 2 && secs >= 0,
               "'%s'", line);
        if (i == 2) { /* the last is kept: its size on disk */
            char folder[600];
            snprintf(folder, sizeof folder, "%s/step-%08d", dir, steps[i]);
            double b = folder_bytes(folder);
            EXPECT(fabs(mb - b / 1e6) <= 0.005 * b / 1e6 + 1e-3,
                   "the line says %g MB, the folder holds %.0f bytes", mb, b);
        }
    }
    snprintf(want, sizeof want, "  checkpoint        %s/step-%08d", dir, 5);
    EXPECT(line_starting(text, want, 0, line, sizeof line), "no '%s' in %s", want, out);
    free(text);

    /* --steps 0: the initial weights, one line, and no summary */
    snprintf(args, sizeof args, "--config %s --steps 0 --save %s", cfg, dir);
    train_ok("save0", "", 1, args, out);
    text = read_text(out);
    snprintf(want, sizeof want, "saved the initial weights (step 0) to %s/step-%08d (", dir, 0);
    EXPECT(line_starting(text, want, 0, line, sizeof line) && !strstr(text, "summary:"),
           "see %s", out);
    free(text);
}

/* The number after `key` in a line ("loss " -> 5.1234). */
static double after(const char *line, const char *key) {
    const char *p = strstr(line, key);
    EXPECT(p, "no '%s' in '%s'", key, line);
    return strtod(p + strlen(key), NULL);
}

/* The summary: steps, tokens, the final train loss as the last step line
 * printed it, the last and best validation loss as the metrics hold them. */
static void test_summary(void) {
    char cfg[512], out[512], met[512], args[2048], line[1024], last_step[1024];
    model_cfg("sum.json", "", cfg);
    snprintf(args, sizeof args, "--config %s --steps 6 --eval-every 2 --metrics %s", cfg,
             zpp_test_tmp_path("sum.jsonl", met));
    train_ok("sum", "", 2, args, out);
    char *text = read_text(out);
    EXPECT(line_starting(text, "step     6 |", 0, last_step, sizeof last_step), "see %s", out);
    EXPECT(line_starting(text, "summary: 6 steps (1-6) in ", 0, line, sizeof line),
           "no summary in %s", out);
    /* 6 steps x global batch 4 (2 ranks x 2) x T 16 */
    EXPECT(strstr(line, " wall, 384 tokens"), "'%s'", line);
    EXPECT(line_starting(text, "  final train loss  ", 0, line, sizeof line), "see %s", out);
    char want[64], got[64];
    snprintf(want, sizeof want, "%.6s", strstr(last_step, "loss ") + 5);
    snprintf(got, sizeof got, "%.6s", line + strlen("  final train loss  "));
    EXPECT(!strcmp(want, got) && strstr(line, "(step 6)"),
           "summary's final loss %s, step 6's line %s; see %s", got, want, out);
    double loss[MAX_STEPS];
    EXPECT(zpp_test_read_metric(met, "loss", loss, MAX_STEPS) == 6);
    EXPECT(fabs(after(line, "final train loss  ") - loss[5]) <= 5e-5,
           "final loss %s against the metrics' %.9g", got, loss[5]);
    double val[MAX_STEPS];
    int nv = zpp_test_read_metric(met, "val_loss", val, MAX_STEPS);
    EXPECT(nv == 3, "%d evaluations", nv);
    int best = 0;
    for (int i = 1; i < nv; i++)
        if (val[i] < val[best]) best = i;
    EXPECT(line_starting(text, "  val loss          ", 0, line, sizeof line), "see %s", out);
    char expect[256];
    snprintf(expect, sizeof expect, "  val loss          %.4f (step 6), best %.4f (step %d)",
             val[2], val[best], 2 * (best + 1));
    EXPECT(!strcmp(line, expect), "'%s', expected '%s'", line, expect);
    EXPECT(line_starting(text, "  tokens/s          ", 0, line, sizeof line) &&
               strstr(line, "(steps 2-6:"),
           "see %s", out);
    EXPECT(!strstr(text, "  checkpoint "), "no save, no checkpoint line; see %s", out);
    free(text);
}

/* TFLOP/s on every metrics line is FLOPs a token x tokens/s / ranks, and
 * MFU = TFLOP/s / the peak given, by the flag or by the config key; the
 * step line and the summary print the same ratio. Without a peak the
 * field is null. */
static void test_metrics_tflops_mfu(void) {
    char cfg[512], out[512], met[512], args[2048], line[1024];
    model_cfg("mfu.json", "", cfg);
    const double peak = 0.25;
    snprintf(args, sizeof args, "--config %s --steps 4 --metrics %s --peak-tflops %g", cfg,
             zpp_test_tmp_path("mfu.jsonl", met), peak);
    train_ok("mfu", "", 2, args, out);
    double tf[MAX_STEPS], mfu[MAX_STEPS], tps[MAX_STEPS];
    EXPECT(read_field(met, "tflops", tf, MAX_STEPS) == 4, "no tflops in %s", met);
    EXPECT(read_field(met, "mfu", mfu, MAX_STEPS) == 4, "no mfu in %s", met);
    EXPECT(zpp_test_read_metric(met, "tokens_per_s", tps, MAX_STEPS) == 4);
    for (int s = 0; s < 4; s++) {
        EXPECT(tf[s] > 0 && fabs(mfu[s] - tf[s] / peak) <= 1e-5 * mfu[s],
               "step %d: mfu %.9g, tflops %.9g / peak %g = %.9g", s + 1, mfu[s], tf[s], peak,
               tf[s] / peak);
        double want = 217344.0 * tps[s] / 2 / 1e12;
        EXPECT(fabs(tf[s] - want) <= 1e-4 * want, "step %d: tflops %.9g, expected %.9g",
               s + 1, tf[s], want);
    }
    char *text = read_text(out);
    EXPECT(strstr(text, "peak 0.25 TFLOP/s a rank (--peak-tflops)"), "see %s", out);
    for (int s = 0; s < 4; s++) {
        char pre[32];
        snprintf(pre, sizeof pre, "step %5d |", s + 1);
        EXPECT(line_starting(text, pre, 0, line, sizeof line), "no step %d line", s + 1);
        double pct = after(line, "| MFU ");
        EXPECT(fabs(pct - 100 * mfu[s]) <= 0.006, "step %d line: MFU %g%%, metrics %g", s + 1,
               pct, mfu[s]);
    }
    EXPECT(line_starting(text, "  TFLOP/s a rank    ", 0, line, sizeof line), "see %s", out);
    double st = after(line, "TFLOP/s a rank    "), sm = after(line, "| MFU ");
    EXPECT(fabs(sm - 100 * st / peak) <= 0.006 + 1e-3 * sm, "summary: MFU %g%% of %g TFLOP/s",
           sm, st);
    free(text);

    /* the config key does the same */
    snprintf(args, sizeof args, "--config %s --steps 2 --metrics %s --set zeropp.peak_tflops=0.5",
             cfg, met);
    train_ok("mfu_key", "", 1, args, out);
    text = read_text(out);
    EXPECT(strstr(text, "peak 0.5 TFLOP/s a rank (zeropp.peak_tflops)"), "see %s", out);
    free(text);
    EXPECT(read_field(met, "tflops", tf, MAX_STEPS) == 2 &&
           read_field(met, "mfu", mfu, MAX_STEPS) == 2);
    EXPECT(fabs(mfu[1] - tf[1] / 0.5) <= 1e-5 * mfu[1]);

    /* no peak on CPU ranks: null, and n/a on the lines */
    snprintf(args, sizeof args, "--config %s --steps 2 --metrics %s", cfg, met);
    train_ok("mfu_none", "", 1, args, out);
    EXPECT(zpp_test_count_lines(met, "\"mfu\":null") == 2 &&
               zpp_test_count_lines(out, "| MFU n/a |") == 2,
           "see %s and %s", met, out);
    EXPECT(run_train("", 1, "--steps 1 --peak-tflops 0", out, zpp_test_tmp_path("e.txt", line)) !=
               0 && zpp_test_count_lines(line, "--peak-tflops expects") == 1,
           "--peak-tflops 0 is refused; see %s", line);
}

/* ---- The progress bar -------------------------------------------------------- */

/* Every step line begins a line of its own: after the bar is wiped (the
 * last \r of its line), the text is the step line itself. */
static void expect_lines_clean(const char *text, const char *what) {
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        size_t k = strlen(line);
        while (k && line[k - 1] == '\r') line[--k] = '\0'; /* a pty's \r\n */
        const char *tail = strrchr(line, '\r');
        tail = tail ? tail + 1 : line;
        if (strstr(line, "| loss "))
            EXPECT(!strncmp(tail, "step ", 5), "%s: a step line garbled by the bar: '%s'", what,
                   line);
        if (strstr(line, "saved step "))
            EXPECT(!strncmp(tail, "saved step ", 11), "%s: a save line garbled: '%s'", what,
                   line);
        if (strstr(line, "summary:"))
            EXPECT(!strncmp(tail, "summary:", 8), "%s: the summary garbled: '%s'", what, line);
        p += n + (p[n] == '\n');
    }
}

/* Runs the command with its stdout and stderr on a new terminal (a pty)
 * and returns what it wrote there. */
static char *run_on_pty(const char *cmd) {
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    EXPECT(m >= 0 && grantpt(m) == 0 && unlockpt(m) == 0, "no pty: %s", strerror(errno));
    const char *slave = ptsname(m);
    EXPECT(slave != NULL);
    fflush(NULL);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        setsid();
        int s = open(slave, O_RDWR);
        int nul = open("/dev/null", O_RDONLY);
        if (s < 0 || nul < 0) _exit(126);
        dup2(nul, 0);
        dup2(s, 1);
        dup2(s, 2);
        close(m);
        unsetenv("ZPP_PROGRESS");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    size_t cap = 1 << 20, n = 0;
    char *text = zpp_test_malloc(cap);
    for (;;) { /* until every writer has closed the terminal (EIO) */
        ssize_t r = read(m, text + n, cap - 1 - n);
        if (r > 0) n += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else break;
        if (n == cap - 1) break;
    }
    text[n] = '\0';
    int status = 0;
    waitpid(pid, &status, 0);
    close(m);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "'%s' failed (status %d): %s", cmd,
           status, text);
    return text;
}

static void test_progress_bar(void) {
    char cfg[512], out[512], args[2048], dir[512];
    model_cfg("bar.json", "", cfg);
    zpp_test_tmp_path("bar_ckpt", dir);
    snprintf(args, sizeof args, "--config %s --steps 6 --eval-every 3 --save %s --save-every 3",
             cfg, dir);

    /* mpirun writing into a file: no bar, whatever terminal ctest runs in */
    train_ok("bar_file", "env -u ZPP_PROGRESS", 2, args, out);
    char *text = read_text(out);
    EXPECT(!strstr(text, "ETA") && !strchr(text, '\r'), "a bar in a file; see %s", out);
    free(text);

    /* forced on: the bar, its ETA, and the log lines on lines of their own */
    train_ok("bar_forced", "ZPP_PROGRESS=1", 2, args, out);
    text = read_text(out);
    EXPECT(strstr(text, "] 6/6 loss ") && strstr(text, "/step | ETA ") &&
               strstr(text, "] 1/6 loss ") && strstr(text, "ETA --"),
           "no bar with ZPP_PROGRESS=1; see %s", out);
    expect_lines_clean(text, out);
    free(text);

    /* mpirun on a terminal: the bar by default, off with ZPP_PROGRESS=0 */
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 240 %s --oversubscribe --bind-to none -np 2 %s train %s",
             mpi, cli, args);
    text = run_on_pty(cmd);
    EXPECT(strstr(text, "] 6/6 loss ") && strstr(text, "| ETA "),
           "no bar under mpirun on a terminal:\n%s", text);
    expect_lines_clean(text, "mpirun on a pty");
    free(text);
    snprintf(cmd, sizeof cmd,
             "ZPP_PROGRESS=0 timeout 240 %s --oversubscribe --bind-to none -np 2 %s train %s", mpi,
             cli, args);
    text = run_on_pty(cmd);
    EXPECT(strstr(text, "summary:") && !strstr(text, "ETA"), "ZPP_PROGRESS=0 drew:\n%s", text);
    free(text);
    /* and alone (no mpirun) on a terminal */
    snprintf(cmd, sizeof cmd, "timeout 240 %s train %s", cli, args);
    text = run_on_pty(cmd);
    EXPECT(strstr(text, "] 6/6 loss "), "no bar on a terminal without mpirun:\n%s", text);
    expect_lines_clean(text, "alone on a pty");
    free(text);
}

ZPP_TESTS(ZPP_TEST(test_flops_per_token), ZPP_TEST(test_gpu_presets),
          ZPP_TEST(test_header_names_mode), ZPP_TEST(test_header_names_checkpointing),
          ZPP_TEST(test_save_lines), ZPP_TEST(test_summary),
          ZPP_TEST(test_metrics_tflops_mfu), ZPP_TEST(test_progress_bar))
