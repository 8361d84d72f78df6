/* Loop budgets (host/loops.c) on the OpenCL device (CASTLE_DEVICE), under CASTLE_LOOP_LIMIT = LIMIT:
 * the limit Mesa's llvmpipe imposes (65535 loop iterations per work-item), made small enough here
 * that problems of a few blocks meet it on any device.
 *
 *   parse     a CASTLE_LOOP_LIMIT that is not a whole number fails context creation, naming it;
 *             castle_context_loop_limit gives the limit (0: none).
 *   causal    a causal backward whose two sides would loop past the limit runs in launches over
 *             ranges of their loops (counted by the launch observer) and matches the fp64 reference;
 *             under a limit not even one block fits, it is refused with CASTLE_ERR_DEVICE_UNSUPPORTED
 *             naming castle_causal_backward_kv, and nothing is launched.
 *   decode    a decode call of 64 tokens from an empty cache, which one work-group would take past the
 *             limit, is spread over more work-groups (seen by the launch observer) and matches the
 *             forward (itself checked against the fp64 reference), also with no room in the cache's
 *             scratch to spread it (a temporary holds the partials); a call of 100 tokens, whose
 *             tokens alone loop past the limit, is refused and the cache stays empty and usable; a
 *             causal decode's keys spread over more work-groups as they grow past the limit's, and
 *             its prompt's forward splits its keys.
 *   split     a causal forward, the causal backward and the ragged prefill's U pass loop over key
 *             or query ranges in more work-groups or launches, and match the fp64 references.
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
    h_check_bad_env("CASTLE_LOOP_LIMIT", bad, sizeof bad / sizeof bad[0]);
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

/* A context made under CASTLE_LOOP_LIMIT=limit (the suite's LIMIT is restored for the contexts made
   after it), its launches observed into s unless s is NULL. */
static castle_context *context_under(const char *limit, h_launches *s)
{
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", limit, 1), 0);
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_int_eq(setenv("CASTLE_LOOP_LIMIT", LIMIT, 1), 0);
    if (s)
        ck_assert_int_eq(castle_context_set_launch_observer(ctx, h_observe, s), CASTLE_SUCCESS);
    return ctx;
}

/* The message of causal_backward_under's call (castle_last_error), which destroying its context
   replaces. */
static char under_message[1024];

/* castle_causal_backward on a context made under CASTLE_LOOP_LIMIT=limit, observed: the case c, on
   the context's queue or, with ooo, an out-of-order one (*ran false where the device has none). */
static castle_status causal_backward_under(const char *limit, const h_fwd_case *c, bool ooo, h_launches *s,
                                           h_fwd_out *out, bool *ran)
{
    castle_context *ctx = context_under(limit, s);
    cl_command_queue q = ooo ? h_out_of_order_queue(ctx, "test_loops' causal backward on an out-of-order queue")
                             : castle_context_queue(ctx);
    castle_status st = CASTLE_SUCCESS;
    *ran = q != NULL;
    if (q) {
        st = h_run_causal_backward(ctx, q, c, false, out);
        snprintf(under_message, sizeof under_message, "%s", castle_last_error());
    }
    if (ooo && q)
        clReleaseCommandQueue(q);
    castle_context_destroy(ctx);
    return st;
}

/* Under a limit of 2000 a work-item of the key side loops over 4 query blocks at d = 64, of the query
   side over 12 key blocks (host/loops.c): a causal backward of 40 blocks (the last ragged) runs in
   10 and 4 launches, each adding to the last's sums, and matches the fp64 reference, on the
   context's queue and on an out-of-order one (each launch then waits on the last's event); under
   900 not even one block fits, and the call is refused. */
