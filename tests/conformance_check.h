/* The test suites' view of the conformance table (conformance/conformance.h): case i of an op, run on
 * the device under test (CASTLE_DEVICE) by the same runner castle-conformance uses, as a Check test. */
#ifndef CASTLE_TESTS_CONFORMANCE_CHECK_H
#define CASTLE_TESTS_CONFORMANCE_CHECK_H

#include "conformance.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

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

/* Adds the whole table of op (the full tier) to tc as one loop test. */
#define CONFORMANCE_LOOP(tc, fn, op) tcase_add_loop_test((tc), (fn), 0, (int)conf_ncases(op))

#endif
