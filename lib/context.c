/* The castle_context: creation on the caller's OpenCL objects or on a device chosen by a device
 * string, destruction, accessors, and the tuning in force (the public functions of section "Context"
 * and "Tuning" of castle/castle.h).  Device facts come from host/device.c, the tuning table and file
 * from host/tuning.c, the programs the context caches from host/program.c. */
#include "context.h"
#include "error.h"
#include "tuning.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

castle_status castle_context_create(cl_context cl_ctx, cl_device_id device, castle_context **out)
{
    castle__clear_error();
    if (!out)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_context_create: out is NULL");
    *out = NULL;
    if (!cl_ctx)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_context_create: cl_context is NULL");
    if (!device)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_context_create: device is NULL");
    cl_uint ndev = 0;
    cl_device_id devs[64];
    cl_int qerr = clGetContextInfo(cl_ctx, CL_CONTEXT_NUM_DEVICES, sizeof ndev, &ndev, NULL);
    if (qerr != CL_SUCCESS)
        return castle__fail((castle_status)qerr, "castle_context_create: cl_context is not valid");
    bool member = ndev > 64; /* cannot list them all: let OpenCL catch a mismatch later */
    if (!member && (qerr = clGetContextInfo(cl_ctx, CL_CONTEXT_DEVICES, ndev * sizeof devs[0], devs, NULL)) != CL_SUCCESS)
        return castle__fail((castle_status)qerr, "castle_context_create: clGetContextInfo(CL_CONTEXT_DEVICES) failed "
                                                 "(OpenCL %d)", (int)qerr);
    for (cl_uint i = 0; i < ndev && !member; ++i)
        member = devs[i] == device;
    if (!member)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "castle_context_create: the device is not in the cl_context");
    castle_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "castle_context_create: out of host memory");
    castle_status st = castle__query_device(device, &ctx->info);
    if (st != CASTLE_SUCCESS) {
        free(ctx);
        return st;
    }
    if (ctx->info.cl_major < 1 || (ctx->info.cl_major == 1 && ctx->info.cl_minor < 2)) {
        st = castle__fail(CASTLE_ERR_DEVICE_UNSUPPORTED, "device '%s' reports '%s'; OpenCL 1.2 or later is needed",
                          ctx->info.name, ctx->info.device_version);
        free(ctx);
        return st;
    }
    st = castle__tuning_select(&ctx->info, &ctx->tuning, &ctx->tuning_name);
    if (st != CASTLE_SUCCESS) {
        free(ctx);
        return st;
    }
    st = castle__ctx_lock_init(ctx);
    if (st != CASTLE_SUCCESS) {
        free(ctx);
        return st;
    }
    cl_int err = clRetainContext(cl_ctx);
    if (err != CL_SUCCESS) {
        castle__ctx_lock_destroy(ctx);
        free(ctx);
        return castle__cl_fail(err, "clRetainContext");
    }
    clRetainDevice(device);
    ctx->cl_ctx = cl_ctx;
    ctx->device = device;
    *out = ctx;
    return CASTLE_SUCCESS;
}

/* A decimal number of digits only at s (no blank, no sign: strtol would take " +0"), into *v;
   *end: the first character after it. */
static bool parse_index(const char *s, long *v, char **end)
{
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    *v = strtol(s, end, 10);
    return !errno;
}

/* Parses "P:D" or "N".  Returns false when malformed. */
static bool parse_spec(const char *spec, long *p, long *d, bool *flat)
{
    char *end;
    long a;
    if (!parse_index(spec, &a, &end))
        return false;
    if (*end == '\0') {
        *flat = true;
        *p = a;
        *d = -1;
        return true;
    }
    if (*end != ':')
        return false;
    long b;
    if (!parse_index(end + 1, &b, &end) || *end != '\0')
        return false;
    *flat = false;
    *p = a;
    *d = b;
    return true;
}

castle_status castle_parse_device_spec(const char *spec, long *platform, long *device)
{
    castle__clear_error();
    if (!spec || !platform || !device)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_parse_device_spec: a NULL argument");
    long p, d;
    bool flat;
    if (!parse_spec(spec, &p, &d, &flat))
        return castle__fail(CASTLE_ERR_BAD_DEVICE_SPEC,
                            "device '%s' is malformed: expected 'P:D' (platform:device) or 'N'", spec);
    *platform = flat ? -1 : p;
    *device = flat ? p : d;
    return CASTLE_SUCCESS;
}

