/* fuzz/fuzz_data.c — libFuzzer target: opening a data file
 * (src/train/data.c) from arbitrary bytes: an llm.c token file (header,
 * size, every token checked) or raw text. The bytes go to a temporary file
 * (one per process, rewritten each run); a file zpp_data_open accepts is
 * then read: training batches of a few steps, a validation batch and single
 * tokens, all of which must stay below the vocabulary it reports. Built by
 * scripts/fuzz.sh (clang); replayed over fuzz/corpus/data by the ctest test
 * fuzz_replay_data (any compiler). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/config.h"
#include "train/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];
static int fd = -1;

static void remove_file(void) {
    if (path[0]) unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fd < 0) {
        snprintf(path, sizeof path, "/tmp/zpp_fuzz_data_XXXXXX");
        fd = mkstemp(path);
        if (fd < 0) abort();
        atexit(remove_file);
    }
    if (ftruncate(fd, 0) != 0) abort();
    if (size && pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    zpp_train_config cfg;
    if (zpp_train_config_defaults(&cfg) != ZPP_OK) abort();
    /* the last byte picks a small geometry: T in 1..16, micro 1..2 */
    const uint8_t g = size ? data[size - 1] : 0;
    cfg.model.seq_len = 1 + (g & 15);
    cfg.model.vocab_size = 50257;
    cfg.train_micro_batch_size_per_gpu = 1 + ((g >> 4) & 1);
    cfg.gradient_accumulation_steps = 1;
    cfg.train_batch_size = 0;
    if (zpp_train_config_resolve(&cfg, 2) != ZPP_OK) abort();
    zpp_data *d = NULL;
    if (zpp_data_open(path, &cfg, &d) != ZPP_OK) return 0;
    const zpp_data_info in = zpp_data_info_get(d);
    const int T = in.seq_len, B = in.micro_batch;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T * (size_t)B);
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)T * (size_t)B);
    if (!tok || !tgt) abort();
    for (uint64_t step = 0; step < 3; step++) {
        for (int rank = 0; rank < 2; rank++) {
            if (zpp_data_batch(d, step, 0, rank, 2, tok, tgt) != ZPP_OK) abort();
            for (int i = 0; i < T * B; i++)
                if (tok[i] < 0 || tok[i] >= in.vocab || tgt[i] < 0 || tgt[i] >= in.vocab) abort();
        }
    }
    if (zpp_data_val_batch(d, 5, B, tok, tgt) != ZPP_OK) abort();
    for (int i = 0; i < T * B; i++)
        if (tok[i] < 0 || tok[i] >= in.vocab || tgt[i] < 0 || tgt[i] >= in.vocab) abort();
    if (zpp_data_token(d, in.n_tokens - 1) < 0 || zpp_data_token(d, in.n_tokens) != -1) abort();
    free(tok);
    free(tgt);
    zpp_data_close(d);
    return 0;
}
