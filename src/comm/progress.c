/* comm/progress.c — the per-host progress board (progress.h says why).
 *
 * Layout: a 64-byte header, then one 128-byte slot per rank of the host,
 * indexed by the rank's index in MPI's shared-memory split. A slot is
 * written only by its rank (relaxed atomic stores: a reader wants a recent
 * value, not an ordering) and read by the others. */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "comm/progress.h"
#include "core/error.h"

#define ZPP__PROG_MAGIC 0x7a707067u /* "zppg" */
#define ZPP__PROG_HEADER 64
#define ZPP__PROG_SLOT 128

typedef struct zpp__prog_slot {
    _Atomic int32_t world_rank, pid;
    _Atomic int32_t wait_comm, wait_op; /* -1: not waiting */
    _Atomic uint64_t wait_seq;
    _Atomic uint64_t entered[ZPP_PROG_COMMS];
} zpp__prog_slot;

_Static_assert(sizeof(zpp__prog_slot) <= ZPP__PROG_SLOT, "a progress slot outgrew its room");

struct zpp_progress {
    unsigned char *base; /* the mapping */
    size_t bytes;
    int n;               /* slots (ranks on this host) */
    int mine;            /* this rank's slot */
    int world_rank, world_size, node_size;
    uint64_t count[ZPP_PROG_COMMS]; /* this rank's own counts */
    zpp_progress *prev_current;
};

/* Operations by code, for the wait state another rank reads. */
static const char *const kProgOps[] = {"a collective", "allgather", "reduce_scatter", "alltoall",
                                       "allreduce",    "broadcast", "barrier",        "agree",
                                       "max",          "setup step"};

static int prog_op_code(const char *op) {
    if (!op) return 0;
    for (int i = (int)(sizeof kProgOps / sizeof kProgOps[0]) - 1; i > 0; i--)
        if (strstr(op, kProgOps[i])) return i;
    if (strstr(op, "topology") || strstr(op, "setup")) return 9;
    return 0;
}

static zpp_progress *prog_current;
static uint64_t prog_launch_seq; /* MPI_COMM_WORLD operations of this process */

zpp_progress *zpp__progress_current(void) { return prog_current; }

const char *zpp__progress_comm_name(int comm) {
    static const char *const names[ZPP_PROG_COMMS] = {
        "world", "intra", "inter", "world (reduce)", "intra (reduce)", "inter (reduce)",
        "world (MPI_COMM_WORLD)", "world (topology setup)"};
    return comm >= 0 && comm < ZPP_PROG_COMMS ? names[comm] : "unnamed";
}

static zpp__prog_slot *prog_slot_at(const zpp_progress *p, int i) {
    return (zpp__prog_slot *)(void *)(p->base + ZPP__PROG_HEADER + (size_t)i * ZPP__PROG_SLOT);
}

/* ---- Setup ------------------------------------------------------------------ */

static zpp_status prog_poll(MPI_Request *req, double timeout_s, const char *what) {
    return zpp__comm_mpi_poll(req, timeout_s, what, "world", 0);
}

