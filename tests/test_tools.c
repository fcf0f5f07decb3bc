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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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
    static const char *const kinds[3] = {"int4", "e2m1", "int8"};
    for (int d = 0; d < 3; d++) {
        for (int k = 0; k < 3; k++) {
            const int bits = k == 2 ? 8 : 4;
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "%s bench quant --dtype %s --bits %d%s --n 100003 --json",
                     getenv("ZPP_CLI"), dtypes[d], bits, k == 1 ? " --e2m1" : "");
            cJSON *o[MAX_LINES];
            int n = run_json(cmd, o, MAX_LINES);
            EXPECT(n == 2, "%d lines", n);
            for (int i = 0; i < n; i++) {
                EXPECT(strcmp(str(o[i], "bench"), "quant") == 0);
                const char *op = str(o[i], "op");
                EXPECT(!strcmp(op, "quantize") || !strcmp(op, "dequantize"), "op %s", op);
                EXPECT(strcmp(str(o[i], "dtype"), dtypes[d]) == 0);
                EXPECT(num(o[i], "bits") == bits && num(o[i], "n") == 100003);
                EXPECT(strcmp(str(o[i], "kind"), kinds[k]) == 0, "kind %s", str(o[i], "kind"));
                EXPECT(num(o[i], "block") == (bits == 8 ? ZPP_QUANT_DEFAULT_BLOCK_INT8
                                                        : ZPP_QUANT_DEFAULT_BLOCK_INT4));
                EXPECT(num(o[i], "gbps") > 0 && num(o[i], "memcpy_gbps") > 0);
                double e = num(o[i], "rel_l2_err");
                EXPECT(e > 0 && e <= (bits == 8 ? 0.01 : 0.15), "rel_l2_err %g", e);
                const char *isa = str(o[i], "cpu_isa");
                EXPECT(!strcmp(isa, "generic") || !strcmp(isa, "avx2") || !strcmp(isa, "avx512"),
                       "cpu_isa %s", isa);
                cJSON_Delete(o[i]);
            }
        }
    }
    /* ZPP_CPU_ISA=generic picks the baseline kernels, whatever the CPU. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ZPP_CPU_ISA=generic %s bench quant --n 1000 --json",
             getenv("ZPP_CLI"));
    cJSON *o[MAX_LINES];
    int n = run_json(cmd, o, MAX_LINES);
    EXPECT(n == 2, "%d lines", n);
    for (int i = 0; i < n; i++) {
        EXPECT(strcmp(str(o[i], "cpu_isa"), "generic") == 0, "cpu_isa %s", str(o[i], "cpu_isa"));
        cJSON_Delete(o[i]);
    }
}

/* `zeropp plan` agrees with the formulas of DESIGN.md §5 for a model whose
 * units divide evenly: ZeRO-3 moves 3 * (N-1)/N * M cross-node per node
 * when every unit is gathered again in the backward (--reuse-distance 0).
 * The reuse rule keeps the last units gathered into the backward: unit 7
 * always, unit 7-m when 2 m 2^20 parameters in between are within the
 * distance. At 2 x 2 x 2^20 = 4194304 units 5..7 stay (unit 4 has 6291456
 * in between): (3 - 3/8) of the three passes; at the default 1e9 all 8 stay
 * (at most 14680064 in between): no backward gather, 2 passes. */
static void test_plan_formulas(void) {
    const struct {
        const char *reuse;
        int kept;
        double passes;
    } pt[] = {{"--reuse-distance 0", 0, 3}, {"--reuse-distance 4194304", 3, 3 - 3.0 / 8},
              {"--reuse-distance 4194303", 2, 3 - 2.0 / 8}, {"", 8, 2}};
    for (size_t p = 0; p < sizeof pt / sizeof pt[0]; p++) {
        char cmd[1024];
        /* 8 units of 2^20 bf16 parameters; 4 nodes of 8 ranks */
        snprintf(cmd, sizeof cmd, "%s plan --params 8388608 --world 32 --node-size 8 %s --json",
                 getenv("ZPP_CLI"), pt[p].reuse);
        cJSON *o[MAX_LINES];
        int n = run_json(cmd, o, MAX_LINES);
        EXPECT(n == 5, "%d modes", n);
        const double M = 8388608.0 * 2;
        for (int i = 0; i < n; i++) {
            EXPECT(num(o[i], "kept_units") == pt[p].kept, "'%s': kept %g, expected %d",
                   pt[p].reuse, num(o[i], "kept_units"), pt[p].kept);
            if (!strcmp(str(o[i], "mode"), "zero3"))
                EXPECT(fabs(num(o[i], "cross_node_bytes") - pt[p].passes * 0.75 * M) < 1,
                       "'%s': zero3 cross %.0f, expected %.0f", pt[p].reuse,
                       num(o[i], "cross_node_bytes"), pt[p].passes * 0.75 * M);
            cJSON_Delete(o[i]);
        }
    }
}

