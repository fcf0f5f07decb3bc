/* tools/sample.c — `zeropp sample` (text from a checkpoint folder or an
 * llm.c model file, on one rank, without MPI), and what `zeropp train
 * --sample-every` prints and logs its samples with. The generation and the
 * draw are the library's (train/sample.h); this file reads options, picks
 * the decoder and prints. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "comm/comm.h"
#include "core/error.h"
#include "device/device.h"
#include "train/bpe.h"
#include "train/hf_model.h"
#include "train/sample.h"
#include "train/tokfile.h"
#include "train/trainer.h"

/* ---- The decoder ---------------------------------------------------------------
 *
 * Which text a model's tokens are: bytes for a byte-level model (vocabulary
 * 256, what `zeropp train` trains on raw text); for any other, the BPE
 * tokenizer its data was made with (GPT-2's files or a Hugging Face
 * tokenizer.json, train/bpe.h): given as --vocab and --merges, or
 * --tokenizer, or found through the checkpoint's data file, whose
 * note (`zeropp tokenize` writes OUT.bin.json, train/tokfile.h) names them.
 * Without one the ids are printed, in the form --prompt-ids takes. A decoder
 * is called one token at a time as the tokens come: BPE maps each token to
 * bytes of its own, so that is exact (a character cut between two tokens is
 * written whole once both are). */
static const zpp_sample_decoder kByteDecoder = {zpp_sample_decode_bytes, NULL};

/* A BPE tokenizer's decoder: each token's bytes. An id the tokenizer has no
 * token for (a model whose vocabulary is larger than the tokenizer's, its
 * spare ids barely trained) is written "<|id|>". */
static zpp_status bpe_decode(void *ctx, const int32_t *ids, size_t n, char *out, size_t cap,
                             size_t *len_p) {
    const zpp_bpe *bpe = ctx;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        char unk[24];
        size_t k = 0;
        const void *b = zpp_bpe_token_bytes(bpe, ids[i], &k);
        if (!b) {
            k = (size_t)snprintf(unk, sizeof unk, "<|%d|>", (int)ids[i]);
            b = unk;
        }
        if (len + k <= cap) memcpy(out + len, b, k);
        len += k;
    }
    *len_p = len;
    if (len > cap) return zpp_error(ZPP_ERR_NOMEM, "decode: %zu bytes do not fit in %zu", len, cap);
    return ZPP_OK;
}

/* Loads the tokenizer for a model of real vocabulary V: a tokenizer.json
 * (json), else GPT-2's two files; `origin` says where their names came
 * from, for messages. */
static zpp_status load_tokenizer(const char *json, const char *vocab, const char *merges, int V,
                                 const char *model, const char *origin, zpp_bpe **bpe_p) {
    zpp_bpe *bpe = NULL;
    zpp_status st = json ? zpp_bpe_load_hf(json, &bpe) : zpp_bpe_load_gpt2(vocab, merges, &bpe);
    if (st != ZPP_OK) return origin ? zpp_error_context(st, "%s", origin) : st;
    const int32_t n = zpp_bpe_vocab_size(bpe);
    if (n > V) {
        zpp_bpe_destroy(bpe);
        return zpp_error(ZPP_ERR_INVALID,
                         "the tokenizer %s has %d tokens, more than the %d of the model %s: it is "
                         "not the tokenizer the model's data was made with%s%s",
                         json ? json : vocab, (int)n, V, model, origin ? "; " : "",
                         origin ? origin : "");
    }
    *bpe_p = bpe;
    return ZPP_OK;
}

/* The tokenizer noted beside `data` (train/tokfile.h), for a model of real
 * vocabulary V; *bpe_p stays NULL where there is no note. */
static zpp_status noted_tokenizer(const char *data, int V, const char *model, zpp_bpe **bpe_p) {
    zpp_tokfile_note note;
    int found = 0;
    ZPP_CHECK(zpp_tokfile_note_read(data, &note, &found));
    if (!found) return ZPP_OK;
    char origin[4400], path[4096];
    zpp_tokfile_note_path(data, path, sizeof path);
    snprintf(origin, sizeof origin,
             "(the tokenizer named by %s, the note beside the model's data; pass %s to name it "
             "yourself)",
             path, note.tokenizer_json ? "--tokenizer" : "--vocab and --merges");
    zpp_status st =
        load_tokenizer(note.tokenizer_json, note.vocab, note.merges, V, model, origin, bpe_p);
    zpp_tokfile_note_free(&note);
    return st;
}

