/* engine/options.h — every scalar option of the engine, once.
 *
 * ZPP_ENGINE_OPTIONS(X) calls X(name, type, def, check, lo, hi, when, range)
 * for each option:
 *   name   the member of zpp_engine_opts (engine.h) and of the public
 *          zpp_engine_config (zeropp.h), the same in both
 *   type   its C type
 *   def    the library's default, a double (or integer) literal: a float
 *          option takes (float)def, so the config file's double default
 *          (config_keys.h, ZPP_EOPT_DEFAULT) rounds to the same float
 *   check  the range test: ANY (none), INT (lo <= v <= hi), GE (finite,
 *          v >= lo), GT (finite, lo < v <= hi), UNIT (finite, lo <= v < hi),
 *          IN (finite, lo <= v <= hi)
 *   lo, hi its bounds
 *   when   when the range applies: ALWAYS, DYNAMIC (the dynamic loss scaler,
 *          loss_scale 0) or LOCO (error feedback on)
 *   range  the accepted values in words, after "must be" in the messages
 *          (INT ranges are written from lo and hi)
 * From it come zpp_engine_opts_default, zpp_engine_config_default (api.c),
 * the public config's copy into the options (api.c), the one range check
 * (zpp_engine_opts_check, used by zpp_engine_create and zpp_engine_create_with_opts)
 * and the per-key checks of the trainer's config (zpp_engine_opt_check,
 * config.c), and the config file's defaults and integer ranges of the keys
 * that set an engine option (config_keys.h: ZPP_EOPT_DEFAULT, _LO, _HI).
 *
 * The options outside the table: the ZeRO++ mode (gather, hpz, reduce; the
 * public config's `mode` bits), the quantization specs (zpp_coll_opts,
 * checked by zpp_quant_spec_check), and the cross-option rules of
 * zpp_engine_opts_check (the working dtype, loco needing qgZ).
 *
 * Each option is one macro ZPP_EOPT_<name>(X), so that a single option can
 * be looked up by name (ZPP_EOPT_DEFAULT(name)); the list names them all. */
#ifndef ZPP_ENGINE_OPTIONS_H
#define ZPP_ENGINE_OPTIONS_H

#include <limits.h>
#include <math.h>

#include "zeropp.h"

/* clang-format off */
#define ZPP_EOPT_work_dtype(X)             X(work_dtype, zpp_dtype, ZPP_BF16, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_beta1(X)                  X(beta1, float, 0.9, UNIT, 0, 1, ALWAYS, "in [0, 1)")
#define ZPP_EOPT_beta2(X)                  X(beta2, float, 0.95, UNIT, 0, 1, ALWAYS, "in [0, 1)")
#define ZPP_EOPT_eps(X)                    X(eps, float, 1e-8, GT, 0, HUGE_VAL, ALWAYS, "> 0")
#define ZPP_EOPT_weight_decay(X)           X(weight_decay, float, 0, GE, 0, 0, ALWAYS, ">= 0")
#define ZPP_EOPT_decay_all(X)              X(decay_all, int, 0, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_grad_clip(X)                                                                     \
    X(grad_clip, float, 1, GE, 0, 0, ALWAYS, ">= 0 (0 = off)")
