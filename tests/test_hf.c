/* test_hf.c — Hugging Face Llama folders through the zeropp command, as a
 * user runs it: `zeropp train --init-from DIR`, `zeropp export --format hf`
 * and `zeropp eval` (src/train/hf_model.h).
 *
 * The folders are written here with fresh random values each run: the
 * tensor list (names, shapes, transformers' state_dict order) is the
 * test's own, from LlamaForCausalLM's modules, not hf_model.c's; the files
 * go through the safetensors writer (tested on its own in
 * test_safetensors.c). The shape makes mapping mistakes show: grouped-query
 * attention 4:2, an untied head, q/k/v and o_proj biases (nonzero),
 * shards of the ranks cutting through tensors, rows of different tensors of
 * different sizes. Importing and exporting back must give the same bytes,
 * so a tensor read from the wrong place, a transposed slice or a lost row
 * changes the export. The exported headers are checked by a validator of
 * the test's own, from the format's rules. MistralForCausalLM (no biases,
 * a sliding window) and Qwen2ForCausalLM (q/k/v biases only) folders, their
 * config.json written by hand as transformers writes them, import and
 * export as themselves. `zeropp eval --init-from DIR` scores a folder as
 * the CPU model does on the units built here.
 *
 * ZPP_CLI (the zeropp command) and ZPP_MPIEXEC (mpirun) come from ctest. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dtype.h"
#include "testlib.h"
#include "model/gpt2.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/hf_config.h"
#include "train/hf_model.h"
#include "train/safetensors.h"
#include "train/tokfile.h"

/* ---- Files and commands -------------------------------------------------------- */

static unsigned char *read_file(const char *path, size_t *n_p) {
    FILE *f = fopen(path, "rb");
    EXPECT(f != NULL, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = zpp_test_malloc((size_t)n + 1);
    EXPECT(fread(p, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *n_p = (size_t)n;
    return p;
}

/* DIR/config.json (its path into path), as a NUL-terminated string of *n_p
 * bytes; the caller frees it. */
static char *read_config(const char *dir, char *path, size_t cap, size_t *n_p) {
    snprintf(path, cap, "%s/config.json", dir);
    char *text = (char *)read_file(path, n_p);
    text[*n_p] = 0;
    return text;
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Files a and b hold the same bytes. */
static void expect_same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = read_file(a, &na), *y = read_file(b, &nb);
    size_t at = 0;
    while (at < na && at < nb && x[at] == y[at]) at++;
    EXPECT(na == nb && at == na, "%s (%zu bytes) and %s (%zu bytes) differ at byte %zu", a, na,
           b, nb, at);
    free(x), free(y);
}

/* ---- A random Llama in Hugging Face's layout ----------------------------------- */

enum { L = 2, C = 32, H = 4, KV = 2, HD = C / H, F = 48, V = 37, T = 16, MAX_T = 2 * T };

typedef struct hf_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t numel;
    float *x; /* values, each exactly representable in the file's dtype */
} hf_tensor;

typedef struct hf_llama {
    int n;
    hf_tensor t[4 + 14 * L];
    zpp_hf_config cfg;
} hf_llama;

/* Kinds of values: matrices 0.25 N (attention logits far from uniform),
 * embeddings 0.5 N, norm gains 1 + 0.3 N, biases 0.1 N. */
enum { MAT, EMB, GAIN, BIAS };

/* The files' dtype by code: 0 fp32, 1 bf16, 2 fp16 (the flag "bf16" below). */
static zpp_dtype dt_of(int code) { return code == 1 ? ZPP_BF16 : code == 2 ? ZPP_FP16 : ZPP_FP32; }

static void add(hf_llama *m, zpp_rng *r, int bf16, int kind, const char *name, int64_t rows,
                int64_t cols) {
    hf_tensor *t = &m->t[m->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows, t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->x = zpp_test_malloc(t->numel * sizeof(float));
    for (size_t i = 0; i < t->numel; i++) {
        const double z = zpp_rng_normal(r);
        const double v = kind == MAT    ? 0.25 * z
                         : kind == EMB  ? 0.5 * z
                         : kind == GAIN ? 1.0 + 0.3 * z
                                        : 0.1 * z;
        t->x[i] = (float)v;
        float h = 0; /* rounded to the file's dtype, here, once (room for any) */
        zpp_store_f32(&h, dt_of(bf16), 0, (float)v);
        if (bf16) t->x[i] = zpp_load_f32(&h, dt_of(bf16), 0);
    }
}

/* The state_dict of `arch`'s model (LlamaForCausalLM with attention_bias:
 * q, k, v and o biases; Mistral: none; Qwen2: q, k and v's), in its order:
 * the embedding, each layer's self_attn (q, k, v, o, each weight then
 * bias), mlp (gate, up, down) and its two norms, the final norm, the
 * head. */
static hf_llama arch_make(zpp_rng *r, int bf16, zpp_hf_arch arch) {
    hf_llama m;
    memset(&m, 0, sizeof m);
    add(&m, r, bf16, EMB, "model.embed_tokens.weight", V, C);
    char n[96];
    for (int l = 0; l < L; l++) {
        static const char *const proj[4] = {"q", "k", "v", "o"};
        for (int p = 0; p < 4; p++) {
            const int64_t rows = p == 1 || p == 2 ? KV * HD : C;
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s_proj.weight", l, proj[p]);
            add(&m, r, bf16, MAT, n, rows, C);
            snprintf(n, sizeof n, "model.layers.%d.self_attn.%s_proj.bias", l, proj[p]);
            if (arch == ZPP_HF_LLAMA || (arch == ZPP_HF_QWEN2 && p < 3))
                add(&m, r, bf16, BIAS, n, rows, 0);
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", l);
        add(&m, r, bf16, MAT, n, F, C);
        snprintf(n, sizeof n, "model.layers.%d.mlp.up_proj.weight", l);
        add(&m, r, bf16, MAT, n, F, C);
        snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
        add(&m, r, bf16, MAT, n, C, F);
        snprintf(n, sizeof n, "model.layers.%d.input_layernorm.weight", l);
        add(&m, r, bf16, GAIN, n, C, 0);
        snprintf(n, sizeof n, "model.layers.%d.post_attention_layernorm.weight", l);
        add(&m, r, bf16, GAIN, n, C, 0);
    }
    add(&m, r, bf16, GAIN, "model.norm.weight", C, 0);
    add(&m, r, bf16, EMB, "lm_head.weight", V, C);
    zpp_hf_config *c = &m.cfg;
    snprintf(c->architecture, sizeof c->architecture, "%s", zpp_hf_arch_name(arch));
    c->hidden_size = C, c->intermediate_size = F, c->num_hidden_layers = L;
    c->num_attention_heads = H, c->num_key_value_heads = KV, c->head_dim = HD;
    c->vocab_size = V, c->max_position_embeddings = MAX_T;
    c->rms_norm_eps = 1e-5, c->rope_theta = 500000.0;
    c->attention_bias = arch == ZPP_HF_LLAMA, c->tie_word_embeddings = 0;
    c->torch_dtype = dt_of(bf16);
    c->bos_token_id = 1, c->n_eos = 1, c->eos_token_id[0] = 2;
    return m;
}

static hf_llama llama_make(zpp_rng *r, int bf16) { return arch_make(r, bf16, ZPP_HF_LLAMA); }

static void llama_free(hf_llama *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].x);
}

static zpp_st_dtype st_dtype(int bf16) {
    return bf16 == 1 ? ZPP_ST_BF16 : bf16 == 2 ? ZPP_ST_F16 : ZPP_ST_F32;
}

/* The folder `dir` (made here): config.json and the tensors in `order`
 * (NULL: the state_dict's), shards above max_shard bytes (0: one file). */
static void llama_write(const hf_llama *m, int bf16, const char *dir, size_t max_shard,
                        const int *order) {
    EXPECT(mkdir(dir, 0777) == 0, "cannot make %s", dir);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    EXPECT(zpp_hf_config_write(path, &m->cfg) == ZPP_OK, "%s", zpp_last_error());
    zpp_st_source s[4 + 14 * L];
    void *bytes[4 + 14 * L];
    for (int k = 0; k < m->n; k++) {
        const hf_tensor *t = &m->t[order ? order[k] : k];
        bytes[k] = zpp_test_malloc(t->numel * 4);
        for (size_t i = 0; i < t->numel; i++)
            zpp_store_f32(bytes[k], dt_of(bf16), i, t->x[i]);
        s[k] = (zpp_st_source){.name = t->name, .dtype = st_dtype(bf16), .ndim = t->ndim,
                               .data = bytes[k]};
        s[k].shape[0] = t->shape[0], s[k].shape[1] = t->shape[1];
    }
    EXPECT(zpp_st_write_dir(dir, s, (size_t)m->n, max_shard, NULL) == ZPP_OK, "%s",
           zpp_last_error());
    for (int k = 0; k < m->n; k++) free(bytes[k]);
}

/* An llm.c token file of n tokens below V, and a config for the runs:
 * T-token sequences, 2 a micro-batch. */
static void run_files(zpp_rng *r, const char *tag, char *tok, char *cfg) {
    char name[64];
    snprintf(name, sizeof name, "%s_tok.bin", tag);
    zpp_test_tmp_path(name, tok);
    const size_t n = 4000, bytes = 1024 + 2 * n;
    unsigned char *b = zpp_test_malloc(bytes);
    int32_t h[256] = {20240520, 1, (int32_t)n};
    memcpy(b, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        const uint16_t x = (uint16_t)(zpp_rng_u64(r) % V);
        memcpy(b + 1024 + 2 * i, &x, 2);
    }
    zpp_test_write_file(tok, b, bytes);
    free(b);
    snprintf(name, sizeof name, "%s_cfg.json", tag);
    zpp_test_tmp_path(name, cfg);
    char text[256];
    snprintf(text, sizeof text,
             "{\"model\": {\"seq_len\": %d}, \"train_micro_batch_size_per_gpu\": 2}\n", T);
    zpp_test_write_file(cfg, text, strlen(text));
}

/* Imports `dir` on np ranks and saves step 0 into ckpt. */
static void import_save(int np, const char *dir, const char *tok, const char *cfg,
                        const char *ckpt, const char *extra) {
    char out[512], err[512];
    zpp_test_tmp_path("import_out.txt", out), zpp_test_tmp_path("import_err.txt", err);
    const int rc = zpp_test_run_cli(np, out, err,
                           "train --quiet --init-from %s --data %s --config %s --steps 0 "
                           "--save %s %s",
                           dir, tok, cfg, ckpt, extra);
    EXPECT(rc == 0, "train --init-from %s on %d ranks failed (%d); see %s", dir, np, rc, err);
    EXPECT(zpp_test_count_lines(out, "saved the initial weights (step 0)") == 1, "see %s", out);
}

static void export_hf(const char *ckpt, const char *to, const char *args) {
    char out[512], err[512];
    zpp_test_tmp_path("export_out.txt", out), zpp_test_tmp_path("export_err.txt", err);
    const int rc = zpp_test_run_cli(0, out, err, "export --from %s --to %s --format hf %s", ckpt, to, args);
    EXPECT(rc == 0, "export of %s failed (%d); see %s", ckpt, rc, err);
}

/* Every file of folder a is in folder b with the same bytes, and b has no
 * other (the names listed with ls). */
static void expect_same_folder(const char *a, const char *b) {
    char cmd[2048], la[512], lb[512];
    zpp_test_tmp_path("ls_a.txt", la), zpp_test_tmp_path("ls_b.txt", lb);
    snprintf(cmd, sizeof cmd, "ls %s > %s && ls %s > %s", a, la, b, lb);
    EXPECT(system(cmd) == 0, "ls failed");
    expect_same_file(la, lb);
    FILE *f = fopen(la, "r");
    char name[256];
    while (f && fscanf(f, "%255s", name) == 1) {
        char pa[1024], pb[1024];
        snprintf(pa, sizeof pa, "%s/%s", a, name);
        snprintf(pb, sizeof pb, "%s/%s", b, name);
        expect_same_file(pa, pb);
    }
    if (f) fclose(f);
}

/* ---- The format's rules, checked from the bytes -------------------------------- */

/* One safetensors file against the specification: an 8-byte little-endian
 * header length N, N a multiple of 8 (the writer pads so the buffer is
 * aligned) and within the file; N bytes of a JSON object padded with
 * spaces; __metadata__ of string values; every other entry {"dtype",
 * "shape", "data_offsets"} with END - BEGIN = numel * dtype size; the
 * tensors, sorted by offset, tiling the buffer with no hole or overlap up
 * to the end of the file. Returns how many tensors it holds. */
static int validate_file(const char *path) {
    size_t n;
    unsigned char *b = read_file(path, &n);
    EXPECT(n >= 8, "%s: shorter than the header length", path);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    EXPECT(hl % 8 == 0 && hl <= n - 8, "%s: header length %llu", path, (unsigned long long)hl);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts((const char *)b + 8, (size_t)hl, &end, 0);
    EXPECT(cJSON_IsObject(j), "%s: the header is not a JSON object", path);
    for (const char *p = end; p < (const char *)b + 8 + hl; p++)
        EXPECT(*p == ' ', "%s: header byte %zu is not padding", path, (size_t)(p - (char *)b));
    const size_t buffer = n - 8 - (size_t)hl;
    size_t begins[256], ends[256];
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
        if (!strcmp(e->string, "__metadata__")) {
            const cJSON *v;
            cJSON_ArrayForEach(v, e) EXPECT(cJSON_IsString(v), "%s: metadata %s", path, v->string);
            continue;
        }
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        EXPECT(cJSON_IsString(dt) && cJSON_IsArray(sh) && cJSON_GetArraySize(off) == 2,
               "%s: tensor %s lacks dtype, shape or data_offsets", path, e->string);
        const size_t es = !strcmp(dt->valuestring, "F32")    ? 4
                          : !strcmp(dt->valuestring, "BF16") ? 2
                          : !strcmp(dt->valuestring, "F16")  ? 2
                                                             : 0;
        EXPECT(es, "%s: tensor %s has dtype %s", path, e->string, dt->valuestring);
        size_t numel = 1;
        const cJSON *d;
        cJSON_ArrayForEach(d, sh) numel *= (size_t)d->valuedouble;
        EXPECT(k < 256);
        begins[k] = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        ends[k] = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        EXPECT(ends[k] - begins[k] == numel * es, "%s: tensor %s spans %zu bytes for %zu elements",
               path, e->string, ends[k] - begins[k], numel);
        k++;
    }
    /* sorted by begin (a few hundred: insertion sort), they tile [0, buffer) */
    for (int a = 1; a < k; a++)
        for (int c = a; c > 0 && begins[c - 1] > begins[c]; c--) {
            size_t x = begins[c];
            begins[c] = begins[c - 1], begins[c - 1] = x;
            x = ends[c], ends[c] = ends[c - 1], ends[c - 1] = x;
        }
    size_t at = 0;
    for (int a = 0; a < k; a++) {
        EXPECT(begins[a] == at, "%s: the tensor at %zu does not follow the one ending at %zu",
               path, begins[a], at);
        at = ends[a];
    }
    EXPECT(at == buffer, "%s: tensors end at %zu, the buffer at %zu", path, at, buffer);
    cJSON_Delete(j);
    free(b);
    return k;
}

/* The tensor names and byte counts of one safetensors file (its header). */
static cJSON *header_of(const char *path) {
    size_t n;
    unsigned char *b = read_file(path, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    cJSON *j = cJSON_ParseWithLength((const char *)b + 8, (size_t)hl);
    free(b);
    EXPECT(cJSON_IsObject(j), "%s: no header", path);
    return j;
}

/* model.safetensors.index.json as transformers writes it: metadata
 * .total_size the bytes of every tensor, weight_map naming for each tensor
 * the shard whose header holds it, and every tensor of every shard. */
static void validate_index(const char *dir, int tensors) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    size_t n;
    char *text = (char *)read_file(path, &n);
    text[n] = 0;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(j, "metadata"), "total_size");
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    EXPECT(cJSON_IsNumber(total) && cJSON_IsObject(map), "%s: no total_size or weight_map", path);
    EXPECT(cJSON_GetArraySize(map) == tensors, "%s maps %d tensors, the shards hold %d", path,
           cJSON_GetArraySize(map), tensors);
    double bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        EXPECT(cJSON_IsString(e), "%s: weight_map[%s]", path, e->string);
        char shard[1024];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        cJSON *h = header_of(shard);
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(h, e->string), "data_offsets");
        EXPECT(cJSON_GetArraySize(off) == 2, "%s: %s is not in %s", path, e->string, shard);
        bytes += cJSON_GetArrayItem(off, 1)->valuedouble - cJSON_GetArrayItem(off, 0)->valuedouble;
        cJSON_Delete(h);
    }
    EXPECT(bytes == total->valuedouble, "%s: total_size %.0f, the tensors %.0f bytes", path,
           total->valuedouble, bytes);
    cJSON_Delete(j);
}

