/* device/device.c — the fronts of device.h: each checks its arguments once
 * and dispatches to the backend's table; plus what every backend shares:
 * the memory accounting, the one scratch pool and the non-finite flag.
 *
 * Checking here, not in the backends, keeps one message per mistake on
 * both backends and lets a kernel assume sane sizes: a CUDA kernel given a
 * wrapped-around element count would read far out of bounds instead of
 * failing. */
#include "device/device.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/device_impl.h"

/* ---- Argument checks ------------------------------------------------------ */

static zpp_status check_dev(const zpp_device *d, const char *what) {
    if (!d || !d->ops)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: no device; create one with zpp_device_create_host or "
                         "zpp_device_create_gpu",
                         what);
    return ZPP_OK;
}

/* *r = a * b, or ZPP_ERR_INVALID when it does not fit a size_t: a count
 * that wraps around would pass every later check and overrun a buffer. */
static zpp_status checked_mul(const char *what, size_t a, size_t b, size_t *r) {
    if (a && b > SIZE_MAX / a)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: %zu x %zu elements overflow a size_t; the sizes are wrong "
                         "(a negative count converted to size_t?)",
                         what, a, b);
    *r = a * b;
    return ZPP_OK;
}

static zpp_status check_ptr(const char *what, const void *p, const char *name, size_t n) {
    if (!p && n)
        return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL but %zu elements were asked for", what,
                         name, n);
    return ZPP_OK;
}

static zpp_status check_dtype(const char *what, zpp_dtype dtype) {
    if (zpp_dtype_size(dtype) == 0)
        return zpp_error(ZPP_ERR_INVALID, "%s: unknown dtype %d; use ZPP_FP32, ZPP_BF16 or ZPP_FP16",
                         what, (int)dtype);
    return ZPP_OK;
}

static zpp_status check_spec(const char *what, const zpp_quant_spec *spec) {
    if (!spec) return zpp_error(ZPP_ERR_INVALID, "%s: the quantization spec is NULL", what);
    zpp_status st = zpp_quant_spec_check(spec);
    if (st != ZPP_OK) return zpp_error_context(st, "%s", what);
    return ZPP_OK;
}

static zpp_status check_slab(const char *what, size_t chunk_len, size_t first, size_t len) {
    if (first > chunk_len || len > chunk_len - first)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: slab [%zu, %zu) runs past a chunk of %zu elements; keep "
                         "first + len <= chunk_len",
                         what, first, first + len, chunk_len);
    return ZPP_OK;
}

/* ---- Creating and destroying ------------------------------------------------ */

/* Profiling (below): event_wait and destroy use it. */
static int stream_is_caller(const zpp_device *d);
static int prof_open(const zpp_device *d);
static void prof_mark(zpp_device *d);
static void prof_free(zpp_device *d);

zpp_status zpp__device_publish(zpp_device *d, zpp_device **d_p) {
    /* The flag is not counted in mem_now: it is the device's own. */
    zpp_status st = d->ops->alloc(d, sizeof(int), (void **)&d->nonfinite);
    if (st == ZPP_OK) st = d->ops->set(d, d->nonfinite, 0, sizeof(int));
    if (st == ZPP_OK) st = d->ops->sync(d, NULL);
    if (st != ZPP_OK) {
        zpp_device_destroy(d);
        return zpp_error_context(st, "device: the non-finite flag");
    }
    *d_p = d;
    return ZPP_OK;
}

void zpp_device_destroy(zpp_device *d) {
    if (!d) return;
    if (d->ops) {
        /* Work in flight may still read scratch buffers. */
        (void)d->ops->sync(d, NULL);
        /* The scratch buffers are live allocations too; what a caller never
         * freed goes back with them, so no allocation outlives its device. */
        for (size_t i = 0; i < d->live_len; i++) d->ops->free(d, d->live[i].p);
        if (d->nonfinite) d->ops->free(d, d->nonfinite);
        if (d->prof) prof_free(d);
        d->ops->destroy(d);
    }
    free(d->pool);
    free(d->live);
    free(d);
}

zpp_status zpp_device_name(const zpp_device *d, char *buf, size_t cap) {
    ZPP_CHECK(check_dev(d, "name"));
    if (!buf || cap == 0)
        return zpp_error(ZPP_ERR_INVALID, "name: no room for it (buf %s, cap %zu)",
                         buf ? "given" : "NULL", cap);
    return d->ops->device_name(d, buf, cap);
}

/* ---- Memory ---------------------------------------------------------------- */

