/* Standard causal attention, the baseline (castle_causal_*), on the OpenCL device (CASTLE_DEVICE)
 * against the fp64 reference conformance/ref_causal.c:
 *   reference  ref_causal_forward by hand (zero queries: running means), ref_causal_backward against
 *              central finite differences of the loss sum dout * o.
 *   forward    a table of shapes: L 1, 7, 63, 64, 65, 257, 1000 with d 1, 16, 33, 64, 128, 256,
 *              B, H > 1, (B, H, L, d), (B, L, H, d) and padded layouts, an explicit scale; guard regions
 *              around every buffer and inputs unchanged; large-magnitude inputs; the window ignored.
 *   backward   a similar table against the analytic gradients; bitwise reproducible.
 *   decode     prefill P tokens, then the rest one token per call or in chunks: every output equals the
 *              forward pass over the whole sequence (on the device, and the reference); without lse;
 *              from an empty cache; a long cache whose keys are split among work-groups.
 *   queue      an out-of-order queue with events between the calls gives the same bits.
 *   causality  a NaN or Inf in q, k or v at token r leaves every output row before r bitwise as it
 *              was, in the forward pass and in prefill + decode (masked keys are never read); in the
 *              backward pass (q, k, v or dO poisoned) the rows of dQ before r, and for q or dO the
 *              rows of dK and dV after r.
 *   api        the KV cache's capacity (CASTLE_ERR_CACHE_FULL, nothing changed), CACHE_NOT_EMPTY,
 *              SHAPE_MISMATCH, reset, bytes, length, destroy(NULL); argument errors. */
#include "conformance_check.h"
#include "harness.h"
#include "ref_causal.h"
#include "tolerance.h"
#include "variant_tunings.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BIT(t) (1u << (t))
#define FWD_SET                                                                                                        \
    (BIT(CASTLE_TENSOR_QC) | BIT(CASTLE_TENSOR_KC) | BIT(CASTLE_TENSOR_VC) | BIT(CASTLE_TENSOR_O) |                    \
     BIT(CASTLE_TENSOR_LSE))
#define BWD_SET                                                                                                        \
    (FWD_SET | BIT(CASTLE_TENSOR_DO) | BIT(CASTLE_TENSOR_DQC) | BIT(CASTLE_TENSOR_DKC) | BIT(CASTLE_TENSOR_DVC))
#define INPUTS (BIT(CASTLE_TENSOR_QC) | BIT(CASTLE_TENSOR_KC) | BIT(CASTLE_TENSOR_VC) | BIT(CASTLE_TENSOR_DO))

typedef struct cz_case {
    size_t B, H, L, d;
    h_layout layout;
    double mag;  /* inputs uniform in [-mag, mag) */
    float scale; /* 0: 1/sqrt(d) */
    uint64_t seed;
} cz_case;

static double scale_of(const cz_case *c) { return c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d); }

/* A non-finite value planted in input `tensor` at token `row` (every batch entry, head and column);
   tensor < 0: none.  Set by the causality tests only. */
static struct {
    int tensor;
    size_t row;
    float value;
} poison = {-1, 0, 0.0f};

/* Input tensor t (QC, KC, VC or DO) at token `row` of sequence (b, h): the same for every call. */
static float val(const cz_case *c, int t, size_t b, size_t h, size_t row, size_t col)
{
    if (t == poison.tensor && row == poison.row)
        return poison.value;
    return (float)(c->mag * h_value(c->seed, (unsigned)t, b, h, row, col));
}

static castle_context *ctx(void)
{
    castle_context *x = h_context();
    ck_assert_msg(x, "no device: %s", castle_last_error());
    return x;
}

/* ---- device buffers of one call ---------------------------------------------------------------- */

/* The tensors in `set`, laid out by desc for `rows` tokens; inputs hold tokens row0..row0+rows-1,
   outputs start as the harness's sentinel; every buffer sits inside guard margins. */
typedef struct io {
    castle_attention_desc desc;
    size_t rows;
    unsigned set;
    h_guarded g[CASTLE_TENSOR_COUNT];
    float *host[CASTLE_TENSOR_COUNT];
    bool *used[CASTLE_TENSOR_COUNT];
    size_t span[CASTLE_TENSOR_COUNT];
} io;

static size_t width_of(int t, const cz_case *c) { return t == CASTLE_TENSOR_LSE ? 1 : c->d; }

static void io_make(io *x, const cz_case *c, size_t row0, size_t rows, unsigned set)
{
    memset(x, 0, sizeof *x);
    castle_attention_desc_init(&x->desc, c->B, c->H, rows, c->d);
    x->desc.scale = c->scale;
    h_apply_layout(&x->desc, c->layout);
    x->rows = rows;
    x->set = set;
    cl_command_queue q = h_queue();
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        if (!(set & BIT(t)))
            continue;
        const size_t w = width_of(t, c), span = h_layout_span(&x->desc.layout[t], w, c->B, c->H, rows);
        x->span[t] = span;
        x->host[t] = malloc(span * sizeof(float));
        x->used[t] = calloc(span, sizeof(bool));
        ck_assert(x->host[t] && x->used[t]);
        ck_assert(h_guarded_create(castle_context_cl_context(ctx()), castle_context_device(ctx()), &x->g[t], span));
        ck_assert(h_guarded_write(q, &x->g[t], NULL));            /* all sentinel */
        ck_assert(h_guarded_read(q, &x->g[t], x->host[t], NULL)); /* the sentinel, for the gaps */
        for (size_t b = 0; b < c->B; ++b)
            for (size_t h = 0; h < c->H; ++h)
                for (size_t r = 0; r < rows; ++r) {
                    const size_t off = h_layout_offset(&x->desc.layout[t], w, c->H, rows, b, h, r);
                    for (size_t e = 0; e < w; ++e) {
                        x->used[t][off + e] = true;
                        if (INPUTS & BIT(t))
                            x->host[t][off + e] = val(c, t, b, h, row0 + r, e);
                    }
                }
        if (INPUTS & BIT(t))
            ck_assert(h_guarded_write(q, &x->g[t], x->host[t]));
    }
}

static cl_mem buf(const io *x, int t) { return x->set & BIT(t) ? x->g[t].view : NULL; }

/* Output t as a logical (B, H, rows, width) array (malloc'd), after checking that nothing outside its
   elements changed (guard margins, gaps between strided rows). */
static float *io_out(const io *x, const cz_case *c, int t)
{
    float *all = malloc(x->span[t] * sizeof(float));
    const size_t w = width_of(t, c);
    float *out = malloc(c->B * c->H * x->rows * w * sizeof(float));
    ck_assert(all && out);
    ck_assert_msg(h_guarded_read(h_queue(), &x->g[t], all, x->used[t]),
                  "a guard region or a gap of output %d was written (L=%zu d=%zu layout=%d)", t, x->rows, c->d,
                  (int)c->layout);
    for (size_t b = 0; b < c->B; ++b)
        for (size_t h = 0; h < c->H; ++h)
            for (size_t r = 0; r < x->rows; ++r)
                memcpy(out + ((b * c->H + h) * x->rows + r) * w,
                       all + h_layout_offset(&x->desc.layout[t], w, c->H, x->rows, b, h, r), w * sizeof(float));
    free(all);
    return out;
}

