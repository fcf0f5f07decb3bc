/* model/llama_cpu.c — the CPU reference Llama, fp32 arithmetic, matrix
 * products through OpenBLAS. The pieces any decoder shares (linear layers,
 * RMSNorm, grouped-query causal attention, softmax with cross-entropy) are
 * cpu_kernels.c's; this file composes them into Llama's stages and holds
 * what is Llama's own: rotary position embedding and the SwiGLU MLP.
 *
 * The math, per micro-batch of B sequences of T tokens (N = B*T rows),
 * with hd = C / H the head dim:
 *
 *   x0      = wte[token]                                           stage 0
 *   for each block l = 1..L:                                        stage l
 *     h     = RMS1(x);  q,k,v = h Wqkv^T (+ bqkv)   (H query heads, KV k/v)
 *     q,k   = RoPE(q), RoPE(k)          (each head, at the row's position)
 *     a     = softmax(q k^T / sqrt(hd) + causal mask) v
 *             (query head j reads k/v head j / (H / KV))
 *     m     = x + a Wo^T (+ bo)
 *     x'    = m + (silu(RMS2(m) Wgate^T) * RMS2(m) Wup^T) Wdown^T
 *   logits  = RMSf(xL) Whead^T (Whead = wte when tied)
 *   loss    = mean_i -log softmax(logits_i)[target_i] over real_vocab_size
 *                                                                 stage L+1
 *   RMS(x)  = x / sqrt(mean(x^2) + eps) * w                       (over C)
 *   silu(u) = u * sigmoid(u)
 *   RoPE    pair (i, i + hd/2) of a head at position p turns by the angle
 *           p * inv_freq[i] (zpp_llama_rope_inv_freq): HF's rotate-half,
 *           (a, b) -> (a cos - b sin, b cos + a sin).
 *
 * A rotation is orthogonal, so RoPE's backward is the rotation by the
 * opposite angle, and the attention's gradient with respect to the rotated
 * q and k goes back through it to the projection. Backward runs the stages
 * in reverse, keeping the residual stream's gradient in `dres` and adding
 * (+=) every parameter's gradient into the caller's fp32 unit buffer.
 *
 * Params in bf16 or fp16 are widened to fp32 (exactly) before use: the
 * embedding reads its B*T rows straight from the working dtype, the other
 * stages convert their whole unit into one buffer, as gpt2_cpu.c does.
 * Activations for max_batch x T are allocated once, in one arena, at
 * create; forward and backward never allocate. With activation
 * checkpointing (cfg.recompute) a block keeps only its input on the
 * residual stream; the rest of its activations live in one slab all blocks
 * share, and its backward first runs its forward again up to SwiGLU
 * (unless it was the last block forward, whose activations are still
 * there): the same calls on the same inputs, so the same bits. Every loop runs in a fixed
 * order on one thread (gpt2_cpu.c, "Determinism"). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/cpu_kernels.h"
#include "model/decoder.h"
#include "model/llama.h"

/* What the model keeps, for max_batch sequences: N = max_batch * T rows;
 * per-block buffers are L slabs (block l's at (l-1) * rows * width), or
 * one slab that every block shares with cfg.recompute (the residual stream
 * res keeps all L+1 either way: each block's input is its checkpoint). */
typedef struct llama_acts {
    float *res;         /* (L+1) x N x C: res[0] embedding, res[l] block l's output */
    float *h1, *r1;     /* L x N x C, L x N: RMS1 output and its 1/rms */
    float *qkv;         /* L x N x Wqkv: q, k rotated */
    float *att;         /* L x max_batch x H x T x T: softmax probabilities */
    float *atty;        /* L x N x C: attention output before Wo */
    float *mid;         /* L x N x C: residual after attention */
    float *h2, *r2;     /* as h1, r1 */
    float *gu;          /* L x N x 2F: [gate | up] before the activation */
    float *act;         /* L x N x F: silu(gate) * up */
    float *hf, *rf;     /* N x C, N: final RMSNorm */
    float *probs;       /* N x V: logits -> probabilities -> d logits */
    float *losses;      /* N */
    float *dres, *dc;   /* N x C each */
    float *dqkv, *dgu;  /* N x Wqkv, N x 2F */
    float *dact;        /* N x F */
} llama_acts;