zpp_status zpp_device_driver_used(const zpp_device *d, size_t *used_p) {
    ZPP_CHECK(check_dev(d, "driver_used"));
    if (!used_p)
        return zpp_error(ZPP_ERR_INVALID, "driver_used: used_p is NULL; pass where to store it");
    return d->ops->driver_used(d, used_p);
}

zpp_status zpp_device_alloc(zpp_device *d, size_t bytes, void **p_p) {
    ZPP_CHECK(check_dev(d, "alloc"));
    if (!p_p) return zpp_error(ZPP_ERR_INVALID, "alloc: p_p is NULL; pass where to store the pointer");
    if (d->live_len == d->live_cap) {
        size_t cap = d->live_cap ? 2 * d->live_cap : 64;
        zpp_device_alloc_rec *l = realloc(d->live, cap * sizeof *l);
        if (!l) return zpp_error(ZPP_ERR_NOMEM, "alloc: out of host memory for the bookkeeping");
        d->live = l;
        d->live_cap = cap;
    }
    void *p = NULL;
    ZPP_CHECK(d->ops->alloc(d, bytes, &p));
    d->live[d->live_len].p = p;
    d->live[d->live_len].bytes = bytes;
    d->live_len++;
    d->mem_now += bytes;
    if (d->mem_now > d->mem_peak) d->mem_peak = d->mem_now;
    *p_p = p;
    return ZPP_OK;
}

void zpp_device_free(zpp_device *d, void *p) {
    if (!d || !d->ops || !p) return;
    /* Newest first: the scratch pool and the engine free what they
     * allocated last most often. */
    for (size_t i = d->live_len; i-- > 0;) {
        if (d->live[i].p != p) continue;
        d->mem_now -= d->live[i].bytes;
        d->live[i] = d->live[--d->live_len];
        d->ops->free(d, p);
        return;
    }
    /* Not ours: leave it alone rather than free a foreign pointer. */
}

zpp_status zpp_device_copy(zpp_device *d, void *dst, const void *src, size_t bytes) {
    ZPP_CHECK(check_dev(d, "copy"));
    if (bytes && (!dst || !src))
        return zpp_error(ZPP_ERR_INVALID, "copy: %s is NULL but %zu bytes were asked for",
                         dst ? "the source" : "the destination", bytes);
    if (bytes == 0) return ZPP_OK;
    return d->ops->copy(d, dst, src, bytes);
}

zpp_status zpp_device_copy_on(zpp_device *d, void *dst, const void *src, size_t bytes,
                              void *stream) {
    ZPP_CHECK(check_dev(d, "copy_on"));
    if (bytes && (!dst || !src))
        return zpp_error(ZPP_ERR_INVALID, "copy_on: %s is NULL but %zu bytes were asked for",
                         dst ? "the source" : "the destination", bytes);
    if (bytes == 0 || dst == src) return ZPP_OK;
    const char *a = dst, *b = src;
    if (a < b + bytes && b < a + bytes)
        return zpp_error(ZPP_ERR_INVALID,
                         "copy_on: the %zu-byte source and destination overlap; copy through "
                         "a buffer of its own",
                         bytes);
    return d->ops->copy_on(d, dst, src, bytes, stream);
}

zpp_status zpp_device_set(zpp_device *d, void *p, int value, size_t bytes) {
    ZPP_CHECK(check_dev(d, "set"));
    if (bytes && !p)
        return zpp_error(ZPP_ERR_INVALID, "set: the buffer is NULL but %zu bytes were asked for",
                         bytes);
    if (bytes == 0) return ZPP_OK;
    return d->ops->set(d, p, value, bytes);
}

/* ---- Scratch ------------------------------------------------------------------
 * Best fit keeps big buffers for big requests. When nothing free fits, the
 * largest free buffer is replaced (freed, then a new one of the asked size
 * allocated) instead of adding one: the pool then never holds more buffers
 * than were busy at once, and a free buffer too small to serve anyone does
 * not linger. Freeing first keeps the peak down; on a GPU cudaFree waits
 * for the work in flight that may still read the old buffer. */
