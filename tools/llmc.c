/* tools/llmc.c — `zeropp export` (a checkpoint to an llm.c model file, or
 * a llama to a Hugging Face folder) and
 * `zeropp eval --init-from` (the mean loss of an llm.c model file or a
 * Hugging Face folder on a token file).
 * Both run in one process, without MPI (train/llmc.h has the formats). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "core/error.h"
#include "device/device.h"
#include "model/gpt2.h"
#include "train/checkpoint.h"
#include "train/hf_gpt2.h"
#include "train/hf_model.h"
#include "train/llmc.h"
#include "train/tokfile.h"

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp export --from DIR --to PATH [--format llmc|hf]\n"
            "                     [--dtype fp32|bf16|fp16] [--max-shard-size BYTES]\n"
            "                     [--hf-config config.json] [--tokenizer FILE|DIR|none]\n"
            "  Writes the fp32 master weights of the checkpoint in DIR (its published one, or\n"
            "  the step folder DIR).\n"
            "  --format llmc (the default for a GPT-2): an llm.c GPT-2 model file PATH,\n"
            "  version 3 with fp32 parameters (the default), or version 5 with bf16 (rounded\n"
            "  to nearest even). A checkpoint of `zeropp train --init-from F --steps 0 --save\n"
            "  DIR` exports F back byte for byte (a bf16 F with --dtype bf16). PATH is\n"
            "  written whole or not at all (through PATH.tmp and a rename).\n"
            "  --format hf (the default for a llama): a Hugging Face folder PATH (new), named\n"
            "  as the run's model.hf_architecture (LlamaForCausalLM, MistralForCausalLM or\n"
            "  Qwen2ForCausalLM: what --init-from read), a GPT-2 as GPT2LMHeadModel:\n"
            "  config.json and model.safetensors, or shards of at most\n"
            "  --max-shard-size bytes (default 5G, as transformers; " ZPP_CLI_COUNT_HELP ")\n"
            "  named model-0000K-of-0000N.safetensors with model.safetensors.index.json;\n"
            "  --dtype fp32|bf16|fp16, default the checkpoint's working dtype.\n"
            "  config.json: the one of the folder the model was imported from (--init-from,\n"
            "  which the checkpoint remembers through resumes), or the one --hf-config names\n"
            "  (its shape must be the checkpoint's), kept whole (token ids,\n"
            "  max_position_embeddings, rope_scaling, every other key) but for torch_dtype;\n"
            "  else (and for a GPT-2) written from the checkpoint's shape,\n"
            "  max_position_embeddings (n_positions) its seq_len, and no token ids but\n"
            "  GPT-2's own 50256 for its vocabulary of 50257.\n"
            "  The tokenizer, so that transformers' AutoTokenizer loads PATH: the\n"
            "  tokenizer.json, tokenizer_config.json, special_tokens_map.json,\n"
            "  tokenizer.model, generation_config.json, chat_template.jinja, vocab.json and\n"
            "  merges.txt of that folder are copied (those it has); a model trained from\n"
            "  scratch gets the\n"
            "  tokenizer its data was made with (`zeropp tokenize`'s note beside the data: a\n"
            "  tokenizer.json, or GPT-2's vocab.json and merges.txt). --tokenizer DIR copies\n"
            "  those files of DIR, --tokenizer FILE copies FILE as tokenizer.json,\n"
            "  --tokenizer none copies nothing.\n"
            "  Written into PATH.tmp.<pid>, renamed to PATH at the end: a failure leaves no\n"
            "  PATH.\n");
}

/* The manifest's GPT-2 shape must be the units it lists. */
static zpp_status manifest_gpt2(const char *from, const zpp_ckpt_manifest *m) {
    ZPP_CHECK(zpp_gpt2_config_check(&m->model));
    if (m->n_units != m->model.n_layer + 1)
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint %s has %d units; its model has %d layers",
                         from, m->n_units, m->model.n_layer);
    for (int u = 0; u < m->n_units; u++)
        if (m->numel[u] != zpp_gpt2_unit_numel(&m->model, u))
            return zpp_error(ZPP_ERR_FORMAT,
                             "checkpoint %s: unit %d has %zu parameters; its model's has %zu",
                             from, u, m->numel[u], zpp_gpt2_unit_numel(&m->model, u));
    return ZPP_OK;
}

