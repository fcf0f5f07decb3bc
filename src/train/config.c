/* train/config.c — DeepSpeed-style JSON configuration (see config.h).
 *
 * Parsing walks every member of every object and dispatches on its name, so
 * an unknown key is found where it is (and named with its dotted path)
 * rather than silently skipped. Everything is applied to a copy of the
 * caller's config, validated as a whole, and copied back only on success. */
#include "train/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

#define ZPP__PATH_CAP 160
#define ZPP__CONFIG_MAX_BYTES (16u << 20)

/* Parsing context: the source named in messages and the config being built. */
typedef struct zpp__cfgctx {
    const char *src;
    zpp_train_config *cfg;
} zpp__cfgctx;

/* ------------------------------------------------------------------------ */
/* Defaults                                                                  */
/* ------------------------------------------------------------------------ */

zpp_status zpp_train_config_defaults(zpp_train_config *cfg) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_defaults: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    /* torch.optim.AdamW's defaults, which DeepSpeed's AdamW inherits. */
    cfg->optimizer.lr = 1e-3;
    cfg->optimizer.beta1 = 0.9;
    cfg->optimizer.beta2 = 0.999;
    cfg->optimizer.eps = 1e-8;
    cfg->optimizer.weight_decay = 0.01;
    /* DeepSpeed's scheduler defaults; no scheduler unless one is given. */
    cfg->scheduler.type = ZPP_SCHED_NONE;
    cfg->scheduler.warmup_type = ZPP_WARMUP_LOG;
    cfg->scheduler.warmup_num_steps = 1000;
    cfg->scheduler.total_num_steps = 0;
    cfg->scheduler.warmup_min_lr = 0.0;
    cfg->scheduler.warmup_max_lr = 1e-3;
    cfg->scheduler.warmup_min_ratio = 0.0;
    cfg->scheduler.cos_min_ratio = 1e-4;
    cfg->gradient_clipping = 0.0;
    cfg->bf16 = 0;
    cfg->zero.stage = 3;
    cfg->zero.quantized_weights = 0;
    cfg->zero.hpz_partition_size = 1;
    cfg->zero.quantized_gradients = 0;
    cfg->zero.max_reuse_distance = 1000000000; /* DeepSpeed's default, 1e9 */
    /* A GPT small enough to train on a laptop CPU in a demo, over bytes. */
    cfg->model.n_layer = 2;
    cfg->model.n_head = 4;
    cfg->model.n_embd = 64;
    cfg->model.seq_len = 64;
    cfg->model.vocab_size = 256;
    cfg->train_steps = 200;
    cfg->seed = 1234;
    cfg->eval_every = 50;
    cfg->eval_batches = 4;
    cfg->steps_per_print = 10;
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

static const char *zpp__json_type(const cJSON *it) {
    if (cJSON_IsBool(it)) return "a boolean";
    if (cJSON_IsNull(it)) return "null";
    if (cJSON_IsNumber(it)) return "a number";
    if (cJSON_IsString(it)) return "a string";
    if (cJSON_IsArray(it)) return "an array";
    if (cJSON_IsObject(it)) return "an object";
    return "an invalid value";
}

static void zpp__path_join(char *out, const char *prefix, const char *key) {
    if (prefix[0]) snprintf(out, ZPP__PATH_CAP, "%s.%s", prefix, key);
    else snprintf(out, ZPP__PATH_CAP, "%s", key);
}

static zpp_status zpp__type_error(const zpp__cfgctx *c, const char *path, const char *want,
                                  const cJSON *it) {
    return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be %s, got %s", c->src, path, want,
                     zpp__json_type(it));
}

