/* engine/step.c — the optimizer step after the gradients are in: the
 * global norm over the shards, the loss scaler's decision (skip a step
 * with non-finite gradients, or update), clipping and AdamW on each
 * rank's shards, the LoCo reset and the step's stats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fault.h"
#include "device/device.h"
#include "engine/engine_internal.h"

/* AdamW on unit `ui`'s shard, with weight decay only on the elements the
 * model says decay (model.h, matrix_ranges; all of them when it names none
 * or opts.decay_all). The matrix ranges the shard [r * shard_len,
 * (r + 1) * shard_len) of the unit meets become the call's decay ranges
 * (zpp_adamw_args.n_decay), so the whole shard is one launch; a shard that
 * meets more ranges than one call takes is cut at them into calls with
 * weight_decay or 0. Either way the per-element arithmetic is the same, so
 * the bits are. The padding past numel lies outside every range: 0 stays 0
 * either way. */
static zpp_status adamw_piece(zpp_engine *e, unit_state *u, size_t from, size_t to,
                              const zpp_adamw_args *aw, int decay) {
    if (to <= from) return ZPP_OK;
    zpp_adamw_args a = *aw;
    if (!decay) a.weight_decay = 0.0f;
    /* the resident copy (engine.c) is written in the same pass */
    void *work = u->resident ? (char *)u->resident + from * zpp_dtype_size(e->opts.work_dtype)
                             : NULL;
    a.grad_dtype = e->grad_dtype;
    /* a split master (units.c): its high halves are the resident copy */
    a.master_lo = u->master_lo ? u->master_lo + from : NULL;
    float *master = u->master ? u->master + from : NULL;
    return zpp_device_adamw(e->dev, master, u->m + from, u->v + from,
                            (char *)u->grad_acc + engine_grad_bytes(e, from), to - from, &a, work,
                            e->opts.work_dtype);
}

/* The next of unit ui's matrix ranges (from *k on) that meets the shard
 * [begin, begin + len) of the unit, clipped to it, in shard coordinates:
 * [*lo, *hi); 0 when there is none. */
static int next_decay_range(const zpp_model *m, int ui, size_t begin, size_t len, int *k,
                            size_t *lo, size_t *hi) {
    for (; *k < m->n_matrix_ranges[ui]; (*k)++) {
        const zpp_elem_range r = m->matrix_ranges[ui][*k];
        if (r.end <= begin) continue;
        if (r.begin >= begin + len) return 0;
        *lo = (r.begin > begin ? r.begin : begin) - begin;
        *hi = (r.end < begin + len ? r.end : begin + len) - begin;
        (*k)++;
        return 1;
    }
    return 0;
}

static zpp_status adamw_unit(zpp_engine *e, int ui, const zpp_adamw_args *aw) {
    unit_state *u = &e->units[ui];
    const zpp_model *m = e->model;
    const size_t len = u->part.shard_len;
    if (e->opts.decay_all || !m->matrix_ranges || aw->weight_decay == 0.0f)
        return adamw_piece(e, u, 0, len, aw, 1);
    const size_t begin = (size_t)e->topo->world_rank * len; /* in the unit */
    zpp_adamw_args one = *aw; /* the shard in one call */
    one.n_decay = 0;
    size_t lo = 0, hi = 0;
    int k = 0, count = 0;
    while (next_decay_range(m, ui, begin, len, &k, &lo, &hi)) {
        if (count < ZPP_ADAMW_RANGES) one.decay_lo[count] = lo, one.decay_hi[count] = hi;
        count++;
    }
    if (count <= ZPP_ADAMW_RANGES) {
        one.n_decay = count;
        if (count == 0) one.weight_decay = 0.0f; /* no matrix in this shard */
        return adamw_piece(e, u, 0, len, &one, 1);
    }
    size_t pos = 0; /* in the shard */
    k = 0;
    while (next_decay_range(m, ui, begin, len, &k, &lo, &hi)) {
        ZPP_CHECK(adamw_piece(e, u, pos, lo, aw, 0));
        ZPP_CHECK(adamw_piece(e, u, lo, hi, aw, 1));
        pos = hi;
    }
    return adamw_piece(e, u, pos, len, aw, 0);
}

