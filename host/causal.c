/* Standard causal attention, the baseline (cl/causal.cl): launches of the forward and backward
 * passes, and the KV cache with its prefill and decode.
 *
 * forward   one launch: work-group (query block, batch x head); where the device limits a work-item's
 *           loops (host/loops.c), work-groups (query block x key range, batch x head) and a second
 *           launch, castle_causal_combine, that merges their partials.
 * backward  two launches, no atomics: dK, dV per key block, then dQ per query block; where loops are
 *           limited, each in several launches over ranges of its loop, adding to the sums.
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

#include <stdint.h>
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

/* The outputs O and lse (lse: O's buffer, unused, when the call wants none) and whether lse is wanted:
   the last arguments of castle_causal_forward but two and of castle_causal_combine. */
static void arg_outputs(castle_args *a, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT])
{
    const cl_int want_lse = bufs[CASTLE_TENSOR_LSE] != NULL;
    const cl_mem lse = want_lse ? bufs[CASTLE_TENSOR_LSE] : bufs[CASTLE_TENSOR_O];
    arg_tensor(a, p, bufs, CASTLE_TENSOR_O);
    ARG(a, lse);
    ARG(a, p->strides[CASTLE_TENSOR_LSE]);
    ARG(a, want_lse);
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
    const cl_mem part_arg = part ? part : bufs[CASTLE_TENSOR_O]; /* unused when nsplit = 1 */
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
    arg_outputs(a, p, bufs);
    ARG(a, nsplit);
    ARG(a, part_arg);
    return CASTLE_SUCCESS;
}

/* castle_causal_combine over rows 0..n-1, merging P partials per row from part into o and lse. */
static void combine_args(castle_args *a, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_int n,
                         cl_int P, cl_mem part)
{
    const cl_int d = (cl_int)p->d, H = (cl_int)p->H;
    ARG(a, n);
    ARG(a, d);
    ARG(a, H);
    ARG(a, P);
    ARG(a, part);
    arg_outputs(a, p, bufs);
}

/* The key splits of castle_causal_forward over p's rows at positions t0..: *split (the caller's
   choice, at most key_blocks) raised where the device limits a work-item's loops until each split's
   key blocks fit (host/loops.c), and where their partials go: scratch when it holds them
   (scratch_floats), else a new buffer *tmp for the caller to release once the launches are enqueued. */
static castle_status forward_split(castle_context *ctx, const char *fn, const castle_problem *p, size_t t0,
                                   size_t *split, cl_mem scratch, size_t scratch_floats, cl_mem *part, cl_mem *tmp)
{
    const size_t blk = ctx->tuning.block, key_blocks = (t0 + p->L + blk - 1) / blk;
    const size_t span = castle__loops_span(CASTLE_LOOPS_CAUSAL_FORWARD, p->d, key_blocks, ctx->info.loop_limit);
    const size_t need = span ? (key_blocks + span - 1) / span : 1; /* none fits: forward_args refuses */
    *split = *split > need ? *split : need;
    *part = *tmp = NULL;
    if (*split == 1)
        return CASTLE_SUCCESS;
    /* castle__check_desc bounded B H L d (a tensor's bytes fit a size_t); the split multiplies it */
    const size_t row_floats = p->B * p->H * p->L * (p->d + 2);
    if (*split > SIZE_MAX / sizeof(float) / row_floats)
        return castle__fail(CASTLE_ERR_SIZE_OVERFLOW,
                            "%s: the partials of %zu key ranges do not fit a size_t (this device limits a work-item's "
                            "loops, and the keys are split to fit)",
                            fn, *split);
    const size_t floats = row_floats * *split;
    if (floats <= scratch_floats) {
        *part = scratch;
        return CASTLE_SUCCESS;
    }
    cl_int err = CL_SUCCESS;
    *tmp = clCreateBuffer(ctx->cl_ctx, CL_MEM_READ_WRITE, floats * sizeof(float), NULL, &err);
    if (err != CL_SUCCESS) {
        *tmp = NULL;
        return castle__fail((castle_status)err,
                            "%s: clCreateBuffer failed for the partials of %zu key ranges (%zu bytes): this device "
                            "limits a work-item's loops, and the keys are split to fit",
                            fn, *split, floats * sizeof(float));
    }
    *part = *tmp;
    return CASTLE_SUCCESS;
}

/* ---- forward and backward ----------------------------------------------------------------------- */

