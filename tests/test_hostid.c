/* test_hostid.c — the NCCL host identities of emulated nodes (comm/hostid.h):
 * which ranks share a GPU, each rank's NCCL_HOSTID, and the note the trainer
 * prints. Pure functions: no MPI, no GPU. The GPU side (NCCL accepting 2
 * nodes of 2 ranks on one GPU) is test_comm_nccl's
 * test_nccl_emulated_nodes_of_two and test_train's
 * test_gpu_hpz_nodes_of_two_matches_cpu. */
#include <string.h>

#include "comm/hostid.h"
#include "testlib.h"

#define BUS_A "0000:1b:00.0"
#define BUS_B "0000:43:00.0"

/* `world` ranks on `prefix`, rank r on GPU bus[r]. */
static void make(zpp_hostid_rank *r, int world, const char *prefix, const char *const *bus) {
    memset(r, 0, (size_t)world * sizeof *r);
    for (int i = 0; i < world; i++) {
        snprintf(r[i].prefix, sizeof r[i].prefix, "%s", prefix);
        snprintf(r[i].bus_id, sizeof r[i].bus_id, "%s", bus[i]);
    }
}

/* Rank `rank`'s id must be `want`, and its node's sharing `shared`. */
static void expect_id(const zpp_hostid_rank *r, int world, int node_size, int rank,
                      const char *want, int shared) {
    char out[ZPP_HOSTID_CAP];
    int got_shared = -1;
    EXPECT_OK(zpp_hostid_emulated(r, world, node_size, rank, out, sizeof out, &got_shared));
    EXPECT(strcmp(out, want) == 0, "rank %d of %d (nodes of %d): id '%s', expected '%s'", rank,
           world, node_size, out, want);
    EXPECT(got_shared == shared, "rank %d: shared %d, expected %d", rank, got_shared, shared);
}

static void expect_note(const zpp_hostid_rank *r, int world, int node_size, const char *want) {
    char out[320];
    EXPECT_OK(zpp_hostid_note(r, world, node_size, out, sizeof out));
    EXPECT(strcmp(out, want) == 0, "note '%s', expected '%s'", out, want);
}

/* Every rank on a GPU of its own: the ids are one per node, as before. */
static void test_distinct_gpus_keep_node_ids(void) {
    const char *bus[4] = {BUS_A, BUS_B, "0000:9a:00.0", "0000:c3:00.0"};
    zpp_hostid_rank r[4];
    make(r, 4, "gpuhost", bus);
    for (int rank = 0; rank < 4; rank++)
        expect_id(r, 4, 2, rank, rank < 2 ? "gpuhost-zppnode0" : "gpuhost-zppnode1", 0);
    EXPECT(!zpp_hostid_node_shares(r, 2, 0, NULL) && !zpp_hostid_node_shares(r, 2, 1, NULL));
    expect_note(r, 4, 2, "");
    /* nodes of one rank never share, even all on one GPU */
    const char *one[4] = {BUS_A, BUS_A, BUS_A, BUS_A};
    make(r, 4, "gpuhost", one);
    for (int rank = 0; rank < 4; rank++) {
        char want[64];
        snprintf(want, sizeof want, "gpuhost-zppnode%d", rank);
        expect_id(r, 4, 1, rank, want, 0);
    }
    expect_note(r, 4, 1, "");
}

/* 4 ranks as 2 nodes of 2 on one GPU (issue 28 item 5): every rank is a
 * host of its own; the note names node 0, its GPU and the other node. */
static void test_node_of_two_on_one_gpu_gets_rank_ids(void) {
    const char *bus[4] = {BUS_A, BUS_A, BUS_A, BUS_A};
    zpp_hostid_rank r[4];
    make(r, 4, "gpuhost", bus);
    expect_id(r, 4, 2, 0, "gpuhost-zppnode0-r0", 1);
    expect_id(r, 4, 2, 1, "gpuhost-zppnode0-r1", 1);
    expect_id(r, 4, 2, 2, "gpuhost-zppnode1-r0", 1);
    expect_id(r, 4, 2, 3, "gpuhost-zppnode1-r1", 1);
    int first = -2;
    EXPECT(zpp_hostid_node_shares(r, 2, 1, &first) && first == 2, "node 1: first %d", first);
    expect_note(r, 4, 2,
                "ranks of node 0 share GPU " BUS_A " (as do those of 1 other node): each talks "
                "over sockets, as a separate host; the topology stays 2 nodes of 2");

    /* Only node 1 shares (node 0 has two GPUs): node 0 keeps its one id. */
    const char *mixed[4] = {BUS_A, BUS_B, BUS_B, BUS_B};
    make(r, 4, "gpuhost", mixed);
    expect_id(r, 4, 2, 0, "gpuhost-zppnode0", 0);
    expect_id(r, 4, 2, 1, "gpuhost-zppnode0", 0);
    expect_id(r, 4, 2, 2, "gpuhost-zppnode1-r0", 1);
    expect_id(r, 4, 2, 3, "gpuhost-zppnode1-r1", 1);
    expect_note(r, 4, 2,
                "ranks of node 1 share GPU " BUS_B ": each talks over sockets, as a separate "
                "host; the topology stays 2 nodes of 2");

    /* A node of 4 on 2 GPUs (local rank % 2): two pairs share, so all 4 of
     * the node are hosts of their own. Bus ids compare without case. */
    const char *four[4] = {BUS_A, BUS_B, "0000:1B:00.0", BUS_B};
    make(r, 4, "gpuhost", four);
    for (int rank = 0; rank < 4; rank++) {
        char want[64];
        snprintf(want, sizeof want, "gpuhost-zppnode0-r%d", rank);
        expect_id(r, 4, 4, rank, want, 1);
    }
    EXPECT(zpp_hostid_node_shares(r, 4, 0, &first) && first == 0, "first %d", first);
    expect_note(r, 4, 4,
                "ranks of node 0 share GPU " BUS_A ": each talks over sockets, as a separate "
                "host; the topology stays 1 node of 4");
}