/* ---- Every mode of `zeropp plan` against DESIGN.md §5, written out here ----
 *
 * Independent of volume.c: the calls each mode makes per unit (DESIGN.md §10,
 * collectives.h) and the §5 cost of each, in closed form. With N nodes of S
 * ranks (W = N*S) and b bytes per rank:
 *   all-gather / reduce-scatter over the world (full buffer W*b):
 *       cross (N-1)/N * W*b = (N-1)*S*b per node, intra (S-1)/S * W*b per rank,
 *       (S-1)*W*b per node;
 *   hpZ's backward all-gather of secondary shards (N*shard elements per rank)
 *       inside the node: cross 0, intra (S-1)*S*(N*shard*e);
 *   qgZ per slab of len elements, qg = int4 wire bytes of len:
 *       intra all-to-all (S > 1), N*qg to each of S-1 peers from each of S
 *       ranks: intra S*(S-1)*N*qg; inter exchange (N > 1), qg to each of
 *       N-1 nodes from each of S ranks: cross S*(N-1)*qg.
 * Wire bytes of a quantized tensor of n elements (DESIGN.md §8): payload n
 * (int8) or ceil(n/2) (int4), rounded up to 16, plus 4 bytes per block,
 * rounded up to 16. All the numbers are integers well below 2^53, so the
 * comparison is exact: a formula off by one term (or by one 16-byte round)
 * fails. */
typedef struct plan_expect {
    double cross[3], intra[3]; /* fwd gather, bwd gather, grad reduce */
} plan_expect;

static double round16(double x) { return ceil(x / 16.0) * 16.0; }

