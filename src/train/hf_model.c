/* train/hf_model.c — a Hugging Face Llama folder onto the llama units and
 * back (hf_model.h). */
#define _XOPEN_SOURCE 700 /* getpid, rename */
#include "train/hf_model.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "model/gpt2.h"

#define HF_PATH 4096

/* ---- The shape ------------------------------------------------------------------- */

int zpp_hf_is_model_dir(const char *path) {
    char p[HF_PATH];
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    snprintf(p, sizeof p, "%s/config.json", path);
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

zpp_status zpp_hf_apply_shape(const zpp_hf_config *hf, zpp_train_config *cfg) {
    if (hf->head_dim * hf->num_attention_heads != hf->hidden_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "config.json: head_dim %d is not hidden_size %d / num_attention_heads "
                         "%d; zeropp's llama takes the head dim n_embd / n_head",
                         hf->head_dim, hf->hidden_size, hf->num_attention_heads);
    cfg->model_family = ZPP_FAMILY_LLAMA;
    cfg->model.n_layer = hf->num_hidden_layers;
    cfg->model.n_head = hf->num_attention_heads;
    cfg->model.n_embd = hf->hidden_size;
    cfg->model.vocab_size = hf->vocab_size;
    cfg->model.real_vocab_size = hf->vocab_size;
    zpp_decoder_shape *x = &cfg->model_ext;
    x->n_kv_head = hf->num_key_value_heads;
    x->n_ffn = hf->intermediate_size;
    x->rope_theta = hf->rope_theta;
    x->norm_eps = hf->rms_norm_eps;
    x->untied_head = !hf->tie_word_embeddings;
    zpp_hf_biases(hf, &x->qkv_bias, &x->o_bias);
    cfg->hf_architecture = zpp_hf_config_arch(hf);
    cfg->hf_sliding_window = hf->sliding_window;
    const zpp_hf_rope_scaling *r = &hf->rope_scaling;
    x->rope_factor = r->llama3 ? r->factor : 0.0;
    x->rope_low_freq_factor = r->llama3 ? r->low_freq_factor : 0.0;
    x->rope_high_freq_factor = r->llama3 ? r->high_freq_factor : 0.0;
    x->rope_original_max_pos = r->llama3 ? r->original_max_position_embeddings : 0;
    return ZPP_OK;
}

zpp_status zpp_hf_check_shape(const zpp_hf_config *hf, const zpp_train_config *cfg,
                              const char *dir) {
    zpp_train_config want = *cfg;
    ZPP_CHECK(zpp_hf_apply_shape(hf, &want));
    if (cfg->model_family != ZPP_FAMILY_LLAMA)
        return zpp_error(ZPP_ERR_CONFIG,
                         "--init-from %s is a Hugging Face Llama, but 'model.family' is \"%s\"; "
                         "drop the key or set it to \"llama\"",
                         dir, zpp_model_family_name(cfg->model_family));
    /* the common fields, then the Llama knobs (family.h's one list) */
    const char *keys[4 + ZPP_DECODER_KNOBS] = {"model.n_layer", "model.n_head", "model.n_embd",
                                               "model.real_vocab_size"};
    double file[4 + ZPP_DECODER_KNOBS] = {want.model.n_layer, want.model.n_head,
                                          want.model.n_embd, hf->vocab_size};
    double run[4 + ZPP_DECODER_KNOBS] = {cfg->model.n_layer, cfg->model.n_head,
                                         cfg->model.n_embd, zpp_gpt2_real_vocab(&cfg->model)};
    zpp_decoder_shape_knobs(&want.model_ext, keys + 4, file + 4);
    zpp_decoder_shape_knobs(&cfg->model_ext, keys + 4, run + 4);
    for (int i = 0; i < 4 + ZPP_DECODER_KNOBS; i++)
        if (file[i] != run[i])
            return zpp_error(ZPP_ERR_CONFIG,
                             "'%s' is %.17g in the config but %.17g in %s/config.json, which "
                             "defines the model's shape; drop the key or set it to %.17g",
                             keys[i], run[i], file[i], dir, file[i]);
    if (cfg->hf_architecture != want.hf_architecture)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.hf_architecture' is \"%s\" in the config but %s/config.json "
                         "names %s; drop the key or set it to \"%s\"",
                         zpp_hf_arch_name(cfg->hf_architecture), dir, hf->architecture,
                         hf->architecture);
    if (cfg->hf_sliding_window != hf->sliding_window)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.hf_sliding_window' is %d in the config but %d in %s/config.json; "
                         "drop the key",
                         cfg->hf_sliding_window, hf->sliding_window, dir);
    char what[HF_PATH + 16];
    snprintf(what, sizeof what, "%s/config.json", dir);
    ZPP_CHECK(zpp_hf_check_seq_len(hf, cfg->model.seq_len, what));
    if (cfg->model.vocab_size < hf->vocab_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "'model.vocab_size' %d is below the %d rows of %s's embedding; drop "
                         "the key or pad it to at least %d",
                         cfg->model.vocab_size, hf->vocab_size, dir, hf->vocab_size);
    return ZPP_OK;
}

