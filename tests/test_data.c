/* test_data.c — token sources, the train/validation split and the
 * deterministic global batch (src/train/data.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "testlib.h"
#include "train/data.h"

#define EXPECT_MSG(sub)                                                        \
    EXPECT(strstr(zpp_last_error(), (sub)) != NULL, "message '%s' lacks '%s'", \
           zpp_last_error(), (sub))

static int irand(zpp_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(zpp_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* A resolved config: seq_len T, vocab, micro, accum, world 1 geometry. */
static zpp_train_config make_cfg(int T, int vocab, int micro, int accum, uint64_t seed) {
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.model.seq_len = T;
    cfg.model.vocab_size = vocab;
    cfg.train_micro_batch_size_per_gpu = micro;
    cfg.gradient_accumulation_steps = accum;
    cfg.seed = seed;
    EXPECT_OK(zpp_train_config_resolve(&cfg, 1));
    return cfg;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes an llm.c token file with a chosen header and `n_written` tokens
 * (little-endian on disk whatever the host). Returns the path. */
static const char *write_llmc(char *path, uint32_t magic, uint32_t version, int32_t count,
                              const uint16_t *tok, size_t n_written) {
    strcpy(path, "/tmp/zpp_test_data_XXXXXX");
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp: %s", strerror(errno));
    uint8_t header[1024] = {0};
    put32(header, magic);
    put32(header + 4, version);
    put32(header + 8, (uint32_t)count);
    EXPECT(write(fd, header, sizeof header) == (ssize_t)sizeof header);
    uint8_t *b = malloc(2 * n_written + 1);
    for (size_t i = 0; i < n_written; i++) {
        b[2 * i] = (uint8_t)tok[i];
        b[2 * i + 1] = (uint8_t)(tok[i] >> 8);
    }
    EXPECT(write(fd, b, 2 * n_written) == (ssize_t)(2 * n_written));
    free(b);
    close(fd);
    return path;
}

static const char *write_bytes(char *path, const void *data, size_t n) {
    strcpy(path, "/tmp/zpp_test_data_XXXXXX");
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp: %s", strerror(errno));
    if (n) EXPECT(write(fd, data, n) == (ssize_t)n);
    close(fd);
    return path;
}

/* An llm.c file whose token i is i itself (n <= 65536): any sequence read
 * back tells where in the file it came from (its first token). */
static const char *write_identity(char *path, size_t n) {
    uint16_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)i;
    write_llmc(path, ZPP_DATA_LLMC_MAGIC, 1, (int32_t)n, tok, n);
    free(tok);
    return path;
}

/* Checks one sequence of an identity file: consecutive positions, targets
 * one ahead of tokens; returns its start. */
static size_t identity_start(const int32_t *tokens, const int32_t *targets, int T) {
    for (int t = 0; t < T; t++) {
        EXPECT(tokens[t] == tokens[0] + t, "token %d: %d after start %d", t, tokens[t], tokens[0]);
        EXPECT(targets[t] == tokens[0] + t + 1);
    }
    return (size_t)tokens[0];
}

/* ------------------------------------------------------------------------ */

static void test_llmc_roundtrip(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    for (int trial = 0; trial < 4; trial++) {
        const int vocab = irand(&r, 300, 65536), T = irand(&r, 4, 64);
        const size_t n = (size_t)irand(&r, 10 * (T + 1), 50000); /* a step reads 6 sequences */
        uint16_t *tok = malloc(n * sizeof *tok);
        int maxtok = 0;
        for (size_t i = 0; i < n; i++) {
            tok[i] = (uint16_t)(zpp_rng_u64(&r) % (uint64_t)vocab);
            if (tok[i] > maxtok) maxtok = tok[i];
        }
        char path[64];
        write_llmc(path, ZPP_DATA_LLMC_MAGIC, 1, (int32_t)n, tok, n);
        zpp_train_config cfg = make_cfg(T, vocab, 3, 2, zpp_rng_u64(&r) >> 12);
        zpp_data *d;
        EXPECT_OK(zpp_data_open(path, &cfg, &d));
        unlink(path); /* the mapping stays valid */
        zpp_data_info info = zpp_data_info_get(d);
        EXPECT(info.kind == ZPP_DATA_LLMC && info.n_tokens == n);
        EXPECT(info.vocab == maxtok + 1);
        EXPECT(info.n_train + info.n_val == n && info.seq_len == T && info.micro_batch == 3 &&
               info.accum == 2);
        for (size_t i = 0; i < n; i++)
            EXPECT(zpp_data_token(d, i) == tok[i], "token %zu: %d != %d", i,
                   zpp_data_token(d, i), tok[i]);
        EXPECT(zpp_data_token(d, n) == -1);
        /* Batches hold the file's tokens at the sample's start. */
        int32_t x[3 * 64], y[3 * 64];
        for (uint64_t step = 0; step < 5; step++)
            for (int a = 0; a < 2; a++) {
                EXPECT_OK(zpp_data_batch(d, step, a, 0, 1, x, y));
                for (int b = 0; b < 3; b++) {
                    size_t p = zpp_data_sample_start(d, step * 6 + (uint64_t)(a * 3 + b));
                    EXPECT(p + (size_t)T < info.n_train);
                    for (int t = 0; t < T; t++)
                        EXPECT(x[b * T + t] == tok[p + t] && y[b * T + t] == tok[p + t + 1]);
                }
            }
        zpp_data_close(d);
        free(tok);
    }
}

