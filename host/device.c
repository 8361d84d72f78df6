/* Device facts the library reads once per context (castle__query_device).  The castle_context
 * itself and device selection are in lib/context.c. */
#include "device.h"
#include "error.h"
#include "loops.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The string `what` of dev into buf ("" where the query fails); returns the query's status. */
static cl_int get_str(cl_device_id dev, cl_device_info what, char *buf, size_t n)
{
    buf[0] = '\0';
    const cl_int err = clGetDeviceInfo(dev, what, n - 1, buf, NULL);
    if (err != CL_SUCCESS)
        buf[0] = '\0';
    buf[n - 1] = '\0';
    return err;
}

castle_status castle__query_device(cl_device_id device, castle_device_info *info)
{
    memset(info, 0, sizeof *info);
    cl_platform_id platform = NULL;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    if (err != CL_SUCCESS)
        return castle__fail((castle_status)err, "clGetDeviceInfo(CL_DEVICE_PLATFORM) failed: not a valid device");
    get_str(device, CL_DEVICE_NAME, info->name, sizeof info->name);
    get_str(device, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    get_str(device, CL_DRIVER_VERSION, info->driver_version, sizeof info->driver_version);
    if ((err = get_str(device, CL_DEVICE_VERSION, info->device_version, sizeof info->device_version)) != CL_SUCCESS)
        return castle__fail((castle_status)err, "clGetDeviceInfo(CL_DEVICE_VERSION) failed (OpenCL %d)", (int)err);
    if (clGetPlatformInfo(platform, CL_PLATFORM_VERSION, sizeof info->platform_version - 1,
                          info->platform_version, NULL) != CL_SUCCESS)
        info->platform_version[0] = '\0';
    if (clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof info->platform_name - 1, info->platform_name,
                          NULL) != CL_SUCCESS)
        info->platform_name[0] = '\0';
    /* the facts the library sizes its work by: a failed query is the query's error, not a device
       with 0 bytes of local memory */
#define QUERY(what, field)                                                                                 \
    if ((err = clGetDeviceInfo(device, what, sizeof info->field, &info->field, NULL)) != CL_SUCCESS)       \
        return castle__fail((castle_status)err, "clGetDeviceInfo(" #what ") failed (OpenCL %d)", (int)err);
    QUERY(CL_DEVICE_TYPE, type)
    QUERY(CL_DEVICE_MAX_COMPUTE_UNITS, compute_units)
    QUERY(CL_DEVICE_LOCAL_MEM_SIZE, local_mem_size)
    QUERY(CL_DEVICE_MAX_WORK_GROUP_SIZE, max_work_group_size)
    QUERY(CL_DEVICE_GLOBAL_MEM_SIZE, global_mem_size)
    QUERY(CL_DEVICE_MAX_MEM_ALLOC_SIZE, max_alloc_size)
#undef QUERY
    char ext[8192];
    get_str(device, CL_DEVICE_EXTENSIONS, ext, sizeof ext);
    info->fp16 = strstr(ext, "cl_khr_fp16") != NULL;
    info->fp64 = strstr(ext, "cl_khr_fp64") != NULL;
    info->nv_options = strstr(ext, "cl_nv_compiler_options") != NULL;
    /* "OpenCL <major>.<minor> <vendor-specific>" */
    if (sscanf(info->device_version, "OpenCL %d.%d", &info->cl_major, &info->cl_minor) != 2)
        info->cl_major = info->cl_minor = 0;
    castle_status st = castle__loop_limit(info, &info->loop_limit);
    if (st == CASTLE_SUCCESS)
        st = castle__env_whole("CASTLE_MAX_GROUPS_Y", "work-groups one launch puts on dimension 1, at least 1",
                               CASTLE_MAX_GROUPS_Y, &info->max_groups_y);
    if (st == CASTLE_SUCCESS && !info->max_groups_y)
        st = castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "CASTLE_MAX_GROUPS_Y=0: one launch needs at least 1 work-group");
    return st;
}

castle_status castle__env_whole(const char *name, const char *meaning, unsigned long dflt, unsigned long *out)
{
    const char *env = getenv(name);
    *out = dflt;
    if (!env || !*env)
        return CASTLE_SUCCESS;
    char *end;
    errno = 0;
    const unsigned long v = strtoul(env, &end, 10);
    if (*env < '0' || *env > '9' || errno || *end)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "%s='%s' is not a whole number (%s)", name, env, meaning);
    *out = v;
    return CASTLE_SUCCESS;
}

size_t castle__device_fill_groups(const castle_device_info *info)
{
    const size_t per_cu = (info->type & CL_DEVICE_TYPE_CPU) ? 4 : 16;
    return per_cu * (info->compute_units ? info->compute_units : 1);
}
