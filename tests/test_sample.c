/* test_sample.c — text from a model (src/train/sample.c, `zeropp sample`,
 * `zeropp train --sample-every`).
 *
 * The draw (zpp_sample_pick) against its definition in sample.h: greedy is
 * the argmax, top-k never leaves the k largest, and with a temperature the
 * frequencies of many draws are the softmax's within a bound from the
 * binomial standard deviation; the random stream is a function of the seed
 * alone. The generation loop against a toy model whose next token is a known
 * function of the window it is shown. Then the command as a user runs it:
 * a tiny 2-rank CPU training run saves a sharded checkpoint and logs its
 * samples; `zeropp sample` from that checkpoint is deterministic for a seed,
 * equals the trainer's sample (the engine's exact gathers over 2 ranks
 * against the checkpoint put together on one), and equals the same weights
 * saved by 1 rank and read from an llm.c file; bad inputs fail with a line
 * that says what to do. A BPE model (the tokenizer in tests/data/
 * shakespeare-bpe): `zeropp tokenize` notes its tokenizer, the trainer's
 * samples and `zeropp sample` print text in it, exactly the tokenizer's
 * decoding of the ids drawn, and encode the prompt with it. A Llama the
 * same way (its sample the trainer's; each token the draw from a direct
 * forward's logits; eval the run's validation loss; a tokenizer.json end to
 * end). (The logits a sample reads are checked in test_gpt2.c and
 * test_gpt2_cuda.c.)
 *
 * ZPP_CLI (the zeropp command) and ZPP_MPIEXEC (mpirun) come from ctest. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/error.h"
#include "core/random.h"
#include "device/device.h"
#include "model/family.h"
#include "model/llama.h"
#include "train/bpe.h"
#include "train/sample.h"
#include "train/tokfile.h"
#include "testlib.h"

/* ---- The draw ----------------------------------------------------------------- */

static void random_logits(zpp_rng *r, float *l, int V, double scale, int ties) {
    for (int i = 0; i < V; i++) {
        double x = scale * zpp_rng_normal(r);
        /* ties: few distinct values, so equal logits are common */
        l[i] = (float)(ties ? round(x) : x);
    }
}

/* temperature 0: the largest logit, the lowest index among equals, for any
 * top-k and any u */
static void test_greedy_is_argmax(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    float l[300];
    for (int trial = 0; trial < 200; trial++) {
        int V = 1 + (int)(zpp_rng_u64(&r) % 300);
        random_logits(&r, l, V, 3.0, trial % 2);
        int want = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[want]) want = i;
        zpp_sample_opts o = {0.0, (int)(zpp_rng_u64(&r) % (uint64_t)(V + 1)), zpp_rng_u64(&r)};
        int got = -1;
        EXPECT_OK(zpp_sample_pick(l, V, &o, zpp_rng_uniform(&r), &got));
        EXPECT(got == want, "V %d top-k %d: greedy drew %d (logit %g), the argmax is %d (%g)", V,
               o.top_k, got, l[got], want, l[want]);
    }
}

/* The k largest by (logit, then lower index), found by counting: token i is
 * among them when fewer than k tokens beat it. */
static int in_top_k(const float *l, int V, int k, int i) {
    int better = 0;
    for (int j = 0; j < V; j++) better += l[j] > l[i] || (l[j] == l[i] && j < i);
    return better < k;
}

/* Top-k never draws outside the k largest (ties included: integer logits),
 * and at a high temperature draws every one of them (the check has teeth:
 * the draws cover the whole set, not one favourite). */
static void test_top_k_stays_in_top(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    float l[64];
    for (int trial = 0; trial < 40; trial++) {
        const int V = 2 + (int)(zpp_rng_u64(&r) % 63);
        const int k = 1 + (int)(zpp_rng_u64(&r) % (uint64_t)(V - 1));
        random_logits(&r, l, V, 2.0, trial % 2);
        zpp_sample_opts o = {trial % 3 ? 1.0 : 50.0, k, 0};
        int seen[64] = {0};
        for (int d = 0; d < 2000; d++) {
            int tok = -1;
            EXPECT_OK(zpp_sample_pick(l, V, &o, zpp_rng_uniform(&r), &tok));
            EXPECT(tok >= 0 && tok < V && in_top_k(l, V, k, tok),
                   "V %d top-k %d: drew token %d (logit %g), not among the %d largest", V, k, tok,
                   l[tok], k);
            seen[tok] = 1;
        }
        if (o.temperature == 50.0) { /* nearly uniform over k: each ~2000/k >= 32 times */
            int covered = 0;
            for (int i = 0; i < V; i++) covered += seen[i];
            EXPECT(covered == k, "V %d top-k %d: %d distinct tokens drawn", V, k, covered);
        }
    }
}

/* Frequencies against the softmax. Each token's count over n independent
 * draws is binomial(n, p_i): mean n p_i, standard deviation
 * sqrt(n p_i (1 - p_i)). The bound is 5 of those (a false alarm about once
 * in 1.7 million per token), plus one draw for rounding. With n = 200000 it
 * is ~0.5% of p for p ~ 0.5 and catches a probability off by 2% of itself
 * (a temperature applied twice, a wrong renormalisation under top-k, an
 * off-by-one in the inverse CDF move p by far more). The draws use the
 * library's own stream, u_k of one seed, so the stream's uniformity is
 * tested too. Cases: temperature 1 over all tokens (the model's
 * distribution), temperature 0.6 with top-k 5 (p over the top 5 only). */
static void check_frequencies(double t, int top_k, uint64_t stream) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(stream));
    enum { V = 9, N = 200000 };
    float l[V];
    random_logits(&r, l, V, 1.5, 0);
    double p[V], total = 0, mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) {
        p[i] = top_k && !in_top_k(l, V, top_k, i) ? 0.0 : exp((l[i] - mx) / t);
        total += p[i];
    }
    zpp_sample_opts o = {t, top_k, zpp_rng_u64(&r)};
    long count[V] = {0};
    for (int k = 0; k < N; k++) {
        int tok = -1;
        EXPECT_OK(zpp_sample_pick(l, V, &o, zpp_sample_uniform(o.seed, (uint64_t)k), &tok));
        count[tok]++;
    }
    double worst = 0;
    for (int i = 0; i < V; i++) {
        const double pi = p[i] / total, sd = sqrt(N * pi * (1 - pi));
        const double dev = fabs((double)count[i] - N * pi);
        EXPECT(dev <= 5 * sd + 1, "t %g top-k %d: token %d drawn %ld times of %d, expected %.1f "
               "(p %.5f, sd %.1f)", t, top_k, i, count[i], N, N * pi, pi, sd);
        if (pi == 0) EXPECT(count[i] == 0, "token %d outside the top %d was drawn", i, top_k);
        if (sd > 0) worst = fmax(worst, dev / sd);
    }
    printf("  t %.1f top-k %d: %d draws, worst deviation %.2f standard deviations\n", t, top_k,
           N, worst);
}

static void test_frequencies_match_softmax(void) {
    check_frequencies(1.0, 0, 3);
    check_frequencies(0.6, 5, 4);
}

/* The stream: u_k a function of (seed, k) only, in [0, 1); another seed,
 * other draws. */
static void test_stream_is_the_seeds(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(5));
    uint64_t seed = zpp_rng_u64(&r);
    int differ = 0;
    for (uint64_t k = 0; k < 1000; k++) {
        double u = zpp_sample_uniform(seed, k);
        EXPECT(u >= 0 && u < 1, "u_%llu = %g", (unsigned long long)k, u);
        EXPECT(u == zpp_sample_uniform(seed, k), "u_%llu changed", (unsigned long long)k);
        differ += u != zpp_sample_uniform(seed + 1, k);
    }
    EXPECT(differ >= 999, "seeds %llu and +1 share %d of 1000 draws",
           (unsigned long long)seed, 1000 - differ);
}

