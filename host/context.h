/* The library context: device, tuning, programs and kernels (host/device.c, host/program.c). */
#ifndef CASTLE_HOST_CONTEXT_H
#define CASTLE_HOST_CONTEXT_H

#include "device.h"
#include "program.h"

struct castle_context {
    cl_context cl_ctx;
    cl_device_id device;
    cl_command_queue own_queue; /* castle_context_create_default only */
    castle_device_info info;
    castle_tuning tuning;
    const char *tuning_name;
    castle_program_slot programs[CASTLE_MAX_PROGRAMS];
    int num_programs;
    castle_kernel_slot kernels[CASTLE_MAX_KERNELS];
    int num_kernels;
    char *build_log;
};

#endif
