/* model/cuda_ops.cu — the operations every CUDA decoder shares
 * (cuda_ops.h): products through cuBLASLt, column sums, the classifier's
 * softmax cross-entropy, rounding into the working dtype. The math and
 * its precision are gpt2_cuda.cu's header comment (GEMMs, HEAD,
 * DETERMINISM); this file is the code. */
#include "model/cuda_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/cuda_elem.cuh"

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;   /* cuBLASLt workspace */
constexpr int kGemmCache = 512;                 /* cached algorithms */
constexpr int kColsumCtas = 512;                /* CTAs a column sum aims for */
constexpr size_t kColsumParts = (size_t)kColsumCtas * kThreads; /* partials per sum */
constexpr size_t kRowgroupParts = 4 * kColsumParts; /* G x C partials per sum (rowgroups) */

struct gemm_key {
    int64_t lda, ldb, ldc, sA, sB, sC;
    int32_t ta, tb, M, N, K, batch;
    uint32_t alA, alB, alC, atype, ctype, bias; /* bias: its alignment, 0 without */
    uint32_t act, alX;                         /* zpp_cu_act; aux's alignment */
};

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */

/* fp32 -> E (the residual gradient, before it enters products). */
template <typename E>
__global__ void round_kernel(E *dst, const float *src, size_t n, bool vec) {
    size_t n8 = vec ? n / 8 : 0;
    for (size_t i = global_tid(); i < n8; i += grid_threads()) {
        float x[8];
        load8(src + 8 * i, x);
        store8(dst + 8 * i, x);
    }
    for (size_t i = 8 * n8 + global_tid(); i < n; i += grid_threads()) st(dst, i, src[i]);
}

/* The end of every column sum: thread c of column block blockIdx.x holds
 * its CTA's sums (tw, tb) of column c over the CTA's chunk of rows; they
 * become the chunk's partials, and the last CTA of the column block to
 * finish (a counter per block, taken after a fence that publishes the
 * partials) adds the partials of its columns, chunks in order, into the
 * gradient and resets the counter for the next sum. */
__device__ __forceinline__ void colsum_finish(void *db, void *dw, int gd, float *part,
                                              unsigned *count, int W, int c, float tw, float tb) {
    __shared__ bool last;
    const int chunks = (int)gridDim.y;
    float *pw = part, *pb = part + (size_t)chunks * W;
    if (c < W) {
        if (dw) pw[(size_t)blockIdx.y * W + c] = tw;
        pb[(size_t)blockIdx.y * W + c] = tb;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[blockIdx.x], 1u) == (unsigned)chunks - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (c < W) {
        tw = 0.0f, tb = 0.0f;
        for (int k = 0; k < chunks; k++) {
            if (dw) tw += __ldcg(pw + (size_t)k * W + c);
            tb += __ldcg(pb + (size_t)k * W + c);
        }
        if (dw) grad_add(dw, gd, c, tw);
        grad_add(db, gd, c, tb);
    }
    if (threadIdx.x == 0) count[blockIdx.x] = 0;
}

/* Column sums, deterministic: CTA (cx, cy) sums column
 * c = cx * blockDim.x + tid over rows [cy R, (cy + 1) R), rows in order,
 * into its partial, and colsum_finish adds the partials. Whichever CTA
 * finishes last, the sums and their order are the same: the same shape
 * gives the same bits. Threads run along a row, so every load is
 * coalesced. A bias gradient sums dy into db; with the LayerNorm's
 * statistics (mean != NULL, dw too) also dy * (x - mean) rstd into dw
 * (weight and bias). */
template <typename T>
__global__ void colsum_kernel(void *db, void *dw, int gd, float *part, unsigned *count,
                              const T *dy, const float *x, const float *mean, const float *rstd,
                              int n, int W, int R) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    float sw = 0.0f, sb = 0.0f;
    if (c < W) {
        int r0 = blockIdx.y * R, r1 = min(n, r0 + R);
#pragma unroll 4
        for (int r = r0; r < r1; r++) {
            float d = ld(dy, (size_t)r * W + c);
            if (mean) sw += d * ((x[(size_t)r * W + c] - mean[r]) * rstd[r]);
            sb += d;
        }
    }
    colsum_finish(db, mean ? dw : NULL, gd, part, count, W, c, sw, sb);
}

/* colsum_kernel for rows of whole 16-byte vectors (W % 8 == 0, aligned),
 * with the same grid and the same partials: a CTA still owns 256 columns
 * and R rows, but its 8 warps split the rows (warp w takes rows r0 + w,
 * r0 + w + 8, ..., in order) and each lane reads 8 adjacent columns a
 * load, so a warp reads whole rows of 512 or 1,024 bytes and every thread
 * has several 16-byte loads in flight (the scalar kernel, one 2- or 4-byte
 * load a thread a row, waited on memory latency: half the bandwidth). The
 * warps' sums meet in shared memory, added warp 0 first; colsum_finish
 * adds the CTAs' partials as for colsum_kernel. A fixed order
 * throughout: the same shape gives the same bits (not the scalar kernel's
 * bits: the rows are associated differently). */
