/* engine/engine_internal.h — what the engine's files share, private to
 * src/engine/: the engine's structs (their layout stays out of engine.h)
 * and the few schedule helpers the step and the evaluation call.
 *   engine.c  create/destroy, the gather/release/reduce schedule,
 *             forward/backward, evaluation
 *   units.c   each unit's memory, initial values, resident weights
 *   vectors.c the full-precision vectors under qwZ and qgZ
 *   step.c    the optimizer step: norm, loss scaler, skip, clip + AdamW, stats
 *   state.c   checkpoint access: shard ranges, masters and moments,
 *             counters, LoCo error-feedback buffers */
#ifndef ZPP_ENGINE_INTERNAL_H
#define ZPP_ENGINE_INTERNAL_H

#include "core/fault.h"
#include "engine/engine.h"

/* Transient buffers (gathered units, full gradients, reduction inputs and
 * outputs) live only while a unit is in use. They come from the device's
 * scratch pool, each with the bytes of the dtype it holds, so the peak is a
 * few units in their own dtype, never the model. */

/* ---- Per-unit state -------------------------------------------------------- */
typedef struct unit_state {
    zpp_partition part;
    /* sharded, persistent */
    float *master, *m, *v; /* fp32, shard_len (master NULL where split, below) */
    /* The split master (units.c, "Split masters"): in bf16 the resident copy
     * is the master's high half, rounded (core/dtype.h, zpp_split_hi), and
     * this its low 16 bits, shard_len; together the fp32 value bit for
     * bit. NULL where the master is an fp32 array. */
    uint16_t *master_lo;
    void *grad_acc;        /* shard_len, in e->grad_dtype */
    void *secondary;                  /* hpZ: working dtype, sec_len */
    int secondary_valid;
    /* The whole unit in the working dtype, kept between steps (world 1,
     * plain gather, opts.resident_weights; else NULL): `full` points at it
     * instead of at a gathered buffer. AdamW writes it as it updates the
     * master; it is stale only after the masters were set (state.c). */
    void *resident;
    int resident_valid;
    /* transient */
    void *full;               /* gathered unit (padded, working dtype) */
    zpp_coll_op *gather_op;   /* gather in flight into `full` */
    int gather_int8;          /* it came through qwZ: its vectors to be set */
    float *grad_full;         /* fp32 full gradient during backward (world > 1) */
    int first_stage;          /* the first stage that uses this unit */
    /* qgZ error feedback (opts.loco): persistent, per rank, fp32 */
    float *ef_intra, *ef_inter;
    size_t ef_intra_len, ef_inter_len;
    int vec_first, vec_count; /* its pieces of the vectors (vec_state) */
} unit_state;

/* The model's vectors at full precision under qwZ and qgZ (engine.h,
 * quantize_vectors). Every vector range of every unit is a piece, packed
 * one after the other into buffers of `numel` elements that every rank
 * holds whole: a unit's elements [begin, begin + len) are packed elements
 * [at, at + len). */
typedef struct vec_piece {
    size_t begin, len, at;
} vec_piece;

typedef struct vec_state {
    vec_piece *pieces;
    int n_pieces;
    size_t numel;
    void *weights;     /* qwZ: the vectors in the working dtype, or NULL */
    int weights_fresh; /* they are the current masters' */
    float *grads;      /* qgZ: the step's local gradient sums, fp32, or NULL */
} vec_state;

struct zpp_engine {
    zpp_topo *topo;
    zpp_model *model;
    zpp_engine_opts opts;
    zpp_device *dev;   /* not owned */
    zpp_dtype grad_dtype; /* of every grad_acc (engine_grad_mode) */
    /* World 1 with a model that has overwrite_grads: AdamW leaves the
     * accumulators as they are (stale), and the next backward pass writes
     * over them (grads_stale). Otherwise AdamW clears them. */
    int overwrites;
    int grads_stale;
    zpp_coll *coll;
    unit_state *units;
    void *unit_slab;   /* device: every unit's persistent buffers (units.c) */
    vec_state vec;
    int step;          /* optimizer steps taken, skipped ones included */
    int updates;       /* AdamW updates: the bias-correction step */
    int skipped_total; /* steps skipped */
    int consec, consec_first; /* counted skips in a row, the first one's step */
    /* loss scaler (DeepSpeed's DynamicLossScaler when dynamic) */
    int dynamic;
    float scale;
    int hyst, iter, last_overflow;
    /* read once at create (engine.h) */
    zpp_fault fault;        /* test hook (core/fault.h): kind NONE in a release build */
    int param_sumsq;        /* ZPP_PARAM_SUMSQ=1: a monitoring stat, every build */
    int forward_ready; /* a forward ran under the current weights */
    int evaluating;    /* inside zpp_engine_evaluate_with_batch: gathers are exact (gather_start) */
    zpp_volume eval_volume; /* what the last evaluation moved (zpp_engine_evaluate_with_batch) */
    int volume_fresh;  /* the step's accounting (volume counts, profile window) is open */
    /* The reductions in flight, oldest first (at most opts.reduce_depth). */
    struct reduction {
        zpp_coll_op *op;
        int unit;
        void *in;   /* scratch holding the reduction input */
        float *out; /* scratch, shard_len fp32 */
    } reductions[ZPP_ENGINE_MAX_DEPTH];
    int n_reductions;
};

