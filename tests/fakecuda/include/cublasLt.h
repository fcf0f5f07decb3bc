#ifndef FAKE_CUBLASLT_H
#define FAKE_CUBLASLT_H
#include <stdint.h>
#include <stddef.h>
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_INVALID_VALUE = 7,
               CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUDA_R_32F = 0 } cudaDataType;
typedef struct fake_lt_handle *cublasLtHandle_t;
typedef struct { int32_t transa, transb; int init; } cublasLtMatmulDescOpaque_t;
typedef struct { uint64_t rows, cols; int64_t ld, stride; int32_t batch; int init; } cublasLtMatrixLayoutOpaque_t;
typedef struct { uint64_t ws; uint32_t alA, alB, alC, alD; int init; } cublasLtMatmulPreferenceOpaque_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct { cublasLtMatmulAlgo_t algo; size_t workspaceSize; cublasStatus_t state; float wavesCount; int reserved[4]; } cublasLtMatmulHeuristicResult_t;
typedef cublasLtMatmulDescOpaque_t *cublasLtMatmulDesc_t;
typedef cublasLtMatrixLayoutOpaque_t *cublasLtMatrixLayout_t;
typedef cublasLtMatmulPreferenceOpaque_t *cublasLtMatmulPreference_t;
typedef enum { CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4 } cublasLtMatmulDescAttributes_t;
typedef enum { CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6 } cublasLtMatrixLayoutAttribute_t;
typedef enum { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8 } cublasLtMatmulPreferenceAttributes_t;
#include "cuda_runtime_api.h"
const char *cublasLtGetStatusName(cublasStatus_t s);
const char *cublasLtGetStatusString(cublasStatus_t s);
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescInit(cublasLtMatmulDesc_t d, cublasComputeType_t ct, cudaDataType st);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n);
cublasStatus_t cublasLtMatrixLayoutInit(cublasLtMatrixLayout_t l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *v, size_t n);
cublasStatus_t cublasLtMatmulPreferenceInit(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p,
    int req, cublasLtMatmulHeuristicResult_t *res, int *found);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
    cublasLtMatrixLayout_t Al, const void *B, cublasLtMatrixLayout_t Bl, const void *beta, const void *C,
    cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl, const cublasLtMatmulAlgo_t *algo,
    void *ws, size_t wsBytes, cudaStream_t s);
#endif
