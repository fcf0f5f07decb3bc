/* test_hf_config.c — Llama-family config.json (src/train/hf_config.h):
 * random configs of the three architectures written and read back equal,
 * field for field and bit for bit; Llama-3.2-1B-, Mistral-7B- and
 * Qwen2.5-shaped files read with their defaults; every refusal, the
 * message naming the key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"
#include "train/hf_config.h"

#define EXPECT_MSG(sub)                                                        \
    EXPECT(strstr(zpp_last_error(), (sub)) != NULL, "message '%s' lacks '%s'", \
           zpp_last_error(), (sub))

static int irand(zpp_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(zpp_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* A double of random bits in (0, hi): round trips need all 53 of them. */
static double drand(zpp_rng *r, double hi) { return hi * (0.001 + 0.998 * zpp_rng_uniform(r)); }

static zpp_hf_config rand_config(zpp_rng *r) {
    zpp_hf_config c;
    memset(&c, 0, sizeof c);
    const zpp_hf_arch arch = (zpp_hf_arch)irand(r, 0, ZPP_HF_N_ARCH - 1);
    strcpy(c.architecture, zpp_hf_arch_name(arch));
    c.num_key_value_heads = irand(r, 1, 8);
    c.num_attention_heads = c.num_key_value_heads * irand(r, 1, 4);
    c.head_dim = 8 * irand(r, 1, 32);
    c.hidden_size = irand(r, 0, 1) ? c.num_attention_heads * c.head_dim : irand(r, 1, 9000);
    c.intermediate_size = irand(r, 1, 30000);
    c.num_hidden_layers = irand(r, 1, 80);
    c.vocab_size = irand(r, 1, 200000);
    c.max_position_embeddings = irand(r, 1, 131072);
    c.rms_norm_eps = drand(r, 1e-4);
    c.rope_theta = drand(r, 1e6);
    if ((c.rope_scaling.llama3 = irand(r, 0, 1))) {
        c.rope_scaling.factor = drand(r, 64);
        c.rope_scaling.low_freq_factor = drand(r, 2);
        c.rope_scaling.high_freq_factor = c.rope_scaling.low_freq_factor + drand(r, 8);
        c.rope_scaling.original_max_position_embeddings = irand(r, 1, 16384);
    }
    c.tie_word_embeddings = irand(r, 0, 1);
    c.attention_bias = arch == ZPP_HF_LLAMA ? irand(r, 0, 1) : 0;
    c.sliding_window = arch == ZPP_HF_LLAMA ? 0 : irand(r, 0, 1) * irand(r, 1, 131072);
    c.torch_dtype = (zpp_dtype)irand(r, 0, 2);
    c.bos_token_id = irand(r, -1, 200000);
    c.n_eos = irand(r, 0, ZPP_HF_MAX_EOS);
    c.eos_is_list = c.n_eos > 1 || (c.n_eos == 1 && irand(r, 0, 1));
    for (int i = 0; i < c.n_eos; i++) c.eos_token_id[i] = irand(r, 0, 200000);
    return c;
}

static void expect_equal(const zpp_hf_config *a, const zpp_hf_config *b) {
    EXPECT(!strcmp(a->architecture, b->architecture));
    const int ia[] = {a->hidden_size, a->intermediate_size, a->num_hidden_layers,
                      a->num_attention_heads, a->num_key_value_heads, a->head_dim, a->vocab_size,
                      a->max_position_embeddings, a->tie_word_embeddings, a->attention_bias,
                      (int)a->torch_dtype, a->bos_token_id, a->n_eos, a->eos_is_list,
                      a->rope_scaling.llama3, a->rope_scaling.original_max_position_embeddings,
                      a->sliding_window};
    const int ib[] = {b->hidden_size, b->intermediate_size, b->num_hidden_layers,
                      b->num_attention_heads, b->num_key_value_heads, b->head_dim, b->vocab_size,
                      b->max_position_embeddings, b->tie_word_embeddings, b->attention_bias,
                      (int)b->torch_dtype, b->bos_token_id, b->n_eos, b->eos_is_list,
                      b->rope_scaling.llama3, b->rope_scaling.original_max_position_embeddings,
                      b->sliding_window};
    for (size_t i = 0; i < sizeof ia / sizeof ia[0]; i++)
        EXPECT(ia[i] == ib[i], "int field %zu: %d != %d", i, ia[i], ib[i]);
    for (int i = 0; i < a->n_eos; i++) EXPECT(a->eos_token_id[i] == b->eos_token_id[i]);
    const double da[] = {a->rms_norm_eps, a->rope_theta, a->rope_scaling.factor,
                         a->rope_scaling.low_freq_factor, a->rope_scaling.high_freq_factor};
    const double db[] = {b->rms_norm_eps, b->rope_theta, b->rope_scaling.factor,
                         b->rope_scaling.low_freq_factor, b->rope_scaling.high_freq_factor};
    for (size_t i = 0; i < sizeof da / sizeof da[0]; i++)
        EXPECT(!memcmp(&da[i], &db[i], sizeof(double)), "double field %zu: %.17g != %.17g", i,
               da[i], db[i]);
}

