/* comm/topo.c — world / node / local topology over MPI_COMM_WORLD.
 *
 * The world of W ranks is cut into W / S nodes of S consecutive ranks:
 * rank r is local index r % S of node r / S. hpZ gathers inside a node
 * (`intra`: the S ranks of this node), qgZ's second hop runs across nodes
 * (`inter`: the W / S ranks with this local index, one per node).
 *
 * No rank may hang on a bad input, so every decision is taken identically
 * everywhere: inputs that could differ between ranks (the options, what the
 * launcher's shared-memory split says) are first agreed with an all-reduce,
 * then checked; and each step that can fail on one rank alone is followed
 * by an agreement on the status before the next collective step (the one
 * fail-together protocol, zpp__comm_mpi_agree: every rank gets the lowest
 * failing rank's status and message).
 *
 * Which backends exist is decided by the files CMake compiles: without NCCL,
 * comm_nccl_none.c answers ZPP_BACKEND_NCCL with ZPP_ERR_UNSUPPORTED. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "comm/comm_internal.h"
#include "core/error.h"

static zpp_status topo_mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return zpp_error(ZPP_ERR_COMM, "topology: mpi %s failed: %s", what, msg);
}

/* All ranks of `comm` leave with the same status and message (or, past
 * the topology's deadline, ZPP_ERR_TIMEOUT naming the ranks that did not
 * arrive, as far as the progress board `p` shows them). */
static zpp_status topo_agree(MPI_Comm comm, zpp_status local, double timeout_s, zpp_progress *p) {
    return zpp__comm_mpi_agree_at(&comm, local, timeout_s, "world (topology setup)", p,
                                  ZPP_PROG_SETUP);
}

/* A blocking collective's non-blocking form, polled until the deadline:
 * `rc` is the MPI_I* call's return code. */
static zpp_status topo_poll(int rc, MPI_Request *req, double timeout_s, const char *what,
                            zpp_progress *p) {
    if (rc != MPI_SUCCESS) return topo_mpi_fail(rc, what);
    zpp_prog_at at = zpp__progress_enter(p, ZPP_PROG_SETUP);
    char op[128];
    snprintf(op, sizeof op, "topology setup (%s)", what);
    return zpp__comm_mpi_poll_at(req, timeout_s, op, "world", 0, &at);
}

/* "node size 3 does not divide the world size 8; choose ..., e.g. 1, 2, 4
 * or 8". Up to 8 divisors are named: the smallest 7 and the world. */
static zpp_status topo_not_dividing(int node_size, int world) {
    int d[8], n = 0;
    for (int k = 1; k <= world && n < 7; k++)
        if (world % k == 0 && k != world) d[n++] = k;
    d[n++] = world;
    char list[160];
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof list; i++) {
        const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%d", sep, d[i]);
    }
    return zpp_error(ZPP_ERR_INVALID,
                     "topology: node size %d does not divide the world size %d; choose a node "
                     "size that divides it, e.g. %s",
                     node_size, world, list);
}

/* The node size the launcher gave: the size of this rank's shared-memory
 * group. MPI's own split, not a launcher's variables (OMPI_COMM_WORLD_LOCAL_*,
 * SLURM_LOCALID, ...), so ranks started by mpirun, srun or any other
 * launcher find their node the same way. Agreed over all ranks: every group must have the same size S and
 * hold the consecutive ranks S*k .. S*k + S-1 (checked through the group's
 * lowest rank and this rank's index in it: the group sorted by world rank
 * is then first, first+1, ..., and first is a multiple of S). */