/* ---- The optimizer step, in its named pieces ----------------------------------
 * settle (release, reductions, the fault hook) -> global norm -> either skip
 * (scaler backs off) or clip + AdamW (scaler may grow) -> LoCo reset -> stats.
 * Every piece keeps the floating-point operations of the single function it
 * came from, in the same order: the bits do not change. */

/* Brings every gradient to its shard: nothing gathered may outlive the
 * weights it was gathered from (a forward whose backward never came leaves
 * its last unit gathered), every reduction in flight lands, and qgZ's
 * full-precision vector gradients are summed. The nonfinite test hook
 * (engine.h) then puts a NaN in rank 0's gradient. */
static zpp_status step_settle_gradients(zpp_engine *e) {
    for (int i = 0; i < e->model->n_units; i++) ZPP_CHECK(engine_release(e, i));
    ZPP_CHECK(engine_reduce_finish_all(e));
    if (e->vec.grads) ZPP_CHECK(engine_vec_reduce_grads(e));
    if (zpp_fault_fires(&e->fault, ZPP_FAULT_NONFINITE, e->step + 1, e->topo->world_rank,
                        e->topo->world_size)) {
        unsigned char nan[sizeof(float)]; /* a NaN in the accumulator's dtype */
        zpp_store_f32(nan, e->grad_dtype, 0, NAN);
        for (int i = 0; i < e->model->n_units; i++)
            if (e->units[i].part.shard_len) {
                ZPP_CHECK(zpp_device_copy(e->dev, e->units[i].grad_acc, nan,
                                          engine_grad_bytes(e, 1)));
                break;
            }
    }
    return ZPP_OK;
}

/* The sum of squares of this rank's shards of every unit, the masters or
 * the gradients (in grad_dtype): each unit's in double, added in unit
 * order. Every unit's sum is queued before the one wait for the device. */
static zpp_status shards_sumsq(zpp_engine *e, int masters, double *sq_p) {
    const int n = e->model->n_units;
    const void **x = calloc((size_t)n, sizeof *x);
    size_t *len = calloc((size_t)n, sizeof *len);
    double *s = calloc((size_t)n, sizeof *s);
    zpp_status st = ZPP_OK;
    if (!x || !len || !s) {
        st = zpp_error(ZPP_ERR_NOMEM, "engine: out of host memory for a norm");
        goto out;
    }
    if (masters && e->units[0].master_lo) { /* split masters, joined a piece at a time */
        double sq = 0.0;
        for (int i = 0; i < n && st == ZPP_OK; i++) st = engine_master_sumsq(e, i, &s[i]);
        for (int i = 0; i < n; i++) sq += s[i];
        *sq_p = sq;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        x[i] = masters ? (const void *)e->units[i].master : e->units[i].grad_acc;
        len[i] = e->units[i].part.shard_len;
    }
    ZPP_CHECK_GOTO(zpp_device_sumsq_many(e->dev, x, len, n, masters ? ZPP_FP32 : e->grad_dtype, s),
                   st, out);
    double sq = 0.0;
    for (int i = 0; i < n; i++) sq += s[i];
    *sq_p = sq;
out:
    free(x);
    free(len);
    free(s);
    return st;
}

/* Global gradient norm: ||g|| = sqrt(sum over ranks of each shard's sum of
 * squares), since the shards are disjoint and their padding is zero. Each
 * rank sums its units in double, rounds once to float, and the all-reduce
 * adds the ranks; the loss rides along in the same all-reduce, so on return
 * sums[0] is the world's sum of squares and sums[1] the world's loss sum.
 * Non-finite values met by a quantizer since the last step (device.h; the
 * engine is the flag's one reader) make this rank's sum infinite, so the
 * all-reduce carries the flag to every rank at no extra bytes and all skip
 * the step together, before any weight changes. */
static zpp_status step_global_sumsq(zpp_engine *e, float loss, float sums[2]) {
    double sq = 0.0;
    ZPP_CHECK(shards_sumsq(e, 0, &sq));
    int raised = 0;
    ZPP_CHECK(zpp_device_nonfinite_take(e->dev, &raised));
    if (raised) sq = INFINITY;
    sums[0] = (float)sq;
    sums[1] = loss;
    return engine_coll_allreduce(e, sums, 2);
}

