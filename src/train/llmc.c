/* train/llmc.c — llm.c's GPT-2 model files and token files (llmc.h). */
#include "train/llmc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "model/gpt2.h"
#include "train/data.h"
#include "train/hf_gpt2.h"
#include "train/hf_model.h"

#define LLMC_HEADER_BYTES (4 * ZPP_LLMC_HEADER_INTS)
#define LLMC_TOKENS_MAGIC ZPP_DATA_LLMC_MAGIC /* train/data.h: llm.c's token files */
#define LLMC_CHUNK 65536 /* elements per read or write through the staging buffer */

/* ---- The tensors, in llm.c's order ------------------------------------------ */

/* One of llm.c's 16 tensors: `numel` elements per layer (or in all, for the
 * four that are not per layer), which land in unit 0 (embed) or in unit
 * l + 1 for layer l, at `ours` elements into the unit. */
typedef struct llmc_tensor {
    const char *name;
    int per_layer;
    size_t numel;
    size_t ours;
} llmc_tensor;

enum { LLMC_TENSORS = 16 };

static void llmc_tensors(const zpp_gpt2_config *m, llmc_tensor t[LLMC_TENSORS]) {
    zpp_gpt2_layout l;
    zpp_gpt2_layout_make(m, &l);
    const size_t C = (size_t)m->n_embd, Vp = (size_t)m->vocab_size, T = (size_t)m->seq_len;
    const llmc_tensor all[LLMC_TENSORS] = {
        {"wte", 0, Vp * C, l.wte},           {"wpe", 0, T * C, l.wpe},
        {"ln1w", 1, C, l.ln1_w},             {"ln1b", 1, C, l.ln1_b},
        {"qkvw", 1, 3 * C * C, l.qkv_w},     {"qkvb", 1, 3 * C, l.qkv_b},
        {"attprojw", 1, C * C, l.proj_w},    {"attprojb", 1, C, l.proj_b},
        {"ln2w", 1, C, l.ln2_w},             {"ln2b", 1, C, l.ln2_b},
        {"fcw", 1, 4 * C * C, l.fc_w},       {"fcb", 1, 4 * C, l.fc_b},
        {"fcprojw", 1, 4 * C * C, l.fc2_w},  {"fcprojb", 1, C, l.fc2_b},
        {"lnfw", 0, C, l.lnf_w},             {"lnfb", 0, C, l.lnf_b},
    };
    memcpy(t, all, sizeof all);
}