/* The prefix is the rank's own (ZPP_NCCL_HOSTID_PREFIX, else the host
 * name): a user's prefix is used as given, and equal bus ids under
 * different prefixes (different real hosts) are different GPUs. */
static void test_user_prefix_respected(void) {
    const char *bus[4] = {BUS_A, BUS_A, BUS_A, BUS_A};
    zpp_hostid_rank r[4];
    make(r, 4, "job42.cluster-a", bus);
    expect_id(r, 4, 2, 3, "job42.cluster-a-zppnode1-r1", 1);
    /* a node spread over two real hosts, GPU 0 on each */
    snprintf(r[1].prefix, sizeof r[1].prefix, "job42.cluster-b");
    snprintf(r[3].prefix, sizeof r[3].prefix, "job42.cluster-b");
    expect_id(r, 4, 2, 0, "job42.cluster-a-zppnode0", 0);
    expect_id(r, 4, 2, 1, "job42.cluster-b-zppnode0", 0);
    expect_id(r, 4, 2, 3, "job42.cluster-b-zppnode1", 0);
    expect_note(r, 4, 2, "");
    /* the longest prefix the exchange carries still fits ZPP_HOSTID_CAP */
    memset(r[2].prefix, 'p', sizeof r[2].prefix - 1);
    r[2].prefix[sizeof r[2].prefix - 1] = '\0';
    snprintf(r[3].prefix, sizeof r[3].prefix, "%s", r[2].prefix);
    char out[ZPP_HOSTID_CAP];
    EXPECT_OK(zpp_hostid_emulated(r, 4, 2, 3, out, sizeof out, NULL));
    EXPECT(strlen(out) == sizeof r[2].prefix - 1 + strlen("-zppnode1-r1"), "'%s'", out);
}

/* A buffer too small is an error (out cleared), never a cut id; one that
 * holds exactly the id and its NUL is enough. */
static void test_buffer_too_small(void) {
    const char *bus[4] = {BUS_A, BUS_A, BUS_A, BUS_A};
    zpp_hostid_rank r[4];
    make(r, 4, "gpuhost", bus);
    const char *want = "gpuhost-zppnode1-r1";
    char out[64];
    const size_t exact = strlen(want) + 1;
    memset(out, 'x', sizeof out);
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 2, 3, out, exact - 1, NULL), ZPP_ERR_INVALID);
    EXPECT(out[0] == '\0', "out holds '%.8s' after the error", out);
    EXPECT(strstr(zpp_last_error(), "needs 20 bytes") != NULL, "message: %s", zpp_last_error());
    EXPECT_OK(zpp_hostid_emulated(r, 4, 2, 3, out, exact, NULL));
    EXPECT(strcmp(out, want) == 0, "'%s'", out);
    /* the note likewise */
    memset(out, 'x', sizeof out);
    EXPECT_STATUS(zpp_hostid_note(r, 4, 2, out, sizeof out), ZPP_ERR_INVALID);
    EXPECT(out[0] == '\0', "note buffer holds '%.8s' after the error", out);
}

static void test_invalid_arguments(void) {
    const char *bus[4] = {BUS_A, BUS_A, BUS_A, BUS_A};
    zpp_hostid_rank r[4];
    make(r, 4, "gpuhost", bus);
    char out[ZPP_HOSTID_CAP];
    int shared = 7;
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 3, 0, out, sizeof out, &shared), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "nodes of 3") != NULL, "message: %s", zpp_last_error());
    EXPECT(shared == 0, "shared %d after an error", shared);
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 0, 0, out, sizeof out, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_hostid_emulated(r, 0, 1, 0, out, sizeof out, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 2, 4, out, sizeof out, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "rank 4") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 2, -1, out, sizeof out, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_hostid_emulated(NULL, 4, 2, 0, out, sizeof out, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 2, 0, NULL, 16, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 2, 0, out, 0, NULL), ZPP_ERR_INVALID);
    EXPECT_STATUS(zpp_hostid_note(r, 4, 3, out, sizeof out), ZPP_ERR_INVALID);
    /* bytes from the wire without their NUL */
    memset(r[2].bus_id, 'f', sizeof r[2].bus_id);
    EXPECT_STATUS(zpp_hostid_emulated(r, 4, 2, 0, out, sizeof out, NULL), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "rank 2") != NULL, "message: %s", zpp_last_error());
    EXPECT_STATUS(zpp_hostid_note(r, 4, 2, out, sizeof out), ZPP_ERR_INVALID);
}

ZPP_TESTS(ZPP_TEST(test_distinct_gpus_keep_node_ids),
          ZPP_TEST(test_node_of_two_on_one_gpu_gets_rank_ids),
          ZPP_TEST(test_user_prefix_respected), ZPP_TEST(test_buffer_too_small),
          ZPP_TEST(test_invalid_arguments), )
