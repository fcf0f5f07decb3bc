/* train/hf_config.c — a Hugging Face Llama-family config.json (hf_config.h). */
#include "train/hf_config.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"
#include "train/json_exact.h"

#define CONFIG_MAX_BYTES (1u << 20) /* a config.json is a few KB */

/* The architectures this reader maps (hf_config.h), by zpp_hf_arch, with
 * the model_type transformers writes beside each. */
static const struct {
    const char *name, *model_type;
} archs[ZPP_HF_N_ARCH] = {[ZPP_HF_LLAMA] = {"LlamaForCausalLM", "llama"},
                          [ZPP_HF_MISTRAL] = {"MistralForCausalLM", "mistral"},
                          [ZPP_HF_QWEN2] = {"Qwen2ForCausalLM", "qwen2"}};

const char *zpp_hf_arch_name(zpp_hf_arch a) {
    return (unsigned)a < ZPP_HF_N_ARCH ? archs[a].name : "(unknown)";
}

int zpp_hf_arch_parse(const char *name, zpp_hf_arch *a) {
    for (int i = 0; name && i < ZPP_HF_N_ARCH; i++)
        if (!strcmp(name, archs[i].name)) {
            *a = (zpp_hf_arch)i;
            return 1;
        }
    return 0;
}

zpp_hf_arch zpp_hf_config_arch(const zpp_hf_config *c) {
    zpp_hf_arch a = ZPP_HF_LLAMA;
    zpp_hf_arch_parse(c->architecture, &a);
    return a;
}

void zpp_hf_biases(const zpp_hf_config *c, int *qkv_bias_p, int *o_bias_p) {
    const zpp_hf_arch a = zpp_hf_config_arch(c);
    *qkv_bias_p = a == ZPP_HF_QWEN2 || (a == ZPP_HF_LLAMA && c->attention_bias);
    *o_bias_p = a == ZPP_HF_LLAMA && c->attention_bias;
}

zpp_status zpp_hf_check_seq_len(const zpp_hf_config *c, int seq_len, const char *what) {
    if (zpp_hf_config_arch(c) != ZPP_HF_MISTRAL || !c->sliding_window ||
        seq_len <= c->sliding_window)
        return ZPP_OK;
    return zpp_error(ZPP_ERR_CONFIG,
                     "%s: sliding_window %d is shorter than the run's %d-token sequences; zeropp "
                     "has no sliding-window attention, so set model.seq_len to at most %d",
                     what, c->sliding_window, seq_len, c->sliding_window);
}

/* ---- The plain fields: ints, doubles, booleans --------------------------------- */

enum { F_INT, F_DOUBLE, F_BOOL };

typedef struct field {
    const char *key;
    int type;
    size_t offset; /* in zpp_hf_config */
    int required;
} field;

#define FIELD(key, type, required) {#key, type, offsetof(zpp_hf_config, key), required}
static const field fields[] = {
    FIELD(hidden_size, F_INT, 1),
    FIELD(intermediate_size, F_INT, 1),
    FIELD(num_hidden_layers, F_INT, 1),
    FIELD(num_attention_heads, F_INT, 1),
    FIELD(num_key_value_heads, F_INT, 0),
    FIELD(head_dim, F_INT, 0),
    FIELD(vocab_size, F_INT, 1),
    FIELD(max_position_embeddings, F_INT, 0),
    FIELD(rms_norm_eps, F_DOUBLE, 0),
    FIELD(rope_theta, F_DOUBLE, 0),
    FIELD(tie_word_embeddings, F_BOOL, 0),
    FIELD(attention_bias, F_BOOL, 0),
};
#undef FIELD
enum { N_FIELDS = sizeof fields / sizeof fields[0] };

/* Keys handled one by one below (the parse functions name them). */
static const char *const special_keys[] = {"architectures", "rope_scaling", "torch_dtype",
                                           "dtype",         "bos_token_id", "eos_token_id",
                                           "model_type"};

/* Keys that must hold one value, the one this model computes with: a
 * string, a boolean false or the number 0. rope_interleaved (SmolLM's
 * configs) false is HF's rotate-half pairing (i, i + head_dim / 2). */
static const struct {
    const char *key, *string;
} fixed_keys[] = {{"hidden_act", "silu"},
                  {"mlp_bias", NULL},
                  {"attention_dropout", NULL},
                  {"rope_interleaved", NULL}};

