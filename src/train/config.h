/* train/config.h — the trainer's configuration: a DeepSpeed-style JSON file.
 *
 * Keys carry DeepSpeed's names wherever DeepSpeed has one, so a DeepSpeed
 * user's ds_config.json carries over; what DeepSpeed has no key for lives in
 * a "zeropp" object (DeepSpeed ignores unknown top-level objects, so one
 * file can serve both) plus the top-level "model" object. Every key is
 * optional; a missing key keeps its current value (zpp_train_config_defaults
 * first, then each loaded file/string on top).
 *
 * KEYS: each key's path, type, default, range and meaning are one line of
 * the table in train/config_keys.h, which drives the parser, the defaults
 * and the reference docs/config.md (`zeropp train --list-config-keys`).
 * DeepSpeed engine tuning knobs that do not change the mathematics
 * (wall_clock_breakdown, fp16.auto_cast, zero_optimization's bucket
 * sizes, ...) are accepted and ignored, listed in cfg->ignored so the tool
 * can say so. Any other key is an error.
 *
 * RANGES checked across keys (zpp_train_config_validate): lr > 0; betas in
 * [0, 1); eps > 0; weight_decay >= 0; gradient_clipping >= 0; n_embd %
 * n_head == 0; model.real_vocab_size <= model.vocab_size;
 * WarmupLR/WarmupDecayLR: warmup_max_lr > 0, warmup_min_lr in
 * [0, warmup_max_lr]; WarmupCosineLR: warmup_min_ratio and cos_min_ratio in
 * [0, 1]; WarmupDecayLR/WarmupCosineLR: total_num_steps (N) > W when given.
 *
 * LEARNING RATE at 0-based optimizer step s (s = 0 is the first update;
 * W = warmup_num_steps, N = total_num_steps or zeropp.train_steps if 0):
 *   warm-up fraction  g(s) = s / W (linear) or ln(s + 1) / ln(max(W, 2)) (log),
 *                     for s < W; g = 1 from s = W on.
 *   (none)          lr(s) = optimizer lr
 *   WarmupLR        lr(s) = min_lr + (max_lr - min_lr) * g(s); constant max_lr after W
 *   WarmupDecayLR   as WarmupLR for s < W, then max_lr * max(0, (N - s) / (N - W))
 *   WarmupCosineLR  lr(s) = lr * r(s) with, for s < W,
 *                        r = warmup_min_ratio + (1 - warmup_min_ratio) * g(s)
 *                   and for s >= W, with p = min(1, (s - W) / (N - W)),
 *                        r = cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi p)) / 2
 *                   i.e. linear/log warm-up to lr, half a cosine down to
 *                   lr * cos_min_ratio at s = N, flat after it.
 * As in DeepSpeed, WarmupLR/WarmupDecayLR set the lr themselves (the
 * optimizer's lr is not used) and WarmupCosineLR scales the optimizer's lr.
 * (DeepSpeed's cosine phase is offset by one step and rises again past N;
 * ours is clamped at the floor.)
 * SKIPPED STEPS (non-finite gradients, fp16 overflows) still advance s:
 * the schedule, like the data order, is a function of the step index, so a
 * resume needs no skip count. DeepSpeed instead does not step its scheduler
 * on an fp16 overflow, shifting its schedule by the number of skipped steps.
 *
 * STATUS CODES: ZPP_ERR_IO (file cannot be read: path + strerror),
 * ZPP_ERR_FORMAT (malformed JSON: file, line:column), ZPP_ERR_CONFIG
 * (unknown key, wrong type, value out of range, inconsistent batch sizes:
 * the message names the key by its dotted path), ZPP_ERR_UNSUPPORTED (valid
 * DeepSpeed settings zeropp does not implement: stage != 3, an
 * optimizer other than AdamW, an unknown scheduler type). */
