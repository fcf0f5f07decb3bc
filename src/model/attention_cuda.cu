/* model/attention_cuda.cu — fused causal self-attention, forward and
 * backward, in the style of FlashAttention-2 (Dao, 2023), on bf16 tensor
 * cores (attention_cuda.h gives the layouts and the API).
 *
 * THE MATH. Per (sequence b, head h), with c = 1/sqrt(hs):
 *
 *   S = c Q K^T (T x T), causal: S_ij = -inf for key j > query i
 *   P = softmax(S) by rows,  Y = P V
 *
 * Forward without a T x T matrix: the "online softmax". A CTA owns 64 query
 * rows and walks the key tiles j = 0, 1, .. up to the diagonal, keeping per
 * row a running max m, a running sum l = sum exp(S_ij - m) and an unscaled
 * output O = sum exp(S_ij - m) V_j. When a tile raises the max to m', the
 * old terms are rescaled by exp(m - m') (l and O alike), which makes the
 * result exactly the softmax however the keys are split: at the end
 * Y = O / l and lse = m + log l = log sum_j exp(S_ij). Exponentials are
 * exp2 with log2(e) folded into the scale (x = S_ij * c * log2 e; exp2 is
 * one MUFU instruction), so m is kept in those log2 units and
 * lse = (m + log2 l) * ln 2 is converted once per row.
 *
 * Backward, given dY: dV = P^T dY, dP = dY V^T, dS = P o (dP - D) with
 * D_i = sum_j P_ij dP_ij, dQ = c dS K, dK = c dS^T Q (the softmax Jacobian:
 * dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)). D looks like it needs a whole row
 * of P and dP, but sum_j P_ij dP_ij = sum_j P_ij (dY_i . V_j) =
 * dY_i . (sum_j P_ij V_j) = dY_i . Y_i: a dot product of two rows we have
 * (FA2's "D" term, computed first by a small kernel). P itself is recomputed
 * tile by tile from Q, K and the forward's lse: P_ij = exp2(x_ij - lse_i
 * log2 e), no max or sum needed any more.
 *
 * Why two backward kernels. dK and dV for a key tile are sums over query
 * tiles; dQ for a query tile is a sum over key tiles. One kernel that walks
 * one way must add into the other from many CTAs: atomics, whose order (and
 * so whose fp32 rounding) changes run to run. Instead:
 *   dkdv: one CTA per key tile (64 keys) walks the query tiles from the
 *         diagonal down, accumulating dK and dV in registers;
 *   dq:   one CTA per query tile (64 rows) walks the key tiles up to the
 *         diagonal, accumulating dQ in registers;
 * both recompute S and P (and dP): 7 tile GEMMs where FA2 with atomics does
 * 5, but every output element is written once, by one thread, after a
 * fixed-order sum: the same inputs give the same bits.
 *
 * GROUPED QUERIES (Llama's GQA). With KV key/value heads for H query heads
 * (G = H / KV), query head h attends with key/value head h / G. The forward
 * and dq read that head's K and V (the only change: where K and V are);
 * dK and dV of a shared head are sums over its G query heads, which dkdv
 * forms without atomics: one CTA per (sequence, key/value head, key tile)
 * walks the query tiles of each of the G heads in turn (head h0 first),
 * adding into the same registers, so the order of the sum is fixed. With
 * KV = H (G = 1, GPT-2) every walk, load and sum is the one it was before
 * GQA: the same bits. The price: dkdv has G times fewer CTAs, each G times
 * longer, so few (sequence, key/value head) pairs leave SMs idle at the end
 * (B = 1, KV = 8, T = 2048: 256 CTAs, the first walking 4 x 32 query
 * tiles). Splitting a group over CTAs would need each one's fp32 partial
 * dK, dV in memory and a pass that adds them in order: not done.
 *
 * THE KERNELS. 4 warps (128 threads) per CTA; a warp owns 16 rows of the
 * CTA's tile (the M of mma.m16n8k16), so everything a warp computes from a
 * score tile (its row maxima and sums, its P and dS fragments) stays in its
 * registers: the fp32 accumulator fragment of S is re-packed into the bf16 A
 * fragment of P V (or P^T dY, dS K, dS^T Q) without going through shared
 * memory. Tiles (rows x keys; T ragged: rows past T load as zeros, see
 * MASKING):
 *
 *   kernel  CTA owns           walks                    tile (hs 64 | hs 128)  smem KiB
 *   fwd     64 query rows      key tiles up to the diag  64 x 64 | 64 x 64       45 | 85
 *   dsum    D of 256/(hs/8) (row, head) pairs: 16-byte loads, a shuffle sum
 *   dkdv    64 keys            query tiles from the diag 64 x 64 | 32 x 64       55 | 68.5
 *   dq      64 query rows      key tiles up to the diag  64 x 64 | 64 x 32       54 | 68
 *
 * (hs 128 halves the walked tile of the backward to keep dK + dV (or dQ)
 * accumulators, 128 (64) fp32 registers a thread, without spills.) The
 * walked tiles are double-buffered: cp.async (16-byte, L2-only) fetches tile
 * t+1 while tile t is computed; one cp.async.wait_group 0 + __syncthreads
 * per step both publishes t+1 and frees t's buffer for t+2. Shared memory
 * rows are hs + 8 elements (16 bytes of padding): ldmatrix's eight 16-byte
 * row reads of one 8x8 matrix then fall on eight different bank groups
 * (row stride 144 or 272 bytes = 16 mod 128). Operands reach the tensor
 * cores through ldmatrix (.trans for the operands whose reduction index is
 * the smem row: V in P V, dY in P^T dY, Q in dS^T Q, K in dS K). Outputs go
 * back through the warp's own 16 smem rows (free by then) so the global
 * stores are whole 16-byte vectors. Grids are (B*H, tiles) with the heaviest
 * tiles launched first (fwd and dq: the last query tiles; dkdv: the first
 * key tiles), so the causal triangle's ragged work evens out at the end.
 *
 * MASKING. Only tiles that cross the diagonal are masked (key j > query i:
 * S = -inf in the forward, P = 0 in the backward); fully masked tiles are
 * never visited (half the work). Rows past T in the last tile load as zeros
 * (cp.async with source size 0) and are never stored; keys past T are
 * always above the diagonal of every real row, so the causal mask covers
 * them, and their V rows are zeros (no 0 * garbage). In dkdv, query rows
 * past T get lse = +inf and D = 0, so their P (and dS) is exactly 0 and
 * they add nothing to dK, dV. Every row has at least one unmasked key in
 * every visited tile (key i itself, or any key of an earlier tile), so the
 * running max is finite after the first tile; the "m == -inf -> 0" guard is
 * there anyway.
 *
 * PRECISION. Q K^T, P V and the backward products take bf16 operands with
 * fp32 accumulation; softmax statistics, P, dP, dS and D are fp32; P is
 * rounded to bf16 only as an operand of P V / P^T dY (l sums the fp32 P),
 * dS only as an operand of dS K / dS^T Q; outputs are rounded to bf16 once.
 * tests/test_attention_cuda.c derives the error bounds from these roundings.
 *
 * COMPILED (nvcc 13.0, sm_90, -Xptxas -v): no kernel has a stack frame or
 * spills. Registers (hs 64 | hs 128): fwd 168 | 239, dkdv 215 | 254,
 * dq 190 | 184, dsum 26. __launch_bounds__(128, 2) lets ptxas use up to 255
 * (without it, dq<128> was squeezed to 168 registers and spilled), which
 * with the shared memory above means 2 CTAs (8 warps) per SM on an H100 /
 * H200 (3 for fwd<64>).
 *
 * CHECKED, before any GPU run, under a throwaway host emulation (not in the
 * repository): the kernels' own source with the primitives above replaced
 * by warp-collective emulations of ldmatrix / mma / shfl (fragment layouts
 * as in the PTX ISA), one fiber per CUDA thread under a random scheduler,
 * shared memory poisoned with NaN, cp.async copies landing at a random
 * point between commit and wait (or as late as the wait allows), and
 * tests/test_attention_cuda.c run unchanged against it. It passes; and each
 * of 17 injected bugs (masks off by one, a missed tile, no D, no O rescale,
 * a swapped fragment register, a wrong ldmatrix address, a missing
 * __syncthreads / __syncwarp / cp.async wait, an unscaled dK, ...) fails it.
 * What it cannot see: the real hardware's rounding inside the tensor cores
 * and MUFU (covered by the test's bounds), timing, and bank conflicts.
 *
 * ARCHITECTURES. cp.async and mma.sync with bf16 operands need compute
 * capability 8.0 (Ampere); a build also compiles this file for older ones
 * (75-real in the portable default, docs/gpus.md), where every kernel but
 * dsum is a stub that traps (so a new kernel that forgets the guard fails
 * to compile there, in ptxas, not at run time). The host side never
 * launches one there: zpp_attn_forward / _backward refuse a GPU below 8.0
 * (ZPP_ERR_UNSUPPORTED), and the model takes its GEMM path on such a GPU
 * (attention_path.h). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/attention_cuda.h"
#include "model/attention_path.h"

/* Compiling device code for an architecture without cp.async and bf16
 * mma.sync (below sm_80): the kernels are stubs (ARCHITECTURES above). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define ZPP_ATTN_STUB 1
/* (the helpers only the real kernels call go unreferenced there) */
#pragma nv_diag_suppress 177
#endif

