/* test_collectives.c — ZeRO-3 baseline, qwZ, hpZ and qgZ collectives and their
 * volume accounting, on the MPI backend.
 *
 * Every rank builds the unit data of EVERY rank with collectives/coll_data.h,
 * a pure function of (run seed, case tag, rank, element index), so each rank
 * holds a single-process reference of what the world as a whole should
 * compute and checks its own results against it. For every node size S dividing the
 * world, unit sizes cover ones not divisible by the world, by 8 or by the
 * quantization block, and units smaller than the world.
 *
 * Error bounds (derived where used):
 *   qwZ  element x in block b of its owner's shard, step = absmax_b / 127:
 *        round-to-nearest leaves |deq - x| <= step / 2; fp32 arithmetic in
 *        x * (127 / absmax) and q * scale adds a few ulps of absmax, covered by
 *        a 1e-3 relative margin on the half step; a bf16 output adds its own
 *        rounding, half an ulp: at most 2^-8 of the value (8 significant bits).
 *   qgZ  see check_qgz.
 *   baseline reduce, fp32: the backend sums W values in some order,
 *        |fl(sum) - sum| <= (W-1) u sum|x_r| (u = 2^-24, to first order), then
 *        fl(1/W) and the product add 2u relative.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_data.h"
#include "collectives/collectives.h"
#include "collectives/qgz_bound.h"
#include "comm/comm.h"
#include "core/dtype.h"
#include "core/random.h"
#include "testlib.h"

/* ---- Deterministic data -----------------------------------------------------
 * The generator is shared with `zeropp bench comm`; the case tag is its unit. */

static uint64_t data_seed(void) { return zpp_test_seed(7); }

/* ---- Topologies -------------------------------------------------------------- */

static int world_size(void) {
    zpp_topo_opts o;
    memset(&o, 0, sizeof o);
    o.backend = ZPP_BACKEND_MPI;
    o.node_size = 1;
    zpp_topo *t;
    EXPECT_OK(zpp_topo_create_with_opts(&o, &t));
    int w = t->world_size;
    zpp_topo_destroy(t);
    return w;
}

/* The rank's host device, made once: the collectives' kernels and scratch. */
static zpp_device *host_dev(void) {
    static zpp_device *d;
    if (!d) EXPECT_OK(zpp_device_create_host(&d));
    return d;
}

static zpp_topo *topo_make(int node_size) {
    zpp_topo_opts o;
    memset(&o, 0, sizeof o);
    o.backend = ZPP_BACKEND_MPI;
    o.node_size = node_size;
    zpp_topo *t;
    EXPECT_OK(zpp_topo_create_with_opts(&o, &t));
    EXPECT(t->nodes * t->node_size == t->world_size, "failed");
    return t;
}

/* Unit sizes: smaller than the world, not divisible by it, by 8, by the
 * blocks (256 for int8, 128 for int4), and shards spanning several blocks. */
static int unit_sizes(int W, size_t *out) {
    int n = 0;
    out[n++] = 1;
    if (W > 2) out[n++] = (size_t)W - 1;
    out[n++] = (size_t)W + 1;
    out[n++] = 7;
    out[n++] = 8 * (size_t)W + 3;
    out[n++] = 129 * (size_t)W + 1;
    out[n++] = 300 * (size_t)W - 1;
    out[n++] = 700 * (size_t)W + 5;
    return n;
}

/* ---- Independent volume formulas (DESIGN.md §5) --------------------------------
 * Written from the definitions, not through the library's formula code. */

static size_t round16(size_t x) { return (x + 15) / 16 * 16; }

/* The wire size of n quantized elements (zeropp.h): payload padded to 16,
 * one fp32 scale per block, total padded to 16. */
static size_t wire_bytes(size_t n, int bits, size_t block) {
    size_t payload = bits == 8 ? n : (n + 1) / 2;
    return round16(round16(payload) + 4 * ((n + block - 1) / block));
}

typedef struct expect_vol {
    double cross, intra, payload;
    uint64_t calls;
} expect_vol;

/* World all-gather or reduce-scatter of a full buffer of P bytes over N
 * nodes of S ranks: cross (N-1)/N P, intra S ranks * (S-1)/S P. */
static expect_vol world_collective(double P, int N, int S, double payload) {
    expect_vol e = {(double)(N - 1) * P / N, (double)(S - 1) * P, payload, 1};
    return e;
}

static void expect_phase(const zpp_volume *v, zpp_phase ph, expect_vol e, const char *what) {
    EXPECT(v->cross_node_bytes[ph] == e.cross, "%s %s: cross %.0f, expected %.0f", what,
           zpp_phase_name(ph), v->cross_node_bytes[ph], e.cross);
    EXPECT(v->intra_node_bytes[ph] == e.intra, "%s %s: intra %.0f, expected %.0f", what,
           zpp_phase_name(ph), v->intra_node_bytes[ph], e.intra);
    EXPECT(v->payload_bytes[ph] == e.payload, "%s %s: payload %.0f, expected %.0f", what,
           zpp_phase_name(ph), v->payload_bytes[ph], e.payload);
    EXPECT(v->calls[ph] == e.calls, "%s %s: %llu calls, expected %llu", what,
           zpp_phase_name(ph), (unsigned long long)v->calls[ph], (unsigned long long)e.calls);
}

/* ---- Unit fixtures ------------------------------------------------------------ */

typedef struct unit_case {
    zpp_partition p;
    zpp_dtype dt;
    size_t ds;
    float *ref;     /* padded reference weights, fp32 values of dt */
    void *shard;    /* this rank's shard, in dt */
    void *full;     /* gather output, padded elements of dt */
} unit_case;

static unit_case unit_make(const zpp_topo *t, size_t numel, zpp_dtype dt, uint64_t tag) {
    unit_case u;
    u.p = zpp_partition_make(numel, t);
    u.dt = dt;
    u.ds = zpp_dtype_size(dt);
    u.ref = zpp_test_malloc(u.p.padded * sizeof(float));
    u.shard = zpp_test_malloc(u.p.shard_len * u.ds);
    u.full = zpp_test_malloc(u.p.padded * u.ds);
    for (size_t i = 0; i < u.p.padded; i++) u.ref[i] = zpp_coll_data_weight(data_seed(), tag, i, numel, dt);
    size_t base = (size_t)t->world_rank * u.p.shard_len;
    for (size_t j = 0; j < u.p.shard_len; j++) zpp_store_f32(u.shard, dt, j, u.ref[base + j]);
    memset(u.full, 0x7f, u.p.padded * u.ds); /* garbage: the gather must write all */
    return u;
}

