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
