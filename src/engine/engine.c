/* engine/engine.c — the ZeRO-3 schedule: create and destroy, gather,
 * compute, release, reduce, forward and backward, and evaluation. The
 * units' memory is in units.c, the full-precision vectors in vectors.c, the
 * optimizer step in step.c, checkpoint access in state.c
 * (engine_internal.h). See engine.h for the schedule. */
#include "engine/engine_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"
#include "core/fault.h"
#include "device/device.h"

/* Completing a collective, and the norm's all-reduce, are where the host
 * backend's calling thread, its compute stream, blocks on its peers: a
 * profile brackets them there (device.h). On a GPU these calls only order
 * the compute stream after the communication stream, and the device times
 * the stream's waits itself; the brackets do nothing. */
static zpp_status coll_finish(zpp_engine *e, zpp_coll_op *op) {
    zpp_device_host_wait_begin(e->dev);
    zpp_status st = zpp_coll_finish(e->coll, op);
    zpp_device_host_wait_end(e->dev);
    return st;
}

zpp_status engine_coll_allreduce(zpp_engine *e, float *host_values, size_t n) {
    zpp_device_host_wait_begin(e->dev);
    zpp_status st = zpp_coll_allreduce_sum(e->coll, host_values, n);
    zpp_device_host_wait_end(e->dev);
    return st;
}

