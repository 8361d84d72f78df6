/* The conformance harness: the device under test, data generation, guarded device buffers, and the
 * case drivers (forward, backward, and the causal baseline's) that run one case on a device and
 * measure it against the fp64 reference.  Part of the castle_conformance library, used by the test
 * suites, castle-conformance, castle-info's self-test and castle-tune. */
#ifndef CASTLE_TESTS_HARNESS_H
#define CASTLE_TESTS_HARNESS_H

#include "castle/castle.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The context for CASTLE_DEVICE (default "0:0"), created once per process; NULL on failure with
   the reason in castle_last_error(). */
castle_context *h_context(void);
cl_command_queue h_queue(void);
/* A new out-of-order queue on ctx's context and device (the caller releases it), or NULL with a line
   on stderr naming `who` where the device has none (the test that wanted it is then skipped). */
cl_command_queue h_out_of_order_queue(castle_context *ctx, const char *who);

/* The test value of element (tensor, b, h, row, col) for a seed, in [-1, 1): independent of the
   shape, so a length-P run sees exactly the first P rows of a length-L run. */
double h_value(uint64_t seed, unsigned tensor, size_t b, size_t h, size_t row, size_t col);

/* Tensor layouts the suites exercise. */
typedef enum h_layout { H_BHLD = 0, H_BLHD = 1, H_PADDED = 2 /* BHLD with row stride d + 5 */ } h_layout;
void h_apply_layout(castle_attention_desc *desc, h_layout layout);
/* Element offset of (b, h, row) in a layout of rows of `width` elements (all strides zero = packed
   (B, H, L, width)), and the elements a buffer for it must hold. */
size_t h_layout_offset(const castle_layout *l, size_t width, size_t H, size_t L, size_t b, size_t h, size_t row);
size_t h_layout_span(const castle_layout *l, size_t width, size_t B, size_t H, size_t L);

/* A device buffer for a tensor of `span` floats inside a larger parent whose margins (and, for
   strided layouts, the gaps between rows) are filled with a sentinel; h_guard_intact checks that
   every element outside `mask` still holds it. */
typedef struct h_guarded {
    cl_mem parent, view;
    size_t pre, span, post; /* floats */
} h_guarded;
bool h_guarded_create(cl_context cl_ctx, cl_device_id dev, h_guarded *g, size_t span);
void h_guarded_release(h_guarded *g);
/* Reads the whole parent; *host receives span floats of the view; returns false when a float
   outside the view (pre or post margin) or at a position where used[i] is false changed. */
bool h_guarded_read(cl_command_queue q, const h_guarded *g, float *host, const bool *used);
bool h_guarded_write(cl_command_queue q, const h_guarded *g, const float *host);

/* A forward-pass test case. */
typedef struct h_fwd_case {
    size_t B, H, L, d;
    long W;
    h_layout layout;
    double mag;   /* inputs uniform in [-mag, mag); dO (backward) always in [-1, 1) */
    float scale;  /* 0 = default 1/sqrt(d) */
    uint64_t seed;
} h_fwd_case;

typedef struct h_fwd_out {
    double err_o, err_lse; /* max |got - ref| / max(1, max |ref|) over the tensor */
    /* backward only: per gradient dQU..dVC, max |got - ref| / max(1e-3, max |ref|) (gradients
       are small: normalising by 1 would make the measure absolute) */
    double err_grad[6];
    bool guards_ok;
    bool finite;
    bool again_same; /* h_run_backward_again: the second castle_backward gave bitwise the first's gradients */
    float *o, *lse;        /* logical (B, H, L, d) / (B, H, L) device results, if keep was set */
    float *grad[6];        /* logical (B, H, L, d) gradients, if keep was set (backward) */
} h_fwd_out;

/* A value planted by h_run_forward and h_run_backward in input `tensor` (0..5 = QU..VC as
   CASTLE_TENSOR_*, 6 = dO) at token `row` of every batch entry, head and column, in what the device
   sees and in the references' inputs; tensor < 0 (the initial value): none.  For the causality
   tests (a NaN or Inf at token r). */