/* ---- zeropp train --sample-every: the tokenizer of the run's data ----------------- */

static zpp_bpe *g_train_bpe; /* rank 0's, for the run's samples; NULL: bytes or ids */
static zpp_sample_decoder g_train_dec;

static void free_train_tokenizer(void) {
    zpp_bpe_destroy(g_train_bpe);
    g_train_bpe = NULL;
    g_train_dec.decode = NULL;
}

void zpp_cli_sample_use_data_tokenizer(const char *data, const zpp_gpt2_config *model) {
    const int V = zpp_gpt2_real_vocab(model);
    if (!data || V == 256 || g_train_bpe) return;
    zpp_bpe *bpe = NULL;
    if (noted_tokenizer(data, V, "being trained", &bpe) != ZPP_OK) {
        printf("note: samples print token ids: %s\n", zpp_last_error());
        return;
    }
    if (!bpe) return;
    g_train_bpe = bpe;
    g_train_dec = (zpp_sample_decoder){bpe_decode, bpe};
    atexit(free_train_tokenizer);
}

static const zpp_sample_decoder *sample_decoder_for(int real_vocab) {
    if (g_train_dec.decode) return &g_train_dec;
    return real_vocab == 256 ? &kByteDecoder : NULL;
}

/* ---- Printing ------------------------------------------------------------------ */

typedef struct sample_printer {
    FILE *f;
    const zpp_sample_decoder *dec;
    int printed; /* tokens printed so far (for the commas between ids) */
} sample_printer;

/* Prints tokens as text (the decoder's bytes, unchanged) or ids. */
static zpp_status print_tokens(sample_printer *p, const int32_t *tok, size_t n) {
    if (n == 0) return ZPP_OK;
    char *text = NULL;
    size_t len = 0;
    ZPP_CHECK(zpp_sample_text(p->dec, tok, n, &text, &len));
    if (!p->dec && p->printed) fputc(',', p->f);
    fwrite(text, 1, len, p->f);
    free(text);
    fflush(p->f);
    p->printed += (int)n;
    return ZPP_OK;
}

static zpp_status print_token(void *ctx, int32_t tok) { return print_tokens(ctx, &tok, 1); }

/* One JSON string: UTF-8 passes through, quotes, backslashes and control
 * characters are escaped, and a byte that starts no valid UTF-8 sequence
 * becomes U+FFFD (JSON text must be UTF-8; a barely trained byte model
 * writes any byte). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (k == 0 || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    /* no overlong forms, surrogates or code points past U+10FFFF */
    if (k == 3 && ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f))) return 0;
    if (k == 4 && ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))) return 0;
    return k;
}

static void json_string(FILE *f, const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t k = utf8_len(s + i, len - i);
        if (k == 0) {
            fputs("\\ufffd", f);
            i++;
        } else if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
            i++;
        } else if (c == '\n') {
            fputs("\\n", f), i++;
        } else if (c == '\t') {
            fputs("\\t", f), i++;
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c), i++;
        } else {
            fwrite(s + i, 1, k, f);
            i += k;
        }
    }
    fputc('"', f);
}

/* ---- zeropp train --sample-every ----------------------------------------------- */

zpp_status zpp_cli_sample_trainer(zpp_trainer *t, const zpp_train_config *cfg,
                                  zpp_cli_sample_result *s) {
    memset(s, 0, sizeof *s);
    zpp_trainer_sample_prompt(t, s->prompt, &s->n_prompt);
    /* the model's distribution (temperature 1, every token), the run's
     * seed: the same draws every time, so successive samples differ only
     * by what the model learned in between */
    zpp_sample_opts o = {1.0, 0, cfg->seed};
    s->gen = malloc((size_t)cfg->sample_tokens * sizeof *s->gen);
    /* collective: a rank without memory stops them all, before any forward */
    zpp_status st = zpp_comm_agree_world(
        s->gen ? ZPP_OK : zpp_error(ZPP_ERR_NOMEM, "sample: out of memory"));
    if (st == ZPP_OK)
        st = zpp_trainer_sample(t, &o, s->prompt, s->n_prompt, cfg->sample_tokens, s->gen);
    if (st != ZPP_OK) {
        zpp_cli_sample_result_free(s);
        return st;
    }
    s->n_gen = cfg->sample_tokens;
    s->real_vocab = zpp_gpt2_real_vocab(&cfg->model);
    return ZPP_OK;
}

