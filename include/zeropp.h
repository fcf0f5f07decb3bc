/*
 * zeropp.h — the one public header of libzeropp: ZeRO stage 3 sharded
 * data-parallel training with the ZeRO++ communication optimizations
 * (qwZ quantized weights, hpZ hierarchical partitioning, qgZ quantized
 * gradients).
 *
 * Conventions
 *   - C99-compatible; every public name starts with zpp_ / ZPP_.
 *   - Every fallible function returns a zpp_status. ZPP_OK is 0, errors are
 *     negative. On error, zpp_last_error() returns a message (thread-local)
 *     saying what was wrong and what to do; outputs are left untouched
 *     unless the function documents otherwise.
 *   - Handles are opaque; objects are created with *_create / *_open and
 *     freed with *_destroy / *_close.
 *   - Library code never prints on error and never exits.
 */
#ifndef ZEROPP_H
#define ZEROPP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZPP_VERSION_MAJOR 0
#define ZPP_VERSION_MINOR 1
#define ZPP_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* One list, expanded into the enum and into zpp_status_str(). */
#define ZPP_STATUS_LIST(X)                                                    \
    X(OK, 0, "success")                                                      \
    X(ERR_INVALID, -1, "invalid argument")                                   \
    X(ERR_NOMEM, -2, "out of memory")                                        \
    X(ERR_IO, -3, "input/output error")                                      \
    X(ERR_FORMAT, -4, "malformed input")                                     \
    X(ERR_CONFIG, -5, "invalid configuration")                               \
    X(ERR_NONFINITE, -6, "non-finite value (NaN or Inf)")                    \
    X(ERR_UNSUPPORTED, -7, "not supported in this build")                    \
    X(ERR_COMM, -8, "communication failure")                                 \
    X(ERR_CUDA, -9, "CUDA error")                                            \
    X(ERR_STATE, -10, "operation not valid in the current state")           \
    X(ERR_BLAS, -11, "BLAS error")                                          \
    X(ERR_TIMEOUT, -12, "timed out waiting for peer ranks")

typedef enum zpp_status {
#define ZPP_STATUS_ENUM_(name, value, text) ZPP_##name = value,
    ZPP_STATUS_LIST(ZPP_STATUS_ENUM_)
#undef ZPP_STATUS_ENUM_
} zpp_status;

/* Short name of a status ("invalid argument"). Never NULL. */
const char *zpp_status_str(zpp_status status);

/* The message of the last error raised on this thread, with its context
 * ("quantize: block size 12 is not a multiple of 8; use 32, 64, ..."), or ""
 * if none. Valid until the next failing call on this thread. */
const char *zpp_last_error(void);

/* "0.1.0" */
const char *zpp_version(void);

/* ------------------------------------------------------------------------ */
/* Element types                                                             */
/* ------------------------------------------------------------------------ */

typedef enum zpp_dtype {
    ZPP_FP32 = 0,
    ZPP_BF16 = 1,
    ZPP_FP16 = 2
} zpp_dtype;

/* Bytes per element of a dtype (4, 2, 2); 0 for an unknown value. */
size_t zpp_dtype_size(zpp_dtype dtype);
/* "fp32", "bf16", "fp16". */
const char *zpp_dtype_name(zpp_dtype dtype);
/* Parses "fp32" / "bf16" / "fp16". */
zpp_status zpp_dtype_parse(const char *name, zpp_dtype *dtype_p);

/* ------------------------------------------------------------------------ */
/* Block quantization                                                        */
/* ------------------------------------------------------------------------ */
/*
 * Symmetric block-wise quantization. An array of n elements is cut into
 * blocks of `block` consecutive elements (the last block may be shorter).
 * Each block b gets one fp32 scale
 *
 *     scale_b = absmax_b / qmax            qmax = 127 (int8) or 7 (int4)
 *
 * and each element is stored as the integer q = round(x * (qmax / absmax_b))
 * clamped to [-qmax, qmax]; it dequantizes to q * scale_b. Round-to-nearest
 * is round-half-to-even; stochastic rounding (optional) rounds up with
 * probability equal to the fractional part, so E[dequantized] = x.
 * An all-zero block has scale 0 and payload 0.
 *
 * WIRE LAYOUT (bytes that travel between machines; CPU and CUDA both follow
 * it, and it is repeated in DESIGN.md):
 *
 *     offset 0                      payload
 *        int8: n bytes, element i at byte i (two's complement)
 *        int4: ceil(n/2) bytes, element i in byte i/2, low nibble for even
 *              i, high nibble for odd i (two's complement nibble, -7..7);
 *              an odd n leaves the last high nibble 0
 *     payload zero-padded up to a multiple of 16 bytes
 *     offset zpp_quant_scales_offset()   scales
 *        ceil(n/block) little-endian IEEE fp32 values, block order
 *     total zpp_quant_bytes() = scales offset + 4 * ceil(n/block), rounded up
 *        to a multiple of 16 bytes (zero padding)
 *
 * Every quantized buffer therefore starts and ends on a 16-byte boundary, so
 * quantized chunks can be laid end to end and sent as one message.
 *
 * NON-FINITE INPUT: a block containing NaN or +-Inf cannot be scaled. Its
 * scale is stored as NaN and its payload as 0, so the whole block
 * dequantizes to NaN (a NaN never silently becomes a finite number), and the
 * call returns ZPP_ERR_NONFINITE naming the first offending element. All
 * other blocks are quantized normally.
 *
 * Block sizes must be a positive multiple of 8 (so that an int4 block is a
 * whole number of bytes and vector loads stay aligned), at most 1 << 20.
 */

