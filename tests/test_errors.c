/* Every error status of the argument validation, with its message, and nothing written when a call
 * is rejected.  Each rejected castle_forward differs from a call that succeeds (run first, on the
 * same buffers) in exactly one argument, so the tests prove the rejections are specific.
 *
 * Runs on the device named by CASTLE_DEVICE (default "0:0").  Environment variables the library
 * reads (CASTLE_DEVICE, CASTLE_TUNING, CASTLE_CL_DIR, CASTLE_CACHE_DIR) are changed only inside a
 * test and restored before it ends. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, strdup, mkdtemp */
#endif
#include "harness.h"

#include <check.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* mkfifo, mkdir */
#include <unistd.h>

#define SENTINEL 777.25f
/* castle_forward's tensors are QU .. VC, O, LSE (the first of the descriptor's layouts); its
   buffers here are those, then the workspace. */
#define NFWD (CASTLE_TENSOR_LSE + 1)
#define WS NFWD /* index of the workspace among the buffers (follows LSE) */
#define NBUF (NFWD + 1)

static const char *const buf_names[NBUF] = {"qu", "ku", "vu", "qc", "kc", "vc", "o", "lse", "workspace"};

/* ---- messages ------------------------------------------------------------------------------ */

/* After a failure with `want`: castle_last_error() is one non-empty line that mentions `mention`. */
static void check_message(castle_status want, const char *mention, const char *what)
{
    const char *msg = castle_last_error();
    ck_assert_msg(msg != NULL, "%s: %s but castle_last_error() is NULL", what, castle_status_string(want));
    ck_assert_msg(msg[0] != '\0', "%s: %s but castle_last_error() is empty", what, castle_status_string(want));
    ck_assert_msg(strchr(msg, '\n') == NULL, "%s: the message is not one line: '%s'", what, msg);
    if (mention)
        ck_assert_msg(strstr(msg, mention) != NULL, "%s: %s message '%s' does not mention '%s'", what,
                      castle_status_string(want), msg, mention);
}

static void check_status(castle_status got, castle_status want, const char *mention, const char *what)
{
    ck_assert_msg(got == want, "%s: got %s (%d) '%s', expected %s (%d)", what, castle_status_string(got), (int)got,
                  castle_last_error(), castle_status_string(want), (int)want);
    if (want != CASTLE_SUCCESS)
        check_message(want, mention, what);
}

/* ---- environment --------------------------------------------------------------------------- */

static char *env_save(const char *name)
{
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void env_restore(const char *name, char *saved)
{
    if (saved)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}

/* ---- buffers ------------------------------------------------------------------------------- */

/* A buffer of `bytes`, filled with SENTINEL (fill < 0) or with test data for tensor `fill`. */
/* A buffer of `bytes` with the given access flags, filled as new_buf fills it. */
static cl_mem new_buf_flags(cl_context clc, size_t bytes, int fill, cl_mem_flags flags)
{
    const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
    float *host = malloc(n * sizeof(float));
    ck_assert(host != NULL);
    for (size_t i = 0; i < n; ++i)
        host[i] = fill < 0 ? SENTINEL : (float)h_value(42, (unsigned)fill, 0, 0, 0, i);
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(clc, flags | CL_MEM_COPY_HOST_PTR, bytes, host, &err);
    free(host);
    ck_assert_msg(m != NULL, "clCreateBuffer(%zu bytes) failed: %d", bytes, (int)err);
    return m;
}

/* A read-write buffer of `bytes`: values h_value(42, fill, ...) (fill >= 0) or SENTINEL (fill < 0). */
static cl_mem new_buf(cl_context clc, size_t bytes, int fill) { return new_buf_flags(clc, bytes, fill, CL_MEM_READ_WRITE); }

static size_t mem_size(cl_mem m)
{
    size_t n = 0;
    ck_assert(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof n, &n, NULL) == CL_SUCCESS);
    return n;
}

static cl_context mem_context(cl_mem m)
{
    cl_context c = NULL;
    ck_assert(clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof c, &c, NULL) == CL_SUCCESS);
    return c;
}

static unsigned char *read_all(cl_command_queue q, cl_mem m, size_t bytes)
{
    unsigned char *h = malloc(bytes);
    ck_assert(h != NULL);
    cl_int err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, bytes, h, 0, NULL, NULL);
    ck_assert_msg(err == CL_SUCCESS, "clEnqueueReadBuffer failed: %d", (int)err);
    return h;
}

static void fill_sentinel(cl_command_queue q, cl_mem m, size_t bytes)
{
    const size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
    float *host = malloc(n * sizeof(float));
    ck_assert(host != NULL);
    for (size_t i = 0; i < n; ++i)
        host[i] = SENTINEL;
    cl_int err = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
    free(host);
    ck_assert_msg(err == CL_SUCCESS, "clEnqueueWriteBuffer failed: %d", (int)err);
}

/* Elements spanned by a layout, with castle's "all three zero = packed" rule. */
static size_t span_of(const castle_layout *l, size_t width, size_t B, size_t H, size_t L)
{
    castle_layout x = *l;
    if (!x.batch_stride && !x.head_stride && !x.row_stride) {
        x.row_stride = width;
        x.head_stride = L * width;
        x.batch_stride = H * L * width;
    }
    return (B - 1) * x.batch_stride + (H - 1) * x.head_stride + (L - 1) * x.row_stride + width;
}

/* ---- the fixture: a context, a descriptor and buffers of exactly the sizes it needs ---------- */

typedef struct fx {
    castle_context *ctx;
    cl_context clc;
    cl_command_queue q;
    castle_attention_desc desc;
    size_t bytes[NBUF];
    cl_mem buf[NBUF];
} fx;

/* The arguments of one castle_forward call; start from fx_args() and change one. */
typedef struct fwd_args {
    castle_context *ctx;
    const castle_attention_desc *desc;
    cl_mem buf[NBUF];
    cl_command_queue queue;
    cl_uint nwait;
    const cl_event *wait;
} fwd_args;

static fwd_args fx_args(fx *f)
{
    fwd_args a;
    a.ctx = f->ctx;
    a.desc = &f->desc;
    memcpy(a.buf, f->buf, sizeof a.buf);
    a.queue = f->q;
    a.nwait = 0;
    a.wait = NULL;
    return a;
}

static castle_status fwd(const fwd_args *a, cl_event *ev)
{
    return castle_forward(a->ctx, a->desc, a->buf[0], a->buf[1], a->buf[2], a->buf[3], a->buf[4], a->buf[5],
                          a->buf[6], a->buf[7], a->buf[WS], a->queue, a->nwait, a->wait, ev);
}

/* Runs a call that must succeed, waits for it, checks O and lse are finite and were written. */
static void expect_success(fx *f, const fwd_args *a, const char *what)
{
    cl_event ev = NULL;
    castle_status st = fwd(a, &ev);
    check_status(st, CASTLE_SUCCESS, NULL, what);
    ck_assert_msg(ev != NULL, "%s: no event returned", what);
    ck_assert(clWaitForEvents(1, &ev) == CL_SUCCESS);
    clReleaseEvent(ev);
    for (int t = CASTLE_TENSOR_O; t <= CASTLE_TENSOR_LSE; ++t) {
        const size_t bytes = mem_size(a->buf[t]);
        float *h = (float *)read_all(f->q, a->buf[t], bytes);
        bool any_written = false;
        for (size_t i = 0; i < bytes / sizeof(float); ++i) {
            ck_assert_msg(h[i] == SENTINEL || isfinite(h[i]), "%s: %s[%zu] = %g is not finite", what, buf_names[t],
                          i, (double)h[i]);
            any_written = any_written || h[i] != SENTINEL;
        }
        free(h);
        ck_assert_msg(any_written, "%s: the call succeeded but %s was not written", what, buf_names[t]);
    }
}

static void fx_reset_outputs(fx *f)
{
    for (int t = CASTLE_TENSOR_O; t <= WS; ++t)
        fill_sentinel(f->q, f->buf[t], f->bytes[t]);
}

/* Buffers for (B, H, L, d) packed on ctx.  With baseline, first proves the unmodified call works,
   then resets O, lse and the workspace to the sentinel. */
static void fx_setup_on(fx *f, castle_context *ctx, size_t B, size_t H, size_t L, size_t d, bool baseline)
{
    memset(f, 0, sizeof *f);
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    f->ctx = ctx;
    f->clc = castle_context_cl_context(ctx);
    f->q = castle_context_queue(ctx);
    ck_assert(f->clc != NULL && f->q != NULL);
    castle_attention_desc_init(&f->desc, B, H, L, d);
    for (int t = 0; t < NFWD; ++t)
        f->bytes[t] = span_of(&f->desc.layout[t], t == CASTLE_TENSOR_LSE ? 1 : d, B, H, L) * sizeof(float);
    castle_status st = castle_forward_workspace_size(ctx, &f->desc, &f->bytes[WS]);
    check_status(st, CASTLE_SUCCESS, NULL, "castle_forward_workspace_size of the fixture");
    ck_assert(f->bytes[WS] > 0 && f->bytes[WS] % sizeof(float) == 0);
    for (int t = 0; t < NBUF; ++t)
        f->buf[t] = new_buf(f->clc, f->bytes[t], t < 6 ? t : -1);
    if (baseline) {
        fwd_args a = fx_args(f);
        expect_success(f, &a, "baseline call with exact buffer sizes");
        fx_reset_outputs(f);
    }
}

static void fx_setup(fx *f) { fx_setup_on(f, h_context(), 2, 2, 40, 8, true); }

static void fx_teardown(fx *f)
{
    if (f->q)
        clFinish(f->q);
    for (int t = 0; t < NBUF; ++t)
        if (f->buf[t])
            clReleaseMemObject(f->buf[t]);
    memset(f, 0, sizeof *f);
}

/* Contents of every buffer of a call that lives in the fixture's context, to prove none changes. */
typedef struct snapshot {
    cl_mem m[NBUF];
    size_t n[NBUF];
    unsigned char *data[NBUF];
} snapshot;

static void snap_take(fx *f, const fwd_args *a, snapshot *s)
{
    memset(s, 0, sizeof *s);
    clFinish(f->q);
    for (int t = 0; t < NBUF; ++t) {
        if (!a->buf[t] || mem_context(a->buf[t]) != f->clc)
            continue;
        s->m[t] = a->buf[t];
        s->n[t] = mem_size(a->buf[t]);
        s->data[t] = read_all(f->q, a->buf[t], s->n[t]);
    }
}

static void snap_check(fx *f, snapshot *s, const char *what)
{
    clFinish(f->q);
    for (int t = 0; t < NBUF; ++t) {
        if (!s->m[t])
            continue;
        unsigned char *now = read_all(f->q, s->m[t], s->n[t]);
        const bool same = !memcmp(now, s->data[t], s->n[t]);
        free(now);
        ck_assert_msg(same, "%s: the rejected call changed buffer %s", what, buf_names[t]);
        free(s->data[t]);
        s->data[t] = NULL;
    }
    /* the fixture's outputs still hold the sentinel */
    for (int t = CASTLE_TENSOR_O; t <= WS; ++t) {
        float *h = (float *)read_all(f->q, f->buf[t], f->bytes[t]);
        size_t bad = SIZE_MAX;
        for (size_t i = 0; i < f->bytes[t] / sizeof(float) && bad == SIZE_MAX; ++i)
            if (h[i] != SENTINEL)
                bad = i;
        free(h);
        ck_assert_msg(bad == SIZE_MAX, "%s: the rejected call wrote %s[%zu]", what, buf_names[t], bad);
    }
}

/* A call that must fail with `want` and a message mentioning `mention`, writing nothing (no buffer
   changes, no event). */
static void expect_reject(fx *f, const fwd_args *a, castle_status want, const char *mention, const char *what)
{
    snapshot s;
    snap_take(f, a, &s);
    cl_event ev = NULL;
    castle_status st = fwd(a, &ev);
    if (ev) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
    }
    check_status(st, want, mention, what);
    ck_assert_msg(ev == NULL, "%s: the rejected call returned an event", what);
    snap_check(f, &s, what);
}

/* ---- castle_forward: descriptor ------------------------------------------------------------ */

START_TEST(test_baseline)
{
    /* fx_setup runs the unmodified call with buffers of exactly the sizes the descriptor needs. */
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    expect_success(&f, &a, "second baseline call, event returned");
    castle_status st = fwd(&a, NULL); /* no event requested */
    check_status(st, CASTLE_SUCCESS, NULL, "baseline without an event");
    fx_teardown(&f);
}
END_TEST

START_TEST(test_null_context)
{
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    a.ctx = NULL;
    expect_reject(&f, &a, CASTLE_ERR_NULL_CONTEXT, "castle_context", "castle_forward(ctx=NULL)");
    fx_teardown(&f);
}
END_TEST

START_TEST(test_null_desc)
{
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    a.desc = NULL;
    expect_reject(&f, &a, CASTLE_ERR_NULL_POINTER, "descriptor", "castle_forward(desc=NULL)");
    fx_teardown(&f);
}
END_TEST

START_TEST(test_desc_version)
{
    fx f;
    fx_setup(&f);
    const size_t sizes[] = {0, sizeof(castle_attention_desc) - sizeof(size_t), sizeof(castle_attention_desc) + 8,
                            SIZE_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        castle_attention_desc d = f.desc;
        d.struct_size = sizes[i];
        fwd_args a = fx_args(&f);
        a.desc = &d;
        char what[96];
        snprintf(what, sizeof what, "struct_size=%zu", sizes[i]);
        expect_reject(&f, &a, CASTLE_ERR_DESC_VERSION, "struct_size", what);
    }
    fx_teardown(&f);
}
END_TEST

/* castle_attention_desc_init takes the caller's sizeof: a caller built against a header whose struct
   is smaller or larger than this library's gets CASTLE_ERR_DESC_VERSION and not one byte of its
   memory is written; set_blhd checks the size the same way. */