/* An integer in [lo, hi]. JSON has only doubles; 3.0 is accepted, 3.5 not. */
static zpp_status zpp__get_int(const zpp__cfgctx *c, const cJSON *it, const char *path,
                               long long lo, long long hi, long long *out) {
    if (!cJSON_IsNumber(it)) return zpp__type_error(c, path, "an integer", it);
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

static zpp_status zpp__get_intfield(const zpp__cfgctx *c, const cJSON *it, const char *path,
                                    long long lo, int *out) {
    long long v = 0;
    ZPP_CHECK(zpp__get_int(c, it, path, lo, INT_MAX, &v));
    *out = (int)v;
    return ZPP_OK;
}

static zpp_status zpp__get_num(const zpp__cfgctx *c, const cJSON *it, const char *path,
                               double *out) {
    if (!cJSON_IsNumber(it)) return zpp__type_error(c, path, "a number", it);
    if (!isfinite(it->valuedouble))
        return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be finite", c->src, path);
    *out = it->valuedouble;
    return ZPP_OK;
}

static zpp_status zpp__get_bool(const zpp__cfgctx *c, const cJSON *it, const char *path,
                                int *out) {
    if (!cJSON_IsBool(it)) return zpp__type_error(c, path, "a boolean (true/false)", it);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return ZPP_OK;
}

static zpp_status zpp__get_str(const zpp__cfgctx *c, const cJSON *it, const char *path,
                               const char **out) {
    if (!cJSON_IsString(it) || !it->valuestring)
        return zpp__type_error(c, path, "a string", it);
    *out = it->valuestring;
    return ZPP_OK;
}

static zpp_status zpp__want_object(const zpp__cfgctx *c, const cJSON *it, const char *path) {
    if (!cJSON_IsObject(it)) return zpp__type_error(c, path, "an object", it);
    return ZPP_OK;
}

/* A member name seen twice in one object is an error: JSON allows it, but
 * which value wins would be a guess. */
static zpp_status zpp__check_duplicate(const zpp__cfgctx *c, const cJSON *obj,
                                       const cJSON *it, const char *path) {
    for (const cJSON *p = obj->child; p && p != it; p = p->next)
        if (p->string && strcmp(p->string, it->string) == 0)
            return zpp_error(ZPP_ERR_CONFIG, "%s: duplicate key '%s'", c->src, path);
    return ZPP_OK;
}

static zpp_status zpp__unknown(const zpp__cfgctx *c, const char *path, const char *known) {
    return zpp_error(ZPP_ERR_CONFIG, "%s: unknown key '%s' (known here: %s)", c->src, path,
                     known);
}

/* Records an accepted-but-ignored DeepSpeed key once in cfg->ignored. */
static void zpp__note_ignored(zpp_train_config *cfg, const char *path) {
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

static int zpp__in_list(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return 1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Sections                                                                  */
/* ------------------------------------------------------------------------ */

/* Joins the member's dotted path into `path` and refuses duplicates. */
static zpp_status zpp__member(const zpp__cfgctx *c, const cJSON *obj, const cJSON *it,
                              const char *prefix, char *path) {
    zpp__path_join(path, prefix, it->string ? it->string : "");
    return zpp__check_duplicate(c, obj, it, path);
}

static zpp_status zpp__parse_betas(const zpp__cfgctx *c, const cJSON *it, const char *path) {
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
        return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' must be an array of 2 numbers [beta1, beta2]",
                         c->src, path);
    char p0[ZPP__PATH_CAP + 4], p1[ZPP__PATH_CAP + 4];
    snprintf(p0, sizeof p0, "%s[0]", path);
    snprintf(p1, sizeof p1, "%s[1]", path);
    ZPP_CHECK(zpp__get_num(c, cJSON_GetArrayItem(it, 0), p0, &c->cfg->optimizer.beta1));
    ZPP_CHECK(zpp__get_num(c, cJSON_GetArrayItem(it, 1), p1, &c->cfg->optimizer.beta2));
    return ZPP_OK;
}

static zpp_status zpp__parse_optimizer(const zpp__cfgctx *c, const cJSON *obj) {
    ZPP_CHECK(zpp__want_object(c, obj, "optimizer"));
    zpp_train_config *cfg = c->cfg;
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, obj, it, "optimizer", path));
        const char *k = it->string;
        if (strcmp(k, "type") == 0) {
            const char *t = NULL;
            ZPP_CHECK(zpp__get_str(c, it, path, &t));
            if (strcasecmp(t, "AdamW") != 0)
                return zpp_error(ZPP_ERR_UNSUPPORTED,
                                 "%s: optimizer.type '%s' is not supported; zeropp implements "
                                 "\"AdamW\" (Adam with decoupled weight decay) only",
                                 c->src, t);
        } else if (strcmp(k, "params") == 0) {
            ZPP_CHECK(zpp__want_object(c, it, path));
            for (const cJSON *p = it->child; p; p = p->next) {
                char ppath[ZPP__PATH_CAP];
                ZPP_CHECK(zpp__member(c, it, p, "optimizer.params", ppath));
                const char *q = p->string;
                if (strcmp(q, "lr") == 0) ZPP_CHECK(zpp__get_num(c, p, ppath, &cfg->optimizer.lr));
                else if (strcmp(q, "betas") == 0) ZPP_CHECK(zpp__parse_betas(c, p, ppath));
                else if (strcmp(q, "eps") == 0)
                    ZPP_CHECK(zpp__get_num(c, p, ppath, &cfg->optimizer.eps));
                else if (strcmp(q, "weight_decay") == 0)
                    ZPP_CHECK(zpp__get_num(c, p, ppath, &cfg->optimizer.weight_decay));
                else return zpp__unknown(c, ppath, "lr, betas, eps, weight_decay");
            }
        } else {
            return zpp__unknown(c, path, "type, params");
        }
    }
    return ZPP_OK;
}

