/* tools/plot.c — `zeropp plot`: the metrics lines of `zeropp train
 * --metrics FILE` as one PNG of four panels (loss, validation loss,
 * tokens/s, cross-node bytes per step), one line per run, drawn by gnuplot
 * from the distribution (apt-get install gnuplot-nox).
 *
 * A file may hold several runs: `zeropp train --demo` writes ZeRO-3's steps,
 * then ZeRO++'s, to one file. A new run starts where the "mode" changes or
 * the step number does not increase.
 *
 * Every line is read and checked before gnuplot is looked for; gnuplot draws into
 * a temporary file beside the output, renamed onto it only when gnuplot
 * succeeded, so a failure leaves no output (nor a half-written one). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "core/env.h"

#define PLOT_MAX_FILES 64
#define PLOT_MAX_RUNS 128

static void plot_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp plot METRICS.jsonl... --out FILE.png [--label NAME]...\n"
            "                   [--title TEXT] [--width PX] [--height PX]\n"
            "\n"
            "Draws the metrics that `zeropp train --metrics FILE` writes, for one or more\n"
            "runs side by side: training loss, validation loss, tokens/s and cross-node\n"
            "bytes per step, one line per run. A file may hold several runs (`train --demo`\n"
            "writes ZeRO-3's, then ZeRO++'s): a run ends where \"mode\" changes or the\n"
            "step number does not grow.\n"
            "\n"
            "  --out FILE.png  the picture (written only when everything succeeded)\n"
            "  --label NAME    the legend of the i-th file's runs (repeat, in file order;\n"
            "                  default: the file's name; \"NAME: mode\" for each run of a file\n"
            "                  that holds several)\n"
            "  --title TEXT    the title above the panels\n"
            "  --width PX      default 1200;  --height PX  default 900\n"
            "\n"
            "Needs gnuplot (apt-get install gnuplot-nox).\n");
}

/* One step of one run; NAN where the line has no such value. */
typedef struct plot_point {
    double step, loss, val_loss, tokens_per_s, cross_bytes;
} plot_point;

typedef struct plot_run {
    char label[256];
    char mode[64];
    int file; /* index into the file list */
    plot_point *pts;
    size_t n, cap;
} plot_run;

typedef struct plot_data {
    plot_run runs[PLOT_MAX_RUNS];
    int n_runs;
} plot_data;

static void plot_data_free(plot_data *d) {
    for (int i = 0; i < d->n_runs; i++) free(d->runs[i].pts);
    d->n_runs = 0;
}

/* A number, a JSON null (NAN: `train` writes null for a skipped step's
 * non-finite loss), or absent (NAN, when `optional`). 0 if the key holds
 * something else, or is absent and required. */
static int json_value(const cJSON *o, const char *key, int optional, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NAN;
    if (!v) return optional;
    if (cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v)) return 0;
    *out = v->valuedouble;
    return 1;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Reads one metrics file into d's runs. 0, or 1 after printing one line
 * that names the file and line. */
