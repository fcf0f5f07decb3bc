/* bench/gpu/trace/timeline.c — where a training step's wall time goes on
 * the GPU, from a trace written by cupti_trace.c.
 *
 *   zpp_timeline TRACE.tsv BEGIN_REGEX [SKIP [GAP_US [TOP]]]
 *
 * A step runs from the start of one kernel whose name matches BEGIN_REGEX
 * (POSIX extended; the step's first kernel, e.g. "embed_forward" for ours,
 * "encoder_forward" for llm.c) to the start of the next; the first SKIP
 * steps (default 2) are warm-up and left out. Within a step the device is
 * busy while any kernel, memcpy or memset runs (the union of their
 * intervals, over all streams) and idle otherwise, so
 *
 *   wall = busy + idle,  idle = the sum of the gaps between busy intervals.
 *
 * Each gap ends when some activity starts. If the API call that launched
 * that activity (same correlation id) returned only after the gap began,
 * the device sat idle because the host had not yet asked for more: a "host"
 * gap, and the longest other API call overlapping it says what the host
 * was doing (a synchronize, a copy), or "host code" if none did. Otherwise
 * the work was queued in time and the gap is the device's own (launch
 * latency, a cross-stream wait): a "device" gap.
 *
 * Prints, for the steady steps, their wall time (median, range) and the
 * split above, the largest gaps of the median step, and the kernels by
 * time a step; the line starting "steady" holds the totals in ns for
 * scripts. Names are as CUPTI gives them (mangled): pipe through c++filt.
 * A bench tool: messages go to stderr and any error exits 2. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* getline, strdup */
#endif
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char type; /* K M S (device), R D (host API) */
    uint64_t start, end;
    uint32_t id, corr; /* stream or thread; correlation id */
    int name;          /* index into the name table */
} rec;

typedef struct {
    uint64_t start, len;
    int before, after; /* device records on either side */
    int host;          /* the host launched `after` late */
    int host_call;     /* API record the host spent longest in, -1: none */
} gap;

typedef struct {
    uint64_t t0, wall, idle, host_idle, kernel_ns;
    int kernels, copies, gaps, small_gaps;
    uint64_t small_idle;
} step;

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "zpp_timeline: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    exit(2);
}

static void *grow(void *p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    p = realloc(p, c * size);
    if (!p) die("out of memory%s", "");
    *cap = c;
    return p;
}

/* ---- names: interned, so a kernel's totals are kept by index ---------- */
static char **g_names;
static size_t g_n_names, g_names_cap;
static int *g_slots; /* open addressing: name index + 1, 0 = empty */
static size_t g_n_slots;

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int intern(const char *s) {
    if (2 * (g_n_names + 1) > g_n_slots) {
        size_t n = g_n_slots ? 2 * g_n_slots : 4096;
        int *slots = calloc(n, sizeof *slots);
        if (!slots) die("out of memory%s", "");
        for (size_t i = 0; i < g_n_names; i++) {
            size_t j = hash(g_names[i]) & (n - 1);
            while (slots[j]) j = (j + 1) & (n - 1);
            slots[j] = (int)i + 1;
        }
        free(g_slots);
        g_slots = slots;
        g_n_slots = n;
    }
    size_t j = hash(s) & (g_n_slots - 1);
    for (; g_slots[j]; j = (j + 1) & (g_n_slots - 1))
        if (!strcmp(g_names[g_slots[j] - 1], s)) return g_slots[j] - 1;
    g_names = grow(g_names, &g_names_cap, g_n_names + 1, sizeof *g_names);
    g_names[g_n_names] = strdup(s);
    if (!g_names[g_n_names]) die("out of memory%s", "");
    g_slots[j] = (int)g_n_names + 1;
    return (int)g_n_names++;
}

/* ---- reading ------------------------------------------------------------ */
static rec *g_dev, *g_api;
static size_t g_n_dev, g_n_api;

