/* tools/plan.c — `zeropp plan`: the bytes one training step moves per node,
 * for each of ZeRO-3, qwZ, hpZ, qgZ and ZeRO++, computed from the
 * DESIGN.md §5 formulas without running anything (no MPI).
 *
 * The numbers come from zpp_plan_step (collectives/volume.c), which replays
 * the backend calls the live collectives make through the same accounting
 * function they use, so `zeropp plan --reuse-distance 0` and `zeropp bench
 * comm` agree byte for byte (bench comm checks it); by default the backward
 * gathers of the units the engine's reuse rule keeps are taken out
 * (zpp_cost_volume). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "collectives/collectives.h"
#include "model/llama.h"
#include "plan/cost.h"
#include "train/config.h"
#include "train/hf_config.h"
#include "train/hf_gpt2.h"
#include "train/hf_model.h"
#include "zeropp.h"

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp plan (--params P | --model L,C,T,V | --config FILE | --init-from DIR)\n"
            "                   --world W\n"
            "                   [--node-size S] [--units U] [--dtype bf16] [--json]\n"
            "                   [--tokens-per-gpu K | --micro-batch B] [--gpu v100|a100|h100|h200]\n"
            "                   [--tflops F] [--inter-gbps X] [--intra-gbps Y] [--link-eff E]\n"
            "                   [--latency-us L] [--qgz-overlap] [--pick [--mem-gb G]]\n"
            "                   [--ranks-per-device R] [--serial] [--link-per-comm]\n"
            "                   [--opt-ns N] [--exposed-frac E] [--calibrate FILE]\n"
            "                   [--reuse-distance N] [--recompute]\n"
            "                   [--keep-acts | --keep-layernorm]\n"
            "                   [--hbm-gbs B] [--hbm-eff E]\n"
            "                   [--modes M,M,...] [--micro-batches B,B,...] [--hpz-sizes H,H,...]\n"
            "                   [--sweep world=A..B | inter-gbps=A..B [--chart FILE.png]]\n"
            "\n"
            "Cross-node and intra-node bytes per node for one training step of a model of P\n"
            "parameters cut into U equal units (default 8; L+1 with --model), on W ranks in\n"
            "nodes of S ranks (default: one node of W). P takes a suffix: k, M, B\n"
            "(decimal: 125M, 1.5B) or Ki, Mi, Gi (binary: 64Mi = 2^26). Volumes follow\n"
            "DESIGN.md section 5 (the ring-optimal volume of each collective as called);\n"
            "quantized paths count payload, scales and padding. --json prints one object per\n"
            "mode.\n"
            "\n"
            "--reuse-distance N (default 1e9, DeepSpeed's and the engine's\n"
            "stage3_max_reuse_distance): with more than one rank, the last units of the\n"
            "forward stay gathered for their backward when at most N parameters of other\n"
            "units are used in between (2 x the units after them), as the engine runs it:\n"
            "no backward gather for them, each held gathered from its forward to its\n"
            "backward (more memory). 0 gathers every unit again in the backward\n"
            "(as `zeropp bench comm` does). Give the distance the --calibrate train lines\n"
            "ran with.\n"
            "\n"
            "With --tokens-per-gpu (or --micro-batch with --model: B x T tokens) it also\n"
            "predicts each mode's step time, tokens/s, TFLOP/s per GPU and memory per rank\n"
            "(DESIGN.md section 11). --model n_layer,n_embd,seq_len,vocab is a GPT-2 shape\n"
            "(attention FLOPs and activation memory counted). --config FILE takes the shape\n"
            "from a training config's \"model\" section as `zeropp train` reads it,\n"
            "model.family included: a llama's grouped-query k and v, SwiGLU MLP, untied head\n"
            "and q/k/v biases are counted, and its activations are the CUDA Llama's.\n"
            "--init-from DIR takes the shape from a Hugging Face folder's config.json as\n"
            "`zeropp train --init-from` does (a Llama's seq_len and the rest from --config;\n"
            "a GPT-2's T is its n_positions).\n"
            "--gpu picks the FLOP/s (datasheet\n"
            "dense fp16/bf16 peak x 0.4) and the NVLink bandwidth (default h200); --tflops\n"
            "sets the achieved TFLOP/s per GPU. --inter-gbps: Gb/s of one node's cross-node\n"
            "links together (default 400); --intra-gbps: Gb/s one GPU moves inside its node,\n"
            "one direction; both are line rates, scaled by --link-eff (default 0.8).\n"
            "--latency-us: per step of a collective (default 5). --qgz-overlap: model qgZ's\n"
            "cross-node step pipelined under compute (as DeepSpeed runs it) instead of\n"
            "exposed, as collectives.c runs it today.\n"
            "\n"
            "--pick recommends the fastest setting that fits in G GiB per rank (--mem-gb;\n"
            "default the --gpu preset's memory: v100 32, a100 80, h100 80, h200 141): over the\n"
            "modes, hpZ partition sizes dividing the node size, and, with --model, micro-batches\n"
            "1, 2, 4, ... (capped by --micro-batch when given), by tokens/s. It prints the\n"
            "winner with the reason, or with --json one object with the choice, the runner-up\n"
            "(the fastest other mode) and ZeRO-3's best. Needs --model or --tokens-per-gpu.\n"
            "\n"
            "How the machine runs a step (DESIGN.md section 11, \"Schedules\"):\n"
            "--ranks-per-device R: ranks time-sharing one device compute at 1/R of its rate\n"
            "(2 ranks on one GPU: 2; CPU ranks with OPENBLAS_NUM_THREADS=1, 4 ranks on 2\n"
            "cores: 2). --serial: compute and communication take turns (CPU ranks: MPI moves\n"
            "data only while a rank waits in it; ranks sharing a GPU). --link-per-comm: a\n"
            "gather and a reduction in flight together each get the link's full rate\n"
            "(emulated nodes over sockets: each communicator has its own connections).\n"
            "--opt-ns N: the optimizer step, N ns per parameter of a rank's shard.\n"
            "--exposed-frac E: between overlap (0) and --serial (1), the share of the\n"
            "shorter of a stage's compute and communication left exposed.\n"
            "--recompute: activation checkpointing (the backward recomputes the forward:\n"
            "4/3 of the compute; TFLOP/s stay the model's 6P count). --keep-acts: the\n"
            "GPT-2 keeps its LayerNorm and GELU outputs (zeropp.keep_activations true);\n"
            "--keep-layernorm: its LayerNorm outputs only (\"layernorm\").\n"
            "--hbm-gbs B: the device memory's GB/s (bytes; default the --gpu preset's\n"
            "datasheet: v100 900, a100 2039, h100 3350, h200 4800; 0: not priced) x\n"
            "--hbm-eff (default 0.78) prices the quantization kernels and hpZ's copy\n"
            "(DESIGN.md section 11, \"Kernels\"); a mode --calibrate measured has them in\n"
            "its measured times.\n"
            "--pick restricted: --modes zero3,qwz,hpz,qgz,zeropp (the modes it may pick),\n"
            "--micro-batches 1,2,4 (exactly these, with --model), --hpz-sizes 2,4 (hpZ\n"
            "partition sizes; the trainer runs only the node size).\n"
            "\n"
            "--calibrate FILE reads JSON lines: `zeropp bench comm --json` lines give the\n"
            "cross-node and intra-node rates (ZeRO-3's gathers and hpZ's backward gathers,\n"
            "after --latency-us) instead of --inter-gbps / --intra-gbps x --link-eff, and,\n"
            "for the world and node size they ran on, each mode's measured collective times\n"
            "(per parameter); `zeropp train --metrics` lines of world-1 runs of this --model\n"
            "give the compute rate (instead of --tflops) and, from two or more micro-batches,\n"
            "the optimizer's time per parameter (instead of --opt-ns).\n"
            "\n"
            "--sweep world=A..B (doubling; --node-size stays) or inter-gbps=A..B (doubling)\n"
            "prints each mode's step time, tokens/s and speedup at every point (a table, or\n"
            "--json one object per point and mode); --chart FILE.png draws tokens/s per GPU\n"
            "and memory against it with gnuplot.\n");
}

/* GPU presets: plan/cost.h (zpp_cost_gpus), shared with `zeropp train`'s
 * MFU. */
