/* test_llama.c — the Llama family's CPU model (src/model/llama*.c) against
 * an independent float64 reference written here in plain loops (nothing of
 * src/ but the layout documented in llama.h): embedding, RMSNorm, RoPE
 * (rotate-half, llama3 scaling), grouped-query causal attention, SwiGLU,
 * head (tied or untied), cross-entropy, and the backward of all of it by
 * hand. The reference's gradient is checked against its own central finite
 * differences, the model's loss, every gradient and a kept row of logits
 * against the reference's; bf16 parameters give the fp32 model's bits; the
 * factory refuses shapes it cannot build, naming the field, and GPT-2
 * refuses Llama's knobs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/family.h"
#include "model/llama.h"
#include "model/model.h"
#include "testlib.h"

/* ------------------------------------------------------------------------ */
/* The reference                                                             */
/* ------------------------------------------------------------------------ */

typedef struct ref_shape {
    int L, H, KV, C, F, T, V, Vr, untied, bias;
    double theta, eps;
    double factor, lo, hi; /* llama3 scaling, factor 0 = none */
    int orig;
    int obias; /* the output projection's bias (o_bias) */
} ref_shape;

/* Offsets inside the units, as llama.h documents them. */
typedef struct ref_layout {
    size_t wte, normf, head, n0;
    size_t n1, wq, wk, wv, bq, bk, bv, wo, bo, n2, wg, wu, wd, nb;
} ref_layout;

static ref_layout ref_layout_of(const ref_shape *s) {
    const size_t C = (size_t)s->C, V = (size_t)s->V, F = (size_t)s->F;
    const size_t Ck = (size_t)s->KV * (C / (size_t)s->H);
    ref_layout l;
    l.wte = 0;
    l.normf = V * C;
    l.head = l.normf + C;
    l.n0 = l.head + (s->untied ? V * C : 0);
    l.n1 = 0;
    l.wq = C;
    l.wk = l.wq + C * C;
    l.wv = l.wk + Ck * C;
    l.bq = l.wv + Ck * C;
    l.bk = l.bq + (s->bias ? C : 0);
    l.bv = l.bk + (s->bias ? Ck : 0);
    l.wo = l.bv + (s->bias ? Ck : 0);
    l.bo = l.wo + C * C;
    l.n2 = l.bo + (s->obias ? C : 0);
    l.wg = l.n2 + C;
    l.wu = l.wg + F * C;
    l.wd = l.wu + F * C;
    l.nb = l.wd + C * F;
    return l;
}

/* The angle of pair i at position p: p * f_i, f_i = theta^(-2i/hd), with
 * Llama 3's scaling written from its definition (Meta's apply_scaling). */
static double ref_angle(const ref_shape *s, int p, int i) {
    const int hd = s->C / s->H;
    double f = pow(s->theta, -2.0 * i / hd);
    if (s->factor != 0.0) {
        double wl = 2.0 * 3.14159265358979323846 / f, lw = s->orig / s->lo, hw = s->orig / s->hi;
        if (wl > lw) f = f / s->factor;
        else if (wl >= hw) {
            double sm = (s->orig / wl - s->lo) / (s->hi - s->lo);
            f = (1.0 - sm) * f / s->factor + sm * f;
        }
    }
    return p * f;
}

/* Everything the forward keeps, per layer, for n = B T rows. */
typedef struct ref_acts {
    double *x;   /* (L+1) n C */
    double *rs1, *h1, *q, *k, *v, *p, *a, *mid, *rs2, *h2, *g, *u, *m; /* per layer */
    double *rsf, *hf, *prob;
} ref_acts;

#define AT(buf, l, n, w) ((buf) + (size_t)(l) * (size_t)(n) * (size_t)(w))

static double *dalloc(size_t n) { return zpp_test_malloc((n ? n : 1) * sizeof(double)); }

static void ref_acts_alloc(ref_acts *r, const ref_shape *s, int n, int B) {
    const size_t L = (size_t)s->L, C = (size_t)s->C, hd = C / (size_t)s->H;
    const size_t Ck = (size_t)s->KV * hd, F = (size_t)s->F;
    r->x = dalloc((L + 1) * n * C);
    r->rs1 = dalloc(L * n);
    r->h1 = dalloc(L * n * C);
    r->q = dalloc(L * n * C);
    r->k = dalloc(L * n * Ck);
    r->v = dalloc(L * n * Ck);
    r->p = dalloc(L * B * (size_t)s->H * s->T * s->T);
    r->a = dalloc(L * n * C);
    r->mid = dalloc(L * n * C);
    r->rs2 = dalloc(L * n);
    r->h2 = dalloc(L * n * C);
    r->g = dalloc(L * n * F);
    r->u = dalloc(L * n * F);
    r->m = dalloc(L * n * F);
    r->rsf = dalloc(n);
    r->hf = dalloc(n * C);
    r->prob = dalloc(n * (size_t)s->V);
}

static void ref_acts_free(ref_acts *r) {
    double *all[] = {r->x, r->rs1, r->h1, r->q,  r->k,  r->v,   r->p,  r->a, r->mid,
                     r->rs2, r->h2, r->g, r->u, r->m, r->rsf, r->hf, r->prob};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static double silu(double z) { return z / (1.0 + exp(-z)); }
static double sigm(double z) { return 1.0 / (1.0 + exp(-z)); }

/* y = W x (+ b), W [out][in] */
static void matvec(double *y, const double *W, const double *b, const double *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        double acc = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) acc += W[(size_t)o * in + i] * x[i];
        y[o] = acc;
    }
}

/* y = x / rms(x) * g; returns 1 / rms */
static double rmsnorm(double *y, const double *x, const double *g, int C, double eps) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    double r = 1.0 / sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) y[c] = x[c] * r * g[c];
    return r;
}

