/* The UQ-KV cache on the device (docs/algorithm.md section 5) and the launch schedules of prefill and decode.
 *
 * Prefill: the forward pass over the prompt (host/schedule.c) writes the outputs and leaves each
 * D_j final in its workspace, which is U after a prefill of the whole prompt (docs/algorithm.md sections 3, 5);
 * one copy kernel moves KC, VC, the QU ring rows and (when every sequence has the descriptor's
 * length) U into the cache.  Sequences shorter than the descriptor get U from one flash-style
 * gated pass instead (cl/cache.cl castle_cache_prefill_u), since their D would see the padding rows.
 * Decode: two launches for any number of tokens, no host round trip and no allocation: positions
 * come from the device copy of the prompt lengths plus a counter passed as a kernel argument.
 * Commands are ordered by the queue when it is in order, by events between them otherwise. */
#include "cache.h"
#include "schedule.h"
#include "context.h"
#include "error.h"
#include "launch.h"
#include "loops.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rows per decode work-group never drop below this; the partials buffer is sized by it. */
#define MIN_CHUNK 64

/* ---- cache object ------------------------------------------------------------------------------ */

static cl_mem new_buffer(castle_context *ctx, size_t bytes, void *init, cl_int *err)
{
    if (*err != CL_SUCCESS)
        return NULL;
    return clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes, init, err);
}