namespace {

/* ==== hardware primitives =================================================
 * Everything that is PTX or a CUDA intrinsic; the kernels below use only
 * these, plain C++ and threadIdx / blockIdx / gridDim / __syncthreads /
 * __syncwarp / exp2f / log2f / fmaxf. */

/* The dynamic shared memory of the CTA, 16-byte aligned. */
__device__ __forceinline__ void *dyn_smem() {
    extern __shared__ uint4 zpp_attn_smem[];
    return zpp_attn_smem;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronous, cached in L2 only; valid == false
 * writes 16 zero bytes and reads nothing. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until all of this thread's committed groups but the newest N are done. */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 bf16 matrices from shared memory: lane l gives the address of row
 * l % 8 of matrix l / 8; register i gets, in lane l, elements 2(l%4), +1 of
 * row l/4 of matrix i (with .trans: of column l/4, rows 2(l%4), +1). */
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* d += A B, A 16x16 bf16 (row), B 16x8 bf16 (col), d 16x8 fp32. With
 * g = lane / 4, q = lane % 4: a0 = A[g][2q..], a1 = A[g+8][2q..],
 * a2 = A[g][2q+8..], a3 = A[g+8][2q+8..]; b0 = B[2q..][g], b1 = B[2q+8..][g];
 * d0,d1 = D[g][2q..], d2,d3 = D[g+8][2q..] (".." = that element and the
 * next; the lower index in the lower 16 bits). */
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> two bf16 (round to nearest even), lo in the low 16 bits. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The bf16 in the low / high half of a word, as fp32 (exact). */
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float shfl_xor(float v, int m) {
    return __shfl_xor_sync(0xffffffffu, v, m);
}

/* ==== end of hardware primitives ========================================= */

/* ==== kernels ============================================================= */

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kDsumThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* 1/sqrt(hs), correctly rounded, for the supported head sizes. */
__host__ __device__ constexpr float inv_sqrt_hs(int hs) {
    return hs == 64 ? 0.125f : 0.0883883476483184405f; /* 1/sqrt(128) */
}

/* Shared-memory row stride in elements: hs + 8 (see the header comment). */
__host__ __device__ constexpr int row_ld(int hs) { return hs + 8; }

/* Tile shapes (BR query rows x BC keys) and shared memory per kernel. The
 * CTA-owned side is always kWarps * 16 = 64. */
template <int HS>
struct FwdTile {
    static constexpr int BR = 16 * kWarps, BC = 64;
    /* Q, then K and V double-buffered */
    static constexpr size_t smem = (size_t)(BR + 4 * BC) * row_ld(HS) * 2;
};
template <int HS>
struct DkdvTile {
    static constexpr int BC = 16 * kWarps, BR = HS == 128 ? 32 : 64;
    /* K, V, then Q and dY double-buffered, then lse and D double-buffered */
    static constexpr size_t smem = (size_t)(2 * BC + 4 * BR) * row_ld(HS) * 2 +
                                   (size_t)4 * BR * sizeof(float);
};
template <int HS>
struct DqTile {
    static constexpr int BR = 16 * kWarps, BC = HS == 128 ? 32 : 64;
    /* Q, dY, then K and V double-buffered */
    static constexpr size_t smem = (size_t)(2 * BR + 4 * BC) * row_ld(HS) * 2;
};

/* Rows row0 .. row0+ROWS-1 of a bf16 matrix g (leading dimension ldg) into
 * the smem tile at shared address s (row stride row_ld(HS)), asynchronously;
 * rows >= T become zeros. Each thread issues ROWS*HS/8/kThreads 16-byte
 * copies; a warp covers whole rows (coalesced). */
template <int HS, int ROWS>
__device__ __forceinline__ void load_rows(uint32_t s, const uint16_t *g, size_t ldg, int row0,
                                          int T) {
    constexpr int CPR = HS / 8, LD = row_ld(HS);
    static_assert((ROWS * CPR) % kThreads == 0, "tile not a multiple of the CTA's copies");
#pragma unroll
    for (int i = 0; i < ROWS * CPR / kThreads; i++) {
        const int c = (int)threadIdx.x + i * kThreads;
        const int r = c / CPR, k = c % CPR;
        const bool ok = row0 + r < T;
        const uint16_t *src = g + (size_t)(ok ? row0 + r : 0) * ldg + k * 8;
        cp_async16(s + (uint32_t)(r * LD + k * 8) * 2u, src, ok);
    }
}

/* lse (to log2 units) and D of query rows q0 .. q0+BR-1 into smem; rows >= T
 * get lse = +inf (so P = exp2(x - inf) = 0) and D = 0. */
template <int BR>
__device__ __forceinline__ void load_stats(float *sL, float *sD, const float *lse_bh,
                                           const float *dsum_bh, int q0, int T) {
    for (int i = (int)threadIdx.x; i < BR; i += kThreads) {
        const bool ok = q0 + i < T;
        sL[i] = ok ? lse_bh[q0 + i] * kLog2e : INFINITY;
        sD[i] = ok ? dsum_bh[q0 + i] : 0.0f;
    }
}

/* ldmatrix addresses (shared, bytes) of one lane, for a tile at `base` with
 * row stride LD elements:
 *   a_addr:   A operand (16 x 16) = rows r0.., columns c0.. of a row-major
 *             tile: matrices (r0, c0) (r0+8, c0) (r0, c0+8) (r0+8, c0+8)
 *             = a0 a1 a2 a3.
 *   bnk_addr: B operands of n-tiles n0 and n0+8, k-step k0, from a tile
 *             stored [n][k] (K in Q K^T): matrices (n0, k0) (n0, k0+8)
 *             (n0+8, k0) (n0+8, k0+8) = b0 b1 of n0, b0 b1 of n0+8.
 *   bkn_addr: the same from a tile stored [k][n] (V in P V), with .trans:
 *             matrices (k0, n0) (k0+8, n0) (k0, n0+8) (k0+8, n0+8). */
__device__ __forceinline__ uint32_t a_addr(uint32_t base, int LD, int r0, int c0, int lane) {
    return base + 2u * (uint32_t)((r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8);
}
__device__ __forceinline__ uint32_t bnk_addr(uint32_t base, int LD, int n0, int k0, int lane) {
    return base + 2u * (uint32_t)((n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 +
                                  ((lane >> 3) & 1) * 8);
}
__device__ __forceinline__ uint32_t bkn_addr(uint32_t base, int LD, int k0, int n0, int lane) {
    return base + 2u * (uint32_t)((k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * LD + n0 +
                                  (lane >> 4) * 8);
}

/* acc (16 x 8NT) += A B^T for A = rows a_row0..+15 of the tile at a_base
 * and B = rows 0..8NT-1 of the tile at b_base, both [row][HS] in smem:
 * S = Q K^T, S^T = K Q^T, dP = dY V^T, dP^T = V dY^T. */
template <int HS, int NT>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], uint32_t a_base, int a_row0,
                                        uint32_t b_base, int lane) {
    constexpr int LD = row_ld(HS);
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        uint32_t a[4];
        ldsm_x4(a_addr(a_base, LD, a_row0, ks * 16, lane), a);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bq[4];
            ldsm_x4(bnk_addr(b_base, LD, np * 16, ks * 16, lane), bq);
            mma_bf16(acc[2 * np], a, bq[0], bq[1]);
            mma_bf16(acc[2 * np + 1], a, bq[2], bq[3]);
        }
    }
}

/* acc (16 x HS) += X V where X (16 x 8NK) is in registers in the
 * accumulator layout (n-tiles 2kk, 2kk+1 = k-step kk) and V = rows 0..8NK-1
 * of the [row][HS] tile at v_base: P V, P^T dY, dS K, dS^T Q. X is rounded
 * to bf16 here. */
template <int HS, int NK>
__device__ __forceinline__ void mma_xv(float (&acc)[HS / 8][4], const float (&x)[NK][4],
                                       uint32_t v_base, int lane) {
    constexpr int LD = row_ld(HS);
#pragma unroll
    for (int kk = 0; kk < NK / 2; kk++) {
        const uint32_t a[4] = {pack_bf16(x[2 * kk][0], x[2 * kk][1]),
                               pack_bf16(x[2 * kk][2], x[2 * kk][3]),
                               pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                               pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            uint32_t bv[4];
            ldsm_x4_trans(bkn_addr(v_base, LD, kk * 16, dp * 16, lane), bv);
            mma_bf16(acc[2 * dp], a, bv[0], bv[1]);
            mma_bf16(acc[2 * dp + 1], a, bv[2], bv[3]);
        }
    }
}

/* A warp's 16 x HS accumulator (rows 0..7 times mul0, rows 8..15 times
 * mul1) as bf16 into rows grow0..grow0+15 of g (leading dimension ldg),
 * rows >= T skipped, through the warp's own 16 smem rows at s. */
template <int HS>
__device__ __forceinline__ void store_rows(uint16_t *g, size_t ldg, int grow0, int T,
                                           uint16_t *s, const float (&acc)[HS / 8][4],
                                           float mul0, float mul1, int lane) {
    constexpr int LD = row_ld(HS), CPR = HS / 8;
    const int g8 = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
        *reinterpret_cast<uint32_t *>(s + g8 * LD + dt * 8 + 2 * tq) =
            pack_bf16(acc[dt][0] * mul0, acc[dt][1] * mul0);
        *reinterpret_cast<uint32_t *>(s + (g8 + 8) * LD + dt * 8 + 2 * tq) =
            pack_bf16(acc[dt][2] * mul1, acc[dt][3] * mul1);
    }
    __syncwarp();
#pragma unroll
    for (int c = lane; c < 16 * CPR; c += 32) {
        const int r = c / CPR, k = c % CPR;
        if (grow0 + r < T)
            *reinterpret_cast<uint4 *>(g + (size_t)(grow0 + r) * ldg + k * 8) =
                *reinterpret_cast<const uint4 *>(s + r * LD + k * 8);
    }
}

