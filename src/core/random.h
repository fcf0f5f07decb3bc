/* core/random.h — the one 64-bit mixer behind every deterministic stream in
 * zeropp (parameter init, data order, stochastic rounding, test and bench
 * data), usable from host C and from CUDA device code.
 *
 * zpp_mix64 is splitmix64's finaliser: a bijection on 64-bit words with full
 * avalanche (every output bit flips with probability ~1/2 when any input bit
 * does), so hashing a counter gives numbers that pass standard statistical
 * tests. zpp_splitmix64 walks the stream state += golden ratio, mix. */
#ifndef ZPP_CORE_RANDOM_H
#define ZPP_CORE_RANDOM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ZPP_HD __host__ __device__ __forceinline__
#else
#define ZPP_HD static inline
#endif

#define ZPP_GOLDEN64 0x9e3779b97f4a7c15ull

ZPP_HD uint64_t zpp_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next number of a splitmix64 stream. */
ZPP_HD uint64_t zpp_splitmix64(uint64_t *state) {
    *state += ZPP_GOLDEN64;
    return zpp_mix64(*state);
}

/* A hash of one word: the splitmix64 value after state z. */
ZPP_HD uint64_t zpp_hash64(uint64_t z) { return zpp_mix64(z + ZPP_GOLDEN64); }

/* ---- A normal sample with the same bits on host and device -------------
 *
 * Initial weights are drawn on the host (CPU model, tests) and on the GPU
 * (the CUDA model's init_params_device), and both must give the same fp32
 * bits. libm's log/cos and CUDA's differ in the last ulp, which changes the
 * fp32 rounding of a few values in a billion, so the Box-Muller transform
 * below uses only operations IEEE 754 rounds correctly on both sides:
 * + - * / and sqrt, in double, round to nearest. Each one is written as a
 * ZPP_D* macro: on the device the __d*_rn intrinsics, which nvcc never
 * fuses into an fma; on the host the plain operator, which C compiles
 * with -ffp-contract=off (CMakeLists.txt), so no fma there either. The two
 * sides then evaluate the same expression tree with the same roundings. */
#if defined(__CUDA_ARCH__)
#define ZPP_DADD(a, b) __dadd_rn((a), (b))
#define ZPP_DSUB(a, b) __dsub_rn((a), (b))
#define ZPP_DMUL(a, b) __dmul_rn((a), (b))
#define ZPP_DDIV(a, b) __ddiv_rn((a), (b))
#define ZPP_DSQRT(a) __dsqrt_rn(a)
#else
#define ZPP_DADD(a, b) ((a) + (b))
#define ZPP_DSUB(a, b) ((a) - (b))
#define ZPP_DMUL(a, b) ((a) * (b))
#define ZPP_DDIV(a, b) ((a) / (b))
#define ZPP_DSQRT(a) sqrt(a)
#endif

ZPP_HD uint64_t zpp_f64_bits(double x) {
#if defined(__CUDA_ARCH__)
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
#endif
}

ZPP_HD double zpp_f64_from_bits(uint64_t b) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double((long long)b);
#else
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
#endif
}

/* ln u for a positive normal double u (Box-Muller's u1 in (0, 1]), within
 * 1 ulp (fdlibm's e_log.c, whose coefficients these are).
 *
 * Reduction: u = m 2^k with m in [sqrt(1/2), sqrt(2)), read off the bits
 * (the exponent field gives k, the mantissa with exponent 0 gives m in
 * [1, 2), halved when >= sqrt(2): exact). Then ln u = k ln 2 + ln(1 + f),
 * f = m - 1 (exact, Sterbenz), |f| < 0.42.
 * Series: with s = f / (2 + f), 1 + f = (1 + s) / (1 - s), so
 *     ln(1 + f) = 2 atanh(s) = 2s + 2s^3/3 + 2s^5/5 + ...,  |s| <= 0.1716.
 * Write it as 2s + s R(z), z = s^2, where R(z) = Lg1 z + Lg2 z^2 + ... +
 * Lg7 z^7 is a minimax fit of 2z/3 + 2z^2/5 + ... (error < 2^-58.45 on the
 * interval: the truncated Taylor series would need 11 terms). Since
 * 2s = f - s f, with hfsq = f^2/2,
 *     ln(1 + f) = f - hfsq + s (hfsq + R),
 * where f is exact and the correction terms are small, so the rounding
 * errors stay below an ulp of the result. ln 2 is split into ln2_hi (its
 * top 32 bits, so k ln2_hi is exact for |k| < 2^20) and ln2_lo. */