/* P = (Vp + maxT) C + L (12 C^2 + 13 C) + 2 C; 0 if it overflows. */
size_t zpp_llmc_param_count(const zpp_gpt2_config *m) {
    const double C = m->n_embd, L = m->n_layer;
    const double p = ((double)m->vocab_size + m->seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C;
    if (!(p < 0x1p60)) return 0; /* far past any file, and exact below it */
    size_t c = (size_t)m->n_embd;
    return ((size_t)m->vocab_size + (size_t)m->seq_len) * c +
           (size_t)m->n_layer * (12 * c * c + 13 * c) + 2 * c;
}

/* ---- Reading ------------------------------------------------------------------ */

struct zpp_llmc_file {
    int fd;
    char *path;
    zpp_llmc_info info;
};

static uint32_t le32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* The header's shape, checked: positive fields, heads dividing channels,
 * V <= Vp, and our model's limits. */
static zpp_status header_shape(const char *path, const uint8_t *h, zpp_gpt2_config *m) {
    const struct {
        const char *name;
        int32_t v;
    } f[6] = {{"max_seq_len", (int32_t)le32(h + 8)},  {"vocab_size", (int32_t)le32(h + 12)},
              {"num_layers", (int32_t)le32(h + 16)},  {"num_heads", (int32_t)le32(h + 20)},
              {"channels", (int32_t)le32(h + 24)},    {"padded_vocab_size", (int32_t)le32(h + 28)}};
    for (int i = 0; i < 6; i++)
        if (f[i].v < 1)
            return zpp_error(ZPP_ERR_FORMAT,
                             "llm.c model file '%s': header %s is %d (header[%d]); every shape "
                             "field must be >= 1",
                             path, f[i].name, (int)f[i].v, i + 2);
    memset(m, 0, sizeof *m);
    m->seq_len = f[0].v;
    m->real_vocab_size = f[1].v;
    m->n_layer = f[2].v;
    m->n_head = f[3].v;
    m->n_embd = f[4].v;
    m->vocab_size = f[5].v;
    if (m->real_vocab_size > m->vocab_size)
        return zpp_error(ZPP_ERR_FORMAT,
                         "llm.c model file '%s': header vocab_size %d exceeds padded_vocab_size "
                         "%d",
                         path, m->real_vocab_size, m->vocab_size);
    if (m->n_embd % m->n_head)
        return zpp_error(ZPP_ERR_FORMAT,
                         "llm.c model file '%s': header num_heads %d does not divide channels %d",
                         path, m->n_head, m->n_embd);
    if (zpp_gpt2_config_check(m) != ZPP_OK)
        return zpp_error_context(ZPP_ERR_FORMAT, "llm.c model file '%s'", path);
    return ZPP_OK;
}

zpp_status zpp_llmc_open(const char *path, zpp_llmc_file **file_p) {
    if (!path || !file_p) return zpp_error(ZPP_ERR_INVALID, "zpp_llmc_open: NULL argument");
    int fd = -1;
    struct stat sb;
    ZPP_CHECK(zpp_open_regular(path, "llm.c model file", &fd, &sb));
    zpp_status st = ZPP_OK;
    zpp_llmc_file *f = calloc(1, sizeof *f);
    uint8_t h[LLMC_HEADER_BYTES];
    const size_t len = (size_t)sb.st_size;
    if (!f || !(f->path = strdup(path))) {
        st = zpp_error(ZPP_ERR_NOMEM, "zpp_llmc_open: out of memory");
        goto fail;
    }
    f->fd = fd;
    if (len < 4) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "'%s' is not an llm.c model file: %zu bytes, shorter than its %d-byte "
                       "header",
                       path, len, LLMC_HEADER_BYTES);
        goto fail;
    }
    ZPP_CHECK_GOTO(zpp_pread_all(fd, path, h, len < sizeof h ? len : sizeof h, 0), st, fail);
    const uint32_t magic = le32(h);
    if (magic != ZPP_LLMC_MODEL_MAGIC) {
        st = zpp_error(ZPP_ERR_FORMAT, "'%s' is not an llm.c model file: magic %u, expected %d%s",
                       path, (unsigned)magic, ZPP_LLMC_MODEL_MAGIC,
                       magic == LLMC_TOKENS_MAGIC ? " (it is an llm.c token file: pass it as "
                                                    "--data)"
                                                  : "");
        goto fail;
    }
    if (len < LLMC_HEADER_BYTES) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "llm.c model file '%s' is truncated: %zu bytes, shorter than its %d-byte "
                       "header",
                       path, len, LLMC_HEADER_BYTES);
        goto fail;
    }
    const uint32_t version = le32(h + 4);
    if (version != ZPP_LLMC_VERSION_FP32 && version != ZPP_LLMC_VERSION_BF16) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "llm.c model file '%s' has version %u; expected %d (fp32 parameters) or "
                       "%d (bf16)",
                       path, (unsigned)version, ZPP_LLMC_VERSION_FP32, ZPP_LLMC_VERSION_BF16);
        goto fail;
    }
    zpp_llmc_info *in = &f->info;
    ZPP_CHECK_GOTO(header_shape(path, h, &in->model), st, fail);
    in->dtype = version == ZPP_LLMC_VERSION_FP32 ? ZPP_FP32 : ZPP_BF16;
    in->n_params = zpp_llmc_param_count(&in->model);
    const size_t es = zpp_dtype_size(in->dtype);
    if (in->n_params == 0 || in->n_params > (SIZE_MAX - LLMC_HEADER_BYTES) / es) {
        st = zpp_error(ZPP_ERR_FORMAT, "llm.c model file '%s': its header's shape is too large",
                       path);
        goto fail;
    }
    const size_t want = LLMC_HEADER_BYTES + es * in->n_params;
    if (len != want) {
        const zpp_gpt2_config *m = &in->model;
        st = zpp_error(ZPP_ERR_FORMAT,
                       "llm.c model file '%s' has %zu bytes, but its header (L %d, NH %d, C %d, "
                       "maxT %d, Vp %d, %s) needs %zu: %s",
                       path, len, m->n_layer, m->n_head, m->n_embd, m->seq_len, m->vocab_size,
                       zpp_dtype_name(in->dtype), want,
                       len < want ? "truncated" : "trailing bytes after the parameters");
        goto fail;
    }
    *file_p = f;
    return ZPP_OK;
