/* core/fault_hooks.c — the test hooks of fault.h, compiled only with
 * -DZPP_FAULT_HOOKS=ON (fault_nohooks.c otherwise). TEST-ONLY: this file
 * holds every fault the library can inject, and its one exit. */
#include "core/fault.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

int zpp_fault_hooks_built(void) { return 1; }

static const struct {
    const char *name;
    zpp_fault_kind kind;
} zpp__fault_kinds[] = {
    {"nonfinite", ZPP_FAULT_NONFINITE},
    {"save_fail", ZPP_FAULT_SAVE_FAIL},
    {"save_kill", ZPP_FAULT_SAVE_KILL},
    {"save_slow", ZPP_FAULT_SAVE_SLOW},
};

/* A decimal step in [1, INT_MAX] at *s; advances *s. */
static int fault_step(const char **s, int *out) {
    if (**s < '0' || **s > '9') return -1;
    char *end = NULL;
    long v = strtol(*s, &end, 10);
    if (v < 1 || v > INT_MAX) return -1;
    *out = (int)v;
    *s = end;
    return 0;
}

zpp_status zpp_fault_from_env(zpp_fault *f_p) {
    zpp_fault f = {ZPP_FAULT_NONE, 0, 0};
    const char *env = getenv("ZPP_FAULT"); /* not in core/env.h: test builds only */
    if (env && env[0]) {
        const char *at = strchr(env, '@');
        for (size_t i = 0; at && i < sizeof zpp__fault_kinds / sizeof zpp__fault_kinds[0]; i++)
            if ((size_t)(at - env) == strlen(zpp__fault_kinds[i].name) &&
                !strncmp(env, zpp__fault_kinds[i].name, (size_t)(at - env)))
                f.kind = zpp__fault_kinds[i].kind;
        const char *s = at ? at + 1 : env;
        int ok = f.kind != ZPP_FAULT_NONE && fault_step(&s, &f.first) == 0;
        f.last = f.first;
        if (ok && *s == '-') {
            s++;
            ok = fault_step(&s, &f.last) == 0 && f.last >= f.first;
        }
        if (!ok || *s)
            return zpp_error(ZPP_ERR_CONFIG,
                             "ZPP_FAULT='%s': expected nonfinite@STEP, nonfinite@FIRST-LAST, "
                             "save_fail@STEP, save_kill@STEP or save_slow@STEP (steps count "
                             "from 1)",
                             env);
    }
    *f_p = f;
    return ZPP_OK;
}

int zpp_fault_fires(const zpp_fault *f, zpp_fault_kind kind, int step, int rank, int world) {
    if (!f || f->kind != kind || kind == ZPP_FAULT_NONE || step < f->first || step > f->last)
        return 0;
    switch (kind) {
    case ZPP_FAULT_NONFINITE: return rank == 0;
    case ZPP_FAULT_SAVE_FAIL: return rank == world - 1;
    case ZPP_FAULT_SAVE_KILL: return rank == (world > 1 ? 1 : 0);
    case ZPP_FAULT_SAVE_SLOW: return rank == world - 1;
    default: return 0;
    }
}

zpp_status zpp_fault_save_error(const char *path, int step) {
    return zpp_error(ZPP_ERR_IO,
                     "checkpoint: cannot write %s: injected failure (ZPP_FAULT=save_fail@%d)",
                     path, step);
}

void zpp_fault_slow_save(void) {
    struct timespec left = {ZPP_FAULT_SLOW_SAVE_S, 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

zpp_status zpp_fault_kill_mid_write(FILE *f, const void *p, size_t n) {
    fwrite(p, 1, n, f);
    fflush(f);
    _exit(137); /* as kill -9 leaves it: no atexit handlers, no cleanup */
}

static int mpi_max_count = INT_MAX;

int zpp_fault_mpi_max_count(void) { return mpi_max_count; }

zpp_status zpp_fault_set_mpi_max_count(int max_count) {
    mpi_max_count = max_count > 0 ? max_count : INT_MAX;
    return ZPP_OK;
}
