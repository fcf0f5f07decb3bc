/* tools/bench_quant.c — `zeropp bench quant`: throughput and accuracy of
 * block quantization.
 *
 * CPU (one thread): quantize and dequantize n elements of N(0,1) data,
 * median of several timed runs after a warm-up. GB/s counts the bytes read
 * plus the bytes written; memcpy_gbps is memcpy of the input's size measured
 * in the same run and counted the same way (read + write), so `ratio` says
 * how close the kernel comes to moving memory at memcpy speed.
 * rel_l2_err = ||dequantize(quantize(x)) - x|| / ||x||, the dequantized
 * values in the bench dtype. --device gpu hands the same arguments to
 * bench_quant_gpu.c (CUDA builds only). */
#include "bench_quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/random.h"
#include "device/device.h"

#define ZPP_BENCH_RUNS 7

static void usage(FILE *f) {
    fprintf(f,
            "usage: zeropp bench quant [--dtype bf16|fp16|fp32] [--bits 8|4] [--block B]\n"
            "                          [--n N] [--stochastic] [--e2m1] [--json]\n"
            "                          [--device cpu|gpu]\n"
            "\n"
            "  --dtype D      element type of the data (default bf16)\n"
            "  --bits 8|4     int8 or int4 payload (default 8)\n"
            "  --block B      elements per scale, a multiple of 8 (default %d for int8,\n"
            "                 %d for int4)\n"
            "  --n N          number of elements (default 16Mi = 16777216)\n"
            "  --stochastic   stochastic rounding instead of round-half-to-even\n"
            "  --e2m1         4-bit payloads (--bits 4, and qgZ's on the GPU) in E2M1, not int4\n"
            "  --json         one JSON object per line per operation\n"
            "  --device D     cpu (one thread, default) or gpu (CUDA builds)\n"
            "Counts take suffixes: " ZPP_CLI_COUNT_HELP ".\n",
            ZPP_QUANT_DEFAULT_BLOCK_INT8, ZPP_QUANT_DEFAULT_BLOCK_INT4);
}

typedef struct bench_row {
    const char *op;
    double seconds, bytes;
} bench_row;

static void print_rows(const zpp_bench_quant_args *a, const bench_row *rows, int nrows,
                       double memcpy_gbps, double rel_l2) {
    const char *isa = zpp_cpu_isa_name(zpp_cpu_isa_active());
    if (!a->json) {
        printf("CPU kernels: %s (chosen at run time; ZPP_CPU_ISA=generic|avx2|avx512 caps it)\n",
               isa);
        printf("%-11s %-5s %4s %7s %11s %8s %8s %12s %6s %11s\n", "op", "dtype", "kind", "block",
               "n", "ms", "GB/s", "memcpy GB/s", "ratio", "rel_l2_err");
    }
    const char *kind = a->bits == 8 ? "int8" : a->e2m1 ? "e2m1" : "int4";
    for (int r = 0; r < nrows; r++) {
        double gbps = rows[r].bytes / rows[r].seconds * 1e-9;
        if (a->json)
            printf("{\"bench\":\"quant\",\"op\":\"%s\",\"dtype\":\"%s\",\"bits\":%d,"
                   "\"kind\":\"%s\",\"block\":%zu,\"n\":%zu,\"stochastic\":%d,\"ms\":%.4f,"
                   "\"gbps\":%.4f,\"memcpy_gbps\":%.4f,\"ratio\":%.4f,\"rel_l2_err\":%.6e,"
                   "\"device\":\"cpu\",\"cpu_isa\":\"%s\"}\n",
                   rows[r].op, zpp_dtype_name(a->dtype), a->bits, kind, a->block, a->n,
                   a->stochastic, rows[r].seconds * 1e3, gbps, memcpy_gbps, gbps / memcpy_gbps,
                   rel_l2, isa);
        else
            printf("%-11s %-5s %4s %7zu %11zu %8.3f %8.2f %12.2f %6.3f %11.3e\n", rows[r].op,
                   zpp_dtype_name(a->dtype), kind, a->block, a->n, rows[r].seconds * 1e3, gbps,
                   memcpy_gbps, gbps / memcpy_gbps, rel_l2);
    }
}