/* Every input buffer still holds what was written, margins included. */
static void io_inputs_intact(const io *x)
{
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        if (!(x->set & BIT(t) & INPUTS))
            continue;
        float *all = malloc(x->span[t] * sizeof(float));
        ck_assert(all);
        ck_assert_msg(h_guarded_read(h_queue(), &x->g[t], all, NULL), "a guard of input %d was written", t);
        ck_assert_msg(!memcmp(all, x->host[t], x->span[t] * sizeof(float)), "input %d was modified", t);
        free(all);
    }
}

static void io_free(io *x)
{
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        h_guarded_release(&x->g[t]);
        free(x->host[t]);
        free(x->used[t]);
    }
}

static void wait_release(cl_event ev)
{
    ck_assert(clWaitForEvents(1, &ev) == CL_SUCCESS);
    clReleaseEvent(ev);
}

/* ---- reference and error measure --------------------------------------------------------------- */

/* Logical (B, H, L, d) reference outputs of the case (each may be NULL). */
static void reference(const cz_case *c, size_t L, double *o, double *lse, double *dq, double *dk, double *dv)
{
    const size_t d = c->d, n = L * d;
    double *in[4];
    for (int i = 0; i < 4; ++i)
        ck_assert((in[i] = malloc((n ? n : 1) * sizeof(double))) != NULL);
    double *ro = malloc(n * sizeof(double) + 1), *rl = malloc(L * sizeof(double) + 1);
    ck_assert(ro && rl);
    static const int tensors[4] = {CASTLE_TENSOR_QC, CASTLE_TENSOR_KC, CASTLE_TENSOR_VC, CASTLE_TENSOR_DO};
    for (size_t b = 0; b < c->B; ++b)
        for (size_t h = 0; h < c->H; ++h) {
            const size_t bh = b * c->H + h;
            for (int i = 0; i < 4; ++i)
                for (size_t r = 0; r < L; ++r)
                    for (size_t e = 0; e < d; ++e)
                        in[i][r * d + e] = val(c, tensors[i], b, h, r, e);
            ck_assert(!ref_causal_forward((int)L, (int)d, scale_of(c), in[0], in[1], in[2], ro, rl));
            if (o)
                memcpy(o + bh * n, ro, n * sizeof(double));
            if (lse)
                memcpy(lse + bh * L, rl, L * sizeof(double));
            if (dq)
                ck_assert(!ref_causal_backward((int)L, (int)d, scale_of(c), in[0], in[1], in[2], in[3], dq + bh * n,
                                               dk + bh * n, dv + bh * n));
        }
    for (int i = 0; i < 4; ++i)
        free(in[i]);
    free(ro);
    free(rl);
}

#define rel_err conf_rel_err /* conformance/conformance.h */

/* The same measure between two float arrays (the second one as the reference). */
static double rel_err_f(const float *got, const float *ref, size_t n)
{
    double e = 0, m = 1.0;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(got[i]))
            return INFINITY;
        e = fmax(e, fabs((double)got[i] - ref[i]));
        m = fmax(m, fabs((double)ref[i]));
    }
    return e / m;
}

static void verbose(const char *what, const cz_case *c, const char *fmt, double a, double b, double e)
{
    if (getenv("CASTLE_TEST_VERBOSE")) {
        fprintf(stderr, "%s B=%zu H=%zu L=%zu d=%zu layout=%d mag=%g: ", what, c->B, c->H, c->L, c->d, (int)c->layout,
                c->mag);
        fprintf(stderr, fmt, a, b, e);
        fputc('\n', stderr);
    }
}

/* ---- reference checks -------------------------------------------------------------------------- */

/* Zero queries: every score is 0, so o_t is the mean of v_0..v_t and lse_t = log(t + 1). */
START_TEST(test_ref_by_hand)
{
    enum { L = 9, D = 3 };
    double q[L * D] = {0}, k[L * D], v[L * D], o[L * D], lse[L];
    for (int i = 0; i < L * D; ++i) {
        k[i] = sin(i + 1.0);
        v[i] = cos(3.0 * i);
    }
    ck_assert(!ref_causal_forward(L, D, 0.5, q, k, v, o, lse));
    for (int t = 0; t < L; ++t) {
        ck_assert(fabs(lse[t] - log(t + 1.0)) < 1e-14);
        for (int c = 0; c < D; ++c) {
            double mean = 0;
            for (int s = 0; s <= t; ++s)
                mean += v[s * D + c] / (t + 1);
            ck_assert(fabs(o[t * D + c] - mean) < 1e-14);
        }
    }
    ck_assert(ref_causal_forward(-1, D, 0.5, q, k, v, o, lse) == -1);
    ck_assert(ref_causal_backward(L, D, 0.5, NULL, k, v, v, o, o, o) == -1);
}
END_TEST

/* The analytic gradients against central differences of sum dout * o (h = 1e-5: truncation error
   ~h^2 = 1e-10, cancellation ~1e-16 / h = 1e-11). */
START_TEST(test_ref_backward_fd)
{
    enum { L = 7, D = 3, N = L * D };
    const double sc = 0.8;
    double x[3][N], dout[N], g[3][N], o[N], lse[L];
    for (int i = 0; i < N; ++i) {
        x[0][i] = sin(1.3 * i + 0.2);
        x[1][i] = cos(0.7 * i - 0.4);
        x[2][i] = sin(2.1 * i + 1.0);
        dout[i] = cos(1.9 * i + 0.3);
    }
    ck_assert(!ref_causal_backward(L, D, sc, x[0], x[1], x[2], dout, g[0], g[1], g[2]));
    const double hstep = 1e-5;
    for (int m = 0; m < 3; ++m)
        for (int i = 0; i < N; ++i) {
            double loss[2];
            for (int sgn = 0; sgn < 2; ++sgn) {
                const double keep = x[m][i];
                x[m][i] = keep + (sgn ? -hstep : hstep);
                ck_assert(!ref_causal_forward(L, D, sc, x[0], x[1], x[2], o, lse));
                x[m][i] = keep;
                loss[sgn] = 0;
                for (int j = 0; j < N; ++j)
                    loss[sgn] += dout[j] * o[j];
            }
            const double fd = (loss[0] - loss[1]) / (2 * hstep);
            ck_assert_msg(fabs(fd - g[m][i]) < 1e-8, "tensor %d element %d: analytic %.12g, finite difference %.12g", m,
                          i, g[m][i], fd);
        }
}
END_TEST

/* ---- forward ----------------------------------------------------------------------------------- */

