/* tools/cli_util.c — small helpers shared by the subcommands: the error
 * line, parsing numbers, timing, medians, byte counts for people. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/suggest.h"
#include "zeropp.h"

int zpp_cli_fail(const char *context, int status) {
    const char *msg = zpp_last_error()[0] ? zpp_last_error() : zpp_status_str((zpp_status)status);
    size_t n = strlen(context);
    if (!strncmp(msg, context, n) && msg[n] == ':') /* not "checkpoint: checkpoint: ..." */
        fprintf(stderr, "zeropp: %s\n", msg);
    else
        fprintf(stderr, "zeropp: %s: %s\n", context, msg);
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

int zpp_cli_parse_range(const char *s, long long lo, long long hi, long long *out) {
    size_t v = 0;
    if (zpp_cli_parse_count(s, &v) || (unsigned long long)v > (unsigned long long)hi ||
        (long long)v < lo)
        return -1;
    *out = (long long)v;
    return 0;
}

static const zpp_cli_opt *find_opt(const zpp_cli_opt *opts, int n, const char *name, size_t len) {
    for (int k = 0; k < n; k++)
        if (opts[k].kind != ZPP_CLI_POS && strlen(opts[k].name) == len &&
            !strncmp(opts[k].name, name, len))
            return &opts[k];
    return NULL;
}

/* The option a mistyped one most likely meant, or NULL. */
static const char *guess_opt(const zpp_cli_opt *opts, int n, const char *name, size_t len) {
    char word[128];
    snprintf(word, sizeof word, "%.*s", (int)len, name);
    const char *names[128];
    int k = 0;
    for (int i = 0; i < n && k < 128; i++)
        if (opts[i].kind != ZPP_CLI_POS) names[k++] = opts[i].name;
    names[k < 128 ? k : 127] = "--help";
    return zpp_suggest(word, names, (size_t)(k < 128 ? k + 1 : 128));
}

int zpp_cli_parse_opts(const char *cmd, int argc, char **argv, const zpp_cli_opt *opts, int n,
                       int print) {
#define ZPP__ERR(...)                                                                         \
    do {                                                                                      \
        if (print) {                                                                          \
            fprintf(stderr, "zeropp %s: ", cmd);                                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
        }                                                                                     \
        return -1;                                                                            \
    } while (0)
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const zpp_cli_opt *o = find_opt(opts, n, a, len);
        if (!o && strncmp(a, "-", 1)) { /* the positional argument, if one is taken */
            const zpp_cli_opt *pos = NULL;
            for (int k = 0; k < n && !pos; k++)
                if (opts[k].kind == ZPP_CLI_POS) pos = &opts[k];
            if (pos && !*(const char **)pos->dst) {
                *(const char **)pos->dst = a;
                continue;
            }
            if (pos)
                ZPP__ERR("unexpected argument '%s': %s is already '%s' (see zeropp %s --help)",
                         a, pos->name, *(const char **)pos->dst, cmd);
            ZPP__ERR("unexpected argument '%s' (options start with --; see zeropp %s --help)", a,
                     cmd);
        }
        if (!o) {
            const char *guess = guess_opt(opts, n, a, len);
            if (guess)
                ZPP__ERR("unknown option '%.*s': did you mean %s? (see zeropp %s --help)",
                         (int)len, a, guess, cmd);
            ZPP__ERR("unknown option '%.*s' (see zeropp %s --help)", (int)len, a, cmd);
        }
        if (o->kind == ZPP_CLI_FLAG) {
            if (eq) ZPP__ERR("%s takes no value, got '%s'", o->name, a);
            *(int *)o->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!eq) {
            /* the next word is the value, unless it is one of our options
             * (`--data --steps 3`: the file name was forgotten) */
            const char *nx = i + 1 < argc ? argv[i + 1] : NULL;
            if (!nx) ZPP__ERR("%s needs a value", o->name);
            size_t nl = strchr(nx, '=') ? (size_t)(strchr(nx, '=') - nx) : strlen(nx);
            if (!strncmp(nx, "--", 2) && find_opt(opts, n, nx, nl))
                ZPP__ERR("%s needs a value, got the option '%s'", o->name, nx);
            v = nx;
            i++;
        }
        if (o->kind == ZPP_CLI_STR) {
            if (!v[0]) ZPP__ERR("%s needs a value, got ''", o->name);
            *(const char **)o->dst = v;
            continue;
        }
        if (o->kind == ZPP_CLI_LIST) {
            zpp_cli_list *l = o->dst;
            if (!v[0]) ZPP__ERR("%s needs a value, got ''", o->name);
            if (l->n == ZPP_CLI_LIST_CAP) ZPP__ERR("more than %d %s", ZPP_CLI_LIST_CAP, o->name);
            l->v[l->n++] = v;
            continue;
        }
        /* the range, never past what the field holds */
        long long lo = o->lo, hi = o->hi, x = 0;
        if (o->kind == ZPP_CLI_INT && hi > INT_MAX) hi = INT_MAX;
        if (o->kind == ZPP_CLI_LONG && hi > LONG_MAX) hi = LONG_MAX;
        if (lo < 0) lo = 0; /* counts have no sign */
        if (zpp_cli_parse_range(v, lo, hi, &x))
            ZPP__ERR("%s expects an integer in [%lld, %lld], got '%s' (suffixes: %s)", o->name,
                     lo, hi, v, ZPP_CLI_COUNT_HELP);
        switch (o->kind) {
        case ZPP_CLI_INT: *(int *)o->dst = (int)x; break;
        case ZPP_CLI_LONG: *(long *)o->dst = (long)x; break;
        case ZPP_CLI_SIZE: *(size_t *)o->dst = (size_t)x; break;
        case ZPP_CLI_U64: *(unsigned long long *)o->dst = (unsigned long long)x; break;
        default: break;
        }
    }
    return 0;
#undef ZPP__ERR
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
