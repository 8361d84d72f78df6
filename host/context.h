/* The library context: device, tuning, programs and kernels (lib/context.c, host/device.c,
 * host/program.c), and its lock (host/lock.c). */
#ifndef CASTLE_HOST_CONTEXT_H
#define CASTLE_HOST_CONTEXT_H

#include "device.h"
#include "program.h"

#include <pthread.h>

#define CASTLE_WS_SEEN 16
struct castle_context {
    cl_context cl_ctx;
    cl_device_id device;
    cl_command_queue own_queue; /* castle_context_create_default only */
    castle_device_info info;
    castle_tuning tuning;
    const char *tuning_name;
    /* Everything below is shared by concurrent calls on the context: read or written only while
       holding `lock`. */
    pthread_mutex_t lock; /* recursive: a holder may call castle__get_kernel, which locks too */
    castle_program_slot programs[CASTLE_MAX_PROGRAMS];
    int num_programs;
    castle_kernel_slot kernels[CASTLE_MAX_KERNELS];
    int num_kernels;
    struct castle_log *logs; /* build logs, newest first; kept until destroy (see castle_build_log) */
    castle_launch_observer observer; /* castle_context_set_launch_observer, or NULL */
    void *observer_user;
    /* Calls of the observer in progress, by the parity of the generation they began in (one
       generation per castle_context_set_launch_observer), so that setting an observer returns only
       once the previous one is called no more (host/lock.c); observer_idle is signalled as a count
       reaches 0 or a setter finishes, observer_setting keeps setters one at a time. */
    unsigned long observer_gen;
    size_t observer_busy[2];
    bool observer_setting;
    pthread_cond_t observer_idle;
    /* The workspaces of the context's last CASTLE_WS_SEEN forwards (a ring) and the tunings they ran
       under: castle_backward refuses one a forward wrote under another tuning (lib/castle.c).  The
       handles are compared, never used. */
    struct {
        cl_mem ws;
        castle_tuning tuning;
    } ws_seen[CASTLE_WS_SEEN];
    unsigned ws_seen_next;
};

/* One compiler log.  Logs are never freed before the context, so the pointer castle_build_log
   returns stays valid while other threads build. */
typedef struct castle_log {
    struct castle_log *older;
    char text[];
} castle_log;

/* The context's lock (a recursive mutex) serialises the program and kernel caches, the build log
   and every clSetKernelArg ... clEnqueueNDRangeKernel sequence on the context's cl_kernels, so that
   calls on one context from several threads never share kernel arguments.  Hold it only around
   host-side work (never across a wait for the device). */
castle_status castle__ctx_lock_init(castle_context *ctx);
void castle__ctx_lock_destroy(castle_context *ctx);
void castle__ctx_lock(castle_context *ctx);
void castle__ctx_unlock(castle_context *ctx);
/* The launch observer.  castle__observer_take, under the lock, copies the observer and its user data
   (fn NULL: none) and counts a call of it in progress, which castle__observer_done (not under the
   lock) ends; gen pairs the two.  castle__observer_set swaps it and waits until no call of the
   previous one is in progress (CASTLE_ERR_INVALID_ARGUMENT from within an observer of ctx, which
   would wait for itself). */
void castle__observer_take(castle_context *ctx, castle_launch_observer *fn, void **user, unsigned long *gen);
void castle__observer_done(castle_context *ctx, unsigned long gen);
castle_status castle__observer_set(castle_context *ctx, castle_launch_observer fn, void *user);
/* fn(user, ...) as an observer of ctx (the thread marked as within it for castle__observer_set). */
void castle__observer_call(castle_context *ctx, castle_launch_observer fn, void *user, const char *name,
                           cl_event ev, size_t groups, size_t group_size);

#endif