/* ---- The generation loop, on a toy model ---------------------------------------- */

/* A model of T = 5 positions and V = 11 tokens whose logits peak at
 * (sum of the window's n tokens + n) mod V, and which checks that the
 * padding after them is zeros. The expected sequence follows from the
 * definition of the window (sample.h) written out separately below. */
typedef struct toy {
    int calls;
} toy;

static zpp_status toy_logits(void *ctx, const int32_t *w, int n, float *out) {
    ((toy *)ctx)->calls++;
    int s = n;
    for (int i = 0; i < n; i++) s += w[i];
    for (int i = n; i < 5; i++) EXPECT(w[i] == 0, "padding position %d holds %d", i, (int)w[i]);
    for (int v = 0; v < 11; v++) out[v] = v == s % 11 ? 3.0f : 0.0f;
    out[11] = 100.0f; /* a padded column: never a candidate */
    return ZPP_OK;
}

typedef struct emitted {
    int32_t tok[64];
    int n;
} emitted;

static zpp_status record(void *ctx, int32_t t) {
    emitted *e = ctx;
    e->tok[e->n++] = t;
    return ZPP_OK;
}

static void test_generation_window(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(6));
    toy ty = {0};
    zpp_sample_source src = {5, 12, 11, toy_logits, &ty};
    for (int trial = 0; trial < 20; trial++) {
        int np = 1 + (int)(zpp_rng_u64(&r) % 8), nn = (int)(zpp_rng_u64(&r) % 12);
        int32_t seq[32], out[32];
        for (int i = 0; i < np; i++) seq[i] = (int32_t)(zpp_rng_u64(&r) % 11);
        /* the window of T = 5: the last min(n, 5) tokens */
        for (int k = 0; k < nn; k++) {
            int n = np + k, w = n < 5 ? n : 5, s = w;
            for (int i = n - w; i < n; i++) s += seq[i];
            seq[n] = s % 11;
        }
        emitted e = {{0}, 0};
        zpp_sample_opts o = {0.0, 0, 1};
        ty.calls = 0;
        EXPECT_OK(zpp_sample_generate(&src, &o, seq, np, nn, record, &e, out));
        EXPECT(ty.calls == nn && e.n == nn, "%d forwards and %d tokens emitted for %d", ty.calls,
               e.n, nn);
        for (int k = 0; k < nn; k++)
            EXPECT(out[k] == seq[np + k] && e.tok[k] == out[k],
                   "prompt %d, token %d: drew %d, expected %d", np, k, (int)out[k],
                   (int)seq[np + k]);
    }
    /* with a temperature the draws come from the stream: the same seed, the
     * same tokens; another seed (of 8), other tokens somewhere */
    int32_t p[1] = {3}, a[40], b[40], c[40];
    zpp_sample_opts o = {2.0, 0, 77};
    EXPECT_OK(zpp_sample_generate(&src, &o, p, 1, 40, NULL, NULL, a));
    EXPECT_OK(zpp_sample_generate(&src, &o, p, 1, 40, NULL, NULL, b));
    EXPECT(memcmp(a, b, sizeof a) == 0, "the same seed drew other tokens");
    o.seed = 78;
    EXPECT_OK(zpp_sample_generate(&src, &o, p, 1, 40, NULL, NULL, c));
    EXPECT(memcmp(a, c, sizeof a) != 0, "seeds 77 and 78 drew the same 40 tokens");
    for (int k = 0; k < 40; k++) EXPECT(a[k] < 11, "drew the padded column: %d", (int)a[k]);
}

static zpp_status nan_logits(void *ctx, const int32_t *w, int n, float *out) {
    (void)ctx, (void)w, (void)n;
    for (int v = 0; v < 12; v++) out[v] = v == 4 ? NAN : 0.0f;
    return ZPP_OK;
}

/* Options and prompts outside their ranges, and a model without a
 * distribution, are refused with a line naming the culprit. */
static void test_rejects_bad_input(void) {
    toy ty = {0};
    zpp_sample_source src = {5, 12, 11, toy_logits, &ty};
    int32_t p[3] = {1, 2, 3}, out[4];
    float l[11] = {0};
    int tok = 0;
    struct {
        double t;
        int k;
        const char *needle;
    } bad[] = {{-1.0, 0, "temperature -1"}, {NAN, 0, "temperature nan"},
               {INFINITY, 0, "temperature inf"}, {1.0, -1, "top-k -1"},
               {1.0, 12, "top-k 12 is outside 1..11"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zpp_sample_opts o = {bad[i].t, bad[i].k, 0};
        EXPECT_STATUS(zpp_sample_pick(l, 11, &o, 0.5, &tok), ZPP_ERR_INVALID);
        EXPECT(strstr(zpp_last_error(), bad[i].needle), "'%s' lacks '%s'", zpp_last_error(),
               bad[i].needle);
        EXPECT_STATUS(zpp_sample_generate(&src, &o, p, 3, 4, NULL, NULL, out), ZPP_ERR_INVALID);
    }
    zpp_sample_opts o = {1.0, 0, 0};
    EXPECT_STATUS(zpp_sample_pick(l, 11, &o, 1.0, &tok), ZPP_ERR_INVALID); /* u in [0, 1) */
    EXPECT_STATUS(zpp_sample_generate(&src, &o, p, 0, 4, NULL, NULL, out), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "prompt is empty"), "'%s'", zpp_last_error());
    p[1] = 11; /* the padded column, outside the real vocabulary */
    EXPECT_STATUS(zpp_sample_generate(&src, &o, p, 3, 4, NULL, NULL, out), ZPP_ERR_INVALID);
    EXPECT(strstr(zpp_last_error(), "prompt token 11 at position 1 is outside the vocabulary "
                                    "0..10"), "'%s'", zpp_last_error());
    p[1] = -3;
    EXPECT_STATUS(zpp_sample_generate(&src, &o, p, 3, 4, NULL, NULL, out), ZPP_ERR_INVALID);
    p[1] = 2;
    EXPECT(ty.calls == 0, "a refused generation ran the model");
    zpp_sample_source nan_src = {5, 12, 11, nan_logits, NULL};
    EXPECT_STATUS(zpp_sample_generate(&nan_src, &o, p, 3, 4, NULL, NULL, out), ZPP_ERR_NONFINITE);
    EXPECT(strstr(zpp_last_error(), "logit of token 4 is nan"), "'%s'", zpp_last_error());
}

/* Tokens to text: bytes, or the ids in --prompt-ids's form. */
static void test_text(void) {
    const int32_t t[4] = {72, 105, 10, 255};
    zpp_sample_decoder bytes = {zpp_sample_decode_bytes, NULL};
    char *s = NULL;
    size_t n = 0;
    EXPECT_OK(zpp_sample_text(&bytes, t, 4, &s, &n));
    EXPECT(n == 4 && !memcmp(s, "Hi\n\xff", 4) && s[4] == 0, "'%s'", s);
    free(s);
    EXPECT_OK(zpp_sample_text(NULL, t, 4, &s, &n));
    EXPECT(!strcmp(s, "72,105,10,255") && n == 13, "'%s'", s);
    free(s);
    const int32_t big[1] = {256};
    EXPECT_STATUS(zpp_sample_text(&bytes, big, 1, &s, &n), ZPP_ERR_INVALID);
}