static double wire_bytes(double n, int bits, double block) {
    double payload = bits == 8 ? n : ceil(n / 2.0);
    return round16(round16(payload) + 4.0 * ceil(n / block));
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* qgZ's automatic slabs, as collectives.h documents them */
#define QGZ_MAX_SLABS 16
#define QGZ_AUTO_SLABS 8
#define QGZ_AUTO_MIN ((size_t)1 << 22)

/* qgZ's slab length for a shard of n elements (collectives.h: one slab when
 * the reduction crosses nodes; else ceil(n/8) but at least 2^22 elements, a
 * multiple of 4 int4 blocks, at most 16 slabs). */
static size_t qgz_slab(size_t n, int nodes) {
    if (nodes > 1) return n;
    size_t want = ceil_div(n, QGZ_AUTO_SLABS);
    if (want < QGZ_AUTO_MIN) want = QGZ_AUTO_MIN;
    if (want >= n) return n;
    if (want < ceil_div(n, QGZ_MAX_SLABS)) want = ceil_div(n, QGZ_MAX_SLABS);
    size_t align = 4 * ZPP_QUANT_DEFAULT_BLOCK_INT4;
    size_t slab = ceil_div(want, align) * align;
    return slab >= n ? n : slab;
}

static plan_expect plan_formula(const char *mode, size_t params, int units, int nodes, int S,
                                double e) {
    int qw = !strcmp(mode, "qwz") || !strcmp(mode, "zeropp");
    int hpz = !strcmp(mode, "hpz") || !strcmp(mode, "zeropp");
    int qg = !strcmp(mode, "qgz") || !strcmp(mode, "zeropp");
    double N = nodes, W = (double)nodes * S;
    plan_expect x;
    memset(&x, 0, sizeof x);
    for (int u = 0; u < units; u++) {
        size_t numel = params / (size_t)units + ((size_t)u < params % (size_t)units);
        if (numel == 0) continue; /* an empty unit makes no call */
        size_t shard = ceil_div(numel, (size_t)(nodes * S));
        double b = qw ? wire_bytes((double)shard, 8, ZPP_QUANT_DEFAULT_BLOCK_INT8)
                      : (double)shard * e;
        /* forward: world all-gather */
        x.cross[0] += (N - 1) * S * b;
        x.intra[0] += (S - 1) * W * b;
        if (hpz) { /* backward: the secondary shards, inside the node */
            x.intra[1] += (S - 1) * S * (N * (double)shard * e);
        } else {
            x.cross[1] += (N - 1) * S * b;
            x.intra[1] += (S - 1) * W * b;
        }
        if (!qg) { /* reduce-scatter of the full gradient */
            x.cross[2] += (N - 1) * S * (double)shard * e;
            x.intra[2] += (S - 1) * W * (double)shard * e;
            continue;
        }
        size_t slab = qgz_slab(shard, nodes);
        for (size_t first = 0; first < shard; first += slab) {
            size_t len = shard - first < slab ? shard - first : slab;
            double q = wire_bytes((double)len, 4, ZPP_QUANT_DEFAULT_BLOCK_INT4);
            if (S > 1) x.intra[2] += S * (S - 1.0) * N * q;
            if (nodes > 1) x.cross[2] += S * (N - 1) * q;
        }
    }
    return x;
}

/* `zeropp plan --json` for random sizes, worlds and node shapes (tiny units
 * of fewer elements than ranks, more units than parameters, shards past qgZ's
 * 2^22-element slabs, all three dtypes): all 5 modes, each phase's cross-
 * and intra-node bytes and the totals, equal to the formulas above, which
 * gather every unit again in the backward (--reuse-distance 0). */
static void test_plan_all_modes(void) {
    zpp_rng rng = zpp_rng_make(zpp_test_seed(5));
    const char *dtypes[] = {"bf16", "fp16", "fp32"};
    const double dsize[] = {2, 2, 4};
    const char *names[] = {"zero3", "qwz", "hpz", "qgz", "zeropp"};
    const char *phase[] = {"fwd_gather", "bwd_gather", "grad_reduce"};
    for (int c = 0; c < 24; c++) {
        int nodes = 1 + (int)(zpp_rng_u64(&rng) % 5), S = 1 + (int)(zpp_rng_u64(&rng) % 8);
        int units = 1 + (int)(zpp_rng_u64(&rng) % 12), d = (int)(zpp_rng_u64(&rng) % 3);
        /* log-uniform from 1 to 2^31 parameters */
        size_t params = (size_t)exp(zpp_rng_uniform(&rng) * 31 * log(2.0));
        if (params < 1) params = 1;
        if (c == 0) params = 5, units = 8, nodes = 2, S = 4; /* units < ranks, empty units */
        if (c == 1) params = 1500000000, units = 4, nodes = 1, S = 8; /* qgZ slabs, one node */
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "%s plan --params %zu --units %d --world %d --node-size %d --dtype %s "
                 "--reuse-distance 0 --json",
                 getenv("ZPP_CLI"), params, units, nodes * S, S, dtypes[d]);
        cJSON *o[MAX_LINES];
        int n = run_json(cmd, o, MAX_LINES);
        EXPECT(n == 5, "%s: %d modes", cmd, n);
        for (int m = 0; m < n; m++) {
            const char *mode = str(o[m], "mode");
            EXPECT(!strcmp(mode, names[m]), "%s: mode %d is %s, expected %s", cmd, m, mode,
                   names[m]);
            EXPECT(num(o[m], "nodes") == nodes && num(o[m], "world") == nodes * S);
            plan_expect x = plan_formula(mode, params, units, nodes, S, dsize[d]);
            double ct = 0, it = 0;
            for (int k = 0; k < 3; k++) {
                char key[64];
                snprintf(key, sizeof key, "%s_cross_bytes", phase[k]);
                EXPECT(num(o[m], key) == x.cross[k], "%s\n  %s %s: %.0f, formula %.0f", cmd,
                       mode, key, num(o[m], key), x.cross[k]);
                snprintf(key, sizeof key, "%s_intra_bytes", phase[k]);
                EXPECT(num(o[m], key) == x.intra[k], "%s\n  %s %s: %.0f, formula %.0f", cmd,
                       mode, key, num(o[m], key), x.intra[k]);
                ct += x.cross[k], it += x.intra[k];
            }
            EXPECT(num(o[m], "cross_node_bytes") == ct && num(o[m], "intra_node_bytes") == it,
                   "%s: %s totals %.0f + %.0f, formula %.0f + %.0f", cmd, mode,
                   num(o[m], "cross_node_bytes"), num(o[m], "intra_node_bytes"), ct, it);
            if (nodes == 1) EXPECT(ct == 0);
            cJSON_Delete(o[m]);
        }
    }
}

