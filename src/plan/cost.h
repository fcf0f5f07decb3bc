/* plan/cost.h — a cost model of one training step: communication time,
 * compute time, their overlap as the engine schedules it, and memory per
 * rank, for each collective mode (ZeRO-3, qwZ, hpZ, qgZ, ZeRO++).
 *
 * It sits above collectives/, engine/ and model/ because it describes all
 * three (DESIGN.md §3 and §11): the bytes come from collectives/volume.c
 * (zpp_plan_gather / zpp_plan_gather_secondary / zpp_plan_reduce, the same
 * replay `zeropp plan` prints and the live collectives are checked against,
 * so predicted bytes are counted bytes); the overlap follows engine.c's
 * forward/backward; the activation memory follows the CUDA GPT-2's arena
 * (gpt2_cuda.cu, plan()). It calls none of them at run time except the
 * volume replay: everything here is arithmetic on numbers, no device, no
 * communicator. The formulas are written out in DESIGN.md §11. */
#ifndef ZPP_PLAN_COST_H
#define ZPP_PLAN_COST_H

#include <stddef.h>

#include "collectives/collectives.h"
#include "zeropp.h"

/* What the step runs on and what it trains. */
typedef struct zpp_cost_in {
    /* Model: params > 0 always. With a GPT shape (n_layer > 0) attention
     * FLOPs and activation memory are counted; without one they are 0 and
     * mem_acts_known says so. */
    double params;
    int n_layer, n_embd, seq_len, vocab, n_head; /* n_head 0: n_embd / 64 */
    /* The family of that shape: 0 = GPT-2 (the fields above say it all),
     * 1 = Llama (ZPP_COST_LLAMA), with its knobs resolved as
     * zpp_llama_config_of_shape resolves them (n_head > 0, n_kv_head a
     * divisor of it, n_ffn > 0): grouped-query k and v, a SwiGLU MLP n_ffn
     * wide, an untied head, q/k/v and o biases when set. Ignored for GPT-2. */
    int family;
    int n_kv_head, n_ffn, untied_head, qkv_bias, o_bias;
    int units;                                   /* equal units (zpp_plan_step's split) */
    /* Machine. */
    int world, node_size;
    double tokens_per_gpu;  /* tokens per rank per step (micro-batch x seq_len) */
    double inter_bps;       /* bytes/s one NODE moves across nodes (all its NICs, achieved) */
    double intra_bps;       /* bytes/s one RANK moves inside its node (achieved) */
    double latency_s;       /* per step of a collective's algorithm (ring or pairwise) */
    double flops_per_s;     /* achieved FLOP/s of one GPU on this model's kernels */
    zpp_dtype dtype;        /* working dtype (bf16 / fp16: 2 bytes) */
    zpp_coll_opts coll;     /* quantization specs and qgZ slabs, as the collectives use */
    /* Schedule of qgZ's cross-node step with more than one rank per node:
     * 1 = as engine.c + collectives.c run it today (qgz_finish starts
     * the inter-node exchange behind the next stage's kernels and waits for
     * it: exposed); 0 = pipelined under the next stage like the other
     * reductions (DeepSpeed's schedule; DESIGN.md §3 describes the fix). */
    int qgz_inter_exposed;
    /* hpZ's secondary partition: ranks that share one secondary copy, a
     * divisor of node_size; 0 = the node (the only size the trainer runs
     * today, trainer.c). Smaller: more memory (2P/H per rank), a shorter
     * intra-node ring. Ignored by modes without hpZ. */
    int hpz_size;
    /* ---- How this machine runs a step (all 0 = one GPU per rank, NCCL on
     * a real network: the defaults above). DESIGN.md §11, "Schedules". */
    /* Ranks time-sharing one compute device: each rank computes at
     * flops_per_s / ranks_per_device (0 or 1: a device of its own). Two
     * ranks on one GPU (the GPU time-slices between the processes'
     * contexts); on CPU ranks with single-threaded BLAS a "device" is a
     * core, so 4 ranks on 2 cores is 2. */
    double ranks_per_device;
    /* 1: compute and communication take turns, nothing hides under a
     * kernel. CPU ranks: MPI's nonblocking collectives progress only while
     * the rank is inside an MPI call (zpp_comm waits), not while it
     * computes. Ranks sharing one GPU: one rank's kernels stall the other
     * rank's NCCL kernels, which the collective then waits for. */
    int serial;
    /* Between the two: the share of the shorter of a stage's compute and
     * its communication that stays exposed, in [0, 1] (serial is 1):
     * stage = max(c, l) + exposed_frac x min(c, l). 0: perfect overlap. */
    double exposed_frac;
    /* 1: each communicator has the link's full rate, so a gather and a
     * reduction in flight together (on their own communicators) do not
     * share it: emulated nodes over sockets, where every NCCL communicator
     * opens its own connections. 0: they share the link (a real NIC). */
    int link_per_comm;
    /* The optimizer step and the per-step engine work (gradient norm,
     * conversions, zeroing), seconds per parameter of the rank's shard at
     * a device of its own (scaled by ranks_per_device like compute). */
    double opt_s_per_param;
    /* Measured collective times (zpp_cost_calibrate) for modes measured on
     * this world and node size: used instead of the link formula. NULL:
     * none. Not owned. */
    const struct zpp_cost_calib *calib;
    /* The engine's depths (engine.h: units gathered ahead, reductions in
     * flight; both 2 by default): they set the transient memory. */
    int prefetch_depth, reduce_depth;
    /* DeepSpeed's reuse rule across the forward->backward boundary, as
     * engine.c applies it (zero_optimization.stage3_max_reuse_distance, in
     * parameters; 1e9 by default, DeepSpeed's and the engine's): after its
     * forward stage a unit stays gathered for its backward when no more
     * than this many parameters of other units are used in between. Those
     * units make no backward gather (no bytes, no link time) and are held
     * at the boundary (mem_kept). Only at world > 1, as the engine. 0: no
     * unit stays, every unit is gathered again in the backward (the model
     * before the rule; `zeropp bench comm`'s step). zpp_cost_kept_units. */
    double reuse_distance;
    /* Device memory rate for the memory-bound kernels of the collectives
     * (bytes/s achieved): qwZ's quantize and dequantize, qgZ's three fused
     * steps, hpZ's secondary copy; zpp_cost_kernel_bytes counts their bytes.
     * 0: not priced (a calibrated mode's measured times already hold them).
     * `zeropp plan` sets it from the --gpu preset's HBM x 0.78 (DESIGN.md
     * §11, "Kernels"). */
    double hbm_bps;
    /* 1: activation checkpointing (Megatron's --checkpoint-activations, as
     * the published ZeRO++ runs): the backward recomputes each unit's
     * forward, so its compute is 3/3 of the model FLOPs instead of 2/3 (the
     * step's 4/3). flops_per_gpu and tflops_per_gpu stay the model's 6 P
     * count (Megatron's "TFLOPs" count the recompute: 4/3 of ours). */
    int recompute;
    /* ZPP_KEEP_* bits (model/family.h): the model keeps its LayerNorm
     * outputs (2 C values in E a token and layer), its GELU output (4 C)
     * or both (the CUDA GPT-2's keep_acts, zpp_decoder_shape), and no
     * one-layer scratch for them; no effect with recompute. */
    int keep_acts;
    /* 1: the engine's resident weights (zeropp.h, resident_weights; the
     * trainer's default): at world 1 with the plain gather and no hpZ the
     * whole model stays in the working dtype between steps (mem_kept) and
     * no unit is gathered into scratch; in bf16 that copy is the master's
     * high half, so mem_shard_state holds 2 bytes a parameter less. 0: as
     * without them. */
    int resident_weights;
    /* 1: the engine's bf16 gradient accumulators (zeropp.h, work_grads;
     * the trainer's default with one micro-batch a step), where they
     * apply: world 1, dtype bf16. mem_shard_state is then 14 bytes a
     * parameter (the accumulator 2) instead of 16. 0: fp32 accumulators. */
    int work_grads;
} zpp_cost_in;