/* ---- Files ---------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *n_p) {
    FILE *f = fopen(path, "rb");
    EXPECT(f != NULL, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = zpp_test_malloc((size_t)n + 1);
    EXPECT(fread(p, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    p[n] = 0;
    *n_p = (size_t)n;
    return p;
}

/* The run under test: 2 layers of 32 channels, T = 32, bytes; qwZ and qgZ
 * (the sample's gathers must be exact anyway: engine.h, zpp_engine_evaluate_with_batch). */
#define RUN_T 32
#define RUN_SEED 4242
#define RUN_STEPS 3
#define RUN_TOKENS 24

typedef struct run {
    char dir[512], cfg[512], data[512], met[512], log[512];
    unsigned char *text;
    size_t n_text;
} run;

/* Random words from a small lexicon: text to train on. */
static void write_corpus(run *r, zpp_rng *g) {
    static const char *const words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy",
                                        "dog", "and", "sat", "on", "a", "mat", "\n"};
    const size_t cap = 6000;
    r->text = zpp_test_malloc(cap + 16);
    size_t n = 0;
    while (n < cap) {
        const char *w = words[zpp_rng_u64(g) % 14];
        n += (size_t)sprintf((char *)r->text + n, "%s ", w);
    }
    r->n_text = n;
    zpp_test_write_file(r->data, r->text, n);
}

static run g_run;

/* Trains: 2 ranks, a checkpoint at the end, a sample every 2nd and the
 * last step into the metrics and the log. */
static const run *trained(void) {
    run *r = &g_run;
    zpp_rng g = zpp_rng_make(zpp_test_seed(10));
    zpp_test_tmp_path("ckpt", r->dir);
    zpp_test_tmp_path("cfg.json", r->cfg);
    zpp_test_tmp_path("corpus.txt", r->data);
    zpp_test_tmp_path("metrics.jsonl", r->met);
    zpp_test_tmp_path("train.log", r->log);
    write_corpus(r, &g);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2,"
             " \"model\": {\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"seq_len\": %d,"
             " \"vocab_size\": 256},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"bf16\": {\"enabled\": true},"
             " \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": true,"
             " \"zero_quantized_gradients\": true},"
             " \"zeropp\": {\"eval_every\": 0, \"seed\": %d, \"sample_tokens\": %d}}",
             RUN_T, RUN_SEED, RUN_TOKENS);
    zpp_test_write_file(r->cfg, json, strlen(json));
    char err[512];
    int rc = zpp_test_run_cli(2, r->log, zpp_test_tmp_path("train.err", err),
                     "train --config %s --data %s --steps %d --sample-every 2 --save %s "
                     "--metrics %s",
                     r->cfg, r->data, RUN_STEPS, r->dir, r->met);
    EXPECT(rc == 0, "training failed (exit %d); stderr in %s", rc, err);
    return r;
}

/* The "sample_ids" of each metrics line (-1 where a line has none), into
 * ids[line][0..RUN_TOKENS). */
static int read_sample_ids(const char *path, int32_t ids[][RUN_TOKENS], int *has, int cap) {
    FILE *f = fopen(path, "r");
    EXPECT(f != NULL, "no metrics file %s", path);
    char *line = NULL;
    size_t lcap = 0;
    int n = 0;
    while (n < cap && getline(&line, &lcap, f) > 0) {
        const char *p = strstr(line, "\"sample_ids\":[");
        has[n] = p != NULL;
        if (p) {
            p += strlen("\"sample_ids\":[");
            for (int k = 0; k < RUN_TOKENS; k++) {
                char *end = NULL;
                ids[n][k] = (int32_t)strtol(p, &end, 10);
                EXPECT(end != p && (*end == (k + 1 < RUN_TOKENS ? ',' : ']')),
                       "line %d: sample_ids has not %d ids: %s", n + 1, RUN_TOKENS, line);
                p = end + 1;
            }
            EXPECT(strstr(line, "\"sample\":\""), "line %d has ids but no text", n + 1);
        }
        n++;
    }
    free(line);
    fclose(f);
    return n;
}

/* The prompt the trainer samples from: the first 16 tokens (fewer than T)
 * of the validation split, n_val = max(floor(n / 10), T + 1) at the end. */
static void trainer_prompt(const run *r, char *ids, size_t cap, unsigned char *bytes) {
    size_t n_val = r->n_text / 10 > RUN_T + 1 ? r->n_text / 10 : RUN_T + 1;
    size_t first = r->n_text - n_val, len = 0;
    for (int i = 0; i < 16; i++) {
        bytes[i] = r->text[first + (size_t)i];
        len += (size_t)snprintf(ids + len, cap - len, i ? ",%d" : "%d", bytes[i]);
    }
}

