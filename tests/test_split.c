/* Dimension 1 of a launch (batch entries x heads) cut into several launches (host/launch.c), on the
 * OpenCL device (CASTLE_DEVICE), under CASTLE_MAX_GROUPS_Y = 3: NVIDIA's OpenCL launches on CUDA
 * grids, which hold at most 65535 blocks in y, so 65536 batch entries x heads or more go out in
 * pieces; three here, so that 8 do.
 *
 *   env       CASTLE_MAX_GROUPS_Y of 0 or not a whole number fails context creation, naming it.
 *   pieces    a forward of 8 batch entries x heads launches each kernel three times (3 + 3 + 2).
 *   results   the forward (CASTLE and CASTLE-SWL), the backward, the causal baseline's forward and
 *             backward, and prefill + decode of 8 batch entries x heads, each kernel in pieces, match
 *             the fp64 references (the decode: the forward, itself checked against them). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* setenv */
#endif
#include "conformance_check.h"
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIECE "3"

START_TEST(test_env)
{
    static const char *const bad[] = {"0", "x", "-3", "3 "};
    h_check_bad_env("CASTLE_MAX_GROUPS_Y", bad, sizeof bad / sizeof bad[0]);
    ck_assert_int_eq(setenv("CASTLE_MAX_GROUPS_Y", PIECE, 1), 0);
}
END_TEST

START_TEST(test_pieces)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const h_fwd_case c = {2, 4, 40, 16, 0, H_BHLD, 1, 0, 3};
    h_launches s = {0};
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, h_observe, &s), CASTLE_SUCCESS);
    h_fwd_out out;
    const castle_status st = h_run_forward(ctx, h_queue(), &c, true, false, &out);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_msg(out.err_o <= FORWARD_TOL && out.err_lse <= FORWARD_TOL, "o %.3g, lse %.3g", out.err_o, out.err_lse);
    h_fwd_out_free(&out);
    ck_assert(s.n >= 2);
    for (int i = 0; i < s.n; ++i) /* each kernel's launches come in threes, all 8 x its groups per launch */
        ck_assert_msg(s.launches[i] % 3 == 0 && s.groups[i] % 8 == 0, "%s: %d launches, %zu work-groups", s.name[i],
                      s.launches[i], s.groups[i]);
}
END_TEST

START_TEST(test_forward_backward)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    static const h_fwd_case cases[] = {
        {2, 4, 70, 8, 0, H_BHLD, 1, 0, 11}, {2, 4, 70, 8, 5, H_BLHD, 1, 0, 12}, {1, 7, 33, 32, 0, H_PADDED, 1, 0, 13}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        h_fwd_out out;
        ck_assert_msg(h_run_backward(ctx, h_queue(), &cases[i], H_GRAD_EXACT, false, &out) == CASTLE_SUCCESS,
                      "case %zu: %s", i, castle_last_error());
        ck_assert_msg(out.guards_ok && out.finite, "case %zu: guards or non-finite", i);
        ck_assert_msg(out.err_o <= FORWARD_TOL && out.err_lse <= FORWARD_TOL, "case %zu: o %.3g, lse %.3g", i,
                      out.err_o, out.err_lse);
        for (int g = 0; g < 6; ++g)
            ck_assert_msg(out.err_grad[g] <= BACKWARD_TOL, "case %zu gradient %d: %.3g", i, g, out.err_grad[g]);
        h_fwd_out_free(&out);
    }
}
END_TEST

START_TEST(test_causal)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const h_fwd_case c = {2, 4, 90, 16, 0, H_BHLD, 1, 0, 21};
    h_fwd_out out;
    ck_assert_msg(h_run_causal_backward(ctx, h_queue(), &c, false, &out) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert(out.guards_ok && out.finite);
    ck_assert_msg(out.err_o <= CAUSAL_TOL && out.err_lse <= CAUSAL_TOL, "o %.3g, lse %.3g", out.err_o, out.err_lse);
    for (int g = 3; g < 6; ++g)
        ck_assert_msg(out.err_grad[g] <= CAUSAL_GRAD_TOL, "gradient %d: %.3g", g, out.err_grad[g]);
    h_fwd_out_free(&out);
}
END_TEST

START_TEST(test_decode)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    /* prompts of 20 and 13 tokens, then 3 tokens per call: the ragged prefill's U pass and both
       decode kernels in pieces */
    const conf_dec_case c = {2, 4, 16, 0, {20, 13}, 12, 3, 0, H_BHLD, true, 31, true};
    const size_t cap = conf_decode_capacity(&c), d = c.d, BH = c.B * c.H;
    float *o = calloc(BH * cap * d, sizeof *o), *lse = calloc(BH * cap, sizeof *lse);
    ck_assert(o && lse);
    bool guards = false;
    ck_assert_msg(conf_run_decode(ctx, &c, o, lse, &guards, NULL) == CASTLE_SUCCESS && guards, "%s",
                  castle_last_error());
    const h_fwd_case fc = {c.B, c.H, cap, d, 0, H_BHLD, 1, 0, c.seed};
    h_fwd_out fo;
    ck_assert_msg(h_run_forward(ctx, h_queue(), &fc, true, true, &fo) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_msg(fo.err_o <= FORWARD_TOL && fo.err_lse <= FORWARD_TOL, "forward: o %.3g, lse %.3g", fo.err_o,
                  fo.err_lse);
    for (size_t b = 0; b < c.B; ++b)
        for (size_t h = 0; h < c.H; ++h) { /* sequence (b, h): rows from (b H + h) cap on */
            const size_t r0 = (b * c.H + h) * cap;
            char what[64];
            snprintf(what, sizeof what, "b %zu h %zu", b, h);
            h_check_rows(o + r0 * d, lse + r0, fo.o + r0 * d, fo.lse + r0, 0, c.P[b] + c.n, d, DECODE_TOL, what);
        }
    h_fwd_out_free(&fo);
    free(o);
    free(lse);
}
END_TEST

int main(void)
{
    if (setenv("CASTLE_MAX_GROUPS_Y", PIECE, 1)) { /* before h_context() makes the suite's context */
        perror("setenv");
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("split");
    TCase *tc = tcase_create("split");
    tcase_set_timeout(tc, 900); /* cold: every family compiles */
    tcase_add_test(tc, test_env);
    tcase_add_test(tc, test_pieces);
    tcase_add_test(tc, test_forward_backward);
    tcase_add_test(tc, test_causal);
    tcase_add_test(tc, test_decode);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
