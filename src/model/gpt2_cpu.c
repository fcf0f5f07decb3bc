/* model/gpt2_cpu.c — the CPU reference GPT-2, fp32 arithmetic, matrix
 * products through OpenBLAS (cblas_sgemm).
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
#include "model/gpt2.h"
#include "model/model.h"

#define GPT2_LN_EPS 1e-5f

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
    float *datt;     /* T x T */
    float *wbuf;     /* fp32 copy of a bf16/fp16 unit (NULL for fp32 params) */
    float *kept;     /* V: the logits of calls.keep_row (model.h, keep_logits) */

    float loss;
} gpt2_cpu;

/* ---- building blocks (all on the first n rows) ---- */

/* out[n x OC] (= or +=) inp[n x IC] W^T + bias, W is [OC][IC]. */
static void linear_forward(float *out, const float *inp, const float *W, const float *bias,
                           int n, int IC, int OC, int accumulate) {
    for (int r = 0; r < n; r++) {
        float *o = out + (size_t)r * OC;
        if (accumulate)
            for (int j = 0; j < OC; j++) o[j] += bias[j];
        else
            memcpy(o, bias, (size_t)OC * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, OC, IC, 1.0f, inp, IC, W, IC,
                1.0f, out, OC);
}

/* For out = inp W^T + b:
 *   d inp = d out W          (n x OC)(OC x IC)   overwritten
 *   d W  += d out^T inp      (OC x n)(n x IC)
 *   d b  += sum over rows of d out */
static void linear_backward(float *dinp, float *dW, float *db, const float *dout,
                            const float *inp, const float *W, int n, int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, IC, OC, 1.0f, dout, OC, W, IC,
                0.0f, dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, n, 1.0f, dout, OC, inp, IC,
                1.0f, dW, IC);
    for (int r = 0; r < n; r++) {
        const float *d = dout + (size_t)r * OC;
        for (int j = 0; j < OC; j++) db[j] += d[j];
    }
}

/* LayerNorm over the last dimension; keeps mean and 1/std for backward.
 * Two passes (mean, then the mean of squared deviations) so a large mean
 * does not cancel the variance. */
static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int n, int C) {
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * C;
        float *o = out + (size_t)r * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        v /= (float)C;
        float s = 1.0f / sqrtf(v + GPT2_LN_EPS);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* With xh = (x - mean) * rstd and y = xh * w + b, g = dy * w:
 *   d w += dy * xh,  d b += dy
 *   d x += rstd * (g - mean(g) - xh * mean(g * xh))
 * (the two means remove the components of g along the directions that the
 * normalisation projects out: a shift of x and a rescaling of x - mean). */
static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int n, int C) {
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
        float *dx = dinp + (size_t)r * C;
        float m = mean[r], s = rstd[r];
        float gmean = 0.0f, gxmean = 0.0f;
        for (int c = 0; c < C; c++) {
            float xh = (x[c] - m) * s, g = dy[c] * w[c];
            gmean += g;
            gxmean += g * xh;
        }
        gmean /= (float)C;
        gxmean /= (float)C;
        for (int c = 0; c < C; c++) {
            float xh = (x[c] - m) * s, g = dy[c] * w[c];
            dw[c] += dy[c] * xh;
            db[c] += dy[c];
            dx[c] += s * (g - gmean - xh * gxmean);
        }
    }
}

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

/* Causal self-attention for B sequences. qkv rows are [q | k | v], each C
 * wide, head h at columns h*hs..(h+1)*hs-1 of each part. Per (b, h):
 *   P = softmax_rows(Q K^T / sqrt(hs)) with P[t][t2] = 0 for t2 > t
 *   Y = P V
 * Q K^T and P V go through sgemm with leading dimensions 3C / C, so no
 * head is copied; the upper triangle is computed and then zeroed (half the
 * flops of Q K^T wasted, in exchange for BLAS speed). Work O(B H T^2 hs). */
static void attention_forward(float *y, float *att, const float *qkv, int B, int T, int C,
                              int H) {
    int hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *Q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
            const float *K = Q + C, *Vv = Q + 2 * C;
            float *P = att + ((size_t)b * H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, Q, C3, K,
                        C3, 0.0f, P, T);
            for (int t = 0; t < T; t++) {
                float *p = P + (size_t)t * T;
                float mx = p[0];
                for (int t2 = 1; t2 <= t; t2++) mx = p[t2] > mx ? p[t2] : mx;
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    p[t2] = expf(p[t2] - mx);
                    sum += p[t2];
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++) p[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++) p[t2] = 0.0f;
            }
            float *Y = y + (size_t)b * T * C + (size_t)h * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, Vv,
                        C3, 0.0f, Y, C);
        }
    }
}