/* DeepSpeed's stage3_max_reuse_distance default */
#define ZPP_EOPT_max_reuse_distance(X)                                                            \
    X(max_reuse_distance, size_t, 1000000000, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_prefetch_depth(X)                                                                \
    X(prefetch_depth, int, 2, INT, 1, ZPP_ENGINE_MAX_DEPTH, ALWAYS, "")
#define ZPP_EOPT_reduce_depth(X)                                                                  \
    X(reduce_depth, int, 2, INT, 1, ZPP_ENGINE_MAX_DEPTH, ALWAYS, "")
#define ZPP_EOPT_seed(X)                   X(seed, uint64_t, 1234, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_max_consecutive_skips(X)                                                         \
    X(max_consecutive_skips, int, 5, INT, 1, INT_MAX, ALWAYS, "")
#define ZPP_EOPT_loss_scale(X)                                                                    \
    X(loss_scale, float, 1, GE, 0, 0, ALWAYS, ">= 0 (0 = dynamic)")
/* DeepSpeed's dynamic loss scaler: 2^16, window 1000, hysteresis 2, min 1 */
#define ZPP_EOPT_initial_scale_power(X)                                                           \
    X(initial_scale_power, int, 16, INT, 0, 127, DYNAMIC, "")
#define ZPP_EOPT_loss_scale_window(X)                                                             \
    X(loss_scale_window, int, 1000, INT, 1, INT_MAX, DYNAMIC, "")
#define ZPP_EOPT_hysteresis(X)             X(hysteresis, int, 2, INT, 1, INT_MAX, DYNAMIC, "")
#define ZPP_EOPT_consecutive_hysteresis(X)                                                        \
    X(consecutive_hysteresis, int, 0, ANY, 0, 0, ALWAYS, "")
/* 3e38: a float (the engine's scale) holds it */
#define ZPP_EOPT_min_loss_scale(X)                                                                \
    X(min_loss_scale, float, 1, GT, 0, 3e38, DYNAMIC, "> 0")
#define ZPP_EOPT_loco(X)                   X(loco, int, 0, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_loco_err_beta(X)                                                                 \
    X(loco_err_beta, float, 0.8, IN, 0, 1, LOCO,                                                  \
      "in [0, 1] (the weight of the old error in the error buffer's average)")
#define ZPP_EOPT_loco_reset_T(X)           X(loco_reset_T, int, 1024, INT, 1, INT_MAX, LOCO, "")
#define ZPP_EOPT_quantize_vectors(X)       X(quantize_vectors, int, 0, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_profile(X)                X(profile, int, 0, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_resident_weights(X)       X(resident_weights, int, 1, ANY, 0, 0, ALWAYS, "")
#define ZPP_EOPT_work_grads(X)             X(work_grads, int, 1, ANY, 0, 0, ALWAYS, "")

#define ZPP_ENGINE_OPTIONS(X)                                                                     \
    ZPP_EOPT_work_dtype(X) ZPP_EOPT_beta1(X) ZPP_EOPT_beta2(X) ZPP_EOPT_eps(X)                     \
    ZPP_EOPT_weight_decay(X) ZPP_EOPT_decay_all(X) ZPP_EOPT_grad_clip(X)                          \
    ZPP_EOPT_max_reuse_distance(X) ZPP_EOPT_prefetch_depth(X) ZPP_EOPT_reduce_depth(X)            \
    ZPP_EOPT_seed(X) ZPP_EOPT_max_consecutive_skips(X) ZPP_EOPT_loss_scale(X)                     \
    ZPP_EOPT_initial_scale_power(X) ZPP_EOPT_loss_scale_window(X) ZPP_EOPT_hysteresis(X)          \
    ZPP_EOPT_consecutive_hysteresis(X) ZPP_EOPT_min_loss_scale(X) ZPP_EOPT_loco(X)                \
    ZPP_EOPT_loco_err_beta(X) ZPP_EOPT_loco_reset_T(X) ZPP_EOPT_quantize_vectors(X)               \
    ZPP_EOPT_profile(X) ZPP_EOPT_resident_weights(X) ZPP_EOPT_work_grads(X)
/* clang-format on */

/* One option's default and bounds, by name (constant expressions). */
#define ZPP_EOPT_PICK_DEF_(name, type, def, check, lo, hi, when, range) def
#define ZPP_EOPT_PICK_LO_(name, type, def, check, lo, hi, when, range) lo
#define ZPP_EOPT_PICK_HI_(name, type, def, check, lo, hi, when, range) hi
#define ZPP_EOPT_DEFAULT(name) ZPP_EOPT_##name(ZPP_EOPT_PICK_DEF_)
#define ZPP_EOPT_LO(name) ZPP_EOPT_##name(ZPP_EOPT_PICK_LO_)
#define ZPP_EOPT_HI(name) ZPP_EOPT_##name(ZPP_EOPT_PICK_HI_)

/* The options by number, for zpp_engine_opt_check. */
typedef enum zpp_engine_opt_id {
#define ZPP_EOPT_ID_(name, type, def, check, lo, hi, when, range) ZPP_EOPT_ID_##name,
    ZPP_ENGINE_OPTIONS(ZPP_EOPT_ID_)
#undef ZPP_EOPT_ID_
    ZPP_EOPT_COUNT
} zpp_engine_opt_id;

/* Checks value v of option `id` against its range (whatever `when` says:
 * the caller decides whether it applies). On failure ZPP_ERR_CONFIG with
 * "'<key>' must be <range>, got <v>" when key names the config key that set
 * it, else ZPP_ERR_INVALID with "engine: <name> <v> must be <range>". */
zpp_status zpp_engine_opt_check(zpp_engine_opt_id id, double v, const char *key);

#endif
