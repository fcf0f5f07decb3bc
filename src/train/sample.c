/* train/sample.c — the draw, the generation loop, a whole model on one
 * device, and tokens to text (sample.h has the math). */
#include "train/sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "model/gpt2.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/hf_gpt2.h"
#include "train/hf_model.h"
#include "train/llmc.h"

/* ---- The draw ----------------------------------------------------------------- */

zpp_status zpp_sample_opts_check(const zpp_sample_opts *o, int vocab) {
    if (!o) return zpp_error(ZPP_ERR_INVALID, "sample: options are NULL");
    if (!(o->temperature >= 0.0) || !isfinite(o->temperature))
        return zpp_error(ZPP_ERR_INVALID,
                         "sample: temperature %g is not a number >= 0; use 0 for the most likely "
                         "token, 1 for the model's distribution",
                         o->temperature);
    if (o->top_k < 0 || o->top_k > vocab)
        return zpp_error(ZPP_ERR_INVALID,
                         "sample: top-k %d is outside 1..%d (the vocabulary), or 0 for all of it",
                         o->top_k, vocab);
    return ZPP_OK;
}

double zpp_sample_uniform(uint64_t seed, uint64_t k) {
    uint64_t state = zpp_mix64(seed ^ ZPP_SAMPLE_STREAM) + k * ZPP_GOLDEN64;
    return (double)(zpp_splitmix64(&state) >> 11) * 0x1.0p-53;
}

typedef struct logit_at {
    float l;
    int i;
} logit_at;

