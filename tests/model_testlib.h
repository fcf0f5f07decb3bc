/* model_testlib.h — checks shared by the CPU and CUDA model tests. */
#ifndef ZPP_MODEL_TESTLIB_H
#define ZPP_MODEL_TESTLIB_H

#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "testlib.h"

/* set_batch refuses a token or target outside [0, V) at a random one of the
 * n positions, naming it and its position; and a batch of 0, of B + 1 or
 * without tokens. tok and tgt are restored. */
static inline void zpp_test_set_batch_rejects(zpp_model *m, zpp_rng *r, int32_t *tok,
                                              int32_t *tgt, size_t n, int B, int V) {
    size_t pos = zpp_rng_u64(r) % n;
    int32_t bad[2] = {V + (int32_t)(zpp_rng_u64(r) % 1000), -1 - (int32_t)(zpp_rng_u64(r) % 5)};
    for (int k = 0; k < 2; k++) {
        int32_t save = tok[pos];
        tok[pos] = bad[k];
        EXPECT_STATUS(m->ops->set_batch(m, tok, tgt, B), ZPP_ERR_INVALID);
        char want[64];
        snprintf(want, sizeof want, "token %d at position %zu", (int)bad[k], pos);
        EXPECT(strstr(zpp_last_error(), want) != NULL, "message '%s' lacks '%s'",
               zpp_last_error(), want);
        tok[pos] = save;
        save = tgt[pos];
        tgt[pos] = bad[k];
        EXPECT_STATUS(m->ops->set_batch(m, tok, tgt, B), ZPP_ERR_INVALID);
        snprintf(want, sizeof want, "target %d at position %zu", (int)bad[k], pos);
        EXPECT(strstr(zpp_last_error(), want) != NULL, "message '%s' lacks '%s'",
               zpp_last_error(), want);
        tgt[pos] = save;
    }
    EXPECT_STATUS(m->ops->set_batch(m, tok, tgt, 0), ZPP_ERR_INVALID);
    EXPECT_STATUS(m->ops->set_batch(m, tok, tgt, B + 1), ZPP_ERR_INVALID);
    EXPECT_STATUS(m->ops->set_batch(m, NULL, tgt, B), ZPP_ERR_INVALID);
}

#endif