static int read_metrics(const char *path, int file_index, plot_data *d) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "zeropp plot: cannot read %s: %s\n", path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0, runs_before = d->n_runs;
    plot_run *run = NULL;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        size_t lead = strspn(line, " \t");
        if (line[lead] == 0) continue; /* blank lines are allowed */
        cJSON *o = cJSON_Parse(line);
        if (!o || !cJSON_IsObject(o)) {
            fprintf(stderr,
                    "zeropp plot: %s line %d: not a JSON object; give the files `zeropp train "
                    "--metrics` writes\n",
                    path, lineno);
            cJSON_Delete(o);
            rc = 1;
            break;
        }
        plot_point p;
        const char *bad = NULL;
        if (!json_value(o, "step", 0, &p.step) || !(p.step >= 0)) bad = "step";
        else if (!json_value(o, "loss", 0, &p.loss)) bad = "loss";
        else if (!json_value(o, "val_loss", 1, &p.val_loss)) bad = "val_loss";
        else if (!json_value(o, "tokens_per_s", 0, &p.tokens_per_s)) bad = "tokens_per_s";
        else if (!json_value(o, "cross_node_bytes", 0, &p.cross_bytes)) bad = "cross_node_bytes";
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "mode");
        const char *mode = cJSON_IsString(m) ? m->valuestring : "";
        if (bad) {
            fprintf(stderr,
                    "zeropp plot: %s line %d: no number \"%s\"%s; give the files `zeropp train "
                    "--metrics` writes\n",
                    path, lineno, bad, !strcmp(bad, "step") ? " >= 0" : "");
            cJSON_Delete(o);
            rc = 1;
            break;
        }
        if (!run || strcmp(run->mode, mode) != 0 ||
            (run->n > 0 && !(p.step > run->pts[run->n - 1].step))) {
            if (d->n_runs == PLOT_MAX_RUNS) {
                fprintf(stderr, "zeropp plot: more than %d runs; plot fewer at a time\n",
                        PLOT_MAX_RUNS);
                cJSON_Delete(o);
                rc = 1;
                break;
            }
            run = &d->runs[d->n_runs++];
            memset(run, 0, sizeof *run);
            run->file = file_index;
            snprintf(run->mode, sizeof run->mode, "%s", mode);
        }
        cJSON_Delete(o);
        if (run->n == run->cap) {
            size_t nc = run->cap ? 2 * run->cap : 256;
            plot_point *np = realloc(run->pts, nc * sizeof *np);
            if (!np) {
                fprintf(stderr, "zeropp plot: out of memory reading %s\n", path);
                rc = 1;
                break;
            }
            run->pts = np;
            run->cap = nc;
        }
        run->pts[run->n++] = p;
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "zeropp plot: error reading %s: %s\n", path, strerror(errno));
        rc = 1;
    }
    if (rc == 0 && d->n_runs == runs_before) {
        fprintf(stderr, "zeropp plot: %s holds no metrics lines; give the files `zeropp train "
                        "--metrics` writes\n",
                path);
        rc = 1;
    }
    free(line);
    fclose(f);
    return rc;
}

/* The legends: --label or the file's name; where a file holds several runs,
 * their modes, after "NAME: " when there is a label or another file. */
static void name_runs(plot_data *d, char **files, int n_files, char **labels, int n_labels) {
    for (int i = 0; i < d->n_runs; i++) {
        plot_run *r = &d->runs[i];
        int same_file = 0;
        for (int j = 0; j < d->n_runs; j++) same_file += d->runs[j].file == r->file;
        const char *name = r->file < n_labels ? labels[r->file] : base_name(files[r->file]);
        const char *mode = r->mode[0] ? r->mode : "run";
        if (same_file == 1) snprintf(r->label, sizeof r->label, "%s", name);
        else if (r->file < n_labels || n_files > 1)
            snprintf(r->label, sizeof r->label, "%s: %s", name, mode);
        else snprintf(r->label, sizeof r->label, "%s", mode);
    }
}

/* gnuplot's path, or NULL: the PATH search execvp would do. */
static int find_gnuplot(char *buf, size_t cap) {
    const char *path = zpp_env_get(ZPP_ENV_PATH);
    if (!path) return 0;
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, cap, "%.*s/gnuplot", (int)n, n ? path : ".");
        if (access(buf, X_OK) == 0) return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

/* A string as a gnuplot double-quoted string. */
static void gp_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

static void gp_value(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, " %.9g", v);
    else fprintf(f, " ?");
}

/* The data of every run as gnuplot inline data blocks ($run0 ... ), then
 * the four panels. Column 1 step, 2 loss, 3 val_loss, 4 tokens/s, 5
 * cross-node MB; "?" is a missing value (a skipped step's loss, the steps
 * without validation). */
