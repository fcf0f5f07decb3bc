/* test_quant_cuda.c — the CUDA quantization kernels (quant_cuda.cu) against
 * the CPU reference (quant.c), byte for byte.
 *
 * There is no error bound to derive here: the kernels promise the same
 * IEEE fp32 operations in the same order as the reference (absmax, two
 * correctly rounded divisions, one rounded product, one rounded sum for
 * stochastic rounding, the same counter-based random stream), so payloads,
 * scales and padding must be bit-identical, and so must every dequantized
 * value except the bit pattern of a NaN (the GPU returns the canonical NaN,
 * the CPU propagates the NaN it started from; both are NaN, which is what
 * the wire contract promises).
 *
 * Every output buffer is poisoned with 0xAB before each launch and carries
 * a poisoned guard zone after it, so an unwritten byte (padding included)
 * or a write past the end is a mismatch. Inputs are fresh random data each
 * run, mixed per block: normal, heavy-tailed, all-zero, constant, one
 * outlier, tiny (absmax below qmax / FLT_MAX, where qmax / absmax
 * overflows), subnormal-sized. Sizes cover 1, 7, block-1, block, block+1,
 * several blocks with a ragged end, (1 << 22) + 5, and odd chunk lengths
 * (chunks that start off the 16-byte grid, taking the scalar path).
 *
 * Needs an NVIDIA GPU (label "gpu"); without one it fails saying so. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "quant/quant_cpu.h"
#include "quant/quant_cuda.h"
#include "cuda_testlib.h"
#include "testlib.h"

#define GUARD 256 /* poisoned bytes after every device output */
#define POISON 0xAB

static const zpp_dtype all_dtypes[] = {ZPP_FP32, ZPP_BF16, ZPP_FP16};
/* The payload kinds: int8, int4 and 4-bit E2M1 (KIND_E2M1). */
#define KIND_E2M1 (-4)
#define N_KINDS 3
static const int all_bits[N_KINDS] = {8, 4, KIND_E2M1};

/* The default spec of a kind. */
static zpp_quant_spec spec_of_kind(int kind) {
    zpp_quant_spec s = zpp_quant_spec_default(kind == KIND_E2M1 ? 4 : kind);
    if (kind == KIND_E2M1) s.format = ZPP_QUANT_E2M1;
    return s;
}

/* ---- device plumbing ------------------------------------------------------
 * Memory, copies and synchronisation go through a GPU device (device.h),
 * opened at the start of each test and closed at its end; the kernels under
 * test are called directly, on that device's compute stream, so they are
 * ordered after the device's memsets and copies. */

static zpp_device *dev; /* GPU 0, for the running test */

static void dev_open(void) {
    dev = zpp_test_gpu_open("test_quant_cuda checks the GPU kernels");
}

static void dev_close(void) {
    EXPECT_OK(zpp_device_sync(dev, NULL));
    zpp_device_destroy(dev);
    dev = NULL;
}

/* A device buffer with a guard zone after `bytes`; `off` shifts the user
 * pointer to test misaligned inputs/outputs. */
typedef struct dbuf {
    unsigned char *base;
    void *p;
    size_t bytes, off;
} dbuf;

static dbuf dbuf_make(size_t bytes, size_t off) {
    dbuf b;
    void *base = NULL;
    b.bytes = bytes;
    b.off = off;
    EXPECT_OK(zpp_device_alloc(dev, off + bytes + GUARD, &base));
    b.base = base;
    b.p = b.base + off;
    return b;
}

static void dbuf_free(dbuf *b) {
    if (b->base) zpp_device_free(dev, b->base);
    b->base = NULL;
}

static void dbuf_poison(const dbuf *b) {
    EXPECT_OK(zpp_device_set(dev, b->base, POISON, b->off + b->bytes + GUARD));
}

/* Poison, then the host data (the copy returns once `h` has been read). */
static void dbuf_put(const dbuf *b, const void *h) {
    dbuf_poison(b);
    if (b->bytes) EXPECT_OK(zpp_device_copy(dev, b->p, h, b->bytes));
}

/* Waits for the kernels, copies the buffer back and checks the guard zones
 * (before the offset and after the end) are still poison. */
static void dbuf_get(const dbuf *b, void *h, const char *ctx) {
    EXPECT_OK(zpp_device_sync(dev, NULL));
    size_t all = b->off + b->bytes + GUARD;
    unsigned char *tmp = zpp_test_malloc(all);
    EXPECT_OK(zpp_device_copy(dev, tmp, b->base, all));
    for (size_t i = 0; i < b->off; i++)
        EXPECT(tmp[i] == POISON, "%s: byte %zu before the buffer was written (0x%02x)", ctx,
               b->off - i, tmp[i]);
    for (size_t i = 0; i < GUARD; i++)
        EXPECT(tmp[b->off + b->bytes + i] == POISON,
               "%s: byte %zu past the end of the %zu-byte buffer was written (0x%02x)", ctx,
               i, b->bytes, tmp[b->off + b->bytes + i]);
    memcpy(h, tmp + b->off, b->bytes);
    free(tmp);
}

/* A non-finite flag for a kernel: one int of device memory, cleared. */
static int *flag_make(void) {
    void *f = NULL;
    EXPECT_OK(zpp_device_alloc(dev, sizeof(int), &f));
    EXPECT_OK(zpp_device_set(dev, f, 0, sizeof(int)));
    return f;
}

static int flag_get(int *f) {
    int v;
    EXPECT_OK(zpp_device_sync(dev, NULL));
    EXPECT_OK(zpp_device_copy(dev, &v, f, sizeof v));
    return v;
}

static void flag_free(int *f) { zpp_device_free(dev, f); }

/* ---- random inputs ---------------------------------------------------- */

enum { PAT_NORMAL, PAT_HEAVY, PAT_ZERO, PAT_CONST, PAT_OUTLIER, PAT_TINY, PAT_SUBNORMAL,
       PAT_COUNT };

