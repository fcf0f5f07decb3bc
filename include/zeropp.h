/*
 * zeropp.h — the one public header of libzeropp: ZeRO stage 3 sharded
 * data-parallel training with the ZeRO++ communication optimizations
 * (qwZ quantized weights, hpZ hierarchical partitioning, qgZ quantized
 * gradients).
 *
 * Conventions
 *   - C99-compatible; every public name starts with zpp_ / ZPP_.
 *   - Every fallible function returns a zpp_status. ZPP_OK is 0, errors are
 *     negative. On error, zpp_last_error() returns a message (thread-local)
 *     saying what was wrong and what to do; outputs are left untouched
 *     unless the function documents otherwise.
 *   - Handles are opaque; objects are created with *_create / *_open and
 *     freed with *_destroy / *_close.
 *   - Library code never prints on error and never exits.
 *   - Ownership: a function that takes a handle borrows it; only the
 *     handle's own *_destroy frees it. Handles are not thread-safe: use
 *     each from one thread at a time.
 *
 * Contents: status codes; element types; block quantization (the wire
 * layout of a quantized tensor); training a model of your own with ZeRO-3
 * or ZeRO++ (devices, topology, the model interface, the engine).
 * examples/custom_model.c trains a small MLP with it, and docs/library.md
 * says how to build against an installed copy.
 */
#ifndef ZEROPP_H
#define ZEROPP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks what libzeropp.so exports; everything else in it is hidden. */
#if defined(__GNUC__)
#define ZPP_API __attribute__((visibility("default")))
#else
#define ZPP_API
#endif

#define ZPP_VERSION_MAJOR 0
#define ZPP_VERSION_MINOR 1
#define ZPP_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

/* One list, expanded into the enum and into zpp_status_str(). */
#define ZPP_STATUS_LIST(X)                                                    \
    X(OK, 0, "success")                                                      \
    X(ERR_INVALID, -1, "invalid argument")                                   \
    X(ERR_NOMEM, -2, "out of memory")                                        \
    X(ERR_IO, -3, "input/output error")                                      \
    X(ERR_FORMAT, -4, "malformed input")                                     \
    X(ERR_CONFIG, -5, "invalid configuration")                               \
    X(ERR_NONFINITE, -6, "non-finite value (NaN or Inf)")                    \
    X(ERR_UNSUPPORTED, -7, "not supported in this build")                    \
    X(ERR_COMM, -8, "communication failure")                                 \
    X(ERR_CUDA, -9, "CUDA error")                                            \
    X(ERR_STATE, -10, "operation not valid in the current state")           \
    X(ERR_BLAS, -11, "BLAS error")                                          \
    X(ERR_TIMEOUT, -12, "timed out waiting for peer ranks")

typedef enum zpp_status {
#define ZPP_STATUS_ENUM_(name, value, text) ZPP_##name = value,
    ZPP_STATUS_LIST(ZPP_STATUS_ENUM_)
#undef ZPP_STATUS_ENUM_
} zpp_status;

/* Short name of a status ("invalid argument"). Never NULL. */
ZPP_API const char *zpp_status_str(zpp_status status);

/* The message of the last error raised on this thread, with its context
 * ("quantize: block size 12 is not a multiple of 8; use 32, 64, ..."), or ""
 * if none. Valid until the next failing call on this thread. The first
 * failure's message is kept: cleanup after a failure (the engine completing
 * what was in flight, a destroy) leaves it alone, and after a
 * ZPP_ERR_TIMEOUT (fatal for the job) the timeout's message stays for the
 * rest of the thread's life, whatever fails after it. */
ZPP_API const char *zpp_last_error(void);

/* Records a message for zpp_last_error() (printf format) and returns
 * `status`: how a callback of yours reports a failure,
 *     return zpp_error(ZPP_ERR_INVALID, "mlp: batch of %d rows > %d", b, max); */