static void test_llmc_bad_header(void) {
    zpp_train_config cfg = make_cfg(8, 50257, 2, 1, 1);
    uint16_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint16_t)(i * 7);
    char path[64];
    zpp_data *d = NULL;
    /* Right magic, wrong version (2 is uint32 tokens, test_tokfile_u32). */
    write_llmc(path, ZPP_DATA_LLMC_MAGIC, 3, 100, tok, 100);
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_FORMAT);
    EXPECT_MSG("version 3 is not supported; expected version 1");
    unlink(path);
    /* Header promises 100 tokens, file holds 97. */
    write_llmc(path, ZPP_DATA_LLMC_MAGIC, 1, 100, tok, 97);
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_FORMAT);
    EXPECT_MSG("header says 100 tokens (1224 bytes with the header) but the file has 1218 "
               "bytes: truncated");
    unlink(path);
    /* ... or more than it says. */
    write_llmc(path, ZPP_DATA_LLMC_MAGIC, 1, 90, tok, 100);
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_FORMAT);
    EXPECT_MSG("header says 90 tokens");
    EXPECT_MSG("trailing bytes");
    unlink(path);
    /* Magic, then the file ends inside the header. */
    uint8_t shortfile[100] = {0};
    put32(shortfile, ZPP_DATA_LLMC_MAGIC);
    write_bytes(path, shortfile, sizeof shortfile);
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_FORMAT);
    EXPECT_MSG("only 100 bytes, less than the 1024-byte header: truncated");
    unlink(path);
    EXPECT(d == NULL, "output set on failure");
}

/* A binary file whose first int32 is not the magic is a damaged token file,
 * an error naming the magic, wherever its first NUL byte is (the whole file
 * is read); a text file is raw text, bytes as tokens. */
static void test_wrong_magic(void) {
    uint16_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = (uint16_t)(i * 3);
    char path[64];
    write_llmc(path, ZPP_DATA_LLMC_MAGIC + 1, 1, 200, tok, 200);
    zpp_train_config cfg = make_cfg(8, 256, 2, 1, 1);
    zpp_data *d = NULL;
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_FORMAT);
    EXPECT(strstr(zpp_last_error(), "magic") != NULL, "message: %s", zpp_last_error());
    EXPECT(d == NULL);
    unlink(path);

    /* Text up to a NUL byte at a random offset past the first KiB, or
     * past the first MiB-long read: not text. */
    zpp_rng r = zpp_rng_make(zpp_test_seed(9));
    for (int trial = 0; trial < 2; trial++) {
        const size_t len = trial ? (3u << 20) : 5000;
        char *big = malloc(len);
        for (size_t i = 0; i < len; i++) big[i] = (char)('a' + i % 26);
        const size_t at = 1024 + zpp_rng_u64(&r) % (len - 1024);
        big[at] = '\0';
        strcpy(path, "/tmp/zpp_test_data_XXXXXX");
        int bfd = mkstemp(path);
        EXPECT(write(bfd, big, len) == (ssize_t)len);
        close(bfd);
        free(big);
        EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_FORMAT);
        char want[64];
        snprintf(want, sizeof want, "a NUL byte at offset %zu", at);
        EXPECT(strstr(zpp_last_error(), want) != NULL, "message: %s (want '%s')",
               zpp_last_error(), want);
        EXPECT(d == NULL);
        unlink(path);
    }

    /* Text whose first four bytes are anything: raw text. */
    strcpy(path, "/tmp/zpp_test_data_XXXXXX");
    int fd = mkstemp(path);
    char text[600];
    for (int i = 0; i < 600; i++) text[i] = (char)('a' + i % 26);
    EXPECT(write(fd, text, sizeof text) == (ssize_t)sizeof text);
    close(fd);
    EXPECT_OK(zpp_data_open(path, &cfg, &d));
    unlink(path);
    EXPECT(zpp_data_info_get(d).kind == ZPP_DATA_RAW_TEXT);
    EXPECT(zpp_data_info_get(d).n_tokens == 600 && zpp_data_info_get(d).vocab == 256);
    EXPECT(zpp_data_token(d, 27) == 'b');
    zpp_data_close(d);
}