void zpp_cli_sample_result_free(zpp_cli_sample_result *s) {
    free(s->gen);
    s->gen = NULL;
    s->n_gen = 0;
}

void zpp_cli_sample_json(FILE *f, const zpp_cli_sample_result *s) {
    char *text = NULL;
    size_t len = 0;
    if (zpp_sample_text(sample_decoder_for(s->real_vocab), s->gen, (size_t)s->n_gen, &text,
                        &len) != ZPP_OK)
        return; /* out of memory: the ids below still say it all */
    fputs(",\"sample\":", f);
    json_string(f, text, len);
    free(text);
    fputs(",\"sample_ids\":[", f);
    for (int i = 0; i < s->n_gen; i++) fprintf(f, i ? ",%d" : "%d", (int)s->gen[i]);
    fputc(']', f);
}

/* A model early in training writes any byte, escape sequences included:
 * on a log, control characters but newline and tab, and bytes that are not
 * UTF-8, show as '?'. */
static void log_safe(char *text, size_t n) {
    unsigned char *s = (unsigned char *)text;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_len(s + i, n - i);
        if (k == 0 || (s[i] < 0x20 && s[i] != '\n' && s[i] != '\t') || s[i] == 0x7f) {
            s[i++] = '?';
            continue;
        }
        i += k;
    }
}

/* As llm.c prints its samples, between two rules. */
void zpp_cli_sample_print(FILE *f, int step, const zpp_cli_sample_result *s) {
    const zpp_sample_decoder *dec = sample_decoder_for(s->real_vocab);
    char *p = NULL, *g = NULL;
    size_t pl = 0, gl = 0;
    if (zpp_sample_text(dec, s->prompt, (size_t)s->n_prompt, &p, &pl) != ZPP_OK ||
        zpp_sample_text(dec, s->gen, (size_t)s->n_gen, &g, &gl) != ZPP_OK) {
        free(p);
        return;
    }
    log_safe(p, pl);
    log_safe(g, gl);
    fprintf(f, "sample at step %d (%d tokens after the first %d of the validation data):\n---\n",
            step, s->n_gen, s->n_prompt);
    fwrite(p, 1, pl, f);
    if (!dec) fputc(',', f);
    fwrite(g, 1, gl, f);
    fputs("\n---\n", f);
    free(p);
    free(g);
}

/* ---- zeropp sample --------------------------------------------------------------- */

#define SAMPLE_DEFAULT_SEED 1234
#define SAMPLE_DEFAULT_TOKENS 128

static void sample_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp sample DIR|HF_DIR|MODEL.bin [--prompt TEXT | --prompt-ids 1,2,3]\n"
            "                     [--vocab vocab.json --merges merges.txt] [--ids]\n"
            "                     [--tokenizer tokenizer.json]\n"
            "                     [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]\n"
            "                     [--device cpu|gpu] [--dtype fp32|bf16|fp16] [--seq-len T]\n"
            "  Continues a prompt with a trained model (GPT-2 or Llama) and prints the prompt\n"
            "  and what follows, as text: bytes for a byte-level model (vocabulary 256), else\n"
            "  the BPE tokenizer its data was made with.\n"
            "  DIR, --from PATH    a checkpoint folder (`zeropp train --save DIR`: its published\n"
            "                      checkpoint, or a step folder), put together on this one rank\n"
            "                      from every rank file that saved it; a Hugging Face Llama,\n"
            "                      Mistral, Qwen2 or GPT-2 folder (config.json + safetensors,\n"
            "                      with its tokenizer); or an llm.c model file\n"
            "  --vocab FILE        GPT-2's tokenizer files (vocab.json, merges.txt; both), for a\n"
            "  --merges FILE       model whose vocabulary is not bytes. Not needed for a\n"
            "                      checkpoint trained on a file `zeropp tokenize` made: the note\n"
            "                      it left beside it (OUT.bin.json) names them\n"
            "  --tokenizer FILE    a Hugging Face tokenizer.json (or a model's folder holding\n"
            "                      one), instead of --vocab and --merges\n"
            "  --ids               print token ids (comma-separated) instead of text\n"
            "  --prompt TEXT       the prompt, encoded as the model's data was (bytes, or the\n"
            "                      tokenizer; \"<|endoftext|>\" is its special token); default a\n"
            "                      newline\n"
            "  --prompt-ids LIST   the prompt as token ids, comma-separated (any vocabulary)\n"
            "  --max-new-tokens N  tokens to add (default %d)\n"
            "  --temperature T     0 = the most likely token each time; 1 (default) = the\n"
            "                      model's distribution; above 1 flatter, below sharper\n"
            "  --top-k K           draw among the K most likely tokens only (1..vocabulary;\n"
            "                      default: all of them)\n"
            "  --seed S            the draws' random stream (default %d): the same seed, model\n"
            "                      and options give the same text\n"
            "  --device D          cpu (default) or gpu (GPU 0)\n"
            "  --dtype D           the weights' dtype in the model (default: the one they\n"
            "                      trained in, the checkpoint's; fp32 or bf16 for llm.c files;\n"
            "                      fp32 for a Hugging Face folder)\n"
            "  --seq-len T         a Hugging Face folder's window (default its\n"
            "                      max_position_embeddings, at most %d)\n"
            "  Each new token is a forward over the last seq_len tokens (docs/sampling.md).\n",
            SAMPLE_DEFAULT_TOKENS, SAMPLE_DEFAULT_SEED, ZPP_SAMPLE_HF_SEQ_LEN);
}

