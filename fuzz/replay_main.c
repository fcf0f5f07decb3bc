/* fuzz/replay_main.c — runs a fuzz target's LLVMFuzzerTestOneInput over
 * every file of the directories (or files) named on the command line: the
 * corpus replay of the ctest tests fuzz_replay_* (no clang, no libFuzzer
 * needed) and a way to re-run a crash input under gdb. Exit 0 when every
 * input ran (a failing input aborts, as under libFuzzer). */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) return 1;
    printf("replay: %s (%zu bytes)\n", path, n);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    int rc = 0, runs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            rc |= run_file(argv[i]);
            runs++;
            continue;
        }
        DIR *dir = opendir(argv[i]);
        if (!dir) return 1;
        char **names = NULL;
        size_t n = 0;
        for (struct dirent *e; (e = readdir(dir));) {
            if (e->d_name[0] == '.') continue;
            names = realloc(names, (n + 1) * sizeof *names);
            names[n++] = strdup(e->d_name);
        }
        closedir(dir);
        qsort(names, n, sizeof *names, cmp);
        for (size_t k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]);
            rc |= run_file(path);
            runs++;
            free(names[k]);
        }
        free(names);
    }
    printf("replay: %d input%s\n", runs, runs == 1 ? "" : "s");
    if (runs == 0) return 1; /* an empty corpus is a broken test */
    return rc;
}
