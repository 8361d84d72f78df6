/* Loop budgets (host/loops.c) on the OpenCL device (CASTLE_DEVICE), under CASTLE_LOOP_LIMIT = LIMIT:
 * the limit Mesa's llvmpipe imposes (65535 loop iterations per work-item), made small enough here
 * that problems of a few blocks meet it on any device.
 *
 *   parse     a CASTLE_LOOP_LIMIT that is not a whole number fails context creation, naming it;
 *             castle_context_loop_limit gives the limit (0: none).
 *   causal    a causal backward whose key side would loop past the limit is refused with
 *             CASTLE_ERR_DEVICE_UNSUPPORTED naming castle_causal_backward_kv, and one a fifth as long
 *             runs and matches the fp64 reference.
 *   decode    a decode call of 64 tokens from an empty cache, which one work-group would take past the
 *             limit, is spread over more work-groups (seen by the launch observer) and matches the
 *             forward (itself checked against the fp64 reference); with no room in the cache's
 *             scratch to spread it, the call is refused and the cache stays empty and usable; a
 *             causal decode's keys spread over more work-groups as they grow past the limit's.
 *   fold      the folded wavefront (one work-group over every block pair) is not used under a
 *             limit, and is without one. */
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

/* Small enough that a causal backward of 40 blocks (d = 64) or a decode of 64 tokens in one
   work-group exceed it, large enough for 8 blocks and for the decode spread over 2 work-groups
   (the counts: host/loops.c). */
#define LIMIT "6000"

static size_t block_of(castle_context *ctx)
{
    castle_tuning t;
    t.struct_size = sizeof t;
    ck_assert_int_eq(castle_context_get_tuning(ctx, &t), CASTLE_SUCCESS);
    return t.block;
}

START_TEST(test_parse)
{
    static const char *const bad[] = {"12x", "-1", "x", " 5", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", bad[i], 1), 0);
        castle_context *ctx = NULL;
        const castle_status st = castle_context_create_default(NULL, &ctx);
        ck_assert_msg(st == CASTLE_ERR_INVALID_ARGUMENT && !ctx, "CASTLE_LOOP_LIMIT='%s': %s", bad[i],
                      castle_status_string(st));
        ck_assert_msg(strstr(castle_last_error(), "CASTLE_LOOP_LIMIT"), "%s", castle_last_error());
    }
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", "0", 1), 0);
    castle_context *ctx = NULL;
    ck_assert_int_eq(castle_context_create_default(NULL, &ctx), CASTLE_SUCCESS);
    ck_assert_uint_eq(castle_context_loop_limit(ctx), 0);
    castle_context_destroy(ctx);
    ck_assert_uint_eq(castle_context_loop_limit(NULL), 0);
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", LIMIT, 1), 0);
    ck_assert_int_eq(castle_context_create_default(NULL, &ctx), CASTLE_SUCCESS);
    ck_assert_uint_eq(castle_context_loop_limit(ctx), strtoul(LIMIT, NULL, 10));
    castle_context_destroy(ctx);
}
END_TEST

START_TEST(test_causal_backward)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const size_t blk = block_of(ctx);
    h_fwd_case c = {1, 1, 40 * blk, 64, 0, H_BHLD, 1, 0, 17};
    h_fwd_out out;
    castle_status st = h_run_causal_backward(ctx, h_queue(), &c, false, &out);
    ck_assert_msg(st == CASTLE_ERR_DEVICE_UNSUPPORTED, "L=%zu: %s (%s)", c.L, castle_status_string(st),
                  castle_last_error());
    ck_assert_msg(strstr(castle_last_error(), "castle_causal_backward_kv") &&
                      strstr(castle_last_error(), "castle_causal_backward:"),
                  "%s", castle_last_error());
    h_fwd_out_free(&out);
    c.L = 8 * blk;
    st = h_run_causal_backward(ctx, h_queue(), &c, false, &out);
    ck_assert_msg(st == CASTLE_SUCCESS, "L=%zu: %s", c.L, castle_last_error());
    ck_assert(out.guards_ok && out.finite);
    for (int g = 3; g < 6; ++g)
        ck_assert_msg(out.err_grad[g] <= CAUSAL_GRAD_TOL, "L=%zu gradient %d: error %.3g", c.L, g, out.err_grad[g]);
    h_fwd_out_free(&out);
}
END_TEST