/* Achieved / datasheet HBM rate of our quantization kernels: on one H200 a
 * device-to-device copy ran at 4227 GB/s (0.88 of 4800) and quantize /
 * dequantize at 0.86-0.91 of the copy (bench/RESULTS.md, 2026-11-30), so
 * 0.76-0.80 of the datasheet: 0.78. */
#define PLAN_HBM_EFFICIENCY 0.78
#define PLAN_GPU_EFFICIENCY 0.4 /* achieved / peak on large GPT GEMMs: our stated choice */

static int parse_pos(const char *flag, const char *s, double *out) {
    if (!s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || !isfinite(v)) {
        fprintf(stderr, "zeropp plan: %s '%s' is not a number >= 0\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* "1,2,4" into list[0..n): positive integers, at most cap. -1 with a
 * message naming the flag for anything else. */
static int parse_int_list(const char *flag, const char *s, int *list, int cap, int *n) {
    *n = 0;
    if (!s) return 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v <= 0 || v > (1 << 24) || (*end && *end != ',') ||
            *n == cap) {
            fprintf(stderr, "zeropp plan: %s '%s': give up to %d positive integers joined by "
                            "commas\n",
                    flag, s, cap);
            return -1;
        }
        list[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* "zero3,hpz" into a mask of zpp_coll_mode_get indices ("zeropp" or the
 * trainer's "qwz+hpz+qgz" for the fifth). */
static int parse_modes(const char *s, unsigned *mask) {
    *mask = 0;
    if (!s) return 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) {
        fprintf(stderr, "zeropp plan: --modes '%s' is too long\n", s);
        return -1;
    }
    strcpy(buf, s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
            if (strcmp(t, zpp_coll_mode_get(m)->name) == 0) found = m;
        if (strcmp(t, "qwz+hpz+qgz") == 0) found = ZPP_COLL_MODE_COUNT - 1;
        if (found < 0) {
            fprintf(stderr, "zeropp plan: --modes: unknown mode '%s'; use zero3, qwz, hpz, qgz, "
                            "zeropp\n",
                    t);
            return -1;
        }
        *mask |= 1u << found;
    }
    if (!*mask) {
        fprintf(stderr, "zeropp plan: --modes is empty\n");
        return -1;
    }
    return 0;
}

/* A setting in words: "zeropp with hpZ 8 at micro-batch 4". */
static const char *choice_name(const zpp_cost_choice *c, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s", zpp_coll_mode_get(c->mode)->name);
    if (c->hpz_size && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " with hpZ %d", c->hpz_size);
    if (c->micro_batch && n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, " at micro-batch %d", c->micro_batch);
    return buf;
}

static cJSON *choice_json(const zpp_cost_choice *c, const zpp_cost_pick_result *r,
                          const zpp_cost_in *ci) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "mode", zpp_coll_mode_get(c->mode)->name);
    cJSON_AddNumberToObject(o, "hpz_partition_size", c->hpz_size);
    cJSON_AddNumberToObject(o, "micro_batch", c->micro_batch);
    cJSON_AddNumberToObject(o, "tokens_per_gpu", c->micro_batch
                                                     ? (double)c->micro_batch * ci->seq_len
                                                     : ci->tokens_per_gpu);
    cJSON_AddNumberToObject(o, "step_s", c->out.step_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", c->out.tokens_per_s);
    cJSON_AddNumberToObject(o, "tflops_per_gpu", c->out.tflops_per_gpu);
    cJSON_AddNumberToObject(o, "mem_bytes_per_rank", c->out.mem_bytes_per_rank);
    cJSON_AddBoolToObject(o, "mem_acts_known", c->out.mem_acts_known);
    if (r->has_zero3)
        cJSON_AddNumberToObject(o, "tokens_per_s_vs_zero3",
                                c->out.tokens_per_s / r->zero3.out.tokens_per_s);
    return o;
}

/* --pick: the library searches (zpp_cost_pick); this prints its answer. */
static int plan_pick(const zpp_cost_in *ci, double mem_gb, const char *preset, int max_b,
                     const zpp_cost_pick_filter *filter, int json) {
    const double GiB = 1073741824.0;
    zpp_cost_pick_result r;
    if (zpp_cost_pick_only(ci, mem_gb * GiB, max_b, filter, &r) != ZPP_OK) {
        fprintf(stderr, "zeropp plan: %s (budget: %s)\n", zpp_last_error(),
                preset ? "the --gpu preset's memory; --mem-gb to change it" : "--mem-gb");
        return 2;
    }
    char best[96], other[96], reason[512];
    choice_name(&r.best, best, sizeof best);
    int n;
    if (r.best.mode == 0)
        n = snprintf(reason, sizeof reason, "%s: the fastest that fits", best);
    else if (r.has_zero3 && r.zero3.micro_batch != r.best.micro_batch)
        n = snprintf(reason, sizeof reason, "%s: %.2fx zero3's best tokens/s (%s)", best,
                     r.best.out.tokens_per_s / r.zero3.out.tokens_per_s,
                     choice_name(&r.zero3, other, sizeof other));
    else if (r.has_zero3)
        n = snprintf(reason, sizeof reason, "%s: %.2fx zero3's tokens/s", best,
                     r.best.out.tokens_per_s / r.zero3.out.tokens_per_s);
    else
        n = snprintf(reason, sizeof reason, "%s: zero3 does not fit at all", best);
    if (r.next_micro_batch && n > 0 && (size_t)n < sizeof reason) {
        if (!r.next_fits)
            snprintf(reason + n, sizeof reason - (size_t)n,
                     "; micro-batch %d does not fit (%.1f GiB > %g)", r.next_micro_batch,
                     r.next_mem_bytes / GiB, mem_gb);
        else if (max_b > 0 && r.next_micro_batch > max_b)
            snprintf(reason + n, sizeof reason - (size_t)n,
                     "; micro-batch %d is over the --micro-batch cap", r.next_micro_batch);
        else
            snprintf(reason + n, sizeof reason - (size_t)n,
                     "; micro-batch %d fits but is not faster", r.next_micro_batch);
    }
    /* hpZ below the node size is modelled, not yet runnable (trainer.c). */
    int not_runnable = r.best.hpz_size && r.best.hpz_size != ci->node_size;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON *c = choice_json(&r.best, &r, ci);
        cJSON *u = r.has_runner_up ? choice_json(&r.runner_up, &r, ci) : cJSON_CreateNull();
        cJSON *z = r.has_zero3 ? choice_json(&r.zero3, &r, ci) : cJSON_CreateNull();
        if (!o || !c || !u || !z) {
            cJSON_Delete(o), cJSON_Delete(c), cJSON_Delete(u), cJSON_Delete(z);
            return zpp_cli_fail("plan: out of memory", 1);
        }
        cJSON_AddStringToObject(o, "plan", "pick");
        cJSON_AddNumberToObject(o, "mem_budget_bytes", mem_gb * GiB);
        cJSON_AddStringToObject(o, "mem_budget_from", preset ? preset : "--mem-gb");
        cJSON_AddItemToObject(o, "choice", c);
        cJSON_AddItemToObject(o, "runner_up", u);
        cJSON_AddItemToObject(o, "zero3", z);
        cJSON_AddStringToObject(o, "reason", reason);
        cJSON_AddBoolToObject(o, "runnable_today", !not_runnable);
        cJSON_AddNumberToObject(o, "candidates", r.candidates);
        cJSON_AddNumberToObject(o, "fitting", r.fitting);
        char *s = cJSON_PrintUnformatted(o);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(o);
        return s ? 0 : zpp_cli_fail("plan: out of memory", 1);
    }
    printf("zeropp plan --pick: budget %g GiB per rank (%s); %d settings priced, %d fit\n",
           mem_gb, preset ? preset : "--mem-gb", r.candidates, r.fitting);
    printf("pick: %s\n", reason);
    printf("      %.1f ms per step, %.0f tokens/s, %.3g TFLOP/s per GPU, %.1f GiB per rank%s\n",
           r.best.out.step_s * 1e3, r.best.out.tokens_per_s, r.best.out.tflops_per_gpu,
           r.best.out.mem_bytes_per_rank / GiB,
           r.best.out.mem_acts_known ? "" : " + activations (pass --model to count them)");
    if (r.has_runner_up)
        printf("runner-up: %s, %.0f tokens/s, %.1f GiB per rank\n",
               choice_name(&r.runner_up, other, sizeof other), r.runner_up.out.tokens_per_s,
               r.runner_up.out.mem_bytes_per_rank / GiB);
    if (not_runnable)
        printf("note: the trainer runs hpZ only with the partition = the node (%d ranks) "
               "today; this hpZ %d is the model's estimate\n",
               ci->node_size, r.best.hpz_size);
    return 0;
}

/* ---- --sweep ---------------------------------------------------------------
 * One knob doubled from A to B, every mode priced at each point. */

#define SWEEP_MAX 64

typedef struct sweep_point {
    double x;
    zpp_cost_out o[ZPP_COLL_MODE_COUNT];
} sweep_point;

/* Draws the sweep with gnuplot: tokens/s per GPU (top) and memory per rank
 * (bottom) against the knob, one line per mode, log-scaled x. */
static int sweep_chart(const sweep_point *pt, int n, const char *xname, const char *path,
                       const zpp_cost_in *ci) {
    /* gnuplot is an ordinary program on PATH; popen succeeds even when it
     * is missing (the shell reports it), so ask the shell first. */
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        fprintf(stderr, "zeropp plan: --chart needs gnuplot on PATH (Debian/Ubuntu: apt-get "
                        "install gnuplot-nox); the table above is complete without it\n");
        return 2;
    }
    for (const char *c = path; *c; c++)
        if (*c == '"' || *c == '\\' || *c == '\n') {
            fprintf(stderr, "zeropp plan: --chart '%s': quotes, backslashes and newlines are "
                            "not allowed in the file name\n",
                    path);
            return 2;
        }
    /* Name a bad path here, not through gnuplot (which would draw to its
     * stdout when it cannot open the file). */
    FILE *probe = fopen(path, "wb");
    if (!probe) {
        fprintf(stderr, "zeropp plan: --chart: cannot write '%s': %s\n", path, strerror(errno));
        return 2;
    }
    fclose(probe);
    FILE *g = popen("gnuplot >/dev/null", "w");
    if (!g) {
        fprintf(stderr, "zeropp plan: --chart: cannot start gnuplot: %s\n", strerror(errno));
        return 2;
    }
    const double GiB = 1073741824.0;
    fprintf(g, "set terminal pngcairo size 1000,900 font 'sans,10'\nset output \"%s\"\n", path);
    fprintf(g, "$d << EOD\n");
    for (int i = 0; i < n; i++) {
        fprintf(g, "%.10g", pt[i].x);
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
            fprintf(g, " %.10g %.10g",
                    pt[i].o[m].tokens_per_s / (strcmp(xname, "world") == 0 ? pt[i].x : ci->world),
                    pt[i].o[m].mem_bytes_per_rank / GiB);
        fprintf(g, "\n");
    }
    fprintf(g, "EOD\nset multiplot layout 2,1\nset logscale x 2\nset grid\nset key outside right\n");
    fprintf(g, "set xlabel '%s'\n", strcmp(xname, "world") == 0 ? "GPUs (world)"
                                                                 : "cross-node Gb/s per node");
    fprintf(g, "set title 'zeropp plan: predicted tokens/s per GPU (%.3g params, %.0f tokens "
               "per GPU, node of %d)'\nset ylabel 'tokens/s per GPU'\nplot ",
            ci->params, ci->tokens_per_gpu, ci->node_size);
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        fprintf(g, "%s$d using 1:%d with linespoints lw 2 title '%s'", m ? ", " : "", 2 + 2 * m,
                zpp_coll_mode_get(m)->name);
    fprintf(g, "\nset title 'memory per rank (model: shards, hpZ copy, transients%s)'\n"
               "set ylabel 'GiB'\nplot ",
            ci->n_layer > 0 ? ", activations" : "");
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
        fprintf(g, "%s$d using 1:%d with linespoints lw 2 title '%s'", m ? ", " : "", 3 + 2 * m,
                zpp_coll_mode_get(m)->name);
    fprintf(g, "\nunset multiplot\n");
    int rc = pclose(g);
    if (rc != 0) {
        fprintf(stderr, "zeropp plan: --chart: gnuplot failed (status %d) drawing '%s'\n", rc,
                path);
        return 2;
    }
    return 0;
}

#define SWEEP_NAME_CAP 32

/* "NAME=A..B" into name (SWEEP_NAME_CAP bytes), a and b; -1 with a
 * message unless NAME is world or inter-gbps and 0 < A <= B. strtod would
 * read "25." of "25..800", so the text is split at the dots first. */
static int sweep_parse(const char *spec, char *name, double *a, double *b) {
    char lo[64] = "", hi[64] = "";
    const char *eq = strchr(spec, '='), *dots = eq ? strstr(eq, "..") : NULL;
    int ok = eq && dots && (size_t)(eq - spec) < SWEEP_NAME_CAP &&
             (size_t)(dots - eq - 1) < sizeof lo && strlen(dots + 2) < sizeof hi;
    name[0] = 0;
    if (ok) {
        memcpy(name, spec, (size_t)(eq - spec));
        name[eq - spec] = 0;
        memcpy(lo, eq + 1, (size_t)(dots - eq - 1));
        strcpy(hi, dots + 2);
        char *e1, *e2;
        *a = strtod(lo, &e1);
        *b = strtod(hi, &e2);
        ok = lo[0] && hi[0] && !*e1 && !*e2;
    }
    if (!ok || (strcmp(name, "world") != 0 && strcmp(name, "inter-gbps") != 0) || !(*a > 0) ||
        !(*b >= *a) || !isfinite(*b)) {
        fprintf(stderr, "zeropp plan: --sweep '%s': give world=A..B or inter-gbps=A..B with "
                        "0 < A <= B (e.g. world=64..16384)\n",
                spec);
        return -1;
    }
    return 0;
}

/* The sweep's n points: one JSON line per point and mode, or a table of
 * each mode's step, ZeRO-3's and ZeRO++'s tokens/s per GPU, the speedup,
 * ZeRO++'s exposed share and memory per rank. */
static void sweep_print(const sweep_point *pt, int n, const char *name, const char *spec,
                        const zpp_cost_in *base, int json) {
    const double GiB = 1073741824.0;
    const int is_world = strcmp(name, "world") == 0;
    if (json) {
        for (int i = 0; i < n; i++)
            for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
                const zpp_cost_out *o = &pt[i].o[m];
                double w = is_world ? pt[i].x : base->world;
                printf("{\"plan\":\"sweep\",\"sweep\":\"%s\",\"x\":%.10g,\"mode\":\"%s\","
                       "\"world\":%.0f,\"step_s\":%.9g,\"compute_s\":%.9g,\"exposed_comm_s\":"
                       "%.9g,\"tokens_per_s\":%.9g,\"tokens_per_s_per_gpu\":%.9g,"
                       "\"tflops_per_gpu\":%.9g,\"speedup_vs_zero3\":%.9g,"
                       "\"cross_node_bytes\":%.17g,\"mem_bytes_per_rank\":%.17g}\n",
                       name, pt[i].x, zpp_coll_mode_get(m)->name, w, o->step_s, o->compute_s,
                       o->exposed_comm_s, o->tokens_per_s, o->tokens_per_s / w,
                       o->tflops_per_gpu, pt[i].o[0].step_s / o->step_s, o->cross_node_bytes,
                       o->mem_bytes_per_rank);
            }
        return;
    }
    printf("zeropp plan --sweep %s: %.4g parameters, %.0f tokens per GPU, node of %d%s\n", spec,
           base->params, base->tokens_per_gpu, base->node_size,
           is_world ? "" : "; cross-node rate x --link-eff");
    printf("%10s | %-47s | %-35s | %s\n", "", "step time, ms", "tokens/s per GPU",
           "mem/rank GiB");
    printf("%10s | %9s %9s %9s %9s %9s | %8s %8s %8s %8s | %6s %6s %6s\n", name, "zero3", "qwz",
           "hpz", "qgz", "zeropp", "zero3", "zeropp", "speedup", "exposed", "zero3", "hpz",
           "zeropp");
    for (int i = 0; i < n; i++) {
        const zpp_cost_out *o = pt[i].o;
        double w = is_world ? pt[i].x : base->world;
        printf("%10.6g | %9.1f %9.1f %9.1f %9.1f %9.1f | %8.0f %8.0f %7.2fx %7.0f%% | %6.2f "
               "%6.2f %6.2f\n",
               pt[i].x, o[0].step_s * 1e3, o[1].step_s * 1e3, o[2].step_s * 1e3,
               o[3].step_s * 1e3, o[4].step_s * 1e3, o[0].tokens_per_s / w,
               o[4].tokens_per_s / w, o[0].step_s / o[4].step_s,
               100 * o[4].exposed_comm_s / o[4].step_s, o[0].mem_bytes_per_rank / GiB,
               o[2].mem_bytes_per_rank / GiB, o[4].mem_bytes_per_rank / GiB);
    }
    printf("(speedup: ZeRO++ over ZeRO-3; exposed: ZeRO++'s communication not hidden, "
           "share of its step)\n");
    if (n == SWEEP_MAX) printf("(stopped at %d points)\n", SWEEP_MAX);
}

