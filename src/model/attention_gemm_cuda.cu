/* model/attention_gemm_cuda.cu — the GEMM attention path
 * (attention_gemm_cuda.h has the math and the layouts).
 *
 * BATCHING. Each of the five products is one small matrix product per
 * (sequence b, query head h). The operands are read in place from the qkv
 * rows (leading dimension C + 2Ck, head h at column h*hs), so a run of
 * heads or of sequences is a strided batch for cuBLASLt. With grouped
 * queries, query head h = kv*g + j (g = H / KV) reads key/value head kv:
 * for a fixed j, the query heads j, g + j, 2g + j, ... and their key/value
 * heads 0, 1, 2, ... both step evenly (by g heads and by one head), so
 *   - per sequence b and group member j: one GEMM batched over the KV
 *     key/value heads (B*g launches), or
 *   - per query head h: one GEMM batched over the B sequences (H launches),
 * whichever launches fewer (ties: the first). With KV = H (g = 1) these are
 * the two loops GPT-2 always ran, launch for launch, so its bits are kept.
 * An output indexed by key/value head (dK, dV) is written by group member
 * j = 0 (beta 0) and added to by j = 1 .. g-1 in that order (beta 1), in
 * both schemes: the order of the sums is fixed. */
#include "model/attention_gemm_cuda.h"

#include <math.h>

#include "core/error.h"
#include "model/attention_cuda.h"
#include "model/cuda_elem.cuh"

namespace {

/* attention forward's softmax: rows of the (B*H) T x T fp32 score matrices
 * into probabilities in E, one warp per row; row t keeps columns 0..t
 * (causal) and zeroes the rest. The scores arrive already scaled by
 * 1/sqrt(hs) (the GEMM's alpha). Subtracting the row max first keeps every
 * exp <= 1 (no overflow) without changing the ratio. */
template <typename E>
__global__ void causal_softmax_kernel(E *prob, const float *score, size_t rows, int T) {
    size_t row = global_tid() >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    int t = (int)(row % (size_t)T);
    const float *s = score + row * T;
    E *p = prob + row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += expf(s[j] - mx);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j <= t; j += 32) st(p, j, expf(s[j] - mx) * inv);
    for (int j = t + 1 + lane; j < T; j += 32) st(p, j, 0.0f);
}

/* The softmax's Jacobian, row by row, from d P (fp32) and P (E) into d S
 * (E): with P = softmax(S), dS_j = P_j (dP_j - sum_k P_k dP_k); masked
 * entries (P = 0) give 0. */
template <typename E>
__global__ void causal_softmax_backward_kernel(E *dscore, const float *dprob, const E *prob,
                                               size_t rows, int T) {
    size_t row = global_tid() >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    int t = (int)(row % (size_t)T);
    const E *p = prob + row * T;
    const float *g = dprob + row * T;
    E *d = dscore + row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += ld(p, j) * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j <= t; j += 32) st(d, j, ld(p, j) * (g[j] - dot));
    for (int j = t + 1 + lane; j < T; j += 32) st(d, j, 0.0f);
}

/* One operand of the per-(b, h) products: that of (b, h) starts at element
 * b*sb + head*sh of p, head = h for an operand of the query heads, h / g
 * for one of the key/value heads (kv). */
struct operand {
    const void *p;
    int64_t ld, sb, sh;
    bool kv;
};

static size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* C = alpha op(A) op(B) for every (b, h), batched as the file's header
 * says; A and B in E, C in ct. C of the key/value heads is summed over
 * the group (beta 0 for its first member, 1 for the others). */
