/* test_plot.c — `zeropp plot` as a user runs it: on generated metrics
 * files it writes a PNG of the asked size (signature and IHDR checked), and
 * on a bad input (malformed line, missing key, missing or empty file, no
 * gnuplot) it fails with one clear line, a non-zero exit and no output file
 * (not even its temporary).
 *
 * ZPP_CLI (the zeropp command) comes from ctest. Without gnuplot the
 * drawing case skips (zpp_test_skip: exit 77, ctest reports it skipped). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testlib.h"

/* A fresh directory for one case's files. */
static void make_dir(char *dir, size_t cap) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, cap, "%s/zpp-test-plot-XXXXXX", t && t[0] ? t : "/tmp");
    EXPECT(mkdtemp(dir) != NULL, "mkdtemp %s", dir);
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

/* Entries in dir (without . and ..). */
static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    EXPECT(d != NULL, "opendir %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Runs `<env> zeropp plot <args>` with stderr joined to stdout; returns the
 * exit code, the output in out. */
static int run_plot(const char *env, const char *args, char *out, size_t cap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s '%s' plot %s 2>&1", env, getenv("ZPP_CLI"), args);
    FILE *p = popen(cmd, "r");
    EXPECT(p != NULL, "popen: %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    EXPECT(WIFEXITED(rc), "'%s' did not exit normally", cmd);
    return WEXITSTATUS(rc);
}

static int lines_of(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A metrics file as `zeropp train --metrics` writes it: `steps` steps of
 * each mode in turn, a validation loss every `eval` steps, loss null on
 * step 7 (a skipped step), values from rng. */
static void write_metrics(const char *path, zpp_rng *r, const char *const *modes, int n_modes,
                          int steps, int eval) {
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL, "cannot write %s", path);
    for (int m = 0; m < n_modes; m++) {
        double loss = 5.5, cross = 1e6 * (1 + zpp_rng_uniform(r));
        for (int s = 1; s <= steps; s++) {
            loss *= 0.97 + 0.02 * zpp_rng_uniform(r);
            fprintf(f, "{\"step\":%d,\"mode\":\"%s\",", s, modes[m]);
            if (s == 7) fprintf(f, "\"loss\":null,");
            else fprintf(f, "\"loss\":%.9g,", loss);
            fprintf(f,
                    "\"lr\":0.001,\"grad_norm\":1.5,\"tokens_per_s\":%.1f,\"step_ms\":300.1,"
                    "\"cross_node_bytes\":%.0f,\"intra_node_bytes\":4923408,"
                    "\"device_peak_bytes\":7025856,\"skipped\":%s,\"skipped_total\":%d",
                    2000 + 2000 * zpp_rng_uniform(r), cross, s == 7 ? "true" : "false",
                    s >= 7);
            if (eval && s % eval == 0) fprintf(f, ",\"val_loss\":%.9g", loss * 1.02);
            fprintf(f, "}\n");
        }
    }
    EXPECT(fclose(f) == 0, "writing %s", path);
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int have_gnuplot(void) {
    const char *path = getenv("PATH");
    char buf[4096];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)n, n ? path : ".");
        if (access(buf, X_OK) == 0) return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

/* Every way the input can be wrong: one line naming the problem, exit
 * code 1 (2 for a wrong command line), and nothing at --out. These run
 * without gnuplot: the input is checked first. */
static void test_plot_errors(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(1));
    char dir[256], good[512], bad[512], nokey[512], empty[512], png[512], args[4096], out[8192];
    make_dir(dir, sizeof dir);
    snprintf(good, sizeof good, "%s/good.jsonl", dir);
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    snprintf(nokey, sizeof nokey, "%s/nokey.jsonl", dir);
    snprintf(empty, sizeof empty, "%s/empty.jsonl", dir);
    snprintf(png, sizeof png, "%s/out.png", dir);
    static const char *const modes[] = {"zero3"};
    write_metrics(good, &rng, modes, 1, 12, 4);
    /* a malformed line after two good ones: "line 3" */
    FILE *f = fopen(bad, "w");
    EXPECT(f != NULL);
    fprintf(f, "{\"step\":1,\"loss\":5,\"tokens_per_s\":10,\"cross_node_bytes\":1}\n");
    fprintf(f, "{\"step\":2,\"loss\":4,\"tokens_per_s\":10,\"cross_node_bytes\":1}\n");
    fprintf(f, "{\"step\":3,\"loss\": oops}\n");
    fclose(f);
    f = fopen(nokey, "w");
    EXPECT(f != NULL);
    fprintf(f, "{\"step\":1,\"loss\":5,\"cross_node_bytes\":1}\n");
    fclose(f);
    f = fopen(empty, "w");
    EXPECT(f != NULL);
    fclose(f);
    const int files_before = count_entries(dir);

    struct {
        const char *env, *file, *want;
        int rc;
    } cases[] = {
        {"", bad, "line 3: not a JSON object", 1},
        {"", nokey, "line 1: no number \"tokens_per_s\"", 1},
        {"", empty, "holds no metrics lines", 1},
        {"", "/nonexistent/metrics.jsonl", "cannot read /nonexistent/metrics.jsonl", 1},
        /* no gnuplot on PATH (the input is good) */
        {"PATH=/nonexistent", good, "apt-get install gnuplot-nox", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "'%s' '%s' --out '%s'", good, cases[i].file, png);
        int rc = run_plot(cases[i].env, args, out, sizeof out);
        EXPECT(rc == cases[i].rc, "%s: exit %d, want %d; output: %s", cases[i].file, rc,
               cases[i].rc, out);
        EXPECT(strstr(out, cases[i].want) != NULL, "%s: want '%s' in: %s", cases[i].file,
               cases[i].want, out);
        EXPECT(lines_of(out) == 1 && !strncmp(out, "zeropp plot: ", 13), "not one line: %s", out);
        EXPECT(!exists(png), "%s: %s written although the command failed", cases[i].file, png);
        EXPECT(count_entries(dir) == files_before, "%s: a file was left behind in %s",
               cases[i].file, dir);
    }
    /* gnuplot runs and fails (a stand-in that writes a half picture and
     * complains): its message, ours, and no picture left, half or whole */
    char bin[512], fake[600], env[1200];
    snprintf(bin, sizeof bin, "%s/bin", dir);
    EXPECT(mkdir(bin, 0755) == 0, "mkdir %s", bin);
    snprintf(fake, sizeof fake, "%s/gnuplot", bin);
    f = fopen(fake, "w");
    EXPECT(f != NULL);
    fprintf(f, "#!/bin/sh\nfor o in $(sed -n 's/^set output \\\"\\(.*\\)\\\"$/\\1/p' \"$1\"); do "
               "echo half > \"$o\"; done\necho 'gnuplot: line 9: boom' >&2\nexit 1\n");
    fclose(f);
    EXPECT(chmod(fake, 0755) == 0);
    snprintf(env, sizeof env, "PATH='%s':\"$PATH\"", bin);
    snprintf(args, sizeof args, "'%s' --out '%s'", good, png);
    int rc = run_plot(env, args, out, sizeof out);
    EXPECT(rc == 1 && strstr(out, "line 9: boom") && strstr(out, "gnuplot failed"),
           "exit %d, output: %s", rc, out);
    EXPECT(!exists(png), "%s written although gnuplot failed", png);
    EXPECT(count_entries(dir) == files_before + 1, "a file was left behind in %s", dir);

    /* wrong command lines: usage errors, exit 2 */
    const char *usage_cases[] = {"--out x.png",
                                 "a.jsonl",
                                 "a.jsonl --out",
                                 "a.jsonl --out x.png --bogus 1",
                                 "a.jsonl --out x.png --width 5",
                                 "a.jsonl --out x.png --label A --label B"};
    for (size_t i = 0; i < sizeof usage_cases / sizeof usage_cases[0]; i++) {
        int rc = run_plot("", usage_cases[i], out, sizeof out);
        EXPECT(rc == 2 && lines_of(out) == 1, "'%s': exit %d, output: %s", usage_cases[i], rc,
               out);
    }
    remove_dir(dir);
}

/* Two generated files, the second holding two runs (as `train --demo`
 * writes them): a PNG of the asked size, three runs named in the summary,
 * nothing else left in the directory. */
static void test_plot_png(void) {
    if (!have_gnuplot())
        zpp_test_skip("gnuplot is not installed, so `zeropp plot` cannot draw; install it "
                      "(scripts/install-deps.sh, or apt-get install gnuplot-nox)");
    zpp_rng rng = zpp_rng_make(zpp_test_seed(2));
    char dir[256], a[512], b[512], png[512], args[4096], out[8192];
    make_dir(dir, sizeof dir);
    snprintf(a, sizeof a, "%s/runA.jsonl", dir);
    snprintf(b, sizeof b, "%s/demo.jsonl", dir);
    snprintf(png, sizeof png, "%s/both.png", dir);
    static const char *const one[] = {"zero3"}, *const two[] = {"zero3", "qwz+hpz+qgz"};
    int steps_a = 10 + (int)(zpp_rng_u64(&rng) % 40), steps_b = 10 + (int)(zpp_rng_u64(&rng) % 40);
    write_metrics(a, &rng, one, 1, steps_a, 5);
    write_metrics(b, &rng, two, 2, steps_b, 0); /* no validation loss in this file */
    for (int round = 0; round < 2; round++) { /* the second overwrites the first picture */
        int w = 400 + (int)(zpp_rng_u64(&rng) % 800), h = 300 + (int)(zpp_rng_u64(&rng) % 600);
        snprintf(args, sizeof args,
                 "'%s' '%s' --out '%s' --label 'run \"A\"' --width %d --height %d", a, b, png, w,
                 h);
        int rc = run_plot("", args, out, sizeof out);
        EXPECT(rc == 0, "exit %d: %s", rc, out);
        char want[256];
        snprintf(want, sizeof want,
                 "3 runs (run \"A\", %d steps; demo.jsonl: zero3, %d steps; demo.jsonl: "
                 "qwz+hpz+qgz, %d steps)",
                 steps_a, steps_b, steps_b);
        EXPECT(strstr(out, want) != NULL, "want '%s' in: %s", want, out);
        FILE *f = fopen(png, "rb");
        EXPECT(f != NULL, "%s not written", png);
        unsigned char head[24];
        EXPECT(fread(head, 1, sizeof head, f) == sizeof head, "%s: shorter than a PNG header", png);
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fclose(f);
        static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
        EXPECT(memcmp(head, sig, 8) == 0, "no PNG signature");
        EXPECT(be32(head + 8) == 13 && memcmp(head + 12, "IHDR", 4) == 0, "no IHDR chunk first");
        EXPECT(be32(head + 16) == (uint32_t)w && be32(head + 20) == (uint32_t)h,
               "IHDR says %ux%u, asked %dx%d", be32(head + 16), be32(head + 20), w, h);
        EXPECT(size > 2000, "%ld bytes: too small to hold four panels", size);
        EXPECT(count_entries(dir) == 3, "temporary files left in %s", dir);
    }
    remove_dir(dir);
}

ZPP_TESTS(ZPP_TEST(test_plot_errors), ZPP_TEST(test_plot_png))
