/* tools/plan.c — `zeropp plan`: the bytes one training step moves per node,
 * for each of ZeRO-3, qwZ, hpZ, qgZ and ZeRO++, computed from the
 * DESIGN.md §5 formulas without running anything (no MPI).
 *
 * The numbers come from zpp_plan_step (collectives/volume.c), which replays
 * the backend calls the live collectives make through the same accounting
 * function they use, so `zeropp plan` and `zeropp bench comm` agree byte for
 * byte (bench comm checks it). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "collectives/collectives.h"
#include "zeropp.h"

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp plan --params P --world W [--node-size S] [--units U] [--dtype bf16]\n"
            "                   [--json]\n"
            "\n"
            "Cross-node and intra-node bytes per node for one training step of a model of P\n"
            "parameters cut into U equal units (default 8), on W ranks in nodes of S ranks\n"
            "(default: one node of W). P takes a suffix: k, M, B\n"
            "(decimal: 125M, 1.5B) or Ki, Mi, Gi (binary: 64Mi = 2^26). Volumes follow\n"
            "DESIGN.md section 5 (the ring-optimal volume of each collective as called);\n"
            "quantized paths count payload, scales and padding. --json prints one object per\n"
            "mode.\n");
}




int zpp_cli_plan(int argc, char **argv) {
    size_t params = 0;
    int world = 0, node_size = 0, units = 8, json = 0;
    zpp_dtype dtype = ZPP_BF16;
    const char *dtype_s = NULL;
    const zpp_cli_opt cli_opts[] = {
        {"--json", ZPP_CLI_FLAG, &json, 0, 0},
        {"--params", ZPP_CLI_SIZE, &params, 1, 1ll << 53},
        {"--world", ZPP_CLI_INT, &world, 1, 1 << 24},
        {"--node-size", ZPP_CLI_INT, &node_size, 1, 1 << 24},
        {"--units", ZPP_CLI_INT, &units, 1, 1 << 24},
        {"--dtype", ZPP_CLI_STR, &dtype_s, 0, 0},
    };
    int pr = zpp_cli_parse_opts("plan", argc, argv, cli_opts,
                                (int)(sizeof cli_opts / sizeof cli_opts[0]), 1);
    if (pr > 0) {
        plan_usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (dtype_s && zpp_dtype_parse(dtype_s, &dtype) != ZPP_OK)
        return zpp_cli_fail("plan: --dtype", 1);
    if (!params || !world) {
        fprintf(stderr, "zeropp plan: --params and --world are required\n\n");
        plan_usage(stderr);
        return 2;
    }
    if (!node_size) node_size = world;
    zpp_coll_opts opts = zpp_coll_opts_default();
    zpp_volume v[ZPP_COLL_MODE_COUNT];
    for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
        int st = zpp_plan_step(params, units, world, node_size, zpp_coll_mode_get(m), dtype,
                               &opts, &v[m]);
        if (st != ZPP_OK) {
            fprintf(stderr, "zeropp %s\n", zpp_last_error()); /* "plan: ..." */
            return 2;
        }
    }
    int nodes = world / node_size;
    double z3 = zpp_volume_cross_total(&v[0]);
    const zpp_phase ph[3] = {ZPP_PHASE_FWD_GATHER, ZPP_PHASE_BWD_GATHER, ZPP_PHASE_GRAD_REDUCE};

    if (json) {
        for (int m = 0; m < ZPP_COLL_MODE_COUNT; m++) {
            cJSON *o = cJSON_CreateObject();
            if (!o) return zpp_cli_fail("plan: out of memory", 1);
            cJSON_AddStringToObject(o, "plan", "step");
            cJSON_AddStringToObject(o, "mode", zpp_coll_mode_get(m)->name);
            cJSON_AddNumberToObject(o, "params", (double)params);
            cJSON_AddNumberToObject(o, "units", units);
            cJSON_AddNumberToObject(o, "world", world);
            cJSON_AddNumberToObject(o, "node_size", node_size);
            cJSON_AddNumberToObject(o, "nodes", nodes);
            cJSON_AddStringToObject(o, "dtype", zpp_dtype_name(dtype));
            cJSON_AddNumberToObject(o, "cross_node_bytes", zpp_volume_cross_total(&v[m]));
            cJSON_AddNumberToObject(o, "intra_node_bytes", zpp_volume_intra_total(&v[m]));
            cJSON_AddNumberToObject(o, "cross_vs_zero3",
                                    z3 > 0 ? zpp_volume_cross_total(&v[m]) / z3 : 0.0);
            for (int k = 0; k < 3; k++) {
                char key[64];
                const char *pn = zpp_phase_name(ph[k]);
                snprintf(key, sizeof key, "%s_cross_bytes", pn);
                cJSON_AddNumberToObject(o, key, v[m].cross_node_bytes[ph[k]]);
                snprintf(key, sizeof key, "%s_intra_bytes", pn);
                cJSON_AddNumberToObject(o, key, v[m].intra_node_bytes[ph[k]]);
                snprintf(key, sizeof key, "%s_payload_bytes", pn);
                cJSON_AddNumberToObject(o, key, v[m].payload_bytes[ph[k]]);
            }
            char *s = cJSON_PrintUnformatted(o);
            if (s) printf("%s\n", s);
            cJSON_free(s);
            cJSON_Delete(o);
        }
        return 0;
    }

    printf("zeropp plan: %zu parameters (%s) in %d units, world %d = %d node%s x %d rank%s\n",
           params, zpp_dtype_name(dtype), units, world, nodes, nodes == 1 ? "" : "s", node_size,
           node_size == 1 ? "" : "s");
    printf("bytes per node per step (DESIGN.md section 5; qwZ int8 block %zu, qgZ int4 block "
           "%zu, scales and padding included)\n\n",
           opts.weight_spec.block, opts.grad_spec.block);
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
    if (nodes == 1)
        printf("\none node: nothing crosses a node boundary; pass --node-size to split the "
               "world into nodes\n");
    return 0;
}