START_TEST(test_desc_init_size)
{
    enum { SLACK = 64, FILL = 0xA5 };
    const size_t n = sizeof(castle_attention_desc);
    const size_t sizes[] = {0, 1, n - sizeof(size_t), n + sizeof(size_t), n + SLACK, SIZE_MAX};
    union { /* the caller's struct of another version */
        castle_attention_desc desc;
        unsigned char bytes[sizeof(castle_attention_desc) + SLACK];
    } mem;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        memset(&mem, FILL, sizeof mem);
        char what[96];
        snprintf(what, sizeof what, "castle_attention_desc_init_sized(struct_size=%zu)", sizes[i]);
        check_status(castle_attention_desc_init_sized(&mem.desc, sizes[i], 2, 3, 40, 8),
                     CASTLE_ERR_DESC_VERSION, "struct_size", what);
        for (size_t b = 0; b < sizeof mem.bytes; ++b)
            ck_assert_msg(mem.bytes[b] == FILL, "%s wrote byte %zu", what, b);
    }
    /* The macro passes this header's size: accepted, every field set. */
    castle_attention_desc d;
    memset(&d, FILL, sizeof d);
    check_status(castle_attention_desc_init(&d, 2, 3, 40, 8), CASTLE_SUCCESS, NULL, "castle_attention_desc_init");
    ck_assert(d.struct_size == n && d.batch == 2 && d.heads == 3 && d.seq_len == 40 && d.head_dim == 8);
    ck_assert(d.window == 0 && d.scale == 0.0f);
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t)
        ck_assert(d.layout[t].batch_stride == 0 && d.layout[t].head_stride == 0 && d.layout[t].row_stride == 0);
    check_status(castle_attention_desc_init_sized(&d, n, 1, 1, 7, 4), CASTLE_SUCCESS, NULL, "init_sized(sizeof)");
    ck_assert(d.seq_len == 7 && d.head_dim == 4);
    /* set_blhd: an unknown struct_size changes nothing; the known one sets (B, L, H, d). */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        castle_attention_desc e = d;
        e.struct_size = sizes[i];
        check_status(castle_attention_desc_set_blhd(&e), CASTLE_ERR_DESC_VERSION, "struct_size", "set_blhd");
        e.struct_size = d.struct_size;
        ck_assert_msg(memcmp(&e, &d, sizeof d) == 0, "set_blhd wrote a descriptor of struct_size %zu", sizes[i]);
    }
    check_status(castle_attention_desc_set_blhd(&d), CASTLE_SUCCESS, NULL, "set_blhd");
    ck_assert(d.layout[CASTLE_TENSOR_QU].row_stride == 4 && d.layout[CASTLE_TENSOR_QU].head_stride == 4 &&
              d.layout[CASTLE_TENSOR_QU].batch_stride == 7 * 4);
}
END_TEST

START_TEST(test_null_buffer)
{
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    a.buf[_i] = NULL;
    char mention[64], what[64];
    snprintf(mention, sizeof mention, "buffer %s ", buf_names[_i]);
    snprintf(what, sizeof what, "castle_forward(%s=NULL)", buf_names[_i]);
    expect_reject(&f, &a, CASTLE_ERR_NULL_BUFFER, mention, what);
    fx_teardown(&f);
}
END_TEST

START_TEST(test_null_queue)
{
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    a.queue = NULL;
    expect_reject(&f, &a, CASTLE_ERR_NULL_QUEUE, "queue", "castle_forward(queue=NULL)");
    fx_teardown(&f);
}
END_TEST

START_TEST(test_zero_size)
{
    static const char *const mention[4] = {"batch=0", "heads=0", "seq_len=0", "head_dim=0"};
    fx f;
    fx_setup(&f);
    castle_attention_desc d = f.desc;
    size_t *field[4] = {&d.batch, &d.heads, &d.seq_len, &d.head_dim};
    *field[_i] = 0;
    fwd_args a = fx_args(&f);
    a.desc = &d;
    expect_reject(&f, &a, CASTLE_ERR_ZERO_SIZE, mention[_i], mention[_i]);
    size_t bytes = 12345;
    check_status(castle_forward_workspace_size(f.ctx, &d, &bytes), CASTLE_ERR_ZERO_SIZE, mention[_i],
                 "castle_forward_workspace_size with a zero size");
    ck_assert_msg(bytes == 12345, "bytes written by a rejected castle_forward_workspace_size");
    fx_teardown(&f);
}
END_TEST

START_TEST(test_head_dim)
{
    fx f;
    fx_setup(&f);
    const size_t bad[] = {CASTLE_MAX_HEAD_DIM + 1, 1000, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        castle_attention_desc d = f.desc;
        d.head_dim = bad[i];
        fwd_args a = fx_args(&f);
        a.desc = &d;
        char mention[64];
        snprintf(mention, sizeof mention, "head_dim=%zu", bad[i]);
        expect_reject(&f, &a, CASTLE_ERR_HEAD_DIM, mention, mention);
    }
    fx_teardown(&f);

    /* the largest head dim is accepted and computes */
    fx_setup_on(&f, h_context(), 1, 2, 5, CASTLE_MAX_HEAD_DIM, true);
    fx_teardown(&f);
}
END_TEST

START_TEST(test_negative_window)
{
    fx f;
    fx_setup(&f);
    const long bad[] = {-1, -40, LONG_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        castle_attention_desc d = f.desc;
        d.window = bad[i];
        fwd_args a = fx_args(&f);
        a.desc = &d;
        char mention[64];
        snprintf(mention, sizeof mention, "window=%ld", bad[i]);
        expect_reject(&f, &a, CASTLE_ERR_NEGATIVE_WINDOW, mention, mention);
    }
    /* windows 1 and LONG_MAX (past the sequence: plain CASTLE) are accepted */
    const long good[] = {1, LONG_MAX};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; ++i) {
        castle_attention_desc d = f.desc;
        d.window = good[i];
        fwd_args a = fx_args(&f);
        a.desc = &d;
        expect_success(&f, &a, good[i] == 1 ? "window=1" : "window=LONG_MAX");
    }
    fx_teardown(&f);
}
END_TEST

START_TEST(test_bad_scale)
{
    fx f;
    fx_setup(&f);
    /* above CASTLE_MAX_SCALE the float32 scores overflow for ordinary inputs (FLT_MAX: NaN outputs) */
    const float bad[] = {-1.0f, NAN, INFINITY, -INFINITY, -FLT_MIN, -NAN,
                         FLT_MAX, 2 * CASTLE_MAX_SCALE, nextafterf(CASTLE_MAX_SCALE, INFINITY)};
    static const char *const names[] = {"-1", "NaN", "+inf", "-inf", "-FLT_MIN", "-NaN",
                                        "FLT_MAX", "2 x CASTLE_MAX_SCALE", "just above CASTLE_MAX_SCALE"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        castle_attention_desc d = f.desc;
        d.scale = bad[i];
        fwd_args a = fx_args(&f);
        a.desc = &d;
        char what[64];
        snprintf(what, sizeof what, "scale=%s", names[i]);
        /* the message shows the value to float precision: "scale=65536" read as within [0, 65536] */
        const bool above = bad[i] == nextafterf(CASTLE_MAX_SCALE, INFINITY);
        expect_reject(&f, &a, CASTLE_ERR_BAD_SCALE, above ? "scale=65536.0078" : "scale=", what);
    }
    castle_attention_desc d = f.desc;
    d.scale = 0.5f;
    fwd_args a = fx_args(&f);
    a.desc = &d;
    expect_success(&f, &a, "scale=0.5");
    fx_reset_outputs(&f);
    d.scale = CASTLE_MAX_SCALE; /* the limit itself: accepted, outputs finite */
    expect_success(&f, &a, "scale=CASTLE_MAX_SCALE");
    fx_teardown(&f);
}
END_TEST

/* Descriptors whose sizes do not fit: each must give SIZE_OVERFLOW, never a crash or a huge
   allocation.  blk is the context's block size. */
#define NOVERFLOW 14
static const char *overflow_desc(int i, size_t blk, castle_attention_desc *d, const char **mention)
{
    castle_attention_desc_init(d, 2, 2, 8, 8);
    static const char *const mentions[NOVERFLOW] = {
        "seq_len=", "seq_len=", "seq_len=", "batch*heads", "batch*heads", "batch*heads", "of qu overflows",
        "of o overflows", "of lse overflows", "of vc overflows", "of kc overflows", "of ku overflows",
        "of qu overflows", "workspace size overflows"};
    *mention = i >= 0 && i < NOVERFLOW ? mentions[i] : NULL;
    castle_layout *qu = &d->layout[CASTLE_TENSOR_QU];
    switch (i) {
    case 0:
        d->seq_len = SIZE_MAX / 2;
        return "seq_len=SIZE_MAX/2";
    case 1:
        d->seq_len = SIZE_MAX;
        return "seq_len=SIZE_MAX";
    case 2:
        d->seq_len = (size_t)INT_MAX - blk + 1; /* one past the largest accepted */
        return "seq_len=INT_MAX-block+1";
    case 3:
        d->batch = 65536;
        d->heads = 65536; /* batch*heads = 2^32 > INT_MAX */
        return "batch*heads=2^32";
    case 4:
        d->batch = (size_t)INT_MAX;
        d->heads = 2;
        return "batch*heads=2*INT_MAX";
    case 5:
        d->batch = SIZE_MAX;
        d->heads = 2; /* the product itself overflows size_t */
        return "batch=SIZE_MAX, heads=2";
    case 6:
        qu->row_stride = SIZE_MAX / 4;
        qu->head_stride = 1;
        qu->batch_stride = 1;
        return "qu row_stride=SIZE_MAX/4, L=8";
    case 7:
        d->layout[CASTLE_TENSOR_O].row_stride = SIZE_MAX / 4;
        d->layout[CASTLE_TENSOR_O].head_stride = 8 * 8;
        d->layout[CASTLE_TENSOR_O].batch_stride = 2 * 8 * 8;
        return "o row_stride=SIZE_MAX/4, L=8";
    case 8:
        d->layout[CASTLE_TENSOR_LSE].row_stride = SIZE_MAX / 4;
        d->layout[CASTLE_TENSOR_LSE].head_stride = 8;
        d->layout[CASTLE_TENSOR_LSE].batch_stride = 16;
        return "lse row_stride=SIZE_MAX/4, L=8";
    case 9:
        d->batch = 3;
        d->layout[CASTLE_TENSOR_VC].batch_stride = SIZE_MAX / 2; /* 2 * that fits; adding the rest does not */
        d->layout[CASTLE_TENSOR_VC].head_stride = 64;
        d->layout[CASTLE_TENSOR_VC].row_stride = 8;
        return "vc batch_stride=SIZE_MAX/2, B=3";
    case 10:
        d->seq_len = 3;
        d->layout[CASTLE_TENSOR_KC].row_stride = SIZE_MAX / 8; /* elements fit, bytes do not */
        d->layout[CASTLE_TENSOR_KC].head_stride = 1;
        d->layout[CASTLE_TENSOR_KC].batch_stride = 1;
        return "kc row_stride=SIZE_MAX/8, L=3 (extent in bytes)";
    case 11:
        d->layout[CASTLE_TENSOR_KU].head_stride = SIZE_MAX - 4;
        d->layout[CASTLE_TENSOR_KU].batch_stride = 1;
        d->layout[CASTLE_TENSOR_KU].row_stride = 8;
        return "ku head_stride=SIZE_MAX-4";
    case 12:
        castle_attention_desc_init(d, 1, (size_t)1 << 30, (size_t)1 << 30, 256); /* packed size */
        return "packed B=1 H=2^30 L=2^30 d=256";
    case 13:
        castle_attention_desc_init(d, (size_t)1 << 15, (size_t)1 << 15, (size_t)1 << 30, 1); /* workspace */
        return "workspace of B=2^15 H=2^15 L=2^30 d=1";
    default:
        return NULL;
    }
}

static size_t ctx_block(castle_context *ctx)
{
    castle_tuning t;
    ck_assert(castle_context_get_tuning(ctx, &t) == CASTLE_SUCCESS);
    return t.block;
}