static zpp_status topo_launcher_node_size(MPI_Comm base, int rank, int *node_size_p,
                                          double timeout_s, zpp_progress *p) {
    ZPP_CHECK(zpp__comm_mpi_gate(&base, timeout_s, "the shared-memory split", p));
    MPI_Comm shm = MPI_COMM_NULL;
    int rc = MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm);
    if (rc != MPI_SUCCESS) return topo_mpi_fail(rc, "shared-memory split");
    int s = 0, l = 0;
    static int first; /* static: a timed-out request may still write it */
    first = 0;
    rc = MPI_Comm_size(shm, &s);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(shm, &l);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&shm);
        return topo_mpi_fail(rc, "shared-memory group query");
    }
    MPI_Request req = MPI_REQUEST_NULL;
    zpp_status st = topo_poll(MPI_Iallreduce(&rank, &first, 1, MPI_INT, MPI_MIN, shm, &req), &req,
                              timeout_s, "the shared-memory group query", p);
    if (st == ZPP_ERR_TIMEOUT) return st; /* the request stays with MPI, and shm with it */
    MPI_Comm_free(&shm);
    ZPP_CHECK(st);
    int scattered = !(first % s == 0 && rank - first == l);
    /* max gives max S, -min S, any scattered; static: a timed-out request
     * may still write it */
    static int v[3];
    v[0] = s;
    v[1] = -s;
    v[2] = scattered;
    ZPP_CHECK(topo_poll(MPI_Iallreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MAX, base, &req), &req,
                        timeout_s, "the node size agreement", p));
    if (v[0] != -v[1])
        return zpp_error(ZPP_ERR_INVALID,
                         "topology: the launcher placed unequal numbers of ranks on the nodes "
                         "(from %d to %d per node); start the same number of ranks on every "
                         "node (mpirun --npernode N, srun --ntasks-per-node=N), or set the node "
                         "size explicitly",
                         -v[1], v[0]);
    if (v[2])
        return zpp_error(ZPP_ERR_INVALID,
                         "topology: the launcher did not place consecutive ranks on each node "
                         "(%d per node); fill one node before the next (Open MPI's default "
                         "mapping by slot, srun --distribution=block) or set the node size "
                         "explicitly",
                         v[0]);
    *node_size_p = v[0];
    return ZPP_OK;
}

/* Creates one zpp_comm over the ranks of `base` with the same color,
 * ordered by key. */
static zpp_status topo_split(MPI_Comm base, int color, int key, zpp_comm **comm_p, double timeout_s,
                             zpp_progress *p, const char *what) {
    ZPP_CHECK(zpp__comm_mpi_gate(&base, timeout_s, what, p));
    MPI_Comm part = MPI_COMM_NULL;
    int rc = MPI_Comm_split(base, color, key, &part);
    if (rc != MPI_SUCCESS) return topo_mpi_fail(rc, "split");
    zpp_status st = zpp_comm_mpi_create(&part, comm_p); /* keeps its own dup */
    MPI_Comm_free(&part);
    return st;
}

/* The three MPI communicators, each named and given the deadline. */
static zpp_status topo_create_mpi(MPI_Comm base, zpp_topo *t, double timeout_s) {
    zpp_progress *p = t->progress;
    ZPP_CHECK(zpp__comm_mpi_gate(&base, timeout_s, "the world communicator", p));
    zpp_status st = zpp_comm_mpi_create(&base, &t->world);
    if (st == ZPP_OK) zpp__comm_mpi_configure(t->world, "world", timeout_s);
    if (st == ZPP_OK) zpp__comm_mpi_set_progress(t->world, p, ZPP_PROG_WORLD);
    ZPP_CHECK(topo_agree(base, st, timeout_s, p));
    st = topo_split(base, t->node, t->local_rank, &t->intra, timeout_s, p,
                    "the intra (node) communicator");
    if (st == ZPP_ERR_TIMEOUT) return st;
    if (st == ZPP_OK) zpp__comm_mpi_configure(t->intra, "intra", timeout_s);
    if (st == ZPP_OK) zpp__comm_mpi_set_progress(t->intra, p, ZPP_PROG_INTRA);
    ZPP_CHECK(topo_agree(base, st, timeout_s, p));
    st = topo_split(base, t->local_rank, t->node, &t->inter, timeout_s, p,
                    "the inter (across nodes) communicator");
    if (st == ZPP_ERR_TIMEOUT) return st;
    if (st == ZPP_OK) zpp__comm_mpi_configure(t->inter, "inter", timeout_s);
    if (st == ZPP_OK) zpp__comm_mpi_set_progress(t->inter, p, ZPP_PROG_INTER);
    ZPP_CHECK(topo_agree(base, st, timeout_s, p));
    /* The reductions share them: every MPI wait blocks the host, so a
     * second set would overlap nothing (comm.h). */
    t->red_world = t->world;
    t->red_intra = t->intra;
    t->red_inter = t->inter;
    return ZPP_OK;
}

