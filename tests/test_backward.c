/* castle_backward on the OpenCL device against the fp64 reference gradients. */
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const grad_names[6] = {"dqu", "dku", "dvu", "dqc", "dkc", "dvc"};

/* The forward's shape table, less the L = 1000 rows (the O(L^3) reference is too slow there;
   test_long covers long sequences with the O(L^2 d) reference). */
static const h_fwd_case shapes[] = {
    /* B  H  L     d    W    layout     mag  scale seed */
    {2, 3, 1, 1, 0, H_BHLD, 1, 0, 1},
    {2, 2, 1, 64, 1, H_BLHD, 1, 0, 2},
    {2, 3, 2, 8, 0, H_BHLD, 1, 0, 3},
    {3, 2, 2, 33, 1, H_PADDED, 1, 0, 4},
    {2, 2, 7, 16, 3, H_BLHD, 1, 0, 5},
    {2, 3, 7, 1, 0, H_BHLD, 1, 0, 6},
    {1, 2, 7, 256, 100, H_BHLD, 1, 0, 7},
    {2, 2, 63, 64, 0, H_BHLD, 1, 0, 8},
    {2, 2, 63, 33, 32, H_BLHD, 1, 0, 9},
    {2, 3, 63, 8, 3, H_PADDED, 1, 0, 10},
    {2, 2, 64, 16, 0, H_BLHD, 1, 0, 11},
    {2, 2, 64, 128, 1, H_BHLD, 1, 0, 12},
    {2, 1, 64, 64, 32, H_BHLD, 1, 0, 13},
    {2, 2, 65, 64, 0, H_BHLD, 1, 0, 14},
    {2, 2, 65, 1, 3, H_BLHD, 1, 0, 15},
    {1, 2, 65, 256, 65, H_PADDED, 1, 0, 16},
    {2, 2, 130, 33, 0, H_BLHD, 1, 0, 17},
    {2, 2, 130, 64, 100, H_BHLD, 1, 0, 18},
    {1, 3, 130, 8, 1, H_BHLD, 1, 0, 19},
    {2, 2, 130, 128, 32, H_PADDED, 1, 0, 20},
    {1, 2, 257, 64, 0, H_BHLD, 1, 0, 21},
    {2, 2, 257, 16, 3, H_BLHD, 1, 0, 22},
    {1, 1, 257, 256, 100, H_BHLD, 1, 0, 23},
    {2, 1, 257, 1, 32, H_BHLD, 1, 0, 24},
    {1, 2, 257, 33, 1000, H_BLHD, 1, 0, 25},
    {2, 2, 100, 64, 0, H_BHLD, 1, 0.3f, 32}, /* explicit scale */
    {1, 2, 70, 32, 0, H_BHLD, 10, 0, 33},    /* large magnitude */
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void check_case(const h_fwd_case *c, h_grad_ref ref, double tol)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    h_fwd_out out;
    castle_status st = h_run_backward(ctx, h_queue(), c, ref, false, &out);
    ck_assert_msg(st == CASTLE_SUCCESS, "backward failed: %s", castle_last_error());
    double worst = 0;
    int wi = 0;
    for (int k = 0; k < 6; ++k)
        if (!(out.err_grad[k] <= worst)) {
            worst = out.err_grad[k];
            wi = k;
        }
    if (getenv("CASTLE_TEST_VERBOSE"))
        fprintf(stderr, "B=%zu H=%zu L=%zu d=%zu W=%ld layout=%d mag=%g: worst %s %.3g (o %.3g)\n", c->B, c->H, c->L,
                c->d, c->W, (int)c->layout, c->mag, grad_names[wi], worst, out.err_o);
    ck_assert_msg(out.guards_ok, "a guard region or an input changed (L=%zu d=%zu W=%ld layout=%d)", c->L, c->d, c->W,
                  (int)c->layout);
    ck_assert_msg(out.finite, "non-finite gradient (L=%zu d=%zu W=%ld)", c->L, c->d, c->W);
    ck_assert_msg(worst <= tol, "L=%zu d=%zu W=%ld layout=%d mag=%g: %s error %.3g > tol %.3g", c->L, c->d, c->W,
                  (int)c->layout, c->mag, grad_names[wi], worst, tol);
}

START_TEST(test_shapes)
{
    const h_fwd_case *c = &shapes[_i];
    check_case(c, H_GRAD_EXACT, c->mag > 1 ? BACKWARD_LARGE_TOL : BACKWARD_TOL);
}
END_TEST

/* Two runs give bitwise identical gradients (no atomics), and the backward leaves the forward's
   workspace state intact (the harness runs forward + backward; running the backward again on the
   same workspace is what test_repeat_backward in the API suite... here: two full runs). */
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

int main(void)
{
    Suite *s = suite_create("backward");
    TCase *tc = tcase_create("shapes");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_shapes, 0, NSHAPES);
    suite_add_tcase(s, tc);
    tc = tcase_create("properties");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_deterministic, 0, 2);
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
