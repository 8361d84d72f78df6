/* The forward and backward wavefront schedules (host/schedule.c, docs/algorithm.md sections 3 and 4). */
#ifndef CASTLE_HOST_SCHEDULE_H
#define CASTLE_HOST_SCHEDULE_H

#include "validate.h"

/* bufs is indexed by castle_tensor. */
castle_status castle__schedule_forward(castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                       cl_mem ws, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                                       cl_event *event);
castle_status castle__schedule_backward(castle_context *ctx, const castle_problem *p,
                                        const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                        cl_uint nwait, const cl_event *wait, cl_event *event);

#endif
