/* train/hf_gpt2.c — see hf_gpt2.h. */
#include "train/hf_gpt2.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"

/* ---- The tensors and their places ------------------------------------------------ */

/* One tensor of the folder: its name after "transformer.", and where it
 * is in the units: elements [offset, offset + rows * cols) of `unit`,
 * [rows][cols] as the folder holds it, or (transposed) its [cols][rows]
 * transpose (hf_gpt2.h). cols 0: a vector. */
typedef struct gpt2_slot {
    char name[48];
    int unit;
    size_t offset;
    int64_t rows, cols;
    int transposed;
} gpt2_slot;

enum { SLOTS_PER_BLOCK = 12 };
static size_t gpt2_slot_count(const zpp_gpt2_config *cfg) {
    return 4 + SLOTS_PER_BLOCK * (size_t)cfg->n_layer;
}

/* Every slot of cfg's model (its layout: a padded vocabulary moves no
 * offset but the head's, which a tied GPT-2 has not), in GPT2LMHeadModel's
 * state_dict order, into s[0, gpt2_slot_count). */
static void gpt2_slots(const zpp_gpt2_config *cfg, gpt2_slot *s) {
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(cfg, &l);
    const int64_t C = cfg->n_embd;
    size_t n = 0;
#define SLOT(u, nm, off, r, c, tr) (s[n++] = (gpt2_slot){"", u, off, r, c, tr}, \
                                    snprintf(s[n - 1].name, sizeof s->name, "%s", nm))
    SLOT(0, "wte.weight", l.wte, zpp_gpt2_real_vocab(cfg), C, 0);
    SLOT(0, "wpe.weight", l.wpe, cfg->seq_len, C, 0);
    for (int b = 0; b < cfg->n_layer; b++) {
        static const struct {
            const char *suffix;
            int transposed;
        } block[SLOTS_PER_BLOCK] = {
            {"ln_1.weight", 0},       {"ln_1.bias", 0},       {"attn.c_attn.weight", 1},
            {"attn.c_attn.bias", 0},  {"attn.c_proj.weight", 1}, {"attn.c_proj.bias", 0},
            {"ln_2.weight", 0},       {"ln_2.bias", 0},       {"mlp.c_fc.weight", 1},
            {"mlp.c_fc.bias", 0},     {"mlp.c_proj.weight", 1}, {"mlp.c_proj.bias", 0}};
        /* each one's offset in the block and HF shape, in the order above */
        const size_t off[SLOTS_PER_BLOCK] = {l.ln1_w, l.ln1_b, l.qkv_w, l.qkv_b,
                                             l.proj_w, l.proj_b, l.ln2_w, l.ln2_b,
                                             l.fc_w, l.fc_b, l.fc2_w, l.fc2_b};
        const int64_t rows[SLOTS_PER_BLOCK] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
        const int64_t cols[SLOTS_PER_BLOCK] = {0, 0, 3 * C, 0, C, 0, 0, 0, 4 * C, 0, C, 0};
        for (int k = 0; k < SLOTS_PER_BLOCK; k++) {
            char nm[48];
            snprintf(nm, sizeof nm, "h.%d.%s", b, block[k].suffix);
            SLOT(b + 1, nm, off[k], rows[k], cols[k], block[k].transposed);
        }
    }
    SLOT(0, "ln_f.weight", l.lnf_w, C, 0, 0);
    SLOT(0, "ln_f.bias", l.lnf_b, C, 0, 0);
#undef SLOT
}

/* ---- Out ---------------------------------------------------------------------- */

/* The tensors' names, sources and fills. */
typedef struct gpt2_tensors {
    zpp_st_source *src;
    zpp_hf_fill_ctx *fill;
    char (*names)[64];
    size_t n;
    zpp_dtype dtype;
} gpt2_tensors;