/* config.json with what transformers' LlamaConfig reads to build this
 * model: architectures ["LlamaForCausalLM"], model_type "llama", the sizes
 * as integers of this shape, the flags as booleans, torch_dtype the
 * tensors'. */
static void validate_config(const char *dir, const char *torch_dtype) {
    char path[1024];
    size_t n;
    char *text = read_config(dir, path, sizeof path, &n);
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    EXPECT(cJSON_GetArraySize(arch) == 1 &&
               !strcmp(cJSON_GetArrayItem(arch, 0)->valuestring, "LlamaForCausalLM"),
           "%s: architectures", path);
    const struct {
        const char *key;
        int value;
    } ints[] = {{"hidden_size", C},        {"intermediate_size", F}, {"num_hidden_layers", L},
                {"num_attention_heads", H}, {"num_key_value_heads", KV}, {"head_dim", HD},
                {"vocab_size", V}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, ints[i].key);
        EXPECT(cJSON_IsNumber(v) && v->valuedouble == ints[i].value, "%s: %s is not %d", path,
               ints[i].key, ints[i].value);
    }
    const char *strs[][2] = {{"model_type", "llama"}, {"hidden_act", "silu"},
                             {"torch_dtype", torch_dtype}};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, strs[i][0]);
        EXPECT(cJSON_IsString(v) && !strcmp(v->valuestring, strs[i][1]), "%s: %s is not %s", path,
               strs[i][0], strs[i][1]);
    }
    EXPECT(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")) &&
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "attention_bias")) &&
               cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "rope_theta")) &&
               cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "rms_norm_eps")),
           "%s: tie_word_embeddings, attention_bias, rope_theta or rms_norm_eps", path);
    cJSON_Delete(j);
}

/* ---- Round trips ----------------------------------------------------------------- */

/* Import on np ranks, save step 0, export: the folder comes back byte for
 * byte (config.json too, its token ids through --hf-config), and its files
 * pass the validator. */
static void check_roundtrip(int bf16, size_t max_shard, int np, uint64_t stream, const char *tag) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream));
    hf_llama m = llama_make(&r, bf16);
    char dir[512], ckpt[512], back[512], tok[512], cfg[512], name[64], args[700];
    snprintf(name, sizeof name, "%s_in", tag);
    llama_write(&m, bf16, zpp_test_tmp_path(name, dir), max_shard, NULL);
    run_files(&r, tag, tok, cfg);
    snprintf(name, sizeof name, "%s_ckpt", tag);
    import_save(np, dir, tok, cfg, zpp_test_tmp_path(name, ckpt),
                bf16 == 1 ? "--set bf16.enabled=true" : "");
    snprintf(name, sizeof name, "%s_back", tag);
    snprintf(args, sizeof args, "--max-shard-size %zu --hf-config %s/config.json%s",
             max_shard ? max_shard : (size_t)1 << 40, dir, bf16 == 2 ? " --dtype fp16" : "");
    export_hf(ckpt, zpp_test_tmp_path(name, back), args); /* the dtype: the run's */
    expect_same_folder(dir, back);
    int files = 0, tensors = 0;
    DIR *d = opendir(back);
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t k = strlen(e->d_name);
        if (k < 12 || strcmp(e->d_name + k - 12, ".safetensors")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", back, e->d_name);
        files++, tensors += validate_file(path);
    }
    if (d) closedir(d);
    EXPECT(tensors == m.n, "the export's files hold %d tensors, the model %d", tensors, m.n);
    if (files > 1) validate_index(back, tensors);
    validate_config(back, bf16 == 1 ? "bfloat16" : bf16 == 2 ? "float16" : "float32");
    EXPECT(max_shard == 0 ? files == 1 : files > 2, "%d files for a limit of %zu bytes", files,
           max_shard);
    llama_free(&m);
}

