/* train/config.c — DeepSpeed-style JSON configuration (see config.h).
 *
 * Parsing walks every member of every object and looks its dotted path up
 * in the key table (train/config_keys.h), so an unknown key is found where
 * it is (and named with its path, with the keys known there) rather than
 * silently skipped. Everything is applied to a copy of the
 * caller's config, validated as a whole, and copied back only on success. */
#include "train/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/file.h"
#include "core/suggest.h"
#include "train/config_keys.h"

#define ZPP__PATH_CAP 160
#define ZPP__CONFIG_MAX_BYTES (16u << 20)

/* Parsing context: the source named in messages and the config being built. */
typedef struct zpp__cfgctx {
    const char *src;
    zpp_train_config *cfg;
} zpp__cfgctx;

/* ------------------------------------------------------------------------ */
/* The key table (train/config_keys.h)                                       */
/* ------------------------------------------------------------------------ */

typedef enum zpp__kind {
    ZPP_CFG_OBJECT,
    ZPP_CFG_OBJECT_ON,
    ZPP_CFG_INT,
    ZPP_CFG_I64,
    ZPP_CFG_SEED,
    ZPP_CFG_NUM,
    ZPP_CFG_BOOL,
    ZPP_CFG_BETAS,
    ZPP_CFG_OPT_TYPE,
    ZPP_CFG_SCHED_TYPE,
    ZPP_CFG_WARMUP_TYPE,
    ZPP_CFG_DATA_ORDER,
    ZPP_CFG_FAMILY,
    ZPP_CFG_HF_ARCH,
    ZPP_CFG_STAGE,
    ZPP_CFG_KEEP_ACTS,
    ZPP_CFG_IGNORED
} zpp__kind;

typedef struct zpp__key {
    const char *path;
    zpp__kind kind;
    size_t off; /* of the field in zpp_train_config */
    long long lo, hi;
    double def[2];
    unsigned sched;
    const char *doc;
} zpp__key;

#define ZPP__FIELD(field) offsetof(zpp_train_config, field)
#define ZPP__NOFIELD(field) 0
#define ZPP__OFF_OBJECT ZPP__NOFIELD
#define ZPP__OFF_OBJECT_ON ZPP__FIELD
#define ZPP__OFF_INT ZPP__FIELD
#define ZPP__OFF_I64 ZPP__FIELD
#define ZPP__OFF_SEED ZPP__FIELD
#define ZPP__OFF_NUM ZPP__FIELD
#define ZPP__OFF_BOOL ZPP__FIELD
#define ZPP__OFF_BETAS ZPP__FIELD
#define ZPP__OFF_OPT_TYPE ZPP__NOFIELD
#define ZPP__OFF_SCHED_TYPE ZPP__FIELD
#define ZPP__OFF_WARMUP_TYPE ZPP__FIELD
#define ZPP__OFF_DATA_ORDER ZPP__FIELD
#define ZPP__OFF_FAMILY ZPP__FIELD
#define ZPP__OFF_HF_ARCH ZPP__FIELD
#define ZPP__OFF_STAGE ZPP__FIELD
#define ZPP__OFF_KEEP_ACTS ZPP__FIELD
#define ZPP__OFF_IGNORED ZPP__NOFIELD
#define ZPP__DEF(...) {__VA_ARGS__}
#define ZPP__KEY(path, kind, field, lo, hi, def, sched, doc)                   \
    {path, ZPP_CFG_##kind, ZPP__OFF_##kind(field), lo, hi, ZPP__DEF def, sched, doc},
static const zpp__key kKeys[] = {ZPP_CONFIG_KEYS(ZPP__KEY)};
#undef ZPP__KEY
#define ZPP__NKEYS (sizeof kKeys / sizeof kKeys[0])

/* The key's name within its object, and whether the object is `parent`. */
static const char *key_name(const zpp__key *k) {
    const char *dot = strrchr(k->path, '.');
    return dot ? dot + 1 : k->path;
}

static int key_in(const zpp__key *k, const char *parent) {
    size_t n = (size_t)(key_name(k) - k->path);
    if (n == 0) return parent[0] == '\0';
    return strlen(parent) == n - 1 && strncmp(k->path, parent, n - 1) == 0;
}

static const zpp__key *key_find(const char *parent, const char *name) {
    for (size_t i = 0; i < ZPP__NKEYS; i++)
        if (key_in(&kKeys[i], parent) && strcmp(key_name(&kKeys[i]), name) == 0) return &kKeys[i];
    return NULL;
}

#define ZPP__AT(cfg, k, type) ((type *)(void *)((char *)(cfg) + (k)->off))

/* ------------------------------------------------------------------------ */
/* Defaults                                                                  */
/* ------------------------------------------------------------------------ */

zpp_status zpp_train_config_defaults(zpp_train_config *cfg) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_defaults: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    /* Optimizer: torch.optim.AdamW's defaults, which DeepSpeed's AdamW
     * inherits. Scheduler: DeepSpeed's defaults, and no scheduler unless
     * one is given. ZeRO: DeepSpeed's reuse distance, 1e9. Model: a GPT
     * small enough to train on a laptop CPU in a demo, over bytes. */
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        switch (k->kind) {
        case ZPP_CFG_INT:
        case ZPP_CFG_BOOL:
        case ZPP_CFG_OBJECT_ON:
        case ZPP_CFG_KEEP_ACTS:
        case ZPP_CFG_STAGE: *ZPP__AT(cfg, k, int) = (int)k->def[0]; break;
        case ZPP_CFG_I64: *ZPP__AT(cfg, k, long long) = (long long)k->def[0]; break;
        case ZPP_CFG_SEED: *ZPP__AT(cfg, k, uint64_t) = (uint64_t)k->def[0]; break;
        case ZPP_CFG_NUM: *ZPP__AT(cfg, k, double) = k->def[0]; break;
        case ZPP_CFG_BETAS:
            cfg->optimizer.beta1 = k->def[0];
            cfg->optimizer.beta2 = k->def[1];
            break;
        case ZPP_CFG_SCHED_TYPE:
            *ZPP__AT(cfg, k, zpp_sched_type) = (zpp_sched_type)(int)k->def[0];
            break;
        case ZPP_CFG_WARMUP_TYPE:
            *ZPP__AT(cfg, k, zpp_warmup_type) = (zpp_warmup_type)(int)k->def[0];
            break;
        case ZPP_CFG_DATA_ORDER:
            *ZPP__AT(cfg, k, zpp_data_order) = (zpp_data_order)(int)k->def[0];
            break;
        case ZPP_CFG_FAMILY:
            *ZPP__AT(cfg, k, zpp_model_family_id) = (zpp_model_family_id)(int)k->def[0];
            break;
        case ZPP_CFG_HF_ARCH: *ZPP__AT(cfg, k, zpp_hf_arch) = (zpp_hf_arch)(int)k->def[0]; break;
        case ZPP_CFG_OBJECT:
        case ZPP_CFG_OPT_TYPE:
        case ZPP_CFG_IGNORED: break;
        }
    }
    cfg->ignored[0] = '\0';
    return ZPP_OK;
}


const char *zpp_sched_type_name(zpp_sched_type type) {
    switch (type) {
    case ZPP_SCHED_NONE: return "none";
    case ZPP_SCHED_WARMUP_LR: return "WarmupLR";
    case ZPP_SCHED_WARMUP_DECAY_LR: return "WarmupDecayLR";
    case ZPP_SCHED_WARMUP_COSINE_LR: return "WarmupCosineLR";
    }
    return "unknown";
}

/* ------------------------------------------------------------------------ */
/* Typed getters: each names the key's path and the expected type            */
/* ------------------------------------------------------------------------ */

static const char *json_type(const cJSON *it) {
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNull(it)) return "null";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    return "an invalid value";
}

static void path_join(char *out, const char *prefix, const char *key) {
    if (prefix[0]) snprintf(out, ZPP__PATH_CAP, "%s.%s", prefix, key);
    else snprintf(out, ZPP__PATH_CAP, "%s", key);
}

static zpp_status type_error(const zpp__cfgctx *c, const char *path, const char *want,
                             const cJSON *it) {
    return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be %s, got %s", c->src, path, want,
                     json_type(it));
}

/* An integer in [lo, hi]. JSON has only doubles; 3.0 is accepted, 3.5 not. */
static zpp_status get_int(const zpp__cfgctx *c, const cJSON *it, const char *path, long long lo,
                          long long hi, long long *out) {
    if (!cJSON_IsNumber(it)) return type_error(c, path, "an integer", it);
    double v = it->valuedouble;
    if (!isfinite(v) || v != floor(v))
        return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be an integer, got %g", c->src, path,
                         v);
    if (v < (double)lo || v > (double)hi)
        return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' is %.0f; it must be in [%lld, %lld]",
                         c->src, path, v, lo, hi);
    *out = (long long)v;
    return ZPP_OK;
}

