/* quant/quant.c — block quantization, the CPU reference (wire layout and
 * rounding rules: zeropp.h, docs/quantization.md).
 *
 * The math, per block of at most `block` elements:
 *
 *     absmax = max |x|          (fp32; bf16/fp16 converted exactly)
 *     scale  = absmax / qmax    (fp32 IEEE division; this is what is stored)
 *     inv    = qmax / absmax    (fp32 IEEE division)
 *     q      = clamp(rint(x * inv), -qmax, qmax)              round half even
 *     q      = clamp(floor(x * inv + u), -qmax, qmax)         stochastic,
 *                  u = zpp_quant_uniform(seed, element index)
 *     y      = (float)q * scale, then rounded to the output dtype
 *
 * E2M1 (4 bits, zeropp.h) runs the same steps in half units: qmax = 12,
 * the stored scale absmax / 6, q rounded to the grid {0, 1, 2, 3, 4, 6, 8,
 * 12} instead of the integers (quant_kernels.h, zpp__e2m1_rne_code / _floor),
 * y = (float)q * (scale / 2).
 *
 * Every product and sum is its own statement and the build forbids
 * contracting a*b+c into an FMA (-ffp-contract=off, CMakeLists.txt; ISO C
 * mode implies it too), so each operation is one IEEE fp32 rounding, on
 * every instruction set the loops are compiled for; CUDA must match this with
 * __fmul_rn / __fadd_rn (nvcc fuses by default).
 *
 * Edge cases, defined so CPU and GPU agree:
 *   - absmax == 0: scale 0, payload 0.
 *   - 0 < absmax < qmax / FLT_MAX (about 3.7e-37 for int8): inv overflows
 *     to +Inf; the formula is followed literally with NaN -> 0 and +-Inf
 *     saturating (zpp__q_tiny): q = sign(x) * qmax, or 0 where x == 0.
 *   - a NaN or Inf in the block: scale NaN (bits 0x7fc00000), payload 0.
 *
 * The loops themselves are in quant_kernels.h, compiled once per CPU
 * instruction set (generic, AVX2, AVX-512; quant_isa.h) with identical
 * results; this file checks the arguments and calls the loops of the
 * instruction set chosen at run time (core/cpu.h).
 */
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "quant/quant_cpu.h"
#include "quant/quant_isa.h"
#include "quant/quant_layout.h"

#define ZPP__MAX_BLOCK ((size_t)1 << 20)
#define ZPP__NONE ZPP_QUANT_NONE

/* The loops of the instruction set in use: one relaxed atomic load per call
 * (a call quantizes a whole tensor, so the dispatch costs nothing). */
static const zpp_quant_kernels *active_kernels(void) {
    switch (zpp_cpu_isa_active()) {
#if ZPP_CPU_X86_PATHS
    case ZPP_CPU_AVX512: return &zpp_quant_kernels_avx512;
    case ZPP_CPU_AVX2: return &zpp_quant_kernels_avx2;
#endif
    default: return &zpp_quant_kernels_generic;
    }
}

/* ------------------------------------------------------------------------ */
/* Spec and layout                                                           */
/* ------------------------------------------------------------------------ */

zpp_quant_spec zpp_quant_spec_default(int bits) {
    zpp_quant_spec s;
    s.bits = bits;
    s.block = bits == 4 ? ZPP_QUANT_DEFAULT_BLOCK_INT4 : ZPP_QUANT_DEFAULT_BLOCK_INT8;
    s.stochastic = 0;
    s.seed = 0;
    s.format = ZPP_QUANT_INT;
    return s;
}

zpp_status zpp_quant_spec_check(const zpp_quant_spec *spec) {
    if (!spec) return zpp_error(ZPP_ERR_INVALID, "quantization spec is NULL");
    if (spec->bits != 8 && spec->bits != 4)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: %d bits is not supported; use 8 (int8) or 4 (int4)",
                         spec->bits);
    if (spec->block == 0 || spec->block % 8 != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: block size %zu is not a positive multiple of 8; use "
                         "32, 64, 128, 256, ... (defaults: %d for int8, %d for int4)",
                         spec->block, ZPP_QUANT_DEFAULT_BLOCK_INT8,
                         ZPP_QUANT_DEFAULT_BLOCK_INT4);
    if (spec->block > ZPP__MAX_BLOCK)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: block size %zu exceeds the maximum %zu; use a smaller "
                         "block",
                         spec->block, ZPP__MAX_BLOCK);
    if (spec->format != ZPP_QUANT_INT && spec->format != ZPP_QUANT_E2M1)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: format %d is unknown; use ZPP_QUANT_INT (0) or "
                         "ZPP_QUANT_E2M1 (1)",
                         spec->format);
    if (spec->format == ZPP_QUANT_E2M1 && spec->bits != 4)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: E2M1 elements are 4 bits, not %d; set bits to 4",
                         spec->bits);
    if (spec->stochastic != 0 && spec->stochastic != 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "quantization spec: stochastic is %d; use 0 (round half to even) or 1",
                         spec->stochastic);
    return ZPP_OK;
}

