/* core/arena.c — the two-pass bump allocator (arena.h). */
#include "core/arena.h"

#include <stdint.h>

float *zpp_arena_take(zpp_arena *a, size_t rows, size_t width) {
    size_t n;
    if (a->overflow || __builtin_mul_overflow(rows, width, &n) ||
        n > SIZE_MAX / 8 - a->used) {
        a->overflow = 1;
        return NULL;
    }
    float *p = a->base ? a->base + a->used : NULL;
    a->used += (n + a->align - 1) / a->align * a->align;
    return p;
}

void *zpp_arena_take_bytes(zpp_arena *a, size_t rows, size_t width, size_t elem_bytes) {
    size_t n;
    if (__builtin_mul_overflow(rows, width, &n) || n > SIZE_MAX / 8) {
        a->overflow = 1;
        return NULL;
    }
    return zpp_arena_take(a, (n * elem_bytes + sizeof(float) - 1) / sizeof(float), 1);
}
