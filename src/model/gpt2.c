/* model/gpt2.c — what the CPU and CUDA GPT-2 share (gpt2.h): the
 * configuration check, the parameter layout, the initial values, the units
 * and stages, and the plan of the activation arena. Both models build on
 * this file, so it calls neither: the factory that picks one of them is
 * gpt2_factory.c. */
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/random.h"
#include "model/decoder.h"
#include "model/gpt2.h"

/* ------------------------------------------------------------------------ */
/* Configuration, layout, initialisation                                     */
/* ------------------------------------------------------------------------ */

/* Limits keep every BLAS dimension (C, 4C, V, B*T) inside an int and every
 * element count inside size_t with room to spare. */
#define GPT2_MAX_EMBD (1 << 24)
#define GPT2_MAX_VOCAB (1 << 30)
#define GPT2_MAX_SEQ (1 << 24)
#define GPT2_MAX_LAYER (1 << 16)

zpp_status zpp_gpt2_config_check(const zpp_gpt2_config *cfg) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "gpt2: config is NULL");
    if (cfg->n_layer < 1 || cfg->n_layer > GPT2_MAX_LAYER)
        return zpp_error(ZPP_ERR_CONFIG, "gpt2: n_layer %d is out of range; use 1..%d",
                         cfg->n_layer, GPT2_MAX_LAYER);
    if (cfg->n_embd < 1 || cfg->n_embd > GPT2_MAX_EMBD)
        return zpp_error(ZPP_ERR_CONFIG, "gpt2: n_embd %d is out of range; use 1..%d",
                         cfg->n_embd, GPT2_MAX_EMBD);
    if (cfg->n_head < 1 || cfg->n_embd % cfg->n_head != 0)
        return zpp_error(ZPP_ERR_CONFIG,
                         "gpt2: n_head %d must be positive and divide n_embd %d",
                         cfg->n_head, cfg->n_embd);
    if (cfg->seq_len < 1 || cfg->seq_len > GPT2_MAX_SEQ)
        return zpp_error(ZPP_ERR_CONFIG, "gpt2: seq_len %d is out of range; use 1..%d",
                         cfg->seq_len, GPT2_MAX_SEQ);
    if (cfg->vocab_size < 1 || cfg->vocab_size > GPT2_MAX_VOCAB)
        return zpp_error(ZPP_ERR_CONFIG, "gpt2: vocab_size %d is out of range; use 1..%d",
                         cfg->vocab_size, GPT2_MAX_VOCAB);
    if (cfg->real_vocab_size < 0 || cfg->real_vocab_size > cfg->vocab_size)
        return zpp_error(ZPP_ERR_CONFIG,
                         "gpt2: real_vocab_size %d is out of range; use 1..vocab_size %d (or 0 "
                         "for vocab_size)",
                         cfg->real_vocab_size, cfg->vocab_size);
    return ZPP_OK;
}

void zpp_gpt2_layout_make(const zpp_gpt2_config *cfg, zpp_gpt2_layout *layout_p) {
    size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size, T = (size_t)cfg->seq_len;
    zpp_gpt2_layout l;
    size_t o = 0;
    l.wte = o;    o += V * C;
    l.wpe = o;    o += T * C;
    l.lnf_w = o;  o += C;
    l.lnf_b = o;  o += C;
    l.embed_numel = o;
    o = 0;
    l.ln1_w = o;  o += C;
    l.ln1_b = o;  o += C;
    l.qkv_w = o;  o += 3 * C * C;
    l.qkv_b = o;  o += 3 * C;
    l.proj_w = o; o += C * C;
    l.proj_b = o; o += C;
    l.ln2_w = o;  o += C;
    l.ln2_b = o;  o += C;
    l.fc_w = o;   o += 4 * C * C;
    l.fc_b = o;   o += 4 * C;
    l.fc2_w = o;  o += 4 * C * C;
    l.fc2_b = o;  o += C;
    l.block_numel = o; /* 12 C^2 + 13 C */
    *layout_p = l;
}

size_t zpp_gpt2_unit_numel(const zpp_gpt2_config *cfg, int unit) {
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(cfg, &l);
    return unit == 0 ? l.embed_numel : l.block_numel;
}

zpp_status zpp_gpt2_init_check(const zpp_gpt2_config *cfg, int unit, size_t offset,
                               size_t count, zpp_gpt2_layout *layout_p) {
    ZPP_CHECK(zpp_gpt2_config_check(cfg));
    if (unit < 0 || unit > cfg->n_layer)
        return zpp_error(ZPP_ERR_INVALID, "gpt2 init: unit %d does not exist; use 0..%d",
                         unit, cfg->n_layer);
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(cfg, &l);
    size_t numel = unit == 0 ? l.embed_numel : l.block_numel;
    if (offset > numel || count > numel - offset)
        return zpp_error(ZPP_ERR_INVALID,
                         "gpt2 init: elements [%zu, %zu + %zu) exceed unit %d of %zu elements",
                         offset, offset, count, unit, numel);
    *layout_p = l;
    return ZPP_OK;
}

zpp_status zpp_gpt2_init_fill(const zpp_gpt2_config *cfg, int unit, size_t offset,
                              size_t count, float *out, uint64_t seed) {
    zpp_gpt2_layout l;
    ZPP_CHECK(zpp_gpt2_init_check(cfg, unit, offset, count, &l));
    if (count && !out) return zpp_error(ZPP_ERR_INVALID, "gpt2 init: out is NULL");
    for (size_t k = 0; k < count; k++)
        out[k] = zpp_gpt2_init_value(cfg, &l, unit, offset + k, seed);
    return ZPP_OK;
}