/* --sweep NAME=A..B: every mode priced at A, 2A, 4A, ... up to B (at most
 * SWEEP_MAX points), printed, and drawn with --chart. */
static int plan_sweep(const zpp_cost_in *base, const char *spec, const char *chart, int json,
                      double link_eff) {
    char name[SWEEP_NAME_CAP];
    double a = 0, b = 0;
    if (sweep_parse(spec, name, &a, &b)) return 2;
    const int is_world = strcmp(name, "world") == 0;
    sweep_point pt[SWEEP_MAX];
    int n = 0;
    for (double x = a; x <= b * (1 + 1e-12) && n < SWEEP_MAX; x *= 2, n++) {
        zpp_cost_in c = *base;
        if (is_world) {
            if (x != floor(x) || x > (1 << 24) || fmod(x, base->node_size) != 0) {
                fprintf(stderr, "zeropp plan: --sweep world: %g is not a whole multiple of the "
                                "node size %d; start at a multiple\n",
                        x, base->node_size);
                return 2;
            }
            c.world = (int)x;
        } else {
            c.inter_bps = x * 1e9 / 8 * link_eff;
        }
        pt[n].x = x;
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++)
            if (zpp_cost_step(&c, zpp_coll_mode_get(m), &pt[n].o[m]) != ZPP_OK) {
                fprintf(stderr, "zeropp %s\n", zpp_last_error());
                return 2;
            }
    }
    sweep_print(pt, n, name, spec, base, json);
    if (chart) {
        int rc = sweep_chart(pt, n, name, chart, base);
        if (rc) return rc;
        if (!json) printf("chart: %s\n", chart);
    }
    return 0;
}

