/* plan/cost.c — the step cost model of cost.h; DESIGN.md §11 writes it out.
 *
 * A collective costs  latency x steps + bytes / bandwidth, on two links:
 * the node's cross-node link (inter_bps, shared by the node's ranks: the
 * §5 cross-node bytes are per node) and each rank's intra-node link
 * (intra_bps; the §5 intra-node bytes are per node, so the node moves them
 * at node_size x intra_bps). A ring pipelines its chunks through both links
 * at once, so one call takes the slower of the two:
 *     t = lat + max(cross / inter_bps, intra / (S * intra_bps)).
 * Two collectives in flight together (a gather and a reduction in the
 * backward, on their two streams) share the links: their bytes add on each
 * link, and the pair takes lat + max(sum cross / inter, sum intra / intra). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"
#include "model/attention_path.h"
#include "model/family.h"
#include "plan/cost.h"

/* A collective's time split by link: the two byte terms and the latency. */
typedef struct link_t {
    double inter_s, intra_s, lat_s;
} link_t;

static double link_time(link_t a) { return a.lat_s + fmax(a.inter_s, a.intra_s); }

/* a and b in flight together: bytes share each link, latencies overlap;
 * with a link per communicator (link_per_comm) each runs at the full rate
 * and the pair takes as long as the longer. */
static double link_concurrent(const zpp_cost_in *in, link_t a, link_t b) {
    if (in->link_per_comm) return fmax(link_time(a), link_time(b));
    return fmax(a.lat_s, b.lat_s) + fmax(a.inter_s + b.inter_s, a.intra_s + b.intra_s);
}

/* A stage's compute c with communication l in flight: hidden under it
 * when the two overlap, after it when they take turns (in->serial). */
static double stage_time(const zpp_cost_in *in, double c, double l) {
    if (in->serial) return c + l;
    return fmax(c, l) + in->exposed_frac * fmin(c, l);
}

static const link_t link_none = {0, 0, 0};

/* A measured time as a link time: it occupies "the link" (the cross-node
 * term), so two in flight together add up, or with link_per_comm overlap. */
static link_t link_measured(double s) {
    link_t l = {s, 0, 0};
    return l;
}

int zpp_cost_mode_index(const zpp_coll_mode *mode) {
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        const zpp_coll_mode *c = zpp_coll_mode_get(m);
        if (c->gather == mode->gather && !c->hpz == !mode->hpz && c->reduce == mode->reduce)
            return m;
    }
    return -1;
}

static link_t link_of(const zpp_cost_in *in, double cross, double intra, double steps) {
    link_t l;
    l.inter_s = cross / in->inter_bps;
    l.intra_s = intra / ((double)in->node_size * in->intra_bps);
    l.lat_s = steps * in->latency_s;
    return l;
}

zpp_cost_in zpp_cost_in_default(void) {
    zpp_cost_in in;
    memset(&in, 0, sizeof in);
    in.units = 8;
    in.dtype = ZPP_BF16;
    in.coll = zpp_coll_opts_default();
    in.qgz_inter_exposed = 1;
    in.prefetch_depth = 2;
    in.reduce_depth = 2;
    in.reuse_distance = 1e9; /* DeepSpeed's stage3_max_reuse_distance, as the engine */
    return in;
}

int zpp_cost_kept_units(const zpp_cost_in *in) {
    /* At world 1 a gather moves nothing, and the engine keeps nothing extra. */
    if (!in || in->world <= 1 || !(in->reuse_distance > 0) || in->units <= 0 ||
        !(in->params >= 1))
        return 0;
    /* The use order is forward 0..U-1, backward U-1..0. Between unit i's
     * forward and its backward stage come units i+1..U-1 twice each, so the
     * parameters in between, 2 x sum_{j>i} numel_j, grow as i falls: the
     * units that stay are the last n. Sums of integers < 2^53: exact. */
    const int U = in->units;
    const size_t P = (size_t)in->params;
    double between = 0;
    int n = 1; /* unit U-1: nothing in between */
    for (int i = U - 2; i >= 0; i--) {
        between += 2.0 * (double)zpp_plan_unit_numel(P, U, i + 1);
        if (between > in->reuse_distance) break;
        n++;
    }
    return n;
}

zpp_status zpp_cost_volume(const zpp_cost_in *in, const zpp_coll_mode *mode, zpp_volume *v_p) {
    if (!in || !mode || !v_p) return zpp_error(ZPP_ERR_INVALID, "cost: a NULL argument");
    if (!(in->reuse_distance >= 0))
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: reuse distance %g; give a number of parameters >= 0 (0: every "
                         "unit gathered again in the backward)",
                         in->reuse_distance);
    const size_t P = (size_t)in->params;
    zpp_volume v;
    ZPP_CHECK(zpp_plan_step(P, in->units, in->world, in->node_size, mode, in->dtype, &in->coll,
                            &v));
    const int U = in->units, N = in->world / in->node_size, n = zpp_cost_kept_units(in);
    const zpp_phase b = ZPP_PHASE_BWD_GATHER;
    for (int i = U - n; i < U; i++) { /* the kept units' backward gathers, taken out */
        zpp_partition p = zpp_partition_make_shape(zpp_plan_unit_numel(P, U, i), in->world, N);
        zpp_volume k;
        memset(&k, 0, sizeof k);
        if (mode->hpz)
            zpp_plan_gather_secondary(&k, &p, N, in->node_size, in->dtype, b);
        else
            zpp_plan_gather(&k, &p, N, in->node_size, mode->gather, in->dtype, &in->coll, b);
        v.cross_node_bytes[b] -= k.cross_node_bytes[b];
        v.intra_node_bytes[b] -= k.intra_node_bytes[b];
        v.payload_bytes[b] -= k.payload_bytes[b];
        v.calls[b] -= k.calls[b];
    }
    *v_p = v;
    return ZPP_OK;
}

double zpp_cost_gpt_params(int n_layer, int n_embd, int seq_len, int vocab) {
    double L = n_layer, C = n_embd, T = seq_len, V = vocab;
    return V * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
}

/* Whether in has a complete Llama shape (family and every width). */
static int llama_shape(const zpp_cost_in *in) {
    return in->family == ZPP_COST_LLAMA && in->n_layer > 0 && in->n_embd > 0 &&
           in->n_head > 0 && in->n_kv_head > 0 && in->n_ffn > 0 && in->vocab > 0;
}

double zpp_cost_llama_params(const zpp_cost_in *in) {
    if (!in || !llama_shape(in)) return 0;
    const double L = in->n_layer, C = in->n_embd, V = in->vocab, F = in->n_ffn;
    /* k and v have n_kv_head heads of the query heads' width: Ck wide each */
    const double Ck = (double)in->n_kv_head * (double)(in->n_embd / in->n_head);
    const double qkv = C + 2 * Ck; /* rows of the fused [q | k | v] matrix */
    const double embed = V * C + C + (in->untied_head ? V * C : 0);
    const double block =
        2 * C + qkv * C + (in->qkv_bias ? qkv : 0) + C * C + (in->o_bias ? C : 0) + 3 * C * F;
    return embed + L * block;
}

double zpp_cost_shape_params(const zpp_cost_in *in) {
    if (!in || in->n_layer <= 0) return 0;
    if (in->family == ZPP_COST_LLAMA) return zpp_cost_llama_params(in);
    return zpp_cost_gpt_params(in->n_layer, in->n_embd, in->seq_len, in->vocab);
}

double zpp_cost_flops_per_token(double params, int n_layer, int n_embd, int seq_len) {
    /* A matrix product of an m x k by a k x n matrix takes 2 m k n FLOPs
     * (a multiply and an add per term). Per token, each weight w takes part
     * in one product forward: 2 FLOPs per parameter. The backward makes two
     * products of the same size, the input's gradient and the weight's:
     * 4 more. So 6 params per token (biases and LayerNorm gains do far
     * fewer and are counted the same: they are 0.1% of the parameters).
     * Attention adds two products with no parameters, per layer: the scores
     * Q K^T (a token's query against T keys of C channels, 2 T C) and the
     * mix P V (2 T C): 4 T C forward, twice that backward, 12 L C T in all.
     * The full T x T is counted though causal attention needs half of it,
     * as fsdp_gpt.py, nanoGPT and PaLM's MFU do.
     * A Llama is counted the same way (fsdp_llama.py's count): grouped-
     * query attention narrows only k and v, whose products are in the
     * parameter term; the scores and the mix still run over n_head query
     * heads of C / n_head channels, 4 T C a layer forward; SwiGLU's three
     * matrices and the untied head are parameters like any other. The
     * token embedding is a lookup, not a product, yet is counted (as the
     * wte/wpe of GPT-2 and as fsdp_llama.py counts it), so that tokens/s
     * and TFLOP/s compare with the peer's. */
    double attn = n_layer > 0 ? 12.0 * n_layer * (double)n_embd * (double)seq_len : 0;
    return 6.0 * params + attn;
}