/* castle_causal_forward of case c: outputs (logical) in *o, *lse; guards and inputs checked. */
static void run_forward(const cz_case *c, long window, float **o, float **lse)
{
    io x;
    io_make(&x, c, 0, c->L, FWD_SET);
    x.desc.window = window;
    cl_event ev = NULL;
    castle_status st = castle_causal_forward(ctx(), &x.desc, buf(&x, CASTLE_TENSOR_QC), buf(&x, CASTLE_TENSOR_KC),
                                             buf(&x, CASTLE_TENSOR_VC), buf(&x, CASTLE_TENSOR_O),
                                             buf(&x, CASTLE_TENSOR_LSE), h_queue(), 0, NULL, &ev);
    ck_assert_msg(st == CASTLE_SUCCESS, "castle_causal_forward: %s", castle_last_error());
    wait_release(ev);
    *o = io_out(&x, c, CASTLE_TENSOR_O);
    *lse = io_out(&x, c, CASTLE_TENSOR_LSE);
    io_inputs_intact(&x);
    io_free(&x);
}

/* The conformance table's causal cases (conformance/table.c): forward (magnitudes 1, 10, 20),
   backward, and prefill + decode, against the fp64 reference with guard regions. */
START_TEST(test_conformance_forward) { conformance_check(CONF_CAUSAL_FORWARD, _i); }
END_TEST
START_TEST(test_conformance_backward) { conformance_check(CONF_CAUSAL_BACKWARD, _i); }
END_TEST
START_TEST(test_conformance_decode) { conformance_check(CONF_CAUSAL_DECODE, _i); }
END_TEST

/* The GPU entry builds this family per head-dimension class: each class's programs, side by side on
   one context, pass forward, backward and decode cases of their widths. */
START_TEST(test_head_dim_classes)
{
    static const conf_op ops[][1] = {{CONF_CAUSAL_FORWARD}, {CONF_CAUSAL_BACKWARD}, {CONF_CAUSAL_DECODE}};
    conformance_head_dim_classes(ops[_i], 1);
}
END_TEST

/* The causal forward comes from a program of its own where the forwards' shape (fthreads, fdchunk)
   differs from the rest's (host/program.c, CASTLE_FAMILY_CAUSAL_FORWARD): under a tuning whose
   forwards take fewer work-items and a narrower d chunk than the rest (64 / 8 against 128 / 32, the
   last of tests/variant_tunings.h's variant_tunings; the GPU entry's 128 / 32 against 64 / 16 runs in
   test_head_dim_classes), every quick forward and decode case of the table passes, the decode's
   block-kernel chunks (5 rows: keys split among work-groups, partials merged by the rest's
   castle_causal_combine) included. */
START_TEST(test_forward_own_shape)
{
    const castle_tuning t = variant_tunings[VARIANT_TUNINGS - 1];
    castle_context *cx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &cx) == CASTLE_SUCCESS, "%s", castle_last_error());
    const castle_status st = castle_context_set_tuning(cx, &t);
    if (st == CASTLE_ERR_BAD_TUNING && strstr(castle_last_error(), "local memory")) { /* said, not hidden */
        fprintf(stderr, "test_forward_own_shape: the tuning does not fit this device: %s\n", castle_last_error());
        castle_context_destroy(cx);
        return;
    }
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    static const conf_op ops[] = {CONF_CAUSAL_FORWARD, CONF_CAUSAL_DECODE};
    int ran = 0;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; ++o)
        for (size_t i = 0; i < conf_ncases(ops[o]); ++i) {
            if (!conf_is_quick(ops[o], i))
                continue;
            conf_result r;
            const castle_status rs = conf_run(cx, ops[o], i, &r);
            ck_assert_msg(rs == CASTLE_SUCCESS && r.pass, "%s %s: %s", conf_op_names[ops[o]], r.what, r.why);
            ++ran;
        }
    ck_assert_int_ge(ran, 8);
    castle_context_destroy(cx);
}
END_TEST

/* The window is ignored (causal attention has no lookahead): bitwise the same outputs. */
START_TEST(test_forward_window_ignored)
{
    const cz_case c = {2, 2, 100, 33, H_BHLD, 1, 0, 41};
    float *o0, *l0, *o5, *l5;
    run_forward(&c, 0, &o0, &l0);
    run_forward(&c, 5, &o5, &l5);
    ck_assert(!memcmp(o0, o5, c.B * c.H * c.L * c.d * sizeof(float)));
    ck_assert(!memcmp(l0, l5, c.B * c.H * c.L * sizeof(float)));
    free(o0);
    free(l0);
    free(o5);
    free(l5);
}
END_TEST

/* Rows [r0, r1) of the logical (B*H, L, w) arrays a and b are bitwise equal. */
static bool same_rows(const float *a, const float *b, size_t BH, size_t L, size_t w, size_t r0, size_t r1)
{
    for (size_t bh = 0; bh < BH; ++bh)
        if (r1 > r0 && memcmp(a + (bh * L + r0) * w, b + (bh * L + r0) * w, (r1 - r0) * w * sizeof(float)))
            return false;
    return true;
}

/* Non-finite values planted at token r: rows 0..r-1 of o and lse stay bitwise as without them.
   r = 5 and 40 sit inside a block (default block 32: the masked keys of a diagonal block), 64 on a
   block edge, 99 in the ragged last block. */
static const size_t poison_rows[] = {5, 40, 64, 99};
static const float poison_values[] = {NAN, INFINITY, -INFINITY};
#define NPOISON_ROWS ((int)(sizeof poison_rows / sizeof poison_rows[0]))

START_TEST(test_forward_causality)
{
    const cz_case c = {2, 2, 100, 33, H_BHLD, 1, 0, 42};
    const size_t BH = c.B * c.H;
    float *o0, *l0;
    run_forward(&c, 0, &o0, &l0);
    static const int tensors[] = {CASTLE_TENSOR_QC, CASTLE_TENSOR_KC, CASTLE_TENSOR_VC};
    for (int t = 0; t < 3; ++t)
        for (int v = 0; v < 3; ++v) {
            poison.tensor = tensors[t];
            poison.row = poison_rows[_i];
            poison.value = poison_values[v];
            float *o, *l;
            run_forward(&c, 0, &o, &l);
            ck_assert_msg(same_rows(o, o0, BH, c.L, c.d, 0, poison.row) && same_rows(l, l0, BH, c.L, 1, 0, poison.row),
                          "forward: %g in tensor %d at row %zu changed an earlier row", (double)poison.value,
                          poison.tensor, poison.row);
            free(o);
            free(l);
        }
    poison.tensor = -1;
    free(o0);
    free(l0);
}
END_TEST

/* ---- backward ---------------------------------------------------------------------------------- */