/* Key head j of sequence b in a qkv of row stride ld whose H query heads
 * take the first C = H HS columns (its value head is KV HS further). */
template <int HS>
__device__ __forceinline__ const uint16_t *kv_head(const uint16_t *qkv, int b, int T, size_t ld,
                                                   size_t C, int j) {
    return qkv + (size_t)b * T * ld + C + (size_t)j * HS;
}

/* ---- forward ----------------------------------------------------------------
 * grid (B*H, ceil(T/64)); CTA (bh, y) owns query tile nq-1-y. The kernel is
 * three stages, each a helper below (inlined, so the code is one function):
 * fwd_load_q, then fwd_kv_tile for each key tile up to the diagonal, then
 * fwd_epilogue. */

/* Stage 1: the CTA's Q tile (rows q0..q0+BR-1) and key tile 0 (K and V)
 * into shared memory, then this warp's 16 query rows as the A fragments of
 * every k-step of Q K^T, kept in registers for all the key tiles. */
template <int HS>
__device__ __forceinline__ void fwd_load_q(uint32_t (&qf)[HS / 16][4], uint32_t aQ, uint32_t aK,
                                           uint32_t aV, const uint16_t *Qg, const uint16_t *Kg,
                                           const uint16_t *Vg, size_t ld, int q0, int T,
                                           int warp, int lane) {
    constexpr int LD = row_ld(HS), BR = FwdTile<HS>::BR, BC = FwdTile<HS>::BC;
    load_rows<HS, BR>(aQ, Qg, ld, q0, T);
    load_rows<HS, BC>(aK, Kg, ld, 0, T);
    load_rows<HS, BC>(aV, Vg, ld, 0, T);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) ldsm_x4(a_addr(aQ, LD, warp * 16, ks * 16, lane), qf[ks]);
}

