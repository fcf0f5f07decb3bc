/* test_plan.c — the step cost model (plan/cost.c, DESIGN.md §11): its bytes
 * are volume.c's, more bandwidth or FLOP/s never slows a mode, the overlap
 * recurrence stays between its two bounds, memory grows with the batch, and
 * its ZeRO++/ZeRO-3 ratios against the published 384-V100 figures (the
 * points it meets are asserted; the ones it misses are printed and their
 * direction asserted, see DESIGN.md §11 for why). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/llama.h"
#include "plan/cost.h"
#include "testlib.h"

/* A small machine: 4 nodes of 8, GPT 12 layers x 1024, 4k tokens. */
static zpp_cost_in small_in(void) {
    zpp_cost_in in = zpp_cost_in_default();
    in.n_layer = 12;
    in.n_embd = 1024;
    in.seq_len = 1024;
    in.vocab = 50304;
    in.params = zpp_cost_gpt_params(12, 1024, 1024, 50304);
    in.units = 13;
    in.world = 32;
    in.node_size = 8;
    in.tokens_per_gpu = 4096;
    in.inter_bps = 12.5e9;
    in.intra_bps = 150e9;
    in.latency_s = 5e-6;
    in.flops_per_s = 100e12;
    return in;
}

static zpp_cost_out cost(const zpp_cost_in *in, int mode) {
    zpp_cost_out o;
    EXPECT_OK(zpp_cost_step(in, zpp_coll_mode_get(mode), &o));
    return o;
}

/* GPT 1.31B (24 layers x 2048, T 1024, vocabulary 50304) on 25 units, two
 * ranks as two nodes of one, micro-batch 4: the shape of the H200 runs. */
static zpp_cost_in gpt_1p3b_two_nodes(void) {
    zpp_cost_in in = zpp_cost_in_default();
    in.n_layer = 24;
    in.n_embd = 2048;
    in.seq_len = 1024;
    in.vocab = 50304;
    in.params = zpp_cost_gpt_params(24, 2048, 1024, 50304);
    in.units = 25;
    in.world = 2;
    in.node_size = 1;
    in.tokens_per_gpu = 4096;
    return in;
}

/* ---- The reuse rule, written out from the engine's definition -------------
 * engine.c's use order on the planner's split (stage i uses unit i, every
 * backward stage reads): forward 0..U-1, then backward U-1..0. After forward
 * stage i < U-1 the unit stays when its next use comes before more than
 * `reuse` parameters of other units have been used (counted at each use);
 * the last forward stage's unit always stays. Walked use by use here, with
 * no assumption about which units come out kept; only at world > 1, and
 * distance 0 is the planner's "no rule" (every unit gathered again). */
static int kept_ref(const zpp_cost_in *in, int *kept /* [units] or NULL */) {
    const int U = in->units;
    const size_t P = (size_t)in->params;
    int n = 0;
    for (int i = 0; i < U; i++) {
        int k = 0;
        if (in->world > 1 && in->reuse_distance > 0) {
            if (i == U - 1) {
                k = 1;
            } else {
                double between = 0;
                for (int pos = i + 1; pos < 2 * U; pos++) {
                    int t = pos < U ? pos : 2 * U - 1 - pos; /* the unit used there */
                    if (t == i) {
                        k = 1;
                        break;
                    }
                    between += (double)zpp_plan_unit_numel(P, U, t);
                    if (between > in->reuse_distance) break;
                }
            }
        }
        if (kept) kept[i] = k;
        n += k;
    }
    return n;
}

/* zpp_plan_step's bytes less the backward gathers of the units kept_ref
 * keeps (each replayed alone with volume.c's own functions). */
static zpp_volume expected_volume(const zpp_cost_in *in, const zpp_coll_mode *md) {
    zpp_volume v;
    EXPECT_OK(zpp_plan_step((size_t)in->params, in->units, in->world, in->node_size, md,
                            in->dtype, &in->coll, &v));
    int kept[4096];
    if (in->units > 4096) return v;
    kept_ref(in, kept);
    const int N = in->world / in->node_size;
    for (int i = 0; i < in->units; i++) {
        if (!kept[i]) continue;
        zpp_partition p = zpp_partition_make_shape(
            zpp_plan_unit_numel((size_t)in->params, in->units, i), in->world, N);
        zpp_volume k;
        memset(&k, 0, sizeof k);
        if (md->hpz)
            zpp_plan_gather_secondary(&k, &p, N, in->node_size, in->dtype, ZPP_PHASE_BWD_GATHER);
        else
            zpp_plan_gather(&k, &p, N, in->node_size, md->gather, in->dtype, &in->coll,
                            ZPP_PHASE_BWD_GATHER);
        v.cross_node_bytes[ZPP_PHASE_BWD_GATHER] -= k.cross_node_bytes[ZPP_PHASE_BWD_GATHER];
        v.intra_node_bytes[ZPP_PHASE_BWD_GATHER] -= k.intra_node_bytes[ZPP_PHASE_BWD_GATHER];
    }
    return v;
}

/* Predicted bytes are volume.c's counted bytes, exactly, for every mode and
 * node shape (including one node, one rank per node, uneven units): all of
 * them at reuse distance 0, and less the kept units' backward gathers at the
 * default 1e9 (here every unit: 2 x 12 x 9.5M in between at most). */
static void test_bytes_equal_volume(void) {
    const int shapes[][2] = {{32, 8}, {32, 1}, {8, 8}, {6, 3}, {384, 16}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] * 2; s++) {
        zpp_cost_in in = small_in();
        in.world = shapes[s / 2][0];
        in.node_size = shapes[s / 2][1];
        in.params = 123456789; /* uneven over 13 units and the world */
        if (s % 2) in.reuse_distance = 0;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            zpp_volume v;
            if (s % 2)
                EXPECT_OK(zpp_plan_step((size_t)in.params, in.units, in.world, in.node_size,
                                        zpp_coll_mode_get(m), in.dtype, &in.coll, &v));
            else
                v = expected_volume(&in, zpp_coll_mode_get(m));
            zpp_volume cv;
            EXPECT_OK(zpp_cost_volume(&in, zpp_coll_mode_get(m), &cv));
            EXPECT(zpp_volume_cross_total(&cv) == zpp_volume_cross_total(&v) &&
                       zpp_volume_intra_total(&cv) == zpp_volume_intra_total(&v),
                   "zpp_cost_volume differs");
            zpp_cost_out o = cost(&in, m);
            EXPECT(o.cross_node_bytes == zpp_volume_cross_total(&v),
                   "%s W %d S %d: cross %.0f != volume %.0f", zpp_coll_mode_get(m)->name,
                   in.world, in.node_size, o.cross_node_bytes, zpp_volume_cross_total(&v));
            EXPECT(o.intra_node_bytes == zpp_volume_intra_total(&v),
                   "%s W %d S %d: intra %.0f != volume %.0f", zpp_coll_mode_get(m)->name,
                   in.world, in.node_size, o.intra_node_bytes, zpp_volume_intra_total(&v));
        }
    }
}

/* More bandwidth (either link or HBM) or more FLOP/s never makes a mode slower,
 * swept over a factor of 1000 in each; the schedule with qgZ's cross-node
 * step pipelined is never slower than the one with it exposed. */
static void test_monotone(void) {
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        for (int knob = 0; knob < 4; knob++) {
            double prev = INFINITY;
            for (double f = 0.03; f < 30; f *= 1.25) {
                zpp_cost_in in = small_in();
                in.hbm_bps = 700e9; /* the kernels priced: more HBM never slows either */
                if (knob == 0) in.inter_bps *= f;
                if (knob == 1) in.intra_bps *= f;
                if (knob == 2) in.flops_per_s *= f;
                if (knob == 3) in.hbm_bps *= f;
                double t = cost(&in, m).step_s;
                EXPECT(t <= prev * (1 + 1e-12), "%s knob %d x%.3g: %.6f s > %.6f s",
                       zpp_coll_mode_get(m)->name, knob, f, t, prev);
                prev = t;
            }
        }
        zpp_cost_in in = small_in();
        double exposed = cost(&in, m).step_s;
        in.qgz_inter_exposed = 0;
        EXPECT(cost(&in, m).step_s <= exposed, "%s: pipelining qgZ made it slower",
               zpp_coll_mode_get(m)->name);
    }
}

/* The recurrence hides communication, never compute: compute <= step, and
 * step <= compute + every collective back to back (nothing hidden). With
 * communication free the step is the compute; with compute free it is at
 * least the forward's exposed first gather plus the last reduction. */
static void test_overlap_bounds(void) {
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        for (double f = 0.01; f < 100; f *= 3) {
            zpp_cost_in in = small_in();
            in.inter_bps *= f;
            zpp_cost_out o = cost(&in, m);
            EXPECT(o.step_s >= o.compute_s * (1 - 1e-12), "%s: step %.6f < compute %.6f",
                   zpp_coll_mode_get(m)->name, o.step_s, o.compute_s);
            EXPECT(o.step_s <= (o.compute_s + o.comm_s) * (1 + 1e-12),
                   "%s: step %.6f > compute %.6f + comm %.6f", zpp_coll_mode_get(m)->name,
                   o.step_s, o.compute_s, o.comm_s);
        }
        zpp_cost_in in = small_in();
        in.inter_bps = in.intra_bps = 1e30;
        in.latency_s = 0;
        zpp_cost_out o = cost(&in, m);
        EXPECT(fabs(o.step_s - o.compute_s) <= 1e-9 * o.compute_s,
               "%s: free links, step %.9f != compute %.9f", zpp_coll_mode_get(m)->name,
               o.step_s, o.compute_s);
    }
}

/* FLOPs split as documented, and the throughput figures follow from the
 * step: tokens/s = W K / step, TFLOP/s = FLOPs / step. */
static void test_flops_and_rates(void) {
    zpp_cost_in in = small_in();
    double want = in.tokens_per_gpu * (6 * in.params + 12.0 * 12 * 1024 * 1024);
    EXPECT(fabs(zpp_cost_step_flops(&in) - want) <= 1e-12 * want, "step FLOPs");
    zpp_cost_out o = cost(&in, 0);
    EXPECT(fabs(o.tokens_per_s * o.step_s - in.world * in.tokens_per_gpu) <= 1e-6, "tokens/s");
    EXPECT(fabs(o.tflops_per_gpu * 1e12 * o.step_s - want) <= 1e-9 * want, "TFLOP/s");
    EXPECT(fabs(o.compute_s - want / in.flops_per_s) <= 1e-12, "compute time");
}

/* Memory: grows with the micro-batch (activations), hpZ adds exactly its
 * secondary copy (2 bytes x N x shard per element: the model / S), and the
 * shard state is 16 + 2 bytes per parameter over the world, up to padding. */
static void test_memory(void) {
    zpp_cost_in in = small_in();
    double prev = 0;
    for (int b = 1; b <= 16; b *= 2) {
        in.tokens_per_gpu = 1024.0 * b;
        zpp_cost_out o = cost(&in, 4);
        EXPECT(o.mem_acts_known && o.mem_bytes_per_rank > prev, "memory at micro-batch %d", b);
        prev = o.mem_bytes_per_rank;
    }
    zpp_cost_out z3 = cost(&in, 0), hpz = cost(&in, 2);
    double P = in.params, W = in.world, S = in.node_size;
    EXPECT(z3.mem_secondary == 0, "ZeRO-3 keeps no secondary shard");
    EXPECT(fabs(hpz.mem_secondary - 2 * P / S) <= 2 * in.units * W, "hpZ secondary %.0f vs %.0f",
           hpz.mem_secondary, 2 * P / S);
    /* fp32 master, m, v and gradient: no working-dtype copy (engine.c) */
    EXPECT(fabs(z3.mem_shard_state - 16 * P / W) <= 16.0 * in.units,
           "shard state %.0f vs 16 P / W %.0f", z3.mem_shard_state, 16 * P / W);
    /* The CUDA model's logits alone: V e bytes per token (e = 2 or 4). */
    EXPECT(zpp_cost_gpt_act_bytes(&in, 2) - zpp_cost_gpt_act_bytes(&in, 1) >
               (double)zpp_dtype_size(in.dtype) * in.vocab,
           "activations per token below the logits");
    in.n_layer = 0; /* params only: no activation count, and it says so */
    EXPECT(!cost(&in, 0).mem_acts_known && cost(&in, 0).mem_acts == 0, "params only");
}

/* ZeRO++ sends fewer cross-node bytes than ZeRO-3, and with a slow
 * cross-node link it is faster. Every unit gathered again in the backward
 * (distance 0): 0.75 M against 3 M, a quarter plus the scales. At the default
 * distance all 13 units of this 204M model stay (2 x 12 x 15.7M = 377M in
 * between at most): no backward gather in either mode, so 0.75 M against 2 M,
 * 0.375 plus the scales. */
