#define _XOPEN_SOURCE 700 /* nftw */
/* testlib.c — the harness's main: runs the registered tests. */
#include "testlib.h"

#include "core/fault.h"
#include "core/random.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int zpp_test_rank = 0;
static uint64_t zpp__seed;
static const char *zpp__current = "";



uint64_t zpp_test_seed(uint64_t stream) {
    uint64_t x = zpp__seed ^ (stream * 0xd1342543de82ef95ull);
    return zpp_splitmix64(&x);
}

zpp_rng zpp_rng_make(uint64_t seed) {
    zpp_rng r = {seed};
    return r;
}
uint64_t zpp_rng_u64(zpp_rng *r) { return zpp_splitmix64(&r->s); }
double zpp_rng_uniform(zpp_rng *r) { return (double)(zpp_rng_u64(r) >> 11) * 0x1.0p-53; }
double zpp_rng_normal(zpp_rng *r) {
    double u1 = zpp_rng_uniform(r), u2 = zpp_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#ifndef ZPP_TEST_DATA_DIR
#error "tests/CMakeLists.txt defines ZPP_TEST_DATA_DIR (the source tree's tests/data)"
#endif

const char *zpp_test_data(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s", ZPP_TEST_DATA_DIR, name);
    if (access(buf, R_OK) != 0)
        zpp_test_fail(__FILE__, __LINE__, NULL,
                      "cannot read %s (%s): the test data is part of the repository; restore "
                      "it with `git checkout -- tests/data`",
                      buf, strerror(errno));
    return buf;
}

void *zpp_test_malloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) zpp_test_fail(__FILE__, __LINE__, NULL, "out of host memory (%zu bytes)", n);
    return p;
}

static char zpp__tmpdir[256];

static int zpp__remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void zpp__remove_tmpdir(void) {
    if (zpp__tmpdir[0]) nftw(zpp__tmpdir, zpp__remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *zpp_test_tmp_path(const char *name, char *buf) {
    if (!zpp__tmpdir[0]) {
        snprintf(zpp__tmpdir, sizeof zpp__tmpdir, "/tmp/zpp_test_XXXXXX");
        if (!mkdtemp(zpp__tmpdir))
            zpp_test_fail(__FILE__, __LINE__, NULL, "mkdtemp: %s", strerror(errno));
        atexit(zpp__remove_tmpdir);
    }
    snprintf(buf, 512, "%s/%s", zpp__tmpdir, name);
    return buf;
}

void zpp_test_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) zpp_test_fail(__FILE__, __LINE__, NULL, "cannot write %s: %s", path, strerror(errno));
    if (fwrite(data, 1, n, f) != n || fclose(f) != 0)
        zpp_test_fail(__FILE__, __LINE__, NULL, "short write to %s", path);
}

int zpp_test_read_metric(const char *path, const char *key, double *out, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) zpp_test_fail(__FILE__, __LINE__, NULL, "no metrics file %s", path);
    char line[4096], pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, pat);
        if (p) out[n++] = strtod(p + strlen(pat), NULL);
    }
    fclose(f);
    return n;
}

int zpp_test_count_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, needle)) n++;
    fclose(f);
    return n;
}

void zpp_test_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    fflush(stdout); /* the case's progress lines, before _exit drops them */
    fprintf(stderr, "[rank %d] FAIL %s (%s:%d, seed %llu): ", zpp_test_rank, zpp__current,
            file, line, (unsigned long long)zpp__seed);
    if (cond) fprintf(stderr, "EXPECT(%s) ", cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    /* Under mpirun a non-zero exit of one rank makes mpirun end the job. */
    _exit(1);
}

/* Hooks an MPI test file may define (tests/mpi_main.c). */
__attribute__((weak)) void zpp_test_init(int *argc, char ***argv) { (void)argc; (void)argv; }
__attribute__((weak)) void zpp_test_finalize(void) {}
__attribute__((weak)) uint64_t zpp_test_agree_seed(uint64_t seed) { return seed; }

void zpp_test_skip(const char *fmt, ...) {
    fflush(stdout);
    if (zpp_test_rank == 0) {
        va_list ap;
        printf("SKIP: ");
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        fflush(stdout);
    }
    /* Every rank is here: MPI ends cleanly, so mpirun passes on the 77
     * instead of reporting ranks that exited without MPI_Finalize. */
    zpp_test_finalize();
    exit(ZPP_TEST_SKIP_CODE);
}

