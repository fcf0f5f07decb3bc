/* llama_hf_helper.c — the C side of tests/torch/llama_parity.sh.
 *
 *   llama_hf_helper make DIR SEED
 *     writes a random Llama in Hugging Face's form into DIR (which must
 *     exist): config.json (LlamaForCausalLM: 2 layers, hidden 256, 4 query
 *     heads of 64 for 1 key/value head (GQA 4:1), intermediate 384,
 *     vocabulary 512, rope_theta 500000, untied head, fp32) and
 *     model.safetensors (HF's tensor names, through train/safetensors.h);
 *     beside them tokens.bin (an llm.c token file of random ids) and
 *     zeropp.json (the zeropp config of the same model and of the run the
 *     parity test trains: fp32 ZeRO-3, global batch 4, sequential data,
 *     constant lr, AdamW with clipping).
 *   mpirun -np W llama_hf_helper train DIR STEPS
 *     trains that model on W ranks through the public API (zeropp.h):
 *     zpp_model_create_decoder with zeropp.json's "model" section, each
 *     rank's shard of every unit set from the HF tensors (q, k, v stacked
 *     into the unit's fused matrix, gate and up likewise, model/llama.h's
 *     layout), the batches `zeropp train --data-order sequential` reads
 *     (data.h), and prints one JSON line per step on rank 0:
 *     {"step": s, "loss": L}, L the world's mean loss before the update.
 *     What `zeropp train --init-from DIR` computes, available before that
 *     option reads HF folders: it checks the float64 reference's math
 *     against the engine now.
 *
 * The weights: matrices N(0, 0.02^2) as HF's initialisation, the norm gains
 * 1 + N(0, 0.1^2) (not all ones, so a gain read into the wrong place
 * shows), each a pure function of (seed, tensor, index). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/random.h"
#include "train/config.h"
#include "train/hf_config.h"
#include "train/safetensors.h"
#include "zeropp.h"

enum { L_ = 2, C_ = 256, H_ = 4, KV_ = 1, HD_ = 64, F_ = 384, V_ = 512, T_ = 64, G_ = 4 };
enum { N_TOKENS = 40000 };
#define CK (KV_ * HD_) /* the width of k and of v */

static int die(const char *what) {
    fprintf(stderr, "llama_hf_helper: %s: %s\n", what, zpp_last_error());
    return 1;
}

/* One HF tensor: its name, shape and kind (matrix or norm gain). */
typedef struct hf_tensor {
    char name[96];
    int rows, cols; /* cols 0: a vector of `rows` */
    float *data;
} hf_tensor;

static void fill(hf_tensor *t, uint64_t seed, int id) {
    const size_t n = (size_t)t->rows * (size_t)(t->cols ? t->cols : 1);
    t->data = malloc(n * sizeof *t->data);
    if (!t->data) exit(1);
    for (size_t i = 0; i < n; i++) {
        const double z = zpp_param_normal(seed, id, i);
        t->data[i] = (float)(t->cols ? 0.02 * z : 1.0 + 0.1 * z);
    }
}