typedef struct h_poison {
    int tensor;
    size_t row;
    float value;
} h_poison;
extern h_poison h_poisoned;
/* When set, every input value h_run_forward and h_run_backward plant (tensor 0..5 = QU..VC, 6 = dO;
   `value` the one they would plant) is hook(tensor, b, h, row, col, value), rounded to float, in
   the device's inputs and the references' alike: inputs built by hand.  NULL (the initial value):
   none. */
typedef double (*h_input_fn)(int tensor, size_t b, size_t h, size_t row, size_t col, double value);
extern h_input_fn h_input_hook;
/* An h_input_fn for sequences of at least 65 tokens whose lookahead score overflows float32 before it
   is scaled: vU = 1e19 at tokens 1..63, qC = -1e19 at token 64, QU, KU, QC (elsewhere) and KC zero
   (every allowed gate 1/2), VC and dO as planted.  The lookahead key of token s < 64 seen by token
   64 is 0.5e19 (63 - s), so qC_64 . u is about -3e39: -inf in float32, whose SiLU has the limit 0;
   the exact outputs and gradients are finite. */
double h_overflow_lookahead(int tensor, size_t b, size_t h, size_t row, size_t col, double value);

/* Which fp64 reference the backward is compared with. */
typedef enum h_grad_ref {
    H_GRAD_NONE = 0,
    H_GRAD_EXACT, /* ref_backward: the parallel form's gradients, O(L^3) */
    H_GRAD_FAST,  /* ref_backward_fast: the same gradients in O(L^2 d) (long sequences) */
    H_GRAD_FAST_F32 /* ref_backward_fast_f32 "as the reference": reports the float32 evaluation's own
                       error against ref_backward_fast in err_grad (the device is still run) */
} h_grad_ref;

/* Runs castle_forward on ctx/queue and, if with_ref, compares with ref_forward_recurrent.
   Returns CASTLE_SUCCESS or the failing status.  With keep, out->o and out->lse are malloc'd. */
castle_status h_run_forward(castle_context *ctx, cl_command_queue queue, const h_fwd_case *c, bool with_ref,
                            bool keep, h_fwd_out *out);
/* castle_forward then castle_backward with dO = h_value(seed, 6, ...); gradients compared with
   `ref` (forward outputs with the recurrent reference when ref != H_GRAD_NONE). */
castle_status h_run_backward(castle_context *ctx, cl_command_queue queue, const h_fwd_case *c, h_grad_ref ref,
                             bool keep, h_fwd_out *out);
/* As h_run_backward, with castle_backward run twice on the workspace of one castle_forward (the
   gradients reported are the second run's): out->again_same says whether both runs wrote bitwise
   the same gradients, which they must, as the backward leaves the forward's state intact and
   overwrites its own scratch. */
castle_status h_run_backward_again(castle_context *ctx, cl_command_queue queue, const h_fwd_case *c, h_grad_ref ref,
                                   bool keep, h_fwd_out *out);
/* Standard causal attention (castle_causal_forward, then castle_causal_backward with dO) on QC, KC, VC
   of case c (W ignored), against ref_causal_forward / ref_causal_backward: err_o, err_lse, and the
   gradients dq, dk, dv in err_grad[3..5] measured as max |got - ref| / max(0.1, max |ref|)
   (conformance/tolerance.h, CAUSAL_GRAD_TOL). */
castle_status h_run_causal_forward(castle_context *ctx, cl_command_queue queue, const h_fwd_case *c, bool keep,
                                   h_fwd_out *out);
castle_status h_run_causal_backward(castle_context *ctx, cl_command_queue queue, const h_fwd_case *c, bool keep,
                                    h_fwd_out *out);
void h_fwd_out_free(h_fwd_out *out);

#endif