static zpp_status get_num(const zpp__cfgctx *c, const cJSON *it, const char *path, double *out) {
    if (!cJSON_IsNumber(it)) return type_error(c, path, "a number", it);
    if (!isfinite(it->valuedouble))
        return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be finite", c->src, path);
    *out = it->valuedouble;
    return ZPP_OK;
}

static zpp_status get_bool(const zpp__cfgctx *c, const cJSON *it, const char *path, int *out) {
    if (!cJSON_IsBool(it)) return type_error(c, path, "a boolean (true/false)", it);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return ZPP_OK;
}

static zpp_status get_str(const zpp__cfgctx *c, const cJSON *it, const char *path,
                          const char **out) {
    if (!cJSON_IsString(it) || !it->valuestring) return type_error(c, path, "a string", it);
    *out = it->valuestring;
    return ZPP_OK;
}

/* true (ZPP_KEEP_ALL), false (0), "layernorm" or "gelu": family.h's bits. */
static zpp_status get_keep_acts(const zpp__cfgctx *c, const cJSON *it, const char *path,
                                int *out) {
    if (cJSON_IsBool(it)) {
        *out = cJSON_IsTrue(it) ? ZPP_KEEP_ALL : 0;
        return ZPP_OK;
    }
    if (!cJSON_IsString(it) || !it->valuestring)
        return type_error(c, path, "true, false, \"layernorm\" or \"gelu\"", it);
    if (strcmp(it->valuestring, "layernorm") == 0) *out = ZPP_KEEP_LAYERNORM;
    else if (strcmp(it->valuestring, "gelu") == 0) *out = ZPP_KEEP_GELU;
    else
        return zpp_error(ZPP_ERR_CONFIG,
                         "%s: '%s' is '%s'; use true (every output), false (none), "
                         "\"layernorm\" or \"gelu\"",
                         c->src, path, it->valuestring);
    return ZPP_OK;
}

/* A keep_acts value as JSON text. */
static const char *keep_acts_text(int bits) {
    return bits == ZPP_KEEP_ALL         ? "true"
           : bits == ZPP_KEEP_LAYERNORM ? "\"layernorm\""
           : bits == ZPP_KEEP_GELU      ? "\"gelu\""
                                        : "false";
}

static zpp_status want_object(const zpp__cfgctx *c, const cJSON *it, const char *path) {
    if (!cJSON_IsObject(it)) return type_error(c, path, "an object", it);
    return ZPP_OK;
}

/* A member name seen twice in one object is an error: JSON allows it, but
 * which value wins would be a guess. */
static zpp_status check_duplicate(const zpp__cfgctx *c, const cJSON *obj, const cJSON *it,
                                  const char *path) {
    for (const cJSON *p = obj->child; p && p != it; p = p->next)
        if (p->string && strcmp(p->string, it->string) == 0)
            return zpp_error(ZPP_ERR_CONFIG, "%s: duplicate key '%s'", c->src, path);
    return ZPP_OK;
}

/* The key the user most likely meant by the unknown `path` in `parent`
 * (NULL if none is close): a key of the same object whose name is a typo
 * away ("stge" -> "stage"); else a key elsewhere with exactly this name ("lr"
 * at the top level -> "optimizer.params.lr"); else the closest full path. */
static const zpp__key *suggest_key(const char *path, const char *parent) {
    const char *name = strrchr(path, '.') ? strrchr(path, '.') + 1 : path;
    const zpp__key *best = NULL;
    size_t best_d = (size_t)-1, d = 0;
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        if (k->kind == ZPP_CFG_IGNORED || !key_in(k, parent)) continue;
        if (zpp_suggest_close(name, key_name(k), &d) && d < best_d) best = k, best_d = d;
    }
    if (best) return best;
    for (size_t i = 0; i < ZPP__NKEYS; i++)
        if (kKeys[i].kind != ZPP_CFG_IGNORED && !strcmp(key_name(&kKeys[i]), name))
            return &kKeys[i];
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        if (k->kind != ZPP_CFG_IGNORED && zpp_suggest_close(path, k->path, &d) && d < best_d)
            best = k, best_d = d;
    }
    return best;
}

/* "unknown key 'a.b' (did you mean 'a.c'? known here: c, d (and DeepSpeed
 * knobs accepted and ignored: e, f))": the keys of the table in the object
 * `parent`. */
static zpp_status unknown_key(const zpp__cfgctx *c, const char *path, const char *parent) {
    char known[1024] = "", ignored[1024] = "", hint[ZPP__PATH_CAP + 24] = "";
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        if (!key_in(k, parent)) continue;
        char *list = k->kind == ZPP_CFG_IGNORED ? ignored : known;
        size_t len = strlen(list);
        snprintf(list + len, sizeof known - len, "%s%s", len ? ", " : "", key_name(k));
    }
    const zpp__key *guess = suggest_key(path, parent);
    if (guess) snprintf(hint, sizeof hint, "did you mean '%s'? ", guess->path);
    return zpp_error(ZPP_ERR_CONFIG, "%s: unknown key '%s' (%sknown here: %s%s%s%s)", c->src,
                     path, hint, known,
                     ignored[0] ? " (and DeepSpeed knobs accepted and ignored: " : "", ignored,
                     ignored[0] ? ")" : "");
}

/* Records an accepted-but-ignored DeepSpeed key once in cfg->ignored. */
static void note_ignored(zpp_train_config *cfg, const char *path) {
    size_t n = strlen(path), len = strlen(cfg->ignored);
    for (const char *p = cfg->ignored; (p = strstr(p, path)) != NULL; p += n) {
        int starts = p == cfg->ignored || p[-1] == ' ';
        int ends = p[n] == '\0' || p[n] == ',';
        if (starts && ends) return;
    }
    if (len + n + 3 >= sizeof cfg->ignored) return; /* a full list is only a note */
    if (len) {
        memcpy(cfg->ignored + len, ", ", 2);
        len += 2;
    }
    memcpy(cfg->ignored + len, path, n + 1);
}

/* ------------------------------------------------------------------------ */
/* Sections                                                                  */
/* ------------------------------------------------------------------------ */

/* Joins the member's dotted path into `path` and refuses duplicates. */
static zpp_status parse_member(const zpp__cfgctx *c, const cJSON *obj, const cJSON *it,
                               const char *prefix, char *path) {
    path_join(path, prefix, it->string ? it->string : "");
    return check_duplicate(c, obj, it, path);
}

static zpp_status parse_betas(const zpp__cfgctx *c, const cJSON *it, const char *path) {
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
        return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be an array of 2 numbers [beta1, beta2]",
                         c->src, path);
    char p0[ZPP__PATH_CAP + 4], p1[ZPP__PATH_CAP + 4];
    snprintf(p0, sizeof p0, "%s[0]", path);
    snprintf(p1, sizeof p1, "%s[1]", path);
    ZPP_CHECK(get_num(c, cJSON_GetArrayItem(it, 0), p0, &c->cfg->optimizer.beta1));
    ZPP_CHECK(get_num(c, cJSON_GetArrayItem(it, 1), p1, &c->cfg->optimizer.beta2));
    return ZPP_OK;
}

static zpp_status parse_object(const zpp__cfgctx *c, const cJSON *obj, const char *prefix);

