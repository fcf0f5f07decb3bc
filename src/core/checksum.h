/* core/checksum.h — a 64-bit checksum of a byte stream at memory speed, for
 * checkpoint files (train/checkpoint.c, format 4 on).
 *
 * Why not FNV-1a, which formats 2 and 3 used: it multiplies once per byte,
 * each multiply waiting for the last, so one core sums a byte per multiply
 * latency, far below what a disk or memory moves; a large checkpoint spent
 * longer summing than reading (bench/RESULTS.md). This one reads 8-byte words into four
 * independent lanes (word i goes to lane i mod 4), so the multiplies of four
 * words overlap:
 *     lane = rotl(lane ^ word, 29) * K        (K = 2^64 / golden ratio, odd)
 * and at the end folds the lanes and the byte count:
 *     h = mix64(h ^ lane_j) for j = 0..3 (h from 0), then mix64(h ^ bytes)
 * Each step is a bijection of the lane given the word, and the fold is one
 * of h given each lane, so changing any one word always changes the sum;
 * the byte count tells streams apart that differ only in trailing zeros
 * (the last partial block is padded with zeros). A checksum against torn
 * writes and bit rot, not an adversary.
 *
 * Streaming: any split of the stream into zpp_checksum_add calls gives the
 * same sum. The zero struct is the initial state. */
#ifndef ZPP_CORE_CHECKSUM_H
#define ZPP_CORE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

typedef struct zpp_checksum {
    uint64_t lane[4];
    unsigned char tail[32]; /* the bytes of an unfinished 32-byte block */
    size_t n_tail;
    uint64_t bytes; /* every byte added */
} zpp_checksum;

void zpp_checksum_add(zpp_checksum *c, const void *p, size_t n);
/* The sum of the bytes added so far (c is left as it is). */
uint64_t zpp_checksum_value(const zpp_checksum *c);

#endif
