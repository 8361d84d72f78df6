/* Tests of the double-precision CASTLE reference (conformance/ref.c) against the definition in
 * docs/algorithm.md: recurrent vs parallel form, hand-computed cases, gradients vs central finite
 * differences, and the UQ-KV prefill cache vs a naive evaluation of its definition.
 * Set REF_TEST_VERBOSE=1 in the environment to print the worst error of every check. */
#include "ref.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */

/* splitmix64: fixed-seed, platform-independent PRNG. */
static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static double rng_uniform(uint64_t *state)
{
    return (double)(rng_next(state) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static void fill(double *x, size_t n, double mag, uint64_t *state)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = mag * rng_uniform(state);
}

static int verbose(void)
{
    const char *v = getenv("REF_TEST_VERBOSE");
    return v && v[0] && strcmp(v, "0") != 0;
}

/* Max |a - b|; NaN anywhere yields NaN (so every "err <= tol" assert fails on it). */
static double max_abs_diff(const double *a, const double *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double e = fabs(a[i] - b[i]);
        if (isnan(e))
            return NAN;
        if (e > m)
            m = e;
    }
    return m;
}

static double max_abs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        if (fabs(a[i]) > m)
            m = fabs(a[i]);
    return m;
}

static int all_finite(const double *a, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(a[i]))
            return 0;
    return 1;
}

/* Six inputs qu, ku, vu, qc, kc, vc of one L x d problem in one allocation. */
enum { QU, KU, VU, QC, KC, VC, NIN };
static const char *const in_name[NIN] = { "qu", "ku", "vu", "qc", "kc", "vc" };

typedef struct {
    int L, d;
    double *buf;
    double *m[NIN];
} problem;

static void problem_init(problem *p, int L, int d, double mag, uint64_t seed)
{
    size_t n = (size_t)L * (size_t)d;
    p->L = L;
    p->d = d;
    p->buf = calloc(NIN * n + 1, sizeof(double));
    ck_assert_msg(p->buf != NULL, "calloc failed");
    uint64_t st = seed;
    for (int k = 0; k < NIN; ++k) {
        p->m[k] = p->buf + (size_t)k * n;
        fill(p->m[k], n, mag, &st);
    }
}

static void problem_free(problem *p) { free(p->buf); }

static void fwd_rec(const problem *p, int W, double sc, double *o, double *lse)
{
    int rc = ref_forward_recurrent(p->L, p->d, W, sc, p->m[QU], p->m[KU], p->m[VU],
                                   p->m[QC], p->m[KC], p->m[VC], o, lse);
    ck_assert_msg(rc == 0, "ref_forward_recurrent returned %d (L=%d d=%d W=%d)", rc, p->L, p->d, W);
}

static void fwd_par(const problem *p, int W, double sc, double *o, double *lse)
{
    int rc = ref_forward_parallel(p->L, p->d, W, sc, p->m[QU], p->m[KU], p->m[VU],
                                  p->m[QC], p->m[KC], p->m[VC], o, lse);
    ck_assert_msg(rc == 0, "ref_forward_parallel returned %d (L=%d d=%d W=%d)", rc, p->L, p->d, W);
}

