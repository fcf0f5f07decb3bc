/* model/gpt2_cpu.c — the CPU reference GPT-2, fp32 arithmetic, matrix
 * products through OpenBLAS (cblas_sgemm). The pieces that are no one
 * family's (linear layers, LayerNorm, causal attention, softmax with
 * cross-entropy) are cpu_kernels.c's; this file composes them into GPT-2's
 * stages and holds what is GPT-2's own.
 *
 * The math, per micro-batch of B sequences of T tokens (N = B*T rows):
 *
 *   x0      = wte[token] + wpe[position]                           stage 0
 *   for each block l = 1..L:                                        stage l
 *     h     = LN1(x);  q,k,v = h Wqkv^T + bqkv (split in n_head heads)
 *     a     = softmax(q k^T / sqrt(hs) + causal mask) v     (per head)
 *     m     = x + a Wproj^T + bproj
 *     x'    = m + gelu(LN2(m) Wfc^T + bfc) Wfc2^T + bfc2
 *   logits  = LNf(xL) wte^T;  loss = mean_i -log softmax(logits_i)[target_i]
 *                                                                 stage L+1
 *   LN(x)   = (x - mean(x)) / sqrt(var(x) + 1e-5) * w + b   (over C)
 *   gelu(u) = u/2 (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3)))   ("tanh" gelu)
 *
 * Backward runs the stages in reverse; each stage turns the gradient of its
 * output (kept in `dres`, the gradient of the residual stream) into the
 * gradient of its input and accumulates (+=) its parameters' gradients into
 * the caller's fp32 unit buffer. The gradient formulas are written next to
 * the code that evaluates them.
 *
 * Activations for max_batch x T are allocated once, in one arena, at create;
 * forward and backward never allocate. Memory (floats), with N = max_batch*T:
 *   per block   16*N*C (residual out, ln1, qkv 3C, attention out, mid,
 *               ln2, fc 4C, gelu 4C) + 4N (LayerNorm statistics)
 *               + max_batch*H*T*T (attention probabilities, for backward)
 *   once        N*C (embedding output) + N*(C+2) (final LN) + N*V (logits,
 *               probabilities, then d logits in place) + N + backward
 *               scratch N*(C + C + 3C + 4C) + T*T + V (the row of logits
 *               keep_logits asks for, copied before the softmax overwrites
 *               it), plus one unit in fp32 when params are bf16 or fp16.
 * With activation checkpointing (cfg.recompute, gpt2.h) a block keeps only
 * its input on the residual stream (N*C, already counted above as the
 * previous block's output or the embedding's): the rest, 15*N*C + 4N +
 * max_batch*H*T*T, is one slab all blocks share, so the model holds (L-1)
 * of those fewer. Each block's backward first runs the block's forward
 * again up to gelu (all but the fc2 product, whose output it does not
 * read), except the last block's, whose activations are still in the slab.
 *
 * Determinism: every loop runs in a fixed order on one thread, so the result
 * is a function of the inputs and of the OpenBLAS build and thread count:
 * OpenBLAS splits sgemm over threads along the output dimensions, never the
 * reduction dimension, so a fixed OPENBLAS_NUM_THREADS gives bit-identical
 * results run to run. The library does not change OpenBLAS's thread count
 * (that is global state the application owns); the tests and
 * scripts/demo.sh run with OPENBLAS_NUM_THREADS=1. Another thread count is
 * reproducible too, but may round differently from one thread. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "model/cpu_kernels.h"
#include "model/gpt2.h"
#include "model/model.h"

/* ------------------------------------------------------------------------ */
/* The model object                                                          */
/* ------------------------------------------------------------------------ */