constexpr int kColsumWarps = kThreads / 32;
template <typename T>
__global__ void __launch_bounds__(kThreads)
colsum8_kernel(void *db, void *dw, int gd, float *part, unsigned *count, const T *dy,
               const float *x, const float *mean, const float *rstd, int n, int W, int R) {
    __shared__ float red[2][kColsumWarps][kThreads];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = blockIdx.x * kThreads + 8 * lane; /* this lane's 8 columns */
    float sw[8] = {0}, sb[8] = {0};
    if (c0 < W) {
        const int r0 = blockIdx.y * R, r1 = min(n, r0 + R);
#pragma unroll 4
        for (int r = r0 + warp; r < r1; r += kColsumWarps) {
            float d[8];
            load8(dy + (size_t)r * W + c0, d);
            if (mean) {
                float xv[8];
                load8(x + (size_t)r * W + c0, xv);
                const float m = mean[r], s = rstd[r];
#pragma unroll
                for (int k = 0; k < 8; k++) sw[k] += d[k] * ((xv[k] - m) * s);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) sb[k] += d[k];
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        red[0][warp][8 * lane + k] = sw[k];
        red[1][warp][8 * lane + k] = sb[k];
    }
    __syncthreads();
    const int j = threadIdx.x, c = blockIdx.x * kThreads + j; /* one column a thread */
    float tw = 0.0f, tb = 0.0f;
    for (int w = 0; w < kColsumWarps; w++) {
        tw += red[0][w][j];
        tb += red[1][w][j];
    }
    colsum_finish(db, mean ? dw : NULL, gd, part, count, W, c, tw, tb);
}

/* zpp_cu_rowgroup_finish: a CTA owns 32 columns; warp w adds groups w,
 * w + 32, ... of each (in order, 128-byte loads along the row; 32 warps,
 * so each waits on few loads: G runs to several hundred), and warp 0 adds
 * the warps' sums in warp order: a fixed order, whatever ran first. */
constexpr int kFinishWarps = 32;
__global__ void __launch_bounds__(32 * kFinishWarps)
rowgroup_finish_kernel(void *dw, void *db, int gd, void *ds, bool ds_add, const float *part,
                       int G, int C) {
    __shared__ float red[3][kFinishWarps][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    float t[3] = {0.0f, 0.0f, 0.0f};
    if (c < C)
#pragma unroll 4
        for (int k = warp; k < G; k += kFinishWarps) {
            t[0] += part[(size_t)k * C + c];
            t[1] += part[(size_t)(G + k) * C + c];
            if (ds) t[2] += part[(size_t)(2 * G + k) * C + c];
        }
    for (int j = 0; j < 3; j++) red[j][warp][lane] = t[j];
    __syncthreads();
    if (warp != 0 || c >= C) return;
    t[0] = t[1] = t[2] = 0.0f;
    for (int w = 0; w < kFinishWarps; w++)
        for (int j = 0; j < 3; j++) t[j] += red[j][w][lane];
    grad_add(dw, gd, c, t[0]);
    grad_add(db, gd, c, t[1]);
    if (ds && ds_add) grad_add(ds, gd, c, t[2]); /* a bias gradient */
    else if (ds) ((float *)ds)[c] = t[2];        /* fp32 scratch */
}

/* dst[i] = src[i] in fp32: a bias in E for a product with an fp32 output,
 * whose epilogue takes the bias in the output's type. */
template <typename E>
__global__ void widen_kernel(float *dst, const E *src, int n) {
    for (int i = (int)global_tid(); i < n; i += (int)grid_threads()) dst[i] = ld(src, i);
}

/* linear_forward without the bias epilogue: out = bias broadcast over rows, or
 * out = resid + bias (the CPU's memcpy of the residual, then += bias); the
 * GEMM then adds the product with beta = 1. O is fp32 for outputs on the
 * residual stream, E for the others (a bias in E is exact in E). */
template <typename O, typename E>
__global__ void rows_init_kernel(O *out, const float *resid, const E *bias, size_t n, int W,
                                 bool vec) {
    size_t total = n * (size_t)W;
    if (vec) { /* W % 8 == 0 */
        for (size_t i = global_tid(); i < total / 8; i += grid_threads()) {
            size_t e = 8 * i;
            float x[8], r[8];
            load8(bias + e % (size_t)W, x);
            if (resid) {
                load8(resid + e, r);
#pragma unroll
                for (int k = 0; k < 8; k++) x[k] = r[k] + x[k];
            }
            store8(out + e, x);
        }
        return;
    }
    for (size_t i = global_tid(); i < total; i += grid_threads()) {
        float b = ld(bias, i % (size_t)W);
        st(out, i, resid ? resid[i] + b : b);
    }
}

/* Online softmax statistics: (m, s) stands for s * e^m; merging two
 * keeps the larger exponent, so nothing overflows. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    if (mx == -INFINITY) return; /* both empty */
    s = s * expf(m - mx) + s2 * expf(m2 - mx);
    m = mx;
}

/* The classifier's softmax and cross-entropy (zpp_cu_head_forward), one CTA
 * per row of logits in E, in place:
 *   lse = log sum_v exp(l_v),  loss = lse - l_target,
 * and, with targets (a forward a backward may follow), the row's d logits
 * up to the factor loss_scale / n that the backward's products apply as
 * their alpha, written over the logits:
 *   dlog_v = exp(l_v - lse) - [v == target]   (in E).
 * Every sum and exponential is fp32. The row is read twice: once for the
 * online softmax statistics, once for the probabilities (a CTA's row, V e
 * bytes, is still in L2); with vec (V % 8 == 0, aligned rows) 8 columns at
 * a time, so each thread has 16 bytes in flight per load (bf16: 8 columns;
 * fp32: two loads): the kernel is bound by how many loads are in flight,
 * not by arithmetic. Each thread reads an element before it writes its d
 * logit, and no other thread touches it, so in place is safe. Without
 * targets the loss column holds lse - max (the CPU's value; the mean is
 * NaN) and the logits stay. Rows are V wide; the softmax runs over the
 * first Vr (real_vocab_size, model.h), the rest are padding, whose d
 * logits are 0. */
template <typename E>
__global__ void cross_entropy_kernel(E *logits, float *lse, float *losses,
                                     const int32_t *targets, int V, int Vr, bool vec) {
    __shared__ float sm[32], ss[32], z_row;
    size_t r = blockIdx.x;
    const E *l = logits + r * V;
    float m = -INFINITY, s = 0.0f;
    if (vec) {
        for (int v0 = 8 * threadIdx.x; v0 < Vr; v0 += 8 * blockDim.x) {
            float f[8], mx = -INFINITY;
            load8(l + v0, f);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (v0 + k >= Vr) f[k] = -INFINITY; /* padding: outside the softmax */
                mx = fmaxf(mx, f[k]);
            }
            if (mx > m) {
                s *= expf(m - mx);
                m = mx;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) s += expf(f[k] - m);
        }
    } else {
        for (int v = threadIdx.x; v < Vr; v += blockDim.x) {
            float x = ld(l, v);
            if (x > m) {
                s = s * expf(m - x) + 1.0f;
                m = x;
            } else {
                s += expf(x - m);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sm[warp] = m, ss[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nw; w++) lse_merge(m, s, sm[w], ss[w]);
        float ls = logf(s);
        lse[r] = m + ls;
        losses[r] = targets ? m + ls - ld(l, targets[r]) : ls;
        z_row = m + ls;
    }
    if (!targets) return;
    __syncthreads();
    const float z = z_row;
    const int tg = targets[r];
    E *d = logits + r * V;
    if (vec) {
        for (int v0 = 8 * threadIdx.x; v0 < V; v0 += 8 * blockDim.x) {
            float f[8];
            load8(l + v0, f);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int v = v0 + k;
                f[k] = v < Vr ? expf(f[k] - z) - (v == tg ? 1.0f : 0.0f) : 0.0f;
            }
            store8(d + v0, f);
        }
        return;
    }
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        st(d, v, v < Vr ? expf(ld(l, v) - z) - (v == tg ? 1.0f : 0.0f) : 0.0f);
}

/* x0[r] = wte[token[r]] (+ wpe[r mod T]: GPT-2's one add, as its CPU
 * model: bit-identical), fp32 rows. */
template <typename E>
__global__ void embed_forward_kernel(float *out, const int32_t *tok, const E *wte, const E *wpe,
                                     size_t n, int T, int C) {
    size_t total = n * (size_t)C;
    for (size_t i = global_tid(); i < total; i += grid_threads()) {
        size_t r = i / (size_t)C, c = i % (size_t)C;
        float x = ld(wte, (size_t)tok[r] * C + c);
        out[i] = wpe ? x + ld(wpe, (r % T) * C + c) : x;
    }
}

/* The token embedding's backward: distinct token seg_tok[s] adds its rows
 * pos[seg_start[s] .. seg_start[s+1]) (ascending) into d wte[token], in
 * fp32, rounded once: no two threads touch the same element, no atomics.
 * One thread a channel of each segment (a CTA a segment and slice). */
__global__ void embed_backward_wte_kernel(void *dwte, int gd, const float *dres,
                                          const int32_t *seg_tok, const int32_t *seg_start,
                                          const int32_t *pos, int C) {
    int s = blockIdx.x;
    int a = seg_start[s], e = seg_start[s + 1];
    const size_t row = (size_t)seg_tok[s] * C;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
        float acc = grad_ld(dwte, gd, row + c);
        for (int k = a; k < e; k++) acc += dres[(size_t)pos[k] * C + c];
        grad_st(dwte, gd, row + c, acc); /* one rounding in a 2-byte gd */
    }
}