static void test_zeropp_beats_zero3(void) {
    zpp_cost_in in = small_in();
    in.inter_bps = 1e9;
    zpp_cost_out z3 = cost(&in, 0), zpp = cost(&in, 4);
    EXPECT(z3.kept_units == 13 && zpp.kept_units == 13, "kept %d", z3.kept_units);
    EXPECT(zpp.cross_node_bytes > 0.375 * z3.cross_node_bytes &&
               zpp.cross_node_bytes < 0.4 * z3.cross_node_bytes,
           "cross %.0f vs %.0f", zpp.cross_node_bytes, z3.cross_node_bytes);
    EXPECT(zpp.step_s < z3.step_s, "ZeRO++ %.3f s not faster than ZeRO-3 %.3f s", zpp.step_s,
           z3.step_s);
    in.reuse_distance = 0;
    z3 = cost(&in, 0), zpp = cost(&in, 4);
    EXPECT(zpp.cross_node_bytes < 0.3 * z3.cross_node_bytes, "cross %.0f vs %.0f",
           zpp.cross_node_bytes, z3.cross_node_bytes);
    EXPECT(zpp.step_s < z3.step_s, "ZeRO++ %.3f s not faster than ZeRO-3 %.3f s", zpp.step_s,
           z3.step_s);
}

/* Bad inputs are refused with a status, not a crash or a NaN. */
static void test_invalid(void) {
    zpp_cost_in in = small_in();
    zpp_cost_out o;
    in.node_size = 5;
    EXPECT_STATUS(zpp_cost_step(&in, zpp_coll_mode_get(0), &o), ZPP_ERR_INVALID);
    in = small_in();
    in.inter_bps = 0;
    EXPECT_STATUS(zpp_cost_step(&in, zpp_coll_mode_get(0), &o), ZPP_ERR_INVALID);
    in = small_in();
    in.tokens_per_gpu = -1;
    EXPECT_STATUS(zpp_cost_step(&in, zpp_coll_mode_get(0), &o), ZPP_ERR_INVALID);
    in = small_in();
    in.params = 3;
    EXPECT_STATUS(zpp_cost_step(&in, zpp_coll_mode_get(0), &o), ZPP_ERR_INVALID);
}

/* hpZ's partition size: 0 is the node (byte for byte); a smaller group H
 * keeps W / H shards per rank (2 P / H bytes, up to padding), and its
 * backward gathers stay inside the node. A size not dividing the node is
 * refused. */
static void test_hpz_partition(void) {
    zpp_cost_in in = small_in();
    zpp_cost_out node = cost(&in, 2);
    in.hpz_size = in.node_size;
    zpp_cost_out same = cost(&in, 2);
    EXPECT(memcmp(&node, &same, sizeof node) == 0, "hpz_size = node size differs from 0");
    double prev = node.mem_secondary;
    for (int H = 4; H >= 2; H /= 2) {
        in.hpz_size = H;
        zpp_cost_out o = cost(&in, 2);
        EXPECT(fabs(o.mem_secondary - 2 * in.params / H) <= 2.0 * in.units * in.world,
               "hpZ %d: secondary %.0f vs 2P/H %.0f", H, o.mem_secondary, 2 * in.params / H);
        EXPECT(o.mem_secondary > prev, "hpZ %d keeps no more than a larger group", H);
        EXPECT(o.cross_node_bytes == node.cross_node_bytes, "hpZ %d: cross-node bytes moved", H);
        prev = o.mem_secondary;
    }
    zpp_cost_out o;
    in.hpz_size = 3;
    EXPECT_STATUS(zpp_cost_step(&in, zpp_coll_mode_get(2), &o), ZPP_ERR_INVALID);
    EXPECT_OK(zpp_cost_step(&in, zpp_coll_mode_get(0), &o)); /* no hpZ: ignored */
}

/* ---- The reuse rule across the forward->backward boundary ----------------
 * GPT 1.31B (24 x 2048, T 1024, V 50304) on the planner's split: 25 equal
 * units of P = V C + T C + 2 C + 24 (12 C^2 + 13 C) = 1,313,722,368
 * parameters, so units 0..17 hold 52,548,895 and units 18..24 52,548,894
 * (P mod 25 = 18). Unit 24 - m has units 25-m..24 twice in between:
 *   m = 9: 2 (9 x 52,548,894 + 2) =   945,880,096 <= 1e9: kept;
 *   m = 10: 2 (10 x 52,548,894 + 3) = 1,050,977,886 > 1e9: gathered again,
 * so 10 units (15..24) stay at the default. (The engine's real split, a
 * 105M unit 0 used at both ends and 50.4M blocks, keeps 8 blocks besides
 * the head's unit 0; the planner's equal units make that 10 of 25.) One
 * unit stays for any distance below 2 x 52,548,894 = 105,097,788, two from
 * it. Two ranks as two nodes (the H200 runs): a unit's ZeRO-3 backward
 * gather moves its shard, ceil(numel / 2) bf16 elements, across: units
 * 15..17 26,274,448 and 18..24 26,274,447, so the 10 kept units take out
 * 2 (3 x 26,274,448 + 7 x 26,274,447) = 525,488,946 bytes, and at the
 * boundary units 15..23 are held besides the current 24: padded 2 x shard,
 * 2 (3 x 52,548,896 + 6 x 52,548,894) = 945,880,104 bytes. */
static void test_reuse_across_boundary(void) {
    zpp_cost_in in = gpt_1p3b_two_nodes();
    in.flops_per_s = 3.58e14;
    in.inter_bps = in.intra_bps = 1.85e9;
    in.serial = 1; /* every collective's time on the step: the savings show whole */
    EXPECT(in.params == 1313722368.0, "GPT 1.31B has %.0f parameters", in.params);
    EXPECT(in.reuse_distance == 1e9, "default distance %g", in.reuse_distance);
    /* (a) the kept count, by hand */
    const struct {
        double d;
        int kept;
    } gpt[] = {{1e9, 10}, {945880096, 10}, {945880095, 9}, {1e8, 1}, {105097787, 1},
               {105097788, 2}, {1, 1}, {0, 0}, {1e12, 25}};
    for (size_t i = 0; i < sizeof gpt / sizeof gpt[0]; i++) {
        zpp_cost_in c = in;
        c.reuse_distance = gpt[i].d;
        EXPECT(zpp_cost_kept_units(&c) == gpt[i].kept && kept_ref(&c, NULL) == gpt[i].kept,
               "GPT 1.31B at %.0f: kept %d (walked %d), by hand %d", gpt[i].d,
               zpp_cost_kept_units(&c), kept_ref(&c, NULL), gpt[i].kept);
    }
    /* A small model: 1003 parameters in 4 units of 251, 251, 251, 250; unit 2
     * has 2 x 250 = 500 in between, unit 1 2 x 501 = 1002, unit 0 1504. */
    zpp_cost_in sm = in;
    sm.params = 1003;
    sm.units = 4;
    sm.n_layer = 0;
    const struct {
        double d;
        int kept;
    } small[] = {{1e9, 4}, {1504, 4}, {1503, 3}, {1002, 3}, {1001, 2}, {500, 2}, {499, 1}};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        sm.reuse_distance = small[i].d;
        EXPECT(zpp_cost_kept_units(&sm) == small[i].kept,
               "1003 in 4 at %.0f: kept %d, by hand %d", small[i].d, zpp_cost_kept_units(&sm),
               small[i].kept);
    }
    /* (b) bytes and time: ZeRO-3's backward gathers fall by the 10 kept
     * units' shards; serial at latency 0, the step by their time on the link. */
    zpp_cost_in old = in;
    old.reuse_distance = 0;
    zpp_cost_out o0 = cost(&old, 0), o1 = cost(&in, 0);
    zpp_volume v0, v1;
    EXPECT_OK(zpp_cost_volume(&old, zpp_coll_mode_get(0), &v0));
    EXPECT_OK(zpp_cost_volume(&in, zpp_coll_mode_get(0), &v1));
    EXPECT(o0.kept_units == 0 && o1.kept_units == 10, "kept %d, %d", o0.kept_units,
           o1.kept_units);
    EXPECT(v0.cross_node_bytes[ZPP_PHASE_BWD_GATHER] -
                   v1.cross_node_bytes[ZPP_PHASE_BWD_GATHER] == 525488946.0 &&
               o0.cross_node_bytes - o1.cross_node_bytes == 525488946.0 &&
               v0.cross_node_bytes[ZPP_PHASE_FWD_GATHER] ==
                   v1.cross_node_bytes[ZPP_PHASE_FWD_GATHER],
           "backward gather bytes %.0f -> %.0f (step %.0f -> %.0f), want 525,488,946 fewer",
           v0.cross_node_bytes[ZPP_PHASE_BWD_GATHER], v1.cross_node_bytes[ZPP_PHASE_BWD_GATHER],
           o0.cross_node_bytes, o1.cross_node_bytes);
    const double saved_s = 525488946.0 / in.inter_bps;
    EXPECT(fabs((o0.step_s - o1.step_s) - saved_s) <= 1e-9 * o0.step_s &&
               fabs((o0.comm_s - o1.comm_s) - saved_s) <= 1e-9 * o0.comm_s &&
               o0.compute_s == o1.compute_s,
           "step %.9f -> %.9f, comm %.9f -> %.9f: want %.9f s less", o0.step_s, o1.step_s,
           o0.comm_s, o1.comm_s, saved_s);
    /* (d) memory: units 15..23 held at the boundary, nothing else moves. */
    EXPECT(o0.mem_kept == 0 && o1.mem_kept == 945880104.0 &&
               o1.mem_bytes_per_rank - o0.mem_bytes_per_rank == 945880104.0 &&
               o1.mem_transient == o0.mem_transient,
           "memory %.0f -> %.0f (kept %.0f), want 945,880,104 more", o0.mem_bytes_per_rank,
           o1.mem_bytes_per_rank, o1.mem_kept);
    /* Every mode: the cross- plus intra-node bytes fall by the kept units'
     * backward gathers (hpZ's inside the node), each replayed alone. */
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        const zpp_coll_mode *md = zpp_coll_mode_get(m);
        zpp_cost_in c = in;
        c.world = 8;
        c.node_size = 4;
        zpp_cost_in c0 = c;
        c0.reuse_distance = 0;
        double want_c = 0, want_i = 0;
        for (int u = 15; u < 25; u++) {
            zpp_partition p =
                zpp_partition_make_shape(zpp_plan_unit_numel((size_t)c.params, 25, u), 8, 2);
            zpp_volume k;
            memset(&k, 0, sizeof k);
            if (md->hpz)
                zpp_plan_gather_secondary(&k, &p, 2, 4, c.dtype, ZPP_PHASE_BWD_GATHER);
            else
                zpp_plan_gather(&k, &p, 2, 4, md->gather, c.dtype, &c.coll,
                                ZPP_PHASE_BWD_GATHER);
            want_c += zpp_volume_cross_total(&k), want_i += zpp_volume_intra_total(&k);
        }
        zpp_cost_out a = cost(&c0, m), b = cost(&c, m);
        EXPECT(b.kept_units == 10 && a.cross_node_bytes - b.cross_node_bytes == want_c &&
                   a.intra_node_bytes - b.intra_node_bytes == want_i && want_c + want_i > 0,
               "%s: bytes fell by %.0f + %.0f, want %.0f + %.0f", md->name,
               a.cross_node_bytes - b.cross_node_bytes, a.intra_node_bytes - b.intra_node_bytes,
               want_c, want_i);
        EXPECT(b.step_s < a.step_s, "%s: keeping units made the step slower", md->name);
    }
    /* (c) world 1: nothing kept, the same step as distance 0 in every field. */
    zpp_cost_in w1 = in, w10;
    w1.world = 1;
    w10 = w1;
    w10.reuse_distance = 0;
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        zpp_cost_out a = cost(&w1, m), b = cost(&w10, m);
        EXPECT(zpp_cost_kept_units(&w1) == 0 && a.kept_units == 0 && a.mem_kept == 0 &&
                   memcmp(&a, &b, sizeof a) == 0,
               "%s: world 1 kept %d units", zpp_coll_mode_get(m)->name, a.kept_units);
    }
    /* A negative distance is refused. */
    zpp_cost_out o;
    zpp_volume v;
    in.reuse_distance = -1;
    EXPECT_STATUS(zpp_cost_step(&in, zpp_coll_mode_get(0), &o), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_cost_volume(&in, zpp_coll_mode_get(0), &v), ZPP_ERR_INVALID);
}

/* ---- zpp_cost_pick against a brute-force loop ----------------------------
 * Every (micro-batch 1..2^16, mode, hpZ divisor) is priced here
 * independently of the pick's own loop and its early stop; the pick must
 * fit, be one of them, and have at least the tokens/s of every one that
 * fits. */
