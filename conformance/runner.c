/* Runs one case of the conformance table against the fp64 reference (conformance/conformance.h). */
#define _POSIX_C_SOURCE 200809L
#include "conformance.h"

#include "ref.h"
#include "ref_causal.h"
#include "tolerance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const conf_op_names[CONF_NOPS] = {"forward",        "backward",        "decode",       "decode_chunked",
                                              "causal_forward", "causal_backward", "causal_decode"};

static const char *layout_name(h_layout l) { return l == H_BLHD ? "BLHD" : l == H_PADDED ? "padded" : "BHLD"; }

/* The i-th backward case: h_shapes with L <= CONF_BACKWARD_MAX_L, then conf_backward_extra. */
static const conf_fwd_case *backward_case(size_t i)
{
    for (size_t k = 0; k < conf_nshapes; ++k)
        if (conf_shapes[k].c.L <= CONF_BACKWARD_MAX_L && i-- == 0)
            return &conf_shapes[k];
    return i < conf_nbackward_extra ? &conf_backward_extra[i] : NULL;
}

/* The i-th UQ-KV cache case of the op: one token per call (decode) or several (decode_chunked). */
static const conf_dec_case *decode_case(conf_op op, size_t i)
{
    for (size_t k = 0; k < conf_ndecode_cases; ++k)
        if ((conf_decode_cases[k].chunk > 1) == (op == CONF_DECODE_CHUNKED) && i-- == 0)
            return &conf_decode_cases[k];
    return NULL;
}

size_t conf_ncases(conf_op op)
{
    size_t n = 0;
    switch (op) {
    case CONF_FORWARD:
        return conf_nshapes + conf_nforward_large;
    case CONF_BACKWARD:
        while (backward_case(n))
            ++n;
        return n;
    case CONF_DECODE:
    case CONF_DECODE_CHUNKED:
        while (decode_case(op, n))
            ++n;
        return n;
    case CONF_CAUSAL_FORWARD:
        return conf_ncausal_forward_cases;
    case CONF_CAUSAL_BACKWARD:
        return conf_ncausal_backward_cases;
    case CONF_CAUSAL_DECODE:
        return conf_ncausal_decode_cases;
    default:
        return 0;
    }
}

/* Case i of a forward-style table (forward, backward, causal forward and backward). */
static const conf_fwd_case *fwd_case(conf_op op, size_t i)
{
    switch (op) {
    case CONF_FORWARD:
        return i < conf_nshapes ? &conf_shapes[i] : &conf_forward_large[i - conf_nshapes];
    case CONF_BACKWARD:
        return backward_case(i);
    case CONF_CAUSAL_FORWARD:
        return &conf_causal_forward_cases[i];
    case CONF_CAUSAL_BACKWARD:
        return &conf_causal_backward_cases[i];
    default:
        return NULL;
    }
}

bool conf_is_quick(conf_op op, size_t i)
{
    if (i >= conf_ncases(op))
        return false;
    if (op == CONF_DECODE || op == CONF_DECODE_CHUNKED)
        return decode_case(op, i)->quick;
    if (op == CONF_CAUSAL_DECODE)
        return conf_causal_decode_cases[i].quick;
    return fwd_case(op, i)->quick;
}

size_t conf_head_dim(conf_op op, size_t i)
{
    if (i >= conf_ncases(op))
        return 0;
    if (op == CONF_DECODE || op == CONF_DECODE_CHUNKED)
        return decode_case(op, i)->d;
    if (op == CONF_CAUSAL_DECODE)
        return conf_causal_decode_cases[i].c.d;
    return fwd_case(op, i)->c.d;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double conf_rel_err(const float *got, const double *ref, size_t n, double floor)
{
    double e = 0, m = floor;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(got[i]))
            return INFINITY;
        e = fmax(e, fabs((double)got[i] - ref[i]));
        m = fmax(m, fabs(ref[i]));
    }
    return e / m;
}