/* n fp32 values, the pattern chosen afresh for every `block` of them. For
 * fp16 the magnitudes stay below 65504 (no accidental Inf) and tiny blocks
 * are not possible (the smallest fp16 is 6e-8), so they become subnormal
 * fp16 values instead. */
static void fill_values(float *x, size_t n, size_t block, zpp_dtype dtype, zpp_rng *r) {
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t len = n - b0 < block ? n - b0 : block;
        int pat = (int)(zpp_rng_u64(r) % PAT_COUNT);
        double mag = pow(10.0, zpp_rng_uniform(r) * 6.0 - 3.0);
        double c = zpp_rng_normal(r) * mag;
        for (size_t i = 0; i < len; i++) {
            double v;
            switch (pat) {
            case PAT_HEAVY: /* ratio of normals: Cauchy tails */
                v = mag * zpp_rng_normal(r) / (fabs(zpp_rng_normal(r)) + 1e-3);
                break;
            case PAT_ZERO: v = (zpp_rng_u64(r) & 1) ? 0.0 : -0.0; break;
            case PAT_CONST: v = c; break;
            case PAT_OUTLIER: v = zpp_rng_normal(r) * mag * (i == len / 2 ? 1e4 : 1.0); break;
            case PAT_TINY: /* absmax < 7 / FLT_MAX: qmax / absmax overflows */
                v = zpp_rng_normal(r) * 1e-39 * ((zpp_rng_u64(r) % 4) == 0 ? 0.0 : 1.0);
                break;
            case PAT_SUBNORMAL: v = zpp_rng_normal(r) * 1e-5; break;
            default: v = zpp_rng_normal(r) * mag; break;
            }
            if (dtype == ZPP_FP16) {
                if (pat == PAT_TINY) v = zpp_rng_normal(r) * 1e-7;
                if (v > 6.0e4) v = 6.0e4;
                if (v < -6.0e4) v = -6.0e4;
            }
            x[b0 + i] = (float)v;
        }
    }
}

/* n elements of dtype at h from fp32 values. */
static void to_dtype(const float *x, size_t n, zpp_dtype dtype, void *h) {
    for (size_t i = 0; i < n; i++) zpp_store_f32(h, dtype, i, x[i]);
}

static void *random_input(size_t n, size_t block, zpp_dtype dtype, zpp_rng *r) {
    float *x = zpp_test_malloc(n * sizeof *x);
    fill_values(x, n, block, dtype, r);
    void *h = zpp_test_malloc(n * zpp_dtype_size(dtype));
    to_dtype(x, n, dtype, h);
    free(x);
    return h;
}

static zpp_quant_spec spec_make(int kind, size_t block, int stochastic, zpp_rng *r) {
    zpp_quant_spec s = spec_of_kind(kind);
    s.block = block;
    s.stochastic = stochastic;
    s.seed = zpp_rng_u64(r);
    return s;
}

/* ---- comparisons ------------------------------------------------------ */

static float f32_of(const unsigned char *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* Byte-for-byte equality of n_chunks quantized chunks, naming the first
 * difference by chunk, region and block. */
static void expect_same_q(const unsigned char *gpu, const unsigned char *cpu, size_t n_chunks,
                          size_t chunk_len, const zpp_quant_spec *s, const char *ctx) {
    const size_t qb = zpp_quant_bytes(chunk_len, s);
    const size_t total = qb * n_chunks;
    size_t i = 0;
    while (i < total && gpu[i] == cpu[i]) i++;
    if (i == total) return;
    const size_t c = i / qb, o = i % qb;
    const size_t pb = zpp_quant_payload_bytes(chunk_len, s->bits);
    const size_t so = zpp_quant_scales_offset(chunk_len, s->bits);
    const size_t nb = zpp_quant_num_blocks(chunk_len, s->block);
    char where[200];
    if (o < pb) {
        size_t e = s->bits == 8 ? o : 2 * o;
        snprintf(where, sizeof where, "payload byte %zu (element %zu, block %zu)", o, e,
                 e / s->block);
    } else if (o < so) {
        snprintf(where, sizeof where, "payload padding byte %zu (payload ends at %zu)", o, pb);
    } else if (o < so + 4 * nb) {
        size_t b = (o - so) / 4;
        snprintf(where, sizeof where, "scale of block %zu (gpu %a, cpu %a)", b,
                 (double)f32_of(gpu + c * qb + so + 4 * b),
                 (double)f32_of(cpu + c * qb + so + 4 * b));
    } else {
        snprintf(where, sizeof where, "scale padding byte %zu", o);
    }
    zpp_test_fail(__FILE__, __LINE__, NULL,
                  "%s: quantized bytes differ at offset %zu: chunk %zu, %s: gpu 0x%02x, cpu "
                  "0x%02x (bits %d format %d, block %zu, stochastic %d, chunk_len %zu, %zu "
                  "chunks; 0xAB means the kernel never wrote it)",
                  ctx, i, c, where, gpu[i], cpu[i], s->bits, s->format, s->block, s->stochastic,
                  chunk_len, n_chunks);
}

static int bits_nan(zpp_dtype d, const void *p, size_t i) {
    return isnan(zpp_load_f32(p, d, i));
}

/* Element-wise bit equality, NaN matching any NaN. */
static void expect_same_values(const void *gpu, const void *cpu, size_t n, zpp_dtype d,
                               const char *ctx) {
    const size_t es = zpp_dtype_size(d);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *g = (const unsigned char *)gpu + i * es;
        const unsigned char *c = (const unsigned char *)cpu + i * es;
        if (memcmp(g, c, es) == 0) continue;
        if (bits_nan(d, gpu, i) && bits_nan(d, cpu, i)) continue;
        zpp_test_fail(__FILE__, __LINE__, NULL,
                      "%s: element %zu of %zu (%s) differs: gpu %a, cpu %a", ctx, i, n,
                      zpp_dtype_name(d), (double)zpp_load_f32(gpu, d, i),
                      (double)zpp_load_f32(cpu, d, i));
    }
}