static void test_token_out_of_vocab(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    const int vocab = irand(&r, 1000, 60000);
    const size_t n = 5000, bad = (size_t)irand(&r, 0, 4999);
    uint16_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = (uint16_t)(zpp_rng_u64(&r) % (uint64_t)vocab);
    const int badval = irand(&r, vocab, 65535);
    tok[bad] = (uint16_t)badval;
    if (bad + 1 < n) tok[bad + 1] = (uint16_t)vocab; /* only the first is named */
    char path[64];
    write_llmc(path, ZPP_DATA_LLMC_MAGIC, 1, (int32_t)n, tok, n);
    zpp_train_config cfg = make_cfg(16, vocab, 2, 1, 1);
    zpp_data *d = NULL;
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_CONFIG);
    char want[128];
    snprintf(want, sizeof want, "token %zu has value %d, not below model.vocab_size %d", bad,
             badval, vocab);
    EXPECT_MSG(want);
    /* vocab_size one above the largest token opens. */
    cfg.model.vocab_size = 65536;
    EXPECT_OK(zpp_data_open(path, &cfg, &d));
    EXPECT(zpp_data_info_get(d).vocab == (badval > vocab ? badval : vocab) + 1);
    zpp_data_close(d);
    unlink(path);
    free(tok);
}

static void test_raw_text(void) {
    char buf[4096];
    const char *path = zpp_test_data("tinyshakespeare.txt", buf, sizeof buf);
    zpp_train_config cfg = make_cfg(64, 256, 4, 1, 7);
    zpp_data *d = NULL;
    FILE *f = fopen(path, "rb");
    EXPECT(f != NULL);
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    rewind(f);
    uint8_t *text = malloc(size);
    EXPECT(fread(text, 1, size, f) == size);
    fclose(f);
    EXPECT_OK(zpp_data_open(path, &cfg, &d));
    zpp_data_info info = zpp_data_info_get(d);
    EXPECT(info.kind == ZPP_DATA_RAW_TEXT && info.n_tokens == size && info.vocab == 256);
    /* The split: the last tenth held out. */
    EXPECT(info.n_val == size / 10 && info.n_train == size - size / 10);
    for (size_t i = 0; i < size; i++) EXPECT(zpp_data_token(d, i) == text[i]);
    int32_t x[4 * 64], y[4 * 64];
    EXPECT_OK(zpp_data_batch(d, 3, 0, 0, 1, x, y));
    size_t p = zpp_data_sample_start(d, 3 * 4);
    for (int t = 0; t < 64; t++) EXPECT(x[t] == text[p + t] && y[t] == text[p + t + 1]);
    zpp_data_close(d);
    /* Bytes need a 256-entry vocabulary. */
    cfg.model.vocab_size = 255;
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_CONFIG);
    EXPECT_MSG("raw text");
    EXPECT_MSG("model.vocab_size >= 256, not 255");
    free(text);
    /* An empty file, a missing file. */
    char tmp[64];
    cfg.model.vocab_size = 256;
    write_bytes(tmp, "", 0);
    EXPECT_STATUS(zpp_data_open(tmp, &cfg, &d), ZPP_ERR_FORMAT);
    EXPECT_MSG("is empty");
    unlink(tmp);
    EXPECT_STATUS(zpp_data_open("/nonexistent-zpp/data.bin", &cfg, &d), ZPP_ERR_IO);
    EXPECT_MSG("/nonexistent-zpp/data.bin");
    EXPECT_MSG(strerror(ENOENT));
}

