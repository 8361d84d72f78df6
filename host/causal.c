/* Standard causal attention, the baseline (cl/causal.cl): launches of the forward and backward
 * passes, and the KV cache with its prefill and decode.
 *
 * forward   one launch: work-group (query block, batch x head).
 * backward  two launches, no atomics: dK, dV per key block, then dQ per query block.
 * decode    the new rows' K, V are appended to the cache; then up to CASTLE_DECODE_ROWS new rows go to
 *           castle_causal_decode (one partial per work-item, each streaming a range of keys), more
 *           to the forward kernel with the cache as K and V.  When the heads alone would leave the
 *           device idle (fewer than ~4 work-groups per compute unit), a head's keys are split among
 *           several work-groups; castle_causal_combine merges the partials in a third launch.
 * Launches are ordered by the queue when it is in order, by events between them otherwise. */
#include "causal.h"
#include "local_memory.h"
#include "context.h"
#include "error.h"
#include "launch.h"
#include "loops.h"

#include <stdlib.h>
#include <string.h>

/* Decode calls of at most CASTLE_DECODE_ROWS new tokens (host/causal.h) use castle_causal_decode,
   whose work-groups have at most CASTLE_DECODE_GROUP work-items, each streaming a range of keys (at
   least MIN_KEYS of them once a head's keys are split among work-groups); longer calls use the block
   kernel.  The scratch of partials is sized for both (castle__kv_cache_alloc). */
#define MIN_KEYS 32

/* The work-group size kernel was compiled for (cl/causal.cl: NT or CC_NT). */
static castle_status group_size(castle_context *ctx, cl_kernel kernel, size_t *wg)
{
    size_t s[3] = {0, 0, 0};
    cl_int err = clGetKernelWorkGroupInfo(kernel, ctx->device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof s, s, NULL);
    if (err != CL_SUCCESS || s[0] == 0)
        return castle__cl_fail(err != CL_SUCCESS ? err : CL_INVALID_KERNEL, "clGetKernelWorkGroupInfo");
    *wg = s[0];
    return CASTLE_SUCCESS;
}

/* Enqueues kernel with its arguments over g0 x g1 work-groups of the size it was compiled for
   (cl/causal.cl: NT or CC_NT), as the next command of ch. */
static castle_status launch(castle_chain *ch, castle_context *ctx, cl_kernel kernel, const char *name,
                            const castle_args *a, size_t g0, size_t g1, bool last)
{
    size_t wg = 0;
    castle_status st = group_size(ctx, kernel, &wg);
    if (st != CASTLE_SUCCESS)
        return st;
    const size_t local[2] = {wg, 1}, global[2] = {g0 * wg, g1};
    return castle__launch(ch, last, ctx, kernel, name, a, global, local);
}

/* ---- kernel arguments --------------------------------------------------------------------------- */

#define ARG(a, v) CASTLE_ARG(a, v)

/* A tensor's buffer and its strides. */
static void arg_tensor(castle_args *a, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT], castle_tensor t)
{
    ARG(a, bufs[t]);
    ARG(a, p->strides[t]);
}

/* castle_causal_forward over query rows 0..n-1 at positions t0.. against keys k, v (kstride), from the
   program built under the forwards' own shape (fthreads, fdchunk). */
static castle_status forward_args(castle_context *ctx, const char *fn, const castle_problem *p,
                                  const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_int t0, cl_mem k, cl_mem v,
                                  cl_ulong4 kstride, cl_ulong4 vstride, cl_int nsplit, cl_mem part, cl_kernel *kernel,
                                  castle_args *a)
{
    /* A work-group's key blocks: all of a split's (host/loops.c) */
    const size_t blk = ctx->tuning.block, key_blocks = ((size_t)t0 + p->L + blk - 1) / blk;
    const size_t blocks = (key_blocks + (size_t)nsplit - 1) / (size_t)nsplit;
    castle_status st = castle__loop_check(
        ctx->info.loop_limit, fn, "castle_causal_forward", castle__loops(CASTLE_LOOPS_CAUSAL_FORWARD, p->d, blocks, 0),
        "at d = %zu a work-group fits %zu keys (here %zu)", p->d,
        castle__loops_max_units(CASTLE_LOOPS_CAUSAL_FORWARD, p->d, 0, ctx->info.loop_limit) * blk, blocks * blk);
    if (st == CASTLE_SUCCESS)
        st =
            castle__get_kernel(ctx, castle__causal_forward_family(&ctx->tuning), p->d, "castle_causal_forward", kernel);
    if (st != CASTLE_SUCCESS)
        return st;
    const cl_int n = (cl_int)p->L, d = (cl_int)p->d, H = (cl_int)p->H;
    const cl_int want_lse = bufs[CASTLE_TENSOR_LSE] != NULL;
    const cl_mem o = bufs[CASTLE_TENSOR_O], lse = want_lse ? bufs[CASTLE_TENSOR_LSE] : o; /* lse: unused then */
    const cl_mem part_arg = part ? part : o;                                              /* unused when nsplit = 1 */
    ARG(a, n);
    ARG(a, t0);
    ARG(a, d);
    ARG(a, H);
    ARG(a, p->scale);
    arg_tensor(a, p, bufs, CASTLE_TENSOR_QC);
    ARG(a, k);
    ARG(a, kstride);
    ARG(a, v);
    ARG(a, vstride);
    arg_tensor(a, p, bufs, CASTLE_TENSOR_O);
    ARG(a, lse);
    ARG(a, p->strides[CASTLE_TENSOR_LSE]);
    ARG(a, want_lse);
    ARG(a, nsplit);
    ARG(a, part_arg);
    return CASTLE_SUCCESS;
}

