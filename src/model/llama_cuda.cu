/* model/llama_cuda.cu — the CUDA Llama: the CPU reference's model
 * (llama_cpu.c, whose header writes out the math) with parameters,
 * gradients and activations in device memory. It composes what every CUDA
 * decoder shares (cuda_ops.h: products through cuBLASLt, the token
 * embedding, the classifier), grouped-query attention, fused
 * (attention_cuda.h) or by GEMMs (attention_gemm_cuda.h), and the Llama's
 * own kernels (llama_kernels_cuda.h: RMSNorm, RoPE, SwiGLU).
 *
 * PRECISION as the CUDA GPT-2 (gpt2_cuda.cu): products read E operands and
 * accumulate in fp32; what only feeds products is stored in E (the
 * RMSNorm outputs, qkv, the attention output, [gate | up] and the SwiGLU
 * output, the logits (cuda_ops.h, zpp_cu_head_forward), and in the backward
 * the gradients flowing into products); the residual stream and its
 * gradient, norm statistics, the loss and every parameter gradient are
 * fp32. With E = fp32 the products are plain fp32 FMA (CUBLAS_COMPUTE_32F,
 * no TF32): the CPU model's arithmetic up to the order of summation.
 *
 * WHICH ATTENTION. attention_path.h picks once, at create, from the dtype,
 * the head dim, the GPU and ZPP_ATTENTION, as for GPT-2: the fused kernel
 * where it runs (bf16, head dim 64 or 128, compute capability 8.0+: Llama
 * 3.2 1B and 3B, Llama 3 8B, TinyLlama, SmolLM), else the GEMM path, which
 * takes fp32, fp16, bf16, any head dim and any GPU, and keeps the T x T
 * probabilities of every (sequence, query head, layer) in E. bf16 itself
 * needs compute capability 8.0 (device_caps.h), as for GPT-2.
 *
 * RECOMPUTE. A block's two RMSNorm outputs and its SwiGLU output are not
 * kept: the backward evaluates them again from what is kept (the residual
 * stream, [gate | up]) with the same kernels, so the same bits, into one
 * layer's scratch.
 *
 * SCRATCH IN THE LOGITS. As gpt2_cuda.cu's: that one-layer scratch (h,
 * act) and the backward's (dres, dres_e, datty, dqkv, dgu, dact, the
 * RMSNorm backward's sums) lie in the head's d logits wherever they fit.
 * The d logits are written by the head's forward and read last by its
 * backward, before any of these is written again: 180 MiB less at Llama
 * 3.2 1B's shape, T 2048, micro-batch 1 (V e is 256 KB a token, the
 * scratch 90 KB).
 *
 * CHECKPOINTING. With cfg.recompute a block keeps only its input (res);
 * the rest of its activations are one slab all blocks share, and its
 * backward first runs block_activations again (unless it ran its forward
 * last), as gpt2_cuda.cu does.
 *
 * MEMORY, STREAMS, DETERMINISM: as gpt2_cuda.cu — one arena at create,
 * every launch on the device's compute stream, no atomics anywhere. */
#include <cuda_runtime.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"
#include "device/device.h"
#include "device/device_caps.h"
#include "model/attention_cudnn.h"
#include "model/attention_gemm_cuda.h"
#include "model/attention_path.h"
#include "model/cuda_elem.cuh"
#include "model/cuda_ops.h"
#include "model/decoder.h"
#include "model/llama.h"
#include "model/llama_kernels_cuda.h"
#include "model/model.h"