static void unit_free(unit_case *u) {
    free(u->ref);
    free(u->shard);
    free(u->full);
}

static void gather(zpp_coll *c, unit_case *u, zpp_gather_mode m, void *secondary,
                   zpp_phase ph) {
    zpp_coll_op *op;
    EXPECT_OK(zpp_coll_gather_start(c, &u->p, m, u->dt, u->shard, u->full, secondary, ph, &op));
    EXPECT_OK(zpp_coll_finish(c, op));
}

/* qwZ: every element within half a quantization step of its owner's block. */
static void check_qwz(const unit_case *u, size_t block, int stochastic, const char *what) {
    size_t n = u->p.shard_len;
    for (size_t i = 0; i < u->p.padded; i++) {
        size_t r = i / n, j = i % n, b0 = r * n + j / block * block;
        size_t b1 = b0 + block < (r + 1) * n ? b0 + block : (r + 1) * n;
        double amax = 0;
        for (size_t k = b0; k < b1; k++) amax = fmax(amax, fabs(u->ref[k]));
        double step = amax / 127.0;
        /* Stochastic rounding moves an element to either neighbour: < 1 step. */
        double bound = (stochastic ? 1.0 : 0.5) * step * (1 + 1e-3);
        double got = zpp_load_f32(u->full, u->dt, i);
        if (u->dt == ZPP_BF16) bound = bound * (1 + 0x1p-8) + 0x1p-8 * fabs(u->ref[i]);
        EXPECT(fabs(got - u->ref[i]) <= bound, "%s: element %zu of %zu: got %.9g want %.9g, "
               "bound %.3g", what, i, u->p.numel, got, u->ref[i], bound);
        if (i >= u->p.numel) EXPECT(got == 0.0, "%s: padding %zu became %g", what, i, got);
    }
}

/* ---- Tests --------------------------------------------------------------------- */

static void test_partition_and_modes(void) {
    zpp_partition p = zpp_partition_make_shape(10, 4, 2);
    EXPECT(p.shard_len == 3 && p.padded == 12 && p.sec_len == 6, "failed");
    p = zpp_partition_make_shape(3, 8, 2); /* tiny: 1 element per rank, padded */
    EXPECT(p.shard_len == 1 && p.padded == 8 && p.sec_len == 2, "failed");
    p = zpp_partition_make_shape(0, 8, 4);
    EXPECT(p.shard_len == 0 && p.padded == 0 && p.sec_len == 0, "failed");
    const zpp_coll_mode *m;
    EXPECT_OK(zpp_coll_mode_parse("zeropp", &m));
    EXPECT(m->gather == ZPP_GATHER_QWZ && m->hpz && m->reduce == ZPP_REDUCE_QGZ, "failed");
    EXPECT_OK(zpp_coll_mode_parse("hpz", &m));
    EXPECT(m->gather == ZPP_GATHER_BASELINE && m->hpz && m->reduce == ZPP_REDUCE_BASELINE, "failed");
    EXPECT_STATUS(zpp_coll_mode_parse("zero4", &m), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "zero4") != NULL, "failed");
    size_t tot = 0;
    for (int i = 0; i < 7; i++) tot += zpp_plan_unit_numel(100, 7, i);
    EXPECT(tot == 100 && zpp_plan_unit_numel(100, 7, 0) == 15 &&
           zpp_plan_unit_numel(100, 7, 6) == 14, "failed");
}

/* Baseline gather is bit-exact; qwZ is within half a step per element. Both
 * are accounted as world all-gathers of what was actually sent. */
static void test_gather_baseline_and_qwz(void) {
    int W = world_size();
    size_t sizes[16];
    int ns = unit_sizes(W, sizes);
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        int N = t->nodes;
        zpp_coll *c;
        EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
        for (int si = 0; si < ns; si++) {
            for (int di = 0; di < 2; di++) {
                zpp_dtype dt = di ? ZPP_FP32 : ZPP_BF16;
                uint64_t tag = zpp_hash64(((uint64_t)S << 32) ^ ((uint64_t)si << 8) ^ (uint64_t)di);
                unit_case u = unit_make(t, sizes[si], dt, tag);
                zpp_coll_volume_reset(c);
                gather(c, &u, ZPP_GATHER_BASELINE, NULL, ZPP_PHASE_FWD_GATHER);
                for (size_t i = 0; i < u.p.padded; i++) {
                    float got = zpp_load_f32(u.full, dt, i);
                    EXPECT(memcmp(&got, &u.ref[i], 4) == 0,
                           "baseline S=%d numel %zu %s: element %zu got %g want %g", S,
                           sizes[si], zpp_dtype_name(dt), i, got, u.ref[i]);
                }
                double P = (double)u.p.padded * u.ds;
                expect_phase(zpp_coll_volume(c), ZPP_PHASE_FWD_GATHER,
                             world_collective(P, N, S, (double)(u.p.shard_len * u.ds)),
                             "baseline gather");

                zpp_coll_volume_reset(c);
                memset(u.full, 0x7f, u.p.padded * u.ds);
                gather(c, &u, ZPP_GATHER_QWZ, NULL, ZPP_PHASE_FWD_GATHER);
                check_qwz(&u, ZPP_QUANT_DEFAULT_BLOCK_INT8, 0, "qwZ");
                double qb = (double)wire_bytes(u.p.shard_len, 8, ZPP_QUANT_DEFAULT_BLOCK_INT8);
                expect_phase(zpp_coll_volume(c), ZPP_PHASE_FWD_GATHER,
                             world_collective(W * qb, N, S, qb), "qwZ gather");
                EXPECT(zpp_coll_volume(c)->calls[ZPP_PHASE_BWD_GATHER] == 0, "failed");
                unit_free(&u);
            }
        }
        zpp_coll_destroy(c);
        zpp_topo_destroy(t);
    }
}

/* hpZ: the forward gather leaves this rank's 1/S slice of the unit; the
 * backward gathers the node's secondaries and must give back exactly what
 * the forward gather produced, without a byte crossing the node boundary. */
