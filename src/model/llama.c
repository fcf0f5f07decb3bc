/* model/llama.c — the Llama family's shape, layout, initial values, units
 * and stages, and RoPE's frequencies (llama.h). The CPU model builds on
 * this file; the factory that picks a model is llama_factory.c. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "model/decoder.h"
#include "model/llama.h"

/* Limits keep every BLAS dimension (C, 2F, V, B*T) inside an int and every
 * element count inside size_t with room to spare (as GPT-2's). */
#define LLAMA_MAX_DIM (1 << 24)
#define LLAMA_MAX_VOCAB (1 << 30)
#define LLAMA_MAX_LAYER (1 << 16)

/* ------------------------------------------------------------------------ */
/* The config                                                                */
/* ------------------------------------------------------------------------ */

/* Llama's MLP width when none is given: two thirds of GPT-2's 4C (SwiGLU
 * has three matrices where GPT-2's MLP has two, so the same parameter
 * count), rounded up to a multiple of 256 as Meta's reference does. */
static int default_ffn(int n_embd) {
    long long f = 8LL * n_embd / 3;
    f = (f + 255) / 256 * 256;
    return f > LLAMA_MAX_DIM ? LLAMA_MAX_DIM : (int)f;
}

static zpp_status check_int(const char *field, int v, int lo, int hi) {
    if (v < lo || v > hi)
        return zpp_error(ZPP_ERR_CONFIG, "llama: %s %d is out of range; use %d..%d", field, v,
                         lo, hi);
    return ZPP_OK;
}

/* The sizes, and how heads split the width: n_head | n_embd (hd = C / H),
 * n_kv_head | n_head (each k/v head serves n_head / n_kv_head query heads),
 * hd even (RoPE turns channel pairs (i, i + hd/2)). */
static zpp_status check_sizes(const zpp_llama_config *c) {
    ZPP_CHECK(check_int("n_layer", c->n_layer, 1, LLAMA_MAX_LAYER));
    ZPP_CHECK(check_int("n_embd", c->n_embd, 1, LLAMA_MAX_DIM));
    ZPP_CHECK(check_int("n_ffn", c->n_ffn, 1, LLAMA_MAX_DIM / 2));
    ZPP_CHECK(check_int("seq_len", c->seq_len, 1, LLAMA_MAX_DIM));
    ZPP_CHECK(check_int("vocab_size", c->vocab_size, 1, LLAMA_MAX_VOCAB));
    ZPP_CHECK(check_int("real_vocab_size", c->real_vocab_size, 1, c->vocab_size));
    if (c->n_head < 1 || c->n_embd % c->n_head != 0)
        return zpp_error(ZPP_ERR_CONFIG, "llama: n_head %d must be positive and divide n_embd %d",
                         c->n_head, c->n_embd);
    if (c->n_kv_head < 1 || c->n_head % c->n_kv_head != 0)
        return zpp_error(ZPP_ERR_CONFIG,
                         "llama: n_kv_head %d must be positive and divide n_head %d (each key/"
                         "value head serves n_head / n_kv_head query heads)",
                         c->n_kv_head, c->n_head);
    if ((c->n_embd / c->n_head) % 2 != 0)
        return zpp_error(ZPP_ERR_CONFIG,
                         "llama: the head dim n_embd / n_head = %d is odd; RoPE turns channel "
                         "pairs, so choose n_embd and n_head for an even head dim",
                         c->n_embd / c->n_head);
    return ZPP_OK;
}

/* The positional knobs: theta > 1 (a base <= 1 does not decay), eps > 0,
 * and the llama3 scaling, whose smooth band needs low < high. */
static zpp_status check_knobs(const zpp_llama_config *c) {
    if (!(c->rope_theta > 1.0) || !isfinite(c->rope_theta))
        return zpp_error(ZPP_ERR_CONFIG, "llama: rope_theta %g must be finite and above 1",
                         c->rope_theta);
    if (!(c->norm_eps > 0.0) || !isfinite(c->norm_eps))
        return zpp_error(ZPP_ERR_CONFIG, "llama: norm_eps %g must be finite and positive",
                         c->norm_eps);
    if (c->rope_factor == 0.0) return ZPP_OK;
    if (!(c->rope_factor > 0.0) || !isfinite(c->rope_factor))
        return zpp_error(ZPP_ERR_CONFIG,
                         "llama: rope_factor %g must be finite and positive (0: no scaling)",
                         c->rope_factor);
    if (!(c->rope_low_freq_factor > 0.0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor)
        || !isfinite(c->rope_high_freq_factor))
        return zpp_error(ZPP_ERR_CONFIG,
                         "llama: rope_low_freq_factor %g and rope_high_freq_factor %g must "
                         "satisfy 0 < low < high (Llama 3.1: 1 and 4)",
                         c->rope_low_freq_factor, c->rope_high_freq_factor);
    return check_int("rope_original_max_pos", c->rope_original_max_pos, 1, INT32_MAX);
}