/* One key's value, found in the table as `k`. */
static zpp_status parse_key(const zpp__cfgctx *c, const zpp__key *k, const cJSON *it,
                            const char *path) {
    zpp_train_config *cfg = c->cfg;
    if (k->sched && k->kind != ZPP_CFG_OBJECT && k->kind != ZPP_CFG_OBJECT_ON) {
        zpp_sched_type t = cfg->scheduler.type;
        if (!(k->sched & (1u << t)))
            return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' does not apply to scheduler type %s",
                             c->src, path, zpp_sched_type_name(t));
    }
    switch (k->kind) {
    case ZPP_CFG_OBJECT_ON: /* its presence turns the feature on */
        ZPP_CHECK(want_object(c, it, path));
        *ZPP__AT(cfg, k, int) = 1;
        return parse_object(c, it, path);
    case ZPP_CFG_OBJECT:
        ZPP_CHECK(want_object(c, it, path));
        if (k->sched && !(k->sched & (1u << cfg->scheduler.type)))
            return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' given without 'scheduler.type'", c->src,
                             path);
        return parse_object(c, it, path);
    case ZPP_CFG_INT: {
        long long v = 0;
        ZPP_CHECK(get_int(c, it, path, k->lo, k->hi, &v));
        *ZPP__AT(cfg, k, int) = (int)v;
        return ZPP_OK;
    }
    case ZPP_CFG_I64: return get_int(c, it, path, k->lo, k->hi, ZPP__AT(cfg, k, long long));
    case ZPP_CFG_SEED: {
        long long v = 0;
        ZPP_CHECK(get_int(c, it, path, k->lo, k->hi, &v));
        *ZPP__AT(cfg, k, uint64_t) = (uint64_t)v;
        return ZPP_OK;
    }
    case ZPP_CFG_NUM: return get_num(c, it, path, ZPP__AT(cfg, k, double));
    case ZPP_CFG_BOOL: return get_bool(c, it, path, ZPP__AT(cfg, k, int));
    case ZPP_CFG_KEEP_ACTS: return get_keep_acts(c, it, path, ZPP__AT(cfg, k, int));
    case ZPP_CFG_BETAS: return parse_betas(c, it, path);
    case ZPP_CFG_OPT_TYPE: {
        const char *t = NULL;
        ZPP_CHECK(get_str(c, it, path, &t));
        if (strcasecmp(t, "AdamW") != 0)
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "%s: %s '%s' is not supported; zeropp implements \"AdamW\" (Adam "
                             "with decoupled weight decay) only",
                             c->src, path, t);
        return ZPP_OK;
    }
    case ZPP_CFG_SCHED_TYPE: {
        const char *t = NULL;
        zpp_sched_type *out = ZPP__AT(cfg, k, zpp_sched_type);
        ZPP_CHECK(get_str(c, it, path, &t));
        if (strcasecmp(t, "WarmupLR") == 0) *out = ZPP_SCHED_WARMUP_LR;
        else if (strcasecmp(t, "WarmupDecayLR") == 0) *out = ZPP_SCHED_WARMUP_DECAY_LR;
        else if (strcasecmp(t, "WarmupCosineLR") == 0) *out = ZPP_SCHED_WARMUP_COSINE_LR;
        else
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "%s: %s '%s' is not supported; use WarmupLR, WarmupDecayLR or "
                             "WarmupCosineLR (or no scheduler for a constant lr)",
                             c->src, path, t);
        return ZPP_OK;
    }
    case ZPP_CFG_WARMUP_TYPE: {
        const char *w = NULL;
        zpp_warmup_type *out = ZPP__AT(cfg, k, zpp_warmup_type);
        ZPP_CHECK(get_str(c, it, path, &w));
        if (strcmp(w, "log") == 0) *out = ZPP_WARMUP_LOG;
        else if (strcmp(w, "linear") == 0) *out = ZPP_WARMUP_LINEAR;
        else
            return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' is '%s'; use \"log\" or \"linear\"",
                             c->src, path, w);
        return ZPP_OK;
    }
    case ZPP_CFG_DATA_ORDER: {
        const char *w = NULL;
        ZPP_CHECK(get_str(c, it, path, &w));
        return zpp_data_order_parse(w, ZPP__AT(cfg, k, zpp_data_order)) == ZPP_OK
                   ? ZPP_OK
                   : zpp_error(ZPP_ERR_CONFIG,
                               "%s: '%s' is '%s'; use \"shuffled\" or \"sequential\"", c->src,
                               path, w);
    }
    case ZPP_CFG_FAMILY: {
        const char *w = NULL;
        zpp_model_family_id *out = ZPP__AT(cfg, k, zpp_model_family_id);
        ZPP_CHECK(get_str(c, it, path, &w));
        if (strcmp(w, "gpt2") == 0) *out = ZPP_FAMILY_GPT2;
        else if (strcmp(w, "llama") == 0) *out = ZPP_FAMILY_LLAMA;
        else
            return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' is '%s'; use \"gpt2\" or \"llama\"",
                             c->src, path, w);
        return ZPP_OK;
    }
    case ZPP_CFG_HF_ARCH: {
        const char *w = NULL;
        ZPP_CHECK(get_str(c, it, path, &w));
        if (!zpp_hf_arch_parse(w, ZPP__AT(cfg, k, zpp_hf_arch)))
            return zpp_error(ZPP_ERR_CONFIG,
                             "%s: '%s' is '%s'; use \"LlamaForCausalLM\", "
                             "\"MistralForCausalLM\" or \"Qwen2ForCausalLM\"",
                             c->src, path, w);
        return ZPP_OK;
    }
    case ZPP_CFG_STAGE: {
        long long v = 0;
        ZPP_CHECK(get_int(c, it, path, INT_MIN, INT_MAX, &v));
        if (v != 3)
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "%s: %s is %lld; zeropp implements ZeRO stage 3 only (set "
                             "\"stage\": 3)",
                             c->src, path, v);
        *ZPP__AT(cfg, k, int) = 3;
        return ZPP_OK;
    }
    case ZPP_CFG_IGNORED: note_ignored(cfg, path); return ZPP_OK;
    }
    return zpp_error(ZPP_ERR_STATE, "config: key '%s' of unknown kind %d", path, (int)k->kind);
}

/* Every member of the object at `prefix` ("" = top level), in file order.
 * A SCHED_TYPE key is read first: it decides which params are valid. */
static zpp_status parse_object(const zpp__cfgctx *c, const cJSON *obj, const char *prefix) {
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        if (k->kind != ZPP_CFG_SCHED_TYPE || !key_in(k, prefix)) continue;
        const cJSON *first = cJSON_GetObjectItemCaseSensitive(obj, key_name(k));
        if (first) ZPP_CHECK(parse_key(c, k, first, k->path));
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(parse_member(c, obj, it, prefix, path));
        const zpp__key *k = key_find(prefix, it->string ? it->string : "");
        if (!k) return unknown_key(c, path, prefix);
        if (k->kind == ZPP_CFG_SCHED_TYPE) continue;
        ZPP_CHECK(parse_key(c, k, it, path));
    }
    return ZPP_OK;
}

static zpp_status parse_root(const zpp__cfgctx *c, const cJSON *root) {
    if (!cJSON_IsObject(root))
        return zpp_error(ZPP_ERR_CONFIG, "%s: the top level must be a JSON object, got %s", c->src,
                         json_type(root));
    return parse_object(c, root, "");
}

/* ------------------------------------------------------------------------ */
/* The key reference (docs/config.md)                                        */
/* ------------------------------------------------------------------------ */

static const char *kind_doc(zpp__kind kind) {
    switch (kind) {
    case ZPP_CFG_OBJECT: return "object";
    case ZPP_CFG_OBJECT_ON: return "object (present = on)";
    case ZPP_CFG_INT:
    case ZPP_CFG_I64:
    case ZPP_CFG_SEED:
    case ZPP_CFG_STAGE: return "integer";
    case ZPP_CFG_NUM: return "number";
    case ZPP_CFG_BOOL: return "boolean";
    case ZPP_CFG_KEEP_ACTS: return "boolean or string";
    case ZPP_CFG_BETAS: return "[number, number]";
    case ZPP_CFG_OPT_TYPE:
    case ZPP_CFG_SCHED_TYPE:
    case ZPP_CFG_WARMUP_TYPE:
    case ZPP_CFG_DATA_ORDER:
    case ZPP_CFG_FAMILY:
    case ZPP_CFG_HF_ARCH: return "string";
    case ZPP_CFG_IGNORED: return "any";
    }
    return "?";
}

static void write_default(FILE *f, const zpp__key *k) {
    switch (k->kind) {
    case ZPP_CFG_INT:
    case ZPP_CFG_I64:
    case ZPP_CFG_SEED:
    case ZPP_CFG_STAGE:
        if (k->kind != ZPP_CFG_STAGE && k->def[0] < (double)k->lo)
            fprintf(f, "derived"); /* the batch sizes: zpp_train_config_resolve */
        else fprintf(f, "%.0f", k->def[0]);
        break;
    case ZPP_CFG_NUM: fprintf(f, "%g", k->def[0]); break;
    case ZPP_CFG_BOOL: fprintf(f, "%s", k->def[0] != 0 ? "true" : "false"); break;
    case ZPP_CFG_KEEP_ACTS: fprintf(f, "%s", keep_acts_text((int)k->def[0])); break;
    case ZPP_CFG_BETAS: fprintf(f, "[%g, %g]", k->def[0], k->def[1]); break;
    case ZPP_CFG_OPT_TYPE: fprintf(f, "\"AdamW\""); break;
    case ZPP_CFG_SCHED_TYPE: fprintf(f, "(none)"); break;
    case ZPP_CFG_WARMUP_TYPE:
        fprintf(f, "\"%s\"", (int)k->def[0] == ZPP_WARMUP_LINEAR ? "linear" : "log");
        break;
    case ZPP_CFG_OBJECT_ON: fprintf(f, "absent (off)"); break;
    case ZPP_CFG_DATA_ORDER:
        fprintf(f, "\"%s\"", zpp_data_order_name((zpp_data_order)(int)k->def[0]));
        break;
    case ZPP_CFG_FAMILY:
        fprintf(f, "\"%s\"", zpp_model_family_name((zpp_model_family_id)(int)k->def[0]));
        break;
    case ZPP_CFG_HF_ARCH: fprintf(f, "\"%s\"", zpp_hf_arch_name((zpp_hf_arch)(int)k->def[0])); break;
    case ZPP_CFG_OBJECT:
    case ZPP_CFG_IGNORED: fprintf(f, "-"); break;
    }
}

/* After the table: the two families, and how a Hugging Face config.json's
 * keys (train/hf_config.h) read as the llama keys. */
