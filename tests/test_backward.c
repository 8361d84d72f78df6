/* castle_backward on the OpenCL device against the fp64 reference gradients. */
#include "conformance_check.h"
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const grad_names[6] = {"dqu", "dku", "dvu", "dqc", "dkc", "dvc"};

/* The conformance table's backward cases: the forward's shapes up to L = CONF_BACKWARD_MAX_L (the
   O(L^3) reference gradients stay fast; test_long covers long sequences), then large magnitudes. */
START_TEST(test_shapes) { conformance_check(CONF_BACKWARD, _i); }
END_TEST

/* Two runs (forward + backward, each on a workspace of its own) give bitwise identical gradients:
   no atomics, no dependence on work-group order. */
START_TEST(test_deterministic)
{
    h_fwd_case c = {2, 2, 200, 48, _i ? 7 : 0, H_BLHD, 1, 0, 77};
    h_fwd_out a, b;
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_NONE, true, &a) == CASTLE_SUCCESS);
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_NONE, true, &b) == CASTLE_SUCCESS);
    const size_t n = c.B * c.H * c.L * c.d;
    for (int k = 0; k < 6; ++k)
        ck_assert_msg(!memcmp(a.grad[k], b.grad[k], n * sizeof(float)), "%s differs between two runs", grad_names[k]);
    h_fwd_out_free(&a);
    h_fwd_out_free(&b);
}
END_TEST

/* On an out-of-order queue, the backward waiting only for the forward's event (its launches chained
   by events: host/launch.c), the outputs and gradients are bitwise those of the in-order queue:
   folded (B H = 4) and one launch per anti-diagonal (B H = 1), with a window. */
START_TEST(test_out_of_order_queue)
{
    static const h_fwd_case cases[] = {{2, 2, 200, 48, 0, H_BLHD, 1, 0, 91}, {1, 1, 200, 48, 7, H_BHLD, 1, 0, 92}};
    const h_fwd_case *c = &cases[_i];
    castle_context *ctx = h_context();
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    cl_command_queue oq = h_out_of_order_queue(ctx, "test_out_of_order_queue");
    if (!oq)
        return;
    h_fwd_out a, b;
    ck_assert(h_run_backward(ctx, h_queue(), c, H_GRAD_NONE, true, &a) == CASTLE_SUCCESS);
    ck_assert(h_run_backward(ctx, oq, c, H_GRAD_NONE, true, &b) == CASTLE_SUCCESS);
    const size_t n = c->B * c->H * c->L * c->d;
    ck_assert_msg(!memcmp(a.o, b.o, n * sizeof(float)), "o differs on an out-of-order queue");
    ck_assert_msg(!memcmp(a.lse, b.lse, c->B * c->H * c->L * sizeof(float)), "lse differs on an out-of-order queue");
    for (int k = 0; k < 6; ++k)
        ck_assert_msg(!memcmp(a.grad[k], b.grad[k], n * sizeof(float)), "%s differs on an out-of-order queue",
                      grad_names[k]);
    ck_assert(b.guards_ok);
    h_fwd_out_free(&a);
    h_fwd_out_free(&b);
    clReleaseCommandQueue(oq);
}
END_TEST

/* castle_backward twice on the workspace of one castle_forward: bitwise the same gradients, and the
   second run's within BACKWARD_TOL of the fp64 reference.  The backward must leave the forward's
   state intact and write its own scratch (the working copy of D, dD, Delta, the sums of dY) before
   it reads it, whatever a previous backward left there.  B H = 4 (four blocks under the CPU
   entries: folded on a device of at most 2 compute units, schedule.c) and B H = 1 (one launch per
   anti-diagonal), without and with a window. */
START_TEST(test_again)
{
    static const h_fwd_case cases[] = {{2, 2, 200, 48, 0, H_BLHD, 1, 0, 78}, {1, 1, 200, 48, 7, H_BHLD, 1, 0, 79}};
    const h_fwd_case *c = &cases[_i];
    h_fwd_out out;
    ck_assert(h_run_backward_again(h_context(), h_queue(), c, H_GRAD_EXACT, false, &out) == CASTLE_SUCCESS);
    ck_assert_msg(out.again_same, "W=%ld: a second backward on the same workspace changed the gradients", c->W);
    ck_assert(out.finite && out.guards_ok);
    for (int k = 0; k < 6; ++k)
        ck_assert_msg(out.err_grad[k] <= BACKWARD_TOL, "W=%ld: %s of the second backward: error %.3g > %g", c->W,
                      grad_names[k], out.err_grad[k], BACKWARD_TOL);
}
END_TEST

