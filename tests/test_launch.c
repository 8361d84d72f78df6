/* The launch helper (host/launch.c), tested directly against the static library: a kernel argument
 * the driver refuses and an enqueue the driver refuses each come back as the driver's own OpenCL
 * code (never several codes OR-ed together) with a message naming the kernel and the step, and an
 * argument list that overflows is refused before the driver sees it.  The launch observer
 * (castle_context_set_launch_observer) sees every kernel launch once, with its name, a live event
 * and its work-groups, changes no result, and is removed by NULL.  And the causal forward runs from
 * the program of the forwards' own shape under the GPU entry (case "shapes", label variants).  A
 * register cap (the tuning's regs, fregs) becomes NVIDIA's -cl-nv-maxrregcount in the build options
 * of the families it names, and no option at all when it is 0.  Device: CASTLE_DEVICE. */
#include "context.h"
#include "launch.h"
#include "program.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static castle_context *ctx;
static cl_kernel kernel; /* castle_causal_append: (int n, int t0, int d, int H, ...) */

static void setup(void)
{
    ck_assert_int_eq(castle_context_create_default(NULL, &ctx), CASTLE_SUCCESS);
    ck_assert_int_eq(castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, 64, "castle_causal_append", &kernel), CASTLE_SUCCESS);
}

static void teardown(void) { castle_context_destroy(ctx); }

/* Launches args over one work-group of the kernel's compiled size, plus global_extra work-items
   (not 0: a range the work-group size does not divide, which the driver refuses). */
static castle_status launch(const castle_args *args, size_t global_extra)
{
    size_t wg[3] = {0, 0, 0};
    ck_assert_int_eq(
        clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof wg, wg, NULL),
        CL_SUCCESS);
    castle_chain ch;
    ck_assert_int_eq(castle__chain_init(&ch, castle_context_queue(ctx), 0, NULL, NULL), CASTLE_SUCCESS);
    const size_t global[2] = {wg[0] + global_extra, 1}, local[2] = {wg[0], 1};
    castle_status st = castle__launch(&ch, true, ctx, kernel, "castle_causal_append", args, global, local);
    castle__chain_end(&ch);
    return st;
}

START_TEST(test_refused_argument)
{
    castle_args args = {.n = 0};
    const cl_int n = 1;
    const cl_ulong wrong = 0; /* argument 1 is an int */
    CASTLE_ARG(&args, n);
    CASTLE_ARG(&args, wrong);
    const castle_status st = launch(&args, 0);
    ck_assert_int_eq(st, CL_INVALID_ARG_SIZE);
    const char *msg = castle_last_error();
    ck_assert_msg(strstr(msg, "clSetKernelArg(castle_causal_append, argument 1)"), "message: %s", msg);
}
END_TEST