/* Bookkeeping that does not change the math: accepted and ignored.
 * pretraining_tp > 1 only splits transformers' matmuls into slices of the
 * same sum. */
static const char *const ignored_keys[] = {
    "_name_or_path", "transformers_version", "initializer_range", "use_cache",
    "pad_token_id",  "pretraining_tp",       "output_attentions", "output_hidden_states",
    "is_llama_config"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int in_list(const char *key, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i])) return 1;
    return 0;
}

/* A JSON integer within int's range. */
static int json_int(const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v)) return 0;
    const double d = v->valuedouble;
    if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != floor(d)) return 0;
    *out = (int)d;
    return 1;
}

static zpp_status parse_field(const cJSON *v, const field *f, const char *what,
                              zpp_hf_config *cfg) {
    void *p = (char *)cfg + f->offset;
    int ok = 0;
    if (f->type == F_INT) ok = json_int(v, p);
    else if (f->type == F_DOUBLE && cJSON_IsNumber(v)) ok = 1, *(double *)p = v->valuedouble;
    else if (f->type == F_BOOL && cJSON_IsBool(v)) ok = 1, *(int *)p = cJSON_IsTrue(v);
    if (!ok)
        return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"%s\" is not %s", what, f->key,
                         f->type == F_INT      ? "an integer"
                         : f->type == F_DOUBLE ? "a number"
                                               : "true or false");
    return ZPP_OK;
}

/* ---- The special keys ---------------------------------------------------------- */

static zpp_status parse_architectures(const cJSON *v, const char *what, zpp_hf_config *cfg) {
    const cJSON *a = cJSON_GetArrayItem(v, 0);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1 || !cJSON_IsString(a))
        return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"architectures\" is not a list of one "
                                         "name",
                         what);
    zpp_hf_arch arch;
    if (!zpp_hf_arch_parse(a->valuestring, &arch))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': architecture '%s' is not supported; "
                                         "zeropp reads LlamaForCausalLM, MistralForCausalLM and "
                                         "Qwen2ForCausalLM",
                         what, a->valuestring);
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", a->valuestring);
    return ZPP_OK;
}

/* null, {"rope_type": "default"}, or Llama 3.1's llama3 scaling with its
 * four numbers. */
static zpp_status parse_rope_scaling(const cJSON *v, const char *what, zpp_hf_config *cfg) {
    zpp_hf_rope_scaling *r = &cfg->rope_scaling;
    memset(r, 0, sizeof *r);
    if (cJSON_IsNull(v)) return ZPP_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(v, "type"); /* the older name */
    if (!cJSON_IsObject(v) || !cJSON_IsString(type))
        return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"rope_scaling\" is not null or an "
                                         "object with a \"rope_type\"",
                         what);
    if (!strcmp(type->valuestring, "default")) return ZPP_OK; /* no scaling */
    if (strcmp(type->valuestring, "llama3"))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': rope_scaling type '%s' is not supported; "
                                         "zeropp implements llama3 (or none)",
                         what, type->valuestring);
    const struct {
        const char *key;
        double *d;
        int *i;
    } k[] = {{"factor", &r->factor, NULL},
             {"low_freq_factor", &r->low_freq_factor, NULL},
             {"high_freq_factor", &r->high_freq_factor, NULL},
             {"original_max_position_embeddings", NULL, &r->original_max_position_embeddings}};
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        size_t j = 0;
        while (j < COUNT(k) && strcmp(e->string, k[j].key)) j++;
        if (j == COUNT(k) && strcmp(e->string, "rope_type") && strcmp(e->string, "type"))
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': unknown key rope_scaling.%s", what,
                             e->string);
    }
    for (size_t j = 0; j < COUNT(k); j++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, k[j].key);
        const int ok = k[j].i ? json_int(x, k[j].i) : cJSON_IsNumber(x);
        if (!ok)
            return zpp_error(ZPP_ERR_FORMAT, "config '%s': rope_scaling.%s is %s", what,
                             k[j].key, x ? "not a number" : "missing (llama3 needs it)");
        if (k[j].d) *k[j].d = x->valuedouble;
    }
    r->llama3 = 1;
    return ZPP_OK;
}

