/* model/attention_cudnn.c — attention_cudnn.h's causal attention on cuDNN's
 * backend API (cudnn_graph.h), plain C: descriptors are created, given
 * their attributes one by one, finalized, and an operation graph of them is
 * handed to cuDNN's heuristics, which name the engines that can run it.
 *
 * The graph is the one cuDNN's fused flash-attention engines match at this
 * version (9.x on Hopper and Ampere): cuDNN does not run the elementwise
 * steps one by one, it recognises the whole pattern (two matmuls around a
 * masked, scaled softmax; the backward's five products) and runs one fused
 * kernel. So the shape of the graph matters, not only what it computes:
 * tensor dims [batch, head, row, col], K given transposed through its
 * strides (K^T: [B, KV, hs, T]), the causal mask as generated row and
 * column indices compared (row >= col) and a select of -inf, the softmax
 * statistics lse = max + log(sum) as a graph output, P in bf16 before the
 * second matmul, and in the backward D = rowsum(dY * Y) as a real (not
 * virtual) fp32 tensor, which cuDNN expects in memory: it lives at the
 * start of the caller's workspace.
 *
 * Tensors carry numbers (unique ids): the ones the caller's memory backs
 * are the UID_* below and are bound at each call through a variant pack;
 * the graph's intermediates are virtual (never in memory) and numbered from
 * UID_VIRTUAL up; the scale, -inf and 1 constants are by-value scalars
 * whose host addresses go in the variant pack.
 *
 * Errors while building go to the context's trace (attention_cudnn.h) and
 * make the whole build fail with the first failure's cuDNN status; nothing
 * is printed. */
#include "model/attention_cudnn.h"

#include <cudnn_graph.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define TRACE_BYTES 16384
#define MAX_BATCHES 4     /* plans kept for this many batch sizes */
#define MAX_OPS 48        /* operations in one graph (the backward has 21 to 23) */
#define D_ALIGN 256       /* the cuDNN workspace starts this aligned after D */

enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_SCALE,
    UID_NEG_INF,
    UID_ONE,
    UID_DSUM,
    UID_VIRTUAL = 100
};

typedef struct plan {
    cudnnBackendDescriptor_t exec;  /* the execution plan; NULL: none */
    cudnnBackendDescriptor_t *keep; /* the descriptors it was built from */
    int nkeep;
    int64_t ws;     /* its workspace bytes */
    int64_t engine; /* cuDNN's global engine index (trace) */
} plan;

typedef struct batch_plans {
    int B; /* 0: slot unused */
    plan fwd, bwd;
} batch_plans;

struct zpp_attn_cudnn {
    cudnnHandle_t handle;
    int B_max, T, H, KV, hs;
    size_t d_bytes;   /* D's part of the workspace, aligned to D_ALIGN */
    size_t workspace; /* what create reported */
    float scale, neg_inf, one; /* by-value scalars (their addresses are bound) */
    batch_plans slots[MAX_BATCHES];
    char trace[TRACE_BYTES];
    size_t trace_len;
};

static _Thread_local char create_trace[TRACE_BYTES];

/* ---- the trace and error messages ----------------------------------------- */

static void trace_add(zpp_attn_cudnn *c, const char *fmt, ...) ZPP_PRINTF(2, 3);
static void trace_add(zpp_attn_cudnn *c, const char *fmt, ...) {
    if (c->trace_len + 2 >= sizeof c->trace) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->trace + c->trace_len, sizeof c->trace - c->trace_len - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    c->trace_len += (size_t)n;
    if (c->trace_len > sizeof c->trace - 2) c->trace_len = sizeof c->trace - 2;
    c->trace[c->trace_len++] = '\n';
    c->trace[c->trace_len] = '\0';
}

/* cuDNN's explanation of its last failure on this thread, "" if none. */
static const char *cudnn_last(char *buf, size_t n) {
    buf[0] = '\0';
    cudnnGetLastErrorString(buf, n);
    return buf;
}

static zpp_status cudnn_error(zpp_status code, cudnnStatus_t s, const char *what) {
    char last[512];
    cudnn_last(last, sizeof last);
    return zpp_error(code, "%s: %s%s%s", what, cudnnGetErrorString(s), last[0] ? ": " : "", last);
}

/* ---- the graph builder: sticky first failure, descriptors owned ---------- */

typedef struct gb {
    zpp_attn_cudnn *ctx;
    cudnnBackendDescriptor_t *descs; /* every descriptor made, for the plan to keep */
    int ndesc, cap;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    cudnnStatus_t st; /* the first failure; SUCCESS while none */
    char where[256];  /* what it was */
    int64_t next_uid;
} gb;