zpp_status zpp_engine_create_with_opts(zpp_topo *topo, zpp_model *model,
                                       const zpp_engine_opts *opts, zpp_device *dev,
                                       zpp_engine **engine_p) {
    if (!topo || !model || !opts || !engine_p)
        return zpp_error(ZPP_ERR_INVALID, "engine: topology, model, options and engine_p are "
                                          "required");
    if (!dev)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: no device; create one with zpp_device_create_host or "
                         "zpp_device_create_gpu");
    ZPP_CHECK(zpp_engine_opts_check(opts)); /* engine/options.h */
    zpp_fault fault;
    ZPP_CHECK(zpp_fault_from_env(&fault));
    if (model->param_dtype != opts->work_dtype)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: the model takes %s parameters but the engine works in %s",
                         zpp_dtype_name(model->param_dtype), zpp_dtype_name(opts->work_dtype));
    if (model->mem != topo->world->mem || dev->mem != model->mem)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: the model's, the device's and the communication backend's "
                         "memory differ (host model with NCCL, or GPU model with MPI); create "
                         "model and topology for the same device");
    zpp_engine *e = calloc(1, sizeof *e);
    if (!e) return zpp_error(ZPP_ERR_NOMEM, "engine: out of memory");
    e->topo = topo;
    e->model = model;
    e->opts = *opts;
    e->dev = dev;
    e->fault = fault;
    const char *psum = zpp_env_get(ZPP_ENV_PARAM_SUMSQ);
    e->param_sumsq = psum && !strcmp(psum, "1");
    e->dynamic = opts->loss_scale == 0.0f;
    e->scale = e->dynamic ? ldexpf(1.0f, opts->initial_scale_power) : opts->loss_scale;
    e->hyst = opts->hysteresis;
    e->last_overflow = -1;
    zpp_status st;
    ZPP_CHECK_GOTO(zpp_coll_create(topo, &opts->coll, dev, &e->coll), st, fail);
    e->units = calloc((size_t)model->n_units, sizeof *e->units);
    if (!e->units) {
        st = zpp_error(ZPP_ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    for (int i = 0; i < model->n_units; i++) {
        unit_state *u = &e->units[i];
        u->part = zpp_partition_make(model->unit_numel[i], topo);
        u->first_stage = -1;
    }
    for (int s = 0; s < model->n_stages; s++) {
        unit_state *u = &e->units[model->stage_unit[s]];
        if (u->first_stage < 0) u->first_stage = s;
    }
    ZPP_CHECK_GOTO(engine_grad_mode(e), st, fail);
    ZPP_CHECK_GOTO(engine_units_alloc(e), st, fail);
    ZPP_CHECK_GOTO(engine_vec_create(e), st, fail);
    *engine_p = e;
    return ZPP_OK;
fail:
    zpp_engine_destroy(e);
    return st;
}

void zpp_engine_destroy(zpp_engine *e) {
    if (!e) return;
    zpp_error_hold(); /* teardown after a failure keeps its message */
    if (e->units) {
        for (int i = 0; i < e->model->n_units; i++) {
            unit_state *u = &e->units[i];
            if (u->gather_op) zpp_coll_finish(e->coll, u->gather_op);
            if (u->full != u->resident) zpp_device_scratch_put(e->dev, u->full);
            zpp_device_scratch_put(e->dev, u->grad_full);
        }
        engine_units_free(e);
    }
    for (int k = 0; k < e->n_reductions; k++) {
        zpp_coll_finish(e->coll, e->reductions[k].op);
        zpp_device_scratch_put(e->dev, e->reductions[k].in);
        zpp_device_scratch_put(e->dev, e->reductions[k].out);
    }
    engine_vec_destroy(e);
    free(e->units);
    zpp_coll_destroy(e->coll);
    free(e);
    zpp_error_release();
}

/* ---- Gathers ------------------------------------------------------------- */

/* A backward gather with hpZ: from the secondary shards inside the node,
 * which hold what the forward's gather brought; an invalid one is an
 * error, never stale weights. */
static zpp_status gather_from_secondary(zpp_engine *e, int ui, zpp_phase phase) {
    unit_state *u = &e->units[ui];
    u->gather_int8 = e->opts.gather == ZPP_GATHER_QWZ;
    if (!u->secondary_valid)
        return zpp_error(ZPP_ERR_STATE,
                         "hpZ: the secondary shard of unit %d is invalid (the optimizer step "
                         "replaced the weights since the forward gather); run a forward pass "
                         "before the backward",
                         ui);
    return zpp_coll_gather_secondary_start(e->coll, &u->part, e->opts.work_dtype, u->secondary,
                                           u->full, phase, &u->gather_op);
}

/* Every other gather: from the masters, by the configured path (a forward
 * gather with hpZ also refreshes the secondary shard). */
static zpp_status gather_from_master(zpp_engine *e, int ui, zpp_phase phase) {
    unit_state *u = &e->units[ui];
    /* Past world 1 no working-dtype copy of the shard is kept (2 bytes a
     * parameter a rank; world 1's resident copy is units.c's): the fp32
     * master, rounded into this rank's block of the gathered buffer, is
     * the gather's input, in place. The rounding is the one AdamW's
     * working copy had, so the gathered weights are the same bits. */
    /* An evaluation gathers the weights exactly, in the working dtype:
     * the model it scores is the one training holds (the fp32 master, as
     * a checkpoint saves it, rounded to bf16), not qwZ's int8 rendering
     * of it; and it leaves the hpZ secondary shards alone (no backward
     * follows it). It costs ZeRO-3's bytes, on evaluations only. */
    const zpp_gather_mode mode = e->evaluating ? ZPP_GATHER_BASELINE : e->opts.gather;
    u->gather_int8 = mode == ZPP_GATHER_QWZ;
    void *sec = (e->opts.hpz && phase == ZPP_PHASE_FWD_GATHER && !e->evaluating) ? u->secondary
                                                                                 : NULL;
    const size_t own_offset = (size_t)e->topo->world_rank * u->part.shard_len;
    void *own = (char *)u->full + own_offset * zpp_dtype_size(e->opts.work_dtype);
    ZPP_CHECK(engine_round_masters(e, u->master, own, u->part.shard_len));
    if (u->gather_int8 && e->vec.weights) ZPP_CHECK(engine_vec_zero_own(e, ui, own));
    ZPP_CHECK(zpp_coll_gather_start(e->coll, &u->part, mode, e->opts.work_dtype, own, u->full, sec,
                                    phase, &u->gather_op));
    if (sec) u->secondary_valid = 1;
    return ZPP_OK;
}

/* Starts gathering unit `ui` if it is neither gathered nor on its way, into
 * a scratch buffer that goes back to the pool if the start fails (at world
 * 1 with resident weights, the resident copy instead). */
static zpp_status gather_start(zpp_engine *e, int ui, zpp_phase phase) {
    unit_state *u = &e->units[ui];
    if (u->full) return ZPP_OK;
    if (u->resident) return engine_resident_use(e, ui);
    /* The vectors' copy a gather through int8 will read: refreshed once
     * after the weights change, before the first such gather. */
    if (e->vec.weights && !e->vec.weights_fresh && !e->evaluating) ZPP_CHECK(engine_vec_refresh(e));
    ZPP_CHECK(zpp_device_scratch_get(e->dev, engine_work_bytes(e, u), &u->full));
    const zpp_status st = phase == ZPP_PHASE_BWD_GATHER && e->opts.hpz
                              ? gather_from_secondary(e, ui, phase)
                              : gather_from_master(e, ui, phase);
    if (st != ZPP_OK) {
        zpp_device_scratch_put(e->dev, u->full);
        u->full = NULL;
    }
    return st;
}

/* Makes unit `ui` usable: starts its gather if needed and completes it. */
static zpp_status gather_wait(zpp_engine *e, int ui, zpp_phase phase) {
    unit_state *u = &e->units[ui];
    ZPP_CHECK(gather_start(e, ui, phase));
    if (u->gather_op) {
        zpp_coll_op *op = u->gather_op;
        u->gather_op = NULL;
        ZPP_CHECK(coll_finish(e, op));
        if (u->gather_int8 && e->vec.weights) ZPP_CHECK(engine_vec_set_gathered(e, ui));
    }
    return ZPP_OK;
}

zpp_status engine_release(zpp_engine *e, int ui) {
    unit_state *u = &e->units[ui];
    if (u->gather_op) {
        zpp_coll_op *op = u->gather_op;
        u->gather_op = NULL;
        ZPP_CHECK(coll_finish(e, op));
    }
    if (u->full != u->resident) zpp_device_scratch_put(e->dev, u->full);
    u->full = NULL;
    return ZPP_OK;
}

/* ---- Gradient reduction --------------------------------------------------- */
/* On a GPU the reductions run on a communication stream of their own,
 * concurrently with the gathers (comm_nccl.c). Scratch stays safe across
 * the two because every buffer an exchange touches goes back to the pool
 * only after that exchange is completed (coll_finish before each put here
 * and in release; a grad_full put right after its conversion was read only
 * by that kernel, on the compute stream): collectives.c, "Scratch across
 * the streams". */

/* Completes the oldest reduction in flight and adds its averaged shard into
 * the unit's accumulator. Reductions complete in the order they started, so
 * the sums (and the bits) do not depend on opts.reduce_depth. */
static zpp_status reduce_finish_oldest(zpp_engine *e) {
    if (e->n_reductions == 0) return ZPP_OK;
    struct reduction r = e->reductions[0];
    e->n_reductions--;
    memmove(&e->reductions[0], &e->reductions[1], (size_t)e->n_reductions * sizeof r);
    unit_state *u = &e->units[r.unit];
    zpp_status st = coll_finish(e, r.op);
    /* (world > 1: the accumulator is fp32, engine_grad_mode) */
    if (st == ZPP_OK) st = zpp_device_add(e->dev, (float *)u->grad_acc, r.out, u->part.shard_len);
    zpp_device_scratch_put(e->dev, r.in);
    zpp_device_scratch_put(e->dev, r.out);
    return st;
}

zpp_status engine_reduce_finish_all(zpp_engine *e) {
    zpp_status st = ZPP_OK;
    while (e->n_reductions) {
        /* after a failure the rest is cleanup: the first message stays */
        if (st != ZPP_OK) zpp_error_hold();
        zpp_status r = reduce_finish_oldest(e);
        if (st != ZPP_OK) zpp_error_release();
        if (st == ZPP_OK) st = r;
    }
    return st;
}

/* Starts reducing unit ui's full gradient. Up to opts.reduce_depth
 * reductions are in flight: with one, the next cannot be handed to the
 * link before the previous has come back and been added (a gap on the link
 * for every unit); with two, it waits on the link behind the one in flight.
 * The fp32 gradient is rounded to the working dtype for the wire (bf16
 * halves the bytes; qgZ quantizes from it). */
static zpp_status reduce_start(zpp_engine *e, int ui) {
    unit_state *u = &e->units[ui];
    if (e->n_reductions >= e->opts.reduce_depth) ZPP_CHECK(reduce_finish_oldest(e));
    struct reduction r = {NULL, ui, NULL, NULL};
    if (e->vec.grads) ZPP_CHECK(engine_vec_take_grads(e, ui));
    zpp_status st = ZPP_OK;
    ZPP_CHECK_GOTO(
        zpp_device_scratch_get(e->dev, u->part.shard_len * sizeof(float), (void **)&r.out), st,
        fail);
    if (e->opts.work_dtype != ZPP_FP32) {
        ZPP_CHECK_GOTO(zpp_device_scratch_get(e->dev, engine_work_bytes(e, u), &r.in), st, fail);
        ZPP_CHECK_GOTO(zpp_device_convert(e->dev, u->grad_full, ZPP_FP32, r.in,
                                          e->opts.work_dtype, u->part.padded, 1.0f),
                       st, fail);
        /* Once converted the full gradient is not needed (that kernel, on
         * the compute stream, was its one reader). */
        zpp_device_scratch_put(e->dev, u->grad_full);
    } else {
        r.in = u->grad_full; /* fp32: the reduction reads it directly */
    }
    u->grad_full = NULL;
    zpp_qgz_feedback fb = {u->ef_intra, u->ef_inter, e->opts.loco_err_beta};
    ZPP_CHECK_GOTO(zpp_coll_reduce_start_ef(e->coll, &u->part, e->opts.reduce, e->opts.work_dtype,
                                            r.in, r.out, u->ef_intra ? &fb : NULL, &r.op),
                   st, fail);
    e->reductions[e->n_reductions++] = r;
    return ZPP_OK;
fail:
    /* the full gradient, while the unit still holds it, is drain()'s to free */
    if (r.in != u->grad_full) zpp_device_scratch_put(e->dev, r.in);
    zpp_device_scratch_put(e->dev, r.out);
    return st;
}

/* ---- Forward and backward -------------------------------------------------- */

/* Does stage s's backward read its unit's parameters? (GPT-2's embedding
 * stage does not: its unit, the largest, is then not gathered again.) */
static int bwd_reads(const zpp_model *m, int s) {
    return !m->bwd_reads_params || m->bwd_reads_params[s];
}

/* The stage at place `pos` of the order in which a step uses parameters:
 * the forward's stages 0..S-1, then, when a backward follows, the
 * backward's stages S-1..0 (stage s at place s in the forward, 2S-1-s in
 * the backward; the caller passes over backward stages that read no
 * parameters); -1 past the end. */
static int use_at(const zpp_model *m, int pos, int with_backward) {
    const int S = m->n_stages;
    if (pos < S) return pos;
    if (!with_backward || pos >= 2 * S) return -1;
    return 2 * S - 1 - pos;
}

/* Whether the unit of the stage at place `pos` of the use order should stay
 * gathered for its next use, DeepSpeed's reuse rule: yes when that use
 * comes before max_reuse_distance parameters of other units have been
 * gathered in between. Backward stages that read no parameters neither use
 * the unit nor count. GPT-2's unit 0 (embeddings, tied to the head) thus
 * stays from the embedding stage to the head instead of being gathered
 * twice; and the last blocks of the forward stay for their backward, as
 * DeepSpeed's trace-driven release keeps them (its default distance, 1e9
 * parameters, keeps GPT 1.31B's last 8 blocks: a third fewer backward
 * gathers on the link). The rule looks across into the backward only when
 * one follows and a gather moves bytes (world > 1): at world 1 keeping a
 * unit would cost memory and save one dtype conversion. */
static int reused_soon(const zpp_engine *e, int pos, int with_backward) {
    const zpp_model *m = e->model;
    const int S = m->n_stages;
    with_backward = with_backward && e->topo->world_size > 1;
    const int ui = m->stage_unit[use_at(m, pos, 1)];
    size_t between = 0;
    for (int p = pos + 1;; p++) {
        const int t = use_at(m, p, with_backward || pos >= S);
        if (t < 0) return 0;
        if (p >= S && !bwd_reads(m, t)) continue;
        const int ut = m->stage_unit[t];
        if (ut == ui) return 1;
        between += m->unit_numel[ut];
        if (between > e->opts.max_reuse_distance) return 0;
    }
}

/* A forward; with_backward says whether this step's backward follows (not
 * in an evaluation), so that the units it will need first can stay. */
static zpp_status forward(zpp_engine *e, float *loss_p, int with_backward) {
    zpp_model *m = e->model;
    const int S = m->n_stages;
    for (int s = 0; s < S; s++) {
        int ui = m->stage_unit[s];
        ZPP_CHECK(gather_wait(e, ui, ZPP_PHASE_FWD_GATHER));
        /* Prefetch: the next stages' units travel while this one computes.
         * Two ahead keep the link busy: a gather's inputs are prepared on the
         * compute stream, so with one ahead the next could not start before
         * the compute stream had waited for the one in flight. */
        for (int k = 1; k <= e->opts.prefetch_depth && s + k < S; k++)
            ZPP_CHECK(gather_start(e, m->stage_unit[s + k], ZPP_PHASE_FWD_GATHER));
        ZPP_CHECK(m->ops->forward(m, s, e->units[ui].full));
        /* Release unless a later use comes soon; the last stage's unit
         * always stays for the first backward stage (or the caller's
         * release after an evaluation). */
        if (s + 1 < S && !reused_soon(e, s, with_backward)) ZPP_CHECK(engine_release(e, ui));
    }
    *loss_p = m->ops->loss(m);
    return ZPP_OK;
}

static zpp_status backward(zpp_engine *e, float loss_scale) {
    zpp_model *m = e->model;
    const int S = m->n_stages;
    /* at world 1, the update left stale sums in the accumulators (step.c) */
    if (e->overwrites && e->grads_stale) ZPP_CHECK(m->ops->overwrite_grads(m));
    for (int s = S - 1; s >= 0; s--) {
        int ui = m->stage_unit[s];
        unit_state *u = &e->units[ui];
        const int reads = bwd_reads(m, s);
        if (reads) ZPP_CHECK(gather_wait(e, ui, ZPP_PHASE_BWD_GATHER));
        /* Prefetch the next prefetch_depth units that are not resident:
         * units kept from the forward (complete, no gather in flight) are
         * passed over, so the gathers behind them start at once. */
        for (int k = 1, t = s - 1; k <= e->opts.prefetch_depth && t >= 0; t--) {
            if (!bwd_reads(m, t)) continue; /* gathers nothing: not counted */
            const unit_state *ut = &e->units[m->stage_unit[t]];
            if (ut->full && !ut->gather_op) continue;
            ZPP_CHECK(gather_start(e, m->stage_unit[t], ZPP_PHASE_BWD_GATHER));
            k++;
        }
        if (!u->grad_full && !engine_alone(e)) {
            ZPP_CHECK(zpp_device_scratch_get(e->dev, u->part.padded * sizeof(float),
                                             (void **)&u->grad_full));
            ZPP_CHECK(zpp_device_set(e->dev, u->grad_full, 0, u->part.padded * sizeof(float)));
        }
        /* at world 1 the model adds straight into the sum, in grad_dtype */
        void *grads = engine_alone(e) ? u->grad_acc : (void *)u->grad_full;
        ZPP_CHECK(m->ops->backward(m, s, reads ? u->full : NULL, grads, loss_scale));
        if (s == u->first_stage) {
            ZPP_CHECK(engine_release(e, ui));
            if (!engine_alone(e)) ZPP_CHECK(reduce_start(e, ui));
        } else if (!reused_soon(e, 2 * S - 1 - s, 0)) {
            ZPP_CHECK(engine_release(e, ui));
        }
    }
    e->grads_stale = 0; /* (a pass that failed leaves them stale: the next overwrites) */
    return engine_reduce_finish_all(e);
}

/* Releases every unit; returns st, or the first release's failure when st
 * is ZPP_OK. */
static zpp_status release_all(zpp_engine *e, zpp_status st) {
    for (int i = 0; i < e->model->n_units; i++) {
        zpp_status r = engine_release(e, i);
        if (st == ZPP_OK) st = r;
    }
    return st;
}

/* Completes whatever is in flight and drops gathered units: after an error,
 * so that the next call starts clean. */
static void drain(zpp_engine *e) {
    zpp_error_hold(); /* the error that called for it keeps its message */
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        engine_release(e, i);
        zpp_device_scratch_put(e->dev, u->grad_full);
        u->grad_full = NULL;
    }
    engine_reduce_finish_all(e);
    zpp_error_release();
}