double zpp_cost_step_flops(const zpp_cost_in *in) {
    return in->tokens_per_gpu *
           zpp_cost_flops_per_token(in->params, in->n_layer, in->n_embd, in->seq_len);
}

/* Datasheets (dense, SXM): V100 SXM2 125 TFLOPS fp16 tensor (it has no
 * bf16: its fp16 figure stands for both), 15.7 fp32; A100 SXM 312 bf16,
 * 19.5 fp32; H100 SXM 989 bf16, 67 fp32; H200 SXM the H100's compute.
 * NVLink: V100 300 GB/s both ways, A100 600, H100 and H200 900. HBM: V100
 * 32 GB HBM2 900 GB/s, A100 80 GB HBM2e 2039, H100 80 GB HBM3 3350, H200
 * 141 GB HBM3e 4800. */
static const zpp_cost_gpu gpu_presets[] = {
    {"v100", "V100", 125, 15.7, 1200, 32, 900},
    {"a100", "A100", 312, 19.5, 2400, 80, 2039},
    {"h100", "H100", 989, 67, 3600, 80, 3350},
    {"h200", "H200", 989, 67, 3600, 141, 4800},
};
#define GPU_PRESETS ((int)(sizeof gpu_presets / sizeof gpu_presets[0]))

const zpp_cost_gpu *zpp_cost_gpus(int *n_p) {
    if (n_p) *n_p = GPU_PRESETS;
    return gpu_presets;
}

const zpp_cost_gpu *zpp_cost_gpu_by_name(const char *name) {
    for (int i = 0; name && i < GPU_PRESETS; i++)
        if (!strcmp(name, gpu_presets[i].name)) return &gpu_presets[i];
    return NULL;
}

const zpp_cost_gpu *zpp_cost_gpu_for_device(const char *device_name) {
    for (int i = 0; device_name && i < GPU_PRESETS; i++)
        if (strstr(device_name, gpu_presets[i].match)) return &gpu_presets[i];
    return NULL;
}

double zpp_cost_gpu_peak_tflops(const zpp_cost_gpu *g, zpp_dtype wd) {
    return wd == ZPP_FP32 ? g->fp32_tflops : g->tensor_tflops;
}

/* cuDNN's attention workspace per token (attention_cudnn.h; the default
 * where the fused path runs and the build has cuDNN): its deterministic
 * backward keeps d P, 2 bytes a (query, key) pair and head, B H T T in all,
 * and the rowsum D, fp32 a row and head (4H), as cuDNN 9.19's engines
 * took on Hopper (bench/RESULTS.md). */
static double cudnn_attn_ws(const zpp_cost_in *in, double H) {
    const int fused = in->dtype == ZPP_BF16 && in->n_head > 0 &&
                      zpp_attn_head_size_fused(in->n_embd / in->n_head);
    return fused && in->seq_len > 0 ? 2 * H * in->seq_len + 4 * H : 0;
}

double zpp_cost_gpt_act_bytes(const zpp_cost_in *in, double tokens) {
    if (in->n_layer <= 0) return 0;
    double L = in->n_layer, C = in->n_embd, V = in->vocab;
    double H = in->n_head > 0 ? in->n_head : fmax(1.0, floor(C / 64));
    double e = (double)zpp_dtype_size(in->dtype);
    /* Per token and layer (kept for the backward): residual stream in and
     * mid-block, fp32 (8C); LayerNorm mean and rstd x 2, fp32 (16); qkv 3C,
     * attention output C, MLP hidden 4C in E (8C e); the fused attention's
     * log-sum-exp per head, fp32 (4H). */
    double per_layer = 8 * C + 8 * C * e + 16 + 4 * H;
    /* With activation checkpointing a layer keeps only its residual input
     * (4C); the rest is one layer's slab, shared, that each backward
     * refills (gpt2_cuda.cu, CHECKPOINTING). */
    const double slab = in->recompute ? per_layer - 4 * C : 0;
    if (in->recompute) per_layer = 4 * C;
    /* keep_acts: the two LayerNorm outputs (2C in E), the GELU output (4C
     * in E) or both in every layer, instead of one layer's scratch below */
    const int keep_ln = (in->keep_acts & ZPP_KEEP_LAYERNORM) && !in->recompute;
    const int keep_gelu = (in->keep_acts & ZPP_KEEP_GELU) && !in->recompute;
    per_layer += (keep_ln ? 2 * C * e : 0) + (keep_gelu ? 4 * C * e : 0);
    /* Per token once: the last residual and the backward's dc, fp32 (8C);
     * the final LayerNorm's output (C in E); lse, loss, LayerNorm stats
     * (16); tokens and targets ints (20), the attention's dsum per head
     * (4H); the d logits the forward leaves for the backward, in E (V e);
     * cuDNN's workspace (cudnn_attn_ws). */
    double once = 8 * C + C * e + 16 + 20 + 4 * H + V * e;
    /* The scratch no block's pass leaves for another: the backward's dres,
     * fp32 (4C), dres_e and dfc in E (5C e; dres_e aliases dres when E is
     * fp32; datty and dqkv lie in dfc), and one layer's LayerNorm and GELU
     * outputs where not kept (C e, 4C e). It lies in the d logits' bytes
     * where it fits (gpt2_cuda.cu, SCRATCH IN THE LOGITS). */
    const double scratch = 4 * C + 5 * C * e - (e == 4 ? C * e : 0) + (keep_ln ? 0 : C * e) +
                           (keep_gelu ? 0 : 4 * C * e);
    if (scratch > V * e) once += scratch;
    once += cudnn_attn_ws(in, H);
    /* (the logits lie in the d logits' bytes: gpt2_cuda.cu, HEAD) */
    return tokens * (L * per_layer + slab + once) + 4 * V + /* the kept row */
           32.0 * 1024 * 1024;                              /* + cuBLASLt workspace */
}

double zpp_cost_llama_act_bytes(const zpp_cost_in *in, double tokens) {
    if (!llama_shape(in) || in->seq_len <= 0) return 0;
    const double L = in->n_layer, C = in->n_embd, V = in->vocab, F = in->n_ffn;
    const double H = in->n_head, T = in->seq_len, hd = (double)(in->n_embd / in->n_head);
    const double Wq = C + 2 * (double)in->n_kv_head * hd; /* q, k, v side by side */
    const double e = (double)zpp_dtype_size(in->dtype);
    /* The attention the model picks on a GPU that runs the dtype
     * (attention_path.h, ZPP_ATTENTION unset): fused for bf16 with a head
     * dim of 64 or 128, which keeps a log-sum-exp per head and row (4H a
     * token per layer) and a backward scratch as large (4H once); else the
     * GEMM path, whose T x T matrices per (sequence, head) are T values a
     * token per head: the probabilities in E per layer (H T e), the fp32
     * scores and the d scores in E once (H T (4 + e)). */
    const int fused = in->dtype == ZPP_BF16 && zpp_attn_head_size_fused(in->n_embd / in->n_head);
    const double att_layer = fused ? 4 * H : H * T * e;
    const double att_once = fused ? 4 * H : H * T * (4 + e);
    /* llama_cuda.cu plan(), per token. Kept for the backward, per layer:
     * the two RMSNorms' rstd, fp32 (8); qkv after RoPE (Wq e); the
     * attention's (att_layer); the attention output (C e); the mid-block
     * residual, fp32 (4C); gate and up (2F e). With activation
     * checkpointing one layer's slab, refilled by each backward. The
     * residual stream's inputs to every layer and the final one, fp32, are
     * kept either way (4C (L + 1)). */
    const double slab = 8 + Wq * e + att_layer + C * e + 4 * C + 2 * F * e;
    const double layers = in->recompute ? slab : L * slab;
    /* Once per token: the final norm's output and rstd (C e + 4); the
     * head's d input, fp32 (4C); the attention's scratch (att_once); the d
     * logits the forward leaves for the backward (V e); the head's lse and
     * losses (8); the batch's five integers (cuda_ops.cu, 20); cuDNN's
     * workspace (cudnn_attn_ws). */
    const double once = C * e + 4 + 4 * C + att_once + V * e + 8 + 20 + cudnn_attn_ws(in, H);
    /* The scratch no block's pass leaves for another: the MLP's normed
     * input and SwiGLU output (C e + F e); the backward's dres, fp32 (4C),
     * dres_e and datty (2C e), dqkv (Wq e), dgu (2F e), dact (F e); and per
     * chunk the RMSNorm backward's partial column sums (C floats per 64
     * rows). It lies in the d logits' bytes where it fits (llama_cuda.cu,
     * SCRATCH IN THE LOGITS). */
    const double scratch = tokens * (3 * C * e + Wq * e + 4 * F * e + 4 * C) +
                           4 * C * ceil(tokens / 64);
    /* Per shape: the RoPE tables (T x hd/2 cos and sin, fp32) and the kept
     * row (the logits lie in the d logits' bytes). */
    const double fixed = 4 * T * hd + 4 * V + (scratch > tokens * V * e ? scratch : 0);
    return tokens * (4 * C * (L + 1) + layers + once) + fixed +
           32.0 * 1024 * 1024; /* + cuBLASLt workspace */
}