/* The device's largest allocation. */
static size_t max_alloc(castle_context *ctx)
{
    cl_ulong max = 0;
    ck_assert(clGetDeviceInfo(castle_context_device(ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max, &max, NULL) ==
              CL_SUCCESS);
    return max > SIZE_MAX ? SIZE_MAX : (size_t)max;
}

/* castle_forward_workspace_size for the size arithmetic: CASTLE_SUCCESS when a size was reported,
   which for a workspace above the device's largest allocation is WORKSPACE_TOO_LARGE (checked
   here: the size is above it and the message says so); other statuses pass through. */
static castle_status ws_size(castle_context *ctx, const castle_attention_desc *d, size_t *bytes)
{
    castle_status st = castle_forward_workspace_size(ctx, d, bytes);
    const size_t max = max_alloc(ctx);
    if (st == CASTLE_SUCCESS)
        ck_assert_msg(*bytes <= max, "a workspace of %zu bytes was accepted; the device's largest allocation is %zu",
                      *bytes, max);
    if (st != CASTLE_ERR_WORKSPACE_TOO_LARGE)
        return st;
    ck_assert_msg(*bytes > max, "WORKSPACE_TOO_LARGE for %zu bytes, within the largest allocation %zu", *bytes, max);
    check_message(st, "CL_DEVICE_MAX_MEM_ALLOC_SIZE", "workspace above the largest allocation");
    return CASTLE_SUCCESS;
}

START_TEST(test_size_overflow)
{
    fx f;
    fx_setup(&f);
    castle_attention_desc d;
    const char *mention = NULL;
    const char *what = overflow_desc(_i, ctx_block(f.ctx), &d, &mention);
    ck_assert(what != NULL);
    fwd_args a = fx_args(&f);
    a.desc = &d;
    expect_reject(&f, &a, CASTLE_ERR_SIZE_OVERFLOW, mention, what);
    size_t bytes = 12345;
    check_status(castle_forward_workspace_size(f.ctx, &d, &bytes), CASTLE_ERR_SIZE_OVERFLOW, mention, what);
    ck_assert_msg(bytes == 12345, "%s: bytes written by a rejected castle_forward_workspace_size", what);
    fx_teardown(&f);
}
END_TEST

/* The limits themselves are not overflows: L = INT_MAX - block and batch*heads = INT_MAX. */
START_TEST(test_size_limits_accepted)
{
    fx f;
    fx_setup(&f);
    const size_t blk = ctx_block(f.ctx);
    castle_attention_desc d;
    size_t bytes = 0;
    castle_attention_desc_init(&d, 1, 1, (size_t)INT_MAX - blk, 1);
    check_status(ws_size(f.ctx, &d, &bytes), CASTLE_SUCCESS, NULL, "workspace size for seq_len=INT_MAX-block");
    ck_assert(bytes > 0);
    /* the CASTLE calls take at most CASTLE_MAX_SEQ_LEN tokens (test_castle_seq_len_limit) */
    fwd_args a = fx_args(&f);
    a.desc = &d;
    expect_reject(&f, &a, CASTLE_ERR_SIZE_OVERFLOW, "tokens per CASTLE call", "seq_len=INT_MAX-block");
    castle_attention_desc_init(&d, (size_t)INT_MAX, 1, 1, 1);
    bytes = 0;
    check_status(ws_size(f.ctx, &d, &bytes), CASTLE_SUCCESS, NULL, "workspace size for batch*heads=INT_MAX");
    ck_assert(bytes > 0);
    fx_teardown(&f);
}
END_TEST

/* CASTLE_MAX_SEQ_LEN: the CASTLE forward, backward and prefill compare positions as float32, so one
   token more is SIZE_OVERFLOW, before any buffer is looked at, while the limit itself gets as far as
   the fixture's small buffers; the workspace size is still reported, and decode and the causal
   baseline (integer positions) are not bound by it. */
START_TEST(test_castle_seq_len_limit)
{
    fx f;
    fx_setup(&f);
    castle_attention_desc d;
    fwd_args a = fx_args(&f);
    a.desc = &d;
    const char *limit = "at most 16777216 tokens per CASTLE call";
    castle_attention_desc_init(&d, 1, 1, CASTLE_MAX_SEQ_LEN, 8);
    expect_reject(&f, &a, CASTLE_ERR_BUFFER_TOO_SMALL, "buffer qu ", "forward, seq_len=CASTLE_MAX_SEQ_LEN");
    castle_attention_desc_init(&d, 1, 1, (size_t)CASTLE_MAX_SEQ_LEN + 1, 8);
    expect_reject(&f, &a, CASTLE_ERR_SIZE_OVERFLOW, limit, "forward, seq_len=CASTLE_MAX_SEQ_LEN+1");
    size_t bytes = 0;
    check_status(ws_size(f.ctx, &d, &bytes), CASTLE_SUCCESS, NULL, "workspace size, seq_len=CASTLE_MAX_SEQ_LEN+1");
    ck_assert(bytes > 0);
    cl_mem *m = f.buf;
    check_status(castle_backward(f.ctx, &d, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[WS], m[6], m[0], m[1],
                                 m[2], m[3], m[4], m[5], f.q, 0, NULL, NULL),
                 CASTLE_ERR_SIZE_OVERFLOW, limit, "backward, seq_len=CASTLE_MAX_SEQ_LEN+1");
    check_status(castle_causal_forward(f.ctx, &d, m[3], m[4], m[5], m[6], m[7], f.q, 0, NULL, NULL),
                 CASTLE_ERR_BUFFER_TOO_SMALL, "buffer qc ", "causal forward, seq_len=CASTLE_MAX_SEQ_LEN+1");
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, 1, 1, 16, 8);
    castle_cache *cache = NULL;
    check_status(castle_cache_create(f.ctx, &cd, &cache), CASTLE_SUCCESS, NULL, "a cache of 16 tokens");
    check_status(
        castle_prefill(f.ctx, cache, &d, NULL, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], f.q, 0, NULL, NULL),
        CASTLE_ERR_SIZE_OVERFLOW, limit, "prefill, seq_len=CASTLE_MAX_SEQ_LEN+1");
    check_status(castle_decode(f.ctx, cache, &d, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], f.q, 0, NULL, NULL),
                 CASTLE_ERR_BUFFER_TOO_SMALL, "buffer qu ", "decode, seq_len=CASTLE_MAX_SEQ_LEN+1");
    castle_cache_destroy(cache);
    fx_teardown(&f);
}
END_TEST

/* The workspace size near SIZE_MAX bytes.  With d = 1 and L = 2^30 every tensor fits (B*H*L*d <= 2^61
   floats), so as B*H grows the workspace is the first size to stop fitting.  A binary search finds the
   largest B*H accepted: its workspace must lie within about one (batch, head) share of SIZE_MAX bytes
   (no early rejection, and a count of floats that fits while its bytes do not is not wrapped
   around), and the next B*H must be SIZE_OVERFLOW. */
START_TEST(test_workspace_overflow_boundary)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    const size_t L = (size_t)1 << 30;
    castle_attention_desc d;
    size_t one = 0, bytes = 0;
    castle_attention_desc_init(&d, 1, 1, L, 1);
    check_status(ws_size(ctx, &d, &one), CASTLE_SUCCESS, NULL, "workspace for B*H=1");
    size_t lo = 1, hi = (size_t)INT_MAX; /* lo accepted; hi must be rejected */
    d.heads = hi;
    check_status(castle_forward_workspace_size(ctx, &d, &bytes), CASTLE_ERR_SIZE_OVERFLOW, "workspace",
                 "workspace for B*H=INT_MAX, L=2^30, d=1");
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        d.heads = mid;
        castle_status st = ws_size(ctx, &d, &bytes);
        ck_assert_msg(st == CASTLE_SUCCESS || st == CASTLE_ERR_SIZE_OVERFLOW, "B*H=%zu: %s", mid,
                      castle_last_error());
        if (st == CASTLE_SUCCESS)
            lo = mid;
        else
            hi = mid;
    }
    d.heads = lo;
    check_status(ws_size(ctx, &d, &bytes), CASTLE_SUCCESS, NULL, "largest B*H accepted");
    ck_assert_msg(bytes >= SIZE_MAX - 2 * one,
                  "largest accepted B*H=%zu reports %zu workspace bytes, far below SIZE_MAX (one B*H needs %zu): "
                  "rejected early, or its byte count wrapped",
                  lo, bytes, one);
    /* each (batch, head) keeps its own state: a byte count that wrapped past SIZE_MAX (a float count
       that fits, times 4) would give far less per B*H than B*H = 1 does */
    ck_assert_msg(bytes / lo >= one / 2,
                  "largest accepted B*H=%zu reports %zu bytes, %zu per B*H, but B*H=1 needs %zu: the byte count "
                  "wrapped",
                  lo, bytes, bytes / lo, one);
    d.heads = lo + 1;
    size_t untouched = 12345;
    check_status(castle_forward_workspace_size(ctx, &d, &untouched), CASTLE_ERR_SIZE_OVERFLOW, "workspace",
                 "B*H one past the largest accepted");
    ck_assert(untouched == 12345);
    /* and castle_forward says the same */
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    a.desc = &d;
    expect_reject(&f, &a, CASTLE_ERR_SIZE_OVERFLOW, "workspace", "forward with B*H one past the largest accepted");
    fx_teardown(&f);
}
END_TEST

/* A workspace above the device's largest allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE) is
   WORKSPACE_TOO_LARGE, with its size still reported; one batch x head less fits.  The workspace is
   B*H times one (batch, head)'s share, so the boundary is exact. */
START_TEST(test_workspace_too_large)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    const size_t max = max_alloc(ctx);
    castle_attention_desc d;
    castle_attention_desc_init(&d, 1, 1, 4096, 256);
    size_t one = 0, bytes = 0;
    check_status(castle_forward_workspace_size(ctx, &d, &one), CASTLE_SUCCESS, NULL, "B*H=1, L=4096, d=256");
    ck_assert(one > 0 && one <= max);
    d.heads = max / one; /* the most that fit */
    check_status(castle_forward_workspace_size(ctx, &d, &bytes), CASTLE_SUCCESS, NULL, "the largest B*H that fits");
    ck_assert_uint_eq(bytes, d.heads * one);
    d.heads += 1;
    bytes = 0;
    char mention[64];
    snprintf(mention, sizeof mention, "%zu bytes", d.heads * one);
    check_status(castle_forward_workspace_size(ctx, &d, &bytes), CASTLE_ERR_WORKSPACE_TOO_LARGE, mention,
                 "one B*H more than fits");
    check_message(CASTLE_ERR_WORKSPACE_TOO_LARGE, "CL_DEVICE_MAX_MEM_ALLOC_SIZE", "one B*H more than fits");
    ck_assert_msg(bytes == d.heads * one, "WORKSPACE_TOO_LARGE reported %zu bytes, expected %zu", bytes,
                  d.heads * one);
}
END_TEST

/* castle_prefill allocates a forward's workspace itself, so it checks that size as
   castle_forward_workspace_size does: above the device's largest allocation it is
   WORKSPACE_TOO_LARGE, not the OpenCL status of a failed clCreateBuffer, and the cache is left as it
   was.  d = 1 makes the workspace (its Y blocks: 2 block floats per token) much larger than the
   tensors; the six inputs share one small buffer (zero batch and head strides), and the cache holds
   one token of a sequence whose prompt is shorter than the descriptor's seq_len.  The prefill's part
   is more than half of the whole workspace for d = 1, so twice the largest allocation of the whole
   is more than that of the part. */
START_TEST(test_prefill_workspace_too_large)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    const size_t max = max_alloc(ctx), L = 4096;
    castle_attention_desc d;
    castle_attention_desc_init(&d, 1, 1, L, 1);
    size_t one = 0;
    check_status(castle_forward_workspace_size(ctx, &d, &one), CASTLE_SUCCESS, NULL, "B*H=1, L=4096, d=1");
    d.heads = 2 * (max / one) + 2;
    const size_t H = d.heads;
    castle_cache *cache = NULL;
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, 1, H, 1, 1);
    check_status(castle_cache_create(ctx, &cd, &cache), CASTLE_SUCCESS, NULL, "a one-token cache");
    const cl_context clc = castle_context_cl_context(ctx);
    const cl_command_queue q = castle_context_queue(ctx);
    cl_mem in = new_buf(clc, L * sizeof(float), 1), o = new_buf(clc, H * L * sizeof(float), -1);
    for (int t = 0; t < CASTLE_TENSOR_O; ++t) {
        d.layout[t].batch_stride = 0;
        d.layout[t].head_stride = 0;
        d.layout[t].row_stride = 1;
    }
    const size_t lengths[1] = {1};
    char what[96];
    snprintf(what, sizeof what, "prefill of H=%zu, L=%zu, d=1 (largest allocation %zu bytes)", H, L, max);
    check_status(castle_prefill(ctx, cache, &d, lengths, in, in, in, in, in, in, o, NULL, q, 0, NULL, NULL),
                 CASTLE_ERR_WORKSPACE_TOO_LARGE, "CL_DEVICE_MAX_MEM_ALLOC_SIZE", what);
    size_t len[1] = {12345};
    check_status(castle_cache_lengths(cache, len), CASTLE_SUCCESS, NULL, "lengths after the refused prefill");
    ck_assert_msg(len[0] == 0, "the refused prefill left %zu tokens in the cache", len[0]);
    clReleaseMemObject(in);
    clReleaseMemObject(o);
    castle_cache_destroy(cache);
}
END_TEST

START_TEST(test_row_stride_too_small)
{
    fx f;
    fx_setup(&f);
    const size_t H = f.desc.heads, L = f.desc.seq_len, d = f.desc.head_dim;
    const size_t width = _i == CASTLE_TENSOR_LSE ? 1 : d;
    castle_attention_desc desc = f.desc;
    desc.layout[_i].row_stride = width - 1; /* 0 for lse */
    desc.layout[_i].head_stride = L * width;
    desc.layout[_i].batch_stride = H * L * width;
    fwd_args a = fx_args(&f);
    a.desc = &desc;
    char mention[64];
    snprintf(mention, sizeof mention, "%s row_stride=%zu", buf_names[_i], width - 1);
    expect_reject(&f, &a, CASTLE_ERR_BAD_STRIDE, mention, mention);
    fx_teardown(&f);
}
END_TEST

/* castle_forward checks the layouts of the tensors it takes, no others (castle.h, castle_layout): with
   d_o's and the gradients' made invalid (a row stride below d, an extent that overflows, rows that
   overlap) it runs, and O and lse are bitwise the plain descriptor's.  They were BAD_STRIDE. */
START_TEST(test_unused_layouts)
{
    fx f;
    fx_setup(&f);
    const size_t d = f.desc.head_dim;
    castle_attention_desc desc = f.desc;
    desc.layout[CASTLE_TENSOR_DO] = (castle_layout){0, 0, d - 1};
    desc.layout[CASTLE_TENSOR_DQU] = (castle_layout){SIZE_MAX / 2, 0, d};
    desc.layout[CASTLE_TENSOR_DVC] = (castle_layout){1, 1, d};
    unsigned char *out[2][2];
    for (int r = 0; r < 2; ++r) {
        fwd_args a = fx_args(&f);
        if (r)
            a.desc = &desc;
        expect_success(&f, &a, r ? "unused layouts invalid" : "plain descriptor");
        for (int t = CASTLE_TENSOR_O; t <= CASTLE_TENSOR_LSE; ++t)
            out[r][t - CASTLE_TENSOR_O] = read_all(f.q, f.buf[t], f.bytes[t]);
        fx_reset_outputs(&f);
    }
    for (int t = CASTLE_TENSOR_O; t <= CASTLE_TENSOR_LSE; ++t) {
        ck_assert_msg(!memcmp(out[0][t - CASTLE_TENSOR_O], out[1][t - CASTLE_TENSOR_O], f.bytes[t]),
                      "%s differs under the unused layouts", buf_names[t]);
        free(out[0][t - CASTLE_TENSOR_O]);
        free(out[1][t - CASTLE_TENSOR_O]);
    }
    fx_teardown(&f);
}
END_TEST

