/* tools/tokenize.c — `zeropp tokenize`: text to an llm.c token file with
 * a BPE (train/bpe.h: GPT-2's files, or a Hugging Face tokenizer.json,
 * byte-level such as Llama 3's or SentencePiece-style such as Llama 2's),
 * streamed: the text is read a few MB
 * at a time, so its size is not bounded by memory. One process, no MPI.
 * Beside the token file it writes a note naming the tokenizer
 * (train/tokfile.h), which `zeropp sample` and `zeropp train
 * --sample-every` read to print a model's tokens as text. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "core/error.h"
#include "core/file.h"
#include "train/bpe.h"
#include "train/tokfile.h"

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: zeropp tokenize --vocab vocab.json --merges merges.txt [--allow-special]\n"
            "                       IN.txt OUT.bin\n"
            "       zeropp tokenize --tokenizer tokenizer.json [--allow-special] IN.txt OUT.bin\n"
            "  Encodes the text IN.txt (\"-\": standard input) with GPT-2's byte-level BPE and\n"
            "  writes OUT.bin, an llm.c token file (uint16 tokens) that `zeropp train --data`\n"
            "  reads; the trainer holds out its last tenth for validation. vocab.json and\n"
            "  merges.txt are GPT-2's tokenizer files (docs/data.md says where to get them).\n"
            "  Any bytes are taken: decoding the tokens gives IN.txt back byte for byte\n"
            "  (a byte-level BPE; docs/data.md says when a SentencePiece-style one does).\n"
            "  --tokenizer FILE  a Hugging Face tokenizer.json of a BPE (or a model's folder\n"
            "                    holding one), instead of --vocab and --merges: byte-level\n"
            "                    (Llama 3's, Qwen2's, GPT-2's) or SentencePiece-\n"
            "                    style with byte fallback (Llama 2's, Mistral's, TinyLlama's;\n"
            "                    docs/data.md lists the forms read); ids past 65535 make\n"
            "                    OUT.bin a version-2 token file (uint32 tokens, docs/data.md);\n"
            "                    --allow-special then matches its added tokens\n"
            "  --allow-special   the text \"<|endoftext|>\" becomes GPT-2's end-of-text token\n"
            "                    (50256), e.g. between documents; without it, it is plain text\n"
            "  --cache PIECES    encoded pieces (words) remembered (default 524288; 0: none)\n"
            "  --buffer BYTES    read the text this much at a time (default 4Mi; it grows to\n"
            "                    hold a longer piece, such as one run of whitespace)\n"
            "  OUT.bin is written whole or not at all (a temporary file, then a rename).\n"
            "  OUT.bin.json notes which tokenizer made it (the two files' absolute paths), so\n"
            "  that `zeropp sample` on a model trained on OUT.bin prints text without being\n"
            "  given --vocab and --merges again.\n");
}

/* Splits argv into the options (for zpp_cli_parse_opts) and the positional
 * words; "-" is a positional word (standard input). */
static int split_args(int argc, char **argv, const char *const *value_opts, int n_value,
                      char **opts, int *n_opts, char **pos, int *n_pos) {
    opts[(*n_opts)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-' || !strcmp(argv[i], "-")) {
            if (*n_pos == 2) return -1;
            pos[(*n_pos)++] = argv[i];
            continue;
        }
        opts[(*n_opts)++] = argv[i];
        for (int k = 0; k < n_value; k++)
            if (!strcmp(argv[i], value_opts[k]) && i + 1 < argc) {
                opts[(*n_opts)++] = argv[++i];
                break;
            }
    }
    return 0;
}

/* Encodes everything `in` gives into `out`, a buffer at a time; *bytes_p is
 * the text's size. */
