/* fuzz/fuzz_manifest.c — libFuzzer target: a checkpoint's manifest
 * (src/train/ckpt_manifest.c) from arbitrary bytes. What it accepts must
 * hold together: counts in range, a folder name without a path in it, as
 * many unit sizes as it says. Built by scripts/fuzz.sh (clang); replayed
 * over fuzz/corpus/manifest by the ctest test fuzz_replay_manifest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint.h"
#include "train/ckpt_manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    if (size) memcpy(text, data, size);
    text[size] = '\0';
    zpp_ckpt_manifest m;
    if (zpp_ckpt_manifest_parse(text, ZPP_CKPT_FORMAT, "fuzz", &m) == ZPP_OK) {
        const zpp_engine_counters *c = &m.ctr;
        if (m.step < 0 || m.world_size < 1 || m.n_units < 1 || !m.numel) abort();
        if (c->updates > m.step || c->skipped_total > m.step || !(c->loss_scale > 0)) abort();
        if (strchr(m.folder, '/') || !m.folder[0]) abort();
        size_t total = 0;
        for (int u = 0; u < m.n_units; u++) total += m.numel[u] & 1;
        (void)total;
        zpp_ckpt_manifest_free(&m);
    }
    free(text);
    return 0;
}
