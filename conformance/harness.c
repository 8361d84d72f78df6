#include "harness.h"

#include "ref.h"
#include "ref_causal.h"
#include "ref_grad.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 1234.5f
#define GUARD_POST 257

static castle_context *g_ctx;
static bool g_tried;

castle_context *h_context(void)
{
    if (!g_tried) {
        g_tried = true;
        if (castle_context_create_default(NULL, &g_ctx) != CASTLE_SUCCESS)
            g_ctx = NULL;
    }
    return g_ctx;
}

cl_command_queue h_queue(void) { return castle_context_queue(h_context()); }

cl_command_queue h_out_of_order_queue(castle_context *ctx, const char *who)
{
    cl_command_queue_properties props = 0;
    cl_int err = clGetDeviceInfo(castle_context_device(ctx), CL_DEVICE_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    cl_command_queue q = NULL;
    if (err == CL_SUCCESS && (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE))
        q = clCreateCommandQueue(castle_context_cl_context(ctx), castle_context_device(ctx),
                                 CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (!q)
        fprintf(stderr, "%s: skipped, no out-of-order queue on this device (OpenCL status %d)\n", who, (int)err);
    return q;
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double h_value(uint64_t seed, unsigned tensor, size_t b, size_t h, size_t row, size_t col)
{
    uint64_t z = mix(seed + 0x9e3779b97f4a7c15ull);
    z = mix(z ^ (tensor + 1));
    z = mix(z ^ (b + 0x100));
    z = mix(z ^ (h + 0x10000));
    z = mix(z ^ (row + 0x1000000));
    z = mix(z ^ (col + 0x100000000ull));
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

void h_apply_layout(castle_attention_desc *desc, h_layout layout)
{
    if (layout == H_BLHD) {
        castle_attention_desc_set_blhd(desc);
    } else if (layout == H_PADDED) {
        const size_t rs = desc->head_dim + 5;
        for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
            if (t == CASTLE_TENSOR_LSE) { /* every other slot: gaps between positions */
                desc->layout[t].row_stride = 2;
                desc->layout[t].head_stride = 2 * desc->seq_len + 1;
                desc->layout[t].batch_stride = desc->heads * desc->layout[t].head_stride;
                continue;
            }
            desc->layout[t].row_stride = rs;
            desc->layout[t].head_stride = rs * desc->seq_len + 3;
            desc->layout[t].batch_stride = desc->heads * desc->layout[t].head_stride + 7;
        }
    }
}

bool h_guarded_create(cl_context cl_ctx, cl_device_id dev, h_guarded *g, size_t span)
{
    memset(g, 0, sizeof *g);
    cl_uint align_bits = 1024;
    clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    g->pre = align_bits / 8 / sizeof(float);
    if (g->pre == 0)
        g->pre = 1;
    g->span = span;
    g->post = GUARD_POST;
    const size_t total = g->pre + span + g->post;
    cl_int err;
    g->parent = clCreateBuffer(cl_ctx, CL_MEM_READ_WRITE, total * sizeof(float), NULL, &err);
    if (!g->parent)
        return false;
    cl_buffer_region region = {g->pre * sizeof(float), span * sizeof(float)};
    g->view = clCreateSubBuffer(g->parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    if (!g->view) {
        clReleaseMemObject(g->parent);
        g->parent = NULL;
        return false;
    }
    return true;
}

void h_guarded_release(h_guarded *g)
{
    if (g->view)
        clReleaseMemObject(g->view);
    if (g->parent)
        clReleaseMemObject(g->parent);
    memset(g, 0, sizeof *g);
}

bool h_guarded_write(cl_command_queue q, const h_guarded *g, const float *host)
{
    const size_t total = g->pre + g->span + g->post;
    float *all = malloc(total * sizeof(float));
    if (!all)
        return false;
    for (size_t i = 0; i < total; ++i)
        all[i] = SENTINEL;
    if (host)
        memcpy(all + g->pre, host, g->span * sizeof(float));
    cl_int err = clEnqueueWriteBuffer(q, g->parent, CL_TRUE, 0, total * sizeof(float), all, 0, NULL, NULL);
    free(all);
    return err == CL_SUCCESS;
}

bool h_guarded_read(cl_command_queue q, const h_guarded *g, float *host, const bool *used)
{
    const size_t total = g->pre + g->span + g->post;
    float *all = malloc(total * sizeof(float));
    if (!all)
        return false;
    bool ok = clEnqueueReadBuffer(q, g->parent, CL_TRUE, 0, total * sizeof(float), all, 0, NULL, NULL) == CL_SUCCESS;
    for (size_t i = 0; ok && i < total; ++i) {
        const bool inside = i >= g->pre && i < g->pre + g->span;
        if ((!inside || (used && !used[i - g->pre])) && all[i] != SENTINEL)
            ok = false;
    }
    if (ok && host)
        memcpy(host, all + g->pre, g->span * sizeof(float));
    free(all);
    return ok;
}

/* Offset of (b, h, t) in a layout, after castle's "all zero = packed" rule. */
static size_t offset_of(const castle_layout *l, size_t width, size_t H, size_t L, size_t b, size_t h, size_t t)
{
    castle_layout x = *l;
    if (!x.batch_stride && !x.head_stride && !x.row_stride) {
        x.row_stride = width;
        x.head_stride = L * width;
        x.batch_stride = H * L * width;
    }
    return b * x.batch_stride + h * x.head_stride + t * x.row_stride;
}

static size_t span_of(const castle_layout *l, size_t width, size_t B, size_t H, size_t L)
{
    return offset_of(l, width, H, L, B - 1, H - 1, L - 1) + width;
}

size_t h_layout_offset(const castle_layout *l, size_t width, size_t H, size_t L, size_t b, size_t h, size_t row)
{
    return offset_of(l, width, H, L, b, h, row);
}

size_t h_layout_span(const castle_layout *l, size_t width, size_t B, size_t H, size_t L)
{
    return span_of(l, width, B, H, L);
}

void h_fwd_out_free(h_fwd_out *out)
{
    free(out->o);
    free(out->lse);
    out->o = out->lse = NULL;
    for (int g = 0; g < 6; ++g) {
        free(out->grad[g]);
        out->grad[g] = NULL;
    }
}

/* max |got - ref| / max(floor, max |ref|); INFINITY when got has a non-finite entry. */
static double max_err(const float *got, const double *ref, size_t n, double floor, bool *finite)
{
    double e = 0, m = floor;
    for (size_t i = 0; i < n; ++i) {
        if (!isfinite(got[i]))
            *finite = false;
        e = fmax(e, fabs((double)got[i] - ref[i]));
        m = fmax(m, fabs(ref[i]));
    }
    return *finite ? e / m : INFINITY;
}

h_poison h_poisoned = {-1, 0, 0.0f};
h_input_fn h_input_hook = NULL;

double h_overflow_lookahead(int tensor, size_t b, size_t h, size_t row, size_t col, double value)
{
    (void)b, (void)h, (void)col;
    switch (tensor) {
    case CASTLE_TENSOR_VU:
        return row >= 1 && row <= 63 ? 1e19 : 0.0;
    case CASTLE_TENSOR_QC:
        return row == 64 ? -1e19 : 0.0;
    case CASTLE_TENSOR_VC:
    case 6: /* dO */
        return value;
    default:
        return 0.0;
    }
}

/* A case's buffers: one per castle_tensor, then the workspace. */
enum { WS = CASTLE_TENSOR_COUNT };

/* The raw contents of the six gradient buffers (guards included), one after another, into *all
   (malloc'd; *count floats). */
static bool read_gradients(cl_command_queue q, const h_guarded *g, float **all, size_t *count)
{
    size_t total = 0;
    for (int t = CASTLE_TENSOR_DQU; t <= CASTLE_TENSOR_DVC; ++t)
        total += g[t].pre + g[t].span + g[t].post;
    *count = total;
    if (!(*all = malloc(total * sizeof(float))))
        return false;
    size_t at = 0;
    for (int t = CASTLE_TENSOR_DQU; t <= CASTLE_TENSOR_DVC; ++t) {
        const size_t len = g[t].pre + g[t].span + g[t].post;
        if (clEnqueueReadBuffer(q, g[t].parent, CL_TRUE, 0, len * sizeof(float), *all + at, 0, NULL, NULL))
            return false;
        at += len;
    }
    return true;
}

/* castle_backward on the case's buffers g. */
static castle_status enqueue_backward(castle_context *ctx, const castle_attention_desc *desc, const h_guarded *g,
                                      cl_command_queue q, cl_uint nwait, const cl_event *wait, cl_event *ev)
{
    return castle_backward(ctx, desc, g[0].view, g[1].view, g[2].view, g[3].view, g[4].view, g[5].view, g[6].view,
                           g[7].view, g[WS].view, g[8].view, g[9].view, g[10].view, g[11].view, g[12].view, g[13].view,
                           g[14].view, q, nwait, wait, ev);
}

/* causal: the standard causal attention of the baseline (castle_causal_*) on QC, KC, VC, O, LSE, DO and
   DQC..DVC, against ref_causal_*; the other tensors' buffers exist but must stay untouched.  again: the
   backward runs twice on one forward's workspace (h_run_backward_again). */
static castle_status run_case(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, bool backward,
                              bool with_ref, h_grad_ref gref, bool keep, bool causal, bool again, h_fwd_out *out)
{
    memset(out, 0, sizeof *out);
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, c->B, c->H, c->L, c->d);
    desc.window = c->W;
    desc.scale = c->scale;
    h_apply_layout(&desc, c->layout);
    const size_t B = c->B, H = c->H, L = c->L, d = c->d, n = B * H * L * d;
    const double sc = c->scale > 0 ? c->scale : 1.0 / sqrt((double)d);
    const int Wref = (int)(c->W > (long)L ? 0 : c->W);
    cl_context clc = castle_context_cl_context(ctx);
    cl_device_id dev = castle_context_device(ctx);

    /* The tensors this run uses, then the workspace. Inputs: QU..VC (logical 0..5) and DO (6). */
    const int NT_ = backward ? CASTLE_TENSOR_COUNT : CASTLE_TENSOR_LSE + 1;
    castle_status st = CASTLE_SUCCESS;
    h_guarded g[CASTLE_TENSOR_COUNT + 1];
    memset(g, 0, sizeof g);
    float *host[CASTLE_TENSOR_COUNT] = {0};
    bool *used[CASTLE_TENSOR_COUNT] = {0};
    double *logical = malloc(7 * n * sizeof(double));
    size_t ws_bytes = 0;
    if (!logical) {
        st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        goto done;
    }
    for (int t = 0; t < 7; ++t)
        for (size_t b = 0; b < B; ++b)
            for (size_t h = 0; h < H; ++h)
                for (size_t r = 0; r < L; ++r)
                    for (size_t e = 0; e < d; ++e) { /* representable in float: the device sees the same */
                        double v = (t == h_poisoned.tensor && r == h_poisoned.row)
                                       ? (double)h_poisoned.value
                                       : (double)(float)((t == 6 ? 1.0 : c->mag) * h_value(c->seed, (unsigned)t, b, h, r, e));
                        if (h_input_hook)
                            v = (double)(float)h_input_hook(t, b, h, r, e, v);
                        logical[(size_t)t * n + ((b * H + h) * L + r) * d + e] = v;
                    }

    for (int t = 0; t < NT_; ++t) {
        const size_t width = t == CASTLE_TENSOR_LSE ? 1 : d;
        const size_t span = span_of(&desc.layout[t], width, B, H, L);
        const int src = t < 6 ? t : (t == CASTLE_TENSOR_DO ? 6 : -1); /* logical input, if any */
        host[t] = malloc(span * sizeof(float));
        used[t] = calloc(span, sizeof(bool));
        if (!host[t] || !used[t] || !h_guarded_create(clc, dev, &g[t], span)) {
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
            goto done;
        }
        for (size_t i = 0; i < span; ++i)
            host[t][i] = SENTINEL;
        for (size_t b = 0; b < B; ++b)
            for (size_t h = 0; h < H; ++h)
                for (size_t r = 0; r < L; ++r) {
                    size_t off = offset_of(&desc.layout[t], width, H, L, b, h, r);
                    for (size_t e = 0; e < width; ++e) {
                        used[t][off + e] = true;
                        if (src >= 0)
                            host[t][off + e] = (float)logical[(size_t)src * n + ((b * H + h) * L + r) * d + e];
                    }
                }
        if (!h_guarded_write(q, &g[t], src >= 0 ? host[t] : NULL)) {
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
            goto done;
        }
    }
    if ((st = castle_forward_workspace_size(ctx, &desc, &ws_bytes)))
        goto done;
    if (!h_guarded_create(clc, dev, &g[WS], ws_bytes / sizeof(float)) || !h_guarded_write(q, &g[WS], NULL)) {
        st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        goto done;
    }
    cl_event ev = NULL;
    st = causal ? castle_causal_forward(ctx, &desc, g[3].view, g[4].view, g[5].view, g[6].view, g[7].view, q, 0, NULL,
                                        &ev)
                : castle_forward(ctx, &desc, g[0].view, g[1].view, g[2].view, g[3].view, g[4].view, g[5].view,
                                 g[6].view, g[7].view, g[WS].view, q, 0, NULL, &ev);
    if (st)
        goto done;
    if (backward) {
        cl_event ev2 = NULL;
        st = causal ? castle_causal_backward(ctx, &desc, g[3].view, g[4].view, g[5].view, g[6].view, g[7].view,
                                             g[8].view, g[12].view, g[13].view, g[14].view, q, 1, &ev, &ev2)
                    : enqueue_backward(ctx, &desc, g, q, 1, &ev, &ev2);
        clReleaseEvent(ev);
        ev = ev2;
        if (st)
            goto done;
    }
    clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    if (again) { /* the same castle_backward once more, on the same workspace, compared bitwise */
        float *first = NULL, *second = NULL;
        size_t n1 = 0, n2 = 0;
        bool ok = read_gradients(q, g, &first, &n1);
        ev = NULL;
        if (ok)
            st = enqueue_backward(ctx, &desc, g, q, 0, NULL, &ev);
        if (ok && !st) {
            clWaitForEvents(1, &ev);
            clReleaseEvent(ev);
            ok = read_gradients(q, g, &second, &n2);
            out->again_same = ok && n1 == n2 && !memcmp(first, second, n1 * sizeof(float));
        }
        free(first);
        free(second);
        if (!ok && !st)
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        if (st)
            goto done;
    }

    out->guards_ok = h_guarded_read(q, &g[WS], NULL, NULL);
    for (int t = 0; t < NT_; ++t) /* outputs: guards and gaps; inputs: entirely untouched */
        out->guards_ok = h_guarded_read(q, &g[t], host[t], used[t]) && out->guards_ok;
    out->o = malloc(n * sizeof(float));
    out->lse = malloc(B * H * L * sizeof(float));
    for (int k = 0; k < 6 && backward; ++k)
        out->grad[k] = malloc(n * sizeof(float));
    if (!out->o || !out->lse || (backward && !out->grad[5])) {
        st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        goto done;
    }
    for (size_t b = 0; b < B; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t r = 0; r < L; ++r) {
                const size_t bhr = (b * H + h) * L + r;
                memcpy(out->o + bhr * d, host[CASTLE_TENSOR_O] + offset_of(&desc.layout[CASTLE_TENSOR_O], d, H, L, b, h, r),
                       d * sizeof(float));
                out->lse[bhr] = host[CASTLE_TENSOR_LSE][offset_of(&desc.layout[CASTLE_TENSOR_LSE], 1, H, L, b, h, r)];
                for (int k = 0; k < 6 && backward; ++k) {
                    const int t = CASTLE_TENSOR_DQU + k;
                    memcpy(out->grad[k] + bhr * d, host[t] + offset_of(&desc.layout[t], d, H, L, b, h, r),
                           d * sizeof(float));
                }
            }
    out->finite = true;
    for (size_t i = 0; i < n; ++i)
        out->finite = out->finite && isfinite(out->o[i]);
    for (size_t i = 0; i < B * H * L; ++i)
        out->finite = out->finite && isfinite(out->lse[i]);
    for (int k = 0; k < 6 && backward; ++k)
        for (size_t i = 0; i < n; ++i)
            out->finite = out->finite && isfinite(out->grad[k][i]);
    if (with_ref) {
        double *ro = malloc(n * sizeof(double)), *rl = malloc(B * H * L * sizeof(double));
        if (!ro || !rl) {
            free(ro);
            free(rl);
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
            goto done;
        }
        for (size_t bh = 0; bh < B * H; ++bh) {
            const double *in[6];
            for (int t = 0; t < 6; ++t)
                in[t] = logical + (size_t)t * n + bh * L * d;
            if (causal)
                ref_causal_forward((int)L, (int)d, sc, in[3], in[4], in[5], ro + bh * L * d, rl + bh * L);
            else
                ref_forward_recurrent((int)L, (int)d, Wref, sc, in[0], in[1], in[2], in[3], in[4], in[5],
                                      ro + bh * L * d, rl + bh * L);
        }
        bool fin = true;
        out->err_o = max_err(out->o, ro, n, 1.0, &fin);
        out->err_lse = max_err(out->lse, rl, B * H * L, 1.0, &fin);
        free(ro);
        free(rl);
    }
    if (backward && gref != H_GRAD_NONE) {
        double *rg = malloc(6 * n * sizeof(double)), *fg = NULL;
        if (gref == H_GRAD_FAST_F32)
            fg = malloc(6 * n * sizeof(double));
        if (!rg || (gref == H_GRAD_FAST_F32 && !fg)) {
            free(rg);
            free(fg);
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
            goto done;
        }
        for (size_t bh = 0; bh < B * H; ++bh) {
            const double *in[7];
            double *gr[6], *gf[6];
            for (int t = 0; t < 7; ++t)
                in[t] = logical + (size_t)t * n + bh * L * d;
            for (int k = 0; k < 6; ++k) {
                gr[k] = rg + (size_t)k * n + bh * L * d;
                gf[k] = fg ? fg + (size_t)k * n + bh * L * d : NULL;
            }
            if (causal) /* dqc, dkc, dvc; the CASTLE-only gradients stay 0 (their buffers are checked untouched) */
                ref_causal_backward((int)L, (int)d, sc, in[3], in[4], in[5], in[6], gr[3], gr[4], gr[5]);
            else if (gref == H_GRAD_EXACT)
                ref_backward((int)L, (int)d, Wref, sc, in[0], in[1], in[2], in[3], in[4], in[5], in[6], gr[0], gr[1],
                             gr[2], gr[3], gr[4], gr[5]);
            else
                ref_backward_fast((int)L, (int)d, Wref, sc, in[0], in[1], in[2], in[3], in[4], in[5], in[6], gr[0],
                                  gr[1], gr[2], gr[3], gr[4], gr[5]);
            if (fg)
                ref_backward_fast_f32((int)L, (int)d, Wref, sc, in[0], in[1], in[2], in[3], in[4], in[5], in[6], gf[0],
                                      gf[1], gf[2], gf[3], gf[4], gf[5]);
        }
        if (causal)
            memset(rg, 0, 3 * n * sizeof(double));
        for (int k = causal ? 3 : 0; k < 6; ++k) {
            bool fin = true;
            if (fg) { /* the float32 evaluation's error, as floats */
                float *tmp = malloc(n * sizeof(float));
                if (!tmp)
                    continue;
                for (size_t i = 0; i < n; ++i)
                    tmp[i] = (float)fg[(size_t)k * n + i];
                out->err_grad[k] = max_err(tmp, rg + (size_t)k * n, n, 1e-3, &fin);
                free(tmp);
            } else {
                out->err_grad[k] = max_err(out->grad[k], rg + (size_t)k * n, n, causal ? 0.1 : 1e-3, &fin);
            }
        }
        free(rg);
        free(fg);
    }
done:
    if (!keep || st)
        h_fwd_out_free(out);
    for (int t = 0; t <= CASTLE_TENSOR_COUNT; ++t)
        h_guarded_release(&g[t]);
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        free(host[t]);
        free(used[t]);
    }
    free(logical);
    return st;
}

castle_status h_run_forward(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, bool with_ref, bool keep,
                            h_fwd_out *out)
{
    return run_case(ctx, q, c, false, with_ref, H_GRAD_NONE, keep, false, false, out);
}

castle_status h_run_backward(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, h_grad_ref ref, bool keep,
                             h_fwd_out *out)
{
    return run_case(ctx, q, c, true, ref != H_GRAD_NONE, ref, keep, false, false, out);
}

castle_status h_run_backward_again(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, h_grad_ref ref,
                                   bool keep, h_fwd_out *out)
{
    return run_case(ctx, q, c, true, ref != H_GRAD_NONE, ref, keep, false, true, out);
}

castle_status h_run_causal_forward(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, bool keep,
                                   h_fwd_out *out)
{
    return run_case(ctx, q, c, false, true, H_GRAD_NONE, keep, true, false, out);
}

castle_status h_run_causal_backward(castle_context *ctx, cl_command_queue q, const h_fwd_case *c, bool keep,
                                    h_fwd_out *out)
{
    return run_case(ctx, q, c, true, true, H_GRAD_EXACT, keep, true, false, out);
}