static void test_hpz_secondary(void) {
    int W = world_size();
    size_t sizes[16];
    int ns = unit_sizes(W, sizes);
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        zpp_coll *c;
        EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
        for (int si = 0; si < ns; si++) {
            for (int mi = 0; mi < 2; mi++) {
                zpp_gather_mode m = mi ? ZPP_GATHER_QWZ : ZPP_GATHER_BASELINE;
                zpp_dtype dt = mi ? ZPP_BF16 : ZPP_FP32;
                unit_case u = unit_make(t, sizes[si], dt, zpp_hash64(0x5ec ^ ((uint64_t)S << 20) ^
                                                                ((uint64_t)si << 4) ^ (uint64_t)mi));
                EXPECT(u.p.sec_len * (size_t)S == u.p.padded, "failed");
                size_t sb = u.p.sec_len * u.ds;
                void *sec = zpp_test_malloc(sb), *fwd = zpp_test_malloc(u.p.padded * u.ds);
                zpp_coll_volume_reset(c);
                gather(c, &u, m, sec, ZPP_PHASE_FWD_GATHER);
                memcpy(fwd, u.full, u.p.padded * u.ds);
                EXPECT(memcmp(sec, (char *)fwd + (size_t)t->local_rank * sb, sb) == 0,
                       "secondary is not the slice of local rank %d", t->local_rank);
                memset(u.full, 0x55, u.p.padded * u.ds);
                zpp_coll_op *op;
                EXPECT_OK(zpp_coll_gather_secondary_start(c, &u.p, dt, sec, u.full,
                                                          ZPP_PHASE_BWD_GATHER, &op));
                EXPECT_OK(zpp_coll_finish(c, op));
                EXPECT(memcmp(fwd, u.full, u.p.padded * u.ds) == 0,
                       "hpZ S=%d numel %zu mode %d: backward gather differs from forward", S,
                       sizes[si], mi);
                const zpp_volume *v = zpp_coll_volume(c);
                EXPECT(v->cross_node_bytes[ZPP_PHASE_BWD_GATHER] == 0.0,
                       "hpZ backward crossed %.0f bytes", v->cross_node_bytes[ZPP_PHASE_BWD_GATHER]);
                /* intra: each of the S ranks sends (S-1)/S of the unit. */
                expect_vol e = {0, (double)(S - 1) * (double)(u.p.padded * u.ds), (double)sb, 1};
                expect_phase(v, ZPP_PHASE_BWD_GATHER, e, "hpZ backward");
                free(sec);
                free(fwd);
                unit_free(&u);
            }
        }
        zpp_coll_destroy(c);
        zpp_topo_destroy(t);
    }
}

/* ---- Reductions ----------------------------------------------------------------- */

typedef struct grad_case {
    zpp_partition p;
    zpp_dtype dt;
    void *full_grad;  /* this rank's gradient, padded, dt */
    double *exact;    /* exact world average of this rank's shard */
    double *sumabs;   /* sum over ranks of |g_r| on this rank's shard */
    float *out;
} grad_case;

static grad_case grad_make(const zpp_topo *t, size_t numel, zpp_dtype dt, uint64_t tag,
                           int same) {
    grad_case g;
    int W = t->world_size;
    g.p = zpp_partition_make(numel, t);
    g.dt = dt;
    g.full_grad = zpp_test_malloc(g.p.padded * zpp_dtype_size(dt));
    g.exact = zpp_test_malloc(g.p.shard_len * sizeof(double));
    g.sumabs = zpp_test_malloc(g.p.shard_len * sizeof(double));
    g.out = zpp_test_malloc(g.p.shard_len * sizeof(float));
    for (size_t i = 0; i < g.p.padded; i++)
        zpp_store_f32(g.full_grad, dt, i,
                      zpp_coll_data_grad(data_seed(), tag, t->world_rank, i, numel, dt, same));
    size_t base = (size_t)t->world_rank * g.p.shard_len;
    for (size_t j = 0; j < g.p.shard_len; j++) {
        double s = 0, a = 0;
        for (int r = 0; r < W; r++) {
            double x = zpp_coll_data_grad(data_seed(), tag, r, base + j, numel, dt, same);
            s += x;
            a += fabs(x);
        }
        g.exact[j] = s / W;
        g.sumabs[j] = a;
    }
    return g;
}

static void grad_free(grad_case *g) {
    free(g->full_grad);
    free(g->exact);
    free(g->sumabs);
    free(g->out);
}

static void reduce(zpp_coll *c, grad_case *g, zpp_reduce_mode m) {
    zpp_coll_op *op;
    for (size_t j = 0; j < g->p.shard_len; j++) g->out[j] = NAN;
    EXPECT_OK(zpp_coll_reduce_start(c, &g->p, m, g->dt, g->full_grad, g->out, &op));
    EXPECT_OK(zpp_coll_finish(c, op));
}

/* Every element of this rank's shard within qgZ's bound (its derivation:
 * collectives/qgz_bound.h), A_r = max |g_r| over the element's block of
 * rank r's chunk. Returns the largest error / bound seen. */
static double check_qgz(const zpp_topo *t, const grad_case *g, uint64_t tag, int same,
                        const zpp_quant_spec *gs, float *bound_out, const char *what) {
    size_t block = gs->block;
    int W = t->world_size, S = t->node_size, N = t->nodes;
    size_t n = g->p.shard_len, base = (size_t)t->world_rank * n;
    double worst = 0;
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t b1 = b0 + block < n ? b0 + block : n;
        double sumA = 0;
        for (int r = 0; r < W; r++) {
            double A = 0;
            for (size_t k = b0; k < b1; k++)
                A = fmax(A, fabs(zpp_coll_data_grad(data_seed(), tag, r, base + k, g->p.numel,
                                                    g->dt, same)));
            sumA += A;
        }
        double bound = zpp_qgz_error_bound(sumA, W, S, N, gs) + 1e-30;
        for (size_t j = b0; j < b1; j++) {
            double err = fabs((double)g->out[j] - g->exact[j]);
            EXPECT(err <= bound,
                   "%s S=%d numel %zu: element %zu got %.9g want %.9g (bound %.3g)", what, S,
                   g->p.numel, j, g->out[j], g->exact[j], bound);
            if (base + j >= g->p.numel)
                EXPECT(g->out[j] == 0.0f, "padding reduced to %g", g->out[j]);
            if (bound_out) bound_out[j] = (float)bound;
            if (bound > 0 && err / bound > worst) worst = err / bound;
        }
    }
    return worst;
}

/* Baseline reduce: fp32 within fp32 summation rounding of the exact world
 * average; bf16 within bf16 rounding of the partial sums (each of the W-1
 * combinations rounds to bf16: half an ulp, 2^-8 of a partial sum <= sum |g_r|). */