static void write_families(FILE *f) {
    fprintf(f,
            "\n"
            "## Model families\n"
            "\n"
            "`model.family` picks the decoder; `model.n_layer`, `n_head`, `n_embd`, `seq_len`,\n"
            "`vocab_size` and `real_vocab_size` shape both.\n"
            "\n"
            "- `\"gpt2\"` (the default): learned positions, LayerNorm, GELU MLP 4 n_embd wide,\n"
            "  biases, the head tied to the token embedding. The llama keys are refused.\n"
            "- `\"llama\"`: Meta's Llama 2/3 as Hugging Face's `LlamaForCausalLM` computes it:\n"
            "  RMSNorm, rotary positions (`rope_theta`, Llama 3's `rope_scaling`),\n"
            "  grouped-query attention (`n_kv_head`), a SwiGLU MLP `n_ffn` wide, no biases but\n"
            "  the optional q/k/v ones (`qkv_bias`) and output projection's (`o_bias`), the\n"
            "  head tied or untied. The head dim is `n_embd / n_head`.\n"
            "\n"
            "A Hugging Face `config.json` in these keys:\n"
            "\n"
            "| config.json | key |\n"
            "|---|---|\n"
            "| `num_hidden_layers` | `model.n_layer` |\n"
            "| `hidden_size` | `model.n_embd` |\n"
            "| `num_attention_heads` | `model.n_head` |\n"
            "| `num_key_value_heads` | `model.n_kv_head` |\n"
            "| `intermediate_size` | `model.n_ffn` |\n"
            "| `vocab_size` | `model.vocab_size` |\n"
            "| `rope_theta` | `model.rope_theta` |\n"
            "| `rms_norm_eps` | `model.norm_eps` |\n"
            "| `tie_word_embeddings` | the opposite of `model.untied_head` |\n"
            "| `attention_bias` | `model.qkv_bias` and `model.o_bias` |\n"
            "| `rope_scaling.factor`, `.low_freq_factor`, `.high_freq_factor`, "
            "`.original_max_position_embeddings` (`rope_type` `llama3`) | `model.rope_factor`, "
            "`model.rope_low_freq_factor`, `model.rope_high_freq_factor`, "
            "`model.rope_original_max_pos` |\n"
            "\n"
            "Llama 3.2 1B, for example: `{\"family\": \"llama\", \"n_layer\": 16, "
            "\"n_embd\": 2048,\n"
            "\"n_head\": 32, \"n_kv_head\": 8, \"n_ffn\": 8192, \"vocab_size\": 128256, "
            "\"rope_theta\": 500000,\n"
            "\"rope_factor\": 32, \"rope_low_freq_factor\": 1, \"rope_high_freq_factor\": 4,\n"
            "\"rope_original_max_pos\": 8192, \"seq_len\": 2048}` (its head is tied).\n");
}

void zpp_train_config_write_keys(FILE *f) {
    fprintf(f,
            "# Trainer configuration keys\n"
            "\n"
            "<!-- Generated from src/train/config_keys.h by `zeropp train "
            "--list-config-keys`;\n"
            "     tests/test_config.c checks that this file matches. Do not edit. -->\n"
            "\n"
            "`zeropp train --config FILE` reads a DeepSpeed-style JSON file. Keys carry\n"
            "DeepSpeed's names wherever DeepSpeed has one; `model` and `zeropp` hold what it\n"
            "has none for. Every key is optional: a missing key keeps its default. Keys\n"
            "marked *ignored* are DeepSpeed engine knobs that do not change the mathematics:\n"
            "they are accepted and reported. Any other key is an error naming its path.\n"
            "Ranges across keys, the rule deriving the batch sizes and the learning-rate\n"
            "formulas: src/train/config.h.\n"
            "\n"
            "| key | type | default | range | meaning |\n"
            "|---|---|---|---|---|\n");
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        fprintf(f, "| `%s` | %s | ", k->path, kind_doc(k->kind));
        write_default(f, k);
        fprintf(f, " | ");
        if (k->kind == ZPP_CFG_INT || k->kind == ZPP_CFG_I64 || k->kind == ZPP_CFG_SEED) {
            if (k->hi == INT_MAX) fprintf(f, ">= %lld", k->lo);
            else fprintf(f, "[%lld, %lld]", k->lo, k->hi);
        } else if (k->kind == ZPP_CFG_IGNORED) {
            fprintf(f, "*ignored*");
        } else {
            fprintf(f, "-");
        }
        fprintf(f, " | %s |\n", k->doc);
    }
    write_families(f);
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

static int sched_total(const zpp_train_config *cfg) {
    return cfg->scheduler.total_num_steps > 0 ? cfg->scheduler.total_num_steps
                                              : cfg->train_steps;
}

/* The model's shape and the run's step counts: every count at least 1, the
 * heads splitting the channels evenly, the real vocabulary inside the
 * padded one. */
static zpp_status validate_shape(const zpp_train_config *cfg) {
    const zpp_gpt2_config *m = &cfg->model;
#define ZPP__POS(val, key)                                                     \
    if ((val) < 1) return zpp_error(ZPP_ERR_CONFIG, "'%s' must be >= 1, got %d", key, (int)(val))
    ZPP__POS(m->n_layer, "model.n_layer");
    ZPP__POS(m->n_head, "model.n_head");
    ZPP__POS(m->n_embd, "model.n_embd");
    ZPP__POS(m->seq_len, "model.seq_len");
    ZPP__POS(m->vocab_size, "model.vocab_size");
    ZPP__POS(cfg->train_steps, "zeropp.train_steps");
    ZPP__POS(cfg->eval_batches, "zeropp.eval_batches");
#undef ZPP__POS
    if (m->n_embd % m->n_head)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.n_embd' %d is not divisible by 'model.n_head' %d; each head "
                         "gets n_embd / n_head channels",
                         m->n_embd, m->n_head);
    if (m->real_vocab_size < 0 || m->real_vocab_size > m->vocab_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.real_vocab_size' %d is outside 0..'model.vocab_size' %d; the "
                         "softmax runs over the first real_vocab_size rows of the embedding",
                         m->real_vocab_size, m->vocab_size);
    return ZPP_OK;
}

/* A sliding window is Mistral's and Qwen2's; a Mistral's must hold the
 * whole sequence, as zeropp has no sliding-window attention. */
static zpp_status hf_window_check(const zpp_train_config *cfg) {
    const int w = cfg->hf_sliding_window;
    if (w && cfg->hf_architecture == ZPP_HF_LLAMA)
        return zpp_error(ZPP_ERR_CONFIG, "'model.hf_sliding_window' %d is set, but a "
                                         "LlamaForCausalLM has none; drop the key",
                         w);
    if (w && cfg->hf_architecture == ZPP_HF_MISTRAL && cfg->model.seq_len > w)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.seq_len' %d exceeds 'model.hf_sliding_window' %d (the Mistral's "
                         "sliding_window); zeropp has no sliding-window attention, so set "
                         "seq_len to at most %d",
                         cfg->model.seq_len, w, w);
    return ZPP_OK;
}

/* model.family's own keys: Llama's knobs are refused for GPT-2 (it has
 * none of them: the path names the key). The knobs' values are checked by
 * the family's factory (model/llama.h), which names the field. */
static zpp_status validate_family(const zpp_train_config *cfg) {
    const zpp_decoder_shape *x = &cfg->model_ext;
    const char *key = x->n_kv_head ? "model.n_kv_head"
                      : x->n_ffn ? "model.n_ffn"
                      : x->rope_theta != 0.0 ? "model.rope_theta"
                      : x->norm_eps != 0.0 ? "model.norm_eps"
                      : x->untied_head ? "model.untied_head"
                      : x->qkv_bias ? "model.qkv_bias"
                      : x->o_bias ? "model.o_bias"
                      : x->rope_factor != 0.0 ? "model.rope_factor"
                      : x->rope_low_freq_factor != 0.0 ? "model.rope_low_freq_factor"
                      : x->rope_high_freq_factor != 0.0 ? "model.rope_high_freq_factor"
                      : x->rope_original_max_pos ? "model.rope_original_max_pos"
                      : cfg->hf_architecture != ZPP_HF_LLAMA ? "model.hf_architecture"
                      : cfg->hf_sliding_window ? "model.hf_sliding_window"
                                                 : NULL;
    if (cfg->model_family == ZPP_FAMILY_LLAMA) return hf_window_check(cfg);
    if (!key) return ZPP_OK;
    return zpp_error(ZPP_ERR_CONFIG,
                     "'%s' is a key of the llama family, but 'model.family' is \"gpt2\"; set "
                     "\"family\": \"llama\" or remove the key",
                     key);
}

/* The batch sizes (0 = derived from the others), the hpZ partition, and how
 * often the run evaluates, prints and samples. */
