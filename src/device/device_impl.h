/* device/device_impl.h — what the backends share with the fronts (device.c).
 * Internal to device/. */
#ifndef ZPP_DEVICE_DEVICE_IMPL_H
#define ZPP_DEVICE_DEVICE_IMPL_H

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Finishes a backend's zpp_device_create_*: `d` has ops, mem, ordinal,
 * stream and impl set; this allocates and clears the non-finite flag in the
 * device's memory and hands `d` out. On failure `d` is destroyed. */
zpp_status zpp__device_publish(zpp_device *d, zpp_device **d_p);

#ifdef __cplusplus
}
#endif

#endif