static void gb_fail(gb *g, cudnnStatus_t s, const char *what, const char *name) {
    char last[512];
    cudnn_last(last, sizeof last);
    trace_add(g->ctx, "  %s %s: %s%s%s", what, name, cudnnGetErrorString(s), last[0] ? ": " : "",
              last);
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = s;
    snprintf(g->where, sizeof g->where, "%s %s", what, name);
}

static cudnnBackendDescriptor_t gb_new(gb *g, cudnnBackendDescriptorType_t type,
                                       const char *name) {
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->ndesc == g->cap) {
        int cap = g->cap ? 2 * g->cap : 128;
        cudnnBackendDescriptor_t *d = realloc(g->descs, (size_t)cap * sizeof *d);
        if (!d) {
            gb_fail(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "create", name);
            return NULL;
        }
        g->descs = d, g->cap = cap;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, s, "create", name);
        return NULL;
    }
    g->descs[g->ndesc++] = d;
    return d;
}

static void gb_set(gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                   const char *name, cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    if (g->st != CUDNN_STATUS_SUCCESS || !d) return;
    cudnnStatus_t s = cudnnBackendSetAttribute(d, attr, type, n, v);
    if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, "set", name);
}
#define SET(g, d, attr, type, n, v) gb_set(g, d, attr, #attr, type, n, v)

static void gb_fin(gb *g, cudnnBackendDescriptor_t d, const char *name) {
    if (g->st != CUDNN_STATUS_SUCCESS || !d) return;
    cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, "finalize", name);
}

static void gb_release(gb *g) {
    for (int i = g->ndesc - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->descs[i]);
    free(g->descs);
    g->descs = NULL;
    g->ndesc = g->cap = 0;
}

/* ---- tensors --------------------------------------------------------------- */

typedef struct shape {
    int64_t d[4], s[4];
} shape;

static shape shp(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                 int64_t s2, int64_t s3) {
    shape r = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return r;
}

