/* engine/vectors.c — the model's vectors (biases, norms) at full precision
 * under qwZ and qgZ (engine.h, quantize_vectors; engine_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device.h"
#include "engine/engine_internal.h"

/* ---- Vectors at full precision (engine.h, quantize_vectors) ----------------
 * A LayerNorm gain (about 1) in an int8 block of weights of std 0.02 sets
 * the block's step to 1/127 of itself, 16 times the weights' own; in an
 * int4 block of gradients, a bias's gradient (a sum over every token) can
 * round its neighbours to zero. DeepSpeed never quantizes either: 1-D
 * gradients are reduced unquantized, and small parameters persist whole.
 * Here both become one all-reduce of the packed vectors a step each. */

/* The vectors of unit ui: the gaps between its matrix ranges (at most one
 * more than the ranges; vec_create sized the array for that). */
static void vec_add_unit(zpp_engine *e, int ui) {
    const zpp_model *m = e->model;
    unit_state *u = &e->units[ui];
    vec_state *v = &e->vec;
    u->vec_first = v->n_pieces;
    size_t pos = 0;
    for (int k = 0; k <= m->n_matrix_ranges[ui]; k++) {
        const int last = k == m->n_matrix_ranges[ui];
        const size_t end = last ? m->unit_numel[ui] : m->matrix_ranges[ui][k].begin;
        if (end > pos) {
            v->pieces[v->n_pieces++] = (vec_piece){pos, end - pos, v->numel};
            v->numel += end - pos;
        }
        if (!last) pos = m->matrix_ranges[ui][k].end;
    }
    u->vec_count = v->n_pieces - u->vec_first;
}

zpp_status engine_vec_create(zpp_engine *e) {
    const zpp_engine_opts *o = &e->opts;
    const zpp_model *m = e->model;
    const int weights = o->gather == ZPP_GATHER_QWZ;
    const int grads = o->reduce == ZPP_REDUCE_QGZ && !engine_alone(e);
    if (o->quantize_vectors || !m->matrix_ranges || (!weights && !grads)) return ZPP_OK;
    vec_state *v = &e->vec;
    size_t most = 0;
    for (int i = 0; i < m->n_units; i++) most += (size_t)m->n_matrix_ranges[i] + 1;
    v->pieces = calloc(most, sizeof *v->pieces);
    if (!v->pieces) return zpp_error(ZPP_ERR_NOMEM, "engine: out of memory for vectors");
    for (int i = 0; i < m->n_units; i++) vec_add_unit(e, i);
    if (v->numel == 0) return ZPP_OK;
    if (weights)
        ZPP_CHECK(zpp_device_alloc(e->dev, v->numel * zpp_dtype_size(o->work_dtype),
                                   &v->weights));
    if (grads) {
        ZPP_CHECK(zpp_device_alloc(e->dev, v->numel * sizeof(float), (void **)&v->grads));
        ZPP_CHECK(zpp_device_set(e->dev, v->grads, 0, v->numel * sizeof(float)));
    }
    return ZPP_OK;
}

void engine_vec_destroy(zpp_engine *e) {
    zpp_device_free(e->dev, e->vec.weights);
    zpp_device_free(e->dev, e->vec.grads);
    free(e->vec.pieces);
}

/* Piece p of unit u cut to this rank's shard: unit elements [*lo, *hi)
 * (empty when *hi <= *lo); the shard starts at unit element *base. */
static void vec_own(const zpp_engine *e, const unit_state *u, const vec_piece *p, size_t *lo,
                    size_t *hi, size_t *base) {
    *base = (size_t)e->topo->world_rank * u->part.shard_len;
    *lo = p->begin > *base ? p->begin : *base;
    const size_t end = p->begin + p->len, shard_end = *base + u->part.shard_len;
    *hi = end < shard_end ? end : shard_end;
}

/* The vectors of the current masters into every rank's copy: each rank
 * writes its shards' vectors, rounded to the working dtype, into zeros, and
 * the all-reduce adds them up (x + 0 is exact in any dtype). */