static void test_roundtrip_fp32_single(void) { check_roundtrip(0, 0, 2, 1, "f32s"); }
static void test_roundtrip_bf16_single(void) { check_roundtrip(1, 0, 3, 2, "b16s"); }
/* shards of 6 KB: some tensors alone past the limit, others grouped */
static void test_roundtrip_fp32_sharded(void) { check_roundtrip(0, 6000, 3, 3, "f32x"); }
static void test_roundtrip_bf16_sharded(void) { check_roundtrip(1, 3000, 2, 4, "b16x"); }
/* fp16 files: widened exactly into an fp32 run, rounded back exactly */
static void test_roundtrip_fp16_sharded(void) { check_roundtrip(2, 3000, 2, 10, "f16x"); }

/* Import on 1 and on 4 ranks gives the same parameters (the same export
 * bytes), and those are the file's values: an fp32 export of a bf16 folder
 * is its values widened, and re-importing the export changes nothing. */
static void test_ranks_agree(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(5));
    hf_llama m = llama_make(&r, 1);
    char dir[512], tok[512], cfg[512], c1[512], c4[512], e1[512], e4[512], ref[512];
    llama_write(&m, 1, zpp_test_tmp_path("agree_in", dir), 4000, NULL);
    run_files(&r, "agree", tok, cfg);
    import_save(1, dir, tok, cfg, zpp_test_tmp_path("agree_c1", c1), "");
    import_save(4, dir, tok, cfg, zpp_test_tmp_path("agree_c4", c4), "");
    export_hf(c1, zpp_test_tmp_path("agree_e1", e1), "--dtype fp32");
    export_hf(c4, zpp_test_tmp_path("agree_e4", e4), "--dtype fp32");
    expect_same_folder(e1, e4);
    /* the same values written as fp32 by the test: config.json aside (its
     * token ids and max_position_embeddings are not the checkpoint's) */
    m.cfg.torch_dtype = ZPP_FP32;
    llama_write(&m, 0, zpp_test_tmp_path("agree_ref", ref), 0, NULL);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/model.safetensors", ref);
    snprintf(b, sizeof b, "%s/model.safetensors", e1);
    expect_same_file(a, b);
    llama_free(&m);
}

/* A folder whose shards hold the tensors in another order (reversed, then
 * shuffled) imports to the same parameters. */
static void test_other_order(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(6));
    hf_llama m = llama_make(&r, 0);
    int order[4 + 14 * L];
    for (int k = 0; k < m.n; k++) order[k] = m.n - 1 - k;
    for (int k = m.n - 1; k > 0; k--) { /* Fisher-Yates over the reversed list */
        const int j = (int)(zpp_rng_u64(&r) % (uint64_t)(k + 1)), x = order[k];
        order[k] = order[j], order[j] = x;
    }
    char dir[512], ref[512], tok[512], cfg[512], ckpt[512], back[512];
    llama_write(&m, 0, zpp_test_tmp_path("order_in", dir), 5000, order);
    llama_write(&m, 0, zpp_test_tmp_path("order_ref", ref), 0, NULL);
    run_files(&r, "order", tok, cfg);
    import_save(2, dir, tok, cfg, zpp_test_tmp_path("order_ckpt", ckpt), "");
    char like[600];
    snprintf(like, sizeof like, "--hf-config %s/config.json", ref);
    export_hf(ckpt, zpp_test_tmp_path("order_back", back), like);
    expect_same_folder(ref, back);
    llama_free(&m);
}

/* ---- Where each tensor lands ---------------------------------------------------- */

/* The tensor called `suffix` (of layer l, or -1 for a model-wide one). */
static const hf_tensor *find(const hf_llama *m, int l, const char *suffix) {
    char name[96];
    if (l < 0) snprintf(name, sizeof name, "%s", suffix);
    else snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);
    for (int k = 0; k < m->n; k++)
        if (!strcmp(m->t[k].name, name)) return &m->t[k];
    EXPECT(0, "no tensor %s", name);
    return NULL;
}

/* Copies t's values to unit + at, returns the next offset. */
static size_t put(float *unit, size_t at, const hf_tensor *t) {
    memcpy(unit + at, t->x, t->numel * sizeof(float));
    return at + t->numel;
}

/* The llama (all four biases, untied) of the test's shape, vocabulary
 * padded to Vp, at seq_len T. */
static zpp_decoder_shape test_shape(int Vp) {
    return (zpp_decoder_shape){.n_layer = L, .n_head = H, .n_kv_head = KV, .n_embd = C,
                               .n_ffn = F, .seq_len = T, .vocab_size = Vp, .real_vocab_size = V,
                               .rope_theta = 500000.0, .norm_eps = 1e-5, .untied_head = 1,
                               .qkv_bias = 1, .o_bias = 1};
}

/* Unit u of m in model/llama.h's layout, as its table says (unit 0: wte
 * (Vp rows, the padding zero), norm_f, head (Vp rows); a block: norm1,
 * [q | k | v] rows, their biases, wo, bo, norm2, [gate | up] rows, down);
 * returns its element count. */
static size_t unit_of(const hf_llama *m, int u, int Vp, float *want, size_t numel) {
    memset(want, 0, numel * sizeof(float));
    size_t at = 0;
    if (u == 0) {
        put(want, 0, find(m, -1, "model.embed_tokens.weight")); /* rows V..Vp-1: zero */
        at = put(want, (size_t)Vp * C, find(m, -1, "model.norm.weight"));
        put(want, at, find(m, -1, "lm_head.weight"));
        return at + (size_t)Vp * C;
    }
    static const char *const order[] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
        "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
        "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight"};
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++)
        at = put(want, at, find(m, u - 1, order[k]));
    return at;
}

/* The units of model/llama.h's layout, built here from its table (unit 0:
 * wte (Vp rows, the padding zero), norm_f, head (Vp rows); a block: norm1,
 * [q | k | v] rows, their biases, wo, bo, norm2, [gate | up] rows, down),
 * each read through zpp_hf_model_read_unit whole and in random ranges: a round
 * trip cannot see a mapping that import and export get wrong alike (k and
 * v swapped both ways), this can. Vocabulary padded from 37 to 48. */
static void test_unit_layout(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(9));
    hf_llama m = llama_make(&r, 1);
    char dir[512];
    llama_write(&m, 1, zpp_test_tmp_path("layout_in", dir), 3000, NULL);
    zpp_hf_model *hm = NULL;
    EXPECT(zpp_hf_model_open(dir, &hm) == ZPP_OK, "%s", zpp_last_error());
    const int Vp = 48;
    zpp_decoder_shape shape = test_shape(Vp);
    zpp_llama_config lc;
    EXPECT(zpp_llama_config_of_shape(&shape, &lc) == ZPP_OK, "%s", zpp_last_error());
    zpp_llama_layout lay;
    zpp_llama_layout_make(&lc, &lay);
    for (int u = 0; u <= L; u++) {
        const size_t numel = u ? lay.block_numel : lay.embed_numel;
        float *want = zpp_test_malloc(numel * sizeof(float)), *got = zpp_test_malloc(numel * 4);
        const size_t at = unit_of(&m, u, Vp, want, numel);
        EXPECT(at == numel, "unit %d: the test's layout has %zu elements, llama.h's %zu", u, at,
               numel);
        EXPECT(zpp_hf_model_read_unit(hm, &lc, u, 0, numel, got) == ZPP_OK, "%s",
               zpp_last_error());
        for (size_t i = 0; i < numel; i++)
            EXPECT(got[i] == want[i], "unit %d element %zu: %g, expected %g", u, i,
                   (double)got[i], (double)want[i]);
        for (int rep = 0; rep < 20; rep++) { /* a rank's shard: any range */
            const size_t b = zpp_rng_u64(&r) % numel, c = zpp_rng_u64(&r) % (numel - b + 1);
            EXPECT(zpp_hf_model_read_unit(hm, &lc, u, b, c, got) == ZPP_OK);
            EXPECT(!memcmp(got, want + b, c * sizeof(float)), "unit %d [%zu, +%zu) differs", u, b,
                   c);
        }
        free(want), free(got);
    }
    zpp_hf_model_close(hm);
    llama_free(&m);
}

/* ---- Checkpoints of a llama: reshard, refuse another model --------------------- */

/* `zeropp eval --json`'s loss. */
static double eval_loss(int np, const char *ckpt) {
    char out[512], err[512];
    zpp_test_tmp_path("eval_out.txt", out), zpp_test_tmp_path("eval_err.txt", err);
    const int rc = zpp_test_run_cli(np, out, err, "eval %s --split train --batches 12 --json", ckpt);
    EXPECT(rc == 0, "eval of %s on %d ranks failed (%d); see %s", ckpt, np, rc, err);
    size_t n;
    char *text = (char *)read_file(out, &n);
    text[n] = 0;
    const char *p = strstr(text, "\"loss\":");
    EXPECT(p, "no loss in %s", out);
    const double loss = strtod(p + 7, NULL);
    free(text);
    return loss;
}

/* A llama checkpoint saved on 2 ranks loads on 1 and 3 (eval goes through
 * the trainer's load): the 12 batches' losses are each the same
 * computation on the same weights, so their means differ only by the
 * order of a 12-term sum (a few ulps); the manifest names the family, and
 * a run of another family or knob is refused naming it. */