/* ---- The slots ------------------------------------------------------------------- */

static zpp_hf_slot slot(const char *name, int unit, size_t offset, int64_t rows, int64_t cols) {
    zpp_hf_slot s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "%s", name);
    s.unit = unit, s.offset = offset;
    s.ndim = cols ? 2 : 1;
    s.shape[0] = rows, s.shape[1] = cols;
    s.numel = (size_t)rows * (size_t)(cols ? cols : 1);
    return s;
}

/* Layer N's slots (unit N + 1) into s, in transformers' module order:
 * self_attn q, k, v, o, mlp gate, up, down, then the two norms. With
 * all_four (Llama's attention_bias) a bias the model lacks beside one it
 * has is a zero tensor. */
static size_t layer_slots(const zpp_llama_config *c, const zpp_llama_layout *l, int N,
                          int all_four, zpp_hf_slot *s) {
    const int64_t C = c->n_embd, Ck = (int64_t)c->n_kv_head * (C / c->n_head), F = c->n_ffn;
    const int u = N + 1;
    char p[64], name[96];
    snprintf(p, sizeof p, "model.layers.%d.", N);
    size_t n = 0;
#define SLOT(suffix, off, rows, cols) \
    (snprintf(name, sizeof name, "%s%s", p, suffix), s[n++] = slot(name, u, off, rows, cols))
    const int any = all_four && (c->qkv_bias || c->o_bias);
    const int qb = c->qkv_bias || any, ob = c->o_bias || any;
#define BIAS(suffix, have, off, rows) \
    (SLOT(suffix, (have) ? (off) : 0, rows, 0), s[n - 1].zero_tensor = !(have))
    SLOT("self_attn.q_proj.weight", l->wqkv, C, C);
    if (qb) BIAS("self_attn.q_proj.bias", c->qkv_bias, l->bqkv, C);
    SLOT("self_attn.k_proj.weight", l->wqkv + (size_t)(C * C), Ck, C);
    if (qb) BIAS("self_attn.k_proj.bias", c->qkv_bias, l->bqkv + (size_t)C, Ck);
    SLOT("self_attn.v_proj.weight", l->wqkv + (size_t)((C + Ck) * C), Ck, C);
    if (qb) BIAS("self_attn.v_proj.bias", c->qkv_bias, l->bqkv + (size_t)(C + Ck), Ck);
    SLOT("self_attn.o_proj.weight", l->wo, C, C);
    if (ob) BIAS("self_attn.o_proj.bias", c->o_bias, l->bo, C);
#undef BIAS
    SLOT("mlp.gate_proj.weight", l->wgu, F, C);
    SLOT("mlp.up_proj.weight", l->wgu + (size_t)(F * C), F, C);
    SLOT("mlp.down_proj.weight", l->wdown, C, F);
    SLOT("input_layernorm.weight", l->norm1, C, 0);
    SLOT("post_attention_layernorm.weight", l->norm2, C, 0);
#undef SLOT
    return n;
}

zpp_status zpp_hf_slots(const zpp_llama_config *c, int all_four, zpp_hf_slot **slots_p,
                        size_t *n_p) {
    zpp_llama_layout l;
    zpp_llama_layout_make(c, &l);
    const size_t per_layer = 13, n_max = 3 + per_layer * (size_t)c->n_layer; /* with biases */
    zpp_hf_slot *s = calloc(n_max, sizeof *s);
    if (!s) return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
    size_t n = 0;
    s[n++] = slot("model.embed_tokens.weight", 0, l.wte, c->real_vocab_size, c->n_embd);
    for (int N = 0; N < c->n_layer; N++) n += layer_slots(c, &l, N, all_four, s + n);
    s[n++] = slot("model.norm.weight", 0, l.norm_f, c->n_embd, 0);
    if (c->untied_head) s[n++] = slot("lm_head.weight", 0, l.head, c->real_vocab_size, c->n_embd);
    *slots_p = s, *n_p = n;
    return ZPP_OK;
}