typedef struct llama_cpu {
    zpp_model base; /* first: the model is the zpp_model */
    zpp_llama_config cfg;
    zpp_llama_layout lay;
    zpp_llama_stages stages;
    zpp_decoder_calls calls;
    size_t nmax; /* max_batch * seq_len */
    int wqkv;    /* width of a qkv row: (H + 2 KV) hd */
    float *arena;
    int32_t *tokens, *targets;
    llama_acts a;
    float *rope_cos, *rope_sin; /* T x hd/2 */
    float *datt;                /* T x T attention backward scratch */
    float *wbuf;                /* one unit in fp32 (bf16/fp16 params), else NULL */
    float *kept;                /* vocab_size: keep_logits's row */
    float loss;
    int slab_block; /* with recompute, the block whose activations the slab holds (0: none) */
} llama_cpu;

/* Block l's slices of the per-block buffers. */
typedef struct llama_layer {
    const float *x;
    float *out, *h1, *r1, *qkv, *att, *atty, *mid, *h2, *r2, *gu, *act;
} llama_layer;

static llama_layer layer_of(const llama_cpu *g, int l) {
    const size_t N = g->nmax, C = (size_t)g->cfg.n_embd, F = (size_t)g->cfg.n_ffn;
    const size_t T = (size_t)g->cfg.seq_len, r = (size_t)(l - 1);
    const size_t k = g->cfg.recompute ? 0 : r; /* the slab */
    const size_t att = (size_t)g->base.max_batch * (size_t)g->cfg.n_head * T * T;
    llama_layer y;
    y.x = g->a.res + r * N * C;
    y.out = g->a.res + (r + 1) * N * C;
    y.h1 = g->a.h1 + k * N * C;
    y.r1 = g->a.r1 + k * N;
    y.qkv = g->a.qkv + k * N * (size_t)g->wqkv;
    y.att = g->a.att + k * att;
    y.atty = g->a.atty + k * N * C;
    y.mid = g->a.mid + k * N * C;
    y.h2 = g->a.h2 + k * N * C;
    y.r2 = g->a.r2 + k * N;
    y.gu = g->a.gu + k * N * 2 * F;
    y.act = g->a.act + k * N * F;
    return y;
}

/* ---- parameters in the working dtype ---- */

/* The unit's parameters as fp32: the caller's buffer for fp32, else the
 * whole unit widened into wbuf (exact: every bf16/fp16 value is an fp32). */
static const float *params_f32(llama_cpu *g, int unit, const void *params) {
    const zpp_dtype dt = g->base.param_dtype;
    if (dt == ZPP_FP32) return (const float *)params;
    const size_t n = g->stages.t.unit_numel[unit];
    for (size_t i = 0; i < n; i++) g->wbuf[i] = zpp_load_f32(params, dt, i);
    return g->wbuf;
}

/* ---- Llama's own pieces: RoPE and SwiGLU ---- */

/* Turns every head of every row of buf (rows of `width` floats; `heads`
 * heads of hd from column col0) by its position's angles: sign +1 is RoPE,
 * sign -1 its inverse (the rotation by minus the angle, which is also its
 * transpose: what the backward applies to the gradient). */
static void rope_apply(const llama_cpu *g, float *buf, int n, int width, int col0, int heads,
                       float sign) {
    const int T = g->cfg.seq_len, hd = g->cfg.n_embd / g->cfg.n_head, half = hd / 2;
    for (int r = 0; r < n; r++) {
        const float *cs = g->rope_cos + (size_t)(r % T) * half;
        const float *sn = g->rope_sin + (size_t)(r % T) * half;
        for (int h = 0; h < heads; h++) {
            float *v = buf + (size_t)r * width + col0 + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half], s = sign * sn[i];
                v[i] = a * cs[i] - b * s;
                v[i + half] = b * cs[i] + a * s;
            }
        }
    }
}