fail:
    if (f) free(f->path);
    free(f);
    close(fd);
    return st;
}

const zpp_llmc_info *zpp_llmc_info_get(const zpp_llmc_file *f) { return &f->info; }

void zpp_llmc_close(zpp_llmc_file *f) {
    if (!f) return;
    close(f->fd);
    free(f->path);
    free(f);
}

/* n elements of the file's dtype starting at element `first` of the
 * parameters, as fp32. */
static zpp_status read_elems(zpp_llmc_file *f, size_t first, size_t n, float *out,
                             uint16_t *stage) {
    const size_t es = zpp_dtype_size(f->info.dtype);
    const size_t base = LLMC_HEADER_BYTES + es * first;
    if (f->info.dtype == ZPP_FP32) /* the file is little-endian fp32, as this host */
        return zpp_pread_all(f->fd, f->path, out, 4 * n, base);
    for (size_t i = 0; i < n; i += LLMC_CHUNK) {
        const size_t k = n - i < LLMC_CHUNK ? n - i : LLMC_CHUNK;
        ZPP_CHECK(zpp_pread_all(f->fd, f->path, stage, 2 * k, base + 2 * i));
        for (size_t j = 0; j < k; j++) out[i + j] = zpp_bf16_to_f32(stage[j]);
    }
    return ZPP_OK;
}

zpp_status zpp_llmc_read_unit(zpp_llmc_file *f, int unit, size_t begin, size_t count,
                              float *out) {
    const zpp_gpt2_config *m = &f->info.model;
    if (unit < 0 || unit > m->n_layer)
        return zpp_error(ZPP_ERR_INVALID, "zpp_llmc_read_unit: unit %d does not exist; use 0..%d",
                         unit, m->n_layer);
    const size_t numel = zpp_gpt2_unit_numel(m, unit);
    if (begin > numel || count > numel - begin || (count && !out))
        return zpp_error(ZPP_ERR_INVALID,
                         "zpp_llmc_read_unit: elements [%zu, +%zu) are outside unit %d of %zu",
                         begin, count, unit, numel);
    llmc_tensor t[LLMC_TENSORS];
    llmc_tensors(m, t);
    uint16_t *stage = NULL;
    if (f->info.dtype == ZPP_BF16 && !(stage = malloc(2 * LLMC_CHUNK)))
        return zpp_error(ZPP_ERR_NOMEM, "zpp_llmc_read_unit: out of memory");
    zpp_status st = ZPP_OK;
    size_t file_off = 0; /* the tensor's first element in the file */
    const size_t L = (size_t)m->n_layer, end = begin + count;
    for (int k = 0; k < LLMC_TENSORS && st == ZPP_OK; k++) {
        const size_t total = t[k].per_layer ? L * t[k].numel : t[k].numel;
        /* is this tensor (layer unit-1's slice of it) in our unit? */
        if ((unit == 0) == !t[k].per_layer) {
            const size_t src = file_off + (t[k].per_layer ? (size_t)(unit - 1) * t[k].numel : 0);
            const size_t lo = begin > t[k].ours ? begin : t[k].ours;
            const size_t hi = end < t[k].ours + t[k].numel ? end : t[k].ours + t[k].numel;
            if (lo < hi) st = read_elems(f, src + (lo - t[k].ours), hi - lo, out + (lo - begin), stage);
        }
        file_off += total;
    }
    free(stage);
    return st;
}