static void check_pick(const zpp_cost_in *in, double budget, int max_b) {
    zpp_cost_pick_result r;
    EXPECT_OK(zpp_cost_pick(in, budget, max_b, &r));
    const int gpt = in->n_layer > 0, S = in->node_size;
    EXPECT(r.best.out.mem_bytes_per_rank <= budget, "pick over budget: %.0f > %.0f",
           r.best.out.mem_bytes_per_rank, budget);
    int found = 0, fitting = 0;
    for (int b = gpt ? 1 : 0; b <= (gpt ? (max_b > 0 ? max_b : 65536) : 0); b = b ? 2 * b : 1) {
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            const zpp_coll_mode *md = zpp_coll_mode_get(m);
            for (int H = 0; H <= S; H++) {
                if (md->hpz ? (H < 2 || S % H) : H != 0) continue;
                zpp_cost_in c = *in;
                c.hpz_size = H;
                if (gpt) c.tokens_per_gpu = (double)b * in->seq_len;
                zpp_cost_out o = cost(&c, m);
                if (o.mem_bytes_per_rank > budget) continue;
                fitting++;
                EXPECT(o.tokens_per_s <= r.best.out.tokens_per_s,
                       "%s hpZ %d mb %d: %.0f tokens/s beats the pick's %.0f", md->name, H, b,
                       o.tokens_per_s, r.best.out.tokens_per_s);
                if (m == r.best.mode && H == r.best.hpz_size && b == r.best.micro_batch) {
                    found = 1;
                    EXPECT(o.tokens_per_s == r.best.out.tokens_per_s, "pick's cost is not its own");
                }
                if (m == 0)
                    EXPECT(r.has_zero3 && o.tokens_per_s <= r.zero3.out.tokens_per_s,
                           "zero3 mb %d beats the pick's zero3", b);
            }
        }
        if (!gpt) break;
    }
    EXPECT(found, "the pick (%s hpZ %d mb %d) is not a fitting candidate",
           zpp_coll_mode_get(r.best.mode)->name, r.best.hpz_size, r.best.micro_batch);
    EXPECT(fitting == r.fitting, "%d candidates fit, the pick counted %d", fitting, r.fitting);
    if (r.has_runner_up)
        EXPECT(r.runner_up.mode != r.best.mode && r.runner_up.out.mem_bytes_per_rank <= budget &&
                   r.runner_up.out.tokens_per_s <= r.best.out.tokens_per_s,
               "runner-up");
    if (S < 2) EXPECT(!zpp_coll_mode_get(r.best.mode)->hpz, "hpZ picked with one rank per node");
    if (gpt)
        EXPECT(r.next_micro_batch == 2 * r.best.micro_batch &&
                   r.next_fits == (r.next_mem_bytes <= budget),
               "next micro-batch %d: %.0f bytes, fits %d", r.next_micro_batch, r.next_mem_bytes,
               r.next_fits);
}

static void test_pick_brute_force(void) {
    const double GiB = 1073741824.0;
    const double budgets[] = {1.5 * GiB, 4 * GiB, 16 * GiB, 80 * GiB};
    const double inter[] = {1e9, 12.5e9, 1e11};
    const int shapes[][2] = {{32, 8}, {32, 1}, {16, 16}, {24, 6}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t i = 0; i < sizeof inter / sizeof inter[0]; i++)
            for (size_t k = 0; k < sizeof budgets / sizeof budgets[0]; k++) {
                zpp_cost_in in = small_in();
                in.world = shapes[s][0];
                in.node_size = shapes[s][1];
                in.inter_bps = inter[i];
                check_pick(&in, budgets[k], 0);
                check_pick(&in, budgets[k], 6); /* a cap that is not a power of two */
                in.n_layer = 0; /* params only: tokens fixed, the modes and H vary */
                check_pick(&in, budgets[k], 0);
            }
    /* The budget binds: at 4 GiB the winner's next micro-batch does not fit. */
    zpp_cost_in in = small_in();
    zpp_cost_pick_result r;
    EXPECT_OK(zpp_cost_pick(&in, 4 * GiB, 0, &r));
    EXPECT(!r.next_fits && r.next_mem_bytes > 4 * GiB && r.best.micro_batch >= 2,
           "4 GiB: micro-batch %d, next %.1f GiB", r.best.micro_batch, r.next_mem_bytes / GiB);
}

/* Nothing fits: a clear error (ZPP_ERR_CONFIG) naming the smallest setting,
 * and no result. */
static void test_pick_nothing_fits(void) {
    zpp_cost_in in = small_in();
    zpp_cost_pick_result r;
    EXPECT_STATUS(zpp_cost_pick(&in, 1e6, 0, &r), ZPP_ERR_CONFIG);
    EXPECT(strstr(zpp_last_error(), "nothing fits") && strstr(zpp_last_error(), "micro-batch 1"),
           "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_cost_pick(&in, 0, 0, &r), ZPP_ERR_INVALID);
    in.node_size = 5; /* an impossible input is zpp_cost_step's error */
    EXPECT_STATUS(zpp_cost_pick(&in, 1e12, 0, &r), ZPP_ERR_INVALID);
}

/* ---- zpp_cost_calibrate ---------------------------------------------------
 * A file written the way `zeropp bench comm --json` writes it, with times
 * made from known rates by the model's formula: the rates come back. */
static void write_file(char *path, const char *text) {
    snprintf(path, 64, "/tmp/zpp_test_cal_XXXXXX");
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd < 0) return;
    size_t n = strlen(text);
    EXPECT(write(fd, text, n) == (ssize_t)n, "write");
    close(fd);
}

/* One bench comm line of `mode` on W ranks in nodes of S, U units of 2^22
 * parameters in all, its gather times from the rates (bytes/s) and latency. */
static int bench_line(char *buf, size_t cap, const char *mode, int W, int S, int U,
                      double inter, double intra, double lat) {
    const zpp_coll_mode *md;
    EXPECT_OK(zpp_coll_mode_parse(mode, &md));
    zpp_volume v;
    zpp_coll_opts co = zpp_coll_opts_default();
    EXPECT_OK(zpp_plan_step(1u << 22, U, W, S, md, ZPP_BF16, &co, &v));
    double c[2], in[2], ms[2];
    for (int k = 0; k < 2; k++) {
        c[k] = v.cross_node_bytes[k];
        in[k] = v.intra_node_bytes[k];
        double steps = (k == 1 && md->hpz) ? S - 1 : W - 1;
        ms[k] = 1e3 * (U * steps * lat + fmax(c[k] / inter, in[k] / S / intra));
    }
    return snprintf(buf, cap,
                    "{\"bench\":\"comm\",\"mode\":\"%s\",\"backend\":\"mpi\",\"world\":%d,"
                    "\"params\":4194304,"
                    "\"node_size\":%d,\"units\":%d,\"fwd_gather_cross_bytes\":%.17g,"
                    "\"fwd_gather_intra_bytes\":%.17g,\"fwd_gather_ms\":%.17g,"
                    "\"bwd_gather_cross_bytes\":%.17g,\"bwd_gather_intra_bytes\":%.17g,"
                    "\"bwd_gather_ms\":%.17g,\"grad_reduce_ms\":1}\n",
                    mode, W, S, U, c[0], in[0], ms[0], c[1], in[1], ms[1]);
}

static void test_calibrate_recovers_rates(void) {
    const char *modes[] = {"zero3", "qwz", "hpz", "qgz", "zeropp"};
    /* {inter, intra}: cross-node bound; then intra-node bound (a lower bound). */
    const double rates[2][2] = {{1.25e9, 20e9}, {50e9, 1e9}};
    for (int r = 0; r < 2; r++) {
        char text[8192], path[64];
        size_t n = 0;
        for (int m = 0; m < 5; m++)
            n += (size_t)bench_line(text + n, sizeof text - n, modes[m], 16, 4, 8, rates[r][0],
                                    rates[r][1], 5e-6);
        write_file(path, text);
        zpp_cost_calib c;
        EXPECT_OK(zpp_cost_calibrate(path, 5e-6, NULL, &c));
        unlink(path);
        EXPECT(c.lines == 5 && c.intra_lines == 2 && c.inter_lines == 1, "lines %d %d %d",
               c.lines, c.intra_lines, c.inter_lines);
        EXPECT(fabs(c.intra_bps / rates[r][1] - 1) < 1e-9, "intra %.6g vs %.6g", c.intra_bps,
               rates[r][1]);
        if (r == 0)
            EXPECT(fabs(c.inter_bps / rates[r][0] - 1) < 1e-9 && !c.inter_lower_bound,
                   "inter %.6g vs %.6g", c.inter_bps, rates[r][0]);
        else /* intra-bound: the cross rate is only known to be at least this */
            EXPECT(c.inter_lower_bound && c.inter_bps <= rates[r][0] * (1 + 1e-9),
                   "inter %.6g should be a lower bound of %.6g", c.inter_bps, rates[r][0]);
    }
}

/* Malformed input: ZPP_ERR_FORMAT naming the file's line; a file with no
 * line that isolates a link; a latency longer than the measured time. */
static void test_calibrate_malformed(void) {
    char good[2048], text[4096], path[64];
    bench_line(good, sizeof good, "zero3", 16, 4, 8, 1e9, 1e10, 5e-6);
    const struct {
        const char *tail; /* appended after two good lines and a blank one */
        const char *want;
    } cases[] = {
        {"mpirun: noise\n", "line 4: not a JSON object"},
        {"{\"bench\":\"comm\",\"mode\":\"zero3\",\"world\":16}\n", "line 4: no number \"node_size\""},
        {"{\"bench\":\"quant\",\"mode\":\"zero3\"}\n", "line 4: not a `zeropp bench comm"},
        {"{\"bench\":\"comm\",\"mode\":\"hpz\",\"world\":16,\"node_size\":4,\"units\":8,"
         "\"params\":\"many\"}\n",
         "line 4: no number \"params\""},
        {"{\"bench\":\"comm\",\"mode\":\"zero3\",\"world\":16,\"node_size\":5,\"units\":8}\n",
         "line 4: world 16, node_size 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "%s%s\n%s", good, good, cases[i].tail);
        write_file(path, text);
        zpp_cost_calib c;
        EXPECT_STATUS(zpp_cost_calibrate(path, 5e-6, NULL, &c), ZPP_ERR_FORMAT);
        EXPECT(strstr(zpp_last_error(), path) && strstr(zpp_last_error(), cases[i].want),
               "case %zu: message '%s' lacks '%s'", i, zpp_last_error(), cases[i].want);
        unlink(path);
    }
    zpp_cost_calib c;
    zpp_cost_in model = small_in();
    /* Only a warm-up train step: nothing to derive. */
    write_file(path, "{\"step\":1,\"tokens_per_s\":100,\"step_ms\":10,"
                     "\"cross_node_bytes\":0,\"intra_node_bytes\":0}\n");
    EXPECT_STATUS(zpp_cost_calibrate(path, 5e-6, &model, &c), ZPP_ERR_FORMAT);
    EXPECT(strstr(zpp_last_error(), "none to derive"), "%s", zpp_last_error());
    unlink(path);
    write_file(path, good);
    EXPECT_STATUS(zpp_cost_calibrate(path, 1.0, NULL, &c), ZPP_ERR_FORMAT); /* 1 s per step */
    EXPECT(strstr(zpp_last_error(), "lower the latency"), "%s", zpp_last_error());
    unlink(path);
    EXPECT_STATUS(zpp_cost_calibrate("/nonexistent/cal.jsonl", 0, NULL, &c), ZPP_ERR_IO);
    /* Train lines: not world 1, no model to count FLOPs, times that do
     * not grow with the tokens; bench lines of two shapes. */
    const struct {
        const char *text, *want;
        int with_model;
    } bad[] = {
        {"{\"step\":3,\"tokens_per_s\":100,\"step_ms\":10,\"cross_node_bytes\":5,"
         "\"intra_node_bytes\":0}\n",
         "line 1: this train step moved bytes (a run on several ranks) but names no mode", 1},
        {"{\"step\":3,\"tokens_per_s\":102400,\"step_ms\":10,\"cross_node_bytes\":0,"
         "\"intra_node_bytes\":0}\n{\"step\":3,\"tokens_per_s\":102400,\"step_ms\":10,"
         "\"mode\":\"zero3\",\"cross_node_bytes\":7,\"intra_node_bytes\":0}\n",
         "line 2: a train line of a 32-rank run after lines of a 1-rank run", 1},
        {"{\"step\":3,\"tokens_per_s\":102400,\"step_ms\":10,\"mode\":\"qwz\","
         "\"cross_node_bytes\":7,\"intra_node_bytes\":0}\n",
         "line 1: a train step of a 32-rank run in mode qwz needs that mode's", 1},
        {"{\"step\":3,\"tokens_per_s\":102400,\"step_ms\":10,\"cross_node_bytes\":0,"
         "\"intra_node_bytes\":0}\n",
         "line 1: a train line needs the model", 0},
        {"{\"step\":3,\"tokens_per_s\":102400,\"step_ms\":10,\"cross_node_bytes\":0,"
         "\"intra_node_bytes\":0}\n{\"step\":3,\"tokens_per_s\":409600,\"step_ms\":5,"
         "\"cross_node_bytes\":0,\"intra_node_bytes\":0}\n",
         "does not grow with the tokens", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i].text);
        EXPECT_STATUS(zpp_cost_calibrate(path, 0, bad[i].with_model ? &model : NULL, &c),
                      ZPP_ERR_FORMAT);
        EXPECT(strstr(zpp_last_error(), bad[i].want), "bad %zu: '%s' lacks '%s'", i,
               zpp_last_error(), bad[i].want);
        unlink(path);
    }
    char two[4096];
    size_t n2 = (size_t)bench_line(two, sizeof two, "zero3", 16, 4, 8, 1e9, 1e10, 5e-6);
    bench_line(two + n2, sizeof two - n2, "qwz", 8, 4, 8, 1e9, 1e10, 5e-6);
    write_file(path, two);
    EXPECT_STATUS(zpp_cost_calibrate(path, 5e-6, NULL, &c), ZPP_ERR_FORMAT);
    EXPECT(strstr(zpp_last_error(), "line 2: world 8") &&
               strstr(zpp_last_error(), "one shape per file"),
           "%s", zpp_last_error());
    unlink(path);
}