static int by_start(const void *a, const void *b) {
    const rec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void read_trace(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) die("cannot read %s", path);
    size_t cap_dev = 0, cap_api = 0, line_cap = 0;
    char *line = NULL;
    long lineno = 0;
    while (getline(&line, &line_cap, f) > 0) {
        lineno++;
        rec r;
        unsigned long long s, e;
        unsigned id, corr;
        int at = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%c\t%llu\t%llu\t%u\t%u\t%n", &r.type, &s, &e, &id, &corr, &at) != 5 ||
            !at || !strchr("KMSRD", r.type) || e < s) {
            fprintf(stderr, "zpp_timeline: %s:%ld is not a trace line\n", path, lineno);
            exit(2);
        }
        r.start = s, r.end = e, r.id = id, r.corr = corr, r.name = intern(line + at);
        if (strchr("KMS", r.type)) {
            g_dev = grow(g_dev, &cap_dev, g_n_dev + 1, sizeof r);
            g_dev[g_n_dev++] = r;
        } else {
            g_api = grow(g_api, &cap_api, g_n_api + 1, sizeof r);
            g_api[g_n_api++] = r;
        }
    }
    free(line);
    fclose(f);
    qsort(g_dev, g_n_dev, sizeof *g_dev, by_start);
    qsort(g_api, g_n_api, sizeof *g_api, by_start);
}

/* ---- the launching call of each correlation id ---------------------------
 * A runtime call and the driver call inside it share the id; the launch is
 * over when the outer one returns, the later end. */
static uint64_t *g_launch_end;
static size_t g_n_corr;

static void index_launches(void) {
    for (size_t i = 0; i < g_n_api; i++)
        if (g_api[i].corr >= g_n_corr) g_n_corr = (size_t)g_api[i].corr + 1;
    g_launch_end = calloc(g_n_corr ? g_n_corr : 1, sizeof *g_launch_end);
    if (!g_launch_end) die("out of memory%s", "");
    for (size_t i = 0; i < g_n_api; i++)
        if (g_api[i].end > g_launch_end[g_api[i].corr]) g_launch_end[g_api[i].corr] = g_api[i].end;
}

/* The longest API call other than the launch of `corr` overlapping
 * [a, b), by its overlap; -1 if none. g_api is sorted by start, and no call
 * is longer than `longest`, so only calls starting after a - longest can
 * overlap. */
static uint64_t g_longest_api;

static int host_call_in(uint64_t a, uint64_t b, uint32_t corr) {
    size_t lo = 0, hi = g_n_api;
    uint64_t from = a > g_longest_api ? a - g_longest_api : 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_api[mid].start < from) lo = mid + 1;
        else hi = mid;
    }
    int best = -1;
    uint64_t best_len = 0;
    for (size_t i = lo; i < g_n_api && g_api[i].start < b; i++) {
        if (g_api[i].corr == corr || g_api[i].end <= a) continue;
        uint64_t s = g_api[i].start > a ? g_api[i].start : a;
        uint64_t e = g_api[i].end < b ? g_api[i].end : b;
        if (e > s && e - s > best_len) best = (int)i, best_len = e - s;
    }
    return best;
}

/* ---- one step ------------------------------------------------------------- */
static gap *g_gaps;
static size_t g_n_gaps, g_gaps_cap;

static void add_gap(step *st, uint64_t a, uint64_t b, int before, int after, uint64_t small) {
    const rec *next = &g_dev[after];
    uint64_t launched = next->corr < g_n_corr ? g_launch_end[next->corr] : 0;
    gap g = {a, b - a, before, after, launched > a, -1};
    if (g.host) {
        g.host_call = host_call_in(a, launched < b ? launched : b, next->corr);
        st->host_idle += g.len;
    }
    st->idle += g.len;
    st->gaps++;
    if (g.len < small) {
        st->small_gaps++;
        st->small_idle += g.len;
    }
    g_gaps = grow(g_gaps, &g_gaps_cap, g_n_gaps + 1, sizeof g);
    g_gaps[g_n_gaps++] = g;
}