/* ---- the command -------------------------------------------------------------
 * zpp_cli_plan runs five steps, each a function below: the options (parsed,
 * then checked), the machine (GPU preset, links), the calibration, then one
 * of three answers: a sweep, a pick, or the step table (text or JSON). A
 * step returns PLAN_GO to go on, or the exit code with its message printed. */

#define PLAN_GO (-1)
#define PLAN_LIST_MAX 32 /* entries of --micro-batches, --hpz-sizes */

typedef struct plan_opts {
    size_t params, reuse;
    int world, node_size, units, json, micro_batch, qgz_overlap, pick, serial, link_per_comm,
        recompute, keep_acts, keep_all, keep_ln; /* keep_acts: ZPP_KEEP_* bits */
    int shaped; /* a model shape is known: --model, --config or --init-from */
    zpp_dtype dtype;
    /* The options that take text (numbers, lists, names, paths), as given
     * (NULL: not given): a check or a clash names the flag the user wrote. */
    const char *dtype_s, *model_s, *config_s, *init_from_s, *gpu_s, *tok_s, *tf_s, *inter_s,
        *intra_s, *eff_s, *lat_s, *mem_s, *cal_s, *rpd_s, *opt_s, *sweep_s, *chart_s, *expf_s,
        *hbm_s, *hbm_eff_s, *modes_s, *mbs_s, *hpzs_s;
    /* Their values, defaults filled in. hbm < 0: the --gpu preset's. */
    double tokens, tflops, inter, intra, eff, lat, mem_gb, rpd, opt_ns, expf, hbm, hbm_eff;
    int mbs[PLAN_LIST_MAX], hpzs[PLAN_LIST_MAX], n_mbs, n_hpzs;
    unsigned modes;          /* --modes as a mask of mode indices; 0: all */
    const zpp_cost_gpu *gpu; /* the --gpu preset (h200 by default) */
    int timed;               /* tokens given: step times predicted */
} plan_opts;

/* --config FILE and --init-from DIR: the model as `zeropp train` reads it
 * (defaults; a Hugging Face folder's config.json shape; the file's "model"
 * section; their checks): model.family and the shape, a Llama's knobs
 * resolved by the family's own rules (zpp_llama_config_of_shape:
 * n_kv_head, n_ffn's default, ...), and activation_checkpointing as
 * --recompute. Either may be NULL. 0, or 1 after saying why. */
static int plan_shape_from_config(const char *path, const char *hf_dir, plan_opts *o,
                                  zpp_cost_in *ci) {
    zpp_train_config cfg;
    zpp_hf_config hf;
    char json[4200];
    const char *what = path ? "plan: --config" : "plan: --init-from";
    zpp_status st = zpp_train_config_defaults(&cfg);
    const int gpt2 = hf_dir && zpp_hf_gpt2_is_dir(hf_dir);
    zpp_gpt2_config g;
    if (st == ZPP_OK && gpt2) st = zpp_hf_gpt2_read_config(hf_dir, &g);
    if (st == ZPP_OK && gpt2) cfg.model = g;
    if (st == ZPP_OK && hf_dir && !gpt2) {
        snprintf(json, sizeof json, "%s/config.json", hf_dir);
        st = zpp_hf_is_model_dir(hf_dir)
                 ? zpp_hf_config_read(json, &hf)
                 : zpp_error(ZPP_ERR_CONFIG, "--init-from %s is not a Hugging Face folder (no "
                                             "config.json); for an llm.c file give --model "
                                             "L,C,T,V",
                             hf_dir);
        if (st == ZPP_OK) st = zpp_hf_apply_shape(&hf, &cfg);
    }
    if (st == ZPP_OK && path) st = zpp_train_config_load_file(path, &cfg);
    if (st == ZPP_OK && hf_dir && !gpt2) st = zpp_hf_check_shape(&hf, &cfg, hf_dir);
    if (st == ZPP_OK && gpt2) st = zpp_hf_gpt2_check_shape(&g, hf_dir, &cfg.model);
    if (st != ZPP_OK) return zpp_cli_fail(what, st);
    const zpp_gpt2_config *m = &cfg.model;
    ci->n_layer = m->n_layer;
    ci->n_embd = m->n_embd;
    ci->n_head = m->n_head;
    ci->seq_len = m->seq_len;
    ci->vocab = m->vocab_size;
    if (cfg.activation_checkpointing) o->recompute = 1;
    o->keep_acts |= cfg.keep_activations;
    if (cfg.model_family != ZPP_FAMILY_LLAMA) return 0;
    const zpp_decoder_shape shape = zpp_train_config_shape(&cfg);
    zpp_llama_config lc;
    st = zpp_llama_config_of_shape(&shape, &lc);
    if (st != ZPP_OK) return zpp_cli_fail(what, st);
    ci->family = ZPP_COST_LLAMA;
    ci->n_kv_head = lc.n_kv_head;
    ci->n_ffn = lc.n_ffn;
    ci->untied_head = lc.untied_head;
    ci->qkv_bias = lc.qkv_bias;
    ci->o_bias = lc.o_bias;
    return 0;
}