namespace {

constexpr const char *kWho = "llama cuda";

#define CU_CHECK(call, what) ZPP_CU_CHECK(kWho, call, what)

/* Activations for max_batch sequences, N = max_batch * T rows; per-block
 * buffers are S slabs (L, or 1 with checkpointing), block l's at
 * (l-1 or 0) * N * width. E marks buffers in the working dtype. */
struct llama_acts {
    float *res;            /*    (L+1) x N x C: res[0] embedding, res[l] block l's output */
    float *r1, *r2;        /*    S x N: the RMSNorms' 1/rms */
    void *qkv;             /* E  S x N x Wqkv: q, k rotated */
    float *lse;            /*    S x max_batch x H x T: the fused attention's log-sum-exps
                                 (NULL on the GEMM path) */
    void *prob;            /* E  S x max_batch x H x T x T: the GEMM path's probabilities
                                 (NULL with the fused attention) */
    void *atty;            /* E  S x N x C: attention output before Wo */
    float *mid;            /*    S x N x C: residual after attention */
    void *gu;              /* E  S x N x 2F: [gate | up] */
    void *hf;              /* E  N x C: final RMSNorm output */
    float *rf;             /*    N */
    /* one layer's worth, rewritten by the backward (RECOMPUTE) */
    void *h;               /* E  N x C: a block's RMSNorm output */
    void *act;             /* E  N x F: silu(gate) * up */
    /* backward scratch */
    float *dres, *dc;      /*    N x C */
    void *dres_e;          /* E  N x C: dres rounded for the products */
    void *datty;           /* E  N x C */
    void *dqkv;            /* E  N x Wqkv */
    void *dgu;             /* E  N x 2F */
    void *dact;            /* E  N x F */
    float *dsum;           /*    max_batch x H x T: the fused backward's scratch */
    float *score;          /*    max_batch x H x T x T: the GEMM path's scores, then d P */
    void *dscore;          /* E  max_batch x H x T x T: the GEMM path's d S */
    float *rms_scratch;    /*    the RMSNorm backward's partial column sums */
    float *rope_cos, *rope_sin; /* T x hd/2 each */
};

struct llama_cuda {
    zpp_model base; /* first: the model is the zpp_model */
    zpp_llama_config cfg;
    zpp_llama_layout lay;
    zpp_llama_stages stages;
    zpp_decoder_calls calls;
    size_t nmax;       /* max_batch * seq_len */
    int wqkv, hd;      /* width of a qkv row, the head dim */
    int fused_attn;    /* attention by attention_cuda.cu, else by GEMMs (attention_path.h) */
    zpp_attn_cudnn_use cudnn; /* or by cuDNN's engines, where ctx is set (same buffers) */
    size_t es;         /* bytes of an E element */
    cudaDataType_t et;
    cudaStream_t stream;
    zpp_device *dev;
    zpp_cu cu;
    zpp_cu_batch batch;
    zpp_cu_head head;
    float *arena;
    llama_acts a;
    float loss;
    int loss_pending;
    int slab_block; /* with recompute, the block whose activations the slab holds (0: none) */
};

/* Element i of an E buffer or of a unit of parameters. */
static inline void *eat(const llama_cuda *g, const void *p, size_t i) {
    return (char *)p + i * g->es;
}

/* Block l's slices of the per-block buffers. */
struct llama_layer {
    const float *x;
    float *out, *r1, *r2, *mid;
    void *qkv, *atty, *gu;
    void *att; /* the fused attention's fp32 lse, or the GEMM path's P in E */
};

static llama_layer layer_of(const llama_cuda *g, int l) {
    const size_t N = g->nmax, C = (size_t)g->cfg.n_embd, F = (size_t)g->cfg.n_ffn;
    const size_t r = (size_t)(l - 1), k = g->cfg.recompute ? 0 : r;
    const size_t att = (size_t)g->base.max_batch * g->cfg.n_head * g->cfg.seq_len;
    const size_t T = (size_t)g->cfg.seq_len;
    llama_layer y;
    y.x = g->a.res + r * N * C;
    y.out = g->a.res + (r + 1) * N * C;
    y.r1 = g->a.r1 + k * N;
    y.r2 = g->a.r2 + k * N;
    y.att = g->fused_attn ? (void *)(g->a.lse + k * att) : eat(g, g->a.prob, k * att * T);
    y.mid = g->a.mid + k * N * C;
    y.qkv = eat(g, g->a.qkv, k * N * g->wqkv);
    y.atty = eat(g, g->a.atty, k * N * C);
    y.gu = eat(g, g->a.gu, k * N * 2 * F);
    return y;
}

/* ---- stages ---- */

static zpp_status rms_forward(llama_cuda *g, void *out, float *rstd, const float *x,
                              const void *w, int n) {
    return zpp_llama_rmsnorm_forward(out, rstd, x, w, n, g->cfg.n_embd, (float)g->cfg.norm_eps,
                                     g->base.param_dtype, g->stream);
}

static zpp_status rms_backward(llama_cuda *g, float *dw, const float *dout, const float *x,
                               const void *w, const float *rstd, int n) {
    return zpp_llama_rmsnorm_backward(g->a.dres, dw, g->a.rms_scratch, dout, x, w, rstd, n,
                                      g->cfg.n_embd, g->base.param_dtype, g->stream);
}

/* The attention's shape this batch: grouped-query, KV key/value heads. */
static zpp_attn_gemm_shape attn_shape(const llama_cuda *g) {
    return zpp_attn_gemm_shape{g->calls.B, g->cfg.seq_len, g->cfg.n_head, g->cfg.n_kv_head,
                               g->hd};
}

/* y = softmax(Q K^T / sqrt(hd) + causal mask) V per (sequence, query head),
 * fused (att: the lse) or by GEMMs (att: P). */
static zpp_status attention_forward(llama_cuda *g, void *y, void *att, const void *qkv) {
    const zpp_attn_gemm_shape s = attn_shape(g);
    return zpp_attn_run_forward(&g->cu, &g->cudnn, g->fused_attn, &s, y, att, g->a.score, qkv);
}

/* d qkv (overwritten) from d y and the forward's y and att. */
static zpp_status attention_backward(llama_cuda *g, void *dqkv, const void *dy, const void *qkv,
                                     const void *y, const void *att) {
    const zpp_attn_gemm_shape s = attn_shape(g);
    return zpp_attn_run_backward(&g->cu, &g->cudnn, g->fused_attn, &s, dqkv, dy, qkv, y, att,
                                 g->a.dsum, g->a.score, g->a.dscore);
}

/* Block l's forward up to what its backward reads (through [gate | up]):
 * by the forward, and again by the backward with checkpointing. */
static zpp_status block_activations(llama_cuda *g, int l, const void *w) {
    const zpp_llama_layout *L = &g->lay;
    const int T = g->cfg.seq_len, C = g->cfg.n_embd, F = g->cfg.n_ffn, H = g->cfg.n_head,
              KV = g->cfg.n_kv_head, B = g->calls.B, n = B * T;
    const zpp_dtype dt = g->base.param_dtype;
    const llama_layer y = layer_of(g, l);
    /* attention branch: mid = x + attn(RoPE(qkv(RMS1(x)))) Wo^T */
    ZPP_CHECK(rms_forward(g, g->a.h, y.r1, y.x, eat(g, w, L->norm1), n));
    ZPP_CHECK(zpp_cu_linear_forward(&g->cu, y.qkv, g->et, NULL, g->a.h, eat(g, w, L->wqkv),
                                    g->cfg.qkv_bias ? eat(g, w, L->bqkv) : NULL, n, C, g->wqkv,
                                    "qkv forward"));
    ZPP_CHECK(zpp_llama_rope_forward(y.qkv, g->a.rope_cos, g->a.rope_sin, B, T, H, KV, g->hd,
                                     dt, g->stream));
    ZPP_CHECK(attention_forward(g, y.atty, y.att, y.qkv));
    ZPP_CHECK(zpp_cu_linear_forward(&g->cu, y.mid, CUDA_R_32F, y.x, y.atty, eat(g, w, L->wo),
                                    g->cfg.o_bias ? eat(g, w, L->bo) : NULL, n, C, C,
                                    "attention output forward"));
    /* MLP branch, up to [gate | up] */
    ZPP_CHECK(rms_forward(g, g->a.h, y.r2, y.mid, eat(g, w, L->norm2), n));
    ZPP_CHECK(zpp_cu_linear_forward(&g->cu, y.gu, g->et, NULL, g->a.h, eat(g, w, L->wgu), NULL,
                                    n, C, 2 * F, "gate/up forward"));
    g->slab_block = l;
    return ZPP_OK;
}

/* out = mid + silu(gate) * up Wdown^T. */
static zpp_status block_forward(llama_cuda *g, int l, const void *w) {
    const int C = g->cfg.n_embd, F = g->cfg.n_ffn, n = g->calls.B * g->cfg.seq_len;
    const llama_layer y = layer_of(g, l);
    ZPP_CHECK(block_activations(g, l, w));
    ZPP_CHECK(zpp_llama_swiglu_forward(g->a.act, y.gu, n, F, g->base.param_dtype, g->stream));
    return zpp_cu_linear_forward(&g->cu, y.out, CUDA_R_32F, y.mid, g->a.act,
                                 eat(g, w, g->lay.wdown), NULL, n, F, C, "down forward");
}

/* The head's weight: its own matrix when untied, else the embedding. */
static size_t head_offset(const llama_cuda *g) {
    return g->cfg.untied_head ? g->lay.head : g->lay.wte;
}

static zpp_status head_forward(llama_cuda *g, const void *w) {
    const int C = g->cfg.n_embd, V = g->cfg.vocab_size, n = g->calls.B * g->cfg.seq_len;
    const float *x = g->a.res + (size_t)g->cfg.n_layer * g->nmax * C;
    ZPP_CHECK(rms_forward(g, g->a.hf, g->a.rf, x, eat(g, w, g->lay.norm_f), n));
    return zpp_cu_head_forward(&g->cu, &g->head, g->a.hf, eat(g, w, head_offset(g)),
                               g->calls.have_targets ? g->batch.d_targets : NULL, n, C, V,
                               g->cfg.real_vocab_size, &g->calls, g->cfg.seq_len);
}

/* d Whead += f dlogits^T hf, d hf = f dlogits Whead (f = loss_scale / n;
 * tied: d Whead is d wte, which the embedding's backward adds to too);
 * then the final RMSNorm's backward starts dres. */
static zpp_status head_backward(llama_cuda *g, const void *w, float *gr, float loss_scale) {
    const int C = g->cfg.n_embd, V = g->cfg.vocab_size, n = g->calls.B * g->cfg.seq_len;
    const size_t wh = head_offset(g);
    ZPP_CHECK(zpp_cu_head_backward(&g->cu, &g->head, g->a.hf, eat(g, w, wh), gr + wh, g->a.dc,
                                   n, C, V, loss_scale / (float)n));
    CU_CHECK(cudaMemsetAsync(g->a.dres, 0, (size_t)n * C * sizeof(float), g->stream),
             "clear the residual gradient");
    const float *x = g->a.res + (size_t)g->cfg.n_layer * g->nmax * C;
    return rms_backward(g, gr + g->lay.norm_f, g->a.dc, x, eat(g, w, g->lay.norm_f), g->a.rf, n);
}

/* Reverse of block_forward; dres = d loss / d out on entry, d loss / d x
 * on exit (each RMSNorm's backward adds its branch's input gradient). */
static zpp_status block_backward(llama_cuda *g, int l, const void *w, float *gr) {
    const zpp_llama_layout *L = &g->lay;
    const int T = g->cfg.seq_len, C = g->cfg.n_embd, F = g->cfg.n_ffn, H = g->cfg.n_head,
              KV = g->cfg.n_kv_head, B = g->calls.B, n = B * T;
    const zpp_dtype dt = g->base.param_dtype;
    const cudaDataType_t et = g->et, f32 = CUDA_R_32F;
    llama_acts *a = &g->a;
    const llama_layer y = layer_of(g, l);
    if (g->cfg.recompute && g->slab_block != l) ZPP_CHECK(block_activations(g, l, w));
    /* MLP branch: out = mid + swiglu(RMS2(mid)) Wdown^T */
    ZPP_CHECK(zpp_cu_round(&g->cu, a->dres_e, a->dres, (size_t)n * C, "round dres"));
    ZPP_CHECK(zpp_llama_swiglu_forward(a->act, y.gu, n, F, dt, g->stream));
    ZPP_CHECK(zpp_cu_linear_backward(&g->cu, a->dact, et, gr + L->wdown, NULL, a->dres_e, NULL,
                                     a->act, eat(g, w, L->wdown), n, F, C, "down backward"));
    ZPP_CHECK(zpp_llama_swiglu_backward(a->dgu, a->dact, y.gu, n, F, dt, g->stream));
    ZPP_CHECK(rms_forward(g, a->h, y.r2, y.mid, eat(g, w, L->norm2), n));
    ZPP_CHECK(zpp_cu_linear_backward(&g->cu, a->dc, f32, gr + L->wgu, NULL, a->dgu, NULL, a->h,
                                     eat(g, w, L->wgu), n, C, 2 * F, "gate/up backward"));
    ZPP_CHECK(rms_backward(g, gr + L->norm2, a->dc, y.mid, eat(g, w, L->norm2), y.r2, n));
    /* attention branch; the gradient of the rotated q, k turned back */
    ZPP_CHECK(zpp_cu_round(&g->cu, a->dres_e, a->dres, (size_t)n * C, "round dres"));
    ZPP_CHECK(zpp_cu_linear_backward(&g->cu, a->datty, et, gr + L->wo,
                                     g->cfg.o_bias ? gr + L->bo : NULL, a->dres_e, a->dres,
                                     y.atty, eat(g, w, L->wo), n, C, C,
                                     "attention output backward"));
    ZPP_CHECK(attention_backward(g, a->dqkv, a->datty, y.qkv, y.atty, y.att));
    ZPP_CHECK(zpp_llama_rope_backward(a->dqkv, a->rope_cos, a->rope_sin, B, T, H, KV, g->hd, dt,
                                      g->stream));
    ZPP_CHECK(rms_forward(g, a->h, y.r1, y.x, eat(g, w, L->norm1), n));
    ZPP_CHECK(zpp_cu_linear_backward(&g->cu, a->dc, f32, gr + L->wqkv,
                                     g->cfg.qkv_bias ? gr + L->bqkv : NULL, a->dqkv, NULL, a->h,
                                     eat(g, w, L->wqkv), n, C, g->wqkv, "qkv backward"));
    return rms_backward(g, gr + L->norm1, a->dc, y.x, eat(g, w, L->norm1), y.r1, n);
}

/* ---- ops ---- */

zpp_status op_init_params(zpp_model *m, int unit, size_t offset, size_t count, float *out,
                          uint64_t seed) {
    return zpp_llama_init_fill(&((llama_cuda *)m)->cfg, unit, offset, count, out, seed);
}

__global__ void init_params_kernel(zpp_llama_layout lay, int unit, size_t offset, size_t count,
                                   float *out, uint64_t seed) {
    for (size_t k = global_tid(); k < count; k += grid_threads())
        out[k] = zpp_llama_init_value(&lay, unit, offset + k, seed);
}

/* op_init_params's values drawn on the GPU (zpp_llama_init_value is the
 * host's own function, the same bits). */
zpp_status op_init_params_device(zpp_model *m, int unit, size_t offset, size_t count,
                                 float *dev_out, uint64_t seed) {
    llama_cuda *g = (llama_cuda *)m;
    ZPP_CHECK(zpp_llama_init_fill(&g->cfg, unit, offset, 0, NULL, seed)); /* the range */
    if (offset + count > g->stages.t.unit_numel[unit])
        return zpp_error(ZPP_ERR_INVALID, "llama init: elements [%zu, %zu + %zu) exceed unit %d",
                         offset, offset, count, unit);
    if (!count) return ZPP_OK;
    ZPP_CHECK(zpp_cu_check_device_ptr(kWho, dev_out, "init_params_device", "dev_out"));
    init_params_kernel<<<zpp_cu_grid_for(count), kThreads, 0, g->stream>>>(g->lay, unit, offset,
                                                                          count, dev_out, seed);
    CU_CHECK(cudaGetLastError(), "init_params_device");
    return ZPP_OK;
}

zpp_status op_set_batch(zpp_model *m, const int32_t *tokens, const int32_t *targets, int B) {
    llama_cuda *g = (llama_cuda *)m;
    ZPP_CHECK(zpp_decoder_check_batch(m, tokens, targets, B, kWho));
    ZPP_CHECK(zpp_cu_batch_set(&g->cu, &g->batch, tokens, targets, (size_t)B * g->cfg.seq_len));
    zpp_decoder_calls_new_batch(&g->calls, B, targets != NULL);
    g->loss = NAN;
    g->loss_pending = 0;
    g->slab_block = 0;
    return ZPP_OK;
}

zpp_status op_forward(zpp_model *m, int stage, const void *params) {
    llama_cuda *g = (llama_cuda *)m;
    const int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_forward(m, &g->calls, stage, params, kWho));
    ZPP_CHECK(zpp_cu_check_device_ptr(kWho, params, "forward", "params"));
    g->calls.bwd_next = -1;
    g->loss_pending = 0;
    if (stage == 0) {
        g->loss = NAN;
        g->calls.kept = 0;
        ZPP_CHECK(zpp_cu_embed_forward(&g->cu, &g->batch, g->a.res, eat(g, params, g->lay.wte),
                                       NULL, (size_t)g->calls.B * g->cfg.seq_len,
                                       g->cfg.seq_len, g->cfg.n_embd));
    } else if (stage == S - 1) {
        ZPP_CHECK(head_forward(g, params));
        g->loss_pending = 1;
        g->calls.bwd_next = S - 1;
    } else {
        ZPP_CHECK(block_forward(g, stage, params));
    }
    g->calls.fwd_next = stage + 1;
    return ZPP_OK;
}