/* ---- forward and backward ----------------------------------------------------------------------- */

castle_status castle__causal_forward(castle_context *ctx, const castle_problem *p,
                                     const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                     const cl_event *wait, cl_event *event)
{
    cl_kernel kernel;
    castle_args a = {.n = 0};
    castle_status st =
        forward_args(ctx, "castle_causal_forward", p, bufs, 0, bufs[CASTLE_TENSOR_KC], bufs[CASTLE_TENSOR_VC],
                     p->strides[CASTLE_TENSOR_KC], p->strides[CASTLE_TENSOR_VC], 1, NULL, &kernel, &a);
    castle_chain ch;
    if (st || (st = castle__chain_init(&ch, queue, nwait, wait, event)))
        return st;
    st = launch(&ch, ctx, kernel, "castle_causal_forward", &a, p->N, p->B * p->H, true);
    castle__chain_end(&ch);
    return st;
}

castle_status castle__causal_backward(castle_context *ctx, const castle_problem *p,
                                      const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                      const cl_event *wait, cl_event *event)
{
    static const castle_tensor inputs[] = {CASTLE_TENSOR_QC, CASTLE_TENSOR_KC,  CASTLE_TENSOR_VC,
                                           CASTLE_TENSOR_O,  CASTLE_TENSOR_LSE, CASTLE_TENSOR_DO};
    static const char *const names[2] = {"castle_causal_backward_kv", "castle_causal_backward_q"};
    const cl_int L = (cl_int)p->L, d = (cl_int)p->d, H = (cl_int)p->H;
    static const castle_loop_kernel loops[2] = {CASTLE_LOOPS_CAUSAL_KV, CASTLE_LOOPS_CAUSAL_Q};
    cl_kernel kernels[2];
    castle_args args[2] = {{.n = 0}, {.n = 0}};
    castle_status st = CASTLE_SUCCESS;
    for (int i = 0; i < 2 && st == CASTLE_SUCCESS; ++i) {
        /* the longest work-group of either side loops over all N blocks (host/loops.c) */
        const size_t most = castle__loops_max_units(loops[i], p->d, 0, ctx->info.loop_limit);
        if ((st = castle__loop_check(ctx->info.loop_limit, "castle_causal_backward", names[i],
                                     castle__loops(loops[i], p->d, p->N, 0), "at d = %zu it fits L <= %zu", p->d,
                                     most * ctx->tuning.block)) ||
            (st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, names[i], &kernels[i])))
            break;
        castle_args *a = &args[i];
        ARG(a, L);
        ARG(a, d);
        ARG(a, H);
        ARG(a, p->scale);
        for (size_t t = 0; t < sizeof inputs / sizeof inputs[0]; ++t)
            arg_tensor(a, p, bufs, inputs[t]);
        if (i == 0) {
            arg_tensor(a, p, bufs, CASTLE_TENSOR_DKC);
            arg_tensor(a, p, bufs, CASTLE_TENSOR_DVC);
        } else {
            arg_tensor(a, p, bufs, CASTLE_TENSOR_DQC);
        }
    }
    castle_chain ch;
    if (st || (st = castle__chain_init(&ch, queue, nwait, wait, event)))
        return st;
    if (!(st = launch(&ch, ctx, kernels[0], names[0], &args[0], p->N, p->B * p->H, false)))
        st = launch(&ch, ctx, kernels[1], names[1], &args[1], p->N, p->B * p->H, true);
    castle__chain_end(&ch);
    return st;
}

/* ---- KV cache ----------------------------------------------------------------------------------- */

