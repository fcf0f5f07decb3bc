/* collectives/coll_data.c — synthetic units for checking the collectives
 * (what and why: coll_data.h). */
#include "collectives/coll_data.h"

#include "core/dtype.h"
#include "core/random.h"

/* The streams of one unit: each element of each stream is its own hash. */
enum { STREAM_MAGNITUDE, STREAM_WEIGHT, STREAM_GRAD_SHARED, STREAM_GRAD_RANK0 };

/* Elements per magnitude segment: prime, so segments and power-of-two
 * blocks fall out of step and blocks straddle segments at every offset. */
#define SEGMENT 37

/* The unit's key: element `unit` of the splitmix64 stream from `seed`
 * (distinct units, distinct keys). */
static uint64_t unit_key(uint64_t seed, uint64_t unit) {
    return zpp_hash64(seed + unit * ZPP_GOLDEN64);
}

/* A uniform 64-bit word for index i (< 2^44) of stream s (< 2^20) under key
 * k: one hash of k and the pair packed in one word, so every (s, i) of a
 * unit is its own input to the hash. */
static uint64_t word(uint64_t k, uint64_t s, uint64_t i) {
    return zpp_hash64(k ^ (s << 44) ^ i);
}

/* Uniform in [-1, 1): the top 53 bits as a multiple of 2^-52, less 1. */
static double sym_unif(uint64_t w) { return (double)(w >> 11) * 0x1.0p-52 - 1.0; }

/* 2^k, k = -4 .. 3 from the top three bits of the segment's word. */
static double magnitude(uint64_t k, size_t i) {
    return (double)(1u << (word(k, STREAM_MAGNITUDE, i / SEGMENT) >> 61)) * 0x1p-4;
}

static float round_to(zpp_dtype dt, double v) {
    float f = (float)v;
    if (dt == ZPP_BF16) return zpp_bf16_to_f32(zpp_f32_to_bf16(f));
    if (dt == ZPP_FP16) return zpp_fp16_to_f32(zpp_f32_to_fp16(f));
    return f;
}

float zpp_coll_data_weight(uint64_t seed, uint64_t unit, size_t i, size_t numel,
                           zpp_dtype dtype) {
    if (i >= numel) return 0.0f;
    uint64_t k = unit_key(seed, unit);
    return round_to(dtype, sym_unif(word(k, STREAM_WEIGHT, i)) * magnitude(k, i));
}

float zpp_coll_data_grad(uint64_t seed, uint64_t unit, int rank, size_t i, size_t numel,
                         zpp_dtype dtype, int same) {
    if (i >= numel) return 0.0f;
    uint64_t k = unit_key(seed, unit);
    double g = sym_unif(word(k, STREAM_GRAD_SHARED, i));
    if (!same) g += 0.5 * sym_unif(word(k, STREAM_GRAD_RANK0 + (uint64_t)rank, i));
    return round_to(dtype, g * magnitude(k, i));
}
