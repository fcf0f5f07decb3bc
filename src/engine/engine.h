/* engine/engine.h — the ZeRO-3 engine: sharded state, just-in-time gathers
 * with prefetch, per-unit gradient reduction, sharded AdamW.
 *
 * One training step (DESIGN.md §2), for each micro-batch:
 *   forward   for each stage s: gather its unit (prefetching the next
 *             stage's unit while s computes) -> model forward -> release
 *   backward  for each stage s, in reverse: gather (hpZ: from the secondary
 *             shard inside the node; nothing when the model says the stage's
 *             backward reads no parameters) -> model backward into the unit's fp32
 *             full gradient -> after the unit's last backward stage, start
 *             its reduction (ZeRO-3 reduce-scatter or qgZ) and add the
 *             averaged shard into the fp32 shard gradient (a world of one
 *             rank reduces nothing: the backward adds straight into it)
 * then once per step:
 *   with qgZ, the all-reduce of the vectors' gradients (unless quantize_vectors),
 *   global gradient norm (all-reduce of shard sums of squares), clipping,
 *   AdamW on each rank's fp32 master shard (weight decay on the model's
 *   matrices), secondary shards invalidated.
 * No working-dtype copy of the shard is kept: a gather rounds the master
 * into its own block of the gathered buffer and gathers in place.
 *
 * The engine never touches tensor contents itself: memory, scratch and
 * vector work go through the rank's zpp_device (device.h), so the same code
 * drives the host and a GPU. */
#ifndef ZPP_ENGINE_ENGINE_H
#define ZPP_ENGINE_ENGINE_H

#include <stdint.h>

#include "collectives/collectives.h"
#include "comm/comm.h"
#include "engine/options.h"
#include "model/model.h"

typedef struct zpp_engine_opts {
    zpp_gather_mode gather;  /* forward (and non-hpZ backward) gathers */
    int hpz;                 /* backward gathers from secondary shards */
    zpp_reduce_mode reduce;  /* gradient reduction */
    zpp_dtype work_dtype;    /* dtype of gathered weights and reduced grads */
    float beta1, beta2, eps, weight_decay;
    /* 1: weight_decay on every parameter (DeepSpeed without parameter
     * groups); 0 (default): only on the model's matrices (model.h:
     * GPT-2's matrices, as llm.c and nanoGPT), every parameter for a model
     * that names none. */
    int decay_all;
    /* Max global norm; 0 = off. As torch.nn.utils.clip_grad_norm_, the
     * gradients are multiplied by grad_clip / (norm + 1e-6) when that is
     * below 1. */
    float grad_clip;
    /* A unit stays gathered after a stage when its next use, later in the
     * same pass or, over more than one rank, in the backward that follows
     * the forward, comes within this many parameters of other units
     * (DeepSpeed's stage3_max_reuse_distance, which reads the same order
     * from its trace); 0 releases it after every stage that is not followed
     * by its own unit. The forward's last unit always stays for the first
     * backward stage. */
    size_t max_reuse_distance;
    /* Units gathered ahead of the one in use (forward and backward), and
     * gradient reductions in flight, each in [1, ZPP_ENGINE_MAX_DEPTH];
     * default 2 and 2. Deeper costs a gathered unit (or a unit's reduction
     * buffers) of scratch per step of depth; the results are the same bits
     * at any depth. */
    int prefetch_depth, reduce_depth;
    uint64_t seed;           /* parameter initialisation */
    zpp_coll_opts coll;      /* quantization specs */
    /* Skipped steps. A step whose global gradient norm is not finite (NaN
     * or Inf on any rank, or the device's non-finite flag raised on any
     * rank) is skipped: no update, AdamW moments and bias-correction step
     * untouched, gradient accumulators zeroed, weights (and hpZ secondary
     * shards) unchanged. After max_consecutive_skips counted skips in a row
     * the step fails with ZPP_ERR_NONFINITE naming the steps (>= 1). */
    int max_consecutive_skips;
    /* Loss scaling (DeepSpeed's fp16 keys). loss_scale > 0: static scale;
     * 0: dynamic, starting at 2^initial_scale_power, halved on an overflow
     * (a skipped step) once `hysteresis` overflows have come (DeepSpeed's
     * DynamicLossScaler; consecutive_hysteresis: any good step restores the
     * hysteresis, else only a doubling does), never below min_loss_scale,
     * doubled after loss_scale_window steps without overflow. An overflow
     * skip counts towards max_consecutive_skips only when the scale is
     * static or already at min_loss_scale. Default: static 1 (no scaling). */
    float loss_scale;
    int initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis;
    float min_loss_scale;
    /* qgZ error feedback (LoCo; DeepSpeed's zero_optimization.zeropp_loco_param,
     * docs/quantization.md "Error feedback"): loco 1 keeps, per unit, the
     * quantization error of qgZ's intra-node and inter-node steps
     * (zpp_qgz_feedback) and feeds it into the next reduction of the unit;
     * err_beta in [0, 1] weighs the old error against the new; the buffers
     * are cleared after every step whose number is a multiple of
     * loco_reset_T (>= 1), and after a skipped step. Needs reduce QGZ.
     * Memory per rank: 4 * (padded + nodes * shard_len) bytes a unit, about
     * 4 (1 + 1/S) bytes a parameter (4 when one of nodes, S is 1). */
    int loco;
    float loco_err_beta;
    int loco_reset_T;
    /* Vectors (model.h: the elements outside the model's matrix ranges,
     * GPT-2's biases and LayerNorm parameters) under qwZ and qgZ. 0
     * (default): they travel at full precision, as DeepSpeed does (its qgZ
     * reduce-scatters 1-D gradients unquantized, and parameters under its
     * persistence threshold are never gathered, so never quantized):
     *   qwZ  every rank holds all the model's vectors in the working dtype,
     *        refreshed after each weight update by one all-reduce over the
     *        world (each rank adds its shards' vectors to zeros: the sum is
     *        exact); a gather through int8 quantizes zeros in their place
     *        (the int8 blocks are then scaled by the matrices alone) and
     *        gets its vectors from there;
     *   qgZ  the vectors' gradients are zeroed before quantizing (so they
     *        neither travel as int4 nor set the scale of a block of matrix
     *        gradients), summed over the step's micro-batches in fp32, and
     *        reduced by one fp32 all-reduce a step, averaged like the rest.
     * Per rank it costs (work dtype + 4) bytes a vector element; on the
     * wire, two all-reduces of the vectors a step (GPT-2: 13 C of 12 C^2 +
     * 13 C a block, 0.05% of GPT 1.31B's parameters). 1: vectors are
     * quantized with the matrices, in the same blocks. Nothing changes
     * without qwZ or qgZ, or for a model that names no matrix ranges. */
    int quantize_vectors;
    /* 1: time each step (zpp_engine_update_stats.profile). Costs two
     * timing events per wait for a collective, and a host wait for the
     * compute stream at the end of each optimizer step. Default 0. */
    int profile;
    /* World 1, plain gather, no hpZ: keep each unit in the working dtype
     * between steps (zeropp.h, zpp_engine_config.resident_weights). */
    int resident_weights;
    /* World 1, bf16, a model with set_grad_dtype: gradients accumulate in
     * bf16 (zeropp.h, zpp_engine_config.work_grads). */
    int work_grads;
} zpp_engine_opts;

