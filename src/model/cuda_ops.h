/* model/cuda_ops.h — what every CUDA decoder (gpt2_cuda.cu, the Llama's)
 * computes the same way: matrix products through cuBLASLt, with a bias in
 * the epilogue and an algorithm cache; column sums (bias and norm weight
 * gradients) in a fixed order; the classifier's softmax cross-entropy and
 * d logits; rounding fp32 rows into the working dtype. Included by CUDA
 * sources only (it names CUDA types); cuda_ops.cu holds the code and the
 * header comment of gpt2_cuda.cu the math (GEMMs, HEAD, DETERMINISM).
 * C linkage, so a C test can call it (tests/test_cuda_ops.c).
 *
 * Every call enqueues on the context's stream, returns without waiting and
 * allocates nothing; the context is made once per model (zpp_cu_init) and
 * owns the cuBLASLt handle and workspace, the cache and the scratch of the
 * column sums. Element types: E is the working dtype (cu->et: fp32, bf16
 * or fp16), "fp32" means fp32 whatever E is, and G is the dtype of the
 * parameter gradients (cu->gt: fp32 unless zpp_cu_set_grad_dtype chose
 * E). */
#ifndef ZPP_MODEL_CUDA_OPS_H
#define ZPP_MODEL_CUDA_OPS_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "device/device.h"
#include "model/decoder.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_cu_gemm_entry zpp_cu_gemm_entry;

typedef struct zpp_cu {
    zpp_device *dev;      /* allocates the workspace and scratch (counted in its peak) */
    cudaStream_t stream;  /* the device's compute stream */
    zpp_dtype dtype;      /* E */
    cudaDataType_t et;    /* E for cuBLASLt */
    size_t es;            /* bytes of one E element */
    zpp_dtype gdtype;     /* G: the parameter gradients' dtype (fp32 or E) */
    cudaDataType_t gt;    /* G for cuBLASLt */
    size_t gs;            /* bytes of one G element */
    /* 1: the calls write each gradient element for the first time in this
     * backward pass, over stale values: they store (GEMMs at beta = 0)
     * instead of adding. The model sets it around its writes (0 unless it
     * was asked to overwrite; model.h, overwrite_grads). */
    int grad_first;
    const char *who;      /* the model's name, first in every message ("gpt2 cuda") */
    cublasLtHandle_t lt;
    void *workspace;
    zpp_cu_gemm_entry *cache; /* kGemmCache entries */
    int cache_next;           /* round-robin victim when full */
    float *scratch;       /* column sums' partials and counters, a widened bias */
    float *colsum_part;
    unsigned *colsum_count;
    float *bias32;
    int max_width;        /* widest row a column sum or a widened bias takes */
    int sms;              /* the device's multiprocessors (grid sizes) */
} zpp_cu;

/* Makes the context: cuBLASLt, its workspace, the algorithm cache and the
 * scratch for rows up to max_width wide. On failure zpp_cu_free frees what
 * exists. */
zpp_status zpp_cu_init(zpp_cu *cu, zpp_device *dev, zpp_dtype dtype, int max_width,
                       const char *who);
void zpp_cu_free(zpp_cu *cu);

/* The dtype G every later call writes parameter gradients in: fp32 (the
 * default) or E. A 2-byte G halves the gradient's memory. A write into it
 * is an fp32 sum rounded once; an add into it (beta = 1) rounds twice:
 * cuBLASLt's sm90 products round to G before adding what G held (every
 * algorithm it offered, measured on an H100: bench/RESULTS.md), our own
 * kernels add in fp32. ZPP_ERR_UNSUPPORTED for anything else. */
zpp_status zpp_cu_set_grad_dtype(zpp_cu *cu, zpp_dtype dt);

/* GPT-2's GELU in a product's epilogue (zpp_cu_epilogue.act): cuBLASLt's
 * GELU epilogues compute the tanh form gpt2_cuda.cu's kernels compute,
 * gelu(u) = u (1 + tanh(k (u + a u^3))) / 2 (tests/test_cuda_ops.c checks
 * the outputs against it in double). */
