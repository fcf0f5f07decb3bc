/* test_normal.c — the host/device-identical normal sample of core/random.h
 * (zpp_log_positive, zpp_cos_2pi, zpp_box_muller) against long-double libm
 * and against the moments of N(0, 1), on fresh random inputs each run.
 *
 * THE BOUNDS (ulp = the spacing of doubles at the reference's magnitude).
 * - log: fdlibm's algorithm, proven within 1 ulp; the reference logl is
 *   within 1 ulp of long double (2^-11 of a double ulp). Bound: 1 ulp.
 * - cos(2 pi u): the reduction to r = u - q/4 is exact, so the error is
 *   the polynomial's: 2 pi rounded to double (< 0.4 ulp relative), the
 *   last Horner addition (0.5 ulp of its sum, up to 1 ulp of the result
 *   when the result sits low in its binade), the product by r (0.5 ulp),
 *   the higher terms' roundings scaled by z P / 2 pi < 0.1: at most 2 ulp
 *   (measured 1.6). The reference cosl(2 pi u) rounds its own argument
 *   2 pi u to long double, an absolute error up to 2 pi 2^-64 = 3.4e-19,
 *   added to the bound (it matters only next to the zeros, where the
 *   ulp is tiny). Next to the zeros, test_cos_near_zeros checks the
 *   relative accuracy that the exact reduction keeps.
 * - moments of z = zpp_box_muller(u1, u2) over n samples: the sample mean
 *   has standard error 1/sqrt(n), the mean of z^2 sqrt(2/n) (Var z^2 = 2),
 *   the mean of z^4 sqrt(96/n) (E z^8 = 105, (E z^4)^2 = 9). Bound: 5
 *   standard errors, which a correct sampler exceeds with probability
 *   ~6e-7 per moment. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "core/random.h"
#include "testlib.h"

static const long double two_pi_l = 6.283185307179586476925286766559005768L;

/* The spacing of doubles at |x| (x != 0). */
static double ulp_at(double x) {
    int e;
    frexp(fabs(x), &e);
    return ldexp(1.0, e - 53);
}

/* A uniform in (0, 1] on the grid of Box-Muller's u1 (multiples of 2^-53),
 * or, every other call, one scaled down by up to 2^-60 to reach every
 * binade the log's reduction sees. */
static double draw_log_input(zpp_rng *r, long i) {
    double u = (double)((zpp_rng_u64(r) >> 11) + 1) * 0x1.0p-53;
    if (i & 1) u = ldexp(u, -(int)(zpp_rng_u64(r) % 61));
    return u;
}

static void test_log_matches_libm(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    double worst = 0.0, worst_u = 1.0;
    for (long i = 0; i < 4000000; i++) {
        double u = draw_log_input(&r, i);
        long double ref = logl((long double)u);
        double got = zpp_log_positive(u);
        if (ref == 0.0L) {
            EXPECT(got == 0.0, "log(1) = %a, want 0", got);
            continue;
        }
        double err = (double)fabsl((long double)got - ref) / ulp_at((double)ref);
        if (err > worst) worst = err, worst_u = u;
    }
    printf("  log: worst %.3f ulp at u = %a (bound 1)\n", worst, worst_u);
    EXPECT(worst <= 1.0, "log(%a) off by %.3f ulp", worst_u, worst);
    /* the ends of Box-Muller's range, and exact powers of two */
    EXPECT(zpp_log_positive(1.0) == 0.0);
    EXPECT(zpp_log_positive(0.5) == -0x1.62e42fefa39efp-1, "%a", zpp_log_positive(0.5));
    double tiny = zpp_log_positive(0x1.0p-53);
    EXPECT(fabs(tiny - (double)(-53.0L * logl(2.0L))) <= ulp_at(tiny), "log(2^-53) = %a", tiny);
}

