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
    size_t rbytes, dbytes; /* reorder output (16 chunks), sum output (8) */
    int qgz;               /* the input makes 16 chunks: the qgZ rows run */
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
        return zpp_device_dequant_reduce(g->dev, g->d, ZPP_GB_RANKS / 2, 0, g->cl, &g->spec4,
                                         NULL, g->red_scale, g->red);
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
    const char *kind = w->bits == 8 ? "int8" : a->e2m1 ? "e2m1" : "int4";
    if (a->json)
        printf("{\"bench\":\"quant\",\"device\":\"gpu\",\"op\":\"%s\",\"dtype\":\"%s\","
               "\"bits\":%d,\"kind\":\"%s\",\"block\":%zu,\"n\":%zu,\"stochastic\":%d,\"ms\":%.4f,"
               "\"gbps\":%.2f,\"copy_gbps\":%.2f,\"ratio\":%.4f,\"rel_l2_err\":%.6e,"
               "\"correct\":%s}\n",
               op_names[w->op], zpp_dtype_name(a->dtype), w->bits, kind, w->block, a->n, stoch,
               w->ms, gbps, copy_gbps, gbps / copy_gbps, w->rel, w->correct ? "true" : "false");
    else
        printf("%-20s %-5s %4s %7zu %11zu %9.3f %9.1f %9.1f %6.3f %11.3e %s\n", op_names[w->op],
               zpp_dtype_name(a->dtype), kind, w->block, a->n, w->ms, gbps, copy_gbps,
               gbps / copy_gbps, w->rel, w->correct ? "yes" : "NO");
}

/* Host buffers: the input, the GPU's results downloaded, and the CPU
 * reference's (the qgZ ones only when the input makes 16 chunks). */
typedef struct ghost {
    void *x, *y, *y_cpu;
    unsigned char *q, *q_cpu;
    unsigned char *r, *r_cpu, *d, *d_cpu;
    float *red, *red_cpu, *tmp;
} ghost;

/* Fails the bench with `what` when `call` fails (a function returning the
 * bench's exit code). */
#define GB_CHECK(call, what)                                                  \
    do {                                                                      \
        zpp_status gb_s_ = (call);                                            \
        if (gb_s_ != ZPP_OK) return zpp_cli_fail(what, gb_s_);                \
    } while (0)

/* Setup: the two quantization specs (the --bits/--block one, and qgZ's
 * 4-bit one: int4, or E2M1 with --e2m1). */
static void gbench_specs(gbench *g, const zpp_bench_quant_args *a) {
    g->a = a;
    g->spec = zpp_quant_spec_default(a->bits);
    if (a->bits == 4 && a->e2m1) g->spec.format = ZPP_QUANT_E2M1;
    g->spec.block = a->block ? a->block : g->spec.block;
    g->spec.stochastic = a->stochastic;
    g->spec.seed = 12345;
    g->spec4 = zpp_quant_spec_default(4);
    g->spec4.format = a->e2m1 ? ZPP_QUANT_E2M1 : ZPP_QUANT_INT;
    if (a->bits == 4) g->spec4.block = g->spec.block;
    g->spec4.stochastic = a->stochastic;
    g->spec4.seed = 67890;
}

/* Setup: the buffer sizes, and whether n makes the 16 qgZ chunks. */
static void gbench_sizes(gbench *g) {
    const size_t n = g->a->n;
    g->es = zpp_dtype_size(g->a->dtype);
    g->xbytes = n * g->es;
    g->qbytes = zpp_quant_bytes(n, &g->spec);
    g->cl = n / ZPP_GB_RANKS;
    g->qb4 = zpp_quant_bytes(g->cl, &g->spec4);
    g->red_scale = 1.0f / ZPP_GB_RANKS;
    g->qgz = g->cl > 0;
    g->rbytes = g->qb4 * ZPP_GB_RANKS;
    g->dbytes = g->qb4 * (ZPP_GB_RANKS / 2);
}

