/* engine/step_stats.h — what one optimizer step reports (engine.h,
 * zpp_engine_optimizer_step), apart from the engine's header so that the
 * trainer, which fills one from the public zpp_update_stats
 * (train/trainer.h), and the tools that print it need no more of the
 * engine than zeropp.h. */
#ifndef ZPP_ENGINE_STEP_STATS_H
#define ZPP_ENGINE_STEP_STATS_H

#include "collectives/collectives.h"

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

typedef struct zpp_step_stats {
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
} zpp_step_stats;

#endif
