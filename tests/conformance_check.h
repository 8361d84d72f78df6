/* The test suites' view of the conformance table (conformance/conformance.h): case i of an op, run on
 * the device under test (CASTLE_DEVICE) by the same runner castle-conformance uses, as a Check test. */
#ifndef CASTLE_TESTS_CONFORMANCE_CHECK_H
#define CASTLE_TESTS_CONFORMANCE_CHECK_H

#include "conformance.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void conformance_check(conf_op op, int i)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    conf_result r;
    const castle_status st = conf_run(ctx, op, (size_t)i, &r);
    if (getenv("CASTLE_TEST_VERBOSE"))
        fprintf(stderr, "%s %s: err=%.3g tol=%.3g %s\n", conf_op_names[op], r.what, r.err, r.tol,
                r.pass ? "PASS" : r.why);
    ck_assert_msg(st == CASTLE_SUCCESS && r.pass, "%s %s: %s", conf_op_names[op], r.what, r.why);
}

/* Under the built-in GPU entry (castle-info --table's nvidia-gpu: accum = 2, so the causal and cache
   kernel families are built per head-dimension class, cl/common.cl), on one context, for each class
   (d up to 64, 65 to 128, 129 to 256): the first case of ops[0..nops) whose d lies in it passes.  A
   device whose local memory is too small for the entry says so and runs nothing. */
static inline void conformance_head_dim_classes(const conf_op *ops, int nops)
{
    size_t n = 0, k = 0;
    const char *name = NULL;
    castle_tuning t;
    ck_assert(castle_tuning_table_entry(0, NULL, NULL, &n) == CASTLE_SUCCESS);
    for (; k < n; ++k)
        if (castle_tuning_table_entry(k, &name, &t, NULL) == CASTLE_SUCCESS && !strcmp(name, "nvidia-gpu"))
            break;
    ck_assert_msg(k < n && t.accum == 2, "no nvidia-gpu entry with accum = 2 in the tuning table");
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    const castle_status st = castle_context_set_tuning(ctx, &t);
    if (st == CASTLE_ERR_BAD_TUNING && strstr(castle_last_error(), "local memory")) {
        fprintf(stderr, "head-dimension classes: the GPU entry does not fit this device: %s\n", castle_last_error());
        castle_context_destroy(ctx);
        return;
    }
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    for (size_t lo = 0, hi = 64; hi <= CASTLE_MAX_HEAD_DIM; lo = hi, hi *= 2) {
        bool ran = false;
        for (int o = 0; o < nops && !ran; ++o)
            for (size_t i = 0; i < conf_ncases(ops[o]) && !ran; ++i) {
                const size_t d = conf_head_dim(ops[o], i);
                if (d <= lo || d > hi)
                    continue;
                conf_result r;
                const castle_status rs = conf_run(ctx, ops[o], i, &r);
                ck_assert_msg(rs == CASTLE_SUCCESS && r.pass, "class %zu: %s %s: %s", hi, conf_op_names[ops[o]], r.what,
                              r.why);
                ran = true;
            }
        ck_assert_msg(ran, "no case with %zu < d <= %zu", lo, hi);
    }
    castle_context_destroy(ctx);
}

/* Adds the whole table of op (the full tier) to tc as one loop test. */
#define CONFORMANCE_LOOP(tc, fn, op) tcase_add_loop_test((tc), (fn), 0, (int)conf_ncases(op))

/* The kernel launches a launch observer (castle_context_set_launch_observer: h_observe, with a
   zeroed h_launches as its user data) saw: per kernel name, its launches, their work-groups in all
   and the last one's. */
#define H_MAX_KERNELS 32
typedef struct h_launches {
    int n;
    const char *name[H_MAX_KERNELS]; /* the library's static strings */
    int launches[H_MAX_KERNELS];
    size_t groups[H_MAX_KERNELS], last[H_MAX_KERNELS];
} h_launches;

static inline void h_observe(void *user, const char *kernel, cl_event event, size_t groups, size_t group_size)
{
    (void)event;
    (void)group_size;
    h_launches *s = user;
    int i = 0;
    while (i < s->n && strcmp(s->name[i], kernel))
        ++i;
    if (i == s->n && s->n < H_MAX_KERNELS)
        s->name[s->n++] = kernel;
    if (i < s->n) {
        s->launches[i]++;
        s->groups[i] += groups;
        s->last[i] = groups;
    }
}

/* kernel's entry in s, -1 when it was not launched. */
static inline int h_kernel_entry(const h_launches *s, const char *kernel)
{
    for (int i = 0; i < s->n; ++i)
        if (!strcmp(s->name[i], kernel))
            return i;
    return -1;
}

/* The work-groups of kernel's last launch, 0 when it was not launched. */
static inline size_t h_last_groups(const h_launches *s, const char *kernel)
{
    const int i = h_kernel_entry(s, kernel);
    return i < 0 ? 0 : s->last[i];
}

/* How many times kernel was launched. */
static inline int h_count_launches(const h_launches *s, const char *kernel)
{
    const int i = h_kernel_entry(s, kernel);
    return i < 0 ? 0 : s->launches[i];
}

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200112L /* setenv: the suites that define it */
/* Each of the n values bad[] of environment variable name makes context creation fail with
   CASTLE_ERR_INVALID_ARGUMENT and a message naming the variable; name is left set to the last. */
static inline void h_check_bad_env(const char *name, const char *const *bad, size_t n)
{
    for (size_t i = 0; i < n; ++i) {
        ck_assert_int_eq(setenv(name, bad[i], 1), 0);
        castle_context *ctx = NULL;
        const castle_status st = castle_context_create_default(NULL, &ctx);
        ck_assert_msg(st == CASTLE_ERR_INVALID_ARGUMENT && !ctx, "%s='%s': %s", name, bad[i], castle_status_string(st));
        ck_assert_msg(strstr(castle_last_error(), name), "%s", castle_last_error());
    }
}
#endif

/* Rows [first, last) of o (rows of d floats) and lse against ref_o, ref_lse (the forward's): each
   value within tol (max absolute difference); `what` names the rows in messages. */
static inline void h_check_rows(const float *o, const float *lse, const float *ref_o, const float *ref_lse,
                                size_t first, size_t last, size_t d, double tol, const char *what)
{
    for (size_t t = first; t < last; ++t) {
        ck_assert_msg(fabs(lse[t] - ref_lse[t]) <= tol, "%s token %zu: lse %g, forward %g", what, t, (double)lse[t],
                      (double)ref_lse[t]);
        for (size_t e = 0; e < d; ++e)
            ck_assert_msg(fabs(o[t * d + e] - ref_o[t * d + e]) <= tol, "%s token %zu: o %g, forward %g", what, t,
                          (double)o[t * d + e], (double)ref_o[t * d + e]);
    }
}

/* Runs suite s; the process's exit status. */
static inline int h_run_suite(Suite *s)
{
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    const int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