typedef struct gpt2_cpu {
    zpp_model base; /* first, so a zpp_model* is a gpt2_cpu* */
    zpp_gpt2_config cfg;
    zpp_gpt2_layout lay;
    zpp_gpt2_stages stages;
    size_t nmax; /* max_batch * T: row stride of per-layer activations */

    float *arena;
    /* batch */
    int32_t *tokens, *targets;
    zpp_decoder_calls calls; /* decoder.h */
    zpp_gpt2_acts act; /* activations and backward scratch (gpt2.h) */
    /* The block whose activations the per-layer buffers hold when they are
     * one shared slab (cfg.recompute); 0: none. */
    int slab_block;
    float *datt;     /* T x T */
    float *wbuf;     /* fp32 copy of a bf16/fp16 unit (NULL for fp32 params) */
    float *kept;     /* V: the logits of calls.keep_row (model.h, keep_logits) */

    float loss;
} gpt2_cpu;

/* ---- the tanh GELU, GPT-2's (the rest of the arithmetic: cpu_kernels.h) ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

/* (1 + tanh z)/2 = sigmoid(2z) = 1 / (1 + e^{-2z}): one expf instead of a
 * tanhf (glibc's tanhf goes through expm1f and was a third of the run
 * time). For very negative z, e^{-2z} overflows to +Inf and the result is
 * exactly 0; for large z it is exactly 1: no NaN either way. */
static inline float gelu_sigmoid(float u) {
    float z = GELU_K * (u + GELU_A * u * u * u);
    return 1.0f / (1.0f + expf(-2.0f * z));
}

static void gelu_forward(float *out, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * gelu_sigmoid(inp[i]);
}

/* gelu(u) = u s with s = sigmoid(2z), z = k (u + a u^3); since
 * ds/dz = 2 s (1 - s):
 *   gelu'(u) = s + u * 2 s (1 - s) * k (1 + 3 a u^2).  In place on d. */
static void gelu_backward(float *d, const float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float u = inp[i], s = gelu_sigmoid(u);
        d[i] *= s + u * 2.0f * s * (1.0f - s) * GELU_K * (1.0f + 3.0f * GELU_A * u * u);
    }
}

/* ---- parameters in the working dtype ---- */

/* n elements of a parameter array in `dtype`, from element `off`, as fp32.
 * Exact: bf16 and fp16 values are all representable in fp32. */
static void gpt2_to_f32(float *dst, const void *src, zpp_dtype dtype, size_t off, size_t n) {
    if (dtype == ZPP_BF16) {
        const zpp_bf16 *h = (const zpp_bf16 *)src + off;
        for (size_t i = 0; i < n; i++) dst[i] = zpp_bf16_to_f32(h[i]);
    } else if (dtype == ZPP_FP16) {
        const zpp_fp16 *h = (const zpp_fp16 *)src + off;
        for (size_t i = 0; i < n; i++) dst[i] = zpp_fp16_to_f32(h[i]);
    } else {
        memcpy(dst, (const float *)src + off, n * sizeof(float));
    }
}

/* The unit's parameters as fp32: the caller's buffer for fp32, else the
 * whole unit converted into wbuf. */
static const float *gpt2_params_f32(gpt2_cpu *g, int unit, const void *params) {
    if (g->base.param_dtype == ZPP_FP32) return (const float *)params;
    gpt2_to_f32(g->wbuf, params, g->base.param_dtype, 0, g->stages.t.unit_numel[unit]);
    return g->wbuf;
}

/* ---- stages ---- */

/* Reads only the rows it needs (B*T token rows and T position rows) in the
 * working dtype, so a bf16 wte of V x C is not converted for this stage. */
static void gpt2_embed_forward(gpt2_cpu *g, const void *params) {
    int T = g->cfg.seq_len, C = g->cfg.n_embd, n = g->calls.B * T;
    zpp_dtype dt = g->base.param_dtype;
    float *pe = g->act.dc; /* scratch: one position row */
    for (int r = 0; r < n; r++) {
        float *o = g->act.res + (size_t)r * C;
        gpt2_to_f32(o, params, dt, g->lay.wte + (size_t)g->tokens[r] * C, (size_t)C);
        gpt2_to_f32(pe, params, dt, g->lay.wpe + (size_t)(r % T) * C, (size_t)C);
        for (int c = 0; c < C; c++) o[c] += pe[c];
    }
}

