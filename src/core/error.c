/* core/error.c — status names and the thread-local last-error message. */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ZPP_MSG_CAP 1024

static _Thread_local char last_msg[ZPP_MSG_CAP];
static _Thread_local int hold_depth; /* zpp_error_hold depth */
static _Thread_local int latched;    /* a timeout's message is kept */

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

const char *zpp_last_error(void) { return last_msg; }

void zpp_error_clear(void) {
    last_msg[0] = '\0';
    latched = 0;
}

void zpp_error_hold(void) { hold_depth++; }

void zpp_error_release(void) {
    if (hold_depth > 0) hold_depth--;
}

zpp_status zpp_error(zpp_status status, const char *fmt, ...) {
    if (hold_depth || latched) return status; /* the first failure stays */
    if (status == ZPP_ERR_TIMEOUT) latched = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return status;
}

zpp_status zpp_error_append(zpp_status status, const char *fmt, ...) {
    if (hold_depth) return status;
    size_t k = strlen(last_msg);
    if (k + 2 >= sizeof last_msg) return status;
    last_msg[k] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg + k + 1, sizeof last_msg - k - 1, fmt, ap);
    va_end(ap);
    return status;
}

zpp_status zpp_error_context(zpp_status status, const char *fmt, ...) {
    if (hold_depth) return status;
    char prefix[256];
    char old[ZPP_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_msg, sizeof old);
    const char *rest = old[0] ? old : zpp_status_str(status);
    /* Truncation is acceptable: the prefix is short and the message ends in
     * the least important detail. */
    size_t k = strlen(prefix);
    if (k > sizeof last_msg - 3) k = sizeof last_msg - 3;
    memcpy(last_msg, prefix, k);
    memcpy(last_msg + k, ": ", 2);
    size_t room = sizeof last_msg - k - 3, r = strlen(rest);
    if (r > room) r = room;
    memcpy(last_msg + k + 2, rest, r);
    last_msg[k + 2 + r] = '\0';
    return status;
}

const char *zpp_version(void) { return "0.1.0"; }