static zpp_status validate_batches_and_periods(const zpp_train_config *cfg) {
    if (cfg->train_batch_size < 0 || cfg->train_micro_batch_size_per_gpu < 0 ||
        cfg->gradient_accumulation_steps < 0)
        return zpp_error(ZPP_ERR_CONFIG, "batch sizes must be >= 1 (0 = derive)");
    if (cfg->zero.hpz_partition_size < 0)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zero_optimization.zero_hpz_partition_size' must be >= 0 (0 = the "
                         "node, 1 = off), got %d",
                         cfg->zero.hpz_partition_size);
    if (cfg->eval_every < 0 || cfg->steps_per_print < 0)
        return zpp_error(ZPP_ERR_CONFIG, "'%s' must be >= 0 (0 = never)",
                         cfg->eval_every < 0 ? "zeropp.eval_every" : "steps_per_print");
    if (cfg->sample_every < 0 || cfg->sample_tokens < 1 || cfg->sample_tokens > 65536)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zeropp.sample_every' %d must be >= 0 (0 = never) and "
                         "'zeropp.sample_tokens' %d in 1..65536",
                         cfg->sample_every, cfg->sample_tokens);
    return ZPP_OK;
}

/* AdamW: lr > 0; betas in [0, 1) so the moment averages forget (and the
 * bias corrections 1 - beta^t stay nonzero); eps > 0 keeps the division
 * by sqrt(v) + eps finite. */
static zpp_status validate_optimizer(const zpp_train_config *cfg) {
    const double lr = cfg->optimizer.lr, b1 = cfg->optimizer.beta1, b2 = cfg->optimizer.beta2;
    if (!(lr > 0) || !isfinite(lr))
        return zpp_error(ZPP_ERR_CONFIG, "'optimizer.params.lr' must be > 0, got %g", lr);
    /* the engine's ranges (engine/options.h), named by their keys */
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_beta1, b1, "optimizer.params.betas[0]"));
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_beta2, b2, "optimizer.params.betas[1]"));
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_eps, cfg->optimizer.eps, "optimizer.params.eps"));
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_weight_decay, cfg->optimizer.weight_decay,
                                   "optimizer.params.weight_decay"));
    return ZPP_OK;
}

/* The run's non-negative real knobs: the collectives' and saves' deadlines,
 * the peak the MFU is measured against, and the gradient clipping norm. */
static zpp_status validate_run_limits(const zpp_train_config *cfg) {
    if (!(cfg->collective_timeout_s >= 0) || !isfinite(cfg->collective_timeout_s))
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zeropp.collective_timeout_s' must be >= 0 seconds (0 = wait forever), "
                         "got %g",
                         cfg->collective_timeout_s);
    if (!(cfg->save_timeout_s >= 0) || !isfinite(cfg->save_timeout_s))
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zeropp.save_timeout_s' must be >= 0 seconds (0 = wait forever), "
                         "got %g",
                         cfg->save_timeout_s);
    if (!(cfg->peak_tflops >= 0) || !isfinite(cfg->peak_tflops))
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zeropp.peak_tflops' must be >= 0 TFLOP/s (0 = the GPU's preset), "
                         "got %g",
                         cfg->peak_tflops);
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_grad_clip, cfg->gradient_clipping,
                                   "gradient_clipping"));
    return ZPP_OK;
}

/* qgZ's options: error feedback (LoCo) and stochastic rounding both act on
 * the 4-bit gradients, so they need qgZ on. */
static zpp_status validate_qgz(const zpp_train_config *cfg) {
    if (cfg->zero.loco)
        ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_loco_err_beta, cfg->zero.loco_err_beta,
                                       "zero_optimization.zeropp_loco_param.err_beta"));
    if (cfg->zero.loco && !cfg->zero.quantized_gradients)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zero_optimization.zeropp_loco_param' (error feedback) corrects qgZ's "
                         "4-bit gradients; set 'zero_optimization.zero_quantized_gradients' to "
                         "true or drop it");
    if (cfg->zero.grad_stochastic && !cfg->zero.quantized_gradients)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'zero_optimization.zeropp_grad_stochastic_rounding' sets how qgZ rounds "
                         "its 4-bit gradients; set 'zero_optimization.zero_quantized_gradients' to "
                         "true or drop it");
    return ZPP_OK;
}

/* Mixed precision: at most one of fp16 and bf16, and fp16's loss scales. */
static zpp_status validate_precision(const zpp_train_config *cfg) {
    if (cfg->fp16.enabled && cfg->bf16)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'fp16.enabled' and 'bf16.enabled' are both true; enable one of them");
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_loss_scale, cfg->fp16.loss_scale,
                                   "fp16.loss_scale"));
    ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_min_loss_scale, cfg->fp16.min_loss_scale,
                                   "fp16.min_loss_scale"));
    return ZPP_OK;
}

/* The learning-rate schedule: its type, its step counts, and the lr bounds
 * (WarmupLR, WarmupDecayLR) or ratios (WarmupCosineLR) of its type. */
static zpp_status validate_scheduler(const zpp_train_config *cfg) {
    const zpp_sched_type t = cfg->scheduler.type;
    if (t < ZPP_SCHED_NONE || t > ZPP_SCHED_WARMUP_COSINE_LR)
        return zpp_error(ZPP_ERR_CONFIG, "scheduler type %d is not valid", (int)t);
    if (t == ZPP_SCHED_NONE) return ZPP_OK;
    const int W = cfg->scheduler.warmup_num_steps;
    if (W < 0 || cfg->scheduler.total_num_steps < 0)
        return zpp_error(ZPP_ERR_CONFIG, "'scheduler.params.%s' must be >= 0",
                         W < 0 ? "warmup_num_steps" : "total_num_steps");
    if (t == ZPP_SCHED_WARMUP_LR || t == ZPP_SCHED_WARMUP_DECAY_LR) {
        const double lo = cfg->scheduler.warmup_min_lr, hi = cfg->scheduler.warmup_max_lr;
        if (!(hi > 0) || !isfinite(hi))
            return zpp_error(ZPP_ERR_CONFIG, "'scheduler.params.warmup_max_lr' must be > 0, got %g",
                             hi);
        if (!(lo >= 0 && lo <= hi))
            return zpp_error(ZPP_ERR_CONFIG,
                             "'scheduler.params.warmup_min_lr' %g must be in [0, warmup_max_lr "
                             "%g]",
                             lo, hi);
    }
    if (t == ZPP_SCHED_WARMUP_COSINE_LR) {
        const double a = cfg->scheduler.warmup_min_ratio, b = cfg->scheduler.cos_min_ratio;
        if (!(a >= 0 && a <= 1))
            return zpp_error(ZPP_ERR_CONFIG,
                             "'scheduler.params.warmup_min_ratio' must be in [0, 1], got %g", a);
        if (!(b >= 0 && b <= 1))
            return zpp_error(ZPP_ERR_CONFIG,
                             "'scheduler.params.cos_min_ratio' must be in [0, 1], got %g", b);
    }
    /* Given a length, a decaying schedule must outlast its warm-up. Taken
     * from the run (total_num_steps 0: zeropp.train_steps, which --steps may
     * still change), it is not checked: a run shorter than its warm-up is
     * legitimate (a smoke test), and zpp_train_lr keeps it in the warm-up. */
    const int N = cfg->scheduler.total_num_steps;
    if ((t == ZPP_SCHED_WARMUP_DECAY_LR || t == ZPP_SCHED_WARMUP_COSINE_LR) && N > 0 && N <= W)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'scheduler.params.total_num_steps' (%d) must exceed "
                         "'scheduler.params.warmup_num_steps' (%d) for %s",
                         N, W, zpp_sched_type_name(t));
    return ZPP_OK;
}

/* The sections are checked in a fixed order and the first problem found is
 * the one reported, so a config with several gets the same message every
 * time. */
zpp_status zpp_train_config_validate(const zpp_train_config *cfg) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_validate: cfg is NULL");
    ZPP_CHECK(validate_shape(cfg));
    ZPP_CHECK(validate_family(cfg));
    ZPP_CHECK(validate_batches_and_periods(cfg));
    ZPP_CHECK(validate_optimizer(cfg));
    ZPP_CHECK(validate_run_limits(cfg));
    ZPP_CHECK(validate_qgz(cfg));
    ZPP_CHECK(validate_precision(cfg));
    if (cfg->zero.stage != 3)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "zero_optimization.stage is %d; zeropp implements stage 3 only",
                         cfg->zero.stage);
    return validate_scheduler(cfg);
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