/* The same sums, eight channels a lane: one warp a segment and slice of
 * kSliceWidth channels. A segment is a chain of dependent loads (its
 * bounds, its positions, then the rows) moving a few kB, and with random
 * tokens nearly every token is its own segment: thousands of CTAs of
 * one-channel threads spent their time waiting on that chain (0.26 ms at
 * GPT-2 124M, 8,192 tokens: 50 MB, 15 us at the memory's speed). A warp
 * a slice keeps eight times more of them in flight, with 16- and 32-byte
 * accesses. Each element's sum keeps the order above: the same bits. Needs
 * C % 8 == 0 and 16-byte aligned dwte and dres (the launcher checks). */
constexpr int kSliceWidth = 32 * 8;
template <typename G>
__global__ void embed_backward_wte8_kernel(G *dwte, bool first, const float *dres,
                                           const int32_t *seg_tok, const int32_t *seg_start,
                                           const int32_t *pos, int n_seg, int C) {
    const int slices = (C + kSliceWidth - 1) / kSliceWidth;
    const size_t warps = (size_t)n_seg * slices;
    const int lane = threadIdx.x & 31;
    for (size_t w = global_tid() / 32; w < warps; w += grid_threads() / 32) {
        const int s = (int)(w / slices);
        const int c = (int)(w % slices) * kSliceWidth + 8 * lane;
        if (c >= C) continue;
        const int a = seg_start[s], e = seg_start[s + 1];
        G *row = dwte + (size_t)seg_tok[s] * C + c;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (!first) load8(row, acc);
#pragma unroll 4
        for (int k = a; k < e; k++) {
            float d[8];
            load8(dres + (size_t)pos[k] * C + c, d);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += d[j];
        }
        store8(row, acc); /* one rounding in a 2-byte G */
    }
}

}  // namespace

struct zpp_cu_gemm_entry {
    gemm_key key;
    cublasLtMatmulAlgo_t algo;
    int used; /* 1: algo is cuBLASLt's pick; 2: cuBLASLt has none (an epilogue's) */
};

/* ------------------------------------------------------------------------ */
/* The context                                                               */
/* ------------------------------------------------------------------------ */

/* The scratch, in floats, each part on a 256-byte boundary (cuBLASLt
 * picks slower kernels for a bias that is not 16-byte aligned): 3
 * max(kRowgroupParts, W) partials (the row groups' three sums; a column
 * sum uses at most kColsumParts of the first two), W / kThreads + 1
 * counters (unsigned, in float slots), W for a widened bias. */
static size_t round64(size_t n) { return (n + 63) / 64 * 64; }
static size_t scratch_parts(int max_width) {
    size_t W = (size_t)max_width;
    return round64(3 * (kRowgroupParts > W ? kRowgroupParts : W));
}
static size_t scratch_counters(int max_width) { return round64((size_t)max_width / kThreads + 1); }
static size_t scratch_floats(int max_width) {
    return scratch_parts(max_width) + scratch_counters(max_width) + round64((size_t)max_width);
}

zpp_status zpp_cu_init(zpp_cu *cu, zpp_device *dev, zpp_dtype dtype, int max_width,
                       const char *who) {
    memset(cu, 0, sizeof *cu);
    cu->dev = dev;
    cu->stream = (cudaStream_t)dev->stream; /* the device's compute stream */
    cu->dtype = dtype;
    cu->et = dtype == ZPP_BF16 ? CUDA_R_16BF : dtype == ZPP_FP16 ? CUDA_R_16F : CUDA_R_32F;
    cu->es = zpp_dtype_size(dtype);
    cu->gdtype = ZPP_FP32;
    cu->gt = CUDA_R_32F;
    cu->gs = sizeof(float);
    cu->who = who;
    cu->max_width = max_width;
    cu->cache = (zpp_cu_gemm_entry *)calloc(kGemmCache, sizeof *cu->cache);
    if (!cu->cache) return zpp_error(ZPP_ERR_NOMEM, "%s: create: out of host memory", who);
    ZPP_CHECK(zpp_device_alloc(dev, kWorkspaceBytes, &cu->workspace));
    void *s = NULL;
    ZPP_CHECK(zpp_device_alloc(dev, scratch_floats(max_width) * sizeof(float), &s));
    cu->scratch = (float *)s;
    const size_t parts = scratch_parts(max_width), counters = scratch_counters(max_width);
    cu->colsum_part = cu->scratch;
    cu->colsum_count = (unsigned *)(cu->scratch + parts);
    cu->bias32 = cu->scratch + parts + counters;
    ZPP_CU_CHECK(who, cudaMemsetAsync(cu->colsum_count, 0, counters * sizeof(unsigned),
                                      cu->stream), "create: column sum counters");
    ZPP_LT_CHECK(who, cublasLtCreate(&cu->lt), "create: cuBLASLt handle");
    int dev_id = 0;
    ZPP_CU_CHECK(who, cudaGetDevice(&dev_id), "create: the current device");
    ZPP_CU_CHECK(who, cudaDeviceGetAttribute(&cu->sms, cudaDevAttrMultiProcessorCount, dev_id),
                 "create: the multiprocessor count");
    return ZPP_OK;
}