/* castle_backward reads o and lse: they are inputs there, and inputs may share memory, so d_o may be
   the buffer of o (the gradient of |o|^2 / 2, say).  The gradients must be bitwise those of the same
   call with d_o a copy of o; a gradient on o (an output on an input) is still refused. */
static cl_mem filled(cl_context clc, size_t n, unsigned tensor)
{
    float *host = malloc(n * sizeof(float));
    ck_assert(host != NULL);
    for (size_t i = 0; i < n; ++i)
        host[i] = (float)h_value(81, tensor, 0, 0, 0, i);
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(float), host, &err);
    free(host);
    ck_assert_msg(m != NULL, "clCreateBuffer: %d", (int)err);
    return m;
}

START_TEST(test_d_o_is_o)
{
    castle_context *ctx = h_context();
    cl_command_queue q = h_queue();
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    cl_context clc = castle_context_cl_context(ctx);
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, 1, 2, 70, 16); /* two blocks under every built-in entry */
    const size_t n = 2 * 70 * 16;
    size_t ws_bytes = 0;
    ck_assert(castle_forward_workspace_size(ctx, &desc, &ws_bytes) == CASTLE_SUCCESS);
    cl_mem in[6], o = filled(clc, n, 6), lse = filled(clc, 2 * 70, 7), ws = filled(clc, ws_bytes / sizeof(float), 8);
    for (int t = 0; t < 6; ++t)
        in[t] = filled(clc, n, (unsigned)t);
    ck_assert(castle_forward(ctx, &desc, in[0], in[1], in[2], in[3], in[4], in[5], o, lse, ws, q, 0, NULL, NULL) ==
              CASTLE_SUCCESS);
    cl_mem copy = filled(clc, n, 9), g[2][6];
    ck_assert(clEnqueueCopyBuffer(q, o, copy, 0, 0, n * sizeof(float), 0, NULL, NULL) == CL_SUCCESS);
    float *host[2];
    for (int r = 0; r < 2; ++r) {
        for (int k = 0; k < 6; ++k)
            g[r][k] = filled(clc, n, 10 + (unsigned)k);
        castle_status st = castle_backward(ctx, &desc, in[0], in[1], in[2], in[3], in[4], in[5], o, lse, ws,
                                           r == 0 ? o : copy, g[r][0], g[r][1], g[r][2], g[r][3], g[r][4], g[r][5], q,
                                           0, NULL, NULL);
        ck_assert_msg(st == CASTLE_SUCCESS, "backward with d_o %s: %s", r == 0 ? "= o" : "a copy of o",
                      castle_last_error());
        host[r] = malloc(6 * n * sizeof(float));
        ck_assert(host[r] != NULL);
        for (int k = 0; k < 6; ++k)
            ck_assert(clEnqueueReadBuffer(q, g[r][k], CL_TRUE, 0, n * sizeof(float), host[r] + k * n, 0, NULL, NULL) ==
                      CL_SUCCESS);
    }
    ck_assert_msg(!memcmp(host[0], host[1], 6 * n * sizeof(float)),
                  "the gradients with d_o = o differ from those with a copy of o");
    size_t nonzero = 0; /* the comparison is of gradients the backward wrote, not of zeros */
    for (size_t i = 0; i < 6 * n; ++i)
        nonzero += host[0][i] != 0.0f && fabsf(host[0][i]) < 1e3f;
    ck_assert_msg(nonzero > 5 * n, "only %zu of %zu gradient entries non-zero", nonzero, 6 * n);
    ck_assert(castle_backward(ctx, &desc, in[0], in[1], in[2], in[3], in[4], in[5], o, lse, ws, copy, o, g[0][1],
                              g[0][2], g[0][3], g[0][4], g[0][5], q, 0, NULL, NULL) == CASTLE_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(castle_last_error(), "d_qu is the same buffer as o") != NULL, "message '%s'",
                  castle_last_error());
    for (int r = 0; r < 2; ++r) {
        for (int k = 0; k < 6; ++k)
            clReleaseMemObject(g[r][k]);
        free(host[r]);
    }
    for (int t = 0; t < 6; ++t)
        clReleaseMemObject(in[t]);
    clReleaseMemObject(o);
    clReleaseMemObject(lse);
    clReleaseMemObject(ws);
    clReleaseMemObject(copy);
}
END_TEST

/* Long sequences: rolling D back must not lose precision.  The device error against the fp64
   reference stays within BACKWARD_LONG_RATIO of a float32 evaluation of the same gradients
   (ref_backward_fast_f32, plain float sums). */