/* ---- the cases -------------------------------------------------------- */

/* One quantize of n_chunks chunks of chunk_len: GPU against the CPU
 * reference. `misalign` shifts the input by one element (scalar path). */
static void check_quantize(zpp_dtype d, size_t n_chunks, size_t chunk_len,
                           const zpp_quant_spec *s, int misalign, zpp_rng *r) {
    const size_t n = n_chunks * chunk_len, es = zpp_dtype_size(d);
    const size_t qb = zpp_quant_bytes(chunk_len, s) * n_chunks;
    void *x = random_input(n, s->block, d, r);
    unsigned char *cpu = zpp_test_malloc(qb), *gpu = zpp_test_malloc(qb);
    EXPECT_OK(zpp_quant_cpu_quantize_chunks(x, d, n_chunks, chunk_len, s, cpu));
    dbuf dx = dbuf_make(n * es, misalign ? es : 0), dq = dbuf_make(qb, 0);
    dbuf_put(&dx, x);
    dbuf_poison(&dq);
    int *flag = flag_make();
    EXPECT_OK(zpp_cuda_quantize_chunks(dx.p, d, n_chunks, chunk_len, s, dq.p, flag, dev->stream));
    char ctx[160];
    snprintf(ctx, sizeof ctx, "quantize %s, %zu x %zu%s", zpp_dtype_name(d), n_chunks,
             chunk_len, misalign ? ", misaligned input" : "");
    dbuf_get(&dq, gpu, ctx);
    expect_same_q(gpu, cpu, n_chunks, chunk_len, s, ctx);
    EXPECT(flag_get(flag) == 0, "%s: non-finite flag set for finite input", ctx);
    flag_free(flag);
    dbuf_free(&dx);
    dbuf_free(&dq);
    free(x), free(cpu), free(gpu);
}

/* Sizes around one block and a few blocks with a ragged end. */
static size_t sizes_for(size_t block, size_t *out) {
    size_t k = 0;
    out[k++] = 1;
    out[k++] = 7;
    if (block > 8) out[k++] = block - 1;
    out[k++] = block;
    out[k++] = block + 1;
    out[k++] = 3 * block + 5;
    out[k++] = 2 * block + 8;
    return k;
}

/* Every block shape the launcher distinguishes: 1 thread per block (8),
 * partial groups (24), 16 threads (128), a warp (256), 2/4/8 vectors per
 * thread (264, 1024, 2048), and the two-pass kernel (2056, 1 << 20). */
static void test_quantize_single_tensor(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    static const size_t blocks[] = {8, 24, 128, 256, 264, 1024, 2048, 2056};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
        for (size_t di = 0; di < 3; di++)
            for (size_t ki = 0; ki < N_KINDS; ki++)
                for (int st = 0; st < 2; st++) {
                    size_t sizes[8];
                    size_t ns = sizes_for(blocks[bi], sizes);
                    for (size_t si = 0; si < ns; si++) {
                        zpp_quant_spec s = spec_make(all_bits[ki], blocks[bi], st, &r);
                        check_quantize(all_dtypes[di], 1, sizes[si], &s, 0, &r);
                    }
                }
    /* the largest block allowed, and a misaligned input on every path */
    for (size_t di = 0; di < 3; di++)
        for (size_t ki = 0; ki < N_KINDS; ki++) {
            zpp_quant_spec s = spec_make(all_bits[ki], (size_t)1 << 20, (int)(ki & 1), &r);
            check_quantize(all_dtypes[di], 1, ((size_t)1 << 20) + 77, &s, 0, &r);
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                zpp_quant_spec t = spec_make(all_bits[ki], blocks[bi], (int)(bi & 1), &r);
                check_quantize(all_dtypes[di], 1, 3 * blocks[bi] + 5, &t, 1, &r);
            }
        }
    dev_close();
}

static void test_quantize_large(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    const size_t n = ((size_t)1 << 22) + 5;
    for (size_t di = 0; di < 3; di++)
        for (size_t ki = 0; ki < N_KINDS; ki++) {
            zpp_quant_spec s = spec_make(all_bits[ki], 0, (int)(di == 1 && ki == 1), &r);
            s.block = spec_of_kind(all_bits[ki]).block;
            check_quantize(all_dtypes[di], 1, n, &s, 0, &r);
        }
    dev_close();
}

/* Chunks laid end to end, odd lengths: chunk starts off the 16-byte grid. */
static void test_quantize_chunks(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    static const size_t lens[] = {1, 3, 77, 1001, 4099, 1024};
    static const size_t nchunks[] = {1, 2, 5};
    static const size_t blocks[] = {8, 128, 256, 4096};
    for (size_t li = 0; li < 6; li++)
        for (size_t ci = 0; ci < 3; ci++)
            for (size_t di = 0; di < 3; di++)
                for (size_t ki = 0; ki < N_KINDS; ki++) {
                    zpp_quant_spec s = spec_make(all_bits[ki], blocks[(li + ci + di) % 4],
                                                 (int)((li + ki) & 1), &r);
                    check_quantize(all_dtypes[di], nchunks[ci], lens[li], &s, 0, &r);
                }
    dev_close();
}

/* Dequantize: of CPU-quantized random data, and of random bytes (every
 * payload code, -8 and -128 included; padding garbage must be ignored). */