START_TEST(test_causal_backward)
{
    const size_t blk = block_of(h_context());
    h_fwd_case c = {1, 2, 40 * blk - 5, 64, 0, H_BHLD, 1, 0, 17};
    h_launches s;
    h_fwd_out out;
    castle_status st;
    for (int ooo = 0; ooo < 2; ++ooo) {
        memset(&s, 0, sizeof s);
        bool ran = false;
        st = causal_backward_under("2000", &c, ooo, &s, &out, &ran);
        if (!ran)
            continue;
        ck_assert_msg(st == CASTLE_SUCCESS, "L=%zu%s: %s: %s", c.L, ooo ? " out of order" : "",
                      castle_status_string(st), under_message);
        ck_assert_int_eq(h_count_launches(&s, "castle_causal_backward_kv"), 10);
        ck_assert_int_eq(h_count_launches(&s, "castle_causal_backward_q"), 4);
        ck_assert(out.guards_ok && out.finite);
        for (int g = 3; g < 6; ++g)
            ck_assert_msg(out.err_grad[g] <= CAUSAL_GRAD_TOL, "L=%zu%s gradient %d: error %.3g", c.L,
                          ooo ? " out of order" : "", g, out.err_grad[g]);
        h_fwd_out_free(&out);
    }

    memset(&s, 0, sizeof s);
    bool ran = false;
    st = causal_backward_under("900", &c, false, &s, &out, &ran);
    ck_assert_msg(st == CASTLE_ERR_DEVICE_UNSUPPORTED, "L=%zu: %s (%s)", c.L, castle_status_string(st), under_message);
    ck_assert_msg(strstr(under_message, "castle_causal_backward_kv") &&
                      strstr(under_message, "castle_causal_backward:") && strstr(under_message, "not even one block"),
                  "%s", under_message);
    ck_assert_int_eq(h_count_launches(&s, "castle_causal_backward_kv"), 0); /* nothing launched (the forward */
    ck_assert_int_eq(h_count_launches(&s, "castle_causal_backward_q"), 0);  /* before it ran, split) */
    h_fwd_out_free(&out);
}
END_TEST