static void test_reduce_baseline(void) {
    int W = world_size();
    size_t sizes[16];
    int ns = unit_sizes(W, sizes);
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        int N = t->nodes;
        zpp_coll *c;
        EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
        for (int si = 0; si < ns; si++) {
            for (int di = 0; di < 2; di++) {
                zpp_dtype dt = di ? ZPP_BF16 : ZPP_FP32;
                grad_case g = grad_make(t, sizes[si], dt, zpp_hash64(0x6ead ^ ((uint64_t)S << 24) ^
                                                                ((uint64_t)si << 4) ^ (uint64_t)di), 0);
                zpp_coll_volume_reset(c);
                reduce(c, &g, ZPP_REDUCE_BASELINE);
                const double u = 0x1p-24;
                for (size_t j = 0; j < g.p.shard_len; j++) {
                    double bound = dt == ZPP_FP32
                                       ? (W - 1) * u * 1.01 * g.sumabs[j] / W + 3 * u * fabs(g.exact[j])
                                       : (W - 1) * 0x1p-8 * g.sumabs[j] / W + 3 * u * fabs(g.exact[j]);
                    EXPECT(fabs(g.out[j] - g.exact[j]) <= bound + 1e-37,
                           "baseline reduce %s S=%d numel %zu: element %zu got %.9g want %.9g",
                           zpp_dtype_name(dt), S, sizes[si], j, g.out[j], g.exact[j]);
                }
                double P = (double)(g.p.padded * zpp_dtype_size(dt));
                expect_phase(zpp_coll_volume(c), ZPP_PHASE_GRAD_REDUCE,
                             world_collective(P, N, S, P), "baseline reduce");
                grad_free(&g);
            }
        }
        zpp_coll_destroy(c);
        zpp_topo_destroy(t);
    }
}

/* Volume of one qgZ reduction: an intra-node all-to-all of N*qg bytes per
 * peer (each rank to S-1 peers, S ranks per node) when S > 1, and an
 * inter-node all-to-all of qg per peer (each rank to N-1 other nodes) when
 * N > 1 — between two nodes run as an all-gather of the one chunk for the
 * other node: the same bytes cross, and the rank hands the backend qg. */
static expect_vol qgz_volume(size_t shard_len, int N, int S, size_t block) {
    double qg = (double)wire_bytes(shard_len, 4, block);
    expect_vol e = {0, 0, 0, 0};
    if (S > 1) {
        e.intra += (double)S * (S - 1) * N * qg;
        e.payload += (double)S * N * qg;
        e.calls++;
    }
    if (N > 1) {
        e.cross += (double)S * (N - 1) * qg;
        e.payload += N == 2 ? qg : (double)N * qg;
        e.calls++;
    }
    return e;
}

/* qgZ within its two-level bound for every node size; the results for
 * different node sizes agree within the sum of their bounds. */
static void test_reduce_qgz(void) {
    int W = world_size();
    size_t sizes[16];
    int ns = unit_sizes(W, sizes);
    for (int si = 0; si < ns; si++) {
        for (int di = 0; di < 2; di++) {
            zpp_dtype dt = di ? ZPP_FP32 : ZPP_BF16;
            uint64_t tag = zpp_hash64(0x9a2 ^ ((uint64_t)si << 4) ^ (uint64_t)di);
            zpp_coll_opts dflt = zpp_coll_opts_default();
            float *first = NULL, *first_bound = NULL;
            int first_S = 0;
            for (int S = 1; S <= W; S++) {
                if (W % S) continue;
                zpp_topo *t = topo_make(S);
                zpp_coll *c;
                EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
                grad_case g = grad_make(t, sizes[si], dt, tag, 0);
                zpp_coll_volume_reset(c);
                reduce(c, &g, ZPP_REDUCE_QGZ);
                float *bound = zpp_test_malloc(g.p.shard_len * sizeof(float));
                check_qgz(t, &g, tag, 0, &dflt.grad_spec, bound, "qgZ");
                expect_phase(zpp_coll_volume(c), ZPP_PHASE_GRAD_REDUCE,
                             qgz_volume(g.p.shard_len, t->nodes, S, ZPP_QUANT_DEFAULT_BLOCK_INT4),
                             "qgZ");
                if (!first) {
                    first = zpp_test_malloc(g.p.shard_len * sizeof(float));
                    memcpy(first, g.out, g.p.shard_len * sizeof(float));
                    first_bound = bound;
                    bound = NULL;
                    first_S = S;
                } else {
                    for (size_t j = 0; j < g.p.shard_len; j++)
                        EXPECT(fabs(g.out[j] - first[j]) <= bound[j] + first_bound[j],
                               "qgZ S=%d vs S=%d differ at %zu: %g vs %g", S, first_S, j,
                               g.out[j], first[j]);
                }
                free(bound);
                grad_free(&g);
                zpp_coll_destroy(c);
                zpp_topo_destroy(t);
            }
            free(first);
            free(first_bound);
        }
    }
}

/* A rank's own contribution never crosses a wire, so qgZ adds it
 * unquantized: when every rank's gradient is zero outside its own chunk,
 * each rank's shard is its own chunk times 1/W, exactly (the other ranks'
 * zero blocks dequantize to +0), at every node size, in fp32 and bf16 and
 * with stochastic rounding. Quantizing the own chunk would miss by up to
 * half an int4 step of its block. */
static void test_qgz_own_exact(void) {
    int W = world_size();
    size_t sizes[16];
    int ns = unit_sizes(W, sizes);
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        for (int stoch = 0; stoch < 2; stoch++) {
            zpp_coll_opts o = zpp_coll_opts_default();
            o.grad_spec.stochastic = stoch;
            zpp_coll *c;
            EXPECT_OK(zpp_coll_create(t, &o, host_dev(), &c));
            for (int si = 0; si < ns; si++)
                for (int di = 0; di < 2; di++) {
                    const zpp_dtype dt = di ? ZPP_BF16 : ZPP_FP32;
                    grad_case g = grad_make(t, sizes[si], dt, 0x0e0 + (uint64_t)(si * 2 + di), 0);
                    const size_t n = g.p.shard_len, own = (size_t)t->world_rank * n;
                    for (size_t i = 0; i < g.p.padded; i++)
                        if (i < own || i >= own + n) zpp_store_f32(g.full_grad, dt, i, 0.0f);
                    reduce(c, &g, ZPP_REDUCE_QGZ);
                    const float inv_w = 1.0f / (float)W;
                    for (size_t j = 0; j < n; j++) {
                        const float want = inv_w * zpp_load_f32(g.full_grad, dt, own + j);
                        EXPECT(g.out[j] == want,
                               "S=%d %s numel %zu stochastic %d: element %zu is %.9g, not its "
                               "own %.9g",
                               S, zpp_dtype_name(dt), sizes[si], stoch, j, g.out[j], want);
                    }
                    grad_free(&g);
                }
            zpp_coll_destroy(c);
        }
        zpp_topo_destroy(t);
    }
}

