/* model/cpu_kernels.c — the CPU reference's arithmetic that any decoder
 * family composes (cpu_kernels.h): matrix products through OpenBLAS,
 * LayerNorm, RMSNorm, causal attention, softmax with cross-entropy. fp32,
 * every loop in a fixed order on one thread (gpt2_cpu.c, "Determinism"). */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/cpu_kernels.h"

/* out[n x OC] (= or +=) inp[n x IC] W^T + bias, W is [OC][IC]; bias NULL:
 * none. */
void zpp_cpu_linear_forward(float *out, const float *inp, const float *W, const float *bias, int n,
                            int IC, int OC, int accumulate) {
    for (int r = 0; r < n; r++) {
        float *o = out + (size_t)r * OC;
        if (!bias) {
            if (!accumulate) memset(o, 0, (size_t)OC * sizeof(float));
        } else if (accumulate) {
            for (int j = 0; j < OC; j++) o[j] += bias[j];
        } else {
            memcpy(o, bias, (size_t)OC * sizeof(float));
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, OC, IC, 1.0f, inp, IC, W, IC,
                1.0f, out, OC);
}

/* For out = inp W^T + b:
 *   d inp = d out W          (n x OC)(OC x IC)   overwritten
 *   d W  += d out^T inp      (OC x n)(n x IC)
 *   d b  += sum over rows of d out */
void zpp_cpu_linear_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp,
                             const float *W, int n, int IC, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, IC, OC, 1.0f, dout, OC, W, IC, 0.0f,
                dinp, IC);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, n, 1.0f, dout, OC, inp, IC,
                1.0f, dW, IC);
    for (int r = 0; db && r < n; r++) {
        const float *d = dout + (size_t)r * OC;
        for (int j = 0; j < OC; j++) db[j] += d[j];
    }
}

/* LayerNorm over the last dimension; keeps mean and 1/std for backward.
 * Two passes (mean, then the mean of squared deviations) so a large mean
 * does not cancel the variance. */
void zpp_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
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
        float s = 1.0f / sqrtf(v + ZPP_CPU_LN_EPS);
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
void zpp_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
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

/* Causal self-attention for B sequences, grouped-query. A qkv row is
 * [q | k | v]: H query heads, then KV key heads, then KV value heads, each
 * hs wide (W = (H + 2 KV) hs floats); query head h reads key/value head
 * h / (H / KV), so a group of H / KV query heads shares one (KV = H: every
 * head its own, GPT-2's multi-head attention). Per (b, h):
 *   P = softmax_rows(Q K^T / sqrt(hs)) with P[t][t2] = 0 for t2 > t
 *   Y = P V
 * Q K^T and P V go through sgemm with leading dimensions W / H hs, so no
 * head is copied; the upper triangle is computed and then zeroed (half the
 * flops of Q K^T wasted, in exchange for BLAS speed). Work O(B H T^2 hs). */
void zpp_cpu_gqa_attention_forward(float *y, float *att, const float *qkv, int B, int T, int H,
                                   int KV, int hs) {
    const int C = H * hs, W = (H + 2 * KV) * hs, group = H / KV;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const float *row0 = qkv + (size_t)b * T * W;
            const float *Q = row0 + (size_t)h * hs;
            const float *K = row0 + C + (size_t)(h / group) * hs, *Vv = K + (size_t)KV * hs;
            float *P = att + ((size_t)b * H + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, Q, W, K, W,
                        0.0f, P, T);
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
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, Vv, W,
                        0.0f, Y, C);
        }
    }
}

void zpp_cpu_attention_forward(float *y, float *att, const float *qkv, int B, int T, int C, int H) {
    zpp_cpu_gqa_attention_forward(y, att, qkv, B, T, H, H, C / H);
}

/* Backward of zpp_cpu_gqa_attention_forward, writing (not accumulating)
 * dqkv:
 *   dP = dY V^T,   dV = P^T dY
 *   dS = P * (dP - rowsum(P * dP))         (softmax Jacobian, row by row)
 *   dQ = dS K / sqrt(hs),   dK = dS^T Q / sqrt(hs)
 * A shared key/value head gets the sum of its group's dK and dV: the first
 * query head of the group writes them (beta 0), the others add (beta 1).
 * Masked entries have P = 0, so their dS is 0 and they contribute nothing.
 * dS overwrites dP in the T x T scratch. */
