/* libcastle test reference: double-precision CPU implementation of CASTLE attention.
 *
 * One batch entry, one head. Every matrix is row-major L x d, contiguous, rows = tokens.
 * W = lookahead window: 0 = full CASTLE, W >= 1 = CASTLE-SWL. sc = scale (the caller passes the
 * actual value, e.g. 1/sqrt(d)). Mathematics: docs/algorithm.md sections 1, 2, 4, 5.
 *
 * Every function returns 0 on success and -1 on failure (L, d, P or W negative, a required pointer
 * NULL, a size overflow, or malloc failure); on failure the outputs are left unspecified. The
 * functions never print, exit or abort. L = 0 (or P = 0) is valid and does nothing.
 * Outputs must not alias inputs.
 */
#ifndef LIBCASTLE_TESTS_REF_H
#define LIBCASTLE_TESTS_REF_H

#ifdef __cplusplus
extern "C" {
#endif

/* Recurrent definition, docs/algorithm.md section 1: lookahead keys u^t_s materialised for every t
 * (u^t_s = u^{t-1}_s + G[s,t] vU_t accumulated incrementally, O(L^2 d) time, O(L d) memory).
 * Writes o (L x d) and lse (L, natural log of the softmax normaliser). */
int ref_forward_recurrent(int L, int d, int W, double sc,
                          const double *qu, const double *ku, const double *vu,
                          const double *qc, const double *kc, const double *vc,
                          double *o, double *lse);

/* Parallel form, docs/algorithm.md section 2: X, G and SU = X G^T materialised (O(L^3) time, O(L^2) memory).
 * Same arguments and outputs as ref_forward_recurrent. */
int ref_forward_parallel(int L, int d, int W, double sc,
                         const double *qu, const double *ku, const double *vu,
                         const double *qc, const double *kc, const double *vc,
                         double *o, double *lse);

/* Gradients of the scalar loss sum_{t,c} dout[t,c] * O[t,c] with respect to all six inputs,
 * derived analytically from the parallel form (O(L^3) time, O(L^2) memory).
 * Outputs are L x d each and are overwritten (not accumulated). */
int ref_backward(int L, int d, int W, double sc,
                 const double *qu, const double *ku, const double *vu,
                 const double *qc, const double *kc, const double *vc,
                 const double *dout,
                 double *dqu, double *dku, double *dvu,
                 double *dqc, double *dkc, double *dvc);

/* The UQ-KV cache lookahead keys after a prefill of tokens 0..P-1 (docs/algorithm.md section 5):
 * u[s] = sum_{s < j <= P-1} G[s,j] vU_j, P x d (row P-1 is zero). Inputs are P x d. */
int ref_prefill_cache_u(int P, int d, int W, double sc,
                        const double *qu, const double *ku, const double *vu,
                        double *u);

#ifdef __cplusplus
}
#endif

#endif /* LIBCASTLE_TESTS_REF_H */