/* Which scheduler params each type takes (DeepSpeed's constructor
 * arguments); a param of another type is an error, as in DeepSpeed. */
enum {
    ZPP__P_WARMUP = 1u << ZPP_SCHED_WARMUP_LR | 1u << ZPP_SCHED_WARMUP_DECAY_LR |
                    1u << ZPP_SCHED_WARMUP_COSINE_LR,
    ZPP__P_LRS = 1u << ZPP_SCHED_WARMUP_LR | 1u << ZPP_SCHED_WARMUP_DECAY_LR,
    ZPP__P_TOTAL = 1u << ZPP_SCHED_WARMUP_DECAY_LR | 1u << ZPP_SCHED_WARMUP_COSINE_LR,
    ZPP__P_RATIOS = 1u << ZPP_SCHED_WARMUP_COSINE_LR
};

static zpp_status zpp__sched_applies(const zpp__cfgctx *c, const char *path, unsigned mask) {
    zpp_sched_type t = c->cfg->scheduler.type;
    if (mask & (1u << t)) return ZPP_OK;
    return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' does not apply to scheduler type %s", c->src,
                     path, zpp_sched_type_name(t));
}

static zpp_status zpp__parse_scheduler(const zpp__cfgctx *c, const cJSON *obj) {
    ZPP_CHECK(zpp__want_object(c, obj, "scheduler"));
    zpp_train_config *cfg = c->cfg;
    /* The type decides which params are valid, so read it first. */
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "type");
    if (type) {
        const char *t = NULL;
        ZPP_CHECK(zpp__get_str(c, type, "scheduler.type", &t));
        if (strcasecmp(t, "WarmupLR") == 0) cfg->scheduler.type = ZPP_SCHED_WARMUP_LR;
        else if (strcasecmp(t, "WarmupDecayLR") == 0)
            cfg->scheduler.type = ZPP_SCHED_WARMUP_DECAY_LR;
        else if (strcasecmp(t, "WarmupCosineLR") == 0)
            cfg->scheduler.type = ZPP_SCHED_WARMUP_COSINE_LR;
        else
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "%s: scheduler.type '%s' is not supported; use WarmupLR, "
                             "WarmupDecayLR or WarmupCosineLR (or no scheduler for a "
                             "constant lr)",
                             c->src, t);
    }
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, obj, it, "scheduler", path));
        const char *k = it->string;
        if (strcmp(k, "type") == 0) continue;
        if (strcmp(k, "params") != 0) return zpp__unknown(c, path, "type, params");
        ZPP_CHECK(zpp__want_object(c, it, path));
        if (cfg->scheduler.type == ZPP_SCHED_NONE)
            return zpp_error(ZPP_ERR_CONFIG, "%s: 'scheduler.params' given without "
                             "'scheduler.type'", c->src);
        for (const cJSON *p = it->child; p; p = p->next) {
            char pp[ZPP__PATH_CAP];
            ZPP_CHECK(zpp__member(c, it, p, "scheduler.params", pp));
            const char *q = p->string;
            if (strcmp(q, "warmup_num_steps") == 0) {
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_WARMUP));
                ZPP_CHECK(zpp__get_intfield(c, p, pp, 0, &cfg->scheduler.warmup_num_steps));
            } else if (strcmp(q, "warmup_type") == 0) {
                const char *w = NULL;
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_WARMUP));
                ZPP_CHECK(zpp__get_str(c, p, pp, &w));
                if (strcmp(w, "log") == 0) cfg->scheduler.warmup_type = ZPP_WARMUP_LOG;
                else if (strcmp(w, "linear") == 0) cfg->scheduler.warmup_type = ZPP_WARMUP_LINEAR;
                else
                    return zpp_error(ZPP_ERR_CONFIG, "%s: '%s' is '%s'; use \"log\" or \"linear\"",
                                     c->src, pp, w);
            } else if (strcmp(q, "warmup_min_lr") == 0) {
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_LRS));
                ZPP_CHECK(zpp__get_num(c, p, pp, &cfg->scheduler.warmup_min_lr));
            } else if (strcmp(q, "warmup_max_lr") == 0) {
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_LRS));
                ZPP_CHECK(zpp__get_num(c, p, pp, &cfg->scheduler.warmup_max_lr));
            } else if (strcmp(q, "total_num_steps") == 0) {
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_TOTAL));
                ZPP_CHECK(zpp__get_intfield(c, p, pp, 0, &cfg->scheduler.total_num_steps));
            } else if (strcmp(q, "warmup_min_ratio") == 0) {
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_RATIOS));
                ZPP_CHECK(zpp__get_num(c, p, pp, &cfg->scheduler.warmup_min_ratio));
            } else if (strcmp(q, "cos_min_ratio") == 0) {
                ZPP_CHECK(zpp__sched_applies(c, pp, ZPP__P_RATIOS));
                ZPP_CHECK(zpp__get_num(c, p, pp, &cfg->scheduler.cos_min_ratio));
            } else {
                return zpp__unknown(c, pp,
                                    "warmup_num_steps, warmup_type, warmup_min_lr, "
                                    "warmup_max_lr, total_num_steps, warmup_min_ratio, "
                                    "cos_min_ratio");
            }
        }
    }
    return ZPP_OK;
}