zpp_status zpp_device_scratch_get(zpp_device *d, size_t bytes, void **p_p) {
    ZPP_CHECK(check_dev(d, "scratch"));
    if (!p_p) return zpp_error(ZPP_ERR_INVALID, "scratch: p_p is NULL; pass where to store the pointer");
    long fit = -1, any = -1;
    for (size_t i = 0; i < d->pool_len; i++) {
        const zpp_device_buf *b = &d->pool[i];
        if (b->busy) continue;
        if (b->cap >= bytes && (fit < 0 || b->cap < d->pool[fit].cap)) fit = (long)i;
        if (any < 0 || b->cap > d->pool[any].cap) any = (long)i;
    }
    if (fit < 0 && any >= 0) {
        zpp_device_buf *b = &d->pool[any];
        zpp_device_free(d, b->p);
        void *p = NULL;
        zpp_status st = zpp_device_alloc(d, bytes, &p);
        if (st != ZPP_OK) {
            d->pool[any] = d->pool[--d->pool_len]; /* the old one is gone */
            return zpp_error_context(st, "scratch: %zu bytes", bytes);
        }
        b->p = p;
        b->cap = bytes;
        fit = any;
    }
    if (fit < 0) {
        if (d->pool_len == d->pool_cap) {
            size_t cap = d->pool_cap ? 2 * d->pool_cap : 8;
            zpp_device_buf *np = realloc(d->pool, cap * sizeof *np);
            if (!np) return zpp_error(ZPP_ERR_NOMEM, "scratch: out of host memory for the pool");
            d->pool = np;
            d->pool_cap = cap;
        }
        void *p = NULL;
        zpp_status st = zpp_device_alloc(d, bytes, &p);
        if (st != ZPP_OK) return zpp_error_context(st, "scratch: %zu bytes", bytes);
        d->pool[d->pool_len].p = p;
        d->pool[d->pool_len].cap = bytes;
        d->pool[d->pool_len].busy = 0;
        fit = (long)d->pool_len++;
    }
    d->pool[fit].busy = 1;
    *p_p = d->pool[fit].p;
    return ZPP_OK;
}

void zpp_device_scratch_put(zpp_device *d, void *p) {
    if (!d || !p) return;
    for (size_t i = 0; i < d->pool_len; i++) {
        if (d->pool[i].p == p) {
            d->pool[i].busy = 0;
            return;
        }
    }
}

void zpp_device_scratch_stats(const zpp_device *d, size_t *buffers_p, size_t *bytes_p) {
    size_t bytes = 0, n = d ? d->pool_len : 0;
    for (size_t i = 0; i < n; i++) bytes += d->pool[i].cap;
    if (buffers_p) *buffers_p = n;
    if (bytes_p) *bytes_p = bytes;
}

void zpp_device_mem_stats(const zpp_device *d, size_t *now_p, size_t *peak_p) {
    if (now_p) *now_p = d ? d->mem_now : 0;
    if (peak_p) *peak_p = d ? d->mem_peak : 0;
}

/* ---- Streams and events ------------------------------------------------------ */

zpp_status zpp_device_sync(zpp_device *d, void *stream) {
    ZPP_CHECK(check_dev(d, "sync"));
    return d->ops->sync(d, stream);
}

zpp_status zpp_device_stream_create(zpp_device *d, void **stream_p) {
    ZPP_CHECK(check_dev(d, "stream create"));
    if (!stream_p) return zpp_error(ZPP_ERR_INVALID, "stream create: stream_p is NULL");
    return d->ops->stream_create(d, stream_p);
}

void zpp_device_stream_destroy(zpp_device *d, void *stream) {
    if (d && d->ops && stream) d->ops->stream_destroy(d, stream);
}

zpp_status zpp_device_event_create(zpp_device *d, int timing, zpp_device_event **ev_p) {
    ZPP_CHECK(check_dev(d, "event create"));
    if (!ev_p) return zpp_error(ZPP_ERR_INVALID, "event create: ev_p is NULL");
    return d->ops->event_create(d, timing, ev_p);
}

void zpp_device_event_destroy(zpp_device *d, zpp_device_event *ev) {
    if (d && d->ops && ev) d->ops->event_destroy(d, ev);
}

zpp_status zpp_device_event_record(zpp_device *d, zpp_device_event *ev, void *stream) {
    ZPP_CHECK(check_dev(d, "event record"));
    if (!ev) return zpp_error(ZPP_ERR_INVALID, "event record: the event is NULL");
    return d->ops->event_record(d, ev, stream);
}

zpp_status zpp_device_event_wait(zpp_device *d, void *stream, zpp_device_event *ev) {
    ZPP_CHECK(check_dev(d, "event wait"));
    if (!ev) return zpp_error(ZPP_ERR_INVALID, "event wait: the event is NULL");
    /* The compute stream waiting for another stream's work: a stall, timed
     * while a profile window is open (see Profiling, below). */
    const int timed = prof_open(d) && !stream_is_caller(d) && (!stream || stream == d->stream);
    if (timed) prof_mark(d);
    zpp_status st = d->ops->event_wait(d, stream, ev);
    if (timed) prof_mark(d);
    return st;
}