START_TEST(test_refused_enqueue)
{
    /* every argument right, the global size not a multiple of the work-group size */
    castle_args args = {.n = 0};
    const cl_int n = 1, t0 = 0, d = 4, H = 1;
    cl_int err;
    cl_mem buf = clCreateBuffer(castle_context_cl_context(ctx), CL_MEM_READ_WRITE, 64 * sizeof(float), NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_ulong4 s;
    memset(&s, 0, sizeof s);
    s.s[2] = 4, s.s[1] = 16, s.s[0] = 16;
    CASTLE_ARG(&args, n);
    CASTLE_ARG(&args, t0);
    CASTLE_ARG(&args, d);
    CASTLE_ARG(&args, H);
    for (int i = 0; i < 2; ++i) {
        CASTLE_ARG(&args, buf);
        CASTLE_ARG(&args, s);
    }
    CASTLE_ARG(&args, buf);
    CASTLE_ARG(&args, buf);
    CASTLE_ARG(&args, s);
    const castle_status st = launch(&args, 1);
    clReleaseMemObject(buf);
    ck_assert_int_lt(st, 0);
    ck_assert_int_gt(st, -100); /* an OpenCL code (CL_INVALID_WORK_GROUP_SIZE on conforming drivers) */
    const char *msg = castle_last_error();
    ck_assert_msg(strstr(msg, "clEnqueueNDRangeKernel(castle_causal_append)"), "message: %s", msg);
}
END_TEST

START_TEST(test_too_many_arguments)
{
    castle_args args = {.n = 0};
    const cl_int x = 0;
    for (int i = 0; i <= CASTLE_MAX_ARGS; ++i)
        CASTLE_ARG(&args, x);
    ck_assert(args.overflow);
    ck_assert_int_eq(launch(&args, 0), CASTLE_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(castle_last_error(), "castle_causal_append"), "message: %s", castle_last_error());
}
END_TEST

/* What the observer saw. */
typedef struct seen {
    int launches, bad_events;
    char first[64];
    size_t groups, group_size;
} seen;

static void observe(void *user, const char *name, cl_event ev, size_t groups, size_t group_size)
{
    seen *s = user;
    cl_command_type type = 0;
    if (!ev || clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL) != CL_SUCCESS ||
        type != CL_COMMAND_NDRANGE_KERNEL)
        ++s->bad_events;
    if (!s->launches++) {
        snprintf(s->first, sizeof s->first, "%s", name);
        s->groups = groups;
        s->group_size = group_size;
    }
}

/* castle_causal_forward (one launch) on c, q = k = v = 1..n/100, B = 1, H = 2, L = 40, d = 8; o into out. */
static void causal_forward_on(castle_context *c_ctx, float *out, size_t n)
{
    castle_attention_desc desc;
    ck_assert_int_eq(castle_attention_desc_init(&desc, 1, 2, 40, 8), CASTLE_SUCCESS);
    ck_assert_uint_eq(n, 2 * 40 * 8);
    float *x = malloc(n * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)(i % 97) / 100.0f;
    cl_int err;
    cl_context c = castle_context_cl_context(c_ctx);
    cl_mem in = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof *x, x, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_mem o = clCreateBuffer(c, CL_MEM_WRITE_ONLY, n * sizeof *x, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_mem lse = clCreateBuffer(c, CL_MEM_WRITE_ONLY, 2 * 40 * sizeof *x, NULL, &err);
    ck_assert_int_eq(err, CL_SUCCESS);
    cl_command_queue q = castle_context_queue(c_ctx);
    ck_assert_int_eq(castle_causal_forward(c_ctx, &desc, in, in, in, o, lse, q, 0, NULL, NULL), CASTLE_SUCCESS);
    ck_assert_int_eq(clEnqueueReadBuffer(q, o, CL_TRUE, 0, n * sizeof *out, out, 0, NULL, NULL), CL_SUCCESS);
    clReleaseMemObject(in);
    clReleaseMemObject(o);
    clReleaseMemObject(lse);
    free(x);
}

static void causal_forward(float *out, size_t n) { causal_forward_on(ctx, out, n); }

START_TEST(test_observer)
{
    enum { N = 2 * 40 * 8 };
    static float plain[N], observed[N], after[N];
    causal_forward(plain, N);
    seen s = {0};
    ck_assert_int_eq(castle_context_set_launch_observer(NULL, observe, &s), CASTLE_ERR_NULL_CONTEXT);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, observe, &s), CASTLE_SUCCESS);
    causal_forward(observed, N);
    ck_assert_int_eq(s.launches, 1);
    ck_assert_int_eq(s.bad_events, 0);
    ck_assert_str_eq(s.first, "castle_causal_forward");
    ck_assert_uint_gt(s.group_size, 0);
    ck_assert_uint_eq(s.groups % 2, 0); /* dimension 1: batch x heads */
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, &s), CASTLE_SUCCESS);
    causal_forward(after, N);
    ck_assert_int_eq(s.launches, 1);
    ck_assert_mem_eq(plain, observed, sizeof plain);
    ck_assert_mem_eq(plain, after, sizeof plain);
}
END_TEST

