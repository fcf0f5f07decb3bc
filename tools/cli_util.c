/* tools/cli_util.c — small helpers shared by the subcommands: the error
 * line, parsing numbers, timing, medians, byte counts for people. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "zeropp.h"

int zpp_cli_fail(const char *context, int status) {
    fprintf(stderr, "zeropp: %s: %s\n", context,
            zpp_last_error()[0] ? zpp_last_error() : zpp_status_str((zpp_status)status));
    return 1;
}

/* The largest count accepted: far beyond any tensor, and exact in a double
 * (counts are printed and compared as doubles here and there). */
#define ZPP_CLI_COUNT_MAX (1ull << 53)

/* x * y, or -1 past ZPP_CLI_COUNT_MAX. */
static int count_mul(unsigned long long *x, unsigned long long y) {
    if (y && *x > ZPP_CLI_COUNT_MAX / y) return -1;
    *x *= y;
    return 0;
}

int zpp_cli_parse_count(const char *s, size_t *out) {
    if (!s || !out) return -1;
    /* The number, read exactly in decimal: digits with an optional fraction
     * and exponent, as m * 10^e. No sign, spaces, hex, inf or nan. */
    unsigned long long m = 0;
    long e = 0;
    int digits = 0;
    const char *p = s;
    for (int frac = 0;; p++) {
        if (*p == '.' && !frac) {
            frac = 1;
            continue;
        }
        if (!isdigit((unsigned char)*p)) break;
        digits++;
        if (m == 0 && *p == '0') {
            if (frac) e--;
            continue;
        }
        if (m > 100000000000000000ull) return -1; /* > 18 significant digits */
        m = m * 10 + (unsigned)(*p - '0');
        if (frac) e--;
    }
    if (!digits) return -1;
    if (*p == 'e' || *p == 'E') {
        p++;
        int neg = *p == '-';
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return -1;
        long x = 0;
        for (; isdigit((unsigned char)*p); p++)
            if ((x = x * 10 + (*p - '0')) > 100) return -1;
        e += neg ? -x : x;
    }
    /* The suffix: k, M, B or G (powers of 10), Ki, Mi, Gi (powers of 2). */
    unsigned long long mul = 1;
    const char c = (char)tolower((unsigned char)*p);
    if (c == 'k') mul = 1000ull;
    else if (c == 'm') mul = 1000000ull;
    else if (c == 'b' || c == 'g') mul = 1000000000ull;
    else if (*p) return -1;
    if (mul > 1) p++;
    if (*p == 'i') {
        if (c == 'k') mul = 1ull << 10;
        else if (c == 'm') mul = 1ull << 20;
        else if (c == 'g') mul = 1ull << 30;
        else return -1; /* "Bi" */
        p++;
    }
    if (*p) return -1;
    /* m * mul * 10^e must be a whole number <= ZPP_CLI_COUNT_MAX. */
    if (m == 0) {
        *out = 0;
        return 0;
    }
    for (; e < 0 && m % 10 == 0; e++) m /= 10; /* "1.50k": trailing zeros */
    if (count_mul(&m, mul)) return -1;
    for (; e > 0; e--)
        if (count_mul(&m, 10)) return -1;
    for (; e < 0; e++) {
        if (m % 10) return -1; /* a fraction of one */
        m /= 10;
    }
    if (m > SIZE_MAX) return -1;
    *out = (size_t)m;
    return 0;
}

int zpp_cli_parse_int(const char *s, int lo, int *out) {
    size_t v = 0;
    if (zpp_cli_parse_count(s, &v) || v > (size_t)1 << 24 || (long long)v < (long long)lo)
        return -1;
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
