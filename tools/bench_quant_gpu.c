/* tools/bench_quant_gpu.c — `zeropp bench quant --device gpu`: throughput,
 * accuracy and correctness of the CUDA quantization kernels.
 *
 * For n elements of N(0,1) data in --dtype:
 *   quantize, dequantize                    the --bits/--block spec
 *   reorder_quantize, dequant_sum_requant,  qgZ's kernels at int4 (--block
 *   dequant_reduce                          when --bits 4, else 128), the n
 *                                           elements seen as the gradient
 *                                           of 2 nodes x 8 ranks: reorder
 *                                           16 chunks, sum k = 2 inputs of
 *                                           8 chunks, reduce 8 chunks * 1/16
 * Each is timed with device events: 2 warm-up runs, then the median of 20.
 * GB/s counts bytes read + bytes written; copy_gbps is a device-to-device
 * zpp_device_copy of the input (n elements) timed the same way in the same
 * run and counted the same way (read + write), so `ratio` says how close a
 * kernel comes to moving memory at copy speed.
 *
 * correct: the GPU result of the timed runs equals the CPU reference
 * (quant.c) on the WHOLE buffer, byte for byte (payload, scales, padding;
 * dequantized values bit for bit). rel_l2_err = ||y - exact|| / ||exact||
 * over all elements: for quantize/dequantize y is the round trip and exact
 * the input; for the qgZ rows y is that step's output dequantized (on the
 * CPU) and exact the fp64 sum of the original inputs it stands for.
 * The exit code is 1 if anything is incorrect.
 *
 * Plain C on the device API (device.h): in a build without CUDA,
 * zpp_device_create_gpu says so and the bench exits 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_quant.h"
#include "cli.h"
#include "core/dtype.h"
#include "core/random.h"
#include "device/device.h"
#include "quant/quant_cpu.h"

#define ZPP_GB_WARMUP 2
#define ZPP_GB_RUNS 20
#define ZPP_GB_NODES 2
#define ZPP_GB_LOCAL 8
#define ZPP_GB_RANKS (ZPP_GB_NODES * ZPP_GB_LOCAL)

enum { OP_COPY, OP_QUANT, OP_DEQUANT, OP_REORDER, OP_DSR, OP_REDUCE, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"copy", "quantize", "dequantize",
                                               "reorder_quantize", "dequant_sum_requant",
                                               "dequant_reduce"};

typedef struct gbench {
    const zpp_bench_quant_args *a;
    zpp_quant_spec spec;  /* quantize / dequantize */
    zpp_quant_spec spec4; /* the qgZ kernels */
    size_t es, xbytes, qbytes;
    size_t cl, qb4;       /* qgZ chunk length and its int4 quantized size */
    float red_scale;
    zpp_device *dev;
    void *x, *y, *q, *r, *d;
    float *red;
} gbench;

static zpp_status op_run(gbench *g, int op) {
    const zpp_bench_quant_args *a = g->a;
    switch (op) {
    case OP_COPY: return zpp_device_copy(g->dev, g->y, g->x, g->xbytes);
    case OP_QUANT:
        return zpp_device_quantize_chunks(g->dev, g->x, a->dtype, 1, a->n, &g->spec, g->q);
    case OP_DEQUANT:
        return zpp_device_dequantize_chunks(g->dev, g->q, 1, a->n, &g->spec, a->dtype, g->y);
    case OP_REORDER:
        return zpp_device_reorder_quantize(g->dev, g->x, a->dtype, g->cl, 0, g->cl, ZPP_GB_NODES,
                                           ZPP_GB_LOCAL, &g->spec4, g->r);
    case OP_DSR:
        return zpp_device_dequant_sum_requant(g->dev, g->r, 2, ZPP_GB_RANKS / 2, g->cl, 0, g->cl,
                                              &g->spec4, &g->spec4, g->d);
    default:
        return zpp_device_dequant_reduce(g->dev, g->d, ZPP_GB_RANKS / 2, g->cl, &g->spec4,
                                         g->red_scale, g->red);
    }
}

