/* model/family.c — the table of model families (family.h). A new family
 * adds one row: its name and its factory, which takes the generic shape. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/family.h"
#include "model/gpt2.h"
#include "model/llama.h"

typedef struct model_family {
    const char *name;
    zpp_model_factory create;
} model_family;

static const model_family kFamilies[] = {
    {"gpt2", zpp_gpt2_family_create},
    {"llama", zpp_llama_family_create},
};
#define N_FAMILIES (sizeof kFamilies / sizeof kFamilies[0])

/* "gpt2, llama, ...": the registered names, for the message that refuses
 * another. Cut to the buffer (n >= 1), which is ample for a handful. */
static void family_names(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_FAMILIES && used + 1 < n; i++) {
        const char *sep = i ? ", " : "";
        int k = snprintf(buf + used, n - used, "%s%s", sep, kFamilies[i].name);
        if (k < 0) break;
        used += (size_t)k;
    }
}

zpp_status zpp_model_family_create(const char *family, const zpp_decoder_shape *shape,
                                   zpp_dtype param_dtype, int max_batch, zpp_device *dev,
                                   zpp_model **model_p) {
    if (!shape || !model_p)
        return zpp_error(ZPP_ERR_INVALID, "model create: shape or model_p is NULL");
    for (size_t i = 0; family && i < N_FAMILIES; i++)
        if (strcmp(family, kFamilies[i].name) == 0)
            return kFamilies[i].create(shape, param_dtype, max_batch, dev, model_p);
    char names[256];
    family_names(names, sizeof names);
    return zpp_error(ZPP_ERR_CONFIG, "model create: model family '%s' is unknown; use one of: %s",
                     family ? family : "(null)", names);
}

void zpp_decoder_shape_knobs(const zpp_decoder_shape *s, const char *keys[ZPP_DECODER_KNOBS],
                             double values[ZPP_DECODER_KNOBS]) {
    const char *k[ZPP_DECODER_KNOBS] = {
        "model.n_kv_head",   "model.n_ffn",       "model.rope_theta",
        "model.norm_eps",    "model.untied_head", "model.qkv_bias",
        "model.o_bias",      "model.rope_factor", "model.rope_low_freq_factor", "model.rope_high_freq_factor",
        "model.rope_original_max_pos"};
    const double v[ZPP_DECODER_KNOBS] = {
        s->n_kv_head,   s->n_ffn,    s->rope_theta,  s->norm_eps,
        s->untied_head, s->qkv_bias, s->o_bias, s->rope_factor, s->rope_low_freq_factor,
        s->rope_high_freq_factor,    s->rope_original_max_pos};
    for (int i = 0; i < ZPP_DECODER_KNOBS; i++) keys[i] = k[i], values[i] = v[i];
}