ZPP_HD double zpp_log_positive(double u) {
    const double ln2_hi = 0x1.62e42feep-1, ln2_lo = 0x1.a39ef35793c76p-33;
    const double Lg1 = 0x1.5555555555593p-1, Lg2 = 0x1.999999997fa04p-2,
                 Lg3 = 0x1.2492494229359p-2, Lg4 = 0x1.c71c51d8e78afp-3,
                 Lg5 = 0x1.7466496cb03dep-3, Lg6 = 0x1.39a09d078c69fp-3,
                 Lg7 = 0x1.2f112df3e5244p-3;
    uint64_t bits = zpp_f64_bits(u);
    int k = (int)(bits >> 52) - 1023;
    double m = zpp_f64_from_bits((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m >= 0x1.6a09e667f3bcdp+0) { /* sqrt(2) */
        m = ZPP_DMUL(m, 0.5);
        k += 1;
    }
    double f = ZPP_DSUB(m, 1.0);
    double s = ZPP_DDIV(f, ZPP_DADD(2.0, f));
    double z = ZPP_DMUL(s, s), w = ZPP_DMUL(z, z);
    /* R in two interleaved halves (even and odd powers of z), as fdlibm */
    double t1 = ZPP_DMUL(w, ZPP_DADD(Lg2, ZPP_DMUL(w, ZPP_DADD(Lg4, ZPP_DMUL(w, Lg6)))));
    double t2 = ZPP_DMUL(
        z, ZPP_DADD(Lg1, ZPP_DMUL(w, ZPP_DADD(Lg3, ZPP_DMUL(w, ZPP_DADD(Lg5, ZPP_DMUL(w, Lg7)))))));
    double R = ZPP_DADD(t2, t1);
    double hfsq = ZPP_DMUL(ZPP_DMUL(0.5, f), f);
    double dk = (double)k;
    /* k ln2_hi - ((hfsq - (s (hfsq + R) + k ln2_lo)) - f) */
    double tail = ZPP_DADD(ZPP_DMUL(s, ZPP_DADD(hfsq, R)), ZPP_DMUL(dk, ln2_lo));
    return ZPP_DSUB(ZPP_DMUL(dk, ln2_hi), ZPP_DSUB(ZPP_DSUB(hfsq, tail), f));
}

/* cos(2 pi u) for u in [0, 1), within 2 ulp (tests/test_normal.c).
 *
 * Reduction, exact: 2 pi u = q pi/2 + 2 pi r with q = nearest integer to
 * 4u and r = u - q/4 in [-1/8, 1/8]. The subtraction is exact (Sterbenz:
 * u is within a factor 2 of q/4 when q > 0), so unlike cos(2 pi u) in
 * libm, where 2 pi u is rounded before the reduction, the result keeps
 * its relative accuracy next to the zeros at u = 1/4 and 3/4. Then
 *     q mod 4 = 0: cos t,  1: -sin t,  2: -cos t,  3: sin t,   t = 2 pi r,
 * with |t| <= pi/4, where Taylor series converge fast: written in r,
 *     cos(2 pi r) = sum_k (-1)^k (2 pi)^(2k) r^(2k) / (2k)!,
 *     sin(2 pi r) = sum_k (-1)^k (2 pi)^(2k+1) r^(2k+1) / (2k+1)!,
 * cut after r^16 and r^17: the first terms left out are below
 * (pi/4)^18/18! = 2e-18 and (pi/4)^19/19! = 8e-20, under 2^-53 of
 * results of magnitude >= sqrt(1/2). Coefficients: the exact values
 * rounded to double (mpmath). Horner's rule in z = r^2. */
ZPP_HD double zpp_cos_2pi(double u) {
    int q = (int)ZPP_DMUL(u, 4.0); /* floor(4u): 4u is exact */
    double r = ZPP_DSUB(u, ZPP_DMUL((double)q, 0.25));
    if (r > 0.125) { /* round 4u to nearest instead: r in [-1/8, 1/8] */
        q += 1;
        r = ZPP_DSUB(r, 0.25);
    }
    /* cos_k = (-1)^k (2 pi)^(2k) / (2k)!, sin_k = (-1)^k (2 pi)^(2k+1) / (2k+1)! */
    const double cos_k[9] = {1.0,
                             -0x1.3bd3cc9be45dep+4, 0x1.03c1f081b5ac4p+6, -0x1.55d3c7e3cbffap+6,
                             0x1.e1f506891babbp+5, -0x1.a6d1f2a204a8cp+4, 0x1.f9d38a3763cc3p+2,
                             -0x1.b6e24f44b128fp+0, 0x1.20c62c2f2d7f5p-2};
    const double sin_k[9] = {0x1.921fb54442d18p+2,
                             -0x1.4abbce625be53p+5, 0x1.466bc6775aae2p+6, -0x1.32d2cce62bd86p+6,
                             0x1.50783487ee782p+5, -0x1.e3074fde8871fp+3, 0x1.e8f434d018d63p+1,
                             -0x1.6fadb9f155744p-1, 0x1.aaec32af93359p-4};
    double z = ZPP_DMUL(r, r);
    double c = cos_k[8], s = sin_k[8];
    for (int i = 7; i >= 0; i--) {
        c = ZPP_DADD(cos_k[i], ZPP_DMUL(z, c));
        s = ZPP_DADD(sin_k[i], ZPP_DMUL(z, s));
    }
    s = ZPP_DMUL(r, s);
    switch (q & 3) {
    case 0: return c;
    case 1: return -s;
    case 2: return -c;
    default: return s;
    }
}

/* One N(0, 1) sample from two uniforms by Box-Muller:
 *     z = sqrt(-2 ln u1) cos(2 pi u2),  u1 in (0, 1], u2 in [0, 1).
 * (u1, u2) uniform on the square makes the pair (sqrt(-2 ln u1), 2 pi u2)
 * the polar coordinates of two independent standard normals; this is the
 * first. The same bits on host and device (see above). */
ZPP_HD double zpp_box_muller(double u1, double u2) {
    return ZPP_DMUL(ZPP_DSQRT(ZPP_DMUL(-2.0, zpp_log_positive(u1))), zpp_cos_2pi(u2));
}

/* A standard normal that depends only on (seed, unit, index): every model
 * family's initial weights, the same bits on host and device.
 *
 * Each unit gets its own key; the two uniforms of element i are the
 * splitmix64 stream of that key at positions 2i+1 and 2i+2, and Box-Muller
 * (zpp_box_muller) maps them to one N(0, 1). u1 is never 0 (the +1 below),
 * so the log is finite; |z| <= sqrt(2 ln 2^53) ~ 8.6. */
ZPP_HD double zpp_param_normal(uint64_t seed, int unit, size_t index) {
    uint64_t key = zpp_mix64(seed ^ zpp_mix64((uint64_t)(unit + 1) * 0xd1342543de82ef95ull));
    uint64_t h1 = zpp_mix64(key + ZPP_GOLDEN64 * (2 * (uint64_t)index + 1));
    uint64_t h2 = zpp_mix64(key + ZPP_GOLDEN64 * (2 * (uint64_t)index + 2));
    double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53; /* (0, 1], exact */
    double u2 = (double)(h2 >> 11) * 0x1.0p-53;       /* [0, 1), exact */
    return zpp_box_muller(u1, u2);
}

#if !defined(__CUDACC__)
#include "zeropp.h"
/* n samples of N(0, 1) (Box-Muller on the splitmix64 stream from `seed`),
 * each rounded to `dtype`: benchmark and test data. */
void zpp_fill_normal(void *x, zpp_dtype dtype, size_t n, uint64_t seed);
#endif

#endif
