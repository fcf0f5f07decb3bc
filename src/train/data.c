/* train/data.c — token sources and deterministic batching (see data.h). */
#include "train/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "core/random.h"

struct zpp_data {
    zpp_data_kind kind;
    const uint8_t *tok; /* synthetic: the first token (in memory), else NULL */
    int elem;           /* bytes a token: 1 (raw text, synthetic), 2 or 4 (llm.c v1, v2) */
    size_t n, n_train, n_val;
    size_t K, K_val; /* training / validation windows */
    size_t slack;    /* n_train - 1 - K * T: room to shift the window grid */
    int T, vocab, micro, accum;
    uint64_t seed;
    zpp_data_order order;
    /* A file is read with positioned reads (pread), never mapped: a file
     * that shrinks under us is an error message, not a SIGBUS. */
    int fd;          /* the data file, or -1 */
    size_t file_len; /* its size when opened */
    size_t tok_off;  /* byte offset of token 0 in the file (the llm.c header) */
    char *path;      /* for messages */
    uint8_t *owned;  /* synthetic corpus, or NULL */
};

/* ------------------------------------------------------------------------ */
/* Hashing and the keyed permutation                                         */
/* ------------------------------------------------------------------------ */

static uint64_t feistel_key(uint64_t seed, uint64_t epoch, uint64_t what) {
    return zpp_hash64(zpp_hash64(seed ^ (what * 0xd1342543de82ef95ull)) + epoch);
}

/* A Feistel network on 2h-bit integers: split x into halves (L, R), then
 * four rounds of (L, R) <- (R, L xor F(R)). Each round is invertible
 * whatever F is (L = R' xor F(L')), so the whole map is a bijection of
 * [0, 4^h): a pseudo-random permutation chosen by `key`, with no table. */
static uint64_t feistel(uint64_t x, int h, uint64_t key) {
    const uint64_t mask = (1ull << h) - 1;
    uint64_t L = x >> h, R = x & mask;
    for (uint64_t round = 0; round < 4; round++) {
        uint64_t F = zpp_hash64(R ^ zpp_hash64(key + round)) & mask;
        uint64_t nl = R;
        R = L ^ F;
        L = nl;
    }
    return (L << h) | R;
}

/* A permutation of [0, K) by cycle-walking: apply the permutation of the
 * enclosing [0, 4^h) until the value lands inside [0, K). Following the
 * cycle of i inside the big permutation reaches the next element of [0, K)
 * on that cycle, which keeps the map one-to-one. 4^h < 4K, so the expected
 * number of walks is below 4. */
static uint64_t permute(uint64_t i, uint64_t K, uint64_t key) {
    int h = 1;
    while (h < 32 && (1ull << (2 * h)) < K) h++;
    uint64_t y = i;
    do {
        y = feistel(y, h, key);
    } while (y >= K);
    return y;
}

/* ------------------------------------------------------------------------ */
/* Token access                                                              */
/* ------------------------------------------------------------------------ */

static inline int32_t tok_at(const uint8_t *b, int elem, size_t i) {
    if (elem == 1) return b[i];
    if (elem == 4) { /* (a value past INT32_MAX comes out negative: the open refuses it) */
        const uint8_t *p = b + 4 * i;
        return (int32_t)(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                         (uint32_t)p[3] << 24);
    }
    const uint8_t *p = b + 2 * i;
    return (int32_t)(p[0] | (uint32_t)p[1] << 8);
}

/* Reads bytes [off, off + n) of the data file (off counted from the file's
 * start) into buf: all of them, or ZPP_ERR_IO naming the file and, when it
 * shrank since it was opened, its old and new sizes. */
