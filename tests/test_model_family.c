/* test_model_family.c — model families by name (src/model/family.c): the
 * "gpt2" entry makes, from a generic decoder shape, the very model the
 * GPT-2 factory makes from its own config; an unknown name is refused with
 * the known ones listed; a shape GPT-2 cannot build is refused naming the
 * field. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/family.h"
#include "model/gpt2.h"
#include "model/model.h"
#include "testlib.h"

static const zpp_decoder_shape kShape = {.n_layer = 2,
                                         .n_head = 4,
                                         .n_embd = 32,
                                         .seq_len = 8,
                                         .vocab_size = 50,
                                         .real_vocab_size = 40};

static void expect_same_structure(const zpp_model *a, const zpp_model *b) {
    EXPECT(a->mem == b->mem && a->param_dtype == b->param_dtype, "device or dtype differ");
    EXPECT(a->n_units == b->n_units && a->n_stages == b->n_stages, "units %d/%d, stages %d/%d",
           a->n_units, b->n_units, a->n_stages, b->n_stages);
    EXPECT(a->seq_len == b->seq_len && a->vocab_size == b->vocab_size &&
               a->real_vocab_size == b->real_vocab_size && a->max_batch == b->max_batch,
           "token interface differs");
    for (int u = 0; u < a->n_units; u++) {
        EXPECT(a->unit_numel[u] == b->unit_numel[u], "unit %d size differs", u);
        EXPECT(a->n_matrix_ranges[u] == b->n_matrix_ranges[u], "unit %d matrices differ", u);
        for (int k = 0; k < a->n_matrix_ranges[u]; k++)
            EXPECT(a->matrix_ranges[u][k].begin == b->matrix_ranges[u][k].begin &&
                       a->matrix_ranges[u][k].end == b->matrix_ranges[u][k].end,
                   "unit %d matrix %d differs", u, k);
    }
    for (int s = 0; s < a->n_stages; s++)
        EXPECT(a->stage_unit[s] == b->stage_unit[s] &&
                   a->bwd_reads_params[s] == b->bwd_reads_params[s],
               "stage %d differs", s);
}

/* The loss of one forward of model m with its initial parameters. */
static float init_forward_loss(zpp_model *m, uint64_t seed, const int32_t *tok,
                               const int32_t *tgt, int B) {
    float **p = calloc((size_t)m->n_units, sizeof *p);
    EXPECT(p != NULL, "out of memory");
    for (int u = 0; u < m->n_units; u++) {
        p[u] = calloc(m->unit_numel[u], sizeof(float));
        EXPECT(p[u] != NULL, "out of memory");
        EXPECT_OK(m->ops->init_params(m, u, 0, m->unit_numel[u], p[u], seed));
    }
    EXPECT_OK(m->ops->set_batch(m, tok, tgt, B));
    for (int s = 0; s < m->n_stages; s++) EXPECT_OK(m->ops->forward(m, s, p[m->stage_unit[s]]));
    float loss = m->ops->loss(m);
    for (int u = 0; u < m->n_units; u++) free(p[u]);
    free(p);
    return loss;
}

/* "gpt2" by name is zpp_gpt2_create's model: the same units, stages and
 * matrices, the same initial values and the same loss, bit for bit; the
 * defaults 0 and their explicit values (n_kv_head = n_head, n_ffn =
 * 4 n_embd) make the same model. */
static void test_gpt2_by_name(void) {
    zpp_device *dev;
    EXPECT_OK(zpp_device_create_host(&dev));
    const zpp_gpt2_config cfg = {2, 4, 32, 8, 50, 40, 0, 0};
    zpp_decoder_shape explicit_shape = kShape;
    explicit_shape.n_kv_head = 4;
    explicit_shape.n_ffn = 128;
    const zpp_decoder_shape *shapes[2] = {&kShape, &explicit_shape};
    enum { B = 3 };
    int32_t tok[B * 8], tgt[B * 8];
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    for (int i = 0; i < B * 8; i++) {
        tok[i] = (int32_t)(zpp_rng_u64(&r) % 50);
        tgt[i] = (int32_t)(zpp_rng_u64(&r) % 40);
    }
    const uint64_t seed = zpp_rng_u64(&r);
    zpp_model *direct;
    EXPECT_OK(zpp_gpt2_create(&cfg, ZPP_FP32, B, dev, &direct));
    const float want = init_forward_loss(direct, seed, tok, tgt, B);
    for (int k = 0; k < 2; k++) {
        zpp_model *named;
        EXPECT_OK(zpp_model_family_create("gpt2", shapes[k], ZPP_FP32, B, dev, &named));
        expect_same_structure(named, direct);
        const float got = init_forward_loss(named, seed, tok, tgt, B);
        EXPECT(memcmp(&got, &want, sizeof got) == 0, "loss %.9g by name, %.9g direct", got, want);
        named->ops->destroy(named);
    }
    direct->ops->destroy(direct);
    zpp_device_destroy(dev);
}

/* A name no family registered: ZPP_ERR_CONFIG, one line naming it and the
 * known families; the output is left alone. */
static void test_unknown_family_refused(void) {
    zpp_device *dev;
    EXPECT_OK(zpp_device_create_host(&dev));
    const char *names[2] = {"gpt-2", NULL};
    for (int k = 0; k < 2; k++) {
        zpp_model *m = (zpp_model *)&m;
        EXPECT_STATUS(zpp_model_family_create(names[k], &kShape, ZPP_FP32, 1, dev, &m),
                      ZPP_ERR_CONFIG);
        EXPECT(m == (zpp_model *)&m, "model_p written on failure");
        const char *msg = zpp_last_error();
        char want[64];
        snprintf(want, sizeof want, "model family '%s' is unknown", names[k] ? names[k] : "(null)");
        EXPECT(strstr(msg, want) != NULL, "message '%s' lacks '%s'", msg, want);
        EXPECT(strstr(msg, "use one of: gpt2") != NULL, "message '%s' lists no families", msg);
        EXPECT(strchr(msg, '\n') == NULL, "message '%s' is not one line", msg);
    }
    zpp_device_destroy(dev);
}

/* A shape GPT-2 cannot build: grouped-query attention, another MLP width,
 * or a field its config check refuses; ZPP_ERR_CONFIG naming the field. */
static void test_gpt2_refuses_other_shapes(void) {
    zpp_device *dev;
    EXPECT_OK(zpp_device_create_host(&dev));
    zpp_decoder_shape bad[3] = {kShape, kShape, kShape};
    bad[0].n_kv_head = 2;
    bad[1].n_ffn = 96;
    bad[2].n_layer = 0;
    const char *field[3] = {"n_kv_head 2", "n_ffn 96", "n_layer 0"};
    for (int k = 0; k < 3; k++) {
        zpp_model *m = NULL;
        EXPECT_STATUS(zpp_model_family_create("gpt2", &bad[k], ZPP_FP32, 1, dev, &m),
                      ZPP_ERR_CONFIG);
        EXPECT(m == NULL, "a model made of a refused shape");
        EXPECT(strstr(zpp_last_error(), field[k]) != NULL, "message '%s' lacks '%s'",
               zpp_last_error(), field[k]);
    }
    zpp_device_destroy(dev);
}

ZPP_TESTS(ZPP_TEST(test_gpt2_by_name), ZPP_TEST(test_unknown_family_refused),
          ZPP_TEST(test_gpt2_refuses_other_shapes))