double zpp_cost_act_bytes(const zpp_cost_in *in, double tokens) {
    if (!in) return 0;
    return in->family == ZPP_COST_LLAMA ? zpp_cost_llama_act_bytes(in, tokens)
                                        : zpp_cost_gpt_act_bytes(in, tokens);
}

/* Ranks sharing one hpZ secondary copy: hpz_size, or the node by default. */
static int hpz_group(const zpp_cost_in *in) {
    return in->hpz_size > 0 ? in->hpz_size : in->node_size;
}

/* ---- The collectives' memory-bound kernels (DESIGN.md §11, "Kernels") ----
 * Each kernel streams its input from HBM and its output back, once: its
 * time is the bytes read + written over the device's achieved memory rate
 * (in->hbm_bps). The bytes follow collectives.c's calls (cost.h lists
 * them). A kernel and its collective depend on each other's data (quantize
 * before the send, dequantize after the receive), so it cannot hide under
 * its own transfer; and it runs on the GPU the stage's compute is using,
 * which it slows by its own time to first order (a memory-bound kernel
 * beside compute-bound GEMMs still holds SMs and HBM). So each adds to the
 * stage it runs in: stage = max(c, l) + q, serial or not. */
double zpp_cost_kernel_bytes(const zpp_cost_in *in, const zpp_coll_mode *mode, size_t numel,
                             zpp_phase phase) {
    if (!in || !mode || numel == 0 || in->world <= 1 || in->node_size <= 0) return 0;
    const int W = in->world, S = in->node_size, N = W / S;
    const zpp_partition p = zpp_partition_make_shape(numel, W, N);
    const double s = (double)p.shard_len, n = (double)W * s;
    const double e = (double)zpp_dtype_size(in->dtype);
    const double q8 = (double)zpp_quant_bytes(p.shard_len, &in->coll.weight_spec);
    const double q4 = (double)zpp_quant_bytes(p.shard_len, &in->coll.grad_spec);
    const double qwz = s * e + q8 + W * q8 + n * e; /* quantize my shard, dequantize W chunks */
    switch (phase) {
    case ZPP_PHASE_FWD_GATHER: {
        double b = mode->gather == ZPP_GATHER_QWZ ? qwz : 0;
        if (mode->hpz) { /* keep my 1/H slice of the unit: a device copy, read + write */
            const int H = in->hpz_size > 0 ? in->hpz_size : S;
            b += 2 * e * (double)(W / H) * s;
        }
        return b;
    }
    case ZPP_PHASE_BWD_GATHER:
        return !mode->hpz && mode->gather == ZPP_GATHER_QWZ ? qwz : 0;
    case ZPP_PHASE_GRAD_REDUCE:
        if (mode->reduce != ZPP_REDUCE_QGZ) return 0;
        if (S > 1 && N > 1) /* reorder-quantize, dequantize-sum-requantize, dequantize-reduce */
            return (n * e + W * q4) + (W * q4 + N * q4) + (N * q4 + 4 * s);
        return (n * e + W * q4) + (W * q4 + 4 * s); /* one hop: no requantization */
    default: return 0;
    }
}

/* One unit's collectives in `mode`, as link times, and their bytes. */
typedef struct unit_cost {
    link_t fwd, bwd;          /* the forward and backward gathers */
    link_t red_ov, red_exp;   /* the reduction: part under the next stage, part exposed */
    double qf, qb, qr;        /* their kernels' seconds on the device (one rank's own) */
    double cross, intra;      /* all three, per node */
} unit_cost;

/* bwd_gathered 0: the unit stays gathered from its forward stage (the reuse
 * rule, zpp_cost_kept_units): no backward gather, no bytes, no time. */
static void unit_cost_make(const zpp_cost_in *in, const zpp_coll_mode *mode, size_t numel,
                           int bwd_gathered, unit_cost *u) {
    const int S = in->node_size, N = in->world / in->node_size, W = in->world;
    zpp_partition p = zpp_partition_make_shape(numel, W, N);
    zpp_volume vf, vb, vr;
    memset(&vf, 0, sizeof vf);
    memset(&vb, 0, sizeof vb);
    memset(&vr, 0, sizeof vr);
    memset(u, 0, sizeof *u);
    zpp_plan_gather(&vf, &p, N, S, mode->gather, in->dtype, &in->coll, ZPP_PHASE_FWD_GATHER);
    /* A world ring takes W - 1 steps; the intra-node ring of hpZ S - 1. */
    u->fwd = link_of(in, zpp_volume_cross_total(&vf), zpp_volume_intra_total(&vf),
                     vf.calls[ZPP_PHASE_FWD_GATHER] ? W - 1 : 0);
    if (mode->hpz && hpz_group(in) != S) {
        /* Secondary partition of H < S ranks: S / H groups per node, each
         * an all-gather of W / H shards per rank (volume.c's accounting with
         * that group shape; H == S below is exactly zpp_plan_gather_secondary). */
        const int H = hpz_group(in);
        zpp_group_shape g = {1, H, S / H};
        if (numel > 0)
            zpp_volume_add_call(&vb, ZPP_PHASE_BWD_GATHER, ZPP_CALL_ALLGATHER, &g,
                                (size_t)(W / H) * p.shard_len * zpp_dtype_size(in->dtype));
        u->bwd = link_of(in, zpp_volume_cross_total(&vb), zpp_volume_intra_total(&vb),
                         vb.calls[ZPP_PHASE_BWD_GATHER] ? H - 1 : 0);
    } else if (mode->hpz) {
        zpp_plan_gather_secondary(&vb, &p, N, S, in->dtype, ZPP_PHASE_BWD_GATHER);
        u->bwd = link_of(in, zpp_volume_cross_total(&vb), zpp_volume_intra_total(&vb),
                         vb.calls[ZPP_PHASE_BWD_GATHER] ? S - 1 : 0);
    } else {
        zpp_plan_gather(&vb, &p, N, S, mode->gather, in->dtype, &in->coll,
                        ZPP_PHASE_BWD_GATHER);
        u->bwd = link_of(in, zpp_volume_cross_total(&vb), zpp_volume_intra_total(&vb),
                         vb.calls[ZPP_PHASE_BWD_GATHER] ? W - 1 : 0);
    }
    zpp_plan_reduce(&vr, &p, N, S, mode->reduce, in->dtype, &in->coll);
    double rc = zpp_volume_cross_total(&vr), ri = zpp_volume_intra_total(&vr);
    if (mode->reduce == ZPP_REDUCE_BASELINE) {
        u->red_ov = link_of(in, rc, ri, vr.calls[ZPP_PHASE_GRAD_REDUCE] ? W - 1 : 0);
    } else if (numel > 0) {
        /* qgZ, slab by slab: an all-to-all inside the node (S - 1 pairwise
         * steps), then one across nodes (N - 1 steps). The first moves only
         * intra-node bytes, the second only cross-node bytes (volume.c's
         * groups: intra has one node, inter one rank per node). */
        size_t slab;
        int k = zpp_qgz_slabs(p.shard_len, N, &in->coll, &slab);
        link_t a = link_of(in, 0, ri, S > 1 ? (double)k * (S - 1) : 0);
        link_t b = link_of(in, rc, 0, N > 1 ? (double)k * (N - 1) : 0);
        if (S > 1 && N > 1 && in->qgz_inter_exposed) {
            u->red_ov = a;
            u->red_exp = b;
        } else {
            /* Under the next stage: with one rank per node (or one node)
             * only one of the two moves bytes; with both, pipelined over
             * slabs and units, the two links work at once. */
            u->red_ov.lat_s = a.lat_s + b.lat_s;
            u->red_ov.inter_s = b.inter_s;
            u->red_ov.intra_s = a.intra_s;
        }
    }
    if (!bwd_gathered) {
        memset(&vb, 0, sizeof vb);
        u->bwd = link_none;
    }
    if (in->hbm_bps > 0) {
        u->qf = zpp_cost_kernel_bytes(in, mode, numel, ZPP_PHASE_FWD_GATHER) / in->hbm_bps;
        u->qb = bwd_gathered
                    ? zpp_cost_kernel_bytes(in, mode, numel, ZPP_PHASE_BWD_GATHER) / in->hbm_bps
                    : 0;
        u->qr = zpp_cost_kernel_bytes(in, mode, numel, ZPP_PHASE_GRAD_REDUCE) / in->hbm_bps;
    }
    u->cross = rc + zpp_volume_cross_total(&vf) + zpp_volume_cross_total(&vb);
    u->intra = ri + zpp_volume_intra_total(&vf) + zpp_volume_intra_total(&vb);

    /* Measured on this world and node size (zpp_cost_calibrate): the
     * phases' times per parameter, scaled to the unit. The bytes stay the
     * volume replay's. hpZ below the node size was not what bench comm ran. */
    const struct zpp_cost_calib *c = in->calib;
    const int mi = zpp_cost_mode_index(mode);
    if (c && mi >= 0 && c->has_mode[mi] && c->coll_world == W && c->coll_node_size == S &&
        (!mode->hpz || hpz_group(in) == S)) {
        u->fwd = link_measured(c->coll_s_per_param[mi][0] * (double)numel);
        u->bwd = link_measured(bwd_gathered ? c->coll_s_per_param[mi][1] * (double)numel : 0);
        u->red_ov = link_measured(c->coll_s_per_param[mi][2] * (double)numel);
        u->red_exp = link_measured(0);
        u->qf = u->qb = u->qr = 0; /* the measured times hold the kernels */
    }
}

