/* core/fault.h — test hooks: faults the tests inject, a limit they lower.
 *
 * TEST-ONLY. A library configured with -DZPP_FAULT_HOOKS=ON (what
 * scripts/test.sh builds) compiles fault_hooks.c; any other build (the
 * default, scripts/build.sh, the install) compiles fault_nohooks.c, the same
 * functions with nothing to inject: no hook reads the environment, fires,
 * fails or ends a process, and the library holds no "ZPP_FAULT" string
 * (test release_has_no_fault_hooks checks it). So the callers need no #if:
 * they ask this module, and in a release build the answer is always "no".
 * Every hook, its format and the test that uses it: docs/fault-hooks.md.
 *
 * ZPP_FAULT=KIND@FIRST or KIND@FIRST-LAST (steps count from 1), read by
 * whoever injects that kind (each ignores the others' kinds):
 *   nonfinite@S[-E]  the engine writes a NaN into rank 0's gradient before
 *                    the norm at steps S..E;
 *   save_fail@S      the save after S steps fails on the last rank (an
 *                    injected I/O error);
 *   save_kill@S      rank 1 (rank 0 alone) writes half its file of that save
 *                    and the process ends with status 137, as after kill -9;
 *   save_slow@S      the last rank waits ZPP_FAULT_SLOW_SAVE_S seconds before
 *                    it writes its file of the save after S steps (a slow
 *                    disk: the save must outlast the collective deadline).
 * Unset or empty: no fault, and each check costs a call a step. */
#ifndef ZPP_CORE_FAULT_H
#define ZPP_CORE_FAULT_H

#include <stddef.h>
#include <stdio.h>

#include "zeropp.h"

typedef enum zpp_fault_kind {
    ZPP_FAULT_NONE = 0,
    ZPP_FAULT_NONFINITE,
    ZPP_FAULT_SAVE_FAIL,
    ZPP_FAULT_SAVE_KILL,
    ZPP_FAULT_SAVE_SLOW
} zpp_fault_kind;

/* save_slow's delay: an 8 s fsync, longer than a 5 s collective deadline. */
#define ZPP_FAULT_SLOW_SAVE_S 8

typedef struct zpp_fault {
    zpp_fault_kind kind;
    int first, last; /* steps, 1 <= first <= last */
} zpp_fault;

/* 1 when this library was built with the hooks, 0 otherwise (the tests ask
 * before running a case that needs them). */
int zpp_fault_hooks_built(void);

/* Reads ZPP_FAULT into *f_p (kind NONE when unset; always NONE without the
 * hooks). A malformed value is ZPP_ERR_CONFIG with a message listing the
 * forms. */
zpp_status zpp_fault_from_env(zpp_fault *f_p);

/* Whether fault `f` of `kind` fires on `rank` (of `world`) at `step`: the
 * one place that says which rank is hit (nonfinite: rank 0; save_fail: the
 * last rank; save_kill: rank 1, or 0 alone; save_slow: the last rank). f may
 * be NULL (never). */
int zpp_fault_fires(const zpp_fault *f, zpp_fault_kind kind, int step, int rank, int world);

/* save_fail: the error the save of `path` after `step` steps returns. */
zpp_status zpp_fault_save_error(const char *path, int step);

/* save_slow: sleeps ZPP_FAULT_SLOW_SAVE_S seconds (nothing without the
 * hooks). */
void zpp_fault_slow_save(void);

/* save_kill: writes the first n bytes of p to f, flushes them and ends the
 * process with status 137, leaving a half-written file as a killed rank
 * would. The only exit in the library, and only in a hooks build; without
 * the hooks it writes nothing and returns ZPP_ERR_UNSUPPORTED. */
zpp_status zpp_fault_kill_mid_write(FILE *f, const void *p, size_t n);

/* The largest count the MPI backend hands MPI in one argument before its
 * blob datatype takes over: INT_MAX, unless a test lowered it with
 * zpp_fault_set_mpi_max_count to run the large-count path on small buffers
 * (<= 0 restores INT_MAX; not thread-safe: set it between operations).
 * Without the hooks the setter changes nothing and returns
 * ZPP_ERR_UNSUPPORTED. */
int zpp_fault_mpi_max_count(void);
zpp_status zpp_fault_set_mpi_max_count(int max_count);

#endif
