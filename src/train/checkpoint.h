/* train/checkpoint.h — atomic, reshardable checkpoints in a directory.
 *
 * LAYOUT of a checkpoint directory DIR:
 *   DIR/checkpoint.json        the pointer: the manifest of the newest
 *                              published checkpoint; replaced by one atomic
 *                              rename (written to checkpoint.json.tmp,
 *                              fsynced, renamed, DIR fsynced)
 *   DIR/step-00000040/         one folder per save (a second save of the
 *                              same step, while the first is the published
 *                              one, goes to step-00000040.1)
 *       rank-00000.ckpt ...    one file per rank of the saving run
 *       loco-00000.ckpt ...    with qgZ error feedback (manifest "loco": true),
 *                              one per rank: "ZPPLOCO2", u32 world_size,
 *                              rank, node_size, n_units, u64 step, u64
 *                              run_id (absent in "ZPPLOCO1"), per unit
 *                              u64 intra_len, u64 inter_len and the fp32
 *                              buffers, then u64 FNV-1a. Not resharded: a
 *                              run of the same world and node size installs
 *                              them, any other starts them at zero (noted)
 *       manifest.json          the same manifest (the folder alone can be
 *                              resumed: --resume DIR/step-00000040)
 * A save writes and fsyncs every rank's file in a new step folder, the ranks
 * agree that all succeeded, and only then rank 0 publishes the folder by
 * replacing the pointer. Until then the previous checkpoint stays the
 * published one, whatever happens to the save (an error, a full disk, a
 * rank killed). After a publish, rank 0 deletes all but the newest `keep`
 * complete step folders (the published one always stays) and every folder
 * of a failed save.
 *
 *   .zeropp.lock               the run lock (ckpt_lock.h): held by the run
 *                              saving into DIR, removed when it ends
 *
 * MANIFEST (JSON): {"step", "format": 3, "folder", "world_size",
 * "node_size", "mode", "dtype" ("bf16" | "fp32"), "model": {"n_layer",
 * "n_head", "n_embd", "seq_len", "vocab_size", "real_vocab_size" (absent
 * in older manifests: = vocab_size), "family" ("gpt2" | "llama"; absent
 * in older ones: gpt2), and a llama's "n_kv_head", "n_ffn", "rope_theta",
 * "norm_eps", "untied_head", "qkv_bias", "rope_factor",
 * "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_pos"
 * (resolved: no 0 standing for a default)}, "train_batch_size", "seed",
 * "units": [numel of each unit], "files": [rank file names],
 * "config": {the saving run's whole config, as a config file holds it:
 * zpp_train_config_to_json}, "data": {"path": absolute path or null (the
 * synthetic corpus), "kind", "tokens"}, "run_id": 16 hex digits, "sums":
 * {"rank": [each rank file's checksum, its last 8 bytes, 16 hex digits],
 * "loco": [the same of the loco files, with "loco"]}, "checksum": 16 hex
 * digits, last: the FNV-1a 64 of the manifest's bytes with these 16 read
 * as '0' (ckpt_manifest.h)}. Format 3 (2026-12-03 to 12-04) summed its
 * files with FNV-1a ("ZPPCKPT3", "ZPPLOCO2"), format 2 (before 2026-12-03,
 * issue 29) had no run_id, sums or checksum and "ZPPCKPT2" rank files; both
 * still load.
 * "config" and "data" are absent in
 * manifests written before 2026-12-03: such a checkpoint still loads, and a
 * resume without --config takes only the model shape, dtype, global batch
 * and seed from it (zpp_trainer_config_from_checkpoint says so).
 *
 * RANK FILE (native little-endian), the ranges the saving rank owned:
 *   "ZPPCKPT4" (8 bytes), u32 world_size, u32 rank, u32 n_units, u32 0,
 *   u64 step, u64 run_id (absent in format 2's "ZPPCKPT2"), then for each
 *   unit: u64 numel, u64 begin, u64 count, f32 master[count], f32 m[count],
 *   f32 v[count]; then u64 zpp_checksum of every byte before
 *   (core/checksum.h: about as fast as a memory copy, where FNV-1a, which
 *   formats 2 and 3 used, held a large save or resume to about one byte
 *   per multiply's latency; bench/RESULTS.md). Rank r of W holds
 *   [r * L, min((r + 1) * L, numel)) of each unpadded unit,
 *   L = ceil(numel / W): no padding, so the files do not depend on how the
 *   units were padded.
 *
 * RESHARDING: a run of any world size and node size (CPU or GPU) loads a
 * checkpoint: each rank reads the saved files whose ranges overlap its own
 * shard (zpp_engine_shard_range), checks each one's header and checksum, and
 * installs its elements only when every file it read is intact. The data
 * order and the learning rate are functions of the step (and the global
 * batch and seed), so the same world resumes bit for bit and another world
 * continues within the rounding of its reductions.
 *
 * RUN IDENTITY: every file of a step folder and its manifest carry the run
 * id (zpp_ckpt_meta.run_id; a resumed run keeps the id of the run it
 * continues) and the step; the manifest also records every file's
 * checksum and its own. A load refuses (ZPP_ERR_FORMAT, naming the files
 * and both ids or sums) a folder whose files disagree with its manifest, a
 * pointer that differs from its folder's manifest, and a manifest whose
 * checksum does not hold.
 *
 * CHECKS on load: the model family and shape (n_layer, n_head, n_embd, seq_len,
 * vocab_size, real_vocab_size; a llama's n_kv_head, n_ffn, rope_theta,
 * norm_eps, untied_head, qkv_bias, rope_*: the manifest's "model" keeps
 * them, ckpt_manifest.h), the working dtype and every unit's size must match
 * (ZPP_ERR_CONFIG naming the key and both values): the saved tensors have
 * no meaning under another shape or dtype. Everything else may change and
 * is described in a note (zpp_checkpoint_load's `note`), one line each:
 * every config key whose value differs ("optimizer.params.lr: 0.001 ->
 * 0.002", zpp_train_config_diff), the rank count, node size, ZeRO++ mode,
 * global batch, training data, error-feedback buffers, and, when the
 * learning rate of the first step to be trained moves (a new lr, or a
 * decaying schedule whose length changed with zeropp.train_steps), that
 * lr under the saved config and under this one.
 *
 * Every function is collective over the world (zpp_comm_agree_world) and
 * returns the same status on every rank; nothing prints.
 */