/* Setup: the host buffers, and the input filled. */
static int gbench_host_alloc(const gbench *g, ghost *h) {
    const size_t n = g->a->n;
    /* an odd number of blocks, so that the 16 qgZ chunks (a power of two
     * apart when n is) do not all hold the same values */
    size_t period = (((size_t)1 << 24) / g->spec.block | 1) * g->spec.block;
    if (period > n) period = n;
    h->x = malloc(g->xbytes), h->y = malloc(g->xbytes), h->y_cpu = malloc(g->xbytes);
    h->q = malloc(g->qbytes), h->q_cpu = malloc(g->qbytes);
    if (g->qgz) {
        h->r = malloc(g->rbytes), h->r_cpu = malloc(g->rbytes), h->d = malloc(g->dbytes),
        h->d_cpu = malloc(g->dbytes);
        h->red = malloc(g->cl * 4), h->red_cpu = malloc(g->cl * 4), h->tmp = malloc(g->cl * 4);
    }
    int cpu_ok = h->x && h->y && h->y_cpu && h->q && h->q_cpu &&
                 (!g->qgz || (h->r && h->r_cpu && h->d && h->d_cpu && h->red && h->red_cpu &&
                              h->tmp));
    if (!cpu_ok) {
        fprintf(stderr, "zeropp bench quant: out of host memory for n = %zu\n", n);
        return 1;
    }
    fill_normal(h->x, g->a->dtype, n, period);
    return 0;
}

/* Setup: the device buffers, the input uploaded, the outputs touched. */
static int gbench_device_alloc(gbench *g, const ghost *h) {
    GB_CHECK(zpp_device_alloc(g->dev, g->xbytes, &g->x), "allocating the input");
    GB_CHECK(zpp_device_alloc(g->dev, g->xbytes, &g->y), "allocating the output");
    GB_CHECK(zpp_device_alloc(g->dev, g->qbytes, &g->q), "allocating the quantized buffer");
    if (g->qgz) {
        GB_CHECK(zpp_device_alloc(g->dev, g->rbytes, &g->r), "allocating the reorder output");
        GB_CHECK(zpp_device_alloc(g->dev, g->dbytes, &g->d), "allocating the sum output");
        GB_CHECK(zpp_device_alloc(g->dev, g->cl * 4, (void **)&g->red),
                 "allocating the reduce output");
    }
    GB_CHECK(zpp_device_copy(g->dev, g->x, h->x, g->xbytes), "uploading the input");
    GB_CHECK(zpp_device_set(g->dev, g->y, 0, g->xbytes), "touching the output");
    GB_CHECK(zpp_device_set(g->dev, g->q, 0, g->qbytes), "touching the quantized buffer");
    return 0;
}

/* Timing: the copy, then every op; the ops run in pipeline order, so each
 * reads its predecessor's output. */
static int gbench_time(gbench *g, row rows[OP_COUNT], int *nrows_p, double *copy_gbps_p) {
    int nrows = 0;
    double copy_ms = 0;
    if (op_time(g, OP_COPY, &copy_ms)) return 1;
    *copy_gbps_p = 2.0 * (double)g->xbytes / (copy_ms * 1e-3) * 1e-9;
    for (int op = OP_QUANT; op < OP_COUNT; op++) {
        if (op >= OP_REORDER && !g->qgz) break;
        row *w = &rows[nrows++];
        memset(w, 0, sizeof *w);
        w->op = op;
        w->bits = op <= OP_DEQUANT ? g->spec.bits : 4;
        w->block = op <= OP_DEQUANT ? g->spec.block : g->spec4.block;
        if (op_time(g, op, &w->ms)) return 1;
        switch (op) {
        case OP_QUANT:
        case OP_DEQUANT: w->bytes = (double)(g->xbytes + g->qbytes); break;
        case OP_REORDER: w->bytes = (double)(g->cl * ZPP_GB_RANKS * g->es + g->rbytes); break;
        case OP_DSR: w->bytes = (double)(g->rbytes + g->dbytes); break;
        default: w->bytes = (double)(g->dbytes + g->cl * 4); break;
        }
    }
    *nrows_p = nrows;
    return 0;
}

/* Checks of quantize and dequantize: the GPU's bytes against quant.c's;
 * the accuracy of the round trip (hy) against the input. */
static void gbench_check_quant(const gbench *g, ghost *h, row *w, l2acc *l) {
    const zpp_bench_quant_args *a = g->a;
    const size_t n = a->n;
    zpp_status s;
    if (w->op == OP_QUANT) {
        s = zpp_quantize(h->x, a->dtype, n, &g->spec, h->q_cpu);
        w->correct = s == ZPP_OK && same_bytes(h->q, h->q_cpu, g->qbytes, "quantize");
    } else {
        s = zpp_dequantize(h->q_cpu, n, &g->spec, a->dtype, h->y_cpu);
        w->correct = s == ZPP_OK && same_values(h->y, h->y_cpu, n, a->dtype, "dequantize");
    }
    for (size_t k = 0; k < n; k++)
        l2_add(l, zpp_load_f32(h->y, a->dtype, k), zpp_load_f32(h->x, a->dtype, k));
}