typedef struct zpp_cost_out {
    double step_s, fwd_s, bwd_s;   /* predicted times */
    double compute_s;              /* FLOPs / rate + opt_s, whole step */
    double opt_s;                  /* the optimizer step (part of compute_s) */
    double exposed_comm_s;         /* step_s - compute_s */
    double comm_s;                 /* every collective back to back, nothing hidden */
    double quant_s;                /* the collectives' memory-bound kernels (part of comm_s) */
    double tokens_per_s;           /* whole job: world x tokens_per_gpu / step_s */
    double tflops_per_gpu;         /* model FLOPs per GPU / step_s / 1e12 */
    double flops_per_gpu;          /* per step */
    double cross_node_bytes;       /* per node per step (== zpp_cost_volume) */
    double intra_node_bytes;       /* per node per step (== zpp_cost_volume) */
    int kept_units;                /* units not gathered again in the backward (reuse rule) */
    /* Memory per rank at the backward's peak, bytes. */
    double mem_bytes_per_rank;     /* the sum of the five below */
    double mem_shard_state;        /* fp32 master, Adam m, v, the grad accumulator */
    double mem_secondary;          /* hpZ secondary shards of every unit */
    double mem_transient;          /* gathered units, full gradient, reduction buffer */
    double mem_kept;               /* kept units held at the boundary beyond the current one */
    double mem_acts;               /* activations (the CUDA model), 0 without a shape */
    int mem_acts_known;
} zpp_cost_out;