static zpp_status attn_gemm(zpp_cu *cu, const zpp_attn_gemm_shape *s, int ta, int tb, int M,
                            int N, int K, float alpha, operand A, operand B, operand C,
                            cudaDataType_t ct, const char *what) {
    const int g = s->H / s->KV;
    const operand *op[3] = {&A, &B, &C};
    const size_t bytes[3] = {cu->es, cu->es, type_bytes(ct)};
    const char *base[3];
    int64_t off[3], stride[3];
    if ((int64_t)s->B * g <= s->H) { /* per (b, j), batched over the KV heads */
        for (int b = 0; b < s->B; b++)
            for (int j = 0; j < g; j++) {
                for (int i = 0; i < 3; i++) {
                    off[i] = b * op[i]->sb + (op[i]->kv ? 0 : j * op[i]->sh);
                    stride[i] = op[i]->kv ? op[i]->sh : g * op[i]->sh;
                    base[i] = (const char *)op[i]->p + off[i] * (int64_t)bytes[i];
                }
                const float beta = C.kv && j > 0 ? 1.0f : 0.0f;
                ZPP_CHECK(zpp_cu_gemm(cu, cu->et, ct, ta, tb, M, N, K, alpha, base[0], A.ld,
                                      stride[0], base[1], B.ld, stride[1], beta, (void *)base[2],
                                      C.ld, stride[2], s->KV, NULL, what));
            }
        return ZPP_OK;
    }
    for (int h = 0; h < s->H; h++) { /* per query head, batched over the sequences */
        for (int i = 0; i < 3; i++) {
            off[i] = (op[i]->kv ? h / g : h) * op[i]->sh;
            stride[i] = op[i]->sb;
            base[i] = (const char *)op[i]->p + off[i] * (int64_t)bytes[i];
        }
        const float beta = C.kv && h % g > 0 ? 1.0f : 0.0f;
        ZPP_CHECK(zpp_cu_gemm(cu, cu->et, ct, ta, tb, M, N, K, alpha, base[0], A.ld, stride[0],
                              base[1], B.ld, stride[1], beta, (void *)base[2], C.ld, stride[2],
                              s->B, NULL, what));
    }
    return ZPP_OK;
}

/* The operands every product reads, for qkv (or dqkv) at p. */
struct qkv_operands {
    operand q, k, v;
};

static qkv_operands qkv_of(const zpp_cu *cu, const zpp_attn_gemm_shape *s, const void *p) {
    const int64_t C = (int64_t)s->H * s->hs, Ck = (int64_t)s->KV * s->hs, W = C + 2 * Ck;
    const char *c = (const char *)p;
    qkv_operands o;
    o.q = operand{c, W, s->T * W, s->hs, false};
    o.k = operand{c + C * (int64_t)cu->es, W, s->T * W, s->hs, true};
    o.v = operand{c + (C + Ck) * (int64_t)cu->es, W, s->T * W, s->hs, true};
    return o;
}

/* A T x T matrix per (b, h): prob, score, dscore. */
static operand square_of(const void *p, const zpp_attn_gemm_shape *s) {
    const int64_t TT = (int64_t)s->T * s->T;
    return operand{p, s->T, s->H * TT, TT, false};
}

static zpp_status check_shape(const zpp_cu *cu, const zpp_attn_gemm_shape *s, const char *op) {
    if (!s || s->B < 1 || s->T < 1 || s->H < 1 || s->KV < 1 || s->hs < 1 || s->H % s->KV)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: attention %s: B %d T %d H %d KV %d hs %d (each >= 1, H a "
                         "multiple of KV)", cu->who, op, s ? s->B : 0, s ? s->T : 0,
                         s ? s->H : 0, s ? s->KV : 0, s ? s->hs : 0);
    return ZPP_OK;
}

} /* namespace */

