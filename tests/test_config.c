/* test_config.c — the trainer's JSON configuration, batch geometry and
 * learning-rate schedule (src/train/config.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "testlib.h"
#include "train/config.h"
#include "train/config_keys.h"

#define HAS(sub) (strstr(zpp_last_error(), (sub)) != NULL)
#define EXPECT_MSG(sub) EXPECT(HAS(sub), "message '%s' lacks '%s'", zpp_last_error(), (sub))

/* Loads `json` over fresh defaults, expecting `want`; the message must
 * contain `sub`. */
static void expect_load_fails(const char *json, zpp_status want, const char *sub) {
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    zpp_error_clear();
    zpp_status s = zpp_train_config_load_string(json, &cfg);
    EXPECT(s == want, "%s -> %s (%s), expected %s", json, zpp_status_str(s), zpp_last_error(),
           zpp_status_str(want));
    EXPECT(HAS(sub), "%s: message '%s' lacks '%s'", json, zpp_last_error(), sub);
}

/* Field-wise equality (struct padding makes memcmp unreliable): every
 * field of the key table (train/config_keys.h), and the ignored list. */
#define CMP_FIELD(f) &&a->f == b->f
#define CMP_NONE(f)
#define CMP_OBJECT CMP_NONE
#define CMP_OBJECT_ON CMP_FIELD
#define CMP_INT CMP_FIELD
#define CMP_I64 CMP_FIELD
#define CMP_SEED CMP_FIELD
#define CMP_NUM CMP_FIELD
#define CMP_BOOL CMP_FIELD
#define CMP_BETAS(f)                                                                         \
    &&a->optimizer.beta1 == b->optimizer.beta1 && a->optimizer.beta2 == b->optimizer.beta2
