/* Tolerances for the OpenCL float32 results against the fp64 reference, stated once.
 *
 * Error measure (conformance/harness.c): max |got - ref| over a tensor, divided by max(1, max |ref|).
 * O is a convex combination of VC rows, so its error scales with the size of VC, not with each
 * element; lse is normalised the same way.
 *
 * FORWARD_TOL = 1e-5, for inputs in [-1, 1] at scales up to about twice the default 1/sqrt(d) (the
 * scores, and float32's absolute error in them, grow with the scale: at d = 256 and a scale of 0.84,
 * 13 times the default, a float32 evaluation of the parallel form is itself off by 4e-6 and the
 * kernels by up to 1.0e-5; LARGE_TOL's reasoning applies there).  The kernels compute and accumulate in float32
 * (unit roundoff u = 6e-8).  Seen on PoCL over the whole shape table: worst 2.3e-7 (about 4u).
 * The bound leaves ~40x for devices whose exp/log are off by the 3-4 ulp OpenCL allows and that
 * contract or reorder sums differently; it is still 100x below what one wrong gate entry, one
 * missing block term or an off-by-one mask gives (a mutated kernel fails with errors > 1e-2).
 *
 * LARGE_TOL = 1e-3, for inputs of magnitude 10-20.  Scores then reach |a| ~ mag^2 sqrt(d), in the
 * thousands, and float32 holds them only to u |a| ~ 1e-4 absolute; softmax passes that score error
 * on to O relative to its scale.  Seen worst 7.4e-5 at magnitude 20, d = 128; the bound keeps ~13x.
 */
#ifndef CASTLE_TOLERANCE_H
#define CASTLE_TOLERANCE_H
#define FORWARD_TOL 1e-5
#define LARGE_TOL 1e-3

/* Backward: error per gradient = max |got - ref| / max(1e-3, max |ref|) (gradients are O(1e-2);
 * normalising by 1 would make the measure absolute).  BACKWARD_TOL = 1e-5 for inputs in [-1, 1]:
 * each gradient entry is a sum over up to L block products of length d, in float32; seen on PoCL
 * over the shape table: worst 8.5e-7 (d = 256), so ~12x margin for other devices' rounding.
 * It is a bound for L >= 3.  At L = 2 CASTLE's gradients come from cancellation (the one gate
 * entry and the one lookahead pair: max |grad| ~1e-4 .. 1e-2, below the floor's scale) and float32
 * evaluation itself reaches 1e-5 there (seen: 2 of 30 seeds at d = 256 exceed 1e-5 on PoCL, 1.9e-5,
 * float32 1.6e-6 .. 3.1e-6; 1.0e-5 for a float32 evaluation at d = 128); the table's two L = 2
 * cases (d = 8 and 33, fixed seeds) pass it.
 * BACKWARD_LARGE_TOL = 1e-3 for magnitude 10, as LARGE_TOL: scores ~1e3 carry absolute errors
 * ~u |a| ~ 1e-4, and P = exp(A - lse) turns them into relative errors of the same size in every
 * gradient: seen 3.8e-6 .. 6.4e-5 depending on the summation order of the kernels' dot products.
 * BACKWARD_LONG_RATIO = 10: at L = 4096 the device error may be at most 10x the error of a float32
 * evaluation of the same gradients (docs/algorithm.md section 4); see test_backward.c:test_long.
 * BACKWARD_MAG_RATIO = 10, for inputs of magnitude 1 .. 1e4 (test_backward.c:test_magnitudes): per
 * gradient, the device error may be at most 10x that of a float32 evaluation of the same gradients,
 * or BACKWARD_TOL.  Scores reach ~mag^2 and float32 holds them to u |a|, so the only way to stay
 * near float32's error is to recompute exactly the A the forward normalised (P <= 1); before the
 * backward did, dVC's error was 5.7e-4 / 5.4e-2 / 3e6 at mag 100 / 1e3 / 1e4 (float32: 6.1e-8).
 * Seen on PoCL: equal to the float32 evaluation's at mag >= 100 (6.1e-8), within 1.3x at mag 1. */