static zpp_status parse_dtype(const cJSON *v, const char *key, const char *what,
                              zpp_hf_config *cfg) {
    static const struct {
        const char *name;
        zpp_dtype dtype;
    } d[] = {{"float32", ZPP_FP32}, {"bfloat16", ZPP_BF16}, {"float16", ZPP_FP16}};
    for (size_t i = 0; i < COUNT(d) && cJSON_IsString(v); i++)
        if (!strcmp(v->valuestring, d[i].name)) {
            cfg->torch_dtype = d[i].dtype;
            return ZPP_OK;
        }
    return zpp_error(ZPP_ERR_CONFIG, "config '%s': %s '%s' is not float32, bfloat16 or float16",
                     what, key, cJSON_IsString(v) ? v->valuestring : "(not a string)");
}

/* bos_token_id: an int or null; eos_token_id: an int, a list of ints, or
 * null. */
static zpp_status parse_token_ids(const cJSON *j, const char *what, zpp_hf_config *cfg) {
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(j, "bos_token_id");
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    cfg->bos_token_id = -1;
    if (bos && !cJSON_IsNull(bos) && !json_int(bos, &cfg->bos_token_id))
        return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"bos_token_id\" is not an integer", what);
    if (!eos || cJSON_IsNull(eos)) return ZPP_OK;
    cfg->eos_is_list = cJSON_IsArray(eos);
    const int n = cfg->eos_is_list ? cJSON_GetArraySize(eos) : 1;
    if (n < 1 || n > ZPP_HF_MAX_EOS)
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': \"eos_token_id\" lists %d ids; give 1 to "
                                         "%d",
                         what, n, ZPP_HF_MAX_EOS);
    for (int i = 0; i < n; i++)
        if (!json_int(cfg->eos_is_list ? cJSON_GetArrayItem(eos, i) : eos,
                      &cfg->eos_token_id[i]))
            return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"eos_token_id\" is not an integer or "
                                             "a list of them",
                             what);
    cfg->n_eos = n;
    return ZPP_OK;
}

/* Whether parse_keys saw the field `key` (with a value, not null). */
static int seen_key(const int *seen, const char *key) {
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!strcmp(fields[i].key, key)) return seen[i];
    return 0;
}

/* A key of fixed_keys holding its one value. */
static zpp_status parse_fixed(const cJSON *v, size_t i, const char *what) {
    const char *want = fixed_keys[i].string;
    const int ok = want ? cJSON_IsString(v) && !strcmp(v->valuestring, want)
                        : cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0);
    if (!ok)
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': %s must be %s%s%s for this model", what,
                         fixed_keys[i].key, want ? "\"" : "", want ? want : "false (or 0)",
                         want ? "\"" : "");
    return ZPP_OK;
}

/* "layer_types": a list of "full_attention", one a layer (its length is
 * checked against num_hidden_layers in zpp_hf_config_parse); any other
 * kind (Qwen2's "sliding_attention") is refused, naming the layer. */
static zpp_status parse_layer_types(const cJSON *e, const char *what) {
    if (!cJSON_IsArray(e))
        return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"layer_types\" is not a list", what);
    int l = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, e) {
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "full_attention"))
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': layer_types[%d] is %s%s%s; zeropp has "
                                             "only full attention (\"full_attention\")",
                             what, l, cJSON_IsString(t) ? "\"" : "",
                             cJSON_IsString(t) ? t->valuestring : "not a string",
                             cJSON_IsString(t) ? "\"" : "");
        l++;
    }
    return ZPP_OK;
}

/* The keys that differ by architecture (hf_config.h): model_type, Llama's
 * attention_bias, Mistral's and Qwen2's sliding-window keys; *handled is 1
 * when `e` is one of them (cfg->architecture is already read). */