static void check_dequantize(zpp_dtype d, size_t n_chunks, size_t chunk_len,
                             const zpp_quant_spec *s, int garbage, int misalign, zpp_rng *r) {
    const size_t n = n_chunks * chunk_len, es = zpp_dtype_size(d);
    const size_t qbc = zpp_quant_bytes(chunk_len, s), qb = qbc * n_chunks;
    unsigned char *q = zpp_test_malloc(qb);
    if (garbage) {
        for (size_t i = 0; i < qb; i++) q[i] = (unsigned char)zpp_rng_u64(r);
        const size_t so = zpp_quant_scales_offset(chunk_len, s->bits);
        const size_t nb = zpp_quant_num_blocks(chunk_len, s->block);
        for (size_t c = 0; c < n_chunks; c++)
            for (size_t b = 0; b < nb; b++) {
                float sc = (float)(zpp_rng_uniform(r) * 0.1);
                memcpy(q + c * qbc + so + 4 * b, &sc, 4);
            }
    } else {
        void *x = random_input(n, s->block, d, r);
        EXPECT_OK(zpp_quant_cpu_quantize_chunks(x, d, n_chunks, chunk_len, s, q));
        free(x);
    }
    void *cpu = zpp_test_malloc(n * es), *gpu = zpp_test_malloc(n * es);
    EXPECT_OK(zpp_quant_cpu_dequantize_chunks(q, n_chunks, chunk_len, s, d, cpu));
    dbuf dq = dbuf_make(qb, 0), dy = dbuf_make(n * es, misalign ? es : 0);
    dbuf_put(&dq, q);
    dbuf_poison(&dy);
    EXPECT_OK(zpp_cuda_dequantize_chunks(dq.p, n_chunks, chunk_len, s, d, dy.p, dev->stream));
    char ctx[160];
    snprintf(ctx, sizeof ctx, "dequantize %s, bits %d, block %zu, %zu x %zu%s%s",
             zpp_dtype_name(d), s->bits, s->block, n_chunks, chunk_len,
             garbage ? ", random bytes" : "", misalign ? ", misaligned output" : "");
    dbuf_get(&dy, gpu, ctx);
    expect_same_values(gpu, cpu, n, d, ctx);
    /* the input must be untouched */
    unsigned char *q2 = zpp_test_malloc(qb);
    dbuf_get(&dq, q2, ctx);
    EXPECT(memcmp(q, q2, qb) == 0, "%s: the kernel wrote into its input", ctx);
    dbuf_free(&dq);
    dbuf_free(&dy);
    free(q), free(q2), free(cpu), free(gpu);
}

static void test_dequantize(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(4));
    static const size_t blocks[] = {8, 24, 128, 256, 264, 1024, 2048, 2056, 8192};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
        for (size_t di = 0; di < 3; di++)
            for (size_t ki = 0; ki < N_KINDS; ki++) {
                size_t sizes[8];
                size_t ns = sizes_for(blocks[bi], sizes);
                for (size_t si = 0; si < ns; si++) {
                    zpp_quant_spec s = spec_make(all_bits[ki], blocks[bi], 0, &r);
                    check_dequantize(all_dtypes[di], 1, sizes[si], &s, (int)(si & 1), 0, &r);
                }
                zpp_quant_spec s = spec_make(all_bits[ki], blocks[bi], 0, &r);
                check_dequantize(all_dtypes[di], 1, 2 * blocks[bi] + 3, &s, 0, 1, &r);
            }
    static const size_t lens[] = {1, 3, 77, 1001, 1024, 4099};
    for (size_t li = 0; li < 6; li++)
        for (size_t di = 0; di < 3; di++)
            for (size_t ki = 0; ki < N_KINDS; ki++) {
                zpp_quant_spec s = spec_make(all_bits[ki], blocks[(li + di) % 9], 0, &r);
                check_dequantize(all_dtypes[di], 1 + (li % 3) * 2, lens[li], &s, (int)(ki & 1),
                                 0, &r);
            }
    const size_t n = ((size_t)1 << 22) + 5;
    for (size_t ki = 0; ki < N_KINDS; ki++) {
        zpp_quant_spec s = spec_of_kind(all_bits[ki]);
        check_dequantize(ZPP_BF16, 1, n, &s, 0, 0, &r);
        check_dequantize(ZPP_FP32, 1, n, &s, 1, 0, &r);
    }
    dev_close();
}

static void test_dequantize_accumulate(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(5));
    static const size_t blocks[] = {8, 128, 256, 2048, 4096};
    static const size_t ns[] = {1, 7, 255, 256, 257, 4099, ((size_t)1 << 20) + 3};
    for (size_t bi = 0; bi < 5; bi++)
        for (size_t ni = 0; ni < 7; ni++)
            for (size_t ki = 0; ki < N_KINDS; ki++)
                for (int mis = 0; mis < 2; mis++) {
                    const size_t n = ns[ni];
                    zpp_quant_spec s = spec_make(all_bits[ki], blocks[bi], 0, &r);
                    const size_t qb = zpp_quant_bytes(n, &s);
                    void *x = random_input(n, s.block, ZPP_FP32, &r);
                    unsigned char *q = zpp_test_malloc(qb);
                    EXPECT_OK(zpp_quant_cpu_quantize_chunks(x, ZPP_FP32, 1, n, &s, q));
                    float *acc = zpp_test_malloc(n * 4), *gpu = zpp_test_malloc(n * 4);
                    for (size_t i = 0; i < n; i++) acc[i] = (float)zpp_rng_normal(&r);
                    dbuf dq = dbuf_make(qb, 0), da = dbuf_make(n * 4, mis ? 4 : 0);
                    dbuf_put(&dq, q);
                    dbuf_put(&da, acc);
                    EXPECT_OK(zpp_cuda_dequantize_accumulate(dq.p, n, &s, da.p, dev->stream));
                    EXPECT_OK(zpp_dequantize_accumulate(q, n, &s, acc));
                    char ctx[128];
                    snprintf(ctx, sizeof ctx, "dequantize-accumulate bits %d block %zu n %zu%s",
                             s.bits, s.block, n, mis ? " misaligned" : "");
                    dbuf_get(&da, gpu, ctx);
                    expect_same_values(gpu, acc, n, ZPP_FP32, ctx);
                    dbuf_free(&dq);
                    dbuf_free(&da);
                    free(x), free(q), free(acc), free(gpu);
                }
    dev_close();
}