/* ---- Random settings ------------------------------------------------------
 * Over random models, node shapes, batches and schedules: predicted bytes
 * are volume.c's counted bytes exactly, more bandwidth (either link) or
 * FLOP/s never slows a mode, and the step lies between its compute and its
 * compute plus every collective back to back. */
static zpp_cost_in random_in(zpp_rng *r) {
    static const int node[] = {1, 2, 3, 4, 8, 16};
    zpp_cost_in in = zpp_cost_in_default();
    if (zpp_rng_uniform(r) < 0.5) { /* a GPT shape */
        in.n_layer = 1 + (int)(zpp_rng_uniform(r) * 48);
        in.n_embd = 64 * (1 + (int)(zpp_rng_uniform(r) * 64));
        in.seq_len = 64 << (int)(zpp_rng_uniform(r) * 6);
        in.vocab = 256 + (int)(zpp_rng_uniform(r) * 60000);
        in.params = zpp_cost_gpt_params(in.n_layer, in.n_embd, in.seq_len, in.vocab);
        in.units = in.n_layer + 1;
    } else {
        in.params = floor(exp(log(1e5) + zpp_rng_uniform(r) * log(1e5))); /* 1e5 .. 1e10 */
        in.units = 1 + (int)(zpp_rng_uniform(r) * 40);
    }
    in.node_size = node[(int)(zpp_rng_uniform(r) * 6)];
    in.world = in.node_size * (1 + (int)(zpp_rng_uniform(r) * 32));
    in.tokens_per_gpu = floor(exp(zpp_rng_uniform(r) * log(65536.0))) + 1;
    in.inter_bps = exp(log(1e8) + zpp_rng_uniform(r) * log(1e4));
    in.intra_bps = exp(log(1e9) + zpp_rng_uniform(r) * log(1e3));
    in.latency_s = zpp_rng_uniform(r) * 2e-5;
    in.flops_per_s = exp(log(1e10) + zpp_rng_uniform(r) * log(1e5));
    in.dtype = zpp_rng_uniform(r) < 0.5 ? ZPP_BF16 : ZPP_FP16;
    in.qgz_inter_exposed = zpp_rng_uniform(r) < 0.5;
    in.serial = zpp_rng_uniform(r) < 0.5;
    in.exposed_frac = in.serial || zpp_rng_uniform(r) < 0.5 ? 0 : zpp_rng_uniform(r);
    in.link_per_comm = zpp_rng_uniform(r) < 0.5;
    in.ranks_per_device = zpp_rng_uniform(r) < 0.5 ? 0 : 1 + 3 * zpp_rng_uniform(r);
    in.opt_s_per_param = zpp_rng_uniform(r) < 0.5 ? 0 : 1e-8 * zpp_rng_uniform(r);
    /* 0 (no rule), the default 1e9, or anything from a unit to the model */
    double u = zpp_rng_uniform(r);
    in.reuse_distance = u < 0.25 ? 0 : u < 0.5 ? 1e9 : floor(in.params * zpp_rng_uniform(r));
    /* the quantization kernels priced (HBM 100 GB/s .. 10 TB/s) or not; recompute */
    in.hbm_bps = zpp_rng_uniform(r) < 0.5 ? 0 : exp(log(1e11) + zpp_rng_uniform(r) * log(1e2));
    in.recompute = zpp_rng_uniform(r) < 0.5;
    return in;
}

static void test_random_consistency(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(15));
    for (int it = 0; it < 300; it++) {
        zpp_cost_in in = random_in(&r);
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            const zpp_coll_mode *md = zpp_coll_mode_get(m);
            zpp_volume v = expected_volume(&in, md);
            zpp_cost_out o = cost(&in, m);
            EXPECT(o.kept_units == kept_ref(&in, NULL), "it %d: kept %d, by hand %d", it,
                   o.kept_units, kept_ref(&in, NULL));
            EXPECT(o.cross_node_bytes == zpp_volume_cross_total(&v) &&
                       o.intra_node_bytes == zpp_volume_intra_total(&v),
                   "it %d %s P %.0f U %d W %d S %d: bytes %.0f/%.0f, counted %.0f/%.0f", it,
                   md->name, in.params, in.units, in.world, in.node_size, o.cross_node_bytes,
                   o.intra_node_bytes, zpp_volume_cross_total(&v), zpp_volume_intra_total(&v));
            EXPECT(o.step_s >= o.compute_s * (1 - 1e-12) &&
                       o.step_s <= (o.compute_s + o.comm_s) * (1 + 1e-12),
                   "it %d %s: step %.6g outside [compute %.6g, + comm %.6g]", it, md->name,
                   o.step_s, o.compute_s, o.comm_s);
            for (int knob = 0; knob < 4; knob++) {
                zpp_cost_in f = in;
                double k = 1 + 10 * zpp_rng_uniform(&r);
                if (knob == 0) f.inter_bps *= k;
                if (knob == 1) f.intra_bps *= k;
                if (knob == 2) f.flops_per_s *= k;
                if (knob == 3) f.hbm_bps *= k;
                double t = cost(&f, m).step_s;
                EXPECT(t <= o.step_s * (1 + 1e-12), "it %d %s knob %d x%.3f: %.9g s > %.9g s",
                       it, md->name, knob, k, t, o.step_s);
            }
        }
    }
}

/* Schedules: ranks sharing a device compute at their share (compute time
 * x R exactly); taking turns (serial) inside one node with no latency is
 * exactly compute + every collective (one link, nothing hidden, nothing
 * concurrent to overlap); the optimizer adds opt_s_per_param x shard to
 * both compute and step. */
static void test_schedules(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(16));
    for (int it = 0; it < 50; it++) {
        zpp_cost_in in = random_in(&r);
        in.ranks_per_device = 0;
        in.opt_s_per_param = 0;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            zpp_cost_out a = cost(&in, m);
            zpp_cost_in sh = in;
            sh.ranks_per_device = 2.5;
            zpp_cost_out b = cost(&sh, m);
            EXPECT(fabs(b.compute_s - 2.5 * a.compute_s) <= 1e-12 * b.compute_s,
                   "it %d: shared compute %.9g vs 2.5 x %.9g", it, b.compute_s, a.compute_s);
            EXPECT(b.step_s >= a.step_s * (1 - 1e-12), "sharing the device made it faster");
            zpp_cost_in one = in;
            one.node_size = one.world; /* one node: intra-node bytes only */
            one.latency_s = 0;
            one.serial = 1;
            one.link_per_comm = 0;
            zpp_cost_out s = cost(&one, m);
            EXPECT(fabs(s.step_s - (s.compute_s + s.comm_s)) <= 1e-9 * s.step_s,
                   "it %d %s: serial step %.9g != compute %.9g + comm %.9g", it,
                   zpp_coll_mode_get(m)->name, s.step_s, s.compute_s, s.comm_s);
            zpp_cost_in ex = one; /* exposed_frac 1 is serial; 0 the overlap */
            ex.serial = 0;
            ex.exposed_frac = 1;
            EXPECT(fabs(cost(&ex, m).step_s - s.step_s) <= 1e-12 * s.step_s,
                   "exposed_frac 1 differs from serial");
            ex.exposed_frac = 0.5;
            double half = cost(&ex, m).step_s;
            ex.exposed_frac = 0;
            EXPECT(half <= s.step_s * (1 + 1e-12) && half >= cost(&ex, m).step_s * (1 - 1e-12),
                   "exposed_frac 0.5 outside overlap..serial");
            zpp_cost_in op = in;
            op.opt_s_per_param = 3e-9;
            zpp_cost_out o = cost(&op, m);
            double shard = (o.mem_shard_state / 16);
            EXPECT(fabs(o.opt_s - 3e-9 * shard) <= 1e-9 * o.opt_s &&
                       fabs(o.step_s - a.step_s - o.opt_s) <= 1e-9 * o.step_s &&
                       fabs(o.compute_s - a.compute_s - o.opt_s) <= 1e-9 * o.compute_s,
                   "it %d: optimizer %.9g, step %.9g vs %.9g", it, o.opt_s, o.step_s, a.step_s);
        }
    }
}

/* Measured collective times (bench comm lines with known phase times):
 * with the calibration on the same world and node size, a serial step is
 * compute + the phases' times scaled by params / the line's params, the
 * backward gather's by the parameters gathered again only (at distance 0 all;
 * at the default none: the 5 units of 40.7M have at most 2 x 4 x 40.7M =
 * 326M in between, so all stay); on another world they are not used (the
 * link formula). */
static void test_calibrated_collectives(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(17));
    const char *modes[] = {"zero3", "qwz", "hpz", "qgz", "zeropp"};
    double t[5][3];
    char text[8192], path[64];
    size_t n = 0;
    const double lp = 28574208;
    for (int m = 0; m < 5; m++) {
        for (int k = 0; k < 3; k++) t[m][k] = 1 + 100 * zpp_rng_uniform(&r);
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "{\"bench\":\"comm\",\"mode\":\"%s\",\"world\":4,\"node_size\":2,"
                              "\"units\":5,\"params\":%.0f,\"fwd_gather_ms\":%.17g,"
                              "\"bwd_gather_ms\":%.17g,\"grad_reduce_ms\":%.17g,"
                              "\"fwd_gather_cross_bytes\":10,\"fwd_gather_intra_bytes\":10,"
                              "\"bwd_gather_cross_bytes\":%d,\"bwd_gather_intra_bytes\":10}\n",
                              modes[m], lp, t[m][0], t[m][1], t[m][2],
                              (m == 2 || m == 4) ? 0 : 10);
    }
    write_file(path, text);
    zpp_cost_calib c;
    EXPECT_OK(zpp_cost_calibrate(path, 0, NULL, &c));
    unlink(path);
    EXPECT(c.coll_world == 4 && c.coll_node_size == 2 && c.coll_units == 5, "shape");
    zpp_cost_in in = small_in();
    in.world = 4;
    in.node_size = 2;
    in.units = 5;
    in.serial = 1;
    in.latency_s = 0;
    in.calib = &c;
    EXPECT(kept_ref(&in, NULL) == 5, "all 5 units kept at the default distance");
    for (int m = 0; m < 10; m++) {
        in.reuse_distance = m < 5 ? 0 : 1e9;
        const double bwd_params = m < 5 ? in.params : 0;
        EXPECT(c.has_mode[m % 5], "mode %s not measured", modes[m % 5]);
        zpp_cost_out o = cost(&in, m % 5);
        double want = o.compute_s + (t[m % 5][0] + t[m % 5][2]) * 1e-3 * in.params / lp +
                      t[m % 5][1] * 1e-3 * bwd_params / lp;
        EXPECT(fabs(o.step_s - want) <= 1e-9 * want, "%s: step %.9g, want %.9g", modes[m % 5],
               o.step_s, want);
    }
    for (int m = 0; m < 5; m++) {
        zpp_cost_in other = in;
        other.world = 8; /* not what was measured: the link formula, as without */
        zpp_cost_out a = cost(&other, m);
        other.calib = NULL;
        zpp_cost_out b = cost(&other, m);
        EXPECT(a.step_s == b.step_s, "%s: calibration used on another world", modes[m]);
    }
}

/* The compute rate from world-1 train lines made from a known rate and
 * optimizer time: recovered from three micro-batches (the fit), and from
 * one (the optimizer folded into the rate). Step 1 and skipped steps are
 * left out. */