static zpp_status parse_arch_key(const cJSON *e, const char *what, zpp_hf_config *cfg,
                                 int *handled) {
    const zpp_hf_arch a = zpp_hf_config_arch(cfg);
    const char *key = e->string, *name = archs[a].name;
    *handled = 1;
    if (!strcmp(key, "model_type")) {
        if (!cJSON_IsString(e) || strcmp(e->valuestring, archs[a].model_type))
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': model_type must be \"%s\" for %s",
                             what, archs[a].model_type, name);
        return ZPP_OK;
    }
    if (a != ZPP_HF_LLAMA && !strcmp(key, "attention_bias"))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': attention_bias is not a key of %s (%s); "
                                         "remove it",
                         what, name, a == ZPP_HF_QWEN2 ? "q, k and v always have biases, o none"
                                                       : "it has no biases");
    if (a != ZPP_HF_LLAMA && !strcmp(key, "sliding_window")) {
        cfg->sliding_window = 0; /* null: none */
        if (!cJSON_IsNull(e) && (!json_int(e, &cfg->sliding_window) || cfg->sliding_window < 1))
            return zpp_error(ZPP_ERR_FORMAT, "config '%s': \"sliding_window\" is not null or a "
                                             "positive integer",
                             what);
        return ZPP_OK;
    }
    if (a == ZPP_HF_QWEN2 && !strcmp(key, "use_sliding_window")) {
        if (!cJSON_IsFalse(e))
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': use_sliding_window must be false; "
                                             "zeropp has no sliding-window attention",
                             what);
        return ZPP_OK;
    }
    /* the layers past which Qwen2 slides its window: none when it does not */
    if (a == ZPP_HF_QWEN2 && !strcmp(key, "max_window_layers")) return ZPP_OK;
    /* newer transformers write each layer's attention kind (Qwen2 among
     * them): read when every layer attends to the whole sequence */
    if (!strcmp(key, "layer_types")) return parse_layer_types(e, what);
    *handled = 0;
    return ZPP_OK;
}

/* Every key of the object, each to its parser; an unknown one refused. */
static zpp_status parse_keys(const cJSON *j, const char *what, zpp_hf_config *cfg, int *seen) {
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        const char *key = e->string;
        int handled = 0;
        ZPP_CHECK(parse_arch_key(e, what, cfg, &handled));
        if (handled) continue;
        size_t i = 0;
        while (i < N_FIELDS && strcmp(key, fields[i].key)) i++;
        if (i < N_FIELDS) {
            seen[i] = !cJSON_IsNull(e) || fields[i].required; /* null: the default */
            if (seen[i]) ZPP_CHECK(parse_field(e, &fields[i], what, cfg));
            continue;
        }
        for (i = 0; i < COUNT(fixed_keys) && strcmp(key, fixed_keys[i].key); i++) continue;
        if (i < COUNT(fixed_keys)) {
            ZPP_CHECK(parse_fixed(e, i, what));
            continue;
        }
        if (!strcmp(key, "rope_scaling")) ZPP_CHECK(parse_rope_scaling(e, what, cfg));
        else if (!strcmp(key, "torch_dtype") || !strcmp(key, "dtype")) {
            if (!cJSON_IsNull(e)) ZPP_CHECK(parse_dtype(e, key, what, cfg));
        } else if (!in_list(key, special_keys, COUNT(special_keys)) &&
                   !in_list(key, ignored_keys, COUNT(ignored_keys)))
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': unknown key \"%s\"; zeropp reads "
                                             "Llama-family configs (hf_config.h lists the keys)",
                             what, key);
    }
    return ZPP_OK;
}

zpp_status zpp_hf_config_parse(const char *text, const char *what, zpp_hf_config *cfg_p) {
    if (!text || !what || !cfg_p)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_config_parse: NULL argument");
    cJSON *j = cJSON_Parse(text);
    zpp_hf_config cfg = {.max_position_embeddings = 2048, /* LlamaConfig's defaults */
                         .rms_norm_eps = 1e-6,
                         .rope_theta = 10000.0,
                         .torch_dtype = ZPP_FP32,
                         .bos_token_id = -1};
    int seen[N_FIELDS] = {0};
    zpp_status st = ZPP_OK;
    if (!cJSON_IsObject(j)) {
        st = zpp_error(ZPP_ERR_FORMAT, "config '%s' is not a JSON object", what);
        goto out;
    }
    /* the architecture first: which keys the others may be depends on it */
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    if (!arch) {
        st = zpp_error(ZPP_ERR_FORMAT, "config '%s': \"architectures\" is missing; a Llama "
                                       "config names LlamaForCausalLM",
                       what);
        goto out;
    }
    ZPP_CHECK_GOTO(parse_architectures(arch, what, &cfg), st, out);
    ZPP_CHECK_GOTO(parse_keys(j, what, &cfg, seen), st, out);
    ZPP_CHECK_GOTO(parse_token_ids(j, what, &cfg), st, out);
    for (size_t i = 0; i < N_FIELDS; i++)
        if (fields[i].required && !seen[i]) {
            st = zpp_error(ZPP_ERR_FORMAT, "config '%s': \"%s\" is missing", what, fields[i].key);
            goto out;
        }
    if (!seen_key(seen, "num_key_value_heads")) /* absent: no grouping */
        cfg.num_key_value_heads = cfg.num_attention_heads;
    if (!seen_key(seen, "head_dim") && cfg.num_attention_heads > 0) {
        if (cfg.hidden_size % cfg.num_attention_heads) {
            st = zpp_error(ZPP_ERR_CONFIG, "config '%s': num_attention_heads %d does not divide "
                                           "hidden_size %d, and head_dim is not given",
                           what, cfg.num_attention_heads, cfg.hidden_size);
            goto out;
        }
        cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
    }
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (types && cJSON_GetArraySize(types) != cfg.num_hidden_layers) {
        st = zpp_error(ZPP_ERR_CONFIG, "config '%s': layer_types lists %d layers, "
                                       "num_hidden_layers is %d",
                       what, cJSON_GetArraySize(types), cfg.num_hidden_layers);
        goto out;
    }
    ZPP_CHECK_GOTO(zpp_hf_config_check(&cfg, what), st, out);
    *cfg_p = cfg;
out:
    cJSON_Delete(j);
    return st;
}

