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

/* Clears the message, and the latch below (tests; a caller that handled a
 * timeout and goes on). */
void zpp_error_clear(void);

/* The first failure's message is the one the user sees.
 *
 * 1. A timeout latches: once this thread has recorded a ZPP_ERR_TIMEOUT
 *    message, zpp_error() leaves it in place (and still returns its own
 *    status) until zpp_error_clear(). A timeout is fatal for the job
 *    (comm/comm.h), so whatever fails after it (a communicator refusing
 *    work, a cleanup's wait) is its consequence, not news.
 *    zpp_error_context() still prepends to it (the trainer adds the step).
 * 2. Cleanup holds: between zpp_error_hold() and zpp_error_release() (they
 *    nest) neither zpp_error() nor zpp_error_context() touches the
 *    message. Every cleanup path that may fail after a first failure (the
 *    engine's drain, the destroy functions) runs held, so the message of
 *    the failure that started it survives. */
void zpp_error_hold(void);
void zpp_error_release(void);

/* Appends " text" to the current message (held: nothing) and returns
 * status: a detail after the message, where context would go before it. */
zpp_status zpp_error_append(zpp_status status, const char *fmt, ...) ZPP_PRINTF(2, 3);

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