float op_loss(zpp_model *m) {
    llama_cuda *g = (llama_cuda *)m;
    if (!g->loss_pending) return g->loss;
    g->loss_pending = 0;
    if (!g->calls.have_targets) return g->loss = NAN;
    (void)zpp_cu_mean_loss(&g->cu, &g->batch, g->head.losses,
                           (size_t)g->calls.B * g->cfg.seq_len, &g->loss); /* NAN on error */
    return g->loss;
}

zpp_status op_backward(zpp_model *m, int stage, const void *params, void *grads_v,
                       float loss_scale) {
    float *grads = (float *)grads_v; /* fp32: this model has no set_grad_dtype */
    llama_cuda *g = (llama_cuda *)m;
    const int S = m->n_stages;
    ZPP_CHECK(zpp_decoder_check_backward(m, &g->calls, stage, params, grads, kWho));
    if (params) ZPP_CHECK(zpp_cu_check_device_ptr(kWho, params, "backward", "params"));
    ZPP_CHECK(zpp_cu_check_device_ptr(kWho, grads, "backward", "grads"));
    if (stage == S - 1)
        ZPP_CHECK(head_backward(g, params, grads, loss_scale));
    else if (stage == 0) /* needs no parameters */
        ZPP_CHECK(zpp_cu_embed_backward(&g->cu, &g->batch, grads + g->lay.wte, g->a.dres,
                                        g->cfg.n_embd));
    else
        ZPP_CHECK(block_backward(g, stage, params, grads));
    g->calls.bwd_next = stage - 1;
    return ZPP_OK;
}