/* Median milliseconds of ZPP_GB_RUNS runs of op, after the warm-up. */
static int op_time(gbench *g, int op, double *ms_p) {
    zpp_device_event *ev[2 * ZPP_GB_RUNS];
    int made = 0, rc = 1;
    zpp_status s = ZPP_OK;
    const char *what = op_names[op];
    for (; made < 2 * ZPP_GB_RUNS; made++)
        if ((s = zpp_device_event_create(g->dev, 1, &ev[made])) != ZPP_OK) goto out;
    for (int r = -ZPP_GB_WARMUP; r < ZPP_GB_RUNS; r++) {
        if (r >= 0 && (s = zpp_device_event_record(g->dev, ev[2 * r], NULL)) != ZPP_OK) goto out;
        if ((s = op_run(g, op)) != ZPP_OK) goto out;
        if (r >= 0 && (s = zpp_device_event_record(g->dev, ev[2 * r + 1], NULL)) != ZPP_OK)
            goto out;
    }
    if ((s = zpp_device_sync(g->dev, NULL)) != ZPP_OK) goto out;
    double t[ZPP_GB_RUNS];
    for (int r = 0; r < ZPP_GB_RUNS; r++) {
        float ms = 0;
        if ((s = zpp_device_event_elapsed_ms(g->dev, ev[2 * r], ev[2 * r + 1], &ms)) != ZPP_OK)
            goto out;
        t[r] = ms;
    }
    *ms_p = zpp_cli_median(t, ZPP_GB_RUNS);
    rc = 0;
out:
    if (rc) zpp_cli_fail(what, s);
    while (made > 0) zpp_device_event_destroy(g->dev, ev[--made]);
    return rc;
}

/* ---- host-side data and checks ----------------------------------------- */

/* N(0,1) by Box-Muller on a splitmix64 stream: `period` distinct values
 * (a multiple of the block, so blocks repeat whole), repeated up to n.
 * Generating 1 GiB of normals on one core would take longer than the
 * whole bench. */
static void fill_normal(void *x, zpp_dtype dtype, size_t n, size_t period) {
    zpp_fill_normal(x, dtype, period, 0x5eed5eedull);
    const size_t es = zpp_dtype_size(dtype);
    for (size_t i = period; i < n; i += period) {
        size_t m = n - i < period ? n - i : period;
        memcpy((char *)x + i * es, x, m * es);
    }
}

/* Byte equality, reporting the first difference on stderr. */
static int same_bytes(const void *gpu, const void *cpu, size_t bytes, const char *what) {
    const unsigned char *g = gpu, *c = cpu;
    if (memcmp(g, c, bytes) == 0) return 1;
    size_t i = 0;
    while (g[i] == c[i]) i++;
    fprintf(stderr,
            "zeropp bench quant: %s: GPU and CPU reference differ at byte %zu of %zu "
            "(gpu 0x%02x, cpu 0x%02x)\n",
            what, i, bytes, g[i], c[i]);
    return 0;
}

/* Element equality in dtype, NaN matching any NaN. */
static int same_values(const void *gpu, const void *cpu, size_t n, zpp_dtype d,
                       const char *what) {
    const size_t es = zpp_dtype_size(d);
    if (memcmp(gpu, cpu, n * es) == 0) return 1;
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)gpu + i * es, (const char *)cpu + i * es, es) == 0) continue;
        float a = zpp_load_f32(gpu, d, i), b = zpp_load_f32(cpu, d, i);
        if (isnan(a) && isnan(b)) continue;
        fprintf(stderr,
                "zeropp bench quant: %s: element %zu of %zu differs: gpu %a, cpu %a\n", what,
                i, n, (double)a, (double)b);
        return 0;
    }
    return 1;
}

typedef struct l2acc {
    double num, den;
} l2acc;

static void l2_add(l2acc *l, double y, double exact) {
    l->num += (y - exact) * (y - exact);
    l->den += exact * exact;
}

static double l2_rel(const l2acc *l) { return l->den > 0 ? sqrt(l->num / l->den) : 0.0; }

/* Input chunk (rank) held by slot p of the reorder output. */
static size_t reorder_src(size_t p) {
    size_t dl = p / ZPP_GB_NODES, node = p % ZPP_GB_NODES;
    return node * ZPP_GB_LOCAL + dl;
}

typedef struct row {
    int op;
    double ms, bytes, rel;
    int correct, bits;
    size_t block;
} row;