/* The inputs zpp_cost_step refuses, with what to give instead. */
static zpp_status step_check(const zpp_cost_in *in, const zpp_coll_mode *mode) {
    if (!in || !mode) return zpp_error(ZPP_ERR_INVALID, "cost: a NULL argument");
    if (in->world <= 0 || in->node_size <= 0 || in->world % in->node_size != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: node size %d does not divide the world of %d ranks; pick a "
                         "divisor",
                         in->node_size, in->world);
    if (in->units <= 0 || !(in->params >= in->units) || in->params > 9.007199254740992e15)
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: %.0f parameters in %d units; give at least one parameter per "
                         "unit (and under 2^53)",
                         in->params, in->units);
    if (!(in->inter_bps > 0) || !(in->intra_bps > 0) || !(in->flops_per_s > 0) ||
        !(in->tokens_per_gpu > 0) || !(in->latency_s >= 0) || !(in->ranks_per_device >= 0) ||
        !(in->opt_s_per_param >= 0) || !isfinite(in->ranks_per_device) ||
        !(in->exposed_frac >= 0 && in->exposed_frac <= 1) ||
        !isfinite(in->opt_s_per_param) || !(in->reuse_distance >= 0) ||
        !(in->hbm_bps >= 0) || !isfinite(in->hbm_bps))
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: bandwidths, FLOP/s and tokens per GPU must be positive; the "
                         "latency, ranks per device, optimizer time, reuse distance and "
                         "memory rate not negative; the exposed fraction in [0, 1]");
    if (zpp_dtype_size(in->dtype) == 0) return zpp_error(ZPP_ERR_INVALID, "cost: unknown dtype");
    if (in->n_layer > 0 && (in->n_embd <= 0 || in->seq_len <= 0 || in->vocab <= 0))
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: a GPT shape needs n_layer, n_embd, seq_len and vocab all > 0");
    if (in->n_layer > 0 && in->family == ZPP_COST_LLAMA &&
        (!llama_shape(in) || in->n_embd % in->n_head || in->n_head % in->n_kv_head))
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: a Llama shape needs n_head dividing n_embd, n_kv_head dividing "
                         "n_head and n_ffn > 0 (zpp_llama_config_of_shape resolves them)");
    if (in->family != ZPP_COST_GPT2 && in->family != ZPP_COST_LLAMA)
        return zpp_error(ZPP_ERR_INVALID, "cost: family %d is neither GPT-2 (0) nor Llama (1)",
                         in->family);
    if (mode->hpz && (in->hpz_size < 0 || (in->hpz_size > 0 && in->node_size % in->hpz_size)))
        return zpp_error(ZPP_ERR_INVALID,
                         "cost: hpZ partition size %d does not divide the node size %d; pick a "
                         "divisor (0 = the node)",
                         in->hpz_size, in->node_size);
    ZPP_CHECK(zpp_quant_spec_check(&in->coll.weight_spec));
    ZPP_CHECK(zpp_quant_spec_check(&in->coll.grad_spec));
    return ZPP_OK;
}

/* What the forward and backward recurrences of one step share. */
typedef struct step_ctx {
    const zpp_cost_in *in;
    const zpp_coll_mode *mode;
    int K;               /* units */
    int kept;            /* units kept..K-1 stay gathered from forward to backward */
    size_t P;            /* parameters */
    double share;        /* ranks sharing the device: each computes at 1/share of its rate */
    double fwd_c, bwd_c; /* the whole model's forward and backward compute, seconds */
} step_ctx;

/* Unit i's collectives (gathered again in the backward unless kept). */
static void step_unit(const step_ctx *s, int i, unit_cost *u) {
    unit_cost_make(s->in, s->mode, zpp_plan_unit_numel(s->P, s->K, i), i < s->kept, u);
}

/* Forward, units 0..K-1: stage i computes f_i while the gather of the next
 * stage's unit travels (engine.c forward: gather_start(s+1) before stage s's
 * kernels), and the next stage starts when both are done:
 *     T_fwd = g_0 + sum_i max(f_i, g_{i+1}),
 * where after the last forward stage the "next" gather is the first backward
 * unit's (none when it stays gathered: the engine starts no backward gather
 * in the forward). The first gather has nothing under it. Each unit's
 * collectives are made here once, so their bytes and their time back to
 * back (comm_s) are summed here too. Sets fwd_s, comm_s, the forward's part
 * of quant_s and the bytes. */
static void step_forward(const step_ctx *s, zpp_cost_out *o) {
    const zpp_cost_in *in = s->in;
    const double share = s->share;
    unit_cost cur;
    step_unit(s, 0, &cur);
    /* q: the kernels of the collective priced with the stage (unit_cost_make:
     * they add to it, never hide); the device's share like compute. */
    double quant = cur.qf * share, comm = 0;
    double t = link_time(cur.fwd) + cur.qf * share;
    for (int i = 0; i < s->K; i++) {
        o->cross_node_bytes += cur.cross;
        o->intra_node_bytes += cur.intra;
        comm += link_time(cur.fwd) + link_time(cur.bwd) + link_time(cur.red_ov) +
                link_time(cur.red_exp) + (cur.qf + cur.qb + cur.qr) * share;
        double f = s->fwd_c * (double)zpp_plan_unit_numel(s->P, s->K, i) / in->params;
        unit_cost next = cur;
        if (i + 1 < s->K) {
            step_unit(s, i + 1, &next);
            t += stage_time(in, f, link_time(next.fwd)) + next.qf * share;
            quant += next.qf * share;
        } else { /* unit K-1: the first backward unit */
            t += stage_time(in, f, link_time(cur.bwd)) + cur.qb * share;
            quant += cur.qb * share;
        }
        cur = next;
    }
    o->fwd_s = t;
    o->comm_s = comm;
    o->quant_s = quant;
}

/* Backward, units K-1..0: stage j computes b_j while two things travel on
 * two streams: the gather for stage j+1 and the reduction of the unit of
 * stage j-1 (engine.c backward: reduce_start(u) completes the previous
 * reduction after stage j's kernels are enqueued, so the compute stream
 * waits for it before stage j+1):
 *     T_bwd = sum_j [ max(b_j, conc(h_{j+1}, r_{j-1})) + x_{j-1} ] + r_{K-1} + x_{K-1},
 * conc = the two sharing the links, x = a reduction's exposed part (qgZ's
 * cross-node step as run today). The last reduction has nothing under it.
 * A kept unit's h is 0: the first gathered unit's gather travels under the
 * last kept stage, one ahead as everywhere in the recurrence (the engine
 * starts it earlier, passing over resident units; not modelled). Sets bwd_s
 * and adds the backward's kernels to quant_s. */
static void step_backward(const step_ctx *s, zpp_cost_out *o) {
    const zpp_cost_in *in = s->in;
    const int K = s->K;
    link_t red_ov = link_none, red_exp = link_none;
    double tb = 0, red_q = 0;
    for (int j = 0; j < K; j++) {
        int u = K - 1 - j;
        unit_cost me, nx;
        step_unit(s, u, &me);
        link_t gnext = link_none;
        double gq = 0;
        if (j + 1 < K) {
            step_unit(s, u - 1, &nx);
            gnext = nx.bwd;
            gq = nx.qb * s->share;
        }
        double b = s->bwd_c * (double)zpp_plan_unit_numel(s->P, K, u) / in->params;
        tb += stage_time(in, b, link_concurrent(in, gnext, red_ov)) + link_time(red_exp) + gq +
              red_q;
        o->quant_s += gq + red_q;
        red_ov = me.red_ov;
        red_exp = me.red_exp;
        red_q = me.qr * s->share;
    }
    tb += link_time(red_ov) + link_time(red_exp) + red_q;
    o->quant_s += red_q;
    o->bwd_s = tb;
}