/* (The reductions' comms are destroyed first, and only where they are
 * comms of their own.) */
static void topo_free(zpp_topo *t) {
    zpp_error_hold(); /* teardown after a failure keeps its message */
    zpp_comm *comms[6] = {t->red_inter, t->red_intra, t->red_world, t->inter, t->intra, t->world};
    zpp_comm *shared[3] = {t->inter, t->intra, t->world};
    for (int i = 0; i < 6; i++)
        if (comms[i] && (i >= 3 || comms[i] != shared[i])) comms[i]->ops->destroy(comms[i]);
    zpp__progress_destroy(t->progress);
    free(t);
    zpp_error_release();
}

/* Checks the agreed options; identical on every rank. */
static zpp_status topo_check_opts(int bad_ptrs, int ns_max, int ns_min, int be_max, int be_min) {
    if (bad_ptrs)
        return zpp_error(ZPP_ERR_INVALID, "topology: opts or topo_p is NULL on some rank");
    if (ns_max != ns_min)
        return zpp_error(ZPP_ERR_INVALID,
                         "topology: node_size differs across ranks (from %d to %d); pass the "
                         "same topology options on every rank",
                         ns_min, ns_max);
    if (be_max != be_min)
        return zpp_error(ZPP_ERR_INVALID,
                         "topology: backend differs across ranks (%d and %d); pass the same "
                         "topology options on every rank",
                         be_min, be_max);
    if (be_max != ZPP_BACKEND_MPI && be_max != ZPP_BACKEND_NCCL)
        return zpp_error(ZPP_ERR_INVALID,
                         "topology: unknown backend %d; use ZPP_BACKEND_MPI or ZPP_BACKEND_NCCL",
                         be_max);
    if (ns_max < 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "topology: node size %d is negative; use 0 (as the launcher placed "
                         "the ranks) or a positive divisor of the world size",
                         ns_max);
    return ZPP_OK;
}

