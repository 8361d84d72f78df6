/* The launch helper and command chains (see launch.h). */
#include "launch.h"
#include "context.h"
#include "error.h"

#include <stdio.h>
#include <string.h>

void castle__args_push(castle_args *list, size_t size, const void *value)
{
    if (list->n >= CASTLE_MAX_ARGS || size > CASTLE_MAX_ARG_BYTES) {
        list->overflow = true;
        return;
    }
    memcpy(list->value[list->n], value, size);
    list->size[list->n++] = size;
}

void castle__args_set(castle_args *list, cl_uint i, size_t size, const void *value)
{
    if (i >= list->n || size != list->size[i]) {
        list->overflow = true;
        return;
    }
    memcpy(list->value[i], value, size);
}

castle_status castle__chain_init(castle_chain *ch, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                                 cl_event *event)
{
    memset(ch, 0, sizeof *ch);
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (err != CL_SUCCESS)
        return castle__cl_fail(err, "clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)");
    ch->queue = queue;
    ch->in_order = !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
    ch->nwait = nwait;
    ch->wait = nwait ? wait : NULL;
    ch->user_event = event;
    return CASTLE_SUCCESS;
}

void castle__chain_next(castle_chain *ch, bool last, cl_uint *n, const cl_event **list, cl_event **ev, cl_event *slot)
{
    *slot = NULL;
    if (!ch->started) {
        *n = ch->nwait;
        *list = ch->wait;
    } else {
        *n = ch->prev ? 1 : 0;
        *list = ch->prev ? &ch->prev : NULL;
    }
    *ev = ((last && ch->user_event) || !ch->in_order) ? slot : NULL;
}

castle_status castle__chain_done(castle_chain *ch, bool last, cl_int err, cl_event ev, const char *what)
{
    if (ch->prev)
        clReleaseEvent(ch->prev);
    ch->prev = NULL;
    ch->started = true;
    if (err != CL_SUCCESS) {
        if (ev)
            clReleaseEvent(ev);
        return castle__cl_fail(err, what);
    }
    if (last && ch->user_event)
        *ch->user_event = ev;
    else
        ch->prev = ev;
    return CASTLE_SUCCESS;
}

void castle__chain_end(castle_chain *ch)
{
    if (ch->prev)
        clReleaseEvent(ch->prev);
    ch->prev = NULL;
}

/* One enqueue of kernel over global / local, its work-groups of dimension 1 from bh0 on (the
   kernels' last argument: cl/common.cl, BH_INDEX). */
static castle_status launch_one(castle_chain *ch, bool last, castle_context *ctx, cl_kernel kernel, const char *name,
                                const castle_args *args, const size_t global[2], cl_int bh0, const size_t local[2])
{
    cl_uint n;
    const cl_event *list;
    cl_event *evp, ev, own = NULL; /* own: an event made for the observer alone */
    castle__chain_next(ch, last, &n, &list, &evp, &ev);
    castle__ctx_lock(ctx);
    castle_launch_observer observer;
    void *user;
    unsigned long gen;
    castle__observer_take(ctx, &observer, &user, &gen);
    cl_int err = CL_SUCCESS;
    cl_uint i = 0;
    while (i <= args->n && (err = i < args->n ? clSetKernelArg(kernel, i, args->size[i], args->value[i])
                                              : clSetKernelArg(kernel, i, sizeof bh0, &bh0)) == CL_SUCCESS)
        ++i;
    if (err == CL_SUCCESS)
        err = clEnqueueNDRangeKernel(ch->queue, kernel, 2, NULL, global, local, n, list, evp || !observer ? evp : &own);
    castle__ctx_unlock(ctx);
    const cl_event seen = evp ? ev : own; /* this launch's event, where one was made */
    if (err == CL_SUCCESS && observer && seen)
        castle__observer_call(ctx, observer, user, name, seen,
                              local ? (global[0] / local[0]) * (global[1] / local[1]) : 0,
                              local ? local[0] * local[1] : 0);
    if (observer)
        castle__observer_done(ctx, gen);
    if (own)
        clReleaseEvent(own);
    char what[160];
    if (i <= args->n)
        snprintf(what, sizeof what, "clSetKernelArg(%s, argument %u%s)", name, (unsigned)i,
                 i == args->n ? ", the first batch entry x head" : "");
    else
        snprintf(what, sizeof what, "clEnqueueNDRangeKernel(%s)", name);
    return castle__chain_done(ch, last, err, ev, what);
}

void castle__args_range(castle_args *list)
{
    const cl_int from = 0, upto = 0;
    CASTLE_ARG(list, from);
    CASTLE_ARG(list, upto);
}

castle_status castle__launch_ranges(castle_chain *ch, bool last, castle_context *ctx, cl_kernel kernel,
                                    const char *name, castle_args *args, size_t units, size_t span, bool tail,
                                    size_t wg, size_t groups1)
{
    castle_status st = CASTLE_SUCCESS;
    span = span ? span : units; /* castle__loops_ranges gives none of 0 */
    for (size_t from = 0; from < units && st == CASTLE_SUCCESS; from += span) {
        const size_t upto = units - from > span ? from + span : units;
        const cl_int f = (cl_int)from, u = (cl_int)upto;
        castle__args_set(args, args->n - 2, sizeof f, &f);
        castle__args_set(args, args->n - 1, sizeof u, &u);
        const size_t global[2] = {(tail ? units - from : upto) * wg, groups1}, local[2] = {wg, 1};
        st = castle__launch(ch, last && upto == units, ctx, kernel, name, args, global, local);
    }
    return st;
}

castle_status castle__launch(castle_chain *ch, bool last, castle_context *ctx, cl_kernel kernel, const char *name,
                             const castle_args *args, const size_t global[2], const size_t local[2])
{
    if (args->overflow)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "%s: more than %d kernel arguments or one over %d bytes",
                            name, CASTLE_MAX_ARGS, CASTLE_MAX_ARG_BYTES);
    /* dimension 1 in pieces of at most max_groups_y work-groups (host/device.h), each told its first
       (local size 1 there: one work-group per batch entry x head) */
    const size_t most = (size_t)ctx->info.max_groups_y;
    castle_status st = CASTLE_SUCCESS;
    for (size_t base = 0; st == CASTLE_SUCCESS;) {
        const size_t part = global[1] - base < most ? global[1] - base : most;
        const bool end = base + part >= global[1];
        const size_t g[2] = {global[0], part};
        st = launch_one(ch, last && end, ctx, kernel, name, args, g, (cl_int)base, local);
        if (end)
            break;
        base += part;
    }
    return st;
}
