/* fp64 reference of standard causal attention (conformance/ref_causal.h). */
#include "ref_causal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double dot(const double *a, const double *b, int d)
{
    double s = 0.0;
    for (int c = 0; c < d; ++c)
        s += a[c] * b[c];
    return s;
}

/* Row t's probabilities p[0..t] and its lse. */
static double row_softmax(int t, int d, double sc, const double *q, const double *k, double *p)
{
    double m = -INFINITY;
    for (int s = 0; s <= t; ++s) {
        p[s] = sc * dot(q + (size_t)t * d, k + (size_t)s * d, d);
        m = fmax(m, p[s]);
    }
    double l = 0.0;
    for (int s = 0; s <= t; ++s)
        l += (p[s] = exp(p[s] - m));
    for (int s = 0; s <= t; ++s)
        p[s] /= l;
    return m + log(l);
}

int ref_causal_forward(int L, int d, double sc, const double *q, const double *k, const double *v, double *o,
                       double *lse)
{
    if (L < 0 || d < 0 || (L > 0 && (!q || !k || !v || !o || !lse)))
        return -1;
    double *p = malloc(((size_t)L + 1) * sizeof(double));
    if (!p)
        return -1;
    for (int t = 0; t < L; ++t) {
        lse[t] = row_softmax(t, d, sc, q, k, p);
        double *ot = o + (size_t)t * d;
        memset(ot, 0, (size_t)d * sizeof(double));
        for (int s = 0; s <= t; ++s)
            for (int c = 0; c < d; ++c)
                ot[c] += p[s] * v[(size_t)s * d + c];
    }
    free(p);
    return 0;
}

int ref_causal_backward(int L, int d, double sc, const double *q, const double *k, const double *v, const double *dout,
                        double *dq, double *dk, double *dv)
{
    if (L < 0 || d < 0 || (L > 0 && (!q || !k || !v || !dout || !dq || !dk || !dv)))
        return -1;
    const size_t n = (size_t)L * d;
    double *p = malloc(((size_t)L + 1) * sizeof(double)), *ot = malloc(((size_t)d + 1) * sizeof(double));
    if (!p || !ot) {
        free(p);
        free(ot);
        return -1;
    }
    memset(dq, 0, n * sizeof(double));
    memset(dk, 0, n * sizeof(double));
    memset(dv, 0, n * sizeof(double));
    for (int t = 0; t < L; ++t) {
        row_softmax(t, d, sc, q, k, p);
        const double *qt = q + (size_t)t * d, *gt = dout + (size_t)t * d;
        memset(ot, 0, (size_t)d * sizeof(double));
        for (int s = 0; s <= t; ++s)
            for (int c = 0; c < d; ++c)
                ot[c] += p[s] * v[(size_t)s * d + c];
        const double delta = dot(gt, ot, d); /* sum_s P dP = dout_t . o_t */
        for (int s = 0; s <= t; ++s) {
            const double ds = p[s] * (dot(gt, v + (size_t)s * d, d) - delta);
            for (int c = 0; c < d; ++c) {
                dq[(size_t)t * d + c] += sc * ds * k[(size_t)s * d + c];
                dk[(size_t)s * d + c] += sc * ds * qt[c];
                dv[(size_t)s * d + c] += p[s] * gt[c];
            }
        }
    }
    free(p);
    free(ot);
    return 0;
}
