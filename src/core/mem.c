/* core/mem.c — host and device allocation. */
#include "core/mem.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#ifdef ZPP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define ZPP_HOST_ALIGN 64

zpp_status zpp_mem_alloc(zpp_mem_kind kind, size_t bytes, void **p_p) {
    void *p = NULL;
    if (kind == ZPP_MEM_HOST) {
        size_t rounded = (bytes + ZPP_HOST_ALIGN - 1) / ZPP_HOST_ALIGN * ZPP_HOST_ALIGN;
        if (rounded == 0) rounded = ZPP_HOST_ALIGN;
        p = aligned_alloc(ZPP_HOST_ALIGN, rounded);
        if (!p)
            return zpp_error(ZPP_ERR_NOMEM, "could not allocate %zu bytes of host memory",
                             bytes);
        *p_p = p;
        return ZPP_OK;
    }
#ifdef ZPP_HAVE_CUDA
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess)
        return zpp_error(e == cudaErrorMemoryAllocation ? ZPP_ERR_NOMEM : ZPP_ERR_CUDA,
                         "could not allocate %zu bytes of device memory: %s", bytes,
                         cudaGetErrorString(e));
    *p_p = p;
    return ZPP_OK;
#else
    (void)bytes;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "device memory requested, but this build has no CUDA; rebuild "
                     "with nvcc on the PATH");
#endif
}

void zpp_mem_free(zpp_mem_kind kind, void *p) {
    if (!p) return;
    if (kind == ZPP_MEM_HOST) {
        free(p);
        return;
    }
#ifdef ZPP_HAVE_CUDA
    cudaFree(p);
#endif
}

zpp_status zpp_mem_copy(zpp_mem_kind dst_kind, void *dst, zpp_mem_kind src_kind,
                        const void *src, size_t bytes) {
    if (bytes == 0) return ZPP_OK;
    if (dst_kind == ZPP_MEM_HOST && src_kind == ZPP_MEM_HOST) {
        memmove(dst, src, bytes);
        return ZPP_OK;
    }
#ifdef ZPP_HAVE_CUDA
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA, "copy of %zu bytes failed: %s", bytes,
                         cudaGetErrorString(e));
    return ZPP_OK;
#else
    return zpp_error(ZPP_ERR_UNSUPPORTED, "device copy requested, but this build has no CUDA");
#endif
}

zpp_status zpp_mem_set(zpp_mem_kind kind, void *p, int value, size_t bytes) {
    if (bytes == 0) return ZPP_OK;
    if (kind == ZPP_MEM_HOST) {
        memset(p, value, bytes);
        return ZPP_OK;
    }
#ifdef ZPP_HAVE_CUDA
    cudaError_t e = cudaMemset(p, value, bytes);
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA, "memset of %zu bytes failed: %s", bytes,
                         cudaGetErrorString(e));
    return ZPP_OK;
#else
    return zpp_error(ZPP_ERR_UNSUPPORTED, "device memset requested, but this build has no CUDA");
#endif
}

int zpp_mem_have_device(void) {
#ifdef ZPP_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
#else
    return 0;
#endif
}
