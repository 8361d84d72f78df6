/* A deterministic device-allocation failure, for tests (LD_PRELOAD this module).
 *
 * Why it exists: castle-run names the device buffer and the size it could not allocate, but no real
 * device can be made to refuse an allocation cheaply (the library's own workspace check refuses an
 * oversize problem before anything is allocated).  Preloaded, this module stands in for
 * clCreateBuffer: a request of at least CASTLE_TEST_FAIL_BUFFER_BYTES bytes fails with
 * CL_MEM_OBJECT_ALLOCATION_FAILURE, as a driver out of memory would; every other request (and every
 * request when the variable is unset or not a whole number) goes to the real clCreateBuffer, found
 * with dlsym(RTLD_NEXT).  Likewise CASTLE_TEST_FAIL_LISTING=platforms (or devices) makes the call of
 * clGetPlatformIDs (clGetDeviceIDs) that lists the objects, the one given an array, fail with
 * CL_OUT_OF_HOST_MEMORY, while the count query before it succeeds, and =local_mem makes
 * clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE) fail so.  Used by test_cli. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <CL/cl.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

/* True when CASTLE_TEST_FAIL_LISTING names `what`. */
static int fail_listing(const char *what)
{
    const char *s = getenv("CASTLE_TEST_FAIL_LISTING");
    return s && !strcmp(s, what);
}

typedef cl_int(CL_API_CALL *get_platforms_fn)(cl_uint, cl_platform_id *, cl_uint *);
typedef cl_int(CL_API_CALL *get_devices_fn)(cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *);

CL_API_ENTRY cl_int CL_API_CALL clGetPlatformIDs(cl_uint num_entries, cl_platform_id *platforms, cl_uint *num_platforms)
{
    if (platforms && fail_listing("platforms"))
        return CL_OUT_OF_HOST_MEMORY;
    get_platforms_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "clGetPlatformIDs");
    return real ? real(num_entries, platforms, num_platforms) : CL_OUT_OF_HOST_MEMORY;
}

CL_API_ENTRY cl_int CL_API_CALL clGetDeviceIDs(cl_platform_id platform, cl_device_type type, cl_uint num_entries,
                                               cl_device_id *devices, cl_uint *num_devices)
{
    if (devices && fail_listing("devices"))
        return CL_OUT_OF_HOST_MEMORY;
    get_devices_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "clGetDeviceIDs");
    return real ? real(platform, type, num_entries, devices, num_devices) : CL_OUT_OF_HOST_MEMORY;
}

typedef cl_int(CL_API_CALL *get_device_info_fn)(cl_device_id, cl_device_info, size_t, void *, size_t *);

CL_API_ENTRY cl_int CL_API_CALL clGetDeviceInfo(cl_device_id device, cl_device_info param, size_t size, void *value,
                                                size_t *size_ret)
{
    if (param == CL_DEVICE_LOCAL_MEM_SIZE && fail_listing("local_mem"))
        return CL_OUT_OF_HOST_MEMORY;
    get_device_info_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "clGetDeviceInfo");
    return real ? real(device, param, size, value, size_ret) : CL_OUT_OF_HOST_MEMORY;
}