zpp_status zpp_gpt2_stages_make(const zpp_gpt2_config *cfg, zpp_gpt2_stages *s) {
    int L = cfg->n_layer;
    zpp_decoder_tables *t = &s->t;
    ZPP_CHECK(zpp_decoder_tables_make(L, "gpt2", t));
    for (int u = 0; u <= L; u++) t->unit_numel[u] = zpp_gpt2_unit_numel(cfg, u);
    /* The matrices (tensors of two or more dimensions). Only they decay,
     * as llm.c and nanoGPT do: shrinking a LayerNorm gain or a bias towards
     * 0 is not the regularisation weight decay is for. And only they are
     * quantized (model.h). */
    zpp_gpt2_layout lo;
    zpp_gpt2_layout_make(cfg, &lo);
    s->embed_matrices[0] = (zpp_elem_range){lo.wte, lo.lnf_w}; /* wte, wpe */
    s->block_matrices[0] = (zpp_elem_range){lo.qkv_w, lo.qkv_b};
    s->block_matrices[1] = (zpp_elem_range){lo.proj_w, lo.proj_b};
    s->block_matrices[2] = (zpp_elem_range){lo.fc_w, lo.fc_b};
    s->block_matrices[3] = (zpp_elem_range){lo.fc2_w, lo.fc2_b};
    t->n_matrix_ranges[0] = 1;
    t->matrix_ranges[0] = s->embed_matrices;
    for (int u = 1; u <= L; u++) {
        t->n_matrix_ranges[u] = 4;
        t->matrix_ranges[u] = s->block_matrices;
    }
    return ZPP_OK;
}

void zpp_gpt2_stages_free(zpp_gpt2_stages *s) { zpp_decoder_tables_free(&s->t); }

zpp_status zpp_gpt2_create_check(const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                                 int max_batch, const char *who) {
    ZPP_CHECK(zpp_gpt2_config_check(cfg));
    return zpp_decoder_check_create(param_dtype, max_batch, cfg->seq_len, who);
}

void zpp_gpt2_base_fill(zpp_model *base, const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                        int max_batch, const zpp_gpt2_stages *s) {
    zpp_decoder_base_fill(base, &s->t, cfg->n_layer, param_dtype, max_batch, cfg->seq_len,
                          cfg->vocab_size, zpp_gpt2_real_vocab(cfg));
}

/* ------------------------------------------------------------------------ */
/* The activation arena                                                      */
/* ------------------------------------------------------------------------ */

void zpp_gpt2_acts_plan(const zpp_gpt2_config *cfg, int max_batch, zpp_arena *a,
                        zpp_gpt2_acts *x) {
    size_t L = (size_t)cfg->n_layer, C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size;
    size_t T = (size_t)cfg->seq_len, H = (size_t)cfg->n_head, Bm = (size_t)max_batch;
    size_t N = Bm * T;
    /* Every block's input stays, and the last block's output (the head's
     * input); the rest of a block's activations are L slabs, or one shared
     * slab that each block's backward refills (recompute). */
    const size_t S = cfg->recompute ? 1 : L;
    x->res = zpp_arena_take(a, (L + 1) * N, C);
    x->ln1 = zpp_arena_take(a, S * N, C);
    x->ln1_mean = zpp_arena_take(a, S, N);
    x->ln1_rstd = zpp_arena_take(a, S, N);
    x->qkv = zpp_arena_take(a, S * N, 3 * C);
    x->att = zpp_arena_take(a, S * Bm * H, T * T);
    x->atty = zpp_arena_take(a, S * N, C);
    x->mid = zpp_arena_take(a, S * N, C);
    x->ln2 = zpp_arena_take(a, S * N, C);
    x->ln2_mean = zpp_arena_take(a, S, N);
    x->ln2_rstd = zpp_arena_take(a, S, N);
    x->fch = zpp_arena_take(a, S * N, 4 * C);
    x->fcg = zpp_arena_take(a, S * N, 4 * C);
    x->lnf = zpp_arena_take(a, N, C);
    x->lnf_mean = zpp_arena_take(a, N, 1);
    x->lnf_rstd = zpp_arena_take(a, N, 1);
    x->probs = zpp_arena_take(a, N, V);
    x->losses = zpp_arena_take(a, N, 1);
    x->dres = zpp_arena_take(a, N, C);
    x->dc = zpp_arena_take(a, N, C);
    x->dqkv = zpp_arena_take(a, N, 3 * C);
    x->dfc = zpp_arena_take(a, N, 4 * C);
}

zpp_gpt2_layer zpp_gpt2_layer_of(const zpp_gpt2_acts *a, const zpp_gpt2_config *cfg,
                                 int max_batch, int l) {
    const size_t C = (size_t)cfg->n_embd, T = (size_t)cfg->seq_len, H = (size_t)cfg->n_head;
    const size_t N = (size_t)max_batch * T, r = (size_t)(l - 1); /* block l's residual in */
    const size_t k = cfg->recompute ? 0 : r;                      /* its activations' slab */
    zpp_gpt2_layer y;
    y.x = a->res + r * N * C;
    y.out = a->res + (r + 1) * N * C;
    y.ln1 = a->ln1 + k * N * C;
    y.ln1m = a->ln1_mean + k * N;
    y.ln1r = a->ln1_rstd + k * N;
    y.qkv = a->qkv + k * N * 3 * C;
    y.att = a->att + k * (size_t)max_batch * H * T * T;
    y.atty = a->atty + k * N * C;
    y.mid = a->mid + k * N * C;
    y.ln2 = a->ln2 + k * N * C;
    y.ln2m = a->ln2_mean + k * N;
    y.ln2r = a->ln2_rstd + k * N;
    y.fch = a->fch + k * N * 4 * C;
    y.fcg = a->fcg + k * N * 4 * C;
    return y;
}