static void test_checkpoint_reshard_and_refusals(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(7));
    hf_llama m = llama_make(&r, 0);
    char dir[512], tok[512], cfg[512], ckpt[512], mani[600];
    llama_write(&m, 0, zpp_test_tmp_path("ck_in", dir), 0, NULL);
    run_files(&r, "ck", tok, cfg);
    import_save(2, dir, tok, cfg, zpp_test_tmp_path("ck_ckpt", ckpt), "");
    snprintf(mani, sizeof mani, "%s/checkpoint.json", ckpt);
    EXPECT(zpp_test_count_lines(mani, "\"family\":\"llama\"") == 1, "%s names no llama", mani);
    const double l2 = eval_loss(2, ckpt), l1 = eval_loss(1, ckpt), l3 = eval_loss(3, ckpt);
    EXPECT(isfinite(l2) && l2 > 0.5, "loss %g", l2);
    EXPECT(fabs(l1 - l2) <= 1e-6 * l2 && fabs(l3 - l2) <= 1e-6 * l2,
           "losses on 1, 2, 3 ranks: %.9g %.9g %.9g", l1, l2, l3);
    char other[512], out[512], err[512];
    /* export: into an existing folder refused, nothing written beside it;
     * --format llmc refused for a llama */
    zpp_test_tmp_path("ck_out.txt", out), zpp_test_tmp_path("ck_err.txt", err);
    EXPECT(zpp_test_run_cli(0, out, err, "export --from %s --to %s --format hf", ckpt, dir) != 0,
           "export over an existing folder succeeded");
    EXPECT(zpp_test_count_lines(err, "exists; give a new folder") == 1, "see %s", err);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls -d %s.tmp.* >/dev/null 2>&1", dir);
    EXPECT(system(cmd) != 0, "export left a temporary folder beside %s", dir);
    zpp_test_tmp_path("ck_llmc.bin", other);
    EXPECT(zpp_test_run_cli(0, out, err, "export --from %s --to %s --format llmc", ckpt, other) != 0 &&
               zpp_test_count_lines(err, "holds a llama; --format llmc writes GPT-2s only") == 1,
           "--format llmc of a llama: see %s", err);
    EXPECT(!exists(other), "%s was written", other);
    struct {
        const char *config, *needle;
    } bad[] = {{"{\"model\": {\"n_layer\": 2, \"n_head\": 4, \"n_embd\": 32, \"seq_len\": 16, "
                "\"vocab_size\": 37}}",
                "holds a llama, this run trains a gpt2"},
               {"{\"model\": {\"family\": \"llama\", \"n_layer\": 2, \"n_head\": 4, \"n_embd\": "
                "32, \"seq_len\": 16, \"vocab_size\": 37, \"n_kv_head\": 2, \"n_ffn\": 48, "
                "\"untied_head\": true, \"qkv_bias\": true, \"norm_eps\": 1e-5, \"rope_theta\": "
                "10000}}",
                "model.rope_theta"}};
    for (int i = 0; i < 2; i++) {
        zpp_test_tmp_path("ck_other.json", other);
        zpp_test_write_file(other, bad[i].config, strlen(bad[i].config));
        zpp_test_tmp_path("ck_out.txt", out), zpp_test_tmp_path("ck_err.txt", err);
        const int rc = zpp_test_run_cli(2, out, err, "train --quiet --resume %s --config %s --data %s "
                               "--steps 2", ckpt, other, tok);
        EXPECT(rc != 0, "a resume with another model succeeded");
        EXPECT(zpp_test_count_lines(err, bad[i].needle) == 1, "no line naming '%s' in %s",
               bad[i].needle, err);
    }
    llama_free(&m);
}

/* ---- Refusals ---------------------------------------------------------------------- */

/* `zeropp train --init-from dir` fails with one line naming `needle` (one
 * rank, without mpirun: the refusals agreed over ranks are the reshard
 * case's; CI's time is small). */
static void expect_import_refused(const char *what, const char *dir, const char *tok,
                                  const char *cfg, const char *needle) {
    char out[512], err[512], ckpt[512];
    zpp_test_tmp_path("bad_out.txt", out), zpp_test_tmp_path("bad_err.txt", err);
    zpp_test_tmp_path("bad_ckpt", ckpt);
    const int rc = zpp_test_run_cli(0, out, err, "train --quiet --init-from %s --data %s --config %s "
                           "--steps 0 --save %s", dir, tok, cfg, ckpt);
    EXPECT(rc != 0, "%s: the import succeeded", what);
    const int lines = zpp_test_count_lines(err, "zeropp");
    const int named = zpp_test_count_lines(err, needle);
    EXPECT(lines == 1 && named == 1, "%s: %d error lines, %d naming '%s'; see %s", what, lines,
           named, needle, err);
    EXPECT(!exists(ckpt) || zpp_test_count_lines(out, "saved") == 0, "%s: something was saved",
           what);
}

static void test_refusals(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(8));
    hf_llama m = llama_make(&r, 1);
    char tok[512], cfg[512], dir[512], path[700];
    run_files(&r, "bad", tok, cfg);
    /* another architecture (config.json edited: the writer refuses it) */
    llama_write(&m, 1, zpp_test_tmp_path("bad_arch", dir), 0, NULL);
    size_t n;
    char *text = read_config(dir, path, sizeof path, &n);
    char *at = strstr(text, "LlamaForCausalLM");
    EXPECT(at, "no architecture in %s", path);
    char *edited = zpp_test_malloc(n + 16);
    snprintf(edited, n + 16, "%.*sQwen3ForCausalLM%s", (int)(at - text), text, at + 16);
    zpp_test_write_file(path, edited, strlen(edited));
    free(text), free(edited);
    expect_import_refused("architecture", dir, tok, cfg,
                          "architecture 'Qwen3ForCausalLM' is not supported");
    /* the tensor list as made, restored after each case (the values are shared) */
    hf_tensor orig[4 + 14 * L];
    const int n_orig = m.n, K1 = 1 + 13 + 2; /* layer 1's k_proj.weight */
    memcpy(orig, m.t, sizeof orig);
    EXPECT(strstr(m.t[K1].name, "layers.1.self_attn.k_proj.weight"), "%s", m.t[K1].name);
    /* a missing tensor: the list without layer 1's k_proj */
    m.t[K1] = m.t[--m.n];
    llama_write(&m, 1, zpp_test_tmp_path("bad_missing", dir), 0, NULL);
    expect_import_refused("missing", dir, tok, cfg,
                          "'model.layers.1.self_attn.k_proj.weight' is missing");
    memcpy(m.t, orig, sizeof orig), m.n = n_orig;
    /* an unknown name (a Qwen3-style k_norm) beside the right ones */
    snprintf(m.t[m.n].name, sizeof m.t[0].name, "model.layers.1.self_attn.k_norm.weight");
    m.t[m.n].ndim = 1, m.t[m.n].shape[0] = HD, m.t[m.n].numel = HD;
    m.t[m.n++].x = m.t[0].x;
    llama_write(&m, 1, zpp_test_tmp_path("bad_unknown", dir), 0, NULL);
    expect_import_refused("unknown", dir, tok, cfg, "'model.layers.1.self_attn.k_norm.weight'");
    memcpy(m.t, orig, sizeof orig), m.n = n_orig;
    /* a wrong shape: k_proj with 3 heads' rows (of its own values) */
    m.t[K1].shape[0] = 3 * HD, m.t[K1].numel = 3 * HD * C;
    m.t[K1].x = m.t[0].x; /* the embedding has V >= 3 HD rows of C */
    llama_write(&m, 1, zpp_test_tmp_path("bad_shape", dir), 0, NULL);
    expect_import_refused("shape", dir, tok, cfg, "has shape [24, 32]");
    memcpy(m.t, orig, sizeof orig), m.n = n_orig;
    /* attention_bias with o_proj's bias missing, or of the wrong length */
    EXPECT(strstr(m.t[8].name, "layers.0.self_attn.o_proj.bias"), "%s", m.t[8].name);
    m.t[8] = m.t[--m.n];
    llama_write(&m, 1, zpp_test_tmp_path("bad_obias", dir), 0, NULL);
    expect_import_refused("o bias missing", dir, tok, cfg,
                          "'model.layers.0.self_attn.o_proj.bias' is missing");
    memcpy(m.t, orig, sizeof orig), m.n = n_orig;
    m.t[8].shape[0] = C - HD, m.t[8].numel = C - HD;
    llama_write(&m, 1, zpp_test_tmp_path("bad_obias_len", dir), 0, NULL);
    expect_import_refused("o bias length", dir, tok, cfg, "o_proj.bias' has shape [24]");
    memcpy(m.t, orig, sizeof orig), m.n = n_orig;
    /* a dtype the model has no use for: the first tensor's F32 made I32 in
     * the header (same width: the file stays valid safetensors) */
    llama_write(&m, 0, zpp_test_tmp_path("bad_dtype", dir), 0, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned char *h = read_file(path, &n);
    char *f32 = memmem(h, n, "\"F32\"", 5);
    EXPECT(f32, "no F32 in %s", path);
    f32[1] = 'I';
    zpp_test_write_file(path, h, n);
    free(h);
    expect_import_refused("dtype", dir, tok, cfg, "is I32; zeropp reads BF16, F16 or F32");
    /* a truncated file */
    llama_write(&m, 1, zpp_test_tmp_path("bad_trunc", dir), 0, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned char *b = read_file(path, &n);
    zpp_test_write_file(path, b, n - 10);
    free(b);
    expect_import_refused("truncated", dir, tok, cfg, "truncated or damaged");
    /* a config that names another shape */
    llama_write(&m, 1, zpp_test_tmp_path("bad_cfg", dir), 0, NULL);
    char other[512];
    const char *bad_cfg = "{\"model\": {\"seq_len\": 16, \"n_layer\": 3}}";
    zpp_test_write_file(zpp_test_tmp_path("bad_cfg.json", other), bad_cfg, strlen(bad_cfg));
    expect_import_refused("config", dir, tok, other,
                          "'model.n_layer' is 3 in the config but 2 in");
    bad_cfg = "{\"model\": {\"seq_len\": 16, \"family\": \"gpt2\"}}";
    zpp_test_write_file(other, bad_cfg, strlen(bad_cfg));
    expect_import_refused("family", dir, tok, other, "sets 'model.family' to \"gpt2\"");
    llama_free(&m);
}

/* ---- Mistral and Qwen2 ------------------------------------------------------------- */

/* config.json of arch by hand, as transformers' MistralConfig / Qwen2Config
 * write it (the keys each has; window the sliding_window, 0 = null); the
 * tensors as arch_make made them. */
static void arch_write(const hf_llama *m, zpp_hf_arch arch, int window, const char *dir) {
    llama_write(m, 0, dir, 0, NULL); /* its config.json replaced below */
    char path[600], win[32], text[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (window) snprintf(win, sizeof win, "%d", window);
    else snprintf(win, sizeof win, "null");
    snprintf(text, sizeof text,
             "{\n  \"architectures\": [\"%s\"],\n  \"attention_dropout\": 0.0,\n"
             "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"silu\",\n"
             "  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n"
             "  \"intermediate_size\": %d,\n  \"max_position_embeddings\": %d,\n%s"
             "  \"model_type\": \"%s\",\n  \"num_attention_heads\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
             "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 500000.0,\n"
             "  \"sliding_window\": %s,\n  \"tie_word_embeddings\": false,\n"
             "  \"torch_dtype\": \"float32\",\n  \"transformers_version\": \"4.44.0\",\n"
             "  \"use_cache\": true,\n%s  \"vocab_size\": %d\n}\n",
             zpp_hf_arch_name(arch), C, F, MAX_T,
             arch == ZPP_HF_QWEN2 ? "  \"max_window_layers\": 2,\n" : "",
             arch == ZPP_HF_QWEN2 ? "qwen2" : "mistral", H, L, KV, win,
             arch == ZPP_HF_QWEN2 ? "  \"use_sliding_window\": false,\n" : "", V);
    zpp_test_write_file(path, text, strlen(text));
}

/* Resumed for a step from ckpt under a --config of the user's that gives
 * the model but not model.hf_architecture: an export is still the folder's
 * architecture, with its window. */
static void check_resumed_export(zpp_hf_arch arch, const char *tag, const char *tok,
                                 const char *ckpt) {
    char cfg[512], ckpt2[512], back[512], out[512], err[512], name[64], text[512], b[600];
    snprintf(name, sizeof name, "%s_resume.json", tag);
    zpp_test_tmp_path(name, cfg);
    snprintf(text, sizeof text,
             "{\"model\": {\"family\": \"llama\", \"n_layer\": %d, \"n_head\": %d, "
             "\"n_kv_head\": %d, \"n_embd\": %d, \"n_ffn\": %d, \"vocab_size\": %d, "
             "\"seq_len\": %d, \"rope_theta\": 500000, \"norm_eps\": 1e-05, "
             "\"untied_head\": true, \"qkv_bias\": %s}, \"train_micro_batch_size_per_gpu\": 2}\n",
             L, H, KV, C, F, V, T, arch == ZPP_HF_QWEN2 ? "true" : "false");
    zpp_test_write_file(cfg, text, strlen(text));
    snprintf(name, sizeof name, "%s_ckpt2", tag);
    zpp_test_tmp_path(name, ckpt2);
    zpp_test_tmp_path("resume_out.txt", out), zpp_test_tmp_path("resume_err.txt", err);
    const int rc = zpp_test_run_cli(1, out, err,
                                    "train --quiet --resume %s --config %s --data %s --steps 1 "
                                    "--save %s",
                                    ckpt, cfg, tok, ckpt2);
    EXPECT(rc == 0, "resume of %s failed (%d); see %s", ckpt, rc, err);
    snprintf(name, sizeof name, "%s_back2", tag);
    export_hf(ckpt2, zpp_test_tmp_path(name, back), "");
    snprintf(b, sizeof b, "%s/config.json", back);
    zpp_hf_config got;
    EXPECT(zpp_hf_config_read(b, &got) == ZPP_OK, "%s", zpp_last_error());
    EXPECT(!strcmp(got.architecture, zpp_hf_arch_name(arch)) &&
               got.sliding_window == (arch == ZPP_HF_MISTRAL ? 24 : 64),
           "%s after a resume: %s, sliding_window %d", b, got.architecture, got.sliding_window);
}

/* A Mistral (window 24 >= T) and a Qwen2 folder import (on 2 ranks), save
 * and export without --hf-config as themselves: the same tensor bytes, and
 * config.json names the architecture, its model_type and window, and no
 * attention_bias. */
static void check_arch_roundtrip(zpp_hf_arch arch, const char *tag, uint64_t stream) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream));
    hf_llama m = arch_make(&r, 0, arch);
    char dir[512], tok[512], cfg[512], ckpt[512], back[512], name[64], a[600], b[600];
    snprintf(name, sizeof name, "%s_in", tag);
    arch_write(&m, arch, arch == ZPP_HF_MISTRAL ? 24 : 64, zpp_test_tmp_path(name, dir));
    run_files(&r, tag, tok, cfg);
    snprintf(name, sizeof name, "%s_ckpt", tag);
    import_save(2, dir, tok, cfg, zpp_test_tmp_path(name, ckpt), "");
    snprintf(name, sizeof name, "%s_back", tag);
    export_hf(ckpt, zpp_test_tmp_path(name, back), "");
    snprintf(a, sizeof a, "%s/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/model.safetensors", back);
    expect_same_file(a, b);
    snprintf(b, sizeof b, "%s/config.json", back);
    zpp_hf_config got;
    EXPECT(zpp_hf_config_read(b, &got) == ZPP_OK, "%s", zpp_last_error());
    EXPECT(!strcmp(got.architecture, zpp_hf_arch_name(arch)), "%s names %s", b,
           got.architecture);
    EXPECT(got.sliding_window == (arch == ZPP_HF_MISTRAL ? 24 : 64), "%s: sliding_window %d", b,
           got.sliding_window);
    EXPECT(zpp_test_count_lines(b, arch == ZPP_HF_QWEN2 ? "\"qwen2\"" : "\"mistral\"") == 1 &&
               zpp_test_count_lines(b, "attention_bias") == 0,
           "%s: model_type or attention_bias", b);
    check_resumed_export(arch, tag, tok, ckpt);
    llama_free(&m);
}