/* S = Q K^T for this warp's 16 rows x BC keys of key tile kt (K at kb); on
 * the diagonal tile (kt == qt; BR == BC) key > query is masked to -inf. */
template <int HS>
__device__ __forceinline__ void fwd_scores(float (&s)[FwdTile<HS>::BC / 8][4],
                                           const uint32_t (&qf)[HS / 16][4], uint32_t kb, int kt,
                                           int qt, const int (&row)[2], int lane, int tq) {
    constexpr int LD = row_ld(HS), BC = FwdTile<HS>::BC, NT = BC / 8;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bk[4];
            ldsm_x4(bnk_addr(kb, LD, np * 16, ks * 16, lane), bk);
            mma_bf16(s[2 * np], qf[ks], bk[0], bk[1]);
            mma_bf16(s[2 * np + 1], qf[ks], bk[2], bk[3]);
        }
    }
    if (kt == qt) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (kt * BC + nt * 8 + 2 * tq + (e & 1) > row[e >> 1]) s[nt][e] = -INFINITY;
    }
}

/* The online softmax step (THE MATH): the tile's row maxima raise the
 * running max m to m', the old sum l and output o are rescaled by
 * exp2(m - m'), and the scores s become P = exp2(x - m') (x = S c), added
 * into l. */
template <int HS>
__device__ __forceinline__ void fwd_softmax_rescale(float (&s)[FwdTile<HS>::BC / 8][4],
                                                    float (&o)[HS / 8][4], float (&m)[2],
                                                    float (&l)[2], float c) {
    constexpr int NT = FwdTile<HS>::BC / 8, DT = HS / 8;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        /* a row lives in the 4 lanes of a quad */
        mx[r] = fmaxf(mx[r], shfl_xor(mx[r], 1));
        mx[r] = fmaxf(mx[r], shfl_xor(mx[r], 2));
        const float mn = fmaxf(m[r], mx[r] * c);
        base[r] = mn == -INFINITY ? 0.0f : mn;
        const float corr = exp2f(m[r] - base[r]); /* 0 on the first tile */
        m[r] = mn;
        l[r] *= corr;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][2 * r] *= corr;
            o[dt][2 * r + 1] *= corr;
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[nt][e] = exp2f(s[nt][e] * c - base[e >> 1]); /* masked: exp2(-inf) = 0 */
            l[e >> 1] += s[nt][e];
        }
}

/* Stage 2, once per key tile kt = 0..qt (K at kb, V at vb, already in
 * shared memory): scores, online softmax, then O += P V (P rounded to bf16
 * as the operand). */
template <int HS>
__device__ __forceinline__ void fwd_kv_tile(float (&o)[HS / 8][4], float (&m)[2], float (&l)[2],
                                            const uint32_t (&qf)[HS / 16][4], uint32_t kb,
                                            uint32_t vb, int kt, int qt, const int (&row)[2],
                                            float c, int lane, int tq) {
    constexpr int NT = FwdTile<HS>::BC / 8;
    float s[NT][4];
    fwd_scores<HS>(s, qf, kb, kt, qt, row, lane, tq);
    fwd_softmax_rescale<HS>(s, o, m, l, c);
    mma_xv<HS, NT>(o, s, vb, lane);
}

/* Stage 3: the row sums l completed over the quad, Y = O / l into the
 * warp's 16 rows of the query tile at q0 (sequence b, head h; through the
 * warp's own smem rows of sQ), and lse = (m + log2 l) ln 2 of the real rows
 * by one lane per quad. */
template <int HS>
__device__ __forceinline__ void fwd_epilogue(uint16_t *y, float *lse, int b, int h, int bh,
                                             int q0, int T, size_t C, uint16_t *sQ,
                                             const float (&o)[HS / 8][4], const float (&m)[2],
                                             float (&l)[2], const int (&row)[2], int warp,
                                             int lane, int tq) {
    constexpr int LD = row_ld(HS);
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += shfl_xor(l[r], 1);
        l[r] += shfl_xor(l[r], 2);
        inv[r] = 1.0f / l[r];
    }
    store_rows<HS>(y + (size_t)b * T * C + (size_t)h * HS, C, q0 + warp * 16, T,
                   sQ + warp * 16 * LD, o, inv[0], inv[1], lane);
    if (tq == 0) {
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (row[r] < T) lse[(size_t)bh * T + row[r]] = (m[r] + log2f(l[r])) * kLn2;
    }
}