/* Every slot as a source, its name with the "transformer." prefix. */
static void gpt2_sources(const zpp_gpt2_config *cfg, const float *const *units,
                         const gpt2_slot *slots, gpt2_tensors *t) {
    const zpp_st_dtype sd = t->dtype == ZPP_BF16   ? ZPP_ST_BF16
                            : t->dtype == ZPP_FP16 ? ZPP_ST_F16
                                                   : ZPP_ST_F32;
    t->n = gpt2_slot_count(cfg);
    for (size_t k = 0; k < t->n; k++) {
        const gpt2_slot *s = &slots[k];
        const float *x = units[s->unit] + s->offset;
        snprintf(t->names[k], sizeof t->names[k], "transformer.%s", s->name);
        t->fill[k] = (zpp_hf_fill_ctx){x, s->rows, s->cols, s->transposed, t->dtype};
        t->src[k] = (zpp_st_source){.name = t->names[k], .dtype = sd, .ndim = s->cols ? 2 : 1,
                                    .fill = zpp_hf_fill, .ctx = &t->fill[k]};
        t->src[k].shape[0] = s->rows, t->src[k].shape[1] = s->cols;
        if (t->dtype == ZPP_FP32 && !s->transposed) t->src[k].data = x; /* as held */
    }
}

/* What config.json is written from. */
typedef struct gpt2_config_out {
    const zpp_gpt2_config *cfg;
    zpp_dtype dtype;
} gpt2_config_out;

static zpp_status write_gpt2_config(const char *path, void *arg) {
    const gpt2_config_out *o = arg;
    const zpp_gpt2_config *c = o->cfg;
    const int V = zpp_gpt2_real_vocab(c);
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateStringArray((const char *const[]){"GPT2LMHeadModel"}, 1);
    int ok = j && arch && cJSON_AddItemToObject(j, "architectures", arch);
    if (!ok) cJSON_Delete(arch);
    ok = ok && cJSON_AddStringToObject(j, "model_type", "gpt2") &&
         cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    const struct {
        const char *key;
        int v;
    } ints[] = {{"n_layer", c->n_layer},    {"n_head", c->n_head},  {"n_embd", c->n_embd},
                {"n_positions", c->seq_len}, {"n_ctx", c->seq_len}, {"vocab_size", V}};
    for (size_t k = 0; ok && k < sizeof ints / sizeof *ints; k++)
        ok = cJSON_AddNumberToObject(j, ints[k].key, ints[k].v) != NULL;
    ok = ok && cJSON_AddNullToObject(j, "n_inner") &&
         cJSON_AddRawToObject(j, "layer_norm_epsilon", "1e-05") &&
         cJSON_AddRawToObject(j, "attn_pdrop", "0.0") &&
         cJSON_AddRawToObject(j, "embd_pdrop", "0.0") &&
         cJSON_AddRawToObject(j, "resid_pdrop", "0.0") &&
         cJSON_AddTrueToObject(j, "scale_attn_weights") &&
         cJSON_AddTrueToObject(j, "tie_word_embeddings");
    /* GPT-2's own vocabulary: its <|endoftext|> begins and ends a text */
    for (int k = 0; ok && k < 2; k++) {
        const char *key = k ? "eos_token_id" : "bos_token_id";
        ok = (V == 50257 ? cJSON_AddNumberToObject(j, key, 50256) : cJSON_AddNullToObject(j, key))
             != NULL;
    }
    ok = ok && cJSON_AddStringToObject(j, "torch_dtype", zpp_hf_torch_dtype_name(o->dtype));
    char *text = ok ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "config: out of memory");
    const zpp_status st = zpp_write_text_atomic(path, text, "config");
    cJSON_free(text);
    return st;
}

zpp_status zpp_hf_gpt2_export(const char *dir, const zpp_gpt2_config *cfg,
                              const float *const *units, const zpp_hf_export_opts *opts,
                              int *shards_p) {
    if (!dir || !cfg || !units || !opts)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_gpt2_export: NULL argument");
    if (opts->dtype != ZPP_FP32 && opts->dtype != ZPP_BF16 && opts->dtype != ZPP_FP16)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_gpt2_export: dtype %d is not fp32, bf16 or "
                                          "fp16",
                         (int)opts->dtype);
    if (opts->config_from)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_gpt2_export: a GPT-2's config.json is "
                                          "written from its shape (config_from is for a llama)");
    ZPP_CHECK(zpp_gpt2_config_check(cfg));
    const size_t n = gpt2_slot_count(cfg);
    gpt2_slot *slots = calloc(n, sizeof *slots);
    gpt2_tensors t = {calloc(n, sizeof *t.src), calloc(n, sizeof *t.fill),
                      calloc(n, sizeof *t.names), 0, opts->dtype};
    zpp_status st = ZPP_OK;
    if (!slots || !t.src || !t.fill || !t.names)
        st = zpp_error(ZPP_ERR_NOMEM, "hf export: out of memory");
    if (st == ZPP_OK) {
        gpt2_slots(cfg, slots);
        gpt2_sources(cfg, units, slots, &t);
        gpt2_config_out out = {cfg, opts->dtype};
        st = zpp_hf_write_folder(dir, write_gpt2_config, &out, t.src, t.n, opts, shards_p);
    }
    free(slots), free(t.src), free(t.fill), free(t.names);
    return st;
}