static void test_mistral_roundtrip(void) { check_arch_roundtrip(ZPP_HF_MISTRAL, "mis", 11); }
static void test_qwen2_roundtrip(void) { check_arch_roundtrip(ZPP_HF_QWEN2, "qw2", 12); }

/* Mistral's and Qwen2's refusals, each one line naming what is wrong: a
 * window shorter than the run's sequences, a Qwen2 with an o_proj bias or
 * without its q bias, a Qwen2 sliding its window. */
static void test_arch_refusals(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(13));
    char tok[512], cfg[512], dir[512], path[600];
    run_files(&r, "arf", tok, cfg);
    hf_llama mis = arch_make(&r, 0, ZPP_HF_MISTRAL);
    arch_write(&mis, ZPP_HF_MISTRAL, T - 1, zpp_test_tmp_path("arf_window", dir));
    expect_import_refused("window", dir, tok, cfg, "exceeds 'model.hf_sliding_window' 15");
    hf_llama qw = arch_make(&r, 0, ZPP_HF_QWEN2);
    const hf_tensor q0 = qw.t[2]; /* layer 0's q_proj.bias */
    EXPECT(strstr(q0.name, "layers.0.self_attn.q_proj.bias"), "%s", q0.name);
    qw.t[qw.n++] = (hf_tensor){"model.layers.0.self_attn.o_proj.bias", 1, {C, 0}, C, q0.x};
    arch_write(&qw, ZPP_HF_QWEN2, 0, zpp_test_tmp_path("arf_obias", dir));
    expect_import_refused("qwen2 o bias", dir, tok, cfg,
                          "'model.layers.0.self_attn.o_proj.bias' is no part of a "
                          "Qwen2ForCausalLM");
    qw.n--;
    qw.t[2] = qw.t[--qw.n];
    arch_write(&qw, ZPP_HF_QWEN2, 0, zpp_test_tmp_path("arf_noq", dir));
    expect_import_refused("qwen2 q bias", dir, tok, cfg,
                          "'model.layers.0.self_attn.q_proj.bias' is missing");
    qw.t[qw.n++] = qw.t[2], qw.t[2] = q0;
    arch_write(&qw, ZPP_HF_QWEN2, 0, zpp_test_tmp_path("arf_slide", dir));
    size_t n;
    char *text = read_config(dir, path, sizeof path, &n);
    char *at = strstr(text, "\"use_sliding_window\": false");
    EXPECT(at, "%s", path);
    memcpy(at + 22, "true ", 5); /* same length: "false" -> "true " */
    zpp_test_write_file(path, text, n);
    free(text);
    expect_import_refused("qwen2 sliding", dir, tok, cfg, "use_sliding_window must be false");
    llama_free(&mis);
    llama_free(&qw);
}

/* ---- zeropp eval --init-from DIR --------------------------------------------------- */

/* The CPU model's mean loss over K batches of B sequences read from the
 * token file as llm.c's loader does (batch i: tokens [i B T, (i+1) B T],
 * targets one later), on units built by unit_of (not the importer). */
static double direct_loss(const hf_llama *m, const char *tok, int B, int K) {
    zpp_decoder_shape shape = test_shape(V);
    zpp_device *dev;
    zpp_model *model;
    EXPECT(zpp_device_create_host(&dev) == ZPP_OK);
    EXPECT(zpp_model_family_create("llama", &shape, ZPP_FP32, B, dev, &model) == ZPP_OK, "%s",
           zpp_last_error());
    float *units[L + 1];
    for (int u = 0; u <= L; u++) {
        units[u] = zpp_test_malloc(model->unit_numel[u] * sizeof(float));
        EXPECT(unit_of(m, u, V, units[u], model->unit_numel[u]) == model->unit_numel[u]);
    }
    size_t n;
    unsigned char *b = read_file(tok, &n);
    int32_t *ids = zpp_test_malloc((size_t)(B * T + 1) * sizeof(int32_t));
    double sum = 0.0;
    for (int i = 0; i < K; i++) {
        for (int j = 0; j <= B * T; j++) {
            uint16_t x;
            memcpy(&x, b + 1024 + 2 * ((size_t)i * B * T + (size_t)j), 2);
            ids[j] = x;
        }
        EXPECT(model->ops->set_batch(model, ids, ids + 1, B) == ZPP_OK);
        for (int s = 0; s < model->n_stages; s++)
            EXPECT(model->ops->forward(model, s, units[model->stage_unit[s]]) == ZPP_OK);
        sum += model->ops->loss(model);
    }
    for (int u = 0; u <= L; u++) free(units[u]);
    free(ids), free(b);
    model->ops->destroy(model);
    zpp_device_destroy(dev);
    return sum / K;
}

/* A bf16 folder (all four biases, sharded) scored by `zeropp eval
 * --init-from DIR` gives the loss of the CPU model on the folder's values
 * placed by the test's own layout: a tensor read into the wrong place, a
 * bias dropped or the batches misread moves it by far more than the
 * printed digits' 1e-8. Without --seq-len, T is max_position_embeddings;
 * a Mistral window below it is refused. */
