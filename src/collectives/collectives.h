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
 *            ZPP_REDUCE_QGZ        hierarchical 4-bit all-to-all (see
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
    zpp_quant_spec grad_spec;     /* qgZ: 4-bit E2M1, default block */
    /* qgZ's pipeline: elements of each rank's chunk per step (a "slab",
     * device.h). 0: automatic (zpp_qgz_slabs); SIZE_MAX: one step. */
    size_t grad_slab;
} zpp_coll_opts;

/* qgZ can run as a pipeline of slabs: slab k of every chunk is quantized,
 * exchanged and summed on its own, so the kernels of one slab may overlap
 * the exchange of the next, where one whole-unit step runs kernel,
 * exchange, kernel in a row. The results are bit for bit those of one step:
 * slabs start on block boundaries and every element keeps its stochastic
 * index (device.h); the wire bytes are the same too.
 *
 * Returns the number of slabs of a reduction of chunks of shard_len
 * elements over `nodes` nodes, and sets *slab_p to the length of each but
 * the last. The length is opts->grad_slab rounded up to a multiple of
 * 4 * grad block (so every slab but the last is a whole number of 16-byte
 * words, quantized), raised until there are at most ZPP_QGZ_MAX_SLABS.
 * Automatic (0): one step when the reduction crosses nodes, else at most
 * ZPP_QGZ_AUTO_SLABS slabs of at least ZPP_QGZ_AUTO_MIN elements. */
#define ZPP_QGZ_MAX_SLABS 16
#define ZPP_QGZ_AUTO_SLABS 8
#define ZPP_QGZ_AUTO_MIN ((size_t)1 << 22)
int zpp_qgz_slabs(size_t shard_len, int nodes, const zpp_coll_opts *opts, size_t *slab_p);

typedef struct zpp_coll zpp_coll;
typedef struct zpp_coll_op zpp_coll_op;

/* `dev` is the rank's compute backend: the collectives' kernels run on it,
 * their scratch comes from its pool, and its memory kind must be the
 * communicators' (comm->mem). Not owned; it outlives the zpp_coll. */
zpp_status zpp_coll_create(zpp_topo *topo, const zpp_coll_opts *opts, zpp_device *dev,
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
 * must be zero) into this rank's fp32 shard, averaged over the world. The
 * gradient must stay as it is until zpp_coll_finish: qgZ reads this rank's
 * own chunk again there, to add it to the sum unquantized. */
zpp_status zpp_coll_reduce_start(zpp_coll *c, const zpp_partition *p, zpp_reduce_mode mode,
                                 zpp_dtype dtype, const void *full_grad, float *shard_out,
                                 zpp_coll_op **op_p);

/* Error feedback for qgZ (LoCo; docs/quantization.md, "Error feedback").
 * The rank keeps, per unit, the error of its last quantization at each of
 * qgZ's two quantizing steps and corrects the next one with it:
 *   x = v + e;  send q = Q(x);  e <- beta * e + (1 - beta) * (x - deq(q))
 *   intra  the first quantization (reorder-quantize of the full gradient):
 *          `padded` fp32 elements, the layout of the full gradient
 *   inter  the requantization of the node partial sums (nodes > 1 and
 *          node_size > 1 only; otherwise qgZ quantizes once): nodes *
 *          shard_len fp32 elements, node m's chunk at m * shard_len
 * Both live in the device's memory, are owned by the caller (the engine)
 * and are updated in place by the reduction (the intra buffer at start,
 * the inter buffer at finish): a unit's buffers may serve one reduction in
 * flight at a time. Start them at zero. */
typedef struct zpp_qgz_feedback {
    float *intra;
    float *inter; /* NULL when zpp_qgz_feedback_lens gives 0 */
    float beta;   /* err_beta, in [0, 1] */
} zpp_qgz_feedback;

/* The two buffers' lengths in elements for a unit of partition p. */
void zpp_qgz_feedback_lens(const zpp_partition *p, int nodes, int node_size, size_t *intra_p,
                           size_t *inter_p);

/* zpp_coll_reduce_start with error feedback (mode ZPP_REDUCE_QGZ; fb NULL:
 * the plain reduction). */
zpp_status zpp_coll_reduce_start_ef(zpp_coll *c, const zpp_partition *p, zpp_reduce_mode mode,
                                    zpp_dtype dtype, const void *full_grad, float *shard_out,
                                    const zpp_qgz_feedback *fb, zpp_coll_op **op_p);
