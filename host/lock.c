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
    return rc == 0 ? CASTLE_SUCCESS
                   : castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "cannot create the context's mutex (error %d)", rc);
}

void castle__ctx_lock_destroy(castle_context *ctx) { pthread_mutex_destroy(&ctx->lock); }

/* A recursive mutex's lock and unlock fail only on misuse (unlock by a non-owner), which the
   library's own lock/unlock pairing rules out. */
void castle__ctx_lock(castle_context *ctx) { pthread_mutex_lock(&ctx->lock); }
void castle__ctx_unlock(castle_context *ctx) { pthread_mutex_unlock(&ctx->lock); }