/* Forward then backward of case c on queue q; gradients (logical) in g[0..2] = dq, dk, dv. */
static void run_backward(const cz_case *c, cl_command_queue q, float *g[3])
{
    io x;
    io_make(&x, c, 0, c->L, BWD_SET);
    cl_event ev = NULL, ev2 = NULL;
    castle_status st = castle_causal_forward(ctx(), &x.desc, buf(&x, CASTLE_TENSOR_QC), buf(&x, CASTLE_TENSOR_KC),
                                             buf(&x, CASTLE_TENSOR_VC), buf(&x, CASTLE_TENSOR_O),
                                             buf(&x, CASTLE_TENSOR_LSE), q, 0, NULL, &ev);
    ck_assert_msg(st == CASTLE_SUCCESS, "castle_causal_forward: %s", castle_last_error());
    st = castle_causal_backward(ctx(), &x.desc, buf(&x, CASTLE_TENSOR_QC), buf(&x, CASTLE_TENSOR_KC),
                                buf(&x, CASTLE_TENSOR_VC), buf(&x, CASTLE_TENSOR_O), buf(&x, CASTLE_TENSOR_LSE),
                                buf(&x, CASTLE_TENSOR_DO), buf(&x, CASTLE_TENSOR_DQC), buf(&x, CASTLE_TENSOR_DKC),
                                buf(&x, CASTLE_TENSOR_DVC), q, 1, &ev, &ev2);
    ck_assert_msg(st == CASTLE_SUCCESS, "castle_causal_backward: %s", castle_last_error());
    clReleaseEvent(ev);
    wait_release(ev2);
    for (int i = 0; i < 3; ++i)
        g[i] = io_out(&x, c, CASTLE_TENSOR_DQC + i);
    io_inputs_intact(&x);
    free(io_out(&x, c, CASTLE_TENSOR_O)); /* the forward's outputs: guards only */
    free(io_out(&x, c, CASTLE_TENSOR_LSE));
    io_free(&x);
}

/* A NaN or Inf at token r of one input (the forward runs on it too) reaches only the gradient rows
   that depend on it: dQ rows before r stay bitwise as they were, and for a poisoned q or dO also
   the dK and dV rows after r (key s sees the queries from s on).  Masked terms, the diagonal block's
   included, are skipped, never multiplied by a zero weight. */
START_TEST(test_backward_causality)
{
    const cz_case c = {2, 2, 100, 33, H_BHLD, 1, 0, 43};
    const size_t BH = c.B * c.H;
    float *g0[3];
    run_backward(&c, h_queue(), g0);
    static const int tensors[] = {CASTLE_TENSOR_QC, CASTLE_TENSOR_KC, CASTLE_TENSOR_VC, CASTLE_TENSOR_DO};
    for (int t = 0; t < 4; ++t)
        for (int v = 0; v < 3; ++v) {
            poison.tensor = tensors[t];
            poison.row = poison_rows[_i];
            poison.value = poison_values[v];
            float *g[3];
            run_backward(&c, h_queue(), g);
            const bool query_side = tensors[t] == CASTLE_TENSOR_QC || tensors[t] == CASTLE_TENSOR_DO;
            ck_assert_msg(same_rows(g[0], g0[0], BH, c.L, c.d, 0, poison.row),
                          "backward: %g in tensor %d at row %zu changed an earlier row of dQ", (double)poison.value,
                          poison.tensor, poison.row);
            for (int i = 1; i < 3 && query_side; ++i)
                ck_assert_msg(same_rows(g[i], g0[i], BH, c.L, c.d, poison.row + 1, c.L),
                              "backward: %g in tensor %d at row %zu changed a later row of %s", (double)poison.value,
                              poison.tensor, poison.row, i == 1 ? "dK" : "dV");
            for (int i = 0; i < 3; ++i)
                free(g[i]);
        }
    poison.tensor = -1;
    for (int i = 0; i < 3; ++i)
        free(g0[i]);
}
END_TEST

/* Two runs give the same bits (no atomics), and so does an out-of-order queue with events between
   the launches. */
START_TEST(test_backward_reproducible)
{
    const cz_case c = {2, 2, 130, 64, H_BLHD, 1, 0, 71};
    const size_t n = c.B * c.H * c.L * c.d;
    float *a[3], *b[3];
    run_backward(&c, h_queue(), a);
    run_backward(&c, h_queue(), b);
    for (int i = 0; i < 3; ++i)
        ck_assert_msg(!memcmp(a[i], b[i], n * sizeof(float)), "gradient %d differs between two runs", i);
    cl_command_queue ooo = h_out_of_order_queue(ctx(), "test_causal's backward on an out-of-order queue");
    if (ooo) {
        float *o3[3];
        run_backward(&c, ooo, o3);
        for (int i = 0; i < 3; ++i) {
            ck_assert_msg(!memcmp(a[i], o3[i], n * sizeof(float)), "gradient %d differs on an out-of-order queue", i);
            free(o3[i]);
        }
        clReleaseCommandQueue(ooo);
    }
    for (int i = 0; i < 3; ++i) {
        free(a[i]);
        free(b[i]);
    }
}
END_TEST

/* A saturated softmax (inputs of magnitude 100 and 1000: scores ~1e4..1e6, each row's P nearly or
   exactly one-hot): dq and dk are (nearly) 0, and stay within CAUSAL_GRAD_TOL of the fp64
   reference's because Delta = dO . O is summed in the order of dP = dO V^T, so that dP - Delta is 0
   where P is one-hot.  Summed otherwise (lanes, then their sum) it left rounding noise times
   sc |k|: dq errors of 4e-2 at magnitude 100, d = 256, and 3.7 at 1000. */
static const cz_case saturated[] = {{1, 1, 130, 256, H_BHLD, 100, 0, 41}, {1, 1, 130, 64, H_BHLD, 1000, 0, 42},
                                    {1, 2, 65, 128, H_BLHD, 1000, 0, 43}};
START_TEST(test_backward_saturated)
{
    const cz_case *z = &saturated[_i];
    const h_fwd_case c = {z->B, z->H, z->L, z->d, 0, z->layout, z->mag, z->scale, z->seed};
    h_fwd_out out;
    ck_assert_msg(h_run_causal_backward(ctx(), h_queue(), &c, false, &out) == CASTLE_SUCCESS, "%s",
                  castle_last_error());
    ck_assert(out.finite && out.guards_ok);
    for (int k = 3; k < 6; ++k)
        ck_assert_msg(out.err_grad[k] <= CAUSAL_GRAD_TOL, "mag=%g d=%zu: %s error %.3g > %g", c.mag, c.d,
                      k == 3 ? "dq" : k == 4 ? "dk" : "dv", out.err_grad[k], CAUSAL_GRAD_TOL);
}
END_TEST

/* ---- decode with the KV cache ------------------------------------------------------------------ */

typedef struct dec_case {
    cz_case c;    /* c.L: the whole sequence */
    size_t P;     /* prompt (0: decode from an empty cache) */
    size_t chunk; /* tokens per castle_causal_decode call */
    bool with_lse;
} dec_case;

/* A decode case of the conformance table in this file's terms. */
static dec_case dec_of(const conf_causal_dec_case *x)
{
    const h_fwd_case *f = &x->c;
    const dec_case d = {{f->B, f->H, f->L, f->d, f->layout, f->mag, f->scale, f->seed}, x->P, x->chunk, x->with_lse};
    return d;
}

