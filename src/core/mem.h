/* core/mem.h — host and device memory behind one interface.
 *
 * The engine and collectives never call malloc or cudaMalloc directly: they
 * ask for memory of a kind, so the same code drives host ranks (MPI) and GPU
 * ranks (NCCL). Host memory is 64-byte aligned. In a build without CUDA,
 * asking for device memory returns ZPP_ERR_UNSUPPORTED. */
#ifndef ZPP_CORE_MEM_H
#define ZPP_CORE_MEM_H

#include <stddef.h>

#include "zeropp.h"

typedef enum zpp_mem_kind { ZPP_MEM_HOST = 0, ZPP_MEM_DEVICE = 1 } zpp_mem_kind;

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates `bytes` (0 gives a valid unique pointer) of `kind`. */
zpp_status zpp_mem_alloc(zpp_mem_kind kind, size_t bytes, void **p_p);
/* Frees memory from zpp_mem_alloc; NULL is ignored. */
void zpp_mem_free(zpp_mem_kind kind, void *p);
/* Synchronous copy between any two kinds. */
zpp_status zpp_mem_copy(zpp_mem_kind dst_kind, void *dst, zpp_mem_kind src_kind,
                        const void *src, size_t bytes);
/* Sets `bytes` bytes to `value`. */
zpp_status zpp_mem_set(zpp_mem_kind kind, void *p, int value, size_t bytes);
/* 1 if this build has CUDA and a device is visible. */
int zpp_mem_have_device(void);

#ifdef __cplusplus
}
#endif

#endif