/* Forward, backward and their causal counterparts: one harness run. */
static castle_status run_fwd(castle_context *ctx, conf_op op, const h_fwd_case *c, conf_result *r)
{
    cl_command_queue q = castle_context_queue(ctx);
    const bool large = c->mag > 1;
    h_fwd_out out;
    castle_status st;
    static const char *const grad[6] = {"dqu", "dku", "dvu", "dqc", "dkc", "dvc"};
    switch (op) {
    case CONF_FORWARD:
        r->tol = large ? LARGE_TOL : FORWARD_TOL;
        st = h_run_forward(ctx, q, c, true, false, &out);
        break;
    case CONF_BACKWARD:
        r->tol = large ? BACKWARD_LARGE_TOL : BACKWARD_TOL;
        st = h_run_backward(ctx, q, c, H_GRAD_EXACT, false, &out);
        break;
    case CONF_CAUSAL_FORWARD:
        r->tol = large ? CAUSAL_LARGE_TOL : CAUSAL_TOL;
        st = h_run_causal_forward(ctx, q, c, false, &out);
        break;
    default:
        r->tol = CAUSAL_GRAD_TOL;
        st = h_run_causal_backward(ctx, q, c, false, &out);
    }
    if (st)
        return st;
    const bool bwd = op == CONF_BACKWARD || op == CONF_CAUSAL_BACKWARD;
    int worst = -1;
    r->err = bwd ? 0 : fmax(out.err_o, out.err_lse);
    for (int k = 0; k < 6 && bwd; ++k)
        if (!(out.err_grad[k] <= r->err)) {
            r->err = out.err_grad[k];
            worst = k;
        }
    if (!out.guards_ok)
        snprintf(r->why, sizeof r->why, "a guard region, a gap between strided rows or an input was written");
    else if (!out.finite)
        snprintf(r->why, sizeof r->why, "non-finite output");
    else if (!(r->err <= r->tol))
        snprintf(r->why, sizeof r->why, "%s error %.3g > tolerance %.3g", worst >= 0 ? grad[worst] : "O/lse", r->err,
                 r->tol);
    r->pass = !r->why[0];
    return CASTLE_SUCCESS;
}

/* The verdict of a decode case from its errors on O and lse. */
static castle_status verdict(conf_result *r, double tol, bool guards, double eo, double el)
{
    r->tol = tol;
    r->err = fmax(eo, el);
    if (!guards)
        snprintf(r->why, sizeof r->why, "a guard region around a call's buffers or an input was written");
    else if (!(r->err <= r->tol))
        snprintf(r->why, sizeof r->why, "error O %.3g lse %.3g > tolerance %.3g", eo, el, r->tol);
    r->pass = !r->why[0];
    return CASTLE_SUCCESS;
}

/* The UQ-KV cache: every output of the sequence against ref_forward_recurrent over its length. */
static castle_status run_dec(castle_context *ctx, const conf_dec_case *c, conf_result *r)
{
    const size_t cap = conf_decode_capacity(c), d = c->d, BH = c->B * c->H;
    float *o = calloc(BH * cap * d, sizeof(float)), *lse = calloc(BH * cap, sizeof(float));
    bool guards = false;
    castle_status st = o && lse ? conf_run_decode(ctx, c, o, lse, &guards, NULL) : CASTLE_ERR_OUT_OF_HOST_MEMORY;
    double eo = 0, el = 0;
    const double sc = 1.0 / sqrt((double)d);
    for (size_t b = 0; b < c->B && !st; ++b)
        for (size_t h = 0; h < c->H && !st; ++h) {
            const size_t L = c->P[b] + c->n, bh = b * c->H + h;
            double *x = malloc(6 * L * d * sizeof(double) + 1), *ro = malloc(L * d * sizeof(double) + 1),
                   *rl = malloc(L * sizeof(double) + 1);
            if (!x || !ro || !rl)
                st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
            for (unsigned t = 0; t < 6 && !st; ++t)
                for (size_t i = 0; i < L * d; ++i)
                    x[t * L * d + i] = (double)(float)h_value(c->seed, t, b, h, i / d, i % d);
            if (!st && ref_forward_recurrent((int)L, (int)d, (int)c->W, sc, x, x + L * d, x + 2 * L * d,
                                             x + 3 * L * d, x + 4 * L * d, x + 5 * L * d, ro, rl))
                st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
            if (!st) {
                eo = fmax(eo, conf_rel_err(o + bh * cap * d, ro, L * d, 1.0));
                if (c->with_lse)
                    el = fmax(el, conf_rel_err(lse + bh * cap, rl, L, 1.0));
            }
            free(x);
            free(ro);
            free(rl);
        }
    free(o);
    free(lse);
    if (st)
        return st;
    return verdict(r, DECODE_TOL, guards, eo, el);
}

