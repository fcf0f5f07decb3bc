/* test_tools.c — the benchmark and planning commands as a user runs them:
 * their JSON lines parse, carry the documented keys, report correct results,
 * and meet the issues' acceptance figures where those are byte counts (times
 * are never asserted: this is not a benchmark).
 *
 * ZPP_CLI (the zeropp command) and ZPP_MPIEXEC (mpirun) come from ctest. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "testlib.h"

#define MAX_LINES 16

/* Runs a command and parses each stdout line that starts with '{'. */
static int run_json(const char *cmd, cJSON **objs, int cap) {
    FILE *p = popen(cmd, "r");
    EXPECT(p != NULL, "popen: %s", cmd);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        if (line[0] != '{') continue;
        EXPECT(n < cap, "too many JSON lines from %s", cmd);
        objs[n] = cJSON_Parse(line);
        EXPECT(objs[n] != NULL, "not JSON: %s", line);
        n++;
    }
    int rc = pclose(p);
    EXPECT(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "'%s' failed (status %d)", cmd, rc);
    return n;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT(cJSON_IsNumber(v), "key '%s' missing or not a number", key);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT(cJSON_IsString(v), "key '%s' missing or not a string", key);
    return v->valuestring;
}

static int truth(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT(cJSON_IsBool(v), "key '%s' missing or not a bool", key);
    return cJSON_IsTrue(v);
}

/* `mpirun -np <np> zeropp bench comm <args> --json`: its lines, parsed. */
static int bench_comm_json(int np, const char *args, cJSON **o) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --oversubscribe --bind-to none -np %d %s bench comm %s --json",
             getenv("ZPP_MPIEXEC"), np, getenv("ZPP_CLI"), args);
    return run_json(cmd, o, MAX_LINES);
}

/* `zeropp bench comm` on 8 ranks as 2 nodes of 4: every mode correct and as
 * planned; ZeRO++ sends <= 0.26 of ZeRO-3's cross-node bytes; qwZ's forward
 * gather 0.5 plus the scales (int8 blocks of 256: 4 bytes per 256). qgZ
 * runs its pipeline: shards of 125000 / 8 = 15625 elements in slabs of 4096. */
static void test_bench_comm_acceptance(void) {
    cJSON *o[MAX_LINES];
    int n = bench_comm_json(8, "--params 1000000 --node-size 4 --iters 1 --grad-slab 4096", o);
    EXPECT(n == 5, "%d modes reported, expected 5", n);
    double z3 = -1, z3_fwd = -1;
    for (int i = 0; i < n; i++) {
        EXPECT(strcmp(str(o[i], "bench"), "comm") == 0);
        EXPECT(num(o[i], "world") == 8 && num(o[i], "node_size") == 4);
        EXPECT(num(o[i], "params") == 1000000);
        EXPECT(num(o[i], "time_ms") >= 0 && num(o[i], "intra_node_bytes") > 0);
        EXPECT(truth(o[i], "correct"), "mode %s incorrect", str(o[i], "mode"));
        EXPECT(truth(o[i], "plan_match"), "mode %s differs from the plan", str(o[i], "mode"));
        EXPECT(num(o[i], "grad_slabs") == 4 && num(o[i], "grad_slab") == 4096);
        if (!strcmp(str(o[i], "mode"), "zero3")) {
            z3 = num(o[i], "cross_node_bytes");
            z3_fwd = num(o[i], "fwd_gather_cross_bytes");
        }
    }
    EXPECT(z3 > 0, "no zero3 line");
    for (int i = 0; i < n; i++) {
        const char *m = str(o[i], "mode");
        double r = num(o[i], "cross_node_bytes") / z3;
        if (!strcmp(m, "zeropp")) EXPECT(r <= 0.26, "zeropp/zero3 = %.4f", r);
        if (!strcmp(m, "qwz")) {
            double f = num(o[i], "fwd_gather_cross_bytes") / z3_fwd;
            EXPECT(f >= 0.5 && f <= 0.5 * (1 + 4.0 / 256) + 1e-3, "qwz forward ratio %.4f", f);
        }
        if (!strcmp(m, "hpz")) EXPECT(num(o[i], "bwd_gather_cross_bytes") == 0);
        /* the plain all-gather of the quantized bytes, and each quantized
         * path against it (only those: zero3 and hpz move bf16) */
        EXPECT(num(o[i], "mpi_int8_wire_allgather_ms") > 0 &&
               num(o[i], "mpi_int4_wire_allgather_ms") > 0);
        int qw = !strcmp(m, "qwz") || !strcmp(m, "zeropp");
        int qg = !strcmp(m, "qgz") || !strcmp(m, "zeropp");
        EXPECT(!qw || num(o[i], "fwd_gather_vs_wire_paired") > 0, "mode %s", m);
        EXPECT(!qg || num(o[i], "grad_reduce_vs_wire_paired") > 0, "mode %s", m);
        EXPECT(qw == (cJSON_GetObjectItemCaseSensitive(o[i], "fwd_gather_vs_wire") != NULL) &&
                   qg == (cJSON_GetObjectItemCaseSensitive(o[i], "grad_reduce_vs_wire") != NULL),
               "mode %s: a wire ratio where nothing is quantized, or none where it is", m);
        cJSON_Delete(o[i]);
    }
}

