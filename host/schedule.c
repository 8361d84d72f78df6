/* The anti-diagonal wavefront (docs/algorithm.md section 3): launch k = 0 computes the diagonal blocks, launch
 * k = 1 .. N-1 the k-th off-diagonal; within a launch the work-groups cover the columns j (dim 0)
 * and the batch entries x heads (dim 1).  Launches are ordered by the queue when it is in-order,
 * by events between them otherwise.  The backward runs the same wavefront in reverse.  Short
 * sequences with many batch entries x heads fold the wavefront into one launch (castle_tuning.fold):
 * each work-group then walks its own batch entry and head's block pairs in the same order. */
#include "schedule.h"
#include "context.h"
#include "error.h"
#include "launch.h"

#include <stdbool.h>

/* The arguments shared by the forward and backward kernels: k (arg 0, set per launch), L, d, H, W,
   scale, then buffer + strides for each tensor in `tensors`, then the workspace and the offsets of
   the workspace regions in `regions` (CASTLE_WS_T's with its slot size: castle__ws_t). */
static void common_args(castle_args *a, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                        const castle_tensor *tensors, int ntensors, cl_mem ws, const castle_ws_region *regions,
                        int nregions)
{
    const cl_int k = 0, L = (cl_int)p->L, d = (cl_int)p->d, H = (cl_int)p->H, W = (cl_int)p->W;
    const cl_float sc = p->scale;
    CASTLE_ARG(a, k);
    CASTLE_ARG(a, L);
    CASTLE_ARG(a, d);
    CASTLE_ARG(a, H);
    CASTLE_ARG(a, W);
    CASTLE_ARG(a, sc);
    for (int i = 0; i < ntensors; ++i) {
        CASTLE_ARG(a, bufs[tensors[i]]);
        CASTLE_ARG(a, p->strides[tensors[i]]);
    }
    CASTLE_ARG(a, ws);
    for (int i = 0; i < nregions; ++i) {
        const cl_ulong off = p->ws_off[regions[i]];
        if (regions[i] == CASTLE_WS_T) {
            const cl_ulong2 t = castle__ws_t(p); /* the block-transposed copies: offset and slot size */
            CASTLE_ARG(a, t);
        } else {
            CASTLE_ARG(a, off);
        }
    }
}

/* Whether the whole wavefront runs as one launch (see castle_tuning.fold); never where a work-item's
   loops are limited (host/loops.c): a folded work-group loops over all N (N + 1) / 2 block pairs (on
   llvmpipe the backward's at d = 256, N = 8 came out wrong). */
static bool fold(const castle_context *ctx, const castle_problem *p)
{
    return p->N <= ctx->tuning.fold && p->B * p->H >= 2 * (size_t)ctx->info.compute_units && !ctx->info.loop_limit;
}

/* The n inputs whose block-transposed copies a pass writes (cl/common.cl, castle_transpose_blocks):
   slots q0 .. q0 + n - 1 of the workspace region CASTLE_WS_T, in the order of cl/common.cl's
   CASTLE_T_*.  The backward reads slots 0-3 as the forward left them. */
typedef struct transposes {
    cl_int q0;
    int n;
    castle_tensor in[CASTLE_WS_T_INPUTS];
} transposes;
static const transposes forward_transposes = {
    0, 4, {CASTLE_TENSOR_QU, CASTLE_TENSOR_KU, CASTLE_TENSOR_QC, CASTLE_TENSOR_KC}};
static const transposes backward_transposes = {
    CASTLE_WS_T_FORWARD, 3, {CASTLE_TENSOR_VU, CASTLE_TENSOR_VC, CASTLE_TENSOR_DO}};
_Static_assert(CASTLE_WS_T_FORWARD == 4 && CASTLE_WS_T_SLOTS == CASTLE_WS_T_FORWARD + 3,
               "the forward fills four slots, the backward three");

/* Enqueues, on one chain, the launch of castle_transpose_blocks (in every program; this family's is
   used) that writes the copies tr, then the wavefront of kernel: folded, one launch of one
   work-group per batch entry and head; else N launches, launch n covering the N - k columns of
   iteration k = first_k + n * step (arg 0), those of k > 0 by kernel_k (name_k) where it is not NULL. */
