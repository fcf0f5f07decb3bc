/* collectives/coll_data.h — synthetic units for checking the collectives: the
 * one generator of the weights and gradients that tests/test_collectives.c
 * and `zeropp bench comm` feed to the collectives and check them against.
 *
 * Every element is a pure function of (seed, unit, rank, i): no state, no
 * order. So each rank can compute any rank's data, and with it a
 * single-process reference of what the world as a whole must produce, and a
 * loop over elements can run on any number of threads (the bench builds its
 * 1 GiB references with OpenMP). An element costs three or four 64-bit
 * hashes (core/random.h) and no transcendental function. Indices go up to
 * 2^44 and ranks up to 2^20 - 4, far beyond any unit and world.
 *
 * The values:
 *   weight  u * m, u uniform in [-1, 1);
 *   grad    (u_shared + 0.5 u_rank) * m, or u_shared * m with `same`;
 * where m = 2^k, k uniform in -4 .. 3, is drawn anew for every 37
 * consecutive elements (shared by the unit's weights and gradients). The
 * magnitudes vary so that quantization blocks (int8 256, int4 128, the
 * tests' 32 and 64) see different scales, and a block can straddle two
 * segments whose scales differ up to 2^7: its small part quantizes to a
 * few levels and still has to stay within the block's bound. The gradient
 * is a part shared by every rank plus a per-rank part: the world mean is of
 * the size of one gradient, and each rank's differs, so summing the wrong
 * pieces (a rank twice, a node's sum divided by the node count) shows. With
 * `same` every rank holds the same gradient, whose world mean is that
 * gradient.
 *
 * |weight| <= 2^3, |grad| <= 1.5 * 2^3: bf16 and fp16 hold them. Each value is
 * rounded to `dtype` (bf16, fp16 or fp32), so it is exactly what an array of
 * that dtype stores; elements past numel (a unit's padding) are zero. */
#ifndef ZPP_COLLECTIVES_COLL_DATA_H
#define ZPP_COLLECTIVES_COLL_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

/* Element i of unit `unit`'s weights. */
float zpp_coll_data_weight(uint64_t seed, uint64_t unit, size_t i, size_t numel,
                           zpp_dtype dtype);

/* Element i of rank `rank`'s gradient of unit `unit`; `same`: every rank's
 * gradient is the shared part alone. */
float zpp_coll_data_grad(uint64_t seed, uint64_t unit, int rank, size_t i, size_t numel,
                         zpp_dtype dtype, int same);

#endif
