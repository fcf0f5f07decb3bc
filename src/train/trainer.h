/* train/trainer.h — the training loop: topology, model, engine and data
 * wired together from a config. The caller (tools/) initialises MPI, prints
 * and decides to exit; the trainer only computes and returns statuses. */
#ifndef ZPP_TRAIN_TRAINER_H
#define ZPP_TRAIN_TRAINER_H

#include "collectives/collectives.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/sample.h"

typedef struct zpp_trainer zpp_trainer;

typedef struct zpp_trainer_info {
    int world_size, world_rank, node_size, nodes;
    int micro_batch, accum, global_batch, seq_len;
    size_t n_params;       /* model parameters (unpadded) */
    zpp_data_info data;
    const char *mode;      /* "zero3", "qwz", "qwz+hpz+qgz", ... */
    /* The resolved ZeRO++ options, for the log's header: hpz_partition is
     * the ranks sharing a secondary copy (0: hpZ off). */
    int qwz, hpz_partition, qgz;
    zpp_dtype dtype;       /* the working dtype */
    int gpu;               /* 1: one GPU per rank; 0: host ranks */
    char device[128];      /* this rank's device name: "host", "NVIDIA H200" */
    /* Where zpp_trainer_create spent its time, in seconds (for the log's
     * setup line): the ranks and the device (communicators, GPU context),
     * the data and the model, the engine (shards, and this rank's initial
     * weights: drawn on the device when init_on_device, else on the host
     * and copied), and --init-from's file. */
    double setup_ranks_s, setup_model_s, setup_engine_s, setup_init_from_s;
    int init_on_device;
} zpp_trainer_info;