/* ---- Reading a folder ------------------------------------------------------------ */

struct zpp_hf_model {
    char *dir;
    zpp_hf_config hf;
    zpp_llama_config cfg; /* of config.json alone: vocab_size = the file's rows */
    int all_four;         /* Llama's attention_bias naming (zpp_hf_slots) */
    zpp_hf_files fs;
    zpp_hf_slot *slots;
    size_t n_slots;
    zpp_st_file **slot_file; /* where each slot's tensor is */
    const zpp_st_tensor **slot_tensor;
};

const zpp_hf_config *zpp_hf_model_config(const zpp_hf_model *m) { return &m->hf; }

const char *zpp_hf_model_dtype(const zpp_hf_model *m) {
    return m->n_slots ? zpp_st_dtype_name(m->slot_tensor[0]->dtype) : "";
}

void zpp_hf_model_close(zpp_hf_model *m) {
    if (!m) return;
    zpp_hf_files_close(&m->fs);
    free(m->slots);
    free(m->slot_file);
    free(m->slot_tensor);
    free(m->dir);
    free(m);
}

void zpp_hf_files_close(zpp_hf_files *f) {
    for (size_t i = 0; i < f->n; i++) zpp_st_close(f->files[i]);
    free(f->files);
    f->files = NULL, f->n = 0;
}

zpp_status zpp_hf_files_open(const char *dir, zpp_hf_files *f) {
    memset(f, 0, sizeof *f);
    char path[HF_PATH];
    snprintf(path, sizeof path, "%s/%s", dir, ZPP_ST_INDEX_NAME);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(path, sizeof path, "%s/%s", dir, ZPP_ST_SINGLE_NAME);
        if (!(f->files = calloc(1, sizeof *f->files)))
            return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
        zpp_status st = zpp_st_open(path, &f->files[0]);
        if (st == ZPP_OK) f->n = 1;
        else zpp_hf_files_close(f);
        return st;
    }
    zpp_st_index *x = NULL;
    ZPP_CHECK(zpp_st_index_open(path, &x));
    zpp_status st = ZPP_OK;
    const size_t nf = zpp_st_index_files(x);
    if (!(f->files = calloc(nf + 1, sizeof *f->files)))
        st = zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
    for (size_t i = 0; i < nf && st == ZPP_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, zpp_st_index_file(x, i));
        st = zpp_st_open(path, &f->files[i]);
        if (st == ZPP_OK) f->n++;
    }
    /* every tensor of a shard is in the index under that shard */
    for (size_t i = 0; i < f->n && st == ZPP_OK; i++)
        for (size_t k = 0; k < zpp_st_count(f->files[i]) && st == ZPP_OK; k++) {
            const char *name = zpp_st_tensor_at(f->files[i], k)->name;
            const char *in = zpp_st_index_find(x, name);
            if (!in || strcmp(in, zpp_st_index_file(x, i)))
                st = zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is in %s, but the index %s",
                               dir, name, zpp_st_index_file(x, i),
                               in ? "names another file" : "does not list it");
        }
    zpp_st_index_close(x);
    if (st != ZPP_OK) zpp_hf_files_close(f);
    return st;
}

/* Names a folder may hold that map to nothing (hf_model.h). */
static int ignored_name(const zpp_hf_model *m, const char *name) {
    const char *tail = ".self_attn.rotary_emb.inv_freq";
    const size_t n = strlen(name), k = strlen(tail);
    if (n > k && !strcmp(name + n - k, tail) && !strncmp(name, "model.layers.", 13)) return 1;
    return !m->cfg.untied_head && !strcmp(name, "lm_head.weight");
}

/* The slot called `name`, or -1: a scan, quadratic over all tensors, but a
 * 70B Llama has 723 of them, a few hundred thousand comparisons at open. */
static long find_slot(const zpp_hf_model *m, const char *name) {
    for (size_t i = 0; i < m->n_slots; i++)
        if (!strcmp(m->slots[i].name, name)) return (long)i;
    return -1;
}

