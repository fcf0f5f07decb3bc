/* device/device_caps.c — what a GPU can compute, by its compute capability
 * (device_caps.h). In every build: the rules are plain arithmetic. */
#include "device/device_caps.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/error.h"

/* Writes the message (when there is room) and returns st. */
static zpp_status caps_say(zpp_status st, char *msg, size_t n, const char *fmt, ...)
    ZPP_PRINTF(4, 5);
static zpp_status caps_say(zpp_status st, char *msg, size_t n, const char *fmt, ...) {
    if (msg && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, n, fmt, ap);
        va_end(ap);
    }
    return st;
}

zpp_status zpp_device_dtype_check(int cc_major, int cc_minor, zpp_dtype dtype, char *msg,
                                  size_t n) {
    if (zpp_dtype_size(dtype) == 0)
        return caps_say(ZPP_ERR_INVALID, msg, n,
                        "unknown dtype %d; use ZPP_FP32, ZPP_BF16 or ZPP_FP16", (int)dtype);
    if (cc_major < 0 || cc_minor < 0 || cc_minor > 9)
        return caps_say(ZPP_ERR_INVALID, msg, n,
                        "compute capability %d.%d is not one; a GPU reports major.minor with "
                        "minor 0..9",
                        cc_major, cc_minor);
    const int cc = 10 * cc_major + cc_minor;
    if (cc < ZPP_CC_MIN)
        return caps_say(ZPP_ERR_UNSUPPORTED, msg, n,
                        "zeropp's GPU backend needs compute capability %d.%d (Volta) or newer; "
                        "this GPU is %d.%d: train on the CPU (--device cpu) or on a newer GPU",
                        ZPP_CC_MIN / 10, ZPP_CC_MIN % 10, cc_major, cc_minor);
    if (dtype == ZPP_BF16 && cc < ZPP_CC_BF16)
        return caps_say(ZPP_ERR_UNSUPPORTED, msg, n,
                        "bf16 needs compute capability %d.%d or newer (this GPU is %d.%d); use "
                        "fp16 with loss scaling instead (config: \"fp16\": {\"enabled\": true}, "
                        "bf16 off; dynamic loss scaling by default) or fp32 (neither enabled)",
                        ZPP_CC_BF16 / 10, ZPP_CC_BF16 % 10, cc_major, cc_minor);
    return caps_say(ZPP_OK, msg, n, "%s", "");
}

zpp_status zpp_device_compute_capability(const zpp_device *d, int *major_p, int *minor_p) {
    if (!d || !d->ops)
        return zpp_error(ZPP_ERR_INVALID, "compute capability: no device; create one with "
                                          "zpp_device_create_gpu");
    if (!major_p || !minor_p)
        return zpp_error(ZPP_ERR_INVALID, "compute capability: major_p and minor_p are required");
    if (d->mem != ZPP_MEM_DEVICE)
        return zpp_error(ZPP_ERR_INVALID,
                         "compute capability: the host device has none; ask a GPU device");
    int major = 0, minor = 0;
    ZPP_CHECK(zpp__device_gpu_cc(d->ordinal, &major, &minor));
    *major_p = major;
    *minor_p = minor;
    return ZPP_OK;
}