static void test_cos_matches_libm(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    const double arg_err = 3.5e-19; /* 2 pi 2^-64: cosl's argument rounding */
    double worst = 0.0, worst_u = 0.0;
    for (long i = 0; i < 4000000; i++) {
        double u = (double)(zpp_rng_u64(&r) >> 11) * 0x1.0p-53;
        long double ref = cosl(two_pi_l * u);
        double got = zpp_cos_2pi(u);
        double err = (double)fabsl((long double)got - ref) - arg_err;
        err = err > 0 ? err / ulp_at((double)ref) : 0.0;
        if (err > worst) worst = err, worst_u = u;
    }
    printf("  cos: worst %.3f ulp at u = %a (bound 2)\n", worst, worst_u);
    EXPECT(worst <= 2.0, "cos(2 pi %a) off by %.3f ulp", worst_u, worst);
    /* the quadrant points are exact */
    EXPECT(zpp_cos_2pi(0.0) == 1.0 && zpp_cos_2pi(0.5) == -1.0);
    EXPECT(zpp_cos_2pi(0.25) == 0.0 && zpp_cos_2pi(0.75) == 0.0);
}

/* Next to u = 1/4 and 3/4, cos(2 pi u) = -+sin(2 pi d), d = u - q/4 as
 * small as 2^-53: relative accuracy there, where libm's cos(2 pi u) has
 * none (its rounded argument is off by up to 4e-16 absolute). */
static void test_cos_near_zeros(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    double worst = 0.0;
    for (int i = 0; i < 100000; i++) {
        int quarter = (zpp_rng_u64(&r) & 1) ? 1 : 3;
        /* d = +-j 2^-53 with j spread over 1 .. 2^41 */
        uint64_t j = (zpp_rng_u64(&r) >> (23 + zpp_rng_u64(&r) % 41)) + 1;
        double d = ldexp((double)j, -53) * ((zpp_rng_u64(&r) & 1) ? 1.0 : -1.0);
        double u = quarter * 0.25 + d; /* exact: |d| < 2^-12 */
        long double ref = sinl(two_pi_l * d) * (quarter == 1 ? -1.0L : 1.0L);
        double got = zpp_cos_2pi(u);
        double err = (double)fabsl((long double)got - ref) / ulp_at((double)ref);
        if (err > worst) worst = err;
    }
    printf("  cos next to its zeros: worst %.3f ulp (bound 2)\n", worst);
    EXPECT(worst <= 2.0, "%.3f ulp", worst);
}

static void test_box_muller_moments(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(4));
    const long n = 1L << 22;
    double s1 = 0.0, s2 = 0.0, s4 = 0.0;
    for (long i = 0; i < n; i++) {
        double u1 = (double)((zpp_rng_u64(&r) >> 11) + 1) * 0x1.0p-53;
        double u2 = (double)(zpp_rng_u64(&r) >> 11) * 0x1.0p-53;
        double z = zpp_box_muller(u1, u2);
        s1 += z;
        s2 += z * z;
        s4 += z * z * z * z;
    }
    double m1 = s1 / n, m2 = s2 / n, m4 = s4 / n;
    double se1 = 1.0 / sqrt((double)n), se2 = sqrt(2.0 / n), se4 = sqrt(96.0 / n);
    printf("  moments of %ld samples: mean %+.5f (%+.2f se), E z^2 %.5f (%+.2f se), "
           "E z^4 %.4f (%+.2f se)\n",
           n, m1, m1 / se1, m2, (m2 - 1.0) / se2, m4, (m4 - 3.0) / se4);
    EXPECT(fabs(m1) <= 5 * se1, "mean %g", m1);
    EXPECT(fabs(m2 - 1.0) <= 5 * se2, "E z^2 %g", m2);
    EXPECT(fabs(m4 - 3.0) <= 5 * se4, "E z^4 %g", m4);
}

ZPP_TESTS(ZPP_TEST(test_log_matches_libm), ZPP_TEST(test_cos_matches_libm),
          ZPP_TEST(test_cos_near_zeros), ZPP_TEST(test_box_muller_moments))