/* The rank's part of every unit, in elements: what the optimizer steps and
 * the memory holds. */
typedef struct step_shards {
    double shard;       /* its shards */
    double secondary;   /* its hpZ secondary shards (p.sec_len when H = S) */
    double max_padded;  /* the largest unit, padded */
    double kept_padded; /* the kept units but the last, padded: held at the boundary */
} step_shards;

/* Sums them over the units, in unit order. */
static void step_shards_sum(const step_ctx *s, step_shards *sh) {
    const int W = s->in->world, N = W / s->in->node_size, H = hpz_group(s->in);
    memset(sh, 0, sizeof *sh);
    for (int i = 0; i < s->K; i++) {
        zpp_partition p = zpp_partition_make_shape(zpp_plan_unit_numel(s->P, s->K, i), W, N);
        sh->shard += (double)p.shard_len;
        sh->secondary += (double)(W / H) * (double)p.shard_len;
        if ((double)p.padded > sh->max_padded) sh->max_padded = (double)p.padded;
        if (i >= s->kept && i < s->K - 1) sh->kept_padded += (double)p.padded;
    }
}

/* Memory per rank. Persistent: per element of the rank's shards, fp32
 * master + Adam m + v + fp32 gradient accumulator (16 bytes; 14 with the
 * bf16 accumulator of work_grads at world 1; no
 * working-dtype copy: a gather rounds the master); with hpZ, the secondary
 * shard of every unit, kept from the forward to the backward: sec_len = N x
 * shard_len elements of e bytes each (1/S of the model per rank: 2P/S in
 * bf16; with a partition of H ranks, W/H shards: 2P/H).
 * Transient at the backward's peak (the largest unit U, padded): the
 * gathered units in E (the current one and prefetch_depth ahead), the
 * current unit's full fp32 gradient, and for each of the reduce_depth
 * reductions in flight a unit's gradient in E and its fp32 reduced shard (at
 * world 1 only the gathered units: the backward adds into the accumulator,
 * engine.c's alone()); the quantized wire buffers (qwZ: one quantized copy
 * per gather in flight, qgZ: two 4-bit copies of the unit) are added at their
 * zpp_quant_bytes size.
 * Kept units (the reuse rule): at the forward->backward boundary, the first
 * backward stage's unit (K-1, the "current" above) and the other kept units
 * are all gathered, each held from its forward stage to its backward stage:
 * the peak grows by those others, padded, in E. */
static void step_memory(const zpp_cost_in *in, const zpp_coll_mode *mode, const step_shards *sh,
                        zpp_cost_out *o) {
    const int W = in->world;
    const double e = (double)zpp_dtype_size(in->dtype);
    const int bf16_grads = in->work_grads && W == 1 && in->dtype == ZPP_BF16;
    o->mem_shard_state = (bf16_grads ? 14 : 16) * sh->shard;
    o->mem_kept = e * sh->kept_padded;
    o->mem_secondary = mode->hpz ? e * sh->secondary : 0;
    double U = sh->max_padded, su = U / W;
    const double ahead = in->prefetch_depth > 0 ? in->prefetch_depth : 2;
    const double flying = in->reduce_depth > 0 ? in->reduce_depth : 2;
    o->mem_transient = (1 + ahead) * e * U + (W > 1 ? 4 * U + flying * (e * U + 4 * su) : 0);
    if (in->resident_weights && W == 1 && mode->gather == ZPP_GATHER_BASELINE && !mode->hpz) {
        o->mem_kept = e * sh->shard; /* every unit, resident (engine.c) */
        o->mem_transient -= (1 + ahead) * e * U;
        /* in bf16 the resident copy is the master's high half, its low
         * half 2 bytes (the engine's split masters, units.c) */
        if (in->dtype == ZPP_BF16) o->mem_shard_state -= 2 * sh->shard;
    }
    if (mode->gather == ZPP_GATHER_QWZ)
        o->mem_transient += 2 * W * (double)zpp_quant_bytes((size_t)su, &in->coll.weight_spec);
    if (mode->reduce == ZPP_REDUCE_QGZ)
        o->mem_transient += 2 * W * (double)zpp_quant_bytes((size_t)su, &in->coll.grad_spec);
    o->mem_acts_known = in->n_layer > 0;
    o->mem_acts = zpp_cost_act_bytes(in, in->tokens_per_gpu);
    o->mem_bytes_per_rank =
        o->mem_shard_state + o->mem_secondary + o->mem_transient + o->mem_kept + o->mem_acts;
}

zpp_status zpp_cost_step(const zpp_cost_in *in, const zpp_coll_mode *mode,
                         zpp_cost_out *out_p) {
    if (!out_p) return zpp_error(ZPP_ERR_INVALID, "cost: a NULL argument");
    ZPP_CHECK(step_check(in, mode));
    zpp_cost_out o;
    memset(&o, 0, sizeof o);
    o.flops_per_gpu = zpp_cost_step_flops(in);
    /* Ranks sharing one device compute at their share of its rate. */
    step_ctx s = {.in = in, .mode = mode, .K = in->units, .P = (size_t)in->params,
                  .share = in->ranks_per_device > 1 ? in->ranks_per_device : 1};
    const double model_s = o.flops_per_gpu / in->flops_per_s * s.share;
    /* With activation checkpointing the backward first recomputes its
     * unit's forward: its compute is the forward's third plus its own two. */
    s.fwd_c = model_s / 3;
    s.bwd_c = model_s * (in->recompute ? 1.0 : 2.0 / 3);
    /* The reuse rule: units kept..K-1 stay gathered from their forward stage
     * into their backward stage and make no backward gather. */
    o.kept_units = zpp_cost_kept_units(in);
    s.kept = s.K - o.kept_units;

    step_forward(&s, &o);
    step_backward(&s, &o);
    step_shards sh;
    step_shards_sum(&s, &sh);
    /* The optimizer step after the backward, on the rank's shards (the
     * norm's all-reduce of a few floats is left out). */
    o.opt_s = in->opt_s_per_param * sh.shard * s.share;
    o.compute_s = s.fwd_c + s.bwd_c + o.opt_s;
    o.step_s = o.fwd_s + o.bwd_s + o.opt_s;
    o.exposed_comm_s = o.step_s - o.compute_s;
    o.tokens_per_s = (double)in->world * in->tokens_per_gpu / o.step_s;
    o.tflops_per_gpu = o.flops_per_gpu / o.step_s / 1e12;
    step_memory(in, mode, &sh, &o);
    *out_p = o;
    return ZPP_OK;
}

/* ---- zpp_cost_pick --------------------------------------------------------
 * A brute-force search: the space is small (5 modes x the divisors of the
 * node x about 17 micro-batches), each point costs one zpp_cost_step, and
 * an exhaustive search cannot miss the optimum the way a greedy one can. */

#define ZPP_PICK_MAX_MICRO_BATCH 65536

/* a beats b: more tokens/s; a tie keeps the earlier candidate (b). */
static int choice_better(const zpp_cost_choice *a, const zpp_cost_choice *b) {
    return a->out.tokens_per_s > b->out.tokens_per_s;
}

static int filter_has(const int *list, int n, int x) {
    for (int i = 0; i < n; i++)
        if (list[i] == x) return 1;
    return 0;
}

/* A filter's lists: micro-batches (when searched: `list`) positive and
 * ascending, hpZ sizes dividing the node of S ranks. */
static zpp_status pick_filter_check(const zpp_cost_pick_filter *f, int list, int S) {
    for (int i = 0; list && i < f->n_micro_batches; i++)
        if (f->micro_batches[i] <= 0 || (i && f->micro_batches[i] <= f->micro_batches[i - 1]))
            return zpp_error(ZPP_ERR_INVALID,
                             "pick: micro-batch list entry %d is %d; give positive micro-"
                             "batches in ascending order",
                             i + 1, f->micro_batches[i]);
    for (int i = 0; f->hpz_sizes && i < f->n_hpz_sizes; i++)
        if (f->hpz_sizes[i] < 2 || S % f->hpz_sizes[i])
            return zpp_error(ZPP_ERR_INVALID,
                             "pick: hpZ partition size %d does not divide the node of %d "
                             "ranks (or is below 2); give divisors of the node size",
                             f->hpz_sizes[i], S);
    return ZPP_OK;
}