zpp_status op_keep_logits(zpp_model *m, int row) {
    return zpp_decoder_keep_logits(m, &((llama_cuda *)m)->calls, row, kWho);
}

zpp_status op_logits(zpp_model *m, float *out) {
    llama_cuda *g = (llama_cuda *)m;
    ZPP_CHECK(zpp_decoder_check_logits(m, &g->calls, out, kWho));
    return zpp_cu_head_logits_host(&g->cu, &g->head, g->cfg.vocab_size, out);
}

void op_destroy(zpp_model *m) {
    llama_cuda *g = (llama_cuda *)m;
    if (!g) return;
    if (g->arena) (void)cudaStreamSynchronize(g->stream); /* work in flight uses the buffers */
    zpp_cu_batch_free(&g->batch, &g->cu);
    zpp_cu_free(&g->cu);
    zpp_attn_cudnn_close(&g->cudnn);
    if (g->dev) zpp_device_free(g->dev, g->arena);
    zpp_llama_stages_free(&g->stages);
    free(g);
}

const zpp_model_ops llama_cuda_ops = {
    op_init_params, op_set_batch, op_forward,     op_loss,
    op_backward,    op_destroy,   op_keep_logits, op_logits,
    op_init_params_device,
};

/* ---- create ---- */

/* rows x width elements of E from the arena. */
static void *take_e(const llama_cuda *g, zpp_arena *a, size_t rows, size_t width) {
    return zpp_arena_take_bytes(a, rows, width, g->es);
}