/* Enough groups for about 48 KB of loads in flight a multiprocessor (a
 * group's threads each hold three 32-byte rows of loads), within the
 * scratch's kRowgroupParts partials a sum. */
int zpp_cu_rowgroups(const zpp_cu *cu, int n, int C, int threads) {
    if (n <= 0) return 1;
    const int per_sm = (512 + threads - 1) / threads;
    long g = (long)cu->sms * per_sm;
    const long cap = (long)(kRowgroupParts / (size_t)(C > 0 ? C : 1));
    if (g > cap) g = cap;
    if (g > n) g = n;
    if (g < 1) g = 1;
    const long rows = (n + g - 1) / g; /* no empty group */
    return (int)((n + rows - 1) / rows);
}

float *zpp_cu_rowgroup_part(zpp_cu *cu) { return cu->colsum_part; }

zpp_status zpp_cu_set_grad_dtype(zpp_cu *cu, zpp_dtype dt) {
    if (dt != ZPP_FP32 && dt != cu->dtype)
        return zpp_error(ZPP_ERR_UNSUPPORTED, "%s: gradients in %s; this model writes them in "
                         "fp32 or in its working dtype (%s)", cu->who, zpp_dtype_name(dt),
                         zpp_dtype_name(cu->dtype));
    cu->gdtype = dt;
    cu->gt = dt == ZPP_FP32 ? CUDA_R_32F : cu->et;
    cu->gs = zpp_dtype_size(dt);
    return ZPP_OK;
}

zpp_status zpp_cu_rowgroup_finish(zpp_cu *cu, void *dw, void *db, void *ds, int ds_add, int G,
                                  int C, const char *what) {
    if (C <= 0 || G <= 0) return ZPP_OK;
    if ((size_t)G * (size_t)C > kRowgroupParts)
        return zpp_error(ZPP_ERR_INVALID, "%s: %s: %d row groups of %d columns, above the %zu "
                         "partials of the scratch", cu->who, what, G, C, kRowgroupParts);
    rowgroup_finish_kernel<<<(unsigned)((C + 31) / 32), 32 * kFinishWarps, 0, cu->stream>>>(
        dw, db, grad_code(cu->gdtype, cu->grad_first), ds, ds_add != 0, cu->colsum_part, G, C);
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), what);
    return ZPP_OK;
}

void zpp_cu_free(zpp_cu *cu) {
    if (cu->lt) (void)cublasLtDestroy(cu->lt);
    if (cu->dev) {
        zpp_device_free(cu->dev, cu->workspace);
        zpp_device_free(cu->dev, cu->scratch);
    }
    free(cu->cache);
    memset(cu, 0, sizeof *cu);
}

/* ------------------------------------------------------------------------ */
/* Products                                                                  */
/* ------------------------------------------------------------------------ */

static size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* Largest power of two (<= 256) dividing the address and, for a batch, the
 * byte stride between matrices: the alignment cuBLASLt may assume. */
static uint32_t ptr_align(const void *p, int64_t stride, int batch, size_t bytes) {
    uint64_t v = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1) v |= (uint64_t)stride * bytes;
    return (uint32_t)(v & (~v + 1));
}

/* A cuBLASLt call's description: the product's descriptor (compute and
 * scale fp32, the transposes, the bias epilogue) and the three layouts.
 * cuBLASLt is column-major: the row-major C = op(A) op(B) is computed as
 * the column-major C^T = op(B)^T op(A)^T, so its first operand (l1) is our
 * B, its second (l2) our A, and its m, n are our N, M (gpt2_cuda.cu, GEMMs). */
struct gemm_desc {
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t l1, l2, lc;
};

#define LT(call) ZPP_LT_CHECK(cu->who, call, what)

/* cuBLASLt's epilogue for a bias and an activation (zpp_cu_act). */
static cublasLtEpilogue_t epilogue_of(bool bias, zpp_cu_act act) {
    if (act == ZPP_CU_ACT_GELU) return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                            : CUBLASLT_EPILOGUE_GELU_AUX;
    if (act == ZPP_CU_ACT_DGELU) return CUBLASLT_EPILOGUE_DGELU;
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

static zpp_status describe(zpp_cu *cu, gemm_desc *d, cudaDataType_t at, cudaDataType_t ct,
                           int ta, int tb, int M, int N, int K, int64_t lda, int64_t sA,
                           int64_t ldb, int64_t sB, int64_t ldc, int64_t sC, int batch,
                           const void *bias, zpp_cu_act act, void *aux, const char *what) {
    cublasOperation_t op1 = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op2 = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescInit(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof op1));
    LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof op2));
    cublasLtEpilogue_t ep = epilogue_of(bias != NULL, act);
    if (ep != CUBLASLT_EPILOGUE_DEFAULT)
        LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (bias) { /* one value per row of cuBLASLt's D (our C^T): per column of C */
        int32_t bt = (int32_t)ct;
        LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
        LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                          sizeof bt));
    }
    if (act != ZPP_CU_ACT_NONE) { /* aux is laid out as D: ldc, C's type */
        int64_t ld = ldc;
        LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                          &aux, sizeof aux));
        LT(cublasLtMatmulDescSetAttribute(&d->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                          sizeof ld));
    }
    /* Stored shapes (before the op), column-major: B row-major K x N is
     * N x K; B row-major N x K (tb) is K x N; likewise for A. */
    LT(cublasLtMatrixLayoutInit(&d->l1, at, tb ? (uint64_t)K : (uint64_t)N,
                                tb ? (uint64_t)N : (uint64_t)K, ldb));
    LT(cublasLtMatrixLayoutInit(&d->l2, at, ta ? (uint64_t)M : (uint64_t)K,
                                ta ? (uint64_t)K : (uint64_t)M, lda));
    LT(cublasLtMatrixLayoutInit(&d->lc, ct, (uint64_t)N, (uint64_t)M, ldc));
    if (batch > 1) {
        int32_t bc = batch;
        cublasLtMatrixLayoutOpaque_t *l[3] = {&d->l1, &d->l2, &d->lc};
        const int64_t stride[3] = {sB, sA, sC};
        for (int i = 0; i < 3; i++) {
            LT(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc,
                                                sizeof bc));
            LT(cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride[i], sizeof stride[i]));
        }
    }
    return ZPP_OK;
}

