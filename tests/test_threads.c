/* One castle_context used from several threads at once (castle.h: "Threads"): each thread has its
 * own command queue and buffers and runs forward, backward, prefill + decode and the causal
 * baseline on shapes of its own, on a context where nothing is built yet, so the threads also race
 * to build the programs and create the kernels.  Every result must be bitwise the result of the
 * same job run alone on one thread.  Built with -DCASTLE_TSAN=ON this suite runs under
 * ThreadSanitizer, which also reports any data race in the library's host code. */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { JOB_FORWARD, JOB_BACKWARD, JOB_DECODE, JOB_CAUSAL, NJOBKINDS };
static const char *const job_names[NJOBKINDS] = {"forward", "backward", "prefill+decode", "causal"};

enum { THREADS = 4, ROUNDS = 10 };

/* The job of kind k for thread t: every thread a shape of its own (B, H, L, d, window). */
static h_fwd_case job_case(int t, int k)
{
    static const h_fwd_case shapes[THREADS] = {
        /* B  H  L   d   W  layout   mag scale seed */
        {1, 2, 37, 16, 0, H_BHLD, 1, 0, 11},
        {2, 1, 50, 8, 5, H_BLHD, 1, 0, 12},
        {1, 3, 33, 24, 0, H_BHLD, 1, 0, 13},
        {2, 2, 41, 12, 3, H_PADDED, 1, 0, 14},
    };
    h_fwd_case c = shapes[(t + k) % THREADS];
    c.seed += (uint64_t)(10 * k);
    return c;
}

typedef struct result {
    castle_status st;
    char msg[256];
    float *v; /* the job's outputs, concatenated */
    size_t n;
} result;

static void job_fail(result *r, castle_status st, const char *what)
{
    r->st = st;
    snprintf(r->msg, sizeof r->msg, "%s: %s", what, castle_last_error());
}

static void append(result *r, const float *v, size_t n)
{
    float *p = realloc(r->v, (r->n + n) * sizeof(float));
    if (!p) {
        r->st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        return;
    }
    memcpy(p + r->n, v, n * sizeof(float));
    r->v = p;
    r->n += n;
}

/* A packed (B, H, rows, d) buffer of tensor `tensor`'s test values for positions first .. first+rows. */
static cl_mem input(castle_context *ctx, const h_fwd_case *c, unsigned tensor, size_t first, size_t rows)
{
    const size_t n = c->B * c->H * rows * c->d;
    float *h = malloc(n * sizeof(float));
    if (!h)
        return NULL;
    for (size_t b = 0; b < c->B; ++b)
        for (size_t hh = 0; hh < c->H; ++hh)
            for (size_t r = 0; r < rows; ++r)
                for (size_t e = 0; e < c->d; ++e)
                    h[((b * c->H + hh) * rows + r) * c->d + e] =
                        (float)(c->mag * h_value(c->seed, tensor, b, hh, first + r, e));
    cl_int err;
    cl_mem m = clCreateBuffer(castle_context_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                              n * sizeof(float), h, &err);
    free(h);
    return m;
}

static cl_mem output(castle_context *ctx, size_t floats)
{
    cl_int err;
    return clCreateBuffer(castle_context_cl_context(ctx), CL_MEM_READ_WRITE, floats * sizeof(float), NULL, &err);
}

static void read_into(cl_command_queue q, cl_mem m, size_t floats, result *r)
{
    float *h = malloc(floats * sizeof(float));
    if (!h || clEnqueueReadBuffer(q, m, CL_TRUE, 0, floats * sizeof(float), h, 0, NULL, NULL) != CL_SUCCESS)
        r->st = CL_OUT_OF_RESOURCES;
    else
        append(r, h, floats);
    free(h);
}

/* CASTLE prefill of the first P = L/2 positions, then decode of the rest two tokens per call; the
   outputs o and lse of every position. */