/* bf16 / fp16: {"enabled": bool}; fp16 also takes its loss-scaling knobs,
 * which are moot since enabling fp16 is refused. */
static zpp_status zpp__parse_precision(const zpp__cfgctx *c, const cJSON *obj, const char *name) {
    static const char *const fp16_knobs[] = {"loss_scale", "initial_scale_power",
                                             "loss_scale_window", "hysteresis",
                                             "consecutive_hysteresis", "min_loss_scale",
                                             "auto_cast", NULL};
    ZPP_CHECK(zpp__want_object(c, obj, name));
    int is_fp16 = strcmp(name, "fp16") == 0;
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, obj, it, name, path));
        if (strcmp(it->string, "enabled") == 0) {
            int on = 0;
            ZPP_CHECK(zpp__get_bool(c, it, path, &on));
            if (!is_fp16) {
                c->cfg->bf16 = on;
            } else if (on) {
                return zpp_error(ZPP_ERR_UNSUPPORTED,
                                 "%s: fp16 training is not supported (it needs loss scaling); "
                                 "set \"fp16\": {\"enabled\": false} and use \"bf16\": "
                                 "{\"enabled\": true}",
                                 c->src);
            }
        } else if (is_fp16 && zpp__in_list(it->string, fp16_knobs)) {
            zpp__note_ignored(c->cfg, path);
        } else {
            return zpp__unknown(c, path, is_fp16 ? "enabled (and fp16 loss-scale knobs)"
                                                 : "enabled");
        }
    }
    return ZPP_OK;
}