/* ---- `zeropp plan`'s predictions (DESIGN.md §11) ---------------------------
 * The documented keys of each mode's object, and what ties them together:
 * tokens/s x step = world x tokens per GPU, TFLOP/s x step = the step's FLOPs
 * (6 P + 12 L C T per token), speedup_vs_zero3 = ZeRO-3's step / this one,
 * the step at least its compute. */
#define PLAN_LINES 64

static void test_plan_predict_json(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s plan --model 12,768,1024,50257 --world 32 --node-size 8 --micro-batch 2 "
             "--inter-gbps 100 --json",
             getenv("ZPP_CLI"));
    cJSON *o[MAX_LINES];
    int n = run_json(cmd, o, MAX_LINES);
    EXPECT(n == 5, "%d modes", n);
    const double L = 12, C = 768, T = 1024, V = 50257, tokens = 2 * T;
    const double P = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
    const double flops = tokens * (6 * P + 12 * L * C * T);
    double z3 = n ? num(o[0], "step_s") : 0;
    for (int m = 0; m < n; m++) {
        double step = num(o[m], "step_s");
        EXPECT(step > 0 && step >= num(o[m], "compute_s"), "%s: step %g", str(o[m], "mode"), step);
        EXPECT(fabs(num(o[m], "tokens_per_s") * step - 32 * tokens) <= 1e-9 * 32 * tokens,
               "%s: tokens/s", str(o[m], "mode"));
        EXPECT(fabs(num(o[m], "tflops_per_gpu") * 1e12 * step - flops) <= 1e-9 * flops,
               "%s: TFLOP/s %g", str(o[m], "mode"), num(o[m], "tflops_per_gpu"));
        EXPECT(fabs(num(o[m], "speedup_vs_zero3") - z3 / step) <= 1e-12 * z3 / step,
               "%s: speedup", str(o[m], "mode"));
        EXPECT(num(o[m], "mem_bytes_per_rank") > 18 * P / 32, "%s: memory below the shards",
               str(o[m], "mode"));
        cJSON_Delete(o[m]);
    }
}

/* `--pick --json`: the choice fits the budget and has at least the tokens/s
 * of the runner-up and of ZeRO-3's best; the best at the choice's own
 * micro-batch, priced again by `plan --json`, is no faster. */
static void test_plan_pick_json(void) {
    char cmd[1024];
    const char *shape = "--model 12,768,1024,50257 --world 32 --node-size 8 --inter-gbps 50";
    snprintf(cmd, sizeof cmd, "%s plan %s --pick --mem-gb 6 --json", getenv("ZPP_CLI"), shape);
    cJSON *o[MAX_LINES];
    int n = run_json(cmd, o, MAX_LINES);
    EXPECT(n == 1, "%d objects", n);
    if (n != 1) return;
    EXPECT(!strcmp(str(o[0], "plan"), "pick"), "plan");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o[0], "choice");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o[0], "runner_up");
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(o[0], "zero3");
    EXPECT(cJSON_IsObject(c) && cJSON_IsObject(u) && cJSON_IsObject(z), "choice, runner-up, zero3");
    EXPECT(num(c, "mem_bytes_per_rank") <= 6 * 1073741824.0, "over the budget");
    EXPECT(num(c, "tokens_per_s") >= num(u, "tokens_per_s") &&
               num(c, "tokens_per_s") >= num(z, "tokens_per_s"),
           "the choice is slower than another setting");
    EXPECT(strlen(str(o[0], "reason")) > 10, "no reason");
    int mb = (int)num(c, "micro_batch");
    snprintf(cmd, sizeof cmd, "%s plan %s --micro-batch %d --json", getenv("ZPP_CLI"), shape, mb);
    cJSON *p[MAX_LINES];
    int k = run_json(cmd, p, MAX_LINES);
    for (int m = 0; m < k; m++) {
        if (num(p[m], "mem_bytes_per_rank") <= 6 * 1073741824.0)
            EXPECT(num(p[m], "tokens_per_s") <= num(c, "tokens_per_s") * (1 + 1e-12),
                   "%s at micro-batch %d beats the pick", str(p[m], "mode"), mb);
        cJSON_Delete(p[m]);
    }
    cJSON_Delete(o[0]);
}