static void run_decode(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, result *r)
{
    const size_t B = c->B, H = c->H, L = c->L, d = c->d, P = L / 2, step = 2;
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, B, H, L, d);
    desc.window = c->W;
    castle_cache *cache = NULL;
    castle_status st = castle_cache_create(ctx, &desc, &cache);
    if (st) {
        job_fail(r, st, "castle_cache_create");
        return;
    }
    for (size_t first = 0; first < L && !r->st;) {
        const size_t n = first == 0 ? P : (L - first < step ? L - first : step);
        desc.seq_len = n;
        cl_mem in[6], o = output(ctx, B * H * n * d), lse = output(ctx, B * H * n);
        for (unsigned t = 0; t < 6; ++t)
            in[t] = input(ctx, c, t, first, n);
        cl_event ev = NULL;
        if (first == 0)
            st = castle_prefill(ctx, cache, &desc, NULL, in[0], in[1], in[2], in[3], in[4], in[5], o, lse, q, 0, NULL,
                                &ev);
        else
            st = castle_decode(ctx, cache, &desc, in[0], in[1], in[2], in[3], in[4], in[5], o, lse, q, 0, NULL, &ev);
        if (st) {
            job_fail(r, st, first == 0 ? "castle_prefill" : "castle_decode");
        } else {
            clWaitForEvents(1, &ev);
            clReleaseEvent(ev);
            read_into(q, o, B * H * n * d, r);
            read_into(q, lse, B * H * n, r);
        }
        for (unsigned t = 0; t < 6; ++t)
            clReleaseMemObject(in[t]);
        clReleaseMemObject(o);
        clReleaseMemObject(lse);
        first += n;
    }
    castle_cache_destroy(cache);
}

static void run_causal(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, result *r)
{
    const size_t B = c->B, H = c->H, L = c->L, d = c->d;
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, B, H, L, d);
    cl_mem qc = input(ctx, c, 3, 0, L), kc = input(ctx, c, 4, 0, L), vc = input(ctx, c, 5, 0, L);
    cl_mem o = output(ctx, B * H * L * d), lse = output(ctx, B * H * L);
    cl_event ev = NULL;
    castle_status st = castle_causal_forward(ctx, &desc, qc, kc, vc, o, lse, q, 0, NULL, &ev);
    if (st) {
        job_fail(r, st, "castle_causal_forward");
    } else {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
        read_into(q, o, B * H * L * d, r);
        read_into(q, lse, B * H * L, r);
    }
    cl_mem all[] = {qc, kc, vc, o, lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
        clReleaseMemObject(all[i]);
}

static result run_job(castle_context *ctx, cl_command_queue q, int t, int k)
{
    result r = {0};
    const h_fwd_case c = job_case(t, k);
    if (k == JOB_FORWARD || k == JOB_BACKWARD) {
        h_fwd_out out;
        castle_status st = k == JOB_FORWARD ? h_run_forward(ctx, q, &c, false, true, &out)
                                            : h_run_backward(ctx, q, &c, H_GRAD_NONE, true, &out);
        if (st) {
            job_fail(&r, st, job_names[k]);
            return r;
        }
        const size_t n = c.B * c.H * c.L * c.d;
        append(&r, out.o, n);
        append(&r, out.lse, c.B * c.H * c.L);
        for (int g = 0; g < 6 && k == JOB_BACKWARD; ++g)
            append(&r, out.grad[g], n);
        if (!out.guards_ok) {
            r.st = CASTLE_ERR_INVALID_ARGUMENT;
            snprintf(r.msg, sizeof r.msg, "%s wrote outside its outputs", job_names[k]);
        }
        h_fwd_out_free(&out);
    } else if (k == JOB_DECODE) {
        run_decode(ctx, q, &c, &r);
    } else {
        run_causal(ctx, q, &c, &r);
    }
    return r;
}

static result g_ref[THREADS][NJOBKINDS];
static castle_context *g_shared;