/* Block l's forward up to what its backward reads: the activations from
 * LN1(x) to gelu (y.fcg), not its output. Run by the forward, and again by
 * the backward with checkpointing (gpt2_block_recompute): the same calls on
 * the same input and weights, so the same bits. */
static void gpt2_block_activations(gpt2_cpu *g, int l, const float *w) {
    const zpp_gpt2_layout *L = &g->lay;
    int T = g->cfg.seq_len, C = g->cfg.n_embd, H = g->cfg.n_head, B = g->calls.B, n = B * T;
    size_t sC = (size_t)C;
    const zpp_gpt2_layer y = zpp_gpt2_layer_of(&g->act, &g->cfg, g->base.max_batch, l);

    zpp_cpu_layernorm_forward(y.ln1, y.ln1m, y.ln1r, y.x, w + L->ln1_w, w + L->ln1_b, n, C);
    zpp_cpu_linear_forward(y.qkv, y.ln1, w + L->qkv_w, w + L->qkv_b, n, C, 3 * C, 0);
    zpp_cpu_attention_forward(y.atty, y.att, y.qkv, B, T, C, H);
    memcpy(y.mid, y.x, (size_t)n * sC * sizeof(float));
    zpp_cpu_linear_forward(y.mid, y.atty, w + L->proj_w, w + L->proj_b, n, C, C, 1);
    zpp_cpu_layernorm_forward(y.ln2, y.ln2m, y.ln2r, y.mid, w + L->ln2_w, w + L->ln2_b, n, C);
    zpp_cpu_linear_forward(y.fch, y.ln2, w + L->fc_w, w + L->fc_b, n, C, 4 * C, 0);
    gelu_forward(y.fcg, y.fch, (size_t)n * 4 * sC);
    g->slab_block = l;
}

/* The block's output on the residual stream: out = mid + fcg Wfc2^T + bfc2. */
static void gpt2_block_forward(gpt2_cpu *g, int l, const float *w) {
    const zpp_gpt2_layout *L = &g->lay;
    int C = g->cfg.n_embd, n = g->calls.B * g->cfg.seq_len;
    const zpp_gpt2_layer y = zpp_gpt2_layer_of(&g->act, &g->cfg, g->base.max_batch, l);
    gpt2_block_activations(g, l, w);
    memcpy(y.out, y.mid, (size_t)n * C * sizeof(float));
    zpp_cpu_linear_forward(y.out, y.fcg, w + L->fc2_w, w + L->fc2_b, n, 4 * C, C, 1);
}

/* With checkpointing, block l's activations before its backward: the
 * shared slab holds another block's (every block's forward wrote it in
 * turn) unless l is the last block to have run its forward. The residual
 * entering l (y.x, kept) and the weights the backward gets (the unit the
 * forward read) make them again. */
static void gpt2_block_recompute(gpt2_cpu *g, int l, const float *w) {
    if (g->cfg.recompute && g->slab_block != l) gpt2_block_activations(g, l, w);
}

/* Final LayerNorm, logits = lnf wte^T, softmax and cross-entropy over the
 * first real_vocab_size columns (model.h; cpu_kernels.c has the formula). */
static void gpt2_head_forward(gpt2_cpu *g, const float *w) {
    int C = g->cfg.n_embd, V = g->cfg.vocab_size, Vr = g->base.real_vocab_size,
        L = g->cfg.n_layer, n = g->calls.B * g->cfg.seq_len;
    const float *x = g->act.res + (size_t)L * g->nmax * C;
    zpp_cpu_layernorm_forward(g->act.lnf, g->act.lnf_mean, g->act.lnf_rstd, x, w + g->lay.lnf_w,
                              w + g->lay.lnf_b, n, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, C, 1.0f, g->act.lnf, C,
                w + g->lay.wte, C, 0.0f, g->act.probs, V);
    /* the row a sampler asked for, before the softmax overwrites it */
    const int k = zpp_decoder_kept_in(&g->calls, g->cfg.seq_len, 0, n);
    if (k >= 0) {
        memcpy(g->kept, g->act.probs + (size_t)k * V, (size_t)V * sizeof(float));
        g->calls.kept = 1;
    }
    const int32_t *targets = g->calls.have_targets ? g->targets : NULL;
    double total = zpp_cpu_cross_entropy_forward(g->act.probs, g->act.losses, targets, n, V, Vr);
    g->loss = g->calls.have_targets ? (float)(total / n) : NAN;
}