/* "[a]" or "[a, b]" into out. */
static void shape_text(char *out, size_t cap, int ndim, const int64_t *shape) {
    if (ndim > 1) snprintf(out, cap, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    else snprintf(out, cap, "[%lld]", ndim ? (long long)shape[0] : 1LL);
}

/* One tensor of the files against its slot: shape and dtype. */
static zpp_status check_tensor(const zpp_hf_slot *s, const zpp_st_file *f,
                               const zpp_st_tensor *t) {
    if (t->dtype != ZPP_ST_BF16 && t->dtype != ZPP_ST_F16 && t->dtype != ZPP_ST_F32)
        return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is %s; zeropp reads BF16, F16 or F32",
                         zpp_st_path(f), t->name, zpp_st_dtype_name(t->dtype));
    int same = t->ndim == s->ndim;
    for (int d = 0; same && d < s->ndim; d++) same = t->shape[d] == s->shape[d];
    if (same) return ZPP_OK;
    char has[64], needs[64];
    shape_text(has, sizeof has, t->ndim, t->shape);
    shape_text(needs, sizeof needs, s->ndim, s->shape);
    return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' has shape %s, config.json's model needs %s",
                     zpp_st_path(f), t->name, has, needs);
}

/* Every tensor of every file is a slot (or ignored), every slot is found. */
static zpp_status match_tensors(zpp_hf_model *m) {
    for (size_t i = 0; i < m->fs.n; i++)
        for (size_t k = 0; k < zpp_st_count(m->fs.files[i]); k++) {
            const zpp_st_tensor *t = zpp_st_tensor_at(m->fs.files[i], k);
            const long j = find_slot(m, t->name);
            if (j < 0 && ignored_name(m, t->name)) continue;
            if (j < 0)
                return zpp_error(ZPP_ERR_FORMAT,
                                 "%s: tensor '%s' is no part of a %s of this config.json "
                                 "(hf_model.h lists the names zeropp maps)",
                                 zpp_st_path(m->fs.files[i]), t->name, m->hf.architecture);
            if (m->slot_tensor[j])
                return zpp_error(ZPP_ERR_FORMAT, "%s: tensor '%s' is in two files",
                                 m->dir, t->name);
            ZPP_CHECK(check_tensor(&m->slots[j], m->fs.files[i], t));
            m->slot_file[j] = m->fs.files[i], m->slot_tensor[j] = t;
        }
    for (size_t j = 0; j < m->n_slots; j++)
        if (!m->slot_tensor[j])
            return zpp_error(ZPP_ERR_FORMAT,
                             "%s: tensor '%s' is missing; config.json's model needs it", m->dir,
                             m->slots[j].name);
    return ZPP_OK;
}

/* The zero tensors (zpp_hf_slots' all_four): the model has no room for
 * them, so only zeros map onto it exactly. config.json's own model has
 * all four biases or none, so none arise from an import today; a caller
 * whose run differs would meet them here. */
static zpp_status check_zero_tensors(zpp_hf_model *m) {
    float *x = NULL;
    zpp_status st = ZPP_OK;
    for (size_t j = 0; j < m->n_slots && st == ZPP_OK; j++) {
        if (!m->slots[j].zero_tensor) continue;
        const size_t n = m->slots[j].numel;
        if (!x && !(x = malloc((size_t)m->cfg.n_embd * sizeof *x))) /* a bias: <= C */
            return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
        st = zpp_st_read_f32(m->slot_file[j], m->slot_tensor[j], 0, n, x);
        for (size_t i = 0; i < n && st == ZPP_OK; i++)
            if (x[i] != 0.0f)
                st = zpp_error(ZPP_ERR_FORMAT,
                               "%s: tensor '%s' has a nonzero element %zu (%g), but the model "
                               "has no such bias",
                               m->dir, m->slots[j].name, i, (double)x[i]);
    }
    free(x);
    return st;
}