/* The defaults of engine/options.h (AdamW GPT-2 style, bf16 working
 * dtype, max_consecutive_skips 5, static loss scale 1 with DeepSpeed's
 * dynamic defaults preset: 16, 1000, 2, min 1), ZeRO-3 baseline, the
 * collectives' default quantization specs. */
zpp_engine_opts zpp_engine_opts_default(void);
/* ZPP_ERR_INVALID, naming the option and its range, for an option outside
 * its range in the table (engine/options.h, where it applies), a working
 * dtype other than bf16, fp16 and fp32, or loco without the qgZ reduce.
 * zpp_engine_create_with_opts checks with it; so does zpp_engine_create, before its
 * ranks agree. */
zpp_status zpp_engine_opts_check(const zpp_engine_opts *opts);

/* Where this rank's step went (opts.profile), measured on the compute
 * stream (device.h, "Profiling") from the step's first forward to the end
 * of its optimizer step (the batch callbacks of later micro-batches
 * included). On a GPU, stream_ms is the compute stream's time and
 * exposed_comm_ms the part it stood waiting for a collective it could not
 * hide behind kernels; on the host backend both are the calling thread's
 * wall time, exposed_comm_ms its time inside collectives' completions
 * (waiting for MPI, and the dequantization or sums that follow it there). */
typedef struct zpp_engine_profile {
    int valid;              /* 1 when opts.profile, else every field is 0 */
    double stream_ms;       /* = compute_ms + exposed_comm_ms */
    double exposed_comm_ms;
    double compute_ms;      /* the rest: kernels, and gaps where the stream
                               waited for the host (launches, host reads) */
    int waits;              /* waits timed: on the host one per completed
                               collective, on a GPU one per event wait (a
                               qgZ reduction in slabs makes several) */
} zpp_engine_profile;

/* What one update reports (zpp_engine_update_with_stats): the bytes by
 * phase and the profile whole; the public zpp_update_stats is cut from it
 * (api/api.c). */
typedef struct zpp_engine_update_stats {
    float loss;            /* mean over the global batch */
    float grad_norm;       /* global norm before clipping */
    float lr;
    zpp_volume volume;     /* this step's bytes per node, by phase */
    int skipped;           /* 1: non-finite gradients, no update (see opts) */
    int skipped_total;     /* steps skipped since the engine was created */
    float loss_scale;      /* the scale this step's gradients carried */
    /* Sum of squares of every fp32 master weight after the step, over the
     * world: only when ZPP_PARAM_SUMSQ=1 (engine_create), else NAN. */
    double param_sumsq;
    zpp_engine_profile profile; /* opts.profile, else valid 0 */
} zpp_engine_update_stats;

typedef struct zpp_engine zpp_engine;