/* Rotate-half at position pos: (x_i, x_{i+hd/2}) turned by the angle;
 * sign -1 turns back (the transpose). */
static void rotate(double *x, const ref_shape *s, int pos, int sign) {
    const int half = s->C / s->H / 2;
    for (int i = 0; i < half; i++) {
        double th = ref_angle(s, pos, i), c = cos(th), sn = sign * sin(th);
        double a = x[i], b = x[i + half];
        x[i] = a * c - b * sn;
        x[i + half] = b * c + a * sn;
    }
}

/* Causal grouped-query attention of one layer: q, k rotated in place. */
static void ref_attention(const ref_shape *s, ref_acts *r, int l, int B) {
    const int C = s->C, H = s->H, KV = s->KV, T = s->T, hd = C / H, Ck = KV * hd, n = B * T;
    double *q = AT(r->q, l, n, C), *k = AT(r->k, l, n, Ck), *v = AT(r->v, l, n, Ck);
    double *a = AT(r->a, l, n, C), *P = r->p + (size_t)l * B * H * T * T;
    for (int row = 0; row < n; row++) {
        for (int h = 0; h < H; h++) rotate(q + (size_t)row * C + h * hd, s, row % T, 1);
        for (int h = 0; h < KV; h++) rotate(k + (size_t)row * Ck + h * hd, s, row % T, 1);
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int kh = h / (H / KV);
            for (int t = 0; t < T; t++) {
                double *p = P + (((size_t)b * H + h) * T + t) * T, mx = -INFINITY, sum = 0.0;
                const double *qt = q + ((size_t)b * T + t) * C + h * hd;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *kt = k + ((size_t)b * T + t2) * Ck + kh * hd;
                    double dot = 0.0;
                    for (int i = 0; i < hd; i++) dot += qt[i] * kt[i];
                    p[t2] = dot / sqrt((double)hd);
                    mx = fmax(mx, p[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += (p[t2] = exp(p[t2] - mx));
                double *at = a + ((size_t)b * T + t) * C + h * hd;
                for (int i = 0; i < hd; i++) at[i] = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    p[t2] /= sum;
                    const double *vt = v + ((size_t)b * T + t2) * Ck + kh * hd;
                    for (int i = 0; i < hd; i++) at[i] += p[t2] * vt[i];
                }
            }
        }
}

/* One block's forward, row by row. */
static void ref_block(const ref_shape *s, const ref_layout *lo, const double *w, ref_acts *r,
                      int l, int B) {
    const int C = s->C, Ck = s->KV * (C / s->H), F = s->F, n = B * s->T;
    for (int row = 0; row < n; row++) {
        const double *x = AT(r->x, l, n, C) + (size_t)row * C;
        double *h1 = AT(r->h1, l, n, C) + (size_t)row * C;
        r->rs1[(size_t)l * n + row] = rmsnorm(h1, x, w + lo->n1, C, s->eps);
        matvec(AT(r->q, l, n, C) + (size_t)row * C, w + lo->wq, s->bias ? w + lo->bq : NULL, h1,
               C, C);
        matvec(AT(r->k, l, n, Ck) + (size_t)row * Ck, w + lo->wk, s->bias ? w + lo->bk : NULL,
               h1, Ck, C);
        matvec(AT(r->v, l, n, Ck) + (size_t)row * Ck, w + lo->wv, s->bias ? w + lo->bv : NULL,
               h1, Ck, C);
    }
    ref_attention(s, r, l, B);
    for (int row = 0; row < n; row++) {
        const double *x = AT(r->x, l, n, C) + (size_t)row * C;
        double *mid = AT(r->mid, l, n, C) + (size_t)row * C, o[256], d[256];
        matvec(o, w + lo->wo, s->obias ? w + lo->bo : NULL, AT(r->a, l, n, C) + (size_t)row * C,
               C, C);
        for (int c = 0; c < C; c++) mid[c] = x[c] + o[c];
        double *h2 = AT(r->h2, l, n, C) + (size_t)row * C;
        r->rs2[(size_t)l * n + row] = rmsnorm(h2, mid, w + lo->n2, C, s->eps);
        double *g = AT(r->g, l, n, F) + (size_t)row * F, *u = AT(r->u, l, n, F) + (size_t)row * F;
        double *m = AT(r->m, l, n, F) + (size_t)row * F;
        matvec(g, w + lo->wg, NULL, h2, F, C);
        matvec(u, w + lo->wu, NULL, h2, F, C);
        for (int j = 0; j < F; j++) m[j] = silu(g[j]) * u[j];
        matvec(d, w + lo->wd, NULL, m, C, F);
        double *out = AT(r->x, l + 1, n, C) + (size_t)row * C;
        for (int c = 0; c < C; c++) out[c] = mid[c] + d[c];
    }
}

/* The mean cross-entropy of the whole forward; w[0] the embedding unit,
 * w[l] block l. */
static double ref_forward(const ref_shape *s, double *const *w, const int32_t *tok,
                          const int32_t *tgt, int B, ref_acts *r) {
    const ref_layout lo = ref_layout_of(s);
    const int C = s->C, V = s->V, n = B * s->T;
    for (int row = 0; row < n; row++)
        for (int c = 0; c < C; c++)
            r->x[(size_t)row * C + c] = w[0][lo.wte + (size_t)tok[row] * C + c];
    for (int l = 0; l < s->L; l++) ref_block(s, &lo, w[l + 1], r, l, B);
    const double *head = w[0] + (s->untied ? lo.head : lo.wte);
    double total = 0.0;
    for (int row = 0; row < n; row++) {
        double *hf = r->hf + (size_t)row * C, *p = r->prob + (size_t)row * V;
        r->rsf[row] = rmsnorm(hf, AT(r->x, s->L, n, C) + (size_t)row * C, w[0] + lo.normf, C,
                              s->eps);
        matvec(p, head, NULL, hf, V, C);
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < s->Vr; v++) mx = fmax(mx, p[v]);
        for (int v = 0; v < s->Vr; v++) sum += exp(p[v] - mx);
        total += log(sum) + mx - p[tgt[row]];
        for (int v = 0; v < V; v++) p[v] = v < s->Vr ? exp(p[v] - mx) / sum : 0.0;
    }
    return total / n;
}