template <int HS>
__global__ void __launch_bounds__(kThreads, 2)
    attn_fwd_kernel(uint16_t *__restrict__ y, float *__restrict__ lse,
                    const uint16_t *__restrict__ qkv, int T, int H, int KV) {
#ifdef ZPP_ATTN_STUB
    __trap();
#else
    constexpr int LD = row_ld(HS), BR = FwdTile<HS>::BR, BC = FwdTile<HS>::BC;
    constexpr int DT = HS / 8;
    constexpr uint32_t kTileBytes = BC * LD * 2;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int g8 = lane >> 2, tq = lane & 3;
    const int bh = (int)blockIdx.x, b = bh / H, h = bh - b * H;
    const int qt = (int)gridDim.y - 1 - (int)blockIdx.y, q0 = qt * BR;
    const size_t C = (size_t)H * HS, ld = C + 2 * (size_t)KV * HS;
    const uint16_t *Qg = qkv + (size_t)b * T * ld + (size_t)h * HS;
    const uint16_t *Kg = kv_head<HS>(qkv, b, T, ld, C, h / (H / KV)), *Vg = Kg + (size_t)KV * HS;

    uint16_t *sQ = static_cast<uint16_t *>(dyn_smem());
    const uint32_t aQ = smem_u32(sQ), aK = aQ + BR * LD * 2, aV = aK + 2 * kTileBytes;

    uint32_t qf[HS / 16][4];
    fwd_load_q<HS>(qf, aQ, aK, aV, Qg, Kg, Vg, ld, q0, T, warp, lane);

    const float c = kLog2e * inv_sqrt_hs(HS); /* x = S_ij * c, in log2 units */
    const int row[2] = {q0 + warp * 16 + g8, q0 + warp * 16 + g8 + 8};
    float m[2] = {-INFINITY, -INFINITY}; /* running max of x, per row */
    float l[2] = {0.0f, 0.0f};           /* this thread's part of the running sum */
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        const uint32_t kb = aK + (uint32_t)(kt & 1) * kTileBytes;
        const uint32_t vb = aV + (uint32_t)(kt & 1) * kTileBytes;
        if (kt < qt) { /* prefetch the next key tile into the other buffer */
            const uint32_t nb = (uint32_t)((kt + 1) & 1) * kTileBytes;
            load_rows<HS, BC>(aK + nb, Kg, ld, (kt + 1) * BC, T);
            load_rows<HS, BC>(aV + nb, Vg, ld, (kt + 1) * BC, T);
        }
        cp_async_commit();

        fwd_kv_tile<HS>(o, m, l, qf, kb, vb, kt, qt, row, c, lane, tq);

        cp_async_wait<0>(); /* the next tile has landed (this thread's part) */
        __syncthreads();    /* ... everyone's; and this tile's buffers are free */
    }

    fwd_epilogue<HS>(y, lse, b, h, bh, q0, T, C, sQ, o, m, l, row, warp, lane, tq);
#endif
}

/* ---- backward: D = rowsum(dY o Y) -------------------------------------------
 * One group of HS/8 lanes (8 or 16, aligned inside a warp) per (row n, head
 * h): one 16-byte vector of dY and of Y per lane, a fixed-order shuffle sum.
 * dsum[(b*H + h)*T + t] for n = b*T + t. */
template <int HS>
__global__ void __launch_bounds__(kDsumThreads)
    attn_dsum_kernel(float *__restrict__ dsum, const uint16_t *__restrict__ dy,
                     const uint16_t *__restrict__ y, int T, int H, long long n_pairs) {
    constexpr int G = HS / 8;
    const long long t = (long long)blockIdx.x * kDsumThreads + threadIdx.x;
    const long long pair = t / G;
    const int part = (int)(t % G);
    float acc = 0.0f;
    if (pair < n_pairs) {
        const size_t off = (size_t)pair * HS + (size_t)part * 8; /* (n*H + h)*HS + ... */
        const uint4 a = *reinterpret_cast<const uint4 *>(dy + off);
        const uint4 v = *reinterpret_cast<const uint4 *>(y + off);
        acc = bf16_lo(a.x) * bf16_lo(v.x) + bf16_hi(a.x) * bf16_hi(v.x);
        acc += bf16_lo(a.y) * bf16_lo(v.y) + bf16_hi(a.y) * bf16_hi(v.y);
        acc += bf16_lo(a.z) * bf16_lo(v.z) + bf16_hi(a.z) * bf16_hi(v.z);
        acc += bf16_lo(a.w) * bf16_lo(v.w) + bf16_hi(a.w) * bf16_hi(v.w);
    }
#pragma unroll
    for (int mk = G / 2; mk >= 1; mk >>= 1) acc += shfl_xor(acc, mk);
    if (pair < n_pairs && part == 0) {
        const long long n = pair / H, bb = n / T;
        const int h = (int)(pair - n * H);
        dsum[((size_t)bb * H + h) * T + (size_t)(n - bb * T)] = acc;
    }
}

/* ---- backward: dK, dV -------------------------------------------------------
 * grid (B*KV, ceil(T/64)); CTA (b*KV + j, y) owns keys 64y .. 64y+63 (warp
 * w: 16 of them) of key/value head j and walks, for each query head of its
 * group (h = jG .. jG+G-1, G = H / KV, in that order), the query tiles from
 * the one holding key 64y to the end: dK and dV of a shared head are the
 * sums over its group, added in registers in that fixed order (GROUPED
 * QUERIES at the top). With G = 1 this is one head's walk, as before. */
