/* bench/gpu/model_ops.cu — where the CUDA GPT-2's time goes: forward and
 * backward of each stage kind, then every op of one block, timed with CUDA
 * events (bf16 parameters, random weights and tokens; mean of 3 passes after
 * one warm-up). It includes the model's source to reach its static ops, so it
 * times exactly the code the trainer runs; it is a benchmark, not part of the
 * library. Build against a CUDA build of the tree (build-gpu), then run with
 * the shape L C H B (T 1024, V 50304):
 *   nvcc -O3 -arch=sm_90 -std=c++17 -Iinclude -Isrc -o model_ops bench/gpu/model_ops.cu \
 *     build-gpu/libzeropp.a -lcublasLt -lcudnn -lnccl $(mpicc --showme:link) -lopenblas \
 *     -lcjson -lpcre2-8 -lgomp
 *   ./model_ops 24 2048 16 4     # GPT 1.31B, micro-batch 4
 *   ./model_ops 12 768 6 8       # GPT-2 124M (6 heads of 128), micro-batch 8 */
#include "model/gpt2_cuda.cu"
#include <stdio.h>

__global__ void rnd_kernel(__nv_bfloat16 *p, size_t n, float s, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * s);
    }
}
/* Summed milliseconds per name, in the order names first appear. */
static const char *names[32];
static double ms_sum[32];
static int n_names;
static cudaStream_t S;
static void clear_times(void) { n_names = 0; }
template <typename F> static void tm(const char *name, F f) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a, S); zpp_status st = f(); cudaEventRecord(b, S); cudaEventSynchronize(b);
    if (st != ZPP_OK) { printf("%s failed: %s\n", name, zpp_last_error()); exit(1); }
    float ms; cudaEventElapsedTime(&ms, a, b);
    int k = 0;
    while (k < n_names && strcmp(names[k], name) != 0) k++;
    if (k == n_names) names[n_names++] = name, ms_sum[k] = 0;
    ms_sum[k] += ms; cudaEventDestroy(a); cudaEventDestroy(b);
}
static double total_ms(int iters) {
    double t = 0; for (int k = 0; k < n_names; k++) t += ms_sum[k] / iters;
    return t;
}
int main(int argc, char **argv) {
    int L = argc > 1 ? atoi(argv[1]) : 24, C = argc > 2 ? atoi(argv[2]) : 2048, H = argc > 3 ? atoi(argv[3]) : 16;
    int B = argc > 4 ? atoi(argv[4]) : 4, T = 1024, V = 50304, iters = 3;
    zpp_gpt2_config cfg = {L, H, C, T, V};
    zpp_device *dev; if (zpp_device_create_gpu(0, &dev) != ZPP_OK) { printf("no gpu\n"); return 1; }
    zpp_model *m; if (zpp_gpt2_cuda_create(&cfg, ZPP_BF16, B, dev, &m) != ZPP_OK) { printf("create: %s\n", zpp_last_error()); return 1; }
    gpt2_cuda *g = (gpt2_cuda *)m; S = g->stream;
    void *p[256]; float *gr[256];
    if (m->n_units > 256) { printf("at most 255 layers\n"); return 1; }
    for (int u = 0; u < m->n_units; u++) {
        size_t n = m->unit_numel[u];
        cudaMalloc(&p[u], n * 2); cudaMalloc((void **)&gr[u], n * 4); cudaMemset(gr[u], 0, n * 4);
        rnd_kernel<<<1024, 256, 0, S>>>((__nv_bfloat16 *)p[u], n, 0.1f, u * 77 + 1);
    }
    size_t nt = (size_t)B * T;
    int32_t *tok = (int32_t *)malloc(nt * 4), *tgt = (int32_t *)malloc(nt * 4);
    for (size_t i = 0; i < nt; i++) tok[i] = (int32_t)((i * 7919) % V), tgt[i] = (int32_t)((i * 104729) % V);
    int Sg = m->n_stages;
    for (int it = 0; it < iters + 1; it++) {
        if (it == 1) clear_times();
        m->ops->set_batch(m, tok, tgt, B);
        for (int s = 0; s < Sg; s++) {
            const char *nm = s == 0 ? "fwd embed" : s == Sg - 1 ? "fwd head" : "fwd blocks";
            tm(nm, [&] { return m->ops->forward(m, s, p[m->stage_unit[s]]); });
        }
        (void)m->ops->loss(m);
        for (int s = Sg - 1; s >= 0; s--) {
            const char *nm = s == 0 ? "bwd embed" : s == Sg - 1 ? "bwd head" : "bwd blocks";
            tm(nm, [&] { return m->ops->backward(m, s, s ? p[m->stage_unit[s]] : NULL, gr[m->stage_unit[s]], 1.0f); });
        }
    }
    printf("shape L%d C%d H%d B%d T%d: model fwd+bwd %.2f ms\n", L, C, H, B, T, total_ms(iters));
    for (int k = 0; k < n_names; k++) printf("  %-12s %8.3f ms\n", names[k], ms_sum[k] / iters);
    // per-op of block 1
    clear_times();
    int n = B * T; const void *w = p[1]; const zpp_gpt2_layout *Ly = &g->lay; gpt2_acts *a = &g->act;
    layer_acts y = layer_of(g, 1); cudaDataType_t et = g->et, f32 = CUDA_R_32F; float *grd = gr[1]; int summed;
    for (int it = 0; it < iters; it++) {
        tm("ln fwd", [&] { return layernorm_forward(g, a->ln, y.ln1m, y.ln1r, y.x, eat(g, w, Ly->ln1_w), eat(g, w, Ly->ln1_b), n, C); });
        tm("qkv fwd", [&] { return linear_forward(g, y.qkv, et, NULL, a->ln, eat(g, w, Ly->qkv_w), eat(g, w, Ly->qkv_b), n, C, 3 * C, "qkv"); });
        tm("attn fwd", [&] { return attention_forward(g, y.atty, y.att, y.qkv); });
        tm("proj fwd", [&] { return linear_forward(g, y.mid, f32, y.x, y.atty, eat(g, w, Ly->proj_w), eat(g, w, Ly->proj_b), n, C, C, "proj"); });
        if (g->gelu_epilogue) { // the model's ops: GELU in the products' epilogues (gpt2_cuda.cu, GELU)
            tm("fc+gelu fwd", [&] { return zpp_cu_linear_gelu_forward(&g->cu, a->fcg, y.fch, a->ln, eat(g, w, Ly->fc_w), eat(g, w, Ly->fc_b), n, C, 4 * C, "fc"); });
        } else {
            tm("fc fwd", [&] { return linear_forward(g, y.fch, et, NULL, a->ln, eat(g, w, Ly->fc_w), eat(g, w, Ly->fc_b), n, C, 4 * C, "fc"); });
            tm("gelu fwd", [&] { return gelu_forward(g, y.fch, n); });
        }
        tm("fc2 fwd", [&] { return linear_forward(g, y.out, f32, y.mid, a->fcg, eat(g, w, Ly->fc2_w), eat(g, w, Ly->fc2_b), n, 4 * C, C, "fc2"); });
        tm("gelu again", [&] { return gelu_forward(g, y.fch, n); });
        if (g->gelu_epilogue)
            tm("fc2+dgelu bwd", [&] { return zpp_cu_linear_dgelu_backward(&g->cu, a->dfc, grd + Ly->fc2_w, grd + Ly->fc2_b, a->dres_e, a->dres, a->fcg, eat(g, w, Ly->fc2_w), y.fch, n, 4 * C, C, "fc2b"); });
        else
            tm("fc2 bwd", [&] { return linear_backward(g, a->dfc, et, grd + Ly->fc2_w, grd + Ly->fc2_b, a->dres_e, a->dres, a->fcg, eat(g, w, Ly->fc2_w), n, 4 * C, C, "fc2b"); });
        tm("ln recompute", [&] { return layernorm_recompute(g, y.mid, y.ln2m, y.ln2r, eat(g, w, Ly->ln2_w), eat(g, w, Ly->ln2_b), n); });
        tm("fc bwd", [&] { return linear_backward(g, a->dc, f32, grd + Ly->fc_w, grd + Ly->fc_b, a->dfc, NULL, a->ln, eat(g, w, Ly->fc_w), n, C, 4 * C, "fcb"); });
        tm("ln bwd", [&] { return layernorm_backward(g, a->dres, grd + Ly->ln2_w, grd + Ly->ln2_b, a->dc, y.mid, eat(g, w, Ly->ln2_w), y.ln2m, y.ln2r, n, C, NULL, 0, &summed); });
        tm("proj bwd", [&] { return linear_backward(g, a->datty, et, grd + Ly->proj_w, grd + Ly->proj_b, a->dres_e, a->dres, y.atty, eat(g, w, Ly->proj_w), n, C, C, "projb"); });
        tm("attn bwd", [&] { return attention_backward(g, a->dqkv, a->datty, y.att, y.qkv, y.atty); });
        tm("qkv bwd", [&] { return linear_backward(g, a->dc, f32, grd + Ly->qkv_w, grd + Ly->qkv_b, a->dqkv, NULL, a->ln, eat(g, w, Ly->qkv_w), n, C, 3 * C, "qkvb"); });
    }
    double tot = total_ms(iters);
    printf("block ops (sum %.3f ms per block):\n", tot);
    for (int k = 0; k < n_names; k++)
        printf("  %-12s %8.3f ms  %5.1f%%\n", names[k], ms_sum[k] / iters, 100 * ms_sum[k] / iters / tot);
    return 0;
}