size_t zpp_quant_payload_bytes(size_t n, int bits) { return zpp_ql_payload_bytes(n, bits); }

size_t zpp_quant_scales_offset(size_t n, int bits) { return zpp_ql_scales_offset(n, bits); }

size_t zpp_quant_num_blocks(size_t n, size_t block) { return zpp_ql_num_blocks(n, block); }

size_t zpp_quant_bytes(size_t n, const zpp_quant_spec *spec) { return zpp_ql_bytes(n, spec); }

static zpp_status check_dtype(const char *what, zpp_dtype dtype) {
    if (zpp_dtype_size(dtype) == 0)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d; use ZPP_FP32, ZPP_BF16 or "
                                          "ZPP_FP16",
                         what, (int)dtype);
    return ZPP_OK;
}

static zpp_status check_ptr(const char *what, const void *p, const char *name, size_t n) {
    if (!p && n > 0) return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL", what, name);
    return ZPP_OK;
}

static zpp_status nonfinite_error(const char *what, uint64_t index) {
    return zpp_error(ZPP_ERR_NONFINITE,
                     "%s: element %llu is NaN or Inf (the first one); its block is stored "
                     "with a NaN scale and dequantizes to NaN, the other blocks are "
                     "quantized normally; find where the non-finite value comes from "
                     "(e.g. a diverged loss or too high a learning rate)",
                     what, (unsigned long long)index);
}

zpp_status zpp_quantize(const void *x, zpp_dtype dtype, size_t n, const zpp_quant_spec *spec,
                        void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_dtype("quantize", dtype));
    ZPP_CHECK(check_ptr("quantize", x, "input", n));
    ZPP_CHECK(check_ptr("quantize", out, "output", n));
    uint64_t bad = active_kernels()->quantize(x, dtype, n, spec, 0, out);
    if (bad != ZPP__NONE) return nonfinite_error("quantize", bad);
    return ZPP_OK;
}

zpp_status zpp_dequantize(const void *q, size_t n, const zpp_quant_spec *spec, zpp_dtype dtype,
                          void *y) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_dtype("dequantize", dtype));
    ZPP_CHECK(check_ptr("dequantize", q, "input", n));
    ZPP_CHECK(check_ptr("dequantize", y, "output", n));
    active_kernels()->dequantize(q, n, spec, dtype, y);
    return ZPP_OK;
}

zpp_status zpp_dequantize_accumulate(const void *q, size_t n, const zpp_quant_spec *spec,
                                     float *acc) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_ptr("dequantize-accumulate", q, "input", n));
    ZPP_CHECK(check_ptr("dequantize-accumulate", acc, "accumulator", n));
    active_kernels()->accumulate(q, n, spec, 0, n, acc);
    return ZPP_OK;
}

/* ------------------------------------------------------------------------ */
/* Chunks, qgZ reorder, dequantize-sum-requantize                            */
/* ------------------------------------------------------------------------ */

zpp_status zpp_quant_cpu_quantize_chunks(const void *in, zpp_dtype dtype, size_t n_chunks,
                                         size_t chunk_len, const zpp_quant_spec *spec,
                                         void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_dtype("quantize", dtype));
    ZPP_CHECK(check_ptr("quantize", in, "input", n_chunks * chunk_len));
    ZPP_CHECK(check_ptr("quantize", out, "output", n_chunks * chunk_len));
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(chunk_len, spec);
    const zpp_quant_kernels *kern = active_kernels();
    uint64_t first_bad = ZPP__NONE;
    for (size_t c = 0; c < n_chunks; c++) {
        uint64_t bad = kern->quantize((const char *)in + c * chunk_len * es, dtype, chunk_len,
                                      spec, (uint64_t)c * chunk_len, (char *)out + c * qb);
        if (bad != ZPP__NONE && first_bad == ZPP__NONE) first_bad = bad;
    }
    if (first_bad != ZPP__NONE) return nonfinite_error("quantize", first_bad);
    return ZPP_OK;
}