zpp_status zpp_llama_config_of_shape(const zpp_decoder_shape *shape, zpp_llama_config *cfg_p) {
    if (!shape || !cfg_p) return zpp_error(ZPP_ERR_INVALID, "llama: shape or cfg_p is NULL");
    zpp_llama_config c = {
        .n_layer = shape->n_layer,
        .n_head = shape->n_head,
        .n_kv_head = shape->n_kv_head ? shape->n_kv_head : shape->n_head,
        .n_embd = shape->n_embd,
        .n_ffn = shape->n_ffn ? shape->n_ffn : default_ffn(shape->n_embd),
        .seq_len = shape->seq_len,
        .vocab_size = shape->vocab_size,
        .real_vocab_size = shape->real_vocab_size ? shape->real_vocab_size : shape->vocab_size,
        .rope_theta = shape->rope_theta != 0.0 ? shape->rope_theta : 10000.0,
        .norm_eps = shape->norm_eps != 0.0 ? shape->norm_eps : 1e-5,
        .untied_head = shape->untied_head,
        .qkv_bias = shape->qkv_bias,
        .o_bias = shape->o_bias,
        .rope_factor = shape->rope_factor,
        .rope_low_freq_factor = shape->rope_low_freq_factor,
        .rope_high_freq_factor = shape->rope_high_freq_factor,
        .rope_original_max_pos = shape->rope_original_max_pos,
        .recompute = shape->recompute,
    };
    if (c.untied_head != 0 && c.untied_head != 1)
        return zpp_error(ZPP_ERR_CONFIG, "llama: untied_head %d is not a switch; use 0 or 1",
                         c.untied_head);
    if (c.qkv_bias != 0 && c.qkv_bias != 1)
        return zpp_error(ZPP_ERR_CONFIG, "llama: qkv_bias %d is not a switch; use 0 or 1",
                         c.qkv_bias);
    if (c.o_bias != 0 && c.o_bias != 1)
        return zpp_error(ZPP_ERR_CONFIG, "llama: o_bias %d is not a switch; use 0 or 1",
                         c.o_bias);
    if (c.recompute != 0 && c.recompute != 1)
        return zpp_error(ZPP_ERR_CONFIG, "llama: recompute %d is not a switch; use 0 or 1",
                         c.recompute);
    ZPP_CHECK(check_sizes(&c));
    ZPP_CHECK(check_knobs(&c));
    *cfg_p = c;
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Layout, initial values, units and stages                                  */
/* ------------------------------------------------------------------------ */

void zpp_llama_layout_make(const zpp_llama_config *cfg, zpp_llama_layout *layout_p) {
    const size_t C = (size_t)cfg->n_embd, V = (size_t)cfg->vocab_size, F = (size_t)cfg->n_ffn;
    const size_t Cqkv = C + 2 * (size_t)cfg->n_kv_head * (C / (size_t)cfg->n_head);
    zpp_llama_layout l;
    size_t o = 0;
    l.wte = o;    o += V * C;
    l.norm_f = o; o += C;
    l.head = o;   o += cfg->untied_head ? V * C : 0;
    l.embed_numel = o;
    o = 0;
    l.norm1 = o;  o += C;
    l.wqkv = o;   o += Cqkv * C;
    l.bqkv = o;   o += cfg->qkv_bias ? Cqkv : 0;
    l.wo = o;     o += C * C;
    l.bo = o;     o += cfg->o_bias ? C : 0;
    l.norm2 = o;  o += C;
    l.wgu = o;    o += 2 * F * C;
    l.wdown = o;  o += C * F;
    l.block_numel = o;
    *layout_p = l;
}

zpp_status zpp_llama_init_fill(const zpp_llama_config *cfg, int unit, size_t offset, size_t count,
                               float *out, uint64_t seed) {
    if (!cfg) return zpp_error(ZPP_ERR_INVALID, "llama init: config is NULL");
    if (unit < 0 || unit > cfg->n_layer)
        return zpp_error(ZPP_ERR_INVALID, "llama init: unit %d does not exist; use 0..%d", unit,
                         cfg->n_layer);
    zpp_llama_layout l;
    zpp_llama_layout_make(cfg, &l);
    const size_t numel = unit == 0 ? l.embed_numel : l.block_numel;
    if (offset > numel || count > numel - offset)
        return zpp_error(ZPP_ERR_INVALID,
                         "llama init: elements [%zu, %zu + %zu) exceed unit %d of %zu elements",
                         offset, offset, count, unit, numel);
    if (count && !out) return zpp_error(ZPP_ERR_INVALID, "llama init: out is NULL");
    for (size_t k = 0; k < count; k++) out[k] = zpp_llama_init_value(&l, unit, offset + k, seed);
    return ZPP_OK;
}

zpp_status zpp_llama_stages_make(const zpp_llama_config *cfg, zpp_llama_stages *s) {
    const int L = cfg->n_layer;
    zpp_decoder_tables *t = &s->t;
    ZPP_CHECK(zpp_decoder_tables_make(L, "llama", t));
    zpp_llama_layout lo;
    zpp_llama_layout_make(cfg, &lo);
    for (int u = 0; u <= L; u++) t->unit_numel[u] = u == 0 ? lo.embed_numel : lo.block_numel;
    /* The matrices decay and are quantized (model.h); RMSNorm gains and
     * biases are vectors. */
    s->embed_matrices[0] = (zpp_elem_range){lo.wte, lo.norm_f};
    s->embed_matrices[1] = (zpp_elem_range){lo.head, lo.embed_numel};
    s->block_matrices[0] = (zpp_elem_range){lo.wqkv, lo.bqkv};
    s->block_matrices[1] = (zpp_elem_range){lo.wo, lo.bo};
    s->block_matrices[2] = (zpp_elem_range){lo.wgu, lo.block_numel};
    t->n_matrix_ranges[0] = cfg->untied_head ? 2 : 1;
    t->matrix_ranges[0] = s->embed_matrices;
    for (int u = 1; u <= L; u++) {
        t->n_matrix_ranges[u] = 3;
        t->matrix_ranges[u] = s->block_matrices;
    }
    return ZPP_OK;
}

void zpp_llama_stages_free(zpp_llama_stages *s) { zpp_decoder_tables_free(&s->t); }

void zpp_llama_base_fill(zpp_model *base, const zpp_llama_config *cfg, zpp_dtype param_dtype,
                         int max_batch, const zpp_llama_stages *s) {
    zpp_decoder_base_fill(base, &s->t, cfg->n_layer, param_dtype, max_batch, cfg->seq_len,
                          cfg->vocab_size, cfg->real_vocab_size);
}

/* ------------------------------------------------------------------------ */
/* RoPE's frequencies                                                        */
/* ------------------------------------------------------------------------ */

/* Llama 3's scaling (HF _compute_llama3_parameters) works on wavelengths
 * 2 pi / f against the context the model was first trained on (orig):
 * a pair whose wavelength is shorter than orig / high_freq_factor turns
 * many times within that context and keeps its frequency; one longer than
 * orig / low_freq_factor is slowed by `factor` (it now spans factor times
 * the context); in between the frequency is blended linearly in
 * s = (orig / wavelen - low) / (high - low): (1 - s) f / factor + s f. */
void zpp_llama_rope_inv_freq(const zpp_llama_config *cfg, double *inv_freq) {
    const int hd = cfg->n_embd / cfg->n_head;
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(cfg->rope_theta, (double)(2 * i) / hd);
        if (cfg->rope_factor != 0.0) {
            const double orig = cfg->rope_original_max_pos, lo = cfg->rope_low_freq_factor,
                         hi = cfg->rope_high_freq_factor, wavelen = 2.0 * pi / f;
            if (wavelen > orig / lo) {
                f /= cfg->rope_factor;
            } else if (!(wavelen < orig / hi)) {
                const double s = (orig / wavelen - lo) / (hi - lo);
                f = (1.0 - s) * f / cfg->rope_factor + s * f;
            }
        }
        inv_freq[i] = f;
    }
}

zpp_status zpp_llama_rope_tables(const zpp_llama_config *cfg, int T, float *cos_t, float *sin_t) {
    if (!cfg || !cos_t || !sin_t || T < 1)
        return zpp_error(ZPP_ERR_INVALID, "llama rope tables: cfg, cos_t or sin_t is NULL, or "
                                          "T = %d < 1", T);
    const int half = cfg->n_embd / cfg->n_head / 2;
    double *inv_freq = malloc((size_t)half * sizeof *inv_freq);
    if (!inv_freq) return zpp_error(ZPP_ERR_NOMEM, "llama rope tables: out of host memory");
    zpp_llama_rope_inv_freq(cfg, inv_freq);
    for (int p = 0; p < T; p++)
        for (int i = 0; i < half; i++) {
            const double angle = (double)p * inv_freq[i];
            cos_t[(size_t)p * half + i] = (float)cos(angle);
            sin_t[(size_t)p * half + i] = (float)sin(angle);
        }
    free(inv_freq);
    return ZPP_OK;
}
