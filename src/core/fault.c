/* core/fault.c — ZPP_FAULT, parsed in one place (fault.h). */
#include "core/fault.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const struct {
    const char *name;
    zpp_fault_kind kind;
} zpp__fault_kinds[] = {
    {"nonfinite", ZPP_FAULT_NONFINITE},
    {"save_fail", ZPP_FAULT_SAVE_FAIL},
    {"save_kill", ZPP_FAULT_SAVE_KILL},
};

/* A decimal step in [0, INT_MAX] at *s; advances *s. */
static int zpp__fault_step(const char **s, int *out) {
    if (**s < '0' || **s > '9') return -1;
    char *end = NULL;
    long v = strtol(*s, &end, 10);
    if (v > INT_MAX) return -1;
    *out = (int)v;
    *s = end;
    return 0;
}

zpp_status zpp_fault_from_env(zpp_fault *f_p) {
    zpp_fault f = {ZPP_FAULT_NONE, 0, 0};
    const char *env = getenv("ZPP_FAULT");
    if (env && env[0]) {
        const char *at = strchr(env, '@');
        for (size_t i = 0; at && i < sizeof zpp__fault_kinds / sizeof zpp__fault_kinds[0]; i++)
            if ((size_t)(at - env) == strlen(zpp__fault_kinds[i].name) &&
                !strncmp(env, zpp__fault_kinds[i].name, (size_t)(at - env)))
                f.kind = zpp__fault_kinds[i].kind;
        const char *s = at ? at + 1 : env;
        int ok = f.kind != ZPP_FAULT_NONE && zpp__fault_step(&s, &f.first) == 0;
        f.last = f.first;
        if (ok && *s == '-') {
            s++;
            ok = zpp__fault_step(&s, &f.last) == 0 && f.last >= f.first;
        }
        if (!ok || *s)
            return zpp_error(ZPP_ERR_CONFIG,
                             "ZPP_FAULT='%s': expected nonfinite@STEP, nonfinite@FIRST-LAST, "
                             "save_fail@STEP or save_kill@STEP",
                             env);
    }
    *f_p = f;
    return ZPP_OK;
}