zpp_status zpp_hf_config_check(const zpp_hf_config *c, const char *what) {
    if (!c || !what) return zpp_error(ZPP_ERR_INVALID, "zpp_hf_config_check: NULL argument");
    zpp_hf_arch arch;
    if (!zpp_hf_arch_parse(c->architecture, &arch))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': architecture '%s' is not supported; "
                                         "zeropp reads LlamaForCausalLM, MistralForCausalLM and "
                                         "Qwen2ForCausalLM",
                         what, c->architecture);
    if (arch != ZPP_HF_LLAMA && c->attention_bias)
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': %s has no attention_bias (its biases are "
                                         "fixed); leave it 0", what, c->architecture);
    if (c->sliding_window < 0 || (arch == ZPP_HF_LLAMA && c->sliding_window))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': sliding_window %d: %s", what,
                         c->sliding_window, arch == ZPP_HF_LLAMA ? "LlamaForCausalLM has none"
                                                                 : "negative; 0 is null");
    for (size_t i = 0; i < N_FIELDS; i++) {
        const void *p = (const char *)c + fields[i].offset;
        const int bad = fields[i].type == F_INT      ? *(const int *)p < 1
                        : fields[i].type == F_DOUBLE ? !(*(const double *)p > 0 &&
                                                         isfinite(*(const double *)p))
                                                     : 0;
        if (bad)
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': %s must be positive", what,
                             fields[i].key);
    }
    if (c->num_attention_heads % c->num_key_value_heads)
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': num_key_value_heads %d does not divide "
                                         "num_attention_heads %d (each K/V head serves a whole "
                                         "group of query heads)",
                         what, c->num_key_value_heads, c->num_attention_heads);
    const zpp_hf_rope_scaling *r = &c->rope_scaling;
    if (r->llama3 && !(r->factor > 0 && r->low_freq_factor > 0 &&
                       r->high_freq_factor > r->low_freq_factor &&
                       r->original_max_position_embeddings > 0 && isfinite(r->factor) &&
                       isfinite(r->high_freq_factor)))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': rope_scaling needs factor > 0, "
                                         "high_freq_factor > low_freq_factor > 0 and "
                                         "original_max_position_embeddings > 0 (llama3 divides "
                                         "by high - low)",
                         what);
    if (c->torch_dtype != ZPP_FP32 && c->torch_dtype != ZPP_BF16 && c->torch_dtype != ZPP_FP16)
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': torch_dtype %d is no dtype", what,
                         (int)c->torch_dtype);
    if (c->bos_token_id < -1 || c->n_eos < 0 || c->n_eos > ZPP_HF_MAX_EOS ||
        (c->n_eos > 1 && !c->eos_is_list))
        return zpp_error(ZPP_ERR_CONFIG, "config '%s': bos_token_id or eos_token_id is out of "
                                         "range",
                         what);
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_id[i] < 0)
            return zpp_error(ZPP_ERR_CONFIG, "config '%s': eos_token_id %d is negative", what,
                             c->eos_token_id[i]);
    return ZPP_OK;
}

