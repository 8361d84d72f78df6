/* The library context: device, tuning, programs and kernels (lib/context.c, host/device.c,
 * host/program.c), and its lock (host/lock.c). */
#ifndef CASTLE_HOST_CONTEXT_H
#define CASTLE_HOST_CONTEXT_H

#include "device.h"
#include "program.h"

#include <pthread.h>

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

#endif
