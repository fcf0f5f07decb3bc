/* engine/state.c — what a checkpoint saves and restores: each rank's
 * shard range, its masters and AdamW moments, the step and scaler
 * counters, and the LoCo error-feedback buffers. */
#include <math.h>

#include "core/error.h"
#include "device/device.h"
#include "engine/engine_internal.h"

/* ---- Checkpoint state ------------------------------------------------------ */

int zpp_engine_steps_taken(const zpp_engine *e) { return e->step; }

int zpp_engine_unit_count(const zpp_engine *e) { return e->model->n_units; }

zpp_status zpp_engine_shard_range(const zpp_engine *e, int unit, size_t *numel_p,
                                  size_t *begin_p, size_t *count_p) {
    if (unit < 0 || unit >= e->model->n_units)
        return zpp_error(ZPP_ERR_INVALID, "engine: unit %d of %d", unit, e->model->n_units);
    const zpp_partition *p = &e->units[unit].part;
    size_t begin = (size_t)e->topo->world_rank * p->shard_len;
    size_t count = begin < p->numel ? p->numel - begin : 0;
    if (count > p->shard_len) count = p->shard_len;
    if (begin > p->numel) begin = p->numel;
    *numel_p = p->numel;
    *begin_p = begin;
    *count_p = count;
    return ZPP_OK;
}

zpp_status zpp_engine_state_get(zpp_engine *e, int unit, float *master, float *m, float *v) {
    size_t numel = 0, begin = 0, count = 0;
    ZPP_CHECK(zpp_engine_shard_range(e, unit, &numel, &begin, &count));
    unit_state *u = &e->units[unit];
    if (!count) return ZPP_OK;
    ZPP_CHECK(engine_master_get(e, unit, 0, count, master)); /* fp32, or joined (units.c) */
    ZPP_CHECK(zpp_device_copy(e->dev, m, u->m, count * sizeof(float)));
    return zpp_device_copy(e->dev, v, u->v, count * sizeof(float));
}

zpp_status zpp_engine_state_set(zpp_engine *e, int unit, const float *master, const float *m,
                                const float *v) {
    size_t numel = 0, begin = 0, count = 0;
    ZPP_CHECK(zpp_engine_shard_range(e, unit, &numel, &begin, &count));
    unit_state *u = &e->units[unit];
    const size_t len = u->part.shard_len;
    /* the padding stays zero, whatever the shards were before */
    if (count) ZPP_CHECK(engine_master_set(e, unit, 0, count, master));
    if (count < len) ZPP_CHECK(engine_master_zero(e, unit, count, len - count));
    float *const dst[2] = {u->m, u->v};
    const float *const src[2] = {m, v};
    for (int k = 0; k < 2; k++) {
        if (count) ZPP_CHECK(zpp_device_copy(e->dev, dst[k], src[k], count * sizeof(float)));
        if (count < len)
            ZPP_CHECK(zpp_device_set(e->dev, dst[k] + count, 0, (len - count) * sizeof(float)));
    }
    ZPP_CHECK(zpp_device_set(e->dev, u->grad_acc, 0, engine_grad_bytes(e, len)));
    u->secondary_valid = 0;
    e->vec.weights_fresh = 0;
    e->forward_ready = 0;
    return ZPP_OK;
}

zpp_engine_counters zpp_engine_counters_get(const zpp_engine *e) {
    zpp_engine_counters c = {e->step, e->updates, e->skipped_total, e->scale,
                             e->hyst,  e->iter,    e->last_overflow};
    return c;
}

zpp_status zpp_engine_counters_set(zpp_engine *e, const zpp_engine_counters *c) {
    if (c->step < 0 || c->updates < 0 || c->skipped_total < 0 || c->updates > c->step ||
        c->skipped_total > c->step || !(c->loss_scale > 0.0f) || !isfinite(c->loss_scale) ||
        c->scaler_hysteresis < 0 || c->scaler_iter < 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: counters that no run can reach (step %d, updates %d, skipped "
                         "%d, loss scale %g); the checkpoint is damaged",
                         c->step, c->updates, c->skipped_total, (double)c->loss_scale);
    e->step = c->step;
    e->updates = c->updates;
    e->skipped_total = c->skipped_total;
    e->consec = 0;
    /* A static scale comes from this run's config, a dynamic one from the
     * saved scaler. */
    if (e->dynamic) {
        e->scale = c->loss_scale;
        e->hyst = c->scaler_hysteresis;
        e->iter = c->scaler_iter;
        e->last_overflow = c->scaler_last_overflow;
    }
    e->forward_ready = 0;
    return ZPP_OK;
}

/* ---- Error-feedback state ---------------------------------------------------- */

zpp_status zpp_engine_loco_lens(const zpp_engine *e, int unit, size_t *intra_p,
                                size_t *inter_p) {
    if (unit < 0 || unit >= e->model->n_units)
        return zpp_error(ZPP_ERR_INVALID, "engine: unit %d of %d", unit, e->model->n_units);
    *intra_p = e->units[unit].ef_intra ? e->units[unit].ef_intra_len : 0;
    *inter_p = e->units[unit].ef_inter ? e->units[unit].ef_inter_len : 0;
    return ZPP_OK;
}

zpp_status zpp_engine_loco_get(zpp_engine *e, int unit, float *intra, float *inter) {
    size_t li = 0, le = 0;
    ZPP_CHECK(zpp_engine_loco_lens(e, unit, &li, &le));
    if (li) ZPP_CHECK(zpp_device_copy(e->dev, intra, e->units[unit].ef_intra, li * sizeof(float)));
    if (le) ZPP_CHECK(zpp_device_copy(e->dev, inter, e->units[unit].ef_inter, le * sizeof(float)));
    return ZPP_OK;
}

zpp_status zpp_engine_loco_set(zpp_engine *e, int unit, const float *intra, const float *inter) {
    size_t li = 0, le = 0;
    ZPP_CHECK(zpp_engine_loco_lens(e, unit, &li, &le));
    if (li) ZPP_CHECK(zpp_device_copy(e->dev, e->units[unit].ef_intra, intra, li * sizeof(float)));
    if (le) ZPP_CHECK(zpp_device_copy(e->dev, e->units[unit].ef_inter, inter, le * sizeof(float)));
    return ZPP_OK;
}

zpp_status zpp_engine_loco_clear(zpp_engine *e) {
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        if (u->ef_intra)
            ZPP_CHECK(zpp_device_set(e->dev, u->ef_intra, 0, u->ef_intra_len * sizeof(float)));
        if (u->ef_inter)
            ZPP_CHECK(zpp_device_set(e->dev, u->ef_inter, 0, u->ef_inter_len * sizeof(float)));
    }
    return ZPP_OK;
}