static void test_eval_init_from(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(14));
    hf_llama m = llama_make(&r, 1);
    char dir[512], tok[512], cfg[512], out[512], err[512];
    llama_write(&m, 1, zpp_test_tmp_path("ev_in", dir), 3000, NULL);
    run_files(&r, "ev", tok, cfg);
    zpp_test_tmp_path("ev_out.txt", out), zpp_test_tmp_path("ev_err.txt", err);
    const int rc = zpp_test_run_cli(0, out, err, "eval --init-from %s --data %s --batch-size 2 "
                                    "--batches 3 --seq-len %d --json", dir, tok, T);
    EXPECT(rc == 0, "eval --init-from %s failed (%d); see %s", dir, rc, err);
    size_t n;
    char *text = (char *)read_file(out, &n);
    text[n] = 0;
    const char *p = strstr(text, "\"loss\": ");
    EXPECT(p, "no loss in %s", out);
    const double got = strtod(p + 8, NULL), want = direct_loss(&m, tok, 2, 3);
    free(text);
    EXPECT(isfinite(want) && fabs(got - want) <= 1e-7 * want, "eval %.9g, the CPU model %.9g",
           got, want);
    /* T = max_position_embeddings (32): 3 batches of 2 x 32 tokens fit the 4000 */
    EXPECT(zpp_test_run_cli(0, out, err, "eval --init-from %s --data %s --batch-size 2 "
                            "--batches 3", dir, tok) == 0, "see %s", err);
    hf_llama mis = arch_make(&r, 0, ZPP_HF_MISTRAL);
    arch_write(&mis, ZPP_HF_MISTRAL, T, zpp_test_tmp_path("ev_mistral", dir));
    EXPECT(zpp_test_run_cli(0, out, err, "eval --init-from %s --data %s --batch-size 2 "
                            "--batches 3", dir, tok) != 0 &&
               zpp_test_count_lines(err, "sliding_window 16 is shorter than the run's "
                                         "32-token sequences") == 1,
           "eval of a Mistral past its window: see %s", err);
    llama_free(&mis);
    llama_free(&m);
}

/* ---- What an export carries over besides the weights ---------------------------- */

/* Notes `note` beside the token file tok (as `zeropp tokenize` would),
 * then trains the model `model` (a config's "model" object) from scratch on
 * np ranks for `steps` steps on it, saving into ckpt (a path under the
 * test's folder, from tag). */
static void train_from_scratch(const char *tag, const char *tok, const zpp_tokfile_note *note,
                               const char *model, int np, int steps, char *ckpt) {
    char cfg[512], out[512], err[512], name[64], text[700];
    EXPECT(zpp_tokfile_note_write(tok, note) == ZPP_OK, "%s", zpp_last_error());
    snprintf(text, sizeof text, "{\"model\": %s, \"train_micro_batch_size_per_gpu\": 2}\n",
             model);
    snprintf(name, sizeof name, "%s_scratch.json", tag);
    zpp_test_write_file(zpp_test_tmp_path(name, cfg), text, strlen(text));
    snprintf(name, sizeof name, "%s_scratch", tag);
    zpp_test_tmp_path(name, ckpt);
    zpp_test_tmp_path("scratch_out.txt", out), zpp_test_tmp_path("scratch_err.txt", err);
    EXPECT(zpp_test_run_cli(np, out, err, "train --quiet --config %s --data %s --steps %d "
                            "--save %s", cfg, tok, steps, ckpt) == 0,
           "training from scratch failed; see %s", err);
}

/* The files beside the weights that an export copies from the folder the
 * model came from (tools/llmc.c's list, written here from transformers'
 * file names). */
static const char *const kCompanion[] = {
    "tokenizer.json",  "tokenizer_config.json",  "special_tokens_map.json", "tokenizer.model",
    "generation_config.json", "chat_template.jinja", "vocab.json", "merges.txt"};
enum { N_COMPANION = 8 };

/* `path` with fresh random bytes (0 to 3000 of them): an export copies the
 * files, it never reads them. */
static void write_random_file(zpp_rng *r, const char *path) {
    const size_t n = (size_t)(zpp_rng_u64(r) % 3001);
    unsigned char *b = zpp_test_malloc(n + 1);
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)zpp_rng_u64(r);
    zpp_test_write_file(path, b, n);
    free(b);
}

/* An export of ckpt into back with `args`; then back holds exactly
 * config.json, model.safetensors and the companions k with src[k] set,
 * each the same bytes as src[k]; config.json is cfg_dir's, or (cfg_dir
 * NULL) one written from the shape: no token ids, max_position_embeddings
 * the run's T. */
static void expect_export(const char *ckpt, const char *back, const char *args,
                          const char *cfg_dir, const char *const src[N_COMPANION]) {
    export_hf(ckpt, back, args);
    char a[700], b[700];
    int want = 2, got = 0;
    for (int k = 0; k < N_COMPANION; k++) {
        snprintf(b, sizeof b, "%s/%s", back, kCompanion[k]);
        EXPECT(exists(b) == (src[k] != NULL), "%s %s", b,
               src[k] ? "is missing" : "was copied, and should not be");
        if (src[k]) expect_same_file(src[k], b), want++;
    }
    DIR *d = opendir(back);
    for (struct dirent *e; d && (e = readdir(d));) got += e->d_name[0] != '.';
    if (d) closedir(d);
    EXPECT(got == want, "%s holds %d files, not the %d expected", back, got, want);
    snprintf(b, sizeof b, "%s/config.json", back);
    if (cfg_dir) {
        snprintf(a, sizeof a, "%s/config.json", cfg_dir);
        expect_same_file(a, b);
    } else {
        zpp_hf_config c;
        EXPECT(zpp_hf_config_read(b, &c) == ZPP_OK, "%s", zpp_last_error());
        EXPECT(c.bos_token_id == -1 && c.n_eos == 0 && c.max_position_embeddings == T,
               "%s: bos %d, %d eos, max_position_embeddings %d (want none, none, %d)", b,
               c.bos_token_id, c.n_eos, c.max_position_embeddings, T);
    }
}

/* An export is the model's whole folder. A folder with token ids in its
 * config.json, tokenizer.json and a random choice of the other companions
 * (random bytes each) and a file that is none of them (README.md), imported
 * on 2 ranks and saved at step 0: the export without --hf-config comes back
 * byte for byte, companions too, README.md not; config.json keeps the keys
 * zeropp ignores, and in another dtype only its torch_dtype changes. After
 * a resume the
 * checkpoint still knows the folder (its manifest's init_from): the same
 * config.json and companions. --tokenizer none copies none, --tokenizer
 * FILE that file as tokenizer.json, a folder without one is refused with
 * nothing written. With the folder gone the export still succeeds: its
 * config.json from the shape, no companions. A llama trained from scratch
 * on data whose note names a tokenizer.json gets that one. */
static void test_export_companions(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(14));
    hf_llama m = llama_make(&r, 0);
    char dir[512], tok[512], cfg[512], ckpt[512], ckpt2[512], back[512], path[700], out[512],
        err[512];
    char files[N_COMPANION][700];
    const char *src[N_COMPANION] = {NULL}, *none[N_COMPANION] = {NULL};
    llama_write(&m, 0, zpp_test_tmp_path("cmp_in", dir), 0, NULL);
    /* config.json with keys zeropp reads and ignores, as transformers writes
     * them: an export keeps them */
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t n = 0;
    char *text = (char *)read_file(path, &n);
    text[n] = 0;
    cJSON *j = cJSON_Parse(text);
    EXPECT(j && cJSON_AddNumberToObject(j, "initializer_range", 0.02) &&
           cJSON_AddStringToObject(j, "transformers_version", "4.44.0"));
    free(text);
    text = cJSON_Print(j);
    zpp_test_write_file(path, text, strlen(text));
    cJSON_free(text), cJSON_Delete(j);
    /* tokenizer.json, and each other companion at random but at least one */
    const int one = 1 + (int)(zpp_rng_u64(&r) % (N_COMPANION - 1));
    for (int k = 0; k < N_COMPANION; k++) {
        snprintf(files[k], sizeof files[k], "%s/%s", dir, kCompanion[k]);
        if (k == 0 || k == one || zpp_rng_u64(&r) % 2)
            write_random_file(&r, files[k]), src[k] = files[k];
    }
    snprintf(path, sizeof path, "%s/README.md", dir);
    write_random_file(&r, path);
    run_files(&r, "cmp", tok, cfg);
    import_save(2, dir, tok, cfg, zpp_test_tmp_path("cmp_ckpt", ckpt), "");
    expect_export(ckpt, zpp_test_tmp_path("cmp_back", back), "", dir, src);

    zpp_test_tmp_path("cmp_ckpt2", ckpt2);
    EXPECT(zpp_test_run_cli(1, zpp_test_tmp_path("cmp_out.txt", out),
                            zpp_test_tmp_path("cmp_err.txt", err),
                            "train --quiet --resume %s --steps 1 --save %s", ckpt, ckpt2) == 0,
           "resume of %s failed; see %s", ckpt, err);
    expect_export(ckpt2, zpp_test_tmp_path("cmp_back2", back), "", dir, src);
    expect_export(ckpt2, zpp_test_tmp_path("cmp_none", back), "--tokenizer none", dir, none);
    /* another dtype: the same config.json but for torch_dtype */
    export_hf(ckpt2, zpp_test_tmp_path("cmp_bf16", back), "--dtype bf16");
    {
        char a[700], b[700];
        size_t na = 0, nb = 0;
        char *ta = read_config(dir, a, sizeof a, &na), *tb = read_config(back, b, sizeof b, &nb);
        cJSON *ja = cJSON_Parse(ta), *jb = cJSON_Parse(tb);
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(jb, "torch_dtype");
        EXPECT(ja && jb && cJSON_IsString(dt) && !strcmp(dt->valuestring, "bfloat16"),
               "%s: torch_dtype is not \"bfloat16\"", b);
        cJSON_DeleteItemFromObjectCaseSensitive(ja, "torch_dtype");
        cJSON_DeleteItemFromObjectCaseSensitive(jb, "torch_dtype");
        EXPECT(cJSON_Compare(ja, jb, 1), "%s is not %s but for torch_dtype", b, a);
        cJSON_Delete(ja), cJSON_Delete(jb), free(ta), free(tb);
    }
    char other[512], args[600];
    const char *just_file[N_COMPANION] = {zpp_test_tmp_path("cmp_other.json", other)};
    write_random_file(&r, other);
    snprintf(args, sizeof args, "--tokenizer %s", other);
    expect_export(ckpt2, zpp_test_tmp_path("cmp_file", back), args, dir, just_file);
    zpp_test_tmp_path("cmp_refused", back);
    EXPECT(zpp_test_run_cli(0, out, err, "export --from %s --to %s --tokenizer %s", ckpt2, back,
                            zpp_test_tmp_path("cmp_ckpt", path)) != 0 &&
               zpp_test_count_lines(err, "holds no tokenizer.json") == 1 && !exists(back),
           "export --tokenizer of a folder without tokenizer.json: see %s", err);

    char gone[600];
    snprintf(gone, sizeof gone, "%s.gone", dir);
    EXPECT(rename(dir, gone) == 0, "cannot rename %s", dir);
    expect_export(ckpt2, zpp_test_tmp_path("cmp_gone", back), "", NULL, none);
    EXPECT(zpp_test_count_lines(zpp_test_tmp_path("export_out.txt", out), "is gone") == 1,
           "the export does not say that the folder is gone; see %s", out);
    EXPECT(rename(gone, dir) == 0, "cannot rename %s back", gone);

    /* from scratch: the data's note names the tokenizer */
    char *abs_other = realpath(other, NULL), scratch[512], model[256];
    const zpp_tokfile_note note = {NULL, NULL, V, 4000, abs_other};
    snprintf(model, sizeof model,
             "{\"family\": \"llama\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, "
             "\"vocab_size\": %d, \"seq_len\": %d}", V, T);
    train_from_scratch("cmp", tok, &note, model, 1, 1, scratch);
    expect_export(scratch, zpp_test_tmp_path("cmp_scratch_back", back), "", NULL, just_file);
    free(abs_other);
    llama_free(&m);
}