static int bench_cpu(const zpp_bench_quant_args *a) {
    zpp_quant_spec spec = zpp_quant_spec_default(a->bits);
    spec.format = a->e2m1 ? ZPP_QUANT_E2M1 : ZPP_QUANT_INT;
    spec.block = a->block;
    spec.stochastic = a->stochastic;
    spec.seed = 12345;
    zpp_status st = zpp_quant_spec_check(&spec);
    if (st != ZPP_OK) return zpp_cli_fail("bench quant", st);

    const size_t es = zpp_dtype_size(a->dtype), xbytes = a->n * es;
    const size_t qbytes = zpp_quant_bytes(a->n, &spec);
    void *x = NULL, *y = NULL, *q = NULL;
    int rc = 1;
    zpp_device *dev = NULL; /* the host backend: 64-byte aligned buffers */
    if ((st = zpp_device_create_host(&dev)) != ZPP_OK ||
        (st = zpp_device_alloc(dev, xbytes, &x)) != ZPP_OK ||
        (st = zpp_device_alloc(dev, xbytes, &y)) != ZPP_OK ||
        (st = zpp_device_alloc(dev, qbytes, &q)) != ZPP_OK) {
        rc = zpp_cli_fail("bench quant: allocating the buffers", st);
        goto out;
    }
    zpp_fill_normal(x, a->dtype, a->n, 0x5eed5eedull);
    memset(y, 0, xbytes); /* touch every page before timing */
    memset(q, 0, qbytes);

    double tq[ZPP_BENCH_RUNS], td[ZPP_BENCH_RUNS], tm[ZPP_BENCH_RUNS];
    for (int r = -1; r < ZPP_BENCH_RUNS; r++) { /* r = -1: warm-up */
        double t0 = (1e-3 * zpp_cli_now_ms());
        st = zpp_quantize(x, a->dtype, a->n, &spec, q);
        double t1 = (1e-3 * zpp_cli_now_ms());
        if (st != ZPP_OK) {
            rc = zpp_cli_fail("bench quant: quantize", st);
            goto out;
        }
        st = zpp_dequantize(q, a->n, &spec, a->dtype, y);
        double t2 = (1e-3 * zpp_cli_now_ms());
        if (st != ZPP_OK) {
            rc = zpp_cli_fail("bench quant: dequantize", st);
            goto out;
        }
        memcpy(y, x, xbytes);
        double t3 = (1e-3 * zpp_cli_now_ms());
        if (r >= 0) {
            tq[r] = t1 - t0;
            td[r] = t2 - t1;
            tm[r] = t3 - t2;
        }
    }
    double memcpy_gbps = 2.0 * (double)xbytes / zpp_cli_median(tm, ZPP_BENCH_RUNS) * 1e-9;

    /* accuracy, on the dequantized values in the bench dtype */
    if ((st = zpp_dequantize(q, a->n, &spec, a->dtype, y)) != ZPP_OK) {
        rc = zpp_cli_fail("bench quant: dequantize", st);
        goto out;
    }
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a->n; i++) {
        double xi = zpp_load_f32(x, a->dtype, i), d = zpp_load_f32(y, a->dtype, i) - xi;
        num += d * d;
        den += xi * xi;
    }
    double rel_l2 = den > 0 ? sqrt(num / den) : 0.0;

    bench_row rows[2] = {
        {"quantize", zpp_cli_median(tq, ZPP_BENCH_RUNS), (double)(xbytes + qbytes)},
        {"dequantize", zpp_cli_median(td, ZPP_BENCH_RUNS), (double)(qbytes + xbytes)},
    };
    print_rows(a, rows, 2, memcpy_gbps, rel_l2);
    rc = 0;
out:
    zpp_device_free(dev, q);
    zpp_device_free(dev, y);
    zpp_device_free(dev, x);
    zpp_device_destroy(dev);
    return rc;
}

int zpp_cli_bench_quant(int argc, char **argv) {
    zpp_bench_quant_args a = {ZPP_BF16, 8, 0, (size_t)1 << 24, 0, 0, 0};
    int gpu = 0;
    const char *dtype = NULL, *device = NULL;
    const zpp_cli_opt opts[] = {
        {"--json", ZPP_CLI_FLAG, &a.json, 0, 0},
        {"--stochastic", ZPP_CLI_FLAG, &a.stochastic, 0, 0},
        {"--e2m1", ZPP_CLI_FLAG, &a.e2m1, 0, 0},
        {"--dtype", ZPP_CLI_STR, &dtype, 0, 0},
        {"--bits", ZPP_CLI_INT, &a.bits, 4, 8},
        {"--block", ZPP_CLI_SIZE, &a.block, 1, 1ll << 53},
        {"--n", ZPP_CLI_SIZE, &a.n, 1, 1ll << 53},
        {"--device", ZPP_CLI_STR, &device, 0, 0},
    };
    int pr = zpp_cli_parse_opts("bench quant", argc, argv, opts,
                                (int)(sizeof opts / sizeof opts[0]), 1);
    if (pr > 0) {
        usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (a.bits != 8 && a.bits != 4) {
        fprintf(stderr, "zeropp bench quant: --bits %d: use 8 or 4\n", a.bits);
        return 2;
    }
    if (dtype && zpp_dtype_parse(dtype, &a.dtype) != ZPP_OK) {
        fprintf(stderr, "zeropp bench quant: --dtype %s: use bf16, fp16 or fp32\n", dtype);
        return 2;
    }
    if (device) {
        if (strcmp(device, "cpu") && strcmp(device, "gpu")) {
            fprintf(stderr, "zeropp bench quant: --device %s: use cpu or gpu\n", device);
            return 2;
        }
        gpu = !strcmp(device, "gpu");
    }
    if (a.block == 0)
        a.block = a.bits == 4 ? ZPP_QUANT_DEFAULT_BLOCK_INT4 : ZPP_QUANT_DEFAULT_BLOCK_INT8;
    zpp_quant_spec check = {a.bits, a.block, a.stochastic, 0,
                            a.e2m1 ? ZPP_QUANT_E2M1 : ZPP_QUANT_INT};
    if (zpp_quant_spec_check(&check) != ZPP_OK) {
        fprintf(stderr, "zeropp bench quant: %s\n", zpp_last_error());
        return 2;
    }
    if (gpu) return zpp_bench_quant_gpu(&a);
    return bench_cpu(&a);
}