static zpp_status zpp__parse_zero(const zpp__cfgctx *c, const cJSON *obj) {
    static const char *const tuning[] = {"overlap_comm",
                                         "contiguous_gradients",
                                         "reduce_bucket_size",
                                         "allgather_bucket_size",
                                         "reduce_scatter",
                                         "allgather_partitions",
                                         "sub_group_size",
                                         "stage3_prefetch_bucket_size",
                                         "stage3_param_persistence_threshold",
                                         "stage3_max_live_parameters",
                                         "stage3_gather_16bit_weights_on_model_save",
                                         NULL};
    ZPP_CHECK(zpp__want_object(c, obj, "zero_optimization"));
    zpp_train_config *cfg = c->cfg;
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, obj, it, "zero_optimization", path));
        const char *k = it->string;
        if (strcmp(k, "stage") == 0) {
            long long v = 0;
            ZPP_CHECK(zpp__get_int(c, it, path, INT_MIN, INT_MAX, &v));
            if (v != 3)
                return zpp_error(ZPP_ERR_UNSUPPORTED,
                                 "%s: zero_optimization.stage is %lld; zeropp implements ZeRO "
                                 "stage 3 only (set \"stage\": 3)",
                                 c->src, v);
            cfg->zero.stage = 3;
        } else if (strcmp(k, "zero_quantized_weights") == 0) {
            ZPP_CHECK(zpp__get_bool(c, it, path, &cfg->zero.quantized_weights));
        } else if (strcmp(k, "zero_hpz_partition_size") == 0) {
            ZPP_CHECK(zpp__get_intfield(c, it, path, 1, &cfg->zero.hpz_partition_size));
        } else if (strcmp(k, "zero_quantized_gradients") == 0) {
            ZPP_CHECK(zpp__get_bool(c, it, path, &cfg->zero.quantized_gradients));
        } else if (strcmp(k, "stage3_max_reuse_distance") == 0) {
            ZPP_CHECK(zpp__get_int(c, it, path, 0, 1LL << 53, &cfg->zero.max_reuse_distance));
        } else if (zpp__in_list(k, tuning)) {
            zpp__note_ignored(cfg, path);
        } else {
            return zpp__unknown(c, path,
                                "stage, zero_quantized_weights, zero_hpz_partition_size, "
                                "zero_quantized_gradients, stage3_max_reuse_distance (and "
                                "DeepSpeed tuning knobs)");
        }
    }
    return ZPP_OK;
}

static zpp_status zpp__parse_model(const zpp__cfgctx *c, const cJSON *obj) {
    ZPP_CHECK(zpp__want_object(c, obj, "model"));
    zpp_gpt2_config *m = &c->cfg->model;
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, obj, it, "model", path));
        const char *k = it->string;
        int *f = strcmp(k, "n_layer") == 0      ? &m->n_layer
                 : strcmp(k, "n_head") == 0     ? &m->n_head
                 : strcmp(k, "n_embd") == 0     ? &m->n_embd
                 : strcmp(k, "seq_len") == 0    ? &m->seq_len
                 : strcmp(k, "vocab_size") == 0 ? &m->vocab_size
                                                : NULL;
        if (!f) return zpp__unknown(c, path, "n_layer, n_head, n_embd, seq_len, vocab_size");
        ZPP_CHECK(zpp__get_intfield(c, it, path, 1, f));
    }
    return ZPP_OK;
}

static zpp_status zpp__parse_zeropp(const zpp__cfgctx *c, const cJSON *obj) {
    ZPP_CHECK(zpp__want_object(c, obj, "zeropp"));
    zpp_train_config *cfg = c->cfg;
    for (const cJSON *it = obj->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, obj, it, "zeropp", path));
        const char *k = it->string;
        if (strcmp(k, "train_steps") == 0) {
            ZPP_CHECK(zpp__get_intfield(c, it, path, 1, &cfg->train_steps));
        } else if (strcmp(k, "seed") == 0) {
            /* Doubles hold integers exactly up to 2^53. */
            long long v = 0;
            ZPP_CHECK(zpp__get_int(c, it, path, 0, 1LL << 53, &v));
            cfg->seed = (uint64_t)v;
        } else if (strcmp(k, "eval_every") == 0) {
            ZPP_CHECK(zpp__get_intfield(c, it, path, 0, &cfg->eval_every));
        } else if (strcmp(k, "eval_batches") == 0) {
            ZPP_CHECK(zpp__get_intfield(c, it, path, 1, &cfg->eval_batches));
        } else {
            return zpp__unknown(c, path, "train_steps, seed, eval_every, eval_batches");
        }
    }
    return ZPP_OK;
}

