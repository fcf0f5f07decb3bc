/* train/trainer.h — the training loop: topology, model, engine and data
 * wired together from a config. The caller (tools/) initialises MPI, prints
 * and decides to exit; the trainer only computes and returns statuses. */
#ifndef ZPP_TRAIN_TRAINER_H
#define ZPP_TRAIN_TRAINER_H

#include "engine/engine.h"
#include "train/config.h"
#include "train/data.h"

typedef struct zpp_trainer zpp_trainer;

typedef struct zpp_trainer_info {
    int world_size, world_rank, node_size, nodes;
    int micro_batch, accum, global_batch, seq_len;
    size_t n_params;       /* model parameters (unpadded) */
    zpp_data_info data;
    const char *mode;      /* "zero3", "qwz", "qwz+hpz+qgz", ... */
} zpp_trainer_info;

typedef struct zpp_trainer_step_result {
    zpp_step_stats stats;
    double seconds;        /* wall time of the step, slowest rank */
    double tokens_per_s;   /* global tokens / seconds */
    /* The most bytes allocated through any rank's device since it was
     * created (zpp_device_mem_stats: the engine's shards and scratch, and on
     * a GPU the model's activations and GEMM workspace; not what NCCL or the
     * CUDA runtime allocate for themselves). */
    double device_peak_bytes;
} zpp_trainer_step_result;

typedef struct zpp_trainer_opts {
    const char *data_path; /* NULL: the built-in synthetic corpus */
    /* Ranks per node; 0 takes zero_hpz_partition_size (if > 1), else the
     * launcher's placement. */
    int node_size;
    /* 0: host ranks over MPI with the CPU model; 1: one GPU per rank (the
     * rank's index on its host), NCCL and the CUDA model. */
    int gpu;
    /* GPU: a distinct NCCL_HOSTID per emulated node (DESIGN.md §6). */
    int emulate_nodes;
} zpp_trainer_opts;

/* Builds everything over MPI_COMM_WORLD. `cfg` is copied and resolved for
 * the world size. Every rank returns the same status and message: a failure
 * on one rank is agreed over the world before returning (zpp_comm_agree_world:
 * the lowest failing rank's status and message, on every rank), so none is
 * left waiting; the caller prints it once. The same holds for every
 * collective call below, except ZPP_ERR_TIMEOUT: a wait for a peer that
 * ran past cfg->collective_timeout_s (which this call makes the world's
 * and the topology's deadline) is not agreed, since the stalled rank cannot
 * answer; the rank that timed out returns it alone (with the step, from
 * zpp_trainer_step), and the caller should print it there and end the job. */
zpp_status zpp_trainer_create(const zpp_train_config *cfg, const zpp_trainer_opts *opts,
                              zpp_trainer **trainer_p);
void zpp_trainer_destroy(zpp_trainer *t);

const zpp_trainer_info *zpp_trainer_get_info(const zpp_trainer *t);

/* Runs optimizer step `step` (0-based). */
zpp_status zpp_trainer_step(zpp_trainer *t, int step, zpp_trainer_step_result *result_p);

/* Validation loss over cfg.eval_batches held-out micro-batches. */
zpp_status zpp_trainer_eval(zpp_trainer *t, float *val_loss_p);

/* Checkpoints in a directory: one file per rank (zpp_engine_save's format,
 * rank-NNNNN.ckpt) and a manifest, checkpoint.json ({"step", "world_size",
 * "mode"}), written last by rank 0 once every rank's file is in place — a
 * directory without a manifest is not a checkpoint. `steps_done` is the
 * number of optimizer steps taken; a resumed run continues at that step, bit
 * for bit (the data order and the learning rate are functions of the step).
 * Collective; every rank returns the same status. */
zpp_status zpp_trainer_save(zpp_trainer *t, const char *dir, int steps_done);
zpp_status zpp_trainer_load(zpp_trainer *t, const char *dir, int *steps_done_p);

#endif