/* Completes an operation and frees it. */
zpp_status zpp_coll_finish(zpp_coll *c, zpp_coll_op *op);

/* In-place sum over the world of n fp32 values in host memory (global
 * gradient norm, loss averages); staged through device memory on NCCL.
 * Accounted under ZPP_PHASE_OTHER. Blocking. */
zpp_status zpp_coll_allreduce_sum(zpp_coll *c, float *host_values, size_t n);

/* In-place sum over the world of n elements of dtype in the device's memory
 * (the engine's full-precision vectors, engine.c). Completion as comm.h's
 * blocking form: on MPI the values are there when it returns; on NCCL the
 * compute stream is ordered after it. Accounted under `phase`. */
zpp_status zpp_coll_allreduce_device(zpp_coll *c, void *values, size_t n, zpp_dtype dtype,
                                     zpp_phase phase);

/* Stochastic rounding draws a fresh stream for every quantizing call, from
 * the spec's seed, the rank, the round and the calls made since the round
 * began. The engine starts a round at each step with the step's number, so
 * a run resumed from a checkpoint draws what the uninterrupted run drew. */
void zpp_coll_set_round(zpp_coll *c, uint64_t round);

/* Volume since the last reset, the reset, and putting back counts read
 * before (the engine keeps an evaluation's bytes out of a step's). */
const zpp_volume *zpp_coll_volume(const zpp_coll *c);
void zpp_coll_volume_reset(zpp_coll *c);
void zpp_coll_volume_set(zpp_coll *c, const zpp_volume *v);

/* Non-finite input. A NaN or Inf in a shard or gradient does not stop a
 * collective half way (the peers would hang in the exchange): the
 * quantizers store a NaN scale for the offending block, the NaN travels
 * through the exchange and the sums, and the device's non-finite flag is
 * raised (device.h); zpp_coll_finish returns ZPP_OK. The engine reads the
 * flag once a step (zpp_device_nonfinite_take). The scratch the operations
 * in flight hold comes from the device's pool (zpp_device_scratch_stats). */

/* ---- Volume formulas (DESIGN.md §5) ------------------------------------
 *
 * ONE definition, used by the live accounting (every backend call of a
 * zpp_coll goes through it) and by `zeropp plan` (which runs no MPI).
 *
 * A backend call runs over a group of ranks that spans `nodes` nodes with
 * `ranks_per_node` of its ranks on each; `groups_per_node` such groups run
 * the same call at the same time and share each node (the world and the
 * intra-node group: 1; the inter-node groups, one per local index:
 * node_size). Figures are bytes PER NODE, summed over the concurrent
 * groups; every rank makes the same calls with the same sizes, so each rank
 * computes the per-node figure locally and all ranks agree.
 *
 * With N = nodes, R = ranks_per_node, I = groups_per_node:
 *   all-gather, full output P = N*R*bytes_per_rank bytes,
 *   reduce-scatter, full input P = N*R*count*dsize bytes:
 *       cross = I * (N-1)/N * P    (every node must receive the (N-1)/N of
 *                                   P held elsewhere: the ring optimum)
 *       intra = I * (R-1) * P      (each of the node's R ranks sends
 *                                   (R-1)/R * P inside the node)
 *   The intra rule for a group spanning several nodes is that of a
 *   hierarchical ring: the node's R ranks first exchange the node's 1/N of
 *   P (R * (R-1)/R * P/N), each receives its 1/R share of the (N-1)/N * P
 *   crossing the boundary and passes it to the R-1 others
 *   (R * (R-1) * (N-1)/(N*R) * P); the two add up to (R-1) * P, the same
 *   as an all-gather of P inside one node — moving data into a node does
 *   not spare the ranks of that node from sharing it.
 *   all-to-all, bytes_per_peer b (each rank sends b to each of N*R ranks,
 *   itself included):
 *       cross = I * R * (N-1)*R * b    (the node's R ranks, each to the
 *                                        (N-1)*R ranks on other nodes)
 *       intra = I * R * (R-1) * b      (each to its R-1 node peers)
 *   all-reduce of P = count*dsize: a reduce-scatter plus an all-gather of
 *       P: cross = I * 2 (N-1)/N * P, intra = I * 2 (R-1) * P
 *   broadcast of P: cross = I * (N-1)/N * P (a chain crosses N-1
 *       boundaries, averaged over N nodes), intra = I * (R-1) * P
 * payload_bytes is what THIS rank handed the backend as its send buffer:
 * all-gather bytes_per_rank, reduce-scatter N*R*count*dsize, all-to-all
 * N*R*b, all-reduce count*dsize, broadcast bytes; the quantized paths count
 * their whole wire buffers (payload, scales and padding).
 *
 * For a topology of `nodes` x `node_size` ranks the three groups are
 *   world {nodes, node_size, 1}, intra {1, node_size, 1},
 *   inter {nodes, 1, node_size}. */
