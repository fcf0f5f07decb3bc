/* testlib.h — a small test harness.
 *
 * Each test is a named function; a test program lists them once:
 *
 *     static void test_roundtrip(void) { ... EXPECT(x == y, "x=%d", x); }
 *     ZPP_TESTS(
 *         ZPP_TEST(test_roundtrip),
 *     )
 *
 * A case that needs an NVIDIA GPU is listed as ZPP_TEST_GPU(fn) instead:
 * tests/CMakeLists.txt (which reads the case names from this list for
 * CASES_FROM_SOURCE tests) labels it gpu, and where no GPU is visible the
 * harness skips it (zpp_test_skip) instead of running it.
 *
 * Skipping: a test that cannot run here calls zpp_test_skip("why; what to
 * do"), which prints one line "SKIP: ..." and exits with ctest's skip code
 * 77 (every test has SKIP_RETURN_CODE 77); scripts/check-skips.sh then
 * fails the CPU suite that skipped it. It ends the whole program, so a case
 * that may skip is its own ctest test (CASE / CASES_FROM_SOURCE).
 * A case that needs the library's test-only fault hooks (docs/fault-hooks.md)
 * is listed as ZPP_TEST_HOOKS(fn): CMake registers it only in a build with
 * -DZPP_FAULT_HOOKS=ON; in a library without them the harness leaves it out
 * of a run of every case, saying so, and fails it when asked for by name.
 *
 * `prog` runs every test, `prog NAME` runs one. Random inputs come from a
 * fresh seed each run (printed, so a failure can be replayed with
 * ZPP_TEST_SEED=...). Under MPI, tests run on every rank and a failure on any
 * rank fails the program with a non-zero exit (no hang: the failing rank
 * aborts the job). */
#ifndef ZPP_TESTLIB_H
#define ZPP_TESTLIB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zeropp.h"

typedef struct zpp_test_entry {
    const char *name;
    void (*fn)(void);
    int needs_gpu;
    int needs_hooks;
} zpp_test_entry;

#define ZPP_TEST(fn) {#fn, fn, 0, 0}
#define ZPP_TEST_GPU(fn) {#fn, fn, 1, 0}
#define ZPP_TEST_HOOKS(fn) {#fn, fn, 0, 1}
#define ZPP_TESTS(...)                                                        \
    const zpp_test_entry zpp_test_list[] = {__VA_ARGS__};                     \
    const size_t zpp_test_count = sizeof zpp_test_list / sizeof zpp_test_list[0];

extern const zpp_test_entry zpp_test_list[];
extern const size_t zpp_test_count;

/* Set by the test's main when it uses MPI; 0 otherwise. */
extern int zpp_test_rank;

/* Reports a failure and exits; `cond` (may be NULL) is printed verbatim. */
void zpp_test_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));

/* EXPECT(cond) or EXPECT(cond, "printf format", args...). */
#define EXPECT(cond, ...)                                                     \
    do {                                                                      \
        if (!(cond)) zpp_test_fail(__FILE__, __LINE__, #cond, " " __VA_ARGS__); \
    } while (0)

/* ctest's skip code: zpp_test() sets SKIP_RETURN_CODE to it. */
#define ZPP_TEST_SKIP_CODE 77

/* Prints "SKIP: <reason>" (rank 0; the reason says what is missing and what
 * to do), finalizes MPI in an MPI test and exits ZPP_TEST_SKIP_CODE. Under
 * MPI every rank must call it, having reached the same decision. */
void zpp_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Asserts a zpp call succeeds, printing zpp_last_error() otherwise. */
#define EXPECT_OK(call)                                                       \
    do {                                                                      \
        zpp_status s_ = (call);                                               \
        if (s_ != ZPP_OK)                                                     \
            zpp_test_fail(__FILE__, __LINE__, NULL, "%s -> %s: %s", #call,          \
                          zpp_status_str(s_), zpp_last_error());              \
    } while (0)

/* Asserts a zpp call fails with `want`. */
#define EXPECT_STATUS(call, want)                                             \
    do {                                                                      \
        zpp_status s_ = (call);                                               \
        if (s_ != (want))                                                     \
            zpp_test_fail(__FILE__, __LINE__, NULL, "%s -> %s, expected %s (%s)", \
                          #call, zpp_status_str(s_), zpp_status_str(want),    \
                          zpp_last_error());                                  \
    } while (0)

/* ---- Random inputs ---- */
/* The run's seed (fresh unless ZPP_TEST_SEED is set), mixed with `stream`. */
uint64_t zpp_test_seed(uint64_t stream);

typedef struct zpp_rng {
    uint64_t s;
} zpp_rng;
zpp_rng zpp_rng_make(uint64_t seed);
uint64_t zpp_rng_u64(zpp_rng *r);
double zpp_rng_uniform(zpp_rng *r);   /* [0, 1) */
double zpp_rng_normal(zpp_rng *r);    /* N(0, 1) */

/* Path of tests/data/<name> of the source tree (the test data kept in the
 * repository); fails the test when it cannot be read: it is never absent. */
const char *zpp_test_data(const char *name, char *buf, size_t cap);

/* n bytes of zeroed host memory (at least 1), or the case fails saying so. */
void *zpp_test_malloc(size_t n);

/* `name` inside the test program's own temporary folder, /tmp/zpp_test_XXXXXX,
 * made at the first call and removed at a successful exit (a failing test
 * _exits and keeps its files for the message that points at them). buf holds
 * 512 bytes. Each rank of an MPI test has a folder of its own. */
const char *zpp_test_tmp_path(const char *name, char *buf);

/* Runs `zeropp ARGS` (the CLI ctest names in ZPP_CLI; under ZPP_MPIEXEC with
 * np ranks when np > 0), stdout to out_path, stderr to err_path, with a
 * 240 s hang guard that fails the test; returns the exit code. */
int zpp_test_run_cli(int np, const char *out_path, const char *err_path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Writes n bytes to path, or fails the test. */
void zpp_test_write_file(const char *path, const void *data, size_t n);
/* The checksum of checkpoint files of format 4 (core/checksum.h), written
 * from its definition and nothing of src/: the n bytes zero-padded to whole
 * 32-byte blocks, 8-byte little-endian word i stepped into lane i mod 4 as
 * lane = rotl(lane ^ word, 29) * 0x9e3779b97f4a7c15, the lanes folded with
 * splitmix64's finaliser, then the byte count. */
uint64_t zpp_test_checksum_ref(const void *p, size_t n);
/* FNV-1a 64 of n bytes (checkpoint formats 2 and 3, manifests). */
uint64_t zpp_test_fnv1a(const void *p, size_t n);
/* The number after "key": on each line of a metrics file (zeropp train
 * --metrics), in line order, into out[0..cap); returns how many. */
int zpp_test_read_metric(const char *path, const char *key, double *out, int cap);
/* The lines of a file that contain `needle` (0 when it cannot be read). */
int zpp_test_count_lines(const char *path, const char *needle);

#endif