START_TEST(test_decode_spread)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    /* 64 tokens from empty, one call; a capacity of 16384 leaves scratch for 4 work-groups, one of 64
       none (their partials go to a temporary) */
    for (int room = 0; room < 2; ++room) {
        const conf_dec_case c = {1, 1, 32, 0, {0, 0}, 64, 64, room ? 16384 - 64 : 0, H_BHLD, true, 23, true};
        const size_t cap = conf_decode_capacity(&c), d = c.d;
        float *o = calloc(cap * d, sizeof *o), *lse = calloc(cap, sizeof *lse);
        ck_assert(o && lse);
        h_launches s = {0};
        ck_assert_int_eq(castle_context_set_launch_observer(ctx, h_observe, &s), CASTLE_SUCCESS);
        bool guards = false;
        const castle_status st = conf_run_decode(ctx, &c, o, lse, &guards, NULL);
        ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
        ck_assert_msg(st == CASTLE_SUCCESS && guards, "capacity %zu: %s", cap, castle_last_error());
        /* one work-group would do: 64 rows, a group's least (host/cache.c, MIN_CHUNK) */
        ck_assert_msg(h_last_groups(&s, "castle_cache_decode_attend") >= 2,
                      "capacity %zu: castle_cache_decode_attend: %zu work-groups", cap,
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
}
END_TEST

START_TEST(test_decode_refused)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const size_t n = 100, d = 32;
    castle_attention_desc desc;
    ck_assert_int_eq(castle_attention_desc_init(&desc, 1, 1, n, d), CASTLE_SUCCESS);
    castle_cache *cache = NULL;
    ck_assert_int_eq(castle_cache_create(ctx, &desc, &cache), CASTLE_SUCCESS);
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
    ck_assert_msg(strstr(castle_last_error(), "castle_cache_decode_attend") &&
                      strstr(castle_last_error(), "fewer tokens"),
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

/* castle_causal_decode of one token per call after a prompt of ten blocks, to 1100 keys, on a context
   under CASTLE_LOOP_LIMIT=300: the prompt's forward splits its keys 4 ways (3 key blocks to a
   work-item at d = 16), its partials in a temporary (the cache's scratch is for decode calls), and
   past about 15 keys per partial the decode spreads the keys over more work-groups (more than it
   would: launch observer); its outputs, the prompt's too, are the causal forward's (itself against
   the fp64 reference). */
START_TEST(test_causal_decode_spread)
{
    h_launches s = {0};
    castle_context *ctx = context_under("300", &s);
    const size_t blk = block_of(ctx), L = 1100, d = 16;
    const conf_causal_dec_case dc = {{1, 1, L, d, 0, H_BHLD, 1, 0, 41}, 10 * blk - 5, 1, true, true};
    float *o = calloc(L * d, sizeof *o), *lse = calloc(L, sizeof *lse);
    ck_assert(o && lse);
    bool guards = false;
    const castle_status st = conf_run_causal_decode(ctx, castle_context_queue(ctx), &dc, 0, o, lse, &guards);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
    ck_assert_msg(st == CASTLE_SUCCESS && guards, "%s", castle_last_error());
    /* the last token's 1100 keys: 1100 / 15 partials at least (one per work-item or work-group) */
    const size_t g = h_last_groups(&s, "castle_causal_decode");
    ck_assert_msg(g >= 2, "castle_causal_decode: %zu work-groups", g);
    ck_assert_uint_eq(h_last_groups(&s, "castle_causal_forward"), 10 * 4); /* the prompt's, split */
    h_fwd_out fo;
    ck_assert_msg(h_run_causal_forward(h_context(), h_queue(), &dc.c, true, &fo) == CASTLE_SUCCESS, "%s",
                  castle_last_error());
    ck_assert_msg(fo.err_o <= CAUSAL_TOL && fo.err_lse <= CAUSAL_TOL, "forward: o %.3g, lse %.3g", fo.err_o,
                  fo.err_lse);
    h_check_rows(o, lse, fo.o, fo.lse, 0, L, d, DECODE_TOL, "causal prefill and decode");
    h_fwd_out_free(&fo);
    free(o);
    free(lse);
    castle_context_destroy(ctx);
}
END_TEST

/* Under a limit of 300 a work-item of castle_causal_forward loops over 3 key blocks at d = 16
   (host/loops.c): a causal forward of 10 blocks (the last ragged) splits each query block's keys 4
   ways, its partials in a temporary merged by castle_causal_combine, and matches the fp64 reference. */
START_TEST(test_causal_forward_split)
{
    const size_t blk = block_of(h_context());
    const h_fwd_case c = {2, 1, 10 * blk - 5, 16, 0, H_BHLD, 1, 0, 29};
    h_launches s = {0};
    castle_context *ctx = context_under("300", &s);
    h_fwd_out out;
    const castle_status st = h_run_causal_forward(ctx, castle_context_queue(ctx), &c, false, &out);
    ck_assert_msg(st == CASTLE_SUCCESS, "%s: %s", castle_status_string(st), castle_last_error());
    ck_assert_int_eq(h_count_launches(&s, "castle_causal_combine"), 1);
    ck_assert_uint_eq(h_last_groups(&s, "castle_causal_forward"), 10 * 4 * c.B);
    ck_assert(out.guards_ok && out.finite);
    ck_assert_msg(out.err_o <= CAUSAL_TOL && out.err_lse <= CAUSAL_TOL, "o %.3g, lse %.3g", out.err_o, out.err_lse);
    h_fwd_out_free(&out);
    castle_context_destroy(ctx);
}
END_TEST

/* Under a limit of 1000 a work-item of castle_cache_prefill_u loops over 2 key blocks at d = 16: a
   ragged prefill of prompts of 5 and 3 blocks (the longer ragged) runs the U pass in 3 launches, each
   adding to U, and its outputs and those of 3 decoded tokens after it match the fp64 recurrent
   reference, for CASTLE and CASTLE-SWL. */
START_TEST(test_prefill_split)
{
    const size_t blk = block_of(h_context());
    for (int swl = 0; swl < 2; ++swl) {
        const long W = swl ? (long)blk + 3 : 0;
        const conf_dec_case c = {2, 1, 16, W, {5 * blk - 3, 3 * blk}, 3, 1, 0, H_BHLD, true, 31, true};
        h_launches s = {0};
        castle_context *ctx = context_under("1000", &s);
        const conf_case cc = {.op = CONF_DECODE, .u.dec = c};
        conf_result r;
        const castle_status st = conf_run_case(ctx, &cc, &r);
        ck_assert_msg(st == CASTLE_SUCCESS, "W=%ld: %s: %s", c.W, castle_status_string(st), castle_last_error());
        ck_assert_msg(r.pass, "W=%ld: %s", c.W, r.why);
        ck_assert_int_eq(h_count_launches(&s, "castle_cache_prefill_u"), 3);
        castle_context_destroy(ctx);
    }
}
END_TEST

/* The forward of a case the wavefront folds (N <= the tuning's fold, B H >= 2 compute units) on a
   context made under CASTLE_LOOP_LIMIT=limit: which kernel it launched. */
static bool folded_under(const char *limit)
{
    h_launches s = {0};
    castle_context *ctx = context_under(limit, &s);
    cl_uint cu = 0;
    ck_assert_int_eq(clGetDeviceInfo(castle_context_device(ctx), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL),
                     CL_SUCCESS);
    castle_tuning t;
    t.struct_size = sizeof t;
    ck_assert_int_eq(castle_context_get_tuning(ctx, &t), CASTLE_SUCCESS);
    ck_assert_msg(t.fold >= 2, "the tuning folds no wavefront (fold = %u)", t.fold);
    const h_fwd_case c = {1, 2 * (size_t)cu, 2 * t.block, 16, 0, H_BHLD, 1, 0, 5};
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
    tcase_add_test(tc, test_causal_forward_split);
    tcase_add_test(tc, test_prefill_split);
    tcase_add_test(tc, test_no_fold);
    tcase_add_test(tc, test_fold_without_limit);
    suite_add_tcase(s, tc);
    return h_run_suite(s);
}