/* parse(format(x)) == x, and through a file. */
static void test_roundtrip(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    char path[512];
    zpp_test_tmp_path("config.json", path);
    for (int rep = 0; rep < 200; rep++) {
        const zpp_hf_config c = rand_config(&r);
        char *text = NULL;
        EXPECT_OK(zpp_hf_config_format(&c, &text));
        zpp_hf_config back;
        EXPECT_OK(zpp_hf_config_parse(text, "roundtrip", &back));
        expect_equal(&c, &back);
        free(text);
        if (rep % 20 == 0) {
            EXPECT_OK(zpp_hf_config_write(path, &c));
            memset(&back, 0, sizeof back);
            EXPECT_OK(zpp_hf_config_read(path, &back));
            expect_equal(&c, &back);
        }
    }
}

/* Llama 3.2 1B's config.json as transformers writes it. */
static const char *llama_1b =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 64, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";

static void test_llama_1b(void) {
    zpp_hf_config c;
    EXPECT_OK(zpp_hf_config_parse(llama_1b, "llama-1b", &c));
    EXPECT(c.hidden_size == 2048 && c.intermediate_size == 8192 && c.num_hidden_layers == 16);
    EXPECT(c.num_attention_heads == 32 && c.num_key_value_heads == 8 && c.head_dim == 64);
    EXPECT(c.vocab_size == 128256 && c.max_position_embeddings == 131072);
    EXPECT(c.rms_norm_eps == 1e-5 && c.rope_theta == 500000.0);
    EXPECT(c.rope_scaling.llama3 && c.rope_scaling.factor == 32 &&
           c.rope_scaling.low_freq_factor == 1 && c.rope_scaling.high_freq_factor == 4 &&
           c.rope_scaling.original_max_position_embeddings == 8192);
    EXPECT(c.tie_word_embeddings == 1 && c.attention_bias == 0 && c.torch_dtype == ZPP_BF16);
    EXPECT(c.bos_token_id == 128000 && c.n_eos == 3 && c.eos_is_list &&
           c.eos_token_id[2] == 128009);
    /* The defaults: TinyLlama-like, no kv heads, head_dim, rope or ids given. */
    EXPECT_OK(zpp_hf_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], "
                                  "\"hidden_size\": 96, \"intermediate_size\": 200, "
                                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 6, "
                                  "\"vocab_size\": 300, \"eos_token_id\": 2, "
                                  "\"rope_scaling\": null, \"head_dim\": null, "
                                  "\"is_llama_config\": true, \"rope_interleaved\": false}",
                                  "small", &c));
    EXPECT(c.num_key_value_heads == 6 && c.head_dim == 16 && c.max_position_embeddings == 2048);
    EXPECT(c.rms_norm_eps == 1e-6 && c.rope_theta == 10000 && !c.rope_scaling.llama3);
    EXPECT(c.torch_dtype == ZPP_FP32 && c.bos_token_id == -1 && c.n_eos == 1 && !c.eos_is_list);
    EXPECT(!c.tie_word_embeddings && !c.attention_bias);
}

/* Mistral 7B v0.1's config.json: a sliding window of 4096 over 32768
 * positions, no biases. */
static const char *mistral_7b =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
    " \"model_type\": \"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
    " \"sliding_window\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.34.0.dev0\", \"use_cache\": true, \"vocab_size\": 32000}";

/* Qwen2.5 0.5B's config.json: q/k/v biases (no key says so), the window
 * keys off. */