zpp_status engine_vec_refresh(zpp_engine *e) {
    vec_state *v = &e->vec;
    const zpp_dtype dt = e->opts.work_dtype;
    const size_t ds = zpp_dtype_size(dt);
    ZPP_CHECK(zpp_device_set(e->dev, v->weights, 0, v->numel * ds));
    for (int i = 0; i < e->model->n_units; i++) {
        const unit_state *u = &e->units[i];
        for (int k = u->vec_first; k < u->vec_first + u->vec_count; k++) {
            const vec_piece *p = &v->pieces[k];
            size_t lo, hi, base;
            vec_own(e, u, p, &lo, &hi, &base);
            if (hi > lo)
                ZPP_CHECK(engine_round_masters(e, u->master + (lo - base),
                                               (char *)v->weights + (p->at + lo - p->begin) * ds,
                                               hi - lo));
        }
    }
    zpp_device_host_wait_begin(e->dev);
    zpp_status st = zpp_coll_allreduce_device(e->coll, v->weights, v->numel, dt,
                                              ZPP_PHASE_FWD_GATHER);
    zpp_device_host_wait_end(e->dev);
    ZPP_CHECK(st);
    v->weights_fresh = 1;
    return ZPP_OK;
}

/* Before qwZ quantizes this rank's shard of unit ui (`own`, in the working
 * dtype): zeros in place of its vectors, so that the int8 blocks are scaled
 * by the matrices' weights alone. */
zpp_status engine_vec_zero_own(zpp_engine *e, int ui, void *own) {
    const unit_state *u = &e->units[ui];
    const size_t ds = zpp_dtype_size(e->opts.work_dtype);
    for (int k = u->vec_first; k < u->vec_first + u->vec_count; k++) {
        size_t lo, hi, base;
        vec_own(e, u, &e->vec.pieces[k], &lo, &hi, &base);
        if (hi > lo) ZPP_CHECK(zpp_device_set(e->dev, (char *)own + (lo - base) * ds, 0,
                                              (hi - lo) * ds));
    }
    return ZPP_OK;
}

/* A unit gathered through int8 gets its vectors from the copy. */
zpp_status engine_vec_set_gathered(zpp_engine *e, int ui) {
    const vec_state *v = &e->vec;
    const unit_state *u = &e->units[ui];
    const size_t ds = zpp_dtype_size(e->opts.work_dtype);
    for (int k = u->vec_first; k < u->vec_first + u->vec_count; k++) {
        const vec_piece *p = &v->pieces[k];
        ZPP_CHECK(zpp_device_copy(e->dev, (char *)u->full + p->begin * ds,
                                  (const char *)v->weights + p->at * ds, p->len * ds));
    }
    return ZPP_OK;
}

/* Before qgZ quantizes unit ui's full gradient: its vectors' gradients go
 * into the step's fp32 sums, and zeros take their place (zero quantizes to
 * zero exactly, and error feedback then holds zero there too). */
zpp_status engine_vec_take_grads(zpp_engine *e, int ui) {
    const vec_state *v = &e->vec;
    const unit_state *u = &e->units[ui];
    for (int k = u->vec_first; k < u->vec_first + u->vec_count; k++) {
        const vec_piece *p = &v->pieces[k];
        ZPP_CHECK(zpp_device_add(e->dev, v->grads + p->at, u->grad_full + p->begin, p->len));
        ZPP_CHECK(zpp_device_set(e->dev, u->grad_full + p->begin, 0, p->len * sizeof(float)));
    }
    return ZPP_OK;
}

/* At the optimizer step: the vectors' gradients summed over the world,
 * averaged (the fp32 * 1/W of every reduction), and each rank's own added
 * into its shards' accumulators, where qgZ left zeros. */
zpp_status engine_vec_reduce_grads(zpp_engine *e) {
    vec_state *v = &e->vec;
    zpp_device_host_wait_begin(e->dev);
    zpp_status st = zpp_coll_allreduce_device(e->coll, v->grads, v->numel, ZPP_FP32,
                                              ZPP_PHASE_GRAD_REDUCE);
    zpp_device_host_wait_end(e->dev);
    ZPP_CHECK(st);
    ZPP_CHECK(zpp_device_convert(e->dev, v->grads, ZPP_FP32, v->grads, ZPP_FP32, v->numel,
                                 1.0f / (float)e->topo->world_size));
    for (int i = 0; i < e->model->n_units; i++) {
        unit_state *u = &e->units[i];
        for (int k = u->vec_first; k < u->vec_first + u->vec_count; k++) {
            const vec_piece *p = &v->pieces[k];
            size_t lo, hi, base;
            vec_own(e, u, p, &lo, &hi, &base);
            if (hi > lo)
                ZPP_CHECK(zpp_device_add(e->dev, (float *)u->grad_acc + (lo - base),
                                         v->grads + p->at + (lo - p->begin), hi - lo));
        }
    }
    return zpp_device_set(e->dev, v->grads, 0, v->numel * sizeof(float));
}
