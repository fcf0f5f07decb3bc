/* comm/hostid.h — the NCCL host identity of each rank of emulated nodes.
 * Pure functions (no MPI, no NCCL, no GPU), so every decision is tested on
 * the CPU (tests/test_hostid.c); comm_nccl.c feeds them what the ranks
 * exchanged over MPI.
 *
 * NCCL tells hosts apart by NCCL_HOSTID alone when it is set, and refuses
 * two ranks of one host on one GPU ("Duplicate GPU detected: rank 0 and
 * rank 1 both on CUDA device ..."). With emulated nodes
 * (zpp_topo_opts.emulate_nodes) every node is one NCCL host,
 * "<prefix>-zppnode<n>", so the ranks of a node that share a GPU (more
 * ranks than GPUs: 4 ranks as 2 nodes of 2 on one GPU) would be refused.
 * The ranks of such a node each become an NCCL host of their own,
 * "<prefix>-zppnode<n>-r<local>": NCCL then connects them over its network
 * transport (sockets), as it does between nodes, while zeropp's topology
 * (which ranks form a node: hpZ's partition, qgZ's intra-node step) stays as
 * configured. A node whose ranks have distinct GPUs keeps its one id (NVLink
 * inside it). DESIGN.md §6, docs/emulated-nodes.md.
 *
 * Two ranks share a GPU when both their prefixes and their GPUs' PCI bus
 * ids are equal: what NCCL compares (its host hash comes from the id, which
 * starts with the prefix; the prefix is the host name by default, so equal
 * bus ids on different real hosts are different GPUs). */
#ifndef ZPP_COMM_HOSTID_H
#define ZPP_COMM_HOSTID_H

#include <stddef.h>

#include "zeropp.h"

#define ZPP_HOSTID_PREFIX_CAP 128
#define ZPP_HOSTID_BUS_CAP 32
/* Bytes an id can need: the prefix, "-zppnode", "-r" and two ints. */
#define ZPP_HOSTID_CAP (ZPP_HOSTID_PREFIX_CAP + 40)

/* What one rank tells the others; plain bytes, exchanged as such over MPI. */
typedef struct zpp_hostid_rank {
    char prefix[ZPP_HOSTID_PREFIX_CAP]; /* ZPP_NCCL_HOSTID_PREFIX, else its host name */
    char bus_id[ZPP_HOSTID_BUS_CAP];    /* its GPU's PCI bus id (zpp_device_gpu_bus_id) */
} zpp_hostid_rank;

/* 1 when two ranks of node `node` (ranks node * node_size .. + node_size - 1
 * of `ranks`) share a GPU, else 0; *rank_p (may be NULL) gets the lower rank
 * of the first such pair, -1 when none. Bus ids compare without regard to
 * case. The caller checks the arguments (zpp_hostid_emulated does). */
int zpp_hostid_node_shares(const zpp_hostid_rank *ranks, int node_size, int node, int *rank_p);

/* The NCCL_HOSTID of rank `rank` of `world` ranks cut into nodes of
 * `node_size` consecutive ranks, with emulated nodes: "<prefix>-zppnode<n>",
 * or "<prefix>-zppnode<n>-r<local>" when the ranks of its node share a GPU
 * (then *shared_p = 1, else 0; shared_p may be NULL). The prefix is the
 * rank's own. ZPP_ERR_INVALID with a message, and out[0] = '\0' where out
 * can hold it, for: NULL ranks or out, world or node_size not positive,
 * node_size not dividing world, rank outside [0, world), a prefix or bus
 * id without its terminating NUL, or an id that does not fit in cap bytes. */
zpp_status zpp_hostid_emulated(const zpp_hostid_rank *ranks, int world, int node_size, int rank,
                               char *out, size_t cap, int *shared_p);

/* For people (the trainer prints it): "" when no node's ranks share a GPU,
 * else "ranks of node 0 share GPU 0000:1b:00.0 (as do those of 1 other
 * node): each talks over sockets, as a separate host; the topology stays 2
 * nodes of 2" (the lowest node that shares and its GPU; the parenthesis
 * only when other nodes do too). The same arguments and errors as
 * zpp_hostid_emulated, out too small included. */
zpp_status zpp_hostid_note(const zpp_hostid_rank *ranks, int world, int node_size, char *out,
                           size_t cap);

#endif