static cudnnBackendDescriptor_t tensor(gb *g, int64_t uid, cudnnDataType_t dt, shape sh,
                                       bool virt, bool by_value, const char *name) {
    cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    const int64_t align = 16;
    SET(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    SET(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, sh.d);
    SET(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, sh.s);
    SET(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (virt) SET(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) SET(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    gb_fin(g, t, name);
    return t;
}

static cudnnBackendDescriptor_t io(gb *g, int64_t uid, cudnnDataType_t dt, shape sh,
                                   const char *name) {
    return tensor(g, uid, dt, sh, false, false, name);
}

static cudnnBackendDescriptor_t vt(gb *g, cudnnDataType_t dt, shape sh) {
    return tensor(g, g->next_uid++, dt, sh, true, false, "virtual tensor");
}

static cudnnBackendDescriptor_t scalar(gb *g, int64_t uid, const char *name) {
    return tensor(g, uid, CUDNN_DATA_FLOAT, shp(1, 1, 1, 1, 1, 1, 1, 1), false, true, name);
}

/* ---- operations ------------------------------------------------------------ */

static void op_add(gb *g, cudnnBackendDescriptor_t op, const char *name) {
    gb_fin(g, op, name);
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->nops == MAX_OPS) {
        gb_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "add", "operation (MAX_OPS too small)");
        return;
    }
    g->ops[g->nops++] = op;
}

/* y = mode(x [, b [, t]]); axis >= 0 for GEN_INDEX. */
static void pw_axis(gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    SET(g, d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET(g, d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) SET(g, d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    gb_fin(g, d, "pointwise descriptor");
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    const float one = 1.0f;
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    op_add(g, op, "pointwise operation");
}

static void pw(gb *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
    pw_axis(g, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
}

/* c = a b, batched over dims 0 and 1 (b's head dim may divide a's). */
static void mm(gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    SET(g, d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    gb_fin(g, d, "matmul descriptor");
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    op_add(g, op, "matmul operation");
}

/* y = reduce(x) over the dims where y has 1 and x more. */
static void red(gb *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t d = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    SET(g, d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    SET(g, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    gb_fin(g, d, "reduction descriptor");
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    op_add(g, op, "reduction operation");
}

/* The graph's intermediate steps, each into a new fp32 virtual tensor of
 * shape sh (returned): so a builder reads one operation a line. */
static cudnnBackendDescriptor_t pw_to(gb *g, cudnnPointwiseMode_t mode,
                                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                      shape sh) {
    cudnnBackendDescriptor_t y = vt(g, CUDNN_DATA_FLOAT, sh);
    pw(g, mode, x, b, y);
    return y;
}
static cudnnBackendDescriptor_t mm_to(gb *g, cudnnBackendDescriptor_t a,
                                      cudnnBackendDescriptor_t b, shape sh) {
    cudnnBackendDescriptor_t c = vt(g, CUDNN_DATA_FLOAT, sh);
    mm(g, a, b, c);
    return c;
}
static cudnnBackendDescriptor_t red_to(gb *g, cudnnReduceTensorOp_t how,
                                       cudnnBackendDescriptor_t x, shape sh) {
    cudnnBackendDescriptor_t y = vt(g, CUDNN_DATA_FLOAT, sh);
    red(g, how, x, y);
    return y;
}

/* y = x seen through other dims and strides (a transpose, no data moved). */
static void view(gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op =
        gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    op_add(g, op, "reshape operation");
}

/* (row >= col) ? x : -inf over the last two dims of x (shape sh). */
static cudnnBackendDescriptor_t causal(gb *g, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t neg_inf, shape sh) {
    cudnnBackendDescriptor_t row = vt(g, CUDNN_DATA_INT32, sh);
    cudnnBackendDescriptor_t col = vt(g, CUDNN_DATA_INT32, sh);
    cudnnBackendDescriptor_t keep = vt(g, CUDNN_DATA_BOOLEAN, sh);
    cudnnBackendDescriptor_t y = vt(g, CUDNN_DATA_FLOAT, sh);
    pw_axis(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, x, NULL, NULL, row);
    pw_axis(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, x, NULL, NULL, col);
    pw_axis(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    pw_axis(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, x, neg_inf, keep, y);
    return y;
}

/* ---- the two graphs ------------------------------------------------------ */

typedef struct dims {
    int64_t B, T, H, KV, hs, C, R; /* C = H hs, R = the qkv row, (H + 2 KV) hs */
} dims;

static dims dims_of(const zpp_attn_cudnn *c, int B) {
    dims d = {B, c->T, c->H, c->KV, c->hs, (int64_t)c->H * c->hs, 0};
    d.R = d.C + 2 * d.KV * d.hs;
    return d;
}

/* A query-head tensor inside the qkv rows, a key/value-head one, the same
 * transposed (K^T, V^T: [B, KV, hs, T]), one in y's rows, a row statistic
 * (lse, D), the scores [B, H, T, T] and their transpose. */
static shape sh_q(const dims *d) { return shp(d->B, d->H, d->T, d->hs, d->T * d->R, d->hs, d->R, 1); }
static shape sh_kv(const dims *d) { return shp(d->B, d->KV, d->T, d->hs, d->T * d->R, d->hs, d->R, 1); }
static shape sh_kvt(const dims *d) { return shp(d->B, d->KV, d->hs, d->T, d->T * d->R, d->hs, 1, d->R); }
static shape sh_y(const dims *d) { return shp(d->B, d->H, d->T, d->hs, d->T * d->C, d->hs, d->C, 1); }
static shape sh_row(const dims *d) { return shp(d->B, d->H, d->T, 1, d->H * d->T, d->T, 1, 1); }
static shape sh_s(const dims *d) {
    return shp(d->B, d->H, d->T, d->T, d->H * d->T * d->T, d->T * d->T, d->T, 1);
}
static shape sh_st(const dims *d) {
    return shp(d->B, d->H, d->T, d->T, d->H * d->T * d->T, d->T * d->T, 1, d->T);
}

/* Y = softmax(mask(Q K^T * scale)) V, lse = max + log(sum). */
static void build_forward(gb *g, const dims *d) {
    cudnnBackendDescriptor_t q = io(g, UID_Q, CUDNN_DATA_BFLOAT16, sh_q(d), "Q");
    cudnnBackendDescriptor_t kt = io(g, UID_K, CUDNN_DATA_BFLOAT16, sh_kvt(d), "K^T");
    cudnnBackendDescriptor_t v = io(g, UID_V, CUDNN_DATA_BFLOAT16, sh_kv(d), "V");
    cudnnBackendDescriptor_t o = io(g, UID_O, CUDNN_DATA_BFLOAT16, sh_y(d), "Y");
    cudnnBackendDescriptor_t lse = io(g, UID_STATS, CUDNN_DATA_FLOAT, sh_row(d), "lse");
    cudnnBackendDescriptor_t scale = scalar(g, UID_SCALE, "scale");
    cudnnBackendDescriptor_t neg_inf = scalar(g, UID_NEG_INF, "-inf");
    const shape S = sh_s(d), row = sh_row(d);

    cudnnBackendDescriptor_t s0 = mm_to(g, q, kt, S);
    cudnnBackendDescriptor_t s1 = pw_to(g, CUDNN_POINTWISE_MUL, s0, scale, S);
    cudnnBackendDescriptor_t s2 = causal(g, s1, neg_inf, S);
    cudnnBackendDescriptor_t mx = red_to(g, CUDNN_REDUCE_TENSOR_MAX, s2, row);
    cudnnBackendDescriptor_t s3 = pw_to(g, CUDNN_POINTWISE_SUB, s2, mx, S);
    cudnnBackendDescriptor_t e = pw_to(g, CUDNN_POINTWISE_EXP, s3, NULL, S);
    cudnnBackendDescriptor_t sum = red_to(g, CUDNN_REDUCE_TENSOR_ADD, e, row);
    cudnnBackendDescriptor_t lg = pw_to(g, CUDNN_POINTWISE_LOG, sum, NULL, row);
    pw(g, CUDNN_POINTWISE_ADD, mx, lg, lse);
    cudnnBackendDescriptor_t p = vt(g, CUDNN_DATA_BFLOAT16, S); /* the matmul's operand type */
    pw(g, CUDNN_POINTWISE_DIV, e, sum, p);
    mm(g, p, v, o);
}

/* out = x^T y for a transposed score-shaped x ([B, H, T, T] seen as
 * [B, H, Tk, Tq]); with grouped queries, then summed over each group's
 * heads into the KV-head out. */
static void transposed_product(gb *g, const dims *d, cudnnBackendDescriptor_t x,
                               cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t out) {
    cudnnBackendDescriptor_t xt = vt(g, CUDNN_DATA_BFLOAT16, sh_st(d));
    view(g, x, xt);
    if (d->KV == d->H) {
        mm(g, xt, y, out);
        return;
    }
    const shape full =
        shp(d->B, d->H, d->T, d->hs, d->H * d->T * d->hs, d->T * d->hs, d->hs, 1);
    cudnnBackendDescriptor_t per_head = vt(g, CUDNN_DATA_BFLOAT16, full);
    mm(g, xt, y, per_head);
    red(g, CUDNN_REDUCE_TENSOR_ADD, per_head, out);
}

/* D = rowsum(dY * Y) into the workspace; P = exp(mask(Q K^T * scale) - lse);
 * dV = P^T dY; dS = P (dY V^T - D) * scale; dK = dS^T Q; dQ = dS K. */
static void build_backward(gb *g, const dims *d) {
    cudnnBackendDescriptor_t q = io(g, UID_Q, CUDNN_DATA_BFLOAT16, sh_q(d), "Q");
    cudnnBackendDescriptor_t kt = io(g, UID_K, CUDNN_DATA_BFLOAT16, sh_kvt(d), "K^T");
    cudnnBackendDescriptor_t vtr = io(g, UID_V, CUDNN_DATA_BFLOAT16, sh_kvt(d), "V^T");
    cudnnBackendDescriptor_t o = io(g, UID_O, CUDNN_DATA_BFLOAT16, sh_y(d), "Y");
    cudnnBackendDescriptor_t dO = io(g, UID_DO, CUDNN_DATA_BFLOAT16, sh_y(d), "dY");
    cudnnBackendDescriptor_t lse = io(g, UID_STATS, CUDNN_DATA_FLOAT, sh_row(d), "lse");
    cudnnBackendDescriptor_t dq = io(g, UID_DQ, CUDNN_DATA_BFLOAT16, sh_q(d), "dQ");
    cudnnBackendDescriptor_t dk = io(g, UID_DK, CUDNN_DATA_BFLOAT16, sh_kv(d), "dK");
    cudnnBackendDescriptor_t dv = io(g, UID_DV, CUDNN_DATA_BFLOAT16, sh_kv(d), "dV");
    cudnnBackendDescriptor_t dsum = io(g, UID_DSUM, CUDNN_DATA_FLOAT, sh_row(d), "D");
    cudnnBackendDescriptor_t scale = scalar(g, UID_SCALE, "scale");
    cudnnBackendDescriptor_t neg_inf = scalar(g, UID_NEG_INF, "-inf");
    cudnnBackendDescriptor_t one = scalar(g, UID_ONE, "one");
    const shape S = sh_s(d), row = sh_row(d);

    /* D (the frontend's layout for the product: heads inside rows) */
    const shape prod = shp(d->B, d->H, d->T, d->hs, d->H * d->T * d->hs, d->T * d->hs,
                           d->H * d->hs, 1);
    cudnnBackendDescriptor_t oy = pw_to(g, CUDNN_POINTWISE_MUL, dO, o, prod);
    cudnnBackendDescriptor_t rs = red_to(g, CUDNN_REDUCE_TENSOR_ADD, oy, row);
    pw(g, CUDNN_POINTWISE_MUL, rs, one, dsum);

    /* P and dV */
    cudnnBackendDescriptor_t s0 = mm_to(g, q, kt, S);
    cudnnBackendDescriptor_t s1 = pw_to(g, CUDNN_POINTWISE_MUL, s0, scale, S);
    cudnnBackendDescriptor_t s2 = pw_to(g, CUDNN_POINTWISE_SUB, s1, lse, S);
    cudnnBackendDescriptor_t s3 = causal(g, s2, neg_inf, S);
    cudnnBackendDescriptor_t p = pw_to(g, CUDNN_POINTWISE_EXP, s3, NULL, S);
    transposed_product(g, d, p, dO, dv);

    /* dS, dK, dQ */
    cudnnBackendDescriptor_t dp = mm_to(g, dO, vtr, S);
    cudnnBackendDescriptor_t t0 = pw_to(g, CUDNN_POINTWISE_SUB, dp, dsum, S);
    cudnnBackendDescriptor_t t1 = pw_to(g, CUDNN_POINTWISE_MUL, t0, p, S);
    cudnnBackendDescriptor_t ds = pw_to(g, CUDNN_POINTWISE_MUL, t1, scale, S);
    transposed_product(g, d, ds, q, dk);
    cudnnBackendDescriptor_t k = vt(g, CUDNN_DATA_FLOAT, sh_kv(d)); /* K again, untransposed */
    view(g, kt, k);
    mm(g, ds, k, dq);
}

/* ---- from a graph to an execution plan --------------------------------- */

/* 1 when cuDNN notes the engine of `cfg` as nondeterministic; its global
 * index in *index. Descriptors made here go to g (kept with the plan). */
static int engine_nondeterministic(gb *g, cudnnBackendDescriptor_t cfg, int64_t *index) {
    *index = -1;
    cudnnBackendDescriptor_t eng = gb_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
    if (!eng) return 0;
    int64_t n = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &eng) != CUDNN_STATUS_SUCCESS)
        return 0;
    (void)cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                   index);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t count = 0;
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count,
                                 notes) != CUDNN_STATUS_SUCCESS)
        return 0;
    for (int64_t i = 0; i < count && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return 1;
    return 0;
}

/* An execution plan for one engine configuration; NULL (traced) if cuDNN
 * cannot make one. */
static cudnnBackendDescriptor_t plan_try(gb *g, cudnnBackendDescriptor_t cfg, int64_t engine,
                                         int64_t *ws) {
    cudnnBackendDescriptor_t ex = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &ex);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(ex, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                     &g->ctx->handle);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(ex, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(ex);
    int64_t n = 0;
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendGetAttribute(ex, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, ws);
    if (s == CUDNN_STATUS_SUCCESS) return ex;
    char last[512];
    trace_add(g->ctx, "  engine %lld: no plan: %s%s%s", (long long)engine, cudnnGetErrorString(s),
              cudnn_last(last, sizeof last)[0] ? ": " : "", last);
    if (ex) cudnnBackendDestroyDescriptor(ex);
    return NULL;
}

/* The graph of g's operations, the heuristics' engine configurations (mode
 * A), and the first deterministic one cuDNN can make a plan of. */
static zpp_status plan_pick(gb *g, plan *p, const char *what) {
    zpp_attn_cudnn *c = g->ctx;
    cudnnBackendDescriptor_t graph = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    SET(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &c->handle);
    SET(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    gb_fin(g, graph, "operation graph");
    cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    SET(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    SET(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    gb_fin(g, heur, "heuristics");
    int64_t count = 0;
    if (g->st == CUDNN_STATUS_SUCCESS) {
        cudnnStatus_t s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
        if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, "get", "CUDNN_ATTR_ENGINEHEUR_RESULTS count");
    }
    if (g->st != CUDNN_STATUS_SUCCESS) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "attention (cuDNN %zu) %s: cuDNN refuses the graph at %s (the shape or this "
                 "GPU is not supported by its fused attention; keep our kernels)",
                 cudnnGetVersion(), what, g->where);
        return cudnn_error(ZPP_ERR_UNSUPPORTED, g->st, msg);
    }
    cudnnBackendDescriptor_t cfgs[64];
    if (count > 64) count = 64;
    for (int64_t i = 0; i < count; i++)
        cfgs[i] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    int64_t got = 0;
    if (g->st == CUDNN_STATUS_SUCCESS && count > 0) {
        cudnnStatus_t s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
        if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, "get", "CUDNN_ATTR_ENGINEHEUR_RESULTS");
    }
    int nondet = 0;
    for (int64_t i = 0; g->st == CUDNN_STATUS_SUCCESS && i < got; i++) {
        int64_t engine = -1;
        if (engine_nondeterministic(g, cfgs[i], &engine)) {
            trace_add(c, "  %s: engine %lld skipped: nondeterministic", what, (long long)engine);
            nondet++;
            continue;
        }
        p->exec = plan_try(g, cfgs[i], engine, &p->ws);
        if (!p->exec) continue;
        p->engine = engine;
        trace_add(c, "  %s: engine %lld (heuristics' choice %lld of %lld), workspace %lld bytes",
                  what, (long long)engine, (long long)i + 1, (long long)got, (long long)p->ws);
        return ZPP_OK;
    }
    if (g->st != CUDNN_STATUS_SUCCESS)
        return cudnn_error(ZPP_ERR_UNSUPPORTED, g->st, "attention (cuDNN): engine query failed");
    if (nondet > 0)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "attention (cuDNN %zu) %s: the only engines cuDNN offers (%d) are "
                         "nondeterministic, and the attention must give the same bits on every "
                         "run; keep our kernels",
                         cudnnGetVersion(), what, nondet);
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "attention (cuDNN %zu) %s: no engine of the %lld the heuristics named can run "
                     "this shape on this GPU (zpp_attn_cudnn_trace says why); keep our kernels",
                     cudnnGetVersion(), what, (long long)got);
}

static void plan_free(plan *p) {
    if (p->exec) cudnnBackendDestroyDescriptor(p->exec);
    for (int i = p->nkeep - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(p->keep[i]);
    free(p->keep);
    memset(p, 0, sizeof *p);
}

/* Builds one graph (forward or backward) for batch B and its plan. */
static zpp_status plan_build(zpp_attn_cudnn *c, int B, int backward, plan *p) {
    const char *what = backward ? "backward" : "forward";
    gb g;
    memset(&g, 0, sizeof g);
    g.ctx = c;
    g.st = CUDNN_STATUS_SUCCESS;
    g.next_uid = UID_VIRTUAL;
    const dims d = dims_of(c, B);
    trace_add(c, "%s B=%d T=%d H=%d KV=%d hs=%d:", what, B, c->T, c->H, c->KV, c->hs);
    if (backward)
        build_backward(&g, &d);
    else
        build_forward(&g, &d);
    zpp_status st = plan_pick(&g, p, what);
    if (st != ZPP_OK) {
        plan_free(p);
        gb_release(&g);
        return st;
    }
    p->keep = g.descs, p->nkeep = g.ndesc; /* the plan keeps what it was built from */
    return ZPP_OK;
}

/* ---- the context ------------------------------------------------------------ */

static void slot_free(batch_plans *b) {
    plan_free(&b->fwd);
    plan_free(&b->bwd);
    b->B = 0;
}

static zpp_status slot_build(zpp_attn_cudnn *c, int B, batch_plans *b) {
    memset(b, 0, sizeof *b);
    zpp_status st = plan_build(c, B, 0, &b->fwd);
    if (st == ZPP_OK) st = plan_build(c, B, 1, &b->bwd);
    if (st != ZPP_OK) {
        slot_free(b);
        return st;
    }
    b->B = B;
    return ZPP_OK;
}

static size_t slot_need(const zpp_attn_cudnn *c, const batch_plans *b) {
    int64_t ws = b->fwd.ws > b->bwd.ws ? b->fwd.ws : b->bwd.ws;
    return c->d_bytes + (size_t)ws;
}

/* The plans for batch B: made at create for B_max, on first use for a
 * smaller B (the slot least recently made is replaced when all are taken). */
static zpp_status plans_for(zpp_attn_cudnn *c, int B, batch_plans **out) {
    for (int i = 0; i < MAX_BATCHES; i++)
        if (c->slots[i].B == B) {
            *out = &c->slots[i];
            return ZPP_OK;
        }
    int i = 1;
    while (i < MAX_BATCHES && c->slots[i].B) i++;
    if (i == MAX_BATCHES) {
        i = MAX_BATCHES - 1;
        slot_free(&c->slots[i]);
    }
    c->trace_len = 0;
    c->trace[0] = '\0';
    ZPP_CHECK(slot_build(c, B, &c->slots[i]));
    if (slot_need(c, &c->slots[i]) > c->workspace) {
        size_t need = slot_need(c, &c->slots[i]);
        slot_free(&c->slots[i]);
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "attention (cuDNN): batch %d needs a workspace of %zu bytes, more than "
                         "the %zu of batch %d the context was made for",
                         B, need, c->workspace, c->B_max);
    }
    *out = &c->slots[i];
    return ZPP_OK;
}

static zpp_status check_shape(int B, int T, int H, int KV, int hs) {
    if (B < 1 || T < 1 || H < 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "attention (cuDNN): B = %d, T = %d, H = %d; each must be >= 1", B, T, H);
    if (KV < 1 || H % KV != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "attention (cuDNN): KV = %d key/value heads must be >= 1 and divide "
                         "H = %d (each serves H / KV query heads)",
                         KV, H);
    if (hs < 8 || hs > 256 || hs % 8 != 0)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "attention (cuDNN): head size %d is not supported (a multiple of 8 up "
                         "to 256: rows are read as 16-byte vectors)",
                         hs);
    return ZPP_OK;
}