/* Backward of attention_forward, writing (not accumulating) dqkv:
 *   dP = dY V^T,   dV = P^T dY
 *   dS = P * (dP - rowsum(P * dP))         (softmax Jacobian, row by row)
 *   dQ = dS K / sqrt(hs),   dK = dS^T Q / sqrt(hs)
 * Masked entries have P = 0, so their dS is 0 and they contribute nothing.
 * dS overwrites dP in the T x T scratch. */
static void attention_backward(float *dqkv, float *scratch, const float *dy, const float *att,
                               const float *qkv, int B, int T, int C, int H) {
    int hs = C / H, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
            const float *Q = qkv + qoff, *K = Q + C, *Vv = Q + 2 * C;
            float *dQ = dqkv + qoff, *dK = dQ + C, *dV = dQ + 2 * C;
            const float *P = att + ((size_t)b * H + h) * T * T;
            const float *dY = dy + (size_t)b * T * C + (size_t)h * hs;
            float *dS = scratch;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dY, C, Vv, C3,
                        0.0f, dS, T);
            for (int t = 0; t < T; t++) {
                const float *p = P + (size_t)t * T;
                float *d = dS + (size_t)t * T;
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) dot += p[t2] * d[t2];
                for (int t2 = 0; t2 <= t; t2++) d[t2] = p[t2] * (d[t2] - dot);
                for (int t2 = t + 1; t2 < T; t2++) d[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dS, T, K,
                        C3, 0.0f, dQ, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dS, T, Q, C3,
                        0.0f, dK, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, dY, C,
                        0.0f, dV, C3);
        }
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
    gpt2_to_f32(g->wbuf, params, g->base.param_dtype, 0, g->stages.unit_numel[unit]);
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

static void gpt2_block_forward(gpt2_cpu *g, int l, const float *w) {
    const zpp_gpt2_layout *L = &g->lay;
    int T = g->cfg.seq_len, C = g->cfg.n_embd, H = g->cfg.n_head, B = g->calls.B, n = B * T;
    size_t sC = (size_t)C;
    const zpp_gpt2_layer y = zpp_gpt2_layer_of(&g->act, &g->cfg, g->base.max_batch, l);

    layernorm_forward(y.ln1, y.ln1m, y.ln1r, y.x, w + L->ln1_w, w + L->ln1_b, n, C);
    linear_forward(y.qkv, y.ln1, w + L->qkv_w, w + L->qkv_b, n, C, 3 * C, 0);
    attention_forward(y.atty, y.att, y.qkv, B, T, C, H);
    memcpy(y.mid, y.x, (size_t)n * sC * sizeof(float));
    linear_forward(y.mid, y.atty, w + L->proj_w, w + L->proj_b, n, C, C, 1);
    layernorm_forward(y.ln2, y.ln2m, y.ln2r, y.mid, w + L->ln2_w, w + L->ln2_b, n, C);
    linear_forward(y.fch, y.ln2, w + L->fc_w, w + L->fc_b, n, C, 4 * C, 0);
    gelu_forward(y.fcg, y.fch, (size_t)n * 4 * sC);
    memcpy(y.out, y.mid, (size_t)n * sC * sizeof(float));
    linear_forward(y.out, y.fcg, w + L->fc2_w, w + L->fc2_b, n, 4 * C, C, 1);
}

/* Final LayerNorm, logits = lnf wte^T, softmax and cross-entropy.
 * loss_i = logsumexp(logits_i) - logits_i[target] is evaluated as
 * log(sum exp(l - max)) - (l[target] - max), which neither overflows nor
 * takes the log of an underflowed probability. The softmax runs over the
 * first Vr = real_vocab_size columns (model.h); the padded columns Vr..V-1
 * get probability 0, so the backward's d logits are 0 there. */
static void gpt2_head_forward(gpt2_cpu *g, const float *w) {
    int C = g->cfg.n_embd, V = g->cfg.vocab_size, Vr = g->base.real_vocab_size,
        L = g->cfg.n_layer, n = g->calls.B * g->cfg.seq_len;
    const float *x = g->act.res + (size_t)L * g->nmax * C;
    layernorm_forward(g->act.lnf, g->act.lnf_mean, g->act.lnf_rstd, x, w + g->lay.lnf_w,
                      w + g->lay.lnf_b, n, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, C, 1.0f, g->act.lnf, C,
                w + g->lay.wte, C, 0.0f, g->act.probs, V);
    /* the row a sampler asked for, before the softmax overwrites it */
    const int k = zpp_decoder_kept_in(&g->calls, g->cfg.seq_len, 0, n);
    if (k >= 0) {
        memcpy(g->kept, g->act.probs + (size_t)k * V, (size_t)V * sizeof(float));
        g->calls.kept = 1;
    }
    double total = 0.0;
    for (int r = 0; r < n; r++) {
        float *p = g->act.probs + (size_t)r * V;
        float mx = p[0];
        for (int v = 1; v < Vr; v++) mx = p[v] > mx ? p[v] : mx;
        float lt = g->calls.have_targets ? p[g->targets[r]] - mx : 0.0f;
        float sum = 0.0f;
        for (int v = 0; v < Vr; v++) {
            p[v] = expf(p[v] - mx);
            sum += p[v];
        }
        float inv = 1.0f / sum;
        for (int v = 0; v < Vr; v++) p[v] *= inv;
        for (int v = Vr; v < V; v++) p[v] = 0.0f;
        g->act.losses[r] = logf(sum) - lt;
        total += g->act.losses[r];
    }
    g->loss = g->calls.have_targets ? (float)(total / n) : NAN;
}