zpp_status zpp_hf_model_open(const char *dir, zpp_hf_model **model_p) {
    if (!dir || !model_p) return zpp_error(ZPP_ERR_INVALID, "zpp_hf_model_open: NULL argument");
    zpp_hf_model *m = calloc(1, sizeof *m);
    char path[HF_PATH];
    zpp_status st = ZPP_OK;
    if (!m || !(m->dir = strdup(dir))) {
        free(m);
        return zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    zpp_train_config tc;
    ZPP_CHECK_GOTO(zpp_hf_config_read(path, &m->hf), st, out);
    ZPP_CHECK_GOTO(zpp_train_config_defaults(&tc), st, out);
    ZPP_CHECK_GOTO(zpp_hf_apply_shape(&m->hf, &tc), st, out);
    zpp_decoder_shape shape = tc.model_ext;
    shape.n_layer = tc.model.n_layer, shape.n_head = tc.model.n_head;
    shape.n_embd = tc.model.n_embd, shape.seq_len = 1;
    shape.vocab_size = shape.real_vocab_size = tc.model.vocab_size;
    ZPP_CHECK_GOTO(zpp_llama_config_of_shape(&shape, &m->cfg), st, out);
    m->all_four = zpp_hf_config_arch(&m->hf) == ZPP_HF_LLAMA;
    ZPP_CHECK_GOTO(zpp_hf_slots(&m->cfg, m->all_four, &m->slots, &m->n_slots), st, out);
    m->slot_file = calloc(m->n_slots, sizeof *m->slot_file);
    m->slot_tensor = calloc(m->n_slots, sizeof *m->slot_tensor);
    if (!m->slot_file || !m->slot_tensor) {
        st = zpp_error(ZPP_ERR_NOMEM, "hf: out of memory");
        goto out;
    }
    ZPP_CHECK_GOTO(zpp_hf_files_open(m->dir, &m->fs), st, out);
    ZPP_CHECK_GOTO(match_tensors(m), st, out);
    ZPP_CHECK_GOTO(check_zero_tensors(m), st, out);
    *model_p = m;
out:
    if (st != ZPP_OK) zpp_hf_model_close(m);
    return st;
}

zpp_status zpp_hf_model_read_unit(zpp_hf_model *m, const zpp_llama_config *cfg, int unit,
                                  size_t begin, size_t count, float *out) {
    zpp_llama_layout l;
    zpp_llama_layout_make(cfg, &l);
    const size_t numel = unit == 0 ? l.embed_numel : l.block_numel;
    if (unit < 0 || unit > cfg->n_layer || begin > numel || count > numel - begin)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_model_read_unit: unit %d [%zu, +%zu) is out "
                                          "of range", unit, begin, count);
    if (cfg->n_layer != m->cfg.n_layer || cfg->n_embd != m->cfg.n_embd ||
        cfg->real_vocab_size != m->cfg.real_vocab_size || cfg->untied_head != m->cfg.untied_head ||
        cfg->qkv_bias != m->cfg.qkv_bias || cfg->o_bias != m->cfg.o_bias ||
        cfg->n_ffn != m->cfg.n_ffn ||
        cfg->n_kv_head != m->cfg.n_kv_head)
        return zpp_error(ZPP_ERR_CONFIG, "%s: the run's model is not config.json's", m->dir);
    /* padded rows (and anything no tensor covers) start at zero */
    memset(out, 0, count * sizeof *out);
    zpp_hf_slot *slots = NULL;
    size_t n = 0;
    ZPP_CHECK(zpp_hf_slots(cfg, m->all_four, &slots, &n)); /* the run's offsets: its vocab_size */
    zpp_status st = ZPP_OK;
    for (size_t j = 0; j < n && st == ZPP_OK; j++) {
        const zpp_hf_slot *s = &slots[j];
        if (s->unit != unit || s->zero_tensor) continue;
        const size_t lo = s->offset > begin ? s->offset : begin;
        const size_t hi_s = s->offset + s->numel, hi_r = begin + count;
        const size_t hi = hi_s < hi_r ? hi_s : hi_r;
        if (lo >= hi) continue;
        /* the same order of names in both slot lists: j is m's slot j */
        st = zpp_st_read_f32(m->slot_file[j], m->slot_tensor[j], lo - s->offset, hi - lo,
                             out + (lo - begin));
    }
    free(slots);
    return st;
}

/* ---- Writing a folder ------------------------------------------------------------ */