/* Output rows that overlap are rejected; the same layouts on inputs are legal (broadcast reads). */
START_TEST(test_output_overlap)
{
    fx f;
    fx_setup(&f);
    const size_t H = f.desc.heads, L = f.desc.seq_len, d = f.desc.head_dim;
    typedef struct {
        castle_layout l;
        const char *what;
    } lay;
    const lay o_bad[] = {
        {{H * L * d, d, d}, "o head_stride=d with L packed rows"},
        {{H * L * d, L * d - 1, d}, "o heads overlapping by one element"},
        {{H * L * d, 0, d}, "o head_stride=0"},
        {{0, L * d, d}, "o batch_stride=0 with B=2"},
    };
    for (size_t i = 0; i < sizeof o_bad / sizeof o_bad[0]; ++i) {
        castle_attention_desc desc = f.desc;
        desc.layout[CASTLE_TENSOR_O] = o_bad[i].l;
        fwd_args a = fx_args(&f);
        a.desc = &desc;
        expect_reject(&f, &a, CASTLE_ERR_BAD_STRIDE, "output o ", o_bad[i].what);
    }
    const lay lse_bad[] = {
        {{H * L, 1, 1}, "lse head_stride=1 with L packed positions"},
        {{H * L, L - 1, 1}, "lse heads overlapping by one position"},
    };
    for (size_t i = 0; i < sizeof lse_bad / sizeof lse_bad[0]; ++i) {
        castle_attention_desc desc = f.desc;
        desc.layout[CASTLE_TENSOR_LSE] = lse_bad[i].l;
        fwd_args a = fx_args(&f);
        a.desc = &desc;
        expect_reject(&f, &a, CASTLE_ERR_BAD_STRIDE, "output lse ", lse_bad[i].what);
    }
    /* the first overlapping layout on each input in turn is accepted and computes */
    for (int t = 0; t < 6; ++t) {
        castle_attention_desc desc = f.desc;
        desc.layout[t] = o_bad[0].l;
        fwd_args a = fx_args(&f);
        a.desc = &desc;
        char what[96];
        snprintf(what, sizeof what, "%s with overlapping rows (an input)", buf_names[t]);
        expect_success(&f, &a, what);
        fx_reset_outputs(&f);
    }
    /* a disjoint non-packed output layout, (B, L, H, d), is accepted */
    castle_attention_desc desc = f.desc;
    castle_attention_desc_set_blhd(&desc);
    fwd_args a = fx_args(&f);
    a.desc = &desc;
    expect_success(&f, &a, "(B, L, H, d) layouts");
    fx_teardown(&f);
}
END_TEST

START_TEST(test_buffer_too_small)
{
    fx f;
    fx_setup(&f);
    fwd_args a = fx_args(&f);
    cl_mem small = new_buf(f.clc, f.bytes[_i] - sizeof(float), _i < 6 ? (int)_i : -1);
    a.buf[_i] = small;
    char mention[64], what[64];
    snprintf(mention, sizeof mention, "buffer %s ", buf_names[_i]);
    snprintf(what, sizeof what, "%s one float too small", buf_names[_i]);
    expect_reject(&f, &a, CASTLE_ERR_BUFFER_TOO_SMALL, mention, what);
    clReleaseMemObject(small);
    fx_teardown(&f);
}
END_TEST

START_TEST(test_workspace_too_small)
{
    fx f;
    fx_setup(&f);
    const size_t sizes[] = {f.bytes[WS] - 1, f.bytes[WS] - sizeof(float), 1};
    static const char *const names[] = {"one byte", "one float", "1 byte in all"};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        cl_mem small = new_buf(f.clc, sizes[i], -1);
        fwd_args a = fx_args(&f);
        a.buf[WS] = small;
        char what[64];
        snprintf(what, sizeof what, "workspace %s too small", names[i]);
        expect_reject(&f, &a, CASTLE_ERR_WORKSPACE_TOO_SMALL, "workspace", what);
        clReleaseMemObject(small);
    }
    fx_teardown(&f);
}
END_TEST

START_TEST(test_wait_list)
{
    fx f;
    fx_setup(&f);
    cl_int err = CL_SUCCESS;
    cl_event user = clCreateUserEvent(f.clc, &err);
    ck_assert_msg(user != NULL, "clCreateUserEvent: %d", (int)err);
    ck_assert(clSetUserEventStatus(user, CL_COMPLETE) == CL_SUCCESS);
    const cl_event list[1] = {user};
    const cl_event null_list[1] = {NULL};

    fwd_args a = fx_args(&f);
    a.nwait = 1;
    a.wait = NULL;
    expect_reject(&f, &a, CASTLE_ERR_WAIT_LIST, "num_wait_events=1", "num_wait_events=1 with a NULL list");
    a.nwait = 0;
    a.wait = list;
    expect_reject(&f, &a, CASTLE_ERR_WAIT_LIST, "num_wait_events=0", "num_wait_events=0 with a list");
    a.nwait = 1;
    a.wait = null_list;
    expect_reject(&f, &a, CASTLE_ERR_WAIT_LIST, "wait_events[0]", "a NULL event in the list");
    /* an event that ended in an error (PoCL 3.1 aborted the process on one in a wait list) */
    cl_event done = clCreateUserEvent(f.clc, &err), failed = clCreateUserEvent(f.clc, &err);
    ck_assert_msg(done && failed, "clCreateUserEvent: %d", (int)err);
    ck_assert(clSetUserEventStatus(done, CL_COMPLETE) == CL_SUCCESS && clSetUserEventStatus(failed, -7) == CL_SUCCESS);
    const cl_event failed_list[2] = {done, failed};
    a.nwait = 2;
    a.wait = failed_list;
    expect_reject(&f, &a, CASTLE_ERR_WAIT_LIST, "wait_events[1] ended in error -7", "an event that ended in an error");
    clReleaseEvent(done);
    clReleaseEvent(failed);
    a.nwait = 1;
    a.wait = list;
    expect_success(&f, &a, "a valid one-event wait list");
    clReleaseEvent(user);
    fx_teardown(&f);
}
END_TEST

/* A second OpenCL context on the same device. */
static cl_context other_context(fx *f)
{
    cl_device_id dev = castle_context_device(f->ctx);
    cl_int err = CL_SUCCESS;
    cl_context c = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    ck_assert_msg(c != NULL, "clCreateContext: %d", (int)err);
    ck_assert(c != f->clc);
    return c;
}

START_TEST(test_queue_other_context)
{
    fx f;
    fx_setup(&f);
    cl_context c2 = other_context(&f);
    cl_device_id dev = castle_context_device(f.ctx);
    cl_int err = CL_SUCCESS;
    cl_command_queue q2 = clCreateCommandQueue(c2, dev, 0, &err);
    ck_assert_msg(q2 != NULL, "clCreateCommandQueue: %d", (int)err);
    fwd_args a = fx_args(&f);
    a.queue = q2;
    expect_reject(&f, &a, CASTLE_ERR_QUEUE_MISMATCH, "OpenCL context", "a queue of another cl_context");
    clFinish(q2);
    clReleaseCommandQueue(q2);
    clReleaseContext(c2);
    fx_teardown(&f);
}
END_TEST

/* An event of another context in the wait list: refused before anything is enqueued (PoCL took one
   and the call ran without waiting for it; an event never completed then hung the queue). */
START_TEST(test_wait_list_other_context)
{
    fx f;
    fx_setup(&f);
    cl_context c2 = other_context(&f);
    cl_int err = CL_SUCCESS;
    cl_event foreign = clCreateUserEvent(c2, &err);
    ck_assert_msg(foreign != NULL, "clCreateUserEvent: %d", (int)err);
    const cl_event list[1] = {foreign};
    fwd_args a = fx_args(&f);
    a.nwait = 1;
    a.wait = list;
    expect_reject(&f, &a, CASTLE_ERR_WAIT_LIST, "wait_events[0] belongs to another OpenCL context",
                  "an event of another cl_context");
    ck_assert(clSetUserEventStatus(foreign, CL_COMPLETE) == CL_SUCCESS);
    clReleaseEvent(foreign);
    clReleaseContext(c2);
    fx_teardown(&f);
}
END_TEST

START_TEST(test_buffer_other_context)
{
    fx f;
    fx_setup(&f);
    cl_context c2 = other_context(&f);
    cl_mem foreign = new_buf(c2, f.bytes[_i], _i < 6 ? (int)_i : -1);
    fwd_args a = fx_args(&f);
    a.buf[_i] = foreign;
    char mention[96], what[64];
    snprintf(mention, sizeof mention, "buffer %s belongs to another", buf_names[_i]);
    snprintf(what, sizeof what, "%s from another cl_context", buf_names[_i]);
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, mention, what);
    clReleaseMemObject(foreign);
    clReleaseContext(c2);
    fx_teardown(&f);
}
END_TEST

/* Access flags: each buffer created with the one flag the call cannot use (an input
   CL_MEM_WRITE_ONLY; o CL_MEM_WRITE_ONLY: the forward adds into it; lse and the workspace
   CL_MEM_READ_ONLY): refused, naming the buffer, with nothing written.  Kernels reading a
   write-only buffer or writing a read-only one are undefined behaviour (Oclgrind reports them). */
START_TEST(test_buffer_access)
{
    fx f;
    fx_setup(&f);
    const bool input = _i < CASTLE_TENSOR_O;
    const cl_mem_flags flags = input || _i == CASTLE_TENSOR_O ? CL_MEM_WRITE_ONLY : CL_MEM_READ_ONLY;
    cl_mem m = new_buf_flags(f.clc, f.bytes[_i], -1, flags);
    fwd_args a = fx_args(&f);
    a.buf[_i] = m;
    char mention[96], what[64];
    snprintf(mention, sizeof mention, "buffer %s is %s", buf_names[_i],
             flags == CL_MEM_WRITE_ONLY ? "CL_MEM_WRITE_ONLY" : "CL_MEM_READ_ONLY");
    snprintf(what, sizeof what, "%s with the wrong access flag", buf_names[_i]);
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, mention, what);
    clReleaseMemObject(m);
    fx_teardown(&f);
}
END_TEST

/* The flags a call can use are taken: read-only inputs and a write-only lse (the forward only writes
   it); o read-only is refused; the backward's gradients, which it adds into, must be readable; the
   causal forward, which only writes o and lse, takes them write-only; an image is no tensor. */
START_TEST(test_buffer_access_kinds)
{
    fx f;
    fx_setup(&f);
    cl_int err = CL_SUCCESS;
    fwd_args a = fx_args(&f);
    cl_mem ro[6], lse_w = new_buf_flags(f.clc, f.bytes[CASTLE_TENSOR_LSE], -1, CL_MEM_WRITE_ONLY);
    for (int t = 0; t < 6; ++t)
        a.buf[t] = ro[t] = new_buf_flags(f.clc, f.bytes[t], t, CL_MEM_READ_ONLY);
    a.buf[CASTLE_TENSOR_LSE] = lse_w;
    expect_success(&f, &a, "read-only inputs, write-only lse");
    fx_reset_outputs(&f);

    a = fx_args(&f);
    cl_mem o_r = new_buf_flags(f.clc, f.bytes[CASTLE_TENSOR_O], -1, CL_MEM_READ_ONLY);
    a.buf[CASTLE_TENSOR_O] = o_r;
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "buffer o is CL_MEM_READ_ONLY; the call writes it",
                  "read-only o");
    clReleaseMemObject(o_r);

    /* the backward: d_qc write-only is refused (it is read too), before anything runs */
    cl_mem g[7];
    for (int t = 0; t < 7; ++t)
        g[t] = new_buf_flags(f.clc, f.bytes[0], -1, t == 4 ? CL_MEM_WRITE_ONLY : CL_MEM_READ_WRITE);
    castle_status st = castle_backward(f.ctx, &f.desc, f.buf[0], f.buf[1], f.buf[2], f.buf[3], f.buf[4], f.buf[5],
                                       f.buf[6], f.buf[7], f.buf[WS], g[0], g[1], g[2], g[3], g[4], g[5], g[6], f.q,
                                       0, NULL, NULL);
    check_status(st, CASTLE_ERR_INVALID_ARGUMENT, "buffer d_qc is CL_MEM_WRITE_ONLY; the call reads it as well",
                 "castle_backward with a write-only d_qc");

    /* the causal forward only writes: write-only o and lse are taken */
    cl_mem o_w = new_buf_flags(f.clc, f.bytes[CASTLE_TENSOR_O], -1, CL_MEM_WRITE_ONLY);
    st = castle_causal_forward(f.ctx, &f.desc, ro[3], ro[4], ro[5], o_w, lse_w, f.q, 0, NULL, NULL);
    check_status(st, CASTLE_SUCCESS, NULL, "castle_causal_forward with write-only outputs");
    ck_assert_int_eq(clFinish(f.q), CL_SUCCESS);

    /* an image in a tensor's place */
    cl_bool images = CL_FALSE;
    cl_device_id dev = castle_context_device(f.ctx);
    ck_assert_int_eq(clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL), CL_SUCCESS);
    if (images) {
        const cl_image_format fmt = {CL_R, CL_FLOAT};
        cl_image_desc id;
        memset(&id, 0, sizeof id);
        id.image_type = CL_MEM_OBJECT_IMAGE2D;
        id.image_width = 64;
        id.image_height = 64; /* 16 KiB: larger than any tensor of the fixture */
        cl_mem img = clCreateImage(f.clc, CL_MEM_READ_WRITE, &fmt, &id, NULL, &err);
        ck_assert_msg(img != NULL, "clCreateImage: %d", (int)err);
        a = fx_args(&f);
        a.buf[CASTLE_TENSOR_QC] = img;
        /* not expect_reject: its snapshot would read the image with clEnqueueReadBuffer (rusticl aborts) */
        cl_event ev = NULL;
        st = fwd(&a, &ev);
        check_status(st, CASTLE_ERR_INVALID_ARGUMENT, "qc is a memory object of type", "an image as qc");
        ck_assert_msg(ev == NULL, "an image as qc: the rejected call returned an event");
        clReleaseMemObject(img);
    }
    for (int t = 0; t < 7; ++t)
        clReleaseMemObject(g[t]);
    for (int t = 0; t < 6; ++t)
        clReleaseMemObject(ro[t]);
    clReleaseMemObject(o_w);
    clReleaseMemObject(lse_w);
    fx_teardown(&f);
}
END_TEST