/* Why the search stopped at r->best's micro-batch: the next one (the next
 * entry of a searched list `f`, else twice the best's) priced for the
 * winner's mode and H, its memory and whether that fits. Nothing without a
 * GPT shape. */
static zpp_status pick_next(const zpp_cost_in *in, double mem_budget,
                            const zpp_cost_pick_filter *f, zpp_cost_pick_result *r) {
    if (in->n_layer <= 0) return ZPP_OK;
    r->next_micro_batch = 0;
    if (f) { /* the next entry after the best's, if any */
        for (int i = 0; i < f->n_micro_batches; i++)
            if (f->micro_batches[i] > r->best.micro_batch) {
                r->next_micro_batch = f->micro_batches[i];
                break;
            }
    } else {
        r->next_micro_batch = 2 * r->best.micro_batch;
    }
    if (!r->next_micro_batch) return ZPP_OK;
    zpp_cost_in c = *in;
    zpp_cost_out o;
    c.hpz_size = r->best.hpz_size;
    c.tokens_per_gpu = (double)r->next_micro_batch * in->seq_len;
    ZPP_CHECK(zpp_cost_step(&c, zpp_coll_mode_get(r->best.mode), &o));
    r->next_mem_bytes = o.mem_bytes_per_rank;
    r->next_fits = o.mem_bytes_per_rank <= mem_budget;
    return ZPP_OK;
}

zpp_status zpp_cost_pick(const zpp_cost_in *in, double mem_budget, int max_micro_batch,
                         zpp_cost_pick_result *out_p) {
    return zpp_cost_pick_only(in, mem_budget, max_micro_batch, NULL, out_p);
}

zpp_status zpp_cost_pick_only(const zpp_cost_in *in, double mem_budget, int max_micro_batch,
                              const zpp_cost_pick_filter *filter,
                              zpp_cost_pick_result *out_p) {
    if (!in || !out_p) return zpp_error(ZPP_ERR_INVALID, "pick: a NULL argument");
    if (!(mem_budget > 0))
        return zpp_error(ZPP_ERR_INVALID, "pick: the memory budget must be > 0 bytes per rank");
    const int gpt = in->n_layer > 0, S = in->node_size;
    const int max_b = max_micro_batch > 0 ? max_micro_batch : ZPP_PICK_MAX_MICRO_BATCH;
    const zpp_cost_pick_filter none = {0, NULL, 0, NULL, 0};
    const zpp_cost_pick_filter *f = filter ? filter : &none;
    const int list = gpt && f->micro_batches && f->n_micro_batches > 0;
    ZPP_CHECK(pick_filter_check(f, list, S));
    zpp_cost_pick_result r;
    memset(&r, 0, sizeof r);
    zpp_cost_choice best_of[ZPP_COLL_MODE_COUNT], smallest;
    int has[ZPP_COLL_MODE_COUNT] = {0}, has_smallest = 0;
    memset(best_of, 0, sizeof best_of);
    memset(&smallest, 0, sizeof smallest);

    /* Micro-batches in ascending order; memory only grows with the batch
     * (activations), so once nothing fits at b nothing fits above it. */
    for (int bi = 0, b = list ? f->micro_batches[0] : gpt ? 1 : 0;; bi++) {
        int any_fit = 0;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            const zpp_coll_mode *md = zpp_coll_mode_get(m);
            if (md->hpz && S < 2) continue; /* one rank per node: no node to keep it in */
            if (f->modes && !(f->modes & (1u << m))) continue;
            for (int H = md->hpz ? 2 : 0; H <= (md->hpz ? S : 0); H++) {
                if (md->hpz && S % H) continue;
                if (md->hpz && f->hpz_sizes && !filter_has(f->hpz_sizes, f->n_hpz_sizes, H))
                    continue;
                zpp_cost_in c = *in;
                c.hpz_size = H;
                if (gpt) c.tokens_per_gpu = (double)b * in->seq_len;
                zpp_cost_choice ch;
                memset(&ch, 0, sizeof ch);
                ch.mode = m;
                ch.hpz_size = H;
                ch.micro_batch = b;
                ZPP_CHECK(zpp_cost_step(&c, md, &ch.out));
                r.candidates++;
                if (!(ch.out.mem_bytes_per_rank <= mem_budget)) {
                    if (!has_smallest ||
                        ch.out.mem_bytes_per_rank < smallest.out.mem_bytes_per_rank)
                        smallest = ch;
                    has_smallest = 1;
                    continue;
                }
                r.fitting++;
                any_fit = 1;
                if (!has[m] || choice_better(&ch, &best_of[m])) best_of[m] = ch;
                has[m] = 1;
            }
        }
        if (list) { /* every entry of the list: it may skip sizes */
            if (bi + 1 >= f->n_micro_batches) break;
            b = f->micro_batches[bi + 1];
            continue;
        }
        if (!gpt || !any_fit || b > max_b / 2) break;
        b *= 2;
    }
    if (!r.candidates)
        return zpp_error(ZPP_ERR_CONFIG,
                         "pick: no candidate left by the filter (modes, hpZ sizes, "
                         "micro-batches); allow at least one setting");
    if (!r.fitting)
        return zpp_error(ZPP_ERR_CONFIG,
                         "pick: nothing fits in %.1f GiB per rank; the smallest setting, %s "
                         "at micro-batch %d, needs %.1f GiB: give more memory per rank, more "
                         "ranks, or a smaller model or batch",
                         mem_budget / 1073741824.0, zpp_coll_mode_get(smallest.mode)->name,
                         smallest.micro_batch, smallest.out.mem_bytes_per_rank / 1073741824.0);

    int bm = -1;
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        if (has[m] && (bm < 0 || choice_better(&best_of[m], &best_of[bm]))) bm = m;
    r.best = best_of[bm];
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        if (m != bm && has[m] &&
            (!r.has_runner_up || choice_better(&best_of[m], &r.runner_up))) {
            r.runner_up = best_of[m];
            r.has_runner_up = 1;
        }
    r.has_zero3 = has[0];
    r.zero3 = best_of[0];

    ZPP_CHECK(pick_next(in, mem_budget, list ? f : NULL, &r));
    *out_p = r;
    return ZPP_OK;
}

/* ---- zpp_cost_calibrate -------------------------------------------------- */

#define CALIB_MAX_TRAIN 4096 /* train lines kept for the medians */

/* Sums over the lines. */
typedef struct calib_acc {
    double intra_bytes, intra_s;             /* hpZ backward gathers, per rank */
    double cross_bytes, cross_s, cross_intra; /* ZeRO-3 gathers; their intra bytes per rank */
    double coll_s[ZPP_COLL_MODE_COUNT][3], coll_params[ZPP_COLL_MODE_COUNT];
    double tok[CALIB_MAX_TRAIN], sec[CALIB_MAX_TRAIN]; /* train lines: tokens a rank, seconds */
    int mode[CALIB_MAX_TRAIN], line[CALIB_MAX_TRAIN]; /* W-rank lines: their mode, line number */
    int profiled[CALIB_MAX_TRAIN]; /* the line's compute_ms (--profile) is its seconds */
    int ntrain;
    int train_world; /* 1: world-1 lines; the model's world: lines of runs on its ranks */
} calib_acc;

static zpp_status calib_num(const cJSON *o, const char *key, const char *path, int line,
                            double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
        return zpp_error(ZPP_ERR_FORMAT,
                         "calibrate: %s line %d: no number \"%s\" >= 0; give the lines "
                         "`zeropp bench comm --json` or `zeropp train --metrics` print",
                         path, line, key);
    *v = x->valuedouble;
    return ZPP_OK;
}

/* The standard mode of a trainer's mode name (trainer.c: the options
 * joined by '+' in the order qwz, hpz, qgz; "zero3" with none), or -1. */
static int train_mode_index(const char *name) {
    static const char *const names[ZPP_COLL_MODE_COUNT] = {"zero3", "qwz", "hpz", "qgz",
                                                           "qwz+hpz+qgz"};
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        if (strcmp(name, names[m]) == 0) return m;
    return -1;
}

/* A `zeropp train --metrics` line: its tokens a rank and time, if it
 * counts. A line that moved no bytes is a world-1 run; one that moved bytes
 * is a run on the ranks the model describes (model->world). Its compute
 * time: compute_ms when the run was profiled (--profile: the compute
 * stream's own busy time, whatever the collectives overlapped); else the
 * step_ms of a world-1 run, or the wall step of a W-rank run less its
 * mode's measured collectives (subtracted in zpp_cost_calibrate, once every
 * bench comm line is read; right only where nothing overlaps, as on CPU
 * ranks: on GPU ranks the collectives hide under compute, and a step can
 * be shorter than its collectives). */