/* ---- In ----------------------------------------------------------------------- */

int zpp_hf_gpt2_is_dir(const char *dir) {
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    zpp_error_hold(); /* a probe: its errors are no one's */
    const int read = zpp_hf_config_text(path, &text) == ZPP_OK;
    zpp_error_release();
    if (!read) return 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const int gpt2 = cJSON_IsString(t) && !strcmp(t->valuestring, "gpt2");
    cJSON_Delete(j);
    return gpt2;
}

/* A config.json key: absent (*v untouched, 0), or a number (1); anything
 * else is refused naming it. */
static zpp_status get_number(const cJSON *j, const char *key, const char *path, double *v,
                             int *present) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, key);
    *present = x && !cJSON_IsNull(x);
    if (!*present) return ZPP_OK;
    if (!cJSON_IsNumber(x))
        return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"%s\" is not a number", path, key);
    *v = x->valuedouble;
    return ZPP_OK;
}

/* GPT2Config's keys that fix the shape, and those that would make another
 * model than zeropp's GPT-2 (hf_gpt2.h), from the parsed config.json j. */
static zpp_status parse_gpt2_config(const cJSON *j, const char *path, zpp_gpt2_config *cfg) {
    static const char *const sizes[] = {"n_layer", "n_head", "n_embd", "n_positions",
                                        "vocab_size"};
    double v[5] = {0};
    int present = 0;
    for (int k = 0; k < 5; k++) {
        ZPP_CHECK(get_number(j, sizes[k], path, &v[k], &present));
        if (!present || v[k] < 1 || v[k] > (1 << 30) || v[k] != (double)(int)v[k])
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': \"%s\" must be a positive integer",
                             path, sizes[k]);
    }
    memset(cfg, 0, sizeof *cfg);
    cfg->n_layer = (int)v[0], cfg->n_head = (int)v[1], cfg->n_embd = (int)v[2];
    cfg->seq_len = (int)v[3], cfg->vocab_size = cfg->real_vocab_size = (int)v[4];
    double x = 0;
    /* what would compute another model, refused naming the key */
    ZPP_CHECK(get_number(j, "n_ctx", path, &x, &present));
    if (present && x != v[3])
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': n_ctx %g differs from n_positions %g",
                         path, x, v[3]);
    ZPP_CHECK(get_number(j, "n_inner", path, &x, &present));
    if (present && x != 4 * v[2])
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': n_inner %g; zeropp's GPT-2 has an MLP "
                                         "of 4 n_embd (%g) or null",
                         path, x, 4 * v[2]);
    ZPP_CHECK(get_number(j, "layer_norm_epsilon", path, &x, &present));
    if (present && x != 1e-5)
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': layer_norm_epsilon %g; zeropp's GPT-2 "
                                         "normalizes with 1e-5",
                         path, x);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
    if (act && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "gelu_new") ||
                                         !strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': activation_function %s; zeropp's GPT-2 "
                                         "has GELU's tanh form (\"gelu_new\")",
                         path, cJSON_IsString(act) ? act->valuestring : "(not a string)");
    static const struct {
        const char *key;
        int want;
    } flags[] = {{"tie_word_embeddings", 1},
                 {"scale_attn_weights", 1},
                 {"scale_attn_by_inverse_layer_idx", 0},
                 {"add_cross_attention", 0}};
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, flags[k].key);
        if (f && !(cJSON_IsBool(f) && cJSON_IsTrue(f) == flags[k].want))
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': %s must be %s for zeropp's GPT-2",
                             path, flags[k].key, flags[k].want ? "true" : "false");
    }
    return zpp_gpt2_config_check(cfg);
}

zpp_status zpp_hf_gpt2_read_config(const char *dir, zpp_gpt2_config *cfg) {
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ZPP_CHECK(zpp_hf_config_text(path, &text));
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return zpp_error(ZPP_ERR_FORMAT, "config '%s' is not a JSON object", path);
    }
    const zpp_status st = parse_gpt2_config(j, path, cfg);
    cJSON_Delete(j);
    return st;
}