static zpp_status check_ptr(const char *what, const char *name, const void *p, unsigned align) {
    if (!p) return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL", what, name);
    if ((uintptr_t)p % align)
        return zpp_error(ZPP_ERR_INVALID, "%s: %s at %p is not %u-byte aligned", what, name, p,
                         align);
    return ZPP_OK;
}

static zpp_status check_call(const zpp_attn_cudnn *c, int B, void *workspace, const char *what) {
    if (!c) return zpp_error(ZPP_ERR_INVALID, "%s: the context is NULL", what);
    if (B < 1 || B > c->B_max)
        return zpp_error(ZPP_ERR_INVALID, "%s: B = %d; the context was made for 1 .. %d", what,
                         B, c->B_max);
    return check_ptr(what, "workspace", workspace, 16);
}

zpp_status zpp_attn_cudnn_create(zpp_attn_cudnn **ctx_p, int B_max, int T, int H, int KV,
                                 int hs, void *stream, size_t *workspace_bytes) {
    create_trace[0] = '\0';
    if (!ctx_p || !workspace_bytes)
        return zpp_error(ZPP_ERR_INVALID, "attention (cuDNN): create: ctx_p or workspace_bytes "
                                          "is NULL");
    *ctx_p = NULL;
    *workspace_bytes = 0;
    ZPP_CHECK(check_shape(B_max, T, H, KV, hs));
    zpp_attn_cudnn *c = calloc(1, sizeof *c);
    if (!c) return zpp_error(ZPP_ERR_NOMEM, "attention (cuDNN): out of host memory");
    c->B_max = B_max, c->T = T, c->H = H, c->KV = KV, c->hs = hs;
    c->scale = 1.0f / sqrtf((float)hs);
    /* cuDNN before 9.10 wants the lowest finite float for a masked score */
    c->neg_inf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY;
    c->one = 1.0f;
    size_t d = (size_t)B_max * H * T * sizeof(float);
    c->d_bytes = (d + D_ALIGN - 1) / D_ALIGN * D_ALIGN;
    cudnnStatus_t s = cudnnCreate(&c->handle);
    if (s != CUDNN_STATUS_SUCCESS) {
        free(c);
        return cudnn_error(ZPP_ERR_CUDA, s,
                           "attention (cuDNN): cudnnCreate failed (no usable GPU, or cuDNN's "
                           "engine libraries are not found next to libcudnn.so)");
    }
    s = cudnnSetStream(c->handle, (cudaStream_t)stream);
    zpp_status st = ZPP_OK;
    if (s != CUDNN_STATUS_SUCCESS)
        st = cudnn_error(ZPP_ERR_CUDA, s, "attention (cuDNN): cudnnSetStream failed");
    if (st == ZPP_OK) st = slot_build(c, B_max, &c->slots[0]);
    if (st != ZPP_OK) {
        memcpy(create_trace, c->trace, sizeof create_trace);
        zpp_error_hold();
        zpp_attn_cudnn_free(c);
        zpp_error_release();
        return st;
    }
    c->workspace = slot_need(c, &c->slots[0]);
    *workspace_bytes = c->workspace;
    *ctx_p = c;
    return ZPP_OK;
}