static const char *qwen2_05b =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"hidden_act\": \"silu\","
    " \"hidden_size\": 896, \"initializer_range\": 0.02, \"intermediate_size\": 4864,"
    " \"max_position_embeddings\": 32768, \"max_window_layers\": 24, \"model_type\": \"qwen2\","
    " \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.40.1\", \"use_cache\": true, \"use_sliding_window\": false,"
    " \"vocab_size\": 151936}";

/* Mistral and Qwen2 read as the Llama they are: their biases by
 * architecture, the window kept; a Mistral's window bounds the sequence. */
static void test_mistral_and_qwen2(void) {
    zpp_hf_config c;
    int qkv = -1, o = -1;
    EXPECT_OK(zpp_hf_config_parse(mistral_7b, "mistral-7b", &c));
    EXPECT(zpp_hf_config_arch(&c) == ZPP_HF_MISTRAL && c.sliding_window == 4096);
    EXPECT(c.hidden_size == 4096 && c.num_key_value_heads == 8 && c.head_dim == 128);
    zpp_hf_biases(&c, &qkv, &o);
    EXPECT(qkv == 0 && o == 0, "mistral biases %d %d", qkv, o);
    EXPECT_OK(zpp_hf_check_seq_len(&c, 4096, "m"));
    EXPECT_STATUS(zpp_hf_check_seq_len(&c, 4097, "m"), ZPP_ERR_CONFIG);
    EXPECT_MSG("sliding_window 4096 is shorter than the run's 4097-token sequences");
    EXPECT_OK(zpp_hf_config_parse(qwen2_05b, "qwen2", &c));
    EXPECT(zpp_hf_config_arch(&c) == ZPP_HF_QWEN2 && c.sliding_window == 32768);
    EXPECT(c.hidden_size == 896 && c.num_attention_heads == 14 && c.tie_word_embeddings);
    zpp_hf_biases(&c, &qkv, &o);
    EXPECT(qkv == 1 && o == 0, "qwen2 biases %d %d", qkv, o);
    EXPECT_OK(zpp_hf_check_seq_len(&c, 65536, "q")); /* its window is off */
    /* written back: the architecture's own keys, read back the same */
    char *text = NULL;
    EXPECT_OK(zpp_hf_config_format(&c, &text));
    EXPECT(strstr(text, "\"model_type\":\t\"qwen2\"") && strstr(text, "\"use_sliding_window\"") &&
               !strstr(text, "attention_bias") && !strstr(text, "mlp_bias"),
           "%s", text);
    zpp_hf_config back;
    EXPECT_OK(zpp_hf_config_parse(text, "qwen2 back", &back));
    expect_equal(&c, &back);
    free(text);
    /* Llama's attention_bias: all four biases */
    EXPECT_OK(zpp_hf_config_parse(llama_1b, "llama-1b", &c));
    c.attention_bias = 1;
    zpp_hf_biases(&c, &qkv, &o);
    EXPECT(qkv == 1 && o == 1, "llama biases %d %d", qkv, o);
}

/* `base` with `from` replaced by `to` (both must be in it). */
static char *edit_of(const char *base, const char *from, const char *to) {
    const char *at = strstr(base, from);
    EXPECT(at, "'%s' is not in the test config", from);
    const size_t n = strlen(base) + strlen(to) + 1;
    char *s = zpp_test_malloc(n);
    snprintf(s, n, "%.*s%s%s", (int)(at - base), base, to, at + strlen(from));
    return s;
}

static char *edit(const char *from, const char *to) { return edit_of(llama_1b, from, to); }