zpp_status zpp_llmc_check_model(const zpp_llmc_file *f, const zpp_gpt2_config *cfg) {
    const zpp_gpt2_config *m = &f->info.model;
    const struct {
        const char *key, *llmc;
        int file, now;
    } k[] = {{"model.n_layer", "num_layers", m->n_layer, cfg->n_layer},
             {"model.n_head", "num_heads", m->n_head, cfg->n_head},
             {"model.n_embd", "channels", m->n_embd, cfg->n_embd},
             {"model.seq_len", "max_seq_len", m->seq_len, cfg->seq_len},
             {"model.vocab_size", "padded_vocab_size", m->vocab_size, cfg->vocab_size},
             {"model.real_vocab_size", "vocab_size", zpp_gpt2_real_vocab(m),
              zpp_gpt2_real_vocab(cfg)}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].file != k[i].now)
            return zpp_error(ZPP_ERR_CONFIG,
                             "%s is %d in the config but the llm.c model file '%s' has %s %d; "
                             "the model's shape comes from the file: drop the config's model "
                             "section or make it agree",
                             k[i].key, k[i].now, f->path, k[i].llmc, k[i].file);
    return ZPP_OK;
}

/* ---- Writing ------------------------------------------------------------------ */

static zpp_status write_all(FILE *fp, const char *path, const void *p, size_t n) {
    if (fwrite(p, 1, n, fp) != n)
        return zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    return ZPP_OK;
}