START_TEST(test_decode_spread)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    /* 64 tokens from empty, one call; a capacity of 16384 leaves scratch for 4 work-groups */
    const conf_dec_case c = {1, 1, 32, 0, {0, 0}, 64, 64, 16384 - 64, H_BHLD, true, 23, true};
    const size_t cap = conf_decode_capacity(&c), d = c.d;
    float *o = calloc(cap * d, sizeof *o), *lse = calloc(cap, sizeof *lse);
    ck_assert(o && lse);
    h_launches s = {0};
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, h_observe, &s), CASTLE_SUCCESS);
    bool guards = false;
    const castle_status st = conf_run_decode(ctx, &c, o, lse, &guards, NULL);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
    ck_assert_msg(st == CASTLE_SUCCESS && guards, "%s", castle_last_error());
    /* one work-group would do: 64 rows, a group's least (host/cache.c, MIN_CHUNK) */
    ck_assert_msg(h_last_groups(&s, "castle_cache_decode_attend") >= 2, "castle_cache_decode_attend: %zu work-groups",
                  h_last_groups(&s, "castle_cache_decode_attend"));
    const h_fwd_case fc = {1, 1, c.n, d, 0, H_BHLD, 1, 0, c.seed};
    h_fwd_out fo;
    ck_assert_msg(h_run_forward(ctx, h_queue(), &fc, true, true, &fo) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_msg(fo.err_o <= FORWARD_TOL && fo.err_lse <= FORWARD_TOL, "forward: o %.3g, lse %.3g", fo.err_o,
                  fo.err_lse);
    h_check_rows(o, lse, fo.o, fo.lse, 0, c.n, d, DECODE_TOL, "decode");
    h_fwd_out_free(&fo);
    free(o);
    free(lse);
}
END_TEST

START_TEST(test_decode_refused)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const size_t n = 64, d = 32;
    castle_attention_desc desc;
    ck_assert_int_eq(castle_attention_desc_init(&desc, 1, 1, n, d), CASTLE_SUCCESS);
    castle_cache *cache = NULL;
    ck_assert_int_eq(castle_cache_create(ctx, &desc, &cache), CASTLE_SUCCESS); /* capacity n: no room to spread */
    cl_int err = CL_SUCCESS;
    cl_mem buf[8];
    for (int i = 0; i < 8; ++i) {
        buf[i] = clCreateBuffer(castle_context_cl_context(ctx), CL_MEM_READ_WRITE, n * d * sizeof(float), NULL, &err);
        ck_assert_int_eq(err, CL_SUCCESS);
        const float zero = 0.0f;
        ck_assert_int_eq(
            clEnqueueFillBuffer(h_queue(), buf[i], &zero, sizeof zero, 0, n * d * sizeof(float), 0, NULL, NULL),
            CL_SUCCESS);
    }
    castle_status st = castle_decode(ctx, cache, &desc, buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7],
                                     h_queue(), 0, NULL, NULL);
    ck_assert_msg(st == CASTLE_ERR_DEVICE_UNSUPPORTED, "%s (%s)", castle_status_string(st), castle_last_error());
    ck_assert_msg(strstr(castle_last_error(), "castle_cache_decode_attend") && strstr(castle_last_error(), "fewer"),
                  "%s", castle_last_error());
    size_t len = 99;
    ck_assert_int_eq(castle_cache_lengths(cache, &len), CASTLE_SUCCESS);
    ck_assert_uint_eq(len, 0);
    desc.seq_len = 8; /* fewer tokens per call fit */
    st = castle_decode(ctx, cache, &desc, buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7], h_queue(), 0,
                       NULL, NULL);
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_int_eq(clFinish(h_queue()), CL_SUCCESS);
    ck_assert_int_eq(castle_cache_lengths(cache, &len), CASTLE_SUCCESS);
    ck_assert_uint_eq(len, 8);
    castle_cache_destroy(cache);
    for (int i = 0; i < 8; ++i)
        clReleaseMemObject(buf[i]);
}
END_TEST

/* castle_causal_decode of one token per call after a prompt of two blocks, to 1100 keys, on a context
   under CASTLE_LOOP_LIMIT=300: past about 15 keys per partial the decode spreads the keys over more
   work-groups (more than it would: launch observer) and its outputs are the causal forward's (itself
   against the fp64 reference). */