/* o (and lse, workspace) passed as the same cl_mem as another argument.  Where the aliased buffer is
   smaller than the output needs, the larger one is passed in the input's place. */
START_TEST(test_output_aliases)
{
    fx f;
    fx_setup(&f);
    for (int t = 0; t < 6; ++t) { /* o is an input (same size, packed, same d) */
        fwd_args a = fx_args(&f);
        a.buf[CASTLE_TENSOR_O] = f.buf[t];
        char mention[96];
        snprintf(mention, sizeof mention, "output o is the same buffer as %s", buf_names[t]);
        expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, mention, mention);
    }
    fwd_args a = fx_args(&f);
    a.buf[CASTLE_TENSOR_LSE] = f.buf[CASTLE_TENSOR_KC];
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "output lse is the same buffer as kc", "lse = kc");
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_LSE] = f.buf[CASTLE_TENSOR_O];
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "the same buffer as", "lse = o");
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_QU] = f.buf[WS];
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "workspace is the same buffer as qu", "workspace = qu");
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_O] = f.buf[WS];
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "workspace is the same buffer as o", "workspace = o");
    /* inputs may share a buffer */
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_KU] = f.buf[CASTLE_TENSOR_QU];
    a.buf[CASTLE_TENSOR_KC] = f.buf[CASTLE_TENSOR_QC];
    expect_success(&f, &a, "ku = qu and kc = qc");
    fx_teardown(&f);
}
END_TEST

/* Sub-buffers: o overlapping an input's bytes inside one parent buffer is rejected; sub-buffers
   of one parent that do not overlap are fine. */
START_TEST(test_subbuffer_overlap)
{
    fx f;
    fx_setup(&f);
    cl_uint align_bits = 1024;
    clGetDeviceInfo(castle_context_device(f.ctx), CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    const size_t align = align_bits / 8, obytes = f.bytes[CASTLE_TENSOR_O];
    const size_t stride = (obytes + align - 1) / align * align; /* aligned slot per sub-buffer */
    cl_mem parent = new_buf(f.clc, 3 * stride, -1);
    cl_int err;
    cl_buffer_region r0 = {0, obytes}, r1 = {align, obytes}, r2 = {2 * stride, obytes};
    cl_mem s0 = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r0, &err);
    cl_mem s1 = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r1, &err);
    cl_mem s2 = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &r2, &err);
    ck_assert(s0 && s1 && s2);
    /* qu and o in overlapping byte ranges of one parent */
    fwd_args a = fx_args(&f);
    a.buf[CASTLE_TENSOR_QU] = s0;
    a.buf[CASTLE_TENSOR_O] = s1;
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "output o overlaps qu", "o overlapping qu");
    /* o overlapping the whole parent used as an input */
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_VC] = parent;
    a.buf[CASTLE_TENSOR_O] = s2;
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "output o overlaps vc", "o inside vc's buffer");
    /* disjoint sub-buffers of one parent: accepted and computed */
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_QU] = s0;
    a.buf[CASTLE_TENSOR_O] = s2;
    float *qu = (float *)read_all(f.q, f.buf[CASTLE_TENSOR_QU], f.bytes[CASTLE_TENSOR_QU]);
    ck_assert(clEnqueueWriteBuffer(f.q, s0, CL_TRUE, 0, f.bytes[CASTLE_TENSOR_QU], qu, 0, NULL, NULL) == CL_SUCCESS);
    free(qu);
    expect_success(&f, &a, "qu and o in disjoint sub-buffers of one buffer");
    clReleaseMemObject(s0);
    clReleaseMemObject(s1);
    clReleaseMemObject(s2);
    clReleaseMemObject(parent);
    fx_teardown(&f);
}
END_TEST

/* Two cl_mem objects made with CL_MEM_USE_HOST_PTR over the same host memory are one memory: an
   output over an input's host array is rejected (it gave wrong outputs); inputs may share it. */
START_TEST(test_host_ptr_overlap)
{
    fx f;
    fx_setup(&f);
    const size_t qbytes = f.bytes[CASTLE_TENSOR_QU], obytes = f.bytes[CASTLE_TENSOR_O];
    const size_t wsbytes = f.bytes[WS];
    const size_t n = (qbytes + obytes + wsbytes + 4096) / 4096 * 4096 + 4096;
    float *host = aligned_alloc(4096, n);
    ck_assert(host != NULL);
    for (size_t i = 0; i < n / sizeof(float); ++i)
        host[i] = (float)h_value(42, 0, 0, 0, 0, i);
    cl_int err;
    const cl_mem_flags fl = CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR;
    cl_mem q_at0 = clCreateBuffer(f.clc, fl, qbytes, host, &err);
    cl_mem o_at0 = clCreateBuffer(f.clc, fl, obytes, host, &err);
    cl_mem o_inside = clCreateBuffer(f.clc, fl, obytes, host + 16, &err); /* starts inside qu's range */
    cl_mem o_after = clCreateBuffer(f.clc, fl, obytes, (char *)host + (qbytes + 4095) / 4096 * 4096, &err);
    cl_mem k_at0 = clCreateBuffer(f.clc, fl, qbytes, host, &err);
    cl_mem ws_inside = clCreateBuffer(f.clc, fl, wsbytes, host + 16, &err);
    ck_assert(q_at0 && o_at0 && o_inside && o_after && k_at0 && ws_inside);
    fwd_args a = fx_args(&f);
    a.buf[CASTLE_TENSOR_QU] = q_at0;
    a.buf[CASTLE_TENSOR_O] = o_at0;
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "output o overlaps qu (CL_MEM_USE_HOST_PTR",
                  "o and qu over the same host array");
    a.buf[CASTLE_TENSOR_O] = o_inside;
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "output o overlaps qu", "o over part of qu's host array");
    a.buf[CASTLE_TENSOR_O] = f.buf[CASTLE_TENSOR_O];
    a.buf[WS] = ws_inside; /* the workspace counts as an output */
    expect_reject(&f, &a, CASTLE_ERR_INVALID_ARGUMENT, "workspace overlaps qu", "workspace over qu's host array");
    /* disjoint host ranges, and two inputs over one host array: accepted and computed */
    a = fx_args(&f);
    a.buf[CASTLE_TENSOR_QU] = q_at0;
    a.buf[CASTLE_TENSOR_KU] = k_at0;
    a.buf[CASTLE_TENSOR_O] = o_after;
    fill_sentinel(f.q, o_after, obytes);
    expect_success(&f, &a, "qu, ku and o over disjoint parts of host memory (qu and ku shared)");
    clReleaseMemObject(q_at0);
    clReleaseMemObject(o_at0);
    clReleaseMemObject(o_inside);
    clReleaseMemObject(o_after);
    clReleaseMemObject(k_at0);
    clReleaseMemObject(ws_inside);
    fx_teardown(&f);
    free(host);
}
END_TEST

/* The dedicated check: a call rejected late (lse one float short, after every other buffer passed)
   leaves O, lse and the workspace bit for bit as they were, margins included. */
START_TEST(test_nothing_written)
{
    fx f;
    fx_setup(&f);
    cl_device_id dev = castle_context_device(f.ctx);
    const size_t o_span = f.bytes[CASTLE_TENSOR_O] / sizeof(float);
    const size_t lse_span = f.bytes[CASTLE_TENSOR_LSE] / sizeof(float);
    const size_t ws_span = f.bytes[WS] / sizeof(float);
    h_guarded go, gl, gw;
    ck_assert(h_guarded_create(f.clc, dev, &go, o_span));
    ck_assert(h_guarded_create(f.clc, dev, &gl, lse_span - 1));
    ck_assert(h_guarded_create(f.clc, dev, &gw, ws_span));
    ck_assert(h_guarded_write(f.q, &go, NULL) && h_guarded_write(f.q, &gl, NULL) && h_guarded_write(f.q, &gw, NULL));
    fwd_args a = fx_args(&f);
    a.buf[CASTLE_TENSOR_O] = go.view;
    a.buf[CASTLE_TENSOR_LSE] = gl.view;
    a.buf[WS] = gw.view;
    cl_event ev = NULL;
    castle_status st = fwd(&a, &ev);
    check_status(st, CASTLE_ERR_BUFFER_TOO_SMALL, "buffer lse ", "lse one float too small");
    ck_assert(ev == NULL);
    clFinish(f.q);
    bool *none = calloc(ws_span + 1, sizeof(bool)); /* no element is "used": all must hold the sentinel */
    ck_assert(none != NULL);
    ck_assert_msg(h_guarded_read(f.q, &go, NULL, none), "the rejected call wrote O");
    ck_assert_msg(h_guarded_read(f.q, &gl, NULL, none), "the rejected call wrote lse");
    ck_assert_msg(h_guarded_read(f.q, &gw, NULL, none), "the rejected call wrote the workspace");
    /* the same guarded buffers with an lse of the right size: accepted, O written */
    h_guarded gl2;
    ck_assert(h_guarded_create(f.clc, dev, &gl2, lse_span));
    ck_assert(h_guarded_write(f.q, &gl2, NULL));
    a.buf[CASTLE_TENSOR_LSE] = gl2.view;
    st = fwd(&a, NULL);
    check_status(st, CASTLE_SUCCESS, NULL, "the same call with lse of the right size");
    clFinish(f.q);
    ck_assert_msg(!h_guarded_read(f.q, &go, NULL, none), "the accepted call did not write O");
    ck_assert_msg(h_guarded_read(f.q, &go, NULL, NULL), "the accepted call wrote outside O");
    free(none);
    h_guarded_release(&go);
    h_guarded_release(&gl);
    h_guarded_release(&gl2);
    h_guarded_release(&gw);
    fx_teardown(&f);
}
END_TEST

/* ---- castle_forward_workspace_size --------------------------------------------------------- */

START_TEST(test_workspace_size_args)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx != NULL, "no device: %s", castle_last_error());
    castle_attention_desc d;
    castle_attention_desc_init(&d, 2, 2, 40, 8);
    size_t bytes = 12345;
    check_status(castle_forward_workspace_size(NULL, &d, &bytes), CASTLE_ERR_NULL_CONTEXT, "castle_context",
                 "workspace_size(ctx=NULL)");
    ck_assert(bytes == 12345);
    check_status(castle_forward_workspace_size(ctx, NULL, &bytes), CASTLE_ERR_NULL_POINTER, "descriptor",
                 "workspace_size(desc=NULL)");
    ck_assert(bytes == 12345);
    check_status(castle_forward_workspace_size(ctx, &d, NULL), CASTLE_ERR_NULL_POINTER, "bytes",
                 "workspace_size(bytes=NULL)");
    d.struct_size = 1;
    check_status(castle_forward_workspace_size(ctx, &d, &bytes), CASTLE_ERR_DESC_VERSION, "struct_size",
                 "workspace_size(struct_size=1)");
    ck_assert(bytes == 12345);
    d.struct_size = sizeof d;
    check_status(castle_forward_workspace_size(ctx, &d, &bytes), CASTLE_SUCCESS, NULL, "workspace_size valid");
    ck_assert(bytes > 0 && bytes != 12345);
}
END_TEST

/* ---- contexts and device selection --------------------------------------------------------- */

static castle_context *const NOT_NULL = (castle_context *)&buf_names; /* any non-NULL address */

START_TEST(test_context_create_null_args)
{
    castle_context *shared = h_context();
    ck_assert_msg(shared != NULL, "no device: %s", castle_last_error());
    cl_context clc = castle_context_cl_context(shared);
    cl_device_id dev = castle_context_device(shared);
    castle_context *out = NOT_NULL;
    check_status(castle_context_create(clc, dev, NULL), CASTLE_ERR_NULL_POINTER, "out", "create(out=NULL)");
    check_status(castle_context_create(NULL, dev, &out), CASTLE_ERR_NULL_POINTER, "cl_context", "create(cl_ctx=NULL)");
    ck_assert_msg(out == NULL, "out not set to NULL on failure");
    out = NOT_NULL;
    check_status(castle_context_create(clc, NULL, &out), CASTLE_ERR_NULL_POINTER, "device", "create(device=NULL)");
    ck_assert_msg(out == NULL, "out not set to NULL on failure");
    check_status(castle_context_create_default("0:0", NULL), CASTLE_ERR_NULL_POINTER, "out",
                 "create_default(out=NULL)");
    /* the same arguments, valid: accepted; such a context has no queue of its own */
    check_status(castle_context_create(clc, dev, &out), CASTLE_SUCCESS, NULL, "create with valid arguments");
    ck_assert(out != NULL && out != NOT_NULL);
    ck_assert(castle_context_queue(out) == NULL);
    ck_assert(castle_context_cl_context(out) == clc && castle_context_device(out) == dev);
    castle_context_destroy(out);
}
END_TEST

/* digits only: strtol alone would take the blanks and signs of " 0", "+0", "-0", "0: 0" and "0:-0" */
static const char *const malformed_specs[] = {"x",   "1:", ":1",  "-1",   "0:0:0", "0:-1", "1x",  "0:x", ":",
                                              "99999999999999999999999", " 0", "\t0", "+0", "-0", "0: 0", "0:-0", "0:+1"};
#define NMALFORMED ((int)(sizeof malformed_specs / sizeof malformed_specs[0]))

