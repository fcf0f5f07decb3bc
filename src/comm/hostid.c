/* comm/hostid.c — NCCL host identities of emulated nodes (hostid.h). */
#include "comm/hostid.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

static int hostid_terminated(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL; }

static int hostid_same_gpu(const zpp_hostid_rank *a, const zpp_hostid_rank *b) {
    return strcmp(a->prefix, b->prefix) == 0 && strcasecmp(a->bus_id, b->bus_id) == 0;
}

int zpp_hostid_node_shares(const zpp_hostid_rank *ranks, int node_size, int node, int *rank_p) {
    const zpp_hostid_rank *r = ranks + (size_t)node * (size_t)node_size;
    for (int i = 0; i < node_size; i++)
        for (int j = i + 1; j < node_size; j++)
            if (hostid_same_gpu(&r[i], &r[j])) {
                if (rank_p) *rank_p = node * node_size + i;
                return 1;
            }
    if (rank_p) *rank_p = -1;
    return 0;
}

/* The checks both entry points share; clears out first. */
static zpp_status hostid_check(const char *what, const zpp_hostid_rank *ranks, int world,
                               int node_size, char *out, size_t cap) {
    if (out && cap) out[0] = '\0';
    if (!ranks || !out || cap == 0)
        return zpp_error(ZPP_ERR_INVALID, "%s: NULL ranks or output buffer, or a buffer of 0 bytes",
                         what);
    if (world <= 0 || node_size <= 0 || world % node_size != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: %d ranks do not cut into nodes of %d; pass a positive node size "
                         "that divides the world",
                         what, world, node_size);
    for (int r = 0; r < world; r++)
        if (!hostid_terminated(ranks[r].prefix, sizeof ranks[r].prefix) ||
            !hostid_terminated(ranks[r].bus_id, sizeof ranks[r].bus_id))
            return zpp_error(ZPP_ERR_INVALID,
                             "%s: rank %d's host prefix or GPU bus id is not a terminated "
                             "string",
                             what, r);
    return ZPP_OK;
}

/* snprintf into out, or ZPP_ERR_INVALID (out cleared) when it does not fit. */
static zpp_status hostid_fits(const char *what, int n, char *out, size_t cap) {
    if (n >= 0 && (size_t)n < cap) return ZPP_OK;
    out[0] = '\0';
    return zpp_error(ZPP_ERR_INVALID, "%s: needs %d bytes, the buffer holds %zu", what, n + 1,
                     cap);
}

zpp_status zpp_hostid_emulated(const zpp_hostid_rank *ranks, int world, int node_size, int rank,
                               char *out, size_t cap, int *shared_p) {
    static const char what[] = "emulated NCCL_HOSTID";
    if (shared_p) *shared_p = 0;
    ZPP_CHECK(hostid_check(what, ranks, world, node_size, out, cap));
    if (rank < 0 || rank >= world)
        return zpp_error(ZPP_ERR_INVALID, "%s: rank %d outside the world of %d", what, rank,
                         world);
    const int node = rank / node_size, local = rank % node_size;
    const int shared = zpp_hostid_node_shares(ranks, node_size, node, NULL);
    int n = shared ? snprintf(out, cap, "%s-zppnode%d-r%d", ranks[rank].prefix, node, local)
                   : snprintf(out, cap, "%s-zppnode%d", ranks[rank].prefix, node);
    ZPP_CHECK(hostid_fits(what, n, out, cap));
    if (shared_p) *shared_p = shared;
    return ZPP_OK;
}

zpp_status zpp_hostid_note(const zpp_hostid_rank *ranks, int world, int node_size, char *out,
                           size_t cap) {
    static const char what[] = "emulated nodes' note";
    ZPP_CHECK(hostid_check(what, ranks, world, node_size, out, cap));
    const int nodes = world / node_size;
    int first = -1, first_rank = -1, others = 0;
    for (int m = 0; m < nodes; m++) {
        int r = -1;
        if (!zpp_hostid_node_shares(ranks, node_size, m, &r)) continue;
        if (first < 0) {
            first = m;
            first_rank = r;
        } else {
            others++;
        }
    }
    if (first < 0) return ZPP_OK;
    char also[64] = "";
    if (others)
        snprintf(also, sizeof also, " (as do those of %d other node%s)", others,
                 others == 1 ? "" : "s");
    int n = snprintf(out, cap,
                     "ranks of node %d share GPU %s%s: each talks over sockets, as a separate "
                     "host; the topology stays %d node%s of %d",
                     first, ranks[first_rank].bus_id, also, nodes, nodes == 1 ? "" : "s",
                     node_size);
    return hostid_fits(what, n, out, cap);
}