struct zpp_hf_gpt2 {
    char *dir;
    zpp_gpt2_config cfg; /* config.json's */
    zpp_hf_files fs;
    gpt2_slot *slots;
    size_t n_slots;
    zpp_st_file **slot_file; /* where each slot's tensor is */
    const zpp_st_tensor **slot_tensor;
};

const zpp_gpt2_config *zpp_hf_gpt2_config(const zpp_hf_gpt2 *m) { return &m->cfg; }

void zpp_hf_gpt2_close(zpp_hf_gpt2 *m) {
    if (!m) return;
    zpp_hf_files_close(&m->fs);
    free(m->slots), free(m->slot_file), free(m->slot_tensor), free(m->dir);
    free(m);
}

/* Names a GPT-2 folder may hold that map to nothing: the causal-mask
 * buffers older transformers saved, and the head tied to wte. */
static int ignored_gpt2_name(const char *name) {
    const size_t n = strlen(name);
    static const char *const tails[] = {".attn.bias", ".attn.masked_bias"};
    for (int k = 0; k < 2; k++) {
        const size_t t = strlen(tails[k]);
        if (n > t && !strcmp(name + n - t, tails[k]) && !strncmp(name, "h.", 2)) return 1;
    }
    return !strcmp(name, "lm_head.weight");
}

/* Every tensor is a slot (or ignored) of the right shape and dtype, every
 * slot is found. Names with and without "transformer." alike (GPT2Model
 * saves without, GPT2LMHeadModel with). */
static zpp_status match_gpt2_tensors(zpp_hf_gpt2 *m) {
    for (size_t i = 0; i < m->fs.n; i++)
        for (size_t k = 0; k < zpp_st_count(m->fs.files[i]); k++) {
            const zpp_st_tensor *t = zpp_st_tensor_at(m->fs.files[i], k);
            const char *name = strncmp(t->name, "transformer.", 12) ? t->name : t->name + 12;
            size_t j = 0;
            while (j < m->n_slots && strcmp(m->slots[j].name, name)) j++;
            if (j == m->n_slots && ignored_gpt2_name(name)) continue;
            if (j == m->n_slots)
                return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is no part of this config's "
                                                 "GPT-2 (hf_gpt2.h lists the names)",
                                 zpp_st_path(m->fs.files[i]), t->name);
            if (m->slot_tensor[j])
                return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is there twice", m->dir, name);
            const gpt2_slot *s = &m->slots[j];
            if (t->dtype != ZPP_ST_BF16 && t->dtype != ZPP_ST_F16 && t->dtype != ZPP_ST_F32)
                return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is %s; zeropp reads BF16, "
                                                 "F16 or F32",
                                 zpp_st_path(m->fs.files[i]), t->name,
                                 zpp_st_dtype_name(t->dtype));
            if (t->ndim != (s->cols ? 2 : 1) || t->shape[0] != s->rows ||
                (s->cols && t->shape[1] != s->cols))
                return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is not [%lld%s%lld] as "
                                                 "config.json's GPT-2 needs",
                                 zpp_st_path(m->fs.files[i]), t->name, (long long)s->rows,
                                 s->cols ? ", " : "", s->cols ? (long long)s->cols : 0LL);
            m->slot_file[j] = m->fs.files[i], m->slot_tensor[j] = t;
        }
    for (size_t j = 0; j < m->n_slots; j++)
        if (!m->slot_tensor[j])
            return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is missing; config.json's GPT-2 "
                                             "needs it",
                             m->dir, m->slots[j].name);
    return ZPP_OK;
}

zpp_status zpp_hf_gpt2_open(const char *dir, zpp_hf_gpt2 **model_p) {
    if (!dir || !model_p) return zpp_error(ZPP_ERR_INVALID, "zpp_hf_gpt2_open: NULL argument");
    zpp_hf_gpt2 *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
    }
    zpp_status st = zpp_hf_gpt2_read_config(dir, &m->cfg);
    if (st == ZPP_OK) {
        m->n_slots = gpt2_slot_count(&m->cfg);
        m->slots = calloc(m->n_slots, sizeof *m->slots);
        m->slot_file = calloc(m->n_slots, sizeof *m->slot_file);
        m->slot_tensor = calloc(m->n_slots, sizeof *m->slot_tensor);
        if (!m->slots || !m->slot_file || !m->slot_tensor)
            st = zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
    }
    if (st == ZPP_OK) {
        gpt2_slots(&m->cfg, m->slots);
        st = zpp_hf_files_open(dir, &m->fs);
    }
    if (st == ZPP_OK) st = match_gpt2_tensors(m);
    if (st != ZPP_OK) {
        zpp_hf_gpt2_close(m);
        return st;
    }
    *model_p = m;
    return ZPP_OK;
}