/* act = silu(gate) * up, from rows [gate | up] of 2F. */
static void swiglu_forward(float *act, const float *gu, int n, int F) {
    for (int r = 0; r < n; r++) {
        const float *gt = gu + (size_t)r * 2 * F, *up = gt + F;
        float *o = act + (size_t)r * F;
        for (int j = 0; j < F; j++) {
            const float s = 1.0f / (1.0f + expf(-gt[j]));
            o[j] = gt[j] * s * up[j];
        }
    }
}

/* With s = sigmoid(g): d up = d act * silu(g), and d gate = d act * up *
 * silu'(g), silu'(g) = s (1 + g (1 - s)). Writes rows [d gate | d up]. */
static void swiglu_backward(float *dgu, const float *dact, const float *gu, int n, int F) {
    for (int r = 0; r < n; r++) {
        const float *gt = gu + (size_t)r * 2 * F, *up = gt + F, *d = dact + (size_t)r * F;
        float *dg = dgu + (size_t)r * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) {
            const float s = 1.0f / (1.0f + expf(-gt[j]));
            du[j] = d[j] * gt[j] * s;
            dg[j] = d[j] * up[j] * s * (1.0f + gt[j] * (1.0f - s));
        }
    }
}

/* ---- stages ---- */

/* x0 = wte[token], read row by row in the working dtype. */
static void embed_forward(llama_cpu *g, const void *params) {
    const int C = g->cfg.n_embd, n = g->calls.B * g->cfg.seq_len;
    const zpp_dtype dt = g->base.param_dtype;
    for (int r = 0; r < n; r++) {
        float *o = g->a.res + (size_t)r * C;
        const size_t row = g->lay.wte + (size_t)g->tokens[r] * C;
        for (int c = 0; c < C; c++) o[c] = zpp_load_f32(params, dt, row + (size_t)c);
    }
}

/* Block l's forward up to what its backward reads (everything but its
 * output): run by the forward, and again by the backward with recompute
 * (block_backward), the same calls on the same input and weights. */
static void block_activations(llama_cpu *g, int l, const float *w) {
    const zpp_llama_layout *L = &g->lay;
    const int T = g->cfg.seq_len, C = g->cfg.n_embd, F = g->cfg.n_ffn, H = g->cfg.n_head,
              KV = g->cfg.n_kv_head, B = g->calls.B, n = B * T, hd = C / H;
    const float eps = (float)g->cfg.norm_eps;
    const llama_layer y = layer_of(g, l);
    /* attention branch: mid = x + attn(RoPE(qkv(RMS1(x)))) Wo^T */
    zpp_cpu_rmsnorm_forward(y.h1, y.r1, y.x, w + L->norm1, n, C, eps);
    zpp_cpu_linear_forward(y.qkv, y.h1, w + L->wqkv, g->cfg.qkv_bias ? w + L->bqkv : NULL, n, C,
                           g->wqkv, 0);
    rope_apply(g, y.qkv, n, g->wqkv, 0, H, 1.0f);  /* q */
    rope_apply(g, y.qkv, n, g->wqkv, C, KV, 1.0f); /* k */
    zpp_cpu_gqa_attention_forward(y.atty, y.att, y.qkv, B, T, H, KV, hd);
    memcpy(y.mid, y.x, (size_t)n * C * sizeof(float));
    zpp_cpu_linear_forward(y.mid, y.atty, w + L->wo, g->cfg.o_bias ? w + L->bo : NULL, n, C, C,
                           1);
    /* MLP branch: out = mid + swiglu(RMS2(mid)) Wdown^T */
    zpp_cpu_rmsnorm_forward(y.h2, y.r2, y.mid, w + L->norm2, n, C, eps);
    zpp_cpu_linear_forward(y.gu, y.h2, w + L->wgu, NULL, n, C, 2 * F, 0);
    swiglu_forward(y.act, y.gu, n, F);
    g->slab_block = l;
}