int main(int argc, char **argv) {
    zpp_test_init(&argc, &argv);
    const char *env = getenv("ZPP_TEST_SEED");
    if (env) {
        zpp__seed = strtoull(env, NULL, 10);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        zpp__seed = (uint64_t)ts.tv_sec * 1000003ull ^ (uint64_t)ts.tv_nsec ^
                    ((uint64_t)getpid() << 32);
    }
    zpp__seed = zpp_test_agree_seed(zpp__seed); /* same seed on every rank */
    const char *only = argc > 1 ? argv[1] : NULL;
    /* A GPU case where no GPU is visible is skipped, not failed; asked once,
     * and only when a GPU case is reached (CPU cases never start CUDA). */
    int gpus = -1, ran = 0, skipped = 0, left_out = 0;
    for (size_t i = 0; i < zpp_test_count; i++) {
        if (only && strcmp(only, zpp_test_list[i].name) != 0) continue;
        zpp__current = zpp_test_list[i].name;
        if (zpp_test_list[i].needs_hooks && !zpp_fault_hooks_built()) {
            /* Not part of this build's suite: CMake registers it only with
             * the hooks. Asked for by name it fails, so a build whose
             * library lost its hooks cannot pass it by skipping. */
            if (only)
                zpp_test_fail(__FILE__, __LINE__, NULL,
                              "needs a library built with -DZPP_FAULT_HOOKS=ON "
                              "(scripts/test.sh builds one; docs/fault-hooks.md)");
            if (zpp_test_rank == 0)
                printf("[ LEFT OUT ] %s: needs a library built with -DZPP_FAULT_HOOKS=ON\n",
                       zpp__current);
            left_out++;
            continue;
        }
        if (zpp_test_list[i].needs_gpu) {
            if (gpus < 0) gpus = zpp_device_gpu_count();
            if (gpus == 0) {
                if (only)
                    zpp_test_skip("%s needs an NVIDIA GPU and none is visible here (a build "
                                  "without CUDA, no driver, or CUDA_VISIBLE_DEVICES empty); "
                                  "run `ctest -L gpu` on a GPU machine",
                                  zpp__current);
                if (zpp_test_rank == 0) {
                    printf("[ SKIP ] %s: no GPU visible\n", zpp__current);
                    fflush(stdout);
                }
                skipped++;
                continue;
            }
        }
        if (zpp_test_rank == 0) {
            printf("[ RUN  ] %s (seed %llu)\n", zpp__current, (unsigned long long)zpp__seed);
            fflush(stdout);
        }
        zpp_test_list[i].fn();
        if (zpp_test_rank == 0) {
            printf("[  OK  ] %s\n", zpp__current);
            fflush(stdout);
        }
        ran++;
    }
    if (skipped)
        zpp_test_skip("%d GPU case(s) of this program did not run: no NVIDIA GPU is visible "
                      "here; run `ctest -L gpu` on a GPU machine",
                      skipped);
    if (ran == 0 && left_out == 0) {
        fprintf(stderr, "no test named '%s'\n", only ? only : "");
        return 1;
    }
    zpp_test_finalize();
    return 0;
}

static uint64_t ref_fmix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t zpp_test_checksum_ref(const void *p, size_t n) {
    const size_t words = (n + 31) / 32 * 4;
    uint64_t *w = calloc(words ? words : 1, sizeof *w), lane[4] = {0, 0, 0, 0};
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) w[i / 8] |= (uint64_t)b[i] << (8 * (i % 8));
    for (size_t i = 0; i < words; i++) {
        uint64_t x = lane[i % 4] ^ w[i];
        lane[i % 4] = ((x << 29) | (x >> 35)) * 0x9e3779b97f4a7c15ull;
    }
    free(w);
    uint64_t h = 0;
    for (int j = 0; j < 4; j++) h = ref_fmix(h ^ lane[j]);
    return ref_fmix(h ^ (uint64_t)n);
}

uint64_t zpp_test_fnv1a(const void *p, size_t n) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

int zpp_test_run_cli(int np, const char *out_path, const char *err_path, const char *fmt, ...) {
    const char *cli = getenv("ZPP_CLI"), *mpi = getenv("ZPP_MPIEXEC");
    EXPECT(cli && mpi, "ZPP_CLI and ZPP_MPIEXEC must be set (ctest sets them)");
    char args[4096], launch[512] = "", cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (np > 0)
        snprintf(launch, sizeof launch, "%s --oversubscribe --bind-to none -np %d ", mpi, np);
    snprintf(cmd, sizeof cmd, "timeout 240 %s%s %s >%s 2>%s", launch, cli, args, out_path,
             err_path);
    int rc = system(cmd);
    EXPECT(rc != -1, "system() failed");
    int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    EXPECT(code != 124, "timed out (hang?): %s", cmd);
    return code;
}