/* d logits = (softmax - onehot(target)) times loss_scale / n (the mean over
 * n rows and the loss scale), over the probabilities (backward of this
 * stage happens once per forward). Then
 *   d wte  += dlogits^T lnf        (V x n)(n x C)
 *   d lnf   = dlogits wte          (n x V)(V x C)
 * and the final LayerNorm's backward starts dres. */
static void gpt2_head_backward(gpt2_cpu *g, const float *w, float *gr, float loss_scale) {
    int C = g->cfg.n_embd, V = g->cfg.vocab_size, L = g->cfg.n_layer,
        n = g->calls.B * g->cfg.seq_len;
    zpp_cpu_cross_entropy_backward(g->act.probs, g->targets, n, V, loss_scale / (float)n);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, n, 1.0f, g->act.probs, V, g->act.lnf,
                C, 1.0f, gr + g->lay.wte, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, V, 1.0f, g->act.probs, V,
                w + g->lay.wte, C, 0.0f, g->act.dc, C);
    memset(g->act.dres, 0, (size_t)n * C * sizeof(float));
    const float *x = g->act.res + (size_t)L * g->nmax * C;
    zpp_cpu_layernorm_backward(g->act.dres, gr + g->lay.lnf_w, gr + g->lay.lnf_b, g->act.dc, x,
                               w + g->lay.lnf_w, g->act.lnf_mean, g->act.lnf_rstd, n, C);
}

/* Reverse of gpt2_block_forward. On entry dres = d loss / d out; on exit
 * dres = d loss / d x. Each residual add passes dres through unchanged, and
 * the branch's input gradient is added to it. */
static void gpt2_block_backward(gpt2_cpu *g, int l, const float *w, float *gr) {
    const zpp_gpt2_layout *L = &g->lay;
    int T = g->cfg.seq_len, C = g->cfg.n_embd, H = g->cfg.n_head, B = g->calls.B, n = B * T;
    size_t sC = (size_t)C;
    const zpp_gpt2_layer y = zpp_gpt2_layer_of(&g->act, &g->cfg, g->base.max_batch, l);

    gpt2_block_recompute(g, l, w);
    /* MLP branch: out = mid + fc2(gelu(fc(ln2(mid)))) */
    zpp_cpu_linear_backward(g->act.dfc, gr + L->fc2_w, gr + L->fc2_b, g->act.dres, y.fcg,
                            w + L->fc2_w, n, 4 * C, C);
    gelu_backward(g->act.dfc, y.fch, (size_t)n * 4 * sC);
    zpp_cpu_linear_backward(g->act.dc, gr + L->fc_w, gr + L->fc_b, g->act.dfc, y.ln2, w + L->fc_w,
                            n, C, 4 * C);
    zpp_cpu_layernorm_backward(g->act.dres, gr + L->ln2_w, gr + L->ln2_b, g->act.dc, y.mid,
                               w + L->ln2_w, y.ln2m, y.ln2r, n, C);
    /* attention branch: mid = x + proj(attn(qkv(ln1(x)))) */
    zpp_cpu_linear_backward(g->act.dc, gr + L->proj_w, gr + L->proj_b, g->act.dres, y.atty,
                            w + L->proj_w, n, C, C);
    zpp_cpu_attention_backward(g->act.dqkv, g->datt, g->act.dc, y.att, y.qkv, B, T, C, H);
    zpp_cpu_linear_backward(g->act.dc, gr + L->qkv_w, gr + L->qkv_b, g->act.dqkv, y.ln1,
                            w + L->qkv_w, n, C, 3 * C);
    zpp_cpu_layernorm_backward(g->act.dres, gr + L->ln1_w, gr + L->ln1_b, g->act.dc, y.x,
                               w + L->ln1_w, y.ln1m, y.ln1r, n, C);
}

