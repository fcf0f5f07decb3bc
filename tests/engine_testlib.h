/* engine_testlib.h — the fixture the engine tests on MPI ranks share: the
 * host device and a world of emulated nodes, and a GPT-2 with its engine. */
#ifndef ZPP_ENGINE_TESTLIB_H
#define ZPP_ENGINE_TESTLIB_H

#include "engine/engine.h"
#include "model/gpt2.h"
#include "testlib.h"

typedef struct zpp_test_run {
    zpp_model *model;
    zpp_engine *engine;
} zpp_test_run;

/* The host device and the world (MPI) as nodes of node_size ranks. */
static inline void zpp_test_open_world(int node_size, zpp_device **dev_p, zpp_topo **topo_p) {
    zpp_topo_opts to = {0};
    to.backend = ZPP_BACKEND_MPI;
    to.node_size = node_size;
    EXPECT_OK(zpp_device_create_host(dev_p));
    EXPECT_OK(zpp_topo_create_with_opts(&to, topo_p));
}

static inline void zpp_test_close_world(zpp_device *dev, zpp_topo *topo) {
    zpp_topo_destroy(topo);
    zpp_device_destroy(dev);
}

/* A CPU GPT-2 of cfg in `dtype` for micro-batches up to max_batch, and an
 * engine with `eo` over it. */
static inline void zpp_test_open_run(zpp_test_run *r, const zpp_gpt2_config *cfg,
                                     zpp_dtype dtype, int max_batch, zpp_topo *topo,
                                     zpp_device *dev, const zpp_engine_opts *eo) {
    EXPECT_OK(zpp_gpt2_create(cfg, dtype, max_batch, dev, &r->model));
    EXPECT_OK(zpp_engine_create_with_opts(topo, r->model, eo, dev, &r->engine));
}

static inline void zpp_test_close_run(zpp_test_run *r) {
    zpp_engine_destroy(r->engine);
    r->model->ops->destroy(r->model);
}

#endif
