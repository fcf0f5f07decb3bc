/* Host emulation of the CUDA runtime calls, kernel launches (256 pthreads
 * per block, lockstep via barriers) and cuBLASLt fp32 matmul semantics
 * (column-major, documented shape rules), for testing without a GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <map>
#include <math.h>
#include "cuda_runtime.h"
#include "cublasLt.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

static std::map<uintptr_t, size_t> g_dev, g_pinned;
static int g_violations = 0;

static int find(const std::map<uintptr_t, size_t> &m, const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin()) return 0;
    --it;
    return a >= it->first && a + bytes <= it->first + (it->second ? it->second : 1);
}

void fake_check_access(const void *p, size_t bytes, const char *what) {
    if (!find(g_dev, p, bytes)) {
        fprintf(stderr, "FAKECUDA VIOLATION: %s: [%p, +%zu) is not inside one device allocation\n", what, p, bytes);
        g_violations++;
        abort();
    }
}

extern "C" {
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "fake cuda error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int) {
    memset(p, 0, sizeof *p);
    strcpy(p->name, "FAKE host emulator");
    p->major = 9; p->minor = 0; p->multiProcessorCount = 1;
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    void *q = malloc(bytes ? bytes : 1);
    if (!q) return cudaErrorMemoryAllocation;
    memset(q, 0xff, bytes); /* NaN garbage */
    g_dev[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (!g_dev.erase((uintptr_t)p)) { fprintf(stderr, "FAKECUDA: cudaFree of non-device %p\n", p); abort(); }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    void *q = malloc(bytes ? bytes : 1);
    memset(q, 0xab, bytes);
    g_pinned[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    if (!g_pinned.erase((uintptr_t)p)) { fprintf(stderr, "FAKECUDA: cudaFreeHost of %p\n", p); abort(); }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) fake_check_access(dst, bytes, "memcpy dst");
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) fake_check_access(src, bytes, "memcpy src");
    if (kind == cudaMemcpyHostToDevice && find(g_dev, src, 1)) { fprintf(stderr, "FAKECUDA: H2D from device\n"); abort(); }
    if (kind == cudaMemcpyDeviceToHost && find(g_dev, dst, 1)) { fprintf(stderr, "FAKECUDA: D2H to device\n"); abort(); }
    memcpy(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t) {
    /* async copies from pageable memory would be a hazard: require pinned */
    if (kind == cudaMemcpyHostToDevice && !find(g_pinned, src, bytes)) { fprintf(stderr, "FAKECUDA: async H2D from non-pinned %p\n", src); abort(); }
    if (kind == cudaMemcpyDeviceToHost && !find(g_pinned, dst, bytes)) { fprintf(stderr, "FAKECUDA: async D2H to non-pinned %p\n", dst); abort(); }
    return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) { fake_check_access(p, bytes, "memset"); memset(p, v, bytes); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t) { return cudaMemset(p, v, bytes); }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)malloc(8); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { *e = (cudaEvent_t)malloc(8); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->type = find(g_dev, p, 1) ? cudaMemoryTypeDevice : find(g_pinned, p, 1) ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}
}

/* ---- kernel execution ---- */
enum { NT = 256 };
static pthread_t g_workers[NT];
static pthread_barrier_t g_start, g_end, g_sync, g_warp[NT / 32];
static const std::function<void()> *g_job;
static dim3 g_block, g_grid, g_dim;
static float g_warpvals[NT / 32][32];
static int g_started = 0;

static void *worker(void *arg) {
    unsigned i = (unsigned)(uintptr_t)arg;
    for (;;) {
        pthread_barrier_wait(&g_start);
        threadIdx = dim3(i, 0, 0);
        blockIdx = g_block;
        gridDim = g_grid;
        blockDim = g_dim;
        (*g_job)();
        pthread_barrier_wait(&g_end);
    }
    return NULL;
}

void fake_syncthreads() { pthread_barrier_wait(&g_sync); }
float fake_shfl_xor(float v, int o) {
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    g_warpvals[w][lane] = v;
    pthread_barrier_wait(&g_warp[w]);
    float r = g_warpvals[w][lane ^ (unsigned)o];
    pthread_barrier_wait(&g_warp[w]);
    return r;
}