/* Options, step 1: the flags into `o`, --dtype, and the model (--params or
 * --model's GPT shape, which goes into ci) on --world ranks. --help prints
 * the usage and exits 0. */
static int plan_parse(int argc, char **argv, plan_opts *o, zpp_cost_in *ci) {
    memset(o, 0, sizeof *o);
    o->reuse = 1000000000; /* DeepSpeed's stage3_max_reuse_distance */
    o->dtype = ZPP_BF16;
    o->inter = 400, o->eff = 0.8, o->lat = 5, o->rpd = 1, o->hbm = -1;
    o->hbm_eff = PLAN_HBM_EFFICIENCY;
    const zpp_cli_opt cli_opts[] = {
        {"--json", ZPP_CLI_FLAG, &o->json, 0, 0},
        {"--params", ZPP_CLI_SIZE, &o->params, 1, 1ll << 53},
        {"--world", ZPP_CLI_INT, &o->world, 1, 1 << 24},
        {"--node-size", ZPP_CLI_INT, &o->node_size, 1, 1 << 24},
        {"--units", ZPP_CLI_INT, &o->units, 1, 1 << 24},
        {"--dtype", ZPP_CLI_STR, &o->dtype_s, 0, 0},
        {"--model", ZPP_CLI_STR, &o->model_s, 0, 0},
        {"--config", ZPP_CLI_STR, &o->config_s, 0, 0},
        {"--init-from", ZPP_CLI_STR, &o->init_from_s, 0, 0},
        {"--tokens-per-gpu", ZPP_CLI_STR, &o->tok_s, 0, 0},
        {"--micro-batch", ZPP_CLI_INT, &o->micro_batch, 1, 1 << 24},
        {"--gpu", ZPP_CLI_STR, &o->gpu_s, 0, 0},
        {"--tflops", ZPP_CLI_STR, &o->tf_s, 0, 0},
        {"--inter-gbps", ZPP_CLI_STR, &o->inter_s, 0, 0},
        {"--intra-gbps", ZPP_CLI_STR, &o->intra_s, 0, 0},
        {"--link-eff", ZPP_CLI_STR, &o->eff_s, 0, 0},
        {"--latency-us", ZPP_CLI_STR, &o->lat_s, 0, 0},
        {"--qgz-overlap", ZPP_CLI_FLAG, &o->qgz_overlap, 0, 0},
        {"--pick", ZPP_CLI_FLAG, &o->pick, 0, 0},
        {"--mem-gb", ZPP_CLI_STR, &o->mem_s, 0, 0},
        {"--calibrate", ZPP_CLI_STR, &o->cal_s, 0, 0},
        {"--ranks-per-device", ZPP_CLI_STR, &o->rpd_s, 0, 0},
        {"--serial", ZPP_CLI_FLAG, &o->serial, 0, 0},
        {"--link-per-comm", ZPP_CLI_FLAG, &o->link_per_comm, 0, 0},
        {"--opt-ns", ZPP_CLI_STR, &o->opt_s, 0, 0},
        {"--exposed-frac", ZPP_CLI_STR, &o->expf_s, 0, 0},
        {"--sweep", ZPP_CLI_STR, &o->sweep_s, 0, 0},
        {"--chart", ZPP_CLI_STR, &o->chart_s, 0, 0},
        {"--reuse-distance", ZPP_CLI_SIZE, &o->reuse, 0, 1ll << 53},
        {"--recompute", ZPP_CLI_FLAG, &o->recompute, 0, 0},
        {"--keep-acts", ZPP_CLI_FLAG, &o->keep_all, 0, 0},
        {"--keep-layernorm", ZPP_CLI_FLAG, &o->keep_ln, 0, 0},
        {"--hbm-gbs", ZPP_CLI_STR, &o->hbm_s, 0, 0},
        {"--hbm-eff", ZPP_CLI_STR, &o->hbm_eff_s, 0, 0},
        {"--modes", ZPP_CLI_STR, &o->modes_s, 0, 0},
        {"--micro-batches", ZPP_CLI_STR, &o->mbs_s, 0, 0},
        {"--hpz-sizes", ZPP_CLI_STR, &o->hpzs_s, 0, 0},
    };
    int pr = zpp_cli_parse_opts("plan", argc, argv, cli_opts,
                                (int)(sizeof cli_opts / sizeof cli_opts[0]), 1);
    if (pr > 0) {
        plan_usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (o->dtype_s && zpp_dtype_parse(o->dtype_s, &o->dtype) != ZPP_OK)
        return zpp_cli_fail("plan: --dtype", 1);
    *ci = zpp_cost_in_default();
    if (o->model_s && (o->config_s || o->init_from_s)) {
        fprintf(stderr, "zeropp plan: give --model or --config/--init-from, not both\n");
        return 2;
    }
    if (o->config_s || o->init_from_s) {
        if (o->params) {
            fprintf(stderr, "zeropp plan: give --params or --config/--init-from, not both\n");
            return 2;
        }
        if (plan_shape_from_config(o->config_s, o->init_from_s, o, ci) != 0) return 1;
        o->params = (size_t)zpp_cost_shape_params(ci);
        if (!o->units) o->units = ci->n_layer + 1;
    }
    if (o->model_s) {
        if (sscanf(o->model_s, "%d,%d,%d,%d", &ci->n_layer, &ci->n_embd, &ci->seq_len,
                   &ci->vocab) != 4 ||
            ci->n_layer <= 0 || ci->n_embd <= 0 || ci->seq_len <= 0 || ci->vocab <= 0) {
            fprintf(stderr, "zeropp plan: --model '%s': give n_layer,n_embd,seq_len,vocab, "
                            "four positive integers (GPT-2 124M: 12,768,1024,50257)\n",
                    o->model_s);
            return 2;
        }
        if (o->params) {
            fprintf(stderr, "zeropp plan: give --params or --model, not both\n");
            return 2;
        }
        o->params = (size_t)zpp_cost_gpt_params(ci->n_layer, ci->n_embd, ci->seq_len, ci->vocab);
        if (!o->units) o->units = ci->n_layer + 1;
    }
    o->shaped = o->model_s || o->config_s || o->init_from_s;
    if (!o->units) o->units = 8;
    if (!o->params || !o->world) {
        fprintf(stderr, "zeropp plan: --params (or --model) and --world are required\n\n");
        plan_usage(stderr);
        return 2;
    }
    if (!o->node_size) o->node_size = o->world;
    return PLAN_GO;
}

/* Options, step 2: the numbers and lists read, and the combinations that
 * make no sense refused, each with what to do instead. Then the tokens a
 * GPU processes: --tokens-per-gpu, or --micro-batch x seq_len. */
static int plan_check(plan_opts *o, const zpp_cost_in *ci) {
    if (parse_pos("--hbm-gbs", o->hbm_s, &o->hbm) ||
        parse_pos("--hbm-eff", o->hbm_eff_s, &o->hbm_eff) || parse_modes(o->modes_s, &o->modes) ||
        parse_int_list("--micro-batches", o->mbs_s, o->mbs, PLAN_LIST_MAX, &o->n_mbs) ||
        parse_int_list("--hpz-sizes", o->hpzs_s, o->hpzs, PLAN_LIST_MAX, &o->n_hpzs))
        return 2;
    const char *why = NULL; /* the first combination refused */
    if (!(o->hbm_eff > 0) || o->hbm_eff > 1)
        why = "--hbm-eff is in (0, 1]";
    else if ((o->modes_s || o->mbs_s || o->hpzs_s) && !o->pick)
        why = "--modes, --micro-batches and --hpz-sizes restrict --pick; add --pick";
    else if (o->mbs_s && (!o->shaped || o->micro_batch))
        why = "--micro-batches needs --model or --config and replaces --micro-batch";
    if (why) {
        fprintf(stderr, "zeropp plan: %s\n", why);
        return 2;
    }
    if (parse_pos("--tokens-per-gpu", o->tok_s, &o->tokens) ||
        parse_pos("--tflops", o->tf_s, &o->tflops) ||
        parse_pos("--inter-gbps", o->inter_s, &o->inter) ||
        parse_pos("--intra-gbps", o->intra_s, &o->intra) ||
        parse_pos("--link-eff", o->eff_s, &o->eff) ||
        parse_pos("--latency-us", o->lat_s, &o->lat) ||
        parse_pos("--mem-gb", o->mem_s, &o->mem_gb) ||
        parse_pos("--ranks-per-device", o->rpd_s, &o->rpd) ||
        parse_pos("--opt-ns", o->opt_s, &o->opt_ns) ||
        parse_pos("--exposed-frac", o->expf_s, &o->expf))
        return 2;
    if (o->expf > 1 || (o->expf_s && o->serial))
        why = "--exposed-frac is in [0, 1] and not with --serial (which is 1)";
    else if (o->rpd_s && !(o->rpd >= 1))
        why = "--ranks-per-device must be >= 1 (ranks sharing one device; "
              "4 ranks on 2 cores: 2)";
    else if (o->chart_s && !o->sweep_s)
        why = "--chart draws a --sweep; add --sweep";
    else if (o->sweep_s && o->pick)
        why = "give --sweep or --pick, not both";
    else if (o->mem_s && !o->pick)
        why = "--mem-gb is the budget of --pick; add --pick";
    else if (o->pick && !o->shaped && !o->tok_s)
        why = "--pick needs --model or --config (micro-batches searched) or --tokens-per-gpu (tokens fixed)";
    else if (o->pick && o->mem_s && !(o->mem_gb > 0))
        why = "--mem-gb must be > 0";
    else if (o->pick && o->micro_batch && !o->shaped)
        why = "--micro-batch with --pick caps the micro-batch search, which needs --model or --config";
    else if (o->micro_batch && !o->pick && (!o->shaped || o->tok_s))
        why = "--micro-batch needs --model or --config (tokens = B x seq_len) and replaces --tokens-per-gpu";
    else if (o->pick && o->shaped && o->tok_s)
        why = "--pick with a model shape searches the micro-batch; drop --tokens-per-gpu "
              "(--micro-batch B caps the search at B)";
    if (why) {
        fprintf(stderr, "zeropp plan: %s\n", why);
        return 2;
    }
    if (o->micro_batch && !o->pick) o->tokens = (double)o->micro_batch * ci->seq_len;
    if (o->pick && o->shaped)
        o->tokens = ci->seq_len; /* micro-batch 1, for the checks below; the pick varies it */
    return PLAN_GO;
}

/* The machine: the --gpu preset's FLOP/s, HBM and NVLink rates where no
 * flag set them, and the model and its links into ci (line rates x
 * --link-eff; --calibrate may replace them). */
static int plan_machine(plan_opts *o, zpp_cost_in *ci) {
    o->gpu = zpp_cost_gpu_by_name("h200");
    if (o->gpu_s) {
        o->gpu = zpp_cost_gpu_by_name(o->gpu_s);
        if (!o->gpu) {
            fprintf(stderr, "zeropp plan: unknown --gpu '%s'; use v100, a100, h100 or h200\n",
                    o->gpu_s);
            return 2;
        }
    }
    if (!o->tflops) o->tflops = o->gpu->tensor_tflops * PLAN_GPU_EFFICIENCY;
    if (o->hbm < 0) o->hbm = o->gpu->hbm_gbs;
    if (!o->intra) o->intra = o->gpu->nvlink_gbps;
    o->timed = o->tokens > 0;
    if (o->timed && (!(o->inter > 0) || !(o->intra > 0) || !(o->eff > 0) || o->eff > 1 ||
                     !(o->tflops > 0))) {
        fprintf(stderr, "zeropp plan: bandwidths and --tflops must be > 0 and --link-eff in "
                        "(0, 1]\n");
        return 2;
    }
    ci->params = (double)o->params;
    ci->reuse_distance = (double)o->reuse;
    ci->units = o->units;
    ci->world = o->world;
    ci->node_size = o->node_size;
    ci->dtype = o->dtype;
    ci->tokens_per_gpu = o->tokens;
    ci->inter_bps = o->inter * 1e9 / 8 * o->eff;
    ci->intra_bps = o->intra * 1e9 / 8 * o->eff;
    return PLAN_GO;
}

/* What --calibrate measured, in a few lines of text (not with --json). */
static void calib_print(const plan_opts *o, const zpp_cost_calib *cal) {
    char x[96], y[96];
    if (cal->inter_bps > 0)
        snprintf(x, sizeof x, "%.2f Gb/s per node from ZeRO-3's gathers%s",
                 cal->inter_bps * 8 / 1e9,
                 cal->inter_lower_bound ? " (a lower bound: intra-node bound)" : "");
    else
        snprintf(x, sizeof x, "not measured (--inter-gbps)");
    if (cal->intra_bps > 0)
        snprintf(y, sizeof y, "%.2f Gb/s per GPU from hpZ's backward gathers",
                 cal->intra_bps * 8 / 1e9);
    else
        snprintf(y, sizeof y, "not measured (--intra-gbps)");
    printf("calibrated from %s (%d lines): cross-node %s; intra-node %s; latency "
           "%.1f us from --latency-us (one message size cannot separate it)\n",
           o->cal_s, cal->lines, x, y, o->lat);
    if (cal->coll_world) {
        int used = cal->coll_world == o->world && cal->coll_node_size == o->node_size;
        printf("measured collective times (world %d, node size %d, %d units): %s\n",
               cal->coll_world, cal->coll_node_size, cal->coll_units,
               used ? "used for the modes measured"
                    : "not used (another world or node size: the link formula)");
    }
    if (cal->flops_per_s > 0)
        printf("compute from %d train steps of %d-rank runs at %d token count%s: %.4g "
               "TFLOP/s%s\n",
               cal->train_lines, cal->train_world, cal->train_points,
               cal->train_points == 1 ? "" : "s", cal->flops_per_s / 1e12,
               cal->train_points > 1 ? ", optimizer fitted" : " (optimizer folded in)");
}

/* --calibrate FILE: the measured rates replace the line rates (already
 * achieved: no --link-eff), the compute rate --tflops, the fitted optimizer
 * time --opt-ns; a flag for something the file measured is refused. ci
 * keeps a pointer to cal. */
static int plan_calibrate(plan_opts *o, zpp_cost_in *ci, zpp_cost_calib *cal) {
    if (zpp_cost_calibrate(o->cal_s, o->lat * 1e-6, ci, cal) != ZPP_OK) {
        fprintf(stderr, "zeropp plan: %s\n", zpp_last_error());
        return 2;
    }
    const int inter_clash = cal->inter_bps > 0 && o->inter_s;
    if (inter_clash || (cal->intra_bps > 0 && o->intra_s)) {
        fprintf(stderr, "zeropp plan: --calibrate measured the %s bandwidth that --%s-gbps "
                        "also sets; drop one\n",
                inter_clash ? "cross-node" : "intra-node", inter_clash ? "inter" : "intra");
        return 2;
    }
    const int tflops_clash = cal->flops_per_s > 0 && o->tf_s;
    if (tflops_clash || (cal->train_points > 1 && o->opt_s)) {
        fprintf(stderr, "zeropp plan: --calibrate measured the %s that --%s also sets; "
                        "drop one\n",
                tflops_clash ? "compute rate" : "optimizer time",
                tflops_clash ? "tflops" : "opt-ns");
        return 2;
    }
    if (cal->inter_bps > 0) ci->inter_bps = cal->inter_bps;
    if (cal->intra_bps > 0) ci->intra_bps = cal->intra_bps;
    if (cal->flops_per_s > 0) {
        o->tflops = cal->flops_per_s / 1e12;
        if (cal->train_points > 1) o->opt_ns = cal->opt_s_per_param * 1e9;
    }
    if (cal->coll_world) ci->calib = cal;
    if (cal->train_world > 1 && o->rpd_s && o->rpd > 1) {
        fprintf(stderr, "zeropp plan: the train lines come from runs on these ranks, so "
                        "their rate already holds the device sharing; drop "
                        "--ranks-per-device\n");
        return 2;
    }
    if (!o->json) calib_print(o, cal);
    return PLAN_GO;
}

/* The schedule: how the machine runs a step (DESIGN.md section 11). */
static void plan_schedule(const plan_opts *o, zpp_cost_in *ci) {
    ci->latency_s = o->lat * 1e-6;
    ci->flops_per_s = o->tflops * 1e12;
    ci->qgz_inter_exposed = !o->qgz_overlap;
    ci->ranks_per_device = o->rpd;
    ci->serial = o->serial;
    ci->exposed_frac = o->expf;
    ci->link_per_comm = o->link_per_comm;
    ci->opt_s_per_param = o->opt_ns * 1e-9;
    ci->hbm_bps = o->hbm * 1e9 * o->hbm_eff;
    ci->recompute = o->recompute;
    ci->keep_acts = o->keep_acts | (o->keep_all ? ZPP_KEEP_ALL : 0) |
                    (o->keep_ln ? ZPP_KEEP_LAYERNORM : 0);
    ci->resident_weights = zpp_engine_config_default().resident_weights;
    ci->work_grads = zpp_engine_config_default().work_grads; /* one micro-batch a step */
}

/* ---- the step table: each mode's bytes, and with tokens its times ---- */

/* The three phases in the order of the table and the JSON keys. */
static const zpp_phase plan_phases[3] = {ZPP_PHASE_FWD_GATHER, ZPP_PHASE_BWD_GATHER,
                                         ZPP_PHASE_GRAD_REDUCE};

/* Mode m's object: its bytes per phase, and with tokens (o->timed) its
 * predicted step. NULL when out of memory. */
static cJSON *step_json(const plan_opts *o, const zpp_cost_in *ci, const zpp_volume *v,
                        const zpp_cost_out *co, int m) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    const double z3 = zpp_volume_cross_total(&v[0]);
    cJSON_AddStringToObject(j, "plan", "step");
    cJSON_AddStringToObject(j, "mode", zpp_coll_mode_get(m)->name);
    cJSON_AddNumberToObject(j, "params", (double)o->params);
    if (o->shaped)
        cJSON_AddStringToObject(j, "family", ci->family == ZPP_COST_LLAMA ? "llama" : "gpt2");
    cJSON_AddNumberToObject(j, "units", o->units);
    cJSON_AddNumberToObject(j, "reuse_distance", (double)o->reuse);
    cJSON_AddNumberToObject(j, "kept_units", zpp_cost_kept_units(ci));
    cJSON_AddNumberToObject(j, "world", o->world);
    cJSON_AddNumberToObject(j, "node_size", o->node_size);
    cJSON_AddNumberToObject(j, "nodes", o->world / o->node_size);
    cJSON_AddStringToObject(j, "dtype", zpp_dtype_name(o->dtype));
    cJSON_AddNumberToObject(j, "cross_node_bytes", zpp_volume_cross_total(&v[m]));
    cJSON_AddNumberToObject(j, "intra_node_bytes", zpp_volume_intra_total(&v[m]));
    cJSON_AddNumberToObject(j, "cross_vs_zero3",
                            z3 > 0 ? zpp_volume_cross_total(&v[m]) / z3 : 0.0);
    for (int k = 0; k < 3; k++) {
        char key[64];
        const zpp_phase ph = plan_phases[k];
        const char *pn = zpp_phase_name(ph);
        snprintf(key, sizeof key, "%s_cross_bytes", pn);
        cJSON_AddNumberToObject(j, key, v[m].cross_node_bytes[ph]);
        snprintf(key, sizeof key, "%s_intra_bytes", pn);
        cJSON_AddNumberToObject(j, key, v[m].intra_node_bytes[ph]);
        snprintf(key, sizeof key, "%s_payload_bytes", pn);
        cJSON_AddNumberToObject(j, key, v[m].payload_bytes[ph]);
    }
    if (!o->timed) return j;
    const zpp_cost_out *c = &co[m];
    cJSON_AddNumberToObject(j, "tokens_per_gpu", o->tokens);
    cJSON_AddNumberToObject(j, "inter_bps", ci->inter_bps);
    cJSON_AddNumberToObject(j, "intra_bps", ci->intra_bps);
    cJSON_AddNumberToObject(j, "step_s", c->step_s);
    cJSON_AddNumberToObject(j, "fwd_s", c->fwd_s);
    cJSON_AddNumberToObject(j, "bwd_s", c->bwd_s);
    cJSON_AddNumberToObject(j, "compute_s", c->compute_s);
    cJSON_AddNumberToObject(j, "opt_s", c->opt_s);
    cJSON_AddNumberToObject(j, "quant_s", c->quant_s);
    cJSON_AddNumberToObject(j, "exposed_comm_s", c->exposed_comm_s);
    cJSON_AddNumberToObject(j, "tokens_per_s", c->tokens_per_s);
    cJSON_AddNumberToObject(j, "tflops_per_gpu", c->tflops_per_gpu);
    cJSON_AddNumberToObject(j, "speedup_vs_zero3", co[0].step_s / c->step_s);
    cJSON_AddNumberToObject(j, "mem_bytes_per_rank", c->mem_bytes_per_rank);
    cJSON_AddNumberToObject(j, "mem_acts_bytes", c->mem_acts);
    cJSON_AddNumberToObject(j, "mem_kept_bytes", c->mem_kept);
    cJSON_AddBoolToObject(j, "mem_acts_known", c->mem_acts_known);
    return j;
}