START_TEST(test_device_spec_malformed)
{
    const char *spec = malformed_specs[_i];
    castle_context *out = NOT_NULL;
    char mention[96], what[96];
    snprintf(mention, sizeof mention, "'%s'", spec);
    snprintf(what, sizeof what, "create_default(\"%s\")", spec);
    check_status(castle_context_create_default(spec, &out), CASTLE_ERR_BAD_DEVICE_SPEC, mention, what);
    ck_assert_msg(out == NULL, "%s: out not set to NULL on failure", what);
}
END_TEST

/* castle_parse_device_spec reads device strings as castle_context_create_default does. */
START_TEST(test_parse_device_spec)
{
    long p = 7, d = 7;
    check_status(castle_parse_device_spec("2:3", &p, &d), CASTLE_SUCCESS, NULL, "parse 2:3");
    ck_assert(p == 2 && d == 3);
    check_status(castle_parse_device_spec("5", &p, &d), CASTLE_SUCCESS, NULL, "parse 5");
    ck_assert(p == -1 && d == 5);
    static const char *const bad[] = {"x", "1:", ":1", "-1", "0:0:0", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        check_status(castle_parse_device_spec(bad[i], &p, &d), CASTLE_ERR_BAD_DEVICE_SPEC, "malformed", bad[i]);
    check_status(castle_parse_device_spec(NULL, &p, &d), CASTLE_ERR_NULL_POINTER, "NULL", "parse NULL");
}
END_TEST

START_TEST(test_device_missing)
{
    static const char *const specs[] = {"99:0", "999", "0:999"};
    const char *spec = specs[_i];
    castle_context *out = NOT_NULL;
    char mention[96], what[96];
    snprintf(mention, sizeof mention, "'%s'", spec);
    snprintf(what, sizeof what, "create_default(\"%s\")", spec);
    check_status(castle_context_create_default(spec, &out), CASTLE_ERR_NO_DEVICE, mention, what);
    ck_assert_msg(out == NULL, "%s: out not set to NULL on failure", what);
}
END_TEST

START_TEST(test_device_env_malformed)
{
    char *saved = env_save("CASTLE_DEVICE");
    static const char *const bad[] = {"x", "1:", "0:0:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        setenv("CASTLE_DEVICE", bad[i], 1);
        castle_context *out = NOT_NULL;
        char what[96];
        snprintf(what, sizeof what, "CASTLE_DEVICE=%s, spec NULL", bad[i]);
        castle_status st = castle_context_create_default(NULL, &out);
        check_status(st, CASTLE_ERR_BAD_DEVICE_SPEC, "CASTLE_DEVICE", what);
        ck_assert_msg(out == NULL, "%s: out not set to NULL on failure", what);
        out = NOT_NULL;
        snprintf(what, sizeof what, "CASTLE_DEVICE=%s, spec \"\"", bad[i]);
        st = castle_context_create_default("", &out);
        check_status(st, CASTLE_ERR_BAD_DEVICE_SPEC, "CASTLE_DEVICE", what);
        ck_assert_msg(out == NULL, "%s: out not set to NULL on failure", what);
    }
    /* an explicit spec wins over the environment */
    castle_context *out = NULL;
    castle_status st = castle_context_create_default("0", &out);
    env_restore("CASTLE_DEVICE", saved);
    check_status(st, CASTLE_SUCCESS, NULL, "create_default(\"0\") with CASTLE_DEVICE malformed");
    castle_context_destroy(out);
}
END_TEST

/* ---- tuning -------------------------------------------------------------------------------- */

/* A tuning with the micro-tile left to the library (tm = tn = 0: derived). */
static castle_tuning tun(unsigned block, unsigned threads, unsigned dchunk, unsigned vector, unsigned fold)
{
    return (castle_tuning){.struct_size = sizeof(castle_tuning), .block = block, .threads = threads,
                           .dchunk = dchunk, .vector = vector, .fold = fold};
}

static castle_tuning tun_tile(unsigned block, unsigned threads, unsigned vector, unsigned tm, unsigned tn)
{
    castle_tuning t = tun(block, threads, 32, vector, 0);
    t.tm = tm;
    t.tn = tn;
    return t;
}

static castle_tuning tun_forward(unsigned fthreads, unsigned fdchunk)
{
    castle_tuning t = tun_tile(32, 64, 1, 1, 1);
    t.fthreads = fthreads;
    t.fdchunk = fdchunk;
    return t;
}

static castle_tuning tun_backward(unsigned bthreads, unsigned btm)
{
    castle_tuning t = tun_tile(32, 64, 1, 1, 1);
    t.bthreads = bthreads;
    t.btm = btm;
    return t;
}

/* tun(32, 64, 32, 0, 0) with the one parameter at byte offset off (TUN_WITH's field) set to v. */
static castle_tuning tun_with(size_t off, unsigned v)
{
    castle_tuning t = tun(32, 64, 32, 0, 0);
    memcpy((char *)&t + off, &v, sizeof v);
    return t;
}
#define TUN_WITH(field, v) tun_with(offsetof(castle_tuning, field), (v))

static bool tuning_eq(const castle_tuning *a, const castle_tuning *b)
{
    return a->block == b->block && a->threads == b->threads && a->dchunk == b->dchunk;
}

/* A context of its own, so the shared one keeps its tuning. */
static castle_context *own_context(void)
{
    castle_context *ctx = NULL;
    castle_status st = castle_context_create_default(NULL, &ctx);
    ck_assert_msg(st == CASTLE_SUCCESS, "create_default: %s", castle_last_error());
    return ctx;
}

START_TEST(test_tuning_rejected)
{
    castle_context *ctx = own_context();
    castle_tuning before;
    check_status(castle_context_get_tuning(ctx, &before), CASTLE_SUCCESS, NULL, "get_tuning");
    char name_before[64];
    snprintf(name_before, sizeof name_before, "%s", castle_context_tuning_name(ctx));

    size_t max_wg = 0;
    cl_device_id dev = castle_context_device(ctx);
    ck_assert(clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL) == CL_SUCCESS);
    /* threads over the device maximum that passes every other rule, if the rules allow one: the
       parameter list (castle.h) caps threads at THREADS_MAX */
    enum {
#define TUNING_HI_(field, macro, lo, hi, flags, help) field##_hi_ = (hi),
        CASTLE_TUNING_PARAMS(TUNING_HI_)
#undef TUNING_HI_
        THREADS_MAX = threads_hi_
    };
    castle_tuning too_wide = tun(64, 0, 64, 0, 0);
    const char *too_wide_mention = "work-group";
    for (unsigned n = 64; n <= THREADS_MAX; n *= 2)
        if (n > max_wg) {
            too_wide.threads = n;
            break;
        }
    if (!too_wide.threads) { /* max_wg >= THREADS_MAX (PoCL, rusticl): the range rule refuses any more */
        too_wide.threads = (unsigned)(max_wg * 2);
        too_wide_mention = "threads=";
    }
    /* the backward on 2 x 4 tiles over 128 work-items needs 32 x 32 slabs of its d-wide products:
       wider than dchunk = 8, which is under 3/7 of the block (CASTLE_BW_D1_WIDE) */
    castle_tuning slab_narrow = tun_tile(32, 32, 4, 2, 1);
    slab_narrow.dchunk = 8;
    slab_narrow.bthreads = 128;
    slab_narrow.btm = 2;
    typedef struct {
        castle_tuning t;
        const char *mention;
        const char *what;
    } bad_case;
    const bad_case bad[] = {
        {tun(12, 64, 32, 0, 0), "block=12", "block=12"},
        {tun(0, 64, 32, 0, 0), "block=0", "block=0"},
        {tun(128, 128, 32, 0, 0), "block=128", "block=128"},
        {tun(32, 64, 5, 0, 0), "dchunk=5", "dchunk=5"},
        {tun(32, 64, 128, 0, 0), "dchunk=128", "dchunk=128"},
        {tun(32, 48, 32, 0, 0), "threads=48", "threads=48 not a multiple of block=32"},
        {tun(32, 64, 32, 3, 0), "vector=3", "vector=3"},
        {tun(32, 64, 32, 32, 0), "vector=32", "vector=32"},
        {tun(32, 64, 8, 16, 0), "vector=16", "vector=16 not dividing dchunk=8"},
        {tun(32, 64, 32, 8, 1025), "fold=1025", "fold=1025"},
        {tun(32, 0, 32, 0, 0), "threads=0", "threads=0"},
        {tun(16, 8, 16, 0, 0), "threads=8", "threads=8 < block=16"},
        {tun(16, 512, 16, 0, 0), "threads=512", "threads=512 not dividing block*block=256"},
        {tun(8, 128, 64, 0, 0), "threads=128", "threads=128 not dividing block*block=64 (but dividing block*dchunk)"},
        {tun(32, 512, 8, 0, 0), "threads=512", "threads=512 not dividing block*dchunk=256 (but dividing block*block)"},
        {too_wide, too_wide_mention, "threads over the device's max work-group size"},
        {tun_tile(32, 64, 1, 3, 4), "tm=3", "tm=3"},
        {tun_tile(32, 64, 2, 1, 1), "vector=2", "vector=2"},
        {tun_tile(32, 64, 1, 16, 4), "tm=16", "tm=16"},
        {tun_tile(32, 64, 1, 4, 16), "tn=16", "tn=16"},
        /* tn x vector = 2^32 wraps to 0 in 32 bits: rejected by range, never divided by (it was, a SIGFPE) */
        {tun_tile(32, 64, 65536, 1, 65536), "vector=65536", "tn=65536 x vector=65536"},
        {tun_tile(32, 64, 16, 1, 4), "tn=4", "tn=4 x vector=16 not dividing block=32"},
        {tun_tile(32, 128, 1, 4, 4), "threads=128", "threads=128 x 4 x 4 tiles not dividing block*block=1024"},
        {tun_tile(32, 64, 16, 2, 1), "threads=64", "threads=64 x tm=2 x vector=16 not dividing block*block"},
        {TUN_WITH(decode, 3), "decode=3", "decode=3"},
        {TUN_WITH(stage, 3), "stage=3", "stage=3"},
        {TUN_WITH(prefetch, 2), "prefetch=2", "prefetch=2"},
        {TUN_WITH(accum, 3), "accum=3", "accum=3"},
        {tun_backward(64, 3), "btm=3", "btm=3"},
        {tun_backward(1024, 4), "bthreads=1024", "bthreads=1024 x btm=4 not dividing block*block"},
        {slab_narrow, "bthreads=128", "bthreads=128 x btm=2 x vector=4 over block*dchunk=256, dchunk < 3/7 block"},
        {tun_forward(16, 32), "fthreads=16", "fthreads=16 < block=32"},
        {tun_forward(48, 32), "fthreads=48", "fthreads=48"},
        {tun_forward(64, 5), "fdchunk=5", "fdchunk=5"},
        {tun_forward(1024, 16), "fthreads=1024", "fthreads=1024 x 1 x 1 tiles not dividing block*fdchunk=512"},
        {TUN_WITH(regs, 8), "regs=8", "regs=8 (a cap of 1 to 15)"},
        {TUN_WITH(regs, 256), "regs=256", "regs=256"},
        {TUN_WITH(fregs, 300), "fregs=300", "fregs=300"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        check_status(castle_context_set_tuning(ctx, &bad[i].t), CASTLE_ERR_BAD_TUNING, bad[i].mention, bad[i].what);
        castle_tuning now;
        check_status(castle_context_get_tuning(ctx, &now), CASTLE_SUCCESS, NULL, "get_tuning");
        ck_assert_msg(tuning_eq(&now, &before), "%s: a rejected set_tuning changed the tuning", bad[i].what);
        ck_assert_msg(!strcmp(castle_context_tuning_name(ctx), name_before),
                      "%s: a rejected set_tuning changed the name to '%s'", bad[i].what,
                      castle_context_tuning_name(ctx));
    }
    /* the backward may run on fewer work-items than block rows (bthreads=8 at block=16, a tuning
       that fits 32 KiB of local memory): accepted */
    castle_tuning few = tun(16, 16, 16, 1, 0);
    few.tm = few.tn = few.btm = 1;
    few.bthreads = 8;
    check_status(castle_context_set_tuning(ctx, &few), CASTLE_SUCCESS, NULL, "set_tuning(bthreads=8 < block=16)");
    castle_tuning got;
    check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
    ck_assert_msg(got.bthreads == 8 && got.btm == 1, "bthreads=8, btm=1 read back as %u, %u", got.bthreads, got.btm);
    ck_assert_msg(got.fthreads == 16 && got.fdchunk == 16, "fthreads, fdchunk derived as %u, %u (threads, dchunk: 16, 16)",
                  got.fthreads, got.fdchunk);
    /* the backward on slabs wider than dchunk (CASTLE_BW_SLAB: 32 work-items x 2 x 4 tiles over a
       block of 16 need 16 columns, dchunk is 8, at least 3/7 of the block): accepted, 12 KiB */
    castle_tuning slab = tun(16, 16, 8, 4, 0);
    slab.tm = 2;
    slab.tn = 1;
    slab.bthreads = 32;
    slab.btm = 2;
    check_status(castle_context_set_tuning(ctx, &slab), CASTLE_SUCCESS, NULL,
                 "set_tuning(a backward slab of 16 > dchunk=8)");
    check_status(castle_context_set_tuning(ctx, &few), CASTLE_SUCCESS, NULL, "set_tuning(bthreads=8 < block=16)");
    /* the forward on its own work-group size and d chunk (fthreads=32 > threads, fdchunk=8 < dchunk) */
    castle_tuning own = few;
    own.fthreads = 32;
    own.fdchunk = 8;
    check_status(castle_context_set_tuning(ctx, &own), CASTLE_SUCCESS, NULL, "set_tuning(fthreads=32, fdchunk=8)");
    check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
    ck_assert_msg(got.fthreads == 32 && got.fdchunk == 8 && got.threads == 16 && got.dchunk == 16,
                  "fthreads=32, fdchunk=8 read back as %u, %u (threads %u, dchunk %u)", got.fthreads, got.fdchunk,
                  got.threads, got.dchunk);
    check_status(castle_context_set_tuning(ctx, &before), CASTLE_SUCCESS, NULL, "set_tuning(the former tuning)");
    /* a register cap: NVIDIA's -cl-nv-maxrregcount, refused by name where the device lacks
       cl_nv_compiler_options (PoCL, rusticl), else taken, fregs derived from regs */
    char ext[8192] = "";
    ck_assert(clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL) == CL_SUCCESS);
    castle_tuning capped = before;
    capped.regs = 96;
    capped.fregs = 0;
    if (strstr(ext, "cl_nv_compiler_options")) {
        check_status(castle_context_set_tuning(ctx, &capped), CASTLE_SUCCESS, NULL, "set_tuning(regs=96)");
        check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
        ck_assert_msg(got.regs == 96 && got.fregs == 96, "regs=96 read back as regs=%u, fregs=%u (fregs: regs)",
                      got.regs, got.fregs);
        check_status(castle_context_set_tuning(ctx, &before), CASTLE_SUCCESS, NULL, "set_tuning(the former tuning)");
    } else {
        check_status(castle_context_set_tuning(ctx, &capped), CASTLE_ERR_BAD_TUNING, "cl_nv_compiler_options",
                     "set_tuning(regs=96) on a device without cl_nv_compiler_options");
        capped.regs = 0;
        capped.fregs = 64;
        check_status(castle_context_set_tuning(ctx, &capped), CASTLE_ERR_BAD_TUNING, "fregs=64",
                     "set_tuning(fregs=64) on a device without cl_nv_compiler_options");
    }
    castle_tuning t = tun(16, 64, 16, 0, 0);
    castle_tuning old_size = t;
    old_size.struct_size = sizeof(castle_tuning) - sizeof(unsigned);
    check_status(castle_context_set_tuning(ctx, &old_size), CASTLE_ERR_DESC_VERSION, "struct_size",
                 "set_tuning(struct_size too small)");
    check_status(castle_context_set_tuning(NULL, &t), CASTLE_ERR_NULL_CONTEXT, "context", "set_tuning(ctx=NULL)");
    check_status(castle_context_set_tuning(ctx, NULL), CASTLE_ERR_NULL_POINTER, "tuning", "set_tuning(tuning=NULL)");
    check_status(castle_context_get_tuning(NULL, &t), CASTLE_ERR_NULL_CONTEXT, "context", "get_tuning(ctx=NULL)");
    check_status(castle_context_get_tuning(ctx, NULL), CASTLE_ERR_NULL_POINTER, "out", "get_tuning(out=NULL)");
    const char *nm = castle_context_tuning_name(NULL);
    ck_assert_msg(nm != NULL && nm[0] == '\0', "castle_context_tuning_name(NULL) is not \"\"");
    castle_context_destroy(ctx);
}
END_TEST

