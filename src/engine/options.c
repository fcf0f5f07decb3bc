/* engine/options.c — the defaults and the range checks of the engine's
 * options, expanded from their one table (engine/options.h). */
#include "engine/options.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine.h"

zpp_engine_opts zpp_engine_opts_default(void) {
    zpp_engine_opts o;
    memset(&o, 0, sizeof o);
    o.gather = ZPP_GATHER_BASELINE;
    o.hpz = 0;
    o.reduce = ZPP_REDUCE_BASELINE;
    o.coll = zpp_coll_opts_default();
#define ZPP_EOPT_SET_(name, type, def, check, lo, hi, when, range) o.name = (type)(def);
    ZPP_ENGINE_OPTIONS(ZPP_EOPT_SET_)
#undef ZPP_EOPT_SET_
    return o;
}

/* The table's range tests (its `check` column). */
typedef enum check_kind {
    CHECK_ANY,
    CHECK_INT,
    CHECK_GE,
    CHECK_GT,
    CHECK_UNIT,
    CHECK_IN
} check_kind;

/* Whether v passes a test of the table. */
static int in_range(check_kind check, double v, double lo, double hi) {
    if (check == CHECK_ANY) return 1;
    if (!isfinite(v)) return 0;
    switch (check) {
    case CHECK_GE: return v >= lo;
    case CHECK_GT: return v > lo && v <= hi;
    case CHECK_UNIT: return v >= lo && v < hi;
    default: return v >= lo && v <= hi; /* INT, IN */
    }
}

typedef struct option_row {
    const char *name;
    check_kind check;
    const char *range;
    double lo, hi;
} option_row;

static const option_row kOptions[ZPP_EOPT_COUNT] = {
#define ZPP_EOPT_ROW_(name, type, def, check, lo, hi, when, range)                              \
    {#name, CHECK_##check, range, (double)(lo), (double)(hi)},
    ZPP_ENGINE_OPTIONS(ZPP_EOPT_ROW_)
#undef ZPP_EOPT_ROW_
};

zpp_status zpp_engine_opt_check(zpp_engine_opt_id id, double v, const char *key) {
    if ((int)id < 0 || id >= ZPP_EOPT_COUNT)
        return zpp_error(ZPP_ERR_INVALID, "engine: option %d does not exist", (int)id);
    const option_row *r = &kOptions[id];
    if (in_range(r->check, v, r->lo, r->hi)) return ZPP_OK;
    char ints[64];
    const char *range = r->range;
    if (r->check == CHECK_INT) {
        snprintf(ints, sizeof ints, "in [%.0f, %.0f]", r->lo, r->hi);
        range = ints;
    }
    if (key) return zpp_error(ZPP_ERR_CONFIG, "'%s' must be %s, got %g", key, range, v);
    return zpp_error(ZPP_ERR_INVALID, "engine: %s %g must be %s", r->name, v, range);
}

zpp_status zpp_engine_opts_check(const zpp_engine_opts *o) {
    if (o->work_dtype != ZPP_BF16 && o->work_dtype != ZPP_FP16 && o->work_dtype != ZPP_FP32)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: working dtype must be bf16, fp16 or fp32, not %s",
                         zpp_dtype_name(o->work_dtype));
    /* Each option's range, where it applies: the scaler's only for the
     * dynamic scaler, error feedback's only with it on. */
    const int ALWAYS = 1, DYNAMIC = o->loss_scale == 0.0f, LOCO = o->loco != 0;
    (void)ALWAYS, (void)DYNAMIC, (void)LOCO;
#define ZPP_EOPT_CHECK_(name, type, def, check, lo, hi, when, range)                            \
    if (when) ZPP_CHECK(zpp_engine_opt_check(ZPP_EOPT_ID_##name, (double)o->name, NULL));
    ZPP_ENGINE_OPTIONS(ZPP_EOPT_CHECK_)
#undef ZPP_EOPT_CHECK_
    if (o->loco && o->reduce != ZPP_REDUCE_QGZ)
        return zpp_error(ZPP_ERR_INVALID,
                         "engine: error feedback (zeropp_loco_param) corrects qgZ's "
                         "quantization; enable zero_quantized_gradients or drop it");
    return ZPP_OK;
}