typedef enum zpp_cu_act {
    ZPP_CU_ACT_NONE = 0,
    /* C = gelu(P) with P = alpha op(A) op(B) [+ bias]; P itself, rounded
     * to C's type, into aux: the pre-activation a backward reads */
    ZPP_CU_ACT_GELU = 1,
    /* C = P gelu'(aux): the product is the gradient of gelu's output, aux
     * the pre-activation the forward stored; C is d pre-activation */
    ZPP_CU_ACT_DGELU = 2,
} zpp_cu_act;

/* What a product adds besides alpha op(A) op(B) + beta C (zpp_cu_gemm). */
typedef struct zpp_cu_epilogue {
    /* N values in C's type, one per column of C, added in the product's
     * epilogue (cuBLASLt's EPILOGUE_BIAS); NULL: none. */
    const void *bias;
    /* The C that beta scales when it is not the output (cuBLASLt reads C
     * and writes D); NULL: the output itself. */
    const void *c_in;
    /* An activation (above) and its M x N matrix of C's type, leading
     * dimension ldc; act ZPP_CU_ACT_NONE: none, aux unused. Not with
     * beta != 0 or a batch. */
    zpp_cu_act act;
    void *aux;
} zpp_cu_epilogue;

/* Row-major C[M x N] = alpha op(A) op(B) + beta C [+ bias], op(A) M x K,
 * op(B) K x N (ta / tb: 1 = transposed, as CblasTrans), `batch` matrices
 * apart by sA / sB / sC elements; A and B in at, C in ct (E or fp32),
 * accumulation in fp32. ZPP_ERR_UNSUPPORTED, and nothing done, when
 * cuBLASLt has no algorithm for the epilogue asked for (the caller then
 * does it in steps). */
zpp_status zpp_cu_gemm(zpp_cu *cu, cudaDataType_t at, cudaDataType_t ct, int ta, int tb, int M,
                       int N, int K, float alpha, const void *A, int64_t lda, int64_t sA,
                       const void *B, int64_t ldb, int64_t sB, float beta, void *C, int64_t ldc,
                       int64_t sC, int batch, const zpp_cu_epilogue *epi, const char *what);

/* The plain product of E operands into C of type ct. */
zpp_status zpp_cu_mm(zpp_cu *cu, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                     int lda, const void *B, int ldb, float beta, void *C, cudaDataType_t ct,
                     int ldc, const char *what);

/* out (n x OC, fp32 or E as ot) = [resid +] inp W^T [+ bias]: inp n x IC,
 * W OC x IC and bias OC in E; resid fp32 (ot fp32 only), bias NULL for
 * none. Written once: bias and residual join the product's epilogue, or,
 * where cuBLASLt has no algorithm for it, are written first and the
 * product added to them. */
zpp_status zpp_cu_linear_forward(zpp_cu *cu, void *out, cudaDataType_t ot, const float *resid,
                                 const void *inp, const void *W, const void *bias, int n, int IC,
                                 int OC, const char *what);

/* d inp (n x IC, fp32 or E as it) = d out W, overwritten; d W += d out^T
 * inp; d b += column sums of d out (from dout_f32, the unrounded fp32
 * gradient, when the caller has one; db NULL: no bias). dout in E; dW, db
 * in G. */
zpp_status zpp_cu_linear_backward(zpp_cu *cu, void *dinp, cudaDataType_t it, void *dW,
                                  void *db, const void *dout, const float *dout_f32,
                                  const void *inp, const void *W, int n, int IC, int OC,
                                  const char *what);

/* The first half of an MLP with GPT-2's GELU in the product's epilogue:
 * pre (n x OC, E) = inp W^T + bias and out (E) = gelu(pre), computed from
 * the unrounded pre (so out may differ from gelu of the stored pre by one
 * rounding). E must be bf16 or fp16 (fp32 models keep the CPU's
 * arithmetic: the product, then gelu_forward_kernel). ZPP_ERR_UNSUPPORTED,
 * nothing written, when cuBLASLt has no such algorithm. */
zpp_status zpp_cu_linear_gelu_forward(zpp_cu *cu, void *out, void *pre, const void *inp,
                                      const void *W, const void *bias, int n, int IC, int OC,
                                      const char *what);