zpp_status zpp__progress_create(const void *base_comm, double timeout_s, zpp_progress **p_p) {
    *p_p = NULL;
    MPI_Comm base = *(const MPI_Comm *)base_comm;
    int rank = 0, size = 1;
    MPI_Comm_rank(base, &rank);
    MPI_Comm_size(base, &size);
    /* MPI_Comm_split_type blocks: everyone must be there first. */
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(base, &req) != MPI_SUCCESS) return ZPP_OK;
    ZPP_CHECK(prog_poll(&req, timeout_s, "topology setup (every rank arriving to find its host)"));
    MPI_Comm host = MPI_COMM_NULL;
    if (MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) !=
        MPI_SUCCESS)
        return ZPP_OK;
    int hr = 0, hn = 1;
    MPI_Comm_rank(host, &hr);
    MPI_Comm_size(host, &hn);
    size_t bytes = ZPP__PROG_HEADER + (size_t)hn * ZPP__PROG_SLOT;
    static unsigned serial;
    char name[64] = "";
    unsigned char *map = NULL;
    if (hr == 0) { /* the host's first rank makes the segment */
        snprintf(name, sizeof name, "/zpp-progress-%ld-%u-%ld", (long)getpid(), serial++,
                 (long)time(NULL));
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0) {
            void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) map = m;
        }
        if (fd >= 0) close(fd);
        if (!map) {
            if (fd >= 0) shm_unlink(name);
            name[0] = '\0';
        }
    }
    zpp_status st = ZPP_OK;
    if (MPI_Ibcast(name, (int)sizeof name, MPI_CHAR, 0, host, &req) == MPI_SUCCESS)
        st = prog_poll(&req, timeout_s, "topology setup (sharing the progress board)");
    else
        name[0] = '\0';
    name[sizeof name - 1] = '\0';
    if (st == ZPP_OK && hr != 0 && name[0]) {
        int fd = shm_open(name, O_RDWR, 0);
        if (fd >= 0) {
            void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) map = m;
            close(fd);
        }
    }
    zpp_progress *p = NULL;
    if (st == ZPP_OK && map) {
        p = calloc(1, sizeof *p);
        if (p) {
            p->base = map;
            p->bytes = bytes;
            p->n = hn;
            p->mine = hr;
            p->world_rank = rank;
            p->world_size = size;
            p->node_size = 0;
            zpp__prog_slot *s = prog_slot_at(p, hr);
            atomic_store_explicit(&s->world_rank, rank, memory_order_relaxed);
            atomic_store_explicit(&s->pid, (int32_t)getpid(), memory_order_relaxed);
            atomic_store_explicit(&s->wait_comm, -1, memory_order_relaxed);
            for (int c = 0; c < ZPP_PROG_COMMS; c++)
                atomic_store_explicit(&s->entered[c], 0, memory_order_relaxed);
            atomic_store_explicit(&s->entered[ZPP_PROG_LAUNCH], prog_launch_seq,
                                  memory_order_relaxed);
            atomic_thread_fence(memory_order_seq_cst);
        }
    }
    /* Everyone has mapped it (or given up): the name can go. A rank whose
     * own mapping failed still takes part, so no one waits for it. */
    if (st == ZPP_OK) {
        if (MPI_Ibarrier(host, &req) == MPI_SUCCESS)
            st = prog_poll(&req, timeout_s, "topology setup (mapping the progress board)");
    }
    if (hr == 0 && name[0]) shm_unlink(name);
    MPI_Comm_free(&host);
    if (!p && map) munmap(map, bytes);
    if (st != ZPP_OK) {
        zpp__progress_destroy(p);
        return st;
    }
    if (p) {
        p->prev_current = prog_current;
        prog_current = p;
    }
    *p_p = p;
    return ZPP_OK;
}

void zpp__progress_set_geometry(zpp_progress *p, int node_size) {
    if (p && node_size > 0) p->node_size = node_size;
}

void zpp__progress_destroy(zpp_progress *p) {
    if (!p) return;
    /* out of the chain of current boards */
    for (zpp_progress **q = &prog_current; *q; q = &(*q)->prev_current)
        if (*q == p) {
            *q = p->prev_current;
            break;
        }
    munmap(p->base, p->bytes);
    free(p);
}

/* ---- Counting ---------------------------------------------------------------- */

zpp_prog_at zpp__progress_enter(zpp_progress *p, int comm) {
    zpp_prog_at at = {p, comm, 0};
    if (comm < 0 || comm >= ZPP_PROG_COMMS) {
        at.p = NULL;
        return at;
    }
    if (comm == ZPP_PROG_LAUNCH)
        at.seq = ++prog_launch_seq;
    else if (p)
        at.seq = ++p->count[comm];
    if (p)
        atomic_store_explicit(&prog_slot_at(p, p->mine)->entered[comm], at.seq,
                              memory_order_relaxed);
    return at;
}