/* An observer of ctx launches on a second context, whose observer tries to set ctx's observer: the
   thread is still inside ctx's observer (one context further out), so the call is refused, as it is
   directly from within (castle.h); it waited for the thread's own observer call, forever.  The
   launch on the second context computes what it does without observers. */
static castle_context *other;
static castle_status nested_status = 12345;
static int nested_calls;
static float nested_out[2 * 40 * 8];

static void inner_observer(void *user, const char *name, cl_event ev, size_t groups, size_t group_size)
{
    (void)user, (void)name, (void)ev, (void)groups, (void)group_size;
    nested_status = castle_context_set_launch_observer(ctx, NULL, NULL);
}

static void outer_observer(void *user, const char *name, cl_event ev, size_t groups, size_t group_size)
{
    (void)user, (void)name, (void)ev, (void)groups, (void)group_size;
    if (nested_calls++ == 0)
        causal_forward_on(other, nested_out, sizeof nested_out / sizeof nested_out[0]);
}

START_TEST(test_observer_nested)
{
    enum { N = 2 * 40 * 8 };
    static float plain[N], observed[N];
    causal_forward(plain, N);
    ck_assert_int_eq(castle_context_create_default(NULL, &other), CASTLE_SUCCESS);
    ck_assert_int_eq(castle_context_set_launch_observer(other, inner_observer, NULL), CASTLE_SUCCESS);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, outer_observer, NULL), CASTLE_SUCCESS);
    causal_forward(observed, N);
    ck_assert_int_eq(nested_calls, 1);
    ck_assert_msg(nested_status == CASTLE_ERR_INVALID_ARGUMENT,
                  "setting ctx's observer from within an observer called inside ctx's gave %d", (int)nested_status);
    ck_assert_msg(strstr(castle_last_error(), "within an observer"), "message: %s", castle_last_error());
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS); /* outside: allowed */
    ck_assert_mem_eq(plain, observed, sizeof plain);
    ck_assert_mem_eq(plain, nested_out, sizeof plain);
    castle_context_destroy(other);
}
END_TEST

/* Under the built-in GPU entry the causal forward runs on the forwards' own work-group size and d
   chunk (fthreads = 128 work-items, fdchunk = 32: as the CASTLE forward), from a program that holds
   it alone (CASTLE_FAMILY_CAUSAL_FORWARD: the causal backward would need more than NVIDIA's 48 KiB
   of local memory at that d chunk), and gives the output of the device's own tuning to fp32
   rounding; where fthreads = threads and fdchunk = dchunk the family's own program holds it. */
START_TEST(test_causal_forward_shape)
{
    enum { N = 2 * 40 * 8 };
    static float plain[N], own[N];
    castle_tuning t;
    const char *name = NULL;
    size_t n = 0, k = 0;
    ck_assert_int_eq(castle_tuning_table_entry(0, NULL, NULL, &n), CASTLE_SUCCESS);
    for (; k < n; ++k)
        if (castle_tuning_table_entry(k, &name, &t, NULL) == CASTLE_SUCCESS && !strcmp(name, "nvidia-gpu"))
            break;
    ck_assert_msg(k < n && (t.fthreads != t.threads || t.fdchunk != t.dchunk),
                  "no nvidia-gpu entry with a forward shape of its own");
    ck_assert_int_eq(castle__causal_forward_family(&t), CASTLE_FAMILY_CAUSAL_FORWARD);
    castle_tuning same = t;
    same.fthreads = same.threads;
    same.fdchunk = same.dchunk;
    ck_assert_int_eq(castle__causal_forward_family(&same), CASTLE_FAMILY_CAUSAL);
    causal_forward(plain, N); /* the device's own tuning */
    const castle_status st = castle_context_set_tuning(ctx, &t);
    if (st == CASTLE_ERR_BAD_TUNING && strstr(castle_last_error(), "local memory")) { /* said, not hidden */
        fprintf(stderr, "test_causal_forward_shape: the GPU entry does not fit this device: %s\n", castle_last_error());
        return;
    }
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    seen s = {0};
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, observe, &s), CASTLE_SUCCESS);
    causal_forward(own, N);
    ck_assert_int_eq(castle_context_set_launch_observer(ctx, NULL, NULL), CASTLE_SUCCESS);
    ck_assert_int_eq(s.launches, 1);
    ck_assert_str_eq(s.first, "castle_causal_forward");
    ck_assert_uint_eq(s.group_size, t.fthreads);
    /* the same sums (outputs about 0.5) added in another order: a few units of fp32 rounding apart */
    for (size_t i = 0; i < N; ++i)
        ck_assert_msg(fabsf(own[i] - plain[i]) <= 1e-5f, "o[%zu]: %.9g under the GPU entry, %.9g under the device's", i,
                      own[i], plain[i]);
    cl_kernel kernel_bw = NULL; /* the forward's program holds no backward kernel */
    ck_assert_int_ne(castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL_FORWARD, 8, "castle_causal_backward_kv", &kernel_bw),
                     CASTLE_SUCCESS);
}
END_TEST