/* Defaults: bf16, 8 units, default quantization, latency 0, schedule as
 * implemented (qgz_inter_exposed = 1), reuse distance 1e9. The caller fills
 * the rest. */
zpp_cost_in zpp_cost_in_default(void);

/* GPT-2 parameter count of a shape (DESIGN: gpt2.h units), tied head:
 * V*C + T*C + 2C + L*(12C^2 + 13C). */
double zpp_cost_gpt_params(int n_layer, int n_embd, int seq_len, int vocab);

/* The families zpp_cost_in.family names. */
#define ZPP_COST_GPT2 0
#define ZPP_COST_LLAMA 1

/* Llama parameter count of in's shape (family ZPP_COST_LLAMA; llama.h's
 * units), with C = n_embd, hd = C / n_head, Ck = n_kv_head x hd (the width
 * of k and of v), F = n_ffn, V = vocab, L = n_layer:
 *     V C (embedding) + C (final norm) + [untied] V C (head)
 *   + L (2C (two norms) + C (C + 2 Ck) (q, k, v) + [qkv_bias] (C + 2 Ck)
 *        + C^2 (o) + [o_bias] C + 3 C F (gate, up, down)).
 * No position table (RoPE has no parameters). 0 for a shape without
 * n_layer, n_embd, n_head, n_kv_head, n_ffn or vocab. */
double zpp_cost_llama_params(const zpp_cost_in *in);

/* The parameters of in's shape, whichever its family (GPT-2:
 * zpp_cost_gpt_params; Llama: zpp_cost_llama_params); 0 without a shape. */
double zpp_cost_shape_params(const zpp_cost_in *in);

/* Model FLOPs of one token, forward and backward, of a GPT with `params`
 * parameters, n_layer blocks n_embd wide and sequences of seq_len tokens:
 *     6 params + 12 n_layer n_embd seq_len
 * (cost.c derives it). The parameter term is every weight's matrix product
 * (the tied head's too: wte is used twice, counted once as the head's
 * product, as nanoGPT and PaLM count); the attention term is the two T x T
 * products, which have no parameters. n_layer <= 0: the parameter term
 * alone (a model without a GPT shape). What MFU and `zeropp train`'s
 * TFLOP/s are computed from (docs/logs.md). */
double zpp_cost_flops_per_token(double params, int n_layer, int n_embd, int seq_len);

/* FLOPs of one step per GPU: tokens_per_gpu x zpp_cost_flops_per_token,
 * the count of ../shared/bench/fsdp_gpt.py (forward 1/3, backward 2/3). */
double zpp_cost_step_flops(const zpp_cost_in *in);

/* ---- GPU presets (`zeropp plan --gpu`, `zeropp train`'s MFU) -------------
 *
 * Datasheet figures of the SXM parts, per GPU: dense (no sparsity) peaks.
 * `tensor_tflops` is the fp16/bf16 tensor-core peak (what a bf16 or fp16
 * run's GEMMs use); `fp32_tflops` the plain fp32 FMA peak, not TF32: the
 * CUDA GPT-2 computes fp32 without TF32 (gpt2_cuda.cu, PRECISION), so an
 * fp32 run's ceiling is the CUDA cores'. PCIe and NVL parts have lower
 * clocks: give their peak by hand (--peak-tflops). */