START_TEST(test_tuning_accepted)
{
    castle_context *ctx = own_context();
    const castle_tuning t = tun(16, 64, 16, 0, 0);
    check_status(castle_context_set_tuning(ctx, &t), CASTLE_SUCCESS, NULL, "set_tuning {16, 64, 16}");
    castle_tuning got;
    check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
    ck_assert_msg(tuning_eq(&got, &t), "get_tuning gives {%u, %u, %u}, set {16, 64, 16}", got.block, got.threads,
                  got.dchunk);
    ck_assert_msg(!strcmp(castle_context_tuning_name(ctx), "api"), "tuning name '%s', expected 'api'",
                  castle_context_tuning_name(ctx));
    /* it computes: the fixture's baseline call runs under block 16 */
    fx f;
    fx_setup_on(&f, ctx, 2, 2, 40, 8, true);
    /* block 32 (dchunk 8) needs more local memory than the OpenCL minimum of 32 KiB: whether it is
       accepted depends on the device, so the expectation comes from the device's local memory. */
    cl_ulong lmem = 0;
    ck_assert(clGetDeviceInfo(castle_context_device(ctx), CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL) ==
              CL_SUCCESS);
    const castle_tuning t32 = tun(32, 64, 8, 0, 0);
    castle_status st = castle_context_set_tuning(ctx, &t32);
    ck_assert_msg(st == CASTLE_SUCCESS || st == CASTLE_ERR_BAD_TUNING, "set_tuning {32, 64, 8}: %s",
                  castle_status_string(st));
    const castle_tuning *small = &t, *big = &t32;
    const castle_tuning t8 = tun(8, 8, 8, 0, 0); /* fits every device */
    if (st == CASTLE_ERR_BAD_TUNING) {
        /* rejected: only for want of local memory, and the message says how much each side has */
        const char *msg = castle_last_error(), *at = strstr(msg, "needs ");
        unsigned long long need = 0, has = 0;
        ck_assert_msg(at && sscanf(at, "needs %llu bytes of local memory; the device has %llu", &need, &has) == 2,
                      "rejection of {32, 64, 8} does not state the local memory: %s", msg);
        ck_assert_msg(has == lmem && need > lmem, "{32, 64, 8} rejected: needs %llu bytes, device has %llu (says %llu)",
                      need, (unsigned long long)lmem, has);
        check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
        ck_assert_msg(tuning_eq(&got, &t), "a rejected tuning changed the context's");
        /* the workspace check one size down: a block-8 workspace under block 16 */
        fx_teardown(&f);
        check_status(castle_context_set_tuning(ctx, &t8), CASTLE_SUCCESS, NULL, "set_tuning {8, 8, 8}");
        fx_setup_on(&f, ctx, 2, 2, 40, 8, true);
        small = &t8;
        big = &t;
        check_status(castle_context_set_tuning(ctx, big), CASTLE_SUCCESS, NULL, "set_tuning {16, 64, 16}");
    }
    /* a workspace sized under the smaller block is too small under the bigger one */
    size_t need = 0;
    check_status(castle_forward_workspace_size(ctx, &f.desc, &need), CASTLE_SUCCESS, NULL, "workspace_size");
    ck_assert_msg(need > f.bytes[WS], "block %u needs %zu workspace bytes, block %u %zu", big->block, need,
                  small->block, f.bytes[WS]);
    fwd_args a = fx_args(&f);
    expect_reject(&f, &a, CASTLE_ERR_WORKSPACE_TOO_SMALL, "workspace", "a workspace sized under a smaller block");
    fx_teardown(&f);
    castle_context_destroy(ctx);
}
END_TEST

/* A micro-tile left to the library (vector, tm, tn 0) is narrowed until it fits every kernel's own
   shape, not only the block products' (threads, dchunk): a given fdchunk = 4 narrows the vector as
   dchunk = 4 would, and a given bthreads or fthreads of 256 over block 16 narrows the tile until
   256 of them divide the block's 256 entries (CPUs' derived vector of 16 was refused, BAD_TUNING). */
START_TEST(test_tuning_narrows_for_every_kernel)
{
    castle_context *ctx = own_context();
    size_t max_wg = 0;
    ck_assert(clGetDeviceInfo(castle_context_device(ctx), CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg,
                              NULL) == CL_SUCCESS);
    for (int k = 0; k < 3; ++k) {
        castle_tuning t = tun(16, 64, 16, 0, 0), got;
        const char *what = k == 0 ? "fdchunk=4" : k == 1 ? "bthreads=256" : "fthreads=256";
        if (k == 0)
            t.fdchunk = 4;
        else if (max_wg < 256)
            continue; /* the device cannot run such work-groups at all */
        else if (k == 1)
            t.bthreads = 256;
        else
            t.fthreads = 256;
        check_status(castle_context_set_tuning(ctx, &t), CASTLE_SUCCESS, NULL, what);
        check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
        const unsigned cols = got.tn * got.vector;
        if (k == 0)
            ck_assert_msg(got.fdchunk == 4 && 4 % cols == 0, "%s: tn x vector = %u", what, cols);
        else
            ck_assert_msg(256 * (k == 1 ? got.btm : got.tm) * cols <= 256, "%s: tm %u btm %u tn x vector %u", what,
                          got.tm, got.btm, cols);
    }
    castle_context_destroy(ctx);
}
END_TEST

/* The forward's state in a workspace is for a backward under the same tuning (castle.h): after
   castle_context_set_tuning to another block, a backward on that workspace is refused, naming both
   tunings (it ran, and its gradients were off by up to 0.7), until a forward under the new tuning
   writes it again. */
START_TEST(test_tuning_changed_between_passes)
{
    castle_context *ctx = own_context();
    const castle_tuning t16 = tun(16, 64, 16, 0, 0), t8 = tun(8, 8, 8, 0, 0);
    check_status(castle_context_set_tuning(ctx, &t16), CASTLE_SUCCESS, NULL, "set_tuning {16, 64, 16}");
    fx f;
    fx_setup_on(&f, ctx, 1, 2, 40, 8, true); /* a forward on the workspace under block 16 */
    cl_mem g[7];
    for (int k = 0; k < 7; ++k)
        g[k] = new_buf(f.clc, f.bytes[0], k == 0 ? 9 : -1); /* dO, then the six gradients */
    cl_mem *m = f.buf;
    fwd_args a = fx_args(&f);
#define BACKWARD()                                                                                                     \
    castle_backward(ctx, &f.desc, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[WS], g[0], g[1], g[2], g[3], g[4], \
                    g[5], g[6], f.q, 0, NULL, NULL)
    check_status(BACKWARD(), CASTLE_SUCCESS, NULL, "backward under the forward's tuning");
    check_status(castle_context_set_tuning(ctx, &t8), CASTLE_SUCCESS, NULL, "set_tuning {8, 8, 8}");
    check_status(BACKWARD(), CASTLE_ERR_INVALID_ARGUMENT, "run the forward again", "backward after set_tuning");
    check_message(CASTLE_ERR_INVALID_ARGUMENT, "block=16", "backward after set_tuning: the forward's tuning");
    check_message(CASTLE_ERR_INVALID_ARGUMENT, "block=8", "backward after set_tuning: the tuning now");
    check_status(fwd(&a, NULL), CASTLE_SUCCESS, NULL, "forward under block 8"); /* its workspace is large enough */
    check_status(BACKWARD(), CASTLE_SUCCESS, NULL, "backward after the forward under block 8");
#undef BACKWARD
    clFinish(f.q);
    for (int k = 0; k < 7; ++k)
        clReleaseMemObject(g[k]);
    fx_teardown(&f);
    castle_context_destroy(ctx);
}
END_TEST

/* The first NMALFORMED are malformed (named by the variable), the rest well-formed bad values. */
static const char *const bad_tuning_env[] = {"block=abc", "foo=3", "block=32;threads=64", "block",
                                             "block=4294967328", "block=-32", "block=+32", "threads=", "block=16,",
                                             "block=12", "threads=48", "dchunk=5", "tm=3", "tn=32", "decode=3", "btm=3",
                                             "stage=3", "prefetch=2", "accum=3", "fthreads=48", "fdchunk=128"};
#define NTUNING_MALFORMED 9
#define NBADTUNINGENV ((int)(sizeof bad_tuning_env / sizeof bad_tuning_env[0]))

START_TEST(test_tuning_env_malformed)
{
    const char *v = bad_tuning_env[_i];
    char *saved = env_save("CASTLE_TUNING");
    setenv("CASTLE_TUNING", v, 1);
    castle_context *out = NOT_NULL;
    castle_status st = castle_context_create_default(NULL, &out);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", castle_last_error());
    env_restore("CASTLE_TUNING", saved);
    char what[96];
    snprintf(what, sizeof what, "CASTLE_TUNING=%s", v);
    ck_assert_msg(st == CASTLE_ERR_BAD_TUNING, "%s: got %s '%s'", what, castle_status_string(st), msg);
    ck_assert_msg(msg[0] != '\0', "%s: empty message", what);
    /* malformed strings are named with the variable; well-formed bad values by the value */
    const bool malformed = _i < NTUNING_MALFORMED;
    const char *mention = malformed ? "CASTLE_TUNING" : v;
    ck_assert_msg(strstr(msg, mention) != NULL, "%s: message '%s' does not mention '%s'", what, msg, mention);
    /* and where: "threads=" in "block=16,threads=" (the element that is malformed) */
    static const char *const where[NTUNING_MALFORMED] = {"block=abc", "foo=3",  "block=32;threads=64",
                                                         "block",     "block=4294967328", "block=-32",
                                                         "block=+32", "threads=", "block=16,"};
    if (malformed) {
        char at[64];
        snprintf(at, sizeof at, "malformed at '%s'", where[_i]);
        ck_assert_msg(strstr(msg, at) != NULL, "%s: message '%s' does not say \"%s\"", what, msg, at);
    }
    ck_assert_msg(out == NULL, "%s: out not set to NULL on failure", what);
}
END_TEST

START_TEST(test_tuning_env_valid)
{
    char *saved = env_save("CASTLE_TUNING");
    /* block given twice: the later value (castle.h), as "<a whole entry>,block=16" would change it */
    setenv("CASTLE_TUNING", "block=32,threads=64,dchunk=16,block=16", 1);
    castle_context *ctx = NULL;
    castle_status st = castle_context_create_default(NULL, &ctx);
    env_restore("CASTLE_TUNING", saved);
    check_status(st, CASTLE_SUCCESS, NULL, "CASTLE_TUNING=block=32,threads=64,dchunk=16,block=16");
    castle_tuning got;
    const castle_tuning want = tun(16, 64, 16, 0, 0);
    check_status(castle_context_get_tuning(ctx, &got), CASTLE_SUCCESS, NULL, "get_tuning");
    ck_assert(tuning_eq(&got, &want));
    ck_assert_msg(!strcmp(castle_context_tuning_name(ctx), "environment"), "tuning name '%s'",
                  castle_context_tuning_name(ctx));
    castle_context_destroy(ctx);
}
END_TEST

/* ---- status strings, NULL-tolerant calls ---------------------------------------------------- */