zpp_status zpp_engine_forward(zpp_engine *e, float *loss_p) {
    /* The first forward of a step opens its accounting; the optimizer step
     * closes it. */
    if (!e->volume_fresh) {
        zpp_coll_volume_reset(e->coll);
        zpp_coll_set_round(e->coll, (uint64_t)e->step);
        if (e->opts.profile) ZPP_CHECK(zpp_device_profile_begin(e->dev));
        e->volume_fresh = 1;
    }
    e->forward_ready = 0;
    zpp_status st = forward(e, loss_p, 1);
    if (st != ZPP_OK) {
        drain(e);
        return st;
    }
    e->forward_ready = 1;
    return ZPP_OK;
}

zpp_status zpp_engine_backward(zpp_engine *e, float loss_scale) {
    if (!e->forward_ready)
        return zpp_error(ZPP_ERR_STATE,
                         "engine: backward without a forward under the current weights; run "
                         "zpp_engine_forward on the micro-batch first");
    e->forward_ready = 0;
    zpp_status st = backward(e, loss_scale);
    if (st != ZPP_OK) drain(e);
    return st;
}


zpp_status zpp_engine_evaluate_with_batch(zpp_engine *e, zpp_engine_batch_fn batch, void *ctx,
                                          float *loss_p) {
    /* The evaluation's bytes are its own (zpp_engine_eval_volume): the
     * step's counters are put back afterwards, so an evaluation between two
     * micro-batches of a step does not show in the step's bytes. */
    const zpp_volume step_volume = *zpp_coll_volume(e->coll);
    zpp_coll_volume_reset(e->coll);
    /* Units a training forward left gathered (for its backward, which the
     * evaluation cancels) hold qwZ's weights: dropped, gathered again. */
    zpp_status st = release_all(e, ZPP_OK);
    float loss = 0.0f;
    if (st != ZPP_OK) goto out;
    ZPP_CHECK_GOTO(batch(ctx, 0, e->model), st, out);
    /* Its activations are not for a backward. */
    e->forward_ready = 0;
    e->evaluating = 1;
    st = forward(e, &loss, 0);
    e->evaluating = 0;
out:
    st = release_all(e, st);
    if (st == ZPP_OK) st = engine_coll_allreduce(e, &loss, 1);
    e->eval_volume = *zpp_coll_volume(e->coll);
    zpp_coll_volume_set(e->coll, &step_volume);
    ZPP_CHECK(st);
    *loss_p = loss / (float)e->topo->world_size;
    return ZPP_OK;
}

const zpp_volume *zpp_engine_eval_volume(const zpp_engine *e) { return &e->eval_volume; }
