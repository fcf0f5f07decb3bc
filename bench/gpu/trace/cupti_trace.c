/* bench/gpu/trace/cupti_trace.c — a timeline of any CUDA program, for
 * finding the time a step spends outside its kernels.
 *
 * ncu (bench/gpu/step_profile.sh) times each kernel alone, serialised and
 * at locked clocks, so it cannot see what lies between kernels: launch
 * gaps, a host that falls behind its queue, a wait on the host. This is a
 * CUPTI injection library: the CUDA driver loads it into a process that
 * runs with
 *
 *   CUDA_INJECTION64_PATH=/path/to/libzpp_cupti_trace.so ZPP_TRACE_OUT=t-%p.tsv PROGRAM ...
 *
 * and calls InitializeInjection before the program's first CUDA call, so
 * ours and llm.c are traced the same way with neither rebuilt. It records,
 * with CUPTI's one clock (ns), every kernel, memcpy and memset on the
 * device and every runtime and driver API call on the host, and writes at
 * exit one line each (tab-separated; bench/gpu/trace/timeline.c reads it):
 *
 *   K|M|S  start end stream correlation name     kernel, memcpy, memset
 *   R|D    start end thread correlation name     runtime, driver API call
 *
 * A kernel's correlation id is that of the API call that launched it, which
 * is how timeline.c tells a GPU that waited for its host from one that
 * waited on itself. "%p" in ZPP_TRACE_OUT becomes the process id (one file
 * a rank); the default is zpp-trace-%p.tsv. A bench tool, not part of the
 * library: it prints to stderr and gives up quietly when CUPTI fails. */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kBufferBytes = 8 << 20, kAlign = 8 };

static FILE *g_out;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long g_dropped;

static void warn_cupti(const char *what, CUptiResult r) {
    const char *s = "unknown";
    cuptiGetResultString(r, &s);
    fprintf(stderr, "zpp_cupti_trace: %s failed: %s (no trace)\n", what, s);
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(kAlign, kBufferBytes);
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0; /* as many as fit */
}

static const char *api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
    const char *name = NULL;
    if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "?";
    return name;
}

static const char *copy_kind(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    default: return "other";
    }
}

/* One record as one line; unknown kinds are skipped. */
static void write_record(const CUpti_Activity *rec) {
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(g_out, "K\t%llu\t%llu\t%u\t%u\t%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->correlationId,
                k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
        fprintf(g_out, "M\t%llu\t%llu\t%u\t%u\tmemcpy %s %llu B\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->correlationId,
                copy_kind(m->copyKind), (unsigned long long)m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
        fprintf(g_out, "S\t%llu\t%llu\t%u\t%u\tmemset %llu B\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->correlationId,
                (unsigned long long)m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
        int rt = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
        fprintf(g_out, "%c\t%llu\t%llu\t%u\t%u\t%s\n", rt ? 'R' : 'D',
                (unsigned long long)a->start, (unsigned long long)a->end, a->threadId,
                a->correlationId,
                api_name(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                         a->cbid));
        break;
    }
    default: break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
    (void)size;
    pthread_mutex_lock(&g_lock);
    CUpti_Activity *rec = NULL;
    while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
        write_record(rec);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
        g_dropped += dropped;
    pthread_mutex_unlock(&g_lock);
    free(buffer);
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&g_lock);
    if (g_out) {
        fclose(g_out);
        g_out = NULL;
    }
    if (g_dropped)
        fprintf(stderr, "zpp_cupti_trace: %llu records dropped; the trace has holes\n",
                g_dropped);
    pthread_mutex_unlock(&g_lock);
}

/* ZPP_TRACE_OUT with each "%p" replaced by the process id. */
static FILE *open_out(void) {
    const char *pat = getenv("ZPP_TRACE_OUT");
    if (!pat || !*pat) pat = "zpp-trace-%p.tsv";
    char path[4096];
    size_t n = 0;
    for (const char *c = pat; *c && n + 24 < sizeof path; c++) {
        if (c[0] == '%' && c[1] == 'p') {
            n += (size_t)snprintf(path + n, sizeof path - n, "%ld", (long)getpid());
            c++;
        } else {
            path[n++] = *c;
        }
    }
    path[n] = '\0';
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "zpp_cupti_trace: cannot write %s (no trace)\n", path);
    return f;
}

static int give_up(const char *what, CUptiResult r) {
    warn_cupti(what, r);
    fclose(g_out);
    g_out = NULL;
    return 1;
}

/* The entry point the CUDA driver calls (CUDA_INJECTION64_PATH); 1 = loaded. */
int InitializeInjection(void) {
    static const CUpti_ActivityKind kinds[] = {
        CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
    };
    g_out = open_out();
    if (!g_out) return 1;
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) return give_up("cuptiActivityRegisterCallbacks", r);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        r = cuptiActivityEnable(kinds[i]);
        if (r != CUPTI_SUCCESS) return give_up("cuptiActivityEnable", r);
    }
    atexit(at_exit);
    return 1;
}