/* The step from device record `first` (a begin kernel) up to, not
 * including, `last` (the next one). Gaps are appended to g_gaps. */
static step measure(size_t first, size_t last, uint64_t small) {
    step st = {0};
    st.t0 = g_dev[first].start;
    st.wall = g_dev[last].start - st.t0;
    uint64_t busy_to = st.t0;
    int prev = (int)first;
    for (size_t i = first; i < last; i++) {
        const rec *r = &g_dev[i];
        if (r->type == 'K') st.kernels++, st.kernel_ns += r->end - r->start;
        else st.copies++;
        if (r->start > busy_to) add_gap(&st, busy_to, r->start, prev, (int)i, small);
        if (r->end > busy_to) busy_to = r->end, prev = (int)i;
    }
    if (busy_to < g_dev[last].start)
        add_gap(&st, busy_to, g_dev[last].start, prev, (int)last, small);
    return st;
}

/* ---- report --------------------------------------------------------------- */
static int by_wall(const void *a, const void *b) {
    const step *x = a, *y = b;
    return x->wall < y->wall ? -1 : x->wall > y->wall;
}

static int by_len_desc(const void *a, const void *b) {
    const gap *x = a, *y = b;
    return x->len > y->len ? -1 : x->len < y->len;
}

static double ms(uint64_t ns) { return (double)ns / 1e6; }

static void print_gaps(uint64_t t0, uint64_t t1, int top) {
    size_t n = 0;
    for (size_t i = 0; i < g_n_gaps; i++)
        if (g_gaps[i].start >= t0 && g_gaps[i].start < t1) g_gaps[n++] = g_gaps[i];
    qsort(g_gaps, n, sizeof *g_gaps, by_len_desc);
    printf("Largest gaps of the median step (us; the gap's kind; the activity before and "
           "after it; for a host gap, the API call the host spent longest in):\n");
    for (size_t i = 0; i < n && (int)i < top; i++) {
        const gap *g = &g_gaps[i];
        printf("  %9.1f  %-6s  %s  ->  %s", (double)g->len / 1e3, g->host ? "host" : "device",
               g_names[g_dev[g->before].name], g_names[g_dev[g->after].name]);
        if (g->host && g->host_call >= 0)
            printf("  [host in %s]", g_names[g_api[g->host_call].name]);
        else if (g->host)
            printf("  [host code]");
        putchar('\n');
    }
}

typedef struct {
    int name, count;
    uint64_t ns;
} kernel_total;

static int by_ns_desc(const void *a, const void *b) {
    const kernel_total *x = a, *y = b;
    return x->ns > y->ns ? -1 : x->ns < y->ns;
}