#ifndef ZPP_TRAIN_CONFIG_H
#define ZPP_TRAIN_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "model/gpt2.h"
#include "train/hf_config.h"
#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zpp_sched_type {
    ZPP_SCHED_NONE = 0,          /* constant optimizer lr */
    ZPP_SCHED_WARMUP_LR = 1,     /* DeepSpeed "WarmupLR" */
    ZPP_SCHED_WARMUP_DECAY_LR = 2, /* DeepSpeed "WarmupDecayLR" */
    ZPP_SCHED_WARMUP_COSINE_LR = 3 /* DeepSpeed "WarmupCosineLR" */
} zpp_sched_type;

typedef enum zpp_warmup_type { ZPP_WARMUP_LOG = 0, ZPP_WARMUP_LINEAR = 1 } zpp_warmup_type;

/* The order of the training batches (train/data.h): a keyed permutation of
 * windows, or the split read front to back as llm.c's DataLoader reads it. */
typedef enum zpp_data_order {
    ZPP_DATA_ORDER_SHUFFLED = 0,
    ZPP_DATA_ORDER_SEQUENTIAL = 1
} zpp_data_order;

/* model.family: the decoder the run trains (model/family.h's names). */
typedef enum zpp_model_family_id { ZPP_FAMILY_GPT2 = 0, ZPP_FAMILY_LLAMA = 1 } zpp_model_family_id;

#define ZPP_TRAIN_DEFAULT_MICRO_BATCH 8 /* when no batch key is given at all */
#define ZPP_TRAIN_IGNORED_CAP 512

typedef struct zpp_train_config {
    /* ---- batch (0 = not given; zpp_train_config_resolve fills all three) */
    int train_batch_size;               /* sequences per optimizer step, all ranks */
    int train_micro_batch_size_per_gpu; /* B: sequences per rank per micro-step */
    int gradient_accumulation_steps;    /* micro-steps per optimizer step */

    /* ---- optimizer: AdamW (decoupled weight decay) */
    struct {
        double lr, beta1, beta2, eps, weight_decay;
    } optimizer;

    /* ---- learning-rate schedule (see the table above) */
    struct {
        zpp_sched_type type;
        zpp_warmup_type warmup_type;
        int warmup_num_steps;
        int total_num_steps; /* 0: use train_steps */
        double warmup_min_lr, warmup_max_lr;       /* WarmupLR, WarmupDecayLR */
        double warmup_min_ratio, cos_min_ratio;    /* WarmupCosineLR */
    } scheduler;

    double gradient_clipping; /* max global grad L2 norm; 0 = off */
    int bf16;                 /* 1: bf16 working params; 0: fp32 */
    struct {                  /* DeepSpeed's fp16 block */
        int enabled;          /* 1: fp16 working params (not with bf16) */
        double loss_scale;    /* 0: dynamic; > 0: static */
        int initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis;
        double min_loss_scale;
    } fp16;

    /* ---- ZeRO: always stage 3, with the ZeRO++ options */
    struct {
        int stage;                /* always 3 after a successful load */
        int quantized_weights;    /* qwZ */
        int hpz_partition_size;   /* hpZ node size; 1 = off */
        int quantized_gradients;  /* qgZ */
        long long max_reuse_distance; /* stage3_max_reuse_distance, parameters */
        int prefetch_depth;           /* zeropp_prefetch_depth: units ahead */
        int reduce_depth;             /* zeropp_reduce_depth: reductions in flight */
        int loco;                     /* zeropp_loco_param given: qgZ error feedback */
        double loco_err_beta;         /* its err_beta, in [0, 1] */
        int loco_reset_T;             /* its reset_T, >= 1 */
        int quantize_vectors;         /* zeropp_quantize_vectors (engine.h) */
        int resident_weights;         /* zeropp_resident_weights (zeropp.h) */
        int work_grads;               /* zeropp_work_grads (zeropp.h) */
        int grad_stochastic;          /* zeropp_grad_stochastic_rounding: qgZ's 4 bits */
        int grad_e2m1;                /* zeropp_grad_e2m1: E2M1 (1) or int4 (0) */
    } zero;

    zpp_gpt2_config model; /* n_layer, n_head, n_embd, seq_len, vocab_size, real_vocab_size */
    zpp_model_family_id model_family;
    /* The shape's fields `model` has no room for (Llama's: n_kv_head, n_ffn,
     * rope_*, norm_eps, untied_head, qkv_bias; 0 = the family's default);
     * the rest of it is `model`'s and stays 0 here. */
    zpp_decoder_shape model_ext;
    /* model.hf_architecture: the name a Hugging Face export gives the llama
     * (set from config.json by --init-from, kept in the checkpoint) */
    zpp_hf_arch hf_architecture;
    int hf_sliding_window; /* model.hf_sliding_window: its sliding_window, 0 = null */

    /* ---- zeropp extensions */
    int train_steps;
    uint64_t seed;
    int eval_every;      /* 0 = never */
    int eval_batches;
    int sample_every;    /* rank 0 prints a sample every N steps; 0 = never */
    int sample_tokens;   /* new tokens per sample */
    int steps_per_print; /* DeepSpeed key; 0 = never */
    int max_consecutive_skips; /* non-finite steps in a row before the run stops */
    int keep_checkpoints; /* --save keeps the newest N step folders */
    int prune_newer;      /* 1: a save deletes step folders newer than itself */
    zpp_data_order data_order; /* zeropp.data_order, --data-order */
    int weight_decay_all; /* 1: decay every parameter (DeepSpeed); 0: the matrices */
    /* 1: the model's activation checkpointing (zpp_gpt2_config.recompute);
     * not part of `model`, the shape a checkpoint or an llm.c file gives */
    int activation_checkpointing;
    int keep_activations; /* zpp_decoder_shape.keep_acts: ZPP_KEEP_* bits */
    double collective_timeout_s; /* deadline of every wait on a peer; 0 = forever */
    double save_timeout_s; /* deadline of a checkpoint's writes on every rank; 0 = forever */
    double peak_tflops; /* one rank's device peak for MFU; 0 = its preset, if known */

    /* DeepSpeed keys accepted but ignored, as "a, b.c" ("" if none). */
    char ignored[ZPP_TRAIN_IGNORED_CAP];
} zpp_train_config;

