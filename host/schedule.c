/* The anti-diagonal wavefront (docs/algorithm.md section 3): launch k = 0 computes the diagonal blocks, launch
 * k = 1 .. N-1 the k-th off-diagonal; within a launch the work-groups cover the columns j (dim 0)
 * and the batch entries x heads (dim 1).  Launches are ordered by the queue when it is in-order,
 * by events between them otherwise.  The backward runs the same wavefront in reverse.  Short
 * sequences with many batch entries x heads fold the wavefront into one launch (castle_tuning.fold):
 * each work-group then walks its own batch entry and head's block pairs in the same order. */
#include "schedule.h"
#include "context.h"
#include "error.h"

#include <stdbool.h>

static castle_status queue_in_order(cl_command_queue queue, bool *in_order)
{
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (err != CL_SUCCESS)
        return castle__cl_fail(err, "clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
    *in_order = !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
    return CASTLE_SUCCESS;
}

/* Enqueues `launches` ND-ranges of kernel: launch n covers `groups(n)` work-groups in dim 0, set
 * through arg 0 = n's iteration index.  Chains the launches, honours the caller's wait list,
 * returns the last launch's event in *event. */
static castle_status run_wavefront(cl_kernel kernel, const castle_problem *p, unsigned threads, int first_k, int step,
                                   cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event)
{
    bool in_order = true;
    castle_status st = queue_in_order(queue, &in_order);
    if (st != CASTLE_SUCCESS)
        return st;
    const int N = (int)p->N;
    cl_event prev = NULL;
    for (int n = 0; n < N; ++n) {
        const cl_int k = first_k + n * step;
        cl_int err = clSetKernelArg(kernel, 0, sizeof k, &k);
        if (err != CL_SUCCESS) {
            if (prev)
                clReleaseEvent(prev);
            return castle__cl_fail(err, "clSetKernelArg(k)");
        }
        const size_t local[2] = {threads, 1};
        const size_t global[2] = {(size_t)threads * (size_t)(N - k), p->B * p->H};
        const bool last = n == N - 1;
        const cl_uint nw = n == 0 ? nwait : (prev ? 1 : 0);
        const cl_event *wl = n == 0 ? (nwait ? wait : NULL) : (prev ? &prev : NULL);
        cl_event ev = NULL;
        const bool want_event = (last && event) || !in_order;
        err = clEnqueueNDRangeKernel(queue, kernel, 2, NULL, global, local, nw, wl, want_event ? &ev : NULL);
        if (prev)
            clReleaseEvent(prev);
        prev = NULL;
        if (err != CL_SUCCESS) {
            if (ev)
                clReleaseEvent(ev);
            return castle__cl_fail(err, "clEnqueueNDRangeKernel");
        }
        if (last && event)
            *event = ev;
        else
            prev = ev;
    }
    if (prev)
        clReleaseEvent(prev);
    return CASTLE_SUCCESS;
}

/* Sets the arguments shared by the forward and backward kernels: k (set per launch), L, d, H, W,
   scale, then buffer + strides for each tensor in `tensors`, then the workspace. */
static castle_status set_common_args(cl_kernel kernel, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                     const castle_tensor *tensors, int ntensors, cl_mem ws, cl_uint *next)
{
    const cl_int L = (cl_int)p->L, d = (cl_int)p->d, H = (cl_int)p->H, W = (cl_int)p->W;
    const cl_float sc = p->scale;
    cl_uint a = 1;
    cl_int err = CL_SUCCESS;
#define ARG(v) err |= clSetKernelArg(kernel, a++, sizeof(v), &(v))
    ARG(L);
    ARG(d);
    ARG(H);
    ARG(W);
    ARG(sc);
    for (int i = 0; i < ntensors; ++i) {
        ARG(bufs[tensors[i]]);
        ARG(p->strides[tensors[i]]);
    }
    ARG(ws);
#undef ARG
    *next = a;
    return err == CL_SUCCESS ? CASTLE_SUCCESS
                             : castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "clSetKernelArg failed (OpenCL %d)", (int)err);
}

/* Sets the workspace region offsets regions[0..n) as ulong arguments from *next on. */
static castle_status set_region_args(cl_kernel kernel, const castle_problem *p, const castle_ws_region *regions, int n,
                                     cl_uint next)
{
    for (int i = 0; i < n; ++i) {
        const cl_ulong off = p->ws_off[regions[i]];
        cl_int err = clSetKernelArg(kernel, next + (cl_uint)i, sizeof off, &off);
        if (err != CL_SUCCESS)
            return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "clSetKernelArg failed (OpenCL %d)", (int)err);
    }
    return CASTLE_SUCCESS;
}