static void write_script(FILE *f, const plot_data *d, const char *png, const char *title,
                         int width, int height) {
    for (int i = 0; i < d->n_runs; i++) {
        fprintf(f, "$run%d << EOD\n", i);
        for (size_t k = 0; k < d->runs[i].n; k++) {
            const plot_point *p = &d->runs[i].pts[k];
            fprintf(f, "%.0f", p->step);
            gp_value(f, p->loss);
            gp_value(f, p->val_loss);
            gp_value(f, p->tokens_per_s);
            gp_value(f, p->cross_bytes / 1e6);
            fputc('\n', f);
        }
        fprintf(f, "EOD\n");
    }
    /* noenhanced: labels and titles print as given (run names hold "_") */
    fprintf(f, "set terminal pngcairo noenhanced size %d,%d font \",10\"\n", width, height);
    fprintf(f, "set output ");
    gp_string(f, png);
    /* headroom above the lines for the legend, which also hides what
     * passes behind it (opaque) */
    double room = 0.1 * d->n_runs < 0.6 ? 0.1 * d->n_runs : 0.6;
    fprintf(f, "\nset datafile missing \"?\"\nset grid\nset key top right opaque samplen 2\n"
               "set xlabel \"step\"\nset offsets 0, 0, graph %.2f, 0\n"
               "set multiplot layout 2,2 title ",
            room);
    gp_string(f, title);
    fprintf(f, " font \",12\"\n");
    static const struct {
        const char *title, *ylabel;
        int col;
        const char *style;
    } panels[4] = {
        {"training loss", "loss", 2, "lines lw 1.5"},
        {"validation loss", "loss", 3, "linespoints lw 1.5 pt 7 ps 0.6"},
        {"throughput", "tokens/s", 4, "lines lw 1.5"},
        {"cross-node traffic", "MB per step (per node)", 5, "lines lw 1.5"},
    };
    for (int p = 0; p < 4; p++) {
        int any = 0;
        for (int i = 0; i < d->n_runs; i++)
            for (size_t k = 0; k < d->runs[i].n && !any; k++) {
                const plot_point *q = &d->runs[i].pts[k];
                double v = p == 0 ? q->loss : p == 1 ? q->val_loss : p == 2 ? q->tokens_per_s
                                                                            : q->cross_bytes;
                any = isfinite(v);
            }
        fprintf(f, "set title \"%s\"\nset ylabel \"%s\"\n", panels[p].title, panels[p].ylabel);
        fprintf(f, "set yrange [%s:*]\n", p >= 2 ? "0" : "*");
        if (!any) { /* nothing to draw: an empty frame that says so */
            fprintf(f, "unset key\nset label 1 \"no %s in these metrics\" at graph 0.5,0.5 "
                       "center\nplot [0:1][0:1] NaN notitle\nunset label 1\nset key\n",
                    panels[p].title);
            continue;
        }
        fprintf(f, "plot");
        int first = 1;
        for (int i = 0; i < d->n_runs; i++) {
            /* a run with no point in this panel gets no line (and no legend) */
            int has = 0;
            for (size_t k = 0; k < d->runs[i].n && !has; k++) {
                const plot_point *q = &d->runs[i].pts[k];
                double v = p == 0 ? q->loss : p == 1 ? q->val_loss : p == 2 ? q->tokens_per_s
                                                                            : q->cross_bytes;
                has = isfinite(v);
            }
            if (!has) continue;
            fprintf(f, "%s $run%d using 1:%d with %s lc %d title ", first ? "" : ",", i,
                    panels[p].col, panels[p].style, i + 1);
            gp_string(f, d->runs[i].label);
            first = 0;
        }
        fprintf(f, "\n");
    }
    fprintf(f, "unset multiplot\nset output\n");
}

/* Runs gnuplot on the script; 0 when it exited 0. Its messages (warnings
 * such as "empty x range" for a run of one step) are kept, and printed
 * only when it failed. */