zpp_status zpp_topo_create_with_opts(const zpp_topo_opts *opts, zpp_topo **topo_p) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zpp_error(ZPP_ERR_STATE,
                         "topology: MPI is not initialised; call MPI_Init before zpp_topo_create");
    /* The setup's deadline is the operations' (comm.h): every blocking MPI
     * step below is gated or polled. Until the options are agreed it is
     * this rank's own. */
    double timeout_s = opts && opts->timeout_s > 0.0 ? opts->timeout_s : 0.0;
    /* A private duplicate of the world that returns errors instead of
     * aborting; every collective step below runs on it. (Static: after a
     * timeout MPI still holds the abandoned request that writes it.) */
    static MPI_Comm base;
    base = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    zpp_status st = topo_poll(MPI_Comm_idup(MPI_COMM_WORLD, &base, &req), &req, timeout_s,
                              "duplicating the world", NULL);
    if (st != ZPP_OK) return st;
    zpp_topo *t = NULL;
    zpp_progress *board = NULL;
    int world = 0, rank = 0;
    int rc = MPI_Comm_set_errhandler(base, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(base, &world);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(base, &rank);
    if (rc != MPI_SUCCESS) {
        st = topo_mpi_fail(rc, "world query");
        goto out;
    }
    /* The progress board first: every later step's timeout can then name
     * the ranks that did not arrive. */
    ZPP_CHECK_GOTO(zpp__progress_create(&base, timeout_s, &board), st, out);

    /* 1. Agree on the options (MAX of x and of -x gives max and -min). */
    int ns = opts ? opts->node_size : 0, be = opts ? (int)opts->backend : 0;
    static int v[5]; /* static: see base */
    v[0] = !opts || !topo_p;
    v[1] = ns;
    v[2] = -ns;
    v[3] = be;
    v[4] = -be;
    ZPP_CHECK_GOTO(topo_poll(MPI_Iallreduce(MPI_IN_PLACE, v, 5, MPI_INT, MPI_MAX, base, &req), &req,
                             timeout_s, "the option agreement", board),
                   st, out);
    ZPP_CHECK_GOTO(topo_check_opts(v[0], v[1], -v[2], v[3], -v[4]), st, out);

    /* 2. The node size: forced, or the launcher's placement. */
    int node_size = ns;
    if (node_size == 0)
        ZPP_CHECK_GOTO(topo_launcher_node_size(base, rank, &node_size, timeout_s, board), st, out);
    if (world % node_size != 0) {
        st = topo_not_dividing(node_size, world);
        goto out;
    }
    zpp__progress_set_geometry(board, node_size);

    /* 3. The communicators. */
    t = calloc(1, sizeof *t);
    st = t ? ZPP_OK : zpp_error(ZPP_ERR_NOMEM, "topology: out of memory");
    st = topo_agree(base, st, timeout_s, board);
    if (st != ZPP_OK) goto out;
    t->progress = board; /* the topology's now */
    board = NULL;
    t->world_size = world;
    t->world_rank = rank;
    t->node_size = node_size;
    t->nodes = world / node_size;
    t->node = rank / node_size;
    t->local_rank = rank % node_size;
    if (be == ZPP_BACKEND_MPI) {
        st = topo_create_mpi(base, t, timeout_s);
    } else {
        st = zpp_comm_nccl_create_topo(t, opts);
        st = topo_agree(base, st, timeout_s, t->progress);
    }
    if (st != ZPP_OK) goto out;
    *topo_p = t;
    t = NULL;

out:
    if (t) topo_free(t);
    zpp__progress_destroy(board);
    /* After a timeout a request may still use it: left to MPI_Finalize. */
    if (st != ZPP_ERR_TIMEOUT) MPI_Comm_free(&base);
    return st;
}

void zpp_topo_destroy(zpp_topo *topo) {
    if (topo) topo_free(topo);
}

zpp_status zpp_comm_launch_local(int *local_rank_p, int *local_size_p) {
    if (!local_rank_p || !local_size_p)
        return zpp_error(ZPP_ERR_INVALID,
                         "launch local: local_rank_p and local_size_p are required");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized)
        return zpp_error(ZPP_ERR_STATE,
                         "launch local: MPI is not initialised; call MPI_Init first");
    static MPI_Comm world; /* static: a timed-out idup may still write it */
    MPI_Comm host = MPI_COMM_NULL;
    world = MPI_COMM_NULL;
    int local = 0, size = 0;
    /* On a private duplicate whose errors return, as zpp_topo_create_with_opts does,
     * before the world forms' deadline (zpp_comm_world_set_timeout): the
     * split that follows blocks, so every rank must be there first. */
    const double timeout_s = zpp_comm_world_timeout();
    MPI_Request req = MPI_REQUEST_NULL;
    ZPP_CHECK(topo_poll(MPI_Comm_idup(MPI_COMM_WORLD, &world, &req), &req, timeout_s,
                        "finding this rank's place on its host", zpp__progress_current()));
    zpp_status st = zpp__comm_mpi_gate(&world, timeout_s, "the launcher's host split",
                                       zpp__progress_current());
    if (st != ZPP_OK) return st;
    int rc = MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(host, &local);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(host, &size);
    if (host != MPI_COMM_NULL) MPI_Comm_free(&host);
    MPI_Comm_free(&world);
    if (rc != MPI_SUCCESS) return topo_mpi_fail(rc, "shared-memory split");
    *local_rank_p = local;
    *local_size_p = size;
    return ZPP_OK;
}