/* The block's output on the residual stream: out = mid + act Wdown^T. */
static void block_forward(llama_cpu *g, int l, const float *w) {
    const int C = g->cfg.n_embd, F = g->cfg.n_ffn, n = g->calls.B * g->cfg.seq_len;
    const llama_layer y = layer_of(g, l);
    block_activations(g, l, w);
    memcpy(y.out, y.mid, (size_t)n * C * sizeof(float));
    zpp_cpu_linear_forward(y.out, y.act, w + g->lay.wdown, NULL, n, F, C, 1);
}

/* The head's weight: its own matrix when untied, else the embedding. */
static size_t head_offset(const llama_cpu *g) {
    return g->cfg.untied_head ? g->lay.head : g->lay.wte;
}

/* Final RMSNorm, logits = hf Whead^T, softmax and cross-entropy over the
 * first real_vocab_size columns (cpu_kernels.c has the formula). */
static void head_forward(llama_cpu *g, const float *w) {
    const int C = g->cfg.n_embd, V = g->cfg.vocab_size, n = g->calls.B * g->cfg.seq_len;
    const float *x = g->a.res + (size_t)g->cfg.n_layer * g->nmax * C;
    zpp_cpu_rmsnorm_forward(g->a.hf, g->a.rf, x, w + g->lay.norm_f, n, C, (float)g->cfg.norm_eps);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, C, 1.0f, g->a.hf, C,
                w + head_offset(g), C, 0.0f, g->a.probs, V);
    /* the row a sampler asked for, before the softmax overwrites it */
    const int k = zpp_decoder_kept_in(&g->calls, g->cfg.seq_len, 0, n);
    if (k >= 0) {
        memcpy(g->kept, g->a.probs + (size_t)k * V, (size_t)V * sizeof(float));
        g->calls.kept = 1;
    }
    const int32_t *targets = g->calls.have_targets ? g->targets : NULL;
    double total = zpp_cpu_cross_entropy_forward(g->a.probs, g->a.losses, targets, n, V,
                                                 g->cfg.real_vocab_size);
    g->loss = g->calls.have_targets ? (float)(total / n) : NAN;
}

/* d logits = (softmax - onehot) * loss_scale / n; then
 *   d Whead += dlogits^T hf,   d hf = dlogits Whead
 * (tied: d Whead is d wte, which the embedding's backward adds to too),
 * and the final RMSNorm's backward starts dres. */
static void head_backward(llama_cpu *g, const float *w, float *gr, float loss_scale) {
    const int C = g->cfg.n_embd, V = g->cfg.vocab_size, n = g->calls.B * g->cfg.seq_len;
    const size_t wh = head_offset(g);
    zpp_cpu_cross_entropy_backward(g->a.probs, g->targets, n, V, loss_scale / (float)n);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, n, 1.0f, g->a.probs, V, g->a.hf, C,
                1.0f, gr + wh, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, V, 1.0f, g->a.probs, V, w + wh,
                C, 0.0f, g->a.dc, C);
    memset(g->a.dres, 0, (size_t)n * C * sizeof(float));
    const float *x = g->a.res + (size_t)g->cfg.n_layer * g->nmax * C;
    zpp_cpu_rmsnorm_backward(g->a.dres, gr + g->lay.norm_f, g->a.dc, x, w + g->lay.norm_f,
                             g->a.rf, n, C);
}

/* Reverse of block_forward. On entry dres = d loss / d out, on exit
 * d loss / d x: each residual add passes dres through, and each branch's
 * input gradient is added to it by its RMSNorm's backward. */