zpp_status zpp_device_bind_thread(zpp_device *d) {
    ZPP_CHECK(check_dev(d, "bind thread"));
    return d->ops->bind_thread(d);
}

zpp_status zpp_device_event_query(zpp_device *d, zpp_device_event *ev, int *done_p) {
    ZPP_CHECK(check_dev(d, "event query"));
    if (!ev || !done_p)
        return zpp_error(ZPP_ERR_INVALID, "event query: the event and done_p are required");
    return d->ops->event_query(d, ev, done_p);
}

zpp_status zpp_device_event_elapsed_ms(zpp_device *d, zpp_device_event *start,
                                       zpp_device_event *end, float *ms_p) {
    ZPP_CHECK(check_dev(d, "event elapsed"));
    if (!start || !end || !ms_p)
        return zpp_error(ZPP_ERR_INVALID,
                         "event elapsed: the start and end events and ms_p are required");
    return d->ops->event_elapsed_ms(d, start, end, ms_p);
}

/* ---- Profiling (device.h) -------------------------------------------------------
 * A window is a list of timing events recorded on the compute stream: [0]
 * its start, then a pair (before, after) per wait timed, and last its end.
 * The events are made on first use and kept, so once a first window has
 * run, the next ones (a step each) create none. */
struct zpp_device_prof {
    zpp_device_event **ev;
    size_t used, cap;
    int open;
    int in_host_wait;    /* between host_wait_begin and _end */
    zpp_status failed;   /* a mark could not be recorded: the window is spoiled */
    char why[512];
};

/* The host backend runs its work on the calling thread: that thread is its
 * compute stream, and its event waits never wait. */
static int stream_is_caller(const zpp_device *d) { return d->mem == ZPP_MEM_HOST; }

static int prof_open(const zpp_device *d) { return d->prof && d->prof->open; }

static void prof_spoil(zpp_device_prof *p, zpp_status st, const char *why) {
    if (p->failed != ZPP_OK) return;
    p->failed = st;
    snprintf(p->why, sizeof p->why, "%s", why);
}

/* Records the next timing event of the window on the compute stream. */
static void prof_mark(zpp_device *d) {
    zpp_device_prof *p = d->prof;
    if (p->failed != ZPP_OK) return;
    if (p->used == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        zpp_device_event **ev = realloc(p->ev, cap * sizeof *ev);
        if (!ev) {
            prof_spoil(p, ZPP_ERR_NOMEM, "out of host memory for timing events");
            return;
        }
        memset(ev + p->cap, 0, (cap - p->cap) * sizeof *ev);
        p->ev = ev;
        p->cap = cap;
    }
    zpp_status st = ZPP_OK;
    if (!p->ev[p->used]) st = d->ops->event_create(d, 1, &p->ev[p->used]);
    if (st == ZPP_OK) st = d->ops->event_record(d, p->ev[p->used], NULL);
    if (st != ZPP_OK) {
        prof_spoil(p, st, zpp_last_error());
        return;
    }
    p->used++;
}

static void prof_free(zpp_device *d) {
    zpp_device_prof *p = d->prof;
    for (size_t i = 0; i < p->cap; i++)
        if (p->ev[i]) d->ops->event_destroy(d, p->ev[i]);
    free(p->ev);
    free(p);
    d->prof = NULL;
}

zpp_status zpp_device_profile_begin(zpp_device *d) {
    ZPP_CHECK(check_dev(d, "profile"));
    if (!d->prof) {
        d->prof = calloc(1, sizeof *d->prof);
        if (!d->prof) return zpp_error(ZPP_ERR_NOMEM, "profile: out of host memory");
    }
    zpp_device_prof *p = d->prof;
    p->used = 0;
    p->in_host_wait = 0;
    p->failed = ZPP_OK;
    p->open = 1;
    prof_mark(d);
    if (p->failed != ZPP_OK) {
        p->open = 0;
        return zpp_error(p->failed, "profile: the start of the window: %s", p->why);
    }
    return ZPP_OK;
}