/* Two nodes of one rank: qgZ quantizes once and dequantizes straight into
 * the sum, so its error comes closest to the bench's bound (one int4 level;
 * over a million elements the worst is within 2% of it). The 8-rank run
 * above has a second level and slack: a bench bound that no longer matches
 * the quantizer's rounding passed there and failed here (a bf16-scale
 * trial, 2026-11-30). */
static void test_bench_comm_tight_bounds(void) {
    cJSON *o[MAX_LINES];
    int n = bench_comm_json(2, "--params 1000000 --units 1 --node-size 1 --iters 1 "
                               "--modes qwz,qgz", o);
    EXPECT(n == 2, "%d modes reported, expected 2", n);
    for (int i = 0; i < n; i++) {
        double w = num(o[i], "max_err_over_bound");
        EXPECT(truth(o[i], "correct") && w <= 1.0, "mode %s: error / bound %.4f",
               str(o[i], "mode"), w);
        EXPECT(w > 0.5, "mode %s: error / bound %.4f, the bound is loose", str(o[i], "mode"), w);
        cJSON_Delete(o[i]);
    }
}

/* `zeropp bench quant --json`: the documented keys, and the error of the
 * default blocks on N(0,1) within the bounds. */
static void test_bench_quant_json(void) {
    const char *dtypes[] = {"bf16", "fp16", "fp32"};
    for (int d = 0; d < 3; d++) {
        for (int bits = 4; bits <= 8; bits += 4) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "%s bench quant --dtype %s --bits %d --n 100003 --json",
                     getenv("ZPP_CLI"), dtypes[d], bits);
            cJSON *o[MAX_LINES];
            int n = run_json(cmd, o, MAX_LINES);
            EXPECT(n == 2, "%d lines", n);
            for (int i = 0; i < n; i++) {
                EXPECT(strcmp(str(o[i], "bench"), "quant") == 0);
                const char *op = str(o[i], "op");
                EXPECT(!strcmp(op, "quantize") || !strcmp(op, "dequantize"), "op %s", op);
                EXPECT(strcmp(str(o[i], "dtype"), dtypes[d]) == 0);
                EXPECT(num(o[i], "bits") == bits && num(o[i], "n") == 100003);
                EXPECT(num(o[i], "block") == (bits == 8 ? ZPP_QUANT_DEFAULT_BLOCK_INT8
                                                        : ZPP_QUANT_DEFAULT_BLOCK_INT4));
                EXPECT(num(o[i], "gbps") > 0 && num(o[i], "memcpy_gbps") > 0);
                double e = num(o[i], "rel_l2_err");
                EXPECT(e > 0 && e <= (bits == 8 ? 0.01 : 0.15), "rel_l2_err %g", e);
                cJSON_Delete(o[i]);
            }
        }
    }
}

/* `zeropp plan` agrees with the formulas of DESIGN.md §5 for a model whose
 * units divide evenly: ZeRO-3 moves 3 * (N-1)/N * M cross-node per node. */
static void test_plan_formulas(void) {
    char cmd[1024];
    /* 8 units of 2^20 bf16 parameters; 4 nodes of 8 ranks */
    snprintf(cmd, sizeof cmd, "%s plan --params 8388608 --world 32 --node-size 8 --json",
             getenv("ZPP_CLI"));
    cJSON *o[MAX_LINES];
    int n = run_json(cmd, o, MAX_LINES);
    EXPECT(n == 5, "%d modes", n);
    const double M = 8388608.0 * 2;
    for (int i = 0; i < n; i++) {
        if (!strcmp(str(o[i], "mode"), "zero3"))
            EXPECT(fabs(num(o[i], "cross_node_bytes") - 3 * 0.75 * M) < 1,
                   "zero3 cross %.0f, expected %.0f", num(o[i], "cross_node_bytes"), 2.25 * M);
        cJSON_Delete(o[i]);
    }
}

ZPP_TESTS(ZPP_TEST(test_bench_comm_acceptance), ZPP_TEST(test_bench_comm_tight_bounds),
          ZPP_TEST(test_bench_quant_json), ZPP_TEST(test_plan_formulas))