/* The buffers whose values no block's forward or backward pass leaves for
 * another (SCRATCH IN THE LOGITS), from s. */
static void take_scratch(llama_cuda *g, zpp_arena *s) {
    const size_t N = g->nmax, C = (size_t)g->cfg.n_embd, F = (size_t)g->cfg.n_ffn;
    llama_acts *a = &g->a;
    a->h = take_e(g, s, N, C);
    a->act = take_e(g, s, N, F);
    a->dres = zpp_arena_take(s, N, C);
    a->dres_e = take_e(g, s, N, C);
    a->datty = take_e(g, s, N, C);
    a->dqkv = take_e(g, s, N, (size_t)g->wqkv);
    a->dgu = take_e(g, s, N, 2 * F);
    a->dact = take_e(g, s, N, F);
    a->rms_scratch = zpp_arena_take(s, zpp_llama_rmsnorm_backward_scratch((int)N, (int)C), 1);
}

/* Carves the arena (each buffer on a 256-byte boundary): pass 1 (base
 * NULL) counts, pass 2 hands out pointers. */
static void plan(llama_cuda *g, zpp_arena *ar) {
    const size_t N = g->nmax, L = (size_t)g->cfg.n_layer, C = (size_t)g->cfg.n_embd;
    const size_t F = (size_t)g->cfg.n_ffn, T = (size_t)g->cfg.seq_len, V = g->cfg.vocab_size;
    const size_t H = (size_t)g->cfg.n_head, Wq = (size_t)g->wqkv, hd = (size_t)g->hd;
    const size_t Bm = (size_t)g->base.max_batch, S = g->cfg.recompute ? 1 : L;
    llama_acts *a = &g->a;
    a->res = zpp_arena_take(ar, (L + 1) * N, C);
    a->r1 = zpp_arena_take(ar, S, N);
    a->r2 = zpp_arena_take(ar, S, N);
    a->qkv = take_e(g, ar, S * N, Wq);
    if (g->fused_attn) {
        a->lse = zpp_arena_take(ar, S * Bm * H, T);
    } else { /* the GEMM path: P per layer, the scores and d S once */
        a->prob = take_e(g, ar, S * Bm * H * T, T);
        a->score = zpp_arena_take(ar, Bm * H * T, T);
        a->dscore = take_e(g, ar, Bm * H * T, T);
    }
    a->atty = take_e(g, ar, S * N, C);
    a->mid = zpp_arena_take(ar, S * N, C);
    a->gu = take_e(g, ar, S * N, 2 * F);
    a->hf = take_e(g, ar, N, C);
    a->rf = zpp_arena_take(ar, N, 1);
    a->dc = zpp_arena_take(ar, N, C);
    if (g->fused_attn) a->dsum = zpp_arena_take(ar, Bm * H, T);
    a->rope_cos = zpp_arena_take(ar, T, hd / 2);
    a->rope_sin = zpp_arena_take(ar, T, hd / 2);
    zpp_cu_head_take(&g->head, ar, N, V, g->es);
    /* the scratch in the d logits' bytes where it fits (SCRATCH IN THE LOGITS) */
    zpp_arena count = {NULL, 0, ar->align, 0};
    take_scratch(g, &count);
    const bool fits = !count.overflow && count.used * sizeof(float) <= N * V * g->es;
    zpp_arena in_logits = {(float *)g->head.dlogits, 0, ar->align, 0};
    take_scratch(g, fits ? &in_logits : ar);
}