/* The average is over the WORLD: if every rank contributes the same g, the
 * result is g (within the quantization bound), not g*S (summed over the
 * node but divided by the node count) nor g*N. At the block's largest
 * element |g| = A, a result of 2g already misses by A, beyond the bound
 * levels * A / 14 <= A / 7. */
static void test_qgz_world_average(void) {
    int W = world_size();
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        zpp_coll *c;
        EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
        uint64_t tag = zpp_hash64(0xa7e ^ (uint64_t)S);
        grad_case g = grad_make(t, 512 * (size_t)W + 3, ZPP_BF16, tag, 1);
        reduce(c, &g, ZPP_REDUCE_QGZ);
        zpp_coll_opts dflt = zpp_coll_opts_default();
        check_qgz(t, &g, tag, 1, &dflt.grad_spec, NULL, "qgZ same-gradient");
        double amax_out = 0, amax_in = 0;
        for (size_t j = 0; j < g.p.shard_len; j++) {
            amax_out = fmax(amax_out, fabs(g.out[j]));
            amax_in = fmax(amax_in, fabs(g.exact[j]));
        }
        EXPECT(fabs(amax_out - amax_in) <= amax_in / 7,
               "S=%d: largest averaged gradient %g, the gradient's is %g", S, amax_out, amax_in);
        grad_free(&g);
        zpp_coll_destroy(c);
        zpp_topo_destroy(t);
    }
}

/* Stochastic rounding and small blocks: bounds of a full step. */
static void test_stochastic_small_blocks(void) {
    int W = world_size();
    int S = W % 2 == 0 ? 2 : 1;
    zpp_topo *t = topo_make(S);
    zpp_coll_opts o = zpp_coll_opts_default();
    o.weight_spec.block = 64;
    o.weight_spec.stochastic = 1;
    o.weight_spec.seed = zpp_test_seed(11);
    o.grad_spec.block = 32;
    o.grad_spec.stochastic = 1;
    o.grad_spec.seed = zpp_test_seed(12);
    zpp_coll *c;
    EXPECT_OK(zpp_coll_create(t, &o, host_dev(), &c));
    size_t numel = 97 * (size_t)W + 5;
    unit_case u = unit_make(t, numel, ZPP_BF16, 0x57);
    gather(c, &u, ZPP_GATHER_QWZ, NULL, ZPP_PHASE_FWD_GATHER);
    check_qwz(&u, 64, 1, "qwZ stochastic");
    double qb = (double)wire_bytes(u.p.shard_len, 8, 64);
    expect_phase(zpp_coll_volume(c), ZPP_PHASE_FWD_GATHER,
                 world_collective(W * qb, t->nodes, S, qb), "qwZ block 64");
    grad_case g = grad_make(t, numel, ZPP_BF16, 0x58, 0);
    zpp_coll_volume_reset(c);
    reduce(c, &g, ZPP_REDUCE_QGZ);
    check_qgz(t, &g, 0x58, 0, &o.grad_spec, NULL, "qgZ stochastic");
    expect_phase(zpp_coll_volume(c), ZPP_PHASE_GRAD_REDUCE,
                 qgz_volume(g.p.shard_len, t->nodes, S, 32), "qgZ block 32");
    grad_free(&g);
    unit_free(&u);
    zpp_coll_destroy(c);
    zpp_topo_destroy(t);
}

/* The slabs of qgZ's pipeline, from the definition in collectives.h: a
 * length of at least `want` (0: one slab across nodes, else ceil(n / 8) and
 * at least 2^22), raised to ceil(n / 16), rounded up to 4 * block; one slab
 * when that covers n. */
static size_t expect_slabs(size_t n, int nodes, size_t want, size_t block, size_t *slab_p) {
    if (want == 0 && nodes > 1) want = SIZE_MAX;
    if (want == 0) want = (n + 7) / 8 > ((size_t)1 << 22) ? (n + 7) / 8 : (size_t)1 << 22;
    if (want < (n + 15) / 16) want = (n + 15) / 16;
    size_t slab = (want + 4 * block - 1) / (4 * block) * (4 * block);
    if (want >= n || slab >= n) slab = n;
    *slab_p = slab;
    return slab ? (n + slab - 1) / slab : 1;
}

static void test_qgz_slab_sizes(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(31));
    for (int i = 0; i < 2000; i++) {
        zpp_coll_opts o = zpp_coll_opts_default();
        o.grad_spec.block = 8 * (1 + zpp_rng_u64(&r) % 64);
        size_t n = zpp_rng_u64(&r) % ((i % 4 == 0) ? ((size_t)1 << 30) : 100000);
        o.grad_slab = i % 3 == 0 ? 0 : zpp_rng_u64(&r) % (n + 2);
        int nodes = 1 + (int)(zpp_rng_u64(&r) % 2);
        size_t slab = 0, want_slab = 0;
        int k = zpp_qgz_slabs(n, nodes, &o, &slab);
        size_t want_k = expect_slabs(n, nodes, o.grad_slab, o.grad_spec.block, &want_slab);
        EXPECT((size_t)k == want_k && slab == want_slab,
               "n %zu slab %zu block %zu: %d slabs of %zu, expected %zu of %zu", n, o.grad_slab,
               o.grad_spec.block, k, slab, want_k, want_slab);
        /* what the pipeline relies on: the slabs tile [0, n), at most 16,
         * and all but the last start and end on 16-byte words */
        EXPECT(k >= 1 && k <= ZPP_QGZ_MAX_SLABS, "%d slabs", k);
        EXPECT(n == 0 || ((size_t)(k - 1) * slab < n && n <= (size_t)k * slab),
               "%d slabs of %zu do not tile %zu", k, slab, n);
        if (k > 1) {
            EXPECT(slab % (4 * o.grad_spec.block) == 0, "slab %zu, block %zu", slab,
                   o.grad_spec.block);
            zpp_quant_spec q = o.grad_spec;
            EXPECT(zpp_quant_bytes(slab, &q) * (size_t)(k - 1) +
                           zpp_quant_bytes(n - (size_t)(k - 1) * slab, &q) ==
                       zpp_quant_bytes(n, &q),
                   "n %zu: the slabs' wire bytes differ from the whole's", n);
        }
        if (o.grad_slab == 0 && k > 1)
            EXPECT(nodes == 1 && k <= ZPP_QGZ_AUTO_SLABS && slab >= ZPP_QGZ_AUTO_MIN,
                   "auto: %d of %zu over %d nodes", k, slab, nodes);
    }
}

