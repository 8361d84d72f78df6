/* Tests of the O(L^2 d) gradients (conformance/ref_grad.c) against the O(L^3) ref_backward, which
 * tests/test_ref.c proves against finite differences, plus a directional finite-difference check
 * at a length ref_backward is not run on, argument handling, and a timing run at L = 1024.
 * Set REF_TEST_VERBOSE=1 to print the errors and, in addition, to measure the fp32-vs-fp64
 * gradient error at L = 4096, d = 16, W = 0 and W = 64 (inputs uniform in [-1, 1]). */
#include "ref.h"
#include "ref_grad.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static int verbose(void)
{
    const char *v = getenv("REF_TEST_VERBOSE");
    return v && v[0] && strcmp(v, "0") != 0;
}

static double now_s(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double max_abs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        if (fabs(a[i]) > m)
            m = fabs(a[i]);
    return m;
}

/* max|got - ref| / max(GRAD_FLOOR, max|ref|); NaN or Inf anywhere gives +Inf. */
#define GRAD_FLOOR 1e-3
static double rel_err(const double *got, const double *ref, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) {
        double e = fabs(got[i] - ref[i]);
        if (!isfinite(e))
            return INFINITY;
        if (e > m)
            m = e;
    }
    return m / fmax(GRAD_FLOOR, max_abs(ref, n));
}

