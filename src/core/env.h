/* core/env.h — every environment variable zeropp reads, in one table.
 *
 * The library is configured through its options (zeropp.h, the config
 * file); the environment is for what must reach a process before any
 * option can: a test's choice of CPU path, an emulated node's NCCL host
 * id, a watchdog's deadline for a job already written. Each variable is
 * read here and nowhere else (test_env_table checks the tree), and
 * documented once, below; `zeropp help env` prints this table with the
 * values set. One exception: ZPP_FAULT, the tests' fault injection, is read
 * by core/fault_hooks.c, which only test builds compile, so a release
 * library holds no trace of it (docs/fault-hooks.md).
 *
 * Values are read when asked for, not cached: a test may set one between
 * two calls. An empty value counts as unset. */
#ifndef ZPP_CORE_ENV_H
#define ZPP_CORE_ENV_H

/* X(id, name, what it does) */
#define ZPP_ENV_VARS(X)                                                                       \
    X(ZPP_ENV_ATTENTION, "ZPP_ATTENTION",                                                     \
      "the CUDA model's attention: cudnn, fused, gemm or auto (default: cuDNN's where "      \
      "this build, GPU, dtype and head size allow, else fused, else gemm; docs/gpus.md)")    \
    X(ZPP_ENV_CPU_ISA, "ZPP_CPU_ISA",                                                         \
      "caps the CPU kernels' instruction set: generic, avx2, avx512 or auto (default; "       \
      "every choice gives the same bits; core/cpu.h)")                                        \
    X(ZPP_ENV_PARAM_SUMSQ, "ZPP_PARAM_SUMSQ",                                                 \
      "1 adds param_sumsq, the squared norm of the weights, to every step's metrics (an "     \
      "extra all-reduce a step)")                                                             \
    X(ZPP_ENV_PROGRESS, "ZPP_PROGRESS",                                                       \
      "1 draws `zeropp train`'s progress bar, 0 never does (default: when the output is a "   \
      "terminal, also under mpirun)")                                                         \
    X(ZPP_ENV_NCCL_HOSTID_PREFIX, "ZPP_NCCL_HOSTID_PREFIX",                                   \
      "prefix of emulated nodes' NCCL_HOSTID values, <prefix>-zppnode<n> (default: the "      \
      "host's name; docs/emulated-nodes.md)")                                                 \
    X(ZPP_ENV_NCCL_TIMEOUT_S, "ZPP_NCCL_TIMEOUT_S",                                           \
      "seconds before an NCCL collective counts as stalled, overriding "                      \
      "zeropp.collective_timeout_s (0: wait forever)")                                        \
    X(ZPP_ENV_NCCL_REQ_POOL, "ZPP_NCCL_REQ_POOL",                                             \
      "NCCL requests made up front, 0 to 4096 (default 16)")                                  \
    X(ZPP_ENV_NCCL_REDUCE_STREAM, "ZPP_NCCL_REDUCE_STREAM",                                   \
      "0 runs the gradient reductions on the gathers' stream (default 1: a stream of their "  \
      "own, which overlaps them with the gathers)")                                           \
    X(ZPP_ENV_NCCL_HOSTID, "NCCL_HOSTID",                                                     \
      "NCCL's host identity: zeropp sets it only for emulated nodes (emulate_nodes, "         \
      "--emulate-nodes), one value per node; otherwise a value you set is kept")              \
    X(ZPP_ENV_NCCL_NVLS_ENABLE, "NCCL_NVLS_ENABLE",                                           \
      "NCCL's NVLink multicast: zeropp sets it to 0 when unset (multicast can take GPUs "     \
      "that others share out of service); a value you set is kept")                           \
    X(ZPP_ENV_OMPI_COMM_WORLD_SIZE, "OMPI_COMM_WORLD_SIZE",                                   \
      "set by Open MPI's mpirun: the process was launched as one of several ranks")           \
    X(ZPP_ENV_PMI_SIZE, "PMI_SIZE",                                                           \
      "set by PMI launchers (MPICH's, Slurm's srun): as OMPI_COMM_WORLD_SIZE")                \
    X(ZPP_ENV_PATH, "PATH", "where `zeropp plot` looks for gnuplot")                          \
    X(ZPP_ENV_TMPDIR, "TMPDIR", "where `zeropp plot` writes its gnuplot script (default /tmp)")

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zpp_env_var {
#define ZPP_ENV_ID(id, name, doc) id,
    ZPP_ENV_VARS(ZPP_ENV_ID)
#undef ZPP_ENV_ID
    ZPP_ENV_COUNT
} zpp_env_var;

/* The variable's value, NULL when it is unset or empty. */
const char *zpp_env_get(zpp_env_var v);
/* Its name and what it does (the table's). */
const char *zpp_env_name(zpp_env_var v);
const char *zpp_env_doc(zpp_env_var v);
/* Sets v to `value` (for NCCL_HOSTID, which emulated nodes must set);
 * 0 on success, -1 when setenv fails. */
int zpp_env_set(zpp_env_var v, const char *value);
/* Sets v to `value` unless it is set already (the user's value is kept);
 * 0 on success, -1 when setenv fails. */
int zpp_env_default(zpp_env_var v, const char *value);

#ifdef __cplusplus
}
#endif

#endif