/* Larger logit first; among equals the lower index. */
static int logit_desc(const void *a, const void *b) {
    const logit_at *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

zpp_status zpp_sample_pick(const float *logits, int vocab, const zpp_sample_opts *o, double u,
                           int *token_p) {
    if (!logits || !token_p || vocab < 1)
        return zpp_error(ZPP_ERR_INVALID, "sample: no logits (NULL, or vocabulary %d)", vocab);
    ZPP_CHECK(zpp_sample_opts_check(o, vocab));
    if (!(u >= 0.0 && u < 1.0))
        return zpp_error(ZPP_ERR_INVALID, "sample: the uniform draw %g is outside [0, 1)", u);
    int best = 0;
    for (int i = 0; i < vocab; i++) {
        if (!isfinite(logits[i]))
            return zpp_error(ZPP_ERR_NONFINITE,
                             "sample: the logit of token %d is %g; the model's weights (or its "
                             "activations) are not finite",
                             i, (double)logits[i]);
        if (logits[i] > logits[best]) best = i;
    }
    if (o->temperature == 0.0) {
        *token_p = best;
        return ZPP_OK;
    }
    /* The candidates: token i is in when (l_i, -i) is at least the k-th
     * largest pair (lk, -ik) in lexicographic order, which the sort finds. */
    float lk = -INFINITY;
    int ik = vocab - 1;
    if (o->top_k > 0 && o->top_k < vocab) {
        logit_at *all = malloc((size_t)vocab * sizeof *all);
        if (!all) return zpp_error(ZPP_ERR_NOMEM, "sample: out of memory for top-k");
        for (int i = 0; i < vocab; i++) all[i] = (logit_at){logits[i], i};
        qsort(all, (size_t)vocab, sizeof *all, logit_desc);
        lk = all[o->top_k - 1].l;
        ik = all[o->top_k - 1].i;
        free(all);
    }
#define CANDIDATE(i) (logits[i] > lk || (logits[i] == lk && (i) <= ik))
    const double m = logits[best], t = o->temperature;
    /* exp((l - m) / t) in (0, 1], 1 at the argmax, which every top-k keeps:
     * the total is at least 1, so u * total is never lost below it. */
    double total = 0.0;
    for (int i = 0; i < vocab; i++)
        if (CANDIDATE(i)) total += exp(((double)logits[i] - m) / t);
    /* The same terms in the same order: the running sum reaches `total`
     * exactly at the last candidate, above u * total < total. */
    const double target = u * total;
    double run = 0.0;
    int last = best;
    for (int i = 0; i < vocab; i++) {
        if (!CANDIDATE(i)) continue;
        run += exp(((double)logits[i] - m) / t);
        last = i;
        if (run > target) break;
    }
#undef CANDIDATE
    *token_p = last;
    return ZPP_OK;
}

/* ---- Generation --------------------------------------------------------------- */

zpp_status zpp_sample_generate(const zpp_sample_source *src, const zpp_sample_opts *o,
                               const int32_t *prompt, int n_prompt, int max_new,
                               zpp_sample_emit_fn emit, void *emit_ctx, int32_t *out) {
    if (!src || !src->logits || src->seq_len < 1 || src->real_vocab_size < 1 ||
        src->vocab_size < src->real_vocab_size)
        return zpp_error(ZPP_ERR_INVALID, "sample: no model to sample from");
    const int T = src->seq_len, V = src->real_vocab_size;
    ZPP_CHECK(zpp_sample_opts_check(o, V));
    if (n_prompt < 1 || !prompt)
        return zpp_error(ZPP_ERR_INVALID,
                         "sample: the prompt is empty; give at least one token to continue");
    if (max_new < 0 || (max_new > 0 && !out))
        return zpp_error(ZPP_ERR_INVALID, "sample: %d new tokens asked for", max_new);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return zpp_error(ZPP_ERR_INVALID,
                             "sample: prompt token %d at position %d is outside the vocabulary "
                             "0..%d",
                             (int)prompt[i], i, V - 1);
    if (n_prompt > INT32_MAX - max_new)
        return zpp_error(ZPP_ERR_INVALID, "sample: prompt and new tokens overflow");
    const size_t n_all = (size_t)n_prompt + (size_t)max_new;
    int32_t *seq = malloc(n_all * sizeof *seq), *window = malloc((size_t)T * sizeof *window);
    float *logits = malloc((size_t)src->vocab_size * sizeof *logits);
    zpp_status st = ZPP_OK;
    if (!seq || !window || !logits) st = zpp_error(ZPP_ERR_NOMEM, "sample: out of memory");
    if (st == ZPP_OK) memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    size_t n = (size_t)n_prompt;
    for (int k = 0; st == ZPP_OK && k < max_new; k++, n++) {
        /* the window: the last w tokens at positions 0..w-1, then padding */
        const int w = n < (size_t)T ? (int)n : T;
        memcpy(window, seq + n - (size_t)w, (size_t)w * sizeof *window);
        memset(window + w, 0, (size_t)(T - w) * sizeof *window);
        st = src->logits(src->ctx, window, w, logits);
        int tok = 0;
        if (st == ZPP_OK)
            st = zpp_sample_pick(logits, V, o, zpp_sample_uniform(o->seed, (uint64_t)k), &tok);
        if (st == ZPP_OK) {
            seq[n] = tok;
            out[k] = tok;
            if (emit) st = emit(emit_ctx, tok);
        }
    }
    free(seq);
    free(window);
    free(logits);
    return st;
}

/* ---- A model held whole on one device ----------------------------------------- */

int zpp_sample_real_vocab(const zpp_decoder_shape *shape) {
    return shape->real_vocab_size > 0 ? shape->real_vocab_size : shape->vocab_size;
}

struct zpp_sample_model {
    zpp_model *m;
    zpp_device *dev;
    void **params; /* per unit, in the device's memory, in the model's dtype */
};

/* Unit u's values rounded to dtype (bf16 as the engine rounds its masters,
 * core/dtype.h zpp_split_hi: the weights training computed with), copied to
 * a new device buffer. */
static zpp_status upload_unit(zpp_device *dev, zpp_dtype dtype, const float *unit, size_t k,
                              void **dst_p) {
    const size_t es = zpp_dtype_size(dtype);
    void *host = dtype == ZPP_FP32 ? (void *)unit : malloc(k * es);
    if (!host) return zpp_error(ZPP_ERR_NOMEM, "sample model: out of memory");
    if (host != (const void *)unit)
        for (size_t i = 0; i < k; i++) {
            if (dtype == ZPP_BF16) ((zpp_bf16 *)host)[i] = zpp_split_hi(unit[i]);
            else zpp_store_f32(host, dtype, i, unit[i]);
        }
    zpp_status st = zpp_device_alloc(dev, k * es, dst_p);
    if (st == ZPP_OK) st = zpp_device_copy(dev, *dst_p, host, k * es);
    if (host != (const void *)unit) free(host); /* copied or not */
    return st;
}

zpp_status zpp_sample_model_create(const zpp_sample_weights *w, zpp_dtype dtype,
                                   zpp_device *dev, zpp_sample_model **model_p) {
    if (!w || !w->units || !dev || !model_p)
        return zpp_error(ZPP_ERR_INVALID, "sample model: NULL argument");
    zpp_sample_model *sm = calloc(1, sizeof *sm);
    if (!sm) return zpp_error(ZPP_ERR_NOMEM, "sample model: out of memory");
    sm->dev = dev;
    zpp_decoder_shape shape = w->shape;
    shape.recompute = 0; /* no backward: nothing to recompute */
    zpp_status st = ZPP_OK;
    ZPP_CHECK_GOTO(zpp_model_family_create(w->family, &shape, dtype, 1, dev, &sm->m), st, fail);
    if (!sm->m->ops->keep_logits || !sm->m->ops->logits) {
        st = zpp_error(ZPP_ERR_UNSUPPORTED, "sample model: the model gives no logits");
        goto fail;
    }
    if (w->n_units != sm->m->n_units) {
        st = zpp_error(ZPP_ERR_FORMAT, "sample model: %d units of weights for a %s of %d units",
                       w->n_units, w->family, sm->m->n_units);
        goto fail;
    }
    if (!(sm->params = calloc((size_t)sm->m->n_units, sizeof *sm->params))) {
        st = zpp_error(ZPP_ERR_NOMEM, "sample model: out of memory");
        goto fail;
    }
    for (int u = 0; u < sm->m->n_units; u++)
        ZPP_CHECK_GOTO(upload_unit(dev, dtype, w->units[u], sm->m->unit_numel[u], &sm->params[u]),
                       st, fail);
    /* the copies have read the host buffers before the caller frees them */
    ZPP_CHECK_GOTO(zpp_device_sync(dev, NULL), st, fail);
    *model_p = sm;
    return ZPP_OK;
fail:
    zpp_sample_model_destroy(sm);
    return st;
}

void zpp_sample_model_destroy(zpp_sample_model *sm) {
    if (!sm) return;
    for (int u = 0; sm->params && u < sm->m->n_units; u++)
        if (sm->params[u]) zpp_device_free(sm->dev, sm->params[u]);
    free(sm->params);
    if (sm->m) sm->m->ops->destroy(sm->m);
    free(sm);
}

/* One sequence through every stage, keeping row n - 1. */
static zpp_status sample_model_logits(void *ctx, const int32_t *window, int n, float *out) {
    zpp_sample_model *sm = ctx;
    zpp_model *m = sm->m;
    ZPP_CHECK(m->ops->keep_logits(m, n - 1));
    ZPP_CHECK(m->ops->set_batch(m, window, NULL, 1));
    for (int s = 0; s < m->n_stages; s++)
        ZPP_CHECK(m->ops->forward(m, s, sm->params[m->stage_unit[s]]));
    return m->ops->logits(m, out);
}

zpp_sample_source zpp_sample_model_source(zpp_sample_model *sm) {
    zpp_sample_source s = {sm->m->seq_len, sm->m->vocab_size, sm->m->real_vocab_size,
                           sample_model_logits, sm};
    return s;
}

/* ---- Reading the weights ------------------------------------------------------ */

void zpp_sample_weights_free(zpp_sample_weights *w) {
    if (!w || !w->units) return;
    for (int u = 0; u < w->n_units; u++) free(w->units[u]);
    free(w->units);
    w->units = NULL;
}

/* The decoder shape of a GPT-2 config (its family's knobs 0; no
 * backward: nothing to recompute). */
static zpp_decoder_shape gpt2_shape(const zpp_gpt2_config *g) {
    zpp_decoder_shape sh;
    memset(&sh, 0, sizeof sh);
    zpp_gpt2_shape_set(g, &sh);
    sh.recompute = 0;
    return sh;
}

/* The family and shape a checkpoint trained: its kept config's "model"
 * section (model.family and the Llama knobs), or, in a manifest without a
 * config, a GPT-2 of the manifest's shape. The manifest's own shape must
 * be the config's (as the trainer writes them). */
static zpp_status checkpoint_shape(const char *dir, const zpp_ckpt_manifest *m,
                                   zpp_sample_weights *w) {
    snprintf(w->family, sizeof w->family, "gpt2");
    w->shape = gpt2_shape(&m->model);
    if (!m->config) return zpp_gpt2_config_check(&m->model);
    zpp_train_config cfg;
    ZPP_CHECK(zpp_train_config_defaults(&cfg));
    zpp_status st = zpp_train_config_load_string(m->config, &cfg);
    if (st != ZPP_OK) return zpp_error_context(st, "checkpoint %s: its config", dir);
    snprintf(w->family, sizeof w->family, "%s", zpp_model_family_name(cfg.model_family));
    w->shape = zpp_train_config_shape(&cfg);
    w->shape.recompute = 0;
    if (cfg.model.n_layer != m->model.n_layer ||
        cfg.model.n_embd != m->model.n_embd || cfg.model.vocab_size != m->model.vocab_size)
        return zpp_error(ZPP_ERR_FORMAT,
                         "checkpoint %s: its manifest's model (%d layers x %d) is not its "
                         "config's (%d x %d)",
                         dir, m->model.n_layer, m->model.n_embd, cfg.model.n_layer,
                         cfg.model.n_embd);
    return ZPP_OK;
}

/* The size of unit u of a family's shape (gpt2.h's or llama.h's layout),
 * 0 for a unit out of range; the family's shape check's error otherwise. */
static zpp_status family_unit_numel(const zpp_sample_weights *w, int u, size_t *numel_p) {
    if (!strcmp(w->family, "llama")) {
        zpp_llama_config lc;
        ZPP_CHECK(zpp_llama_config_of_shape(&w->shape, &lc));
        zpp_llama_layout l;
        zpp_llama_layout_make(&lc, &l);
        *numel_p = u == 0 ? l.embed_numel : u <= lc.n_layer ? l.block_numel : 0;
        return ZPP_OK;
    }
    const zpp_decoder_shape *sh = &w->shape;
    zpp_gpt2_config g = {sh->n_layer,    sh->n_head,          sh->n_embd, sh->seq_len,
                         sh->vocab_size, sh->real_vocab_size, 0, 0};
    ZPP_CHECK(zpp_gpt2_config_check(&g));
    *numel_p = u <= g.n_layer ? zpp_gpt2_unit_numel(&g, u) : 0;
    return ZPP_OK;
}

static zpp_status read_checkpoint(const char *dir, zpp_sample_weights *w_p) {
    zpp_ckpt_manifest m;
    zpp_sample_weights w;
    memset(&w, 0, sizeof w);
    ZPP_CHECK(zpp_checkpoint_read_masters(dir, &m, &w.units));
    w.n_units = m.n_units;
    /* the manifest's shape must be the units it lists (as `zeropp export`) */
    zpp_status st = ZPP_OK;
    ZPP_CHECK_GOTO(checkpoint_shape(dir, &m, &w), st, out);
    if (m.n_units != w.shape.n_layer + 1) {
        st = zpp_error(ZPP_ERR_FORMAT, "checkpoint %s has %d units; its model has %d layers", dir,
                       m.n_units, w.shape.n_layer);
        goto out;
    }
    for (int u = 0; u < m.n_units; u++) {
        size_t want = 0;
        ZPP_CHECK_GOTO(family_unit_numel(&w, u, &want), st, out);
        if (m.numel[u] != want) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "checkpoint %s: unit %d has %zu parameters; its %s model's has %zu",
                           dir, u, m.numel[u], w.family, want);
            goto out;
        }
    }
    if (zpp_dtype_parse(m.dtype, &w.dtype) != ZPP_OK) {
        st = zpp_error(ZPP_ERR_FORMAT, "checkpoint %s: working dtype '%s' is not a dtype", dir,
                       m.dtype);
        goto out;
    }
    w.step = m.step;
    *w_p = w;