void zpp__progress_wait_begin(const zpp_prog_at *at, const char *op) {
    if (!at || !at->p) return;
    zpp__prog_slot *s = prog_slot_at(at->p, at->p->mine);
    atomic_store_explicit(&s->wait_op, prog_op_code(op), memory_order_relaxed);
    atomic_store_explicit(&s->wait_seq, at->seq, memory_order_relaxed);
    atomic_store_explicit(&s->wait_comm, at->comm, memory_order_relaxed);
}

void zpp__progress_wait_end(const zpp_prog_at *at) {
    if (!at || !at->p) return;
    atomic_store_explicit(&prog_slot_at(at->p, at->p->mine)->wait_comm, -1, memory_order_relaxed);
}

/* ---- Explaining a timeout ---------------------------------------------------- */

/* The slot of world rank r on this host, or NULL. */
static zpp__prog_slot *prog_find(const zpp_progress *p, int r) {
    for (int i = 0; i < p->n; i++) {
        zpp__prog_slot *s = prog_slot_at(p, i);
        if (atomic_load_explicit(&s->world_rank, memory_order_relaxed) == r) return s;
    }
    return NULL;
}

/* Whether world rank r is a member of `comm` as seen from world rank self. */
static int prog_member(const zpp_progress *p, int comm, int self, int r) {
    const int ns = p->node_size;
    switch (comm) {
    case ZPP_PROG_INTRA:
    case ZPP_PROG_RED_INTRA: return ns > 0 ? r / ns == self / ns : 1;
    case ZPP_PROG_INTER:
    case ZPP_PROG_RED_INTER: return ns > 0 ? r % ns == self % ns : 1;
    default: return 1;
    }
}

typedef struct zpp__prog_text {
    char *out;
    size_t cap, len;
} zpp__prog_text;