static void block_backward(llama_cpu *g, int l, const float *w, float *gr) {
    const zpp_llama_layout *L = &g->lay;
    const int T = g->cfg.seq_len, C = g->cfg.n_embd, F = g->cfg.n_ffn, H = g->cfg.n_head,
              KV = g->cfg.n_kv_head, B = g->calls.B, n = B * T, hd = C / H;
    const llama_layer y = layer_of(g, l);
    llama_acts *a = &g->a;
    /* with recompute, the shared slab holds another block's activations
     * unless l ran its forward last: its kept input makes them again */
    if (g->cfg.recompute && g->slab_block != l) block_activations(g, l, w);
    /* MLP branch */
    zpp_cpu_linear_backward(a->dact, gr + L->wdown, NULL, a->dres, y.act, w + L->wdown, n, F, C);
    swiglu_backward(a->dgu, a->dact, y.gu, n, F);
    zpp_cpu_linear_backward(a->dc, gr + L->wgu, NULL, a->dgu, y.h2, w + L->wgu, n, C, 2 * F);
    zpp_cpu_rmsnorm_backward(a->dres, gr + L->norm2, a->dc, y.mid, w + L->norm2, y.r2, n, C);
    /* attention branch; the gradient of the rotated q, k turned back */
    zpp_cpu_linear_backward(a->dc, gr + L->wo, g->cfg.o_bias ? gr + L->bo : NULL, a->dres, y.atty,
                            w + L->wo, n, C, C);
    zpp_cpu_gqa_attention_backward(a->dqkv, g->datt, a->dc, y.att, y.qkv, B, T, H, KV, hd);
    rope_apply(g, a->dqkv, n, g->wqkv, 0, H, -1.0f);
    rope_apply(g, a->dqkv, n, g->wqkv, C, KV, -1.0f);
    zpp_cpu_linear_backward(a->dc, gr + L->wqkv, g->cfg.qkv_bias ? gr + L->bqkv : NULL, a->dqkv,
                            y.h1, w + L->wqkv, n, C, g->wqkv);
    zpp_cpu_rmsnorm_backward(a->dres, gr + L->norm1, a->dc, y.x, w + L->norm1, y.r1, n, C);
}

/* x0 = wte[token]: each row's gradient goes to its token's row, rows in
 * order so repeated tokens add deterministically. */
static void embed_backward(llama_cpu *g, float *gr) {
    const int C = g->cfg.n_embd, n = g->calls.B * g->cfg.seq_len;
    for (int r = 0; r < n; r++) {
        const float *d = g->a.dres + (size_t)r * C;
        float *te = gr + g->lay.wte + (size_t)g->tokens[r] * C;
        for (int c = 0; c < C; c++) te[c] += d[c];
    }
}

/* ---- ops ---- */

static zpp_status op_init_params(zpp_model *m, int unit, size_t offset, size_t count, float *out,
                                 uint64_t seed) {
    return zpp_llama_init_fill(&((llama_cpu *)m)->cfg, unit, offset, count, out, seed);
}

static zpp_status op_set_batch(zpp_model *m, const int32_t *tokens, const int32_t *targets,
                               int B) {
    llama_cpu *g = (llama_cpu *)m;
    ZPP_CHECK(zpp_decoder_check_batch(m, tokens, targets, B, "llama"));
    const size_t n = (size_t)B * g->cfg.seq_len;
    memcpy(g->tokens, tokens, n * sizeof(int32_t));
    if (targets) memcpy(g->targets, targets, n * sizeof(int32_t));
    zpp_decoder_calls_new_batch(&g->calls, B, targets != NULL);
    g->loss = NAN;
    g->slab_block = 0;
    return ZPP_OK;
}