out:
    if (st != ZPP_OK) zpp_sample_weights_free(&w);
    zpp_ckpt_manifest_free(&m);
    return st;
}

static zpp_status read_llmc(const char *path, zpp_sample_weights *w_p) {
    zpp_llmc_file *f = NULL;
    ZPP_CHECK(zpp_llmc_open(path, &f));
    const zpp_llmc_info *in = zpp_llmc_info_get(f);
    const zpp_gpt2_config cfg = in->model;
    zpp_sample_weights w;
    memset(&w, 0, sizeof w);
    snprintf(w.family, sizeof w.family, "gpt2");
    w.shape = gpt2_shape(&cfg);
    w.n_units = cfg.n_layer + 1;
    w.units = calloc((size_t)w.n_units, sizeof *w.units);
    zpp_status st = ZPP_OK;
    if (!w.units) {
        st = zpp_error(ZPP_ERR_NOMEM, "sample: out of memory");
        goto out;
    }
    for (int u = 0; u < w.n_units; u++) {
        const size_t k = zpp_gpt2_unit_numel(&cfg, u);
        if (!(w.units[u] = malloc(k * sizeof(float)))) {
            st = zpp_error(ZPP_ERR_NOMEM, "sample: out of memory for unit %d", u);
            goto out;
        }
        ZPP_CHECK_GOTO(zpp_llmc_read_unit(f, u, 0, k, w.units[u]), st, out);
    }
    w.dtype = in->dtype;
    w.step = -1;
    *w_p = w;
out:
    if (st != ZPP_OK) zpp_sample_weights_free(&w);
    zpp_llmc_close(f);
    return st;
}