zpp_status zpp_hf_config_text(const char *path, char **text_p) {
    FILE *f = NULL;
    ZPP_CHECK(zpp_fopen_regular(path, "config", &f));
    /* room for the one byte past the limit that tells a too-large file and
     * its NUL (which GCC cannot prove is never written there) */
    char *text = malloc(CONFIG_MAX_BYTES + 2);
    const size_t n = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    const int err = ferror(f);
    fclose(f);
    zpp_status st = ZPP_OK;
    if (!text) st = zpp_error(ZPP_ERR_NOMEM, "config: out of memory");
    else if (err) st = zpp_error(ZPP_ERR_IO, "cannot read config '%s'", path);
    else if (n > CONFIG_MAX_BYTES)
        st = zpp_error(ZPP_ERR_FORMAT, "config '%s' is larger than 1 MiB: not a config.json",
                       path);
    if (st != ZPP_OK) {
        free(text);
        return st;
    }
    text[n] = 0;
    *text_p = text;
    return ZPP_OK;
}

zpp_status zpp_hf_config_read(const char *path, zpp_hf_config *cfg_p) {
    if (!path || !cfg_p) return zpp_error(ZPP_ERR_INVALID, "zpp_hf_config_read: NULL argument");
    char *text = NULL;
    ZPP_CHECK(zpp_hf_config_text(path, &text));
    const zpp_status st = zpp_hf_config_parse(text, path, cfg_p);
    free(text);
    return st;
}

/* ---- Writing ------------------------------------------------------------------- */

static const char *const dtype_names[] = {[ZPP_FP32] = "float32", [ZPP_BF16] = "bfloat16",
                                          [ZPP_FP16] = "float16"};

const char *zpp_hf_torch_dtype_name(zpp_dtype dtype) {
    return dtype == ZPP_FP32 || dtype == ZPP_BF16 || dtype == ZPP_FP16 ? dtype_names[dtype] : NULL;
}

/* key: v, read back bit for bit (json_exact.h): parse(write(x)) must be x. */
static int add_double(cJSON *o, const char *key, double v) {
    char s[40];
    zpp_json_number_text(v, s, sizeof s);
    return cJSON_AddRawToObject(o, key, s) != NULL;
}

/* rope_scaling as an object, or null. */
static cJSON *rope_json(const zpp_hf_rope_scaling *r) {
    if (!r->llama3) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (o && add_double(o, "factor", r->factor) &&
        add_double(o, "high_freq_factor", r->high_freq_factor) &&
        add_double(o, "low_freq_factor", r->low_freq_factor) &&
        cJSON_AddNumberToObject(o, "original_max_position_embeddings",
                                r->original_max_position_embeddings) &&
        cJSON_AddStringToObject(o, "rope_type", "llama3"))
        return o;
    cJSON_Delete(o);
    return NULL;
}

/* The id fields: bos an int or null, eos an int, a list or null. */
static cJSON *eos_json(const zpp_hf_config *c) {
    if (!c->n_eos) return cJSON_CreateNull();
    if (!c->eos_is_list) return cJSON_CreateNumber(c->eos_token_id[0]);
    return cJSON_CreateIntArray(c->eos_token_id, c->n_eos);
}

/* Mistral's sliding_window, Qwen2's with use_sliding_window false; nothing
 * for Llama. */
static int add_sliding_window(cJSON *j, const zpp_hf_config *c, zpp_hf_arch a) {
    if (a == ZPP_HF_LLAMA) return 1;
    if (a == ZPP_HF_QWEN2 && !cJSON_AddFalseToObject(j, "use_sliding_window")) return 0;
    return c->sliding_window ? !!cJSON_AddNumberToObject(j, "sliding_window", c->sliding_window)
                             : !!cJSON_AddNullToObject(j, "sliding_window");
}

