/* core/error.h — raising and propagating zpp_status with a message.
 *
 * Library code reports failure by returning a negative zpp_status. The
 * function that detects the problem records a message with zpp_error(),
 * which returns the status so that raising is one statement:
 *
 *     if (block % 8) return zpp_error(ZPP_ERR_INVALID,
 *         "quantize: block %zu is not a multiple of 8", block);
 *
 * Callers propagate with ZPP_CHECK (or ZPP_CHECK_GOTO when cleanup is due),
 * and may prepend context with zpp_error_context(). */
#ifndef ZPP_CORE_ERROR_H
#define ZPP_CORE_ERROR_H

#include "zeropp.h"

#if defined(__GNUC__)
#define ZPP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ZPP_PRINTF(a, b)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Records "message" for zpp_last_error() and returns status. */
zpp_status zpp_error(zpp_status status, const char *fmt, ...) ZPP_PRINTF(2, 3);

/* Prepends "context: " to the current message and returns status. */
zpp_status zpp_error_context(zpp_status status, const char *fmt, ...)
    ZPP_PRINTF(2, 3);

/* Clears the message (used by tests). */
void zpp_error_clear(void);

#ifdef __cplusplus
}
#endif

#define ZPP_CHECK(call)                                                       \
    do {                                                                      \
        zpp_status zpp_check_s_ = (call);                                     \
        if (zpp_check_s_ != ZPP_OK) return zpp_check_s_;                      \
    } while (0)

/* Sets `st` and jumps to `label` on failure: for functions with cleanup. */
#define ZPP_CHECK_GOTO(call, st, label)                                       \
    do {                                                                      \
        (st) = (call);                                                        \
        if ((st) != ZPP_OK) goto label;                                       \
    } while (0)

#endif