/* Unit u of a folder, whole (numel elements), fp32. */
typedef zpp_status (*folder_unit_fn)(void *ctx, int u, size_t numel, float *out);

/* Every unit of *w (its family, shape and n_units set) read by `read`;
 * then w is a model file's: fp32 (the stored values, widened exactly),
 * step -1. On failure w's units are freed. */
static zpp_status read_folder_units(zpp_sample_weights *w, folder_unit_fn read, void *ctx) {
    zpp_status st = ZPP_OK;
    if (!(w->units = calloc((size_t)w->n_units, sizeof *w->units)))
        st = zpp_error(ZPP_ERR_NOMEM, "sample: out of memory");
    for (int u = 0; st == ZPP_OK && u < w->n_units; u++) {
        size_t k = 0;
        st = family_unit_numel(w, u, &k);
        if (st == ZPP_OK && !(w->units[u] = malloc(k * sizeof(float))))
            st = zpp_error(ZPP_ERR_NOMEM, "sample: out of memory for unit %d", u);
        if (st == ZPP_OK) st = read(ctx, u, k, w->units[u]);
    }
    if (st != ZPP_OK) zpp_sample_weights_free(w);
    w->dtype = ZPP_FP32;
    w->step = -1;
    return st;
}

typedef struct gpt2_folder {
    zpp_hf_gpt2 *m;
    zpp_gpt2_config cfg;
} gpt2_folder;