/* The text table of bytes per node, cross-node and intra-node by phase. */
static void print_bytes(const plan_opts *o, const zpp_cost_in *ci, const zpp_volume *v) {
    const zpp_coll_opts opts = zpp_coll_opts_default();
    const int nodes = o->world / o->node_size, kept = zpp_cost_kept_units(ci);
    const double z3 = zpp_volume_cross_total(&v[0]);
    const zpp_phase *ph = plan_phases;
    printf("zeropp plan: %s%zu parameters (%s) in %d units, world %d = %d node%s x %d rank%s\n",
           ci->family == ZPP_COST_LLAMA ? "Llama, " : "", o->params, zpp_dtype_name(o->dtype),
           o->units, o->world, nodes, nodes == 1 ? "" : "s",
           o->node_size, o->node_size == 1 ? "" : "s");
    printf("bytes per node per step (DESIGN.md section 5; qwZ int8 block %zu, qgZ int4 block "
           "%zu, scales and padding included)\n",
           opts.weight_spec.block, opts.grad_spec.block);
    if (kept)
        printf("backward: the last %d of %d units stay gathered from the forward, no backward "
               "gather (--reuse-distance %zu; 0 gathers each again)\n\n",
               kept, o->units, o->reuse);
    else
        printf("backward: every unit gathered again (%s)\n\n",
               o->world == 1 ? "one rank" : "--reuse-distance 0");
    printf("%-7s | %11s %11s %11s %11s %8s | %11s %11s %11s %11s\n", "", "cross-node", "", "",
           "", "", "intra-node", "", "", "");
    printf("%-7s | %11s %11s %11s %11s %8s | %11s %11s %11s %11s\n", "mode", "fwd gather",
           "bwd gather", "grad reduce", "total", "/zero3", "fwd gather", "bwd gather",
           "grad reduce", "total");
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        char b[8][32];
        double ct = zpp_volume_cross_total(&v[m]);
        printf("%-7s | %11s %11s %11s %11s %8.4f | %11s %11s %11s %11s\n",
               zpp_coll_mode_get(m)->name,
               zpp_cli_bytes(v[m].cross_node_bytes[ph[0]], b[0], 32),
               zpp_cli_bytes(v[m].cross_node_bytes[ph[1]], b[1], 32),
               zpp_cli_bytes(v[m].cross_node_bytes[ph[2]], b[2], 32), zpp_cli_bytes(ct, b[3], 32),
               z3 > 0 ? ct / z3 : 0.0, zpp_cli_bytes(v[m].intra_node_bytes[ph[0]], b[4], 32),
               zpp_cli_bytes(v[m].intra_node_bytes[ph[1]], b[5], 32),
               zpp_cli_bytes(v[m].intra_node_bytes[ph[2]], b[6], 32),
               zpp_cli_bytes(zpp_volume_intra_total(&v[m]), b[7], 32));
    }
}