/* Binds the tensors to memory (a variant pack) and runs the plan. */
static zpp_status plan_run(zpp_attn_cudnn *c, const plan *p, const int64_t *uids, void **ptrs,
                           int64_t n, void *ws, const char *what) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                     uids);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                     CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                     &ws);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(c->handle, p->exec, vp);
    zpp_status st = ZPP_OK;
    if (s != CUDNN_STATUS_SUCCESS) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s: cuDNN could not run engine %lld", what,
                 (long long)p->engine);
        st = cudnn_error(ZPP_ERR_CUDA, s, msg);
    }
    if (vp) cudnnBackendDestroyDescriptor(vp);
    return st;
}

zpp_status zpp_attn_cudnn_forward(zpp_attn_cudnn *ctx, void *y, float *lse, const void *qkv,
                                  int B, void *workspace) {
    const char *what = "attention forward (cuDNN)";
    ZPP_CHECK(check_call(ctx, B, workspace, what));
    ZPP_CHECK(check_ptr(what, "y", y, 16));
    ZPP_CHECK(check_ptr(what, "lse", lse, 4));
    ZPP_CHECK(check_ptr(what, "qkv", qkv, 16));
    batch_plans *bp = NULL;
    ZPP_CHECK(plans_for(ctx, B, &bp));
    const size_t C = (size_t)ctx->H * ctx->hs, Ck = (size_t)ctx->KV * ctx->hs;
    char *q = (char *)(uintptr_t)qkv;
    const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[] = {q, q + 2 * C, q + 2 * (C + Ck), y, lse, &ctx->scale, &ctx->neg_inf};
    return plan_run(ctx, &bp->fwd, uids, ptrs, 7, (char *)workspace + ctx->d_bytes, what);
}