/* "12,7,503" -> ids (malloc'd); -1 after printing what is wrong. */
static int parse_ids(const char *s, int32_t **ids_p, int *n_p) {
    int n = 1;
    for (const char *c = s; *c; c++) n += *c == ',';
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "zeropp sample: out of memory\n");
        return -1;
    }
    const char *c = s;
    for (int i = 0; i < n; i++) {
        char *end = NULL;
        errno = 0;
        long v = *c >= '0' && *c <= '9' ? strtol(c, &end, 10) : -1;
        if (v < 0 || errno || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            fprintf(stderr,
                    "zeropp sample: --prompt-ids takes token ids (whole numbers >= 0) separated "
                    "by commas, like 464,2068,7586; '%s' is not\n",
                    s);
            free(ids);
            return -1;
        }
        ids[i] = (int32_t)v;
        c = end + 1;
    }
    *ids_p = ids;
    *n_p = n;
    return 0;
}

/* The tokenizer of the Hugging Face folder `dir`: its tokenizer.json, else
 * GPT-2's vocab.json and merges.txt; *bpe_p stays NULL where it has none.
 * `whose` says what the folder is, for messages. */
static zpp_status folder_tokenizer(const char *dir, int V, const char *model, const char *whose,
                                   zpp_bpe **bpe_p) {
    char json[4200], vocab[4200], merges[4200], origin[4600];
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    snprintf(vocab, sizeof vocab, "%s/vocab.json", dir);
    snprintf(merges, sizeof merges, "%s/merges.txt", dir);
    const int has_json = access(json, R_OK) == 0;
    if (!has_json && (access(vocab, R_OK) != 0 || access(merges, R_OK) != 0)) return ZPP_OK;
    snprintf(origin, sizeof origin, "(the tokenizer of %s, %s; pass --tokenizer to name another)",
             dir, whose);
    return has_json ? load_tokenizer(json, NULL, NULL, V, model, origin, bpe_p)
                    : load_tokenizer(NULL, vocab, merges, V, model, origin, bpe_p);
}

/* The tokenizer for the model in `from` (real vocabulary V, `step` < 0 for an
 * llm.c model file or a Hugging Face folder): --tokenizer or --vocab/--merges;
 * a Hugging Face folder's own; else for a checkpoint the note beside its
 * data file, else the tokenizer of the folder it was imported from
 * (--init-from); *bpe_p NULL where there is none.
 * *data_p (malloc'd, or NULL): the checkpoint's data file, for the message
 * that asks for one. */