/* Entropy of a distribution given as counts (nats). */
static double entropy(const double *count, int n) {
    double tot = 0, h = 0;
    for (int i = 0; i < n; i++) tot += count[i];
    for (int i = 0; i < n; i++)
        if (count[i] > 0) h -= count[i] / tot * log(count[i] / tot);
    return h;
}

static void test_synthetic(void) {
    zpp_train_config c1 = make_cfg(64, 256, 4, 1, 1), c2 = make_cfg(32, 128, 2, 3, 99);
    zpp_data *d1, *d2;
    EXPECT_OK(zpp_data_open(NULL, &c1, &d1));
    EXPECT_OK(zpp_data_open(NULL, &c2, &d2));
    const size_t n = zpp_data_info_get(d1).n_tokens;
    EXPECT(n >= 200000 && n == ZPP_DATA_SYNTH_TOKENS && zpp_data_info_get(d2).n_tokens == n);
    EXPECT(zpp_data_info_get(d1).kind == ZPP_DATA_SYNTHETIC && zpp_data_info_get(d1).vocab == 128);
    /* The same text whatever the config; only a fixed alphabet of 29. */
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz .\n";
    int idx[128];
    for (int i = 0; i < 128; i++) idx[i] = -1;
    for (int i = 0; i < 29; i++) idx[(unsigned char)alphabet[i]] = i;
    int *s = malloc(n * sizeof *s);
    for (size_t i = 0; i < n; i++) {
        int32_t t = zpp_data_token(d1, i);
        EXPECT(t == zpp_data_token(d2, i), "token %zu differs between opens", i);
        EXPECT(t >= 0 && t < 128 && idx[t] >= 0, "token %zu = %d outside the alphabet", i, t);
        s[i] = idx[t];
    }
    /* Learnable: a model that predicts each token from the 3 before it,
     * fitted on the first 90% (counts with add-0.1 smoothing) and scored on
     * the last 10%, reaches a cross-entropy well under the unigram entropy,
     * which is itself well under ln(256) = 5.55 (what an untrained GPT-2
     * over bytes starts at). Held-out scoring avoids the plug-in
     * estimator's optimism; smoothing keeps unseen contexts finite. The
     * corpus's construction (see data.c) puts its entropy rate near 0.3
     * nats/token, and a 3-token context pins down most letters of a word. */
    const int A = 29, C = A * A * A;
    double uni[29] = {0};
    float *cnt = calloc((size_t)C * A, sizeof *cnt);
    const size_t cut = n - n / 10;
    for (size_t i = 0; i < cut; i++) uni[s[i]] += 1;
    for (size_t i = 3; i < cut; i++) cnt[(size_t)((s[i - 3] * A + s[i - 2]) * A + s[i - 1]) * A + s[i]] += 1;
    double xent = 0;
    for (size_t i = cut; i < n; i++) {
        const float *row = cnt + (size_t)((s[i - 3] * A + s[i - 2]) * A + s[i - 1]) * A;
        double tot = 0;
        for (int k = 0; k < A; k++) tot += row[k];
        xent -= log((row[s[i]] + 0.1) / (tot + 0.1 * A));
    }
    xent /= (double)(n - cut);
    const double h1 = entropy(uni, A);
    printf("synthetic: unigram entropy %.3f nats, held-out 3-gram cross-entropy %.3f nats, "
           "ln(256) = %.3f\n", h1, xent, log(256.0));
    EXPECT(h1 < log(29.0) && h1 < 0.6 * log(256.0), "unigram entropy %g", h1);
    EXPECT(h1 > 2.0, "unigram entropy %g: too little variety to be interesting", h1);
    EXPECT(xent < 1.0 && xent < 0.4 * h1, "3-gram cross-entropy %g vs unigram %g", xent, h1);
    free(cnt);
    free(s);
    zpp_data_close(d1);
    zpp_data_close(d2);
    /* ASCII needs vocab >= 128. */
    zpp_data *d = NULL;
    c1.model.vocab_size = 100;
    EXPECT_STATUS(zpp_data_open(NULL, &c1, &d), ZPP_ERR_CONFIG);
    EXPECT_MSG("vocab_size >= 128, not 100");
}

/* The sequences of a step form the same global batch whatever the split
 * into ranks x micro-batches x accumulation steps. Sequence j of the step is
 * placed at j = a * (micro * world) + r * micro + b, and every geometry must
 * produce the same ordered global batch, equal to zpp_data_sequence(j). */