static zpp_status calib_train_line(const cJSON *o, const char *path, int line,
                                   const zpp_cost_in *model, calib_acc *a, int *used) {
    double step = 0, tps = 0, ms = 0, cross = 0, intra = 0, comp = -1;
    int mi = -1;
    ZPP_CHECK(calib_num(o, "step", path, line, &step));
    ZPP_CHECK(calib_num(o, "tokens_per_s", path, line, &tps));
    ZPP_CHECK(calib_num(o, "step_ms", path, line, &ms));
    ZPP_CHECK(calib_num(o, "cross_node_bytes", path, line, &cross));
    ZPP_CHECK(calib_num(o, "intra_node_bytes", path, line, &intra));
    if (!model)
        return zpp_error(ZPP_ERR_FORMAT,
                         "calibrate: %s line %d: a train line needs the model (--model or "
                         "--params) to count its FLOPs",
                         path, line);
    const int W = (cross > 0 || intra > 0) ? model->world : 1;
    if (cJSON_GetObjectItemCaseSensitive(o, "compute_ms"))
        ZPP_CHECK(calib_num(o, "compute_ms", path, line, &comp));
    if (W > 1) {
        const cJSON *mo = cJSON_GetObjectItemCaseSensitive(o, "mode");
        if (cJSON_IsString(mo)) mi = train_mode_index(mo->valuestring);
        if (mi < 0)
            return zpp_error(ZPP_ERR_FORMAT,
                             "calibrate: %s line %d: this train step moved bytes (a run on "
                             "several ranks) but names no mode the bench measures (\"mode\": "
                             "zero3, qwz, hpz, qgz or qwz+hpz+qgz)",
                             path, line);
    }
    if (a->train_world && a->train_world != W)
        return zpp_error(ZPP_ERR_FORMAT,
                         "calibrate: %s line %d: a train line of a %d-rank run after lines of "
                         "a %d-rank run; give one kind (world-1 runs, or runs on the planned "
                         "ranks)",
                         path, line, W, a->train_world);
    a->train_world = W;
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(o, "skipped");
    if (step < 2 || cJSON_IsTrue(sk) || !(ms > 0)) return ZPP_OK; /* warm-up or no update */
    /* tokens_per_s is printed to a tenth, so the product is off by at most
     * 0.05 x the step's seconds: whole tokens for any step under 10 s. A
     * run at sequence length 1 (a step of almost nothing but the optimizer)
     * is a valid point of the fit. */
    double tokens = round(tps * ms / 1000 / W);
    if (!(tokens >= 1))
        return zpp_error(ZPP_ERR_FORMAT, "calibrate: %s line %d: no tokens in this step",
                         path, line);
    if (a->ntrain == CALIB_MAX_TRAIN)
        return zpp_error(ZPP_ERR_FORMAT, "calibrate: %s: more than %d train lines", path,
                         CALIB_MAX_TRAIN);
    a->tok[a->ntrain] = tokens;
    a->sec[a->ntrain] = (comp >= 0 ? comp : ms) * 1e-3;
    a->mode[a->ntrain] = mi;
    a->line[a->ntrain] = line;
    a->profiled[a->ntrain] = comp >= 0;
    a->ntrain++;
    *used = 1;
    return ZPP_OK;
}

/* One bench comm line's object into the sums. */
static zpp_status calib_comm_line(const cJSON *o, const char *path, int line, double lat,
                                  calib_acc *a, zpp_cost_calib *c, int *intra_used,
                                  int *inter_used) {
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    if (!cJSON_IsString(mode))
        return zpp_error(ZPP_ERR_FORMAT,
                         "calibrate: %s line %d: not a `zeropp bench comm --json` line (no "
                         "\"mode\")",
                         path, line);
    double W = 0, S = 0, U = 0, P = 0;
    ZPP_CHECK(calib_num(o, "world", path, line, &W));
    ZPP_CHECK(calib_num(o, "node_size", path, line, &S));
    ZPP_CHECK(calib_num(o, "units", path, line, &U));
    if (W < 1 || S < 1 || U < 1 || fmod(W, S) != 0)
        return zpp_error(ZPP_ERR_FORMAT,
                         "calibrate: %s line %d: world %.0f, node_size %.0f, units %.0f: want "
                         "positive counts, the node size dividing the world",
                         path, line, W, S, U);
    const char *m = mode->valuestring;
    int mi = -1;
    for (int k = 0; k < ZPP_COLL_MODE_COUNT; k++)
        if (strcmp(m, zpp_coll_mode_get(k)->name) == 0) mi = k;
    if (mi >= 0) { /* (b): the phase times as measured */
        if (c->coll_world && (c->coll_world != (int)W || c->coll_node_size != (int)S ||
                              c->coll_units != (int)U))
            return zpp_error(ZPP_ERR_FORMAT,
                             "calibrate: %s line %d: world %.0f, node size %.0f, %.0f units, "
                             "where earlier lines had %d, %d, %d; give one shape per file",
                             path, line, W, S, U, c->coll_world, c->coll_node_size,
                             c->coll_units);
        ZPP_CHECK(calib_num(o, "params", path, line, &P));
        if (!(P >= 1))
            return zpp_error(ZPP_ERR_FORMAT, "calibrate: %s line %d: \"params\" must be >= 1",
                             path, line);
        static const char *const key[3] = {"fwd_gather_ms", "bwd_gather_ms", "grad_reduce_ms"};
        double t[3];
        for (int k = 0; k < 3; k++) ZPP_CHECK(calib_num(o, key[k], path, line, &t[k]));
        for (int k = 0; k < 3; k++) a->coll_s[mi][k] += t[k] * 1e-3;
        a->coll_params[mi] += P;
        c->coll_world = (int)W;
        c->coll_node_size = (int)S;
        c->coll_units = (int)U;
        c->has_mode[mi] = 1;
    }
    if (strcmp(m, "hpz") == 0 || strcmp(m, "zeropp") == 0) {
        double cross = 0, intra = 0, ms = 0;
        ZPP_CHECK(calib_num(o, "bwd_gather_cross_bytes", path, line, &cross));
        ZPP_CHECK(calib_num(o, "bwd_gather_intra_bytes", path, line, &intra));
        ZPP_CHECK(calib_num(o, "bwd_gather_ms", path, line, &ms));
        if (cross == 0 && intra > 0) {
            double t = ms * 1e-3 - U * (S - 1) * lat;
            if (!(t > 0))
                return zpp_error(ZPP_ERR_FORMAT,
                                 "calibrate: %s line %d: bwd_gather_ms %g is no more than the "
                                 "latency alone (%g steps); lower the latency",
                                 path, line, ms, U * (S - 1));
            a->intra_bytes += intra / S;
            a->intra_s += t;
            *intra_used = 1;
        }
    } else if (strcmp(m, "zero3") == 0) {
        static const char *const phase[2] = {"fwd_gather", "bwd_gather"};
        for (int k = 0; k < 2; k++) {
            char key[3][40];
            double cross = 0, intra = 0, ms = 0;
            snprintf(key[0], sizeof key[0], "%s_cross_bytes", phase[k]);
            snprintf(key[1], sizeof key[1], "%s_intra_bytes", phase[k]);
            snprintf(key[2], sizeof key[2], "%s_ms", phase[k]);
            ZPP_CHECK(calib_num(o, key[0], path, line, &cross));
            ZPP_CHECK(calib_num(o, key[1], path, line, &intra));
            ZPP_CHECK(calib_num(o, key[2], path, line, &ms));
            if (cross == 0) continue; /* one node: nothing crossed */
            double t = ms * 1e-3 - U * (W - 1) * lat;
            if (!(t > 0))
                return zpp_error(ZPP_ERR_FORMAT,
                                 "calibrate: %s line %d: %s %g is no more than the latency "
                                 "alone (%g steps); lower the latency",
                                 path, line, key[2], ms, U * (W - 1));
            a->cross_bytes += cross;
            a->cross_s += t;
            a->cross_intra += intra / S;
            *inter_used = 1;
        }
    }
    return ZPP_OK; /* qwz, qgz: only (b) */
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The compute fit of cost.h from the train lines (a->ntrain > 0). */
static zpp_status calib_compute(calib_acc *a, const char *path, const zpp_cost_in *model,
                                zpp_cost_calib *c) {
    /* Sorted by tokens, each token count's lines are contiguous; its times,
     * sorted apart, give its median. gx, gy: one point per token count. */
    const int n = a->ntrain;
    double (*pair)[2] = malloc((size_t)n * sizeof *pair);
    double *gx = malloc(3 * (size_t)n * sizeof *gx);
    if (!pair || !gx) {
        free(pair);
        free(gx);
        return zpp_error(ZPP_ERR_NOMEM, "calibrate: no memory for %d lines", n);
    }
    double *gy = gx + n, *tmp = gx + 2 * n;
    for (int i = 0; i < n; i++) pair[i][0] = a->tok[i], pair[i][1] = a->sec[i];
    qsort(pair, (size_t)n, sizeof *pair, cmp_double); /* by the first member: tokens */
    int g = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && pair[j][0] == pair[i][0]) tmp[j - i] = pair[j][1], j++;
        const int k = j - i;
        qsort(tmp, (size_t)k, sizeof tmp[0], cmp_double);
        gx[g] = pair[i][0];
        gy[g] = k % 2 ? tmp[k / 2] : 0.5 * (tmp[k / 2 - 1] + tmp[k / 2]);
        g++;
        i = j;
    }
    free(pair);
    zpp_cost_in one = *model;
    one.tokens_per_gpu = 1;
    const double fpt = zpp_cost_step_flops(&one); /* FLOPs per token of one rank */
    c->train_points = g;
    c->train_world = a->train_world;
    if (g == 1) { /* the optimizer folded into the rate */
        c->flops_per_s = gx[0] * fpt / gy[0];
        c->opt_s_per_param = 0;
        free(gx);
        return ZPP_OK;
    }
    /* Least squares t = s x tokens + b over the medians. */
    double mx = 0, my = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < g; i++) mx += gx[i] / g, my += gy[i] / g;
    for (int i = 0; i < g; i++) sxx += (gx[i] - mx) * (gx[i] - mx), sxy += (gx[i] - mx) * (gy[i] - my);
    double slope = sxy / sxx, icpt = my - slope * mx;
    const double x0 = gx[0], y0 = gy[0], x1 = gx[g - 1], y1 = gy[g - 1];
    if (!(slope > 0)) {
        free(gx);
        return zpp_error(ZPP_ERR_FORMAT,
                         "calibrate: %s: the step time does not grow with the tokens (%.0f "
                         "tokens %.4f s, %.0f tokens %.4f s): a noisy machine; run more steps",
                         path, x0, y0, x1, y1);
    }
    if (icpt < 0) { /* noise below a zero intercept: through the origin */
        double sx = 0, sy = 0;
        for (int i = 0; i < g; i++) sx += gx[i] * gx[i], sy += gx[i] * gy[i];
        slope = sy / sx;
        icpt = 0;
    }
    c->flops_per_s = fpt / slope;
    /* The intercept is the rank's per-step work: per element of its shard
     * (P / W of them; the optimizer's share, which dominates it). */
    c->opt_s_per_param = icpt / (model->params / a->train_world);
    free(gx);
    return ZPP_OK;
}