/* Check of reorder_quantize: each output slot dequantized against the input
 * chunk it holds. */
static int gbench_check_reorder(const gbench *g, ghost *h, row *w, l2acc *l) {
    const zpp_bench_quant_args *a = g->a;
    GB_CHECK(zpp_device_copy(g->dev, h->r, g->r, g->rbytes), "downloading");
    zpp_status s = zpp_quant_reorder_quantize(h->x, a->dtype, g->cl, ZPP_GB_NODES, ZPP_GB_LOCAL,
                                              &g->spec4, h->r_cpu);
    w->correct = s == ZPP_OK && same_bytes(h->r, h->r_cpu, g->rbytes, "reorder_quantize");
    for (size_t p = 0; p < ZPP_GB_RANKS; p++) {
        zpp_dequantize(h->r_cpu + p * g->qb4, g->cl, &g->spec4, ZPP_FP32, h->tmp);
        const size_t src = reorder_src(p) * g->cl;
        for (size_t k = 0; k < g->cl; k++)
            l2_add(l, h->tmp[k], zpp_load_f32(h->x, a->dtype, src + k));
    }
    return 0;
}

/* Check of dequant_sum_requant: each output chunk dequantized against the
 * exact sum of the two input chunks it stands for. */
static int gbench_check_dsr(const gbench *g, ghost *h, row *w, l2acc *l) {
    const zpp_bench_quant_args *a = g->a;
    GB_CHECK(zpp_device_copy(g->dev, h->d, g->d, g->dbytes), "downloading");
    zpp_status s = zpp_quant_cpu_dequant_sum_requant(h->r_cpu, 2, ZPP_GB_RANKS / 2, g->cl, 0,
                                                     g->cl, &g->spec4, &g->spec4, h->d_cpu);
    w->correct = s == ZPP_OK && same_bytes(h->d, h->d_cpu, g->dbytes, "dequant_sum_requant");
    /* output chunk c = input 0 chunk c + input 1 chunk c, i.e. slots
     * c and c + 8 of the reorder output */
    for (size_t c = 0; c < ZPP_GB_RANKS / 2; c++) {
        zpp_dequantize(h->d_cpu + c * g->qb4, g->cl, &g->spec4, ZPP_FP32, h->tmp);
        const size_t s0 = reorder_src(c) * g->cl;
        const size_t s1 = reorder_src(c + ZPP_GB_RANKS / 2) * g->cl;
        for (size_t k = 0; k < g->cl; k++)
            l2_add(l, h->tmp[k],
                   (double)zpp_load_f32(h->x, a->dtype, s0 + k) +
                       (double)zpp_load_f32(h->x, a->dtype, s1 + k));
    }
    return 0;
}

/* Check of dequant_reduce: against (1/16) * the exact sum of every rank's
 * chunk. */
static int gbench_check_reduce(const gbench *g, ghost *h, row *w, l2acc *l) {
    const zpp_bench_quant_args *a = g->a;
    GB_CHECK(zpp_device_copy(g->dev, h->red, g->red, g->cl * 4), "downloading");
    zpp_status s = zpp_quant_cpu_dequant_reduce(h->d_cpu, ZPP_GB_RANKS / 2, 0, g->cl,
                                                &g->spec4, NULL, g->red_scale, h->red_cpu);
    w->correct =
        s == ZPP_OK && same_values(h->red, h->red_cpu, g->cl, ZPP_FP32, "dequant_reduce");
    /* every rank's chunk once: out = (1/16) * sum over all chunks */
    for (size_t k = 0; k < g->cl; k++) {
        double ex = 0;
        for (size_t r = 0; r < ZPP_GB_RANKS; r++)
            ex += zpp_load_f32(h->x, a->dtype, r * g->cl + k);
        l2_add(l, h->red[k], ex * g->red_scale);
    }
    return 0;
}

/* Correctness on the whole buffers, and accuracy, of every timed op, in
 * pipeline order (each CPU reference reads its predecessor's). */