typedef struct zpp_trainer_step_result {
    zpp_update_stats stats; /* what the public update reported */
    float lr;               /* the step's learning rate */
    double seconds;        /* wall time of the step, slowest rank */
    double tokens_per_s;   /* global tokens / seconds */
    /* The most bytes allocated through any rank's device since it was
     * created (zpp_device_mem_stats: the engine's shards and scratch, and on
     * a GPU the model's activations and GEMM workspace; not what NCCL or the
     * CUDA runtime allocate for themselves). */
    double device_peak_bytes;
    /* After the step, the most on any rank: memory in use on its GPU as the
     * driver reports it (zpp_device_driver_used: what nvidia-smi shows,
     * every process on that GPU included; 0 on host ranks), and bytes
     * allocated through its device then. On a GPU of its own, the
     * difference is what the CUDA context, the libraries and NCCL take. */
    double device_used_bytes, device_live_bytes;
    /* With opts.profile: the most exposed communication of any rank
     * (stats.exposed_comm_ms holds this rank's). */
    double exposed_comm_ms_max;
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
    /* 1: time each step's compute and exposed communication
     * (zpp_engine_config.profile). The same on every rank. */
    int profile;
    /* An llm.c GPT-2 model file (train/llmc.h), or a Hugging Face Llama
     * folder (train/hf_model.h: a folder with config.json), to start from
     * instead of the seeded init: each rank reads its shards' elements, the
     * moments start at zero. cfg must have the file's shape (ZPP_ERR_CONFIG
     * naming the key otherwise). NULL: the seeded init. */
    const char *init_from;
    /* Without init_from: the --init-from of the run this one continues
     * (zpp_trainer_saved_run.init_from), kept in its checkpoints; NULL: none. */
    const char *origin;
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

const zpp_trainer_info *zpp_trainer_info_get(const zpp_trainer *t);
/* What the communication backend changed about how the ranks talk (the
 * topology's note, comm.h: ranks of an emulated node sharing a GPU each
 * talk over sockets as a separate host), one line for people; "" when
 * nothing. The same on every rank. */
const char *zpp_trainer_comm_note(const zpp_trainer *t);

/* Runs optimizer step `step` (0-based). A step with NaN or Inf gradients
 * (an fp16 overflow too) is skipped: ZPP_OK with result_p->stats.skipped
 * set and nothing updated; zeropp.max_consecutive_skips of them in a row
 * return ZPP_ERR_NONFINITE naming the steps (engine.h, DESIGN.md §3). The
 * learning rate is a function of `step`, skipped steps included. */
zpp_status zpp_trainer_step(zpp_trainer *t, int step, zpp_trainer_step_result *result_p);

/* Validation loss over cfg.eval_batches held-out micro-batches a rank (at
 * most as many as cover the held-out split once; zpp_trainer_eval_note
 * says when they were capped, "" otherwise), on the
 * weights gathered exactly (zpp_engine_evaluate: not qwZ's int8 ones), and, if
 * volume_p is not NULL, the bytes those evaluations moved, by phase
 * (zpp_engine_eval_bytes: cross- and intra-node, counted apart from every
 * step's; payload_bytes and calls stay 0). */
zpp_status zpp_trainer_eval(zpp_trainer *t, float *val_loss_p, zpp_volume *volume_p);
const char *zpp_trainer_eval_note(const zpp_trainer *t);
/* The same over `batches` micro-batches a rank (rank r of W reads batches
 * r, r + W, ...: batches * W in all) of the held-out split
 * (zpp_data_val_batch), or of the training split read in order
 * (train_split; zpp_data_train_eval_batch): the mean of the batches'
 * losses. zpp_trainer_eval is this with the held-out split and
 * cfg.eval_batches. Collective. */
zpp_status zpp_trainer_evaluate(zpp_trainer *t, int train_split, int batches, float *loss_p,
                                zpp_volume *volume_p);

/* Checkpoints (train/checkpoint.h: the layout and formats; `saved`, NULL
 * or filled on success, says where the save went, its bytes and seconds,
 * zpp_ckpt_saved): each save is a
 * new step folder of `dir`, published by rank 0 with one atomic rename of
 * dir/checkpoint.json once every rank's file is written and fsynced; the
 * previous checkpoint stays valid until then, and the newest
 * zeropp.keep_checkpoints are kept. `steps_done` is the number of optimizer
 * steps taken; a resumed run continues at that step (the data order and the
 * learning rate are functions of the step), on any world and node size:
 * bit for bit on the same world. A save keeps the run's whole config (as
 * given, before batch sizes were derived) and where its data is. Loading
 * refuses another model shape or working dtype with one line naming the
 * key; everything else that differs (every config key, ranks, node size,
 * ZeRO++ mode, global batch, data, and the lr of the first step trained
 * when it moves) is described by zpp_trainer_resume_note, one
 * "what: saved -> now" line each ("" if nothing; checkpoint.h). Collective;
 * every rank returns the same status.
 *
 * Test hooks, only in a library built with -DZPP_FAULT_HOOKS=ON
 * (docs/fault-hooks.md): ZPP_FAULT=save_fail@STEP makes the last rank's
 * write of the save after STEP steps fail (an I/O error);
 * ZPP_FAULT=save_kill@STEP makes rank 1 (rank 0 when alone) write half its
 * file of that save and end with status 137, as a rank killed mid-save.
 * Read once, at zpp_trainer_create (core/fault.h). */
zpp_status zpp_trainer_save(zpp_trainer *t, const char *dir, int steps_done,
                            zpp_ckpt_saved *saved);
zpp_status zpp_trainer_load(zpp_trainer *t, const char *dir, int *steps_done_p);
const char *zpp_trainer_resume_note(const zpp_trainer *t);
/* What a checkpoint says of the run that saved it (besides its config). */
typedef struct zpp_trainer_saved_run {
    int step, world_size; /* steps taken; the saving run's ranks */
    int has_config;       /* 0: saved before checkpoints kept their config */
    int has_data;         /* 0: its data was not recorded (as has_config) */
    char *data_path;      /* its data file, absolute; NULL: the synthetic corpus (or
                             not recorded). free() it */
    char *init_from;      /* the lineage's --init-from, absolute; NULL: none (or not
                             recorded). free() it */
} zpp_trainer_saved_run;

/* The config to continue the checkpoint of DIR (its published one, or the
 * step folder DIR) with, when no --config is given: the defaults, then the
 * config the saving run used (checkpoint.h, "config"), as given to it
 * (batch sizes it derived stay derived). A checkpoint saved before configs
 * were kept gives the defaults with its model shape, working dtype, global
 * batch and seed, and run->has_config = 0 (the caller says so: the rest,
 * the optimizer and the schedule among it, are the defaults). Reads files
 * only: not collective (every rank reads the same ones; agree on the
 * status). On error *cfg and *run are untouched but for run->data_path =
 * run->init_from = NULL. */
zpp_status zpp_trainer_config_from_checkpoint(const char *dir, zpp_train_config *cfg,
                                              zpp_trainer_saved_run *run);

/* Creates `dir` (with its parents) and takes its run lock
 * (train/checkpoint.h, zpp_checkpoint_lock), held until
 * zpp_trainer_destroy, before any training: a folder another live run holds
 * is refused (ZPP_ERR_STATE, one line naming the holder), a stale lock is
 * taken over and zpp_trainer_save_dir_note says whose it was (rank 0; ""
 * otherwise). Call it before zpp_trainer_load, so that a folder in use is
 * refused before anything of it is read (the load rewrites the lock with
 * the run id it continues). Collective. */
zpp_status zpp_trainer_check_save_dir(zpp_trainer *t, const char *dir);
const char *zpp_trainer_save_dir_note(const zpp_trainer *t);
/* The run id (checkpoint.h, RUN IDENTITY) every save of this trainer
 * writes: made at random on rank 0 by zpp_trainer_create and shared; a
 * zpp_trainer_load of a checkpoint that has one replaces it with that one
 * (a resume continues its run) and then *continued_p (if not NULL) is 1. */
uint64_t zpp_trainer_run_id(const zpp_trainer *t, int *continued_p);

/* Samples while training (zeropp.sample_every; train/sample.h has the
 * generation and the draw). The prompt: the first tokens of the held-out
 * split, at most ZPP_TRAINER_SAMPLE_PROMPT and fewer than seq_len (a newline
 * where the data cannot be read); *n_p of them into prompt. Local. */
#define ZPP_TRAINER_SAMPLE_PROMPT 16
void zpp_trainer_sample_prompt(const zpp_trainer *t, int32_t *prompt, int *n_p);
/* max_new tokens drawn after prompt[0..n_prompt) into out, from the
 * weights training holds: each token is one evaluation-style forward of one
 * sequence through the engine (zpp_engine_evaluate: every unit gathered
 * exactly, in the working dtype, on every rank, its bytes outside the
 * step's), and the logits of its last position. Every rank computes the
 * same logits from the same gathered weights and draws the same tokens;
 * the caller prints rank 0's. Collective: every rank calls it with the same
 * arguments, and returns the same status. */
zpp_status zpp_trainer_sample(zpp_trainer *t, const zpp_sample_opts *o, const int32_t *prompt,
                              int n_prompt, int max_new, int32_t *out);

#endif