typedef struct zpp_cost_gpu {
    const char *name;      /* the --gpu name: "v100", "a100", "h100", "h200" */
    const char *match;     /* found in the CUDA device name: "V100", "A100", ... */
    double tensor_tflops;  /* dense fp16 / bf16 tensor cores */
    double fp32_tflops;    /* fp32 FMA on the CUDA cores (no TF32) */
    double nvlink_gbps;    /* NVLink per GPU per direction, Gb/s */
    double mem_gib;        /* memory: the datasheet's GB, read as GiB */
    double hbm_gbs;        /* memory bandwidth, datasheet GB/s */
} zpp_cost_gpu;

/* The presets in a fixed order (v100, a100, h100, h200), *n_p of them. */
const zpp_cost_gpu *zpp_cost_gpus(int *n_p);
/* The preset of --gpu NAME (exact), or NULL. */
const zpp_cost_gpu *zpp_cost_gpu_by_name(const char *name);
/* The preset whose `match` the device name contains ("NVIDIA H200" ->
 * h200), or NULL (the host, an unknown GPU, NULL). */
const zpp_cost_gpu *zpp_cost_gpu_for_device(const char *device_name);
/* The peak FLOP/s (TFLOP/s) of a preset for a run in working dtype `wd`:
 * tensor_tflops for bf16 and fp16, fp32_tflops for fp32. */
double zpp_cost_gpu_peak_tflops(const zpp_cost_gpu *g, zpp_dtype wd);

/* Activation bytes of the CUDA GPT-2 for `tokens` tokens of one rank, bf16
 * or fp16 working dtype, fused attention (gpt2_cuda.cu plan()); with
 * in->recompute, its checkpointed layout (every layer's residual input and
 * one layer's slab of the rest). */
double zpp_cost_gpt_act_bytes(const zpp_cost_in *in, double tokens);

/* Activation bytes of the CUDA Llama for `tokens` tokens of one rank
 * (llama_cuda.cu plan(): every buffer of its arena, the batch's integers
 * and the cuBLASLt workspace), in in->dtype, with the attention path the
 * model picks when ZPP_ATTENTION is unset (fused for bf16 with a head dim
 * of 64 or 128, else the GEMM path and its T x T matrices); with
 * in->recompute its checkpointed layout (every layer's residual input, one
 * layer's slab of the rest). 0 without a shape. */
double zpp_cost_llama_act_bytes(const zpp_cost_in *in, double tokens);

/* The activation bytes of in's family (the two above); what
 * mem_acts holds. */
double zpp_cost_act_bytes(const zpp_cost_in *in, double tokens);

/* How many units stay gathered from the forward into the backward under
 * in->reuse_distance, on the planner's split (units 0..U-1 of
 * zpp_plan_unit_numel, stage i using unit i, every backward stage reading
 * its unit): unit i's next use after its forward stage is its backward
 * stage, with units i+1..U-1 each used twice in between (forward, then
 * backward), so it stays when 2 x their parameters <= the distance; the
 * last unit (nothing in between) always stays, as the engine keeps the
 * forward's last unit. The kept units are thus the last n. 0 at world 1
 * or distance 0. */
int zpp_cost_kept_units(const zpp_cost_in *in);

/* The bytes of one step in `mode` (hpZ over the whole node): zpp_plan_step's
 * replay less the backward gathers of the zpp_cost_kept_units units, which
 * is what zpp_cost_step prices. ZPP_ERR_INVALID as zpp_plan_step, or for a
 * negative reuse distance. */
zpp_status zpp_cost_volume(const zpp_cost_in *in, const zpp_coll_mode *mode, zpp_volume *v_p);

/* Bytes the memory-bound kernels of one collective read and write in HBM,
 * per rank, for a unit of `numel` elements in `mode` at `phase` (DESIGN.md
 * §11, "Kernels"; s = the unit's shard, n = W s its padded size, e the
 * dtype's bytes, q8/q4 zpp_quant_bytes of the weight/gradient specs):
 *   forward gather, qwZ: quantize the shard (s e + q8(s)), dequantize the W
 *     chunks (W q8(s) + n e); hpZ: copy the secondary slice (2 e n / H);
 *   backward gather, qwZ without hpZ: as the forward's qwZ; else 0;
 *   reduction, qgZ: reorder-quantize (n e + W q4(s)); with S > 1 and N > 1
 *     dequantize-sum-requantize (W q4(s) + N q4(s)); dequantize-reduce
 *     into the fp32 shard (N q4(s) + 4 s, or W q4(s) + 4 s in one hop);
 *   ZeRO-3's NCCL all-gather and reduce-scatter: 0 (inside the collective).
 * 0 at world 1 (no collective runs). */