/* The text table of predicted steps, after the machine it assumes. */
static void print_times(const plan_opts *o, const zpp_cost_in *ci, const zpp_cost_out *co) {
    char links[160];
    if (o->cal_s) /* achieved rates, whichever the file measured */
        snprintf(links, sizeof links,
                 "cross-node %.2f Gb/s per node, intra-node %.2f Gb/s per GPU (achieved)",
                 ci->inter_bps * 8 / 1e9, ci->intra_bps * 8 / 1e9);
    else
        snprintf(links, sizeof links,
                 "cross-node %.0f Gb/s per node, intra-node %.0f Gb/s per GPU (x %.2f link "
                 "efficiency)",
                 o->inter, o->intra, o->eff);
    printf("\npredicted step (DESIGN.md section 11): %.0f tokens per GPU, %.4g TFLOP/s "
           "achieved per GPU, %s, latency %.1f us per step; qgZ cross-node step %s\n",
           o->tokens, o->tflops, links, o->lat,
           o->qgz_overlap ? "pipelined" : "exposed (as run today)");
    printf("quantization kernels at %.0f GB/s of HBM (x %.2f)%s\n", o->hbm, o->hbm_eff,
           o->recompute ? "; the backward recomputes the forward (--recompute)" : "");
    if (o->serial || o->link_per_comm || o->rpd > 1 || o->opt_ns > 0 || ci->calib)
        printf("schedule: %s; %g rank%s per device; %s; optimizer %.3g ns per parameter of "
               "a shard%s\n",
               o->serial ? "compute and communication take turns (--serial)"
                         : "communication under compute",
               o->rpd, o->rpd == 1 ? "" : "s",
               o->link_per_comm ? "a link per communicator"
                                : "concurrent collectives share the link",
               o->opt_ns,
               ci->calib && ci->calib->coll_world == o->world &&
                       ci->calib->coll_node_size == o->node_size
                   ? "; measured collective times"
                   : "");
    printf("%-7s | %10s %10s %10s %12s %9s %8s | %12s\n", "mode", "step", "compute", "exposed",
           "tokens/s", "TFLOP/s", "speedup", "mem/rank");
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        const zpp_cost_out *c = &co[m];
        char b[32];
        printf("%-7s | %8.1fms %8.1fms %8.1fms %12.0f %9.3g %7.2fx | %12s%s\n",
               zpp_coll_mode_get(m)->name, c->step_s * 1e3, c->compute_s * 1e3,
               c->exposed_comm_s * 1e3, c->tokens_per_s, c->tflops_per_gpu,
               co[0].step_s / c->step_s, zpp_cli_bytes(c->mem_bytes_per_rank, b, 32),
               c->mem_acts_known ? "" : " + acts");
    }
    if (!co[0].mem_acts_known)
        printf("memory without activations: pass --model or --config for the activation count\n");
}