static void test_global_batch_invariance(void) {
    static const int geo[][3] = {{1, 8, 1}, {2, 4, 1}, {4, 2, 1}, {2, 2, 2}, {1, 1, 8}};
    const int ngeo = (int)(sizeof geo / sizeof geo[0]), G = 8;
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    const int T = irand(&r, 4, 48);
    const uint64_t seed = zpp_rng_u64(&r) >> 12;
    char path[64];
    const size_t n = (size_t)irand(&r, 20 * (T + 1), 65536);
    write_identity(path, n);
    int32_t *ref = malloc((size_t)G * T * sizeof *ref), *got = malloc((size_t)G * T * sizeof *got);
    int32_t *x = malloc((size_t)G * T * sizeof *x), *y = malloc((size_t)G * T * sizeof *y);
    uint64_t steps[4] = {0, 1, 1 + zpp_rng_u64(&r) % 1000, zpp_rng_u64(&r) % (1ull << 40)};
    for (int si = 0; si < 4; si++) {
        const uint64_t step = steps[si];
        for (int g = 0; g < ngeo; g++) {
            const int world = geo[g][0], micro = geo[g][1], accum = geo[g][2];
            zpp_train_config cfg = make_cfg(T, 65536, micro, accum, seed);
            zpp_data *d;
            EXPECT_OK(zpp_data_open(path, &cfg, &d));
            const size_t n_train = zpp_data_info_get(d).n_train;
            int filled[8] = {0};
            for (int a = 0; a < accum; a++)
                for (int rank = 0; rank < world; rank++) {
                    EXPECT_OK(zpp_data_batch(d, step, a, rank, world, x, y));
                    for (int b = 0; b < micro; b++) {
                        int j = a * micro * world + rank * micro + b;
                        EXPECT(j < G && !filled[j]);
                        filled[j] = 1;
                        /* Each row: a window of the training split. */
                        size_t p = identity_start(x + b * T, y + b * T, T);
                        EXPECT(p + (size_t)T < n_train, "window %zu..%zu past the split %zu", p,
                               p + T, n_train);
                        memcpy(got + j * T, x + b * T, (size_t)T * sizeof *x);
                    }
                }
            /* Reference: the geometry-free accessor. */
            for (int j = 0; j < G; j++) {
                EXPECT_OK(zpp_data_sequence(d, step, G, (uint64_t)j, x, y));
                if (g == 0) memcpy(ref + j * T, x, (size_t)T * sizeof *x);
                EXPECT(memcmp(x, got + j * T, (size_t)T * sizeof *x) == 0,
                       "geometry %d: sequence %d differs from zpp_data_sequence", g, j);
            }
            EXPECT(memcmp(ref, got, (size_t)G * T * sizeof *ref) == 0,
                   "step %llu: world %d x micro %d x accum %d sees another global batch",
                   (unsigned long long)step, world, micro, accum);
            /* Argument checks. */
            EXPECT_STATUS(zpp_data_batch(d, step, accum, 0, world, x, y), ZPP_ERR_INVALID);
            EXPECT_STATUS(zpp_data_batch(d, step, 0, world, world, x, y), ZPP_ERR_INVALID);
            zpp_data_close(d);
        }
    }
    /* A different seed gives a different order. */
    zpp_train_config c1 = make_cfg(T, 65536, 8, 1, seed), c2 = make_cfg(T, 65536, 8, 1, seed + 1);
    zpp_data *d1, *d2;
    EXPECT_OK(zpp_data_open(path, &c1, &d1));
    EXPECT_OK(zpp_data_open(path, &c2, &d2));
    int same = 0;
    for (uint64_t i = 0; i < 64; i++)
        same += zpp_data_sample_start(d1, i) == zpp_data_sample_start(d2, i);
    /* Each of the K >= 18 windows matches by chance with probability ~1/K. */
    EXPECT(same < 32, "%d of 64 samples coincide across seeds", same);
    zpp_data_close(d1);
    zpp_data_close(d2);
    unlink(path);
    free(ref);
    free(got);
    free(x);
    free(y);
}

/* Each epoch visits each of the K windows exactly once, all on one grid of
 * stride T inside the training split; epochs are shuffled differently. */