/* The refusals of Mistral's and Qwen2's own keys, each naming the key. */
static void test_arch_refusals(void) {
    const struct {
        const char *base, *from, *to;
        const char *why;
    } bad[] = {
        {mistral_7b, "\"use_cache\": true", "\"attention_bias\": false",
         "attention_bias is not a key of MistralForCausalLM"},
        {qwen2_05b, "\"use_cache\": true", "\"attention_bias\": true",
         "attention_bias is not a key of Qwen2ForCausalLM"},
        {mistral_7b, "\"model_type\": \"mistral\"", "\"model_type\": \"llama\"",
         "model_type must be \"mistral\" for MistralForCausalLM"},
        {qwen2_05b, "\"use_sliding_window\": false", "\"use_sliding_window\": true",
         "use_sliding_window must be false"},
        {mistral_7b, "\"sliding_window\": 4096", "\"sliding_window\": 0",
         "\"sliding_window\" is not null or a positive integer"},
        {mistral_7b, "\"use_cache\": true", "\"use_sliding_window\": false",
         "unknown key \"use_sliding_window\""},
        {qwen2_05b, "\"use_cache\": true", "\"layer_types\": [\"full_attention\", \"sliding_attention\"]",
         "layer_types[1] is \"sliding_attention\"; zeropp has only full attention"},
        {qwen2_05b, "\"use_cache\": true", "\"layer_types\": [\"full_attention\"]",
         "layer_types lists 1 layers, num_hidden_layers is 24"},
        {qwen2_05b, "\"use_cache\": true", "\"layer_types\": \"full_attention\"",
         "\"layer_types\" is not a list"},
        {llama_1b, "\"LlamaForCausalLM\"", "\"Qwen3ForCausalLM\"",
         "architecture 'Qwen3ForCausalLM' is not supported; zeropp reads LlamaForCausalLM, "
         "MistralForCausalLM and Qwen2ForCausalLM"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = edit_of(bad[i].base, bad[i].from, bad[i].to);
        zpp_hf_config c;
        EXPECT(zpp_hf_config_parse(text, "edited", &c) != ZPP_OK, "case %zu was read", i);
        EXPECT_MSG(bad[i].why);
        free(text);
    }
    /* layer_types, as newer transformers write them: read when every layer
     * attends to the whole sequence */
    char types[1024] = "\"layer_types\": [";
    for (int l = 0; l < 24; l++) strcat(types, l ? ", \"full_attention\"" : "\"full_attention\"");
    strcat(types, "]");
    char *typed = edit_of(qwen2_05b, "\"use_cache\": true", types);
    zpp_hf_config t;
    EXPECT_OK(zpp_hf_config_parse(typed, "layer_types", &t));
    EXPECT(t.num_hidden_layers == 24 && zpp_hf_config_arch(&t) == ZPP_HF_QWEN2);
    free(typed);
    /* a null window: none, any sequence */
    char *text = edit_of(mistral_7b, "\"sliding_window\": 4096", "\"sliding_window\": null");
    zpp_hf_config c;
    EXPECT_OK(zpp_hf_config_parse(text, "null window", &c));
    EXPECT(c.sliding_window == 0);
    EXPECT_OK(zpp_hf_check_seq_len(&c, 1 << 20, "m"));
    free(text);
}

static void test_refusals(void) {
    const struct {
        const char *from, *to;
        zpp_status st;
        const char *why;
    } bad[] = {
        {"\"LlamaForCausalLM\"", "\"GPT2LMHeadModel\"", ZPP_ERR_CONFIG,
         "architecture 'GPT2LMHeadModel' is not supported"},
        {"[\"LlamaForCausalLM\"]", "\"LlamaForCausalLM\"", ZPP_ERR_FORMAT, "\"architectures\""},
        {"\"architectures\": [\"LlamaForCausalLM\"],", "", ZPP_ERR_FORMAT,
         "\"architectures\" is missing"},
        {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", ZPP_ERR_CONFIG,
         "rope_scaling type 'yarn'"},
        {"\"rope_type\": \"llama3\"", "\"type\": \"linear\"", ZPP_ERR_CONFIG,
         "rope_scaling type 'linear'"},
        {"\"factor\": 32.0,", "", ZPP_ERR_FORMAT, "rope_scaling.factor is missing"},
        {"\"low_freq_factor\": 1.0", "\"low_freq_factor\": 5.0", ZPP_ERR_CONFIG,
         "high_freq_factor > low_freq_factor"},
        {"\"factor\": 32.0,", "\"factor\": 32.0, \"beta\": 1,", ZPP_ERR_CONFIG,
         "unknown key rope_scaling.beta"},
        {"\"use_cache\": true", "\"sliding_window\": 4096", ZPP_ERR_CONFIG,
         "unknown key \"sliding_window\""},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", ZPP_ERR_CONFIG,
         "hidden_act must be \"silu\""},
        {"\"mlp_bias\": false", "\"mlp_bias\": true", ZPP_ERR_CONFIG, "mlp_bias must be false"},
        {"\"use_cache\": true", "\"rope_interleaved\": true", ZPP_ERR_CONFIG,
         "rope_interleaved must be false"},
        {"\"model_type\": \"llama\"", "\"model_type\": \"mistral\"", ZPP_ERR_CONFIG,
         "model_type must be \"llama\""},
        {"\"head_dim\": 64, ", "", ZPP_OK, NULL}, /* 2048 / 32: fine */
        {"\"num_attention_heads\": 32", "\"num_attention_heads\": 28", ZPP_ERR_CONFIG,
         "num_key_value_heads 8 does not divide num_attention_heads 28"},
        {"\"num_key_value_heads\": 8", "\"num_key_value_heads\": 0", ZPP_ERR_CONFIG,
         "num_key_value_heads must be positive"},
        {"\"hidden_size\": 2048", "\"hidden_size\": -2048", ZPP_ERR_CONFIG,
         "hidden_size must be positive"},
        {"\"intermediate_size\": 8192", "\"intermediate_size\": 0", ZPP_ERR_CONFIG,
         "intermediate_size must be positive"},
        {"\"num_hidden_layers\": 16,", "", ZPP_ERR_FORMAT, "\"num_hidden_layers\" is missing"},
        {"\"vocab_size\": 128256", "\"vocab_size\": 12.5", ZPP_ERR_FORMAT,
         "\"vocab_size\" is not an integer"},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0", ZPP_ERR_CONFIG,
         "rms_norm_eps must be positive"},
        {"\"rope_theta\": 500000.0", "\"rope_theta\": \"big\"", ZPP_ERR_FORMAT,
         "\"rope_theta\" is not a number"},
        {"\"attention_bias\": false", "\"attention_bias\": 1", ZPP_ERR_FORMAT,
         "\"attention_bias\" is not true or false"},
        {"\"bfloat16\"", "\"float8\"", ZPP_ERR_CONFIG, "torch_dtype 'float8'"},
        {"[128001, 128008, 128009]", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", ZPP_ERR_CONFIG,
         "\"eos_token_id\" lists 9 ids"},
        {"[128001, 128008, 128009]", "[1, \"x\"]", ZPP_ERR_FORMAT, "\"eos_token_id\""},
        {"\"bos_token_id\": 128000", "\"bos_token_id\": -7", ZPP_ERR_CONFIG, "bos_token_id"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = edit(bad[i].from, bad[i].to);
        zpp_hf_config c;
        EXPECT_STATUS(zpp_hf_config_parse(text, "edited", &c), bad[i].st);
        if (bad[i].why) EXPECT_MSG(bad[i].why);
        free(text);
    }
    /* Heads not dividing the width: refused without head_dim, taken with it. */
    zpp_hf_config c;
    const char *odd = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 100, "
                      "\"intermediate_size\": 200, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 3, \"vocab_size\": 300%s}";
    char buf[512];
    snprintf(buf, sizeof buf, odd, "");
    EXPECT_STATUS(zpp_hf_config_parse(buf, "odd", &c), ZPP_ERR_CONFIG);
    EXPECT_MSG("num_attention_heads 3 does not divide hidden_size 100");
    snprintf(buf, sizeof buf, odd, ", \"head_dim\": 32");
    EXPECT_OK(zpp_hf_config_parse(buf, "odd", &c));
    EXPECT(c.head_dim == 32 && c.num_key_value_heads == 3);
    EXPECT_STATUS(zpp_hf_config_parse("[1]", "array", &c), ZPP_ERR_FORMAT);
    EXPECT_MSG("not a JSON object");
    /* The writer checks what it writes. */
    EXPECT_OK(zpp_hf_config_parse(llama_1b, "llama-1b", &c));
    c.num_key_value_heads = 5;
    char *out = NULL;
    EXPECT_STATUS(zpp_hf_config_format(&c, &out), ZPP_ERR_CONFIG);
    EXPECT_MSG("num_key_value_heads 5");
    EXPECT(!out);
}

ZPP_TESTS(
    ZPP_TEST(test_roundtrip),
    ZPP_TEST(test_llama_1b),
    ZPP_TEST(test_refusals),
    ZPP_TEST(test_mistral_and_qwen2),
    ZPP_TEST(test_arch_refusals),
)