#ifndef ZPP_TRAIN_CHECKPOINT_H
#define ZPP_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "core/fault.h"
#include "model/gpt2.h"
#include "train/ckpt_manifest.h"
#include "train/config.h"
#include "zeropp.h"

#define ZPP_CKPT_FORMAT 4

typedef struct zpp_ckpt_meta {
    int step;          /* optimizer steps taken */
    int world_size, world_rank, node_size;
    const char *mode;  /* "zero3", "qwz+hpz+qgz", ... */
    zpp_dtype dtype;   /* the working dtype */
    zpp_gpt2_config model;
    /* The family ("gpt2", "llama": family.h) and, for llama, its knobs
     * (ext's n_kv_head, n_ffn, rope_*, norm_eps, untied_head, qkv_bias, as
     * zpp_llama_config_of_shape resolved them: no 0 left to a default). */
    const char *family;
    zpp_decoder_shape ext;
    int train_batch_size;
    uint64_t seed;
    /* The run's config as given (before zpp_train_config_resolve: batch
     * sizes the user left to be derived stay 0), saved whole and compared
     * key by key on load; NULL: neither. */
    const zpp_train_config *config;
    /* The training data: its absolute path (NULL: the built-in synthetic
     * corpus), kind name and size in tokens; data_kind NULL: not saved. */
    const char *data_path, *data_kind;
    size_t data_tokens;
    /* --init-from's folder or file, absolute, kept by every resume of the
     * lineage (an export finds the model's tokenizer and config.json
     * there); NULL: the weights were drawn from the seed. */
    const char *init_from;
    uint64_t run_id; /* the run (lineage): written into every file of a save */
} zpp_ckpt_meta;

/* Creates DIR (and its parents) and checks, on every rank, that the rank
 * sees a file rank 0 writes there (one folder all ranks share) and can
 * write one of its own. zpp_checkpoint_lock calls it once the lock is
 * held. Collective. */
zpp_status zpp_checkpoint_check_dir(const char *dir, int world_rank);

/* What a save wrote, for the log line a person reads ("saved step N to
 * DIR (X MB, Y s)", docs/logs.md). The same on every rank. */