/* Packed (B, H, cap, d) strides of the cache's K and V. */
static cl_ulong4 cache_strides(const castle_kv_cache *c)
{
    cl_ulong4 s;
    memset(&s, 0, sizeof s);
    s.s[2] = c->d;
    s.s[1] = c->cap * c->d;
    s.s[0] = c->H * c->cap * c->d;
    return s;
}

void castle__kv_cache_free(castle_kv_cache *c)
{
    if (!c)
        return;
    if (c->k)
        clReleaseMemObject(c->k);
    if (c->v)
        clReleaseMemObject(c->v);
    if (c->part)
        clReleaseMemObject(c->part);
    free(c);
}

void castle__kv_cache_reset(castle_kv_cache *c) { c->len = 0; }

castle_status castle__kv_cache_alloc(castle_context *ctx, const castle_problem *p, castle_kv_cache **out)
{
    castle_kv_cache *c = calloc(1, sizeof *c);
    if (!c)
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory creating a KV cache");
    c->ctx = ctx;
    c->B = p->B;
    c->H = p->H;
    c->d = p->d;
    c->cap = p->L;
    /* castle__check_desc bounded B H cap d (each tensor's extent fits in bytes), so these fit. */
    const size_t kv_bytes = p->B * p->H * p->L * p->d * sizeof(float);
    /* Partials per new row: a decode work-group's worth, or one per MIN_KEYS cached keys when split. */
    const size_t per_row = CASTLE_DECODE_GROUP > p->L / MIN_KEYS ? CASTLE_DECODE_GROUP : p->L / MIN_KEYS;
    c->part_floats = p->B * p->H * CASTLE_DECODE_ROWS * per_row * (p->d + 2);
    cl_int err = CL_SUCCESS;
    c->k = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, kv_bytes, NULL, &err);
    if (err == CL_SUCCESS)
        c->v = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, kv_bytes, NULL, &err);
    if (err == CL_SUCCESS)
        c->part = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, c->part_floats * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
        castle__kv_cache_free(c);
        return castle__fail((castle_status)err,
                            "clCreateBuffer failed allocating a KV cache of %zu tokens x %zu heads x %zu batch", p->L,
                            p->H, p->B);
    }
    c->bytes = 2 * kv_bytes + c->part_floats * sizeof(float);
    *out = c;
    return CASTLE_SUCCESS;
}

