/* train/config_keys.h — every key of the trainer's JSON configuration, once.
 *
 * ZPP_CONFIG_KEYS(X) calls X(path, kind, field, lo, hi, def, sched, doc) for
 * each key, objects before their members, in the order the docs list them:
 *   path   the key's dotted JSON path ("optimizer.params.lr"); the part
 *          before the last dot is the object it lives in ("" = top level)
 *   kind   how the value is read and stored (ZPP_CFG_<kind>, below)
 *   field  the zpp_train_config member it sets (`none` for kinds that set
 *          none: objects, ignored keys, checks)
 *   lo, hi the accepted range of an integer kind (INT, I64, SEED)
 *   def    the default, parenthesised: (1e-3), (0.9, 0.999) for betas; an
 *          integer default below lo means "derived" (the batch sizes)
 *   sched  for scheduler params: a mask of the ZPP_CFG_S_* scheduler types
 *          it applies to (0: any); a param of another type is an error, as
 *          in DeepSpeed
 *   doc    one line for docs/config.md
 * From it come the parser's dispatch and its "known here" lists
 * (src/train/config.c), zpp_train_config_defaults, the key reference
 * (`zeropp train --list-config-keys`, checked into docs/config.md and
 * compared by tests/test_config.c) and the field comparison of the tests.
 * A new key is one line here (plus, for a new kind, its case in config.c);
 * cross-key checks stay in zpp_train_config_validate.
 *
 * A key that sets an engine option takes its default and integer range from
 * the engine's table (engine/options.h: ZPP_EOPT_DEFAULT, _LO, _HI), and
 * zpp_train_config_validate checks its other ranges there too
 * (zpp_engine_opt_check). Where DeepSpeed's (or torch's) default differs
 * from the library's, the key keeps DeepSpeed's: betas[1] 0.999 (0.95),
 * weight_decay 0.01 (0), gradient_clipping 0 (1), fp16.loss_scale 0
 * (dynamic; the library's 1 is static).
 *
 * Kinds: OBJECT (a JSON object of further keys), INT (int field, integer in
 * [lo, hi]), I64 (long long field), SEED (uint64_t field), NUM (double
 * field, finite; its range is checked by zpp_train_config_validate and
 * stated in doc), OBJECT_ON (an object whose presence sets an int field
 * to 1; absent = 0: DeepSpeed's "param" objects that switch a feature on), BOOL (int field, 0/1), BETAS ([beta1, beta2]),
 * OPT_TYPE ("AdamW" only, any case), SCHED_TYPE (zpp_sched_type, read before
 * the other scheduler keys), WARMUP_TYPE (zpp_warmup_type), DATA_ORDER
 * (zpp_data_order: "shuffled" | "sequential"), FAMILY (zpp_model_family_id:
 * "gpt2" | "llama"), HF_ARCH (zpp_hf_arch: "LlamaForCausalLM" |
 * "MistralForCausalLM" | "Qwen2ForCausalLM"), STAGE (must be 3), KEEP_ACTS
 * (int field of ZPP_KEEP_* bits, model/family.h: true | false |
 * "layernorm" | "gelu"), IGNORED (a DeepSpeed engine knob that does not
 * change the mathematics: accepted, noted in cfg->ignored).
 */
#ifndef ZPP_TRAIN_CONFIG_KEYS_H
#define ZPP_TRAIN_CONFIG_KEYS_H

#include <limits.h>

#include "engine/options.h"
#include "train/config.h"

/* Which scheduler types take a param (DeepSpeed's constructor arguments). */
#define ZPP_CFG_S_WARMUP                                                      \
    (1u << ZPP_SCHED_WARMUP_LR | 1u << ZPP_SCHED_WARMUP_DECAY_LR | 1u << ZPP_SCHED_WARMUP_COSINE_LR)
#define ZPP_CFG_S_LRS (1u << ZPP_SCHED_WARMUP_LR | 1u << ZPP_SCHED_WARMUP_DECAY_LR)
#define ZPP_CFG_S_TOTAL (1u << ZPP_SCHED_WARMUP_DECAY_LR | 1u << ZPP_SCHED_WARMUP_COSINE_LR)
#define ZPP_CFG_S_RATIOS (1u << ZPP_SCHED_WARMUP_COSINE_LR)