zpp_status zpp_device_profile_end(zpp_device *d, zpp_device_profile *profile_p) {
    ZPP_CHECK(check_dev(d, "profile"));
    if (!profile_p) return zpp_error(ZPP_ERR_INVALID, "profile end: profile_p is NULL");
    zpp_device_prof *p = d->prof;
    if (!p || !p->open)
        return zpp_error(ZPP_ERR_STATE,
                         "profile end: no profile window is open; call zpp_device_profile_begin "
                         "first");
    prof_mark(d);
    p->open = 0;
    if (p->in_host_wait)
        prof_spoil(p, ZPP_ERR_STATE,
                   "a host wait was begun and not ended (zpp_device_host_wait_end)");
    if (p->failed != ZPP_OK)
        return zpp_error(p->failed, "profile: a timing event of the window was lost, so it "
                                    "cannot be summed: %s", p->why);
    /* The events must have passed before their times can be read. */
    ZPP_CHECK(d->ops->sync(d, NULL));
    float ms = 0.0f;
    ZPP_CHECK(d->ops->event_elapsed_ms(d, p->ev[0], p->ev[p->used - 1], &ms));
    zpp_device_profile r = {ms, 0.0, 0};
    for (size_t i = 1; i + 2 < p->used; i += 2) {
        ZPP_CHECK(d->ops->event_elapsed_ms(d, p->ev[i], p->ev[i + 1], &ms));
        r.stalled_ms += ms;
        r.stalls++;
    }
    *profile_p = r;
    return ZPP_OK;
}

void zpp_device_host_wait_begin(zpp_device *d) {
    if (!d || !prof_open(d) || !stream_is_caller(d)) return;
    if (d->prof->in_host_wait)
        prof_spoil(d->prof, ZPP_ERR_STATE,
                   "a host wait was begun inside another (zpp_device_host_wait_begin "
                   "twice)");
    d->prof->in_host_wait = 1;
    prof_mark(d);
}

void zpp_device_host_wait_end(zpp_device *d) {
    if (!d || !prof_open(d) || !stream_is_caller(d)) return;
    if (!d->prof->in_host_wait) {
        prof_spoil(d->prof, ZPP_ERR_STATE,
                   "a host wait was ended that had not begun (zpp_device_host_wait_end "
                   "without _begin)");
        return;
    }
    d->prof->in_host_wait = 0;
    prof_mark(d);
}

/* ---- The non-finite flag ---------------------------------------------------- */

zpp_status zpp_device_nonfinite_take(zpp_device *d, int *raised_p) {
    ZPP_CHECK(check_dev(d, "non-finite flag"));
    if (!raised_p) return zpp_error(ZPP_ERR_INVALID, "non-finite flag: raised_p is NULL");
    int flag = 0;
    /* A copy to host memory waits for the compute stream: every kernel
     * enqueued so far has had its say. */
    ZPP_CHECK(d->ops->copy(d, &flag, d->nonfinite, sizeof flag));
    if (flag) ZPP_CHECK(d->ops->set(d, d->nonfinite, 0, sizeof(int)));
    *raised_p = flag != 0;
    return ZPP_OK;
}

/* ---- Kernels ------------------------------------------------------------------ */

zpp_status zpp_device_quantize_chunks(zpp_device *d, const void *in, zpp_dtype dtype,
                                      size_t n_chunks, size_t chunk_len,
                                      const zpp_quant_spec *spec, void *out) {
    const char *what = "quantize";
    size_t n = 0, bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(check_spec(what, spec));
    ZPP_CHECK(check_dtype(what, dtype));
    ZPP_CHECK(checked_mul(what, n_chunks, chunk_len, &n));
    ZPP_CHECK(checked_mul(what, n, zpp_dtype_size(dtype), &bytes));
    ZPP_CHECK(check_ptr(what, in, "the input", n));
    ZPP_CHECK(check_ptr(what, out, "the output", n));
    if (n == 0) return ZPP_OK;
    return d->ops->quantize_chunks(d, in, dtype, n_chunks, chunk_len, spec, out);
}

zpp_status zpp_device_dequantize_chunks(zpp_device *d, const void *q, size_t n_chunks,
                                        size_t chunk_len, const zpp_quant_spec *spec,
                                        zpp_dtype dtype, void *out) {
    const char *what = "dequantize";
    size_t n = 0, bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(check_spec(what, spec));
    ZPP_CHECK(check_dtype(what, dtype));
    ZPP_CHECK(checked_mul(what, n_chunks, chunk_len, &n));
    ZPP_CHECK(checked_mul(what, n, zpp_dtype_size(dtype), &bytes));
    ZPP_CHECK(check_ptr(what, q, "the input", n));
    ZPP_CHECK(check_ptr(what, out, "the output", n));
    if (n == 0) return ZPP_OK;
    return d->ops->dequantize_chunks(d, q, n_chunks, chunk_len, spec, dtype, out);
}