static void prog_put(zpp__prog_text *t, const char *fmt, ...) ZPP_PRINTF(2, 3);
static void prog_put(zpp__prog_text *t, const char *fmt, ...) {
    if (t->len + 1 >= t->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->out + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n < t->cap - t->len ? (size_t)n : t->cap - t->len - 1;
}

/* The process state from /proc: 'T' stopped, 't' traced, 'Z'/'X' dead,
 * 0 gone, '?' unknown. */
static char prog_pid_state(int pid) {
    if (pid <= 0) return '?';
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return kill(pid, 0) != 0 && errno == ESRCH ? 0 : '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *q = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return q && q[1] == ' ' && q[2] ? q[2] : '?';
}

static void prog_missing(const zpp_progress *p, int comm, uint64_t seq, int self, int depth,
                         unsigned char *seen, zpp__prog_text *t);

/* Why world rank r (on this host, slot s) is not there. */
static void prog_why(const zpp_progress *p, int r, zpp__prog_slot *s, int depth,
                     unsigned char *seen, zpp__prog_text *t) {
    int pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
    char state = prog_pid_state(pid);
    if (state == 'T' || state == 't') {
        prog_put(t, "pid %d is stopped: SIGSTOP or a debugger", pid);
        return;
    }
    const int gone = state == 0 || state == 'Z' || state == 'X';
    int wc = atomic_load_explicit(&s->wait_comm, memory_order_relaxed);
    if (wc < 0 || wc >= ZPP_PROG_COMMS) {
        if (gone)
            prog_put(t, "pid %d has exited", pid);
        else
            prog_put(t,
                     "pid %d is in no collective: computing, or stuck outside the "
                     "communication layer",
                     pid);
        return;
    }
    /* A rank that timed out leaves its slot saying where it waited, so
     * the chain can be followed past a rank that has already stopped. */
    int op = atomic_load_explicit(&s->wait_op, memory_order_relaxed);
    uint64_t ws = atomic_load_explicit(&s->wait_seq, memory_order_relaxed);
    if (op < 0 || op >= (int)(sizeof kProgOps / sizeof kProgOps[0])) op = 0;
    if (gone) prog_put(t, "pid %d has exited; ", pid);
    prog_put(t, "it %s in %s #%llu on the %s communicator", gone ? "waited" : "waits", kProgOps[op],
             (unsigned long long)ws, zpp__progress_comm_name(wc));
    if (depth < 3) {
        size_t before = t->len;
        prog_put(t, ", where ");
        size_t mark = t->len;
        prog_missing(p, wc, ws, r, depth + 1, seen, t);
        if (t->len == mark) { /* nothing to add */
            t->len = before;
            t->out[before] = '\0';
        }
    }
}

/* Lists the members of `comm` (as seen from world rank self) that have
 * entered fewer than `seq` of its collectives. */
static void prog_missing(const zpp_progress *p, int comm, uint64_t seq, int self, int depth,
                         unsigned char *seen, zpp__prog_text *t) {
    int shown = 0, hidden = 0, first_hidden = -1;
    for (int r = 0; r < p->world_size; r++) {
        if (r == self || !prog_member(p, comm, self, r)) continue;
        zpp__prog_slot *s = prog_find(p, r);
        if (!s) {
            if (hidden++ == 0) first_hidden = r;
            continue;
        }
        if (atomic_load_explicit(&s->entered[comm], memory_order_relaxed) >= seq) {
            /* It arrived; but a non-blocking collective also needs its
             * progress, which a stopped process cannot make. (One that
             * has exited since is most often a peer that timed out and
             * stopped the job: not named.) */
            int pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
            char state = prog_pid_state(pid);
            if ((state == 'T' || state == 't') && shown < 4) {
                prog_put(t,
                         "%srank %d entered it but pid %d is stopped: SIGSTOP or a "
                         "debugger",
                         shown ? "; " : "", r, pid);
                shown++;
                seen[r] = 1;
            }
            continue;
        }
        if (shown == 4) {
            prog_put(t, ", ...");
            shown++;
            continue;
        }
        if (shown > 4) continue;
        prog_put(t, "%srank %d did not arrive", shown ? "; " : "", r);
        shown++;
        if (seen[r]) continue; /* already explained */
        seen[r] = 1;
        prog_put(t, " (");
        prog_why(p, r, s, depth, seen, t);
        prog_put(t, ")");
    }
    if (hidden)
        prog_put(t, "%s%d rank%s on other hosts (rank %d%s) cannot be seen from here",
                 shown ? "; " : "", hidden, hidden == 1 ? "" : "s", first_hidden,
                 hidden > 1 ? ", ..." : "");
}

void zpp__progress_explain(const zpp_prog_at *at, char *out, size_t cap) {
    if (!cap) return;
    out[0] = '\0';
    if (!at || !at->p || !at->seq) return;
    const zpp_progress *p = at->p;
    unsigned char *seen = calloc((size_t)p->world_size, 1);
    if (!seen) return;
    seen[p->world_rank] = 1;
    zpp__prog_text t = {out, cap, 0};
    prog_put(&t, "; ");
    size_t mark = t.len;
    prog_missing(p, at->comm, at->seq, p->world_rank, 0, seen, &t);
    if (t.len == mark) {
        int exited = 0;
        for (int i = 0; i < p->n; i++) {
            const zpp__prog_slot *s = prog_slot_at(p, i);
            int r = atomic_load_explicit(&s->world_rank, memory_order_relaxed);
            char state = prog_pid_state(atomic_load_explicit(&s->pid, memory_order_relaxed));
            exited += r != p->world_rank && prog_member(p, at->comm, p->world_rank, r) &&
                      (state == 0 || state == 'Z' || state == 'X');
        }
        if (exited)
            prog_put(&t,
                     "every rank of this host entered it (#%llu), and %d of them %s "
                     "exited since (the job is stopping, or they died in it)",
                     (unsigned long long)at->seq, exited, exited == 1 ? "has" : "have");
        else
            prog_put(&t,
                     "every rank of this host entered it (#%llu): the stall is inside "
                     "the transport, or a peer died in it",
                     (unsigned long long)at->seq);
    }
    free(seen);
}