static zpp_status encode_stream(zpp_bpe *bpe, FILE *in, const char *in_name, unsigned flags,
                                size_t cap, zpp_tokfile *out, size_t *bytes_p) {
    size_t have = 0, total = 0, encoded = 0; /* encoded: bytes of text already consumed */
    char *buf = malloc(cap);
    zpp_bpe_ids ids = {0};
    zpp_status st = buf ? ZPP_OK : zpp_error(ZPP_ERR_NOMEM, "out of memory");
    int eof = 0;
    while (st == ZPP_OK && !eof) {
        while (have < cap) { /* fill the buffer */
            const size_t r = fread(buf + have, 1, cap - have, in);
            have += r;
            total += r;
            if (r == 0) {
                if (ferror(in))
                    st = zpp_error(ZPP_ERR_IO, "cannot read '%s': %s", in_name, strerror(errno));
                eof = 1;
                break;
            }
        }
        if (st != ZPP_OK) break;
        size_t used = have;
        ids.n = 0;
        /* (CONTINUED: the buffer's start is not the text's, for a tokenizer
         * that puts a "▁" before the text's first word only) */
        st = zpp_bpe_encode(bpe, buf, have,
                            flags | (eof ? 0 : ZPP_BPE_PARTIAL) | (encoded ? ZPP_BPE_CONTINUED : 0),
                            &ids, &used);
        if (st == ZPP_OK) st = zpp_tokfile_append(out, ids.ids, ids.n);
        if (st != ZPP_OK) break;
        /* what is not final yet goes to the front, for the next read */
        memmove(buf, buf + used, have - used);
        have -= used;
        encoded += used;
        if (!eof && have == cap) { /* one piece longer than the buffer: grow it */
            char *b = realloc(buf, 2 * cap);
            if (!b) st = zpp_error(ZPP_ERR_NOMEM, "out of memory for a %zu-byte piece", have);
            else buf = b, cap *= 2;
        }
    }
    free(ids.ids);
    free(buf);
    *bytes_p = total;
    return st;
}

/* The tokenizer: a tokenizer.json, or GPT-2's two files. */
static zpp_status load_tokenizer(const char *json, const char *vocab, const char *merges,
                                 size_t cache, zpp_bpe **bpe_p) {
    zpp_bpe *bpe = NULL;
    ZPP_CHECK(json ? zpp_bpe_load_hf(json, &bpe) : zpp_bpe_load_gpt2(vocab, merges, &bpe));
    zpp_status st = ZPP_OK;
    if (cache != ZPP_BPE_CACHE_DEFAULT) st = zpp_bpe_set_cache(bpe, cache);
    if (st != ZPP_OK) {
        zpp_bpe_destroy(bpe);
        return st;
    }
    *bpe_p = bpe;
    return ZPP_OK;
}

/* The note beside out_path naming the tokenizer (its files' absolute
 * paths) into note_path[4096]. */
static zpp_status write_note(const char *out_path, const char *json, const char *vocab,
                             const char *merges, int32_t n_vocab, size_t tokens,
                             char *note_path) {
    zpp_tokfile_note note = {NULL, NULL, n_vocab, tokens, NULL};
    zpp_status st = ZPP_OK;
    if (json) {
        if (!(note.tokenizer_json = realpath(json, NULL)))
            st = zpp_error(ZPP_ERR_IO, "cannot resolve the path of '%s': %s", json,
                           strerror(errno));
    } else {
        note.vocab = realpath(vocab, NULL), note.merges = realpath(merges, NULL);
        if (!note.vocab || !note.merges)
            st = zpp_error(ZPP_ERR_IO, "cannot resolve the path of '%s': %s",
                           note.vocab ? merges : vocab, strerror(errno));
    }
    if (st == ZPP_OK) st = zpp_tokfile_note_path(out_path, note_path, 4096);
    if (st == ZPP_OK) st = zpp_tokfile_note_write(out_path, &note);
    zpp_tokfile_note_free(&note);
    return st;
}