/* The cached algorithm for key, asking cuBLASLt's heuristic on a miss
 * (with the pointers' real alignments). An epilogue cuBLASLt cannot do is
 * cached too (used 2), so the caller's fallback costs no second query. */
static zpp_status find_algo(zpp_cu *cu, const gemm_key *key, gemm_desc *d,
                            zpp_cu_gemm_entry **hit_p, const char *what) {
    for (int i = 0; i < kGemmCache && cu->cache[i].used; i++)
        if (memcmp(&cu->cache[i].key, key, sizeof *key) == 0) {
            *hit_p = &cu->cache[i];
            return ZPP_OK;
        }
    cublasLtMatmulPreferenceOpaque_t pref;
    uint64_t ws = kWorkspaceBytes;
    LT(cublasLtMatmulPreferenceInit(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
    /* operand 1 is B, operand 2 is A */
    LT(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &key->alB, 4));
    LT(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &key->alA, 4));
    LT(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &key->alC, 4));
    LT(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &key->alC, 4));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(cu->lt, &d->op, &d->l1, &d->l2, &d->lc,
                                                       &d->lc, &pref, 1, &res, &found);
    const bool ok = hs == CUBLAS_STATUS_SUCCESS && found >= 1 && res.state == CUBLAS_STATUS_SUCCESS;
    if (!ok && !key->bias && !key->act) {
        LT(hs);
        return zpp_error(ZPP_ERR_CUDA,
                         "%s: %s: cuBLASLt has no algorithm for the row-major product %s%s "
                         "M=%d N=%d K=%d lda=%lld ldb=%lld ldc=%lld batch %d (operands %s, "
                         "output %s)",
                         cu->who, what, key->ta ? "A^T" : "A", key->tb ? "B^T" : "B", key->M,
                         key->N, key->K, (long long)key->lda, (long long)key->ldb,
                         (long long)key->ldc, key->batch,
                         key->atype == CUDA_R_32F ? "fp32" : zpp_dtype_name(cu->dtype),
                         key->ctype == CUDA_R_32F ? "fp32" : zpp_dtype_name(cu->dtype));
    }
    int slot = 0;
    while (slot < kGemmCache && cu->cache[slot].used) slot++;
    if (slot == kGemmCache) { /* full: replace round-robin */
        slot = cu->cache_next;
        cu->cache_next = (cu->cache_next + 1) % kGemmCache;
    }
    cu->cache[slot].key = *key;
    if (ok) cu->cache[slot].algo = res.algo;
    cu->cache[slot].used = ok ? 1 : 2;
    *hit_p = &cu->cache[slot];
    return ZPP_OK;
}

zpp_status zpp_cu_gemm(zpp_cu *cu, cudaDataType_t at, cudaDataType_t ct, int ta, int tb, int M,
                       int N, int K, float alpha, const void *A, int64_t lda, int64_t sA,
                       const void *B, int64_t ldb, int64_t sB, float beta, void *C, int64_t ldc,
                       int64_t sC, int batch, const zpp_cu_epilogue *epi, const char *what) {
    const void *bias = epi ? epi->bias : NULL;
    const void *c_in = epi && epi->c_in ? epi->c_in : C;
    const zpp_cu_act act = epi ? epi->act : ZPP_CU_ACT_NONE;
    void *aux = epi ? epi->aux : NULL;
    if (act != ZPP_CU_ACT_NONE && (beta != 0.0f || batch > 1 || !aux))
        return zpp_error(ZPP_ERR_INVALID, "%s: %s: an activation epilogue takes beta 0, one "
                         "matrix and its aux matrix", cu->who, what);
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.sA = batch > 1 ? sA : 0;
    key.sB = batch > 1 ? sB : 0;
    key.sC = batch > 1 ? sC : 0;
    key.ta = ta;
    key.tb = tb;
    key.M = M;
    key.N = N;
    key.K = K;
    key.batch = batch;
    key.alA = ptr_align(A, sA, batch, type_bytes(at));
    key.alB = ptr_align(B, sB, batch, type_bytes(at));
    key.alC = ptr_align(C, sC, batch, type_bytes(ct));
    key.atype = (uint32_t)at;
    key.ctype = (uint32_t)ct;
    key.bias = bias ? ptr_align(bias, 0, 1, type_bytes(ct)) : 0;
    key.act = (uint32_t)act;
    key.alX = act != ZPP_CU_ACT_NONE ? ptr_align(aux, 0, 1, type_bytes(ct)) : 0;
    gemm_desc d;
    ZPP_CHECK(describe(cu, &d, at, ct, ta, tb, M, N, K, lda, sA, ldb, sB, ldc, sC, batch, bias,
                       act, aux, what));
    zpp_cu_gemm_entry *hit = NULL;
    ZPP_CHECK(find_algo(cu, &key, &d, &hit, what));
    if (hit->used == 2)
        return zpp_error(ZPP_ERR_UNSUPPORTED, "%s: %s: cuBLASLt has no algorithm with this "
                         "epilogue (%s%s)", cu->who, what, bias ? "bias" : "",
                         act == ZPP_CU_ACT_GELU ? " gelu" : act == ZPP_CU_ACT_DGELU ? " dgelu" : "");
    LT(cublasLtMatmul(cu->lt, &d.op, &alpha, B, &d.l1, A, &d.l2, &beta, c_in, &d.lc, C, &d.lc,
                      &hit->algo, cu->workspace, kWorkspaceBytes, cu->stream));
    return ZPP_OK;
}

#undef LT

zpp_status zpp_cu_mm(zpp_cu *cu, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                     int lda, const void *B, int ldb, float beta, void *C, cudaDataType_t ct,
                     int ldc, const char *what) {
    return zpp_cu_gemm(cu, cu->et, ct, ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc,
                       0, 1, NULL, what);
}

/* Rows per chunk of a column sum: enough chunks that the partial sums
 * fill the GPU (about kColsumCtas CTAs), at most max(kColsumParts, W)
 * partials. */