/* x0 = wte[token] + wpe[t]: each row's gradient goes to its token's and its
 * position's rows. Rows in order, so repeated tokens add deterministically. */
static void gpt2_embed_backward(gpt2_cpu *g, float *gr) {
    int T = g->cfg.seq_len, C = g->cfg.n_embd, n = g->calls.B * T;
    float *dwte = gr + g->lay.wte, *dwpe = gr + g->lay.wpe;
    for (int r = 0; r < n; r++) {
        const float *d = g->act.dres + (size_t)r * C;
        float *te = dwte + (size_t)g->tokens[r] * C, *pe = dwpe + (size_t)(r % T) * C;
        for (int c = 0; c < C; c++) {
            te[c] += d[c];
            pe[c] += d[c];
        }
    }
}

/* ---- ops ---- */

static zpp_status gpt2_op_init_params(zpp_model *m, int unit, size_t offset, size_t count,
                                      float *out, uint64_t seed) {
    gpt2_cpu *g = (gpt2_cpu *)m;
    return zpp_gpt2_init_fill(&g->cfg, unit, offset, count, out, seed);
}

static zpp_status gpt2_op_set_batch(zpp_model *m, const int32_t *tokens, const int32_t *targets,
                                    int B) {
    gpt2_cpu *g = (gpt2_cpu *)m;
    ZPP_CHECK(zpp_decoder_check_batch(m, tokens, targets, B, "gpt2"));
    size_t n = (size_t)B * g->cfg.seq_len;
    memcpy(g->tokens, tokens, n * sizeof(int32_t));
    if (targets) memcpy(g->targets, targets, n * sizeof(int32_t));
    zpp_decoder_calls_new_batch(&g->calls, B, targets != NULL);
    g->loss = NAN;
    g->slab_block = 0;
    return ZPP_OK;
}

static zpp_status gpt2_op_forward(zpp_model *m, int stage, const void *params) {
    gpt2_cpu *g = (gpt2_cpu *)m;
    int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_forward(m, &g->calls, stage, params, "gpt2"));
    g->calls.bwd_next = -1;
    if (stage == 0) {
        g->loss = NAN;
        g->calls.kept = 0;
        gpt2_embed_forward(g, params);
    } else if (stage == S - 1) {
        gpt2_head_forward(g, gpt2_params_f32(g, 0, params));
        g->calls.bwd_next = S - 1;
    } else {
        gpt2_block_forward(g, stage, gpt2_params_f32(g, stage, params));
    }
    g->calls.fwd_next = stage + 1;
    return ZPP_OK;
}

static float gpt2_op_loss(zpp_model *m) { return ((gpt2_cpu *)m)->loss; }

static zpp_status gpt2_op_backward(zpp_model *m, int stage, const void *params, void *grads_v,
                                   float loss_scale) {
    float *grads = grads_v; /* fp32: this model has no set_grad_dtype */
    gpt2_cpu *g = (gpt2_cpu *)m;
    int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_backward(m, &g->calls, stage, params, grads, "gpt2"));
    if (stage == S - 1) gpt2_head_backward(g, gpt2_params_f32(g, 0, params), grads, loss_scale);
    else if (stage == 0) gpt2_embed_backward(g, grads); /* needs no parameters */
    else gpt2_block_backward(g, stage, gpt2_params_f32(g, stage, params), grads);
    g->calls.bwd_next = stage - 1;
    return ZPP_OK;
}

static zpp_status gpt2_op_keep_logits(zpp_model *m, int row) {
    return zpp_decoder_keep_logits(m, &((gpt2_cpu *)m)->calls, row, "gpt2");
}

static zpp_status gpt2_op_logits(zpp_model *m, float *out) {
    const gpt2_cpu *g = (const gpt2_cpu *)m;
    return zpp_decoder_logits_host(m, &g->calls, g->kept, out, "gpt2");
}

static void gpt2_op_destroy(zpp_model *m) {
    gpt2_cpu *g = (gpt2_cpu *)m;
    if (!g) return;
    free(g->arena);
    zpp_gpt2_stages_free(&g->stages);
    free(g);
}