typedef struct worker {
    int t;
    int mismatches, failures;
    char first[512];
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(castle_context_cl_context(g_shared), castle_context_device(g_shared), 0,
                                              &err);
    if (!q) {
        w->failures = 1;
        snprintf(w->first, sizeof w->first, "thread %d: clCreateCommandQueue: %d", w->t, (int)err);
        return NULL;
    }
    for (int round = 0; round < ROUNDS; ++round)
        for (int i = 0; i < NJOBKINDS; ++i) {
            const int k = (w->t + i) % NJOBKINDS; /* the threads start on different kinds */
            result r = run_job(g_shared, q, w->t, k);
            const result *ref = &g_ref[w->t][k];
            if (r.st) {
                if (!w->failures++)
                    snprintf(w->first, sizeof w->first, "thread %d %s: %s", w->t, job_names[k], r.msg);
            } else if (r.n != ref->n || memcmp(r.v, ref->v, r.n * sizeof(float))) {
                size_t differ = 0;
                for (size_t j = 0; j < r.n && j < ref->n; ++j)
                    differ += memcmp(&r.v[j], &ref->v[j], sizeof(float)) != 0;
                if (!w->mismatches++)
                    snprintf(w->first, sizeof w->first, "thread %d %s round %d: %zu of %zu values differ", w->t,
                             job_names[k], round, differ, ref->n);
            }
            const char *log = castle_build_log(g_shared); /* read while others build */
            if (!log)
                w->failures++;
            free(r.v);
        }
    clReleaseCommandQueue(q);
    return NULL;
}

START_TEST(test_one_context_many_threads)
{
    /* references: each job alone, on a context of its own */
    castle_context *alone = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &alone) == CASTLE_SUCCESS, "%s", castle_last_error());
    for (int t = 0; t < THREADS; ++t)
        for (int k = 0; k < NJOBKINDS; ++k) {
            g_ref[t][k] = run_job(alone, castle_context_queue(alone), t, k);
            ck_assert_msg(g_ref[t][k].st == CASTLE_SUCCESS, "reference: %s", g_ref[t][k].msg);
        }
    castle_context_destroy(alone);

    /* a fresh context shared by every thread: nothing built or created on it yet */
    ck_assert_msg(castle_context_create_default(NULL, &g_shared) == CASTLE_SUCCESS, "%s", castle_last_error());
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int t = 0; t < THREADS; ++t) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].t = t;
        ck_assert(pthread_create(&th[t], NULL, work, &w[t]) == 0);
    }
    int mismatches = 0, failures = 0;
    const char *first = NULL;
    for (int t = 0; t < THREADS; ++t) {
        pthread_join(th[t], NULL);
        mismatches += w[t].mismatches;
        failures += w[t].failures;
        if (!first && w[t].first[0])
            first = w[t].first;
    }
    castle_context_destroy(g_shared);
    for (int t = 0; t < THREADS; ++t)
        for (int k = 0; k < NJOBKINDS; ++k)
            free(g_ref[t][k].v);
    ck_assert_msg(failures == 0 && mismatches == 0,
                  "%d of %d jobs failed and %d gave results that differ from a single-threaded run; first: %s",
                  failures, THREADS * ROUNDS * NJOBKINDS, mismatches, first ? first : "");
}
END_TEST

/* Removing the launch observer returns only once no call of it is in progress (castle.h), so its
   user data may then be freed: a worker's launch calls a slow observer, the main thread removes the
   observer while that call sleeps, and the call must have returned by then (before, removal returned
   at once and the probe's freed data was used after free).  The observer also tries to set an
   observer on its own context: refused, where waiting for itself would hang. */
static atomic_int obs_inside, obs_calls;
static castle_status obs_self_status = CASTLE_SUCCESS;