/* Cutting qgZ into slabs changes no bit of the result, with round-to-nearest
 * and with stochastic rounding, in E2M1 and int4, for every node size; the
 * wire bytes are the same, in one call per slab and exchange. */
static void test_qgz_slabs_change_no_bit(void) {
    int W = world_size();
    static const size_t blocks[] = {32, 128};
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        for (int bi = 0; bi < 2; bi++)
            for (int stoch = 0; stoch < 2; stoch++) {
                zpp_coll_opts whole = zpp_coll_opts_default();
                /* both 4-bit formats: E2M1 (the default) with block 32 */
                whole.grad_spec.format = bi ? ZPP_QUANT_INT : ZPP_QUANT_E2M1;
                whole.grad_spec.block = blocks[bi];
                whole.grad_spec.stochastic = stoch;
                whole.grad_spec.seed = zpp_test_seed(40);
                whole.grad_slab = SIZE_MAX;
                zpp_coll_opts cut = whole;
                cut.grad_slab = 1 + (size_t)(stoch * 3 + bi) * blocks[bi];
                zpp_coll *c1, *c2;
                EXPECT_OK(zpp_coll_create(t, &whole, host_dev(), &c1));
                EXPECT_OK(zpp_coll_create(t, &cut, host_dev(), &c2));
                size_t sizes[] = {7, 20 * blocks[bi] * (size_t)W + 5, 9 * blocks[bi] * (size_t)W};
                for (int si = 0; si < 3; si++) {
                    uint64_t tag = zpp_hash64(0x51ab ^ ((uint64_t)S << 8) ^ ((uint64_t)si << 4) ^
                                              ((uint64_t)bi << 2) ^ (uint64_t)stoch);
                    grad_case g1 = grad_make(t, sizes[si], ZPP_BF16, tag, 0);
                    grad_case g2 = grad_make(t, sizes[si], ZPP_BF16, tag, 0);
                    zpp_coll_volume_reset(c1);
                    zpp_coll_volume_reset(c2);
                    reduce(c1, &g1, ZPP_REDUCE_QGZ);
                    reduce(c2, &g2, ZPP_REDUCE_QGZ);
                    size_t n = g1.p.shard_len, slab;
                    size_t k = expect_slabs(n, t->nodes, cut.grad_slab, blocks[bi], &slab);
                    EXPECT(sizes[si] < 100 || k > 1, "S=%d n %zu: only one slab", S, n);
                    EXPECT(memcmp(g1.out, g2.out, n * sizeof(float)) == 0,
                           "S=%d block %zu stochastic %d numel %zu: %zu slabs of %zu changed "
                           "the result",
                           S, blocks[bi], stoch, sizes[si], k, slab);
                    check_qgz(t, &g2, tag, 0, &whole.grad_spec, NULL, "qgZ in slabs");
                    expect_vol e = qgz_volume(n, t->nodes, S, blocks[bi]);
                    e.calls *= k;
                    expect_phase(zpp_coll_volume(c2), ZPP_PHASE_GRAD_REDUCE, e, "qgZ in slabs");
                    grad_free(&g1);
                    grad_free(&g2);
                }
                zpp_coll_destroy(c1);
                zpp_coll_destroy(c2);
            }
        zpp_topo_destroy(t);
    }
}

/* Three operations in flight at once (a gather in use, a prefetch, a
 * reduce), finished out of start order; results as when run alone; once the
 * pool has seen each finish order, repeating them does not grow it. */
static void test_in_flight_and_pool(void) {
    int W = world_size();
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        zpp_coll *c;
        EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
        size_t nb0 = 0, bytes0 = 0;
        for (int round = 0; round < 6; round++) {
            unit_case a = unit_make(t, 333 * (size_t)W + 1, ZPP_BF16, 0x100 + (uint64_t)round);
            unit_case b = unit_make(t, 41 * (size_t)W + 7, ZPP_BF16, 0x200 + (uint64_t)round);
            void *sec = zpp_test_malloc(a.p.sec_len * a.ds);
            grad_case g = grad_make(t, 250 * (size_t)W + 9, ZPP_BF16, 0x300 + (uint64_t)round, 0);
            zpp_coll_op *oa, *ob, *og;
            EXPECT_OK(zpp_coll_gather_start(c, &a.p, ZPP_GATHER_QWZ, ZPP_BF16, a.shard, a.full,
                                            sec, ZPP_PHASE_FWD_GATHER, &oa));
            EXPECT_OK(zpp_coll_gather_start(c, &b.p, ZPP_GATHER_BASELINE, ZPP_BF16, b.shard,
                                            b.full, NULL, ZPP_PHASE_FWD_GATHER, &ob));
            EXPECT_OK(zpp_coll_reduce_start(c, &g.p, ZPP_REDUCE_QGZ, ZPP_BF16, g.full_grad, g.out,
                                            &og));
            /* finish order varies per round; every rank uses the same */
            zpp_coll_op *ops[3] = {oa, ob, og};
            int order[3][3] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}};
            for (int k = 0; k < 3; k++) EXPECT_OK(zpp_coll_finish(c, ops[order[round % 3][k]]));
            check_qwz(&a, ZPP_QUANT_DEFAULT_BLOCK_INT8, 0, "qwZ in flight");
            EXPECT(memcmp(sec, (char *)a.full + (size_t)t->local_rank * a.p.sec_len * a.ds,
                          a.p.sec_len * a.ds) == 0, "failed");
            for (size_t i = 0; i < b.p.padded; i++)
                EXPECT(zpp_load_f32(b.full, ZPP_BF16, i) == b.ref[i], "baseline in flight %zu", i);
            zpp_coll_opts dflt = zpp_coll_opts_default();
            check_qgz(t, &g, 0x300 + (uint64_t)round, 0, &dflt.grad_spec, NULL,
                      "qgZ in flight");
            size_t nb, bytes;
            zpp_device_scratch_stats(host_dev(), &nb, &bytes);
            if (round < 3) {
                /* the first pass over the three finish orders sizes the pool */
                nb0 = nb;
                bytes0 = bytes;
                EXPECT(nb >= 2, "pool holds %zu buffers with qwZ and qgZ in flight", nb);
            } else {
                EXPECT(nb == nb0 && bytes == bytes0, "pool grew from %zu/%zu to %zu/%zu", nb0,
                       bytes0, nb, bytes);
            }
            free(sec);
            unit_free(&a);
            unit_free(&b);
            grad_free(&g);
        }
        zpp_coll_destroy(c);
        zpp_topo_destroy(t);
    }
}

/* Live accounting of whole steps equals the plan `zeropp plan` prints, for
 * every mode; and all-reduce is accounted as reduce-scatter + all-gather. */
