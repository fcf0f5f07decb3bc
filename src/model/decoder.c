/* model/decoder.c — the call protocol and the activation arena every
 * model shares (decoder.h). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/decoder.h"

/* ------------------------------------------------------------------------ */
/* The call protocol                                                         */
/* ------------------------------------------------------------------------ */

zpp_status zpp_decoder_check_create(zpp_dtype param_dtype, int max_batch, int seq_len,
                                    const char *who) {
    if (param_dtype != ZPP_FP32 && param_dtype != ZPP_BF16 && param_dtype != ZPP_FP16)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s create: param dtype %d is not a dtype; use fp32, bf16 or fp16",
                         who, (int)param_dtype);
    if (max_batch < 1 || max_batch > INT32_MAX / seq_len)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s create: max_batch %d is out of range; use 1..%d for seq_len %d",
                         who, max_batch, INT32_MAX / seq_len, seq_len);
    return ZPP_OK;
}

zpp_status zpp_decoder_check_batch(const zpp_model *m, const int32_t *tokens,
                                   const int32_t *targets, int B, const char *who) {
    int T = m->seq_len, V = m->vocab_size, Vr = m->real_vocab_size;
    if (B < 1 || B > m->max_batch)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s set_batch: batch %d is outside 1..%d (the max_batch the model "
                         "was created for)", who, B, m->max_batch);
    if (!tokens) return zpp_error(ZPP_ERR_INVALID, "%s set_batch: tokens is NULL", who);
    size_t n = (size_t)B * T;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return zpp_error(ZPP_ERR_INVALID,
                             "%s set_batch: token %d at position %zu (sequence %zu, "
                             "offset %zu) is outside the vocabulary 0..%d",
                             who, (int)tokens[i], i, i / T, i % T, V - 1);
        /* a target must be a column the softmax runs over */
        if (targets && (targets[i] < 0 || targets[i] >= Vr))
            return zpp_error(ZPP_ERR_INVALID,
                             "%s set_batch: target %d at position %zu (sequence %zu, "
                             "offset %zu) is outside the vocabulary 0..%d",
                             who, (int)targets[i], i, i / T, i % T, Vr - 1);
    }
    return ZPP_OK;
}

void zpp_decoder_calls_new_batch(zpp_decoder_calls *c, int B, int have_targets) {
    c->B = B;
    c->have_batch = 1;
    c->have_targets = have_targets;
    c->fwd_next = 0;
    c->bwd_next = -1;
    c->kept = 0;
}

zpp_status zpp_decoder_check_forward(const zpp_model *m, const zpp_decoder_calls *c, int stage,
                                     const void *params, const char *who) {
    int S = m->n_stages;
    if (stage < 0 || stage >= S)
        return zpp_error(ZPP_ERR_INVALID, "%s forward: stage %d does not exist; use 0..%d",
                         who, stage, S - 1);
    if (!c->have_batch)
        return zpp_error(ZPP_ERR_STATE, "%s forward: no batch; call set_batch first", who);
    if (stage != 0 && stage != c->fwd_next)
        return zpp_error(ZPP_ERR_STATE,
                         "%s forward: stage %d out of order (expected %d); run the stages "
                         "0..%d in order", who, stage, c->fwd_next, S - 1);
    if (!params) return zpp_error(ZPP_ERR_INVALID, "%s forward: params is NULL", who);
    return ZPP_OK;
}

zpp_status zpp_decoder_check_backward(const zpp_model *m, const zpp_decoder_calls *c, int stage,
                                      const void *params, const void *grads, const char *who) {
    int S = m->n_stages;
    if (stage < 0 || stage >= S)
        return zpp_error(ZPP_ERR_INVALID, "%s backward: stage %d does not exist; use 0..%d",
                         who, stage, S - 1);
    if (stage != c->bwd_next || c->bwd_next < 0)
        return zpp_error(ZPP_ERR_STATE,
                         "%s backward: stage %d out of order (expected %d); run forward "
                         "through stage %d, then backward from %d down to 0", who, stage,
                         c->bwd_next, S - 1, S - 1);
    if (stage == S - 1 && !c->have_targets)
        return zpp_error(ZPP_ERR_STATE,
                         "%s backward: the batch has no targets; pass targets to set_batch",
                         who);
    /* Stage 0's backward (the embedding scatter) reads no parameters, so
     * params may be NULL there (bwd_reads_params): the engine skips that
     * gather. */
    if ((!params && m->bwd_reads_params[stage]) || !grads)
        return zpp_error(ZPP_ERR_INVALID, "%s backward: params or grads is NULL", who);
    return ZPP_OK;
}