/* The checkpoint's GPT-2 as an llm.c file. */
static zpp_status export_llmc(const char *from, const char *to, const zpp_ckpt_manifest *m,
                              float **units, const char *dtype) {
    zpp_status st = manifest_gpt2(from, m);
    const zpp_dtype dt = strcmp(dtype, "bf16") ? ZPP_FP32 : ZPP_BF16;
    if (st == ZPP_OK && !strcmp(dtype, "fp16"))
        st = zpp_error(ZPP_ERR_CONFIG, "--dtype fp16: llm.c files hold fp32 or bf16");
    if (st == ZPP_OK) st = zpp_llmc_write(to, &m->model, dt, (const float *const *)units);
    if (st == ZPP_OK)
        printf("wrote %s: llm.c GPT-2 (version %d, %s), %d layers, %d heads, %d channels, "
               "max T %d, vocabulary %d padded to %d, from step %d of %s\n",
               to, dt == ZPP_FP32 ? ZPP_LLMC_VERSION_FP32 : ZPP_LLMC_VERSION_BF16, dtype,
               m->model.n_layer, m->model.n_head, m->model.n_embd, m->model.seq_len,
               zpp_gpt2_real_vocab(&m->model), m->model.vocab_size, m->step, from);
    return st;
}

/* The llama of a manifest, its units checked against the layout. */
static zpp_status manifest_llama(const char *from, const zpp_ckpt_manifest *m,
                                 zpp_llama_config *lc) {
    zpp_decoder_shape shape = m->ext;
    shape.n_layer = m->model.n_layer, shape.n_head = m->model.n_head;
    shape.n_embd = m->model.n_embd, shape.seq_len = m->model.seq_len;
    shape.vocab_size = m->model.vocab_size;
    shape.real_vocab_size = zpp_gpt2_real_vocab(&m->model);
    ZPP_CHECK(zpp_llama_config_of_shape(&shape, lc));
    zpp_llama_layout l;
    zpp_llama_layout_make(lc, &l);
    if (m->n_units != lc->n_layer + 1)
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint %s has %d units; its llama has %d layers",
                         from, m->n_units, lc->n_layer);
    for (int u = 0; u < m->n_units; u++)
        if (m->numel[u] != (u ? l.block_numel : l.embed_numel))
            return zpp_error(ZPP_ERR_FORMAT,
                             "checkpoint %s: unit %d has %zu parameters; its llama's has %zu",
                             from, u, m->numel[u], u ? l.block_numel : l.embed_numel);
    return ZPP_OK;
}

/* The architecture the checkpoint's run named (model.hf_architecture in
 * the config it saved; LlamaForCausalLM without one). */
static zpp_status manifest_arch(const zpp_ckpt_manifest *m, zpp_hf_arch *arch, int *window) {
    *arch = ZPP_HF_LLAMA, *window = 0;
    if (!m->config) return ZPP_OK;
    zpp_train_config c;
    ZPP_CHECK(zpp_train_config_defaults(&c));
    ZPP_CHECK(zpp_train_config_load_string(m->config, &c));
    *arch = c.hf_architecture, *window = c.hf_sliding_window;
    return ZPP_OK;
}

/* config.json of the export: from the checkpoint's llama, with the fields a
 * checkpoint does not keep from --hf-config when given (whose shape and
 * architecture must be the checkpoint's). */