static void test_step_matches_plan(void) {
    int W = world_size();
    const size_t params = 1234 * (size_t)W + 17;
    const int units = 3;
    for (int S = 1; S <= W; S++) {
        if (W % S) continue;
        zpp_topo *t = topo_make(S);
        zpp_coll *c;
        EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
        for (int mi = 0; mi < ZPP_COLL_MODE_COUNT; mi++) {
            const zpp_coll_mode *m = zpp_coll_mode_get(mi);
            zpp_coll_volume_reset(c);
            unit_case u[3];
            void *sec[3];
            for (int i = 0; i < units; i++) {
                u[i] = unit_make(t, zpp_plan_unit_numel(params, units, i), ZPP_BF16,
                                 (uint64_t)(0x400 + 16 * mi + i));
                sec[i] = zpp_test_malloc(u[i].p.sec_len * u[i].ds);
                gather(c, &u[i], m->gather, m->hpz ? sec[i] : NULL, ZPP_PHASE_FWD_GATHER);
            }
            for (int i = units - 1; i >= 0; i--) {
                if (m->hpz) {
                    zpp_coll_op *op;
                    EXPECT_OK(zpp_coll_gather_secondary_start(c, &u[i].p, ZPP_BF16, sec[i],
                                                              u[i].full, ZPP_PHASE_BWD_GATHER,
                                                              &op));
                    EXPECT_OK(zpp_coll_finish(c, op));
                } else {
                    gather(c, &u[i], m->gather, NULL, ZPP_PHASE_BWD_GATHER);
                }
                grad_case g = grad_make(t, u[i].p.numel, ZPP_BF16, (uint64_t)(0x500 + i), 0);
                reduce(c, &g, m->reduce);
                grad_free(&g);
            }
            zpp_volume plan;
            EXPECT_OK(zpp_plan_step(params, units, W, S, m, ZPP_BF16, NULL, &plan));
            const zpp_volume *v = zpp_coll_volume(c);
            for (int ph = 0; ph < ZPP_PHASE_COUNT; ph++) {
                EXPECT(v->cross_node_bytes[ph] == plan.cross_node_bytes[ph] &&
                           v->intra_node_bytes[ph] == plan.intra_node_bytes[ph] &&
                           v->payload_bytes[ph] == plan.payload_bytes[ph] &&
                           v->calls[ph] == plan.calls[ph],
                       "mode %s S=%d phase %s: live %.0f/%.0f/%.0f/%llu, plan %.0f/%.0f/%.0f/%llu",
                       m->name, S, zpp_phase_name((zpp_phase)ph), v->cross_node_bytes[ph],
                       v->intra_node_bytes[ph], v->payload_bytes[ph],
                       (unsigned long long)v->calls[ph], plan.cross_node_bytes[ph],
                       plan.intra_node_bytes[ph], plan.payload_bytes[ph],
                       (unsigned long long)plan.calls[ph]);
            }
            if (m->hpz) EXPECT(v->cross_node_bytes[ZPP_PHASE_BWD_GATHER] == 0.0, "failed");
            for (int i = 0; i < units; i++) {
                free(sec[i]);
                unit_free(&u[i]);
            }
        }
        /* all-reduce of n fp32 values: P = 4n, cross 2 (N-1)/N P, intra 2 (S-1) P */
        zpp_coll_volume_reset(c);
        float vals[5];
        for (int i = 0; i < 5; i++) vals[i] = (float)(t->world_rank + i);
        EXPECT_OK(zpp_coll_allreduce_sum(c, vals, 5));
        for (int i = 0; i < 5; i++)
            EXPECT(vals[i] == (float)(W * (W - 1) / 2 + W * i), "allreduce[%d] = %g", i, vals[i]);
        expect_vol e = {2.0 * (t->nodes - 1) / t->nodes * 20, 2.0 * (S - 1) * 20, 20, 1};
        expect_phase(zpp_coll_volume(c), ZPP_PHASE_OTHER, e, "allreduce");
        zpp_coll_destroy(c);
        zpp_topo_destroy(t);
    }
}

/* DESIGN.md §5's headline: for 2+ nodes ZeRO++ moves about a quarter of
 * ZeRO-3's cross-node bytes (0.5 + 0 + 0.25 of 1 + 1 + 1, plus scales). */
static void test_plan_ratios(void) {
    zpp_volume z3, zp, qw;
    EXPECT_OK(zpp_plan_step(10000000, 8, 8, 4, zpp_coll_mode_get(0), ZPP_BF16, NULL, &z3));
    EXPECT_OK(zpp_plan_step(10000000, 8, 8, 4, zpp_coll_mode_get(1), ZPP_BF16, NULL, &qw));
    EXPECT_OK(zpp_plan_step(10000000, 8, 8, 4, zpp_coll_mode_get(4), ZPP_BF16, NULL, &zp));
    double r = zpp_volume_cross_total(&zp) / zpp_volume_cross_total(&z3);
    EXPECT(r > 0.25 && r <= 0.26, "zeropp / zero3 cross-node = %g", r);
    double f = qw.cross_node_bytes[ZPP_PHASE_FWD_GATHER] / z3.cross_node_bytes[ZPP_PHASE_FWD_GATHER];
    /* int8 payload is half of bf16; one fp32 scale per 256 elements adds
     * 4/256 bytes per element = 1/128 of bf16's 2 bytes. */
    EXPECT(f > 0.5 + 1.0 / 128 - 1e-4 && f < 0.5 + 1.0 / 128 + 1e-3, "qwz / zero3 forward = %g", f);
    EXPECT(zp.cross_node_bytes[ZPP_PHASE_BWD_GATHER] == 0.0, "failed");
    EXPECT(zpp_volume_intra_total(&zp) > 0.0, "failed");
    EXPECT_STATUS(zpp_plan_step(100, 2, 8, 3, zpp_coll_mode_get(0), ZPP_BF16, NULL, &z3),
                  ZPP_ERR_INVALID);
}