zpp_status zpp_hf_gpt2_check_model(const zpp_hf_gpt2 *m, const zpp_gpt2_config *run) {
    return zpp_hf_gpt2_check_shape(&m->cfg, m->dir, run);
}

zpp_status zpp_hf_gpt2_check_shape(const zpp_gpt2_config *f, const char *dir,
                                   const zpp_gpt2_config *run) {
    const struct {
        const char *key, *hf;
        int file, now;
    } k[] = {{"model.n_layer", "n_layer", f->n_layer, run->n_layer},
             {"model.n_head", "n_head", f->n_head, run->n_head},
             {"model.n_embd", "n_embd", f->n_embd, run->n_embd},
             {"model.seq_len", "n_positions", f->seq_len, run->seq_len},
             {"model.real_vocab_size", "vocab_size", f->vocab_size, zpp_gpt2_real_vocab(run)}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (k[i].file != k[i].now)
            return zpp_error(ZPP_ERR_CONFIG,
                             "%s is %d in the config but %s's config.json has %s %d; the "
                             "model's shape comes from the folder: drop the config's model "
                             "section or make it agree",
                             k[i].key, k[i].now, dir, k[i].hf, k[i].file);
    if (run->vocab_size < f->vocab_size)
        return zpp_error(ZPP_ERR_CONFIG, "'model.vocab_size' %d is below the %d rows of %s's "
                                         "embedding; drop the key or pad it to at least %d",
                         run->vocab_size, f->vocab_size, dir, f->vocab_size);
    return ZPP_OK;
}

/* Elements [lo, hi) of the unit, which slot s (tensor t of file f) covers,
 * into out[0, hi - lo): a contiguous read, or for a transposed slot the
 * whole tensor read once and gathered. */
static zpp_status read_slot(const gpt2_slot *s, zpp_st_file *f, const zpp_st_tensor *t,
                            size_t lo, size_t hi, float *out) {
    if (!s->transposed) return zpp_st_read_f32(f, t, lo - s->offset, hi - lo, out);
    const size_t R = (size_t)s->rows, Cc = (size_t)s->cols;
    float *all = malloc(R * Cc * sizeof *all);
    if (!all) return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory for '%s'", t->name);
    const zpp_status st = zpp_st_read_f32(f, t, 0, R * Cc, all);
    /* the unit holds [Cc][R]: its element o R + i is the folder's [i][o] */
    for (size_t e = lo; st == ZPP_OK && e < hi; e++) {
        const size_t o = (e - s->offset) / R, i = (e - s->offset) % R;
        out[e - lo] = all[i * Cc + o];
    }
    free(all);
    return st;
}

zpp_status zpp_hf_gpt2_read_unit(zpp_hf_gpt2 *m, const zpp_gpt2_config *run, int unit,
                                 size_t begin, size_t count, float *out) {
    ZPP_CHECK(zpp_hf_gpt2_check_model(m, run));
    const size_t numel = zpp_gpt2_unit_numel(run, unit);
    if (unit < 0 || unit > run->n_layer || begin > numel || count > numel - begin)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_gpt2_read_unit: unit %d [%zu, +%zu) is out "
                                          "of range", unit, begin, count);
    memset(out, 0, count * sizeof *out); /* padded vocabulary rows start at zero */
    gpt2_slot *slots = calloc(m->n_slots, sizeof *slots);
    if (!slots) return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
    gpt2_slots(run, slots); /* the run's offsets (its vocab_size); the same names in order */
    zpp_status st = ZPP_OK;
    for (size_t j = 0; j < m->n_slots && st == ZPP_OK; j++) {
        const gpt2_slot *s = &slots[j];
        const size_t n = (size_t)s->rows * (size_t)(s->cols ? s->cols : 1);
        const size_t lo = s->offset > begin ? s->offset : begin;
        const size_t hi = s->offset + n < begin + count ? s->offset + n : begin + count;
        if (s->unit != unit || lo >= hi) continue;
        st = read_slot(s, m->slot_file[j], m->slot_tensor[j], lo, hi, out + (lo - begin));
    }
    free(slots);
    return st;
}