#define BACKWARD_TOL 1e-5
#define BACKWARD_LARGE_TOL 1e-3
#define BACKWARD_LONG_RATIO 10.0
#define BACKWARD_MAG_RATIO 10.0
/* ---- UQ-KV cache (tests/test_decode.c, tests/test_cli_decode.c) ----
 * DECODE_TOL = 1e-5, for inputs in [-1, 1]: outputs of prefill + decode against the fp64 reference
 * (the FORWARD_TOL measure) and against castle_forward (max absolute difference; |O| <= 1).  Decode
 * does the forward's arithmetic in another order (float32 dot products over d, an online softmax
 * split over work-groups and merged), so the same bound and reasons apply.  Seen on PoCL over the
 * test_decode table and three tunings: worst 1.4e-7 against the reference, 1.3e-7 against
 * castle_forward; ~70x margin.
 * CACHE_U_TOL = 1e-5: U against ref_prefill_cache_u and against the U of one prefill of all tokens,
 * normalised by max(1, max |U|).  A row of U sums up to L - 1 gated VU rows in float32 (one rank-1
 * update per decoded token, so its rounding error grows with L); seen worst 8.7e-7 at L = 300, the
 * longest sequence the suite decodes, ~11x margin.  A wrong gate, window edge or ring row gives
 * errors above 1e-2.  Both bounds are for the lengths the suites decode (L <= 300): U's float32 sums
 * (and through U the outputs) lose accuracy with L as a float32 recurrent evaluation does (an
 * independent probe measured U 3.0e-6 / 7.0e-6 / 1.3e-5 at L = 4096 / 16384 / 65536, and decode
 * outputs 1.5e-5 at L = 8192 with nonnegative VU, QU, KU, where the forward, which keeps D as a
 * float pair, gave 1.3e-6). */
#define DECODE_TOL 1e-5
#define CACHE_U_TOL 1e-5
/* ---- standard causal attention, the baseline (tests/test_causal.c) ----
 * CAUSAL_TOL = 1e-5, for inputs in [-1, 1], the FORWARD_TOL measure (max |got - ref| / max(1, max |ref|)):
 * castle_causal_forward, and prefill + decode against both the fp64 reference and the device's
 * forward pass.  float32 dot products over d and an online softmax, merged across work-groups in
 * decode: seen on PoCL over the table, worst 1.5e-7 (forward and decode alike), ~65x margin.  A
 * missing key block, a mask off by one or a wrong rescale gives errors above 1e-2.
 * CAUSAL_LARGE_TOL = 1e-3 for magnitudes 10 and 20 (scores ~1e2..1e3, float32 holds them to ~1e-4
 * absolute, as for LARGE_TOL): seen 4.3e-6 at 10, 3.0e-5 at 20 (d = 128), ~33x margin.
 * CAUSAL_GRAD_TOL = 1e-5 for dq, dk, dv, measured as max |got - ref| / max(0.1, max |ref|): with
 * inputs in [-1, 1] the gradients of causal attention are O(0.1..2) (max |dq| >= 0.12 over the
 * table), except at L = 1 where dq = dk = 0 exactly (one key, P = 1) and float32 leaves roundoff of
 * the size of the cancelling terms (~1e-7); the floor keeps the measure relative to that scale.
 * Seen worst 3.5e-7, ~28x margin.  test_causal holds the gradients of a saturated softmax (inputs of
 * magnitude 100 and 1000) to it too: the backward recomputes P with the forward's rounding and sums
 * Delta = dO . O in dP's order, so a one-hot row's dq, dk are exactly 0 (seen at most 2.7e-7).
 * For the table's lengths (L <= 300): dk and dv sum over every later query in float32, so their error
 * grows about as sqrt(L) (a probe: 1.6e-6 / 3.6e-6 / 6.2e-6 at L = 1024 / 4096 / 16384, 1.0e-5 at
 * 65536 for one seed). */
#define CAUSAL_TOL 1e-5
#define CAUSAL_LARGE_TOL 1e-3
#define CAUSAL_GRAD_TOL 1e-5
#endif