static zpp_status export_hf_config(const zpp_llama_config *lc, zpp_hf_arch arch, int window,
                                   const char *like, zpp_hf_config *hf) {
    ZPP_CHECK(zpp_hf_config_of_llama(lc, arch, lc->seq_len, hf));
    hf->sliding_window = window;
    if (!like) return ZPP_OK;
    zpp_hf_config given;
    ZPP_CHECK(zpp_hf_config_read(like, &given));
    const zpp_hf_rope_scaling *a = &given.rope_scaling, *b = &hf->rope_scaling;
    const int same =
        given.hidden_size == hf->hidden_size &&
        given.intermediate_size == hf->intermediate_size &&
        given.num_hidden_layers == hf->num_hidden_layers &&
        given.num_attention_heads == hf->num_attention_heads &&
        given.num_key_value_heads == hf->num_key_value_heads && given.head_dim == hf->head_dim &&
        given.vocab_size == hf->vocab_size && given.rms_norm_eps == hf->rms_norm_eps &&
        given.rope_theta == hf->rope_theta && a->llama3 == b->llama3 &&
        (!a->llama3 || (a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
                        a->high_freq_factor == b->high_freq_factor &&
                        a->original_max_position_embeddings ==
                            b->original_max_position_embeddings)) &&
        given.tie_word_embeddings == hf->tie_word_embeddings &&
        given.attention_bias == hf->attention_bias;
    if (strcmp(given.architecture, hf->architecture))
        return zpp_error(ZPP_ERR_CONFIG,
                         "--hf-config %s names %s, but the checkpoint's model.hf_architecture is "
                         "%s; give the config.json it was imported from",
                         like, given.architecture, hf->architecture);
    if (!same)
        return zpp_error(ZPP_ERR_CONFIG,
                         "--hf-config %s describes another model than the checkpoint's (its "
                         "sizes, rope, norm or biases differ); give the config.json it was "
                         "imported from",
                         like);
    *hf = given;
    return ZPP_OK;
}

/* ---- What a Hugging Face folder has beside the weights ------------------------- */

/* The files a model's folder keeps for its tokenizer (transformers'
 * AutoTokenizer reads them) and its generation defaults; an export carries
 * over those the source folder has. */
static const char *const kCompanions[] = {
    "tokenizer.json",  "tokenizer_config.json",  "special_tokens_map.json", "tokenizer.model",
    "generation_config.json", "chat_template.jinja", "vocab.json", "merges.txt"};
enum { N_COMPANIONS = (int)(sizeof kCompanions / sizeof kCompanions[0]) };

typedef struct export_files {
    char src[N_COMPANIONS][4200];
    zpp_hf_file f[N_COMPANIONS];
    int n;
    char from[4400]; /* where they came from, for the line that says so */
} export_files;

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static void add_file(export_files *x, const char *src, const char *name) {
    snprintf(x->src[x->n], sizeof x->src[x->n], "%s", src);
    x->f[x->n] = (zpp_hf_file){x->src[x->n], name};
    x->n++;
}

/* The companions in folder `dir`, if tokenizer.json, or GPT-2's vocab.json
 * and merges.txt, are among them (else none: the folder holds no
 * tokenizer). */
static int companions_of(const char *dir, export_files *x) {
    char path[4200], merges[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(merges, sizeof merges, "%s/merges.txt", dir);
    if (access(path, R_OK) != 0 && access(merges, R_OK) != 0) return 0;
    for (int k = 0; k < N_COMPANIONS; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, kCompanions[k]);
        if (access(path, R_OK) == 0) add_file(x, path, kCompanions[k]);
    }
    return 1;
}

/* A tokenizer.json file, or a folder holding one, into x; 0 if neither. */
static int tokenizer_at(const char *path, export_files *x) {
    if (is_dir(path)) return companions_of(path, x);
    if (access(path, R_OK) != 0) return 0;
    add_file(x, path, "tokenizer.json");
    return 1;
}

/* The tokenizer files an export copies (export_usage): --tokenizer `opt`;
 * else the --init-from folder's; else the tokenizer noted beside the
 * checkpoint's data (a tokenizer.json, or GPT-2's vocab.json and
 * merges.txt). None found is no error: the line printed says so. */
