/* libcastle test reference: CASTLE gradients in O(L^2 d) time and O(L d) memory, in fp64 and fp32.
 *
 * Same loss, arguments and conventions as ref_backward (conformance/ref.h): one batch entry, one head,
 * every matrix row-major L x d contiguous; W = 0 is full CASTLE, W >= 1 CASTLE-SWL; sc is the
 * scale. The outputs are the gradients of sum_{t,c} dout[t,c] * O[t,c] with respect to
 * qu, ku, vu, qc, kc, vc, overwritten (not accumulated). Return 0 on success, -1 on failure
 * (L, d or W negative, a NULL pointer with L > 0, a size overflow, malloc failure); L = 0 is valid
 * and does nothing. Never prints, exits or aborts. Outputs must not alias inputs.
 *
 * ref_backward_fast evaluates in double. ref_backward_fast_f32 runs the identical code with REAL =
 * float: the inputs (and sc) are rounded to float first, every operation and accumulation is in
 * float (expf, logf), and the float results are converted to double at the end. It is "a float32
 * evaluation of the same gradients", the yardstick for the device backward's error at long L.
 * The source (conformance/ref_grad.inc) is one body compiled twice from ref_grad.c.
 *
 * Scheme (t = query row, s = key row, j = lookahead token; docs/algorithm.md sections 1, 2, 4). Two passes:
 *
 * Pass 1, forward over t (the recurrent definition, as ref_forward_recurrent): keep u_s = u^t_s
 *   for every s (L x d), updated u_s += G[s,t] vU_t; scores a[t,s], softmax stats
 *   lse_t = m_t + log l_t, O_t, and Delta_t = dO_t . O_t. Only lse and Delta (O(L)) are kept.
 *
 * Pass 2, one key column s at a time (outer loop over s):
 *   (a) forward over t = s .. L-1: rebuild u^t_s = sum_{s<j<=t} G[s,j] vU_j by the same additions
 *       in the same order as pass 1 (so SU matches pass 1 bit for bit), and form
 *         SU[t,s] = sc qC_t . u^t_s,  A = sc qC_t.kC_s - SiLU(SU),  P = exp(A - lse_t),
 *         dA = P (dO_t.vC_s - Delta_t),  dSU[t,s] = -SiLU'(SU) dA;
 *       accumulate dVC_s += P dO_t, dKC_s += sc dA qC_t,
 *                  dQC_t += sc dA kC_s + sc dSU[t,s] u^t_s
 *       (the last term is sc sum_j dX[t,j] vU_j with dX[t,j] = sum_{s<j} dSU[t,s] G[s,j]).
 *       The column dSU[., s] and the gate column G[s, .] are kept (O(L) each).
 *   (b) backward over j = L-1 .. s+1: w_s = w^j_s = sum_{t>=j} dSU[t,s] qC_t, built by additions
 *       only (w += dSU[j,s] qC_j). For allowed gates (s < j <= s+W):
 *         dG[s,j] = sum_{t>=j} dSU[t,s] X[t,j] = sc vU_j . w_s,   dZ = dG G (1 - G),
 *         dVU_j += sc G[s,j] w_s,  dQU_s += sc dZ kU_j,  dKU_j += sc dZ qU_s.
 *       (1 - G is computed as sigmoid(-z), without cancellation.)
 * Nothing is ever subtracted out of a running sum (no roll-back of u or D), so the fp32 variant
 * carries only ordinary float32 rounding: O(L) summation lengths, no cancellation growth.
 * Cost: pass 1 ~ 5 d L^2/2, pass 2 ~ 14 d L^2/2 multiply-adds (full CASTLE); scratch
 * L x d (u) + 6 L + 3 d; the fp32 variant adds float copies of the 13 L x d arrays. */
#ifndef LIBCASTLE_TESTS_REF_GRAD_H
#define LIBCASTLE_TESTS_REF_GRAD_H

#ifdef __cplusplus
extern "C" {
#endif

int ref_backward_fast(int L, int d, int W, double sc,
                      const double *qu, const double *ku, const double *vu,
                      const double *qc, const double *kc, const double *vc,
                      const double *dout,
                      double *dqu, double *dku, double *dvu,
                      double *dqc, double *dkc, double *dvc);

int ref_backward_fast_f32(int L, int d, int W, double sc,
                          const double *qu, const double *ku, const double *vu,
                          const double *qc, const double *kc, const double *vc,
                          const double *dout,
                          double *dqu, double *dku, double *dvu,
                          double *dqc, double *dkc, double *dvc);

#ifdef __cplusplus
}
#endif

#endif /* LIBCASTLE_TESTS_REF_GRAD_H */