/* zpp_cu_linear_backward of the layer after that GELU, with the GELU's
 * backward in the first product's epilogue: dpre (n x IC, E) =
 * (dout W) gelu'(pre) (within two roundings: cuBLASLt rounds the product
 * first, as the separate kernel's input was); dW, db as there (inp: gelu's
 * output).
 * ZPP_ERR_UNSUPPORTED, nothing written, when cuBLASLt has no such
 * algorithm. */
zpp_status zpp_cu_linear_dgelu_backward(zpp_cu *cu, void *dpre, void *dW, void *db,
                                        const void *dout, const float *dout_f32, const void *inp,
                                        const void *W, const void *pre, int n, int IC, int OC,
                                        const char *what);

/* db[W] += column sums of the n rows of dy (n x W, of type dt: fp32 or E);
 * with mean (a norm's backward, x its fp32 input): also
 * dw[W] += column sums of dy * (x - mean) rstd (mean NULL: dw untouched).
 * db, dw in G. W <= max_width. Same shape, same bits. */
zpp_status zpp_cu_colsum(zpp_cu *cu, void *db, void *dw, const void *dy, cudaDataType_t dt,
                         const float *x, const float *mean, const float *rstd, int n, int W,
                         const char *what);

/* Column sums made by a kernel of another op in its own pass (the
 * LayerNorm backward's weight and bias gradients, and the column sums of
 * the gradient it writes, from the values it holds anyway): it splits its
 * n rows into G row groups, and group k writes its sums of columns
 * [0, C) to zpp_cu_rowgroup_part: sum j (0: dw, 1: db, 2: ds) at
 * [(j G + k) C, (j G + k + 1) C). Then zpp_cu_rowgroup_finish adds the G
 * partials of each column, groups in order, into dw[C] and db[C] (in G),
 * and with ds (not NULL) into ds[C] (ds_add: a bias gradient, in G) or
 * over it (fp32 scratch): the same G, the same bits.
 * zpp_cu_rowgroups picks G for a kernel of `threads` threads a group, to
 * fill the GPU within the scratch (at least 1, at most n). */
int zpp_cu_rowgroups(const zpp_cu *cu, int n, int C, int threads);
float *zpp_cu_rowgroup_part(zpp_cu *cu);
zpp_status zpp_cu_rowgroup_finish(zpp_cu *cu, void *dw, void *db, void *ds, int ds_add, int G,
                                  int C, const char *what);

/* The classifier's softmax cross-entropy over `rows` rows of logits in E
 * (rows x V, the first Vr columns real, the rest padding), in fp32:
 * lse[r] = log sum exp, losses[r] = lse - logit of targets[r], and the
 * logits are overwritten by softmax - onehot, the d logits up to the factor
 * the backward's products apply; targets NULL: losses[r] = lse - max, no
 * target, and the logits stay. */
zpp_status zpp_cu_cross_entropy(zpp_cu *cu, void *logits, float *lse, float *losses,
                                const int32_t *targets, int rows, int V, int Vr);

/* dst (E) = src (fp32), n elements, rounded to nearest even (a copy when E
 * is fp32). */
zpp_status zpp_cu_round(zpp_cu *cu, void *dst, const float *src, size_t n, const char *what);

/* ---- the token side of every decoder ---- */

/* A micro-batch on the device: tokens, targets, and the grouping of
 * positions by token that makes the token embedding's backward a
 * deterministic gather (positions of each distinct token ascending, found
 * by a stable counting sort on the host at zpp_cu_batch_set). */
typedef struct zpp_cu_batch {
    size_t nmax;                 /* rows it holds: max_batch * seq_len */
    int vocab;
    int32_t *d_ints;             /* device: 5 nmax + 1 */
    int32_t *h_ints;             /* pinned staging, 5 nmax + 1 */
    int32_t *h_count;            /* vocab counters of the counting sort */
    float *h_losses;             /* pinned, nmax */
    cudaEvent_t staged;          /* the last copy out of h_ints has been done */
    const int32_t *d_tokens, *d_targets, *d_seg_tok, *d_seg_start, *d_pos;
    int n_seg;                   /* distinct tokens of the batch */
} zpp_cu_batch;