/* y = W x (+ b): dW += dy x^T, db += dy, dx += W^T dy. */
static void matvec_back(double *dx, double *dW, double *db, const double *dy, const double *W,
                        const double *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        if (db) db[o] += dy[o];
        for (int i = 0; i < in; i++) {
            dW[(size_t)o * in + i] += dy[o] * x[i];
            dx[i] += W[(size_t)o * in + i] * dy[o];
        }
    }
}

/* y = x r g, r = (mean x^2 + eps)^(-1/2), so d r / d x_c = -r^3 x_c / C:
 * dg += dy x r, dx += r dy g - r^3 x / C * sum(dy g x). */
static void rmsnorm_back(double *dx, double *dg, const double *dy, const double *x,
                         const double *g, double r, int C) {
    double dot = 0.0;
    for (int c = 0; c < C; c++) dot += dy[c] * g[c] * x[c];
    for (int c = 0; c < C; c++) {
        dg[c] += dy[c] * x[c] * r;
        dx[c] += r * dy[c] * g[c] - r * r * r * x[c] / C * dot;
    }
}

/* The attention's backward: from da (n x C) to dq (n x C), dk, dv (n x Ck),
 * with respect to the rotated q and k, then turned back. */
static void ref_attention_back(const ref_shape *s, const ref_acts *r, int l, int B,
                               const double *da, double *dq, double *dk, double *dv) {
    const int C = s->C, H = s->H, KV = s->KV, T = s->T, hd = C / H, Ck = KV * hd, n = B * T;
    const double *q = AT(r->q, l, n, C), *k = AT(r->k, l, n, Ck), *v = AT(r->v, l, n, Ck);
    const double *P = r->p + (size_t)l * B * H * T * T;
    double dp[64];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int kh = h / (H / KV);
            for (int t = 0; t < T; t++) {
                const double *p = P + (((size_t)b * H + h) * T + t) * T;
                const double *dat = da + ((size_t)b * T + t) * C + h * hd;
                double pdp = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *vt = v + ((size_t)b * T + t2) * Ck + kh * hd;
                    double *dvt = dv + ((size_t)b * T + t2) * Ck + kh * hd;
                    dp[t2] = 0.0;
                    for (int i = 0; i < hd; i++) {
                        dp[t2] += dat[i] * vt[i];
                        dvt[i] += p[t2] * dat[i];
                    }
                    pdp += p[t2] * dp[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    const double ds = p[t2] * (dp[t2] - pdp) / sqrt((double)hd);
                    const size_t qo = ((size_t)b * T + t) * C + h * hd;
                    const size_t ko = ((size_t)b * T + t2) * Ck + kh * hd;
                    for (int i = 0; i < hd; i++) {
                        dq[qo + i] += ds * k[ko + i];
                        dk[ko + i] += ds * q[qo + i];
                    }
                }
            }
        }
    for (int row = 0; row < n; row++) {
        for (int h = 0; h < H; h++) rotate(dq + (size_t)row * C + h * hd, s, row % T, -1);
        for (int h = 0; h < KV; h++) rotate(dk + (size_t)row * Ck + h * hd, s, row % T, -1);
    }
}

/* One block's backward: dX (n x C) holds d out on entry, d x on exit. */
static void ref_block_back(const ref_shape *s, const ref_layout *lo, const double *w, double *gw,
                           const ref_acts *r, int l, int B, double *dX) {
    const int C = s->C, Ck = s->KV * (C / s->H), F = s->F, n = B * s->T;
    double *da = dalloc((size_t)n * C), *dq = dalloc((size_t)n * C);
    double *dk = dalloc((size_t)n * Ck), *dv = dalloc((size_t)n * Ck);
    memset(da, 0, (size_t)n * C * sizeof(double));
    memset(dq, 0, (size_t)n * C * sizeof(double));
    memset(dk, 0, (size_t)n * Ck * sizeof(double));
    memset(dv, 0, (size_t)n * Ck * sizeof(double));
    for (int row = 0; row < n; row++) {
        double *dmid = dX + (size_t)row * C, dm[256], dg[256], du[256], dh2[256];
        const double *g = AT(r->g, l, n, F) + (size_t)row * F;
        const double *u = AT(r->u, l, n, F) + (size_t)row * F;
        const double *h2 = AT(r->h2, l, n, C) + (size_t)row * C;
        memset(dm, 0, sizeof dm);
        memset(dh2, 0, sizeof dh2);
        matvec_back(dm, gw + lo->wd, NULL, dmid, w + lo->wd, AT(r->m, l, n, F) + (size_t)row * F,
                    C, F);
        for (int j = 0; j < F; j++) {
            du[j] = dm[j] * silu(g[j]);
            dg[j] = dm[j] * u[j] * (sigm(g[j]) + g[j] * sigm(g[j]) * (1.0 - sigm(g[j])));
        }
        matvec_back(dh2, gw + lo->wg, NULL, dg, w + lo->wg, h2, F, C);
        matvec_back(dh2, gw + lo->wu, NULL, du, w + lo->wu, h2, F, C);
        rmsnorm_back(dmid, gw + lo->n2, dh2, AT(r->mid, l, n, C) + (size_t)row * C, w + lo->n2,
                     r->rs2[(size_t)l * n + row], C);
        matvec_back(da + (size_t)row * C, gw + lo->wo, s->obias ? gw + lo->bo : NULL, dmid,
                    w + lo->wo,
                    AT(r->a, l, n, C) + (size_t)row * C, C, C);
    }
    ref_attention_back(s, r, l, B, da, dq, dk, dv);
    for (int row = 0; row < n; row++) {
        double dh1[256];
        const double *h1 = AT(r->h1, l, n, C) + (size_t)row * C;
        memset(dh1, 0, sizeof dh1);
        matvec_back(dh1, gw + lo->wq, s->bias ? gw + lo->bq : NULL, dq + (size_t)row * C,
                    w + lo->wq, h1, C, C);
        matvec_back(dh1, gw + lo->wk, s->bias ? gw + lo->bk : NULL, dk + (size_t)row * Ck,
                    w + lo->wk, h1, Ck, C);
        matvec_back(dh1, gw + lo->wv, s->bias ? gw + lo->bv : NULL, dv + (size_t)row * Ck,
                    w + lo->wv, h1, Ck, C);
        rmsnorm_back(dX + (size_t)row * C, gw + lo->n1, dh1, AT(r->x, l, n, C) + (size_t)row * C,
                     w + lo->n1, r->rs1[(size_t)l * n + row], C);
    }
    free(da);
    free(dq);
    free(dk);
    free(dv);
}

