/* core/cpu.c — run-time choice of the CPU kernels' instruction set
 * (core/cpu.h). */
#include "core/cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/error.h"

static const char *const kIsaNames[ZPP_CPU_ISA_COUNT] = {"generic", "avx2", "avx512"};

/* -1 until the first zpp_cpu_isa_active; then the path in use. Atomic so
 * threads that quantize at the same time all read a whole value; the first
 * ones may each compute it, and they compute the same. */
static atomic_int isa_now = -1;

const char *zpp_cpu_isa_name(zpp_cpu_isa isa) {
    if ((int)isa < 0 || (int)isa >= ZPP_CPU_ISA_COUNT) return "unknown";
    return kIsaNames[isa];
}

int zpp_cpu_isa_supported(zpp_cpu_isa isa) {
    switch (isa) {
    case ZPP_CPU_GENERIC: return 1;
#if ZPP_CPU_X86_PATHS
    /* libgcc's cpuid reading also checks (xgetbv) that the OS saves the
     * YMM / ZMM registers, without which the instructions would fault. The
     * ISA levels are exactly the feature sets the target pragmas enable. */
    case ZPP_CPU_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("x86-64-v3") != 0;
    case ZPP_CPU_AVX512: __builtin_cpu_init(); return __builtin_cpu_supports("x86-64-v4") != 0;
#endif
    default: return 0;
    }
}

static zpp_cpu_isa isa_choose(void) {
    int cap = ZPP_CPU_ISA_COUNT - 1;
    const char *env = zpp_env_get(ZPP_ENV_CPU_ISA);
    if (env)
        for (int i = 0; i < ZPP_CPU_ISA_COUNT; i++)
            if (!strcmp(env, kIsaNames[i])) cap = i;
    for (int i = cap; i > 0; i--)
        if (zpp_cpu_isa_supported((zpp_cpu_isa)i)) return (zpp_cpu_isa)i;
    return ZPP_CPU_GENERIC;
}

zpp_cpu_isa zpp_cpu_isa_active(void) {
    int now = atomic_load_explicit(&isa_now, memory_order_relaxed);
    if (now < 0) {
        now = (int)isa_choose();
        atomic_store_explicit(&isa_now, now, memory_order_relaxed);
    }
    return (zpp_cpu_isa)now;
}

zpp_status zpp_cpu_isa_set(zpp_cpu_isa isa) {
    if (!zpp_cpu_isa_supported(isa))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "CPU kernels: the %s path is not available on this CPU or in this "
                         "build; use one of those zpp_cpu_isa_supported accepts",
                         zpp_cpu_isa_name(isa));
    atomic_store_explicit(&isa_now, (int)isa, memory_order_relaxed);
    return ZPP_OK;
}
