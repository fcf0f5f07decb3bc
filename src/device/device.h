/* device/device.h — the compute backend, the mirror of comm/comm.h.
 *
 * A zpp_device is where a rank's tensors live and runs the work on them:
 * memory, a compute stream and more streams, events, one scratch allocator,
 * the non-finite flag, and the kernels the layers above need (the
 * quantization family, dtype conversion, sums, AdamW). It is a table of
 * functions implemented twice, for the host (C loops, OpenMP where it pays)
 * and for CUDA; nothing above device/ and comm/ knows which one runs, and
 * nothing above them calls CUDA or carries #ifdef ZPP_HAVE_CUDA.
 *
 * Every zpp_device_* function below is a front (device.c) that checks its
 * arguments once, with one message per mistake, and then dispatches to
 * d->ops. A backend may assume its arguments were checked.
 *
 * Ordering. Work is enqueued on the device's compute stream in call order
 * (on the host it simply runs). A copy whose destination is host memory
 * returns once the data is there, and one whose source is host memory once
 * the source has been read (the caller may free it); every other operation
 * may return before it has run. Other streams (the NCCL backend's) order against the compute
 * stream with events.
 *
 * Non-finite values. A quantizing kernel that meets NaN or Inf in a block
 * stores a NaN scale and a zero payload (the wire rule, zeropp.h), raises
 * the device's non-finite flag and returns ZPP_OK, on both backends alike.
 * One owner reads the flag: the engine, once per optimizer step, through
 * zpp_device_nonfinite_take.
 *
 * Adding a backend (ROCm, say): implement zpp_device_ops in
 * device_<name>.c (+ its kernels), give it a create function, and teach
 * zpp_device_create_gpu to pick it. */
#ifndef ZPP_DEVICE_DEVICE_H
#define ZPP_DEVICE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

typedef enum zpp_mem_kind { ZPP_MEM_HOST = 0, ZPP_MEM_DEVICE = 1 } zpp_mem_kind;

typedef struct zpp_device zpp_device;
typedef struct zpp_device_event zpp_device_event;
typedef struct zpp_device_prof zpp_device_prof; /* a profile window (device.c) */

/* AdamW with decoupled weight decay (Loshchilov & Hutter), per element:
 *   g = grad_scale * grad
 *   m = b1 m + (1 - b1) g          v = b2 v + (1 - b2) g^2
 *   p = p - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * p )
 * then work[i] = (work_dtype) p[i], the next working copy of the shard: in
 * bf16 rounded as zpp_split_hi (core/dtype.h: nearest, ties away from
 * zero), the rounding the engine gives every master, in fp16 to nearest
 * even.
 * With master_lo set, the master is stored split (zpp_split_hi/lo): p is
 * read from work (bf16) and master_lo, and both are written back; param is
 * NULL. That moves 4 bytes of master an element each way instead of 4
 * read and 6 written. */
enum { ZPP_ADAMW_RANGES = 8 }; /* decay ranges one AdamW call takes */
typedef struct zpp_adamw_args {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; /* clipping coefficient, applied to g first */
    int step;         /* 1-based, for bias correction */
    /* The dtype of the gradient array: ZPP_FP32 (0, so zero-initialised
     * args keep fp32), ZPP_BF16 or ZPP_FP16 (an accumulator in the working
     * dtype, 2 bytes an element less). g is the value widened to fp32,
     * which is exact, so the arithmetic is fp32's. */
    zpp_dtype grad_dtype;
    /* 1: grad[i] = 0 (of grad_dtype) once read, so the accumulator is
     * ready for the next step's sums in the same pass over memory (the
     * line is already in cache: the zeroing costs no read, and no pass of
     * its own). */
    int clear_grad;
    /* Where weight_decay applies: n_decay = 0, every element; otherwise
     * only elements [decay_lo[k], decay_hi[k]) of the call, k < n_decay
     * (ascending, disjoint), the others taking 0 (the same arithmetic, so
     * one call gives the bits of one call per piece). Lets the engine
     * update a whole unit, whose matrices decay and whose biases and
     * norms do not, in one launch. */
    int n_decay;
    size_t decay_lo[ZPP_ADAMW_RANGES], decay_hi[ZPP_ADAMW_RANGES];
    uint16_t *master_lo; /* the split master's low halves, or NULL (above) */
} zpp_adamw_args;