void fake_run(const std::function<void()> &f, dim3 grid, dim3 block) {
    if (block.x != NT || block.y != 1 || block.z != 1) { fprintf(stderr, "FAKECUDA: block %u\n", block.x); abort(); }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) { fprintf(stderr, "FAKECUDA: bad grid\n"); abort(); }
    if (!g_started) {
        pthread_barrier_init(&g_start, NULL, NT + 1);
        pthread_barrier_init(&g_end, NULL, NT + 1);
        pthread_barrier_init(&g_sync, NULL, NT);
        for (int w = 0; w < NT / 32; w++) pthread_barrier_init(&g_warp[w], NULL, 32);
        for (int i = 0; i < NT; i++) pthread_create(&g_workers[i], NULL, worker, (void *)(uintptr_t)i);
        g_started = 1;
    }
    g_job = &f;
    g_grid = grid;
    g_dim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                g_block = dim3(x, y, z);
                pthread_barrier_wait(&g_start);
                pthread_barrier_wait(&g_end);
            }
}

/* ---- cuBLASLt ---- */
const char *cublasLtGetStatusName(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "SUCCESS" : "FAKE_ERROR"; }
const char *cublasLtGetStatusString(cublasStatus_t) { return "fake"; }
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (cublasLtHandle_t)malloc(8); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtMatmulDescInit(cublasLtMatmulDesc_t d, cublasComputeType_t ct, cudaDataType st) {
    if (ct != CUBLAS_COMPUTE_32F || st != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
    d->transa = d->transb = 0; d->init = 1; return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
    if (n != 4) return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATMUL_DESC_TRANSA) memcpy(&d->transa, v, 4);
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB) memcpy(&d->transb, v, 4);
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutInit(cublasLtMatrixLayout_t l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    if (t != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
    l->rows = rows; l->cols = cols; l->ld = ld; l->stride = 0; l->batch = 1; l->init = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *v, size_t n) {
    if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) { if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&l->batch, v, 4); }
    else if (a == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) { if (n != 8) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&l->stride, v, 8); }
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceInit(cublasLtMatmulPreference_t p) {
    p->ws = 0; p->alA = p->alB = p->alC = p->alD = 256; p->init = 1; return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n) {
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: if (n != 8) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&p->ws, v, 8); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&p->alA, v, 4); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&p->alB, v, 4); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&p->alC, v, 4); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: if (n != 4) return CUBLAS_STATUS_INVALID_VALUE; memcpy(&p->alD, v, 4); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