static void slow_observer(void *user, const char *kernel, cl_event ev, size_t groups, size_t group_size)
{
    (void)kernel, (void)ev, (void)groups, (void)group_size;
    if (atomic_fetch_add(&obs_calls, 1) == 0)
        obs_self_status = castle_context_set_launch_observer((castle_context *)user, NULL, NULL);
    atomic_store(&obs_inside, 1);
    const struct timespec ms300 = {0, 300000000L};
    nanosleep(&ms300, NULL);
    atomic_store(&obs_inside, 0);
}

static void *observed_job(void *ctx)
{
    result r = run_job(ctx, castle_context_queue(ctx), 0, JOB_CAUSAL);
    free(r.v);
    return NULL;
}

START_TEST(test_observer_removal_waits)
{
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert(castle_context_set_launch_observer(ctx, slow_observer, ctx) == CASTLE_SUCCESS);
    pthread_t th;
    ck_assert(pthread_create(&th, NULL, observed_job, ctx) == 0);
    const struct timespec ms1 = {0, 1000000L};
    for (int i = 0; i < 600000 && !atomic_load(&obs_inside); ++i) /* the first launch builds: minutes at most */
        nanosleep(&ms1, NULL);
    ck_assert_msg(atomic_load(&obs_inside), "the observer was never called");
    ck_assert(castle_context_set_launch_observer(ctx, NULL, NULL) == CASTLE_SUCCESS);
    const int inside = atomic_load(&obs_inside), calls = atomic_load(&obs_calls);
    pthread_join(th, NULL);
    castle_context_destroy(ctx);
    ck_assert_msg(!inside, "castle_context_set_launch_observer(NULL) returned while the observer ran");
    ck_assert_msg(atomic_load(&obs_calls) == calls, "the observer was called after its removal returned");
    ck_assert_msg(obs_self_status == CASTLE_ERR_INVALID_ARGUMENT,
                  "setting the observer from within it gave %d, not CASTLE_ERR_INVALID_ARGUMENT", (int)obs_self_status);
}
END_TEST

/* castle_last_error is the calling thread's (castle.h): threads that fail with messages of their own
   (one with a window < 0, one with a head_dim too large) and one that succeeds each read only their
   own, every time, while the others write theirs. */
enum { ERR_THREADS = 3, ERR_ROUNDS = 20000 };
static atomic_int err_mismatches;

static void *last_error_worker(void *arg)
{
    const int t = (int)(intptr_t)arg;
    castle_context *ctx = h_context();
    castle_attention_desc d;
    castle_attention_desc_init(&d, 1, 1, 8, 8);
    if (t == 0)
        d.window = -3;
    else if (t == 1)
        d.head_dim = 999;
    static const char *const want[ERR_THREADS] = {"window=-3", "head_dim=999", ""};
    size_t bytes;
    for (int r = 0; r < ERR_ROUNDS; ++r) {
        const castle_status st = castle_forward_workspace_size(ctx, &d, &bytes);
        const char *msg = castle_last_error();
        if ((st == CASTLE_SUCCESS) != (t == 2) || (t == 2 ? msg[0] != '\0' : !strstr(msg, want[t])))
            atomic_fetch_add(&err_mismatches, 1);
    }
    return NULL;
}

START_TEST(test_last_error_per_thread)
{
    ck_assert_msg(h_context() != NULL, "no device: %s", castle_last_error());
    pthread_t th[ERR_THREADS];
    for (int t = 0; t < ERR_THREADS; ++t)
        ck_assert(pthread_create(&th[t], NULL, last_error_worker, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < ERR_THREADS; ++t)
        pthread_join(th[t], NULL);
    ck_assert_msg(atomic_load(&err_mismatches) == 0, "%d of %d calls saw another thread's castle_last_error",
                  atomic_load(&err_mismatches), ERR_THREADS * ERR_ROUNDS);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("threads");
    TCase *tc = tcase_create("threads");
    tcase_set_timeout(tc, 900); /* ThreadSanitizer runs it several times slower */
    tcase_add_test(tc, test_one_context_many_threads);
    tcase_add_test(tc, test_observer_removal_waits);
    tcase_add_test(tc, test_last_error_per_thread);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