static void test_calibrate_compute(void) {
    zpp_cost_in model = small_in();
    zpp_cost_in one = model;
    one.tokens_per_gpu = 1;
    const double fpt = zpp_cost_step_flops(&one), rate = 3.7e12, opt = 2.5e-9;
    char text[8192], path[64];
    size_t n = 0;
    for (int b = 1; b <= 4; b *= 2)
        for (int step = 1; step <= 4; step++) {
            double tok = (double)b * model.seq_len;
            double sec = tok * fpt / rate + model.params * opt;
            if (step == 1) sec *= 5; /* warm-up: ignored */
            int skipped = step == 3 && b == 2;
            if (skipped) sec *= 0.1; /* no update: ignored */
            n += (size_t)snprintf(text + n, sizeof text - n,
                                  "{\"step\":%d,\"tokens_per_s\":%.17g,\"step_ms\":%.17g,"
                                  "\"cross_node_bytes\":0,\"intra_node_bytes\":0,"
                                  "\"skipped\":%s}\n",
                                  step, tok / sec, sec * 1e3, skipped ? "true" : "false");
        }
    write_file(path, text);
    zpp_cost_calib c;
    EXPECT_OK(zpp_cost_calibrate(path, 0, &model, &c));
    unlink(path);
    EXPECT(c.train_lines == 8 && c.train_points == 3, "lines %d points %d", c.train_lines,
           c.train_points);
    EXPECT(fabs(c.flops_per_s / rate - 1) < 1e-6, "rate %.9g vs %.9g", c.flops_per_s, rate);
    EXPECT(fabs(c.opt_s_per_param / opt - 1) < 1e-6, "opt %.9g vs %.9g", c.opt_s_per_param, opt);
    /* One micro-batch: the rate holds the optimizer. */
    n = 0;
    double tok = 2.0 * model.seq_len, sec = tok * fpt / rate + model.params * opt;
    for (int step = 2; step <= 4; step++)
        n += (size_t)snprintf(text + n, sizeof text - n,
                              "{\"step\":%d,\"tokens_per_s\":%.17g,\"step_ms\":%.17g,"
                              "\"cross_node_bytes\":0,\"intra_node_bytes\":0}\n",
                              step, tok / sec, sec * 1e3);
    write_file(path, text);
    EXPECT_OK(zpp_cost_calibrate(path, 0, &model, &c));
    unlink(path);
    EXPECT(c.train_points == 1 && c.opt_s_per_param == 0 &&
               fabs(c.flops_per_s / (tok * fpt / sec) - 1) < 1e-9,
           "one point: rate %.9g", c.flops_per_s);
    /* Lines of a run on the model's W ranks (bytes moved): tokens a rank are
     * the global tokens / W; the time is the wall step less the mode's
     * measured collectives (a bench comm line of the same world and node
     * size, per parameter x the parameters the run moved); the intercept is
     * per element of the rank's shard, P / W. The run trained at the default
     * reuse distance, which keeps all 13 units of this 204M model (at most
     * 2 x 12 x 15.7M = 377M in between): its backward gathered nothing, so
     * only the forward gather and the reduction are taken out. */
    n = 0;
    const double W = model.world, lp = 1e6, ph[3] = {3, 4, 5}; /* ms for lp parameters */
    EXPECT(kept_ref(&model, NULL) == model.units, "every unit kept");
    const double coll = (ph[0] + ph[2]) * 1e-3 * model.params / lp;
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "{\"bench\":\"comm\",\"mode\":\"qgz\",\"world\":%d,"
                          "\"node_size\":%d,\"units\":5,\"params\":%.0f,\"fwd_gather_ms\":%g,"
                          "\"bwd_gather_ms\":%g,\"grad_reduce_ms\":%g}\n",
                          model.world, model.node_size, lp, ph[0], ph[1], ph[2]);
    for (int b = 1; b <= 4; b *= 2)
        for (int step = 2; step <= 4; step++) {
            double tk = (double)b * model.seq_len;
            double wall = tk * fpt / rate + model.params / W * opt + coll;
            n += (size_t)snprintf(text + n, sizeof text - n,
                                  "{\"step\":%d,\"mode\":\"qgz\",\"tokens_per_s\":%.17g,"
                                  "\"step_ms\":%.17g,\"cross_node_bytes\":123,"
                                  "\"intra_node_bytes\":456}\n",
                                  step, W * tk / wall, wall * 1e3);
        }
    write_file(path, text);
    EXPECT_OK(zpp_cost_calibrate(path, 0, &model, &c));
    unlink(path);
    EXPECT(c.train_world == model.world && c.train_points == 3 &&
               fabs(c.flops_per_s / rate - 1) < 1e-6 && fabs(c.opt_s_per_param / opt - 1) < 1e-6,
           "W ranks: world %d, %d points, rate %.9g, opt %.9g", c.train_world, c.train_points,
           c.flops_per_s, c.opt_s_per_param);
    /* The same run profiled (--profile: compute_ms, the compute stream's own
     * time) on ranks where the collectives hide under compute (GPU ranks):
     * the wall step is shorter than the collectives, and the compute is
     * compute_ms itself, nothing subtracted. Without compute_ms these lines
     * are refused (the step is no longer than the collectives). */
    for (int profiled = 1; profiled >= 0; profiled--) {
        n = (size_t)snprintf(text, sizeof text,
                             "{\"bench\":\"comm\",\"mode\":\"qgz\",\"world\":%d,"
                             "\"node_size\":%d,\"units\":5,\"params\":%.0f,"
                             "\"fwd_gather_ms\":%g,\"bwd_gather_ms\":%g,\"grad_reduce_ms\":%g}\n",
                             model.world, model.node_size, lp, ph[0], ph[1], ph[2]);
        for (int b = 1; b <= 4; b *= 2)
            for (int step = 2; step <= 4; step++) {
                double tk = (double)b * model.seq_len;
                double comp = tk * fpt / rate + model.params / W * opt, wall = 0.5 * coll;
                n += (size_t)snprintf(text + n, sizeof text - n,
                                      "{\"step\":%d,\"mode\":\"qgz\",\"tokens_per_s\":%.17g,"
                                      "\"step_ms\":%.17g,\"cross_node_bytes\":123,"
                                      "\"intra_node_bytes\":456",
                                      step, W * tk / wall, wall * 1e3);
                if (profiled)
                    n += (size_t)snprintf(text + n, sizeof text - n, ",\"compute_ms\":%.17g",
                                          comp * 1e3);
                n += (size_t)snprintf(text + n, sizeof text - n, "}\n");
            }
        write_file(path, text);
        if (profiled) {
            EXPECT_OK(zpp_cost_calibrate(path, 0, &model, &c));
            EXPECT(c.train_points == 3 && fabs(c.flops_per_s / rate - 1) < 1e-6 &&
                       fabs(c.opt_s_per_param / opt - 1) < 1e-6,
                   "profiled W ranks: %d points, rate %.9g, opt %.9g", c.train_points,
                   c.flops_per_s, c.opt_s_per_param);
        } else {
            EXPECT_STATUS(zpp_cost_calibrate(path, 0, &model, &c), ZPP_ERR_FORMAT);
            EXPECT(strstr(zpp_last_error(), "no longer than") != NULL, "message: %s",
                   zpp_last_error());
        }
        unlink(path);
    }
}

/* ---- The GPU steps measured on one H200 (bench/RESULTS.md, sixth session)
 * Two ranks as two emulated nodes (node size 1) sharing ONE H200, NCCL over
 * sockets, GPT 1.31B (24 x 2048, T 1024, V 50304), micro-batch 4, bf16. The
 * inputs, all measured on that machine, not fitted to the steps:
 *  - compute: the world-1 step, 97 ms for 4 x 1024 tokens (run Z: 42,087
 *    tokens/s), so 3.58e14 FLOP/s with the optimizer folded in; two ranks
 *    time-share the GPU: ranks_per_device 2;
 *  - link: NCCL's bf16 all-gather and reduce-scatter of 1 GiB between two
 *    ranks on one GPU, 289.6 ms each (run Q): 2^29 bytes a rank in 289.6 ms;
 *  - schedule: serial (a rank's kernels stall the other rank's NCCL
 *    kernels: the GPU time-slices between the two processes); one stream
 *    (runs X, Z, AA "one"): gathers and reductions share the link; two
 *    streams (run AA "two"): each communicator its own sockets.
 * Measured steps: ZeRO-3 one stream 2,325 ms (run Z, 3,524 tokens/s; run X
 * 2,327 = 187.6 + 2,139); qwZ + qgZ (the race's "ZeRO++", hpZ off at one
 * rank a node) one stream 1,108 ms, two streams 919 ms (run AA). All three
 * runs predate the reuse rule across the forward->backward boundary (engine
 * commit a517b6e): every block was gathered again in the backward, so their
 * reuse distance is 0; each point below names its own. */
static void test_measured_gpu_steps(void) {
    zpp_cost_in in = gpt_1p3b_two_nodes();
    in.reuse_distance = 0;
    in.n_head = 16;
    in.flops_per_s = zpp_cost_step_flops(&in) / 0.0973;
    in.ranks_per_device = 2;
    in.inter_bps = 536870912.0 / 0.2896;
    in.intra_bps = in.inter_bps; /* no intra-node bytes at one rank a node */
    in.latency_s = 0;
    in.serial = 1;
    /* The quantization kernels at the H200's HBM3e (4800 GB/s) x 0.78, as
     * `zeropp plan --gpu h200`: a few ms of these steps. */
    in.hbm_bps = 4800e9 * 0.78;
    const zpp_coll_mode qwz_qgz = {"qwz+qgz", ZPP_GATHER_QWZ, 0, ZPP_REDUCE_QGZ};
    /* Runs X, Z and AA (sixth session) predate the reuse rule across the
     * boundary: distance 0. The eighth session's calls 1 and 3 (bench/
     * RESULTS.md): two streams, before (83912d0, which kept only the last
     * unit: distance 0 here is one unit's gather off) and after it
     * (a517b6e, default distance), micro-batch 4 step = 8192 / tokens/s. */
    const struct {
        const char *what;
        const zpp_coll_mode *mode;
        int link_per_comm;
        double reuse, measured_s;
    } pt[] = {
        {"ZeRO-3, one stream (Z)", zpp_coll_mode_get(0), 0, 0, 2.325},
        {"qwZ+qgZ, one stream (AA)", &qwz_qgz, 0, 0, 1.108},
        {"qwZ+qgZ, two streams (AA)", &qwz_qgz, 1, 0, 0.919},
        {"ZeRO-3, two streams (8th, call 1)", zpp_coll_mode_get(0), 1, 0, 1.662},
        {"qwZ+qgZ, two streams (8th, call 1)", &qwz_qgz, 1, 0, 0.883},
        {"ZeRO-3, two streams, reuse 1e9 (8th, call 3)", zpp_coll_mode_get(0), 1, 1e9,
         8192 / 5030.5},
        {"qwZ+qgZ, two streams, reuse 1e9 (8th, call 3)", &qwz_qgz, 1, 1e9, 8192 / 10408.9},
    };
    for (size_t i = 0; i < sizeof pt / sizeof pt[0]; i++) {
        zpp_cost_in c = in;
        c.link_per_comm = pt[i].link_per_comm;
        c.reuse_distance = pt[i].reuse;
        zpp_cost_out o;
        EXPECT_OK(zpp_cost_step(&c, pt[i].mode, &o));
        double err = o.step_s / pt[i].measured_s - 1;
        printf("GPU %s: predicted %.0f ms (compute %.0f), measured %.0f ms: %+.1f%%\n",
               pt[i].what, o.step_s * 1e3, o.compute_s * 1e3, pt[i].measured_s * 1e3, 100 * err);
        EXPECT(fabs(err) <= 0.15, "%s: %+.1f%% off", pt[i].what, 100 * err);
    }
    /* The reuse rule across the boundary (default distance: 10 of the 25
     * units make no backward gather), two streams, for the record: with
     * ZeRO-3 the backward stays bound by the bf16 reduce-scatter on its own
     * link, so keeping units gains little; with qwZ + qgZ the gathers were
     * the larger share and the gain is larger. */
    double gain[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        zpp_cost_in c = in;
        c.link_per_comm = 1;
        const zpp_coll_mode *md = m ? &qwz_qgz : zpp_coll_mode_get(0);
        zpp_cost_out a, b;
        EXPECT_OK(zpp_cost_step(&c, md, &a));
        c.reuse_distance = 1e9;
        EXPECT_OK(zpp_cost_step(&c, md, &b));
        printf("GPU %s, two streams, reuse distance 0 -> 1e9 (%d units kept): %.0f -> %.0f "
               "ms, tokens/s x %.3f\n",
               md->name, b.kept_units, a.step_s * 1e3, b.step_s * 1e3, a.step_s / b.step_s);
        gain[m] = a.step_s / b.step_s;
    }
    EXPECT(gain[0] >= 1 && gain[1] > gain[0], "gains x %.3f (ZeRO-3), x %.3f (qwZ+qgZ)", gain[0],
           gain[1]);
    /* Without the shared-GPU schedule (communication under compute, the
     * compute still time-shared), for the record: the schedule is the
     * difference for ZeRO++, whose compute is a fifth of its step. */
    for (size_t i = 0; i < sizeof pt / sizeof pt[0]; i++) {
        zpp_cost_in c = in;
        c.link_per_comm = pt[i].link_per_comm;
        c.reuse_distance = pt[i].reuse;
        c.serial = 0;
        zpp_cost_out o;
        EXPECT_OK(zpp_cost_step(&c, pt[i].mode, &o));
        printf("GPU %s with overlap: predicted %.0f ms, measured %.0f ms: %+.1f%%\n",
               pt[i].what, o.step_s * 1e3, pt[i].measured_s * 1e3,
               100 * (o.step_s / pt[i].measured_s - 1));
    }
}