zpp_status zpp_quant_cpu_dequantize_chunks(const void *q, size_t n_chunks, size_t chunk_len,
                                           const zpp_quant_spec *spec, zpp_dtype dtype,
                                           void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_dtype("dequantize", dtype));
    ZPP_CHECK(check_ptr("dequantize", q, "input", n_chunks * chunk_len));
    ZPP_CHECK(check_ptr("dequantize", out, "output", n_chunks * chunk_len));
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(chunk_len, spec);
    const zpp_quant_kernels *kern = active_kernels();
    for (size_t c = 0; c < n_chunks; c++)
        kern->dequantize((const uint8_t *)q + c * qb, chunk_len, spec, dtype,
                         (char *)out + c * chunk_len * es);
    return ZPP_OK;
}

zpp_status zpp_quant_reorder_quantize(const void *x, zpp_dtype dtype, size_t chunk_len,
                                      int nodes, int local, const zpp_quant_spec *spec,
                                      void *out) {
    return zpp_quant_cpu_reorder_quantize(x, dtype, chunk_len, 0, chunk_len, nodes, local,
                                          spec, out);
}

static zpp_status check_slab(const char *what, size_t chunk_len, size_t first, size_t len) {
    if (first > chunk_len || len > chunk_len - first)
        return zpp_error(ZPP_ERR_INVALID, "%s: slab [%zu, %zu) runs past a chunk of %zu elements",
                         what, first, first + len, chunk_len);
    return ZPP_OK;
}

zpp_status zpp_quant_cpu_reorder_quantize(const void *x, zpp_dtype dtype, size_t chunk_len,
                                          size_t first, size_t len, int nodes, int local,
                                          const zpp_quant_spec *spec, void *out) {
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_dtype("reorder-quantize", dtype));
    if (nodes < 1 || local < 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "reorder-quantize: nodes %d and local %d must both be >= 1", nodes,
                         local);
    ZPP_CHECK(check_slab("reorder-quantize", chunk_len, first, len));
    size_t n = (size_t)nodes * (size_t)local * len;
    ZPP_CHECK(check_ptr("reorder-quantize", x, "input", n));
    ZPP_CHECK(check_ptr("reorder-quantize", out, "output", n));
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(len, spec);
    const zpp_quant_kernels *kern = active_kernels();
    uint64_t first_bad = ZPP__NONE;
    size_t slot = 0;
    for (int dl = 0; dl < local; dl++) {
        for (int node = 0; node < nodes; node++, slot++) {
            size_t r = (size_t)node * (size_t)local + (size_t)dl; /* destination rank */
            size_t at = r * chunk_len + first; /* index of the slab's first element */
            uint64_t bad = kern->quantize((const char *)x + at * es, dtype, len, spec,
                                          (uint64_t)at, (char *)out + slot * qb);
            if (bad != ZPP__NONE && (first_bad == ZPP__NONE || bad < first_bad))
                first_bad = bad;
        }
    }
    if (first_bad != ZPP__NONE) return nonfinite_error("reorder-quantize", first_bad);
    return ZPP_OK;
}

/* The shared checks of both dequant-sum-requant entry points, then the
 * loop (zpp_quant_kernels.sum_requant): input j is ins[j], or
 * base + j * stride when ins is NULL. Chunks of chunk_len elements (the
 * slab's own length); element i of chunk c draws the stochastic index
 * c * idx_stride + idx_first + i. */
