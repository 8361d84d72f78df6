/* The UQ-KV cache (docs/algorithm.md section 5) on the OpenCL device (CASTLE_DEVICE):
 *
 *   invariants  prefill of P_b tokens (sequences of one batch may differ), then decode of the rest,
 *               one token per call or in chunks: the outputs equal one forward over the whole
 *               sequence (the fp64 recurrent reference, and castle_forward on the device), and the
 *               cache equals the cache of one prefill of all tokens (the fp64 ref_prefill_cache_u,
 *               and a second cache prefilled with everything); KC, VC and the QU ring exactly.
 *               CASTLE and SWL (windows 1, 5, 100, and one past the capacity), d 1, 16, 64, packed,
 *               (B, L, H, d) and padded layouts, guard regions around every output.
 *   from empty  a cache decoded token by token from length 0 (after a reset, too).
 *   queue       an out-of-order queue with events between the calls gives the same results.
 *   capacity    a decode or prefill past the capacity returns CASTLE_ERR_CACHE_FULL, enqueues nothing
 *               and leaves the cache (all four tensors, the lengths) as it was.
 *   mismatch    batch, heads, head_dim, window, scale other than the cache's: CASTLE_ERR_SHAPE_MISMATCH;
 *               a second prefill: CASTLE_ERR_CACHE_NOT_EMPTY; other argument errors.
 *   api         bytes, lengths, buffers, reset, destroy(NULL), status names.
 *   causality   a NaN or Inf in any input at token r (in the prompt or among the decoded tokens)
 *               leaves every output before r bitwise as it was; NaN or Inf in the padding past
 *               prompt_lengths leaves every output (prefill and decode) bitwise as it was. */
#include "conformance_check.h"
#include "harness.h"
#include "ref.h"
#include "tolerance.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXB CONF_MAXB
#define PAD 100 /* poison.tensor: the padding of the prefill's shorter sequences */

/* The conformance table's UQ-KV cache cases (conformance/table.c). */
typedef conf_dec_case dec_case;
#define cases conf_decode_cases
#define NCASES ((int)conf_ndecode_cases)

static size_t cap_of(const dec_case *c) { return conf_decode_capacity(c); }

static size_t maxP(const dec_case *c)
{
    size_t m = 0;
    for (size_t b = 0; b < c->B; ++b)
        m = c->P[b] > m ? c->P[b] : m;
    return m;
}

static double scale_of(const dec_case *c) { return 1.0 / sqrt((double)c->d); }

/* Set by the causality tests only: a non-finite value planted in input `tensor` at token `row` (every
   sequence, head and column; tensor < 0: none), and in the padding of a prefill (rows at or past
   pad_from[b] of sequence b, when pad_from is set). */
static struct {
    int tensor;
    size_t row;
    float value;
    const size_t *pad_from;
} poison = {-1, 0, 0.0f, NULL};

static float val(const dec_case *c, unsigned t, size_t b, size_t h, size_t pos, size_t e)
{
    if ((int)t == poison.tensor && pos == poison.row)
        return poison.value;
    return (float)h_value(c->seed, t, b, h, pos, e);
}

static void desc_for(const dec_case *c, castle_attention_desc *desc, size_t rows)
{
    castle_attention_desc_init(desc, c->B, c->H, rows, c->d);
    desc->window = c->W;
    h_apply_layout(desc, c->layout);
}

/* The inputs of a call (conformance.h, conf_io_make): the case's values, poisoned where the causality
   tests say. */
static float dec_value(const void *user, unsigned t, size_t b, size_t h, size_t pos, size_t r, size_t e)
{
    const dec_case *c = user;
    return poison.pad_from && r >= poison.pad_from[b] ? poison.value : val(c, t, b, h, pos, e);
}

/* One call's tensors inside guard regions (conformance.h): inputs at positions base[b] + r. */
typedef conf_call_io call_io;

static void io_make(const dec_case *c, const size_t *base, size_t rows, call_io *io)
{
    castle_attention_desc desc;
    desc_for(c, &desc, rows);
    ck_assert_msg(conf_io_make(h_context(), h_queue(), &desc, c->with_lse, base, dec_value, c, io),
                  "could not make a call's buffers");
}

/* Reads the outputs back (guards checked) into logical o (B, H, Lmax, d) / lse (B, H, Lmax) at
   positions base[b] + r for r < count[b]. */
static void io_collect(call_io *io, const size_t *base, const size_t *count, size_t Lmax, float *o, float *lse)
{
    ck_assert_msg(conf_io_collect(h_queue(), io, base, count, Lmax, o, lse),
                  "a guard region around a tensor changed (or an input was written)");
}

static castle_cache *new_cache(const dec_case *c, size_t cap)
{
    castle_attention_desc desc;
    desc_for(c, &desc, cap);
    castle_cache *cache = NULL;
    castle_status st = castle_cache_create(h_context(), &desc, &cache);
    ck_assert_msg(st == CASTLE_SUCCESS, "castle_cache_create: %s", castle_last_error());
    return cache;
}

static castle_status prefill(castle_cache *cache, call_io *io, const size_t *lengths, cl_command_queue q, cl_uint nwait,
                             const cl_event *wait, cl_event *ev)
{
    return castle_prefill(h_context(), cache, &io->desc, lengths, conf_io_buf(io, 0), conf_io_buf(io, 1), conf_io_buf(io, 2),
                          conf_io_buf(io, 3), conf_io_buf(io, 4), conf_io_buf(io, 5), conf_io_buf(io, 6), conf_io_buf(io, 7), q, nwait, wait,
                          ev);
}