static zpp_status gpt2_folder_unit(void *c, int u, size_t numel, float *out) {
    gpt2_folder *g = c;
    return zpp_hf_gpt2_read_unit(g->m, &g->cfg, u, 0, numel, out);
}

typedef struct llama_folder {
    zpp_hf_model *m;
    zpp_llama_config lc;
} llama_folder;

static zpp_status llama_folder_unit(void *c, int u, size_t numel, float *out) {
    llama_folder *l = c;
    return zpp_hf_model_read_unit(l->m, &l->lc, u, 0, numel, out);
}

/* A Hugging Face GPT-2 folder (train/hf_gpt2.h): its own T (n_positions,
 * the position table's rows), each unit whole in fp32. */
static zpp_status read_hf_gpt2(const char *dir, int seq_len, zpp_sample_weights *w_p) {
    if (seq_len)
        return zpp_error(ZPP_ERR_CONFIG, "sample: --seq-len is for a Llama-family folder; a "
                                         "GPT-2's T is its n_positions");
    gpt2_folder g = {NULL, {0}};
    ZPP_CHECK(zpp_hf_gpt2_open(dir, &g.m));
    g.cfg = *zpp_hf_gpt2_config(g.m);
    zpp_sample_weights w;
    memset(&w, 0, sizeof w);
    snprintf(w.family, sizeof w.family, "gpt2");
    w.shape = gpt2_shape(&g.cfg);
    w.n_units = g.cfg.n_layer + 1;
    const zpp_status st = read_folder_units(&w, gpt2_folder_unit, &g);
    zpp_hf_gpt2_close(g.m);
    if (st == ZPP_OK) *w_p = w;
    return st;
}

/* A Hugging Face Llama-family folder, read as `zeropp train --init-from`
 * reads it: the shape from config.json (zpp_hf_apply_shape), T = seq_len,
 * each unit whole in fp32 (zpp_hf_model_read_unit). */