int zpp_cli_tokenize(int argc, char **argv) {
    const char *vocab = NULL, *merges = NULL, *json = NULL;
    int allow_special = 0;
    size_t buffer = (size_t)4 << 20, cache = ZPP_BPE_CACHE_DEFAULT;
    const zpp_cli_opt opts[] = {
        {"--vocab", ZPP_CLI_STR, &vocab, 0, 0},
        {"--merges", ZPP_CLI_STR, &merges, 0, 0},
        {"--tokenizer", ZPP_CLI_STR, &json, 0, 0},
        {"--allow-special", ZPP_CLI_FLAG, &allow_special, 0, 0},
        {"--buffer", ZPP_CLI_SIZE, &buffer, 1, (long long)1 << 32},
        {"--cache", ZPP_CLI_SIZE, &cache, 0, ZPP_BPE_CACHE_MAX},
    };
    static const char *const value_opts[] = {"--vocab", "--merges", "--buffer", "--cache",
                                             "--tokenizer"};
    char **optv = malloc((size_t)(argc + 1) * sizeof *optv);
    char *pos[2];
    int optc = 0, n_pos = 0;
    if (!optv) return zpp_cli_fail("tokenize", zpp_error(ZPP_ERR_NOMEM, "out of memory"));
    const int split = split_args(argc, argv, value_opts, 5, optv, &optc, pos, &n_pos);
    const int pr = split ? -1 : zpp_cli_parse_opts("tokenize", optc, optv, opts, 6, 1);
    free(optv);
    if (pr > 0) {
        tokenize_usage(stdout);
        return 0;
    }
    if (split) fprintf(stderr, "zeropp tokenize: more than two files named; give IN.txt OUT.bin\n");
    if (pr < 0) return 2;
    if (json && (vocab || merges)) {
        fprintf(stderr, "zeropp tokenize: --tokenizer names the whole tokenizer; give it or "
                        "--vocab and --merges, not both\n");
        return 2;
    }
    if ((!json && (!vocab || !merges)) || n_pos != 2) {
        fprintf(stderr, "zeropp tokenize: needs %s, IN.txt and OUT.bin (see zeropp tokenize "
                        "--help)\n", json ? "--tokenizer FILE" : "--vocab FILE, --merges FILE");
        return 2;
    }
    const char *in_path = pos[0], *out_path = pos[1];
    /* Writing over the input would lose it (the rename replaces it). */
    struct stat si, so;
    if (strcmp(in_path, "-") && stat(in_path, &si) == 0 && stat(out_path, &so) == 0 &&
        si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fprintf(stderr, "zeropp tokenize: OUT.bin '%s' is the input file; name another\n",
                out_path);
        return 2;
    }
    const double t0 = zpp_cli_now_ms();
    zpp_bpe *bpe = NULL;
    zpp_status st = load_tokenizer(json, vocab, merges, cache, &bpe);
    if (st != ZPP_OK) return zpp_cli_fail("tokenize", st);
    const int32_t n_vocab = zpp_bpe_vocab_size(bpe);
    FILE *in = stdin;
    if (strcmp(in_path, "-")) st = zpp_fopen_regular(in_path, "text", &in);
    zpp_tokfile *out = NULL;
    if (st == ZPP_OK) st = zpp_tokfile_open(out_path, &out);
    size_t bytes = 0, tokens = 0;
    if (st == ZPP_OK)
        st = encode_stream(bpe, in, in_path, allow_special ? ZPP_BPE_SPECIAL : 0, buffer, out,
                           &bytes);
    if (st == ZPP_OK && bytes == 0)
        st = zpp_error(ZPP_ERR_INVALID, "'%s' holds no text: nothing to tokenize", in_path);
    if (st == ZPP_OK) {
        st = zpp_tokfile_close(out, &tokens);
        out = NULL;
    }
    zpp_tokfile_abort(out);
    if (in && in != stdin) fclose(in);
    zpp_bpe_destroy(bpe);
    if (st != ZPP_OK) return zpp_cli_fail("tokenize", st);
    /* the note: which tokenizer these ids are (its files were just read) */
    char note_path[4096] = "";
    st = write_note(out_path, json, vocab, merges, n_vocab, tokens, note_path);
    if (st != ZPP_OK) {
        fprintf(stderr, "zeropp tokenize: %s is written, but not the note naming its tokenizer: "
                        "zeropp sample will need %s\n", out_path,
                json ? "--tokenizer" : "--vocab and --merges");
        return zpp_cli_fail("tokenize", st);
    }
    const double s = (zpp_cli_now_ms() - t0) / 1e3;
    printf("wrote %s: %zu tokens from %zu bytes of %s (%.2f bytes a token), vocabulary %d, "
           "in %.1f s (%.1f MB/s); its tokenizer noted in %s\n",
           out_path, tokens, bytes, in_path, (double)bytes / (double)tokens, (int)n_vocab, s,
           s > 0 ? (double)bytes / 1e6 / s : 0.0, note_path);
    return 0;
}