#define CMP_OPT_TYPE CMP_NONE
#define CMP_SCHED_TYPE CMP_FIELD
#define CMP_WARMUP_TYPE CMP_FIELD
#define CMP_DATA_ORDER CMP_FIELD
#define CMP_FAMILY CMP_FIELD
#define CMP_HF_ARCH CMP_FIELD
#define CMP_STAGE CMP_FIELD
#define CMP_KEEP_ACTS CMP_FIELD
#define CMP_IGNORED CMP_NONE
#define CMP_KEY(path, kind, field, lo, hi, def, sched, doc) CMP_##kind(field)
static int cfg_equal(const zpp_train_config *a, const zpp_train_config *b) {
    return strcmp(a->ignored, b->ignored) == 0 ZPP_CONFIG_KEYS(CMP_KEY);
}
/* Names the fields that differ, on stderr (for a failure's message). */
#define DIFF_KEY(path, kind, field, lo, hi, def, sched, doc)                                  \
    if (!(1 CMP_##kind(field))) fprintf(stderr, "  differs: %s\n", path);
static void cfg_print_differences(const zpp_train_config *a, const zpp_train_config *b) {
    ZPP_CONFIG_KEYS(DIFF_KEY)
}

/* Every key of the table, by kind, for the tests that walk it. */
#define KEY_ENTRY(path, kind, field, lo, hi, def, sched, doc) {path, #kind},
static const struct {
    const char *path, *kind;
} all_keys[] = {ZPP_CONFIG_KEYS(KEY_ENTRY)};
#define N_KEYS (sizeof all_keys / sizeof all_keys[0])

static const char *key_name(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

static int irand(zpp_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(zpp_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

static char *write_temp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/zpp_test_cfg_XXXXXX");
    int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp: %s", strerror(errno));
    size_t n = strlen(text);
    EXPECT(write(fd, text, n) == (ssize_t)n);
    close(fd);
    return path;
}

/* ------------------------------------------------------------------------ */

static void test_defaults_valid(void) {
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    EXPECT_OK(zpp_train_config_validate(&cfg));
    EXPECT(cfg.model.n_layer == 2 && cfg.model.n_head == 4 && cfg.model.n_embd == 64 &&
           cfg.model.seq_len == 64 && cfg.model.vocab_size == 256);
    EXPECT(cfg.zero.stage == 3 && cfg.zero.hpz_partition_size == 1 &&
           !cfg.zero.quantized_weights && !cfg.zero.quantized_gradients);
    EXPECT(cfg.zero.max_reuse_distance == 1000000000, "DeepSpeed's default reuse distance");
    EXPECT(cfg.scheduler.type == ZPP_SCHED_NONE && cfg.ignored[0] == '\0');
    /* An empty object changes nothing. */
    zpp_train_config same = cfg;
    EXPECT_OK(zpp_train_config_load_string("{}", &same));
    EXPECT(cfg_equal(&cfg, &same));
    /* No batch key: the default micro-batch, no accumulation. */
    EXPECT_OK(zpp_train_config_resolve(&cfg, 3));
    EXPECT(cfg.train_micro_batch_size_per_gpu == ZPP_TRAIN_DEFAULT_MICRO_BATCH &&
           cfg.gradient_accumulation_steps == 1 &&
           cfg.train_batch_size == 3 * ZPP_TRAIN_DEFAULT_MICRO_BATCH);
    /* Resolving again for the same world is a no-op. */
    zpp_train_config again = cfg;
    EXPECT_OK(zpp_train_config_resolve(&again, 3));
    EXPECT(cfg_equal(&cfg, &again));
    /* Constant lr without a scheduler. */
    EXPECT(zpp_train_lr(&cfg, 0) == cfg.optimizer.lr && zpp_train_lr(&cfg, 12345) == cfg.optimizer.lr);
}

/* Every key, with fresh random values, written to a file and read back. */
static void test_every_key_parsed(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    char seen[4096] = ""; /* one trial's text, for the coverage check below */
    for (int trial = 0; trial < 20; trial++) {
        int n_head = irand(&r, 1, 16), n_embd = n_head * irand(&r, 1, 32);
        int n_layer = irand(&r, 1, 48), seq_len = irand(&r, 1, 4096),
            vocab = irand(&r, 1, 100000), real_vocab = irand(&r, 0, vocab);
        int mb = irand(&r, 1, 64), gas = irand(&r, 1, 16), world = irand(&r, 1, 8);
        int hpz = irand(&r, 1, 8), spp = irand(&r, 0, 100);
        double lr = 1e-5 + zpp_rng_uniform(&r) * 1e-2, b1 = zpp_rng_uniform(&r) * 0.99,
               b2 = zpp_rng_uniform(&r) * 0.9999, eps = 1e-10 + zpp_rng_uniform(&r) * 1e-6,
               wd = zpp_rng_uniform(&r) * 0.3, clip = zpp_rng_uniform(&r) * 5;
        int W = irand(&r, 0, 500), N = W + irand(&r, 1, 5000);
        double wmr = zpp_rng_uniform(&r), cmr = zpp_rng_uniform(&r);
        int bf16 = irand(&r, 0, 1), qw = irand(&r, 0, 1), qg = irand(&r, 0, 1);
        int steps = irand(&r, 1, 100000), ev = irand(&r, 0, 1000), eb = irand(&r, 1, 64);
        int kc = irand(&r, 1, 9);
        int se = irand(&r, 0, 1000), stok = irand(&r, 1, 65536);
        long long seed = (long long)(zpp_rng_u64(&r) >> 11); /* < 2^53 */
        int linear = irand(&r, 0, 1);
        double cts = trial % 4 ? zpp_rng_uniform(&r) * 3600 : 0; /* 0 = wait forever */
        double sts = trial % 3 ? zpp_rng_uniform(&r) * 7200 : 0;
        int prune = irand(&r, 0, 1);
        long long reuse = (long long)(zpp_rng_u64(&r) >> 24); /* < 2^40 */
        int pdepth = irand(&r, 1, 8), rdepth = irand(&r, 1, 8), qvec = irand(&r, 0, 1);
        int resw = irand(&r, 0, 1);
        int wgr = irand(&r, 0, 1);
        /* qgZ error feedback needs qgZ; the last trial (the coverage text) has both */
        if (trial == 19) qg = 1;
        double ebeta = zpp_rng_uniform(&r);
        int resetT = irand(&r, 1, 100000), loco = qg && irand(&r, 0, 3) > 0;
        if (trial == 19) loco = 1;
        int sr = qg && (trial == 19 || irand(&r, 0, 1));
        char loco_txt[240] = "";
        if (loco)
            snprintf(loco_txt, sizeof loco_txt,
                     ",\n      \"zeropp_loco_param\": {\"err_beta\": %.17g, \"reset_T\": %d}",
                     ebeta, resetT);
        if (sr)
            strcat(loco_txt, ",\n      \"zeropp_grad_stochastic_rounding\": true");
        /* E2M1 is the default: the key written only to turn it off */
        int e2m1 = trial == 19 ? 0 : irand(&r, 0, 1);
        if (!e2m1) strcat(loco_txt, ",\n      \"zeropp_grad_e2m1\": false");
        int sequential = irand(&r, 0, 1), decay_all = irand(&r, 0, 1), ckpt = irand(&r, 0, 1);
        /* keep_activations: false, true or a word (family.h's bits) */
        const int keep_acts = irand(&r, 0, 3);
        const char *keep_txt[4] = {"false", "\"layernorm\"", "\"gelu\"", "true"};
        /* model.family: a llama takes its keys (their values are the
         * factory's to check) and samples nothing; a gpt2 takes them as 0 */
        const int llama = irand(&r, 0, 1);
        const int kvh = llama ? irand(&r, 0, n_head) : 0, ffn = llama ? irand(&r, 0, 1000) : 0;
        const int untied = llama ? irand(&r, 0, 1) : 0, qkvb = llama ? irand(&r, 0, 1) : 0;
        const int ob = llama ? irand(&r, 0, 1) : 0, arch = llama ? irand(&r, 0, 2) : 0;
        const int win = arch ? seq_len + irand(&r, 0, 100) : 0; /* >= seq_len: Mistral's rule */
        const int rorig = llama ? irand(&r, 0, 100000) : 0;
        const double theta = llama ? 1 + zpp_rng_uniform(&r) * 1e6 : 0;
        const double neps = llama ? zpp_rng_uniform(&r) * 1e-4 : 0;
        const double rf = llama ? zpp_rng_uniform(&r) * 8 : 0;
        const double rlo = llama ? zpp_rng_uniform(&r) : 0, rhi = llama ? 1 + rlo : 0;
        if (llama) se = 0;
        double peak = trial % 3 ? zpp_rng_uniform(&r) * 2000 : 0; /* 0 = the GPU's preset */
        char json[4096];
        snprintf(json, sizeof json,
                 "{\n"
                 "  \"train_batch_size\": %d,\n"
                 "  \"train_micro_batch_size_per_gpu\": %d,\n"
                 "  \"gradient_accumulation_steps\": %d,\n"
                 "  \"steps_per_print\": %d,\n"
                 "  \"gradient_clipping\": %.17g,\n"
                 "  \"wall_clock_breakdown\": false,\n"
                 "  \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": %.17g,\n"
                 "      \"betas\": [%.17g, %.17g], \"eps\": %.17g, \"weight_decay\": %.17g}},\n"
                 "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\n"
                 "      \"total_num_steps\": %d, \"warmup_num_steps\": %d,\n"
                 "      \"warmup_min_ratio\": %.17g, \"cos_min_ratio\": %.17g,\n"
                 "      \"warmup_type\": \"%s\"}},\n"
                 "  \"bf16\": {\"enabled\": %s},\n"
                 "  \"fp16\": {\"enabled\": false, \"loss_scale\": 0,\n"
                 "      \"initial_scale_power\": 16,\n"
                 "      \"loss_scale_window\": 1000, \"hysteresis\": 2,\n"
                 "      \"consecutive_hysteresis\": false, \"min_loss_scale\": 1},\n"
                 "  \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": %s,\n"
                 "      \"zero_hpz_partition_size\": %d, \"zero_quantized_gradients\": %s,\n"
                 "      \"overlap_comm\": true, \"reduce_bucket_size\": 5e8,\n"
                 "      \"stage3_max_reuse_distance\": %lld,\n"
                 "      \"zeropp_prefetch_depth\": %d, \"zeropp_reduce_depth\": %d,\n"
                 "      \"zeropp_quantize_vectors\": %s, \"zeropp_resident_weights\": %s,\n"
                 "      \"zeropp_work_grads\": %s%s},\n"
                 "  \"model\": {\"family\": \"%s\",\n"
                 "      \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d,\n"
                 "      \"seq_len\": %d, \"vocab_size\": %d, \"real_vocab_size\": %d,\n"
                 "      \"n_kv_head\": %d, \"n_ffn\": %d, \"rope_theta\": %.17g,\n"
                 "      \"norm_eps\": %.17g,\n"
                 "      \"untied_head\": %s, \"qkv_bias\": %s, \"o_bias\": %s,\n"
                 "      \"hf_architecture\": \"%s\", \"hf_sliding_window\": %d,\n"
                 "      \"rope_factor\": %.17g,\n"
                 "      \"rope_low_freq_factor\": %.17g, \"rope_high_freq_factor\": %.17g,\n"
                 "      \"rope_original_max_pos\": %d},\n"
                 "  \"zeropp\": {\"train_steps\": %d, \"seed\": %lld, \"eval_every\": %d,\n"
                 "      \"eval_batches\": %d, \"max_consecutive_skips\": 5,\n"
                 "      \"sample_every\": %d, \"sample_tokens\": %d,\n"
                 "      \"keep_checkpoints\": %d, \"collective_timeout_s\": %.17g,\n"
                 "      \"save_timeout_s\": %.17g, \"prune_newer\": %s,\n"
                 "      \"data_order\": \"%s\", \"weight_decay_all\": %s,\n"
                 "      \"peak_tflops\": %.17g, \"activation_checkpointing\": %s,\n"
                 "      \"keep_activations\": %s}\n"
                 "}\n",
                 mb * gas * world, mb, gas, spp, clip, trial % 2 ? "AdamW" : "adamw", lr, b1,
                 b2, eps, wd, N, W, wmr, cmr, linear ? "linear" : "log",
                 bf16 ? "true" : "false", qw ? "true" : "false", hpz, qg ? "true" : "false",
                 reuse, pdepth, rdepth, qvec ? "true" : "false", resw ? "true" : "false",
                 wgr ? "true" : "false", loco_txt,
                 llama ? "llama" : "gpt2", n_layer, n_head, n_embd, seq_len, vocab, real_vocab,
                 kvh, ffn, theta, neps, untied ? "true" : "false", qkvb ? "true" : "false",
                 ob ? "true" : "false", zpp_hf_arch_name((zpp_hf_arch)arch), win, rf,
                 rlo, rhi, rorig, steps, seed, ev, eb, se, stok, kc, cts, sts,
                 prune ? "true" : "false", sequential ? "sequential" : "shuffled",
                 decay_all ? "true" : "false", peak, ckpt ? "true" : "false",
                 keep_txt[keep_acts]);
        zpp_train_config cfg, from_str;
        EXPECT_OK(zpp_train_config_defaults(&cfg));
        const char *path = write_temp(json);
        EXPECT_OK(zpp_train_config_load_file(path, &cfg));
        unlink(path);
        EXPECT(cfg.train_batch_size == mb * gas * world &&
               cfg.train_micro_batch_size_per_gpu == mb && cfg.gradient_accumulation_steps == gas);
        EXPECT(cfg.steps_per_print == spp && cfg.gradient_clipping == clip);
        EXPECT(cfg.optimizer.lr == lr && cfg.optimizer.beta1 == b1 && cfg.optimizer.beta2 == b2 &&
               cfg.optimizer.eps == eps && cfg.optimizer.weight_decay == wd);
        EXPECT(cfg.scheduler.type == ZPP_SCHED_WARMUP_COSINE_LR &&
               cfg.scheduler.total_num_steps == N && cfg.scheduler.warmup_num_steps == W &&
               cfg.scheduler.warmup_min_ratio == wmr && cfg.scheduler.cos_min_ratio == cmr &&
               cfg.scheduler.warmup_type == (linear ? ZPP_WARMUP_LINEAR : ZPP_WARMUP_LOG));
        EXPECT(cfg.bf16 == bf16 && cfg.zero.stage == 3 && cfg.zero.quantized_weights == qw &&
               cfg.zero.hpz_partition_size == hpz && cfg.zero.quantized_gradients == qg &&
               cfg.zero.max_reuse_distance == reuse && cfg.zero.prefetch_depth == pdepth &&
               cfg.zero.reduce_depth == rdepth && cfg.zero.quantize_vectors == qvec && cfg.zero.resident_weights == resw &&
               cfg.zero.work_grads == wgr &&
               cfg.zero.grad_stochastic == sr && cfg.zero.grad_e2m1 == e2m1);
        EXPECT(cfg.zero.loco == loco && (!loco || (cfg.zero.loco_err_beta == ebeta &&
                                                   cfg.zero.loco_reset_T == resetT)));
        EXPECT(cfg.model.n_layer == n_layer && cfg.model.n_head == n_head &&
               cfg.model.n_embd == n_embd && cfg.model.seq_len == seq_len &&
               cfg.model.vocab_size == vocab && cfg.model.real_vocab_size == real_vocab);
        const zpp_decoder_shape *x = &cfg.model_ext;
        EXPECT(cfg.model_family == (llama ? ZPP_FAMILY_LLAMA : ZPP_FAMILY_GPT2) &&
               x->n_kv_head == kvh && x->n_ffn == ffn && x->rope_theta == theta &&
               x->norm_eps == neps && x->untied_head == untied && x->qkv_bias == qkvb &&
               x->o_bias == ob && cfg.hf_architecture == (zpp_hf_arch)arch &&
               cfg.hf_sliding_window == win &&
               x->rope_factor == rf && x->rope_low_freq_factor == rlo &&
               x->rope_high_freq_factor == rhi && x->rope_original_max_pos == rorig);
        EXPECT(cfg.train_steps == steps && cfg.seed == (uint64_t)seed && cfg.eval_every == ev &&
               cfg.eval_batches == eb && cfg.keep_checkpoints == kc &&
               cfg.collective_timeout_s == cts && cfg.save_timeout_s == sts &&
               cfg.prune_newer == prune);
        EXPECT(cfg.sample_every == se && cfg.sample_tokens == stok);
        EXPECT(cfg.data_order == (sequential ? ZPP_DATA_ORDER_SEQUENTIAL : ZPP_DATA_ORDER_SHUFFLED) &&
               cfg.weight_decay_all == decay_all && cfg.peak_tflops == peak &&
               cfg.activation_checkpointing == ckpt && cfg.keep_activations == keep_acts);
        EXPECT(strcmp(cfg.ignored, "wall_clock_breakdown, "
                                   "zero_optimization.overlap_comm, "
                                   "zero_optimization.reduce_bucket_size") == 0,
               "ignored = '%s'", cfg.ignored);
        /* The string loader gives the same config. */
        EXPECT_OK(zpp_train_config_defaults(&from_str));
        EXPECT_OK(zpp_train_config_load_string(json, &from_str));
        EXPECT(cfg_equal(&cfg, &from_str));
        /* Loading the same text again does not repeat ignored keys. */
        EXPECT_OK(zpp_train_config_load_string(json, &from_str));
        EXPECT(cfg_equal(&cfg, &from_str), "ignored = '%s'", from_str.ignored);
        snprintf(seen, sizeof seen, "%s", json);
    }
    /* The other two scheduler types' params. */
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    const char *decay = "{\"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                        "{\"warmup_min_lr\": 1e-5, \"warmup_max_lr\": 3e-3, "
                        "\"warmup_num_steps\": 7, \"total_num_steps\": 90}}}";
    EXPECT_OK(zpp_train_config_load_string(decay, &cfg));
    EXPECT(cfg.scheduler.type == ZPP_SCHED_WARMUP_DECAY_LR && cfg.scheduler.warmup_min_lr == 1e-5 &&
           cfg.scheduler.warmup_max_lr == 3e-3 && cfg.scheduler.warmup_num_steps == 7 &&
           cfg.scheduler.total_num_steps == 90);
    EXPECT_OK(zpp_train_config_load_string("{\"scheduler\": {\"type\": \"warmuplr\"}}", &cfg));
    EXPECT(cfg.scheduler.type == ZPP_SCHED_WARMUP_LR);
    EXPECT(strcmp(zpp_sched_type_name(cfg.scheduler.type), "WarmupLR") == 0);
    /* Every key of the table (but the ignored knobs) is in these texts: a
     * key added to config_keys.h needs a value here too. */
    for (size_t i = 0; i < N_KEYS; i++) {
        if (!strcmp(all_keys[i].kind, "IGNORED")) continue;
        char quoted[96];
        snprintf(quoted, sizeof quoted, "\"%s\"", key_name(all_keys[i].path));
        EXPECT(strstr(seen, quoted) || strstr(decay, quoted), "key '%s' is not tested",
               all_keys[i].path);
    }
}

/* A second load applies over the first; a failed load changes nothing. */
static void test_load_applies_over(void) {
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    EXPECT_OK(zpp_train_config_load_string(
        "{\"model\": {\"n_layer\": 5}, \"optimizer\": {\"params\": {\"lr\": 0.02}}}", &cfg));
    EXPECT_OK(zpp_train_config_load_string(
        "{\"model\": {\"n_head\": 8}, \"optimizer\": {\"params\": {\"eps\": 1e-6}}}", &cfg));
    EXPECT(cfg.model.n_layer == 5 && cfg.model.n_head == 8 && cfg.model.n_embd == 64);
    EXPECT(cfg.optimizer.lr == 0.02 && cfg.optimizer.eps == 1e-6 && cfg.optimizer.beta1 == 0.9);
    zpp_train_config before = cfg;
    /* The first key is valid and would apply; the second fails. */
    EXPECT_STATUS(zpp_train_config_load_string(
                      "{\"model\": {\"n_layer\": 9}, \"zero_optimization\": {\"stge\": 3}}", &cfg),
                  ZPP_ERR_CONFIG);
    EXPECT(cfg_equal(&before, &cfg), "a failed load changed the config");
    /* A value valid alone but not with the rest (n_embd 64 % n_head 5) is
     * refused by the whole-config validation, also leaving cfg as it was. */
    EXPECT_STATUS(zpp_train_config_load_string("{\"model\": {\"n_head\": 5}}", &cfg),
                  ZPP_ERR_CONFIG);
    EXPECT_MSG("model.n_embd");
    EXPECT(cfg_equal(&before, &cfg));
}

static void test_unknown_key_named(void) {
    expect_load_fails("{\"zero_optimization\": {\"stge\": 3}}", ZPP_ERR_CONFIG,
                      "unknown key 'zero_optimization.stge'");
    expect_load_fails("{\"train_batch_sise\": 8}", ZPP_ERR_CONFIG,
                      "unknown key 'train_batch_sise'");
    expect_load_fails("{\"optimizer\": {\"params\": {\"learning_rate\": 1}}}", ZPP_ERR_CONFIG,
                      "unknown key 'optimizer.params.learning_rate'");
    expect_load_fails("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup\": 1}}}",
                      ZPP_ERR_CONFIG, "unknown key 'scheduler.params.warmup'");
    expect_load_fails("{\"model\": {\"n_layers\": 2}}", ZPP_ERR_CONFIG,
                      "unknown key 'model.n_layers'");
    expect_load_fails("{\"zeropp\": {\"steps\": 2}}", ZPP_ERR_CONFIG, "unknown key 'zeropp.steps'");
    expect_load_fails("{\"bf16\": {\"enable\": true}}", ZPP_ERR_CONFIG,
                      "unknown key 'bf16.enable'");
    /* A param of another scheduler type is refused, naming it. */
    expect_load_fails("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                      "{\"cos_min_ratio\": 0.1}}}",
                      ZPP_ERR_CONFIG, "'scheduler.params.cos_min_ratio' does not apply to "
                                      "scheduler type WarmupLR");
    expect_load_fails("{\"scheduler\": {\"params\": {\"warmup_num_steps\": 3}}}", ZPP_ERR_CONFIG,
                      "without 'scheduler.type'");
    expect_load_fails("{\"model\": {\"n_layer\": 2, \"n_layer\": 3}}", ZPP_ERR_CONFIG,
                      "duplicate key 'model.n_layer'");
    /* In every object of the table (and at the top), an unknown key is
     * named with its path and the message lists every key known there. */
    for (size_t o = 0; o <= N_KEYS; o++) {
        const char *obj = o < N_KEYS ? all_keys[o].path : "";
        if (o < N_KEYS && strcmp(all_keys[o].kind, "OBJECT")) continue;
        /* {"a": {"b": {"zz_unknown": 1}}}, with a scheduler type so that
         * scheduler.params may be given. */
        char json[512] = "", tail[64] = "", want[192];
        int depth = 0, in_sched = 0;
        const char *typed = "\"type\": \"WarmupCosineLR\", ";
        for (const char *p = obj; *p; depth++) {
            const char *dot = strchr(p, '.');
            size_t n = dot ? (size_t)(dot - p) : strlen(p);
            size_t len = strlen(json);
            snprintf(json + len, sizeof json - len, "{%s\"%.*s\": ", in_sched ? typed : "",
                     (int)n, p);
            in_sched = depth == 0 && n == 9 && !strncmp(p, "scheduler", n);
            p = dot ? dot + 1 : p + n;
        }
        size_t len = strlen(json);
        snprintf(json + len, sizeof json - len, "{%s\"zz_unknown\": 1}", in_sched ? typed : "");
        for (int d = 0; d < depth; d++) strcat(tail, "}");
        strcat(json, tail);
        snprintf(want, sizeof want, "unknown key '%s%szz_unknown'", obj, obj[0] ? "." : "");
        expect_load_fails(json, ZPP_ERR_CONFIG, want);
        for (size_t i = 0; i < N_KEYS; i++) {
            const char *path = all_keys[i].path, *name = key_name(path);
            size_t plen = (size_t)(name - path);
            int in_obj = plen ? strlen(obj) == plen - 1 && !strncmp(path, obj, plen - 1) : !obj[0];
            if (in_obj)
                EXPECT(HAS(name), "%s: '%s' not listed in '%s'", json, name, zpp_last_error());
        }
    }
}

static void test_wrong_type_named(void) {
    expect_load_fails("{\"model\": {\"n_layer\": \"2\"}}", ZPP_ERR_CONFIG,
                      "'model.n_layer' must be an integer, got a string");
    expect_load_fails("{\"model\": {\"n_layer\": 2.5}}", ZPP_ERR_CONFIG,
                      "'model.n_layer' must be an integer, got 2.5");
    expect_load_fails("{\"optimizer\": {\"params\": {\"lr\": \"1e-3\"}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.lr' must be a number, got a string");
    expect_load_fails("{\"bf16\": {\"enabled\": 1}}", ZPP_ERR_CONFIG,
                      "'bf16.enabled' must be a boolean (true/false), got a number");
    expect_load_fails("{\"zero_optimization\": []}", ZPP_ERR_CONFIG,
                      "'zero_optimization' must be an object, got an array");
    expect_load_fails("{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.betas' must be an array of 2 numbers");
    expect_load_fails("{\"optimizer\": {\"params\": {\"betas\": [0.9, null]}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.betas[1]' must be a number, got null");
    expect_load_fails("{\"scheduler\": {\"type\": 3}}", ZPP_ERR_CONFIG,
                      "'scheduler.type' must be a string, got a number");
    expect_load_fails("{\"zeropp\": {\"seed\": -1}}", ZPP_ERR_CONFIG, "'zeropp.seed' is -1");
    expect_load_fails("[1, 2]", ZPP_ERR_CONFIG, "top level must be a JSON object, got an array");
}

static void test_malformed_json_line_col(void) {
    /* Line 3 lacks the ':' after the key: cJSON stops at the first byte it
     * cannot use, the '1' of 10 at column 21. */
    const char *bad = "{\n  \"train_batch_size\": 8,\n  \"steps_per_print\" 10\n}\n";
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    EXPECT_STATUS(zpp_train_config_load_string(bad, &cfg), ZPP_ERR_FORMAT);
    EXPECT_MSG("<string>: malformed JSON at line 3, column 21 (near '10')");
    /* Same from a file: the message names the file. */
    const char *path = write_temp(bad);
    char want[128];
    EXPECT_STATUS(zpp_train_config_load_file(path, &cfg), ZPP_ERR_FORMAT);
    snprintf(want, sizeof want, "%s: malformed JSON at line 3, column 21", path);
    EXPECT_MSG(want);
    unlink(path);
    /* A character that starts no JSON value, on line 2, column 8. */
    EXPECT_STATUS(zpp_train_config_load_string("{\n  \"a\": @\n}", &cfg), ZPP_ERR_FORMAT);
    EXPECT_MSG("line 2, column 8 (near '@')");
    /* Input that stops early. */
    EXPECT_STATUS(zpp_train_config_load_string("{\"model\": {", &cfg), ZPP_ERR_FORMAT);
    EXPECT_MSG("line 1, column 12 (unexpected end of input)");
    EXPECT_STATUS(zpp_train_config_load_string("", &cfg), ZPP_ERR_FORMAT);
    /* Garbage after the object. */
    EXPECT_STATUS(zpp_train_config_load_string("{}\n\n  x", &cfg), ZPP_ERR_FORMAT);
    EXPECT_MSG("line 3, column 3");
}

static void test_missing_file(void) {
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    const char *path = "/nonexistent-zpp-dir/ds_config.json";
    EXPECT_STATUS(zpp_train_config_load_file(path, &cfg), ZPP_ERR_IO);
    EXPECT_MSG(path);
    EXPECT_MSG(strerror(ENOENT));
}

static void test_validation_errors(void) {
    expect_load_fails("{\"model\": {\"n_embd\": 65}}", ZPP_ERR_CONFIG,
                      "'model.n_embd' 65 is not divisible by 'model.n_head' 4");
    expect_load_fails("{\"model\": {\"n_layer\": 0}}", ZPP_ERR_CONFIG,
                      "'model.n_layer' is 0; it must be in [1, ");
    expect_load_fails("{\"model\": {\"seq_len\": -3}}", ZPP_ERR_CONFIG, "'model.seq_len' is -3");
    /* model.family: another name, a llama key for a gpt2 */
    expect_load_fails("{\"model\": {\"family\": \"gpt-2\"}}", ZPP_ERR_CONFIG,
                      "is 'gpt-2'; use \"gpt2\" or \"llama\"");
    expect_load_fails("{\"model\": {\"rope_theta\": 500000}}", ZPP_ERR_CONFIG,
                      "'model.rope_theta' is a key of the llama family");
    expect_load_fails("{\"train_batch_size\": 0}", ZPP_ERR_CONFIG, "'train_batch_size' is 0");
    expect_load_fails("{\"optimizer\": {\"params\": {\"lr\": 0}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.lr' must be > 0");
    expect_load_fails("{\"optimizer\": {\"params\": {\"lr\": -1e-3}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.lr' must be > 0");
    expect_load_fails("{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.betas[1]' must be in [0, 1)");
    expect_load_fails("{\"optimizer\": {\"params\": {\"betas\": [-0.1, 0.9]}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.betas[0]' must be in [0, 1)");
    expect_load_fails("{\"optimizer\": {\"params\": {\"eps\": 0}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.eps' must be > 0");
    expect_load_fails("{\"optimizer\": {\"params\": {\"weight_decay\": -0.5}}}", ZPP_ERR_CONFIG,
                      "'optimizer.params.weight_decay' must be >= 0");
    expect_load_fails("{\"gradient_clipping\": -1}", ZPP_ERR_CONFIG,
                      "'gradient_clipping' must be >= 0");
    /* 0 is the node (resolved by the trainer); below it nothing */
    expect_load_fails("{\"zero_optimization\": {\"zero_hpz_partition_size\": -1}}",
                      ZPP_ERR_CONFIG, "'zero_optimization.zero_hpz_partition_size' is -1");
    expect_load_fails("{\"zero_optimization\": {\"zeropp_prefetch_depth\": 9}}",
                      ZPP_ERR_CONFIG, "'zero_optimization.zeropp_prefetch_depth' is 9");
    expect_load_fails("{\"zero_optimization\": {\"stage3_max_reuse_distance\": -1}}",
                      ZPP_ERR_CONFIG, "'zero_optimization.stage3_max_reuse_distance' is -1");
    expect_load_fails("{\"zero_optimization\": {\"stage3_max_reuse_distance\": 1.5}}",
                      ZPP_ERR_CONFIG, "must be an integer");
    /* qgZ error feedback: err_beta outside [0, 1], reset_T < 1, without qgZ */
    const char *qg = "\"zero_quantized_gradients\": true";
    char lj[256];
    const char *bad_beta[] = {"1.5", "-0.1", "1.0000001"};
    for (int i = 0; i < 3; i++) {
        snprintf(lj, sizeof lj, "{\"zero_optimization\": {%s, \"zeropp_loco_param\": "
                 "{\"err_beta\": %s}}}", qg, bad_beta[i]);
        expect_load_fails(lj, ZPP_ERR_CONFIG,
                          "'zero_optimization.zeropp_loco_param.err_beta' must be in [0, 1]");
    }
    snprintf(lj, sizeof lj, "{\"zero_optimization\": {%s, \"zeropp_loco_param\": "
             "{\"reset_T\": 0}}}", qg);
    expect_load_fails(lj, ZPP_ERR_CONFIG, "'zero_optimization.zeropp_loco_param.reset_T' is 0");
    snprintf(lj, sizeof lj, "{\"zero_optimization\": {%s, \"zeropp_loco_param\": 0.8}}", qg);
    expect_load_fails(lj, ZPP_ERR_CONFIG, "zeropp_loco_param");
    expect_load_fails("{\"zero_optimization\": {\"zeropp_loco_param\": {}}}", ZPP_ERR_CONFIG,
                      "set 'zero_optimization.zero_quantized_gradients' to true");
    /* stochastic rounding of qgZ's int4 without qgZ */
    expect_load_fails("{\"zero_optimization\": {\"zeropp_grad_stochastic_rounding\": true}}",
                      ZPP_ERR_CONFIG, "'zero_optimization.zeropp_grad_stochastic_rounding' sets");
    {
        zpp_train_config c;
        EXPECT_OK(zpp_train_config_defaults(&c));
        EXPECT(!c.zero.loco, "error feedback is off unless zeropp_loco_param is given");
        snprintf(lj, sizeof lj, "{\"zero_optimization\": {%s, \"zeropp_loco_param\": {}}}", qg);
        EXPECT_OK(zpp_train_config_load_string(lj, &c));
        EXPECT(c.zero.loco && c.zero.loco_err_beta == 0.8 && c.zero.loco_reset_T == 1024,
               "DeepSpeed's defaults 0.8 and 1024");
    }
    expect_load_fails("{\"zeropp\": {\"eval_batches\": 0}}", ZPP_ERR_CONFIG,
                      "'zeropp.eval_batches' is 0");
    expect_load_fails("{\"zeropp\": {\"sample_tokens\": 0}}", ZPP_ERR_CONFIG,
                      "'zeropp.sample_tokens' is 0");
    expect_load_fails("{\"zeropp\": {\"sample_every\": -1}}", ZPP_ERR_CONFIG,
                      "'zeropp.sample_every' is -1");
    expect_load_fails("{\"zeropp\": {\"collective_timeout_s\": -1}}", ZPP_ERR_CONFIG,
                      "'zeropp.collective_timeout_s' must be >= 0 seconds");
    expect_load_fails("{\"zeropp\": {\"save_timeout_s\": -0.5}}", ZPP_ERR_CONFIG,
                      "'zeropp.save_timeout_s' must be >= 0 seconds");
    expect_load_fails("{\"zeropp\": {\"peak_tflops\": -1}}", ZPP_ERR_CONFIG,
                      "'zeropp.peak_tflops' must be >= 0");
    expect_load_fails("{\"zeropp\": {\"data_order\": \"random\"}}", ZPP_ERR_CONFIG,
                      "'zeropp.data_order' is 'random'; use \"shuffled\" or \"sequential\"");
    expect_load_fails("{\"zeropp\": {\"data_order\": 1}}", ZPP_ERR_CONFIG, "a string");
    expect_load_fails("{\"zeropp\": {\"keep_activations\": \"all\"}}", ZPP_ERR_CONFIG,
                      "'zeropp.keep_activations' is 'all'; use true (every output), false "
                      "(none), \"layernorm\" or \"gelu\"");
    expect_load_fails("{\"zeropp\": {\"keep_activations\": 1}}", ZPP_ERR_CONFIG,
                      "true, false, \"layernorm\" or \"gelu\"");
    expect_load_fails("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                      "{\"warmup_num_steps\": 100, \"total_num_steps\": 100}}}",
                      ZPP_ERR_CONFIG, "'scheduler.params.total_num_steps' (100) must exceed");
    /* total_num_steps 0: the schedule takes the run's length, which --steps
     * may still set after loading, so a configured train_steps (200 by
     * default) shorter than the warm-up (DeepSpeed's default, 1000) is no
     * error: such a run stays in its warm-up. */
    {
        zpp_train_config c;
        EXPECT_OK(zpp_train_config_defaults(&c));
        EXPECT_OK(zpp_train_config_load_string("{\"scheduler\": {\"type\": \"WarmupCosineLR\", "
                                               "\"params\": {\"warmup_type\": \"linear\"}}}",
                                               &c));
        EXPECT(c.scheduler.warmup_num_steps == 1000 && c.train_steps == 200);
        const double g = zpp_train_lr(&c, 199) / c.optimizer.lr;
        EXPECT(fabs(g - 199.0 / 1000) < 1e-12,
               "at the last of 200 steps the lr is %g of its peak; a warm-up of 1000 steps is "
               "0.199 through",
               g);
    }
    expect_load_fails("{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
                      "{\"warmup_num_steps\": 10, \"cos_min_ratio\": 1.5}}}",
                      ZPP_ERR_CONFIG, "'scheduler.params.cos_min_ratio' must be in [0, 1]");
    expect_load_fails("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                      "{\"warmup_min_lr\": 0.1, \"warmup_max_lr\": 0.01}}}",
                      ZPP_ERR_CONFIG, "'scheduler.params.warmup_min_lr' 0.1 must be in");
    expect_load_fails("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                      "{\"warmup_type\": \"cubic\"}}}",
                      ZPP_ERR_CONFIG, "'scheduler.params.warmup_type' is 'cubic'");
    expect_load_fails("{\"scheduler\": {\"type\": \"OneCycle\"}}", ZPP_ERR_UNSUPPORTED,
                      "scheduler.type 'OneCycle' is not supported");
    expect_load_fails("{\"optimizer\": {\"type\": \"Adam\"}}", ZPP_ERR_UNSUPPORTED,
                      "optimizer.type 'Adam' is not supported");
    expect_load_fails("{\"optimizer\": {\"type\": \"Lamb\"}}", ZPP_ERR_UNSUPPORTED,
                      "optimizer.type 'Lamb'");
    /* the softmax's vocabulary is at most the embedding's rows */
    expect_load_fails("{\"model\": {\"vocab_size\": 50, \"real_vocab_size\": 51}}",
                      ZPP_ERR_CONFIG, "'model.real_vocab_size' 51 is outside 0..'model.vocab_size' 50");
    /* The validator alone. */
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.model.vocab_size = 0;
    EXPECT_STATUS(zpp_train_config_validate(&cfg), ZPP_ERR_CONFIG);
    EXPECT_MSG("model.vocab_size");
}

static void test_fp16_keys_and_stage(void) {
    expect_load_fails("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                      ZPP_ERR_CONFIG, "enable one of them");
    expect_load_fails("{\"fp16\": {\"loss_scale\": -1}}", ZPP_ERR_CONFIG, "fp16.loss_scale");
    expect_load_fails("{\"fp16\": {\"min_loss_scale\": 0}}", ZPP_ERR_CONFIG,
                      "fp16.min_loss_scale");
    expect_load_fails("{\"fp16\": {\"hysteresis\": 0}}", ZPP_ERR_CONFIG, "fp16.hysteresis");
    expect_load_fails("{\"zeropp\": {\"max_consecutive_skips\": 0}}", ZPP_ERR_CONFIG,
                      "zeropp.max_consecutive_skips");
    {
        /* DeepSpeed's fp16 block, as its docs give it, loads unchanged */
        zpp_train_config c16;
        EXPECT_OK(zpp_train_config_defaults(&c16));
        EXPECT(c16.fp16.enabled == 0 && c16.fp16.loss_scale == 0 &&
               c16.fp16.initial_scale_power == 16 && c16.fp16.loss_scale_window == 1000 &&
               c16.fp16.hysteresis == 2 && c16.fp16.min_loss_scale == 1 &&
               c16.max_consecutive_skips == 5);
        EXPECT_OK(zpp_train_config_load_string(
            "{\"fp16\": {\"enabled\": true, \"auto_cast\": false, \"loss_scale\": 0,"
            " \"initial_scale_power\": 12, \"loss_scale_window\": 500, \"hysteresis\": 3,"
            " \"consecutive_hysteresis\": true, \"min_loss_scale\": 2}}",
            &c16));
        EXPECT(c16.fp16.enabled == 1 && c16.fp16.initial_scale_power == 12 &&
               c16.fp16.loss_scale_window == 500 && c16.fp16.hysteresis == 3 &&
               c16.fp16.consecutive_hysteresis == 1 && c16.fp16.min_loss_scale == 2 &&
               c16.bf16 == 0);
        EXPECT(strcmp(c16.ignored, "fp16.auto_cast") == 0, "ignored = '%s'", c16.ignored);
    }
    expect_load_fails("{\"zero_optimization\": {\"stage\": 2}}", ZPP_ERR_UNSUPPORTED,
                      "zero_optimization.stage is 2; zeropp implements ZeRO stage 3 only");
    expect_load_fails("{\"zero_optimization\": {\"stage\": 0}}", ZPP_ERR_UNSUPPORTED, "stage 3");
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    EXPECT_OK(zpp_train_config_load_string(
        "{\"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": true}, "
        "\"zero_optimization\": {\"stage\": 3}}",
        &cfg));
    EXPECT(cfg.bf16 == 1 && cfg.zero.stage == 3);
}

/* DeepSpeed's batch rules on random geometries: from every subset of the
 * three keys that DeepSpeed accepts, resolve must recover the rest. */
static void test_resolve_batch(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    for (int trial = 0; trial < 500; trial++) {
        int mb = irand(&r, 1, 32), gas = irand(&r, 1, 16), w = irand(&r, 1, 64);
        int tbs = mb * gas * w;
        for (int mask = 0; mask < 8; mask++) { /* bit0 tbs, bit1 mb, bit2 gas */
            zpp_train_config cfg;
            EXPECT_OK(zpp_train_config_defaults(&cfg));
            cfg.train_batch_size = mask & 1 ? tbs : 0;
            cfg.train_micro_batch_size_per_gpu = mask & 2 ? mb : 0;
            cfg.gradient_accumulation_steps = mask & 4 ? gas : 0;
            EXPECT_OK(zpp_train_config_resolve(&cfg, w));
            int want_mb = mb, want_gas = gas;
            if (mask == 1) want_mb = mb * gas, want_gas = 1;  /* TBS alone */
            if (mask == 2) want_gas = 1;                      /* MB alone */
            if (mask == 0 || mask == 4) want_mb = ZPP_TRAIN_DEFAULT_MICRO_BATCH;
            if (mask == 0) want_gas = 1;
            EXPECT(cfg.train_micro_batch_size_per_gpu == want_mb &&
                       cfg.gradient_accumulation_steps == want_gas &&
                       cfg.train_batch_size == want_mb * want_gas * w,
                   "mask %d: mb %d gas %d w %d -> %d %d %d", mask, mb, gas, w,
                   cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps,
                   cfg.train_batch_size);
        }
    }
    zpp_train_config cfg, before;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.train_batch_size = 10;
    cfg.train_micro_batch_size_per_gpu = 4;
    before = cfg;
    EXPECT_STATUS(zpp_train_config_resolve(&cfg, 2), ZPP_ERR_CONFIG);
    EXPECT_MSG("train_batch_size 10 is not divisible by micro-batch 4 x world 2");
    EXPECT(cfg_equal(&cfg, &before), "a failed resolve changed the config");
    cfg.train_micro_batch_size_per_gpu = 0;
    cfg.gradient_accumulation_steps = 3;
    EXPECT_STATUS(zpp_train_config_resolve(&cfg, 2), ZPP_ERR_CONFIG);
    EXPECT_MSG("train_batch_size 10 is not divisible by gradient accumulation 3 x world 2");
    cfg.gradient_accumulation_steps = 0;
    EXPECT_STATUS(zpp_train_config_resolve(&cfg, 4), ZPP_ERR_CONFIG);
    EXPECT_MSG("train_batch_size 10 is not divisible by world 4");
    cfg.train_batch_size = 16;
    cfg.train_micro_batch_size_per_gpu = 2;
    cfg.gradient_accumulation_steps = 2;
    EXPECT_STATUS(zpp_train_config_resolve(&cfg, 2), ZPP_ERR_CONFIG);
    EXPECT_MSG("train_batch_size 16 != micro-batch 2 x gradient accumulation 2 x world 2 = 8");
    EXPECT_OK(zpp_train_config_resolve(&cfg, 4));
    /* The hpZ node size must divide the world. */
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.zero.hpz_partition_size = 4;
    EXPECT_STATUS(zpp_train_config_resolve(&cfg, 6), ZPP_ERR_CONFIG);
    EXPECT_MSG("zero_hpz_partition_size 4 does not divide world size 6");
    EXPECT_OK(zpp_train_config_resolve(&cfg, 8));
    EXPECT_STATUS(zpp_train_config_resolve(&cfg, 0), ZPP_ERR_INVALID);
    /* 0 is the node, whatever it is: any world */
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.zero.hpz_partition_size = 0;
    EXPECT_OK(zpp_train_config_resolve(&cfg, 7));
}

/* Relative closeness for values computed by the same double formula in a
 * different order: a handful of ulps, so 1e-12 is generous and still far
 * below any schedule mistake (which moves lr by at least 1/(N-W)). */
static int close_rel(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(fabs(b), 1e-300); }

static void test_lr_schedule(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    for (int trial = 0; trial < 200; trial++) {
        zpp_train_config cfg;
        EXPECT_OK(zpp_train_config_defaults(&cfg));
        const double lr = 1e-4 + zpp_rng_uniform(&r) * 1e-2;
        const int W = irand(&r, 1, 60), N = W + 2 * irand(&r, 1, 150);
        const double a = zpp_rng_uniform(&r) * 0.5, b = zpp_rng_uniform(&r) * 0.5;
        cfg.optimizer.lr = lr;
        cfg.scheduler.type = ZPP_SCHED_WARMUP_COSINE_LR;
        cfg.scheduler.warmup_type = ZPP_WARMUP_LINEAR;
        cfg.scheduler.warmup_num_steps = W;
        cfg.scheduler.total_num_steps = N;
        cfg.scheduler.warmup_min_ratio = a;
        cfg.scheduler.cos_min_ratio = b;
        EXPECT_OK(zpp_train_config_validate(&cfg));
        /* Key steps: start of warm-up, peak, cosine midpoint, floor. */
        EXPECT(close_rel(zpp_train_lr(&cfg, 0), lr * a), "lr(0)=%g want %g", zpp_train_lr(&cfg, 0), lr * a);
        EXPECT(close_rel(zpp_train_lr(&cfg, -5), lr * a));
        EXPECT(close_rel(zpp_train_lr(&cfg, W), lr));
        EXPECT(close_rel(zpp_train_lr(&cfg, (W + N) / 2), lr * (b + (1 - b) / 2)));
        EXPECT(close_rel(zpp_train_lr(&cfg, N), lr * b));
        EXPECT(close_rel(zpp_train_lr(&cfg, N + 1000), lr * b));
        /* Linear warm-up: equal increments (1 - a) lr / W. */
        for (int s = 0; s < W; s++) {
            double d = zpp_train_lr(&cfg, s + 1) - zpp_train_lr(&cfg, s);
            EXPECT(fabs(d - (1 - a) * lr / W) <= 1e-12 * lr, "step %d: increment %g", s, d);
        }
        /* Cosine: non-increasing from W to N, and point-symmetric about the
         * midpoint: r(W + k) + r(N - k) = 2 r(mid), since
         * cos(pi p) + cos(pi (1 - p)) = 0. */
        const double mid = lr * (b + (1 - b) / 2);
        for (int k = 0; k <= N - W; k++) {
            double x = zpp_train_lr(&cfg, W + k), y = zpp_train_lr(&cfg, N - k);
            EXPECT(fabs(x + y - 2 * mid) <= 1e-12 * lr, "k %d: %g + %g vs %g", k, x, y, 2 * mid);
            if (k > 0) EXPECT(x <= zpp_train_lr(&cfg, W + k - 1));
        }
        /* The cosine's slope is zero at both ends and steepest in the middle:
         * the first decrement is smaller than the middle one. */
        if (N - W >= 8) {
            double d0 = zpp_train_lr(&cfg, W) - zpp_train_lr(&cfg, W + 1);
            double dm = zpp_train_lr(&cfg, (W + N) / 2 - 1) - zpp_train_lr(&cfg, (W + N) / 2);
            EXPECT(d0 < dm);
        }
        /* total_num_steps 0 means zeropp.train_steps. */
        zpp_train_config via_steps = cfg;
        via_steps.scheduler.total_num_steps = 0;
        via_steps.train_steps = N;
        for (int s = 0; s < N + 3; s += 7)
            EXPECT(zpp_train_lr(&via_steps, s) == zpp_train_lr(&cfg, s));

        /* Log warm-up: g(s) = ln(s + 1) / ln(W); reaches the peak at W - 1,
         * rises by shrinking increments (ln is concave). */
        cfg.scheduler.warmup_type = ZPP_WARMUP_LOG;
        EXPECT(close_rel(zpp_train_lr(&cfg, 0), lr * a));
        if (W >= 2) EXPECT(close_rel(zpp_train_lr(&cfg, W - 1), lr));
        if (W >= 3) {
            double g1 = log(2.0) / log((double)W);
            EXPECT(close_rel(zpp_train_lr(&cfg, 1), lr * (a + (1 - a) * g1)));
        }
        for (int s = 1; s + 1 < W; s++) {
            double d1 = zpp_train_lr(&cfg, s) - zpp_train_lr(&cfg, s - 1);
            double d2 = zpp_train_lr(&cfg, s + 1) - zpp_train_lr(&cfg, s);
            EXPECT(d2 <= d1 && d2 >= 0);
        }

        /* WarmupLR: min_lr -> max_lr, then flat; the optimizer lr is unused. */
        const double lo = zpp_rng_uniform(&r) * 1e-4, hi = lo + 1e-4 + zpp_rng_uniform(&r) * 1e-2;
        cfg.scheduler.type = ZPP_SCHED_WARMUP_LR;
        cfg.scheduler.warmup_type = ZPP_WARMUP_LINEAR;
        cfg.scheduler.warmup_min_lr = lo;
        cfg.scheduler.warmup_max_lr = hi;
        EXPECT_OK(zpp_train_config_validate(&cfg));
        EXPECT(close_rel(zpp_train_lr(&cfg, 0), lo));
        EXPECT(close_rel(zpp_train_lr(&cfg, W), hi));
        EXPECT(zpp_train_lr(&cfg, N + 10000) == hi);
        if (W % 2 == 0) EXPECT(close_rel(zpp_train_lr(&cfg, W / 2), (lo + hi) / 2));
        /* WarmupDecayLR: the same warm-up, then linearly to 0 at N. */
        cfg.scheduler.type = ZPP_SCHED_WARMUP_DECAY_LR;
        EXPECT(close_rel(zpp_train_lr(&cfg, W), hi));
        EXPECT(close_rel(zpp_train_lr(&cfg, (W + N) / 2), hi / 2));
        EXPECT(zpp_train_lr(&cfg, N) == 0 && zpp_train_lr(&cfg, N + 5) == 0);
        for (int s = W + 1; s <= N; s++)
            EXPECT(zpp_train_lr(&cfg, s) < zpp_train_lr(&cfg, s - 1));
    }
    /* W = 0: no warm-up, the cosine starts at the peak. */
    zpp_train_config cfg;
    EXPECT_OK(zpp_train_config_defaults(&cfg));
    cfg.scheduler.type = ZPP_SCHED_WARMUP_COSINE_LR;
    cfg.scheduler.warmup_num_steps = 0;
    cfg.scheduler.total_num_steps = 10;
    cfg.scheduler.cos_min_ratio = 0;
    EXPECT(zpp_train_lr(&cfg, 0) == cfg.optimizer.lr);
    EXPECT(fabs(zpp_train_lr(&cfg, 5) - cfg.optimizer.lr / 2) < 1e-15);
    EXPECT(zpp_train_lr(&cfg, 10) == 0);
}

/* ---- Writing a config back, overriding keys, listing what changed -------- */

/* A random valid config in which every key has a fresh value where the
 * config uses it: one of the four schedules (its own params only), error
 * feedback on or off (its params only when on), batch sizes given or left
 * to be derived. */
static void random_config(zpp_rng *r, zpp_train_config *c) {
    EXPECT_OK(zpp_train_config_defaults(c));
    if (irand(r, 0, 1)) c->train_micro_batch_size_per_gpu = irand(r, 1, 16);
    if (irand(r, 0, 1)) c->gradient_accumulation_steps = irand(r, 1, 8);
    if (irand(r, 0, 2) == 0) c->train_batch_size = irand(r, 1, 512);
    c->steps_per_print = irand(r, 0, 100);
    c->gradient_clipping = zpp_rng_uniform(r) * 3;
    c->optimizer.lr = 1e-6 + zpp_rng_uniform(r) * 1e-2;
    c->optimizer.beta1 = zpp_rng_uniform(r) * 0.999;
    c->optimizer.beta2 = zpp_rng_uniform(r) * 0.999;
    c->optimizer.eps = 1e-12 + zpp_rng_uniform(r) * 1e-6;
    c->optimizer.weight_decay = zpp_rng_uniform(r) * 0.2;
    c->scheduler.type = (zpp_sched_type)irand(r, 0, 3);
    if (c->scheduler.type != ZPP_SCHED_NONE) {
        c->scheduler.warmup_type = (zpp_warmup_type)irand(r, 0, 1);
        c->scheduler.warmup_num_steps = irand(r, 0, 300);
        if (c->scheduler.type != ZPP_SCHED_WARMUP_LR && irand(r, 0, 1))
            c->scheduler.total_num_steps = c->scheduler.warmup_num_steps + irand(r, 1, 1000);
        if (c->scheduler.type != ZPP_SCHED_WARMUP_COSINE_LR) {
            c->scheduler.warmup_max_lr = 1e-5 + zpp_rng_uniform(r) * 1e-2;
            c->scheduler.warmup_min_lr = zpp_rng_uniform(r) * c->scheduler.warmup_max_lr;
        } else {
            c->scheduler.warmup_min_ratio = zpp_rng_uniform(r);
            c->scheduler.cos_min_ratio = zpp_rng_uniform(r);
        }
    }
    if (irand(r, 0, 1)) c->bf16 = 1;
    else if (irand(r, 0, 1)) {
        c->fp16.enabled = 1;
        c->fp16.loss_scale = irand(r, 0, 1) ? 0 : 1 + zpp_rng_uniform(r) * 1e4;
        c->fp16.initial_scale_power = irand(r, 0, 32);
        c->fp16.loss_scale_window = irand(r, 1, 5000);
        c->fp16.hysteresis = irand(r, 1, 8);
        c->fp16.consecutive_hysteresis = irand(r, 0, 1);
        c->fp16.min_loss_scale = 0.25 + zpp_rng_uniform(r);
    }
    c->zero.quantized_weights = irand(r, 0, 1);
    c->zero.hpz_partition_size = irand(r, 0, 8);
    c->zero.quantized_gradients = irand(r, 0, 1);
    c->zero.max_reuse_distance = (long long)(zpp_rng_u64(r) >> 30);
    c->zero.prefetch_depth = irand(r, 1, 8);
    c->zero.reduce_depth = irand(r, 1, 8);
    if (c->zero.quantized_gradients) {
        c->zero.grad_stochastic = irand(r, 0, 1);
        c->zero.grad_e2m1 = irand(r, 0, 1);
        if ((c->zero.loco = irand(r, 0, 1))) {
            c->zero.loco_err_beta = zpp_rng_uniform(r);
            c->zero.loco_reset_T = irand(r, 1, 5000);
        }
    }
    c->zero.quantize_vectors = irand(r, 0, 1);
    c->model.n_head = irand(r, 1, 8);
    c->model.n_embd = c->model.n_head * irand(r, 1, 16);
    c->model.n_layer = irand(r, 1, 12);
    c->model.seq_len = irand(r, 1, 1024);
    c->model.vocab_size = irand(r, 1, 60000);
    c->model.real_vocab_size = irand(r, 0, c->model.vocab_size);
    c->train_steps = irand(r, 1, 100000);
    c->seed = zpp_rng_u64(r) >> 11;
    c->eval_every = irand(r, 0, 500);
    c->eval_batches = irand(r, 1, 64);
    c->max_consecutive_skips = irand(r, 1, 20);
    c->keep_checkpoints = irand(r, 1, 9);
    c->collective_timeout_s = zpp_rng_uniform(r) * 1000;
    c->save_timeout_s = irand(r, 0, 1) ? zpp_rng_uniform(r) * 7200 : 0;
    c->prune_newer = irand(r, 0, 1);
    c->peak_tflops = irand(r, 0, 1) ? zpp_rng_uniform(r) * 1000 : 0;
    c->data_order = (zpp_data_order)irand(r, 0, 1);
    c->weight_decay_all = irand(r, 0, 1);
    c->activation_checkpointing = irand(r, 0, 1);
    c->keep_activations = irand(r, 0, ZPP_KEEP_ALL);
    EXPECT_OK(zpp_train_config_validate(c));
}

/* What a checkpoint keeps of a config (zpp_train_config_to_json) reads back
 * into the same config, field for field, for random configs: every number
 * exact. A key the config does not use (a param of another scheduler, error
 * feedback's while it is off, a batch size left to be derived) is not in
 * the text. */
static void test_config_json_round_trip(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(7));
    for (int trial = 0; trial < 300; trial++) {
        zpp_train_config c, back;
        random_config(&r, &c);
        char *text = zpp_train_config_to_json(&c);
        EXPECT(text != NULL);
        EXPECT_OK(zpp_train_config_defaults(&back));
        zpp_status st = zpp_train_config_load_string(text, &back);
        EXPECT(st == ZPP_OK, "%s does not load: %s", text, zpp_last_error());
        if (!cfg_equal(&c, &back)) cfg_print_differences(&c, &back);
        EXPECT(cfg_equal(&c, &back), "trial %d: %s reads back differently", trial, text);
        if (c.scheduler.type == ZPP_SCHED_NONE) EXPECT(!strstr(text, "\"scheduler\""), "%s", text);
        if (c.scheduler.type == ZPP_SCHED_WARMUP_LR)
            EXPECT(!strstr(text, "cos_min_ratio") && !strstr(text, "total_num_steps"), "%s", text);
        if (!c.zero.loco) EXPECT(!strstr(text, "zeropp_loco_param"), "%s", text);
        if (!c.train_batch_size) EXPECT(!strstr(text, "train_batch_size"), "%s", text);
        free(text);
    }
}

/* --set: a key by its dotted path, over what was there; a later one of the
 * same key wins; words bare; all checked together; an unknown key named
 * with the likeliest one meant; on any error nothing changes. */
static void test_config_set(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(8));
    for (int trial = 0; trial < 50; trial++) {
        zpp_train_config c, want;
        random_config(&r, &c);
        want = c;
        double lr = 1e-6 + zpp_rng_uniform(&r), b2 = zpp_rng_uniform(&r) * 0.999;
        int qw = irand(&r, 0, 1), layers = irand(&r, 1, 40);
        char a0[96], a1[96], a2[96], a3[96];
        snprintf(a0, sizeof a0, "optimizer.params.lr=%.17g", 2 * lr); /* overridden below */
        snprintf(a1, sizeof a1, "optimizer.params.lr=%.17g", lr);
        snprintf(a2, sizeof a2, "zero_optimization.zero_quantized_weights=%s",
                 qw ? "true" : "false");
        snprintf(a3, sizeof a3, "model.n_layer=%d", layers);
        const char *betas = "optimizer.params.betas=[0.5, 0.25]";
        char b2s[96];
        snprintf(b2s, sizeof b2s, "optimizer.params.betas=[0.5,%.17g]", b2);
        const char *sets[] = {a0, a2, betas, a1, a3, b2s};
        EXPECT_OK(zpp_train_config_set(&c, sets, 6));
        want.optimizer.lr = lr;
        want.optimizer.beta1 = 0.5;
        want.optimizer.beta2 = b2;
        want.zero.quantized_weights = qw;
        want.model.n_layer = layers;
        if (!cfg_equal(&c, &want)) cfg_print_differences(&c, &want);
        EXPECT(cfg_equal(&c, &want), "trial %d: --set did not give the expected config", trial);
    }
    zpp_train_config c, before;
    EXPECT_OK(zpp_train_config_defaults(&c));
    /* a word bare, then that schedule's params; fp16 on with bf16 off, at once */
    const char *ok[] = {"scheduler.type=WarmupCosineLR", "scheduler.params.cos_min_ratio=0.25",
                        "bf16.enabled=true", "fp16.enabled=true", "bf16.enabled=false",
                        "zeropp.data_order=sequential", "zero_optimization.zero_quantized_gradients=true",
                        "zero_optimization.zeropp_loco_param={\"reset_T\": 7}",
                        "zeropp.keep_activations=true", "zeropp.keep_activations=layernorm"};
    EXPECT_OK(zpp_train_config_set(&c, ok, 10));
    EXPECT(c.scheduler.type == ZPP_SCHED_WARMUP_COSINE_LR && c.scheduler.cos_min_ratio == 0.25 &&
           c.fp16.enabled && !c.bf16 && c.data_order == ZPP_DATA_ORDER_SEQUENTIAL &&
           c.zero.loco && c.zero.loco_reset_T == 7 && c.keep_activations == ZPP_KEEP_LAYERNORM);
    before = c;
    const struct {
        const char *set, *needle;
    } bad[] = {
        {"optimizer.params.lrr=1", "did you mean 'optimizer.params.lr'?"},
        {"zero_optimization.stge=3", "did you mean 'zero_optimization.stage'?"},
        {"lr=1", "did you mean 'optimizer.params.lr'?"},
        {"zeropp.train_step=5", "did you mean 'zeropp.train_steps'?"},
        {"zzzz.qqqq=1", "unknown key 'zzzz'"},
        {"optimizer.params.lr=fast", "'fast' is not a value"},
        {"optimizer.params.lr=\"1\"", "'optimizer.params.lr' must be a number"},
        {"optimizer.params.lr=0", "must be > 0"},
        {"model.n_layer=1.5", "must be an integer"},
        {"scheduler.type=Cosine", "WarmupCosineLR"},
        {"zeropp.keep_activations=both", "\"layernorm\" or \"gelu\""},
        {"bf16.enabled=true", "both true"},
        {"noequals", "KEY=VALUE"},
        {"=3", "KEY=VALUE"},
        {"model.n_layer=", "KEY=VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zpp_error_clear();
        const char *one[] = {bad[i].set};
        EXPECT(zpp_train_config_set(&c, one, 1) != ZPP_OK, "--set %s was taken", bad[i].set);
        EXPECT(HAS(bad[i].needle) && HAS("--set"), "--set %s: '%s' lacks '%s'", bad[i].set,
               zpp_last_error(), bad[i].needle);
        EXPECT(cfg_equal(&c, &before), "--set %s changed the config", bad[i].set);
    }
    /* nothing close: no guess */
    const char *far[] = {"zzzz=1"};
    EXPECT(zpp_train_config_set(&c, far, 1) == ZPP_ERR_CONFIG && !HAS("did you mean"),
           "'%s'", zpp_last_error());
}

/* zpp_train_config_diff names exactly the keys that were changed, once
 * each, as "key: old -> new" (words unquoted), and nothing for equal
 * configs. */
static void test_config_diff(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(9));
    char out[8192];
    for (int trial = 0; trial < 100; trial++) {
        zpp_train_config a, b;
        random_config(&r, &a);
        b = a;
        EXPECT(zpp_train_config_diff(&a, &b, out, sizeof out) == 0 && out[0] == '\0', "%s", out);
        double lr = a.optimizer.lr * 2;
        int steps = a.train_steps + irand(&r, 1, 1000);
        b.optimizer.lr = lr;
        b.train_steps = steps;
        b.data_order = a.data_order == ZPP_DATA_ORDER_SHUFFLED ? ZPP_DATA_ORDER_SEQUENTIAL
                                                               : ZPP_DATA_ORDER_SHUFFLED;
        b.optimizer.weight_decay = a.optimizer.weight_decay + 0.5;
        b.gradient_clipping = a.gradient_clipping + 1;
        b.optimizer.beta2 = a.optimizer.beta2 / 2;
        EXPECT(zpp_train_config_diff(&a, &b, out, sizeof out) == 6, "trial %d: %s", trial, out);
        EXPECT(strstr(out, "optimizer.params.weight_decay: ") && strstr(out, "gradient_clipping: ") &&
                   strstr(out, "optimizer.params.betas: "),
               "%s", out);
        /* another schedule: its type, and its params that differ */
        b = a;
        b.scheduler.type = a.scheduler.type == ZPP_SCHED_WARMUP_LR ? ZPP_SCHED_WARMUP_DECAY_LR
                                                                   : ZPP_SCHED_WARMUP_LR;
        b.scheduler.warmup_max_lr = 1e-3;
        b.scheduler.warmup_min_lr = 0;
        EXPECT(zpp_train_config_diff(&a, &b, out, sizeof out) >= 1 &&
                   strstr(out, "scheduler.type: ") == out,
               "trial %d: %s", trial, out);
        b = a;
        b.optimizer.lr = lr;
        b.train_steps = steps;
        b.data_order = a.data_order == ZPP_DATA_ORDER_SHUFFLED ? ZPP_DATA_ORDER_SEQUENTIAL
                                                               : ZPP_DATA_ORDER_SHUFFLED;
        EXPECT(zpp_train_config_diff(&a, &b, out, sizeof out) == 3, "trial %d: %s", trial, out);
        char want[256];
        snprintf(want, sizeof want, "zeropp.train_steps: %d -> %d\n", a.train_steps, steps);
        EXPECT(strstr(out, want), "'%s' not in %s", want, out);
        snprintf(want, sizeof want, "zeropp.data_order: %s -> %s\n",
                 zpp_data_order_name(a.data_order), zpp_data_order_name(b.data_order));
        EXPECT(strstr(out, want), "'%s' not in %s", want, out);
        const char *p = strstr(out, "optimizer.params.lr: ");
        EXPECT(p, "%s", out);
        double x = 0, y = 0;
        EXPECT(sscanf(p, "optimizer.params.lr: %lf -> %lf", &x, &y) == 2 && x == a.optimizer.lr &&
                   y == lr,
               "%s: the numbers do not read back exactly", out);
    }
    /* a schedule switched off: its type's line only */
    zpp_train_config a, b;
    EXPECT_OK(zpp_train_config_defaults(&a));
    EXPECT_OK(zpp_train_config_load_string(
        "{\"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"cos_min_ratio\": 0.5}}}",
        &a));
    EXPECT_OK(zpp_train_config_defaults(&b));
    EXPECT(zpp_train_config_diff(&a, &b, out, sizeof out) == 1 &&
               !strcmp(out, "scheduler.type: WarmupCosineLR -> none\n"),
           "%s", out);
    /* the schedule's length: N, or the run's steps, for decaying ones only */
    EXPECT(zpp_train_schedule_length(&b) == 0);
    a.train_steps = 321;
    EXPECT(zpp_train_schedule_length(&a) == 321);
    a.scheduler.total_num_steps = 77;
    EXPECT(zpp_train_schedule_length(&a) == 77);
    a.scheduler.type = ZPP_SCHED_WARMUP_LR;
    EXPECT(zpp_train_schedule_length(&a) == 0);
}

/* A mistyped key in a file is named with the key most likely meant. */
static void test_unknown_key_suggestion(void) {
    expect_load_fails("{\"zero_optimization\": {\"stge\": 3}}", ZPP_ERR_CONFIG,
                      "did you mean 'zero_optimization.stage'?");
    expect_load_fails("{\"lr\": 0.1}", ZPP_ERR_CONFIG, "did you mean 'optimizer.params.lr'?");
    expect_load_fails("{\"model\": {\"n_layers\": 2}}", ZPP_ERR_CONFIG,
                      "did you mean 'model.n_layer'?");
    expect_load_fails("{\"zeropp\": {\"eval_evry\": 2}}", ZPP_ERR_CONFIG,
                      "did you mean 'zeropp.eval_every'?");
    expect_load_fails("{\"bf16\": {\"enable\": true}}", ZPP_ERR_CONFIG,
                      "did you mean 'bf16.enabled'?");
    zpp_train_config c;
    EXPECT_OK(zpp_train_config_defaults(&c));
    EXPECT(zpp_train_config_load_string("{\"model\": {\"qqqqqqq\": 2}}", &c) == ZPP_ERR_CONFIG &&
               !HAS("did you mean"),
           "%s", zpp_last_error());
}

/* docs/config.md is what the key table writes (the table is the source). */
static char *slurp(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    EXPECT(buf != NULL);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            buf = realloc(buf, cap *= 2);
            EXPECT(buf != NULL);
        }
    }
    *len = n;
    return buf;
}

static void test_keys_doc_current(void) {
    const char *src = getenv("ZPP_SOURCE_DIR");
    EXPECT(src != NULL, "ZPP_SOURCE_DIR is not set (ctest sets it)");
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/config.md", src);
    FILE *doc = fopen(path, "rb");
    EXPECT(doc != NULL, "%s: %s", path, strerror(errno));
    FILE *gen = tmpfile();
    EXPECT(gen != NULL);
    zpp_train_config_write_keys(gen);
    rewind(gen);
    size_t nd = 0, ng = 0;
    char *d = slurp(doc, &nd), *g = slurp(gen, &ng);
    fclose(doc);
    fclose(gen);
    size_t at = 0;
    while (at < nd && at < ng && d[at] == g[at]) at++;
    EXPECT(nd == ng && at == nd,
           "%s differs from the key table at byte %zu: regenerate it with `zeropp train "
           "--list-config-keys > docs/config.md`",
           path, at);
    free(d);
    free(g);
}

ZPP_TESTS(
    ZPP_TEST(test_defaults_valid),
    ZPP_TEST(test_every_key_parsed),
    ZPP_TEST(test_load_applies_over),
    ZPP_TEST(test_unknown_key_named),
    ZPP_TEST(test_wrong_type_named),
    ZPP_TEST(test_malformed_json_line_col),
    ZPP_TEST(test_missing_file),
    ZPP_TEST(test_validation_errors),
    ZPP_TEST(test_fp16_keys_and_stage),
    ZPP_TEST(test_resolve_batch),
    ZPP_TEST(test_lr_schedule),
    ZPP_TEST(test_keys_doc_current),
    ZPP_TEST(test_config_json_round_trip),
    ZPP_TEST(test_config_set),
    ZPP_TEST(test_config_diff),
    ZPP_TEST(test_unknown_key_suggestion),
)