/* Default blocks, measured on 2^22 N(0,1) fp32 values (rel L2 =
 * ||deq - x|| / ||x||; bits/elem include the 4-byte scale per block):
 *
 *     block   int8 rel L2  bits/elem   int4 rel L2  bits/elem
 *        32      0.00534      9.000       0.0970      5.000
 *        64      0.00593      8.500       0.1076      4.500
 *       128      0.00646      8.250       0.1173      4.250
 *       256      0.00696      8.125       0.1262      4.125
 *       512      0.00742      8.062       0.1346      4.062
 *      1024      0.00785      8.031       0.1425      4.031
 *      2048      0.00828      8.016       0.1502      4.016
 *
 * One more bit per element halves the error, so b extra bits are worth an
 * error cut of 1 - 2^-b (8.3% for 0.125 bits). int8: 256 -> 128 buys 7.2%
 * for 0.125 bits and 512 -> 256 buys 6.2% for 0.0625 (4.2% would break
 * even): 256 is the best trade. int4: 128 vs 256 is even (7.1% for 0.125
 * bits); 128 keeps more margin below 0.15 for heavier-tailed gradients. */
#define ZPP_QUANT_DEFAULT_BLOCK_INT8 256
#define ZPP_QUANT_DEFAULT_BLOCK_INT4 128
#define ZPP_QUANT_ALIGN 16

typedef struct zpp_quant_spec {
    int bits;         /* 8 or 4 */
    size_t block;     /* elements per scale; multiple of 8 */
    int stochastic;   /* 0: round half to even; 1: stochastic rounding */
    uint64_t seed;    /* stochastic rounding stream; vary it per call */
} zpp_quant_spec;

/* A spec with the default block for `bits`, round-to-nearest. */
zpp_quant_spec zpp_quant_spec_default(int bits);
/* Checks bits and block; ZPP_ERR_INVALID with a message otherwise. */
zpp_status zpp_quant_spec_check(const zpp_quant_spec *spec);

size_t zpp_quant_payload_bytes(size_t n, int bits);      /* unpadded */
size_t zpp_quant_scales_offset(size_t n, int bits);      /* padded payload */
size_t zpp_quant_num_blocks(size_t n, size_t block);
size_t zpp_quant_bytes(size_t n, const zpp_quant_spec *spec); /* whole buffer */

/* Quantizes n elements of `x` (dtype) into `out` (zpp_quant_bytes bytes). */
zpp_status zpp_quantize(const void *x, zpp_dtype dtype, size_t n,
                        const zpp_quant_spec *spec, void *out);

/* Dequantizes a buffer made by zpp_quantize into n elements of dtype. */
zpp_status zpp_dequantize(const void *q, size_t n, const zpp_quant_spec *spec,
                          zpp_dtype dtype, void *y);

/* acc[i] += dequantized q[i], fp32 accumulation. */
zpp_status zpp_dequantize_accumulate(const void *q, size_t n,
                                     const zpp_quant_spec *spec, float *acc);

/*
 * qgZ step 1, reorder + quantize. `x` holds a full gradient buffer of
 * nodes * local * chunk_len elements: chunk r (elements r*chunk_len ..) is
 * destined for global rank r = node * local + local_rank. The output is the
 * nodes * local chunks, each quantized on its own (zpp_quant_bytes(chunk_len)
 * bytes), laid end to end in the order
 *
 *     for dest_local in 0..local-1:  for node in 0..nodes-1:  chunk(node, dest_local)
 *
 * so that the `local` equal pieces of nodes * qbytes(chunk_len) bytes are
 * exactly what an intra-node all-to-all sends to each local rank: after it,
 * local rank s holds, from every peer of its node, the chunks of all ranks
 * with local index s, in node order — contiguous for the inter-node step.
 * With stochastic rounding, element indices for the random stream are the
 * element's index in x.
 */
zpp_status zpp_quant_reorder_quantize(const void *x, zpp_dtype dtype,
                                      size_t chunk_len, int nodes, int local,
                                      const zpp_quant_spec *spec, void *out);

/*
 * qgZ step 3, fused dequantize-sum-requantize. Each of the k inputs holds
 * n_chunks quantized chunks of chunk_len elements laid end to end (stride
 * zpp_quant_bytes(chunk_len, in_spec)). Chunk c of the output is
 * quantize(sum over inputs of dequantize(chunk c)), the sum taken in fp32 in
 * input order 0..k-1.
 */
zpp_status zpp_quant_dequant_sum_requant(const void *const *in, int k,
                                         size_t n_chunks, size_t chunk_len,
                                         const zpp_quant_spec *in_spec,
                                         const zpp_quant_spec *out_spec,
                                         void *out);

#ifdef __cplusplus
}
#endif

#endif /* ZEROPP_H */
