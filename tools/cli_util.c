/* tools/cli_util.c — small helpers shared by the subcommands: parsing
 * numbers, timing, medians, byte counts for people. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli.h"

int zpp_cli_parse_count(const char *s, size_t *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1e3, end++;
    else if (*end == 'M' || *end == 'm') mul = 1e6, end++;
    else if (*end == 'B' || *end == 'b' || *end == 'G' || *end == 'g') mul = 1e9, end++;
    if (*end) return -1;
    v *= mul;
    if (v > 9.0e15) return -1;
    *out = (size_t)(v + 0.5);
    return 0;
}

int zpp_cli_parse_int(const char *s, int lo, int *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > 1 << 24) return -1;
    *out = (int)v;
    return 0;
}

double zpp_cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double zpp_cli_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

const char *zpp_cli_bytes(double b, char *buf, size_t cap) {
    if (b < 1e3) snprintf(buf, cap, "%.0f B", b);
    else if (b < 1e6) snprintf(buf, cap, "%.2f kB", b / 1e3);
    else if (b < 1e9) snprintf(buf, cap, "%.2f MB", b / 1e6);
    else snprintf(buf, cap, "%.2f GB", b / 1e9);
    return buf;
}