/* ---- What the engine's schedule cannot hide, by hand ----------------------
 * Two units of 1e6 elements, bf16, two ranks as two nodes, ZeRO-3, reuse 0.
 * Each collective moves (W-1)/W x 2e6 = 1e6 bytes per node across; at 1e9
 * B/s and 10 us a ring step (W - 1 = 1 step) it takes 1.01 ms. Compute
 * 6 x 2e6 FLOPs at 1.2e10 FLOP/s = 1 ms: forward 1/6 ms a unit, backward
 * 1/3 ms a unit. The recurrence:
 *   forward  g0 + max(f0, g1) + max(f1, h1)            = 3 x 1.01 = 3.03 ms
 *   backward max(b1, h0) + max(b0, r1) + r0            = 3 x 1.01 = 3.03 ms
 * With the link 100x faster (0.02 ms a collective) everything hides except
 * the first gather and the last reduction: 1 ms + 0.02 + 0.02 = 1.04 ms. */
static void test_unhidden_parts(void) {
    zpp_cost_in in = zpp_cost_in_default();
    in.params = 2e6;
    in.units = 2;
    in.world = 2;
    in.node_size = 1;
    in.tokens_per_gpu = 1;
    in.flops_per_s = 1.2e10;
    in.inter_bps = 1e9;
    in.intra_bps = 1e9;
    in.latency_s = 1e-5;
    in.reuse_distance = 0;
    zpp_cost_out o = cost(&in, 0);
    EXPECT(fabs(o.fwd_s - 3.03e-3) <= 1e-12 && fabs(o.bwd_s - 3.03e-3) <= 1e-12 &&
               fabs(o.step_s - 6.06e-3) <= 1e-12 && fabs(o.compute_s - 1e-3) <= 1e-12,
           "slow link: forward %.9g, backward %.9g, step %.9g, compute %.9g", o.fwd_s, o.bwd_s,
           o.step_s, o.compute_s);
    in.inter_bps = 1e11;
    o = cost(&in, 0);
    EXPECT(fabs(o.step_s - 1.04e-3) <= 1e-12 && fabs(o.exposed_comm_s - 0.04e-3) <= 1e-12,
           "fast link: step %.9g, exposed %.9g (the first gather + the last reduction)",
           o.step_s, o.exposed_comm_s);
}

/* ---- The collectives' memory-bound kernels (DESIGN.md §11, "Kernels") ------
 * By hand, for a unit of 1024 elements on 4 ranks as 2 nodes of 2, bf16:
 * shard s = 256, n = 1024, e = 2; the default specs (int8 block 256, int4
 * block 128, fp32 scales, quant_layout.h rounds a buffer to 16 bytes):
 * q8(256) = 256 + 4 -> 272, q4(256) = 128 + 8 -> 144.
 *   qwZ gather: s e + q8 + W q8 + n e = 512 + 272 + 1088 + 2048 = 3920;
 *   hpZ copy of the node's slice (H = 2: W/H = 2 shards): 2 e 2 s = 2048;
 *   qgZ, two hops: (n e + W q4) + (W q4 + N q4) + (N q4 + 4 s)
 *     = (2048 + 576) + (576 + 288) + (288 + 1024) = 4800;
 *   qgZ, one hop (4 nodes of 1): (2048 + 576) + (576 + 1024) = 4224. */
static void test_kernel_bytes(void) {
    zpp_cost_in in = zpp_cost_in_default();
    in.world = 4;
    in.node_size = 2;
    in.dtype = ZPP_BF16;
    EXPECT(zpp_quant_bytes(256, &in.coll.weight_spec) == 272 &&
               zpp_quant_bytes(256, &in.coll.grad_spec) == 144,
           "layout: q8(256) %zu, q4(256) %zu", zpp_quant_bytes(256, &in.coll.weight_spec),
           zpp_quant_bytes(256, &in.coll.grad_spec));
    const zpp_phase F = ZPP_PHASE_FWD_GATHER, B = ZPP_PHASE_BWD_GATHER, R = ZPP_PHASE_GRAD_REDUCE;
    const struct {
        int mode;
        double fwd, bwd, red;
    } want[] = {
        {0, 0, 0, 0},          /* zero3: NCCL's own kernels, inside the collective */
        {1, 3920, 3920, 0},    /* qwz: both gathers quantized */
        {2, 2048, 0, 0},       /* hpz: the copy; the backward gather is bf16 */
        {3, 0, 0, 4800},       /* qgz */
        {4, 5968, 0, 4800},    /* zeropp: qwZ + the copy forward, bf16 hpZ backward */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const zpp_coll_mode *md = zpp_coll_mode_get(want[i].mode);
        double f = zpp_cost_kernel_bytes(&in, md, 1024, F), b = zpp_cost_kernel_bytes(&in, md, 1024, B),
               r = zpp_cost_kernel_bytes(&in, md, 1024, R);
        EXPECT(f == want[i].fwd && b == want[i].bwd && r == want[i].red,
               "%s: %.0f %.0f %.0f, by hand %.0f %.0f %.0f", md->name, f, b, r, want[i].fwd,
               want[i].bwd, want[i].red);
    }
    in.node_size = 1; /* one hop, no requantization */
    EXPECT(zpp_cost_kernel_bytes(&in, zpp_coll_mode_get(3), 1024, R) == 4224, "one hop: %.0f",
           zpp_cost_kernel_bytes(&in, zpp_coll_mode_get(3), 1024, R));
    in.world = in.node_size = 1; /* no collective runs */
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        EXPECT(zpp_cost_kernel_bytes(&in, zpp_coll_mode_get(m), 1024, F) == 0 &&
                   zpp_cost_kernel_bytes(&in, zpp_coll_mode_get(m), 1024, R) == 0,
               "world 1, %s: kernels", zpp_coll_mode_get(m)->name);
}

/* The kernels add to the stage they run in and hide under nothing, so the
 * step grows by exactly their bytes over the HBM rate (x the device share),
 * summed over the units as the step runs them: every forward gather, the
 * backward gathers of the units not kept, every reduction. quant_s says the
 * same. A mode with measured collective times pays none (they hold them). */
static void test_kernel_time(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(17));
    for (int it = 0; it < 60; it++) {
        zpp_cost_in in = random_in(&r);
        in.hbm_bps = 0;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            const zpp_coll_mode *md = zpp_coll_mode_get(m);
            zpp_cost_out a = cost(&in, m);
            zpp_cost_in k = in;
            k.hbm_bps = 1e11 * (1 + zpp_rng_uniform(&r));
            zpp_cost_out b = cost(&k, m);
            const int U = in.units, kept = zpp_cost_kept_units(&in);
            double bytes = 0;
            for (int u = 0; u < U; u++) {
                size_t n = zpp_plan_unit_numel((size_t)in.params, U, u);
                bytes += zpp_cost_kernel_bytes(&k, md, n, ZPP_PHASE_FWD_GATHER) +
                         zpp_cost_kernel_bytes(&k, md, n, ZPP_PHASE_GRAD_REDUCE);
                if (u < U - kept) bytes += zpp_cost_kernel_bytes(&k, md, n, ZPP_PHASE_BWD_GATHER);
            }
            const double share = in.ranks_per_device > 1 ? in.ranks_per_device : 1;
            const double want = bytes / k.hbm_bps * share;
            EXPECT(fabs(b.quant_s - want) <= 1e-9 * want + 1e-15 &&
                       fabs((b.step_s - a.step_s) - want) <= 1e-9 * b.step_s,
                   "it %d %s: step +%.9g s, quant_s %.9g, by hand %.9g", it, md->name,
                   b.step_s - a.step_s, b.quant_s, want);
            EXPECT(a.quant_s == 0 && b.compute_s == a.compute_s, "it %d %s", it, md->name);
        }
    }
    /* Measured on this world and node size: no kernel term. */
    zpp_cost_calib cal;
    memset(&cal, 0, sizeof cal);
    zpp_cost_in in = small_in();
    cal.coll_world = in.world;
    cal.coll_node_size = in.node_size;
    cal.coll_units = in.units;
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        cal.has_mode[m] = 1;
        for (int k = 0; k < 3; k++) cal.coll_s_per_param[m][k] = 1e-11 * (k + 1);
    }
    in.calib = &cal;
    zpp_cost_out a = cost(&in, 4);
    in.hbm_bps = 1e9;
    zpp_cost_out b = cost(&in, 4);
    EXPECT(b.quant_s == 0 && b.step_s == a.step_s, "calibrated: quant_s %.6g", b.quant_s);
}

/* Activation checkpointing: the backward recomputes the forward, so the
 * compute is 4/3 of the model's; at world 1 (nothing to communicate) the
 * step is exactly that; the FLOP count (and TFLOP/s of the model) stays;
 * the activation memory is the checkpointed model's. */
static void test_recompute(void) {
    zpp_cost_in in = small_in();
    in.world = in.node_size = 1;
    zpp_cost_out a = cost(&in, 0);
    in.recompute = 1;
    zpp_cost_out b = cost(&in, 0);
    const double model_s = a.flops_per_gpu / in.flops_per_s;
    EXPECT(fabs(a.step_s - model_s) <= 1e-12 * model_s &&
               fabs(b.step_s - model_s * 4 / 3) <= 1e-12 * model_s &&
               fabs(b.compute_s - model_s * 4 / 3) <= 1e-12 * model_s &&
               b.flops_per_gpu == a.flops_per_gpu,
           "recompute: step %.9g (want %.9g), compute %.9g", b.step_s, model_s * 4 / 3,
           b.compute_s);
    EXPECT(fabs(b.fwd_s - model_s / 3) <= 1e-12 * model_s &&
               fabs(b.bwd_s - model_s) <= 1e-12 * model_s,
           "recompute: forward %.9g, backward %.9g of %.9g", b.fwd_s, b.bwd_s, model_s);
    /* Activations: a layer keeps its fp32 residual input alone (4C bytes a
     * token), the rest being one layer's slab all share (gpt2_cuda.cu,
     * CHECKPOINTING): L-1 slabs of mid 4C, qkv + atty + fch 8C e, LayerNorm
     * statistics 16 and the fused attention's lse 4H bytes a token fewer. */
    const double C = in.n_embd, e = (double)zpp_dtype_size(in.dtype), H = floor(C / 64);
    const double want = (in.n_layer - 1) * in.tokens_per_gpu * (4 * C + 8 * C * e + 16 + 4 * H);
    EXPECT(fabs(a.mem_acts - b.mem_acts - want) <= 1e-12 * a.mem_acts,
           "recompute saves %.0f bytes of activations, want %.0f", a.mem_acts - b.mem_acts, want);
}

/* Resident weights (engine.c): at world 1 with the plain gather and no
 * hpZ the model stays whole in the working dtype (e bytes a padded
 * parameter, mem_kept) and no unit is gathered into scratch (the transient
 * loses its (1 + prefetch_depth) gathered units); under qwZ or hpZ, or over
 * more than one rank, nothing changes. Times never change. */
static void test_resident_weights(void) {
    zpp_cost_in in = small_in();
    in.world = in.node_size = 1;
    const double e = (double)zpp_dtype_size(in.dtype);
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        const zpp_coll_mode *md = zpp_coll_mode_get(m);
        zpp_cost_in r = in;
        r.resident_weights = 1;
        zpp_cost_out a = cost(&in, m), b = cost(&r, m);
        const int applies = md->gather == ZPP_GATHER_BASELINE && !md->hpz;
        double padded = 0, largest = 0;
        for (int i = 0; i < in.units; i++) {
            const double p = (double)zpp_partition_make_shape(
                                 zpp_plan_unit_numel((size_t)in.params, in.units, i), 1, 1)
                                 .padded;
            padded += p;
            if (p > largest) largest = p;
        }
        const double ahead = in.prefetch_depth > 0 ? in.prefetch_depth : 2;
        const double want_kept = applies ? e * padded : 0;
        const double want_fall = applies ? (1 + ahead) * e * largest : 0;
        EXPECT(b.mem_kept == want_kept && fabs(a.mem_transient - b.mem_transient - want_fall) <=
                                              1e-12 * a.mem_transient,
               "%s: kept %.0f (want %.0f), transient fell by %.0f (want %.0f)", md->name,
               b.mem_kept, want_kept, a.mem_transient - b.mem_transient, want_fall);
        EXPECT(a.step_s == b.step_s, "%s: resident weights changed the time", md->name);
    }
    zpp_cost_in w2 = in;
    w2.world = w2.node_size = 2;
    zpp_cost_in w2r = w2;
    w2r.resident_weights = 1;
    zpp_cost_out a = cost(&w2, 0), b = cost(&w2r, 0);
    EXPECT(!memcmp(&a, &b, sizeof a), "world 2: resident weights changed the plan");
}

/* bf16 gradient accumulators (work_grads): at world 1 in bf16 the shard
 * state is 14 bytes a parameter instead of 16, whatever the mode; in fp32,
 * or over two ranks, nothing changes. */
static void test_work_grads(void) {
    zpp_cost_in in = small_in();
    in.world = in.node_size = 1;
    in.dtype = ZPP_BF16;
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        zpp_cost_in w = in;
        w.work_grads = 1;
        const zpp_cost_out a = cost(&in, m), b = cost(&w, m);
        EXPECT(fabs(b.mem_shard_state - a.mem_shard_state * 14.0 / 16.0) <=
                   1e-12 * a.mem_shard_state,
               "mode %d: shard state %.0f with bf16 accumulators, %.0f without", m,
               b.mem_shard_state, a.mem_shard_state);
        EXPECT(b.mem_bytes_per_rank - a.mem_bytes_per_rank ==
                   b.mem_shard_state - a.mem_shard_state,
               "mode %d: work_grads changed more than the shard state", m);
    }
    for (int k = 0; k < 2; k++) {
        zpp_cost_in o = in;
        if (k == 0) o.dtype = ZPP_FP32;
        else o.world = o.node_size = 2;
        zpp_cost_in w = o;
        w.work_grads = 1;
        const zpp_cost_out a = cost(&o, 0), b = cost(&w, 0);
        EXPECT(!memcmp(&a, &b, sizeof a), "%s: work_grads changed the plan",
               k == 0 ? "fp32" : "world 2");
    }
}

