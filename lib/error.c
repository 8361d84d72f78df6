/* Status names and the per-thread message of the last failure. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

castle_status castle__fail(castle_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(last_error, sizeof last_error, "%s: ", castle_status_string(status));
    if (n < 0 || (size_t)n >= sizeof last_error)
        n = 0;
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

void castle__clear_error(void) { last_error[0] = '\0'; }

castle_status castle__cl_fail(cl_int err, const char *what)
{
    return castle__fail((castle_status)err, "OpenCL call %s failed", what);
}

const char *castle_last_error(void) { return last_error; }

const char *castle_status_string(castle_status status)
{
    switch ((int)status) {
#define NAME(x) \
    case x: \
        return #x;
        NAME(CASTLE_SUCCESS)
        NAME(CASTLE_ERR_NULL_CONTEXT)
        NAME(CASTLE_ERR_NULL_POINTER)
        NAME(CASTLE_ERR_NULL_BUFFER)
        NAME(CASTLE_ERR_NULL_QUEUE)
        NAME(CASTLE_ERR_DESC_VERSION)
        NAME(CASTLE_ERR_ZERO_SIZE)
        NAME(CASTLE_ERR_SIZE_OVERFLOW)
        NAME(CASTLE_ERR_HEAD_DIM)
        NAME(CASTLE_ERR_NEGATIVE_WINDOW)
        NAME(CASTLE_ERR_BAD_SCALE)
        NAME(CASTLE_ERR_BAD_STRIDE)
        NAME(CASTLE_ERR_BUFFER_TOO_SMALL)
        NAME(CASTLE_ERR_WORKSPACE_TOO_SMALL)
        NAME(CASTLE_ERR_WAIT_LIST)
        NAME(CASTLE_ERR_QUEUE_MISMATCH)
        NAME(CASTLE_ERR_BUILD_FAILED)
        NAME(CASTLE_ERR_NO_DEVICE)
        NAME(CASTLE_ERR_BAD_DEVICE_SPEC)
        NAME(CASTLE_ERR_DEVICE_UNSUPPORTED)
        NAME(CASTLE_ERR_OUT_OF_HOST_MEMORY)
        NAME(CASTLE_ERR_BAD_TUNING)
        NAME(CASTLE_ERR_INVALID_ARGUMENT)
        NAME(CASTLE_ERR_CACHE_FULL)
        NAME(CASTLE_ERR_SHAPE_MISMATCH)
        NAME(CASTLE_ERR_CACHE_NOT_EMPTY)
        NAME(CASTLE_ERR_WORKSPACE_TOO_LARGE)
        /* OpenCL 1.2 codes */
        NAME(CL_DEVICE_NOT_FOUND)
        NAME(CL_DEVICE_NOT_AVAILABLE)
        NAME(CL_COMPILER_NOT_AVAILABLE)
        NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        NAME(CL_OUT_OF_RESOURCES)
        NAME(CL_OUT_OF_HOST_MEMORY)
        NAME(CL_PROFILING_INFO_NOT_AVAILABLE)
        NAME(CL_MEM_COPY_OVERLAP)
        NAME(CL_IMAGE_FORMAT_MISMATCH)
        NAME(CL_IMAGE_FORMAT_NOT_SUPPORTED)
        NAME(CL_BUILD_PROGRAM_FAILURE)
        NAME(CL_MAP_FAILURE)
        NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        NAME(CL_COMPILE_PROGRAM_FAILURE)
        NAME(CL_LINKER_NOT_AVAILABLE)
        NAME(CL_LINK_PROGRAM_FAILURE)
        NAME(CL_DEVICE_PARTITION_FAILED)
        NAME(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
        NAME(CL_INVALID_VALUE)
        NAME(CL_INVALID_DEVICE_TYPE)
        NAME(CL_INVALID_PLATFORM)
        NAME(CL_INVALID_DEVICE)
        NAME(CL_INVALID_CONTEXT)
        NAME(CL_INVALID_QUEUE_PROPERTIES)
        NAME(CL_INVALID_COMMAND_QUEUE)
        NAME(CL_INVALID_HOST_PTR)
        NAME(CL_INVALID_MEM_OBJECT)
        NAME(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
        NAME(CL_INVALID_IMAGE_SIZE)
        NAME(CL_INVALID_SAMPLER)
        NAME(CL_INVALID_BINARY)
        NAME(CL_INVALID_BUILD_OPTIONS)
        NAME(CL_INVALID_PROGRAM)
        NAME(CL_INVALID_PROGRAM_EXECUTABLE)
        NAME(CL_INVALID_KERNEL_NAME)
        NAME(CL_INVALID_KERNEL_DEFINITION)
        NAME(CL_INVALID_KERNEL)
        NAME(CL_INVALID_ARG_INDEX)
        NAME(CL_INVALID_ARG_VALUE)
        NAME(CL_INVALID_ARG_SIZE)
        NAME(CL_INVALID_KERNEL_ARGS)
        NAME(CL_INVALID_WORK_DIMENSION)
        NAME(CL_INVALID_WORK_GROUP_SIZE)
        NAME(CL_INVALID_WORK_ITEM_SIZE)
        NAME(CL_INVALID_GLOBAL_OFFSET)
        NAME(CL_INVALID_EVENT_WAIT_LIST)
        NAME(CL_INVALID_EVENT)
        NAME(CL_INVALID_OPERATION)
        NAME(CL_INVALID_GL_OBJECT)
        NAME(CL_INVALID_BUFFER_SIZE)
        NAME(CL_INVALID_MIP_LEVEL)
        NAME(CL_INVALID_GLOBAL_WORK_SIZE)
        NAME(CL_INVALID_PROPERTY)
        NAME(CL_INVALID_IMAGE_DESCRIPTOR)
        NAME(CL_INVALID_COMPILER_OPTIONS)
        NAME(CL_INVALID_LINKER_OPTIONS)
        NAME(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef NAME
    default:
        return status < 0 && status > -1000 ? "CL_UNKNOWN_ERROR" : "CASTLE_UNKNOWN_STATUS";
    }
}