/* A world of one rank reduces nothing: the mean of one gradient is itself,
 * and nothing goes on a wire. The model's backward then adds straight into
 * the unit's fp32 accumulator (it accumulates, model.h), so no full
 * gradient, no working-dtype copy for a wire and no reduction output are
 * held: at world 1 those were the largest transients of the step (GPT
 * 1.31B's embedding unit alone held 0.4 GB of full gradient through the
 * whole backward, and 1 GB at its reduction). It is also the exact sum:
 * the gradient is not rounded to the working dtype for a wire it never
 * takes. */
static inline int engine_alone(const zpp_engine *e) { return e->topo->world_size == 1; }

/* How the gradient accumulators are kept, chosen once at create before
 * they are allocated. Their dtype: fp32, or bf16 (opts.work_grads) in a
 * world of one rank working in bf16 whose model can write it (model.h,
 * set_grad_dtype). Rounding each add once to bf16 is what a world of
 * several ranks does anyway (its gradients travel in bf16), and it saves 2
 * bytes a parameter of memory, and 2 of traffic in each of the model's
 * reads and writes of the sums and AdamW's read and clearing write. fp16
 * keeps fp32: a loss-scaled gradient summed in fp16 overflows long before
 * the fp32 sum that a wire's conversion would flag. And `overwrites`: at
 * world 1 with a model that has overwrite_grads, AdamW does not clear
 * them. */
zpp_status engine_grad_mode(zpp_engine *e);

/* Bytes of n accumulator elements. */
static inline size_t engine_grad_bytes(const zpp_engine *e, size_t n) {
    return n * zpp_dtype_size(e->grad_dtype);
}

/* Bytes of a gathered unit (and of a reduction input) in the working dtype. */
static inline size_t engine_work_bytes(const zpp_engine *e, const unit_state *u) {
    return u->part.padded * zpp_dtype_size(e->opts.work_dtype);
}

/* units.c: every unit's shards on this rank, and the resident copies
 * (opts.resident_weights) where they apply, in one allocation
 * (unit_slab), with their initial values (moments, accumulators and LoCo
 * buffers zero); frees it. */
zpp_status engine_units_alloc(zpp_engine *e);
void engine_units_free(zpp_engine *e);
/* units.c: unit ui's resident copy as its gathered unit, rounded from the
 * master if stale. */
zpp_status engine_resident_use(zpp_engine *e, int ui);
/* units.c: n elements of unit ui's master shard from element `from`, as
 * fp32, into `out` (host or device memory); set from `in`, or to +0; the
 * resident copy follows (rounded again at its next use, or, split, it is
 * the new high halves). */
zpp_status engine_master_get(zpp_engine *e, int ui, size_t from, size_t n, float *out);
zpp_status engine_master_set(zpp_engine *e, int ui, size_t from, size_t n, const float *in);
zpp_status engine_master_zero(zpp_engine *e, int ui, size_t from, size_t n);
/* units.c: the sum of squares of unit ui's master shard, in double, through
 * a staging buffer (the optimizer step's ZPP_PARAM_SUMSQ stat). */
zpp_status engine_master_sumsq(zpp_engine *e, int ui, double *sq_p);
/* units.c: n fp32 masters rounded to the working dtype (bf16: zpp_split_hi,
 * the rounding AdamW's working copy has). */
zpp_status engine_round_masters(zpp_engine *e, const float *master, void *out, size_t n);

/* vectors.c (opts.quantize_vectors off): the packed vectors' buffers; the
 * working-dtype copy refreshed from the masters after an update; zeros in
 * place of unit ui's vectors in its own block of a gather through int8
 * (`own`), and the vectors set into its gathered copy after; unit ui's
 * vector gradients taken out of its full gradient before qgZ. */
zpp_status engine_vec_create(zpp_engine *e);
void engine_vec_destroy(zpp_engine *e);
zpp_status engine_vec_refresh(zpp_engine *e);
zpp_status engine_vec_zero_own(zpp_engine *e, int ui, void *own);
zpp_status engine_vec_set_gathered(zpp_engine *e, int ui);
zpp_status engine_vec_take_grads(zpp_engine *e, int ui);

/* The all-reduce (sum) of n host floats over the world. */
zpp_status engine_coll_allreduce(zpp_engine *e, float *host_values, size_t n);
/* qgZ: sums the step's full-precision vector gradients over the world into
 * the shards. */
zpp_status engine_vec_reduce_grads(zpp_engine *e);
/* Drops unit `ui`'s gathered copy (and any gather in flight into it). */
zpp_status engine_release(zpp_engine *e, int ui);
/* Waits for every reduction in flight and adds it into its shard. */
zpp_status engine_reduce_finish_all(zpp_engine *e);

#endif