static void print_row(const gbench *g, const row *w, double copy_gbps) {
    const zpp_bench_quant_args *a = g->a;
    const double gbps = w->bytes / (w->ms * 1e-3) * 1e-9;
    const int stoch = w->bits == g->spec.bits && w->block == g->spec.block ? a->stochastic
                                                                           : g->spec4.stochastic;
    if (a->json)
        printf("{\"bench\":\"quant\",\"device\":\"gpu\",\"op\":\"%s\",\"dtype\":\"%s\","
               "\"bits\":%d,\"block\":%zu,\"n\":%zu,\"stochastic\":%d,\"ms\":%.4f,"
               "\"gbps\":%.2f,\"copy_gbps\":%.2f,\"ratio\":%.4f,\"rel_l2_err\":%.6e,"
               "\"correct\":%s}\n",
               op_names[w->op], zpp_dtype_name(a->dtype), w->bits, w->block, a->n, stoch, w->ms,
               gbps, copy_gbps, gbps / copy_gbps, w->rel, w->correct ? "true" : "false");
    else
        printf("%-20s %-5s %4d %7zu %11zu %9.3f %9.1f %9.1f %6.3f %11.3e %s\n", op_names[w->op],
               zpp_dtype_name(a->dtype), w->bits, w->block, a->n, w->ms, gbps, copy_gbps,
               gbps / copy_gbps, w->rel, w->correct ? "yes" : "NO");
}