castle_status castle__causal_decode(castle_context *ctx, const char *fn, castle_kv_cache *c, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                    const cl_event *wait, cl_event *event)
{
    const size_t bh = p->B * p->H, n = p->L, keys = c->len + p->L;
    const size_t fit = c->part_floats / (bh * (p->d + 2)) / n; /* partials per new row the scratch holds */
    const size_t target = castle__device_fill_groups(&ctx->info);
    const size_t per_head = (target + bh - 1) / bh; /* work-groups per head to fill the device */
    const cl_int t0 = (cl_int)c->len, d = (cl_int)p->d, H = (cl_int)p->H;
    const cl_ulong4 cs = cache_strides(c);
    cl_kernel kapp, katt = NULL, kcomb = NULL;
    const char *att_name = "castle_causal_decode";
    castle_args a_app = {.n = 0}, a_att = {.n = 0}, a_comb = {.n = 0};
    size_t groups = p->N, partials = 1; /* attention work-groups along dim 0, partials per row */
    bool combine = false;               /* whether the partials are merged by castle_causal_combine */
    castle_status st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, "castle_causal_append", &kapp);
    if (st == CASTLE_SUCCESS && n <= CASTLE_DECODE_ROWS) {
        /* The decode kernel: CASTLE_CAUSAL_DECODE_PARTIALS per work-group (local_memory.h), one per
           work-item over >= MIN_KEYS keys once split, or one per work-group over >= 4 MIN_KEYS. */
        size_t wg = 0, per_group = 0;
        if (!(st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, "castle_causal_decode", &katt)) &&
            !(st = group_size(ctx, katt, &wg)) &&
            (per_group = CASTLE_CAUSAL_DECODE_PARTIALS(wg, ctx->tuning.decode)) <= fit) {
            size_t split = keys / (MIN_KEYS * (per_group > 1 ? per_group : 4));
            split = split < per_head ? split : per_head;
            split = split < fit / per_group ? split : fit / per_group;
            if (ctx->info.loop_limit) { /* partials enough that each one's keys fit (host/loops.c) */
                const size_t most =
                    castle__loops_max_units(CASTLE_LOOPS_CAUSAL_DECODE, p->d, 0, ctx->info.loop_limit) / n;
                const size_t parts = most ? (keys + most - 1) / most : keys;
                size_t need = (parts + per_group - 1) / per_group;
                need = need < fit / per_group ? need : fit / per_group;
                split = split > need ? split : need;
            }
            split = split > 0 ? split : 1;
            /* a partial's keys: a work-group's under mapping 2, a work-item's under 1 (cl/causal.cl) */
            const size_t per_part = (keys + split * per_group - 1) / (split * per_group);
            if ((st = castle__loop_check(ctx->info.loop_limit, fn, "castle_causal_decode",
                                         castle__loops(CASTLE_LOOPS_CAUSAL_DECODE, p->d, per_part * n, 0),
                                         "the cache's scratch splits its %zu keys %zu ways at most", keys, fit)))
                return st;
            groups = split;
            partials = split * per_group;
            combine = true; /* the decode kernel leaves partials, also when there is one */
            const cl_int nn = (cl_int)n, P = (cl_int)split;
            castle_args *a = &a_att;
            ARG(a, nn);
            ARG(a, t0);
            ARG(a, d);
            ARG(a, H);
            ARG(a, p->scale);
            arg_tensor(a, p, bufs, CASTLE_TENSOR_QC);
            ARG(a, c->k);
            ARG(a, c->v);
            ARG(a, cs);
            ARG(a, P);
            ARG(a, c->part);
        } else if (st == CASTLE_SUCCESS) {
            katt = NULL; /* the scratch is too small for this tuning: the block kernel below */
        }
    }
    if (st == CASTLE_SUCCESS && !katt) {
        /* The block kernel; one block of new rows splits its keys when the heads alone are few. */
        size_t split = 1;
        if (p->N == 1) {
            const size_t blk = ctx->tuning.block, key_blocks = (keys + blk - 1) / blk;
            split = per_head < key_blocks ? per_head : key_blocks;
            if (ctx->info.loop_limit) { /* work-groups enough that each one's key blocks fit (host/loops.c) */
                const size_t most = castle__loops_max_units(CASTLE_LOOPS_CAUSAL_FORWARD, p->d, 0, ctx->info.loop_limit);
                const size_t need = most ? (key_blocks + most - 1) / most : key_blocks;
                split = split > need ? split : need < key_blocks ? need : key_blocks;
            }
            split = split < fit ? split : fit > 0 ? fit : 1;
        }
        groups = p->N * split;
        partials = split;
        combine = split > 1; /* with one, the block kernel writes o and lse itself */
        att_name = "castle_causal_forward";
        a_att.n = 0;
        st = forward_args(ctx, fn, p, bufs, t0, c->k, c->v, cs, cs, (cl_int)split, split > 1 ? c->part : NULL, &katt,
                          &a_att);
    }
    if (st == CASTLE_SUCCESS && combine &&
        !(st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, "castle_causal_combine", &kcomb))) {
        const cl_int want_lse = bufs[CASTLE_TENSOR_LSE] != NULL, nn = (cl_int)n, P = (cl_int)partials;
        const cl_mem o = bufs[CASTLE_TENSOR_O], lse = want_lse ? bufs[CASTLE_TENSOR_LSE] : o;
        castle_args *a = &a_comb;
        ARG(a, nn);
        ARG(a, d);
        ARG(a, H);
        ARG(a, P);
        ARG(a, c->part);
        arg_tensor(a, p, bufs, CASTLE_TENSOR_O);
        ARG(a, lse);
        ARG(a, p->strides[CASTLE_TENSOR_LSE]);
        ARG(a, want_lse);
    }
    if (st == CASTLE_SUCCESS) {
        const cl_int nn = (cl_int)n;
        castle_args *a = &a_app;
        ARG(a, nn);
        ARG(a, t0);
        ARG(a, d);
        ARG(a, H);
        arg_tensor(a, p, bufs, CASTLE_TENSOR_KC);
        arg_tensor(a, p, bufs, CASTLE_TENSOR_VC);
        ARG(a, c->k);
        ARG(a, c->v);
        ARG(a, cs);
    }
    castle_chain ch;
    if (st || (st = castle__chain_init(&ch, queue, nwait, wait, event)))
        return st;
    /* Append (one group per block of new rows), attention, and the merge of the partials. */
    if (!(st = launch(&ch, ctx, kapp, "castle_causal_append", &a_app, p->N, bh, false)) &&
        !(st = launch(&ch, ctx, katt, att_name, &a_att, groups, bh, !kcomb)) && kcomb)
        st = launch(&ch, ctx, kcomb, "castle_causal_combine", &a_comb, p->N, bh, true);
    castle__chain_end(&ch);
    if (st == CASTLE_SUCCESS)
        c->len += p->L;
    return st;
}