static zpp_status pread_all(const zpp_data *d, void *buf, size_t n, size_t off) {
    uint8_t *b = buf;
    while (n > 0) {
        ssize_t got = pread(d->fd, b, n, (off_t)off);
        if (got > 0) {
            b += got;
            n -= (size_t)got;
            off += (size_t)got;
            continue;
        }
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            return zpp_error(ZPP_ERR_IO, "cannot read data file %s at byte %zu: %s", d->path,
                             off, strerror(errno));
        /* end of file before the bytes we counted on */
        struct stat sb;
        size_t now = fstat(d->fd, &sb) == 0 ? (size_t)sb.st_size : off;
        return zpp_error(ZPP_ERR_IO,
                         "data file %s shrank from %zu to %zu bytes while training; it was "
                         "changed under the run (do not rewrite a data file in use: write a "
                         "new file and point --data at it)",
                         d->path, d->file_len, now);
    }
    return ZPP_OK;
}

/* Sequence [start, start + T]: tokens[t] = token start + t, targets[t] =
 * token start + t + 1. A file's T + 1 tokens come with one pread into the
 * tokens buffer ((T + 1) * elem <= 4 T bytes for T >= 1 and elem <= 2),
 * then widen in place from the back (int32 t lies at bytes >= 4 t, beyond
 * the elem bytes of tokens < t). uint32 tokens (elem 4) are T + 1 int32,
 * one more than the buffer: the last comes with a read of its own. */