static zpp_status export_tokenizer(const zpp_ckpt_manifest *m, const char *opt,
                                   export_files *x) {
    x->n = 0;
    x->from[0] = '\0';
    if (opt && !strcmp(opt, "none")) return ZPP_OK;
    if (opt) {
        if (!tokenizer_at(opt, x))
            return zpp_error(ZPP_ERR_IO, "--tokenizer %s: %s", opt,
                             is_dir(opt) ? "the folder holds no tokenizer.json (nor GPT-2's "
                                           "merges.txt)"
                                         : "no such file (or it cannot be read)");
        snprintf(x->from, sizeof x->from, "%s (--tokenizer)", opt);
        return ZPP_OK;
    }
    if (m->init_from && is_dir(m->init_from) && companions_of(m->init_from, x)) {
        snprintf(x->from, sizeof x->from, "%s (the folder the model was imported from)",
                 m->init_from);
        return ZPP_OK;
    }
    if (!m->data_path) return ZPP_OK;
    zpp_tokfile_note note;
    int found = 0;
    if (zpp_tokfile_note_read(m->data_path, &note, &found) != ZPP_OK || !found) return ZPP_OK;
    if (note.tokenizer_json && tokenizer_at(note.tokenizer_json, x))
        snprintf(x->from, sizeof x->from, "%s (the tokenizer the data %s was made with)",
                 note.tokenizer_json, m->data_path);
    /* GPT-2's two files, which transformers' GPT2Tokenizer reads as they are */
    if (note.vocab && note.merges && access(note.vocab, R_OK) == 0 &&
        access(note.merges, R_OK) == 0) {
        add_file(x, note.vocab, "vocab.json");
        add_file(x, note.merges, "merges.txt");
        snprintf(x->from, sizeof x->from, "%s and %s (the tokenizer the data %s was made with)",
                 note.vocab, note.merges, m->data_path);
    }
    zpp_tokfile_note_free(&note);
    return ZPP_OK;
}

/* config.json's source (export_usage): --hf-config, else the --init-from
 * folder's while it still describes the checkpoint's model; that file's
 * path into taken[0..4200), or "" when written from the shape. */
static zpp_status export_config(const zpp_ckpt_manifest *m, const zpp_llama_config *lc,
                                const char *like, zpp_hf_config *hf, char *taken, char *said,
                                size_t cap) {
    zpp_hf_arch arch;
    int window;
    ZPP_CHECK(manifest_arch(m, &arch, &window));
    snprintf(said, cap, "written from the checkpoint's shape (no token ids; --hf-config names "
                        "the config.json to take them from)");
    taken[0] = '\0';
    if (like) {
        ZPP_CHECK(export_hf_config(lc, arch, window, like, hf));
        snprintf(taken, 4200, "%s", like);
        snprintf(said, cap, "%s's (--hf-config)", like);
        return ZPP_OK;
    }
    char path[4200];
    if (m->init_from && is_dir(m->init_from)) {
        snprintf(path, sizeof path, "%s/config.json", m->init_from);
        if (access(path, R_OK) == 0 && export_hf_config(lc, arch, window, path, hf) == ZPP_OK) {
            snprintf(taken, 4200, "%s", path);
            snprintf(said, cap, "%s's, the folder the model was imported from", path);
            return ZPP_OK;
        }
        snprintf(said, cap, "written from the checkpoint's shape: %s, the folder the model was "
                            "imported from, no longer has a config.json of this model",
                 m->init_from);
    } else if (m->init_from && access(m->init_from, F_OK) != 0) {
        snprintf(said, cap, "written from the checkpoint's shape: %s, the folder the model was "
                            "imported from, is gone (--hf-config names the config.json to take "
                            "its token ids from)",
                 m->init_from);
    }
    return export_hf_config(lc, arch, window, NULL, hf);
}

/* The checkpoint as a Hugging Face folder: a llama as the architecture it
 * was imported as, a GPT-2 as GPT2LMHeadModel (train/hf_gpt2.h). */