static castle_status decode(castle_cache *cache, call_io *io, cl_command_queue q, cl_uint nwait, const cl_event *wait,
                            cl_event *ev)
{
    return castle_decode(h_context(), cache, &io->desc, conf_io_buf(io, 0), conf_io_buf(io, 1), conf_io_buf(io, 2), conf_io_buf(io, 3),
                         conf_io_buf(io, 4), conf_io_buf(io, 5), conf_io_buf(io, 6), conf_io_buf(io, 7), q, nwait, wait, ev);
}

/* Prefill of P_b (ragged when they differ), then decode of n tokens in chunks; outputs into o, lse
   (logical, Lmax = the capacity).  Returns the cache. */
static castle_cache *run_sequence(const dec_case *c, float *o, float *lse)
{
    const size_t cap = cap_of(c), Pm = maxP(c);
    castle_cache *cache = new_cache(c, cap);
    size_t cur[MAXB] = {0}, zero[MAXB] = {0};
    cl_command_queue q = h_queue();
    if (Pm > 0) {
        call_io io;
        poison.pad_from = poison.tensor == PAD ? c->P : NULL; /* only the prefill has padding */
        io_make(c, zero, Pm, &io);
        poison.pad_from = NULL;
        bool ragged = false;
        for (size_t b = 0; b < c->B; ++b)
            ragged = ragged || c->P[b] != Pm;
        castle_status st = prefill(cache, &io, ragged ? c->P : NULL, q, 0, NULL, NULL);
        ck_assert_msg(st == CASTLE_SUCCESS, "castle_prefill: %s", castle_last_error());
        io_collect(&io, zero, c->P, cap, o, lse);
        conf_io_free(&io);
        memcpy(cur, c->P, sizeof cur);
    }
    size_t lengths[MAXB];
    for (size_t done = 0; done < c->n; done += c->chunk) {
        const size_t k = c->n - done < c->chunk ? c->n - done : c->chunk;
        call_io io;
        io_make(c, cur, k, &io);
        castle_status st = decode(cache, &io, q, 0, NULL, NULL);
        ck_assert_msg(st == CASTLE_SUCCESS, "castle_decode of %zu tokens at %zu: %s", k, done, castle_last_error());
        const size_t cnt[MAXB] = {k, k};
        io_collect(&io, cur, cnt, cap, o, lse);
        conf_io_free(&io);
        for (size_t b = 0; b < c->B; ++b)
            cur[b] += k;
        ck_assert(castle_cache_lengths(cache, lengths) == CASTLE_SUCCESS);
        for (size_t b = 0; b < c->B; ++b)
            ck_assert_msg(lengths[b] == cur[b], "length of sequence %zu: %zu, expected %zu", b, lengths[b], cur[b]);
    }
    return cache;
}

/* The logical inputs of (b, h), positions 0..L-1, as doubles (6 x L x d). */
static double *inputs_of(const dec_case *c, size_t b, size_t h, size_t L)
{
    double *x = malloc(6 * L * c->d * sizeof(double) + 1);
    ck_assert(x);
    for (unsigned t = 0; t < 6; ++t)
        for (size_t r = 0; r < L; ++r)
            for (size_t e = 0; e < c->d; ++e)
                x[(t * L + r) * c->d + e] = val(c, t, b, h, r, e);
    return x;
}

/* The cache's tensor, all of it (B, H, rows, d). */
static float *read_cache(castle_cache *cache, castle_cache_tensor t, size_t *rows, size_t bh, size_t d)
{
    cl_mem buf;
    ck_assert(castle_cache_buffer(cache, t, &buf, rows) == CASTLE_SUCCESS);
    const size_t n = bh * *rows * d;
    float *x = malloc(n * sizeof(float));
    ck_assert(x);
    cl_int err = clEnqueueReadBuffer(h_queue(), buf, CL_TRUE, 0, n * sizeof(float), x, 0, NULL, NULL);
    ck_assert_msg(err == CL_SUCCESS, "reading the cache: %d", (int)err);
    return x;
}

typedef struct cache_host {
    float *t[4];
    size_t rows[4];
} cache_host;

static void cache_read_all(castle_cache *cache, const dec_case *c, cache_host *ch)
{
    for (int t = 0; t < 4; ++t)
        ch->t[t] = read_cache(cache, (castle_cache_tensor)t, &ch->rows[t], c->B * c->H, c->d);
}

static void cache_host_free(cache_host *ch)
{
    for (int t = 0; t < 4; ++t)
        free(ch->t[t]);
}

/* Checks the cache holding lengths len[b]: U against the fp64 prefill reference and against U2
   (another cache's U, if given), KC, VC and the QU ring exactly against the inputs. */