/* Empty units move nothing; bad arguments fail cleanly on every rank. */
static void test_empty_and_errors(void) {
    int W = world_size();
    zpp_topo *t = topo_make(W % 2 == 0 ? 2 : 1);
    zpp_coll *c;
    EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
    zpp_partition p = zpp_partition_make(0, t);
    zpp_coll_op *op;
    EXPECT_OK(zpp_coll_gather_start(c, &p, ZPP_GATHER_QWZ, ZPP_BF16, NULL, NULL, NULL,
                                    ZPP_PHASE_FWD_GATHER, &op));
    EXPECT_OK(zpp_coll_finish(c, op));
    EXPECT_OK(zpp_coll_reduce_start(c, &p, ZPP_REDUCE_QGZ, ZPP_BF16, NULL, NULL, &op));
    EXPECT_OK(zpp_coll_finish(c, op));
    EXPECT(zpp_volume_cross_total(zpp_coll_volume(c)) == 0.0 &&
           zpp_coll_volume(c)->calls[ZPP_PHASE_FWD_GATHER] == 0, "failed");

    unit_case u = unit_make(t, 100, ZPP_BF16, 0x600);
    EXPECT_STATUS(zpp_coll_gather_start(c, &u.p, (zpp_gather_mode)7, ZPP_BF16, u.shard, u.full,
                                        NULL, ZPP_PHASE_FWD_GATHER, &op),
                  ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_coll_gather_start(c, &u.p, ZPP_GATHER_BASELINE, (zpp_dtype)9, u.shard,
                                        u.full, NULL, ZPP_PHASE_FWD_GATHER, &op),
                  ZPP_ERR_INVALID);
    zpp_partition wrong = zpp_partition_make_shape(100, W + 1, 1);
    EXPECT_STATUS(zpp_coll_gather_start(c, &wrong, ZPP_GATHER_BASELINE, ZPP_BF16, u.shard,
                                        u.full, NULL, ZPP_PHASE_FWD_GATHER, &op),
                  ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "zpp_partition_make") != NULL, "%s", zpp_last_error());
    EXPECT_STATUS(zpp_coll_reduce_start(c, &u.p, ZPP_REDUCE_QGZ, ZPP_BF16, NULL, NULL, &op),
                  ZPP_ERR_INVALID);
    zpp_coll_opts bad = zpp_coll_opts_default();
    bad.grad_spec.block = 12;
    zpp_coll *c2 = NULL;
    EXPECT_STATUS(zpp_coll_create(t, &bad, host_dev(), &c2), ZPP_ERR_INVALID);
    EXPECT(c2 == NULL, "failed");
    int flag = 1;
    EXPECT_OK(zpp_device_nonfinite_take(host_dev(), &flag));
    EXPECT(flag == 0, "failed");
    unit_free(&u);
    zpp_coll_destroy(c);
    zpp_topo_destroy(t);
}

/* A NaN in one rank's data does not hang the others: the exchange
 * completes, the NaN's block arrives as NaN everywhere, the rank that had
 * it finds its device's non-finite flag raised, and the other blocks are
 * unharmed. */
static void test_nonfinite_carried(void) {
    int W = world_size();
    zpp_topo *t = topo_make(W % 2 == 0 ? 2 : 1);
    zpp_coll *c;
    EXPECT_OK(zpp_coll_create(t, NULL, host_dev(), &c));
    size_t numel = 600 * (size_t)W;
    unit_case u = unit_make(t, numel, ZPP_BF16, 0x700);
    size_t bad = 300; /* element 300 of rank 0's shard: block 1 (256..511) */
    if (t->world_rank == 0) zpp_store_f32(u.shard, ZPP_BF16, bad, NAN);
    zpp_coll_op *op;
    EXPECT_OK(zpp_coll_gather_start(c, &u.p, ZPP_GATHER_QWZ, ZPP_BF16, u.shard, u.full, NULL,
                                    ZPP_PHASE_FWD_GATHER, &op));
    EXPECT_OK(zpp_coll_finish(c, op));
    int raised = 0;
    EXPECT_OK(zpp_device_nonfinite_take(host_dev(), &raised));
    EXPECT(raised == (t->world_rank == 0), "rank %d: flag %d", t->world_rank, raised);
    /* Unharmed: within qwZ's error on this data. |weight| <= 2^3
     * (coll_data.h), so half a step is at most 2^3 / 254 < 0.0316 (0.03153
     * with the 1e-3 margin) and the bf16 output adds 2^-8 of |ref| + 0.0316:
     * below 0.01 |ref| + 0.04. */
    for (size_t i = 0; i < u.p.padded; i++) {
        float got = zpp_load_f32(u.full, ZPP_BF16, i);
        if (i >= 256 && i < 512) EXPECT(isnan(got), "element %zu of the NaN block is %g", i, got);
        else EXPECT(!isnan(got) && fabs(got - u.ref[i]) <= fabs(u.ref[i]) * 0.01 + 0.04,
                    "element %zu harmed: %g vs %g", i, got, u.ref[i]);
    }
    /* qgZ: an Inf in rank 0's gradient at element e reaches e's owner only:
     * as NaN through a quantized block (its scale), as itself when the
     * owner is rank 0 (its own contribution is added unquantized). */
    grad_case g = grad_make(t, numel, ZPP_BF16, 0x701, 0);
    size_t e = (size_t)(W - 1) * g.p.shard_len + 5;
    if (t->world_rank == 0) zpp_store_f32(g.full_grad, ZPP_BF16, e, INFINITY);
    EXPECT_OK(zpp_coll_reduce_start(c, &g.p, ZPP_REDUCE_QGZ, ZPP_BF16, g.full_grad, g.out, &op));
    EXPECT_OK(zpp_coll_finish(c, op));
    EXPECT_OK(zpp_device_nonfinite_take(host_dev(), &raised));
    if (t->world_rank == 0) EXPECT(raised == 1, "rank 0: the flag was not raised");
    if (t->world_rank == W - 1)
        EXPECT(W == 1 ? g.out[5] == INFINITY : isnan(g.out[5]), "owner got %g", g.out[5]);
    else for (size_t j = 0; j < g.p.shard_len; j++) EXPECT(!isnan(g.out[j]), "failed");
    grad_free(&g);
    unit_free(&u);
    zpp_coll_destroy(c);
    zpp_topo_destroy(t);
}

ZPP_TESTS(
    ZPP_TEST(test_partition_and_modes),
    ZPP_TEST(test_gather_baseline_and_qwz),
    ZPP_TEST(test_hpz_secondary),
    ZPP_TEST(test_reduce_baseline),
    ZPP_TEST(test_reduce_qgz),
    ZPP_TEST(test_qgz_world_average),
    ZPP_TEST(test_qgz_own_exact),
    ZPP_TEST(test_stochastic_small_blocks),
    ZPP_TEST(test_qgz_slab_sizes),
    ZPP_TEST(test_qgz_slabs_change_no_bit),
    ZPP_TEST(test_in_flight_and_pool),
    ZPP_TEST(test_step_matches_plan),
    ZPP_TEST(test_plan_ratios),
    ZPP_TEST(test_empty_and_errors),
    ZPP_TEST(test_nonfinite_carried),
)