typedef enum zpp_call_kind {
    ZPP_CALL_ALLGATHER = 0,
    ZPP_CALL_REDUCE_SCATTER = 1,
    ZPP_CALL_ALLTOALL = 2,
    ZPP_CALL_ALLREDUCE = 3,
    ZPP_CALL_BROADCAST = 4
} zpp_call_kind;

typedef struct zpp_group_shape {
    int nodes;
    int ranks_per_node;
    int groups_per_node;
} zpp_group_shape;

zpp_group_shape zpp_group_world(int nodes, int node_size);
zpp_group_shape zpp_group_intra(int node_size);
zpp_group_shape zpp_group_inter(int nodes, int node_size);

/* Records one backend call into v under `phase`. `bytes` is the call's size
 * argument in bytes: per rank (all-gather), one rank's output count * dsize
 * (reduce-scatter), per peer (all-to-all), count * dsize (all-reduce), the
 * buffer (broadcast). */
void zpp_volume_add_call(zpp_volume *v, zpp_phase phase, zpp_call_kind kind,
                         const zpp_group_shape *g, size_t bytes);

/* ---- Planning without running (`zeropp plan`, checks in `bench comm`) ---
 *
 * These add to v exactly the calls the live operations make (the same
 * skips: qgZ leaves out the intra-node all-to-all when node_size == 1 and
 * the inter-node one when nodes == 1). */
zpp_partition zpp_partition_make_shape(size_t numel, int world_size, int nodes);
void zpp_plan_gather(zpp_volume *v, const zpp_partition *p, int nodes, int node_size,
                     zpp_gather_mode mode, zpp_dtype dtype, const zpp_coll_opts *opts,
                     zpp_phase phase);
void zpp_plan_gather_secondary(zpp_volume *v, const zpp_partition *p, int nodes,
                               int node_size, zpp_dtype dtype, zpp_phase phase);
void zpp_plan_reduce(zpp_volume *v, const zpp_partition *p, int nodes, int node_size,
                     zpp_reduce_mode mode, zpp_dtype dtype, const zpp_coll_opts *opts);

/* The named configurations of one training step. */
typedef struct zpp_coll_mode {
    const char *name;          /* "zero3", "qwz", "hpz", "qgz", "zeropp" */
    zpp_gather_mode gather;    /* forward gathers (and backward without hpZ) */
    int hpz;                   /* backward gathers from secondary shards */
    zpp_reduce_mode reduce;
} zpp_coll_mode;

#define ZPP_COLL_MODE_COUNT 5
/* Mode i < ZPP_COLL_MODE_COUNT, in the order above. */
const zpp_coll_mode *zpp_coll_mode_get(int i);
zpp_status zpp_coll_mode_parse(const char *name, const zpp_coll_mode **mode_p);

/* A model of `params` elements cut into `units` units as evenly as possible:
 * unit i has params / units elements, plus one for i < params % units. */
size_t zpp_plan_unit_numel(size_t params, int units, int i);

/* The collectives of one training step, per node: for each unit a forward
 * gather, a backward gather (secondary with hpZ) and a gradient reduce, in
 * `dtype`. Resets v first. ZPP_ERR_INVALID when node_size does not divide
 * world or a count is not positive. */
zpp_status zpp_plan_step(size_t params, int units, int world, int node_size,
                         const zpp_coll_mode *mode, zpp_dtype dtype,
                         const zpp_coll_opts *opts, zpp_volume *v_p);

/* Default options: int8 weights, E2M1 gradients, default blocks. */
zpp_coll_opts zpp_coll_opts_default(void);

#endif
