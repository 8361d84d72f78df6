/* libcastle test reference: O(L^2 d) CASTLE gradients in fp64 and fp32. See ref_grad.h. */
#include "ref_grad.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- the generic body, once per precision */
#define REAL double
#define RG(name) name##_f64
#define R_EXP exp
#define R_LOG log
#include "ref_grad.inc"
#undef REAL
#undef RG
#undef R_EXP
#undef R_LOG

#define REAL float
#define RG(name) name##_f32
#define R_EXP expf
#define R_LOG logf
#include "ref_grad.inc"
#undef REAL
#undef RG
#undef R_EXP
#undef R_LOG

/* Argument checks shared by both entry points: -1 = fail, 0 = nothing to do (L = 0), 1 = go.
 * Also checks that 13 L x d arrays of doubles fit in size_t (covers every allocation made). */
static int check_args(int L, int d, int W, const double *qu, const double *ku, const double *vu,
                      const double *qc, const double *kc, const double *vc, const double *dout,
                      const double *dqu, const double *dku, const double *dvu, const double *dqc,
                      const double *dkc, const double *dvc)
{
    if (L < 0 || d < 0 || W < 0)
        return -1;
    if (L == 0)
        return 0;
    if (!qu || !ku || !vu || !qc || !kc || !vc || !dout ||
        !dqu || !dku || !dvu || !dqc || !dkc || !dvc)
        return -1;
    size_t dd = (size_t)(d > 0 ? d : 1);
    if ((size_t)L > SIZE_MAX / 16 / sizeof(double) / dd)
        return -1;
    return 1;
}

int ref_backward_fast(int L, int d, int W, double sc,
                      const double *qu, const double *ku, const double *vu,
                      const double *qc, const double *kc, const double *vc,
                      const double *dout,
                      double *dqu, double *dku, double *dvu,
                      double *dqc, double *dkc, double *dvc)
{
    int rc = check_args(L, d, W, qu, ku, vu, qc, kc, vc, dout, dqu, dku, dvu, dqc, dkc, dvc);
    if (rc <= 0)
        return rc;
    return core_f64(L, d, W, sc, qu, ku, vu, qc, kc, vc, dout, dqu, dku, dvu, dqc, dkc, dvc);
}

int ref_backward_fast_f32(int L, int d, int W, double sc,
                          const double *qu, const double *ku, const double *vu,
                          const double *qc, const double *kc, const double *vc,
                          const double *dout,
                          double *dqu, double *dku, double *dvu,
                          double *dqc, double *dkc, double *dvc)
{
    int rc = check_args(L, d, W, qu, ku, vu, qc, kc, vc, dout, dqu, dku, dvu, dqc, dkc, dvc);
    if (rc <= 0)
        return rc;
    size_t n = (size_t)L * (size_t)d;
    /* 7 inputs and 6 outputs in float; +1 so that d = 0 still allocates. */
    float *fb = (float *)malloc((13 * n + 1) * sizeof(float));
    if (!fb)
        return -1;
    const double *in[7] = { qu, ku, vu, qc, kc, vc, dout };
    double *out[6] = { dqu, dku, dvu, dqc, dkc, dvc };
    float *fi[7], *fo[6];
    for (int k = 0; k < 7; ++k) {
        fi[k] = fb + (size_t)k * n;
        for (size_t i = 0; i < n; ++i)
            fi[k][i] = (float)in[k][i];
    }
    for (int k = 0; k < 6; ++k)
        fo[k] = fb + (size_t)(7 + k) * n;
    rc = core_f32(L, d, W, (float)sc, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fi[6],
                  fo[0], fo[1], fo[2], fo[3], fo[4], fo[5]);
    if (rc == 0)
        for (int k = 0; k < 6; ++k)
            for (size_t i = 0; i < n; ++i)
                out[k][i] = (double)fo[k][i];
    free(fb);
    return rc;
}