static int run_gnuplot(const char *gnuplot, const char *script_path) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], STDERR_FILENO);
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execl(gnuplot, "gnuplot", script_path, (char *)NULL);
        fprintf(stderr, "cannot run %s: %s\n", gnuplot, strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    char msg[4096];
    size_t len = 0;
    ssize_t got;
    char sink[512];
    while ((got = read(fd[0], len < sizeof msg - 1 ? msg + len : sink,
                       len < sizeof msg - 1 ? sizeof msg - 1 - len : sizeof sink)) != 0) {
        if (got < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (len < sizeof msg - 1) len += (size_t)got;
    }
    msg[len] = 0;
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) fprintf(stderr, "%s", msg);
    return ok ? 0 : -1;
}

/* What `zeropp plot` was asked. */
typedef struct plot_args {
    char *files[PLOT_MAX_FILES], *labels[PLOT_MAX_FILES];
    int n_files, n_labels;
    const char *out, *title; /* title NULL: one naming the runs */
    long long width, height;
} plot_args;

/* The options: 0 to plot, 1 after --help, -1 after saying on stderr what is
 * wrong with the command line. */
static int parse_plot_args(int argc, char **argv, plot_args *pa) {
    memset(pa, 0, sizeof *pa);
    pa->width = 1200;
    pa->height = 900;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plot_usage(stdout);
            return 1;
        }
        if (!strncmp(a, "--", 2)) {
            static const char *const opts[] = {"--out", "--label", "--title", "--width",
                                               "--height"};
            int o = -1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(a, opts[k])) o = k;
            if (o < 0) {
                fprintf(stderr, "zeropp plot: unknown option '%s' (see zeropp plot --help)\n", a);
                return -1;
            }
            if (i + 1 >= argc || !argv[i + 1][0]) {
                fprintf(stderr, "zeropp plot: %s needs a value\n", a);
                return -1;
            }
            char *v = argv[++i];
            if (o == 0) pa->out = v;
            else if (o == 1) {
                if (pa->n_labels == PLOT_MAX_FILES) {
                    fprintf(stderr, "zeropp plot: more than %d --label\n", PLOT_MAX_FILES);
                    return -1;
                }
                pa->labels[pa->n_labels++] = v;
            } else if (o == 2) pa->title = v;
            else if (zpp_cli_parse_range(v, 100, 10000, o == 3 ? &pa->width : &pa->height)) {
                fprintf(stderr, "zeropp plot: %s expects pixels in [100, 10000], got '%s'\n", a,
                        v);
                return -1;
            }
            continue;
        }
        if (pa->n_files == PLOT_MAX_FILES) {
            fprintf(stderr, "zeropp plot: more than %d metrics files; plot fewer at a time\n",
                    PLOT_MAX_FILES);
            return -1;
        }
        pa->files[pa->n_files++] = argv[i];
    }
    if (pa->n_files == 0 || !pa->out) {
        fprintf(stderr, "zeropp plot: %s (see zeropp plot --help)\n",
                pa->n_files == 0 ? "name at least one metrics file" : "--out FILE.png is required");
        return -1;
    }
    if (pa->n_labels > pa->n_files) {
        fprintf(stderr, "zeropp plot: %d --label for %d files; give at most one per file\n",
                pa->n_labels, pa->n_files);
        return -1;
    }
    return 0;
}

/* "zeropp training: RUN, RUN", into buf. */
static const char *default_title(const plot_data *d, char *buf, size_t cap) {
    int at = snprintf(buf, cap, "zeropp training:");
    for (int i = 0; i < d->n_runs && at < (int)cap; i++)
        at += snprintf(buf + at, cap - (size_t)at, "%s %s", i ? "," : "", d->runs[i].label);
    return buf;
}

/* The picture: gnuplot draws into OUT.tmp-XXXXXX beside OUT (same file
 * system, so rename is atomic) from a script in a temporary file, and the
 * picture is renamed onto OUT only when it succeeded. 0, or 1 after saying
 * what failed; no temporary file stays either way. */