static void print_kernels(size_t first, size_t last, int steps, int top) {
    kernel_total *t = calloc(g_n_names ? g_n_names : 1, sizeof *t);
    if (!t) die("out of memory%s", "");
    for (size_t i = 0; i < g_n_names; i++) t[i].name = (int)i;
    for (size_t i = first; i < last; i++) {
        if (g_dev[i].type != 'K') continue;
        t[g_dev[i].name].count++;
        t[g_dev[i].name].ns += g_dev[i].end - g_dev[i].start;
    }
    qsort(t, g_n_names, sizeof *t, by_ns_desc);
    printf("Kernels by time a step (mean over the steady steps; ms, launches):\n");
    for (size_t i = 0; i < g_n_names && (int)i < top && t[i].ns; i++)
        printf("  %8.3f  %6.1f  %s\n", ms(t[i].ns) / steps, (double)t[i].count / steps,
               g_names[t[i].name]);
    free(t);
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: zpp_timeline TRACE.tsv BEGIN_REGEX [SKIP [GAP_US [TOP]]]\n");
        return 2;
    }
    int skip = argc > 3 ? atoi(argv[3]) : 2;
    uint64_t small = (uint64_t)((argc > 4 ? atof(argv[4]) : 5.0) * 1e3);
    int top = argc > 5 ? atoi(argv[5]) : 15;
    regex_t re;
    if (regcomp(&re, argv[2], REG_EXTENDED | REG_NOSUB)) die("bad regular expression %s", argv[2]);
    read_trace(argv[1]);
    index_launches();
    for (size_t i = 0; i < g_n_api; i++)
        if (g_api[i].end - g_api[i].start > g_longest_api)
            g_longest_api = g_api[i].end - g_api[i].start;

    size_t *begins = NULL, n_begins = 0, cap = 0;
    for (size_t i = 0; i < g_n_dev; i++)
        if (g_dev[i].type == 'K' && !regexec(&re, g_names[g_dev[i].name], 0, NULL, 0)) {
            begins = grow(begins, &cap, n_begins + 1, sizeof *begins);
            begins[n_begins++] = i;
        }
    regfree(&re);
    if (skip < 0 || n_begins < (size_t)skip + 2) {
        fprintf(stderr,
                "zpp_timeline: %zu kernels match /%s/: need at least SKIP + 2 = %d to measure "
                "one step (run more steps, or check the name)\n",
                n_begins, argv[2], skip + 2);
        return 2;
    }
    int n = (int)(n_begins - 1) - skip;
    step *steps = calloc((size_t)n, sizeof *steps);
    step total = {0};
    if (!steps) die("out of memory%s", "");
    for (int s = 0; s < n; s++) {
        steps[s] = measure(begins[skip + s], begins[skip + s + 1], small);
        total.wall += steps[s].wall, total.idle += steps[s].idle;
        total.host_idle += steps[s].host_idle, total.kernel_ns += steps[s].kernel_ns;
        total.kernels += steps[s].kernels, total.gaps += steps[s].gaps;
        total.small_gaps += steps[s].small_gaps, total.small_idle += steps[s].small_idle;
    }
    step *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) die("out of memory%s", "");
    memcpy(sorted, steps, (size_t)n * sizeof *steps);
    qsort(sorted, (size_t)n, sizeof *sorted, by_wall);
    const step *med = &sorted[n / 2];

    printf("%s: %d steady steps (%d skipped), each from a kernel matching /%s/\n", argv[1], n,
           skip, argv[2]);
    printf("wall a step: median %.3f ms, range %.3f-%.3f\n", ms(med->wall), ms(sorted[0].wall),
           ms(sorted[n - 1].wall));
    printf("mean a step: wall %.3f ms = busy %.3f + idle %.3f (%.2f%%); idle in %.1f gaps: "
           "%.3f ms in %.1f under %.0f us, %.3f ms where the device waited for the host\n",
           ms(total.wall) / n, ms(total.wall - total.idle) / n, ms(total.idle) / n,
           100.0 * (double)total.idle / (double)total.wall, (double)total.gaps / n,
           ms(total.small_idle) / n, (double)total.small_gaps / n, (double)small / 1e3,
           ms(total.host_idle) / n);
    printf("kernels a step: %.1f launches, %.3f ms summed\n", (double)total.kernels / n,
           ms(total.kernel_ns) / n);
    printf("steady\tsteps=%d\twall_ns=%llu\tidle_ns=%llu\thost_idle_ns=%llu\tsmall_idle_ns=%llu"
           "\tgaps=%d\tkernels=%d\tkernel_ns=%llu\n",
           n, (unsigned long long)total.wall, (unsigned long long)total.idle,
           (unsigned long long)total.host_idle, (unsigned long long)total.small_idle, total.gaps,
           total.kernels, (unsigned long long)total.kernel_ns);
    print_gaps(med->t0, med->t0 + med->wall, top);
    print_kernels(begins[skip], begins[skip + n], n, top);
    free(sorted);
    free(steps);
    free(begins);
    return 0;
}