/* Every line of the file into the sums (a) and the counts (c): bench comm
 * lines and train lines; blank lines skipped; anything else refused naming
 * the line. */
static zpp_status calib_read(FILE *f, const char *path, double latency_s,
                             const zpp_cost_in *model, calib_acc *a, zpp_cost_calib *c) {
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    int line = 0;
    zpp_status st = ZPP_OK;
    errno = 0;
    while (st == ZPP_OK && (n = getline(&buf, &cap, f)) >= 0) {
        line++;
        size_t i = 0;
        while (i < (size_t)n && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' ||
                                 buf[i] == '\r'))
            i++;
        if (i == (size_t)n) continue; /* blank */
        cJSON *o = cJSON_ParseWithLength(buf, (size_t)n);
        const cJSON *bench = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "bench")
                                               : NULL;
        if (!cJSON_IsObject(o)) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "calibrate: %s line %d: not a JSON object; give the lines "
                           "`zeropp bench comm --json` or `zeropp train --metrics` print, one "
                           "per line",
                           path, line);
        } else if (cJSON_IsString(bench) && strcmp(bench->valuestring, "comm") == 0) {
            int iu = 0, xu = 0;
            st = calib_comm_line(o, path, line, latency_s, a, c, &iu, &xu);
            c->lines++;
            c->intra_lines += iu;
            c->inter_lines += xu;
        } else if (!bench && cJSON_GetObjectItemCaseSensitive(o, "step_ms")) {
            int used = 0;
            st = calib_train_line(o, path, line, model, a, &used);
            c->lines++;
            c->train_lines += used;
        } else {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "calibrate: %s line %d: not a `zeropp bench comm --json` line (no "
                           "\"bench\": \"comm\") nor a `zeropp train --metrics` line (no "
                           "\"step_ms\")",
                           path, line);
        }
        cJSON_Delete(o);
    }
    if (st == ZPP_OK && ferror(f))
        st = zpp_error(ZPP_ERR_IO, "calibrate: cannot read '%s': %s", path, strerror(errno));
    free(buf);
    return st;
}

/* Train lines of runs on these ranks: the wall step less the collectives'
 * measured time in that mode (per parameter x the model's parameters) is
 * the pace at which the group computes: it holds the ranks' sharing of the
 * cores and each wait for the slowest rank. */
static zpp_status calib_train_pace(calib_acc *a, const char *path, const zpp_cost_in *model,
                                   const zpp_cost_calib *c) {
    for (int i = 0; i < a->ntrain; i++) {
        const int mi = a->mode[i];
        if (mi < 0 || a->profiled[i]) continue;
        if (!c->has_mode[mi] || c->coll_world != model->world ||
            c->coll_node_size != model->node_size)
            return zpp_error(ZPP_ERR_FORMAT,
                             "calibrate: %s line %d: a train step of a %d-rank run in mode %s "
                             "needs that mode's `zeropp bench comm --json` line from the same "
                             "ranks (world %d, node size %d) in the file",
                             path, a->line[i], model->world, zpp_coll_mode_get(mi)->name,
                             model->world, model->node_size);
        /* bench comm gathers every unit again in its backward, so its
         * backward-gather time per parameter is per parameter moved; the
         * train run moved it only for the units the reuse rule did not keep
         * (model->reuse_distance: give the distance the run trained with). */
        double moved[3] = {model->params, model->params, model->params}, coll = 0;
        const int U = model->units, nk = zpp_cost_kept_units(model);
        for (int u = U - nk; u < U; u++)
            moved[1] -= (double)zpp_plan_unit_numel((size_t)model->params, U, u);
        for (int k = 0; k < 3; k++) coll += a->coll_s[mi][k] / a->coll_params[mi] * moved[k];
        a->sec[i] -= coll;
        if (!(a->sec[i] > 0))
            return zpp_error(ZPP_ERR_FORMAT,
                             "calibrate: %s line %d: the step is no longer than its mode's "
                             "measured collectives (%.4f s): measure both on the same ranks",
                             path, a->line[i], coll);
    }
    return ZPP_OK;
}

/* The link rates (pooled: total bytes over total time) and each measured
 * mode's phase times per parameter. */
static void calib_rates(const calib_acc *a, zpp_cost_calib *c) {
    if (c->intra_lines) c->intra_bps = a->intra_bytes / a->intra_s;
    if (c->inter_lines) {
        c->inter_bps = a->cross_bytes / a->cross_s;
        /* Bound by the intra-node link when its term alone fills the time. */
        if (c->intra_lines && a->cross_intra / c->intra_bps >= a->cross_s)
            c->inter_lower_bound = 1;
    }
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        for (int k = 0; k < 3; k++)
            if (c->has_mode[m]) c->coll_s_per_param[m][k] = a->coll_s[m][k] / a->coll_params[m];
}

zpp_status zpp_cost_calibrate(const char *path, double latency_s, const zpp_cost_in *model,
                              zpp_cost_calib *out_p) {
    if (!path || !out_p || !(latency_s >= 0))
        return zpp_error(ZPP_ERR_INVALID, "calibrate: a NULL argument or a negative latency");
    if (model && !(model->params >= 1))
        return zpp_error(ZPP_ERR_INVALID, "calibrate: the model has no parameters");
    FILE *f;
    ZPP_CHECK(zpp_fopen_regular(path, "calibration", &f));
    zpp_cost_calib c;
    memset(&c, 0, sizeof c);
    calib_acc *a = calloc(1, sizeof *a);
    zpp_status st = a ? calib_read(f, path, latency_s, model, a, &c)
                      : zpp_error(ZPP_ERR_NOMEM, "calibrate: no memory");
    fclose(f);
    if (st == ZPP_OK && !c.intra_lines && !c.inter_lines && !c.coll_world && !a->ntrain)
        st = zpp_error(ZPP_ERR_FORMAT,
                       "calibrate: %s: %d lines, none to derive a rate from; it needs "
                       "`zeropp bench comm --json` lines or world-1 `zeropp train --metrics` "
                       "lines past step 1",
                       path, c.lines);
    if (st == ZPP_OK) st = calib_train_pace(a, path, model, &c);
    if (st == ZPP_OK && a->ntrain) st = calib_compute(a, path, model, &c);
    if (st == ZPP_OK) calib_rates(a, &c);
    free(a);
    if (st == ZPP_OK) *out_p = c;
    return st;
}