int zpp_bench_quant_gpu(const zpp_bench_quant_args *a) {
    gbench g;
    memset(&g, 0, sizeof g);
    g.a = a;
    g.spec = zpp_quant_spec_default(a->bits);
    g.spec.block = a->block ? a->block : g.spec.block;
    g.spec.stochastic = a->stochastic;
    g.spec.seed = 12345;
    g.spec4 = zpp_quant_spec_default(4);
    if (a->bits == 4) g.spec4.block = g.spec.block;
    g.spec4.stochastic = a->stochastic;
    g.spec4.seed = 67890;
    zpp_status s = zpp_quant_spec_check(&g.spec);
    if (s != ZPP_OK) return zpp_cli_fail("bench quant", s);
    if (zpp_dtype_size(a->dtype) == 0 || a->n == 0) {
        fprintf(stderr, "zeropp bench quant: need a dtype and n > 0\n");
        return 1;
    }

    int rc = 1;
    if ((s = zpp_device_create_gpu(0, &g.dev)) != ZPP_OK)
        return zpp_cli_fail("bench quant: --device gpu", s);

    const size_t n = a->n;
    g.es = zpp_dtype_size(a->dtype);
    g.xbytes = n * g.es;
    g.qbytes = zpp_quant_bytes(n, &g.spec);
    g.cl = n / ZPP_GB_RANKS;
    g.qb4 = zpp_quant_bytes(g.cl, &g.spec4);
    g.red_scale = 1.0f / ZPP_GB_RANKS;
    const int qgz = g.cl > 0;
    const size_t rbytes = g.qb4 * ZPP_GB_RANKS, dbytes = g.qb4 * (ZPP_GB_RANKS / 2);

    /* host buffers */
    /* an odd number of blocks, so that the 16 qgZ chunks (a power of two
     * apart when n is) do not all hold the same values */
    size_t period = (((size_t)1 << 24) / g.spec.block | 1) * g.spec.block;
    if (period > n) period = n;
    void *hx = malloc(g.xbytes), *hy = malloc(g.xbytes), *hy_cpu = malloc(g.xbytes);
    unsigned char *hq = malloc(g.qbytes), *hq_cpu = malloc(g.qbytes);
    unsigned char *hr = NULL, *hr_cpu = NULL, *hd = NULL, *hd_cpu = NULL;
    float *hred = NULL, *hred_cpu = NULL, *tmp = NULL;
    if (qgz) {
        hr = malloc(rbytes), hr_cpu = malloc(rbytes), hd = malloc(dbytes),
        hd_cpu = malloc(dbytes);
        hred = malloc(g.cl * 4), hred_cpu = malloc(g.cl * 4), tmp = malloc(g.cl * 4);
    }
    int cpu_ok = hx && hy && hy_cpu && hq && hq_cpu &&
                 (!qgz || (hr && hr_cpu && hd && hd_cpu && hred && hred_cpu && tmp));
    if (!cpu_ok) {
        fprintf(stderr, "zeropp bench quant: out of host memory for n = %zu\n", n);
        goto out;
    }
    fill_normal(hx, a->dtype, n, period);

    /* device buffers */
#define CK(call, what)                                                        \
    do {                                                                      \
        if ((s = (call)) != ZPP_OK) {                                         \
            rc = zpp_cli_fail(what, s);                                       \
            goto out;                                                         \
        }                                                                     \
    } while (0)
    CK(zpp_device_alloc(g.dev, g.xbytes, &g.x), "allocating the input");
    CK(zpp_device_alloc(g.dev, g.xbytes, &g.y), "allocating the output");
    CK(zpp_device_alloc(g.dev, g.qbytes, &g.q), "allocating the quantized buffer");
    if (qgz) {
        CK(zpp_device_alloc(g.dev, rbytes, &g.r), "allocating the reorder output");
        CK(zpp_device_alloc(g.dev, dbytes, &g.d), "allocating the sum output");
        CK(zpp_device_alloc(g.dev, g.cl * 4, (void **)&g.red), "allocating the reduce output");
    }
    CK(zpp_device_copy(g.dev, g.x, hx, g.xbytes), "uploading the input");
    CK(zpp_device_set(g.dev, g.y, 0, g.xbytes), "touching the output");
    CK(zpp_device_set(g.dev, g.q, 0, g.qbytes), "touching the quantized buffer");

    /* timing; the ops run in pipeline order, so each reads its
     * predecessor's output */
    row rows[OP_COUNT];
    int nrows = 0;
    double copy_ms = 0;
    if (op_time(&g, OP_COPY, &copy_ms)) goto out;
    const double copy_gbps = 2.0 * (double)g.xbytes / (copy_ms * 1e-3) * 1e-9;
    for (int op = OP_QUANT; op < OP_COUNT; op++) {
        if (op >= OP_REORDER && !qgz) break;
        row *w = &rows[nrows++];
        memset(w, 0, sizeof *w);
        w->op = op;
        w->bits = op <= OP_DEQUANT ? g.spec.bits : 4;
        w->block = op <= OP_DEQUANT ? g.spec.block : g.spec4.block;
        if (op_time(&g, op, &w->ms)) goto out;
        switch (op) {
        case OP_QUANT:
        case OP_DEQUANT: w->bytes = (double)(g.xbytes + g.qbytes); break;
        case OP_REORDER: w->bytes = (double)(g.cl * ZPP_GB_RANKS * g.es + rbytes); break;
        case OP_DSR: w->bytes = (double)(rbytes + dbytes); break;
        default: w->bytes = (double)(dbytes + g.cl * 4); break;
        }
    }
    int flag = 0;
    CK(zpp_device_nonfinite_take(g.dev, &flag), "reading the non-finite flag");

    /* correctness on the whole buffers, and accuracy */
    CK(zpp_device_copy(g.dev, hq, g.q, g.qbytes), "downloading");
    CK(zpp_device_copy(g.dev, hy, g.y, g.xbytes), "downloading");
    for (int i = 0; i < nrows; i++) {
        row *w = &rows[i];
        l2acc l = {0, 0};
        switch (w->op) {
        case OP_QUANT:
            s = zpp_quantize(hx, a->dtype, n, &g.spec, hq_cpu);
            w->correct = s == ZPP_OK && same_bytes(hq, hq_cpu, g.qbytes, "quantize");
            for (size_t k = 0; k < n; k++)
                l2_add(&l, zpp_load_f32(hy, a->dtype, k), zpp_load_f32(hx, a->dtype, k));
            break;
        case OP_DEQUANT:
            s = zpp_dequantize(hq_cpu, n, &g.spec, a->dtype, hy_cpu);
            w->correct = s == ZPP_OK && same_values(hy, hy_cpu, n, a->dtype, "dequantize");
            for (size_t k = 0; k < n; k++)
                l2_add(&l, zpp_load_f32(hy, a->dtype, k), zpp_load_f32(hx, a->dtype, k));
            break;
        case OP_REORDER:
            CK(zpp_device_copy(g.dev, hr, g.r, rbytes), "downloading");
            s = zpp_quant_reorder_quantize(hx, a->dtype, g.cl, ZPP_GB_NODES, ZPP_GB_LOCAL,
                                           &g.spec4, hr_cpu);
            w->correct = s == ZPP_OK && same_bytes(hr, hr_cpu, rbytes, "reorder_quantize");
            for (size_t p = 0; p < ZPP_GB_RANKS; p++) {
                zpp_dequantize(hr_cpu + p * g.qb4, g.cl, &g.spec4, ZPP_FP32, tmp);
                const size_t src = reorder_src(p) * g.cl;
                for (size_t k = 0; k < g.cl; k++)
                    l2_add(&l, tmp[k], zpp_load_f32(hx, a->dtype, src + k));
            }
            break;
        case OP_DSR:
            CK(zpp_device_copy(g.dev, hd, g.d, dbytes), "downloading");
            s = zpp_quant_cpu_dequant_sum_requant(hr_cpu, 2, ZPP_GB_RANKS / 2, g.cl, 0, g.cl,
                                                  &g.spec4, &g.spec4, hd_cpu);
            w->correct = s == ZPP_OK && same_bytes(hd, hd_cpu, dbytes, "dequant_sum_requant");
            /* output chunk c = input 0 chunk c + input 1 chunk c, i.e. slots
             * c and c + 8 of the reorder output */
            for (size_t c = 0; c < ZPP_GB_RANKS / 2; c++) {
                zpp_dequantize(hd_cpu + c * g.qb4, g.cl, &g.spec4, ZPP_FP32, tmp);
                const size_t s0 = reorder_src(c) * g.cl;
                const size_t s1 = reorder_src(c + ZPP_GB_RANKS / 2) * g.cl;
                for (size_t k = 0; k < g.cl; k++)
                    l2_add(&l, tmp[k],
                           (double)zpp_load_f32(hx, a->dtype, s0 + k) +
                               (double)zpp_load_f32(hx, a->dtype, s1 + k));
            }
            break;
        default:
            CK(zpp_device_copy(g.dev, hred, g.red, g.cl * 4), "downloading");
            s = zpp_quant_cpu_dequant_reduce(hd_cpu, ZPP_GB_RANKS / 2, g.cl, &g.spec4,
                                             g.red_scale, hred_cpu);
            w->correct = s == ZPP_OK && same_values(hred, hred_cpu, g.cl, ZPP_FP32,
                                                    "dequant_reduce");
            /* every rank's chunk once: out = (1/16) * sum over all chunks */
            for (size_t k = 0; k < g.cl; k++) {
                double ex = 0;
                for (size_t r = 0; r < ZPP_GB_RANKS; r++)
                    ex += zpp_load_f32(hx, a->dtype, r * g.cl + k);
                l2_add(&l, hred[k], ex * g.red_scale);
            }
            break;
        }
        w->rel = l2_rel(&l);
    }

    if (!a->json) {
        char name[256];
        if (zpp_device_name(g.dev, name, sizeof name) != ZPP_OK)
            snprintf(name, sizeof name, "%s", g.dev->ops->name);
        printf("device: %s (GPU %d); copy: %.1f GB/s (read + write of %zu bytes)\n", name,
               g.dev->ordinal, copy_gbps, g.xbytes);
        printf("%-20s %-5s %4s %7s %11s %9s %9s %9s %6s %11s %s\n", "op", "dtype", "bits",
               "block", "n", "ms", "GB/s", "copy GB/s", "ratio", "rel_l2_err", "correct");
    }
    rc = 0;
    for (int i = 0; i < nrows; i++) {
        print_row(&g, &rows[i], copy_gbps);
        if (!rows[i].correct) rc = 1;
    }
    if (flag) {
        fprintf(stderr, "zeropp bench quant: the non-finite flag was raised on N(0,1) data\n");
        rc = 1;
    }
    if (rc) fprintf(stderr, "zeropp bench quant: GPU results differ from the CPU reference\n");
#undef CK
out:
    zpp_device_free(g.dev, g.red);
    zpp_device_free(g.dev, g.d);
    zpp_device_free(g.dev, g.r);
    zpp_device_free(g.dev, g.q);
    zpp_device_free(g.dev, g.y);
    zpp_device_free(g.dev, g.x);
    zpp_device_destroy(g.dev);
    free(tmp), free(hred_cpu), free(hred), free(hd_cpu), free(hd), free(hr_cpu), free(hr);
    free(hq_cpu), free(hq), free(hy_cpu), free(hy), free(hx);
    return rc;
}