static int colsum_rows(int n, int W) {
    int cx = (W + kThreads - 1) / kThreads;
    int chunks = (kColsumCtas + cx - 1) / cx;
    if ((size_t)chunks * W > (size_t)kColsumParts) chunks = (int)(kColsumParts / W);
    if (chunks < 1) chunks = 1;
    if (chunks > n) chunks = n;
    return (n + chunks - 1) / chunks;
}

zpp_status zpp_cu_colsum(zpp_cu *cu, void *db, void *dw, const void *dy, cudaDataType_t dt,
                         const float *x, const float *mean, const float *rstd, int n, int W,
                         const char *what) {
    if (W > cu->max_width)
        return zpp_error(ZPP_ERR_INVALID, "%s: %s: column sum of rows %d wide, above the %d "
                         "the context was made for", cu->who, what, W, cu->max_width);
    if (n <= 0 || W <= 0) return ZPP_OK;
    int R = colsum_rows(n, W), chunks = (n + R - 1) / R;
    dim3 grid((unsigned)((W + kThreads - 1) / kThreads), (unsigned)chunks);
    /* whole 16-byte vectors: every row starts aligned when W % 8 == 0 */
    const bool v = W % 8 == 0 && zpp_cu_vec8_ok(dy, x);
    const int gd = grad_code(cu->gdtype, cu->grad_first);
    if (dt == CUDA_R_32F && v)
        colsum8_kernel<float><<<grid, kThreads, 0, cu->stream>>>(
            db, dw, gd, cu->colsum_part, cu->colsum_count, (const float *)dy, x, mean, rstd, n,
            W, R);
    else if (dt == CUDA_R_32F)
        colsum_kernel<float><<<grid, kThreads, 0, cu->stream>>>(
            db, dw, gd, cu->colsum_part, cu->colsum_count, (const float *)dy, x, mean, rstd, n,
            W, R);
    else if (v)
        ZPP_WITH_E(cu->dtype, colsum8_kernel<E><<<grid, kThreads, 0, cu->stream>>>(
                                  db, dw, gd, cu->colsum_part, cu->colsum_count, (const E *)dy, x,
                                  mean, rstd, n, W, R));
    else
        ZPP_WITH_E(cu->dtype, colsum_kernel<E><<<grid, kThreads, 0, cu->stream>>>(
                                  db, dw, gd, cu->colsum_part, cu->colsum_count, (const E *)dy, x,
                                  mean, rstd, n, W, R));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), what);
    return ZPP_OK;
}

/* The bias and the residual (beta = 1 on resid as cuBLASLt's C) join the
 * product in its epilogue, so out is written once; where cuBLASLt has no
 * algorithm for that, rows_init_kernel writes [resid +] bias first and the
 * product adds to it. */
zpp_status zpp_cu_linear_forward(zpp_cu *cu, void *out, cudaDataType_t ot, const float *resid,
                                 const void *inp, const void *W, const void *bias, int n, int IC,
                                 int OC, const char *what) {
    const void *b = bias;
    if (bias && ot == CUDA_R_32F && cu->et != CUDA_R_32F) { /* the epilogue's bias: out's type */
        if (OC > cu->max_width)
            return zpp_error(ZPP_ERR_INVALID, "%s: %s: a bias of %d, above the %d the context "
                             "was made for", cu->who, what, OC, cu->max_width);
        ZPP_WITH_E(cu->dtype, widen_kernel<<<zpp_cu_grid_for((size_t)OC), kThreads, 0,
                                             cu->stream>>>(cu->bias32, (const E *)bias, OC));
        ZPP_CU_CHECK(cu->who, cudaGetLastError(), what);
        b = cu->bias32;
    }
    const float beta = resid ? 1.0f : 0.0f;
    zpp_cu_epilogue epi = {b, resid};
    zpp_status st = zpp_cu_gemm(cu, cu->et, ot, 0, 1, n, OC, IC, 1.0f, inp, IC, 0, W, IC, 0, beta,
                                out, OC, 0, 1, &epi, what);
    if (st != ZPP_ERR_UNSUPPORTED || !bias) return st;
    const bool v = OC % 8 == 0 && zpp_cu_vec8_ok(out, resid, bias);
    const unsigned grid = zpp_cu_grid_for(v ? (size_t)n * OC / 8 : (size_t)n * OC);
    if (ot == CUDA_R_32F)
        ZPP_WITH_E(cu->dtype, rows_init_kernel<<<grid, kThreads, 0, cu->stream>>>(
                                  (float *)out, resid, (const E *)bias, (size_t)n, OC, v));
    else
        ZPP_WITH_E(cu->dtype, rows_init_kernel<<<grid, kThreads, 0, cu->stream>>>(
                                  (E *)out, resid, (const E *)bias, (size_t)n, OC, v));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), what);
    return zpp_cu_mm(cu, 0, 1, n, OC, IC, 1.0f, inp, IC, W, IC, 1.0f, out, ot, OC, what);
}

zpp_status zpp_cu_linear_gelu_forward(zpp_cu *cu, void *out, void *pre, const void *inp,
                                      const void *W, const void *bias, int n, int IC, int OC,
                                      const char *what) {
    zpp_cu_epilogue epi = {bias, NULL, ZPP_CU_ACT_GELU, pre};
    return zpp_cu_gemm(cu, cu->et, cu->et, 0, 1, n, OC, IC, 1.0f, inp, IC, 0, W, IC, 0, 0.0f, out,
                       OC, 0, 1, &epi, what);
}

/* d inp first, so that an epilogue cuBLASLt cannot do returns before
 * anything is written. */
static zpp_status linear_backward(zpp_cu *cu, void *dinp, cudaDataType_t it, void *dW,
                                  void *db, const void *dout, const float *dout_f32,
                                  const void *inp, const void *W, const void *gelu_pre, int n,
                                  int IC, int OC, const char *what) {
    zpp_cu_epilogue epi = {NULL, NULL, gelu_pre ? ZPP_CU_ACT_DGELU : ZPP_CU_ACT_NONE,
                           (void *)gelu_pre};
    ZPP_CHECK(zpp_cu_gemm(cu, cu->et, it, 0, 0, n, IC, OC, 1.0f, dout, OC, 0, W, IC, 0, 0.0f, dinp,
                          IC, 0, 1, &epi, what));
    ZPP_CHECK(zpp_cu_mm(cu, 1, 0, OC, IC, n, 1.0f, dout, OC, inp, IC, cu->grad_first ? 0.0f : 1.0f,
                        dW, cu->gt, IC, what));
    if (!db) return ZPP_OK;
    return dout_f32 ? zpp_cu_colsum(cu, db, NULL, dout_f32, CUDA_R_32F, NULL, NULL, NULL, n, OC,
                                    what)
                    : zpp_cu_colsum(cu, db, NULL, dout, cu->et, NULL, NULL, NULL, n, OC, what);
}