/* The weight decay of element i of a call (n_decay above). By value and
 * over a constant count: in a kernel the ranges stay where the parameters
 * are (an address or a variable index would copy them to local memory). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline float zpp_adamw_decay_at(zpp_adamw_args a, size_t i) {
    if (a.n_decay == 0) return a.weight_decay;
    float wd = 0.0f;
    for (int k = 0; k < ZPP_ADAMW_RANGES; k++)
        if (k < a.n_decay && i >= a.decay_lo[k] && i < a.decay_hi[k]) wd = a.weight_decay;
    return wd;
}

/* The backend table. Streams are the backend's native handles (a
 * cudaStream_t on CUDA, NULL on the host); NULL means the compute stream. */
typedef struct zpp_device_ops {
    const char *name; /* "host" or "cuda" */
    zpp_status (*alloc)(zpp_device *d, size_t bytes, void **p_p);
    void (*free)(zpp_device *d, void *p);
    zpp_status (*copy)(zpp_device *d, void *dst, const void *src, size_t bytes);
    zpp_status (*copy_on)(zpp_device *d, void *dst, const void *src, size_t bytes,
                          void *stream);
    zpp_status (*set)(zpp_device *d, void *p, int value, size_t bytes);
    zpp_status (*sync)(zpp_device *d, void *stream);
    zpp_status (*device_name)(const zpp_device *d, char *buf, size_t cap);
    zpp_status (*driver_used)(const zpp_device *d, size_t *used_p);
    zpp_status (*stream_create)(zpp_device *d, void **stream_p);
    void (*stream_destroy)(zpp_device *d, void *stream);
    zpp_status (*event_create)(zpp_device *d, int timing, zpp_device_event **ev_p);
    void (*event_destroy)(zpp_device *d, zpp_device_event *ev);
    zpp_status (*event_record)(zpp_device *d, zpp_device_event *ev, void *stream);
    zpp_status (*event_wait)(zpp_device *d, void *stream, zpp_device_event *ev);
    zpp_status (*event_query)(zpp_device *d, zpp_device_event *ev, int *done_p);
    zpp_status (*bind_thread)(zpp_device *d);
    zpp_status (*event_elapsed_ms)(zpp_device *d, zpp_device_event *start,
                                   zpp_device_event *end, float *ms_p);
    /* kernels: see the fronts below for their meaning */
    zpp_status (*quantize_chunks)(zpp_device *d, const void *in, zpp_dtype dtype,
                                  size_t n_chunks, size_t chunk_len, const zpp_quant_spec *spec,
                                  void *out);
    zpp_status (*dequantize_chunks)(zpp_device *d, const void *q, size_t n_chunks,
                                    size_t chunk_len, const zpp_quant_spec *spec,
                                    zpp_dtype dtype, void *out);
    zpp_status (*reorder_quantize)(zpp_device *d, const void *in, zpp_dtype dtype,
                                   size_t chunk_len, size_t first, size_t len, int nodes,
                                   int local, const zpp_quant_spec *spec, void *out);
    zpp_status (*dequant_sum_requant)(zpp_device *d, const void *in, int k, size_t n_chunks,
                                      size_t chunk_len, size_t first, size_t len,
                                      const zpp_quant_spec *in_spec,
                                      const zpp_quant_spec *out_spec, void *out);
    zpp_status (*ef_reorder_quantize)(zpp_device *d, const void *in, zpp_dtype dtype,
                                      float *err, float beta, size_t chunk_len, size_t first,
                                      size_t len, int nodes, int local,
                                      const zpp_quant_spec *spec, void *out);
    zpp_status (*ef_dequant_sum_requant)(zpp_device *d, const void *in, int k, size_t n_chunks,
                                         size_t chunk_len, size_t first, size_t len,
                                         const zpp_quant_spec *in_spec,
                                         const zpp_quant_spec *out_spec, float *err,
                                         float beta, void *out);
    zpp_status (*dequant_reduce)(zpp_device *d, const void *q, size_t n_chunks, size_t stride,
                                 size_t chunk_len, const zpp_quant_spec *spec, const float *exact,
                                 float scale, float *out);
    zpp_status (*convert)(zpp_device *d, const void *in, zpp_dtype in_dtype, void *out,
                          zpp_dtype out_dtype, size_t n, float scale);
    zpp_status (*add)(zpp_device *d, float *acc, const float *x, size_t n);
    zpp_status (*sumsq)(zpp_device *d, const void *const *x, const size_t *n, int k,
                        zpp_dtype dt, double *sums);
    zpp_status (*adamw)(zpp_device *d, float *param, float *m, float *v, void *grad,
                        size_t n, const zpp_adamw_args *a, void *work, zpp_dtype work_dtype);
    zpp_status (*master_split)(zpp_device *d, const float *x, uint16_t *hi, uint16_t *lo,
                               size_t n);
    zpp_status (*master_join)(zpp_device *d, const uint16_t *hi, const uint16_t *lo, float *x,
                              size_t n);
    void (*destroy)(zpp_device *d);
} zpp_device_ops;