static void test_epochs_are_permutations(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(4));
    for (int trial = 0; trial < 6; trial++) {
        const int T = irand(&r, 1, 40);
        const size_t n = (size_t)irand(&r, 2 * (T + 1), 65536);
        char path[64];
        write_identity(path, n);
        zpp_train_config cfg = make_cfg(T, 65536, 1, 1, zpp_rng_u64(&r) >> 12);
        zpp_data *d;
        EXPECT_OK(zpp_data_open(path, &cfg, &d));
        unlink(path);
        zpp_data_info info = zpp_data_info_get(d);
        const size_t K = info.train_windows;
        EXPECT(K == (info.n_train - 1) / (size_t)T && K >= 1);
        uint8_t *seen = calloc(K, 1);
        int differs = 0;
        for (uint64_t e = 0; e < 3; e++) {
            memset(seen, 0, K);
            const size_t off = zpp_data_sample_start(d, e * K) % (size_t)T;
            for (size_t i = 0; i < K; i++) {
                size_t p = zpp_data_sample_start(d, e * K + i);
                const size_t phase = p % (size_t)T; /* (no '%' inside EXPECT's text) */
                EXPECT(phase == off && p + (size_t)T <= info.n_train - 1);
                size_t k = (p - off) / (size_t)T;
                EXPECT(k < K && !seen[k], "epoch %llu: window %zu twice", (unsigned long long)e, k);
                seen[k] = 1;
                if (e == 1) differs |= p != zpp_data_sample_start(d, i);
            }
        }
        if (K >= 10) EXPECT(differs, "epochs 0 and 1 have the same order (K = %zu)", K);
        free(seen);
        zpp_data_close(d);
    }
}

/* Validation batches come from the held-out tail only; training batches
 * never touch it. */
static void test_validation_split(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(5));
    for (int trial = 0; trial < 4; trial++) {
        const int T = irand(&r, 2, 64);
        const size_t n = (size_t)irand(&r, 4 * (T + 1), 65536); /* a step reads 2 */
        char path[64];
        write_identity(path, n);
        zpp_train_config cfg = make_cfg(T, 65536, 2, 1, zpp_rng_u64(&r) >> 12);
        zpp_data *d;
        EXPECT_OK(zpp_data_open(path, &cfg, &d));
        unlink(path);
        zpp_data_info info = zpp_data_info_get(d);
        const size_t want_val = n / 10 > (size_t)T + 1 ? n / 10 : (size_t)T + 1;
        EXPECT(info.n_val == want_val && info.n_train == n - want_val);
        EXPECT(info.val_windows == (info.n_val - 1) / (size_t)T && info.val_windows >= 1);
        const int B = irand(&r, 1, 7);
        int32_t *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
        uint8_t *seen = calloc(info.val_windows, 1);
        size_t distinct = 0;
        for (uint64_t idx = 0; idx < 40; idx++) {
            EXPECT_OK(zpp_data_val_batch(d, idx, B, x, y));
            for (int b = 0; b < B; b++) {
                size_t p = identity_start(x + b * T, y + b * T, T);
                EXPECT(p >= info.n_train && p + (size_t)T < n, "val window at %zu", p);
                const size_t phase = (p - info.n_train) % (size_t)T;
                EXPECT(phase == 0);
                size_t w = (p - info.n_train) / (size_t)T;
                distinct += !seen[w];
                seen[w] = 1;
            }
        }
        /* Consecutive batches walk through the tail: 40 B rows cover
         * min(40 B, K_val) distinct windows. */
        EXPECT(distinct == (40 * (size_t)B < info.val_windows ? 40 * (size_t)B : info.val_windows));
        /* Deterministic. */
        int32_t *x2 = malloc((size_t)B * T * sizeof *x2), *y2 = malloc((size_t)B * T * sizeof *y2);
        EXPECT_OK(zpp_data_val_batch(d, 7, B, x, y));
        EXPECT_OK(zpp_data_val_batch(d, 7, B, x2, y2));
        EXPECT(memcmp(x, x2, (size_t)B * T * sizeof *x) == 0);
        /* Training samples, across several epochs, stay out of the tail. */
        for (uint64_t i = 0; i < 3 * info.train_windows + 50; i++)
            EXPECT(zpp_data_sample_start(d, i) + (size_t)T < info.n_train);
        free(x);
        free(y);
        free(x2);
        free(y2);
        free(seen);
        zpp_data_close(d);
    }
}

/* Exactly 2 (T + 1) tokens is the smallest data set: one sequence per
 * split. One token less is refused with the sizes. */