zpp_status zpp_attn_gemm_forward(zpp_cu *cu, const zpp_attn_gemm_shape *s, void *y, void *prob,
                                 float *score, const void *qkv) {
    ZPP_CHECK(check_shape(cu, s, "forward"));
    const float scale = 1.0f / sqrtf((float)s->hs);
    const int T = s->T, hs = s->hs;
    const int64_t C = (int64_t)s->H * hs;
    const qkv_operands x = qkv_of(cu, s, qkv);
    const operand P = square_of(prob, s), S = square_of(score, s);
    const operand Y = {y, C, T * C, hs, false};
    ZPP_CHECK(attn_gemm(cu, s, 0, 1, T, T, hs, scale, x.q, x.k, S, CUDA_R_32F,
                        "attention Q K^T"));
    const size_t rows = (size_t)s->B * s->H * T;
    ZPP_WITH_E(cu->dtype, causal_softmax_kernel<<<zpp_cu_grid_rows(rows), kThreads, 0,
                                                  cu->stream>>>((E *)prob, score, rows, T));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), "attention softmax");
    return attn_gemm(cu, s, 0, 0, T, hs, T, 1.0f, P, x.v, Y, cu->et, "attention P V");
}

zpp_status zpp_attn_gemm_backward(zpp_cu *cu, const zpp_attn_gemm_shape *s, void *dqkv,
                                  float *score, void *dscore, const void *dy, const void *prob,
                                  const void *qkv) {
    ZPP_CHECK(check_shape(cu, s, "backward"));
    const float scale = 1.0f / sqrtf((float)s->hs);
    const int T = s->T, hs = s->hs;
    const int64_t C = (int64_t)s->H * hs;
    const qkv_operands x = qkv_of(cu, s, qkv), d = qkv_of(cu, s, dqkv);
    const operand P = square_of(prob, s), dP = square_of(score, s), dS = square_of(dscore, s);
    const operand dY = {dy, C, T * C, hs, false};
    ZPP_CHECK(attn_gemm(cu, s, 0, 1, T, T, hs, 1.0f, dY, x.v, dP, CUDA_R_32F,
                        "attention backward dY V^T"));
    const size_t rows = (size_t)s->B * s->H * T;
    ZPP_WITH_E(cu->dtype, causal_softmax_backward_kernel<<<zpp_cu_grid_rows(rows), kThreads, 0,
                                                           cu->stream>>>(
                              (E *)dscore, score, (const E *)prob, rows, T));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), "attention softmax backward");
    ZPP_CHECK(attn_gemm(cu, s, 0, 0, T, hs, T, scale, dS, x.k, d.q, cu->et,
                        "attention backward dS K"));
    ZPP_CHECK(attn_gemm(cu, s, 1, 0, T, hs, T, scale, dS, x.q, d.k, cu->et,
                        "attention backward dS^T Q"));
    return attn_gemm(cu, s, 1, 0, T, hs, T, 1.0f, P, dY, d.v, cu->et,
                     "attention backward P^T dY");
}

zpp_status zpp_attn_run_forward(zpp_cu *cu, const zpp_attn_cudnn_use *cudnn, int fused,
                                const zpp_attn_gemm_shape *s, void *y, void *att, float *score,
                                const void *qkv) {
    if (cudnn->ctx)
        return zpp_attn_cudnn_forward(cudnn->ctx, y, (float *)att, qkv, s->B, cudnn->workspace);
    if (fused)
        return zpp_attn_gqa_forward(y, (float *)att, qkv, s->B, s->T, s->H, s->KV, s->hs,
                                    cu->stream);
    return zpp_attn_gemm_forward(cu, s, y, att, score, qkv);
}

zpp_status zpp_attn_run_backward(zpp_cu *cu, const zpp_attn_cudnn_use *cudnn, int fused,
                                 const zpp_attn_gemm_shape *s, void *dqkv, const void *dy,
                                 const void *qkv, const void *y, const void *att, float *dsum,
                                 float *score, void *dscore) {
    if (cudnn->ctx)
        return zpp_attn_cudnn_backward(cudnn->ctx, dqkv, dy, qkv, y, (const float *)att, s->B,
                                       cudnn->workspace);
    if (fused)
        return zpp_attn_gqa_backward(dqkv, dy, qkv, y, (const float *)att, dsum, s->B, s->T,
                                     s->H, s->KV, s->hs, cu->stream);
    return zpp_attn_gemm_backward(cu, s, dqkv, score, dscore, dy, att, qkv);
}
