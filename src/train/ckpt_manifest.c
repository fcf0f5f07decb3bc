/* train/ckpt_manifest.c — parsing a checkpoint's manifest (ckpt_manifest.h). */
#include "train/ckpt_manifest.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/json_exact.h"

uint64_t zpp_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

#define SUM_KEY "\"checksum\":\""

/* Where the 16 digits of the manifest's own checksum are: the last
 * "checksum":" of the text, followed by 16 characters, "} and at most a
 * newline (NULL if the text does not end so). */
static char *checksum_digits(const char *text) {
    const char *at = NULL;
    for (const char *p = strstr(text, SUM_KEY); p; p = strstr(p + 1, SUM_KEY)) at = p;
    if (!at) return NULL;
    const char *d = at + strlen(SUM_KEY);
    for (int i = 0; i < 16; i++)
        if (!d[i]) return NULL;
    const char *tail = d + 16;
    if (strcmp(tail, "\"}") != 0 && strcmp(tail, "\"}\n") != 0) return NULL;
    return (char *)d;
}

static uint64_t manifest_sum(const char *text, const char *digits) {
    static const char zeros[16] = "0000000000000000";
    uint64_t h = zpp_fnv1a(ZPP_FNV1A_INIT, text, (size_t)(digits - text));
    h = zpp_fnv1a(h, zeros, 16);
    return zpp_fnv1a(h, digits + 16, strlen(digits + 16));
}

int zpp_ckpt_manifest_seal(char *text) {
    char *d = checksum_digits(text), hex[17];
    if (!d) return 0;
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)manifest_sum(text, d));
    memcpy(d, hex, 16);
    return 1;
}

/* A 64-bit value written as exactly 16 lowercase hex digits. */
static int parse_hex64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v << 4 | (uint64_t)d;
    }
    if (s[16]) return 0;
    *out = v;
    return 1;
}

static int get_hex64(const cJSON *o, const char *key, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && parse_hex64(v->valuestring, out);
}

/* An array of n 16-hex-digit strings, into a new array. */
static int get_sums(const cJSON *o, const char *key, int n, uint64_t **out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return 0;
    if (!(*out = calloc((size_t)n, sizeof **out))) return 0;
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsString(x) || !parse_hex64(x->valuestring, &(*out)[i])) return 0;
    }
    return 1;
}

/* The manifest's own checksum, when it has one (format 3), checked before
 * its JSON is read: a damaged manifest is named as such whatever byte
 * changed. *has_p: whether it has one. */
static zpp_status manifest_checksum(const char *text, const char *name, int *has_p) {
    const char *d = checksum_digits(text);
    char want[17] = "";
    uint64_t stored = 0;
    *has_p = d != NULL;
    if (!d) return ZPP_OK;
    snprintf(want, sizeof want, "%.16s", d);
    const uint64_t sum = manifest_sum(text, d);
    if (!parse_hex64(want, &stored) || sum != stored)
        return zpp_error(ZPP_ERR_FORMAT,
                         "checkpoint manifest %s is damaged: its checksum says %s, its bytes "
                         "give %016llx",
                         name, want, (unsigned long long)sum);
    return ZPP_OK;
}

/* Format 3's members: the run id and the files' sums. */
static zpp_status manifest_v3(const cJSON *j, const char *name, zpp_ckpt_manifest *m) {
    const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "sums");
    if (!get_hex64(j, "run_id", &m->run_id) || !cJSON_IsObject(sums) ||
        !get_sums(sums, "rank", m->world_size, &m->rank_sums) ||
        (m->loco && !get_sums(sums, "loco", m->world_size, &m->loco_sums)))
        return zpp_error(ZPP_ERR_FORMAT,
                         "checkpoint manifest %s is malformed (run_id or sums missing or not "
                         "16 hex digits each)",
                         name);
    return ZPP_OK;
}

/* An integral number in [lo, hi] (doubles hold every integer up to 2^53,
 * so the check comes before any conversion). */
static int get_num(const cJSON *o, const char *key, double lo, double hi, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) return 0;
    *out = v->valuedouble;
    return 1;
}

static int get_int(const cJSON *o, const char *key, int lo, int *out) {
    double d = 0;
    if (!get_num(o, key, lo, 2147483647.0, &d) || d != (double)(int)d) return 0;
    *out = (int)d;
    return 1;
}

static int get_str(const cJSON *o, const char *key, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return 0;
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return 1;
}