/* Runs prefill (P > 0) and decode calls of `chunk` tokens over the whole sequence on cache kc
   (which must be empty); returns the logical outputs of every token (lse: NULL without it). */
static void run_decode(const dec_case *dc, castle_kv_cache *kc, cl_command_queue q, float **o, float **lse)
{
    const cz_case *c = &dc->c;
    const size_t d = c->d, L = c->L;
    *o = malloc(c->B * c->H * L * d * sizeof(float));
    *lse = dc->with_lse ? malloc(c->B * c->H * L * sizeof(float)) : NULL;
    ck_assert(*o && (*lse || !dc->with_lse));
    const unsigned set = dc->with_lse ? FWD_SET : FWD_SET & ~BIT(CASTLE_TENSOR_LSE);
    cl_event prev = NULL;
    for (size_t pos = 0; pos < L;) {
        const bool prefill = pos == 0 && dc->P > 0;
        const size_t n = prefill ? dc->P : (dc->chunk < L - pos ? dc->chunk : L - pos);
        io x;
        io_make(&x, c, pos, n, set);
        cl_event ev = NULL;
        castle_status st = (prefill ? castle_causal_prefill : castle_causal_decode)(
            ctx(), kc, &x.desc, buf(&x, CASTLE_TENSOR_QC), buf(&x, CASTLE_TENSOR_KC), buf(&x, CASTLE_TENSOR_VC),
            buf(&x, CASTLE_TENSOR_O), buf(&x, CASTLE_TENSOR_LSE), q, prev ? 1 : 0, prev ? &prev : NULL, &ev);
        ck_assert_msg(st == CASTLE_SUCCESS, "%s at %zu: %s", prefill ? "prefill" : "decode", pos, castle_last_error());
        if (prev)
            clReleaseEvent(prev);
        prev = ev;
        ck_assert(clWaitForEvents(1, &ev) == CL_SUCCESS);
        float *xo = io_out(&x, c, CASTLE_TENSOR_O), *xl = dc->with_lse ? io_out(&x, c, CASTLE_TENSOR_LSE) : NULL;
        for (size_t bh = 0; bh < c->B * c->H; ++bh) {
            memcpy(*o + (bh * L + pos) * d, xo + bh * n * d, n * d * sizeof(float));
            if (xl)
                memcpy(*lse + bh * L + pos, xl + bh * n, n * sizeof(float));
        }
        free(xo);
        free(xl);
        io_inputs_intact(&x);
        io_free(&x);
        pos += n;
        size_t len = 0;
        ck_assert(castle_kv_cache_length(kc, &len) == CASTLE_SUCCESS && len == pos);
    }
    if (prev)
        clReleaseEvent(prev);
}

static void check_decode(const dec_case *dc, size_t extra_capacity)
{
    const cz_case *c = &dc->c;
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, c->B, c->H, c->L + extra_capacity, c->d);
    castle_kv_cache *kc = NULL;
    ck_assert_msg(castle_kv_cache_create(ctx(), &cd, &kc) == CASTLE_SUCCESS, "%s", castle_last_error());
    float *o, *lse;
    run_decode(dc, kc, h_queue(), &o, &lse);
    castle_kv_cache_destroy(kc);

    /* against the forward pass over the whole sequence on the device (against the fp64 reference:
       test_conformance_decode, the same cases) */
    float *fo, *fl;
    run_forward(c, 0, &fo, &fl);
    const size_t n = c->B * c->H * c->L * c->d, nl = c->B * c->H * c->L;
    const double ef = rel_err_f(o, fo, n), lf = lse ? rel_err_f(lse, fl, nl) : 0;
    verbose("decode", c, "vs forward: o %.3g lse %.3g%.0f", ef, lf, 0);
    ck_assert_msg(ef <= CAUSAL_TOL && lf <= CAUSAL_TOL,
                  "L=%zu d=%zu P=%zu chunk=%zu: against the forward o %.3g lse %.3g", c->L, c->d, dc->P, dc->chunk, ef,
                  lf);
    free(o);
    free(lse);
    free(fo);
    free(fl);
}

START_TEST(test_decode_invariant)
{
    const dec_case dc = dec_of(&conf_causal_decode_cases[_i]);
    check_decode(&dc, _i % 2 ? 0 : 9);
}
END_TEST

/* A long cache with few heads: a single-token decode splits the keys among work-groups (and each
   work-group among its work-items); the last tokens still equal the reference. */
START_TEST(test_decode_long)
{
    const dec_case dc = {{1, 2, 4200, 16, H_BHLD, 1, 0, 91}, 4190, 1, true};
    const cz_case *c = &dc.c;
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, c->B, c->H, c->L, c->d);
    castle_kv_cache *kc = NULL;
    ck_assert(castle_kv_cache_create(ctx(), &cd, &kc) == CASTLE_SUCCESS);
    float *o, *lse;
    run_decode(&dc, kc, h_queue(), &o, &lse);
    castle_kv_cache_destroy(kc);
    const size_t n = c->B * c->H * c->L * c->d, nl = c->B * c->H * c->L;
    double *ro = malloc(n * sizeof(double)), *rl = malloc(nl * sizeof(double));
    ck_assert(ro && rl);
    reference(c, c->L, ro, rl, NULL, NULL, NULL);
    const double eo = rel_err(o, ro, n, 1.0), el = rel_err(lse, rl, nl, 1.0);
    verbose("decode", c, "long: o %.3g lse %.3g%.0f", eo, el, 0);
    ck_assert_msg(eo <= CAUSAL_TOL && el <= CAUSAL_TOL, "long decode: o %.3g lse %.3g", eo, el);
    free(o);
    free(lse);
    free(ro);
    free(rl);
}
END_TEST

/* Decoding on an out-of-order queue, each call waiting on the one before, gives the same bits. */
START_TEST(test_decode_out_of_order)
{
    const dec_case dc = {{2, 2, 80, 64, H_BHLD, 1, 0, 95}, 30, 3, true};
    cl_command_queue ooo = h_out_of_order_queue(ctx(), "test_decode_out_of_order");
    if (!ooo)
        return;
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, dc.c.B, dc.c.H, dc.c.L, dc.c.d);
    castle_kv_cache *k1 = NULL, *k2 = NULL;
    ck_assert(castle_kv_cache_create(ctx(), &cd, &k1) == CASTLE_SUCCESS);
    ck_assert(castle_kv_cache_create(ctx(), &cd, &k2) == CASTLE_SUCCESS);
    float *o1, *l1, *o2, *l2;
    run_decode(&dc, k1, h_queue(), &o1, &l1);
    run_decode(&dc, k2, ooo, &o2, &l2);
    ck_assert(!memcmp(o1, o2, dc.c.B * dc.c.H * dc.c.L * dc.c.d * sizeof(float)));
    ck_assert(!memcmp(l1, l2, dc.c.B * dc.c.H * dc.c.L * sizeof(float)));
    castle_kv_cache_destroy(k1);
    castle_kv_cache_destroy(k2);
    clReleaseCommandQueue(ooo);
    free(o1);
    free(l1);
    free(o2);
    free(l2);
}
END_TEST