START_TEST(test_long)
{
    const size_t L = getenv("CASTLE_TEST_LONG_L") ? (size_t)atol(getenv("CASTLE_TEST_LONG_L")) : 4096;
    h_fwd_case c = {1, 1, L, 16, _i ? 64 : 0, H_BHLD, 1, 0, 4242};
    h_fwd_out dev, f32;
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_FAST, false, &dev) == CASTLE_SUCCESS);
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_FAST_F32, false, &f32) == CASTLE_SUCCESS);
    ck_assert(dev.finite && dev.guards_ok);
    double wd = 0, wf = 0;
    for (int k = 0; k < 6; ++k) {
        wd = fmax(wd, dev.err_grad[k]);
        wf = fmax(wf, f32.err_grad[k]);
    }
    fprintf(stderr, "backward L=%zu d=16 W=%ld: device error %.3g, float32 evaluation %.3g, ratio %.2f\n", L, c.W, wd,
            wf, wd / wf);
    ck_assert_msg(wd <= BACKWARD_LONG_RATIO * wf, "L=%zu W=%ld: device gradient error %.3g > %g x float32's %.3g", L,
                  c.W, wd, BACKWARD_LONG_RATIO, wf);
}
END_TEST

/* Large magnitudes: inputs uniform in +-mag, dO in +-1.  Scores reach ~mag^2 and the
   softmax becomes one-hot; the backward must recompute P exactly as the forward normalised it, so
   its error against the fp64 reference stays within BACKWARD_MAG_RATIO of a plain float32
   evaluation of the same gradients (or within BACKWARD_TOL), for every gradient. */
static const double mags[] = {1, 100, 1e3, 1e4};
START_TEST(test_magnitudes)
{
    const h_fwd_case c = {1, 1, 70, 24, _i / 4 ? 5 : 0, H_BHLD, mags[_i % 4], 0, 909};
    h_fwd_out dev, f32;
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_EXACT, false, &dev) == CASTLE_SUCCESS);
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_FAST_F32, false, &f32) == CASTLE_SUCCESS);
    ck_assert(dev.guards_ok);
    for (int k = 0; k < 6; ++k) {
        const double tol = fmax(BACKWARD_TOL, BACKWARD_MAG_RATIO * f32.err_grad[k]);
        if (getenv("CASTLE_TEST_VERBOSE"))
            fprintf(stderr, "mag=%g W=%ld %s: device %.3g, float32 evaluation %.3g\n", c.mag, c.W, grad_names[k],
                    dev.err_grad[k], f32.err_grad[k]);
        ck_assert_msg(dev.err_grad[k] <= tol, "mag=%g W=%ld: %s error %.3g > %.3g (float32 evaluation: %.3g)", c.mag,
                      c.W, grad_names[k], dev.err_grad[k], tol, f32.err_grad[k]);
    }
}
END_TEST

/* A lookahead score that overflows float32 before it is scaled (h_overflow_lookahead: qC . u about
   -3e39 at token 64, scale 1e-3): its SiLU is 0 in the limit, so O, lse and every gradient are
   finite and within their tolerances of the fp64 references.  SiLU computed as x sigmoid(x) gave
   -inf x 0 = NaN (token 64's O and lse), and SiLU' gave NaN in 64 rows of the gradients. */