/* "model"'s family and a llama's knobs (ckpt_manifest.h). */
static zpp_status manifest_family(const cJSON *mo, const char *name, zpp_ckpt_manifest *m) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(mo, "family");
    snprintf(m->family, sizeof m->family, "gpt2");
    if (!f) return ZPP_OK;
    if (!cJSON_IsString(f) || (strcmp(f->valuestring, "gpt2") && strcmp(f->valuestring, "llama")))
        return zpp_error(ZPP_ERR_FORMAT,
                         "checkpoint manifest %s: model.family is not \"gpt2\" or \"llama\"",
                         name);
    snprintf(m->family, sizeof m->family, "%s", f->valuestring);
    if (strcmp(m->family, "llama")) return ZPP_OK;
    zpp_decoder_shape *x = &m->ext;
    const cJSON *ut = cJSON_GetObjectItemCaseSensitive(mo, "untied_head");
    const cJSON *qb = cJSON_GetObjectItemCaseSensitive(mo, "qkv_bias");
    if (!get_int(mo, "n_kv_head", 1, &x->n_kv_head) || !get_int(mo, "n_ffn", 1, &x->n_ffn) ||
        !get_num(mo, "rope_theta", 0, 1e300, &x->rope_theta) ||
        !get_num(mo, "norm_eps", 0, 1e300, &x->norm_eps) ||
        !get_num(mo, "rope_factor", 0, 1e300, &x->rope_factor) ||
        !get_num(mo, "rope_low_freq_factor", 0, 1e300, &x->rope_low_freq_factor) ||
        !get_num(mo, "rope_high_freq_factor", 0, 1e300, &x->rope_high_freq_factor) ||
        !get_int(mo, "rope_original_max_pos", 0, &x->rope_original_max_pos) ||
        !cJSON_IsBool(ut) || !cJSON_IsBool(qb))
        return zpp_error(ZPP_ERR_FORMAT,
                         "checkpoint manifest %s: a llama model lacks one of n_kv_head, n_ffn, "
                         "rope_theta, norm_eps, untied_head, qkv_bias, rope_* (or has one out of "
                         "range)",
                         name);
    x->untied_head = cJSON_IsTrue(ut), x->qkv_bias = cJSON_IsTrue(qb);
    /* o_bias came later: absent in older manifests, whose llamas had none */
    const cJSON *ob = cJSON_GetObjectItemCaseSensitive(mo, "o_bias");
    if (ob && !cJSON_IsBool(ob))
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s: model.o_bias is not true or "
                                         "false", name);
    x->o_bias = cJSON_IsTrue(ob);
    return ZPP_OK;
}

/* The optional members: "config" (an object, kept as text for
 * train/config.c to read), "data" ({"path": string or null, "kind",
 * "tokens"}) and "init_from" (a string). Sets the message and returns
 * ZPP_ERR_FORMAT when one is there but malformed. */
static zpp_status manifest_optional(cJSON *j, const char *name, zpp_ckpt_manifest *m) {
    cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    if (cfg && !cJSON_IsObject(cfg))
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s: config is not an object", name);
    if (data) {
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(data, "path");
        double tokens = 0;
        if (!cJSON_IsObject(data) || !(cJSON_IsNull(path) || cJSON_IsString(path)) ||
            !get_str(data, "kind", m->data_kind, sizeof m->data_kind) ||
            !get_num(data, "tokens", 0, 9007199254740992.0, &tokens))
            return zpp_error(ZPP_ERR_FORMAT,
                             "checkpoint manifest %s: data is not {\"path\", \"kind\", "
                             "\"tokens\"}",
                             name);
        m->has_data = 1;
        m->data_tokens = tokens;
        if (cJSON_IsString(path) && !(m->data_path = strdup(path->valuestring)))
            return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    }
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(j, "init_from");
    if (from && !cJSON_IsString(from))
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s: init_from is not a string",
                         name);
    if (from && !(m->init_from = strdup(from->valuestring)))
        return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    if (cfg && (!zpp_json_exact_numbers(cfg) || !(m->config = cJSON_PrintUnformatted(cfg))))
        return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    return ZPP_OK;
}

