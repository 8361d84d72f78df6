/* libcastle test reference: double-precision standard causal softmax attention (the baseline).
 *
 * One batch entry, one head; every matrix is row-major L x d, contiguous, rows = tokens; sc is the
 * score scale (the caller passes the actual value, e.g. 1/sqrt(d)):
 *   o_t = sum_{s <= t} softmax_s(sc q_t . k_s) v_s,   lse_t = log sum_{s <= t} exp(sc q_t . k_s).
 * Functions return 0 on success and -1 on failure (L or d negative, a NULL pointer, malloc failure);
 * L = 0 does nothing.  Outputs must not alias inputs.  Never print, exit or abort. */
#ifndef LIBCASTLE_TESTS_REF_CAUSAL_H
#define LIBCASTLE_TESTS_REF_CAUSAL_H

#ifdef __cplusplus
extern "C" {
#endif

/* o (L x d) and lse (L), O(L^2 d). */
int ref_causal_forward(int L, int d, double sc, const double *q, const double *k, const double *v, double *o,
                       double *lse);

/* Gradients of the loss sum_{t,c} dout[t,c] o[t,c] with respect to q, k, v (L x d each, overwritten),
 * derived analytically: P = softmax rows, dP = dout V^T, dS = P (dP - rowsum(dout * o)),
 * dq = sc dS K, dk = sc dS^T Q, dv = P^T dout.  O(L^2 d). */
int ref_causal_backward(int L, int d, double sc, const double *q, const double *k, const double *v, const double *dout,
                        double *dq, double *dk, double *dv);

#ifdef __cplusplus
}
#endif

#endif /* LIBCASTLE_TESTS_REF_CAUSAL_H */
