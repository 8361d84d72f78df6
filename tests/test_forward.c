/* castle_forward on the OpenCL device (CASTLE_DEVICE) against the fp64 recurrent reference. */
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every L of the table meets several d, windows and both layouts; B, H > 1 throughout.
   The block size is 32 unless CASTLE_TUNING says otherwise: windows 32 and the lengths 63/64/65
   sit on either side of a block edge. */
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
    {2, 2, 257, 64, 0, H_BHLD, 1, 0, 21},
    {2, 2, 257, 16, 3, H_BLHD, 1, 0, 22},
    {1, 2, 257, 256, 100, H_BHLD, 1, 0, 23},
    {2, 1, 257, 1, 32, H_BHLD, 1, 0, 24},
    {2, 2, 257, 33, 1000, H_BLHD, 1, 0, 25},
    {1, 2, 1000, 64, 0, H_BHLD, 1, 0, 26},
    {1, 2, 1000, 128, 100, H_BLHD, 1, 0, 27},
    {2, 1, 1000, 16, 32, H_BHLD, 1, 0, 28},
    {1, 2, 1000, 8, 1, H_BLHD, 1, 0, 29},
    {1, 1, 1000, 256, 0, H_BHLD, 1, 0, 30},
    {1, 2, 1000, 33, 3, H_PADDED, 1, 0, 31},
    {2, 2, 100, 64, 0, H_BHLD, 1, 0.3f, 32}, /* explicit scale */
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void check_case(const h_fwd_case *c, double tol)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    h_fwd_out out;
    castle_status st = h_run_forward(ctx, h_queue(), c, true, false, &out);
    ck_assert_msg(st == CASTLE_SUCCESS, "forward failed: %s", castle_last_error());
    if (getenv("CASTLE_TEST_VERBOSE"))
        fprintf(stderr, "B=%zu H=%zu L=%zu d=%zu W=%ld layout=%d mag=%g: err_o=%.3g err_lse=%.3g\n", c->B, c->H,
                c->L, c->d, c->W, (int)c->layout, c->mag, out.err_o, out.err_lse);
    ck_assert_msg(out.guards_ok, "a guard region or an input changed (L=%zu d=%zu W=%ld layout=%d)", c->L, c->d, c->W,
                  (int)c->layout);
    ck_assert_msg(out.finite, "non-finite output (L=%zu d=%zu W=%ld)", c->L, c->d, c->W);
    ck_assert_msg(out.err_o <= tol && out.err_lse <= tol,
                  "L=%zu d=%zu W=%ld layout=%d mag=%g: err_o=%.3g err_lse=%.3g > tol %.3g", c->L, c->d, c->W,
                  (int)c->layout, c->mag, out.err_o, out.err_lse, tol);
}

START_TEST(test_shapes) { check_case(&shapes[_i], FORWARD_TOL); }
END_TEST

/* Entries of size 10 and more: scores in the thousands, saturated gates; outputs stay finite. */
START_TEST(test_large_magnitude)
{
    static const h_fwd_case big[] = {
        {2, 2, 65, 64, 0, H_BHLD, 10, 0, 101},
        {1, 2, 130, 33, 3, H_BLHD, 10, 0, 102},
        {1, 1, 257, 128, 0, H_BHLD, 20, 0, 103},
    };
    check_case(&big[_i], LARGE_TOL);
}
END_TEST

static void run_keep(const h_fwd_case *c, h_fwd_out *out)
{
    castle_status st = h_run_forward(h_context(), h_queue(), c, false, true, out);
    ck_assert_msg(st == CASTLE_SUCCESS, "forward failed: %s", castle_last_error());
    ck_assert(out->guards_ok);
}

/* The first P outputs of a length-L run equal a length-P run: nothing leaks from the future.
   The harness draws inputs by position, so both runs see the same first P rows.  Equality is
   exact: the prefix rows meet the same blocks in the same order, the extra keys only add exact 0s. */
START_TEST(test_causality)
{
    static const size_t P[] = {1, 31, 32, 33, 100, 256};
    h_fwd_case c = {2, 2, 257, 16, _i ? 5 : 0, H_BHLD, 1, 0, 7};
    h_fwd_out full;
    run_keep(&c, &full);
    for (size_t p = 0; p < sizeof P / sizeof P[0]; ++p) {
        h_fwd_case cp = c;
        cp.L = P[p];
        h_fwd_out part;
        run_keep(&cp, &part);
        for (size_t bh = 0; bh < c.B * c.H; ++bh) {
            ck_assert_msg(!memcmp(part.o + bh * cp.L * c.d, full.o + bh * c.L * c.d, cp.L * c.d * sizeof(float)),
                          "O of the length-%zu run differs from the first rows of the length-%zu run", cp.L, c.L);
            ck_assert_msg(!memcmp(part.lse + bh * cp.L, full.lse + bh * c.L, cp.L * sizeof(float)),
                          "lse of the length-%zu run differs from the length-%zu run", cp.L, c.L);
        }
        h_fwd_out_free(&part);
    }
    h_fwd_out_free(&full);
}
END_TEST

/* Runs are bitwise reproducible, and a window reaching past the sequence is plain CASTLE. */
START_TEST(test_repeat_and_wide_window)
{
    h_fwd_case c = {2, 2, 130, 33, 0, H_BLHD, 1, 0, 11};
    h_fwd_out a, b, w;
    run_keep(&c, &a);
    run_keep(&c, &b);
    c.W = 130;
    run_keep(&c, &w);
    const size_t n = c.B * c.H * c.L * c.d;
    ck_assert_msg(!memcmp(a.o, b.o, n * sizeof(float)), "two identical runs differ");
    ck_assert_msg(!memcmp(a.o, w.o, n * sizeof(float)), "window >= L differs from window 0");
    c.W = 129; /* = L - 1: also reaches every later key */
    h_fwd_out_free(&w);
    run_keep(&c, &w);
    ck_assert_msg(!memcmp(a.o, w.o, n * sizeof(float)), "window L-1 differs from window 0");
    c.W = 128; /* one short: must differ */
    h_fwd_out_free(&w);
    run_keep(&c, &w);
    ck_assert_msg(memcmp(a.o, w.o, n * sizeof(float)), "window L-2 gives the same output as window 0");
    h_fwd_out_free(&a);
    h_fwd_out_free(&b);
    h_fwd_out_free(&w);
}
END_TEST

Suite *forward_suite(void)
{
    Suite *s = suite_create("forward");
    TCase *tc = tcase_create("shapes");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_shapes, 0, NSHAPES);
    suite_add_tcase(s, tc);
    tc = tcase_create("large");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_large_magnitude, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("properties");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_causality, 0, 2);
    tcase_add_test(tc, test_repeat_and_wide_window);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(forward_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