/* A folder that takes 4096 positions, trained without a seq_len: a note says
 * that T is the default and how to set it; with one set, no note. */
static void test_seq_len_note(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(15));
    hf_llama m = llama_make(&r, 0);
    m.cfg.max_position_embeddings = 4096;
    char dir[512], tok[512], cfg[512], out[512], err[512], ck[512];
    llama_write(&m, 0, zpp_test_tmp_path("note_in", dir), 0, NULL);
    run_files(&r, "note", tok, cfg);
    zpp_test_tmp_path("note_out.txt", out), zpp_test_tmp_path("note_err.txt", err);
    EXPECT(zpp_test_run_cli(1, out, err, "train --init-from %s --data %s --steps 0 --save %s",
                            dir, tok, zpp_test_tmp_path("note_ck", ck)) == 0,
           "see %s", err);
    EXPECT(zpp_test_count_lines(out, "model.seq_len's default; the model takes up to 4096") == 1,
           "no note of the default seq_len in %s", out);
    EXPECT(zpp_test_run_cli(1, out, err, "train --init-from %s --data %s --config %s --steps 0 "
                            "--save %s", dir, tok, cfg, zpp_test_tmp_path("note_ck2", ck)) == 0,
           "see %s", err);
    EXPECT(zpp_test_count_lines(out, "model.seq_len's default") == 0,
           "a note of the default seq_len with seq_len set, in %s", out);
    llama_free(&m);
}

/* ---- A GPT-2 as GPT2LMHeadModel ------------------------------------------------- */

/* One HF GPT-2 tensor and where it is in the checkpoint's units (gpt2.h's
 * layout, written out here from its field names): GPT-2's Conv1D keeps a
 * layer's weight [in][out], the transpose of the unit's [out][in]. */
typedef struct gpt2_place {
    const char *name; /* after "transformer." and, in a block, "h.N." */
    int block;        /* 0: unit 0; 1: every block */
    size_t offset;
    int64_t rows, cols; /* the HF shape; cols 0: a vector */
    int transposed;
} gpt2_place;

/* Every tensor of the export of ckpt in `back` (one file) holds the
 * checkpoint's masters at its place, rounded to `dtype`. */
static void check_gpt2_values(const char *ckpt, const char *back, zpp_dtype dtype) {
    zpp_ckpt_manifest man;
    float **units = NULL;
    EXPECT(zpp_checkpoint_read_masters(ckpt, &man, &units) == ZPP_OK, "%s", zpp_last_error());
    const zpp_gpt2_config *g = &man.model;
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(g, &l);
    const int64_t C = g->n_embd, V = zpp_gpt2_real_vocab(g);
    const gpt2_place places[] = {
        {"wte.weight", 0, l.wte, V, C, 0},         {"wpe.weight", 0, l.wpe, g->seq_len, C, 0},
        {"ln_f.weight", 0, l.lnf_w, C, 0, 0},      {"ln_f.bias", 0, l.lnf_b, C, 0, 0},
        {"ln_1.weight", 1, l.ln1_w, C, 0, 0},      {"ln_1.bias", 1, l.ln1_b, C, 0, 0},
        {"attn.c_attn.weight", 1, l.qkv_w, C, 3 * C, 1},
        {"attn.c_attn.bias", 1, l.qkv_b, 3 * C, 0, 0},
        {"attn.c_proj.weight", 1, l.proj_w, C, C, 1},
        {"attn.c_proj.bias", 1, l.proj_b, C, 0, 0}, {"ln_2.weight", 1, l.ln2_w, C, 0, 0},
        {"ln_2.bias", 1, l.ln2_b, C, 0, 0},         {"mlp.c_fc.weight", 1, l.fc_w, C, 4 * C, 1},
        {"mlp.c_fc.bias", 1, l.fc_b, 4 * C, 0, 0},  {"mlp.c_proj.weight", 1, l.fc2_w, 4 * C, C, 1},
        {"mlp.c_proj.bias", 1, l.fc2_b, C, 0, 0}};
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", back);
    zpp_st_file *f = NULL;
    EXPECT(zpp_st_open(path, &f) == ZPP_OK, "%s", zpp_last_error());
    size_t found = 0;
    for (size_t k = 0; k < sizeof places / sizeof *places; k++) {
        const gpt2_place *p = &places[k];
        for (int b = 0; b < (p->block ? g->n_layer : 1); b++) {
            char name[96];
            if (p->block) snprintf(name, sizeof name, "transformer.h.%d.%s", b, p->name);
            else snprintf(name, sizeof name, "transformer.%s", p->name);
            const zpp_st_tensor *t = zpp_st_find(f, name);
            EXPECT(t != NULL, "%s holds no %s", path, name);
            const int64_t cols = p->cols ? p->cols : 1;
            EXPECT(t->ndim == (p->cols ? 2 : 1) && t->shape[0] == p->rows &&
                       (!p->cols || t->shape[1] == p->cols),
                   "%s: %s has another shape", path, name);
            float *got = zpp_test_malloc((size_t)(p->rows * cols) * sizeof *got);
            EXPECT(zpp_st_read_f32(f, t, 0, (size_t)(p->rows * cols), got) == ZPP_OK, "%s",
                   zpp_last_error());
            const float *x = units[p->block ? b + 1 : 0] + p->offset;
            for (int64_t r = 0; r < p->rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    const float v = p->transposed ? x[c * p->rows + r] : x[r * cols + c];
                    float want = v;
                    if (dtype != ZPP_FP32) { /* the export's rounding, read back widened */
                        float h[1]; /* room for any dtype's element */
                        zpp_store_f32(h, dtype, 0, v);
                        want = zpp_load_f32(h, dtype, 0);
                    }
                    EXPECT(got[r * cols + c] == want, "%s[%lld][%lld]: %g, the unit's %g", name,
                           (long long)r, (long long)c, (double)got[r * cols + c], (double)want);
                }
            free(got);
            found++;
        }
    }
    EXPECT(zpp_st_count(f) == found, "%s holds %zu tensors, GPT2LMHeadModel's are %zu", path,
           zpp_st_count(f), found);
    zpp_st_close(f);
    for (int u = 0; u < man.n_units; u++) free(units[u]);
    free(units);
    zpp_ckpt_manifest_free(&man);
}

/* A GPT-2 (2 layers of 16, 2 heads, T, the model keys `vocab` besides)
 * trained 2 steps from scratch on np ranks on run_files' tokens (tok),
 * which are noted as made with the 320-token GPT-2 tokenizer in tests/data
 * (its vocab.json and merges.txt into vocab, merges); the checkpoint in
 * ckpt. */
static void gpt2_from_scratch(zpp_rng *r, const char *tag, const char *vocab_keys, int np,
                              char *tok, char *cfg, char *ckpt, char *vocab, char *merges) {
    char model[256];
    run_files(r, tag, tok, cfg);
    zpp_test_data("shakespeare-bpe/vocab.json", vocab, 512);
    zpp_test_data("shakespeare-bpe/merges.txt", merges, 512);
    char *av = realpath(vocab, NULL), *am = realpath(merges, NULL);
    const zpp_tokfile_note note = {av, am, 320, 4000, NULL};
    snprintf(model, sizeof model,
             "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 16, \"seq_len\": %d, %s}", T,
             vocab_keys);
    train_from_scratch(tag, tok, &note, model, np, 2, ckpt);
    free(av), free(am);
}

/* A GPT-2 trained from scratch (2 ranks, a vocabulary padded past the
 * data's) exports as GPT2LMHeadModel: each tensor the checkpoint's masters
 * at their place (the Conv1D weights transposed), fp32 and bf16; shards that
 * pass the format's rules; config.json as GPT2Config reads it; the data's
 * GPT-2 tokenizer files copied. --hf-config is refused for a GPT-2. */