/* The arguments of a reorder-quantize, plain (has_err 0) or with error
 * feedback (err: one float per input element). *n_out_p: the elements
 * written (0: nothing to do). */
static zpp_status reorder_args(const char *what, zpp_device *d, const void *in, zpp_dtype dtype,
                               int has_err, const float *err, size_t chunk_len, size_t first,
                               size_t len, int nodes, int local, const zpp_quant_spec *spec,
                               const void *out, size_t *n_out_p) {
    size_t ranks = 0, n = 0, bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(check_spec(what, spec));
    ZPP_CHECK(check_dtype(what, dtype));
    if (nodes < 1 || local < 1)
        return zpp_error(ZPP_ERR_INVALID, "%s: nodes %d and local %d must both be >= 1", what,
                         nodes, local);
    ZPP_CHECK(check_slab(what, chunk_len, first, len));
    ZPP_CHECK(checked_mul(what, (size_t)nodes, (size_t)local, &ranks));
    ZPP_CHECK(checked_mul(what, ranks, chunk_len, &n));
    ZPP_CHECK(checked_mul(what, n, zpp_dtype_size(dtype), &bytes));
    ZPP_CHECK(check_ptr(what, in, "the input", n));
    if (has_err) ZPP_CHECK(check_ptr(what, err, "the error buffer", n));
    ZPP_CHECK(check_ptr(what, out, "the output", ranks * len));
    *n_out_p = ranks * len;
    return ZPP_OK;
}

zpp_status zpp_device_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                       size_t chunk_len, size_t first, size_t len, int nodes,
                                       int local, const zpp_quant_spec *spec, void *out) {
    size_t n_out = 0;
    ZPP_CHECK(reorder_args("reorder-quantize", d, in, dtype, 0, NULL, chunk_len, first, len, nodes,
                           local, spec, out, &n_out));
    if (n_out == 0) return ZPP_OK;
    return d->ops->reorder_quantize(d, in, dtype, chunk_len, first, len, nodes, local, spec, out);
}

/* The arguments of a dequant-sum-requant, plain (has_err 0) or with error
 * feedback (err: one float per element of the n_chunks whole chunks). */
static zpp_status dsr_args(const char *what, zpp_device *d, const void *in, int k, size_t n_chunks,
                           size_t chunk_len, size_t first, size_t len,
                           const zpp_quant_spec *in_spec, const zpp_quant_spec *out_spec,
                           int has_err, const float *err, const void *out, size_t *n_out_p) {
    size_t whole = 0, n = 0, all = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(check_spec(what, in_spec));
    ZPP_CHECK(check_spec(what, out_spec));
    if (k < 1)
        return zpp_error(ZPP_ERR_INVALID, "%s: k = %d inputs; need at least 1", what, k);
    ZPP_CHECK(check_slab(what, chunk_len, first, len));
    /* chunk_len places elements in the random stream: chunks * chunk_len
     * must be a valid index even though only the slabs are touched. */
    ZPP_CHECK(checked_mul(what, n_chunks, chunk_len, &whole));
    ZPP_CHECK(checked_mul(what, n_chunks, len, &n));
    ZPP_CHECK(checked_mul(what, n, (size_t)k, &all));
    ZPP_CHECK(check_ptr(what, in, "the input", all));
    if (has_err) ZPP_CHECK(check_ptr(what, err, "the error buffer", whole));
    ZPP_CHECK(check_ptr(what, out, "the output", n));
    *n_out_p = n;
    return ZPP_OK;
}

zpp_status zpp_device_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                          size_t n_chunks, size_t chunk_len, size_t first,
                                          size_t len, const zpp_quant_spec *in_spec,
                                          const zpp_quant_spec *out_spec, void *out) {
    size_t n = 0;
    ZPP_CHECK(dsr_args("dequant-sum-requant", d, in, k, n_chunks, chunk_len, first, len, in_spec,
                       out_spec, 0, NULL, out, &n));
    if (n == 0) return ZPP_OK;
    return d->ops->dequant_sum_requant(d, in, k, n_chunks, chunk_len, first, len, in_spec,
                                       out_spec, out);
}

static zpp_status check_beta(const char *what, float beta) {
    if (!(beta >= 0.0f && beta <= 1.0f))
        return zpp_error(ZPP_ERR_INVALID, "%s: err_beta %g is outside [0, 1]", what,
                         (double)beta);
    return ZPP_OK;
}

