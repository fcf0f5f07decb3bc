/* quant/quant_ef.c — error feedback for qgZ's two quantizations (LoCo), CPU.
 *
 * The plain kernels (quant.c) quantize v; these quantize x = v + err, where
 * err is what the previous quantizations of the same elements lost, and
 * then update err (quant_cpu.h has the formula; docs/quantization.md, "Error
 * feedback", the why). They are built from the reference's own pieces, one
 * chunk slab at a time: x is formed in fp32, quantized by the same code as
 * an fp32 tensor (zpp_quant_cpu_quantize_at, with the element's place in
 * the whole input as its stochastic index), dequantized back to fp32, and
 * err updated from the difference. So the wire bytes are, by construction,
 * those of the plain kernel applied to x, and the CUDA twins
 * (quant_cuda.cu) are checked against these bit for bit.
 *
 * Non-finite: a block holding NaN or Inf is stored as the plain kernels
 * store it (NaN scale, zero payload) and ZPP_ERR_NONFINITE is returned (the
 * host device turns it into its flag); the error of such elements is set
 * to 0, so one bad step does not poison the buffer for every later one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "quant/quant_cpu.h"

/* err[i] = beta * err[i] + omb * (x[i] - y[i]); 0 where not finite. */
static void ef_update(float *restrict err, const float *restrict x, const float *restrict y,
                      size_t len, float beta, float omb) {
    for (size_t i = 0; i < len; i++) {
        float d = x[i] - y[i];
        float a = beta * err[i];
        float b = omb * d;
        float e = a + b;
        err[i] = isfinite(e) ? e : 0.0f;
    }
}

static zpp_status ef_check(const char *what, const float *err, float beta, size_t chunk_len,
                           size_t first, size_t len) {
    if (!err) return zpp_error(ZPP_ERR_INVALID, "%s: the error buffer is NULL", what);
    if (!(beta >= 0.0f && beta <= 1.0f))
        return zpp_error(ZPP_ERR_INVALID, "%s: err_beta %g is outside [0, 1]", what,
                         (double)beta);
    if (first > chunk_len || len > chunk_len - first)
        return zpp_error(ZPP_ERR_INVALID, "%s: slab [%zu, %zu) runs past a chunk of %zu elements",
                         what, first, first + len, chunk_len);
    return ZPP_OK;
}

/* Two fp32 scratch rows of len elements (x and its dequantized copy). */
static zpp_status ef_rows(const char *what, size_t len, float **x_p) {
    *x_p = malloc((2 * len + 1) * sizeof(float));
    if (!*x_p)
        return zpp_error(ZPP_ERR_NOMEM, "%s: could not allocate %zu bytes of scratch", what,
                         2 * len * sizeof(float));
    return ZPP_OK;
}

/* Quantizes the corrected row x (len fp32 elements, stream index idx0) into
 * out and updates err from it; y is scratch. Keeps the first non-finite
 * status in *soft_p. */
static zpp_status ef_quantize_row(const float *x, float *y, float *err, size_t len,
                                  const zpp_quant_spec *spec, uint64_t idx0, float beta,
                                  float omb, void *out, zpp_status *soft_p) {
    zpp_status st = zpp_quant_cpu_quantize_at(x, ZPP_FP32, len, spec, idx0, out);
    if (st == ZPP_ERR_NONFINITE) {
        if (*soft_p == ZPP_OK) *soft_p = st;
    } else if (st != ZPP_OK) {
        return st;
    }
    ZPP_CHECK(zpp_dequantize(out, len, spec, ZPP_FP32, y));
    ef_update(err, x, y, len, beta, omb);
    return ZPP_OK;
}

/* A kernel's status: a hard error with the kernel's name, else the soft
 * one of a non-finite block (the block was stored, the run goes on). */
static zpp_status ef_status(const char *what, zpp_status st, zpp_status soft) {
    if (st != ZPP_OK) return zpp_error_context(st, "%s", what);
    if (soft != ZPP_OK)
        return zpp_error(soft, "%s: a block held NaN or Inf (stored with a NaN scale; its "
                               "error set to 0)", what);
    return ZPP_OK;
}