void zpp_cpu_gqa_attention_backward(float *dqkv, float *scratch, const float *dy,
                                    const float *att, const float *qkv, int B, int T, int H,
                                    int KV, int hs) {
    const int C = H * hs, W = (H + 2 * KV) * hs, group = H / KV;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const size_t row0 = (size_t)b * T * W, qoff = row0 + (size_t)h * hs;
            const size_t koff = row0 + C + (size_t)(h / group) * hs, voff = koff + (size_t)KV * hs;
            const float *Q = qkv + qoff, *K = qkv + koff, *Vv = qkv + voff;
            float *dQ = dqkv + qoff, *dK = dqkv + koff, *dV = dqkv + voff;
            const float beta = h % group == 0 ? 0.0f : 1.0f;
            const float *P = att + ((size_t)b * H + h) * T * T;
            const float *dY = dy + (size_t)b * T * C + (size_t)h * hs;
            float *dS = scratch;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dY, C, Vv, W,
                        0.0f, dS, T);
            for (int t = 0; t < T; t++) {
                const float *p = P + (size_t)t * T;
                float *d = dS + (size_t)t * T;
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) dot += p[t2] * d[t2];
                for (int t2 = 0; t2 <= t; t2++) d[t2] = p[t2] * (d[t2] - dot);
                for (int t2 = t + 1; t2 < T; t2++) d[t2] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dS, T, K, W,
                        0.0f, dQ, W);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dS, T, Q, W,
                        beta, dK, W);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, dY, C,
                        beta, dV, W);
        }
    }
}

void zpp_cpu_attention_backward(float *dqkv, float *scratch, const float *dy, const float *att,
                                const float *qkv, int B, int T, int C, int H) {
    zpp_cpu_gqa_attention_backward(dqkv, scratch, dy, att, qkv, B, T, H, H, C / H);
}

/* RMSNorm of each row: y = x * r * w with r = 1 / sqrt(mean(x^2) + eps)
 * (no centring, no bias: Llama's norm); keeps r for the backward. */
void zpp_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int n,
                             int C, float eps) {
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * C;
        float *o = out + (size_t)r * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = x[c] * s * w[c];
        rstd[r] = s;
    }
}

/* With xh = x * r and g = dy * w: d w += dy * xh, and since
 * d r / d x = -r^3 x / C,
 *   d x += r * (g - xh * mean(g * xh))
 * (the mean removes the component of g along x, the direction the
 * normalisation divides out). */
void zpp_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                              const float *w, const float *rstd, int n, int C) {
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
        float *dx = dinp + (size_t)r * C;
        const float s = rstd[r];
        float gxmean = 0.0f;
        for (int c = 0; c < C; c++) gxmean += dy[c] * w[c] * x[c] * s;
        gxmean /= (float)C;
        for (int c = 0; c < C; c++) {
            float xh = x[c] * s;
            dw[c] += dy[c] * xh;
            dx[c] += s * (dy[c] * w[c] - xh * gxmean);
        }
    }
}

/* Softmax and cross-entropy of n rows of logits, V wide, in place.
 * loss_r = logsumexp(logits_r) - logits_r[target_r] is evaluated as
 * log(sum exp(l - max)) - (l[target] - max), which neither overflows nor
 * takes the log of an underflowed probability. The softmax runs over the
 * first Vr columns (model.h, real_vocab_size); the padded columns Vr..V-1
 * get probability 0, so the backward's d logits are 0 there. */
double zpp_cpu_cross_entropy_forward(float *probs, float *losses, const int32_t *targets, int n,
                                     int V, int Vr) {
    double total = 0.0;
    for (int r = 0; r < n; r++) {
        float *p = probs + (size_t)r * V;
        float mx = p[0];
        for (int v = 1; v < Vr; v++) mx = p[v] > mx ? p[v] : mx;
        float lt = targets ? p[targets[r]] - mx : 0.0f;
        float sum = 0.0f;
        for (int v = 0; v < Vr; v++) {
            p[v] = expf(p[v] - mx);
            sum += p[v];
        }
        float inv = 1.0f / sum;
        for (int v = 0; v < Vr; v++) p[v] *= inv;
        for (int v = Vr; v < V; v++) p[v] = 0.0f;
        losses[r] = logf(sum) - lt;
        total += losses[r];
    }
    return total;
}

/* d loss_r / d logits_r = softmax_r - onehot(target_r) (0 in the padded
 * columns, whose probabilities the forward zeroed), times `scale`. */
void zpp_cpu_cross_entropy_backward(float *probs, const int32_t *targets, int n, int V,
                                    float scale) {
    for (int r = 0; r < n; r++) {
        float *p = probs + (size_t)r * V;
        p[targets[r]] -= 1.0f;
        for (int v = 0; v < V; v++) p[v] *= scale;
    }
}