/* Prefill + decode with a non-finite value at token r (in the prompt, then among the decoded
   tokens): the outputs before r are bitwise those of a clean run.  Chunks of 1 (castle_causal_decode)
   and 5 (the block kernel). */
START_TEST(test_decode_causality)
{
    const dec_case dc = {{2, 2, 70, 16, H_BHLD, 1, 0, 97}, 33, _i ? 5 : 1, true};
    const cz_case *c = &dc.c;
    const size_t BH = c->B * c->H, rows[2] = {20, 50};
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, c->B, c->H, c->L, c->d);
    float *o0, *l0;
    castle_kv_cache *kc = NULL;
    ck_assert(castle_kv_cache_create(ctx(), &cd, &kc) == CASTLE_SUCCESS);
    run_decode(&dc, kc, h_queue(), &o0, &l0);
    static const int tensors[] = {CASTLE_TENSOR_QC, CASTLE_TENSOR_KC, CASTLE_TENSOR_VC};
    for (int r = 0; r < 2; ++r)
        for (int t = 0; t < 3; ++t)
            for (int v = 0; v < 2; ++v) {
                ck_assert(castle_kv_cache_reset(kc) == CASTLE_SUCCESS);
                poison.tensor = tensors[t];
                poison.row = rows[r];
                poison.value = poison_values[v];
                float *o, *l;
                run_decode(&dc, kc, h_queue(), &o, &l);
                ck_assert_msg(same_rows(o, o0, BH, c->L, c->d, 0, poison.row) &&
                                  same_rows(l, l0, BH, c->L, 1, 0, poison.row),
                              "decode (chunk %zu): %g in tensor %d at row %zu changed an earlier row", dc.chunk,
                              (double)poison.value, poison.tensor, poison.row);
                free(o);
                free(l);
            }
    poison.tensor = -1;
    castle_kv_cache_destroy(kc);
    free(o0);
    free(l0);
}
END_TEST

/* ---- API and errors ---------------------------------------------------------------------------- */

START_TEST(test_cache_api)
{
    const dec_case dc = {{2, 2, 20, 16, H_BHLD, 1, 0, 101}, 12, 1, true};
    const cz_case *c = &dc.c;
    castle_attention_desc cd;
    castle_attention_desc_init(&cd, c->B, c->H, c->L, c->d);
    castle_kv_cache *kc = NULL;
    ck_assert(castle_kv_cache_create(ctx(), &cd, &kc) == CASTLE_SUCCESS);
    size_t bytes = 0, len = 1;
    ck_assert(castle_kv_cache_bytes(kc, &bytes) == CASTLE_SUCCESS);
    ck_assert(bytes >= 2 * c->B * c->H * c->L * c->d * sizeof(float));
    ck_assert(castle_kv_cache_length(kc, &len) == CASTLE_SUCCESS && len == 0);
    ck_assert(castle_kv_cache_bytes(NULL, &bytes) == CASTLE_ERR_NULL_POINTER);
    ck_assert(castle_kv_cache_length(kc, NULL) == CASTLE_ERR_NULL_POINTER);
    ck_assert(castle_kv_cache_reset(NULL) == CASTLE_ERR_NULL_POINTER);
    ck_assert(castle_kv_cache_create(ctx(), &cd, NULL) == CASTLE_ERR_NULL_POINTER);
    ck_assert(castle_kv_cache_create(NULL, &cd, &kc) == CASTLE_ERR_NULL_CONTEXT);
    castle_kv_cache_destroy(NULL);

    io x;
    io_make(&x, c, 0, dc.P, FWD_SET);
    const cl_mem q = buf(&x, CASTLE_TENSOR_QC), k = buf(&x, CASTLE_TENSOR_KC), v = buf(&x, CASTLE_TENSOR_VC);
    const cl_mem o = buf(&x, CASTLE_TENSOR_O), lse = buf(&x, CASTLE_TENSOR_LSE);
    cl_command_queue qu = h_queue();
    ck_assert(castle_causal_prefill(ctx(), kc, &x.desc, q, k, v, o, lse, qu, 0, NULL, NULL) == CASTLE_SUCCESS);
    ck_assert(castle_causal_prefill(ctx(), kc, &x.desc, q, k, v, o, lse, qu, 0, NULL, NULL) ==
              CASTLE_ERR_CACHE_NOT_EMPTY);
    /* 12 cached + 12 > 20: refused, nothing enqueued, the length unchanged */
    ck_assert(castle_causal_decode(ctx(), kc, &x.desc, q, k, v, o, lse, qu, 0, NULL, NULL) == CASTLE_ERR_CACHE_FULL);
    ck_assert(castle_kv_cache_length(kc, &len) == CASTLE_SUCCESS && len == dc.P);
    castle_attention_desc bad = x.desc;
    bad.heads = 1;
    ck_assert(castle_causal_decode(ctx(), kc, &bad, q, k, v, o, lse, qu, 0, NULL, NULL) == CASTLE_ERR_SHAPE_MISMATCH);
    bad = x.desc;
    bad.head_dim = 8;
    ck_assert(castle_causal_decode(ctx(), kc, &bad, q, k, v, o, lse, qu, 0, NULL, NULL) == CASTLE_ERR_SHAPE_MISMATCH);
    ck_assert(castle_causal_decode(ctx(), NULL, &x.desc, q, k, v, o, lse, qu, 0, NULL, NULL) ==
              CASTLE_ERR_NULL_POINTER);
    ck_assert(castle_causal_decode(ctx(), kc, &x.desc, q, k, v, NULL, lse, qu, 0, NULL, NULL) ==
              CASTLE_ERR_NULL_BUFFER);
    ck_assert(castle_causal_decode(ctx(), kc, &x.desc, q, k, v, q, lse, qu, 0, NULL, NULL) ==
              CASTLE_ERR_INVALID_ARGUMENT);
    ck_assert(castle_causal_decode(ctx(), kc, &x.desc, q, k, v, o, lse, NULL, 0, NULL, NULL) == CASTLE_ERR_NULL_QUEUE);
    ck_assert(castle_kv_cache_length(kc, &len) == CASTLE_SUCCESS && len == dc.P);
    /* reset: the same prompt again gives the same outputs */
    float *o1 = io_out(&x, c, CASTLE_TENSOR_O);
    ck_assert(castle_kv_cache_reset(kc) == CASTLE_SUCCESS);
    ck_assert(castle_kv_cache_length(kc, &len) == CASTLE_SUCCESS && len == 0);
    ck_assert(castle_causal_prefill(ctx(), kc, &x.desc, q, k, v, o, NULL, qu, 0, NULL, NULL) == CASTLE_SUCCESS);
    ck_assert(clFinish(qu) == CL_SUCCESS);
    float *o2 = io_out(&x, c, CASTLE_TENSOR_O);
    ck_assert(!memcmp(o1, o2, c->B * c->H * dc.P * c->d * sizeof(float)));
    free(o1);
    free(o2);
    io_free(&x);
    castle_kv_cache_destroy(kc);
}
END_TEST

