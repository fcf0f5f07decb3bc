/* fuzz/fuzz_config.c — libFuzzer target: the trainer's JSON configuration
 * (src/train/config.c) from arbitrary text: zpp_train_config_load_string,
 * then, for a config it accepts, the batch geometry on a few world sizes and
 * the learning-rate schedule at its corners. Anything but a clean status is
 * a bug: a crash, a sanitizer report, an accepted config whose schedule is
 * not finite. Built by scripts/fuzz.sh (clang); replayed over
 * fuzz/corpus/config by the ctest test fuzz_replay_config (any compiler). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    zpp_train_config cfg;
    if (zpp_train_config_defaults(&cfg) != ZPP_OK) abort();
    if (zpp_train_config_load_string(text, &cfg) == ZPP_OK) {
        for (int world = 1; world <= 8; world *= 2) {
            zpp_train_config c = cfg;
            if (zpp_train_config_resolve(&c, world) != ZPP_OK) continue;
            if (c.train_batch_size < 1 || c.train_micro_batch_size_per_gpu < 1 ||
                c.gradient_accumulation_steps < 1)
                abort(); /* resolve accepted a geometry it should have refused */
        }
        const long steps[] = {0, 1, cfg.scheduler.warmup_num_steps, cfg.train_steps,
                              cfg.scheduler.total_num_steps, 2147483647L};
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
            double lr = zpp_train_lr(&cfg, steps[i]);
            if (!isfinite(lr) || lr < 0) {
                fprintf(stderr, "lr %g at step %ld of an accepted config\n", lr, steps[i]);
                abort();
            }
        }
    }
    free(text);
    return 0;
}
