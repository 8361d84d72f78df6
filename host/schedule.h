/* The forward and backward wavefront schedules (host/schedule.c, docs/algorithm.md sections 3 and 4). */
#ifndef CASTLE_HOST_SCHEDULE_H
#define CASTLE_HOST_SCHEDULE_H

#include "validate.h"

/* The workspace region CASTLE_WS_T as its kernels take it (cl/common.cl, tcopy): its offset and the
   floats of each of its slots, B H Lpad d (a product castle__check_desc_for checked), in floats. */
static inline cl_ulong2 castle__ws_t(const castle_problem *p)
{
    cl_ulong2 t;
    t.s[0] = p->ws_off[CASTLE_WS_T];
    t.s[1] = p->B * p->H * p->Lpad * p->d;
    return t;
}

/* bufs is indexed by castle_tensor. */
castle_status castle__schedule_forward(castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                       cl_mem ws, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                                       cl_event *event);
castle_status castle__schedule_backward(castle_context *ctx, const castle_problem *p,
                                        const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                        cl_uint nwait, const cl_event *wait, cl_event *event);

#endif