double zpp_cost_kernel_bytes(const zpp_cost_in *in, const zpp_coll_mode *mode, size_t numel,
                             zpp_phase phase);

/* The cost of one step in `mode`. ZPP_ERR_INVALID (with a message) for an
 * impossible input: no world, node size not dividing it, non-positive
 * bandwidth or FLOP/s, no tokens. out_p is set only on success. */
zpp_status zpp_cost_step(const zpp_cost_in *in, const zpp_coll_mode *mode,
                         zpp_cost_out *out_p);

/* ---- Picking a setting (`zeropp plan --pick`) ---------------------------
 *
 * Candidates: every mode; for hpZ modes every partition size H > 1 that
 * divides node_size (none when node_size is 1: hpZ then has nothing to keep
 * inside the node); with a GPT shape every micro-batch 1, 2, 4, ... up to
 * max_micro_batch (tokens_per_gpu = b x seq_len), without one the given
 * tokens_per_gpu only. A candidate fits when mem_bytes_per_rank <=
 * mem_budget. The pick is the fitting candidate with the most tokens/s (the
 * criterion that stays fair when the micro-batch varies); ties go to the
 * earlier candidate in the order micro-batch, mode, H (all ascending). */
typedef struct zpp_cost_choice {
    int mode;               /* index for zpp_coll_mode_get */
    int hpz_size;           /* 0 without hpZ */
    int micro_batch;        /* 0 without a GPT shape (tokens fixed) */
    zpp_cost_out out;
} zpp_cost_choice;

typedef struct zpp_cost_pick_result {
    zpp_cost_choice best;
    zpp_cost_choice runner_up;   /* the fastest fitting candidate of another mode */
    int has_runner_up;
    zpp_cost_choice zero3;       /* the fastest fitting ZeRO-3, for the ratio */
    int has_zero3;
    /* Why the micro-batch stopped at best's: best's mode and H at the next
     * micro-batch (2 x best) need next_mem_bytes; next_fits says whether that
     * fits at all (then it was slower or past max_micro_batch). 0 without a
     * GPT shape. */
    int next_micro_batch, next_fits;
    double next_mem_bytes;
    int candidates, fitting;     /* how many were priced, how many fit */
} zpp_cost_pick_result;

/* Searches as above from `in` (its tokens_per_gpu is used only without a
 * GPT shape, its hpz_size is ignored). max_micro_batch <= 0: up to 65536.
 * ZPP_ERR_CONFIG with a message naming the smallest footprint when nothing
 * fits; zpp_cost_step's errors for an impossible input. */
zpp_status zpp_cost_pick(const zpp_cost_in *in, double mem_budget, int max_micro_batch,
                         zpp_cost_pick_result *out_p);

/* The candidates a pick may choose from (`zeropp plan --pick --modes ...
 * --micro-batches ... --hpz-sizes ...`): to pick among the settings one has
 * measured, or the ones the trainer runs. Zero / NULL fields do not restrict. */
typedef struct zpp_cost_pick_filter {
    unsigned modes;            /* bit m: mode m (zpp_coll_mode_get) allowed; 0 = all */
    const int *micro_batches;  /* with a GPT shape: these, ascending, > 0; NULL: 1, 2, 4, ... */
    int n_micro_batches;
    const int *hpz_sizes;      /* hpZ partition sizes allowed (each must divide the node) */
    int n_hpz_sizes;
} zpp_cost_pick_filter;

/* zpp_cost_pick over the candidates `filter` allows (NULL: all). With a
 * micro-batch list, max_micro_batch is ignored, the search does not stop
 * where nothing fits (the list may skip), and next_micro_batch is the next
 * entry after the best's (0 at the end of the list). ZPP_ERR_INVALID for a
 * list not ascending or an hpZ size not dividing the node. */
zpp_status zpp_cost_pick_only(const zpp_cost_in *in, double mem_budget, int max_micro_batch,
                              const zpp_cost_pick_filter *filter,
                              zpp_cost_pick_result *out_p);