zpp_status zpp_cu_batch_init(zpp_cu_batch *b, zpp_cu *cu, size_t nmax, int vocab);
void zpp_cu_batch_free(zpp_cu_batch *b, zpp_cu *cu);

/* Copies n tokens and targets (NULL: none, zeros on the device) into the
 * staging and on to the device, after the previous batch's copy left it;
 * the caller may reuse its buffers at once. */
zpp_status zpp_cu_batch_set(zpp_cu *cu, zpp_cu_batch *b, const int32_t *tokens,
                            const int32_t *targets, size_t n);

/* out (fp32, n x C) = wte[token] (+ wpe[row % T] when wpe is not NULL);
 * wte, wpe in E. */
zpp_status zpp_cu_embed_forward(zpp_cu *cu, const zpp_cu_batch *b, float *out, const void *wte,
                                const void *wpe, size_t n, int T, int C);

/* dwte[token] += dres[row] over the batch's rows, each token's rows in
 * ascending order (a warp per distinct token and 256 channels, or with
 * C % 8 != 0 a CTA per token: no atomics); dwte in G.
 * Rows of tokens the batch lacks are not written: under grad_first (an
 * untied embedding's first write) they would keep stale values, so a model
 * clears grad_first here unless another write (a tied head) covered dwte. */
zpp_status zpp_cu_embed_backward(zpp_cu *cu, const zpp_cu_batch *b, void *dwte,
                                 const float *dres, int C);

/* The mean of n per-row losses on the device, in double in row order (the
 * CPU's sum): one copy to the host and a wait. */
zpp_status zpp_cu_mean_loss(zpp_cu *cu, zpp_cu_batch *b, const float *losses, size_t n,
                            float *mean);

/* ---- the classifier of every decoder (gpt2_cuda.cu, HEAD) ---- */

typedef struct zpp_cu_head {
    float *lse, *losses; /* nmax each */
    void *dlogits;     /* E, nmax x V: the logits, then softmax - onehot for the backward */
    float *kept;       /* V: the logits of the row a sampler asked for, widened */
    int dlogits_ready; /* the last forward with targets wrote dlogits */
} zpp_cu_head;

/* Carves the head's buffers from the decoder's arena (decoder.h; pass 1
 * counts, pass 2 hands out): logits and d logits for nmax rows in E (es
 * bytes an element, the same bytes), lse and loss a row, one kept row of V
 * floats. */
void zpp_cu_head_take(zpp_cu_head *h, zpp_arena *a, size_t nmax, size_t V, size_t es);

/* logits = hf Wh^T (hf E n x C, Wh E V x C; one product, rounded once to
 * E), each row's lse and loss and, with targets (device, n), their d
 * logits over the logits; the row a sampler asked for (calls, sequences
 * of T; decoder.h) is widened into kept first. */
zpp_status zpp_cu_head_forward(zpp_cu *cu, zpp_cu_head *h, const void *hf, const void *Wh,
                               const int32_t *targets, int n, int C, int V, int Vr,
                               zpp_decoder_calls *calls, int T);

/* From the forward's d logits, f = loss_scale / n:
 * dWh += f dlogits^T hf (G), dhf = f dlogits Wh (fp32, overwritten).
 * ZPP_ERR_STATE when the last forward wrote none. */
zpp_status zpp_cu_head_backward(zpp_cu *cu, zpp_cu_head *h, const void *hf, const void *Wh,
                                void *dWh, float *dhf, int n, int C, int V, float f);

/* The V logits the last forward kept (h->kept) into host memory out: one
 * copy on the stream, behind that forward, and a wait for it. */
zpp_status zpp_cu_head_logits_host(zpp_cu *cu, const zpp_cu_head *h, int V, float *out);

/* ZPP_OK when p is device (or managed) memory; a host pointer would fault
 * inside a kernel and poison the context, so models refuse it up front. */
zpp_status zpp_cu_check_device_ptr(const char *who, const void *p, const char *op,
                                   const char *name);

#ifdef __cplusplus
}
#endif

#endif
