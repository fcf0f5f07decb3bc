/* core/fault_nohooks.c — fault.h in a build without the test hooks (the
 * default): nothing is read, nothing fires, nothing exits. A test that
 * needs the hooks asks zpp_fault_hooks_built() and is not run. */
#include "core/fault.h"

#include <limits.h>

#include "core/error.h"

int zpp_fault_hooks_built(void) { return 0; }

zpp_status zpp_fault_from_env(zpp_fault *f_p) {
    *f_p = (zpp_fault){ZPP_FAULT_NONE, 0, 0};
    return ZPP_OK;
}

int zpp_fault_fires(const zpp_fault *f, zpp_fault_kind kind, int step, int rank, int world) {
    return 0;
}

static zpp_status no_hooks(void) {
    return zpp_error(ZPP_ERR_UNSUPPORTED, "this library was built without test hooks; "
                                          "configure with the fault-hooks option on "
                                          "(docs/fault-hooks.md)");
}

zpp_status zpp_fault_save_error(const char *path, int step) { return no_hooks(); }

zpp_status zpp_fault_kill_mid_write(FILE *f, const void *p, size_t n) { return no_hooks(); }

void zpp_fault_slow_save(void) {}

int zpp_fault_mpi_max_count(void) { return INT_MAX; }

zpp_status zpp_fault_set_mpi_max_count(int max_count) { return no_hooks(); }