static void test_too_small(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(6));
    const int T = irand(&r, 1, 500);
    char path[64];
    zpp_train_config cfg = make_cfg(T, 65536, 1, 1, 3);
    zpp_data *d = NULL;
    write_identity(path, 2 * (size_t)(T + 1));
    EXPECT_OK(zpp_data_open(path, &cfg, &d));
    unlink(path);
    zpp_data_info info = zpp_data_info_get(d);
    EXPECT(info.n_train == (size_t)T + 1 && info.n_val == (size_t)T + 1 &&
           info.train_windows == 1 && info.val_windows == 1);
    int32_t *x = malloc((size_t)T * sizeof *x), *y = malloc((size_t)T * sizeof *y);
    EXPECT_OK(zpp_data_batch(d, 12345, 0, 0, 1, x, y));
    EXPECT(identity_start(x, y, T) == 0);
    EXPECT_OK(zpp_data_val_batch(d, 77, 1, x, y));
    EXPECT(identity_start(x, y, T) == (size_t)T + 1);
    zpp_data_close(d);
    free(x);
    free(y);
    d = NULL;
    write_identity(path, 2 * (size_t)(T + 1) - 1);
    EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_CONFIG);
    unlink(path);
    char want[160];
    snprintf(want, sizeof want, "has %d tokens, too few for one sequence of seq_len + 1 = %d "
             "tokens", 2 * (T + 1) - 1, T + 1);
    EXPECT_MSG(want);
    snprintf(want, sizeof want, "needs at least %d", 2 * (T + 1));
    EXPECT_MSG(want);
    EXPECT(d == NULL);
    /* An unresolved config is refused. */
    zpp_train_config raw;
    EXPECT_OK(zpp_train_config_defaults(&raw));
    EXPECT_STATUS(zpp_data_open(NULL, &raw, &d), ZPP_ERR_INVALID);
    EXPECT_MSG("zpp_train_config_resolve");
}

/* The sequential order (data.h), on an identity file (token i is i), so a
 * row read back says where it starts. Written out from the definition:
 * with G = micro * accum * world sequences a step and E = floor((n_train
 * - 1) / (G T)) whole steps in the split, rank r at micro-step a of step s
 * reads, as its row b, the T + 1 tokens from
 *     ((s mod E) G + (a world + r) micro + b) T
 * (llm.c's convention: the ranks side by side within a micro-step). Every
 * rank, micro-step and row of 3 passes and then some, on random geometries
 * (world, micro, accum, T, and a tail of the split no whole step fits);
 * every token read lies in the training split; and the step's rows are the
 * same tokens whatever the cut of G into world x micro x accum. */
static zpp_train_config sequential_cfg(int T, int micro, int accum, int world) {
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.model.seq_len = T;
    cfg.model.vocab_size = 65536;
    cfg.train_micro_batch_size_per_gpu = micro;
    cfg.gradient_accumulation_steps = accum;
    cfg.data_order = ZPP_DATA_ORDER_SEQUENTIAL;
    EXPECT_OK(zpp_train_config_resolve(&cfg, world));
    return cfg;
}

