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
    unsigned long loop_limit;   /* loop iterations a work-item may run in all, 0: no limit (host/loops.c) */
    unsigned long max_groups_y; /* work-groups one launch puts on dimension 1 (host/launch.c) */
} castle_device_info;
/* The facts above; loop_limit from CASTLE_LOOP_LIMIT when set, max_groups_y from CASTLE_MAX_GROUPS_Y
   (default CASTLE_MAX_GROUPS_Y): a malformed value is CASTLE_ERR_INVALID_ARGUMENT. */
castle_status castle__query_device(cl_device_id device, castle_device_info *info);

/* Batch entries x heads go on dimension 1 of every launch, and a CUDA grid, on which NVIDIA's OpenCL
   launches, holds at most 65535 blocks in y: more go out in several launches (host/launch.c). */
#define CASTLE_MAX_GROUPS_Y 65535u

/* The whole number in environment variable name (meaning: what it counts, for the message), or dflt
   when it is unset or empty; CASTLE_ERR_INVALID_ARGUMENT naming it when it is anything else. */
castle_status castle__env_whole(const char *name, const char *meaning, unsigned long dflt, unsigned long *out);

/* Work-groups to launch so that a split-K kernel (the decode kernels) fills the device: four per
   compute unit on a CPU, which runs one work-group per core at a time, and sixteen on other devices,
   which keep many resident per compute unit to hide memory latency (an NVIDIA H200 decoded B=2 H=16
   t=32768 in 0.83 ms with sixteen against 1.26 ms with four). */
size_t castle__device_fill_groups(const castle_device_info *info);

#endif