zpp_status zpp_cu_linear_backward(zpp_cu *cu, void *dinp, cudaDataType_t it, void *dW,
                                  void *db, const void *dout, const float *dout_f32,
                                  const void *inp, const void *W, int n, int IC, int OC,
                                  const char *what) {
    return linear_backward(cu, dinp, it, dW, db, dout, dout_f32, inp, W, NULL, n, IC, OC, what);
}

zpp_status zpp_cu_linear_dgelu_backward(zpp_cu *cu, void *dpre, void *dW, void *db,
                                        const void *dout, const float *dout_f32, const void *inp,
                                        const void *W, const void *pre, int n, int IC, int OC,
                                        const char *what) {
    return linear_backward(cu, dpre, cu->et, dW, db, dout, dout_f32, inp, W, pre, n, IC, OC,
                           what);
}

zpp_status zpp_cu_cross_entropy(zpp_cu *cu, void *logits, float *lse, float *losses,
                                const int32_t *targets, int rows, int V, int Vr) {
    if (rows <= 0) return ZPP_OK;
    const bool v = V % 8 == 0 && zpp_cu_vec8_ok(logits, NULL);
    ZPP_WITH_E(cu->dtype, cross_entropy_kernel<E><<<(unsigned)rows, kThreads, 0, cu->stream>>>(
                              (E *)logits, lse, losses, targets, V, Vr, v));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), "softmax cross-entropy");
    return ZPP_OK;
}

zpp_status zpp_cu_round(zpp_cu *cu, void *dst, const float *src, size_t n, const char *what) {
    if (cu->et == CUDA_R_32F) {
        if (dst != src)
            ZPP_CU_CHECK(cu->who, cudaMemcpyAsync(dst, src, n * sizeof(float),
                                                  cudaMemcpyDeviceToDevice, cu->stream), what);
        return ZPP_OK;
    }
    const bool v = zpp_cu_vec8_ok(dst, src);
    ZPP_WITH_E(cu->dtype, round_kernel<<<zpp_cu_grid_for(v ? n / 8 : n), kThreads, 0,
                                         cu->stream>>>((E *)dst, src, n, v));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), what);
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* The token side                                                            */
/* ------------------------------------------------------------------------ */

zpp_status zpp_cu_batch_init(zpp_cu_batch *b, zpp_cu *cu, size_t nmax, int vocab) {
    memset(b, 0, sizeof *b);
    b->nmax = nmax;
    b->vocab = vocab;
    const size_t ints = 5 * nmax + 1;
    b->h_count = (int32_t *)calloc((size_t)vocab, sizeof *b->h_count);
    if (!b->h_count) return zpp_error(ZPP_ERR_NOMEM, "%s: create: out of host memory", cu->who);
    void *p = NULL;
    ZPP_CHECK(zpp_device_alloc(cu->dev, ints * sizeof(int32_t), &p));
    b->d_ints = (int32_t *)p;
    ZPP_CU_CHECK(cu->who, cudaMallocHost(&p, ints * sizeof(int32_t)),
                 "create: pinned staging for the batch");
    b->h_ints = (int32_t *)p;
    ZPP_CU_CHECK(cu->who, cudaMallocHost(&p, nmax * sizeof(float)),
                 "create: pinned staging for losses");
    b->h_losses = (float *)p;
    ZPP_CU_CHECK(cu->who, cudaEventCreateWithFlags(&b->staged, cudaEventDisableTiming),
                 "create: batch copy event");
    return ZPP_OK;
}

void zpp_cu_batch_free(zpp_cu_batch *b, zpp_cu *cu) {
    if (b->staged) (void)cudaEventDestroy(b->staged);
    if (b->h_losses) (void)cudaFreeHost(b->h_losses);
    if (b->h_ints) (void)cudaFreeHost(b->h_ints);
    if (cu->dev) zpp_device_free(cu->dev, b->d_ints);
    free(b->h_count);
    memset(b, 0, sizeof *b);
}

zpp_status zpp_cu_batch_set(zpp_cu *cu, zpp_cu_batch *b, const int32_t *tokens,
                            const int32_t *targets, size_t n) {
    const int V = b->vocab;
    /* The previous batch's copy must have left the staging buffer. */
    ZPP_CU_CHECK(cu->who, cudaEventSynchronize(b->staged),
                 "set_batch: wait for the previous batch copy");
    /* Staging layout (int32): tokens[n] targets[n] seg_tok[k] seg_start[k+1]
     * pos[n], k = distinct tokens. Counting sort of positions by token:
     * stable, so each token's positions stay ascending. */
    int32_t *h = b->h_ints;
    memcpy(h, tokens, n * sizeof(int32_t));
    if (targets) memcpy(h + n, targets, n * sizeof(int32_t));
    else memset(h + n, 0, n * sizeof(int32_t));
    int32_t *cnt = b->h_count;
    memset(cnt, 0, (size_t)V * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) cnt[tokens[i]]++;
    int32_t *seg_tok = h + 2 * n;
    int k = 0;
    for (int v = 0; v < V; v++)
        if (cnt[v]) seg_tok[k++] = v;
    int32_t *seg_start = seg_tok + k, *pos = seg_start + k + 1;
    int32_t off = 0;
    for (int s = 0; s < k; s++) {
        int v = seg_tok[s];
        seg_start[s] = off;
        off += cnt[v];
        cnt[v] = seg_start[s]; /* now: the next free slot of token v */
    }
    seg_start[k] = off;
    for (size_t i = 0; i < n; i++) pos[cnt[tokens[i]]++] = (int32_t)i;

    size_t total = 3 * n + 2 * (size_t)k + 1;
    ZPP_CU_CHECK(cu->who, cudaMemcpyAsync(b->d_ints, h, total * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, cu->stream),
                 "set_batch: copy the batch to the device");
    ZPP_CU_CHECK(cu->who, cudaEventRecord(b->staged, cu->stream), "set_batch: record the copy");
    b->d_tokens = b->d_ints;
    b->d_targets = b->d_ints + n;
    b->d_seg_tok = b->d_ints + 2 * n;
    b->d_seg_start = b->d_seg_tok + k;
    b->d_pos = b->d_seg_start + k + 1;
    b->n_seg = k;
    return ZPP_OK;
}