/* The causal baseline's KV cache: every output against ref_causal_forward over the whole sequence. */
static castle_status run_causal_dec(castle_context *ctx, const conf_causal_dec_case *dc, conf_result *r)
{
    const h_fwd_case *c = &dc->c;
    const size_t L = c->L, d = c->d, BH = c->B * c->H;
    float *o = calloc(BH * L * d, sizeof(float)), *lse = calloc(BH * L, sizeof(float));
    double *x = malloc(3 * L * d * sizeof(double)), *ro = malloc(L * d * sizeof(double)),
           *rl = malloc(L * sizeof(double));
    bool guards = false;
    castle_status st = o && lse && x && ro && rl
                           ? conf_run_causal_decode(ctx, castle_context_queue(ctx), dc, 0, o, lse, &guards)
                           : CASTLE_ERR_OUT_OF_HOST_MEMORY;
    const double sc = c->scale > 0 ? c->scale : 1.0 / sqrt((double)d);
    double eo = 0, el = 0;
    for (size_t bh = 0; bh < BH && !st; ++bh) {
        for (unsigned t = 0; t < 3; ++t)
            for (size_t i = 0; i < L * d; ++i)
                x[t * L * d + i] = (double)(float)(c->mag * h_value(c->seed, CASTLE_TENSOR_QC + t, bh / c->H,
                                                                    bh % c->H, i / d, i % d));
        if (ref_causal_forward((int)L, (int)d, sc, x, x + L * d, x + 2 * L * d, ro, rl))
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        eo = fmax(eo, conf_rel_err(o + bh * L * d, ro, L * d, 1.0));
        if (dc->with_lse)
            el = fmax(el, conf_rel_err(lse + bh * L, rl, L, 1.0));
    }
    free(o);
    free(lse);
    free(x);
    free(ro);
    free(rl);
    if (st)
        return st;
    return verdict(r, c->mag > 1 ? CAUSAL_LARGE_TOL : CAUSAL_TOL, guards, eo, el);
}

bool conf_table_case(conf_op op, size_t i, conf_case *c)
{
    if (op < 0 || op >= CONF_NOPS || i >= conf_ncases(op))
        return false;
    memset(c, 0, sizeof *c);
    c->op = op;
    if (op == CONF_DECODE || op == CONF_DECODE_CHUNKED)
        c->u.dec = *decode_case(op, i);
    else if (op == CONF_CAUSAL_DECODE)
        c->u.cdec = conf_causal_decode_cases[i];
    else
        c->u.fwd = fwd_case(op, i)->c;
    return true;
}

castle_status conf_run(castle_context *ctx, conf_op op, size_t i, conf_result *r)
{
    conf_case c;
    if (!conf_table_case(op, i, &c)) {
        memset(r, 0, sizeof *r);
        r->err = INFINITY;
        snprintf(r->why, sizeof r->why, "no case %zu of op %d", i, (int)op);
        return CASTLE_ERR_INVALID_ARGUMENT;
    }
    return conf_run_case(ctx, &c, r);
}

castle_status conf_run_case(castle_context *ctx, const conf_case *cc, conf_result *r)
{
    memset(r, 0, sizeof *r);
    r->err = INFINITY;
    const conf_op op = cc ? cc->op : CONF_NOPS;
    if (!ctx || op < 0 || op >= CONF_NOPS) {
        snprintf(r->why, sizeof r->why, "no context or no such op (%d)", (int)op);
        return CASTLE_ERR_INVALID_ARGUMENT;
    }
    const double t0 = now_s();
    castle_status st;
    if (op == CONF_DECODE || op == CONF_DECODE_CHUNKED) {
        const conf_dec_case *c = &cc->u.dec;
        snprintf(r->what, sizeof r->what, "B=%zu H=%zu d=%zu W=%ld P=%zu,%zu n=%zu chunk=%zu cap+%zu layout=%s%s", c->B,
                 c->H, c->d, c->W, c->P[0], c->B > 1 ? c->P[1] : c->P[0], c->n, c->chunk, c->extra_cap,
                 layout_name(c->layout), c->with_lse ? "" : " no-lse");
        st = run_dec(ctx, c, r);
    } else {
        const h_fwd_case *c = op == CONF_CAUSAL_DECODE ? &cc->u.cdec.c : &cc->u.fwd;
        int n = snprintf(r->what, sizeof r->what, "B=%zu H=%zu L=%zu d=%zu W=%ld layout=%s mag=%g", c->B, c->H, c->L,
                         c->d, c->W, layout_name(c->layout), c->mag);
        if (c->scale > 0 && n > 0 && (size_t)n < sizeof r->what)
            snprintf(r->what + n, sizeof r->what - (size_t)n, " scale=%g", c->scale);
        if (op == CONF_CAUSAL_DECODE) {
            const conf_causal_dec_case *dc = &cc->u.cdec;
            n = (int)strlen(r->what);
            snprintf(r->what + n, sizeof r->what - (size_t)n, " P=%zu chunk=%zu%s", dc->P, dc->chunk,
                     dc->with_lse ? "" : " no-lse");
            st = run_causal_dec(ctx, dc, r);
        } else {
            st = run_fwd(ctx, op, c, r);
        }
    }
    r->seconds = now_s() - t0;
    if (st) {
        r->pass = false;
        r->err = INFINITY;
        snprintf(r->why, sizeof r->why, "%s: %s", castle_status_string(st), castle_last_error());
    }
    return st;
}
