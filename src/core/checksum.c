/* core/checksum.c — the four-lane word checksum (checksum.h). */
#include "core/checksum.h"

#include <string.h>

#include "core/random.h"

static uint64_t load_le64(const unsigned char *p) {
    uint64_t w = 0;
    for (int k = 7; k >= 0; k--) w = w << 8 | p[k];
    return w;
}

static uint64_t lane_step(uint64_t lane, uint64_t word) {
    const uint64_t x = lane ^ word;
    return ((x << 29) | (x >> 35)) * ZPP_GOLDEN64;
}

/* One 32-byte block: four words, one to each lane. */
static void block(uint64_t lane[4], const unsigned char *p) {
    for (int j = 0; j < 4; j++) lane[j] = lane_step(lane[j], load_le64(p + 8 * j));
}

void zpp_checksum_add(zpp_checksum *c, const void *p, size_t n) {
    const unsigned char *b = p;
    c->bytes += n;
    if (c->n_tail) { /* finish the block begun by an earlier call */
        size_t take = 32 - c->n_tail < n ? 32 - c->n_tail : n;
        memcpy(c->tail + c->n_tail, b, take);
        c->n_tail += take, b += take, n -= take;
        if (c->n_tail < 32) return;
        block(c->lane, c->tail);
        c->n_tail = 0;
    }
    for (; n >= 32; b += 32, n -= 32) block(c->lane, b);
    memcpy(c->tail, b, n);
    c->n_tail = n;
}

uint64_t zpp_checksum_value(const zpp_checksum *c) {
    uint64_t lane[4];
    memcpy(lane, c->lane, sizeof lane);
    if (c->n_tail) { /* the last block, padded with zeros */
        unsigned char last[32] = {0};
        memcpy(last, c->tail, c->n_tail);
        block(lane, last);
    }
    uint64_t h = 0;
    for (int j = 0; j < 4; j++) h = zpp_mix64(h ^ lane[j]);
    return zpp_mix64(h ^ c->bytes);
}