/* Zeroes every unit's accumulated gradient shard for the next step. */
static zpp_status zero_grads(zpp_engine *e) {
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        ZPP_CHECK(zpp_device_set(e->dev, u->grad_acc, 0, engine_grad_bytes(e, u->part.shard_len)));
    }
    return ZPP_OK;
}

/* The loss scaler after an overflow (DeepSpeed's DynamicLossScaler): with
 * hysteresis h, the scale halves (never below min_loss_scale) at the h-th
 * overflow since it last grew; earlier ones only spend hysteresis. */
static void scaler_on_overflow(zpp_engine *e) {
    if (!e->dynamic) return;
    if (e->opts.hysteresis == 1 || e->hyst == 1)
        e->scale = fmaxf(e->scale * 0.5f, e->opts.min_loss_scale);
    else
        e->hyst--;
    e->last_overflow = e->iter;
}

/* The loss scaler after an update: hysteresis refills (every update when
 * consecutive_hysteresis, else when the scale grows), and the scale doubles
 * after loss_scale_window iterations without an overflow. */
static void scaler_on_update(zpp_engine *e) {
    if (!e->dynamic) return;
    if (e->opts.consecutive_hysteresis) e->hyst = e->opts.hysteresis;
    if ((e->iter - e->last_overflow) % e->opts.loss_scale_window == 0) {
        if (!e->opts.consecutive_hysteresis) e->hyst = e->opts.hysteresis;
        e->scale *= 2.0f;
    }
}

/* A skipped step: no update, moments and bias-correction step untouched,
 * weights (and so the hpZ secondary shards) unchanged; the gradients are
 * thrown away. An overflow the scaler answers by lowering the scale is not
 * counted; a static scale, or a dynamic one at its floor, is, and
 * max_consecutive_skips counted skips in a row end training with
 * ZPP_ERR_NONFINITE. */
static zpp_status step_skip(zpp_engine *e) {
    ZPP_CHECK(zero_grads(e));
    e->skipped_total++;
    const int counted = !e->dynamic || e->scale <= e->opts.min_loss_scale;
    scaler_on_overflow(e);
    if (!counted) return ZPP_OK;
    if (e->consec++ == 0) e->consec_first = e->step;
    if (e->consec < e->opts.max_consecutive_skips) return ZPP_OK;
    e->forward_ready = 0;
    e->volume_fresh = 0;
    if (e->consec == 1)
        return zpp_error(ZPP_ERR_NONFINITE,
                         "engine: non-finite gradient (NaN or Inf) at step %d, "
                         "step skipped and max_consecutive_skips (1) reached; "
                         "lower the learning rate (resume from the last "
                         "checkpoint) or check the data and initialisation",
                         e->step);
    return zpp_error(ZPP_ERR_NONFINITE,
                     "engine: non-finite gradients (NaN or Inf) at steps %d-%d: %d "
                     "consecutive steps skipped (zeropp.max_consecutive_skips); "
                     "lower the learning rate (resume from the last checkpoint) "
                     "or check the data and initialisation",
                     e->consec_first, e->step, e->consec);
}

/* An update: clipping as torch.nn.utils.clip_grad_norm_, coefficient
 * grad_clip / (norm + 1e-6) applied only when below 1 (the 1e-6 keeps a zero
 * norm finite), with `norm` the unscaled norm. The gradients still carry the
 * loss scale, so AdamW's grad_scale is clip / used_scale. AdamW's bias
 * correction divides the moments by 1 - beta^t with t = `updates`, the
 * updates taken (skipped steps excluded). */