/* 1-based line and column of byte `pos` of `text`. */
static void line_col(const char *text, const char *pos, int *line_p, int *col_p) {
    int line = 1, col = 1;
    for (const char *p = text; p < pos && *p; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    *line_p = line;
    *col_p = col;
}

/* ------------------------------------------------------------------------ */
/* Strict JSON (RFC 8259)                                                    */
/* ------------------------------------------------------------------------ */
/*
 * cJSON is lenient where a config must not be: it reads "01" as 1, cuts a
 * string at an escaped NUL ("lr\u0000x" becomes the key "lr"), and lets
 * numbers like "1." or "+1" through. The
 * text it accepted is scanned once more at the token level and refused, with
 * one line giving the byte offset, on: numbers outside the JSON grammar
 * (leading zeros, a sign '+', a bare '.', an empty exponent), \u0000 in a
 * string, raw control characters in a string and bad escapes. (Duplicate
 * keys are refused by the walk over the parsed tree, check_duplicate,
 * with the key's dotted path.)
 */
#define ZPP__JSON_DEPTH 512

typedef struct zpp__scan {
    const char *text, *p, *src;
    zpp_status st;
} zpp__scan;

static int scan_fail(zpp__scan *s, const char *at, const char *fmt, const char *arg) {
    if (s->st != ZPP_OK) return -1;
    int line, col;
    line_col(s->text, at, &line, &col);
    char why[160];
    snprintf(why, sizeof why, fmt, arg);
    s->st = zpp_error(ZPP_ERR_FORMAT, "%s: invalid JSON at line %d, column %d (byte offset %zu): %s",
                      s->src, line, col, (size_t)(at - s->text), why);
    return -1;
}

static void scan_ws(zpp__scan *s) {
    while (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r') s->p++;
}

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A string at s->p (on its '"'); leaves s->p past the closing quote. */
static int scan_string(zpp__scan *s) {
    const char *q = s->p + 1;
    for (;;) {
        unsigned char c = (unsigned char)*q;
        if (c == '\0') return scan_fail(s, s->p, "%sunterminated string", "");
        if (c == '"') break;
        if (c < 0x20)
            return scan_fail(s, q,
                             "%sa raw control character in a string (write it as "
                             "an escape, e.g. \\n)",
                             "");
        if (c != '\\') {
            q++;
            continue;
        }
        char e = q[1];
        if (e == 'u') {
            for (int k = 2; k < 6; k++)
                if (!is_hex(q[k])) return scan_fail(s, q, "%sa \\u escape needs 4 hex digits", "");
            if (q[2] == '0' && q[3] == '0' && q[4] == '0' && q[5] == '0')
                return scan_fail(s, q,
                                 "%sa string holds \\u0000 (a NUL character); no "
                                 "key or value may contain one",
                                 "");
            q += 6;
        } else if (e && strchr("\"\\/bfnrt", e)) {
            q += 2;
        } else {
            return scan_fail(s, q, "%sunknown escape in a string", "");
        }
    }
    s->p = q + 1;
    return 0;
}

static int scan_number(zpp__scan *s) {
    const char *q = s->p, *start = s->p;
    char tok[32];
    size_t k = 0;
    for (const char *t = start; k < sizeof tok - 1 && *t && strchr("+-.eE0123456789", *t); t++)
        tok[k++] = *t;
    tok[k] = '\0';
    if (*q == '-') q++;
    if (*q == '0') {
        q++;
        if (*q >= '0' && *q <= '9')
            return scan_fail(s, start, "number '%s' has a leading zero (write 1, not 01)", tok);
    } else if (*q >= '1' && *q <= '9') {
        while (*q >= '0' && *q <= '9') q++;
    } else {
        return scan_fail(s, start, "'%s' is not a JSON number", tok);
    }
    if (*q == '.') {
        q++;
        if (!(*q >= '0' && *q <= '9'))
            return scan_fail(s, start, "number '%s' needs digits after its '.'", tok);
        while (*q >= '0' && *q <= '9') q++;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!(*q >= '0' && *q <= '9'))
            return scan_fail(s, start, "number '%s' needs digits in its exponent", tok);
        while (*q >= '0' && *q <= '9') q++;
    }
    s->p = q;
    return 0;
}

static int scan_value(zpp__scan *s, int depth);

static int scan_object(zpp__scan *s, int depth) {
    s->p++; /* '{' */
    scan_ws(s);
    if (*s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        scan_ws(s);
        if (*s->p != '"') return scan_fail(s, s->p, "%sexpected a key (a string)", "");
        if (scan_string(s)) return -1;
        scan_ws(s);
        if (*s->p != ':') return scan_fail(s, s->p, "%sexpected ':' after a key", "");
        s->p++;
        if (scan_value(s, depth + 1)) return -1;
        scan_ws(s);
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p == '}') {
            s->p++;
            return 0;
        }
        return scan_fail(s, s->p, "%sexpected ',' or '}' in an object", "");
    }
}

static int scan_array(zpp__scan *s, int depth) {
    s->p++; /* '[' */
    scan_ws(s);
    if (*s->p == ']') {
        s->p++;
        return 0;
    }
    for (;;) {
        if (scan_value(s, depth + 1)) return -1;
        scan_ws(s);
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p == ']') {
            s->p++;
            return 0;
        }
        return scan_fail(s, s->p, "%sexpected ',' or ']' in an array", "");
    }
}

static int scan_value(zpp__scan *s, int depth) {
    if (depth > ZPP__JSON_DEPTH) return scan_fail(s, s->p, "%snested too deeply", "");
    scan_ws(s);
    const char c = *s->p;
    if (c == '{') return scan_object(s, depth);
    if (c == '[') return scan_array(s, depth);
    if (c == '"') return scan_string(s);
    if (c == '-' || (c >= '0' && c <= '9')) return scan_number(s);
    static const char *const lit[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lit[i]);
        if (!strncmp(s->p, lit[i], n)) {
            s->p += n;
            return 0;
        }
    }
    return scan_fail(s, s->p, "%sexpected a value", "");
}

/* ZPP_OK when `json` is one strict JSON value (and nothing else), else
 * ZPP_ERR_FORMAT with the line, column and byte offset. */
static zpp_status json_strict(const char *json, const char *src) {
    zpp__scan s = {json, json, src, ZPP_OK};
    if (scan_value(&s, 0) == 0) {
        scan_ws(&s);
        if (*s.p) scan_fail(&s, s.p, "%stext after the JSON value", "");
    }
    return s.st;
}

static zpp_status load_json(const char *json, const char *src, zpp_train_config *cfg) {
    if (!json || !cfg) return zpp_error(ZPP_ERR_INVALID, "config: NULL argument");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        if (!at) at = json;
        int line, col;
        line_col(json, at, &line, &col);
        char near[24];
        size_t k = 0;
        for (const char *p = at; *p && *p != '\n' && k < sizeof near - 1; p++) near[k++] = *p;
        near[k] = '\0';
        if (k)
            return zpp_error(ZPP_ERR_FORMAT, "%s: malformed JSON at line %d, column %d (near '%s')",
                             src, line, col, near);
        return zpp_error(ZPP_ERR_FORMAT, "%s: malformed JSON at line %d, column %d (unexpected "
                         "end of input)", src, line, col);
    }
    /* cJSON's verdict (and its messages) first; then what it lets through */
    zpp_status st = json_strict(json, src);
    if (st != ZPP_OK) {
        cJSON_Delete(root);
        return st;
    }
    zpp_train_config tmp = *cfg;
    zpp__cfgctx c = {src, &tmp};
    st = parse_root(&c, root);
    cJSON_Delete(root);
    if (st != ZPP_OK) return st;
    st = zpp_train_config_validate(&tmp);
    if (st != ZPP_OK) return zpp_error_context(st, "%s", src);
    *cfg = tmp;
    return ZPP_OK;
}

zpp_status zpp_train_config_load_string(const char *json, zpp_train_config *cfg) {
    return load_json(json, "<string>", cfg);
}

