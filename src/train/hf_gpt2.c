/* train/hf_gpt2.c — see hf_gpt2.h. */
#include "train/hf_gpt2.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"

/* One tensor's elements from a unit: x[0, rows * cols) as held, or with
 * transposed set the [rows][cols] transpose of the [cols][rows] matrix x. */
typedef struct gpt2_fill {
    const float *x;
    int64_t rows, cols;
    int transposed;
    zpp_dtype dtype;
} gpt2_fill;

/* Bytes [offset, offset + n) of a tensor in the export dtype: fp32 as
 * held, bf16 and fp16 rounded to nearest even (core/dtype.h). */
static zpp_status fill_tensor(void *vctx, size_t offset, size_t n, void *out) {
    const gpt2_fill *f = vctx;
    const size_t es = zpp_dtype_size(f->dtype), first = offset / es, count = n / es;
    for (size_t i = 0; i < count; i++) {
        const size_t e = first + i, r = e / (size_t)f->cols, c = e % (size_t)f->cols;
        const float v = f->transposed ? f->x[c * (size_t)f->rows + r] : f->x[e];
        zpp_store_f32(out, f->dtype, i, v);
    }
    return ZPP_OK;
}

/* The tensors' names, sources and fills, built up one at a time. */
typedef struct gpt2_tensors {
    zpp_st_source *src;
    gpt2_fill *fill;
    char (*names)[64];
    size_t n;
    zpp_dtype dtype;
} gpt2_tensors;

static void add(gpt2_tensors *t, const char *name, const float *x, int64_t rows, int64_t cols,
                int transposed) {
    const size_t k = t->n++;
    snprintf(t->names[k], sizeof t->names[k], "%s", name);
    t->fill[k] = (gpt2_fill){x, rows, cols ? cols : 1, transposed, t->dtype};
    const zpp_st_dtype sd = t->dtype == ZPP_BF16   ? ZPP_ST_BF16
                            : t->dtype == ZPP_FP16 ? ZPP_ST_F16
                                                   : ZPP_ST_F32;
    t->src[k] = (zpp_st_source){.name = t->names[k], .dtype = sd, .ndim = cols ? 2 : 1,
                                .fill = fill_tensor, .ctx = &t->fill[k]};
    t->src[k].shape[0] = rows, t->src[k].shape[1] = cols;
    if (t->dtype == ZPP_FP32 && !transposed) t->src[k].data = x; /* as held: no copy */
}

/* Every tensor of the folder, in GPT2LMHeadModel's state_dict order. */
static void gpt2_sources(const zpp_gpt2_config *cfg, const float *const *units,
                         gpt2_tensors *t) {
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(cfg, &l);
    const int64_t C = cfg->n_embd;
    const float *e = units[0];
    add(t, "transformer.wte.weight", e + l.wte, zpp_gpt2_real_vocab(cfg), C, 0);
    add(t, "transformer.wpe.weight", e + l.wpe, cfg->seq_len, C, 0);
    for (int b = 0; b < cfg->n_layer; b++) {
        const float *u = units[b + 1];
        char n[64];
#define BLOCK(suffix, off, rows, cols, tr)                                  \
    (snprintf(n, sizeof n, "transformer.h.%d.%s", b, suffix),               \
     add(t, n, u + l.off, rows, cols, tr))
        BLOCK("ln_1.weight", ln1_w, C, 0, 0);
        BLOCK("ln_1.bias", ln1_b, C, 0, 0);
        BLOCK("attn.c_attn.weight", qkv_w, C, 3 * C, 1);
        BLOCK("attn.c_attn.bias", qkv_b, 3 * C, 0, 0);
        BLOCK("attn.c_proj.weight", proj_w, C, C, 1);
        BLOCK("attn.c_proj.bias", proj_b, C, 0, 0);
        BLOCK("ln_2.weight", ln2_w, C, 0, 0);
        BLOCK("ln_2.bias", ln2_b, C, 0, 0);
        BLOCK("mlp.c_fc.weight", fc_w, C, 4 * C, 1);
        BLOCK("mlp.c_fc.bias", fc_b, 4 * C, 0, 0);
        BLOCK("mlp.c_proj.weight", fc2_w, 4 * C, C, 1);
        BLOCK("mlp.c_proj.bias", fc2_b, C, 0, 0);
#undef BLOCK
    }
    add(t, "transformer.ln_f.weight", e + l.lnf_w, C, 0, 0);
    add(t, "transformer.ln_f.bias", e + l.lnf_b, C, 0, 0);
}

/* What config.json is written from. */
typedef struct gpt2_config_out {
    const zpp_gpt2_config *cfg;
    zpp_dtype dtype;
} gpt2_config_out;

static zpp_status write_gpt2_config(const char *path, void *arg) {
    const gpt2_config_out *o = arg;
    const zpp_gpt2_config *c = o->cfg;
    static const char *const dtype_names[] = {[ZPP_FP32] = "float32", [ZPP_BF16] = "bfloat16",
                                              [ZPP_FP16] = "float16"};
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
    ok = ok && cJSON_AddStringToObject(j, "torch_dtype", dtype_names[o->dtype]);
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
    const size_t n = 4 + 12 * (size_t)cfg->n_layer;
    gpt2_tensors t = {calloc(n, sizeof *t.src), calloc(n, sizeof *t.fill),
                      calloc(n, sizeof *t.names), 0, opts->dtype};
    zpp_status st = ZPP_OK;
    if (!t.src || !t.fill || !t.names) st = zpp_error(ZPP_ERR_NOMEM, "hf export: out of memory");
    if (st == ZPP_OK) {
        gpt2_sources(cfg, units, &t);
        gpt2_config_out out = {cfg, opts->dtype};
        st = zpp_hf_write_folder(dir, write_gpt2_config, &out, t.src, t.n, opts, shards_p);
    }
    free(t.src), free(t.fill), free(t.names);
    return st;
}
