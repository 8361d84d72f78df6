/* Tolerances for the OpenCL float32 results against the fp64 reference, stated once.
 *
 * Error measure (tests/harness.c): max |got - ref| over a tensor, divided by max(1, max |ref|).
 * O is a convex combination of VC rows, so its error scales with the size of VC, not with each
 * element; lse is normalised the same way.
 *
 * FORWARD_TOL = 1e-5, for inputs in [-1, 1].  The kernels compute and accumulate in float32
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
 * BACKWARD_LARGE_TOL = 5e-5 for magnitude 10 (scores ~1e3 as for LARGE_TOL): seen 3.8e-6.
 * BACKWARD_LONG_RATIO = 10: at L = 4096 the device error may be at most 10x the error of a float32
 * evaluation of the same gradients (issue 3); see test_backward.c:test_long. */
#define BACKWARD_TOL 1e-5
#define BACKWARD_LARGE_TOL 5e-5
#define BACKWARD_LONG_RATIO 10.0
#endif
