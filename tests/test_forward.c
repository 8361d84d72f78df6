/* castle_forward on the OpenCL device (CASTLE_DEVICE) against the fp64 recurrent reference: the
 * conformance table's forward cases, then properties (causality, reproducibility, windows), other
 * tunings and the folded schedule. */
#include "conformance_check.h"
#include "harness.h"
#include "tolerance.h"
#include "variant_tunings.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>



/* The conformance table's forward cases (conformance/table.c: the shapes, then large magnitudes). */
START_TEST(test_shapes) { conformance_check(CONF_FORWARD, _i); }
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

/* Other tunings pass the same conformance checks: variant_tunings (tests/variant_tunings.h says
   which and why), each a kernel variant the tuner may pick. */
START_TEST(test_tunings)
{
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    const castle_tuning *t = &variant_tunings[_i];
    char ts[256];
    ck_assert(castle_tuning_string(t, ts, sizeof ts) == CASTLE_SUCCESS);
    castle_status st = castle_context_set_tuning(ctx, t);
    if (st == CASTLE_ERR_BAD_TUNING) { /* a device too small for this entry: said, not hidden */
        fprintf(stderr, "tuning %s does not fit this device: %s\n", ts, castle_last_error());
        castle_context_destroy(ctx);
        return;
    }
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    /* d = 100: the backward phases that stage more than dchunk columns per step (cl/backward.cl,
       BW_WA, BW_WB, BW_WD2) take several steps there, the last one ragged (under the GPU entry 64 + 36
       columns, 3 x 32 + 4, 96 + 4) */
    static const h_fwd_case cases[] = {
        {2, 2, 70, 33, 0, H_BLHD, 1, 0, 91},
        {1, 2, 130, 64, 5, H_PADDED, 1, 0, 92},
        {2, 1, 9, 16, 1, H_BHLD, 1, 0, 93},
        {1, 1, 70, 100, 3, H_BHLD, 1, 0, 94},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
        h_fwd_out out;
        st = h_run_backward(ctx, castle_context_queue(ctx), &cases[k], H_GRAD_EXACT, false, &out);
        ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
        double g = 0;
        for (int q = 0; q < 6; ++q)
            g = fmax(g, out.err_grad[q]);
        ck_assert_msg(out.guards_ok && out.finite, "tuning %s: guards or finiteness", ts);
        ck_assert_msg(out.err_o <= FORWARD_TOL && out.err_lse <= FORWARD_TOL && g <= BACKWARD_TOL,
                      "tuning %s, L=%zu: err_o %.3g err_lse %.3g grad %.3g", ts, cases[k].L, out.err_o, out.err_lse, g);
    }
    castle_context_destroy(ctx);
}
END_TEST

/* A NaN or an Inf at row r of any input leaves every output row before r bitwise unchanged, under
   the CPU and the GPU mapping, for CASTLE and CASTLE-SWL: masked terms are dropped by select, never
   multiplied by a zero (0 x NaN = NaN), and products over a causal triangle stop at the diagonal.
   Rows 5 (inside the first block, so inside the diagonal products) and 40 (a later block).  Case 0
   runs under the device's own entry; case i > 0 under variant_tunings[i - 1] (the CPU mapping's vector
   widths, scalar 1 x 1, 2 x 2 and 4 x 4 tiles, the GPU entry: the programs test_tunings builds, so
   no other kernels are compiled).  A tuning that needs more local memory than the device has is
   reported and left out, as in test_tunings; some of each kind fit 32 KiB (rusticl) and 48 KiB
   (NVIDIA). */
START_TEST(test_nonfinite_row)
{
    castle_context *ctx = NULL;
    ck_assert(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS);
    castle_status st0 = _i ? castle_context_set_tuning(ctx, &variant_tunings[_i - 1]) : CASTLE_SUCCESS;
    if (st0 == CASTLE_ERR_BAD_TUNING && strstr(castle_last_error(), "local memory")) { /* said, not hidden */
        fprintf(stderr, "nonfinite: tuning %d does not fit this device: %s\n", _i - 1, castle_last_error());
        castle_context_destroy(ctx);
        return;
    }
    ck_assert_msg(st0 == CASTLE_SUCCESS, "%s", castle_last_error());
    static const size_t rows[] = {5, 40};
    for (long W = 0; W <= 7; W += 7) {
        const h_fwd_case c = {1, 2, 100, 24, W, H_BHLD, 1, 0, 77};
        h_fwd_out clean;
        ck_assert(h_run_forward(ctx, castle_context_queue(ctx), &c, false, true, &clean) == CASTLE_SUCCESS);
        for (int t = 0; t < 6; ++t)
            for (size_t k = 0; k < 2; ++k) {
                h_poisoned = (h_poison){t, rows[k], k ? INFINITY : NAN};
                h_fwd_out bad;
                castle_status st = h_run_forward(ctx, castle_context_queue(ctx), &c, false, true, &bad);
                h_poisoned.tensor = -1;
                ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
                for (size_t bh = 0; bh < c.B * c.H; ++bh) {
                    const size_t r = rows[k];
                    ck_assert_msg(!memcmp(bad.o + bh * c.L * c.d, clean.o + bh * c.L * c.d, r * c.d * sizeof(float)),
                                  "W=%ld: %s at row %zu of input %d changed O of an earlier row", W, k ? "Inf" : "NaN",
                                  r, t);
                    ck_assert_msg(!memcmp(bad.lse + bh * c.L, clean.lse + bh * c.L, r * sizeof(float)),
                                  "W=%ld: %s at row %zu of input %d changed lse of an earlier row", W,
                                  k ? "Inf" : "NaN", r, t);
                }
                h_fwd_out_free(&bad);
            }
        h_fwd_out_free(&clean);
    }
    castle_context_destroy(ctx);
}
END_TEST