static void test_reorder_quantize(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(6));
    static const int nodes_l[] = {1, 2, 3};
    static const int local_l[] = {1, 2, 4};
    static const size_t lens[] = {1, 7, 129, 1000, 1001, 4096};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t li = 0; li < 6; li++)
                for (size_t di = 0; di < 3; di++)
                    for (size_t ki = 0; ki < N_KINDS; ki++) {
                        const zpp_dtype d = all_dtypes[di];
                        const int nodes = nodes_l[a], local = local_l[b];
                        const size_t cl = lens[li], nc = (size_t)nodes * (size_t)local;
                        zpp_quant_spec s = spec_make(all_bits[ki], ki ? 128 : 256,
                                                     (int)((li + b) & 1), &r);
                        const size_t qb = zpp_quant_bytes(cl, &s) * nc;
                        void *x = random_input(nc * cl, s.block, d, &r);
                        unsigned char *cpu = zpp_test_malloc(qb), *gpu = zpp_test_malloc(qb);
                        EXPECT_OK(zpp_quant_reorder_quantize(x, d, cl, nodes, local, &s, cpu));
                        dbuf dx = dbuf_make(nc * cl * zpp_dtype_size(d), 0),
                             dq = dbuf_make(qb, 0);
                        dbuf_put(&dx, x);
                        dbuf_poison(&dq);
                        EXPECT_OK(zpp_cuda_reorder_quantize(dx.p, d, cl, 0, cl, nodes, local, &s,
                                                            dq.p, NULL, dev->stream));
                        char ctx[160];
                        snprintf(ctx, sizeof ctx, "reorder-quantize %s nodes %d local %d len %zu",
                                 zpp_dtype_name(d), nodes, local, cl);
                        dbuf_get(&dq, gpu, ctx);
                        expect_same_q(gpu, cpu, nc, cl, &s, ctx);
                        /* a slab of every chunk, starting on a block boundary
                         * (as qgZ's pipeline cuts them) or anywhere */
                        size_t first = zpp_rng_u64(&r) % (cl + 1);
                        if (ki == 0) first -= first % s.block;
                        const size_t len = zpp_rng_u64(&r) % (cl - first + 1);
                        const size_t sb = zpp_quant_bytes(len, &s) * nc;
                        EXPECT_OK(zpp_quant_cpu_reorder_quantize(x, d, cl, first, len, nodes,
                                                                 local, &s, cpu));
                        dbuf_poison(&dq);
                        EXPECT_OK(zpp_cuda_reorder_quantize(dx.p, d, cl, first, len, nodes,
                                                            local, &s, dq.p, NULL, dev->stream));
                        snprintf(ctx, sizeof ctx,
                                 "reorder-quantize %s nodes %d local %d slab [%zu, +%zu) of %zu",
                                 zpp_dtype_name(d), nodes, local, first, len, cl);
                        dbuf_get(&dq, gpu, ctx);
                        if (sb) expect_same_q(gpu, cpu, nc, len, &s, ctx);
                        size_t past = sb;
                        while (past < qb && gpu[past] == POISON) past++;
                        EXPECT(past == qb, "%s: byte %zu past the slabs' %zu was written", ctx,
                               past, sb);
                        dbuf_free(&dx);
                        dbuf_free(&dq);
                        free(x), free(cpu), free(gpu);
                    }
    dev_close();
}

/* k inputs of n_chunks chunks, each made by the CPU quantizer from random
 * data (with_nan: one element of input k-1 is NaN). */
static unsigned char *make_qinputs(int k, size_t n_chunks, size_t cl, const zpp_quant_spec *s,
                                   int with_nan, zpp_rng *r) {
    const size_t per = zpp_quant_bytes(cl, s) * n_chunks;
    unsigned char *q = zpp_test_malloc(per * (size_t)k);
    for (int j = 0; j < k; j++) {
        float *x = zpp_test_malloc(n_chunks * cl * 4);
        fill_values(x, n_chunks * cl, s->block, ZPP_FP32, r);
        if (with_nan && j == k - 1) x[(n_chunks * cl) / 2] = NAN;
        zpp_status st = zpp_quant_cpu_quantize_chunks(x, ZPP_FP32, n_chunks, cl, s,
                                                      q + per * (size_t)j);
        EXPECT(st == (with_nan && j == k - 1 ? ZPP_ERR_NONFINITE : ZPP_OK), "%s",
               zpp_last_error());
        free(x);
    }
    return q;
}

static void check_dsr(int k, size_t nc, size_t cl, const zpp_quant_spec *is,
                      const zpp_quant_spec *os, int with_nan, zpp_rng *r) {
    const size_t inb = zpp_quant_bytes(cl, is) * nc * (size_t)k;
    const size_t outb = zpp_quant_bytes(cl, os) * nc;
    unsigned char *in = make_qinputs(k, nc, cl, is, with_nan, r);
    unsigned char *cpu = zpp_test_malloc(outb), *gpu = zpp_test_malloc(outb);
    /* half the time the chunks are slabs [first, first + cl) of longer ones,
     * which moves them in the stochastic stream */
    size_t first = 0, whole = cl;
    if (zpp_rng_u64(r) & 1) {
        first = zpp_rng_u64(r) % (3 * cl + 1);
        whole = first + cl + zpp_rng_u64(r) % (cl + 1);
    }
    EXPECT_STATUS(zpp_quant_cpu_dequant_sum_requant(in, k, nc, whole, first, cl, is, os, cpu),
                  with_nan ? ZPP_ERR_NONFINITE : ZPP_OK);
    dbuf di = dbuf_make(inb, 0), dq = dbuf_make(outb, 0);
    dbuf_put(&di, in);
    dbuf_poison(&dq);
    int *flag = flag_make();
    EXPECT_OK(zpp_cuda_dequant_sum_requant(di.p, k, nc, whole, first, cl, is, os, dq.p, flag,
                                           dev->stream));
    char ctx[240];
    snprintf(ctx, sizeof ctx,
             "dequant-sum-requant k %d, %zu x %zu (at %zu of %zu), in bits %d block %zu, out "
             "bits %d block %zu stochastic %d%s",
             k, nc, cl, first, whole, is->bits, is->block, os->bits, os->block, os->stochastic,
             with_nan ? ", NaN input" : "");
    dbuf_get(&dq, gpu, ctx);
    expect_same_q(gpu, cpu, nc, cl, os, ctx);
    EXPECT(flag_get(flag) == with_nan, "%s: non-finite flag %d", ctx, flag_get(flag));
    flag_free(flag);
    dbuf_free(&di);
    dbuf_free(&dq);
    free(in), free(cpu), free(gpu);
}