/* Every mode priced (volume.c's replay less the backward gathers the reuse
 * rule saves; with tokens, zpp_cost_step), then printed: one JSON object
 * per mode, or the tables. */
static int plan_step(const plan_opts *o, const zpp_cost_in *ci) {
    zpp_cost_out co[ZPP_COLL_MODE_COUNT];
    zpp_volume v[ZPP_COLL_MODE_COUNT];
    memset(co, 0, sizeof co);
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        int st = zpp_cost_volume(ci, zpp_coll_mode_get(m), &v[m]);
        if (st == ZPP_OK && o->timed) st = zpp_cost_step(ci, zpp_coll_mode_get(m), &co[m]);
        if (st != ZPP_OK) {
            fprintf(stderr, "zeropp %s\n", zpp_last_error()); /* "plan: ..." */
            return 2;
        }
    }
    if (o->json) {
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            cJSON *j = step_json(o, ci, v, co, m);
            if (!j) return zpp_cli_fail("plan: out of memory", 1);
            char *s = cJSON_PrintUnformatted(j);
            if (s) printf("%s\n", s);
            cJSON_free(s);
            cJSON_Delete(j);
        }
        return 0;
    }
    print_bytes(o, ci, v);
    if (o->timed) print_times(o, ci, co);
    if (o->world / o->node_size == 1)
        printf("\none node: nothing crosses a node boundary; pass --node-size to split the "
               "world into nodes\n");
    return 0;
}

/* `zeropp plan`: the options, the machine, the calibration, then a sweep, a
 * pick or the step table. Nothing to free: one exit, the first step that
 * ends the command gives the code. */
int zpp_cli_plan(int argc, char **argv) {
    plan_opts o;
    zpp_cost_in ci;
    zpp_cost_calib cal; /* ci.calib points here */
    memset(&cal, 0, sizeof cal);
    int rc = plan_parse(argc, argv, &o, &ci);
    if (rc == PLAN_GO) rc = plan_check(&o, &ci);
    if (rc == PLAN_GO) rc = plan_machine(&o, &ci);
    if (rc == PLAN_GO && o.cal_s) rc = plan_calibrate(&o, &ci, &cal);
    if (rc == PLAN_GO) {
        plan_schedule(&o, &ci);
        if (o.sweep_s && !o.timed) {
            fprintf(stderr, "zeropp plan: --sweep predicts step times; give --tokens-per-gpu "
                            "or --micro-batch\n");
            rc = 2;
        } else if (o.sweep_s) {
            rc = plan_sweep(&ci, o.sweep_s, o.chart_s, o.json, cal.inter_bps > 0 ? 1.0 : o.eff);
        } else if (o.pick) {
            const int from_preset = !o.mem_s; /* the budget: --mem-gb, or the GPU's memory */
            zpp_cost_pick_filter filter = {o.modes, o.n_mbs ? o.mbs : NULL, o.n_mbs,
                                           o.n_hpzs ? o.hpzs : NULL, o.n_hpzs};
            rc = plan_pick(&ci, from_preset ? o.gpu->mem_gib : o.mem_gb,
                           from_preset ? o.gpu->name : NULL, o.micro_batch, &filter, o.json);
        } else {
            rc = plan_step(&o, &ci);
        }
    }
    return rc;
}