template <int HS>
__global__ void __launch_bounds__(kThreads, 2)
    attn_dkdv_kernel(uint16_t *__restrict__ dqkv, const uint16_t *__restrict__ dy,
                     const uint16_t *__restrict__ qkv, const float *__restrict__ lse,
                     const float *__restrict__ dsum, int T, int H, int KV) {
#ifdef ZPP_ATTN_STUB
    __trap();
#else
    constexpr int LD = row_ld(HS), BC = DkdvTile<HS>::BC, BR = DkdvTile<HS>::BR;
    constexpr int NT = BR / 8, DT = HS / 8;
    constexpr uint32_t kTileBytes = BR * LD * 2;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int g8 = lane >> 2, tq = lane & 3;
    const int bj = (int)blockIdx.x, b = bj / KV, j = bj - b * KV, G = H / KV, h0 = j * G;
    const int k0 = (int)blockIdx.y * BC;
    const int nq = (T + BR - 1) / BR, qt0 = k0 / BR;
    const size_t C = (size_t)H * HS, ld = C + 2 * (size_t)KV * HS;
    /* the group's first query head; head h0 + gi is gi HS columns (q, dY)
     * or gi T entries (lse, D) further */
    const uint16_t *Qg = qkv + (size_t)b * T * ld + (size_t)h0 * HS;
    const uint16_t *Kg = kv_head<HS>(qkv, b, T, ld, C, j), *Vg = Kg + (size_t)KV * HS;
    const uint16_t *dYg = dy + (size_t)b * T * C + (size_t)h0 * HS;
    const size_t bh0 = (size_t)b * H + h0;
    const float *lse_bh = lse + bh0 * T, *dsum_bh = dsum + bh0 * T;

    uint16_t *sK = static_cast<uint16_t *>(dyn_smem());
    uint16_t *sV = sK + BC * LD, *sQ = sV + BC * LD, *sdY = sQ + 2 * BR * LD;
    float *sL = reinterpret_cast<float *>(sdY + 2 * BR * LD), *sD = sL + 2 * BR;
    const uint32_t aK = smem_u32(sK), aV = smem_u32(sV), aQ = smem_u32(sQ),
                   adY = smem_u32(sdY);

    load_rows<HS, BC>(aK, Kg, ld, k0, T);
    load_rows<HS, BC>(aV, Vg, ld, k0, T);
    load_rows<HS, BR>(aQ, Qg, ld, qt0 * BR, T);
    load_rows<HS, BR>(adY, dYg, C, qt0 * BR, T);
    load_stats<BR>(sL, sD, lse_bh, dsum_bh, qt0 * BR, T);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    const float c = kLog2e * inv_sqrt_hs(HS);
    const int key[2] = {k0 + warp * 16 + g8, k0 + warp * 16 + g8 + 8};
    float dk[DT][4], dv[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[dt][e] = dv[dt][e] = 0.0f;

    /* step `it` is query head h0 + gi, tile qt: gi = it / (nq - qt0) */
    const int steps = G * (nq - qt0);
    for (int it = 0, gi = 0, qt = qt0; it < steps; it++) {
        const int buf = it & 1, q0 = qt * BR;
        const uint32_t qb = aQ + (uint32_t)buf * kTileBytes, yb = adY + (uint32_t)buf * kTileBytes;
        const float *L = sL + buf * BR, *D = sD + buf * BR;
        if (it + 1 < steps) { /* prefetch the next step's tile into the other buffer */
            const int nb = buf ^ 1, last = qt + 1 == nq;
            const int ng = last ? gi + 1 : gi, nq0 = last ? qt0 * BR : q0 + BR;
            load_rows<HS, BR>(aQ + (uint32_t)nb * kTileBytes, Qg + (size_t)ng * HS, ld, nq0, T);
            load_rows<HS, BR>(adY + (uint32_t)nb * kTileBytes, dYg + (size_t)ng * HS, C, nq0, T);
            load_stats<BR>(sL + nb * BR, sD + nb * BR, lse_bh + (size_t)ng * T,
                           dsum_bh + (size_t)ng * T, nq0, T);
        }
        cp_async_commit();

        /* P^T = exp2(c K Q^T - lse): this warp's 16 keys x BR queries */
        float pt[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) pt[nt][0] = pt[nt][1] = pt[nt][2] = pt[nt][3] = 0.0f;
        mma_abt<HS, NT>(pt, aK, warp * 16, qb, lane);
        const bool diag = q0 < k0 + BC - 1; /* some query < some key */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nt * 8 + 2 * tq + (e & 1);
                float p = exp2f(pt[nt][e] * c - L[qi]);
                if (diag && q0 + qi < key[e >> 1]) p = 0.0f;
                pt[nt][e] = p;
            }

        /* dP^T = V dY^T */
        float dpt[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) dpt[nt][0] = dpt[nt][1] = dpt[nt][2] = dpt[nt][3] = 0.0f;
        mma_abt<HS, NT>(dpt, aV, warp * 16, yb, lane);

        /* dV += P^T dY */
        mma_xv<HS, NT>(dv, pt, yb, lane);

        /* dS^T = P^T o (dP^T - D) */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dpt[nt][e] = pt[nt][e] * (dpt[nt][e] - D[nt * 8 + 2 * tq + (e & 1)]);

        /* dK += dS^T Q (times c at the end) */
        mma_xv<HS, NT>(dk, dpt, qb, lane);

        cp_async_wait<0>();
        __syncthreads();
        if (++qt == nq) qt = qt0, gi++;
    }

    /* sK / sV rows warp*16.. were read only by this warp: staging for its rows */
    uint16_t *dKg = dqkv + (Kg - qkv);
    store_rows<HS>(dKg, ld, k0 + warp * 16, T, sK + warp * 16 * LD, dk, inv_sqrt_hs(HS),
                   inv_sqrt_hs(HS), lane);
    store_rows<HS>(dKg + (size_t)KV * HS, ld, k0 + warp * 16, T, sV + warp * 16 * LD, dv, 1.0f,
                   1.0f, lane);
#endif
}

/* ---- backward: dQ -------------------------------------------------------------
 * grid (B*H, ceil(T/64)); CTA (bh, y) owns query tile nq-1-y (warp w: 16
 * rows) and walks the key tiles up to its last row. */
