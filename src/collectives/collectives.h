/* collectives/collectives.h — the ways ZeRO-3 and ZeRO++ move a unit.
 *
 * A unit of `numel` elements is split evenly over the world of W ranks:
 * shard_len = ceil(numel / W), the unit padded with zeros to W * shard_len,
 * and rank r owns elements [r * shard_len, (r + 1) * shard_len). Every path
 * below leaves shards in this one layout, so the optimizer never knows which
 * ran.
 *
 * Paths, per unit:
 *   gather   ZPP_GATHER_BASELINE   all-gather of working-dtype shards (world)
 *            ZPP_GATHER_QWZ        quantize own shard to int8 + scales,
 *                                  all-gather, dequantize (world)
 *            + hpz flag            also keep this rank's secondary shard: the
 *                                  1/S slice of the padded unit for its local
 *                                  index, sec_len = nodes * shard_len elements
 *   gather_secondary               hpZ backward: all-gather secondary shards
 *                                  inside the node only
 *   reduce   ZPP_REDUCE_BASELINE   reduce-scatter of the full gradient in its
 *                                  dtype over the world, then fp32 * 1/W
 *            ZPP_REDUCE_QGZ        hierarchical int4 all-to-all (see
 *                                  zpp_quant_reorder_quantize), fp32 sums in
 *                                  between, * 1/W once at the end
 * Results are averages over the world.
 *
 * Every call goes through the volume accounting below (DESIGN.md §5). */
#ifndef ZPP_COLLECTIVES_H
#define ZPP_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "zeropp.h"

typedef enum zpp_phase {
    ZPP_PHASE_FWD_GATHER = 0,
    ZPP_PHASE_BWD_GATHER = 1,
    ZPP_PHASE_GRAD_REDUCE = 2,
    ZPP_PHASE_OTHER = 3, /* norms, broadcasts */
    ZPP_PHASE_COUNT = 4
} zpp_phase;

const char *zpp_phase_name(zpp_phase phase);

/* Bytes per node, summed since the last reset (DESIGN.md §5). */
typedef struct zpp_volume {
    double cross_node_bytes[ZPP_PHASE_COUNT];
    double intra_node_bytes[ZPP_PHASE_COUNT];
    double payload_bytes[ZPP_PHASE_COUNT]; /* bytes this rank handed the backend */
    uint64_t calls[ZPP_PHASE_COUNT];
} zpp_volume;

double zpp_volume_cross_total(const zpp_volume *v);
double zpp_volume_intra_total(const zpp_volume *v);

typedef struct zpp_partition {
    size_t numel;     /* unit elements */
    size_t shard_len; /* ceil(numel / world) */
    size_t padded;    /* world * shard_len */
    size_t sec_len;   /* nodes * shard_len: the hpZ secondary shard */
} zpp_partition;

zpp_partition zpp_partition_make(size_t numel, const zpp_topo *topo);

typedef enum zpp_gather_mode { ZPP_GATHER_BASELINE = 0, ZPP_GATHER_QWZ = 1 } zpp_gather_mode;
typedef enum zpp_reduce_mode { ZPP_REDUCE_BASELINE = 0, ZPP_REDUCE_QGZ = 1 } zpp_reduce_mode;

typedef struct zpp_coll_opts {
    zpp_quant_spec weight_spec;   /* qwZ: int8, default block */
    zpp_quant_spec grad_spec;     /* qgZ: int4, default block */
} zpp_coll_opts;

typedef struct zpp_coll zpp_coll;
typedef struct zpp_coll_op zpp_coll_op;

/* `stream` (cudaStream_t) is the compute stream kernels are enqueued on for
 * device memory; NULL for host. */
zpp_status zpp_coll_create(zpp_topo *topo, const zpp_coll_opts *opts, void *stream,
                           zpp_coll **coll_p);
void zpp_coll_destroy(zpp_coll *c);

/* Starts gathering a unit: `shard` (shard_len elements of dtype) from every
 * rank into `full` (padded elements). If `secondary` is not NULL (hpZ), it
 * receives this rank's secondary shard (sec_len elements) when the gather
 * finishes. Accounted under `phase`. */
zpp_status zpp_coll_gather_start(zpp_coll *c, const zpp_partition *p, zpp_gather_mode mode,
                                 zpp_dtype dtype, const void *shard, void *full,
                                 void *secondary, zpp_phase phase, zpp_coll_op **op_p);
/* hpZ backward: all-gather of secondary shards inside the node into `full`. */
zpp_status zpp_coll_gather_secondary_start(zpp_coll *c, const zpp_partition *p,
                                           zpp_dtype dtype, const void *secondary,
                                           void *full, zpp_phase phase, zpp_coll_op **op_p);
/* Starts reducing a full gradient (padded elements of dtype; the padding
 * must be zero) into this rank's fp32 shard, averaged over the world. */
zpp_status zpp_coll_reduce_start(zpp_coll *c, const zpp_partition *p, zpp_reduce_mode mode,
                                 zpp_dtype dtype, const void *full_grad, float *shard_out,
                                 zpp_coll_op **op_p);
/* Completes an operation and frees it. */
zpp_status zpp_coll_finish(zpp_coll *c, zpp_coll_op *op);

/* In-place sum over the world of n fp32 values in host memory (global
 * gradient norm, loss averages); staged through device memory on NCCL.
 * Accounted under ZPP_PHASE_OTHER. Blocking. */
zpp_status zpp_coll_allreduce_sum(zpp_coll *c, float *host_values, size_t n);

/* Volume since the last reset, and the reset. */
const zpp_volume *zpp_coll_volume(const zpp_coll *c);
void zpp_coll_volume_reset(zpp_coll *c);

#endif