/* Whether the whole wavefront runs as one launch (see castle_tuning.fold). */
static bool fold(const castle_context *ctx, const castle_problem *p)
{
    return p->N <= ctx->tuning.fold && p->B * p->H >= 2 * (size_t)ctx->info.compute_units;
}

/* One launch of a *_fold kernel: one work-group per batch entry and head. */
static castle_status run_folded(cl_kernel kernel, const castle_problem *p, unsigned threads, cl_command_queue queue,
                                cl_uint nwait, const cl_event *wait, cl_event *event)
{
    const cl_int unused = 0;
    cl_int err = clSetKernelArg(kernel, 0, sizeof unused, &unused);
    const size_t local[2] = {threads, 1}, global[2] = {threads, p->B * p->H};
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(queue, kernel, 2, NULL, global, local, nwait, nwait ? wait : NULL, event);
    return err == CL_SUCCESS ? CASTLE_SUCCESS : castle__cl_fail(err, "clEnqueueNDRangeKernel");
}

castle_status castle__schedule_forward(castle_context *ctx, const castle_problem *p,
                                       const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                       cl_uint nwait, const cl_event *wait, cl_event *event)
{
    static const castle_tensor tensors[] = {CASTLE_TENSOR_QU, CASTLE_TENSOR_KU, CASTLE_TENSOR_VU, CASTLE_TENSOR_QC,
                                            CASTLE_TENSOR_KC, CASTLE_TENSOR_VC, CASTLE_TENSOR_O,  CASTLE_TENSOR_LSE};
    static const castle_ws_region regions[] = {CASTLE_WS_D_LO, CASTLE_WS_X, CASTLE_WS_ML};
    cl_kernel kernel;
    cl_uint next;
    castle_status st;
    const bool folded = fold(ctx, p);
    if ((st = castle__get_kernel(ctx, CASTLE_FAMILY_FORWARD, folded ? "castle_forward_fold" : "castle_forward_block",
                                 &kernel)) ||
        (st = set_common_args(kernel, p, bufs, tensors, 8, ws, &next)) ||
        (st = set_region_args(kernel, p, regions, 3, next)))
        return st;
    if (folded)
        return run_folded(kernel, p, ctx->tuning.threads, queue, nwait, wait, event);
    return run_wavefront(kernel, p, ctx->tuning.threads, 0, 1, queue, nwait, wait, event);
}

castle_status castle__schedule_backward(castle_context *ctx, const castle_problem *p,
                                        const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                        cl_uint nwait, const cl_event *wait, cl_event *event)
{
    static const castle_tensor tensors[] = {
        CASTLE_TENSOR_QU, CASTLE_TENSOR_KU,  CASTLE_TENSOR_VU,  CASTLE_TENSOR_QC,  CASTLE_TENSOR_KC,
        CASTLE_TENSOR_VC, CASTLE_TENSOR_O,   CASTLE_TENSOR_LSE, CASTLE_TENSOR_DO,  CASTLE_TENSOR_DQU,
        CASTLE_TENSOR_DKU, CASTLE_TENSOR_DVU, CASTLE_TENSOR_DQC, CASTLE_TENSOR_DKC, CASTLE_TENSOR_DVC};
    static const castle_ws_region regions[] = {CASTLE_WS_D_LO, CASTLE_WS_W_HI, CASTLE_WS_W_LO, CASTLE_WS_DD,
                                               CASTLE_WS_X};
    cl_kernel kernel;
    cl_uint next;
    castle_status st;
    const bool folded = fold(ctx, p);
    if ((st = castle__get_kernel(ctx, CASTLE_FAMILY_BACKWARD,
                                 folded ? "castle_backward_fold" : "castle_backward_block", &kernel)) ||
        (st = set_common_args(kernel, p, bufs, tensors, 15, ws, &next)) ||
        (st = set_region_args(kernel, p, regions, 5, next)))
        return st;
    if (folded)
        return run_folded(kernel, p, ctx->tuning.threads, queue, nwait, wait, event);
    return run_wavefront(kernel, p, ctx->tuning.threads, (int)p->N - 1, -1, queue, nwait, wait, event);
}
