/* libcastle test reference: double-precision CPU CASTLE attention. See ref.h and docs/algorithm.md. */
#include "ref.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- scalar helpers */

/* sigmoid without overflow: exp() is only ever called on a non-positive argument. */
static double sig(double x)
{
    if (x >= 0.0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static double silu(double x) { return x * sig(x); }

/* SiLU'(x) = s (1 + x (1 - s)), with 1 - s = sigmoid(-x) computed without cancellation. */
static double dsilu(double x)
{
    double s = sig(x);
    return s * (1.0 + x * sig(-x));
}

static double dot(const double *a, const double *b, int d)
{
    double acc = 0.0;
    for (int c = 0; c < d; ++c)
        acc += a[c] * b[c];
    return acc;
}

/* Gate G[s,j] is allowed (possibly non-zero) iff s < j <= s + W (no upper bound when W = 0). */
static int gate_allowed(int s, int j, int W)
{
    return s < j && (W == 0 || j - s <= W);
}

/* malloc of n1 * n2 * n3 doubles with overflow check; NULL on failure or n = 0. */
static double *alloc_d(size_t n1, size_t n2, size_t n3)
{
    if (n1 == 0 || n2 == 0 || n3 == 0)
        return NULL;
    if (n2 > SIZE_MAX / n1)
        return NULL;
    size_t n = n1 * n2;
    if (n3 > SIZE_MAX / n)
        return NULL;
    n *= n3;
    if (n > SIZE_MAX / sizeof(double))
        return NULL;
    return (double *)malloc(n * sizeof(double));
}

static int bad_args(int L, int d, int W)
{
    return L < 0 || d < 0 || W < 0;
}

#define ROW(m, r) ((m) + (size_t)(r) * (size_t)d)

/* ------------------------------------------------------ recurrent (docs/algorithm.md section 1) */

int ref_forward_recurrent(int L, int d, int W, double sc,
                          const double *qu, const double *ku, const double *vu,
                          const double *qc, const double *kc, const double *vc,
                          double *o, double *lse)
{
    if (bad_args(L, d, W))
        return -1;
    if (L == 0)
        return 0;
    if (!qu || !ku || !vu || !qc || !kc || !vc || !o || !lse)
        return -1;

    double *u = alloc_d((size_t)L, (size_t)(d > 0 ? d : 1), 1); /* u^t_s, rows s = 0..L-1 */
    double *a = alloc_d((size_t)L, 1, 1);                       /* scores of one query row */
    if (!u || !a) {
        free(u);
        free(a);
        return -1;
    }
    memset(u, 0, (size_t)L * (size_t)(d > 0 ? d : 1) * sizeof(double));

    for (int t = 0; t < L; ++t) {
        /* u^t_s = u^{t-1}_s + G[s,t] vU_t for s < t; u^t_t = 0 (row t is still zero). */
        int lo = (W == 0 || t - W < 0) ? 0 : t - W;
        for (int s = lo; s < t; ++s) {
            double g = sig(sc * dot(ROW(qu, s), ROW(ku, t), d));
            double *us = ROW(u, s);
            const double *vt = ROW(vu, t);
            for (int c = 0; c < d; ++c)
                us[c] += g * vt[c];
        }

        /* a[t,s] = sc qC_t.kC_s - SiLU(sc qC_t.u^t_s), s <= t */
        const double *qt = ROW(qc, t);
        double m = -INFINITY;
        for (int s = 0; s <= t; ++s) {
            a[s] = sc * dot(qt, ROW(kc, s), d) - silu(sc * dot(qt, ROW(u, s), d));
            if (a[s] > m)
                m = a[s];
        }
        double l = 0.0;
        for (int s = 0; s <= t; ++s) {
            a[s] = exp(a[s] - m);
            l += a[s];
        }
        double *ot = ROW(o, t);
        for (int c = 0; c < d; ++c)
            ot[c] = 0.0;
        for (int s = 0; s <= t; ++s) {
            double p = a[s] / l;
            const double *vs = ROW(vc, s);
            for (int c = 0; c < d; ++c)
                ot[c] += p * vs[c];
        }
        lse[t] = m + log(l);
    }
    free(u);
    free(a);
    return 0;
}

/* ------------------------------------------------ parallel pieces (docs/algorithm.md section 2) */

/* Fills (all L x L, row-major):
 *   G[s,j] = sigmoid(sc qU_s.kU_j) on allowed entries, else 0
 *   X[t,j] = sc qC_t.vU_j for j <= t, else 0
 *   SU[t,s] = sum_{s<j<=t} X[t,j] G[s,j] for s <= t, else 0
 *   P[t,s] = softmax_s(A[t,.]), A = sc QC KC^T - SiLU(SU) (causal), and lse[t]. */
static void parallel_core(int L, int d, int W, double sc,
                          const double *qu, const double *ku, const double *vu,
                          const double *qc, const double *kc,
                          double *G, double *X, double *SU, double *P, double *lse)
{
    size_t LL = (size_t)L;
    for (int s = 0; s < L; ++s)
        for (int j = 0; j < L; ++j)
            G[s * LL + j] = gate_allowed(s, j, W) ? sig(sc * dot(ROW(qu, s), ROW(ku, j), d)) : 0.0;
    for (int t = 0; t < L; ++t)
        for (int j = 0; j < L; ++j)
            X[t * LL + j] = (j <= t) ? sc * dot(ROW(qc, t), ROW(vu, j), d) : 0.0;
    for (int t = 0; t < L; ++t)
        for (int s = 0; s < L; ++s) {
            double acc = 0.0;
            if (s <= t)
                for (int j = s + 1; j <= t; ++j)
                    acc += X[t * LL + j] * G[s * LL + j];
            SU[t * LL + s] = acc;
        }
    for (int t = 0; t < L; ++t) {
        double *pr = P + t * LL;
        double m = -INFINITY;
        for (int s = 0; s < L; ++s) {
            if (s <= t) {
                pr[s] = sc * dot(ROW(qc, t), ROW(kc, s), d) - silu(SU[t * LL + s]);
                if (pr[s] > m)
                    m = pr[s];
            }
        }
        double l = 0.0;
        for (int s = 0; s <= t; ++s) {
            pr[s] = exp(pr[s] - m);
            l += pr[s];
        }
        for (int s = 0; s < L; ++s)
            pr[s] = (s <= t) ? pr[s] / l : 0.0;
        lse[t] = m + log(l);
    }
}

int ref_forward_parallel(int L, int d, int W, double sc,
                         const double *qu, const double *ku, const double *vu,
                         const double *qc, const double *kc, const double *vc,
                         double *o, double *lse)
{
    if (bad_args(L, d, W))
        return -1;
    if (L == 0)
        return 0;
    if (!qu || !ku || !vu || !qc || !kc || !vc || !o || !lse)
        return -1;

    size_t LL = (size_t)L;
    double *buf = alloc_d(4, LL, LL);
    if (!buf)
        return -1;
    double *G = buf, *X = G + LL * LL, *SU = X + LL * LL, *P = SU + LL * LL;
    parallel_core(L, d, W, sc, qu, ku, vu, qc, kc, G, X, SU, P, lse);

    for (int t = 0; t < L; ++t) {
        double *ot = ROW(o, t);
        for (int c = 0; c < d; ++c)
            ot[c] = 0.0;
        for (int s = 0; s <= t; ++s) {
            double p = P[t * LL + s];
            const double *vs = ROW(vc, s);
            for (int c = 0; c < d; ++c)
                ot[c] += p * vs[c];
        }
    }
    free(buf);
    return 0;
}

/* ---------------------------------------------------------------- backward */

/* Chain rule through the parallel form (t = query row, s = key row, j = lookahead token):
 *   dVC_s   = sum_t P[t,s] dO_t
 *   dA[t,s] = P[t,s] (dO_t.vC_s - Delta_t),  Delta_t = dO_t.O_t
 *   dQC_t  += sc sum_s dA[t,s] kC_s;  dKC_s += sc sum_t dA[t,s] qC_t
 *   dSU     = -SiLU'(SU) * dA
 *   dX[t,j] = sum_{s<j} dSU[t,s] G[s,j]            (j <= t)
 *   dG[s,j] = sum_{t>=j} dSU[t,s] X[t,j]           (allowed (s,j))
 *   dQC_t  += sc sum_{j<=t} dX[t,j] vU_j;  dVU_j += sc sum_{t>=j} dX[t,j] qC_t
 *   dZ      = dG G (1 - G)
 *   dQU_s  += sc sum_j dZ[s,j] kU_j;  dKU_j += sc sum_s dZ[s,j] qU_s */
int ref_backward(int L, int d, int W, double sc,
                 const double *qu, const double *ku, const double *vu,
                 const double *qc, const double *kc, const double *vc,
                 const double *dout,
                 double *dqu, double *dku, double *dvu,
                 double *dqc, double *dkc, double *dvc)
{
    if (bad_args(L, d, W))
        return -1;
    if (L == 0)
        return 0;
    if (!qu || !ku || !vu || !qc || !kc || !vc || !dout ||
        !dqu || !dku || !dvu || !dqc || !dkc || !dvc)
        return -1;

    size_t LL = (size_t)L;
    double *buf = alloc_d(6, LL, LL);
    double *vecs = alloc_d(2, LL, 1);
    if (!buf || !vecs) {
        free(buf);
        free(vecs);
        return -1;
    }
    double *G = buf, *X = G + LL * LL, *SU = X + LL * LL, *P = SU + LL * LL;
    double *dS = P + LL * LL;   /* dSU[t,s] */
    double *dXG = dS + LL * LL; /* dX[t,j] */
    double *lse = vecs, *delta = vecs + LL;

    parallel_core(L, d, W, sc, qu, ku, vu, qc, kc, G, X, SU, P, lse);

    size_t n = LL * (size_t)d;
    memset(dqu, 0, n * sizeof(double));
    memset(dku, 0, n * sizeof(double));
    memset(dvu, 0, n * sizeof(double));
    memset(dqc, 0, n * sizeof(double));
    memset(dkc, 0, n * sizeof(double));
    memset(dvc, 0, n * sizeof(double));

    /* Delta_t = dO_t . O_t, O_t = sum_s P[t,s] vC_s; dVC. */
    for (int t = 0; t < L; ++t) {
        double acc = 0.0;
        for (int s = 0; s <= t; ++s)
            acc += P[t * LL + s] * dot(ROW(dout, t), ROW(vc, s), d);
        delta[t] = acc;
        for (int s = 0; s <= t; ++s) {
            double p = P[t * LL + s];
            double *dv = ROW(dvc, s);
            const double *g = ROW(dout, t);
            for (int c = 0; c < d; ++c)
                dv[c] += p * g[c];
        }
    }

    /* dA (not stored), the QC KC^T branch, and dSU = -SiLU'(SU) dA. */
    for (int t = 0; t < L; ++t)
        for (int s = 0; s < L; ++s) {
            double da = 0.0;
            if (s <= t) {
                da = P[t * LL + s] * (dot(ROW(dout, t), ROW(vc, s), d) - delta[t]);
                double *dq = ROW(dqc, t), *dk = ROW(dkc, s);
                const double *k = ROW(kc, s), *q = ROW(qc, t);
                for (int c = 0; c < d; ++c) {
                    dq[c] += sc * da * k[c];
                    dk[c] += sc * da * q[c];
                }
            }
            dS[t * LL + s] = (s <= t) ? -dsilu(SU[t * LL + s]) * da : 0.0;
        }

    /* dX[t,j] = sum_{s<j} dSU[t,s] G[s,j], j <= t; the X = sc QC VU^T branch. */
    for (int t = 0; t < L; ++t)
        for (int j = 0; j < L; ++j) {
            double acc = 0.0;
            if (j <= t)
                for (int s = 0; s < j; ++s)
                    acc += dS[t * LL + s] * G[s * LL + j];
            dXG[t * LL + j] = acc;
            if (j <= t) {
                double *dq = ROW(dqc, t), *dv = ROW(dvu, j);
                const double *v = ROW(vu, j), *q = ROW(qc, t);
                for (int c = 0; c < d; ++c) {
                    dq[c] += sc * acc * v[c];
                    dv[c] += sc * acc * q[c];
                }
            }
        }

    /* dG[s,j] = sum_{t>=j} dSU[t,s] X[t,j]; dZ = dG G (1-G); the Z = sc QU KU^T branch. */
    for (int s = 0; s < L; ++s)
        for (int j = 0; j < L; ++j) {
            if (!gate_allowed(s, j, W))
                continue;
            double dg = 0.0;
            for (int t = j; t < L; ++t)
                dg += dS[t * LL + s] * X[t * LL + j];
            double z = sc * dot(ROW(qu, s), ROW(ku, j), d);
            double dz = dg * sig(z) * sig(-z);
            double *dq = ROW(dqu, s), *dk = ROW(dku, j);
            const double *k = ROW(ku, j), *q = ROW(qu, s);
            for (int c = 0; c < d; ++c) {
                dq[c] += sc * dz * k[c];
                dk[c] += sc * dz * q[c];
            }
        }

    free(buf);
    free(vecs);
    return 0;
}

/* -------------------------------------------------- prefill cache (docs/algorithm.md section 5) */

int ref_prefill_cache_u(int P, int d, int W, double sc,
                        const double *qu, const double *ku, const double *vu,
                        double *u)
{
    if (bad_args(P, d, W))
        return -1;
    if (P == 0)
        return 0;
    if (!qu || !ku || !vu || !u)
        return -1;
    memset(u, 0, (size_t)P * (size_t)d * sizeof(double));
    /* Accumulate in token order j, exactly as the decode update U[s] += G[s,j] vU_j does. */
    for (int j = 1; j < P; ++j) {
        int lo = (W == 0 || j - W < 0) ? 0 : j - W;
        for (int s = lo; s < j; ++s) {
            double g = sig(sc * dot(ROW(qu, s), ROW(ku, j), d));
            double *us = ROW(u, s);
            const double *vj = ROW(vu, j);
            for (int c = 0; c < d; ++c)
                us[c] += g * vj[c];
        }
    }
    return 0;
}