/* d loss / d every parameter into gw (zeroed first), after ref_forward. */
static void ref_backward(const ref_shape *s, double *const *w, double *const *gw,
                         const int32_t *tok, const int32_t *tgt, int B, const ref_acts *r) {
    const ref_layout lo = ref_layout_of(s);
    const int C = s->C, V = s->V, n = B * s->T;
    memset(gw[0], 0, lo.n0 * sizeof(double));
    for (int l = 1; l <= s->L; l++) memset(gw[l], 0, lo.nb * sizeof(double));
    const size_t head = s->untied ? lo.head : lo.wte;
    double *dX = dalloc((size_t)n * C);
    memset(dX, 0, (size_t)n * C * sizeof(double));
    for (int row = 0; row < n; row++) {
        double dlog[512], dhf[256];
        for (int v = 0; v < V; v++)
            dlog[v] = (r->prob[(size_t)row * V + v] - (v == tgt[row] ? 1.0 : 0.0)) / n;
        memset(dhf, 0, sizeof dhf);
        matvec_back(dhf, gw[0] + head, NULL, dlog, w[0] + head, r->hf + (size_t)row * C, V, C);
        rmsnorm_back(dX + (size_t)row * C, gw[0] + lo.normf, dhf,
                     AT(r->x, s->L, n, C) + (size_t)row * C, w[0] + lo.normf, r->rsf[row], C);
    }
    for (int l = s->L - 1; l >= 0; l--) ref_block_back(s, &lo, w[l + 1], gw[l + 1], r, l, B, dX);
    for (int row = 0; row < n; row++)
        for (int c = 0; c < C; c++)
            gw[0][lo.wte + (size_t)tok[row] * C + c] += dX[(size_t)row * C + c];
    free(dX);
}

/* ------------------------------------------------------------------------ */
/* The cases                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct ref_case {
    ref_shape s;
    int B;
} ref_case;

/* Odd sizes throughout; GQA 4:1, 2:1 and 1:1; head dims 8 and 16; tied and
 * untied; with and without q/k/v biases, and the o bias with and without
 * them; with and without llama3 scaling,
 * whose bands (orig / high .. orig / low) are placed among these head
 * dims' wavelengths so that pairs fall in all three. */
static const ref_case kCases[] = {
    {{2, 4, 1, 32, 24, 7, 29, 27, 0, 0, 10000.0, 1e-5, 0.0, 0.0, 0.0, 0, 0}, 2},
    {{1, 2, 2, 32, 19, 5, 23, 23, 1, 1, 500000.0, 1e-5, 8.0, 1.0, 4.0, 16, 1}, 3},
    {{2, 4, 2, 32, 40, 6, 31, 30, 1, 0, 100.0, 1e-5, 4.0, 1.0, 2.0, 20, 1}, 1},
    {{1, 3, 3, 48, 33, 4, 17, 17, 0, 1, 10000.0, 1e-6, 0.0, 0.0, 0.0, 0, 0}, 2},
};
#define N_CASES (sizeof kCases / sizeof kCases[0])

static zpp_decoder_shape shape_of(const ref_shape *s) {
    return (zpp_decoder_shape){.n_layer = s->L,
                               .n_head = s->H,
                               .n_kv_head = s->KV,
                               .n_embd = s->C,
                               .n_ffn = s->F,
                               .seq_len = s->T,
                               .vocab_size = s->V,
                               .real_vocab_size = s->Vr,
                               .rope_theta = s->theta,
                               .norm_eps = s->eps,
                               .untied_head = s->untied,
                               .qkv_bias = s->bias,
                               .o_bias = s->obias,
                               .rope_factor = s->factor,
                               .rope_low_freq_factor = s->lo,
                               .rope_high_freq_factor = s->hi,
                               .rope_original_max_pos = s->orig};
}

/* Parameters, tokens and targets of one case: fp32 values (the model's)
 * and the same values in double (the reference's). Weights N(0, 0.25^2):
 * a product of C = 32 to 48 terms multiplies the scale by 1.4 to 1.7, so
 * the scores (std about 2) keep attention far from uniform and SwiGLU far
 * from linear. At 0.4 (2.3 to 2.8 a product) two blocks compounded into
 * draws conditioned so badly that the fp32 model strayed up to 1,642 u
 * from the float64 reference (2 runs in 400 beyond chain_terms' bound); at
 * 0.25 the worst of 300 runs was 173 u, and 2,000 runs stayed within the
 * bound. RMSNorm gains 1 + N(0, 0.2^2), biases N(0, 0.2^2). */