template <int HS>
__global__ void __launch_bounds__(kThreads, 2)
    attn_dq_kernel(uint16_t *__restrict__ dqkv, const uint16_t *__restrict__ dy,
                   const uint16_t *__restrict__ qkv, const float *__restrict__ lse,
                   const float *__restrict__ dsum, int T, int H, int KV) {
#ifdef ZPP_ATTN_STUB
    __trap();
#else
    constexpr int LD = row_ld(HS), BR = DqTile<HS>::BR, BC = DqTile<HS>::BC;
    constexpr int NT = BC / 8, DT = HS / 8;
    constexpr uint32_t kTileBytes = BC * LD * 2;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int g8 = lane >> 2, tq = lane & 3;
    const int bh = (int)blockIdx.x, b = bh / H, h = bh - b * H;
    const int qt = (int)gridDim.y - 1 - (int)blockIdx.y, q0 = qt * BR;
    const int kt_last = ((q0 + BR < T ? q0 + BR : T) - 1) / BC;
    const size_t C = (size_t)H * HS, ld = C + 2 * (size_t)KV * HS;
    const uint16_t *Qg = qkv + (size_t)b * T * ld + (size_t)h * HS;
    const uint16_t *Kg = kv_head<HS>(qkv, b, T, ld, C, h / (H / KV)), *Vg = Kg + (size_t)KV * HS;
    const uint16_t *dYg = dy + (size_t)b * T * C + (size_t)h * HS;

    uint16_t *sQ = static_cast<uint16_t *>(dyn_smem());
    uint16_t *sdY = sQ + BR * LD;
    const uint32_t aQ = smem_u32(sQ), adY = smem_u32(sdY), aK = adY + BR * LD * 2,
                   aV = aK + 2 * kTileBytes;

    load_rows<HS, BR>(aQ, Qg, ld, q0, T);
    load_rows<HS, BR>(adY, dYg, C, q0, T);
    load_rows<HS, BC>(aK, Kg, ld, 0, T);
    load_rows<HS, BC>(aV, Vg, ld, 0, T);
    cp_async_commit();

    const float c = kLog2e * inv_sqrt_hs(HS);
    const int row[2] = {q0 + warp * 16 + g8, q0 + warp * 16 + g8 + 8};
    float lrow[2], drow[2]; /* lse in log2 units, D; rows >= T: P = 0 */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool ok = row[r] < T;
        lrow[r] = ok ? lse[(size_t)bh * T + row[r]] * kLog2e : INFINITY;
        drow[r] = ok ? dsum[(size_t)bh * T + row[r]] : 0.0f;
    }
    float dq[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

    cp_async_wait<0>();
    __syncthreads();

    for (int kt = 0; kt <= kt_last; kt++) {
        const int k0 = kt * BC;
        const uint32_t kb = aK + (uint32_t)(kt & 1) * kTileBytes;
        const uint32_t vb = aV + (uint32_t)(kt & 1) * kTileBytes;
        if (kt < kt_last) {
            const uint32_t nb = (uint32_t)((kt + 1) & 1) * kTileBytes;
            load_rows<HS, BC>(aK + nb, Kg, ld, k0 + BC, T);
            load_rows<HS, BC>(aV + nb, Vg, ld, k0 + BC, T);
        }
        cp_async_commit();

        /* P = exp2(c Q K^T - lse): this warp's 16 rows x BC keys */
        float p[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) p[nt][0] = p[nt][1] = p[nt][2] = p[nt][3] = 0.0f;
        mma_abt<HS, NT>(p, aQ, warp * 16, kb, lane);
        const bool diag = k0 + BC - 1 > q0; /* some key > some query */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = exp2f(p[nt][e] * c - lrow[e >> 1]);
                if (diag && k0 + nt * 8 + 2 * tq + (e & 1) > row[e >> 1]) x = 0.0f;
                p[nt][e] = x;
            }

        /* dP = dY V^T, then dS = P o (dP - D) in place */
        float ds[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) ds[nt][0] = ds[nt][1] = ds[nt][2] = ds[nt][3] = 0.0f;
        mma_abt<HS, NT>(ds, adY, warp * 16, vb, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) ds[nt][e] = p[nt][e] * (ds[nt][e] - drow[e >> 1]);

        /* dQ += dS K (times c at the end) */
        mma_xv<HS, NT>(dq, ds, kb, lane);

        cp_async_wait<0>();
        __syncthreads();
    }

    /* sQ rows warp*16.. were read only by this warp: staging for its rows */
    store_rows<HS>(dqkv + (size_t)b * T * ld + (size_t)h * HS, ld, q0 + warp * 16, T,
                   sQ + warp * 16 * LD, dq, inv_sqrt_hs(HS), inv_sqrt_hs(HS), lane);
#endif
}

/* ==== end of kernels ====================================================== */

/* ==== host side =========================================================== */

zpp_status launch_status(const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA, "%s: kernel launch failed: %s (%s)", what,
                         cudaGetErrorString(e), cudaGetErrorName(e));
    return ZPP_OK;
}

/* Kernels above 48 KiB of dynamic shared memory must ask for it (per
 * function and device; cheap, so asked at every call). */
template <class Kernel>
zpp_status allow_smem(Kernel kernel, size_t bytes, const char *what) {
    if (bytes <= 48 * 1024) return ZPP_OK;
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return zpp_error(ZPP_ERR_CUDA,
                         "%s: cannot give the kernel %zu bytes of shared memory: %s; the fused "
                         "attention needs a GPU with at least that much per block (sm_80+)",
                         what, bytes, cudaGetErrorString(e));
    return ZPP_OK;
}

zpp_status check_shape(const char *what, int B, int T, int H, int KV, int hs) {
    if (B < 1 || T < 1 || H < 1)
        return zpp_error(ZPP_ERR_INVALID, "%s: B = %d, T = %d, H = %d; each must be >= 1", what,
                         B, T, H);
    if (KV < 1 || H % KV != 0)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: KV = %d key/value heads must be >= 1 and divide H = %d (each "
                         "serves H / KV query heads)",
                         what, KV, H);
    if (hs != 64 && hs != 128)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "%s: head size %d is not supported by the fused kernels (64 or 128); "
                         "use the unfused attention path",
                         what, hs);
    if ((long long)B * H > INT_MAX)
        return zpp_error(ZPP_ERR_INVALID, "%s: B * H = %lld (sequence, head) pairs is more than "
                         "a grid holds (%d)", what, (long long)B * H, INT_MAX);
    if ((T + 63) / 64 > 65535)
        return zpp_error(ZPP_ERR_INVALID, "%s: T = %d is too long for the grid (at most %d)",
                         what, T, 65535 * 64);
    return ZPP_OK;
}

/* The current GPU can run the kernels (ARCHITECTURES at the top): asked at
 * every call, two attribute reads and no GPU work; the rule is
 * attention_path.h's, so the message is the one the model would give. */
zpp_status check_arch(const char *what, int hs) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zpp_error(ZPP_ERR_CUDA, "%s: the GPU's compute capability: %s (%s)", what,
                         cudaGetErrorString(e), cudaGetErrorName(e));
    }
    zpp_attn_path path;
    char why[256];
    const zpp_status st =
        zpp_attn_path_pick("fused", ZPP_BF16, hs, major, minor, &path, why, sizeof why);
    if (st != ZPP_OK) return zpp_error(st, "%s: %s", what, why);
    return ZPP_OK;
}