zpp_status zpp_decoder_keep_logits(const zpp_model *m, zpp_decoder_calls *c, int row,
                                   const char *who) {
    const long long rows = (long long)m->max_batch * m->seq_len;
    if (row < -1 || row >= rows)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s keep_logits: row %d is outside 0..%lld (max_batch %d x seq_len "
                         "%d), or -1 for none", who, row, rows - 1, m->max_batch, m->seq_len);
    c->keep_row = row;
    c->kept = 0;
    return ZPP_OK;
}

zpp_status zpp_decoder_check_logits(const zpp_model *m, const zpp_decoder_calls *c,
                                    const float *out, const char *who) {
    if (!out) return zpp_error(ZPP_ERR_INVALID, "%s logits: out is NULL", who);
    if (c->keep_row < 0)
        return zpp_error(ZPP_ERR_STATE,
                         "%s logits: no row kept; call keep_logits(row) before the forward", who);
    if (!c->kept)
        return zpp_error(ZPP_ERR_STATE,
                         "%s logits: the last forward kept no logits of row %d; run a forward "
                         "through its last stage (%d) on a batch of more than %d rows",
                         who, c->keep_row, m->n_stages - 1, c->keep_row);
    return ZPP_OK;
}

zpp_status zpp_decoder_logits_host(const zpp_model *m, const zpp_decoder_calls *c,
                                   const float *kept, float *out, const char *who) {
    ZPP_CHECK(zpp_decoder_check_logits(m, c, out, who));
    memcpy(out, kept, (size_t)m->vocab_size * sizeof(float));
    return ZPP_OK;
}

int zpp_decoder_kept_in(const zpp_decoder_calls *c, int seq_len, int r0, int rows) {
    const long long n = (long long)c->B * seq_len;
    if (c->keep_row < r0 || c->keep_row >= r0 + rows || c->keep_row >= n) return -1;
    return c->keep_row - r0;
}

/* ------------------------------------------------------------------------ */
/* The activation arena                                                      */
/* ------------------------------------------------------------------------ */

zpp_status zpp_decoder_tables_make(int n_layer, const char *who, zpp_decoder_tables *t) {
    const size_t L = (size_t)n_layer;
    t->unit_numel = calloc(L + 1, sizeof *t->unit_numel);
    t->stage_unit = calloc(L + 2, sizeof *t->stage_unit);
    t->bwd_reads_params = calloc(L + 2, 1);
    t->n_matrix_ranges = calloc(L + 1, sizeof *t->n_matrix_ranges);
    t->matrix_ranges = calloc(L + 1, sizeof *t->matrix_ranges);
    if (!t->unit_numel || !t->stage_unit || !t->bwd_reads_params || !t->n_matrix_ranges ||
        !t->matrix_ranges) {
        zpp_decoder_tables_free(t);
        return zpp_error(ZPP_ERR_NOMEM, "%s: out of host memory", who);
    }
    for (int k = 1; k <= n_layer; k++) t->stage_unit[k] = k;
    t->stage_unit[0] = t->stage_unit[n_layer + 1] = 0;
    for (int k = 1; k <= n_layer + 1; k++) t->bwd_reads_params[k] = 1;
    return ZPP_OK;
}

void zpp_decoder_tables_free(zpp_decoder_tables *t) {
    free(t->unit_numel);
    free(t->stage_unit);
    free(t->bwd_reads_params);
    free(t->n_matrix_ranges);
    free(t->matrix_ranges);
    t->unit_numel = NULL;
    t->stage_unit = NULL;
    t->bwd_reads_params = NULL;
    t->n_matrix_ranges = NULL;
    t->matrix_ranges = NULL;
}

void zpp_decoder_base_fill(zpp_model *base, const zpp_decoder_tables *t, int n_layer,
                           zpp_dtype param_dtype, int max_batch, int seq_len, int vocab_size,
                           int real_vocab_size) {
    base->param_dtype = param_dtype;
    base->n_units = n_layer + 1;
    base->unit_numel = t->unit_numel;
    base->n_stages = n_layer + 2;
    base->stage_unit = t->stage_unit;
    base->bwd_reads_params = t->bwd_reads_params;
    base->seq_len = seq_len;
    base->vocab_size = vocab_size;
    base->real_vocab_size = real_vocab_size;
    base->max_batch = max_batch;
    base->n_matrix_ranges = t->n_matrix_ranges;
    base->matrix_ranges = (const zpp_elem_range *const *)t->matrix_ranges;
}