zpp_status zpp_train_config_load_file(const char *path, zpp_train_config *cfg) {
    if (!path || !cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_load_file: NULL argument");
    /* a FIFO or a directory is refused here, before a read could block */
    FILE *f = NULL;
    zpp_status st = zpp_fopen_regular(path, "config", &f);
    if (st != ZPP_OK) return st;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            if (cap > ZPP__CONFIG_MAX_BYTES + 8192) {
                st = zpp_error(ZPP_ERR_FORMAT, "config '%s' is larger than %u bytes; is it the "
                               "right file?", path, ZPP__CONFIG_MAX_BYTES);
                goto out;
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                st = zpp_error(ZPP_ERR_NOMEM, "config '%s': out of memory", path);
                goto out;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        st = zpp_error(ZPP_ERR_IO, "cannot read config '%s': %s", path, strerror(errno));
        goto out;
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        st = zpp_error(ZPP_ERR_FORMAT, "config '%s' contains a NUL byte at offset %zu; it is "
                       "not a JSON text file", path, strlen(buf));
        goto out;
    }
    st = load_json(buf, path, cfg);
out:
    free(buf);
    fclose(f);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Writing a config back: JSON, and what changed between two                  */
/* ------------------------------------------------------------------------ */

/* Whether key k holds a value that the config uses: a scheduler param of
 * the scheduler type in force, a member of a feature object that is on
 * (zeropp_loco_param's err_beta only while the feedback is on), a batch size
 * that is given (0 = derived is not a value), not an ignored knob. */
/* Whether key k lies inside a feature object that is off in cfg (a
 * zeropp_loco_param member while the feedback is off). */
static int key_in_off_object(const zpp__key *k, const zpp_train_config *cfg) {
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *o = &kKeys[i];
        size_t n = strlen(o->path);
        if (o->kind == ZPP_CFG_OBJECT_ON && !*ZPP__AT(cfg, o, int) &&
            !strncmp(k->path, o->path, n) && k->path[n] == '.')
            return 1;
    }
    return 0;
}

static int key_in_effect(const zpp__key *k, const zpp_train_config *cfg) {
    if (k->kind == ZPP_CFG_IGNORED || k->kind == ZPP_CFG_OBJECT) return 0;
    if (cfg->scheduler.type == ZPP_SCHED_NONE && !strncmp(k->path, "scheduler.", 10)) return 0;
    if (k->sched && !(k->sched & (1u << cfg->scheduler.type))) return 0;
    if (key_in_off_object(k, cfg)) return 0;
    if ((k->kind == ZPP_CFG_INT || k->kind == ZPP_CFG_I64) &&
        (k->kind == ZPP_CFG_INT ? (long long)*ZPP__AT(cfg, k, int)
                                : *ZPP__AT(cfg, k, long long)) < k->lo)
        return 0;
    return 1;
}

/* The shortest "%.Ng" that reads back as exactly v. */
static void num_text(char *buf, size_t cap, double v) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* Key k's value as JSON text (a string quoted), or "derived" / "off" where
 * the key is not in effect. */
static void value_text(const zpp__key *k, const zpp_train_config *cfg, char *buf, size_t cap) {
    char a[40], b[40];
    if (!key_in_effect(k, cfg)) {
        const char *why = "(unset)";
        if (k->kind == ZPP_CFG_SCHED_TYPE) why = "\"none\"";
        else if (key_in_off_object(k, cfg))
            why = "(off)";
        else if ((k->kind == ZPP_CFG_INT || k->kind == ZPP_CFG_I64) && k->def[0] < (double)k->lo)
            why = "derived";
        snprintf(buf, cap, "%s", why);
        return;
    }
    switch (k->kind) {
    case ZPP_CFG_INT:
    case ZPP_CFG_STAGE: snprintf(buf, cap, "%d", *ZPP__AT(cfg, k, int)); break;
    case ZPP_CFG_I64: snprintf(buf, cap, "%lld", *ZPP__AT(cfg, k, long long)); break;
    case ZPP_CFG_SEED:
        snprintf(buf, cap, "%llu", (unsigned long long)*ZPP__AT(cfg, k, uint64_t));
        break;
    case ZPP_CFG_NUM: num_text(buf, cap, *ZPP__AT(cfg, k, double)); break;
    case ZPP_CFG_BOOL:
    case ZPP_CFG_OBJECT_ON:
        snprintf(buf, cap, "%s", *ZPP__AT(cfg, k, int) ? "true" : "false");
        break;
    case ZPP_CFG_KEEP_ACTS: snprintf(buf, cap, "%s", keep_acts_text(*ZPP__AT(cfg, k, int))); break;
    case ZPP_CFG_BETAS:
        num_text(a, sizeof a, cfg->optimizer.beta1);
        num_text(b, sizeof b, cfg->optimizer.beta2);
        snprintf(buf, cap, "[%s, %s]", a, b);
        break;
    case ZPP_CFG_OPT_TYPE: snprintf(buf, cap, "\"AdamW\""); break;
    case ZPP_CFG_SCHED_TYPE:
        snprintf(buf, cap, "\"%s\"", zpp_sched_type_name(cfg->scheduler.type));
        break;
    case ZPP_CFG_WARMUP_TYPE:
        snprintf(buf, cap, "\"%s\"",
                 cfg->scheduler.warmup_type == ZPP_WARMUP_LINEAR ? "linear" : "log");
        break;
    case ZPP_CFG_DATA_ORDER:
        snprintf(buf, cap, "\"%s\"", zpp_data_order_name(*ZPP__AT(cfg, k, zpp_data_order)));
        break;
    case ZPP_CFG_FAMILY:
        snprintf(buf, cap, "\"%s\"",
                 zpp_model_family_name(*ZPP__AT(cfg, k, zpp_model_family_id)));
        break;
    case ZPP_CFG_HF_ARCH:
        snprintf(buf, cap, "\"%s\"", zpp_hf_arch_name(*ZPP__AT(cfg, k, zpp_hf_arch)));
        break;
    case ZPP_CFG_OBJECT:
    case ZPP_CFG_IGNORED: buf[0] = '\0'; break;
    }
}

/* The object at dotted `parent` under root, made where missing. */
static cJSON *json_object_at(cJSON *root, const char *parent) {
    cJSON *o = root;
    char part[ZPP__PATH_CAP];
    for (const char *p = parent; o && *p;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        snprintf(part, sizeof part, "%.*s", (int)n, p);
        cJSON *next = cJSON_GetObjectItemCaseSensitive(o, part);
        if (!cJSON_IsObject(next)) {
            if (next) cJSON_DeleteItemFromObjectCaseSensitive(o, part);
            next = cJSON_AddObjectToObject(o, part);
        }
        o = next;
        p = dot ? dot + 1 : p + n;
    }
    return o;
}

char *zpp_train_config_to_json(const zpp_train_config *cfg) {
    if (!cfg) return NULL;
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    for (size_t i = 0; ok && i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        if (!key_in_effect(k, cfg)) continue;
        char parent[ZPP__PATH_CAP], text[96];
        size_t plen = (size_t)(key_name(k) - k->path);
        snprintf(parent, sizeof parent, "%.*s", (int)(plen ? plen - 1 : 0), k->path);
        cJSON *o = json_object_at(root, parent);
        if (k->kind == ZPP_CFG_OBJECT_ON) { /* present = on */
            if (*ZPP__AT(cfg, k, int)) ok = o && json_object_at(o, key_name(k));
            continue;
        }
        /* the value's own text, verbatim: cJSON prints a number with 15
         * digits when that reads back within an ulp, which is not exact */
        value_text(k, cfg, text, sizeof text);
        ok = o && cJSON_AddRawToObject(o, key_name(k), text);
    }
    char *out = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!out) return NULL;
    char *copy = strdup(out); /* plain free() for the caller, not cJSON_free */
    cJSON_free(out);
    return copy;
}

int zpp_train_config_diff(const zpp_train_config *old, const zpp_train_config *now, char *out,
                          size_t cap) {
    int n = 0;
    size_t k_out = 0;
    if (cap) out[0] = '\0';
    for (size_t i = 0; i < ZPP__NKEYS; i++) {
        const zpp__key *k = &kKeys[i];
        /* the keys this run uses, and those the saved one used that are
         * not part of a scheduler or feature now gone (its switch says it) */
        if (k->kind == ZPP_CFG_IGNORED || k->kind == ZPP_CFG_OBJECT) continue;
        int gone = k->sched || key_in_off_object(k, now) ||
                   (now->scheduler.type == ZPP_SCHED_NONE && !strncmp(k->path, "scheduler.", 10) &&
                    k->kind != ZPP_CFG_SCHED_TYPE);
        if (!key_in_effect(k, now) && (gone || !key_in_effect(k, old))) continue;
        char a[96], b[96];
        value_text(k, old, a, sizeof a);
        value_text(k, now, b, sizeof b);
        if (!strcmp(a, b)) continue;
        /* strings without their quotes: this is for people */
        char *pa = a, *pb = b;
        if (pa[0] == '"') pa++, pa[strlen(pa) - 1] = '\0';
        if (pb[0] == '"') pb++, pb[strlen(pb) - 1] = '\0';
        if (k_out < cap)
            k_out += (size_t)snprintf(out + k_out, cap - k_out, "%s: %s -> %s\n", k->path, pa, pb);
        n++;
    }
    return n;
}

int zpp_train_schedule_length(const zpp_train_config *cfg) {
    const zpp_sched_type t = cfg->scheduler.type;
    if (t != ZPP_SCHED_WARMUP_DECAY_LR && t != ZPP_SCHED_WARMUP_COSINE_LR) return 0;
    return sched_total(cfg);
}

/* ------------------------------------------------------------------------ */
/* --set KEY=VALUE                                                           */
/* ------------------------------------------------------------------------ */

/* The key at a full dotted path, or NULL. */
static const zpp__key *key_at(const char *path) {
    for (size_t i = 0; i < ZPP__NKEYS; i++)
        if (!strcmp(kKeys[i].path, path)) return &kKeys[i];
    return NULL;
}