/* The folded wavefront (one launch, one work-group per batch entry and head) and the per-diagonal
   launches give bitwise the same forward and backward: only the scheduling differs. */
START_TEST(test_fold_equals_wavefront)
{
    h_fwd_case c = {4, 2, 100, 24, _i ? 9 : 0, H_BLHD, 1, 0, 123};
    h_fwd_out out[2];
    for (int f = 0; f < 2; ++f) {
        castle_context *ctx = NULL;
        ck_assert(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS);
        castle_tuning t;
        castle_context_get_tuning(ctx, &t);
        t.fold = f ? 1024 : 0;
        ck_assert_msg(castle_context_set_tuning(ctx, &t) == CASTLE_SUCCESS, "%s", castle_last_error());
        ck_assert(h_run_backward(ctx, castle_context_queue(ctx), &c, H_GRAD_NONE, true, &out[f]) == CASTLE_SUCCESS);
        ck_assert(out[f].guards_ok && out[f].finite);
        castle_context_destroy(ctx);
    }
    const size_t n = c.B * c.H * c.L * c.d;
    ck_assert_msg(!memcmp(out[0].o, out[1].o, n * sizeof(float)), "folded O differs from the wavefront's");
    ck_assert_msg(!memcmp(out[0].lse, out[1].lse, n / c.d * sizeof(float)), "folded lse differs");
    for (int k = 0; k < 6; ++k)
        ck_assert_msg(!memcmp(out[0].grad[k], out[1].grad[k], n * sizeof(float)), "folded gradient %d differs", k);
    h_fwd_out_free(&out[0]);
    h_fwd_out_free(&out[1]);
}
END_TEST

/* Every sum of a product is one chain, its terms in ascending order, whatever the chunk of d a call
   takes and whichever work-item and micro-tile computes it (cl/common.cl, mt_product).  So tunings
   that differ only in their chunks of d (dchunk, fdchunk), their micro-tiles' rows (tm, btm) or their
   work-group sizes give bitwise the same output, lse and gradients, and the backward's recomputed
   gate logits and scores are bitwise the forward's (a pass that summed chunk by chunk, as the
   products once did with their even and odd terms apart, gives other roundings; so did two-row tiles
   in the triangular products).  The vector width stays: a device's vector exp may round otherwise than
   its scalar one.  Block 16, so that all fit 32 KiB of local memory; d = 33 and 64, CASTLE and
   CASTLE-SWL. */
START_TEST(test_sums_ignore_chunks)
{
    const castle_tuning *set = sum_tunings;
    const h_fwd_case c = {1, 2, 70, _i ? 64 : 33, _i ? 5 : 0, H_BHLD, 1, 0, 131};
    h_fwd_out out[3];
    for (int t = 0; t < 3; ++t) {
        castle_context *ctx = NULL;
        ck_assert(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS);
        ck_assert_msg(castle_context_set_tuning(ctx, &set[t]) == CASTLE_SUCCESS, "%s", castle_last_error());
        ck_assert_msg(h_run_backward(ctx, castle_context_queue(ctx), &c, H_GRAD_NONE, true, &out[t]) == CASTLE_SUCCESS,
                      "%s", castle_last_error());
        ck_assert(out[t].guards_ok && out[t].finite);
        castle_context_destroy(ctx);
    }
    const size_t n = c.B * c.H * c.L * c.d;
    for (int t = 1; t < 3; ++t) {
        ck_assert_msg(!memcmp(out[0].o, out[t].o, n * sizeof(float)), "d = %zu: O of tuning %d differs", c.d, t);
        ck_assert_msg(!memcmp(out[0].lse, out[t].lse, n / c.d * sizeof(float)), "d = %zu: lse of tuning %d differs",
                      c.d, t);
        for (int k = 0; k < 6; ++k)
            ck_assert_msg(!memcmp(out[0].grad[k], out[t].grad[k], n * sizeof(float)),
                          "d = %zu: gradient %d of tuning %d differs from tuning 0's", c.d, k, t);
    }
    for (int t = 0; t < 3; ++t)
        h_fwd_out_free(&out[t]);
}
END_TEST

Suite *forward_suite(void)
{
    Suite *s = suite_create("forward");
    TCase *tc = tcase_create("shapes");
    tcase_set_timeout(tc, 600);
    CONFORMANCE_LOOP(tc, test_shapes, CONF_FORWARD);
    suite_add_tcase(s, tc);
    tc = tcase_create("properties");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_causality, 0, 2);
    tcase_add_test(tc, test_repeat_and_wide_window);
    tcase_add_loop_test(tc, test_nonfinite_row, 0, 1); /* under the device's entry */
    suite_add_tcase(s, tc);
    tc = tcase_create("tunings");
    tcase_set_tags(tc, "variants"); /* tests/CMakeLists.txt: castle_variants */
    /* each tuning builds its forward and backward programs cold: a CPU-shaped 2 x 2 tuning with
       prefetch (no longer in the list) took over 300 s in PoCL on a 2-core machine; beside other
       suites (ctest -j) twice that */
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, test_tunings, 0, VARIANT_TUNINGS);
    tcase_add_loop_test(tc, test_fold_equals_wavefront, 0, 2);
    tcase_add_loop_test(tc, test_sums_ignore_chunks, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("nonfinite");
    tcase_set_tags(tc, "variants"); /* tests/CMakeLists.txt: castle_variants */
    tcase_set_timeout(tc, 900); /* the programs of test_tunings, cold when run alone */
    tcase_add_loop_test(tc, test_nonfinite_row, 1, 1 + VARIANT_TUNINGS);
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