zpp_status zpp_device_ef_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                          float *err, float beta, size_t chunk_len,
                                          size_t first, size_t len, int nodes, int local,
                                          const zpp_quant_spec *spec, void *out) {
    const char *what = "error-feedback reorder-quantize";
    size_t n_out = 0;
    ZPP_CHECK(reorder_args(what, d, in, dtype, 1, err, chunk_len, first, len, nodes, local, spec,
                           out, &n_out));
    ZPP_CHECK(check_beta(what, beta));
    if (n_out == 0) return ZPP_OK;
    return d->ops->ef_reorder_quantize(d, in, dtype, err, beta, chunk_len, first, len, nodes,
                                       local, spec, out);
}

zpp_status zpp_device_ef_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                             size_t n_chunks, size_t chunk_len, size_t first,
                                             size_t len, const zpp_quant_spec *in_spec,
                                             const zpp_quant_spec *out_spec, float *err,
                                             float beta, void *out) {
    const char *what = "error-feedback dequant-sum-requant";
    size_t n = 0;
    ZPP_CHECK(dsr_args(what, d, in, k, n_chunks, chunk_len, first, len, in_spec, out_spec, 1, err,
                       out, &n));
    ZPP_CHECK(check_beta(what, beta));
    if (n == 0) return ZPP_OK;
    return d->ops->ef_dequant_sum_requant(d, in, k, n_chunks, chunk_len, first, len, in_spec,
                                          out_spec, err, beta, out);
}

zpp_status zpp_device_dequant_reduce(zpp_device *d, const void *q, size_t n_chunks,
                                     size_t stride, size_t chunk_len, const zpp_quant_spec *spec,
                                     const float *exact, float scale, float *out) {
    const char *what = "dequant-reduce";
    size_t n = 0, bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(check_spec(what, spec));
    ZPP_CHECK(checked_mul(what, n_chunks, chunk_len, &n));
    ZPP_CHECK(checked_mul(what, chunk_len, sizeof(float), &bytes));
    ZPP_CHECK(check_ptr(what, q, "the input", n));
    ZPP_CHECK(check_ptr(what, out, "the output", chunk_len));
    const size_t qb = zpp_quant_bytes(chunk_len, spec);
    if (stride == 0) stride = qb;
    if (n_chunks > 1 && (stride < qb || stride % 16))
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: inputs %zu bytes apart: need a multiple of 16 of at least %zu, "
                         "the bytes of one", what, stride, qb);
    if (chunk_len == 0) return ZPP_OK;
    return d->ops->dequant_reduce(d, q, n_chunks, stride, chunk_len, spec, exact, scale, out);
}

zpp_status zpp_device_convert(zpp_device *d, const void *in, zpp_dtype in_dtype, void *out,
                              zpp_dtype out_dtype, size_t n, float scale) {
    const char *what = "convert";
    size_t bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(check_dtype(what, in_dtype));
    ZPP_CHECK(check_dtype(what, out_dtype));
    ZPP_CHECK(checked_mul(what, n, sizeof(float), &bytes));
    ZPP_CHECK(check_ptr(what, in, "the input", n));
    ZPP_CHECK(check_ptr(what, out, "the output", n));
    if (in == out && in_dtype != out_dtype && n > 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: in-place conversion from %s to %s; use separate buffers", what,
                         zpp_dtype_name(in_dtype), zpp_dtype_name(out_dtype));
    if (n == 0) return ZPP_OK;
    return d->ops->convert(d, in, in_dtype, out, out_dtype, n, scale);
}

zpp_status zpp_device_add(zpp_device *d, float *acc, const float *x, size_t n) {
    const char *what = "add";
    size_t bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(checked_mul(what, n, sizeof(float), &bytes));
    ZPP_CHECK(check_ptr(what, acc, "the accumulator", n));
    ZPP_CHECK(check_ptr(what, x, "the input", n));
    if (n == 0) return ZPP_OK;
    return d->ops->add(d, acc, x, n);
}

zpp_status zpp_device_sumsq(zpp_device *d, const float *x, size_t n, double *sum_p) {
    if (!sum_p) return zpp_error(ZPP_ERR_INVALID, "sum of squares: sum_p is NULL");
    const void *xv = x;
    return zpp_device_sumsq_many(d, &xv, &n, 1, ZPP_FP32, sum_p);
}