/* The options castle__program_source gives family f under t: whether they carry
   " -cl-nv-maxrregcount=<regs>" (regs > 0) or no -cl-nv- option at all (regs = 0). */
static void check_cap(castle_family f, const castle_tuning *t, unsigned regs)
{
    char *src = NULL, *opt = NULL;
    ck_assert_int_eq(castle__program_source(f, t, 64, &src, &opt), CASTLE_SUCCESS);
    char want[64];
    snprintf(want, sizeof want, " -cl-nv-maxrregcount=%u ", regs);
    if (regs)
        ck_assert_msg(strstr(opt, want) != NULL, "family %d: '%s' lacks '%s'", (int)f, opt, want);
    else
        ck_assert_msg(strstr(opt, "-cl-nv-") == NULL, "family %d: '%s' has a -cl-nv- option", (int)f, opt);
    free(src);
    free(opt);
}

START_TEST(test_register_cap)
{
    castle_tuning t;
    ck_assert_int_eq(castle_context_get_tuning(ctx, &t), CASTLE_SUCCESS);
    t.regs = t.fregs = 0;
    for (int f = 0; f < CASTLE_FAMILY_COUNT; ++f)
        check_cap((castle_family)f, &t, 0);
    t.regs = 96;
    t.fregs = 64; /* the forwards' own */
    check_cap(CASTLE_FAMILY_BACKWARD, &t, 96);
    check_cap(CASTLE_FAMILY_CACHE, &t, 96);
    check_cap(CASTLE_FAMILY_CAUSAL, &t, 96);
    check_cap(CASTLE_FAMILY_FORWARD, &t, 64);
    check_cap(CASTLE_FAMILY_CAUSAL_FORWARD, &t, 64);
    /* a forward cap of its own puts the causal forward in the forwards' program, whatever the shapes */
    t.fthreads = t.threads;
    t.fdchunk = t.dchunk;
    ck_assert_int_eq(castle__causal_forward_family(&t), CASTLE_FAMILY_CAUSAL_FORWARD);
    t.fregs = t.regs;
    ck_assert_int_eq(castle__causal_forward_family(&t), CASTLE_FAMILY_CAUSAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("launch");
    TCase *tc = tcase_create("launch");
    tcase_set_timeout(tc, 600); /* the first use compiles the causal kernels */
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_refused_argument);
    tcase_add_test(tc, test_refused_enqueue);
    tcase_add_test(tc, test_too_many_arguments);
    tcase_add_test(tc, test_observer);
    tcase_add_test(tc, test_observer_nested);
    tcase_add_test(tc, test_register_cap);
    suite_add_tcase(s, tc);
    tc = tcase_create("shapes");
    tcase_set_tags(tc, "variants"); /* tests/CMakeLists.txt: castle_variants */
    tcase_set_timeout(tc, 600);     /* builds the GPU entry's causal forward */
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_causal_forward_shape);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    const int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
