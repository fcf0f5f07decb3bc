/* collectives/qgz_bound.h — how far qgZ's reduce-scatter may be from the
 * exact world mean: the one copy of the bound that tests/test_collectives.c
 * asserts and `zeropp bench comm` reports (max_err_over_bound). */
#ifndef ZPP_COLLECTIVES_QGZ_BOUND_H
#define ZPP_COLLECTIVES_QGZ_BOUND_H

#include "zeropp.h"

/*
 * The bound on |out - exact| for every element of one 4-bit block of a rank's
 * reduced shard (chunk d = this rank's part of every rank's gradient, block
 * b of the chunk), given sum_absmax = sum over the W ranks r of A_r, the
 * largest |g_r| over that block of rank r's chunk d:
 *   step 1, each rank quantizes its chunk: |e1_r| <= A_r / 7 / 2 (half an
 *     int4 step, absmax / 7; a full step with stochastic rounding);
 *   step 3, with node_size > 1 and nodes > 1, the node's fp32 sum of its S
 *     dequantized values is requantized: that block's absmax is at most
 *     sum over the node of A_s (|dequantized| <= the block absmax), so
 *     |e2_node| <= sum over the node of A_s / 14 (/ 7 stochastic);
 *   step 5 sums the N node sums and divides by W once.
 * So |out - exact| <= levels * sum_r A_r / 14 / W (/ 7 stochastic), with
 * levels = 2 when both the intra-node requantization and the inter-node hop
 * happen, else 1 (that path dequantizes the first quantization directly).
 * fp32 sums and the 1/W product add O(W u) relative (u = 2^-24), covered by
 * a 1e-3 relative margin; rounding the result to the output dtype is the
 * caller's to add. The rank's own contribution is added unquantized
 * (collectives.c), so its term of each sum above is in fact 0: the bound
 * keeps it, for simplicity, and is that much looser.
 *
 * E2M1 (qgZ's default) in place of int4: its widest gap is between 4 and 6
 * (absmax / 3 at scale absmax / 6), so half of it is absmax / 6 and the
 * divisors 14 and 7 above become 6 and 3. That is the worst case at the top
 * of a block; near 0 E2M1's gaps are absmax / 12, finer than int4's.
 */
double zpp_qgz_error_bound(double sum_absmax, int world, int node_size, int nodes,
                           const zpp_quant_spec *spec);

#endif