START_TEST(test_argument_errors)
{
    const cz_case c = {2, 2, 10, 8, H_BHLD, 1, 0, 111};
    io x;
    io_make(&x, &c, 0, c.L, BWD_SET);
    cl_mem b[CASTLE_TENSOR_COUNT];
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t)
        b[t] = buf(&x, t);
    cl_command_queue q = h_queue();
    castle_context *cx = ctx();
#define FWD(desc, lse)                                                                                                 \
    castle_causal_forward(cx, desc, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC], b[CASTLE_TENSOR_VC], b[CASTLE_TENSOR_O], \
                          lse, q, 0, NULL, NULL)
    ck_assert(FWD(NULL, b[CASTLE_TENSOR_LSE]) == CASTLE_ERR_NULL_POINTER);
    ck_assert(FWD(&x.desc, NULL) == CASTLE_ERR_NULL_BUFFER);                     /* lse is required */
    ck_assert(FWD(&x.desc, b[CASTLE_TENSOR_QC]) == CASTLE_ERR_INVALID_ARGUMENT); /* an output on an input */
    castle_attention_desc bad = x.desc;
    bad.head_dim = CASTLE_MAX_HEAD_DIM + 1;
    ck_assert(FWD(&bad, b[CASTLE_TENSOR_LSE]) == CASTLE_ERR_HEAD_DIM);
    bad = x.desc;
    bad.seq_len = c.L + 1; /* the buffers are one row short */
    ck_assert(FWD(&bad, b[CASTLE_TENSOR_LSE]) == CASTLE_ERR_BUFFER_TOO_SMALL);
    ck_assert(castle_causal_forward(NULL, &x.desc, b[3], b[4], b[5], b[6], b[7], q, 0, NULL, NULL) ==
              CASTLE_ERR_NULL_CONTEXT);
    ck_assert(castle_causal_forward(cx, &x.desc, b[3], b[4], b[5], b[6], b[7], q, 1, NULL, NULL) ==
              CASTLE_ERR_WAIT_LIST);