/* The generic shape of the config's model (model/family.h): `model`'s
 * fields and model_ext's (zero for GPT-2: the config refuses Llama keys
 * there), and how the model keeps its activations
 * (activation_checkpointing). One place for the trainer, the sampler, the
 * planner and the C API. */
zpp_decoder_shape zpp_train_config_shape(const zpp_train_config *c);

/* Fills *cfg with the defaults of the table above (a small GPT that trains
 * on a CPU in a demo). Batch sizes are left 0 (= derive). */
zpp_status zpp_train_config_defaults(zpp_train_config *cfg);

/* Parses a JSON file and applies it over the current values of *cfg, then
 * validates the result. On any error *cfg is left untouched. */
zpp_status zpp_train_config_load_file(const char *path, zpp_train_config *cfg);

/* The same for a JSON text (messages name the source "<string>"). */
zpp_status zpp_train_config_load_string(const char *json, zpp_train_config *cfg);

/* Checks every value range (model shape, optimizer, schedule, ZeRO);
 * independent of the world size. Called by the loaders. ZPP_ERR_CONFIG or
 * ZPP_ERR_UNSUPPORTED naming the key. A decaying schedule must outlast its
 * warm-up when total_num_steps is given; when it is 0 the schedule takes the
 * run's length (train_steps, which --steps may set after loading), and a run
 * shorter than the warm-up simply never leaves it. */
zpp_status zpp_train_config_validate(const zpp_train_config *cfg);