zpp_status check_ptr(const char *what, const char *name, const void *p, unsigned align) {
    if (!p) return zpp_error(ZPP_ERR_INVALID, "%s: %s is NULL", what, name);
    if ((uintptr_t)p % align)
        return zpp_error(ZPP_ERR_INVALID,
                         "%s: %s at %p is not %u-byte aligned; the kernels move 16-byte "
                         "vectors (cudaMalloc'd memory is 256-byte aligned)",
                         what, name, p, align);
    return ZPP_OK;
}

template <int HS>
zpp_status forward_hs(void *y, float *lse, const void *qkv, int B, int T, int H, int KV,
                      cudaStream_t st) {
    const char *what = "attention forward";
    constexpr size_t smem = FwdTile<HS>::smem;
    ZPP_CHECK(allow_smem(attn_fwd_kernel<HS>, smem, what));
    const dim3 grid((unsigned)(B * H), (unsigned)((T + FwdTile<HS>::BR - 1) / FwdTile<HS>::BR));
    attn_fwd_kernel<HS><<<grid, kThreads, smem, st>>>(
        static_cast<uint16_t *>(y), lse, static_cast<const uint16_t *>(qkv), T, H, KV);
    return launch_status(what);
}

template <int HS>
zpp_status backward_hs(void *dqkv, const void *dy, const void *qkv, const void *y,
                       const float *lse, float *dsum, int B, int T, int H, int KV,
                       cudaStream_t st) {
    const uint16_t *dy16 = static_cast<const uint16_t *>(dy);
    const uint16_t *qkv16 = static_cast<const uint16_t *>(qkv);
    uint16_t *dqkv16 = static_cast<uint16_t *>(dqkv);

    const long long pairs = (long long)B * T * H;
    const long long dsum_blocks = (pairs * (HS / 8) + kDsumThreads - 1) / kDsumThreads;
    if (dsum_blocks > INT_MAX)
        return zpp_error(ZPP_ERR_INVALID, "attention backward: B*T*H = %lld rows is too many",
                         pairs);
    attn_dsum_kernel<HS><<<(unsigned)dsum_blocks, kDsumThreads, 0, st>>>(
        dsum, dy16, static_cast<const uint16_t *>(y), T, H, pairs);
    ZPP_CHECK(launch_status("attention backward (D = rowsum(dY * Y))"));

    const char *what_kv = "attention backward (dK, dV)";
    constexpr size_t smem_kv = DkdvTile<HS>::smem;
    ZPP_CHECK(allow_smem(attn_dkdv_kernel<HS>, smem_kv, what_kv));
    const dim3 grid_kv((unsigned)(B * KV),
                       (unsigned)((T + DkdvTile<HS>::BC - 1) / DkdvTile<HS>::BC));
    attn_dkdv_kernel<HS><<<grid_kv, kThreads, smem_kv, st>>>(dqkv16, dy16, qkv16, lse, dsum, T,
                                                            H, KV);
    ZPP_CHECK(launch_status(what_kv));

    const char *what_q = "attention backward (dQ)";
    constexpr size_t smem_q = DqTile<HS>::smem;
    ZPP_CHECK(allow_smem(attn_dq_kernel<HS>, smem_q, what_q));
    const dim3 grid_q((unsigned)(B * H), (unsigned)((T + DqTile<HS>::BR - 1) / DqTile<HS>::BR));
    attn_dq_kernel<HS><<<grid_q, kThreads, smem_q, st>>>(dqkv16, dy16, qkv16, lse, dsum, T, H,
                                                         KV);
    return launch_status(what_q);
}

} /* namespace */

extern "C" zpp_status zpp_attn_supported(int hs) {
    if (zpp_attn_head_size_fused(hs)) return ZPP_OK;
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "fused attention: head size %d is not supported (64 or 128); use the "
                     "unfused (GEMM) attention path",
                     hs);
}

extern "C" zpp_status zpp_attn_gqa_forward(void *y, float *lse, const void *qkv, int B, int T,
                                           int H, int KV, int hs, void *stream) {
    const char *what = "attention forward";
    ZPP_CHECK(check_shape(what, B, T, H, KV, hs));
    ZPP_CHECK(check_ptr(what, "y", y, 16));
    ZPP_CHECK(check_ptr(what, "lse", lse, 4));
    ZPP_CHECK(check_ptr(what, "qkv", qkv, 16));
    ZPP_CHECK(check_arch(what, hs));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    return hs == 64 ? forward_hs<64>(y, lse, qkv, B, T, H, KV, st)
                    : forward_hs<128>(y, lse, qkv, B, T, H, KV, st);
}

extern "C" zpp_status zpp_attn_gqa_backward(void *dqkv, const void *dy, const void *qkv,
                                            const void *y, const float *lse, float *dsum, int B,
                                            int T, int H, int KV, int hs, void *stream) {
    const char *what = "attention backward";
    ZPP_CHECK(check_shape(what, B, T, H, KV, hs));
    ZPP_CHECK(check_ptr(what, "dqkv", dqkv, 16));
    ZPP_CHECK(check_ptr(what, "dy", dy, 16));
    ZPP_CHECK(check_ptr(what, "qkv", qkv, 16));
    ZPP_CHECK(check_ptr(what, "y", y, 16));
    ZPP_CHECK(check_ptr(what, "lse", lse, 4));
    ZPP_CHECK(check_ptr(what, "dsum", dsum, 4));
    ZPP_CHECK(check_arch(what, hs));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    return hs == 64 ? backward_hs<64>(dqkv, dy, qkv, y, lse, dsum, B, T, H, KV, st)
                    : backward_hs<128>(dqkv, dy, qkv, y, lse, dsum, B, T, H, KV, st);
}

/* Multi-head attention is the grouped-query one with every head its own
 * key and value (KV = H): the same kernels, the same arithmetic. */
extern "C" zpp_status zpp_attn_forward(void *y, float *lse, const void *qkv, int B, int T, int H,
                                       int hs, void *stream) {
    return zpp_attn_gqa_forward(y, lse, qkv, B, T, H, H, hs, stream);
}

extern "C" zpp_status zpp_attn_backward(void *dqkv, const void *dy, const void *qkv,
                                        const void *y, const float *lse, float *dsum, int B,
                                        int T, int H, int hs, void *stream) {
    return zpp_attn_gqa_backward(dqkv, dy, qkv, y, lse, dsum, B, T, H, H, hs, stream);
}