zpp_status zpp_hf_config_format(const zpp_hf_config *c, char **text_p) {
    if (!text_p) return zpp_error(ZPP_ERR_INVALID, "zpp_hf_config_format: NULL argument");
    ZPP_CHECK(zpp_hf_config_check(c, "(to write)"));
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_CreateStringArray(
                                                 (const char *const[]){c->architecture}, 1);
    int ok = j && arch && cJSON_AddItemToObject(j, "architectures", arch);
    if (!ok) cJSON_Delete(arch);
    const zpp_hf_arch a = zpp_hf_config_arch(c);
    ok = ok && cJSON_AddStringToObject(j, "model_type", archs[a].model_type) &&
         cJSON_AddStringToObject(j, "hidden_act", "silu") &&
         (a != ZPP_HF_LLAMA || cJSON_AddFalseToObject(j, "mlp_bias"));
    for (size_t i = 0; ok && i < N_FIELDS; i++) { /* the plain fields, in the table's order */
        const void *p = (const char *)c + fields[i].offset;
        if (a != ZPP_HF_LLAMA && !strcmp(fields[i].key, "attention_bias")) continue;
        ok = fields[i].type == F_INT ? !!cJSON_AddNumberToObject(j, fields[i].key, *(const int *)p)
             : fields[i].type == F_DOUBLE
                 ? add_double(j, fields[i].key, *(const double *)p)
                 : !!cJSON_AddBoolToObject(j, fields[i].key, *(const int *)p);
    }
    cJSON *items[3] = {rope_json(&c->rope_scaling),
                       c->bos_token_id < 0 ? cJSON_CreateNull()
                                           : cJSON_CreateNumber(c->bos_token_id),
                       eos_json(c)};
    const char *keys[3] = {"rope_scaling", "bos_token_id", "eos_token_id"};
    for (int i = 0; i < 3; i++)
        if (!ok || !items[i] || !cJSON_AddItemToObject(j, keys[i], items[i]))
            ok = 0, cJSON_Delete(items[i]);
    ok = ok && add_sliding_window(j, c, a) &&
         cJSON_AddStringToObject(j, "torch_dtype", dtype_names[c->torch_dtype]);
    char *json = ok ? cJSON_Print(j) : NULL, *text = json ? strdup(json) : NULL;
    cJSON_free(json); /* the caller frees with free() */
    cJSON_Delete(j);
    if (!text) return zpp_error(ZPP_ERR_NOMEM, "config: out of memory");
    *text_p = text;
    return ZPP_OK;
}

zpp_status zpp_hf_config_write(const char *path, const zpp_hf_config *cfg) {
    if (!path || strlen(path) >= 4096)
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_config_write: no path, or one too long");
    char *text = NULL;
    ZPP_CHECK(zpp_hf_config_format(cfg, &text));
    const zpp_status st = zpp_write_text_atomic(path, text, "config");
    free(text);
    return st;
}

zpp_status zpp_hf_config_write_like(const char *path, const char *like, zpp_dtype dtype) {
    if (!path || !like || (dtype != ZPP_FP32 && dtype != ZPP_BF16 && dtype != ZPP_FP16))
        return zpp_error(ZPP_ERR_INVALID, "zpp_hf_config_write_like: NULL path or no dtype");
    char *text = NULL;
    ZPP_CHECK(zpp_hf_config_text(like, &text));
    zpp_hf_config check;
    zpp_status st = zpp_hf_config_parse(text, like, &check);
    cJSON *j = st == ZPP_OK ? cJSON_Parse(text) : NULL;
    free(text);
    if (st != ZPP_OK) return st;
    if (!j) return zpp_error(ZPP_ERR_NOMEM, "config: out of memory");
    /* transformers wrote torch_dtype, and lately dtype; either, or both */
    const char *name = dtype_names[dtype], *keys[2] = {"torch_dtype", "dtype"};
    int found = 0, same = 1;
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
        if (!v) continue;
        found = 1;
        same = same && cJSON_IsString(v) && !strcmp(v->valuestring, name);
    }
    if (found && same) { /* the file as it is, byte for byte */
        cJSON_Delete(j);
        return zpp_copy_file(like, path, "config");
    }
    int ok = found || cJSON_AddStringToObject(j, "torch_dtype", name) != NULL;
    for (int k = 0; k < 2 && ok && found; k++)
        if (cJSON_GetObjectItemCaseSensitive(j, keys[k]))
            ok = cJSON_ReplaceItemInObjectCaseSensitive(j, keys[k], cJSON_CreateString(name));
    char *out = ok && zpp_json_exact_numbers(j) ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!out) return zpp_error(ZPP_ERR_NOMEM, "config: out of memory");
    st = zpp_write_text_atomic(path, out, "config");
    cJSON_free(out);
    return st;
}