/* The model's tensors in HF's names, in a fixed order (ids for fill). */
static int make_tensors(hf_tensor *t, uint64_t seed) {
    int n = 0;
#define ADD(r, c, ...)                                                   \
    do {                                                                 \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);             \
        t[n].rows = (r), t[n].cols = (c);                                \
        fill(&t[n], seed, n);                                            \
        n++;                                                             \
    } while (0)
    ADD(V_, C_, "model.embed_tokens.weight");
    for (int l = 0; l < L_; l++) {
        ADD(C_, 0, "model.layers.%d.input_layernorm.weight", l);
        ADD(C_, C_, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(CK, C_, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(CK, C_, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(C_, C_, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(C_, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(F_, C_, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(F_, C_, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(C_, F_, "model.layers.%d.mlp.down_proj.weight", l);
    }
    ADD(C_, 0, "model.norm.weight");
    ADD(V_, C_, "lm_head.weight");
#undef ADD
    return n;
}
#define N_TENSORS (1 + 9 * L_ + 2)

static const char kZeroppConfig[] =
    "{\"train_batch_size\": %d, \"gradient_clipping\": 1.0,\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"betas\": [0.9, 0.95],"
    " \"eps\": 1e-8, \"weight_decay\": 0.1}},\n"
    " \"bf16\": {\"enabled\": false},\n"
    " \"zero_optimization\": {\"stage\": 3},\n"
    " \"model\": {\"family\": \"llama\", \"n_layer\": %d, \"n_embd\": %d, \"n_head\": %d,"
    " \"n_kv_head\": %d, \"n_ffn\": %d, \"seq_len\": %d, \"vocab_size\": %d,"
    " \"rope_theta\": 500000, \"norm_eps\": 1e-5, \"untied_head\": true},\n"
    " \"zeropp\": {\"eval_every\": 0, \"data_order\": \"sequential\", \"seed\": 1}}\n";

static int write_text(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "llama_hf_helper: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* llm.c's token file, version 1: 256 int32 of header (magic 20240520,
 * version 1, count), then uint16 ids. Random ids with a little structure
 * (a token often repeats the one two back) so that training has something
 * to learn. */
static int write_tokens(const char *dir, uint64_t seed) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    int32_t header[256] = {20240520, 1, N_TOKENS};
    uint16_t *ids = malloc(N_TOKENS * sizeof *ids);
    if (!ids) return 1;
    uint64_t s = zpp_mix64(seed ^ 0x746f6b656e73ull);
    for (int i = 0; i < N_TOKENS; i++) {
        s = zpp_mix64(s + 1);
        ids[i] = (uint16_t)(i >= 2 && (s >> 60) < 6 ? ids[i - 2] : (s >> 8) % V_);
    }
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(header, sizeof header, 1, f) != 1 ||
              fwrite(ids, sizeof *ids, N_TOKENS, f) != N_TOKENS;
    if (f && fclose(f) != 0) bad = 1;
    free(ids);
    if (bad) fprintf(stderr, "llama_hf_helper: cannot write %s\n", path);
    return bad;
}

static int make(const char *dir, uint64_t seed) {
    hf_tensor t[N_TENSORS];
    const int n = make_tensors(t, seed);
    zpp_st_source src[N_TENSORS];
    memset(src, 0, sizeof src);
    for (int i = 0; i < n; i++) {
        src[i].name = t[i].name;
        src[i].dtype = ZPP_ST_F32;
        src[i].ndim = t[i].cols ? 2 : 1;
        src[i].shape[0] = t[i].rows;
        src[i].shape[1] = t[i].cols;
        src[i].data = t[i].data;
    }
    if (zpp_st_write_dir(dir, src, (size_t)n, 0, NULL) != ZPP_OK) return die("model.safetensors");
    for (int i = 0; i < n; i++) free(t[i].data);
    zpp_hf_config hc;
    memset(&hc, 0, sizeof hc);
    snprintf(hc.architecture, sizeof hc.architecture, "LlamaForCausalLM");
    hc.hidden_size = C_, hc.intermediate_size = F_, hc.num_hidden_layers = L_;
    hc.num_attention_heads = H_, hc.num_key_value_heads = KV_, hc.head_dim = HD_;
    hc.vocab_size = V_, hc.max_position_embeddings = T_, hc.rms_norm_eps = 1e-5;
    hc.rope_theta = 500000, hc.tie_word_embeddings = 0, hc.torch_dtype = ZPP_FP32;
    hc.bos_token_id = -1;
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (zpp_hf_config_write(path, &hc) != ZPP_OK) return die("config.json");
    char cfg[2048];
    snprintf(cfg, sizeof cfg, kZeroppConfig, G_, L_, C_, H_, KV_, F_, T_, V_);
    return write_text(dir, "zeropp.json", cfg) || write_tokens(dir, seed);
}

/* ---- train ----------------------------------------------------------------- */

/* Unit u of the model as llama.h lays it out, from the HF tensors t. */
static float *unit_values(const hf_tensor *t, int u, size_t *numel_p) {
    const hf_tensor *src[16];
    int k = 0;
    if (u == 0) {
        src[k++] = &t[0];                 /* wte = embed_tokens */
        src[k++] = &t[N_TENSORS - 2];     /* norm_f = model.norm */
        src[k++] = &t[N_TENSORS - 1];     /* head = lm_head */
    } else {
        const hf_tensor *b = &t[1 + 9 * (u - 1)];
        /* HF's order is the unit's: norm1, [q; k; v], o, norm2, [gate; up], down */
        for (int i = 0; i < 9; i++) src[k++] = &b[i];
    }
    size_t n = 0;
    for (int i = 0; i < k; i++) n += (size_t)src[i]->rows * (size_t)(src[i]->cols ? src[i]->cols : 1);
    float *out = malloc(n * sizeof *out);
    if (!out) exit(1);
    size_t o = 0;
    for (int i = 0; i < k; i++) {
        const size_t m = (size_t)src[i]->rows * (size_t)(src[i]->cols ? src[i]->cols : 1);
        memcpy(out + o, src[i]->data, m * sizeof *out);
        o += m;
    }
    *numel_p = n;
    return out;
}

/* The HF tensors read back from DIR/model.safetensors by name. */
static int read_tensors(const char *dir, hf_tensor *t) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    make_tensors(t, 0); /* names and shapes; the values are read over them */
    zpp_st_file *f = NULL;
    if (zpp_st_open(path, &f) != ZPP_OK) return die("open model.safetensors");
    for (int i = 0; i < N_TENSORS; i++) {
        const zpp_st_tensor *x = zpp_st_find(f, t[i].name);
        const size_t n = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        if (!x || x->numel != n || zpp_st_read_f32(f, x, 0, n, t[i].data) != ZPP_OK) {
            zpp_st_close(f);
            fprintf(stderr, "llama_hf_helper: %s: tensor %s missing or wrong\n", path, t[i].name);
            return 1;
        }
    }
    zpp_st_close(f);
    return 0;
}

static int read_token_file(const char *dir, int32_t **ids_p, size_t *n_p) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    FILE *f = fopen(path, "rb");
    int32_t header[256];
    if (!f || fread(header, sizeof header, 1, f) != 1 || header[0] != 20240520 || header[1] != 1)
        return fprintf(stderr, "llama_hf_helper: %s is not a version-1 token file\n", path), 1;
    const size_t n = (size_t)header[2];
    uint16_t *raw = malloc(n * sizeof *raw);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!raw || !ids || fread(raw, sizeof *raw, n, f) != n) return 1;
    fclose(f);
    for (size_t i = 0; i < n; i++) ids[i] = raw[i];
    free(raw);
    *ids_p = ids;
    *n_p = n;
    return 0;
}

/* The engine's options from zeropp.json, as `zeropp train` reads them. */
static zpp_engine_config engine_config(const zpp_train_config *c) {
    zpp_engine_config e = zpp_engine_config_default();
    e.mode = ZPP_MODE_ZERO3;
    e.work_dtype = ZPP_FP32;
    e.beta1 = (float)c->optimizer.beta1;
    e.beta2 = (float)c->optimizer.beta2;
    e.eps = (float)c->optimizer.eps;
    e.weight_decay = (float)c->optimizer.weight_decay;
    e.grad_clip = (float)c->gradient_clipping;
    e.decay_all = c->weight_decay_all;
    return e;
}

static int train(const char *dir, int steps) {
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char path[1024];
    snprintf(path, sizeof path, "%s/zeropp.json", dir);
    zpp_train_config cfg;
    if (zpp_train_config_defaults(&cfg) != ZPP_OK || zpp_train_config_load_file(path, &cfg))
        return die(path);
    char model[1024];
    snprintf(model, sizeof model,
             "{\"family\": \"llama\", \"n_layer\": %d, \"n_embd\": %d, \"n_head\": %d,"
             " \"n_kv_head\": %d, \"n_ffn\": %d, \"seq_len\": %d, \"vocab_size\": %d,"
             " \"rope_theta\": 500000, \"norm_eps\": 1e-5, \"untied_head\": true}",
             L_, C_, H_, KV_, F_, T_, V_);
    const int B = G_ / world; /* this rank's rows of the step (world divides 4) */
    zpp_device *dev = NULL;
    zpp_topo *topo = NULL;
    zpp_model *m = NULL;
    zpp_engine *e = NULL;
    if (G_ % world || zpp_device_create_host(&dev) || zpp_topo_create(dev, world, 0.0, &topo) ||
        zpp_model_create_decoder(model, ZPP_FP32, B, dev, &m))
        return die("model");
    const zpp_engine_config ec = engine_config(&cfg);
    if (zpp_engine_create(topo, m, dev, &ec, &e)) return die("engine");
    hf_tensor t[N_TENSORS];
    if (read_tensors(dir, t)) return 1;
    for (int u = 0; u <= L_; u++) {
        size_t numel = 0, have = 0, begin = 0, count = 0;
        float *all = unit_values(t, u, &have);
        if (zpp_engine_shard_range(e, u, &numel, &begin, &count) || numel != have)
            return fprintf(stderr, "unit %d: %zu values for %zu\n", u, have, numel), 1;
        float *zero = calloc(count + 1, sizeof *zero);
        if (zpp_engine_state_set(e, u, all + begin, zero, zero)) return die("state_set");
        free(zero), free(all);
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (read_token_file(dir, &ids, &n_ids)) return 1;
    int32_t tok[G_ * T_], tgt[G_ * T_];
    for (int s = 0; s < steps; s++) {
        /* step s: tokens [s G T, (s + 1) G T]; rank r's rows r B .. r B + B - 1 */
        for (int b = 0; b < B; b++)
            for (int i = 0; i < T_; i++) {
                const size_t at = (size_t)s * G_ * T_ + (size_t)(rank * B + b) * T_ + (size_t)i;
                tok[b * T_ + i] = ids[at];
                tgt[b * T_ + i] = ids[at + 1];
            }
        float loss = 0;
        zpp_update_stats st;
        if (zpp_model_set_batch(m, tok, tgt, B) || zpp_engine_forward(e, &loss) ||
            zpp_engine_backward(e, zpp_engine_loss_scale(e)) ||
            zpp_engine_update(e, (float)cfg.optimizer.lr, loss, &st))
            return die("step");
        if (rank == 0) printf("{\"step\": %d, \"loss\": %.9g}\n", s + 1, (double)st.loss);
    }
    for (int i = 0; i < N_TENSORS; i++) free(t[i].data);
    free(ids);
    zpp_engine_destroy(e);
    zpp_model_destroy(m);
    zpp_topo_destroy(topo);
    zpp_device_destroy(dev);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "make")) return make(argv[2], strtoull(argv[3], NULL, 10));
    if (argc != 4 || strcmp(argv[1], "train")) {
        fprintf(stderr, "usage: llama_hf_helper make DIR SEED | train DIR STEPS\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    const int rc = train(argv[2], atoi(argv[3]));
    MPI_Finalize();
    return rc;
}