static zpp_status export_hf(const char *from, const char *to, const zpp_ckpt_manifest *m,
                            float **units, const char *dtype, size_t max_shard,
                            const char *like, const char *tokenizer) {
    const int llama = !strcmp(m->family, "llama");
    zpp_llama_config lc;
    zpp_hf_config hf;
    char said[4600], taken[4200] = "";
    if (llama) {
        ZPP_CHECK(manifest_llama(from, m, &lc));
        ZPP_CHECK(export_config(m, &lc, like, &hf, taken, said, sizeof said));
    } else {
        if (like)
            return zpp_error(ZPP_ERR_CONFIG, "--hf-config is for a llama; a GPT-2's config.json "
                                             "is written from its shape");
        ZPP_CHECK(manifest_gpt2(from, m));
        snprintf(said, sizeof said, "written from the checkpoint's shape");
    }
    export_files *x = malloc(sizeof *x);
    if (!x) return zpp_error(ZPP_ERR_NOMEM, "export: out of memory");
    zpp_status st = export_tokenizer(m, tokenizer, x);
    const char *name = dtype ? dtype : m->dtype;
    zpp_dtype dt = ZPP_FP32;
    if (!strcmp(name, "bf16")) dt = ZPP_BF16;
    else if (!strcmp(name, "fp16")) dt = ZPP_FP16;
    int shards = 0;
    const zpp_hf_export_opts eo = {dt, max_shard, taken[0] ? taken : NULL, x->f, x->n};
    if (st == ZPP_OK)
        st = llama ? zpp_hf_export(to, &lc, &hf, (const float *const *)units, &eo, &shards)
                   : zpp_hf_gpt2_export(to, &m->model, (const float *const *)units, &eo, &shards);
    if (st != ZPP_OK) {
        free(x);
        return st;
    }
    char heads[64] = "";
    if (llama) snprintf(heads, sizeof heads, " (%d key/value)", lc.n_kv_head);
    printf("wrote %s: Hugging Face %s (%s, %d file%s%s), %d layers, %d heads%s, %d channels, "
           "vocabulary %d, from step %d of %s\n",
           to, llama ? hf.architecture : "GPT2LMHeadModel", name, shards, shards == 1 ? "" : "s",
           shards == 1 ? "" : " and the index", m->model.n_layer, m->model.n_head, heads,
           m->model.n_embd, zpp_gpt2_real_vocab(&m->model), m->step, from);
    printf("  config.json: %s\n", said);
    if (x->n) {
        printf("  tokenizer: ");
        for (int k = 0; k < x->n; k++) printf("%s%s", k ? ", " : "", x->f[k].name);
        printf(" from %s\n", x->from);
    } else {
        printf("  tokenizer: none copied (%s; --tokenizer FILE|DIR names one)\n",
               tokenizer ? "--tokenizer none" : "the checkpoint knows of no tokenizer");
    }
    free(x);
    return ZPP_OK;
}