static void test_dequant_sum_requant(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(7));
    static const size_t lens[] = {1, 7, 128, 129, 1001, 4099};
    static const size_t nchunks[] = {1, 2, 4};
    for (int k = 1; k <= 3; k++)
        for (size_t li = 0; li < 6; li++)
            for (size_t ci = 0; ci < 3; ci++)
                for (int variant = 0; variant < 6; variant++) {
                    /* same spec; int8 in -> int4 out; different blocks; big out block;
                     * E2M1 -> E2M1 (qgZ's default); E2M1 -> int4 */
                    int ib = variant == 1 ? 8 : variant >= 4 ? KIND_E2M1 : 4;
                    int ob = variant == 4 ? KIND_E2M1 : 4;
                    size_t iblk = 128, oblk = variant == 2 ? 256 : 128;
                    if (variant == 3) iblk = 64, oblk = 4096;
                    zpp_quant_spec is = spec_make(ib, iblk, 0, &r);
                    zpp_quant_spec os = spec_make(ob, oblk, (int)((li + ci + (size_t)k) & 1), &r);
                    check_dsr(k, nchunks[ci], lens[li], &is, &os, 0, &r);
                }
    /* a NaN in one input: flag set, its block NaN in the output */
    zpp_quant_spec is = spec_make(4, 128, 0, &r), os = spec_make(4, 128, 1, &r);
    check_dsr(2, 4, 1001, &is, &os, 1, &r);
    is = spec_make(KIND_E2M1, 128, 0, &r), os = spec_make(KIND_E2M1, 128, 1, &r);
    check_dsr(2, 4, 1001, &is, &os, 1, &r);
    zpp_quant_spec is8 = spec_make(8, 256, 0, &r), os8 = spec_make(8, 256, 0, &r);
    check_dsr(3, 2, ((size_t)1 << 20) + 9, &is8, &os8, 0, &r);
    dev_close();
}

/* One dequant-reduce, CUDA against the CPU reference, bit for bit. form 0:
 * the chunks end to end, the sum from 0; 1: chunks 32 bytes of garbage
 * apart, the sum from an exact input of its own; 2: the same, the exact
 * input being the output (qgZ's use). */
static void check_dequant_reduce(size_t nc, size_t cl, const zpp_quant_spec *s, float scale,
                                 int mis, int form, zpp_rng *r) {
    const size_t qb = zpp_quant_bytes(cl, s), stride = form ? qb + 32 : 0;
    unsigned char *q = make_qinputs(1, nc, cl, s, 0, r);
    unsigned char *spread = zpp_test_malloc(nc * (qb + 32));
    for (size_t b = 0; b < nc * (qb + 32); b++) spread[b] = (unsigned char)zpp_rng_u64(r);
    for (size_t c = 0; c < nc; c++) memcpy(spread + c * (stride ? stride : qb), q + c * qb, qb);
    float *cpu = zpp_test_malloc(cl * 4), *gpu = zpp_test_malloc(cl * 4),
          *exact = zpp_test_malloc(cl * 4);
    fill_values(exact, cl, s->block, ZPP_FP32, r);
    memcpy(cpu, exact, cl * 4);
    EXPECT_OK(zpp_quant_cpu_dequant_reduce(spread, nc, stride, cl, s, form ? cpu : NULL, scale,
                                           cpu));
    dbuf dq = dbuf_make(nc * (qb + 32), 0), dy = dbuf_make(cl * 4, mis ? 4 : 0),
         dx = dbuf_make(cl * 4, 0);
    dbuf_put(&dq, spread);
    dbuf_put(&dx, exact);
    if (form == 2) dbuf_put(&dy, exact);
    else dbuf_poison(&dy);
    const float *ex = form == 0 ? NULL : form == 1 ? (const float *)dx.p : (const float *)dy.p;
    EXPECT_OK(zpp_cuda_dequant_reduce(dq.p, nc, stride, cl, s, ex, scale, (float *)dy.p,
                                      dev->stream));
    char ctx[160];
    snprintf(ctx, sizeof ctx, "dequant-reduce %zu x %zu bits %d block %zu scale %a%s form %d",
             nc, cl, s->bits, s->block, (double)scale, mis ? " misaligned" : "", form);
    dbuf_get(&dy, gpu, ctx);
    expect_same_values(gpu, cpu, cl, ZPP_FP32, ctx);
    dbuf_free(&dq), dbuf_free(&dy), dbuf_free(&dx);
    free(q), free(spread), free(cpu), free(gpu), free(exact);
}

static void test_dequant_reduce(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(8));
    static const size_t lens[] = {1, 7, 255, 256, 1001, 4099, ((size_t)1 << 20) + 1};
    static const size_t blocks[] = {8, 128, 256, 2048, 4096};
    static const size_t nchunks[] = {1, 2, 3, 8};
    for (size_t li = 0; li < 7; li++)
        for (size_t ci = 0; ci < 4; ci++)
            for (size_t ki = 0; ki < N_KINDS; ki++)
                for (int mis = 0; mis < 2; mis++)
                    for (int form = 0; form < 3; form++) {
                        const size_t cl = lens[li], nc = nchunks[ci];
                        zpp_quant_spec s = spec_make(all_bits[ki], blocks[(li + ci) % 5], 0, &r);
                        check_dequant_reduce(nc, cl, &s, mis ? 1.0f : 1.0f / (float)(nc * 3),
                                             mis, form, &r);
                    }
    dev_close();
}