static void check_cache(const dec_case *c, const cache_host *ch, const size_t *len, const cache_host *other,
                        const char *what)
{
    const size_t d = c->d, cap = ch->rows[CASTLE_CACHE_U], R = ch->rows[CASTLE_CACHE_QU];
    double err = 0, err2 = 0;
    for (size_t b = 0; b < c->B; ++b)
        for (size_t h = 0; h < c->H; ++h) {
            const size_t L = len[b], bh = b * c->H + h;
            if (!L)
                continue;
            double *x = inputs_of(c, b, h, L), *u = malloc(L * d * sizeof(double));
            ck_assert(u);
            ck_assert(!ref_prefill_cache_u((int)L, (int)d, (int)c->W, scale_of(c), x, x + L * d, x + 2 * L * d, u));
            double m = 1, e = 0, e2 = 0;
            for (size_t i = 0; i < L * d; ++i) {
                const float got = ch->t[CASTLE_CACHE_U][bh * cap * d + i];
                ck_assert_msg(isfinite(got), "%s: U not finite", what);
                m = fmax(m, fabs(u[i]));
                e = fmax(e, fabs(got - u[i]));
                if (other)
                    e2 = fmax(e2, fabs(got - other->t[CASTLE_CACHE_U][bh * cap * d + i]));
            }
            err = fmax(err, e / m);
            err2 = fmax(err2, e2 / m);
            for (size_t s = 0; s < L; ++s)
                for (size_t e3 = 0; e3 < d; ++e3) {
                    const size_t at = (bh * cap + s) * d + e3;
                    ck_assert_msg(ch->t[CASTLE_CACHE_KC][at] == (float)x[(4 * L + s) * d + e3] &&
                                      ch->t[CASTLE_CACHE_VC][at] == (float)x[(5 * L + s) * d + e3],
                                  "%s: KC/VC row %zu of (b %zu, h %zu) differs from the input", what, s, b, h);
                    if (s + R >= L) /* the ring keeps the last R rows */
                        ck_assert_msg(ch->t[CASTLE_CACHE_QU][(bh * R + s % R) * d + e3] == (float)x[s * d + e3],
                                      "%s: QU ring row of token %zu (b %zu, h %zu) differs from the input", what, s, b,
                                      h);
                }
            free(u);
            free(x);
        }
    if (getenv("CASTLE_TEST_VERBOSE"))
        fprintf(stderr, "%s: U err vs ref %.3g, vs one prefill %.3g\n", what, err, err2);
    ck_assert_msg(err <= CACHE_U_TOL, "%s: U differs from ref_prefill_cache_u by %.3g > %.3g", what, err, CACHE_U_TOL);
    ck_assert_msg(err2 <= CACHE_U_TOL, "%s: U differs from one prefill of all tokens by %.3g > %.3g", what, err2,
                  CACHE_U_TOL);
}

/* The conformance table's decode cases: outputs against the fp64 recurrent reference, guard regions. */
START_TEST(test_conformance_decode) { conformance_check(CONF_DECODE, _i); }
END_TEST
START_TEST(test_conformance_chunked) { conformance_check(CONF_DECODE_CHUNKED, _i); }
END_TEST

/* The GPU entry builds the cache's kernels per head-dimension class: each class's programs, side by
   side on one context, pass a prefill + decode case of their width (one token or a chunk per call). */
START_TEST(test_head_dim_classes)
{
    static const conf_op ops[] = {CONF_DECODE, CONF_DECODE_CHUNKED};
    conformance_head_dim_classes(ops, 2);
}
END_TEST

START_TEST(test_invariants)
{
    const dec_case *c = &cases[_i];
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const size_t cap = cap_of(c), d = c->d, BH = c->B * c->H;
    float *o = calloc(BH * cap * d, sizeof(float)), *lse = calloc(BH * cap, sizeof(float));
    ck_assert(o && lse);
    castle_cache *cache = run_sequence(c, o, lse);

    /* 1. outputs against the fp64 recurrent reference: test_conformance_*, the same cases */
    size_t len[MAXB];
    for (size_t b = 0; b < c->B; ++b)
        len[b] = c->P[b] + c->n;

    /* 2. outputs against castle_forward over the longest sequence (causal: the prefix rows of a
       longer run are the outputs of the shorter one) */
    const size_t Lmax = cap - c->extra_cap;
    h_fwd_case fc = {c->B, c->H, Lmax, d, c->W, H_BHLD, 1, 0, c->seed};
    h_fwd_out fo;
    ck_assert_msg(h_run_forward(ctx, h_queue(), &fc, false, true, &fo) == CASTLE_SUCCESS, "forward: %s",
                  castle_last_error());
    double err_f = 0;
    for (size_t b = 0; b < c->B; ++b)
        for (size_t h = 0; h < c->H; ++h) {
            const size_t bh = b * c->H + h;
            for (size_t i = 0; i < len[b] * d; ++i)
                err_f = fmax(err_f, fabs(o[bh * cap * d + i] - fo.o[bh * Lmax * d + i]));
        }
    h_fwd_out_free(&fo);
    if (getenv("CASTLE_TEST_VERBOSE"))
        fprintf(stderr, "case %d: vs forward %.3g\n", _i, err_f);
    ck_assert_msg(err_f <= DECODE_TOL, "case %d: against castle_forward %.3g > %.3g", _i, err_f, DECODE_TOL);

    /* 3. the cache against the reference and against one prefill of all tokens */
    cache_host mine, one;
    cache_read_all(cache, c, &mine);
    {
        dec_case all = *c;
        size_t L = 0;
        for (size_t b = 0; b < c->B; ++b) {
            all.P[b] = len[b];
            L = len[b] > L ? len[b] : L;
        }
        all.n = 0;
        castle_cache *whole = new_cache(c, cap);
        call_io io;
        const size_t zero[MAXB] = {0};
        io_make(&all, zero, L, &io);
        bool ragged = false;
        for (size_t b = 0; b < c->B; ++b)
            ragged = ragged || len[b] != L;
        ck_assert_msg(prefill(whole, &io, ragged ? len : NULL, h_queue(), 0, NULL, NULL) == CASTLE_SUCCESS,
                      "prefill of all tokens: %s", castle_last_error());
        conf_io_free(&io);
        cache_read_all(whole, c, &one);
        castle_cache_destroy(whole);
    }
    char what[64];
    snprintf(what, sizeof what, "case %d, prefill + decode", _i);
    check_cache(c, &mine, len, &one, what);
    snprintf(what, sizeof what, "case %d, one prefill", _i);
    check_cache(c, &one, len, NULL, what);
    cache_host_free(&mine);
    cache_host_free(&one);
    castle_cache_destroy(cache);
    free(o);
    free(lse);
}
END_TEST