static zpp_status op_forward(zpp_model *m, int stage, const void *params) {
    llama_cpu *g = (llama_cpu *)m;
    const int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_forward(m, &g->calls, stage, params, "llama"));
    g->calls.bwd_next = -1;
    if (stage == 0) {
        g->loss = NAN;
        g->calls.kept = 0;
        embed_forward(g, params);
    } else if (stage == S - 1) {
        head_forward(g, params_f32(g, 0, params));
        g->calls.bwd_next = S - 1;
    } else {
        block_forward(g, stage, params_f32(g, stage, params));
    }
    g->calls.fwd_next = stage + 1;
    return ZPP_OK;
}

static float op_loss(zpp_model *m) { return ((llama_cpu *)m)->loss; }

static zpp_status op_backward(zpp_model *m, int stage, const void *params, void *grads_v,
                              float loss_scale) {
    float *grads = grads_v; /* fp32: this model has no set_grad_dtype */
    llama_cpu *g = (llama_cpu *)m;
    const int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_backward(m, &g->calls, stage, params, grads, "llama"));
    if (stage == S - 1) head_backward(g, params_f32(g, 0, params), grads, loss_scale);
    else if (stage == 0) embed_backward(g, grads); /* needs no parameters */
    else block_backward(g, stage, params_f32(g, stage, params), grads);
    g->calls.bwd_next = stage - 1;
    return ZPP_OK;
}

static zpp_status op_keep_logits(zpp_model *m, int row) {
    return zpp_decoder_keep_logits(m, &((llama_cpu *)m)->calls, row, "llama");
}

static zpp_status op_logits(zpp_model *m, float *out) {
    const llama_cpu *g = (const llama_cpu *)m;
    return zpp_decoder_logits_host(m, &g->calls, g->kept, out, "llama");
}

static void op_destroy(zpp_model *m) {
    llama_cpu *g = (llama_cpu *)m;
    if (!g) return;
    free(g->arena);
    zpp_llama_stages_free(&g->stages);
    free(g);
}

static const zpp_model_ops llama_cpu_ops = {
    .init_params = op_init_params,
    .set_batch = op_set_batch,
    .forward = op_forward,
    .loss = op_loss,
    .backward = op_backward,
    .destroy = op_destroy,
    .keep_logits = op_keep_logits,
    .logits = op_logits,
};

/* ---- create ---- */

/* Carves the arena: pass 1 (base NULL) only counts, pass 2 hands out the
 * same pointers. */
static void plan(llama_cpu *g, zpp_arena *ar) {
    const size_t N = g->nmax, L = (size_t)g->cfg.n_layer, C = (size_t)g->cfg.n_embd;
    const size_t F = (size_t)g->cfg.n_ffn, T = (size_t)g->cfg.seq_len;
    const size_t V = (size_t)g->cfg.vocab_size;
    const size_t H = (size_t)g->cfg.n_head, Wq = (size_t)g->wqkv, hd = C / H;
    const size_t unit = g->lay.embed_numel > g->lay.block_numel ? g->lay.embed_numel
                                                                : g->lay.block_numel;
    const size_t S = g->cfg.recompute ? 1 : L; /* slabs of per-block buffers */
    llama_acts *a = &g->a;
    g->tokens = (int32_t *)zpp_arena_take(ar, N, 1); /* int32 fits a float slot */
    g->targets = (int32_t *)zpp_arena_take(ar, N, 1);
    a->res = zpp_arena_take(ar, (L + 1) * N, C);
    a->h1 = zpp_arena_take(ar, S * N, C);
    a->r1 = zpp_arena_take(ar, S, N);
    a->qkv = zpp_arena_take(ar, S * N, Wq);
    a->att = zpp_arena_take(ar, S * (size_t)g->base.max_batch * H, T * T);
    a->atty = zpp_arena_take(ar, S * N, C);
    a->mid = zpp_arena_take(ar, S * N, C);
    a->h2 = zpp_arena_take(ar, S * N, C);
    a->r2 = zpp_arena_take(ar, S, N);
    a->gu = zpp_arena_take(ar, S * N, 2 * F);
    a->act = zpp_arena_take(ar, S * N, F);
    a->hf = zpp_arena_take(ar, N, C);
    a->rf = zpp_arena_take(ar, N, 1);
    a->probs = zpp_arena_take(ar, N, V);
    a->losses = zpp_arena_take(ar, N, 1);
    a->dres = zpp_arena_take(ar, N, C);
    a->dc = zpp_arena_take(ar, N, C);
    a->dqkv = zpp_arena_take(ar, N, Wq);
    a->dgu = zpp_arena_take(ar, N, 2 * F);
    a->dact = zpp_arena_take(ar, N, F);
    g->rope_cos = zpp_arena_take(ar, T, hd / 2);
    g->rope_sin = zpp_arena_take(ar, T, hd / 2);
    g->datt = zpp_arena_take(ar, T, T);
    g->wbuf = g->base.param_dtype == ZPP_FP32 ? NULL : zpp_arena_take(ar, unit, 1);
    g->kept = zpp_arena_take(ar, 1, V);
}