typedef struct case_data {
    int n_units;
    size_t numel[8];
    float *pf[8];
    double *pd[8], *gd[8];
    int32_t *tok, *tgt;
} case_data;

static void fill_gains(float *p, size_t at, size_t n, zpp_rng *r) {
    for (size_t i = 0; i < n; i++) p[at + i] = (float)(1.0 + 0.2 * zpp_rng_normal(r));
}

static void case_data_make(case_data *d, const ref_case *c, uint64_t stream) {
    const ref_shape *s = &c->s;
    const ref_layout lo = ref_layout_of(s);
    const int n = c->B * s->T;
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream));
    EXPECT(s->L + 1 <= 8 && s->C <= 256 && s->F <= 256 && s->V <= 512 && s->T <= 64,
           "case too large for the reference's buffers");
    d->n_units = s->L + 1;
    for (int u = 0; u < d->n_units; u++) {
        d->numel[u] = u == 0 ? lo.n0 : lo.nb;
        d->pf[u] = zpp_test_malloc(d->numel[u] * sizeof(float));
        d->pd[u] = dalloc(d->numel[u]);
        d->gd[u] = dalloc(d->numel[u]);
        for (size_t i = 0; i < d->numel[u]; i++) d->pf[u][i] = (float)(0.25 * zpp_rng_normal(&r));
        if (u == 0) {
            fill_gains(d->pf[u], lo.normf, (size_t)s->C, &r);
        } else {
            fill_gains(d->pf[u], lo.n1, (size_t)s->C, &r);
            fill_gains(d->pf[u], lo.n2, (size_t)s->C, &r);
            for (size_t i = lo.bq; i < lo.wo; i++) d->pf[u][i] = (float)(0.2 * zpp_rng_normal(&r));
            for (size_t i = lo.bo; i < lo.n2; i++) d->pf[u][i] = (float)(0.2 * zpp_rng_normal(&r));
        }
        for (size_t i = 0; i < d->numel[u]; i++) d->pd[u][i] = d->pf[u][i];
    }
    d->tok = zpp_test_malloc((size_t)n * sizeof(int32_t));
    d->tgt = zpp_test_malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        d->tok[i] = (int32_t)(zpp_rng_u64(&r) % (uint64_t)s->V);
        d->tgt[i] = (int32_t)(zpp_rng_u64(&r) % (uint64_t)s->Vr);
    }
}

static void case_data_free(case_data *d) {
    for (int u = 0; u < d->n_units; u++) {
        free(d->pf[u]);
        free(d->pd[u]);
        free(d->gd[u]);
    }
    free(d->tok);
    free(d->tgt);
}

/* The model's loss and gradients (fp32, added into zeroed buffers) of the
 * case's parameters given in `dtype` (fp32, or bf16 holding the same
 * values when they are bf16 values). */
static float model_run_with(const ref_case *c, const case_data *d, zpp_dtype dtype,
                            int recompute, float **grads) {
    zpp_device *dev;
    zpp_model *m;
    EXPECT_OK(zpp_device_create_host(&dev));
    zpp_decoder_shape shape = shape_of(&c->s);
    shape.recompute = recompute;
    EXPECT_OK(zpp_model_family_create("llama", &shape, dtype, c->B, dev, &m));
    EXPECT(m->n_units == d->n_units, "units %d, want %d", m->n_units, d->n_units);
    void *p[8];
    for (int u = 0; u < d->n_units; u++) {
        EXPECT(m->unit_numel[u] == d->numel[u], "unit %d has %zu elements, llama.h says %zu", u,
               m->unit_numel[u], d->numel[u]);
        p[u] = zpp_test_malloc(d->numel[u] * sizeof(float));
        for (size_t i = 0; i < d->numel[u]; i++) zpp_store_f32(p[u], dtype, i, d->pf[u][i]);
        memset(grads[u], 0, d->numel[u] * sizeof(float));
    }
    EXPECT_OK(m->ops->set_batch(m, d->tok, d->tgt, c->B));
    for (int st = 0; st < m->n_stages; st++)
        EXPECT_OK(m->ops->forward(m, st, p[m->stage_unit[st]]));
    const float loss = m->ops->loss(m);
    for (int st = m->n_stages - 1; st >= 0; st--)
        EXPECT_OK(m->ops->backward(m, st, p[m->stage_unit[st]], grads[m->stage_unit[st]], 1.0f));
    for (int u = 0; u < d->n_units; u++) free(p[u]);
    m->ops->destroy(m);
    zpp_device_destroy(dev);
    return loss;
}

static float model_run(const ref_case *c, const case_data *d, zpp_dtype dtype, float **grads) {
    return model_run_with(c, d, dtype, 0, grads);
}

/* ------------------------------------------------------------------------ */
/* The tests                                                                 */
/* ------------------------------------------------------------------------ */

/* The o bias's elements in a block (0 without it). */
static int u_bias_count(const ref_layout *lo) { return (int)(lo->n2 - lo->bo); }

/* The reference's hand-written backward against central differences of its
 * own loss on 40 random elements of every unit: Richardson's extrapolation
 * of central differences, (4 D(h) - D(2h)) / 3 with D(h) = (L(w + h) -
 * L(w - h)) / 2h, whose truncation error is h^4 L^(5) / 30 (the plain
 * difference's h^2 L''' / 6 reached 1.5e-7 on one draw in 200, where L'''
 * was near 1e4). In double with h = 1e-5 that is ~3e-22 L^(5), the rounding
 * error ~1e-16 L / h ~ 1e-11; 1e-8 absolute plus 1e-6 relative is above both
 * by a wide margin, and far below any mistake in a formula (which is of the
 * size of the gradient).
 * The o bias (C of a block's thousands of elements, which random picks
 * would seldom reach) is checked whole, beside them. */