static zpp_status dsr(const void *const *ins, const uint8_t *base, size_t stride, int k,
                      size_t n_chunks, size_t chunk_len, size_t idx_stride, size_t idx_first,
                      const zpp_quant_spec *in_spec, const zpp_quant_spec *out_spec, void *out) {
    const char *what = "dequant-sum-requant";
    ZPP_CHECK(zpp_quant_spec_check(in_spec));
    ZPP_CHECK(zpp_quant_spec_check(out_spec));
    if (k < 1) return zpp_error(ZPP_ERR_INVALID, "%s: k = %d inputs; need at least 1", what, k);
    size_t n = n_chunks * chunk_len;
    ZPP_CHECK(check_ptr(what, out, "output", n));
    if (n == 0) return ZPP_OK;
    if (ins) {
        for (int j = 0; j < k; j++)
            if (!ins[j]) return zpp_error(ZPP_ERR_INVALID, "%s: input %d is NULL", what, j);
    } else {
        ZPP_CHECK(check_ptr(what, base, "input", n));
    }

    /* The loop sums one output block in fp32 at a time (it stays in cache
     * between the sum and the requantize). */
    size_t cap = out_spec->block < chunk_len ? out_spec->block : chunk_len;
    float stack_sum[2048];
    float *sum = stack_sum;
    if (cap > sizeof stack_sum / sizeof stack_sum[0]) {
        sum = malloc(cap * sizeof *sum);
        if (!sum)
            return zpp_error(ZPP_ERR_NOMEM, "%s: could not allocate %zu bytes of scratch", what,
                             cap * sizeof *sum);
    }
    uint64_t first_bad =
        active_kernels()->sum_requant(ins, base, stride, k, n_chunks, chunk_len, idx_stride,
                                      idx_first, in_spec, out_spec, sum, out);
    if (sum != stack_sum) free(sum);
    if (first_bad != ZPP__NONE) return nonfinite_error(what, first_bad);
    return ZPP_OK;
}

zpp_status zpp_quant_dequant_sum_requant(const void *const *in, int k, size_t n_chunks,
                                         size_t chunk_len, const zpp_quant_spec *in_spec,
                                         const zpp_quant_spec *out_spec, void *out) {
    if (!in) return zpp_error(ZPP_ERR_INVALID, "dequant-sum-requant: input list is NULL");
    return dsr(in, NULL, 0, k, n_chunks, chunk_len, chunk_len, 0, in_spec, out_spec, out);
}

zpp_status zpp_quant_cpu_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                             size_t chunk_len, size_t first, size_t len,
                                             const zpp_quant_spec *in_spec,
                                             const zpp_quant_spec *out_spec, void *out) {
    ZPP_CHECK(check_slab("dequant-sum-requant", chunk_len, first, len));
    size_t stride = in_spec ? n_chunks * zpp_quant_bytes(len, in_spec) : 0;
    return dsr(NULL, in, stride, k, n_chunks, len, chunk_len, first, in_spec, out_spec, out);
}

/* ------------------------------------------------------------------------ */
/* qgZ's last step and dtype conversion                                      */
/* ------------------------------------------------------------------------ */

zpp_status zpp_quant_cpu_dequant_reduce(const void *q, size_t n_chunks, size_t stride,
                                        size_t chunk_len, const zpp_quant_spec *spec,
                                        const float *exact, float scale, float *out) {
    const char *what = "dequant-reduce";
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(check_ptr(what, out, "output", chunk_len));
    ZPP_CHECK(check_ptr(what, q, "input", n_chunks * chunk_len));
    const size_t qb = zpp_quant_bytes(chunk_len, spec);
    if (!stride) stride = qb;
    if (n_chunks > 1 && stride < qb)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: inputs %zu bytes apart overlap (each is %zu bytes)", what, stride,
                         qb);
    active_kernels()->dequant_reduce(q, n_chunks, stride, chunk_len, spec, exact, scale, out);
    return ZPP_OK;
}

zpp_status zpp_quant_cpu_convert(const void *in, zpp_dtype in_dtype, void *out,
                                 zpp_dtype out_dtype, size_t n, float scale) {
    ZPP_CHECK(check_dtype("convert", in_dtype));
    ZPP_CHECK(check_dtype("convert", out_dtype));
    ZPP_CHECK(check_ptr("convert", in, "input", n));
    ZPP_CHECK(check_ptr("convert", out, "output", n));
    if (in == out && in_dtype != out_dtype && n > 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "convert: in-place conversion from %s to %s; use separate buffers",
                         zpp_dtype_name(in_dtype), zpp_dtype_name(out_dtype));
    /* The kernel reads a whole tile before writing it, so in == out is safe. */
    active_kernels()->convert(in, in_dtype, out, out_dtype, n, scale);
    return ZPP_OK;
}

/* One tensor whose element 0 draws stochastic index idx0: the building
 * block of the error-feedback variants (quant_ef.c), which quantize a
 * corrected copy of a slab one chunk at a time. */
zpp_status zpp_quant_cpu_quantize_at(const void *x, zpp_dtype dtype, size_t n,
                                     const zpp_quant_spec *spec, uint64_t idx0, void *out) {
    uint64_t bad = active_kernels()->quantize(x, dtype, n, spec, idx0, out);
    if (bad != ZPP__NONE) return nonfinite_error("quantize", bad);
    return ZPP_OK;
}