/* `--pick` restricted (--modes, --micro-batches, --hpz-sizes): the choice is
 * one of the allowed settings and at least as fast as each of them priced
 * by `plan --json`; bad lists and restrictions without --pick exit 2. */
static void test_plan_pick_restricted(void) {
    char cmd[1024];
    const char *shape = "--model 12,768,1024,50257 --world 32 --node-size 8 --inter-gbps 50";
    snprintf(cmd, sizeof cmd,
             "%s plan %s --pick --modes hpz,qgz --micro-batches 1,4 --hpz-sizes 8 --mem-gb 1000 "
             "--json",
             getenv("ZPP_CLI"), shape);
    cJSON *o[MAX_LINES];
    int n = run_json(cmd, o, MAX_LINES);
    EXPECT(n == 1, "%d objects", n);
    if (n != 1) return;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o[0], "choice");
    const char *mode = str(c, "mode");
    int mb = (int)num(c, "micro_batch");
    EXPECT((!strcmp(mode, "hpz") || !strcmp(mode, "qgz")) && (mb == 1 || mb == 4) &&
               ((int)num(c, "hpz_partition_size") == (strcmp(mode, "hpz") ? 0 : 8)),
           "picked %s at micro-batch %d, hpZ %g", mode, mb, num(c, "hpz_partition_size"));
    EXPECT(num(o[0], "candidates") == 4, "%g candidates, want 4", num(o[0], "candidates"));
    for (int b = 1; b <= 4; b *= 4) {
        snprintf(cmd, sizeof cmd, "%s plan %s --micro-batch %d --json", getenv("ZPP_CLI"), shape, b);
        cJSON *p[MAX_LINES];
        int k = run_json(cmd, p, MAX_LINES);
        for (int m = 0; m < k; m++) {
            if (!strcmp(str(p[m], "mode"), "hpz") || !strcmp(str(p[m], "mode"), "qgz"))
                EXPECT(num(p[m], "tokens_per_s") <= num(c, "tokens_per_s") * (1 + 1e-12),
                       "%s at micro-batch %d beats the pick", str(p[m], "mode"), b);
            cJSON_Delete(p[m]);
        }
    }
    cJSON_Delete(o[0]);
    const char *bad[] = {"--pick --modes zero3,nope", "--pick --micro-batches 4,2",
                         "--pick --micro-batches 0", "--pick --hpz-sizes 3", "--modes zero3",
                         "--pick --micro-batches 1,2 --micro-batch 2", "--pick --hbm-eff 2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s plan %s %s >/dev/null 2>&1", getenv("ZPP_CLI"), shape,
                 bad[i]);
        int rc = system(cmd);
        EXPECT(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "'%s': exit %d, want 2", bad[i],
               WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
    }
}

/* `--sweep`: one object per point and mode, the points doubling; over the
 * cross-node rate no mode gets slower; ZeRO-3's speedup is 1. A malformed
 * sweep is refused (exit 2). */
static const char *const sweep_shape = "--model 12,768,1024,50257 --node-size 8 --micro-batch 1";

static void test_plan_sweep(void) {
    char cmd[1024];
    const char *shape = sweep_shape;
    snprintf(cmd, sizeof cmd, "%s plan %s --world 32 --sweep inter-gbps=25..800 --json",
             getenv("ZPP_CLI"), shape);
    cJSON *o[PLAN_LINES];
    int n = run_json(cmd, o, PLAN_LINES);
    EXPECT(n == 6 * 5, "%d objects, want 6 points x 5 modes", n);
    for (int i = 0; i < n; i++) {
        EXPECT(num(o[i], "x") == 25.0 * (1 << (i / 5)), "point %d: x %g", i, num(o[i], "x"));
        if (i % 5 == 0) EXPECT(num(o[i], "speedup_vs_zero3") == 1, "zero3's speedup");
        if (i >= 5)
            EXPECT(num(o[i], "step_s") <= num(o[i - 5], "step_s") * (1 + 1e-12),
                   "%s slower at %g Gb/s", str(o[i], "mode"), num(o[i], "x"));
    }
    for (int i = 0; i < n; i++) cJSON_Delete(o[i]);
    snprintf(cmd, sizeof cmd, "%s plan %s --world 64 --sweep world=64..16384 --json",
             getenv("ZPP_CLI"), shape);
    n = run_json(cmd, o, PLAN_LINES);
    EXPECT(n == 9 * 5, "%d objects, want 9 points x 5 modes", n);
    for (int i = 0; i < n; i++) {
        EXPECT(num(o[i], "world") == 64.0 * (1 << (i / 5)), "point %d: world", i);
        cJSON_Delete(o[i]);
    }
    const char *bad[] = {"world=10..100", "world=0..64", "gpus=64..128", "world=128..64",
                         "inter-gbps=25..x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s plan %s --world 64 --sweep %s >/dev/null 2>&1",
                 getenv("ZPP_CLI"), shape, bad[i]);
        int rc = system(cmd);
        EXPECT(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "--sweep %s: status %d", bad[i], rc);
    }
}