/* The RoPE tables, made on the host once (llama.h: the CPU model's own). */
static zpp_status upload_rope(llama_cuda *g) {
    const size_t half = (size_t)g->hd / 2, T = (size_t)g->cfg.seq_len;
    float *host = (float *)malloc(2 * T * half * sizeof(float));
    if (!host) return zpp_error(ZPP_ERR_NOMEM, "%s create: out of host memory", kWho);
    zpp_status st = zpp_llama_rope_tables(&g->cfg, (int)T, host, host + T * half);
    cudaError_t e = cudaSuccess;
    if (st == ZPP_OK) {
        e = cudaMemcpy(g->a.rope_cos, host, T * half * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess)
            e = cudaMemcpy(g->a.rope_sin, host + T * half, T * half * sizeof(float),
                           cudaMemcpyHostToDevice);
    }
    free(host);
    ZPP_CHECK(st);
    CU_CHECK(e, "create: copy the RoPE tables");
    return ZPP_OK;
}

static zpp_status create_device_state(llama_cuda *g) {
    zpp_arena p = {NULL, 0, 64, 0};
    plan(g, &p);
    if (p.overflow)
        return zpp_error(ZPP_ERR_NOMEM, "%s create: activation memory for max_batch %d "
                         "overflows size_t; use a smaller model or batch", kWho,
                         g->base.max_batch);
    void *arena = NULL;
    zpp_status st = zpp_device_alloc(g->dev, p.used * sizeof(float), &arena);
    if (st != ZPP_OK)
        return zpp_error_context(st, "%s create: the activations of max_batch %d x seq_len %d "
                                 "(use a smaller max_batch)", kWho, g->base.max_batch,
                                 g->cfg.seq_len);
    g->arena = (float *)arena;
    p = zpp_arena{g->arena, 0, 64, 0};
    plan(g, &p);
    ZPP_CHECK(upload_rope(g));
    const int widest = 2 * g->cfg.n_ffn > g->wqkv ? 2 * g->cfg.n_ffn : g->wqkv;
    ZPP_CHECK(zpp_cu_init(&g->cu, g->dev, g->base.param_dtype, widest, kWho));
    return zpp_cu_batch_init(&g->batch, &g->cu, g->nmax, g->cfg.vocab_size);
}

