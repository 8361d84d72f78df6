/* Device facts the library reads once per context (host/device.c). */
#ifndef CASTLE_HOST_DEVICE_H
#define CASTLE_HOST_DEVICE_H

#include "castle/castle.h"

#include <stdbool.h>

typedef struct castle_device_info {
    char name[256];
    char vendor[256];
    char driver_version[256];
    char device_version[256];
    char platform_version[256];
    char platform_name[256];
    cl_device_type type;
    cl_uint compute_units;
    cl_ulong local_mem_size;
    size_t max_work_group_size;
    cl_ulong global_mem_size;
    cl_ulong max_alloc_size;
    bool fp16, fp64;
    bool nv_options; /* cl_nv_compiler_options: -cl-nv-maxrregcount (the tuning's regs, fregs) */
    int cl_major, cl_minor;
    unsigned long loop_limit; /* loop iterations a work-item may run in all, 0: no limit (host/loops.c) */
} castle_device_info;
castle_status castle__query_device(cl_device_id device, castle_device_info *info);

/* Work-groups to launch so that a split-K kernel (the decode kernels) fills the device: four per
   compute unit on a CPU, which runs one work-group per core at a time, and sixteen on other devices,
   which keep many resident per compute unit to hide memory latency (an NVIDIA H200 decoded B=2 H=16
   t=32768 in 0.83 ms with sixteen against 1.26 ms with four). */
size_t castle__device_fill_groups(const castle_device_info *info);

#endif
