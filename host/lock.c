/* The context lock: a recursive POSIX mutex (Linux, macOS, the BSDs, MinGW's winpthreads). */
#define _POSIX_C_SOURCE 200809L /* PTHREAD_MUTEX_RECURSIVE under -std=c11 */
#include "context.h"
#include "error.h"

castle_status castle__ctx_lock_init(castle_context *ctx)
{
    pthread_mutexattr_t attr;
    if (pthread_mutexattr_init(&attr) != 0)
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "pthread_mutexattr_init failed");
    int rc = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    if (rc == 0)
        rc = pthread_mutex_init(&ctx->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    if (rc == 0 && (rc = pthread_cond_init(&ctx->observer_idle, NULL)) != 0)
        pthread_mutex_destroy(&ctx->lock);
    return rc == 0 ? CASTLE_SUCCESS
                   : castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "cannot create the context's mutex (error %d)", rc);
}

void castle__ctx_lock_destroy(castle_context *ctx)
{
    pthread_cond_destroy(&ctx->observer_idle);
    pthread_mutex_destroy(&ctx->lock);
}

/* A recursive mutex's lock and unlock fail only on misuse (unlock by a non-owner), which the
   library's own lock/unlock pairing rules out. */
void castle__ctx_lock(castle_context *ctx) { pthread_mutex_lock(&ctx->lock); }
void castle__ctx_unlock(castle_context *ctx) { pthread_mutex_unlock(&ctx->lock); }

/* The contexts whose observers this thread is calling, innermost first: an observer of one context
   may launch on another, whose observer is then called inside it. */
typedef struct observing_frame {
    const castle_context *ctx;
    const struct observing_frame *outer;
} observing_frame;
static _Thread_local const observing_frame *observing;

static bool is_observing(const castle_context *ctx)
{
    for (const observing_frame *f = observing; f; f = f->outer)
        if (f->ctx == ctx)
            return true;
    return false;
}

void castle__observer_take(castle_context *ctx, castle_launch_observer *fn, void **user, unsigned long *gen)
{
    *fn = ctx->observer;
    *user = ctx->observer_user;
    *gen = ctx->observer_gen;
    if (*fn)
        ++ctx->observer_busy[*gen & 1];
}

void castle__observer_done(castle_context *ctx, unsigned long gen)
{
    castle__ctx_lock(ctx);
    if (--ctx->observer_busy[gen & 1] == 0)
        pthread_cond_broadcast(&ctx->observer_idle);
    castle__ctx_unlock(ctx);
}

/* Waits on the condition with the lock held once (no caller holds it around this call: an observer
   may not call into the library with ctx, and this is refused from one, however many observers of
   other contexts were called inside it: the wait would count the thread's own call).  A setter waits only for
   calls of the generation it ends: later launches count in the other parity, so none can keep it
   waiting; setters go one at a time, so no two wait on one parity. */
castle_status castle__observer_set(castle_context *ctx, castle_launch_observer fn, void *user)
{
    if (is_observing(ctx))
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT,
                            "castle_context_set_launch_observer: called from within an observer of the context");
    castle__ctx_lock(ctx);
    while (ctx->observer_setting)
        pthread_cond_wait(&ctx->observer_idle, &ctx->lock);
    ctx->observer_setting = true;
    ctx->observer = fn;
    ctx->observer_user = fn ? user : NULL;
    const unsigned long ended = ctx->observer_gen++;
    while (ctx->observer_busy[ended & 1] > 0)
        pthread_cond_wait(&ctx->observer_idle, &ctx->lock);
    ctx->observer_setting = false;
    pthread_cond_broadcast(&ctx->observer_idle);
    castle__ctx_unlock(ctx);
    return CASTLE_SUCCESS;
}

void castle__observer_call(castle_context *ctx, castle_launch_observer fn, void *user, const char *name,
                           cl_event ev, size_t groups, size_t group_size)
{
    const observing_frame frame = {ctx, observing};
    observing = &frame;
    fn(user, name, ev, groups, group_size);
    observing = frame.outer;
}