static castle_status run(castle_context *ctx, castle_family family, cl_kernel kernel, const char *name,
                         cl_kernel kernel_k, const char *name_k, castle_args *args, const castle_problem *p,
                         const cl_mem bufs[CASTLE_TENSOR_COUNT], const transposes *tr, cl_mem ws, bool folded,
                         int first_k, int step, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                         cl_event *event)
{
    static const char tname[] = "castle_transpose_blocks";
    const size_t threads = castle__family_tuning(family, &ctx->tuning).threads, local[2] = {threads, 1};
    cl_kernel tk;
    castle_status st = castle__get_kernel(ctx, family, p->d, tname, &tk);
    if (st != CASTLE_SUCCESS)
        return st;
    castle_args targs = {.n = 0};
    const cl_int L = (cl_int)p->L, d = (cl_int)p->d, H = (cl_int)p->H;
    const cl_ulong2 ws_t = castle__ws_t(p);
    CASTLE_ARG(&targs, L);
    CASTLE_ARG(&targs, d);
    CASTLE_ARG(&targs, H);
    CASTLE_ARG(&targs, tr->q0);
    for (int q = 0; q < CASTLE_WS_T_INPUTS; ++q) { /* arguments beyond n: never read (the grid covers n) */
        const castle_tensor t = tr->in[q < tr->n ? q : tr->n - 1];
        CASTLE_ARG(&targs, bufs[t]);
        CASTLE_ARG(&targs, p->strides[t]);
    }
    CASTLE_ARG(&targs, ws);
    CASTLE_ARG(&targs, ws_t);

    castle_chain ch;
    if ((st = castle__chain_init(&ch, queue, nwait, wait, event)) != CASTLE_SUCCESS)
        return st;
    const size_t tglobal[2] = {threads * p->N * (size_t)tr->n, p->B * p->H};
    st = castle__launch(&ch, false, ctx, tk, tname, &targs, tglobal, local);
    const int N = folded ? 1 : (int)p->N;
    for (int n = 0; n < N && st == CASTLE_SUCCESS; ++n) {
        const cl_int k = folded ? 0 : first_k + n * step;
        castle__args_set(args, 0, sizeof k, &k);
        const size_t global[2] = {threads * (folded ? 1 : (size_t)(N - k)), p->B * p->H};
        const bool off = !folded && k > 0 && kernel_k;
        st = castle__launch(&ch, n == N - 1, ctx, off ? kernel_k : kernel, off ? name_k : name, args, global, local);
    }
    castle__chain_end(&ch);
    return st;
}

castle_status castle__schedule_forward(castle_context *ctx, const castle_problem *p,
                                       const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                       cl_uint nwait, const cl_event *wait, cl_event *event)
{
    static const castle_tensor tensors[] = {CASTLE_TENSOR_QU, CASTLE_TENSOR_KU, CASTLE_TENSOR_VU, CASTLE_TENSOR_QC,
                                            CASTLE_TENSOR_KC, CASTLE_TENSOR_VC, CASTLE_TENSOR_O,  CASTLE_TENSOR_LSE};
    static const castle_ws_region regions[] = {CASTLE_WS_D_LO, CASTLE_WS_X, CASTLE_WS_ML, CASTLE_WS_T};
    const bool folded = fold(ctx, p);
    const char *name = folded ? "castle_forward_fold" : "castle_forward_block";
    cl_kernel kernel;
    castle_status st = castle__get_kernel(ctx, CASTLE_FAMILY_FORWARD, p->d, name, &kernel);
    if (st != CASTLE_SUCCESS)
        return st;
    castle_args args = {.n = 0};
    common_args(&args, p, bufs, tensors, 8, ws, regions, 4);
    return run(ctx, CASTLE_FAMILY_FORWARD, kernel, name, NULL, NULL, &args, p, bufs, &forward_transposes, ws, folded, 0,
               1, queue, nwait, wait, event);
}

castle_status castle__schedule_backward(castle_context *ctx, const castle_problem *p,
                                        const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                        cl_uint nwait, const cl_event *wait, cl_event *event)
{
    static const castle_tensor tensors[] = {
        CASTLE_TENSOR_QU, CASTLE_TENSOR_KU,  CASTLE_TENSOR_VU,  CASTLE_TENSOR_QC,  CASTLE_TENSOR_KC,
        CASTLE_TENSOR_VC, CASTLE_TENSOR_O,   CASTLE_TENSOR_LSE, CASTLE_TENSOR_DO,  CASTLE_TENSOR_DQU,
        CASTLE_TENSOR_DKU, CASTLE_TENSOR_DVU, CASTLE_TENSOR_DQC, CASTLE_TENSOR_DKC, CASTLE_TENSOR_DVC};
    static const castle_ws_region regions[] = {CASTLE_WS_D_LO,  CASTLE_WS_W_HI, CASTLE_WS_W_LO, CASTLE_WS_DD,
                                               CASTLE_WS_DELTA, CASTLE_WS_X,    CASTLE_WS_T,    CASTLE_WS_DY};
    /* per diagonal: castle_backward_off for k > 0 (the pairs off the diagonal, with fewer registers),
       castle_backward_block for k = 0, and for every k where the program has no castle_backward_off
       (cl/backward.cl) */
    static const char oname[] = "castle_backward_off";
    const bool folded = fold(ctx, p);
    const char *name = folded ? "castle_backward_fold" : "castle_backward_block";
    cl_kernel kernel, okernel = NULL;
    castle_status st = castle__get_kernel(ctx, CASTLE_FAMILY_BACKWARD, p->d, name, &kernel);
    if (st == CASTLE_SUCCESS && !folded)
        st = castle__find_kernel(ctx, CASTLE_FAMILY_BACKWARD, p->d, oname, &okernel);
    if (st != CASTLE_SUCCESS)
        return st;
    castle_args args = {.n = 0};
    common_args(&args, p, bufs, tensors, 15, ws, regions, 8);
    return run(ctx, CASTLE_FAMILY_BACKWARD, kernel, name, okernel, oname, &args, p, bufs, &backward_transposes, ws,
               folded, (int)p->N - 1, -1, queue, nwait, wait, event);
}