castle_status castle_context_create_default(const char *device_spec, castle_context **out)
{
    castle__clear_error();
    if (!out)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_context_create_default: out is NULL");
    *out = NULL;
    const char *spec = device_spec;
    const char *source = "argument";
    if (!spec || !*spec) {
        spec = getenv("CASTLE_DEVICE");
        source = "CASTLE_DEVICE";
    }
    if (!spec || !*spec) {
        spec = "0:0";
        source = "default";
    }
    long pi, di;
    bool flat;
    if (!parse_spec(spec, &pi, &di, &flat))
        return castle__fail(CASTLE_ERR_BAD_DEVICE_SPEC,
                            "device '%s' (%s) is malformed: expected 'P:D' (platform:device) or 'N'", spec, source);

    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err != CL_SUCCESS || np == 0)
        return castle__fail(CASTLE_ERR_NO_DEVICE, "no OpenCL platform found (clGetPlatformIDs: %d); is an ICD installed?",
                            (int)err);
    cl_platform_id plats[64];
    if (np > 64)
        np = 64;
    cl_uint listed = 0; /* the count may change between the two calls: use what the second one lists */
    if ((err = clGetPlatformIDs(np, plats, &listed)) != CL_SUCCESS)
        return castle__cl_fail(err, "clGetPlatformIDs");
    np = listed < np ? listed : np;
    cl_device_id device = NULL;
    long flat_index = 0;
    for (cl_uint p = 0; p < np && !device; ++p) {
        if (!flat && (long)p != pi)
            continue;
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0)
            continue;
        cl_device_id devs[64];
        if (nd > 64)
            nd = 64;
        cl_uint got = 0;
        if ((err = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, &got)) != CL_SUCCESS)
            return castle__cl_fail(err, "clGetDeviceIDs");
        nd = got < nd ? got : nd;
        for (cl_uint d = 0; d < nd; ++d, ++flat_index)
            if ((flat && flat_index == pi) || (!flat && (long)d == di)) {
                device = devs[d];
                break;
            }
    }
    if (!device)
        return castle__fail(CASTLE_ERR_NO_DEVICE, "no OpenCL device '%s' (%s); run castle-info to list devices", spec,
                            source);

    cl_context cl_ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (!cl_ctx)
        return castle__cl_fail(err, "clCreateContext");
    cl_command_queue q = clCreateCommandQueue(cl_ctx, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!q) {
        clReleaseContext(cl_ctx);
        return castle__cl_fail(err, "clCreateCommandQueue");
    }
    castle_status st = castle_context_create(cl_ctx, device, out);
    clReleaseContext(cl_ctx); /* the castle_context holds its own reference */
    if (st != CASTLE_SUCCESS) {
        clReleaseCommandQueue(q);
        return st;
    }
    (*out)->own_queue = q;
    return CASTLE_SUCCESS;
}

void castle_context_destroy(castle_context *ctx)
{
    if (!ctx)
        return;
    for (int i = 0; i < ctx->num_kernels; ++i)
        clReleaseKernel(ctx->kernels[i].kernel);
    for (int i = 0; i < ctx->num_programs; ++i)
        clReleaseProgram(ctx->programs[i].program);
    if (ctx->own_queue)
        clReleaseCommandQueue(ctx->own_queue);
    clReleaseDevice(ctx->device);
    clReleaseContext(ctx->cl_ctx);
    for (castle_log *l = ctx->logs, *next; l; l = next) {
        next = l->older;
        free(l);
    }
    castle__ctx_lock_destroy(ctx);
    free(ctx);
}

cl_command_queue castle_context_queue(const castle_context *ctx) { return ctx ? ctx->own_queue : NULL; }
cl_device_id castle_context_device(const castle_context *ctx) { return ctx ? ctx->device : NULL; }
cl_context castle_context_cl_context(const castle_context *ctx) { return ctx ? ctx->cl_ctx : NULL; }
const char *castle_build_log(const castle_context *ctx)
{
    if (!ctx)
        return "";
    castle_context *c = (castle_context *)ctx; /* the lock is the one mutable part of a const context */
    castle__ctx_lock(c);
    const char *log = c->logs ? c->logs->text : "";
    castle__ctx_unlock(c);
    return log;
}