#define ZPP_CFG_I53 9007199254740992LL /* 2^53: doubles hold integers exactly up to it */

/* clang-format off */
#define ZPP_CONFIG_KEYS(X)                                                                        \
    X("train_batch_size", INT, train_batch_size, 1, INT_MAX, (0), 0,                               \
      "sequences per optimizer step, all ranks (= micro * accumulation * world)")                  \
    X("train_micro_batch_size_per_gpu", INT, train_micro_batch_size_per_gpu, 1, INT_MAX, (0), 0,   \
      "sequences per rank per micro-step (8 when no batch key is given)")                          \
    X("gradient_accumulation_steps", INT, gradient_accumulation_steps, 1, INT_MAX, (0), 0,         \
      "micro-steps per optimizer step")                                                            \
    X("steps_per_print", INT, steps_per_print, 0, INT_MAX, (10), 0,                                \
      "log every N steps (0 = never)")                                                             \
    X("gradient_clipping", NUM, gradient_clipping, 0, 0, (0), 0,                                   \
      "clip the global gradient L2 norm to this, >= 0; 0 = off")                                   \
    X("wall_clock_breakdown", IGNORED, none, 0, 0, (0), 0, "DeepSpeed timing knob")                \
    X("optimizer", OBJECT, none, 0, 0, (0), 0, "the optimizer: AdamW")                             \
    X("optimizer.type", OPT_TYPE, none, 0, 0, (0), 0,                                              \
      "\"AdamW\" only (any case): Adam with decoupled weight decay")                               \
    X("optimizer.params", OBJECT, none, 0, 0, (0), 0, "AdamW's hyperparameters")                   \
    X("optimizer.params.lr", NUM, optimizer.lr, 0, 0, (1e-3), 0, "learning rate, > 0")             \
    X("optimizer.params.betas", BETAS, optimizer.beta1, 0, 0, (ZPP_EOPT_DEFAULT(beta1), 0.999), 0, \
      "[beta1, beta2], each in [0, 1)")                                                            \
    X("optimizer.params.eps", NUM, optimizer.eps, 0, 0, (ZPP_EOPT_DEFAULT(eps)), 0, "> 0")         \
    X("optimizer.params.weight_decay", NUM, optimizer.weight_decay, 0, 0, (0.01), 0,               \
      ">= 0, decoupled (AdamW); on the model's matrices only unless zeropp.weight_decay_all")      \
    X("scheduler", OBJECT, none, 0, 0, (0), 0,                                                     \
      "the learning-rate schedule (absent: constant optimizer lr)")                                \
    X("scheduler.type", SCHED_TYPE, scheduler.type, 0, 0, (0), 0,                                  \
      "WarmupLR | WarmupDecayLR | WarmupCosineLR (any case)")                                      \
    X("scheduler.params", OBJECT, none, 0, 0, (0), ZPP_CFG_S_WARMUP,                               \
      "the schedule's parameters; needs scheduler.type")                                           \
    X("scheduler.params.warmup_num_steps", INT, scheduler.warmup_num_steps, 0, INT_MAX, (1000),    \
      ZPP_CFG_S_WARMUP, "warm-up steps W")                                                        \
    X("scheduler.params.warmup_type", WARMUP_TYPE, scheduler.warmup_type, 0, 0, (0),               \
      ZPP_CFG_S_WARMUP, "\"log\" | \"linear\" (DeepSpeed's default: log)")                        \
    X("scheduler.params.warmup_min_lr", NUM, scheduler.warmup_min_lr, 0, 0, (0), ZPP_CFG_S_LRS,    \
      "WarmupLR, WarmupDecayLR: in [0, warmup_max_lr]")                                            \
    X("scheduler.params.warmup_max_lr", NUM, scheduler.warmup_max_lr, 0, 0, (1e-3), ZPP_CFG_S_LRS, \
      "WarmupLR, WarmupDecayLR: > 0")                                                              \
    X("scheduler.params.total_num_steps", INT, scheduler.total_num_steps, 0, INT_MAX, (0),         \
      ZPP_CFG_S_TOTAL, "WarmupDecayLR, WarmupCosineLR: N > W; 0 = the run's steps "               \
                       "(zeropp.train_steps or --steps), which may end within the warm-up")        \
    X("scheduler.params.warmup_min_ratio", NUM, scheduler.warmup_min_ratio, 0, 0, (0),             \
      ZPP_CFG_S_RATIOS, "WarmupCosineLR: in [0, 1]")                                              \
    X("scheduler.params.cos_min_ratio", NUM, scheduler.cos_min_ratio, 0, 0, (1e-4),                \
      ZPP_CFG_S_RATIOS, "WarmupCosineLR: in [0, 1]")                                              \
    X("bf16", OBJECT, none, 0, 0, (0), 0, "bf16 training")                                         \
    X("bf16.enabled", BOOL, bf16, 0, 0, (0), 0, "gathered parameters and compute in bf16")         \
    X("fp16", OBJECT, none, 0, 0, (0), 0, "fp16 training with loss scaling (DeepSpeed's keys)")    \
    X("fp16.enabled", BOOL, fp16.enabled, 0, 0, (0), 0,                                            \
      "gathered parameters and reduced gradients in fp16, loss scaled; not with bf16")             \
    X("fp16.loss_scale", NUM, fp16.loss_scale, 0, 0, (0), 0,                                       \
      "0 = dynamic loss scaling; > 0 = this static scale")                                         \
    X("fp16.initial_scale_power", INT, fp16.initial_scale_power, ZPP_EOPT_LO(initial_scale_power), \
      ZPP_EOPT_HI(initial_scale_power), (ZPP_EOPT_DEFAULT(initial_scale_power)), 0,               \
      "dynamic: the scale starts at 2^this")                                                       \
    X("fp16.loss_scale_window", INT, fp16.loss_scale_window, ZPP_EOPT_LO(loss_scale_window),       \
      ZPP_EOPT_HI(loss_scale_window), (ZPP_EOPT_DEFAULT(loss_scale_window)), 0,                   \
      "dynamic: double the scale after this many steps without overflow")                          \
    X("fp16.hysteresis", INT, fp16.hysteresis, ZPP_EOPT_LO(hysteresis), ZPP_EOPT_HI(hysteresis),   \
      (ZPP_EOPT_DEFAULT(hysteresis)), 0,                                                          \
      "dynamic: halve the scale at the N-th overflow (each one after, until the next doubling)")   \
    X("fp16.consecutive_hysteresis", BOOL, fp16.consecutive_hysteresis, 0, 0,                      \
      (ZPP_EOPT_DEFAULT(consecutive_hysteresis)), 0,                                              \
      "dynamic: any step without overflow restores the hysteresis")                                \
    X("fp16.min_loss_scale", NUM, fp16.min_loss_scale, 0, 0,                                       \
      (ZPP_EOPT_DEFAULT(min_loss_scale)), 0,                                                      \
      "dynamic: the scale's floor, > 0; overflows there count as skips (max_consecutive_skips)")   \
    X("fp16.auto_cast", IGNORED, none, 0, 0, (0), 0, "DeepSpeed fp16 loss-scale knob")             \
    X("zero_optimization", OBJECT, none, 0, 0, (0), 0, "ZeRO: stage 3 and the ZeRO++ options")     \
    X("zero_optimization.stage", STAGE, zero.stage, 0, 0, (3), 0,                                  \
      "3 only (zeropp implements ZeRO stage 3)")                                                   \
    X("zero_optimization.zero_quantized_weights", BOOL, zero.quantized_weights, 0, 0, (0), 0,      \
      "qwZ: int8 block-quantized weight all-gather")                                               \
    X("zero_optimization.zero_hpz_partition_size", INT, zero.hpz_partition_size, 0, INT_MAX, (1),  \
      0, "hpZ: > 1 enables it with this many ranks per node (also the emulated node size); "      \
         "0 = the node, whatever it is (--node-size, else the ranks the launcher put on one "      \
         "host; off where that is 1 rank); 1 = off")                                               \
    X("zero_optimization.zero_quantized_gradients", BOOL, zero.quantized_gradients, 0, 0, (0), 0,  \
      "qgZ: 4-bit hierarchical gradient reduce-scatter")                                           \
    X("zero_optimization.stage3_max_reuse_distance", I64, zero.max_reuse_distance, 0,              \
      ZPP_CFG_I53, (ZPP_EOPT_DEFAULT(max_reuse_distance)), 0,                                     \
      "keep a gathered unit for its next use, in the same pass or (over more than one rank) in "   \
      "the backward after the forward, when it comes within this many parameters of other "        \
      "units (DeepSpeed's meaning); 0 = gather for every use")                                     \
    X("zero_optimization.zeropp_prefetch_depth", INT, zero.prefetch_depth,                         \
      ZPP_EOPT_LO(prefetch_depth), ZPP_EOPT_HI(prefetch_depth),                                   \
      (ZPP_EOPT_DEFAULT(prefetch_depth)), 0,                                                      \
      "zeropp: units gathered ahead of the one computing (forward and backward); each costs a "    \
      "gathered unit of memory")                                                                   \
    X("zero_optimization.zeropp_reduce_depth", INT, zero.reduce_depth,                             \
      ZPP_EOPT_LO(reduce_depth), ZPP_EOPT_HI(reduce_depth), (ZPP_EOPT_DEFAULT(reduce_depth)), 0,  \
      "zeropp: gradient reductions in flight; each costs a unit's reduction buffers")              \
    X("zero_optimization.zeropp_loco_param", OBJECT_ON, zero.loco, 0, 0, (0), 0,                   \
      "qgZ error feedback (LoCo, DeepSpeed's key): the intra- and inter-node quantization "        \
      "errors of the last reduction are fed into the next; costs 4 (1 + 1/S) bytes a parameter "   \
      "a rank (docs/quantization.md); needs zero_quantized_gradients")                             \
    X("zero_optimization.zeropp_loco_param.err_beta", NUM, zero.loco_err_beta, 0, 0,               \
      (ZPP_EOPT_DEFAULT(loco_err_beta)), 0,                                                       \
      "error buffer e <- err_beta e + (1 - err_beta) (x - Q(x)), in [0, 1]")                       \
    X("zero_optimization.zeropp_loco_param.reset_T", INT, zero.loco_reset_T,                       \
      ZPP_EOPT_LO(loco_reset_T), ZPP_EOPT_HI(loco_reset_T), (ZPP_EOPT_DEFAULT(loco_reset_T)), 0,  \
      "clear the error buffers after every reset_T optimizer steps")                               \
    X("zero_optimization.zeropp_grad_stochastic_rounding", BOOL, zero.grad_stochastic, 0, 0, (0),  \
      0, "zeropp: qgZ rounds its 4-bit gradients stochastically (unbiased) instead of to the "     \
      "nearest step (docs/quantization.md, Rounding); needs zero_quantized_gradients")             \
    X("zero_optimization.zeropp_grad_e2m1", BOOL, zero.grad_e2m1, 0, 0, (1), 0,                   \
      "zeropp: qgZ's 4-bit gradients are E2M1 (OCP FP4: finer than int4 near 0, where AdamW "      \
      "needs the sign); false sends int4 as DeepSpeed does (docs/quantization.md, qgZ's 4-bit "    \
      "format); used with zero_quantized_gradients")                                              \
    X("zero_optimization.zeropp_quantize_vectors", BOOL, zero.quantize_vectors, 0, 0,              \
      (ZPP_EOPT_DEFAULT(quantize_vectors)), 0,                                                    \
      "zeropp: qwZ and qgZ quantize biases and LayerNorm parameters too; by default they travel "  \
      "at full precision, as in DeepSpeed (one all-reduce of them a step each way)")               \
    X("zero_optimization.zeropp_resident_weights", BOOL, zero.resident_weights, 0, 0,              \
      (ZPP_EOPT_DEFAULT(resident_weights)), 0,                                                    \
      "zeropp: in a world of one rank (no qwZ or hpZ) keep the weights in the working dtype "      \
      "between steps, written by AdamW, so no step rounds the fp32 masters again; in bf16 at "     \
      "no memory (each master is kept as that copy and its low 16 bits), in fp16 and fp32 2 or "   \
      "4 bytes a parameter; false for a model that only just fits")                                \
    X("zero_optimization.zeropp_work_grads", BOOL, zero.work_grads, 0, 0,                          \
      (ZPP_EOPT_DEFAULT(work_grads)), 0,                                                          \
      "zeropp: in a world of one rank with bf16 and one micro-batch a step, accumulate the "      \
      "gradients in bf16 (each add in fp32, rounded once: the precision of a bf16 wire), 2 "      \
      "bytes a parameter less than fp32; false keeps fp32")                                        \
    X("zero_optimization.overlap_comm", IGNORED, none, 0, 0, (0), 0, "DeepSpeed tuning knob")      \
    X("zero_optimization.contiguous_gradients", IGNORED, none, 0, 0, (0), 0,                       \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.reduce_bucket_size", IGNORED, none, 0, 0, (0), 0,                         \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.allgather_bucket_size", IGNORED, none, 0, 0, (0), 0,                      \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.reduce_scatter", IGNORED, none, 0, 0, (0), 0, "DeepSpeed tuning knob")    \
    X("zero_optimization.allgather_partitions", IGNORED, none, 0, 0, (0), 0,                       \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.sub_group_size", IGNORED, none, 0, 0, (0), 0, "DeepSpeed tuning knob")    \
    X("zero_optimization.stage3_prefetch_bucket_size", IGNORED, none, 0, 0, (0), 0,                \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.stage3_param_persistence_threshold", IGNORED, none, 0, 0, (0), 0,         \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.stage3_max_live_parameters", IGNORED, none, 0, 0, (0), 0,                 \
      "DeepSpeed tuning knob")                                                                     \
    X("zero_optimization.stage3_gather_16bit_weights_on_model_save", IGNORED, none, 0, 0, (0), 0,  \
      "DeepSpeed tuning knob")                                                                     \
    X("model", OBJECT, none, 0, 0, (0), 0,                                                         \
      "zeropp: the decoder, its family and shape (n_embd % n_head == 0); `--init-from` a "         \
      "Hugging Face folder sets it from config.json (docs/training.md)")                           \
    X("model.n_layer", INT, model.n_layer, 1, INT_MAX, (2), 0,                                     \
      "transformer blocks (HF: num_hidden_layers)")                                                \
    X("model.n_head", INT, model.n_head, 1, INT_MAX, (4), 0,                                       \
      "attention (query) heads (HF: num_attention_heads)")                                         \
    X("model.n_embd", INT, model.n_embd, 1, INT_MAX, (64), 0,                                      \
      "channels, a multiple of n_head (HF: hidden_size); llama: the head dim n_embd / n_head "     \
      "even (RoPE turns pairs); on the GPU 64 or 128 take the fused attention in bf16, others "    \
      "the GEMM path (docs/gpus.md)")                                                              \
    X("model.seq_len", INT, model.seq_len, 1, INT_MAX, (64), 0,                                    \
      "T, tokens per sequence (the RoPE tables' positions)")                                       \
    X("model.vocab_size", INT, model.vocab_size, 1, INT_MAX, (256), 0,                             \
      "rows of the token embedding (HF: vocab_size); 256 = raw bytes")                             \
    X("model.real_vocab_size", INT, model.real_vocab_size, 0, INT_MAX, (0), 0,                     \
      "tokens the softmax runs over, <= vocab_size; the rows past it are padding (llm.c's "        \
      "padded vocabulary); 0 = vocab_size")                                                        \
    X("model.family", FAMILY, model_family, 0, 0, (ZPP_FAMILY_GPT2), 0,                            \
      "the decoder: \"gpt2\" or \"llama\" (HF LlamaForCausalLM; src/model/llama.h); the "          \
      "keys below are llama's, refused for gpt2")                                                  \
    X("model.n_kv_head", INT, model_ext.n_kv_head, 0, INT_MAX, (0), 0,                             \
      "llama: key/value heads, a divisor of n_head (grouped-query attention; HF: "                 \
      "num_key_value_heads); 0 = n_head")                                                          \
    X("model.n_ffn", INT, model_ext.n_ffn, 0, INT_MAX, (0), 0,                                     \
      "llama: the SwiGLU MLP's width (HF: intermediate_size); 0 = 8 n_embd / 3 rounded up to a "   \
      "multiple of 256")                                                                           \
    X("model.rope_theta", NUM, model_ext.rope_theta, 0, 0, (0), 0,                                 \
      "llama: RoPE's base, > 1 (HF: rope_theta; Llama 3: 500000); 0 = 10000")                      \
    X("model.norm_eps", NUM, model_ext.norm_eps, 0, 0, (0), 0,                                     \
      "llama: RMSNorm's epsilon, > 0 (HF: rms_norm_eps); 0 = 1e-5")                                \
    X("model.untied_head", BOOL, model_ext.untied_head, 0, 0, (0), 0,                              \
      "llama: an output head of its own (HF: tie_word_embeddings false); false: the token "        \
      "embedding's")                                                                               \
    X("model.qkv_bias", BOOL, model_ext.qkv_bias, 0, 0, (0), 0,                                    \
      "llama: biases on the q, k and v projections (Qwen2 has them; HF Llama: attention_bias)")    \
    X("model.o_bias", BOOL, model_ext.o_bias, 0, 0, (0), 0,                                        \
      "llama: a bias on the attention output projection (HF Llama: attention_bias, with "          \
      "qkv_bias; Qwen2 and Mistral have none)")                                                    \
    X("model.rope_factor", NUM, model_ext.rope_factor, 0, 0, (0), 0,                               \
      "llama: Llama 3's rope_scaling (rope_type llama3) factor, > 0; 0 = no scaling; when set, "   \
      "the three below are required")                                                              \
    X("model.rope_low_freq_factor", NUM, model_ext.rope_low_freq_factor, 0, 0, (0), 0,             \
      "llama: rope_scaling's low_freq_factor, in (0, high) (Llama 3.1: 1)")                        \
    X("model.rope_high_freq_factor", NUM, model_ext.rope_high_freq_factor, 0, 0, (0), 0,           \
      "llama: rope_scaling's high_freq_factor, > low (Llama 3.1: 4)")                              \
    X("model.rope_original_max_pos", INT, model_ext.rope_original_max_pos, 0, INT_MAX, (0), 0,     \
      "llama: rope_scaling's original_max_position_embeddings, >= 1 with rope_factor (Llama "      \
      "3.1: 8192)")                                                                                \
    X("model.hf_architecture", HF_ARCH, hf_architecture, 0, 0, (ZPP_HF_LLAMA), 0,                  \
      "llama: the Hugging Face architecture `zeropp export --format hf` names: "                   \
      "\"LlamaForCausalLM\", \"MistralForCausalLM\" (no biases) or \"Qwen2ForCausalLM\" (qkv_bias, " \
      "no o_bias); `--init-from` sets it from config.json")                                        \
    X("model.hf_sliding_window", INT, hf_sliding_window, 0, INT_MAX, (0), 0,                       \
      "llama: the sliding_window an export names (Mistral: model.seq_len must fit in it, as "      \
      "zeropp attends to all earlier positions; Qwen2: kept, its window off); 0 = null")           \
    X("zeropp", OBJECT, none, 0, 0, (0), 0, "zeropp: the run")                                     \
    X("zeropp.train_steps", INT, train_steps, 1, INT_MAX, (200), 0, "optimizer steps to run")      \
    X("zeropp.seed", SEED, seed, 0, ZPP_CFG_I53, (ZPP_EOPT_DEFAULT(seed)), 0,                      \
      "initialisation and data order")                                                             \
    X("zeropp.eval_every", INT, eval_every, 0, INT_MAX, (50), 0,                                   \
      "validate every N steps; 0 = never")                                                         \
    X("zeropp.eval_batches", INT, eval_batches, 1, INT_MAX, (4), 0,                                \
      "micro-batches a rank per validation, at most as many as cover the held-out split once "     \
      "(more are capped, with a note)")                                                            \
    X("zeropp.sample_every", INT, sample_every, 0, INT_MAX, (0), 0,                                \
      "print a sample every N steps (and put it in the metrics; docs/sampling.md); 0 = never; "    \
      "--sample-every")                                                                            \
    X("zeropp.sample_tokens", INT, sample_tokens, 1, 65536, (64), 0,                               \
      "new tokens per sample; --sample-tokens")                                                    \
    X("zeropp.max_consecutive_skips", INT, max_consecutive_skips,                                  \
      ZPP_EOPT_LO(max_consecutive_skips), ZPP_EOPT_HI(max_consecutive_skips),                     \
      (ZPP_EOPT_DEFAULT(max_consecutive_skips)), 0,                                               \
      "a step with NaN/Inf gradients is skipped (no update; the lr schedule still advances); "     \
      "stop after this many in a row. No DeepSpeed equivalent: DeepSpeed skips fp16 overflows "    \
      "only, and fails at min_loss_scale")                                                         \
    X("zeropp.keep_checkpoints", INT, keep_checkpoints, 1, INT_MAX, (2), 0,                        \
      "--save keeps the newest N published checkpoints (step folders)")                            \
    X("zeropp.collective_timeout_s", NUM, collective_timeout_s, 0, 0, (600), 0,                    \
      "seconds a rank waits in a collective before it stops the job (a peer stalled or died), "    \
      ">= 0; 0 = wait forever; --collective-timeout")                                              \
    X("zeropp.prune_newer", BOOL, prune_newer, 0, 0, (0), 0,                                       \
      "true: a run resumed from an older checkpoint deletes the step folders newer than it at "    \
      "its first save; false: they stay, apart from the kept ones; --prune-newer")                 \
    X("zeropp.save_timeout_s", NUM, save_timeout_s, 0, 0, (1800), 0,                               \
      "seconds the ranks wait for each other's checkpoint files to be written and synced, "        \
      ">= 0; 0 = wait forever. A save's disk time is not a stall: it is outside "                  \
      "zeropp.collective_timeout_s")                                                               \
    X("zeropp.peak_tflops", NUM, peak_tflops, 0, 0, (0), 0,                                        \
      "peak TFLOP/s of one rank's device for MFU, >= 0; 0 = the GPU's preset when its name is "    \
      "known (bf16/fp16 tensor or fp32 peak), else no MFU; --peak-tflops (docs/logs.md)")          \
    X("zeropp.data_order", DATA_ORDER, data_order, 0, 0, (0), 0,                                   \
      "\"shuffled\" (a keyed permutation of windows) | \"sequential\" (step s reads tokens "       \
      "[s G T, (s+1) G T] of the training split as llm.c's DataLoader; --data-order)")             \
    X("zeropp.weight_decay_all", BOOL, weight_decay_all, 0, 0,                                     \
      (ZPP_EOPT_DEFAULT(decay_all)), 0,                                                           \
      "true: weight decay on every parameter (DeepSpeed); false: on the matrices only (GPT-2's "   \
      "wte, wpe, attention and MLP weights; a Llama's embedding, head, q/k/v/o and MLP "           \
      "weights, not its norms and biases; llm.c, nanoGPT)")                                        \
    X("zeropp.activation_checkpointing", BOOL, activation_checkpointing, 0, 0, (0), 0,             \
      "true: each transformer block keeps only its input from the forward and recomputes the "     \
      "rest in the backward (one block's activations instead of n_layer, for a forward more); "    \
      "the same losses and weights, bit for bit; --recompute")                                     \
    X("zeropp.keep_activations", KEEP_ACTS, keep_activations, 0, 0, (0), 0,                        \
      "true: the GPU GPT-2 keeps each block's LayerNorm and GELU outputs for the backward "        \
      "instead of evaluating them again there (12 x n_embd bytes a token and layer more in "       \
      "bf16, three passes over them a layer fewer); \"layernorm\": the two LayerNorm outputs "     \
      "only (4 x n_embd bytes, two passes); \"gelu\": the GELU output only (8 x n_embd bytes, "    \
      "one pass); no effect with activation checkpointing")
/* clang-format on */

#endif