ZPP_API zpp_status zpp_error(zpp_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* "0.1.0" */
ZPP_API const char *zpp_version(void);

/* ------------------------------------------------------------------------ */
/* Element types                                                             */
/* ------------------------------------------------------------------------ */

typedef enum zpp_dtype {
    ZPP_FP32 = 0,
    ZPP_BF16 = 1,
    ZPP_FP16 = 2
} zpp_dtype;

/* Bytes per element of a dtype (4, 2, 2); 0 for an unknown value. */
ZPP_API size_t zpp_dtype_size(zpp_dtype dtype);
/* "fp32", "bf16", "fp16". */
ZPP_API const char *zpp_dtype_name(zpp_dtype dtype);
/* Parses "fp32" / "bf16" / "fp16". */
ZPP_API zpp_status zpp_dtype_parse(const char *name, zpp_dtype *dtype_p);

/* ------------------------------------------------------------------------ */
/* Block quantization                                                        */
/* ------------------------------------------------------------------------ */
/*
 * Symmetric block-wise quantization. An array of n elements is cut into
 * blocks of `block` consecutive elements (the last block may be shorter).
 * Each block b gets one fp32 scale
 *
 *     scale_b = absmax_b / qmax            qmax = 127 (int8) or 7 (int4)
 *
 * and each element is stored as the integer q = round(x * (qmax / absmax_b))
 * clamped to [-qmax, qmax]; it dequantizes to q * scale_b. Round-to-nearest
 * is round-half-to-even; stochastic rounding (optional) rounds up with
 * probability equal to the fractional part, so E[dequantized] = x.
 * An all-zero block has scale 0 and payload 0.
 *
 * E2M1 (format ZPP_QUANT_E2M1, 4 bits only; qgZ's default): each element is
 * the OCP microscaling FP4 number e in {0, 0.5, 1, 1.5, 2, 3, 4, 6} with a
 * sign (1 sign, 2 exponent, 1 mantissa bit), and
 *
 *     scale_b = absmax_b / 6,   e = round(x / scale_b) on that grid
 *
 * to the nearest value, ties to the even mantissa (stochastic: up to the
 * next value with probability equal to the fraction of the gap). It
 * dequantizes to (2e) * (scale_b / 2), which is e * scale_b rounded once
 * unless scale_b is subnormal. The grid is finer near 0 than int4's (a step
 * of absmax / 12 below absmax / 3, against int4's absmax / 7 everywhere) and
 * coarser near absmax: an element goes to 0 below absmax / 24 instead of
 * absmax / 14, which is what AdamW, whose first steps follow the sign of
 * each gradient element, needs from qgZ (docs/quantization.md).
 *
 * WIRE LAYOUT (bytes that travel between machines; CPU and CUDA both follow
 * it, and it is repeated in DESIGN.md):
 *
 *     offset 0                      payload
 *        int8: n bytes, element i at byte i (two's complement)
 *        int4: ceil(n/2) bytes, element i in byte i/2, low nibble for even
 *              i, high nibble for odd i (two's complement nibble, -7..7);
 *              an odd n leaves the last high nibble 0
 *        e2m1: as int4, each nibble sign-magnitude: bit 3 the sign, bits
 *              0..2 the index of |e| in the grid above (0 encodes as 0000)
 *     payload zero-padded up to a multiple of 16 bytes
 *     offset zpp_quant_scales_offset()   scales
 *        ceil(n/block) little-endian IEEE fp32 values, block order
 *     total zpp_quant_bytes() = scales offset + 4 * ceil(n/block), rounded up
 *        to a multiple of 16 bytes (zero padding)
 *
 * Every quantized buffer therefore starts and ends on a 16-byte boundary, so
 * quantized chunks can be laid end to end and sent as one message.
 *
 * NON-FINITE INPUT: a block containing NaN or +-Inf cannot be scaled. Its
 * scale is stored as NaN and its payload as 0, so the whole block
 * dequantizes to NaN (a NaN never silently becomes a finite number), and the
 * call returns ZPP_ERR_NONFINITE naming the first offending element. All
 * other blocks are quantized normally.
 *
 * Block sizes must be a positive multiple of 8 (so that an int4 block is a
 * whole number of bytes and vector loads stay aligned), at most 1 << 20.
 */

/* Default blocks, measured on 2^22 N(0,1) fp32 values (rel L2 =
 * ||deq - x|| / ||x||; bits/elem include the 4-byte scale per block):
 *
 *     block   int8 rel L2  bits/elem   int4 rel L2  bits/elem
 *        32      0.00534      9.000       0.0970      5.000
 *        64      0.00593      8.500       0.1076      4.500
 *       128      0.00646      8.250       0.1173      4.250
 *       256      0.00696      8.125       0.1262      4.125
 *       512      0.00742      8.062       0.1346      4.062
 *      1024      0.00785      8.031       0.1425      4.031
 *      2048      0.00828      8.016       0.1502      4.016
 *
 * One more bit per element halves the error, so b extra bits are worth an
 * error cut of 1 - 2^-b (8.3% for 0.125 bits). int8: 256 -> 128 buys 7.2%
 * for 0.125 bits and 512 -> 256 buys 6.2% for 0.0625 (4.2% would break
 * even): 256 is the best trade. int4: 128 vs 256 is even (7.1% for 0.125
 * bits); 128 keeps more margin below 0.15 for heavier-tailed gradients. */
#define ZPP_QUANT_DEFAULT_BLOCK_INT8 256
#define ZPP_QUANT_DEFAULT_BLOCK_INT4 128
#define ZPP_QUANT_ALIGN 16

typedef struct zpp_quant_spec {
    int bits;         /* 8 or 4 */
    size_t block;     /* elements per scale; multiple of 8 */
    int stochastic;   /* 0: round half to even; 1: stochastic rounding */
    uint64_t seed;    /* stochastic rounding stream; vary it per call */
    int format;       /* zpp_quant_format; 0 (ZPP_QUANT_INT) when zeroed */
} zpp_quant_spec;

/* What a payload element is: an integer (int8 or int4) or, at 4 bits, an
 * OCP FP4 E2M1 number (see above). */
typedef enum zpp_quant_format { ZPP_QUANT_INT = 0, ZPP_QUANT_E2M1 = 1 } zpp_quant_format;

/* A spec with the default block for `bits`, integers, round-to-nearest. */
ZPP_API zpp_quant_spec zpp_quant_spec_default(int bits);
/* Checks bits and block; ZPP_ERR_INVALID with a message otherwise. */
ZPP_API zpp_status zpp_quant_spec_check(const zpp_quant_spec *spec);

ZPP_API size_t zpp_quant_payload_bytes(size_t n, int bits);      /* unpadded */
ZPP_API size_t zpp_quant_scales_offset(size_t n, int bits);      /* padded payload */
ZPP_API size_t zpp_quant_num_blocks(size_t n, size_t block);
ZPP_API size_t zpp_quant_bytes(size_t n, const zpp_quant_spec *spec); /* whole buffer */

/* Quantizes n elements of `x` (dtype) into `out` (zpp_quant_bytes bytes). */
ZPP_API zpp_status zpp_quantize(const void *x, zpp_dtype dtype, size_t n,
                                const zpp_quant_spec *spec, void *out);

/* Dequantizes a buffer made by zpp_quantize into n elements of dtype. */
ZPP_API zpp_status zpp_dequantize(const void *q, size_t n, const zpp_quant_spec *spec,
                                  zpp_dtype dtype, void *y);

/* acc[i] += dequantized q[i], fp32 accumulation. */
ZPP_API zpp_status zpp_dequantize_accumulate(const void *q, size_t n,
                                             const zpp_quant_spec *spec, float *acc);

/*
 * qgZ step 1, reorder + quantize. `x` holds a full gradient buffer of
 * nodes * local * chunk_len elements: chunk r (elements r*chunk_len ..) is
 * destined for global rank r = node * local + local_rank. The output is the
 * nodes * local chunks, each quantized on its own (zpp_quant_bytes(chunk_len)
 * bytes), laid end to end in the order
 *
 *     for dest_local in 0..local-1:  for node in 0..nodes-1:  chunk(node, dest_local)
 *
 * so that the `local` equal pieces of nodes * qbytes(chunk_len) bytes are
 * exactly what an intra-node all-to-all sends to each local rank: after it,
 * local rank s holds, from every peer of its node, the chunks of all ranks
 * with local index s, in node order — contiguous for the inter-node step.
 * With stochastic rounding, element indices for the random stream are the
 * element's index in x.
 */
ZPP_API zpp_status zpp_quant_reorder_quantize(const void *x, zpp_dtype dtype,
                                              size_t chunk_len, int nodes, int local,
                                              const zpp_quant_spec *spec, void *out);

/*
 * qgZ step 3, fused dequantize-sum-requantize. Each of the k inputs holds
 * n_chunks quantized chunks of chunk_len elements laid end to end (stride
 * zpp_quant_bytes(chunk_len, in_spec)). Chunk c of the output is
 * quantize(sum over inputs of dequantize(chunk c)), the sum taken in fp32 in
 * input order 0..k-1.
 */
ZPP_API zpp_status zpp_quant_dequant_sum_requant(const void *const *in, int k,
                                                 size_t n_chunks, size_t chunk_len,
                                                 const zpp_quant_spec *in_spec,
                                                 const zpp_quant_spec *out_spec,
                                                 void *out);

/* ------------------------------------------------------------------------ */
/* Training a model of your own                                              */
/* ------------------------------------------------------------------------ */
/*
 * Every rank of an MPI job (mpirun, srun) runs the same program:
 *
 *     MPI_Init(&argc, &argv);
 *     zpp_device *dev;    zpp_device_create_host(&dev);      (or a GPU)
 *     zpp_topo *topo;     zpp_topo_create(dev, node_size, 0.0, &topo);
 *     zpp_model *model;   zpp_model_create(&desc, dev, &model);
 *     zpp_engine_config cfg = zpp_engine_config_default();
 *     cfg.mode = ZPP_MODE_ZEROPP;
 *     zpp_engine *eng;    zpp_engine_create(topo, model, dev, &cfg, &eng);
 *     for each step:
 *         put this rank's micro-batch where your forward callback reads it
 *         zpp_engine_forward(eng, &loss);
 *         zpp_engine_backward(eng, zpp_engine_loss_scale(eng));
 *         zpp_engine_update(eng, lr, loss, &stats);
 *     destroy in reverse order, then MPI_Finalize();
 *
 * The engine owns the parameters: each rank keeps a 1/world shard of every
 * parameter unit (fp32 master weights, AdamW moments, gradients) and
 * gathers a whole unit, in the working dtype, just before a stage of your
 * model needs it. Your model owns the activations and the arithmetic.
 *
 * Collective calls (marked so below) must be made by every rank of
 * MPI_COMM_WORLD in the same order. Those that create something return the
 * same status on every rank (a failure on one rank is handed to all). A
 * callback of yours that fails on one rank during a forward or backward
 * returns its status there while the other ranks wait for it in the next
 * collective: give the topology a deadline (timeout_s) so they give up with
 * ZPP_ERR_TIMEOUT, and make the callbacks fail alike on every rank, or
 * agree with zpp_comm_agree_world before going on.
 */

typedef struct zpp_device zpp_device;
typedef struct zpp_topo zpp_topo;
typedef struct zpp_model zpp_model;
typedef struct zpp_engine zpp_engine;

/* ---- Devices: where a rank's tensors live and its work runs -------------- */

/* The host: tensors in host memory, work on the calling thread; the
 * communication goes through MPI. Free with zpp_device_destroy. */
ZPP_API zpp_status zpp_device_create_host(zpp_device **d_p);
/* NVIDIA GPU `ordinal` (made current for the calling thread) with a new
 * compute stream; the communication goes through NCCL. ZPP_ERR_UNSUPPORTED
 * in a build without CUDA, ZPP_ERR_CUDA when the GPU cannot be opened. */
ZPP_API zpp_status zpp_device_create_gpu(int ordinal, zpp_device **d_p);
/* GPUs this process sees (0 in a build without CUDA). */
ZPP_API int zpp_device_gpu_count(void);
/* gpu 0: zpp_device_create_host. gpu 1: the GPU of this rank, the rank's
 * index among the ranks the launcher started on its host
 * (zpp_comm_launch_local) modulo the GPUs it sees, as `zeropp train
 * --device gpu` picks it; ZPP_ERR_CUDA when no GPU is visible. MPI must be
 * initialised for gpu 1. */
ZPP_API zpp_status zpp_device_create_for_rank(int gpu, zpp_device **d_p);
/* Frees the device; NULL is ignored. Destroy it last: the topology, model
 * and engine made for it use it until they are destroyed. */
ZPP_API void zpp_device_destroy(zpp_device *d);
/* "host", or the GPU's product name, NUL-terminated in buf (cut to cap - 1). */
ZPP_API zpp_status zpp_device_name(const zpp_device *d, char *buf, size_t cap);
/* The GPU's index, or -1 for the host. */
ZPP_API int zpp_device_ordinal(const zpp_device *d);
/* The compute stream (a cudaStream_t) on which a GPU model must enqueue its
 * kernels, so that they are ordered with the engine's gathers and
 * reductions; NULL for the host. */
ZPP_API void *zpp_device_stream(const zpp_device *d);

/* ---- Topology: the world, cut into nodes ---------------------------------- */

/* Where the launcher put this rank: its index among the ranks started on
 * this host, and their number, from MPI's shared-memory split of the world
 * (so the same under mpirun, srun or any other launcher). Local. */
ZPP_API zpp_status zpp_comm_launch_local(int *local_rank_p, int *local_size_p);

/* Builds the communicators over MPI_COMM_WORLD (MPI must be initialised)
 * for ranks whose tensors live on `dev`: MPI for the host, NCCL for a GPU.
 * node_size: ranks per node, consecutive ranks sharing one (rank r is on
 * node r / node_size); 0 takes the launcher's placement (the ranks of one
 * host form a node). hpZ partitions inside a node and qgZ reduces in two
 * hops, inside then across nodes, so a node size smaller than the host
 * emulates several nodes on one machine. timeout_s: the most any wait for
 * peer ranks may last before it returns ZPP_ERR_TIMEOUT (0: forever); it
 * also becomes the deadline of zpp_comm_agree_world. `dev` is borrowed and
 * must outlive the topology. Collective.
 * ZPP_ERR_INVALID: node_size negative or not dividing the world (the
 * message lists sizes that do), different on some rank, or the launcher's
 * placement unequal or not consecutive per host. */
ZPP_API zpp_status zpp_topo_create(zpp_device *dev, int node_size, double timeout_s,
                                   zpp_topo **topo_p);
/* zpp_topo_create, where on a GPU emulate_nodes 1 gives each node of
 * node_size ranks its own NCCL host identity (NCCL_HOSTID), so that its
 * ranks reach the other nodes over sockets, as separate machines would,
 * rather than through the host's shared memory and NVLink
 * (docs/emulated-nodes.md; launch with mpirun --bind-to none). 0, or the
 * host: zpp_topo_create. Collective. */
ZPP_API zpp_status zpp_topo_create_emulated(zpp_device *dev, int node_size, double timeout_s,
                                            int emulate_nodes, zpp_topo **topo_p);
/* Frees the communicators; NULL is ignored. Collective for NCCL. */
ZPP_API void zpp_topo_destroy(zpp_topo *topo);

typedef struct zpp_topo_info {
    int world_size, world_rank; /* ranks in the job, this rank */
    int nodes, node_size;       /* world_size = nodes * node_size */
    int node, local_rank;       /* world_rank = node * node_size + local_rank */
} zpp_topo_info;
/* This rank's place in the topology (zeros for a NULL topo). */
ZPP_API zpp_topo_info zpp_topo_info_get(const zpp_topo *topo);
/* What the communication backend changed about how the ranks talk, one
 * line for people (ranks of an emulated node sharing a GPU each talk over
 * sockets as a separate host), or "" when nothing. Never NULL. */
ZPP_API const char *zpp_topo_note(const zpp_topo *topo);

/* Every rank of MPI_COMM_WORLD returns ZPP_OK when all passed ZPP_OK, else
 * the status of the lowest-numbered rank that failed, with its message
 * (zpp_last_error) on every rank. Collective. */
ZPP_API zpp_status zpp_comm_agree_world(zpp_status st);

/* ---- A model of your own --------------------------------------------------
 * Parameters are cut into UNITS: flat arrays, each gathered as one buffer
 * (a layer, say). The computation is cut into STAGES, run in order
 * 0..n_stages-1 by the forward and in reverse by the backward, each stage
 * using the parameters of one unit (stage_unit[s]); a unit may serve
 * several stages (tied weights). While stage s computes, the engine
 * already gathers the unit of stage s + 1.
 *
 * Callbacks get `user` back as their first argument and return ZPP_OK, or
 * an error raised with zpp_error (below), which the engine hands back
 * unchanged from the call that ran the callback. Parameter and
 * gradient buffers are in the device's memory (host memory for the host,
 * GPU memory for a GPU, with the kernels on zpp_device_stream). */
typedef struct zpp_model_desc {
    int n_units;
    const size_t *unit_numel;        /* elements of each unit, each >= 1 */
    int n_stages;
    const int *stage_unit;           /* unit of each stage; every unit used */
    /* Per stage, 1 when its backward reads the unit's parameters, 0 when it
     * does not (the engine then gathers nothing for it and passes NULL);
     * NULL: every stage reads them. */
    const unsigned char *bwd_reads_params;
    /* The dtype parameters arrive in: the engine's work_dtype (ZPP_FP32,
     * ZPP_BF16 or ZPP_FP16). */
    zpp_dtype param_dtype;
    void *user;                      /* handed back to every callback */

    /* Writes the initial fp32 values of elements [offset, offset + count) of
     * `unit` into out (host memory). Must be a pure function of (seed, unit,
     * element index): each rank initialises only the shard it owns. */
    zpp_status (*init_params)(void *user, int unit, size_t offset, size_t count,
                              float *out, uint64_t seed);
    /* Forward of stage `stage`, with its unit's parameters (unit_numel
     * elements of param_dtype). The batch is whatever the caller put in
     * `user` before zpp_engine_forward. */
    zpp_status (*forward)(void *user, int stage, const void *params);
    /* This rank's loss of the last forward (mean over its micro-batch). */
    float (*loss)(void *user);
    /* Backward of stage `stage`: ADDS d(loss * loss_scale)/d(params) into
     * grads (fp32, unit_numel elements, zeroed by the engine before the
     * unit's first backward stage). The last stage starts from the loss.
     * params is NULL when bwd_reads_params says the stage does not read
     * them. */
    zpp_status (*backward)(void *user, int stage, const void *params, float *grads,
                           float loss_scale);
    /* Optional: called by zpp_model_destroy, to free `user`. */
    void (*destroy)(void *user);
} zpp_model_desc;

/* Wraps a description as a model for zpp_engine_create. The arrays of `desc`
 * are copied; `user` is borrowed (freed by desc->destroy, if given, when
 * the model is destroyed). Local. ZPP_ERR_INVALID, naming the field, for a
 * missing callback, no units or stages, an empty unit, a stage_unit out of
 * range, a unit no stage uses, or a param_dtype that is not fp32, bf16 or
 * fp16. */
ZPP_API zpp_status zpp_model_create(const zpp_model_desc *desc, zpp_device *dev,
                                    zpp_model **model_p);
/* Calls desc->destroy(user) and frees the model; NULL is ignored. Destroy
 * the engine first. */
ZPP_API void zpp_model_destroy(zpp_model *model);

/* ---- Built-in decoders: a family picked by config -------------------------
 *
 * The decoders `zeropp train` trains, for a program of your own: GPT-2 and
 * Llama (Meta's Llama 2/3 as Hugging Face's LlamaForCausalLM computes it:
 * RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied head).
 * The CPU model on the host device, the CUDA model on a GPU (fp32, bf16 or
 * fp16, any head size: docs/gpus.md, "Attention"). The engine drives it
 * like a model of your own; you hand it each micro-batch with
 * zpp_model_set_batch. */

/* The decoder that `model_json` describes: the "model" section of a
 * training config, as JSON text, with the keys of docs/config.md's model.*
 * ("family": "gpt2" (the default) or "llama", "n_layer", "n_head",
 * "n_kv_head", "n_embd", "n_ffn", "seq_len", "vocab_size", "rope_theta",
 * "untied_head", ...; a key left out keeps its default), its parameters in
 * param_dtype (the engine's work_dtype), for micro-batches of up to
 * max_batch sequences of seq_len tokens. Example:
 *     {"family": "llama", "n_layer": 16, "n_embd": 2048, "n_head": 32,
 *      "n_kv_head": 8, "n_ffn": 8192, "seq_len": 2048, "vocab_size": 128256,
 *      "rope_theta": 500000, "untied_head": true}
 * Local. ZPP_ERR_CONFIG naming the key for text that is not a JSON object,
 * an unknown key or family, a value out of range or a key of another
 * family; ZPP_ERR_UNSUPPORTED for a shape or dtype the device's model
 * cannot run; ZPP_ERR_INVALID for a NULL argument or max_batch < 1. Free
 * with zpp_model_destroy (after the engine). */
ZPP_API zpp_status zpp_model_create_decoder(const char *model_json, zpp_dtype param_dtype,
                                            int max_batch, zpp_device *dev,
                                            zpp_model **model_p);
/* The micro-batch of a built-in decoder for the next zpp_engine_forward
 * (or zpp_engine_evaluate): B (1..max_batch) sequences of seq_len tokens
 * each, row-major in host memory, tokens in 0..vocab_size-1 and targets
 * (the next tokens, in 0..the softmax's vocabulary - 1; NULL: no loss) ;
 * copied, so the arrays may be reused at once. Local. ZPP_ERR_INVALID for
 * a token out of range, B out of range, or a model of your own (its
 * batch goes through your own state). */
ZPP_API zpp_status zpp_model_set_batch(zpp_model *model, const int32_t *tokens,
                                       const int32_t *targets, int B);

/* ---- The engine: ZeRO-3 and the ZeRO++ options ---------------------------- */

/* The ZeRO++ optimizations, to OR together; 0 is plain ZeRO-3. */
typedef enum zpp_mode {
    ZPP_MODE_ZERO3 = 0,
    ZPP_MODE_QWZ = 1,    /* forward gathers move int8 weights + scales */
    ZPP_MODE_HPZ = 2,    /* a secondary weight shard per node: backward
                            gathers stay inside the node */
    ZPP_MODE_QGZ = 4,    /* gradients reduced by a two-hop 4-bit all-to-all */
    ZPP_MODE_ZEROPP = 7  /* all three */
} zpp_mode;
/* Parses "zero3", "zeropp", or a '+'-joined list of "qwz", "hpz", "qgz"
 * ("qwz+qgz"). */
ZPP_API zpp_status zpp_mode_parse(const char *name, int *mode_p);
/* "zero3", "zeropp", or the list ("qwz+hpz"); "?" for an invalid mode. */
ZPP_API const char *zpp_mode_name(int mode);

/* The deepest prefetch and reduction pipelines (prefetch_depth, reduce_depth). */
#define ZPP_ENGINE_MAX_DEPTH 8

/* Every option of the engine; zpp_engine_create refuses a value outside the
 * range given here with ZPP_ERR_INVALID, naming the field and its range. */
typedef struct zpp_engine_config {
    int mode;                  /* ZPP_MODE_* flags; default ZPP_MODE_ZERO3 */
    zpp_dtype work_dtype;      /* gathered weights and reduced gradients;
                                  default ZPP_BF16 (the model's param_dtype) */
    /* AdamW with decoupled weight decay; defaults 0.9, 0.95, 1e-8, 0. Betas
     * in [0, 1), eps > 0, weight_decay >= 0. */
    float beta1, beta2, eps, weight_decay;
    float grad_clip;           /* max global gradient norm, 0 = off; default 1 */
    uint64_t seed;             /* handed to init_params; default 1234 */
    /* fp16: a static loss scale > 0, or 0 for the dynamic scaler (below).
     * Default 1. */
    float loss_scale;
    /* A step whose gradients hold NaN or Inf is skipped on every rank; this
     * many skipped in a row (>= 1) fail the update with ZPP_ERR_NONFINITE.
     * With the dynamic scaler an overflow counts only at min_loss_scale.
     * Default 5. */
    int max_consecutive_skips;
    zpp_quant_spec weight_quant; /* qwZ: int8, default block */
    zpp_quant_spec grad_quant;   /* qgZ: 4-bit E2M1, default block */
    /* A gathered unit stays for its next use (later in the pass, or, over
     * more than one rank, in the backward that follows the forward) when
     * that use comes within this many parameters of other units: DeepSpeed's
     * stage3_max_reuse_distance, default 1e9. 0 gathers a unit for every
     * stage that uses it, apart from consecutive ones. */
    size_t max_reuse_distance;
    /* 1: weight_decay on every parameter; 0 (default): only on the
     * model's matrices when it names them (GPT-2's), else on every one. */
    int decay_all;
    /* Units gathered ahead of the one computing, and gradient reductions in
     * flight, each in [1, ZPP_ENGINE_MAX_DEPTH]; default 2 and 2. Each step
     * of depth costs a gathered unit (or a unit's reduction buffers) of
     * memory; the results are the same bits at any depth. */
    int prefetch_depth, reduce_depth;
    /* The dynamic loss scaler (loss_scale 0; DeepSpeed's fp16 keys): it
     * starts at 2^initial_scale_power (in [0, 127], default 16), halves at
     * the hysteresis-th overflow (>= 1, default 2; consecutive_hysteresis 1:
     * any good step restores it, 0 (default): only a doubling does), never
     * below min_loss_scale (> 0, default 1), and doubles after
     * loss_scale_window (>= 1, default 1000) steps without overflow. */
    int initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis;
    float min_loss_scale;
    /* qgZ error feedback (LoCo; needs ZPP_MODE_QGZ): loco 1 keeps, per unit,
     * the quantization error of qgZ's two hops and feeds it into the next
     * reduction, as e <- loco_err_beta e + (1 - loco_err_beta) (x - Q(x))
     * (err_beta in [0, 1], default 0.8); the buffers are cleared after every
     * loco_reset_T-th step (>= 1, default 1024) and after a skipped step.
     * Costs about 4 (1 + 1/node_size) bytes a parameter a rank. Default 0. */
    int loco;
    float loco_err_beta;
    int loco_reset_T;
    /* 0 (default): the elements outside the model's matrices (its vectors:
     * biases, norms) travel at full precision under qwZ and qgZ, as in
     * DeepSpeed, at one all-reduce of them a step each way; 1: they are
     * quantized with the matrices. Nothing changes for a model that names
     * no matrices. */
    int quantize_vectors;
    /* 1: time each step's compute and exposed communication
     * (zpp_update_stats' *_ms); costs two timing events a collective wait.
     * The same on every rank. Default 0. */
    int profile;
    /* 1 (default): in a world of one rank with the plain gather (no qwZ,
     * no hpZ), the weights stay on the device in work_dtype between steps,
     * written by AdamW as it updates the masters; forward and backward read
     * them as they are, instead of rounding the fp32 masters twice a step.
     * In bf16 they cost no memory: the fp32 master is kept as that bf16
     * copy and its low 16 bits. In fp16 and fp32 they cost 2 or 4 bytes a
     * parameter; 0: no copy is kept (the memory for a model that only just
     * fits). Same bits either way. */
    int resident_weights;
    /* 1 (default): in a world of one rank with work_dtype bf16, and a model
     * that can write them (the built-in CUDA models that say so), the
     * gradients are accumulated in bf16 instead of fp32: 2 bytes a
     * parameter less, and less to write and read a step. Each add is done
     * in fp32 and rounded once, so one backward a step gives the gradient
     * rounded once to bf16: the precision a world of several ranks has,
     * whose gradients travel in bf16. With several backwards a step
     * (gradient accumulation) each adds a rounding: set 0 there (the
     * trainer does). 0: fp32 gradients. */
    int work_grads;
} zpp_engine_config;

/* The defaults listed above. */
ZPP_API zpp_engine_config zpp_engine_config_default(void);

/* Creates the engine: allocates this rank's shards of every unit and
 * initialises them through init_params. topo, model and dev are borrowed
 * and must outlive the engine; model and topology must be made for `dev`.
 * Collective. ZPP_ERR_INVALID for a bad config (unknown mode bits, a
 * work_dtype other than the model's, a field outside its range, loco
 * without ZPP_MODE_QGZ, a bad quantization spec, a NULL argument),
 * ZPP_ERR_NOMEM when the shards do not fit. */
ZPP_API zpp_status zpp_engine_create(zpp_topo *topo, zpp_model *model, zpp_device *dev,
                                     const zpp_engine_config *cfg, zpp_engine **engine_p);
/* Frees the shards; NULL is ignored. */
ZPP_API void zpp_engine_destroy(zpp_engine *e);

/* Forward of the micro-batch the model holds: gathers each stage's unit
 * (qwZ: quantized), runs the stages, returns the model's loss for this
 * rank. Collective. */
ZPP_API zpp_status zpp_engine_forward(zpp_engine *e, float *loss_p);
/* Backward of the last forward: runs the stages in reverse (hpZ: gathering
 * inside the node) and reduces each unit's gradient over the world as soon
 * as its backward is done (qgZ: quantized), adding the world average into
 * the gradient shards. loss_scale multiplies the loss being
 * differentiated: pass zpp_engine_loss_scale(e), times 1/k to average k
 * micro-batches accumulated before one update. ZPP_ERR_STATE without a
 * forward under the current weights. Collective. */
ZPP_API zpp_status zpp_engine_backward(zpp_engine *e, float loss_scale);
/* The loss scale the next backward should apply (1 unless fp16 scaling). */
ZPP_API float zpp_engine_loss_scale(const zpp_engine *e);

/* The parts of a step that move bytes, indexing the *_phase_bytes arrays
 * below: [0] forward gathers, [1] backward gathers, [2] gradient
 * reductions, [3] the rest (the norm, the loss, the vectors' all-reduces). */
#define ZPP_STEP_PHASES 4

typedef struct zpp_update_stats {
    float loss;               /* the `loss` passed, averaged over the world */
    float grad_norm;          /* global gradient norm before clipping */
    int skipped;              /* 1: non-finite gradients, no update */
    int skipped_total;        /* steps skipped so far */
    float loss_scale;         /* the scale this step's gradients carried */
    /* Bytes this step moved per node since the last update: across nodes,
     * and inside a node (gathers, reductions, norms); then the same split
     * by phase (ZPP_STEP_PHASES; they add up to the totals). */
    double cross_node_bytes, intra_node_bytes;
    double cross_node_phase_bytes[ZPP_STEP_PHASES], intra_node_phase_bytes[ZPP_STEP_PHASES];
    /* With cfg.profile (profiled 1), this rank's step from its first
     * forward to the end of the update: stream_ms = compute_ms +
     * exposed_comm_ms, the time the compute stream (the host thread on the
     * host) stood waiting for a collective it could not hide; profile_waits
     * the waits timed. All 0 without. */
    int profiled;
    double stream_ms, compute_ms, exposed_comm_ms;
    int profile_waits;
    /* The sum of squares of every fp32 master weight after the step, over
     * the world: a monitoring figure, computed only when the environment
     * holds ZPP_PARAM_SUMSQ=1 when the engine is opened; NaN otherwise. */
    double param_sumsq;
} zpp_update_stats;

/* The optimizer step: global gradient norm, clipping, AdamW at learning
 * rate lr on each rank's fp32 master shard, the new working-dtype shard;
 * gradients cleared. `loss` is this rank's loss (the mean of its
 * micro-batches' forward losses), averaged over the world into
 * stats_p->loss. Non-finite gradients on any rank skip the step everywhere
 * (stats_p->skipped). stats_p may be NULL. Collective. */
ZPP_API zpp_status zpp_engine_update(zpp_engine *e, float lr, float loss,
                                     zpp_update_stats *stats_p);
/* Mean loss over the world of a forward on the micro-batch the model holds;
 * no gradients, no state change (an evaluation). The weights are gathered
 * exactly in the working dtype, also with ZPP_MODE_QWZ: the loss is that of
 * the fp32 masters (zpp_engine_state_get) rounded to the working dtype, not
 * of their int8 rendering, at ZeRO-3's gather bytes. A backward needs a new
 * forward after it. Collective. */
ZPP_API zpp_status zpp_engine_evaluate(zpp_engine *e, float *loss_p);
/* The bytes per node the last zpp_engine_evaluate moved, across nodes and
 * inside a node, by phase (ZPP_STEP_PHASES: its gathers under [0], the
 * loss's all-reduce under [3]); zeros before the first. An evaluation's
 * bytes are never counted in a step's. Local. */
ZPP_API void zpp_engine_eval_bytes(const zpp_engine *e, double cross_node[ZPP_STEP_PHASES],
                                   double intra_node[ZPP_STEP_PHASES]);
/* Optimizer steps taken, skipped ones included. */
ZPP_API int zpp_engine_steps_taken(const zpp_engine *e);

/* This rank's part of the trained weights: unit `unit` (numel elements) is
 * owned in pieces, this rank's being elements [begin, begin + count), count
 * possibly 0. */
ZPP_API zpp_status zpp_engine_shard_range(const zpp_engine *e, int unit, size_t *numel_p,
                                          size_t *begin_p, size_t *count_p);
/* Copies this rank's `count` fp32 master weights of the unit, and both AdamW
 * moments, to host arrays of count floats each. */
ZPP_API zpp_status zpp_engine_state_get(zpp_engine *e, int unit, float *master, float *m,
                                        float *v);
/* Installs host arrays of `count` floats each as this rank's master weights
 * and AdamW moments of the unit (the rest of its shard, padding, stays 0),
 * clears its gradient and marks the hpZ secondary copy stale, so that the
 * next gathers round the new master; a backward needs a new forward after
 * it. A checkpoint's restore, or weights of your own. Local. */
ZPP_API zpp_status zpp_engine_state_set(zpp_engine *e, int unit, const float *master,
                                        const float *m, const float *v);
/* The model's units (the n_units of its description). */
ZPP_API int zpp_engine_unit_count(const zpp_engine *e);

/* What a checkpoint keeps beside the shards, so that a run resumed after
 * skipped steps or under fp16 loss scaling continues as the uninterrupted
 * one: AdamW's bias correction counts updates, not steps, and the loss
 * scaler's state decides the next scale. (A run of consecutive skips starts
 * again from zero on resume.) */
typedef struct zpp_engine_counters {
    int step;          /* optimizer steps taken, skipped ones included */
    int updates;       /* AdamW updates: the bias-correction step */
    int skipped_total; /* steps skipped */
    float loss_scale;  /* the current loss scale (1 without fp16) */
    int scaler_hysteresis, scaler_iter, scaler_last_overflow; /* dynamic scaler */
} zpp_engine_counters;
/* The engine's counters now. Local. */
ZPP_API zpp_engine_counters zpp_engine_counters_get(const zpp_engine *e);
/* Installs saved counters (the scaler's only under the dynamic scaler: a
 * static scale is this run's config). ZPP_ERR_INVALID when they cannot come
 * from a run (negative counts, more updates or skips than steps, a scale
 * that is not finite and positive). Local. */
ZPP_API zpp_status zpp_engine_counters_set(zpp_engine *e, const zpp_engine_counters *c);

/* Error-feedback state (cfg.loco), per rank and unit. Unlike the optimizer's
 * it is not cut by element ranges: the intra buffer covers this rank's
 * whole gradient and the inter buffer its node's partial sums, in the
 * layout of this world and node size, so it can only be restored on the
 * same world and node size (clear it otherwise). *intra_p and *inter_p
 * (floats) are 0 when error feedback is off. Local. */
ZPP_API zpp_status zpp_engine_loco_lens(const zpp_engine *e, int unit, size_t *intra_p,
                                        size_t *inter_p);
/* Copies the unit's two buffers to / from host arrays of those lengths. */
ZPP_API zpp_status zpp_engine_loco_get(zpp_engine *e, int unit, float *intra, float *inter);
ZPP_API zpp_status zpp_engine_loco_set(zpp_engine *e, int unit, const float *intra,
                                       const float *inter);
/* Zeroes every unit's buffers (what loco_reset_T does). */
ZPP_API zpp_status zpp_engine_loco_clear(zpp_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* ZEROPP_H */