static void test_gpt2_export(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(16));
    char tok[512], cfg[512], ckpt[512], back[512], out[512], err[512], path[700], vocab[512],
        merges[512], keys[64];
    snprintf(keys, sizeof keys, "\"vocab_size\": 48, \"real_vocab_size\": %d", V);
    gpt2_from_scratch(&r, "g2", keys, 2, tok, cfg, ckpt, vocab, merges);
    zpp_test_tmp_path("g2_out.txt", out), zpp_test_tmp_path("g2_err.txt", err);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        export_hf(ckpt, zpp_test_tmp_path(bf16 ? "g2_b16" : "g2_f32", back),
                  bf16 ? "--dtype bf16" : "--dtype fp32");
        check_gpt2_values(ckpt, back, bf16 ? ZPP_BF16 : ZPP_FP32);
        snprintf(path, sizeof path, "%s/model.safetensors", back);
        validate_file(path);
        snprintf(path, sizeof path, "%s/vocab.json", back);
        expect_same_file(vocab, path);
        snprintf(path, sizeof path, "%s/merges.txt", back);
        expect_same_file(merges, path);
        size_t n = 0;
        char *c = read_config(back, path, sizeof path, &n);
        cJSON *j = cJSON_Parse(c);
        free(c);
        const char *want_dtype = bf16 ? "bfloat16" : "float32";
        const struct {
            const char *key;
            double v;
        } nums[] = {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 16}, {"n_positions", T},
                    {"vocab_size", V}, {"layer_norm_epsilon", 1e-5}};
        for (size_t k = 0; k < sizeof nums / sizeof *nums; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, nums[k].key);
            EXPECT(cJSON_IsNumber(v) && v->valuedouble == nums[k].v, "%s: %s", path, nums[k].key);
        }
        const cJSON *arch =
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0);
        const char *strs[][2] = {{"model_type", "gpt2"}, {"activation_function", "gelu_new"},
                                 {"torch_dtype", want_dtype}};
        EXPECT(cJSON_IsString(arch) && !strcmp(arch->valuestring, "GPT2LMHeadModel"), "%s", path);
        for (size_t k = 0; k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, strs[k][0]);
            EXPECT(cJSON_IsString(v) && !strcmp(v->valuestring, strs[k][1]), "%s: %s", path,
                   strs[k][0]);
        }
        EXPECT(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")) &&
                   cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "bos_token_id")),
               "%s: tie_word_embeddings, or a bos_token_id for a vocabulary not GPT-2's", path);
        cJSON_Delete(j);
    }
    /* shards: each file and the index by the format's rules */
    export_hf(ckpt, zpp_test_tmp_path("g2_shards", back), "--max-shard-size 3000");
    int tensors = 0, files = 0;
    DIR *d = opendir(back);
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t k = strlen(e->d_name);
        if (k < 12 || strcmp(e->d_name + k - 12, ".safetensors")) continue;
        snprintf(path, sizeof path, "%s/%s", back, e->d_name);
        files++, tensors += validate_file(path);
    }
    if (d) closedir(d);
    EXPECT(files > 2 && tensors == 4 + 12 * 2, "%d files, %d tensors", files, tensors);
    validate_index(back, tensors);
    EXPECT(zpp_test_run_cli(0, out, err, "export --from %s --to %s --format hf --hf-config %s",
                            ckpt, zpp_test_tmp_path("g2_refused", back), cfg) != 0 &&
               zpp_test_count_lines(err, "--hf-config is for a llama") == 1 && !exists(back),
           "--hf-config with a GPT-2: see %s", err);
}

/* A GPT-2 folder in: the export of test_gpt2_export's kind of checkpoint,
 * sharded, imported on 3 ranks (--steps 0) exports back byte for byte,
 * vocab.json and merges.txt with it (copied from the folder imported); a
 * model.vocab_size padding the folder's rows is taken; GPT2Model's names
 * (no "transformer.") with its causal-mask buffers import alike; and a
 * config.json of another model, a missing tensor or another shape are
 * refused naming what is wrong. */
static void test_gpt2_import(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(17));
    char tok[512], cfg[512], ckpt[512], src[512], ck2[512], back[512], out[512], err[512],
        path[700], vocab[512], merges[512], keys[64];
    snprintf(keys, sizeof keys, "\"vocab_size\": %d", V);
    gpt2_from_scratch(&r, "g2i", keys, 1, tok, cfg, ckpt, vocab, merges);
    export_hf(ckpt, zpp_test_tmp_path("g2i_src", src), "--max-shard-size 3000");
    zpp_test_tmp_path("g2i_out.txt", out), zpp_test_tmp_path("g2i_err.txt", err);
    EXPECT(zpp_test_run_cli(3, out, err, "train --quiet --init-from %s --data %s --steps 0 "
                            "--save %s", src, tok, zpp_test_tmp_path("g2i_ck2", ck2)) == 0,
           "import of %s failed; see %s", src, err);
    export_hf(ck2, zpp_test_tmp_path("g2i_back", back), "--max-shard-size 3000");
    expect_same_folder(src, back);
    /* padded rows: the same export (they are no tensor) */
    EXPECT(zpp_test_run_cli(2, out, err, "train --quiet --init-from %s --data %s --steps 0 "
                            "--set model.vocab_size=64 --save %s",
                            src, tok, zpp_test_tmp_path("g2i_pad", ck2)) == 0,
           "import with a padded vocabulary failed; see %s", err);
    export_hf(ck2, zpp_test_tmp_path("g2i_padback", back), "--max-shard-size 3000");
    expect_same_folder(src, back);

    /* GPT2Model's names and buffers: the one-file export renamed */
    char one[512], bare[512];
    export_hf(ckpt, zpp_test_tmp_path("g2i_one", one), "");
    zpp_test_tmp_path("g2i_bare", bare);
    EXPECT(mkdir(bare, 0777) == 0, "cannot make %s", bare);
    snprintf(path, sizeof path, "%s/model.safetensors", one);
    zpp_st_file *f = NULL;
    EXPECT(zpp_st_open(path, &f) == ZPP_OK, "%s", zpp_last_error());
    const size_t n = zpp_st_count(f);
    zpp_st_source s[64];
    char names[64][64];
    float *data[64];
    EXPECT(n + 2 <= 64, "%zu tensors", n);
    for (size_t k = 0; k < n; k++) {
        const zpp_st_tensor *t = zpp_st_tensor_at(f, k);
        data[k] = zpp_test_malloc(t->numel * sizeof(float));
        EXPECT(zpp_st_read_f32(f, t, 0, t->numel, data[k]) == ZPP_OK, "%s", zpp_last_error());
        snprintf(names[k], sizeof names[k], "%s", t->name + strlen("transformer."));
        s[k] = (zpp_st_source){.name = names[k], .dtype = ZPP_ST_F32, .ndim = t->ndim,
                               .data = data[k]};
        s[k].shape[0] = t->shape[0], s[k].shape[1] = t->shape[1];
    }
    float mask[T * T];
    for (int i = 0; i < T * T; i++) mask[i] = (float)(i % T <= i / T);
    for (int b = 0; b < 2; b++) { /* h.N.attn.bias: [1, 1, T, T] */
        snprintf(names[n + b], sizeof names[n + b], "h.%d.attn.bias", b);
        s[n + b] = (zpp_st_source){.name = names[n + b], .dtype = ZPP_ST_F32, .ndim = 4,
                                   .data = mask};
        s[n + b].shape[0] = 1, s[n + b].shape[1] = 1, s[n + b].shape[2] = T, s[n + b].shape[3] = T;
    }
    EXPECT(zpp_st_write_dir(bare, s, n + 2, 0, NULL) == ZPP_OK, "%s", zpp_last_error());
    zpp_st_close(f);
    char a[700], b2[700];
    snprintf(a, sizeof a, "%s/config.json", one);
    snprintf(b2, sizeof b2, "%s/config.json", bare);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp %s %s", a, b2);
    EXPECT(system(cmd) == 0, "%s", cmd);
    EXPECT(zpp_test_run_cli(1, out, err, "train --quiet --init-from %s --data %s --steps 0 "
                            "--save %s", bare, tok, zpp_test_tmp_path("g2i_bareck", ck2)) == 0,
           "import of GPT2Model's names failed; see %s", err);
    export_hf(ck2, zpp_test_tmp_path("g2i_bareback", back), "--tokenizer none");
    snprintf(a, sizeof a, "%s/model.safetensors", one);
    snprintf(b2, sizeof b2, "%s/model.safetensors", back);
    expect_same_file(a, b2);

    /* refusals, each naming what is wrong */
    static const struct {
        const char *key, *value, *says;
    } bad[] = {{"activation_function", "\"relu\"", "activation_function relu"},
               {"n_inner", "40", "n_inner 40"},
               {"layer_norm_epsilon", "1e-6", "layer_norm_epsilon 1e-06"},
               {"tie_word_embeddings", "false", "tie_word_embeddings must be true"}};
    size_t nc = 0;
    char *orig = read_config(bare, b2, sizeof b2, &nc); /* b2: its path */
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        cJSON *j = cJSON_Parse(orig);
        EXPECT(j != NULL, "%s is not JSON", b2);
        cJSON_DeleteItemFromObjectCaseSensitive(j, bad[k].key);
        cJSON_AddRawToObject(j, bad[k].key, bad[k].value);
        char *text = cJSON_Print(j);
        zpp_test_write_file(b2, text, strlen(text));
        cJSON_free(text), cJSON_Delete(j);
        EXPECT(zpp_test_run_cli(1, out, err, "train --quiet --init-from %s --data %s --steps 0",
                                bare, tok) != 0 &&
                   zpp_test_count_lines(err, bad[k].says) == 1,
               "a config.json with %s %s was not refused naming it; see %s", bad[k].key,
               bad[k].value, err);
    }
    zpp_test_write_file(b2, orig, nc);
    free(orig);
    snprintf(path, sizeof path, "%s/model.safetensors", bare);
    EXPECT(unlink(path) == 0, "cannot remove %s", path);
    size_t wpe = 0; /* wpe alone, a row short */
    while (wpe < n && strcmp(names[wpe], "wpe.weight")) wpe++;
    EXPECT(wpe < n, "no wpe.weight among the tensors");
    s[wpe].shape[0] = T - 1;
    EXPECT(zpp_st_write_dir(bare, s + wpe, 1, 0, NULL) == ZPP_OK, "%s", zpp_last_error());
    EXPECT(zpp_test_run_cli(1, out, err, "train --quiet --init-from %s --data %s --steps 0",
                            bare, tok) != 0 &&
               zpp_test_count_lines(err, "wpe.weight") == 1,
           "a folder with a short wpe and tensors missing was not refused; see %s", err);
    for (size_t k = 0; k < n; k++) free(data[k]);
}

ZPP_TESTS(ZPP_TEST(test_roundtrip_fp32_single), ZPP_TEST(test_roundtrip_bf16_single),
          ZPP_TEST(test_roundtrip_fp32_sharded), ZPP_TEST(test_roundtrip_bf16_sharded),
          ZPP_TEST(test_roundtrip_fp16_sharded),
          ZPP_TEST(test_ranks_agree), ZPP_TEST(test_other_order), ZPP_TEST(test_unit_layout),
          ZPP_TEST(test_checkpoint_reshard_and_refusals), ZPP_TEST(test_refusals),
          ZPP_TEST(test_mistral_roundtrip), ZPP_TEST(test_qwen2_roundtrip),
          ZPP_TEST(test_arch_refusals), ZPP_TEST(test_eval_init_from),
          ZPP_TEST(test_export_companions), ZPP_TEST(test_seq_len_note),
          ZPP_TEST(test_gpt2_export), ZPP_TEST(test_gpt2_import))
