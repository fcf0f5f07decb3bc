/* core/dtype.c — dtype names and sizes. */
#include "core/dtype.h"

#include <string.h>

#include "core/error.h"

size_t zpp_dtype_size(zpp_dtype dtype) {
    switch (dtype) {
    case ZPP_FP32: return 4;
    case ZPP_BF16:
    case ZPP_FP16: return 2;
    }
    return 0;
}

const char *zpp_dtype_name(zpp_dtype dtype) {
    switch (dtype) {
    case ZPP_FP32: return "fp32";
    case ZPP_BF16: return "bf16";
    case ZPP_FP16: return "fp16";
    }
    return "unknown";
}

zpp_status zpp_dtype_parse(const char *name, zpp_dtype *dtype_p) {
    static const zpp_dtype all[] = {ZPP_FP32, ZPP_BF16, ZPP_FP16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (name && strcmp(name, zpp_dtype_name(all[i])) == 0) {
            *dtype_p = all[i];
            return ZPP_OK;
        }
    }
    return zpp_error(ZPP_ERR_INVALID, "unknown dtype '%s'; use fp32, bf16 or fp16",
                     name ? name : "(null)");
}