/* Puts the value of one "KEY=VALUE" into the tree at its dotted path. */
static zpp_status set_one(cJSON *root, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment || eq[1] == '\0')
        return zpp_error(ZPP_ERR_CONFIG,
                         "--set takes KEY=VALUE with KEY a dotted config path (--set "
                         "optimizer.params.lr=3e-4), got '%s'",
                         assignment);
    char path[ZPP__PATH_CAP];
    if ((size_t)(eq - assignment) >= sizeof path)
        return zpp_error(ZPP_ERR_CONFIG, "--set: key '%.*s...' is too long", 40, assignment);
    snprintf(path, sizeof path, "%.*s", (int)(eq - assignment), assignment);
    const char *value = eq + 1;
    const zpp__key *k = key_at(path);
    /* A string key takes a bare word (--set scheduler.type=WarmupLR), and
     * so does keep_activations beside true and false; any other value is
     * JSON: a number, true/false, [a, b], {}. */
    int word = k && (k->kind == ZPP_CFG_OPT_TYPE || k->kind == ZPP_CFG_SCHED_TYPE ||
                     k->kind == ZPP_CFG_WARMUP_TYPE || k->kind == ZPP_CFG_DATA_ORDER ||
                     k->kind == ZPP_CFG_FAMILY || k->kind == ZPP_CFG_HF_ARCH ||
                     (k->kind == ZPP_CFG_KEEP_ACTS && strcmp(value, "true") != 0 &&
                      strcmp(value, "false") != 0)) &&
               value[0] != '"';
    cJSON *v = NULL;
    if (word) {
        v = cJSON_CreateString(value);
    } else if ((v = cJSON_Parse(value)) != NULL) {
        /* the text as given, not cJSON's 15-digit rendering of its number */
        cJSON_Delete(v);
        v = cJSON_CreateRaw(value);
    }
    if (!v)
        return zpp_error(ZPP_ERR_CONFIG,
                         "--set %s: '%s' is not a value (a number, true or false, [a, b], or "
                         "\"text\"); '%s' takes a value of type %s",
                         path, value, path, k ? kind_doc(k->kind) : "a JSON value");
    const char *dot = strrchr(path, '.');
    char parent[ZPP__PATH_CAP];
    snprintf(parent, sizeof parent, "%.*s", dot ? (int)(dot - path) : 0, path);
    cJSON *o = json_object_at(root, parent);
    const char *name = dot ? dot + 1 : path;
    if (o && cJSON_GetObjectItemCaseSensitive(o, name)) /* a later --set of a key wins */
        cJSON_DeleteItemFromObjectCaseSensitive(o, name);
    if (!o || !cJSON_AddItemToObject(o, name, v)) {
        cJSON_Delete(v);
        return zpp_error(ZPP_ERR_NOMEM, "--set: out of memory");
    }
    return ZPP_OK;
}

zpp_status zpp_train_config_set(zpp_train_config *cfg, const char *const *assignments, int n) {
    if (!cfg || (n > 0 && !assignments))
        return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_set: NULL argument");
    if (n <= 0) return ZPP_OK;
    cJSON *root = cJSON_CreateObject();
    if (!root) return zpp_error(ZPP_ERR_NOMEM, "--set: out of memory");
    zpp_status st = ZPP_OK;
    for (int i = 0; i < n && st == ZPP_OK; i++) st = set_one(root, assignments[i]);
    char *text = st == ZPP_OK ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (st != ZPP_OK) return st;
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "--set: out of memory");
    /* one load of all of them, so that settings that must change together
     * (bf16 off, fp16 on) are checked together */
    st = load_json(text, "--set", cfg);
    cJSON_free(text);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Batch geometry                                                            */
/* ------------------------------------------------------------------------ */

zpp_status zpp_train_config_resolve(zpp_train_config *cfg, int world_size) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_resolve: cfg is NULL");
    if (world_size < 1)
        return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_resolve: world size %d < 1",
                         world_size);
    /* Work in 64 bits: micro * accum * world can exceed INT_MAX. */
    long long tbs = cfg->train_batch_size, mb = cfg->train_micro_batch_size_per_gpu,
              gas = cfg->gradient_accumulation_steps, w = world_size;
    if (tbs < 0 || mb < 0 || gas < 0)
        return zpp_error(ZPP_ERR_CONFIG, "batch sizes must be >= 1 (0 = derive)");
    if (tbs && mb && gas) {
        if (tbs != mb * gas * w)
            return zpp_error(ZPP_ERR_CONFIG,
                             "train_batch_size %lld != micro-batch %lld x gradient "
                             "accumulation %lld x world %lld = %lld; fix one of them or drop "
                             "train_batch_size",
                             tbs, mb, gas, w, mb * gas * w);
    } else if (tbs && mb) {
        if (tbs % (mb * w))
            return zpp_error(ZPP_ERR_CONFIG,
                             "train_batch_size %lld is not divisible by micro-batch %lld x "
                             "world %lld",
                             tbs, mb, w);
        gas = tbs / (mb * w);
    } else if (tbs && gas) {
        if (tbs % (gas * w))
            return zpp_error(ZPP_ERR_CONFIG,
                             "train_batch_size %lld is not divisible by gradient accumulation "
                             "%lld x world %lld",
                             tbs, gas, w);
        mb = tbs / (gas * w);
    } else if (tbs) {
        if (tbs % w)
            return zpp_error(ZPP_ERR_CONFIG,
                             "train_batch_size %lld is not divisible by world %lld", tbs, w);
        gas = 1;
        mb = tbs / w;
    } else {
        if (!mb) mb = ZPP_TRAIN_DEFAULT_MICRO_BATCH;
        if (!gas) gas = 1;
        tbs = mb * gas * w;
    }
    if (tbs > INT_MAX)
        return zpp_error(ZPP_ERR_CONFIG, "train_batch_size %lld is too large", tbs);
    int hpz = cfg->zero.hpz_partition_size; /* 0: the node, whatever it is */
    if (hpz < 0 || (hpz > 0 && world_size % hpz))
        return zpp_error(ZPP_ERR_CONFIG,
                         "zero_optimization.zero_hpz_partition_size %d does not divide world "
                         "size %d; it is the number of ranks per node",
                         hpz, world_size);
    cfg->train_batch_size = (int)tbs;
    cfg->train_micro_batch_size_per_gpu = (int)mb;
    cfg->gradient_accumulation_steps = (int)gas;
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Learning rate                                                             */
/* ------------------------------------------------------------------------ */

const char *zpp_data_order_name(zpp_data_order order) {
    return order == ZPP_DATA_ORDER_SEQUENTIAL ? "sequential" : "shuffled";
}

const char *zpp_model_family_name(zpp_model_family_id family) {
    return family == ZPP_FAMILY_LLAMA ? "llama" : "gpt2";
}

zpp_status zpp_data_order_parse(const char *name, zpp_data_order *order_p) {
    if (name && strcmp(name, "shuffled") == 0) *order_p = ZPP_DATA_ORDER_SHUFFLED;
    else if (name && strcmp(name, "sequential") == 0) *order_p = ZPP_DATA_ORDER_SEQUENTIAL;
    else
        return zpp_error(ZPP_ERR_CONFIG, "data order '%s' is unknown; use shuffled or sequential",
                         name ? name : "(null)");
    return ZPP_OK;
}

double zpp_train_lr(const zpp_train_config *cfg, long step) {
    const long s = step < 0 ? 0 : step;
    const zpp_sched_type t = cfg->scheduler.type;
    if (t == ZPP_SCHED_NONE) return cfg->optimizer.lr;
    const long W = cfg->scheduler.warmup_num_steps;
    const long N = sched_total(cfg);
    /* g: how far through the warm-up, 0 at s = 0, 1 from s = W on. The log
     * form rises fast and flattens (ln(s+1)/ln(W) reaches 1 at s = W - 1). */
    double g = 1.0;
    if (s < W) {
        if (cfg->scheduler.warmup_type == ZPP_WARMUP_LINEAR) g = (double)s / (double)W;
        else g = log((double)s + 1.0) / log(W < 2 ? 2.0 : (double)W);
    }
    if (t == ZPP_SCHED_WARMUP_LR || t == ZPP_SCHED_WARMUP_DECAY_LR) {
        const double lo = cfg->scheduler.warmup_min_lr, hi = cfg->scheduler.warmup_max_lr;
        if (s < W) return lo + (hi - lo) * g;
        if (t == ZPP_SCHED_WARMUP_LR) return hi;
        /* linear decay from hi at s = W to 0 at s = N */
        double frac = N > W ? (double)(N - s) / (double)(N - W) : 0.0;
        return hi * (frac > 0 ? frac : 0.0);
    }
    /* WarmupCosineLR: a ratio of the optimizer's lr. */
    const double lr = cfg->optimizer.lr;
    if (s < W) {
        const double a = cfg->scheduler.warmup_min_ratio;
        return lr * (a + (1.0 - a) * g);
    }
    /* Half a cosine: (1 + cos(pi p)) / 2 goes 1 -> 0 as p goes 0 -> 1. */
    double p = N > W ? (double)(s - W) / (double)(N - W) : 1.0;
    if (p > 1.0) p = 1.0;
    const double b = cfg->scheduler.cos_min_ratio;
    const double pi = 3.14159265358979323846;
    return lr * (b + (1.0 - b) * 0.5 * (1.0 + cos(pi * p)));
}

zpp_decoder_shape zpp_train_config_shape(const zpp_train_config *c) {
    zpp_decoder_shape shape = c->model_ext;
    zpp_gpt2_shape_set(&c->model, &shape);
    shape.recompute = c->activation_checkpointing;
    shape.keep_acts = c->keep_activations;
    return shape;
}