static double sigmoid_naive(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ------------------------------------------------------------------ 1. recurrent vs parallel */

static const int cmp_L[] = { 1, 2, 7, 33, 70 };
static const int cmp_d[] = { 1, 3, 16 };
static const int cmp_W[] = { 0, 1, 3, 5, 100 };
#define N_CMP (5 * 3 * 5)

/* Relative errors of O and lse between recurrent and parallel forms. */
static void rec_vs_par(int L, int d, int W, double mag, uint64_t seed,
                       double *err_o, double *err_lse, int *finite)
{
    problem p;
    problem_init(&p, L, d, mag, seed);
    double sc = 1.0 / sqrt((double)d);
    size_t n = (size_t)L * (size_t)d;
    double *o1 = malloc(n * sizeof(double)), *o2 = malloc(n * sizeof(double));
    double *l1 = malloc((size_t)L * sizeof(double)), *l2 = malloc((size_t)L * sizeof(double));
    ck_assert(o1 && o2 && l1 && l2);
    fwd_rec(&p, W, sc, o1, l1);
    fwd_par(&p, W, sc, o2, l2);
    *finite = all_finite(o1, n) && all_finite(o2, n) && all_finite(l1, (size_t)L) &&
              all_finite(l2, (size_t)L);
    *err_o = max_abs_diff(o1, o2, n) / fmax(1.0, max_abs(o1, n));
    *err_lse = max_abs_diff(l1, l2, (size_t)L) / fmax(1.0, max_abs(l1, (size_t)L));
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    problem_free(&p);
}

static void run_rec_vs_par(int i, double mag, double tol)
{
    int L = cmp_L[i / 15], d = cmp_d[(i / 5) % 3], W = cmp_W[i % 5];
    double eo, el;
    int finite;
    rec_vs_par(L, d, W, mag, 1000 + (uint64_t)i, &eo, &el, &finite);
    if (verbose())
        fprintf(stderr, "rec_vs_par mag=%g L=%d d=%d W=%d: err_o=%.3e err_lse=%.3e\n",
                mag, L, d, W, eo, el);
    ck_assert_msg(finite, "non-finite output (mag=%g L=%d d=%d W=%d)", mag, L, d, W);
    ck_assert_msg(eo <= tol, "O recurrent vs parallel: rel err %.3e > %.1e (mag=%g L=%d d=%d W=%d)",
                  eo, tol, mag, L, d, W);
    ck_assert_msg(el <= tol, "lse recurrent vs parallel: rel err %.3e > %.1e (mag=%g L=%d d=%d W=%d)",
                  el, tol, mag, L, d, W);
}

START_TEST(test_rec_vs_par_unit) { run_rec_vs_par(_i, 1.0, 1e-12); }
END_TEST

START_TEST(test_rec_vs_par_mag10) { run_rec_vs_par(_i, 10.0, 1e-12); }
END_TEST

/* Saturated sigmoids and SiLU (|scores| ~ 1e5): still finite, and the two forms still agree. */
START_TEST(test_extreme_inputs_finite)
{
    static const int Ls[] = { 2, 9, 20 };
    for (int k = 0; k < 3; ++k) {
        double eo, el;
        int finite;
        rec_vs_par(Ls[k], 4, k == 1 ? 3 : 0, 300.0, 77 + (uint64_t)k, &eo, &el, &finite);
        if (verbose())
            fprintf(stderr, "extreme mag=300 L=%d: err_o=%.3e err_lse=%.3e\n", Ls[k], eo, el);
        ck_assert_msg(finite, "non-finite output for inputs of magnitude 300 (L=%d)", Ls[k]);
        ck_assert_msg(eo <= 1e-9 && el <= 1e-9,
                      "magnitude 300: rec vs par err_o=%.3e err_lse=%.3e (L=%d)", eo, el, Ls[k]);
    }
}
END_TEST

/* ------------------------------------------------------------------ 2. hand-checkable cases */

START_TEST(test_hand_L1)
{
    /* L = 1: u^0_0 = 0, SiLU(0) = 0, one key: o_0 = vc_0, lse_0 = sc qc_0.kc_0. */
    const int d = 3;
    const double qu[3] = { 0.3, -2.0, 1.0 }, ku[3] = { 1.0, 1.0, -0.5 }, vu[3] = { 4.0, 5.0, 6.0 };
    const double qc[3] = { 0.5, -1.0, 2.0 }, kc[3] = { 1.5, 0.25, -0.75 }, vc[3] = { 0.1, -0.2, 0.3 };
    const double sc = 0.7;
    const double lse_exp = sc * (0.5 * 1.5 + (-1.0) * 0.25 + 2.0 * (-0.75)); /* = -0.7 */
    for (int W = 0; W <= 2; ++W) {
        double o[3], lse;
        for (int form = 0; form < 2; ++form) {
            int rc = form == 0 ? ref_forward_recurrent(1, d, W, sc, qu, ku, vu, qc, kc, vc, o, &lse)
                               : ref_forward_parallel(1, d, W, sc, qu, ku, vu, qc, kc, vc, o, &lse);
            ck_assert_int_eq(rc, 0);
            for (int c = 0; c < d; ++c)
                ck_assert_msg(o[c] == vc[c], "L=1 %s W=%d: o[%d] = %.17g, expected vc = %.17g",
                              form ? "parallel" : "recurrent", W, c, o[c], vc[c]);
            ck_assert_msg(fabs(lse - lse_exp) <= 1e-15, "L=1 %s W=%d: lse = %.17g, expected %.17g",
                          form ? "parallel" : "recurrent", W, lse, lse_exp);
        }
    }
}
END_TEST

START_TEST(test_hand_L2)
{
    /* L = 2, d = 1, W = 0, sc = 0.5 (deliberately not 1 so every place the scale enters shows). */
    const double sc = 0.5;
    const double qu[2] = { 0.5, -0.8 }, ku[2] = { 1.1, 2.0 }, vu[2] = { -2.5, 3.0 };
    const double qc[2] = { 1.2, 0.4 }, kc[2] = { 1.5, -1.0 }, vc[2] = { 0.7, -1.3 };

    /* Token 0: u^0_0 = 0, a[0,0] = sc qc0 kc0 = 0.5 * 1.2 * 1.5 = 0.9; o_0 = vc0, lse_0 = 0.9. */
    const double o0 = 0.7, lse0 = 0.9;
    /* Token 1: G[0,1] = sigmoid(sc qu0 ku1) = sigmoid(0.5 * 0.5 * 2.0) = sigmoid(0.5);
     * u^1_0 = G[0,1] vu1 = 3 sigmoid(0.5); u^1_1 = 0.
     * a[1,0] = sc qc1 kc0 - SiLU(sc qc1 u^1_0) = 0.3 - SiLU(0.2 * 3 sigmoid(0.5));
     * a[1,1] = sc qc1 kc1 - SiLU(0) = -0.2. */
    const double g01 = 1.0 / (1.0 + exp(-0.5));
    const double u10 = 3.0 * g01;
    const double x10 = 0.5 * 0.4 * u10;
    const double a10 = 0.3 - x10 / (1.0 + exp(-x10));
    const double a11 = -0.2;
    const double e10 = exp(a10), e11 = exp(a11);
    const double o1 = (e10 * 0.7 + e11 * (-1.3)) / (e10 + e11);
    const double lse1 = log(e10 + e11);
    /* The same numbers evaluated independently (Python, IEEE double). */
    ck_assert_msg(fabs(o1 - -0.16150043185337815) < 1e-15, "hand o1 %.17g", o1);
    ck_assert_msg(fabs(lse1 - 0.6422269022934598) < 1e-15, "hand lse1 %.17g", lse1);

    for (int form = 0; form < 2; ++form) {
        double o[2], lse[2];
        int rc = form == 0 ? ref_forward_recurrent(2, 1, 0, sc, qu, ku, vu, qc, kc, vc, o, lse)
                           : ref_forward_parallel(2, 1, 0, sc, qu, ku, vu, qc, kc, vc, o, lse);
        ck_assert_int_eq(rc, 0);
        const char *f = form ? "parallel" : "recurrent";
        ck_assert_msg(fabs(o[0] - o0) <= 1e-15, "%s o0 = %.17g, expected %.17g", f, o[0], o0);
        ck_assert_msg(fabs(lse[0] - lse0) <= 1e-15, "%s lse0 = %.17g, expected %.17g", f, lse[0], lse0);
        ck_assert_msg(fabs(o[1] - o1) <= 1e-15, "%s o1 = %.17g, expected %.17g", f, o[1], o1);
        ck_assert_msg(fabs(lse[1] - lse1) <= 1e-15, "%s lse1 = %.17g, expected %.17g", f, lse[1], lse1);
    }
    /* W = 1 gives the same result for L = 2 (the only gate is G[0,1], inside the window). */
    double o[2], lse[2];
    ck_assert_int_eq(ref_forward_recurrent(2, 1, 1, sc, qu, ku, vu, qc, kc, vc, o, lse), 0);
    ck_assert_msg(fabs(o[1] - o1) <= 1e-15 && fabs(lse[1] - lse1) <= 1e-15,
                  "W=1 L=2: o1 = %.17g lse1 = %.17g, expected %.17g %.17g", o[1], lse[1], o1, lse1);
}
END_TEST

START_TEST(test_hand_L3_window)
{
    /* L = 3, d = 1, sc = 1. Token 2 with W = 1: G[0,2] = 0 (2 > 0 + W), so
     * u^2_0 = G[0,1] vu1, u^2_1 = G[1,2] vu2; with W = 0: u^2_0 = G[0,1] vu1 + G[0,2] vu2. */
    const double qu[3] = { 0.6, -0.4, 0.9 }, ku[3] = { 0.2, 1.5, -0.7 }, vu[3] = { 0.3, 2.0, -1.5 };
    const double qc[3] = { -0.5, 0.8, 1.1 }, kc[3] = { 0.9, -0.6, 0.4 }, vc[3] = { 1.0, 2.0, -3.0 };
    for (int W = 0; W <= 2; ++W) {
        const double g01 = sigmoid_naive(0.6 * 1.5);       /* sc qu0 ku1 */
        const double g02 = sigmoid_naive(0.6 * -0.7);      /* sc qu0 ku2 */
        const double g12 = sigmoid_naive(-0.4 * -0.7);     /* sc qu1 ku2 */
        const double u20 = g01 * 2.0 + (W == 1 ? 0.0 : g02 * -1.5);
        const double u21 = g12 * -1.5;
        const double x0 = 1.1 * u20, x1 = 1.1 * u21;       /* sc qc2 u^2_s */
        const double a0 = 1.1 * 0.9 - x0 * sigmoid_naive(x0);
        const double a1 = 1.1 * -0.6 - x1 * sigmoid_naive(x1);
        const double a2 = 1.1 * 0.4;
        const double e0 = exp(a0), e1 = exp(a1), e2 = exp(a2);
        const double o2 = (e0 * 1.0 + e1 * 2.0 + e2 * -3.0) / (e0 + e1 + e2);
        const double lse2 = log(e0 + e1 + e2);
        for (int form = 0; form < 2; ++form) {
            double o[3], lse[3];
            int rc = form == 0 ? ref_forward_recurrent(3, 1, W, 1.0, qu, ku, vu, qc, kc, vc, o, lse)
                               : ref_forward_parallel(3, 1, W, 1.0, qu, ku, vu, qc, kc, vc, o, lse);
            ck_assert_int_eq(rc, 0);
            ck_assert_msg(fabs(o[2] - o2) <= 1e-14 && fabs(lse[2] - lse2) <= 1e-14,
                          "%s W=%d: o2 = %.17g lse2 = %.17g, expected %.17g %.17g",
                          form ? "parallel" : "recurrent", W, o[2], lse[2], o2, lse2);
        }
    }
}
END_TEST

/* ------------------------------------------------------------------ 3. gradients vs FD */

/* loss = sum dout * O, O by the recurrent definition. */
static double loss_of(const problem *p, int W, double sc, const double *dout, double *o, double *lse)
{
    fwd_rec(p, W, sc, o, lse);
    double s = 0.0;
    for (size_t i = 0; i < (size_t)p->L * (size_t)p->d; ++i)
        s += dout[i] * o[i];
    return s;
}

/* Gradient scale floor: an input whose whole gradient is below this (e.g. dqu for L = 1, which is
 * exactly 0) is compared in absolute terms against GRAD_FLOOR * tol. */
#define GRAD_FLOOR 1e-3

/* Worst over the six inputs of max|analytic - FD| / max(GRAD_FLOOR, max|analytic of that input|),
 * central differences with step h on every entry. If corrupt >= 0, the analytic gradient entry corrupt (of dqu..dvc
 * concatenated) is perturbed by +1e-5 first: the checker must then report a failure. */
static double grad_check(int L, int d, int W, double mag, uint64_t seed, long corrupt, double h,
                         char *worst_where, size_t where_len)
{
    problem p;
    problem_init(&p, L, d, mag, seed);
    double sc = 1.0 / sqrt((double)d);
    size_t n = (size_t)L * (size_t)d;
    double *dout = malloc(n * sizeof(double));
    double *grad = malloc(NIN * n * sizeof(double));
    double *o = malloc(n * sizeof(double)), *lse = malloc((size_t)L * sizeof(double));
    ck_assert(dout && grad && o && lse);
    uint64_t st = seed ^ 0xD1B54A32D192ED03ULL;
    fill(dout, n, 1.0, &st);
    double *g[NIN];
    for (int k = 0; k < NIN; ++k)
        g[k] = grad + (size_t)k * n;
    int rc = ref_backward(L, d, W, sc, p.m[QU], p.m[KU], p.m[VU], p.m[QC], p.m[KC], p.m[VC], dout,
                          g[QU], g[KU], g[VU], g[QC], g[KC], g[VC]);
    ck_assert_msg(rc == 0, "ref_backward returned %d", rc);
    if (corrupt >= 0)
        grad[corrupt] += 1e-5;

    double worst = 0.0;
    for (int k = 0; k < NIN; ++k) {
        double norm = fmax(GRAD_FLOOR, max_abs(g[k], n));
        for (size_t i = 0; i < n; ++i) {
            double x0 = p.m[k][i];
            p.m[k][i] = x0 + h;
            double lp = loss_of(&p, W, sc, dout, o, lse);
            p.m[k][i] = x0 - h;
            double lm = loss_of(&p, W, sc, dout, o, lse);
            p.m[k][i] = x0;
            double fd = (lp - lm) / (2.0 * h);
            double e = fabs(g[k][i] - fd) / norm;
            if (isnan(e))
                e = INFINITY;
            if (e > worst) {
                worst = e;
                snprintf(worst_where, where_len, "d%s[%zu] analytic %.12g fd %.12g", in_name[k], i,
                         g[k][i], fd);
            }
        }
    }
    free(dout);
    free(grad);
    free(o);
    free(lse);
    problem_free(&p);
    return worst;
}

static const int fd_L[] = { 1, 3, 6 };
static const int fd_d[] = { 1, 2, 4 };
static const int fd_W[] = { 0, 1, 2 };
#define N_FD 27

static void run_grad(int L, int d, int W, double mag, uint64_t seed, double tol)
{
    char where[160] = "none";
    double e = grad_check(L, d, W, mag, seed, -1, 1e-5, where, sizeof where);
    if (verbose())
        fprintf(stderr, "grad mag=%g L=%d d=%d W=%d: worst rel err %.3e at %s\n", mag, L, d, W, e, where);
    ck_assert_msg(e <= tol, "backward vs FD: rel err %.3e > %.1e (mag=%g L=%d d=%d W=%d) at %s",
                  e, tol, mag, L, d, W, where);
}

START_TEST(test_grad_fd_small)
{
    run_grad(fd_L[_i / 9], fd_d[(_i / 3) % 3], fd_W[_i % 3], 1.0, 5000 + (uint64_t)_i, 1e-7);
}
END_TEST

/* Longer sequences and larger inputs (sharper softmax, more saturated gates). */
START_TEST(test_grad_fd_medium)
{
    static const int Ls[] = { 13, 17, 17, 10 };
    static const int ds[] = { 3, 2, 2, 4 };
    static const int Ws[] = { 0, 4, 0, 3 };
    static const double mags[] = { 1.0, 1.0, 2.0, 2.5 };
    run_grad(Ls[_i], ds[_i], Ws[_i], mags[_i], 7000 + (uint64_t)_i, 1e-7);
}
END_TEST

/* ------------------------------------------------------------------ 4. prefill cache */

static const int pf_P[] = { 1, 2, 7, 33 };
static const int pf_d[] = { 1, 5 };
static const int pf_W[] = { 0, 1, 4 };
#define N_PF 24

START_TEST(test_prefill_cache)
{
    int P = pf_P[_i / 6], d = pf_d[(_i / 3) % 2], W = pf_W[_i % 3];
    problem p;
    problem_init(&p, P + 1, d, 1.0, 9000 + (uint64_t)_i);
    double sc = 1.0 / sqrt((double)d);
    size_t n = (size_t)P * (size_t)d;
    double *u = malloc(n * sizeof(double)), *un = calloc(n, sizeof(double));
    ck_assert(u && un);
    ck_assert_int_eq(ref_prefill_cache_u(P, d, W, sc, p.m[QU], p.m[KU], p.m[VU], u), 0);

    /* Naive definition: u^{P-1}_s = sum_{s < j <= P-1, j - s <= W or W = 0} G[s,j] vU_j. */
    for (int s = 0; s < P; ++s)
        for (int j = s + 1; j <= P - 1; ++j) {
            if (W != 0 && j - s > W)
                continue;
            double z = 0.0;
            for (int c = 0; c < d; ++c)
                z += p.m[QU][(size_t)s * d + c] * p.m[KU][(size_t)j * d + c];
            double gate = sigmoid_naive(sc * z);
            for (int c = 0; c < d; ++c)
                un[(size_t)s * d + c] += gate * p.m[VU][(size_t)j * d + c];
        }
    double e = max_abs_diff(u, un, n) / fmax(1.0, max_abs(un, n));
    if (verbose())
        fprintf(stderr, "prefill P=%d d=%d W=%d: rel err %.3e\n", P, d, W, e);
    ck_assert_msg(e <= 1e-13, "prefill cache vs naive: rel err %.3e (P=%d d=%d W=%d)", e, P, d, W);
    for (int c = 0; c < d; ++c)
        ck_assert_msg(u[(size_t)(P - 1) * d + c] == 0.0, "U[P-1] must be 0, got %g",
                      u[(size_t)(P - 1) * d + c]);

    /* Decode of token P from the cache (docs/algorithm.md section 5) reproduces the forward output of token P. */
    int P1 = P + 1;
    double *u1 = malloc((size_t)P1 * d * sizeof(double)), *a = malloc((size_t)P1 * sizeof(double));
    double *o = malloc((size_t)P1 * d * sizeof(double)), *lse = malloc((size_t)P1 * sizeof(double));
    ck_assert(u1 && a && o && lse);
    ck_assert_int_eq(ref_prefill_cache_u(P1, d, W, sc, p.m[QU], p.m[KU], p.m[VU], u1), 0);
    fwd_rec(&p, W, sc, o, lse);
    const double *qt = p.m[QC] + (size_t)P * d;
    double m = -INFINITY;
    for (int s = 0; s <= P; ++s) {
        double b = 0.0, x = 0.0;
        for (int c = 0; c < d; ++c) {
            b += qt[c] * p.m[KC][(size_t)s * d + c];
            x += qt[c] * u1[(size_t)s * d + c];
        }
        x *= sc;
        a[s] = sc * b - x * sigmoid_naive(x);
        m = fmax(m, a[s]);
    }
    double l = 0.0, ed = 0.0;
    for (int s = 0; s <= P; ++s)
        l += exp(a[s] - m);
    for (int c = 0; c < d; ++c) {
        double oc = 0.0;
        for (int s = 0; s <= P; ++s)
            oc += exp(a[s] - m) / l * p.m[VC][(size_t)s * d + c];
        ed = fmax(ed, fabs(oc - o[(size_t)P * d + c]));
    }
    ed = fmax(ed, fabs(m + log(l) - lse[P]) / fmax(1.0, fabs(lse[P])));
    if (verbose())
        fprintf(stderr, "decode-from-cache P=%d d=%d W=%d: err %.3e\n", P, d, W, ed);
    ck_assert_msg(ed <= 1e-13, "decode from prefill cache vs forward: err %.3e (P=%d d=%d W=%d)",
                  ed, P, d, W);
    free(u);
    free(un);
    free(u1);
    free(a);
    free(o);
    free(lse);
    problem_free(&p);
}
END_TEST

/* ------------------------------------------------------------------ 5. the checks can fail */

/* A different window changes the output far beyond the comparison tolerance. */
START_TEST(test_power_window_detected)
{
    problem p;
    problem_init(&p, 12, 3, 1.0, 31337);
    double sc = 1.0 / sqrt(3.0);
    double o1[36], o2[36], l1[12], l2[12];
    fwd_rec(&p, 1, sc, o1, l1);
    fwd_par(&p, 2, sc, o2, l2);
    double e = max_abs_diff(o1, o2, 36);
    ck_assert_msg(e > 1e-6, "W=1 and W=2 outputs differ only by %.3e: comparison has no power", e);
    fwd_rec(&p, 0, sc, o1, l1);
    fwd_par(&p, 0, sc * 1.0000001, o2, l2);
    e = max_abs_diff(l1, l2, 12);
    ck_assert_msg(e > 1e-12, "a 1e-7 relative scale change moves lse only by %.3e", e);
    problem_free(&p);
}
END_TEST

/* A 1e-5 error in any single analytic gradient entry is caught by the FD checker. */
START_TEST(test_power_grad_corruption_detected)
{
    const int L = 3, d = 2, W = 0;
    long n = (long)NIN * L * d;
    for (long idx = 0; idx < n; idx += 5) {
        char where[160];
        double e = grad_check(L, d, W, 1.0, 4242, idx, 1e-5, where, sizeof where);
        ck_assert_msg(e > 1e-7, "corrupted gradient entry %ld not detected: err %.3e", idx, e);
    }
}
END_TEST

/* ------------------------------------------------------------------ API edge cases */

START_TEST(test_api_edges)
{
    double x[4] = { 0 }, y[4], z[4];
    /* L = 0 is a no-op; negative sizes / window are rejected without crashing. */
    ck_assert_int_eq(ref_forward_recurrent(0, 2, 0, 1.0, x, x, x, x, x, x, y, z), 0);
    ck_assert_int_eq(ref_forward_parallel(0, 2, 0, 1.0, x, x, x, x, x, x, y, z), 0);
    ck_assert_int_eq(ref_prefill_cache_u(0, 2, 0, 1.0, x, x, x, y), 0);
    ck_assert_int_eq(ref_forward_recurrent(-1, 2, 0, 1.0, x, x, x, x, x, x, y, z), -1);
    ck_assert_int_eq(ref_forward_parallel(2, -1, 0, 1.0, x, x, x, x, x, x, y, z), -1);
    ck_assert_int_eq(ref_forward_recurrent(2, 2, -1, 1.0, x, x, x, x, x, x, y, z), -1);
    ck_assert_int_eq(ref_prefill_cache_u(2, 2, -3, 1.0, x, x, x, y), -1);
    ck_assert_int_eq(ref_backward(-2, 2, 0, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, y), -1);
    ck_assert_int_eq(ref_forward_recurrent(2, 2, 0, 1.0, x, x, x, x, x, x, NULL, z), -1);
    ck_assert_int_eq(ref_backward(2, 2, 0, 1.0, x, x, x, x, x, x, NULL, y, y, y, y, y, y), -1);
    /* Huge L: the parallel form's L x L scratch cannot be allocated; it must fail cleanly. */
    ck_assert_int_eq(ref_forward_parallel(2000000000, 1, 0, 1.0, x, x, x, x, x, x, y, z), -1);
}
END_TEST

/* Backward of L = 1: qu, ku, vu do not influence the output (u^0_0 = 0), and
 * O = vc_0 exactly so dvc = dout and dqc = dkc = 0. */
START_TEST(test_grad_L1_exact)
{
    const double qu[2] = { 1, 2 }, ku[2] = { 3, 4 }, vu[2] = { 5, 6 };
    const double qc[2] = { 0.5, -0.5 }, kc[2] = { 0.25, 1 }, vc[2] = { -1, 2 }, dout[2] = { 0.3, -0.7 };
    double g[6][2];
    ck_assert_int_eq(ref_backward(1, 2, 0, 0.7, qu, ku, vu, qc, kc, vc, dout,
                                  g[0], g[1], g[2], g[3], g[4], g[5]), 0);
    for (int k = 0; k < 5; ++k)
        for (int c = 0; c < 2; ++c)
            ck_assert_msg(fabs(g[k][c]) <= 1e-16, "L=1: d%s[%d] = %g, expected 0", in_name[k], c, g[k][c]);
    for (int c = 0; c < 2; ++c)
        ck_assert_msg(g[5][c] == dout[c], "L=1: dvc[%d] = %g, expected %g", c, g[5][c], dout[c]);
}
END_TEST

/* ------------------------------------------------------------------ suite */

static Suite *ref_suite(void)
{
    Suite *s = suite_create("ref");

    TCase *tc = tcase_create("recurrent_vs_parallel");
    tcase_add_loop_test(tc, test_rec_vs_par_unit, 0, N_CMP);
    tcase_add_loop_test(tc, test_rec_vs_par_mag10, 0, N_CMP);
    tcase_add_test(tc, test_extreme_inputs_finite);
    suite_add_tcase(s, tc);

    tc = tcase_create("hand");
    tcase_add_test(tc, test_hand_L1);
    tcase_add_test(tc, test_hand_L2);
    tcase_add_test(tc, test_hand_L3_window);
    suite_add_tcase(s, tc);

    tc = tcase_create("backward_fd");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_grad_fd_small, 0, N_FD);
    tcase_add_loop_test(tc, test_grad_fd_medium, 0, 4);
    tcase_add_test(tc, test_grad_L1_exact);
    suite_add_tcase(s, tc);

    tc = tcase_create("prefill_cache");
    tcase_add_loop_test(tc, test_prefill_cache, 0, N_PF);
    suite_add_tcase(s, tc);

    tc = tcase_create("power");
    tcase_add_test(tc, test_power_window_detected);
    tcase_add_test(tc, test_power_grad_corruption_detected);
    suite_add_tcase(s, tc);

    tc = tcase_create("api");
    tcase_add_test(tc, test_api_edges);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ref_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