static const zpp_model_ops gpt2_cpu_ops = {
    .init_params = gpt2_op_init_params,
    .set_batch = gpt2_op_set_batch,
    .forward = gpt2_op_forward,
    .loss = gpt2_op_loss,
    .backward = gpt2_op_backward,
    .destroy = gpt2_op_destroy,
    .keep_logits = gpt2_op_keep_logits,
    .logits = gpt2_op_logits,
};

/* ---- create ---- */

/* Carves the arena (gpt2.h), each buffer on a 64-byte boundary: the shared
 * activations, then what only this model keeps. Pass 1 (base NULL) only
 * counts; pass 2 hands out pointers. */
static void gpt2_plan(gpt2_cpu *g, zpp_arena *a) {
    size_t N = g->nmax, T = (size_t)g->cfg.seq_len;
    size_t maxunit = g->lay.embed_numel > g->lay.block_numel ? g->lay.embed_numel
                                                             : g->lay.block_numel;
    g->tokens = (int32_t *)zpp_arena_take(a, N, 1); /* int32 fits a float slot */
    g->targets = (int32_t *)zpp_arena_take(a, N, 1);
    zpp_gpt2_acts_plan(&g->cfg, g->base.max_batch, a, &g->act);
    g->datt = zpp_arena_take(a, T, T);
    g->wbuf = g->base.param_dtype == ZPP_FP32 ? NULL : zpp_arena_take(a, maxunit, 1);
    g->kept = zpp_arena_take(a, 1, (size_t)g->cfg.vocab_size);
}

zpp_status zpp_gpt2_cpu_create(const zpp_gpt2_config *cfg, zpp_dtype param_dtype,
                               int max_batch, zpp_model **model_p) {
    zpp_status st = ZPP_OK;
    if (!model_p) return zpp_error(ZPP_ERR_INVALID, "gpt2 create: model_p is NULL");
    ZPP_CHECK(zpp_gpt2_create_check(cfg, param_dtype, max_batch, "gpt2"));

    gpt2_cpu *g = calloc(1, sizeof *g);
    if (!g) return zpp_error(ZPP_ERR_NOMEM, "gpt2 create: out of host memory");
    g->cfg = *cfg;
    zpp_gpt2_layout_make(cfg, &g->lay);
    st = zpp_gpt2_stages_make(cfg, &g->stages);
    if (st != ZPP_OK) goto fail;

    zpp_gpt2_base_fill(&g->base, cfg, param_dtype, max_batch, &g->stages);
    g->base.ops = &gpt2_cpu_ops;
    g->base.mem = ZPP_MEM_HOST;
    g->base.impl = g;
    g->nmax = (size_t)max_batch * cfg->seq_len;

    zpp_arena plan = {NULL, 0, 16, 0};
    gpt2_plan(g, &plan);
    if (plan.overflow) {
        st = zpp_error(ZPP_ERR_NOMEM, "gpt2 create: activation memory for max_batch %d "
                                      "overflows size_t; use a smaller model or batch",
                       max_batch);
        goto fail;
    }
    /* The CPU reference keeps its activations in host memory of its own:
     * it is the host backend's model whatever device the caller holds. */
    size_t arena_bytes = (plan.used ? plan.used : 1) * sizeof(float);
    void *arena = aligned_alloc(64, (arena_bytes + 63) / 64 * 64);
    if (!arena) {
        st = zpp_error(ZPP_ERR_NOMEM,
                       "gpt2 create: could not allocate %zu bytes of activations for "
                       "max_batch %d x seq_len %d",
                       arena_bytes, max_batch, cfg->seq_len);
        goto fail;
    }
    g->arena = arena;
    plan = (zpp_arena){g->arena, 0, 16, 0};
    gpt2_plan(g, &plan);
    g->loss = NAN;
    g->calls.fwd_next = 0;
    g->calls.bwd_next = -1;
    g->calls.keep_row = -1;
    *model_p = &g->base;
    return ZPP_OK;

fail:
    zpp_gpt2_stages_free(&g->stages);
    free(g);
    return st;
}