static void test_sequential_order(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(11));
    for (int trial = 0; trial < 12; trial++) {
        const int T = irand(&r, 1, 24), micro = irand(&r, 1, 4), accum = irand(&r, 1, 3),
                  world = irand(&r, 1, 5);
        const size_t G = (size_t)micro * accum * world;
        const int E_want = irand(&r, 1, 6); /* whole steps in the split */
        const size_t tail = (size_t)irand(&r, 0, (int)(G * T) - 1);
        /* n_train = E G T + 1 + tail; n = n_train + n_val with n_val =
         * max(floor(n / 10), T + 1): solve for n by stepping up */
        const size_t n_train_want = (size_t)E_want * G * T + 1 + tail;
        size_t n = n_train_want + T + 1;
        while (n - (n / 10 > (size_t)T + 1 ? n / 10 : (size_t)T + 1) < n_train_want) n++;
        char path[64];
        write_identity(path, n);
        zpp_train_config cfg = sequential_cfg(T, micro, accum, world);
        cfg.seed = zpp_rng_u64(&r) >> 11; /* plays no part */
        zpp_data *d = NULL;
        EXPECT_OK(zpp_data_open(path, &cfg, &d));
        const zpp_data_info info = zpp_data_info_get(d);
        const size_t E = (info.n_train - 1) / (G * T);
        EXPECT(E >= (size_t)E_want && E <= (size_t)E_want + 1, "E %zu, wanted %d", E, E_want);
        int32_t *x = malloc((size_t)micro * T * sizeof *x), *y = malloc((size_t)micro * T * sizeof *y);
        size_t *starts = malloc(G * sizeof *starts);
        const uint64_t steps = 3 * E + 2;
        for (uint64_t st = 0; st < steps; st++) {
            for (int a = 0; a < accum; a++)
                for (int rk = 0; rk < world; rk++) {
                    EXPECT_OK(zpp_data_batch(d, st, a, rk, world, x, y));
                    for (int b = 0; b < micro; b++) {
                        const size_t got = identity_start(x + (size_t)b * T, y + (size_t)b * T, T);
                        const size_t row = ((size_t)a * world + rk) * micro + b;
                        const size_t want = ((st % E) * G + row) * T;
                        EXPECT(got == want,
                               "T %d micro %d accum %d world %d: step %llu micro-step %d rank %d "
                               "row %d starts at %zu, expected %zu",
                               T, micro, accum, world, (unsigned long long)st, a, rk, b, got, want);
                        EXPECT(got + T < info.n_train, "read past the training split");
                        starts[row] = got;
                    }
                }
            /* before the first wrap: step s is tokens [s G T, (s + 1) G T] */
            if (st < E)
                for (size_t j = 0; j < G; j++) EXPECT(starts[j] == (st * G + j) * T);
            /* the same step, cut as one rank with all G sequences in one micro-batch */
            zpp_train_config one = sequential_cfg(T, (int)G, 1, 1);
            zpp_data *d1 = NULL;
            EXPECT_OK(zpp_data_open(path, &one, &d1));
            int32_t *x1 = malloc(G * T * sizeof *x1), *y1 = malloc(G * T * sizeof *y1);
            EXPECT_OK(zpp_data_batch(d1, st, 0, 0, 1, x1, y1));
            for (size_t j = 0; j < G; j++)
                EXPECT((size_t)x1[j * T] == starts[j], "1 x %zu cut differs at row %zu", G, j);
            free(x1), free(y1);
            zpp_data_close(d1);
        }
        free(x), free(y), free(starts);
        zpp_data_close(d);
        unlink(path);
    }
    /* A split that holds no whole step is refused at open (the config's
     * batch), in either order, naming the sizes, and at a batch of a larger
     * world. */
    char path[64];
    write_identity(path, 100); /* n_val 10, n_train 90 */
    zpp_train_config cfg = sequential_cfg(8, 12, 1, 1); /* 12 x 8 + 1 = 97 > 89 */
    zpp_data *d = NULL;
    for (int order = 0; order < 2; order++) {
        cfg.data_order = order ? ZPP_DATA_ORDER_SEQUENTIAL : ZPP_DATA_ORDER_SHUFFLED;
        EXPECT_STATUS(zpp_data_open(path, &cfg, &d), ZPP_ERR_CONFIG);
        EXPECT_MSG("holds 100 tokens; its training split (all but the held-out tenth, 90 "
                   "tokens) is shorter than one step, which reads train_batch_size 12 x seq_len "
                   "8 + 1 = 97 tokens");
        EXPECT(d == NULL);
    }
    cfg.data_order = ZPP_DATA_ORDER_SEQUENTIAL;
    cfg = sequential_cfg(8, 5, 1, 1); /* 41 tokens: fits */
    EXPECT_OK(zpp_data_open(path, &cfg, &d));
    int32_t x[40], y[40];
    EXPECT_OK(zpp_data_batch(d, 7, 0, 1, 2, x, y)); /* 2 x 5 x 8 + 1 = 81: fits */
    EXPECT_STATUS(zpp_data_batch(d, 0, 0, 2, 3, x, y), ZPP_ERR_CONFIG); /* 121 */
    EXPECT_MSG("the training split holds 90");
    zpp_data_close(d);
    unlink(path);
}

ZPP_TESTS(
    ZPP_TEST(test_sequential_order),
    ZPP_TEST(test_llmc_roundtrip),
    ZPP_TEST(test_llmc_bad_header),
    ZPP_TEST(test_wrong_magic),
    ZPP_TEST(test_token_out_of_vocab),
    ZPP_TEST(test_raw_text),
    ZPP_TEST(test_synthetic),
    ZPP_TEST(test_global_batch_invariance),
    ZPP_TEST(test_epochs_are_permutations),
    ZPP_TEST(test_validation_split),
    ZPP_TEST(test_too_small),
)