static zpp_status find_tokenizer(const char *from, int step, int V, const char *json,
                                 const char *vocab, const char *merges, zpp_bpe **bpe_p,
                                 char **data_p) {
    if (json || vocab) return load_tokenizer(json, vocab, merges, V, from, NULL, bpe_p);
    if (zpp_hf_is_model_dir(from)) /* a Hugging Face folder: its own tokenizer */
        return folder_tokenizer(from, V, from, "the model's folder", bpe_p);
    if (step < 0 || V == 256) return ZPP_OK;
    zpp_train_config cfg;
    zpp_trainer_saved_run saved;
    ZPP_CHECK(zpp_trainer_config_from_checkpoint(from, &cfg, &saved));
    *data_p = saved.data_path;
    zpp_status st = saved.data_path ? noted_tokenizer(saved.data_path, V, from, bpe_p) : ZPP_OK;
    /* else the tokenizer of the Hugging Face folder it was imported from */
    if (st == ZPP_OK && !*bpe_p && saved.init_from && zpp_hf_is_model_dir(saved.init_from))
        st = folder_tokenizer(saved.init_from, V, from, "the folder the model was imported from",
                              bpe_p);
    free(saved.init_from);
    return st;
}

/* What `zeropp sample` was asked, checked. */
typedef struct sample_args {
    const char *from; /* the model: DIR or --from */
    int seq_len;      /* --seq-len, for a Hugging Face folder; 0: not given */
    const char *prompt, *prompt_ids, *device, *dtype_name, *vocab, *merges, *json;
    int max_new, top_k, print_ids; /* top_k -1: not given */
    unsigned long long seed;
    double temperature;
    zpp_dtype dtype; /* --dtype, when dtype_name */
} sample_args;

/* The options: 0 to sample, 1 after --help, -1 after saying on stderr what
 * is wrong with the command line. */
static int parse_sample_args(int argc, char **argv, sample_args *sa) {
    const char *pos = NULL, *temp = NULL;
    memset(sa, 0, sizeof *sa);
    sa->device = "cpu";
    sa->max_new = SAMPLE_DEFAULT_TOKENS;
    sa->top_k = -1;
    sa->seed = SAMPLE_DEFAULT_SEED;
    const zpp_cli_opt opts[] = {
        {"DIR", ZPP_CLI_POS, &pos, 0, 0},
        {"--from", ZPP_CLI_STR, &sa->from, 0, 0},
        {"--prompt", ZPP_CLI_STR, &sa->prompt, 0, 0},
        {"--prompt-ids", ZPP_CLI_STR, &sa->prompt_ids, 0, 0},
        {"--vocab", ZPP_CLI_STR, &sa->vocab, 0, 0},
        {"--merges", ZPP_CLI_STR, &sa->merges, 0, 0},
        {"--tokenizer", ZPP_CLI_STR, &sa->json, 0, 0},
        {"--ids", ZPP_CLI_FLAG, &sa->print_ids, 0, 0},
        {"--max-new-tokens", ZPP_CLI_INT, &sa->max_new, 0, 1 << 24},
        {"--temperature", ZPP_CLI_STR, &temp, 0, 0},
        {"--top-k", ZPP_CLI_INT, &sa->top_k, 0, INT_MAX},
        {"--seed", ZPP_CLI_U64, &sa->seed, 0, 1ll << 53},
        {"--device", ZPP_CLI_STR, &sa->device, 0, 0},
        {"--dtype", ZPP_CLI_STR, &sa->dtype_name, 0, 0},
        {"--seq-len", ZPP_CLI_INT, &sa->seq_len, 1, 1 << 24},
    };
    int pr = zpp_cli_parse_opts("sample", argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), 1);
    if (pr > 0) {
        sample_usage(stdout);
        return 1;
    }
    if (pr < 0) return -1;
    if (pos && sa->from) {
        fprintf(stderr, "zeropp sample: '%s' and --from %s both name the model; give one\n", pos,
                sa->from);
        return -1;
    }
    if (pos) sa->from = pos;
    if (!sa->from) {
        fprintf(stderr, "zeropp sample: name the model: a checkpoint folder (zeropp sample DIR), "
                        "a Hugging Face model folder or an llm.c model file (zeropp sample "
                        "MODEL.bin)\n");
        return -1;
    }
    if (sa->prompt && sa->prompt_ids) {
        fprintf(stderr, "zeropp sample: --prompt and --prompt-ids both give the prompt; give "
                        "one\n");
        return -1;
    }
    if (!sa->vocab != !sa->merges) {
        fprintf(stderr, "zeropp sample: --vocab and --merges name GPT-2's two tokenizer files "
                        "(vocab.json and merges.txt); give both\n");
        return -1;
    }
    if (sa->json && sa->vocab) {
        fprintf(stderr, "zeropp sample: --tokenizer names the whole tokenizer; give it or "
                        "--vocab and --merges, not both\n");
        return -1;
    }
    sa->temperature = 1.0;
    if (temp) {
        char *end = NULL;
        sa->temperature = strtod(temp, &end);
        if (end == temp || *end || !isfinite(sa->temperature) || sa->temperature < 0) {
            fprintf(stderr, "zeropp sample: --temperature expects a number >= 0 (0 = the most "
                            "likely token, 1 = the model's distribution), got '%s'\n", temp);
            return -1;
        }
    }
    if (sa->top_k == 0) {
        fprintf(stderr, "zeropp sample: --top-k 0 leaves no token to draw; give 1 or more, or "
                        "leave --top-k out to draw from the whole vocabulary\n");
        return -1;
    }
    if (strcmp(sa->device, "cpu") && strcmp(sa->device, "gpu")) {
        fprintf(stderr, "zeropp sample: --device takes cpu or gpu, not '%s'\n", sa->device);
        return -1;
    }
    sa->dtype = ZPP_FP32;
    if (sa->dtype_name && zpp_dtype_parse(sa->dtype_name, &sa->dtype) != ZPP_OK) {
        fprintf(stderr, "zeropp sample: --dtype takes fp32, bf16 or fp16, not '%s'\n",
                sa->dtype_name);
        return -1;
    }
    return 0;
}

