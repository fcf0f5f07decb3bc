/* quant/quant_layout.h — the sizes and constants of the wire layout
 * (zeropp.h), inline: the public zpp_quant_payload_bytes & co. (quant.c),
 * the CPU kernels (quant_kernels.h, compiled once per CPU instruction set)
 * and the CUDA kernels (quant_cuda.cu) share them. */
#ifndef ZPP_QUANT_LAYOUT_H
#define ZPP_QUANT_LAYOUT_H

#include <stddef.h>

#include "zeropp.h"

static inline size_t zpp_ql_round16(size_t b) {
    return (b + ZPP_QUANT_ALIGN - 1) / ZPP_QUANT_ALIGN * ZPP_QUANT_ALIGN;
}

static inline size_t zpp_ql_payload_bytes(size_t n, int bits) {
    if (bits == 8) return n;
    if (bits == 4) return n / 2 + (n & 1);
    return 0;
}

static inline size_t zpp_ql_scales_offset(size_t n, int bits) {
    return zpp_ql_round16(zpp_ql_payload_bytes(n, bits));
}

static inline size_t zpp_ql_num_blocks(size_t n, size_t block) {
    if (block == 0) return 0;
    return n / block + (n % block != 0);
}

/* The largest |payload integer|: int8 127, int4 7, E2M1 12 (half units:
 * the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} times 2). */
static inline float zpp_ql_qmax(const zpp_quant_spec *spec) {
    if (spec->format == ZPP_QUANT_E2M1) return 12.0f;
    return spec->bits == 8 ? 127.0f : 7.0f;
}

/* What absmax is divided by for the stored scale: qmax, or E2M1's 6 (the
 * grid's largest value stands for absmax). */
static inline float zpp_ql_scale_div(const zpp_quant_spec *spec) {
    return spec->format == ZPP_QUANT_E2M1 ? 6.0f : zpp_ql_qmax(spec);
}

static inline size_t zpp_ql_bytes(size_t n, const zpp_quant_spec *spec) {
    if (!spec) return 0;
    return zpp_ql_round16(zpp_ql_scales_offset(n, spec->bits) +
                          4 * zpp_ql_num_blocks(n, spec->block));
}

#endif