/* The engine keeps pointers to topo, model and dev; all three outlive it.
 * `dev` is the rank's compute backend (its memory kind must be the model's
 * and the communicators'). Collective over the world. */
zpp_status zpp_engine_create_with_opts(zpp_topo *topo, zpp_model *model,
                                       const zpp_engine_opts *opts, zpp_device *dev,
                                       zpp_engine **engine_p);
void zpp_engine_destroy(zpp_engine *e);

/* The step in pieces, as DeepSpeed's engine offers it (forward, backward,
 * step): after the caller sets a micro-batch on the model,
 *   zpp_engine_forward    gathers and runs every stage, returns the loss;
 *   zpp_engine_backward   runs the stages in reverse and reduces each unit's
 *                         gradient (scaled by loss_scale, e.g. 1/accum) into
 *                         the fp32 shard gradients;
 *   zpp_engine_update_with_stats
 *                         global norm, clipping, AdamW, and the new
 *                         working shards; the secondary shards go stale.
 * A backward needs the forward of the same micro-batch under the same
 * weights: calling it without one, or after an optimizer step, is
 * ZPP_ERR_STATE (with hpZ the stale secondary shard is refused too). */
zpp_status zpp_engine_forward(zpp_engine *e, float *loss_p);
zpp_status zpp_engine_backward(zpp_engine *e, float loss_scale);
/* `loss` (this rank's mean loss over the step's micro-batches) is averaged
 * over the world into stats_p->loss, in the same all-reduce as the norm.
 * The engine is the one reader of the device's non-finite flag: raised on
 * any rank since the last step (a quantizer met NaN or Inf), or a
 * non-finite gradient norm, skips the step on every rank (stats_p->skipped)
 * before any weight changes; the max_consecutive_skips-th counted skip in a
 * row fails it with ZPP_ERR_NONFINITE. The gradients are divided by the
 * current loss scale (folded into AdamW's grad_scale; clipping sees the
 * unscaled norm): with the pieces API, pass zpp_engine_loss_scale(e) times
 * the micro-batch weight to zpp_engine_backward.
 *
 * Test hook, only in a library built with -DZPP_FAULT_HOOKS=ON
 * (docs/fault-hooks.md): ZPP_FAULT=nonfinite@S (or @S-E), read once by
 * zpp_engine_create_with_opts, writes a NaN into rank 0's gradient accumulator before
 * the norm at 1-based step S (through E). A malformed value fails
 * zpp_engine_create_with_opts (core/fault.h). */
zpp_status zpp_engine_update_with_stats(zpp_engine *e, float lr, float loss,
                                        zpp_engine_update_stats *stats_p);
/* The loss scale the next backward should apply (1 unless configured). */
float zpp_engine_loss_scale(const zpp_engine *e);

/* Supplies micro-batch `micro` of a pass to the model via
 * model->ops->set_batch. */
typedef zpp_status (*zpp_engine_batch_fn)(void *ctx, int micro, zpp_model *model);

/* Mean loss of a forward pass on the batch `batch(ctx, 0, model)` sets,
 * averaged over the world. No gradients, no state change (the hpZ
 * secondary shards are left as they were; units a training forward left
 * gathered are dropped, and a backward must follow a new forward).
 *
 * The weights are gathered exactly, in the working dtype, whatever the
 * gather mode: with qwZ the loss is that of the model training holds (the
 * fp32 master rounded to the working dtype, what a checkpoint saves), not
 * of its int8 rendering, and equals ZeRO-3's on the same masters bit for
 * bit. An evaluation thus moves ZeRO-3's forward-gather bytes; they are
 * counted apart (zpp_engine_eval_volume) and never in a step's volume. */
zpp_status zpp_engine_evaluate_with_batch(zpp_engine *e, zpp_engine_batch_fn batch, void *ctx,
                                          float *loss_p);
/* Bytes the last zpp_engine_evaluate_with_batch moved (its gathers under
 * ZPP_PHASE_FWD_GATHER, the loss's all-reduce under ZPP_PHASE_OTHER); zero
 * before the first. */
const zpp_volume *zpp_engine_eval_volume(const zpp_engine *e);

/*
 * Checkpoint state. A checkpoint (train/checkpoint.h has the file format)
 * holds, per unit, the fp32 master weights and both AdamW moments of the
 * *unpadded* unit, and the optimizer step count, so that it does not depend
 * on the world size: each rank gives and takes the elements it owns, the
 * range [begin, begin + count) of the unit's numel elements, with
 * begin = rank * shard_len and count = min(shard_len, numel - begin) (0 for
 * a rank past the end of a tiny unit). The padding is never saved and
 * always restored to zero; the gradient accumulator is cleared and the hpZ
 * secondary shard marked invalid (the next gathers round the restored
 * master), so a resumed run continues bit for bit.
 */
/* zpp_engine_shard_range, zpp_engine_state_get and _set,
 * zpp_engine_unit_count, zpp_engine_steps_taken, the counters
 * (zpp_engine_counters, zpp_engine_counters_get and _set) and the
 * error-feedback state (zpp_engine_loco_lens, _get, _set, _clear) are
 * declared in zeropp.h, the API the trainer uses too. */

#endif