/* The tokenizer, where text is asked for (printed, or the prompt's), and
 * the checks that need the model's vocabulary V. 0, 1 (a failure, said) or
 * 2 (a command line this model cannot take, said). */
static int load_text_form(const sample_args *sa, int V, int step, zpp_bpe **bpe_p,
                          char **data_p) {
    zpp_status st = ZPP_OK;
    if (!sa->print_ids || !sa->prompt_ids)
        st = find_tokenizer(sa->from, step, V, sa->json, sa->vocab, sa->merges, bpe_p, data_p);
    if (st != ZPP_OK) return zpp_cli_fail("sample", st);
    const zpp_bpe *bpe = *bpe_p;
    const int has_decoder = bpe || V == 256;
    if (!has_decoder && !(sa->print_ids && sa->prompt_ids)) {
        char where[4200] = "";
        if (*data_p)
            snprintf(where, sizeof where, " (its data, %s, has no tokenizer note %s.json)",
                     *data_p, *data_p);
        fprintf(stderr,
                "zeropp sample: %s has a vocabulary of %d tokens, not bytes, and no tokenizer is "
                "known for it%s: pass the tokenizer its data was made with (--tokenizer "
                "tokenizer.json, or --vocab vocab.json --merges merges.txt) to %s, or --ids "
                "with --prompt-ids to work in token ids\n",
                sa->from, V, where, sa->prompt || !sa->prompt_ids
                                        ? "encode the prompt and print text"
                                        : "print text");
        return 2;
    }
    if (sa->top_k > V) {
        fprintf(stderr, "zeropp sample: --top-k %d is more than the vocabulary of %s (%d tokens); "
                        "give 1..%d\n", sa->top_k, sa->from, V, V);
        return 2;
    }
    if (bpe && zpp_bpe_vocab_size(bpe) < V && !sa->print_ids)
        fprintf(stderr, "zeropp sample: note: the tokenizer has %d tokens, the model %d: a token "
                        "past %d prints as <|id|>\n",
                (int)zpp_bpe_vocab_size(bpe), V, (int)zpp_bpe_vocab_size(bpe) - 1);
    return 0;
}

/* The prompt's text (or the default, a newline) as ids (malloc'd): the
 * tokenizer's encoding, or its bytes for a byte-level model (the checks of
 * load_text_form leave no other case). */
static zpp_status encode_prompt(const char *prompt, zpp_bpe *bpe, int32_t **ids_p, int *n_p) {
    const char *text = prompt ? prompt : "\n";
    const size_t len = strlen(text);
    if (bpe) {
        zpp_bpe_ids enc = {0};
        zpp_status st = zpp_bpe_encode(bpe, text, len, ZPP_BPE_SPECIAL, &enc, NULL);
        if (st == ZPP_OK && enc.n > (size_t)INT_MAX)
            st = zpp_error(ZPP_ERR_INVALID, "--prompt: too long");
        if (st != ZPP_OK) {
            free(enc.ids);
            return st;
        }
        *ids_p = enc.ids;
        *n_p = (int)enc.n;
        return ZPP_OK;
    }
    if (len > (size_t)INT_MAX) return zpp_error(ZPP_ERR_INVALID, "--prompt: too long");
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    if (!ids) return zpp_error(ZPP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) ids[i] = (unsigned char)text[i];
    *ids_p = ids;
    *n_p = (int)len;
    return ZPP_OK;
}