#define ZPP_CKPT_PATH_MAX 4096
typedef struct zpp_ckpt_saved {
    char folder[ZPP_CKPT_PATH_MAX]; /* the published step folder: DIR/step-00000040 */
    double bytes;                   /* every file of the folder, all ranks' together */
    double seconds;                 /* the save's wall time on rank 0, publish included */
} zpp_ckpt_saved;

/* THE RUN LOCK: a run that saves into DIR holds DIR/.zeropp.lock for its
 * whole life, so two jobs never share a folder. Rank 0 creates DIR (and
 * its parents), opens the file and takes an exclusive flock(2) on it
 * without waiting, then writes one JSON line: {"run_id", "host", "pid",
 * "started" (Unix seconds), "since" (UTC)}. The kernel drops the lock when
 * the process ends however it ends, so a file whose lock is not held is
 * stale: it is taken over and `note` (cap bytes, rank 0) says whose it was
 * ("" when there was none). A held lock is never broken: ZPP_ERR_STATE
 * "DIR is in use by run ... (pid P on host H, since T); wait for it or pass
 * another --save". After taking the lock the file must still be the one at
 * the path (a holder removes it when it ends; else try again). Where
 * flock fails with ENOLCK / EOPNOTSUPP (a file system without locks) the
 * file alone decides: a holder on this host whose pid is gone is stale;
 * any other is refused, naming the file to remove. On NFS, Linux emulates
 * flock with byte-range locks, which reach every client when the server
 * locks (NFSv4, or v3 with lockd); a mount with `nolock` or
 * `local_lock=flock` makes it local to each node.
 *
 * zpp_checkpoint_lock: collective; every rank returns rank 0's outcome (its
 * message). *lock_p is the lock on rank 0, NULL on the others.
 * zpp_checkpoint_lock_set_run: rewrites the holder's run id (a resume
 * learned its lineage after locking); local, NULL is a no-op.
 * zpp_checkpoint_unlock: rank 0 removes the file and drops the lock; local,
 * NULL is a no-op. */
typedef struct zpp_ckpt_lock zpp_ckpt_lock;
zpp_status zpp_checkpoint_lock(const char *dir, int world_rank, uint64_t run_id,
                               zpp_ckpt_lock **lock_p, char *note, size_t cap);
zpp_status zpp_checkpoint_lock_set_run(zpp_ckpt_lock *lock, uint64_t run_id);
void zpp_checkpoint_unlock(zpp_ckpt_lock *lock);

/* Saves the engine's state as a new step folder of DIR and publishes it;
 * keeps the newest `keep` (>= 1) complete folders. `fault` (NULL: none) is
 * the save_fail / save_kill test hook (core/fault.h), which never fires in a
 * release build. `saved` (NULL: not wanted) is filled on success. The
 * bytes are counted by rank 0 in the published folder (the ranks' files
 * and the manifest) and handed to every rank. Collective. */
zpp_status zpp_checkpoint_save(zpp_engine *e, const zpp_ckpt_meta *meta, const char *dir,
                               int keep, const zpp_fault *fault, zpp_ckpt_saved *saved);

/* Loads the published checkpoint of DIR (or the step folder DIR) into the
 * engine, after checking it against `meta` (this run; meta->step ignored).
 * On success *step_p is the checkpoint's step, *run_id_p (if not NULL) the
 * run id of the run that saved it (0: format 2, none) and `note` (cap
 * bytes) says what differs between the saving run and this one ("" if
 * nothing). Collective; on error the engine is unchanged. */
zpp_status zpp_checkpoint_load(zpp_engine *e, const zpp_ckpt_meta *meta, const char *dir,
                               int *step_p, uint64_t *run_id_p, char *note, size_t cap);

/* Reads the manifest of the checkpoint of DIR (its published one, or the
 * step folder DIR) without its rank files. Not collective; free it with
 * zpp_ckpt_manifest_free. */
zpp_status zpp_checkpoint_read_manifest(const char *dir, zpp_ckpt_manifest *m);

/* Reads the fp32 master weights of the checkpoint of DIR (its published
 * one, or the step folder DIR) whole, outside a run: for tools that convert
 * a checkpoint (zeropp export). Not collective (needs no MPI); every rank
 * file is read and checked (header, checksum). On success *m holds the
 * manifest (free it with zpp_ckpt_manifest_free) and *units_p an array of
 * m->n_units arrays of m->numel[u] floats (free each, then the array). */
zpp_status zpp_checkpoint_read_masters(const char *dir, zpp_ckpt_manifest *m, float ***units_p);

#endif
