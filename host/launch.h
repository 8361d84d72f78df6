/* One launch helper for every schedule (host/schedule.c, host/cache.c, host/causal.c), after
 * CLBlast's RunKernel: kernel arguments are collected by value in a castle_args list and set, all
 * of them, together with the enqueue, under the context's lock (castle__launch), so concurrent calls
 * on one context never see each other's arguments; and a castle_chain orders the commands of one
 * call: the first waits for the caller's wait list, on an out-of-order queue each later one waits
 * for the one before, and the last hands its event to the caller. */
#ifndef CASTLE_HOST_LAUNCH_H
#define CASTLE_HOST_LAUNCH_H

#include "castle/castle.h"

#include <stdbool.h>
#include <stddef.h>

/* Kernel arguments by value (the largest the kernels take is a cl_ulong4). */
#define CASTLE_MAX_ARGS 48
#define CASTLE_MAX_ARG_BYTES 32
typedef struct castle_args {
    unsigned char value[CASTLE_MAX_ARGS][CASTLE_MAX_ARG_BYTES];
    size_t size[CASTLE_MAX_ARGS];
    cl_uint n;
    bool overflow; /* an argument did not fit: castle__launch reports it */
} castle_args;
/* Appends the value of v (an lvalue) as the next argument. */
#define CASTLE_ARG(list, v) castle__args_push((list), sizeof(v), &(v))
void castle__args_push(castle_args *list, size_t size, const void *value);
/* Replaces argument i (already pushed) by a value of the same size. */
void castle__args_set(castle_args *list, cl_uint i, size_t size, const void *value);

typedef struct castle_chain {
    cl_command_queue queue;
    bool in_order, started;
    cl_uint nwait;
    const cl_event *wait;
    cl_event prev;        /* the previous command's event (out-of-order queues) */
    cl_event *user_event; /* the caller's output event, or NULL */
} castle_chain;

/* Starts a chain on queue after the caller's wait list; event (may be NULL) receives the last
   command's event. */
castle_status castle__chain_init(castle_chain *ch, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                                 cl_event *event);
/* For a command that is not a kernel launch (a copy, a fill, another schedule): the wait list and
   event slot of the next command (`last`: the final one of the chain) ... */
void castle__chain_next(castle_chain *ch, bool last, cl_uint *n, const cl_event **list, cl_event **ev, cl_event *slot);
/* ... and its outcome (err from the enqueue that chain_next prepared; `what` names it). */
castle_status castle__chain_done(castle_chain *ch, bool last, cl_int err, cl_event ev, const char *what);
/* Releases what the chain still holds (call once, also after a failure). */
void castle__chain_end(castle_chain *ch);

typedef struct castle_context castle_context;
/* Sets every argument of args on kernel (named `name` in messages) and enqueues it over the 2-D
   range global / local, as the next command of ch (several where dimension 1 has more than the
   device's max_groups_y work-groups, each given its first as the kernel's last argument, bh0, after
   args; the last piece `last`), under ctx's lock. */
castle_status castle__launch(castle_chain *ch, bool last, castle_context *ctx, cl_kernel kernel, const char *name,
                             const castle_args *args, const size_t global[2], const size_t local[2]);

/* For a kernel whose work-items loop over a range of blocks given as its last two arguments before
   bh0, [from, upto) (cl/causal.cl's backward, cl/cache.cl's castle_cache_prefill_u): pushes the two
   (set per launch by castle__launch_ranges). */
void castle__args_range(castle_args *list);
/* castle__launch of such a kernel over `units` blocks in launches over ranges of `span` blocks (one
   launch when span >= units; host/loops.c, castle__loops_ranges), in order, each a launch of wg-wide
   work-groups by groups1: upto of them along dimension 0 (group g owns block g, which only the ranges
   up to it reach), or with tail units - from (group g owns block units - 1 - g). */
castle_status castle__launch_ranges(castle_chain *ch, bool last, castle_context *ctx, cl_kernel kernel,
                                    const char *name, castle_args *args, size_t units, size_t span, bool tail,
                                    size_t wg, size_t groups1);

#endif