zpp_status zpp_quant_cpu_ef_reorder_quantize(const void *in, zpp_dtype dtype, float *err,
                                             float beta, size_t chunk_len, size_t first,
                                             size_t len, int nodes, int local,
                                             const zpp_quant_spec *spec, void *out) {
    const char *what = "error-feedback reorder-quantize";
    ZPP_CHECK(zpp_quant_spec_check(spec));
    ZPP_CHECK(ef_check(what, err, beta, chunk_len, first, len));
    if (nodes < 1 || local < 1)
        return zpp_error(ZPP_ERR_INVALID, "%s: nodes %d and local %d must both be >= 1", what,
                         nodes, local);
    if (len == 0) return ZPP_OK;
    if (!in || !out) return zpp_error(ZPP_ERR_INVALID, "%s: NULL input or output", what);
    const size_t es = zpp_dtype_size(dtype), qb = zpp_quant_bytes(len, spec);
    if (!es) return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d", what, (int)dtype);
    const float omb = 1.0f - beta;
    float *x = NULL;
    ZPP_CHECK(ef_rows(what, len, &x));
    float *y = x + len;
    zpp_status soft = ZPP_OK, st = ZPP_OK;
    size_t slot = 0;
    for (int dl = 0; dl < local && st == ZPP_OK; dl++) {
        for (int node = 0; node < nodes && st == ZPP_OK; node++, slot++) {
            size_t r = (size_t)node * (size_t)local + (size_t)dl; /* destination rank */
            size_t at = r * chunk_len + first;
            /* x = widen(v) + err: the widening is exact, the sum one rounding */
            st = zpp_quant_cpu_convert((const char *)in + at * es, dtype, x, ZPP_FP32, len,
                                       1.0f);
            for (size_t i = 0; st == ZPP_OK && i < len; i++) x[i] = x[i] + err[at + i];
            if (st == ZPP_OK)
                st = ef_quantize_row(x, y, err + at, len, spec, at, beta, omb,
                                     (char *)out + slot * qb, &soft);
        }
    }
    free(x);
    return ef_status(what, st, soft);
}

zpp_status zpp_quant_cpu_ef_dequant_sum_requant(const void *in, int k, size_t n_chunks,
                                                size_t chunk_len, size_t first, size_t len,
                                                const zpp_quant_spec *in_spec,
                                                const zpp_quant_spec *out_spec, float *err,
                                                float beta, void *out) {
    const char *what = "error-feedback dequant-sum-requant";
    ZPP_CHECK(zpp_quant_spec_check(in_spec));
    ZPP_CHECK(zpp_quant_spec_check(out_spec));
    ZPP_CHECK(ef_check(what, err, beta, chunk_len, first, len));
    if (k < 1) return zpp_error(ZPP_ERR_INVALID, "%s: k = %d inputs; need at least 1", what, k);
    if (len == 0 || n_chunks == 0) return ZPP_OK;
    if (!in || !out) return zpp_error(ZPP_ERR_INVALID, "%s: NULL input or output", what);
    const size_t qin = zpp_quant_bytes(len, in_spec), qout = zpp_quant_bytes(len, out_spec);
    const float omb = 1.0f - beta;
    float *x = NULL;
    ZPP_CHECK(ef_rows(what, len, &x));
    float *y = x + len;
    zpp_status soft = ZPP_OK, st = ZPP_OK;
    for (size_t c = 0; c < n_chunks && st == ZPP_OK; c++) {
        size_t at = c * chunk_len + first;
        /* the fp32 sum of the k inputs in input order, from 0, as the plain
         * kernel forms it; then one more rounding for the correction */
        memset(x, 0, len * sizeof *x);
        for (int j = 0; j < k && st == ZPP_OK; j++)
            st = zpp_dequantize_accumulate((const char *)in + ((size_t)j * n_chunks + c) * qin,
                                           len, in_spec, x);
        for (size_t i = 0; st == ZPP_OK && i < len; i++) x[i] = x[i] + err[at + i];
        if (st == ZPP_OK)
            st = ef_quantize_row(x, y, err + at, len, out_spec, at, beta, omb,
                                 (char *)out + c * qout, &soft);
    }
    free(x);
    return ef_status(what, st, soft);
}