static int draw(const plot_data *d, const char *gnuplot, const char *out, const char *title,
                int width, int height) {
    int rc = 1, png_fd = -1, script_fd = -1;
    size_t ol = strlen(out);
    char *tmp_png = malloc(ol + 16), script[4096];
    const char *tmpdir = zpp_env_get(ZPP_ENV_TMPDIR);
    snprintf(script, sizeof script, "%s/zeropp-plot-XXXXXX", tmpdir && tmpdir[0] ? tmpdir : "/tmp");
    FILE *sf = NULL;
    struct stat sb;
    if (!tmp_png) {
        fprintf(stderr, "zeropp plot: out of memory\n");
        goto out;
    }
    snprintf(tmp_png, ol + 16, "%s.tmp-XXXXXX", out);
    png_fd = mkstemp(tmp_png);
    if (png_fd < 0) {
        fprintf(stderr, "zeropp plot: cannot write beside %s: %s\n", out, strerror(errno));
        goto out;
    }
    /* mkstemp makes the file private (0600); the picture gets the mode a
     * new file would (0666 less the umask). */
    mode_t um = umask(0);
    umask(um);
    fchmod(png_fd, 0666 & ~um); /* a failure only leaves the mode private */
    close(png_fd);
    script_fd = mkstemp(script);
    sf = script_fd >= 0 ? fdopen(script_fd, "w") : NULL;
    if (!sf) {
        fprintf(stderr, "zeropp plot: cannot write the temporary file %s: %s\n", script,
                strerror(errno));
        goto out;
    }
    write_script(sf, d, tmp_png, title, width, height);
    if (fclose(sf) != 0) {
        fprintf(stderr, "zeropp plot: writing %s: %s\n", script, strerror(errno));
        goto out;
    }
    if (run_gnuplot(gnuplot, script) != 0) {
        fprintf(stderr, "zeropp plot: gnuplot failed (its messages are above); %s not written\n",
                out);
        goto out;
    }
    if (stat(tmp_png, &sb) != 0 || sb.st_size == 0) {
        fprintf(stderr, "zeropp plot: gnuplot wrote no picture; %s not written\n", out);
        goto out;
    }
    if (rename(tmp_png, out) != 0) {
        fprintf(stderr, "zeropp plot: cannot write %s: %s\n", out, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (rc != 0 && png_fd >= 0) unlink(tmp_png); /* made, and not renamed onto OUT */
    if (script_fd >= 0) unlink(script);
    free(tmp_png);
    return rc;
}

/* "wrote OUT: 2 runs (RUN, 12 steps; RUN, 12 steps)". */
static void print_written(const char *out, const plot_data *d) {
    printf("wrote %s: %d run%s (", out, d->n_runs, d->n_runs == 1 ? "" : "s");
    for (int i = 0; i < d->n_runs; i++)
        printf("%s%s, %zu steps", i ? "; " : "", d->runs[i].label, d->runs[i].n);
    printf(")\n");
}

int zpp_cli_plot(int argc, char **argv) {
    plot_args pa;
    int pr = parse_plot_args(argc, argv, &pa);
    if (pr != 0) return pr > 0 ? 0 : 2;
    static plot_data d; /* runs: a few KiB each; static keeps the stack small */
    memset(&d, 0, sizeof d);
    char gnuplot[4096], deftitle[512];
    int rc = 0;
    /* The input first: a bad file is named whether or not gnuplot is here. */
    for (int i = 0; i < pa.n_files && rc == 0; i++) rc = read_metrics(pa.files[i], i, &d);
    if (rc != 0) {
        rc = 1;
        goto out;
    }
    if (!find_gnuplot(gnuplot, sizeof gnuplot)) {
        fprintf(stderr, "zeropp plot: gnuplot not found on PATH; install it: apt-get install "
                        "gnuplot-nox\n");
        rc = 1;
        goto out;
    }
    name_runs(&d, pa.files, pa.n_files, pa.labels, pa.n_labels);
    const char *title = pa.title ? pa.title : default_title(&d, deftitle, sizeof deftitle);
    rc = draw(&d, gnuplot, pa.out, title, (int)pa.width, (int)pa.height);
    if (rc == 0) print_written(pa.out, &d);
out:
    plot_data_free(&d);
    return rc;
}