zpp_status zpp_attn_cudnn_backward(zpp_attn_cudnn *ctx, void *dqkv, const void *dy,
                                   const void *qkv, const void *y, const float *lse, int B,
                                   void *workspace) {
    const char *what = "attention backward (cuDNN)";
    ZPP_CHECK(check_call(ctx, B, workspace, what));
    ZPP_CHECK(check_ptr(what, "dqkv", dqkv, 16));
    ZPP_CHECK(check_ptr(what, "dy", dy, 16));
    ZPP_CHECK(check_ptr(what, "qkv", qkv, 16));
    ZPP_CHECK(check_ptr(what, "y", y, 16));
    ZPP_CHECK(check_ptr(what, "lse", lse, 4));
    batch_plans *bp = NULL;
    ZPP_CHECK(plans_for(ctx, B, &bp));
    const size_t C = (size_t)ctx->H * ctx->hs, Ck = (size_t)ctx->KV * ctx->hs;
    char *q = (char *)(uintptr_t)qkv, *dq = dqkv;
    const int64_t uids[] = {UID_Q,  UID_K,  UID_V,  UID_O,     UID_DO,      UID_STATS, UID_DQ,
                            UID_DK, UID_DV, UID_DSUM, UID_SCALE, UID_NEG_INF, UID_ONE};
    void *ptrs[] = {q,
                    q + 2 * C,
                    q + 2 * (C + Ck),
                    (void *)(uintptr_t)y,
                    (void *)(uintptr_t)dy,
                    (void *)(uintptr_t)lse,
                    dq,
                    dq + 2 * C,
                    dq + 2 * (C + Ck),
                    workspace,
                    &ctx->scale,
                    &ctx->neg_inf,
                    &ctx->one};
    return plan_run(ctx, &bp->bwd, uids, ptrs, 13, (char *)workspace + ctx->d_bytes, what);
}

size_t zpp_attn_cudnn_workspace(const zpp_attn_cudnn *ctx) { return ctx ? ctx->workspace : 0; }

const char *zpp_attn_cudnn_trace(const zpp_attn_cudnn *ctx) {
    return ctx ? ctx->trace : create_trace;
}

void zpp_attn_cudnn_free(zpp_attn_cudnn *ctx) {
    if (!ctx) return;
    for (int i = 0; i < MAX_BATCHES; i++) slot_free(&ctx->slots[i]);
    if (ctx->handle) cudnnDestroy(ctx->handle);
    free(ctx);
}