void castle__cache_free(castle_cache *c)
{
    if (!c)
        return;
    cl_mem *bufs[] = {&c->u, &c->qu, &c->kc, &c->vc, &c->lens, &c->part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
        if (*bufs[i])
            clReleaseMemObject(*bufs[i]);
    free(c->prompt);
    free(c);
}

castle_status castle__cache_alloc(castle_context *ctx, const castle_problem *p, long window, castle_cache **out)
{
    const size_t cap = p->L, bh = p->B * p->H; /* both fit an int (castle__check_desc) */
    castle_cache *c = calloc(1, sizeof *c);
    int *zeros = calloc(p->B, sizeof(int));
    if (c)
        c->prompt = calloc(p->B, sizeof(size_t));
    if (!c || !zeros || !c->prompt) {
        free(zeros);
        castle__cache_free(c);
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory creating a cache");
    }
    c->ctx = ctx;
    c->B = p->B;
    c->H = p->H;
    c->d = p->d;
    c->cap = cap;
    c->window = window;
    c->scale = p->scale;
    /* A window that reaches past the capacity restricts nothing (castle__check_desc made p->W 0). */
    c->W = (int)p->W;
    c->R = c->W ? c->W : (int)cap;
    c->nchunks = (cap + MIN_CHUNK - 1) / MIN_CHUNK;
    /* Sizes: castle__check_desc bounded B H cap d; the products below stay far from SIZE_MAX on any
       64-bit host, and on 32-bit ones clCreateBuffer rejects what the device cannot hold. */
    const size_t row_bytes = p->d * sizeof(float);
    const size_t sz[6] = {bh * cap * row_bytes, bh * (size_t)c->R * row_bytes,
                          bh * cap * row_bytes, bh * cap * row_bytes,
                          p->B * sizeof(int),   bh * c->nchunks * (p->d + 2) * sizeof(float)};
    cl_int err = CL_SUCCESS;
    c->u = new_buffer(ctx, sz[0], NULL, &err);
    c->qu = new_buffer(ctx, sz[1], NULL, &err);
    c->kc = new_buffer(ctx, sz[2], NULL, &err);
    c->vc = new_buffer(ctx, sz[3], NULL, &err);
    c->lens = new_buffer(ctx, sz[4], zeros, &err);
    c->part = new_buffer(ctx, sz[5], NULL, &err);
    free(zeros);
    if (err != CL_SUCCESS) {
        castle__cache_free(c);
        return castle__fail((castle_status)err,
                            "clCreateBuffer failed allocating a cache of %zu tokens x %zu heads x %zu batch", cap, p->H,
                            p->B);
    }
    for (int i = 0; i < 6; ++i)
        c->bytes += sz[i];
    c->lens_valid = true;
    *out = c;
    return CASTLE_SUCCESS;
}

void castle__cache_reset(castle_cache *c)
{
    memset(c->prompt, 0, c->B * sizeof(size_t));
    c->decoded = 0;
    c->lens_valid = false; /* the next call rewrites the device lengths */
}

size_t castle__cache_longest(const castle_cache *c)
{
    size_t longest = 0;
    for (size_t b = 0; b < c->B; ++b)
        longest = c->prompt[b] > longest ? c->prompt[b] : longest;
    return longest + c->decoded;
}

/* ---- prefill ------------------------------------------------------------------------------------ */

castle_status castle__schedule_prefill(castle_context *ctx, castle_cache *c, const castle_problem *p,
                                       const size_t *lengths, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                       cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    const cl_mem *in = bufs, lse = bufs[CASTLE_TENSOR_LSE];
    bool ragged = false;
    for (size_t b = 0; b < c->B; ++b)
        ragged = ragged || lengths[b] != p->L;
    cl_kernel kstore, ku = NULL;
    castle_status st = castle__get_kernel(ctx, CASTLE_FAMILY_CACHE, p->d, "castle_cache_prefill_store", &kstore);
    /* The U pass's work-groups loop over up to N key blocks: in launches over ranges of span blocks
       where the device limits loops (host/loops.c) */
    size_t span = p->N;
    if (st == CASTLE_SUCCESS && ragged)
        st = castle__loops_ranges(CASTLE_LOOPS_PREFILL_U, p->d, p->N, ctx->info.loop_limit, ctx->tuning.block,
                                  "castle_prefill", "castle_cache_prefill_u", &span);
    if (st == CASTLE_SUCCESS && ragged)
        st = castle__get_kernel(ctx, CASTLE_FAMILY_CACHE, p->d, "castle_cache_prefill_u", &ku);
    if (st != CASTLE_SUCCESS)
        return st;

    /* Temporaries, released once enqueued (OpenCL keeps them until the commands using them end). */
    int *lens_host = malloc(c->B * sizeof(int));
    if (!lens_host)
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory in castle_prefill");
    for (size_t b = 0; b < c->B; ++b)
        lens_host[b] = (int)lengths[b];
    cl_int err = CL_SUCCESS;
    cl_mem lens_tmp = new_buffer(ctx, c->B * sizeof(int), lens_host, &err);
    cl_mem ws = new_buffer(ctx, p->ws_forward_floats * sizeof(float), NULL, &err); /* a forward's part */
    /* Without lse the forward writes it into a packed temporary (the descriptor's LSE layout is
       not checked then: castle.h). */
    castle_problem pf = *p;
    if (!lse) {
        const size_t packed[4] = {p->H * p->L, p->L, 1, p->B * p->H * p->L};
        for (int k = 0; k < 4; ++k)
            pf.strides[CASTLE_TENSOR_LSE].s[k] = packed[k];
    }
    cl_mem lse_tmp = lse ? NULL : new_buffer(ctx, pf.strides[CASTLE_TENSOR_LSE].s[3] * sizeof(float), NULL, &err);
    free(lens_host);
    castle_chain ch;
    memset(&ch, 0, sizeof ch);
    if (err != CL_SUCCESS) {
        st = castle__fail((castle_status)err,
                          "clCreateBuffer failed for the prefill's temporaries (%zu bytes of workspace)",
                          p->ws_forward_floats * sizeof(float));
        goto done;
    }
    if ((st = castle__chain_init(&ch, queue, nwait, wait, event)))
        goto done;

    /* 1. the forward pass: outputs, and D in the workspace (first: it builds its own kernel, so a
       build failure leaves nothing enqueued) */
    {
        cl_uint n;
        const cl_event *list;
        cl_event *evp, ev;
        castle__chain_next(&ch, false, &n, &list, &evp, &ev);
        cl_mem fwd[CASTLE_TENSOR_COUNT];
        memcpy(fwd, bufs, sizeof fwd);
        if (!lse)
            fwd[CASTLE_TENSOR_LSE] = lse_tmp;
        st = castle__schedule_forward(ctx, &pf, fwd, ws, queue, n, list, evp);
        castle__chain_done(&ch, false, CL_SUCCESS, ev, ""); /* keeps ev as the next command's dependency */
        if (st != CASTLE_SUCCESS)
            goto done;
    }
    /* 2. the device lengths */
    {
        cl_uint n;
        const cl_event *list;
        cl_event *evp, ev;
        castle__chain_next(&ch, false, &n, &list, &evp, &ev);
        err = clEnqueueCopyBuffer(queue, lens_tmp, c->lens, 0, 0, c->B * sizeof(int), n, list, evp);
        if ((st = castle__chain_done(&ch, false, err, ev, "clEnqueueCopyBuffer")))
            goto done;
    }
    /* 3. KC, VC, the QU ring, and U from D unless ragged */
    {
        const cl_int P = (cl_int)p->L, d = (cl_int)p->d, H = (cl_int)p->H, R = c->R, cap = (cl_int)c->cap;
        const cl_int Lpad = (cl_int)p->Lpad, use_d = !ragged;
        const cl_ulong ws_hi = p->ws_off[CASTLE_WS_D_HI], ws_lo = p->ws_off[CASTLE_WS_D_LO];
        castle_args as = {.n = 0}, au = {.n = 0};
#define ARG(list, v) CASTLE_ARG(&list, v)
        ARG(as, P);
        ARG(as, d);
        ARG(as, H);
        ARG(as, R);
        ARG(as, cap);
        ARG(as, c->lens);
        ARG(as, in[CASTLE_TENSOR_QU]);
        ARG(as, p->strides[CASTLE_TENSOR_QU]);
        ARG(as, in[CASTLE_TENSOR_KC]);
        ARG(as, p->strides[CASTLE_TENSOR_KC]);
        ARG(as, in[CASTLE_TENSOR_VC]);
        ARG(as, p->strides[CASTLE_TENSOR_VC]);
        ARG(as, ws);
        ARG(as, ws_hi);
        ARG(as, ws_lo);
        ARG(as, Lpad);
        ARG(as, use_d);
        ARG(as, c->u);
        ARG(as, c->qu);
        ARG(as, c->kc);
        ARG(as, c->vc);
        const size_t lsz = ctx->tuning.threads, elems = p->L * p->d;
        const size_t global[2] = {(elems + lsz - 1) / lsz * lsz, p->B * p->H}, local[2] = {lsz, 1};
        if ((st = castle__launch(&ch, !ragged, ctx, kstore, "castle_cache_prefill_store", &as, global, local)))
            goto done;
        if (ragged) {
            const cl_int W = c->W;
            const cl_float sc = p->scale;
            ARG(au, d);
            ARG(au, H);
            ARG(au, W);
            ARG(au, cap);
            ARG(au, sc);
            ARG(au, c->lens);
            for (int t = CASTLE_TENSOR_QU; t <= CASTLE_TENSOR_VU; ++t) {
                ARG(au, in[t]);
                ARG(au, p->strides[t]);
            }
            ARG(au, c->u);
            const cl_ulong2 ws_t = castle__ws_t(p); /* the forward's copies of QU and KU */
            ARG(au, ws);
            ARG(au, ws_t);
            ARG(au, Lpad);
            castle__args_range(&au); /* jfrom, jupto; work-group g owns row block g (cl/cache.cl) */
            if ((st = castle__launch_ranges(&ch, true, ctx, ku, "castle_cache_prefill_u", &au, p->N, span, false, lsz,
                                            p->B * p->H)))
                goto done;
        }
#undef ARG
    }
    for (size_t b = 0; b < c->B; ++b)
        c->prompt[b] = lengths[b];
    c->decoded = 0;
    c->lens_valid = true;
done:
    castle__chain_end(&ch);
    if (lens_tmp)
        clReleaseMemObject(lens_tmp);
    if (ws)
        clReleaseMemObject(ws);
    if (lse_tmp)
        clReleaseMemObject(lse_tmp);
    return st;
}

/* ---- decode ------------------------------------------------------------------------------------- */

/* The rows a work-group of S rows takes over n tokens after `longest` cached ones, at most (its rows
   up to each token's own: min(S, longest + i + 1) for token i), saturating. */
static size_t decode_rows(size_t S, size_t longest, size_t n)
{
    const size_t ramp = S > longest + 1 ? S - longest - 1 : 0, a = ramp < n ? ramp : n;
    /* sum over i < a of (longest + i + 1), then S for each of the other n - a tokens */
    const double sum = (double)a * (double)longest + (double)a * ((double)a + 1) / 2 + (double)(n - a) * (double)S;
    return sum >= (double)SIZE_MAX ? SIZE_MAX : (size_t)sum;
}

castle_status castle__schedule_decode(castle_context *ctx, castle_cache *c, const castle_problem *p, size_t longest,
                                      const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                      const cl_event *wait, cl_event *event)
{
    const cl_mem *in = bufs, o = bufs[CASTLE_TENSOR_O], lse = bufs[CASTLE_TENSOR_LSE];
    cl_kernel ka, kc;
    castle_status st = castle__get_kernel(ctx, CASTLE_FAMILY_CACHE, p->d, "castle_cache_decode_attend", &ka);
    if (st == CASTLE_SUCCESS)
        st = castle__get_kernel(ctx, CASTLE_FAMILY_CACHE, p->d, "castle_cache_decode_combine", &kc);
    if (st != CASTLE_SUCCESS)
        return st;
    size_t wg[3] = {0, 0, 0}; /* DNT of cl/cache.cl, as compiled */
    cl_int err = clGetKernelWorkGroupInfo(ka, ctx->device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof wg, wg, NULL);
    if (err != CL_SUCCESS || !wg[0])
        return castle__fail(err ? (castle_status)err : CASTLE_ERR_DEVICE_UNSUPPORTED,
                            "cannot read the decode kernel's work-group size");
    /* Work-groups per sequence: enough over all heads to fill the device (castle__device_fill_groups),
       each over at least MIN_CHUNK rows, and at most as many as the partials buffer holds for n
       tokens (nchunks partials per batch entry and head); with one, the attend kernel writes the
       outputs itself.  Where a work-item's loops are limited (host/loops.c), more work-groups of
       fewer rows, until one's rows over the call's tokens fit, their partials in a temporary buffer
       where the cache's does not hold them. */
    const size_t n = p->L, bh = c->B * c->H, dnt = wg[0], rows = longest + n;
    const size_t target = castle__device_fill_groups(&ctx->info);
    size_t groups = (target + bh - 1) / bh;
    const size_t by_rows = (rows + MIN_CHUNK - 1) / MIN_CHUNK, by_part = c->nchunks / n;
    groups = groups < by_rows ? groups : by_rows;
    groups = groups < by_part ? groups : by_part;
    const unsigned long limit = ctx->info.loop_limit;
    if (limit) {
        size_t S1 = (rows + groups - 1) / (groups ? groups : 1);
        while (S1 > 1 && castle__loops(CASTLE_LOOPS_DECODE_ROW, c->d, decode_rows(S1, longest, n), n) > limit)
            S1 = S1 / 2;
        const size_t need = (rows + S1 - 1) / S1;
        groups = groups > need ? groups : need;
    }
    groups = groups ? groups : 1;
    size_t S = (rows + groups - 1) / groups;
    groups = (rows + S - 1) / S;
    if (groups * S > (size_t)INT_MAX) /* the kernel's s0 + S is an int (a cache of over 2^30 tokens) */
        groups = 1, S = rows;
    if ((st = castle__loop_check(limit, "castle_decode", "castle_cache_decode_attend",
                                 castle__loops(CASTLE_LOOPS_DECODE_ROW, c->d, decode_rows(S, longest, n), n), "%s",
                                 "decode fewer tokens per call (a prompt goes through castle_prefill)")))
        return st;
    cl_mem part = c->part, tmp = NULL; /* partials: bh x n x groups x (d + 2) floats (cl/cache.cl) */
    if (groups > 1 && groups > by_part) {
        const size_t per_group = bh * n * (c->d + 2); /* below the cache's U: bh cap d floats */
        if (groups > SIZE_MAX / sizeof(float) / per_group)
            return castle__fail(CASTLE_ERR_SIZE_OVERFLOW,
                                "castle_decode: the partials of %zu work-groups per sequence do not fit a size_t",
                                groups);
        const size_t floats = per_group * groups;
        tmp = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, floats * sizeof(float), NULL, &err);
        if (err != CL_SUCCESS)
            return castle__fail((castle_status)err,
                                "castle_decode: clCreateBuffer failed for the partials of %zu work-groups per "
                                "sequence (%zu bytes): this device limits a work-item's loops, and the rows are "
                                "spread to fit",
                                groups, floats * sizeof(float));
        part = tmp;
    }
    castle_chain ch;
    if ((st = castle__chain_init(&ch, queue, nwait, wait, event))) {
        if (tmp)
            clReleaseMemObject(tmp);
        return st;
    }
    if (!c->lens_valid) { /* after a reset: every sequence starts empty */
        const cl_int zero = 0;
        cl_uint nw;
        const cl_event *list;
        cl_event *evp, ev;
        castle__chain_next(&ch, false, &nw, &list, &evp, &ev);
        err = clEnqueueFillBuffer(queue, c->lens, &zero, sizeof zero, 0, c->B * sizeof(cl_int), nw, list, evp);
        if ((st = castle__chain_done(&ch, false, err, ev, "clEnqueueFillBuffer")))
            goto done;
    }

    /* n, S, the counts and positions fit an int: rows <= cap (castle_decode checked the capacity). */
    const cl_int pos0 = (cl_int)c->decoded, nn = (cl_int)n, Sarg = (cl_int)S, ng = (cl_int)groups;
    const cl_int d = (cl_int)c->d, H = (cl_int)c->H, W = c->W, R = c->R, cap = (cl_int)c->cap;
    const cl_int want_lse = lse != NULL;
    const cl_float sc = c->scale;
    cl_mem lse_arg = lse ? lse : o; /* never written when want_lse = 0 */
    castle_args aa = {.n = 0}, ac = {.n = 0};
#define ARG(list, v) CASTLE_ARG(&list, v)
    ARG(aa, pos0);
    ARG(aa, nn);
    ARG(aa, Sarg);
    ARG(aa, d);
    ARG(aa, H);
    ARG(aa, W);
    ARG(aa, R);
    ARG(aa, cap);
    ARG(aa, sc);
    ARG(aa, c->lens);
    for (int t = CASTLE_TENSOR_QU; t <= CASTLE_TENSOR_VC; ++t) {
        ARG(aa, in[t]);
        ARG(aa, p->strides[t]);
    }
    ARG(aa, c->u);
    ARG(aa, c->qu);
    ARG(aa, c->kc);
    ARG(aa, c->vc);
    ARG(aa, part);
    ARG(aa, o);
    ARG(aa, p->strides[CASTLE_TENSOR_O]);
    ARG(aa, lse_arg);
    ARG(aa, p->strides[CASTLE_TENSOR_LSE]);
    ARG(aa, want_lse);
    ARG(ac, pos0);
    ARG(ac, nn);
    ARG(ac, Sarg);
    ARG(ac, ng);
    ARG(ac, d);
    ARG(ac, H);
    ARG(ac, R);
    ARG(ac, c->lens);
    ARG(ac, in[CASTLE_TENSOR_QU]);
    ARG(ac, p->strides[CASTLE_TENSOR_QU]);
    ARG(ac, c->qu);
    ARG(ac, part);
    ARG(ac, o);
    ARG(ac, p->strides[CASTLE_TENSOR_O]);
    ARG(ac, lse_arg);
    ARG(ac, p->strides[CASTLE_TENSOR_LSE]);
    ARG(ac, want_lse);
#undef ARG
    const size_t ga[2] = {groups * dnt, bh}, gc[2] = {n * dnt, bh}, la[2] = {dnt, 1};
    if ((st = castle__launch(&ch, false, ctx, ka, "castle_cache_decode_attend", &aa, ga, la)) ||
        (st = castle__launch(&ch, true, ctx, kc, "castle_cache_decode_combine", &ac, gc, la)))
        goto done;
    c->decoded += n;
    c->lens_valid = true;
done:
    castle__chain_end(&ch);
    if (tmp) /* kept by OpenCL until the launches that use it end */
        clReleaseMemObject(tmp);
    return st;
}