int zpp_cli_export(int argc, char **argv) {
    const char *from = NULL, *to = NULL, *dtype = NULL, *format = NULL, *like = NULL;
    const char *tokenizer = NULL;
    size_t max_shard = 5000000000u; /* transformers' "5GB" */
    const zpp_cli_opt opts[] = {
        {"--from", ZPP_CLI_STR, &from, 0, 0},
        {"--to", ZPP_CLI_STR, &to, 0, 0},
        {"--dtype", ZPP_CLI_STR, &dtype, 0, 0},
        {"--format", ZPP_CLI_STR, &format, 0, 0},
        {"--max-shard-size", ZPP_CLI_SIZE, &max_shard, 1, (long long)1 << 50},
        {"--hf-config", ZPP_CLI_STR, &like, 0, 0},
        {"--tokenizer", ZPP_CLI_STR, &tokenizer, 0, 0},
    };
    int pr = zpp_cli_parse_opts("export", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), 1);
    if (pr > 0) {
        export_usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (!from || !to) {
        fprintf(stderr, "zeropp export: needs --from DIR and --to PATH\n");
        return 2;
    }
    if (dtype && strcmp(dtype, "fp32") && strcmp(dtype, "bf16") && strcmp(dtype, "fp16")) {
        fprintf(stderr, "zeropp export: --dtype takes fp32, bf16 or fp16, not '%s'\n", dtype);
        return 2;
    }
    if (format && strcmp(format, "llmc") && strcmp(format, "hf")) {
        fprintf(stderr, "zeropp export: --format takes llmc or hf, not '%s'\n", format);
        return 2;
    }
    zpp_ckpt_manifest m;
    float **units = NULL;
    zpp_status st = zpp_checkpoint_read_masters(from, &m, &units);
    if (st != ZPP_OK) return zpp_cli_fail("export", st);
    const int llama = !strcmp(m.family, "llama");
    if (!format) format = llama ? "hf" : "llmc";
    if (llama && strcmp(format, "hf"))
        st = zpp_error(ZPP_ERR_CONFIG, "checkpoint %s holds a llama; --format %s writes GPT-2s "
                                       "only (--format hf writes a llama)",
                       from, format);
    else if (!strcmp(format, "llmc") && (like || tokenizer))
        st = zpp_error(ZPP_ERR_CONFIG, "%s is for --format hf; an llm.c file has no config.json "
                                       "or tokenizer",
                       like ? "--hf-config" : "--tokenizer");
    else if (!strcmp(format, "hf"))
        st = export_hf(from, to, &m, units, dtype, max_shard, like, tokenizer);
    else st = export_llmc(from, to, &m, units, dtype ? dtype : "fp32");
    for (int u = 0; u < m.n_units; u++) free(units[u]);
    free(units);
    zpp_ckpt_manifest_free(&m);
    return st == ZPP_OK ? 0 : zpp_cli_fail("export", st);
}

int zpp_cli_eval(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *device = "cpu";
    int batch = 0, batches = 0, json = 0, seq_len = 0;
    const zpp_cli_opt opts[] = {
        {"--init-from", ZPP_CLI_STR, &model, 0, 0},
        {"--data", ZPP_CLI_STR, &data, 0, 0},
        {"--batch-size", ZPP_CLI_INT, &batch, 1, INT_MAX},
        {"--batches", ZPP_CLI_INT, &batches, 1, INT_MAX},
        {"--seq-len", ZPP_CLI_INT, &seq_len, 1, INT_MAX},
        {"--device", ZPP_CLI_STR, &device, 0, 0},
        {"--json", ZPP_CLI_FLAG, &json, 0, 0},
    };
    int pr = zpp_cli_parse_opts("eval", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), 1);
    if (pr > 0) {
        zpp_cli_eval_usage(stdout);
        return 0;
    }
    if (pr < 0) return 2;
    if (!model || !data || batch < 1 || batches < 1) {
        fprintf(stderr, "zeropp eval: needs --init-from FILE|DIR, --data TOKENS, --batch-size B "
                        "and --batches K\n");
        return 2;
    }
    if (strcmp(device, "cpu") && strcmp(device, "gpu")) {
        fprintf(stderr, "zeropp eval: --device takes cpu or gpu, not '%s'\n", device);
        return 2;
    }
    zpp_device *dev = NULL;
    zpp_status st = strcmp(device, "gpu") ? zpp_device_create_host(&dev)
                                          : zpp_device_create_gpu(0, &dev);
    if (st != ZPP_OK) return zpp_cli_fail("eval", st);
    zpp_llmc_eval_opts eo = {batch, batches, seq_len};
    double loss = 0.0;
    st = zpp_llmc_eval(model, data, &eo, dev, &loss);
    zpp_device_destroy(dev);
    if (st != ZPP_OK) return zpp_cli_fail("eval", st);
    if (json)
        printf("{\"loss\": %.9g, \"batches\": %d, \"batch_size\": %d}\n", loss, batches, batch);
    else
        printf("loss %.6f (mean of %d batches of %d sequences, read from the start of %s: for a "
               "file zeropp trained on, that is its training split; `zeropp eval DIR` scores a "
               "checkpoint on the held-out split)\n",
               loss, batches, batch, data);
    return 0;
}
