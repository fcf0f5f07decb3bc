/* core/env.c — the one place the environment is read (core/env.h). */
#include "core/env.h"

#include <stdlib.h>

static const struct {
    const char *name, *doc;
} zpp__env_table[ZPP_ENV_COUNT] = {
#define ZPP_ENV_ROW(id, name, doc) [id] = {name, doc},
    ZPP_ENV_VARS(ZPP_ENV_ROW)
#undef ZPP_ENV_ROW
};

static int known(zpp_env_var v) { return (int)v >= 0 && v < ZPP_ENV_COUNT; }

const char *zpp_env_get(zpp_env_var v) {
    if (!known(v)) return NULL;
    const char *s = getenv(zpp__env_table[v].name);
    return s && s[0] ? s : NULL;
}

const char *zpp_env_name(zpp_env_var v) { return known(v) ? zpp__env_table[v].name : "?"; }

const char *zpp_env_doc(zpp_env_var v) { return known(v) ? zpp__env_table[v].doc : "?"; }

int zpp_env_set(zpp_env_var v, const char *value) {
    if (!known(v)) return -1;
    return setenv(zpp__env_table[v].name, value, 1) == 0 ? 0 : -1;
}

int zpp_env_default(zpp_env_var v, const char *value) {
    if (!known(v)) return -1;
    if (zpp_env_get(v)) return 0;
    return setenv(zpp__env_table[v].name, value, 1) == 0 ? 0 : -1;
}
