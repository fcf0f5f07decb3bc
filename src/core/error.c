/* core/error.c — status names and the thread-local last-error message. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ZPP_MSG_CAP 1024

static _Thread_local char zpp__msg[ZPP_MSG_CAP];
static _Thread_local int zpp__held;    /* zpp_error_hold depth */
static _Thread_local int zpp__latched; /* a timeout's message is kept */

const char *zpp_status_str(zpp_status status) {
    switch (status) {
#define ZPP_STATUS_CASE_(name, value, text)                                   \
    case ZPP_##name:                                                          \
        return text;
        ZPP_STATUS_LIST(ZPP_STATUS_CASE_)
#undef ZPP_STATUS_CASE_
    }
    return "unknown status";
}

const char *zpp_last_error(void) { return zpp__msg; }

void zpp_error_clear(void) {
    zpp__msg[0] = '\0';
    zpp__latched = 0;
}

void zpp_error_hold(void) { zpp__held++; }

void zpp_error_release(void) {
    if (zpp__held > 0) zpp__held--;
}

zpp_status zpp_error(zpp_status status, const char *fmt, ...) {
    if (zpp__held || zpp__latched) return status; /* the first failure stays */
    if (status == ZPP_ERR_TIMEOUT) zpp__latched = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(zpp__msg, sizeof zpp__msg, fmt, ap);
    va_end(ap);
    return status;
}

zpp_status zpp_error_append(zpp_status status, const char *fmt, ...) {
    if (zpp__held) return status;
    size_t k = strlen(zpp__msg);
    if (k + 2 >= sizeof zpp__msg) return status;
    zpp__msg[k] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(zpp__msg + k + 1, sizeof zpp__msg - k - 1, fmt, ap);
    va_end(ap);
    return status;
}

zpp_status zpp_error_context(zpp_status status, const char *fmt, ...) {
    if (zpp__held) return status;
    char prefix[256];
    char old[ZPP_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, zpp__msg, sizeof old);
    const char *rest = old[0] ? old : zpp_status_str(status);
    /* Truncation is acceptable: the prefix is short and the message ends in
     * the least important detail. */
    size_t k = strlen(prefix);
    if (k > sizeof zpp__msg - 3) k = sizeof zpp__msg - 3;
    memcpy(zpp__msg, prefix, k);
    memcpy(zpp__msg + k, ": ", 2);
    size_t room = sizeof zpp__msg - k - 3, r = strlen(rest);
    if (r > room) r = room;
    memcpy(zpp__msg + k + 2, rest, r);
    zpp__msg[k + 2 + r] = '\0';
    return status;
}

const char *zpp_version(void) { return "0.1.0"; }