static zpp_status read_hf(const char *dir, int seq_len, zpp_sample_weights *w_p) {
    if (zpp_hf_gpt2_is_dir(dir)) return read_hf_gpt2(dir, seq_len, w_p);
    zpp_hf_model *hm = NULL;
    ZPP_CHECK(zpp_hf_model_open(dir, &hm));
    const zpp_hf_config *hf = zpp_hf_model_config(hm);
    zpp_sample_weights w;
    memset(&w, 0, sizeof w);
    zpp_train_config tc;
    zpp_llama_config lc;
    memset(&lc, 0, sizeof lc);
    zpp_status st = zpp_train_config_defaults(&tc);
    if (st == ZPP_OK) st = zpp_hf_apply_shape(hf, &tc);
    if (st == ZPP_OK) {
        const int max_t = hf->max_position_embeddings;
        tc.model.seq_len = seq_len ? seq_len : max_t < ZPP_SAMPLE_HF_SEQ_LEN ? max_t
                                                                         : ZPP_SAMPLE_HF_SEQ_LEN;
        st = zpp_hf_check_shape(hf, &tc, dir);
    }
    if (st == ZPP_OK) {
        w.shape = zpp_train_config_shape(&tc);
        st = zpp_llama_config_of_shape(&w.shape, &lc);
    }
    snprintf(w.family, sizeof w.family, "llama");
    w.n_units = st == ZPP_OK ? lc.n_layer + 1 : 0;
    llama_folder l = {hm, lc};
    if (st == ZPP_OK) st = read_folder_units(&w, llama_folder_unit, &l);
    zpp_hf_model_close(hm);
    if (st == ZPP_OK) *w_p = w;
    return st;
}

zpp_status zpp_sample_read_weights(const char *path, int seq_len, zpp_sample_weights *w_p) {
    if (!path || !w_p || seq_len < 0)
        return zpp_error(ZPP_ERR_INVALID, "sample: NULL argument or seq_len < 0");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return zpp_error(ZPP_ERR_IO,
                         "cannot open '%s': no such file or folder; give a checkpoint folder "
                         "(zeropp train --save DIR), a Hugging Face model folder or an llm.c "
                         "model file",
                         path);
    if (zpp_hf_is_model_dir(path)) return read_hf(path, seq_len, w_p);
    if (seq_len)
        return zpp_error(ZPP_ERR_CONFIG, "sample: --seq-len is for a Hugging Face folder; a "
                                         "checkpoint's or an llm.c file's T is its own");
    if (S_ISDIR(sb.st_mode)) return read_checkpoint(path, w_p);
    return read_llmc(path, w_p);
}

/* ---- From tokens to text ------------------------------------------------------- */

zpp_status zpp_sample_decode_bytes(void *ctx, const int32_t *tokens, size_t n, char *out,
                                   size_t cap, size_t *len_p) {
    (void)ctx;
    *len_p = n;
    if (n > cap) return zpp_error(ZPP_ERR_NOMEM, "decode: %zu bytes do not fit in %zu", n, cap);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] > 255)
            return zpp_error(ZPP_ERR_INVALID, "decode: token %d is not a byte", (int)tokens[i]);
        out[i] = (char)(unsigned char)tokens[i];
    }
    return ZPP_OK;
}

zpp_status zpp_sample_text(const zpp_sample_decoder *dec, const int32_t *tokens, size_t n,
                           char **text_p, size_t *len_p) {
    if (!dec || !dec->decode) {
        /* ids: at most 11 characters and a comma each */
        char *s = malloc(12 * n + 1);
        if (!s) return zpp_error(ZPP_ERR_NOMEM, "sample: out of memory");
        size_t len = 0;
        for (size_t i = 0; i < n; i++)
            len += (size_t)sprintf(s + len, i ? ",%d" : "%d", (int)tokens[i]);
        s[len] = '\0';
        *text_p = s;
        if (len_p) *len_p = len;
        return ZPP_OK;
    }
    size_t cap = 4 * n + 16, len = 0;
    for (int tries = 0; tries < 2; tries++) {
        char *s = malloc(cap + 1);
        if (!s) return zpp_error(ZPP_ERR_NOMEM, "sample: out of memory");
        zpp_status st = dec->decode(dec->ctx, tokens, n, s, cap, &len);
        if (st == ZPP_OK) {
            s[len] = '\0';
            *text_p = s;
            if (len_p) *len_p = len;
            return ZPP_OK;
        }
        free(s);
        if (st != ZPP_ERR_NOMEM || len <= cap) return st;
        cap = len; /* the decoder said how much it needs */
    }
    return zpp_error(ZPP_ERR_NOMEM, "sample: the decoder needs ever more room");
}