/*
 * Fixes the batch geometry for `world_size` ranks with DeepSpeed's rules
 * (TBS = train_batch_size, MB = micro, GAS = accumulation, W = world):
 *   all three given      TBS == MB * GAS * W, else an error
 *   TBS, MB              GAS = TBS / (MB * W), must divide exactly
 *   TBS, GAS             MB  = TBS / (GAS * W), must divide exactly
 *   MB, GAS / MB alone   TBS = MB * GAS * W (GAS = 1 if not given)
 *   TBS alone            GAS = 1, MB = TBS / W, must divide exactly
 *   GAS alone / none     MB = ZPP_TRAIN_DEFAULT_MICRO_BATCH, GAS = 1 if not given
 * and checks that zero.hpz_partition_size divides world_size. On success all
 * three batch fields are set (> 0); on error *cfg is untouched and the
 * message reads e.g. "train_batch_size 10 is not divisible by micro-batch 4 x
 * world 2". Resolving an already-resolved config for the same world is a
 * no-op; for another world it fails the consistency check, so keep the
 * loaded config and resolve a copy if the world may change.
 */
zpp_status zpp_train_config_resolve(zpp_train_config *cfg, int world_size);

/* Learning rate of 0-based optimizer step `step` (formula above). A pure
 * function of the config; steps < 0 are treated as 0. */
double zpp_train_lr(const zpp_train_config *cfg, long step);

/* Writes the key reference (Markdown, docs/config.md) from the key table. */
void zpp_train_config_write_keys(FILE *f);

/* Applies command-line overrides, each "KEY=VALUE" with KEY a dotted path of
 * the key table ("optimizer.params.lr=3e-4", "zero_optimization.
 * zero_quantized_weights=true"), in order (a later one of the same key
 * wins), over the current values of *cfg, and validates the result: the
 * same type and range checks as a file's keys, in one load, so settings
 * that must change together are checked together. VALUE is JSON (a number,
 * true/false, [0.9, 0.95], {} for a feature object such as
 * zeropp_loco_param); keys that take a word take it bare
 * (scheduler.type=WarmupCosineLR). An unknown key is ZPP_ERR_CONFIG naming
 * it, with the likeliest intended key ("did you mean ..."); on any error
 * *cfg is untouched. Messages name the source "--set". */
zpp_status zpp_train_config_set(zpp_train_config *cfg, const char *const *assignments, int n);

/* The config as a JSON text that zpp_train_config_load_string reads back
 * (over the defaults) into an equal config: every key in effect (a
 * scheduler's params only for its type, a feature object's members only
 * while it is on, batch sizes only where given rather than derived, no
 * ignored knobs). Numbers round-trip exactly. NULL when out of memory;
 * free() it. Checkpoints keep a run's config this way. */
char *zpp_train_config_to_json(const zpp_train_config *cfg);

/* Writes one line "key: old -> new\n" for every key of the table whose
 * value differs between `old` and `now` (the keys `now` uses, and the ones
 * `old` used that no scheduler or feature switch of `now` accounts for),
 * in table order, into out (cap bytes, NUL-terminated, cut when full).
 * Returns the number of such keys. */
int zpp_train_config_diff(const zpp_train_config *old, const zpp_train_config *now, char *out,
                          size_t cap);

/* The length N of a decaying schedule (WarmupDecayLR, WarmupCosineLR):
 * total_num_steps, or train_steps where that is 0; 0 for schedules that
 * do not decay (none, WarmupLR), whose lr does not depend on N. */
int zpp_train_schedule_length(const zpp_train_config *cfg);

/* "shuffled" / "sequential", and back (ZPP_ERR_CONFIG naming the word). */
const char *zpp_data_order_name(zpp_data_order order);
const char *zpp_model_family_name(zpp_model_family_id family);
zpp_status zpp_data_order_parse(const char *name, zpp_data_order *order_p);

/* "WarmupCosineLR" etc.; "none" for ZPP_SCHED_NONE. */
const char *zpp_sched_type_name(zpp_sched_type type);

#ifdef __cplusplus
}
#endif

#endif