static zpp_status zpp__parse_root(const zpp__cfgctx *c, const cJSON *root) {
    if (!cJSON_IsObject(root))
        return zpp_error(ZPP_ERR_CONFIG, "%s: the top level must be a JSON object, got %s",
                         c->src, zpp__json_type(root));
    zpp_train_config *cfg = c->cfg;
    for (const cJSON *it = root->child; it; it = it->next) {
        char path[ZPP__PATH_CAP];
        ZPP_CHECK(zpp__member(c, root, it, "", path));
        const char *k = it->string;
        if (strcmp(k, "train_batch_size") == 0)
            ZPP_CHECK(zpp__get_intfield(c, it, path, 1, &cfg->train_batch_size));
        else if (strcmp(k, "train_micro_batch_size_per_gpu") == 0)
            ZPP_CHECK(zpp__get_intfield(c, it, path, 1, &cfg->train_micro_batch_size_per_gpu));
        else if (strcmp(k, "gradient_accumulation_steps") == 0)
            ZPP_CHECK(zpp__get_intfield(c, it, path, 1, &cfg->gradient_accumulation_steps));
        else if (strcmp(k, "steps_per_print") == 0)
            ZPP_CHECK(zpp__get_intfield(c, it, path, 0, &cfg->steps_per_print));
        else if (strcmp(k, "gradient_clipping") == 0)
            ZPP_CHECK(zpp__get_num(c, it, path, &cfg->gradient_clipping));
        else if (strcmp(k, "optimizer") == 0) ZPP_CHECK(zpp__parse_optimizer(c, it));
        else if (strcmp(k, "scheduler") == 0) ZPP_CHECK(zpp__parse_scheduler(c, it));
        else if (strcmp(k, "bf16") == 0) ZPP_CHECK(zpp__parse_precision(c, it, "bf16"));
        else if (strcmp(k, "fp16") == 0) ZPP_CHECK(zpp__parse_precision(c, it, "fp16"));
        else if (strcmp(k, "zero_optimization") == 0) ZPP_CHECK(zpp__parse_zero(c, it));
        else if (strcmp(k, "model") == 0) ZPP_CHECK(zpp__parse_model(c, it));
        else if (strcmp(k, "zeropp") == 0) ZPP_CHECK(zpp__parse_zeropp(c, it));
        else if (strcmp(k, "wall_clock_breakdown") == 0) zpp__note_ignored(cfg, path);
        else
            return zpp__unknown(c, path,
                                "train_batch_size, train_micro_batch_size_per_gpu, "
                                "gradient_accumulation_steps, steps_per_print, "
                                "gradient_clipping, optimizer, scheduler, bf16, fp16, "
                                "zero_optimization, model, zeropp");
    }
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

static int zpp__sched_total(const zpp_train_config *cfg) {
    return cfg->scheduler.total_num_steps > 0 ? cfg->scheduler.total_num_steps
                                              : cfg->train_steps;
}

zpp_status zpp_train_config_validate(const zpp_train_config *cfg) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_validate: cfg is NULL");
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
    ZPP__POS(cfg->zero.hpz_partition_size, "zero_optimization.zero_hpz_partition_size");
#undef ZPP__POS
    if (m->n_embd % m->n_head)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.n_embd' %d is not divisible by 'model.n_head' %d; each head "
                         "gets n_embd / n_head channels",
                         m->n_embd, m->n_head);
    if (cfg->train_batch_size < 0 || cfg->train_micro_batch_size_per_gpu < 0 ||
        cfg->gradient_accumulation_steps < 0)
        return zpp_error(ZPP_ERR_CONFIG, "batch sizes must be >= 1 (0 = derive)");
    if (cfg->eval_every < 0 || cfg->steps_per_print < 0)
        return zpp_error(ZPP_ERR_CONFIG, "'%s' must be >= 0 (0 = never)",
                         cfg->eval_every < 0 ? "zeropp.eval_every" : "steps_per_print");

    /* AdamW: lr > 0; betas in [0, 1) so the moment averages forget (and the
     * bias corrections 1 - beta^t stay nonzero); eps > 0 keeps the division
     * by sqrt(v) + eps finite. */
    const double lr = cfg->optimizer.lr, b1 = cfg->optimizer.beta1, b2 = cfg->optimizer.beta2;
    if (!(lr > 0) || !isfinite(lr))
        return zpp_error(ZPP_ERR_CONFIG, "'optimizer.params.lr' must be > 0, got %g", lr);
    if (!(b1 >= 0 && b1 < 1))
        return zpp_error(ZPP_ERR_CONFIG, "'optimizer.params.betas[0]' must be in [0, 1), got %g",
                         b1);
    if (!(b2 >= 0 && b2 < 1))
        return zpp_error(ZPP_ERR_CONFIG, "'optimizer.params.betas[1]' must be in [0, 1), got %g",
                         b2);
    if (!(cfg->optimizer.eps > 0) || !isfinite(cfg->optimizer.eps))
        return zpp_error(ZPP_ERR_CONFIG, "'optimizer.params.eps' must be > 0, got %g",
                         cfg->optimizer.eps);
    if (!(cfg->optimizer.weight_decay >= 0) || !isfinite(cfg->optimizer.weight_decay))
        return zpp_error(ZPP_ERR_CONFIG, "'optimizer.params.weight_decay' must be >= 0, got %g",
                         cfg->optimizer.weight_decay);
    if (!(cfg->gradient_clipping >= 0) || !isfinite(cfg->gradient_clipping))
        return zpp_error(ZPP_ERR_CONFIG, "'gradient_clipping' must be >= 0 (0 = off), got %g",
                         cfg->gradient_clipping);

    if (cfg->zero.stage != 3)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "zero_optimization.stage is %d; zeropp implements stage 3 only",
                         cfg->zero.stage);

    const zpp_sched_type t = cfg->scheduler.type;
    if (t < ZPP_SCHED_NONE || t > ZPP_SCHED_WARMUP_COSINE_LR)
        return zpp_error(ZPP_ERR_CONFIG, "scheduler type %d is not valid", (int)t);
    if (t == ZPP_SCHED_NONE) return ZPP_OK;
    const int W = cfg->scheduler.warmup_num_steps, N = zpp__sched_total(cfg);
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
    if ((t == ZPP_SCHED_WARMUP_DECAY_LR || t == ZPP_SCHED_WARMUP_COSINE_LR) && N <= W)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'scheduler.params.total_num_steps' (%d%s) must exceed "
                         "'scheduler.params.warmup_num_steps' (%d) for %s",
                         N, cfg->scheduler.total_num_steps ? "" : ", from zeropp.train_steps",
                         W, zpp_sched_type_name(t));
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