START_TEST(test_causal_decode_spread)
{
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", "300", 1), 0);
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", LIMIT, 1), 0);
    const size_t blk = block_of(ctx), L = 1100, d = 16;
    const conf_causal_dec_case dc = {{1, 1, L, d, 0, H_BHLD, 1, 0, 41}, 2 * blk, 1, true, true};
    float *o = calloc(L * d, sizeof *o), *lse = calloc(L, sizeof *lse);
    ck_assert(o && lse);
    h_launches s = {0};
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, h_observe, &s), CASTLE_SUCCESS);
    bool guards = false;
    const castle_status st = conf_run_causal_decode(ctx, castle_context_queue(ctx), &dc, 0, o, lse, &guards);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
    ck_assert_msg(st == CASTLE_SUCCESS && guards, "%s", castle_last_error());
    /* the last token's 1100 keys: 1100 / 15 partials at least (one per work-item or work-group) */
    const size_t g = h_last_groups(&s, "castle_causal_decode");
    ck_assert_msg(g >= 2, "castle_causal_decode: %zu work-groups", g);
    h_fwd_out fo;
    ck_assert_msg(h_run_causal_forward(h_context(), h_queue(), &dc.c, true, &fo) == CASTLE_SUCCESS, "%s",
                  castle_last_error());
    ck_assert_msg(fo.err_o <= CAUSAL_TOL && fo.err_lse <= CAUSAL_TOL, "forward: o %.3g, lse %.3g", fo.err_o,
                  fo.err_lse);
    h_check_rows(o, lse, fo.o, fo.lse, dc.P, L, d, DECODE_TOL, "causal decode");
    h_fwd_out_free(&fo);
    free(o);
    free(lse);
    castle_context_destroy(ctx);
}
END_TEST

/* The forward of a case the wavefront folds (N <= the tuning's fold, B H >= 2 compute units) on a
   context made under CASTLE_LOOP_LIMIT=limit: which kernel it launched. */
static bool folded_under(const char *limit)
{
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", limit, 1), 0);
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", LIMIT, 1), 0);
    cl_uint cu = 0;
    ck_assert_int_eq(clGetDeviceInfo(castle_context_device(ctx), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL),
                     CL_SUCCESS);
    castle_tuning t;
    t.struct_size = sizeof t;
    ck_assert_int_eq(castle_context_get_tuning(ctx, &t), CASTLE_SUCCESS);
    ck_assert_msg(t.fold >= 2, "the tuning folds no wavefront (fold = %u)", t.fold);
    const h_fwd_case c = {1, 2 * (size_t)cu, 2 * t.block, 16, 0, H_BHLD, 1, 0, 5};
    h_launches s = {0};
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, h_observe, &s), CASTLE_SUCCESS);
    h_fwd_out out;
    ck_assert_msg(h_run_forward(ctx, castle_context_queue(ctx), &c, true, false, &out) == CASTLE_SUCCESS, "%s",
                  castle_last_error());
    ck_assert_msg(out.err_o <= FORWARD_TOL, "error %.3g", out.err_o);
    h_fwd_out_free(&out);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
    castle_context_destroy(ctx);
    const bool fold = h_last_groups(&s, "castle_forward_fold") > 0,
               block = h_last_groups(&s, "castle_forward_block") > 0;
    ck_assert_msg(fold != block, "fold %d, block %d", fold, block);
    return fold;
}

START_TEST(test_no_fold) { ck_assert_msg(!folded_under(LIMIT), "folded under a loop limit"); }
END_TEST

START_TEST(test_fold_without_limit) { ck_assert_msg(folded_under("0"), "not folded without a loop limit"); }
END_TEST

int main(void)
{
    if (setenv("CASTLE_LOOP_LIMIT", LIMIT, 1)) { /* before h_context() makes the suite's context */
        perror("setenv");
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("loops");
    TCase *tc = tcase_create("loops");
    tcase_set_timeout(tc, 900); /* cold: the causal, cache and forward kernels compile */
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_causal_backward);
    tcase_add_test(tc, test_decode_spread);
    tcase_add_test(tc, test_decode_refused);
    tcase_add_test(tc, test_causal_decode_spread);
    tcase_add_test(tc, test_no_fold);
    tcase_add_test(tc, test_fold_without_limit);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