/* `zeropp sample --from FROM ARGS` -> its stdout (malloc'd), or fails. */
static char *sample(const char *from, size_t *n_p, const char *fmt, ...) {
    char args[2048], out[512], err[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int rc = zpp_test_run_cli(0, zpp_test_tmp_path("sample.out", out),
                     zpp_test_tmp_path("sample.err", err), "sample --from %s %s", from, args);
    size_t ne = 0;
    char *e = read_all(err, &ne);
    EXPECT(rc == 0, "zeropp sample --from %s %s: exit %d: %s", from, args, rc, e);
    free(e);
    return read_all(out, n_p);
}

/* --sample-every: the metrics of steps 2 and 3 (every 2nd, and the last)
 * carry a sample of sample_tokens ids, step 1's none; the log shows them. */
static void check_train_samples_in_metrics(const run *r) {
    int32_t ids[8][RUN_TOKENS];
    int has[8];
    EXPECT(read_sample_ids(r->met, ids, has, 8) == RUN_STEPS, "not %d metrics lines", RUN_STEPS);
    EXPECT(!has[0] && has[1] && has[2], "samples at steps 1..3: %d %d %d", has[0], has[1], has[2]);
    for (int k = 0; k < RUN_TOKENS; k++)
        EXPECT(ids[2][k] >= 0 && ids[2][k] < 256, "id %d", (int)ids[2][k]);
    EXPECT(zpp_test_count_lines(r->log, "sample at step 2 ") == 1 &&
               zpp_test_count_lines(r->log, "sample at step 3 ") == 1,
           "the log (%s) lacks the samples", r->log);
}

/* `zeropp sample` from the 2-rank checkpoint: the same seed twice gives the
 * same text, another seed another; and it is the trainer's own sample of
 * step 3, drawn through the engine's gathers over 2 ranks, token for token
 * (the same prompt, temperature 1, the run's seed): unsharding is exact. */
static void check_sample_from_checkpoint(const run *r) {
    int32_t ids[8][RUN_TOKENS];
    int has[8];
    read_sample_ids(r->met, ids, has, 8);
    char pids[256];
    unsigned char prompt[16];
    trainer_prompt(r, pids, sizeof pids, prompt);
    size_t n1 = 0, n2 = 0, n3 = 0;
    char *a = sample(r->dir, &n1, "--prompt-ids %s --max-new-tokens %d --seed %d", pids,
                     RUN_TOKENS, RUN_SEED);
    char *b = sample(r->dir, &n2, "--prompt-ids %s --max-new-tokens %d --seed %d", pids,
                     RUN_TOKENS, RUN_SEED);
    char *c = sample(r->dir, &n3, "--prompt-ids %s --max-new-tokens %d --seed %d", pids,
                     RUN_TOKENS, RUN_SEED + 1);
    EXPECT(n1 == 16 + RUN_TOKENS + 1, "%zu bytes printed, expected the prompt, %d and a newline",
           n1, RUN_TOKENS);
    EXPECT(n1 == n2 && !memcmp(a, b, n1), "the same seed printed other text");
    EXPECT(n3 == n1 && memcmp(a, c, n1) != 0, "seeds %d and %d printed the same text", RUN_SEED,
           RUN_SEED + 1);
    EXPECT(!memcmp(a, prompt, 16) && a[n1 - 1] == '\n', "the prompt is not echoed");
    for (int k = 0; k < RUN_TOKENS; k++)
        EXPECT((unsigned char)a[16 + k] == ids[2][k],
               "token %d: zeropp sample drew %d, the trainer %d at step %d", k,
               (unsigned char)a[16 + k], (int)ids[2][k], RUN_STEPS);
    free(a), free(b), free(c);
}

/* The same weights elsewhere: exported to an llm.c file (fp32 masters),
 * and saved again by 1 rank from that file (`train --init-from --steps 0`,
 * one rank file instead of two). Same text from all three, greedy and with
 * top-k; --dtype bf16 makes the llm.c file's model compute as the
 * checkpoints' does. */
static void check_same_weights_same_text(const run *r) {
    char bin[512], dir1[512], out[512], err[512];
    zpp_test_tmp_path("model.bin", bin);
    zpp_test_tmp_path("ckpt1", dir1);
    EXPECT(zpp_test_run_cli(0, zpp_test_tmp_path("export.out", out), zpp_test_tmp_path("export.err", err),
                   "export --from %s --to %s", r->dir, bin) == 0,
           "export failed: %s", err);
    EXPECT(zpp_test_run_cli(1, zpp_test_tmp_path("init.out", out), zpp_test_tmp_path("init.err", err),
                   "train --quiet --config %s --data %s --init-from %s --steps 0 --save %s",
                   r->cfg, r->data, bin, dir1) == 0,
           "train --init-from --steps 0 failed: %s", err);
    const char *opts[] = {"--prompt fox --temperature 0 --max-new-tokens 20",
                          "--prompt 'the lazy' --top-k 5 --seed 9 --max-new-tokens 20"};
    for (int i = 0; i < 2; i++) {
        size_t na = 0, nb = 0, nc = 0;
        char *a = sample(r->dir, &na, "%s", opts[i]);
        char *b = sample(dir1, &nb, "%s", opts[i]);
        char *c = sample(bin, &nc, "--dtype bf16 %s", opts[i]);
        EXPECT(na == nb && !memcmp(a, b, na), "%s: the 1-rank checkpoint differs", opts[i]);
        EXPECT(na == nc && !memcmp(a, c, na), "%s: the llm.c file differs", opts[i]);
        free(a), free(b), free(c);
    }
}

/* The command cases share one training run (a 2-rank launch is the slow
 * part). */
static void test_sample_command(void) {
    const run *r = trained();
    check_train_samples_in_metrics(r);
    check_sample_from_checkpoint(r);
    check_same_weights_same_text(r);
}

/* A checkpoint of the initial weights of a small model, saved by one rank
 * without training (`--steps 0`): a model to refuse bad input with. */
static const char *initial_checkpoint(char *dir) {
    char cfg[512], data[512], out[512], err[512];
    zpp_test_tmp_path("ckpt0", dir);
    zpp_test_tmp_path("corpus0.txt", data);
    /* ten lines: a training split of at least one step (8 x 8 + 1 tokens) */
    char text[441];
    for (int i = 0; i < 10; i++)
        memcpy(text + 44 * i, "the quick brown fox jumps over the lazy dog\n", 44);
    zpp_test_write_file(data, text, 440);
    const char *json = "{\"model\": {\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16,"
                       " \"seq_len\": 8, \"vocab_size\": 256}}";
    zpp_test_write_file(zpp_test_tmp_path("cfg0.json", cfg), json, strlen(json));
    EXPECT(zpp_test_run_cli(0, zpp_test_tmp_path("init0.out", out), zpp_test_tmp_path("init0.err", err),
                   "train --quiet --config %s --data %s --steps 0 --save %s", cfg, data,
                   dir) == 0,
           "train --steps 0 failed: %s", err);
    return dir;
}

/* Bad inputs: a clear line and a non-zero exit, nothing sampled. */
static void expect_refused(const char *args, const char *needle) {
    char out[512], err[512];
    int rc = zpp_test_run_cli(0, zpp_test_tmp_path("bad.out", out), zpp_test_tmp_path("bad.err", err),
                     "sample %s", args);
    size_t n = 0;
    char *e = read_all(err, &n);
    EXPECT(rc != 0, "zeropp sample %s: exit 0", args);
    EXPECT(strstr(e, needle) != NULL, "zeropp sample %s: stderr '%s' lacks '%s'", args, e, needle);
    free(e);
    char *o = read_all(out, &n);
    EXPECT(n == 0, "zeropp sample %s printed '%s' before refusing", args, o);
    free(o);
}

static void test_bad_inputs(void) {
    char dir[512], args[2048], missing[512];
    initial_checkpoint(dir);
    zpp_test_tmp_path("no-such-checkpoint", missing);
    snprintf(args, sizeof args, "--from %s", missing);
    expect_refused(args, "no such file or folder");
    snprintf(args, sizeof args, "--from %s --prompt-ids 10,256,3", dir);
    expect_refused(args, "prompt token 256 at position 1 is outside the vocabulary 0..255");
    snprintf(args, sizeof args, "--from %s --prompt-ids 10,x", dir);
    expect_refused(args, "--prompt-ids takes token ids");
    snprintf(args, sizeof args, "--from %s --top-k 0", dir);
    expect_refused(args, "--top-k 0 leaves no token");
    snprintf(args, sizeof args, "--from %s --top-k 257", dir);
    expect_refused(args, "--top-k 257 is more than the vocabulary");
    snprintf(args, sizeof args, "--from %s --temperature -0.5", dir);
    expect_refused(args, "--temperature expects a number >= 0");
    snprintf(args, sizeof args, "--from %s --device tpu", dir);
    expect_refused(args, "--device takes cpu or gpu");
    expect_refused("--prompt hi", "name the model");
    snprintf(args, sizeof args, "%s --from %s", dir, dir);
    expect_refused(args, "both name the model");
}

/* ---- A BPE model ------------------------------------------------------------------ */

/* "12,7,503\n" -> ids; returns how many. */
static int parse_id_list(const char *s, int32_t *ids, int cap) {
    int n = 0;
    while (*s && *s != '\n') {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        EXPECT(end != s && (*end == ',' || *end == '\n' || !*end), "not an id list: '%s'", s);
        EXPECT(n < cap, "more than %d ids", cap);
        ids[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

#define BPE_PROMPT "<|endoftext|>ROMEO: the man"
#define BPE_NEW 40

/* `zeropp tokenize` with the tokenizer in tests/data (320 tokens: the 256
 * bytes, 63 merges learned on Tiny Shakespeare, <|endoftext|>) on 30 kB of
 * Tiny Shakespeare, 3 steps of a tiny model on it with a sample at the end;
 * then the samples are that tokenizer's text. */
/* GPT-2's two files as one Hugging Face tokenizer.json (ByteLevel with
 * GPT-2's regex, <|endoftext|> an added token that model.vocab holds too,
 * as the "gpt2" repository's file has it), written to `path`. */
static void write_tokenizer_json(const char *vocab, const char *merges, char *path) {
    size_t nv = 0, nm = 0;
    char *v = read_all(vocab, &nv), *m = read_all(merges, &nm);
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens"), *eot = cJSON_CreateObject();
    cJSON *vj = cJSON_Parse(v);
    EXPECT(vj != NULL, "%s is not JSON", vocab);
    cJSON_AddNumberToObject(eot, "id", cJSON_GetObjectItem(vj, "<|endoftext|>")->valuedouble);
    cJSON_AddStringToObject(eot, "content", "<|endoftext|>");
    cJSON_AddTrueToObject(eot, "special");
    cJSON_AddItemToArray(added, eot);
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pt = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pt, "type", "ByteLevel");
    cJSON_AddFalseToObject(pt, "add_prefix_space");
    cJSON_AddTrueToObject(pt, "use_regex");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vj);
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n"))
        if (strncmp(line, "#version", 8)) cJSON_AddItemToArray(ml, cJSON_CreateString(line));
    char *text = cJSON_Print(root);
    zpp_test_write_file(zpp_test_tmp_path("tokenizer.json", path), text, strlen(text));
    cJSON_free(text), cJSON_Delete(root), free(v), free(m);
}

static void test_sample_bpe(void) {
    char vocab[512], merges[512], shakes[512], text[512], bin[512], note[512], cfg[512],
        dir[512], log[512], err[512], out[512];
    zpp_test_data("shakespeare-bpe/vocab.json", vocab, sizeof vocab);
    zpp_test_data("shakespeare-bpe/merges.txt", merges, sizeof merges);
    zpp_test_data("tinyshakespeare.txt", shakes, sizeof shakes);
    zpp_bpe *bpe = NULL;
    EXPECT_OK(zpp_bpe_load_gpt2(vocab, merges, &bpe));
    EXPECT(zpp_bpe_vocab_size(bpe) == 320, "%d tokens", (int)zpp_bpe_vocab_size(bpe));
    size_t n_all = 0;
    char *all = read_all(shakes, &n_all);
    const size_t n_text = 30000;
    zpp_test_write_file(zpp_test_tmp_path("shakes.txt", text), all, n_text);
    zpp_bpe_ids toks = {0};
    EXPECT_OK(zpp_bpe_encode(bpe, all, n_text, 0, &toks, NULL));
    free(all);

    /* tokenize: the token file and its note, naming the files absolutely */
    zpp_test_tmp_path("shakes.bin", bin);
    EXPECT(zpp_test_run_cli(0, zpp_test_tmp_path("tok.out", out), zpp_test_tmp_path("tok.err", err),
                   "tokenize --vocab %s --merges %s %s %s", vocab, merges, text, bin) == 0,
           "zeropp tokenize failed: %s", err);
    zpp_tokfile_note nt;
    int found = 0;
    EXPECT_OK(zpp_tokfile_note_read(bin, &nt, &found));
    char *rv = realpath(vocab, NULL), *rm = realpath(merges, NULL);
    EXPECT(found && !strcmp(nt.vocab, rv) && !strcmp(nt.merges, rm) && nt.vocab_size == 320 &&
               nt.tokens == toks.n,
           "the note names %s, %s, %d tokens, a file of %zu", found ? nt.vocab : "-",
           found ? nt.merges : "-", (int)nt.vocab_size, nt.tokens);
    zpp_tokfile_note_free(&nt);
    free(rv), free(rm);

    /* 3 steps on 1 rank, a checkpoint and a sample at the end */
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2,"
                       " \"model\": {\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 32,"
                       " \"seq_len\": 32, \"vocab_size\": 320},"
                       " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
                       " \"zeropp\": {\"eval_every\": 0, \"seed\": 7, \"sample_tokens\": 16}}";
    zpp_test_write_file(zpp_test_tmp_path("bpe.json", cfg), json, strlen(json));
    zpp_test_tmp_path("ckpt-bpe", dir);
    EXPECT(zpp_test_run_cli(0, zpp_test_tmp_path("bpe-train.log", log), err,
                   "train --config %s --data %s --steps 3 --sample-every 3 --save %s", cfg, bin,
                   dir) == 0,
           "training failed: %s", err);
    /* the trainer's sample: its prompt (the first 16 tokens of the held-out
     * tenth, n_val = max(floor(n / 10), T + 1) at the end) as text */
    {
        const size_t n_val = toks.n / 10 > 33 ? toks.n / 10 : 33;
        char *want = NULL, *got = NULL;
        size_t nw = 0, ng = 0;
        EXPECT_OK(zpp_bpe_decode(bpe, toks.ids + (toks.n - n_val), 16, &want, &nw));
        got = read_all(log, &ng);
        const char *rule = strstr(got, "sample at step 3 (16 tokens after the first 16");
        EXPECT(rule != NULL, "no sample in the log: %s", got);
        rule = strstr(rule, "\n---\n");
        EXPECT(rule && !strncmp(rule + 5, want, nw),
               "the sample's prompt is not the tokenizer's text '%s': %s", want, got);
        free(want), free(got);
    }
    free(toks.ids);

    /* zeropp sample: text with the files named, ids with --ids, the same
     * text through the note */
    size_t na = 0, nb = 0, nc = 0;
    char *a = sample(dir, &na, "--vocab %s --merges %s --prompt '%s' --max-new-tokens %d --seed 5",
                     vocab, merges, BPE_PROMPT, BPE_NEW);
    char *b = sample(dir, &nb, "--vocab %s --merges %s --prompt '%s' --max-new-tokens %d --seed 5 "
                     "--ids", vocab, merges, BPE_PROMPT, BPE_NEW);
    char *c = sample(dir, &nc, "--prompt '%s' --max-new-tokens %d --seed 5", BPE_PROMPT, BPE_NEW);
    EXPECT(nc == na && !memcmp(a, c, na), "through the note: '%s', with the files: '%s'", c, a);
    { /* the same tokenizer as a tokenizer.json */
        char tj[512];
        size_t nd = 0;
        write_tokenizer_json(vocab, merges, tj);
        /* token for token GPT-2's files' encoding of the text, specials on */
        zpp_bpe *hf = NULL;
        EXPECT_OK(zpp_bpe_load_hf(tj, &hf));
        size_t nt = 0;
        char *t = read_all(text, &nt);
        zpp_bpe_ids x = {0}, y = {0};
        EXPECT_OK(zpp_bpe_encode(bpe, t, nt, ZPP_BPE_SPECIAL, &x, NULL));
        EXPECT_OK(zpp_bpe_encode(hf, t, nt, ZPP_BPE_SPECIAL, &y, NULL));
        EXPECT(x.n == y.n && !memcmp(x.ids, y.ids, x.n * sizeof *x.ids),
               "the tokenizer.json gives %zu tokens, the two files %zu", y.n, x.n);
        free(x.ids), free(y.ids), free(t);
        zpp_bpe_destroy(hf);
        char *d = sample(dir, &nd, "--tokenizer %s --prompt '%s' --max-new-tokens %d --seed 5",
                         tj, BPE_PROMPT, BPE_NEW);
        EXPECT(nd == na && !memcmp(a, d, na), "with --tokenizer: '%s', with the files: '%s'", d,
               a);
        free(d);
        d = sample(dir, &nd, "--tokenizer %s --prompt '%s' --max-new-tokens %d --seed 5 --ids",
                   tj, BPE_PROMPT, BPE_NEW);
        EXPECT(nd == nb && !memcmp(b, d, nb), "with --tokenizer: ids %s, with the files: %s", d,
               b);
        free(d);
        /* and through a note naming it (what `tokenize --tokenizer` leaves) */
        zpp_tokfile_note gpt2_note, hf_note = {NULL, NULL, 320, 0, tj};
        EXPECT_OK(zpp_tokfile_note_read(bin, &gpt2_note, &found));
        hf_note.tokens = gpt2_note.tokens;
        EXPECT_OK(zpp_tokfile_note_write(bin, &hf_note));
        d = sample(dir, &nd, "--prompt '%s' --max-new-tokens %d --seed 5", BPE_PROMPT, BPE_NEW);
        EXPECT(nd == na && !memcmp(a, d, na), "through an hf-bpe note: '%s', with the files: '%s'",
               d, a);
        free(d);
        EXPECT_OK(zpp_tokfile_note_write(bin, &gpt2_note)); /* as it was */
        zpp_tokfile_note_free(&gpt2_note);
    }
    /* the prompt: the tokenizer's encoding (special tokens too), which
     * decodes back to the prompt, and the output starts with it */
    zpp_bpe_ids pe = {0};
    EXPECT_OK(zpp_bpe_encode(bpe, BPE_PROMPT, strlen(BPE_PROMPT), ZPP_BPE_SPECIAL, &pe, NULL));
    EXPECT(pe.n < strlen(BPE_PROMPT) - 12 && pe.ids[0] == 319,
           "the prompt is %zu tokens (<|endoftext|> and merges expected)", pe.n);
    int32_t ids[256];
    const int n = parse_id_list(b, ids, 256);
    EXPECT(n == (int)pe.n + BPE_NEW, "--ids printed %d ids: '%s'", n, b);
    for (size_t i = 0; i < pe.n; i++)
        EXPECT(ids[i] == pe.ids[i], "prompt token %zu: %d, the tokenizer's %d", i, (int)ids[i],
               (int)pe.ids[i]);
    /* the text is exactly the tokenizer's decoding of the ids drawn */
    char *want = NULL;
    size_t nw = 0;
    EXPECT_OK(zpp_bpe_decode(bpe, ids, (size_t)n, &want, &nw));
    EXPECT(na == nw + 1 && !memcmp(a, want, nw) && a[nw] == '\n',
           "printed '%s', the tokenizer decodes the ids to '%s'", a, want);
    EXPECT(!strncmp(a, BPE_PROMPT, strlen(BPE_PROMPT)), "the output does not start with the "
           "prompt: '%s'", a);
    free(want), free(pe.ids), free(a), free(b), free(c);

    /* no tokenizer: the hint, unless ids are asked for */
    zpp_tokfile_note_path(bin, note, sizeof note);
    char moved[600];
    snprintf(moved, sizeof moved, "%s.moved", note);
    EXPECT(rename(note, moved) == 0);
    char args[2048];
    snprintf(args, sizeof args, "%s --prompt hi", dir);
    expect_refused(args, "(--tokenizer tokenizer.json, or --vocab vocab.json --merges merges.txt)");
    snprintf(args, sizeof args, "%s --prompt-ids 3,300", dir);
    expect_refused(args, "no tokenizer note");
    a = sample(dir, &na, "--prompt-ids 3,300 --ids --max-new-tokens 4");
    EXPECT(parse_id_list(a, ids, 256) == 6 && ids[0] == 3 && ids[1] == 300, "'%s'", a);
    free(a);
    /* a stale note: the token file is not the one it describes */
    {
        size_t nn = 0;
        char *t = read_all(moved, &nn);
        char *cnt = strstr(t, "\"tokens\":");
        EXPECT(cnt != NULL, "%s", t);
        cnt[strlen("\"tokens\":")] = cnt[strlen("\"tokens\":")] == '9' ? '8' : '9';
        zpp_test_write_file(note, t, nn);
        free(t);
        expect_refused(args, "is stale");
    }
    /* a tokenizer larger than the model's vocabulary */
    char dir0[512];
    initial_checkpoint(dir0);
    snprintf(args, sizeof args, "%s --vocab %s --merges %s", dir0, vocab, merges);
    expect_refused(args, "has 320 tokens, more than the 256 of the model");
    snprintf(args, sizeof args, "%s --vocab %s", dir0, vocab);
    expect_refused(args, "give both");
    zpp_bpe_destroy(bpe);
}

/* On a GPU: the CUDA model samples from the same checkpoint, echoes the
 * prompt, prints the tokens asked for, and repeats itself for a seed. (Its
 * logits against the CPU's: test_gpt2_cuda.c.) */
static void test_sample_gpu(void) {
    char dir[512];
    initial_checkpoint(dir);
    size_t na = 0, nb = 0;
    char *a = sample(dir, &na, "--device gpu --prompt fox --max-new-tokens 30 --seed 3");
    char *b = sample(dir, &nb, "--device gpu --prompt fox --max-new-tokens 30 --seed 3");
    EXPECT(na == 3 + 30 + 1 && !memcmp(a, "fox", 3), "%zu bytes", na);
    EXPECT(na == nb && !memcmp(a, b, na), "the same seed printed other text on the GPU");
    free(a), free(b);
}

/* ---- A Llama ---------------------------------------------------------------
 * A tiny Llama (grouped-query 4:2, untied head, its own MLP width, rope_theta
 * 500000) trained 3 steps on 2 ranks in fp32, with a sample and a
 * validation loss at the last step and a checkpoint. Then:
 * - `zeropp sample` from the checkpoint draws the trainer's own sample
 *   (the engine's gathers over 2 ranks against the weights put together on
 *   one, through the family's factory), token for token;
 * - each token `zeropp sample --ids` draws is the draw (zpp_sample_pick with
 *   u_k of the seed) from the logits of a direct forward of the whole
 *   sequence, prompt and tokens drawn, through the llama CPU model made
 *   here from the checkpoint's weights, read at the row before the token:
 *   the generation's padded windows give exactly the logits of the
 *   unpadded sequence (causal attention), and the command reads the right
 *   family and shape;
 * - `zeropp eval` on the same 2 ranks prints the run's last validation
 *   loss, which the engine computed, to the last printed digit. */
#define LLAMA_NEW 20
#define LLAMA_PROMPT 8

static void llama_train(run *r) {
    zpp_rng g = zpp_rng_make(zpp_test_seed(31));
    zpp_test_tmp_path("ckpt-llama", r->dir);
    zpp_test_tmp_path("llama.json", r->cfg);
    zpp_test_tmp_path("corpus-llama.txt", r->data);
    zpp_test_tmp_path("metrics-llama.jsonl", r->met);
    zpp_test_tmp_path("train-llama.log", r->log);
    write_corpus(r, &g);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": false},"
             " \"model\": {\"family\": \"llama\", \"n_layer\": 2, \"n_head\": 4,"
             " \"n_kv_head\": 2, \"n_embd\": 32, \"n_ffn\": 48, \"seq_len\": %d,"
             " \"vocab_size\": 256, \"untied_head\": true, \"rope_theta\": 500000},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"zeropp\": {\"eval_every\": %d, \"seed\": %d, \"sample_tokens\": %d}}",
             RUN_T, RUN_STEPS, RUN_SEED, RUN_TOKENS);
    zpp_test_write_file(r->cfg, json, strlen(json));
    char err[512];
    int rc = zpp_test_run_cli(2, r->log, zpp_test_tmp_path("train-llama.err", err),
                     "train --config %s --data %s --steps %d --sample-every %d --save %s "
                     "--metrics %s",
                     r->cfg, r->data, RUN_STEPS, RUN_STEPS, r->dir, r->met);
    EXPECT(rc == 0, "training the llama failed (exit %d); stderr in %s", rc, err);
}

/* The logits of row `row` of tokens[0..n) through model m (fp32 host
 * parameters `units`), one forward of the whole sequence. */
static void direct_logits(zpp_model *m, float *const *units, const int32_t *tokens, int n,
                          int row, float *out) {
    int32_t *window = zpp_test_malloc((size_t)m->seq_len * sizeof *window);
    for (int i = 0; i < m->seq_len; i++) window[i] = i < n ? tokens[i] : 0;
    EXPECT_OK(m->ops->keep_logits(m, row));
    EXPECT_OK(m->ops->set_batch(m, window, NULL, 1));
    for (int s = 0; s < m->n_stages; s++)
        EXPECT_OK(m->ops->forward(m, s, units[m->stage_unit[s]]));
    EXPECT_OK(m->ops->logits(m, out));
    free(window);
}

static void check_llama_draws(const run *r) {
    zpp_sample_weights w;
    EXPECT_OK(zpp_sample_read_weights(r->dir, 0, &w));
    EXPECT(!strcmp(w.family, "llama") && w.shape.n_kv_head == 2 && w.shape.untied_head == 1 &&
               w.shape.n_ffn == 48 && w.shape.rope_theta == 500000 && w.dtype == ZPP_FP32 &&
               w.step == RUN_STEPS,
           "read %s: family %s, n_kv_head %d", r->dir, w.family, w.shape.n_kv_head);
    /* the direct model: the shape the config says, written out here */
    zpp_decoder_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n_layer = 2, sh.n_head = 4, sh.n_kv_head = 2, sh.n_embd = 32, sh.n_ffn = 48;
    sh.seq_len = RUN_T, sh.vocab_size = 256, sh.untied_head = 1, sh.rope_theta = 500000;
    zpp_device *dev = NULL;
    zpp_model *m = NULL;
    zpp_sample_model *sm = NULL;
    EXPECT_OK(zpp_device_create_host(&dev));
    EXPECT_OK(zpp_model_family_create("llama", &sh, ZPP_FP32, 1, dev, &m));
    EXPECT_OK(zpp_sample_model_create(&w, ZPP_FP32, dev, &sm));
    const zpp_sample_source src = zpp_sample_model_source(sm);
    float *padded = zpp_test_malloc(256 * sizeof *padded);
    zpp_rng g = zpp_rng_make(zpp_test_seed(32));
    int32_t seq[RUN_T];
    char pids[256];
    size_t len = 0;
    for (int i = 0; i < LLAMA_PROMPT; i++) {
        seq[i] = (int32_t)(zpp_rng_u64(&g) % 256);
        len += (size_t)snprintf(pids + len, sizeof pids - len, i ? ",%d" : "%d", (int)seq[i]);
    }
    const uint64_t seed = zpp_rng_u64(&g) % 100000;
    const double temps[] = {0, 0.7, 1.3};
    float *logits = zpp_test_malloc(256 * sizeof *logits);
    for (int ti = 0; ti < 3; ti++) {
        size_t n = 0;
        char *out = sample(r->dir, &n, "--prompt-ids %s --ids --max-new-tokens %d --seed %llu "
                           "--temperature %g%s",
                           pids, LLAMA_NEW, (unsigned long long)seed, temps[ti],
                           ti == 2 ? " --top-k 40" : "");
        int32_t ids[64];
        EXPECT(parse_id_list(out, ids, 64) == LLAMA_PROMPT + LLAMA_NEW, "printed '%s'", out);
        memcpy(seq + LLAMA_PROMPT, ids + LLAMA_PROMPT, LLAMA_NEW * sizeof *seq);
        const zpp_sample_opts o = {temps[ti], ti == 2 ? 40 : 0, seed};
        for (int k = 0; k < LLAMA_NEW; k++) {
            const int at = LLAMA_PROMPT + k; /* the token drawn, from row at - 1 */
            direct_logits(m, w.units, seq, LLAMA_PROMPT + LLAMA_NEW, at - 1, logits);
            /* what the command's model reads: the window of the first `at`
             * tokens, padded; the same numbers, bit for bit */
            int32_t window[RUN_T];
            for (int i = 0; i < RUN_T; i++) window[i] = i < at ? seq[i] : 0;
            EXPECT_OK(src.logits(src.ctx, window, at, padded));
            EXPECT(!memcmp(padded, logits, 256 * sizeof *padded),
                   "token %d: the sample model's logits are not the direct forward's", k);
            int want = -1;
            EXPECT_OK(zpp_sample_pick(logits, 256, &o, zpp_sample_uniform(seed, (uint64_t)k),
                                      &want));
            EXPECT(seq[at] == want, "t %g, token %d: zeropp sample drew %d, the direct "
                   "forward's logits %d", temps[ti], k, (int)seq[at], want);
        }
        free(out);
    }
    free(logits), free(padded);
    zpp_sample_model_destroy(sm);
    m->ops->destroy(m);
    zpp_device_destroy(dev);
    zpp_sample_weights_free(&w);
}

/* "key":number from the last line of `path` that has it, as printed. */
static void last_value_text(const char *path, const char *key, char *out, size_t cap) {
    size_t n = 0;
    char *t = read_all(path, &n), *p = t, *hit = NULL;
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    while ((p = strstr(p, pat))) hit = p++, (void)0;
    EXPECT(hit != NULL, "no %s in %s", key, path);
    hit += strlen(pat);
    size_t k = strcspn(hit, ",}");
    EXPECT(k < cap);
    memcpy(out, hit, k);
    out[k] = 0;
    free(t);
}

static void test_sample_llama(void) {
    run r;
    memset(&r, 0, sizeof r);
    llama_train(&r);
    /* the trainer's sample at the last step, token for token */
    int32_t ids[8][RUN_TOKENS];
    int has[8];
    EXPECT(read_sample_ids(r.met, ids, has, 8) == RUN_STEPS && has[RUN_STEPS - 1]);
    char pids[256];
    unsigned char prompt[16];
    trainer_prompt(&r, pids, sizeof pids, prompt);
    size_t n = 0;
    char *a = sample(r.dir, &n, "--prompt-ids %s --max-new-tokens %d --seed %d --ids", pids,
                     RUN_TOKENS, RUN_SEED);
    int32_t got[64];
    EXPECT(parse_id_list(a, got, 64) == 16 + RUN_TOKENS, "printed '%s'", a);
    for (int k = 0; k < RUN_TOKENS; k++)
        EXPECT(got[16 + k] == ids[RUN_STEPS - 1][k], "token %d: zeropp sample %d, the trainer %d",
               k, (int)got[16 + k], (int)ids[RUN_STEPS - 1][k]);
    free(a);
    check_llama_draws(&r);
    /* eval: the run's validation loss */
    char out[512], err[512], want[64], have[64];
    EXPECT(zpp_test_run_cli(2, zpp_test_tmp_path("eval-llama.out", out),
                   zpp_test_tmp_path("eval-llama.err", err), "eval %s --json", r.dir) == 0,
           "zeropp eval failed: %s", err);
    last_value_text(r.met, "val_loss", want, sizeof want);
    last_value_text(out, "loss", have, sizeof have);
    EXPECT(!strcmp(want, have), "zeropp eval: loss %s, the run's val_loss %s", have, want);
    free(r.text);
}

/* A Llama on a tokenizer.json: `zeropp tokenize --tokenizer` makes its
 * token file (and the note naming the tokenizer), a 1-rank Llama of that
 * vocabulary trains 2 steps on it, and `zeropp sample` prints text in that
 * tokenizer: through the note and with --tokenizer alike, exactly the
 * tokenizer's decoding of the ids it draws, its prompt the tokenizer's
 * encoding; and through the export and back, through the tokenizer.json of
 * the folder it was imported from; and from the exported folder itself. */
static void test_sample_llama_tokenizer_json(void) {
    char vocab[512], merges[512], shakes[512], text[512], bin[512], tj[512], cfg[512], dir[512],
        out[512], err[512];
    zpp_test_data("shakespeare-bpe/vocab.json", vocab, sizeof vocab);
    zpp_test_data("shakespeare-bpe/merges.txt", merges, sizeof merges);
    zpp_test_data("tinyshakespeare.txt", shakes, sizeof shakes);
    write_tokenizer_json(vocab, merges, tj);
    size_t n_all = 0;
    char *all = read_all(shakes, &n_all);
    zpp_test_write_file(zpp_test_tmp_path("shakes-llama.txt", text), all, 20000);
    free(all);
    zpp_test_tmp_path("shakes-llama.bin", bin);
    EXPECT(zpp_test_run_cli(0, zpp_test_tmp_path("tokl.out", out), zpp_test_tmp_path("tokl.err", err),
                   "tokenize --tokenizer %s %s %s", tj, text, bin) == 0,
           "zeropp tokenize --tokenizer failed: %s", err);
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2,"
                       " \"model\": {\"family\": \"llama\", \"n_layer\": 1, \"n_head\": 2,"
                       " \"n_kv_head\": 1, \"n_embd\": 32, \"seq_len\": 32, \"vocab_size\": 320},"
                       " \"zeropp\": {\"eval_every\": 0, \"seed\": 7}}";
    zpp_test_write_file(zpp_test_tmp_path("llama-bpe.json", cfg), json, strlen(json));
    zpp_test_tmp_path("ckpt-llama-bpe", dir);
    EXPECT(zpp_test_run_cli(0, zpp_test_tmp_path("trl.out", out), err,
                   "train --quiet --config %s --data %s --steps 2 --save %s", cfg, bin, dir) == 0,
           "training failed: %s", err);
    size_t na = 0, nb = 0, nc = 0;
    char *a = sample(dir, &na, "--prompt '%s' --max-new-tokens %d --seed 5", BPE_PROMPT, BPE_NEW);
    char *b = sample(dir, &nb, "--tokenizer %s --prompt '%s' --max-new-tokens %d --seed 5", tj,
                     BPE_PROMPT, BPE_NEW);
    char *c = sample(dir, &nc, "--prompt '%s' --max-new-tokens %d --seed 5 --ids", BPE_PROMPT,
                     BPE_NEW);
    EXPECT(na == nb && !memcmp(a, b, na), "through the note '%s', with --tokenizer '%s'", a, b);
    zpp_bpe *hf = NULL;
    EXPECT_OK(zpp_bpe_load_hf(tj, &hf));
    zpp_bpe_ids pe = {0};
    EXPECT_OK(zpp_bpe_encode(hf, BPE_PROMPT, strlen(BPE_PROMPT), ZPP_BPE_SPECIAL, &pe, NULL));
    int32_t ids[256];
    const int n = parse_id_list(c, ids, 256);
    EXPECT(n == (int)pe.n + BPE_NEW && !memcmp(ids, pe.ids, pe.n * sizeof *ids),
           "--ids printed %d ids, the prompt is %zu tokens: '%s'", n, pe.n, c);
    char *want = NULL;
    size_t nw = 0;
    EXPECT_OK(zpp_bpe_decode(hf, ids, (size_t)n, &want, &nw));
    EXPECT(na == nw + 1 && !memcmp(a, want, nw), "printed '%s', the tokenizer decodes '%s'", a,
           want);
    free(want), free(pe.ids), free(b), free(c);
    zpp_bpe_destroy(hf);

    /* Exported as a Hugging Face folder (which takes the data's
     * tokenizer.json along) and imported again to train on a copy of the
     * data without its note: the sample is the same text, the tokenizer now
     * found in the folder the model was imported from. */
    char hfdir[512], plain[512], dir2[512], cmd[1600];
    EXPECT(zpp_test_run_cli(0, out, err, "export --from %s --to %s", dir,
                            zpp_test_tmp_path("llama-bpe-hf", hfdir)) == 0,
           "export failed: %s", err);
    snprintf(cmd, sizeof cmd, "cp %s %s", bin, zpp_test_tmp_path("shakes-plain.bin", plain));
    EXPECT(system(cmd) == 0, "%s failed", cmd);
    EXPECT(zpp_test_run_cli(0, out, err,
                            "train --quiet --init-from %s --data %s --steps 0 --save %s", hfdir,
                            plain, zpp_test_tmp_path("ckpt-llama-hf", dir2)) == 0,
           "training from the export failed: %s", err);
    size_t nd = 0;
    char *d = sample(dir2, &nd, "--prompt '%s' --max-new-tokens %d --seed 5", BPE_PROMPT, BPE_NEW);
    EXPECT(nd == na && !memcmp(a, d, na), "imported from the export: '%s', before: '%s'", d, a);
    free(d);
    /* the exported folder itself: the checkpoint's weights bit for bit, at
     * its T (the run's, as max_position_embeddings); with its tokenizer.json
     * the same text again */
    {
        zpp_sample_weights wc, wh;
        EXPECT_OK(zpp_sample_read_weights(dir, 0, &wc));
        EXPECT_OK(zpp_sample_read_weights(hfdir, 0, &wh));
        EXPECT(!strcmp(wh.family, "llama") && wh.shape.seq_len == 32 &&
                   wh.n_units == wc.n_units && wh.step == -1 && wh.dtype == ZPP_FP32,
               "%s read as %s, T %d, %d units", hfdir, wh.family, wh.shape.seq_len, wh.n_units);
        zpp_llama_config lc;
        EXPECT_OK(zpp_llama_config_of_shape(&wc.shape, &lc));
        zpp_llama_layout lay;
        zpp_llama_layout_make(&lc, &lay);
        for (int u = 0; u < wc.n_units; u++) {
            const size_t k = u == 0 ? lay.embed_numel : lay.block_numel;
            EXPECT(!memcmp(wc.units[u], wh.units[u], k * sizeof(float)),
                   "unit %d of %s is not the checkpoint's", u, hfdir);
        }
        zpp_sample_weights_free(&wc), zpp_sample_weights_free(&wh);
    }
    d = sample(hfdir, &nd, "--prompt '%s' --max-new-tokens %d --seed 5", BPE_PROMPT, BPE_NEW);
    EXPECT(nd == na && !memcmp(a, d, na), "from the Hugging Face folder: '%s', from the "
           "checkpoint: '%s'", d, a);
    free(a), free(d);
    char args[1200];
    snprintf(args, sizeof args, "%s --seq-len 16 --prompt hi", dir);
    expect_refused(args, "--seq-len is for a Hugging Face folder");
}

ZPP_TESTS(ZPP_TEST(test_greedy_is_argmax), ZPP_TEST(test_top_k_stays_in_top),
          ZPP_TEST(test_frequencies_match_softmax), ZPP_TEST(test_stream_is_the_seeds),
          ZPP_TEST(test_generation_window), ZPP_TEST(test_rejects_bad_input), ZPP_TEST(test_text),
          ZPP_TEST(test_sample_command), ZPP_TEST(test_bad_inputs), ZPP_TEST(test_sample_bpe),
          ZPP_TEST(test_sample_llama), ZPP_TEST(test_sample_llama_tokenizer_json),
          ZPP_TEST_GPU(test_sample_gpu))
