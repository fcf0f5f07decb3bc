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
 * that says what to do. (The logits a sample reads are checked in
 * test_gpt2.c and test_gpt2_cuda.c.)
 *
 * ZPP_CLI (the zeropp command) and ZPP_MPIEXEC (mpirun) come from ctest. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/random.h"
#include "train/sample.h"
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

ZPP_TESTS(ZPP_TEST(test_greedy_is_argmax), ZPP_TEST(test_top_k_stays_in_top),
          ZPP_TEST(test_frequencies_match_softmax), ZPP_TEST(test_stream_is_the_seeds),
          ZPP_TEST(test_generation_window), ZPP_TEST(test_rejects_bad_input), ZPP_TEST(test_text))