#undef FWD
#define BWD(dq, dk, dv)                                                                                                \
    castle_causal_backward(cx, &x.desc, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC], b[CASTLE_TENSOR_VC],                 \
                           b[CASTLE_TENSOR_O], b[CASTLE_TENSOR_LSE], b[CASTLE_TENSOR_DO], dq, dk, dv, q, 0, NULL,      \
                           NULL)
    ck_assert(BWD(b[CASTLE_TENSOR_DQC], b[CASTLE_TENSOR_DKC], NULL) == CASTLE_ERR_NULL_BUFFER);
    ck_assert(BWD(b[CASTLE_TENSOR_DQC], b[CASTLE_TENSOR_DQC], b[CASTLE_TENSOR_DVC]) == CASTLE_ERR_INVALID_ARGUMENT);
    ck_assert(BWD(b[CASTLE_TENSOR_DQC], b[CASTLE_TENSOR_DKC], b[CASTLE_TENSOR_DO]) == CASTLE_ERR_INVALID_ARGUMENT);
    ck_assert(BWD(b[CASTLE_TENSOR_O], b[CASTLE_TENSOR_DKC], b[CASTLE_TENSOR_DVC]) == CASTLE_ERR_INVALID_ARGUMENT);
    /* nothing was written by the refused calls */
    for (int t = CASTLE_TENSOR_O; t < CASTLE_TENSOR_COUNT; ++t)
        if ((x.set & BIT(t)) && !(INPUTS & BIT(t))) {
            float *all = malloc(x.span[t] * sizeof(float));
            ck_assert(all && h_guarded_read(q, &x.g[t], all, x.used[t]));
            ck_assert(!memcmp(all, x.host[t], x.span[t] * sizeof(float)));
            free(all);
        }
    io_inputs_intact(&x);
    /* o and lse are inputs of the backward, and inputs may share memory: d_o may be o's buffer.  The
       gradients are those of the same call with d_o a copy of o (o and lse from a forward first, so
       that the gradients are not all 0). */
    ck_assert(castle_causal_forward(cx, &x.desc, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC], b[CASTLE_TENSOR_VC],
                                    b[CASTLE_TENSOR_O], b[CASTLE_TENSOR_LSE], q, 0, NULL, NULL) == CASTLE_SUCCESS);
    const size_t ob = x.span[CASTLE_TENSOR_O] * sizeof(float);
    cl_int err = CL_SUCCESS;
    cl_mem copy = clCreateBuffer(castle_context_cl_context(cx), CL_MEM_READ_WRITE, ob, NULL, &err);
    ck_assert(copy && clEnqueueCopyBuffer(q, b[CASTLE_TENSOR_O], copy, 0, 0, ob, 0, NULL, NULL) == CL_SUCCESS);
    float *grads[2];
    for (int r = 0; r < 2; ++r) {
        ck_assert(castle_causal_backward(cx, &x.desc, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC], b[CASTLE_TENSOR_VC],
                                         b[CASTLE_TENSOR_O], b[CASTLE_TENSOR_LSE], r ? copy : b[CASTLE_TENSOR_O],
                                         b[CASTLE_TENSOR_DQC], b[CASTLE_TENSOR_DKC], b[CASTLE_TENSOR_DVC], q, 0, NULL,
                                         NULL) == CASTLE_SUCCESS);
        size_t n = 0;
        for (int t = CASTLE_TENSOR_DQC; t <= CASTLE_TENSOR_DVC; ++t)
            n += x.span[t];
        grads[r] = malloc(n * sizeof(float));
        ck_assert(grads[r] != NULL);
        n = 0;
        for (int t = CASTLE_TENSOR_DQC; t <= CASTLE_TENSOR_DVC; ++t) {
            ck_assert(clEnqueueReadBuffer(q, b[t], CL_TRUE, 0, x.span[t] * sizeof(float), grads[r] + n, 0, NULL, NULL) ==
                      CL_SUCCESS);
            n += x.span[t];
        }
        if (r) {
            ck_assert_msg(!memcmp(grads[0], grads[1], n * sizeof(float)),
                          "the gradients with d_o = o differ from those with a copy of o");
            size_t nonzero = 0; /* the comparison is of gradients, not of sentinels or zeros */
            for (int t = CASTLE_TENSOR_DQC, k = 0; t <= CASTLE_TENSOR_DVC; ++t)
                for (size_t i = 0; i < x.span[t]; ++i, ++k)
                    nonzero += grads[1][k] != x.host[t][i] && grads[1][k] != 0.0f;
            ck_assert_msg(nonzero > n / 2, "only %zu of %zu gradient entries written and non-zero", nonzero, n);
        }
    }
    /* The fields castle.h says the causal calls ignore are not checked: a negative window and the U
       tensors' layouts (a row stride below d, an extent that overflows, gradient rows that overlap).
       They were (NEGATIVE_WINDOW, BAD_STRIDE, SIZE_OVERFLOW); now the calls run and their outputs are
       bitwise those of the plain descriptor. */
    castle_attention_desc odd = x.desc;
    odd.window = -1;
    odd.layout[CASTLE_TENSOR_QU] = (castle_layout){0, 0, 1};
    odd.layout[CASTLE_TENSOR_KU] = (castle_layout){SIZE_MAX / 2, 0, c.d};
    odd.layout[CASTLE_TENSOR_DQU] = (castle_layout){1, 1, c.d};
    ck_assert_msg(castle_causal_backward(cx, &odd, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC], b[CASTLE_TENSOR_VC],
                                         b[CASTLE_TENSOR_O], b[CASTLE_TENSOR_LSE], copy, b[CASTLE_TENSOR_DQC],
                                         b[CASTLE_TENSOR_DKC], b[CASTLE_TENSOR_DVC], q, 0, NULL,
                                         NULL) == CASTLE_SUCCESS,
                  "backward, ignored fields: %s", castle_last_error());
    for (int t = CASTLE_TENSOR_DQC, k = 0; t <= CASTLE_TENSOR_DVC; k += (int)x.span[t], ++t) {
        float *g = malloc(x.span[t] * sizeof(float));
        ck_assert(g && clEnqueueReadBuffer(q, b[t], CL_TRUE, 0, x.span[t] * sizeof(float), g, 0, NULL, NULL) ==
                           CL_SUCCESS);
        ck_assert_msg(!memcmp(g, grads[1] + k, x.span[t] * sizeof(float)),
                      "backward, ignored fields: gradient %d differs", t);
        free(g);
    }
    float *o_plain = io_out(&x, &c, CASTLE_TENSOR_O), *l_plain = io_out(&x, &c, CASTLE_TENSOR_LSE);
    /* nor the layouts of tensors a call does not take: the forward's gradients and d_o */
    odd.layout[CASTLE_TENSOR_DO] = (castle_layout){1, 1, 1};
    odd.layout[CASTLE_TENSOR_DQC] = (castle_layout){SIZE_MAX / 2, 0, c.d};
    ck_assert_msg(castle_causal_forward(cx, &odd, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC], b[CASTLE_TENSOR_VC],
                                        b[CASTLE_TENSOR_O], b[CASTLE_TENSOR_LSE], q, 0, NULL, NULL) == CASTLE_SUCCESS,
                  "forward, ignored fields: %s", castle_last_error());
    float *o_odd = io_out(&x, &c, CASTLE_TENSOR_O), *l_odd = io_out(&x, &c, CASTLE_TENSOR_LSE);
    ck_assert(!memcmp(o_plain, o_odd, c.B * c.H * c.L * c.d * sizeof(float)));
    ck_assert(!memcmp(l_plain, l_odd, c.B * c.H * c.L * sizeof(float)));
    free(o_plain), free(l_plain), free(o_odd), free(l_odd);
    /* a prefill without lse, whose LSE layout is then not taken either: its o bitwise the plain
       descriptor's */
    odd.layout[CASTLE_TENSOR_LSE] = (castle_layout){1, 1, 0};
    float *o_pre[2];
    castle_kv_cache *kc = NULL;
    for (int r = 0; r < 2; ++r) {
        ck_assert_msg(castle_kv_cache_create(cx, &x.desc, &kc) == CASTLE_SUCCESS, "%s", castle_last_error());
        ck_assert_msg(castle_causal_prefill(cx, kc, r ? &odd : &x.desc, b[CASTLE_TENSOR_QC], b[CASTLE_TENSOR_KC],
                                            b[CASTLE_TENSOR_VC], b[CASTLE_TENSOR_O], NULL, q, 0, NULL,
                                            NULL) == CASTLE_SUCCESS,
                      "prefill, ignored fields: %s", castle_last_error());
        castle_kv_cache_destroy(kc);
        o_pre[r] = io_out(&x, &c, CASTLE_TENSOR_O);
    }
    ck_assert(!memcmp(o_pre[0], o_pre[1], c.B * c.H * c.L * c.d * sizeof(float)));
    free(o_pre[0]), free(o_pre[1]);
    /* castle_kv_cache_create uses neither window, scale nor layouts */
    odd.scale = -1.0f;
    kc = NULL;
    ck_assert_msg(castle_kv_cache_create(cx, &odd, &kc) == CASTLE_SUCCESS, "%s", castle_last_error());
    castle_kv_cache_destroy(kc);
#undef BWD
    free(grads[0]);
    free(grads[1]);
    clReleaseMemObject(copy);
    io_free(&x);
}
END_TEST

Suite *causal_suite(void)
{
    Suite *s = suite_create("causal");
    TCase *tc = tcase_create("reference");
    tcase_add_test(tc, test_ref_by_hand);
    tcase_add_test(tc, test_ref_backward_fd);
    suite_add_tcase(s, tc);
    tc = tcase_create("forward");
    tcase_set_timeout(tc, 300);
    CONFORMANCE_LOOP(tc, test_conformance_forward, CONF_CAUSAL_FORWARD);
    tcase_add_test(tc, test_forward_window_ignored);
    tcase_add_loop_test(tc, test_forward_causality, 0, NPOISON_ROWS);
    suite_add_tcase(s, tc);
    tc = tcase_create("backward");
    tcase_set_timeout(tc, 300);
    CONFORMANCE_LOOP(tc, test_conformance_backward, CONF_CAUSAL_BACKWARD);
    tcase_add_test(tc, test_backward_reproducible);
    tcase_add_loop_test(tc, test_backward_saturated, 0, 3);
    tcase_add_loop_test(tc, test_backward_causality, 0, NPOISON_ROWS);
    suite_add_tcase(s, tc);
    tc = tcase_create("decode");
    tcase_set_timeout(tc, 300);
    CONFORMANCE_LOOP(tc, test_conformance_decode, CONF_CAUSAL_DECODE);
    tcase_add_loop_test(tc, test_decode_invariant, 0, (int)conf_ncausal_decode_cases);
    tcase_add_test(tc, test_decode_long);
    tcase_add_test(tc, test_decode_out_of_order);
    tcase_add_loop_test(tc, test_decode_causality, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("classes");
    tcase_set_tags(tc, "variants"); /* tests/CMakeLists.txt: castle_variants */
    tcase_set_timeout(tc, 1200); /* three classes built cold, beside other suites (ctest -j) */
    tcase_add_loop_test(tc, test_head_dim_classes, 0, 3);
    tcase_add_test(tc, test_forward_own_shape);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_add_test(tc, test_cache_api);
    tcase_add_test(tc, test_argument_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(causal_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