zpp_status zpp_hf_config_of_llama(const zpp_llama_config *c, zpp_hf_arch arch,
                                  int max_position_embeddings, zpp_hf_config *hf) {
    /* Mistral names a llama without biases, Qwen2 one with q/k/v's only */
    const int fits = arch == ZPP_HF_LLAMA ||
                     (arch == ZPP_HF_MISTRAL && !c->qkv_bias && !c->o_bias) ||
                     (arch == ZPP_HF_QWEN2 && c->qkv_bias && !c->o_bias);
    if (!fits)
        return zpp_error(ZPP_ERR_CONFIG,
                         "export: a %s has %s, but this llama has qkv_bias %d and o_bias %d; "
                         "set model.hf_architecture to \"LlamaForCausalLM\" (its "
                         "attention_bias holds any biases)",
                         zpp_hf_arch_name(arch),
                         arch == ZPP_HF_MISTRAL ? "no biases" : "q/k/v biases and no o bias",
                         c->qkv_bias, c->o_bias);
    memset(hf, 0, sizeof *hf);
    snprintf(hf->architecture, sizeof hf->architecture, "%s", zpp_hf_arch_name(arch));
    hf->hidden_size = c->n_embd;
    hf->intermediate_size = c->n_ffn;
    hf->num_hidden_layers = c->n_layer;
    hf->num_attention_heads = c->n_head;
    hf->num_key_value_heads = c->n_kv_head;
    hf->head_dim = c->n_embd / c->n_head;
    hf->vocab_size = c->real_vocab_size;
    hf->max_position_embeddings = max_position_embeddings;
    hf->rms_norm_eps = c->norm_eps;
    hf->rope_theta = c->rope_theta;
    hf->rope_scaling.llama3 = c->rope_factor != 0.0;
    hf->rope_scaling.factor = c->rope_factor;
    hf->rope_scaling.low_freq_factor = c->rope_low_freq_factor;
    hf->rope_scaling.high_freq_factor = c->rope_high_freq_factor;
    hf->rope_scaling.original_max_position_embeddings = c->rope_original_max_pos;
    hf->tie_word_embeddings = !c->untied_head;
    hf->attention_bias = arch == ZPP_HF_LLAMA && (c->qkv_bias || c->o_bias);
    hf->torch_dtype = ZPP_FP32;
    hf->bos_token_id = -1;
    return ZPP_OK;
}

zpp_status zpp_hf_fill(void *vctx, size_t offset, size_t n, void *out) {
    const zpp_hf_fill_ctx *c = vctx;
    const size_t es = zpp_dtype_size(c->dtype), first = offset / es, count = n / es;
    const size_t rows = (size_t)c->rows, cols = (size_t)(c->cols ? c->cols : 1);
    for (size_t i = 0; i < count; i++) {
        const size_t e = first + i, r = e / cols, k = e % cols;
        const float v = !c->x ? 0.0f : c->transposed ? c->x[k * rows + r] : c->x[e];
        zpp_store_f32(out, c->dtype, i, v);
    }
    return ZPP_OK;
}

/* Removes the files of folder `dir` (written by this process) and it. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    char p[HF_PATH + 256]; /* a d_name is at most 255 bytes */
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* The sources of every slot, their fills in ctx. */
static zpp_status export_sources(const zpp_llama_config *cfg, int all_four,
                                 const float *const *units, zpp_dtype dtype,
                                 zpp_st_source **src_p, zpp_hf_fill_ctx **ctx_p, size_t *n_p) {
    zpp_hf_slot *s = NULL;
    size_t n = 0;
    ZPP_CHECK(zpp_hf_slots(cfg, all_four, &s, &n));
    zpp_st_source *src = calloc(n, sizeof *src);
    zpp_hf_fill_ctx *ctx = calloc(n, sizeof *ctx);
    char *names = malloc(n * sizeof s->name);
    if (!src || !ctx || !names) {
        free(s), free(src), free(ctx), free(names);
        return zpp_error(ZPP_ERR_NOMEM, "hf export: out of memory");
    }
    const zpp_st_dtype sd = dtype == ZPP_BF16 ? ZPP_ST_BF16 : dtype == ZPP_FP16 ? ZPP_ST_F16
                                                                                : ZPP_ST_F32;
    for (size_t j = 0; j < n; j++) {
        char *name = names + j * sizeof s->name; /* freed with src[0].name */
        memcpy(name, s[j].name, sizeof s->name);
        ctx[j] = (zpp_hf_fill_ctx){s[j].zero_tensor ? NULL : units[s[j].unit] + s[j].offset,
                                   s[j].shape[0], s[j].shape[1], 0, dtype};
        src[j] = (zpp_st_source){.name = name, .dtype = sd, .ndim = s[j].ndim, .fill = zpp_hf_fill,
                                 .ctx = &ctx[j]};
        src[j].shape[0] = s[j].shape[0], src[j].shape[1] = s[j].shape[1];
        if (dtype == ZPP_FP32 && ctx[j].x) src[j].data = ctx[j].x; /* as held: no copy */
    }
    free(s);
    *src_p = src, *ctx_p = ctx, *n_p = n;
    return ZPP_OK;
}

