/* core/arena.h — a bump allocator over one block of floats, run twice:
 * with base NULL it only counts (used), then over the block it hands out
 * the same pointers. Every buffer starts on a multiple of `align` floats.
 * A size that overflows sets `overflow` and returns NULL. The models carve
 * their activations from one with it (model/decoder.h), the engine its
 * units' persistent buffers (engine/units.c): one device allocation each,
 * so no buffer holds a part-used page of its own. */
#ifndef ZPP_CORE_ARENA_H
#define ZPP_CORE_ARENA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zpp_arena {
    float *base;
    size_t used;  /* floats */
    size_t align; /* floats, >= 1 */
    int overflow;
} zpp_arena;

float *zpp_arena_take(zpp_arena *a, size_t rows, size_t width);

/* rows x width elements of elem_bytes each (a working dtype's 2 or 4),
 * rounded up to whole floats: the arena's unit. */
void *zpp_arena_take_bytes(zpp_arena *a, size_t rows, size_t width, size_t elem_bytes);

#ifdef __cplusplus
}
#endif

#endif