/* One scratch buffer of the pool. */
typedef struct zpp_device_buf {
    void *p;
    size_t cap;
    int busy;
} zpp_device_buf;

/* One live allocation, so zpp_device_free knows how many bytes it returns
 * (cudaFree does not say). */
typedef struct zpp_device_alloc_rec {
    void *p;
    size_t bytes;
} zpp_device_alloc_rec;

struct zpp_device {
    const zpp_device_ops *ops;
    zpp_mem_kind mem; /* where this device's tensors live */
    int ordinal;      /* the GPU's index; -1 on the host */
    void *stream;     /* the compute stream (native handle; NULL on the host) */
    int *nonfinite;   /* the flag, in this device's memory */
    /* the scratch pool (device.c) */
    zpp_device_buf *pool;
    size_t pool_len, pool_cap;
    /* bytes allocated through this device, now and at most, and the live
     * allocations behind mem_now (device.c) */
    size_t mem_now, mem_peak;
    zpp_device_alloc_rec *live;
    size_t live_len, live_cap;
    zpp_device_prof *prof; /* the profile window; NULL until the first one (device.c) */
    void *impl;       /* backend state */
};

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Creating one ------------------------------------------------------- */
/* The host backend: tensors in host memory, work on the calling thread. */
zpp_status zpp_device_create_host(zpp_device **d_p);
/* A GPU backend on GPU `ordinal` (made current for the calling thread),
 * with a new compute stream. ZPP_ERR_UNSUPPORTED in a build without CUDA,
 * ZPP_ERR_CUDA when the GPU cannot be opened. */
zpp_status zpp_device_create_gpu(int ordinal, zpp_device **d_p);
/* GPUs this process sees (0 in a build without CUDA). */
int zpp_device_gpu_count(void);
/* The PCI bus id of GPU `ordinal` ("0000:1b:00.0", lower case) into buf,
 * NUL-terminated: two processes on one host see one GPU when their ids are
 * equal, whatever CUDA_VISIBLE_DEVICES numbers it (the NCCL backend uses it
 * to find ranks sharing a GPU). ZPP_ERR_UNSUPPORTED in a build without
 * CUDA, ZPP_ERR_CUDA for a GPU CUDA cannot name, ZPP_ERR_INVALID when buf
 * is NULL or cannot hold the id. */
zpp_status zpp_device_gpu_bus_id(int ordinal, char *buf, size_t cap);
/* What the GPU backend was built with, for `zeropp --version`: "CUDA 12.4
 * runtime, architectures 80,90" (the CUDA architectures CMake compiled the
 * kernels for); NULL in a build without CUDA. Touches no GPU. */
const char *zpp_device_cuda_build(void);
/* Frees the scratch pool, the flag and the streams; NULL is ignored. */
void zpp_device_destroy(zpp_device *d);
/* The device's name for people, NUL-terminated in buf (cut to cap - 1
 * bytes): "host" on the host, the GPU's product name on CUDA ("NVIDIA
 * H200"). */
zpp_status zpp_device_name(const zpp_device *d, char *buf, size_t cap);

/* ---- Memory ------------------------------------------------------------ */
/* `bytes` of this device's memory (0 gives a valid unique pointer); host
 * memory is 64-byte aligned. Counted in mem_now / mem_peak. */
