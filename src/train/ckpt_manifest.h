/* train/ckpt_manifest.h — a checkpoint's manifest, parsed (checkpoint.h
 * has the format and writes it). Apart from checkpoint.c so that it needs
 * nothing but cJSON: fuzz/fuzz_manifest.c feeds it arbitrary bytes. */
#ifndef ZPP_TRAIN_CKPT_MANIFEST_H
#define ZPP_TRAIN_CKPT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"
#include "zeropp.h"

typedef struct zpp_ckpt_manifest {
    int step, format, world_size, node_size, train_batch_size, n_units;
    char dtype[8];           /* the working dtype's name: "bf16", "fp16", "fp32" */
    zpp_engine_counters ctr; /* engine.h: updates, skips, the loss scaler */
    uint64_t seed;
    char folder[256], mode[64];
    zpp_gpt2_config model;
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
} zpp_ckpt_manifest;

/* Parses the NUL-terminated JSON `text` of a manifest of format `format`;
 * `name` (a path) is for messages. Every number is range-checked before it
 * is converted. ZPP_ERR_FORMAT with one line on anything malformed; on
 * success free it with zpp_ckpt_manifest_free. */
zpp_status zpp_ckpt_manifest_parse(const char *text, int format, const char *name,
                                   zpp_ckpt_manifest *m);
void zpp_ckpt_manifest_free(zpp_ckpt_manifest *m);

#endif