START_TEST(test_overflowing_score)
{
    const h_fwd_case c = {1, 1, 70, 1 + 7 * (size_t)_i, 0, H_BHLD, 1, 1e-3f, 31};
    h_fwd_out fo, bo;
    h_input_hook = h_overflow_lookahead;
    castle_status sf = h_run_forward(h_context(), h_queue(), &c, true, false, &fo);
    castle_status sb = h_run_backward(h_context(), h_queue(), &c, H_GRAD_EXACT, false, &bo);
    h_input_hook = NULL;
    ck_assert_msg(sf == CASTLE_SUCCESS && sb == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_msg(fo.finite && fo.guards_ok, "d=%zu: the forward's outputs are not finite", c.d);
    ck_assert_msg(fo.err_o <= FORWARD_TOL && fo.err_lse <= FORWARD_TOL, "d=%zu: forward error o %.3g, lse %.3g", c.d,
                  fo.err_o, fo.err_lse);
    ck_assert_msg(bo.finite && bo.guards_ok, "d=%zu: the gradients are not finite", c.d);
    for (int k = 0; k < 6; ++k)
        ck_assert_msg(bo.err_grad[k] <= BACKWARD_TOL, "d=%zu: %s error %.3g", c.d, grad_names[k], bo.err_grad[k]);
}
END_TEST

/* Causality in floating point: a NaN or Inf at token r of one input leaves bitwise
   unchanged every gradient row that cannot depend on it.  The gradient row q of any input sums terms
   of the rows t >= q only (docs/algorithm.md section 1: O_t depends on tokens <= t), and:
   - QC and dO at row r enter only row-r quantities (Delta_r, P, dA, dSU, dY of row r): every
     gradient row q > r is unchanged, and dQC at every row q != r (dQC_q is made of row q's terms);
   - KC, VC and QU at row r turn O_t (t >= r) non-finite, hence Delta_t and row t of dA and dSU,
     and every gradient that sums over t >= r; dQC_q for q < r is made of rows <= q only.
   (KU and VU at row r also enter the final D_j of the forward; the backward rolls D_j back by
   subtraction (docs/algorithm.md section 4), which cannot remove a non-finite value, so nothing is claimed for
   them here.)  The masked terms of every product (keys s > t, lookahead tokens j' > t, gates
   outside s < j' <= s + W, rows beyond L) must contribute exactly nothing whatever they hold.
   r = 5 and 40 sit inside a block (default block 32), 64 on a block edge, 99 in the ragged last one. */
static const size_t poison_rows[] = {5, 40, 64, 99};
#define NPOISON_ROWS ((int)(sizeof poison_rows / sizeof poison_rows[0]))

/* Rows [r0, r1) of every (batch, head) slice of the logical (B*H, L, d) gradients are bitwise equal. */
static bool same_rows(const float *a, const float *b, size_t BH, size_t L, size_t d, size_t r0, size_t r1)
{
    for (size_t bh = 0; bh < BH; ++bh)
        if (r1 > r0 && memcmp(a + (bh * L + r0) * d, b + (bh * L + r0) * d, (r1 - r0) * d * sizeof(float)))
            return false;
    return true;
}

START_TEST(test_causality)
{
    const h_fwd_case c = {2, 2, 100, 33, _i / NPOISON_ROWS ? 7 : 0, H_BHLD, 1, 0, 515};
    const size_t r = poison_rows[_i % NPOISON_ROWS], BH = c.B * c.H, L = c.L, d = c.d;
    static const int tensors[] = {CASTLE_TENSOR_QC, 6 /* dO */, CASTLE_TENSOR_KC, CASTLE_TENSOR_VC,
                                  CASTLE_TENSOR_QU};
    static const float values[] = {NAN, INFINITY, -INFINITY};
    h_fwd_out clean, out;
    ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_NONE, true, &clean) == CASTLE_SUCCESS);
    ck_assert(clean.finite);
    for (int p = 0; p < (int)(sizeof tensors / sizeof tensors[0]); ++p)
        for (int v = 0; v < 3; ++v) {
            h_poisoned = (h_poison){tensors[p], r, values[v]};
            ck_assert(h_run_backward(h_context(), h_queue(), &c, H_GRAD_NONE, true, &out) == CASTLE_SUCCESS);
            h_poisoned.tensor = -1;
            ck_assert_msg(same_rows(out.o, clean.o, BH, L, d, 0, r), "W=%ld: %g in input %d at row %zu changed an earlier "
                          "row of the forward's O", c.W, (double)values[v], tensors[p], r);
            const bool query_side = p < 2;
            for (int k = 0; k < 6; ++k) {
                const bool dqc = k == 3;
                bool ok = same_rows(out.grad[k], clean.grad[k], BH, L, d, 0, dqc ? r : 0);
                if (query_side)
                    ok = ok && same_rows(out.grad[k], clean.grad[k], BH, L, d, r + 1, L);
                ck_assert_msg(ok, "W=%ld: %g in input %d at row %zu changed %s at a row that cannot depend on it", c.W,
                              (double)values[v], tensors[p], r, grad_names[k]);
            }
            h_fwd_out_free(&out);
        }
    h_fwd_out_free(&clean);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backward");
    TCase *tc = tcase_create("shapes");
    tcase_set_timeout(tc, 900);
    CONFORMANCE_LOOP(tc, test_shapes, CONF_BACKWARD);
    suite_add_tcase(s, tc);
    tc = tcase_create("properties");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_deterministic, 0, 2);
    tcase_add_loop_test(tc, test_again, 0, 2);
    tcase_add_loop_test(tc, test_out_of_order_queue, 0, 2);
    tcase_add_test(tc, test_d_o_is_o);
    suite_add_tcase(s, tc);
    tc = tcase_create("magnitudes");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_magnitudes, 0, 8);
    tcase_add_loop_test(tc, test_overflowing_score, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("causality");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_causality, 0, 2 * NPOISON_ROWS);
    suite_add_tcase(s, tc);
    tc = tcase_create("long");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_long, 0, 2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