zpp_status zpp_device_alloc(zpp_device *d, size_t bytes, void **p_p);
void zpp_device_free(zpp_device *d, void *p);
/* Stream-ordered copy between any two of: this device's memory, host
 * memory. Returns after the data is there when dst is host memory, and
 * after the source has been read when src is. */
zpp_status zpp_device_copy(zpp_device *d, void *dst, const void *src, size_t bytes);
/* A copy within this device's memory, enqueued on `stream` (NULL: the
 * compute stream); returns at once on a GPU. The buffers may not overlap
 * unless dst == src (then nothing is enqueued). */
zpp_status zpp_device_copy_on(zpp_device *d, void *dst, const void *src, size_t bytes,
                              void *stream);
zpp_status zpp_device_set(zpp_device *d, void *p, int value, size_t bytes);

/* ---- Scratch: one pool for every layer ------------------------------------
 * Leases a buffer of at least `bytes` (the smallest free one that fits;
 * when none fits, the largest free one is replaced by a new one, so the
 * pool holds no more buffers than were ever busy at once). A buffer handed
 * back may still be read by work in flight on the compute stream; its next
 * user is enqueued behind that work, so reuse needs no synchronisation. */
zpp_status zpp_device_scratch_get(zpp_device *d, size_t bytes, void **p_p);
void zpp_device_scratch_put(zpp_device *d, void *p); /* NULL is ignored */
/* Buffers and bytes the pool holds now. */
void zpp_device_scratch_stats(const zpp_device *d, size_t *buffers_p, size_t *bytes_p);
/* Bytes allocated through this device now and at most since creation. */
void zpp_device_mem_stats(const zpp_device *d, size_t *now_p, size_t *peak_p);
/* The device's memory in use as its driver reports it (CUDA: cudaMemGetInfo,
 * total - free; what nvidia-smi shows): every process on that GPU, and
 * besides what mem_stats counts, the CUDA context, the libraries' loaded
 * kernels and handles, and NCCL's buffers. 0 on the host. */
zpp_status zpp_device_driver_used(const zpp_device *d, size_t *used_p);

/* ---- Streams and events -------------------------------------------------- */
zpp_status zpp_device_sync(zpp_device *d, void *stream); /* NULL: the compute stream */
zpp_status zpp_device_stream_create(zpp_device *d, void **stream_p);
void zpp_device_stream_destroy(zpp_device *d, void *stream);
/* timing 0 makes a lighter event that cannot be timed. */
zpp_status zpp_device_event_create(zpp_device *d, int timing, zpp_device_event **ev_p);
void zpp_device_event_destroy(zpp_device *d, zpp_device_event *ev);
zpp_status zpp_device_event_record(zpp_device *d, zpp_device_event *ev, void *stream);
/* Work enqueued on `stream` after this call runs after `ev`. */
zpp_status zpp_device_event_wait(zpp_device *d, void *stream, zpp_device_event *ev);
/* *done_p = 1 once the work before the event has run. */
zpp_status zpp_device_event_query(zpp_device *d, zpp_device_event *ev, int *done_p);
/* Makes `d` the calling thread's device (cudaSetDevice; nothing on the
 * host), for a helper thread that queries its events (the NCCL backend's
 * watchdog): without it CUDA would start a context on GPU 0 for it. */
zpp_status zpp_device_bind_thread(zpp_device *d);
zpp_status zpp_device_event_elapsed_ms(zpp_device *d, zpp_device_event *start,
                                       zpp_device_event *end, float *ms_p);

/* ---- Profiling: how long the compute stream stood waiting -----------------
 * A profile window (begin .. end) measures the compute stream's time and,
 * of it, the time it stood waiting for work that is not its own: the
 * exposed part of the communication, which the stream could not hide
 * behind kernels.
 *   - A GPU's compute stream waits on events: while a window is open, each
 *     zpp_device_event_wait on the compute stream (on CUDA only the NCCL
 *     backend's, ordering compute after a collective) is bracketed by two
 *     timing events on that stream, and the pair's elapsed time is the
 *     stall. Nothing waits on the host for it.
 *   - The host backend's compute stream is the calling thread, and its
 *     waits for communication (MPI requests) go past the device: the caller
 *     brackets them with zpp_device_host_wait_begin/_end, which time the
 *     thread there. On a GPU they do nothing: the host waiting there does
 *     not stop the stream, and the event waits above are its stalls.
 * Profiling never fails the work it watches: a bracket whose timing event
 * cannot be made or recorded spoils the window, and _end reports it. A
 * window left open (a step that failed) is dropped by the next _begin.
 * Costs: two events recorded per wait, and _end waits for the compute
 * stream (the events must have passed to be read). */