/* A restricted pick chooses the fastest fitting candidate among those
 * allowed (checked against a loop over them), never another; bad lists
 * are refused. */
static void test_pick_filter(void) {
    zpp_cost_in in = small_in();
    in.hbm_bps = 700e9;
    const int mbs[] = {1, 3, 8}, hpz[] = {8};
    const unsigned masks[] = {1u << 0, (1u << 1) | (1u << 3), (1u << 2) | (1u << 4), 0};
    for (size_t k = 0; k < sizeof masks / sizeof masks[0]; k++) {
        zpp_cost_pick_filter f = {masks[k], mbs, 3, hpz, 1};
        zpp_cost_pick_result r;
        EXPECT_OK(zpp_cost_pick_only(&in, 1e15, 0, &f, &r));
        double best = 0;
        int count = 0;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            if (masks[k] && !(masks[k] & (1u << m))) continue;
            for (int b = 0; b < 3; b++) {
                zpp_cost_in c = in;
                c.tokens_per_gpu = (double)mbs[b] * in.seq_len;
                c.hpz_size = zpp_coll_mode_get(m)->hpz ? 8 : 0;
                double t = cost(&c, m).tokens_per_s;
                if (t > best) best = t;
                count++;
            }
        }
        EXPECT(r.candidates == count && r.fitting == count, "mask %u: %d candidates, want %d",
               masks[k], r.candidates, count);
        EXPECT(r.best.out.tokens_per_s == best && (!masks[k] || (masks[k] & (1u << r.best.mode))) &&
                   (r.best.micro_batch == 1 || r.best.micro_batch == 3 || r.best.micro_batch == 8) &&
                   (!r.best.hpz_size || r.best.hpz_size == 8),
               "mask %u: picked %s mb %d H %d at %.6g tokens/s, best allowed %.6g", masks[k],
               zpp_coll_mode_get(r.best.mode)->name, r.best.micro_batch, r.best.hpz_size,
               r.best.out.tokens_per_s, best);
    }
    zpp_cost_pick_result r;
    const int down[] = {4, 2}, bad_h[] = {3};
    zpp_cost_pick_filter f = {0, down, 2, NULL, 0};
    EXPECT_STATUS(zpp_cost_pick_only(&in, 1e15, 0, &f, &r), ZPP_ERR_INVALID);
    zpp_cost_pick_filter g = {0, NULL, 0, bad_h, 1};
    EXPECT_STATUS(zpp_cost_pick_only(&in, 1e15, 0, &g, &r), ZPP_ERR_INVALID);
    zpp_cost_pick_filter h = {1u << 2, NULL, 0, NULL, 0};
    in.node_size = 1; /* hpZ only, with no node to keep a copy in: nothing to pick */
    EXPECT_STATUS(zpp_cost_pick_only(&in, 1e15, 0, &h, &r), ZPP_ERR_CONFIG);
}

/* ---- The published ZeRO++ figures (DeepSpeed ZeRO++ blog and paper) ------
 * 384 V100 = 24 nodes of 16, fp16. The assumptions, once, for every point:
 * V100 125 TFLOP/s fp16 tensor peak x 0.4 = 50 TFLOP/s achieved; NVLink
 * (NVSwitch) 150 GB/s per GPU per direction; both links at 0.8 of line
 * rate; 5 us per collective step; DeepSpeed's schedule (qgZ pipelined).
 * Shapes: 18B = 40 layers x 6144, sequence 512 (DeepSpeed's ZeRO++
 * tutorial, docs/_tutorials/zeropp.md: --num-layers 40 --hidden-size 6144
 * --seq-length 512; 18.4B with vocabulary 50257); 138B = 48 x 15360 (our
 * choice, 136.7B). From the same tutorial's command and log, the runs'
 * settings (DESIGN.md §11 cites them):
 *   activation checkpointing (--checkpoint-activations): recompute = 1;
 *   the optimizer: 139.5 ms a step on 64 GPUs (ZeRO-3 log, step 40),
 *     i.e. 139.5 ms / (P / 64) a parameter of a shard;
 * and the quantization kernels priced at the V100's HBM2, 900 GB/s x 0.78
 * (our kernels' measured share of the datasheet, DESIGN.md §11). */
static zpp_cost_in paper_in(int big, double gbps, double tokens) {
    zpp_cost_in in = zpp_cost_in_default();
    in.n_layer = big ? 48 : 40;
    in.n_embd = big ? 15360 : 6144;
    in.seq_len = 512;
    in.vocab = 50257;
    in.params = zpp_cost_gpt_params(in.n_layer, in.n_embd, in.seq_len, in.vocab);
    in.units = in.n_layer + 1;
    in.world = 384;
    in.node_size = 16;
    in.tokens_per_gpu = tokens;
    in.inter_bps = gbps * 1e9 / 8 * 0.8;
    in.intra_bps = 1200e9 / 8 * 0.8;
    in.latency_s = 5e-6;
    in.flops_per_s = 125e12 * 0.4;
    in.dtype = ZPP_FP16;
    in.qgz_inter_exposed = 0;
    in.recompute = 1;
    in.opt_s_per_param = 0.1395 / (zpp_cost_gpt_params(40, 6144, 512, 50257) / 64);
    in.hbm_bps = 900e9 * 0.78;
    return in;
}

static double speedup_e(int big, double gbps, double tokens, double exposed) {
    zpp_cost_in in = paper_in(big, gbps, tokens);
    in.exposed_frac = exposed;
    return cost(&in, 0).step_s / cost(&in, 4).step_s;
}

/* ZeRO++ at 200 Gb/s over ZeRO-3 at 800 Gb/s, TFLOP/s. */
static double cross_ratio(int big, double tokens, double exposed) {
    zpp_cost_in a = paper_in(big, 200, tokens), b = paper_in(big, 800, tokens);
    a.exposed_frac = b.exposed_frac = exposed;
    return cost(&a, 4).tflops_per_gpu / cost(&b, 0).tflops_per_gpu;
}

/* Within 15% of the published range [lo, hi] (of its nearer end). */
static int near_range(double x, double lo, double hi) {
    return x >= lo * 0.85 && x <= hi * 1.15;
}

/* The published points. `fig`: the blog's bar charts (blogs/zeropp/assets/
 * images/eval1-3.png in DeepSpeed's repository: TFLOP/s per GPU of ZeRO-3
 * and ZeRO++ for each model, the ratio of the bars' labels, or the ratio
 * printed on the chart); `lo`-`hi`: the blog's text ("28% to 36%", "24% to
 * 29%", "up to 2.2x ... about 2x", "similar TFLOPs"). The text's 400 Gb/s
 * ranges are below its own chart (1.40-1.56x at 1k, 1.33-1.41x at 2k). */
typedef struct paper_point {
    const char *what;
    double gbps, tokens; /* cross: 0 (the ZeRO++@200 / ZeRO-3@800 ratio) */
    double fig[2];       /* 18B, 138B */
    double lo, hi;
    int cross;
} paper_point;

static const paper_point paper_points[] = {
    {"400G 1k", 400, 1024, {35.0 / 25, 1.56}, 1.28, 1.36, 0},
    {"400G 2k", 400, 2048, {53.0 / 40, 50.0 / 36}, 1.24, 1.29, 0},
    {"100G 1k", 100, 1024, {2.21, 22.0 / 11}, 2.0, 2.2, 0},
    {"100G 2k", 100, 2048, {1.77, 38.0 / 20}, 2.0, 2.2, 0},
    {"ZeRO++@200G / ZeRO-3@800G, 2k", 0, 2048, {50.0 / 47, 48.0 / 48}, 1, 1, 1},
};

static double paper_predict(const paper_point *p, int big, double exposed) {
    return p->cross ? cross_ratio(big, p->tokens, exposed)
                    : speedup_e(big, p->gbps, p->tokens, exposed);
}

static void test_published_zeropp(void) {
    /* Met: within 15% of the chart's bar for that model (and printed against
     * the text). Missed (DESIGN.md §11 says why): the direction asserted, so
     * a model change that moves them fails here. 1 = met, -1 = predicted
     * below, 2 above. */
    const int expect[5][2] = {{-1, -1}, {-1, -1}, {1, 2}, {1, -1}, {1, 1}};
    /* Each new term on its own, for the record (DESIGN.md §11's table): the
     * first cut (none), + recompute, + the kernels, + the optimizer (all). */
    for (int row = 0; row < 8; row++) {
        const int step = row % 4;
        const double ex = row < 4 ? 0 : 1; /* then each again with nothing overlapped */
        printf("e = %.0f, terms %-33s:", ex,
               step == 0   ? "none (the first cut)"
               : step == 1 ? "+ recompute"
               : step == 2 ? "+ recompute + kernels"
                           : "+ recompute + kernels + optimizer");
        for (size_t i = 0; i < sizeof paper_points / sizeof paper_points[0]; i++)
            for (int big = 0; big <= 1; big++) {
                const paper_point *p = &paper_points[i];
                zpp_cost_in a = paper_in(big, p->cross ? 200 : p->gbps, p->tokens);
                zpp_cost_in b = paper_in(big, p->cross ? 800 : p->gbps, p->tokens);
                zpp_cost_in *both[2] = {&a, &b};
                for (int k = 0; k < 2; k++) {
                    both[k]->exposed_frac = ex;
                    both[k]->recompute = step >= 1;
                    both[k]->hbm_bps = step >= 2 ? 900e9 * 0.78 : 0;
                    if (step < 3) both[k]->opt_s_per_param = 0;
                }
                double r = p->cross ? cost(&a, 4).tflops_per_gpu / cost(&b, 0).tflops_per_gpu
                                    : cost(&a, 0).step_s / cost(&a, 4).step_s;
                printf(" %.2f", r);
            }
        printf("\n");
    }
    for (size_t i = 0; i < sizeof paper_points / sizeof paper_points[0]; i++) {
        const paper_point *p = &paper_points[i];
        for (int big = 0; big <= 1; big++) {
            double s = paper_predict(p, big, 0), f = p->fig[big];
            int met = near_range(s, f, f), text = near_range(s, p->lo, p->hi);
            printf("%-4s %-30s predicted %.3fx, chart %.3fx (%+.0f%%), text %.2f-%.2fx: %s\n",
                   big ? "138B" : "18B", p->what, s, f, 100 * (s / f - 1), p->lo, p->hi,
                   met ? (text ? "met" : "met (chart), not the text")
                       : (text ? "MISSED (chart), met the text" : "MISSED"));
        }
    }
    /* What DeepSpeed's own overlap would have to be (DESIGN.md §11): the
     * exposed fraction e that reproduces one published pair, the 800 Gb/s
     * 2k one (ZeRO++ 54 / ZeRO-3 47 TFLOP/s for 18B, 55 / 48 for 138B, the
     * blog's third chart), found by bisection, then every point at that e.
     * Printed, not asserted: it is inferred from a published point, not
     * measured. */
    for (int big = 0; big <= 1; big++) {
        const double target = big ? 55.0 / 48 : 54.0 / 47;
        double lo = 0, hi = 1;
        for (int k = 0; k < 40; k++) {
            double mid = 0.5 * (lo + hi);
            zpp_cost_in in = paper_in(big, 800, 2048);
            in.exposed_frac = mid;
            double r = cost(&in, 4).tflops_per_gpu / cost(&in, 0).tflops_per_gpu;
            if (r < target) lo = mid;
            else hi = mid;
        }
        const double e = 0.5 * (lo + hi);
        printf("%s: ZeRO++/ZeRO-3 at 800G 2k published %.3f; predicted %.3f (e = 0) to %.3f (e = "
               "1); e = %.2f (%s); then:",
               big ? "138B" : "18B", target, speedup_e(big, 800, 2048, 0),
               speedup_e(big, 800, 2048, 1), e,
               e > 0.999 ? "the bound: no overlap at all still falls short" : "bisected");
        for (size_t i = 0; i < sizeof paper_points / sizeof paper_points[0]; i++)
            printf(" %s %.2fx (chart %.2fx);", paper_points[i].what,
                   paper_predict(&paper_points[i], big, e), paper_points[i].fig[big]);
        printf("\n");
    }
    for (size_t i = 0; i < sizeof paper_points / sizeof paper_points[0]; i++) {
        const paper_point *p = &paper_points[i];
        for (int big = 0; big <= 1; big++) {
            double s = paper_predict(p, big, 0), f = p->fig[big];
            int met = near_range(s, f, f), e = expect[i][big];
            EXPECT(e == 1 ? met : e < 0 ? s < f * 0.85 : s > f * 1.15,
                   "%s %s: %.3f against %.3f changed; update DESIGN.md §11", big ? "138B" : "18B",
                   p->what, s, f);
        }
    }
    /* With nothing overlapped (e = 1, `--serial`), the least overlap the
     * 800 Gb/s pair allows, every point is within 15% of its chart. */
    for (size_t i = 0; i < sizeof paper_points / sizeof paper_points[0]; i++)
        for (int big = 0; big <= 1; big++) {
            double s = paper_predict(&paper_points[i], big, 1), f = paper_points[i].fig[big];
            EXPECT(near_range(s, f, f), "e = 1: %s %s: %.3f against %.3f; update DESIGN.md §11",
                   big ? "138B" : "18B", paper_points[i].what, s, f);
        }

}

