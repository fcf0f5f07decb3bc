/* train/ckpt_manifest.h — a checkpoint's manifest, parsed (checkpoint.h
 * has the format and writes it). Apart from checkpoint.c so that it needs
 * nothing but cJSON: fuzz/fuzz_manifest.c feeds it arbitrary bytes. */
#ifndef ZPP_TRAIN_CKPT_MANIFEST_H
#define ZPP_TRAIN_CKPT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "model/family.h"
#include "model/gpt2.h"
#include "zeropp.h"

typedef struct zpp_ckpt_manifest {
    int step, format, world_size, node_size, train_batch_size, n_units;
    char dtype[8];           /* the working dtype's name: "bf16", "fp16", "fp32" */
    zpp_engine_counters ctr; /* zeropp.h: updates, skips, the loss scaler */
    uint64_t seed;
    char folder[256], mode[64];
    zpp_gpt2_config model;
    /* "model"."family" ("gpt2" when absent: manifests before it held GPT-2s
     * only) and a llama's knobs, "model"."n_kv_head", "n_ffn",
     * "rope_theta", "norm_eps", "untied_head", "qkv_bias", "o_bias" (optional:
     * false when absent, as manifests before it), "rope_factor",
     * "rope_low_freq_factor", "rope_high_freq_factor",
     * "rope_original_max_pos" (required for llama, into ext; 0 for gpt2). */
    char family[8];
    zpp_decoder_shape ext;
    size_t *numel;           /* n_units unit sizes */
    int loco;                /* "loco": true: error-feedback files loco-NNNNN.ckpt, one a
                                rank, in this world_size and node_size's layout */
    /* Optional (absent in manifests written before them): */
    char *config;            /* "config": the saving run's config as JSON text
                                (zpp_train_config_to_json), or NULL */
    int has_data;            /* "data" present: */
    char *data_path;         /*   "path": the token file (absolute), NULL = synthetic */
    char data_kind[16];      /*   "kind": zpp_data_kind_name */
    double data_tokens;      /*   "tokens": its size in tokens */
    char *init_from;         /* "init_from": the Hugging Face folder or llm.c file (absolute)
                                the lineage's weights were first read from; NULL: drawn
                                from the seed (or saved before the field) */
    /* Format 3 (2026-12-03, issue 29); 0 / NULL in format 2: */
    uint64_t run_id;         /* "run_id": the run (lineage) that saved it, 16 hex digits */
    uint64_t *rank_sums;     /* "sums": {"rank": [...]}: each rank file's checksum (its
                                last 8 bytes), world_size of them */
    uint64_t *loco_sums;     /*   "loco": [...] the error-feedback files' (with loco) */
} zpp_ckpt_manifest;

/* FNV-1a 64, continuing from h (start: ZPP_FNV1A_INIT): the checksum of
 * manifests, and of the rank files of formats 2 and 3. */
#define ZPP_FNV1A_INIT 14695981039346656037ull
uint64_t zpp_fnv1a(uint64_t h, const void *p, size_t n);

/* A format-3 manifest ends with "checksum":"<16 hex digits>"}: the FNV-1a
 * of the manifest's bytes with those 16 digits read as '0'. Seal fills them
 * in `text` (written with 16 '0's there); 0 if `text` has no such field. */
int zpp_ckpt_manifest_seal(char *text);

/* Parses the NUL-terminated JSON `text` of a manifest of format 2 up to
 * `format` (format 3 and later: its checksum must hold, and run_id and the
 * file sums are required); `name` (a path) is for messages. Every number is
 * range-checked before it is converted. ZPP_ERR_FORMAT with one line on
 * anything malformed or damaged; on success free it with
 * zpp_ckpt_manifest_free. */
zpp_status zpp_ckpt_manifest_parse(const char *text, int format, const char *name,
                                   zpp_ckpt_manifest *m);
void zpp_ckpt_manifest_free(zpp_ckpt_manifest *m);

#endif