static int g_gemms = 0;
/* shape rules of cublasLtMatmul (column-major): D = op(A) op(B), m x n */
static cublasStatus_t shapes(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                             cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, uint64_t *mp, uint64_t *np, uint64_t *kp) {
    if (!d->init || !A->init || !B->init || !C->init || !D->init) return CUBLAS_STATUS_NOT_INITIALIZED;
    uint64_t m = D->rows, n = D->cols;
    uint64_t am = d->transa ? A->cols : A->rows, ak = d->transa ? A->rows : A->cols;
    uint64_t bk = d->transb ? B->cols : B->rows, bn = d->transb ? B->rows : B->cols;
    if (am != m || bn != n || ak != bk || C->rows != m || C->cols != n) {
        fprintf(stderr, "FAKECUBLAS: shape mismatch m=%lu n=%lu opA %lux%lu opB %lux%lu C %lux%lu\n",
                (unsigned long)m, (unsigned long)n, (unsigned long)am, (unsigned long)ak, (unsigned long)bk,
                (unsigned long)bn, (unsigned long)C->rows, (unsigned long)C->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (A->ld < (int64_t)A->rows || B->ld < (int64_t)B->rows || C->ld < (int64_t)C->rows || D->ld < (int64_t)D->rows) {
        fprintf(stderr, "FAKECUBLAS: ld < rows\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (A->batch != D->batch || B->batch != D->batch || C->batch != D->batch || D->batch < 1) {
        fprintf(stderr, "FAKECUBLAS: batch mismatch\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *mp = m; *np = n; *kp = ak;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p,
    int req, cublasLtMatmulHeuristicResult_t *res, int *found) {
    uint64_t m, n, k;
    cublasStatus_t s = shapes(d, a, b, c, dd, &m, &n, &k);
    if (s) return s;
    if (req < 1 || !p->init) return CUBLAS_STATUS_INVALID_VALUE;
    memset(res, 0, sizeof *res);
    res->algo.data[0] = p->alA; res->algo.data[1] = p->alB; res->algo.data[2] = p->alC; res->algo.data[3] = p->alD;
    res->algo.data[4] = 0xfeedu;
    res->state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static void check_align(const void *p, int64_t stride, int batch, uint64_t al, const char *what) {
    for (int b = 0; b < batch; b++) {
        uintptr_t a = (uintptr_t)((const float *)p + b * stride);
        if (a % al) {
            fprintf(stderr, "FAKECUBLAS: %s batch %d at %p is not %lu-byte aligned as declared\n", what, b, (void *)a, (unsigned long)al);
            abort();
        }
    }
}

/* range of a column-major rows x cols, ld, batch stride operand */
static void check_operand(const void *p, cublasLtMatrixLayout_t l, const char *what) {
    for (int b = 0; b < l->batch; b++) {
        const float *base = (const float *)p + b * l->stride;
        size_t extent = (size_t)(l->cols - 1) * l->ld + l->rows;
        fake_check_access(base, extent * 4, what);
    }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha_, const void *A_,
    cublasLtMatrixLayout_t Al, const void *B_, cublasLtMatrixLayout_t Bl, const void *beta_, const void *C_,
    cublasLtMatrixLayout_t Cl, void *D_, cublasLtMatrixLayout_t Dl, const cublasLtMatmulAlgo_t *algo,
    void *ws, size_t wsBytes, cudaStream_t) {
    uint64_t m, n, k;
    cublasStatus_t s = shapes(d, Al, Bl, Cl, Dl, &m, &n, &k);
    if (s) return s;
    if (!algo || algo->data[4] != 0xfeedu) return CUBLAS_STATUS_INVALID_VALUE;
    if (wsBytes) fake_check_access(ws, wsBytes, "workspace");
    check_align(A_, Al->stride, Al->batch, algo->data[0], "A");
    check_align(B_, Bl->stride, Bl->batch, algo->data[1], "B");
    check_align(C_, Cl->stride, Cl->batch, algo->data[2], "C");
    check_align(D_, Dl->stride, Dl->batch, algo->data[3], "D");
    check_operand(A_, Al, "A");
    check_operand(B_, Bl, "B");
    check_operand(D_, Dl, "D");
    float alpha = *(const float *)alpha_, beta = *(const float *)beta_;
    if (beta != 0.0f) check_operand(C_, Cl, "C");
    const float *A = (const float *)A_, *B = (const float *)B_, *C = (const float *)C_;
    float *D = (float *)D_;
    g_gemms++;
    for (int b = 0; b < Dl->batch; b++) {
        const float *Ab = A + b * Al->stride, *Bb = B + b * Bl->stride, *Cb = C + b * Cl->stride;
        float *Db = D + b * Dl->stride;
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) {
                double acc = 0;
                static int f32 = getenv("FAKE_GEMM_F32") != NULL;
                if (f32) {
                    float facc = 0.0f;
                    for (uint64_t q = k; q-- > 0;) {
                        float a = d->transa ? Ab[q + i * Al->ld] : Ab[i + q * Al->ld];
                        float bb = d->transb ? Bb[j + q * Bl->ld] : Bb[q + j * Bl->ld];
                        facc = fmaf(a, bb, facc);
                    }
                    acc = facc;
                } else
                for (uint64_t q = 0; q < k; q++) {
                    float a = d->transa ? Ab[q + i * Al->ld] : Ab[i + q * Al->ld];
                    float bb = d->transb ? Bb[j + q * Bl->ld] : Bb[q + j * Bl->ld];
                    acc += (double)a * bb;
                }
                float r = (float)(alpha * acc);
                if (beta != 0.0f) r = r + beta * Cb[i + j * Cl->ld];
                Db[i + j * Dl->ld] = r;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