/* 1-based line and column of byte `pos` of `text`. */
static void zpp__line_col(const char *text, const char *pos, int *line_p, int *col_p) {
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

static zpp_status zpp__load(const char *json, const char *src, zpp_train_config *cfg) {
    if (!json || !cfg) return zpp_error(ZPP_ERR_INVALID, "config: NULL argument");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
    if (!root) {
        const char *at = end ? end : cJSON_GetErrorPtr();
        if (!at) at = json;
        int line, col;
        zpp__line_col(json, at, &line, &col);
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
    zpp_train_config tmp = *cfg;
    zpp__cfgctx c = {src, &tmp};
    zpp_status st = zpp__parse_root(&c, root);
    cJSON_Delete(root);
    if (st != ZPP_OK) return st;
    st = zpp_train_config_validate(&tmp);
    if (st != ZPP_OK) return zpp_error_context(st, "%s", src);
    *cfg = tmp;
    return ZPP_OK;
}

zpp_status zpp_train_config_load_string(const char *json, zpp_train_config *cfg) {
    return zpp__load(json, "<string>", cfg);
}

zpp_status zpp_train_config_load_file(const char *path, zpp_train_config *cfg) {
    if (!path || !cfg) return zpp_error(ZPP_ERR_INVALID, "zpp_train_config_load_file: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return zpp_error(ZPP_ERR_IO, "cannot open config '%s': %s", path, strerror(errno));
    zpp_status st = ZPP_OK;
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
    st = zpp__load(buf, path, cfg);
out:
    free(buf);
    fclose(f);
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
    int hpz = cfg->zero.hpz_partition_size;
    if (hpz < 1 || world_size % hpz)
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

double zpp_train_lr(const zpp_train_config *cfg, long step) {
    const long s = step < 0 ? 0 : step;
    const zpp_sched_type t = cfg->scheduler.type;
    if (t == ZPP_SCHED_NONE) return cfg->optimizer.lr;
    const long W = cfg->scheduler.warmup_num_steps;
    const long N = zpp__sched_total(cfg);
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