/* ---- The Llama family ------------------------------------------------------
 * A random Llama shape (grouped-query heads, an MLP width of its own, tied
 * or untied head, q/k/v biases or not) counted three ways: the planner; the
 * Hugging Face checkpoint's tensors, shape by shape, as LlamaForCausalLM
 * lists them (embed_tokens, per layer input_layernorm, q/k/v/o_proj with
 * q/k/v biases under attention_bias, post_attention_layernorm, gate/up/
 * down_proj; norm; lm_head when untied); and the model's own units
 * (llama.h's layout: embedding unit + L blocks). All three exact. The FLOPs
 * a token are then 6 P + 12 L C T (the planner's convention, cost.c),
 * checked against the products counted one by one. */
static zpp_cost_in random_llama(zpp_rng *r, zpp_llama_config *lc_p) {
    zpp_decoder_shape sh;
    memset(&sh, 0, sizeof sh);
    const int hd = 2 * (1 + (int)(zpp_rng_u64(r) % 64)); /* even: RoPE turns pairs */
    const int kv = 1 + (int)(zpp_rng_u64(r) % 8);
    sh.n_head = kv * (1 + (int)(zpp_rng_u64(r) % 8));
    sh.n_kv_head = kv;
    sh.n_embd = sh.n_head * hd;
    sh.n_layer = 1 + (int)(zpp_rng_u64(r) % 40);
    sh.n_ffn = zpp_rng_u64(r) % 3 ? 1 + (int)(zpp_rng_u64(r) % 20000) : 0; /* 0: the default */
    sh.seq_len = 1 + (int)(zpp_rng_u64(r) % 8192);
    sh.vocab_size = 1 + (int)(zpp_rng_u64(r) % 200000);
    sh.untied_head = (int)(zpp_rng_u64(r) % 2);
    sh.qkv_bias = (int)(zpp_rng_u64(r) % 2);
    sh.o_bias = (int)(zpp_rng_u64(r) % 2);
    zpp_llama_config lc;
    EXPECT_OK(zpp_llama_config_of_shape(&sh, &lc));
    zpp_cost_in in = zpp_cost_in_default();
    in.family = ZPP_COST_LLAMA;
    in.n_layer = lc.n_layer;
    in.n_embd = lc.n_embd;
    in.n_head = lc.n_head;
    in.n_kv_head = lc.n_kv_head;
    in.n_ffn = lc.n_ffn;
    in.seq_len = lc.seq_len;
    in.vocab = lc.vocab_size;
    in.untied_head = lc.untied_head;
    in.qkv_bias = lc.qkv_bias;
    in.o_bias = lc.o_bias;
    *lc_p = lc;
    return in;
}

static void test_llama_counts(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(31));
    for (int it = 0; it < 500; it++) {
        zpp_llama_config lc;
        zpp_cost_in in = random_llama(&r, &lc);
        const double L = lc.n_layer, C = lc.n_embd, V = lc.vocab_size, F = lc.n_ffn;
        const double T = lc.seq_len, H = lc.n_head, KV = lc.n_kv_head, hd = C / H;
        /* HF's tensors: [out, in] matrices and vectors */
        const double q = H * hd * C, k = KV * hd * C, v = KV * hd * C, o = C * H * hd;
        const double gate = F * C, up = F * C, down = C * F;
        const double bias = (lc.qkv_bias ? H * hd + 2 * KV * hd : 0) + (lc.o_bias ? C : 0);
        const double layer = C + q + k + v + bias + o + C + gate + up + down;
        const double head = lc.untied_head ? V * C : 0;
        const double hf = V * C + L * layer + C + head;
        const double P = zpp_cost_llama_params(&in);
        EXPECT(P == hf, "it %d: planner %.0f, HF tensors %.0f", it, P, hf);
        EXPECT(zpp_cost_shape_params(&in) == P, "it %d: shape params", it);
        zpp_llama_layout lay;
        zpp_llama_layout_make(&lc, &lay);
        const double units = (double)lay.embed_numel + L * (double)lay.block_numel;
        EXPECT(P == units, "it %d: planner %.0f, the model's units %.0f", it, P, units);
        /* Products a token, forward: 2 per weight of every matrix that
         * multiplies (q, k, v, o, the MLP's three, the head: wte's when
         * tied), the scores and the mix over n_head heads and T keys; the
         * rest (embedding rows, norms, biases) counted as products by the
         * convention. Backward twice the forward. */
        const double matmul = L * (q + k + v + o + gate + up + down) + V * C;
        const double rest = P - matmul;
        const double attn_fwd = L * H * (2 * T * hd + 2 * T * hd);
        const double want = 3 * (2 * matmul + 2 * rest + attn_fwd);
        const double got = zpp_cost_flops_per_token(P, lc.n_layer, lc.n_embd, lc.seq_len);
        EXPECT(fabs(got - want) <= 1e-12 * want, "it %d: FLOPs %.6g, counted %.6g", it, got,
               want);
    }
    /* Llama 3.2 1B (tied): 1,235,814,400 parameters, its published size */
    zpp_cost_in in = zpp_cost_in_default();
    in.family = ZPP_COST_LLAMA;
    in.n_layer = 16, in.n_embd = 2048, in.n_head = 32, in.n_kv_head = 8, in.n_ffn = 8192;
    in.seq_len = 2048, in.vocab = 128256;
    EXPECT(zpp_cost_llama_params(&in) == 1235814400.0, "Llama 3.2 1B: %.0f",
           zpp_cost_llama_params(&in));
    /* a family that is neither, and a Llama shape with a missing width */
    in.params = zpp_cost_llama_params(&in);
    in.world = 1, in.node_size = 1, in.tokens_per_gpu = 2048;
    in.inter_bps = in.intra_bps = 1e9, in.flops_per_s = 1e12;
    zpp_cost_out out;
    EXPECT_OK(zpp_cost_step(&in, zpp_coll_mode_get(0), &out));
    EXPECT(out.mem_acts_known && out.mem_acts == zpp_cost_llama_act_bytes(&in, 2048));
    zpp_cost_in bad = in;
    bad.n_kv_head = 5;
    EXPECT(zpp_cost_step(&bad, zpp_coll_mode_get(0), &out) == ZPP_ERR_INVALID);
    bad = in;
    bad.family = 7;
    EXPECT(zpp_cost_step(&bad, zpp_coll_mode_get(0), &out) == ZPP_ERR_INVALID);
}

/* The CUDA Llama's activations: llama_cuda.cu plan()'s buffers written out
 * here, per token (N = tokens): per layer r1, r2 (fp32), qkv (E, C + 2 Ck),
 * the attention's (fused: lse, fp32 per head; GEMM path: P, T values of E
 * per head), atty (E), mid (fp32), gu (E, 2F); the residual inputs (fp32,
 * L + 1); once hf (E), rf, dc (fp32), the attention's scratch (fused:
 * dsum per head; GEMM: the fp32 scores and d S in E, T values each per
 * head), dlogits (E, V), the head's lse and losses, the batch's five
 * integers; the scratch (h, act, dres_e, datty, dqkv, dgu, dact in E, dres
 * fp32, the RMSNorm backward's sums) unless it fits in the d logits' bytes.
 * The path is the model's (attention_path.h): fused for bf16 with head dim
 * 64 or 128 only; the dtype is drawn from bf16, fp16 and fp32. Between two
 * token counts on 64-row boundaries (the RMSNorm backward's partials: C
 * floats a chunk) only the per-token part changes, so the difference pins
 * it exactly. Recompute keeps one layer's slab. */
static void test_llama_act_bytes(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(32));
    const zpp_dtype dts[3] = {ZPP_BF16, ZPP_FP16, ZPP_FP32};
    int fits[2] = {0, 0}; /* shapes whose scratch did not and did fit the d logits */
    for (int it = 0; it < 200; it++) {
        zpp_llama_config lc;
        zpp_cost_in in = random_llama(&r, &lc);
        if (it % 4 == 0) { /* head dims the fused kernel takes, so both paths are hit */
            in.n_embd = in.n_head * (it % 8 ? 64 : 128);
            lc.n_embd = in.n_embd;
        }
        in.dtype = dts[zpp_rng_u64(&r) % 3];
        const double L = lc.n_layer, C = lc.n_embd, V = lc.vocab_size, F = lc.n_ffn;
        const double H = lc.n_head, T = lc.seq_len, Wq = C + 2.0 * lc.n_kv_head * (C / H);
        const double e = in.dtype == ZPP_FP32 ? 4 : 2;
        const int hd = lc.n_embd / lc.n_head;
        const int fused = in.dtype == ZPP_BF16 && (hd == 64 || hd == 128);
        const double att = fused ? 4 * H : H * T * e, scratch = fused ? 4 * H : H * T * (4 + e);
        const double layer = 4 + 4 + Wq * e + att + C * e + 4 * C + 2 * F * e;
        /* with cuDNN's attention (the default on the fused path) its
         * workspace: d P in bf16 (2 H T) and D in fp32 (4 H) a token */
        const double cudnn = fused ? 2 * H * T + 4 * H : 0;
        const double once = C * e + 4 + 4 * C + scratch + V * e + 4 + 4 + 5 * 4 + cudnn;
        /* h, act, dres, dres_e, datty, dqkv, dgu, dact and the RMSNorm sums:
         * in the d logits where they fit (SCRATCH IN THE LOGITS) */
        const double layer_scratch = C * e + F * e + 4 * C + C * e + C * e + Wq * e + 2 * F * e +
                                     F * e + 4 * C / 64;
        const int in_logits = layer_scratch <= V * e;
        fits[in_logits]++;
        const double res = 4 * C * (L + 1);
        const double n1 = 1024 + 64 * (double)(zpp_rng_u64(&r) % 64), n2 = n1 + 64 * 7;
        for (int rc = 0; rc < 2; rc++) {
            in.recompute = rc;
            const double per_token =
                res + once + (rc ? 1 : L) * layer + (in_logits ? 0 : layer_scratch);
            const double d = zpp_cost_llama_act_bytes(&in, n2) - zpp_cost_llama_act_bytes(&in, n1);
            EXPECT(fabs(d - per_token * (n2 - n1)) <= 1e-9 * d, "it %d rc %d: %.0f, plan() %.0f",
                   it, rc, d, per_token * (n2 - n1));
        }
        const double tokens = (double)lc.seq_len;
        in.recompute = 0;
        const double full = zpp_cost_llama_act_bytes(&in, tokens);
        in.recompute = 1;
        const double ckpt = zpp_cost_llama_act_bytes(&in, tokens);
        EXPECT(fabs(full - ckpt - (L - 1) * layer * tokens) <= 1e-9 * full,
               "it %d: recompute saves %.0f, (L - 1) slabs %.0f", it, full - ckpt,
               (L - 1) * layer * tokens);
        EXPECT(zpp_cost_act_bytes(&in, tokens) == ckpt);
    }
    EXPECT(fits[0] > 0 && fits[1] > 0, "the scratch fit the d logits %d times, not %d",
           fits[1], fits[0]);
}

ZPP_TESTS(ZPP_TEST(test_bytes_equal_volume), ZPP_TEST(test_monotone),
          ZPP_TEST(test_overlap_bounds), ZPP_TEST(test_flops_and_rates), ZPP_TEST(test_memory),
          ZPP_TEST(test_zeropp_beats_zero3), ZPP_TEST(test_invalid),
          ZPP_TEST(test_hpz_partition), ZPP_TEST(test_reuse_across_boundary),
          ZPP_TEST(test_pick_brute_force),
          ZPP_TEST(test_pick_nothing_fits), ZPP_TEST(test_calibrate_recovers_rates),
          ZPP_TEST(test_calibrate_malformed), ZPP_TEST(test_random_consistency),
          ZPP_TEST(test_schedules), ZPP_TEST(test_calibrated_collectives),
          ZPP_TEST(test_calibrate_compute), ZPP_TEST(test_measured_gpu_steps),
          ZPP_TEST(test_unhidden_parts), ZPP_TEST(test_kernel_bytes),
          ZPP_TEST(test_kernel_time), ZPP_TEST(test_recompute), ZPP_TEST(test_resident_weights),
          ZPP_TEST(test_work_grads), ZPP_TEST(test_pick_filter), ZPP_TEST(test_published_zeropp),
          ZPP_TEST(test_llama_counts), ZPP_TEST(test_llama_act_bytes))