/* A lookahead score that overflows float32 before it is scaled (h_overflow_lookahead): token 64
   decoded after a prompt of 64 tokens, then token 65, give castle_forward's finite rows (DECODE_TOL),
   and the forward the fp64 reference's.  castle_silu as x sigmoid(x) gave -inf x 0 = NaN there. */
START_TEST(test_overflowing_score)
{
    const conf_dec_case c = {1, 1, 1 + 7 * (size_t)_i, 0, {64, 0}, 2, 1, 0, H_BHLD, true, 31, true};
    const size_t cap = conf_decode_capacity(&c), d = c.d;
    float *o = calloc(cap * d, sizeof *o), *lse = calloc(cap, sizeof *lse);
    ck_assert(o && lse);
    bool guards = false;
    const h_fwd_case fc = {1, 1, cap, d, 0, H_BHLD, 1, 0, c.seed};
    h_fwd_out fo;
    h_input_hook = h_overflow_lookahead;
    castle_status sd = conf_run_decode(h_context(), &c, o, lse, &guards, NULL);
    castle_status sf = h_run_forward(h_context(), h_queue(), &fc, true, true, &fo);
    h_input_hook = NULL;
    ck_assert_msg(sd == CASTLE_SUCCESS && sf == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert_msg(guards && fo.guards_ok && fo.finite, "d=%zu: guards or a non-finite forward", d);
    ck_assert_msg(fo.err_o <= FORWARD_TOL && fo.err_lse <= FORWARD_TOL, "d=%zu: forward error o %.3g, lse %.3g", d,
                  fo.err_o, fo.err_lse);
    for (size_t t = 64; t < cap; ++t) {
        ck_assert_msg(isfinite(lse[t]) && fabs(lse[t] - fo.lse[t]) <= DECODE_TOL, "d=%zu token %zu: lse %g, forward %g",
                      d, t, (double)lse[t], (double)fo.lse[t]);
        for (size_t e = 0; e < d; ++e)
            ck_assert_msg(isfinite(o[t * d + e]) && fabs(o[t * d + e] - fo.o[t * d + e]) <= DECODE_TOL,
                          "d=%zu token %zu: o %g, forward %g", d, t, (double)o[t * d + e], (double)fo.o[t * d + e]);
    }
    h_fwd_out_free(&fo);
    free(o);
    free(lse);
}
END_TEST

/* Decoding from an empty cache (P = 0) equals the forward; so does it after a reset of a used cache. */
START_TEST(test_from_empty)
{
    const dec_case c = {2, 2, 16, 3, {0, 0}, 40, 3, 5, H_BHLD, true, 21, false};
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    const size_t cap = cap_of(&c), d = c.d, BH = c.B * c.H;
    float *o = calloc(BH * cap * d, sizeof(float)), *lse = calloc(BH * cap, sizeof(float));
    float *o2 = calloc(BH * cap * d, sizeof(float)), *lse2 = calloc(BH * cap, sizeof(float));
    ck_assert(o && lse && o2 && lse2);
    castle_cache *cache = run_sequence(&c, o, lse);
    castle_cache_destroy(cache);
    /* A used cache, reset, then the same sequence: the same outputs bit for bit. */
    dec_case c2 = c;
    c2.P[0] = c2.P[1] = 10;
    c2.n = 5;
    c2.extra_cap = cap - 15;
    float *junk = calloc(BH * cap * d, sizeof(float)), *junk_l = calloc(BH * cap, sizeof(float));
    ck_assert(junk && junk_l);
    cache = run_sequence(&c2, junk, junk_l);
    ck_assert(castle_cache_reset(cache) == CASTLE_SUCCESS);
    size_t lengths[MAXB];
    ck_assert(castle_cache_lengths(cache, lengths) == CASTLE_SUCCESS && lengths[0] == 0 && lengths[1] == 0);
    size_t cur[MAXB] = {0};
    for (size_t done = 0; done < c.n; done += c.chunk) {
        const size_t k = c.n - done < c.chunk ? c.n - done : c.chunk;
        call_io io;
        io_make(&c, cur, k, &io);
        ck_assert_msg(decode(cache, &io, h_queue(), 0, NULL, NULL) == CASTLE_SUCCESS, "decode: %s",
                      castle_last_error());
        const size_t cnt[MAXB] = {k, k};
        io_collect(&io, cur, cnt, cap, o2, lse2);
        conf_io_free(&io);
        cur[0] += k;
        cur[1] += k;
    }
    ck_assert_msg(!memcmp(o, o2, BH * cap * d * sizeof(float)), "decode after a reset differs from a fresh cache");
    ck_assert_msg(!memcmp(lse, lse2, BH * cap * sizeof(float)), "lse after a reset differs from a fresh cache");
    /* and against the forward */
    h_fwd_case fc = {c.B, c.H, c.n, d, c.W, H_BHLD, 1, 0, c.seed};
    h_fwd_out fo;
    ck_assert(h_run_forward(ctx, h_queue(), &fc, false, true, &fo) == CASTLE_SUCCESS);
    double err = 0;
    for (size_t bh = 0; bh < BH; ++bh)
        for (size_t i = 0; i < c.n * d; ++i)
            err = fmax(err, fabs(o[bh * cap * d + i] - fo.o[bh * c.n * d + i]));
    h_fwd_out_free(&fo);
    ck_assert_msg(err <= DECODE_TOL, "decode from empty against castle_forward: %.3g", err);
    castle_cache_destroy(cache);
    free(o);
    free(lse);
    free(o2);
    free(lse2);
    free(junk);
    free(junk_l);
}
END_TEST

/* An out-of-order queue, every call waiting for the previous call's event: the same outputs. */
START_TEST(test_out_of_order_queue)
{
    const dec_case c = {2, 2, 16, 5, {20, 9}, 12, 5, 0, H_BHLD, true, 31, false};
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    cl_command_queue oq = h_out_of_order_queue(ctx, "test_out_of_order_queue");
    if (!oq)
        return;
    const size_t cap = cap_of(&c), d = c.d, BH = c.B * c.H;
    float *o = calloc(BH * cap * d, sizeof(float)), *lse = calloc(BH * cap, sizeof(float));
    float *o2 = calloc(BH * cap * d, sizeof(float)), *lse2 = calloc(BH * cap, sizeof(float));
    ck_assert(o && lse && o2 && lse2);
    castle_cache *ref = run_sequence(&c, o, lse);
    castle_cache_destroy(ref);

    castle_cache *cache = new_cache(&c, cap);
    size_t cur[MAXB] = {0};
    call_io ios[8];
    int nio = 0;
    cl_event ev = NULL;
    io_make(&c, cur, maxP(&c), &ios[nio]);
    ck_assert(prefill(cache, &ios[nio], c.P, oq, 0, NULL, &ev) == CASTLE_SUCCESS);
    ++nio;
    memcpy(cur, c.P, sizeof cur);
    size_t bases[8][MAXB], counts[8][MAXB];
    memset(bases, 0, sizeof bases);
    memcpy(counts[0], c.P, sizeof counts[0]);
    for (size_t done = 0; done < c.n; done += c.chunk) {
        const size_t k = c.n - done < c.chunk ? c.n - done : c.chunk;
        io_make(&c, cur, k, &ios[nio]);
        memcpy(bases[nio], cur, sizeof cur);
        counts[nio][0] = counts[nio][1] = k;
        cl_event next = NULL;
        ck_assert_msg(decode(cache, &ios[nio], oq, 1, &ev, &next) == CASTLE_SUCCESS, "decode: %s", castle_last_error());
        clReleaseEvent(ev);
        ev = next;
        ++nio;
        cur[0] += k;
        cur[1] += k;
    }
    ck_assert(clWaitForEvents(1, &ev) == CL_SUCCESS);
    clReleaseEvent(ev);
    for (int i = 0; i < nio; ++i) {
        io_collect(&ios[i], bases[i], counts[i], cap, o2, lse2);
        conf_io_free(&ios[i]);
    }
    ck_assert_msg(!memcmp(o, o2, BH * cap * d * sizeof(float)), "outputs on an out-of-order queue differ");
    castle_cache_destroy(cache);
    clReleaseCommandQueue(oq);
    free(o);
    free(lse);
    free(o2);
    free(lse2);
}
END_TEST

/* Rows [0, r[b]) of sequence b, every head, of logical (B, H, Lmax, w) arrays a and b, bitwise. */
static bool same_prefix(const dec_case *c, const float *a, const float *b, size_t Lmax, size_t w, const size_t *r)
{
    for (size_t s = 0; s < c->B; ++s)
        for (size_t h = 0; h < c->H; ++h) {
            const size_t at = (s * c->H + h) * Lmax * w;
            if (memcmp(a + at, b + at, r[s] * w * sizeof(float)))
                return false;
        }
    return true;
}

/* Ragged prompts (20 and 9 tokens), then chunks of 3 (_i = 0: CASTLE, 1: SWL window 5).  NaN, +Inf
   and -Inf in each of the six inputs at token 7 (in both prompts), 14 (in the longer prompt; a decoded
   token of the shorter sequence, whose prefill padding holds it too) and 24 (decoded in both), and in
   all the padding past prompt_lengths: the outputs before the token (for the padding: all of them)
   keep their bits. */
START_TEST(test_causality)
{
    const dec_case c = {2, 2, 16, _i ? 5 : 0, {20, 9}, 21, 3, 0, H_BHLD, true, 61, false};
    const size_t cap = cap_of(&c), d = c.d, BH = c.B * c.H;
    ck_assert_msg(h_context(), "no device: %s", castle_last_error());
    float *o0 = calloc(BH * cap * d, sizeof(float)), *l0 = calloc(BH * cap, sizeof(float));
    float *o = calloc(BH * cap * d, sizeof(float)), *l = calloc(BH * cap, sizeof(float));
    ck_assert(o0 && l0 && o && l);
    castle_cache_destroy(run_sequence(&c, o0, l0));
    static const float values[] = {NAN, INFINITY, -INFINITY};
    static const size_t rows[] = {24, 7, 14};
    for (int t = 0; t <= 6; ++t)
        for (int r = 0; r < (t < 6 ? 3 : 1); ++r)
            for (int v = 0; v < 3; ++v) {
                poison.tensor = t < 6 ? t : PAD;
                poison.row = rows[r];
                poison.value = values[v];
                castle_cache_destroy(run_sequence(&c, o, l));
                size_t before[MAXB]; /* outputs that must keep their bits: positions before the token */
                for (size_t b = 0; b < c.B; ++b)
                    before[b] = t == 6 ? c.P[b] + c.n : poison.row;
                ck_assert_msg(same_prefix(&c, o, o0, cap, d, before) && same_prefix(&c, l, l0, cap, 1, before),
                              "W=%ld: %g %s %d at token %zu changed an earlier output", c.W, (double)poison.value,
                              t < 6 ? "in input" : "in the padding (input any)", t, poison.row);
            }
    poison.tensor = -1;
    free(o0);
    free(l0);
    free(o);
    free(l);
}
END_TEST

static void check_status(castle_status got, castle_status want, const char *what)
{
    ck_assert_msg(got == want, "%s: got %s (%s), expected %s", what, castle_status_string(got), castle_last_error(),
                  castle_status_string(want));
    if (want != CASTLE_SUCCESS)
        ck_assert_msg(castle_last_error()[0] && !strchr(castle_last_error(), '\n'), "%s: no one-line message", what);
}

static bool same_cache(const cache_host *a, const cache_host *b, const dec_case *c)
{
    for (int t = 0; t < 4; ++t)
        if (memcmp(a->t[t], b->t[t], c->B * c->H * a->rows[t] * c->d * sizeof(float)))
            return false;
    return true;
}

/* Capacity: nothing enqueued, nothing changed, a specific status. */
START_TEST(test_capacity)
{
    const dec_case c = {2, 2, 16, _i ? 4 : 0, {10, 7}, 0, 1, 0, H_BHLD, true, 41, false};
    const size_t cap = 13;
    ck_assert_msg(h_context(), "no device: %s", castle_last_error());
    castle_cache *cache = new_cache(&c, cap);
    const size_t zero[MAXB] = {0};
    size_t cur[MAXB] = {10, 7}, lengths[MAXB];
    { /* a prompt longer than the capacity */
        dec_case big = c;
        call_io io;
        io_make(&big, zero, 14, &io);
        check_status(prefill(cache, &io, NULL, h_queue(), 0, NULL, NULL), CASTLE_ERR_CACHE_FULL, "prefill of 14 > 13");
        conf_io_free(&io);
        ck_assert(castle_cache_lengths(cache, lengths) == CASTLE_SUCCESS && !lengths[0] && !lengths[1]);
    }
    call_io io;
    io_make(&c, zero, 10, &io);
    check_status(prefill(cache, &io, c.P, h_queue(), 0, NULL, NULL), CASTLE_SUCCESS, "prefill");
    conf_io_free(&io);
    /* lengths 10/7: a chunk of 2 fits (12/9), 2 more do not, 1 does (13/10: full), then nothing does */
    static const struct {
        size_t k;
        bool fits;
    } steps[] = {{2, true}, {2, false}, {1, true}, {1, false}};
    for (int step = 0; step < 4; ++step) {
        const size_t k = steps[step].k;
        const bool fits = steps[step].fits;
        cache_host before, after;
        cache_read_all(cache, &c, &before);
        io_make(&c, cur, k, &io);
        check_status(decode(cache, &io, h_queue(), 0, NULL, NULL), fits ? CASTLE_SUCCESS : CASTLE_ERR_CACHE_FULL,
                     fits ? "decode within the capacity" : "decode past the capacity");
        if (fits) {
            cur[0] += k;
            cur[1] += k;
        }
        clFinish(h_queue());
        /* outputs of a rejected call untouched */
        if (!fits)
            for (int t = CASTLE_TENSOR_O; t <= CASTLE_TENSOR_LSE; ++t)
                ck_assert_msg(h_guarded_read(h_queue(), &io.g[t], NULL, NULL), "a rejected decode wrote its outputs");
        conf_io_free(&io);
        cache_read_all(cache, &c, &after);
        if (!fits)
            ck_assert_msg(same_cache(&before, &after, &c), "a rejected decode changed the cache");
        cache_host_free(&before);
        cache_host_free(&after);
        ck_assert(castle_cache_lengths(cache, lengths) == CASTLE_SUCCESS);
        ck_assert_msg(lengths[0] == cur[0] && lengths[1] == cur[1], "lengths %zu, %zu after step %d", lengths[0],
                      lengths[1], step);
    }
    ck_assert(cur[0] == cap);
    castle_cache_destroy(cache);
}
END_TEST

/* Descriptors that do not match the cache; a second prefill; other argument errors. */
START_TEST(test_mismatch)
{
    const dec_case c = {2, 2, 16, 5, {6, 6}, 0, 1, 0, H_BHLD, false, 51, false};
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    castle_cache *cache = new_cache(&c, 20);
    const size_t zero[MAXB] = {0};
    call_io io;
    io_make(&c, zero, 6, &io);
    cache_host before, after;
    cache_read_all(cache, &c, &before);
    for (int k = 0; k < 6; ++k) {
        castle_attention_desc bad = io.desc;
        const char *what = "";
        switch (k) {
        case 0:
            bad.batch = 1, what = "batch";
            break;
        case 1:
            bad.heads = 1, what = "heads";
            break;
        case 2:
            bad.head_dim = 8, what = "head_dim";
            break;
        case 3:
            bad.window = 0, what = "window";
            break;
        case 4:
            bad.window = 6, what = "window 6";
            break;
        case 5:
            bad.scale = 0.5f, what = "scale";
            break;
        }
        castle_status st =
            castle_decode(ctx, cache, &bad, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                          conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0, NULL, NULL);
        check_status(st, CASTLE_ERR_SHAPE_MISMATCH, what);
        /* the message names the field that differs, and only it (a head_dim that differs under scale
           0 is not reported as a scale that differs too) */
        static const char *const named[6] = {"batch=1", "heads=1", "head_dim=8", "window=0", "window=6", "scale=0.5"};
        const char *msg = castle_last_error();
        ck_assert_msg(strstr(msg, named[k]) && (k == 5 || !strstr(msg, "scale")), "%s: message '%s'", what, msg);
        st = castle_prefill(ctx, cache, &bad, NULL, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                            conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0, NULL, NULL);
        check_status(st, CASTLE_ERR_SHAPE_MISMATCH, what);
    }
    /* The explicit default scale is the same scale. */
    castle_attention_desc same = io.desc;
    same.scale = (float)(1.0 / sqrt(16.0));
    /* argument errors, each with its own status */
    check_status(castle_decode(ctx, NULL, &io.desc, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                               conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0, NULL, NULL),
                 CASTLE_ERR_NULL_POINTER, "NULL cache");
    check_status(castle_decode(ctx, cache, &io.desc, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                               conf_io_buf(&io, 4), conf_io_buf(&io, 5), NULL, NULL, h_queue(), 0, NULL, NULL),
                 CASTLE_ERR_NULL_BUFFER, "NULL o");
    check_status(castle_decode(ctx, cache, &io.desc, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                               conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 0), NULL, h_queue(), 0, NULL, NULL),
                 CASTLE_ERR_INVALID_ARGUMENT, "o is qu");
    /* the cache's own buffers (castle_cache_buffer), which prefill and decode write, as a tensor (not
       the ring of qU: its W = 5 rows are fewer than the call's 6, which is refused first) */
    for (int t = 0; t < 4; ++t) {
        if (t == CASTLE_CACHE_QU)
            continue;
        cl_mem own = NULL;
        size_t rows = 0;
        ck_assert(castle_cache_buffer(cache, (castle_cache_tensor)t, &own, &rows) == CASTLE_SUCCESS && own);
        char what[64];
        snprintf(what, sizeof what, "cache tensor %d as o of a decode", t);
        check_status(castle_decode(ctx, cache, &io.desc, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2),
                                   conf_io_buf(&io, 3), conf_io_buf(&io, 4), conf_io_buf(&io, 5), own, NULL, h_queue(), 0,
                                   NULL, NULL),
                     CASTLE_ERR_INVALID_ARGUMENT, what);
        snprintf(what, sizeof what, "cache tensor %d as kc of a prefill", t);
        check_status(castle_prefill(ctx, cache, &io.desc, NULL, conf_io_buf(&io, 0), conf_io_buf(&io, 1),
                                    conf_io_buf(&io, 2), conf_io_buf(&io, 3), own, conf_io_buf(&io, 5),
                                    conf_io_buf(&io, 6), NULL, h_queue(), 0, NULL, NULL),
                     CASTLE_ERR_INVALID_ARGUMENT, what);
        ck_assert_msg(strstr(castle_last_error(), "the cache's") != NULL, "%s: message '%s'", what, castle_last_error());
    }
    const size_t too_long[MAXB] = {7, 6};
    check_status(castle_prefill(ctx, cache, &io.desc, too_long, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2),
                                conf_io_buf(&io, 3), conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0,
                                NULL, NULL),
                 CASTLE_ERR_INVALID_ARGUMENT, "prompt length > seq_len");
    check_status(castle_decode(ctx, cache, &io.desc, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                               conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, NULL, 0, NULL, NULL),
                 CASTLE_ERR_NULL_QUEUE, "NULL queue");
    clFinish(h_queue());
    cache_read_all(cache, &c, &after);
    ck_assert_msg(same_cache(&before, &after, &c), "a rejected call changed the cache");
    cache_host_free(&before);
    cache_host_free(&after);
    size_t lengths[MAXB];
    ck_assert(castle_cache_lengths(cache, lengths) == CASTLE_SUCCESS && !lengths[0] && !lengths[1]);

    check_status(castle_prefill(ctx, cache, &same, NULL, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2), conf_io_buf(&io, 3),
                                conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0, NULL, NULL),
                 CASTLE_SUCCESS, "prefill with the explicit default scale");
    check_status(castle_prefill(ctx, cache, &io.desc, NULL, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2),
                                conf_io_buf(&io, 3), conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0,
                                NULL, NULL),
                 CASTLE_ERR_CACHE_NOT_EMPTY, "second prefill");
    clFinish(h_queue());
    cache_read_all(cache, &c, &before);
    ck_assert(castle_cache_reset(cache) == CASTLE_SUCCESS);
    check_status(castle_prefill(ctx, cache, &io.desc, NULL, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2),
                                conf_io_buf(&io, 3), conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6), NULL, h_queue(), 0,
                                NULL, NULL),
                 CASTLE_SUCCESS, "prefill after reset");
    clFinish(h_queue());
    cache_read_all(cache, &c, &after);
    ck_assert_msg(same_cache(&before, &after, &c), "prefill after a reset differs from the first prefill");
    cache_host_free(&before);
    cache_host_free(&after);
    /* A call checks the layouts of the tensors it takes, no others (castle.h, castle_layout): with a
       gradient's layout and, lse being NULL, LSE's made invalid, a prefill and a decode run and leave
       the cache and o bitwise as under the plain descriptor (they were BAD_STRIDE, SIZE_OVERFLOW). */
    castle_attention_desc odd = io.desc;
    odd.layout[CASTLE_TENSOR_DO] = (castle_layout){1, 1, 1};
    odd.layout[CASTLE_TENSOR_DQU] = (castle_layout){SIZE_MAX / 2, 0, 16};
    odd.layout[CASTLE_TENSOR_LSE] = (castle_layout){1, 1, 0};
    size_t obytes = 0;
    ck_assert(clGetMemObjectInfo(conf_io_buf(&io, 6), CL_MEM_SIZE, sizeof obytes, &obytes, NULL) == CL_SUCCESS);
    float *o_run[2];
    for (int r = 0; r < 2; ++r) {
        const castle_attention_desc *dr = r ? &odd : &io.desc;
        ck_assert(castle_cache_reset(cache) == CASTLE_SUCCESS);
        check_status(castle_prefill(ctx, cache, dr, NULL, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2),
                                    conf_io_buf(&io, 3), conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6),
                                    NULL, h_queue(), 0, NULL, NULL),
                     CASTLE_SUCCESS, r ? "prefill, unused layouts invalid" : "prefill, plain descriptor");
        check_status(castle_decode(ctx, cache, dr, conf_io_buf(&io, 0), conf_io_buf(&io, 1), conf_io_buf(&io, 2),
                                   conf_io_buf(&io, 3), conf_io_buf(&io, 4), conf_io_buf(&io, 5), conf_io_buf(&io, 6),
                                   NULL, h_queue(), 0, NULL, NULL),
                     CASTLE_SUCCESS, r ? "decode, unused layouts invalid" : "decode, plain descriptor");
        o_run[r] = malloc(obytes);
        ck_assert(o_run[r] && clEnqueueReadBuffer(h_queue(), conf_io_buf(&io, 6), CL_TRUE, 0, obytes, o_run[r], 0, NULL,
                                                  NULL) == CL_SUCCESS);
        cache_read_all(cache, &c, r ? &after : &before);
    }
    ck_assert_msg(same_cache(&before, &after, &c), "unused layouts changed the cache");
    ck_assert_msg(!memcmp(o_run[0], o_run[1], obytes), "unused layouts changed the decode's o");
    free(o_run[0]);
    free(o_run[1]);
    cache_host_free(&before);
    cache_host_free(&after);
    conf_io_free(&io);
    castle_cache_destroy(cache);
}
END_TEST