zpp_status zpp_cu_embed_forward(zpp_cu *cu, const zpp_cu_batch *b, float *out, const void *wte,
                                const void *wpe, size_t n, int T, int C) {
    ZPP_WITH_E(cu->dtype, embed_forward_kernel<<<zpp_cu_grid_for(n * C), kThreads, 0,
                                                 cu->stream>>>(out, b->d_tokens, (const E *)wte,
                                                               (const E *)wpe, n, T, C));
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), "embedding forward");
    return ZPP_OK;
}

zpp_status zpp_cu_embed_backward(zpp_cu *cu, const zpp_cu_batch *b, void *dwte,
                                 const float *dres, int C) {
    if (b->n_seg == 0) return ZPP_OK;
    if (C % 8 == 0 && zpp_cu_vec8_ok(dwte, dres)) {
        const size_t warps = (size_t)b->n_seg * ((C + kSliceWidth - 1) / kSliceWidth);
        const unsigned grid = zpp_cu_grid_for(warps * 32);
        const bool first = cu->grad_first != 0;
        /* E here is G, the gradients' dtype (fp32 or the working dtype) */
        ZPP_WITH_E(cu->gdtype, embed_backward_wte8_kernel<<<grid, kThreads, 0, cu->stream>>>(
                                   (E *)dwte, first, dres, b->d_seg_tok, b->d_seg_start,
                                   b->d_pos, b->n_seg, C));
    } else {
        unsigned cy = (unsigned)((C + kThreads - 1) / kThreads);
        if (cy > 65535u) cy = 65535u;
        dim3 grid((unsigned)b->n_seg, cy);
        embed_backward_wte_kernel<<<grid, kThreads, 0, cu->stream>>>(
            dwte, grad_code(cu->gdtype, cu->grad_first), dres, b->d_seg_tok, b->d_seg_start,
            b->d_pos, C);
    }
    ZPP_CU_CHECK(cu->who, cudaGetLastError(), "token embedding backward");
    return ZPP_OK;
}

zpp_status zpp_cu_mean_loss(zpp_cu *cu, zpp_cu_batch *b, const float *losses, size_t n,
                            float *mean) {
    cudaError_t e = cudaMemcpyAsync(b->h_losses, losses, n * sizeof(float),
                                    cudaMemcpyDeviceToHost, cu->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
    if (e != cudaSuccess) {
        *mean = NAN;
        return zpp_error(ZPP_ERR_CUDA, "%s loss: %s (a kernel of this micro-batch failed)",
                         cu->who, cudaGetErrorString(e));
    }
    double total = 0.0;
    for (size_t r = 0; r < n; r++) total += b->h_losses[r];
    *mean = (float)(total / (double)n);
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* The classifier                                                            */
/* ------------------------------------------------------------------------ */

void zpp_cu_head_take(zpp_cu_head *h, zpp_arena *a, size_t nmax, size_t V, size_t es) {
    h->dlogits = zpp_arena_take_bytes(a, nmax, V, es);
    h->lse = zpp_arena_take(a, nmax, 1);
    h->losses = zpp_arena_take(a, nmax, 1);
    h->kept = zpp_arena_take(a, 1, V);
}

zpp_status zpp_cu_head_forward(zpp_cu *cu, zpp_cu_head *h, const void *hf, const void *Wh,
                               const int32_t *targets, int n, int C, int V, int Vr,
                               zpp_decoder_calls *calls, int T) {
    h->dlogits_ready = 0;
    if (n <= 0) return ZPP_OK;
    ZPP_CHECK(zpp_cu_mm(cu, 0, 1, n, V, C, 1.0f, hf, C, Wh, C, 0.0f, h->dlogits, cu->et, V,
                        "logits"));
    /* the row a sampler asked for, before the softmax writes over it */
    const int k = zpp_decoder_kept_in(calls, T, 0, n);
    if (k >= 0) {
        ZPP_WITH_E(cu->dtype, widen_kernel<<<zpp_cu_grid_for((size_t)V), kThreads, 0,
                                             cu->stream>>>(
                                  h->kept, (const E *)h->dlogits + (size_t)k * V, V));
        ZPP_CU_CHECK(cu->who, cudaGetLastError(), "keep a row of logits");
        calls->kept = 1;
    }
    ZPP_CHECK(zpp_cu_cross_entropy(cu, h->dlogits, h->lse, h->losses, targets, n, V, Vr));
    h->dlogits_ready = targets != NULL;
    return ZPP_OK;
}

zpp_status zpp_cu_head_backward(zpp_cu *cu, zpp_cu_head *h, const void *hf, const void *Wh,
                                void *dWh, float *dhf, int n, int C, int V, float f) {
    if (!h->dlogits_ready)
        return zpp_error(ZPP_ERR_STATE,
                         "%s backward: the head's gradient comes from the last forward, which "
                         "has not run with this batch's targets; run forward again", cu->who);
    h->dlogits_ready = 0;
    ZPP_CHECK(zpp_cu_mm(cu, 1, 0, V, C, n, f, h->dlogits, V, hf, C, cu->grad_first ? 0.0f : 1.0f,
                        dWh, cu->gt, C, "head weight gradient"));
    return zpp_cu_mm(cu, 0, 0, n, C, V, f, h->dlogits, V, Wh, C, 0.0f, dhf, CUDA_R_32F, C,
                     "head input gradient");
}

zpp_status zpp_cu_head_logits_host(zpp_cu *cu, const zpp_cu_head *h, int V, float *out) {
    ZPP_CU_CHECK(cu->who, cudaMemcpyAsync(out, h->kept, (size_t)V * sizeof(float),
                                          cudaMemcpyDeviceToHost, cu->stream),
                 "logits: copy to the host");
    ZPP_CU_CHECK(cu->who, cudaStreamSynchronize(cu->stream), "logits: wait for the forward");
    return ZPP_OK;
}

zpp_status zpp_cu_check_device_ptr(const char *who, const void *p, const char *op,
                                   const char *name) {
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zpp_error(ZPP_ERR_INVALID, "%s %s: %s %p is not a CUDA pointer (%s)", who, op,
                         name, p, cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s %s: %s %p is host memory; the CUDA model takes device memory "
                         "(its mem is ZPP_MEM_DEVICE)", who, op, name, p);
    return ZPP_OK;
}