/* cos and sin of every position's angles (llama.c, shared with the CUDA
 * kernels' table). */
static zpp_status rope_tables(llama_cpu *g) {
    return zpp_llama_rope_tables(&g->cfg, g->cfg.seq_len, g->rope_cos, g->rope_sin);
}

/* The arena, counted then carved; ZPP_ERR_NOMEM when it overflows or
 * cannot be had. */
static zpp_status arena_make(llama_cpu *g) {
    zpp_arena count = {NULL, 0, 16, 0};
    plan(g, &count);
    if (count.overflow)
        return zpp_error(ZPP_ERR_NOMEM, "llama create: activation memory for max_batch %d "
                                        "overflows size_t; use a smaller model or batch",
                         g->base.max_batch);
    const size_t bytes = (count.used ? count.used : 1) * sizeof(float);
    g->arena = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!g->arena)
        return zpp_error(ZPP_ERR_NOMEM,
                         "llama create: could not allocate %zu bytes of activations for "
                         "max_batch %d x seq_len %d",
                         bytes, g->base.max_batch, g->cfg.seq_len);
    zpp_arena carve = {g->arena, 0, 16, 0};
    plan(g, &carve);
    return ZPP_OK;
}

zpp_status zpp_llama_cpu_create(const zpp_llama_config *cfg, zpp_dtype param_dtype,
                                int max_batch, zpp_model **model_p) {
    if (!cfg || !model_p) return zpp_error(ZPP_ERR_INVALID, "llama create: cfg or model_p is NULL");
    ZPP_CHECK(zpp_decoder_check_create(param_dtype, max_batch, cfg->seq_len, "llama"));
    llama_cpu *g = calloc(1, sizeof *g);
    if (!g) return zpp_error(ZPP_ERR_NOMEM, "llama create: out of host memory");
    g->cfg = *cfg;
    zpp_llama_layout_make(cfg, &g->lay);
    g->wqkv = (cfg->n_head + 2 * cfg->n_kv_head) * (cfg->n_embd / cfg->n_head);
    g->nmax = (size_t)max_batch * cfg->seq_len;
    zpp_status st = zpp_llama_stages_make(cfg, &g->stages);
    if (st != ZPP_OK) goto fail;
    zpp_llama_base_fill(&g->base, cfg, param_dtype, max_batch, &g->stages);
    g->base.ops = &llama_cpu_ops;
    g->base.mem = ZPP_MEM_HOST;
    g->base.impl = g;
    st = arena_make(g);
    if (st == ZPP_OK) st = rope_tables(g);
    if (st != ZPP_OK) goto fail;
    g->loss = NAN;
    g->calls.fwd_next = 0;
    g->calls.bwd_next = -1;
    g->calls.keep_row = -1;
    *model_p = &g->base;
    return ZPP_OK;

fail:
    free(g->arena);
    zpp_llama_stages_free(&g->stages);
    free(g);
    return st;
}