START_TEST(test_status_strings)
{
#define S(x) {x, #x}
    static const struct {
        castle_status s;
        const char *name;
    } all[] = {
        S(CASTLE_SUCCESS),
        S(CASTLE_ERR_NULL_CONTEXT),
        S(CASTLE_ERR_NULL_POINTER),
        S(CASTLE_ERR_NULL_BUFFER),
        S(CASTLE_ERR_NULL_QUEUE),
        S(CASTLE_ERR_DESC_VERSION),
        S(CASTLE_ERR_ZERO_SIZE),
        S(CASTLE_ERR_SIZE_OVERFLOW),
        S(CASTLE_ERR_HEAD_DIM),
        S(CASTLE_ERR_NEGATIVE_WINDOW),
        S(CASTLE_ERR_BAD_SCALE),
        S(CASTLE_ERR_BAD_STRIDE),
        S(CASTLE_ERR_BUFFER_TOO_SMALL),
        S(CASTLE_ERR_WORKSPACE_TOO_SMALL),
        S(CASTLE_ERR_WAIT_LIST),
        S(CASTLE_ERR_QUEUE_MISMATCH),
        S(CASTLE_ERR_BUILD_FAILED),
        S(CASTLE_ERR_NO_DEVICE),
        S(CASTLE_ERR_BAD_DEVICE_SPEC),
        S(CASTLE_ERR_DEVICE_UNSUPPORTED),
        S(CASTLE_ERR_OUT_OF_HOST_MEMORY),
        S(CASTLE_ERR_BAD_TUNING),
        S(CASTLE_ERR_INVALID_ARGUMENT),
    };
#undef S
    const size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; ++i) {
        const char *s = castle_status_string(all[i].s);
        ck_assert_msg(s != NULL, "%s: NULL", all[i].name);
        ck_assert_msg(!strncmp(s, "CASTLE_", 7), "%s gives '%s'", all[i].name, s);
        ck_assert_msg(!strcmp(s, all[i].name), "%s gives '%s'", all[i].name, s);
        for (size_t j = 0; j < i; ++j)
            ck_assert_msg(strcmp(s, castle_status_string(all[j].s)), "%s and %s share the name '%s'", all[i].name,
                          all[j].name, s);
        if (i > 0) /* library codes lie in -3000..-3099 */
            ck_assert_msg((int)all[i].s <= -3000 && (int)all[i].s >= -3099, "%s = %d", all[i].name, (int)all[i].s);
    }
    /* the contiguous range -3001.. has no gap this table misses */
    ck_assert_int_eq((int)CASTLE_ERR_INVALID_ARGUMENT, -3000 - (int)(n - 1));
    ck_assert_str_eq(castle_status_string((castle_status)CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
    ck_assert_str_eq(castle_status_string((castle_status)CL_INVALID_COMMAND_QUEUE), "CL_INVALID_COMMAND_QUEUE");
    ck_assert_str_eq(castle_status_string((castle_status)CL_BUILD_PROGRAM_FAILURE), "CL_BUILD_PROGRAM_FAILURE");
    static const int unknown[] = {1, 12345, -999, -2999, -3000, -3023, -3099, -100000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
        const char *s = castle_status_string((castle_status)unknown[i]);
        ck_assert_msg(s != NULL && s[0] != '\0', "castle_status_string(%d) is NULL or empty", unknown[i]);
        for (size_t j = 0; j < n; ++j)
            ck_assert_msg(strcmp(s, all[j].name), "unknown code %d named %s", unknown[i], s);
    }
}
END_TEST

START_TEST(test_null_tolerant)
{
    castle_context_destroy(NULL); /* a no-op */
    ck_assert(castle_context_queue(NULL) == NULL);
    ck_assert(castle_context_device(NULL) == NULL);
    ck_assert(castle_context_cl_context(NULL) == NULL);
    ck_assert(castle_build_log(NULL) != NULL && castle_build_log(NULL)[0] == '\0');
    check_status(castle_attention_desc_init(NULL, 1, 1, 1, 1), CASTLE_ERR_NULL_POINTER, "descriptor",
                 "castle_attention_desc_init(NULL)");
    check_status(castle_attention_desc_set_blhd(NULL), CASTLE_ERR_NULL_POINTER, "descriptor",
                 "castle_attention_desc_set_blhd(NULL)");
}
END_TEST

/* ---- kernel build failure ------------------------------------------------------------------ */

static void write_file(const char *path, const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert(fwrite(text, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
}

static char *read_text(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    long len = ftell(f);
    ck_assert(len >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *buf = malloc((size_t)len + 1);
    ck_assert(buf != NULL);
    ck_assert(fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    buf[len] = '\0';
    *n = (size_t)len;
    return buf;
}

START_TEST(test_build_failure)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512], common_path[600], fwd_path[600];
    snprintf(dir, sizeof dir, "%s/castle_errors_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp(%s) failed", dir);
    snprintf(common_path, sizeof common_path, "%s/common.cl", dir);
    snprintf(fwd_path, sizeof fwd_path, "%s/forward.cl", dir);
    size_t n = 0; /* CASTLE_CL_DIR must hold every file: the real common.cl and local_memory.h, a broken
                     forward.cl */
    char *common = read_text(CASTLE_SOURCE_DIR "/cl/common.cl", &n);
    write_file(common_path, common, n);
    free(common);
    char sizes_path[600];
    snprintf(sizes_path, sizeof sizes_path, "%s/local_memory.h", dir);
    char *sizes = read_text(CASTLE_SOURCE_DIR "/cl/local_memory.h", &n);
    write_file(sizes_path, sizes, n);
    free(sizes);
    static const char broken[] = "__kernel void castle_forward_block(__global float *x)\n"
                                 "{\n"
                                 "    x[0] = this is not OpenCL;\n"
                                 "}\n";
    write_file(fwd_path, broken, sizeof broken - 1);

    char *saved_dir = env_save("CASTLE_CL_DIR"), *saved_cache = env_save("CASTLE_CACHE_DIR");
    setenv("CASTLE_CL_DIR", dir, 1);
    setenv("CASTLE_CACHE_DIR", "off", 1);
    castle_context *ctx = own_context(); /* fresh: no kernel built yet */
    ck_assert_msg(castle_build_log(ctx)[0] == '\0', "a fresh context has a build log");
    fx f;
    fx_setup_on(&f, ctx, 2, 2, 40, 8, false);
    fwd_args a = fx_args(&f);
    expect_reject(&f, &a, CASTLE_ERR_BUILD_FAILED, "forward.cl", "a kernel with a syntax error");
    const char *log = castle_build_log(ctx);
    ck_assert_msg(log != NULL && log[0] != '\0', "CASTLE_ERR_BUILD_FAILED with an empty castle_build_log()");
    ck_assert_msg(strstr(log, "forward.cl:3:"), "the build log does not name forward.cl's line 3:\n%s", log);
    /* a failed build is not remembered as built: the next call tries again and fails again */
    expect_reject(&f, &a, CASTLE_ERR_BUILD_FAILED, "forward.cl", "the same call again");

    /* with the environment restored, the same context builds the embedded source and computes */
    env_restore("CASTLE_CL_DIR", saved_dir);
    env_restore("CASTLE_CACHE_DIR", saved_cache);
    expect_success(&f, &a, "the same call after CASTLE_CL_DIR is restored");
    fx_teardown(&f);
    castle_context_destroy(ctx);
    unlink(fwd_path);
    unlink(common_path);
    unlink(sizes_path);
    rmdir(dir);
}
END_TEST

/* CASTLE_CL_DIR naming a folder without the kernel sources (missing, empty, or lacking the
   family's file, or holding a FIFO or a directory in its place) is reported, never replaced
   silently by the embedded kernels: BUILD_FAILED, a message naming the variable and the file (and
   what it is instead of a file), the same text in castle_build_log().  A FIFO is not opened for
   reading (the open waited for a writer: the call hung). */
START_TEST(test_cl_dir_unreadable)
{
    const char *tmp = getenv("TMPDIR");
    char dir[512], path[600], path2[600], path3[600];
    snprintf(dir, sizeof dir, "%s/castle_cldir_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp(%s) failed", dir);
    const char *mention = "common.cl";
    if (_i == 0) { /* missing */
        rmdir(dir);
    } else if (_i >= 2) { /* common.cl and local_memory.h; forward.cl missing, a FIFO, a directory */
        snprintf(path, sizeof path, "%s/common.cl", dir);
        write_file(path, "\n", 1);
        snprintf(path2, sizeof path2, "%s/local_memory.h", dir);
        write_file(path2, "\n", 1);
        snprintf(path3, sizeof path3, "%s/forward.cl", dir);
        mention = _i == 2 ? "forward.cl" : _i == 3 ? "forward.cl cannot be read (it is not a regular file)"
                                                   : "forward.cl cannot be read (it is a directory)";
        if (_i == 3)
            ck_assert(mkfifo(path3, 0600) == 0);
        else if (_i == 4)
            ck_assert(mkdir(path3, 0700) == 0);
    }
    char *saved_dir = env_save("CASTLE_CL_DIR"), *saved_cache = env_save("CASTLE_CACHE_DIR");
    setenv("CASTLE_CL_DIR", dir, 1);
    setenv("CASTLE_CACHE_DIR", "off", 1);
    castle_context *ctx = own_context();
    fx f;
    fx_setup_on(&f, ctx, 2, 2, 40, 8, false);
    fwd_args a = fx_args(&f);
    static const char *const what[] = {"a missing CASTLE_CL_DIR", "an empty CASTLE_CL_DIR",
                                       "a CASTLE_CL_DIR without forward.cl", "forward.cl a FIFO",
                                       "forward.cl a directory"};
    expect_reject(&f, &a, CASTLE_ERR_BUILD_FAILED, mention, what[_i]);
    check_message(CASTLE_ERR_BUILD_FAILED, "CASTLE_CL_DIR", what[_i]);
    ck_assert_msg(strstr(castle_build_log(ctx), "CASTLE_CL_DIR") && strstr(castle_build_log(ctx), mention),
                  "%s: the build log does not say why: '%s'", what[_i], castle_build_log(ctx));
    env_restore("CASTLE_CL_DIR", saved_dir);
    env_restore("CASTLE_CACHE_DIR", saved_cache);
    expect_success(&f, &a, "the same call after CASTLE_CL_DIR is restored");
    fx_teardown(&f);
    castle_context_destroy(ctx);
    if (_i >= 2) {
        unlink(path);
        unlink(path2);
        remove(path3);
    }
    rmdir(dir);
}
END_TEST

/* ---- the suite ----------------------------------------------------------------------------- */

static void add(Suite *s, const char *name, TCase **tc)
{
    *tc = tcase_create(name);
    tcase_set_timeout(*tc, 300);
    suite_add_tcase(s, *tc);
}

Suite *errors_suite(void)
{
    Suite *s = suite_create("errors");
    TCase *tc;
    add(s, "forward_args", &tc);
    tcase_add_test(tc, test_baseline);
    tcase_add_test(tc, test_null_context);
    tcase_add_test(tc, test_null_desc);
    tcase_add_test(tc, test_desc_version);
    tcase_add_test(tc, test_desc_init_size);
    tcase_add_loop_test(tc, test_null_buffer, 0, NBUF);
    tcase_add_test(tc, test_null_queue);
    tcase_add_loop_test(tc, test_zero_size, 0, 4);
    tcase_add_test(tc, test_head_dim);
    tcase_add_test(tc, test_negative_window);
    tcase_add_test(tc, test_bad_scale);
    tcase_add_loop_test(tc, test_size_overflow, 0, NOVERFLOW);
    tcase_add_test(tc, test_size_limits_accepted);
    tcase_add_test(tc, test_castle_seq_len_limit);
    tcase_add_test(tc, test_workspace_overflow_boundary);
    tcase_add_test(tc, test_workspace_too_large);
    tcase_add_test(tc, test_prefill_workspace_too_large);
    tcase_add_loop_test(tc, test_row_stride_too_small, 0, NFWD);
    tcase_add_test(tc, test_unused_layouts);
    tcase_add_test(tc, test_output_overlap);
    tcase_add_loop_test(tc, test_buffer_too_small, 0, NFWD);
    tcase_add_test(tc, test_workspace_too_small);
    tcase_add_test(tc, test_wait_list);
    tcase_add_test(tc, test_queue_other_context);
    tcase_add_test(tc, test_wait_list_other_context);
    tcase_add_loop_test(tc, test_buffer_other_context, 0, NBUF);
    tcase_add_loop_test(tc, test_buffer_access, 0, NBUF);
    tcase_add_test(tc, test_buffer_access_kinds);
    tcase_add_test(tc, test_output_aliases);
    tcase_add_test(tc, test_subbuffer_overlap);
    tcase_add_test(tc, test_host_ptr_overlap);
    tcase_add_test(tc, test_nothing_written);
    tcase_add_test(tc, test_workspace_size_args);
    add(s, "context", &tc);
    tcase_add_test(tc, test_context_create_null_args);
    tcase_add_loop_test(tc, test_device_spec_malformed, 0, NMALFORMED);
    tcase_add_test(tc, test_parse_device_spec);
    tcase_add_loop_test(tc, test_device_missing, 0, 3);
    tcase_add_test(tc, test_device_env_malformed);
    tcase_add_test(tc, test_null_tolerant);
    tcase_add_test(tc, test_status_strings);
    add(s, "tuning", &tc);
    tcase_add_test(tc, test_tuning_rejected);
    tcase_add_test(tc, test_tuning_accepted);
    tcase_add_test(tc, test_tuning_narrows_for_every_kernel);
    tcase_add_test(tc, test_tuning_changed_between_passes);
    tcase_add_loop_test(tc, test_tuning_env_malformed, 0, NBADTUNINGENV);
    tcase_add_test(tc, test_tuning_env_valid);
    add(s, "build", &tc);
    tcase_add_test(tc, test_build_failure);
    tcase_add_loop_test(tc, test_cl_dir_unreadable, 0, 5);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(errors_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