START_TEST(test_api)
{
    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no device: %s", castle_last_error());
    castle_cache_destroy(NULL);
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, 2, 3, 100, 16);
    castle_cache *cache = NULL;
    check_status(castle_cache_create(ctx, &desc, NULL), CASTLE_ERR_NULL_POINTER, "out NULL");
    check_status(castle_cache_create(NULL, &desc, &cache), CASTLE_ERR_NULL_CONTEXT, "ctx NULL");
    desc.head_dim = 0;
    check_status(castle_cache_create(ctx, &desc, &cache), CASTLE_ERR_ZERO_SIZE, "head_dim 0");
    ck_assert(cache == NULL);
    desc.head_dim = 16;
    {   /* the layouts are not used (castle.h): a bad one is not checked (it was: BAD_STRIDE) */
        castle_attention_desc odd = desc;
        odd.layout[CASTLE_TENSOR_DVC] = (castle_layout){1, 1, 16};
        odd.layout[CASTLE_TENSOR_QU] = (castle_layout){0, 0, 1};
        check_status(castle_cache_create(ctx, &odd, &cache), CASTLE_SUCCESS, "create, layouts unused");
        castle_cache_destroy(cache);
        cache = NULL;
    }
    for (long W = 0; W <= 1; ++W) {
        desc.window = W ? 10 : 0;
        check_status(castle_cache_create(ctx, &desc, &cache), CASTLE_SUCCESS, "create");
        size_t bytes = 0, rows[4];
        ck_assert(castle_cache_bytes(cache, &bytes) == CASTLE_SUCCESS);
        for (int t = 0; t < 4; ++t) {
            cl_mem buf = NULL;
            ck_assert(castle_cache_buffer(cache, (castle_cache_tensor)t, &buf, &rows[t]) == CASTLE_SUCCESS && buf);
            size_t sz = 0;
            clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof sz, &sz, NULL);
            ck_assert(sz == 2 * 3 * rows[t] * 16 * sizeof(float));
        }
        ck_assert(rows[CASTLE_CACHE_U] == 100 && rows[CASTLE_CACHE_KC] == 100 && rows[CASTLE_CACHE_VC] == 100);
        ck_assert(rows[CASTLE_CACHE_QU] == (W ? 10u : 100u));
        const size_t tensors = 2 * 3 * 16 * sizeof(float) * (3 * 100 + rows[CASTLE_CACHE_QU]);
        ck_assert_msg(bytes >= tensors && bytes < tensors + tensors / 4, "cache bytes %zu for tensors of %zu", bytes,
                      tensors);
        cl_mem buf;
        size_t r;
        check_status(castle_cache_buffer(cache, (castle_cache_tensor)7, &buf, &r), CASTLE_ERR_INVALID_ARGUMENT,
                     "tensor 7");
        check_status(castle_cache_bytes(cache, NULL), CASTLE_ERR_NULL_POINTER, "bytes NULL");
        check_status(castle_cache_lengths(NULL, rows), CASTLE_ERR_NULL_POINTER, "lengths of NULL");
        castle_cache_destroy(cache);
        cache = NULL;
    }
    check_status(castle_cache_reset(NULL), CASTLE_ERR_NULL_POINTER, "reset NULL");
    ck_assert_str_eq(castle_status_string(CASTLE_ERR_CACHE_FULL), "CASTLE_ERR_CACHE_FULL");
    ck_assert_str_eq(castle_status_string(CASTLE_ERR_SHAPE_MISMATCH), "CASTLE_ERR_SHAPE_MISMATCH");
    ck_assert_str_eq(castle_status_string(CASTLE_ERR_CACHE_NOT_EMPTY), "CASTLE_ERR_CACHE_NOT_EMPTY");
}
END_TEST

Suite *decode_suite(void)
{
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("invariants");
    tcase_set_timeout(tc, 600);
    CONFORMANCE_LOOP(tc, test_conformance_decode, CONF_DECODE);
    CONFORMANCE_LOOP(tc, test_conformance_chunked, CONF_DECODE_CHUNKED);
    tcase_add_loop_test(tc, test_invariants, 0, NCASES);
    tcase_add_test(tc, test_from_empty);
    tcase_add_loop_test(tc, test_overflowing_score, 0, 2);
    tcase_add_test(tc, test_out_of_order_queue);
    tcase_add_loop_test(tc, test_causality, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("classes");
    tcase_set_tags(tc, "variants"); /* tests/CMakeLists.txt: castle_variants */
    tcase_set_timeout(tc, 1200); /* three classes built cold, beside other suites (ctest -j) */
    tcase_add_test(tc, test_head_dim_classes);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_capacity, 0, 2);
    tcase_add_test(tc, test_mismatch);
    tcase_add_test(tc, test_api);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(decode_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