castle_status castle_context_set_launch_observer(castle_context *ctx, castle_launch_observer fn, void *user)
{
    castle__clear_error();
    if (!ctx)
        return castle__fail(CASTLE_ERR_NULL_CONTEXT, "castle_context_set_launch_observer: context is NULL");
    return castle__observer_set(ctx, fn, user);
}

castle_status castle_context_get_tuning(const castle_context *ctx, castle_tuning *out)
{
    castle__clear_error();
    if (!ctx)
        return castle__fail(CASTLE_ERR_NULL_CONTEXT, "castle_context_get_tuning: context is NULL");
    if (!out)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_context_get_tuning: out is NULL");
    castle_context *c = (castle_context *)ctx;
    castle__ctx_lock(c);
    *out = c->tuning;
    castle__ctx_unlock(c);
    return CASTLE_SUCCESS;
}

const char *castle_context_tuning_name(const castle_context *ctx) { return ctx ? ctx->tuning_name : ""; }

unsigned long castle_context_loop_limit(const castle_context *ctx) { return ctx ? ctx->info.loop_limit : 0; }

castle_status castle_context_set_tuning(castle_context *ctx, const castle_tuning *tuning)
{
    castle__clear_error();
    if (!ctx)
        return castle__fail(CASTLE_ERR_NULL_CONTEXT, "castle_context_set_tuning: context is NULL");
    if (!tuning)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_context_set_tuning: tuning is NULL");
    if (tuning->struct_size != sizeof(castle_tuning))
        return castle__fail(CASTLE_ERR_DESC_VERSION,
                            "castle_context_set_tuning: struct_size %zu is not sizeof(castle_tuning) = %zu",
                            tuning->struct_size, sizeof(castle_tuning));
    castle_tuning t;
    castle__tuning_normalize(&t, tuning);
    castle__tuning_resolve(&t, &ctx->info);
    castle_status st = castle__tuning_check(&t, &ctx->info);
    if (st != CASTLE_SUCCESS)
        return st;
    castle__ctx_lock(ctx);
    castle__tuning_normalize(&ctx->tuning, &t);
    ctx->tuning_name = "api";
    castle__ctx_unlock(ctx);
    return CASTLE_SUCCESS;
}

castle_status castle_tuning_string(const castle_tuning *t, char *buf, size_t size)
{
    castle__clear_error();
    if (!t || !buf)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_tuning_string: tuning or buf is NULL");
    if (!size) /* castle.h: too small, as any size short of the string */
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "castle_tuning_string: 0 bytes are too few");
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < castle__tuning_nparams; ++i) {
        const castle_tuning_param *p = &castle__tuning_params[i];
        const int w = snprintf(buf + used, size - used, "%s%s=%u", i ? "," : "", p->name, castle__tuning_get(t, p));
        if (w < 0 || (size_t)w >= size - used)
            return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "castle_tuning_string: %zu bytes are too few", size);
        used += (size_t)w;
    }
    return CASTLE_SUCCESS;
}

castle_status castle_tuning_table_entry(size_t index, const char **name, castle_tuning *out, size_t *count)
{
    castle__clear_error();
    const size_t n = castle__tuning_table_size();
    if (count)
        *count = n;
    if (index >= n)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "castle_tuning_table_entry: index %zu, but the table has %zu entries",
                            index, n);
    castle_tuning t;
    const char *nm = castle__tuning_table_entry(index, &t);
    if (name)
        *name = nm;
    if (out)
        *out = t;
    return CASTLE_SUCCESS;
}

castle_status castle_tuning_file(char *path, size_t size)
{
    castle__clear_error();
    if (!path || !size)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_tuning_file: path is NULL or size is 0");
    if (!castle__tuning_file_path(path, size))
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT,
                            "no tuning file path: set CASTLE_TUNING_FILE, XDG_CONFIG_HOME or HOME (or the path is "
                            "longer than %zu bytes)",
                            size);
    return CASTLE_SUCCESS;
}