zpp_status zpp_hf_write_folder(const char *dir, zpp_hf_config_writer write_config, void *arg,
                               const zpp_st_source *src, size_t n,
                               const zpp_hf_export_opts *opts, int *shards_p) {
    if (!dir || !write_config || !src || !opts || strlen(dir) > HF_PATH - 64)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_write_folder: NULL argument or a path too "
                                          "long");
    for (int k = 0; k < opts->n_files; k++) {
        const char *name = opts->files[k].name;
        if (strchr(name, '/') || !strncmp(name, "model", 5) || !strcmp(name, "config.json"))
            return zpp_error(ZPP_ERR_INVALID, "export: cannot copy a file named %s in", name);
    }
    struct stat sb;
    if (stat(dir, &sb) == 0)
        return zpp_error(ZPP_ERR_IO, "export: %s exists; give a new folder (the export writes "
                                     "it whole, or not at all)", dir);
    char tmp[HF_PATH], path[HF_PATH + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    if (mkdir(tmp, 0777) != 0)
        return zpp_error(ZPP_ERR_IO, "export: cannot create %s: %s", tmp, strerror(errno));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    zpp_status st = write_config(path, arg);
    if (st == ZPP_OK) st = zpp_st_write_dir(tmp, src, n, opts->max_shard_bytes, shards_p);
    for (int k = 0; st == ZPP_OK && k < opts->n_files; k++) {
        snprintf(path, sizeof path, "%s/%s", tmp, opts->files[k].name);
        st = zpp_copy_file(opts->files[k].src, path, "file");
    }
    if (st == ZPP_OK && rename(tmp, dir) != 0)
        st = zpp_error(ZPP_ERR_IO, "export: cannot rename %s to %s: %s", tmp, dir,
                       strerror(errno));
    if (st != ZPP_OK) remove_dir(tmp);
    return st;
}

/* config.json of a llama export: opts->config_from's, or written from hf. */
typedef struct llama_config_out {
    const zpp_hf_config *hf;
    const zpp_hf_export_opts *opts;
} llama_config_out;

static zpp_status write_llama_config(const char *path, void *arg) {
    const llama_config_out *o = arg;
    if (o->opts->config_from)
        return zpp_hf_config_write_like(path, o->opts->config_from, o->opts->dtype);
    zpp_hf_config c = *o->hf;
    c.torch_dtype = o->opts->dtype;
    return zpp_hf_config_write(path, &c);
}

zpp_status zpp_hf_export(const char *dir, const zpp_llama_config *cfg, const zpp_hf_config *hf,
                         const float *const *units, const zpp_hf_export_opts *opts,
                         int *shards_p) {
    if (!dir || !cfg || !hf || !units || !opts)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_export: NULL argument");
    const zpp_dtype dtype = opts->dtype;
    if (dtype != ZPP_FP32 && dtype != ZPP_BF16 && dtype != ZPP_FP16)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_export: dtype %d is not fp32, bf16 or fp16",
                         (int)dtype);
    /* config.json's biases must be the model's: Llama's attention_bias any */
    int qkv_bias, o_bias;
    zpp_hf_biases(hf, &qkv_bias, &o_bias);
    const int same = zpp_hf_config_arch(hf) == ZPP_HF_LLAMA
                         ? hf->attention_bias == (cfg->qkv_bias || cfg->o_bias)
                         : qkv_bias == cfg->qkv_bias && o_bias == cfg->o_bias;
    if (!same)
        return zpp_error(ZPP_ERR_CONFIG, "export: config.json's %s has other biases than the "
                                         "model's (qkv_bias %d, o_bias %d)",
                         hf->architecture, cfg->qkv_bias, cfg->o_bias);
    zpp_st_source *src = NULL;
    zpp_hf_fill_ctx *ctx = NULL;
    size_t n = 0;
    ZPP_CHECK(export_sources(cfg, zpp_hf_config_arch(hf) == ZPP_HF_LLAMA, units, dtype, &src,
                             &ctx, &n));
    llama_config_out out = {hf, opts};
    const zpp_status st =
        zpp_hf_write_folder(dir, write_llama_config, &out, src, n, opts, shards_p);
    free((char *)src[0].name);
    free(src);
    free(ctx);
    return st;
}