static void test_convert(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(9));
    static const size_t ns[] = {1, 7, 8, 9, 1000, 4099, ((size_t)1 << 20) + 3};
    static const float scales[] = {1.0f, 0.125f, 0.37f};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t ni = 0; ni < 7; ni++)
                for (size_t si = 0; si < 3; si++) {
                    const zpp_dtype di = all_dtypes[a], dO = all_dtypes[b];
                    const size_t n = ns[ni];
                    const int mis = (int)((ni + si) % 3 == 2);
                    const int inplace = di == dO && si == 1;
                    float *v = zpp_test_malloc(n * 4);
                    fill_values(v, n, 64, di == ZPP_FP16 || dO == ZPP_FP16 ? ZPP_FP16 : di, &r);
                    if (n > 8) v[n / 3] = NAN, v[n / 2] = INFINITY, v[n - 1] = -0.0f;
                    void *x = zpp_test_malloc(n * zpp_dtype_size(di));
                    to_dtype(v, n, di, x);
                    void *cpu = zpp_test_malloc(n * zpp_dtype_size(dO)), *gpu = zpp_test_malloc(n * zpp_dtype_size(dO));
                    EXPECT_OK(zpp_quant_cpu_convert(x, di, cpu, dO, n, scales[si]));
                    dbuf dx = dbuf_make(n * zpp_dtype_size(di), mis ? zpp_dtype_size(di) : 0);
                    dbuf dy = inplace ? dx : dbuf_make(n * zpp_dtype_size(dO), 0);
                    dbuf_put(&dx, x);
                    if (!inplace) dbuf_poison(&dy);
                    EXPECT_OK(zpp_cuda_convert(dx.p, di, dy.p, dO, n, scales[si], dev->stream));
                    char ctx[160];
                    snprintf(ctx, sizeof ctx, "convert %s -> %s n %zu scale %g%s%s",
                             zpp_dtype_name(di), zpp_dtype_name(dO), n, (double)scales[si],
                             mis ? " misaligned" : "", inplace ? " in place" : "");
                    dbuf_get(&dy, gpu, ctx);
                    expect_same_values(gpu, cpu, n, dO, ctx);
                    dbuf_free(&dx);
                    if (!inplace) dbuf_free(&dy);
                    free(v), free(x), free(cpu), free(gpu);
                }
    dev_close();
}

/* NaN and Inf: the flag is raised, the block's scale is the NaN 0x7fc00000
 * and its payload 0 (bit-identical to the CPU, which also reports
 * ZPP_ERR_NONFINITE), other blocks are quantized normally, and the block
 * dequantizes to NaN. */
static void test_nonfinite(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(10));
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (size_t di = 0; di < 3; di++)
        for (size_t ki = 0; ki < N_KINDS; ki++)
            for (size_t bi = 0; bi < 3; bi++) {
                const zpp_dtype d = all_dtypes[di];
                zpp_quant_spec s = spec_make(all_bits[ki], bi == 2 ? 4096 : 256, (int)(bi & 1),
                                             &r);
                const size_t n = 5 * s.block + 3, es = zpp_dtype_size(d);
                float *v = zpp_test_malloc(n * 4);
                fill_values(v, n, s.block, d, &r);
                const size_t at = s.block + (size_t)(zpp_rng_u64(&r) % s.block);
                v[at] = bad[bi];
                v[n - 1] = bad[(bi + 1) % 3]; /* the ragged last block too */
                void *x = zpp_test_malloc(n * es);
                to_dtype(v, n, d, x);
                const size_t qb = zpp_quant_bytes(n, &s);
                unsigned char *cpu = zpp_test_malloc(qb), *gpu = zpp_test_malloc(qb);
                EXPECT_STATUS(zpp_quantize(x, d, n, &s, cpu), ZPP_ERR_NONFINITE);
                dbuf dx = dbuf_make(n * es, 0), dq = dbuf_make(qb, 0);
                dbuf_put(&dx, x);
                dbuf_poison(&dq);
                int *flag = flag_make();
                EXPECT_OK(zpp_cuda_quantize_chunks(dx.p, d, 1, n, &s, dq.p, flag, dev->stream));
                char ctx[128];
                snprintf(ctx, sizeof ctx, "non-finite %s bits %d block %zu", zpp_dtype_name(d),
                         s.bits, s.block);
                dbuf_get(&dq, gpu, ctx);
                expect_same_q(gpu, cpu, 1, n, &s, ctx);
                EXPECT(flag_get(flag) == 1, "%s: flag not raised", ctx);
                uint32_t sb;
                memcpy(&sb, gpu + zpp_quant_scales_offset(n, s.bits) + 4 * (at / s.block), 4);
                EXPECT(sb == 0x7fc00000u, "%s: scale bits 0x%08x", ctx, sb);
                /* dequantize on the GPU: that block is all NaN, the next is not */
                void *y = zpp_test_malloc(n * es);
                dbuf dy = dbuf_make(n * es, 0);
                dbuf_poison(&dy);
                EXPECT_OK(zpp_cuda_dequantize_chunks(dq.p, 1, n, &s, d, dy.p, dev->stream));
                dbuf_get(&dy, y, ctx);
                const size_t b0 = at / s.block * s.block;
                for (size_t i = b0; i < b0 + s.block; i++)
                    EXPECT(isnan(zpp_load_f32(y, d, i)), "%s: element %zu not NaN", ctx, i);
                for (size_t i = b0 + s.block; i < b0 + 2 * s.block; i++)
                    EXPECT(!isnan(zpp_load_f32(y, d, i)), "%s: element %zu NaN", ctx, i);
                flag_free(flag);
                dbuf_free(&dx);
                dbuf_free(&dq);
                dbuf_free(&dy);
                free(v), free(x), free(cpu), free(gpu), free(y);
            }
    dev_close();
}