static void test_reference_matches_finite_differences(void) {
    for (size_t k = 0; k < N_CASES; k++) {
        const ref_case *c = &kCases[k];
        case_data d;
        case_data_make(&d, c, 100 + k);
        ref_acts r;
        ref_acts_alloc(&r, &c->s, c->B * c->s.T, c->B);
        ref_forward(&c->s, d.pd, d.tok, d.tgt, c->B, &r);
        ref_backward(&c->s, d.pd, d.gd, d.tok, d.tgt, c->B, &r);
        zpp_rng rng = zpp_rng_make(zpp_test_seed(200 + k));
        const double h = 1e-5;
        const ref_layout lo = ref_layout_of(&c->s);
        const int n_bo = u_bias_count(&lo);
        for (int u = 0; u < d.n_units; u++)
            for (int j = 0; j < 40 + (u ? n_bo : 0); j++) {
                const size_t i = j >= 40 ? lo.bo + (size_t)(j - 40)
                                         : (size_t)(zpp_rng_u64(&rng) % d.numel[u]);
                double diff[2]; /* D(h), D(2h) */
                for (int m = 0; m < 2; m++) {
                    const double w0 = d.pd[u][i], hm = h * (1 + m);
                    d.pd[u][i] = w0 + hm;
                    const double up = ref_forward(&c->s, d.pd, d.tok, d.tgt, c->B, &r);
                    d.pd[u][i] = w0 - hm;
                    const double down = ref_forward(&c->s, d.pd, d.tok, d.tgt, c->B, &r);
                    d.pd[u][i] = w0;
                    diff[m] = (up - down) / (2 * hm);
                }
                const double fd = (4 * diff[0] - diff[1]) / 3, g = d.gd[u][i];
                EXPECT(fabs(fd - g) <= 1e-8 + 1e-6 * fabs(g),
                       "case %zu unit %d element %zu: backward %.12g, finite difference %.12g", k,
                       u, i, g, fd);
            }
        ref_acts_free(&r);
        case_data_free(&d);
    }
}

/* The largest |a - b| over a unit, relative to the largest |b|. */
static double unit_error(const float *a, const double *b, size_t n) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return scale > 0.0 ? err / scale : err;
}

/* How many terms the longest chain of dependent fp32 sums adds up, forward
 * then backward, for the fp32 model against the float64 reference. Each sum of
 * K terms rounds with relative error at most about K u (Higham's gamma_K, to
 * first order), and the errors of a chain add, so the sum of the K's over the
 * chain bounds the gradient's relative error in units of u = 2^-24 (elementwise
 * products and activations add one rounding each, small beside these). Per
 * block, forward: the norm (C), q/k/v (C), the scores (head dim), the softmax's
 * sum and the values (T each), the output projection, the second norm and the
 * gate and up projections (C each), the down projection (F); backward: the down
 * projection, both norms and the output projection (C each), gate and up (2F),
 * the scores, softmax and values (head dim + 3T), q/k/v (C + 2 KV-width); then
 * the head (its norm and logits C, logsumexp V; back V and C) and the weight
 * gradient's sum over the B*T positions. For these cases it comes to 655-
 * 1,200 terms: 3.9e-5 to 7.2e-5, where a formula mistake (a wrong sign, a
 * swapped half, a wrong head group) moves the result by percents. Rounding
 * errors of mixed signs mostly cancel (typical errors are a few tens of u), so
 * the chain's bound is a ceiling, not a forecast, for draws conditioned well
 * enough that no step amplifies the errors before it much: case_data_make's
 * weight scale keeps them so (larger weights went past it). The gradient is
 * measured against its unit's largest element, so that elements that nearly
 * cancel need no relative accuracy they cannot have. */
static double chain_terms(const ref_shape *s, int B) {
    const double C = s->C, F = s->F, T = s->T, V = s->V, hd = (double)s->C / s->H;
    const double kvw = s->KV * hd;
    const double fwd = 5 * C + hd + 2 * T + F;
    const double bwd = 4 * C + 2 * F + hd + 3 * T + C + 2 * kvw;
    return s->L * (fwd + bwd) + (2 * C + V) + (V + C) + (double)B * T;
}

/* The fp32 model against the float64 reference on the same (fp32) values:
 * the gradients within chain_terms() u, the loss (one mean of B*T
 * logsumexps) within 30 u. */
static void test_model_matches_reference(void) {
    const double u = 0x1.0p-24;
    for (size_t k = 0; k < N_CASES; k++) {
        const ref_case *c = &kCases[k];
        case_data d;
        case_data_make(&d, c, 300 + k);
        ref_acts r;
        ref_acts_alloc(&r, &c->s, c->B * c->s.T, c->B);
        const double want = ref_forward(&c->s, d.pd, d.tok, d.tgt, c->B, &r);
        ref_backward(&c->s, d.pd, d.gd, d.tok, d.tgt, c->B, &r);
        float *g[8];
        for (int q = 0; q < d.n_units; q++) g[q] = zpp_test_malloc(d.numel[q] * sizeof(float));
        const float loss = model_run(c, &d, ZPP_FP32, g);
        EXPECT(fabs(loss - want) <= 30 * u * fabs(want), "case %zu: loss %.9g, reference %.12g",
               k, (double)loss, want);
        const ref_layout lo = ref_layout_of(&c->s);
        const double bound = chain_terms(&c->s, c->B);
        for (int q = 0; q < d.n_units; q++) {
            const double e = unit_error(g[q], d.gd[q], d.numel[q]);
            EXPECT(e <= bound * u, "case %zu unit %d: gradient error %.3g of its largest element "
                                   "(%.0f u), bound %.0f u", k, q, e, e / u, bound);
            /* the o bias on its own: a few dozen elements a unit-wide bound could hide */
            const double eo = q ? unit_error(g[q] + lo.bo, d.gd[q] + lo.bo, lo.n2 - lo.bo) : 0;
            EXPECT(eo <= bound * u, "case %zu unit %d: o bias gradient error %.3g (%.0f u), "
                                    "bound %.0f u", k, q, eo, eo / u, bound);
            free(g[q]);
        }
        ref_acts_free(&r);
        case_data_free(&d);
    }
}