/* What this GPU and shape can run (WHICH ATTENTION in the header): the
 * dtype (bf16 from compute capability 8.0), and the attention path
 * (ZPP_ATTENTION read here, the one place; attention_path.h), into
 * *path_p. */
static zpp_status check_runnable(const zpp_llama_config *cfg, zpp_dtype dt, zpp_device *dev,
                                 zpp_attn_path *path_p) {
    int major = 0, minor = 0;
    ZPP_CHECK(zpp_device_compute_capability(dev, &major, &minor));
    char why[320];
    zpp_status st = zpp_device_dtype_check(major, minor, dt, why, sizeof why);
    if (st != ZPP_OK) return zpp_error(st, "%s create: %s", kWho, why);
    zpp_attn_path path = ZPP_ATTN_GEMM;
    st = zpp_attn_path_pick(zpp_env_get(ZPP_ENV_ATTENTION), dt, cfg->n_embd / cfg->n_head,
                            major, minor, &path, why, sizeof why);
    if (st != ZPP_OK) return zpp_error(st, "%s create: %s", kWho, why);
    *path_p = path;
    return ZPP_OK;
}

} /* namespace */

extern "C" zpp_status zpp_llama_cuda_create(const zpp_llama_config *cfg, zpp_dtype param_dtype,
                                            int max_batch, zpp_device *dev,
                                            zpp_model **model_p) {
    if (!cfg || !model_p) return zpp_error(ZPP_ERR_INVALID, "%s create: cfg or model_p is NULL",
                                           kWho);
    ZPP_CHECK(zpp_decoder_check_create(param_dtype, max_batch, cfg->seq_len, kWho));
    if ((int64_t)max_batch * cfg->seq_len > (INT32_MAX - 1) / 5)
        return zpp_error(ZPP_ERR_INVALID, "%s create: max_batch %d x seq_len %d rows is too "
                         "many; use at most %d rows", kWho, max_batch, cfg->seq_len,
                         (INT32_MAX - 1) / 5);
    if (!dev || dev->mem != ZPP_MEM_DEVICE)
        return zpp_error(ZPP_ERR_INVALID, "%s create: the CUDA model needs a GPU device "
                         "(zpp_device_create_gpu)", kWho);
    zpp_attn_path path = ZPP_ATTN_GEMM;
    ZPP_CHECK(check_runnable(cfg, param_dtype, dev, &path));
    llama_cuda *g = (llama_cuda *)calloc(1, sizeof *g);
    if (!g) return zpp_error(ZPP_ERR_NOMEM, "%s create: out of host memory", kWho);
    g->fused_attn = path == ZPP_ATTN_FUSED || path == ZPP_ATTN_CUDNN; /* ours or cuDNN's */
    g->cfg = *cfg;
    zpp_llama_layout_make(cfg, &g->lay);
    g->dev = dev;
    g->stream = (cudaStream_t)dev->stream; /* the device's compute stream */
    g->hd = cfg->n_embd / cfg->n_head;
    g->wqkv = (cfg->n_head + 2 * cfg->n_kv_head) * g->hd;
    g->nmax = (size_t)max_batch * cfg->seq_len;
    g->es = zpp_dtype_size(param_dtype);
    g->et = param_dtype == ZPP_BF16 ? CUDA_R_16BF
            : param_dtype == ZPP_FP16 ? CUDA_R_16F : CUDA_R_32F;
    zpp_status st = zpp_llama_stages_make(cfg, &g->stages);
    if (st != ZPP_OK) {
        free(g);
        return st;
    }
    zpp_llama_base_fill(&g->base, cfg, param_dtype, max_batch, &g->stages);
    g->base.ops = &llama_cuda_ops;
    g->base.mem = ZPP_MEM_DEVICE;
    g->base.impl = g;
    g->loss = NAN;
    g->calls.fwd_next = 0;
    g->calls.bwd_next = -1;
    g->calls.keep_row = -1;
    st = create_device_state(g);
    if (st == ZPP_OK && path == ZPP_ATTN_CUDNN)
        st = zpp_attn_cudnn_open(&g->cudnn, zpp_env_get(ZPP_ENV_ATTENTION), dev, max_batch,
                                 cfg->seq_len, cfg->n_head, cfg->n_kv_head, g->hd, g->stream);
    if (st != ZPP_OK) {
        op_destroy(&g->base);
        return st;
    }
    *model_p = &g->base;
    return ZPP_OK;
}