static zpp_status step_update(zpp_engine *e, float lr, float norm, float used_scale) {
    e->consec = 0;
    float scale = 1.0f;
    if (e->opts.grad_clip > 0.0f) {
        const float coef = e->opts.grad_clip / (norm + 1e-6f);
        if (coef < 1.0f) scale = coef;
    }
    if (used_scale != 1.0f) scale /= used_scale;
    e->updates++;
    /* clear_grad: AdamW leaves the accumulators zeroed for the next step,
     * unless the next backward writes over them (engine_internal.h,
     * overwrites; model.h, overwrite_grads) */
    zpp_adamw_args aw = {.lr = lr, .beta1 = e->opts.beta1, .beta2 = e->opts.beta2,
                         .eps = e->opts.eps, .weight_decay = e->opts.weight_decay,
                         .grad_scale = scale, .step = e->updates, .clear_grad = !e->overwrites};
    for (int i = 0; i < e->model->n_units; i++) {
        ZPP_CHECK(adamw_unit(e, i, &aw));
        /* The weights changed: the secondary copy is stale (the resident
         * one was written with them). */
        e->units[i].secondary_valid = 0;
    }
    e->vec.weights_fresh = 0;
    e->grads_stale = e->overwrites;
    scaler_on_update(e);
    return ZPP_OK;
}

/* Closes the step's profile window (opts.profile) into `r`: the stream's
 * time, the part of it spent waiting on communication, and the rest. */
static zpp_status step_profile(zpp_engine *e, zpp_engine_profile *r) {
    zpp_device_profile p;
    ZPP_CHECK(zpp_device_profile_end(e->dev, &p));
    r->valid = 1;
    r->stream_ms = p.total_ms;
    r->exposed_comm_ms = p.stalled_ms;
    /* (the waits lie inside the window; the max only absorbs the events'
     * rounding) */
    r->compute_ms = p.total_ms > p.stalled_ms ? p.total_ms - p.stalled_ms : 0.0;
    r->waits = p.stalls;
    return ZPP_OK;
}

/* ZPP_PARAM_SUMSQ: the world's sum of squares of the masters (each rank's
 * shards in double, rounded once to float, then all-reduced). */
static zpp_status step_param_sumsq(zpp_engine *e, double *sumsq_p) {
    double ps = 0.0;
    ZPP_CHECK(shards_sumsq(e, 1, &ps));
    float pf = (float)ps;
    ZPP_CHECK(engine_coll_allreduce(e, &pf, 1));
    *sumsq_p = pf;
    return ZPP_OK;
}

zpp_status zpp_engine_update_with_stats(zpp_engine *e, float lr, float loss,
                                        zpp_engine_update_stats *stats_p) {
    /* Nothing to clean up on failure: each piece returns at once. */
    ZPP_CHECK(step_settle_gradients(e));
    float sums[2];
    ZPP_CHECK(step_global_sumsq(e, loss, sums));
    /* The gradients carry the loss scale: the norm and clipping are of the
     * unscaled gradients. */
    const float used_scale = e->scale;
    float norm = sqrtf(sums[0]);
    const int overflow = !isfinite(norm);
    if (!overflow && used_scale != 1.0f) norm /= used_scale;
    e->step++;
    ZPP_CHECK(overflow ? step_skip(e) : step_update(e, lr, norm, used_scale));
    if (e->dynamic) e->iter++;
    /* Error feedback restarts every loco_reset_T steps, and after a skipped
     * step (its gradient was thrown away, and so is what it left behind). */
    if (e->opts.loco && (overflow || e->step % e->opts.loco_reset_T == 0))
        ZPP_CHECK(zpp_engine_loco_clear(e));
    e->forward_ready = 0;
    e->volume_fresh = 0;
    zpp_engine_update_stats stats = {0};
    stats.loss = sums[1] / (float)e->topo->world_size;
    stats.grad_norm = norm;
    stats.lr = lr;
    stats.volume = *zpp_coll_volume(e->coll);
    stats.skipped = overflow;
    stats.skipped_total = e->skipped_total;
    stats.loss_scale = used_scale;
    stats.param_sumsq = NAN;
    if (e->opts.profile) ZPP_CHECK(step_profile(e, &stats.profile));
    if (e->param_sumsq && stats_p) ZPP_CHECK(step_param_sumsq(e, &stats.param_sumsq));
    if (stats_p) *stats_p = stats;
    return ZPP_OK;
}

float zpp_engine_loss_scale(const zpp_engine *e) { return e->scale; }