/* ||got - ref||_2 / ||ref||_2 (0 when ref = 0 = got). */
static double rms_rel_err(const double *got, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Inputs qu, ku, vu, qc, kc, vc, dout, then three sets of six gradients, one allocation. */
enum { QU, KU, VU, QC, KC, VC, NIN };
static const char *const in_name[NIN] = { "qu", "ku", "vu", "qc", "kc", "vc" };

typedef struct {
    int L, d;
    size_t n;
    double *buf;
    double *in[NIN];
    double *dout;
    double *g[3][NIN]; /* [0] ref_backward, [1] fast f64, [2] fast f32 */
} problem;

static void problem_init(problem *p, int L, int d, double mag, uint64_t seed)
{
    p->L = L;
    p->d = d;
    p->n = (size_t)L * (size_t)d;
    p->buf = calloc((NIN + 1 + 3 * NIN) * p->n + 1, sizeof(double));
    ck_assert_msg(p->buf != NULL, "calloc failed");
    uint64_t st = seed;
    double *q = p->buf;
    for (int k = 0; k < NIN; ++k, q += p->n) {
        p->in[k] = q;
        for (size_t i = 0; i < p->n; ++i)
            q[i] = mag * rng_uniform(&st);
    }
    p->dout = q;
    for (size_t i = 0; i < p->n; ++i)
        q[i] = rng_uniform(&st);
    q += p->n;
    for (int v = 0; v < 3; ++v)
        for (int k = 0; k < NIN; ++k, q += p->n)
            p->g[v][k] = q;
}

static void problem_free(problem *p) { free(p->buf); }

typedef int (*grad_fn)(int, int, int, double, const double *, const double *, const double *,
                       const double *, const double *, const double *, const double *, double *,
                       double *, double *, double *, double *, double *);

static void run_grad(problem *p, int which, grad_fn f, int W, double sc)
{
    double **g = p->g[which];
    int rc = f(p->L, p->d, W, sc, p->in[QU], p->in[KU], p->in[VU], p->in[QC], p->in[KC],
               p->in[VC], p->dout, g[QU], g[KU], g[VU], g[QC], g[KC], g[VC]);
    ck_assert_msg(rc == 0, "gradient variant %d returned %d (L=%d d=%d W=%d)", which, rc, p->L,
                  p->d, W);
}

/* Worst rel_err over the six gradients of variant `which` against variant `ref`. */
static double worst_err(const problem *p, int which, int ref, int *worst_k)
{
    double worst = 0.0;
    *worst_k = 0;
    for (int k = 0; k < NIN; ++k) {
        double e = rel_err(p->g[which][k], p->g[ref][k], p->n);
        if (e > worst || isnan(e)) {
            worst = e;
            *worst_k = k;
        }
    }
    return worst;
}

/* ------------------------------------------------------------------ 1. vs ref_backward */

#define FAST_TOL 1e-11 /* fp64 O(L^2 d) vs fp64 O(L^3): only summation order differs */
#define F32_TOL 1e-4   /* fp32 evaluation vs fp64, inputs of magnitude <= 3 */

static const int cmp_L[] = { 1, 2, 7, 40, 100 };
static const int cmp_d[] = { 1, 4, 16 };
static const int cmp_W[] = { 0, 1, 3, 50 };
#define N_CMP (5 * 3 * 4)

static void compare_case(int L, int d, int W, double sc, double mag, uint64_t seed)
{
    problem p;
    problem_init(&p, L, d, mag, seed);
    run_grad(&p, 0, ref_backward, W, sc);
    run_grad(&p, 1, ref_backward_fast, W, sc);
    run_grad(&p, 2, ref_backward_fast_f32, W, sc);
    int k64, k32;
    double e64 = worst_err(&p, 1, 0, &k64);
    double e32 = worst_err(&p, 2, 0, &k32);
    if (verbose())
        printf("L=%3d d=%2d W=%2d sc=%.3f mag=%.1f: fast f64 %.2e (d%s)  f32 %.2e (d%s)\n", L, d,
               W, sc, mag, e64, in_name[k64], e32, in_name[k32]);
    ck_assert_msg(e64 <= FAST_TOL, "L=%d d=%d W=%d: fast f64 d%s error %.3e > %.0e", L, d, W,
                  in_name[k64], e64, FAST_TOL);
    ck_assert_msg(e32 <= F32_TOL, "L=%d d=%d W=%d: fast f32 d%s error %.3e > %.0e", L, d, W,
                  in_name[k32], e32, F32_TOL);
    /* The f32 variant must really round to float: a float evaluation differs by >> 1e-12. */
    if (L >= 7)
        ck_assert_msg(e32 > 1e-10, "L=%d d=%d W=%d: f32 error %.3e suspiciously small", L, d, W,
                      e32);
    problem_free(&p);
}

START_TEST(test_vs_ref_backward)
{
    int i = _i;
    int L = cmp_L[i / 12], d = cmp_d[(i / 4) % 3], W = cmp_W[i % 4];
    compare_case(L, d, W, 1.0 / sqrt((double)d), 1.0, 1000 + (uint64_t)i);
}
END_TEST

/* Larger inputs and another scale: scores deep in SiLU's nonlinear range, gates saturating. */
static const int big_L[] = { 7, 40, 100 };
static const int big_W[] = { 0, 2, 9 };
#define N_BIG (3 * 3)

START_TEST(test_vs_ref_backward_mag3)
{
    int i = _i;
    compare_case(big_L[i / 3], 8, big_W[i % 3], 0.6, 3.0, 5000 + (uint64_t)i);
}
END_TEST

/* ------------------------------------------------------------------ 2. directional FD */

/* loss = sum dout * O, O by the recurrent definition. */
static double loss_of(const problem *p, int W, double sc, double *o, double *lse)
{
    int rc = ref_forward_recurrent(p->L, p->d, W, sc, p->in[QU], p->in[KU], p->in[VU],
                                   p->in[QC], p->in[KC], p->in[VC], o, lse);
    ck_assert_int_eq(rc, 0);
    double s = 0.0;
    for (size_t i = 0; i < p->n; ++i)
        s += p->dout[i] * o[i];
    return s;
}

/* For each input k and a random direction v: (loss(x + h v) - loss(x - h v)) / 2h against
 * sum_i grad_i v_i, normalised by sum_i |grad_i v_i|. L = 300: beyond the ref_backward tests. */
static const int fd_W[] = { 0, 7 };

START_TEST(test_directional_fd)
{
    const int L = 300, d = 8, W = fd_W[_i];
    const double sc = 1.0 / sqrt((double)d), h = 1e-5;
    problem p;
    problem_init(&p, L, d, 1.0, 777 + (uint64_t)_i);
    run_grad(&p, 1, ref_backward_fast, W, sc);
    double *o = malloc(p.n * sizeof(double)), *lse = malloc((size_t)L * sizeof(double));
    double *x0 = malloc(p.n * sizeof(double)), *v = malloc(p.n * sizeof(double));
    ck_assert(o && lse && x0 && v);
    uint64_t st = 99 + (uint64_t)_i;
    for (int k = 0; k < NIN; ++k) {
        double an = 0.0, scale = 0.0;
        for (size_t i = 0; i < p.n; ++i) {
            v[i] = rng_uniform(&st);
            an += p.g[1][k][i] * v[i];
            scale += fabs(p.g[1][k][i] * v[i]);
        }
        memcpy(x0, p.in[k], p.n * sizeof(double));
        for (size_t i = 0; i < p.n; ++i)
            p.in[k][i] = x0[i] + h * v[i];
        double lp = loss_of(&p, W, sc, o, lse);
        for (size_t i = 0; i < p.n; ++i)
            p.in[k][i] = x0[i] - h * v[i];
        double lm = loss_of(&p, W, sc, o, lse);
        memcpy(p.in[k], x0, p.n * sizeof(double));
        double fd = (lp - lm) / (2.0 * h);
        double e = fabs(fd - an) / fmax(1e-6, scale);
        if (verbose())
            printf("directional FD L=%d W=%d d%s: analytic %.12g fd %.12g rel %.2e\n", L, W,
                   in_name[k], an, fd, e);
        ck_assert_msg(e <= 1e-8, "W=%d d%s: analytic %.12g fd %.12g (rel %.3e)", W, in_name[k],
                      an, fd, e);
    }
    free(o);
    free(lse);
    free(x0);
    free(v);
    problem_free(&p);
}
END_TEST

/* ------------------------------------------------------------------ 3. API */

START_TEST(test_api_edges)
{
    double x[4] = { 0.1, -0.2, 0.3, 0.4 }, y[4];
    grad_fn fns[2] = { ref_backward_fast, ref_backward_fast_f32 };
    for (int f = 0; f < 2; ++f) {
        grad_fn g = fns[f];
        ck_assert_int_eq(g(0, 2, 0, 1.0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                           NULL, NULL, NULL, NULL), 0);
        ck_assert_int_eq(g(-1, 2, 0, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, y), -1);
        ck_assert_int_eq(g(2, -1, 0, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, y), -1);
        ck_assert_int_eq(g(2, 2, -1, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, y), -1);
        ck_assert_int_eq(g(2, 2, 0, 1.0, x, x, x, x, x, x, NULL, y, y, y, y, y, y), -1);
        ck_assert_int_eq(g(2, 2, 0, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, NULL), -1);
        ck_assert_int_eq(g(2000000000, 1000000000, 0, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, y),
                         -1);
        /* d = 0: valid, nothing to write. */
        ck_assert_int_eq(g(3, 0, 0, 1.0, x, x, x, x, x, x, x, y, y, y, y, y, y), 0);
    }
}
END_TEST

/* ------------------------------------------------------------------ 4. long sequences */

/* f64 and f32 gradients at (L, d, W); returns the worst f32-vs-f64 error, prints when verbose. */
static double long_run(int L, int d, int W, uint64_t seed)
{
    problem p;
    problem_init(&p, L, d, 1.0, seed);
    double sc = 1.0 / sqrt((double)d);
    double t0 = now_s();
    run_grad(&p, 1, ref_backward_fast, W, sc);
    double t1 = now_s();
    run_grad(&p, 2, ref_backward_fast_f32, W, sc);
    double t2 = now_s();
    double worst = 0.0;
    if (verbose())
        printf("L=%d d=%d W=%d: f64 %.2f s, f32 %.2f s; f32 vs f64 error, max-norm "
               "(max|diff|/max(1e-3,max|ref|)) and [rms]:\n ",
               L, d, W, t1 - t0, t2 - t1);
    for (int k = 0; k < NIN; ++k) {
        double e = rel_err(p.g[2][k], p.g[1][k], p.n);
        if (e > worst || isnan(e))
            worst = e;
        if (verbose())
            printf(" d%s %.2e [%.2e]", in_name[k], e, rms_rel_err(p.g[2][k], p.g[1][k], p.n));
    }
    if (verbose()) {
        printf("\n  worst %.3e\n", worst);
        fflush(stdout);
    }
    problem_free(&p);
    return worst;
}

START_TEST(test_timing_L1024)
{
    static const int Ws[2] = { 0, 64 };
    double e = long_run(1024, 16, Ws[_i], 4242 + (uint64_t)_i);
    ck_assert_msg(e <= 1e-3, "L=1024 W=%d: f32 vs f64 error %.3e", Ws[_i], e);
}
END_TEST

/* Verbose only: the measurement the device backward's accuracy requirement is stated against. */
START_TEST(test_measure_L4096)
{
    static const int Ws[2] = { 0, 64 };
    if (!verbose())
        return;
    double e = long_run(4096, 16, Ws[_i], 4096 + (uint64_t)_i);
    ck_assert_msg(e <= 1e-2, "L=4096 W=%d: f32 vs f64 error %.3e", Ws[_i], e);
}
END_TEST

/* ------------------------------------------------------------------ suite */

static Suite *ref_grad_suite(void)
{
    Suite *s = suite_create("ref_grad");

    TCase *tc = tcase_create("vs_ref_backward");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_vs_ref_backward, 0, N_CMP);
    tcase_add_loop_test(tc, test_vs_ref_backward_mag3, 0, N_BIG);
    suite_add_tcase(s, tc);

    tc = tcase_create("directional_fd");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_directional_fd, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("api");
    tcase_add_test(tc, test_api_edges);
    suite_add_tcase(s, tc);

    tc = tcase_create("long");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_timing_L1024, 0, 2);
    tcase_add_loop_test(tc, test_measure_L4096, 0, 2);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ref_grad_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