zpp_status zpp_ckpt_manifest_parse(const char *text, int format, const char *name,
                                   zpp_ckpt_manifest *m) {
    memset(m, 0, sizeof *m);
    int has_sum = 0;
    ZPP_CHECK(manifest_checksum(text, name, &has_sum));
    cJSON *j = cJSON_Parse(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s is malformed JSON", name);
    }
    zpp_status st = ZPP_OK;
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "engine");
    const cJSON *units = cJSON_GetObjectItemCaseSensitive(j, "units");
    zpp_engine_counters *c = &m->ctr;
    double seed = 0, scale = 0;
    if (!get_int(j, "format", 0, &m->format)) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s has no format: it was written by an older "
                       "zeropp (one file per rank, format 1), which this one does not read",
                       name);
    } else if (m->format < 2 || m->format > format) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s has format %d; this zeropp reads formats 2 to %d",
                       name, m->format, format);
    } else if (m->format >= 3 && !has_sum) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s is damaged: it does not end with its checksum",
                       name);
    } else if (!get_int(j, "step", 0, &m->step) || !get_int(j, "world_size", 1, &m->world_size) ||
               !get_int(j, "node_size", 1, &m->node_size) ||
               !get_int(j, "train_batch_size", 1, &m->train_batch_size) ||
               !get_str(j, "folder", m->folder, sizeof m->folder) ||
               !get_str(j, "mode", m->mode, sizeof m->mode) ||
               !get_str(j, "dtype", m->dtype, sizeof m->dtype) ||
               !get_num(j, "seed", 0, 9007199254740992.0, &seed) || !cJSON_IsObject(mo) ||
               !get_int(mo, "n_layer", 1, &m->model.n_layer) ||
               !get_int(mo, "n_head", 1, &m->model.n_head) ||
               !get_int(mo, "n_embd", 1, &m->model.n_embd) ||
               !get_int(mo, "seq_len", 1, &m->model.seq_len) ||
               !get_int(mo, "vocab_size", 1, &m->model.vocab_size) || !cJSON_IsObject(en) ||
               !get_int(en, "updates", 0, &c->updates) ||
               !get_int(en, "skipped_total", 0, &c->skipped_total) ||
               !get_num(en, "loss_scale", 1e-38, 3e38, &scale) ||
               !get_int(en, "scaler_hysteresis", 0, &c->scaler_hysteresis) ||
               !get_int(en, "scaler_iter", 0, &c->scaler_iter) ||
               !get_int(en, "scaler_last_overflow", -1, &c->scaler_last_overflow) ||
               !cJSON_IsArray(units) || cJSON_GetArraySize(units) < 1) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s is malformed (a key is missing, out of range or "
                       "has the wrong type)",
                       name);
    } else if (cJSON_GetObjectItemCaseSensitive(mo, "real_vocab_size") &&
               (!get_int(mo, "real_vocab_size", 1, &m->model.real_vocab_size) ||
                m->model.real_vocab_size > m->model.vocab_size)) {
        /* optional: manifests written before it have no padded vocabulary */
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s: model.real_vocab_size is not in 1..vocab_size",
                       name);
    } else if (cJSON_GetObjectItemCaseSensitive(j, "loco") &&
               !cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(j, "loco"))) {
        /* optional: manifests of runs without error feedback have none */
        st = zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s: loco is not true or false",
                       name);
    } else if (strchr(m->folder, '/') || !strcmp(m->folder, "..") || !strcmp(m->folder, ".") ||
               !m->folder[0]) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s names folder '%s', which is not a step folder "
                       "of its directory",
                       name, m->folder);
    } else if (c->updates > m->step || c->skipped_total > m->step) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint manifest %s counts %d updates and %d skips in %d steps",
                       name, c->updates, c->skipped_total, m->step);
    } else if ((st = manifest_family(mo, name, m)) != ZPP_OK) {
        /* the message is set */
    } else if ((st = manifest_optional(j, name, m)) != ZPP_OK) {
        /* the message is set */
    } else {
        c->step = m->step;
        c->loss_scale = (float)scale;
        m->loco = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "loco"));
        m->seed = (uint64_t)seed;
        m->n_units = cJSON_GetArraySize(units);
        m->numel = calloc((size_t)m->n_units, sizeof *m->numel);
        if (!m->numel) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        for (int u = 0; u < m->n_units && st == ZPP_OK; u++) {
            const cJSON *x = cJSON_GetArrayItem(units, u);
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble <= 9007199254740992.0))
                st = zpp_error(ZPP_ERR_FORMAT, "checkpoint manifest %s: bad size of unit %d",
                               name, u);
            else m->numel[u] = (size_t)x->valuedouble;
        }
        if (st == ZPP_OK && m->format >= 3) st = manifest_v3(j, name, m);
    }
    cJSON_Delete(j);
    if (st != ZPP_OK) zpp_ckpt_manifest_free(m);
    return st;
}

void zpp_ckpt_manifest_free(zpp_ckpt_manifest *m) {
    free(m->numel);
    cJSON_free(m->config);
    free(m->data_path);
    free(m->init_from);
    free(m->rank_sums);
    free(m->loco_sums);
    m->rank_sums = m->loco_sums = NULL;
    m->numel = NULL;
    m->config = NULL;
    m->data_path = m->init_from = NULL;
}