typedef struct zpp_device_profile {
    double total_ms;   /* the window, on the compute stream (host: wall time) */
    double stalled_ms; /* of which the stream stood waiting, summed */
    int stalls;        /* waits timed */
} zpp_device_profile;
zpp_status zpp_device_profile_begin(zpp_device *d);
/* Closes the window, waits for the compute stream and sums. ZPP_ERR_STATE
 * without an open window or with a host wait begun and not ended. */
zpp_status zpp_device_profile_end(zpp_device *d, zpp_device_profile *profile_p);
void zpp_device_host_wait_begin(zpp_device *d);
void zpp_device_host_wait_end(zpp_device *d);

/* ---- The non-finite flag -------------------------------------------------- */
/* Waits for the compute stream, reads the flag into *raised_p and clears it. */
zpp_status zpp_device_nonfinite_take(zpp_device *d, int *raised_p);

/* ---- Kernels ---------------------------------------------------------------
 * "Chunks" are consecutive pieces of chunk_len elements, each quantized as
 * its own tensor (zpp_quant_bytes(chunk_len) bytes, laid end to end): the
 * unit of exchange of the sharded collectives, one chunk per rank.
 *
 * A "slab" is the range [first, first + len) of every chunk: the piece of a
 * collective that one step of a pipeline moves. Each chunk's slab is
 * quantized as its own tensor of len elements, and stochastic rounding
 * still indexes an element by its place in the whole input (chunk *
 * chunk_len + first + i). So a collective cut into slabs at block
 * boundaries computes the same bits as one that is not; with len a multiple
 * of 4 * block, every slab but the last is a whole number of 16-byte words
 * and the slabs' bytes add up to the whole chunk's. */

/* Quantizes n_chunks chunks of `in` into n_chunks quantized chunks. */
zpp_status zpp_device_quantize_chunks(zpp_device *d, const void *in, zpp_dtype dtype,
                                      size_t n_chunks, size_t chunk_len,
                                      const zpp_quant_spec *spec, void *out);
/* Dequantizes n_chunks quantized chunks into n_chunks * chunk_len elements. */
zpp_status zpp_device_dequantize_chunks(zpp_device *d, const void *q, size_t n_chunks,
                                        size_t chunk_len, const zpp_quant_spec *spec,
                                        zpp_dtype dtype, void *out);
/* zpp_quant_reorder_quantize of a slab: `in` holds the whole chunks; `out`
 * receives nodes * local quantized slabs of len elements. first 0 and len
 * chunk_len: the whole chunks. */
zpp_status zpp_device_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                       size_t chunk_len, size_t first, size_t len, int nodes,
                                       int local, const zpp_quant_spec *spec, void *out);
/* zpp_quant_dequant_sum_requant of a slab, with the k inputs laid end to end
 * in `in`, each n_chunks quantized slabs of len elements (input j at
 * j * n_chunks * zpp_quant_bytes(len, in_spec)); chunk_len and first only
 * place the elements in the random stream. */
zpp_status zpp_device_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                          size_t n_chunks, size_t chunk_len, size_t first,
                                          size_t len, const zpp_quant_spec *in_spec,
                                          const zpp_quant_spec *out_spec, void *out);
/* Error feedback (LoCo) for qgZ's two quantizations: the two calls above
 * applied to x = v + err instead of v, followed by
 *   err = beta * err + (1 - beta) * (x - dequantize(q))   (0 if not finite)
 * for every element of the slab (quant/quant_cpu.h; docs/quantization.md,
 * "Error feedback"). `err` is fp32 in this device's memory, in the layout
 * of the input chunks (ef_reorder_quantize: nodes * local * chunk_len
 * elements like `in`; ef_dequant_sum_requant: n_chunks * chunk_len), and
 * beta lies in [0, 1]. */