zpp_status zpp_device_sumsq_many(zpp_device *d, const void *const *x, const size_t *n, int k,
                                 zpp_dtype dt, double *sums) {
    const char *what = "sum of squares";
    ZPP_CHECK(check_dev(d, what));
    if (k < 0 || (k && (!x || !n || !sums)))
        return zpp_error(ZPP_ERR_INVALID, "%s: %d arrays; pass k >= 0 and x, n, sums for them",
                         what, k);
    ZPP_CHECK(check_dtype(what, dt));
    int work = 0;
    for (int j = 0; j < k; j++) {
        size_t bytes = 0;
        ZPP_CHECK(checked_mul(what, n[j], zpp_dtype_size(dt), &bytes));
        ZPP_CHECK(check_ptr(what, x[j], "the input", n[j]));
        sums[j] = 0.0;
        work |= n[j] != 0;
    }
    if (!work) return ZPP_OK;
    return d->ops->sumsq(d, x, n, k, dt, sums);
}

zpp_status zpp_device_adamw(zpp_device *d, float *param, float *m, float *v, void *grad,
                            size_t n, const zpp_adamw_args *a, void *work,
                            zpp_dtype work_dtype) {
    const char *what = "AdamW";
    size_t bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    if (!a) return zpp_error(ZPP_ERR_INVALID, "%s: the arguments (zpp_adamw_args) are NULL", what);
    if (a->step < 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: step %d; steps count from 1 (bias correction divides by "
                         "1 - beta^step)",
                         what, a->step);
    ZPP_CHECK(checked_mul(what, n, sizeof(float), &bytes));
    if (a->master_lo) {
        /* the split master: work holds its bf16 halves, param nothing */
        if (param || !work || work_dtype != ZPP_BF16)
            return zpp_error(ZPP_ERR_INVALID,
                             "%s: a split master (master_lo) lives in master_lo and a bf16 "
                             "working copy, with no fp32 parameters; pass param NULL and work "
                             "in bf16",
                             what);
    } else {
        ZPP_CHECK(check_ptr(what, param, "the parameters", n));
    }
    ZPP_CHECK(check_ptr(what, m, "the first moment", n));
    ZPP_CHECK(check_ptr(what, v, "the second moment", n));
    ZPP_CHECK(check_ptr(what, grad, "the gradient", n));
    if (work) ZPP_CHECK(check_dtype(what, work_dtype));
    ZPP_CHECK(check_dtype("AdamW: grad_dtype", a->grad_dtype));
    if (a->n_decay < 0 || a->n_decay > ZPP_ADAMW_RANGES)
        return zpp_error(ZPP_ERR_INVALID, "%s: %d weight-decay ranges; 0 to %d", what,
                         a->n_decay, ZPP_ADAMW_RANGES);
    for (int k = 0; k < a->n_decay; k++)
        if (a->decay_lo[k] > a->decay_hi[k] || a->decay_hi[k] > n ||
            (k > 0 && a->decay_lo[k] < a->decay_hi[k - 1]))
            return zpp_error(ZPP_ERR_INVALID,
                             "%s: weight-decay range %d [%zu, %zu) is not inside the %zu "
                             "elements, ascending and apart from the one before",
                             what, k, a->decay_lo[k], a->decay_hi[k], n);
    if (n == 0) return ZPP_OK;
    return d->ops->adamw(d, param, m, v, grad, n, a, work, work_dtype);
}

zpp_status zpp_device_master_split(zpp_device *d, const float *x, uint16_t *hi, uint16_t *lo,
                                   size_t n) {
    const char *what = "master split";
    size_t bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(checked_mul(what, n, sizeof(float), &bytes));
    ZPP_CHECK(check_ptr(what, x, "the masters", n));
    ZPP_CHECK(check_ptr(what, hi, "the high halves", n));
    if (n == 0) return ZPP_OK;
    return d->ops->master_split(d, x, hi, lo, n);
}

zpp_status zpp_device_master_join(zpp_device *d, const uint16_t *hi, const uint16_t *lo,
                                  float *x, size_t n) {
    const char *what = "master join";
    size_t bytes = 0;
    ZPP_CHECK(check_dev(d, what));
    ZPP_CHECK(checked_mul(what, n, sizeof(float), &bytes));
    ZPP_CHECK(check_ptr(what, hi, "the high halves", n));
    ZPP_CHECK(check_ptr(what, lo, "the low halves", n));
    ZPP_CHECK(check_ptr(what, x, "the masters", n));
    if (n == 0) return ZPP_OK;
    return d->ops->master_join(d, hi, lo, x, n);
}