/* The work: the model on its device (the weights `w` are freed here,
 * once it holds them), the checks of the prompt and options (before
 * anything prints), then the prompt and each new token printed as it
 * comes, through `dec` (NULL: ids). 0, or 1 after saying what failed. */
static int generate(const sample_args *sa, zpp_sample_weights *w, const zpp_sample_decoder *dec,
                    const int32_t *ids, int n_ids) {
    const int V = zpp_sample_real_vocab(&w->shape);
    zpp_device *dev = NULL;
    zpp_sample_model *sm = NULL;
    int32_t *gen = NULL;
    zpp_status st = strcmp(sa->device, "gpu") ? zpp_device_create_host(&dev)
                                              : zpp_device_create_gpu(0, &dev);
    if (st == ZPP_OK)
        st = zpp_sample_model_create(w, sa->dtype_name ? sa->dtype : w->dtype, dev, &sm);
    zpp_sample_weights_free(w);
    if (st == ZPP_OK && !(gen = malloc(((size_t)sa->max_new + 1) * sizeof *gen)))
        st = zpp_error(ZPP_ERR_NOMEM, "out of memory");
    sample_printer p = {stdout, dec, 0};
    zpp_sample_opts o = {sa->temperature, sa->top_k > 0 ? sa->top_k : 0, (uint64_t)sa->seed};
    /* the checks of the prompt and options come before anything prints */
    if (st == ZPP_OK) st = zpp_sample_opts_check(&o, V);
    for (int i = 0; st == ZPP_OK && i < n_ids; i++)
        if (ids[i] >= V)
            st = zpp_error(ZPP_ERR_INVALID,
                           "prompt token %d at position %d is outside the vocabulary 0..%d of %s",
                           (int)ids[i], i, V - 1, sa->from);
    if (st == ZPP_OK) {
        zpp_sample_source src = zpp_sample_model_source(sm);
        st = print_tokens(&p, ids, (size_t)n_ids);
        if (st == ZPP_OK)
            st = zpp_sample_generate(&src, &o, ids, n_ids, sa->max_new, print_token, &p, gen);
        fputc('\n', stdout);
    }
    const int rc = st == ZPP_OK ? 0 : zpp_cli_fail("sample", st);
    zpp_sample_model_destroy(sm);
    zpp_device_destroy(dev);
    free(gen);
    return rc;
}

int zpp_cli_sample(int argc, char **argv) {
    sample_args sa;
    int pr = parse_sample_args(argc, argv, &sa);
    if (pr != 0) return pr > 0 ? 0 : 2;
    int32_t *ids = NULL;
    int n_ids = 0;
    if (sa.prompt_ids && parse_ids(sa.prompt_ids, &ids, &n_ids) != 0) return 2;

    zpp_sample_weights w;
    memset(&w, 0, sizeof w);
    int rc = 0;
    zpp_bpe *bpe = NULL;
    char *data = NULL;
    zpp_status st = zpp_sample_read_weights(sa.from, sa.seq_len, &w);
    if (st != ZPP_OK) {
        rc = zpp_cli_fail("sample", st);
        goto out;
    }
    const int V = zpp_sample_real_vocab(&w.shape);
    rc = load_text_form(&sa, V, w.step, &bpe, &data);
    if (rc != 0) goto out;
    if (!ids) { /* the prompt's text, or the default */
        st = encode_prompt(sa.prompt, bpe, &ids, &n_ids);
        if (st != ZPP_OK) {
            rc = zpp_cli_fail("sample", st);
            goto out;
        }
    }
    zpp_sample_decoder bpe_dec = {bpe_decode, bpe};
    const zpp_sample_decoder *dec = sa.print_ids ? NULL
                                    : bpe        ? &bpe_dec
                                    : V == 256   ? &kByteDecoder
                                                 : NULL;
    rc = generate(&sa, &w, dec, ids, n_ids); /* frees w's units */
out:
    zpp_sample_weights_free(&w);
    zpp_bpe_destroy(bpe);
    free(data);
    free(ids);
    return rc;
}