zpp_status zpp_device_ef_reorder_quantize(zpp_device *d, const void *in, zpp_dtype dtype,
                                          float *err, float beta, size_t chunk_len,
                                          size_t first, size_t len, int nodes, int local,
                                          const zpp_quant_spec *spec, void *out);
zpp_status zpp_device_ef_dequant_sum_requant(zpp_device *d, const void *in, int k,
                                             size_t n_chunks, size_t chunk_len, size_t first,
                                             size_t len, const zpp_quant_spec *in_spec,
                                             const zpp_quant_spec *out_spec, float *err,
                                             float beta, void *out);
/* out[i] = scale * (exact[i] + sum over c < n_chunks of dequantize(chunk c)[i]),
 * i < chunk_len, summed in fp32 from exact (0 when exact is NULL) through the
 * chunks in order: qgZ's sums of quantized inputs, with the input that never
 * crossed a wire added exactly. Chunk c is at q + c * stride bytes (stride 0:
 * zpp_quant_bytes(chunk_len, spec), end to end; else a multiple of 16, at
 * least that). exact is fp32 in this device's memory, and may be out. */
zpp_status zpp_device_dequant_reduce(zpp_device *d, const void *q, size_t n_chunks,
                                     size_t stride, size_t chunk_len, const zpp_quant_spec *spec,
                                     const float *exact, float scale, float *out);
/* out[i] = (out_dtype)(scale * in[i]). in and out may be the same buffer only
 * when the dtypes are equal. */
zpp_status zpp_device_convert(zpp_device *d, const void *in, zpp_dtype in_dtype, void *out,
                              zpp_dtype out_dtype, size_t n, float scale);
/* acc[i] += x[i]. */
zpp_status zpp_device_add(zpp_device *d, float *acc, const float *x, size_t n);
/* Sum of x[i]^2 in double, returned to the host (waits for the stream). */
zpp_status zpp_device_sumsq(zpp_device *d, const float *x, size_t n, double *sum_p);
/* The same for k arrays at once, all of dtype dt (each element widened to
 * fp32, exactly, then squared in double): sums[j] is array j's sum of
 * squares. One wait for the stream in all, not one an array: the host has
 * the next kernels queued while the device works (the optimizer step's
 * norm over every unit, of fp32 masters or of gradients in the working
 * dtype). */
zpp_status zpp_device_sumsq_many(zpp_device *d, const void *const *x, const size_t *n, int k,
                                 zpp_dtype dt, double *sums);
/* AdamW over a shard (zpp_adamw_args), then the working copy: `work`
 * receives the new parameters rounded to work_dtype, or nothing when NULL
 * (the engine then rounds at gather time, keeping no working copy). `grad`
 * holds a->grad_dtype elements. The arrays must not overlap. One pass: 12
 * bytes of parameter and moments read and 12 written an element, the
 * gradient's 4 (fp32) or 2 read, plus the copy's 2 (bf16) and, with
 * clear_grad, the gradient's 4 or 2 written: 34 bytes an element with fp32
 * gradients, 30 with bf16 ones. */
zpp_status zpp_device_adamw(zpp_device *d, float *param, float *m, float *v, void *grad,
                            size_t n, const zpp_adamw_args *a, void *work,
                            zpp_dtype work_dtype);
/* Masters in two halves (core/dtype.h, zpp_split_hi/lo/join), n
 * elements: split writes hi[i] = zpp_split_hi(x[i]) (bf16) and, where lo is
 * not NULL, lo[i] = zpp_split_lo(x[i]); hi alone is how the engine rounds
 * an fp32 master to its bf16 working copy. join writes x[i] =
 * zpp_split_join(hi[i], lo[i]), the fp32 value bit for bit. */
zpp_status zpp_device_master_split(zpp_device *d, const float *x, uint16_t *hi, uint16_t *lo,
                                   size_t n);
zpp_status zpp_device_master_join(zpp_device *d, const uint16_t *hi, const uint16_t *lo,
                                  float *x, size_t n);

#ifdef __cplusplus
}
#endif

#endif