/* ---- Calibrating (`zeropp plan --calibrate FILE`) ------------------------
 *
 * One file of JSON lines, of two kinds.
 *
 * `zeropp bench comm --json` lines (one per mode): two things.
 * (a) Link rates that make the model's collective formula reproduce the
 *   measured times, phase by phase (a phase's time is the sum over its
 *   units' calls):
 *   intra_bps: hpZ's backward gather (modes hpz, zeropp) moves only
 *     intra-node bytes: intra / S / (t - U (S-1) latency);
 *   inter_bps: ZeRO-3's forward and backward gathers:
 *     cross / (t - U (W-1) latency). When that time is no more than the
 *     intra-node term, the cross-node link was not the bottleneck and the
 *     rate is only a lower bound (inter_lower_bound).
 *   Pooled over lines: total bytes / total time. Latency is the caller's
 *   (one message size per run cannot separate it from bandwidth).
 * (b) Each measured mode's phase times as they are, per parameter of the
 *   line's model (coll_s_per_param): zpp_cost_step uses them in place of
 *   the link formula for that mode when the world and node size are the
 *   line's. They hold what the formula leaves out on this machine: the
 *   quantization kernels, MPI's reduction arithmetic on the host, the
 *   library's per-call costs. All lines must share one world and node size.
 *
 * `zeropp train --metrics` lines of the model in `model`: the compute rate.
 * Either world-1 runs (no bytes moved; the time is compute_ms when the run
 * had --profile, else step_ms), or runs on the model's ranks (bytes moved:
 * model->world ranks in nodes of model->node_size): the time is then
 * compute_ms when the run had --profile (the collectives overlap the
 * compute on GPU ranks, so the step can be shorter than they are), else the
 * wall step less that mode's measured collectives (its bench comm line must
 * be in the file; per parameter moved, the backward gather's only for the
 * units the run gathered again under model->reuse_distance, which must be
 * the distance it trained with), the pace at which the group computes,
 * holding the ranks' sharing of the cores and each wait for the slowest rank (so leave
 * ranks_per_device at 1). One kind per file. Each line's tokens a rank are
 * tokens_per_s x step_ms / 1000 / W; step 1 (warm-up) and skipped steps are
 * left out. With one token count, flops_per_s = its FLOPs / its median time
 * (the optimizer folded in, opt_s_per_param 0); with two or more, a least-
 * squares line through the median time of each token count,
 *     t = tokens x FLOPs_per_token / flops_per_s + (P / W) x opt_s_per_param,
 * separates the compute from the optimizer step and the per-step engine
 * work, counted per element of the rank's shard. */
typedef struct zpp_cost_calib {
    double intra_bps, inter_bps; /* 0: no line to derive it from */
    int inter_lower_bound;
    int lines, intra_lines, inter_lines; /* JSON lines read, used for each */
    /* (b): mode index x phase (fwd gather, bwd gather, grad reduce). */
    int coll_world, coll_node_size, coll_units; /* 0: no bench comm line */
    int has_mode[ZPP_COLL_MODE_COUNT];
    double coll_s_per_param[ZPP_COLL_MODE_COUNT][3];
    /* Compute: 0 without train lines. */
    double flops_per_s, opt_s_per_param;
    int train_lines, train_points; /* lines used, distinct token counts */
    int train_world; /* 1: world-1 lines; else runs on the model's world */
} zpp_cost_calib;

/* ZPP_ERR_IO if the file cannot be read; ZPP_ERR_FORMAT naming the path and
 * line for a line that is neither kind, a missing or non-numeric field, a
 * time no longer than the latency alone, bench lines of different shapes,
 * a train line that moved bytes without a measured mode or its bench line,
 * train lines of both kinds, train lines without a model
 * (`model` NULL), step times that do not grow with the tokens, or a file
 * with nothing to derive. out_p is set only on success. */
zpp_status zpp_cost_calibrate(const char *path, double latency_s, const zpp_cost_in *model,
                              zpp_cost_calib *out_p);

/* The index (for zpp_coll_mode_get) of the standard mode equal to `mode`,
 * or -1 for another combination (e.g. qwZ + qgZ without hpZ). */
int zpp_cost_mode_index(const zpp_coll_mode *mode);

#endif