/* Activation checkpointing recomputes each block's forward in its backward:
 * the same loss and gradients, bit for bit, on every case of two blocks. */
static void test_recompute_gives_the_same_bits(void) {
    for (size_t k = 0; k < N_CASES; k++) {
        const ref_case *c = &kCases[k];
        if (c->s.L < 2) continue;
        case_data d;
        case_data_make(&d, c, 600 + k);
        float *g0[8], *g1[8];
        for (int q = 0; q < d.n_units; q++) {
            g0[q] = zpp_test_malloc(d.numel[q] * sizeof(float));
            g1[q] = zpp_test_malloc(d.numel[q] * sizeof(float));
        }
        const float l0 = model_run_with(c, &d, ZPP_FP32, 0, g0);
        const float l1 = model_run_with(c, &d, ZPP_FP32, 1, g1);
        EXPECT(!memcmp(&l0, &l1, sizeof l0), "case %zu: loss %.9g with recompute, %.9g without",
               k, (double)l1, (double)l0);
        for (int q = 0; q < d.n_units; q++) {
            EXPECT(!memcmp(g0[q], g1[q], d.numel[q] * sizeof(float)),
                   "case %zu: unit %d's gradient differs with recompute", k, q);
            free(g0[q]);
            free(g1[q]);
        }
        case_data_free(&d);
    }
}

/* bf16 and fp16 parameters are widened exactly, so parameters that are bf16
 * values give the very bits of the fp32 model on them. */
static void test_half_params_give_fp32_bits(void) {
    const ref_case *c = &kCases[1];
    case_data d;
    case_data_make(&d, c, 400);
    for (int q = 0; q < d.n_units; q++)
        for (size_t i = 0; i < d.numel[q]; i++)
            d.pf[q][i] = zpp_bf16_to_f32(zpp_f32_to_bf16(d.pf[q][i]));
    float *g32[8], *gh[8];
    for (int q = 0; q < d.n_units; q++) {
        g32[q] = zpp_test_malloc(d.numel[q] * sizeof(float));
        gh[q] = zpp_test_malloc(d.numel[q] * sizeof(float));
    }
    const float l32 = model_run(c, &d, ZPP_FP32, g32);
    const float lh = model_run(c, &d, ZPP_BF16, gh);
    EXPECT(!memcmp(&l32, &lh, sizeof l32), "loss %.9g in bf16, %.9g in fp32", (double)lh,
           (double)l32);
    for (int q = 0; q < d.n_units; q++) {
        EXPECT(!memcmp(g32[q], gh[q], d.numel[q] * sizeof(float)), "unit %d's gradient differs", q);
        free(g32[q]);
        free(gh[q]);
    }
    case_data_free(&d);
}

/* keep_logits / logits (model.h): the kept row's logits, all vocab_size
 * columns, are the reference's head output for that row (same bound as the
 * gradients: the logits are a product of the forward's every step), and a
 * training forward (with targets, whose softmax follows) keeps the same
 * bits. */
static void test_kept_logits_match_reference(void) {
    const ref_case *c = &kCases[2]; /* untied, padded vocabulary */
    const int n = c->B * c->s.T, V = c->s.V, C = c->s.C, row = n - 2;
    case_data d;
    case_data_make(&d, c, 500);
    ref_acts r;
    ref_acts_alloc(&r, &c->s, n, c->B);
    ref_forward(&c->s, d.pd, d.tok, d.tgt, c->B, &r);
    const ref_layout lo = ref_layout_of(&c->s);
    double *want = dalloc((size_t)V);
    matvec(want, d.pd[0] + lo.head, NULL, r.hf + (size_t)row * C, V, C);

    zpp_device *dev;
    zpp_model *m;
    EXPECT_OK(zpp_device_create_host(&dev));
    const zpp_decoder_shape shape = shape_of(&c->s);
    EXPECT_OK(zpp_model_family_create("llama", &shape, ZPP_FP32, c->B, dev, &m));
    EXPECT_OK(m->ops->keep_logits(m, row));
    EXPECT_OK(m->ops->set_batch(m, d.tok, NULL, c->B));
    for (int st = 0; st < m->n_stages; st++)
        EXPECT_OK(m->ops->forward(m, st, d.pf[m->stage_unit[st]]));
    float *got = zpp_test_malloc((size_t)V * sizeof(float));
    EXPECT_OK(m->ops->logits(m, got));
    const double e = unit_error(got, want, (size_t)V);
    EXPECT(e <= 300 * 0x1.0p-24, "row %d's logits: error %.3g of the largest", row, e);
    float *again = zpp_test_malloc((size_t)V * sizeof(float));
    EXPECT_OK(m->ops->set_batch(m, d.tok, d.tgt, c->B));
    for (int st = 0; st < m->n_stages; st++)
        EXPECT_OK(m->ops->forward(m, st, d.pf[m->stage_unit[st]]));
    EXPECT_OK(m->ops->logits(m, again));
    EXPECT(!memcmp(got, again, (size_t)V * sizeof(float)),
           "row %d: a forward with targets kept other logits than one without", row);
    free(again);
    free(got);
    free(want);
    m->ops->destroy(m);
    zpp_device_destroy(dev);
    ref_acts_free(&r);
    case_data_free(&d);
}