/* `--sweep ... --chart FILE` draws the sweep with gnuplot: a PNG. */
static void test_plan_sweep_chart(void) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        zpp_test_skip("gnuplot is not installed, so `zeropp plan --chart` cannot draw; install "
                      "it (scripts/install-deps.sh, or apt-get install gnuplot-nox)");
    char cmd[1024];
    const char *shape = sweep_shape;
    char png[] = "/tmp/zpp_test_sweep_XXXXXX";
    int fd = mkstemp(png);
    EXPECT(fd >= 0, "mkstemp");
    close(fd);
    snprintf(cmd, sizeof cmd, "%s plan %s --world 64 --sweep world=64..1024 --chart %s >/dev/null",
             getenv("ZPP_CLI"), shape, png);
    EXPECT(system(cmd) == 0, "%s failed", cmd);
    FILE *f = fopen(png, "rb");
    unsigned char magic[8] = {0};
    EXPECT(f && fread(magic, 1, 8, f) == 8 && !memcmp(magic, "\x89PNG\r\n\x1a\n", 8),
           "%s is not a PNG", png);
    if (f) fclose(f);
    unlink(png);
}

/* `zeropp ARGS`: the exit code, stdout and stderr in files. */
static int run_cli_files(const char *args, const char *out, const char *err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", getenv("ZPP_CLI"), args, out, err);
    int rc = system(cmd);
    EXPECT(rc != -1 && WIFEXITED(rc), "%s", cmd);
    return WEXITSTATUS(rc);
}

/* help, --version and bench's usage exit 0 and say what was asked; an
 * unknown command, benchmark or top-level option exits 2 naming the one
 * meant. --version lists the backends and CPU paths compiled in. */