/* d loss_i / d logits_i = softmax_i - onehot(target_i) (0 in the padded
 * columns, whose probabilities the forward zeroed); the mean over n
 * rows and the loss scale multiply it by loss_scale / n. Overwrites the
 * probabilities (backward of this stage happens once per forward). Then
 *   d wte  += dlogits^T lnf        (V x n)(n x C)
 *   d lnf   = dlogits wte          (n x V)(V x C)
 * and the final LayerNorm's backward starts dres. */
static void gpt2_head_backward(gpt2_cpu *g, const float *w, float *gr, float loss_scale) {
    int C = g->cfg.n_embd, V = g->cfg.vocab_size, L = g->cfg.n_layer,
        n = g->calls.B * g->cfg.seq_len;
    float f = loss_scale / (float)n;
    for (int r = 0; r < n; r++) {
        float *p = g->act.probs + (size_t)r * V;
        p[g->targets[r]] -= 1.0f;
        for (int v = 0; v < V; v++) p[v] *= f;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, n, 1.0f, g->act.probs, V, g->act.lnf,
                C, 1.0f, gr + g->lay.wte, C);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, V, 1.0f, g->act.probs, V,
                w + g->lay.wte, C, 0.0f, g->act.dc, C);
    memset(g->act.dres, 0, (size_t)n * C * sizeof(float));
    const float *x = g->act.res + (size_t)L * g->nmax * C;
    layernorm_backward(g->act.dres, gr + g->lay.lnf_w, gr + g->lay.lnf_b, g->act.dc, x,
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

    /* MLP branch: out = mid + fc2(gelu(fc(ln2(mid)))) */
    linear_backward(g->act.dfc, gr + L->fc2_w, gr + L->fc2_b, g->act.dres, y.fcg, w + L->fc2_w, n,
                    4 * C, C);
    gelu_backward(g->act.dfc, y.fch, (size_t)n * 4 * sC);
    linear_backward(g->act.dc, gr + L->fc_w, gr + L->fc_b, g->act.dfc, y.ln2, w + L->fc_w, n, C,
                    4 * C);
    layernorm_backward(g->act.dres, gr + L->ln2_w, gr + L->ln2_b, g->act.dc, y.mid, w + L->ln2_w,
                       y.ln2m, y.ln2r, n, C);
    /* attention branch: mid = x + proj(attn(qkv(ln1(x)))) */
    linear_backward(g->act.dc, gr + L->proj_w, gr + L->proj_b, g->act.dres, y.atty, w + L->proj_w,
                    n, C, C);
    attention_backward(g->act.dqkv, g->datt, g->act.dc, y.att, y.qkv, B, T, C, H);
    linear_backward(g->act.dc, gr + L->qkv_w, gr + L->qkv_b, g->act.dqkv, y.ln1, w + L->qkv_w, n, C,
                    3 * C);
    layernorm_backward(g->act.dres, gr + L->ln1_w, gr + L->ln1_b, g->act.dc, y.x, w + L->ln1_w,
                       y.ln1m, y.ln1r, n, C);
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

static zpp_status gpt2_op_backward(zpp_model *m, int stage, const void *params, float *grads,
                                   float loss_scale) {
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
    gpt2_cpu *g = (gpt2_cpu *)m;
    ZPP_CHECK(zpp_decoder_check_keep_logits(m, row, "gpt2"));
    g->calls.keep_row = row;
    g->calls.kept = 0;
    return ZPP_OK;
}

static zpp_status gpt2_op_logits(zpp_model *m, float *out) {
    gpt2_cpu *g = (gpt2_cpu *)m;
    ZPP_CHECK(zpp_decoder_check_logits(m, &g->calls, out, "gpt2"));
    memcpy(out, g->kept, (size_t)g->cfg.vocab_size * sizeof(float));
    return ZPP_OK;
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