static zpp_status read_seq(const zpp_data *d, size_t start, int32_t *tokens,
                                int32_t *targets) {
    const int T = d->T;
    const uint8_t *src = d->tok ? d->tok + (size_t)d->elem * start : NULL;
    if (!src && d->elem == 4) {
        const size_t off = d->tok_off + 4 * start;
        uint8_t last[4];
        ZPP_CHECK(pread_all(d, tokens, 4 * (size_t)T, off));
        ZPP_CHECK(pread_all(d, last, 4, off + 4 * (size_t)T));
        src = (const uint8_t *)tokens;
        for (int t = 0; t + 1 < T; t++) targets[t] = tok_at(src, 4, (size_t)t + 1);
        targets[T - 1] = tok_at(last, 4, 0);
        for (int t = 0; t < T; t++) tokens[t] = tok_at(src, 4, (size_t)t); /* in place */
        return ZPP_OK;
    }
    if (!src) {
        ZPP_CHECK(pread_all(d, tokens, (size_t)(T + 1) * (size_t)d->elem,
                            d->tok_off + (size_t)d->elem * start));
        src = (const uint8_t *)tokens;
    }
    for (int t = 0; t < T; t++) targets[t] = tok_at(src, d->elem, (size_t)t + 1);
    for (int t = T - 1; t >= 0; t--) tokens[t] = tok_at(src, d->elem, (size_t)t);
    return ZPP_OK;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ------------------------------------------------------------------------ */
/* The synthetic corpus                                                      */
/* ------------------------------------------------------------------------ */
/*
 * A word-level Markov chain spelled out in letters. 48 words of 2-6 letters
 * (random, distinct); each word has 3 successors taken with probability
 * 0.6 / 0.3 / 0.1; after each word the sentence ends with probability 0.2
 * ('.' then '\n' with probability 0.25, else ' '), and a new sentence
 * starts with one of 6 starter words. Entropy per word ~ H(0.6,0.3,0.1)
 * + H(0.2) ~ 0.90 + 0.50 nats over ~5 tokens, so a model that has learned
 * the spellings and the chain reaches ~0.3 nats/token, while the unigram
 * entropy of the letters is ~3 nats: plenty of signal for a small GPT.
 */
#define ZPP__SYN_WORDS 48
#define ZPP__SYN_SUCC 3
#define ZPP__SYN_STARTERS 6
#define ZPP__SYN_SEED 0x7a65726f70702121ull /* fixed: the same text for every config */

/* Uniform in [0, 1) from the top 53 bits. */
static double rng_unit(uint64_t *s) { return (double)(zpp_splitmix64(s) >> 11) * 0x1.0p-53; }

static void synth_generate(uint8_t *out, size_t n) {
    uint64_t s = ZPP__SYN_SEED;
    char words[ZPP__SYN_WORDS][8];
    int len[ZPP__SYN_WORDS];
    for (int w = 0; w < ZPP__SYN_WORDS; w++) {
        for (;;) {
            len[w] = 2 + (int)(zpp_splitmix64(&s) % 5);
            for (int i = 0; i < len[w]; i++) words[w][i] = (char)('a' + zpp_splitmix64(&s) % 26);
            words[w][len[w]] = '\0';
            int dup = 0;
            for (int v = 0; v < w; v++) dup |= strcmp(words[v], words[w]) == 0;
            if (!dup) break;
        }
    }
    int succ[ZPP__SYN_WORDS][ZPP__SYN_SUCC];
    for (int w = 0; w < ZPP__SYN_WORDS; w++) {
        for (int k = 0; k < ZPP__SYN_SUCC; k++) {
            int v, dup;
            do {
                v = (int)(zpp_splitmix64(&s) % ZPP__SYN_WORDS);
                dup = 0;
                for (int q = 0; q < k; q++) dup |= succ[w][q] == v;
            } while (dup);
            succ[w][k] = v;
        }
    }
    static const double cum[ZPP__SYN_SUCC] = {0.6, 0.9, 1.0};
    size_t i = 0;
    int w = (int)(zpp_splitmix64(&s) % ZPP__SYN_STARTERS);
    while (i < n) {
        for (int c = 0; c < len[w] && i < n; c++) out[i++] = (uint8_t)words[w][c];
        if (i >= n) break;
        if (rng_unit(&s) < 0.2) {
            out[i++] = '.';
            if (i < n) out[i++] = rng_unit(&s) < 0.25 ? '\n' : ' ';
            w = (int)(zpp_splitmix64(&s) % ZPP__SYN_STARTERS);
        } else {
            out[i++] = ' ';
            double u = rng_unit(&s);
            int k = 0;
            while (k < ZPP__SYN_SUCC - 1 && u >= cum[k]) k++;
            w = succ[w][k];
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                   */
/* ------------------------------------------------------------------------ */

const char *zpp_data_kind_name(zpp_data_kind kind) {
    switch (kind) {
    case ZPP_DATA_LLMC: return "llm.c";
    case ZPP_DATA_RAW_TEXT: return "raw text";
    case ZPP_DATA_SYNTHETIC: return "synthetic";
    }
    return "unknown";
}

/* Opens `path` (a regular file: a FIFO is refused without blocking); an
 * empty file is refused (there is nothing to train on). */
static zpp_status open_file(zpp_data *d, const char *path) {
    struct stat sb;
    ZPP_CHECK(zpp_open_regular(path, "data", &d->fd, &sb));
    d->path = strdup(path);
    if (!d->path) return zpp_error(ZPP_ERR_NOMEM, "zpp_data_open: out of memory");
    if (sb.st_size == 0) return zpp_error(ZPP_ERR_FORMAT, "data '%s' is empty", path);
    d->file_len = (size_t)sb.st_size;
    return ZPP_OK;
}

/* The offset of the file's first NUL byte into *at_p (file_len when it
 * holds none), reading it in large chunks. */
static zpp_status find_nul(zpp_data *d, size_t *at_p) {
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf) return zpp_error(ZPP_ERR_NOMEM, "zpp_data_open: out of memory");
    zpp_status st = ZPP_OK;
    size_t at = d->file_len;
    for (size_t off = 0; off < d->file_len && st == ZPP_OK && at == d->file_len; off += CHUNK) {
        const size_t m = d->file_len - off < CHUNK ? d->file_len - off : CHUNK;
        st = pread_all(d, buf, m, off);
        const uint8_t *z = st == ZPP_OK ? memchr(buf, 0, m) : NULL;
        if (z) at = off + (size_t)(z - buf);
    }
    free(buf);
    if (st == ZPP_OK) *at_p = at;
    return st;
}

/* Recognises an llm.c token file and points d at its tokens, checking the
 * header, the size and every token against vocab_size. Returns ZPP_OK with
 * *is_llmc_p = 0 when the magic does not match and the file is text (then
 * it is raw text); a binary file with a wrong magic is an error. */
static zpp_status open_llmc(zpp_data *d, const char *path, int vocab_size, int *is_llmc_p) {
    const size_t header_bytes = 4 * ZPP_DATA_LLMC_HEADER_INTS;
    /* the first KiB: the header, and where text is told from binary */
    uint8_t b[1024];
    const size_t head = d->file_len < sizeof b ? d->file_len : sizeof b;
    ZPP_CHECK(pread_all(d, b, head, 0));
    *is_llmc_p = 0;
    if (d->file_len < 4 || le32(b) != ZPP_DATA_LLMC_MAGIC) {
        /* Not llm.c. Text never holds NUL bytes; a file that does anywhere
         * is binary (most likely a token file with a wrong or damaged
         * header) and reading it as text would train on garbage. */
        size_t nul = 0;
        ZPP_CHECK(find_nul(d, &nul));
        if (nul < d->file_len)
            return zpp_error(ZPP_ERR_FORMAT,
                             "data '%s' is not an llm.c token file (its magic is %u, expected "
                             "%d) and not text (it holds a NUL byte at offset %zu); check the "
                             "file",
                             path, d->file_len >= 4 ? (unsigned)le32(b) : 0u, ZPP_DATA_LLMC_MAGIC,
                             nul);
        return ZPP_OK;
    }
    *is_llmc_p = 1;
    if (d->file_len < header_bytes)
        return zpp_error(ZPP_ERR_FORMAT,
                         "data '%s' starts with the llm.c magic %d but has only %zu bytes, "
                         "less than the %zu-byte header: truncated",
                         path, ZPP_DATA_LLMC_MAGIC, d->file_len, header_bytes);
    uint32_t version = le32(b + 4);
    if (version != ZPP_DATA_LLMC_VERSION && version != ZPP_DATA_LLMC_VERSION_U32)
        return zpp_error(ZPP_ERR_FORMAT,
                         "data '%s': llm.c token file version %u is not supported; expected "
                         "version %d (uint16 GPT-2 tokens) or %d (uint32 tokens)",
                         path, version, ZPP_DATA_LLMC_VERSION, ZPP_DATA_LLMC_VERSION_U32);
    const size_t elem = version == ZPP_DATA_LLMC_VERSION_U32 ? 4 : 2;
    int32_t count = (int32_t)le32(b + 8);
    if (count < 0)
        return zpp_error(ZPP_ERR_FORMAT, "data '%s': llm.c header token count %d is negative",
                         path, (int)count);
    size_t want = header_bytes + elem * (size_t)count;
    if (d->file_len != want)
        return zpp_error(ZPP_ERR_FORMAT,
                         "data '%s': llm.c header says %d tokens (%zu bytes with the header) "
                         "but the file has %zu bytes: %s",
                         path, (int)count, want, d->file_len,
                         d->file_len < want ? "truncated" : "trailing bytes after the tokens");
    if (count == 0) return zpp_error(ZPP_ERR_FORMAT, "data '%s': llm.c file holds no tokens", path);
    d->kind = ZPP_DATA_LLMC;
    d->elem = (int)elem;
    d->tok_off = header_bytes;
    d->n = (size_t)count;
    /* One pass over the tokens, in chunks: a token past the embedding table
     * would index out of bounds in the model, so refuse it here with its
     * position. */
    enum { CHUNK = 1 << 19 }; /* tokens per read */
    uint8_t *buf = malloc(elem * (size_t)CHUNK);
    if (!buf) return zpp_error(ZPP_ERR_NOMEM, "zpp_data_open: out of memory");
    int32_t maxtok = 0;
    zpp_status st = ZPP_OK;
    for (size_t i0 = 0; i0 < d->n && st == ZPP_OK; i0 += CHUNK) {
        const size_t m = d->n - i0 < CHUNK ? d->n - i0 : CHUNK;
        st = pread_all(d, buf, elem * m, header_bytes + elem * i0);
        for (size_t i = 0; i < m && st == ZPP_OK; i++) {
            int32_t t = tok_at(buf, (int)elem, i);
            if (t < 0 || t >= vocab_size) /* (negative: a uint32 past INT32_MAX) */
                st = zpp_error(ZPP_ERR_CONFIG,
                               "data '%s': token %zu has value %u, not below model.vocab_size "
                               "%d; raise model.vocab_size (GPT-2 uses 50257) or check the "
                               "file",
                               path, i0 + i, (unsigned)t, vocab_size);
            if (t > maxtok) maxtok = t;
        }
    }
    free(buf);
    ZPP_CHECK(st);
    d->vocab = maxtok + 1;
    return ZPP_OK;
}

zpp_status zpp_data_open(const char *path, const zpp_train_config *cfg, zpp_data **data_p) {
    if (!cfg || !data_p) return zpp_error(ZPP_ERR_INVALID, "zpp_data_open: NULL argument");
    const int T = cfg->model.seq_len, vocab_size = cfg->model.vocab_size;
    const int micro = cfg->train_micro_batch_size_per_gpu,
              accum = cfg->gradient_accumulation_steps;
    if (T < 1 || vocab_size < 1)
        return zpp_error(ZPP_ERR_INVALID, "zpp_data_open: model.seq_len %d and "
                         "model.vocab_size %d must be >= 1", T, vocab_size);
    if (micro < 1 || accum < 1)
        return zpp_error(ZPP_ERR_INVALID,
                         "zpp_data_open: the batch geometry is not resolved (micro-batch %d, "
                         "accumulation %d); call zpp_train_config_resolve first",
                         micro, accum);
    const char *name = path ? path : "<synthetic>";
    zpp_status st = ZPP_OK;
    zpp_data *d = calloc(1, sizeof *d);
    if (!d) return zpp_error(ZPP_ERR_NOMEM, "zpp_data_open: out of memory");
    d->T = T;
    d->micro = micro;
    d->accum = accum;
    d->seed = cfg->seed;
    d->order = cfg->data_order;
    d->fd = -1;

    if (path) {
        ZPP_CHECK_GOTO(open_file(d, path), st, fail);
        int is_llmc;
        ZPP_CHECK_GOTO(open_llmc(d, path, vocab_size, &is_llmc), st, fail);
        if (!is_llmc) {
            if (vocab_size < 256) {
                st = zpp_error(ZPP_ERR_CONFIG,
                               "data '%s' is raw text (no llm.c header): its tokens are bytes "
                               "0..255, which needs model.vocab_size >= 256, not %d",
                               path, vocab_size);
                goto fail;
            }
            d->kind = ZPP_DATA_RAW_TEXT;
            d->elem = 1;
            d->tok_off = 0;
            d->n = d->file_len;
            d->vocab = 256;
        }
    } else {
        if (vocab_size < 128) {
            st = zpp_error(ZPP_ERR_CONFIG,
                           "the synthetic corpus is ASCII text, which needs model.vocab_size "
                           ">= 128, not %d",
                           vocab_size);
            goto fail;
        }
        d->owned = malloc(ZPP_DATA_SYNTH_TOKENS);
        if (!d->owned) {
            st = zpp_error(ZPP_ERR_NOMEM, "zpp_data_open: out of memory");
            goto fail;
        }
        synth_generate(d->owned, ZPP_DATA_SYNTH_TOKENS);
        d->kind = ZPP_DATA_SYNTHETIC;
        d->elem = 1;
        d->tok = d->owned;
        d->n = ZPP_DATA_SYNTH_TOKENS;
        d->vocab = 128;
    }

    /* Split: the last tenth (at least one sequence of T + 1 tokens) is held
     * out; the rest must also hold one sequence. */
    const size_t seq = (size_t)T + 1;
    d->n_val = d->n / 10 > seq ? d->n / 10 : seq;
    if (d->n < d->n_val + seq) {
        st = zpp_error(ZPP_ERR_CONFIG,
                       "data '%s' has %zu tokens, too few for one sequence of seq_len + 1 = "
                       "%zu tokens in both the training and the validation split (needs at "
                       "least %zu); use more data or a smaller model.seq_len",
                       name, d->n, seq, 2 * seq);
        goto fail;
    }
    d->n_train = d->n - d->n_val;
    d->K = (d->n_train - 1) / (size_t)T;
    d->slack = d->n_train - 1 - d->K * (size_t)T;
    d->K_val = (d->n_val - 1) / (size_t)T;
    /* A step reads train_batch_size distinct sequences in either order; a
     * training split with fewer would repeat some within one step. */
    if (cfg->train_batch_size > 0 && d->K < (size_t)cfg->train_batch_size) {
        st = zpp_error(ZPP_ERR_CONFIG,
                       "data '%s' holds %zu tokens; its training split (all but the held-out "
                       "tenth, %zu tokens) is shorter than one step, which reads "
                       "train_batch_size %d x seq_len %d + 1 = %zu tokens; use more data, a "
                       "smaller batch or a smaller model.seq_len",
                       name, d->n, d->n_train, cfg->train_batch_size, T,
                       (size_t)cfg->train_batch_size * (size_t)T + 1);
        goto fail;
    }
    *data_p = d;
    return ZPP_OK;
fail:
    zpp_data_close(d);
    return st;
}

void zpp_data_close(zpp_data *d) {
    if (!d) return;
    if (d->fd >= 0) close(d->fd);
    free(d->path);
    free(d->owned);
    free(d);
}

/* ------------------------------------------------------------------------ */
/* Batches                                                                   */
/* ------------------------------------------------------------------------ */

size_t zpp_data_sample_start(const zpp_data *d, uint64_t sample) {
    const uint64_t K = d->K, epoch = sample / K, i = sample % K;
    const uint64_t w = permute(i, K, feistel_key(d->seed, epoch, 1));
    const uint64_t off = feistel_key(d->seed, epoch, 2) % ((uint64_t)d->slack + 1);
    return (size_t)(off + w * (uint64_t)d->T);
}

/* The sequential order (data.h): step s reads block s mod E of G T tokens
 * (+1 for the last target), E = floor((n_train - 1) / (G T)) whole blocks
 * in the split; sequence j is tokens [j T, j T + T] of the block. */
static zpp_status sequential_start(const zpp_data *d, uint64_t step, uint64_t G, uint64_t j,
                                   size_t *start_p) {
    const uint64_t T = (uint64_t)d->T, rows = ((uint64_t)d->n_train - 1) / T;
    if (G > rows)
        return zpp_error(ZPP_ERR_CONFIG,
                         "sequential data order: a step of %llu sequences of %llu tokens needs "
                         "%llu tokens, but the training split holds %zu; use more data or a "
                         "smaller batch",
                         (unsigned long long)G, (unsigned long long)T,
                         (unsigned long long)(G * T + 1), d->n_train);
    const uint64_t E = rows / G; /* whole steps per pass over the split */
    *start_p = (size_t)(((step % E) * G + j) * T);
    return ZPP_OK;
}

zpp_status zpp_data_sequence(const zpp_data *d, uint64_t step, uint64_t global_batch,
                             uint64_t j, int32_t *tokens, int32_t *targets) {
    if (!d || !tokens || !targets)
        return zpp_error(ZPP_ERR_INVALID, "zpp_data_sequence: NULL argument");
    if (global_batch == 0 || j >= global_batch)
        return zpp_error(ZPP_ERR_INVALID,
                         "zpp_data_sequence: sequence %llu is outside the global batch of %llu",
                         (unsigned long long)j, (unsigned long long)global_batch);
    if (d->order == ZPP_DATA_ORDER_SEQUENTIAL) {
        size_t start = 0;
        ZPP_CHECK(sequential_start(d, step, global_batch, j, &start));
        return read_seq(d, start, tokens, targets);
    }
    if (step > (UINT64_MAX - j) / global_batch)
        return zpp_error(ZPP_ERR_INVALID, "zpp_data_sequence: step %llu overflows the sample "
                         "counter", (unsigned long long)step);
    return read_seq(d, zpp_data_sample_start(d, step * global_batch + j), tokens, targets);
}

zpp_status zpp_data_batch(const zpp_data *d, uint64_t step, int micro_step, int rank,
                          int world, int32_t *tokens, int32_t *targets) {
    if (!d || !tokens || !targets)
        return zpp_error(ZPP_ERR_INVALID, "zpp_data_batch: NULL argument");
    if (world < 1 || rank < 0 || rank >= world)
        return zpp_error(ZPP_ERR_INVALID, "zpp_data_batch: rank %d is outside world %d", rank,
                         world);
    if (micro_step < 0 || micro_step >= d->accum)
        return zpp_error(ZPP_ERR_INVALID,
                         "zpp_data_batch: micro-step %d is outside [0, %d) (gradient "
                         "accumulation steps)",
                         micro_step, d->accum);
    const uint64_t B = (uint64_t)d->micro;
    const uint64_t G = B * (uint64_t)d->accum * (uint64_t)world;
    /* Micro-step a covers the slice [a * B * world, (a + 1) * B * world) of
     * the global batch, and rank r the r-th B-long piece of that slice. */
    const uint64_t j0 = (uint64_t)micro_step * B * (uint64_t)world + (uint64_t)rank * B;
    for (uint64_t b = 0; b < B; b++)
        ZPP_CHECK(zpp_data_sequence(d, step, G, j0 + b, tokens + b * (uint64_t)d->T,
                                    targets + b * (uint64_t)d->T));
    return ZPP_OK;
}

/* Batch `index` of B fixed windows of T + 1 tokens: windows
 * (index * B + b) mod K, window w starting at base + w * T. */
static zpp_status window_batch(const zpp_data *d, size_t base, uint64_t K, uint64_t index, int B,
                               int32_t *tokens, int32_t *targets, const char *fn) {
    if (!d || !tokens || !targets) return zpp_error(ZPP_ERR_INVALID, "%s: NULL argument", fn);
    if (B < 1) return zpp_error(ZPP_ERR_INVALID, "%s: batch %d < 1", fn, B);
    /* (index * B + b) mod K, computed without overflowing index * B. */
    const uint64_t first = ((index % K) * ((uint64_t)B % K)) % K;
    for (int b = 0; b < B; b++) {
        const uint64_t w = (first + (uint64_t)b) % K;
        ZPP_CHECK(read_seq(d, base + (size_t)w * (size_t)d->T, tokens + (size_t)b * d->T,
                           targets + (size_t)b * d->T));
    }
    return ZPP_OK;
}

zpp_status zpp_data_val_batch(const zpp_data *d, uint64_t index, int B, int32_t *tokens,
                              int32_t *targets) {
    return window_batch(d, d ? d->n_train : 0, d ? d->K_val : 1, index, B, tokens, targets,
                        "zpp_data_val_batch");
}

zpp_status zpp_data_train_eval_batch(const zpp_data *d, uint64_t index, int B, int32_t *tokens,
                                     int32_t *targets) {
    return window_batch(d, 0, d ? d->K : 1, index, B, tokens, targets, "zpp_data_train_eval_batch");
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                   */
/* ------------------------------------------------------------------------ */

zpp_data_info zpp_data_info_get(const zpp_data *d) {
    zpp_data_info info = {
        .kind = d->kind,
        .n_tokens = d->n,
        .n_train = d->n_train,
        .n_val = d->n_val,
        .train_windows = d->K,
        .val_windows = d->K_val,
        .vocab = d->vocab,
        .seq_len = d->T,
        .micro_batch = d->micro,
        .accum = d->accum,
    };
    return info;
}

int32_t zpp_data_token(const zpp_data *d, size_t i) {
    if (i >= d->n) return -1;
    if (d->tok) return tok_at(d->tok, d->elem, i);
    uint8_t b[4];
    if (pread_all(d, b, (size_t)d->elem, d->tok_off + (size_t)d->elem * i) != ZPP_OK)
        return -1;
    return tok_at(b, d->elem, 0);
}