zpp_status zpp_llmc_write(const char *path, const zpp_gpt2_config *m, zpp_dtype dtype,
                          const float *const *units) {
    if (!path || !m || !units) return zpp_error(ZPP_ERR_INVALID, "zpp_llmc_write: NULL argument");
    ZPP_CHECK(zpp_gpt2_config_check(m));
    if (dtype != ZPP_FP32 && dtype != ZPP_BF16)
        return zpp_error(ZPP_ERR_INVALID, "zpp_llmc_write: dtype %s; llm.c files are fp32 or bf16",
                         zpp_dtype_name(dtype));
    size_t n = strlen(path);
    char *tmp = malloc(n + 5);
    void *buf = malloc(4 * LLMC_CHUNK);
    FILE *fp = NULL;
    zpp_status st = ZPP_OK;
    if (!tmp || !buf) {
        st = zpp_error(ZPP_ERR_NOMEM, "zpp_llmc_write: out of memory");
        goto out;
    }
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    if (!(fp = fopen(tmp, "wb"))) {
        st = zpp_error(ZPP_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    int32_t h[ZPP_LLMC_HEADER_INTS];
    memset(h, 0, sizeof h);
    h[0] = ZPP_LLMC_MODEL_MAGIC;
    h[1] = dtype == ZPP_FP32 ? ZPP_LLMC_VERSION_FP32 : ZPP_LLMC_VERSION_BF16;
    h[2] = m->seq_len;
    h[3] = zpp_gpt2_real_vocab(m);
    h[4] = m->n_layer;
    h[5] = m->n_head;
    h[6] = m->n_embd;
    h[7] = m->vocab_size;
    ZPP_CHECK_GOTO(write_all(fp, tmp, h, sizeof h), st, out);
    llmc_tensor t[LLMC_TENSORS];
    llmc_tensors(m, t);
    const size_t es = zpp_dtype_size(dtype);
    for (int k = 0; k < LLMC_TENSORS; k++) {
        for (int l = 0; l < (t[k].per_layer ? m->n_layer : 1); l++) {
            const float *src = units[t[k].per_layer ? l + 1 : 0] + t[k].ours;
            if (dtype == ZPP_FP32) {
                ZPP_CHECK_GOTO(write_all(fp, tmp, src, 4 * t[k].numel), st, out);
                continue;
            }
            for (size_t i = 0; i < t[k].numel; i += LLMC_CHUNK) {
                size_t c = t[k].numel - i < LLMC_CHUNK ? t[k].numel - i : LLMC_CHUNK;
                for (size_t j = 0; j < c; j++) ((zpp_bf16 *)buf)[j] = zpp_f32_to_bf16(src[i + j]);
                ZPP_CHECK_GOTO(write_all(fp, tmp, buf, es * c), st, out);
            }
        }
    }
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
        st = zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    int rc = fclose(fp);
    fp = NULL;
    if (rc != 0) {
        st = zpp_error(ZPP_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0)
        st = zpp_error(ZPP_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
out:
    if (fp) fclose(fp);
    if (st != ZPP_OK && tmp) remove(tmp);
    free(tmp);
    free(buf);
    return st;
}

/* ---- Token files -------------------------------------------------------------- */

typedef struct token_file {
    int fd;
    const char *path;
    size_t n;    /* tokens */
    size_t off;  /* byte offset of token 0 */
    size_t elem; /* bytes per token: 2 (llm.c) or 1 (raw text) */
} token_file;

/* llm.c's token file or raw text, by data.h's rule. */
static zpp_status tokens_open(const char *path, token_file *tf) {
    struct stat sb;
    memset(tf, 0, sizeof *tf);
    tf->fd = -1;
    tf->path = path;
    ZPP_CHECK(zpp_open_regular(path, "data", &tf->fd, &sb));
    const size_t len = (size_t)sb.st_size;
    uint8_t h[LLMC_HEADER_BYTES];
    const size_t head = len < sizeof h ? len : sizeof h;
    ZPP_CHECK(zpp_pread_all(tf->fd, path, h, head, 0));
    if (len < 4 || le32(h) != LLMC_TOKENS_MAGIC) {
        if (memchr(h, 0, head))
            return zpp_error(ZPP_ERR_FORMAT,
                             "data '%s' is not an llm.c token file (magic %u, expected %d) and "
                             "not text (it holds NUL bytes)",
                             path, len >= 4 ? (unsigned)le32(h) : 0u, LLMC_TOKENS_MAGIC);
        tf->n = len, tf->off = 0, tf->elem = 1; /* raw text: bytes are tokens */
        return ZPP_OK;
    }
    if (len < LLMC_HEADER_BYTES)
        return zpp_error(ZPP_ERR_FORMAT, "llm.c token file '%s' is truncated: %zu bytes, shorter "
                                         "than its %d-byte header", path, len, LLMC_HEADER_BYTES);
    const uint32_t version = le32(h + 4);
    if (version != ZPP_DATA_LLMC_VERSION && version != ZPP_DATA_LLMC_VERSION_U32)
        return zpp_error(ZPP_ERR_FORMAT,
                         "llm.c token file '%s' has version %u; expected %d (uint16 tokens) or "
                         "%d (uint32)",
                         path, (unsigned)version, ZPP_DATA_LLMC_VERSION,
                         ZPP_DATA_LLMC_VERSION_U32);
    const size_t elem = version == ZPP_DATA_LLMC_VERSION ? 2 : 4;
    const int32_t count = (int32_t)le32(h + 8);
    const size_t want = LLMC_HEADER_BYTES + elem * (size_t)(count < 0 ? 0 : count);
    if (count < 0 || len != want)
        return zpp_error(ZPP_ERR_FORMAT,
                         "llm.c token file '%s' has %zu bytes, but its header's %d tokens need "
                         "%zu",
                         path, len, (int)count, want);
    tf->n = (size_t)count, tf->off = LLMC_HEADER_BYTES, tf->elem = elem;
    return ZPP_OK;
}

/* Tokens [first, first + n) as int32 (little-endian uint32 or uint16, or
 * bytes). */
static zpp_status tokens_read(const token_file *tf, size_t first, size_t n, int32_t *out) {
    uint8_t *raw = (uint8_t *)out; /* read into the buffer's tail, widen from the front */
    const size_t bytes = tf->elem * n;
    uint8_t *src = raw + 4 * n - bytes;
    ZPP_CHECK(zpp_pread_all(tf->fd, tf->path, src, bytes, tf->off + tf->elem * first));
    /* out[i] covers bytes [4i, 4i + 4) and source i starts at byte (4 - e) n + e i,
     * at or past 4i (where out[0..i-1] end) as i <= n: no source is overwritten
     * before it is read */
    for (size_t i = 0; i < n; i++)
        out[i] = tf->elem == 4   ? (int32_t)le32(src + 4 * i)
                 : tf->elem == 2 ? (int32_t)(src[2 * i] | src[2 * i + 1] << 8)
                                 : (int32_t)src[i];
    return ZPP_OK;
}

/* ---- Evaluation ----------------------------------------------------------------- */

/* What eval reads a model from: an llm.c file (a GPT-2), or a Hugging Face
 * folder (a llama, imported as `train --init-from` does: hf_model.h). */
typedef struct eval_src {
    zpp_llmc_file *llmc;
    zpp_hf_gpt2 *hf_gpt2; /* a Hugging Face GPT-2 folder (train/hf_gpt2.h) */
    zpp_gpt2_config gc;   /* its GPT-2 */
    zpp_hf_model *hf;
    zpp_llama_config lc; /* the folder's llama, at the run's seq_len */
    zpp_dtype dtype;     /* the model's parameters: fp32; bf16 for the CUDA llama */
} eval_src;

/* The folder's shape through the import's own functions (its config.json
 * defines it; seq_len 0: max_position_embeddings), and its model. */
static zpp_status hf_model_make(eval_src *s, const char *dir, int seq_len, int B,
                                zpp_device *dev, zpp_model **m) {
    ZPP_CHECK(zpp_hf_model_open(dir, &s->hf));
    const zpp_hf_config *hf = zpp_hf_model_config(s->hf);
    zpp_train_config tc;
    ZPP_CHECK(zpp_train_config_defaults(&tc));
    ZPP_CHECK(zpp_hf_apply_shape(hf, &tc));
    tc.model.seq_len = seq_len ? seq_len : hf->max_position_embeddings;
    ZPP_CHECK(zpp_hf_check_shape(hf, &tc, dir));
    const zpp_decoder_shape shape = zpp_train_config_shape(&tc);
    ZPP_CHECK(zpp_llama_config_of_shape(&shape, &s->lc));
    s->dtype = zpp_llama_eval_dtype(dev);
    return zpp_model_family_create("llama", &shape, s->dtype, B, dev, m);
}

static zpp_status src_open(eval_src *s, const char *path, const zpp_llmc_eval_opts *o,
                           zpp_device *dev, zpp_model **m) {
    memset(s, 0, sizeof *s);
    if (zpp_hf_gpt2_is_dir(path)) {
        if (o->seq_len)
            return zpp_error(ZPP_ERR_CONFIG, "eval: --seq-len is for a Llama-family folder; a "
                                             "GPT-2's T is its n_positions");
        ZPP_CHECK(zpp_hf_gpt2_open(path, &s->hf_gpt2));
        s->gc = *zpp_hf_gpt2_config(s->hf_gpt2);
        s->dtype = ZPP_FP32;
        return zpp_gpt2_create(&s->gc, ZPP_FP32, o->batch_size, dev, m);
    }
    if (zpp_hf_is_model_dir(path)) return hf_model_make(s, path, o->seq_len, o->batch_size, dev, m);
    if (o->seq_len)
        return zpp_error(ZPP_ERR_CONFIG, "eval: --seq-len is for a Hugging Face folder; an llm.c "
                                         "file's T is its own");
    ZPP_CHECK(zpp_llmc_open(path, &s->llmc));
    s->dtype = ZPP_FP32;
    return zpp_gpt2_create(&s->llmc->info.model, ZPP_FP32, o->batch_size, dev, m);
}

static void src_close(eval_src *s) {
    zpp_llmc_close(s->llmc);
    zpp_hf_gpt2_close(s->hf_gpt2);
    zpp_hf_model_close(s->hf);
}

/* Unit u whole into host (fp32), then in the model's dtype in place. */
static zpp_status src_read_unit(eval_src *s, int u, size_t n, float *host) {
    if (s->llmc) return zpp_llmc_read_unit(s->llmc, u, 0, n, host);
    if (s->hf_gpt2) return zpp_hf_gpt2_read_unit(s->hf_gpt2, &s->gc, u, 0, n, host);
    ZPP_CHECK(zpp_hf_model_read_unit(s->hf, &s->lc, u, 0, n, host));
    for (size_t i = 0; s->dtype != ZPP_FP32 && i < n; i++) /* narrower: ahead of the read */
        zpp_store_f32(host, s->dtype, i, host[i]);
    return ZPP_OK;
}

/* Each unit whole, in the model's dtype, in the device's memory. */
static zpp_status load_params(eval_src *s, zpp_model *m, zpp_device *dev, void **params,
                              float *host) {
    for (int u = 0; u < m->n_units; u++) {
        const size_t bytes = m->unit_numel[u] * zpp_dtype_size(s->dtype);
        ZPP_CHECK(zpp_device_alloc(dev, bytes, &params[u]));
        ZPP_CHECK(src_read_unit(s, u, m->unit_numel[u], host));
        ZPP_CHECK(zpp_device_copy(dev, params[u], host, bytes));
    }
    return ZPP_OK;
}

zpp_status zpp_llmc_eval(const char *model_path, const char *tokens_path,
                         const zpp_llmc_eval_opts *o, zpp_device *dev, double *loss_p) {
    if (!model_path || !tokens_path || !o || !dev || !loss_p)
        return zpp_error(ZPP_ERR_INVALID, "zpp_llmc_eval: NULL argument");
    if (o->batch_size < 1 || o->batches < 1 || o->seq_len < 0)
        return zpp_error(ZPP_ERR_INVALID, "eval: batch size %d and batches %d must be >= 1, "
                                          "seq_len %d >= 0",
                         o->batch_size, o->batches, o->seq_len);
    eval_src src;
    zpp_model *m = NULL;
    token_file tf = {-1, NULL, 0, 0, 0};
    void **params = NULL;
    float *host = NULL;
    int32_t *buf = NULL;
    zpp_status st = src_open(&src, model_path, o, dev, &m);
    if (st != ZPP_OK) goto out;
    const size_t B = (size_t)o->batch_size, T = (size_t)m->seq_len, K = (size_t)o->batches;
    ZPP_CHECK_GOTO(tokens_open(tokens_path, &tf), st, out);
    /* batch i reads tokens [i B T, (i + 1) B T + 1) */
    if ((double)K * (double)B * (double)T + 1.0 > (double)tf.n) {
        st = zpp_error(ZPP_ERR_CONFIG,
                       "data '%s' holds %zu tokens; %zu batches of %zu x %zu (seq_len) tokens "
                       "need %.0f (one more for the last target)",
                       tokens_path, tf.n, K, B, T, (double)K * (double)B * (double)T + 1.0);
        goto out;
    }
    params = calloc((size_t)m->n_units, sizeof *params);
    size_t most = 0;
    for (int u = 0; u < m->n_units; u++) most = m->unit_numel[u] > most ? m->unit_numel[u] : most;
    host = malloc(most * sizeof(float));
    buf = malloc((B * T + 1) * sizeof(int32_t));
    if (!params || !host || !buf) {
        st = zpp_error(ZPP_ERR_NOMEM, "eval: out of host memory");
        goto out;
    }
    ZPP_CHECK_GOTO(load_params(&src, m, dev, params, host), st, out);
    double sum = 0.0;
    for (size_t i = 0; i < K; i++) {
        ZPP_CHECK_GOTO(tokens_read(&tf, i * B * T, B * T + 1, buf), st, out);
        /* llm.c's loader: inputs buf[0 .. BT), targets buf[1 .. BT] */
        st = m->ops->set_batch(m, buf, buf + 1, o->batch_size);
        if (st != ZPP_OK) {
            zpp_error_context(st, "data '%s', batch %zu (tokens from %zu)", tokens_path, i,
                              i * B * T);
            goto out;
        }
        for (int s = 0; s < m->n_stages; s++)
            ZPP_CHECK_GOTO(m->ops->forward(m, s, params[m->stage_unit[s]]), st, out);
        sum += m->ops->loss(m);
    }
    *loss_p = sum / (double)K;
out:
    for (int u = 0; params && m && u < m->n_units; u++)
        if (params[u]) zpp_device_free(dev, params[u]);
    free(params);
    if (m) m->ops->destroy(m);
    if (tf.fd >= 0) close(tf.fd);
    free(host);
    free(buf);
    src_close(&src);
    return st;
}