static int gbench_check(const gbench *g, ghost *h, row *rows, int nrows) {
    GB_CHECK(zpp_device_copy(g->dev, h->q, g->q, g->qbytes), "downloading");
    GB_CHECK(zpp_device_copy(g->dev, h->y, g->y, g->xbytes), "downloading");
    for (int i = 0; i < nrows; i++) {
        row *w = &rows[i];
        l2acc l = {0, 0};
        int rc = 0;
        switch (w->op) {
        case OP_QUANT:
        case OP_DEQUANT: gbench_check_quant(g, h, w, &l); break;
        case OP_REORDER: rc = gbench_check_reorder(g, h, w, &l); break;
        case OP_DSR: rc = gbench_check_dsr(g, h, w, &l); break;
        default: rc = gbench_check_reduce(g, h, w, &l); break;
        }
        if (rc) return rc;
        w->rel = l2_rel(&l);
    }
    return 0;
}

/* Printing: the table's header (text only), a row per op, and the verdict;
 * the exit code is 1 if anything is incorrect or the non-finite flag was
 * raised. */
static int gbench_print(const gbench *g, const row *rows, int nrows, double copy_gbps,
                        int flag) {
    if (!g->a->json) {
        char name[256];
        if (zpp_device_name(g->dev, name, sizeof name) != ZPP_OK)
            snprintf(name, sizeof name, "%s", g->dev->ops->name);
        printf("device: %s (GPU %d); copy: %.1f GB/s (read + write of %zu bytes)\n", name,
               g->dev->ordinal, copy_gbps, g->xbytes);
        printf("%-20s %-5s %4s %7s %11s %9s %9s %9s %6s %11s %s\n", "op", "dtype", "kind",
               "block", "n", "ms", "GB/s", "copy GB/s", "ratio", "rel_l2_err", "correct");
    }
    int rc = 0;
    for (int i = 0; i < nrows; i++) {
        print_row(g, &rows[i], copy_gbps);
        if (!rows[i].correct) rc = 1;
    }
    if (flag) {
        fprintf(stderr, "zeropp bench quant: the non-finite flag was raised on N(0,1) data\n");
        rc = 1;
    }
    if (rc) fprintf(stderr, "zeropp bench quant: GPU results differ from the CPU reference\n");
    return rc;
}

static void gbench_free(gbench *g, ghost *h) {
    zpp_device_free(g->dev, g->red);
    zpp_device_free(g->dev, g->d);
    zpp_device_free(g->dev, g->r);
    zpp_device_free(g->dev, g->q);
    zpp_device_free(g->dev, g->y);
    zpp_device_free(g->dev, g->x);
    zpp_device_destroy(g->dev);
    free(h->tmp), free(h->red_cpu), free(h->red), free(h->d_cpu), free(h->d), free(h->r_cpu),
        free(h->r);
    free(h->q_cpu), free(h->q), free(h->y_cpu), free(h->y), free(h->x);
}

int zpp_bench_quant_gpu(const zpp_bench_quant_args *a) {
    gbench g;
    memset(&g, 0, sizeof g);
    gbench_specs(&g, a);
    zpp_status s = zpp_quant_spec_check(&g.spec);
    if (s != ZPP_OK) return zpp_cli_fail("bench quant", s);
    if (zpp_dtype_size(a->dtype) == 0 || a->n == 0) {
        fprintf(stderr, "zeropp bench quant: need a dtype and n > 0\n");
        return 1;
    }
    if ((s = zpp_device_create_gpu(0, &g.dev)) != ZPP_OK)
        return zpp_cli_fail("bench quant: --device gpu", s);
    gbench_sizes(&g);

    ghost h;
    memset(&h, 0, sizeof h);
    row rows[OP_COUNT];
    int nrows = 0, flag = 0;
    double copy_gbps = 0;
    int rc = gbench_host_alloc(&g, &h);
    if (!rc) rc = gbench_device_alloc(&g, &h);
    if (!rc) rc = gbench_time(&g, rows, &nrows, &copy_gbps);
    if (!rc && (s = zpp_device_nonfinite_take(g.dev, &flag)) != ZPP_OK)
        rc = zpp_cli_fail("reading the non-finite flag", s);
    if (!rc) rc = gbench_check(&g, &h, rows, nrows);
    if (!rc) rc = gbench_print(&g, rows, nrows, copy_gbps, flag);
    gbench_free(&g, &h);
    return rc;
}
#undef GB_CHECK