static void test_cli_help_version(void) {
    char out[512], err[512];
    zpp_test_tmp_path("cli_out.txt", out);
    zpp_test_tmp_path("cli_err.txt", err);
    const struct {
        const char *args;
        int code;
        const char *in_out, *in_err;
    } cases[] = {
        {"help", 0, "zeropp help [COMMAND]", NULL},
        {"--help", 0, "usage:", NULL},
        {"help train", 0, "--resume DIR", NULL},
        {"help eval", 0, "--split val", NULL},
        {"help plan", 0, "usage", NULL},
        {"help bench", 0, "zeropp bench quant", NULL},
        {"help bench quant", 0, "--bits", NULL},
        {"help help", 0, "usage:", NULL},
        {"bench --help", 0, "zeropp bench comm", NULL},
        {"bench -h", 0, "zeropp bench quant", NULL},
        {"eval --help", 0, "zeropp eval DIR", NULL},
        {"--version", 0, "communication: MPI", NULL},
        {"bench", 2, NULL, "name a benchmark"},
        {"bench qaunt", 2, NULL, "did you mean 'quant'?"},
        {"trian", 2, NULL, "did you mean 'train'?"},
        {"help trian", 2, NULL, "did you mean 'train'?"},
        {"--verison", 2, NULL, "did you mean '--version'?"},
        {"", 2, NULL, "usage:"},
        {"plan --parmas 1M --world 2", 2, NULL, "did you mean --params?"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_cli_files(cases[i].args, out, err);
        EXPECT(rc == cases[i].code, "zeropp %s: exit %d, want %d; see %s", cases[i].args, rc,
               cases[i].code, err);
        if (cases[i].in_out)
            EXPECT(zpp_test_count_lines(out, cases[i].in_out) >= 1, "zeropp %s: no '%s' in %s",
                   cases[i].args, cases[i].in_out, out);
        if (cases[i].in_err)
            EXPECT(zpp_test_count_lines(err, cases[i].in_err) >= 1, "zeropp %s: no '%s' in %s",
                   cases[i].args, cases[i].in_err, err);
    }
    EXPECT(run_cli_files("--version", out, err) == 0);
    EXPECT(zpp_test_count_lines(out, "zeropp ") >= 1 && zpp_test_count_lines(out, "compute: host") == 1 &&
               zpp_test_count_lines(out, "CPU kernel paths: generic") == 1 &&
               zpp_test_count_lines(out, "in use: ") == 1,
           "--version lacks a line; see %s", out);
    /* what it says of CUDA is what this build has */
#ifdef ZPP_HAVE_CUDA
    EXPECT(zpp_test_count_lines(out, "architectures") == 1 && zpp_test_count_lines(out, "NCCL") == 1,
           "a CUDA build's --version names no architectures or NCCL; see %s", out);
#else
    EXPECT(zpp_test_count_lines(out, "built without CUDA") == 2, "see %s", out);
#endif
}

/* `zeropp plan --config FILE` reads the "model" section as `zeropp train`
 * does: a random Llama (grouped-query, its own MLP width, untied head or
 * not) has the parameters of its Hugging Face tensors counted here, the
 * FLOPs 6 P + 12 L C T a token, its activations counted; a GPT-2 config
 * the --model count. `--init-from DIR` with the same shape in DIR's
 * config.json (a Llama's T from a --config) plans the same, for a Llama
 * and for a GPT-2. */
static void test_plan_config_family(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(31));
    char path[512], cmd[2048], dir[512], hf[600], tcfg[512];
    zpp_test_tmp_path("plan_llama.json", path);
    zpp_test_tmp_path("plan_hf", dir);
    EXPECT(mkdir(dir, 0777) == 0, "cannot make %s", dir);
    snprintf(hf, sizeof hf, "%s/config.json", dir);
    zpp_test_tmp_path("plan_t.json", tcfg);
    for (int it = 0; it < 4; it++) {
        const int kv = 1 + (int)(zpp_rng_u64(&r) % 4), H = kv * (1 + (int)(zpp_rng_u64(&r) % 4));
        const int hd = 2 * (1 + (int)(zpp_rng_u64(&r) % 32)), C = H * hd;
        const int L = 1 + (int)(zpp_rng_u64(&r) % 8), F = 1 + (int)(zpp_rng_u64(&r) % 3000);
        const int T = 1 + (int)(zpp_rng_u64(&r) % 512), V = 1 + (int)(zpp_rng_u64(&r) % 5000);
        const int untied = it % 2;
        FILE *f = fopen(path, "w");
        EXPECT(f != NULL, "cannot write %s", path);
        fprintf(f, "{\"model\": {\"family\": \"llama\", \"n_layer\": %d, \"n_embd\": %d, "
                   "\"n_head\": %d, \"n_kv_head\": %d, \"n_ffn\": %d, \"seq_len\": %d, "
                   "\"vocab_size\": %d, \"untied_head\": %s}}\n",
                L, C, H, kv, F, T, V, untied ? "true" : "false");
        fclose(f);
        char text[600];
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
                 "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
                 "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"vocab_size\": %d, "
                 "\"max_position_embeddings\": %d, \"tie_word_embeddings\": %s}\n",
                 C, F, L, H, kv, V, T, untied ? "false" : "true");
        zpp_test_write_file(hf, text, strlen(text));
        snprintf(text, sizeof text, "{\"model\": {\"seq_len\": %d}}\n", T);
        zpp_test_write_file(tcfg, text, strlen(text));
        snprintf(cmd, sizeof cmd, "%s plan --config %s --world 4 --micro-batch 2 --json",
                 getenv("ZPP_CLI"), path);
        cJSON *o[MAX_LINES], *h[MAX_LINES];
        int n = run_json(cmd, o, MAX_LINES);
        EXPECT(n == 5, "%d modes", n);
        snprintf(cmd, sizeof cmd,
                 "%s plan --init-from %s --config %s --world 4 --micro-batch 2 --json",
                 getenv("ZPP_CLI"), dir, tcfg);
        EXPECT(run_json(cmd, h, MAX_LINES) == n, "--init-from: not %d modes", n);
        const double dC = C, dkv = (double)kv * hd;
        const double layer = 2 * dC + dC * dC + 2 * dkv * dC + dC * dC + 3 * dC * F;
        const double P = (double)V * C + dC + (untied ? (double)V * C : 0) + L * layer;
        const double flops = 2.0 * T * (6 * P + 12.0 * L * C * T);
        for (int m = 0; m < n; m++) {
            EXPECT(num(o[m], "params") == P, "it %d: params %.0f, HF tensors %.0f", it,
                   num(o[m], "params"), P);
            EXPECT(!strcmp(str(o[m], "family"), "llama"), "family %s", str(o[m], "family"));
            EXPECT(num(o[m], "units") == L + 1, "units %.0f", num(o[m], "units"));
            EXPECT(truth(o[m], "mem_acts_known") && num(o[m], "mem_acts_bytes") > 0);
            double step = num(o[m], "step_s");
            EXPECT(fabs(num(o[m], "tflops_per_gpu") * 1e12 * step - flops) <= 1e-9 * flops,
                   "it %d: TFLOP/s", it);
            EXPECT(cJSON_Compare(o[m], h[m], 1), "it %d: --init-from plans mode %d otherwise",
                   it, m);
            cJSON_Delete(o[m]), cJSON_Delete(h[m]);
        }
    }
    /* a GPT-2 folder plans as a --config of its shape (T its n_positions) */
    {
        char text[400], cmd2[2048];
        const int L = 1 + (int)(zpp_rng_u64(&r) % 6), H = 1 + (int)(zpp_rng_u64(&r) % 4);
        const int C = H * 8 * (1 + (int)(zpp_rng_u64(&r) % 16));
        const int T = 8 + (int)(zpp_rng_u64(&r) % 500), V = 1 + (int)(zpp_rng_u64(&r) % 5000);
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
                 "\"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"n_positions\": %d, "
                 "\"vocab_size\": %d}\n",
                 L, H, C, T, V);
        zpp_test_write_file(hf, text, strlen(text));
        snprintf(text, sizeof text,
                 "{\"model\": {\"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, "
                 "\"seq_len\": %d, \"vocab_size\": %d}}\n",
                 L, H, C, T, V);
        zpp_test_write_file(path, text, strlen(text));
        snprintf(cmd, sizeof cmd, "%s plan --init-from %s --world 4 --micro-batch 2 --json",
                 getenv("ZPP_CLI"), dir);
        snprintf(cmd2, sizeof cmd2, "%s plan --config %s --world 4 --micro-batch 2 --json",
                 getenv("ZPP_CLI"), path);
        cJSON *o[MAX_LINES], *g[MAX_LINES];
        const int n = run_json(cmd, o, MAX_LINES);
        EXPECT(n == 5 && run_json(cmd2, g, MAX_LINES) == n, "%d modes", n);
        for (int m = 0; m < n; m++) {
            EXPECT(!strcmp(str(o[m], "family"), "gpt2") && cJSON_Compare(o[m], g[m], 1),
                   "a GPT-2 folder plans mode %d otherwise than its config's shape", m);
            cJSON_Delete(o[m]), cJSON_Delete(g[m]);
        }
    }
    /* a shape the family refuses, named */
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL);
    fprintf(f, "{\"model\": {\"family\": \"llama\", \"n_head\": 4, \"n_kv_head\": 3}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --world 4 2>&1", getenv("ZPP_CLI"), path);
    FILE *p = popen(cmd, "r");
    char line[1024] = "";
    int named = 0;
    while (fgets(line, sizeof line, p)) named |= strstr(line, "n_kv_head") != NULL;
    int rc = pclose(p);
    EXPECT(WIFEXITED(rc) && WEXITSTATUS(rc) != 0 && named, "a bad n_kv_head: rc %d", rc);
}

ZPP_TESTS(ZPP_TEST(test_bench_comm_acceptance), ZPP_TEST(test_bench_comm_tight_bounds),
          ZPP_TEST(test_bench_quant_json), ZPP_TEST(test_plan_formulas),
          ZPP_TEST(test_plan_all_modes), ZPP_TEST(test_plan_predict_json),
          ZPP_TEST(test_plan_pick_json), ZPP_TEST(test_plan_pick_restricted),
          ZPP_TEST(test_plan_sweep), ZPP_TEST(test_plan_sweep_chart),
          ZPP_TEST(test_cli_help_version), ZPP_TEST(test_plan_config_family))
