/* A deterministic device-allocation failure, for tests (LD_PRELOAD this module).
 *
 * Why it exists: castle-run names the device buffer and the size it could not allocate, but no real
 * device can be made to refuse an allocation cheaply (the library's own workspace check refuses an
 * oversize problem before anything is allocated).  Preloaded, this module stands in for
 * clCreateBuffer: a request of at least CASTLE_TEST_FAIL_BUFFER_BYTES bytes fails with
 * CL_MEM_OBJECT_ALLOCATION_FAILURE, as a driver out of memory would; every other request (and every
 * request when the variable is unset or not a whole number) goes to the real clCreateBuffer, found
 * with dlsym(RTLD_NEXT).  Used by test_cli. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <CL/cl.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>

typedef cl_mem(CL_API_CALL *create_buffer_fn)(cl_context, cl_mem_flags, size_t, void *, cl_int *);

/* The threshold in bytes, or 0 (never fail) when the variable is unset, empty or malformed. */
static unsigned long long threshold(void)
{
    const char *s = getenv("CASTLE_TEST_FAIL_BUFFER_BYTES");
    if (!s || *s < '0' || *s > '9')
        return 0;
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    return errno || *end ? 0 : v;
}

CL_API_ENTRY cl_mem CL_API_CALL clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                                               cl_int *errcode_ret)
{
    const unsigned long long limit = threshold();
    if (limit && size >= limit) {
        if (errcode_ret)
            *errcode_ret = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return NULL;
    }
    create_buffer_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "clCreateBuffer"); /* the POSIX way to turn a void * into a function */
    if (!real) {
        if (errcode_ret)
            *errcode_ret = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    return real(context, flags, size, host_ptr, errcode_ret);
}