/* Invalid arguments are refused with ZPP_ERR_INVALID and a message, before
 * anything is launched; empty work is a no-op. */
static void test_invalid_arguments(void) {
    dev_open();
    zpp_quant_spec s = zpp_quant_spec_default(8);
    dbuf dx = dbuf_make(4096, 0), dq = dbuf_make(8192, 0);
    zpp_quant_spec bad = s;
    bad.bits = 5;
    EXPECT_STATUS(zpp_cuda_quantize_chunks(dx.p, ZPP_BF16, 1, 100, &bad, dq.p, NULL, dev->stream),
                  ZPP_ERR_INVALID);
    bad = s;
    bad.block = 12;
    EXPECT_STATUS(zpp_cuda_dequantize_chunks(dq.p, 1, 100, &bad, ZPP_BF16, dx.p, dev->stream),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "12") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_cuda_quantize_chunks(dx.p, (zpp_dtype)7, 1, 100, &s, dq.p, NULL, dev->stream),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_cuda_quantize_chunks(dx.p, ZPP_BF16, 1, 100, &s,
                                           (char *)dq.p + 4, NULL, dev->stream),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "aligned") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(
        zpp_cuda_reorder_quantize(dx.p, ZPP_BF16, 10, 0, 10, 0, 2, &s, dq.p, NULL, dev->stream),
        ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_cuda_dequant_sum_requant(dq.p, 0, 1, 10, 0, 10, &s, &s, dq.p, NULL, dev->stream),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_cuda_convert(dx.p, ZPP_BF16, dx.p, ZPP_FP32, 10, 1.0f, dev->stream),
                  ZPP_ERR_INVALID);
    /* nothing to do: no launch, no error, output untouched */
    dbuf_poison(&dq);
    EXPECT_OK(zpp_cuda_quantize_chunks(dx.p, ZPP_BF16, 0, 100, &s, dq.p, NULL, dev->stream));
    EXPECT_OK(zpp_cuda_quantize_chunks(dx.p, ZPP_BF16, 3, 0, &s, dq.p, NULL, dev->stream));
    unsigned char *h = zpp_test_malloc(dq.bytes);
    dbuf_get(&dq, h, "empty quantize");
    for (size_t i = 0; i < dq.bytes; i++) EXPECT(h[i] == POISON, "byte %zu written", i);
    free(h);
    dbuf_free(&dx);
    dbuf_free(&dq);
    dev_close();
}

/* The kernels enqueue on the given stream and do not synchronise: here a
 * GPU device's compute stream. Through the device (device.h) the same
 * bytes come out as from the host device, and a NaN raises the device's
 * flag with ZPP_OK, as on the host. */
static void test_streams(void) {
    dev_open();
    zpp_rng r = zpp_rng_make(zpp_test_seed(11));
    zpp_device *host = NULL;
    EXPECT_OK(zpp_device_create_host(&host));
    void *st = dev->stream; /* the GPU device's compute stream (native handle) */
    const size_t n = 100003;
    zpp_quant_spec s = spec_make(4, 128, 1, &r);
    void *x = random_input(n, s.block, ZPP_BF16, &r);
    const size_t qb = zpp_quant_bytes(n, &s);
    unsigned char *cpu = zpp_test_malloc(qb), *gpu = zpp_test_malloc(qb);
    EXPECT_OK(zpp_quantize(x, ZPP_BF16, n, &s, cpu));
    dbuf dx = dbuf_make(n * 2, 0), dq = dbuf_make(qb, 0);
    dbuf_put(&dx, x);
    dbuf_poison(&dq);
    EXPECT_OK(zpp_cuda_quantize_chunks(dx.p, ZPP_BF16, 1, n, &s, dq.p, NULL, st));
    EXPECT_OK(zpp_device_sync(dev, st));
    dbuf_get(&dq, gpu, "quantize on a stream");
    expect_same_q(gpu, cpu, 1, n, &s, "quantize on a stream");

    /* the same through both devices, a NaN in the input */
    zpp_store_f32(x, ZPP_BF16, 777, NAN);
    dbuf_put(&dx, x);
    dbuf_poison(&dq);
    int raised = -1;
    EXPECT_OK(zpp_device_quantize_chunks(host, x, ZPP_BF16, 1, n, &s, cpu));
    EXPECT_OK(zpp_device_nonfinite_take(host, &raised));
    EXPECT(raised == 1, "host device: flag %d", raised);
    EXPECT_OK(zpp_device_quantize_chunks(dev, dx.p, ZPP_BF16, 1, n, &s, dq.p));
    EXPECT_OK(zpp_device_nonfinite_take(dev, &raised));
    EXPECT(raised == 1, "GPU device: flag %d", raised);
    EXPECT_OK(zpp_device_nonfinite_take(dev, &raised));
    EXPECT(raised == 0, "GPU device: the flag was not cleared by reading it");
    dbuf_get(&dq, gpu, "quantize through the device");
    expect_same_q(gpu, cpu, 1, n, &s, "quantize through the GPU and the host device");
    zpp_device_destroy(host);
    dbuf_free(&dx);
    dbuf_free(&dq);
    free(x), free(cpu), free(gpu);
    dev_close();
}

ZPP_TESTS(ZPP_TEST(test_quantize_single_tensor), ZPP_TEST(test_quantize_large),
          ZPP_TEST(test_quantize_chunks), ZPP_TEST(test_dequantize),
          ZPP_TEST(test_dequantize_accumulate), ZPP_TEST(test_reorder_quantize),
          ZPP_TEST(test_dequant_sum_requant), ZPP_TEST(test_dequant_reduce),
          ZPP_TEST(test_convert), ZPP_TEST(test_nonfinite), ZPP_TEST(test_invalid_arguments),
          ZPP_TEST(test_streams), )