castle_status castle__causal_forward(castle_context *ctx, const castle_problem *p,
                                     const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                     const cl_event *wait, cl_event *event)
{
    /* One work-group per query block, unless the device limits loops: then split key ranges, merged
       by castle_causal_combine */
    cl_kernel kernel, kcomb = NULL;
    castle_args a = {.n = 0}, ac = {.n = 0};
    size_t split = 1;
    cl_mem part, tmp;
    castle_status st = forward_split(ctx, "castle_causal_forward", p, 0, &split, NULL, 0, &part, &tmp);
    if (st == CASTLE_SUCCESS)
        st = forward_args(ctx, "castle_causal_forward", p, bufs, 0, bufs[CASTLE_TENSOR_KC], bufs[CASTLE_TENSOR_VC],
                          p->strides[CASTLE_TENSOR_KC], p->strides[CASTLE_TENSOR_VC], (cl_int)split, part, &kernel, &a);
    if (st == CASTLE_SUCCESS && split > 1 &&
        !(st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, "castle_causal_combine", &kcomb)))
        combine_args(&ac, p, bufs, (cl_int)p->L, (cl_int)split, part);
    castle_chain ch;
    if (st == CASTLE_SUCCESS && !(st = castle__chain_init(&ch, queue, nwait, wait, event))) {
        st = launch(&ch, ctx, kernel, "castle_causal_forward", &a, p->N * split, p->B * p->H, !kcomb);
        if (st == CASTLE_SUCCESS && kcomb)
            st = launch(&ch, ctx, kcomb, "castle_causal_combine", &ac, p->N, p->B * p->H, true);
        castle__chain_end(&ch);
    }
    if (tmp) /* kept by OpenCL until the launches that use it end */
        clReleaseMemObject(tmp);
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
    size_t span[2]; /* blocks of its loop per launch: all N, unless the device limits loops (host/loops.c) */
    size_t wg[2];   /* the work-group sizes they were compiled for */
    castle_status st = CASTLE_SUCCESS;
    for (int i = 0; i < 2 && st == CASTLE_SUCCESS; ++i) {
        if ((st = castle__loops_ranges(loops[i], p->d, p->N, ctx->info.loop_limit, ctx->tuning.block,
                                       "castle_causal_backward", names[i], &span[i])) ||
            (st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, names[i], &kernels[i])) ||
            (st = group_size(ctx, kernels[i], &wg[i])))
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
        castle__args_range(a);
    }
    castle_chain ch;
    if (st || (st = castle__chain_init(&ch, queue, nwait, wait, event)))
        return st;
    /* Each side in launches over ranges of its loop's blocks: the key side's work-group g owns key
       block g, the query side's query block N - 1 - g (its tail). */
    for (int i = 0; i < 2 && st == CASTLE_SUCCESS; ++i)
        st = castle__launch_ranges(&ch, i == 1, ctx, kernels[i], names[i], &args[i], p->N, span[i], i == 1, wg[i],
                                   p->B * p->H);
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
    cl_mem part = c->part, tmp = NULL;  /* where the partials go: the scratch, or a temporary (forward_split) */
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
        /* The block kernel; one block of new rows splits its keys when the heads alone are few (as
           far as the scratch holds), and any number where the device limits loops (forward_split). */
        size_t split = 1;
        if (p->N == 1) {
            const size_t blk = ctx->tuning.block, key_blocks = (keys + blk - 1) / blk;
            split = per_head < key_blocks ? per_head : key_blocks;
            split = split < fit ? split : fit > 0 ? fit : 1;
        }
        st = forward_split(ctx, fn, p, (size_t)t0, &split, c->part, c->part_floats, &part, &tmp);
        groups = p->N * split;
        partials = split;
        combine = split > 1; /* with one, the block kernel writes o and lse itself */
        att_name = "castle_causal_forward";
        a_att.n = 0;
        if (st == CASTLE_SUCCESS)
            st = forward_args(ctx, fn, p, bufs, t0, c->k, c->v, cs, cs, (cl_int)split, part, &katt, &a_att);
    }
    if (st == CASTLE_SUCCESS && combine &&
        !(st = castle__get_kernel(ctx, CASTLE_FAMILY_CAUSAL, p->d, "castle_causal_combine", &kcomb)))
        combine_args(&a_comb, p, bufs, (cl_int)n, (cl_int)partials, part);
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
    if (st == CASTLE_SUCCESS && !(st = castle__chain_init(&ch, queue, nwait, wait, event))) {
        /* Append (one group per block of new rows), attention, and the merge of the partials. */
        if (!(st = launch(&ch, ctx, kapp, "castle_causal_append", &a_app, p->N, bh, false)) &&
            !(st = launch(&ch, ctx, katt, att_name, &a_att, groups, bh, !kcomb)) && kcomb)
            st = launch(&ch, ctx, kcomb, "castle_causal_combine", &a_comb, p->N, bh, true);
        castle__chain_end(&ch);
        if (st == CASTLE_SUCCESS)
            c->len += p->L;
    }
    if (tmp) /* kept by OpenCL until the launches that use it end */
        clReleaseMemObject(tmp);
    return st;
}