static void expect_refused(const char *family, const zpp_decoder_shape *s, const char *needle) {
    zpp_device *dev;
    EXPECT_OK(zpp_device_create_host(&dev));
    zpp_model *m = NULL;
    EXPECT_STATUS(zpp_model_family_create(family, s, ZPP_FP32, 1, dev, &m), ZPP_ERR_CONFIG);
    EXPECT(m == NULL, "a model made of a refused shape");
    EXPECT(strstr(zpp_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", family,
           zpp_last_error(), needle);
    zpp_device_destroy(dev);
}

/* Shapes Llama cannot build, refused naming the field; and Llama's knobs
 * refused by GPT-2, naming each. */
static void test_bad_shapes_refused(void) {
    const zpp_decoder_shape ok = shape_of(&kCases[0].s);
    zpp_decoder_shape s = ok;
    s.n_kv_head = 3; /* does not divide n_head 4 */
    expect_refused("llama", &s, "n_kv_head 3");
    s = ok;
    s.n_embd = 12; /* head dim 3: RoPE needs pairs */
    expect_refused("llama", &s, "head dim");
    s = ok;
    s.rope_factor = 8.0; /* without its bands */
    expect_refused("llama", &s, "rope_low_freq_factor");
    s = ok;
    s.recompute = 2;
    expect_refused("llama", &s, "recompute 2");
    s = ok;
    s.o_bias = 2;
    expect_refused("llama", &s, "o_bias 2");
    const zpp_decoder_shape gpt2 = {.n_layer = 1, .n_head = 2, .n_embd = 8, .seq_len = 4,
                                    .vocab_size = 10};
    const char *knob[6] = {"rope_theta", "norm_eps", "untied_head", "qkv_bias", "rope_factor",
                           "o_bias"};
    for (int k = 0; k < 6; k++) {
        s = gpt2;
        if (k == 0) s.rope_theta = 10000.0;
        if (k == 1) s.norm_eps = 1e-5;
        if (k == 2) s.untied_head = 1;
        if (k == 3) s.qkv_bias = 1;
        if (k == 4) s.rope_factor = 8.0;
        if (k == 5) s.o_bias = 1;
        expect_refused("gpt2", &s, knob[k]);
    }
}

/* The defaults (0s): n_kv_head = n_head, Llama's MLP width, no bias, tied;
 * the units are as llama.h says, and the model trains from its own init. */
static void test_defaults_and_init(void) {
    zpp_device *dev;
    EXPECT_OK(zpp_device_create_host(&dev));
    const zpp_decoder_shape s = {.n_layer = 2, .n_head = 4, .n_embd = 96, .seq_len = 8,
                                 .vocab_size = 50};
    zpp_model *m;
    EXPECT_OK(zpp_model_family_create("llama", &s, ZPP_FP32, 1, dev, &m));
    /* F = 8 * 96 / 3 = 256, already a multiple of 256 */
    const size_t C = 96, F = 256, V = 50;
    EXPECT(m->unit_numel[0] == V * C + C, "unit 0 has %zu elements", m->unit_numel[0]);
    const size_t block = C + 3 * C * C + C * C + C + 3 * F * C;
    EXPECT(m->unit_numel[1] == block, "a block has %zu elements, want %zu", m->unit_numel[1],
           block);
    float *p = zpp_test_malloc(block * sizeof(float));
    EXPECT_OK(m->ops->init_params(m, 1, 0, block, p, 7));
    EXPECT(p[0] == 1.0f && p[C - 1] == 1.0f, "RMSNorm gains start at 1");
    double ss = 0.0;
    for (size_t i = C; i < C + 4 * C * C; i++) ss += (double)p[i] * p[i];
    const double sd = sqrt(ss / (4 * C * C));
    EXPECT(fabs(sd - 0.02) < 0.001, "attention weights' std %.5f, want 0.02", sd);
    free(p);
    m->ops->destroy(m);
    zpp_device_destroy(dev);
}

/* The RoPE tables every model turns q and k by (zpp_llama_rope_tables: the
 * CPU model's, and the CUDA kernels' upload): entry (p, i) is the double
 * cos / sin of p * inv_freq[i] rounded once to fp32, exactly, here with
 * the llama3 scaling on; a table of no rows or a NULL one is refused. */
static void test_rope_tables(void) {
    zpp_llama_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_head = 4, cfg.n_embd = 4 * 64, cfg.rope_theta = 500000.0, cfg.rope_factor = 8.0;
    cfg.rope_low_freq_factor = 1.0, cfg.rope_high_freq_factor = 4.0;
    cfg.rope_original_max_pos = 32;
    enum { T = 100, HALF = 32 };
    double inv_freq[HALF];
    float *c = zpp_test_malloc(T * HALF * sizeof(float)), *sn = zpp_test_malloc(T * HALF * 4);
    zpp_llama_rope_inv_freq(&cfg, inv_freq);
    EXPECT_OK(zpp_llama_rope_tables(&cfg, T, c, sn));
    for (int p = 0; p < T; p++)
        for (int i = 0; i < HALF; i++) {
            const double a = (double)p * inv_freq[i];
            EXPECT(c[p * HALF + i] == (float)cos(a) && sn[p * HALF + i] == (float)sin(a),
                   "position %d pair %d: cos %.9g sin %.9g, want %.9g %.9g", p, i,
                   (double)c[p * HALF + i], (double)sn[p * HALF + i], cos(a), sin(a));
        }
    EXPECT_STATUS(zpp_llama_rope_tables(&cfg, 0, c, sn), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_llama_rope_tables(&cfg, T, NULL, sn), ZPP_ERR_INVALID);
    free(c), free(sn);
}

ZPP_TESTS(ZPP_TEST(test_reference_matches_finite_differences),
          ZPP_TEST(test_model_matches_reference), ZPP_TEST(test_half_params_give_fp32_bits),
          ZPP_TEST(test_recompute_gives_the_same_bits), ZPP_TEST(test_kept_logits_match_reference),
          ZPP_TEST(test_bad_shapes_refused),
          ZPP_TEST(test_defaults_and_init), ZPP_TEST(test_rope_tables))
